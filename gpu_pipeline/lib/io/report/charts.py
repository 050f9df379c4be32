"""The report's charts: matplotlib figures drawn from the report's data (`data`), each a PNG
with its title and caption, or the reason nothing is drawn."""

from __future__ import annotations

import functools
import io
import textwrap
import warnings
from dataclasses import dataclass
from datetime import date

import polars as pl

from gpu_pipeline.lib.display import NO_NAMESPACE, num, plural
from gpu_pipeline.lib.io.report.data import (
    MONTHLY,
    TREND_DAYS,
    Period,
    ReportData,
    fleet_minutes,
    label,
    model_figures,
    pct_down,
)
from gpu_pipeline.lib.rules import DEFAULT, Thresholds


@functools.cache
def pyplot():
    """matplotlib's pyplot, imported when a report is built (`build_report` starts it while the
    marts are read), not when the pipeline's definitions load: its ~27 MiB are not held through
    the steps before the report (the 10,000-GPU day's peak is the staging step's;
    benchmarks/README.md, issue 34). Two threads calling it at once import it once (Python's
    import lock); the second sets the same backend again."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    # labels are the data's text (namespaces, models, hosts): `$...$` in one is not a formula,
    # and its mathtext parse error failed the day's report (adversarial review)
    matplotlib.rcParams["text.parse_math"] = False
    # a chart of a day where nothing was measured has no series to put in its legend: fine
    warnings.filterwarnings("ignore", message="No artists with labels found", category=UserWarning)
    import matplotlib.pyplot as plt

    return plt


CLASS_COLORS = {
    "idle": "#9e9e9e",
    "inefficient": "#ffb74d",
    "moderate": "#64b5f6",
    "bottlenecked": "#e53935",
    "efficient": "#43a047",
}
WASTE_COLORS = {
    "idle_waste_usd": "#9e9e9e",
    "stall_waste_usd": "#e53935",
    "headroom_waste_usd": "#ffb74d",
}


@dataclass
class Chart:
    title: str
    png: bytes
    caption: str = ""
    # why nothing is drawn (the report then shows the title and this, not an empty plot)
    empty: str = ""


def _f(series: pl.Series) -> list[float]:
    """Numbers for matplotlib: floats, NaN where there is no value (nothing is drawn there)."""
    return series.cast(pl.Float64).fill_null(float("nan")).to_list()


def _drawn(v: float | None) -> bool:
    """A value a bar is drawn for: not null, not NaN."""
    return v is not None and v == v


def _labels(series: pl.Series, n: int = 40, none: str = "(none)") -> list[str]:
    return [label(v, n, none) for v in series.to_list()]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    # laid out: without a layout engine left on the figure, savefig draws it once, not first
    # a second time without output (the same PNG, a sixth less time: issue 34)
    fig.set_layout_engine(None)
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return buf.getvalue()


# a bar's tick label: the name wrapped to lines of at most TICK_CHARS characters, never more
# than TICK_LINES lines (then cut with "…"); fewer characters a line when the slot is narrow,
# down to TICK_MIN_CHARS, below which the labels stand vertical, on one line each
TICK_CHARS = 28
TICK_LINES = 3
TICK_MIN_CHARS = 8
# the share of a bar's slot a label may take: the rest is the gap between two labels
TICK_FILL = 0.9


def wrapped(name: str, width: int, lines: int = TICK_LINES) -> str:
    """`name` broken into lines of at most `width` characters (at spaces and hyphens, inside a
    longer word when it must), at most `lines` of them, the last cut with "…" when more
    remains."""
    parts = textwrap.wrap(name, width, break_on_hyphens=True) or [name.strip() or name]
    if len(parts) > lines:
        parts = parts[:lines]
        parts[-1] = parts[-1][: width - 1].rstrip() + "…"
    return "\n".join(parts)


def bars_width(n: int) -> float:
    """A bar chart's width in inches for `n` bars (or groups): 8, wider from 19 of them on, so
    that a vertical label (a line's height) always has room."""
    return max(8.0, 1.5 + 0.35 * n)


def _slot_px(ax, n: int) -> float:
    """The width in pixels between two bars' centres (x = 0, 1, …), or the axes' for one bar."""
    if n < 2:
        return ax.bbox.width
    return abs(ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0])


