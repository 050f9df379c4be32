"""gpu_minutes -> `namespace_efficiency`: per namespace utilization, RFU, waste, energy and CO2."""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.money import (
    allocated_kwh,
    allocated_minutes,
    weighted_sums,
    with_gpu_energy,
)
from gpu_pipeline.lib.reference import energy_rates, load_energy
from gpu_pipeline.lib.rules import DEFAULT, DIAGNOSIS_ENUM, Thresholds
from gpu_pipeline.lib.samples import ratio
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks

# the means shown, weighted by GPU share, by column of the minutes
MEANS = {
    "gpu_util_pct": "avg_gpu_util_pct",
    "rfu_pct": "avg_rfu_pct",
    "efficiency_gap_pct": "avg_efficiency_gap_pct",
}
# the dominant diagnosis is the mode of the active minutes' diagnoses (no diagnosis is a value of
# its own), the first in sort order on a tie: counted per value, null first
DIAGNOSIS_VALUES = [None, *DIAGNOSIS_ENUM.categories.to_list()]


def _energies(energy: pl.DataFrame | None) -> dict[str, pl.Expr]:
    """A minute's energy (`energy_wh`) as its namespace owns it (allocated like cost), its idle
    part, and its dollars and CO2 at the cluster's rates."""
    usd_per_kwh, co2_per_kwh = energy_rates(
        load_energy() if energy is None else energy, pl.col("cluster")
    )
    kwh = allocated_kwh()
    return {
        "energy_kwh": kwh,
        "idle_energy_kwh": kwh.filter(pl.col("phase") == "idle"),
        "energy_usd": kwh * usd_per_kwh,
        "co2_kg": kwh * co2_per_kwh / 1000.0,
    }


def _gpu_sums(energies: dict[str, pl.Expr], t: Thresholds) -> list[pl.Expr]:
    """What a GPU's allocated minutes add to their namespace: weights, weighted sums, active
    diagnosis counts, money and energy (and whether any minute has a price, an energy)."""
    active = pl.col("gpu_util_pct") >= t.idle_below
    w, diagnosis = pl.col("_w"), pl.col("diagnosis")
    return [
        w.sum().alias("_w"),
        *[e.alias(f"_{k}_{c}") for c in MEANS for k, e in zip("xw", weighted_sums(c), strict=True)],
        w.filter(pl.col("phase") == "idle").sum().alias("_w_idle"),
        w.filter(active).sum().alias("_w_active"),
        w.filter((pl.col("efficiency_class") == "bottlenecked") & active)
        .sum()
        .alias("_w_bottlenecked"),
        *[
            (active & (diagnosis.is_null() if v is None else diagnosis == v)).sum().alias(f"_n_{i}")
            for i, v in enumerate(DIAGNOSIS_VALUES)
        ],
        # a sum over minutes none of which has the input is unknown (null), not 0: a namespace
        # on models without a price has no cost, one whose exporter sends neither power nor the
        # energy counter no energy
        pl.col("cost_usd").is_not_null().any().alias("_priced"),
        pl.col("cost_usd").sum(),
        (pl.col("idle_waste_usd") + pl.col("stall_waste_usd") + pl.col("headroom_waste_usd"))
        .sum()
        .alias("waste_usd"),
        pl.col("_gpu_energy_wh").is_not_null().any().alias("_powered"),
        *[e.sum().alias(name) for name, e in energies.items()],
    ]


def _namespace_figures(energies: dict[str, pl.Expr]) -> list[pl.Expr]:
    """A namespace's figures from its GPUs' `_gpu_sums`."""
    w = pl.col("_w")
    counts = pl.concat_list([pl.col(f"_n_{i}").sum() for i in range(len(DIAGNOSIS_VALUES))])
    dominant = counts.list.arg_max().replace_strict(
        list(range(1, len(DIAGNOSIS_VALUES))),
        DIAGNOSIS_VALUES[1:],
        default=None,
        return_dtype=DIAGNOSIS_ENUM,
    )
    priced, powered = pl.col("_priced").any(), pl.col("_powered").any()
    return [
        pl.col("gpu_uuid").n_unique().alias("gpus"),
        (w.sum() / 60.0).alias("gpu_hours"),
        *[
            ratio(pl.col(f"_x_{c}").sum(), pl.col(f"_w_{c}").sum()).alias(name)
            for c, name in MEANS.items()
        ],
        (100.0 * ratio(pl.col("_w_idle").sum(), w.sum())).alias("pct_idle"),
        (100.0 * ratio(pl.col("_w_bottlenecked").sum(), pl.col("_w_active").sum())).alias(
            "pct_active_bottlenecked"
        ),
        pl.when(counts.list.max() > 0).then(dominant).alias("dominant_diagnosis"),
        pl.when(priced).then(pl.col("cost_usd").sum()).alias("cost_usd"),
        pl.when(priced).then(pl.col("waste_usd").sum()).alias("waste_usd"),
        *[pl.when(powered).then(pl.col(name).sum()).alias(name) for name in energies],
    ]


def namespace_efficiency(
    minutes: pl.LazyFrame,
    energy: pl.DataFrame | None = None,
    t: Thresholds = DEFAULT,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.LazyFrame:
    """Per namespace and day: utilization vs RFU, phase and bottleneck mix, the dominant diagnosis, money.

    Minutes are weighted by their GPU share (a MIG instance by its slices), so GPU-hours and
    means count a physical GPU once however it is split among namespaces. Each GPU's share of a
    namespace (weights, weighted sums, counts, money, energy) is summed a chunk of GPUs at a
    time (`by_gpu_chunks`; a MIG instance's energy is its physical GPU's, in the same chunk),
    then the GPUs' sums are added up per namespace.
    """
    energies = _energies(energy)
    per_gpu = by_gpu_chunks(
        minutes,
        lambda m: (
            allocated_minutes(with_gpu_energy(m))
            .group_by("date", "namespace", "gpu_uuid", maintain_order=True)
            .agg(_gpu_sums(energies, t))
        ),
        chunking,
    )
    out = (
        per_gpu.lazy()
        .group_by("date", "namespace")
        .agg(_namespace_figures(energies))
        .with_columns(
            pl.when(pl.col("cost_usd") > 0)
            .then(pl.col("waste_usd") / pl.col("cost_usd"))
            .alias("waste_frac")
        )
    )
    return to_contract(out, "namespace_efficiency").sort("namespace", nulls_last=False)
