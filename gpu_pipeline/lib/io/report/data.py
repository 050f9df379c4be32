"""The report's data: the day's marts read from the lake, and pure functions from them to plain
values and frames. No HTML, no matplotlib: `charts` draws from these, `view` words them, the
template lays them out.

The fleet's figures (GPUs, GPU-hours, utilization, RFU, gap, phase shares, bottlenecked share,
coverage) are `fleet_daily`'s row of the day, its hour-by-hour series `hourly_fleet_metrics`' and
its 7-day trend `fleet_daily`'s of those days: each computed once, in the staging pass with the
rules in force, and never again here.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from datetime import date, timedelta

import polars as pl

from gpu_pipeline.lib.display import NO_PRICE
from gpu_pipeline.lib.io.lake import DamagedPartition, Lake
from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
from gpu_pipeline.lib.marts.namespace_monthly import month_days, month_to_date, rfu_sums
from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.rules import DAYS_PER_MONTH, DEFAULT, RULES, Rules, Thresholds
from gpu_pipeline.lib.samples import MINUTES_PER_DAY, collect_stable, ratio
from gpu_pipeline.lib.schemas import TABLES
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks

TREND_DAYS = 7
# the overlap group of actions that change the price of a GPU-hour, not how the GPUs are used
RATE_GROUP = "rate"


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


def pct_down(v: float) -> str:
    """A coverage, rounded down: 99.97 % of a day is not 100.0 % (and 95.1 stored as
    95.09999… is still 95.1)."""
    return f"{math.floor(v * 10 + 1e-9) / 10:.1f} %"


def label(v: object, n: int = 40, none: str = "(none)") -> str:
    """A label from the data, for a chart or a sentence: never None, never longer than `n`
    characters (a label from the data can be anything, and a megabyte of text overflows the
    font rasterizer)."""
    s = none if v is None else str(v)
    return s if len(s) <= n else s[: n - 1] + "…"


def money_period(fleet: dict, t: Thresholds = DEFAULT) -> Period:
    """Monthly figures for a day observed enough to stand for a month, with what they assume;
    the observed day's dollars below `t.coverage_month_from` % coverage. `fleet`: the day's
    `fleet_daily` row."""
    observed, expected = fleet["observed_gpu_minutes"], fleet["expected_gpu_minutes"]
    c = fleet["coverage_pct"]
    if c is None or not expected or observed >= expected:
        return Period(True, "A month is 30 days like this one: the day's dollars × 30.")
    seen = f"{pct_down(c)} of the day's GPU-minutes ({observed:,} of {expected:,})"
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


# --- reading the lake ----------------------------------------------------------------------------


def read(lake: Lake, table: str, day: date) -> pl.DataFrame:
    """The day's partition of `table`, or no rows (with the table's columns)."""
    return lake.read(table, day) if lake.exists(table, day) else pl.DataFrame(schema=TABLES[table])


def read_if(lake: Lake, table: str, day: date) -> pl.DataFrame | None:
    """The day's partition of `table`, or None when the lake has none (its section is left out)."""
    return lake.read(table, day) if lake.exists(table, day) else None


@dataclass
class Marts:
    """The day's tables the report reads; None: the lake has no partition of it."""

    # what the report shows of the day's physical GPU-minutes (a MIG instance is part of its
    # GPU), read a chunk of GPUs at a time: never the day's minutes at once
    gpus: pl.DataFrame  # `gpu_figures`: one row per physical GPU (with its model and cluster)
    points: pl.DataFrame  # `scatter_points`: the minutes the scatter draws
    minutes: pl.LazyFrame  # the day's physical GPU-minutes, to read in chunks
    daily: pl.DataFrame
    waste: pl.DataFrame  # priced_waste (empty when the lake has no partition: `priced`)
    persistent: pl.DataFrame
    fleet: pl.DataFrame  # fleet_daily: one row
    hourly: pl.DataFrame
    rec: pl.DataFrame | None
    roi: pl.DataFrame | None
    health: pl.DataFrame | None
    stragglers: pl.DataFrame | None
    namespaces: pl.DataFrame | None
    workloads: pl.DataFrame | None
    priced: bool = True  # the lake has the day's priced_waste partition


