"""Atomic writes, parquet I/O and provenance manifests.

Stage contract (docs/design.md): a stage writes into a temporary folder beside its
output and renames it into place at the end, so a killed stage never leaves an
output that looks complete; every output folder carries `config.json`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core import faults
from pipeline.core.processes import running


class ConfigError(Exception):
    """Bad params: the message names the file and the key."""


class InputError(Exception):
    """A missing or malformed input: the message names the file (and row or column)."""


class StageFailed(Exception):
    """The stage cannot complete for a reason it names (training diverged): exit 1 with the message alone."""


# Set in each rank's environment by pipeline/orchestration/launch.py (the stage's name): a process the pipeline
# launched.
LAUNCHED = "PIPELINE_LAUNCHED_STAGE"


def rank() -> int:
    """This process's global rank when the pipeline's launch started it (torchrun's RANK), else 0: a RANK that a
    cluster exports to every process of a job does not count. Only rank 0 writes a stage's outputs, metrics and
    manifests (pipeline/orchestration/launch.py)."""
    return int(os.environ.get("RANK") or 0) if os.environ.get(LAUNCHED) else 0


def wait_for_ranks() -> None:
    """A barrier over the launched ranks (none in a single process): rank 0 puts an output in place only once
    every rank got there, so a rank that fails before it fails the stage with the old output standing."""
    if not os.environ.get(LAUNCHED) or "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# A rank other than 0: the throwaway folders that stand in for its atomic_dir outputs (it writes there alone), in
# the system's temporary folder as `pipeline-stand-in-<pid>-rank<r>-<output>-<random>`.
_stand_ins: list[Path] = []
STAND_IN = "pipeline-stand-in-"


def _writes(path: Path | str) -> bool:
    """Does this process write `path`? Rank 0 writes everything; another rank only inside its stand-in folders."""
    if rank() == 0:
        return True
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(folder) for folder in _stand_ins)


@contextlib.contextmanager
def atomic_dir(final: Path | str) -> Iterator[Path]:
    """Yield an empty temporary folder beside `final`; replace `final` with it on success.

    On an exception the temporary folder is removed and `final` is left as it was. A process killed
    before the end leaves its folder behind, named with its PID: the next `atomic_dir` for `final`
    removes it once that process is gone. A full disk raises `DiskFull`, naming `final` and the file.
    A rank other than 0 gets a throwaway folder outside the project instead, removed at the end.
    """
    final = Path(final)
    if rank() != 0:
        _remove_stale(Path(tempfile.gettempdir()), (STAND_IN,))  # those of killed ranks
        stand_in = Path(tempfile.mkdtemp(prefix=f"{STAND_IN}{os.getpid()}-rank{rank()}-{final.name}-")).resolve()
        _stand_ins.append(stand_in)
        try:
            yield stand_in
            wait_for_ranks()  # rank 0 is at its commit: it goes ahead once every rank is here
        finally:
            _stand_ins.remove(stand_in)
            shutil.rmtree(stand_in, ignore_errors=True)
        return
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(final.parent, (f".{final.name}.tmp-", f".{final.name}.old-"))
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise InputError(f"{final}: cannot write into {final.parent}: {exc.strerror}; {final} is left as it "
                             "was") from None
        raise
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would keep a shared project's outputs from the group
    try:
        yield tmp
    except (OSError, DiskFull) as exc:  # DiskFull: a file of ours (atomic_write_text) inside the folder
        shutil.rmtree(tmp, ignore_errors=True)
        cause = exc.__cause__ if isinstance(exc, DiskFull) else exc
        if isinstance(cause, OSError) and cause.errno in DISK_FULL:
            file = Path(getattr(exc, "path", None) or cause.filename or tmp)
            file = file.relative_to(tmp) if file.is_relative_to(tmp) else file  # the temporary folder is gone
            raise DiskFull(f"{final}: {cause.strerror} while writing {file}; {final} is left as it was (free some "
                           "space and re-run the stage)") from cause
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    wait_for_ranks()
    faults.at(f"commit:{final}")
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


@contextlib.contextmanager
def live_atomic_dir(final: Path | str) -> Iterator[Path]:
    """`atomic_dir` for a training stage's curves, readable while it trains: `<final>.live` (plots/sft.live) links
    to the temporary folder dvclive writes into, from the start to the end of the block, so `dvc plots show
    plots/sft.live/plots/metrics/loss.tsv` shows the run so far; `final` itself still changes only at the end."""
    final = Path(final)
    with atomic_dir(final) as tmp:
        if rank() != 0:  # a throwaway stand-in: nothing to show
            yield tmp
            return
        link = final.with_name(f"{final.name}.live")
        if link.is_symlink():  # a killed run's, dangling
            link.unlink()
        try:
            link.symlink_to(tmp.name, target_is_directory=True)  # relative: the project may move
        except OSError:
            link = None  # a file system without links (or a folder of that name): the curves appear at the end
        try:
            yield tmp
        finally:
            if link is not None:
                link.unlink(missing_ok=True)


# errno values of a full disk or quota: the write fails part-way, and what was there before must survive.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(InputError):
    """A write failed for lack of space; the message names the output and the file, and the old output stands."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_stale(folder: Path, prefixes: tuple[str, ...]) -> None:
    """Remove the temporary files and folders `<prefix><pid>-...` (or `<prefix><pid>`) of processes that are gone."""
    for path in folder.iterdir() if folder.is_dir() else ():
        prefix = next((p for p in prefixes if path.name.startswith(p)), None)
        if prefix is None:
            continue
        pid = path.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or running(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write a file through a temporary sibling and os.replace (atomic on POSIX): a failed or killed write
    leaves the old file as it was. Not written on a rank other than 0 (outside its stand-in folders)."""
    if not _writes(path):
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path.parent, (f".{path.name}.",))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            if faults.armed(f"write:{path}") == "enospc":
                fh.write(text[: len(text) // 2])
                raise faults.disk_full(path)
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600, as a plain open() would not leave it
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno in DISK_FULL:
            full = DiskFull(f"{path}: {exc.strerror}; {path} is left as it was (free some space and re-run)")
            full.path = path  # for atomic_dir, when `path` lies in its temporary folder
            raise full from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path | str, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def read_json(path: Path | str) -> Any:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from exc


def write_rows(path: Path | str, rows: Sequence[dict], schema: pa.Schema | None = None) -> None:
    """Rows to parquet. Same rows give the same bytes (no timestamps in parquet metadata). Not written on a rank
    other than 0 (outside its stand-in folders)."""
    if not _writes(path):
        return
    table = pa.Table.from_pylist(list(rows), schema=schema)
    if faults.armed(f"write:{path}") == "enospc":  # the fault suite's full disk: half the bytes, then the error
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        whole = sink.getvalue().to_pybytes()
        Path(path).write_bytes(whole[: len(whole) // 2])
        raise faults.disk_full(path)
    pq.write_table(table, path, compression="zstd")


def read_rows(path: Path | str, required: Sequence[str] = ()) -> list[dict]:
    """Parquet to rows; a missing or corrupted file or a missing column fails naming it."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found (run the stage that makes it: dvc repro)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable parquet file: {exc}") from exc
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    return table.to_pylist()


def sample_rows(rows: Sequence[dict], n: int, rng: random.Random, exclude: Collection[str] = frozenset()) -> list[dict]:
    """`n` rows whose id is not in `exclude` (all of them when fewer), drawn with `rng`, kept in file order."""
    candidates = [i for i, r in enumerate(rows) if r["id"] not in exclude] if exclude else range(len(rows))
    return [rows[i] for i in sorted(rng.sample(candidates, min(n, len(candidates))))]


def hash_path(path: Path | str) -> str:
    """sha256 of a file, or of a folder's files (relative names and contents, sorted)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        files = [path]
        base = path.parent
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        base = path
    else:
        raise InputError(f"{path}: not found")
    for file in files:
        digest.update(str(file.relative_to(base)).encode())
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# Recorded when this project is not installed as a package (its metadata then names no requirements)
CORE_LIBRARIES = ("torch", "transformers", "trl", "tokenizers", "datasets", "pyarrow", "prefect", "dvc")


def library_versions() -> dict[str, str]:
    """The version of Python and of every library this project declares (pyproject.toml): its dependencies
    ("missing" for one not installed) and the extras' that are installed here (deepspeed, tensorboard, vLLM through
    trl[vllm], ...). Every library a stage imports is one of them (tests/unit/test_dependencies.py)."""
    import platform
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(r) for r in requires("reasoning-pipeline") or ()]
    except PackageNotFoundError:
        declared = [Requirement(name) for name in CORE_LIBRARIES]
    out = {"python": platform.python_version()}
    for req in declared:
        name = req.name.lower()
        if name == "reasoning-pipeline" or name in out:
            continue
        if req.marker is not None and 'extra == "dev"' in str(req.marker):
            continue  # the test runner, no stage's library
        optional = req.marker is not None and "extra" in str(req.marker)
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            if not optional:
                out[name] = "missing"
        if optional and "vllm" in req.extras:  # trl[vllm]: vLLM itself is the library the extra brings
            try:
                out["vllm"] = version("vllm")
            except PackageNotFoundError:
                pass
    return dict(sorted(out.items()))


def write_manifest(
    folder: Path, stage: str, params: Any, inputs: Sequence[Path | str] = (), name: str = "config.json", **extra: Any
) -> None:
    """How this output was made (resolved params, input hashes, seed, versions), as `folder/name`.

    Model folders pass `paths.MODEL_MANIFEST`: their `config.json` is the Hugging Face model config.
    Wall-clock figures in `extra` (a stage's metrics) are left out: a rerun that makes the same output
    writes the same bytes, so DVC does not see a changed folder and re-run every stage after it.
    """
    params_dict = params.model_dump(mode="json") if hasattr(params, "model_dump") else dict(params)
    manifest = {
        "stage": stage,
        "params": params_dict,
        "seed": params_dict.get("seed"),
        "inputs": {str(p): hash_path(p) for p in inputs},
        "versions": library_versions(),
        **untimed(extra),
    }
    write_json(Path(folder) / name, manifest)


def untimed(value: Any) -> Any:
    """`value` without the keys that hold wall-clock measurements (seconds, throughputs), at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not is_timing(k)}
    return value


