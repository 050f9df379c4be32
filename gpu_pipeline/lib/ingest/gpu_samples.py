"""Parsed landing files -> a UTC day's `gpu_samples` (and, through `quarantine.py` and
`ingest_log.py`, the day's other raw tables).

Duplicates (same GPU, instance, field and timestamp; first file in path order wins) are counted,
the long samples are pivoted to one row per GPU per timestamp, and every line of every file is
accounted for."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.fields import FIELD_COLUMNS
from gpu_pipeline.lib.ingest.cache import ParsedFile
from gpu_pipeline.lib.ingest.ingest_log import ingest_log as day_ingest_log
from gpu_pipeline.lib.ingest.landing import DEFAULT_CLUSTER
from gpu_pipeline.lib.ingest.quarantine import quarantine as day_quarantine
from gpu_pipeline.lib.samples import (
    ATTR_COLUMNS,
    SAMPLE_ORDER,
    collect_stable,
    conform,
)
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA

KEY = ("gpu_uuid", "gpu_instance_id", "timestamp")


@dataclass
class DayIngest:
    gpu_samples: pl.DataFrame
    quarantine: pl.DataFrame
    ingest_log: pl.DataFrame


def _in_day(day: date) -> pl.Expr:
    return pl.col("timestamp").dt.date() == day


def _day_rows(pf: ParsedFile, order: int, day: date) -> pl.LazyFrame:
    """A file's samples of `day`, with the file they came from and its cluster."""
    return pf.samples.filter(_in_day(day)).with_columns(
        pl.lit(pf.file.source_file).alias("source_file"),
        pl.lit(order).alias("file_order"),
        pl.col("cluster").fill_null(pf.file.dir_cluster or DEFAULT_CLUSTER),
    )


SAMPLE_KEY = ("gpu_uuid", "gpu_instance_id", "column", "timestamp")


