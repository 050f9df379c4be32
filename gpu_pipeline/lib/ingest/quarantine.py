"""A day's `quarantine`: every rejected line or file, with its reason and original text."""

from __future__ import annotations

from datetime import date

import polars as pl

from gpu_pipeline.lib.ingest.cache import ParsedFile
from gpu_pipeline.lib.samples import QUARANTINE_LINE_SCHEMA, collect_stable, conform
from gpu_pipeline.lib.schemas import QUARANTINE_SCHEMA


def _in_day(day: date) -> pl.Expr:
    return pl.col("timestamp").dt.date() == day


# files' quarantines read at once: one query over all of a 10,000-GPU day's 1,668 files read
# every file side by side and held ~250 MiB for an empty result, the ingest step's peak
# (benchmarks/README.md, issue 34); 64 at a time, a few MiB
FILES_AT_ONCE = 64


def in_batches(frames: list[pl.LazyFrame], at_once: int = FILES_AT_ONCE) -> pl.DataFrame:
    """`frames` concatenated (diagonally, types relaxed) and collected `at_once` at a time: the
    same rows in the same order as one query, without every source open at once."""
    parts = [
        collect_stable(pl.concat(frames[i : i + at_once], how="diagonal_relaxed"))
        for i in range(0, len(frames), at_once)
    ]
    return parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal_relaxed")


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
