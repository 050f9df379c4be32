"""The long sample form every parser produces, and the normalization of identity attributes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from gpu_pipeline.lib.fields import ID_COLUMNS

# identity/attribution columns a parser attaches to each sample (all but timestamp)
ATTR_COLUMNS: tuple[str, ...] = tuple(c for c in ID_COLUMNS if c != "timestamp")
INT_ATTRS = ("gpu_instance_id", "gpu_index")
# the order of rows in the lake's gpu_samples and gpu_minutes: one GPU (and MIG instance) after
# another, in time order; a day can then be read a range of GPUs at a time (row-group statistics)
SAMPLE_ORDER = ("gpu_uuid", "gpu_instance_id", "timestamp")

MINUTE_MS, HOUR_MS = 60_000, 3_600_000
# minutes of a UTC day (no daylight saving in UTC): what full coverage of a GPU-day is
MINUTES_PER_DAY = 1440


def floor_ms(ts: pl.Expr, ms: int) -> pl.Expr:
    """A UTC timestamp floored to a multiple of `ms` milliseconds since the epoch (`MINUTE_MS`:
    its minute, `HOUR_MS`: its hour), as `Datetime("ms", "UTC")`. The same as `dt.truncate` in
    UTC, done on the integer epoch: truncate works through the time zone's calendar, 5x slower."""
    return (ts.dt.epoch("ms") // ms * ms).cast(pl.Datetime("ms", "UTC"))


# the row of a physical GPU (a MIG instance's row carries its instance id)
PHYSICAL = pl.col("gpu_instance_id").is_null()


def ratio(num: str | pl.Expr, den: str | pl.Expr, scale: float = 1.0) -> pl.Expr:
    """num / den (columns or expressions, e.g. two sums of weights), null (not NaN) where
    nothing was counted."""
    n = pl.col(num) if isinstance(num, str) else num
    d = pl.col(den) if isinstance(den, str) else den
    return pl.when(d > 0).then(scale * n / d)


def phase_share(columns: list[str], p: str) -> pl.Expr:
    """The minute's share of phase `p`: its sub-minute share where the minutes (`columns`) carry
    one, else 1 or 0 by the minute's own phase."""
    own = indicator(pl.col("phase") == p)
    if f"phase_share_{p}" in columns:
        return pl.coalesce(pl.col(f"phase_share_{p}"), own)
    return own


def indicator(cond: pl.Expr) -> pl.Expr:
    """1.0 where `cond` holds, else 0.0 (null counts as not holding). A when/then: casting the
    boolean to a float costs 15x as much."""
    return pl.when(cond).then(1.0).otherwise(0.0)


LONG_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64,
    "timestamp": pl.Datetime("ms", "UTC"),
    "column": pl.String,
    "value": pl.Float64,
    **{c: (pl.Int32 if c in INT_ATTRS else pl.String) for c in ATTR_COLUMNS},
}
# the same samples keyed by series (`ParsedLines.series`): a file's few dozen series (a GPU's
# field with its labels) carry the column and attributes once each, and a sample only its
# series' number `sid` (the series' row in its table): what a parse builds, sorts and caches
# per sample is four numbers, not eleven strings (issue 34)
KEYED_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64,
    "timestamp": pl.Datetime("ms", "UTC"),
    "value": pl.Float64,
    "sid": pl.Int32,
}
SERIES_SCHEMA: dict[str, pl.DataType] = {
    "column": pl.String,
    **{c: (pl.Int32 if c in INT_ATTRS else pl.String) for c in ATTR_COLUMNS},
}


def unkey(samples: pl.DataFrame, series: pl.DataFrame) -> pl.DataFrame:
    """Keyed samples (`KEYED_SCHEMA`) in the long form, each with its series' column and
    attributes (`series`: `SERIES_SCHEMA`, one row per sid)."""
    sid = samples.get_column("sid")
    attrs = series.select(list(SERIES_SCHEMA)).gather(sid)
    out = pl.concat([samples.select("line", "timestamp", "value"), attrs], how="horizontal")
    return out.select(list(LONG_SCHEMA))


QUARANTINE_LINE_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.Int64,
    "timestamp": pl.Datetime("ms", "UTC"),
    "reason": pl.String,
    "raw": pl.String,
    # the field whose value was rejected (null: the record as a whole, or no field known)
    "field": pl.String,
    # the record's other values were accepted: this row is one value, the record is not lost
    "record_kept": pl.Boolean,
}


