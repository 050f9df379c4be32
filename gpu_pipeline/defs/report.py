"""The daily HTML report as an asset: written beside the lake, its charts shown in the UI."""

import base64

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs import checks
from gpu_pipeline.defs.daily import daily, day_metadata, partition_days
from gpu_pipeline.defs.partitions import window
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import replace_file
from gpu_pipeline.lib.io.report import build_report
from gpu_pipeline.lib.io.report.data import TREND_DAYS

REPORT_INPUTS = [
    "gpu_minutes",
    "gpu_daily",
    "priced_waste",
    "persistent_bottlenecks",
    "recommendations",
    "efficiency_roi",
    "gpu_health",
    "stragglers",
    "namespace_efficiency",
    "workload_efficiency",
    "fleet_daily",
]
# the 7-day trend reads fleet_daily and priced_waste of D-6..D (report/data.py `trend_days`):
# declared, so that a backfill fanned out into several runs writes D's report only once those
# days are written (Dagster's backfill daemon waits for them), never from a day still missing
TREND_INPUTS = ("fleet_daily", "priced_waste")
REPORT_DEPS = [
    dg.AssetDep(k, partition_mapping=window(TREND_DAYS)) if k in TREND_INPUTS else k
    for k in REPORT_INPUTS
]


# a day's charts go into its own materialization for runs of up to this many days; a longer
# backfill records each day's report path only (charts are ~50 KiB each in the event log)
CHART_DAYS = 14


@dg.asset(
    **daily(
        None,
        "reports",
        deps=REPORT_DEPS,
        check_specs=[
            checks.spec(
                "daily_report",
                "made_from_one_ingest",
                "every table of the day was computed from the same ingest of its landing files "
                "(a run killed, or another run of the day, between the steps breaks it)",
                blocking=False,
            )
        ],
    )
)
def daily_report(
    context: dg.AssetExecutionContext, lake: LakeResource, reference: ReferenceResource
):
    """Self-contained HTML report of the day: charts, bottlenecks, waste, recommendations, ROI, health."""
    days, catalog = partition_days(context), reference.load_catalog()
    # what the dollars and thresholds came from: the report's appendix prints them
    in_force = reference.in_force()
    for day in days:
        rep = build_report(lake.open(), day, catalog=catalog, in_force=in_force)
        out = settings.reports_dir(lake.root) / settings.report_name(day)
        replace_file(out, lambda tmp, html=rep.html: tmp.write_text(html))
        # an object-store lake gets a copy beside it (the local one is the pod's, and goes)
        stored = lake.open().put_report(out.name, out)
        meta = {
            "dagster/uri": dg.MetadataValue.path(stored or str(out)),
            "charts": len(rep.charts),
            "bottlenecked_namespaces": ", ".join(rep.bottlenecked_namespaces) or "none",
        }
        if len(days) <= CHART_DAYS:
            meta |= {
                c.title: dg.MetadataValue.md(
                    f"![{c.title}](data:image/png;base64,{base64.b64encode(c.png).decode()})"
                )
                for c in rep.charts
            }
        day_metadata(context, day, meta)
    yield dg.MaterializeResult(metadata={"reports": len(days)})
    store = lake.open()
    yield checks.merge(
        [checks.made_from_one_ingest(store, day, LINEAGE_TABLES) for day in days],
        labels=days,
    )


# the tables whose partitions name the ingest they were made from
LINEAGE_TABLES = ["gpu_samples", "quarantine", "ingest_log", *REPORT_INPUTS]
