"""The real thing: `python -m pipeline repro` (which runs `dvc repro`) in a temporary git repository.

Checks the outputs and metrics, that every stage lists under deps each
`pipeline/` file it imported while it ran, that a second run re-executes nothing,
that changing one `sft` param re-runs exactly `sft` and what depends on it, and
that params reach only the stages that declare them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.evaluation.compare import bootstrap_markdown
from pipeline.orchestration.orchestrate import diff_markdown
from tests.conftest import api_post, copy_project, venv_env, write_params
from tests.unit.test_dag import listed, plumbing, stages

pytestmark = pytest.mark.e2e


def sh(args: list[str], cwd, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=venv_env(**env), capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def dvc(*args: str, cwd, check: bool = True) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "dvc", *args], cwd, check)


EVALUATED = ["evaluate@base", "evaluate@dpo", "evaluate@grpo", "evaluate@sft", "evaluate@sft_extended",
             "evaluate@teacher"]
# The PRM is trained on the SFT policy's steps and guides every model, so the teacher is re-evaluated too.
AFTER_SFT = sorted(["sft", "mine", "grpo", "sft_extended", "dpo", "prm_data", "prm", "report", *EVALUATED])
ALL_STAGES = sorted(["synthesize", "animate", "base", "teacher", "distill", *AFTER_SFT])


def ran_stages(output: str) -> list[str]:
    return sorted(set(re.findall(r"Running stage '([^']+)'", output)))


@pytest.fixture(scope="module")
def repo(tmp_path_factory, prefect_api):
    folder = copy_project(tmp_path_factory.mktemp("repo"))
    write_params(folder)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        sh(cmd, folder)
    return folder


@pytest.fixture
def built(repo):
    """The repository with every stage up to date: for a test that runs without the ones before it (`make
    test-slow` selects the slow tests alone), the build they would have left."""
    if json.loads(dvc("status", "--json", cwd=repo).stdout) != {}:
        sh([sys.executable, "-m", "pipeline", "repro"], repo)
        sh(["git", "add", "-A"], repo)
        sh(["git", "commit", "-qm", "built"], repo)  # the queue's experiments start from a commit
    return repo


def test_repro_builds_everything(repo, prefect_api, tmp_path):
    imports = tmp_path / "imports.jsonl"
    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo, PIPELINE_IMPORT_LOG=str(imports))
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == ALL_STAGES
    assert "fork server:" not in out  # no stage was declined by the fork server (pipeline.core.forkserver) ...
    # dvc.yaml lists every pipeline file a stage imported while it ran, including imports inside functions (which
    # tests/unit/test_dag.py cannot see); Prefect plumbing and path names re-run nothing by design.
    logged = [json.loads(line) for line in imports.read_text().splitlines()]
    assert sorted(r["stage"] for r in logged) == ALL_STAGES
    assert [r["stage"] for r in logged if r["forked"]], "... and stages ran forked from it once its imports were done"
    deps = {name: stage_deps for name, _, stage_deps in stages()}  # a matrix entry (evaluate@sft) shares its deps
    for record in logged:
        name = record["stage"].split("@")[0]
        assert f"stages/{name}.py" in record["files"]  # the log sees this repository's files
        missing = [f for f in record["files"] if not plumbing(f) and not listed(f, deps[name])]
        assert not missing, f"dvc.yaml: stage {record['stage']} imported {missing} but does not list them under deps"
    for path in ("data/synthesize/test.parquet", "models/base/model.safetensors", "models/teacher/model.safetensors",
                 "data/distill/train.parquet", "data/distill/hard.parquet", "data/distill/pairs.parquet",
                 "metrics/distill.json", "plots/distill/pass_rate.png", "models/sft/model.safetensors",
                 "data/mine/rl.parquet", "data/mine/pairs.parquet", "models/grpo/model.safetensors",
                 "models/sft_extended/model.safetensors", "models/dpo/model.safetensors", "plots/grpo",
                 "data/evaluate/sft/predictions.parquet", "metrics/evaluate/sft.json", "metrics/evaluate/grpo.json",
                 "metrics/evaluate/teacher.json", "data/prm_data/train.parquet", "models/prm/model.safetensors",
                 "metrics/prm.json", "plots/prm/calibration.png", "plots/report/generalisation.png", "dvc.lock"):
        assert (repo / path).exists(), path
    report = (repo / "plots/report/report.md").read_text()
    assert "| sft | " in report and "perfect step verifier" in report  # best-of-N beside its ceilings
    shown = json.loads(dvc("metrics", "show", "--json", cwd=repo).stdout)
    metrics = shown[""]["data"]["metrics/evaluate/sft.json"]["data"]  # "" is the workspace
    assert 0 <= metrics["accuracy"] <= 1 and "accuracy_ood" in metrics
    assert set(metrics["decoding"]) == {"greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote", "prm_beam",
                                        "prm_mcts"}
    # every stage ran as a flow on the shared server, and the orchestrator published the metrics
    flows = {f["name"] for f in api_post(prefect_api, "flows/filter", {})}
    assert {"repro", "synthesize", "base", "teacher", "distill", "sft", "mine", "grpo", "sft_extended", "dpo",
            "prm_data", "prm", "evaluate", "report"} <= flows
    keys = {a["key"] for a in api_post(prefect_api, "artifacts/filter", {})}
    assert {"pipeline-metrics", "pipeline-metrics-diff", "pipeline-models", "pipeline-decoding",
            "pipeline-generalisation"} <= keys
    # and inside each stage's flow run, its phases ran as tasks (`pipeline.core.phases.phase`)
    for phase in ("generate", "drill", "load model", "train", "save model", "sample the teacher", "sample the policy",
                  "evaluate"):
        runs = api_post(prefect_api, "task_runs/filter", {"task_runs": {"name": {"like_": phase}}, "limit": 1})
        assert runs and runs[0]["state_type"] == "COMPLETED", phase


def test_every_model_folder_loads_through_auto_classes_as_the_pipeline_loads_it(repo, monkeypatch):
    """What any tool pointed at models/<name> does (transformers' pipeline, `transformers serve`, vLLM, lm-eval):
    AutoTokenizer and AutoModelForCausalLM give the pipeline loader's token ids and logits, and the folder says in
    its model card what it is and how to load it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.core.io import read_rows
    from pipeline.core.params import giving
    from pipeline.modeling.models import load_model
    from pipeline.orchestration.sections import read_section

    monkeypatch.chdir(repo)
    with giving(read_section("model")):  # the loader takes params.yaml's `model` section, as a stage is handed it
        rows = read_rows(repo / "data/synthesize/test.parquet")[:4]
        texts = [r["prompt"] + r["rationale"] for r in rows]
        folders = sorted(p.parent for p in (repo / "models").glob("*/config.json"))
        assert [f.name for f in folders] == ["base", "dpo", "grpo", "prm", "sft", "sft_extended", "teacher"]
        for folder in folders:
            model, tokenizer = load_model(folder, device="cpu")
            auto_tok = AutoTokenizer.from_pretrained(str(folder))
            auto = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
            ours = tokenizer(texts, add_special_tokens=False)["input_ids"]
            assert auto_tok(texts, add_special_tokens=False)["input_ids"] == ours, folder.name
            assert auto_tok.padding_side == "left" and auto_tok.eos_token_id == tokenizer.eos_token_id, folder.name
            with torch.no_grad():
                for ids in ours:
                    batch = torch.tensor([ids])
                    assert torch.allclose(auto(batch).logits, model(batch).logits, atol=1e-5), folder.name
            card = (folder / "README.md").read_text()
            assert f"# models/{folder.name}" in card and "AutoTokenizer.from_pretrained" in card, folder.name
            assert "prompt format | raw" in card and "seed" in card and "seconds" not in card, folder.name


def test_second_repro_runs_nothing(repo):
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == []
    assert "up to date" in dvc("status", cwd=repo).stdout.lower() or dvc("status", cwd=repo).stdout.strip() == ""


def test_forced_reruns_of_data_and_training_stages_leave_dvc_lock_byte_identical(repo):
    """Same seed, same machine: `dvc repro -f -s` of synthesize, mine and sft writes the same bytes into every file
    DVC hashes, their metrics and curves included (the machine's speed goes to timings/, which nothing tracks), so
    dvc.lock stays as it was and nothing after them turns stale."""
    before = (repo / "dvc.lock").read_text()
    for stage in ("synthesize", "mine", "sft"):
        dvc("repro", "-f", "-s", stage, cwd=repo)
    assert (repo / "dvc.lock").read_text() == before, lock_differences(repo, before)
    assert json.loads((repo / "timings/sft.json").read_text())["train_seconds"] > 0  # the timings are kept, beside
    assert json.loads(dvc("status", "--json", cwd=repo).stdout) == {}


@pytest.mark.slow
def test_a_forced_rerun_of_every_stage_leaves_dvc_lock_byte_identical(built):
    before = (built / "dvc.lock").read_text()
    proc = dvc("repro", "-f", cwd=built)
    assert ran_stages(proc.stdout + proc.stderr) == ALL_STAGES
    assert (built / "dvc.lock").read_text() == before, lock_differences(built, before)


def lock_differences(repo, before: str) -> list[str]:
    """Every hashed path of dvc.lock whose md5 a re-run changed, `stage: path`, with the files inside a changed
    folder that differ (read from DVC's cache)."""
    old = yaml.safe_load(before)["stages"]
    new = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    out = []
    for stage, entry in new.items():
        for kind in ("outs", "deps"):
            was = {o["path"]: o.get("md5") for o in old.get(stage, {}).get(kind, [])}
            now = {o["path"]: o.get("md5") for o in entry.get(kind, [])}
            for path in sorted(was.keys() | now.keys()):
                if was.get(path) != now.get(path):
                    inside = changed_files(repo, {path: was.get(path) or ""}, {path: now.get(path) or ""})
                    out.append(f"{stage}: {path}" + (f" ({', '.join(inside)})" if inside else ""))
    return out


def changed_files(repo, before: dict, after: dict) -> list[str]:
    """The files that differ inside the folder outputs whose hashes differ, read from DVC's cache (a `.dir` entry
    lists each file's md5): which of the folder's files a forced re-run wrote differently."""
    def listing(md5: str) -> dict:
        entry = repo / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
        return {f["relpath"]: f["md5"] for f in json.loads(entry.read_text())} if md5 and entry.is_file() else {}

    changed = []
    for path, md5 in after.items():
        if md5 != before.get(path) and md5.endswith(".dir"):
            old, new = listing(before.get(path, "")), listing(md5)
            changed += [f"{path}/{name}" for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]
    return changed


def test_sft_and_evaluate_killed_mid_stage_then_the_next_run_finishes(repo, tmp_path):
    """The fault suite's killed stage (tests/faults/test_killed_stage.py) for sft and evaluate, here where their
    upstream is built: a new sft learning rate, a run killed as models/sft is about to be put in place, one killed
    as evaluate@sft's predictions are, then a run that finishes. Back at the old learning rate, DVC's run-cache
    restores every output as it was: the killed runs corrupted nothing."""
    from tests.faults.test_killed_stage import killed_repro, stale

    lock = (repo / "dvc.lock").read_text()
    original = yaml.safe_load((repo / "params.yaml").read_text())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["sft"]["learning_rate"] = 0.0025
    write_params(repo, params)
    killed_repro(repo, "sft", "commit:models/sft", tmp_path / "home")
    assert list((repo / "models").glob(".sft.tmp-*")) and "sft" in stale(repo, "sft")

    killed_repro(repo, "evaluate@sft", "commit:data/evaluate/sft", tmp_path / "home")
    assert not list((repo / "models").glob(".sft.tmp-*")), "the next run removed the killed run's folder"
    assert "up to date" in stale(repo, "sft")
    assert list((repo / "data/evaluate").glob(".sft.tmp-*")) and "evaluate@sft" in stale(repo, "evaluate@sft")

    proc = sh([sys.executable, "-m", "pipeline", "repro", "evaluate@sft"], repo)
    assert ran_stages(proc.stdout + proc.stderr) == ["evaluate@sft"]  # what the killed runs finished stays done
    assert not list((repo / "data/evaluate").glob(".sft.tmp-*"))
    assert "up to date" in stale(repo, "evaluate@sft")

    write_params(repo, original)
    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo)
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == [] and "is cached - skipping run, checking out outputs" in out
    assert (repo / "dvc.lock").read_text() == lock
    assert json.loads(dvc("status", "--json", cwd=repo).stdout) == {}


