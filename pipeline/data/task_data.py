"""A user's dataset as the pipeline's splits: the reader behind `task.kind: dataset`.

    from pipeline.data.task_data import read_task_dataset
    splits, quarantine = read_task_dataset(DatasetConfig(path="gsm8k.jsonl", answer_extraction="gsm8k"))
    splits["train"][0]  # {"id", "prompt", "answer", "answer_type", "rationale", "steps", "split"}

The source is a local file (parquet, JSONL, CSV: every row is `train`), a local folder of such files
(one split per file stem: ``train.jsonl``, ``test.parquet``; the shards ``train-00000-of-00002.parquet``
and ``train-00001-of-00002.parquet`` are one split, ``train``), or a Hugging Face dataset id read
through `datasets.load_dataset` (offline with ``HF_HUB_OFFLINE=1``: then only the local cache).
`DatasetConfig.splits` maps our splits to the source's names (a folder's: its file stems); without
it a source split is ours by the words in its name, as Hugging Face's data files read them
(``gsm8k-train``: train; ``dev``, ``valid``, ``validation``: val; ``eval``: test; `SPLIT_WORDS`).
Each row becomes the minimal example contract: `id` (a hash of the split and prompt), `prompt`,
`answer`, `answer_type` (`pipeline.data.grading.infer_answer_type`), `rationale` ("" when unknown) and
`steps` (the rationale's paragraphs or lines).

Splits: a missing `test` (`test_fraction`), then a missing `val` (`val_fraction`) are cut from `train`
by hashes of the prompt, so a cut does not move when rows are added; a prompt lands in one split
only, the first of test, ood, val, train that holds it, and once within it. A row whose answer cannot
be extracted goes to the quarantine list with its source split, row number and reason; more than
`max_unextractable` of them fails the read.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from pipeline.data.answers import gsm8k_answer, last_boxed
from pipeline.core.params import LOCAL_RULE
from pipeline.data.params import DatasetConfig, is_local_dataset
from pipeline.data.grading import PARAGRAPH_BREAK, infer_answer_type
from pipeline.core import paths
from pipeline.core.io import InputError, read_rows

SPLITS = paths.SPLITS
# Where a prompt found in several splits stays: evaluation splits win, so nothing tested is trained on.
SPLIT_PRIORITY = ("test", "ood", "val", "train")
FILE_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
# The words that make a source split ours when task.dataset.splits maps none (Hugging Face's data-file keywords)
SPLIT_WORDS = {"train": "train", "training": "train", "validation": "val", "valid": "val", "val": "val",
               "dev": "val", "test": "test", "testing": "test", "eval": "test", "evaluation": "test", "ood": "ood"}
_SHARD = re.compile(r"-\d{5}-of-\d{5}$")  # train-00000-of-00002: a shard of `train`
TEST_SALT = "test_split:"  # the test cut's draw, independent of the val cut's
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")


def split_steps(rationale: str, how: str = "paragraph") -> list[str]:
    """A rationale's steps: its paragraphs (blank-line separated) or its non-blank lines."""
    if how not in ("paragraph", "line"):
        raise ValueError(f"unknown step split {how!r}: paragraph or line")
    parts = PARAGRAPH_BREAK.split(rationale) if how == "paragraph" else rationale.splitlines()
    return [" ".join(part.split()) for part in parts if part.strip()]


def extract_gold(value: object, cfg: DatasetConfig) -> tuple[str | None, str]:
    """(answer or None, the rationale it came with) from one answer_field value."""
    if value is None:
        return None, ""
    text = str(value).strip()
    if cfg.answer_extraction == "field":
        return (text or None), ""
    if cfg.answer_extraction == "gsm8k":
        answer = gsm8k_answer(text)
        # GSM8K writes "1,000"; the answer is the number, the rationale the text before "####".
        return (answer.replace(",", "") if answer else None), text[: text.rfind("####")].strip()
    if cfg.answer_extraction == "boxed":
        return last_boxed(text), text
    match = list(re.finditer(cfg.answer_regex or "", text))
    if not match:
        return None, text
    found = match[-1].group(1) if match[-1].groups() else match[-1].group(0)
    return (found.strip() or None), text


def _row_id(split: str, prompt: str) -> str:
    return hashlib.sha256(f"{split}\n{prompt}".encode()).hexdigest()[:16]


def in_share(prompt: str, fraction: float, salt: str = "") -> bool:
    """A stable share of prompts: the first 8 hex digits of their hash read as a fraction of 2**32.

    Another `salt` draws a share independent of the first (the val cut has none: a share of train must not be
    the prompts the val cut left out)."""
    return int(hashlib.sha256((salt + prompt).encode()).hexdigest()[:8], 16) < fraction * 2**32


RATIONALE_SALT = "rationale_share:"  # sft.rationale_share's draw, independent of the dataset's val cut


