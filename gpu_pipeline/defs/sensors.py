"""Sensors: the landing zone (new or changed files -> a backfill of the days they touch) and
freshness.

A sensor decides; runs work. A tick only lists the landing zone (hashes are remembered by path,
size and mtime) and reads the parse cache's meta files — beside a lake in an object store, the
cache's copy there too, as runs do (on Kubernetes the code server does not share the run pods'
disk). Files it has not seen parsed get a `landing_files` run first; once they are parsed, the
tick knows the UTC days their samples touch and launches one asset backfill: every daily asset
of the days whose `ingest_log` does not list the file with this content yet (a day a CLI
backfill already ingested it on does not run again), and `persistent_bottlenecks` and
`daily_report` for the six days after each (their 7-day window reads the late day). Dagster's
backfill daemon runs it in dependency order, so a window day waits for the late day's
`gpu_daily`, and the end state is the one a clean backfill of the same files gives.
"""

import hashlib
import json
from datetime import UTC, date, datetime, time, timedelta

import dagster as dg
import polars as pl

# private in Dagster 1.13 (pinned in pyproject.toml): the documented way for a sensor to launch an
# asset backfill is `RunRequest.for_asset_graph_subset`, whose argument type lives here
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

# how the freshness sensor tells a check a run planned from one it executed (what Dagster's own
# freshness sensor reads too)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from gpu_pipeline.defs.marts import persistent_bottlenecks, recommendations
from gpu_pipeline.defs.partitions import DEFAULT, Partitioning
from gpu_pipeline.defs.report import daily_report
from gpu_pipeline.defs.resources import LakeResource, LandingResource
from gpu_pipeline.lib.ingest.cache import ParsedFile, is_cached, load_or_parse, parse_all
from gpu_pipeline.lib.ingest.landing import (
    LandingFile,
    LandingRootError,
    hash_memo,
    list_landing,
)
from gpu_pipeline.lib.ingest.remote import landing_root
from gpu_pipeline.lib.io.lake import DamagedPartition

# what a late day changes after itself: persistence of D+1..D+6 reads D's GPU-day
WINDOW_ASSETS = [dg.AssetKey("persistent_bottlenecks"), dg.AssetKey("daily_report")]


@dg.asset(group_name="raw", kinds={"parquet"})
def landing_files(context: dg.AssetExecutionContext, landing: LandingResource, lake: LakeResource):
    """Every landing file parsed once into the lake's ingest cache (keyed by content); the
    landing-zone sensor asks for this before it plans the days new files touch."""
    store, opts = lake.open(), landing.parse_options()
    cache, shared = store.cache_dir, store.shared_cache
    try:
        root, refused = landing_root(landing.root, cache)
    except LandingRootError as e:
        raise dg.Failure(description=str(e)) from None
    for key in refused:  # objects of a store the mirror could not hold: the run says which
        context.log.warning(f"{landing.root}: object {key!r} not read: {key.why}")
    files = list_landing(root, hash_memo(cache))
    todo = [f for f in files if not is_cached(f, cache, opts, shared)]

    for f, pf in zip(todo, parse_all(todo, cache, opts, shared=shared), strict=True):
        context.log.info(f"{f.source_file}: {pf.format}, days {[str(d) for d in pf.days]}")
    return dg.MaterializeResult(metadata={"files": len(files), "parsed": len(todo)})


def plan_backfill(
    changed_days: set[date],
    first: date,
    last: date,
    partitioned: list[dg.AssetKey],
    window_days: int = DEFAULT.window_days,
) -> dict[dg.AssetKey, list[str]]:
    """Partition keys per asset: every asset for the changed days, the window assets for the six
    days after each (only days that have a partition: first..last)."""
    days = sorted(d for d in changed_days if first <= d <= last)
    after = {d + timedelta(days=k) for d in days for k in range(1, window_days)} - set(days)
    window = sorted(d for d in after if d <= last)
    out: dict[dg.AssetKey, list[str]] = {}
    for key in partitioned:
        keys = days + (window if key in WINDOW_ASSETS else [])
        if keys:
            out[key] = [d.isoformat() for d in sorted(keys)]
    return out


def _partitioned_keys(
    context: dg.SensorEvaluationContext, days: dg.PartitionsDefinition
) -> list[dg.AssetKey]:
    graph = context.repository_def.asset_graph
    return sorted(
        (k for k in graph.get_all_asset_keys() if graph.get(k).partitions_def == days),
        key=lambda k: k.to_user_string(),
    )


