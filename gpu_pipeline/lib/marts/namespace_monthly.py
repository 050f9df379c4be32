"""The month's days -> `namespace_monthly`: month x cluster x namespace showback (GPU-hours, cost
and its split, energy, RFU, days covered).

GPU-hours and money are the month's `priced_waste` rows summed (so the month adds up to its
days exactly, a MIG GPU counted once as there); `unpriced_gpu_hours` is the part of those
GPU-hours whose model has no price (their money is null, never $0). Energy and RFU per cluster
are not in a daily mart (`namespace_efficiency` has no cluster, nor the weight of its RFU), so
each day's minutes are reduced, a chunk of GPUs at a time, to `namespace_usage` (day x cluster x
namespace: the energy allocated as `namespace_efficiency` allocates it, and the RFU's
GPU-share-weighted sum and weight over the minutes that have one) and those are summed: the
month's RFU is weighted by the GPU-hours that have an RFU, not a mean of daily means. The daily
report's month to date (`month_to_date`) weights its RFU the same way (`rfu_sums`).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable
from datetime import date, datetime, timedelta

import polars as pl

from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.money import MONEY, allocated_kwh, allocated_minutes, with_gpu_energy
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import TABLES, to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks

# a month's label and its partition key in Dagster (`2024-01`)
MONTH_FORMAT = "%Y-%m"
KEYS = ("cluster", "namespace")


def month_start(day: date) -> date:
    return day.replace(day=1)


def month_days(month: date) -> list[date]:
    """Every UTC day of the month `month` is in."""
    first = month_start(month)
    n = calendar.monthrange(first.year, first.month)[1]
    return [first + timedelta(days=i) for i in range(n)]


def parse_month(text: str) -> date:
    """`YYYY-MM` -> the month's first day (ValueError otherwise)."""
    return datetime.strptime(text, MONTH_FORMAT).date()


def namespace_usage(minutes: pl.LazyFrame, chunking: Chunking = DEFAULT_CHUNKING) -> pl.LazyFrame:
    """A day's gpu_minutes -> day x cluster x namespace: `energy_kwh` (the minutes' `energy_wh`
    allocated as namespace_efficiency allocates it; null: none has one),
    and `_rfu_sum` / `_rfu_weight`, the GPU-share-weighted sum of RFU and the weight of the
    minutes that have one (namespace_efficiency's `avg_rfu_pct` is their ratio). Each GPU's
    sums are taken a chunk of GPUs at a time (`by_gpu_chunks`), then added up."""
    has_rfu = pl.col("rfu_pct").is_not_null()
    per_gpu = by_gpu_chunks(
        minutes,
        # only the columns these sums need are read (Polars prunes the rest of the minute's costs)
        lambda m: (
            allocated_minutes(with_gpu_energy(m))
            .group_by("date", *KEYS, "gpu_uuid", maintain_order=True)
            .agg(
                pl.col("_gpu_energy_wh").is_not_null().any().alias("_powered"),
                allocated_kwh().sum().alias("energy_kwh"),
                (pl.col("rfu_pct") * pl.col("_w")).filter(has_rfu).sum().alias("_rfu_sum"),
                pl.col("_w").filter(has_rfu).sum().alias("_rfu_weight"),
            )
        ),
        chunking,
    )
    return (
        per_gpu.lazy()
        .group_by("date", *KEYS)
        .agg(
            pl.when(pl.col("_powered").any()).then(pl.col("energy_kwh").sum()).alias("energy_kwh"),
            pl.col("_rfu_sum", "_rfu_weight").sum(),
        )
    )


def days_usage(days: Iterable[pl.LazyFrame], chunking: Chunking = DEFAULT_CHUNKING) -> pl.LazyFrame:
    """`namespace_usage` of several days' gpu_minutes, a day at a time (`days`: one frame a
    day), concatenated; an empty, typed frame without a day."""
    usage = [collect_stable(namespace_usage(m, chunking)) for m in days]
    if not usage:
        usage = [collect_stable(namespace_usage(pl.LazyFrame(schema=TABLES["gpu_minutes"])))]
    return pl.concat(usage).lazy()


