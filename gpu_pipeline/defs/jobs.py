"""The daily job over every partitioned asset, and its schedule (yesterday's UTC day)."""

import dagster as dg

from gpu_pipeline.defs.partitions import DEFAULT, Partitioning
from gpu_pipeline.defs.sensors import freshness_checks


def build_jobs(p: Partitioning, freshness: dg.AssetChecksDefinition) -> tuple:
    """The daily job of partitioning `p` and its schedule."""
    job = dg.define_asset_job(
        "daily_pipeline",
        # the daily assets: not the views file, not the (unpartitioned) parse cache. Freshness
        # is judged by its own sensor (freshness_checks_sensor), not at the end of a run: a
        # backfill of last year's days says nothing about whether yesterday is late. Not the
        # months (one job, one partitioning: they have their own, defs/monthly.py)
        selection=dg.AssetSelection.all()
        - dg.AssetSelection.groups("warehouse", "monthly")
        - dg.AssetSelection.keys("landing_files")
        - dg.AssetSelection.checks(freshness),
        partitions_def=p.daily,
    )
    schedule = dg.build_schedule_from_partitioned_job(
        job, hour_of_day=2, minute_of_hour=0, name="daily_pipeline_schedule"
    )
    return job, schedule


daily_pipeline, daily_schedule = build_jobs(DEFAULT, freshness_checks)
