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

import numpy as np
import polars as pl

from gpu_pipeline.lib.ingest.formats.common import Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import cell, parse_local_time, to_long
from gpu_pipeline.lib.samples import ParsedLines

HEADER = re.compile(r"^[ \t]*#[ \t]*Date[ \t]+Time[ \t]+gpu\b.*$", re.M)
# a header line, among the lines (`parse`)
HEADER_LINE = r"^[ \t]*#[ \t]*Date[ \t]+Time[ \t]+gpu\b"
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
    """The log's rows, each read with the header above it (`_blocks`): a header written again
    with the same columns (every screenful) is skipped, one with other columns (the logger
    restarted with other `-s` groups) names the columns of the rows below it. Before, every row
    was read with the first header's columns: at a restart with `-s u` an `sm` of 97 % was a
    power of 97 W, or each row was quarantined as "expected 14 comma-separated fields"
    (adversarial review). Units lines are comments: no column is scaled by its unit."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    raw = pl.col("raw")
    df = (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), raw.str.strip_suffix("\r"))
    )
    heads = df.filter(raw.str.contains(HEADER_LINE))
    if heads.height == 0:
        raise ValueError("no '#Date Time gpu' header above the rows")
    # comments (the header, written again every screenful) and blank lines are read, not records
    body = df.filter(~raw.str.strip_chars().str.starts_with("#") & (raw.str.strip_chars() != ""))
    # `-o DT` puts the date, time and GPU index first, whatever the `-s` groups (`HEADER`)
    stamp = pl.concat_str(cell(0), pl.lit(" "), cell(1))
    ts = parse_local_time(stamp, TIME_FORMATS, ctx.csv_timezone)
    why = pl.when(ts.is_null()).then(pl.format("timestamp not understood: '{}'", stamp))
    body = body.with_columns(
        raw.str.strip_chars().str.replace_all(r"\s+", " ").str.split(" ").alias("cells")
    ).with_columns(ts.alias("_ts"), why.alias("_why"))
    blocks = _blocks(heads, body)
    if all(_pmon(names) for names, _ in blocks):  # pmon: its rows are processes, not GPUs
        raise ValueError(PER_PROCESS)
    g = pl.concat([_read_block(names, rows) for names, rows in blocks], how="diagonal_relaxed")
    g = g.sort("line", maintain_order=True).drop("_ts", "_why")
    # a row of another length than its header: dmon's cells are separated by blanks
    g = g.with_columns(
        pl.col("pre_reason").str.replace("comma-separated", "whitespace-separated", literal=True)
    )
    out = parsed(
        g,
        lines_total=df.height,
        lines_skipped=df.height - body.height,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    used = {"Date", "Time", "gpu", *COLUMNS}
    names = [n for names, _ in blocks if not _pmon(names) for n in names]
    out.columns_ignored = list(dict.fromkeys(n for n in names if n not in used))
    out.fields = list(dict.fromkeys(COLUMNS[n] for n in names if n in COLUMNS))
    out.last_header = heads["raw"][-1]  # the next piece's rows below it (`PieceParse`)
    return out


def _blocks(heads: pl.DataFrame, body: pl.DataFrame) -> list[tuple[list[str], pl.DataFrame]]:
    """The rows by the header above them (rows above the first header: the first's), one block
    for all the rows under headers of the same columns: a day's log repeats its header every
    screenful, thousands of times, and has few distinct ones."""
    cols = [h.strip().lstrip("#").split() for h in heads["raw"]]
    key_of: dict[tuple[str, ...], int] = {}
    of_head = np.array([key_of.setdefault(tuple(c), len(key_of)) for c in cols], dtype=np.int64)
    at = np.searchsorted(heads["line"].to_numpy(), body["line"].to_numpy(), "right") - 1
    block = of_head[np.clip(at, 0, None)]
    out = []
    for names, i in key_of.items():
        out.append((list(names), body.filter(pl.Series(block == i))))
    return out


def _pmon(names: list[str]) -> bool:
    """A header of `nvidia-smi pmon` (its rows are processes), which shares dmon's first
    columns."""
    return bool({"pid", "command", "type"} & set(names))


# a pmon block among dmon blocks: each of its rows one quarantined record (review of the dmon
# fix: a pmon header anywhere refused the whole log, its dmon rows too)
PMON_ROW = "a row of nvidia-smi pmon (a process's share, not the GPU's) in a dmon log: not read"


def _read_block(names: list[str], rows: pl.DataFrame) -> pl.DataFrame:
    """The candidate samples of rows under a header of `names` (`wide_csv.to_long`); under a
    pmon header, each row one record rejected whole (`PMON_ROW`)."""
    idx = {n: i for i, n in enumerate(names)}
    if _pmon(names):
        gpu = {"gpu_index": cell(idx["gpu"])}
        return to_long(rows, len(names), {}, pl.col("_ts"), gpu, pl.lit(PMON_ROW))
    fields = {f: ([idx[c]], 1.0) for c, f in COLUMNS.items() if c in idx}
    metric = {f: c for c, f in COLUMNS.items() if c in idx}
    attrs = {"gpu_index": cell(idx["gpu"])}
    return to_long(rows, len(names), fields, pl.col("_ts"), attrs, pl.col("_why"), metric)
