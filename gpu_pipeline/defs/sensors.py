"""Sensors: the landing zone (new or changed files -> a backfill of the days they touch) and
freshness.

A sensor decides; runs work. A tick only lists the landing zone (hashes are remembered by path,
size and mtime) and reads the parse cache. Files it has not seen parsed get a `parse_landing`
run first; once they are parsed, the tick knows the UTC days their samples touch and launches
one asset backfill: every daily asset for those days, and `persistent_bottlenecks` and
`daily_report` for the six days after each (their 7-day window reads the late day). Dagster's
backfill daemon runs it in dependency order, so a window day waits for the late day's
`gpu_daily`, and the end state is the one a clean backfill of the same files gives.
"""

import hashlib
import json
import warnings
from datetime import date, timedelta

import dagster as dg

# private in Dagster 1.13 (pinned in pyproject.toml): the documented way for a sensor to launch an
# asset backfill is `RunRequest.for_asset_graph_subset`, whose argument type lives here
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

from gpu_pipeline.defs.marts import WINDOW_DAYS, persistent_bottlenecks, recommendations
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.report import daily_report
from gpu_pipeline.defs.resources import LakeResource, LandingResource
from gpu_pipeline.lib.ingest.cache import is_cached, load_or_parse, parse_all
from gpu_pipeline.lib.ingest.landing import (
    LandingRootError,
    check_landing_root,
    hash_memo,
    list_landing,
)
from gpu_pipeline.settings import current

# what a late day changes after itself: persistence of D+1..D+6 reads D's GPU-day
WINDOW_ASSETS = [dg.AssetKey("persistent_bottlenecks"), dg.AssetKey("daily_report")]
SENSOR_INTERVAL_S = current().sensor_interval_s


@dg.asset(group_name="raw", kinds={"parquet"})
def landing_files(context: dg.AssetExecutionContext, landing: LandingResource, lake: LakeResource):
    """Every landing file parsed once into the lake's ingest cache (keyed by content); the
    landing-zone sensor asks for this before it plans the days new files touch."""
    try:
        check_landing_root(landing.root)
    except LandingRootError as e:
        raise dg.Failure(description=str(e)) from None
    cache, opts = lake.lake().cache_dir, landing.parse_options()
    files = list_landing(landing.root, hash_memo(cache))
    todo = [f for f in files if not is_cached(f, cache, opts)]

    for f, pf in zip(todo, parse_all(todo, cache, opts), strict=True):
        context.log.info(f"{f.source_file}: {pf.format}, days {[str(d) for d in pf.days]}")
    return dg.MaterializeResult(metadata={"files": len(files), "parsed": len(todo)})


def plan_backfill(
    changed_days: set[date], first: date, last: date, partitioned: list[dg.AssetKey]
) -> dict[dg.AssetKey, list[str]]:
    """Partition keys per asset: every asset for the changed days, the window assets for the six
    days after each (only days that have a partition: first..last)."""
    days = sorted(d for d in changed_days if first <= d <= last)
    after = {d + timedelta(days=k) for d in days for k in range(1, WINDOW_DAYS)} - set(days)
    window = sorted(d for d in after if d <= last)
    out: dict[dg.AssetKey, list[str]] = {}
    for key in partitioned:
        keys = days + (window if key in WINDOW_ASSETS else [])
        if keys:
            out[key] = [d.isoformat() for d in sorted(keys)]
    return out


def _partitioned_keys(context: dg.SensorEvaluationContext) -> list[dg.AssetKey]:
    graph = context.repository_def.asset_graph
    return sorted(
        (k for k in graph.get_all_asset_keys() if graph.get(k).partitions_def == daily_partitions),
        key=lambda k: k.to_user_string(),
    )


@dg.sensor(
    asset_selection=dg.AssetSelection.assets(landing_files)
    | dg.AssetSelection.all() - dg.AssetSelection.groups("warehouse"),
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def landing_zone_sensor(
    context: dg.SensorEvaluationContext, landing: LandingResource, lake: LakeResource
):
    """New or changed landing files: backfill exactly the UTC days their samples touch, and the
    persistence window after them (late data), in dependency order."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    try:
        check_landing_root(landing.root)
    except LandingRootError as e:
        return dg.SkipReason(str(e))
    cache, opts = lake.lake().cache_dir, landing.parse_options()
    files = list_landing(landing.root, hash_memo(cache))
    changed = [f for f in files if seen.get(f.source_file) != f.sha256]
    if not changed:
        return dg.SkipReason(f"no new or changed files among {len(files)}")
    token = hashlib.sha256(
        "".join(sorted(f"{f.source_file}:{f.sha256}" for f in changed)).encode()
    ).hexdigest()[:16]
    unparsed = [f for f in changed if not is_cached(f, cache, opts)]
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
    parsed = {f.source_file: load_or_parse(f, cache, opts) for f in changed}  # reads meta.json only
    # a file the lake already ingested with this content (a UI or CLI backfill before the
    # sensor was turned on) is not news: only files some day's ingest_log lacks are planned
    the_lake = lake.lake()
    logged: set[tuple[date, str, str]] = set()
    for d in {d for pf in parsed.values() for d in pf.touched_days()}:
        if the_lake.exists("ingest_log", d):
            log = the_lake.read("ingest_log", d)
            logged |= {
                (d, src, sha) for src, sha in zip(log["source_file"], log["sha256"], strict=True)
            }
    fresh = [
        f
        for f in changed
        if any(
            (d, f.source_file, f.sha256) not in logged for d in parsed[f.source_file].touched_days()
        )
    ]
    cursor = json.dumps({f.source_file: f.sha256 for f in files})
    if not fresh:
        return dg.SensorResult(
            skip_reason=f"{len(changed)} file(s) new to the sensor are already in the lake",
            cursor=cursor,
        )
    days: set[date] = set()
    for f in fresh:
        pf = parsed[f.source_file]
        days |= set(pf.touched_days())
    first = date.fromisoformat(daily_partitions.get_first_partition_key())
    last_key = daily_partitions.get_last_partition_key()  # yesterday: today is not complete yet
    plan = (
        plan_backfill(days, first, date.fromisoformat(last_key), _partitioned_keys(context))
        if last_key
        else {}
    )
    context.log.info(
        f"{len(fresh)} new/changed file(s) touch {sorted(map(str, days))}: "
        f"backfill of {sum(map(len, plan.values()))} asset partition(s)"
    )
    requests = []
    if plan:
        subset = AssetGraphSubset(
            partitions_subsets_by_asset_key={
                k: daily_partitions.subset_with_partition_keys(v) for k, v in plan.items()
            }
        )
        requests.append(
            dg.RunRequest.for_asset_graph_subset(
                subset, tags={"trigger": "landing_zone", "gpu_pipeline/files": token}
            )
        )
    return dg.SensorResult(run_requests=requests, cursor=cursor)


# Dagster 1.13 marks these builders superseded by FreshnessPolicy, whose evaluation is not yet
# partition-aware; "yesterday's partition exists by 06:00" is exactly what this check asks.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    freshness_checks = dg.build_time_partition_freshness_checks(
        assets=[dg.AssetKey("priced_waste"), recommendations, persistent_bottlenecks, daily_report],
        deadline_cron="0 6 * * *",  # yesterday's marts are expected by 06:00 UTC
        timezone="UTC",
    )
    freshness_sensor = dg.build_sensor_for_freshness_checks(
        freshness_checks=freshness_checks, name="freshness_checks_sensor"
    )
