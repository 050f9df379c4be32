"""Samples written by `gpu-pipeline sample` (NVML via nvidia-ml-py), in NVML's own units.

Power is in milliwatts and memory in bytes, as NVML returns them; they are converted here.
"""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import cell, split_rows, to_long
from gpu_pipeline.lib.samples import ParsedLines

MAGIC = "# gpu-pipeline nvml-sampler v1"
FIELDS = {
    "gpu_util_pct": ("util_gpu_pct", 1.0),
    "mem_copy_util_pct": ("util_mem_pct", 1.0),
    "power_w": ("power_mw", 1e-3),
    "power_limit_w": ("power_limit_mw", 1e-3),
    "fb_used_mib": ("mem_used_bytes", 1 / 2**20),
    "gpu_temp_c": ("temp_c", 1.0),
    "sm_clock_mhz": ("sm_clock_mhz", 1.0),
    "mem_clock_mhz": ("mem_clock_mhz", 1.0),
}
IDS = (
    "hostname",
    "gpu_uuid",
    "gpu_index",
    "gpu_model",
    "gpu_instance_id",
    "gpu_instance_profile",
    "driver_version",
)
MEASURES = (
    "util_gpu_pct",
    "util_mem_pct",
    "power_mw",
    "power_limit_mw",
    "mem_used_bytes",
    "mem_total_bytes",
    "temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
)
# the file's header, written by the sampler and read here
COLUMNS = ("timestamp_ms", *IDS, *MEASURES)


def detect(data: bytes, name: str) -> bool:
    return data[:4096].lstrip().startswith(MAGIC.encode())


def parse(text: str, ctx: Context) -> ParsedLines:
    header, body, total, skipped = split_rows(text, 1)
    names = [h.strip() for h in header]
    idx = {n: i for i, n in enumerate(names)}
    missing = [c for c in ("timestamp_ms", "gpu_uuid") if c not in idx]
    if missing:
        raise ValueError(f"NVML sample file lacks column(s) {missing}")
    ts = cell(idx["timestamp_ms"]).cast(pl.Int64, strict=False)
    reason = pl.when(ts.is_null()).then(
        pl.format("timestamp not understood: '{}'", cell(idx["timestamp_ms"]))
    )
    fields = {c: (idx[n], k) for c, (n, k) in FIELDS.items() if n in idx}
    attrs = {a: cell(idx[a]) for a in IDS if a in idx}
    g = to_long(body, len(names), fields, ts, attrs, reason, {c: n for c, (n, _) in FIELDS.items()})
    out = parsed(
        g,
        lines_total=total,
        lines_skipped=skipped,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    out.fields = list(fields)
    return out
