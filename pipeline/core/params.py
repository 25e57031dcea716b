"""Typed params: the base of every params section's schema and the reading of params.yaml.

Each room keeps its sections' schemas beside its code (`pipeline/<room>/params.py`: one pydantic model per
`params.yaml` section). A stage's main calls `load_section("sft", SFTConfig)`; an unknown key, a wrong type or an
out-of-range value raises `ConfigError` naming the key before any work starts, e.g.
``params.yaml: sft.learning_rat: unknown key``. The run-wide sections reach the code that reads them through
`give` and `given`, handed over by the entry point; no room reads params.yaml itself.
"""

from __future__ import annotations

import contextlib
import os
import types
import typing
from collections.abc import Iterator
from functools import reduce
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.core.io import ConfigError
from pipeline.core.paths import PRETRAINED

PARAMS_FILE = "params.yaml"
Scheduler = Literal["linear", "cosine", "constant", "constant_with_warmup"]


class Section(BaseModel):
    """Base of every params section: unknown keys fail, values are checked on assignment, and no number is NaN or
    infinite (a NaN reward weight would zero every reward and train nothing, without a word)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info):
        """pydantic reads true as 1 for a number: `-S sft.seed=true` would run seed 1 without a word."""
        if (below := _boolean_for_number(cls.model_fields[info.field_name].annotation, value)) is not None:
            raise BooleanForNumber(below, reduce(lambda held, key: held[key], below, value))
        return value


class BooleanForNumber(ValueError):
    """A boolean where a number belongs; `below` the keys or indices under the field that hold it (the error
    message names the whole dotted key: `rewards.weights.accuracy`)."""

    def __init__(self, below: tuple, found: bool) -> None:
        super().__init__("must be a number, not a boolean")
        self.below, self.found = below, found


def _bare(annotation):
    """A type without its `Annotated[...]` constraints (pydantic strips only the outermost)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _boolean_for_number(annotation, value) -> tuple | None:
    """Where `value` holds a boolean that the field's type wants as a number: () for the value itself, a key or
    index path for a mapping's value or a list's or tuple's item; None where it holds none. Through unions (one
    that offers bool takes it as it is) and `Annotated` constraints."""
    annotation = _bare(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [_bare(a) for a in args]
        if isinstance(value, bool) and bool in options:
            return None
        return next((found for a in options if (found := _boolean_for_number(a, value)) is not None), None)
    if isinstance(value, bool):
        return () if annotation in (int, float) else None
    if origin in (list, tuple) and args and isinstance(value, list | tuple):
        items = args if origin is tuple and Ellipsis not in args else args[:1] * len(value)
        pairs = zip(range(len(value)), items, value)
    elif origin is dict and len(args) == 2 and isinstance(value, dict):
        pairs = ((key, args[1], v) for key, v in value.items())
    else:
        return None
    return next(((key, *found) for key, a, v in pairs if (found := _boolean_for_number(a, v)) is not None), None)


# Folders of this pipeline's own outputs: a model there is a stage's output, never a DVC dependency (a cycle)
PIPELINE_OUTPUTS = ("models", "data")


LOCAL_RULE = ("a local path: it exists, starts with . / or ~, has more than one /, its first folder exists here, or "
              "it is under pretrained/; a Hugging Face id is name or owner/name")


def is_local(path: str, suffixes: tuple[str, ...] = ()) -> bool:
    """Does a path-or-id name something local (rather than a Hugging Face id, owner/name)? It exists, starts with
    . / or ~, ends in one of `suffixes`, has more than one / (no Hub id does), or its first folder exists here:
    `examples/gsm8kk` is a mistyped local path, which would otherwise be looked up on the Hub, retried for half a
    minute offline, and then reported as a bad id."""
    if Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or Path(path).suffix in suffixes:
        return True
    if Path(path).parts[:1] == PRETRAINED.parts:  # a model `python -m pipeline fetch` converts (not yet, here)
        return True
    if is_stage_output(path):  # models/base: a stage writes it (not yet, on a fresh clone)
        return True
    parts = path.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def is_stage_output(path: str) -> bool:
    """Does `path` name a folder a stage of this pipeline writes (under models/ or data/, relative)?"""
    parts = Path(path).parts
    return len(parts) > 1 and not Path(path).is_absolute() and parts[0] in PIPELINE_OUTPUTS


def watched(path: str) -> str:
    """A local path as DVC must be given it: `~` expanded (DVC does not expand it)."""
    return str(Path(path).expanduser()) if path.startswith("~") else path


def config_fields(config_class: type) -> frozenset[str]:
    """The options a dataclass config (TRL's, transformers') takes as `config_class(...)`."""
    import dataclasses

    return frozenset(f.name for f in dataclasses.fields(config_class) if f.init)


def check_trl_args(value: dict[str, Any], target: str, own: typing.Iterable[str]) -> dict[str, Any]:
    """`<section>.trl_args`: options of TRL's config class `target` ("module:Class") that the section's own keys do
    not already set. TRL is imported only when the mapping holds a key (most stages never load it)."""
    if not value:
        return value
    import importlib

    module, name = target.split(":")
    options = config_fields(getattr(importlib.import_module(module), name))
    if unknown := sorted(set(value) - options):
        raise ValueError(f"{unknown[0]}: not an option of {module}.{name}")
    if owned := sorted(set(value) & set(own)):
        raise ValueError(f"{owned[0]}: a key of this section itself; set it there")
    return value


class TRLSection(Section):
    """A section that one TRL (or transformers) config class runs, `TRL_CONFIG` ("module:Class"): its `trl_args`
    field (`trl_args_field(TRL_CONFIG)`, declared where params.yaml shows it) takes any other option of that class,
    checked when the params are read."""

    TRL_CONFIG: ClassVar[str]

    @field_validator("trl_args", check_fields=False)
    @classmethod
    def _trl_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_trl_args(value, cls.TRL_CONFIG, cls.model_fields)


def trl_args_field(target: str) -> Any:
    module, name = target.split(":")
    return Field({}, description=f"any other option of {module}.{name}, by its own name (as its documentation "
                 "spells it); one that a key above or the stage sets is refused")


S = TypeVar("S", bound=Section)


def params_path() -> Path:
    """`params.yaml` in the working directory (DVC runs every stage from the repo root)."""
    return Path(os.environ.get("PIPELINE_PARAMS", PARAMS_FILE))


def read_mapping(path: Path, top: str) -> dict:
    """A YAML file whose top level is a mapping (`top` says of what, for the error); {} when empty."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of {top}")
    return data


def read_params(path: Path | None = None) -> dict:
    return read_mapping(path or params_path(), "sections")


def _format_errors(path: Path, name: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        error = err.get("ctx", {}).get("error")
        below = error.below if isinstance(error, BooleanForNumber) else ()  # the item's own key or index
        key = ".".join(str(p) for p in (name, *err["loc"], *below))
        if below:
            err = {**err, "input": error.found}  # the boolean, not the list or mapping around it
        if err["type"] == "extra_forbidden":
            lines.append(f"{path}: {key}: unknown key")
        else:
            # a key pasted into api_key_env must not be echoed into logs
            # and a whole section (a check across its keys) is no help echoed back
            got = "" if key.endswith("api_key_env") or isinstance(err.get("input"), dict) else \
                f" (got {err.get('input')!r})"
            lines.append(f"{path}: {key}: {err['msg']}{got}")
    return "\n".join(lines)


def missing_keys(model: type[Section], raw: dict, prefix: str) -> list[str]:
    """Dotted keys of `model` (nested sections too) that `raw` does not spell out."""
    out = []
    for key, field in model.model_fields.items():
        if key not in raw:
            out.append(f"{prefix}{key}")
        elif (isinstance(field.annotation, type) and issubclass(field.annotation, Section)
              and isinstance(raw[key], dict)):
            out += missing_keys(field.annotation, raw[key], f"{prefix}{key}.")
    return out


def parse_section(name: str, model: type[S], raw: object, path: Path | str = PARAMS_FILE, complete: bool = False) -> S:
    """One section checked by its model; with `complete`, every key must be spelled out.

    Stages read params.yaml complete: DVC tracks the values in the file, not this
    module's defaults, so a key left to a default would change silently with them.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {name}: must be a mapping, got {type(raw).__name__}")
    if complete and (missing := missing_keys(model, raw, f"{name}.")):
        raise ConfigError(f"{path}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}: missing (every "
                          "key is spelled out; `python -m pipeline params --write` writes a complete file)")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(Path(path), name, exc)) from None


