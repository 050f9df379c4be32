"""Minute runs -> `fleet_daily`: one row per day for the whole fleet, with its data coverage.
Pure and lazy; definitions in docs/metrics.md.

Fleet totals count each physical GPU once: the physical GPU's rows only (under MIG they carry
the slice-weighted utilization of the instances and the GPU's power), as hourly_fleet_metrics.
"""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import PHASES
from gpu_pipeline.lib.samples import MINUTES_PER_DAY, PHYSICAL, ratio
from gpu_pipeline.lib.schemas import to_contract

FLEET_MEANS = {
    "gpu_util_pct": "avg_gpu_util_pct",
    "rfu_pct": "avg_rfu_pct",
    "efficiency_gap_pct": "avg_efficiency_gap_pct",
    "pif": "avg_pif",
}


def fleet_daily(runs: pl.LazyFrame) -> pl.LazyFrame:
    """Minute runs (of one pass or of GPU chunks) -> fleet_daily.

    Means are over the GPU-minutes with a value; phase shares count each minute's own phase (by
    the rules' bounds, decided when the minutes were made), `pct_unknown` the minutes without a
    utilization reading, so the five sum to 100; `pct_active_bottlenecked` is the bottlenecked
    minutes over the active ones (utilization >= the rules' `phases.idle_below`, counted in the
    runs). Coverage: observed GPU-minutes / (GPUs seen x 1,440) x 100.

    Each GPU's runs are summed first, then the GPUs in UUID order: a GPU's runs come in the same
    order however the day was chunked (by GPU count or by cluster), so the floats are the same
    to the bit.
    """
    counts = ["_minutes", "_active", "_c_bottlenecked", *[f"_n_{p}" for p in PHASES]]
    sums = [f"_sum_{c}" for c in FLEET_MEANS] + [f"_n_{c}" for c in FLEET_MEANS]
    # the physical rows' sums, grouped with the instances' and dropped after: a filter ahead of
    # the group-by let its float sums change in the last bit from one collect to the next
    # (Polars 2.1: 44 of 100 collects of the same runs), so re-runs wrote other bytes
    per_gpu = (
        runs.group_by("date", "gpu_uuid", PHYSICAL.alias("_physical"))
        .agg(pl.col(*counts, *sums).sum())
        .filter(pl.col("_physical"))
        .sort("date", "gpu_uuid")
    )
    minutes = pl.col("observed_gpu_minutes")
    d = (
        per_gpu.group_by("date", maintain_order=True)
        .agg(
            pl.len().alias("gpus"),
            pl.col("_minutes").sum().alias("observed_gpu_minutes"),
            pl.col(*counts[1:], *sums).sum(),
        )
        .with_columns(
            (pl.col("gpus").cast(pl.UInt32) * MINUTES_PER_DAY).alias("expected_gpu_minutes"),
            (minutes / 60.0).alias("gpu_hours"),
            *[ratio(f"_sum_{c}", f"_n_{c}").alias(name) for c, name in FLEET_MEANS.items()],
            *[ratio(f"_n_{p}", "observed_gpu_minutes", 100.0).alias(f"pct_{p}") for p in PHASES],
            ratio("_c_bottlenecked", "_active", 100.0).alias("pct_active_bottlenecked"),
        )
        .with_columns(
            ratio("observed_gpu_minutes", "expected_gpu_minutes", 100.0).alias("coverage_pct")
        )
    )
    return to_contract(d, "fleet_daily").sort("date")
