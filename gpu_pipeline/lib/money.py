"""Money: what a GPU-minute costs and where it goes, in one place.

A minute's cost is its price per GPU-hour x its share of the physical GPU / 60, split with
nothing counted twice into productive, idle, stall and headroom waste (`minute_costs`); a MIG
GPU's price is allocated to its instances' namespaces by slice share, the free slices being idle
waste of the GPU's owner (`allocated_minutes`), and so is its energy (`with_gpu_energy`). Staging
sums these per minute run (`staging/minute_runs.py`); `priced_waste`, `namespace_efficiency`,
`workload_efficiency` and `recommendations` read them; a group's summed money becomes its waste
and run rates in one place (`priced_rates`).
"""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.rules import (
    CLASS_ENUM,
    DIAGNOSIS_ENUM,
    HOURS_PER_MONTH,
    HOURS_PER_YEAR,
    PHASE_ENUM,
)
from gpu_pipeline.lib.samples import PHYSICAL, phase_share, ratio

# the money columns of a minute (and of a run, summed), in the order priced_waste shows them
MONEY = (
    "cost_usd",
    "productive_usd",
    "idle_waste_usd",
    "stall_waste_usd",
    "headroom_waste_usd",
    "unmeasured_usd",
)


def mig_unallocated() -> pl.Expr:
    """The physical GPU's row of a MIG GPU with instances: it stands for the free slices only."""
    return PHYSICAL & (pl.col("gpu_share") < 1.0)