def read_section(name: str, model: type[S], path: Path | None = None) -> S:
    """One section of params.yaml as it stands (keys left out take the schema's defaults); the schema's defaults
    when there is no params file, as in a unit test. For entry points that are not a stage (the CLI, a server)."""
    path = path or params_path()
    return parse_section(name, model, read_params(path).get(name), path) if path.exists() else model()


def load_section(name: str, model: type[S], path: Path | None = None) -> S:
    """Parse one section of params.yaml, which must spell out every key (a stage's main reads its sections so)."""
    path = path or params_path()
    data = read_params(path)
    return parse_section(name, model, data.get(name), path, complete=True)


# The run-wide sections the entry point handed over, by schema (`give`), and each schema's defaults, built once
# (the task is asked for on every completion graded)
_given: dict[type[Section], Section] = {}
_defaults: dict[type[Section], Section] = {}


@contextlib.contextmanager
def giving(*sections: Section) -> Iterator[None]:
    """Inside this block, `given(type(s))` is `s` for each section: how a stage's `run_stage` hands the run-wide
    sections it read (the task, the prompt format, model loading, ...) to the rooms that read them. What was given
    before comes back at the end (stages run one after another in one test process)."""
    before = dict(_given)
    _given.update({type(section): section for section in sections})
    try:
        yield
    finally:
        _given.clear()
        _given.update(before)


def give(*sections: Section) -> None:
    """Hand sections over for the rest of the process (a command's or a script's entry point)."""
    _given.update({type(section): section for section in sections})


def given(model: type[S]) -> S:
    """The section of schema `model` the entry point handed over; the schema's defaults when none was (a unit test,
    a notebook)."""
    found = _given.get(model)
    return found if found is not None else _defaults.setdefault(model, model())  # type: ignore[return-value]
