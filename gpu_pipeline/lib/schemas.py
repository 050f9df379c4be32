"""Column contracts of every table (the names README and docs/metrics.md document), and the pandera models that enforce them.

The dicts are the single source for writers (`conform`), the Dagster column schema and DuckDB;
the pandera models add value checks and grain uniqueness on collected frames.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import pandera.polars as pa
import polars as pl

from gpu_pipeline.lib.fields import FIELD_COLUMNS, FIELDS
from gpu_pipeline.lib.rules import (
    CLASS_ENUM,
    DIAGNOSES,
    DIAGNOSIS_BASIS_ENUM,
    DIAGNOSIS_ENUM,
    EFFICIENCY_CLASSES,
    PHASE_ENUM,
    PHASES,
    POWER_BASIS_ENUM,
    UTIL_SOURCE_ENUM,
    VOCABULARY,
)

TS = pl.Datetime("ms", "UTC")

GPU_SAMPLES_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "timestamp": TS,
    "gpu_uuid": pl.String,
    "gpu_instance_id": pl.Int32,
    "gpu_instance_profile": pl.String,
    "gpu_index": pl.Int32,
    "pci_bus_id": pl.String,
    "hostname": pl.String,
    "cluster": pl.String,
    "namespace": pl.String,
    "pod": pl.String,
    "container": pl.String,
    "hpc_job": pl.String,
    "gpu_model": pl.String,
    "driver_version": pl.String,
    **{c: pl.Float64 for c in FIELD_COLUMNS},
    "source_file": pl.String,
}

QUARANTINE_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "source_file": pl.String,
    "line": pl.Int64,
    "timestamp": TS,
    "reason": pl.String,
    "raw": pl.String,
    "field": pl.String,
    "record_kept": pl.Boolean,
}

INGEST_LOG_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "source_file": pl.String,
    "format": pl.String,
    "time_basis": pl.String,
    "sha256": pl.String,
    "rows_read": pl.Int64,
    "rows_accepted": pl.Int64,
    "rows_quarantined": pl.Int64,
    "rows_duplicate": pl.Int64,
    "lines_skipped": pl.Int64,
    "file_lines": pl.Int64,
    "file_bytes": pl.Int64,
    "first_sample": TS,
    "last_sample": TS,
    "origin": pl.String,  # the server and query a pulled file came from
    # header names the file's parser did not use (CSV formats), and the fields it gives
    "columns_ignored": pl.List(pl.String),
    "fields": pl.List(pl.String),
    "skip_reason": pl.String,  # why a listed file was not read (hidden files)
}

GPU_MINUTES_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "minute": TS,
    "gpu_uuid": pl.String,
    "gpu_instance_id": pl.Int32,
    "gpu_instance_profile": pl.String,
    "hostname": pl.String,
    "cluster": pl.String,
    "namespace": pl.String,
    "pod": pl.String,
    "hpc_job": pl.String,
    "gpu_model": pl.String,
    "samples": pl.UInt32,
    "gpu_util_pct": pl.Float64,
    "util_source": UTIL_SOURCE_ENUM,
    "power_w": pl.Float64,
    # the physical GPU's energy in the minute, Wh: the energy counter's increase, else power x 1 min
    "energy_wh": pl.Float64,
    "max_power_w": pl.Float64,
    "max_power_basis": POWER_BASIS_ENUM,
    "pif": pl.Float64,
    "achievable_tflops": pl.Float64,
    "realized_tflops": pl.Float64,
    "rfu_pct": pl.Float64,
    "efficiency_gap_pct": pl.Float64,
    "phase": PHASE_ENUM,
    "efficiency_class": CLASS_ENUM,
    "diagnosis": DIAGNOSIS_ENUM,
    "diagnosis_basis": DIAGNOSIS_BASIS_ENUM,
    "price_usd_per_hour": pl.Float64,
    # shares of the minute's utilization samples in each phase (sum to 1; the minute's own phase
    # when it has one sample, or its utilization does not come from samples of GPU_UTIL)
    **{f"phase_share_{p}": pl.Float64 for p in PHASES},
    # share of the physical GPU the row stands for in GPU-hours and cost (1; MIG: slices)
    "gpu_share": pl.Float64,
    "gpu_temp_c": pl.Float64,
    "fb_used_mib": pl.Float64,
    "prof_sm_active": pl.Float64,
    "prof_sm_occupancy": pl.Float64,
    "prof_pipe_tensor_active": pl.Float64,
    "prof_dram_active": pl.Float64,
    "pcie_rx_bytes_per_s": pl.Float64,
    "nvlink_rx_bytes_per_s": pl.Float64,
    "note": pl.String,
}

GPU_DAILY_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "gpu_uuid": pl.String,
    "gpu_instance_id": pl.Int32,
    "hostname": pl.String,
    "cluster": pl.String,
    "namespace": pl.String,
    "gpu_model": pl.String,
    "minutes": pl.UInt32,
    # minutes / 1,440 x 100: how much of the UTC day the GPU's data covers
    "coverage_pct": pl.Float64,
    "active_minutes": pl.UInt32,
    "bottlenecked_minutes": pl.UInt32,
    **{f"{p}_minutes": pl.UInt32 for p in PHASES},
    **{f"class_{c}_minutes": pl.UInt32 for c in EFFICIENCY_CLASSES},
    "avg_gpu_util_pct": pl.Float64,
    "avg_pif": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    "bottlenecked_day": pl.Boolean,
    # mean power x minutes of the physical GPU (null on MIG instance rows); idle: idle minutes
    "energy_kwh": pl.Float64,
    "idle_energy_kwh": pl.Float64,
}

HOURLY_FLEET_METRICS_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "hour": TS,
    "cluster": pl.String,
    "gpu_model": pl.String,
    "gpus": pl.UInt32,
    "gpu_minutes": pl.UInt32,
    "avg_gpu_util_pct": pl.Float64,
    "avg_pif": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    "avg_efficiency_gap_pct": pl.Float64,
    "avg_realized_tflops": pl.Float64,
    "pct_idle": pl.Float64,
    "pct_underutilized": pl.Float64,
    "pct_productive": pl.Float64,
    "pct_compute_bound": pl.Float64,
    "pct_unknown": pl.Float64,
}

# one row per day, the whole fleet (physical GPUs: a MIG GPU counts once)
FLEET_DAILY_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "gpus": pl.UInt32,
    "gpu_hours": pl.Float64,
    "avg_gpu_util_pct": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    "avg_efficiency_gap_pct": pl.Float64,
    "avg_pif": pl.Float64,
    **{f"pct_{p}": pl.Float64 for p in PHASES},
    "pct_active_bottlenecked": pl.Float64,
    # observed GPU-minutes / (GPUs seen x 1,440) x 100
    "observed_gpu_minutes": pl.UInt32,
    "expected_gpu_minutes": pl.UInt32,
    "coverage_pct": pl.Float64,
}

PERSISTENT_BOTTLENECKS_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "gpu_uuid": pl.String,
    "gpu_instance_id": pl.Int32,
    "hostname": pl.String,
    "cluster": pl.String,
    "namespace": pl.String,
    "gpu_model": pl.String,
    "window_days": pl.UInt32,
    "days_bottlenecked": pl.UInt32,
    "active_minutes": pl.UInt32,
    "bottlenecked_minutes": pl.UInt32,
    "bottleneck_share": pl.Float64,
}

PRICED_WASTE_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "cluster": pl.String,
    "namespace": pl.String,
    "gpu_model": pl.String,
    "gpus": pl.UInt32,
    "gpu_hours": pl.Float64,
    "price_usd_per_hour": pl.Float64,
    "cost_usd": pl.Float64,
    "productive_usd": pl.Float64,
    "idle_waste_usd": pl.Float64,
    "stall_waste_usd": pl.Float64,
    "headroom_waste_usd": pl.Float64,
    "unmeasured_usd": pl.Float64,
    "total_waste_usd": pl.Float64,
    "waste_frac": pl.Float64,
    "hourly_waste_usd": pl.Float64,
    "monthly_waste_usd": pl.Float64,
    "yearly_waste_usd": pl.Float64,
}

GPU_HEALTH_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "gpu_uuid": pl.String,
    "hostname": pl.String,
    "cluster": pl.String,
    "gpu_model": pl.String,
    "minutes": pl.UInt32,
    "hot_minutes": pl.UInt32,
    "max_temp_c": pl.Float64,
    "power_capped_minutes": pl.UInt32,
    "xid_error_samples": pl.UInt32,
    "xid_codes": pl.List(pl.Int64),
    "ecc_dbe_errors": pl.Float64,
    "row_remap_failures": pl.Float64,
    "status": pl.String,
    "reasons": pl.String,
}

STRAGGLERS_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "hour": TS,
    "namespace": pl.String,
    "pod": pl.String,
    "gpu_uuid": pl.String,
    "gpu_instance_id": pl.Int32,
    "hostname": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
    "pod_median": pl.Float64,
    "points_below": pl.Float64,
    "pod_gpus": pl.UInt32,
    # the pod-hour's spread (population std dev of its GPUs' values, points) and which rule
    # flagged the row: below_median, spread (the slowest GPU of a pod whose spread is too wide)
    "pod_stddev": pl.Float64,
    "rule": pl.String,
}

EFFICIENCY_ROI_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "scope": pl.String,
    "gpu_model": pl.String,
    "gpus": pl.UInt32,
    "avg_rfu_pct": pl.Float64,
    "target_rfu_pct": pl.Float64,
    "equivalent_gpus": pl.Float64,
    "monthly_value_usd": pl.Float64,
}

NAMESPACE_EFFICIENCY_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "namespace": pl.String,
    "gpus": pl.UInt32,
    "gpu_hours": pl.Float64,
    "avg_gpu_util_pct": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    "avg_efficiency_gap_pct": pl.Float64,
    "pct_idle": pl.Float64,
    "pct_active_bottlenecked": pl.Float64,
    "dominant_diagnosis": pl.String,
    "cost_usd": pl.Float64,
    "waste_usd": pl.Float64,
    "waste_frac": pl.Float64,
    # energy allocated like cost (a MIG instance: its slices' share), priced per cluster
    "energy_kwh": pl.Float64,
    "idle_energy_kwh": pl.Float64,
    "energy_usd": pl.Float64,
    "co2_kg": pl.Float64,
}

# day x cluster x namespace x workload (the pod's owner): priced_waste's money at the grain of
# the workloads, with namespace_efficiency's figures and the rules' first action
WORKLOAD_EFFICIENCY_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "cluster": pl.String,
    "namespace": pl.String,
    "workload": pl.String,
    "pods": pl.UInt32,
    "gpus": pl.UInt32,
    "gpu_hours": pl.Float64,
    "avg_gpu_util_pct": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    **{f"pct_{p}": pl.Float64 for p in PHASES},
    "cost_usd": pl.Float64,
    "productive_usd": pl.Float64,
    "idle_waste_usd": pl.Float64,
    "stall_waste_usd": pl.Float64,
    "headroom_waste_usd": pl.Float64,
    "unmeasured_usd": pl.Float64,
    "total_waste_usd": pl.Float64,
    "waste_frac": pl.Float64,
    "hourly_waste_usd": pl.Float64,
    "monthly_waste_usd": pl.Float64,
    "yearly_waste_usd": pl.Float64,
    "main_diagnosis": pl.String,
    "top_action": pl.String,
}

# month x cluster x namespace: the month's days of priced_waste summed, energy and RFU from the
# days' minutes; partitioned by the month's first day (`date`), so the same globs read it
NAMESPACE_MONTHLY_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "month": pl.String,
    "cluster": pl.String,
    "namespace": pl.String,
    "days_covered": pl.UInt32,
    "gpu_hours": pl.Float64,
    "cost_usd": pl.Float64,
    "productive_usd": pl.Float64,
    "idle_waste_usd": pl.Float64,
    "stall_waste_usd": pl.Float64,
    "headroom_waste_usd": pl.Float64,
    "unmeasured_usd": pl.Float64,
    "total_waste_usd": pl.Float64,
    "energy_kwh": pl.Float64,
    "avg_rfu_pct": pl.Float64,
    # the part of gpu_hours without a price (a model the price book lacks): its money is null
    "unpriced_gpu_hours": pl.Float64,
}

ACTION = pl.Struct(
    {"action": pl.String, "group": pl.String, "fraction": pl.Float64, "rationale": pl.String}
)
RECOMMENDATIONS_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date,
    "namespace": pl.String,
    "gpus": pl.UInt32,
    "gpu_hours": pl.Float64,
    "cost_usd": pl.Float64,
    "measured_waste_frac": pl.Float64,
    "actions": pl.List(pl.String),
    "action_details": pl.List(ACTION),
    "naive_sum_frac": pl.Float64,
    "utilization_savings_frac": pl.Float64,
    "rate_savings_frac": pl.Float64,
    "total_savings_frac": pl.Float64,
    "monthly_cost_usd": pl.Float64,
    "monthly_savings_usd": pl.Float64,
}

TABLES: dict[str, dict[str, pl.DataType]] = {
    "gpu_samples": GPU_SAMPLES_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "ingest_log": INGEST_LOG_SCHEMA,
    "gpu_minutes": GPU_MINUTES_SCHEMA,
    "gpu_daily": GPU_DAILY_SCHEMA,
    "hourly_fleet_metrics": HOURLY_FLEET_METRICS_SCHEMA,
    "fleet_daily": FLEET_DAILY_SCHEMA,
    "persistent_bottlenecks": PERSISTENT_BOTTLENECKS_SCHEMA,
    "priced_waste": PRICED_WASTE_SCHEMA,
    "recommendations": RECOMMENDATIONS_SCHEMA,
    "gpu_health": GPU_HEALTH_SCHEMA,
    "stragglers": STRAGGLERS_SCHEMA,
    "efficiency_roi": EFFICIENCY_ROI_SCHEMA,
    "namespace_efficiency": NAMESPACE_EFFICIENCY_SCHEMA,
    "workload_efficiency": WORKLOAD_EFFICIENCY_SCHEMA,
    "namespace_monthly": NAMESPACE_MONTHLY_SCHEMA,
}


def _model(
    schema: dict[str, pl.DataType],
    checks: dict[str, list[pa.Check]],
    required: set[str],
    unique: list[str] | None,
) -> pa.DataFrameSchema:
    cols = {
        c: pa.Column(t, checks=checks.get(c, []), nullable=c not in required, coerce=False)
        for c, t in schema.items()
    }
    return pa.DataFrameSchema(cols, strict=True, ordered=True, unique=unique)


def _range(lo: float | None, hi: float | None) -> list[pa.Check]:
    if lo is not None and hi is not None:
        return [pa.Check.in_range(lo, hi)]
    if lo is not None:
        return [pa.Check.ge(lo)]
    return [pa.Check.le(hi)] if hi is not None else []


GPU_SAMPLES_MODEL = _model(
    GPU_SAMPLES_SCHEMA,
    {
        "gpu_uuid": [pa.Check.str_matches(r"^GPU-[0-9a-z\-]+$")],
        **{f.column: _range(f.lo, f.hi) for f in FIELDS},
    },
    required={"date", "timestamp", "gpu_uuid", "cluster", "source_file"},
    unique=["gpu_uuid", "gpu_instance_id", "timestamp"],
)
QUARANTINE_MODEL = _model(QUARANTINE_SCHEMA, {}, {"date", "source_file", "reason"}, None)
INGEST_LOG_MODEL = _model(
    INGEST_LOG_SCHEMA,
    {
        c: [pa.Check.ge(0)]
        for c in ("rows_read", "rows_accepted", "rows_quarantined", "rows_duplicate")
    },
    {"date", "source_file", "format", "sha256", "rows_read"},
    ["source_file"],
)
GPU_MINUTES_MODEL = _model(
    GPU_MINUTES_SCHEMA,
    {
        "pif": [pa.Check.in_range(0, 1)],
        "rfu_pct": [pa.Check.in_range(0, 100)],
        "gpu_util_pct": [pa.Check.in_range(0, 100)],
        "gpu_share": [pa.Check.in_range(0, 1)],
        "phase": [pa.Check.isin(PHASES)],
        "efficiency_class": [pa.Check.isin(EFFICIENCY_CLASSES)],
        "diagnosis": [pa.Check.isin(DIAGNOSES)],
    },
    {"date", "minute", "gpu_uuid", "cluster", "phase", "gpu_share"},
    ["gpu_uuid", "gpu_instance_id", "minute"],
)

FLEET_DAILY_MODEL = _model(
    FLEET_DAILY_SCHEMA,
    {
        **{
            c: [pa.Check.in_range(0, 100)]
            for c in (
                "avg_gpu_util_pct",
                "avg_rfu_pct",
                *[f"pct_{p}" for p in PHASES],
                "pct_active_bottlenecked",
                "coverage_pct",
            )
        },
        "avg_efficiency_gap_pct": [pa.Check.in_range(-100, 100)],
        "avg_pif": [pa.Check.in_range(0, 1)],
        "gpus": [pa.Check.ge(1)],
        "gpu_hours": [pa.Check.ge(0)],
    },
    {"date", "gpus", "gpu_hours", "observed_gpu_minutes", "expected_gpu_minutes", "coverage_pct"}
    | {f"pct_{p}" for p in PHASES},
    ["date"],
)


def _only(names: tuple[str, ...]) -> pa.Check:
    """Every element of a list column is one of `names`."""
    return pa.Check(
        lambda data: data.lazyframe.select(
            pl.col(data.key).list.eval(pl.element().is_in(list(names))).list.all().fill_null(True)
        ),
        name=f"each in {', '.join(names)}",
    )


RECOMMENDATIONS_MODEL = _model(
    RECOMMENDATIONS_SCHEMA,
    {
        "actions": [_only(VOCABULARY)],
        **{
            c: [pa.Check.in_range(0, 1)]
            for c in (
                "utilization_savings_frac",
                "rate_savings_frac",
                "total_savings_frac",
                "measured_waste_frac",
            )
        },
    },
    {"date", "gpus", "gpu_hours"},
    ["namespace"],
)

# money may be a rounding error below zero (a split's remainder), never more
_MONEY = [pa.Check.ge(-1e-6)]
_PCT = [pa.Check.in_range(0, 100)]


def _money(schema: dict[str, pl.DataType]) -> dict[str, list[pa.Check]]:
    return {c: _MONEY for c in schema if c.endswith("_usd") or c.endswith("_kwh")}


GPU_DAILY_MODEL = _model(
    GPU_DAILY_SCHEMA,
    {
        **_money(GPU_DAILY_SCHEMA),
        **{c: _PCT for c in ("avg_gpu_util_pct", "avg_rfu_pct", "coverage_pct")},
        "avg_pif": [pa.Check.in_range(0, 1)],
        "minutes": [pa.Check.in_range(1, 1440)],
    },
    {"date", "gpu_uuid", "cluster", "minutes", "active_minutes", "bottlenecked_day"},
    ["gpu_uuid", "gpu_instance_id"],
)
HOURLY_FLEET_METRICS_MODEL = _model(
    HOURLY_FLEET_METRICS_SCHEMA,
    {
        **{c: _PCT for c in HOURLY_FLEET_METRICS_SCHEMA if c.startswith("pct_")},
        **{c: _PCT for c in ("avg_gpu_util_pct", "avg_rfu_pct")},
        "avg_pif": [pa.Check.in_range(0, 1)],
        "gpus": [pa.Check.ge(1)],
        "gpu_minutes": [pa.Check.ge(1)],
    },
    {"date", "hour", "cluster", "gpus", "gpu_minutes"},
    ["hour", "cluster", "gpu_model"],
)
PERSISTENT_BOTTLENECKS_MODEL = _model(
    PERSISTENT_BOTTLENECKS_SCHEMA,
    {"bottleneck_share": [pa.Check.in_range(0, 1)], "days_bottlenecked": [pa.Check.ge(1)]},
    {"date", "gpu_uuid", "window_days", "days_bottlenecked"},
    ["gpu_uuid", "gpu_instance_id"],
)
PRICED_WASTE_MODEL = _model(
    PRICED_WASTE_SCHEMA,
    {
        **_money(PRICED_WASTE_SCHEMA),
        "gpu_hours": [pa.Check.ge(0)],
        "waste_frac": [pa.Check.in_range(0, 1 + 1e-9)],
    },
    {"date", "cluster", "gpu_hours"},  # an unpriced model has no cost (null, never 0)
    ["cluster", "namespace", "gpu_model"],
)
GPU_HEALTH_MODEL = _model(
    GPU_HEALTH_SCHEMA,
    {"status": [pa.Check.isin(["ok", "warn", "drain"])], "minutes": [pa.Check.ge(1)]},
    {"date", "gpu_uuid", "minutes", "status"},
    ["gpu_uuid"],
)
STRAGGLERS_MODEL = _model(
    STRAGGLERS_SCHEMA,
    {
        # the rules that flagged the row, comma-separated
        "rule": [pa.Check.str_matches(r"^(below_median|spread)(, (below_median|spread))*$")],
        "pod_gpus": [pa.Check.ge(2)],
    },
    {"date", "hour", "gpu_uuid", "metric", "value", "rule"},
    ["hour", "namespace", "pod", "gpu_uuid", "gpu_instance_id", "metric"],
)
EFFICIENCY_ROI_MODEL = _model(
    EFFICIENCY_ROI_SCHEMA,
    {
        "scope": [pa.Check.isin(["model", "fleet"])],
        **{c: _PCT for c in ("avg_rfu_pct", "target_rfu_pct")},
    },
    {"date", "scope", "gpus"},
    ["scope", "gpu_model"],
)
NAMESPACE_EFFICIENCY_MODEL = _model(
    NAMESPACE_EFFICIENCY_SCHEMA,
    {
        **_money(NAMESPACE_EFFICIENCY_SCHEMA),
        **{
            c: _PCT
            for c in NAMESPACE_EFFICIENCY_SCHEMA
            if c.startswith("pct_") or c in ("avg_gpu_util_pct", "avg_rfu_pct")
        },
        "waste_frac": [pa.Check.in_range(0, 1 + 1e-9)],
        "co2_kg": _MONEY,
    },
    {"date", "gpus", "gpu_hours"},
    ["namespace"],
)

WORKLOAD_EFFICIENCY_MODEL = _model(
    WORKLOAD_EFFICIENCY_SCHEMA,
    {
        **_money(WORKLOAD_EFFICIENCY_SCHEMA),
        **{
            c: _PCT
            for c in WORKLOAD_EFFICIENCY_SCHEMA
            if c.startswith("pct_") or c in ("avg_gpu_util_pct", "avg_rfu_pct")
        },
        "gpus": [pa.Check.ge(1)],
        "pods": [pa.Check.ge(0)],
        "gpu_hours": [pa.Check.ge(0)],
        "waste_frac": [pa.Check.in_range(0, 1 + 1e-9)],
        "main_diagnosis": [pa.Check.isin(DIAGNOSES)],
        "top_action": [pa.Check.isin(VOCABULARY)],
    },
    {"date", "cluster", "pods", "gpus", "gpu_hours"},
    ["cluster", "namespace", "workload"],
)

NAMESPACE_MONTHLY_MODEL = _model(
    NAMESPACE_MONTHLY_SCHEMA,
    {
        **_money(NAMESPACE_MONTHLY_SCHEMA),
        "month": [pa.Check.str_matches(r"^\d{4}-\d{2}$")],
        "days_covered": [pa.Check.in_range(1, 31)],
        "gpu_hours": [pa.Check.ge(0)],
        "unpriced_gpu_hours": [pa.Check.ge(0)],
        "avg_rfu_pct": _PCT,
    },
    {"date", "month", "cluster", "days_covered", "gpu_hours", "unpriced_gpu_hours"},
    ["cluster", "namespace"],
)

# every table's model: checked on every write (`validate`, by the writer of each partition)
MODELS: dict[str, pa.DataFrameSchema] = {
    "gpu_samples": GPU_SAMPLES_MODEL,
    "quarantine": QUARANTINE_MODEL,
    "ingest_log": INGEST_LOG_MODEL,
    "gpu_minutes": GPU_MINUTES_MODEL,
    "gpu_daily": GPU_DAILY_MODEL,
    "hourly_fleet_metrics": HOURLY_FLEET_METRICS_MODEL,
    "fleet_daily": FLEET_DAILY_MODEL,
    "persistent_bottlenecks": PERSISTENT_BOTTLENECKS_MODEL,
    "priced_waste": PRICED_WASTE_MODEL,
    "recommendations": RECOMMENDATIONS_MODEL,
    "gpu_health": GPU_HEALTH_MODEL,
    "stragglers": STRAGGLERS_MODEL,
    "efficiency_roi": EFFICIENCY_ROI_MODEL,
    "namespace_efficiency": NAMESPACE_EFFICIENCY_MODEL,
    "workload_efficiency": WORKLOAD_EFFICIENCY_MODEL,
    "namespace_monthly": NAMESPACE_MONTHLY_MODEL,
}
assert set(MODELS) == set(TABLES), "every table needs a model"


class ContractError(ValueError):
    """A frame that breaks its table's contract; carries pandera's failure cases."""

    def __init__(self, table: str, failure_cases: pl.DataFrame):
        self.table = table
        self.failure_cases = failure_cases
        super().__init__(
            f"{table}: {failure_cases.height} contract failure(s):\n{failure_cases.head(10)}"
        )


class MissingColumns(ValueError):
    """A table computed without some of its contract's columns (a mart that forgot one)."""


