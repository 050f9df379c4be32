"""What every parser shares: label aliases, units, sentinels, range checks, MIG, reasons.

A parser builds a frame with one row per candidate sample:
  line (Int64)      source line or record number
  raw (String)      the original text, kept for quarantine
  ts_ms (Int64)     sample time, epoch ms (null: none found)
  metric (String)   the source's name for the field (for messages)
  column (String)   canonical field column (null: not a field we model)
  scale (Float64)   factor from the source unit to the column's unit
  value_s (String)  the value as written; value (Float64) parsed, before scaling
  pre_reason        a format-specific reason to reject (null: none)
  + the attribute columns of `samples.ATTR_COLUMNS` (raw strings)
and `finalize` turns it into accepted samples and quarantined records with reasons.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import polars as pl

from gpu_pipeline.lib.fields import (
    BY_COLUMN,
    DEVICE_LEVEL_COLUMNS,
    FP64_BLANK_FROM,
    FP64_BLANK_TO,
    INT32_BLANK_FROM,
    INT32_BLANK_TO,
    INT64_BLANK_FROM,
    INT64_BLANK_TO,
    LABEL_ALIASES,
    METRIC_SCALE,
    METRIC_TO_COLUMN,
    WORKLOAD_COLUMNS,
)
from gpu_pipeline.lib.samples import (
    ATTR_COLUMNS,
    LONG_SCHEMA,
    QUARANTINE_LINE_SCHEMA,
    ParsedLines,
    attribute_reason,
    conform,
    normalize_attributes,
)

# "no value" spellings of nvidia-smi and friends
NA_VALUES = (
    "",
    "N/A",
    "[N/A]",
    "NaN",
    "nan",
    "-",
    "[Not Supported]",
    "Not Supported",
    "[Insufficient Permissions]",
    "[Requested functionality has been deprecated]",
    "[Function Not Found]",
    "[Unknown Error]",
    "[GPU is lost]",
    "[Not Found]",
)


# sample times outside [EARLIEST, now + FUTURE_TOLERANCE] are not plausible readings (a clock
# reset to 1970, a unit mistake, a typo) and are quarantined, never filed on a day of their own
EARLIEST_MS = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp() * 1000)
FUTURE_TOLERANCE_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Context:
    """What a parser may know besides the text: the file's name and the time written in it."""

    source_file: str
    file_time: datetime | None = None  # from the file name, else its modification time
    file_time_basis: str = "file_name"
    csv_timezone: str = "UTC"
    # the header line of a headerless CSV, from a `header.csv` beside it (None: there is none)
    csv_header: str | None = None
    earliest_ms: int = EARLIEST_MS
    latest_ms: int | None = None  # None: now + FUTURE_TOLERANCE_MS
    # a file parsed a piece at a time (over 64 MiB): its timestamps' unit and whether its
    # samples carry their own times, as its first piece decided them (`ParsedLines.times`),
    # so they are decided once for the file, not once a piece
    times: tuple | None = None
    # a CSV loop log without identity columns parsed a piece at a time: the loop the previous
    # piece ended in (`nvidia_smi.Loop`, `ParsedLines.loop`), for rows too few to show their own
    loop: tuple | None = None

    def time_window(self) -> tuple[int, int]:
        """[earliest, latest] plausible sample time, epoch ms."""
        latest = self.latest_ms
        if latest is None:
            latest = int(datetime.now(UTC).timestamp() * 1000) + FUTURE_TOLERANCE_MS
        return self.earliest_ms, latest


def is_blank_sentinel(v: pl.Expr) -> pl.Expr:
    """DCGM blank values (no reading) of the int32, fp64 (2^47) and int64 families, and NaN.

    Each family is a closed range: a value above the int64 blanks (1e30 W, +Inf) is an
    impossible reading, quarantined by the range checks, not a silent "no value".
    """
    return (
        v.is_between(INT32_BLANK_FROM, INT32_BLANK_TO)
        | v.is_between(FP64_BLANK_FROM, FP64_BLANK_TO)
        | v.is_between(INT64_BLANK_FROM, INT64_BLANK_TO)
        | v.is_nan()
    )


def metric_column(metric: pl.Expr) -> pl.Expr:
    return metric.str.to_lowercase().replace_strict(
        METRIC_TO_COLUMN, default=None, return_dtype=pl.String
    )


def metric_scale(metric: pl.Expr) -> pl.Expr:
    return metric.str.to_lowercase().replace_strict(
        METRIC_SCALE, default=1.0, return_dtype=pl.Float64
    )


