"""python bench/launch_sft.py [--steps 60] [--batch 16]

SFT on 2 CPU processes (`launch.num_processes: 2`, DDP over gloo, one thread each) against the baseline of
1 process with 2 threads, at the same global batch and steps: training samples per second of each, side by
side in one run (the `sft` stage, its rank drill included in the wall time but not in the training rate).
On a CPU this is a correctness feature (the same curve on more processes); no speedup is expected.

The model is the `tiny` profile's at a width where the matrix products dominate (hidden 128, 2 layers).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.orchestration.profiles import resolve
from pipeline.orchestration.workspace import ROOT, copy_project, write_params

TINY_PARAMS = resolve("tiny", root=ROOT)

MODEL = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}


def run_sft(folder: Path, params: dict, env: dict[str, str]) -> tuple[dict, float]:
    write_params(folder, params)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stages.sft"], cwd=folder, env={**os.environ, **env}, check=True,
                   capture_output=True)
    return json.loads((folder / "metrics/sft.json").read_text()), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="SFT optimizer steps")
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences a step)")
    args = parser.parse_args()
    params = copy.deepcopy(TINY_PARAMS)
    params["base"].update(MODEL)
    params["sft"].update(max_steps=args.steps, group_by_length=False, eval_steps=args.steps, logging_steps=10)
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_project(Path(tmp))
        write_params(folder, params)
        for name in ("synthesize", "base"):
            subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=folder, check=True, capture_output=True)
        one = copy.deepcopy(params)
        one["sft"]["per_device_train_batch_size"] = args.batch
        two = copy.deepcopy(params)
        two["sft"]["per_device_train_batch_size"] = args.batch // 2
        two["launch"] = {"num_processes": 2}
        base_metrics, base_wall = run_sft(folder, one, {"OMP_NUM_THREADS": "2"})
        launched, wall = run_sft(folder, two, {})  # the launcher gives each rank 1 thread of the 2 cores
    rate = {name: m["steps"] * args.batch / m["train_seconds"] for name, m in (("one", base_metrics),
                                                                              ("two", launched))}
    print(f"global batch {args.batch}, {args.steps} steps, model {MODEL}")
    print(f"baseline, 1 process x 2 threads: {rate['one']:.1f} samples/s (train loss {base_metrics['train_loss']}, "
          f"stage {base_wall:.1f} s)")
    print(f"2 processes x 1 thread (gloo):   {rate['two']:.1f} samples/s (train loss {launched['train_loss']}, "
          f"stage {wall:.1f} s, world_size {launched['world_size']})")
    print(f"ratio: {rate['two'] / rate['one']:.2f}x the one-process rate")


if __name__ == "__main__":
    main()
