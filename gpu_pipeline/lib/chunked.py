"""A day of gpu_samples in GPU chunks: bounded memory for any fleet size, the same tables.

The lake stores gpu_samples in SAMPLE_ORDER (one GPU after another), so a range of GPU UUIDs is
a run of Parquet row groups: each chunk reads only its own rows. A chunk holds whole GPUs (every
MIG instance with its physical GPU), computes their gpu_minutes and, while they are in memory,
their minute runs (`marts.minute_runs`: per GPU and hour, sums and counts). Runs never span two
chunks, so gpu_daily, hourly_fleet_metrics and priced_waste computed from all of a day's runs
are exactly the tables of the day processed at once.

`split="cluster"` makes chunk boundaries follow clusters as well (a chunk never mixes two
clusters' GPUs, a cluster larger than `max_gpus` is cut further), so a cluster's rows are
contiguous in every table of the day and a very large fleet's day is processed cluster by cluster.

Peak memory is one chunk's samples and minutes plus the small partials: `GPU_PIPELINE_CHUNK_GPUS`
(default 1000 GPUs, about 1.4 M GPU-minutes) bounds it whatever the fleet size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from gpu_pipeline.lib import marts
from gpu_pipeline.lib.metrics import gpu_daily_final, gpu_minutes
from gpu_pipeline.lib.rules import DEFAULT, Thresholds
from gpu_pipeline.lib.samples import SAMPLE_ORDER, collect_stable
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA

DEFAULT_CHUNK_GPUS = 1000
SPLITS = ("gpus", "cluster")


def chunk_gpus() -> int:
    n = int(os.environ.get("GPU_PIPELINE_CHUNK_GPUS", DEFAULT_CHUNK_GPUS))
    if n < 1:
        raise ValueError(f"GPU_PIPELINE_CHUNK_GPUS must be a positive number of GPUs, not {n}")
    return n


def split_mode() -> str:
    mode = os.environ.get("GPU_PIPELINE_SPLIT", "gpus")
    if mode not in SPLITS:
        raise ValueError(f"GPU_PIPELINE_SPLIT must be one of {', '.join(SPLITS)}, not {mode!r}")
    return mode


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


def plan(
    samples: pl.LazyFrame, max_gpus: int | None = None, split: str | None = None
) -> list[Chunk]:
    """The day's chunks: consecutive UUIDs, at most `max_gpus` GPUs each (and one cluster each
    when `split="cluster"`; a GPU seen in two clusters on a day goes with its first one)."""
    max_gpus = max_gpus or chunk_gpus()
    split = split or split_mode()
    if split == "cluster":
        gpus = (
            samples.group_by("gpu_uuid")
            .agg(pl.col("cluster").sort_by("timestamp").drop_nulls().first())
            .collect()
            .sort("cluster", "gpu_uuid", nulls_last=True)
        )
        out = []
        for (cluster,), part in gpus.group_by("cluster", maintain_order=True):
            uuids = part.get_column("gpu_uuid").to_list()
            out += [
                Chunk(cluster, tuple(uuids[i : i + max_gpus]))
                for i in range(0, len(uuids), max_gpus)
            ]
        return out
    uuids = samples.select("gpu_uuid").unique().collect().get_column("gpu_uuid").sort().to_list()
    return [Chunk(None, tuple(uuids[i : i + max_gpus])) for i in range(0, len(uuids), max_gpus)]


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
    same_minute = same_gpu & (ts.dt.truncate("1m") == ts.dt.truncate("1m").shift())

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


@dataclass
class DayTables:
    """What a day's chunks add up to: their minute runs, from which gpu_daily and the two
    marts are computed (runs never span two chunks: they belong to one GPU)."""

    t: Thresholds = DEFAULT
    runs: list[pl.DataFrame] = field(default_factory=list)
    minutes_rows: int = 0
    chunks: int = 0

    def add(self, minutes: pl.DataFrame) -> pl.DataFrame:
        """Take in one chunk's gpu_minutes (whole GPUs); returns it unchanged."""
        self.runs.append(collect_stable(marts.minute_runs(minutes.lazy(), self.t)))
        self.minutes_rows += minutes.height
        self.chunks += 1
        return minutes

    def _runs(self) -> pl.LazyFrame:
        if not self.runs:
            return marts.minute_runs(pl.LazyFrame(schema=GPU_MINUTES_SCHEMA), self.t)
        return pl.concat(self.runs).lazy()

    def gpu_daily(self) -> pl.DataFrame:
        return collect_stable(gpu_daily_final(self._runs(), self.t))

    def hourly_fleet_metrics(self) -> pl.DataFrame:
        return collect_stable(marts.hourly_final(self._runs()))

    def priced_waste(self) -> pl.DataFrame:
        return collect_stable(marts.priced_waste_final(self._runs()))


def minutes_by_chunk(
    samples: pl.LazyFrame,
    catalog: pl.DataFrame,
    prices: pl.DataFrame,
    t: Thresholds = DEFAULT,
    max_gpus: int | None = None,
    split: str | None = None,
) -> Iterator[pl.DataFrame]:
    """gpu_minutes of a day's samples, one chunk of GPUs at a time, in SAMPLE_ORDER overall
    (by cluster first when split by cluster)."""
    for chunk in plan(samples, max_gpus, split):
        df, shape = inspect(samples.filter(chunk.predicate).collect(engine="in-memory"))
        yield collect_stable(
            gpu_minutes(
                df.lazy(),
                catalog,
                prices,
                t,
                already_minutes=shape.one_per_minute,
                mig=shape.mig,
                presorted=True,
            )
        )
