"""python bench/prm_heads.py --head lm --questions 8000 --steps 1600 [--sft-weight 1] [--extra-layers 2] [--perturbed]

Which PRM head can check a step: one PRM trained per run from the policy
(`prm_data.policy`, default models/sft) on the same kind of labels, measured the
way issue 5 states its targets: held-out AUROC and within-question pair accuracy
on data/prm_data/val.parquet (stages.prm.held_out), best-of-4 on the first 200
test questions against greedy, maj@4 and a random sample.

Heads (`--head`):
- line_end: a one-logit token-classification head read at the last token of
  each line (this project's PRM before the LM head);
- token: the same one-logit head at every token of a line; the line's score is
  the product of the token sigmoids (BCE on the product, line labels only);
- lm: the pipeline's PRM (pipeline/prm.py): the policy's LM head, the verdict
  on token t being sigmoid(logit of t at position t - 1), product over the line;
  `--extra-layers` decoder layers on top of the policy's, starting as the identity;
  `--init teacher` starts from another model under models/ with the same tokenizer.

Labels: the policy's samples (4 at T 0.8, distinct ones kept) on `--questions`
new training questions from the CoF generator (seed `--question-seed`), each
line labelled by the gold chain; `--perturbed` adds, per question, 2 gold
chains of which 60% are cut after one step whose value was changed (as in
bench/prm_variants.py). `--sft-weight w` adds w x next-token cross-entropy on
a half batch of gold chains a step (the pipeline's `prm.chain_weight`), the
chains of the labelled questions and of `--chain-questions` more. Training:
AdamW, `--lr`, cosine with 5% warm-up, `--steps` batches of `--batch`. Nothing
under models/ or data/ changes (`--save DIR` keeps the trained PRM).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prm_variants import decode, perturb_step  # noqa: E402

from pipeline import paths  # noqa: E402
from pipeline.cof.generate import more_train_questions  # noqa: E402
from pipeline.config import EvaluateConfig, PRMDataConfig, SynthesizeConfig, load_section  # noqa: E402
from pipeline.evaluation import score as grade  # noqa: E402
from pipeline.generation import LocalSampler  # noqa: E402
from pipeline.io import read_rows  # noqa: E402
from pipeline.models import load_model  # noqa: E402
from pipeline.prm import (  # noqa: E402
    AGGREGATIONS, PRMScorer, chain_loss, collate, encode_many, line_labels, line_log_probs, line_loss, prm_from_policy,
    scored_lines, token_verdicts,
)
from stages.prm import held_out  # noqa: E402


class Head(PRMScorer):
    """A PRM under test: `PRMScorer`'s interface (so `held_out` and evaluate's Decoder use it as they use the
    pipeline's PRM), one plain forward pass per batch, and its own reading of the logits as line scores."""

    def __init__(self, kind: str, policy_dir: Path, tokenizer, extra_layers: int = 0) -> None:
        from transformers import AutoModelForTokenClassification

        if kind == "lm":
            model = prm_from_policy(policy_dir, extra_layers)
        else:
            model = AutoModelForTokenClassification.from_pretrained(str(policy_dir), num_labels=1)
        super().__init__(model, tokenizer)
        self.kind = kind
        model.train()  # PRMScorer set eval mode; `score` sets it again

    def line_log_probs(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(log P(line right), validity) per scored line of a `collate` batch."""
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        starts, ends = batch["score_starts"], batch["score_ends"]
        if self.kind == "line_end":  # one logit, at the line's last token
            return F.logsigmoid(logits.squeeze(-1).float().gather(1, (ends - 1).clamp(min=0))), starts >= 0
        verdicts = token_verdicts(logits, batch["input_ids"]) if self.kind == "lm" else F.logsigmoid(
            logits.squeeze(-1).float())
        return line_log_probs(verdicts, starts, ends)

    @torch.inference_mode()
    def score(self, prompts, lines) -> list[list[float]]:
        self.model.eval()
        out: list[list[float]] = [[] for _ in prompts]
        todo = [i for i, ls in enumerate(lines) if ls]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            encoded = encode_many(self.tokenizer, [prompts[i] for i in chunk], [lines[i] for i in chunk])
            batch = collate([{"input_ids": ids, "spans": spans} for ids, spans in encoded], self.pad_id)
            log_p, _ = self.line_log_probs(batch)
            for row, (i, (_, spans)) in enumerate(zip(chunk, encoded)):
                out[i] = log_p[row, : len(spans)].exp().tolist()
        return out


def labelled_paths(questions: list[dict], policy, tokenizer, perturbed: bool, seed: int) -> list[tuple]:
    """(prompt, lines, labels) of the policy's distinct samples, and of perturbed gold chains when asked."""
    rng = random.Random(seed)
    drawn = LocalSampler(policy, tokenizer, 512).sample([q["prompt"] for q in questions], n=4, temperature=0.8,
                                                        max_new_tokens=128, seed=seed)
    out = []
    for q, gens in zip(questions, drawn):
        for lines in {tuple(scored_lines(g.text)) for g in gens}:
            if lines:
                out.append((q["prompt"], list(lines), line_labels(lines, q)))
        if perturbed:
            gold = [line.strip() for line in q["rationale"].splitlines() if line.strip()]
            steps = [line for line in gold if line.startswith("Step")]
            for _ in range(2):
                path = gold
                if steps and rng.random() > 0.4:
                    k = rng.randrange(len(steps))
                    wrong = perturb_step(steps[k], q["prompt"], rng)
                    if wrong and wrong != steps[k]:
                        path = steps[:k] + [wrong]
                out.append((q["prompt"], path, line_labels(path, q)))
    return out


def train(head: Head, examples: list[tuple], steps: int, lr: float, batch: int, seed: int, report,
          gold: list[tuple] = (), sft_weight: float = 0.0) -> None:
    """AdamW, cosine with 5% warm-up, `steps` random batches; the pipeline's loss on the head's line scores,
    plus `sft_weight` x next-token cross-entropy on a batch of gold chains when `gold` is given."""
    encoded = encode_many(head.tokenizer, [e[0] for e in examples], [e[1] for e in examples])
    features = [{"input_ids": ids, "spans": spans, "line_labels": e[2], "kind": 0} for (ids, spans), e in
                zip(encoded, examples)]
    chains = [{"input_ids": ids, "spans": spans} for ids, spans in
              encode_many(head.tokenizer, [g[0] for g in gold], [g[1] for g in gold])]
    opt = torch.optim.AdamW(head.model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, int(0.05 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    rng = random.Random(seed)
    for step in range(steps):
        head.model.train()
        chunk = collate(rng.sample(features, batch), head.pad_id)
        loss = line_loss(*head.line_log_probs(chunk), chunk["score_labels"], chunk["score_kinds"])
        if sft_weight and chains:
            gold_batch = collate(rng.sample(chains, batch // 2), head.pad_id)
            logits = head.model(input_ids=gold_batch["input_ids"], attention_mask=gold_batch["attention_mask"]).logits
            loss = loss + sft_weight * chain_loss(logits, gold_batch["input_ids"], gold_batch["score_starts"],
                                                  gold_batch["score_ends"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        report(step + 1, loss.item())


def best_of_4(head: Head, policy, tokenizer, test: list[dict]) -> dict:
    """Greedy, maj@4 and best-of-4 (each aggregation) by evaluate's Decoder, a random sample and pass@4."""
    decoding = load_section("evaluate", EvaluateConfig).decoding.model_copy(update={"n": 4})
    sampler = LocalSampler(policy, tokenizer, 64)
    greedy = [(g[0].text, g[0].tokens) for g in sampler.sample([r["prompt"] for r in test], max_new_tokens=192)]
    drawn = sampler.sample([r["prompt"] for r in test], n=4, temperature=0.8, max_new_tokens=192, seed=0)
    samples = [[(g.text, g.tokens) for g in gens] for gens in drawn]
    right = [[grade(r, t, 0)["correct"] for t, _ in pairs] for r, pairs in zip(test, samples)]
    out = {**decode(decoding, head, test, greedy, samples, ["greedy", "maj_at_n"]),
           "random_sample": sum(map(sum, right)) / (4 * len(test)), "pass_at_4": sum(map(any, right)) / len(test)}
    for how in AGGREGATIONS:
        out[f"best_of_4_{how}"] = decode(decoding, head, test, greedy, samples, ["prm_best_of_n"],
                                         aggregation=how)["prm_best_of_n"]
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", choices=("line_end", "token", "lm"), default="lm")
    parser.add_argument("--questions", type=int, default=8000, help="new training questions sampled")
    parser.add_argument("--question-seed", type=int, default=101)
    parser.add_argument("--init", default=None,
                        help="start the PRM from this model under models/ (default: the policy, prm_data.policy)")
    parser.add_argument("--extra-layers", type=int, default=0, help="decoder layers added on top (lm head)")
    parser.add_argument("--sft-weight", type=float, default=0.0,
                        help="add this x next-token cross-entropy on the questions' gold chains")
    parser.add_argument("--chain-questions", type=int, default=0,
                        help="more new questions whose gold chains (only) join the cross-entropy")
    parser.add_argument("--save", type=Path, default=None, help="save the trained PRM here")
    parser.add_argument("--perturbed", action="store_true", help="add perturbed gold chains")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--evals", type=int, default=4, help="held-out measurements during training")
    args = parser.parse_args()
    torch.manual_seed(0)
    policy_dir = paths.model_dir(load_section("prm_data", PRMDataConfig).policy)
    policy, tokenizer = load_model(policy_dir)
    everything = more_train_questions(load_section("synthesize", SynthesizeConfig),
                                      args.questions + args.chain_questions, args.question_seed, prefix="bench")
    questions = everything[: args.questions]
    start = time.perf_counter()
    examples = labelled_paths(questions, policy, tokenizer, args.perturbed, seed=0)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    print(json.dumps({"args": settings, "paths": len(examples),
                      "labelling_seconds": round(time.perf_counter() - start, 1)}), flush=True)
    val = read_rows(paths.split_file("val", "prm_data"))
    head = Head(args.head, paths.model_dir(args.init) if args.init else policy_dir, tokenizer, args.extra_layers)
    start, every = time.perf_counter(), max(args.steps // args.evals, 1)

    def report(step: int, loss: float) -> None:
        if step % every == 0:
            metrics, _ = held_out(head, val)
            print(json.dumps({"step": step, "loss": round(loss, 4), "seconds": round(time.perf_counter() - start),
                              "auroc": metrics["auroc"], "auroc_steps": metrics["auroc_steps"],
                              "accuracy": metrics["accuracy"], "pairs": metrics["within_question"]}), flush=True)

    gold = [(q["prompt"], scored_lines(q["rationale"])) for q in everything]
    train(head, examples, args.steps, args.lr, args.batch, seed=1, report=report, gold=gold,
          sft_weight=args.sft_weight)
    if args.save:
        head.model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
    print(json.dumps({"best_of_4": best_of_4(head, policy, tokenizer, read_rows(paths.split_file("test"))[:200])}))


if __name__ == "__main__":
    sys.exit(main())