PHYSICAL_MINUTE = pl.col("gpu_instance_id").is_null()
# the scatter draws at most this many GPU-minutes: more points only blur the chart and grow the
# page
SCATTER_POINTS = 20_000


def gpu_figures(
    minutes: pl.LazyFrame | pl.DataFrame, chunking: Chunking = DEFAULT_CHUNKING
) -> pl.DataFrame:
    """Per physical GPU of the day (its model and cluster): its minutes, the sums and counts of
    its utilization, RFU and realized TFLOPS, its highest achievable TFLOPS and how many of its
    minutes the scatter can draw (PIF and utilization both known). Read a chunk of GPUs at a
    time (`by_gpu_chunks`): the report's per-model figures are these rows added up."""
    drawable = pl.col("pif").is_not_null() & pl.col("gpu_util_pct").is_not_null()
    both = pl.col("rfu_pct").is_not_null() & pl.col("gpu_util_pct").is_not_null()
    return by_gpu_chunks(
        minutes.lazy(),
        lambda m: (
            m.filter(PHYSICAL_MINUTE)
            .group_by("gpu_model", "cluster", "gpu_uuid", maintain_order=True)
            .agg(
                pl.len().alias("minutes"),
                *[pl.col(c).sum().alias(f"_sum_{c}") for c in MODEL_MEANS],
                *[pl.col(c).count().alias(f"_n_{c}") for c in MODEL_MEANS],
                pl.col("achievable_tflops").max(),
                drawable.sum().alias("points"),
                # the gap's minutes (utilization and RFU both): `fleet_minutes`
                both.sum().alias("_n_both"),
                *[pl.col(c).filter(both).sum().alias(f"_both_{c}") for c in BOTH_MEANS],
            )
        ),
        chunking,
    )


# the means over a model's GPU-minutes the report shows
MODEL_MEANS = ("gpu_util_pct", "rfu_pct", "realized_tflops")
BOTH_MEANS = ("gpu_util_pct", "rfu_pct")


def fleet_minutes(gpus: pl.DataFrame) -> dict | None:
    """Which physical GPU-minutes the fleet's averages (fleet_daily's) are over, from the GPUs'
    `gpu_figures`: `observed`, those with a utilization (`util`), an RFU (`rfu`) and both
    (`both`, the gap's), with utilization and RFU over `both` (`util_pct`, `rfu_pct`, None
    without such a minute). None without any minute. RFU needs a power reading and a max power
    (a model not in the catalog that reports no power limit has none): utilization, RFU and the
    gap may then be over different minutes, and the report says so."""
    if not gpus.height or "_n_both" not in gpus.columns:
        return None
    t = gpus.select(
        pl.col("minutes", "_n_gpu_util_pct", "_n_rfu_pct", "_n_both", "_both_gpu_util_pct")
        .sum()
        .cast(pl.Float64),
        pl.col("_both_rfu_pct").sum().cast(pl.Float64),
    ).row(0, named=True)
    n = int(t["_n_both"])
    return {
        "observed": int(t["minutes"]),
        "util": int(t["_n_gpu_util_pct"]),
        "rfu": int(t["_n_rfu_pct"]),
        "both": n,
        "util_pct": t["_both_gpu_util_pct"] / n if n else None,
        "rfu_pct": t["_both_rfu_pct"] / n if n else None,
    }


def model_figures(gpus: pl.DataFrame) -> pl.DataFrame:
    """Per model, from its GPUs' `gpu_figures`: its GPUs, the mean utilization, RFU and realized
    TFLOPS over its GPU-minutes (null: none has it) and its highest achievable TFLOPS."""
    return collect_stable(
        gpus.lazy()
        .group_by("gpu_model")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            *[
                ratio(pl.col(f"_sum_{c}").sum(), pl.col(f"_n_{c}").sum()).alias(c)
                for c in MODEL_MEANS
            ],
            pl.col("achievable_tflops").max(),
        )
        .sort("gpu_model", nulls_last=True)
    )


