"""The daily report: one self-contained HTML file (charts inline as PNG) read from the marts."""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field, replace
from datetime import date, timedelta

import matplotlib

matplotlib.use("Agg")  # no display needed
import warnings  # noqa: E402

# a chart of a day where nothing was measured has no series to put in its legend: not a problem
warnings.filterwarnings("ignore", message="No artists with labels found", category=UserWarning)
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from gpu_pipeline.lib.display import (  # noqa: E402
    ACTIONS,
    DIAGNOSES,
    GROUPS,
    METRICS,
    NO_NAMESPACE,
    NO_POWER,
    NO_PRICE,
    STRAGGLER_RULES,
    num,
    plural,
)
from gpu_pipeline.lib.io.lake import Lake  # noqa: E402
from gpu_pipeline.lib.marts.priced_waste import priced_total  # noqa: E402
from gpu_pipeline.lib.rules import DAYS_PER_MONTH, DEFAULT, RULES, Rules, Thresholds  # noqa: E402
from gpu_pipeline.lib.samples import MINUTES_PER_DAY  # noqa: E402

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


@dataclass
class Report:
    day: date
    charts: list[Chart] = field(default_factory=list)
    html: str = ""
    bottlenecked_namespaces: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Period:
    """How the report states money that recurs: a month (30 days like this one), or — when too
    little of the day was observed to stand for a month (`coverage.month_from`) — the day as
    observed. `note` says which, and how much of the day the figures rest on; `caveat`: the
    day is partial, the note stands out."""

    monthly: bool = True
    note: str = ""
    caveat: bool = False

    @property
    def unit(self) -> str:
        return "$/month" if self.monthly else "$/day (observed)"

    def usd(self, monthly_usd: float | None, none: str = NO_PRICE) -> str:
        """A run rate a month (the day's dollars x 30), or the day's dollars it was made of."""
        if monthly_usd is None or monthly_usd != monthly_usd:
            return none
        if self.monthly:
            return f"${monthly_usd:,.0f}/month"
        return f"${monthly_usd / DAYS_PER_MONTH:,.2f}/day"


MONTHLY = Period()


def money_period(cov: dict, t: Thresholds = DEFAULT) -> Period:
    """Monthly figures for a day observed enough to stand for a month, with what they assume;
    the observed day's dollars below `t.coverage_month_from` % coverage."""
    observed, expected = cov["observed_gpu_minutes"], cov["expected_gpu_minutes"]
    c = cov["coverage_pct"]
    if c is None or not expected or observed >= expected:
        return Period(True, "A month is 30 days like this one: the day's dollars × 30.")
    seen = f"{_pct_down(c)} of the day's GPU-minutes ({observed:,} of {expected:,})"
    if c >= t.coverage_month_from:
        return Period(
            True,
            "Monthly figures assume this day is typical: they are its observed dollars × 30, and "
            f"only {seen} were observed.",
            caveat=True,
        )
    return Period(
        False,
        f"Not projected to a month: only {seen} were observed, below the "
        f"{t.coverage_month_from:g} % from which the report projects a month (rule "
        "coverage.month_from). The dollars are what the observed hours cost, per day.",
        caveat=True,
    )


def _label(v: object, n: int = 40, none: str = "(none)") -> str:
    """A chart label: never None, never longer than `n` characters (a label from the data can be
    anything, and a megabyte of text overflows the font rasterizer)."""
    s = none if v is None else str(v)
    return s if len(s) <= n else s[: n - 1] + "…"


def _f(series: pl.Series) -> list[float]:
    """Numbers for matplotlib: floats, NaN where there is no value (nothing is drawn there)."""
    return series.cast(pl.Float64).fill_null(float("nan")).to_list()


def _labels(series: pl.Series, n: int = 40, none: str = "(none)") -> list[str]:
    return [_label(v, n, none) for v in series.to_list()]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


SCATTER_POINTS = 20_000  # more points only blur the chart and grow the page
NO_PIF = "No GPU-minute of this day has a PIF:\nits GPUs report no power, or no max power is known"
NO_PIF_WHY = (
    "PIF (and RFU) need the GPU's power and its max power, from the model catalog or the power "
    "limit the export carries; this day's GPUs lack one or the other (see gpu_minutes.max_power_basis "
    "and the model in gpu_samples)."
)


def scatter_shown(total: int, drawn: int) -> str:
    """What the scatter draws, for its title and caption."""
    if total == 0:
        return "none of this day's has a PIF"  # not "all 0 GPU-minutes"
    if drawn == total:
        return f"all {total:,} GPU-minutes"
    return f"a random sample of {drawn:,} of {total:,} GPU-minutes"


def _scatter(m: pl.DataFrame, t: Thresholds = DEFAULT) -> Chart:
    pts = m.filter(pl.col("pif").is_not_null() & pl.col("gpu_util_pct").is_not_null())
    total = pts.height
    if pts.height > SCATTER_POINTS:
        pts = pts.sample(SCATTER_POINTS, seed=0)
    shown = scatter_shown(total, pts.height)
    fig, ax = plt.subplots(figsize=(7, 5))
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
            )
    # the class boundaries in force (rules): bottlenecked below, efficient above, busy from
    ax.axhline(t.bottleneck_pif_below, ls="--", lw=0.8, color="#e53935")
    ax.axhline(t.efficient_pif_from, ls="--", lw=0.8, color="#43a047")
    ax.axvline(t.productive_from, ls="--", lw=0.8, color="#555")
    ax.set_xlabel("GPU utilization (%)")
    ax.set_ylabel("Power intensity factor (power / max power)")
    ax.set_xlim(0, 101)
    ax.set_ylim(0, 1.02)
    if total:
        ax.legend(loc="upper left", fontsize=8, markerscale=3)
    else:
        ax.text(50, 0.5, NO_PIF, ha="center", va="center", fontsize=9, wrap=True, color="#555")
    ax.set_title(f"Utilization vs PIF per GPU-minute ({shown})", fontsize=10)
    return Chart(
        "Utilization vs power intensity",
        _png(fig),
        (
            f"Shows {shown}; the legend counts the points drawn per class. Bottom right (busy, "
            "low power) is paid time that does little math."
        )
        if total
        else f"No points: {NO_PIF_WHY}",
    )


