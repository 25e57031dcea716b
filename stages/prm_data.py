"""python -m stages.prm_data

Step labels for the process reward model, without human labels, from the
policy's own steps (`prm_data.policy`, default models/sft):

- gold: `samples` sampled completions per question; each line is labelled by
  the Chain-of-Functions gold chain (pipeline/prm.line_labels: step k is 1 if
  its value matches gold step k, the Answer line 1 if the answer is right).
  On `gold_questions` new training questions and on `val_questions`
  validation questions (val.parquet, the PRM's held-out set).
- mcts: PROPA's tree search with the policy on `mcts_questions` other new
  questions (pipeline/search.mcts with greedy rollouts); one row per leaf path,
  each node labelled log_boost(Q).
- chain (chains.parquet): the gold chain of every new question (those above and
  `chain_questions` more), every line labelled 1; the PRM trains on them as a
  generator (next-token cross-entropy, `prm.chain_weight`).

The training questions are new: the CoF generator again with `question_seed`
(pipeline/data/cof/generate.more_train_questions), in the training split's share of
question texts. The policy never trained on them, so its mistakes there are the
ones it makes at test time, and there are as many as the PRM needs (on the
6,000 training questions it had learned, it erred less and differently).

For a dataset task (`task.kind: dataset`) there are no gold step values and no
generator: the questions are drawn from train.parquet, and each sampled step is
labelled by Monte-Carlo rollouts (source `mc`, pipeline/prm/step_labels.py: the share
of `mc_rollouts` completions after the step that reach the right answer,
Math-Shepherd); the held-out set is labelled the same way on val.parquet; the
chains are the questions' worked solutions, every step labelled 1.

Rows follow the step-label contract of docs/design.md ("Data contracts": id,
prompt, steps, labels, source, task_type). metrics/prm_data.json has the label
balance per source and the agreement between MCTS and gold labels on the same
lines.
"""

from __future__ import annotations

import random
import time

import pyarrow as pa

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_COLUMNS,
    InputError,
    atomic_dir,
    read_rows,
    sample_rows,
    write_json,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.core.plots import bar_chart
from pipeline.data import task as tasks
from pipeline.data.params import SynthesizeConfig, TaskConfig
from pipeline.evaluation.search import StepPolicy, mcts, rollout_evaluator, tree_paths
from pipeline.inference.engines import local_sampler
from pipeline.modeling.models import load_model
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.prm.model import auroc, chain_rows, line_labels, log_boost, new_questions, scored_lines
from pipeline.prm.params import PRMDataConfig
from pipeline.prm.step_labels import monte_carlo_labels
from pipeline.rl.rewards import is_correct

STEP_LABEL_SCHEMA = pa.schema(
    [("id", pa.string()), ("prompt", pa.string()), ("steps", pa.list_(pa.string())),
     ("labels", pa.list_(pa.float64())), ("source", pa.string()), ("task_type", pa.string())]
)


