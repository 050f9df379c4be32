"""Comma-separated, one row per GPU per time, one column per field: shared by the CSV formats.

Rows are split in Polars (no Python per row); a row with the wrong number of cells is rejected
whole. Each format says which columns are fields (and their unit factor), how to read the time,
and which columns carry identity.
"""

from __future__ import annotations

import csv

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import NA_VALUES

# a number, optionally followed by a unit ("433.78 W", "0 %", "132 MiB", "1410 MHz")
NUMBER_RX = r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?:[A-Za-z%/]+)?\s*$"


def split_rows(text: str, header_index: int) -> tuple[list[str], pl.DataFrame, int, int]:
    """(header cells, body rows with `line`, `raw`, `cells`, lines_total, lines_skipped)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    df = (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("raw").str.strip_suffix("\r"))
    )
    header = _csv_cells(df["raw"][header_index])
    body = df.slice(header_index + 1).filter(pl.col("raw").str.strip_chars() != "")
    body = body.with_columns(pl.col("raw").str.split(",").alias("cells"))
    quoted = body.get_column("raw").str.contains('"', literal=True)
    if bool(quoted.any()):  # valid CSV quoting ("NVIDIA A100, 40GB"): these rows the slow way
        cells = [
            _csv_cells(raw) if q else c
            for raw, q, c in zip(body["raw"], quoted, body["cells"].to_list(), strict=True)
        ]
        body = body.with_columns(pl.Series("cells", cells, dtype=pl.List(pl.String)))
    return header, body, df.height, df.height - body.height


def _csv_cells(line: str) -> list[str]:
    """One CSV line's cells, quotes honoured (a quoted cell may hold commas)."""
    if '"' not in line:
        return line.split(",")
    try:
        return next(csv.reader([line], skipinitialspace=True), [])
    except csv.Error:  # a stray quote or a bare CR inside: the cells as written (the row's
        return line.split(",")  # values then fail their own checks and are quarantined)


def cell(i: int) -> pl.Expr:
    return pl.col("cells").list.get(i, null_on_oob=True).str.strip_chars()


