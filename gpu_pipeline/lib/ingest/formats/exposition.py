"""dcgm-exporter / Prometheus text exposition (plain text, OpenMetrics timestamps too).

Fast path: one multi-threaded pass splits every line at its first `}` into the series
(`name{labels`) and the rest (` value [timestamp]`): the native tokenizer (`gpu_pipeline.native`,
C, built by `make install`) where it is built, else Polars' CSV reader, with the same result.
Series repeat on every scrape, so each distinct series is validated and its labels parsed once,
then joined back by a code; values and timestamps are numbers column-wise. No Python runs per
line.

Slow path: lines the fast path cannot vouch for (no labels, a `}` inside a label value, a value or
timestamp that is not a number, odd whitespace) are parsed one regex per line, so their
quarantine reasons are exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from gpu_pipeline import native
from gpu_pipeline.lib.ingest.formats.common import (
    Context,
    candidates,
    finalize,
    is_blank_sentinel,
    metric_column,
    metric_scale,
    mig_device_level,
    mig_gpus,
    normalize_series,
    out_of_range,
    records_by_day,
    resolve_aliases,
    value_bounds,
)
from gpu_pipeline.lib.samples import (
    KEYED_SCHEMA,
    LONG_SCHEMA,
    QUARANTINE_LINE_SCHEMA,
    SERIES_SCHEMA,
    ParsedLines,
    conform,
)

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABELS = r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}'
# name, optional {labels}, then the rest of the line (value and optional timestamp)
LINE_RX = rf"^({_NAME})[ \t]*({_LABELS})?[ \t]+(.*?)[ \t]*$"
VALUE_TS_RX = r"^(\S+)(?:[ \t]+(\S+))?$"
PAIR_RX = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"'
# a label block as the fast path splits it: `{labels` with the closing brace cut off
_LABELS_OPEN = r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*'
_HEAD = re.compile(r"^(# (HELP|TYPE) )?[a-zA-Z_:][a-zA-Z0-9_:]*(\{|\s)")


# a DCGM series at the start of a line, anywhere in the file (a /federate answer or a
# concatenation of exporters' dumps may carry hundreds of other series first)
_DCGM_SERIES = re.compile(rb"(?im)^[ \t]*dcgm_[a-z0-9_:]*[{ \t]")


def detect(data: bytes, name: str) -> bool:
    """Exposition lines (judged on the first 50), and a DCGM series somewhere in the file."""
    head = data[:65536].decode("utf-8", "ignore")
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()][:50]
    hits = sum(1 for ln in lines if _HEAD.match(ln))
    return bool(lines) and hits >= max(1, len(lines) // 2) and _DCGM_SERIES.search(data) is not None


def _gpu_metric(metric: pl.Expr) -> pl.Expr:
    """Series of GPU telemetry: DCGM's (dcgm_*, DCGM_FI_*); others (node_*, go_*) are skipped."""
    return metric.str.to_lowercase().str.starts_with("dcgm")


def _label_attrs(blocks: pl.Series) -> pl.DataFrame:
    """Distinct `{k="v",…}` blocks -> one row per block with the attribute columns."""
    pairs = (
        pl.DataFrame({"labels": blocks})
        .with_columns(pl.col("labels").str.extract_all(PAIR_RX).alias("pair"))
        .explode("pair")
    )
    v = pl.col("pair").str.extract(r'="(.*)"$', 1)
    if pairs.get_column("pair").str.contains("\\", literal=True).any():  # escapes: undo them
        v = (
            v.str.replace_all(r"\\\\", "\x00")
            .str.replace_all(r'\\"', '"')
            .str.replace_all(r"\\n", "\n")
            .str.replace_all("\x00", "\\", literal=True)
        )
    pairs = pairs.with_columns(
        pl.col("pair").str.extract(r"^([^=\s]+)", 1).alias("k"), v.alias("v")
    )
    # the exposition format forbids a label name twice in one series: such a line is not read
    twice = (
        pairs.filter(pl.col("k").is_not_null())
        .group_by("labels", "k")
        .len()
        .filter(pl.col("len") > 1)
        .group_by("labels")
        .agg(pl.col("k").sort().first())
        .select(
            "labels",
            pl.format("label '{}' appears twice in one series", "k").alias("_attr_reason"),
        )
    )
    attrs = resolve_aliases(pairs, "labels")
    if twice.height:
        return attrs.join(twice, on="labels", how="left")
    return attrs


@dataclass(frozen=True)
class TimeUnits:
    """How this file writes its timestamps, decided once for the whole file.

    Prometheus text writes integer milliseconds, OpenMetrics float seconds. A file whose integer
    timestamps are seconds-sized (median below 1e11) is read as seconds; one whose float
    timestamps are milliseconds-sized (median 1e11 or above) as milliseconds. A value in some
    other unit then lands far outside the plausible window and is quarantined with that reason.
    """

    int_factor: int = 1
    float_factor: float = 1000.0
    int_divisor: int = 1  # micro- or nanoseconds (Telegraf and friends write those)

    @staticmethod
    def timed(value_s: pl.Series, ts_s: pl.Series) -> bool:
        """Do the file's samples carry their own time? Yes when most lines with a numeric value
        have a numeric timestamp (a garbage value must not make a file look timed)."""
        numeric = value_s.cast(pl.Float64, strict=False).is_not_null()
        stamped = ts_s.cast(pl.Float64, strict=False).is_not_null()
        n = int(numeric.sum())
        return n > 0 and int((numeric & stamped).sum()) * 2 > n

    @classmethod
    def of(cls, ts_s: pl.Series) -> TimeUnits:
        as_int = ts_s.cast(pl.Int64, strict=False)
        as_float = ts_s.filter(as_int.is_null()).cast(pl.Float64, strict=False)
        return cls.from_medians(as_int.median(), as_float.median())

    @classmethod
    def from_medians(cls, int_median: float | None, float_median: float | None) -> TimeUnits:
        """Seconds-sized integers (median below 1e11) are seconds, microsecond- and
        nanosecond-sized ones (from 1e14, 1e17) micro- and nanoseconds; milliseconds-sized
        floats are milliseconds."""
        big = int_median is not None and int_median >= 1e14
        return cls(
            int_factor=1000 if int_median is not None and int_median < 1e11 else 1,
            float_factor=1.0 if float_median is not None and float_median >= 1e11 else 1000.0,
            int_divisor=(1_000_000 if int_median >= 1e17 else 1000) if big else 1,
        )

    @classmethod
    def of_scan(cls, d: pl.DataFrame, skip: pl.Expr) -> tuple[TimeUnits, bool, bool]:
        """`of` and `timed` over the fast path's lines (not `skip`), from the columns the scan
        already cast (`value`; `ts_ms`, the timestamp as an integer), in one query: the text is
        cast again only where the integer cast failed. Also: is any timestamp not an integer?"""
        line = ~skip
        ts_int = pl.col("ts_ms")
        odd = ts_int.is_null() & pl.col("_has_ts")  # a float, or not a number
        row = d.select(
            ts_int.filter(line).median().alias("int_median"),
            pl.col("value").filter(line).is_not_null().sum().alias("numeric"),
            (line & pl.col("value").is_not_null() & ts_int.is_not_null()).sum().alias("stamped"),
            (line & odd).any().alias("odd"),
        ).row(0, named=True)
        float_median, numeric, stamped = None, row["numeric"], row["stamped"]
        if row["odd"] and "ts_s" in d.columns:  # float seconds (or garbage): those rows' text
            other = d.filter(line & odd).select(
                pl.col("ts_s").cast(pl.Float64, strict=False).alias("f"), "value"
            )
            float_median = other.get_column("f").median()
            stamped += other.filter(
                pl.col("f").is_not_null() & pl.col("value").is_not_null()
            ).height
        units = cls.from_medians(row["int_median"], float_median)
        return units, numeric > 0 and stamped * 2 > numeric, bool(row["odd"])

    def int_ms(self, as_int: pl.Expr) -> pl.Expr:
        """An integer timestamp as written -> epoch ms."""
        if self.int_divisor != 1:
            return as_int // self.int_divisor
        if self.int_factor == 1:
            return as_int
        # no overflow: anything this large is implausible in any unit
        return pl.when(as_int.abs() < 10**15).then(as_int * self.int_factor).otherwise(as_int)

    def ms(self, ts_s: pl.Expr) -> pl.Expr:
        """Timestamp text -> epoch ms (null: not a number, or beyond int64 ms)."""
        as_int = ts_s.cast(pl.Int64, strict=False)
        as_float = ts_s.cast(pl.Float64, strict=False)
        return (
            pl.when(as_int.is_not_null())
            .then(self.int_ms(as_int))
            .otherwise((as_float * self.float_factor).round(0).cast(pl.Int64, strict=False))
        )