def fit_xticks(ax, names: list[str], under: list[str] | None = None, fontsize: float = 8) -> None:
    """Tick labels for bars at x = 0 … n-1 (`names`, and a line `under` each) that never overlap:
    each name wrapped to the most characters a line (at most TICK_CHARS) with which every label,
    measured with the figure's renderer, fits TICK_FILL of a bar's slot; a slot too narrow for
    TICK_MIN_CHARS a line: vertical labels, on one line each. The slot is measured with the
    widest labels laid out (the axes never grow narrower once they are shorter). The chart's
    table gives the whole names."""
    from matplotlib.font_manager import FontProperties

    fig, n = ax.figure, len(names)
    if not n:
        return
    under = under or [""] * n
    prop = FontProperties(size=fontsize)
    renderer = fig.canvas.get_renderer()

    def width(text: str) -> float:
        lines = text.split("\n")
        return max(renderer.get_text_width_height_descent(s, prop, ismath=False)[0] for s in lines)

    def texts(chars: int) -> list[str]:
        return [
            wrapped(m, chars) + (f"\n{u}" if u else "") for m, u in zip(names, under, strict=True)
        ]

    widest = texts(TICK_CHARS)
    ax.set_xticks(range(n), widest, fontsize=fontsize)
    fig.tight_layout()  # where the axes stand: the slot's width
    room = TICK_FILL * _slot_px(ax, n)
    longest = max(len(m) for m in names)
    for chars in range(min(TICK_CHARS, max(longest, TICK_MIN_CHARS)), TICK_MIN_CHARS - 1, -1):
        labels = widest if chars == TICK_CHARS else texts(chars)
        if max(map(width, labels)) <= room:
            ax.set_xticks(range(n), labels, fontsize=fontsize)
            return
    # vertical: a label's width is its line's height
    labels = [f"{wrapped(m, TICK_CHARS, 1)} {u}".strip() for m, u in zip(names, under, strict=True)]
    ax.set_xticks(range(n), labels, fontsize=fontsize, rotation=90)


NO_PIF = "No GPU-minute of this day has a PIF:\nits GPUs report no power, or no max power is known"
NO_PIF_WHY = (
    "PIF (and RFU) need the GPU's power and its max power, from the model catalog or the power "
    "limit the export carries; this day's GPUs lack one or the other (see gpu_minutes.max_power_basis "
    "and the model in gpu_samples)."
)
NO_UTIL = (
    "No GPU-minute of this day has a utilization reading:\nits GPUs report power and PIF, "
    "but no utilization"
)
NO_UTIL_WHY = (
    "the day's GPU-minutes have a PIF but no utilization reading (nvidia-smi reports [N/A] "
    "under MIG, a vGPU may lack the field): there is nothing to place on the utilization axis."
)
NO_BOTH = "No GPU-minute of this day has a utilization reading or a PIF"
NO_BOTH_WHY = "the day's GPU-minutes have neither a utilization reading nor a PIF. " + NO_PIF_WHY
NO_PAIR = "No GPU-minute of this day has both\na utilization reading and a PIF"
NO_PAIR_WHY = (
    "some GPU-minutes of the day have a utilization reading and some a PIF, but none has both."
)
# what the day's GPU-minutes lack for a point -> (the chart's text, the title's, the caption's)
SCATTER_EMPTY = {
    "pif": (NO_PIF, "none of this day's has a PIF", NO_PIF_WHY),
    "util": (NO_UTIL, "none of this day's has a utilization", NO_UTIL_WHY),
    "both": (NO_BOTH, "none of this day's has a utilization or a PIF", NO_BOTH_WHY),
    "pair": (NO_PAIR, "none of this day's has both", NO_PAIR_WHY),
}


def scatter_lacking(figures: dict | None) -> str:
    """What the day's physical GPU-minutes lack for the scatter (a key of SCATTER_EMPTY), from
    `data.fleet_minutes` (None, or without its counts: a PIF, as the report always said).
    PIF and RFU are known on the same minutes (RFU = 100 x PIF)."""
    if not figures:
        return "pif"
    has_util, has_pif = figures.get("util", 0) > 0, figures.get("rfu", 0) > 0
    if not (has_util or has_pif):
        return "both"
    if not has_pif:
        return "pif"
    return "pair" if has_util else "util"


