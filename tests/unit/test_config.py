"""Params validation: unknown keys, wrong types and out-of-range values name the key."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import ConfigError
from pipeline.core.params import load_section
from pipeline.orchestration.profiles import defaults
from pipeline.orchestration.sections import SECTIONS, load_named
from pipeline.orchestration.validation import validate_all
from pipeline.training.params import SFTConfig

ROOT = Path(__file__).resolve().parents[2]


def update(base: dict, over: dict) -> dict:
    """`base` with `over` written into it key by key (unknown keys too: the tests put typos in)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = update(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def write(tmp_path: Path, data: dict) -> Path:
    """A complete params.yaml (the quick default) with `data` written over it."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(update(defaults(), data)))
    return path


def test_repo_params_yaml_is_valid_and_complete():
    sections = validate_all(ROOT / "params.yaml")
    assert set(sections) == set(SECTIONS)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, model in SECTIONS.items():
        # every field is spelled out in params.yaml, so the file documents the default run ...
        assert set(raw[name]) == set(model.model_fields), name
        # ... and a section parsed by its model is the raw YAML, value for value and type for type: what a stage
        # reads is what DVC tracks, so the schema module need not be a stage dependency (tests/unit/test_dag.py)
        assert sections[name].model_dump(mode="json") == raw[name], name
        assert yaml.safe_dump(sections[name].model_dump(mode="json")) == yaml.safe_dump(raw[name]), name


def test_unknown_key_is_named(tmp_path):
    path = write(tmp_path, {"sft": {"learning_rat": 0.1}})
    with pytest.raises(ConfigError, match=r"params.yaml: sft.learning_rat: unknown key"):
        load_section("sft", SFTConfig, path)


def test_wrong_type_is_named(tmp_path):
    path = write(tmp_path, {"sft": {"per_device_train_batch_size": "many"}})
    with pytest.raises(ConfigError, match=r"sft.per_device_train_batch_size: .*integer"):
        load_section("sft", SFTConfig, path)


def test_a_boolean_for_a_number_is_named(tmp_path):
    """YAML's `true` is no step count: pydantic alone would read it as 1."""
    path = write(tmp_path, {"sft": {"max_steps": True, "learning_rate": False}})
    with pytest.raises(ConfigError) as exc:
        load_section("sft", SFTConfig, path)
    assert "sft.max_steps: Value error, must be a number, not a boolean (got True)" in str(exc.value)
    assert "sft.learning_rate: Value error, must be a number, not a boolean (got False)" in str(exc.value)


def test_out_of_range_is_named(tmp_path):
    path = write(tmp_path, {"sft": {"learning_rate": -1}})
    with pytest.raises(ConfigError, match=r"sft.learning_rate: .*greater than 0"):
        load_section("sft", SFTConfig, path)


def test_cross_field_rule(tmp_path):
    path = write(tmp_path, {"synthesize": {"min_categories": 6, "max_categories": 4}})
    with pytest.raises(ConfigError, match=r"synthesize: .*min_categories"):
        load_named("synthesize", path)


@pytest.mark.parametrize("section, values, message", [
    # each passed validation before, then failed mid-stage after DVC had deleted the stage's outputs ...
    ("synthesize", {"answer_type_weights": {"number": 0, "binary": 0, "text": 0}}, r"a positive sum"),
    ("synthesize", {"answer_type_weights": {"number": -1, "binary": 1}}, r"shares must be >= 0"),
    ("synthesize", {"ood_held_out_pairs": ["foo"]}, r"'foo' is not 'f>g' with known functions"),
    ("prm_data", {"policy": "sftt"}, r"prm_data.policy: .*'sft'"),
    ("prm_data", {"policy": "prm"}, r"prm_data.policy: "),
    ("evaluate", {"decoding": {"prm": "nonexistent"}}, r"evaluate.decoding.prm: .*'prm'"),
    ("mine", {"repeat_unsolved": 0, "repeat_hard": 0, "repeat_easy": 0, "repeat_solved": 0}, r"RL set would be empty"),
    # ... or ran through on a wrong premise: NaN weights zero every reward; 0 steps train one; ood as test
    ("rewards", {"weights": {"accuracy": float("nan"), "format": 0.1}}, r"rewards.weights.accuracy: .*finite"),
    ("dpo", {"beta": float("inf")}, r"dpo.beta: .*finite"),
    ("sft", {"max_steps": 0}, r"sft.max_steps: .*0 would train one step"),
    ("teacher", {"train": {"max_steps": 0}}, r"teacher.train.max_steps: .*0 would train one step"),
    ("evaluate", {"splits": ["ood"], "sampled_splits": []}, r"splits: must include test"),
    ("evaluate", {"decoding": {"prm": None, "strategies": ["greedy", "prm_beam"]}},
     r"prm_beam need a PRM; prm is null"),
])
def test_settings_that_used_to_fail_mid_stage_or_mislead_are_refused(tmp_path, section, values, message):
    path = write(tmp_path, {section: values})
    with pytest.raises(ConfigError, match=message):
        validate_all(path)


@pytest.mark.parametrize("values, message", [
    ({"generation": {"engine": "vllm"}, "lora": {"dpo": True, "save": "adapter"}},
     r"generation.engine: vllm loads whole models, and lora.save: adapter leaves models/dpo an adapter folder"),
    ({"grpo": {"use_vllm": True, "vllm_mode": "colocate"}, "lora": {"sft": True, "save": "adapter"}},
     r"grpo.use_vllm: vLLM loads models/sft whole"),
    ({"grpo": {"use_vllm": True, "vllm_mode": "server"}, "lora": {"sft": True, "save": "adapter"}},
     r"grpo.use_vllm: vLLM loads models/sft whole"),  # a server the stage would start on models/sft
    ({"grpo": {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": ""},
      "lora": {"sft": True, "save": "adapter"}}, r"grpo.use_vllm: vLLM loads models/sft whole"),  # no URL either
])
def test_vllm_with_lora_adapter_folders_is_refused_before_vllm_is_looked_for(tmp_path, monkeypatch, values,
                                                                              message):
    """Said on any machine: the params cannot work together, whatever is installed."""
    import importlib.util

    real = importlib.util.find_spec  # a machine without vLLM, as this one, whatever the test runs on
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=message):
        validate_all(write(tmp_path, values))
    merged = update(values, {"lora": {"save": "merged"}})  # then only vLLM's absence is left to say
    with pytest.raises(ConfigError, match=r"vLLM is not installed here"):
        validate_all(write(tmp_path, merged))


def test_a_missing_section_or_key_is_named(tmp_path):
    path = write(tmp_path, {"base": {"hidden_size": 64}})
    assert load_named("base", path).hidden_size == 64
    params = yaml.safe_load(path.read_text())
    del params["sft"]
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"sft.seed, sft.learning_rate, .* missing"):
        load_section("sft", SFTConfig, path)


