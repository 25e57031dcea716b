"""The table-reading drills (pipeline/training/drills.py), written out by hand for one chart, and a tiny drilled run."""

import json
import random

import pytest
import torch

from pipeline.data.params import SynthesizeConfig
from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.modeling.params import BaseModelConfig, DrillConfig
from pipeline.training import drills

HEAD = "Chart: pie. Title: Points by team (pts)."
ROW = {
    "table": json.dumps({"categories": ["Lions", "Tigers", "Eagles"], "values": [[20], [19], [4]]}),
    "prompt": f"{HEAD}\nLions: 20 pink | Tigers: 19 blue | Eagles: 4 brown\nQuestion: Name the Lions colour.\n",
}


TINY = BaseModelConfig(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1)


def drilled_twice(train, tokenizer) -> list[tuple[dict, list, list]]:
    """Two runs of `train(model, log)` on the same tiny init: (metrics, log entries, weights) each; each moves every
    tensor."""
    runs = []
    for _ in range(2):
        model = build_student(TINY, tokenizer)
        before = [p.detach().clone() for p in model.parameters()]
        logged = []
        metrics = train(model, lambda *entry: logged.append(entry))
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        runs.append((metrics, logged, [p.detach().clone() for p in model.parameters()]))
    return runs


class Second:
    """An rng that always picks the second pair and shuffles nothing."""

    def choice(self, seq):
        return seq[1]

    def shuffle(self, seq):
        pass


@pytest.mark.parametrize(
    ("fmt", "values", "line", "answer"),
    [
        ("colon", "chart", "Lions: 20 pink | Tigers: 19 blue | Eagles: 4 brown", "19"),
        ("lead", "chart", "| Lions: 20 pink | Tigers: 19 blue | Eagles: 4 brown", "19"),
        ("nocolon", "chart", "Lions 20 pink | Tigers 19 blue | Eagles 4 brown", "19"),
        ("colon", "plain", "Lions: 20 | Tigers: 19 | Eagles: 4", "19"),
        # 20, 19 and 4 modulo the 12 colours: teal, grey, purple
        ("colon", "colour", "Lions: teal | Tigers: grey | Eagles: purple", "grey"),
        ("nocolon", "colour", "Lions teal | Tigers grey | Eagles purple", "grey"),
    ],
)
def test_lookup_drill(fmt, values, line, answer):
    prompt, target = drills.drill("lookup", ROW, Second(), values, fmt)
    assert prompt == f"{HEAD}\n{line}\nValue for Tigers:"
    assert target == f" Tigers {answer}."


def test_copy_and_multi_drills():
    assert drills.drill("copy", ROW, Second())[1] == " Lions 20, Tigers 19, Eagles 4."
    prompt, target = drills.drill("multi", ROW, Second())
    assert prompt.endswith("\nValue for Lions:")
    assert target == " Lions 20.\nValue for Tigers: Tigers 19.\nValue for Eagles: Eagles 4."


def test_key_kind():
    prompt = drills.drill("lookup", ROW, Second())[0]
    assert drills.key_kind(prompt, " Tigers 19.") == "later"
    assert drills.key_kind(prompt, " Lions 20.") == "first"
    assert drills.key_kind(drills.drill("lookup", ROW, Second(), fmt="lead")[0], " Lions 20.") == "first"
    assert drills.key_kind(f"{HEAD}\n2017: 10 | 2018: 12\nValue for 2018:", " 2018 12.") == "year"


def test_table_row_gives_the_drill_a_prompt_of_the_questions_format():
    synth = SynthesizeConfig()
    table = drills.random_table(random.Random(0), synth)
    prompt, target = drills.drill("lookup", drills.table_row(table), Second())
    head, line, ask = prompt.split("\n")
    key, value = table["categories"][1], f"{table['values'][1][0]:g}"
    assert head.startswith(f"Chart: {table['chart_type']}.") and f"{key}: {value}" in line
    assert (ask, target) == (f"Value for {key}:", f" {key} {value}.")


