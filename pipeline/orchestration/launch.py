"""Training stages on several processes, GPUs or machines through accelerate's launcher (the `launch` section).

    launch: {num_processes: 2}                                    # every training stage: DDP (gloo on a CPU)
    launch: {num_processes: 8, config_file: configs/accelerate/fsdp.yaml}
    launch: {stages: {grpo: {num_processes: 4}}}                  # one stage only

`python -m stages.<name>` stays the stage process and its Prefect flow (DVC's `cmd` does not change). With a
plan (`plan_for`), the flow runs `accelerate launch ... -m stages.<name>` as its one task, streams the ranks'
output into its log and fails when any rank fails. Each rank runs the stage's code without a flow
(`in_rank`); TRL's trainers shard the batches and average the gradients; only global rank 0 writes
outputs, metrics and manifests (`pipeline.core.io`). Everything before and after training (reading rows, sampling
for GRPO's success rate) runs on every rank alike. The table drills are plain loops: each rank runs its own
copy, and rank 0's is saved. Under FSDP (`configs/accelerate/fsdp.yaml`) each rank holds a shard of every
parameter: `pipeline.core.sharding` gathers the weights to save them and keeps the ranks' decoding in step. Under
DeepSpeed ZeRO-3 (`configs/accelerate/deepspeed_zero3.yaml`) the parameters are partitioned while a trainer runs,
gathered for GRPO's rollouts, and whole again on every rank after it. DeepSpeed runs on CPUs too (gloo), which is
how its configs are tested here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.io import LAUNCHED, ConfigError, InputError, StageFailed
from pipeline.core.registry import LORA_STAGES, TRAINING_STAGES
from pipeline.modeling.params import LoraConfig
from pipeline.orchestration.params import LaunchConfig
from pipeline.orchestration.sections import read_section

CONFIG_DIR = Path("configs/accelerate")
# Set in each rank's environment: the stage name. A rank runs its stage's code without a Prefect flow.
RANK_ENV = LAUNCHED
# The running launcher, stopped with the stage on SIGTERM (pipeline.orchestration.flows).
_running: list[subprocess.Popen] = []


@dataclass(frozen=True)
class Plan:
    """How one stage's ranks start: `accelerate launch` with these settings."""

    stage: str
    num_processes: int
    config_file: str | None
    num_machines: int
    machine_rank: int
    main_process_ip: str | None
    main_process_port: int | None
    section: str = "launch"  # where its settings come from, for messages: launch or launch.stages.<stage>

    @property
    def per_machine(self) -> int:
        return -(-self.num_processes // self.num_machines)


def in_rank() -> bool:
    """Is this process a rank that `accelerate launch` started for a stage?"""
    return bool(os.environ.get(RANK_ENV))


def plan_for(stage: str, cfg: LaunchConfig | None = None) -> Plan | None:
    """The launch of `stage` (a DVC stage name), or None when it runs in this one process: a stage that does not
    train, or one process on one machine without an accelerate config."""
    name = stage.split("@")[0]
    if name not in TRAINING_STAGES:
        return None
    cfg = cfg or read_section("launch")  # type: ignore[assignment]
    own = cfg.stages.get(name)
    processes = (own.num_processes if own and own.num_processes else None) or cfg.num_processes
    config_file = (own.config_file if own and own.config_file else None) or cfg.config_file
    if processes == 1 and cfg.num_machines == 1 and config_file is None:
        return None
    return Plan(name, processes, config_file, cfg.num_machines, cfg.machine_rank, cfg.main_process_ip,
                cfg.main_process_port, f"launch.stages.{name}" if own else "launch")


def read_config_file(path: str | Path, key: str = "launch.config_file") -> dict:
    """The accelerate config `path` as accelerate reads it (ConfigError naming the key and file when it cannot)."""
    from accelerate.commands.config.config_args import load_config_from_file

    if not Path(path).is_file():
        shipped = ", ".join(str(p) for p in sorted(CONFIG_DIR.glob("*.yaml"))) or "none here"
        raise ConfigError(f"{key}: {path}: no such file (shipped: {shipped})")
    try:
        return load_config_from_file(str(path)).to_dict()
    except Exception as exc:  # accelerate raises TypeError for unknown keys, yaml errors for bad syntax
        raise ConfigError(f"{key}: {path}: not an accelerate config: {exc}") from exc


def check(plan: Plan, lora: LoraConfig | None = None) -> None:
    """Fail before any work when this machine cannot run the plan, saying what was found (by the stage, and by
    `python -m pipeline repro` for every training stage before DVC starts). `lora`: the `lora` section (the
    active one by default)."""
    import torch

    config_key = f"{plan.section}.config_file"
    config = read_config_file(plan.config_file, config_key) if plan.config_file is not None else {}
    kind = str(config.get("distributed_type", "MULTI_GPU")).split(".")[-1]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    processes = f"{plan.section}.num_processes"
    if kind == "FSDP":
        check_fsdp(plan, config, gpus, lora if lora is not None else read_section("lora"))
    if kind == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"{config_key}: {plan.config_file} asks for DeepSpeed, which is not installed "
                          "(pip install -e '.[deepspeed]')")
    if gpus and plan.per_machine > gpus:
        raise ConfigError(f"{processes}: {plan.num_processes} over {plan.num_machines} machine(s) is "
                          f"{plan.per_machine} a machine; this one has {gpus} CUDA device(s)")
    cores = os.cpu_count() or 1
    if not gpus and plan.per_machine > cores:
        raise ConfigError(f"{processes}: {plan.num_processes} over {plan.num_machines} machine(s) is "
                          f"{plan.per_machine} a machine; this one has {cores} CPU core(s) and no CUDA device")