def resolve_aliases(pairs: pl.DataFrame, key: str) -> pl.DataFrame:
    """(key, k, v) label pairs -> one row per key with the attribute columns (first alias wins;
    of one alias written twice, `UUID` and `uuid` say, the first written)."""
    aliases = [(a, n, p) for a, names in LABEL_ALIASES.items() for p, n in enumerate(names)]
    alias_df = pl.DataFrame(aliases, schema=["attr", "k", "prio"], orient="row")
    best = (
        pairs.with_columns(pl.col("k").str.to_lowercase())
        .filter(pl.col("v").is_not_null() & (pl.col("v") != ""))
        .join(alias_df, on="k", how="inner", maintain_order="left")
        .sort(key, "attr", "prio", maintain_order=True)
        .group_by(key, "attr", maintain_order=True)
        .agg(pl.col("v").first())
    )
    wide = best.pivot(on="attr", index=key, values="v", on_columns=list(LABEL_ALIASES))
    out = pairs.select(key).unique().join(wide, on=key, how="left")
    return out.with_columns(
        [pl.lit(None, pl.String).alias(a) for a in LABEL_ALIASES if a not in out.columns]
    )


def _exporter_self_labels(df: pl.DataFrame) -> pl.DataFrame:
    """Drop pod/namespace/container labels that name the dcgm-exporter pod itself.

    A Prometheus job that does not honour the exporter's labels stamps its own scrape target
    (the exporter pod) on every series; that is not the workload using the GPU.
    """
    own = pl.col("pod").str.contains("dcgm-exporter").fill_null(False) | pl.col(
        "container"
    ).str.contains("dcgm-exporter").fill_null(False)
    return df.with_columns(
        [
            pl.when(own).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("namespace", "pod", "container")  # not hpc_job: set by the exporter itself
        ]
    )


def mig_device_level(df: pl.DataFrame) -> pl.DataFrame:
    """Under MIG, device-level fields belong to the physical GPU, not to each instance.

    dcgm-exporter repeats power, temperature, energy, clocks… on every instance; re-keying them to
    the parent GPU (no instance) makes the repeats exact duplicates, counted once.
    """
    dev = (
        pl.col("column").is_in(list(DEVICE_LEVEL_COLUMNS)) & pl.col("gpu_instance_id").is_not_null()
    )
    return df.with_columns(
        [
            pl.when(dev).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("gpu_instance_id", "gpu_instance_profile", *WORKLOAD_COLUMNS)
        ]
    )


def mig_gpus(df: pl.DataFrame) -> list[str]:
    """The GPUs (UUIDs) whose device-level fields `df` gives on a MIG instance's label set, as
    dcgm-exporter does once per instance: the rows `mig_device_level` re-keys to the GPU (ask
    before it does). Kept with the parse (`ParsedLines.mig_gpus`, the cache's meta.json): once
    re-keyed, nothing in the samples says the repeats came from the instances, and a file that
    gives only such fields (its power, say) has no instance's sample to tell."""
    dev = (
        pl.col("column").is_in(list(DEVICE_LEVEL_COLUMNS)) & pl.col("gpu_instance_id").is_not_null()
    )
    uuids = df.lazy().filter(dev).select(pl.col("gpu_uuid").drop_nulls().unique())
    return sorted(uuids.collect().to_series().to_list())


def value_bounds() -> list[pl.Expr]:
    """`_lo`, `_hi`: the valid range of each row's column."""
    cols = list(BY_COLUMN)
    return [
        pl.col("column")
        .replace_strict(
            cols,
            pl.Series([getattr(BY_COLUMN[c], b) for c in cols], dtype=pl.Float64),
            default=None,
        )
        .alias(f"_{b}")
        for b in ("lo", "hi")
    ]


def out_of_range(value: pl.Expr, scaled: pl.Expr) -> pl.Expr:
    """A reading outside its field's valid range (`_lo`, `_hi`; `scaled`: the value in the
    field's unit) or infinite; a blank sentinel (no reading) is not."""
    return ~is_blank_sentinel(value) & (
        scaled.is_infinite()
        | (pl.col("_lo").is_not_null() & (scaled < pl.col("_lo")))
        | (pl.col("_hi").is_not_null() & (scaled > pl.col("_hi")))
    )


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:8]


NO_HOST_NAMES = {"localhost", "localhost.localdomain", "127.0.0.1", "::1", ""}


