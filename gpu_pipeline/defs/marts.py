"""Marts over the staged tables: persistent bottlenecks, recommendations, health, ROI,
namespaces and workloads.

Each mart of a day's gpu_minutes reads them a chunk of whole GPUs at a time (the staging
pass's chunks: `lake.chunking()`), so its memory is a chunk's, whatever the fleet's size.

(hourly_fleet_metrics and priced_waste come out of the staging pass, defs/staging.py.)
"""

from collections.abc import Callable

import dagster as dg
import polars as pl

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import DayWriter, daily, partition_days
from gpu_pipeline.defs.partitions import DEFAULT
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.efficiency_roi import efficiency_roi as compute_efficiency_roi
from gpu_pipeline.lib.marts.gpu_health import gpu_health_by_chunk
from gpu_pipeline.lib.marts.namespace_efficiency import (
    namespace_efficiency as compute_namespace_efficiency,
)
from gpu_pipeline.lib.marts.persistent_bottlenecks import (
    persistent_bottlenecks as compute_persistent_bottlenecks,
)
from gpu_pipeline.lib.marts.persistent_bottlenecks import window
from gpu_pipeline.lib.marts.recommendations import recommendations as compute_recommendations
from gpu_pipeline.lib.marts.stragglers import stragglers as compute_stragglers
from gpu_pipeline.lib.marts.workload_efficiency import (
    workload_efficiency as compute_workload_efficiency,
)
from gpu_pipeline.lib.rules import Rules
from gpu_pipeline.lib.samples import collect_stable


def from_minutes(
    context: dg.AssetExecutionContext,
    lake: Lake,
    table: str,
    fn: Callable[[pl.LazyFrame], pl.DataFrame],
    check: Callable[[pl.DataFrame], dg.AssetCheckResult] | None = None,
    rules: Rules | None = None,
):
    """Run `fn` on each day's gpu_minutes, write `table`, and evaluate `check` on every day. A
    page of the minutes that does not decode fails the day, named (`Lake.reading`)."""
    out, results = DayWriter(lake, table, source="gpu_minutes"), []
    for day in partition_days(context):
        with lake.reading("gpu_minutes", [day]):
            computed = fn(lake.scan_days("gpu_minutes", [day]))
        df = out.write(day, computed)
        if check:
            results.append(check(df))
    yield out.result(context, rules)
    if check:
        yield checks.merge(results, labels=partition_days(context))


@dg.asset(
    **daily(
        "persistent_bottlenecks",
        "marts",
        # D's persistence reads the GPU-days of its window (build_definitions binds the window
        # of the rules in force)
        deps=[dg.AssetDep("gpu_daily", partition_mapping=DEFAULT.window)],
    )
)
def persistent_bottlenecks(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """GPUs bottlenecked on at least 3 of the last 7 days (D-6..D; `[compute_persistent_bottlenecks]` rules)."""
    store, t = lake.open(), reference.load_rules().thresholds
    out = DayWriter(store, "persistent_bottlenecks", source="gpu_daily")
    for day in partition_days(context):
        # the window's days may be another run's to write: read one version of each, now
        daily_frames = store.read_days("gpu_daily", window(day, t)).lazy()
        out.write(day, collect_stable(compute_persistent_bottlenecks(daily_frames, day, t)))
    return out.result(context, reference.load_rules())


@dg.asset(
    **daily("recommendations", "marts", deps=["gpu_minutes"]),
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
    prices, catalog, rules = (
        reference.load_prices(),
        reference.load_catalog(),
        reference.load_rules(),
    )
    chunking = lake.chunking()
    yield from from_minutes(
        context,
        lake.open(),
        "recommendations",
        lambda m: compute_recommendations(
            m, prices, catalog, rules.diagnosis, rules.recommend, rules.thresholds, chunking
        ),
        checks.savings_within_measured_waste,
        rules=rules,
    )


@dg.asset(**daily("gpu_health", "marts", deps=["gpu_samples"]))
def gpu_health(context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource):
    """Physical GPU-day: hot and power-capped minutes, XID, double-bit ECC, row-remap failures, a status."""
    store, catalog, rules = lake.open(), reference.load_catalog(), reference.load_rules()
    out = DayWriter(store, "gpu_health", source="gpu_samples")
    for day in partition_days(context):
        with store.reading("gpu_samples", [day]):
            samples = store.scan_days("gpu_samples", [day])
            health = gpu_health_by_chunk(samples, catalog, rules.health, lake.chunking())
        out.write(day, health)
    return out.result(context, rules)


@dg.asset(**daily("stragglers", "marts", deps=["gpu_minutes"]))
def stragglers(context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource):
    """GPU-hours where a GPU sits 15+ points below its pod's median SM activity (or utilization)."""
    rules = reference.load_rules()
    yield from from_minutes(
        context,
        lake.open(),
        "stragglers",
        lambda m: collect_stable(compute_stragglers(m, rules.health, lake.chunking())),
        rules=rules,
    )


@dg.asset(**daily("efficiency_roi", "marts", deps=["gpu_minutes"]))
def efficiency_roi(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """Fleet and per model: the GPUs and dollars that raising RFU to the target is worth."""
    rules = reference.load_rules()
    yield from from_minutes(
        context,
        lake.open(),
        "efficiency_roi",
        lambda m: collect_stable(
            compute_efficiency_roi(m, rules.roi_target_rfu_pct, lake.chunking())
        ),
        rules=rules,
    )


@dg.asset(**daily("namespace_efficiency", "marts", deps=["gpu_minutes"]))
def namespace_efficiency(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """Day x namespace: utilization vs RFU, idle and bottleneck shares, dominant diagnosis, cost,
    waste, energy (kWh, idle kWh, $ and CO2 at the cluster's rates)."""
    energy, rules = reference.load_energy(), reference.load_rules()
    yield from from_minutes(
        context,
        lake.open(),
        "namespace_efficiency",
        lambda m: collect_stable(
            compute_namespace_efficiency(m, energy, rules.thresholds, lake.chunking())
        ),
        rules=rules,
    )


@dg.asset(
    **daily("workload_efficiency", "marts", deps=["gpu_minutes"]),
    check_specs=[
        checks.spec(
            "workload_efficiency",
            "cost_split_sums_to_cost",
            "productive + idle + stall + headroom + unmeasured = cost; monthly = hourly x 720",
        )
    ],
)
def workload_efficiency(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """Day x cluster x namespace x workload (the pod's owner): GPU-hours, utilization vs RFU,
    phase shares, cost and waste split, main diagnosis and the top action."""
    prices, catalog, rules = (
        reference.load_prices(),
        reference.load_catalog(),
        reference.load_rules(),
    )
    chunking = lake.chunking()
    yield from from_minutes(
        context,
        lake.open(),
        "workload_efficiency",
        lambda m: compute_workload_efficiency(
            m, prices, catalog, rules.diagnosis, rules.recommend, rules.thresholds, chunking
        ),
        lambda w: checks.cost_split_sums_to_cost(w, "workload_efficiency"),
        rules=rules,
    )
