"""`nvidia-smi --query-gpu=… --format=csv[,nounits]` output, any column order or subset, and the
CSV logs people write by hand around it (`time, gpu_utilization[%], temperature[°C]`).

Headers are matched by name (`HEADER_ALIASES`: nvidia-smi's query names and common hand-written
ones) after their unit (`[W]`, `(W)`) is cut off; a unit in the header that differs from the
field's (`[mW]`, `[GiB]`) scales the values. Header names that map to nothing are listed
(`columns_ignored`). Values may carry units (`433.78 W`); `[N/A]`-style values mean "no value".
Times are nvidia-smi's `YYYY/MM/DD HH:MM:SS.fff`, ISO-8601, or epoch seconds / milliseconds;
zone-less times are UTC unless configured (GPU_PIPELINE_CSV_TIMEZONE).

A file without a header line (`--format=csv,noheader`) takes the header of a `header.csv` beside
it (`Context.csv_header`), else it is rejected with a reason that says so.

Identity, in order: the uuid column; the pci.bus_id (within the file); the index; without any of
them the rows one loop iteration printed together (`loop_positions`), the loop's structure
decided over every part of the file under the same header and handed to the file's next piece
(`_placements`).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import polars as pl

from gpu_pipeline.lib.ingest.formats.common import NA_VALUES, Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import (
    cell,
    names_zone,
    parse_local_time,
    split_rows,
    to_long,
)
from gpu_pipeline.lib.samples import ParsedLines


def header_key(h: str) -> tuple[str, str]:
    """(name, unit) of a header cell: `power.draw [W]` -> (`power_draw`, `w`); dots, spaces and
    dashes are one separator, case does not matter, a trailing `[unit]` or `(unit)` is the unit."""
    h = h.strip().strip('"').strip().lower()
    unit = ""
    if m := re.search(r"\s*[\[(]([^\[\]()]*)[\])]\s*$", h):
        unit, h = m.group(1).strip(), h[: m.start()]
    return re.sub(r"[\s._\-/]+", "_", h.strip()).strip("_"), unit


def _keys(*names: str) -> list[str]:
    return [header_key(n)[0] for n in names]


# canonical field -> header names, most specific first (several names for one field: the first
# non-empty value of a row wins, e.g. power.draw, then power.draw.average / .instant)
HEADER_ALIASES: dict[str, list[str]] = {
    "gpu_util_pct": _keys(
        "utilization.gpu",
        "gpu_utilization",
        "gpu_util",
        "gpu_util_pct",
        "utilization",
        "util",
        "gpu_usage",
        "gpu_busy",
    ),
    "mem_copy_util_pct": _keys(
        "utilization.memory", "memory_utilization", "mem_util", "memory_util"
    ),
    "enc_util_pct": _keys("utilization.encoder", "encoder_utilization", "enc_util"),
    "dec_util_pct": _keys("utilization.decoder", "decoder_utilization", "dec_util"),
    "power_w": _keys(
        "power.draw",
        "power.draw.average",
        "power.draw.instant",
        "power_draw",
        "power",
        "power_usage",
        "gpu_power",
        "power_w",
        "power_watts",
    ),
    "power_limit_w": _keys(
        "enforced.power.limit", "power.limit", "power.management.limit", "power_cap"
    ),
    "fb_used_mib": _keys(
        "memory.used", "mem_used", "used_memory", "gpu_memory_used", "vram_used", "fb_used"
    ),
    "fb_free_mib": _keys("memory.free", "mem_free", "free_memory"),
    "fb_reserved_mib": _keys("memory.reserved"),
    "gpu_temp_c": _keys("temperature.gpu", "gpu_temperature", "gpu_temp", "temperature", "temp"),
    "mem_temp_c": _keys("temperature.memory", "memory_temperature", "mem_temp"),
    "sm_clock_mhz": _keys("clocks.sm", "clocks.current.sm", "sm_clock"),
    "mem_clock_mhz": _keys("clocks.mem", "clocks.current.memory", "mem_clock", "memory_clock"),
}
ID_ALIASES: dict[str, list[str]] = {
    "timestamp": _keys(
        "timestamp", "time", "datetime", "date_time", "ts", "epoch", "unix_time", "time_stamp"
    ),
    "gpu_uuid": _keys("uuid", "gpu_uuid"),
    "pci_bus_id": _keys("pci.bus_id", "pci_bus_id", "bus_id", "busid"),
    "gpu_index": _keys("index", "gpu_index", "gpu_id"),
    "gpu_model": _keys("name", "gpu_name", "gpu_model", "model", "product_name"),
    "hostname": _keys("hostname", "host", "node"),
    "driver_version": _keys("driver_version"),
    "gpu_instance_id": _keys("mig.gpu_instance_id"),
}
# header units that are not the field's: the factor to the field's unit
UNIT_FACTORS = {
    "mw": 1e-3,
    "kw": 1e3,
    "gib": 1024.0,
    "gb": 1024.0,
    "kib": 1 / 1024,
    "kb": 1 / 1024,
    "b": 1 / 2**20,
    "bytes": 1 / 2**20,
    "ghz": 1e3,
    "khz": 1e-3,
}
UNIT_FIELDS = {
    "power_w": "w",
    "power_limit_w": "w",
    "fb_used_mib": "mib",
    "fb_free_mib": "mib",
    "fb_reserved_mib": "mib",
    "sm_clock_mhz": "mhz",
    "mem_clock_mhz": "mhz",
}
TIME_FORMATS = [
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.fZ",
]
KNOWN = {n for names in (*HEADER_ALIASES.values(), *ID_ALIASES.values()) for n in names}
FIELD_KEYS = {n for names in HEADER_ALIASES.values() for n in names}

# a time as the first cell of a headerless row: nvidia-smi's, ISO-8601, or epoch s / ms
_TIME_CELL = re.compile(
    r"^\s*(\d{4}[/-]\d{2}[/-]\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z| UTC|[+-]\d{2}:?\d{2})?"
    r"|1\d{9}(\.\d+)?|1\d{12}(\.\d+)?)\s*$"
)
HEADER_FILE = "header.csv"
NO_HEADER = (
    "CSV without a header line (nvidia-smi --format=csv,noheader?): its columns cannot be told "
    f"apart. Put the header line (the --query-gpu fields, e.g. `timestamp, uuid, "
    f"utilization.gpu [%], power.draw [W]`) in a file named {HEADER_FILE} in the same folder: it "
    "applies to every headerless CSV there. File quarantined whole"
)


def _first_line(text: str) -> str:
    return next((ln for ln in text[:65536].splitlines() if ln.strip()), "")


def _is_header(first: str) -> bool:
    names = {header_key(h)[0] for h in first.split(",")}
    return "," in first and len(names & KNOWN) >= 2 and bool(names & FIELD_KEYS)


def _is_headerless(text: str) -> bool:
    """Rows that start with a time and have the same number of cells, no header above them."""
    lines = [ln for ln in text[:65536].splitlines() if ln.strip()][:5]
    widths = {ln.count(",") for ln in lines}
    return (
        bool(lines)
        and len(widths) == 1
        and min(widths) >= 1
        and all(_TIME_CELL.match(ln.split(",", 1)[0]) for ln in lines)
    )


def detect(data: bytes, name: str) -> bool:
    text = data[:65536].decode("utf-8", "ignore")
    first = _first_line(text)
    return _is_header(first) or _is_headerless(text)


# gaps between rows of one loop iteration are milliseconds; between iterations the loop interval
MAX_ITERATION_GAP_MS = 50.0
# the typical gap between iterations is at least this many times the typical one inside
MIN_SEPARATION = 3.0
# nvidia-smi slow on many GPUs prints the rows of one iteration up to this far apart (typical
# gap); such a log's iterations are told only when its gaps fall in two classes far apart:
# the typical gap between iterations WIDE_SEPARATION times the typical one inside, and nearly
# every gap inside (SLOW_ROW_QUANTILE of them) below the split
MAX_SLOW_ROW_GAP_MS = 400.0
WIDE_SEPARATION = 5.0
SLOW_ROW_QUANTILE = 0.98
MAX_GPUS_PER_LOG = 256


def _iteration_split(gaps: np.ndarray) -> tuple[float, bool] | None:
    """The gap above which a new loop iteration starts and whether the rows inside one are
    printed slowly (over MAX_ITERATION_GAP_MS apart), or None when every row is its own
    iteration (one GPU). Judged from the typical gaps, not the longest: the gaps are split in
    two classes (Otsu's method on their logarithms); the lower class must be at least a third
    of all gaps (N-1 of N rows of an N-GPU loop) and its median MIN_SEPARATION times below the
    upper class's, and milliseconds (median at most MAX_ITERATION_GAP_MS), or, rows printed
    slowly (a median up to MAX_SLOW_ROW_GAP_MS), far apart from the upper class (`_far_apart`).
    Stalls only lengthen gaps of the upper class; the split is half its median."""
    g = np.log10(np.sort(np.clip(np.abs(gaps), 1.0, None)))  # 0 ms (whole-second times) as 1
    n = len(g)
    if n < 2 or g[0] == g[-1]:
        return None
    k = np.arange(1, n)  # k gaps below the split
    csum = np.cumsum(g)[:-1]
    mu0, mu1 = csum / k, (g.sum() - csum) / (n - k)
    between = (k / n) * (1 - k / n) * (mu0 - mu1) ** 2
    between[g[:-1] == g[1:]] = -1.0  # split only between distinct values
    cut = int(np.argmax(between)) + 1
    low, high = 10 ** np.median(g[:cut]), 10 ** np.median(g[cut:])
    slow = bool(low > MAX_ITERATION_GAP_MS)
    if cut * 3 < n or high < MIN_SEPARATION * low:
        return None
    if slow and not _far_apart(10 ** g[:cut], low, high):
        return None
    return float(high / 2), slow


def _far_apart(inside: np.ndarray, low: float, high: float) -> bool:
    """Whether gaps of rows printed slowly (`inside`, typical `low`) are told from the gaps
    between iterations (typical `high`) beyond doubt (adversarial review: an 8-GPU log with
    rows 60-120 ms apart was one GPU)."""
    return (
        low <= MAX_SLOW_ROW_GAP_MS
        and high >= WIDE_SEPARATION * low
        and float(np.quantile(inside, SLOW_ROW_QUANTILE)) < high / 2
    )


class Loop(NamedTuple):
    """A loop log's iterations: the GPUs each lists, and the gap (ms) above which the next one
    starts. A tuple, handed from one piece of a large file to the next (`Context.loop`)."""

    size: int
    split: float


def _merge_split_iterations(sizes: np.ndarray, size: int, fresh: np.ndarray) -> np.ndarray:
    """Iteration ids after joining neighbours cut apart by a slow row (two iterations shorter
    than `size` whose rows add up to it; not when the second starts below a header, `fresh`):
    old id -> new id."""
    new = np.empty(len(sizes), dtype=np.int64)
    j, i = 0, 0
    while i < len(sizes):
        new[i] = j
        if (
            sizes[i] < size
            and i + 1 < len(sizes)
            and sizes[i] + sizes[i + 1] == size
            and not fresh[i + 1]
        ):
            new[i + 1] = j
            i += 1
        j += 1
        i += 1
    return new


def _iterations(
    t: np.ndarray, split: float, fresh: np.ndarray, size: int | None = None
) -> tuple[np.ndarray, int]:
    """Each row's iteration (a gap over `split`, or a header written again above the row,
    starts one; neighbours cut apart by a slow row joined), and the iterations' size: `size`,
    else the size most rows are in."""
    starts = np.concatenate([[True], (np.abs(np.diff(t)) > split) | fresh[1:]])
    it = np.cumsum(starts) - 1
    sizes = np.bincount(it)
    if size is None:
        values, counts = np.unique(sizes, return_counts=True)
        size = int(values[np.argmax(counts * values)])
    first_row = np.searchsorted(it, np.arange(len(sizes)))
    return _merge_split_iterations(sizes, size, fresh[first_row])[it], size


def loop_structure(t: np.ndarray, fresh: np.ndarray) -> Loop | None:
    """The iterations the times `t` (file order, all known) show, or None: too few rows, no
    class of millisecond gaps, or no regular iterations of more than one row (one GPU). A
    header written above every iteration (`_header_iterations`) tells them first."""
    if len(t) < 3:
        return None
    if (by_header := _header_iterations(t, fresh)) is not None:
        return by_header
    found = _iteration_split(np.diff(t))
    if found is None:
        return None
    split, slow = found
    it, size = _iterations(t, split, fresh)
    sizes = np.bincount(it)
    if size <= 1 or size > MAX_GPUS_PER_LOG or (sizes == size).sum() * size * 2 < len(t):
        return None
    if slow and not _regular(sizes, size, len(t)):
        return None  # rows printed slowly: told from a one-GPU log's stalls only when regular
    return Loop(size, split)


# rows printed slowly (`_far_apart`) make iterations only when at least this many iterations of
# one size hold at least REGULAR_SHARE of the rows: a one-GPU log at `-lms 100` whose logger
# stalls now and then has gaps in the same two classes, but runs of any length between stalls
MIN_REGULAR_ITERATIONS = 5
REGULAR_SHARE = 0.9


def _regular(sizes: np.ndarray, size: int, rows: int) -> bool:
    full = int((sizes == size).sum())
    return full >= MIN_REGULAR_ITERATIONS and full * size >= REGULAR_SHARE * rows


# a header above every iteration: at least this share of the rows under headers of one size
HEADER_PART_SHARE = 0.8


def _header_iterations(t: np.ndarray, fresh: np.ndarray) -> Loop | None:
    """The loop of a log whose header is written above every iteration (`while true; do
    nvidia-smi --query-gpu=... --format=csv; sleep 5; done`): the rows under one header are
    one iteration, however slowly they were printed (adversarial review: 8 GPUs 60-120 ms
    apart were one GPU). Told when at least HEADER_PART_SHARE of the rows are in parts of one
    size (over one, three parts at least), printed together (a typical gap inside at most
    MAX_SLOW_ROW_GAP_MS, below the typical gap between parts); the split is above every gap
    inside those parts. None otherwise (a restarted logger, a one-GPU loop)."""
    part = np.cumsum(fresh) - (1 if fresh[0] else 0)
    if part[-1] < 2:
        return None
    sizes = np.bincount(part)
    values, counts = np.unique(sizes, return_counts=True)
    size = int(values[np.argmax(counts * values)])
    regular = sizes[part] == size
    if (
        size <= 1
        or size > MAX_GPUS_PER_LOG
        or (sizes == size).sum() < 3
        or regular.sum() < HEADER_PART_SHARE * len(t)
    ):
        return None
    gaps = np.abs(np.diff(t))
    same = part[1:] == part[:-1]
    inside, between = gaps[same & regular[1:]], gaps[~same]
    if np.median(inside) > MAX_SLOW_ROW_GAP_MS or np.median(inside) >= np.median(between):
        return None
    return Loop(size, float(max(2 * inside.max(), MAX_ITERATION_GAP_MS)))


def _place(t: np.ndarray, loop: Loop, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's position in its iteration, rows whose GPU cannot be told) under `loop`."""
    it, size = _iterations(t, loop.split, fresh, loop.size)
    sizes = np.bincount(it)
    first_row = np.searchsorted(it, np.arange(len(sizes)))
    within = np.arange(len(t)) - first_row[it]
    row_size = sizes[it]
    short = row_size < size
    # rows before the first header written again may start inside an iteration: its end
    within = np.where((it == 0) & short & ~fresh[0], within + size - row_size, within)
    # a first or last iteration cut short by the file's (a piece's) start or end, not one of a
    # run of short ones (a GPU that dropped out: adversarial review)
    edge = np.zeros(len(sizes), dtype=bool)
    edge[0] = len(sizes) == 1 or sizes[1] == size
    edge[-1] |= len(sizes) == 1 or sizes[-2] == size
    bad = (row_size != size) & ~(edge[it] & short)
    return within, bad