class DayAssembly:
    """Dedupe, pivot and account one UTC day of the parsed landing files, a range of GPUs at a
    time: `gpu_samples()` yields the day's wide samples in SAMPLE_ORDER, chunk after chunk, then
    `quarantine()` and `ingest_log()` account for every row.

    A sample's duplicates and conflicts are always samples of the same GPU, so a chunk holds
    everything its GPUs need. A day whose samples exceed `max_rows` long rows (the memory budget
    of the chunk size, `Chunking.rows`) is first split by GPU range into spill files (each landing
    file read once), then assembled chunk by chunk; a smaller day is assembled in memory at once.
    """

    def __init__(self, files: list[ParsedFile], day: date, max_rows: int | None = None):
        from gpu_pipeline.lib.staging.chunked import Chunking

        self.files, self.day = files, day
        self.max_rows = max_rows or Chunking().rows
        self._counts: list[pl.DataFrame] = []
        self._conflicts: list[pl.DataFrame] = []
        self.chunks = 0

    def gpu_samples(self) -> Iterator[pl.DataFrame]:
        parts = [(order, pf) for order, pf in enumerate(self.files) if self.day in pf.days]
        if not parts:
            self.chunks = 1
            yield conform(pl.DataFrame(schema=GPU_SAMPLES_SCHEMA), GPU_SAMPLES_SCHEMA)
            return
        day = self.day
        sizes = collect_stable(
            pl.concat([_day_rows(pf, o, day).select("gpu_uuid") for o, pf in parts])
            .group_by("gpu_uuid")
            .agg(pl.len().alias("n"))
            .sort("gpu_uuid", nulls_last=False)
        )
        from gpu_pipeline.lib.staging.chunked import cut_by_size

        chunks = cut_by_size(sizes["gpu_uuid"].to_list(), sizes["n"].to_list(), None, self.max_rows)
        self.chunks = len(chunks)
        if len(chunks) <= 1:
            yield self._assemble(
                collect_stable(pl.concat([_day_rows(pf, o, day) for o, pf in parts]))
            )
            return
        where = pl.DataFrame(
            {
                "gpu_uuid": [u for c in chunks for u in c],
                "_chunk": [k for k, c in enumerate(chunks) for _ in c],
            },
            schema={"gpu_uuid": pl.String, "_chunk": pl.Int32},
        )
        with tempfile.TemporaryDirectory(prefix="gpu_pipeline_assemble_") as tmp:
            for order, pf in parts:  # each file read once, its rows sent to their GPU range
                rows = collect_stable(_day_rows(pf, order, day)).join(
                    where, on="gpu_uuid", how="left", nulls_equal=True
                )
                for (k,), part in rows.partition_by("_chunk", as_dict=True).items():
                    part.drop("_chunk").write_parquet(
                        Path(tmp) / f"{k:06d}_{order:08d}.parquet", compression="uncompressed"
                    )
            for k in range(len(chunks)):
                spilled = sorted(Path(tmp).glob(f"{k:06d}_*.parquet"))
                long = pl.concat([pl.read_parquet(f) for f in spilled])
                for f in spilled:
                    f.unlink()
                yield self._assemble(long)

    def _assemble(self, long: pl.DataFrame) -> pl.DataFrame:
        """One range of GPUs: duplicates and conflicts resolved, pivoted to wide samples."""
        long = long.sort("file_order", "line").with_columns(
            (~pl.struct(*SAMPLE_KEY).is_first_distinct()).alias("dup")
        )
        # the same sample again with another value: two exporters disagree. The first file in
        # path order wins; the other value is quarantined with both, not counted as a duplicate
        if bool(long.get_column("dup").any()):
            first = pl.struct(*SAMPLE_KEY)
            long = long.with_columns(
                pl.col("value").first().over(first).alias("_first_value"),
                pl.col("source_file").first().over(first).alias("_first_file"),
            ).with_columns(
                (pl.col("dup") & pl.col("value").ne_missing(pl.col("_first_value"))).alias(
                    "_conflict"
                )
            )
            conflicting = long.filter(pl.col("_conflict")).select(
                "source_file",
                "line",
                "timestamp",
                pl.format(
                    "conflicting duplicate: {} of {} at this time is {} here but {} in {} (kept)",
                    "column",
                    "gpu_uuid",
                    pl.col("value").cast(pl.String).fill_null("no value"),
                    pl.col("_first_value").cast(pl.String).fill_null("no value"),
                    "_first_file",
                ).alias("reason"),
                pl.format(
                    "{}={}", "column", pl.col("value").cast(pl.String).fill_null("null")
                ).alias("raw"),
            )
            if conflicting.height:
                self._conflicts.append(conflicting)
            long = long.filter(~pl.col("_conflict")).drop(
                "_first_value", "_first_file", "_conflict"
            )
        self._counts.append(
            long.group_by("source_file").agg(
                (~pl.col("dup")).sum().alias("rows_accepted"),
                pl.col("dup").sum().alias("rows_duplicate"),
                pl.col("timestamp").min().alias("first_sample"),
                pl.col("timestamp").max().alias("last_sample"),
            )
        )
        accepted = long.filter(~pl.col("dup"))
        del long
        wide = accepted.pivot(
            on="column",
            on_columns=list(FIELD_COLUMNS),
            index=list(KEY),
            values="value",
            aggregate_function="first",
        )
        attrs = [c for c in ATTR_COLUMNS if c not in KEY]
        ids = accepted.group_by(list(KEY)).agg(
            *[pl.col(c).drop_nulls().first() for c in attrs], pl.col("source_file").first()
        )
        gpu_samples = (
            ids.join(wide, on=list(KEY), how="left", nulls_equal=True)
            .with_columns(pl.lit(self.day).alias("date"))
            .sort(*SAMPLE_ORDER, nulls_last=False)
        )
        return conform(gpu_samples, GPU_SAMPLES_SCHEMA)

    def quarantine(self) -> pl.DataFrame:
        """The day's quarantined rows (after `gpu_samples()` is consumed: it adds conflicts)."""
        return day_quarantine(self.files, self.day, self._conflicts)

    def ingest_log(self, quarantine: pl.DataFrame) -> pl.DataFrame:
        """The day's ingest_log (after `gpu_samples()` is consumed: it counts accepted rows)."""
        return day_ingest_log(self.files, self.day, self._counts, quarantine)


def assemble_day(files: list[ParsedFile], day: date, max_rows: int | None = None) -> DayIngest:
    """The whole day at once (tests, small days): the chunks of `DayAssembly` put together."""
    a = DayAssembly(files, day, max_rows)
    samples = pl.concat(list(a.gpu_samples()))
    quarantine = a.quarantine()
    return DayIngest(
        gpu_samples=samples, quarantine=quarantine, ingest_log=a.ingest_log(quarantine)
    )
