"""Smoke runs of each stage on tiny sizes as real Prefect flows.

The tiny DAG is built once per session (tests/stages/conftest.py); each test reads its outputs, or re-runs a stage
with its own params, in a copy of its own: any test runs alone, or in any order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline.core import paths
from pipeline.core.io import EXAMPLE_COLUMNS, read_rows
from pipeline.core.params import load_section
from pipeline.prm.contrast import contrast_rows
from pipeline.prm.params import PRMConfig
from tests.conftest import ROOT, TINY_PARAMS, write_params


def text(records) -> str:
    return "\n".join(r.getMessage() for r in records)


def test_synthesize(workspace):
    counts = {s: len(read_rows(paths.split_file(s), required=EXAMPLE_COLUMNS)) for s in paths.SPLITS}
    p = TINY_PARAMS["synthesize"]
    assert counts == {"train": p["n_train"], "val": p["n_val"], "test": p["n_test"], "ood": p["n_ood"]}
    charts = sorted(paths.charts_dir().glob("*.png"))
    assert len(charts) == 2 * len(paths.SPLITS)
    assert all(c.read_bytes().startswith(b"\x89PNG") for c in charts)
    test_rows = read_rows(paths.split_file("test"))
    assert test_rows[0]["image_path"] and Path(test_rows[0]["image_path"]).exists()
    manifest = json.loads((paths.stage_data("synthesize") / "config.json").read_text())
    assert manifest["params"]["n_train"] == p["n_train"] and manifest["seed"] == 0
    metrics = json.loads(paths.metrics_file("synthesize").read_text())
    assert metrics["questions"] == sum(counts.values())


def test_synthesize_is_byte_identical_on_rerun(workspace):
    from stages import synthesize

    before = {f.name: f.read_bytes() for f in paths.stage_data("synthesize").rglob("*") if f.is_file()}
    synthesize.main()
    after = {f.name: f.read_bytes() for f in paths.stage_data("synthesize").rglob("*") if f.is_file()}
    assert before.keys() == after.keys()
    assert [name for name in before if before[name] != after[name]] == []


def test_base(workspace, stage_logs):
    folder = paths.model_dir("base")
    for name in ("model.safetensors", "config.json", "tokenizer.json", paths.MODEL_MANIFEST):
        assert (folder / name).exists(), name
    metrics = json.loads(paths.metrics_file("base").read_text())
    assert 1_000 < metrics["parameters"] < 200_000
    assert metrics["vocab_size"] <= TINY_PARAMS["base"]["vocab_size"]
    # drilled before it is saved: both drills ran their steps, every tensor moved, curves beside
    p = TINY_PARAMS["base"]["drills"]
    assert metrics["weights_changed"] == 1.0
    assert {k: v["steps"] for k, v in metrics["drills"].items()} == {"colour": p["colour_steps"],
                                                                     "numbers": p["number_steps"]}
    assert all(0 <= v["exact"] <= 1 for v in metrics["drills"].values())
    # six drill steps never read 0.9 of the lookups: every init was tried, the best reader kept
    tries = [a["seed"] for a in metrics["inits"]]
    assert tries == [0, 1, 2][: 1 + p.get("restarts", 2)] and sum(a["kept"] for a in metrics["inits"]) == 1
    kept = next(a for a in metrics["inits"] if a["kept"])
    assert kept["seed"] == metrics["init_seed"] and kept["numbers_exact"] == metrics["drills"]["numbers"]["exact"]
    assert "none learned the lookup" in text(stage_logs["base"])  # said, not only in metrics
    # checked every 3 steps (tiny's check_every) and never read stop_at: the check at step 3 is drawn, not one at 6
    for curve in ("colour/check_exact", "numbers/check_exact"):
        rows = (paths.live_dir("base") / "plots" / "metrics" / f"{curve}.tsv").read_text().splitlines()
        assert [row.split("\t")[0] for row in rows] == ["step", "3"], curve
    for curve in ("colour/loss", "colour/val_exact", "numbers/loss", "numbers/val_exact"):
        assert (paths.live_dir("base") / "plots" / "metrics" / f"{curve}.tsv").exists(), curve


def test_base_is_byte_identical_on_rerun(workspace):
    """Drilled weights and a manifest without timings: a rerun of base leaves DVC nothing to re-run after it."""
    from stages import base

    folder = paths.model_dir("base")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    base.main()
    after = {f.name: f.read_bytes() for f in folder.iterdir()}
    assert before.keys() == after.keys() and [n for n in before if before[n] != after[n]] == []
    # the drills' timings go beside the metrics, which DVC hashes into dvc.lock
    assert "seconds" not in paths.metrics_file("base").read_text()
    assert json.loads(paths.timings_file(paths.metrics_file("base")).read_text())["drills"]["numbers"]["seconds"] > 0


def test_teacher_trains_from_the_drilled_base_or_from_scratch_larger(workspace):
    """teacher.init base (the default): the drilled student's weights, trained on; init scratch: a model of the
    teacher's own, larger sizes. Either shares the student's tokenizer."""
    import yaml

    from stages import teacher

    params = yaml.safe_load(Path("params.yaml").read_text())
    base = json.loads(paths.metrics_file("base").read_text())
    metrics = json.loads(paths.metrics_file("teacher").read_text())  # the built DAG's: init base
    student_tok = json.loads((paths.model_dir("base") / "tokenizer.json").read_text())
    teacher_tok = json.loads((paths.model_dir("teacher") / "tokenizer.json").read_text())
    assert teacher_tok["model"]["vocab"] == student_tok["model"]["vocab"]  # shared: logit distillation works
    write_params(Path("."), {**params, "teacher": {**params["teacher"], "init": "scratch"}})
    teacher.main()
    scratch = json.loads(paths.metrics_file("teacher").read_text())
    assert scratch["backend"] == "embedded" and scratch["parameters"] > base["parameters"]
    assert metrics["backend"] == "embedded" and metrics["parameters"] == base["parameters"]
    assert metrics["steps"] == TINY_PARAMS["teacher"]["train"]["max_steps"] and metrics["weights_changed"] == 1.0
    scratch_tok = json.loads((paths.model_dir("teacher") / "tokenizer.json").read_text())
    assert scratch_tok["model"]["vocab"] == student_tok["model"]["vocab"]
    assert (paths.live_dir("teacher") / "plots" / "metrics" / "loss.tsv").exists()


def test_distill_outputs_are_consistent(workspace):
    from pipeline.data.distill import contaminated, eval_ngrams
    from stages import distill

    p = TINY_PARAMS["distill"]
    metrics = json.loads(paths.metrics_file("distill").read_text())
    n = metrics["questions_sampled"]
    assert 0 < n <= p["max_questions"] and metrics["samples"] == p["k"] * n
    assert sum(metrics["pass_rate_histogram"].values()) == n
    timings = json.loads(paths.timings_file(paths.metrics_file("distill")).read_text())
    assert metrics["teacher_tokens"] > 0 and timings["teacher_seconds"] > 0 and "teacher_seconds" not in metrics
    traces = read_rows(paths.split_file("train", "distill"), required=(*EXAMPLE_COLUMNS, "pass_rate"))
    rates = read_rows(paths.split_file("pass_rates", "distill"))
    hard = read_rows(paths.split_file("hard", "distill"))
    pairs = read_rows(paths.split_file("pairs", "distill"), required=("prompt", "chosen", "rejected", "source"))
    assert len(rates) == n and len(traces) == metrics["traces_kept"] and len(pairs) == metrics["preference_pairs"]
    correct = sum(r["correct"] for r in rates)
    assert metrics["acceptance_rate"] == pytest.approx(correct / metrics["samples"], abs=1e-4)
    # every sample is either kept or removed for a named reason
    assert metrics["traces_kept"] + sum(metrics["traces_removed"].values()) == metrics["samples"]
    by_id = {r["id"]: r for r in rates}
    assert all(t["pass_rate"] == by_id[t["id"]]["pass_rate"] > 0 for t in traces)
    assert all(0.2 <= h["pass_rate"] <= 0.625 for h in hard)
    assert all(p_["chosen"] != p_["rejected"] and p_["source"] == "teacher" for p_ in pairs)
    evals = [r for s in ("val", "test", "ood") for r in read_rows(paths.split_file(s))]
    index = eval_ngrams(evals, 8)
    assert not any(contaminated(r["question"], index, 8) for r in traces)
    assert (paths.live_dir("distill") / "pass_rate.png").exists()
    # a data stage is byte-for-byte reproducible (no timings in its folder), so sft does not re-run for nothing
    before = {f.name: f.read_bytes() for f in paths.stage_data("distill").iterdir()}
    distill.main()
    after = {f.name: f.read_bytes() for f in paths.stage_data("distill").iterdir()}
    old, new = json.loads(before["config.json"])["counts"], json.loads(after["config.json"])["counts"]
    assert {k: (old[k], new.get(k)) for k in old if old[k] != new.get(k)} == {}
    assert after == before


def test_sft_changes_the_weights_then_drills_the_ranking_step(workspace, stage_logs):
    before = load_file(paths.model_dir("base") / "model.safetensors")
    after = load_file(paths.model_dir("sft") / "model.safetensors")
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)
    metrics = json.loads(paths.metrics_file("sft").read_text())
    assert metrics["steps"] == TINY_PARAMS["sft"]["max_steps"]
    assert metrics["weights_changed"] == 1.0
    assert (paths.live_dir("sft") / "plots" / "metrics" / "loss.tsv").exists()
    assert (paths.live_dir("sft") / "plots" / "metrics" / "eval" / "loss.tsv").exists()
    # last, the ranking drill (a step of each curriculum phase, then one on every rank), its curves beside
    # SFT's; three steps never read `expect` (0.5): a warning says so
    drill = metrics["rank_drill"]
    assert drill["steps"] == 3 and [p["steps"] for p in drill["phases"]] == [1, 1, 1] and 0 <= drill["exact"] <= 1
    assert (paths.live_dir("sft") / "rank_drill" / "metrics.json").exists()
    assert any(r.levelname == "WARNING" and "ranking drill" in r.getMessage() for r in stage_logs["sft"])


def test_sft_mixed_source_with_curriculum_and_logits(workspace):
    """sft.source=mixed, the curriculum's stage 2 and on-policy logit distillation, in one stage run."""
    import yaml

    from stages import sft

    params = yaml.safe_load(Path("params.yaml").read_text())
    hard = read_rows(paths.split_file("hard", "distill"))
    distilled = read_rows(paths.split_file("train", "distill"))
    write_params(Path("."), {**params, "sft": {**params["sft"], "source": "mixed", "curriculum": True},
                             "distill": {**params["distill"], "method": "logits"}})
    sft.main()
    metrics = json.loads(paths.metrics_file("sft").read_text())
    assert metrics["source"] == "mixed"
    assert metrics["examples"] == TINY_PARAMS["synthesize"]["n_train"] + len(distilled)
    assert metrics["stage2"]["examples"] == len(hard)
    if hard:
        assert metrics["stage2"]["weights_changed"] == 1.0
    assert metrics["logits"]["steps"] == TINY_PARAMS["distill"]["logit_steps"]
    assert metrics["logits"]["weights_changed"] > 0


