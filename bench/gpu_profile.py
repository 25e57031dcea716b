"""python bench/gpu_profile.py OUT_DIR [--profile gpu] [--tiny]

Throughput of the `gpu` profile's student on this machine's GPU, built at random init (nothing is carried
there): first the bf16 matrix-product rate measured on the device, then

- SFT steps on packed sequences (TRL's SFTTrainer with the profile's `sft` settings),
- greedy evaluation through the pipeline's decode loop (the HF engine) and, when vLLM is installed, vLLM on the
  same prompts (the ratio is the target: vLLM at least 5x),
- PRM scoring of chains (pipeline.prm.model.PRMScorer),
- GRPO steps (pipeline.rl.grpo.rl_train, rollouts from the decode loop, the profile's `grpo` settings).

Each part records tokens/s at the lengths and batch sizes it states, and training parts their model FLOPs
utilisation (6 x parameters x tokens a second) against the measured matrix rate and the datasheet's peak.
Results go to OUT_DIR/gpu_profile.json, rewritten after every part (a part that fails records its error, the
next still runs). `--tiny` runs the same parts on the `tiny` profile's model at toy sizes: the CPU check that
the script works before it spends a GPU's time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
import traceback
from pathlib import Path

import torch

from pipeline.orchestration.workspace import ROOT

# Dense bf16 tensor-core peaks from the vendors' datasheets (SXM parts), TFLOP/s.
DATASHEET_BF16 = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_rate(n: int, repeats: int) -> float:
    """Measured bf16 (fp32 on a CPU) matrix-product rate, TFLOP/s, on n x n x n products."""
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    a, b = (torch.randn(n, n, device=device(), dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def corpus(n: int) -> list[dict]:
    """Chart questions with their gold rationales (the default generator), the rows every part reads."""
    from pipeline.data.cof.generate import generate_dataset
    from pipeline.data.params import SynthesizeConfig

    rows, _ = generate_dataset(SynthesizeConfig(n_train=n, n_val=1, n_test=1, n_ood=0, render_charts=0))
    return rows["train"]


def build(profile: dict, rows: list[dict], folder: Path):
    """The profile's student at random init, in the `model` section's dtype, on the device; its tokenizer. Saved
    in `folder` too, as a stage saves a model: GRPO's frozen reference and vLLM load it from there."""
    from pipeline.modeling.models import build_student, count_parameters, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    cfg = BaseModelConfig(**profile["base"])
    tokenizer = train_tokenizer([r["prompt"] + r["rationale"] for r in rows], cfg.vocab_size, cfg.digits)
    model = build_student(cfg, tokenizer)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(profile["model"]["dtype"], torch.float32)
    if not torch.cuda.is_available():
        dtype = torch.float32
    model = model.to(device=device(), dtype=dtype)
    if profile["model"].get("attn_implementation"):
        model.config._attn_implementation = profile["model"]["attn_implementation"]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    embedding = model.get_input_embeddings().weight.numel()
    return model, tokenizer, {"parameters": count_parameters(model), "non_embedding_parameters":
                              count_parameters(model) - embedding, "vocab": len(tokenizer), "dtype": str(dtype)}


def step_clock():
    """`pipeline.training.trainer.StepTimer` with the device synchronised at both ends of a step (its kernels
    finished)."""
    from pipeline.training.trainer import StepTimer

    class SyncedStepTimer(StepTimer):
        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            super().on_step_begin(args, state, control, **kwargs)

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            super().on_step_end(args, state, control, **kwargs)

    return SyncedStepTimer()


def mfu(parameters: int, tokens_per_second: float, rates: dict) -> dict:
    """Model FLOPs utilisation of training (6 N FLOPs a token) against each rate (TFLOP/s)."""
    flops = 6 * parameters * tokens_per_second / 1e12
    return {"model_tflops": round(flops, 2), **{f"mfu_vs_{k}": round(flops / v, 4) for k, v in rates.items() if v}}


def trainable(model):
    """A copy in float32, as the training stages load a model (`pipeline.modeling.models.MASTER_DTYPE`): the trainer
    then computes in bfloat16 by autocast on a GPU while AdamW updates float32 weights."""
    import copy

    from pipeline.modeling.models import MASTER_DTYPE

    return copy.deepcopy(model).to(MASTER_DTYPE)


