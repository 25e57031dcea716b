"""Random chart tables and the objects that Chain-of-Functions chains act on.

    ctx = TableContext(random_table(random.Random(0), SynthesizeConfig()))

A table is a JSON-serializable dict: chart_type, title, unit, categories (x labels
or slices, left to right), series (legend entries), values[category][series]
(integers), colours and colour_by ("series": one colour per series; "category":
one per category, for single-series bar and pie charts). An object is one drawn
mark: (category, series, value, colour, position).
"""

from __future__ import annotations

import random
from typing import NamedTuple

from pipeline.data.params import SynthesizeConfig

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
YEARS = tuple(str(y) for y in range(2013, 2025))
COUNTRIES = ("France", "Japan", "Brazil", "India", "Canada", "Kenya", "Peru", "Spain", "Italy", "Chile", "Egypt",
             "Norway")
FRUITS = ("Apple", "Banana", "Cherry", "Mango", "Grape", "Lemon", "Peach", "Plum", "Kiwi", "Melon", "Pear", "Lime")
PRODUCTS = ("Laptop", "Phone", "Tablet", "Camera", "Watch", "Speaker", "Drone", "Monitor", "Printer", "Router")
TEAMS = ("Lions", "Tigers", "Bears", "Eagles", "Wolves", "Hawks", "Sharks", "Falcons", "Bulls", "Foxes")
# Twelve colours so that a pie with the most categories still gets distinct ones.
COLOURS = ("red", "blue", "green", "orange", "purple", "brown", "pink", "grey", "teal", "gold", "olive", "navy")


class Theme(NamedTuple):
    title: str
    unit: str
    categories: tuple[str, ...]
    ordered: bool  # categories have a natural order (time): the only themes a line chart uses
    series: tuple[str, ...]
    measure: str  # the single series' name in a one-series chart


# Category names, series names and colours never contain a step separator
# (": ", " is ", " are ", " = "), a comma or a final period, so a step value
# written from them parses back whole (tests/unit/test_verbalize.py checks it).
THEMES = (
    Theme("Monthly sales", "k$", MONTHS, True, ("2020", "2021", "2022", "2023", "2024", "2025"), "Sales"),
    Theme("Monthly rainfall", "mm", MONTHS, True, ("Oslo", "Lima", "Rome", "Cairo", "Delhi", "Quito"), "Rainfall"),
    Theme("Daily visitors", "k", WEEKDAYS, True, ("Museum", "Zoo", "Park", "Aquarium", "Library", "Gallery"),
          "Visitors"),
    Theme("Annual revenue", "m$", YEARS, True, ("Alpha", "Beta", "Gamma", "Delta", "Omega", "Sigma"), "Revenue"),
    Theme("Exports by country", "bn$", COUNTRIES, False, ("Cars", "Food", "Oil", "Textiles", "Metals", "Wine"),
          "Exports"),
    Theme("Tourists by country", "m", COUNTRIES, False, ("2019", "2020", "2021", "2022", "2023", "2024"), "Tourists"),
    Theme("Fruit harvest", "t", FRUITS, False, ("North", "South", "East", "West", "Central", "Coast"), "Harvest"),
    Theme("Units sold", "units", PRODUCTS, False, ("Online", "Retail", "Export", "Wholesale", "Rental", "Resale"),
          "Units"),
    Theme("Points by team", "pts", TEAMS, False, ("Home", "Away", "Cup", "League", "Friendly", "Playoff"), "Points"),
)
ORDERED_THEMES = tuple(t for t in THEMES if t.ordered)
SINGLE_SERIES_CHARTS = ("bar", "pie")
# Share of line-chart series drawn as a strict trend, so that "consistently
# increasing/decreasing" is sometimes true (a random 5-point series almost never is).
TREND_PROBABILITY = 0.5
# Share of multi-series tables with one category whose series values are all equal,
# so that "all the same value" is sometimes true.
EQUAL_GROUP_PROBABILITY = 0.15


class Obj(NamedTuple):
    """One drawn mark: a bar, a stacked segment, a line point or a pie slice."""

    category: str
    series: str
    value: int
    colour: str
    position: int  # category index, left to right


def _series_count(rng: random.Random, chart_type: str, cfg: SynthesizeConfig, pool: int) -> int:
    most = min(cfg.max_series, pool)
    if chart_type in SINGLE_SERIES_CHARTS:
        return 1
    if chart_type == "line":
        return rng.randint(1, most)
    return rng.randint(min(2, most), most)


