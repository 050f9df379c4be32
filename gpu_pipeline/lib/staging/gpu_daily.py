"""Minute runs (`staging/minute_runs.py`) -> `gpu_daily`: per GPU-day minute counts by phase and
class, coverage of the day, means, energy, and whether the day was bottlenecked. Pure and lazy."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import (
    DEFAULT,
    EFFICIENCY_CLASSES,
    PHASES,
    Thresholds,
)
from gpu_pipeline.lib.samples import MINUTES_PER_DAY, ratio
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.gpu_minutes import GPU_KEY

DAILY_MEANS = {"gpu_util_pct": "avg_gpu_util_pct", "pif": "avg_pif", "rfu_pct": "avg_rfu_pct"}


def gpu_daily(runs: pl.LazyFrame, t: Thresholds = DEFAULT) -> pl.LazyFrame:
    """Minute runs (`marts.minute_runs`, of one pass or of GPU chunks) -> gpu_daily."""
    d = (
        runs.group_by("date", *GPU_KEY)
        .agg(
            # the last attributes seen, in minute order whatever the row order
            *[
                pl.col(c).sort_by("_last_minute").drop_nulls().last()
                for c in ("hostname", "cluster", "namespace", "gpu_model")
            ],
            pl.col("_minutes").sum().alias("minutes"),
            pl.col("_active").sum().alias("active_minutes"),
            pl.col("_c_bottlenecked").sum().alias("bottlenecked_minutes"),
            *[pl.col(f"_n_{p}").sum().alias(f"{p}_minutes") for p in PHASES],
            *[pl.col(f"_c_{c}").sum().alias(f"class_{c}_minutes") for c in EFFICIENCY_CLASSES],
            pl.col(*[f"_{x}_{c}" for c in DAILY_MEANS for x in ("sum", "n")]).sum(),
            pl.col("_energy_wh", "_idle_energy_wh").sum(),
        )
        .with_columns(
            # the physical GPU's row carries the GPU's energy; a MIG instance's is its share of it
            *[
                pl.when(pl.col("gpu_instance_id").is_null())
                .then(pl.col(f"_{c}_wh") / 1000.0)
                .alias(f"{c}_kwh")
                for c in ("energy", "idle_energy")
            ],
            *[ratio(f"_sum_{c}", f"_n_{c}").alias(name) for c, name in DAILY_MEANS.items()],
            # how much of the UTC day the GPU's (or MIG instance's) data covers
            (100.0 * pl.col("minutes") / MINUTES_PER_DAY).alias("coverage_pct"),
            (
                (pl.col("active_minutes") >= t.day_min_active_minutes)
                & (
                    pl.col("bottlenecked_minutes")
                    >= t.day_min_bottleneck_share * pl.col("active_minutes")
                )
            ).alias("bottlenecked_day"),
        )
    )
    return to_contract(d, "gpu_daily").sort("gpu_uuid", "gpu_instance_id", nulls_last=False)
