"""Training stages on 2 CPU processes (gloo) through `launch.num_processes`: `python -m stages.<name>` starts its
ranks with accelerate, streams them into its flow's log, and only rank 0 writes.

SFT on 2 processes x batch 4 trains on the same global batches as 1 process x batch 8 (the same seeded
order; no length grouping here), so its loss curve must match within float noise, under DDP and under the shipped
DeepSpeed configs (ZeRO-2 shards the optimizer state, ZeRO-3 the parameters too; DeepSpeed's CPU accelerator);
DPO and GRPO run a few steps.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.core import io, paths
from tests.conftest import TINY_PARAMS, venv_env, write_params

pytestmark = pytest.mark.e2e


def params(**sections) -> dict:
    out = copy.deepcopy(TINY_PARAMS)
    out["sft"]["group_by_length"] = False
    for name, values in sections.items():
        out[name] = {**out.get(name, {}), **values}
    return out


def stage(name: str, folder: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=folder, env=venv_env(**env),
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def losses(folder: Path, stage_name: str) -> list[float]:
    """The logged training loss curve (dvclive's tsv)."""
    with open(folder / paths.live_dir(stage_name) / "plots/metrics/loss.tsv") as fh:
        return [float(row["loss"]) for row in csv.DictReader(fh, delimiter="\t")]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prefect_api):
    """The tiny project with the stages up to mine built on one process; a copy of sft's one-process outputs."""
    from stages import base, mine, sft, synthesize
    from tests.conftest import copy_project

    folder = copy_project(tmp_path_factory.mktemp("launch"))
    write_params(folder, params())
    cwd = os.getcwd()
    os.chdir(folder)
    try:  # in this process, as tests/stages/test_stages.py runs them: no stage process start-up to pay
        for module in (synthesize, base, sft):
            module.main()
        reference = {"losses": losses(folder, "sft"), "metrics": json.loads(Path("metrics/sft.json").read_text())}
        mine.main()
    finally:
        os.chdir(cwd)
    return folder, reference


def stand_ins() -> list[str]:
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"{io.STAND_IN}*"))


def launch_section(config: str | None) -> dict:
    """2 processes, under a shipped accelerate config (DeepSpeed's when it is installed, as the dev extra does)."""
    if config is None:
        return {"num_processes": 2}
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="the dev extra installs it")
    return {"num_processes": 2, "config_file": f"configs/accelerate/{config}"}


@pytest.mark.parametrize("config, distributed", [
    (None, "MULTI_CPU"),
    ("deepspeed_zero3.yaml", "DEEPSPEED zero-3"),
    pytest.param("deepspeed_zero2.yaml", "DEEPSPEED zero-2", marks=pytest.mark.slow),
])
def test_sft_on_two_processes_follows_the_one_process_curve_at_twice_the_batch(workspace, config, distributed):
    folder, reference = workspace
    left = stand_ins()
    write_params(folder, params(sft={"per_device_train_batch_size": 4}, launch=launch_section(config)))
    proc = stage("sft", folder)
    out = proc.stdout + proc.stderr
    assert "launching 2 processes" in out and "[sft rank 1]" in out  # both ranks' lines reach the flow's log
    metrics = json.loads((folder / "metrics/sft.json").read_text())
    assert metrics["world_size"] == 2 and reference["metrics"]["world_size"] == 1
    assert metrics["distributed"] == distributed and "distributed" not in reference["metrics"]
    # the ranking drill's own loop ran after the trainer (under ZeRO-3: on the weights made whole again)
    assert metrics["rank_drill"]["steps"] == reference["metrics"]["rank_drill"]["steps"] > 0
    assert metrics["steps"] == reference["metrics"]["steps"]
    # TRL averages the loss over the tokens of both ranks: the same objective as the one-process batch of 8
    assert losses(folder, "sft") == pytest.approx(reference["losses"], rel=1e-4)
    assert metrics["eval_loss"] == pytest.approx(reference["metrics"]["eval_loss"], rel=2e-3)
    # written once, by rank 0: one model, no temporary folder beside it, rank 1's stand-ins removed
    assert (folder / "models/sft/model.safetensors").exists()
    assert [p.name for p in (folder / "models").iterdir() if p.name.startswith(".")] == []
    assert stand_ins() == left


