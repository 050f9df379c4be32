"""Raw layer: landing files -> gpu_samples, quarantine, ingest_log, one UTC day at a time."""

import hashlib

import dagster as dg
from pydantic import Field

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import BACKFILL_POLICY, DayWriter, day_metadata, partition_days
from gpu_pipeline.defs.metadata import spec_metadata
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, LandingResource
from gpu_pipeline.lib.ingest.cache import PRUNE_AFTER_S, parse_all, prune
from gpu_pipeline.lib.ingest.gpu_samples import DayAssembly
from gpu_pipeline.lib.ingest.ingest_log import gone_from_landing, rejected_elsewhere
from gpu_pipeline.lib.ingest.landing import (
    LandingRootError,
    hash_memo,
    list_landing,
)
from gpu_pipeline.lib.ingest.remote import landing_root
from gpu_pipeline.lib.schemas import validated_batches

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
    def _ingest(
        context: dg.AssetExecutionContext,
        config: IngestConfig,
        landing: LandingResource,
        lake: LakeResource,
    ):
        """Parse every landing file once (cached by content) and assemble each day of the
        partition range."""
        yield from ingest_days(context, landing, lake, config.replace_missing)

    return _ingest


def ingest_identity(parsed: list, day, opts) -> str:
    """Which ingest of `day` this is, by what it is made of: the day, the parser and its options,
    and the name and content of every landing file with a record of the day. The same files
    make the same id (a re-run writes the same bytes); other files, another."""
    from gpu_pipeline.lib.ingest.cache import PARSER_VERSION

    h = hashlib.sha256(f"{day}\0{PARSER_VERSION}\0{opts}".encode())
    for pf in parsed:
        if day in pf.touched_days():
            h.update(f"\0{pf.file.source_file}\0{pf.file.sha256}".encode())
    return f"{day}/{h.hexdigest()[:16]}"


def ledger_metadata(log, ingest_id: str | None) -> dict:
    """What a run says of a day's ledger: the records of its own ingest (`materialize` prints
    these, never what the lake holds by the time it prints: another run may have written since)."""
    sums = {
        c: int(log.get_column(c).sum()) if log.height else 0
        for c in ("rows_read", "rows_accepted", "rows_quarantined", "rows_duplicate")
    }
    return {"files": log.height, **sums, "ingest": ingest_id or ""}


class IngestConfig(dg.Config):
    """Run configuration of the ingest step."""

    replace_missing: bool = Field(
        default=False,
        description=(
            "Rewrite a day even when landing files it was made from are gone from the landing "
            "zone (by default such a day keeps its partitions, and the run says so)."
        ),
    )


