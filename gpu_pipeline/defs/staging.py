"""Staging layer: per-minute metrics and per GPU-day counts."""

import dagster as dg

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.metadata import publish, spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.metrics import gpu_daily as gpu_daily_fn
from gpu_pipeline.lib.metrics import gpu_minutes as gpu_minutes_fn
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import validate


@dg.asset(
    partitions_def=daily_partitions,
    group_name="staging",
    deps=["gpu_samples"],
    metadata=spec_metadata("gpu_minutes"),
    check_specs=[
        checks.spec("gpu_minutes", "one_row_per_gpu_minute", "no GPU-minute appears twice")
    ],
)
def gpu_minutes(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """GPU x minute: utilization, power, PIF, realized TFLOPS, RFU, efficiency gap, phase, class, price."""
    day = context.partition_time_window.start.date()
    the_lake = lake.lake()
    samples = the_lake.scan_days("gpu_samples", [day])
    df = validate(
        "gpu_minutes",
        collect_stable(gpu_minutes_fn(samples, reference.load_catalog(), reference.load_prices())),
    )
    yield publish(the_lake, "gpu_minutes", day, df)
    yield checks.one_row_per_gpu_minute(df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="staging",
    deps=["gpu_minutes"],
    metadata=spec_metadata("gpu_daily"),
)
def gpu_daily(context: dg.AssetExecutionContext, lake: LakeResource):
    """GPU-day minute counts by phase and efficiency class, and whether the day was bottlenecked."""
    day = context.partition_time_window.start.date()
    the_lake = lake.lake()
    df = collect_stable(gpu_daily_fn(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "gpu_daily", day, df)
