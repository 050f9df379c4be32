"""The daily job over every partitioned asset, and its schedule (yesterday's UTC day)."""

import dagster as dg

from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.sensors import freshness_checks

daily_pipeline = dg.define_asset_job(
    "daily_pipeline",
    # the daily assets: not the views file, not the (unpartitioned) parse cache. Freshness is
    # judged by its own sensor (freshness_checks_sensor), not at the end of a run: a backfill of
    # last year's days says nothing about whether yesterday is late
    selection=dg.AssetSelection.all()
    - dg.AssetSelection.groups("warehouse")
    - dg.AssetSelection.keys("landing_files")
    - dg.AssetSelection.checks(freshness_checks),
    partitions_def=daily_partitions,
)

daily_schedule = dg.build_schedule_from_partitioned_job(
    daily_pipeline, hour_of_day=2, minute_of_hour=0, name="daily_pipeline_schedule"
)