def fill_identity(df: pl.DataFrame, source_file: str) -> pl.DataFrame:
    """Samples without a GPU UUID take the UUID that their PCI bus id, else their index, has on
    the other samples of the frame within their host (the hostname they carry) or, without
    one, their file, when it has exactly one there (`_known_uuids`: a scrape line that lost
    its UUID label is the GPU it names, not a GPU of its own: adversarial review); else one
    made of the bus id, else the index, within that scope: `GPU-pci-<scope>-<bus id>`,
    `GPU-idx-<scope>-<index>`. Without any of the three the UUID stays null and the sample is
    rejected: a GPU is never made up from nothing, nor two merged."""
    uuid = df.get_column("gpu_uuid")
    if uuid.null_count() == 0:
        return df
    hosts = df.get_column("hostname").drop_nulls().unique().to_list()
    # a name every machine answers to names none: its GPUs are scoped by their file (two
    # machines logging `localhost` were merged: adversarial review)
    hosts = [h for h in hosts if h.strip().lower() not in NO_HOST_NAMES]
    file_tag = _tag(f"file\0{source_file}")
    scope = (
        pl.col("hostname")
        .replace_strict({h: _tag(f"host\0{h}") for h in hosts}, default=file_tag)
        .fill_null(file_tag)
        if hosts
        else pl.lit(file_tag)
    )
    bus = pl.col("pci_bus_id").str.to_lowercase().str.replace_all(r"[^0-9a-z]+", "-")
    made = (
        pl.when(pl.col("pci_bus_id").is_not_null())
        .then(pl.format("GPU-pci-{}-{}", scope, bus))
        .when(pl.col("gpu_index").is_not_null())
        .then(pl.format("GPU-idx-{}-{}", scope, pl.col("gpu_index")))
    )
    if uuid.null_count() < len(uuid):
        return df.with_columns(
            _known_uuids(df, source_file, made).fill_null(made).alias("gpu_uuid")
        )
    return df.with_columns(made.alias("gpu_uuid"))


# a frame whose source_file starts with this is not one file's (`exposition.learn_series`
# parses the series of many files in one table)
NOT_ONE_FILE = "\0"


def _identity_key() -> pl.Expr:
    """A sample's identity key without its UUID: its host (or none), then its bus id, else
    its index (null: neither)."""
    return pl.concat_str(
        pl.col("hostname").fill_null("\0"),
        pl.when(pl.col("pci_bus_id").is_not_null())
        .then(pl.lit("pci\0") + pl.col("pci_bus_id").str.to_lowercase())
        .otherwise(pl.lit("idx\0") + pl.col("gpu_index").cast(pl.String)),
        separator="\0",
    )


def _known_uuids(df: pl.DataFrame, source_file: str, made: pl.Expr) -> pl.Expr:
    """Each sample's GPU by the UUID the frame's samples with a UUID give its identity key
    when they give exactly one; null otherwise. In a frame of many files' series
    (NOT_ONE_FILE) the samples of a key both with and without a UUID take their identity with
    the file's name added instead, so that the table of many files leaves them all to their
    own file's parse (whose frame is the file)."""
    key = _identity_key()
    pairs = (
        df.lazy()
        .filter(pl.col("gpu_uuid").is_not_null())
        .select(key.alias("k"), pl.col("gpu_uuid"))
        .drop_nulls()
        .unique()
        .group_by("k")
        .agg(pl.col("gpu_uuid").first(), pl.len().alias("n"))
        .collect()
    )
    ones = {
        k: u for k, u, n in zip(pairs["k"], pairs["gpu_uuid"], pairs["n"], strict=True) if n == 1
    }
    if source_file.startswith(NOT_ONE_FILE):
        lacking = df.lazy().filter(pl.col("gpu_uuid").is_null()).select(key.alias("k"))
        both = set(pairs["k"]) & set(lacking.collect()["k"].drop_nulls())
        mine = pl.lit(_tag(f"file\0{source_file}"))
        own = pl.format("{}-{}", pl.coalesce(pl.col("gpu_uuid"), made), mine)
        return pl.when(key.is_in(list(both))).then(own).otherwise(pl.col("gpu_uuid"))
    return pl.coalesce(pl.col("gpu_uuid"), key.replace_strict(ones, default=None))


