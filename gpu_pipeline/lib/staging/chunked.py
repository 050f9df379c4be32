"""A day of gpu_samples in GPU chunks: bounded memory for any fleet size, the same tables.

The lake stores gpu_samples in SAMPLE_ORDER (one GPU after another), so a range of GPU UUIDs is
a run of Parquet row groups: each chunk reads only its own rows. A chunk holds whole GPUs (every
MIG instance with its physical GPU), computes their gpu_minutes and, while they are in memory,
their minute runs (`staging.minute_runs`: per GPU and hour, sums and counts). Runs never span two
chunks, so gpu_daily, hourly_fleet_metrics, priced_waste and fleet_daily computed from all of a
day's runs are exactly the tables of the day processed at once.

`split="cluster"` makes chunk boundaries follow clusters as well (a chunk never mixes two
clusters' GPUs, a cluster larger than `max_gpus` is cut further), so a cluster's rows are
contiguous in every table of the day and a very large fleet's day is processed cluster by cluster.

Peak memory is two chunks' samples and minutes (one computed while the previous is aggregated
and written) plus the small partials, whatever the fleet size. A chunk is sized from a memory
budget, `Chunking.mb` (default 400 MiB, at about 1.5 KiB of working memory per sample row with
two chunks in flight: ~273,000 rows, 190 GPUs of minute data, half that at 30 s samples);
`Chunking.gpus` caps chunks by GPU count instead (GPU_PIPELINE_CHUNK_MB / _CHUNK_GPUS / _SPLIT
set them through the resources).

A day of the lake is planned from its file's footer (`row_group_plan`): whole row groups (the
lake writes 131,072 rows a group: two a chunk by default), cut at UUIDs, without reading a row.
Any other frame, or a file out of UUID order, is planned by counting each GPU's rows (`plan`).
A chunk reads only the columns gpu_minutes is computed from (`gpu_minutes.INPUT_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import polars as pl

from gpu_pipeline.lib.rules import DEFAULT, DIAGNOSIS, DiagnosisThresholds, Thresholds
from gpu_pipeline.lib.samples import MINUTE_MS, SAMPLE_ORDER, collect_stable
from gpu_pipeline.lib.staging.gpu_minutes import INPUT_COLUMNS, gpu_minutes
from gpu_pipeline.settings import Settings

if TYPE_CHECKING:
    import pyarrow.parquet as pq

DEFAULT_CHUNK_MB = Settings.chunk_mb  # one home: the settings' default
# working memory per sample row of a chunk, two chunks in flight, freed buffers kept for reuse
# (gpu_pipeline/allocator.py): measured with benchmarks/run.py
BYTES_PER_ROW = 1536
SPLITS = ("gpus", "cluster")


@dataclass(frozen=True)
class Chunking:
    """How a day is cut: a memory budget of `mb` MiB of sample rows per chunk (~1.5 KiB of working
    memory a row), or at most `gpus` GPUs per chunk when set; `split="cluster"` also cuts at
    cluster boundaries. (The resources carry these settings: `LakeResource.chunking()`.)"""

    mb: int = DEFAULT_CHUNK_MB
    gpus: int | None = None
    split: str = "gpus"

    def __post_init__(self) -> None:
        if self.mb < 16:
            raise ValueError(f"the chunk memory budget must be at least 16 (MiB), not {self.mb}")
        if self.gpus is not None and self.gpus < 1:
            raise ValueError(f"chunk GPUs must be a positive number of GPUs, not {self.gpus}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {self.split!r}")

    @property
    def rows(self) -> int:
        """Sample rows per chunk from the memory budget."""
        return self.mb * 2**20 // BYTES_PER_ROW

    def __str__(self) -> str:
        """How chunks are sized, for run logs and metadata."""
        return f"{self.gpus} GPUs" if self.gpus else f"{self.rows:,} rows ({self.mb} MiB)"


DEFAULT_CHUNKING = Chunking()


def cut_by_size(
    uuids: list[str], rows: list[int], max_gpus: int | None, max_rows: int
) -> list[list[str]]:
    """Consecutive GPUs, at most `max_gpus` per chunk when given, else as many as fit in
    `max_rows` rows (a GPU alone over the budget is a chunk of its own)."""
    if max_gpus:
        return [uuids[i : i + max_gpus] for i in range(0, len(uuids), max_gpus)]
    out: list[list[str]] = []
    current: list[str] = []
    size = 0
    for u, n in zip(uuids, rows, strict=True):
        if current and size + n > max_rows:
            out.append(current)
            current, size = [], 0
        current.append(u)
        size += n
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class Chunk:
    """GPUs `uuids` (sorted) of one cluster, or of any clusters when the split is by GPU count."""

    cluster: str | None
    uuids: tuple[str, ...]

    @property
    def predicate(self) -> pl.Expr:
        uuid = pl.col("gpu_uuid")
        rng = uuid.is_between(pl.lit(self.uuids[0]), pl.lit(self.uuids[-1]))
        if self.cluster is None:
            return rng
        # a range of one cluster's UUIDs may hold other clusters' GPUs: keep exactly this set
        return rng & uuid.is_in(pl.Series(self.uuids))


@dataclass(frozen=True)
class UuidRange:
    """The GPUs whose UUID is at least `lo` and below `hi` (None: no bound), wherever their rows
    are: ranges that meet end to end put every GPU in exactly one chunk."""

    lo: str | None
    hi: str | None

    @property
    def predicate(self) -> pl.Expr:
        uuid = pl.col("gpu_uuid")
        bounds = [uuid >= pl.lit(self.lo)] if self.lo is not None else []
        bounds += [uuid < pl.lit(self.hi)] if self.hi is not None else []
        return pl.all_horizontal(bounds) if bounds else pl.lit(True)


def row_group_plan(
    meta: pq.FileMetaData, chunking: Chunking = DEFAULT_CHUNKING
) -> list[UuidRange] | None:
    """The day's chunks from its Parquet file's footer (`Lake.footer`), without reading a row: consecutive row
    groups, as many as fit in `chunking.rows` (at least one), cut at the lowest UUID of the
    first group of each chunk. For a file in SAMPLE_ORDER, as the lake writes it: the footer
    must give every group's UUID range (no null UUID), the ranges must follow each other and no
    group may be larger than a chunk; otherwise None (`plan` then counts the rows of each GPU).
    Only for chunks by memory budget, not by GPU count or cluster.

    The ranges partition the UUIDs, so every GPU is whole in one chunk whatever the footer says;
    the footer decides only how many rows a chunk gets (a GPU whose rows straddle two groups
    goes with the later one). Counting the rows of each GPU read the day's UUID column, ~5 % of
    a 10,000-GPU staging pass, and the chunks it cut began in the middle of row groups, each
    read twice (benchmarks/README.md, issue 34)."""
    if chunking.gpus or chunking.split != "gpus":
        return None
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if "gpu_uuid" not in names:
        return None
    at = names.index("gpu_uuid")
    groups = []  # (rows, lowest UUID, highest UUID) per row group
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        st = rg.column(at).statistics
        if rg.num_rows == 0:
            continue
        if st is None or not st.has_min_max or st.null_count != 0 or rg.num_rows > chunking.rows:
            return None
        if not (isinstance(st.min, str) and isinstance(st.max, str)):
            return None  # not a text column's statistics
        groups.append((rg.num_rows, st.min, st.max))
    if not groups:
        return []
    if any(a[2] > b[1] for a, b in zip(groups, groups[1:], strict=False)):
        return None  # not in UUID order
    cuts: list[str] = []  # the lowest UUID of each chunk but the first
    size, first = 0, None  # the chunk's rows so far, the lowest UUID of its first group
    for rows, low, _ in groups:
        # a cut at a UUID that starts the chunk would leave it empty (one GPU over many
        # groups): the chunk grows instead, as a GPU over the budget is a chunk of its own
        if size and size + rows > chunking.rows and low > first:
            cuts.append(low)
            size = 0
        if not size:
            first = low
        size += rows
    bounds = [None, *cuts, None]
    return [UuidRange(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def plan(samples: pl.LazyFrame, chunking: Chunking = DEFAULT_CHUNKING) -> list[Chunk]:
    """The day's chunks: consecutive UUIDs, at most `chunking.gpus` GPUs each when set, else at
    most `chunking.rows` sample rows (the memory budget); one cluster each when split by
    cluster (a GPU seen in two clusters on a day goes with its first)."""
    max_gpus, max_rows = chunking.gpus, chunking.rows
    if chunking.split == "cluster":
        gpus = (
            samples.group_by("gpu_uuid")
            .agg(pl.col("cluster").sort_by("timestamp").drop_nulls().first(), pl.len().alias("n"))
            .collect()
            .sort("cluster", "gpu_uuid", nulls_last=True)
        )
        out = []
        for (cluster,), part in gpus.group_by("cluster", maintain_order=True):
            out += [
                Chunk(cluster, tuple(c))
                for c in cut_by_size(
                    part["gpu_uuid"].to_list(), part["n"].to_list(), max_gpus, max_rows
                )
            ]
        return out
    # a streaming group-by: the UUID column is never whole in memory. (Runs of equal UUIDs: Polars
    # 2.1's streaming `rle` panics on an in-memory frame of more than one morsel — a remote
    # lake's day — and the in-memory one holds the whole column; benchmarks/README.md.)
    gpus = samples.group_by("gpu_uuid").agg(pl.len().alias("n")).collect().sort("gpu_uuid")
    return [
        Chunk(None, tuple(c))
        for c in cut_by_size(gpus["gpu_uuid"].to_list(), gpus["n"].to_list(), max_gpus, max_rows)
    ]


@dataclass(frozen=True)
class Shape:
    """What a chunk's samples turned out to be, found in one vectorized pass."""

    presorted: bool
    one_per_minute: bool
    mig: bool