def gold_rows(share: float = 1.0) -> list[dict]:
    """data/synthesize/train.parquet's rows, or the `sft.rationale_share` of them (a stable draw by prompt hash)."""
    rows = read_rows(paths.split_file("train"), required=("prompt", "rationale"))
    return rows if share >= 1 else [r for r in rows if in_share(r["prompt"], share, RATIONALE_SALT)]


def load_source(cfg: DatasetConfig) -> dict[str, list[dict]]:
    """The source's rows per source split name, as dicts of its own columns."""
    path = Path(cfg.path).expanduser()
    if path.exists():
        return _load_local(path)
    if is_local_dataset(cfg.path):
        raise InputError(f"task.dataset.path: {cfg.path}: no such file or folder ({LOCAL_RULE})")
    return _load_hub(cfg)


def _load_local(path: Path) -> dict[str, list[dict]]:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in FILE_SUFFIXES)
    if not files:
        raise InputError(f"task.dataset.path: {path}: no {', '.join(FILE_SUFFIXES)} file in it")
    by_split: dict[str, list[Path]] = {}
    for file in files:
        if file.suffix not in FILE_SUFFIXES:
            raise InputError(f"task.dataset.path: {file}: not one of {', '.join(FILE_SUFFIXES)}")
        split = "train" if path.is_file() else _SHARD.sub("", file.stem)
        by_split.setdefault(split, []).append(file)
    kinds = {FILE_SUFFIXES[f.suffix] for f in files}
    if len(kinds) > 1:
        raise InputError(f"task.dataset.path: {path}: mixes file kinds ({', '.join(sorted(kinds))}); use one")
    kind = kinds.pop()
    # One split at a time, so that an error names its file (a shard's error names its split's first file)
    return {split: _read_files(kind, fs) for split, fs in by_split.items()}


def _read_files(kind: str, files: list[Path]) -> list[dict]:
    """The rows of one split's files, read through `datasets` (an error names the file and its cause)."""
    import datasets

    for file in files:
        if file.stat().st_size == 0:
            raise InputError(f"task.dataset.path: {file}: empty file")
    try:
        loaded = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train")
        return [dict(row) for row in loaded]  # decoding errors surface here too, as the rows are read out
    except Exception as exc:  # a malformed file: name it and its first bad line, else the cause `datasets` wrapped
        for file in files:
            if bad := _first_bad_line(file):
                raise InputError(f"task.dataset.path: {file}: cannot be read ({bad})") from None
        name = files[0] if len(files) == 1 else f"{files[0]} (or another of its {len(files)} shards)"
        raise InputError(f"task.dataset.path: {name}: cannot be read ({_root_cause(exc)})") from None


