"""The `launch` section (pipeline/orchestration/launch.py): which stages launch, the accelerate command, what this
machine refuses before any work, the shipped accelerate configs, and rank 0 as the only writer
(pipeline/core/io.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from pipeline.core import io
from pipeline.core.io import ConfigError
from pipeline.modeling.params import LoraConfig
from pipeline.orchestration import launch
from pipeline.orchestration.params import LaunchConfig

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"ddp.yaml": "MULTI_GPU", "fsdp.yaml": "FSDP", "deepspeed_zero2.yaml": "DEEPSPEED",
           "deepspeed_zero3.yaml": "DEEPSPEED"}


def test_only_training_stages_launch_and_only_when_asked():
    assert launch.plan_for("sft", LaunchConfig()) is None  # the default: one process, no launcher
    two = LaunchConfig(num_processes=2)
    assert launch.plan_for("evaluate@sft", two) is None and launch.plan_for("mine", two) is None
    plan = launch.plan_for("sft", two)
    assert (plan.stage, plan.num_processes, plan.config_file, plan.section) == ("sft", 2, None, "launch")
    own = LaunchConfig(stages={"grpo": {"num_processes": 4, "config_file": "configs/accelerate/ddp.yaml"}})
    assert launch.plan_for("sft", own) is None
    grpo = launch.plan_for("grpo", own)
    assert (grpo.num_processes, grpo.config_file, grpo.section) == (4, "configs/accelerate/ddp.yaml",
                                                                    "launch.stages.grpo")
    # an accelerate config alone (FSDP on one GPU, say) goes through the launcher too
    assert launch.plan_for("dpo", LaunchConfig(config_file="configs/accelerate/fsdp.yaml")).num_processes == 1


def test_multi_node_settings_are_checked():
    with pytest.raises(ValidationError, match="machine_rank"):
        LaunchConfig(num_machines=2, machine_rank=2, main_process_ip="10.0.0.1", main_process_port=29500)
    with pytest.raises(ValidationError, match="main_process_ip"):
        LaunchConfig(num_machines=2, num_processes=16)
    with pytest.raises(ValidationError, match="stages"):
        LaunchConfig(stages={"evaluate": {"num_processes": 2}})  # not a training stage
    plan = launch.plan_for("prm", LaunchConfig(num_processes=16, num_machines=2, machine_rank=1,
                                               main_process_ip="10.0.0.1", main_process_port=29500))
    assert plan.per_machine == 8
    cmd = launch.command(plan, "stages.prm", [])
    for flag, value in (("--num_processes", "16"), ("--num_machines", "2"), ("--machine_rank", "1"),
                        ("--main_process_ip", "10.0.0.1"), ("--main_process_port", "29500")):
        assert cmd[cmd.index(flag) + 1] == value, flag


def test_the_command_runs_the_stage_module_under_accelerate():
    ddp = launch.command(launch.plan_for("sft", LaunchConfig(num_processes=2)), "stages.sft", [])
    assert ddp[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in ddp  # torchrun; gloo on a CPU
    assert ddp[-2:] == ["-m", "stages.sft"]
    fsdp = launch.command(launch.plan_for("sft", LaunchConfig(num_processes=8,
                                                               config_file="configs/accelerate/fsdp.yaml")),
                          "stages.sft", ["--flag"])
    assert fsdp[fsdp.index("--config_file") + 1] == "configs/accelerate/fsdp.yaml" and "--multi_gpu" not in fsdp
    assert fsdp[-3:] == ["-m", "stages.sft", "--flag"]
    # the stages train in float32 on CPUs, whatever a shipped config's bf16 says; with CUDA the trainer decides
    if torch.cuda.is_available():
        assert "--mixed_precision" not in fsdp
    else:
        assert fsdp[fsdp.index("--mixed_precision") + 1] == "no"


def test_ranks_share_the_cores_unless_the_user_set_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    plan = launch.plan_for("sft", LaunchConfig(num_processes=2))
    env = launch.environment(plan)
    assert env["OMP_NUM_THREADS"] == "4" and env[launch.RANK_ENV] == "sft"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert launch.environment(plan)["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_accelerate_configs_parse_as_accelerate_reads_them(name):
    config = launch.read_config_file(ROOT / "configs/accelerate" / name)
    assert str(config["distributed_type"]).split(".")[-1] == SHIPPED[name]
    assert config["compute_environment"].endswith("LOCAL_MACHINE") and config["mixed_precision"] == "bf16"
    if name == "fsdp.yaml":
        assert config["fsdp_config"]["fsdp_version"] == 2
        assert config["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # rank 0 saves whole weights
    if name.startswith("deepspeed"):
        assert config["deepspeed_config"]["zero_stage"] == int(name[-6])


def test_what_this_machine_cannot_run_fails_saying_what_was_found(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the shipped configs' paths
    cuda = torch.cuda.is_available()
    found = torch.cuda.device_count() if cuda else os.cpu_count()
    too_many = launch.plan_for("sft", LaunchConfig(num_processes=found + 1))
    with pytest.raises(ConfigError, match=rf"launch.num_processes: {found + 1} .* has {found} "
                                          rf"{'CUDA device' if cuda else 'CPU core'}"):
        launch.check(too_many)
    missing = launch.plan_for("grpo", LaunchConfig(stages={"grpo": {"config_file": "configs/accelerate/nope.yaml"}}))
    with pytest.raises(ConfigError, match=r"launch.stages.grpo.config_file: configs/accelerate/nope.yaml: no such "
                                          r"file \(shipped: configs/accelerate/ddp.yaml"):
        launch.check(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: MULTI_GPU\nno_such_setting: 1\n")
    with pytest.raises(ConfigError, match="not an accelerate config"):
        launch.check(launch.plan_for("sft", LaunchConfig(config_file=str(bad))))
    zero3 = launch.plan_for("sft", LaunchConfig(num_processes=2, config_file="configs/accelerate/deepspeed_zero3.yaml"))
    real_find_spec = importlib.util.find_spec
    with monkeypatch.context() as m:  # a machine without DeepSpeed
        m.setattr(importlib.util, "find_spec",
                  lambda name, *a: None if name == "deepspeed" else real_find_spec(name, *a))
        with pytest.raises(ConfigError, match=r"launch.config_file: configs/accelerate/deepspeed_zero3.yaml asks for "
                                              r"DeepSpeed, which is not installed \(pip install -e '.\[deepspeed\]'\)"):
            launch.check(zero3)
    if found >= 2 and real_find_spec("deepspeed") is not None:
        launch.check(zero3)  # ZeRO-3 runs, on CPUs too (gloo)
    if not cuda:
        fsdp = launch.plan_for("sft", LaunchConfig(config_file="configs/accelerate/fsdp.yaml"))
        with pytest.raises(ConfigError, match="asks for FSDP, which accelerate runs on CUDA devices only; this "
                                              "machine has none"):
            launch.check(fsdp, LoraConfig())
    if found >= 2:
        launch.check(launch.plan_for("sft", LaunchConfig(num_processes=2)))  # what there is: runs


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_rank_other_than_0_writes_only_inside_its_stand_in_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv(io.LAUNCHED, raising=False)
    assert io.rank() == 0  # a RANK that a cluster exports to every process is not the pipeline's launch
    monkeypatch.setenv(io.LAUNCHED, "sft")
    io.write_json(tmp_path / "metrics.json", {"a": 1})
    io.write_rows(tmp_path / "rows.parquet", [{"a": 1}])
    with io.atomic_dir(tmp_path / "out") as folder:
        assert not folder.is_relative_to(tmp_path)  # outside the project
        io.write_json(folder / "inside.json", {"a": 1})
        assert json.loads((folder / "inside.json").read_text()) == {"a": 1}  # it may read back what it wrote
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and not folder.exists()
    # a killed rank's stand-in (its PID gone) is removed by the next rank that makes one; a live one's stays
    dead = _dead_pid()
    left = Path(tempfile.mkdtemp(prefix=f"{io.STAND_IN}{dead}-rank1-sft-"))
    alive = Path(tempfile.mkdtemp(prefix=f"{io.STAND_IN}{os.getpid()}-rank1-other-"))
    with io.atomic_dir(tmp_path / "out") as folder:
        assert not left.exists() and alive.exists()
    shutil.rmtree(alive)
    monkeypatch.setenv("RANK", "0")
    io.write_json(tmp_path / "metrics.json", {"a": 1})
    with io.atomic_dir(tmp_path / "out") as folder:
        io.write_json(folder / "inside.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "out"]


def test_fsdp_settings_the_stages_cannot_run_are_refused_by_name(tmp_path, monkeypatch):
    """Checked before the device count, so on any machine: FSDP 1, rank-0-only loading, LoRA on a sharded stage."""
    monkeypatch.chdir(ROOT)
    shipped = yaml.safe_load((ROOT / "configs/accelerate/fsdp.yaml").read_text())

    def plan_with(stage: str, **fsdp) -> launch.Plan:
        path = tmp_path / f"{stage}-{len(fsdp)}.yaml"
        path.write_text(yaml.safe_dump({**shipped, "fsdp_config": {**shipped["fsdp_config"], **fsdp}}))
        return launch.plan_for(stage, LaunchConfig(config_file=str(path)))

    with pytest.raises(ConfigError, match=r"fsdp_config.fsdp_version is 1; .*set fsdp_version: 2"):
        launch.check(plan_with("sft", fsdp_version=1), LoraConfig())
    with pytest.raises(ConfigError, match=r"fsdp_cpu_ram_efficient_loading is true.*set it to false"):
        launch.check(plan_with("grpo", fsdp_cpu_ram_efficient_loading=True), LoraConfig())
    with pytest.raises(ConfigError, match=r"shards the parameters, and lora.dpo is on"):
        launch.check(plan_with("dpo"), LoraConfig(dpo=True))
    if not torch.cuda.is_available():  # LoRA on another stage is no obstacle: the device is the next check
        with pytest.raises(ConfigError, match="accelerate runs on CUDA devices only"):
            launch.check(plan_with("sft"), LoraConfig(dpo=True))


# torch elastic's failure summary, as the launcher prints it when a rank dies without a word of its own
SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
stages.sft FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_12:38:05
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5482)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5482
============================================================"""