def loop_positions(
    ts_ms: np.ndarray, fresh: np.ndarray | None = None, seen: Loop | None = None
) -> tuple[np.ndarray, np.ndarray, Loop | None]:
    """For a loop log without identity columns (nvidia-smi lists the GPUs in index order each
    iteration): (each row's position in its iteration, rows whose GPU cannot be told, the
    loop's structure or None for one GPU). `ts_ms`: the rows' times in file order (NaN:
    unreadable, those rows are left out); `fresh`: the rows right below a header written again
    (a new nvidia-smi call: a new iteration, starting at the first GPU). A middle iteration
    with another number of rows than the log's usual one is not guessed at: its rows are
    returned as unknown; a first or last iteration cut short by the file's start or end takes
    the positions of the iteration's end or start. Rows too few to show a structure of their
    own, one iteration under the structure `seen` elsewhere in the file, take that one."""
    n = len(ts_ms)
    pos = np.zeros(n, dtype=np.int64)
    unknown = np.zeros(n, dtype=bool)
    ok = ~np.isnan(ts_ms)
    t = ts_ms[ok]
    if not len(t):
        return pos, unknown, None
    part = np.cumsum(np.zeros(n, dtype=bool) if fresh is None else fresh)[ok]
    fr = np.concatenate([[part[0] > 0], part[1:] != part[:-1]])  # a header above, NaNs skipped
    loop = loop_structure(t, fr)
    # one iteration (no gap over the split, no header between): too short to show its own
    one = seen is not None and not fr[1:].any() and (np.abs(np.diff(t)) <= seen.split).all()
    if loop is None and one:
        loop = seen
    if loop is None:
        return pos, unknown, None
    pos[ok], unknown[ok] = _place(t, loop, fr)
    return pos, unknown, loop