def inspect(df: pl.DataFrame) -> tuple[pl.DataFrame, Shape]:
    """Sort `df` into SAMPLE_ORDER unless it already is (the lake's order), and tell whether it
    holds at most one sample per GPU-minute (a minute-level export: no regroup needed) and
    whether any MIG instance is in it."""
    inst = pl.col("gpu_instance_id").fill_null(-1)  # nulls sort first
    uuid, ts = pl.col("gpu_uuid"), pl.col("timestamp")
    same_gpu = (uuid == uuid.shift()) & (inst == inst.shift())
    out_of_order = (uuid < uuid.shift()) | (
        (uuid == uuid.shift())
        & ((inst < inst.shift()) | ((inst == inst.shift()) & (ts < ts.shift())))
    )
    minute = ts.dt.epoch("ms") // MINUTE_MS
    same_minute = same_gpu & (minute == minute.shift())

    def flags(frame: pl.DataFrame) -> dict:
        return frame.select(
            out_of_order.any().alias("unsorted"),
            same_minute.any().alias("repeats"),
            pl.col("gpu_instance_id").is_not_null().any().alias("mig"),
        ).row(0, named=True)

    f = flags(df)
    presorted = not f["unsorted"]
    if not presorted:
        df = df.sort(*SAMPLE_ORDER, nulls_last=False)
        f = flags(df)
    return df, Shape(presorted, not f["repeats"], bool(f["mig"]))


