"""python bench/prm_scoring.py [--workloads heldout best_of_n beam mcts] [--questions 100] [--policy sft] \
[--paths 512] [--repeats 5] [--batch N] [--profile]

PRM scoring throughput, side by side in one process on the same PRM and the same
candidates:
1. the pipeline's batched scorer (pipeline.prm.model.PRMScorer: batches of
   `evaluate.decoding.prm_batch_size` paths, every line of every path scored in one
   forward pass, the prefix that paths of one prompt share read once);
2. baseline: the same scorer with batch size 1, one candidate at a time (one plain
   forward pass per candidate: a lone path shares nothing; both read equal pairs
   of one call once);
3. the batched scorer reading the whole vocabulary at every position
   (`full_logits=True`, what it did before it read each token's own logit through
   the plain LM head), to show what that buys.

Workloads (each a list of scoring calls, replayed in order by both scorers):
- `heldout`: the first `--paths` held-out step-label paths of data/prm_data/val.parquet,
  one call (few paths per prompt);
- `best_of_n`: the N samples per question that `evaluate` scores for PRM best-of-N
  (`--policy` sampled at `evaluate.k_temperature` on the first `--questions` test
  questions), one call, as `Decoder` makes it;
- `beam`, `mcts`: the calls that step-level beam search and PRM-MCTS make (one per
  depth or iteration: the candidate lines of every question, each with the lines above
  it), recorded while `--policy` runs the search with `evaluate.decoding`'s settings.
Checks that the scorers give the same scores, then prints, per workload, candidates/s
of each, the tokens read, the ratio batched / one at a time (best of `--repeats`, the scorers taking turns) and
batched / batched with full logits. `--profile`: then, per workload, where a candidate's
time goes in each scorer (torch profiler: matrix products, attention, other tensor ops)
how much faster batching could be if it paid for nothing but its products and
attention, and the tokens a prefix tree over each prompt's candidates would read. Needs models/prm,
data/prm_data, data/synthesize and models/<policy> (run `make run` first).
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.evaluation.params import EvaluateConfig
from pipeline.evaluation.search import StepPolicy, beam_search, prm_mcts
from pipeline.inference.generation import LocalSampler
from pipeline.modeling.models import load_model
from pipeline.prm.model import PRMScorer, encode_many, scored_lines, shared_prefix

WORKLOADS = ("heldout", "best_of_n", "beam", "mcts")
Call = tuple[list[str], list[tuple[str, ...]]]


class Recorder:
    """A scorer that keeps every call it gets (what a search asks the PRM) and answers with the real one."""

    def __init__(self, scorer: PRMScorer) -> None:
        self.scorer, self.calls = scorer, []

    def score(self, prompts, lines) -> list[list[float]]:
        self.calls.append((list(prompts), [tuple(ls) for ls in lines]))
        return self.scorer.score(prompts, lines)


def workload_calls(names: list[str], args, cfg: EvaluateConfig, scorer: PRMScorer) -> dict[str, list[Call]]:
    out: dict[str, list[Call]] = {}
    if "heldout" in names:
        rows = read_rows(paths.split_file("val", "prm_data"))[: args.paths]
        out["heldout"] = [([r["prompt"] for r in rows], [tuple(r["steps"]) for r in rows])]
    searched = [n for n in names if n != "heldout"]
    if not searched:
        return out
    d = cfg.decoding
    prompts = [r["prompt"] for r in read_rows(paths.split_file("test"))[: args.questions]]
    model, tokenizer = load_model(paths.model_dir(args.policy))
    if "best_of_n" in searched:
        samples = LocalSampler(model, tokenizer, cfg.batch_size).sample(
            prompts, n=d.n, temperature=cfg.k_temperature, max_new_tokens=cfg.max_new_tokens, seed=0)
        out["best_of_n"] = [([p for p, gens in zip(prompts, samples) for _ in gens],
                             [tuple(scored_lines(g.text)) for gens in samples for g in gens])]
    policy = StepPolicy(model, tokenizer, batch_size=d.step_batch_size, step_tokens=d.step_tokens,
                        completion_tokens=cfg.max_new_tokens, temperature=cfg.k_temperature)
    if "beam" in searched:
        recorder = Recorder(scorer)
        beam_search(prompts, policy, recorder.score, n=d.n, width=d.beam_width, max_steps=d.max_steps,
                    how=d.aggregation)
        out["beam"] = recorder.calls
    if "mcts" in searched:
        recorder = Recorder(scorer)
        prm_mcts(prompts, policy, recorder.score, iterations=d.mcts_iterations, children=d.mcts_children,
                 c=d.ucb_c, max_steps=d.max_steps)
        out["mcts"] = recorder.calls
    return out


def replay(scorers: list[PRMScorer], calls: list[Call], repeats: int) -> list[tuple[float, int, list[list[float]]]]:
    """Per scorer: (best seconds over `repeats`, tokens read per replay, the scores of the last replay).

    The scorers take turns within each repeat, so a machine that slows down for a while slows them all.
    """
    best, scores, before = [float("inf")] * len(scorers), [[] for _ in scorers], [s.tokens for s in scorers]
    for _ in range(repeats):
        for k, scorer in enumerate(scorers):
            start = time.perf_counter()
            scores[k] = [s for prompts, lines in calls for s in scorer.score(prompts, lines)]
            best[k] = min(best[k], time.perf_counter() - start)
    return [(best[k], (s.tokens - before[k]) // repeats, scores[k]) for k, s in enumerate(scorers)]


def sharing(scorer: PRMScorer, calls: list[Call]) -> tuple[int, int]:
    """Tokens of each call's distinct candidates, each prompt's read (common prefix once, then each candidate's own
    tokens; `PRMScorer` without batch boundaries) against a prefix tree over them (every distinct prefix once)."""
    common = tree = 0
    for prompts, lines in calls:
        groups: dict[str, set[tuple[int, ...]]] = {}
        distinct = [(p, ls) for p, ls in dict.fromkeys(zip(prompts, lines)) if ls]
        for (prompt, _), (ids, _) in zip(distinct, encode_many(scorer.tokenizer, [p for p, _ in distinct],
                                                                [ls for _, ls in distinct])):
            groups.setdefault(prompt, set()).add(tuple(ids))
        for group in groups.values():
            cut = shared_prefix(list(group)) if len(group) > 1 else 0
            common += cut + sum(len(ids) - cut for ids in group)
            tree += len({ids[: k + 1] for ids in group for k in range(len(ids))})
    return common, tree


def breakdown(scorer: PRMScorer, calls: list[Call], n: int) -> dict[str, float]:
    """ms per candidate of one replay, profiled: matrix products, attention, other tensor ops."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for prompts, lines in calls:
            scorer.score(prompts, lines)
    ms = {"products": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        kind = ("products" if event.key in ("aten::mm", "aten::addmm", "aten::bmm")
                else "attention" if "scaled_dot_product" in event.key else "other")
        ms[kind] += event.self_cpu_time_total / 1e3 / n
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--paths", type=int, default=512, help="held-out paths scored (heldout)")
    parser.add_argument("--questions", type=int, default=100, help="test questions searched (the other workloads)")
    parser.add_argument("--policy", default="sft", help="the model under models/ whose samples and searches are scored")
    parser.add_argument("--repeats", type=int, default=5, help="timed replays of each; the best counts")
    parser.add_argument("--batch", type=int, default=None, help="paths per batch (default: evaluate's prm_batch_size)")
    parser.add_argument("--profile", action="store_true", help="also where the time goes (CPU: torch profiler)")
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = load_section("evaluate", EvaluateConfig)
    batch = args.batch or cfg.decoding.prm_batch_size
    batched = PRMScorer.load(paths.model_dir("prm"), batch_size=batch)
    single = PRMScorer(batched.model, batched.tokenizer, batch_size=1)
    full = PRMScorer(batched.model, batched.tokenizer, batch_size=batch, full_logits=True)
    workloads = workload_calls(args.workloads, args, cfg, batched)
    print(f"PRM on {batched.model.device}, torch threads {torch.get_num_threads()}, batch {batch}, "
          f"verdicts through the plain LM head: {batched.head is not None}")
    print(f"{'workload':10} {'calls':>5} {'candidates':>10} {'lines':>6}  {'batched c/s':>11} {'tokens':>7}  "
          f"{'single c/s':>10} {'tokens':>7}  ratio  max |diff|  {'full-logits c/s':>15}  gain")
    for name, calls in workloads.items():
        (fast, fast_read, fast_scores), (slow, slow_read, slow_scores), (whole, _, whole_scores) = replay(
            [batched, single, full], calls, args.repeats)
        worst = max((abs(a - b) for other in (slow_scores, whole_scores)
                     for x, y in zip(fast_scores, other) for a, b in zip(x, y)), default=0.0)
        n = sum(len(prompts) for prompts, _ in calls)
        lines = sum(len(ls) for _, paths_ in calls for ls in paths_)
        print(f"{name:10} {len(calls):5d} {n:10d} {lines:6d}  {n / fast:11.1f} {fast_read:7d}  "
              f"{n / slow:10.1f} {slow_read:7d}  {slow / fast:4.2f}x  {worst:9.1e}  "
              f"{n / whole:15.1f}  {whole / fast:4.2f}x")
        if args.profile:
            parts = {who: breakdown(scorer, calls, n) for who, scorer in (("batched", batched), ("single", single))}
            for who, ms in parts.items():
                print(f"  {who:8} ms a candidate: products {ms['products']:.3f}, attention {ms['attention']:.3f}, "
                      f"other ops {ms['other']:.3f}")
            ceiling = 1e3 * slow / n / (parts["batched"]["products"] + parts["batched"]["attention"])
            print(f"  one at a time / batched products and attention alone: {ceiling:.1f}x")
            common, tree = sharing(batched, calls)
            print(f"  tokens of the distinct candidates: {common} with each prompt's common prefix once, "
                  f"{tree} with a prefix tree")


if __name__ == "__main__":
    main()
