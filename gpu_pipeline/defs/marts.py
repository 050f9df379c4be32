"""Marts: hourly fleet metrics, persistent bottlenecks, priced waste."""

import warnings

import dagster as dg

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.metadata import publish, spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib import health, marts, recommend, roi
from gpu_pipeline.lib.rules import DEFAULT
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import validate

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
    check_specs=[
        checks.spec(
            "hourly_fleet_metrics",
            "phase_shares_sum_to_100",
            "phase shares of each group sum to 100",
        )
    ],
)
def hourly_fleet_metrics(context: dg.AssetExecutionContext, lake: LakeResource):
    """Hour x cluster x GPU model: GPUs, GPU-minutes, average util/PIF/RFU/gap/TFLOPS and phase shares."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(marts.hourly_fleet_metrics(the_lake.scan_days("gpu_minutes", [day])))
    yield publish(the_lake, "hourly_fleet_metrics", day, df)
    yield checks.phase_shares_sum_to_100(df)


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
    check_specs=[
        checks.spec(
            "priced_waste",
            "cost_split_sums_to_cost",
            "productive + idle + stall + headroom = cost, to the cent",
        )
    ],
)
def priced_waste(context: dg.AssetExecutionContext, lake: LakeResource):
    """Day x cluster x namespace x GPU model: cost split into productive, idle, stall and headroom waste."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(marts.priced_waste(the_lake.scan_days("gpu_minutes", [day])))
    yield publish(the_lake, "priced_waste", day, df)
    yield checks.cost_split_sums_to_cost(df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("recommendations"),
    check_specs=[
        checks.spec(
            "recommendations",
            "savings_within_measured_waste",
            "savings <= measured waste, total <= 100 %",
        )
    ],
)
def recommendations(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """Day x namespace: actions with fractions, overlap groups and rationales; savings never above measured waste."""
    the_lake, day = lake.lake(), _day(context)
    df = validate(
        "recommendations",
        recommend.recommendations(
            the_lake.scan_days("gpu_minutes", [day]), reference.load_prices()
        ),
    )
    yield publish(the_lake, "recommendations", day, df)
    yield checks.savings_within_measured_waste(df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_samples"],
    metadata=spec_metadata("gpu_health"),
)
def gpu_health(context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource):
    """Physical GPU-day: hot and power-capped minutes, XID, double-bit ECC, row-remap failures, a status."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(
        health.gpu_health(the_lake.scan_days("gpu_samples", [day]), reference.load_catalog())
    )
    return publish(the_lake, "gpu_health", day, df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("stragglers"),
)
def stragglers(context: dg.AssetExecutionContext, lake: LakeResource):
    """GPU-hours where a GPU sits 15+ points below its pod's median SM activity (or utilization)."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(health.stragglers(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "stragglers", day, df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("efficiency_roi"),
)
def efficiency_roi(context: dg.AssetExecutionContext, lake: LakeResource):
    """Fleet and per model: the GPUs and dollars that raising RFU to the target is worth."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(roi.efficiency_roi(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "efficiency_roi", day, df)


@dg.asset(
    partitions_def=daily_partitions,
    group_name="marts",
    deps=["gpu_minutes"],
    metadata=spec_metadata("namespace_efficiency"),
)
def namespace_efficiency(context: dg.AssetExecutionContext, lake: LakeResource):
    """Day x namespace: utilization vs RFU, idle and bottleneck shares, dominant diagnosis, cost and waste."""
    the_lake, day = lake.lake(), _day(context)
    df = collect_stable(roi.namespace_efficiency(the_lake.scan_days("gpu_minutes", [day])))
    return publish(the_lake, "namespace_efficiency", day, df)
