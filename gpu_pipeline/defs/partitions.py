"""The project's partitioning: UTC days from a first day, and the window of days a day's
persistence reads. Nothing here reads the environment: `build_definitions(settings)` makes the
`Partitioning` of its settings and binds every asset, job and sensor to it; the modules' own
objects (what tests load directly) are bound to the defaults."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache

import dagster as dg

from gpu_pipeline.lib.marts.namespace_monthly import MONTH_FORMAT
from gpu_pipeline.lib.rules import DEFAULT as DEFAULT_THRESHOLDS
from gpu_pipeline.settings import DEFAULT_BACKFILL_DAYS, DEFAULT_START_DATE, Settings


@cache
def daily(start_date: str) -> dg.DailyPartitionsDefinition:
    """UTC days from `start_date` (one object per start date: Dagster compares them)."""
    return dg.DailyPartitionsDefinition(start_date=start_date, timezone="UTC")


@cache
def monthly(start_date: str) -> dg.MonthlyPartitionsDefinition:
    """UTC calendar months (`2024-01`) from the month of `start_date`, the current one included
    (`end_offset=1`): it is the month to date, re-run as its days arrive."""
    first = start_date[:7]  # YYYY-MM: the month of the first day, whatever its day
    return dg.MonthlyPartitionsDefinition(
        start_date=first, fmt=MONTH_FORMAT, timezone="UTC", end_offset=1
    )


@cache
def days_of_month() -> dg.TimeWindowPartitionMapping:
    """A month reads its days (Dagster's default mapping between a daily and a monthly
    partitioning), those that exist: the month to date's later days, and a first month's days
    before the first day, have no partition. (`allow_nonexistent_upstream_partitions` is beta
    in Dagster 1.13.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(allow_nonexistent_upstream_partitions=True)


@cache
def window(days: int) -> dg.TimeWindowPartitionMapping:
    """Day D reads the `days` days D-(days-1)..D of its upstream; days before the first
    partition simply don't exist. (`allow_nonexistent_upstream_partitions` is marked beta in
    Dagster 1.13; it is what the first days need.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(
            start_offset=-(days - 1), end_offset=0, allow_nonexistent_upstream_partitions=True
        )


@cache
def backfill_policy(days: int) -> dg.BackfillPolicy:
    """A backfill of N days from the UI or the sensor: ceil(N / `days`) runs per group of
    assets, queued on the instance's run queue (`run_queue` in dagster.yaml), each looping over
    its days. `gpu-pipeline materialize` runs its range as one run whatever this says.

    Days may run in parallel and out of order. The one asset that reads other days,
    persistent_bottlenecks (gpu_daily of D-6..D through `window`), is not simple to Dagster's
    backfill daemon once a backfill spans more than one run: its days are requested only after
    every gpu_daily day of their window that the backfill targets is materialized, so D never
    runs before D-1's gpu_daily (tests/test_fanout.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.BackfillPolicy.multi_run(max_partitions_per_run=days)


@dataclass(frozen=True)
class Partitioning:
    """The first day, the persistence window, how often the landing-zone sensor looks and how
    many days a backfill's run covers."""

    start_date: str = DEFAULT_START_DATE
    window_days: int = DEFAULT_THRESHOLDS.window_days
    sensor_interval_s: int = Settings.sensor_interval_s
    backfill_days: int = DEFAULT_BACKFILL_DAYS

    @property
    def daily(self) -> dg.DailyPartitionsDefinition:
        return daily(self.start_date)

    @property
    def monthly(self) -> dg.MonthlyPartitionsDefinition:
        return monthly(self.start_date)

    @property
    def window(self) -> dg.TimeWindowPartitionMapping:
        return window(self.window_days)

    @property
    def backfill_policy(self) -> dg.BackfillPolicy:
        return backfill_policy(self.backfill_days)

    @classmethod
    def of(cls, s: Settings) -> Partitioning:
        """The partitioning of settings `s` (the window from its rules file)."""
        from gpu_pipeline.lib.rules import load_rules

        return cls(
            start_date=s.start_date,
            window_days=load_rules(s.rules or None).thresholds.window_days,
            sensor_interval_s=s.sensor_interval_s,
            backfill_days=s.backfill_days,
        )


DEFAULT = Partitioning()
# the default days, which the modules' assets are built with
daily_partitions = DEFAULT.daily
monthly_partitions = DEFAULT.monthly