# the usual file's times: integer milliseconds on every sample (`_clean_tokens` reads only these)
_TIMED_MS = (TimeUnits(), True)


def _ts_ms(ts_s: pl.Expr, units: TimeUnits, file_ms: int | None, use_file: pl.Expr) -> pl.Expr:
    """The sample's own time; none: the file's (when `use_file`), else null."""
    return (
        pl.when(ts_s.is_null() & use_file).then(pl.lit(file_ms, pl.Int64)).otherwise(units.ms(ts_s))
    )


def _read_lines(data: bytes) -> pl.DataFrame:
    """(line, raw) for every line, as Python splits them (the slow, always-correct reader)."""
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    return (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("raw").str.strip_suffix("\r"))
    )


UNTIMED_IN_TIMED = (
    "no timestamp on this line while the file's other samples carry theirs: "
    "not filed on a guessed day"
)
REPEATED_UNTIMED = (
    "series written again in a file without sample timestamps (scrapes appended to one file?): "
    "its time is unknown; export with timestamps (dcgm-exporter text with per-sample times, or "
    "one scrape a file)"
)


def _reading_key(series_text: pl.Expr) -> pl.Expr:
    """What a reading filed at the file's time is a reading of: its GPU (UUID and MIG
    instance) and field, as the labels were normalized, whatever else its labels say (a pod
    that changed between two appended scrapes, labels in another order); its series text
    (`series_text`) where the GPU or the field is not known. Over the columns of a series
    table, or of candidates joined to one."""
    ident = pl.concat_str(
        [
            pl.col("gpu_uuid"),
            pl.col("gpu_instance_id").cast(pl.String).fill_null("-"),
            pl.col("column"),
        ],
        separator="\x00",
    )
    return pl.coalesce(ident, pl.lit("\x01") + series_text)


def _later_scrape(exact: np.ndarray, reading: np.ndarray) -> np.ndarray:
    """Per reading filed at the file's time (in line order; `exact`: the id of its series text,
    `reading`: of its GPU and field, `_reading_key`; a scrape's comment lines may be among them,
    each with a reading of its own): whether an earlier scrape of the file wrote that GPU's
    field. A scrape ends where a series text (or comment) comes again (the next one appended
    starts); within one scrape a GPU's field written under several label sets (pods
    sharing a GPU by time-slicing) is not written again: those stay duplicates of each other.
    A loop over the lines whose text came before only: none in a file of one scrape."""
    n = len(exact)
    if n < 2:
        return np.zeros(n, dtype=bool)
    order = np.argsort(exact, kind="stable")
    same = exact[order][1:] == exact[order][:-1]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    starts, start = np.zeros(n, dtype=np.int64), 0
    for i in np.flatnonzero(prev >= 0).tolist():
        if prev[i] >= start:  # its text came before in this scrape: the next scrape starts
            starts[i], start = 1, i
    scrape = np.cumsum(starts)
    first = pl.DataFrame({"r": reading, "s": scrape}).select(pl.col("s").min().over("r"))
    return scrape > first.to_series().to_numpy()


def _earlier(ctx: Context) -> frozenset[str]:
    """The readings (`_reading_key`) that the earlier pieces of a file without sample
    timestamps wrote: `ctx.times`' third item, when the first piece gave one."""
    times = ctx.times
    return times[2] if times is not None and len(times) > 2 else frozenset()


def _times_out(
    units: TimeUnits, timed: bool, ctx: Context, keys: Iterable[pl.Series | None]
) -> tuple:
    """The file's times as the parse hands them on (`ParsedLines.times`, `Context.times` of its
    later pieces): units and `timed`; in a file whose samples take the file's time, also the
    series written so far (`keys`: this piece's, with `_earlier`'s), so that a later piece
    quarantines their lines as written again (`REPEATED_UNTIMED`)."""
    if timed or ctx.file_time is None:
        return (units, timed)
    seen = set(_earlier(ctx))
    for k in keys:
        if k is not None:
            seen.update(k.drop_nulls().unique().to_list())
    return (units, False, frozenset(seen))


def _again_expr(checked: pl.Expr, key: pl.Expr, ctx: Context, again: pl.Series | None) -> pl.Expr:
    """The lines among `checked` (no time of their own, filed at the file's time) whose reading
    (`key`, `_reading_key`) an earlier scrape of the piece (`_later`, `_later_scrape`) or an
    earlier piece wrote, or that the caller found so (`again`: line numbers)."""
    out = pl.col("_later")
    if earlier := _earlier(ctx):
        out = out | key.is_in(list(earlier))
    if again is not None and again.len():
        out = out | pl.col("line").is_in(again.implode())
    return checked & out


