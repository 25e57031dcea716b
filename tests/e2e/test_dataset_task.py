"""A dataset of your own through the whole DAG: `python -m pipeline repro` on the `tiny` profile with
`task.kind: dataset`, in a temporary git repository.

- GSM8K format, the file outside the repository (a DVC dependency by absolute path), a loaded
  student of another architecture than Qwen2 (a Llama saved here in Hugging Face format, with its
  own tokenizer, chat template and EOS) read through its template (`prompt.format: chat` with a
  system message; SFT, GRPO and DPO on TRL's conversational format): every stage runs, the chart-only ones say they
  are skipped and write empty but valid outputs, the metrics are written, a second repro runs nothing, and an edit of
  the dataset file makes the data stage and everything after it stale.
- MATH format (`\\boxed{}` answers, paragraph steps, math-verify): the DAG up to sft's evaluation runs too.
"""

from __future__ import annotations

import json
import random
import re
import sys

import pytest
import yaml

from pipeline.data.wordproblems import TEST_FRAMES, TRAIN_FRAMES, generate
from tests.conftest import copy_project
from tests.e2e.test_repro import ALL_STAGES, EVALUATED, dvc, ran_stages, sh

pytestmark = pytest.mark.e2e

CHART_ONLY_LOGS = ("animate: skipped", "base: drills skipped", "sft: ranking drill skipped",
                   "prm: contrast paths skipped")


