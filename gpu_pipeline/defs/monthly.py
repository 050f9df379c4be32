"""The monthly showback: `namespace_monthly` on UTC calendar months, made from the months' days.

Its partitions are months (`2024-01`; the current month is the month to date) that depend on
the days of `priced_waste` and `gpu_minutes` through Dagster's daily-to-monthly time-window
mapping, so:
- a UI backfill of days whose selection holds this asset ("Materialize all") targets the
  months of those days too, run once their days are written (the backfill's dependency order);
- `MONTH_FOLLOWS_ITS_DAYS`: once `monthly_automation_sensor` is on, a month whose days were
  written since it last ran (a late day, the schedule's yesterday, a backfill of days only) is
  run again once none of its days is being written;
- `gpu-pipeline materialize` runs the months of its days after them (`runs.py`).
The daily job cannot hold it (one job, one partitioning): it has a job of its own.

A month's partition is `<lake>/namespace_monthly/date=<first day>/data.parquet`, with `date`
and `month` columns: the lake's and the views' globs read it like any table.

A month is read and written holding the lake's lock on every day of it (`Lake.day_locks`: a
file lock, or on an S3 lake an S3 lock), so it never reads a day while a daily run rewrites it
(the day's priced_waste of one ingest, its gpu_minutes of another), and two runs of one month
write it one after the other (both hold all its days, its first one the day its partition is
named after). The days are taken in date order, as the daily runs take theirs, each run's set
in one go: no two runs deadlock. A month's run holds no day lock before (`resources.run_days`:
none for a month), and a run that holds days never builds a month inside it (the CLI runs the
months after its days' run has ended): a process never waits for a lock it holds itself.
"""

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl

from gpu_pipeline.defs.daily import BACKFILL_POLICY
from gpu_pipeline.defs.metadata import spec_metadata, table_metadata
from gpu_pipeline.defs.partitions import DEFAULT, Partitioning, days_of_month, monthly_partitions
from gpu_pipeline.defs.resources import LakeResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.namespace_monthly import (
    MONTH_FORMAT,
    month_days,
    month_of_days,
)
from gpu_pipeline.lib.schemas import validate
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking

GROUP = "monthly"
TABLE = "namespace_monthly"
# the daily marts a month is made from
SOURCES = ("priced_waste", "gpu_minutes")

# a month runs again when one of its days was written since it last ran (or was requested), and
# not while a run or backfill still writes one of its days; every month, not only the latest
# (AutomationCondition.eager() looks at the latest time window only, and waits for all of its
# days, which the month to date never has)
MONTH_FOLLOWS_ITS_DAYS = (
    dg.AutomationCondition.any_deps_updated().since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("a day of the month was written")


def partition_months(context: dg.AssetExecutionContext) -> list[date]:
    """The first days of the months of the run's partition (or range of them)."""
    window = context.partition_time_window
    month, end = window.start.date(), window.end.date()
    months = []
    while month < end:
        months.append(month)
        month = (month + timedelta(days=31)).replace(day=1)
    return months


def compute_month(
    lake: Lake, month: date, chunking: Chunking = DEFAULT_CHUNKING
) -> tuple[pl.DataFrame, list[date]]:
    """The month's namespace_monthly from the lake's days of it, and those days. The minutes
    are read a day and a chunk of GPUs at a time (only the columns the sums need), reduced to
    the day's usage."""
    days = [d for d in month_days(month) if lake.exists("priced_waste", d)]
    priced = lake.read_days("priced_waste", days).lazy()
    minutes = (lake.scan_days("gpu_minutes", [d]) for d in days)
    with lake.reading("gpu_minutes", days):  # a page that does not decode is named
        return month_of_days(priced, minutes, month, chunking), days


def write_month(
    lake: Lake,
    month: date,
    chunking: Chunking = DEFAULT_CHUNKING,
    waiting: Callable[[date], None] | None = None,
) -> tuple[pl.DataFrame, list[date], Path | str]:
    """Make the month's namespace_monthly from its days and write it, holding the lock of every
    day of the month (`Lake.day_locks`, in date order: a daily run of one of them waits, or is
    waited for; `waiting(day)` when a day is held by another run). The rows, the days they
    cover and the file."""
    with lake.day_locks(month_days(month), waiting):
        df, days = compute_month(lake, month, chunking)
        df = validate(TABLE, df)
        return df, days, lake.write(TABLE, month, df)


def waiting_line(
    context: dg.AssetExecutionContext, month: date, root: str
) -> Callable[[date], None]:
    """What a month's run says when a day of it is held by another run (`write_month`)."""

    def waiting(day: date) -> None:
        context.log.info(
            f"{month.strftime(MONTH_FORMAT)}: waiting for another run writing {day} in {root} "
            "to finish (one writer per day; a month reads its days under their locks)"
        )

    return waiting


def month_metadata(month: date, days: list[date], today: date) -> dict:
    """What the UI shows of a month: how many of its days it covers, and whether it is the
    month to date (the days so far) or a month that is over."""
    n = len(month_days(month))
    to_date = month <= today < month + timedelta(days=n)
    return {
        "days_covered": dg.MetadataValue.int(len(days)),
        "days_in_month": dg.MetadataValue.int(n),
        "month_to_date": dg.MetadataValue.bool(to_date),
        "days": dg.MetadataValue.text(f"{days[0]}..{days[-1]}" if days else "none yet"),
    }


@dg.asset(
    name=TABLE,
    group_name=GROUP,
    partitions_def=monthly_partitions,
    backfill_policy=BACKFILL_POLICY,
    deps=[dg.AssetDep(s, partition_mapping=days_of_month()) for s in SOURCES],
    automation_condition=MONTH_FOLLOWS_ITS_DAYS,
    metadata=spec_metadata(TABLE),
    kinds={"parquet"},
)
def namespace_monthly(context: dg.AssetExecutionContext, lake: LakeResource):
    """Month x cluster x namespace showback: GPU-hours, cost, waste by kind, energy, RFU, days covered (the current month: to date)."""
    store = lake.open()
    today = datetime.now(UTC).date()
    for month in partition_months(context):  # one month's days locked at a time
        waiting = waiting_line(context, month, lake.root)
        df, days, path = write_month(store, month, lake.chunking(), waiting)
        meta = table_metadata(df.head(10), path, df.height) | month_metadata(month, days, today)
        context.add_asset_metadata(meta, partition_key=month.strftime(MONTH_FORMAT))
        context.log.info(f"{month.strftime(MONTH_FORMAT)}: {len(days)} day(s), {df.height} rows")
    return dg.MaterializeResult(asset_key=TABLE)


def build_monthly_job(p: Partitioning):
    """The months of partitioning `p`: what `gpu-pipeline materialize` runs after its days,
    and what a user can launch alone."""
    return dg.define_asset_job(
        "namespace_monthly_job", selection=dg.AssetSelection.groups(GROUP), partitions_def=p.monthly
    )


namespace_monthly_job = build_monthly_job(DEFAULT)

# evaluates MONTH_FOLLOWS_ITS_DAYS (off until turned on, like the landing-zone sensor: it
# launches runs); Dagster would otherwise make a default_automation_condition_sensor
monthly_automation_sensor = dg.AutomationConditionSensorDefinition(
    "monthly_automation_sensor",
    target=dg.AssetSelection.groups(GROUP),
    default_status=dg.DefaultSensorStatus.STOPPED,
)