PER_PROCESS = (
    "a per-process listing (nvidia-smi --query-compute-apps: pid, process_name, used_memory): "
    "its memory is a process's, not the GPU's, and it has no utilization or power. Log the GPUs "
    "with --query-gpu. File quarantined whole"
)


def parse(text: str, ctx: Context) -> ParsedLines:
    """The log's rows, read with the header above them: a header written again further down (a
    logger restarted, perhaps with other fields in another order) starts a part of its own,
    its line counted as skipped. Before, the rows below a second header were read with the
    first one's columns: a 60 W power read as 60 % utilization (adversarial review)."""
    header, body, total, skipped = _header_and_rows(text, ctx)
    if {"pid", "process_name"} & {header_key(h)[0] for h in header}:
        raise ValueError(PER_PROCESS)  # its used_memory was taken for the GPU's memory used
    if not text.endswith("\n"):
        body = _cut_last_row(header, body)
    return _in_streams(header, body, total, skipped, ctx, _later_headers(body))


CUT_UUID = (
    "the file's last line has no line end and its uuid '{}' is the start of another GPU's: "
    "cut short while the log was being written (the next run reads the file again)"
)


def _cut_last_row(header: list[str], body: pl.DataFrame) -> pl.DataFrame:
    """The rows, the last one marked `_cut` when the text ends inside it (no line end) with its
    uuid the start of another row's: a log read while being written, cut in its uuid, made a
    GPU of one sample (adversarial review)."""
    at = _id_columns(header)[2].get("gpu_uuid")
    if at is None or body.height < 2:
        return body
    uuids = body.select(cell(at)).to_series()
    last = uuids[-1]
    others = uuids.head(-1)
    cut = bool(last) and not bool((others == last).any())
    cut = cut and bool(others.str.starts_with(last).any())
    return body.with_columns(pl.int_range(pl.len()).eq(body.height - 1).and_(cut).alias("_cut"))