def test_a_rank_killed_without_a_word_is_named_with_its_signal(monkeypatch):
    """The stage's last line says which rank died and how, not only that the launcher exited 1."""
    import logging

    plan = launch.plan_for("sft", LaunchConfig(num_processes=2))
    monkeypatch.setattr(launch, "command", lambda *a: [
        sys.executable, "-c", f"import sys; print({SUMMARY!r}); sys.exit(1)"])
    with pytest.raises(launch.StageFailed, match=r"^sft: a rank failed: rank 1 killed by SIGKILL \(its output"):
        launch.run_ranks(plan, log=logging.getLogger("test"))
    monkeypatch.setattr(launch, "command", lambda *a: [sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(launch.StageFailed, match=r"^sft: a rank failed: the launcher exited 3"):
        launch.run_ranks(plan, log=logging.getLogger("test"))


def test_a_rank_stops_when_its_launcher_is_killed(tmp_path):
    """Torch elastic starts a rank in a session of its own, out of reach of a SIGKILL to the run's process group:
    the rank watches its launcher and goes with it."""
    from pipeline.core.processes import running

    ready = tmp_path / "watching"
    rank_code = ("from pipeline.orchestration.launch import watch_launcher; watch_launcher(0.1); import pathlib, time; "
                 f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {rank_code!r}], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child = int(launcher.stdout.readline())
    deadline = time.monotonic() + 60
    # the rank has imported pipeline.orchestration.launch: watching
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(child) and ready.exists()
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(child)
