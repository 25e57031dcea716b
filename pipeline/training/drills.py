"""Table-reading drills: a from-scratch student learns to look a key up in a chart's table before SFT.

Why: trained on rationales alone, the tiny student never binds a word key to the
number after it. A `Step` that should say "Tigers 19" copies some number of the
table, so its answers, its PRM labels and every search over its steps inherit
that guess (docs/experiments/does-the-student-read-the-table.md). The same
architecture learns the binding within a few thousand steps when it first drills
on the table line alone:

1. colour: every key of a new random table asked in turn, each value replaced by
   a colour word (one token, no digits to chain), which it learns first;
2. numbers: the chart's own table line, every key of a new random table asked
   in turn (`base.drills.number_task: multi`; `lookup` asks one key).

Each drill runs until held-out check tables read `base.drills.stop_at` (at most
its step count), so a slow init or machine drills longer instead of missing.

A drill's prompt is the synthesized prompt's chart header and table line (the
same verbalizer as the questions), then "Value for <key>:"; the target repeats
the key and its value (" Tigers 19."). The loss is on the target only.

The ranking drill (`rank_drill`, `train_rank_drill`) teaches the step that
ranks a listed set, worded as the rationales word it, to a model that already
reads the table: the student after SFT, which guesses it
(docs/experiments/best-of-n-on-500-questions.md), so that every policy after
`sft` and the PRM started from one rank.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipeline.core.phases import phase
from pipeline.data.cof.tables import COLOURS, MARK_NOUNS, random_table
from pipeline.data.cof.verbalize import STEPS, format_prompt
from pipeline.data.params import SynthesizeConfig
from pipeline.inference.generation import pad as pad_batch
from pipeline.inference.generation import pad_id
from pipeline.modeling.params import DrillConfig
from pipeline.training.params import RankDrillConfig

Pair = tuple[list[int], list[int]]  # (prompt ids, target ids)

# How the table line is written: what sits between a key and its value, and
# what comes before the first key ("lead": a bar, so that the first key, like
# every other, follows a space and is the same token as in the question).
FORMATS = {"colon": ("", ": "), "nocolon": ("", " "), "tight": ("", ":"), "lead": ("| ", ": ")}


def table_row(table: dict) -> dict:
    """A random table as a synthesized row with the fields `drill` reads (no question)."""
    return {"table": json.dumps(table), "prompt": format_prompt(table, "x")}


def drill(task: str, row: dict, rng: random.Random, values: str = "chart", fmt: str = "colon") -> tuple[str, str]:
    """(prompt, target) of one drill on a synthesized row's chart.

    task: copy (every key and value in order), lookup (one key, chosen by rng),
    multi (every key in turn, in an order shuffled by rng); the value asked is
    the first series' (the default charts' tables have one series). values:
    chart (the prompt's own table line), plain (first series only, nothing
    after a value), colour (plain with every value a colour word).
    """
    table = json.loads(row["table"])
    head, line = row["prompt"].split("\n")[:2]
    pairs = [(c, str(v[0])) for c, v in zip(table["categories"], table["values"])]  # as format_prompt writes it
    if values == "colour":
        pairs = [(c, COLOURS[int(float(v)) % len(COLOURS)]) for c, v in pairs]
    if values != "chart":
        line = " | ".join(f"{c}: {v}" for c, v in pairs)
    lead, sep = FORMATS[fmt]
    line = lead + line.replace(": ", sep)
    if task == "copy":
        return f"{head}\n{line}\nCopy:", " " + ", ".join(f"{c} {v}" for c, v in pairs) + "."
    if task == "multi":
        order = pairs[:]
        rng.shuffle(order)
        (c, v), rest = order[0], order[1:]
        return f"{head}\n{line}\nValue for {c}:", f" {c} {v}." + "".join(f"\nValue for {k}: {k} {x}." for k, x in rest)
    c, v = rng.choice(pairs)
    return f"{head}\n{line}\nValue for {c}:", f" {c} {v}."


@contextmanager
def curve_log(live_dir: Path) -> Iterator[Callable[[str, int, float], None]]:
    """A `log(name, step, value)` for the drills' curves, written by dvclive into `live_dir`
    (no dvc.yaml edits, no DVC experiment); the files are complete when the block ends."""
    from dvclive import Live

    with Live(dir=str(live_dir), dvcyaml=None, save_dvc_exp=False) as live:

        def log(name: str, step: int, value: float) -> None:
            live.step = step
            live.log_metric(name, value)

        yield log


def key_kind(prompt: str, target: str) -> str:
    """Which key a lookup asks: a year, the table line's first key, or a later (word) key."""
    key = target.split()[0]
    if key.isdigit():
        return "year"
    return "first" if prompt.split("\n")[1].lstrip("| ").startswith(key) else "later"


