"""python -m stages.base

The student before SFT. By default built here: a BPE tokenizer trained on the
synthetic training corpus, a small Qwen2 from `base` params, then the
table-reading drills of `base.drills` (pipeline/training/drills.py) on new random
tables, without which it never learns to read a key's number from the table
(the chart task only: a student for a text dataset, `task.kind: dataset`, skips them).
How well it does depends on the initial weights: with `base.drills.restarts`
above 0, an init that reads fewer than `base.drills.gate` of held-out lookups
is replaced by the next seed, at most that many times (the `research` profile
retries twice; the quick default drills one init and logs a warning below the gate).
When `base.model` names a Hugging Face model, that model as it is (no drills); with
`prompt.format: chat` its tokenizer must carry a chat template (a built one gets one).
Writes models/base/, metrics/base.json and the drills' curves in plots/base/.
"""

from __future__ import annotations

from pipeline.core import paths
from pipeline.core.io import atomic_dir, live_atomic_dir, read_rows, write_json, write_metrics
from pipeline.core.params import giving, load_section
from pipeline.core.phases import stage_logger
from pipeline.core.plots import fill_skipped
from pipeline.data.params import SynthesizeConfig, TaskConfig
from pipeline.modeling import cards
from pipeline.modeling.models import (
    base_model,
    build_student,
    check_models,
    count_parameters,
    default_device,
    save_model,
)
from pipeline.modeling.params import BaseModelConfig, ModelLoadConfig, PromptConfig
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.training.drills import curve_log, drill_until_read
from pipeline.training.trainer import snapshot, weights_changed


def _flow(cfg: BaseModelConfig, synth: SynthesizeConfig, task_cfg: TaskConfig) -> None:
    train_file = paths.split_file("train")
    rows = read_rows(train_file, required=("prompt", "rationale"))
    model, tokenizer = base_model(cfg, rows)
    sample = [r["prompt"] + r["rationale"] for r in rows[:500]]
    tokens = [len(ids) for ids in tokenizer(sample, add_special_tokens=False)["input_ids"]]
    metrics = {
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "tokens_per_example": round(sum(tokens) / len(tokens), 1),
        "max_tokens_per_example": max(tokens),
        "chars_per_token": round(sum(map(len, sample)) / sum(tokens), 2),
    }
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and (over := sum(t > positions for t in tokens)):  # large tables (synthesize.max_categories, ...)
        stage_logger().warning("base: %d of the first %d training rows are longer than the model's %d positions "
                               "(max_position_embeddings; the longest %d tokens): raise base.max_position_embeddings "
                               "or make the tables smaller", over, len(tokens), positions, max(tokens))
    with atomic_dir(paths.model_dir("base")) as tmp, live_atomic_dir(paths.live_dir("base")) as live_dir:
        if not cfg.model and task_cfg.kind != "cof":
            # The drills read chart tables: a student for a text dataset starts from its init.
            model = build_student(cfg, tokenizer).to(default_device())
            reason = f"none: task.kind is {task_cfg.kind} (the drills read chart tables)"
            stage_logger().info("base: drills skipped (%s)", reason)
            write_json(live_dir / "metrics.json", {"drills": reason})
            fill_skipped(live_dir, "base", "drills skipped: the task has no chart tables")
            metrics |= {"drills": reason, "init_seed": cfg.seed}
        elif not cfg.model:
            with curve_log(live_dir) as log:

                def build(seed: int):
                    return build_student(cfg.model_copy(update={"seed": seed}), tokenizer).to(default_device())

                model, drills, attempts = drill_until_read(build, cfg.seed, tokenizer, cfg.drills, synth, log)
            fill_skipped(live_dir, "base", "no checks: base.drills.check_every is 0")  # the check curves' stand-ins
            init_seed = next(a["seed"] for a in attempts if a["kept"])
            start = snapshot(build(init_seed))  # seeded: the kept init's weights before the drills
            read = drills.get("numbers", {}).get("exact")
            if read is not None and read < cfg.drills.gate:
                # SFT and everything after it inherit a misread table (docs/experiments/numeric-lookup-clicks.md).
                stage_logger().warning("numbers drill: %.3f of held-out lookups right after %d inits; none learned the "
                                       "lookup (another base.seed or vocab_size may)", read, len(attempts))
            metrics |= {"drills": drills, "init_seed": init_seed, "inits": attempts,
                        "weights_changed": weights_changed(start, model)}
        else:
            write_json(live_dir / "metrics.json", {"drills": f"none: {cfg.model} is loaded, not built"})
            fill_skipped(live_dir, "base", "no drills: the model is loaded, not built")
        stage_logger().info("base model: %s", metrics)
        save_model(model, tokenizer, tmp)
        cards.write_model_manifest(tmp, "base", cfg, inputs=[train_file], metrics=metrics)
    write_metrics(paths.metrics_file("base"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("base", BaseModelConfig)
        synth = load_section("synthesize", SynthesizeConfig)
        task_cfg = load_section("task", TaskConfig)
        with giving(load_section("model", ModelLoadConfig)):  # its tokenizer loads as the stage will load it
            check_models(load_section("prompt", PromptConfig), base=cfg)  # a loaded model needs a template for chat
    run_stage("base", _flow, cfg, synth, task_cfg)


if __name__ == "__main__":
    main()
