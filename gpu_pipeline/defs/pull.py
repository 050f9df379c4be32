"""The Prometheus pull as a daily asset upstream of `gpu_samples` (when a server is configured)."""

from pathlib import Path

import dagster as dg

from gpu_pipeline.defs.daily import daily, day_metadata, partition_days
from gpu_pipeline.defs.resources import LandingResource, PromResource
from gpu_pipeline.lib.ingest.pull import pull_day


@dg.asset(
    **daily(None, "raw"),
    check_specs=[
        dg.AssetCheckSpec(
            "server_has_data",
            asset="prometheus_export",
            blocking=False,
            description="the server held DCGM samples for the day (warns when it held none)",
        )
    ],
)
def prometheus_export(
    context: dg.AssetExecutionContext, prometheus: PromResource, landing: LandingResource
):
    """Each UTC day's DCGM series fetched from the Prometheus-compatible server into the landing
    zone, as query_range JSON (one gzip per metric and window; a re-pull writes the same bytes)."""
    server = prometheus.server()
    # this step writes the landing zone: it is made if missing (the ingest after it fails on a
    # landing zone that cannot be read, never one the pull found nothing for)
    Path(landing.root).mkdir(parents=True, exist_ok=True)
    reports = []
    for day in partition_days(context):
        rep = pull_day(server, day, landing.root, progress=context.log.info)
        reports.append(rep)
        for w in rep.warnings[:20]:
            context.log.warning(f"{day}: server warning: {w}")
        if rep.empty:
            context.log.warning(f"{day}: {server.public_url} holds no DCGM samples for this day")
        day_metadata(
            context,
            day,
            {
                "files": len(rep.files),
                "files_changed": rep.written,
                "samples": rep.samples,
                "bytes": rep.bytes,
                "seconds": round(rep.seconds, 2),
                "metrics": ", ".join(sorted(rep.metrics)) or "none",
            },
        )
    empty = [str(r.day) for r in reports if r.empty]
    samples = sum(r.samples for r in reports)
    yield dg.MaterializeResult(
        metadata={
            "server": server.public_url,
            "mode": server.mode,
            "days": len(reports),
            "files": sum(len(r.files) for r in reports),
            "files_changed": sum(r.written for r in reports),
            "samples": samples,
            "bytes": sum(r.bytes for r in reports),
            "queries": sum(r.queries for r in reports),
            "seconds": round(sum(r.seconds for r in reports), 2),
            "metrics": ", ".join(sorted({m for r in reports for m in r.metrics})) or "none",
            "warnings": dg.MetadataValue.md(
                "\n".join(f"- {w}" for r in reports for w in r.warnings[:50]) or "none"
            ),
            "days_without_data": ", ".join(empty) or "none",
        }
    )
    yield dg.AssetCheckResult(
        check_name="server_has_data",
        passed=not empty,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"days_without_data": ", ".join(empty) or "none", "samples": samples},
    )