def test_unknown_section_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="sftt: unknown section"):
        validate_all(write(tmp_path, {"sftt": {}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("sft: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        validate_all(bad)


def test_stage_exits_nonzero_before_work(tmp_path):
    """The real command: exit 2, the key in stderr, no output folder created."""
    write(tmp_path, {"sft": {"learning_rat": 0.1}})
    proc = subprocess.run(
        [sys.executable, "-m", "stages.sft"], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "params.yaml: sft.learning_rat: unknown key" in proc.stderr
    assert not (tmp_path / "models").exists()


def test_a_key_pasted_into_api_key_env_is_refused_and_not_echoed(tmp_path):
    secret = "sk-live-0123456789abcdef"
    path = write(tmp_path, {"teacher": {"backend": "openai", "base_url": "http://x/v1", "model": "m",
                                        "api_key_env": secret}})
    with pytest.raises(ConfigError) as exc:
        load_named("teacher", path)
    assert "teacher.api_key_env" in str(exc.value) and secret not in str(exc.value)


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("teacher", {"backend": "openai", "model": "m"}, r"teacher: Value error, backend openai needs `base_url` and "
                                                         r"`model`$"),  # the section itself not echoed back
        ("teacher", {"backend": "transformers"}, "needs `model`"),
        ("teacher", {"backend": "vllm"}, "teacher.backend"),
        ("distill", {"k": 2, "max_traces": 3}, "max_traces"),
        ("distill", {"hard_min_pass_rate": 0.7, "hard_max_pass_rate": 0.5}, "hard_min_pass_rate"),
        ("distill", {"method": "kd"}, "distill.method"),
        ("sft", {"source": "teacher"}, "sft.source"),
        ("teacher", {"train": {"learning_rat": 0.1}}, "teacher.train.learning_rat: unknown key"),
    ],
)
def test_teacher_and_distill_params_are_checked(tmp_path, section, values, message):
    path = write(tmp_path, {section: values})
    with pytest.raises(ConfigError, match=message):
        load_named(section, path)


def test_packing_without_flash_attention_is_refused(tmp_path):
    """Padding-free packing reads a batch as one sequence: without flash_attention_2 it costs memory quadratic in the
    whole batch (BENCHMARKS.md, the gpu profile on an H200), so params validation names the keys."""
    from pipeline.orchestration.profiles import render, resolve

    params = resolve("tiny", ["sft.packing=true"], root=ROOT)
    path = tmp_path / "params.yaml"
    path.write_text(render(params, "tiny"))
    with pytest.raises(ConfigError, match="sft.packing: .* set model.attn_implementation: flash_attention_2"):
        validate_all(path)
    params["model"]["attn_implementation"] = "flash_attention_2"
    path.write_text(render(params, "tiny"))
    import importlib.util

    import torch

    if importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available():
        assert validate_all(path)["sft"].packing
    else:  # packing passes; the kernel it asks for is what this machine lacks
        with pytest.raises(ConfigError, match="model.attn_implementation: flash_attention_2 needs"):
            validate_all(path)


@pytest.mark.parametrize("stage, key", [("sft", "sft"), ("teacher", "teacher.train")])
def test_the_stage_refuses_packing_without_flash_attention_too(tmp_path, monkeypatch, capsys, stage, key):
    """A plain `dvc repro` skips `pipeline repro`'s validation: the stage's main checks again, before any work."""
    import importlib

    from pipeline.orchestration.profiles import render, resolve

    sets = [f"{key}.packing=true"]
    path = tmp_path / "params.yaml"
    path.write_text(render(resolve("tiny", sets, root=ROOT), "tiny", sets))
    monkeypatch.setenv("PIPELINE_PARAMS", str(path))
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"stages.{stage}").main()
    assert exit_.value.code == 2 and f"{key}.packing: padding-free packing" in capsys.readouterr().err


def test_a_loaded_local_model_folder_is_what_dvc_watches(tmp_path, monkeypatch):
    """`base.model_dependency` / `teacher.model_dependency`: derived from the model, checked when spelled out."""
    from pathlib import Path

    from pipeline.core.params import parse_section
    from pipeline.modeling.params import NO_MODEL_DEPENDENCY, BaseModelConfig, model_dependency_for
    from pipeline.training.params import TeacherConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "models" / "sft").mkdir(parents=True)
    assert model_dependency_for(None) == model_dependency_for("Qwen/Qwen2.5-0.5B") == NO_MODEL_DEPENDENCY
    assert model_dependency_for("mine") == "mine" and model_dependency_for("./gone") == "./gone"
    assert model_dependency_for(str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert model_dependency_for("~/m") == str(Path("~/m").expanduser())  # DVC does not expand ~
    # a stage's own output is not a dependency (DVC would refuse the cycle)
    assert model_dependency_for("models/sft") == model_dependency_for(str(tmp_path / "models/sft")) \
        == NO_MODEL_DEPENDENCY
    assert BaseModelConfig(model="mine").model_dependency == "mine"
    assert TeacherConfig(backend="transformers", model="mine").model_dependency == "mine"
    assert TeacherConfig(backend="openai", model="mine", base_url="http://x/v1").model_dependency == NO_MODEL_DEPENDENCY
    with pytest.raises(ConfigError, match=r"base: Value error, model_dependency: must be 'mine'"):
        parse_section("base", BaseModelConfig, {"model": "mine", "model_dependency": NO_MODEL_DEPENDENCY})