def test_train_drills_trains_both_drills_and_repeats_exactly():
    synth = SynthesizeConfig()
    texts = [drills.table_row(drills.random_table(random.Random(i), synth))["prompt"] for i in range(60)]
    tokenizer = train_tokenizer(texts + ["Value for Copy: ."] * 5, 300)
    cfg = DrillConfig(colour_steps=4, number_steps=3, batch_size=2, val_tables=5)
    (metrics, logged, weights), (metrics2, logged2, weights2) = drilled_twice(
        lambda model, log: drills.train_drills(model, tokenizer, cfg, synth, log), tokenizer)
    assert [m["steps"] for m in metrics.values()] == [4, 3] and list(metrics) == ["colour", "numbers"]
    assert all(0 <= m["exact"] <= 1 and m["loss"] > 0 for m in metrics.values())
    by_key = metrics["numbers"]["exact_by_key"]
    assert sum(v for k, v in by_key.items() if k.startswith("n_")) == cfg.val_tables
    # five loss reports per drill (every step here), then its validation exact match
    assert [name for name, _, _ in logged] == ["colour/loss"] * 4 + ["colour/val_exact"] + ["numbers/loss"] * 3 + [
        "numbers/val_exact"]
    assert logged == logged2 and all(torch.equal(a, b) for a, b in zip(weights, weights2))
    json.dumps(metrics)  # plain data, as metrics/base.json takes it


def _drill_setup():
    synth = SynthesizeConfig()
    texts = [drills.table_row(drills.random_table(random.Random(i), synth))["prompt"] for i in range(60)]
    return synth, train_tokenizer(texts + ["Value for Copy: ."] * 5, 300)


def test_a_drill_stops_at_the_first_check_that_reads_stop_at_and_not_before():
    synth, tokenizer = _drill_setup()
    # stop_at 0: every check passes, so each drill stops at its first check (step 2), not at its 7 steps
    cfg = DrillConfig(colour_steps=7, number_steps=7, batch_size=2, val_tables=5, check_every=2, check_tables=3,
                      stop_at=0.0)
    logged = []
    metrics = drills.train_drills(build_student(TINY, tokenizer), tokenizer, cfg, synth,
                                  lambda *entry: logged.append(entry))
    assert [m["steps"] for m in metrics.values()] == [2, 2]
    # the stop is reported (a last loss), then checked, then validated at the step it stopped
    assert [(name, step) for name, step, _ in logged] == [
        ("colour/loss", 1), ("colour/check_exact", 2), ("colour/loss", 2), ("colour/val_exact", 2),
        ("numbers/loss", 1), ("numbers/check_exact", 2), ("numbers/loss", 2), ("numbers/val_exact", 2)]
    # stop_at 1 on an untrained model: checks at 2, 4 and 6 fail, none at the last step (7), every step runs
    logged.clear()
    cfg = cfg.model_copy(update={"stop_at": 1.0, "number_steps": 0})
    metrics = drills.train_drills(build_student(TINY, tokenizer), tokenizer, cfg, synth,
                                  lambda *entry: logged.append(entry))
    assert metrics["colour"]["steps"] == 7 and "numbers" not in metrics
    assert [step for name, step, _ in logged if name == "colour/check_exact"] == [2, 4, 6]


def test_the_numbers_drill_asks_every_key_or_one_as_number_task_says(monkeypatch):
    synth, tokenizer = _drill_setup()
    asked = []
    real = drills.drill
    monkeypatch.setattr(drills, "drill",
                        lambda task, *args, **kw: asked.append((task, args[2])) or real(task, *args, **kw))
    for task in ("multi", "lookup"):
        asked.clear()
        cfg = DrillConfig(colour_steps=0, number_steps=2, batch_size=3, val_tables=4, check_tables=2, number_task=task)
        drills.train_drills(build_student(TINY, tokenizer), tokenizer, cfg, synth)
        # held-out and check tables are single lookups (colour, then chart values); then 2 steps of 3 drills
        assert asked == [("lookup", v) for v in ("colour",) * 4 + ("chart",) * 4 + ("colour",) * 2 + ("chart",) * 2] + [
            (task, "chart")] * 6