def _later_headers(body: pl.DataFrame) -> list[int]:
    """The file lines (1-based) of the body that are header lines: a line with a comma and no
    digit (rows carry a time or a number), then told by `_is_header`."""
    raw = pl.col("raw")
    maybe = body.filter(raw.str.contains(",", literal=True) & ~raw.str.contains(r"\d"))
    is_header = {ln: _is_header(ln) for ln in maybe["raw"].unique()}  # one a distinct line
    return [n for n, ln in zip(maybe["line"], maybe["raw"], strict=True) if is_header[ln]]


# a stream: the header of some of a file's parts, their rows (file order), and which of the rows
# are the first below a header written again (a new nvidia-smi call)
Stream = tuple[list[str], pl.DataFrame, np.ndarray]


def _streams(header: list[str], body: pl.DataFrame, later: list[int]) -> tuple[list[Stream], int]:
    """The body's rows (the header lines `later` left out) in streams: the parts (from a header
    line to the next) under the same header, names and units, are one; and the stream of the
    last part. A shell loop calling nvidia-smi prints its header before every iteration: a
    day's log is tens of thousands of parts, few streams."""
    part = np.searchsorted(np.asarray(later, dtype=np.int64), body["line"].to_numpy(), "right")
    heads = body.filter(pl.col("line").is_in(later))["raw"].to_list()
    keys: dict[tuple, int] = {tuple(header_key(c) for c in header): 0}
    first: list[list[str]] = [header]  # each stream's header, as first written
    stream_of: dict[str, int] = {}  # a header line -> its stream
    of_part = [0]
    for raw in heads:
        if raw not in stream_of:
            cells = split_rows(raw, 0)[0]
            key = tuple(header_key(c) for c in cells)
            if key not in keys:
                keys[key] = len(first)
                first.append(cells)
            stream_of[raw] = keys[key]
        of_part.append(stream_of[raw])
    rows = body.with_columns(
        pl.Series("_part", part), pl.Series("_stream", np.asarray(of_part)[part])
    ).filter(~pl.col("line").is_in(later))
    streams = []
    for i, cols in enumerate(first):
        sb = rows.filter(pl.col("_stream") == i) if len(first) > 1 else rows
        p = sb["_part"].to_numpy()
        fresh = (p > 0) & np.concatenate([[True], p[1:] != p[:-1]])
        streams.append((cols, sb.drop("_part", "_stream"), fresh))
    return streams, of_part[-1]


