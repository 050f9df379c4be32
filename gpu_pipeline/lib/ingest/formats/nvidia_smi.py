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
them the rows one loop iteration printed together (`loop_positions`).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import polars as pl

from gpu_pipeline.lib.ingest.formats.common import Context, parsed
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
MAX_GPUS_PER_LOG = 256


def _iteration_split(gaps: np.ndarray) -> float | None:
    """The gap above which a new loop iteration starts, or None when every row is its own
    iteration (one GPU). Judged from the typical gaps, not the longest: the gaps are split in
    two classes (Otsu's method on their logarithms); the lower class must be milliseconds
    (median at most MAX_ITERATION_GAP_MS), at least a third of all gaps (N-1 of N rows of an
    N-GPU loop) and its median MIN_SEPARATION times below the upper class's. Stalls only
    lengthen gaps of the upper class; the split is half its median."""
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
    if cut * 3 < n or low > MAX_ITERATION_GAP_MS or high < MIN_SEPARATION * low:
        return None
    return float(high / 2)


def _merge_split_iterations(sizes: np.ndarray, size: int) -> np.ndarray:
    """Iteration ids after joining neighbours cut apart by a slow row (two iterations shorter
    than `size` whose rows add up to it): old id -> new id."""
    new = np.empty(len(sizes), dtype=np.int64)
    j, i = 0, 0
    while i < len(sizes):
        new[i] = j
        if sizes[i] < size and i + 1 < len(sizes) and sizes[i] + sizes[i + 1] == size:
            new[i + 1] = j
            i += 1
        j += 1
        i += 1
    return new