# columns a table's rows may lack (filled with nulls): the telemetry fields and labels a landing
# file does not give
OPTIONAL_COLUMNS: dict[str, frozenset[str]] = {
    "gpu_samples": frozenset(FIELD_COLUMNS)
    | frozenset(c for c in GPU_SAMPLES_SCHEMA if c not in ("date", "timestamp", "gpu_uuid"))
}


def to_contract(lf: pl.LazyFrame, table: str) -> pl.LazyFrame:
    """`lf` as `table`'s contract: its columns in order and types. A contract column `lf` lacks
    is an error (MissingColumns), never a column of nulls, except those OPTIONAL_COLUMNS allows."""
    schema = TABLES[table]
    have = set(lf.collect_schema().names())
    missing = [c for c in schema if c not in have and c not in OPTIONAL_COLUMNS.get(table, ())]
    if missing:
        raise MissingColumns(f"{table} computed without its column(s) {', '.join(missing)}")
    return lf.select(_contract_columns(table, frozenset(c for c in schema if c in have)))


@functools.cache
def _contract_columns(table: str, have: frozenset[str]) -> tuple[pl.Expr, ...]:
    """`to_contract`'s columns, built once per table and set of columns present: a cast to an
    Enum builds its categories in Python (~1 ms for gpu_minutes' 45 columns, once per chunk of
    a staging pass when built each time). Expressions are immutable: one tuple serves every
    query."""
    return tuple(
        (pl.col(c) if c in have else pl.lit(None)).cast(t).alias(c)
        for c, t in TABLES[table].items()
    )