def numeric(e: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(value, value_s): N/A spellings become NaN (a "no value" that is accepted as null)."""
    na = e.is_in(list(NA_VALUES)) | e.is_null()
    num = e.str.extract(NUMBER_RX, 1).cast(pl.Float64, strict=False)
    return pl.when(na).then(float("nan")).otherwise(num), e


def to_long(
    body: pl.DataFrame,
    n_cells: int,
    fields: dict[str, tuple[int | list[int], float]],
    ts_ms: pl.Expr,
    attrs: dict[str, pl.Expr],
    row_reason: pl.Expr | None = None,
    metric_names: dict[str, str] | None = None,
) -> pl.DataFrame:
    """Unpivot the field columns: one candidate sample per row and field.

    `fields` maps a canonical column to its cell index (or indexes, first non-empty wins) and unit
    factor. `row_reason` rejects a whole row (every sample of it) with a reason.
    """
    wrong = pl.col("cells").list.len() != n_cells
    reason = pl.when(wrong).then(
        pl.format(
            f"expected {n_cells} comma-separated fields, found {{}}", pl.col("cells").list.len()
        )
    )
    if row_reason is not None:
        reason = reason.when(row_reason.is_not_null()).then(row_reason)
    base = body.with_columns(
        ts_ms.alias("ts_ms"),
        reason.otherwise(None).alias("pre_reason"),
        # an attribute written `[N/A]` is absent: a uuid column of `[N/A]` made every row's GPU
        # `GPU-[n/a]`, quarantined, though its pci.bus_id told it (adversarial review)
        *[
            pl.when(e.is_in(list(NA_VALUES))).then(None).otherwise(e).alias(a)
            for a, e in attrs.items()
        ],
    )
    # a row rejected as a whole is one record (one quarantine row), not one per field
    whole = base.filter(pl.col("pre_reason").is_not_null())
    if whole.height:
        base = base.filter(pl.col("pre_reason").is_null())
    frames = []
    for column, (idx, scale) in fields.items():
        idxs = idx if isinstance(idx, list) else [idx]
        first = pl.coalesce(
            [pl.when(~cell(i).is_in(list(NA_VALUES))).then(cell(i)) for i in idxs] + [cell(idxs[0])]
        )
        value, value_s = numeric(first)
        frames.append(
            base.with_columns(
                pl.lit(column).alias("column"),
                pl.lit((metric_names or {}).get(column, column)).alias("metric"),
                pl.lit(scale).alias("scale"),
                value.alias("value"),
                value_s.alias("value_s"),
            ).drop("cells")
        )
    no_field = "no telemetry field recognized in the header: row not read"
    if not frames:
        # a header naming no field gpu_pipeline reads: each row is one quarantine record
        whole = pl.concat([whole, base], how="vertical")
        frames = []
    if whole.height:
        frames.append(
            whole.drop("cells").with_columns(
                pl.coalesce("pre_reason", pl.lit(no_field)).alias("pre_reason"),
                pl.lit(None, pl.String).alias("column"),
                pl.lit(None, pl.String).alias("metric"),
                pl.lit(1.0).alias("scale"),
                pl.lit(None, pl.Float64).alias("value"),
                pl.lit(None, pl.String).alias("value_s"),
            )
        )
    if not frames:
        return (
            base.drop("cells")
            .with_columns(pl.lit(None, pl.String).alias(c) for c in ("column", "metric", "value_s"))
            .with_columns(pl.lit(1.0).alias("scale"), pl.lit(None, pl.Float64).alias("value"))
        )
    return pl.concat(frames, how="diagonal_relaxed").sort("line", maintain_order=True)


def epoch_ms(col: pl.Expr) -> pl.Expr:
    """An epoch number as text -> epoch ms, its unit told by its size (as `date +%s` or a
    logger writes it): seconds (below 1e11), milliseconds, microseconds (from 1e14), nanoseconds
    (from 1e17), with or without decimals; null when the text is not a number."""
    num = col.str.strip_chars().cast(pl.Float64, strict=False)
    scaled = (
        pl.when(num < 1e11)
        .then(num * 1000.0)
        .when(num < 1e14)
        .then(num)
        .when(num < 1e17)
        .then(num / 1e3)
        .otherwise(num / 1e6)
    )
    return pl.when(num.is_finite()).then(scaled.round(0)).cast(pl.Int64, strict=False)


# ISO-8601 times that name their zone, once it is written `+hh:mm` (`zoned_ms`)
ZONED_FORMATS = [f"%Y{s}%m{s}%d{t}%H:%M:%S{f}%:z" for s in "-/" for t in "T " for f in ("%.f", "")]
# how a time that names its zone ends (`names_zone`)
ZONE_AT_END = r"(?:Z| UTC|[+-]\d{2}:?\d{2})\s*$"


def names_zone(rows: pl.DataFrame, col: pl.Expr) -> bool:
    """Whether some time of `col` in `rows` names its zone: only then is `zoned_ms` worth
    computing (its parses were three quarters of a time column's; this look, 2 %)."""
    return bool(rows.select(col.str.contains(ZONE_AT_END).any()).item())


def zoned_ms(col: pl.Expr) -> pl.Expr:
    """A time that names its zone -> epoch ms, that instant whatever the CSV zone: `Z`, ` UTC`,
    `+01:00` or `-0500` after it (null for any other text). Such times were refused as not
    understood, or a `Z` read in the CSV zone (adversarial review)."""
    text = (
        col.str.strip_chars()
        .str.replace(r"(Z| UTC)$", "+00:00")
        .str.replace(r"([+-]\d{2})(\d{2})$", "$1:$2")
    )
    parsed = pl.coalesce(
        [text.str.to_datetime(f, strict=False, time_unit="ms") for f in ZONED_FORMATS]
    )
    return parsed.dt.epoch("ms")


HOUR_MS = 3_600_000


def _folded(parsed: pl.Expr, tz: str) -> pl.Expr:
    """`_in_zone` over a column that is already computed (it is read eight times here)."""
    early = parsed.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null").dt.epoch(
        "ms"
    )
    late = parsed.dt.replace_time_zone(tz, ambiguous="latest", non_existent="null").dt.epoch("ms")
    repeated = early != late
    naive = parsed.dt.epoch("ms")
    back = naive.forward_fill().shift(1) - naive  # how far the clock went back since the row before
    fold = (repeated & back.is_between(HOUR_MS // 2, HOUR_MS + 60_000)).fill_null(False)
    folds = fold.cast(pl.UInt32).cum_sum()  # the folds up to each row
    # the folds before the last jump back of more than an hour (0 before any)
    before = (
        pl.when((back > HOUR_MS + 60_000).fill_null(False))
        .then(folds - fold.cast(pl.UInt32))
        .forward_fill()
        .fill_null(0)
    )
    return pl.when(repeated & (folds > before)).then(late).otherwise(early)


def _in_zone(parsed: pl.Expr, tz: str) -> pl.Expr:
    """Zone-less times (a file's, in its row order) in `tz` -> epoch ms. A time the change from
    summer time repeats (02:00-02:59 twice in Europe) is its first instant until the file's
    clock goes back by up to an hour onto it, its second after (a log written in order: its
    second hour was read as the first, and quarantined as a conflicting duplicate; adversarial
    review). A jump back of more than an hour (a file sorted by GPU, the next GPU's rows)
    starts afresh. The times are parsed once, then worked on as a column (`_folded`): an
    expression reading them eight times parsed them eight times, 9x the time."""
    if tz == "UTC":
        return parsed.dt.replace_time_zone(tz).dt.epoch("ms")
    return parsed.map_batches(
        lambda s: pl.select(_folded(pl.lit(s), tz)).to_series(), return_dtype=pl.Int64
    )


def parse_local_time(col: pl.Expr, formats: list[str], tz: str, zoned: bool = False) -> pl.Expr:
    """Timestamp text -> epoch ms (null when no format fits): an epoch number, else (with
    `zoned`: some time names its zone, `names_zone`) a time that names its zone (`zoned_ms`),
    else a zone-less time in `tz` in one of `formats` (`_in_zone`)."""
    parsed = pl.coalesce([col.str.to_datetime(f, strict=False, time_unit="ms") for f in formats])
    return pl.coalesce(epoch_ms(col), *([zoned_ms(col)] if zoned else []), _in_zone(parsed, tz))
