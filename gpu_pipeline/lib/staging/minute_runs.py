"""gpu_minutes -> minute runs: per GPU and hour, every sum, count, share and cost the minute-level
tables need (one group-by). gpu_daily, hourly_fleet_metrics and priced_waste are computed from
the runs, so a day processed in GPU chunks gives the tables of the day processed at once."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import (
    CLASS_ENUM,
    DEFAULT,
    DIAGNOSIS_ENUM,
    EFFICIENCY_CLASSES,
    PHASE_ENUM,
    PHASES,
    Thresholds,
)

PHYSICAL = pl.col("gpu_instance_id").is_null()


def ratio(num: str, den: str, scale: float = 1.0) -> pl.Expr:
    """num / den, null (not NaN) where nothing was counted."""
    return pl.when(pl.col(den) > 0).then(scale * pl.col(num) / pl.col(den))


# Marts over GPU-minutes are built from minute runs: consecutive minutes of one GPU within one
# hour whose attributes do not change, summed and counted once. Runs add up exactly over
# disjoint sets of GPUs, so a day processed in GPU chunks (gpu_pipeline.lib.staging.chunked) and a day
# processed at once give the same tables; on minutes in the lake's order (GPU, then time) a
# day of 1,440 rows per GPU becomes about 24 runs, and every mart is a small group-by of them.
HOURLY_KEYS = ("date", "hour", "cluster", "gpu_model")


HOURLY_MEANS = {
    "gpu_util_pct": "avg_gpu_util_pct",
    "pif": "avg_pif",
    "rfu_pct": "avg_rfu_pct",
    "efficiency_gap_pct": "avg_efficiency_gap_pct",
    "realized_tflops": "avg_realized_tflops",
}


RUN_KEYS = ("date", "gpu_uuid", "gpu_instance_id", "cluster", "gpu_model", "namespace", "hostname")


WASTE_KEYS = ("date", "cluster", "namespace", "gpu_model")


MONEY = (
    "cost_usd",
    "productive_usd",
    "idle_waste_usd",
    "stall_waste_usd",
    "headroom_waste_usd",
    "unmeasured_usd",
)


def phase_share(columns: list[str], p: str) -> pl.Expr:
    """The minute's share of phase `p`: its sub-minute share where the minutes (`columns`) carry
    one, else 1 or 0 by the minute's own phase."""
    own = (pl.col("phase") == p).cast(pl.Float64)
    if f"phase_share_{p}" in columns:
        return pl.coalesce(pl.col(f"phase_share_{p}"), own)
    return own


def minute_runs(minutes: pl.LazyFrame, t: Thresholds = DEFAULT) -> pl.LazyFrame:
    """Runs of minutes (one GPU, one hour, the same attributes): minutes, sums and non-null
    counts of the averaged metrics, phase/class/active counts, money, highest price.

    Correct in any row order (a run is just a group with one key); rows in GPU-then-time order
    make the runs long and the grouping a pass over contiguous slices.
    """
    hour = pl.col("minute").dt.truncate("1h")
    keys = [pl.col(c) for c in RUN_KEYS] + [hour]
    columns = minutes.collect_schema().names()  # resolved once, not once per phase

    starts = pl.any_horizontal([k.ne_missing(k.shift()) for k in keys])
    return (
        minute_costs(minutes)
        .with_columns(starts.cum_sum().alias("_run"), hour.alias("hour"))
        .with_columns(pl.col("_run").set_sorted())
        .group_by("_run")
        .agg(
            *[pl.col(c).first() for c in (*RUN_KEYS, "hour")],
            pl.col("minute").max().alias("_last_minute"),
            pl.len().alias("_minutes"),
            pl.col("gpu_share").fill_null(1.0).sum().alias("_share"),
            *[pl.col(c).sum().alias(f"_sum_{c}") for c in HOURLY_MEANS],
            *[pl.col(c).count().alias(f"_n_{c}") for c in HOURLY_MEANS],
            *[(pl.col("phase") == p).sum().alias(f"_n_{p}") for p in PHASES],
            pl.col("phase").count().alias("_n_phase"),
            # sub-minute phase shares summed: the hourly phase shares
            *[phase_share(columns, p).sum().alias(f"_sh_{p}") for p in PHASES],
            *[(pl.col("efficiency_class") == c).sum().alias(f"_c_{c}") for c in EFFICIENCY_CLASSES],
            (pl.col("gpu_util_pct") >= t.idle_below).sum().alias("_active"),
            pl.col("price_usd_per_hour").max(),
            pl.col("cost_usd").is_not_null().any().alias("_priced"),
            # energy of the physical GPU (instance rows repeat its power): mean W x 1 min
            (pl.col("power_w") / 60.0).filter(PHYSICAL).sum().alias("_energy_wh"),
            (pl.col("power_w") / 60.0)
            .filter(PHYSICAL & (pl.col("phase") == "idle"))
            .sum()
            .alias("_idle_energy_wh"),
            *[pl.col(c).sum() for c in MONEY],
        )
        .drop("_run")
    )


