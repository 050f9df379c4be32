"""Staging and the minute-level marts: one pass over each day's samples, in GPU chunks.

gpu_minutes, gpu_daily, hourly_fleet_metrics, priced_waste and fleet_daily come out of the same
pass (gpu_pipeline.lib.staging.chunked): each chunk of GPUs is read, its minutes computed, streamed into the
gpu_minutes partition and aggregated while in memory, so memory stays bounded by the chunk size
(`LakeResource.chunking`: GPU_PIPELINE_CHUNK_MB, or GPU_PIPELINE_CHUNK_GPUS) however large the fleet, and the day's minutes are not read back.
"""

from collections.abc import Iterator

import dagster as dg
import polars as pl

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import BACKFILL_POLICY, DayWriter, partition_days
from gpu_pipeline.defs.metadata import pricing_metadata, spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.marts.day_tables import DayTables
from gpu_pipeline.lib.reference import prices_used
from gpu_pipeline.lib.schemas import validate
from gpu_pipeline.lib.staging.chunked import minutes_by_chunk

TABLES = {
    "gpu_minutes": (
        "staging",
        "GPU x minute: utilization, power, PIF, realized TFLOPS, RFU, efficiency gap, phase, "
        "class, diagnosis, price.",
    ),
    "gpu_daily": (
        "staging",
        "GPU-day minute counts by phase and efficiency class, coverage of the day, energy, and "
        "whether the day was bottlenecked.",
    ),
    "hourly_fleet_metrics": (
        "marts",
        "Hour x cluster x GPU model: GPUs, GPU-minutes, average util/PIF/RFU/gap/TFLOPS and "
        "phase shares.",
    ),
    "priced_waste": (
        "marts",
        "Day x cluster x namespace x GPU model: cost split into productive, idle, stall and "
        "headroom waste.",
    ),
    "fleet_daily": (
        "marts",
        "Day: the whole fleet (a MIG GPU once): GPUs, GPU-hours, average util/RFU/gap/PIF, phase "
        "shares, bottlenecked share of active minutes, and the data's coverage of the day.",
    ),
}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            name,
            description=desc,
            group_name=group,
            deps=["gpu_samples"],
            metadata=spec_metadata(name),
        )
        for name, (group, desc) in TABLES.items()
    ],
    partitions_def=daily_partitions,
    backfill_policy=BACKFILL_POLICY,
    check_specs=[
        checks.spec(
            "gpu_minutes",
            "minutes_add_up",
            "the day's gpu_minutes file holds as many rows as gpu_daily counts GPU-minutes",
        ),
        checks.spec(
            "hourly_fleet_metrics",
            "phase_shares_sum_to_100",
            "phase shares of each group sum to 100",
        ),
        checks.spec(
            "priced_waste",
            "cost_split_sums_to_cost",
            "productive + idle + stall + headroom = cost, to the cent",
        ),
        checks.spec(
            "fleet_daily",
            "fleet_coverage",
            "observed GPU-minutes >= coverage.warn_below (90 %) of GPUs seen x 1,440; warns",
            blocking=False,
        ),
    ],
)
def staging(context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource):
    """Each day's samples -> gpu_minutes (streamed) and gpu_daily, hourly_fleet_metrics,
    priced_waste and fleet_daily, one chunk of GPUs at a time."""
    store = lake.open()
    catalog, prices, rules, energy = (
        reference.load_catalog(),
        reference.load_prices(),
        reference.load_rules(),
        reference.load_energy(),
    )
    writers = {t: DayWriter(store, t, source="gpu_samples") for t in TABLES}
    chunking = lake.chunking()
    results: dict[str, list] = {"minutes": [], "hourly": [], "waste": [], "coverage": []}
    priced_with: dict = {}  # per day: the price book entries and energy rates in force
    for day in partition_days(context):
        samples = store.scan_days("gpu_samples", [day])
        tables = DayTables(t=rules.thresholds)
        chunks = minutes_by_chunk(
            samples,
            catalog,
            prices,
            rules.thresholds,
            d=rules.diagnosis,
            chunking=chunking,
            footer=store.footer("gpu_samples", day),
        )
        # the chunks are read as they are written: a page of the samples that does not decode
        # fails here, named (`Lake.reading`)
        with store.reading("gpu_samples", [day]):
            writers["gpu_minutes"].write_frames(day, _checked(chunks, tables))
        daily = writers["gpu_daily"].write(day, tables.gpu_daily())
        results["minutes"].append(checks.minutes_add_up(store.row_count("gpu_minutes", day), daily))
        hourly = writers["hourly_fleet_metrics"].write(day, tables.hourly_fleet_metrics())
        waste = writers["priced_waste"].write(day, tables.priced_waste())
        with store.reading("gpu_minutes", [day]):
            used = prices_used(store.scan_days("gpu_minutes", [day]), reference.prices)
        priced_with[day] = pricing_metadata(used, waste, energy, reference.prices, reference.energy)
        fleet = writers["fleet_daily"].write(day, tables.fleet_daily())
        results["hourly"].append(checks.phase_shares_sum_to_100(hourly))
        results["waste"].append(checks.cost_split_sums_to_cost(waste))
        results["coverage"].append(
            checks.fleet_coverage(fleet, daily, rules.thresholds.coverage_warn_below)
        )
        context.log.info(
            # rows: a MIG GPU's minute is a row per instance besides its own (the report's
            # GPU-minutes count physical GPUs)
            f"{day}: {tables.minutes_rows} gpu_minutes rows in {tables.chunks} chunk(s) of at most "
            f"{chunking} (split by {chunking.split})"
        )
    for name, w in writers.items():
        yield w.result(context, rules, priced_with if name == "priced_waste" else None)
    for name in ("minutes", "hourly", "waste", "coverage"):
        yield checks.merge(results[name], labels=partition_days(context))


def _checked(chunks: Iterator[pl.DataFrame], tables: DayTables) -> Iterator[pl.DataFrame]:
    """Validate each chunk's minutes (its model enforces one row per GPU-minute: a chunk holds
    whole GPUs) and add it to the day's tables on its way out."""
    for m in chunks:
        yield tables.add(validate("gpu_minutes", m))