@pytest.mark.slow  # five stages; the killed-sft test above shows the run-cache restore in `make test`
def test_switching_profile_reruns_exactly_what_changed_and_switching_back_runs_nothing(built):
    """A profile extending `tiny` with other sft_extended and DPO settings: exactly those two are stale; the run
    re-runs them and what depends on them; `--profile tiny` then restores every output from DVC's run-cache."""
    repo = built
    (repo / "profiles/tiny_variant.yaml").write_text(yaml.safe_dump(
        {"extends": "tiny", "params": {"sft_extended": {"learning_rate": 0.0002}, "dpo": {"beta": 0.2}}}))
    lock = (repo / "dvc.lock").read_text()
    sh([sys.executable, "-m", "pipeline", "params", "--write", "--profile", "tiny_variant"], repo)
    assert sorted(json.loads(dvc("status", "--json", cwd=repo).stdout)) == ["dpo", "sft_extended"]
    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo)  # params.yaml as it now stands
    assert ran_stages(proc.stdout + proc.stderr) == sorted(["sft_extended", "dpo", "report", "evaluate@dpo",
                                                           "evaluate@sft_extended"])
    diff = json.loads(dvc("params", "diff", "--json", cwd=repo).stdout)["params.yaml"]
    assert (diff["dpo.beta"]["old"], diff["dpo.beta"]["new"]) == (0.1, 0.2)  # DVC records what ran

    proc = sh([sys.executable, "-m", "pipeline", "repro", "--profile", "tiny"], repo)
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == [], "switching back must restore from the run-cache, not execute"
    assert "is cached - skipping run, checking out outputs" in out
    assert (repo / "dvc.lock").read_text() == lock  # the same outputs, hash for hash
    assert json.loads(dvc("status", "--json", cwd=repo).stdout) == {}
    (repo / "profiles/tiny_variant.yaml").unlink()


