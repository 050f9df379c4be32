"""gpu_samples -> `gpu_minutes` (PIF, RFU, gap, phase, class, diagnosis, price), one row per
GPU and minute. Pure and lazy; definitions in docs/metrics.md."""

from __future__ import annotations

import functools

import numpy as np
import polars as pl

from gpu_pipeline.lib.fields import BY_COLUMN
from gpu_pipeline.lib.reference import model_key
from gpu_pipeline.lib.rules import (
    CLASS_ENUM,
    DEFAULT,
    DIAGNOSIS,
    DIAGNOSIS_BASIS_ENUM,
    DIAGNOSIS_ENUM,
    MEASURED_PHASES,
    PHASE_ENUM,
    PHASES,
    POWER_BASIS_ENUM,
    UTIL_SOURCE_ENUM,
    DiagnosisThresholds,
    Thresholds,
)
from gpu_pipeline.lib.samples import (
    MINUTE_MS,
    SAMPLE_ORDER,
    collect_stable,
    floor_ms,
    indicator,
)
from gpu_pipeline.lib.schemas import to_contract

GPU_KEY = ("gpu_uuid", "gpu_instance_id")


_MEAN_FIELDS = (
    "gpu_util_pct",
    "power_w",
    "fb_used_mib",
    "prof_sm_active",
    "prof_sm_occupancy",
    "prof_pipe_tensor_active",
    "prof_dram_active",
    "pcie_rx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
)


def phase_expr(util: pl.Expr, t: Thresholds = DEFAULT) -> pl.Expr:
    return (
        pl.when(util.is_null())
        .then(pl.lit("unknown", dtype=PHASE_ENUM))
        .when(util < t.idle_below)
        .then(pl.lit(PHASES[0], dtype=PHASE_ENUM))
        .when(util < t.productive_from)
        .then(pl.lit(PHASES[1], dtype=PHASE_ENUM))
        .when(util < t.compute_bound_from)
        .then(pl.lit(PHASES[2], dtype=PHASE_ENUM))
        .otherwise(pl.lit(PHASES[3], dtype=PHASE_ENUM))
    )


def efficiency_class_expr(util: pl.Expr, pif: pl.Expr, t: Thresholds = DEFAULT) -> pl.Expr:
    """idle; bottlenecked (busy, low power); efficient (busy, high power); inefficient; moderate.

    A busy minute without a power reading cannot be told bottlenecked from efficient: null.
    """
    busy = util >= t.productive_from
    return (
        pl.when(util.is_null())
        .then(None)
        .when(util < t.idle_below)
        .then(pl.lit(dtype=CLASS_ENUM, value="idle"))
        .when(busy & pif.is_null())
        .then(None)
        .when(busy & (pif < t.bottleneck_pif_below))
        .then(pl.lit(dtype=CLASS_ENUM, value="bottlenecked"))
        .when(busy & (pif >= t.efficient_pif_from))
        .then(pl.lit(dtype=CLASS_ENUM, value="efficient"))
        .when(util < t.inefficient_below)
        .then(pl.lit(dtype=CLASS_ENUM, value="inefficient"))
        .otherwise(pl.lit(dtype=CLASS_ENUM, value="moderate"))
    )


# MIG: compute slices of a full GPU when the catalog does not say (A100/H100 class: 7)
MIG_SLICES = 7


_SLICES = pl.col("gpu_instance_profile").str.extract(r"^(\d+)g", 1).cast(pl.Float64)


