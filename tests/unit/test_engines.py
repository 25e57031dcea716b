"""The generation engines: vLLM refused with a clear message where it cannot run, the transformers engine by
default, and GRPO's rollouts taken from TRL's vLLM engine with guided replay on them (a scripted engine; the
real one runs in tests/gpu/test_vllm.py on a CUDA machine with vLLM)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from pipeline.core.io import ConfigError
from pipeline.inference.engines import local_sampler, require_vllm
from pipeline.inference.generation import LocalSampler
from pipeline.orchestration.validation import validate_all
from pipeline.rl.grpo import GuidedRollout, grpo_args
from pipeline.rl.params import GRPOStageConfig
from tests.unit.test_rl import tiny  # noqa: F401  (a module-scoped fixture: a tiny student and its tokenizer)

VLLM_HERE = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(VLLM_HERE, reason="vLLM is installed here")
def test_vllm_asked_for_without_it_names_the_key_and_the_install():
    with pytest.raises(ConfigError, match=r"params.yaml: generation.engine: vLLM is not installed here; pip install "
                                          r"-e '.\[gpu\]' on a CUDA machine"):
        require_vllm("generation.engine")


def test_vllm_without_a_cuda_device_says_what_it_found(monkeypatch):
    import torch

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match="grpo.use_vllm: vLLM is installed but its engine needs a CUDA device; "
                                          "found a CPU-only build of torch"):
        require_vllm("grpo.use_vllm")


@pytest.mark.skipif(VLLM_HERE, reason="vLLM is installed here")
@pytest.mark.parametrize("sets, key, instead", [(["generation.engine=vllm"], "generation.engine",
                                                  "set generation.engine: hf"),
                                                 (["grpo.use_vllm=true"], "grpo.use_vllm", "set grpo.use_vllm: false")])
def test_params_validation_refuses_vllm_where_it_is_missing(tmp_path, sets, key, instead):
    from pipeline.orchestration.profiles import render, resolve
    from tests.unit.test_profiles import ROOT

    path = tmp_path / "params.yaml"
    path.write_text(render(resolve("tiny", sets, root=ROOT), "tiny", sets))
    with pytest.raises(ConfigError, match=f"{path}: {key}: vLLM is not installed here; .*, or {instead} "):
        validate_all(path)


def test_grpo_args_hand_trl_its_vllm_settings(tmp_path, monkeypatch):
    from pipeline.rl import vllm_server

    args = grpo_args(GRPOStageConfig(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://h:8000",
                                     vllm_gpu_memory_utilization=0.4), [1.0], tmp_path)
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_base_url) == (True, "server", "http://h:8000")
    assert args.vllm_gpu_memory_utilization == 0.4
    assert grpo_args(GRPOStageConfig(), [1.0], tmp_path).use_vllm is False
    # no URL in the params: the server the stage started (pipeline.rl.vllm_server), as its ranks inherit it
    monkeypatch.setenv(vllm_server.URL_ENV, "http://127.0.0.1:4321")
    started = grpo_args(GRPOStageConfig(use_vllm=True, vllm_mode="server"), [1.0], tmp_path)
    assert started.vllm_server_base_url == "http://127.0.0.1:4321"


def test_grpo_colocated_on_an_adapter_folder_exits_before_loading(tmp_path, monkeypatch, capsys):
    """TRL's colocated engine loads the policy's folder whole: an adapter models/sft (made before, or by a plain
    `dvc repro` that skips params validation) stops the stage naming the folder, exit 2, models/grpo untouched."""
    from stages import grpo
    from tests.conftest import TINY_PARAMS, write_params

    write_params(tmp_path, {**TINY_PARAMS, "grpo": {**TINY_PARAMS["grpo"], "use_vllm": True}})
    (tmp_path / "models/sft").mkdir(parents=True)
    (tmp_path / "models/sft/adapter_config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grpo, "require_vllm", lambda key: None)  # as on a CUDA machine with vLLM
    with pytest.raises(SystemExit) as exc:
        grpo.main()
    assert exc.value.code == 2
    assert "models/sft: a LoRA adapter folder; vLLM loads whole models" in capsys.readouterr().err
    assert not (tmp_path / "models/grpo").exists()


def test_the_default_engine_is_the_decode_loop_on_the_saved_model(tiny, tmp_path):  # noqa: F811
    from pipeline.modeling.models import save_model

    model, tok = tiny
    save_model(model, tok, tmp_path / "m")
    sampler = local_sampler(tmp_path / "m", 8, "m")
    assert type(sampler) is LocalSampler and sampler.batch_size == 8 and sampler.name == "m"
    assert local_sampler(tmp_path / "m", 8, "m", loaded=(model, tok)).model is model


class ScriptedVLLM:
    """TRL's VLLMGeneration.generate: one completion per prompt entry, scripted by the prompt's text."""

    def __init__(self, tokenizer, by_prompt: dict[str, list[str]]) -> None:
        self.tokenizer, self.by_prompt, self.calls = tokenizer, by_prompt, []

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls.append((len(prompts), num_generations, images))
        served: dict[str, int] = {}
        completions = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            k = served[text] = served.get(text, -1) + 1
            completions.append(self.tokenizer(self.by_prompt[text][k], add_special_tokens=False)["input_ids"])
        # per token, the sampled token's logprob and (TRL asks for none) no others
        return prompts, completions, [[[-0.5]] * len(ids) for ids in completions], None


def test_grpo_rollouts_come_from_trls_vllm_engine_and_failing_groups_are_replayed(tiny):  # noqa: F811
    model, tok = tiny
    gold = {"A\n": {"answer": "2", "answer_type": "number", "rationale": "Step 1: 1 + 1 = 2.\nAnswer: 2"},
            "B\n": {"answer": "3", "answer_type": "number", "rationale": "Step 1: 2 + 1 = 3.\nAnswer: 3"}}
    engine = ScriptedVLLM(tok, {"A\n": ["Answer: 7", "Answer: 8"], "B\n": ["Answer: 3", "Answer: 1"]})
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=engine, num_generations=2, processing_class=tok,
                              model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m, process_index=0),
                              state=SimpleNamespace(global_step=0))
    rollout = GuidedRollout(gold, num_generations=2, max_new_tokens=64, temperature=1.0, top_p=1.0, seed=0,
                            replay=True)
    out = rollout(["A\n", "A\n", "B\n", "B\n"], trainer)
    assert engine.calls == [(4, 2, None)]  # every entry of the G-fold batch, as TRL's own generation passes it
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in out["completion_ids"]]
    assert texts == ["Answer: 7", gold["A\n"]["rationale"], "Answer: 3", "Answer: 1"]  # A failed: its last replayed
    assert out["prompt_ids"] == tok(text=["A\n", "A\n", "B\n", "B\n"])["input_ids"]
    # vLLM's own logprobs go to TRL's importance-sampling correction; a replayed rollout has none (no correction)
    lengths = [len(ids) for ids in out["completion_ids"]]
    assert out["logprobs"] == [[-0.5] * lengths[0], [None] * lengths[1], [-0.5] * lengths[2], [-0.5] * lengths[3]]
    assert dict(rollout.stats) == {"groups": 2, "replayed_groups": 1, "replayed_samples": 1}