def month_of_days(
    priced: pl.LazyFrame,
    minutes: Iterable[pl.LazyFrame],
    month: date,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.DataFrame:
    """The month's namespace_monthly from its days: their priced_waste, and their gpu_minutes
    one frame a day (`days_usage`). What the monthly asset stores and what `showback` computes
    when the stored month is older than its days: one home for both."""
    return collect_stable(namespace_monthly(priced, days_usage(minutes, chunking), month))


def rfu_sums(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Days' gpu_minutes -> day x cluster x namespace `_rfu_sum` / `_rfu_weight`, as
    `namespace_usage` has them (the minutes allocated as namespaces own them, `_w` their GPU
    share, over the minutes with an RFU) without its energy: the RFU's weight that
    `namespace_efficiency` does not keep, for the report's month to date. One group-by of the
    few columns it reads (~0.05 s for a day of 1,000 GPUs)."""
    has_rfu = pl.col("rfu_pct").is_not_null()
    return (
        allocated_minutes(minutes)
        .filter(has_rfu)
        .group_by("date", *KEYS)
        .agg(
            (pl.col("rfu_pct") * pl.col("_w")).sum().alias("_rfu_sum"),
            pl.col("_w").sum().alias("_rfu_weight"),
        )
    )


def rfu_mean(keys: Iterable[str], usage: pl.LazyFrame) -> pl.LazyFrame:
    """`namespace_usage` rows summed per `keys`: `avg_rfu_pct`, the RFU weighted by the GPU-share
    of the minutes that have one (null where none has), as namespace_efficiency weights it."""
    return (
        usage.group_by(*keys)
        .agg(pl.col("_rfu_sum", "_rfu_weight").sum())
        .with_columns(
            pl.when(pl.col("_rfu_weight") > 0)
            .then(pl.col("_rfu_sum") / pl.col("_rfu_weight"))
            .alias("avg_rfu_pct")
        )
        .drop("_rfu_sum", "_rfu_weight")
    )


def month_money(priced: pl.LazyFrame) -> pl.LazyFrame:
    """A month's priced_waste rows -> per cluster x namespace `days_covered` (the days with
    GPU-hours), `gpu_hours`, `unpriced_gpu_hours` (those of the rows without a price: a model
    the price book lacks) and the money, null (never $0) where nothing was priced."""
    return priced.group_by(*KEYS).agg(
        pl.col("date").n_unique().cast(pl.UInt32).alias("days_covered"),
        pl.col("gpu_hours").sum(),
        pl.col("gpu_hours").filter(pl.col("cost_usd").is_null()).sum().alias("unpriced_gpu_hours"),
        *[priced_total(c) for c in (*MONEY, "total_waste_usd")],
    )


def namespace_monthly(priced: pl.LazyFrame, usage: pl.LazyFrame, month: date) -> pl.LazyFrame:
    """The month's priced_waste rows and its days' `namespace_usage` -> namespace_monthly.

    `days_covered`: the days the cluster x namespace has GPU-hours (for the month to date, of
    the days so far). Money a model without a price leaves null stays null (never $0); the
    GPU-hours it leaves unpriced are `unpriced_gpu_hours`."""
    money = month_money(priced)
    used = (
        usage.group_by(*KEYS)
        .agg(priced_total("energy_kwh"))
        .join(rfu_mean(KEYS, usage), on=list(KEYS), how="left", nulls_equal=True)
    )
    first = month_start(month)
    out = money.join(used, on=list(KEYS), how="left", nulls_equal=True).with_columns(
        pl.lit(first, pl.Date).alias("date"),
        pl.lit(first.strftime(MONTH_FORMAT)).alias("month"),
    )
    return to_contract(out, "namespace_monthly").sort(*KEYS, nulls_last=False)


def month_to_date(
    efficiency: pl.LazyFrame, priced: pl.LazyFrame | None = None, *, rfu: pl.LazyFrame
) -> pl.LazyFrame:
    """The month's days so far of `namespace_efficiency` -> one line per namespace (the daily
    report's month to date, all clusters together): the days with GPU-hours, GPU-hours, cost,
    waste and energy summed. RFU from `rfu`, the same days' `rfu_sums` (or `namespace_usage`):
    weighted by the GPU-hours that have an RFU, as namespace_monthly's (a day's `avg_rfu_pct`
    weighted by its whole `gpu_hours` would count its minutes without a power reading as if
    they had the RFU of the others). `priced`: the same days' priced_waste, whose
    `unmeasured_usd` (the cost no reading could split: a MIG instance's busy minutes) is summed
    beside the waste, as namespace_monthly has it (null without `priced`)."""
    out = (
        efficiency.group_by("namespace")
        .agg(
            pl.col("date").n_unique().cast(pl.UInt32).alias("days_covered"),
            pl.col("gpu_hours").sum(),
            *[priced_total(c) for c in ("cost_usd", "waste_usd", "energy_kwh")],
        )
        .join(rfu_mean(["namespace"], rfu), on="namespace", how="left", nulls_equal=True)
    )
    if priced is None:
        out = out.with_columns(pl.lit(None, pl.Float64).alias("unmeasured_usd"))
    else:
        unmeasured = priced.group_by("namespace").agg(priced_total("unmeasured_usd"))
        out = out.join(unmeasured, on="namespace", how="left", nulls_equal=True)
    return out.sort("cost_usd", "namespace", descending=[True, False], nulls_last=True)
