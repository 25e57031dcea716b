"""python -m experiments.prm_step_kinds [models/prm ...]

Where is the PRM blind? Held-out AUROC per kind of step on the labelled lines
of data/prm_data/val.parquet: a line's kind is the rationale template
(pipeline/data/cof/verbalize.STEPS, read by pipeline.prm.contrast.step_kind) its text matches ("The largest of them is
{v}." -> max_one_object), "answer" for the `Answer:` line, "arithmetic/other"
for the rest (sums, differences). Prints per kind the lines, the share right
and the AUROC, most lines first. Needs data/prm_data and a PRM (`make run`).
"""

from __future__ import annotations

import argparse

from pipeline.core.io import read_rows
from pipeline.prm.contrast import step_kind
from pipeline.prm.model import PRMScorer, auroc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("prms", nargs="*", default=["models/prm"], help="PRM folders (default: models/prm)")
    args = parser.parse_args()
    rows = read_rows("data/prm_data/val.parquet", required=("prompt", "steps", "labels"))
    for folder in args.prms:
        scores = PRMScorer.load(folder, device="cpu").score([r["prompt"] for r in rows], [r["steps"] for r in rows])
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for row, line_scores in zip(rows, scores):
            for line, label, s in zip(row["steps"], row["labels"], line_scores):
                by_kind.setdefault(step_kind(line), []).append((label, s))
        print(folder)
        for kind, pairs in sorted(by_kind.items(), key=lambda item: -len(item[1])):
            area = auroc([y for y, _ in pairs], [s for _, s in pairs])
            right = sum(y >= 0.5 for y, _ in pairs) / len(pairs)
            print(f"  {kind:28s} lines {len(pairs):5d}  right {right:4.0%}  "
                  f"AUROC {'-' if area is None else round(area, 3)}")


if __name__ == "__main__":
    main()