def minute_costs(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Split each GPU-minute's price into productive / idle / stall / headroom, nothing twice.

    A row costs price x gpu_share / 60 (a whole GPU: its price; a MIG instance: its slices).
    idle minute -> all idle; otherwise productive = rfu, stall = max(0, util - rfu), headroom = the
    rest. A non-idle minute lacking utilization or power can't be split: `unmeasured`. The free
    slices of a MIG GPU (its physical row) are idle waste of the GPU's owner.
    """
    cost = pl.col("price_usd_per_hour") * pl.col("gpu_share").fill_null(1.0) / 60.0
    # the idle share of the minute: its idle samples (sub-minute phase shares), all of it for the
    # free slices of a MIG GPU; 0 or 1 when the minute's samples share one phase
    idle_share = phase_share(minutes.collect_schema().names(), "idle")
    idle_share = pl.when(mig_unallocated()).then(1.0).otherwise(idle_share).fill_null(0.0)
    measured = pl.col("gpu_util_pct").is_not_null() & pl.col("rfu_pct").is_not_null()
    # in steps, each intermediate once (Polars' common-subexpression pass does not reach the
    # ones nested in others: idle_share was computed eight times)
    c, idle, busy = pl.col("_cost"), pl.col("_idle"), pl.col("_busy")
    productive, stalled = pl.col("_productive"), pl.col("_stalled")
    split = (idle < 1.0) & pl.col("_measured")
    steps = (
        minutes.with_columns(
            cost.alias("_cost"), idle_share.alias("_idle"), measured.alias("_measured")
        )
        # what is not idle: productive (RFU) first, then stall, then headroom
        .with_columns((1.0 - idle).alias("_busy"))
        .with_columns(
            pl.min_horizontal(pl.col("rfu_pct") / 100.0, busy).alias("_productive"),
            (
                pl.max_horizontal(pl.col("gpu_util_pct") - pl.col("rfu_pct"), pl.lit(0.0)) / 100.0
            ).alias("_stall"),
        )
        .with_columns(pl.min_horizontal(pl.col("_stall"), busy - productive).alias("_stalled"))
    )
    return steps.with_columns(
        c.alias("cost_usd"),
        pl.when(split).then(c * productive).otherwise(0.0).alias("productive_usd"),
        (c * idle).fill_null(0.0).alias("idle_waste_usd"),
        pl.when(split).then(c * stalled).otherwise(0.0).alias("stall_waste_usd"),
        pl.when(split)
        .then(c * (busy - productive - stalled))
        .otherwise(0.0)
        .alias("headroom_waste_usd"),
        pl.when((idle < 1.0) & ~pl.col("_measured"))
        .then(c * busy)
        .otherwise(0.0)
        .alias("unmeasured_usd"),
    ).drop("_cost", "_idle", "_measured", "_busy", "_productive", "_stall", "_stalled")


# a MIG GPU's device-level power figures, allocated to its instances by `allocated_minutes`
DEVICE_POWER = ("pif", "rfu_pct", "realized_tflops")


def with_gpu_power(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes whose MIG instances carry their physical GPU's PIF, RFU and realized TFLOPS in
    that minute (`DEVICE_POWER`; null when the GPU's row has none; an instance with a value of
    its own, which no exporter gives today, keeps it).

    Power is read once per device and cannot be split among instances (an instance's row has
    none of its own), so the GPU's RFU is allocated like its price and energy: every slice of
    the GPU, held by an instance or free, carries the GPU's RFU, and weighted by `gpu_share`
    the GPU's RFU counts once (weight 1) across the namespaces that hold its slices.
    """
    device = minutes.filter(mig_unallocated()).select(
        "gpu_uuid", "minute", *[pl.col(c).alias(f"_device_{c}") for c in DEVICE_POWER]
    )
    return (
        minutes.join(device, on=["gpu_uuid", "minute"], how="left", maintain_order="left")
        .with_columns(
            *[
                pl.when(PHYSICAL)
                .then(pl.col(c))
                .otherwise(pl.coalesce(pl.col(c), pl.col(f"_device_{c}")))
                .alias(c)
                for c in DEVICE_POWER
            ],
        )
        .drop(*[f"_device_{c}" for c in DEVICE_POWER])
    )


def allocated_minutes(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes as namespaces own them, with their costs and a weight `_w` (the GPU share).

    A whole GPU's minute weighs 1, a MIG instance's its slices; the physical row of a MIG GPU
    stands for its free slices, idle by definition (utilization 0, no diagnosis of its own).
    Costs are split on the minutes as stored (an instance without power: unmeasured); then
    every row of a MIG GPU carries the GPU's PIF and RFU (`with_gpu_power`), its gap being the
    row's utilization minus the GPU's RFU. Means over namespaces are weighted by `_w`, so a MIG
    GPU counts once however it is split: its RFU with weight 1, its utilization and gap those
    of its physical row (the slice-weighted utilization of its instances, free slices idle).
    """
    free = mig_unallocated()
    on_mig = free | ~PHYSICAL
    costed = minute_costs(minutes).with_columns(
        pl.col("gpu_share").fill_null(1.0).alias("_w"),
        pl.when(free).then(0.0).otherwise(pl.col("gpu_util_pct")).alias("gpu_util_pct"),
    )
    return with_gpu_power(costed).with_columns(
        pl.when(on_mig)
        .then(pl.col("gpu_util_pct") - pl.col("rfu_pct"))
        .otherwise(pl.col("efficiency_gap_pct"))
        .alias("efficiency_gap_pct"),
        pl.when(free).then(pl.lit("idle", PHASE_ENUM)).otherwise(pl.col("phase")).alias("phase"),
        pl.when(free)
        .then(pl.lit("idle", CLASS_ENUM))
        .otherwise(pl.col("efficiency_class"))
        .alias("efficiency_class"),
        pl.when(free)
        .then(pl.lit("idle", DIAGNOSIS_ENUM))
        .otherwise(pl.col("diagnosis"))
        .alias("diagnosis"),
    )


def minute_energy_wh(columns: list[str]) -> pl.Expr:
    """A minute's `energy_wh` (docs/metrics.md, Energy). A minute stored before the column
    existed (an older lake's day: no column, or null in a frame joined with newer days) has
    mean power x 1 minute, as it was; a minute computed now with a null `energy_wh` has no
    power reading either, so the fallback changes none of them."""
    by_power = pl.col("power_w") / 60.0
    if "energy_wh" in columns:
        return pl.coalesce(pl.col("energy_wh"), by_power)
    return by_power


def with_gpu_energy(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes with `_gpu_energy_wh`: the energy of the row's physical GPU in that minute, Wh.

    A MIG instance has no energy of its own (power and the energy counter are device-level:
    kept once, on the physical GPU's row): its row takes the physical GPU's, so that weighted
    by `gpu_share` like the price, the GPU's energy is allocated to its instances' namespaces
    by slice share and the free slices keep the rest. A whole GPU's row keeps its own.
    """
    energy = minute_energy_wh(minutes.collect_schema().names())
    device = minutes.filter(mig_unallocated()).select(
        "gpu_uuid", "minute", energy.alias("_device_energy_wh")
    )
    return (
        minutes.join(device, on=["gpu_uuid", "minute"], how="left", maintain_order="left")
        .with_columns(
            pl.when(PHYSICAL)
            .then(energy)
            .otherwise(pl.coalesce(pl.col("_device_energy_wh"), energy))
            .alias("_gpu_energy_wh")
        )
        .drop("_device_energy_wh")
    )


def priced_rates(groups: pl.LazyFrame) -> pl.LazyFrame:
    """Groups with their money summed (`MONEY`), `gpu_hours` and `_priced` (a minute of the
    group has a price) -> the same with the money null where nothing was priced (unknown, not
    $0), `total_waste_usd` (idle + stall + headroom), `waste_frac`, and the run rates:
    `hourly_waste_usd` per GPU-hour of the group, `monthly_waste_usd` and `yearly_waste_usd`
    from the unrounded hourly figure, each rounded to the cent. priced_waste and
    workload_efficiency both end here."""
    return (
        groups.with_columns(*[pl.when(pl.col("_priced")).then(pl.col(c)).alias(c) for c in MONEY])
        .with_columns(
            (
                pl.col("idle_waste_usd") + pl.col("stall_waste_usd") + pl.col("headroom_waste_usd")
            ).alias("total_waste_usd")
        )
        .with_columns(
            # null, not NaN, where there is nothing to divide by: a price of $0 (owned
            # hardware), the free slices of a MIG GPU whose slices are all allocated (0 GPU-hours)
            ratio("total_waste_usd", "cost_usd").alias("waste_frac"),
            ratio("total_waste_usd", "gpu_hours").alias("hourly_waste_usd"),
        )
        .with_columns(
            cents(pl.col("hourly_waste_usd") * HOURS_PER_MONTH).alias("monthly_waste_usd"),
            cents(pl.col("hourly_waste_usd") * HOURS_PER_YEAR).alias("yearly_waste_usd"),
        )
    )


def allocated_kwh() -> pl.Expr:
    """A minute's energy as its namespace owns it, kWh: the physical GPU's energy x the row's GPU
    share (a MIG instance: its slices of the GPU's energy; the free slices: the rest, on the
    GPU's row). Needs `with_gpu_energy` and `allocated_minutes`' `_w`."""
    return pl.col("_gpu_energy_wh") * pl.col("_w") / 1000.0


def cents(e: pl.Expr) -> pl.Expr:
    """Dollars rounded to the cent: how every money figure a person reads is shown (run rates,
    the showback file); the marts keep the unrounded sums so that they add up."""
    return e.round(2)


def weighted_sums(col: str, w: str = "_w") -> tuple[pl.Expr, pl.Expr]:
    """The two sums a weighted mean of `col` divides, over rows where `col` has a value: `col`
    x `w`, and `w`. A mean added up from parts (each GPU's, then the group's) sums them."""
    has = pl.col(col).is_not_null()
    return (pl.col(col) * pl.col(w)).filter(has).sum(), pl.col(w).filter(has).sum()


def weighted_mean(col: str, w: str = "_w") -> pl.Expr:
    """Mean of `col` weighted by `w` over rows where `col` has a value (null if none)."""
    return ratio(*weighted_sums(col, w))


def weighted_share(cond: pl.Expr, among: pl.Expr | None = None, w: str = "_w") -> pl.Expr:
    """Weighted share of rows meeting `cond` among rows meeting `among` (all rows if None)."""
    base = pl.col(w) if among is None else pl.col(w).filter(among)
    num = pl.col(w).filter(cond if among is None else cond & among)
    return ratio(num.sum(), base.sum())