def _utilization(per_minute: pl.LazyFrame, mig: bool | None = None) -> pl.LazyFrame:
    """Utilization per minute, where it came from, and each row's share of its physical GPU.

    `gpu_util`: DCGM_FI_DEV_GPU_UTIL / nvidia-smi utilization.gpu. Under MIG that field is absent;
    an instance then uses its graphics-engine activity (`prof_gr_engine_active`), and the physical
    GPU's row the slice-weighted activity of its instances (`mig_instances`), free slices idle.

    `gpu_share` is what a row stands for in GPU-hours and cost: 1 for a whole GPU; for a MIG
    instance its slices over the model's (a `2g.20gb` on an H100 is 2/7); for the physical GPU's
    row of a MIG GPU the slices no instance holds in that minute. A minute with instances but no
    row of the physical GPU gets one, so a physical GPU is counted once in every minute it shows.
    """
    gr = (100.0 * pl.col("_gr")).clip(0.0, 100.0)
    if mig is False:
        joined = per_minute.with_columns(
            pl.lit(None, pl.Float64).alias("_mig_util"), pl.lit(1.0).alias("gpu_share")
        )
    else:
        joined = _with_mig_shares(per_minute)
    return joined.with_columns(
        pl.coalesce("gpu_util_pct", gr, "_mig_util").alias("gpu_util_pct"),
        pl.when(pl.col("gpu_util_pct").is_not_null())
        .then(pl.lit(dtype=UTIL_SOURCE_ENUM, value="gpu_util"))
        .when(pl.col("_gr").is_not_null())
        .then(pl.lit(dtype=UTIL_SOURCE_ENUM, value="prof_gr_engine_active"))
        .when(pl.col("_mig_util").is_not_null())
        .then(pl.lit(dtype=UTIL_SOURCE_ENUM, value="mig_instances"))
        .alias("util_source"),
    )


def _with_mig_shares(per_minute: pl.LazyFrame) -> pl.LazyFrame:
    """Each row's `gpu_share` under MIG (an instance: its slices; the physical GPU's row: the
    slices no instance holds), the physical GPU's row made up in a minute that has instances
    but none, and `_mig_util`, the instances' utilization, on the physical GPU's row."""
    instance = pl.col("gpu_instance_id").is_not_null()
    per_minute = _instance_shares(per_minute)
    inst = _instances_per_gpu(per_minute)
    physical = per_minute.filter(~instance).select("gpu_uuid", "minute")
    made_up = (
        inst.join(physical, on=["gpu_uuid", "minute"], how="anti")
        .drop("_mig_util", "_alloc")
        .with_columns(pl.lit(0, pl.UInt32).alias("samples"))
    )
    return (
        pl.concat([per_minute, made_up], how="diagonal_relaxed")
        .sort(*GPU_KEY, "minute", nulls_last=False, maintain_order=True)
        .join(
            inst.select(
                "gpu_uuid",
                "minute",
                "_mig_util",
                "_alloc",
                pl.lit(None, pl.Int32).alias("gpu_instance_id"),
            ),
            on=["gpu_uuid", "gpu_instance_id", "minute"],
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        .with_columns(
            pl.when(instance)
            .then(pl.col("_inst_share"))
            .otherwise(1.0 - pl.col("_alloc").fill_null(0.0))
            .alias("gpu_share")
        )
    )


def _instance_shares(per_minute: pl.LazyFrame) -> pl.LazyFrame:
    """`_inst_share`: a MIG instance's slices over its model's, scaled down when a GPU's
    instances claim more than all of it (null on a physical GPU's row)."""
    instance = pl.col("gpu_instance_id").is_not_null()
    # a profile without a slice count (not `<n>g…`) holds one slice
    share = (_SLICES.fill_null(1.0) / pl.col("_mig_slices").fill_null(MIG_SLICES)).clip(0, 1)
    return per_minute.with_columns(
        pl.when(instance).then(share).otherwise(None).alias("_inst_share")
    ).with_columns(
        # instances that claim more than the whole GPU (an odd profile, a wrong slice count)
        # share it in proportion: a physical GPU never counts more than once
        (
            pl.col("_inst_share")
            / pl.max_horizontal(pl.col("_inst_share").sum().over("gpu_uuid", "minute"), 1.0)
        ).alias("_inst_share")
    )


def _instances_per_gpu(per_minute: pl.LazyFrame) -> pl.LazyFrame:
    """Per physical GPU and minute with MIG instances: their slice-weighted utilization
    (`_mig_util`), the share of the GPU they hold (`_alloc`), and the GPU's identity and model
    columns (for a minute with no row of the physical GPU)."""
    instance = pl.col("gpu_instance_id").is_not_null()
    inst_util = pl.coalesce(pl.col("gpu_util_pct"), 100.0 * pl.col("_gr"))
    return (
        per_minute.filter(instance)
        .group_by("gpu_uuid", "minute")
        .agg(
            # slice-weighted activity of the instances (free slices are idle); unknown unless
            # every instance of the minute reports one: an instance without an activity field
            # counted idle made a GPU busy at 90 % on 3 of 7 slices, with 3 more unknown, read
            # 38.6 % (adversarial review)
            pl.when((inst_util.count() > 0) & (inst_util.count() == pl.len()))
            .then((inst_util * pl.col("_inst_share")).sum())
            .clip(0.0, 100.0)
            .alias("_mig_util"),
            pl.col("_inst_share").sum().clip(0.0, 1.0).alias("_alloc"),
            pl.col("date").first(),
            *[pl.col(c).drop_nulls().first() for c in ("hostname", "cluster", "gpu_model")],
            *[pl.col(c).first() for c in _MODEL_COLUMNS],
        )
    )


def _busy_at(t: Thresholds) -> tuple[pl.Expr, pl.Expr]:
    """(busy at high power, busy at low power): the minutes power alone can diagnose."""
    util, pif = pl.col("gpu_util_pct"), pl.col("pif")
    busy = util.is_not_null() & (util >= t.productive_from) & pif.is_not_null()
    return busy & (pif >= t.efficient_pif_from), busy & (pif < t.bottleneck_pif_below)


def power_diagnosis(t: Thresholds = DEFAULT) -> pl.Expr:
    """Without profiling fields (NVML, nvidia-smi, exporters without DCP): a busy minute at high
    power is compute-bound (precision, compiled and fused kernels pay); a busy minute at low power
    is data-starved (the GPU waits for its input: the data loader, CPU preprocessing). Anything
    else stays `unknown`: power alone cannot tell."""
    high, low = _busy_at(t)
    return (
        pl.when(high)
        .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="compute_bound"))
        .when(low)
        .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="data_starved"))
        .otherwise(pl.lit(dtype=DIAGNOSIS_ENUM, value="unknown"))
    )