def _timeseries(m: pl.DataFrame) -> Chart:
    h = (
        m.with_columns(pl.col("minute").dt.truncate("1h").alias("hour"))
        .group_by("hour")
        .agg(
            pl.col("gpu_util_pct", "rfu_pct", "pif", "efficiency_gap_pct").mean(),
            # null, not 0, for an hour without any (no PIF): nothing is drawn there
            pl.when(pl.col("realized_tflops").count() > 0).then(
                pl.col("realized_tflops").sum() / 60
            ),
        )
        .sort("hour")
    )
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    hours = h["hour"].dt.hour()
    hours = hours.to_list()
    dots = {"marker": "o", "ms": 3}  # a day with one hour of data still shows it
    a1.plot(hours, _f(h["gpu_util_pct"]), label="utilization %", color="#1e88e5", **dots)
    a1.plot(hours, _f(h["rfu_pct"]), label="RFU %", color="#43a047", **dots)
    a1.fill_between(
        hours,
        _f(h["rfu_pct"]),
        _f(h["gpu_util_pct"]),
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
    no_rfu = h["rfu_pct"].null_count() == h.height
    return Chart(
        "Fleet time series", _png(fig), f"No RFU or PIF line: {NO_PIF_WHY}" if no_rfu else ""
    )


def _models(m: pl.DataFrame) -> Chart:
    g = (
        m.group_by("gpu_model")
        .agg(pl.col("gpu_util_pct", "rfu_pct").mean(), pl.col("gpu_uuid").n_unique())
        .sort("gpu_model")
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(g.height)
    ax.bar(
        [i - 0.2 for i in x],
        _f(g["gpu_util_pct"]),
        width=0.4,
        label="utilization %",
        color="#1e88e5",
    )
    ax.bar([i + 0.2 for i in x], _f(g["rfu_pct"]), width=0.4, label="RFU %", color="#43a047")
    ax.set_xticks(
        list(x),
        [
            f"{_label(mdl, 28)}\n({plural(n, 'GPU')})"
            for mdl, n in zip(g["gpu_model"], g["gpu_uuid"], strict=True)
        ],
        fontsize=8,
    )
    ax.set_ylabel("percent")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title("GPU models: reported utilization vs RFU")
    return Chart("GPU model comparison", _png(fig))


def _bottlenecks(daily: pl.DataFrame, t: Thresholds = DEFAULT) -> Chart:
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
    fig, ax = plt.subplots(figsize=(8, 5))
    labels = [
        f"{str(u)[:13]}… {_label(ns, 24, NO_NAMESPACE)}"
        for u, ns in zip(b["gpu_uuid"], b["namespace"], strict=True)
    ]
    colors = ["#e53935" if d else "#ffb74d" for d in b["bottlenecked_day"]]
    ax.barh(labels, _f(b["bottlenecked_minutes"]), color=colors)
    ax.set_xlabel(f"bottlenecked minutes ({busy}); red: a bottlenecked GPU-day")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("Most bottlenecked GPUs of the day")
    return Chart("Bottlenecked GPUs", _png(fig))


def _waste(w: pl.DataFrame) -> Chart:
    g = (
        w.group_by("namespace")
        .agg(pl.col(list(WASTE_COLORS)).sum(), pl.col("productive_usd").sum())
        .with_columns(pl.col(*WASTE_COLORS, "productive_usd").fill_null(0.0))
        .sort("namespace", nulls_last=True)
    )
    names = _labels(g["namespace"], 24, NO_NAMESPACE)
    fig, ax = plt.subplots(figsize=(10, 4))  # wider: the legend stands beside the bars
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


def _recommendations(r: pl.DataFrame, period: Period = MONTHLY) -> Chart:
    g = r.sort("total_savings_frac")
    names = _labels(g["namespace"], 24, NO_NAMESPACE)
    fig, ax = plt.subplots(figsize=(10, 4))  # wider: the legend stands beside the bars
    ax.barh(
        names,
        _f(100 * g["utilization_savings_frac"]),
        color="#1e88e5",
        label="waste actions (capped by the measured waste)",
    )
    ax.barh(
        names,
        _f(100 * (g["total_savings_frac"] - g["utilization_savings_frac"])),
        left=_f(100 * g["utilization_savings_frac"]),
        color="#fb8c00",
        label="+ spot: a lower rate on the cost that remains",
    )
    for i, (t, usd) in enumerate(
        zip(g["total_savings_frac"], g["monthly_savings_usd"], strict=True)
    ):
        # a namespace without a price: no bar, and the label says why
        ax.text(100 * (t or 0.0) + 1, i, period.usd(usd), va="center", fontsize=8)
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


def _roi(roi: pl.DataFrame, period: Period = MONTHLY) -> Chart:
    g = roi.with_columns(pl.coalesce("gpu_model", pl.lit("whole fleet")).alias("label")).sort(
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
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(
        _labels(g["label"], 28),
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
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("What raising RFU to the target is worth")
    return Chart(
        "Efficiency ROI",
        _png(fig),
        "Each bar is GPUs × (target − RFU) / RFU for its scope. The fleet bar uses the fleet's "
        "average RFU, which models already above the target raise while counting zero on their "
        "own, and models without RFU (no catalog entry, no power limit) are left out: so the "
        "fleet bar is not the sum of the model bars.",
    )


TREND_DAYS = 7


def _minute_mean(h: pl.DataFrame, c: str) -> float | None:
    """An hourly mean column averaged over the groups' GPU-minutes (groups without it left out)."""
    ok = h.filter(pl.col(c).is_not_null())
    n = ok["gpu_minutes"].sum()
    return (ok[c] * ok["gpu_minutes"]).sum() / n if n else None


def fleet_trend(lake: Lake, day: date, days: int = TREND_DAYS) -> pl.DataFrame:
    """Per day of D-(days-1)..D that the lake holds: GPU-minutes, utilization and RFU (means over
    the GPU-minutes of hourly_fleet_metrics, physical GPUs) and the dollars of waste."""
    rows = []
    for d in [day - timedelta(days=i) for i in range(days - 1, -1, -1)]:
        if not lake.exists("hourly_fleet_metrics", d):
            continue
        h = lake.read("hourly_fleet_metrics", d)
        w = _read(lake, "priced_waste", d)
        rows.append(
            {
                "date": d,
                "gpu_minutes": int(h["gpu_minutes"].sum()),
                "util": _minute_mean(h, "avg_gpu_util_pct"),
                "rfu": _minute_mean(h, "avg_rfu_pct"),
                "waste_usd": w.select(priced_total("total_waste_usd")).item(),
            }
        )
    schema = {
        "date": pl.Date,
        "gpu_minutes": pl.Int64,
        "util": pl.Float64,
        "rfu": pl.Float64,
        "waste_usd": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def trend_calendar(lake: Lake, trend: pl.DataFrame, day: date) -> pl.DataFrame:
    """The trend with every calendar day from the first it holds to `day`: a day the lake lacks
    is a row without GPU-minutes (a gap, never drawn beside its neighbours as if adjacent), and
    each day's coverage (`fleet_daily.coverage_pct`: a partial day reads as one)."""
    if trend.height == 0:
        return trend.with_columns(pl.lit(None, pl.Float64).alias("coverage_pct"))
    days = pl.date_range(trend["date"].min(), day, "1d", eager=True).alias("date")
    cov = [
        lake.read("fleet_daily", d)["coverage_pct"].max() if lake.exists("fleet_daily", d) else None
        for d in days
    ]
    return (
        pl.DataFrame(days)
        .join(trend, on="date", how="left")
        .with_columns(pl.Series("coverage_pct", cov, dtype=pl.Float64))
    )


def _trend_tick(d: date, minutes: int | None, cov: float | None) -> str:
    if minutes is None:
        return f"{str(d)[5:]}\nno data"
    if cov is not None and cov < 100:
        return f"{str(d)[5:]}\n{_pct_down(cov).replace(' ', '')} of day"
    return str(d)[5:]


def _trend(t: pl.DataFrame) -> Chart:
    fig, ax = plt.subplots(figsize=(8, 3.5))
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


# the overlap group of actions that change the price of a GPU-hour, not how the GPUs are used
RATE_GROUP = "rate"


def top_actions(rec: pl.DataFrame, n: int = 3) -> pl.DataFrame:
    """The `n` different actions on recoverable waste (idle, stall, headroom: what changes in how
    the GPUs are used) worth the most dollars a month across the fleet, each where it is worth the
    most: its fraction of the namespace's monthly run rate, capped by the waste measured there,
    with the evidence. Price actions (spot) are not waste: `price_actions` ranks them apart."""
    if rec.height == 0:
        return pl.DataFrame()
    d = (
        rec.select("namespace", "monthly_cost_usd", "measured_waste_frac", "action_details")
        .explode("action_details")
        .drop_nulls("action_details")
        .unnest("action_details")
        .filter(pl.col("group") != RATE_GROUP)
    )
    if d.height == 0:
        return pl.DataFrame()
    frac = pl.min_horizontal("fraction", "measured_waste_frac")
    return (
        d.with_columns((frac * pl.col("monthly_cost_usd")).alias("monthly_usd"))
        .filter(pl.col("monthly_usd") > 0)
        .sort(["monthly_usd", "namespace", "action"], descending=[True, False, False])
        # actions of one namespace and group recover the same waste: only its best is listed
        # (MIG after right_size on the same idle GPUs would count those dollars twice)
        .unique(["namespace", "group"], keep="first", maintain_order=True)
        # three different actions: each where it is worth the most (the same action elsewhere
        # is in the Recommendations table)
        .unique("action", keep="first", maintain_order=True)
        .head(n)
        .select("namespace", "action", "monthly_usd", "rationale")
    )


def price_actions(rec: pl.DataFrame) -> pl.DataFrame:
    """Paying less for the same work, per namespace with a spot saving: its spot discount
    (`rate_savings_frac`), its cost a day, the cost a day left once the waste actions are done
    (`(1 - utilization savings) x cost`) and what spot saves on that a month
    (`(total - utilization savings) x monthly cost`, the recommendations' own composition), most
    first."""
    cols = ("rate_savings_frac", "cost_usd", "utilization_savings_frac", "total_savings_frac")
    if rec.height == 0 or not set(cols) <= set(rec.columns):
        return pl.DataFrame()
    u = pl.col("utilization_savings_frac")
    return (
        rec.filter(pl.col("rate_savings_frac") > 0)
        .select(
            "namespace",
            "rate_savings_frac",
            "cost_usd",
            ((1 - u) * pl.col("cost_usd")).alias("remaining_usd"),
            ((pl.col("total_savings_frac") - u) * pl.col("monthly_cost_usd")).alias("monthly_usd"),
        )
        .sort(["monthly_usd", "namespace"], descending=[True, False], nulls_last=True)
    )


def fleet_capacity(m: pl.DataFrame, catalog: pl.DataFrame) -> pl.DataFrame:
    """Per model (physical GPUs): what the fleet could do on paper (theoretical FP16 TFLOPS), what
    it can achieve (the catalog's achievable TFLOPS), and what it realized on average over the
    day's GPU-minutes (realized TFLOPS = achievable x PIF)."""
    from gpu_pipeline.lib.reference import model_key

    cat = catalog.select("model_key", pl.col("theoretical_fp16_tflops").alias("_theoretical"))
    g = (
        m.group_by("gpu_model")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("achievable_tflops").max().alias("_achievable"),
            pl.col("realized_tflops").mean().alias("_realized"),
        )
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(cat, on="model_key", how="left")
        .select(
            "gpu_model",
            "gpus",
            (pl.col("gpus") * pl.col("_theoretical")).alias("theoretical_tflops"),
            (pl.col("gpus") * pl.col("_achievable")).alias("achievable_tflops"),
            (pl.col("gpus") * pl.col("_realized")).alias("realized_tflops"),
        )
        .with_columns(
            (100.0 * pl.col("realized_tflops") / pl.col("achievable_tflops")).alias(
                "realized_pct_of_achievable"
            )
        )
        .sort("gpu_model", nulls_last=True)
    )
    return g


# table headers for people, not column names
LABELS = {
    "gpu_uuid": "GPU",
    "hostname": "host",
    "gpu_model": "model",
    "gpus": "GPUs",
    "gpu_hours": "GPU-hours",
    "gpu_minutes": "GPU-minutes",
    "days_bottlenecked": "days bottlenecked",
    "bottleneck_share": "share bottlenecked",
    "measured_waste_frac": "measured waste",
    "naive_sum_frac": "naive sum",
    "utilization_savings_frac": "waste actions' savings",
    "rate_savings_frac": "spot (rate) savings",
    "total_savings_frac": "total savings",
    "monthly_savings_usd": "savings $/month",
    "avg_gpu_util_pct": "utilization %",
    "avg_rfu_pct": "RFU %",
    "util": "utilization %",
    "rfu": "RFU %",
    "pct_idle": "idle %",
    "pct_active_bottlenecked": "active minutes bottlenecked %",
    "dominant_diagnosis": "main diagnosis",
    "cost_usd": "cost $/day",
    "waste_usd": "waste $/day",
    "energy_kwh": "energy kWh",
    "idle_energy_kwh": "idle kWh",
    "energy_usd": "energy $/day",
    "co2_kg": "CO₂ kg",
    "pod_median": "pod median",
    "points_below": "points below",
    "pod_stddev": "pod std dev",
    "theoretical_tflops": "theoretical TFLOPS",
    "achievable_tflops": "achievable TFLOPS",
    "realized_tflops": "realized TFLOPS",
    "realized_pct_of_achievable": "realized / achievable",
    "action": "action",
    "group": "waste it recovers",
    "fraction": "share of cost",
    "rationale": "measured evidence",
    "rule": "why flagged",
    "metric": "measured as",
    "status": "status",
    "reasons": "reasons",
    "on_day": "on this day",
    "remaining_usd": "after the waste actions $/day",
}


def coded(code: object, labels: dict[str, str]) -> str:
    """HTML: the label people read for a mart's code, the code in a tooltip (`<abbr>`); codes
    joined by ", " (a straggler flagged by two rules) each get theirs; an unknown code as is."""
    parts = []
    for c in str(code).split(", "):
        label = labels.get(c)
        parts.append(
            f"<abbr title='code: {html.escape(c)}'>{html.escape(label)}</abbr>"
            if label
            else html.escape(c)
        )
    return ", ".join(parts)


def _table(
    df: pl.DataFrame,
    cols: list[str],
    fmt: dict | None = None,
    missing: dict | None = None,
    codes: dict[str, dict[str, str]] | None = None,
    heads: dict[str, str] | None = None,
    cls: str = "",
) -> str:
    """An HTML table of `cols`, each formatted by `fmt[col]`; an empty cell says `missing[col]`
    (a namespace: "(no namespace)"); a column of `codes` reads as its labels (the code in a
    tooltip); `heads` overrides a column's header (LABELS otherwise)."""
    fmt, codes, heads = fmt or {}, codes or {}, heads or {}
    missing = {"namespace": NO_NAMESPACE} | (missing or {})
    head = "".join(f"<th>{html.escape(heads.get(c) or LABELS.get(c, c))}</th>" for c in cols)
    rows = []
    for r in df.select(cols).iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            if v is None:
                s = html.escape(missing.get(c, ""))
            elif c in codes:
                s = coded(v, codes[c])
            elif c in fmt:
                s = html.escape(fmt[c](v))
            else:
                s = html.escape(str(v))
            cells.append(f"<td>{s}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    klass = f" class='{cls}'" if cls else ""
    return f"<div class='scroll'><table{klass}><tr>{head}</tr>{''.join(rows)}</table></div>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{margin-bottom:0}.kpis{display:flex;gap:1em;flex-wrap:wrap;margin:1em 0}
.kpi{background:#f5f5f5;border-radius:8px;padding:.6em 1em}.kpi b{display:block;font-size:1.4em}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}th{background:#fafafa}
.note{color:#666;font-size:.85em}.scroll{overflow-x:auto;max-width:100%}
.partial{background:#fff3e0;border-left:4px solid #fb8c00;padding:.6em 1em;margin:1em 0;overflow-wrap:anywhere}
.partial.warn{background:#ffebee;border-left-color:#e53935}
.caveat{background:#fff8e1;border-left:4px solid #ffb300;padding:.4em 1em;margin:.6em 0}
abbr[title]{text-decoration:underline dotted;cursor:help}ol.first li{margin:.3em 0}
ul.rules{columns:16em;font-size:.8em;padding-left:0;list-style:none}
ul.rules li{overflow-wrap:anywhere}ul.rules li.sec{margin-top:.4em;break-after:avoid}.appendix td{overflow-wrap:anywhere}
@media (max-width:760px){body{margin:.8em}table{font-size:.78em}}
@media print{body{margin:0;max-width:none}.scroll{overflow:visible}
img,tr,.kpi,.chart{break-inside:avoid}h2,h3{break-after:avoid}}"""


def day_coverage(lake: Lake, day: date, physical_minutes: pl.DataFrame) -> dict:
    """The day's coverage: GPUs seen, observed and expected GPU-minutes, coverage_pct — from
    fleet_daily, or for a lake written before it existed, from the physical GPU-minutes."""
    if lake.exists("fleet_daily", day):
        f = lake.read("fleet_daily", day)
        if f.height:
            return f.select(
                "gpus", "observed_gpu_minutes", "expected_gpu_minutes", "coverage_pct"
            ).row(0, named=True)
    gpus = physical_minutes.get_column("gpu_uuid").n_unique()
    observed, expected = physical_minutes.height, gpus * MINUTES_PER_DAY
    return {
        "gpus": gpus,
        "observed_gpu_minutes": observed,
        "expected_gpu_minutes": expected,
        "coverage_pct": 100.0 * observed / expected if expected else None,
    }


def _pct_down(v: float) -> str:
    """A coverage, rounded down: 99.97 % of a day is not 100.0 % (and 95.1 stored as
    95.09999… is still 95.1)."""
    return f"{math.floor(v * 10 + 1e-9) / 10:.1f} %"


def partial_banner(cov: dict, daily: pl.DataFrame, t: Thresholds = DEFAULT) -> str:
    """What the top of the report says when the data covers only part of the day (observed
    GPU-minutes below GPUs seen x 1,440): the coverage, observed vs expected GPU-minutes, the
    GPUs with gaps; "" when the day is complete."""
    observed, expected = cov["observed_gpu_minutes"], cov["expected_gpu_minutes"]
    if not expected or observed >= expected:
        return ""
    coverage = cov["coverage_pct"]
    below = coverage < t.coverage_warn_below
    # by minutes, not coverage_pct: a gpu_daily written before that column existed has them
    gaps = daily.filter(
        pl.col("gpu_instance_id").is_null(), pl.col("minutes") < MINUTES_PER_DAY
    ).sort("minutes", "gpu_uuid")
    text = (
        f"<b>Partial data: this day's telemetry covers {_pct_down(coverage)} of its GPU-minutes</b>"
        f" — {observed:,} observed of {expected:,} expected ({plural(cov['gpus'], 'GPU')} seen × "
        f"{MINUTES_PER_DAY:,} minutes)."
    )
    if below:
        text += (
            f" That is below the {t.coverage_warn_below:g} % at which the fleet_coverage check "
            "warns."
        )
    if gaps.height:
        least = gaps.row(0, named=True)
        text += (
            f" {gaps.height:,} of {plural(cov['gpus'], 'GPU')} {'has' if gaps.height == 1 else 'have'}"
            " gaps; the least covered is "
            f"{html.escape(_label(least['gpu_uuid'], 60))}"
            f" ({_pct_down(100.0 * least['minutes'] / MINUTES_PER_DAY)}, "
            f"{least['minutes']:,} minutes)."
        )
    text += (
        " Totals below (GPU-hours, cost, waste, energy) count only the minutes observed; averages "
        "and shares are over them."
    )
    return f"<p class='partial{' warn' if below else ''}'>{text}</p>"


def _read(lake: Lake, table: str, day: date) -> pl.DataFrame:
    from gpu_pipeline.lib.schemas import TABLES

    return lake.read(table, day) if lake.exists(table, day) else pl.DataFrame(schema=TABLES[table])


def _no_minutes(lake: Lake, day: date) -> str:
    """What a day without GPU-minutes had: nothing landed, or every record rejected (and why)."""
    log = _read(lake, "ingest_log", day)
    read = int(log.get_column("rows_read").sum()) if log.height else 0
    if read == 0:
        return "<p>No GPU-minutes for this day: no landing file holds a record of it.</p>"
    rejected = int(log.get_column("rows_quarantined").sum())
    dup = int(log.get_column("rows_duplicate").sum())
    q = _read(lake, "quarantine", day)
    reasons = (
        q.group_by("reason").len().sort("len", descending=True).head(5)
        if q.height
        else pl.DataFrame(schema={"reason": pl.String, "len": pl.UInt32})
    )
    items = "".join(
        f"<li>{html.escape(str(r['reason'])[:300])} ({r['len']:,} rows)</li>"
        for r in reasons.iter_rows(named=True)
    )
    return (
        f"<p class='warn'><b>No GPU-minutes for this day: {read:,} records were read from "
        f"{log.height:,} file(s), and {rejected:,} of them were rejected"
        + (f", {dup:,} were duplicates" if dup else "")
        + ".</b> "
        + ("Its validation check (gpu_samples validation_pass_rate) failed. " if rejected else "")
        + "Rejected records and their reasons are in "
        'the quarantine table (<code>gpu-pipeline sql "SELECT * FROM quarantine WHERE date = '
        f"'{day}'\"</code>); the most common reasons:</p><ul>{items}</ul>"
    )


@dataclass(frozen=True)
class InForce:
    """What the day's dollars and thresholds came from, for the report's appendix: the price
    book and energy rates files (None: the shipped ones), the rules and their file (None: no
    rules file). `told` is False when the caller did not say (the appendix then shows the
    shipped files and says so)."""

    prices: str | None = None
    energy: str | None = None
    rules: Rules = RULES
    rules_file: str | None = None
    told: bool = True


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
    # fleet figures count each physical GPU once; MIG instances are parts of it
    m = _read(lake, "gpu_minutes", day).filter(pl.col("gpu_instance_id").is_null())
    daily = _read(lake, "gpu_daily", day)
    w = _read(lake, "priced_waste", day)
    rec = lake.read("recommendations", day) if lake.exists("recommendations", day) else None
    roi = lake.read("efficiency_roi", day) if lake.exists("efficiency_roi", day) else None
    pb = _read(lake, "persistent_bottlenecks", day)
    health = lake.read("gpu_health", day) if lake.exists("gpu_health", day) else None
    strag = lake.read("stragglers", day) if lake.exists("stragglers", day) else None
    nse = (
        lake.read("namespace_efficiency", day) if lake.exists("namespace_efficiency", day) else None
    )

    rep = Report(day)
    head = (
        "<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
        f"content='width=device-width,initial-scale=1'><title>GPU efficiency report {day}</title>"
        f"<style>{CSS}</style></head><body><h1>GPU efficiency report — {day}</h1>"
    )
    if m.height == 0:
        rep.html = f"{head}{_no_minutes(lake, day)}</body></html>"
        return rep
    trend = trend_calendar(lake, fleet_trend(lake, day), day)
    if catalog is None:
        from gpu_pipeline.lib.reference import load_catalog

        catalog = load_catalog()
    capacity = fleet_capacity(m, catalog)
    cov = day_coverage(lake, day, m)
    period = money_period(cov, t)
    charts = [_scatter(m, t), _timeseries(m), _trend(trend), _models(m), _bottlenecks(daily, t)]
    charts.append(_waste(w))
    if rec is not None and rec.height:
        charts.append(_recommendations(rec, period))
    if roi is not None and roi.height:
        charts.append(_roi(roi, period))
    rep.charts = [c for c in charts if not c.empty]  # what is drawn

    bn = (
        daily.filter(pl.col("bottlenecked_day"))
        .group_by("namespace")
        .agg(pl.len().alias("gpus"), pl.col("bottlenecked_minutes").sum())
        .sort("bottlenecked_minutes", descending=True)
    )
    rep.bottlenecked_namespaces = [_label(n, 200, NO_NAMESPACE) for n in bn["namespace"]]
    parts = [head, partial_banner(cov, daily, t), _kpis(m, w, nse, cov)]
    if rec is not None:
        parts += [_first_section(rec, period), _price_section(rec, period)]
    if bn.height:
        names = ", ".join(
            f"<b>{html.escape(_label(r['namespace'], 200, NO_NAMESPACE))}</b> "
            f"({plural(r['gpus'], 'GPU')})"
            for r in bn.iter_rows(named=True)
        )
        parts.append(
            f"<p>Bottlenecked today (busy at low power on most active minutes): {names}.</p>"
        )
    after = {
        "Fleet trend": lambda: _trend_table(trend),
        "GPU model comparison": lambda: _capacity_table(capacity),
        "Bottlenecked GPUs": lambda: _persistent_table(pb, daily, t),
        "Recommendations": lambda: _recommendation_tables(rec, period),
    }
    for c in charts:
        parts.append(_chart_html(c))
        if c.title in after:
            parts.append(after[c.title]())
    if nse is not None and nse.height:
        parts.append(_namespaces(nse))
    if health is not None:
        parts.append(_health(health, in_force.rules))
    if strag is not None and strag.height:
        parts.append(_stragglers(strag))
    parts.append(dollars_appendix(m, in_force))
    parts.append(
        "<p class='note'>PIF is power draw over the model's max power, a proxy for work: thermal "
        "throttling, power caps and memory-bound kernels bend it. Generated by gpu_pipeline.</p>"
        "</body></html>"
    )
    rep.html = "\n".join(p for p in parts if p)
    return rep


def _chart_html(c: Chart) -> str:
    """One block per chart: a printed page never separates a chart from its title and caption;
    a chart with nothing to draw is its title and why."""
    title = html.escape(c.title)
    if c.empty:
        return (
            f"<div class='nochart'><h2>{title}</h2><p class='note'>{html.escape(c.empty)}</p></div>"
        )
    b64 = base64.b64encode(c.png).decode()
    caption = f"<p class='note'>{html.escape(c.caption)}</p>" if c.caption else ""
    return (
        f"<div class='chart'><h2>{title}</h2><img alt='{title}' "
        f"src='data:image/png;base64,{b64}'>{caption}</div>"
    )


def _kpis(m: pl.DataFrame, w: pl.DataFrame, nse: pl.DataFrame | None, cov: dict) -> str:
    k = m.select(
        pl.col("gpu_uuid").n_unique().alias("gpus"),
        (pl.len() / 60).alias("hours"),
        pl.col("gpu_util_pct").mean().alias("util"),
        pl.col("rfu_pct").mean().alias("rfu"),
        pl.col("efficiency_gap_pct").mean().alias("gap"),
    ).row(0, named=True)
    cost, waste = w.select(priced_total("cost_usd"), priced_total("total_waste_usd")).row(0)
    priced = cost is not None
    kpis = [
        ("GPUs", f"{k['gpus']}"),
        ("GPU-hours", f"{k['hours']:,.1f}"),
        ("coverage", _pct_down(cov["coverage_pct"])),
        ("avg utilization", num(k["util"], ".1f", unit=" %")),
        ("avg RFU", num(k["rfu"], ".1f", unit=" %")),
        ("gap", num(k["gap"], ".1f", unit=" pts")),
        ("cost / day", f"${cost:,.2f}" if priced else NO_PRICE),
        ("waste / day", f"${waste:,.2f}" if priced else NO_PRICE),
    ]
    if nse is not None and nse.height and "energy_kwh" in nse.columns:
        e = nse.select(pl.col("energy_kwh", "idle_energy_kwh", "energy_usd", "co2_kg").sum()).row(
            0, named=True
        )
        # a namespace without any power reading has no energy (null): a day of only such
        # namespaces has no known energy (not 0 kWh)
        powered = bool(nse.get_column("energy_kwh").is_not_null().any())
        kpis += [
            (
                "energy / day",
                f"{e['energy_kwh']:,.1f} kWh (${e['energy_usd']:,.2f})" if powered else NO_POWER,
            ),
            ("idle energy / day", f"{e['idle_energy_kwh']:,.1f} kWh" if powered else NO_POWER),
            ("CO₂ / day", f"{e['co2_kg']:,.1f} kg" if powered else NO_POWER),
        ]
    return (
        "<div class='kpis'>"
        + "".join(f"<div class='kpi'>{n}<b>{v}</b></div>" for n, v in kpis)
        + "</div>"
    )


def _first_section(rec: pl.DataFrame, period: Period) -> str:
    """What to do first: recoverable waste only, by dollars a month (or the observed day's)."""
    first = top_actions(rec)
    if first.height == 0:
        return (
            "<h2>What to do first</h2><p>No action on wasted GPU time fires on this day: no "
            "namespace has enough idle, stalled or headroom time priced to act on.</p>"
        )
    items = "".join(
        f"<li><b>{coded(r['action'], ACTIONS)}</b> for "
        f"<b>{html.escape(_label(r['namespace'], 200, NO_NAMESPACE))}</b>: about "
        f"<b>{period.usd(r['monthly_usd'])}</b> — {html.escape(str(r['rationale']))}</li>"
        for r in first.iter_rows(named=True)
    )
    caveat = "caveat" if period.caveat else "note"
    return (
        f"<h2>What to do first</h2><p class='{caveat}'>{html.escape(period.note)}</p>"
        f"<ol class='first'>{items}</ol><p class='note'>Recoverable waste: what changes in how "
        "the GPUs are used (idle, stalled and headroom time). Up to three different actions, each "
        "where it is worth the most, ranked by dollars: the action's share of its namespace's cost, "
        "capped by the waste measured there. Actions of one namespace and group recover the same "
        "waste and do not add up; the Recommendations table below combines them. Paying less for "
        "the same hours (spot) is not waste: it is ranked on its own, next.</p>"
    )


def _price_section(rec: pl.DataFrame, period: Period) -> str:
    """Paying less for the same work: spot, per namespace, on the cost left after the waste."""
    p = price_actions(rec)
    if p.height == 0:
        return ""
    table = _table(
        p,
        ["namespace", "monthly_usd", "rate_savings_frac", "cost_usd", "remaining_usd"],
        {
            "monthly_usd": period.usd,
            "rate_savings_frac": lambda v: f"{100 * v:.0f} %",
            "cost_usd": lambda v: f"${v:,.2f}",
            "remaining_usd": lambda v: f"${v:,.2f}",
        },
        heads={
            "monthly_usd": f"spot saves {period.unit}",
            "rate_savings_frac": "spot discount",
        },
    )
    return (
        "<h2>Paying less for the same work</h2><p>A lower price for the same GPU-hours — not a "
        "change in how the GPUs are used, so it is ranked apart from the waste above. "
        f"<b>{coded('spot', ACTIONS)}</b>: the price book's spot rate on the cost left once the "
        "waste actions are done, for interruption-tolerant work (checkpointed training, batch "
        f"inference).</p>{table}<p class='note'>Spot saves (total − waste actions' savings) × "
        "monthly cost, the Recommendations' own composition. Reserved and committed-use rates are "
        "not in the price book (model, on-demand, spot), so they are not priced here.</p>"
    )


def _recommendation_tables(rec: pl.DataFrame | None, period: Period) -> str:
    if rec is None:
        return ""
    rec = rec.sort(["monthly_savings_usd", "namespace"], descending=[True, False], nulls_last=True)
    parts = []
    details = rec.explode("action_details").unnest("action_details").drop_nulls("action")
    if details.height:  # no action anywhere (nothing priced, nothing to fix): no table
        parts.append(
            _table(
                details,
                ["namespace", "action", "group", "fraction", "rationale"],
                {"fraction": lambda v: f"{100 * v:.1f} %"},
                codes={"action": ACTIONS, "group": GROUPS},
            )
        )
    share = lambda v: f"{100 * v:.1f} %"  # noqa: E731
    per = 1 if period.monthly else DAYS_PER_MONTH
    parts.append(
        _table(
            rec,
            [
                "namespace",
                "measured_waste_frac",
                "naive_sum_frac",
                "utilization_savings_frac",
                "rate_savings_frac",
                "total_savings_frac",
                "monthly_savings_usd",
            ],
            dict.fromkeys(
                (
                    "measured_waste_frac",
                    "naive_sum_frac",
                    "utilization_savings_frac",
                    "rate_savings_frac",
                    "total_savings_frac",
                ),
                share,
            )
            | {"monthly_savings_usd": lambda v: f"${v / per:,.2f}"},
            # a namespace none of whose minutes has a price: nothing to weigh
            dict.fromkeys(
                (
                    "measured_waste_frac",
                    "utilization_savings_frac",
                    "rate_savings_frac",
                    "total_savings_frac",
                    "monthly_savings_usd",
                ),
                NO_PRICE,
            ),
            heads={"monthly_savings_usd": f"savings {period.unit}"},
        )
    )
    parts.append(
        "<p class='note'>Actions in one group recover the same waste and do not add up; groups "
        "compose as 1 − Π(1 − f), capped by the measured waste; spot composes on the rate axis. "
        "The naive sum is shown to say why adding fractions is wrong. Hover a label for its code "
        "in the recommendations table.</p>"
    )
    return "\n".join(parts)


def _trend_table(cal: pl.DataFrame) -> str:
    """The trend's days as a table; a day the lake lacks says so in every cell."""
    rows = []
    for r in cal.iter_rows(named=True):
        if r["gpu_minutes"] is None:
            rows.append({"date": str(r["date"])} | dict.fromkeys(TREND_COLUMNS[1:], "no data"))
            continue
        rows.append(
            {
                "date": str(r["date"]),
                "gpu_minutes": f"{r['gpu_minutes']:,}",
                "coverage": "n/a" if r["coverage_pct"] is None else _pct_down(r["coverage_pct"]),
                "util": num(r["util"], ".1f"),
                "rfu": num(r["rfu"], ".1f"),
                "waste_usd": NO_PRICE if r["waste_usd"] is None else f"${r['waste_usd']:,.2f}",
            }
        )
    t = pl.DataFrame(rows, schema=dict.fromkeys(TREND_COLUMNS, pl.String))
    return _table(t, list(TREND_COLUMNS))


TREND_COLUMNS = ("date", "gpu_minutes", "coverage", "util", "rfu", "waste_usd")


def _capacity_table(capacity: pl.DataFrame) -> str:
    return (
        "<p>Fleet capacity per model (TFLOPS, FP16):</p>"
        + _table(
            capacity,
            [
                "gpu_model",
                "gpus",
                "theoretical_tflops",
                "achievable_tflops",
                "realized_tflops",
                "realized_pct_of_achievable",
            ],
            {
                c: (lambda v: num(v, ",.0f"))
                for c in ("theoretical_tflops", "achievable_tflops", "realized_tflops")
            }
            | {"realized_pct_of_achievable": lambda v: num(v, ".1f", unit=" %")},
        )
        + "<p class='note'>Theoretical: the datasheet's peak; achievable: what real kernels "
        "reach (the catalog); realized: achievable × PIF, averaged over the day's GPU-minutes. "
        "Realized / achievable is the model's RFU.</p>"
    )


def _persistent_table(pb: pl.DataFrame, daily: pl.DataFrame, t: Thresholds) -> str:
    """Persistent bottlenecks, each saying what it did on this day: a GPU flagged from the days
    before may have sent no data today."""
    if pb.height == 0:
        return ""
    today = daily.filter(pl.col("gpu_instance_id").is_null()).select(
        "gpu_uuid", pl.col("minutes").alias("_minutes"), pl.col("bottlenecked_day").alias("_b")
    )
    p = pb.join(today, on="gpu_uuid", how="left").with_columns(
        pl.when(pl.col("_minutes").is_null())
        .then(pl.lit("not seen: no data this day"))
        .when(pl.col("_b"))
        .then(pl.lit("bottlenecked"))
        .otherwise(pl.lit("seen, not bottlenecked"))
        .alias("on_day")
    )
    unseen = p.filter(pl.col("_minutes").is_null()).height
    note = (
        f" {unseen} of these {plural(p.height, 'GPU')} sent no data on this day: they are flagged "
        "from the days before it."
        if unseen
        else ""
    )
    return (
        f"<p>Persistent bottlenecks (≥ {t.persistent_min_days} of the last {t.window_days} "
        f"days).{note}</p>"
        + _table(
            p,
            [
                "gpu_uuid",
                "hostname",
                "namespace",
                "gpu_model",
                "days_bottlenecked",
                "bottleneck_share",
                "on_day",
            ],
            {"bottleneck_share": lambda v: f"{100 * v:.0f} %"},
        )
    )


def _namespaces(nse: pl.DataFrame) -> str:
    """The namespaces, money first: at 700 px the table scrolls, and cost and waste stay in
    view."""
    pct = lambda v: f"{v:.1f}"  # noqa: E731
    dollars = lambda v: f"${v:,.2f}"  # noqa: E731
    return "<h2>Namespaces</h2>" + _table(
        nse,
        [
            "namespace",
            "cost_usd",
            "waste_usd",
            "energy_usd",
            "gpus",
            "gpu_hours",
            "avg_gpu_util_pct",
            "avg_rfu_pct",
            "pct_idle",
            "pct_active_bottlenecked",
            "dominant_diagnosis",
            "energy_kwh",
            "idle_energy_kwh",
            "co2_kg",
        ],
        dict.fromkeys(
            (
                "gpu_hours",
                "avg_gpu_util_pct",
                "avg_rfu_pct",
                "pct_idle",
                "pct_active_bottlenecked",
                "energy_kwh",
                "idle_energy_kwh",
                "co2_kg",
            ),
            pct,
        )
        | dict.fromkeys(("cost_usd", "waste_usd", "energy_usd"), dollars),
        # a namespace on models without a price has no cost; one without power readings
        # no energy (the mart's null)
        dict.fromkeys(("cost_usd", "waste_usd"), NO_PRICE)
        | dict.fromkeys(
            # no active minute: no bottleneck share, no diagnosis
            ("avg_gpu_util_pct", "avg_rfu_pct", "pct_active_bottlenecked", "dominant_diagnosis"),
            "n/a",
        )
        | dict.fromkeys(("energy_kwh", "idle_energy_kwh", "energy_usd", "co2_kg"), NO_POWER),
        codes={"dominant_diagnosis": DIAGNOSES},
        cls="namespaces",
    )


def _health(health: pl.DataFrame, rules: Rules) -> str:
    h = rules.health
    bad = health.filter(pl.col("status") != "ok")
    out = (
        f"<h2>Health</h2><p>{health.height - bad.height} of {plural(health.height, 'GPU')} ok. "
        f"A GPU warns after {plural(h.hot_warn_minutes, 'minute')} of the day at or above "
        f"{h.hot_from_c:g} °C, or on an XID error; drain it on a double-bit ECC error or a failed "
        "row remap.</p>"
    )
    # hot, but not for long enough to warn: counted, not listed (a minute's spike is no alert)
    warm = health.filter(pl.col("status") == "ok", pl.col("hot_minutes") > 0)
    if warm.height:
        most = int(warm["hot_minutes"].max())
        out += (
            f"<p class='note'>{warm.height:,} of the ok GPUs spent up to "
            f"{plural(most, 'minute')} at or above {h.hot_from_c:g} °C: below the "
            f"{h.hot_warn_minutes} that warn (rule health.hot_warn_minutes).</p>"
        )
    if bad.height:
        out += _table(bad, ["gpu_uuid", "hostname", "status", "reasons"])
    return out


def _stragglers(strag: pl.DataFrame) -> str:
    one = lambda v: f"{v:.1f}"  # noqa: E731
    return "<h2>Stragglers</h2>" + _table(
        strag.head(50),
        [
            "hour",
            "pod",
            "gpu_uuid",
            "rule",
            "metric",
            "value",
            "pod_median",
            "points_below",
            "pod_stddev",
        ],
        dict.fromkeys(("value", "pod_median", "points_below", "pod_stddev"), one),
        codes={"rule": STRAGGLER_RULES, "metric": METRICS},
    )


def dollars_appendix(m: pl.DataFrame, f: InForce) -> str:
    """The appendix a reader checks the dollars against: the price book entries of the day's
    models (file, line, source; `reference.prices_used`), the energy rates of its clusters and
    the rules in force, each changed rule beside its default."""
    from gpu_pipeline.lib.reference import (
        DEFAULT_ENERGY,
        DEFAULT_PRICES,
        ReferenceError,
        energy_rates,
        load_energy,
        prices_used,
    )

    def where(path: str | None, default) -> str:
        if path:
            return f"your file <code>{html.escape(str(path))}</code>"
        return f"the shipped default <code>gpu_pipeline/reference/{default.name}</code>"

    parts = [
        "<h2>Appendix: where the dollars come from</h2><p>A GPU-minute costs its model's "
        "on-demand price per GPU-hour ÷ 60; waste and savings are shares of that cost, energy is "
        "kWh × the cluster's rate; a month is 30 days.</p>"
    ]
    if not f.told:
        parts.append(
            "<p class='caveat'>The report was not told which price book, energy rates and rules "
            "the day was computed with: below are the shipped ones and the default rules (with "
            "the class boundaries it was given). The $/GPU-hour column is what the day's "
            "minutes carry, whatever the book.</p>"
        )
    try:
        used = prices_used(m, f.prices)
    except ReferenceError as e:
        parts.append(f"<p class='caveat'>The price book cannot be read: {html.escape(str(e))}</p>")
    else:
        money = lambda v: f"${v:,.2f}"  # noqa: E731
        parts.append(
            f"<h3>Price book entries used</h3><p>From {where(f.prices, DEFAULT_PRICES)} (line: "
            "its row there).</p>"
            + _table(
                used,
                ["gpu_model", "gpu_hours", "usd_per_hour", "spot_usd_per_hour", "source", "line"],
                {"gpu_hours": lambda v: f"{v:,.1f}", "usd_per_hour": money}
                | {"spot_usd_per_hour": money},
                {
                    "usd_per_hour": "no price (not in the price book)",
                    "spot_usd_per_hour": "none",
                    "source": "not in the price book",
                    "line": "–",
                    "gpu_model": "(no model)",
                },
                heads={
                    "usd_per_hour": "on-demand $/GPU-hour",
                    "spot_usd_per_hour": "spot $/GPU-hour",
                    "line": "line",
                },
                cls="appendix",
            )
        )
        for r in used.filter(~pl.col("matches")).iter_rows(named=True):
            book = num(r["on_demand_usd_per_hour"], ",.2f", "no price")
            parts.append(
                f"<p class='caveat'>{html.escape(_label(r['gpu_model'], 200, '(no model)'))}: the "
                f"day's minutes were priced at {num(r['usd_per_hour'], ',.2f', 'no price')} $/h, "
                f"the price book above says {book} $/h: the day was computed with another price "
                "book; materialize it again to price it with this one.</p>"
            )
    try:
        energy = load_energy(f.energy)
    except ReferenceError as e:
        parts.append(
            f"<p class='caveat'>The energy rates cannot be read: {html.escape(str(e))}</p>"
        )
    else:
        usd, co2 = energy_rates(energy, pl.col("cluster"))
        own = energy.filter(pl.col("cluster") != "*")["cluster"].implode()
        rates = (
            m.select(pl.col("cluster").unique())
            .with_columns(
                usd.alias("usd_per_kwh"),
                co2.alias("co2_g_per_kwh"),
                pl.when(pl.col("cluster").is_in(own))
                .then(pl.lit("its own row"))
                .otherwise(pl.lit("the * row (every other cluster)"))
                .alias("row"),
            )
            .sort("cluster", nulls_last=True)
        )
        parts.append(
            f"<h3>Energy rates</h3><p>From {where(f.energy, DEFAULT_ENERGY)}.</p>"
            + _table(
                rates,
                ["cluster", "usd_per_kwh", "co2_g_per_kwh", "row"],
                {"usd_per_kwh": lambda v: f"${v:,.3f}", "co2_g_per_kwh": lambda v: f"{v:,.0f}"},
                {"cluster": "(no cluster)", "usd_per_kwh": "none", "co2_g_per_kwh": "none"},
                heads={"usd_per_kwh": "$/kWh", "co2_g_per_kwh": "g CO₂/kWh", "row": "rate from"},
                cls="appendix",
            )
        )
    flat, default = f.rules.flat(), RULES.flat()
    changed = [k for k in flat if flat[k] != default[k]]
    src = (
        f"From the rules file <code>{html.escape(f.rules_file)}</code>"
        if f.rules_file
        else "No rules file: the defaults"
    )
    items, section = [], ""
    for k, v in flat.items():
        sec, _, key = k.partition(".")
        if sec != section:  # the rules file's [section] headers, keys without the prefix
            items.append(f"<li class='sec'><b>[{html.escape(sec)}]</b></li>")
            section = sec
        was = f" <b>(default {default[k]:g})</b>" if k in changed else ""
        items.append(f"<li><code>{html.escape(key)}</code> = {v:g}{was}</li>")
    parts.append(
        f"<h3>Rules in force</h3><p>{src}; {plural(len(changed), 'rule')} changed from the "
        f"defaults (config/rules.example.toml lists each with what it does).</p>"
        f"<ul class='rules'>{''.join(items)}</ul>"
    )
    return "\n".join(parts)