def _with_later(g: pl.DataFrame, checked: pl.Expr, text: pl.Expr, key: pl.Expr) -> pl.DataFrame:
    """`g` with `_later`: `_later_scrape` of its `checked` lines (series `text`, reading `key`)."""
    ids = g.select(
        checked.fill_null(False).alias("c"),
        text.rank("dense").fill_null(0).cast(pl.Int64).alias("t"),
        key.rank("dense").fill_null(0).cast(pl.Int64).alias("k"),
    )
    on = ids.get_column("c").to_numpy()
    later = np.zeros(g.height, dtype=bool)
    idx = np.flatnonzero(on)
    later[idx] = _later_scrape(
        ids.get_column("t").to_numpy()[idx], ids.get_column("k").to_numpy()[idx]
    )
    return g.with_columns(pl.Series("_later", later))


def _regex_candidates(
    lines: pl.DataFrame,
    ctx: Context,
    units: TimeUnits | None = None,
    timed: bool | None = None,
    again: pl.Series | None = None,
) -> tuple[pl.DataFrame, int, tuple[TimeUnits, bool]]:
    """The slow path: one regex per line (for the lines the fast path could not vouch for);
    also the number of lines of other series than GPU telemetry (skipped, not candidates), and
    the `units`/`timed` used.

    `units`/`timed`: the file's timestamp units and whether its samples carry their own time
    (decided on the whole file by the caller; found here when the whole file goes this way).
    In a file whose samples take the file's time, a series written again is quarantined
    (`REPEATED_UNTIMED`; `again`: lines the caller found so); `_key` is the series of each
    line filed at the file's time (`_times_out`)."""
    g = lines.with_columns(pl.col("raw").str.extract_groups(LINE_RX).alias("g")).unnest("g")
    g = g.rename({"1": "metric", "2": "labels", "3": "rest"})
    vt = pl.col("rest").str.extract_groups(VALUE_TS_RX)
    g = g.with_columns(vt.struct.field("1").alias("value_s"), vt.struct.field("2").alias("ts_s"))
    # a line that is not a sample at all takes no time from the file: it is accounted on the home day
    malformed = pl.col("metric").is_null() | (
        pl.col("value_s").is_null() & pl.col("labels").is_null()
    )
    # a sample of another series than GPU telemetry: skipped, not a candidate
    other = ~malformed & ~_gpu_metric(pl.col("metric"))
    n_other = int(g.select(other.sum()).item())
    if n_other:
        g = g.filter(~other)
    if units is None or timed is None:
        ok = g.filter(~g.select(malformed).to_series())
        units = TimeUnits.of(ok.get_column("ts_s"))
        timed = TimeUnits.timed(ok.get_column("value_s"), ok.get_column("ts_s"))
    file_ms = None if ctx.file_time is None else int(ctx.file_time.timestamp() * 1000)
    # a reading filed at the file's time (scrapes appended to one file write its series again)
    numeric = pl.col("value_s").cast(pl.Float64, strict=False).is_not_null()
    checked = ~malformed & pl.col("labels").is_not_null() & numeric & pl.col("ts_s").is_null()
    checked = checked & pl.lit(not timed and file_ms is not None)
    g = g.with_columns(
        pl.col("value_s").cast(pl.Float64, strict=False).alias("value"),
        metric_column(pl.col("metric")).alias("column"),
        metric_scale(pl.col("metric")).alias("scale"),
        _ts_ms(pl.col("ts_s"), units, file_ms, ~malformed & pl.lit(not timed)).alias("ts_ms"),
    )
    attrs = normalize_series(
        _label_attrs(g.get_column("labels").drop_nulls().unique()), ctx.source_file
    )
    # in line order: the first reading of each GPU and field is the one kept
    g = g.join(attrs, on="labels", how="left", maintain_order="left")
    text = pl.col("metric") + pl.col("labels").str.strip_suffix("}")
    key = _reading_key(text)
    g = _with_later(g, checked, text, key).with_columns(
        pl.when(checked).then(key).alias("_key"),
        _again_expr(checked, key, ctx, again).alias("_again"),
    )
    g = g.with_columns(
        pl.when(malformed)
        .then(pl.lit("malformed exposition line: expected `name{labels} value [timestamp]`"))
        .when(pl.col("value_s").is_null())
        .then(pl.format("value is not a number: '{}'", pl.col("rest").str.slice(0, 80)))
        .when(pl.col("ts_s").is_not_null() & pl.col("ts_ms").is_null())
        .then(pl.format("timestamp is not a number: '{}'", pl.col("ts_s").str.slice(0, 40)))
        .when(pl.col("ts_s").is_null() & pl.lit(timed))
        .then(pl.lit(UNTIMED_IN_TIMED))
        .when(pl.col("_again"))
        .then(pl.lit(REPEATED_UNTIMED))
        .alias("pre_reason")
    )
    return candidates(g), n_other, (units, timed)


# more values or timestamps than this (plus a tenth of the lines) that the native tokenizer
# leaves to Polars: the file is read with Polars' CSV reader instead
_ODD_TOKENS = 1000


def _cast_tokens(data: np.ndarray, at: np.ndarray, dtype, out: np.ndarray, flags, flag: int):
    """Cast the tokens (line, offset, length) of `data` (ASCII, checked by the scan) with
    Polars into `out` at their lines, and set `flag` where the cast gives a number."""
    if not len(at):
        return
    text = pl.Series([data[o : o + n].tobytes().decode() for _, o, n in at.tolist()])
    cast = text.cast(dtype, strict=False)
    out[at[:, 0]] = cast.fill_null(0).to_numpy()
    flags[at[:, 0]] |= np.where(cast.is_not_null().to_numpy(), flag, 0).astype(np.uint8)


def _native_tokens(source: bytes | Path) -> tuple[native.ExpositionScan, pl.Series] | None:
    """The native tokenizer's arrays of `source` (`gpu_pipeline.native`), the numbers written
    otherwise cast by Polars into them, and the distinct series in code order; None when the
    tokenizer is not built or left too much to Polars (the caller reads the file with Polars'
    CSV reader).

    The tokenizer parses the plain numbers itself, exactly as Polars' casts do; a value or
    timestamp written otherwise (`1e400`, a signed NaN, 19 digits) is cast here by Polars."""
    if not native.available():
        return None
    if isinstance(source, Path):
        size = source.stat().st_size
        data = np.memmap(source, np.uint8, mode="r") if size else np.empty(0, np.uint8)
    else:
        data = np.frombuffer(source, np.uint8)
    threads = min(pl.thread_pool_size(), 8) if data.size >= 2**20 else 1
    scan = native.scan_exposition(data, threads)
    if scan is None or len(scan.odd_values) + len(scan.odd_ts) > _ODD_TOKENS + len(scan.code) // 10:
        return None
    # the numbers written otherwise are cast by Polars, as the CSV pass casts every one
    _cast_tokens(data, scan.odd_values, pl.Float64, scan.value, scan.flags, native.VALUE)
    _cast_tokens(data, scan.odd_ts, pl.Int64, scan.ts, scan.flags, native.TS)
    del data  # a memory map is closed with its last reference
    import pyarrow as pa

    strings = pa.LargeStringArray.from_buffers(
        len(scan.series_offsets) - 1,
        pa.py_buffer(scan.series_offsets),
        pa.py_buffer(scan.series_bytes),
    )
    return scan, pl.Series("s", strings, dtype=pl.String)


