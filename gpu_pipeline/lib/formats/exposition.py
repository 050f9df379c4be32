"""dcgm-exporter / Prometheus text exposition (plain text, OpenMetrics timestamps too).

Every line is read once by one regex in Polars; label blocks repeat for every sample of a series,
so each distinct block is parsed once and joined back. No Python runs per line.
"""

from __future__ import annotations

import re

import polars as pl

from gpu_pipeline.lib.formats.common import (
    Context,
    metric_column,
    metric_scale,
    parsed,
    resolve_aliases,
)
from gpu_pipeline.lib.samples import ParsedLines

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABELS = r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}'
# name, optional {labels}, then the rest of the line (value and optional timestamp)
LINE_RX = rf"^({_NAME})[ \t]*({_LABELS})?[ \t]+(.*?)[ \t]*$"
VALUE_TS_RX = r"^(\S+)(?:[ \t]+(\S+))?$"
PAIR_RX = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"'
_HEAD = re.compile(r"^(# (HELP|TYPE) )?[a-zA-Z_:][a-zA-Z0-9_:]*(\{|\s)")


def detect(head: str, name: str) -> bool:
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()][:50]
    hits = sum(1 for ln in lines if _HEAD.match(ln))
    return (
        bool(lines)
        and hits >= max(1, len(lines) // 2)
        and any("DCGM" in ln.upper() for ln in lines)
    )


def _label_attrs(blocks: pl.Series) -> pl.DataFrame:
    """Distinct `{k="v",…}` blocks -> one row per block with the attribute columns."""
    pairs = (
        pl.DataFrame({"labels": blocks})
        .with_columns(pl.col("labels").str.extract_all(PAIR_RX).alias("pair"))
        .explode("pair")
        .with_columns(
            pl.col("pair").str.extract(r"^([^=\s]+)", 1).alias("k"),
            pl.col("pair")
            .str.extract(r'="(.*)"$', 1)
            .str.replace_all(r"\\\\", "\x00")
            .str.replace_all(r'\\"', '"')
            .str.replace_all(r"\\n", "\n")
            .str.replace_all("\x00", "\\", literal=True)
            .alias("v"),
        )
    )
    return resolve_aliases(pairs, "labels")


def parse(text: str, ctx: Context) -> ParsedLines:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    df = (
        pl.DataFrame({"raw": lines}, schema={"raw": pl.String})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("raw").str.strip_suffix("\r"))
    )
    trimmed = pl.col("raw").str.strip_chars()
    body = df.filter((trimmed != "") & ~trimmed.str.starts_with("#"))

    g = body.with_columns(pl.col("raw").str.extract_groups(LINE_RX).alias("g")).unnest("g")
    g = g.rename({"1": "metric", "2": "labels", "3": "rest"})
    vt = pl.col("rest").str.extract_groups(VALUE_TS_RX)
    g = g.with_columns(vt.struct.field("1").alias("value_s"), vt.struct.field("2").alias("ts_s"))
    ts_num = pl.col("ts_s").cast(pl.Float64, strict=False)
    # Prometheus text uses integer milliseconds, OpenMetrics float seconds
    ts_ms = (
        pl.when(pl.col("ts_s").str.contains(r"[.eE]") | (ts_num < 1e11))
        .then(ts_num * 1000.0)
        .otherwise(ts_num)
    )
    # a line that is not a sample at all takes no time from the file: it is accounted on the home day
    malformed = pl.col("metric").is_null() | (
        pl.col("value_s").is_null() & pl.col("labels").is_null()
    )
    file_ms = None if ctx.file_time is None else int(ctx.file_time.timestamp() * 1000)
    g = g.with_columns(
        pl.col("value_s").cast(pl.Float64, strict=False).alias("value"),
        metric_column(pl.col("metric")).alias("column"),
        metric_scale(pl.col("metric")).alias("scale"),
        pl.when(pl.col("ts_s").is_null() & ~malformed)
        .then(pl.lit(file_ms, pl.Float64))
        .otherwise(ts_ms)
        .round(0)
        .cast(pl.Int64, strict=False)
        .alias("ts_ms"),
    )
    g = g.with_columns(
        pl.when(malformed)
        .then(pl.lit("malformed exposition line: expected `name{labels} value [timestamp]`"))
        .when(pl.col("value_s").is_null())
        .then(pl.format("value is not a number: '{}'", pl.col("rest").str.slice(0, 80)))
        .when(pl.col("ts_s").is_not_null() & pl.col("ts_ms").is_null())
        .then(pl.format("timestamp is not a number: '{}'", pl.col("ts_s").str.slice(0, 40)))
        .alias("pre_reason")
    )
    attrs = _label_attrs(g.get_column("labels").drop_nulls().unique())
    g = g.join(attrs, on="labels", how="left")
    untimed = ctx.file_time is not None and g.filter(~malformed).get_column("ts_s").is_null().any()
    basis = ctx.file_time_basis if untimed else "sample"
    return parsed(g, lines_total=df.height, lines_skipped=df.height - body.height, time_basis=basis)
