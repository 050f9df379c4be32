"""A day's `ingest_log`: one row per landing file with anything on the day, its records read,
accepted, duplicated and quarantined (`rows_read` counted by the parser, the rest by the
assembly: `row_conservation` compares the two). A record is a line of a text format, a row of a
CSV, a point of JSON, a GPU of an XML snapshot."""

from __future__ import annotations

from datetime import date

import polars as pl

from gpu_pipeline.lib.ingest.cache import META_SCHEMA, ParsedFile
from gpu_pipeline.lib.samples import LONG_SCHEMA, conform
from gpu_pipeline.lib.schemas import INGEST_LOG_SCHEMA


def ingest_log(
    files: list[ParsedFile], day: date, counts: list[pl.DataFrame], quarantine: pl.DataFrame
) -> pl.DataFrame:
    """One row per landing file that has anything on the day: what was read (counted by the
    parser), accepted and duplicated (`counts`, per chunk of the assembly) and quarantined."""
    chunk_counts = counts
    metas = [
        {
            "source_file": pf.file.source_file,
            "file_order": order,
            "format": pf.format,
            "time_basis": pf.time_basis,
            "sha256": pf.file.sha256,
            "file_bytes": pf.file.size,
            "file_lines": pf.lines_total,
            "lines_skipped": pf.lines_skipped if pf.home_day == day else 0,
            "home": pf.home_day == day,
            # counted by the parser from what it read, before anything was decided
            "rows_read": pf.records_on(day),
            "origin": pf.origin,
            "columns_ignored": pf.columns_ignored,
            "fields": pf.fields,
            "skip_reason": pf.skip_reason,
        }
        for order, pf in enumerate(files)
    ]
    counts_schema = {
        "source_file": pl.String,
        "rows_accepted": pl.UInt32,
        "rows_duplicate": pl.UInt32,
        "first_sample": LONG_SCHEMA["timestamp"],
        "last_sample": LONG_SCHEMA["timestamp"],
    }
    counts = (
        pl.concat([conform(c, counts_schema) for c in chunk_counts])
        .group_by("source_file")
        .agg(
            pl.col("rows_accepted", "rows_duplicate").sum(),
            pl.col("first_sample").min(),
            pl.col("last_sample").max(),
        )
        if chunk_counts
        else pl.DataFrame(schema=counts_schema)
    )
    # a record quarantined whole may have a row per rejected value (a CSV row): records are
    # its distinct lines; a value rejected from a kept record is not a quarantined record
    qcounts = (
        quarantine.filter(~pl.col("record_kept").fill_null(False))
        .group_by("source_file")
        .agg(pl.col("line").n_unique().alias("rows_quarantined"))
    )
    log = (
        pl.DataFrame(metas, schema=META_SCHEMA)
        .join(counts, on="source_file", how="left")
        .join(qcounts, on="source_file", how="left")
        .with_columns(
            pl.col("rows_accepted", "rows_duplicate", "rows_quarantined")
            .fill_null(0)
            .cast(pl.Int64)
        )
        .filter(
            pl.col("home")
            | (pl.col("rows_read") > 0)
            | (pl.col("rows_accepted") + pl.col("rows_duplicate") + pl.col("rows_quarantined") > 0)
        )
        .with_columns(pl.lit(day).alias("date"))
        .sort("file_order")
    )
    return conform(log, INGEST_LOG_SCHEMA)


def rejected_elsewhere(files: list[ParsedFile], days: list[date]) -> list[tuple[str, str]]:
    """(file, the days it is filed on) of the files rejected whole that none of `days` holds."""
    run = set(days)
    out = []
    for pf in files:
        if not pf.rejected_whole:
            continue
        filed = pf.record_days()
        if not run & set(filed):
            where = ", ".join(str(d) for d in filed[:5]) + (" …" if len(filed) > 5 else "")
            out.append((pf.file.source_file, where))
    return out


def gone_from_landing(previous: pl.DataFrame, files: list) -> list[str]:
    """The files a day's previous `ingest_log` was made from that the landing zone no longer
    lists (hidden files, listed but never read, do not count)."""
    listed = {f.source_file for f in files}
    prev = previous.filter(pl.col("format") != "skipped").get_column("source_file")
    return sorted(set(prev.to_list()) - listed)
