"""Profiles: named sets of overrides that resolve into `params.yaml`.

`params.yaml` is what every stage reads and what DVC records. It is written,
with every key spelled out, from three layers:

1. the schemas' defaults (`pipeline/<room>/params.py`): the quick default;
2. a profile, `profiles/<name>.yaml`: a small file of overrides (`research`,
   `tiny`, ...), which may extend another profile; `default` is the empty one;
3. `-S key=value` overrides (the value read as YAML), and `--seed N`.

The file's header records the profile and the overrides, so a later
`--profile` run can tell a hand edit (which it refuses to overwrite, naming
the keys) from its own output. `python -m pipeline params` prints or writes
the resolution; `python -m pipeline repro --profile NAME` writes it, then runs.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from pipeline.core.io import ConfigError, atomic_write_text
from pipeline.core.params import Section, params_path, parse_section, read_mapping, read_params
from pipeline.data.params import data_dependency_for
from pipeline.orchestration.sections import SECTIONS

PROFILES_DIR = Path("profiles")
DEFAULT = "default"
# Keys a profile file may hold besides `params`.
PROFILE_KEYS = {"description", "extends", "params", "requires"}
# The header lines that record how params.yaml was resolved.
_HEADER_PROFILE = re.compile(r"^# profile: (\S+)$")
_HEADER_SET = re.compile(r"^# set: (.+)$")


def profiles_dir(root: Path | None = None) -> Path:
    return (root or Path.cwd()) / PROFILES_DIR


def names(root: Path | None = None) -> list[str]:
    """Every profile that exists: `default` and each profiles/<name>.yaml."""
    folder = profiles_dir(root)
    found = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    return [DEFAULT, *(n for n in found if n != DEFAULT)]


def unknown_profile(name: str, root: Path | None = None) -> ConfigError:
    return ConfigError(f"unknown profile {name!r}; profiles: {', '.join(names(root))}")


def read_profile(name: str, root: Path | None = None) -> dict:
    """A profile file's mapping ({} for `default`), its keys checked."""
    if name == DEFAULT:
        return {}
    path = profiles_dir(root) / f"{name}.yaml"
    if not path.is_file():
        raise unknown_profile(name, root)
    data = read_mapping(path, "description, extends, params, requires")
    extra = sorted(set(data) - PROFILE_KEYS)
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown key (known: {', '.join(sorted(PROFILE_KEYS))})")
    for key in ("params", "requires"):
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(f"{path}: {key}: must be a mapping")
    return data


