"""gpu_samples -> `gpu_health`: per physical GPU-day, hot and power-capped minutes, XID, double-bit
ECC and row-remap failures, and a status. Pure and lazy."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.reference import by_model
from gpu_pipeline.lib.rules import HEALTH, HealthThresholds
from gpu_pipeline.lib.samples import MINUTE_MS, collect_stable, floor_ms
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, plan

# clock-event reason bits that mean "held back by power": SW power cap, HW power brake
POWER_CAP_BITS = 0x4 | 0x80


def gpu_health(
    samples: pl.LazyFrame, catalog: pl.DataFrame, h: HealthThresholds = HEALTH
) -> pl.LazyFrame:
    """Per physical GPU-day: hot minutes, power-capped minutes, XID, double-bit ECC, row-remap failures.

    Any double-bit ECC error or a failed row remap means the GPU's math can't be trusted: `drain`.
    At least `h.hot_warn_minutes` hot minutes, or an XID error: `warn` (fewer hot minutes are
    listed in `reasons`, the GPU stays `ok`: a one-minute spike is not an alert). Running at the
    power limit is not unhealthy by itself.
    """
    minute = floor_ms(pl.col("timestamp"), MINUTE_MS)
    limit = pl.coalesce("power_limit_w", "_cat_power")
    capped = (pl.col("power_w") >= h.power_capped_from * limit) | (
        (pl.col("clock_event_reasons").cast(pl.Int64, strict=False) & POWER_CAP_BITS) != 0
    ).fill_null(False)
    cat = catalog.lazy().select("model_key", pl.col("max_power_w").alias("_cat_power"))
    hot_from, warn_from = h.hot_from_c, h.hot_warn_minutes
    h = (
        by_model(samples.filter(pl.col("gpu_instance_id").is_null()), cat)
        .group_by("date", "gpu_uuid")
        .agg(
            # the last value given in time (each GPU's rows sorted by time in its group: not the
            # whole day's, which held 0.7 GiB at 1,000 GPUs)
            *[
                pl.col(c).sort_by("timestamp").drop_nulls().last()
                for c in ("hostname", "cluster", "gpu_model")
            ],
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
            .when((pl.col("hot_minutes") >= warn_from) | (pl.col("xid_error_samples") > 0))
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
                        "{} min at or above {} C (max {}; warns from {} min)",
                        "hot_minutes",
                        pl.lit(hot_from),
                        "max_temp_c",
                        pl.lit(warn_from),
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
    return to_contract(h, "gpu_health").sort("gpu_uuid")


def gpu_health_by_chunk(
    samples: pl.LazyFrame,
    catalog: pl.DataFrame,
    h: HealthThresholds = HEALTH,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.DataFrame:
    """`gpu_health` of a day's samples computed a chunk of whole GPUs at a time (the staging
    pass's chunks, `staging.chunked.plan`: every MIG instance with its physical GPU, so no group
    spans two chunks): the same table, with the memory of a chunk rather than of the day (the
    1,000-GPU day's step held 0.4 GiB more whole)."""
    parts = [
        collect_stable(gpu_health(samples.filter(c.predicate), catalog, h))
        for c in plan(samples, chunking)
    ]
    if not parts:  # no rows: the empty table with its contract's columns
        return collect_stable(gpu_health(samples, catalog, h))
    return pl.concat(parts).sort("gpu_uuid")