def minutes_by_chunk(
    samples: pl.LazyFrame,
    catalog: pl.DataFrame,
    prices: pl.DataFrame,
    t: Thresholds = DEFAULT,
    d: DiagnosisThresholds = DIAGNOSIS,
    chunking: Chunking = DEFAULT_CHUNKING,
    footer: pq.FileMetaData | None = None,
) -> Iterator[pl.DataFrame]:
    """gpu_minutes of a day's samples, one chunk of GPUs at a time, in SAMPLE_ORDER overall
    (by cluster first when split by cluster). `footer`: that of the Parquet file `samples`
    reads (a day of the lake's gpu_samples, `Lake.footer`), which can cut the chunks
    (`row_group_plan`).

    The next chunk is read, checked and given its model entries in a second thread while the
    caller works on the one it was handed (its minute runs, its write): Polars and NumPy release
    the GIL, so both cores work. The minute metrics themselves (one query over the chunk's
    per-minute rows) are collected on the caller's thread, as each chunk is handed over: the
    reading thread's share was the larger (benchmarks/README.md), so the two now carry about
    the same. Two chunks are in memory at once, which the memory budget allows for
    (`Chunking.rows`). A chunk reads only the sample columns gpu_minutes is computed from
    (`gpu_minutes.INPUT_COLUMNS`)."""

    def compute(chunk: Chunk | UuidRange) -> pl.LazyFrame:
        # the reader hands back a piece per row group: joined once here, not again and again by
        # every comparison of a string column with its shifted self (each aligns the pieces)
        read = samples.filter(chunk.predicate).collect(engine="in-memory").rechunk()
        df, shape = inspect(read)
        # eager up to the per-minute rows with their model entries; the rest is one query
        return gpu_minutes(
            df.lazy(),
            catalog,
            prices,
            t,
            already_minutes=shape.one_per_minute,
            mig=shape.mig,
            presorted=True,
            d=d,
        )

    # a chunk reads only the columns its minutes are computed from
    have = samples.collect_schema().names()
    samples = samples.select([c for c in INPUT_COLUMNS if c in have])
    chunks = row_group_plan(footer, chunking) if footer is not None else None
    if chunks is None:
        chunks = plan(samples, chunking)
    if not chunks:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="gpu_minutes") as ahead:
        pending = ahead.submit(compute, chunks[0])
        for following in chunks[1:]:
            minutes = pending.result()
            pending = ahead.submit(compute, following)
            yield collect_stable(minutes)
        yield collect_stable(pending.result())


def by_gpu_chunks(
    minutes: pl.LazyFrame,
    partial: Callable[[pl.LazyFrame], pl.LazyFrame],
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.DataFrame:
    """`partial` of a day's rows (gpu_minutes in the lake's order), computed on the rows of a
    chunk of whole GPUs at a time (`plan`: a range of UUIDs, read from its own row groups) and
    concatenated in chunk order, so a mart over a day holds one chunk's rows, not the day's.

    `partial` groups by keys that include `gpu_uuid`, keeping the groups' order
    (`maintain_order=True`): every group is whole in one chunk, its rows in their order, and
    the groups come in the order of their first row, so the result does not depend on where
    chunks are cut. A mart then adds up these per-GPU partials (sums, counts, flags) into its
    groups: a small group-by, whatever the fleet's size."""
    chunks = plan(minutes, replace(chunking, split="gpus"))
    if not chunks:
        return collect_stable(partial(minutes))  # no rows: the partials' schema
    return pl.concat([collect_stable(partial(minutes.filter(c.predicate))) for c in chunks])
