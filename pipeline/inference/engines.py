"""Which engine samples a local model: the pipeline's decode loop on transformers, or vLLM.

    sampler = local_sampler(Path("models/sft"), batch_size=64, name="sft")   # `generation.engine`
    sampler.sample(prompts, n=4, temperature=0.8, top_p=1.0, max_new_tokens=192, seed=0)

Both are `pipeline.inference.generation.Sampler`s that read a question the same way (`pipeline.modeling.chat`, no
special tokens added, the tokenizer's EOS ending a completion) and count the same tokens, so a
stage's code does not change with the engine; greedy text agrees up to the kernels' float rounding
(tests/gpu/test_vllm.py). vLLM is an optional extra (`pip install -e .[gpu]`, on a CUDA machine):
asking for it where it is missing fails at params validation (`require_vllm`), naming the key.
Step-level search (`pipeline.evaluation.search`) and PRM scoring stay on transformers: a `VLLMSampler` loads
the transformers copy of its model when a stage first asks for `.model`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.io import ConfigError, InputError
from pipeline.core.params import PARAMS_FILE, given
from pipeline.inference.generation import Generation, LocalSampler
from pipeline.inference.params import GenerationConfig
from pipeline.modeling import chat
from pipeline.modeling.params import ModelLoadConfig

INSTALL = "pip install -e '.[gpu]' on a CUDA machine (it installs vLLM through TRL's vllm extra)"


# what a key asking for vLLM is set to when it is not to be had
INSTEAD = {"generation.engine": "generation.engine: hf (the transformers decode loop)",
           "grpo.use_vllm": "grpo.use_vllm: false (TRL generates with transformers)"}


def require_vllm(key: str, path: Path | str = PARAMS_FILE) -> None:
    """Fails naming `key` when vLLM is not installed or no CUDA device is visible (vLLM's engine needs one)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{path}: {key}: vLLM is not installed here; {INSTALL}, or set {INSTEAD[key]}")
    import torch

    if not torch.cuda.is_available():
        found = "a CUDA build of torch but no visible GPU" if torch.version.cuda else "a CPU-only build of torch"
        raise ConfigError(f"{path}: {key}: vLLM is installed but its engine needs a CUDA device; found {found}")


def local_sampler(model_dir: Path | str, batch_size: int, name: str, loaded: tuple | None = None
                  ) -> LocalSampler | VLLMSampler:
    """The sampler of a saved model under `generation.engine`; `loaded` (model, tokenizer) when the stage has it."""
    if given(GenerationConfig).engine == "vllm":
        sampler = VLLMSampler(model_dir, name)
        if loaded is not None:
            sampler._model = loaded[0]
        return sampler
    from pipeline.modeling.models import load_model

    model, tokenizer = loaded if loaded is not None else load_model(model_dir)
    return LocalSampler(model, tokenizer, batch_size=batch_size, name=name)


class VLLMSampler:
    """A saved model sampled by vLLM's offline engine (`generation.engine: vllm`).

    Prompts go in as token ids, tokenized here as the decode loop tokenizes them (no BOS added: a chat
    template carries its own), with seeds of their own so that repeated prompts draw apart; the tokens
    come back as ids and are decoded here. `model`, the transformers copy for step search and the PRM's
    tokenizer check, loads on first use.
    """

    local = True

    def __init__(self, model_dir: Path | str, name: str = "vllm") -> None:
        require_vllm("generation.engine")
        if (Path(model_dir) / "adapter_config.json").is_file():
            raise InputError(f"{model_dir}: a LoRA adapter folder; vLLM loads whole models: save it merged "
                             "(lora.save: merged) or use generation.engine: hf")
        from vllm import LLM

        from pipeline.modeling.models import load_tokenizer

        cfg, model_cfg = given(GenerationConfig), given(ModelLoadConfig)
        self.model_dir, self.name, self.batch_size = Path(model_dir), name, 0  # vLLM schedules its own batches
        self.tokenizer = load_tokenizer(model_dir)
        # generation_config "vllm": the model's own generation_config.json (its sampling defaults, its extra EOS
        # ids) is not applied, so a completion ends where the decode loop's would: at the tokenizer's EOS
        self.llm = LLM(model=str(model_dir), tokenizer=str(model_dir), dtype=model_cfg.dtype, seed=0,
                       gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, max_model_len=cfg.vllm_max_model_len,
                       trust_remote_code=model_cfg.trust_remote_code, generation_config="vllm")
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from pipeline.modeling.models import load_model

            self._model = load_model(self.model_dir)[0]
        return self._model

    def sample(self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
               max_new_tokens: int = 192, seed: int = 0) -> list[list[Generation]]:
        from vllm import SamplingParams

        if not prompts:
            return []
        texts = [chat.render(self.tokenizer, p) for p in prompts]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        # vLLM seeds a request's n samples seed, seed + 1, ...: each prompt gets a range of its own
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                 max_tokens=max_new_tokens, seed=(seed * 1_000_003 + i) * n,
                                 stop_token_ids=[self.tokenizer.eos_token_id], detokenize=False)
                  for i in range(len(prompts))]
        outputs = self.llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=True)
        # decoded here, as the decode loop decodes: the same text for the same tokens
        return [[Generation(self.tokenizer.decode(list(o.token_ids), skip_special_tokens=True), len(o.token_ids))
                 for o in out.outputs] for out in outputs]