def chain(name: str, root: Path | None = None, _seen: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """[(name, file mapping)] of a profile and the profiles it extends, the base first, each file read once."""
    if name in _seen:
        raise ConfigError(f"profiles: {' -> '.join((*_seen, name))}: a profile cannot extend itself")
    data = read_profile(name, root)
    base = chain(data["extends"], root, (*_seen, name)) if data.get("extends") else []
    return [*base, (name, data)]


def required(name: str, root: Path | None = None, profiles: list[tuple[str, dict]] | None = None) -> dict[str, str]:
    """{dotted key: what to set it to} that a profile and those it extends leave for `-S` (a model to bring);
    `profiles`: its `chain`, when read already."""
    out: dict[str, str] = {}
    for _, data in profiles if profiles is not None else chain(name, root):
        out.update(data.get("requires") or {})
    return out


def check_required(name: str, params: dict, root: Path | None = None,
                   profiles: list[tuple[str, dict]] | None = None) -> None:
    """Fails naming each key the profile requires that is still unset (null or empty) in the resolved params."""
    missing = []
    for key, why in required(name, root, profiles).items():
        value: Any = params
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value in (None, ""):
            missing.append(f"{key} ({why}): -S {key}=...")
    if missing:
        raise ConfigError(f"profile {name} needs " + "; ".join(missing))


def overrides(name: str, root: Path | None = None, profiles: list[tuple[str, dict]] | None = None
              ) -> list[tuple[str, dict]]:
    """[(source, overrides)] of a profile and the profiles it extends, the base first; `profiles`: its `chain`,
    when read already."""
    return [(str(PROFILES_DIR / f"{each}.yaml"), data["params"])
            for each, data in (profiles if profiles is not None else chain(name, root)) if data.get("params")]


def defaults() -> dict:
    """The quick default: every section's schema defaults, as plain YAML values."""
    return {name: model().model_dump(mode="json") for name, model in SECTIONS.items()}


def merge(base: dict, over: dict, source: str, prefix: str = "") -> dict:
    """`base` with `over` applied: nested sections merge key by key; any other value replaces.

    A key `base` does not have fails, naming `source` and the dotted key: a
    typo in a profile must not be a silent no-op. Dict-valued params whose
    keys are data (`rewards.weights`, `animate.edit_ops`) are replaced whole.
    """
    out = dict(base)
    parent = _section_model(prefix.rstrip(".")) if prefix else None
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        # a section that was null (task.dataset) holds only the keys set so far: its schema says what is known
        if key not in base and not (parent and key in parent.model_fields):
            raise ConfigError(f"{source}: {dotted}: unknown key")
        section = _is_section(dotted)
        if section and not isinstance(value, dict) and not (value is None and _nullable(parent, key)):
            # null would read as the schema's defaults, dropping every value of the profile beneath it
            raise ConfigError(f"{source}: {dotted}: a section takes keys ({dotted}.<key>=<value>), "
                              f"not {json.dumps(value, default=str)}")
        if section and isinstance(value, dict) and isinstance(base[key], dict):
            out[key] = merge(base[key], value, source, f"{dotted}.")
        else:
            out[key] = value
    return out


def _nullable(parent: type[BaseModel] | None, key: str) -> bool:
    """Whether a nested section may be null (task.dataset); a whole params section never is."""
    field = parent.model_fields.get(key) if parent else None
    return field is not None and type(None) in typing.get_args(field.annotation)


def _is_section(dotted: str) -> bool:
    """Whether a dotted key names a params section or a nested section model (not a dict-valued field)."""
    return _section_model(dotted) is not None


def _section_model(dotted: str) -> type[BaseModel] | None:
    """The schema of the params section or nested section a dotted key names; None for any other key."""
    parts = dotted.split(".")
    model: type[BaseModel] | None = SECTIONS.get(parts[0])
    for part in parts[1:]:
        field = model.model_fields.get(part) if model else None
        model = section_type(field.annotation) if field else None
    return model


def section_type(annotation: Any) -> type[Section] | None:
    """The nested section model of a field: `DrillConfig` for `DrillConfig` or `DrillConfig | None`, else None."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for candidate in (annotation, *(typing.get_args(annotation) if union else ())):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def parse_set(item: str) -> tuple[str, Any]:
    """'sft.learning_rate=0.002' -> ('sft.learning_rate', 0.002): the value read as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip() or " " in key.strip():
        raise ConfigError(f"-S {item!r}: expected key=value, e.g. sft.learning_rate=0.002")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"-S {item!r}: the value is not valid YAML: {exc}") from None
    return key.strip(), value


