"""Marts: hourly fleet metrics, persistent bottlenecks, priced waste."""

import warnings

import dagster as dg

from gpu_pipeline.defs.metadata import publish, spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource
from gpu_pipeline.lib import marts
from gpu_pipeline.lib.rules import DEFAULT
from gpu_pipeline.lib.samples import collect_stable

# D's persistence reads the GPU-days D-6..D; days before the first partition simply don't exist.
# (allow_nonexistent_upstream_partitions is marked beta in Dagster 1.13; it is what first days need.)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    SEVEN_DAY_WINDOW = dg.TimeWindowPartitionMapping(
        start_offset=-(DEFAULT.window_days - 1),
        end_offset=0,
        allow_nonexistent_upstream_partitions=True,
    )


def _day(context: dg.AssetExecutionContext):
    return context.partition_time_window.start.date()


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("hourly_fleet_metrics"),
)
def hourly_fleet_metrics(context: dg.AssetExecutionContext, lake: LakeResource):
    """Hour x cluster x GPU model: GPUs, GPU-minutes, average util/PIF/RFU/gap/TFLOPS and phase shares."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(marts.hourly_fleet_metrics(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "hourly_fleet_metrics", day, df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=[dg.AssetDep("gpu_daily", partition_mapping=SEVEN_DAY_WINDOW)],
    metadata=spec_metadata("persistent_bottlenecks"),
)
def persistent_bottlenecks(context: dg.AssetExecutionContext, lake: LakeResource):
    """GPUs bottlenecked on at least 3 of the last 7 days (D-6..D)."""
    the_lake, day = lake.lake(), _day(context)
    daily = the_lake.scan_days("gpu_daily", marts.window(day))
    df = collect_stable(marts.persistent_bottlenecks(daily, day))
    return publish(the_lake, "persistent_bottlenecks", day, df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("priced_waste"),
)
def priced_waste(context: dg.AssetExecutionContext, lake: LakeResource):
    """Day x cluster x namespace x GPU model: cost split into productive, idle, stall and headroom waste."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(marts.priced_waste(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "priced_waste", day, df)