def scatter_points(
    minutes: pl.LazyFrame | pl.DataFrame, total: int, chunking: Chunking = DEFAULT_CHUNKING
) -> pl.DataFrame:
    """The physical GPU-minutes the scatter draws (utilization, PIF, class): all `total` of
    them with both PIF and utilization, or about SCATTER_POINTS of them drawn at random when
    there are more (each minute by a hash of its GPU and time, so the same minutes whatever
    the chunking), read a chunk of GPUs at a time."""
    drawable = PHYSICAL_MINUTE & pl.col("pif").is_not_null() & pl.col("gpu_util_pct").is_not_null()
    if total > SCATTER_POINTS:
        drawable &= pl.struct("gpu_uuid", "minute").hash(seed=0) % total < SCATTER_POINTS
    columns = ["gpu_util_pct", "pif", "efficiency_class"]
    # the GPU as a key of its chunk: by_gpu_chunks cuts the day by GPU
    return by_gpu_chunks(
        minutes.lazy(),
        lambda m: m.filter(drawable).select("gpu_uuid", *columns),
        chunking,
    ).select(columns)


def read_marts(lake: Lake, day: date, t: Thresholds = DEFAULT) -> Marts:
    minutes = (
        lake.scan_days("gpu_minutes", [day])
        if lake.exists("gpu_minutes", day)
        else pl.LazyFrame(schema=TABLES["gpu_minutes"])
    ).filter(PHYSICAL_MINUTE)
    gpus = gpu_figures(minutes)
    return Marts(
        gpus=gpus,
        points=scatter_points(minutes, int(gpus["points"].sum())),
        minutes=minutes,
        daily=read(lake, "gpu_daily", day),
        waste=read(lake, "priced_waste", day),
        persistent=read(lake, "persistent_bottlenecks", day),
        fleet=fleet_row(lake, day, minutes, t),
        hourly=read(lake, "hourly_fleet_metrics", day),
        rec=read_if(lake, "recommendations", day),
        roi=read_if(lake, "efficiency_roi", day),
        health=read_if(lake, "gpu_health", day),
        stragglers=read_if(lake, "stragglers", day),
        namespaces=read_if(lake, "namespace_efficiency", day),
        workloads=read_if(lake, "workload_efficiency", day),
        priced=lake.exists("priced_waste", day),
    )


def fleet_row(
    lake: Lake, day: date, minutes: pl.LazyFrame, t: Thresholds = DEFAULT
) -> pl.DataFrame:
    """The day's `fleet_daily` row. A lake materialized before `fleet_daily` existed has none:
    then the mart's own function makes it from the day's GPU-minutes (the same definition, not
    another one), until the day is materialized again."""
    if lake.exists("fleet_daily", day):
        f = lake.read("fleet_daily", day)
        if f.height:
            return f.head(1)
    from gpu_pipeline.lib.staging.minute_runs import minute_runs

    return collect_stable(fleet_daily(minute_runs(collect_stable(minutes).lazy(), t)))


def fleet_figures(fleet: pl.DataFrame) -> dict:
    """The `fleet_daily` row as a dict (its columns' names)."""
    return fleet.row(0, named=True)


@dataclass
class ReportData:
    """Everything the report shows of a day with GPU-minutes, before it is drawn or worded."""

    day: date
    t: Thresholds
    marts: Marts
    fleet: dict  # the day's fleet_daily row
    period: Period
    hourly: pl.DataFrame  # hourly_series
    trend: pl.DataFrame  # trend_calendar of trend_days
    capacity: pl.DataFrame
    month: MonthToDate | None = None  # the month's days up to the day, per namespace


def report_data(
    lake: Lake, day: date, t: Thresholds = DEFAULT, catalog: pl.DataFrame | None = None
) -> ReportData | None:
    """The day's report data; None when the day has no GPU-minutes."""
    marts = read_marts(lake, day, t)
    if marts.gpus.height == 0:
        return None
    if catalog is None:
        from gpu_pipeline.lib.reference import load_catalog

        catalog = load_catalog()
    fleet = fleet_figures(marts.fleet)
    return ReportData(
        day=day,
        t=t,
        marts=marts,
        fleet=fleet,
        period=money_period(fleet, t),
        hourly=hourly_series(marts.hourly),
        trend=trend_calendar(trend_days(lake, day, marts.fleet), day),
        capacity=fleet_capacity(marts.gpus, catalog),
        month=namespaces_month_to_date(lake, day),
    )


