"""python bench/smollm2.py [--batch 32] [--new-tokens 128] [--prompts 64] [--steps 3] [--parts decode,roofline,sft,grpo]

The pipeline on a real pretrained model, SmolLM2-135M-Instruct (pretrained/SmolLM2-135M-Instruct; fetched and
converted first when missing: `python -m pipeline fetch smollm2`), side by side in one process:

- decode: greedy and sampled tokens/s of the pipeline's decode loop (pipeline.inference.generation.generate: a KV cache,
  finished rows leave the batch) against transformers' `model.generate` on the same chart questions, rendered
  through the model's chat template, in the same length-sorted batches of `--batch` sequences, `--new-tokens`
  at most (tokens counted up to and including the end-of-turn token);
- roofline: the machine's limit for that decode loop, measured in the same run: per decoding step, the slower of
  its FLOPs (2 x parameters x batch, plus attention over the cache) at the measured float32 matrix-product rate
  and the bytes of weights it reads at the measured memory bandwidth; the loop's tokens/s as a share of it;
- sft: seconds per optimizer step of the pipeline's SFT trainer (on a CPU its plain-LM-head subclass) against
  TRL's own SFTTrainer, same rows, batch 8 and arguments (training.trainer_args);
- grpo: seconds per optimizer step of the pipeline's GRPO (TRL's GRPOTrainer with the pipeline's rollout function)
  against raw TRL generating with its own `model.generate`, same GRPOConfig (2 prompts x 4 rollouts, 96 tokens).

Prints one line per measurement and the ratios; BENCHMARKS.md has the results with this command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

SYSTEM = "Answer the question about the chart's table. Reason in short steps, one per line, then end with a line " \
         "'Answer: <answer>'."


def questions(n: int) -> list[dict]:
    """Chart test questions of the default generator, with their gold rationales."""
    from pipeline.data.cof.generate import generate_dataset
    from pipeline.data.params import SynthesizeConfig

    rows, _ = generate_dataset(SynthesizeConfig(n_train=max(n, 8), n_val=1, n_test=n, n_ood=0, render_charts=0))
    return rows


def rendered(tokenizer, rows: list[dict]) -> list[str]:
    from pipeline.modeling import chat
    from pipeline.modeling.params import PromptConfig

    chat.use(PromptConfig(format="chat", system=SYSTEM))
    return [chat.render(tokenizer, r["prompt"]) for r in rows]


def hf_generate(model, tokenizer, texts: list[str], batch: int, new_tokens: int, sample: bool) -> int:
    """transformers' generate on the same length-sorted batches; tokens up to and including EOS."""
    order = sorted(texts, key=len)
    tokens = 0
    torch.manual_seed(0)
    for i in range(0, len(order), batch):
        enc = tokenizer(order[i : i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=sample,
                                 temperature=0.8 if sample else None, top_p=None, top_k=None,
                                 eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        for ids in out[:, enc["input_ids"].shape[1] :].tolist():
            tokens += ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
    return tokens


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def decode_part(model, tokenizer, texts: list[str], args) -> dict:
    from pipeline.inference.generation import generate

    out = {}
    for mode, sample in (("greedy", False), ("sampled", True)):
        ours_s, gens = timed(lambda: generate(model, tokenizer, texts, max_new_tokens=args.new_tokens,
                                              batch_size=args.batch, do_sample=sample, temperature=0.8,
                                              progress=False))
        ours = sum(g.tokens for gs in gens for g in gs)
        hf_s, theirs = timed(lambda: hf_generate(model, tokenizer, texts, args.batch, args.new_tokens, sample))
        out[mode] = {"pipeline": ours / ours_s, "generate": theirs / hf_s, "tokens": ours,
                     "lengths": [gs[0].tokens for gs in gens]}
        print(f"decode {mode}: pipeline {ours / ours_s:.1f} tokens/s ({ours} tokens in {ours_s:.1f} s), "
              f"model.generate {theirs / hf_s:.1f} tokens/s ({theirs} tokens in {hf_s:.1f} s): "
              f"{(ours / ours_s) / (theirs / hf_s):.2f}x", flush=True)
    return out


def matmul_rate(n: int = 1024, repeats: int = 20) -> float:
    """Measured float32 matrix-product rate, FLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def bandwidth(megabytes: int = 1024, repeats: int = 5) -> float:
    """Measured memory read bandwidth, bytes/s: summing a float32 array far larger than any cache."""
    x = torch.ones(megabytes * (1 << 20) // 4)
    x.sum()
    start = time.perf_counter()
    for _ in range(repeats):
        x.sum()
    return x.numel() * 4 * repeats / (time.perf_counter() - start)


def roofline_part(model, texts: list[str], tokenizer, decode: dict, args) -> dict:
    """The machine's limit for the greedy run of the decode loop, step by step: the prefill of each batch, then
    each decoding step with the rows still alive (a row leaves at its end-of-turn token), each costing the slower
    of its FLOPs at the measured matrix-product rate and one read of the weights at the measured bandwidth."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    per_token = 2 * params  # FLOPs of one token through the weights
    attention = 2 * 2 * cfg.num_hidden_layers * cfg.hidden_size  # QK^T and AV, a token and a cached position
    weights = params * 4  # float32, read once a forward pass whatever the batch
    rate, bytes_per_s = matmul_rate(), bandwidth()

    def cost(flops: float) -> float:
        return max(flops / rate, weights / bytes_per_s)

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # the decode loop's batches
    lengths = decode["greedy"]["lengths"]
    limit = 0.0
    for start in range(0, len(order), args.batch):
        batch = order[start : start + args.batch]
        prompt = max(len(ids) for ids in tokenizer([texts[i] for i in batch], add_special_tokens=False)["input_ids"])
        limit += cost(len(batch) * prompt * (per_token + attention * prompt / 2))
        for step in range(1, max(lengths[i] for i in batch)):
            alive = sum(lengths[i] > step for i in batch)
            limit += cost(alive * (per_token + attention * (prompt + step)))
    tokens = sum(lengths)
    ceiling = tokens / limit
    out = {"matmul_gflops": rate / 1e9, "bandwidth_gbs": bytes_per_s / 1e9, "limit_tokens_per_s": ceiling,
           "share_greedy": decode["greedy"]["pipeline"] / ceiling}
    full = args.batch * per_token
    print(f"roofline: {rate / 1e9:.0f} GFLOP/s (float32 products), {bytes_per_s / 1e9:.1f} GB/s (reads); a full "
          f"step of {args.batch} rows {full / 1e9:.2f} GFLOP ({full / rate * 1e3:.0f} ms) against "
          f"{weights / 1e6:.0f} MB of weights ({weights / bytes_per_s * 1e3:.0f} ms); over this run's "
          f"prefills and steps (rows leaving at their end) {ceiling:.0f} tokens/s at most: the loop reaches "
          f"{out['share_greedy']:.0%} of it greedy", flush=True)
    return out


def sft_part(folder: Path, rows: list[dict], args) -> dict:
    from trl import SFTTrainer

    from pipeline.modeling.models import MASTER_DTYPE, load_model
    from pipeline.training.params import TrainConfig
    from pipeline.training.trainer import StepTimer, prompt_completion_dataset, sft_trainer_class, trainer_args

    out = {}
    for name, cls in (("pipeline", sft_trainer_class()), ("trl", SFTTrainer)):
        model, tokenizer = load_model(folder, dtype=MASTER_DTYPE, device="cpu")
        cfg = TrainConfig(max_steps=args.steps + 1, per_device_train_batch_size=8, learning_rate=5e-5,
                          logging_steps=100, group_by_length=False)
        timer = StepTimer()
        with tempfile.TemporaryDirectory() as tmp:
            trainer = cls(model=model, args=trainer_args(cfg, Path(tmp), eval_strategy="no"),
                          processing_class=tokenizer, callbacks=[timer],
                          train_dataset=prompt_completion_dataset(rows[: 8 * (args.steps + 1)]))
            trainer.train()
        out[name] = statistics.median(timer.times[1:])  # the first step pays for warming up
        print(f"sft step ({name}): {out[name]:.1f} s (median of {len(timer.times) - 1})", flush=True)
    print(f"sft step: pipeline / TRL = {out['pipeline'] / out['trl']:.2f}", flush=True)
    return out


def grpo_part(folder: Path, rows: list[dict], args) -> dict:
    from accelerate.state import AcceleratorState
    from trl import GRPOTrainer

    from pipeline.modeling.models import MASTER_DTYPE, load_model
    from pipeline.rl.grpo import GuidedRollout, grpo_args, rl_dataset
    from pipeline.rl.params import GRPOStageConfig, RewardsConfig
    from pipeline.rl.rewards import build_rewards
    from pipeline.training.trainer import StepTimer

    cfg = GRPOStageConfig(max_steps=args.steps + 1, prompts_per_step=2, num_generations=4, max_completion_length=96,
                          learning_rate=2e-5, warmup_steps=0, logging_steps=1, guided_replay=False)
    rewards = RewardsConfig(weights={"accuracy": 1.0, "format": 0.1})
    funcs, weights = build_rewards(rewards)
    pool = [{**r, "step_values": [s["value"] for s in r["steps"]]} for r in rows]
    out = {}
    for name in ("pipeline", "trl"):
        AcceleratorState._reset_state(reset_partial_state=True)
        model, tokenizer = load_model(folder, dtype=MASTER_DTYPE, device="cpu")
        timer = StepTimer()
        rollout = None
        if name == "pipeline":
            rollout = GuidedRollout({r["prompt"]: r for r in pool}, num_generations=4, max_new_tokens=96,
                                    temperature=cfg.temperature, top_p=cfg.top_p, seed=0, replay=False)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=grpo_args(cfg, weights, Path(tmp)),
                                  train_dataset=rl_dataset(pool), processing_class=tokenizer, rollout_func=rollout,
                                  callbacks=[timer])
            trainer.train()
        out[name] = statistics.median(timer.times[1:])
        print(f"grpo step ({name}): {out[name]:.1f} s (median of {len(timer.times) - 1})", flush=True)
    print(f"grpo step: pipeline / TRL = {out['pipeline'] / out['trl']:.2f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="sequences decoded together")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated at most per sequence")
    parser.add_argument("--prompts", type=int, default=64, help="chart questions decoded (each once)")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps of SFT and GRPO (after one more)")
    parser.add_argument("--parts", default="decode,roofline,sft,grpo", help="which measurements, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    from pipeline.modeling import pretrained
    from pipeline.modeling.chat import use
    from pipeline.modeling.models import load_model
    from pipeline.modeling.params import PromptConfig

    folder = pretrained.fetch("smollm2")
    rows = questions(args.prompts)
    print(f"SmolLM2-135M-Instruct ({folder}), {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.new_tokens} new tokens at most, {args.prompts} chart questions", flush=True)
    use(PromptConfig(format="chat", system=SYSTEM))  # the trainers render the chat template too
    if parts & {"decode", "roofline"}:
        model, tokenizer = load_model(folder, dtype=torch.float32, device="cpu")
        texts = rendered(tokenizer, rows["test"])
        decode = decode_part(model, tokenizer, texts, args)
        if "roofline" in parts:
            roofline_part(model, texts, tokenizer, decode, args)
    if "sft" in parts:
        sft_part(folder, rows["train"], args)
    if "grpo" in parts:
        grpo_part(folder, rows["train"], args)


if __name__ == "__main__":
    main()