@pytest.mark.slow  # two launched stages (`make test-slow`); the SFT and failing-rank tests stay in `make test`
@pytest.mark.parametrize("config", [None, "deepspeed_zero3.yaml"])
def test_dpo_and_grpo_run_a_few_steps_on_two_processes(workspace, config):
    from pipeline.core.io import read_rows, write_rows
    from pipeline.data.distill import PAIR_SCHEMA

    folder, _ = workspace
    gold = read_rows(folder / paths.split_file("train"))[:8]
    write_rows(folder / paths.split_file("pairs", "mine"), [  # gold against a wrong final answer
        {"id": g["id"], "prompt": g["prompt"], "chosen": g["rationale"], "source": "policy",
         "rejected": g["rationale"].rsplit("Answer:", 1)[0] + "Answer: 12345"} for g in gold], schema=PAIR_SCHEMA)
    write_params(folder, params(dpo={"per_device_train_batch_size": 2}, launch=launch_section(config)))
    stage("dpo", folder)
    dpo = json.loads((folder / "metrics/dpo.json").read_text())
    assert dpo["world_size"] == 2 and dpo["steps"] == 2 and dpo["weights_changed"] == 1.0  # 8 pairs / (2 x 2)

    stage("grpo", folder)
    grpo = json.loads((folder / "metrics/grpo.json").read_text())
    p = TINY_PARAMS["grpo"]
    per_rank = p["prompts_per_step"] * p["num_generations"]
    assert grpo["world_size"] == 2 and grpo["steps"] == p["max_steps"] and grpo["weights_changed"] == 1.0
    assert grpo["distributed"] == dpo["distributed"] == ("MULTI_CPU" if config is None else "DEEPSPEED zero-3")
    # under ZeRO-3 the rollouts decode on the parameters gathered whole (sharding.generating)
    assert grpo["rollouts"] == p["max_steps"] * per_rank * 2
    # guided replay judged whole groups on each rank; the counts are summed over both
    assert grpo["guided_replay"]["groups"] == grpo["rollouts"] // p["num_generations"]


@pytest.mark.slow  # one more launched sft (`make test-slow`)
def test_lora_under_zero3_trains_the_adapter_alone_and_saves_it_merged(workspace):
    folder, _ = workspace
    write_params(folder, params(sft={"per_device_train_batch_size": 4}, lora={"sft": True, "r": 4},
                                launch=launch_section("deepspeed_zero3.yaml")))
    stage("sft", folder)
    metrics = json.loads((folder / "metrics/sft.json").read_text())
    assert metrics["distributed"] == "DEEPSPEED zero-3"
    # counted on the weights made whole again: the base's and the adapter's
    assert 0 < metrics["lora"]["trainable_parameters"] < metrics["lora"]["parameters"]
    assert 0 < metrics["weights_changed"] < 1  # the adapter's tensors moved, the base's did not
    assert (folder / "models/sft/model.safetensors").exists()  # lora.save: merged, an ordinary model
    assert not (folder / "models/sft/adapter_config.json").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # two more stage processes (`make test-slow`)
def test_two_machines_on_loopback_train_as_one_run_and_only_machine_0_writes(workspace, tmp_path):
    """Multi-node as documented: every machine runs the stage with its own `launch.machine_rank`; here machine 1
    is a copy of the project beside it, both on 127.0.0.1, one process each."""
    folder, reference = workspace
    other = tmp_path / "machine1"
    shutil.copytree(folder, other, symlinks=True)
    port = free_port()
    for rank, where in enumerate((folder, other)):
        write_params(where, params(sft={"per_device_train_batch_size": 4}, launch={
            "num_processes": 2, "num_machines": 2, "machine_rank": rank, "main_process_ip": "127.0.0.1",
            "main_process_port": port}))
    untouched = {name: (other / name).read_bytes() for name in ("models/sft/model.safetensors", "metrics/sft.json")}
    procs = [subprocess.Popen([sys.executable, "-m", "stages.sft"], cwd=where, env=venv_env(OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for where in (folder, other)]
    outs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(out[-3000:] for out in outs)
    assert "launching 2 processes on 2 machine(s)" in outs[0] and "--machine_rank 1" in outs[1]
    metrics = json.loads((folder / "metrics/sft.json").read_text())
    assert metrics["world_size"] == 2 and metrics["distributed"] == "MULTI_CPU"
    assert losses(folder, "sft") == pytest.approx(reference["losses"], rel=1e-4)  # one run over both machines
    # machine 1's ranks wrote nothing: its outputs are the ones it had
    assert {name: (other / name).read_bytes() for name in untouched} == untouched


def test_a_rank_that_fails_fails_the_stage_and_the_old_output_stands(workspace):
    folder, _ = workspace
    write_params(folder, params(launch={"num_processes": 2}))
    before = (folder / "models/sft/model.safetensors").read_bytes()
    proc = stage("sft", folder, check=False, PIPELINE_FAULT="nan@step:2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "a rank failed" in proc.stderr and "step 2" in proc.stderr
    assert (folder / "models/sft/model.safetensors").read_bytes() == before


def test_more_processes_than_cores_fail_before_any_training(workspace):
    folder, _ = workspace
    cores = os.cpu_count()
    write_params(folder, params(launch={"num_processes": cores + 1}))
    proc = stage("sft", folder, check=False, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2
    assert f"launch.num_processes: {cores + 1}" in proc.stderr and f"{cores} CPU core(s)" in proc.stderr
    assert "launching" not in proc.stdout + proc.stderr
