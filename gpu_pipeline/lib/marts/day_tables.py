"""The tables of a day computed from its minute runs (`staging/minute_runs.py`): gpu_daily and
the marts that are small group-bys of the runs (hourly_fleet_metrics, priced_waste, fleet_daily).

The staging pass (`staging/chunked.py`) hands each chunk's gpu_minutes to `DayTables.add` as it
streams them into the lake; runs never span two chunks (they belong to one GPU), so the tables
of the runs of all chunks are those of the day processed at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.rules import DEFAULT, Thresholds
from gpu_pipeline.lib.samples import collect_all_stable, collect_stable
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.minute_runs import minute_runs


@dataclass
class DayTables:
    """What a day's chunks add up to: their minute runs, from which gpu_daily and the three
    marts are computed (runs never span two chunks: they belong to one GPU).

    A chunk's runs are all that is computed when it is added (on the thread that hands the next
    chunk over, the critical path); the four tables are small group-bys of all the runs,
    computed together at the end, in one call."""

    t: Thresholds = DEFAULT
    runs: list[pl.DataFrame] = field(default_factory=list)
    minutes_rows: int = 0
    chunks: int = 0
    _tables: tuple[pl.DataFrame, ...] | None = field(default=None, init=False, repr=False)

    def add(self, minutes: pl.DataFrame) -> pl.DataFrame:
        """Take in one chunk's gpu_minutes (whole GPUs); returns it unchanged."""
        self.runs.append(collect_stable(minute_runs(minutes.lazy(), self.t)))
        self.minutes_rows += minutes.height
        self.chunks += 1
        self._tables = None
        return minutes

    def _runs(self) -> pl.LazyFrame:
        if not self.runs:
            return minute_runs(pl.LazyFrame(schema=GPU_MINUTES_SCHEMA), self.t)
        return pl.concat(self.runs).lazy()

    def _all(self) -> tuple[pl.DataFrame, ...]:
        if self._tables is None:
            runs = self._runs()
            # one call, so the group-bys run side by side (each still sums in row order)
            self._tables = tuple(
                collect_all_stable(
                    [
                        gpu_daily(runs, self.t),
                        hourly_fleet_metrics(runs),
                        priced_waste(runs),
                        fleet_daily(runs),
                    ]
                )
            )
        return self._tables

    def gpu_daily(self) -> pl.DataFrame:
        """gpu_daily in (GPU, instance) order."""
        return self._all()[0]

    def hourly_fleet_metrics(self) -> pl.DataFrame:
        return self._all()[1]

    def priced_waste(self) -> pl.DataFrame:
        return self._all()[2]

    def fleet_daily(self) -> pl.DataFrame:
        """One row for the day (none for a day without GPU-minutes)."""
        return self._all()[3]