def _token_frame(
    scan: native.ExpositionScan, distinct: pl.Series
) -> tuple[pl.DataFrame, pl.Series]:
    """The native tokens as `_scan`'s frame (and the distinct series)."""
    f = pl.col("_f")
    d = pl.DataFrame({"_f": scan.flags, "_c": scan.code, "_v": scan.value, "_t": scan.ts}).select(
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("line"),
        ((f & native.NO_SERIES) != 0).alias("_no_series"),
        ((f & native.LEAD) != 0).alias("_lead"),
        ((f & native.HAS_TS) != 0).alias("_has_ts"),
        pl.when((f & native.VALUE) != 0).then(pl.col("_v")).alias("value"),
        pl.when((f & native.TS) != 0).then(pl.col("_t")).alias("ts_ms"),
        pl.when(pl.col("_c") != native.NO_CODE).then(pl.col("_c")).alias("_code"),
    )
    return d, distinct


def _scan_native(source: bytes | Path) -> tuple[pl.DataFrame, pl.Series] | None:
    """`_scan` without the text columns, by the native tokenizer (`gpu_pipeline.native`): the
    same frame and distinct series (codes in another order); None when the tokenizer is not
    built or left too much to Polars (`_native_tokens`)."""
    tokens = _native_tokens(source)
    return None if tokens is None else _token_frame(*tokens)


def _scan(source: bytes | Path, text: bool = False) -> tuple[pl.DataFrame, pl.Series] | None:
    """One streaming CSV pass: each line split at its first `}` into the series and the rest,
    the rest into value and timestamp, cast; None if the file can't be read this way.

    The value and timestamp are kept as numbers only (`_has_ts`: a timestamp was written); with
    `text`, also as written (`value_s`, `ts_s`), which only files whose timestamps are not all
    integers need (OpenMetrics float seconds): the text columns cost time and memory.

    The series is read as a categorical of this file's own: the reader dedups the series as it
    goes, and each line carries just its code (`_code`); the distinct series come back too.
    The pass is row-wise only, so Polars' streaming engine runs it on every core and keeps the
    rows in order. `_lead`: the rest starts with exactly one space; the timestamp field takes
    the rest of the line, so extra tokens fail its cast.
    """
    if not text and (scanned := _scan_native(source)) is not None:
        return scanned
    return _scan_csv(source, text)


def _scan_csv(source: bytes | Path, text: bool) -> tuple[pl.DataFrame, pl.Series] | None:
    """`_scan` by Polars' CSV reader."""
    cats = pl.Categories.random()
    ts_int = pl.col("field_2").cast(pl.Int64, strict=False)
    try:
        d = (
            pl.scan_csv(
                source,
                has_header=False,
                separator="}",
                quote_char=None,
                glob=False,
                truncate_ragged_lines=True,  # a `}` inside a label value: that line goes slow
                schema={"s": pl.Categorical(cats), "rest": pl.String},
                missing_columns="insert",  # lines without `}` (comments): rest is null
                raise_if_empty=False,
            )
            .with_row_index("line", offset=1)
            .select(
                pl.col("line").cast(pl.Int64),
                "s",
                # an empty line, or a lone `}` (read the same: `_blank_lines` tells them
                # apart); a line with a rest after its `}` is the end of a sample cut in two
                (pl.col("s").is_null() & pl.col("rest").is_null()).alias("_no_series"),
                pl.col("rest").str.splitn(" ", 3).alias("_vt"),
            )
            .unnest("_vt")
            .select(
                "line",
                "s",
                "_no_series",
                (pl.col("field_0") == "").alias("_lead"),
                pl.col("field_2").is_not_null().alias("_has_ts"),
                *(
                    [pl.col("field_1").alias("value_s"), pl.col("field_2").alias("ts_s")]
                    if text
                    else []
                ),
                pl.col("field_1").cast(pl.Float64, strict=False).alias("value"),
                # integer timestamps as written; their unit (and floats) are decided in parse
                ts_int.alias("ts_ms"),
            )
            .collect(engine="streaming")
        )
    except pl.exceptions.PolarsError:
        return None
    # codes are final once the whole file is read (not inside the streaming pass)
    distinct = d.schema["s"].categories.to_series()
    d = d.with_columns(pl.col("s").to_physical().alias("_code")).drop("s")
    return d, distinct


def _series_table(keys: pl.DataFrame, source_file: str = "") -> tuple[pl.DataFrame, list[str]]:
    """Distinct series -> metric, column, unit scale, valid range and attributes, parsed once each
    (`keys`: the series `s` in code order; the table keeps that order, one row per code). The
    series `learn_series` parsed already are taken from its table, the others parsed here."""
    book = _book
    if book is None:
        return _parse_series(keys, source_file)
    at = [book.rows.get(s) for s in keys.get_column("s").to_list()]
    if None not in at:
        return book.table[at], book.attr_cols
    miss = [i for i, r in enumerate(at) if r is None]
    if len(miss) == len(at):
        return _parse_series(keys, source_file)
    parsed, attr_cols = _parse_series(keys[miss], source_file)
    hits = [i for i, r in enumerate(at) if r is not None]
    both = pl.concat([book.table[[at[i] for i in hits]], parsed.select(book.table.columns)])
    return both[np.argsort(np.array(hits + miss))], attr_cols


@dataclass(frozen=True)
class _Book:
    """Series parsed ahead (`learn_series`): their table, and each series' row in it."""

    table: pl.DataFrame
    attr_cols: list[str]
    rows: dict[str, int]


_book: _Book | None = None
# at most this many series are kept (a landing zone's day names ~60 a host)
BOOK_SERIES = 500_000


def learn_series(heads: Iterable[bytes]) -> int:
    """Parse in one table the series that the starts of many files name (`heads`: each file's
    first bytes, cut at a line end), so that each file's parse takes its series' rows from it
    instead of parsing its ~60 series in ~70 small queries of its own (~11 ms a file, a fifth of
    a file's parse: issue 34). A row is kept for a series whose row does not depend on its file
    (a GPU identity made from the file's name does); a series no head names, or one not kept,
    is parsed by its file, as without this. The series are the content the rows are parsed
    from, so a head read from another file than the one parsed later can only cost a miss.
    Replaces what an earlier call kept; returns how many series are kept."""
    global _book
    seen: set[str] = set()
    for head in heads:
        seen.update(_distinct_series(head))
    if not seen or len(seen) > BOOK_SERIES:
        _book = None
        return 0
    keys = pl.DataFrame({"s": sorted(seen)}, schema={"s": pl.String})
    # parsed as two files of different names: the rows that differ depend on their file
    table, attr_cols = _parse_series(keys, "\0learn-a")
    other, _ = _parse_series(keys, "\0learn-b")
    same = table.select(
        pl.all_horizontal(pl.col(c).eq_missing(other.get_column(c)) for c in table.columns)
    ).to_series()
    strings = keys.get_column("s").to_list()
    rows = {s: i for i, (s, ok) in enumerate(zip(strings, same.to_list(), strict=True)) if ok}
    _book = _Book(table, attr_cols, rows) if rows else None
    return len(rows)


