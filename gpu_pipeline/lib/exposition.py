"""dcgm-exporter / Prometheus text exposition -> long samples + quarantined lines, vectorized.

Every line is read once by one regex in Polars; label blocks repeat for every sample of a series,
so each distinct block is parsed once and joined back. No Python runs per line.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from gpu_pipeline.lib.fields import (
    BY_COLUMN,
    FP64_BLANK_FROM,
    FP64_BLANK_TO,
    INT32_BLANK_FROM,
    INT32_BLANK_TO,
    INT64_BLANK_FROM,
    LABEL_ALIASES,
    METRIC_TO_COLUMN,
)
from gpu_pipeline.lib.samples import ATTR_COLUMNS, ParsedLines, normalize_attributes

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABELS = r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}'
# name, optional {labels}, then the rest of the line (value and optional timestamp)
LINE_RX = rf"^({_NAME})[ \t]*({_LABELS})?[ \t]+(.*?)[ \t]*$"
VALUE_TS_RX = r"^(\S+)(?:[ \t]+(\S+))?$"
PAIR_RX = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"'


def is_blank_sentinel(v: pl.Expr) -> pl.Expr:
    """DCGM blank values (no reading) of the int32, fp64 (2^47) and int64 families."""
    return (
        v.is_between(INT32_BLANK_FROM, INT32_BLANK_TO)
        | v.is_between(FP64_BLANK_FROM, FP64_BLANK_TO)
        | (v >= INT64_BLANK_FROM)
        | v.is_nan()
    )


def _parse_label_blocks(blocks: pl.Series) -> pl.DataFrame:
    """Distinct `{k="v",…}` blocks -> one row per block with the attribute columns."""
    aliases = [
        (attr, name, prio)
        for attr, names in LABEL_ALIASES.items()
        for prio, name in enumerate(names)
    ]
    alias_df = pl.DataFrame(aliases, schema=["attr", "k", "prio"], orient="row")
    pairs = (
        pl.DataFrame({"labels": blocks})
        .with_columns(pl.col("labels").str.extract_all(PAIR_RX).alias("pair"))
        .explode("pair")
        .drop_nulls("pair")
        .with_columns(
            pl.col("pair").str.extract(r"^([^=\s]+)", 1).str.to_lowercase().alias("k"),
            pl.col("pair")
            .str.extract(r'="(.*)"$', 1)
            .str.replace_all(r"\\\\", "\x00")
            .str.replace_all(r'\\"', '"')
            .str.replace_all(r"\\n", "\n")
            .str.replace_all("\x00", "\\", literal=True)
            .alias("v"),
        )
        .filter(pl.col("v") != "")
        .join(alias_df, on="k", how="inner")
        .sort("labels", "attr", "prio")
        .group_by("labels", "attr", maintain_order=True)
        .agg(pl.col("v").first())
    )
    wide = pairs.pivot(on="attr", index="labels", values="v", on_columns=list(LABEL_ALIASES))
    out = pl.DataFrame({"labels": blocks}).join(wide, on="labels", how="left")
    for attr in LABEL_ALIASES:
        if attr not in out.columns:
            out = out.with_columns(pl.lit(None, pl.String).alias(attr))
    return out


def parse_exposition(text: str, file_time: datetime | None = None) -> ParsedLines:
    """Parse exposition text. `file_time` stamps samples that carry no timestamp of their own."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    df = (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("raw").str.strip_suffix("\r"))
    )
    trimmed = pl.col("raw").str.strip_chars()
    skip = (trimmed == "") | trimmed.str.starts_with("#")
    body = df.filter(~skip)
    lines_skipped = df.height - body.height

    g = body.with_columns(pl.col("raw").str.extract_groups(LINE_RX).alias("g")).unnest("g")
    g = g.rename({"1": "metric", "2": "labels", "3": "rest"})
    vt = pl.col("rest").str.extract_groups(VALUE_TS_RX)
    g = g.with_columns(vt.struct.field("1").alias("value_s"), vt.struct.field("2").alias("ts_s"))
    value = pl.col("value_s").cast(pl.Float64, strict=False)
    ts_num = pl.col("ts_s").cast(pl.Float64, strict=False)
    column = (
        pl.col("metric")
        .str.to_lowercase()
        .replace_strict(METRIC_TO_COLUMN, default=None, return_dtype=pl.String)
    )
    g = g.with_columns(value.alias("value"), ts_num.alias("ts_num"), column.alias("column"))

    # Prometheus text uses integer milliseconds, OpenMetrics float seconds.
    ts_ms = (
        pl.when(pl.col("ts_s").str.contains(r"[.eE]") | (pl.col("ts_num") < 1e11))
        .then(pl.col("ts_num") * 1000.0)
        .otherwise(pl.col("ts_num"))
    )
    file_ms = None if file_time is None else int(file_time.timestamp() * 1000)
    g = g.with_columns(
        pl.when(pl.col("ts_s").is_null())
        .then(pl.lit(file_ms, pl.Float64))
        .otherwise(ts_ms)
        .round(0)
        .cast(pl.Int64, strict=False)
        .alias("ts_ms")
    )

    blocks = g.get_column("labels").drop_nulls().unique()
    attrs = normalize_attributes(_parse_label_blocks(blocks))
    g = g.join(attrs, on="labels", how="left")

    cols = list(BY_COLUMN)
    rng_lo = pl.col("column").replace_strict(
        cols, pl.Series([BY_COLUMN[c].lo for c in cols], dtype=pl.Float64), default=None
    )
    rng_hi = pl.col("column").replace_strict(
        cols, pl.Series([BY_COLUMN[c].hi for c in cols], dtype=pl.Float64), default=None
    )
    sentinel = is_blank_sentinel(pl.col("value"))
    out_of_range = ~sentinel & (
        (rng_lo.is_not_null() & (pl.col("value") < rng_lo))
        | (rng_hi.is_not_null() & (pl.col("value") > rng_hi))
    )
    reason = (
        pl.when(
            pl.col("metric").is_null() | (pl.col("value_s").is_null() & pl.col("labels").is_null())
        )
        .then(pl.lit("malformed exposition line: expected `name{labels} value [timestamp]`"))
        .when(pl.col("value_s").is_null())
        .then(pl.format("value is not a number: '{}'", pl.col("rest").str.slice(0, 80)))
        .when(pl.col("value").is_null())
        .then(pl.format("value is not a number: '{}'", pl.col("value_s").str.slice(0, 80)))
        .when(pl.col("ts_s").is_not_null() & pl.col("ts_ms").is_null())
        .then(pl.format("timestamp is not a number: '{}'", pl.col("ts_s").str.slice(0, 40)))
        .when(pl.col("column").is_null())
        .then(
            pl.format(
                "unknown metric '{}': not a telemetry field gpu_pipeline models", pl.col("metric")
            )
        )
        .when(pl.col("ts_ms").is_null())
        .then(pl.lit("no timestamp: neither the sample nor the file name carries one"))
        .when(pl.col("gpu_uuid").is_null())
        .then(pl.lit("no GPU UUID label (UUID/uuid)"))
        .when(out_of_range)
        .then(
            pl.format(
                "impossible value {} for {} (valid {}..{})",
                pl.col("value_s"),
                pl.col("column"),
                rng_lo.cast(pl.String).fill_null("-inf"),
                rng_hi.cast(pl.String).fill_null("inf"),
            )
        )
        .otherwise(None)
        .alias("reason")
    )
    g = g.with_columns(reason)

    samples = g.filter(pl.col("reason").is_null()).select(
        "line",
        pl.from_epoch("ts_ms", time_unit="ms").dt.replace_time_zone("UTC").alias("timestamp"),
        "column",
        pl.when(sentinel).then(None).otherwise(pl.col("value")).alias("value"),
        *ATTR_COLUMNS,
    )
    bad = g.filter(pl.col("reason").is_not_null())
    quarantine = bad.select(
        "line",
        pl.when(pl.col("ts_ms").is_not_null())
        .then(pl.from_epoch("ts_ms", time_unit="ms").dt.replace_time_zone("UTC"))
        .alias("timestamp"),
        "reason",
        "raw",
    )
    return ParsedLines(
        samples=samples, quarantine=quarantine, lines_total=df.height, lines_skipped=lines_skipped
    )