class Scripted:
    """A model whose greedy continuation of each prompt is a given text (no weights)."""

    device = torch.device("cpu")
    training = True

    def __init__(self, tokenizer, replies: dict[str, str]):
        self.tokenizer, self.replies = tokenizer, replies

    def eval(self):
        self.training = False

    def train(self, mode: bool = True):
        self.training = mode

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):
        rows = []
        for ids, mask in zip(input_ids, attention_mask):
            reply = self.replies[self.tokenizer.decode(ids[mask.bool()])]
            new = self.tokenizer(reply, add_special_tokens=False)["input_ids"][:max_new_tokens]
            rows.append(new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)


def test_exact_is_the_share_of_continuations_that_start_with_the_target():
    tokenizer = train_tokenizer([ROW["prompt"] + "Value for Lions: Lions 20. Tigers 19. Eagles 4. 2018 12."] * 20, 300)
    pairs = [drills.drill("lookup", ROW, Second()),  # Tigers 19
             (ROW["prompt"].split("Question")[0] + "Value for Lions:", " Lions 20."),
             (f"{HEAD}\n2017: 10 | 2018: 12\nValue for 2018:", " 2018 12.")]
    replies = {pairs[0][0]: " Tigers 19.\nValue for", pairs[1][0]: " Lions 2", pairs[2][0]: " 2018 12."}
    model = Scripted(tokenizer, replies)
    scores = drills.exact(model, tokenizer, pairs, by_kind=True, batch_size=2)  # two batches, one left-padded
    assert scores == {"all": 0.667, "later": 1.0, "first": 0.0, "year": 1.0, "n_later": 1, "n_first": 1, "n_year": 1}
    assert model.training  # put back as it was
    assert drills.exact(model, tokenizer, pairs[:1]) == {"all": 1.0}


def _tiny(restarts: int, gate: float):
    synth = SynthesizeConfig()
    texts = [drills.table_row(drills.random_table(random.Random(i), synth))["prompt"] for i in range(60)]
    tokenizer = train_tokenizer(texts + ["Value for Copy: ."] * 5, 300)
    cfg = DrillConfig(colour_steps=2, number_steps=2, batch_size=2, val_tables=5, gate=gate, restarts=restarts)
    built = []

    def build(seed):
        built.append(seed)
        return build_student(TINY.model_copy(update={"seed": seed}), tokenizer)

    return tokenizer, cfg, synth, build, built


def test_drill_until_read_stops_at_the_first_init_that_passes_the_gate():
    tokenizer, cfg, synth, build, built = _tiny(restarts=3, gate=0.0)
    _, metrics, attempts = drills.drill_until_read(build, 5, tokenizer, cfg, synth)
    assert built == [5] and attempts == [{"seed": 5, "numbers_exact": metrics["numbers"]["exact"], "kept": True}]


def _scripted_reads(monkeypatch, reads: list[float]) -> None:
    """train_drills trains as it does, then reports the next of `reads` as the numbers drill's exact match."""
    real, reads = drills.train_drills, iter(reads)

    def scored(model, *args, **kwargs):
        metrics = real(model, *args, **kwargs)
        metrics["numbers"]["exact"] = model.read = next(reads)
        return metrics

    monkeypatch.setattr(drills, "train_drills", scored)


def test_drill_until_read_tries_every_restart_and_keeps_the_best_reader(monkeypatch):
    tokenizer, cfg, synth, build, built = _tiny(restarts=2, gate=0.9)
    _scripted_reads(monkeypatch, [0.3, 0.7, 0.5])  # the second init reads best, none passes
    logged = []
    model, metrics, attempts = drills.drill_until_read(build, 0, tokenizer, cfg, synth,
                                                       lambda *entry: logged.append(entry))
    assert built == [0, 1, 2] and model.read == metrics["numbers"]["exact"] == 0.7
    assert [(a["seed"], a["numbers_exact"], a["kept"]) for a in attempts] == [(0, 0.3, False), (1, 0.7, True),
                                                                              (2, 0.5, False)]
    # the first try's curves keep their names, later tries' are under their seed
    names = {name for name, _, _ in logged}
    assert {"numbers/val_exact", "seed1/numbers/val_exact", "seed2/numbers/val_exact"} <= names