def sft_param_changed(repo) -> None:
    """sft.learning_rate 0.003 -> 0.002: sft and sft_extended (which trains with sft's settings) declare the param;
    the rest becomes stale when models/sft changes."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["sft"]["learning_rate"] = 0.002
    write_params(repo, params)
    status = json.loads(dvc("status", "--json", cwd=repo).stdout)
    assert sorted(status) == ["sft", "sft_extended"]
    dry = dvc("repro", "--dry", cwd=repo)
    assert ran_stages(dry.stdout + dry.stderr) == ["sft", "sft_extended"]


def test_changing_an_sft_param_makes_exactly_sft_and_sft_extended_stale(repo):
    original = yaml.safe_load((repo / "params.yaml").read_text())
    sft_param_changed(repo)
    write_params(repo, original)
    assert json.loads(dvc("status", "--json", cwd=repo).stdout) == {}


@pytest.mark.slow  # re-runs 13 stages; the killed-sft test above re-runs sft and its evaluation in `make test`
def test_changing_an_sft_param_reruns_exactly_sft_and_dependents(built, monkeypatch):
    repo = built
    sft_param_changed(repo)
    base_lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["base"]
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == AFTER_SFT  # not synthesize, animate, base, teacher or distill
    assert yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["base"] == base_lock
    diff = json.loads(dvc("params", "diff", "--json", cwd=repo).stdout)
    changed = diff["params.yaml"]["sft.learning_rate"]
    assert (changed["old"], changed["new"]) == (0.003, 0.002)
    # the report's metrics diff against git HEAD (the tiny commit, which holds the copied project's metrics)
    monkeypatch.chdir(repo)
    assert "| metrics/sft.json | train_loss | " in diff_markdown()


def test_params_split_between_stages(repo):
    """distill.k re-samples (not the teacher); distill.logit_steps only matters to sft; rewards only to grpo."""
    original = yaml.safe_load((repo / "params.yaml").read_text())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["distill"]["logit_steps"] = 3
    write_params(repo, params)
    assert list(json.loads(dvc("status", "--json", cwd=repo).stdout)) == ["sft"]
    params["distill"]["k"] = 3
    params["rewards"]["weights"] = {"accuracy": 1.0, "overlong": 0.5}
    write_params(repo, params)
    assert sorted(json.loads(dvc("status", "--json", cwd=repo).stdout)) == ["distill", "grpo", "sft"]
    write_params(repo, original)
    assert json.loads(dvc("status", "--json", cwd=repo).stdout) == {}


def dpo_and_what_follows(repo: Path, before: str) -> list[str]:
    """dpo and its evaluation re-run; the report only where the evaluation's file changed (a tiny DPO step may leave
    every answer as it was: DVC then rightly finds the report's inputs unchanged)."""
    changed = (repo / "metrics/evaluate/dpo.json").read_text() != before
    return ["dpo", "evaluate@dpo"] + (["report"] if changed else [])