def scatter_shown(total: int, drawn: int, lacking: str = "pif") -> str:
    """What the scatter draws, for its title and caption (`lacking`: what the day's minutes
    lack when there is no point, `scatter_lacking`)."""
    if total == 0:
        return SCATTER_EMPTY[lacking][1]  # not "all 0 GPU-minutes"
    if drawn == total:
        return f"all {total:,} GPU-minutes"
    return f"a random sample of {drawn:,} of {total:,} GPU-minutes"


def scatter(pts: pl.DataFrame, total: int, t: Thresholds = DEFAULT, lacking: str = "pif") -> Chart:
    """Utilization vs PIF of the day's GPU-minutes: `pts` (`data.scatter_points`: all `total`
    minutes that have both, or a random sample of them); without any, the chart says what the
    day's minutes lack (`lacking`: `scatter_lacking`)."""
    shown = scatter_shown(total, pts.height, lacking)
    fig, ax = pyplot().subplots(figsize=(7, 5))
    for cls, color in CLASS_COLORS.items():
        p = pts.filter(pl.col("efficiency_class") == cls)
        if p.height:
            ax.scatter(
                p["gpu_util_pct"],
                p["pif"],
                s=4,
                alpha=0.35,
                color=color,
                label=f"{cls} ({p.height:,})",
                clip_on=False,  # a point at 0 % or 100 % is drawn whole, not half
            )
    # the class boundaries in force (rules): bottlenecked below, efficient above, busy from
    ax.axhline(t.bottleneck_pif_below, ls="--", lw=0.8, color="#e53935")
    ax.axhline(t.efficient_pif_from, ls="--", lw=0.8, color="#43a047")
    ax.axvline(t.productive_from, ls="--", lw=0.8, color="#555")
    ax.set_xlabel("GPU utilization (%)")
    ax.set_ylabel("Power intensity factor (power / max power)")
    # a margin left of 0 % and right of 100 %: points at 0 % utilization (idle GPUs, often
    # most of a day) were cut in half by the axis
    ax.set_xlim(-2, 102)
    ax.set_ylim(0, 1.02)
    if total:
        ax.legend(loc="upper left", fontsize=8, markerscale=3)
    else:
        text = SCATTER_EMPTY[lacking][0]
        ax.text(50, 0.5, text, ha="center", va="center", fontsize=9, wrap=True, color="#555")
    ax.set_title(f"Utilization vs PIF per GPU-minute ({shown})", fontsize=10)
    return Chart(
        "Utilization vs power intensity",
        _png(fig),
        (
            f"Shows {shown}; the legend counts the points drawn per class. Bottom right (busy, "
            "low power) is paid time that does little math."
        )
        if total
        else f"No points: {SCATTER_EMPTY[lacking][2]}",
    )


def timeseries(h: pl.DataFrame) -> Chart:
    """The fleet hour by hour: `data.hourly_series` (hour, util, rfu, pif, realized_tflops)."""
    fig, (a1, a2) = pyplot().subplots(2, 1, figsize=(9, 6), sharex=True)
    hours = h["hour"].to_list()
    dots = {"marker": "o", "ms": 3}  # a day with one hour of data still shows it
    a1.plot(hours, _f(h["util"]), label="utilization %", color="#1e88e5", **dots)
    a1.plot(hours, _f(h["rfu"]), label="RFU %", color="#43a047", **dots)
    a1.fill_between(
        hours,
        _f(h["rfu"]),
        _f(h["util"]),
        color="#e53935",
        alpha=0.15,
        label="gap (points)",
    )
    a1.set_ylabel("percent")
    a1.set_ylim(0, 100)
    a1.set_title("Fleet hour by hour: reported utilization vs realized TFLOPS utilization")
    a2.plot(hours, _f(h["pif"]), color="#8e24aa", label="avg PIF", **dots)
    a2.set_ylabel("avg PIF (0-1)")
    a2.set_ylim(0, 1)
    ax3 = a2.twinx()
    ax3.plot(
        hours, _f(h["realized_tflops"]), color="#fb8c00", label="fleet realized TFLOPS", **dots
    )
    ax3.set_ylabel("realized TFLOPS (fleet, hourly mean)")
    ax3.set_ylim(0, max(1.0, float(h["realized_tflops"].max() or 0)) * 1.15)
    a2.set_xlabel("hour of day (UTC)")
    a2.set_xlim(-0.5, 23.5)
    a2.set_xticks(range(0, 24, 3))
    # one legend for both panels, beside them: inside, a fixed corner covered the points of a
    # day whose readings sit there (a morning of idle GPUs: the samples' 2025-11-22 report)
    handles, labels = [], []
    for ax in (a1, a2, ax3):
        h_, l_ = ax.get_legend_handles_labels()
        handles, labels = handles + h_, labels + l_
    a1.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    no_rfu = h["rfu"].null_count() == h.height
    return Chart(
        "Fleet time series", _png(fig), f"No RFU or PIF line: {NO_PIF_WHY}" if no_rfu else ""
    )