def diagnosis_basis_expr(t: Thresholds = DEFAULT) -> pl.Expr:
    """Which signals the minute's diagnosis used."""
    high, low = _busy_at(t)
    util = pl.col("gpu_util_pct")
    return (
        pl.when(pl.col("prof_sm_active").is_not_null())
        .then(pl.lit(dtype=DIAGNOSIS_BASIS_ENUM, value="dcgm_profiling"))
        .when(util.is_not_null() & (util < t.idle_below))
        .then(pl.lit(dtype=DIAGNOSIS_BASIS_ENUM, value="utilization"))
        .when((high | low) & pl.col("pcie_rx_bytes_per_s").is_not_null())
        .then(pl.lit(dtype=DIAGNOSIS_BASIS_ENUM, value="power_pcie"))
        .when(high | low)
        .then(pl.lit(dtype=DIAGNOSIS_BASIS_ENUM, value="power"))
        .otherwise(pl.lit(dtype=DIAGNOSIS_BASIS_ENUM, value="none"))
    )


def diagnosis_expr(t: Thresholds = DEFAULT, d: DiagnosisThresholds = DIAGNOSIS) -> pl.Expr:
    """Why a busy minute is not productive, from DCGM profiling ratios (the decision tree).

    SM active < 30 %: under-fed — memory-bound when DRAM is saturated, communication-bound when
    NVLink is busy, else data-starved (PCIe RX bursts: the data loader; low PCIe: CPU
    preprocessing). 30-70 %: tensor pipe idle means no mixed precision; low occupancy means
    kernels/batches too small. > 70 %: memory-bound when DRAM > 80 %, else compute-bound (good),
    unless the tensor pipe is idle. Without SM activity: `power_diagnosis`.
    """
    sm, dram = pl.col("prof_sm_active"), pl.col("prof_dram_active")
    tensor, occ = pl.col("prof_pipe_tensor_active"), pl.col("prof_sm_occupancy")
    nvlink = pl.col("nvlink_rx_bytes_per_s")
    util = pl.col("gpu_util_pct")
    dram_bound = dram.is_not_null() & (dram >= d.dram_bound_from)
    no_tensor = tensor.is_not_null() & (tensor < d.tensor_unused_below)
    return (
        pl.when(util.is_not_null() & (util < t.idle_below))
        .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="idle"))
        .when(sm.is_null())
        .then(power_diagnosis(t))
        .when(sm < d.sm_underfed_below)
        .then(
            pl.when(dram_bound)
            .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="memory_bound"))
            .when(nvlink.is_not_null() & (nvlink >= d.nvlink_busy_from))
            .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="communication_bound"))
            .otherwise(pl.lit(dtype=DIAGNOSIS_ENUM, value="data_starved"))
        )
        .when(sm >= d.sm_busy_from)
        .then(
            pl.when(dram_bound)
            .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="memory_bound"))
            .when(no_tensor)
            .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="tensor_cores_unused"))
            .otherwise(pl.lit(dtype=DIAGNOSIS_ENUM, value="compute_bound"))
        )
        .when(no_tensor)
        .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="tensor_cores_unused"))
        .when(occ.is_not_null() & (occ < d.occupancy_low_below))
        .then(pl.lit(dtype=DIAGNOSIS_ENUM, value="low_occupancy"))
        .otherwise(pl.lit(dtype=DIAGNOSIS_ENUM, value="mixed"))
    )