def encode(tokenizer, prompt: str, target: str) -> Pair:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"] for text in (prompt, target))


def target_loss(model, batch: Sequence[Pair], pad: int) -> torch.Tensor:
    """The LM loss of (prompt, target) id pairs, on the target tokens only."""
    ids, mask = pad_batch([a + b for a, b in batch], pad)
    labels, _ = pad_batch([[-100] * len(a) + b for a, b in batch], -100)
    device = model.device
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss


def fit(model, pad: int, steps: int, batch: Callable[[], Sequence[Pair]], lr: float,
        report: Callable[[int, float], None], reports: int = 5, desc: str | None = None,
        until: Callable[[int], bool] | None = None, every: int = 0) -> int:
    """At most `steps` AdamW steps on batch(): 5% warmup, cosine decay; report(step, loss) `reports` times.

    With `until` and `every`, until(step) is asked every `every` steps and a True stops the loop there
    (reported too, so a short run still has a last loss). Returns the steps taken.
    `desc` names a progress bar (none without it: for a caller that prints its own lines).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1.0, 0.05 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1, (i + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(i, steps) / steps)))
    model.train()
    for step in tqdm(range(steps), desc=desc, disable=desc is None, mininterval=10):
        loss = target_loss(model, batch(), pad)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        done = step + 1
        stop = until is not None and every > 0 and done % every == 0 and done < steps and until(done)
        if done % max(steps // reports, 1) == 0 or stop:
            report(done, loss.item())
        if stop:
            return done
    return steps


@torch.no_grad()
def exact(model, tokenizer, pairs: Sequence[tuple[str, str]], by_kind: bool = False, batch_size: int = 50,
          kinds: Sequence[str] | None = None) -> dict:
    """Greedy exact match of (prompt, target) text pairs: the share whose continuation starts with the target.

    With `by_kind` (lookups), also the share per `key_kind` and its count (n_<kind>); `kinds`
    names each pair's kind instead (one pass for a total and a split, e.g. per rank asked).
    """
    if by_kind and kinds is None:
        kinds = [key_kind(prompt, target) for prompt, target in pairs]
    was_training = model.training
    model.eval()
    right: dict[str, list[bool]] = {}
    pad = pad_id(tokenizer)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in chunk]
        new = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for _, t in chunk) + 2
        ids, mask = pad_batch(prompts, pad, left=True)
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=new, do_sample=False, pad_token_id=pad)
        for i, ((_, target), row) in enumerate(zip(chunk, out[:, ids.shape[1] :].tolist()), start):
            hit = tokenizer.decode(row, skip_special_tokens=True).startswith(target)
            for name in ["all"] + ([kinds[i]] if kinds is not None else []):
                right.setdefault(name, []).append(hit)
    model.train(was_training)
    return {name: round(sum(hits) / len(hits), 3) for name, hits in right.items()} | {
        f"n_{name}": len(hits) for name, hits in right.items() if name != "all"}


def train_drills(model, tokenizer, cfg: DrillConfig, synth: SynthesizeConfig, log=None) -> dict:
    """The colour drill, then the numeric lookup drill, on new seeded random tables; their metrics.

    `log(name, step, value)` receives each drill's loss five times, its check tables' exact match
    at every check, and its validation exact match at the end (for curves). Validation asks one
    key of each of `cfg.val_tables` tables drawn before any training table, so the questions do
    not depend on the step counts and a run repeats exactly. With `cfg.check_every`, a drill
    stops before its last step once `cfg.check_tables` other held-out tables (a stream of their
    own, seed + 1, so that validation stays unseen by the stop) read `cfg.stop_at`: whether and
    when the lookup clicks depends on the init and on the machine's arithmetic, so a drill runs
    until it has, not for a count tuned on one machine (docs/experiments/drills-until-they-read.md).
    Returns per drill: steps taken, last logged loss, seconds and greedy exact match (numbers:
    also by key kind, a random value of the table scoring about 1/3).
    """
    rng = random.Random(cfg.seed)
    val_tables = [table_row(random_table(rng, synth)) for _ in range(cfg.val_tables)]
    val = {values: [drill("lookup", row, rng, values) for row in val_tables] for values in ("colour", "chart")}
    check_rng = random.Random(cfg.seed + 1)  # drawn only when checked: the training stream is the same either way
    checked = cfg.check_tables if cfg.check_every else 0
    check_tables = [table_row(random_table(check_rng, synth)) for _ in range(checked)]
    check = {values: [drill("lookup", row, check_rng, values) for row in check_tables]
             for values in ("colour", "chart")}
    pad = pad_id(tokenizer)
    log = log or (lambda name, step, value: None)
    metrics = {}
    for name, task, values, steps in (("colour", "multi", "colour", cfg.colour_steps),
                                      ("numbers", cfg.number_task, "chart", cfg.number_steps)):
        if not steps:
            continue
        start, losses = time.time(), []

        def batch(task=task, values=values) -> list[Pair]:
            return [encode(tokenizer, *drill(task, table_row(random_table(rng, synth)), rng, values))
                    for _ in range(cfg.batch_size)]

        def report(step: int, loss: float, name=name) -> None:
            losses.append(loss)
            log(f"{name}/loss", step, loss)

        def read(step: int, name=name, values=values) -> bool:
            exact_share = exact(model, tokenizer, check[values])["all"]
            log(f"{name}/check_exact", step, exact_share)
            return exact_share >= cfg.stop_at

        taken = fit(model, pad, steps, batch, cfg.learning_rate, report, desc=f"{name} drill", until=read,
                    every=cfg.check_every)
        scores = exact(model, tokenizer, val[values], by_kind=name == "numbers")
        log(f"{name}/val_exact", taken, scores["all"])
        metrics[name] = {"steps": taken, "loss": round(losses[-1], 4), "seconds": round(time.time() - start, 1),
                         "exact": scores.pop("all"), **({"exact_by_key": scores} if name == "numbers" else {})}
    return metrics


@phase("drill")
def drill_until_read(build: Callable[[int], torch.nn.Module], seed: int, tokenizer, cfg: DrillConfig,
                     synth: SynthesizeConfig, log=None) -> tuple[torch.nn.Module, dict, list[dict]]:
    """Build (`build(seed)`) and drill a student until one reads `cfg.gate` of the held-out lookups.

    Why: whether the numeric lookup clicks is a matter of the initial weights
    (docs/experiments/numeric-lookup-clicks.md), so an init that misses it is replaced by the next seed,
    up to `cfg.restarts` times, every try on the same drill tables. Returns the first init that
    passes, else the one that read the most; the kept init's drill metrics; and every try's
    seed, numbers exact match and whether it was kept. Curves of a try after the first
    are logged under `seed<N>/`. Without a numbers drill there is nothing to gate: one try.
    """
    log = log or (lambda name, step, value: None)
    best, attempts = None, []
    for k in range(cfg.restarts + 1):
        model = build(seed + k)
        prefix = f"seed{seed + k}/" if k else ""
        metrics = train_drills(model, tokenizer, cfg, synth, lambda name, step, value: log(prefix + name, step, value))
        read = metrics.get("numbers", {}).get("exact")
        attempts.append({"seed": seed + k, "numbers_exact": read, "kept": False})
        if best is None or (read is not None and read > best[1]["numbers"]["exact"]):
            best = (model, metrics, k)
        if read is None or read >= cfg.gate:
            break
    model, metrics, kept = best
    attempts[kept]["kept"] = True
    return model, metrics, attempts


# rank asked -> (the rationales' step function, the key's index in ascending order)
RANKS = {"largest": ("max_one_object", -1), "smallest": ("min_one_object", 0),
         "second largest": ("second_max", -2), "second smallest": ("second_min", 1)}


def rank_drill(rng: random.Random, synth: SynthesizeConfig, ranks: Sequence[str] = tuple(RANKS)
               ) -> tuple[str, str, str]:
    """(prompt, target, rank asked) of one ranking drill on a new random table without ties; the rank among `ranks`.

    "<chart header>\\n<table line>\\nStep 1: Select all bars: Lions 15, Bears 16, Eagles 3.\\n
    Step 2: The largest of them is" -> " Bears 16."; the steps are worded by the
    rationales' own templates (pipeline/data/cof/verbalize.STEPS) and the target is the value slot.
    """
    while True:
        table = random_table(rng, synth)
        pairs = [(c, v[0]) for c, v in zip(table["categories"], table["values"])]
        if len({v for _, v in pairs}) == len(pairs) and len(pairs) >= 3:
            break
    head, line = format_prompt(table, "x").split("\n")[:2]
    rank = rng.choice(list(ranks))
    function, index = RANKS[rank]
    key, value = sorted(pairs, key=lambda p: p[1])[index]
    nouns = MARK_NOUNS[table["chart_type"]][1]
    listed = STEPS["select_all"].format(nouns=nouns, v=", ".join(f"{c} {v}" for c, v in pairs))
    asked = STEPS[function].split("{v}")[0].rstrip()
    return f"{head}\n{line}\nStep 1: {listed}\nStep 2: {asked}", f" {key} {value}.", rank


def rank_exact(model, tokenizer, val: Sequence[tuple[str, str, str]]) -> dict:
    """Greedy exact match on ranking drills, in all and per rank asked (a key of the list at random: about 1/4)."""
    scores = exact(model, tokenizer, [(p, t) for p, t, _ in val], kinds=[r for _, _, r in val])
    return {"all": scores["all"]} | {rank: scores.get(rank) for rank in RANKS}


def gold_pair(tokenizer, row: dict) -> Pair:
    """A synthesized row's (prompt, rationale + EOS) ids: the loss on the rationale, as SFT trains on it."""
    prompt, target = encode(tokenizer, row["prompt"], row["rationale"])
    return prompt, target + [tokenizer.eos_token_id]


