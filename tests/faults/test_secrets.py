"""A teacher's API key comes from the environment only and is written nowhere.

`python -m pipeline repro distill` with an OpenAI-compatible teacher (the project's loopback server, which
demands the key) and a sentinel key; afterwards no file under data/, models/, metrics/, plots/, the DVC cache,
dvc.lock, the teacher's response cache or the Prefect server's home (its database and logs) holds it.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import TINY_PARAMS, venv_env, write_params
from tests.faults.conftest import PYTHON, own_server_env, sh

pytestmark = pytest.mark.e2e

SENTINEL = "sk-FAULT-SUITE-SENTINEL-5d1c0a"


def serve_tiny_model(folder: Path, port: int) -> subprocess.Popen:
    """The loopback OpenAI-compatible server over a freshly built tiny model that demands the sentinel key."""
    from pipeline.modeling.models import build_student, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    tokenizer = train_tokenizer(["Step 1: 2 + 3 = 5\nAnswer: 5", "What is the largest value?"] * 20, 200)
    model = build_student(BaseModelConfig(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=200), tokenizer)
    save_model(model, tokenizer, folder)
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.inference.openai_server", str(folder), "--port", str(port), "--api-key-env",
         "FAULT_TEACHER_KEY", "--served-model-name", "local"],
        env=venv_env(FAULT_TEACHER_KEY=SENTINEL), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {SENTINEL}"})
    for _ in range(300):
        try:
            urllib.request.urlopen(request, timeout=1)
            return server
        except OSError:
            assert server.poll() is None, server.stderr.read()
            time.sleep(0.2)
    raise AssertionError("the loopback teacher did not start")


def test_the_teacher_key_reaches_no_file(repo, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = serve_tiny_model(tmp_path / "served", port)
    params = copy.deepcopy(TINY_PARAMS)
    params["teacher"] = {"backend": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": "local",
                         "api_key_env": "FAULT_TEACHER_KEY", "concurrency": 4, "timeout_s": 30}
    write_params(repo, params)
    home = tmp_path / "prefect_home"
    try:
        run = sh([PYTHON, "-m", "pipeline", "repro", "distill"], repo,
                 environ=own_server_env(home) | {"FAULT_TEACHER_KEY": SENTINEL})
    finally:
        server.terminate()
        server_log = server.communicate(timeout=30)[1]
        write_params(repo)
    assert "Running stage 'distill'" in run.stdout + run.stderr
    assert (repo / "metrics/distill.json").exists()  # the key was sent: the server answers no request without it
    searched = [repo / "dvc.lock", home,
                *(repo / d for d in ("data", "models", "metrics", "plots", ".dvc/cache", "cache/teacher"))]
    files = [f for p in searched for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    assert any(f.name == "responses.sqlite" for f in files), "the teacher's response cache is searched"
    assert any(f.suffix == ".db" for f in files if str(f).startswith(str(home))), "Prefect's database is searched"
    assert any(f.name == "server.log" for f in files), "the Prefect server's log is searched"
    assert [str(f) for f in files if SENTINEL.encode() in f.read_bytes()] == []
    assert SENTINEL not in run.stdout + run.stderr + server_log
    assert os.environ.get("FAULT_TEACHER_KEY") is None  # the key lived only in the runs' environments