def test_drill_until_read_stops_at_a_later_init_that_passes(monkeypatch):
    tokenizer, cfg, synth, build, built = _tiny(restarts=4, gate=0.9)
    _scripted_reads(monkeypatch, [0.2, 0.95, 0.99])
    model, _, attempts = drills.drill_until_read(build, 0, tokenizer, cfg, synth)
    assert built == [0, 1] and model.read == 0.95 and [a["kept"] for a in attempts] == [False, True]


# the ranking step as the rationales word it (pipeline/data/cof/verbalize.STEPS), written out by hand
ASKED = {"largest": "The largest of them is", "smallest": "The smallest of them is",
         "second largest": "The second largest of them is", "second smallest": "The second smallest of them is"}


def test_rank_drill_asks_a_listed_rank_and_answers_its_key_and_value():
    synth, rng, seen = SynthesizeConfig(), random.Random(3), set()
    for _ in range(60):
        prompt, target, rank = drills.rank_drill(rng, synth)
        head, line, step1, step2 = prompt.split("\n")
        chart = head.split(".")[0].removeprefix("Chart: ")
        nouns = {"bar": "bars", "line": "points", "pie": "slices"}[chart]
        assert step1.startswith(f"Step 1: Select all {nouns}: ") and step2 == f"Step 2: {ASKED[rank]}"
        pairs = [item.rsplit(" ", 1) for item in step1.split(": ", 2)[2].rstrip(".").split(", ")]
        values = [int(v) for _, v in pairs]
        assert len(set(values)) == len(values) >= 3  # no ties: one right key
        assert all(f"{k}: {v}" in line for k, v in pairs)  # the listed set is the table's
        order = sorted(pairs, key=lambda p: int(p[1]))
        key, value = order[{"largest": -1, "smallest": 0, "second largest": -2, "second smallest": 1}[rank]]
        assert target == f" {key} {value}."
        seen.add(rank)
    assert seen == set(ASKED)


def test_rank_drill_on_a_hand_made_table(monkeypatch):
    table = {"chart_type": "pie", "title": "Points by team", "unit": "pts", "colour_by": "category",
             "colours": ["pink", "blue", "brown"], "categories": ["Lions", "Tigers", "Eagles"], "series": ["points"],
             "values": [[20], [19], [4]]}
    monkeypatch.setattr(drills, "random_table", lambda rng, synth: table)
    # Second() picks the second rank of RANKS: the smallest
    assert drills.rank_drill(Second(), SynthesizeConfig()) == (
        f"{HEAD}\nLions: 20 pink | Tigers: 19 blue | Eagles: 4 brown\n"
        "Step 1: Select all slices: Lions 20, Tigers 19, Eagles 4.\nStep 2: The smallest of them is",
        " Eagles 4.", "smallest")


def test_train_rank_drill_trains_reports_and_repeats_exactly():
    from pipeline.training.params import RankDrillConfig

    synth = SynthesizeConfig()
    texts = [drills.rank_drill(random.Random(i), synth)[0] for i in range(60)]
    tokenizer = train_tokenizer(texts, 300)
    cfg = RankDrillConfig(curriculum=[], steps=5, batch_size=2, replay=0, val_tables=6)
    (metrics, logged, weights), (metrics2, logged2, weights2) = drilled_twice(
        lambda model, log: drills.train_rank_drill(model, tokenizer, cfg, synth, log), tokenizer)
    assert metrics["steps"] == 5 and metrics["loss"] > 0 and 0 <= metrics["exact_before"] <= 1
    assert 0 <= metrics["exact"] <= 1 and set(metrics["exact_by_rank"]) == set(drills.RANKS)
    # a loss and a held-out read at each of five reports (every step here)
    assert [(name, step) for name, step, _ in logged] == [(n, s) for s in range(1, 6)
                                                          for n in ("rank/loss", "rank/val_exact")]
    assert logged[-1][2] == metrics["exact"]
    assert logged == logged2 and metrics["exact"] == metrics2["exact"]
    assert all(torch.equal(a, b) for a, b in zip(weights, weights2))
    json.dumps(metrics)  # plain data, as metrics/prm.json takes it