def ingest_days(
    context: dg.AssetExecutionContext,
    landing: LandingResource,
    lake: LakeResource,
    replace_missing: bool = False,
):
    """Parse every landing file once (cached by content) and assemble each day of the partition
    range. A landing zone that cannot be read fails the run (nothing is replaced); a day whose
    earlier files are gone from the landing zone keeps its partitions unless `replace_missing`."""
    store = lake.open()
    try:
        root, refused = landing_root(landing.root, store.cache_dir)
    except LandingRootError as e:
        raise dg.Failure(description=str(e)) from None
    for key in refused:
        why = getattr(key, "why", "not a plain relative path")  # remote.Unmirrored
        context.log.warning(f"{landing.root}: object {key!r} not read: {why}")
    files = list_landing(root, hash_memo(store.cache_dir))
    opts, max_rows = landing.parse_options(), lake.chunking().rows
    days = partition_days(context)
    parsed = parse_all(files, store.cache_dir, opts, days=days, shared=store.shared_cache)
    # parses of files no longer landed as they were, unused for a day: removed
    gone = prune(store.cache_dir, parsed, opts)
    if gone.parses or gone.temporary:
        context.log.info(
            f"parse cache: removed {gone.parses} parse(s) of files no longer in the landing "
            f"zone as they were and {gone.temporary} left-over temporary folder(s), "
            f"{gone.bytes / 2**20:,.1f} MiB (unused for {PRUNE_AFTER_S // 3600} h)"
        )
    for name, where in rejected_elsewhere(parsed, days):
        context.log.warning(f"{name}: rejected whole, filed in the quarantine of {where}")
    writers = {t: DayWriter(store, t) for t in RAW_TABLES}
    conservation, pass_rate, utilization = [], [], []
    waiting: list[str] = []  # kept days with records of new files left out
    for day in days:
        gone = (
            gone_from_landing(store.read("ingest_log", day), files)
            if not replace_missing and store.exists("ingest_log", day)
            else []
        )
        if gone:  # the input is not all there: the day stays the version it was made from
            log, quarantine, left_out = _kept_day(context, store, day, gone, parsed)
            waiting += left_out
            conservation.append(checks.row_conservation(log))
            pass_rate.append(checks.validation_pass_rate(log, quarantine))
            utilization.append(checks.utilization_present(log))
            continue
        # a range of GPUs at a time (memory follows the chunk budget, not the fleet), validated
        # a few ranges at a time and streamed into the day's gpu_samples file
        day_in = DayAssembly(parsed, day, max_rows)
        ingest_id = ingest_identity(parsed, day, opts)  # every table made from it names it
        writers["gpu_samples"].write_frames(
            day, validated_batches("gpu_samples", day_in.gpu_samples()), ingest_id
        )
        quarantine = day_in.quarantine()
        log = day_in.ingest_log(quarantine)
        writers["quarantine"].write(day, quarantine, ingest_id)
        writers["ingest_log"].write(day, log, ingest_id)
        day_metadata(context, day, ledger_metadata(log, ingest_id), "ingest_log")
        conservation.append(checks.row_conservation(log))
        pass_rate.append(checks.validation_pass_rate(log, quarantine))
        utilization.append(checks.utilization_present(log))
        context.log.info(
            f"{day}: {log.height} landing files, {writers['gpu_samples'].rows[day]} samples in "
            f"{day_in.chunks} chunk(s), {quarantine.height} quarantined"
        )
    for w in writers.values():
        yield w.result(context)
    yield checks.merge(conservation, labels=days)
    yield checks.merge(pass_rate, labels=days)
    yield checks.merge(utilization, labels=days)
    if waiting:  # their records are in no table: the run fails, not a quiet success
        raise dg.Failure(description="; ".join(waiting))


def _kept_day(context, store, day, gone: list[str], parsed: list):
    """A day whose landing files are partly gone keeps its partitions: the warning, the
    metadata, and (log, quarantine, lines on new files left out) of the day as it was."""
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    context.log.warning(
        f"{day}: kept as it was: {len(gone)} landing file(s) it was made from are gone "
        f"from the landing zone ({shown}); to rewrite it without them, run with "
        "replace_missing (run config of the ingest step; CLI: materialize "
        "--replace-missing)"
    )
    for table in RAW_TABLES:
        day_metadata(context, day, {"kept": True, "files_gone": dg.MetadataValue.json(gone)}, table)
    log, quarantine = store.read("ingest_log", day), store.read("quarantine", day)
    meta = ledger_metadata(log, store.lineage("ingest_log", day))
    day_metadata(context, day, meta, "ingest_log")
    return log, quarantine, _left_out(context, day, parsed, log, gone)


def _left_out(context, day, parsed: list, log, gone: list[str]) -> list[str]:
    """A day kept as it was (landing files gone) while files it has not read hold records of
    it: those records would be in no table (adversarial review: a late host's file, landed
    after retention removed an older one, was never ingested and the run said ok). One line
    saying so, for the run's failure."""
    had = set(log.get_column("source_file").to_list())
    new = sorted(
        pf.file.source_file
        for pf in parsed
        if pf.file.source_file not in had and day in set(pf.record_days())
    )
    if not new:
        return []
    shown = ", ".join(new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    line = (
        f"{day}: kept as it was ({len(gone)} landing file(s) it was made from are gone), so "
        f"{len(new)} new file(s) with records of it were not ingested ({shown}): put the gone "
        "files back, or rewrite the day from the landing zone as it is now with "
        "--replace-missing"
    )
    context.log.error(line)
    return [line]


ingest = build_ingest()