def test_prm_data_labels_policy_steps_from_gold_values_and_mcts(workspace):
    rows = read_rows(paths.split_file("train", "prm_data"))
    val = read_rows(paths.split_file("val", "prm_data"))
    # The 12-step tiny policy rarely writes a Step or Answer line: gold rows may be few, MCTS paths always exist.
    assert "mcts" in {r["source"] for r in rows} <= {"gold", "mcts"} and {r["source"] for r in val} <= {"gold"}
    # Training paths come from new questions (ids apart from the dataset's), the held-out ones from val.parquet.
    assert all(r["id"].startswith("prm-") for r in rows) and all(r["id"].startswith("val-") for r in val)
    for r in rows + val:
        assert len(r["steps"]) == len(r["labels"]) > 0
        assert all(0.0 <= y <= 1.0 for y in r["labels"])
        if r["source"] == "gold":
            assert set(r["labels"]) <= {0.0, 1.0}
    metrics = json.loads(paths.metrics_file("prm_data").read_text())
    assert metrics["gold"]["lines"] == sum(len(r["labels"]) for r in rows if r["source"] == "gold")
    assert metrics["mcts_vs_gold"]["lines"] == sum(len(r["labels"]) for r in rows if r["source"] == "mcts")
    assert (paths.live_dir("prm_data") / "label_balance.png").exists()
    # The gold chain of every new question (24 gold + 4 MCTS + 4 chain-only): every line right by the grader.
    chains = read_rows(paths.stage_data("prm_data") / "chains.parquet")
    assert len(chains) == len({r["id"] for r in chains}) == 32 and {r["source"] for r in chains} == {"chain"}
    assert {r["id"] for r in rows} <= {r["id"] for r in chains}
    assert all(r["steps"][-1].startswith("Answer:") and set(r["labels"]) == {1.0} for r in chains)
    assert metrics["chain"]["rows"] == 32 and metrics["chain"]["share_at_least_half"] == 1.0