def build_landing_sensor(p: Partitioning) -> dg.SensorDefinition:
    """The landing-zone sensor of partitioning `p` (its days, window and interval)."""

    @dg.sensor(
        name="landing_zone_sensor",
        asset_selection=dg.AssetSelection.assets(landing_files)
        | dg.AssetSelection.all() - dg.AssetSelection.groups("warehouse"),
        minimum_interval_seconds=p.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def landing_zone_sensor(
        context: dg.SensorEvaluationContext, landing: LandingResource, lake: LakeResource
    ):
        """New or changed landing files: backfill exactly the UTC days their samples touch that
        have not ingested them yet, and the persistence window after them (late data), in
        dependency order."""
        return plan_landing(context, landing, lake, p)

    return landing_zone_sensor


def plan_landing(
    context: dg.SensorEvaluationContext,
    landing: LandingResource,
    lake: LakeResource,
    p: Partitioning,
):
    """One tick of the landing-zone sensor (`build_landing_sensor`)."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    store, opts = lake.open(), landing.parse_options()
    # the parse cache as the runs see it: beside a lake in an object store, its copy there (the
    # code server's disk is not the run pods': a parse a run made is found there, not here)
    cache, shared = store.cache_dir, store.shared_cache
    try:
        root, _ = landing_root(landing.root, cache)
    except LandingRootError as e:
        return dg.SkipReason(str(e))
    files = list_landing(root, hash_memo(cache))
    changed = [f for f in files if seen.get(f.source_file) != f.sha256]
    if not changed:
        return dg.SkipReason(f"no new or changed files among {len(files)}")
    token = hashlib.sha256(
        "".join(sorted(f"{f.source_file}:{f.sha256}" for f in changed)).encode()
    ).hexdigest()[:16]
    unparsed = [f for f in changed if not is_cached(f, cache, opts, shared)]
    if unparsed:
        # the parsing is a run's work; the next tick plans from the cache
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    asset_selection=[landing_files.key],
                    run_key=f"parse:{token}",
                    tags={"trigger": "landing_zone"},
                )
            ],
            skip_reason=None,
        )
    # no day is read: each parse's meta.json (and quarantine), neither its samples nor a hash
    parsed = {f.source_file: load_or_parse(f, cache, opts, (), shared) for f in changed}
    fresh = _days_not_in_lake(lake, changed, parsed, damaged_runs=True)
    stale = _replaced_days(lake, changed)
    cursor = json.dumps({f.source_file: f.sha256 for f in files})
    if not fresh and not stale:
        return dg.SensorResult(
            skip_reason=f"{len(changed)} file(s) new to the sensor are already in the lake",
            cursor=cursor,
        )
    requests = _backfill_requests(context, p, fresh, token, stale)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


def _replaced_days(lake: LakeResource, changed: list[LandingFile]) -> set[date]:
    """The days the lake ingested an earlier content of a changed file on (`ingest_log`: the
    file's path with another sha256). A file replaced by one that no longer reaches such a day
    left its old samples there, billed, until the day ran again (adversarial review): the
    days are run again, so they hold what a clean backfill of the landing zone gives."""
    now = {f.source_file: f.sha256 for f in changed}
    store = lake.open()
    out: set[date] = set()
    for d in store.days("ingest_log") if now else []:
        try:
            log = store.read("ingest_log", d).filter(pl.col("source_file").is_in(list(now)))
        except (OSError, DamagedPartition, pl.exceptions.PolarsError):
            continue  # a damaged partition does not stop the sensor: its day's run says so
        out |= {
            d for src, sha in zip(log["source_file"], log["sha256"], strict=True) if sha != now[src]
        }
    return out


def _days_not_in_lake(
    lake: LakeResource,
    changed: list[LandingFile],
    parsed: dict[str, ParsedFile],
    damaged_runs: bool = False,
) -> dict[str, list[date]]:
    """Per changed file (by source file), the days it touches whose `ingest_log` does not list
    it with this content (a day without an ingest_log has not run: every file is news to it);
    files every such day has ingested are left out. A day a UI or CLI backfill already ingested
    the file on is not news, even if another day the file touches is. `parsed`: each changed
    file's parse, by source file. A damaged ingest_log: with `damaged_runs`, its day holds
    nothing (its run says why), else DamagedPartition."""
    store = lake.open()
    logged: set[tuple[date, str, str]] = set()
    for d in {d for pf in parsed.values() for d in pf.touched_days()}:
        if not store.exists("ingest_log", d):
            continue
        try:
            log = store.read("ingest_log", d)
        except DamagedPartition:
            if damaged_runs:
                continue
            raise
        logged |= {
            (d, src, sha) for src, sha in zip(log["source_file"], log["sha256"], strict=True)
        }
    out: dict[str, list[date]] = {}
    for f in changed:
        days = [
            d
            for d in parsed[f.source_file].touched_days()
            if (d, f.source_file, f.sha256) not in logged
        ]
        if days:
            out[f.source_file] = days
    return out


def _not_in_lake(
    lake: LakeResource, changed: list[LandingFile], parsed: dict[str, ParsedFile]
) -> list[LandingFile]:
    """The changed files some day they touch has not ingested with this content
    (`_days_not_in_lake`; a damaged ingest_log raises DamagedPartition)."""
    days = _days_not_in_lake(lake, changed, parsed)
    return [f for f in changed if f.source_file in days]


def _backfill_requests(
    context: dg.SensorEvaluationContext,
    p: Partitioning,
    fresh: dict[str, list[date]],
    token: str,
    stale: set[date] = frozenset(),
) -> list[dg.RunRequest]:
    """One asset backfill (`plan_backfill`) of the days the `fresh` files have not been
    ingested on with their content (`_days_not_in_lake`: by source file) and the `stale` days
    (a replaced file's earlier content is on them), none when no day has a partition yet;
    tagged with the files' `token`."""
    days: set[date] = set(stale)
    for file_days in fresh.values():
        days |= set(file_days)
    first = date.fromisoformat(p.daily.get_first_partition_key())
    last_key = p.daily.get_last_partition_key()  # yesterday: today is not complete yet
    plan = (
        plan_backfill(
            days,
            first,
            date.fromisoformat(last_key),
            _partitioned_keys(context, p.daily),
            p.window_days,
        )
        if last_key
        else {}
    )
    context.log.info(
        f"{len(fresh)} new/changed file(s) not ingested on every day they touch, "
        f"{len(stale)} day(s) of replaced content: days {sorted(map(str, days))}: "
        f"backfill of {sum(map(len, plan.values()))} asset partition(s)"
    )
    if not plan:
        return []
    subset = AssetGraphSubset(
        partitions_subsets_by_asset_key={
            k: p.daily.subset_with_partition_keys(v) for k, v in plan.items()
        }
    )
    return [
        dg.RunRequest.for_asset_graph_subset(
            subset, tags={"trigger": "landing_zone", "gpu_pipeline/files": token}
        )
    ]


landing_zone_sensor = build_landing_sensor(DEFAULT)


# Freshness: yesterday's UTC partition of the marts is expected by 06:00 UTC. Judged only by
# `freshness_checks_sensor`, never at the end of a run that materializes assets.
#
# Dagster puts every check of the assets a run materializes into the run unless the launcher
# names the checks, and the UI names none for a backfill ("Materialize all") and every check of
# the asset's job for a single run. Dagster's own freshness checks
# (`build_time_partition_freshness_checks`) then judged yesterday at the end of a backfill of
# last year's days ("Asset is overdue"), and their sensor waited forever on a check a run had
# planned and not executed. Here the check skips itself in any run that materializes assets
# (Dagster records it as skipped, never red); a run of checks only (this sensor's, or "Execute"
# on the check's page) judges.
FRESHNESS_ASSETS = [
    dg.AssetKey("priced_waste"),
    recommendations.key,
    persistent_bottlenecks.key,
    daily_report.key,
]
DEADLINE_HOUR_UTC = 6
FRESHNESS_TAG = "gpu_pipeline/freshness"  # on the sensor's runs


def freshness_deadline(now: datetime) -> datetime:
    """The latest 06:00 UTC at or before `now`: by then the day before it must be there."""
    tick = datetime.combine(now.astimezone(UTC).date(), time(DEADLINE_HOUR_UTC), tzinfo=UTC)
    return tick if now >= tick else tick - timedelta(days=1)


def judge_freshness(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    now: datetime,
    first_day: date | None = None,
) -> dg.AssetCheckResult:
    """Is the partition expected by the latest deadline (the day before it) materialized?"""
    deadline = freshness_deadline(now)
    expected = deadline.date() - timedelta(days=1)
    meta = {
        "expected_partition": dg.MetadataValue.text(expected.isoformat()),
        "deadline": dg.MetadataValue.timestamp(deadline.timestamp()),
    }
    if expected < (first_day or date.fromisoformat(DEFAULT.start_date)):
        return dg.AssetCheckResult(
            asset_key=asset_key,
            passed=True,
            metadata=meta,
            description=f"no partition is expected yet ({expected} is before the first)",
        )
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[expected.isoformat()]),
        limit=1,
    ).records
    name = asset_key.to_user_string()
    # a partition written without a row: the run went fine on a day nothing landed for (an
    # exporter outage), which is what this check is there to tell (adversarial review)
    rows = None
    if found and found[0].asset_materialization is not None:
        count = found[0].asset_materialization.metadata.get("dagster/row_count")
        rows = None if count is None else count.value
    if found and rows == 0:
        why = f"{name} of {expected} is there but empty: no data landed for the day"
    elif found:
        why = f"{name} of {expected} is there (expected by {deadline:%Y-%m-%d %H:%M} UTC)"
    else:
        why = (
            f"{name} of {expected} was not there by {deadline:%Y-%m-%d %H:%M} UTC: the "
            "schedule did not run, its run failed, or no data landed for the day"
        )
    return dg.AssetCheckResult(
        asset_key=asset_key,
        passed=bool(found) and rows != 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=meta,
        description=why,
    )


def build_freshness_checks(p: Partitioning) -> dg.AssetChecksDefinition:
    """The freshness checks of partitioning `p` (no partition is expected before its first)."""
    first_day = date.fromisoformat(p.start_date)

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                "freshness_check",
                asset=key,
                description="yesterday's UTC partition is there by 06:00 UTC; judged by "
                "freshness_checks_sensor (a run that materializes assets skips it)",
            )
            for key in FRESHNESS_ASSETS
        ],
        can_subset=True,
        name="freshness_checks",
    )
    def freshness_checks(context: dg.AssetCheckExecutionContext):
        if context.job_def.asset_layer.selected_asset_keys:
            # a backfill of past days says nothing about whether yesterday is late
            context.log.info(
                "freshness is judged by freshness_checks_sensor, not by a run that materializes "
                "assets"
            )
            return
        now = datetime.now(UTC)
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            yield judge_freshness(context.instance, key.asset_key, now, first_day)

    return freshness_checks


