"""`nvidia-smi --query-gpu=… --format=csv[,nounits]` output, any column order or subset.

Headers may carry units (`power.draw [W]`), values too (`433.78 W`); `[N/A]`-style values mean
"no value". Timestamps have no zone: UTC unless configured (GPU_PIPELINE_CSV_TIMEZONE). Loop logs
without a uuid or index column (one row per GPU per loop) get their GPU from the row's position
within its loop; the identity is then synthetic (`GPU-anon-<file hash>-<position>`).
"""

from __future__ import annotations

import hashlib

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import (
    cell,
    header_name,
    parse_local_time,
    split_rows,
    to_long,
)
from gpu_pipeline.lib.samples import ParsedLines

# query name -> canonical column; several names for one column are tried in order per row
FIELD_NAMES: dict[str, list[str]] = {
    "gpu_util_pct": ["utilization.gpu"],
    "mem_copy_util_pct": ["utilization.memory"],
    "enc_util_pct": ["utilization.encoder"],
    "dec_util_pct": ["utilization.decoder"],
    "power_w": ["power.draw", "power.draw.average", "power.draw.instant"],
    "power_limit_w": ["enforced.power.limit", "power.limit", "power.management.limit"],
    "fb_used_mib": ["memory.used"],
    "fb_free_mib": ["memory.free"],
    "fb_reserved_mib": ["memory.reserved"],
    "gpu_temp_c": ["temperature.gpu"],
    "mem_temp_c": ["temperature.memory"],
    "sm_clock_mhz": ["clocks.sm", "clocks.current.sm"],
    "mem_clock_mhz": ["clocks.mem", "clocks.current.memory"],
}
ID_NAMES = {
    "gpu_uuid": "uuid",
    "gpu_index": "index",
    "gpu_model": "name",
    "driver_version": "driver_version",
    "gpu_instance_id": "mig.gpu_instance_id",
}
TIME_FORMATS = [
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
]
KNOWN = (
    {n for names in FIELD_NAMES.values() for n in names} | set(ID_NAMES.values()) | {"timestamp"}
)


def detect(head: str, name: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    names = {header_name(h) for h in first.split(",")}
    return (
        "," in first
        and len(names & KNOWN) >= 2
        and bool(names & {n for v in FIELD_NAMES.values() for n in v})
    )


def _loop_position(ts: pl.Expr) -> pl.Expr:
    """Position of a row within its loop, for logs that list the GPUs in turn with no identity.

    Gaps inside a loop are milliseconds, between loops ~100 ms or more; the usual loop size is
    taken from the gap-separated groups, and positions count rows modulo that size from where
    loops usually start (robust to a stall in the middle of one loop).
    """
    dt = ts.diff()
    starts = dt.is_null() | (dt > pl.max_horizontal(pl.lit(10.0), 0.5 * dt.quantile(0.99)))
    size = pl.len().over(starts.cum_sum()).mode().first()
    row = pl.int_range(pl.len())
    offset = (row % size).filter(starts).mode().first()
    return (row - offset) % size


def parse(text: str, ctx: Context) -> ParsedLines:
    header_at = next(i for i, ln in enumerate(text.split("\n")) if ln.strip())
    header, body, total, skipped = split_rows(text, header_at)
    names = [header_name(h) for h in header]
    idx = {n: i for i, n in reversed(list(enumerate(names)))}
    if "timestamp" in idx:
        ts_ms = parse_local_time(cell(idx["timestamp"]), TIME_FORMATS, ctx.csv_timezone)
        row_reason = pl.when(ts_ms.is_null()).then(
            pl.format("timestamp not understood: '{}'", cell(idx["timestamp"]))
        )
    else:
        ts_ms = pl.lit(
            None if ctx.file_time is None else int(ctx.file_time.timestamp() * 1000), pl.Int64
        )
        row_reason = None
    attrs = {a: cell(idx[n]) for a, n in ID_NAMES.items() if n in idx}
    if "uuid" not in idx:
        tag = hashlib.sha256(ctx.source_file.encode()).hexdigest()[:8]
        if "index" in idx:
            attrs["gpu_uuid"] = pl.format(f"GPU-anon-{tag}-{{}}", cell(idx["index"]))
        else:
            body = body.with_columns(ts_ms.alias("_t")).with_columns(
                _loop_position(pl.col("_t")).alias("_pos")
            )
            attrs["gpu_uuid"] = pl.format(f"GPU-anon-{tag}-{{}}", pl.col("_pos"))
            attrs["gpu_index"] = pl.col("_pos").cast(pl.String)
    fields = {}
    metric_names = {}
    for column, candidates in FIELD_NAMES.items():
        present = [idx[n] for n in candidates if n in idx]
        if present:
            fields[column] = (present, 1.0)
            metric_names[column] = next(n for n in candidates if n in idx)
    g = to_long(body, len(header), fields, ts_ms, attrs, row_reason, metric_names)
    g = g.drop([c for c in ("_t", "_pos") if c in g.columns])
    basis = "sample" if "timestamp" in idx else ctx.file_time_basis
    return parsed(
        g, lines_total=total, lines_skipped=skipped, time_basis=basis, window=ctx.time_window()
    )
