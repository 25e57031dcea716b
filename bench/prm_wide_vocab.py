"""python bench/prm_wide_vocab.py [--vocab 151936] [--hidden 896] [--layers 2] [--paths 256] [--batch 64]

What reading each token's own logit buys a PRM whose vocabulary is a real tokenizer's (Qwen2.5's 151,936 by
default) rather than the embedded default's 952. A Qwen2 of that width is built from a config (random weights:
nothing can be downloaded here, and neither time nor memory depends on the weights) and scores the first
`--paths` held-out paths of data/prm_data/val.parquet (the pipeline's tokenizer: ids stay below its vocabulary;
the head still has every row) with `pipeline.prm.model.PRMScorer` twice, each in a fresh process:

- `plain`: the default, each verdict one dot product through the plain LM head;
- `full`: `full_logits=True`, the whole vocabulary at every position (what the scorer did before).

Prints, for each, the seconds (best of `--repeats`), candidates/s and the peak memory that scoring added (the
process's resident high-water mark after scoring minus after building the model; on a GPU, the peak allocated).
Needs data/prm_data and models/prm (the tokenizer), i.e. `make run` first.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

MODES = ("plain", "full")


def measure(args) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pipeline.core import paths
    from pipeline.core.io import read_rows
    from pipeline.modeling.models import default_device, load_tokenizer
    from pipeline.prm.model import PRMScorer

    tokenizer = load_tokenizer(paths.model_dir("prm"))
    rows = read_rows(paths.split_file("val", "prm_data"))[: args.paths]
    prompts, lines = [r["prompt"] for r in rows], [list(r["steps"]) for r in rows]
    torch.manual_seed(0)
    heads = max(args.hidden // 64, 1)
    kv_heads = max(d for d in range(1, max(heads // 7, 1) + 1) if heads % d == 0)  # Qwen2.5-0.5B: 14 and 2
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                         num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    device = torch.device(default_device())
    model = Qwen2ForCausalLM(config).to(device).eval()
    scorer = PRMScorer(model, tokenizer, batch_size=args.batch, full_logits=args.mode == "full")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        scorer.score(prompts, lines)
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": args.mode, "device": str(device), "head": scorer.head is not None, "seconds": best,
            "candidates": len(set(zip(prompts, map(tuple, lines)))), "added_gib": (peak - base) / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--paths", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one measurement, in a child process
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args)))
        return
    print(f"Qwen2, vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers; {args.paths} held-out paths, "
          f"batch {args.batch}")
    results = {}
    for mode in MODES:  # each printed as it comes: a time limit or a failure (out of memory) keeps the ones before
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode], capture_output=True,
                               text=True)
        if child.returncode:
            print(f"{mode:6} failed (exit {child.returncode}):\n{child.stderr[-2000:]}", flush=True)
            continue
        r = results[mode] = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"{mode:6} on {r['device']}: {r['seconds']:7.2f} s, {r['candidates'] / r['seconds']:7.1f} candidates/s, "
              f"scoring added {r['added_gib']:6.2f} GiB (plain head used: {r['head']})", flush=True)
    if len(results) == len(MODES):
        plain, full = results["plain"], results["full"]
        print(f"plain / full: {full['seconds'] / plain['seconds']:.2f}x faster, "
              f"{full['added_gib'] / max(plain['added_gib'], 1e-3):.1f}x less added memory")


if __name__ == "__main__":
    main()