def sft(profile: dict, model, tokenizer, rows, info: dict, rates: dict, steps: int, warmup: int) -> dict:
    from trl import SFTTrainer

    from pipeline.training.params import SFTConfig
    from pipeline.training.trainer import prompt_completion_dataset, trainer_args

    cfg = SFTConfig(**profile["sft"])
    model = trainable(model)
    batch = cfg.per_device_train_batch_size
    if cfg.torch_compile:  # the first step compiles, the next new batch length recompiles with dynamic shapes
        warmup = max(warmup, 5)
    while True:
        clock = step_clock()
        with tempfile.TemporaryDirectory() as work:
            args = trainer_args(cfg, Path(work), max_steps=warmup + steps, logging_steps=1, eval_strategy="no",
                                num_train_epochs=1, per_device_train_batch_size=batch)
            trainer = SFTTrainer(model=model, args=args, train_dataset=prompt_completion_dataset(rows),
                                 processing_class=tokenizer, callbacks=[clock])
            try:
                trainer.train()
                break
            except torch.OutOfMemoryError:
                del trainer
                torch.cuda.empty_cache()
                if batch == 1:
                    raise
                batch //= 2
    tokens = [log["num_tokens"] for log in trainer.state.log_history if "num_tokens" in log]
    timed_tokens = tokens[-1] - tokens[warmup - 1] if len(tokens) > warmup else 0
    seconds = sum(clock.times[warmup:])
    rate = timed_tokens / seconds
    return {"packing": cfg.packing, "max_length": cfg.max_length, "batch_sequences": batch,
            "gradient_checkpointing": cfg.gradient_checkpointing, "torch_compile": cfg.torch_compile,
            "warmup_steps": warmup, "timed_steps": len(clock.times) - warmup,
            "tokens_per_step": round(timed_tokens / max(len(clock.times) - warmup, 1)),
            "seconds_per_step": round(seconds / max(len(clock.times) - warmup, 1), 4),
            "tokens_per_second": round(rate), **mfu(info["parameters"], rate, rates),
            "peak_memory_gb": (round(torch.cuda.max_memory_allocated() / 2**30, 1)
                               if torch.cuda.is_available() else None)}


def greedy(model, tokenizer, rows, batch: int, new_tokens: int) -> dict:
    """The pipeline's decode loop, greedy, with no early stop (every row writes `new_tokens`): tokens/s."""
    from pipeline.inference.generation import decode, pad, pad_id

    prompts = [r["prompt"] for r in rows[:batch]]
    ids, mask = pad(tokenizer(prompts)["input_ids"], pad_id(tokenizer), left=True)
    ids, mask = ids.to(model.device), mask.to(model.device)
    model.eval()
    decode(model, ids[:2], mask[:2], 4, -1, None)  # warm-up (EOS -1: no row stops early)
    sync()
    start = time.perf_counter()
    out = decode(model, ids, mask, new_tokens, -1, None)
    sync()
    seconds = time.perf_counter() - start
    written = sum(len(o) for o in out)
    return {"engine": "hf (pipeline.inference.generation.decode)", "prompts": len(prompts), "prompt_tokens_mean":
            round(float(mask.sum()) / len(prompts), 1), "new_tokens_each": new_tokens, "new_tokens": written,
            "seconds": round(seconds, 3), "tokens_per_second": round(written / seconds)}