def train_rank_drill(model, tokenizer, cfg: RankDrillConfig, synth: SynthesizeConfig, log=None,
                     replay: Sequence[dict] = ()) -> dict:
    """The ranking drill on new seeded random tables: `cfg.curriculum` phases, then `cfg.steps` on every rank; its
    metrics.

    Phase i of the curriculum asks only the first i + 1 ranks of RANKS (largest alone, then
    largest and smallest, ...), each phase its own warm-up and cosine decay: asked every rank
    from the start, the student with digit pairs stays at chance, while "largest" alone is
    learned first and each next rank then builds on it
    (docs/experiments/ranking-drill-curriculum-and-replay.md). Validation asks one rank of
    each of `cfg.val_tables` tables drawn before any training table (so a run repeats
    exactly, whatever the step count).
    `log(name, step, value)` receives the loss and the held-out exact match five times a phase.
    With `cfg.replay`, each batch also holds that many gold rows of `replay` (synthesized
    prompt and rationale, drawn with seed + 1): drilled on rankings alone, the policy forgets
    what the drill never asks (the PRM from it checks a bar's colour worse, and the policy stops
    writing rationales: studies `ranking-drill-curriculum-and-replay`, `ranking-drills-mixed-into-sft`).
    Returns steps (all phases), last loss, seconds, exact match before and after, after per
    rank, and the held-out read at the end of each phase.
    """
    log = log or (lambda name, step, value: None)
    if cfg.replay and len(replay) < cfg.replay:
        raise ValueError(f"sft.rank_drill.replay: {cfg.replay} gold rows a batch, but {len(replay)} given")
    # listed once, not per step
    rng, replay_rng, pool = random.Random(cfg.seed), random.Random(cfg.seed + 1), list(replay)
    val = [rank_drill(rng, synth) for _ in range(cfg.val_tables)]
    before, start, losses = rank_exact(model, tokenizer, val), time.time(), []
    phases = [(tuple(RANKS)[: i + 1], n) for i, n in enumerate(cfg.curriculum)] + [(tuple(RANKS), cfg.steps)]
    read, done, by_phase = {0: before}, 0, []
    for ranks, steps in phases:
        if not steps:
            continue

        def batch(ranks=ranks) -> list[Pair]:
            asked = [encode(tokenizer, *rank_drill(rng, synth, ranks)[:2]) for _ in range(cfg.batch_size)]
            return asked + [gold_pair(tokenizer, row) for row in replay_rng.sample(pool, cfg.replay)]

        def report(step: int, loss: float, offset=done) -> None:
            losses.append(loss)
            read[offset + step] = rank_exact(model, tokenizer, val)
            log("rank/loss", offset + step, loss)
            log("rank/val_exact", offset + step, read[offset + step]["all"])

        fit(model, pad_id(tokenizer), steps, batch, cfg.learning_rate, report,
            desc=f"ranking drill ({', '.join(ranks) if len(ranks) < len(RANKS) else 'every rank'})")
        done += steps
        by_phase.append({"ranks": list(ranks), "steps": steps, "exact": (read.get(done) or {}).get("all")})
    after = dict(read.get(done) or rank_exact(model, tokenizer, val))
    return {"steps": done, "loss": round(losses[-1], 4) if losses else None,
            "seconds": round(time.time() - start, 1), "exact_before": before["all"], "exact": after.pop("all"),
            "exact_by_rank": after, "phases": by_phase}
