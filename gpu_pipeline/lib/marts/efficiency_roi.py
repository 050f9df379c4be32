"""gpu_minutes -> `efficiency_roi`: what raising RFU to the target is worth, per fleet and model.
Each GPU's sums a chunk of GPUs at a time (`by_gpu_chunks`), then added up."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import HOURS_PER_MONTH, ROI_TARGET_RFU_PCT
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks


def efficiency_roi(
    minutes: pl.LazyFrame,
    target_rfu_pct: float = ROI_TARGET_RFU_PCT,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.LazyFrame:
    """Per fleet and per model: raising average RFU from r to the target is worth gpus x (t - r) / r GPUs.

    The seed's example: 50 GPUs at 45 % RFU raised to 60 % deliver the work of 50 x 15 / 45 ≈ 17 more.
    Valued at the group's average price for a month, over the GPUs that have an RFU and a
    price (`means`).
    """
    # per GPU (a chunk of GPUs at a time): its minutes' RFU and price sums and counts
    per_gpu = by_gpu_chunks(
        minutes,
        lambda m: (
            m.filter(pl.col("gpu_instance_id").is_null())
            .group_by("date", "gpu_model", "gpu_uuid", maintain_order=True)
            .agg(
                pl.col("rfu_pct").sum().alias("_rfu"),
                pl.col("rfu_pct").count().alias("_rfu_n"),
                pl.col("price_usd_per_hour").sum().alias("_price"),
                pl.col("price_usd_per_hour").count().alias("_price_n"),
            )
        ),
        chunking,
    ).lazy()

    def means(groups: pl.LazyFrame) -> pl.LazyFrame:
        """A group's GPUs the valuation counts and their minutes' mean RFU and price (null: none
        has one). Counted: the GPUs with an RFU (power and a max power) and a price; in a group
        none of whose GPUs with an RFU has a price, those GPUs (its value is then unknown). A
        GPU without an RFU (a vGPU profile without power) would add GPUs the mean is not over."""
        rfu, priced = pl.col("_rfu_n") > 0, pl.col("_price_n") > 0
        counted = rfu & (priced | ~(rfu & priced).any())
        return groups.agg(
            pl.col("gpu_uuid").filter(counted).n_unique().alias("gpus"),
            *[
                pl.when(pl.col(f"{c}_n").filter(counted).sum() > 0)
                .then(pl.col(c).filter(counted).sum() / pl.col(f"{c}_n").filter(counted).sum())
                .alias(name)
                for c, name in (("_rfu", "avg_rfu_pct"), ("_price", "_price"))
            ],
        )

    per_model = means(per_gpu.group_by("date", "gpu_model")).with_columns(
        pl.lit("model").alias("scope")
    )
    fleet = means(per_gpu.group_by("date")).with_columns(
        pl.lit("fleet").alias("scope"), pl.lit(None, pl.String).alias("gpu_model")
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
