"""GPU health per GPU-day and stragglers per hour. Pure and lazy."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.reference import model_key
from gpu_pipeline.lib.rules import HEALTH, HealthThresholds
from gpu_pipeline.lib.samples import conform_lazy
from gpu_pipeline.lib.schemas import GPU_HEALTH_SCHEMA, STRAGGLERS_SCHEMA

# clock-event reason bits that mean "held back by power": SW power cap, HW power brake
POWER_CAP_BITS = 0x4 | 0x80


def gpu_health(
    samples: pl.LazyFrame, catalog: pl.DataFrame, h: HealthThresholds = HEALTH
) -> pl.LazyFrame:
    """Per physical GPU-day: hot minutes, power-capped minutes, XID, double-bit ECC, row-remap failures.

    Any double-bit ECC error or a failed row remap means the GPU's math can't be trusted: `drain`.
    Hot minutes or XID errors: `warn`. Running at the power limit is not unhealthy by itself.
    """
    minute = pl.col("timestamp").dt.truncate("1m")
    limit = pl.coalesce("power_limit_w", "_cat_power")
    capped = (pl.col("power_w") >= h.power_capped_from * limit) | (
        (pl.col("clock_event_reasons").cast(pl.Int64, strict=False) & POWER_CAP_BITS) != 0
    ).fill_null(False)
    cat = catalog.lazy().select("model_key", pl.col("max_power_w").alias("_cat_power"))
    h = (
        samples.filter(pl.col("gpu_instance_id").is_null())
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(cat, on="model_key", how="left")
        .sort("timestamp")
        .group_by("date", "gpu_uuid")
        .agg(
            *[pl.col(c).drop_nulls().last() for c in ("hostname", "cluster", "gpu_model")],
            minute.n_unique().alias("minutes"),
            minute.filter(pl.col("gpu_temp_c") >= h.hot_from_c).n_unique().alias("hot_minutes"),
            pl.col("gpu_temp_c").max().alias("max_temp_c"),
            minute.filter(capped).n_unique().alias("power_capped_minutes"),
            (pl.col("xid_errors") > 0).sum().alias("xid_error_samples"),
            pl.col("xid_errors")
            .filter(pl.col("xid_errors") > 0)
            .cast(pl.Int64)
            .unique()
            .sort()
            .alias("xid_codes"),
            pl.col("ecc_dbe_volatile").max().fill_null(0).alias("ecc_dbe_errors"),
            pl.col("row_remap_failure").max().fill_null(0).alias("row_remap_failures"),
        )
        .with_columns(
            pl.when((pl.col("ecc_dbe_errors") > 0) | (pl.col("row_remap_failures") > 0))
            .then(pl.lit("drain"))
            .when((pl.col("hot_minutes") > 0) | (pl.col("xid_error_samples") > 0))
            .then(pl.lit("warn"))
            .otherwise(pl.lit("ok"))
            .alias("status"),
            pl.concat_str(
                pl.when(pl.col("ecc_dbe_errors") > 0).then(
                    pl.format("{} double-bit ECC error(s)", "ecc_dbe_errors")
                ),
                pl.when(pl.col("row_remap_failures") > 0).then(pl.lit("row remapping failed")),
                pl.when(pl.col("hot_minutes") > 0).then(
                    pl.format(
                        "{} min at or above {} C (max {})",
                        "hot_minutes",
                        pl.lit(h.hot_from_c),
                        "max_temp_c",
                    )
                ),
                pl.when(pl.col("xid_error_samples") > 0).then(
                    pl.format("XID {}", pl.col("xid_codes").cast(pl.List(pl.String)).list.join(","))
                ),
                separator="; ",
                ignore_nulls=True,
            ).alias("reasons"),
        )
    )
    return conform_lazy(h, GPU_HEALTH_SCHEMA).sort("gpu_uuid")


def stragglers(minutes: pl.LazyFrame, h: HealthThresholds = HEALTH) -> pl.LazyFrame:
    """GPU-hours that hold their pod back: SM activity (else utilization), in points.

    `below_median`: the GPU sits `straggler_points` (15) or more below its pod's median that hour.
    `spread`: the pod's GPUs spread with a population std dev of `straggler_spread_from` (0.15 of
    SM activity: 15 points) or more, and this is its slowest GPU (DOMAIN.md's rule for
    synchronous jobs). A row can carry both.
    """
    metric = (
        pl.when(pl.col("prof_sm_active").is_not_null())
        .then(100.0 * pl.col("prof_sm_active"))
        .otherwise(pl.col("gpu_util_pct"))
    )
    per_hour = (
        minutes.filter(pl.col("pod").is_not_null())
        .with_columns(pl.col("minute").dt.truncate("1h").alias("hour"), metric.alias("_m"))
        .group_by("date", "hour", "namespace", "pod", "gpu_uuid", "gpu_instance_id")
        .agg(
            pl.col("hostname").drop_nulls().last(),
            pl.col("_m").mean().alias("value"),
            pl.when(pl.col("prof_sm_active").is_not_null().all())
            .then(pl.lit("sm_active_pct"))
            .otherwise(pl.lit("gpu_util_pct"))
            .alias("metric"),
        )
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
    return conform_lazy(per_hour, STRAGGLERS_SCHEMA).sort("hour", "pod", "gpu_uuid")
