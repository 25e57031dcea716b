"""Profiles: resolution, composition with -S, hand-edit protection, the CLI's refusals.

The resolved params of every profile are committed (tests/unit/resolved/<name>.yaml,
written by `python -m pipeline params --profile NAME`): a change to a default in
pipeline/<room>/params.py that reaches a profile fails here until the expected file is
regenerated on purpose, so `research` keeps reproducing the numbers it was run with.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import ConfigError
from pipeline.modeling.pretrained import known_folder
from pipeline.orchestration import profiles
from pipeline.orchestration.sections import SECTIONS, load_named
from pipeline.orchestration.validation import validate_all

ROOT = Path(__file__).resolve().parents[2]
RESOLVED = Path(__file__).parent / "resolved"


def test_params_yaml_is_the_resolution_its_header_names():
    text = (ROOT / "params.yaml").read_text()
    assert profiles.header_of(text) == ("default", [])
    assert yaml.safe_load(text) == profiles.resolve("default", root=ROOT) == profiles.defaults()


def example_sets(name: str, value: object = "example") -> list[str]:
    """A value for each key the profile leaves to -S (`pretrained`'s base.model), as its resolved file was written."""
    return [f"{key}={value}" for key in profiles.required(name, ROOT)]


def saved_model(folder: Path) -> Path:
    """A tiny built student saved in Hugging Face format, with the chat template a built tokenizer carries."""
    from pipeline.modeling.models import build_student, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    tokenizer = train_tokenizer(["Question: 1 + 2?\n#### 3"] * 20, 280)
    cfg = BaseModelConfig(seed=0, vocab_size=280, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    save_model(build_student(cfg, tokenizer), tokenizer, folder)
    return folder


@pytest.mark.parametrize("name", [n for n in profiles.names(ROOT) if n != "default"])
def test_each_profile_resolves_to_its_committed_file(name):
    expected = RESOLVED / f"{name}.yaml"
    sets = "".join(f" -S {s}" for s in example_sets(name))
    assert expected.exists(), (
        f"write it: python -m pipeline params --profile {name}{sets} > {expected.relative_to(ROOT)}")
    assert profiles.resolve(name, example_sets(name), root=ROOT) == yaml.safe_load(expected.read_text()), (
        f"profile {name} resolves differently from {expected.relative_to(ROOT)}; if the change is meant, regenerate it")


def test_every_committed_resolution_has_its_profile():
    assert {p.stem for p in RESOLVED.glob("*.yaml")} == set(profiles.names(ROOT)) - {"default"}


@pytest.mark.parametrize("name", profiles.names(ROOT))
def test_render_round_trips_and_every_key_is_spelled_out(name, tmp_path):
    # a key left to -S (a model to bring) gets a real one: validation loads its tokenizer
    sets = example_sets(name, saved_model(tmp_path / "model")) if profiles.required(name, ROOT) else []
    params = profiles.resolve(name, sets, root=ROOT)
    model = params["base"]["model"]
    if model and known_folder(model) and not Path(model).is_dir():
        # a package's model that `repro` fetches first (a clean clone has none): a saved one stands in for it
        sets.append(f"base.model={saved_model(tmp_path / 'fetched')}")
        params = profiles.resolve(name, sets, root=ROOT)
    path = tmp_path / "params.yaml"
    path.write_text(profiles.render(params, name))
    assert yaml.safe_load(path.read_text()) == params
    sections = validate_all(path)  # complete: a missing key would fail here
    assert {n: s.model_dump(mode="json") for n, s in sections.items()} == params


@pytest.fixture
def root(tmp_path):
    """A project root with two profiles: `big` and `small` (which extends big)."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/big.yaml").write_text(yaml.safe_dump(
        {"description": "big", "params": {"sft": {"num_train_epochs": 9, "learning_rate": 0.001},
                                          "rewards": {"weights": {"accuracy": 1.0, "cosine": 0.5}}}}))
    (tmp_path / "profiles/small.yaml").write_text(yaml.safe_dump(
        {"extends": "big", "params": {"sft": {"learning_rate": 0.002}}}))
    return tmp_path


def test_profiles_layer_on_the_defaults_and_on_each_other(root):
    quick = profiles.resolve("default", root=root)
    small = profiles.resolve("small", root=root)
    assert small["sft"]["num_train_epochs"] == 9.0 and small["sft"]["learning_rate"] == 0.002
    # everything a profile does not name is the quick default
    assert {k: v for k, v in small.items() if k not in ("sft", "rewards")} == \
        {k: v for k, v in quick.items() if k not in ("sft", "rewards")}
    # a dict-valued param is replaced whole, not merged key by key (format and step_correctness are gone)
    assert small["rewards"]["weights"] == {"accuracy": 1.0, "cosine": 0.5}
    assert profiles.names(root) == ["default", "big", "small"]


def test_set_composes_on_top_of_a_profile(root):
    params = profiles.resolve("small", ["sft.learning_rate=0.0005", "evaluate.decoding.n=4",
                                        "synthesize.chart_types=[bar]"], root=root)
    assert params["sft"]["learning_rate"] == 0.0005 and params["sft"]["num_train_epochs"] == 9.0
    assert params["evaluate"]["decoding"]["n"] == 4 and params["synthesize"]["chart_types"] == ["bar"]


def test_sets_fill_a_null_section_key_by_key(root):
    """task.dataset is null in the default: each -S adds a key, and a key the schema lacks is still refused."""
    params = profiles.resolve("small", ["task.kind=dataset", "task.dataset.path=examples/gsm8k",
                                        "task.dataset.answer_extraction=gsm8k"], root=root)
    assert params["task"]["dataset"]["path"] == "examples/gsm8k"
    assert params["task"]["dataset"]["answer_extraction"] == "gsm8k"
    with pytest.raises(ConfigError, match=r"-S task.dataset.answer_field_x=a: task.dataset.answer_field_x: unknown"):
        profiles.resolve("small", ["task.dataset.path=examples/gsm8k", "task.dataset.answer_field_x=a"], root=root)
    assert profiles.resolve("small", ["task.dataset.path=examples/gsm8k", "task.dataset=null"],
                            root=root)["task"]["dataset"] is None  # a section the schema lets be null may be reset


@pytest.mark.parametrize(("sets", "message"), [
    (["sft.learning_rat=0.1"], r"-S sft.learning_rat=0.1: sft.learning_rat: unknown key"),
    (["sftt.seed=1"], r"sftt: unknown key"),
    (["sft.learning_rate"], r"expected key=value"),
    (["sft.learning_rate=-1"], r"sft.learning_rate: .*greater than 0"),
    (["evaluate.decoding.n=[unclosed"], r"not valid YAML"),
    # each read silently before: true as seed 1, a null section as the schema's defaults under the profile's values
    (["sft.seed=true"], r"sft.seed: .*must be a number, not a boolean \(got True\)"),
    (["synthesize.answer_type_weights={number: true, binary: 1, text: 1}"],
     r"synthesize.answer_type_weights.number: .*must be a number, not a boolean \(got True\)"),
    (["sft.rank_drill.curriculum=[200, false]"],
     r"sft.rank_drill.curriculum.1: .*must be a number, not a boolean \(got False\)"),
    (["synthesize=null"],
     r"-S synthesize=null: synthesize: a section takes keys \(synthesize.<key>=<value>\), not null"),
    (["base.drills=3"], r"base.drills: a section takes keys .*not 3"),
])
def test_bad_overrides_name_the_key(root, sets, message):
    with pytest.raises(ConfigError, match=message):
        profiles.resolve("small", sets, root=root)


def test_bad_profiles_name_the_file_and_key(root):
    (root / "profiles/typo.yaml").write_text(yaml.safe_dump({"params": {"sft": {"epochs": 3}}}))
    with pytest.raises(ConfigError, match=r"profiles/typo.yaml: sft.epochs: unknown key"):
        profiles.resolve("typo", root=root)
    (root / "profiles/extra.yaml").write_text(yaml.safe_dump({"sft": {"seed": 1}}))
    with pytest.raises(ConfigError, match=r"extra.yaml: sft: unknown key"):
        profiles.resolve("extra", root=root)
    (root / "profiles/loop.yaml").write_text(yaml.safe_dump({"extends": "loop"}))
    with pytest.raises(ConfigError, match="cannot extend itself"):
        profiles.resolve("loop", root=root)
    with pytest.raises(ConfigError, match=r"unknown profile 'nope'; profiles: default, big, extra, loop, small, typo"):
        profiles.resolve("nope", root=root)


def test_seed_sets_every_seed_and_the_new_question_seed():
    sets = profiles.seed_sets(3)
    params = profiles.resolve("default", sets, root=ROOT)
    seeds = [k for k in sets if k.endswith(".seed=3")]
    assert len(seeds) == 14  # every section's seed, and the nested drills' and teacher.train's
    assert params["sft"]["seed"] == params["base"]["drills"]["seed"] == params["teacher"]["train"]["seed"] == 3
    assert params["prm_data"]["question_seed"] == 4 != params["synthesize"]["seed"]
    # --seed 0 is the default: no seed was picked by hand (study drills-until-they-read)
    assert profiles.resolve("default", profiles.seed_sets(0), root=ROOT) == profiles.defaults()
    with pytest.raises(ConfigError, match=r"synthesize.seed: Input should be greater than or equal to 0 \(got -1\)"):
        profiles.resolve("default", profiles.seed_sets(-1), root=ROOT)


def test_compact_keeps_the_last_value_of_each_key():
    assert profiles.compact(["a.b=1", "c=2", "a.b=3", "c=2"]) == ["a.b=3", "c=2"]


def test_write_records_the_profile_and_refuses_to_lose_a_hand_edit(root):
    path = root / "params.yaml"
    assert profiles.write("small", ["sft.seed=4"], path, root) is True
    assert profiles.header_of(path.read_text()) == ("small", ["sft.seed=4"])
    assert profiles.hand_edits(path, root) == []
    assert profiles.write("small", ["sft.seed=4"], path, root) is False  # same text: the file is not touched
    assert profiles.write("big", [], path, root) is True  # switching needs no edit to be lost

    edited = path.read_text().replace("\n  beta: 0.1 ", "\n  beta: 0.3 ", 1)  # dpo's; grpo's is 0.04
    path.write_text(edited)
    assert profiles.hand_edits(path, root) == ["dpo.beta"]
    with pytest.raises(ConfigError, match=r"hand edits not in its profile: dpo.beta.*-S key=value"):
        profiles.write("small", [], path, root)
    assert path.read_text() == edited  # nothing lost
    # restated as -S, the edit is kept: the refusal's own advice clears it, and the header now explains the file
    assert profiles.write("small", ["dpo.beta=0.3"], path, root) is True
    assert profiles.header_of(path.read_text()) == ("small", ["dpo.beta=0.3"]) and profiles.hand_edits(path, root) == []
    path.write_text(path.read_text().replace("\n  beta: 0.3 ", "\n  beta: 0.2 ", 1))
    with pytest.raises(ConfigError, match=r"hand edits not in its profile: dpo.beta"):  # another value: lost
        profiles.write("small", ["dpo.beta=0.3"], path, root)
    path.write_text("sft:\n  seed: 1\n")  # a file with no profile header
    with pytest.raises(ConfigError, match="the whole file"):
        profiles.write("small", [], path, root)


def test_a_profile_changed_since_params_yaml_was_written_is_no_hand_edit(root):
    """After a `git pull` that changes a profile file, params.yaml still holds the values it was written with: the
    header's hash of them says so, and `--profile` rewrites the file instead of calling the profile's changes hand
    edits. A value edited by hand since is still one."""
    path = root / "params.yaml"
    profiles.write("small", [], path, root)
    (root / "profiles/small.yaml").write_text(yaml.safe_dump(
        {"extends": "big", "params": {"sft": {"learning_rate": 0.004}, "dpo": {"beta": 0.2}}}))
    assert profiles.hand_edits(path, root) == []
    assert profiles.write("small", [], path, root) is True
    assert profiles.read_params(path)["sft"]["learning_rate"] == 0.004
    path.write_text(path.read_text().replace("\n  beta: 0.2 ", "\n  beta: 0.3 ", 1))
    assert profiles.hand_edits(path, root) == ["dpo.beta"]


def test_stages_refuse_a_params_file_with_a_key_left_out(tmp_path):
    path = tmp_path / "params.yaml"
    params = profiles.defaults()
    del params["sft"]["logging_steps"], params["sft"]["rank_drill"]["steps"]
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"sft.logging_steps, sft.rank_drill.steps: missing"):
        load_named("sft", path)


def test_section_models_are_the_whole_schema():
    assert set(profiles.defaults()) == set(SECTIONS)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


@pytest.fixture
def project(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    return tmp_path


def test_unknown_profile_exits_2_before_any_work_and_changes_nothing(project):
    before = (project / "params.yaml").read_text()
    proc = cli("repro", "--profile", "nope", cwd=project)
    assert proc.returncode == 2
    assert "unknown profile 'nope'; profiles: default, " in proc.stderr and "research" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (project / "params.yaml").read_text() == before
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml", "profiles"]  # no server, no outputs


def test_params_that_fail_validation_exit_2_and_leave_params_yaml_as_it_was(project):
    """Each section parses (the -S is a known key), but together they do not fit: validation refuses them after
    the rewrite, which is undone."""
    before = (project / "params.yaml").read_text()
    proc = cli("repro", "-S", "task.kind=dataset", "-S", "task.dataset={path: openai/gsm8k}", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert "prm.sources: gold labels need the chart task's gold step values" in proc.stderr
    assert "set prm.sources: [mc, mcts]" in proc.stderr and "Traceback" not in proc.stderr
    assert "params.yaml: profile" not in proc.stderr  # it was never rewritten for good
    assert (project / "params.yaml").read_text() == before
    assert not {"data", "models", "metrics"} & {p.name for p in project.iterdir()}  # (.dvc/: the run lock)


def test_the_results_table_titles_this_run_by_its_profile(project):
    """The README's table (`report --results`) calls a run the quick default only when it is one; a dataset task's
    run stands alone, not beside the chart snapshots."""
    def header() -> str:
        proc = cli("report", "--results", cwd=project)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()[0]

    assert header() == ("| test accuracy unless named | quick default | quick default, `--seed 1` | "
                        "`smollm2` profile (SmolLM2-135M-Instruct) |")
    assert cli("params", "--write", "--profile", "tiny", "-S", "sft.seed=2", cwd=project).returncode == 0
    assert header() == ("| test accuracy unless named | this run (`tiny`, sft.seed=2) | quick default, `--seed 1` | "
                        "`smollm2` profile (SmolLM2-135M-Instruct) |")
    assert cli("params", "--write", "--profile", "gsm8k", cwd=project).returncode == 0
    assert header() == "| test accuracy unless named | this run (`gsm8k`) |"


def test_params_command_prints_writes_and_composes(project):
    proc = cli("params", "--profile", "research", "-S", "sft.seed=7", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == profiles.resolve("research", ["sft.seed=7"], root=ROOT)
    assert cli("params", "--write", "--profile", "research", cwd=project).returncode == 0
    assert profiles.header_of((project / "params.yaml").read_text()) == ("research", [])
    # -S alone composes on the profile params.yaml records, and is recorded too
    assert cli("params", "--write", "-S", "dpo.beta=0.2", cwd=project).returncode == 0
    assert profiles.header_of((project / "params.yaml").read_text()) == ("research", ["dpo.beta=0.2"])
    assert yaml.safe_load((project / "params.yaml").read_text())["dpo"]["beta"] == 0.2
    # what `repro` would refuse across sections (a dataset task with gold step labels) is written with a warning:
    # the file may be meant for another machine, where the machine's own checks (cores, GPUs, vLLM) differ
    proc = cli("params", "--write", "--profile", "tiny", "-S", "task.kind=dataset", "-S",
               "task.dataset.path=gsm8k", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "warning: params.yaml is written, but `python -m pipeline repro` here would refuse it" in proc.stderr
    assert "prm.sources: gold labels need the chart task's gold step values" in proc.stderr
    assert yaml.safe_load((project / "params.yaml").read_text())["task"]["kind"] == "dataset"
    assert "warning" not in cli("params", "--write", "--profile", "tiny", cwd=project).stderr
    listed = cli("params", "--list", cwd=project).stdout.split("\n")
    assert [line.split()[0] for line in listed if line] == profiles.names(ROOT)


def test_the_pretrained_profile_runs_smollm2_and_takes_a_model_of_ones_own():
    assert profiles.resolve("pretrained", root=ROOT)["base"]["model"] == "pretrained/SmolLM2-135M-Instruct"
    params = profiles.resolve("pretrained", ["base.model=models/mine"], root=ROOT)
    # a pretrained model's fine-tuning rates, not the from-scratch student's
    assert params["base"]["model"] == "models/mine" and params["sft"]["learning_rate"] == 1e-5
    assert params["grpo"]["learning_rate"] == 1e-6 and params["dpo"]["learning_rate"] == 5e-7
    assert params["task"]["kind"] == "dataset"  # what it extends: the gsm8k profile's task


def test_requires_is_inherited_and_checked_through_extends(root):
    (root / "profiles/needs.yaml").write_text(yaml.safe_dump({"requires": {"base.model": "a model"}}))
    (root / "profiles/child.yaml").write_text(yaml.safe_dump({"extends": "needs", "params": {"sft": {"seed": 3}}}))
    assert profiles.required("child", root) == {"base.model": "a model"}
    with pytest.raises(ConfigError, match="profile child needs base.model"):
        profiles.resolve("child", root=root)
    assert profiles.resolve("child", ["base.model=m"], root=root)["sft"]["seed"] == 3
    (root / "profiles/bad.yaml").write_text(yaml.safe_dump({"requires": ["base.model"]}))
    with pytest.raises(ConfigError, match="requires: must be a mapping"):
        profiles.resolve("bad", root=root)
