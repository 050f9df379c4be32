"""gpu_minutes -> `stragglers`: GPUs that lag the other GPUs of their pod in an hour. A chunk of GPUs at a time."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import HEALTH, HealthThresholds
from gpu_pipeline.lib.samples import HOUR_MS, floor_ms
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks


def stragglers(
    minutes: pl.LazyFrame, h: HealthThresholds = HEALTH, chunking: Chunking = DEFAULT_CHUNKING
) -> pl.LazyFrame:
    """GPU-hours that hold their pod back: SM activity (else utilization), in points.

    `below_median`: the GPU sits `straggler_points` (15) or more below its pod's median that hour.
    `spread`: the pod's GPUs spread with a population std dev of `straggler_spread_from` (0.15 of
    SM activity: 15 points) or more, and this is its slowest GPU (the usual rule for
    synchronous jobs). A row can carry both.

    Each GPU-hour's mean is found a chunk of whole GPUs at a time (`by_gpu_chunks`); the pods'
    medians and spreads are then taken over those few rows.
    """
    metric = (
        pl.when(pl.col("prof_sm_active").is_not_null())
        .then(100.0 * pl.col("prof_sm_active"))
        .otherwise(pl.col("gpu_util_pct"))
    )
    gpu_hours = by_gpu_chunks(
        minutes,
        lambda m: (
            m.filter(pl.col("pod").is_not_null())
            .with_columns(floor_ms(pl.col("minute"), HOUR_MS).alias("hour"), metric.alias("_m"))
            .group_by(
                "date",
                "hour",
                "namespace",
                "pod",
                "gpu_uuid",
                "gpu_instance_id",
                maintain_order=True,
            )
            .agg(
                pl.col("hostname").drop_nulls().last(),
                pl.col("_m").mean().alias("value"),
                pl.when(pl.col("prof_sm_active").is_not_null().all())
                .then(pl.lit("sm_active_pct"))
                .otherwise(pl.lit("gpu_util_pct"))
                .alias("metric"),
            )
        ),
        chunking,
    )
    per_hour = (
        gpu_hours.lazy()
        .with_columns(
            pl.col("value").median().over("hour", "pod").alias("pod_median"),
            pl.len().over("hour", "pod").alias("pod_gpus"),
            pl.col("value").std(ddof=0).over("hour", "pod").alias("pod_stddev"),
            (pl.col("value") == pl.col("value").min().over("hour", "pod")).alias("_slowest"),
        )
        .with_columns((pl.col("pod_median") - pl.col("value")).alias("points_below"))
        .with_columns(
            ((pl.col("pod_gpus") >= 2) & (pl.col("points_below") >= h.straggler_points)).alias(
                "_below"
            ),
            (
                (pl.col("pod_gpus") >= 2)
                & pl.col("_slowest")
                & (pl.col("pod_stddev") >= 100.0 * h.straggler_spread_from)
            ).alias("_spread"),
        )
        .filter(pl.col("_below") | pl.col("_spread"))
        .with_columns(
            pl.concat_str(
                pl.when(pl.col("_below")).then(pl.lit("below_median")),
                pl.when(pl.col("_spread")).then(pl.lit("spread")),
                separator=", ",
                ignore_nulls=True,
            ).alias("rule")
        )
    )
    return to_contract(per_hour, "stragglers").sort("hour", "pod", "gpu_uuid")
