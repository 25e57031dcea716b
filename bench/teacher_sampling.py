"""python bench/teacher_sampling.py [--prompts 96] [--k 4]

Teacher sampling throughput, side by side in one process on the same model,
prompts and sampling params:
1. the pipeline's batched sampler (pipeline.inference.generation.LocalSampler: length-sorted
   batches of `distill.batch_size` sequences, K samples per prompt, finished
   rows leave the batch);
2. transformers' `model.generate` on the same length-sorted batches (finished
   rows stay in the batch until its longest sequence ends);
3. baseline: one `model.generate` call per prompt (its K samples batched together).
Prints tokens/s of each and the ratio. Uses models/teacher when it exists
(run `make run` first), else a freshly built teacher of the default size.
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.data.params import DistillConfig
from pipeline.inference.generation import Generation, LocalSampler
from pipeline.modeling.models import build_teacher, load_tokenizer
from pipeline.training.params import TeacherConfig


def teacher():
    from pipeline.inference.teacher import load_local

    if (paths.model_dir("teacher") / "model.safetensors").exists():
        return load_local(paths.model_dir("teacher")), "models/teacher"
    tokenizer = load_tokenizer(paths.model_dir("base"))
    return (build_teacher(load_section("teacher", TeacherConfig), tokenizer), tokenizer), "untrained default teacher"


def hf_generate(model, tokenizer, prompts: list[str], k: int, cfg: DistillConfig, per_batch: int):
    """transformers' own sampling, `per_batch` prompts (x k samples) per call, tokens counted up to EOS."""
    torch.manual_seed(cfg.seed)
    tokenizer.padding_side = "left"
    order = sorted(prompts, key=len)
    results = []
    for i in range(0, len(order), per_batch):
        enc = tokenizer(order[i : i + per_batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=cfg.max_new_tokens, do_sample=True,
                                 temperature=cfg.temperature, top_p=cfg.top_p, top_k=None, num_return_sequences=k,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for ids in out[:, enc["input_ids"].shape[1] :].tolist():
            n = ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
            results.append([Generation(text="", tokens=n)])
    return results


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
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sequences per batch (default: distill.batch_size)")
    cli = parser.parse_args()
    cfg = load_section("distill", DistillConfig)
    if cli.batch_size:
        cfg.batch_size = cli.batch_size
    k = cli.k or cfg.k
    (model, tokenizer), which = teacher()
    prompts = [r["prompt"] for r in read_rows(paths.split_file("train"))[: cli.prompts]]
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)

    batched = LocalSampler(model, tokenizer, batch_size=cfg.batch_size)
    ours = tokens_per_second(lambda: batched.sample(prompts, n=k, **sampling))

    hf_batched = tokens_per_second(lambda: hf_generate(model, tokenizer, prompts, k, cfg, cfg.batch_size // k))
    base = tokens_per_second(lambda: hf_generate(model, tokenizer, prompts, k, cfg, 1))
    print(f"teacher: {which}; {len(prompts)} prompts x k={k}, max_new_tokens={cfg.max_new_tokens}, "
          f"temperature={cfg.temperature}, batch_size={cfg.batch_size} sequences")
    print(f"{'sampler':<38} {'tokens/s':>9} {'tokens':>7} {'seconds':>8}")
    print(f"{'pipeline batched (LocalSampler)':<38} {ours[0]:>9.0f} {ours[1]:>7} {ours[2]:>8.1f}")
    print(f"{'model.generate, same batches':<38} {hf_batched[0]:>9.0f} {hf_batched[1]:>7} {hf_batched[2]:>8.1f}")
    print(f"{'model.generate, one call per prompt':<38} {base[0]:>9.0f} {base[1]:>7} {base[2]:>8.1f}")
    print(f"speed-up (tokens/s) against one call per prompt: {ours[0] / base[0]:.1f}x "
          f"(model.generate on the same batches: {hf_batched[0] / base[0]:.1f}x)")


if __name__ == "__main__":
    main()
