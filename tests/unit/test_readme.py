"""The README is a product page: short, its results table generated from the metrics, its links inside the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.evaluation.report import RESULT_COLUMNS, results_markdown

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Documents outside the repository that no file here may cite (spelt in pieces so this file cites none).
OUTSIDE = ("../" + "shared", "DESIGN" + ".md", "ALGORITHMS" + ".md")
BEGIN, END = "<!-- results: python -m pipeline report --results -->", "<!-- /results -->"


def _metrics_as_committed() -> bool:
    """True when metrics/ is what the last commit holds (the README shows the committed run, not the user's own)."""
    status = subprocess.run(["git", "status", "--porcelain", "--", "metrics"], cwd=ROOT,
                            capture_output=True, text=True)
    return status.returncode == 0 and not status.stdout.strip()


def test_the_results_table_is_what_the_metrics_say():
    if not _metrics_as_committed():
        pytest.skip("metrics/ differs from the commit (a run of your own): the README shows the committed run")
    text = README.read_text()
    assert BEGIN in text and END in text, f"README.md: the results table sits between {BEGIN} and {END}"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == results_markdown(ROOT), (
        "README.md's results table differs from the metrics: paste `python -m pipeline report --results`")


def test_every_results_column_has_its_metrics_and_provenance():
    for _, folder in RESULT_COLUMNS:
        assert (ROOT / folder / "evaluate" / "sft.json").exists(), folder
        if folder != "metrics":  # a snapshot says how it was made
            assert (ROOT / folder / "README.md").exists(), folder


def test_readme_is_short_and_cites_only_files_in_the_repository():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for doc in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        body = doc.read_text()
        assert not any(name in body for name in OUTSIDE), doc
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", body):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (doc.parent / target).resolve().exists(), f"{doc.relative_to(ROOT)}: broken link {target}"


LOAD_ROW = "| load a trained model in my code |"


def _row_statements(row: str) -> list[str]:
    """The row's inline code that is Python a user runs as written: imports and assignments, in order."""
    import ast

    out = []
    for span in re.findall(r"`([^`]+)`", row):
        try:
            tree = ast.parse(span)
        except SyntaxError:
            continue
        if tree.body and all(isinstance(node, (ast.Import, ast.Assign)) for node in tree.body):
            out.append(span)
    return out


def test_the_load_a_model_lines_run_as_written_and_show_what_they_return(tmp_path, monkeypatch):
    """The README's "load a trained model in my code" row, its imports and assignments run in order on a tiny
    model and PRM saved as the stages save them: generate gives a list per prompt of Generations, the PRM a list
    per prompt of a score per scored line."""
    import torch

    from pipeline.inference.generation import Generation
    from pipeline.modeling.models import build_student, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig
    from pipeline.prm.model import prm_from_policy

    (row,) = [line for line in README.read_text().splitlines() if line.startswith(LOAD_ROW)]
    statements = _row_statements(row)
    assert any(s.startswith("out = ") for s in statements) and any(s.startswith("scores = ") for s in statements), (
        f"README.md: the row {LOAD_ROW} names what generate and the PRM return (`out = ...`, `scores = ...`)")
    prompt = ("Chart: bar. Title: Sales (k$).\nMon: 12 grey | Tue: 7 teal\n"
              "Question: What is the value of the bar for Mon?\n")
    texts = [prompt + f"Step 1: The value of Mon is {v}.\nAnswer: {v}" for v in range(40)]
    tokenizer = train_tokenizer(texts, 300)
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=256), tokenizer)
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the default task and prompt format
    save_model(model, tokenizer, tmp_path / "models" / "sft")
    prm = prm_from_policy(tmp_path / "models" / "sft")
    prm.save_pretrained(tmp_path / "models" / "prm")
    tokenizer.save_pretrained(tmp_path / "models" / "prm")
    namespace: dict = {"prompt": prompt}
    torch.manual_seed(0)
    for statement in statements:
        exec(statement, namespace)
    out, scores = namespace["out"], namespace["scores"]
    assert isinstance(out, list) and len(out) == 1 and len(out[0]) == 1 and isinstance(out[0][0], Generation)
    assert isinstance(out[0][0].text, str) and out[0][0].tokens >= 1
    lines = namespace["pipeline"].prm.model.scored_lines(out[0][0].text)
    assert isinstance(scores, list) and len(scores) == 1 and len(scores[0]) == len(lines)
    assert all(0.0 <= s <= 1.0 for s in scores[0])