freshness_checks = build_freshness_checks(DEFAULT)


def freshness_due(instance: dg.DagsterInstance, key: dg.AssetCheckKey, now: datetime) -> bool:
    """Judge again when: never judged; a deadline passed since the last verdict; it failed and
    the asset was materialized since; or a run that materialized assets planned it and skipped
    it (the UI shows the latest execution: a verdict again). Not while this sensor's own run of
    it is under way; after one that ended without a verdict, at the next deadline."""
    summary = instance.event_log_storage.get_asset_check_summary_records([key])[key]
    last, done = summary.last_check_execution_record, summary.last_completed_check_execution_record
    deadline = freshness_deadline(now).timestamp()
    if last is not None and last.status == AssetCheckExecutionRecordStatus.PLANNED:
        run = instance.get_run_by_id(last.run_id)
        if run is not None and FRESHNESS_TAG in run.tags:
            return run.is_finished and last.create_timestamp < deadline
        if run is None or run.is_finished:
            return True  # planned, never executed: skipped by a run that materialized assets
    if done is None or done.event is None or done.event.asset_check_evaluation is None:
        return True
    verdict = done.event.asset_check_evaluation
    if done.event.timestamp < deadline:
        return True
    if not verdict.passed:
        latest = instance.get_latest_materialization_event(key.asset_key)
        return latest is not None and latest.timestamp > done.event.timestamp
    return False


def build_freshness_sensor(checks: dg.AssetChecksDefinition) -> dg.SensorDefinition:
    """The sensor that runs the freshness `checks` that are due, checks only."""

    @dg.sensor(
        name="freshness_checks_sensor",
        asset_selection=dg.AssetSelection.checks(checks),
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def freshness_sensor(context: dg.SensorEvaluationContext):
        """Runs the freshness checks that are due (see `freshness_due`), checks only."""
        now = datetime.now(UTC)
        due = [k for k in sorted(checks.check_keys) if freshness_due(context.instance, k, now)]
        if not due:
            return dg.SkipReason("every freshness check has its verdict for the latest deadline")
        return dg.RunRequest(asset_check_keys=due, tags={FRESHNESS_TAG: "sensor"})

    return freshness_sensor


freshness_sensor = build_freshness_sensor(freshness_checks)
