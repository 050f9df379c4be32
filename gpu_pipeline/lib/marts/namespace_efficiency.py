"""gpu_minutes -> `namespace_efficiency`: per namespace utilization, RFU, waste, energy and CO2."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.money import (
    allocated_kwh,
    allocated_minutes,
    weighted_mean,
    weighted_share,
    with_gpu_power,
)
from gpu_pipeline.lib.reference import energy_rates, load_energy
from gpu_pipeline.lib.rules import DEFAULT, Thresholds
from gpu_pipeline.lib.samples import collect_in_parts
from gpu_pipeline.lib.schemas import to_contract


def namespace_efficiency(
    minutes: pl.LazyFrame, energy: pl.DataFrame | None = None, t: Thresholds = DEFAULT
) -> pl.LazyFrame:
    """Per namespace and day: utilization vs RFU, phase and bottleneck mix, the dominant diagnosis, money.

    Minutes are weighted by their GPU share (a MIG instance by its slices), so GPU-hours and
    means count a physical GPU once however it is split among namespaces.
    """
    active = pl.col("gpu_util_pct") >= t.idle_below
    usd_per_kwh, co2_per_kwh = energy_rates(
        load_energy() if energy is None else energy, pl.col("cluster")
    )
    kwh = allocated_kwh()  # energy allocated like cost
    # a sum over minutes none of which has the input is unknown (null), not 0: a namespace on
    # models without a price has no cost, one whose exporter sends no power no energy
    priced = pl.col("cost_usd").is_not_null().any()
    powered = pl.col("_gpu_power_w").is_not_null().any()
    # a part of the namespaces at a time (`collect_in_parts`); a MIG instance's power is its
    # physical GPU's, whatever namespace that row is in, so it is found before the parts
    out = collect_in_parts(
        with_gpu_power(minutes),
        "namespace",
        lambda m: (
            allocated_minutes(m)
            .group_by("date", "namespace")
            .agg(
                pl.col("gpu_uuid").n_unique().alias("gpus"),
                (pl.col("_w").sum() / 60.0).alias("gpu_hours"),
                weighted_mean("gpu_util_pct").alias("avg_gpu_util_pct"),
                weighted_mean("rfu_pct").alias("avg_rfu_pct"),
                weighted_mean("efficiency_gap_pct").alias("avg_efficiency_gap_pct"),
                (100.0 * weighted_share(pl.col("phase") == "idle")).alias("pct_idle"),
                (
                    100.0 * weighted_share(pl.col("efficiency_class") == "bottlenecked", active)
                ).alias("pct_active_bottlenecked"),
                pl.col("diagnosis")
                .filter(active)
                .mode()
                .sort()
                .first()
                .alias("dominant_diagnosis"),
                pl.when(priced).then(pl.col("cost_usd").sum()).alias("cost_usd"),
                pl.when(priced)
                .then(
                    (
                        pl.col("idle_waste_usd")
                        + pl.col("stall_waste_usd")
                        + pl.col("headroom_waste_usd")
                    ).sum()
                )
                .alias("waste_usd"),
                *[
                    pl.when(powered).then(e.sum()).alias(name)
                    for name, e in (
                        ("energy_kwh", kwh),
                        ("idle_energy_kwh", kwh.filter(pl.col("phase") == "idle")),
                        ("energy_usd", kwh * usd_per_kwh),
                        ("co2_kg", kwh * co2_per_kwh / 1000.0),
                    )
                ],
            )
        ),
    ).with_columns(
        pl.when(pl.col("cost_usd") > 0)
        .then(pl.col("waste_usd") / pl.col("cost_usd"))
        .alias("waste_frac")
    )
    return to_contract(out.lazy(), "namespace_efficiency").sort("namespace", nulls_last=False)
