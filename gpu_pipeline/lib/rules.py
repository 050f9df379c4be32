"""The metric thresholds of SPEC.md, defined once; every transform and test reads them here."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Thresholds:
    # phase by minute-mean utilization: idle < 10 <= underutilized < 70 <= productive < 90 <= compute_bound
    idle_below: float = 10.0
    productive_from: float = 70.0
    compute_bound_from: float = 90.0
    # efficiency class
    inefficient_below: float = 30.0
    bottleneck_pif_below: float = 0.4
    efficient_pif_from: float = 0.6
    # a GPU-day is bottlenecked with >= 60 active minutes, >= 50 % of them bottlenecked
    day_min_active_minutes: int = 60
    day_min_bottleneck_share: float = 0.5
    # persistent: >= 3 bottlenecked days within D-6..D
    window_days: int = 7
    persistent_min_days: int = 3


DEFAULT = Thresholds()

# a minute without any utilization reading (nvidia-smi under MIG reports `[N/A]`) is still a
# GPU-minute: its phase is `unknown`, so the phase shares of every group still sum to 100
PHASES = ("idle", "underutilized", "productive", "compute_bound", "unknown")
MEASURED_PHASES = PHASES[:4]
EFFICIENCY_CLASSES = ("idle", "bottlenecked", "efficient", "inefficient", "moderate")


@dataclass(frozen=True)
class DiagnosisThresholds:
    """The profiling decision tree (DOMAIN.md): SM activity first, then DRAM, tensor, occupancy."""

    sm_underfed_below: float = 0.30  # SM active < 30 %: the GPU is under-fed
    sm_busy_from: float = 0.70  # > 70 %: compute or memory bound
    dram_bound_from: float = 0.80  # DRAM active > 80 %: memory bound
    tensor_unused_below: float = 0.05  # tensor pipe ~0 while busy: no mixed precision
    occupancy_low_below: float = 0.20  # resident warps / max: kernels or batches too small
    nvlink_busy_from: float = (
        5e9  # NVLink RX bytes/s that make an under-fed GPU communication-bound
    )
    pcie_busy_from: float = 1e9  # PCIe RX bytes/s: the host is pushing data (data loading)


DIAGNOSIS = DiagnosisThresholds()
DIAGNOSES = (
    "idle",
    "data_starved",
    "communication_bound",
    "memory_bound",
    "compute_bound",
    "tensor_cores_unused",
    "low_occupancy",
    "mixed",
    "unknown",
)
# the diagnoses a recommendation rule can act on (not idle, mixed or unknown)
BOTTLENECK_DIAGNOSES = DIAGNOSES[1:7]

# GPU-level health and stragglers
HOT_FROM_C = 85.0
POWER_CAPPED_FROM = 0.98  # power at >= 98 % of its limit
STRAGGLER_POINTS = 15.0  # an hour this far below its pod's median
ROI_TARGET_RFU_PCT = 60.0


# Categorical columns are Enums: one byte a row instead of a string, and cheap to compare
UTIL_SOURCES = ("gpu_util", "prof_gr_engine_active", "mig_instances")
POWER_BASES = ("catalog", "power_limit")
DIAGNOSIS_BASES = ("dcgm_profiling", "utilization", "none")
PHASE_ENUM = pl.Enum(PHASES)
CLASS_ENUM = pl.Enum(EFFICIENCY_CLASSES)
DIAGNOSIS_ENUM = pl.Enum(DIAGNOSES)
UTIL_SOURCE_ENUM = pl.Enum(UTIL_SOURCES)
POWER_BASIS_ENUM = pl.Enum(POWER_BASES)
DIAGNOSIS_BASIS_ENUM = pl.Enum(DIAGNOSIS_BASES)
