"""The vLLM server the grpo stage starts itself (pipeline/rl/vllm_server.py): its lifecycle on a real HTTP server
started on loopback (a stand-in for `vllm serve`, which needs CUDA: the server's own side runs only on a machine
with two GPUs or more), the GPUs it takes, the command TRL builds for it, and the refusals."""

from __future__ import annotations

import sys
import time
import urllib.request

import pytest

from pipeline.core.io import ConfigError, InputError, StageFailed
from pipeline.modeling.params import ModelLoadConfig
from pipeline.rl import vllm_server
from pipeline.rl.params import GRPOStageConfig

SERVER = """
import http.server, sys, time
time.sleep(0.5)  # a server that takes a moment to start, as vLLM's does (minutes there)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
SERVED = GRPOStageConfig(use_vllm=True, vllm_mode="server")


def test_the_server_runs_for_the_block_and_is_stopped_after_it():
    port, lines = vllm_server.free_port(), []
    with vllm_server.running([sys.executable, "-c", SERVER, str(port)], port, {}, timeout=30, say=lines.append) as url:
        assert url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            assert response.status == 200
        proc = vllm_server._running[-1]
    assert proc.poll() is not None and vllm_server._running == []  # stopped, and forgotten
    assert not vllm_server._healthy(url)
    assert "[vllm server] serving" in lines and lines[-1] == f"vLLM server ready at {url}"


def test_a_server_that_exits_first_fails_the_stage_with_its_last_lines():
    command = [sys.executable, "-c", "print('RuntimeError: no CUDA device'); raise SystemExit(3)"]
    with pytest.raises(StageFailed, match=r"exited with 3 before it answered: .*no CUDA device"):
        with vllm_server.running(command, vllm_server.free_port(), {}, timeout=30, say=lambda line: None):
            pass
    assert vllm_server._running == []


def test_a_server_that_never_answers_fails_after_the_timeout_and_is_stopped():
    start = time.monotonic()
    command = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(120)"]
    with pytest.raises(StageFailed, match=r"did not answer .*/health within 2 s \(grpo.vllm_server_timeout\); "
                                          r"its last lines: loading weights"):
        with vllm_server.running(command, vllm_server.free_port(), {}, timeout=1.5, say=lambda line: None):
            pass
    assert time.monotonic() - start < 15 and vllm_server._running == []


def test_the_server_takes_the_last_gpus_and_training_the_first():
    visible = ["0", "1", "2", "3"]
    assert vllm_server.split_gpus(SERVED, 2, visible) == (["0", "1"], ["3"])
    two = SERVED.model_copy(update={"vllm_server_gpus": 2})
    assert vllm_server.split_gpus(two, 2, visible) == (["0", "1"], ["2", "3"])
    with pytest.raises(ConfigError, match=r"grpo.vllm_server_gpus=2 GPU\(s\) of its own beside 3 training "
                                          r"process\(es\) \(launch.num_processes\): 5 GPUs, and 4 are visible"):
        vllm_server.split_gpus(two, 3, visible)


def test_cuda_visible_devices_names_the_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    assert vllm_server.visible_gpus() == ["4", "6", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert vllm_server.visible_gpus() == ["0", "1", "2"]


def test_the_command_is_trls_vllm_serve_for_the_policy(tmp_path):
    cfg = SERVED.model_copy(update={"vllm_server_gpus": 2, "vllm_gpu_memory_utilization": 0.5})
    cmd = vllm_server.serve_command(tmp_path / "sft", 8123, cfg, ModelLoadConfig(dtype="bfloat16"))
    assert cmd[cmd.index("serve") + 1] == str(tmp_path / "sft")
    flags = dict(zip(cmd[cmd.index("serve") + 2 :: 2], cmd[cmd.index("serve") + 3 :: 2]))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123" and flags["--tensor-parallel-size"] == "2"
    assert flags["--gpu-memory-utilization"] == "0.5" and flags["--dtype"] == "bfloat16"
    assert "--weight-transfer-config" in cmd  # TRL pushes the policy's weights in through it
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter/adapter_config.json").write_text("{}")
    with pytest.raises(InputError, match="a LoRA adapter folder; a vLLM server loads whole models"):
        vllm_server.serve_command(tmp_path / "adapter", 8123, cfg, ModelLoadConfig())


def test_without_gpus_for_it_the_stage_refuses_before_starting_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_server, "visible_gpus", lambda: ["0"])
    with pytest.raises(ConfigError, match=r"2 GPUs, and 1 are visible; give a running server's URL"):
        with vllm_server.for_stage(SERVED, ModelLoadConfig(), tmp_path, training=1):
            pass
    assert vllm_server._running == []
    given = SERVED.model_copy(update={"vllm_server_base_url": "http://127.0.0.1:8000"})
    with vllm_server.for_stage(given, ModelLoadConfig(), tmp_path, training=1):  # a URL given: nothing to start
        assert vllm_server.URL_ENV not in __import__("os").environ