def mig_unallocated() -> pl.Expr:
    """The physical GPU's row of a MIG GPU with instances: it stands for the free slices only."""
    return PHYSICAL & (pl.col("gpu_share") < 1.0)


def minute_costs(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Split each GPU-minute's price into productive / idle / stall / headroom, nothing twice.

    A row costs price x gpu_share / 60 (a whole GPU: its price; a MIG instance: its slices).
    idle minute -> all idle; otherwise productive = rfu, stall = max(0, util - rfu), headroom = the
    rest. A non-idle minute lacking utilization or power can't be split: `unmeasured`. The free
    slices of a MIG GPU (its physical row) are idle waste of the GPU's owner.
    """
    cost = pl.col("price_usd_per_hour") * pl.col("gpu_share").fill_null(1.0) / 60.0
    # the idle share of the minute: its idle samples (sub-minute phase shares), all of it for the
    # free slices of a MIG GPU; 0 or 1 when the minute's samples share one phase
    idle_share = phase_share(minutes.collect_schema().names(), "idle")
    idle_share = pl.when(mig_unallocated()).then(1.0).otherwise(idle_share).fill_null(0.0)
    measured = pl.col("gpu_util_pct").is_not_null() & pl.col("rfu_pct").is_not_null()
    rfu = pl.col("rfu_pct") / 100.0
    stall = pl.max_horizontal(pl.col("gpu_util_pct") - pl.col("rfu_pct"), pl.lit(0.0)) / 100.0
    busy = 1.0 - idle_share  # what is not idle: productive (RFU) first, then stall, then headroom
    productive = pl.min_horizontal(rfu, busy)
    stalled = pl.min_horizontal(stall, busy - productive)
    split = (idle_share < 1.0) & measured
    return minutes.with_columns(
        cost.alias("cost_usd"),
        pl.when(split).then(cost * productive).otherwise(0.0).alias("productive_usd"),
        (cost * idle_share).fill_null(0.0).alias("idle_waste_usd"),
        pl.when(split).then(cost * stalled).otherwise(0.0).alias("stall_waste_usd"),
        pl.when(split)
        .then(cost * (busy - productive - stalled))
        .otherwise(0.0)
        .alias("headroom_waste_usd"),
        pl.when((idle_share < 1.0) & ~measured)
        .then(cost * busy)
        .otherwise(0.0)
        .alias("unmeasured_usd"),
    )


def allocated_minutes(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes as namespaces own them, with their costs and a weight `_w` (the GPU share).

    A whole GPU's minute weighs 1, a MIG instance's its slices; the physical row of a MIG GPU
    stands for its free slices, idle by definition (no utilization, RFU or diagnosis of its own).
    Means over namespaces are weighted by `_w`, so a MIG GPU counts once however it is split.
    """
    free = mig_unallocated()
    return minute_costs(minutes).with_columns(
        pl.col("gpu_share").fill_null(1.0).alias("_w"),
        pl.when(free).then(0.0).otherwise(pl.col("gpu_util_pct")).alias("gpu_util_pct"),
        *[
            pl.when(free).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("pif", "rfu_pct", "efficiency_gap_pct", "realized_tflops")
        ],
        pl.when(free).then(pl.lit("idle", PHASE_ENUM)).otherwise(pl.col("phase")).alias("phase"),
        pl.when(free)
        .then(pl.lit("idle", CLASS_ENUM))
        .otherwise(pl.col("efficiency_class"))
        .alias("efficiency_class"),
        pl.when(free)
        .then(pl.lit("idle", DIAGNOSIS_ENUM))
        .otherwise(pl.col("diagnosis"))
        .alias("diagnosis"),
    )


def weighted_mean(col: str, w: str = "_w") -> pl.Expr:
    """Mean of `col` weighted by `w` over rows where `col` has a value (null if none)."""
    has = pl.col(col).is_not_null()
    den = pl.col(w).filter(has).sum()
    return pl.when(den > 0).then((pl.col(col) * pl.col(w)).filter(has).sum() / den)


def weighted_share(cond: pl.Expr, among: pl.Expr | None = None, w: str = "_w") -> pl.Expr:
    """Weighted share of rows meeting `cond` among rows meeting `among` (all rows if None)."""
    base = pl.col(w) if among is None else pl.col(w).filter(among)
    num = pl.col(w).filter(cond if among is None else cond & among)
    return pl.when(base.sum() > 0).then(num.sum() / base.sum())
