"""The README is a product page: short, its results table generated from the metrics, its links inside the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.report import RESULT_COLUMNS, results_markdown

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