def test_changing_a_dpo_param_reruns_dpo_only(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["dpo"]["beta"] = 0.15  # not 0.2: the profile-switch test left that in the run-cache
    write_params(repo, params)
    before = (repo / "metrics/evaluate/dpo.json").read_text()
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == dpo_and_what_follows(repo, before)


def test_dvc_exp_run_with_a_changed_param(repo, monkeypatch):
    """`dvc exp run -S` runs an experiment and `dvc exp show` lists its metrics beside the baseline."""
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "dpo beta 0.15"], repo)
    before = (repo / "metrics/evaluate/dpo.json").read_text()
    proc = dvc("exp", "run", "-S", "dpo.learning_rate=0.0001", "-n", "dpo-lr", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == dpo_and_what_follows(repo, before)
    shown = json.dumps(json.loads(dvc("exp", "show", "--json", cwd=repo).stdout))  # normalised spacing
    assert '"dpo-lr"' in shown and '"learning_rate": 0.0001' in shown
    # the report's paired bootstrap against the commit: predictions at HEAD come from the DVC cache
    monkeypatch.chdir(repo)
    table = bootstrap_markdown("HEAD", ["sft", "dpo"])
    sft = next(line for line in table.splitlines() if line.startswith("| sft |"))
    assert re.search(r"\| \+0\.000 \| \[\+0\.000, \+0\.000\] \| \d+ \|$", sft), table  # sft did not re-run
    assert re.search(r"^\| dpo \| [01]\.\d{3} \| [01]\.\d{3} \| [+-]\d\.\d{3} \| \[", table, re.M), table


@pytest.mark.slow  # two queued experiments, each in a copy of the repository
def test_a_queued_two_point_sweep_is_listed_and_compared(built):
    """`dvc exp run --queue -S` twice, then one queue worker: both experiments run in the queue's temporary copies
    (nothing outside the repository needed), `dvc exp show` lists both, and `report` compares the two."""
    repo = built
    for beta in ("0.05", "0.3"):
        dvc("exp", "run", "--queue", "-S", f"dpo.beta={beta}", "-n", f"beta-{beta}", cwd=repo)
    dvc("queue", "start", "-j", "1", cwd=repo)
    deadline = time.monotonic() + 600
    while re.search(r"\b(Queued|Running)\b", dvc("queue", "status", cwd=repo).stdout):
        assert time.monotonic() < deadline, dvc("queue", "status", cwd=repo).stdout
        time.sleep(2)
    status = dvc("queue", "status", cwd=repo).stdout
    assert len(re.findall(r"\bSuccess\b", status)) == 2, status + dvc("queue", "logs", "beta-0.3", cwd=repo,
                                                                       check=False).stdout[-3000:]
    shown = json.dumps(json.loads(dvc("exp", "show", "--json", cwd=repo).stdout))
    assert '"beta-0.05"' in shown and '"beta-0.3"' in shown and '"beta": 0.3' in shown
    report = sh([sys.executable, "-m", "pipeline", "report", "--rev", "beta-0.05", "--rev", "beta-0.3"], repo).stdout
    assert re.search(r"^\| dpo \| [01]\.\d{3} \| [01]\.\d{3} \| [+-]\d\.\d{3} \| \[", report, re.M), report
    assert re.search(r"^\| sft \| .*\| \+0\.000 \| \[\+0\.000, \+0\.000\]", report, re.M), report  # same sft


def test_the_default_remote_beside_the_repository_carries_the_outputs_to_a_fresh_clone(repo, tmp_path):
    """.dvc/config's default remote is a folder beside the repository: commit, push there, clone, pull, and the clone
    has nothing to re-run."""
    remote = (repo / ".dvc" / dvc("config", "remote.local.url", cwd=repo).stdout.strip()).resolve()
    assert remote.parent == repo.parent  # beside the work tree, not in it
    remote.mkdir(exist_ok=True)  # what `make remote` does
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "the version to share", "--allow-empty"], repo)
    dvc("push", cwd=repo)
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    # The clone's relative url resolves beside the clone; point it at the folder pushed to, as a --local config would.
    dvc("remote", "modify", "--local", "local", "url", str(remote), cwd=clone)
    dvc("pull", cwd=clone)
    assert (clone / "models/sft/model.safetensors").exists() and (clone / "data/mine/rl.parquet").exists()
    assert ran_stages(dvc("repro", "--dry", cwd=clone).stdout) == []