def _first_bad_line(file: Path) -> str | None:
    """'line N: what is wrong' for the first line of a JSONL or CSV file that is not UTF-8 (or, in JSONL, not one
    JSON object); None when every line reads."""
    import json

    if file.suffix not in (".jsonl", ".csv"):
        return None
    with open(file, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
            if file.suffix == ".jsonl" and line.strip():
                try:
                    if not isinstance(json.loads(line), dict):
                        return f"line {number}: not a JSON object"
                except json.JSONDecodeError as exc:
                    return f"line {number}: not JSON ({exc.msg}, column {exc.colno})"
    return None


def _root_cause(exc: BaseException) -> str:
    """The innermost exception's type and text: `datasets` wraps a parse error in its own generic one."""
    while (inner := exc.__cause__ or exc.__context__) is not None and inner is not exc:
        exc = inner
    text = str(exc).strip()
    if isinstance(exc, ValueError) and "corresponds to no data" in text:
        return "no rows"
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _load_hub(cfg: DatasetConfig) -> dict[str, list[dict]]:
    import datasets

    try:
        loaded = datasets.load_dataset(cfg.path, cfg.name, revision=cfg.revision)
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = " (HF_HUB_OFFLINE=1: only the local cache is read)" if offline else ""
        raise InputError(f"task.dataset.path: {cfg.path}: not a local path and not loadable from the Hugging Face "
                         f"Hub{hint}: {type(exc).__name__}: {exc}") from None
    return {split: [dict(row) for row in rows] for split, rows in loaded.items()}


def _check_fields(source: dict[str, list[dict]], cfg: DatasetConfig) -> None:
    for split, rows in source.items():
        columns = list(rows[0]) if rows else []
        wanted = [("prompt_field", cfg.prompt_field), ("answer_field", cfg.answer_field)]
        if cfg.rationale_field:
            wanted.append(("rationale_field", cfg.rationale_field))
        for key, field in wanted:
            if rows and field not in columns:
                raise InputError(f"task.dataset.{key}: {field!r} is not a field of {cfg.path} (split {split}); "
                                 f"its fields: {', '.join(columns)}")


def our_split(name: str) -> str | None:
    """Our split for a source split's name, by the first of `SPLIT_WORDS` among its words; None when none is."""
    return next((SPLIT_WORDS[w] for w in re.split(r"[^a-z0-9]+", name.lower()) if w in SPLIT_WORDS), None)


def read_task_dataset(cfg: DatasetConfig, step_split: str = "paragraph", log: Callable[[str], None] | None = None
                      ) -> tuple[dict[str, list[dict]], list[dict]]:
    """(our splits -> example rows, quarantined rows) from the dataset `cfg` names; `log` hears what was left
    unread, cut or dropped."""
    log = log or (lambda message: None)
    source = load_source(cfg)
    for ours, theirs in cfg.splits.items():
        if theirs not in source:
            raise InputError(f"task.dataset.splits.{ours}: {theirs!r} is not a split of {cfg.path}; "
                             f"its splits: {', '.join(source)}")
    # (ours, theirs) pairs: several source splits may feed one of ours (train-a.jsonl, train-b.jsonl)
    chosen = ([(ours, theirs) for ours, theirs in cfg.splits.items()] if cfg.splits
              else [(our_split(s), s) for s in source if our_split(s) is not None])
    if not chosen:
        raise InputError(f"task.dataset.path: {cfg.path}: none of its splits ({', '.join(source)}) is named train, "
                         "val or test; map them with task.dataset.splits (e.g. {train: <name>, test: <name>})")
    if unread := [s for s in source if s not in {theirs for _, theirs in chosen}]:
        log(f"task.dataset: not read: {', '.join(unread)} (no split of ours; map them with task.dataset.splits)")
    # the splits read only: a folder's dataset_info.json or an unlabelled split need not have the fields
    _check_fields({theirs: source[theirs] for _, theirs in chosen}, cfg)
    rows_by_split: dict[str, list[dict]] = {}
    quarantine: list[dict] = []
    total = 0
    for ours, theirs in chosen:
        for index, raw in enumerate(source[theirs]):
            total += 1
            prompt = str(raw.get(cfg.prompt_field) or "").strip()
            answer, rationale = extract_gold(raw.get(cfg.answer_field), cfg)
            if cfg.rationale_field:
                rationale = str(raw.get(cfg.rationale_field) or "").strip()
            if not prompt or not answer:
                reason = "empty prompt" if not prompt else f"no answer by {cfg.answer_extraction}"
                quarantine.append({"split": theirs, "row": index, "reason": reason,
                                   "value": str(raw.get(cfg.answer_field))[:500]})
                continue
            rows_by_split.setdefault(ours, []).append(_example(prompt, answer, rationale, step_split))
    if not total:
        raise InputError(f"task.dataset.path: {cfg.path}: no rows in the splits read "
                         f"({', '.join(theirs for _, theirs in chosen)})")
    if len(quarantine) > cfg.max_unextractable * total:
        listed = "; ".join(f"split {q['split']}, row {q['row']}: {q['reason']}" for q in quarantine[:5])
        raise InputError(f"{cfg.path}: {len(quarantine)} of {total} rows have no answer (more than a share of "
                         f"task.dataset.max_unextractable = {cfg.max_unextractable}); the first "
                         f"{min(5, len(quarantine))} (rows count from 0): {listed}")
    if "train" not in rows_by_split:
        raise InputError(f"{cfg.path}: no train split (its splits: {', '.join(source)}; map one with "
                         "task.dataset.splits)")
    for split, fraction, salt in (("test", cfg.test_fraction, TEST_SALT), ("val", cfg.val_fraction, "")):
        if split not in rows_by_split:
            train = rows_by_split["train"]
            rows_by_split[split] = [r for r in train if in_share(r["prompt"], fraction, salt)]
            rows_by_split["train"] = [r for r in train if not in_share(r["prompt"], fraction, salt)]
            log(f"task.dataset: no {split} split: {len(rows_by_split[split])} of train's {len(train)} rows cut by "
                f"task.dataset.{split}_fraction = {fraction}")
    return _deduplicate(rows_by_split, log), quarantine


def _example(prompt: str, answer: str, rationale: str, step_split: str) -> dict:
    # GSM8K's calculator annotations (<<48/2=24>>) are tool calls, not prose: the steps drop them.
    steps = split_steps(_GSM8K_CALC.sub("", rationale), step_split) if rationale else []
    return {"prompt": prompt, "answer": answer, "answer_type": infer_answer_type(answer),
            "rationale": rationale, "steps": steps}


def _deduplicate(rows_by_split: dict[str, list[dict]], log: Callable[[str], None]) -> dict[str, list[dict]]:
    seen: set[str] = set()
    out: dict[str, list[dict]] = {}
    for split in SPLIT_PRIORITY:
        kept = []
        for row in rows_by_split.get(split, []):
            key = " ".join(row["prompt"].split())
            if key not in seen:
                seen.add(key)
                kept.append({"id": _row_id(split, row["prompt"]), "split": split, **row})
        if split in rows_by_split:
            out[split] = kept
            if dropped := len(rows_by_split[split]) - len(kept):
                log(f"task.dataset: {dropped} {split} rows dropped: their prompt is in {split} already or in a split "
                    "evaluated before it (test, ood, val, train)")
    return {split: out[split] for split in SPLITS if split in out}
