"""Minute runs -> `priced_waste`: day x cluster x namespace x gpu_model cost, split into productive,
idle, stall and headroom with nothing counted twice, and the run rates. Pure and lazy."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.money import MONEY, cents
from gpu_pipeline.lib.rules import HOURS_PER_MONTH, HOURS_PER_YEAR
from gpu_pipeline.lib.schemas import (
    to_contract,
)

# the grain of priced_waste
WASTE_KEYS = ("date", "cluster", "namespace", "gpu_model")


def priced_total(column: str) -> pl.Expr:
    """A money column of priced_waste summed, null (not $0) where nothing was priced (a model the
    price book lacks)."""
    return pl.when(pl.col(column).count() > 0).then(pl.col(column).sum()).alias(column)


def priced_waste(runs: pl.LazyFrame) -> pl.LazyFrame:
    """Minute runs (of one pass or of GPU chunks) -> priced_waste, with run rates."""
    w = (
        runs.group_by(*WASTE_KEYS)
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("_share", *MONEY).sum(),
            pl.col("price_usd_per_hour").max(),
            pl.col("_priced").any(),
        )
        .with_columns(
            # a MIG GPU's hours are split among its instances' namespaces by slice share
            (pl.col("_share") / 60.0).alias("gpu_hours"),
            # a group without a price has no cost: null, not zero
            *[pl.when(pl.col("_priced")).then(pl.col(c)).alias(c) for c in MONEY],
        )
        .with_columns(
            (
                pl.col("idle_waste_usd") + pl.col("stall_waste_usd") + pl.col("headroom_waste_usd")
            ).alias("total_waste_usd")
        )
        .with_columns(
            (pl.col("total_waste_usd") / pl.col("cost_usd")).alias("waste_frac"),
            (pl.col("total_waste_usd") / pl.col("gpu_hours")).alias("hourly_waste_usd"),
        )
        .with_columns(
            cents(pl.col("hourly_waste_usd") * HOURS_PER_MONTH).alias("monthly_waste_usd"),
            cents(pl.col("hourly_waste_usd") * HOURS_PER_YEAR).alias("yearly_waste_usd"),
        )
    )
    return to_contract(w, "priced_waste").sort(
        "cluster", "namespace", "gpu_model", nulls_last=False
    )