_ATTRS = ("hostname", "cluster", "namespace", "pod", "hpc_job", "gpu_model", "gpu_instance_profile")
# read beside the means: MIG graphics-engine activity, the minute's hottest reading, the day's
# highest power limit (the max-power fallback), the energy counter's last reading (mJ)
_GR, _TEMP, _LIMIT = "prof_gr_engine_active", "gpu_temp_c", "power_limit_w"
_COUNTER = "energy_mj"
# every gpu_samples column gpu_minutes reads (`to_minutes`, `rows_as_minutes`): a staging chunk
# reads these and no others (a lake's day holds ~54 columns, of which ~30 never reach a minute:
# reading them cost time and a third of a chunk's memory; benchmarks/README.md, issue 34)
INPUT_COLUMNS = ("date", *SAMPLE_ORDER, *_ATTRS, *_MEAN_FIELDS, _GR, _TEMP, _LIMIT, _COUNTER)

# the energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ) -> Wh
MJ_PER_WH = 3.6e6
# a counter's increase is believed up to this many times the GPU's max power over the time it
# covers; without a max power, up to the highest power a reading may have (lib/fields.py)
COUNTER_PLAUSIBLE_X = 1.5
COUNTER_PLAUSIBLE_W = float(BY_COLUMN["power_w"].hi)
# and believed from this share of what the minute's own power reading drew in it
COUNTER_LEAST_X = 0.5


# what the model lookup adds to every minute (a made-up physical row copies them too)
_MODEL_COLUMNS = ("_cat_power", "achievable_tflops", "_mig_slices", "_price", "_model_note")


def to_minutes(samples: pl.LazyFrame, t: Thresholds = DEFAULT) -> pl.LazyFrame:
    """Samples in SAMPLE_ORDER -> one row per GPU (and MIG instance) per minute, in that order:
    means, maxima, last attributes, and how many of the minute's utilization samples fell in
    each phase (`_s_<phase>`, `_s_n`: the sub-minute phase shares)."""
    sample_phase = phase_expr(pl.col("gpu_util_pct"), t)
    # the minute's last reading of the energy counter (samples without the column have none)
    counter = [pl.col(_COUNTER).drop_nulls().last().alias("_energy_mj")]
    if _COUNTER not in samples.collect_schema().names():
        counter = []
    return (
        samples.with_columns(floor_ms(pl.col("timestamp"), MINUTE_MS).alias("minute"))
        .group_by(*GPU_KEY, "minute", maintain_order=True)
        .agg(
            pl.col("date").first(),
            *[pl.col(c).drop_nulls().last() for c in _ATTRS],
            pl.len().alias("samples"),
            *[(sample_phase == p).sum().alias(f"_s_{p}") for p in MEASURED_PHASES],
            pl.col("gpu_util_pct").count().alias("_s_n"),
            *[pl.col(c).mean() for c in _MEAN_FIELDS],
            pl.col(_GR).mean().alias("_gr"),
            pl.col(_TEMP).max(),
            pl.col(_LIMIT).max().alias("_limit"),
            *counter,
        )
    )