def _in_streams(
    header: list[str],
    body: pl.DataFrame,
    total: int,
    skipped: int,
    ctx: Context,
    later: list[int],
) -> ParsedLines:
    """Each stream (`_streams`) read by its header, as one file's lines; the GPUs of streams
    without identity columns told by their loops (`_placements`)."""
    streams, last = _streams(header, body, later)
    placements, loop = _placements(streams, last, ctx)
    outs = [
        _parse_part(cols, sb, 0, 0, ctx, placed)
        for (cols, sb, _), placed in zip(streams, placements, strict=True)
    ]
    records: dict = {}
    for out in outs:
        for d, n in out.records_by_day.items():
            records[d] = records.get(d, 0) + n
    one = outs[0]
    return replace(
        one,
        samples=pl.concat([o.samples for o in outs]) if len(outs) > 1 else one.samples,
        quarantine=pl.concat([o.quarantine for o in outs]) if len(outs) > 1 else one.quarantine,
        lines_total=total,
        lines_skipped=skipped + len(later),
        records_by_day=records,
        columns_ignored=sorted({c for o in outs for c in o.columns_ignored})
        if later
        else one.columns_ignored,
        fields=sorted({f for o in outs for f in o.fields}) if later else one.fields,
        mig_gpus=sorted({u for o in outs for u in o.mig_gpus}) if later else one.mig_gpus,
        last_header=body.filter(pl.col("line") == later[-1])["raw"][0] if later else None,
        loop=loop,
    )


