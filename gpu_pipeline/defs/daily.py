"""What every daily asset shares: the partitions, the backfill policy, day-by-day writes.

A run covers one day (schedule, the UI's "Materialize" of a day) or a range of days (a run of a
UI or sensor backfill, at most `GPU_PIPELINE_BACKFILL_DAYS` of them; `gpu-pipeline materialize`,
its whole range): assets loop over the days of their partition time window and replace each
day's partition atomically, keeping only counters in memory.
Dagster records one materialization per partition of the range; each carries its own day's
metadata (`context.add_asset_metadata(..., partition_key=day)`): row count, path, preview.
"""

import warnings
from collections.abc import Iterable, Iterator
from datetime import date, timedelta

import dagster as dg
import polars as pl

from gpu_pipeline import allocator
from gpu_pipeline.defs.metadata import spec_metadata, table_metadata
from gpu_pipeline.defs.partitions import DEFAULT, daily_partitions
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.rules import Rules
from gpu_pipeline.lib.schemas import validate

# a backfill fans out into runs of up to `backfill_days` days each (defs/partitions.py
# `backfill_policy`); every daily asset and its checks share this one policy (build_definitions
# rebinds it to the settings'). Dagster 1.13 marks `backfill_policy` beta.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy`", category=dg.BetaWarning)
BACKFILL_POLICY = DEFAULT.backfill_policy


def daily(table: str | None, group: str, **kwargs) -> dict:
    """Keyword arguments for a daily-partitioned asset of `group` (and its column schema)."""
    out = {
        "partitions_def": daily_partitions,
        "backfill_policy": BACKFILL_POLICY,
        "group_name": group,
        **kwargs,
    }
    if table:
        out["metadata"] = spec_metadata(table)
    return out


def partition_days(context: dg.AssetExecutionContext) -> list[date]:
    window = context.partition_time_window
    first, end = window.start.date(), window.end.date()
    return [first + timedelta(days=i) for i in range((end - first).days)]


def day_metadata(
    context: dg.AssetExecutionContext, day: date, metadata: dict, asset_key: str | None = None
) -> None:
    """`metadata` for `day`'s own materialization (of `asset_key` in a multi-asset)."""
    context.add_asset_metadata(metadata, asset_key=asset_key, partition_key=day.isoformat())


class DayWriter:
    """Writes a table's days one at a time and describes each day for the UI. Each partition
    names the ingest it was made from (`Lake.lineage`): the one of `source`, the table it is
    computed from, unless the write gives its own (the raw tables: the ingest itself)."""

    def __init__(self, lake: Lake, table: str, source: str | None = None):
        self.lake, self.table, self.source = lake, table, source
        self.rows: dict[date, int] = {}
        # per day: the first rows (the preview) and the partition file
        self.days: dict[date, tuple[pl.DataFrame, object]] = {}
        self.lineages: dict[date, str | None] = {}

    def _lineage(self, day: date, lineage: str | None) -> str | None:
        if lineage is None and self.source:
            lineage = self.lake.lineage(self.source, day)
        self.lineages[day] = lineage
        return lineage

    def write(self, day: date, df: pl.DataFrame, lineage: str | None = None) -> pl.DataFrame:
        """Validate `df` against its table's model and write it as the day's partition."""
        df = validate(self.table, df)
        path = self.lake.write(self.table, day, df, self._lineage(day, lineage))
        self.rows[day] = df.height
        self.days[day] = (df.head(10), path)
        return df

    def write_frames(
        self, day: date, frames: Iterable[pl.DataFrame], lineage: str | None = None
    ) -> None:
        """Stream a day written a chunk at a time, each frame validated by the caller (in
        batches: `schemas.validated_batches`, or a chunk at a time)."""
        first: list[pl.DataFrame] = []

        def keep_first(frames: Iterable[pl.DataFrame]) -> Iterator[pl.DataFrame]:
            for df in frames:
                if not first:
                    first.append(df.head(10))
                yield df

        path, rows = self.lake.write_frames(
            self.table, day, keep_first(frames), self._lineage(day, lineage)
        )
        self.rows[day] = rows
        self.days[day] = (first[0] if first else pl.DataFrame(), path)

    def result(
        self,
        context: dg.AssetExecutionContext,
        rules: Rules | None = None,
        per_day: dict[date, dict] | None = None,
    ) -> dg.MaterializeResult:
        """Each day's materialization gets its own row count, path and preview (and its entry
        of `per_day`); what all days share (`rules`: the thresholds the table was computed
        with) is the run's."""
        for day, (head, path) in self.days.items():
            meta = table_metadata(head, path, self.rows[day]) | (per_day or {}).get(day, {})
            day_metadata(context, day, meta, self.table)
        shared = {} if rules is None else {"rules": dg.MetadataValue.json(rules.flat())}
        allocator.release()  # the step's freed buffers are not carried into the next step
        return dg.MaterializeResult(asset_key=self.table, metadata=shared)
