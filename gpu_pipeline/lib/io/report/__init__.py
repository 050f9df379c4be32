"""The daily report: one self-contained HTML file (charts inline as PNG) read from the marts.

- data.py: the day's marts, and pure functions from them to plain values and frames;
- charts.py: matplotlib charts drawn from the report data;
- view.py: the report data worded as text, and tables of text, for the template;
- templates/: report.html.j2 (Jinja2, autoescaped: labels are user text) and report.css.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from datetime import date

import jinja2
import polars as pl

from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.report import charts, data, view
from gpu_pipeline.lib.io.report.charts import Chart
from gpu_pipeline.lib.io.report.data import InForce
from gpu_pipeline.lib.marts.namespace_monthly import month_days
from gpu_pipeline.lib.rules import DEFAULT, RULES, Thresholds

__all__ = ["Chart", "InForce", "Report", "build_report"]


@dataclass
class Report:
    day: date
    charts: list[Chart] = field(default_factory=list)
    html: str = ""
    bottlenecked_namespaces: list[str] = field(default_factory=list)


def _printable(v: object) -> object:
    """What `{{ }}` prints: never None or NaN (a value the view did not word is "n/a")."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return v


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("gpu_pipeline.lib.io.report", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
    finalize=_printable,
)
# `{% if v is label %}`: a label from the data, which the template isolates (view.Label)
TEMPLATES.tests["label"] = lambda v: isinstance(v, view.Label)


def render(**values: object) -> str:
    return TEMPLATES.get_template("report.html.j2").render(**values)


def build_report(
    lake: Lake,
    day: date,
    require_data: bool = False,
    catalog: pl.DataFrame | None = None,
    t: Thresholds = DEFAULT,
    in_force: InForce | None = None,
) -> Report:
    """Read the day's marts and build the charts and the HTML.

    A day with no GPU-minutes gets a short "no data" report (a backfill may reach days nothing
    landed for); `require_data` makes that a FileNotFoundError instead (the CLI's choice).
    `in_force`: the price book, energy rates and rules the day was computed with (its rules'
    thresholds then replace `t`), printed in the appendix.
    """
    if in_force is None:
        in_force = InForce(rules=replace(RULES, thresholds=t), told=False)
    t = in_force.rules.thresholds
    if require_data and not lake.exists("gpu_minutes", day):
        raise FileNotFoundError(
            f"no gpu_minutes for {day} in {lake.root}: materialize the day first"
        )
    rep = Report(day)
    # matplotlib is imported (a Python-bound ~0.4 s) while the marts are read (Polars, which
    # releases the GIL): the run does not wait for both one after the other
    threading.Thread(target=charts.pyplot, name="import-pyplot", daemon=True).start()
    # the day's minutes and the month's so far are scanned lazily: a page of them that does
    # not decode is named (`Lake.reading`), not Polars' error where a chart collects it
    with lake.reading("gpu_minutes", [m for m in month_days(day) if m <= day]):
        d = data.report_data(lake, day, t, catalog)
        if d is None:
            rep.html = render(day=day, no_data=view.no_data(data.ingest_of_day(lake, day)))
            return rep
        drawn = charts.draw(d)
        rep.charts = [c for c in drawn if not c.empty]  # what is drawn
        rep.bottlenecked_namespaces = [
            ns.text if isinstance(ns, view.Label) else ns
            for ns, _ in view.bottlenecked_today(d.marts.daily)
        ]
        rep.html = render(**view.context(d, drawn, in_force))
    return rep