# rows' positions in their loop iterations, rows whose GPU cannot be told, the loop (None: one GPU)
Placed = tuple[np.ndarray, np.ndarray, Loop | None]


def _placements(
    streams: list[Stream], last: int, ctx: Context
) -> tuple[list[Placed | None], Loop | None]:
    """The loop positions of the rows of each stream without identity columns but with times
    (None for the others), and the loop the file's next piece continues (the last part's
    stream's). A stream's loop is decided over all its rows, a header printed before every
    iteration (`nvidia-smi --query-gpu` called in a shell loop) starting one. A stream too
    short to show a loop of its own (one iteration: a logger restarted with another field
    order and stopped, a large file's piece that holds the end of an iteration) takes the one
    seen: the previous piece's (`ctx.loop`), else the one most rows of this text show. Each
    part read on its own, a part of one iteration was one GPU (adversarial review)."""
    times = [_loop_times(cols, sb, ctx) for cols, sb, _ in streams]
    placed: list[Placed | None] = [
        None if t is None else loop_positions(t, fresh)
        for t, (_, _, fresh) in zip(times, streams, strict=True)
    ]
    shown = [(len(t), p[2]) for t, p in zip(times, placed, strict=True) if p and p[2]]
    seen = Loop(*ctx.loop) if ctx.loop else max(shown)[1] if shown else None
    for i, (t, (_, _, fresh)) in enumerate(zip(times, streams, strict=True)):
        if t is not None and placed[i][2] is None and seen is not None:
            placed[i] = loop_positions(t, fresh, seen)
    end = placed[last]  # a stream with rows hands its loop on (None: one GPU); else the one seen
    return placed, end[2] if end is not None and len(end[0]) else seen


