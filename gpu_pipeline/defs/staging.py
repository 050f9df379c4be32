"""Staging layer: per-minute metrics and per GPU-day counts."""

import dagster as dg

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import DayWriter, daily, partition_days
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.metrics import gpu_daily as gpu_daily_fn
from gpu_pipeline.lib.metrics import gpu_minutes as gpu_minutes_fn
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import validate


@dg.asset(
    **daily("gpu_minutes", "staging", deps=["gpu_samples"]),
    check_specs=[
        checks.spec("gpu_minutes", "one_row_per_gpu_minute", "no GPU-minute appears twice")
    ],
)
def gpu_minutes(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """GPU x minute: utilization, power, PIF, realized TFLOPS, RFU, efficiency gap, phase, class, diagnosis, price."""
    the_lake = lake.lake()
    catalog, prices = reference.load_catalog(), reference.load_prices()
    out, results = DayWriter(the_lake, "gpu_minutes"), []
    for day in partition_days(context):
        samples = the_lake.scan_days("gpu_samples", [day])
        df = out.write(
            day, validate("gpu_minutes", collect_stable(gpu_minutes_fn(samples, catalog, prices)))
        )
        results.append(checks.one_row_per_gpu_minute(df))
    yield out.result()
    yield checks.merge(results)


@dg.asset(**daily("gpu_daily", "staging", deps=["gpu_minutes"]))
def gpu_daily(context: dg.AssetExecutionContext, lake: LakeResource):
    """GPU-day minute counts by phase and efficiency class, and whether the day was bottlenecked."""
    the_lake = lake.lake()
    out = DayWriter(the_lake, "gpu_daily")
    for day in partition_days(context):
        out.write(day, collect_stable(gpu_daily_fn(the_lake.scan_days("gpu_minutes", [day]))))
    return out.result()