def _categories(rng: random.Random, theme: Theme, n: int) -> list[str]:
    pool = theme.categories
    n = min(n, len(pool))
    if theme.ordered:
        start = rng.randrange(len(pool) - n + 1)
        return list(pool[start : start + n])
    return rng.sample(pool, n)


def _series_values(rng: random.Random, n: int, cfg: SynthesizeConfig, trend: bool) -> list[int]:
    lo, hi = cfg.value_min, cfg.value_max
    if trend and hi - lo + 1 >= n:
        return sorted(rng.sample(range(lo, hi + 1), n), reverse=rng.random() < 0.5)
    return [rng.randint(lo, hi) for _ in range(n)]


def random_table(rng: random.Random, cfg: SynthesizeConfig) -> dict:
    """A small random chart table of one of cfg.chart_types."""
    chart_type = rng.choice(cfg.chart_types)
    theme = rng.choice(ORDERED_THEMES if chart_type == "line" else THEMES)
    categories = _categories(rng, theme, rng.randint(cfg.min_categories, cfg.max_categories))
    n_series = _series_count(rng, chart_type, cfg, len(theme.series))
    series = sorted(rng.sample(theme.series, n_series)) if n_series > 1 else [theme.measure]
    trend = chart_type == "line"
    columns = [_series_values(rng, len(categories), cfg, trend and rng.random() < TREND_PROBABILITY) for _ in series]
    values = [[column[i] for column in columns] for i in range(len(categories))]
    if n_series > 1 and rng.random() < EQUAL_GROUP_PROBABILITY:
        row = rng.randrange(len(categories))
        values[row] = [values[row][0]] * n_series
    if chart_type == "pie":
        colour_by, colours = "category", rng.sample(COLOURS, len(categories))
    elif chart_type == "bar":
        # Bars drawn from a 2-3 colour palette: colours repeat, so selecting by
        # colour and counting colours are meaningful.
        palette = rng.sample(COLOURS, rng.randint(2, 3))
        colour_by, colours = "category", [rng.choice(palette) for _ in categories]
    else:
        colour_by, colours = "series", rng.sample(COLOURS, n_series)
    return {
        "chart_type": chart_type,
        "title": theme.title,
        "unit": theme.unit,
        "categories": categories,
        "series": series,
        "values": values,
        "colours": colours,
        "colour_by": colour_by,
    }


class TableContext:
    """A table with its objects precomputed: what every atomic function reads."""

    __slots__ = ("table", "objects", "categories", "series", "multi", "colours", "noun", "nouns")

    def __init__(self, table: dict) -> None:
        self.table = table
        self.categories: list[str] = table["categories"]
        self.series: list[str] = table["series"]
        self.multi = len(self.series) > 1
        by_category = table["colour_by"] == "category"
        self.objects = [
            Obj(cat, ser, table["values"][i][j], table["colours"][i if by_category else j], i)
            for i, cat in enumerate(self.categories)
            for j, ser in enumerate(self.series)
        ]
        # Distinct colours in first-drawn order (never set order: determinism).
        self.colours = list(dict.fromkeys(o.colour for o in self.objects))
        self.noun, self.nouns = MARK_NOUNS[table["chart_type"]]


MARK_NOUNS = {
    "bar": ("bar", "bars"),
    "grouped_bar": ("bar", "bars"),
    "stacked_bar": ("segment", "segments"),
    "line": ("point", "points"),
    "pie": ("slice", "slices"),
}


def fmt_num(x: float) -> str:
    """Canonical number text: integers without ".0", else at most 2 decimals, no trailing zeros."""
    x = round(float(x), 2)
    if x == int(x):
        return str(int(x))
    return f"{x:.2f}".rstrip("0")


def fmt_obj(o: Obj, with_series: bool) -> str:
    """"Jan 15", or "Jan (2024) 15" where the series is needed to tell objects apart."""
    return f"{o.category} ({o.series}) {o.value}" if with_series else f"{o.category} {o.value}"


def spans_series(objs: list[Obj]) -> bool:
    first = objs[0].series
    return any(o.series != first for o in objs)


def fmt_objs(objs: list[Obj]) -> str:
    with_series = spans_series(objs)
    return ", ".join(fmt_obj(o, with_series) for o in objs)