def test_prm_data_refuses_the_policys_own_question_seed(workspace, capsys):
    import copy

    from stages import prm_data

    params = copy.deepcopy(TINY_PARAMS)
    params["prm_data"]["question_seed"] = params["synthesize"]["seed"]
    before = (paths.stage_data("prm_data") / "train.parquet").read_bytes()
    write_params(workspace, params)
    with pytest.raises(SystemExit) as exc:
        prm_data.main()
    assert exc.value.code == 2
    assert "prm_data.question_seed" in capsys.readouterr().err
    assert (paths.stage_data("prm_data") / "train.parquet").read_bytes() == before


def test_prm_trains_the_policy_as_a_verifier_and_reports_held_out_auroc(workspace):
    metrics = json.loads(paths.metrics_file("prm").read_text())
    assert "rank_drill" not in metrics  # the policy it starts from drilled in `sft`
    assert metrics["weights_changed"] > 0.5 and metrics["steps"] > 0
    assert metrics["sources"]["chain"] == 32 \
        and metrics["paths"] + metrics["too_long"] == sum(metrics["sources"].values())
    # Contrast paths cut from those 32 chains (prm.contrast of params.yaml): each choice step right once, then wrong.
    cfg = load_section("prm", PRMConfig)
    contrast = contrast_rows(read_rows(paths.stage_data("prm_data") / "chains.parquet"), cfg.contrast,
                             random.Random(cfg.seed))
    assert cfg.contrast > 0 and metrics["sources"]["contrast"] == len(contrast) > 0
    assert 0 < metrics["contrast_wrong"] == sum(r["labels"][-1] == 0.0 for r in contrast) < len(contrast)
    assert metrics["held_out"]["lines"] == sum(len(r["labels"]) for r in read_rows(paths.split_file("val", "prm_data")))
    assert metrics["auroc"] is None or 0.0 <= metrics["auroc"] <= 1.0
    if metrics["held_out"]["lines"]:
        assert 0.0 <= metrics["accuracy"] <= 1.0
    else:  # no held-out lines (the tiny profile's val split may give none): nothing measured, not a 0
        assert metrics["accuracy"] is None and metrics["ece"] is None
    assert set(metrics["held_out"]["within_question"]) == {
        "pair_accuracy_min", "pair_accuracy_last", "pair_accuracy_mean", "pairs"}
    calibration = json.loads((paths.live_dir("prm") / "calibration.json").read_text())
    assert sum(b["lines"] for b in calibration) == metrics["held_out"]["lines"]
    assert (paths.live_dir("prm") / "calibration.png").exists()
    from pipeline.prm.model import PRMScorer

    scorer = PRMScorer.load(paths.model_dir("prm"), device="cpu")  # a marked PRM: the policy's LM read as verdicts
    assert scorer.score(["Question: ?\n"], [["Step 1: x.", "Answer: 1"]])[0] != []


