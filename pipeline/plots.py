"""Small matplotlib figures for people who would rather look than read (Agg, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bar_chart(
    values: dict[str, float], path: Path, title: str, xlabel: str = "accuracy", xmax: float | None = 1.1,
    fmt: str = "{:.2f}",
) -> None:
    """Horizontal bars, one per key, value labels at the bar ends; x from 0 to `xmax` (None: fit the data)."""
    names = list(values)
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(names) + 1.2), dpi=100)
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
    plt.close(fig)
