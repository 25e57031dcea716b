"""python bench/prm_recipe.py --out /tmp/prm-pair '{"pair_weight": 1.0}' [--init /tmp/policy]

One PRM trained the way `python -m stages.prm` trains it, with `prm` params
overridden by the JSON argument, saved to `--out` for `bench/prm_selection.py
--prm` to pick with; `--init DIR` starts it from another policy than
`prm_data.policy` (e.g. one `bench/rank_probe.py --save` drilled otherwise).
Prints the held-out metrics the stage writes to metrics/prm.json. Nothing under
models/, data/ or metrics/ changes. Needs data/prm_data and the policy (`make run`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from pipeline import paths, training
from pipeline.config import PRMConfig, PRMDataConfig, load_section
from pipeline.io import read_rows
from pipeline.models import load_tokenizer, save_model
from pipeline.prm import PRMScorer, prm_from_policy
from stages.prm import STEP_LABEL_COLUMNS, held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="?", default="{}", help="a JSON object of prm params")
    parser.add_argument("--out", type=Path, required=True, help="where the trained PRM is saved")
    parser.add_argument("--init", type=Path, default=None, help="the policy to start from (default: prm_data.policy)")
    args = parser.parse_args()
    cfg = load_section("prm", PRMConfig).model_copy(update=json.loads(args.overrides))
    PRMConfig.model_validate(cfg.model_dump())  # unknown keys and wrong types fail here, before any work
    policy_dir = paths.model_dir(load_section("prm_data", PRMDataConfig).policy)
    data = paths.stage_data("prm_data")
    rows = [r for r in read_rows(data / "train.parquet", required=STEP_LABEL_COLUMNS) if r["source"] in cfg.sources]
    chains = read_rows(data / "chains.parquet", required=STEP_LABEL_COLUMNS) if cfg.chain_weight else []
    val = read_rows(data / "val.parquet", required=STEP_LABEL_COLUMNS)
    training.dvclive_callback = lambda live_dir: TrainerCallback()  # no curves for a sweep
    torch.manual_seed(cfg.seed)  # the data order, as the stage seeds it
    tokenizer = load_tokenizer(policy_dir)
    model = prm_from_policy(args.init or policy_dir, cfg.extra_layers)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trained = training.prm_train(cfg, model, tokenizer, rows + chains, Path(tmp) / "trainer", Path(tmp) / "live")
    metrics, _ = held_out(PRMScorer(model, tokenizer, cfg.batch_size), val)
    save_model(model, tokenizer, args.out)
    print(json.dumps({"overrides": json.loads(args.overrides), "init": str(args.init or policy_dir),
                      "seconds": round(time.perf_counter() - start, 1), **trained, "held_out": metrics}))


if __name__ == "__main__":
    main()
