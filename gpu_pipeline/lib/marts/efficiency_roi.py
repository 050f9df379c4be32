"""gpu_minutes -> `efficiency_roi`: what raising RFU to the target is worth, per fleet and model.
Pure and lazy."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import HOURS_PER_MONTH, ROI_TARGET_RFU_PCT
from gpu_pipeline.lib.schemas import to_contract


def efficiency_roi(
    minutes: pl.LazyFrame, target_rfu_pct: float = ROI_TARGET_RFU_PCT
) -> pl.LazyFrame:
    """Per fleet and per model: raising average RFU from r to the target is worth gpus x (t - r) / r GPUs.

    The seed's example: 50 GPUs at 45 % RFU raised to 60 % deliver the work of 50 x 15 / 45 ≈ 17 more.
    Valued at the group's average price for a month.
    """
    physical = minutes.filter(pl.col("gpu_instance_id").is_null())

    per_model = (
        physical.group_by("date", "gpu_model")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("rfu_pct").mean().alias("avg_rfu_pct"),
            pl.col("price_usd_per_hour").mean().alias("_price"),
        )
        .with_columns(pl.lit("model").alias("scope"))
    )
    fleet = (
        physical.group_by("date")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("rfu_pct").mean().alias("avg_rfu_pct"),
            pl.col("price_usd_per_hour").mean().alias("_price"),
        )
        .with_columns(pl.lit("fleet").alias("scope"), pl.lit(None, pl.String).alias("gpu_model"))
    )
    out = (
        pl.concat([fleet, per_model], how="diagonal_relaxed")
        .with_columns(pl.lit(target_rfu_pct).alias("target_rfu_pct"))
        .with_columns(
            pl.when(pl.col("avg_rfu_pct") < pl.col("target_rfu_pct"))
            .then(
                pl.col("gpus")
                * (pl.col("target_rfu_pct") - pl.col("avg_rfu_pct"))
                / pl.col("avg_rfu_pct")
            )
            .otherwise(0.0)
            .alias("equivalent_gpus")
        )
        .with_columns(
            (pl.col("equivalent_gpus") * pl.col("_price") * HOURS_PER_MONTH).alias(
                "monthly_value_usd"
            )
        )
    )
    return to_contract(out, "efficiency_roi").sort("scope", "gpu_model", nulls_last=False)