def test_rank_drill_asks_only_the_ranks_given():
    synth, rng = SynthesizeConfig(), random.Random(5)
    assert {drills.rank_drill(rng, synth, ("largest",))[2] for _ in range(20)} == {"largest"}
    assert {drills.rank_drill(rng, synth, ("largest", "smallest"))[2] for _ in range(40)} == {"largest", "smallest"}


def test_train_rank_drill_curriculum_adds_one_rank_a_phase(monkeypatch):
    from pipeline.training.params import RankDrillConfig

    synth = SynthesizeConfig()
    texts = [drills.rank_drill(random.Random(i), synth)[0] for i in range(60)]
    tokenizer = train_tokenizer(texts, 300)
    asked: list[tuple[str, ...]] = []
    real = drills.rank_drill

    def spy(rng, synth, ranks=tuple(drills.RANKS)):
        asked.append(tuple(ranks))
        return real(rng, synth, ranks)

    monkeypatch.setattr(drills, "rank_drill", spy)
    cfg = RankDrillConfig(steps=2, curriculum=[3, 0, 1], batch_size=2, replay=0, val_tables=4)
    model = build_student(TINY, tokenizer)
    logged: list = []
    metrics = drills.train_rank_drill(model, tokenizer, cfg, synth, lambda *a: logged.append(a))
    every = tuple(drills.RANKS)
    # the held-out tables first (every rank), then 2 drills a step: 3 steps of the largest alone, the
    # empty phase skipped, 1 step of the first three ranks, 2 of every rank
    assert asked == [every] * 4 + [every[:1]] * 6 + [every[:3]] * 2 + [every] * 4
    assert metrics["steps"] == 6 and [p["steps"] for p in metrics["phases"]] == [3, 1, 2]
    assert [p["ranks"] for p in metrics["phases"]] == [list(every[:1]), list(every[:3]), list(every)]
    # the curves' steps run on across phases
    assert [step for name, step, _ in logged if name == "rank/loss"] == [1, 2, 3, 4, 5, 6]
    assert metrics["phases"][-1]["exact"] == metrics["exact"] == logged[-1][2]


def test_train_rank_drill_replays_gold_rows_beside_the_drills(monkeypatch):
    from pipeline.training.params import RankDrillConfig

    synth = SynthesizeConfig()
    texts = [drills.rank_drill(random.Random(i), synth)[0] for i in range(60)]
    tokenizer = train_tokenizer(texts + ["Step 1: Select the Sep slice: Sep 17.\nAnswer: 17"], 300)
    gold = [{"prompt": f"Chart: bar.\nA: {i} | B: 3\nQuestion: What is A?\n",
             "rationale": f"Step 1: Select the A bar: A {i}.\nAnswer: {i}"} for i in range(1, 6)]
    batches: list = []
    real = drills.target_loss
    monkeypatch.setattr(drills, "target_loss",
                        lambda model, batch, pad: batches.append(batch) or real(model, batch, pad))
    cfg = RankDrillConfig(curriculum=[1], steps=1, batch_size=2, replay=3, val_tables=2)
    drills.train_rank_drill(build_student(TINY, tokenizer), tokenizer, cfg, synth, replay=gold)
    assert len(batches) == 2 and all(len(b) == 5 for b in batches)
    as_key = lambda pair: (tuple(pair[0]), tuple(pair[1]))  # noqa: E731
    gold_keys = {as_key(drills.gold_pair(tokenizer, row)) for row in gold}
    for batch in batches:
        # two drills, then three distinct gold rows, each with its rationale and an EOS as the target
        assert not {as_key(p) for p in batch[:2]} & gold_keys
        replayed = [as_key(p) for p in batch[2:]]
        assert len(set(replayed)) == 3 and set(replayed) <= gold_keys
        assert all(target[-1] == tokenizer.eos_token_id for _, target in batch[2:])
    first = drills.gold_pair(tokenizer, gold[0])
    assert tokenizer.decode(first[1][:-1]) == gold[0]["rationale"]
    with pytest.raises(ValueError, match="sft.rank_drill.replay: 3 gold rows a batch, but 2 given"):
        drills.train_rank_drill(build_student(TINY, tokenizer), tokenizer, cfg, synth, replay=gold[:2])