def models(g: pl.DataFrame) -> Chart:
    """Per model (`data.model_figures`): mean utilization vs RFU, and its GPUs."""
    fig, ax = pyplot().subplots(figsize=(bars_width(g.height), 4))
    x = range(g.height)
    ax.bar(
        [i - 0.2 for i in x],
        _f(g["gpu_util_pct"]),
        width=0.4,
        label="utilization %",
        color="#1e88e5",
    )
    ax.bar([i + 0.2 for i in x], _f(g["rfu_pct"]), width=0.4, label="RFU %", color="#43a047")
    for i, (u, r) in enumerate(zip(g["gpu_util_pct"], g["rfu_pct"], strict=True)):
        # a model without the figure (no catalog entry, no power limit: no RFU) has no bar
        # there: the slot says so
        for dx, v in ((-0.2, u), (0.2, r)):
            if not _drawn(v):
                ax.text(i + dx, 1, "n/a", ha="center", va="bottom", rotation=90, fontsize=7)
    ax.set_ylabel("percent")
    ax.set_ylim(0, 100)
    # every model's slot, bars or not: from the bars alone, a last model without one stood at
    # the axes' edge (autoscaling leaves NaN bars out)
    ax.set_xlim(-0.6, g.height - 0.4)
    ax.legend(fontsize=8)
    ax.set_title("GPU models: reported utilization vs RFU")
    # long model names side by side overlapped (issue: the capacity chart): wrapped to fit
    fit_xticks(
        ax,
        _labels(g["gpu_model"], 200),
        [f"({plural(n, 'GPU')})" for n in g["gpus"]],
    )
    return Chart("GPU model comparison", _png(fig))


def bottlenecks(daily: pl.DataFrame, t: Thresholds = DEFAULT) -> Chart:
    busy = f"utilization >= {t.productive_from:g} %, PIF < {t.bottleneck_pif_below:g}"
    if not daily.filter(pl.col("active_minutes") > 0).height:
        # not empty axes running from -0.04 to 0.04 (the samples' 2026-03-10)
        return Chart(
            "Bottlenecked GPUs",
            b"",
            empty=f"No GPU was active (utilization >= {t.idle_below:g} %) on this day: none "
            "can be bottlenecked.",
        )
    b = (
        # a GPU without a bottlenecked minute has no bar: bars of length 0 drew an empty plot
        daily.filter(pl.col("active_minutes") > 0, pl.col("bottlenecked_minutes") > 0)
        .with_columns((pl.col("bottlenecked_minutes") / pl.col("active_minutes")).alias("share"))
        .sort("bottlenecked_minutes", descending=True)
        .head(15)
        .sort("bottlenecked_minutes")
    )
    if b.height == 0:
        return Chart(
            "Bottlenecked GPUs",
            b"",
            empty=f"No GPU had a bottlenecked minute ({busy}) on this day: nothing to draw.",
        )
    fig, ax = pyplot().subplots(figsize=(8, 5))
    labels = [
        f"{str(u)[:13]}… {label(ns, 24, NO_NAMESPACE)}"
        for u, ns in zip(b["gpu_uuid"], b["namespace"], strict=True)
    ]
    colors = ["#e53935" if d else "#ffb74d" for d in b["bottlenecked_day"]]
    ax.barh(labels, _f(b["bottlenecked_minutes"]), color=colors)
    ax.set_xlabel(f"bottlenecked minutes ({busy}); red: a bottlenecked GPU-day")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("Most bottlenecked GPUs of the day")
    return Chart("Bottlenecked GPUs", _png(fig))