@dataclass
class MonthToDate:
    """The month of a day up to it: its first day, the days of it in the lake, per namespace."""

    first: date
    days: list[date]
    namespaces: pl.DataFrame


def namespaces_month_to_date(lake: Lake, day: date) -> MonthToDate | None:
    """The day's month from its first day to the day, per namespace (namespace_efficiency of
    the days the lake holds, with the unmeasured dollars of their priced_waste; None without
    any). The report says how many days that is: a backfill may not have written the month's
    earlier days yet."""
    days = [d for d in month_days(day) if d <= day and lake.exists("namespace_efficiency", d)]
    if not days:
        return None
    frame = lake.read_days("namespace_efficiency", days).lazy()
    # the cost no reading could split (`unmeasured_usd`, a MIG tenant's): the table says so, as
    # the day's namespaces table does, not $0.00 of waste
    priced = lake.read_days("priced_waste", days).lazy()
    # the RFU's weight (the GPU-hours that have one) is in no daily mart: from the minutes
    rfu = collect_stable(rfu_sums(lake.scan_days("gpu_minutes", days)))
    month = month_to_date(frame, priced, rfu=rfu.lazy())
    return MonthToDate(month_days(day)[0], days, collect_stable(month))


# --- the fleet over the day and over the week ----------------------------------------------------


def _minute_weighted(c: str) -> pl.Expr:
    """An hourly mean column of hourly_fleet_metrics over several of its rows: weighted by their
    GPU-minutes, rows without it left out; null when none has it."""
    has = pl.col(c).is_not_null()
    weight = pl.col("gpu_minutes").filter(has).sum()
    return pl.when(weight > 0).then((pl.col(c) * pl.col("gpu_minutes")).filter(has).sum() / weight)


def hourly_series(hourly: pl.DataFrame) -> pl.DataFrame:
    """The fleet hour by hour (hour of day 0-23): utilization, RFU and PIF (hourly_fleet_metrics'
    means over its clusters and models, weighted by their GPU-minutes) and the fleet's realized
    TFLOPS (the mean of a GPU-minute x GPU-minutes / 60: what the fleet realized on average over
    the hour, minutes without a PIF counted at their group's mean)."""
    realized = pl.col("avg_realized_tflops")
    return (
        hourly.group_by(pl.col("hour").dt.hour().cast(pl.Int32).alias("hour"))
        .agg(
            _minute_weighted("avg_gpu_util_pct").alias("util"),
            _minute_weighted("avg_rfu_pct").alias("rfu"),
            _minute_weighted("avg_pif").alias("pif"),
            # null, not 0, for an hour without any (no PIF): nothing is drawn there
            pl.when(realized.count() > 0)
            .then((realized * pl.col("gpu_minutes")).sum() / 60)
            .alias("realized_tflops"),
        )
        .sort("hour")
    )


TREND_SCHEMA = {
    "date": pl.Date,
    "gpu_minutes": pl.Int64,
    "util": pl.Float64,
    "rfu": pl.Float64,
    "waste_usd": pl.Float64,
    "coverage_pct": pl.Float64,
}


def trend_days(
    lake: Lake, day: date, fleet: pl.DataFrame | None = None, days: int = TREND_DAYS
) -> pl.DataFrame:
    """Per day of D-(days-1)..D with a `fleet_daily` row: its GPU-minutes, utilization, RFU and
    coverage (`fleet_daily`'s) and the dollars of waste (`priced_waste`'s). `fleet`: the report
    day's row when the report has it already (the figures at its top)."""
    rows = []
    for d in [day - timedelta(days=i) for i in range(days - 1, -1, -1)]:
        try:
            row = _trend_row(lake, d, fleet if d == day else None)
        except (OSError, pl.exceptions.PolarsError, DamagedPartition, KeyError) as e:
            if d == day:
                raise
            # another day's damaged partition leaves a gap in the trend, not a failed report
            # (a truncated fleet_daily of the day before failed it: adversarial review)
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"warning: report of {day}: the trend leaves out {d} ({why})", file=sys.stderr)
            continue
        if row is not None:
            rows.append(row)
    return pl.DataFrame(rows, schema=TREND_SCHEMA)