def timed(value: Any) -> Any:
    """Only the wall-clock measurements of `value`, at any depth, in their places (None: it holds none)."""
    if not isinstance(value, dict):
        return None
    out = {}
    for key, item in value.items():
        if is_timing(key):
            out[key] = item
        elif (inner := timed(item)) is not None:
            out[key] = inner
    return out or None


# Key parts of a wall-clock measurement: ours (`train_seconds`, `questions_per_second`), transformers'
# (`train_runtime`, `train_samples_per_second`) and TRL's (`step_time`).
TIMING_PARTS = ("seconds", "per_second", "runtime", "step_time")


def is_timing(key: str) -> bool:
    return any(part in key for part in TIMING_PARTS)


def write_metrics(path: Path | str, metrics: dict) -> dict | None:
    """A stage's metrics: what does not depend on the machine's speed into `path` (a file DVC hashes into dvc.lock),
    the wall-clock figures into its `paths.timings_file` (which nothing tracks), so that a re-run that computes the
    same numbers leaves dvc.lock as it was. Returns the timings written (None: there were none)."""
    from pipeline.core import paths

    write_json(path, untimed(metrics))
    timings = timed(metrics)
    timings_file = paths.timings_file(Path(path))
    if timings is None:
        Path(timings_file).unlink(missing_ok=True)  # an earlier run's figures would be read as this run's
    else:
        write_json(timings_file, timings)
    return timings


# The reasoning-example columns (docs/design.md, "Data contracts"); `prompt` is the serialized chart and question.
STEP_TYPE = pa.struct([("function", pa.string()), ("text", pa.string()), ("value", pa.string())])
EXAMPLE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("split", pa.string()),
        ("chart_type", pa.string()),
        ("table", pa.string()),
        ("question", pa.string()),
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("answer_type", pa.string()),
        ("functions", pa.list_(pa.string())),
        ("groups", pa.list_(pa.string())),
        ("steps", pa.list_(STEP_TYPE)),
        ("rationale", pa.string()),
        ("chain_length", pa.int64()),
        ("task_type", pa.string()),
        ("image_path", pa.string()),
    ]
)
EXAMPLE_COLUMNS = tuple(EXAMPLE_SCHEMA.names)