def _loop_times(header: list[str], body: pl.DataFrame, ctx: Context) -> np.ndarray | None:
    """The times (epoch ms, NaN where unreadable) of a part's rows that only their loop
    positions tell apart: None for a part with an identity column, or without times."""
    _, _, ids = _id_columns(header)
    if "timestamp" not in ids or IDENTITY & _valued(ids, body).keys():
        return None
    ts_ms, _ = _part_times(ids, body, ctx)
    return body.select(ts_ms.cast(pl.Float64)).to_series().fill_null(float("nan")).to_numpy()


def _id_columns(header: list[str]) -> tuple[list[tuple[str, str]], dict[str, int], dict[str, int]]:
    """The header's (name, unit) keys, each name's first column, and the identity columns."""
    keys = [header_key(h) for h in header]
    idx: dict[str, int] = {}
    for i, (k, _) in reversed(list(enumerate(keys))):
        idx[k] = i
    ids = {a: _columns_named(idx, names) for a, names in ID_ALIASES.items()}
    return keys, idx, {a: i[0] for a, i in ids.items() if i}


IDENTITY = {"gpu_uuid", "pci_bus_id", "gpu_index"}


def _valued(ids: dict[str, int], body: pl.DataFrame) -> dict[str, int]:
    """The identity columns `ids` without those that hold no value in any of the `body`'s rows
    (a uuid column that reads `[N/A]` throughout: WSL, passthrough): such a column is absent,
    the GPUs told as without it (adversarial review: every row was quarantined)."""
    empty = [a for a in IDENTITY & ids.keys() if not _has_value(body, ids[a])]
    return {a: i for a, i in ids.items() if a not in empty}


def _has_value(body: pl.DataFrame, i: int) -> bool:
    v = cell(i)
    return bool(body.select((v.is_not_null() & ~v.is_in(list(NA_VALUES))).any()).item())


def _part_times(
    ids: dict[str, int], body: pl.DataFrame, ctx: Context
) -> tuple[pl.Expr, pl.Expr | None]:
    """The rows' times (epoch ms; the file's time without a time column) and the reason a row
    whose time is not understood is rejected."""
    if "timestamp" not in ids:
        ms = None if ctx.file_time is None else int(ctx.file_time.timestamp() * 1000)
        return pl.lit(ms, pl.Int64), None
    t = ids["timestamp"]
    ts_ms = parse_local_time(cell(t), TIME_FORMATS, ctx.csv_timezone, names_zone(body, cell(t)))
    return ts_ms, pl.when(ts_ms.is_null()).then(
        pl.format("timestamp not understood: '{}'", cell(t))
    )


