"""The vLLM server that the grpo stage starts itself: `grpo.use_vllm` with `vllm_mode: server` and no
`vllm_server_base_url`.

TRL's server mode samples GRPO's rollouts on a separate vLLM server and pushes the policy's weights into it
(NCCL) before each step, so the server needs GPUs of its own. The stage process (not a training rank) starts
`vllm serve` as `trl vllm-serve` builds it (TRL's `build_command`, with its dev mode on, which the weight
transfer needs) on the last `grpo.vllm_server_gpus` visible GPUs, serving models/sft on a free loopback port;
the training (one process, or the ranks of `launch`) keeps the first GPUs. The stage waits until `/health`
answers, hands the URL to the trainer through URL_ENV (launched ranks inherit it), streams the server's lines
into its output (stderr: it starts before Prefect loads), and stops the server with the stage: when it ends,
fails or is stopped (pipeline.orchestration.flows).
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.io import ConfigError, InputError, StageFailed
from pipeline.core.params import PARAMS_FILE

if TYPE_CHECKING:  # the sections it serves: GRPO's (the rl room, above) and how models load
    from pipeline.modeling.params import ModelLoadConfig
    from pipeline.rl.params import GRPOStageConfig

URL_ENV = "PIPELINE_VLLM_SERVER_URL"  # the started server's URL, for the trainer (grpo_args) and the ranks
HOST = "127.0.0.1"
_running: list[subprocess.Popen] = []  # stopped on SIGTERM with the stage (pipeline.orchestration.flows)


def starts_server(cfg: GRPOStageConfig) -> bool:
    """Is the server the stage's to start?"""
    return cfg.use_vllm and cfg.vllm_mode == "server" and not cfg.vllm_server_base_url


def split_gpus(cfg: GRPOStageConfig, training: int, visible: list[str], path: Path | str = PARAMS_FILE
               ) -> tuple[list[str], list[str]]:
    """(training GPUs, server GPUs) of the `visible` ones: the server takes the last `vllm_server_gpus`, training
    needs `training` (its processes) before them; fails naming the keys when there are too few."""
    need = training + cfg.vllm_server_gpus
    if len(visible) < need:
        raise ConfigError(f"{path}: grpo.vllm_mode: server without grpo.vllm_server_base_url starts a vLLM server on "
                          f"grpo.vllm_server_gpus={cfg.vllm_server_gpus} GPU(s) of its own beside {training} training "
                          f"process(es) (launch.num_processes): {need} GPUs, and {len(visible)} are visible; give a "
                          "running server's URL, or use vllm_mode: colocate")
    return visible[:training], visible[len(visible) - cfg.vllm_server_gpus:]


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them (or their indices)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [n.strip() for n in names.split(",") if n.strip()] if names else [str(i) for i in range(count)]
    return listed[:count]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def serve_command(model_dir: Path | str, port: int, cfg: GRPOStageConfig, model: ModelLoadConfig) -> list[str]:
    """`vllm serve` for `model_dir` as `trl vllm-serve` runs it, tensor-parallel over the server's GPUs."""
    if (Path(model_dir) / "adapter_config.json").is_file():
        raise InputError(f"{model_dir}: a LoRA adapter folder; a vLLM server loads whole models: save it merged "
                         "(lora.save: merged) or give grpo.vllm_server_base_url")
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    return build_command(ScriptArguments(
        model=str(model_dir), host=HOST, port=port, tensor_parallel_size=cfg.vllm_server_gpus,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, dtype=model.dtype,
        trust_remote_code=model.trust_remote_code))


@contextmanager
def running(command: list[str], port: int, env: dict[str, str], timeout: float, say=None) -> Iterator[str]:
    """Runs `command` (a server on HOST:`port`) until the block ends, its lines passed to `say` (printed to
    stderr by default: the stage starts it before Prefect loads); yields its URL once
    `/health` answers 200. Fails with StageFailed, with its last lines, when it exits first or `timeout`
    seconds pass."""
    from pipeline.core.processes import stop_tree

    say = say or _say
    url = f"http://{HOST}:{port}"
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    _running.append(proc)
    tail: collections.deque[str] = collections.deque(maxlen=20)

    def relay() -> None:
        for line in proc.stdout:
            if line := line.rstrip():
                tail.append(line)
                say(f"[vllm server] {line}")

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(url):
            if proc.poll() is not None:
                reader.join(timeout=5)
                raise StageFailed(f"the vLLM server ({' '.join(command[:6])} ...) exited with {proc.returncode} "
                                  "before it answered: " + " | ".join(tail))
            if time.monotonic() > deadline:
                raise StageFailed(f"the vLLM server did not answer {url}/health within {timeout:.0f} s "
                                  "(grpo.vllm_server_timeout); its last lines: " + " | ".join(tail))
            time.sleep(0.5)
        say(f"vLLM server ready at {url}")
        yield url
    finally:
        stop_tree(proc.pid)
        proc.wait()
        _running.remove(proc)
        reader.join(timeout=5)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def for_stage(cfg: GRPOStageConfig, model: ModelLoadConfig, model_dir: Path, training: int) -> Iterator[None]:
    """In the grpo stage process: the server started, its URL in URL_ENV, for the block; nothing to do when
    the server is not the stage's to start."""
    if not starts_server(cfg):
        yield
        return
    _, server_gpus = split_gpus(cfg, training, visible_gpus())
    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(server_gpus), "VLLM_SERVER_DEV_MODE": "1"}
    _say(f"starting a vLLM server for {model_dir} on GPU(s) {','.join(server_gpus)}")
    with running(serve_command(model_dir, port, cfg, model), port, env, cfg.vllm_server_timeout) as url:
        os.environ[URL_ENV] = url
        try:
            yield
        finally:
            os.environ.pop(URL_ENV, None)


def stop() -> None:
    """SIGTERM to a running server and every process under it: the stage is stopping."""
    from pipeline.core.processes import stop_tree

    for proc in list(_running):
        if proc.poll() is None:
            stop_tree(proc.pid)
