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
"""

from datetime import UTC, date, datetime, timedelta

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
    return month_of_days(priced, minutes, month, chunking), days


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
    for month in partition_months(context):
        df, days = compute_month(store, month, lake.chunking())
        df = validate(TABLE, df)
        path = store.write(TABLE, month, df)
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
