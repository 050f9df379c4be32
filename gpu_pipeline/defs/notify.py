"""The daily digest as an asset: after `daily_report`, one message to the webhook of
`GPU_PIPELINE_NOTIFY_URL` (Slack's incoming-webhook JSON; `lib/io/notify.py` builds and posts it).

Which runs post (`why_not`): a run posts at most one digest, of its last day, and only when

- the URL is set (unset: nothing is posted, the asset says so and succeeds);
- the run config does not say `notify: false`; `notify: true` posts whatever the run;
- otherwise ("auto"): the run is not part of a backfill (a UI or sensor backfill tags its runs
  `dagster/backfill`), and its last day is the schedule's day — the last complete UTC day, or
  any day for the schedule's own run — and no earlier run posted that day's digest (a re-run of
  yesterday does not post it twice) — from the same lake to the same hook (`posted_by`: fleets
  with their own lakes and hooks may share a Dagster instance). So the schedule posts each morning, `gpu-pipeline
  materialize` of a range ending yesterday (`make demo`) posts yesterday's, and a backfill of
  past days, from the UI, the sensor or the CLI, posts nothing unless asked.

A hook that stays down after the retries fails this asset alone, with one line naming the hook by
its scheme and host: the marts and the report are written before it runs. A hook that took the
digest whole but did not answer in time is not posted to again (a webhook's POST is not
idempotent): the asset succeeds with a warning, its materialization `posted` but not `confirmed`.
"""

import hashlib
from datetime import date
from pathlib import Path

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs.daily import daily, day_metadata, partition_days
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import is_uri
from gpu_pipeline.lib.io.notify import (
    Delivery,
    NoAnswer,
    NotifyError,
    build_digest,
    post,
    slack_payload,
)

# Dagster's run tags (dagster._core.storage.tags, private): a run of a backfill, of a schedule
BACKFILL_TAG, SCHEDULE_TAG = "dagster/backfill", "dagster/schedule_name"
# what the digest reads of the day (and persistent_bottlenecks of the day before, undeclared: a
# run that posts is the schedule's, after the day before was written)
DIGEST_DEPS = [
    "daily_report",
    "priced_waste",
    "recommendations",
    "persistent_bottlenecks",
    "gpu_health",
    "fleet_daily",
]
# how the digest is posted (lib/io/notify.py: 4 attempts, 5 s to connect, 10 s for the answer)
DELIVERY = Delivery()


class NotifyResource(dg.ConfigurableResource):
    """Where the daily digest goes: `url`, a Slack-compatible incoming webhook (Slack,
    Mattermost, Teams' Slack-compatible endpoint; "": no digest), bound to
    GPU_PIPELINE_NOTIFY_URL as an EnvVar (the UI shows the variable's name, never its value);
    `report_base_url`, where the reports are served (GPU_PIPELINE_REPORT_BASE_URL: the digest
    links `<base>/gpu_report_<day>.html`; "": the report's path in the lake)."""

    url: str = ""
    report_base_url: str = ""


class DigestConfig(dg.Config):
    """Run config `ops: daily_digest: config: notify: true` posts the run's last day whatever
    the run (a backfill, a past day, a day already posted); `false` never posts; unset: auto."""

    notify: bool | None = None


def why_not(
    notify: bool | None, url: str, tags: dict[str, str], day: date, posted_by: str | None
) -> str | None:
    """Why the run whose last day is `day` does not post its digest, or None: it posts.
    `posted_by`: the run that posted `day`'s digest before, if one did."""
    if not url:
        return f"{settings.ENV_VARS['notify_url']} is unset"
    if notify is not None:
        return None if notify else "run config notify: false"
    ask = "run config notify: true posts it"
    if BACKFILL_TAG in tags:
        return f"a run of backfill {tags[BACKFILL_TAG]} ({ask})"
    last = settings.last_day()
    if SCHEDULE_TAG not in tags and day != last:
        return f"{day} is a past day; the schedule's day is {last} ({ask})"
    if posted_by:
        return (
            f"run {posted_by[:8]} posted the digest of {day} from this lake to this hook "
            f"already ({ask} again)"
        )
    return None