def _trend_row(lake: Lake, d: date, fleet: pl.DataFrame | None) -> dict | None:
    """Day `d`'s figures in the trend (`trend_days`), None when the lake has no fleet_daily row
    for it. `fleet`: its row when the report has it already."""
    f = fleet if fleet is not None else read(lake, "fleet_daily", d)
    if f.height == 0:
        return None
    r = f.row(0, named=True)
    waste = read(lake, "priced_waste", d).select(priced_total("total_waste_usd")).item()
    return {
        "date": d,
        "gpu_minutes": r["observed_gpu_minutes"],
        "util": r["avg_gpu_util_pct"],
        "rfu": r["avg_rfu_pct"],
        "waste_usd": waste,
        "coverage_pct": r["coverage_pct"],
    }


def fleet_trend(lake: Lake, day: date, days: int = TREND_DAYS) -> pl.DataFrame:
    """Per day of D-(days-1)..D that the lake holds: GPU-minutes, utilization and RFU (the day's
    `fleet_daily`: physical GPUs) and the dollars of waste."""
    return trend_days(lake, day, days=days).drop("coverage_pct")


def trend_calendar(trend: pl.DataFrame, day: date) -> pl.DataFrame:
    """The trend (`trend_days`) with every calendar day from the first it holds to `day`: a day
    the lake lacks is a row without GPU-minutes (a gap, never drawn beside its neighbours as if
    adjacent)."""
    if trend.height == 0:
        return trend
    days = pl.date_range(trend["date"].min(), day, "1d", eager=True).alias("date")
    return pl.DataFrame(days).join(trend, on="date", how="left")


def fleet_capacity(gpus: pl.DataFrame, catalog: pl.DataFrame) -> pl.DataFrame:
    """Per model (physical GPUs, from their `gpu_figures`): what the fleet could do on paper
    (theoretical FP16 TFLOPS), what it can achieve (the catalog's achievable TFLOPS), and what
    it realized on average over the day's GPU-minutes (realized TFLOPS = achievable x PIF)."""
    from gpu_pipeline.lib.reference import model_key

    cat = catalog.select("model_key", pl.col("theoretical_fp16_tflops").alias("_theoretical"))
    return (
        model_figures(gpus)
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(cat, on="model_key", how="left")
        .select(
            "gpu_model",
            "gpus",
            (pl.col("gpus") * pl.col("_theoretical")).alias("theoretical_tflops"),
            (pl.col("gpus") * pl.col("achievable_tflops")).alias("achievable_tflops"),
            (pl.col("gpus") * pl.col("realized_tflops")).alias("realized_tflops"),
        )
        .with_columns(
            (100.0 * pl.col("realized_tflops") / pl.col("achievable_tflops")).alias(
                "realized_pct_of_achievable"
            )
        )
        .sort("gpu_model", nulls_last=True)
    )


# --- what to do ----------------------------------------------------------------------------------


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


def recommendation_details(rec: pl.DataFrame) -> pl.DataFrame:
    """The recommendations most savings first, and one row per action (namespaces without
    any left out)."""
    return (
        rec.sort(["monthly_savings_usd", "namespace"], descending=[True, False], nulls_last=True)
        .explode("action_details")
        .unnest("action_details")
        .drop_nulls("action")
    )


# --- bottlenecks, coverage, health ---------------------------------------------------------------


def bottlenecked_namespaces(daily: pl.DataFrame) -> pl.DataFrame:
    """Namespaces with bottlenecked GPU-days: their GPUs and bottlenecked minutes, most first."""
    return (
        daily.filter(pl.col("bottlenecked_day"))
        .group_by("namespace")
        .agg(pl.len().alias("gpus"), pl.col("bottlenecked_minutes").sum())
        .sort("bottlenecked_minutes", descending=True)
    )


def persistent_on_day(pb: pl.DataFrame, daily: pl.DataFrame) -> pl.DataFrame:
    """Persistent bottlenecks, each with what it did on this day (`on_day`, `seen`): a GPU
    flagged from the days before may have sent no data today."""
    today = daily.filter(pl.col("gpu_instance_id").is_null()).select(
        "gpu_uuid", pl.col("minutes").alias("_minutes"), pl.col("bottlenecked_day").alias("_b")
    )
    return pb.join(today, on="gpu_uuid", how="left").with_columns(
        pl.col("_minutes").is_not_null().alias("seen"),
        pl.when(pl.col("_minutes").is_null())
        .then(pl.lit("not seen: no data this day"))
        .when(pl.col("_b"))
        .then(pl.lit("bottlenecked"))
        .otherwise(pl.lit("seen, not bottlenecked"))
        .alias("on_day"),
    )


