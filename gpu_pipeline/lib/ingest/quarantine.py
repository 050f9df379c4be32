"""A day's `quarantine`: every rejected line or file, with its reason and original text."""

from __future__ import annotations

from datetime import date

import polars as pl

from gpu_pipeline.lib.ingest.cache import ParsedFile
from gpu_pipeline.lib.samples import (
    FILES_AT_ONCE,
    QUARANTINE_LINE_SCHEMA,
    conform,
    in_batches,
)
from gpu_pipeline.lib.schemas import QUARANTINE_SCHEMA


def _in_day(day: date) -> pl.Expr:
    return pl.col("timestamp").dt.date() == day


def quarantine(files: list[ParsedFile], day: date, conflicts: list[pl.DataFrame]) -> pl.DataFrame:
    """The day's quarantined rows of `files`: their rejected lines on the day, their timeless
    records on their home day, and the `conflicts` the assembly found (duplicates that disagree)."""
    quars = [
        pf.quarantine.filter(
            _in_day(day) | (pl.col("timestamp").is_null() & pl.lit(pf.home_day == day))
        ).with_columns(pl.lit(pf.file.source_file).alias("source_file"))
        for pf in files
    ] + [c.lazy() for c in conflicts]
    q = (
        in_batches(quars, FILES_AT_ONCE).sort("source_file", "line", nulls_last=False)
        if quars
        else pl.DataFrame(schema={**QUARANTINE_LINE_SCHEMA, "source_file": pl.String})
    )
    return conform(q.with_columns(pl.lit(day).alias("date")), QUARANTINE_SCHEMA)