def lake_id(root: str) -> str:
    """A lake as the digest's de-duplication knows it: an object store's URI, a local folder's
    absolute path (`data/lake` and `./data/lake/` are one lake)."""
    root = str(root)
    return root.rstrip("/") if is_uri(root) else str(Path(root).expanduser().resolve())


def hook_id(url: str) -> str:
    """A webhook as the digest's de-duplication knows it, stored in the run's metadata: a slow,
    salted hash of its URL (16 hex digits), never the URL, whose path is a secret."""
    salt = b"gpu_pipeline daily_digest hook"
    return hashlib.pbkdf2_hmac("sha256", url.strip().encode(), salt, 100_000).hex()[:16]


def posted_by(
    instance: dg.DagsterInstance, key: dg.AssetKey, day: date, lake: str, hook: str
) -> str | None:
    """The run that posted `day`'s digest from the lake `lake` (`lake_id`) to the hook `hook`
    (`hook_id`), if one did: the latest materialization of the day whose metadata says so (of
    its last 100: later runs that did not post, a backfill's, come after it). Fleets with their
    own lakes and hooks may share a Dagster instance: another lake's post, or another hook's,
    is not this one's. A materialization that names neither (written before they were
    recorded) counts as this lake's and hook's: a digest is not posted twice."""
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day.isoformat()]), limit=100
    ).records
    for record in found:
        meta = record.asset_materialization.metadata
        posted = meta.get("posted")
        if posted is None or posted.value is not True:
            continue
        ids = {k: meta[k].value for k in ("lake", "hook_id") if k in meta}
        if ids.get("lake", lake) == lake and ids.get("hook_id", hook) == hook:
            return record.run_id
    return None


def report_location(lake: LakeResource, base_url: str, day: date) -> str:
    """What the digest links: the report under `base_url`, else beside an object-store lake,
    else its path in the local lake."""
    name = settings.report_name(day)
    if base_url:
        return f"{base_url.rstrip('/')}/{name}"
    return lake.open().report_uri(name) or str(settings.reports_dir(lake.root) / name)


@dg.asset(**daily(None, "reports", deps=DIGEST_DEPS))
def daily_digest(
    context: dg.AssetExecutionContext,
    config: DigestConfig,
    lake: LakeResource,
    reference: ReferenceResource,
    notify: NotifyResource,
) -> dg.MaterializeResult:
    """The day's digest posted to GPU_PIPELINE_NOTIFY_URL: waste, top actions, new bottlenecks, drains."""
    days = partition_days(context)
    last = days[-1]
    for day in days[:-1]:
        day_metadata(context, day, {"posted": False, "why": f"a run posts its last day, {last}"})
    key, where = context.asset_key, lake_id(lake.root)
    hook = hook_id(notify.url) if notify.url else ""
    why = why_not(
        config.notify,
        notify.url,
        dict(context.run.tags),
        last,
        posted_by(context.instance, key, last, where, hook) if notify.url else None,
    )
    if why is not None:
        context.log.info(f"{last}: digest not posted: {why}")
        day_metadata(context, last, {"posted": False, "why": why})
        return dg.MaterializeResult(metadata={"days": len(days)})
    link = report_location(lake, notify.report_base_url, last)
    digest = build_digest(lake.open(), last, link, reference.load_rules().thresholds)
    origin, payload = settings.url_origin(notify.url), slack_payload(digest)
    sent = {"posted": True, "confirmed": True, "lake": where, "hook_id": hook, "webhook": origin}
    try:
        sent["attempts"] = post(notify.url, payload, DELIVERY, log=context.log.warning)
        context.log.info(f"{last}: digest posted to {origin}")
    except NoAnswer as e:  # sent, maybe delivered: not posted again, by this run or the next
        context.log.warning(f"{last}: {e}")
        sent |= {"confirmed": False, "why": str(e)}
    except NotifyError as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None
    sent |= {"digest": dg.MetadataValue.json(digest.figures()), "text": payload["text"]}
    day_metadata(context, last, sent)
    return dg.MaterializeResult(metadata={"days": len(days)})