def gold_rows(cfg: PRMDataConfig, sampler, questions: list[dict]) -> list[dict]:
    """Distinct sampled completions of each question with their gold line labels."""
    samples = sampler.sample([q["prompt"] for q in questions], n=cfg.samples, temperature=cfg.temperature,
                             top_p=1.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    out = []
    for q, gens in zip(questions, samples):
        seen = set()
        for g in gens:
            lines = tuple(scored_lines(g.text))
            if lines in seen:
                continue
            seen.add(lines)
            # A completion without Step or Answer lines gives nothing to label: no row (its lines are []).
            if lines:
                out.append({"id": q["id"], "prompt": q["prompt"], "steps": list(lines),
                            "labels": line_labels(lines, q), "source": "gold", "task_type": q["task_type"]})
    return out


@phase("label steps (MCTS)")
def mcts_rows(cfg: PRMDataConfig, policy: StepPolicy, questions: list[dict]) -> list[dict]:
    """PROPA's MCTS per question; each leaf path with log_boost(Q) of every node on it."""
    prompts = [q["prompt"] for q in questions]

    def reward(i: int, text: str) -> float:
        return float(is_correct(text, questions[i]["answer"], questions[i]["answer_type"]))

    roots = mcts(prompts, policy, rollout_evaluator(prompts, policy, reward), iterations=cfg.iterations,
                 children=cfg.children, c=cfg.ucb_c, max_steps=cfg.max_steps)
    return [{"id": q["id"], "prompt": q["prompt"], "steps": list(lines), "labels": [round(log_boost(v), 6) for v in qs],
             "source": "mcts", "task_type": q["task_type"]}
            for q, root in zip(questions, roots) for lines, qs in tree_paths(root)]


@phase("label steps (Monte Carlo)")
def mc_rows(cfg: PRMDataConfig, sampler, rollout: StepPolicy, questions: list[dict]) -> list[dict]:
    """Distinct sampled completions of each question, each step labelled by Monte-Carlo rollouts."""
    task = tasks.active()
    samples = sampler.sample([q["prompt"] for q in questions], n=cfg.samples, temperature=cfg.temperature,
                             top_p=1.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    owners, paths_ = [], []
    for q, gens in zip(questions, samples):
        seen = set()
        for g in gens:
            steps = tuple(task.steps(g.text))
            if steps and steps not in seen:  # no steps (an empty completion): nothing to label
                seen.add(steps)
                owners.append(q)
                paths_.append(list(steps))

    def reward(i: int, text: str) -> float:
        return float(is_correct(text, owners[i]["answer"], owners[i]["answer_type"]))

    heads = [rollout.render(q["prompt"]) for q in owners]  # the prompt as the policy reads it
    labels = monte_carlo_labels(heads, paths_, rollout.sample, reward, cfg.mc_rollouts, task.step_break)
    return [{"id": q["id"], "prompt": q["prompt"], "steps": steps, "labels": ys, "source": "mc",
             "task_type": q.get("task_type")} for q, steps, ys in zip(owners, paths_, labels)]


def balance(rows: list[dict]) -> dict:
    labels = [y for r in rows for y in r["labels"]]
    return {"rows": len(rows), "lines": len(labels),
            "mean_label": round(sum(labels) / len(labels), 4) if labels else None,
            "share_at_least_half": round(sum(y >= 0.5 for y in labels) / len(labels), 4) if labels else None}


def agreement(rows: list[dict], by_id: dict[str, dict]) -> dict:
    """MCTS labels against the gold labels of the same lines: agreement at 0.5 and the AUROC of one for the other."""
    mcts_labels, gold = [], []
    for r in rows:
        mcts_labels += r["labels"]
        gold += line_labels(r["steps"], by_id[r["id"]])
    if not gold:
        return {"lines": 0, "agreement": None, "auroc": None}
    agree = sum((m >= 0.5) == (g >= 0.5) for m, g in zip(mcts_labels, gold)) / len(gold)
    area = auroc(gold, mcts_labels)
    return {"lines": len(gold), "agreement": round(agree, 4), "auroc": None if area is None else round(area, 4)}


def _dataset_questions(cfg: PRMDataConfig, rng: random.Random) -> tuple[list[dict], list[dict], list[dict]]:
    """A dataset task's (labelled, searched, chain-only) training questions, drawn from train.parquet."""
    train = read_rows(paths.split_file("train"), required=EXAMPLE_COLUMNS)
    want = cfg.gold_questions + cfg.mcts_questions + cfg.chain_questions
    drawn = sample_rows(train, want, rng)
    rng.shuffle(drawn)  # sample_rows keeps file order; the three groups must not split it by position
    return (drawn[: cfg.gold_questions], drawn[cfg.gold_questions : cfg.gold_questions + cfg.mcts_questions],
            drawn)


def _flow(cfg: PRMDataConfig, synth: SynthesizeConfig) -> None:
    val_file, model_dir = paths.split_file("val"), paths.model_dir(cfg.policy)
    val = read_rows(val_file, required=EXAMPLE_COLUMNS)
    model, tokenizer = load_model(model_dir)
    rng = random.Random(cfg.seed)
    cof = tasks.active().is_cof
    if cof:
        # No question text of val or test among them (the generator's split hash sees to that). Their tables are
        # random draws, so a chart (header and table) of train.parquet can recur among them, rarely.
        fresh = new_questions(cfg, synth)
        gold_q = fresh[: cfg.gold_questions]
        mcts_q = fresh[cfg.gold_questions : cfg.gold_questions + cfg.mcts_questions]
    else:
        gold_q, mcts_q, fresh = _dataset_questions(cfg, rng)
    chains = chain_rows(fresh)
    val_q = sample_rows(val, cfg.val_questions, rng)
    sampler = local_sampler(model_dir, cfg.batch_size, cfg.policy, loaded=(model, tokenizer))
    log = stage_logger()

    start = time.perf_counter()
    if cof:
        gold_train, gold_val = gold_rows(cfg, sampler, gold_q), gold_rows(cfg, sampler, val_q)
    else:
        rollout = StepPolicy(model, tokenizer, batch_size=cfg.batch_size, completion_tokens=cfg.max_new_tokens,
                             temperature=cfg.temperature, seed=cfg.seed)
        gold_train, gold_val = mc_rows(cfg, sampler, rollout, gold_q), mc_rows(cfg, sampler, rollout, val_q)
    gold_seconds = time.perf_counter() - start
    label = "gold" if cof else "Monte-Carlo"
    log.info("prm_data: %d %s-labelled paths from %d questions (%.0f s)", len(gold_train), label, len(gold_q),
             gold_seconds)

    start = time.perf_counter()
    policy = StepPolicy(model, tokenizer, batch_size=cfg.batch_size, step_tokens=cfg.step_tokens,
                        completion_tokens=cfg.max_new_tokens, temperature=cfg.expand_temperature,
                        top_p=cfg.expand_top_p, top_k=cfg.expand_top_k, seed=cfg.seed)
    searched = mcts_rows(cfg, policy, mcts_q) if mcts_q else []
    mcts_seconds = time.perf_counter() - start
    log.info("prm_data: %d MCTS paths from %d questions (%.0f s)", len(searched), len(mcts_q), mcts_seconds)

    metrics = {
        "policy": cfg.policy,
        "labels": "gold" if cof else "mc",
        "gold" if cof else "mc": balance(gold_train),
        "mcts": balance(searched),
        "val": balance(gold_val),
        "chain": balance(chains),
        "mcts_vs_gold": agreement(searched, {q["id"]: q for q in mcts_q}) if cof else None,
        "mcts_policy_tokens": policy.tokens,
        "gold_seconds": round(gold_seconds, 1),
        "mcts_seconds": round(mcts_seconds, 1),
    }
    with atomic_dir(paths.stage_data("prm_data")) as out:
        write_rows(out / "train.parquet", gold_train + searched, schema=STEP_LABEL_SCHEMA)
        write_rows(out / "val.parquet", gold_val, schema=STEP_LABEL_SCHEMA)
        write_rows(out / paths.prm_chains_file().name, chains, schema=STEP_LABEL_SCHEMA)
        write_manifest(out, "prm_data", cfg, inputs=[model_dir, val_file], counts=metrics)
    with atomic_dir(paths.live_dir("prm_data")) as out:
        shares = {f"{source} (>= 0.5)": metrics[source]["share_at_least_half"] or 0.0
                  for source in ("gold" if cof else "mc", "mcts")}
        write_json(out / "label_balance.json", [{"source": k, "share": v} for k, v in shares.items()])
        bar_chart(shares, out / "label_balance.png", title="Step labels at or above 0.5, per source",
                  xlabel="share of lines")
    write_metrics(paths.metrics_file("prm_data"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("prm_data", PRMDataConfig)
        synth = load_section("synthesize", SynthesizeConfig)
        task_cfg = load_section("task", TaskConfig)
        if task_cfg.kind == "cof" and cfg.question_seed == synth.seed:
            raise InputError(f"params.yaml: prm_data.question_seed ({cfg.question_seed}) must differ from "
                             "synthesize.seed: the same seed draws the tables the policy trained on")
    run_stage("prm_data", _flow, cfg, synth)


if __name__ == "__main__":
    main()