@dataclass
class ParsedLines:
    """What one parser made of one file: accepted long samples and rejected lines."""

    samples: pl.DataFrame  # LONG_SCHEMA
    quarantine: pl.DataFrame  # QUARANTINE_LINE_SCHEMA
    lines_total: int
    lines_skipped: int  # comments, HELP/TYPE, blank lines: read, not records
    # where sample times came from: "sample" (their own), else the file's time ("file_name" or
    # "file_mtime") for all or some samples
    time_basis: str = "sample"
    # the records the parser read, per UTC day of their time (None: no plausible time of their
    # own, accounted on the file's home day), counted from its input before any record was
    # accepted or rejected: the ledger's rows_read, which row_conservation checks the outcome
    # (accepted + duplicate + quarantined) against
    records_by_day: dict = field(default_factory=dict)
    # where the file came from when it says so (a pulled file: the server and query)
    origin: str | None = None
    # header names the parser did not use (CSV formats), and the fields the file gives
    columns_ignored: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    rejected_whole: bool = False  # the file as a whole: one record
    # the file could not be read this run (it changed since it was listed): not to be cached
    changed: bool = False
    sha256: str | None = None  # of the bytes read, the ones parsed
    bytes_read: int | None = None
    # when set, `samples` are keyed (`KEYED_SCHEMA`) and this is their series (`SERIES_SCHEMA`)
    series: pl.DataFrame | None = None
    # the exposition parser's decision for the file: its timestamps' unit and whether its
    # samples carry their own times (`Context.times` hands it to the file's later pieces)
    times: tuple | None = None
    # a CSV header written again in this piece's rows: the header the file's next piece is read
    # with (`PieceParse`)
    last_header: str | None = None
    # a CSV loop log without identity columns: the loop (GPUs an iteration, the gap between
    # iterations) this piece ends in, which the file's next piece continues (`Context.loop`)
    loop: tuple | None = None
    # the GPUs (UUIDs) whose device-level fields the file gives on a MIG instance's label set,
    # once per instance as dcgm-exporter does (`formats.common.mig_gpus`): the parse re-keys them
    # to the GPU, and their repeats of one time in this file are one reading
    # (`gpu_samples._mig_repeats`), even where the file gives nothing else of the instances
    mig_gpus: list[str] = field(default_factory=list)

    def unkeyed(self) -> ParsedLines:
        """These lines with their samples in the long form (`LONG_SCHEMA`)."""
        if self.series is None:
            return self
        return replace(self, samples=unkey(self.samples, self.series), series=None)


def normalize_uuid(expr: pl.Expr) -> pl.Expr:
    """`GPU-` prefix followed by the lower-cased UUID, whatever form the source used."""
    core = expr.str.strip_chars().str.to_lowercase().str.replace(r"^gpu-", "")
    return (
        pl.when(core.is_null() | (core == ""))
        .then(None)
        .otherwise(pl.concat_str(pl.lit("GPU-"), core))
    )


BUS_ID_RX = r"^(?:([0-9A-F]{1,8}):)?([0-9A-F]{1,2}):([0-9A-F]{1,2})\.([0-7])$"


def normalize_bus_id(expr: pl.Expr) -> pl.Expr:
    """A PCI bus id as nvidia-smi writes it, `00000000:3B:00.0`, whatever form the source used
    (`0000:3b:00.0` as lspci writes it, no domain); kept as written (upper case) when it is not
    a bus id."""
    s = expr.str.strip_chars().str.to_uppercase()
    m = s.str.extract_groups(BUS_ID_RX)
    part = m.struct.field
    formatted = pl.format(
        "{}:{}:{}.{}",
        part("1").fill_null("0").str.zfill(8),
        part("2").str.zfill(2),
        part("3").str.zfill(2),
        part("4"),
    )
    return (
        pl.when(s.is_null() | (s == ""))
        .then(None)
        .when(part("2").is_not_null())
        .then(formatted)
        .otherwise(s)
    )


# an old-style MIG device UUID names its parent GPU and instance: MIG-GPU-<uuid>/<gi>/<ci>
MIG_DEVICE_RX = r"(?i)^MIG-(?:GPU-)?([0-9a-f][0-9a-f-]*)/(\d+)/(\d+)$"
UUID_RX = r"^GPU-[0-9a-z][0-9a-z-]{0,127}$"
MAX_LABEL_BYTES = 1024
STRING_ATTRS = tuple(c for c in ATTR_COLUMNS if c not in INT_ATTRS)


