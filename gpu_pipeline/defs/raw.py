"""Raw layer: landing files -> gpu_samples, quarantine, ingest_log, one UTC day at a time."""

import dagster as dg

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import BACKFILL_POLICY, DayWriter, partition_days
from gpu_pipeline.defs.metadata import spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, LandingResource
from gpu_pipeline.lib.ingest.cache import parse_all
from gpu_pipeline.lib.ingest.gpu_samples import DayAssembly
from gpu_pipeline.lib.ingest.ingest_log import rejected_elsewhere
from gpu_pipeline.lib.ingest.landing import hash_memo, list_landing
from gpu_pipeline.lib.schemas import validate, validated_batches

RAW_TABLES = {
    "gpu_samples": "Validated telemetry samples, one row per GPU (and MIG instance) per timestamp.",
    "quarantine": "Rejected lines and files, each with its file, line, reason and original text.",
    "ingest_log": "One row per landing file touching the day: format, row accounting and sha256.",
}


def build_ingest(upstream: tuple[str, ...] = ()) -> dg.AssetsDefinition:
    """The ingest step; `upstream`: assets that land files first (the Prometheus pull)."""

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(
                name,
                description=desc,
                group_name="raw",
                metadata=spec_metadata(name),
                deps=list(upstream),
            )
            for name, desc in RAW_TABLES.items()
        ],
        partitions_def=daily_partitions,
        backfill_policy=BACKFILL_POLICY,
        check_specs=[
            checks.spec(
                "ingest_log",
                "row_conservation",
                "rows read = accepted + quarantined + duplicate, per file",
            ),
            checks.spec(
                "gpu_samples",
                "validation_pass_rate",
                "share of records that passed validation",
                blocking=False,
            ),
            checks.spec(
                "gpu_samples",
                "utilization_present",
                "every file with samples gives GPU utilization (else its minutes' phase is unknown)",
                blocking=False,
            ),
        ],
        name="ingest",
    )
    def _ingest(context: dg.AssetExecutionContext, landing: LandingResource, lake: LakeResource):
        """Parse every landing file once (cached by content) and assemble each day of the
        partition range."""
        yield from ingest_days(context, landing, lake)

    return _ingest


def ingest_days(context: dg.AssetExecutionContext, landing: LandingResource, lake: LakeResource):
    """Parse every landing file once (cached by content) and assemble each day of the partition range."""
    the_lake = lake.lake()
    files = list_landing(landing.root, hash_memo(the_lake.cache_dir))
    opts, max_rows = landing.parse_options(), lake.chunking().rows
    parsed = parse_all(files, the_lake.cache_dir, opts)
    days = partition_days(context)
    for name, where in rejected_elsewhere(parsed, days):
        context.log.warning(f"{name}: rejected whole, filed in the quarantine of {where}")
    writers = {t: DayWriter(the_lake, t) for t in RAW_TABLES}
    conservation, pass_rate, utilization = [], [], []
    for day in days:
        # a range of GPUs at a time (memory follows the chunk budget, not the fleet), validated
        # a few ranges at a time and streamed into the day's gpu_samples file
        day_in = DayAssembly(parsed, day, max_rows)
        writers["gpu_samples"].write_frames(
            day, validated_batches("gpu_samples", day_in.gpu_samples())
        )
        quarantine = validate("quarantine", day_in.quarantine())
        log = validate("ingest_log", day_in.ingest_log(quarantine))
        writers["quarantine"].write(day, quarantine)
        writers["ingest_log"].write(day, log)
        conservation.append(checks.row_conservation(log))
        pass_rate.append(checks.validation_pass_rate(log, quarantine))
        utilization.append(checks.utilization_present(log))
        context.log.info(
            f"{day}: {len(files)} landing files, {writers['gpu_samples'].rows[day]} samples in "
            f"{day_in.chunks} chunk(s), {quarantine.height} quarantined"
        )
    for w in writers.values():
        yield w.result(context)
    yield checks.merge(conservation, labels=days)
    yield checks.merge(pass_rate, labels=days)
    yield checks.merge(utilization, labels=days)


ingest = build_ingest()