def math_rows(n: int, seed: int) -> list[dict]:
    """MATH-format problems: fraction sums with the answer in \\boxed{} (a reduced fraction, or a whole number)."""
    from fractions import Fraction

    rng, rows = random.Random(seed), []
    while len(rows) < n:
        a, b, c, d = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
        total = Fraction(a, b) + Fraction(c, d)
        shown = (str(total.numerator) if total.denominator == 1
                 else f"\\frac{{{total.numerator}}}{{{total.denominator}}}")
        rows.append({"problem": f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$?",
                     "solution": f"The common denominator is ${b * d}$.\n\nSo the sum is $\\boxed{{{shown}}}$."})
    return rows


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# Llama 3's layout: special header tokens, and an end-of-turn token that is the tokenizer's EOS
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def save_llama(folder) -> None:
    """A 1-layer Llama with a tokenizer trained on word problems and its own chat template and EOS, saved as any
    Hub model would be."""
    from pipeline.modeling.models import build_student, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    corpus = [r["question"] + r["answer"] for r in generate(200, TRAIN_FRAMES, 5)]
    tokenizer = train_tokenizer(corpus, 320, "spaced")
    tokenizer.add_special_tokens({"eos_token": "<|eot_id|>",
                                  "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]})
    tokenizer.chat_template = LLAMA3_TEMPLATE
    cfg = BaseModelConfig(seed=0, architecture="llama", vocab_size=320, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=512)
    save_model(build_student(cfg, tokenizer), tokenizer, folder)


def make_repo(root, name: str, sets: list[str]):
    folder = copy_project(root / name)
    params = sh([sys.executable, "-m", "pipeline", "params", "--profile", "tiny", *sum((["-S", s] for s in sets), [])],
                folder).stdout
    (folder / "params.yaml").write_text(params)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", name]):
        sh(cmd, folder)
    return folder


@pytest.mark.slow  # the whole DAG on a dataset task and a second architecture (`make test-slow`)
def test_a_gsm8k_file_outside_the_repository_with_a_loaded_llama(tmp_path, prefect_api):
    data = tmp_path / "elsewhere" / "gsm8k"
    write_jsonl(data / "train.jsonl", generate(160, TRAIN_FRAMES, 0))
    write_jsonl(data / "test.jsonl", generate(30, TEST_FRAMES, 1))
    save_llama(tmp_path / "llama")
    repo = make_repo(tmp_path, "repo", [
        "task.kind=dataset", f"task.dataset={{path: {data}, answer_extraction: gsm8k}}", "task.answer_format=gsm8k",
        "task.grader=math_verify", "prm.sources=[mc, mcts]", "rewards.weights={accuracy: 1.0, format: 0.1}",
        # room for the gold rationales guided replay puts into failing groups (65 to 175 tokens here): cut at the
        # tiny profile's 32, their answers are lost, every group's rewards agree, and GRPO rightly fails
        "grpo.max_completion_length=192",
        f"base.model={tmp_path / 'llama'}",
        "prompt={format: chat, system: Solve the problem step by step.}"])
    assert yaml.safe_load((repo / "params.yaml").read_text())["task"]["data_dependency"] == str(data)

    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo)
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == ALL_STAGES
    for line in CHART_ONLY_LOGS:  # base.model is loaded: its drills never run, skipped or not
        assert line in out or line.startswith("base:"), line
    assert "faithfulness {'skipped'" in out
    shown = dvc("plots", "show", cwd=repo)  # the skipped parts' plots are stand-ins, so every plot loads
    assert shown.returncode == 0 and "failed to load" not in shown.stdout + shown.stderr, shown.stderr[-2000:]
    metrics = json.loads((repo / "metrics/synthesize.json").read_text())
    assert metrics["by_split"]["test"] == 30 and metrics["by_split"]["ood"] == 0 and metrics["quarantined"] == 0
    assert json.loads((repo / "metrics/animate.json").read_text())["samples"] == 0
    assert json.loads((repo / "models/base/config.json").read_text())["model_type"] == "llama"
    from pipeline.modeling.models import load_tokenizer

    trained = load_tokenizer(repo / "models/sft")  # every stage keeps the loaded model's template and EOS
    assert trained.chat_template == LLAMA3_TEMPLATE and trained.eos_token == "<|eot_id|>"
    for model in ("teacher", "sft", "sft_extended", "grpo", "dpo"):
        evaluated = json.loads((repo / f"metrics/evaluate/{model}.json").read_text())
        assert evaluated["questions"] == 30 and 0.0 <= evaluated["accuracy"] <= 1.0
        assert "accuracy_ood" not in evaluated  # no ood split in the dataset: not evaluated
    labels = json.loads((repo / "metrics/prm_data.json").read_text())
    assert labels["labels"] == "mc" and labels["mc"]["lines"] > 0
    assert json.loads((repo / "metrics/prm.json").read_text())["sources"]["mc"] == labels["mc"]["rows"]

    assert ran_stages(sh([sys.executable, "-m", "pipeline", "repro"], repo).stdout) == []
    with open(data / "train.jsonl", "a") as fh:  # one more problem
        fh.write(json.dumps(generate(161, TRAIN_FRAMES, 0)[-1] | {"question": "A new one: what is 2 + 2?"}) + "\n")
    assert ran_stages(dvc("repro", "--dry", cwd=repo).stdout) == ["synthesize"]  # the edit reaches the data stage
    # Re-running it (and the two quick stages on it) leaves every stage that reads the new splits stale; the rest
    # follow when those write new outputs.
    assert ran_stages(sh([sys.executable, "-m", "pipeline", "repro", "animate", "base"], repo).stdout) == [
        "animate", "base", "synthesize"]
    stale = set(re.findall(r"^(\S+):$", dvc("status", cwd=repo).stdout, re.MULTILINE))
    readers = {"teacher", "distill", "sft", "mine", "sft_extended", "prm_data", *EVALUATED}
    assert readers <= stale and not stale & {"synthesize", "animate", "base"}, (readers, stale)


@pytest.mark.slow  # nine stages on a dataset task (`make test-slow`); the unit tests cover MATH's extraction
def test_a_math_file_with_boxed_answers_and_paragraph_steps(tmp_path, prefect_api):
    write_jsonl(tmp_path / "math" / "train.jsonl", math_rows(150, 0))
    write_jsonl(tmp_path / "math" / "test.jsonl", math_rows(20, 1))
    repo = make_repo(tmp_path, "repo", [
        "task.kind=dataset", f"task.dataset={{path: {tmp_path / 'math'}, prompt_field: problem, "
        "answer_field: solution, answer_extraction: boxed, val_fraction: 0.1}", "task.answer_format=boxed",
        "task.grader=math_verify", "task.step_split=paragraph", "prm.sources=[mc, mcts]",
        "rewards.weights={accuracy: 1.0, format: 0.1}"])
    # Up to sft's evaluation: what a MATH file changes (extraction, math-verify grading, paragraph steps, MC and
    # MCTS labels searched a paragraph at a time, PRM-reranked evaluation, PRM beam search and MCTS over
    # paragraphs). The RL stages after sft run on a dataset task in the GSM8K test above.
    proc = sh([sys.executable, "-m", "pipeline", "repro", "evaluate@sft"], repo)
    upstream = ["synthesize", "animate", "base", "teacher", "distill", "sft", "prm_data", "prm", "evaluate@sft"]
    assert ran_stages(proc.stdout + proc.stderr) == sorted(upstream)
    from pipeline.core.io import read_rows

    train = read_rows(repo / "data/synthesize/train.parquet")
    assert any(r["answer"].startswith("\\frac{") for r in train)  # nested braces kept whole
    # The solution already states its answer in \boxed{}: it is the SFT completion as it is, two paragraph steps.
    assert all(r["rationale"].endswith("}$.") and len(r["steps"]) == 2 for r in train)
    metrics = json.loads((repo / "metrics/evaluate/sft.json").read_text())
    assert metrics["questions"] > 0
    assert {"prm_beam", "prm_mcts"} <= set(metrics["decoding"])
    labels = read_rows(repo / "data/prm_data/train.parquet") + read_rows(repo / "data/prm_data/val.parquet")
    searched = [r for r in labels if r["source"] == "mcts"]
    assert searched and all(step == " ".join(step.split()) for r in searched for step in r["steps"])


def test_a_bad_dataset_file_stops_the_run_with_exit_2_naming_its_line(tmp_path, prefect_api):
    """The data stage refuses a JSONL file with a cut-off line: `python -m pipeline repro` passes the stage's exit
    code 2 and its reason on as its own last line, without a traceback (DVC's own report stays above it)."""
    write_jsonl(tmp_path / "data" / "train.jsonl", generate(40, TRAIN_FRAMES, 0))
    bad = tmp_path / "data" / "test.jsonl"
    bad.write_text(json.dumps(generate(1, TEST_FRAMES, 1)[0]) + '\n{"question": "Two apples', encoding="utf-8")
    repo = make_repo(tmp_path, "repo", [
        "task.kind=dataset", f"task.dataset={{path: {tmp_path / 'data'}, answer_extraction: gsm8k}}",
        "task.answer_format=gsm8k", "prm.sources=[mc, mcts]", "rewards.weights={accuracy: 1.0, format: 0.1}"])
    proc = sh([sys.executable, "-m", "pipeline", "repro", "synthesize"], repo, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: dvc repro stopped: stage synthesize failed (exit 2): task.dataset.path: {bad}: "
                           "cannot be read (line 2: not JSON"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (repo / "data" / "synthesize").exists()