def vllm_greedy(model, tokenizer, rows, batch: int, new_tokens: int) -> dict:
    """vLLM on the same prompts and lengths (the student saved to a folder first), when vLLM is installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed on this machine"}
    from vllm import LLM, SamplingParams

    llm = LLM(model.config._name_or_path, dtype="bfloat16", gpu_memory_utilization=0.5)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [r["prompt"] for r in rows[:batch]]
    llm.generate(prompts[:2], params)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    written = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"engine": "vllm", "prompts": len(prompts), "new_tokens_each": new_tokens, "new_tokens": written,
            "seconds": round(seconds, 3), "tokens_per_second": round(written / seconds)}


def prm_scoring(model, tokenizer, rows, batch: int) -> dict:
    from pipeline.prm.model import PRM_MARK, PRMScorer

    setattr(model.config, PRM_MARK, "next_token")
    scorer = PRMScorer(model, tokenizer, batch_size=batch)
    prompts = [r["prompt"] for r in rows]
    lines = [r["rationale"].split("\n") for r in rows]
    scorer.score(prompts[:batch], lines[:batch])  # warm-up
    scorer.tokens = 0
    sync()
    start = time.perf_counter()
    scorer.score(prompts, lines)
    sync()
    seconds = time.perf_counter() - start
    return {"paths": len(prompts), "batch_paths": batch, "lines": sum(map(len, lines)), "tokens": scorer.tokens,
            "seconds": round(seconds, 3), "paths_per_second": round(len(prompts) / seconds, 1),
            "tokens_per_second": round(scorer.tokens / seconds)}


def grpo(profile: dict, model, tokenizer, rows, info: dict, rates: dict, steps: int) -> dict:
    from pipeline.rl import grpo as rl
    from pipeline.rl.params import GRPOStageConfig, RewardsConfig

    cfg = GRPOStageConfig(**{**profile["grpo"], "max_steps": steps, "logging_steps": 1, "guided_replay": False})
    clock = step_clock()
    rl.dvclive_callback = lambda live_dir: clock  # times the steps; the curves are not measured here
    model = trainable(model)
    model.train()
    rl_rows = [{"id": r["id"], "prompt": r["prompt"], "answer": r["answer"], "answer_type": r["answer_type"],
                "rationale": r["rationale"], "step_values": [s["value"] for s in r["steps"] if s["value"]]}
               for r in rows]  # as `mine` writes them (pipeline/data/mining.py)
    with tempfile.TemporaryDirectory() as work:
        metrics = rl.rl_train(cfg, RewardsConfig(), model, tokenizer, rl_rows, Path(work) / "t", Path(work) / "live")
    timed = clock.times[1:] or clock.times  # the first step carries the warm-up
    per_step_tokens = metrics["tokens"] / max(metrics["steps"], 1)
    rate = per_step_tokens / (sum(timed) / len(timed))
    return {"rollouts_per_step": cfg.prompts_per_step * cfg.num_generations, "max_completion_length":
            cfg.max_completion_length, "steps": metrics["steps"], "seconds_per_step": round(sum(timed) / len(timed), 3),
            "tokens_per_step": round(per_step_tokens), "tokens_per_second": round(rate),
            # a rollout token costs a generation pass, and training's forward and backward (6 N in all with the
            # reference's pass: passes_per_token), so 6 N x tokens/s is the rate against the peaks
            **mfu(info["parameters"], rate, rates)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny profile at toy sizes: a CPU check")
    parser.add_argument("-S", "--set", dest="sets", action="append", default=[],
                        help="KEY=VALUE over the profile, as `python -m pipeline repro -S` takes it")
    parser.add_argument("--parts", default="sft,greedy_hf,greedy_vllm,prm_scoring,grpo",
                        help="comma-separated parts to run after the matrix rate and the model")
    args = parser.parse_args()
    from pipeline.orchestration.profiles import resolve

    profile = resolve("tiny" if args.tiny else args.profile, args.sets, root=ROOT)
    sizes = ({"questions": 300, "sft_steps": 3, "warmup": 2, "eval_batch": 16, "new_tokens": 16, "prm_paths": 32,
              "prm_batch": 16, "grpo_steps": 2, "matmul": 512} if args.tiny else
             {"questions": 12000, "sft_steps": 10, "warmup": 3, "eval_batch": 512, "new_tokens": 256,
              "prm_paths": 4096, "prm_batch": profile["prm"]["batch_size"], "grpo_steps": 4, "matmul": 8192})
    if args.tiny:
        profile["grpo"].update(prompts_per_step=2, num_generations=2, max_completion_length=16)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
    results: dict = {"device": name, "torch": torch.__version__, "profile": "tiny" if args.tiny else args.profile,
                     "sets": args.sets, "sizes": sizes}

    def save() -> None:
        (args.out / "gpu_profile.json").write_text(json.dumps(results, indent=2) + "\n")

    wanted = {"matmul", "model", *args.parts.split(",")}

    @contextlib.contextmanager
    def part(key: str):
        start = time.perf_counter()
        print(f"== {key}", flush=True)
        try:
            yield
        except Exception as exc:  # one part's failure is a result too; the next parts still run
            results[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        results.setdefault(key, {})["wall_seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(results[key])[:600], flush=True)
        save()

    rates = {"datasheet": peak}
    with part("matmul"):
        measured = matmul_rate(sizes["matmul"], 50 if torch.cuda.is_available() else 3)
        rates["measured"] = measured
        results["matmul"] = {"n": sizes["matmul"], "tflops": round(measured, 1), "datasheet_tflops": peak}
    rows = corpus(sizes["questions"])
    with part("model"):
        model, tokenizer, info = build(profile, rows, Path(tempfile.mkdtemp(prefix="gpu-profile-model-")))
        results["model"] = info
    def vllm() -> dict:
        out = vllm_greedy(model, tokenizer, rows, sizes["eval_batch"], sizes["new_tokens"])
        if "tokens_per_second" in out and "tokens_per_second" in results.get("greedy_hf", {}):
            out["vs_hf"] = round(out["tokens_per_second"] / results["greedy_hf"]["tokens_per_second"], 2)
        return out

    parts = {
        "sft": lambda: sft(profile, model, tokenizer, rows, info, rates, sizes["sft_steps"], sizes["warmup"]),
        "greedy_hf": lambda: greedy(model, tokenizer, rows, sizes["eval_batch"], sizes["new_tokens"]),
        "greedy_vllm": vllm,
        "prm_scoring": lambda: prm_scoring(model, tokenizer, rows[: sizes["prm_paths"]], sizes["prm_batch"]),
        "grpo": lambda: grpo(profile, model, tokenizer, rows, info, rates, sizes["grpo_steps"]),
    }
    for key, run in parts.items():
        if key in wanted:
            with part(key):
                results[key] = run()
    print(f"results: {args.out / 'gpu_profile.json'}")


if __name__ == "__main__":
    main()