def waste(w: pl.DataFrame) -> Chart:
    g = (
        w.group_by("namespace")
        .agg(pl.col(list(WASTE_COLORS)).sum(), pl.col("productive_usd").sum())
        .with_columns(pl.col(*WASTE_COLORS, "productive_usd").fill_null(0.0))
        .sort("namespace", nulls_last=True)
    )
    names = _labels(g["namespace"], 24, NO_NAMESPACE)
    fig, ax = pyplot().subplots(figsize=(10, 4))  # wider: the legend stands beside the bars
    bottom = [0.0] * g.height
    for col, color in WASTE_COLORS.items():
        ax.bar(
            names,
            _f(g[col]),
            bottom=bottom,
            color=color,
            label=col.removesuffix("_usd").replace("_", " "),
        )
        bottom = [b + v for b, v in zip(bottom, _f(g[col]), strict=True)]
    ax.bar(
        names,
        _f(g["productive_usd"]),
        bottom=bottom,
        color="#43a047",
        alpha=0.5,
        label="productive",
    )
    ax.set_ylabel("USD for the day")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Where the money went, by namespace")
    return Chart("Waste by namespace", _png(fig))


def recommendations(r: pl.DataFrame, period: Period = MONTHLY) -> Chart:
    # a namespace without a price (a model the price book lacks: SPEC keeps it) has no
    # savings: its row is the lowest, and says why
    g = r.sort("total_savings_frac", nulls_last=False)
    rows = list(range(g.height))
    fig, ax = pyplot().subplots(figsize=(10, 4))  # wider: the legend stands beside the bars
    ax.barh(
        rows,
        _f(100 * g["utilization_savings_frac"]),
        color="#1e88e5",
        label="waste actions (capped by the measured waste)",
    )
    ax.barh(
        rows,
        _f(100 * (g["total_savings_frac"] - g["utilization_savings_frac"])),
        left=_f(100 * g["utilization_savings_frac"]),
        color="#fb8c00",
        label="+ spot: a lower rate on the cost that remains",
    )
    for i, (t, usd) in enumerate(
        zip(g["total_savings_frac"], g["monthly_savings_usd"], strict=True)
    ):
        # a namespace without a price: no bar, and the label says why
        ax.text(100 * (t if _drawn(t) else 0.0) + 1, i, period.usd(usd), va="center", fontsize=8)
    # a row a namespace, by position: its bars are NaN when it has no price, and autoscaling
    # from the bars left its row (label and all) out, its "n/a" text on the x axis (adversarial
    # review); names as categories also merged two cut to the same label
    ax.set_yticks(rows, _labels(g["namespace"], 24, NO_NAMESPACE))
    ax.set_ylim(-0.6, g.height - 0.4)
    ax.set_xlim(0, 115)
    ax.set_xlabel("savings, % of the namespace's cost")
    # beside the bars: inside, in the lower right corner, it covered the lowest namespace's bar
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Recommended savings by namespace")
    return Chart(
        "Recommendations",
        _png(fig),
        "Blue: what the waste actions recover, never more than the waste measured for the "
        "namespace. Orange: spot pricing, a cheaper rate for the hours that remain "
        f"(total = 1 − (1 − utilization) × (1 − rate)). Labels: savings in {period.unit}.",
    )


def roi_label(rfu: float | None, usd: float | None, period: Period = MONTHLY) -> str:
    """The ROI bar's label: the scope's RFU and what reaching the target is worth a month (a
    scope without a price: unknown, not "$n/a/month")."""
    return num(rfu, ".0f", "RFU n/a", "% RFU") + "\n" + period.usd(usd)


