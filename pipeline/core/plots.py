"""Small matplotlib figures for people who would rather look than read (Agg, no display)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def pyplot():
    """matplotlib's pyplot on the Agg backend, imported with the first figure: a stage process that draws none
    does not pay the import (about 0.35 s on 2 cores)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(
    values: dict[str, float], path: Path, title: str, xlabel: str = "accuracy", xmax: float | None = 1.1,
    fmt: str = "{:.2f}",
) -> None:
    """Horizontal bars, one per key, value labels at the bar ends; x from 0 to `xmax` (None: fit the data)."""
    names = list(values)
    fig, ax = pyplot().subplots(figsize=(6, 0.4 * len(names) + 1.2), dpi=100)
    ax.barh(names, [values[n] for n in names], color="#4c72b0")
    top = xmax if xmax is not None else max(values.values(), default=1) * 1.15 or 1
    for i, n in enumerate(names):
        ax.text(values[n] + 0.01 * top, i, fmt.format(values[n]), va="center", fontsize=8)
    ax.set_xlim(0, top)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    pyplot().close(fig)


def reliability_chart(table: list[dict], path: Path, title: str) -> None:
    """Observed rate against mean predicted score per bin (pipeline.prm.model.calibration), the diagonal for
    reference."""
    fig, ax = pyplot().subplots(figsize=(4.5, 4.5), dpi=100)
    ax.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1, label="perfectly calibrated")
    ax.plot([r["predicted"] for r in table], [r["observed"] for r in table], marker="o", color="#4c72b0", label="PRM")
    for r in table:
        ax.annotate(str(r["lines"]), (r["predicted"], r["observed"]), fontsize=7, xytext=(3, -9),
                    textcoords="offset points")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("mean predicted score (bin)")
    ax.set_ylabel("share of right lines")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    pyplot().close(fig)


def heatmap(panels: dict[str, tuple[list[str], list[str], list[list[float | None]]]], path: Path, title: str) -> None:
    """One annotated heatmap per panel (rows, columns, values in [0, 1]; None is blank), side by side."""
    widths = [len(cols) for _, cols, _ in panels.values()]
    rows = max(len(r) for r, _, _ in panels.values())
    fig, axes = pyplot().subplots(1, len(panels), figsize=(1.0 + 0.75 * sum(widths) + 2.5, 0.35 * rows + 2), dpi=100,
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, (name, (row_names, col_names, values)) in zip(axes[0], panels.items()):
        grid = [[float("nan") if v is None else v for v in row] for row in values]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if v is not None:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 0.6 else "black")
        ax.set_xticks(range(len(col_names)), col_names, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(row_names)), row_names if ax is axes[0][0] else [""] * len(row_names), fontsize=8)
        ax.set_title(name, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    pyplot().close(fig)


def fill_skipped(live_dir: Path, stage: str, reason: str, dvc_file: Path = Path("dvc.yaml")) -> list[str]:
    """The plots dvc.yaml's top-level `plots` declare under plots/<stage>/ that a skipped part did not draw, written
    empty into `live_dir` (the stage's temporary plots folder): a curve as its header alone, an image as a card
    stating `reason`. `dvc plots show` then draws every plot instead of "DVC failed to load some plots".
    Returns the files written (relative to `live_dir`)."""
    import yaml

    if not dvc_file.exists():  # a stage run outside the project (a unit test): no declared plots
        return []
    prefix = f"plots/{stage}/"
    written = []
    for entry in yaml.safe_load(dvc_file.read_text()).get("plots", []):
        files = {entry: None} if isinstance(entry, str) else {
            file: (spec.get("x"), field) for spec in entry.values() for file, field in (spec.get("y") or {}).items()}
        for file, columns in files.items():
            if not file.startswith(prefix) or (live_dir / file[len(prefix):]).exists():
                continue
            target = live_dir / file[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.suffix == ".tsv" and columns:
                target.write_text("\t".join(columns) + "\n")
            elif target.suffix == ".png":
                _card(target, f"{stage}: {reason}")
            else:
                continue
            written.append(file[len(prefix):])
    return written


def _card(path: Path, text: str) -> None:
    fig = pyplot().figure(figsize=(5, 1.2), dpi=100)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, wrap=True)
    fig.savefig(path, metadata={"Software": None})
    pyplot().close(fig)
