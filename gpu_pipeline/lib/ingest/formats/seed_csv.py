"""The seed notebook project's long CSV (`synthetic_dcgm_metrics.csv`): one row per GPU per minute.

Columns are upper-case attributes (SCRAPETIME, UUID, MODELNAME, HOSTNAME, CLUSTERNAME, NAMESPACE,
POD, CONTAINER) and DCGM field names. SCRAPETIME (`%m/%d/%y %H:%M`) has no zone: UTC unless
configured. Its profiling columns are written as percentages, not DCGM's 0–1 ratios: a ratio
column whose values go above 1.5 in a file is read as percent.
"""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.fields import BY_COLUMN, METRIC_TO_COLUMN
from gpu_pipeline.lib.ingest.formats.common import Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import (
    cell,
    names_zone,
    numeric,
    parse_local_time,
    split_rows,
    to_long,
)
from gpu_pipeline.lib.samples import ParsedLines

IDS = {
    "gpu_uuid": "UUID",
    "gpu_model": "MODELNAME",
    "hostname": "HOSTNAME",
    "cluster": "CLUSTERNAME",
    "namespace": "NAMESPACE",
    "pod": "POD",
    "container": "CONTAINER",
}
TIME_FORMATS = ["%m/%d/%y %H:%M", "%m/%d/%Y %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"]


def detect(data: bytes, name: str) -> bool:
    head = data[:65536].decode("utf-8", "ignore")
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    cols = {c.strip().upper() for c in first.split(",")}
    return {"SCRAPETIME", "UUID"} <= cols and any(c.startswith("DCGM_FI_") for c in cols)


def parse(text: str, ctx: Context) -> ParsedLines:
    header, body, total, skipped = split_rows(text, 0)
    names = [h.strip().upper() for h in header]
    idx = {n: i for i, n in enumerate(names)}
    t = cell(idx["SCRAPETIME"])
    ts = parse_local_time(t, TIME_FORMATS, ctx.csv_timezone, names_zone(body, t))
    reason = pl.when(ts.is_null()).then(
        pl.format("timestamp not understood: '{}'", cell(idx["SCRAPETIME"]))
    )
    fields: dict[str, tuple[int, float]] = {}
    metric_names: dict[str, str] = {}
    for n, i in idx.items():
        column = METRIC_TO_COLUMN.get(n.lower())
        if column is None or column in fields:
            continue
        scale = 1.0
        if BY_COLUMN[column].unit == "ratio":
            top = body.select(numeric(cell(i))[0].fill_nan(None).max()).item()
            scale = 0.01 if top is not None and top > 1.5 else 1.0
        fields[column] = (i, scale)
        metric_names[column] = n
    attrs = {a: cell(idx[n]) for a, n in IDS.items() if n in idx}
    g = to_long(body, len(names), fields, ts, attrs, reason, metric_names)
    out = parsed(
        g,
        lines_total=total,
        lines_skipped=skipped,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    used = {*(idx[n] for n in IDS.values() if n in idx), idx["SCRAPETIME"]}
    used |= {i for i, _ in fields.values()}
    out.columns_ignored = [h.strip() for i, h in enumerate(header) if i not in used and h.strip()]
    out.fields = list(fields)
    return out