def rows_as_minutes(samples: pl.LazyFrame) -> pl.LazyFrame:
    """Samples that are already one per GPU-minute, in the shape `to_minutes` gives (no regroup)."""
    have = samples.collect_schema().names()

    def col(c: str) -> pl.Expr:
        if c in have:
            return pl.col(c)
        return pl.lit(None, pl.String if c in _ATTRS else pl.Float64).alias(c)

    return samples.select(
        "date",
        *GPU_KEY,
        floor_ms(pl.col("timestamp"), MINUTE_MS).alias("minute"),
        *[col(c) for c in _ATTRS],
        pl.lit(1, pl.UInt32).alias("samples"),
        # one sample a minute: its phase is the minute's (no sub-minute shares to count)
        *[pl.lit(None, pl.UInt32).alias(f"_s_{p}") for p in MEASURED_PHASES],
        pl.lit(None, pl.UInt32).alias("_s_n"),
        *[col(c) for c in _MEAN_FIELDS],
        col(_GR).alias("_gr"),
        col(_TEMP),
        col(_LIMIT).alias("_limit"),
        # not a column of nulls where the samples have no counter (a minute export without it)
        *([pl.col(_COUNTER).alias("_energy_mj")] if _COUNTER in have else []),
    )


def _repeat(values: pl.Series, lengths: np.ndarray) -> pl.Series:
    """`values[i]` repeated `lengths[i]` times, in order (a run-length decode)."""
    if values.n_unique() == 1:  # the same for every run (one model, or no note): one fill
        return values.new_from_index(0, int(lengths.sum()))
    if values.dtype.is_float():  # np.repeat is ~15x faster than a gather of every row
        out = pl.Series(values.name, np.repeat(values.to_numpy(), lengths), nan_to_null=True)
        return out.cast(values.dtype)
    return values.gather(pl.Series(np.repeat(np.arange(len(values), dtype=np.uint32), lengths)))


def _model_entries(
    names: pl.LazyFrame, catalog: pl.DataFrame, prices: pl.DataFrame
) -> pl.LazyFrame:
    """Catalog entry, price and note of each model name in `names` (column `gpu_model`): what
    depends on the model alone, worked out once per distinct name."""
    return (
        names.unique()
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(
            catalog.lazy().select(
                "model_key",
                pl.col("max_power_w").alias("_cat_power"),
                pl.col("achievable_fp16_tflops").alias("achievable_tflops"),
                pl.col("mig_slices").cast(pl.Float64).alias("_mig_slices"),
            ),
            on="model_key",
            how="left",
        )
        .join(
            prices.lazy().select("model_key", pl.col("on_demand_usd_per_hour").alias("_price")),
            on="model_key",
            how="left",
        )
        .with_columns(
            pl.concat_str(
                pl.when(pl.col("gpu_model").is_null()).then(pl.lit("no model name")),
                pl.when(
                    pl.col("gpu_model").is_not_null() & pl.col("achievable_tflops").is_null()
                ).then(
                    pl.format("model '{}' not in GPU catalog: TFLOPS unknown", pl.col("gpu_model"))
                ),
                pl.when(pl.col("_price").is_null()).then(pl.lit("no price for model")),
                separator="; ",
                ignore_nulls=True,
            ).alias("_model_note")
        )
        .drop("model_key")
    )


def _with_models(
    per_minute: pl.LazyFrame, catalog: pl.DataFrame, prices: pl.DataFrame
) -> tuple[pl.DataFrame, bool]:
    """Every row with its model's catalog entry and price, in row order, and whether every row's
    model is in the catalog with its max power. Rows come GPU by GPU, so the model changes
    rarely: the entry is looked up once per run of equal model names and repeated over the run
    (a string-keyed join of every row costs twice as much, a gather of every row 15x a repeat)."""
    pm = per_minute.collect(engine="in-memory")
    runs = pm.get_column("gpu_model").rle().struct.unnest()
    names = runs.lazy().select(pl.col("value").alias("gpu_model"))
    entries = collect_stable(
        names.join(
            _model_entries(names, catalog, prices),
            on="gpu_model",
            how="left",
            nulls_equal=True,
            maintain_order="left",
        ).drop("gpu_model")
    )
    lengths = runs.get_column("len").to_numpy()
    cataloged = entries.get_column("_cat_power").null_count() == 0
    return pm.with_columns(
        [_repeat(entries.get_column(c), lengths) for c in entries.columns]
    ), cataloged