def _distinct_series(text: bytes) -> list[str]:
    """The distinct series (`name{labels`, as `_scan` splits them) of exposition `text`, by the
    native tokenizer (none when it is not built or the text is not ASCII)."""
    if not native.available() or not text:
        return []
    scan = native.scan_exposition(np.frombuffer(text, np.uint8), 1)
    if scan is None:
        return []
    chars, at = scan.series_bytes.tobytes(), scan.series_offsets.tolist()
    return [chars[a:b].decode() for a, b in zip(at, at[1:], strict=False)]


def forget_series() -> None:
    """Drop what `learn_series` kept."""
    global _book
    _book = None


def _parse_series(keys: pl.DataFrame, source_file: str) -> tuple[pl.DataFrame, list[str]]:
    """`_series_table` of `keys`, every series parsed here."""
    # split at the first `{` (a metric name has none), then validate each distinct metric name
    # and label block once: label blocks repeat across a GPU's fields
    parts = pl.col("s").str.split_exact("{", 1)
    series = keys.with_columns(
        parts.struct.field("field_0").alias("metric"),
        ("{" + parts.struct.field("field_1")).alias("labels"),
    )
    metric_ok = pl.col("metric").str.contains(f"^{_NAME}$")
    blocks = series.get_column("labels").drop_nulls().unique().to_frame()
    blocks = blocks.filter(pl.col("labels").str.contains(f"^{_LABELS_OPEN}$"))
    series = series.with_columns(
        pl.when(metric_ok & pl.col("labels").is_in(blocks.get_column("labels").implode()))
        .then(pl.col("metric"))
        .alias("metric"),
        (pl.col("labels") + "}").alias("labels"),
    )
    attrs = normalize_series(_label_attrs(blocks.get_column("labels") + "}"), source_file)
    series = (
        series.join(attrs, on="labels", how="left", maintain_order="left")
        .with_columns(
            metric_column(pl.col("metric")).alias("column"),
            metric_scale(pl.col("metric")).alias("scale"),
        )
        .with_columns(value_bounds())
        .drop("s", "labels")
    )
    return series, [c for c in attrs.columns if c != "labels"]


def _scaled(series: pl.DataFrame) -> bool:
    """Whether some series of a file has a unit scale other than 1 (its lines' values are
    scaled: `_in_unit`)."""
    return bool((series.get_column("scale").fill_null(1.0) != 1.0).any())


def _in_unit(scaled: bool) -> pl.Expr:
    """A line's value in its field's unit: times its series' `scale` when some series has one."""
    return pl.col("value") * pl.col("scale") if scaled else pl.col("value")


# a series whose samples are not kept: no known field, no GPU UUID, or labels that can't be kept
_UNKEPT = (
    pl.col("column").is_null() | pl.col("gpu_uuid").is_null() | pl.col("_attr_reason").is_not_null()
)


def _clean_samples(
    fast: pl.DataFrame,
    series: pl.DataFrame,
    attr_cols: list[str],
    scaled: bool,
    timed: bool,
    window: tuple[int, int],
    keyed: bool = False,
) -> tuple[pl.DataFrame, pl.DataFrame | None] | None:
    """The usual file's samples in three queries, when `finalize` would reject none of them:
    the checks run on numbers and flags taken by code, the text columns are taken only then.
    None when some line is rejected: the caller goes the general way, which words the reasons.
    With `keyed`, the samples are keyed by series (`KEYED_SCHEMA`) and come with their series
    table (one row per code); else in the long form, with None.

    The same rules as `finalize`: a series without a known field, a GPU UUID or with labels that
    can't be kept; a time missing or outside `window`; a value outside its field's range (blank
    sentinels pass, as no reading); a line without its own time in a `timed` file.
    """
    lo, hi = window
    if series.get_column("gpu_instance_id").is_not_null().any():
        series = mig_device_level(series)  # row-wise: the same on series as on their lines
    codes = fast.get_column("_code")
    per_line = series.select(
        _UNKEPT.alias("_unkept"), "_lo", "_hi", *(["scale"] if scaled else [])
    ).select(pl.all().gather(codes))
    g = pl.concat([fast.select("line", "value", "ts_ms", "_has_ts"), per_line], how="horizontal")
    value = _in_unit(scaled)
    ts = pl.col("ts_ms")
    rejected = (
        pl.col("_unkept")
        | pl.col("value").is_null()
        | ts.is_null()
        | ~ts.is_between(lo, hi)
        | (pl.lit(timed) & ~pl.col("_has_ts"))
        | out_of_range(pl.col("value"), value)
    )
    if g.select(rejected.fill_null(True).any()).item():
        return None
    return _clean_out(g, codes, series, attr_cols, scaled, keyed)


