"""Every data/, models/, metrics/ and plots/ path, spelled once.

Paths are relative to the repository root, where DVC runs every stage.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path("data")
MODELS = Path("models")
METRICS = Path("metrics")
PLOTS = Path("plots")
# Wall-clock figures (seconds, throughputs) of each stage's last run: beside, never inside, what DVC hashes, since a
# machine's speed would change dvc.lock on every re-run. Not tracked by git or DVC.
TIMINGS = Path("timings")
# Pretrained models converted by `python -m pipeline fetch` (pipeline/modeling/pretrained.py): local folders, not Hub
# ids, even before they are fetched
PRETRAINED = Path("pretrained")

SPLITS = ("train", "val", "test", "ood")

# Provenance file of a model folder; `config.json` there is the Hugging Face model config.
MODEL_MANIFEST = "pipeline_config.json"


def stage_data(stage: str) -> Path:
    """The output folder of a data stage: data/<stage>/."""
    return DATA / stage


def split_file(split: str, stage: str = "synthesize") -> Path:
    """One split of a data stage's questions: data/<stage>/<split>.parquet."""
    return stage_data(stage) / f"{split}.parquet"


def prm_chains_file() -> Path:
    """The gold chain of every new `prm_data` question, which `prm` learns to write and cuts contrast paths from."""
    return stage_data("prm_data") / "chains.parquet"


def charts_dir() -> Path:
    """Rendered chart PNGs, inside the synthesize output so DVC tracks them together."""
    return stage_data("synthesize") / "charts"


def animate_questions() -> Path:
    """Temporal questions over the animate clips, in the reasoning-example columns (sft.mix reads them)."""
    return stage_data("animate") / "questions.parquet"


def model_dir(name: str) -> Path:
    """A trained or built model in Hugging Face format: models/<name>/."""
    return MODELS / name


def metrics_file(stage: str) -> Path:
    """A stage's summary metrics: metrics/<stage>.json."""
    return METRICS / f"{stage}.json"


def eval_metrics_file(model: str) -> Path:
    """One evaluated model's metrics: metrics/evaluate/<model>.json."""
    return METRICS / "evaluate" / f"{model}.json"


def timings_file(metrics: Path) -> Path:
    """The wall-clock figures of a metrics file: timings/<stage>.json, timings/evaluate/<model>.json."""
    return TIMINGS / Path(metrics).relative_to(METRICS)


def eval_predictions_dir(model: str) -> Path:
    """One evaluated model's graded generations: data/evaluate/<model>/."""
    return stage_data("evaluate") / model


def eval_plots_dir(model: str) -> Path:
    """One evaluated model's plots: plots/evaluate/<model>/."""
    return PLOTS / "evaluate" / model


def live_dir(stage: str) -> Path:
    """dvclive's folder for a training stage's curves: plots/<stage>/."""
    return PLOTS / stage
