"""The daily HTML report as an asset: written beside the lake, its charts shown in the UI."""

import base64

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource
from gpu_pipeline.lib.report import build_report


@dg.asset(
    partitions_def=daily_partitions,
    group_name="reports",
    deps=[
        "gpu_minutes",
        "gpu_daily",
        "priced_waste",
        "persistent_bottlenecks",
        "recommendations",
        "efficiency_roi",
        "gpu_health",
        "stragglers",
        "namespace_efficiency",
    ],
)
def daily_report(context: dg.AssetExecutionContext, lake: LakeResource):
    """Self-contained HTML report of the day: charts, bottlenecks, waste, recommendations, ROI, health."""
    day = context.partition_time_window.start.date()
    rep = build_report(lake.lake(), day)
    out = settings.reports_dir(lake.root) / f"gpu_report_{day.isoformat()}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("." + out.name + ".tmp")
    tmp.write_text(rep.html)
    tmp.replace(out)
    charts = {
        f"chart_{i + 1}_{c.title.lower().replace(' ', '_')}": dg.MetadataValue.md(
            f"![{c.title}](data:image/png;base64,{base64.b64encode(c.png).decode()})"
        )
        for i, c in enumerate(rep.charts)
    }
    return dg.MaterializeResult(
        metadata={
            "dagster/uri": dg.MetadataValue.path(str(out)),
            "charts": len(rep.charts),
            "bottlenecked_namespaces": ", ".join(rep.bottlenecked_namespaces) or "none",
            **charts,
        }
    )
