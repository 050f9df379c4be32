"""The metric thresholds of SPEC.md, defined once; every transform and test reads them here."""

from __future__ import annotations

from dataclasses import dataclass


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

PHASES = ("idle", "underutilized", "productive", "compute_bound")
EFFICIENCY_CLASSES = ("idle", "bottlenecked", "efficient", "inefficient", "moderate")
