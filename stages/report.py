"""python -m stages.report

The cross-model view of this pipeline version, from metrics/evaluate/<model>.json:
plots/report/generalisation.png (accuracy per task type, in-domain and
out-of-domain, for every model and decoding strategy) and report.md (the
decoding table with cost and faithfulness, and the generalisation table; the
same tables `python -m pipeline report` prints).
"""

from __future__ import annotations

from pipeline.core import paths
from pipeline.core.io import atomic_dir, atomic_write_text
from pipeline.core.phases import stage_logger
from pipeline.evaluation.report import decoding_markdown, generalisation_markdown, generalisation_plot, load_evaluations
from pipeline.orchestration.flows import run_stage


def _flow() -> None:
    evaluations = load_evaluations()
    stage_logger().info("report: %d evaluated models", len(evaluations))
    with atomic_dir(paths.live_dir("report")) as out:
        generalisation_plot(evaluations, out / "generalisation.png")
        atomic_write_text(out / "report.md", "# Decoding strategies\n\n" + decoding_markdown(evaluations)
                          + "\n\n# Generalisation\n\n" + generalisation_markdown(evaluations) + "\n")


def main() -> None:
    run_stage("report", _flow)


if __name__ == "__main__":
    main()