def nested(key: str, value: Any) -> dict:
    """'a.b.c', v -> {'a': {'b': {'c': v}}}."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def compact(sets: Sequence[str]) -> list[str]:
    """Overrides with only the last of each key, in the order their keys were last set."""
    keys = [parse_set(item)[0] for item in sets]
    return [item for i, item in enumerate(sets) if keys[i] not in keys[i + 1 :]]


def seed_sets(seed: int) -> list[str]:
    """`--seed N` as overrides: every `seed` key of every section to N, and prm_data.question_seed to N + 1
    (the PRM's new questions are drawn with another seed than synthesize's)."""
    sets = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, Section):
                walk(annotation, f"{prefix}{name}.")
            elif name == "seed":
                sets.append(f"{prefix}seed={seed}")

    for section, model in SECTIONS.items():
        walk(model, f"{section}.")
    return sets + [f"prm_data.question_seed={seed + 1}"]


def resolve(profile: str = DEFAULT, sets: Sequence[str] = (), root: Path | None = None) -> dict:
    """The full params of `profile` with `sets` on top, every section validated by its schema."""
    params = defaults()
    profiles = chain(profile, root)  # the profile files, read once for their params and their requires
    for source, over in overrides(profile, root, profiles):
        params = merge(params, over, source)
    for item in sets:
        key, value = parse_set(item)
        params = merge(params, nested(key, value), f"-S {item}")
    task = params["task"]
    dataset = task.get("dataset") if isinstance(task, dict) else 0
    if isinstance(dataset, dict | None):  # anything else fails validation below, naming the key
        # Derived, not chosen: the DVC dependency of `synthesize` follows the dataset's path.
        task["data_dependency"] = data_dependency_for((dataset or {}).get("path"))
    # ... and those of `base` and `teacher` follow a loaded model's local folder
    for name in ("base", "teacher"):
        if isinstance(params.get(name), dict):
            params[name].pop("model_dependency", None)  # derived from the model by the section's own validator
    resolved = {name: parse_section(name, SECTIONS[name], params[name], f"profile {profile}").model_dump(mode="json")
                for name in SECTIONS}
    check_required(profile, resolved, root, profiles)
    return resolved


# --- params.yaml as text: a header, then every section with its field descriptions as comments ---

HEADER = """\
# The resolved params: what every stage reads and DVC records (dvc.lock, dvc params diff).
# Written by `python -m pipeline params --write` or `python -m pipeline repro --profile NAME`
# from the schemas' defaults (pipeline/<room>/params.py: the quick default), profiles/NAME.yaml
# and -S overrides; the lines below say which, and hash the values written. Edit by hand as
# you like: a later --profile run refuses to overwrite values that differ from what was written.
"""


def digest(params: dict) -> str:
    """A short hash of params' values, which the header records: a file whose values still have it was not edited
    by hand, whatever its profile resolves to now (a profile file changed by a `git pull`)."""
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def render(params: dict, profile: str = DEFAULT, sets: Sequence[str] = ()) -> str:
    """params.yaml's text: the header, then each section with its fields' descriptions as comments."""
    lines = (HEADER.splitlines() + [f"# profile: {profile}"] + [f"# set: {s}" for s in sets]
             + [f"# written values: {digest(params)}"])
    for name, model in SECTIONS.items():
        lines += ["", *_comment(_doc(model), ""), f"{name}:"]
        lines += _fields(model, params[name], "  ")
    return "\n".join(lines) + "\n"


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())  # indentation of a docstring too


def _comment(text: str, indent: str, width: int = 100) -> list[str]:
    if not text:
        return []
    return textwrap.wrap(text, width=width, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ",
                         break_long_words=False, break_on_hyphens=False)


WIDTH = 110  # a field's description goes after its value when the line stays this short, else above it


def _fields(model: type[BaseModel], values: dict, indent: str) -> list[str]:
    lines = []
    for key, field in model.model_fields.items():
        about = field.description or ""
        annotation = section_type(field.annotation)
        if annotation is not None and isinstance(values[key], dict):
            lines += [*_comment(about, indent), f"{indent}{key}:", *_fields(annotation, values[key], indent + "  ")]
            continue
        line = f"{indent}{key}: {_scalar(values[key])}"
        if about and len(line) + 3 + len(about) <= WIDTH:
            lines.append(f"{line}  # {about}")
        else:
            lines += [*_comment(about, indent), line]
    return lines


def _scalar(value: Any) -> str:
    """One value in YAML flow style on one line: 0.001, null, [bar, line], {accuracy: 1.0}."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _header(text: str) -> list[str]:
    """The comment lines a params.yaml starts with."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def written_digest(text: str) -> str | None:
    """The values' digest a params.yaml header records (None: a file written before headers had one)."""
    return next((line.removeprefix("# written values: ").strip() for line in _header(text)
                 if line.startswith("# written values: ")), None)


def header_of(text: str) -> tuple[str | None, list[str]]:
    """(profile, sets) recorded in a params.yaml header; (None, []) when it has none."""
    profile, sets = None, []
    for line in _header(text):
        if m := _HEADER_PROFILE.match(line):
            profile = m.group(1)
        elif m := _HEADER_SET.match(line):
            sets.append(m.group(1))
    return profile, sets


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two params mappings."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def hand_edits(path: Path | None = None, root: Path | None = None) -> list[str]:
    """Keys of params.yaml whose values differ from what its header's profile and overrides resolve to.

    A file with no header, or one its header cannot resolve (a profile since removed), counts as
    wholly hand-written: ['*'].
    """
    path = path or params_path()
    if not path.exists():
        return []
    text = path.read_text()
    profile, sets = header_of(text)
    if profile is None:
        return ["*"]
    if written_digest(text) == digest(read_params(path)):
        return []  # the values as written: a profile that changed since is no hand edit
    try:
        expected = resolve(profile, sets, root)
    except ConfigError:
        return ["*"]
    return differences(read_params(path), expected)


def write(profile: str = DEFAULT, sets: Sequence[str] = (), path: Path | None = None, root: Path | None = None
          ) -> bool:
    """Resolve and write params.yaml (atomically); True when its text changed.

    Refuses (ConfigError, nothing written) when the file holds values its own header does not
    explain and the new resolution would change, so a hand edit is never lost to a profile switch (an edit
    restated as -S, or one the new profile sets alike, is kept and passes).
    """
    path = path or params_path()
    resolved = resolve(profile, sets, root)
    text = render(resolved, profile, sets)  # a bad profile or -S fails before the check
    if path.exists() and path.read_text() == text:
        return False
    edited = hand_edits(path, root)
    if edited:
        changed = set(differences(read_params(path), resolved))
        edited = (["*"] if changed else []) if edited == ["*"] else [k for k in edited if k in changed]
    if edited:
        keys = "the whole file (no profile header)" if edited == ["*"] else ", ".join(edited[:8])
        raise ConfigError(f"{path}: hand edits not in its profile: {keys}. Pass them as -S key=value (they "
                          f"compose with --profile), or discard them (git checkout {path}), then run again")
    atomic_write_text(path, text)
    return True
