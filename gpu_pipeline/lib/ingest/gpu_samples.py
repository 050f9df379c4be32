"""Parsed landing files -> a UTC day's `gpu_samples` (and, through `quarantine.py` and
`ingest_log.py`, the day's other raw tables).

Duplicates (same GPU, instance, field and timestamp; first file in path order wins) are counted,
a duplicate with another value is a conflict, quarantined (but a MIG GPU's device-level field
repeated on its instances' label sets is one reading: `_mig_repeats`), the long samples are
pivoted to one row per GPU per timestamp, and every line of every file is accounted for."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import TypeVar

import polars as pl

from gpu_pipeline.lib.fields import DEVICE_LEVEL_COLUMNS, FIELD_COLUMNS
from gpu_pipeline.lib.ingest.cache import ParsedFile
from gpu_pipeline.lib.ingest.formats import WIDE_FORMATS
from gpu_pipeline.lib.ingest.ingest_log import ingest_log as day_ingest_log
from gpu_pipeline.lib.ingest.keyed_day import KeyedDay, keyed_only
from gpu_pipeline.lib.ingest.landing import DEFAULT_CLUSTER
from gpu_pipeline.lib.ingest.quarantine import quarantine as day_quarantine
from gpu_pipeline.lib.samples import (
    ATTR_COLUMNS,
    SAMPLE_ORDER,
    collect_stable,
    conform,
    in_batches,
)
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA

KEY = ("gpu_uuid", "gpu_instance_id", "timestamp")
T, R = TypeVar("T"), TypeVar("R")


def _day_rows(
    pf: ParsedFile, order: int, day: date, uuids: tuple[str, str] | None = None, no_uuid=True
) -> pl.LazyFrame:
    """A file's samples of `day` (of the GPUs in `uuids` when given: `ParsedFile.rows`), with the
    file they came from, its cluster, and whether its records hold several values (`_wide`)."""
    return pf.rows(day, uuids, no_uuid).with_columns(
        pl.lit(pf.file.source_file).alias("source_file"),
        pl.lit(order).alias("file_order"),
        pl.col("cluster").fill_null(pf.file.dir_cluster or DEFAULT_CLUSTER),
        pl.lit(pf.format in WIDE_FORMATS).alias("_wide"),
    )


SAMPLE_KEY = ("gpu_uuid", "gpu_instance_id", "column", "timestamp")


# ranges of GPUs assembled at once (`DayAssembly._keyed`)
AHEAD_CHUNKS = 2


def in_order(fn: Callable[[T], R], items: Sequence[T], at_once: int) -> Iterator[R]:
    """`fn` of each item on threads, given in the items' order: the first `at_once` at once,
    then each next one when a result has been taken and its taker asks for more (so while the
    taker works on one result, `at_once - 1` are computed: memory for `at_once` results)."""
    if at_once <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(at_once) as pool:
        pending = deque(pool.submit(fn, item) for item in items[:at_once])
        for item in items[at_once:]:
            yield pending.popleft().result()
            pending.append(pool.submit(fn, item))
        while pending:
            yield pending.popleft().result()


class DayAssembly:
    """Dedupe, pivot and account one UTC day of the parsed landing files, a range of GPUs at a
    time: `gpu_samples()` yields the day's wide samples in SAMPLE_ORDER, chunk after chunk, then
    `quarantine()` and `ingest_log()` account for every row.

    A sample's duplicates and conflicts are always samples of the same GPU, so a chunk holds
    everything its GPUs need. A day whose samples exceed `max_rows` long rows (the memory budget
    of the chunk size, `Chunking.rows`) is assembled a range of GPUs at a time, each range read
    from the cached parses that hold its GPUs (a run of row groups of each: the cache keeps a
    file's samples by day, then GPU); a smaller day is assembled in memory at once.
    """

    def __init__(self, files: list[ParsedFile], day: date, max_rows: int | None = None):
        from gpu_pipeline.lib.staging.chunked import Chunking

        self.files, self.day = files, day
        self.max_rows = max_rows or Chunking().rows
        # the GPUs each file gives device-level fields of on MIG instances' label sets
        marked = [(o, u) for o, pf in enumerate(files) for u in pf.mig_gpus]
        self._mig = pl.DataFrame(
            {"file_order": [o for o, _ in marked], "gpu_uuid": [u for _, u in marked]},
            schema={"file_order": pl.Int32, "gpu_uuid": pl.String},
        )
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
        if keyed_only(parts):
            yield from self._keyed(KeyedDay(parts, day))
            return
        # rows per GPU and file (each file counted on its own: a few hundred rows to keep, where
        # the day's UUID column at once would take GiBs): the chunks are cut from the sums, and a
        # chunk reads only the files that hold its GPUs
        per_file = in_batches(
            [
                _day_rows(pf, o, day)
                .group_by("gpu_uuid")
                .len()
                .with_columns(pl.lit(o, pl.Int32).alias("_file"))
                for o, pf in parts
            ]
        )
        sizes = (
            per_file.group_by("gpu_uuid")
            .agg(pl.col("len").sum().alias("n"))
            .sort("gpu_uuid", nulls_last=False)
        )
        from gpu_pipeline.lib.staging.chunked import Chunk, cut_by_size

        chunks = cut_by_size(sizes["gpu_uuid"].to_list(), sizes["n"].to_list(), None, self.max_rows)
        self.chunks = len(chunks)
        if len(chunks) <= 1:
            yield self._assemble(
                collect_stable(pl.concat([_day_rows(pf, o, day) for o, pf in parts]))
            )
            return
        by_order = dict(parts)
        for chunk in chunks:
            # a chunk is a range of consecutive UUIDs; the cache keeps each file's rows by day,
            # then GPU (`cache.SAMPLES_ORDER`), so the range is a run of row groups of each file
            # that holds one of its GPUs, and the rest of the file is not read
            known = tuple(u for u in chunk if u is not None)
            rng = Chunk(None, known).predicate if known else pl.lit(False)
            no_uuid = len(known) < len(chunk)  # samples without a UUID sort first
            if no_uuid:
                rng = rng | pl.col("gpu_uuid").is_null()
            ends = (known[0], known[-1]) if known else ("", "")
            orders = sorted(set(per_file.filter(rng).get_column("_file").to_list()))
            yield self._assemble(
                collect_stable(
                    pl.concat([_day_rows(by_order[o], o, day, ends, no_uuid) for o in orders])
                )
            )

    def _keyed(self, kd: KeyedDay) -> Iterator[pl.DataFrame]:
        """`gpu_samples` from keyed cached parses (`keyed_day`): the same chunks, on integers."""
        from gpu_pipeline.lib.staging.chunked import cut_by_size

        per_file = kd.per_file()
        sizes = (
            per_file.group_by("gpu_uuid")
            .agg(pl.col("len").sum().alias("n"))
            .sort("gpu_uuid", nulls_last=False)
        )
        # the budget's rows, as the general way: bigger keyed chunks are no faster (the cached
        # samples are read uncompressed) and keep more in memory (benchmarks/README.md)
        chunks = cut_by_size(sizes["gpu_uuid"].to_list(), sizes["n"].to_list(), None, self.max_rows)
        self.chunks = max(1, len(chunks))

        def reads(chunk: list) -> tuple:
            known = tuple(u for u in chunk if u is not None)
            if len(chunks) <= 1:
                return set(per_file.get_column("_file").to_list()), None, True
            ends = (known[0], known[-1]) if known else ("", "")
            no_uuid = len(known) < len(chunk)
            rng = pl.col("gpu_uuid").is_in(pl.Series(known, dtype=pl.String).implode())
            if no_uuid:
                rng = rng | pl.col("gpu_uuid").is_null()
            return set(per_file.filter(rng).get_column("_file").to_list()), ends, no_uuid

        def read_and_assemble(chunk: list) -> tuple:
            rows = kd.rows(*reads(chunk))
            return rows, kd.assemble(rows)

        # two ranges at a time, given in order: one range's work keeps ~1.2 of the 2 cores busy
        # (NumPy's sorts and scatters, Polars' reads; both let go of the GIL)
        for rows, done in in_order(read_and_assemble, chunks or [[]], AHEAD_CHUNKS):
            if done is None:  # a duplicate, or attributes that differ: the general way
                yield self._assemble(kd.long(rows))
                continue
            gpu_samples, counts = done
            self._counts.append(counts)
            yield gpu_samples

    def _assemble(self, long: pl.DataFrame) -> pl.DataFrame:
        """One range of GPUs: duplicates and conflicts resolved, pivoted to wide samples."""
        dup = (~pl.struct(*SAMPLE_KEY).is_first_distinct()).alias("dup")
        long = long.with_columns(dup)
        has_dup = bool(long.get_column("dup").any())
        if has_dup:  # which copy is first depends on the order
            long = long.sort("file_order", "line").with_columns(dup)
            long = _with_first_copy(long, self._mig)
        wide = bool(long.get_column("_wide").any())
        records = _wide_records(long, has_dup) if wide else None
        if has_dup:
            conflicting = _conflicts(long, records)
            if conflicting.height:
                self._conflicts.append(conflicting)
            long = long.filter(~pl.col("_conflict")).drop(
                "_first_value", "_first_file", "_conflict"
            )
        self._counts.append(_counts_per_file(long, records, wide))
        accepted = long.filter(~pl.col("dup")) if has_dup else long
        del long
        return _one_row_per_time(accepted, self.day)

    def quarantine(self) -> pl.DataFrame:
        """The day's quarantined rows (after `gpu_samples()` is consumed: it adds conflicts)."""
        return day_quarantine(self.files, self.day, self._conflicts)

    def ingest_log(self, quarantine: pl.DataFrame) -> pl.DataFrame:
        """The day's ingest_log (after `gpu_samples()` is consumed: it counts accepted rows)."""
        return day_ingest_log(self.files, self.day, self._counts, quarantine)


def _with_first_copy(long: pl.DataFrame, mig: pl.DataFrame) -> pl.DataFrame:
    """Duplicates marked (`dup`, the rows in file then line order): each sample's first copy's
    value and file (`_first_value`, `_first_file`), and `_conflict`, a duplicate with another
    value: two exporters disagree. The first file in path order wins; the other value is
    quarantined with both (`_conflicts`), not counted as a duplicate. A MIG GPU's device-level
    repeats within a file are one reading, not conflicts (`_mig_repeats`; `mig`: the files'
    MIG GPUs, `file_order` and `gpu_uuid`)."""
    first = pl.struct(*SAMPLE_KEY)
    long = long.with_columns(
        pl.col("value").first().over(first).alias("_first_value"),
        pl.col("source_file").first().over(first).alias("_first_file"),
    ).with_columns(
        (pl.col("dup") & pl.col("value").ne_missing(pl.col("_first_value"))).alias("_conflict")
    )
    return _mig_repeats(long, mig)


def _mig_repeats(long: pl.DataFrame, marked: pl.DataFrame) -> pl.DataFrame:
    """dcgm-exporter writes a MIG GPU's device-level fields (power, temperature, clocks…) on
    every instance's label set, each a read of its own: the repeats, re-keyed to the physical
    GPU by the parser (`formats.common.mig_device_level`), may differ slightly (78.174 and
    78.446 W in one scrape). A file's repeats of one such field at one time are one reading of
    the device: its first copy (file, then line order: a value read, never a mean of them,
    which an XID code or a clock-event bitmask would not survive) stands for it, and a repeat
    is a conflict only when that reading, and the repeat itself, differ from the value kept
    (another file disagrees on the GPU). The GPU is known to be under MIG at that time by an
    instance's sample of it (any file), or in the repeat's file by the parse, which names the
    GPUs it gave device-level fields of on instances' label sets (`marked`: `file_order`,
    `gpu_uuid`; `ParsedFile.mig_gpus`): a file of such fields alone (power, say) has no
    instance's sample. A GPU read twice otherwise (no MIG) still conflicts. Runs only where
    conflicts are found."""
    dev = pl.col("column").is_in(list(DEVICE_LEVEL_COLUMNS)) & pl.col("gpu_instance_id").is_null()
    conflicting = pl.col("_conflict") & dev
    mig_here = pl.col("gpu_instance_id").is_not_null().any()
    if marked.is_empty():
        conflicting = conflicting & mig_here
    if not long.select(conflicting.any()).item():
        return long  # no device-level conflict, or no MIG instance in these GPUs
    mig = pl.col("gpu_instance_id").is_not_null().any().over("gpu_uuid", "timestamp")
    if not marked.is_empty():  # each row: its file marked its GPU
        on = ["file_order", "gpu_uuid"]
        flags = marked.cast({"file_order": long.schema["file_order"]}).with_columns(
            pl.lit(True).alias("_mig_file")
        )
        long = long.join(flags, on=on, how="left", maintain_order="left")
        mig = mig | pl.col("_mig_file").fill_null(False)
    file_reading = pl.col("value").first().over(*SAMPLE_KEY, "source_file")
    repeat = pl.col("_conflict") & dev & mig
    return long.with_columns(
        pl.when(repeat)
        .then(file_reading.ne_missing(pl.col("_first_value")))
        .otherwise(pl.col("_conflict"))
        .alias("_conflict")
    ).drop("_mig_file", strict=False)


def _wide_records(long: pl.DataFrame, has_dup: bool) -> pl.DataFrame:
    """The records of wide formats (a CSV row) by file and line: `_new`, one of its values is
    new (the record is accepted); `_dup`, one repeats without conflict (a duplicate, when none
    is new). A record with neither is quarantined: every value conflicts."""
    conflict = pl.col("_conflict") if has_dup else pl.lit(False)
    return (
        long.filter(pl.col("_wide"))
        .group_by("source_file", "line")
        .agg(
            (~pl.col("dup")).any().alias("_new"),
            (pl.col("dup") & ~conflict).any().alias("_dup"),
        )
    )


def _conflicts(long: pl.DataFrame, records: pl.DataFrame | None) -> pl.DataFrame:
    """The conflicting duplicates as quarantine rows, each naming both values and the file
    kept; `record_kept` false for a wide record that lost every value."""
    conflicting = long.filter(pl.col("_conflict"))
    if records is not None and conflicting.height:
        lost = records.filter(~pl.col("_new") & ~pl.col("_dup")).select(
            "source_file", "line", pl.lit(True).alias("_lost")
        )
        conflicting = conflicting.join(lost, on=["source_file", "line"], how="left")
    else:
        conflicting = conflicting.with_columns(pl.lit(None, pl.Boolean).alias("_lost"))
    return conflicting.select(
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
        pl.format("{}={}", "column", pl.col("value").cast(pl.String).fill_null("null")).alias(
            "raw"
        ),
        pl.col("column").alias("field"),
        (pl.col("_wide") & pl.col("_lost").is_null()).alias("record_kept"),
    )


def _counts_per_file(long: pl.DataFrame, records: pl.DataFrame | None, wide: bool) -> pl.DataFrame:
    """Rows accepted and duplicate, first and last sample, per file (for the ingest_log): a
    narrow format's rows are its samples, a wide format's its records."""
    narrow = long.filter(~pl.col("_wide")) if wide else long
    counts = [
        narrow.group_by("source_file").agg(
            (~pl.col("dup")).sum().alias("rows_accepted"),
            pl.col("dup").sum().alias("rows_duplicate"),
            pl.col("timestamp").min().alias("first_sample"),
            pl.col("timestamp").max().alias("last_sample"),
        )
    ]
    if records is not None:
        span = (
            long.filter(pl.col("_wide"))
            .group_by("source_file")
            .agg(
                pl.col("timestamp").min().alias("first_sample"),
                pl.col("timestamp").max().alias("last_sample"),
            )
        )
        counts.append(
            records.group_by("source_file")
            .agg(
                pl.col("_new").sum().alias("rows_accepted"),
                (~pl.col("_new") & pl.col("_dup")).sum().alias("rows_duplicate"),
            )
            .join(span, on="source_file", how="left")
        )
    return pl.concat(counts, how="diagonal_relaxed")


def _one_row_per_time(accepted: pl.DataFrame, day: date) -> pl.DataFrame:
    """The accepted long samples as `gpu_samples`: one row per GPU, instance and time, its
    identity (the first value given) and each field's value, in SAMPLE_ORDER."""
    # in one group-by (a pivot, a second group-by for the identity and a join of the two took
    # twice as long)
    fields = set(accepted.get_column("column").unique().to_list())
    attrs = [c for c in ATTR_COLUMNS if c not in KEY]
    value = pl.col("value")
    gpu_samples = (
        accepted.group_by(list(KEY))
        .agg(
            *[pl.col(c).drop_nulls().first() for c in attrs],
            pl.col("source_file").first(),
            *[
                value.filter(pl.col("column") == c).first().alias(c)
                for c in FIELD_COLUMNS
                if c in fields
            ],
        )
        .with_columns(pl.lit(day).alias("date"))
        .sort(*SAMPLE_ORDER, nulls_last=False)
    )
    return conform(gpu_samples, GPU_SAMPLES_SCHEMA)
