"""python bench/teacher_sampling.py [--prompts 96] [--k 4]

Teacher sampling throughput, side by side in one process on the same model,
prompts and sampling params:
1. the pipeline's batched sampler (pipeline.generation.LocalSampler: length-sorted
   batches of `distill.batch_size` sequences, K samples per prompt);
2. baseline: one `generate` call per prompt (its K samples still batched together).
Prints tokens/s of each and the ratio. Uses models/teacher when it exists
(run `make run` first), else a freshly built teacher of the default size.
"""

from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

from pipeline import paths
from pipeline.config import DistillConfig, TeacherConfig, load_section
from pipeline.generation import LocalSampler, generate
from pipeline.io import read_rows


def teacher():
    from pipeline.teacher import load_local

    if (paths.model_dir("teacher") / "model.safetensors").exists():
        return load_local(paths.model_dir("teacher")), "models/teacher"
    from stages.teacher import build

    tokenizer = AutoTokenizer.from_pretrained(str(paths.model_dir("base")))
    return (build(load_section("teacher", TeacherConfig), tokenizer), tokenizer), "untrained default teacher"


def tokens_per_second(fn) -> tuple[float, int, float]:
    start = time.perf_counter()
    results = fn()
    seconds = time.perf_counter() - start
    tokens = sum(g.tokens for gens in results for g in gens)
    return tokens / seconds, tokens, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--k", type=int, default=None, help="samples per prompt (default: distill.k)")
    cli = parser.parse_args()
    cfg = load_section("distill", DistillConfig)
    k = cli.k or cfg.k
    (model, tokenizer), which = teacher()
    prompts = [r["prompt"] for r in read_rows(paths.split_file("train"))[: cli.prompts]]
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)

    batched = LocalSampler(model, tokenizer, batch_size=cfg.batch_size)
    ours = tokens_per_second(lambda: batched.sample(prompts, n=k, **sampling))

    def one_call_per_prompt():
        return [
            generate(model, tokenizer, [p], max_new_tokens=cfg.max_new_tokens, do_sample=True,
                     temperature=cfg.temperature, top_p=cfg.top_p, num_return_sequences=k, seed=cfg.seed,
                     progress=False)[0]
            for p in prompts
        ]

    base = tokens_per_second(one_call_per_prompt)
    print(f"teacher: {which}; {len(prompts)} prompts x k={k}, max_new_tokens={cfg.max_new_tokens}, "
          f"temperature={cfg.temperature}, batch_size={cfg.batch_size} sequences")
    print(f"{'sampler':<38} {'tokens/s':>9} {'tokens':>7} {'seconds':>8}")
    print(f"{'pipeline batched (LocalSampler)':<38} {ours[0]:>9.0f} {ours[1]:>7} {ours[2]:>8.1f}")
    print(f"{'one generate call per prompt':<38} {base[0]:>9.0f} {base[1]:>7} {base[2]:>8.1f}")
    print(f"speed-up (tokens/s): {ours[0] / base[0]:.1f}x")


if __name__ == "__main__":
    main()