def _counter_increase(pm: pl.DataFrame) -> pl.LazyFrame:
    """Rows (in SAMPLE_ORDER: a GPU key's minutes together, in time order) with the energy
    counter's increase since the key's previous row, Wh (`_e_wh`; null on a key's first row or
    without both readings), and the minutes since that row (`_e_min`). The previous row may be
    minutes earlier: the increase then covers the minutes no row shows. Taken before a MIG
    GPU's made-up physical rows are added (they read no counter, so they would cut the span)."""
    same = pl.col("gpu_uuid").eq_missing(pl.col("gpu_uuid").shift()) & pl.col(
        "gpu_instance_id"
    ).eq_missing(pl.col("gpu_instance_id").shift())
    e, minute = pl.col("_energy_mj"), pl.col("minute").dt.epoch("ms")
    return pm.lazy().with_columns(
        pl.when(same).then((e - e.shift()) / MJ_PER_WH).alias("_e_wh"),
        pl.when(same).then((minute - minute.shift()) / MINUTE_MS).alias("_e_min"),
    )


def energy_expr(counted: bool) -> pl.Expr:
    """`energy_wh`, the energy the physical GPU drew in the minute: the counter's increase since
    the key's previous row (`_counter_increase`) where it is >= 0 (a driver reload resets the
    counter) and plausible (at most COUNTER_PLAUSIBLE_X x max power, or COUNTER_PLAUSIBLE_W
    without one, over the minutes it covers); otherwise mean power x 1 minute (null without a
    power reading). `counted`: some row has a counter reading (without one, power alone)."""
    by_power = pl.col("power_w") / 60.0
    if not counted:
        return by_power.alias("energy_wh")
    watts = pl.coalesce(COUNTER_PLAUSIBLE_X * pl.col("max_power_w"), pl.lit(COUNTER_PLAUSIBLE_W))
    increase = pl.col("_e_wh")
    # a GPU always draws something: an increase of 0, or under half of what the minute's own
    # power reading drew, is a counter that does not move (unsupported, frozen), not energy
    # (a stuck counter zeroed a day the power readings said drew 7.2 kWh: adversarial review)
    least = (COUNTER_LEAST_X * by_power).fill_null(0.0)
    plausible = (
        (increase > 0.0) & (increase >= least) & (increase <= watts * pl.col("_e_min") / 60.0)
    )
    return pl.when(plausible).then(increase).otherwise(by_power).alias("energy_wh")


@functools.cache
def _metric_stages(
    t: Thresholds, d: DiagnosisThresholds, cataloged: bool, counted: bool
) -> tuple[tuple[pl.Expr, ...], ...]:
    """The metric stack over the per-minute rows with their model entries: the column lists
    `gpu_minutes` adds one after another (each reads the ones before). Built once per
    thresholds, not once per chunk: building ~200 expressions in Python was most of a chunk's
    fixed cost (benchmarks/README.md, issue 34). Expressions are immutable: the same tuples
    serve every query. `cataloged`: every row's model has a catalog max power (the fallback,
    the GPU's highest power limit of the day, is then not computed); `counted`: some row has an
    energy counter reading (`energy_expr`)."""
    day_limit = pl.lit(None, pl.Float64) if cataloged else pl.col("_limit").max().over("gpu_uuid")
    mig_instance = pl.col("gpu_instance_id").is_not_null()
    row_note = pl.concat_str(
        pl.when(mig_instance).then(
            pl.lit(
                "MIG instance: power and PIF only on the physical GPU's row; cost by slice share"
            )
        ),
        pl.when(pl.col("max_power_w").is_null()).then(
            pl.lit("no max power (catalog or power limit)")
        ),
        pl.when(pl.col("power_w").is_null() & ~mig_instance).then(pl.lit("no power reading")),
        pl.when(pl.col("gpu_util_pct").is_null()).then(pl.lit("no utilization reading")),
        separator="; ",
        ignore_nulls=True,
    )
    return (
        (
            # every row carries the model's price; its cost is price x gpu_share
            pl.col("_price").alias("price_usd_per_hour"),
            pl.coalesce(pl.col("_cat_power"), day_limit).alias("max_power_w"),
            pl.when(pl.col("_cat_power").is_not_null())
            .then(pl.lit(dtype=POWER_BASIS_ENUM, value="catalog"))
            .when(day_limit.is_not_null())
            .then(pl.lit(dtype=POWER_BASIS_ENUM, value="power_limit"))
            .alias("max_power_basis"),
        ),
        (
            (pl.col("power_w") / pl.col("max_power_w")).clip(0.0, 1.0).alias("pif"),
            energy_expr(counted),
        ),
        (
            (pl.col("achievable_tflops") * pl.col("pif")).alias("realized_tflops"),
            (pl.col("pif") * 100.0).alias("rfu_pct"),
            row_note.alias("_row_note"),
        ),
        (
            (pl.col("gpu_util_pct") - pl.col("rfu_pct")).alias("efficiency_gap_pct"),
            phase_expr(pl.col("gpu_util_pct"), t).alias("phase"),
            efficiency_class_expr(pl.col("gpu_util_pct"), pl.col("pif"), t).alias(
                "efficiency_class"
            ),
            diagnosis_expr(t, d).alias("diagnosis"),
            diagnosis_basis_expr(t).alias("diagnosis_basis"),
            # most minutes have no note: build the joined string only where both parts exist
            pl.when(pl.col("_row_note") == "")
            .then(pl.when(pl.col("_model_note") == "").then(None).otherwise(pl.col("_model_note")))
            .when(pl.col("_model_note") == "")
            .then(pl.col("_row_note"))
            .otherwise(pl.concat_str("_row_note", pl.lit("; "), "_model_note"))
            .alias("note"),
        ),
        tuple(phase_shares()),
    )