def roi(table: pl.DataFrame, period: Period = MONTHLY) -> Chart:
    g = table.with_columns(pl.coalesce("gpu_model", pl.lit("whole fleet")).alias("label")).sort(
        "scope"
    )
    target = g["target_rfu_pct"][0] if g.height else 60
    if not (g["equivalent_gpus"].fill_null(0.0) > 0).any():  # no bar to draw
        rfu = g.filter(pl.col("scope") == "fleet")["avg_rfu_pct"]
        why = (
            "no GPU of this day has an RFU (no power reading, or no max power known)"
            if g["avg_rfu_pct"].null_count() == g.height
            else f"every model with an RFU is at or above the {target:.0f} % RFU target on this "
            f"day (fleet: {num(rfu[0] if rfu.len() else None, '.0f', 'n/a', ' %')})"
        )
        return Chart(
            "Efficiency ROI", b"", empty=f"Nothing to gain by raising RFU to {target:.0f} %: {why}."
        )
    fig, ax = pyplot().subplots(figsize=(bars_width(g.height), 4))
    ax.bar(
        range(g.height),
        _f(g["equivalent_gpus"].fill_null(0.0)),
        color=["#8e24aa" if s == "fleet" else "#ab47bc" for s in g["scope"]],
    )
    for i, (e, r, usd) in enumerate(
        zip(g["equivalent_gpus"], g["avg_rfu_pct"], g["monthly_value_usd"], strict=True)
    ):
        # a model without RFU (no catalog entry, no power limit) has no ROI to show
        ax.text(
            i,
            e or 0,
            roi_label(r, usd, period),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.margins(y=0.2)  # room above the tallest bar for its two-line label, under the title
    ax.set_ylabel(f"equivalent GPUs gained at {target:.0f} % RFU")
    ax.set_title("What raising RFU to the target is worth")
    fit_xticks(ax, _labels(g["label"], 200))
    return Chart(
        "Efficiency ROI",
        _png(fig),
        "Each bar is GPUs × (target − RFU) / RFU for its scope. The fleet bar uses the fleet's "
        "average RFU, which models already above the target raise while counting zero on their "
        "own, and models without RFU (no catalog entry, no power limit) are left out: so the "
        "fleet bar is not the sum of the model bars.",
    )


def _trend_tick(d: date, minutes: int | None, cov: float | None) -> str:
    if minutes is None:
        return f"{str(d)[5:]}\nno data"
    if cov is not None and cov < 100:
        return f"{str(d)[5:]}\n{pct_down(cov).replace(' ', '')} of day"
    return str(d)[5:]


def trend(t: pl.DataFrame) -> Chart:
    fig, ax = pyplot().subplots(figsize=(8, 3.5))
    x = list(range(t.height))
    gaps = [i for i, n in enumerate(t["gpu_minutes"]) if n is None]
    for i in gaps:  # a day the lake lacks: shaded, and the lines break there
        ax.axvspan(i - 0.45, i + 0.45, color="#bdbdbd", alpha=0.3, lw=0)
    ax.plot(x, _f(t["util"]), marker="o", color="#1e88e5", label="utilization %")
    ax.plot(x, _f(t["rfu"]), marker="o", color="#43a047", label="RFU %")
    ax.set_ylim(0, 100)
    ax.set_ylabel("percent")
    ticks = [
        _trend_tick(d, n, c)
        for d, n, c in zip(t["date"], t["gpu_minutes"], t["coverage_pct"], strict=True)
    ]
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_xlim(-0.6, max(t.height, 1) - 0.4)
    ax2 = ax.twinx()
    ax2.bar(x, _f(t["waste_usd"]), color="#e53935", alpha=0.25, label="waste $/day")
    ax2.set_ylabel("waste, $ per day")
    ax2.set_ylim(0, max(1.0, float(t["waste_usd"].max() or 0)) * 1.15)
    lines = ax.get_legend_handles_labels()
    bars = ax2.get_legend_handles_labels()
    # beside the plot: inside, the upper left corner covered the first days' points
    ax.legend(
        lines[0] + bars[0],
        lines[1] + bars[1],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.1, 1.0),
    )
    ax.set_title(f"Fleet trend, last {TREND_DAYS} days: utilization vs RFU, waste")
    held = t.height - len(gaps)
    missing = ", ".join(str(t["date"][i])[5:] for i in gaps)
    return Chart(
        "Fleet trend",
        _png(fig),
        f"Days of the last {TREND_DAYS} the lake holds ({held}); "
        + (f"shaded, without a point: days without data ({missing}); " if gaps else "")
        + "a partial day says how much of it was observed under its date (its waste counts "
        "only the minutes observed); means over GPU-minutes of physical GPUs; waste = idle + "
        "stall + headroom dollars.",
    )


def draw(d: ReportData) -> list[Chart]:
    """The day's charts in the report's order; the recommendations and the ROI only when their
    marts have rows. A chart with nothing to draw carries why (`empty`)."""
    m = d.marts
    out = [
        scatter(m.points, int(m.gpus["points"].sum()), d.t, scatter_lacking(fleet_minutes(m.gpus))),
        timeseries(d.hourly),
        trend(d.trend),
        models(model_figures(m.gpus)),
        bottlenecks(m.daily, d.t),
        waste(m.waste),
    ]
    if m.rec is not None and m.rec.height:
        out.append(recommendations(m.rec, d.period))
    if m.roi is not None and m.roi.height:
        out.append(roi(m.roi, d.period))
    return out
