"""Paired differences between the models of one run: the same test (or ood) questions, per question.

    python -m experiments.paired_models sft:base grpo:sft_extended grpo:sft --reading lenient --split ood

Each `A:B` prints A's accuracy minus B's over the questions both answered (data/evaluate/<model>/
predictions.parquet of this workspace, or `--dir`), with the standard error and 95% interval of a paired
bootstrap (pipeline.evaluation.compare.paired_bootstrap). `--reading strict` grades by the task's answer format,
`lenient` by the last number or answer word of the reply. A model name may also be a predictions file, for
a run kept elsewhere (a DVC experiment's, copied out).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.core.io import read_rows
from pipeline.evaluation.compare import paired_bootstrap


def predictions(name: str, folder: Path, split: str, reading: str) -> list[dict]:
    path = Path(name) if name.endswith(".parquet") else folder / name / "predictions.parquet"
    rows = [r for r in read_rows(path) if r["split"] == split]
    return [{**r, "correct": bool(r[reading])} for r in rows]


def label(name: str) -> str:
    path = Path(name)
    return path.parent.name if path.stem == "predictions" else path.stem


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="A:B, each a model under --dir or a predictions .parquet file")
    parser.add_argument("--dir", type=Path, default=Path("data/evaluate"))
    parser.add_argument("--split", default="test", choices=["test", "ood"])
    parser.add_argument("--reading", default="correct", choices=["correct", "lenient"],
                        help="correct: the task's strict grading; lenient: the last number or answer word")
    args = parser.parse_args(argv)
    print("| A | B | split, reading | A | B | A minus B | SE | 95% interval | questions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pair in args.pairs:
        a, b = pair.split(":")
        result = paired_bootstrap(predictions(b, args.dir, args.split, args.reading),
                                  predictions(a, args.dir, args.split, args.reading))
        print(f"| {label(a)} | {label(b)} | {args.split}, {args.reading} | {result['after']:.3f} | "
              f"{result['before']:.3f} | {result['difference']:+.3f} | {result['standard_error']:.3f} | "
              f"[{result['ci_low']:+.3f}, {result['ci_high']:+.3f}] | {result['questions']} |")


if __name__ == "__main__":
    main()
