"""python -m stages.dpo

Direct preference optimisation from the SFT model with TRL's DPOTrainer, on the
preference pairs that `dpo.pairs` selects: the SFT policy's own right vs wrong
rollouts (data/mine/pairs.parquet), the teacher's (data/distill/pairs.parquet), or both.

Curves through dvclive into plots/dpo/, the summary into metrics/dpo.json, the
model into models/dpo/.
"""

from __future__ import annotations

import os
import shutil

from pipeline.core import paths
from pipeline.core.io import atomic_dir, live_atomic_dir, read_rows, write_metrics
from pipeline.core.params import load_section
from pipeline.core.phases import stage_logger
from pipeline.core.plots import fill_skipped
from pipeline.modeling import cards, lora
from pipeline.modeling.models import MASTER_DTYPE, load_model
from pipeline.modeling.params import LoraConfig
from pipeline.orchestration import launch
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.rl.params import DPOStageConfig
from pipeline.training.trainer import dpo_train, require_update, unmoved

PAIR_FILES = {"mine": [paths.split_file("pairs", stage="mine")],
              "distill": [paths.split_file("pairs", stage="distill")]}
PAIR_FILES["both"] = PAIR_FILES["mine"] + PAIR_FILES["distill"]


def _flow(cfg: DPOStageConfig, lora_cfg: LoraConfig) -> None:
    files = PAIR_FILES[cfg.pairs]
    pairs = [row for f in files for row in read_rows(f, required=("prompt", "chosen", "rejected", "source"))]
    model, tokenizer = load_model(paths.model_dir("sft"), dtype=MASTER_DTYPE)
    model = lora.wrap(model, lora_cfg, "dpo", cfg.seed) if pairs else model
    with atomic_dir(paths.model_dir("dpo")) as out, live_atomic_dir(paths.live_dir("dpo")) as live:
        if pairs:
            metrics = {"source": cfg.pairs, **dpo_train(cfg, model, tokenizer, pairs, out / ".trainer", live)}
            require_update("dpo", unmoved(metrics), cfg.allow_no_update)
        else:  # a policy with no right (or no wrong) rollouts: nothing to prefer; say so, keep the DAG going
            stage_logger().warning("dpo: no preference pairs in %s; models/dpo is the SFT model unchanged",
                                   ", ".join(map(str, files)))
            fill_skipped(live, "dpo", "no preference pairs: the SFT model unchanged")
            metrics = {"source": cfg.pairs, "pairs": 0, "steps": 0, "weights_changed": 0.0, "elements_changed": 0.0,
                       "world_size": int(os.environ.get("WORLD_SIZE", 1)) if launch.in_rank() else 1}
        metrics.update(lora.summary(model, lora_cfg))
        stage_logger().info("dpo: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        lora.save(model, tokenizer, out, lora_cfg, base=paths.model_dir("sft"))
        cards.write_model_manifest(out, "dpo", cfg, inputs=[paths.model_dir("sft"), *files],
                                   metrics=metrics, **lora.manifest(lora_cfg, "dpo"))
    write_metrics(paths.metrics_file("dpo"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("dpo", DPOStageConfig)
        lora_cfg = load_section("lora", LoraConfig)
    run_stage("dpo", _flow, cfg, lora_cfg)


if __name__ == "__main__":
    main()