def _parse_part(
    header: list[str],
    body: pl.DataFrame,
    total: int,
    skipped: int,
    ctx: Context,
    placed: Placed | None = None,
) -> ParsedLines:
    """A part's rows read by its header; without identity columns the GPUs are the rows'
    positions in their loop iterations, `placed` (`_placements`; None: one GPU)."""
    keys, idx, ids = _id_columns(header)
    used: set[int] = set(ids.values())
    ts_ms, row_reason = _part_times(ids, body, ctx)
    if "_cut" in body.columns:
        cut = pl.when(pl.col("_cut")).then(pl.format(CUT_UUID, cell(ids["gpu_uuid"])))
        row_reason = cut if row_reason is None else pl.coalesce(row_reason, cut)
    attrs = {a: cell(i) for a, i in _valued(ids, body).items() if a != "timestamp"}
    if not IDENTITY & attrs.keys():
        body, row_reason = _gpus_by_loop_position(body, placed, row_reason)
        attrs["gpu_index"] = pl.col("_pos").cast(pl.String)
    fields, metric_names = _field_columns(header, keys, idx)
    for present, _ in fields.values():
        used.update(present)
    g = to_long(body, len(header), fields, ts_ms, attrs, row_reason, metric_names)
    g = g.drop([c for c in ("_pos", "_unknown", "_cut") if c in g.columns])
    basis = "sample" if "timestamp" in ids else ctx.file_time_basis
    out = parsed(
        g,
        lines_total=total,
        lines_skipped=skipped,
        time_basis=basis,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    out.columns_ignored = [h.strip() for i, h in enumerate(header) if i not in used and h.strip()]
    out.fields = list(fields)
    return out


def _header_and_rows(text: str, ctx: Context) -> tuple[list[str], pl.DataFrame, int, int]:
    """`split_rows` at the file's header line, the first that is not blank; a file without one
    takes the sidecar's (`ctx.csv_header`), whose line is not counted (ValueError without it)."""
    header_at = next(i for i, ln in enumerate(text.split("\n")) if ln.strip())
    first = text.split("\n", header_at + 1)[header_at]
    # the sidecar's header for rows without one: rows that start with a time, or any rows when
    # there is a sidecar (`index, uuid, timestamp, …` does not start with a time: adversarial
    # review)
    if not _is_header(first) and (_is_headerless(text) or ctx.csv_header):
        if not ctx.csv_header:
            raise ValueError(NO_HEADER)
        text = ctx.csv_header.strip("\r\n") + "\n" + text
        header_at = 0
    header, body, total, skipped = split_rows(text, header_at)
    if header_at == 0 and ctx.csv_header and not _is_header(first):
        total, skipped = total - 1, skipped - 1  # the header line is the sidecar's
        body = body.with_columns(pl.col("line") - 1)
    return header, body, total, skipped


def _columns_named(idx: dict[str, int], aliases: list[str]) -> list[int]:
    """The columns (first of each header name, in `idx`) that carry one of `aliases`."""
    return [idx[a] for a in aliases if a in idx]


def _gpus_by_loop_position(
    body: pl.DataFrame, placed: Placed | None, row_reason: pl.Expr | None
) -> tuple[pl.DataFrame, pl.Expr]:
    """A log without identity columns: each row's position in its loop iteration (`_pos`, the
    GPU's index) as `_placements` found it (None: every row GPU 0); rows whose GPU cannot be
    told are `_unknown`, with a reason added to `row_reason`."""
    n = body.height
    pos, unknown, loop = placed or (np.zeros(n, np.int64), np.zeros(n, bool), None)
    size = loop.size if loop else 1
    body = body.with_columns(pl.Series("_pos", pos, dtype=pl.Int32), pl.Series("_unknown", unknown))
    lost = pl.when(pl.col("_unknown")).then(
        pl.format(
            "loop iteration with another number of rows than the log's {} GPUs: which GPU "
            "each of its rows is cannot be told (the log has no uuid, pci.bus_id or index "
            "column)",
            pl.lit(size),
        )
    )
    # the reason given first stands (a chain of `when`s or, with a cut last line, a coalesce:
    # `.when` on that failed, found by the suite's Hypothesis test)
    row_reason = lost if row_reason is None else pl.coalesce(row_reason, lost.otherwise(None))
    return body, row_reason


def _field_columns(
    header: list[str], keys: list[tuple[str, str]], idx: dict[str, int]
) -> tuple[dict[str, tuple[list[int], float]], dict[str, str]]:
    """Each field the header carries: its columns and the scale of the header's unit to the
    field's; and the metric name it is written under (the first column's header)."""
    fields: dict[str, tuple[list[int], float]] = {}
    metric_names: dict[str, str] = {}
    for column, aliases in HEADER_ALIASES.items():
        present = _columns_named(idx, aliases)
        if not present:
            continue
        unit = keys[present[0]][1].replace("°", "").strip()
        scale = 1.0
        if column in UNIT_FIELDS and unit and unit != UNIT_FIELDS[column]:
            scale = UNIT_FACTORS.get(unit, 1.0)
        fields[column] = (present, scale)
        metric_names[column] = header[present[0]].strip()
    return fields, metric_names
