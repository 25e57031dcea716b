"""Every params section at once, and the checks across sections and against this machine, before any work.

`python -m pipeline repro` (and the repro flow) run `validate_all` before DVC starts, so that bad params fail
before DVC deletes a stage's outputs. The checks that need the library (a model's tokenizer, vLLM, the generator's
function names, this machine's GPUs) live here, above it; each section's own rules stay in its schema
(`pipeline/<room>/params.py`), which every stage reads.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.io import ConfigError
from pipeline.core.params import Section, giving, params_path, parse_section, read_params
from pipeline.core.registry import TRAINING_STAGES
from pipeline.data.cof.core import parse_held_out
from pipeline.orchestration import launch
from pipeline.orchestration.checks import check_attention, check_packing, check_task_fit, check_vllm_loads_whole_models
from pipeline.orchestration.sections import SECTIONS
from pipeline.rl import vllm_server  # a server the grpo stage starts: GPUs for it beside the training


def validate_all(path: Path | None = None) -> dict[str, Section]:
    """Every known section at once (used by `python -m pipeline repro` before it starts DVC)."""
    path = path or params_path()
    data = read_params(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown section (known: {', '.join(SECTIONS)})")
    sections = {name: parse_section(name, model, data.get(name), path, complete=True)
                for name, model in SECTIONS.items()}
    parse_held_out(sections["synthesize"].ood_held_out_pairs, path)  # the generator's names, before DVC deletes
    # torch and transformers load here, when validating, not when the CLI imports this module (`pipeline report`)
    from pipeline.inference.engines import require_vllm
    from pipeline.modeling.models import check_models

    check_task_fit(sections["task"], sections["prm"], path, sections["rewards"])
    with giving(sections["model"]):  # tokenizers load as the stages will load them (trust_remote_code)
        check_models(sections["prompt"], sections["base"], sections["teacher"], path)
    check_vllm_loads_whole_models(sections["generation"], sections["grpo"], sections["lora"], path)
    if sections["generation"].engine == "vllm":
        require_vllm("generation.engine", path)
    if sections["grpo"].use_vllm:
        require_vllm("grpo.use_vllm", path)
        if vllm_server.starts_server(sections["grpo"]):
            plan = launch.plan_for("grpo", sections["launch"])
            vllm_server.split_gpus(sections["grpo"], plan.num_processes if plan else 1, vllm_server.visible_gpus(),
                                   path)
    for key, train in (("sft", sections["sft"]), ("teacher.train", sections["teacher"].train)):
        check_packing(train, sections["model"], key, path)
    check_attention(sections["model"], path)
    for stage in TRAINING_STAGES:
        if (plan := launch.plan_for(stage, sections["launch"])) is not None:
            launch.check(plan, sections["lora"])
    return sections
