"""`nvidia-smi dmon -o DT`: one row per GPU per interval, `#Date Time gpu pwr gtemp …` above
(the header is written again every screenful). Rows are whitespace-separated; `-` is no value.
The date and time are local (zone as for CSV, `GPU_PIPELINE_CSV_TIMEZONE`); a GPU is known by
its index (within its host, else its file: `formats.common.fill_identity`). Without `-o DT`
dmon writes no time: such a file is refused whole with how to log it instead (`landing.py`).

Columns read (dmon's `-s` groups; the rest are listed as ignored): `sm` (utilization, as
`utilization.gpu`), `mem`, `enc`, `dec`, `pwr`, `gtemp`, `mtemp`, `mclk`, `pclk`, `fb`.
"""

from __future__ import annotations

import re

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import cell, parse_local_time, to_long
from gpu_pipeline.lib.samples import ParsedLines

HEADER = re.compile(r"^[ \t]*#[ \t]*Date[ \t]+Time[ \t]+gpu\b.*$", re.M)
# dmon's column -> (field, scale)
COLUMNS = {
    "sm": "gpu_util_pct",
    "mem": "mem_copy_util_pct",
    "enc": "enc_util_pct",
    "dec": "dec_util_pct",
    "pwr": "power_w",
    "gtemp": "gpu_temp_c",
    "mtemp": "mem_temp_c",
    "mclk": "mem_clock_mhz",
    "pclk": "sm_clock_mhz",
    "fb": "fb_used_mib",
}
TIME_FORMATS = ["%Y%m%d %H:%M:%S"]


def detect(data: bytes, name: str) -> bool:
    return HEADER.search(data[:65536].decode("utf-8", "ignore")) is not None


PER_PROCESS = (
    "nvidia-smi pmon output: a row per process (pid, command), its sm % the process's share, "
    "not the GPU's utilization. Log the GPUs with nvidia-smi dmon -o DT or --query-gpu. File "
    "quarantined whole"
)


def parse(text: str, ctx: Context) -> ParsedLines:
    names = HEADER.search(text).group(0).strip().lstrip("#").split()
    if {"pid", "command", "type"} & set(names):  # pmon: its rows are processes, not GPUs
        raise ValueError(PER_PROCESS)
    idx = {n: i for i, n in enumerate(names)}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    raw = pl.col("raw")
    df = (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), raw.str.strip_suffix("\r"))
    )
    # comments (the header, written again every screenful) and blank lines are read, not records
    body = df.filter(~raw.str.strip_chars().str.starts_with("#") & (raw.str.strip_chars() != ""))
    body = body.with_columns(
        raw.str.strip_chars().str.replace_all(r"\s+", " ").str.split(" ").alias("cells")
    )
    stamp = pl.concat_str(cell(idx["Date"]), pl.lit(" "), cell(idx["Time"]))
    ts = parse_local_time(stamp, TIME_FORMATS, ctx.csv_timezone)
    reason = pl.when(ts.is_null()).then(pl.format("timestamp not understood: '{}'", stamp))
    fields = {f: ([idx[c]], 1.0) for c, f in COLUMNS.items() if c in idx}
    attrs = {"gpu_index": cell(idx["gpu"])}
    metric = {f: c for c, f in COLUMNS.items() if c in idx}
    g = to_long(body, len(names), fields, ts, attrs, reason, metric)
    out = parsed(
        g,
        lines_total=df.height,
        lines_skipped=df.height - body.height,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    used = {"Date", "Time", "gpu", *metric.values()}
    out.columns_ignored = [n for n in names if n not in used]
    out.fields = list(fields)
    return out