def test_evaluate(workspace):
    assert json.loads(paths.eval_metrics_file("teacher").read_text())["accuracy"] >= 0.0
    metrics = json.loads(paths.eval_metrics_file("sft").read_text())
    for key in ("accuracy", "accuracy_ood", "step_accuracy", "by_answer_type", "by_task_type", "by_chain_length",
                "tokens_per_question", "baseline_majority"):
        assert key in metrics, key
    timings = json.loads(paths.timings_file(paths.eval_metrics_file("sft")).read_text())
    assert "seconds_per_question" not in metrics and timings["seconds_per_question"] > 0
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["tokens_per_question"] > 0
    records = read_rows(paths.eval_predictions_dir("sft") / "predictions.parquet")
    p = TINY_PARAMS["synthesize"]
    assert len(records) == p["n_test"] + p["n_ood"]
    assert metrics["accuracy"] == pytest.approx(
        sum(r["correct"] for r in records if r["split"] == "test") / p["n_test"], abs=1e-4
    )
    assert (paths.eval_plots_dir("sft") / "by_task_type.png").exists()
    strategies = ("greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote", "prm_beam", "prm_mcts")
    assert set(metrics["decoding"]) == set(strategies)
    for name in strategies:
        d = metrics["decoding"][name]
        assert d["questions"] == TINY_PARAMS["evaluate"]["k_samples"] and 0.0 <= d["accuracy_ood"] <= 1.0
        assert d["tokens_per_question"] > 0 and timings["decoding"][name]["seconds_per_question"] > 0
        # the tiny policy may write no scorable line in its whole samples; beam and MCTS always score theirs
        assert d["prm_tokens_per_question"] > 0 if name in ("prm_beam", "prm_mcts") else name.startswith("prm_") or \
            d["prm_tokens_per_question"] == 0
    best = metrics["decoding"]["prm_best_of_n"]
    for ceiling in (best["ceilings"], best["ceilings_ood"]):
        assert set(ceiling) == {"pass_at_n", "step_oracle", "all_steps_right"}
        assert 0.0 <= ceiling["step_oracle"] <= ceiling["pass_at_n"] <= 1.0
    greedy_first = [r for r in records if r["split"] == "test"][: TINY_PARAMS["evaluate"]["k_samples"]]
    assert metrics["decoding"]["greedy"]["accuracy"] == pytest.approx(
        sum(r["correct"] for r in greedy_first) / len(greedy_first), abs=1e-4)
    assert set(metrics["faithfulness"]) == {"pairs", "answered", "inconsistent", "inconsistency_rate", "trend"}
    assert set(metrics["faithfulness"]["trend"]) == {"pairs", "answered", "inconsistent", "inconsistency_rate"}
    assert (paths.eval_plots_dir("sft") / "decoding.png").exists()