def check_fsdp(plan: Plan, config: dict, gpus: int, lora: LoraConfig) -> None:
    """FSDP as the stages run it (`pipeline.core.sharding`): version 2 (DTensor parameters), every rank loading the
    whole model, no LoRA, CUDA."""
    key = f"{plan.section}.config_file"
    fsdp = config.get("fsdp_config") or {}
    if int(fsdp.get("fsdp_version", 1)) != 2:
        raise ConfigError(f"{key}: {plan.config_file}: fsdp_config.fsdp_version is {fsdp.get('fsdp_version', 1)}; "
                          "the stages gather and save FSDP 2's sharded parameters only (set fsdp_version: 2)")
    if str(fsdp.get("fsdp_cpu_ram_efficient_loading", False)).lower() == "true":
        raise ConfigError(f"{key}: {plan.config_file}: fsdp_config.fsdp_cpu_ram_efficient_loading is true, which "
                          "loads the weights on rank 0 only; every rank runs the stage's work before training "
                          "(sampling GRPO's success rate, say) on the whole model (set it to false)")
    if plan.stage in LORA_STAGES and lora.on(plan.stage):
        raise ConfigError(f"{key}: {plan.config_file} shards the parameters, and lora.{plan.stage} is on: an "
                          "adapter is not yet merged or saved from sharded weights (use DDP for LoRA)")
    if not gpus:
        raise ConfigError(f"{key}: {plan.config_file} asks for FSDP, which accelerate runs on CUDA devices only; "
                          "this machine has none (DDP without a config file runs on CPUs)")


def command(plan: Plan, module: str, argv: list[str]) -> list[str]:
    """`accelerate launch` for `python -m <module> <argv>` on the plan's processes."""
    import torch

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(plan.num_processes),
           "--num_machines", str(plan.num_machines), "--machine_rank", str(plan.machine_rank)]
    if plan.main_process_ip is not None:
        cmd += ["--main_process_ip", plan.main_process_ip]
    if plan.main_process_port is not None:
        cmd += ["--main_process_port", str(plan.main_process_port)]
    if plan.config_file is not None:
        cmd += ["--config_file", plan.config_file]
    else:  # DDP through torchrun: on a machine without CUDA, accelerate makes it MULTI_CPU over gloo
        cmd += ["--multi_gpu"]
    if plan.config_file is None or not torch.cuda.is_available():
        # the stages train in float32 on CPUs (pipeline.training.trainer.device_kwargs), whatever a shipped config says;
        # with CUDA the trainer's own bf16 setting decides
        cmd += ["--mixed_precision", "no"]
    return [*cmd, "--dynamo_backend", "no", "-m", module, *argv]


def environment(plan: Plan) -> dict[str, str]:
    """The ranks' environment: marked as ranks of the stage, and each given its share of the cores (unless the
    user set OMP_NUM_THREADS), so 2 ranks on 2 cores do not each start 2 threads."""
    env = {**os.environ, RANK_ENV: plan.stage, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.per_machine)))
    return env


def run_ranks(plan: Plan, log=None) -> None:
    """Start the ranks of this stage process's own module and wait; every line they print goes to `log` (the
    stage's own logger by default: inside a flow run, its log).

    A failed rank fails the launcher: bad input in a rank (its exit code 2) raises InputError, anything else
    StageFailed, each with the rank's last error line."""
    if log is None:
        from pipeline.core.phases import stage_logger

        log = stage_logger()
    module = sys.modules["__main__"].__spec__.name  # stages.<name>, as DVC's cmd ran it
    cmd = command(plan, module, sys.argv[1:])
    log.info("launching %d processes on %d machine(s): %s", plan.num_processes, plan.num_machines, " ".join(cmd[1:]))
    proc = subprocess.Popen(cmd, env=environment(plan), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    _running.append(proc)
    errors, codes, ranks = [], [], []
    try:
        for line in proc.stdout:
            line = line.rstrip().rsplit("\r", 1)[-1].strip()  # a progress bar's last state
            if not line:
                continue
            log.info("%s", line)
            if line.startswith("error: "):
                errors.append(line[len("error: "):])
            codes += re.findall(r"exitcode\s*:\s*(-?\d+)", line)
            ranks += re.findall(r"^rank\s*:\s*(\d+)", line)  # torch elastic's failure summary: rank, then exitcode
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted while the ranks run: they stop with the stage
            stop()
        _running.remove(proc)
    if rc == 0:
        return
    reason = errors[-1] if errors else _failed_ranks(ranks, codes) or \
        f"the launcher exited {rc} (its output is in the log above)"
    if "2" in codes:
        raise InputError(reason)
    raise StageFailed(f"{plan.stage}: a rank failed: {reason}")


def watch_launcher(every: float = 1.0) -> None:
    """Stop this rank (SIGKILL) once its launcher is gone. Torch elastic starts each rank in a session of its own,
    so a SIGKILL to the run's process group (a scheduler ending the job) kills the launcher but not the ranks,
    which would train on, orphaned, until a collective fails. A thread notices the new parent within `every` s."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _failed_ranks(ranks: list[str], codes: list[str]) -> str:
    """'rank 1 killed by SIGKILL' from torch elastic's failure summary (a rank that printed no error of its own);
    '' when the summary is not there."""
    said = []
    for each, code in zip(ranks, codes):
        code = int(code)
        try:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        except ValueError:
            how = f"exited {code}"
        said.append(f"rank {each} {how}")
    return "; ".join(said) + (" (its output is in the log above)" if said else "")


def stop() -> None:
    """SIGTERM to the running launcher and every rank under it, SIGKILL to those left after 10 s: the stage is
    stopping."""
    from pipeline.core.processes import stop_tree

    for proc in list(_running):
        if proc.poll() is None:
            stop_tree(proc.pid)