def coverage_gaps(daily: pl.DataFrame) -> pl.DataFrame:
    """The physical GPUs with fewer than 1,440 minutes, least covered first (by minutes, not
    coverage_pct: a gpu_daily written before that column existed has them)."""
    return daily.filter(
        pl.col("gpu_instance_id").is_null(), pl.col("minutes") < MINUTES_PER_DAY
    ).sort("minutes", "gpu_uuid")


def money(waste: pl.DataFrame) -> tuple[float | None, float | None]:
    """The day's cost and waste in dollars; None when nothing was priced."""
    return waste.select(priced_total("cost_usd"), priced_total("total_waste_usd")).row(0)


def unpriced_hours(waste: pl.DataFrame) -> tuple[float, float] | None:
    """(GPU-hours without a price, all GPU-hours) of the day's priced_waste: the part of a model
    the price book lacks, whose cost and waste are unknown; None when every hour has a price."""
    if not waste.height:
        return None
    u, h = waste.select(
        pl.col("gpu_hours").filter(pl.col("cost_usd").is_null()).sum().alias("unpriced"),
        pl.col("gpu_hours").sum(),
    ).row(0)
    return (u, h) if u else None


def energy(namespaces: pl.DataFrame | None) -> dict | None:
    """The day's energy (kWh, $, idle kWh, CO2 kg) summed over namespaces; None when the lake
    has no namespace_efficiency, `powered` False when no namespace has a power reading (its
    energy is unknown, not 0 kWh)."""
    if namespaces is None or not namespaces.height or "energy_kwh" not in namespaces.columns:
        return None
    cols = ("energy_kwh", "idle_energy_kwh", "energy_usd", "co2_kg")
    e = namespaces.select(pl.col(*cols).sum()).row(0, named=True)
    return e | {"powered": bool(namespaces.get_column("energy_kwh").is_not_null().any())}


def ingest_of_day(lake: Lake, day: date) -> dict:
    """What a day without GPU-minutes had: records read, files, rejected and duplicate records,
    and the most common reasons of the rejected ones (`reasons`: reason, len)."""
    log = read(lake, "ingest_log", day)
    if not log.height or int(log.get_column("rows_read").sum()) == 0:
        return {"read": 0}
    q = read(lake, "quarantine", day)
    reasons = (
        q.group_by("reason").len().sort("len", descending=True).head(5)
        if q.height
        else pl.DataFrame(schema={"reason": pl.String, "len": pl.UInt32})
    )
    return {
        "read": int(log.get_column("rows_read").sum()),
        "files": log.height,
        "rejected": int(log.get_column("rows_quarantined").sum()),
        "duplicate": int(log.get_column("rows_duplicate").sum()),
        "reasons": reasons,
    }


def rules_in_force(rules: Rules) -> list[tuple[str, str, float, float | None]]:
    """Every rule as (section, key, value, its default when it differs, else None), in the
    rules file's order."""
    flat, default = rules.flat(), RULES.flat()
    out = []
    for k, v in flat.items():
        sec, _, key = k.partition(".")
        out.append((sec, key, v, default[k] if v != default[k] else None))
    return out


def energy_rates_of_day(gpus: pl.DataFrame, energy_file: str | None) -> pl.DataFrame:
    """The $/kWh and gCO2/kWh of each cluster of the day's GPUs (`gpu_figures`), and whether it
    is the cluster's own row of the rates or the `*` row (raises ReferenceError: unreadable
    rates)."""
    from gpu_pipeline.lib.reference import energy_rates, load_energy

    rates = load_energy(energy_file)
    usd, co2 = energy_rates(rates, pl.col("cluster"))
    own = rates.filter(pl.col("cluster") != "*")["cluster"].implode()
    return (
        gpus.select(pl.col("cluster").unique())
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
