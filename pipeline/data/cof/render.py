"""Draw a Chain-of-Functions table as a small PNG chart, byte-for-byte reproducibly.

    render_chart(json.loads(row["table"]), Path("data/synthesize/images/test-000000.png"))

Uses matplotlib's Agg canvas on a bare Figure (no pyplot global state), a fixed
size and dpi, and no "Software" metadata, so the same table gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGSIZE = (4.0, 3.0)  # inches: 320 x 240 pixels at DPI
DPI = 80
BAR_AREA = 0.8  # share of a category's width covered by its grouped bars


def _bars(ax, table: dict) -> None:
    x = range(len(table["categories"]))
    ax.bar(x, [row[0] for row in table["values"]], color=table["colours"])


def _grouped(ax, table: dict) -> None:
    n = len(table["series"])
    width = BAR_AREA / n
    for j, (name, colour) in enumerate(zip(table["series"], table["colours"])):
        x = [i - BAR_AREA / 2 + width * (j + 0.5) for i in range(len(table["categories"]))]
        ax.bar(x, [row[j] for row in table["values"]], width=width, color=colour, label=name)


def _stacked(ax, table: dict) -> None:
    bottom = [0] * len(table["categories"])
    for j, (name, colour) in enumerate(zip(table["series"], table["colours"])):
        heights = [row[j] for row in table["values"]]
        ax.bar(range(len(heights)), heights, bottom=bottom, color=colour, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]


def _lines(ax, table: dict) -> None:
    for j, (name, colour) in enumerate(zip(table["series"], table["colours"])):
        ax.plot(range(len(table["categories"])), [row[j] for row in table["values"]], marker="o", color=colour,
                label=name)


DRAW = {"bar": _bars, "grouped_bar": _grouped, "stacked_bar": _stacked, "line": _lines}


def chart_figure(table: dict) -> Figure:
    """`table` drawn as a chart of its chart_type on a bare Figure with an Agg canvas, laid out, not yet saved."""
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(f"{table['title']} ({table['unit']})", fontsize=9)
    if table["chart_type"] == "pie":
        values = [row[0] for row in table["values"]]
        # Clockwise from 12 o'clock in table order, the way pie charts are read.
        ax.pie(
            values,
            labels=table["categories"],
            colors=table["colours"],
            startangle=90,
            counterclock=False,
            textprops={"fontsize": 7},
        )
    else:
        DRAW[table["chart_type"]](ax, table)
        ax.set_xticks(range(len(table["categories"])), table["categories"], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        if len(table["series"]) > 1:
            ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig


def render_chart(table: dict, path: Path) -> None:
    """Write `table` as a PNG chart of its chart_type at `path` (parent folders created)."""
    fig = chart_figure(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