def loop_positions(ts_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """For a loop log without identity columns (nvidia-smi lists the GPUs in index order each
    iteration): (each row's position in its iteration, rows whose GPU cannot be told, GPUs per
    iteration). `ts_ms`: the rows' times in file order (NaN: unreadable, those rows are left
    out). A middle iteration with another number of rows than the log's usual one is not
    guessed at: its rows are returned as unknown; a first or last iteration cut short by the
    file's start or end takes the positions of the iteration's end or start."""
    n = len(ts_ms)
    pos = np.zeros(n, dtype=np.int64)
    unknown = np.zeros(n, dtype=bool)
    ok = ~np.isnan(ts_ms)
    t = ts_ms[ok]
    if len(t) < 3:
        return pos, unknown, 1
    gaps = np.diff(t)
    split = _iteration_split(gaps)
    if split is None:
        return pos, unknown, 1
    it = np.cumsum(np.concatenate([[True], np.abs(gaps) > split])) - 1
    sizes = np.bincount(it)
    values, counts = np.unique(sizes, return_counts=True)
    size = int(values[np.argmax(counts * values)])  # the size most rows are in
    it = _merge_split_iterations(sizes, size)[it]
    sizes = np.bincount(it)
    if size <= 1 or size > MAX_GPUS_PER_LOG or (sizes == size).sum() * size * 2 < len(t):
        return pos, unknown, 1  # no regular iterations: one GPU
    first_row = np.searchsorted(it, np.arange(len(sizes)))
    within = np.arange(len(t)) - first_row[it]
    row_size = sizes[it]
    last = it.max()
    within = np.where((it == 0) & (row_size < size), within + size - row_size, within)
    bad = (row_size != size) & ~(((it == 0) | (it == last)) & (row_size < size))
    pos[ok] = within
    unknown[ok] = bad
    return pos, unknown, size


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
    later = _later_headers(body)
    if later:
        return _in_parts(text, ctx, later)
    return _parse_part(header, body, total, skipped, ctx)


def _later_headers(body: pl.DataFrame) -> list[int]:
    """The file lines (1-based) of the body that are header lines: a line with a comma and no
    digit (rows carry a time or a number), then told by `_is_header`."""
    raw = pl.col("raw")
    maybe = body.filter(raw.str.contains(",", literal=True) & ~raw.str.contains(r"\d"))
    return [n for n, ln in zip(maybe["line"], maybe["raw"], strict=True) if _is_header(ln)]


def _in_parts(text: str, ctx: Context, later: list[int]) -> ParsedLines:
    """Each part from a header line to the next read on its own, as one file's lines."""
    lines = text.split("\n")
    starts = [0, *(n - 1 for n in later)]
    ends = [*starts[1:], len(lines)]
    outs = []
    for a, b in zip(starts, ends, strict=True):
        part = "\n".join(lines[a:b]) + ("\n" if b < len(lines) else "")
        out = _parse_part(*_header_and_rows(part, ctx), ctx)
        shift = pl.col("line") + a
        outs.append((out, out.samples.with_columns(shift), out.quarantine.with_columns(shift)))
    records: dict = {}
    for out, _, _ in outs:
        for d, n in out.records_by_day.items():
            records[d] = records.get(d, 0) + n
    first = outs[0][0]
    return replace(
        first,
        samples=pl.concat([s for _, s, _ in outs]),
        quarantine=pl.concat([q for _, _, q in outs]),
        lines_total=sum(o.lines_total for o, _, _ in outs),
        lines_skipped=sum(o.lines_skipped for o, _, _ in outs),
        records_by_day=records,
        columns_ignored=sorted({c for o, _, _ in outs for c in o.columns_ignored}),
        fields=sorted({f for o, _, _ in outs for f in o.fields}),
        last_header=lines[starts[-1]].strip("\r"),
    )


def _parse_part(
    header: list[str], body: pl.DataFrame, total: int, skipped: int, ctx: Context
) -> ParsedLines:
    keys = [header_key(h) for h in header]
    idx: dict[str, int] = {}
    for i, (k, _) in reversed(list(enumerate(keys))):
        idx[k] = i
    used: set[int] = set()
    ids = {a: _columns_named(idx, names) for a, names in ID_ALIASES.items()}
    ids = {a: i[0] for a, i in ids.items() if i}
    used.update(ids.values())
    if "timestamp" in ids:
        t = ids["timestamp"]
        ts_ms = parse_local_time(cell(t), TIME_FORMATS, ctx.csv_timezone, names_zone(body, cell(t)))
        row_reason = pl.when(ts_ms.is_null()).then(
            pl.format("timestamp not understood: '{}'", cell(t))
        )
    else:
        ts_ms = pl.lit(
            None if ctx.file_time is None else int(ctx.file_time.timestamp() * 1000), pl.Int64
        )
        row_reason = None
    attrs = {a: cell(i) for a, i in ids.items() if a != "timestamp"}
    if not {"gpu_uuid", "pci_bus_id", "gpu_index"} & attrs.keys():
        body, row_reason = _gpus_by_loop_position(body, ts_ms, row_reason)
        attrs["gpu_index"] = pl.col("_pos").cast(pl.String)
    fields, metric_names = _field_columns(header, keys, idx)
    for present, _ in fields.values():
        used.update(present)
    g = to_long(body, len(header), fields, ts_ms, attrs, row_reason, metric_names)
    g = g.drop([c for c in ("_t", "_pos", "_unknown") if c in g.columns])
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
    body: pl.DataFrame, ts_ms: pl.Expr, row_reason: pl.Expr | None
) -> tuple[pl.DataFrame, pl.Expr]:
    """A log without identity columns: each row's position in its loop iteration (`_pos`, the
    GPU's index) from the rows' times (`loop_positions`); rows whose GPU cannot be told are
    `_unknown`, with a reason added to `row_reason`."""
    body = body.with_columns(ts_ms.alias("_t"))
    t = body.get_column("_t").cast(pl.Float64).fill_null(float("nan")).to_numpy()
    pos, unknown, size = loop_positions(t)
    body = body.with_columns(pl.Series("_pos", pos, dtype=pl.Int32), pl.Series("_unknown", unknown))
    lost = pl.when(pl.col("_unknown")).then(
        pl.format(
            "loop iteration with another number of rows than the log's {} GPUs: which GPU "
            "each of its rows is cannot be told (the log has no uuid, pci.bus_id or index "
            "column)",
            pl.lit(size),
        )
    )
    row_reason = (
        lost
        if row_reason is None
        else row_reason.when(pl.col("_unknown")).then(lost.otherwise(None))
    )
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