def test_evaluate_refuses_a_prm_with_another_tokenizer(workspace, capsys):

    from pipeline.modeling.models import train_tokenizer
    from stages import evaluate

    # evaluate.decoding.prm names the prm stage's folder only (its DVC dependency): the PRM there gets a tokenizer
    # of other words
    prm_dir = paths.model_dir("prm")
    train_tokenizer(["a vocabulary from other words entirely"] * 20, vocab_size=280).save_pretrained(prm_dir)
    before = paths.eval_metrics_file("sft").read_bytes()
    with pytest.raises(SystemExit) as exc:
        evaluate.main(["--model", "sft"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "models/prm: the PRM's tokenizer" in err and "models/sft" in err
    assert paths.eval_metrics_file("sft").read_bytes() == before  # nothing half-written


def test_mine_buckets_the_pool_and_builds_pairs(workspace):
    from stages import mine

    metrics = json.loads(paths.metrics_file("mine").read_text())
    pool = read_rows(paths.split_file("pool", "mine"))
    rl = read_rows(paths.split_file("rl", "mine"))
    pairs = read_rows(paths.split_file("pairs", "mine"))
    assert metrics["pool_prompts"] == len(pool) == TINY_PARAMS["mine"]["pool_size"]
    assert sum(metrics["buckets"].values()) == len(pool)
    assert sum(metrics["pass_rate_histogram"].values()) == len(pool)
    assert metrics["p0"] == pytest.approx(sum(r["pass_rate"] for r in pool) / len(pool), abs=1e-4)
    # default repeats: unsolved 1, hard 2, easy 1, solved 0
    b = metrics["buckets"]
    assert len(rl) == metrics["rl_rows"] == b["unsolved"] + 2 * b["hard"] + b["easy"]
    assert all(p["chosen"] != p["rejected"] and p["source"] == "policy" for p in pairs)
    assert len(pairs) == metrics["preference_pairs"]
    assert (paths.live_dir("mine") / "pass_rate.png").exists()
    before = {f.name: f.read_bytes() for f in paths.stage_data("mine").iterdir()}
    mine.main()  # a rerun writes the same bytes, so DVC does not re-run grpo and dpo
    assert {f.name: f.read_bytes() for f in paths.stage_data("mine").iterdir()} == before


def test_grpo_trains_with_guided_replay_and_logs_curves(workspace):
    metrics = json.loads(paths.metrics_file("grpo").read_text())
    p = TINY_PARAMS["grpo"]
    assert metrics["steps"] == p["max_steps"] and metrics["weights_changed"] == 1.0
    assert metrics["rollouts"] == p["max_steps"] * p["prompts_per_step"] * p["num_generations"]
    assert metrics["guided_replay"]["groups"] == p["max_steps"] * p["prompts_per_step"]
    assert 0.0 <= metrics["p0"] <= 1.0 and metrics["p_star"] >= metrics["p0"]
    assert metrics["success_prompts"] == p["success_prompts"] and 0.0 <= metrics["p_after"] <= 1.0
    curves = paths.live_dir("grpo") / "plots" / "metrics"
    assert (curves / "reward.tsv").exists() and (curves / "kl.tsv").exists()
    assert (curves / "rewards" / "accuracy" / "mean.tsv").exists()
    # every curve dvc.yaml declares for GRPO is written, with its column, one row per logged step; the folder of
    # reward functions holds each weighted one's
    plots = [spec for plot in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"] if isinstance(plot, dict)
             for spec in plot.items()]
    declared = [(Path(f), column) for _, spec in plots for f, column in spec.get("y", {}).items()
                if f.startswith("plots/grpo/")]
    assert len(declared) >= 11
    for path, column in declared:
        rows = path.read_text().splitlines()
        assert rows[0].split("\t") == ["step", column] and len(rows) - 1 == p["max_steps"] // p["logging_steps"], path
    folders = [Path(name) for name, spec in plots if name.startswith("plots/grpo/") and "y" not in spec]
    assert folders == [curves / "rewards"]
    assert {f.parent.name for f in folders[0].glob("*/mean.tsv")} == set(TINY_PARAMS["rewards"]["weights"])
    before = load_file(paths.model_dir("sft") / "model.safetensors")
    after = load_file(paths.model_dir("grpo") / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_grpo_tbrm_one_rollout_per_prompt(workspace):
    import yaml

    from stages import grpo

    params = yaml.safe_load(Path("params.yaml").read_text())
    saved = paths.model_dir("grpo") / "model.safetensors"
    kept = saved.read_bytes()
    # with a custom reward from the repository's rewards/ package, logged under its params name
    custom = {"brevity": {"function": "rewards.example:brevity", "weight": 0.1}}
    write_params(Path("."), {**params, "grpo": {**params["grpo"], "algorithm": "tbrm"},
                             "rewards": {**params["rewards"], "custom": custom}})
    grpo.main()
    metrics = json.loads(paths.metrics_file("grpo").read_text())
    brevity = paths.live_dir("grpo") / "plots" / "metrics" / "rewards" / "brevity" / "mean.tsv"
    values = [float(line.split("\t")[-1]) for line in brevity.read_text().splitlines()[1:]]
    p = TINY_PARAMS["grpo"]
    assert values and all(0.0 <= v <= 1.0 for v in values)  # rewards.example:brevity was called on the rollouts
    assert metrics["algorithm"] == "tbrm" and metrics["weights_changed"] == 1.0
    assert metrics["rollouts"] == p["max_steps"] * p["prompts_per_step"] * p["num_generations"]  # equal rollouts
    assert "guided_replay" not in metrics
    assert saved.read_bytes() != kept


def test_grpo_rejects_an_unknown_reward_before_any_work(workspace, capsys):
    import yaml

    from stages import grpo

    params = yaml.safe_load(Path("params.yaml").read_text())
    saved = (paths.model_dir("grpo") / "model.safetensors").read_bytes()
    bad = {**params, "rewards": {**params["rewards"], "weights": {"accuracy": 1.0, "helpfulness": 0.5}}}
    Path("params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(SystemExit) as exc:
        grpo.main()
    assert exc.value.code == 2
    assert "rewards.weights.helpfulness" in capsys.readouterr().err
    assert (paths.model_dir("grpo") / "model.safetensors").read_bytes() == saved


def test_grpo_whose_updates_were_all_zero_fails_unless_allowed(workspace, caplog, capsys):
    """max_steps 1 is the warm-up's first step, at learning rate 0: no weight moves. The stage fails (exit 1) and
    leaves models/grpo and its metrics as they were, rather than pass the SFT model off as trained;
    grpo.allow_no_update publishes it with a warning."""
    from stages import grpo

    params = yaml.safe_load(Path("params.yaml").read_text())
    kept = {path: path.read_bytes() for path in [paths.metrics_file("grpo"), *paths.model_dir("grpo").iterdir()]}
    write_params(Path("."), {**params, "grpo": {**params["grpo"], "max_steps": 1}})
    with pytest.raises(SystemExit) as failed:
        grpo.main()
    untouched = {path: path.read_bytes() for path in [paths.metrics_file("grpo"), *paths.model_dir("grpo").iterdir()]}
    write_params(Path("."), {**params, "grpo": {**params["grpo"], "max_steps": 1, "allow_no_update": True}})
    grpo.main()
    metrics = json.loads(paths.metrics_file("grpo").read_text())
    assert failed.value.code == 1 and untouched == kept
    assert ("error: grpo: 1 step(s) left the weights as they were (a learning rate of 0, as in the first warm-up "
            "step, or gradients that were all zero); nothing is published") in capsys.readouterr().err
    assert metrics["steps"] == 1 and metrics["weights_changed"] == 0.0
    assert "published anyway (grpo.allow_no_update)" in caplog.text
    # the run's health is in its metrics: TRL's per-step shares, averaged over the logs
    assert 0.0 <= metrics["zero_std_share"] <= 1.0 and 0.0 <= metrics["truncated_share"] <= 1.0
    assert metrics["completion_length"] > 0 and metrics["clip_ratio"] == 0.0  # one step: the ratio is 1, unclipped


def test_sft_extended_trains_for_grpos_compute_in_token_passes(workspace):
    from pipeline.data.task_data import gold_rows
    from pipeline.modeling.models import load_tokenizer
    from pipeline.orchestration.sections import load_named
    from pipeline.rl.grpo import passes_per_token
    metrics = json.loads(paths.metrics_file("sft_extended").read_text())
    grpo = json.loads(paths.metrics_file("grpo").read_text())
    cfg, sft = load_named("grpo"), load_named("sft")
    # generation 1 + training 3 (+ the reference's forward 1 with the KL term on) passes per rollout token
    assert passes_per_token(cfg) == (5 if cfg.beta > 0 else 4)
    assert grpo["tokens"] > 0 and grpo["token_passes"] == grpo["tokens"] * passes_per_token(cfg)
    assert metrics["target_token_passes"] == grpo["token_passes"]
    rows = gold_rows(sft.rationale_share)[: sft.max_train_samples]
    tokenizer = load_tokenizer(paths.model_dir("sft"))
    lengths = [len(tokenizer(r["prompt"] + r["rationale"])["input_ids"]) + 1 for r in rows]  # raw prompts, + EOS
    assert metrics["tokens_per_step"] == pytest.approx(sum(lengths) / len(lengths) * sft.per_device_train_batch_size
                                                       * sft.gradient_accumulation_steps, abs=0.05)
    assert metrics["planned_steps"] == max(1, round(grpo["token_passes"] / (3 * metrics["tokens_per_step"])))
    assert metrics["steps"] == metrics["planned_steps"] and metrics["weights_changed"] == 1.0


def test_a_bfloat16_model_section_trains_float32_master_weights(workspace):
    """model.dtype: bfloat16 is how the sampling stages load; a trainer keeps float32 weights, or AdamW's small
    updates (a pretrained model's 1e-5) round away in bfloat16: most elements would not move at all."""
    import yaml

    from stages import sft_extended

    params = yaml.safe_load(Path("params.yaml").read_text())
    before = load_file(paths.model_dir("sft") / "model.safetensors")
    write_params(Path("."), {**params, "model": {"dtype": "bfloat16"},
                             "sft_extended": {**params["sft_extended"], "learning_rate": 1e-5}})
    sft_extended.main()
    after = load_file(paths.model_dir("sft_extended") / "model.safetensors")
    reported = json.loads(paths.metrics_file("sft_extended").read_text())["elements_changed"]
    assert {t.dtype for t in after.values()} == {torch.float32}
    moved = sum(int((after[k] != before[k]).sum()) for k in before) / sum(t.numel() for t in before.values())
    assert moved > 0.9  # in bfloat16, 1e-5 steps moved 7% of a pretrained model's elements
    assert reported == pytest.approx(moved, abs=1e-3)  # the metrics say so


def test_sft_extended_steps_by_hand():
    from stages.sft_extended import planned_steps

    # 100 tokens a step: 300 token passes
    assert planned_steps(3000, 100) == 10
    assert planned_steps(3149, 100) == 10
    assert planned_steps(3151, 100) == 11
    assert planned_steps(1, 100) == 1  # at least one step


def test_dpo_trains_on_pairs_and_passes_through_without_any(workspace, caplog, capsys):
    from pipeline.core.io import write_rows
    from pipeline.data.distill import PAIR_SCHEMA
    from stages import dpo

    pairs_file = paths.split_file("pairs", "mine")
    gold = read_rows(paths.split_file("train"))[:8]
    # right vs wrong chains of the same prompts: the gold rationale against one with the answer changed
    pairs = [{"id": r["id"], "prompt": r["prompt"], "chosen": r["rationale"],
              "rejected": r["rationale"].rsplit("Answer:", 1)[0] + "Answer: 12345", "source": "policy"} for r in gold]
    write_rows(pairs_file, [], schema=PAIR_SCHEMA)
    dpo.main()
    empty = json.loads(paths.metrics_file("dpo").read_text())
    write_rows(pairs_file, pairs[:4], schema=PAIR_SCHEMA)  # one batch: one step, at the warm-up's lr 0
    with pytest.raises(SystemExit) as failed:
        dpo.main()
    untouched = json.loads(paths.metrics_file("dpo").read_text())
    write_rows(pairs_file, pairs, schema=PAIR_SCHEMA)
    dpo.main()
    metrics = json.loads(paths.metrics_file("dpo").read_text())
    assert empty == {"source": "mine", "pairs": 0, "steps": 0, "weights_changed": 0.0, "elements_changed": 0.0,
                     "world_size": 1}  # the SFT model, said so
    # one step that moved nothing fails the stage and publishes nothing (dpo.allow_no_update would)
    assert failed.value.code == 1 and untouched == empty
    assert "error: dpo: 1 step(s) left the weights as they were" in capsys.readouterr().err
    assert metrics["pairs"] == 8 and metrics["weights_changed"] == 1.0
    assert metrics["steps"] == 2  # 8 pairs, batch 4, 1 epoch
    assert (paths.live_dir("dpo") / "plots" / "metrics" / "rewards" / "margins.tsv").exists()
    before = load_file(paths.model_dir("sft") / "model.safetensors")
    after = load_file(paths.model_dir("dpo") / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_evaluate_reports_pass_at_k_and_maj_at_k(workspace):
    metrics = json.loads(paths.eval_metrics_file("grpo").read_text())
    k = 4
    for key in (f"pass_at_{k}", f"maj_at_{k}", f"pass_at_{k}_ood", f"maj_at_{k}_ood"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["sampled"]["questions"] == TINY_PARAMS["evaluate"]["k_samples"]
    # pass@k is at least the mean sampled accuracy, maj@k needs an answer line
    assert metrics[f"pass_at_{k}"] >= metrics["sampled"]["sampled_accuracy"]


def test_corrupted_input_fails_naming_the_file(workspace, capsys):
    from stages import base

    train = paths.split_file("train")
    good = train.read_bytes()
    model_before = (paths.model_dir("base") / "model.safetensors").read_bytes()
    train.write_bytes(good[: len(good) // 2])  # a truncated download
    with pytest.raises(SystemExit) as exc:
        base.main()
    assert exc.value.code == 2
    assert "data/synthesize/train.parquet" in capsys.readouterr().err
    # the previous output is untouched and no temporary folder is left
    assert (paths.model_dir("base") / "model.safetensors").read_bytes() == model_before
    assert [p.name for p in paths.MODELS.iterdir() if p.name.startswith(".")] == []


def test_openai_teacher_end_to_end_keeps_the_key_out(workspace, monkeypatch):
    """teacher.backend=openai against the real loopback server serving the trained tiny teacher:
    distill samples over HTTP, a rerun is answered from the cache, the key is in no written file."""
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    import yaml

    from stages import distill, evaluate, teacher

    secret = "sk-stage-test-SECRET-987"
    monkeypatch.setenv("STAGE_TEACHER_KEY", secret)
    with socket.socket() as sock:  # a free loopback port for the server process
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # A separate process, as a real vLLM/SGLang server would be (and no torch thread left at exit here).
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.inference.openai_server", str(paths.model_dir("teacher").resolve()), "--port",
         str(port), "--api-key-env", "STAGE_TEACHER_KEY", "--served-model-name", "local"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(300):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/models",
                                   headers={"Authorization": f"Bearer {secret}"}), timeout=1)
            break
        except OSError:
            assert server.poll() is None, server.stderr.read()
            time.sleep(0.2)
    folder = workspace / "api_teacher"
    shutil.copytree(paths.stage_data("synthesize"), folder / paths.stage_data("synthesize"))
    shutil.copytree(paths.model_dir("prm"), folder / paths.model_dir("prm"))
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["teacher"] = {"backend": "openai", "base_url": url, "model": "local",
                         "api_key_env": "STAGE_TEACHER_KEY", "concurrency": 4, "timeout_s": 30}
    params["evaluate"] = {**params["evaluate"], "splits": ["test"], "sampled_splits": ["test"]}
    write_params(folder, params)
    monkeypatch.chdir(folder)
    try:
        teacher.main()
        distill.main()
        first = json.loads(paths.metrics_file("distill").read_text())
        distill.main()
        second = json.loads(paths.metrics_file("distill").read_text())
        evaluate.main(["--model", "teacher"])
    finally:
        server.terminate()
        server_log = server.communicate(timeout=30)[1]
    assert secret not in server_log
    n = first["questions_sampled"]
    assert first["teacher"] == "openai:local" and first["teacher_requests"]["prompts_requested"] == n
    assert second["teacher_requests"]["cache_hits"] == n and second["teacher_requests"]["requests"] == 0
    assert second["traces_kept"] == first["traces_kept"]  # same answers from the cache
    evaluated = json.loads(paths.eval_metrics_file("teacher").read_text())
    assert evaluated["accuracy"] >= 0.0
    # an API policy: whole samples reranked by the PRM, no step-level search (it needs the local model)
    assert set(evaluated["decoding"]) == {"greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote"}
    written = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".sqlite" for p in written)
    assert [p for p in written if secret.encode() in p.read_bytes()] == []


def test_transformers_teacher_references_a_saved_model(workspace, monkeypatch):
    """teacher.backend=transformers: models/teacher only points at the path; distill and evaluate load it."""
    import shutil

    import yaml

    from stages import distill, evaluate, teacher

    folder = workspace / "hf_teacher"
    shutil.copytree(paths.stage_data("synthesize"), folder / paths.stage_data("synthesize"))
    shutil.copytree(paths.model_dir("prm"), folder / paths.model_dir("prm"))
    saved = (workspace / paths.model_dir("teacher")).resolve()
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["teacher"] = {"backend": "transformers", "model": str(saved)}
    params["evaluate"] = {**params["evaluate"], "splits": ["test"], "sampled_splits": ["test"]}
    monkeypatch.chdir(folder)  # first: the params derive teacher.model_dependency from where they are written
    write_params(folder, params)
    teacher.main()
    assert sorted(p.name for p in paths.model_dir("teacher").iterdir()) == ["README.md", paths.MODEL_MANIFEST]  # card
    distill.main()
    evaluate.main(["--model", "teacher"])
    ours = json.loads(paths.metrics_file("distill").read_text())
    theirs = json.loads((workspace / paths.metrics_file("distill")).read_text())
    # the same weights, params and seed as the embedded run: the same samples
    assert ours["teacher"] == str(saved)
    assert {k: ours[k] for k in ("acceptance_rate", "pass_rate_histogram", "traces_kept")} == {
        k: theirs[k] for k in ("acceptance_rate", "pass_rate_histogram", "traces_kept")}


def test_lora_trains_only_adapters_in_sft_grpo_and_dpo_and_evaluate_loads_them(workspace):
    """`lora`: sft saves its adapter beside models/base (which keeps its bytes), grpo an adapter on that adapter,
    dpo a merged model whose linear weights moved by a rank-r update and whose embeddings did not; evaluate
    loads the adapter chain."""
    import yaml

    from pipeline.core.io import write_rows
    from pipeline.data.distill import PAIR_SCHEMA
    from stages import dpo, evaluate, grpo, sft

    params = yaml.safe_load(Path("params.yaml").read_text())
    base_bytes = (paths.model_dir("base") / "model.safetensors").read_bytes()
    gold = read_rows(paths.split_file("train"))[:8]
    write_rows(paths.split_file("pairs", "mine"), [  # as in the DPO test: gold against a wrong final answer
        {"id": g["id"], "prompt": g["prompt"], "chosen": g["rationale"], "source": "policy",
         "rejected": g["rationale"].rsplit("Answer:", 1)[0] + "Answer: 12345"} for g in gold], schema=PAIR_SCHEMA)
    r = 2
    write_params(Path("."), {**params, "lora": {"sft": True, "grpo": True, "dpo": True, "r": r, "save": "adapter"}})
    sft.main()
    grpo.main()
    write_params(Path("."), {**params, "lora": {"dpo": True, "r": r, "save": "merged"}})
    dpo.main()
    evaluate.main(["--model", "grpo"])
    assert (paths.model_dir("base") / "model.safetensors").read_bytes() == base_bytes
    for stage, on in (("sft", "models/base"), ("grpo", "models/sft")):
        folder = paths.model_dir(stage)
        assert not (folder / "model.safetensors").exists()
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == on
        adapter = load_file(folder / "adapter_model.safetensors")
        assert adapter and all("lora_" in k for k in adapter)
        # B starts at zero: trained, every B moved
        assert all(adapter[k].abs().sum() > 0 for k in adapter if "lora_B" in k), stage
        metrics = json.loads(paths.metrics_file(stage).read_text())
        assert 0 < metrics["lora"]["trainable_parameters"] < metrics["lora"]["parameters"] / 2, metrics["lora"]
    assert json.loads(paths.eval_metrics_file("grpo").read_text())["questions"] > 0

    from pipeline.modeling.models import load_weights

    policy = load_weights(paths.model_dir("sft")).state_dict()  # the sft adapter folded into the base
    merged = load_file(paths.model_dir("dpo") / "model.safetensors")
    assert json.loads(paths.metrics_file("dpo").read_text())["lora"]["save"] == "merged"
    assert torch.equal(merged["model.embed_tokens.weight"], policy["model.embed_tokens.weight"])
    update = merged["model.layers.0.self_attn.q_proj.weight"] - policy["model.layers.0.self_attn.q_proj.weight"]
    assert 0 < torch.linalg.matrix_rank(update, atol=1e-6) <= r