def normalize_attributes(df: pl.DataFrame) -> pl.DataFrame:
    """Cast and normalize attribute columns (UUID form, integer ids, trimmed names).

    A MIG device UUID that names its parent (`MIG-GPU-<uuid>/<gi>/<ci>`) becomes the parent's
    UUID and the instance id; `attribute_reason` rejects what still is not a GPU UUID.
    """
    mig = pl.col("gpu_uuid").str.strip_chars().str.extract_groups(MIG_DEVICE_RX)
    exprs = []
    for c in ATTR_COLUMNS:
        col = pl.col(c).str.strip_chars()
        if c == "gpu_uuid":
            exprs.append(
                pl.when(mig.struct.field("1").is_not_null())
                .then(pl.concat_str(pl.lit("GPU-"), mig.struct.field("1").str.to_lowercase()))
                .otherwise(normalize_uuid(pl.col(c)))
                .alias(c)
            )
        elif c == "gpu_instance_id":
            exprs.append(
                pl.coalesce(
                    col.cast(pl.Int32, strict=False), mig.struct.field("2").cast(pl.Int32)
                ).alias(c)
            )
        elif c in INT_ATTRS:
            exprs.append(col.cast(pl.Int32, strict=False).alias(c))
        elif c == "pci_bus_id":
            exprs.append(normalize_bus_id(pl.col(c)).alias(c))
        else:
            exprs.append(pl.when(col == "").then(None).otherwise(col).alias(c))
    return df.with_columns(exprs)


def attribute_reason() -> pl.Expr:
    """Why a sample's identity labels cannot be kept (null: they can): a label value over
    MAX_LABEL_BYTES, a MIG device UUID without its parent, a UUID with characters no UUID has."""
    uuid = pl.col("gpu_uuid")
    too_long = pl.any_horizontal(
        [pl.col(c).str.len_bytes().fill_null(0) > MAX_LABEL_BYTES for c in STRING_ATTRS]
    )
    return (
        pl.when(too_long)
        .then(pl.lit(f"label value longer than {MAX_LABEL_BYTES} bytes: line not read"))
        .when(uuid.str.starts_with("GPU-mig-"))
        .then(
            pl.format(
                "MIG device UUID '{}' names no parent GPU: label the series with the GPU's UUID "
                "and GPU_I_ID (dcgm-exporter does)",
                uuid.str.slice(4, 80),
            )
        )
        .when(uuid.is_not_null() & ~uuid.str.contains(UUID_RX))
        .then(
            pl.format(
                "GPU UUID '{}' is not a UUID (letters, digits and '-')", uuid.str.slice(0, 80)
            )
        )
    )


def conform(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Select `schema`'s columns in order and types, adding missing ones as nulls. A frame that
    has them already comes back as it is; any other is built column by column, without a
    query (a landing file's series table: 0.04 ms instead of 0.36; a million rows: the same)."""
    have = df.schema
    if list(have) == list(schema) and all(
        have[c] == (t() if isinstance(t, type) else t) for c, t in schema.items()
    ):
        return df
    n = df.height
    return pl.DataFrame(
        [
            df.get_column(c).cast(t) if c in have else pl.Series(c, [None], t).new_from_index(0, n)
            for c, t in schema.items()
        ]
    )


def conform_lazy(lf: pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Lazy `conform`: `schema`'s columns in order and types; missing ones as nulls."""
    have = lf.collect_schema().names()
    return lf.select(
        [(pl.col(c) if c in have else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )


def collect_stable(lf: pl.LazyFrame) -> pl.DataFrame:
    """Collect with a fixed summation order, so re-runs write the same bytes.

    Polars 2's default streaming engine merges partial float sums in whatever order its threads
    finish, which changes means in the last bit from run to run; the in-memory engine sums each
    group in row order.
    """
    return lf.collect(engine="in-memory")


# queries over many landing files' cached parses read this many at a time: one query over a
# 10,000-GPU day's 1,668 files read every file side by side (the day's quarantine held ~250 MiB
# for an empty result, the ingest step's peak: benchmarks/README.md, issue 34); 64, a few MiB
FILES_AT_ONCE = 64


def in_batches(frames: list[pl.LazyFrame], at_once: int = FILES_AT_ONCE) -> pl.DataFrame:
    """`frames` concatenated (diagonally, types relaxed) and collected (`collect_stable`)
    `at_once` at a time: the same rows in the same order as one query, without every source
    open at once."""
    parts = [
        collect_stable(pl.concat(frames[i : i + at_once], how="diagonal_relaxed"))
        for i in range(0, len(frames), at_once)
    ]
    return parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal_relaxed")


def collect_all_stable(lfs: list[pl.LazyFrame]) -> list[pl.DataFrame]:
    """`collect_stable` of several queries in one call (they run side by side)."""
    return pl.collect_all(lfs, engine="in-memory")