# frames streamed chunk by chunk are validated in batches of up to this many rows: small frames
# joined, so that a validation's fixed cost is paid once for many (it was ~0.1 s a frame when
# pandera ran every validation; `passes` decides a valid frame in one query now, ~40 ms for a
# 218,000-row range); a frame this large or larger is validated alone, not copied into a
# batch (batches of at least 524,288 rows joined three ranges into a copy; the 10,000-GPU day's
# ingest step peaked at 1,042 MiB after this, 1,055 before: benchmarks/README.md, issue 34)
VALIDATE_BATCH_ROWS = 262_144


def validated_batches(
    table: str, frames: Iterable[pl.DataFrame], rows: int = VALIDATE_BATCH_ROWS
) -> Iterator[pl.DataFrame]:
    """`frames` validated against `table`'s model, consecutive frames joined into batches of up
    to `rows` rows (a frame of more rows alone): the same rows in the same order."""
    batch: list[pl.DataFrame] = []
    size = 0
    for df in frames:
        if batch and size + df.height > rows:
            yield validate(table, pl.concat(batch))
            batch, size = [], 0
        batch.append(df)
        size += df.height
    if batch:
        yield validate(table, pl.concat(batch))


def validate(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """Validate a collected frame against its pandera model; raise ContractError with all failures.

    Every check of the model is evaluated first in one query (`passes`); a frame that passes
    them all is the frame pandera returns. Pandera itself runs a query per check (~55 on a
    gpu_samples frame, ~0.15 s a batch however small): it runs only when something fails, to
    word the failure cases (issue 34: a day's validations 1.8 s)."""
    model = MODELS[table]
    if passes(model, df):
        return df
    try:
        return model.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        fc = e.failure_cases
        raise ContractError(
            table, fc if isinstance(fc, pl.DataFrame) else pl.DataFrame(fc)
        ) from None


def passes(model: pa.DataFrameSchema, df: pl.DataFrame) -> bool:
    """Whether `df` passes every check `model.validate` runs, evaluated in one query: its
    columns by name and order (strict, ordered), their types, non-null columns without nulls
    (or NaN), each column check as pandera evaluates it (its own check function, nulls passing
    where the check ignores them) and the unique columns. False also when the model holds what
    this does not evaluate (checks of the frame, grouped or element-wise, coercion): pandera
    then decides."""
    from functools import partial

    from pandera.api.function_dispatch import Dispatcher
    from pandera.api.polars.types import PolarsData
    from pandera.backends.polars.checks import PolarsCheckBackend
    from pandera.constants import CHECK_OUTPUT_KEY

    cols = model.columns
    if model.checks or model.coerce or list(df.columns) != list(cols):
        return False
    model.register_default_backends(pl.LazyFrame)  # the check functions pandera would run
    lf, parts = df.lazy(), []
    for name, col in cols.items():
        got = df.schema[name]
        if col.coerce or col.regex or col.dtype is None:
            return False
        want = col.dtype.type
        if not (got == want and repr(got) == repr(want)):
            return False
        if not col.nullable:
            ok = pl.col(name).is_not_null()
            parts.append(ok & pl.col(name).is_not_nan() if got.is_float() else ok)
        for check in col.checks:
            if check.element_wise or check.groupby is not None:
                return False
            backend = check.get_backend(lf)
            if backend is not PolarsCheckBackend:
                return False
            backend = backend(check)
            if isinstance(check._check_fn, Dispatcher):  # a built-in: as registered now
                fn = check.get_builtin_check_fn(check.name)  # (a schema holds a copy of its past)
                backend.check_fn = partial(fn, **check._check_kwargs)
            out = backend.apply(PolarsData(lf, name))
            if isinstance(out, bool):
                if not out:
                    return False
                continue
            v = out.collect_schema().names()
            if v != [CHECK_OUTPUT_KEY]:
                return False
            v = pl.col(CHECK_OUTPUT_KEY)
            parts.append(out.select((v | v.is_null()) if check.ignore_na else v.fill_null(False)))
    exprs = [p.all().alias(f"_{i}") for i, p in enumerate(parts) if isinstance(p, pl.Expr)]
    frames = [
        f.select(pl.col(CHECK_OUTPUT_KEY).all().alias(f"_c{i}"))
        for i, f in enumerate(parts)
        if isinstance(f, pl.LazyFrame)
    ]
    if model.unique:
        exprs.append(~pl.struct(list(model.unique)).is_duplicated().any().alias("_unique"))
    queries = ([lf.select(exprs)] if exprs else []) + frames
    if not queries:
        return True
    row = pl.concat(queries, how="horizontal").collect().row(0)
    return all(v is True for v in row)