def normalize_series(g: pl.DataFrame, source_file: str = "") -> pl.DataFrame:
    """Attribute clean-up and identity; run it on distinct series where a parser has them, else
    on every row. `_attr_reason` says why a series' labels cannot be kept (null: they can)."""
    g = fill_identity(normalize_attributes(g), source_file)
    return _exporter_self_labels(g).with_columns(
        pl.coalesce(
            pl.col("_attr_reason") if "_attr_reason" in g.columns else pl.lit(None, pl.String),
            attribute_reason(),
        ).alias("_attr_reason")
    )


def records_by_day(g: pl.DataFrame, lo: int, hi: int) -> dict:
    """Candidate records per UTC day of their time (None: no plausible time), from the input."""
    ts = pl.col("ts_ms")
    inside = ts.is_between(lo, hi)
    # most files hold one day: their first and last plausible times tell, no group-by needed
    first, last, n = g.select(
        ts.filter(inside).min().alias("first"),
        ts.filter(inside).max().alias("last"),
        inside.sum().alias("n"),
    ).row(0)
    if first is not None and first // 86_400_000 == last // 86_400_000:
        one = {date(1970, 1, 1) + timedelta(days=first // 86_400_000): n}
        return one | ({None: g.height - n} if g.height > n else {})
    # group on the integer day (cheap), name the few days found as dates afterwards
    day = pl.when(inside).then(ts.floordiv(86_400_000)).alias("d")
    counts = g.select(day).group_by("d").len()
    days = counts.get_column("d").cast(pl.Date).to_list()
    return dict(zip(days, counts.get_column("len").to_list(), strict=True))


def finalize(
    g: pl.DataFrame,
    normalized: bool = False,
    window: tuple[int, int] | None = None,
    source_file: str = "",
    multi: bool = False,
    raw: pl.Expr | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, dict, list[str]]:
    """Candidate rows -> (accepted long samples, quarantined values), every row in exactly one.

    A record is a `line`: one candidate for exposition and JSON, one per field for the wide
    formats (`multi`: a CSV row, a GPU of an XML snapshot). A rejected value of a record whose
    other values are accepted is quarantined with `record_kept` (the record counts as accepted);
    a record without an accepted value is quarantined whole (its rows `record_kept` false).

    Cheap boolean tests run on every row; reason strings are formatted for rejected rows only.
    `window`: the plausible sample times [earliest, latest] in epoch ms (default: 2000-01-01 to
    a day from now); a row outside it is quarantined with no time of its own, so it is accounted
    on its file's home day and never opens a day nobody runs. Also returns the records per day
    (`records_by_day`), counted before anything is decided, and the GPUs whose device-level
    fields the accepted rows give on a MIG instance's label set (`mig_gpus`). `raw`: how a
    rejected row's text is quoted, when the rows carry no `raw` column (made for the rejected
    rows only: a JSON answer's quote of every point cost ~7 % of its parse).
    """
    lo, hi = window or Context("").time_window()
    records = records_by_day(g.unique("line", keep="first") if multi else g, lo, hi)
    g = _judged(g, normalized, source_file, lo, hi)
    ts = (
        pl.when(pl.col("_implausible"))
        .then(None)
        .otherwise(pl.col("ts_ms"))
        .pipe(pl.from_epoch, time_unit="ms")
        .dt.replace_time_zone("UTC")
    )
    any_rejected = bool(g.get_column("_rejected").any())
    ok = g.filter(~pl.col("_rejected")) if any_rejected else g  # the usual file: no copy
    mig: list[str] = []
    if ok.get_column("gpu_instance_id").is_not_null().any():
        mig = mig_gpus(ok)
        ok = mig_device_level(ok)
    samples = ok.select(
        "line",
        ts.alias("timestamp"),
        "column",
        pl.when(is_blank_sentinel(pl.col("value")))
        .then(None)
        .otherwise(pl.col("scaled"))
        .alias("value"),
        *ATTR_COLUMNS,
    )
    bad = g.filter(pl.col("_rejected")) if any_rejected else g.clear()
    kept = (
        pl.col("line").is_in(ok.get_column("line").unique().implode())
        if multi and any_rejected
        else pl.lit(False)
    )
    quarantine = bad.select(
        "line",
        ts.alias("timestamp"),
        _rejection_reason(lo, hi).alias("reason"),
        pl.col("raw") if raw is None else raw.alias("raw"),
        pl.col("column").alias("field"),
        kept.alias("record_kept"),
    )
    quarantine = conform(quarantine, QUARANTINE_LINE_SCHEMA)
    return conform(samples, LONG_SCHEMA), quarantine, records, mig


def _judged(g: pl.DataFrame, normalized: bool, source_file: str, lo: int, hi: int) -> pl.DataFrame:
    """The candidate rows with their series normalized (unless `normalized`), the value in its
    field's unit (`scaled`), and the cheap boolean tests: `_implausible` (a time outside
    [lo, hi]) and `_rejected` (any reason to quarantine the row)."""
    if not normalized:
        g = normalize_series(g, source_file)
    if "_attr_reason" in g.columns:
        g = g.with_columns(pl.coalesce("pre_reason", "_attr_reason").alias("pre_reason"))
    if "_lo" not in g.columns:  # parsers with distinct series attach the bounds per series
        g = g.with_columns(value_bounds())
    g = g.with_columns((pl.col("value") * pl.col("scale")).alias("scaled"))
    bad_range = out_of_range(pl.col("value"), pl.col("scaled"))
    implausible = pl.col("ts_ms").is_not_null() & ~pl.col("ts_ms").is_between(lo, hi)
    g = g.with_columns(implausible.alias("_implausible"))
    rejected = (
        pl.col("pre_reason").is_not_null()
        | pl.col("value").is_null()
        | pl.col("column").is_null()
        | pl.col("ts_ms").is_null()
        | pl.col("_implausible")
        | pl.col("gpu_uuid").is_null()
        | bad_range
    )
    return g.with_columns(rejected.alias("_rejected"))


def _rejection_reason(lo: int, hi: int) -> pl.Expr:
    """Why a rejected row is quarantined: the first of its reasons, worded (`lo`, `hi`: the
    plausible window, epoch ms)."""
    return (
        pl.when(pl.col("pre_reason").is_not_null())
        .then(pl.col("pre_reason"))
        .when(pl.col("value").is_null())
        .then(pl.format("value is not a number: '{}'", pl.col("value_s").str.slice(0, 80)))
        .when(pl.col("column").is_null())
        .then(
            pl.format(
                "unknown metric '{}': not a telemetry field gpu_pipeline models", pl.col("metric")
            )
        )
        .when(pl.col("ts_ms").is_null())
        .then(pl.lit("no timestamp: neither the sample nor the file name carries one"))
        .when(pl.col("_implausible"))
        .then(
            # the bounds worded, not printed: the latest is a day after the parse, and a reason
            # that named its minute made a day parsed again another quarantine (adversarial
            # review: "re-materializing a partition gives the same contents")
            pl.format(
                "implausible sample time {} ms since 1970: {} (a clock reset, or timestamps in "
                "another unit than the format's)",
                pl.col("ts_ms"),
                pl.when(pl.col("ts_ms") < lo)
                .then(pl.lit(f"before {_iso(lo)}"))
                .otherwise(pl.lit("more than a day after the file was read")),
            )
        )
        .when(pl.col("gpu_uuid").is_null())
        .then(
            pl.lit(
                "no GPU identity: no UUID, PCI bus id or GPU index (label UUID / pci_bus_id / gpu, "
                "or column uuid / pci.bus_id / index)"
            )
        )
        .otherwise(
            pl.format(
                "impossible value {} for {} (valid {}..{})",
                pl.coalesce("value_s", pl.col("value").cast(pl.String)),
                pl.col("column"),
                pl.col("_lo").cast(pl.String).fill_null("-inf"),
                pl.col("_hi").cast(pl.String).fill_null("inf"),
            )
        )
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def candidates(df: pl.DataFrame) -> pl.DataFrame:
    """Fill the optional candidate columns a parser did not set."""
    defaults = {
        "pre_reason": pl.lit(None, pl.String),
        "scale": pl.lit(1.0),
        "value_s": pl.col("value").cast(pl.String)
        if "value" in df.columns
        else pl.lit(None, pl.String),
        "metric": pl.col("column") if "column" in df.columns else pl.lit(None, pl.String),
        **{a: pl.lit(None, pl.String) for a in ATTR_COLUMNS},
    }
    return df.with_columns([e.alias(c) for c, e in defaults.items() if c not in df.columns])


def parsed(
    g: pl.DataFrame,
    lines_total: int,
    lines_skipped: int,
    time_basis: str = "sample",
    normalized: bool = False,
    window: tuple[int, int] | None = None,
    source_file: str = "",
    multi: bool = False,
    raw: pl.Expr | None = None,
) -> ParsedLines:
    samples, quarantine, records, mig = finalize(
        candidates(g), normalized, window, source_file, multi, raw
    )
    return ParsedLines(
        samples, quarantine, lines_total, lines_skipped, time_basis, records, mig_gpus=mig
    )