def _clean_out(
    g: pl.DataFrame,
    codes: pl.Series,
    series: pl.DataFrame,
    attr_cols: list[str],
    scaled: bool,
    keyed: bool,
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The accepted lines `g` (line, value, ts_ms; `scale` when `scaled`; their series `codes`)
    as samples: keyed with their series table, or in the long form (`_clean_samples`)."""
    value = _in_unit(scaled)
    # epoch milliseconds as the samples' UTC times, in their unit: no conversion (from_epoch
    # gives microseconds, which `conform` converted back)
    timestamp = pl.col("ts_ms").cast(pl.Datetime("ms", "UTC"))
    kept = pl.when(is_blank_sentinel(pl.col("value"))).then(None).otherwise(value).alias("value")
    if keyed:  # the series' columns stay in the series table
        samples = g.select(
            "line", timestamp.alias("timestamp"), kept, codes.cast(pl.Int32).alias("sid")
        )
        table = conform(
            pl.DataFrame([series.get_column(c) for c in ("column", *attr_cols)]), SERIES_SCHEMA
        )
        return conform(samples, KEYED_SCHEMA), table
    text = series.select(pl.col("column", *attr_cols).gather(codes))
    samples = pl.concat([g, text], how="horizontal").select(
        "line", timestamp.alias("timestamp"), "column", kept, *attr_cols
    )
    return conform(samples, LONG_SCHEMA), None


def _clean_tokens(
    scan: native.ExpositionScan,
    distinct: pl.Series,
    series: pl.DataFrame,
    attr_cols: list[str],
    ctx: Context,
    keyed: bool,
) -> ParsedLines | None:
    """The usual file straight from the native tokens, in a few array operations instead of the
    frame `_parse_fast` builds: when each line is skipped (no series, a comment, another
    series than GPU telemetry) or is a known, kept GPU series with an integer timestamp in
    the plausible window and a value in its field's range. Then it yields exactly what
    `_parse_fast` yields for the file (`_mark_skipped`, `TimeUnits.of_scan`, `_route` and
    `_clean_samples` on the same lines); None otherwise, and the caller goes that way."""
    lo, hi = ctx.time_window()
    n = len(scan.code)
    # every kept time inside the window, and the whole window in milliseconds' range: the
    # median of the times gives milliseconds (`TimeUnits.of_scan`), the times are as written
    if not n or not len(distinct) or TimeUnits.from_medians(lo, None) != TimeUnits():
        return None
    if ctx.times not in (None, _TIMED_MS):  # an earlier piece of the file decided otherwise
        return None
    if TimeUnits.from_medians(hi, None) != TimeUnits():
        return None
    other, odd, fields = _series_kinds(distinct, series)
    # as `_parse_fast` takes them, before MIG re-keys device-level fields
    attr_cols = [a for a in attr_cols if series.get_column(a).null_count() < series.height]
    scaled = _scaled(series)
    mig = mig_gpus(series)
    if series.get_column("gpu_instance_id").is_not_null().any():
        series = mig_device_level(series)
    unkept = series.select(_UNKEPT).to_series().to_numpy()
    code, flags, ts = scan.code, scan.flags, scan.ts
    has = code != native.NO_CODE
    c = np.where(has, code, 0)
    skip = ((flags & native.NO_SERIES) != 0) | (has & other.to_numpy()[c])
    at = np.flatnonzero(~skip)
    if not len(at):
        return None
    need = native.LEAD | native.VALUE | native.HAS_TS | native.TS
    kc, kts = c[at], ts[at]
    if not bool(has[at].all()) or bool(((flags[at] & need) != need).any()):
        return None
    if bool((odd.to_numpy() | unkept)[kc].any()) or bool(((kts < lo) | (kts > hi)).any()):
        return None
    codes = pl.Series("_code", kc)
    g = pl.concat(
        [
            pl.DataFrame({"line": at + 1, "value": scan.value[at], "ts_ms": kts}),
            series.select(pl.col("_lo", "_hi", *(["scale"] if scaled else [])).gather(codes)),
        ],
        how="horizontal",
    )
    value = _in_unit(scaled)
    if g.select(out_of_range(pl.col("value"), value).fill_null(True).any()).item():
        return None
    samples, table = _clean_out(g, codes, series, attr_cols, scaled, keyed)
    return ParsedLines(
        samples,
        pl.DataFrame(schema=QUARANTINE_LINE_SCHEMA),
        n,
        n - len(at),
        "sample",
        records_by_day(g, lo, hi),
        fields=fields,
        series=table,
        times=_TIMED_MS,
        mig_gpus=mig,
    )


def parse(text: str | bytes | Path, ctx: Context, keyed: bool = False) -> ParsedLines:
    """Parse exposition text, bytes or a file (read memory-mapped; bytes only for slow lines).
    With `keyed`, a file whose every line is accepted comes back keyed by series
    (`ParsedLines.series`); otherwise, and always without it, in the long form."""
    source = text.encode("utf-8") if isinstance(text, str) else text

    def data() -> bytes:
        return source.read_bytes() if isinstance(source, Path) else source

    # numbers only first; a file with timestamps that are not all integers is read again with
    # the text of its values and timestamps (their units and reasons need it)
    parsed = _parse_fast(source, ctx, data, text=False, keyed=keyed)
    if parsed is None:
        parsed = _parse_fast(source, ctx, data, text=True, keyed=keyed)
    if parsed is not False:
        return parsed
    lines = _read_lines(data())
    body = lines.filter(~pl.col("raw").str.contains(r"^[ \t]*(#|$)"))
    g, other, times = _regex_candidates(body, ctx, *(ctx.times or (None, None))[:2])
    untimed = g.filter(pl.col("pre_reason").is_null() & pl.col("ts_s").is_null()).height
    basis = ctx.file_time_basis if ctx.file_time is not None and untimed else "sample"
    samples, quarantine, records, mig = finalize(g, normalized=True, window=ctx.time_window())
    out = ParsedLines(
        samples,
        quarantine,
        lines.height,
        lines.height - body.height + other,
        basis,
        records,
        times=_times_out(*times, ctx, [g.get_column("_key").unique()]),
        mig_gpus=mig,
    )
    out.fields = sorted(set(g.get_column("column").drop_nulls().unique().to_list()))
    return out


def _blank_lines(d: pl.DataFrame, distinct: pl.Series, data) -> tuple[pl.DataFrame, pl.Series]:
    """The CSV pass's lines without a series or a rest (`_no_series`) kept as blank only when
    their text is: a lone `}` reads the same, and is malformed (read the slow way,
    quarantined). Their text is read again only when the file has such lines."""
    maybe = d.filter(pl.col("_no_series")).get_column("line")
    if not maybe.len():
        return d, distinct
    written = _lines_numbered(data(), maybe).filter(pl.col("raw") != "").get_column("line")
    if not written.len():
        return d, distinct
    not_blank = pl.col("line").is_in(written.implode())
    return d.with_columns((pl.col("_no_series") & ~not_blank).alias("_no_series")), distinct


def _file_times(d: pl.DataFrame, ctx: Context) -> tuple[TimeUnits, bool, bool]:
    """Timestamp units, and whether the samples carry their own time, are decided once per file
    (`TimeUnits.of_scan`), by its first piece for a file parsed in pieces (`ctx.times`)."""
    units, timed, odd_ts = TimeUnits.of_scan(d, pl.col("_skip"))
    if ctx.times is not None:
        units, timed = ctx.times[:2]
    return units, timed, odd_ts


def _parse_fast(
    source: bytes | Path, ctx: Context, data, text: bool, keyed: bool = False
) -> ParsedLines | None | bool:
    """The fast path over `_scan`; False: the file can't be scanned (the caller reads it line by
    line); None: its timestamps need the text (`text=False` only)."""
    tokens = None if text else _native_tokens(source)
    if tokens is None:
        if (scanned := _scan_csv(source, text)) is None:
            return False
        d, distinct = _blank_lines(*scanned, data)
    else:
        distinct = tokens[1]
    series, attr_cols = _series_table(pl.DataFrame({"s": distinct}), ctx.source_file)
    if tokens is not None:  # the usual file straight from the tokens, else their frame
        if (clean := _clean_tokens(*tokens, series, attr_cols, ctx, keyed)) is not None:
            return clean
        d, _ = _token_frame(*tokens)
        del tokens
    d, fields = _mark_skipped(d, distinct, series)
    units, timed, odd_ts = _file_times(d, ctx)
    if odd_ts and not text:
        return None
    d = _resolve_times(d, ctx, units, timed, odd_ts)
    d, again, keys = _written_again(d, distinct, series, ctx, timed)
    path = _route(d)
    d = d.with_columns(path.alias("_path"))
    # each line takes its series' parsed columns by code (a gather, no hashing per line); what
    # no line needs stays out: attributes no series carries and unit factors of 1 (`candidates`
    # fills them in), metric names unless some metric is unknown (its reason names it)
    fast = d if bool((path == 1).all()) else d.filter(pl.col("_path") == 1)
    attr_cols = [c for c in attr_cols if series.get_column(c).null_count() < series.height]
    extra = _extra_cols(series)
    window = ctx.time_window()
    skipped = int((path == 0).sum())
    if not bool((path == 2).any()) and again is None:
        clean = _clean_samples(fast, series, attr_cols, "scale" in extra, timed, window, keyed)
        if clean is not None:
            untimed = not timed and ctx.file_time is not None and not bool(fast["_has_ts"].all())
            return ParsedLines(
                clean[0],
                pl.DataFrame(schema=QUARANTINE_LINE_SCHEMA),
                d.height,
                skipped,
                ctx.file_time_basis if untimed else "sample",
                records_by_day(fast, *window),
                fields=fields,
                series=clean[1],
                times=_times_out(units, timed, ctx, [keys]),
                mig_gpus=mig_gpus(series),
            )
    frames = [_fast_candidates(fast, series, [*extra, "column", "_lo", "_hi", *attr_cols], timed)]
    if bool((path == 2).any()):
        slow = _lines_numbered(data(), d.filter(pl.col("_path") == 2).get_column("line"))
        g_slow, n_skipped = _slow_lines(slow, ctx, units, timed, again)
        skipped += n_skipped
        frames.append(g_slow)
        keys = pl.concat([keys, g_slow.get_column("_key")]) if keys is not None else None
    g = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    samples, quarantine, records, mig = finalize(g, normalized=True, window=window)
    rejected_fast = quarantine.filter(pl.col("raw").is_null())
    if rejected_fast.height:  # read those lines again, the slow way: their text and reasons
        raw = _lines_numbered(data(), rejected_fast.get_column("line"))
        quarantine = _quote_rejected(
            quarantine, rejected_fast, raw, ctx, (units, timed, again), window
        )
    basis = ctx.file_time_basis if _untimed(frames, timed, ctx) else "sample"
    return ParsedLines(
        samples,
        quarantine,
        d.height,
        skipped,
        basis,
        records,
        fields=fields,
        times=_times_out(units, timed, ctx, [keys]),
        mig_gpus=mig,
    )


def _extra_cols(series: pl.DataFrame) -> list[str]:
    """The series' columns the fast candidates take besides the usual ones (`_parse_fast`):
    metric names when some metric is unknown (its reason names it), unit factors when some
    series has one other than 1."""
    extra = []
    if series.select((pl.col("metric").is_not_null() & pl.col("column").is_null()).any()).item():
        extra.append("metric")
    if _scaled(series):
        extra.append("scale")
    return extra


def _written_again(
    d: pl.DataFrame, distinct: pl.Series, series: pl.DataFrame, ctx: Context, timed: bool
) -> tuple[pl.DataFrame, pl.Series | None, pl.Series | None]:
    """In a file whose samples take the file's time (not `timed`), the lines whose series an
    earlier line (or piece, `_earlier`) wrote: scrapes appended to one file (`curl
    node:9400/metrics >> scrapes.prom` from cron) whose later lines would all be filed at that
    one time, counted as duplicates of the first or as conflicting with it (adversarial
    review). The first line of each series keeps the file's time; the later ones (`_again`,
    and their line numbers) are quarantined (`REPEATED_UNTIMED`). Also this file's series so
    written (`_times_out`). One `is_first_distinct` over the codes of the readings without a
    time of their own; a `timed` file is returned as it is. A series the fast path can't vouch
    for (`odd`: a `}` inside a label value cuts its code short) is checked by its text, the slow
    way (`_regex_candidates`); so is a reading the fast path has no number of (odd whitespace),
    among the slow lines only."""
    if timed or ctx.file_time is None or not len(distinct) or not d.height:
        return d, None, None
    code = d.get_column("_code")
    c = code.fill_null(0).to_numpy()
    whole = series.get_column("metric").is_not_null().to_numpy()[c]  # its code is its series
    # a reading: a number after the series' `}` (a line cut before its `}` has a code too)
    own = ~d.get_column("_has_ts") & ~d.get_column("_skip") & d.get_column("value").is_not_null()
    checked = own.fill_null(False).to_numpy() & code.is_not_null().to_numpy() & whole
    # each code's reading (GPU and field, `_reading_key`), as a number to compare lines by
    code_key = series.select(_reading_key(pl.lit(distinct))).to_series()
    reading = code_key.rank("dense").cast(pl.Int64).to_numpy()
    # a scrape's `# HELP` / `# TYPE` lines written again end it too (a pod changed between two
    # appended scrapes writes other series texts, but the same comments)
    comment = d.get_column("_skip").fill_null(False).to_numpy() & code.is_not_null().to_numpy()
    idx = np.flatnonzero(checked | comment)
    ids = np.where(checked[idx], reading[c[idx]], -1 - np.arange(len(idx)))  # comments: no reading
    again = np.zeros(len(c), dtype=bool)
    again[idx] = _later_scrape(c[idx], ids) & checked[idx]
    if earlier := _earlier(ctx):
        again |= checked & code_key.is_in(list(earlier)).to_numpy()[c]
    keys = code_key.gather(pl.Series(c[checked]).unique())
    if not again.any():
        return d, None, keys
    at = pl.Series("_again", again)
    return d.with_columns(at), d.get_column("line").filter(at), keys


def _untimed(frames: list[pl.DataFrame], timed: bool, ctx: Context) -> bool:
    """Whether a line of `frames` (the fast candidates, then the slow ones') is filed at the
    file's time (`ctx.file_time`): it has no time of its own, in a file not `timed`."""
    return (
        not timed
        and ctx.file_time is not None
        and bool(
            frames[0].select((~pl.col("_has_ts")).any()).item()
            or any(
                f.select((pl.col("pre_reason").is_null() & pl.col("ts_s").is_null()).any()).item()
                for f in frames[1:]
            )
        )
    )


def _series_kinds(
    distinct: pl.Series, series: pl.DataFrame
) -> tuple[pl.Series, pl.Series, list[str]]:
    """Per series code: skipped (`other`: a comment, or a series of other things than GPU
    telemetry, as node_* and go_* in a /federate answer) and `odd` (the series pattern rejects
    it: odd label syntax, read the slow way, line by line); and the fields of the file's GPU
    series (sorted)."""
    metric = pl.col("metric")
    kinds = series.select(  # one query: the table is a file's few dozen series
        (
            pl.lit(distinct).str.starts_with("#")
            | (metric.is_not_null() & ~_gpu_metric(metric).fill_null(False))
        ).alias("other"),
        metric.is_null().alias("odd"),
    )
    other = kinds.get_column("other")
    columns = series.get_column("column").to_list()
    fields = sorted({c for c, o in zip(columns, other.to_list(), strict=True) if c and not o})
    return other, kinds.get_column("odd"), fields


def _mark_skipped(
    d: pl.DataFrame, distinct: pl.Series, series: pl.DataFrame
) -> tuple[pl.DataFrame, list[str]]:
    """Which scanned lines are skipped (`_skip`) and which the fast path can't read (`_lead`
    false); also the fields of the file's GPU series (sorted)."""
    # comments and blank lines (indented comments are rare: the slow path tells them apart) and
    # other series than GPU telemetry are skipped; odd series go the slow way
    other, odd, fields = _series_kinds(distinct, series)
    comments = pl.Series(np.flatnonzero(other.to_numpy()), dtype=pl.UInt32)
    odd = pl.Series(np.flatnonzero(odd.to_numpy()), dtype=pl.UInt32)
    code = pl.col("_code")
    skip = pl.col("_no_series")
    if comments.len():  # a line without a series (no code) is not a comment
        skip = skip | code.is_in(comments.implode()).fill_null(False)
    lead = pl.col("_lead")
    if odd.len():
        lead = lead & ~code.is_in(odd.implode())
    return d.with_columns(skip.alias("_skip"), lead.alias("_lead")), fields


def _resolve_times(
    d: pl.DataFrame, ctx: Context, units: TimeUnits, timed: bool, odd_ts: bool
) -> pl.DataFrame:
    """`ts_ms` in epoch ms: the sample's own time in the file's `units` (from its text when some
    timestamp is not an integer, `odd_ts`), else the file's time when the file is not `timed`."""
    file_ms = None if ctx.file_time is None or timed else int(ctx.file_time.timestamp() * 1000)
    if odd_ts:
        return d.with_columns(_ts_ms(pl.col("ts_s"), units, file_ms, pl.lit(True)).alias("ts_ms"))
    if file_ms is not None or units != TimeUnits():
        return d.with_columns(
            pl.when(pl.col("_has_ts"))
            .then(units.int_ms(pl.col("ts_ms")))
            .otherwise(pl.lit(file_ms, pl.Int64))
            .alias("ts_ms")
        )
    return d


def _route(d: pl.DataFrame) -> pl.Series:
    """Each line's way: 0 skipped, 1 the fast path (numbers read, series known), 2 the slow
    path (one regex per line)."""
    fast_ok = (
        pl.col("_code").is_not_null()  # a line that starts with `}` has a value but no series
        & pl.col("_lead")
        & pl.col("value").is_not_null()
        & (~pl.col("_has_ts") | pl.col("ts_ms").is_not_null())
    ).fill_null(False)
    return d.select(pl.when(pl.col("_skip")).then(0).when(fast_ok).then(1).otherwise(2)).to_series()


def _fast_candidates(
    fast: pl.DataFrame, series: pl.DataFrame, series_cols: list[str], timed: bool
) -> pl.DataFrame:
    """The fast path's lines as `candidates`, with their series' `series_cols` taken by code."""
    per_line = series.select(pl.col(*series_cols).gather(fast.get_column("_code")))
    # the fast rows carry no text: a rejected one is read again the slow way (`_quote_rejected`),
    # so its reason quotes the value as written
    fast = pl.concat(
        [
            fast.select(
                "line",
                pl.lit(None, pl.String).alias("raw"),
                pl.lit(None, pl.String).alias("value_s"),
                "value",
                "ts_ms",
                "_has_ts",
                *(["_again"] if "_again" in fast.columns else []),
            ),
            per_line,
        ],
        how="horizontal",
    )
    if timed:
        fast = fast.with_columns(
            pl.when(~pl.col("_has_ts")).then(pl.lit(UNTIMED_IN_TIMED)).alias("pre_reason")
        )
    elif "_again" in fast.columns:  # a series written again in a file without sample times
        fast = fast.with_columns(
            pl.when(pl.col("_again")).then(pl.lit(REPEATED_UNTIMED)).alias("pre_reason")
        )
    return candidates(fast)


def _slow_candidates(
    lines: pl.DataFrame,
    ctx: Context,
    units: TimeUnits,
    timed: bool,
    again: pl.Series | None,
) -> tuple[pl.DataFrame, int]:
    """`_regex_candidates` with the file's `units` and `timed` (and the lines the fast path
    found `again`), and their fields' valid ranges."""
    g, n_other, _ = _regex_candidates(lines, ctx, units, timed, again)
    return g.with_columns(value_bounds()), n_other


def _lines_numbered(data: bytes, lines: pl.Series) -> pl.DataFrame:
    """(line, raw) of the lines numbered `lines`, read again from `data` by the slow reader."""
    return _read_lines(data).filter(pl.col("line").is_in(lines.implode()))


def _slow_lines(
    raw: pl.DataFrame,
    ctx: Context,
    units: TimeUnits,
    timed: bool,
    again: pl.Series | None,
) -> tuple[pl.DataFrame, int]:
    """The lines the fast path routed the slow way (`raw`: line, raw) as candidates (`again`:
    the lines it found written again, `_written_again`); also how many of them are skipped
    (blank, comments, other series than GPU telemetry)."""
    blank_or_comment = pl.col("raw").str.contains(r"^[ \t]*(#|$)")
    skipped = int(raw.select(blank_or_comment.sum()).item())
    g_slow, n_other = _slow_candidates(raw.filter(~blank_or_comment), ctx, units, timed, again)
    return g_slow, skipped + n_other


def _quote_rejected(
    quarantine: pl.DataFrame,
    rejected_fast: pl.DataFrame,
    raw: pl.DataFrame,
    ctx: Context,
    times: tuple[TimeUnits, bool, pl.Series | None],
    window: tuple[int, int],
) -> pl.DataFrame:
    """The quarantine with the fast path's rejected lines (no `raw`) read again the slow way
    (`raw`: their line and text), so each carries its text and a reason that quotes it
    (`times`: the file's units, `timed`, and the lines found written again)."""
    g = _slow_candidates(raw, ctx, *times)[0]
    read = finalize(g, normalized=True, window=window)[1]
    if read.get_column("line").sort().equals(rejected_fast.get_column("line").sort()):
        kept = quarantine.filter(pl.col("raw").is_not_null())
        return pl.concat([kept, read]).sort("line")
    # both readings must reject the same lines; if not, keep the fast reasons
    return (
        quarantine.join(raw.rename({"raw": "_raw"}), on="line", how="left")
        .with_columns(pl.coalesce("raw", "_raw").alias("raw"))
        .drop("_raw")
    )
