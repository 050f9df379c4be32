"""Minute runs -> `hourly_fleet_metrics`: hour x cluster x gpu_model fleet averages and phase
shares (summing to 100). Pure and lazy; definitions in docs/metrics.md."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import (
    PHASES,
)
from gpu_pipeline.lib.samples import PHYSICAL, ratio
from gpu_pipeline.lib.schemas import (
    to_contract,
)
from gpu_pipeline.lib.staging.minute_runs import HOURLY_KEYS, HOURLY_MEANS


def hourly_fleet_metrics(runs: pl.LazyFrame) -> pl.LazyFrame:
    """Minute runs (of one pass or of GPU chunks) -> hourly_fleet_metrics.

    Fleet totals count each physical GPU once: the physical GPU's rows only (under MIG they carry
    the slice-weighted utilization of the instances and the GPU's power).
    """
    sums = [f"_sum_{c}" for c in HOURLY_MEANS] + [f"_n_{c}" for c in HOURLY_MEANS]
    h = (
        runs.filter(PHYSICAL)
        .group_by(*HOURLY_KEYS)
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("_minutes").sum().alias("gpu_minutes"),
            pl.col(*sums, *[f"_sh_{p}" for p in PHASES], "_n_phase").sum(),
        )
        .with_columns(
            *[ratio(f"_sum_{c}", f"_n_{c}").alias(name) for c, name in HOURLY_MEANS.items()],
            # the minutes' sub-minute phase shares (each minute's sum to 1)
            *[ratio(f"_sh_{p}", "_n_phase", 100.0).alias(f"pct_{p}") for p in PHASES],
        )
    )
    return to_contract(h, "hourly_fleet_metrics").sort(
        "hour", "cluster", "gpu_model", nulls_last=False
    )