def gpu_minutes(
    samples: pl.LazyFrame,
    catalog: pl.DataFrame,
    prices: pl.DataFrame,
    t: Thresholds = DEFAULT,
    already_minutes: bool = False,
    mig: bool | None = None,
    presorted: bool = False,
    d: DiagnosisThresholds = DIAGNOSIS,
) -> pl.LazyFrame:
    """One row per GPU (and MIG instance) per minute with the metric stack of docs/metrics.md, in SAMPLE_ORDER.

    `already_minutes`: the input holds one row per GPU-minute (a minute-level export), so the
    per-minute regroup is skipped. `mig=False`: no MIG instances in the input (skips their
    aggregation); None: find out. `presorted`: the input is already in SAMPLE_ORDER (as the lake
    stores it, checked by `chunked.inspect`), so it is not sorted again; every later step keeps
    the order.
    """
    if not presorted:
        samples = samples.sort(*SAMPLE_ORDER, nulls_last=False)
    per_minute = rows_as_minutes(samples) if already_minutes else to_minutes(samples, t)
    pm, cataloged = _with_models(per_minute, catalog, prices)
    # the counter's increases only where the chunk has a reading of it (nvidia-smi has none,
    # nor most exporters' defaults): a chunk without one pays nothing for them
    counted = "_energy_mj" in pm.columns and pm.get_column("_energy_mj").null_count() < pm.height
    m = _utilization(_counter_increase(pm) if counted else pm.lazy(), mig=mig)
    for stage in _metric_stages(t, d, cataloged, counted):
        m = m.with_columns(stage)
    return to_contract(m, "gpu_minutes")


def phase_shares() -> list[pl.Expr]:
    """The minute's sub-minute phase shares (summing to 1): the shares of its utilization samples
    in each phase where it was built from several samples that carry utilization as read
    (`util_source = gpu_util`); otherwise 1 for the minute's own phase. A 10 Hz stream bouncing
    100 % <-> 0 % is then half idle and half compute-bound, though its minute mean (50 %) makes
    the minute's `phase` underutilized."""
    have = pl.col("_s_n").fill_null(0) > 1
    from_samples = have & (pl.col("util_source") == "gpu_util")
    return [
        pl.when(from_samples)
        .then(pl.col(f"_s_{p}") / pl.col("_s_n"))
        .otherwise(indicator(pl.col("phase") == p))
        .alias(f"phase_share_{p}")
        for p in MEASURED_PHASES
    ] + [
        pl.when(from_samples)
        .then(0.0)
        .otherwise(indicator(pl.col("phase") == "unknown"))
        .alias("phase_share_unknown")
    ]
