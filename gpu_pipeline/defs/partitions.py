"""The one partitioning of the project: UTC days from GPU_PIPELINE_START_DATE."""

import dagster as dg

from gpu_pipeline.settings import current

daily_partitions = dg.DailyPartitionsDefinition(start_date=current().start_date, timezone="UTC")
