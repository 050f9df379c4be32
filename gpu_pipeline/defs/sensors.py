"""Sensors: the landing zone (new or changed files -> runs for the days they touch) and freshness."""

import hashlib
import json
import warnings
from datetime import date, timedelta

import dagster as dg

from gpu_pipeline.defs.jobs import daily_pipeline
from gpu_pipeline.defs.marts import persistent_bottlenecks, recommendations
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.report import daily_report
from gpu_pipeline.defs.resources import LakeResource, LandingResource
from gpu_pipeline.lib.ingest import hash_memo, list_landing, load_or_parse
from gpu_pipeline.lib.rules import DEFAULT

# what a late day changes after itself: persistence of D+1..D+6 reads D's GPU-day
WINDOW_ASSETS = [dg.AssetKey("persistent_bottlenecks"), dg.AssetKey("daily_report")]


def plan_runs(changed_days: set[date], first: date, last: date, token: str) -> list[dg.RunRequest]:
    """Full runs for the days the changed files touch; window-only runs for the 6 days after each."""
    days = sorted(d for d in changed_days if first <= d <= last)
    after = sorted(
        {d + timedelta(days=k) for d in days for k in range(1, DEFAULT.window_days)} - set(days)
    )
    runs = [
        dg.RunRequest(
            partition_key=d.isoformat(), run_key=f"{d}:{token}", tags={"trigger": "landing_zone"}
        )
        for d in days
    ]
    runs += [
        dg.RunRequest(
            partition_key=d.isoformat(),
            run_key=f"window:{d}:{token}",
            asset_selection=WINDOW_ASSETS,
            tags={"trigger": "landing_zone_window"},
        )
        for d in after
        if d <= last
    ]
    return runs


@dg.sensor(
    job=daily_pipeline, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED
)
def landing_zone_sensor(
    context: dg.SensorEvaluationContext, landing: LandingResource, lake: LakeResource
):
    """New or changed landing files: re-run exactly the UTC days their samples touch (late data too)."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    cache = lake.lake().cache_dir
    files = list_landing(landing.root, hash_memo(cache))
    changed = [f for f in files if seen.get(f.source_file) != f.sha256]
    if not changed:
        return dg.SkipReason(f"no new or changed files among {len(files)}")
    days: set[date] = set()
    for f in changed:
        pf = load_or_parse(f, cache)
        days |= set(pf.days) | {pf.home_day}
    token = hashlib.sha256(
        "".join(sorted(f"{f.source_file}:{f.sha256}" for f in changed)).encode()
    ).hexdigest()[:16]
    first = date.fromisoformat(daily_partitions.get_first_partition_key())
    last_key = daily_partitions.get_last_partition_key()  # yesterday: today is not complete yet
    runs = plan_runs(days, first, date.fromisoformat(last_key), token) if last_key else []
    context.log.info(
        f"{len(changed)} new/changed file(s) touch {sorted(map(str, days))}: {len(runs)} run(s)"
    )
    return dg.SensorResult(
        run_requests=runs, cursor=json.dumps({f.source_file: f.sha256 for f in files})
    )


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
