"""gpu_daily of D-6..D -> `persistent_bottlenecks`: GPUs bottlenecked on at least 3 of the last 7
days (`[bottlenecks]` rules). Pure and lazy."""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl

from gpu_pipeline.lib.rules import (
    DEFAULT,
    Thresholds,
)
from gpu_pipeline.lib.schemas import (
    to_contract,
)


def window(day: date, t: Thresholds = DEFAULT) -> list[date]:
    """The days D-6..D whose GPU-days decide persistence on D."""
    return [day - timedelta(days=i) for i in range(t.window_days - 1, -1, -1)]


def persistent_bottlenecks(daily: pl.LazyFrame, day: date, t: Thresholds = DEFAULT) -> pl.LazyFrame:
    """GPUs bottlenecked on >= 3 of the days D-6..D; `daily` may hold any days, D's window is used.

    Days before the data starts are simply absent: `window_days` counts the days of the window for
    which the GPU has data.
    """
    w = window(day, t)
    p = (
        daily.filter(pl.col("date").is_between(w[0], w[-1]))
        .sort("date")
        .group_by("gpu_uuid", "gpu_instance_id")
        .agg(
            *[
                pl.col(c).drop_nulls().last()
                for c in ("hostname", "cluster", "namespace", "gpu_model")
            ],
            pl.col("date").n_unique().alias("window_days"),
            pl.col("bottlenecked_day").sum().alias("days_bottlenecked"),
            pl.col("active_minutes").sum().alias("active_minutes"),
            pl.col("bottlenecked_minutes").sum().alias("bottlenecked_minutes"),
        )
        .filter(pl.col("days_bottlenecked") >= t.persistent_min_days)
        .with_columns(
            (pl.col("bottlenecked_minutes") / pl.col("active_minutes")).alias("bottleneck_share"),
            pl.lit(day).alias("date"),
        )
    )
    return to_contract(p, "persistent_bottlenecks").sort(
        "gpu_uuid", "gpu_instance_id", nulls_last=False
    )
