"""A TRL config from a params section: the fields they share by name, what the stage sets, then `trl_args`.

Every training stage builds its TRL (or transformers) config here, so a schema field named as TRL names it reaches
TRL without a line of copying, and any other option of that config is one `<section>.trl_args` entry away: e.g.
`sft.trl_args: {neftune_noise_alpha: 5}` or `grpo.trl_args: {mask_truncated_completions: true, top_k: 50}`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pipeline.core import phases
from pipeline.core.io import ConfigError
from pipeline.core.params import Section, config_fields


def build(config_class: type, cfg: Section, stage_args: dict[str, Any], overrides: dict[str, Any],
          exclude: Collection[str] = ()) -> Any:
    """`config_class(**args)` from, in order: the fields of `cfg` that `config_class` also has (less `exclude`,
    which the stage derives itself), `stage_args` (what the stage computes from its other fields, and the settings
    it always makes), `overrides` (the caller's: a curriculum phase's learning rate, the trackers), and last
    `cfg.trl_args`, which may set only what none of those sets: a key they set is bad params, named with the
    stage. Its unknown keys were refused when the params were read (`pipeline.core.params.check_trl_args`)."""
    fields = config_fields(config_class)
    args = {name: value for name, value in dict(cfg).items() if name in fields and name not in exclude}
    args |= stage_args | overrides
    extra = getattr(cfg, "trl_args", None) or {}
    taken = sorted(set(extra) & set(args))
    if taken:
        raise ConfigError(f"{phases.current_stage or 'run'}: trl_args.{taken[0]}: the stage sets it itself (its own "
                          "params, the tracking section or the run's folders decide it)")
    return config_class(**args, **extra)
