"""A UTC day of keyed cached parses (`cache.keyed_in_cache_order`: samples carry a series number,
the series table its column and attributes) assembled on integers (issue 34).

The day's series tables are put together once (a few dozen rows a file); each sample then
takes its GPU's rank `gk`, its field's code `ck` and its attributes' signature `ak` by a gather.
Duplicates are found on one integer per sample (GPU, field, time in the day), and the pivot to
one row per GPU and time groups on two integers; the strings (UUIDs, pods, models) are gathered
once per output row at the end. Where a range of GPUs holds a duplicate, or a GPU's row at one
time draws on series with different attributes, the range goes the general way
(`gpu_samples.DayAssembly._assemble`, on the same rows in the long form): the two ways give the
same tables (tests/test_keyed_day.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from pathlib import Path

import numpy as np
import polars as pl

from gpu_pipeline.lib.fields import FIELD_COLUMNS
from gpu_pipeline.lib.ingest.cache import ParsedFile, rank_range
from gpu_pipeline.lib.ingest.landing import DEFAULT_CLUSTER
from gpu_pipeline.lib.samples import ATTR_COLUMNS, SERIES_SCHEMA, conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA

KEY = ("gpu_uuid", "gpu_instance_id")
# what a row of gpu_samples takes from its first sample's series, besides its key
ROW_ATTRS = [c for c in ATTR_COLUMNS if c not in KEY]
DAY_MS = 86_400_000
# a sample's integer key: GPU rank, field code and the millisecond of the day, in 64 bits
_GK_SHIFT, _CK_BITS = 33, 6


def keyed_only(files: list[tuple[int, ParsedFile]]) -> bool:
    """Every file's samples are cached keyed (and not replaced since)."""
    return bool(files) and all(
        pf.frames is None and pf.pieces and all(t is not None for _, t in pf.pieces)
        for _, pf in files
    )


class KeyedDay:
    """The day's pieces and their series, one table (`series`, indexed by the global `gsid`)."""

    def __init__(self, files: list[tuple[int, ParsedFile]], day: date):
        self.day = day
        self.start = int(datetime.combine(day, time(), UTC).timestamp() * 1000)
        pieces = [(order, pf, s, t) for order, pf in files for s, t in pf.pieces]
        meta = pl.DataFrame(
            {
                "_p": pl.Series(range(len(pieces)), dtype=pl.UInt32),
                "_cluster": [pf.file.dir_cluster or DEFAULT_CLUSTER for _, pf, _, _ in pieces],
                "source_file": [pf.file.source_file for _, pf, _, _ in pieces],
                "file_order": pl.Series([o for o, _, _, _ in pieces], dtype=pl.Int32),
            }
        )
        rows = _series_tables([t for _, _, _, t in pieces])
        # one row per series of each piece, in sid order (`cache.read_series`)
        table = rows.unique(["_p", "sid"], keep="first", maintain_order=True).sort("_p", "sid")
        # each piece's series take global numbers `gsid`: its `sid` after the pieces before it
        heights = np.zeros(len(pieces), np.int64)
        per = table.group_by("_p").len()
        heights[per.get_column("_p").to_numpy()] = per.get_column("len").to_numpy()
        offsets = np.concatenate(([0], np.cumsum(heights)[:-1])).tolist()
        gsid = (
            pl.col("sid").cast(pl.Int64)
            + pl.col("_p").replace_strict(range(len(pieces)), offsets, return_dtype=pl.Int64)
        ).alias("gsid")
        self.counts = rows.filter(pl.col("date") == day).select(gsid, "len")
        table = table.join(meta, on="_p", how="left", maintain_order="left")
        self.series = _codes(
            table.select(
                gsid,
                *[c for c in SERIES_SCHEMA if c != "cluster"],
                pl.col("cluster").fill_null(pl.col("_cluster")),
                "source_file",
                "file_order",
            )
        )
        # each piece's GPUs and ranks, found once: every chunk asks for its range
        ranks: dict[int, list[tuple[str, int]]] = {i: [] for i in range(len(pieces))}
        for p, uuid, g in (
            table.select("_p", "gpu_uuid", "_g")
            .drop_nulls("gpu_uuid")
            .unique()
            .sort("_p", "gpu_uuid")
            .iter_rows()
        ):
            ranks[p].append((uuid, g))
        self.pieces = [
            (order, samples, offset, ranks[i])
            for i, ((order, _, samples, _), offset) in enumerate(zip(pieces, offsets, strict=True))
        ]
        self.series_np = {
            c: self.series.get_column(c).cast(pl.Int64).to_numpy()
            for c in ("gk", "ck", "ak", "file_order")
        }
        self.names = self.series.group_by("file_order").agg(pl.col("source_file").first())

    def _scan(self, samples: Path, offset: int, keep: pl.Expr | None = None) -> pl.LazyFrame:
        t = pl.col("timestamp").dt.epoch("ms")
        day = t.is_between(self.start, self.start + DAY_MS - 1)
        rows = pl.scan_parquet(samples, glob=False).filter(day if keep is None else keep & day)
        return rows.select("line", "timestamp", "value", (pl.col("sid") + offset).alias("gsid"))

    def per_file(self) -> pl.DataFrame:
        """Samples per GPU and file on the day (`gpu_uuid`, `len`, `_file`), from the counts
        cached beside each series (`cache.read_series`)."""
        c = self.counts
        s = self.series.select("gpu_uuid", "file_order").gather(c.get_column("gsid"))
        return (
            pl.concat([s, c.select("len")], how="horizontal")
            .group_by("gpu_uuid", "file_order")
            .agg(pl.col("len").sum().cast(pl.UInt32))
            .select("gpu_uuid", "len", pl.col("file_order").alias("_file"))
        )

    def rows(self, orders: set[int], uuids: tuple[str, str] | None, no_uuid: bool) -> pl.DataFrame:
        """The day's keyed samples of the files `orders` (of the GPUs in `uuids`, and those
        without a UUID when `no_uuid`), in file order, each file's in cache order."""
        frames = []
        for order, samples, offset, ranks in self.pieces:
            if order not in orders:
                continue
            keep = None if uuids is None else rank_range(ranks, uuids, no_uuid)
            frames.append(self._scan(samples, offset, keep))
        if not frames:
            return self._scan(self.pieces[0][1], 0, pl.lit(False)).collect()
        return pl.concat(pl.collect_all(frames))

    def long(self, rows: pl.DataFrame) -> pl.DataFrame:
        """`rows` in the long form `DayAssembly._assemble` takes."""
        s = self.series.select(
            "column", *ATTR_COLUMNS, "source_file", "file_order", pl.lit(False).alias("_wide")
        ).gather(rows.get_column("gsid"))
        return pl.concat([rows.drop("gsid"), s], how="horizontal")

    def assemble(self, rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """(gpu_samples, accepted rows per file) of one range of GPUs; None when the range
        holds a duplicate or a row whose series disagree on an attribute (the general way).

        One stable sort of one integer per sample (GPU rank, millisecond of the day, field
        code) puts each output row's samples together: a row starts where GPU or time
        changes, a duplicate is a repeated integer, and each field's values are scattered into
        their rows."""
        if rows.is_empty():
            return None
        gsid = rows.get_column("gsid").to_numpy()
        gk, ck, ak, files = (self.series_np[c][gsid] for c in ("gk", "ck", "ak", "file_order"))
        ms = rows.get_column("timestamp").dt.epoch("ms").to_numpy() - self.start
        key = (gk << _GK_SHIFT) | (ms << _CK_BITS) | ck
        order = np.argsort(key, kind="stable")
        key = key[order]
        if (ck < 0).any() or (key[1:] == key[:-1]).any():  # a field twice at one time
            return None
        row_key = key >> _CK_BITS
        starts = np.flatnonzero(np.concatenate(([True], row_key[1:] != row_key[:-1])))
        ak_sorted = ak[order]
        if (np.minimum.reduceat(ak_sorted, starts) != np.maximum.reduceat(ak_sorted, starts)).any():
            return None
        # each output row's first sample (in file, then cache order) names its identity
        first = np.minimum.reduceat(order, starts)
        row_of = np.repeat(np.arange(starts.size), np.diff(np.append(starts, key.size)))
        values = rows.get_column("value").fill_null(np.nan).to_numpy()[order]
        ck_sorted = ck[order]
        # the fields present (a count per field code: no sort), each scattered into its row of
        # one 2-D array at once
        present = np.flatnonzero(np.bincount(ck_sorted, minlength=len(FIELD_COLUMNS)))
        slot = np.zeros(len(FIELD_COLUMNS), np.int64)
        slot[present] = np.arange(present.size)
        grid = np.full((present.size, starts.size), np.nan)
        grid[slot[ck_sorted], row_of] = values
        # values are never NaN (a NaN reading is a blank: null), so NaN marks no value
        fields = {
            FIELD_COLUMNS[c]: pl.Series(grid[i], nan_to_null=True)
            for i, c in enumerate(present.tolist())
        }
        ident = self.series.select(*KEY, *ROW_ATTRS, "source_file").gather(gsid[first])
        times = (row_key[starts] & ((1 << (_GK_SHIFT - _CK_BITS)) - 1)) + self.start
        out = ident.with_columns(
            pl.Series("timestamp", times).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC"),
            pl.lit(self.day).alias("date"),
            **fields,
        )
        return conform(out, GPU_SAMPLES_SCHEMA), self._counts(rows, files)

    def _counts(self, rows: pl.DataFrame, files: np.ndarray) -> pl.DataFrame:
        """Accepted rows, first and last sample per file (for the ingest_log)."""
        counts = (
            rows.select("timestamp")
            .with_columns(pl.Series("file_order", files))
            .group_by("file_order")
            .agg(
                pl.len().alias("rows_accepted"),
                pl.lit(0, pl.UInt32).alias("rows_duplicate"),
                pl.col("timestamp").min().alias("first_sample"),
                pl.col("timestamp").max().alias("last_sample"),
            )
        )
        return counts.join(self.names, on="file_order").select(
            "source_file", "rows_accepted", "rows_duplicate", "first_sample", "last_sample"
        )


def _series_tables(paths: list[Path]) -> pl.DataFrame:
    """The series tables of the pieces (`cache.read_series`' files) as one frame, `_p` the
    piece's index: read together, not a file at a time (168 pieces: a few large reads instead
    of ~1,000 small queries)."""
    try:
        frames = pl.read_parquet(paths, glob=False, include_file_paths="_path")
        index = pl.Series([str(p) for p in paths], dtype=pl.String)
        return frames.with_columns(
            pl.col("_path")
            .replace_strict(index, range(len(paths)), return_dtype=pl.UInt32)
            .alias("_p")
        ).drop("_path")
    except pl.exceptions.PolarsError:  # tables of other shapes (older caches): one at a time
        return pl.concat(
            [
                pl.read_parquet(p, glob=False).with_columns(pl.lit(i, pl.UInt32).alias("_p"))
                for i, p in enumerate(paths)
            ],
            how="diagonal_relaxed",
        )


def _codes(series: pl.DataFrame) -> pl.DataFrame:
    """The day's series with integer codes: `gk`, the GPU (and instance) rank in the lake's row
    order (UUID, instance, nulls first); `ck`, the field's index in FIELD_COLUMNS; `ak`, the
    attributes' signature (equal attributes, equal code)."""
    gpus = (
        series.select(*KEY)
        .unique()
        .sort(*KEY, nulls_last=False)
        .with_row_index("gk")
        .with_columns(pl.col("gk").cast(pl.Int64))
    )
    sigs = series.select(ROW_ATTRS).unique().with_row_index("ak")
    fields = pl.Series(FIELD_COLUMNS, dtype=pl.String)
    codes = pl.int_range(0, len(FIELD_COLUMNS), dtype=pl.Int64, eager=True)
    return (
        series.join(gpus, on=list(KEY), how="left", nulls_equal=True, maintain_order="left")
        .join(sigs, on=ROW_ATTRS, how="left", nulls_equal=True, maintain_order="left")
        .with_columns(pl.col("column").replace_strict(fields, codes, default=-1).alias("ck"))
        .sort("gsid")
    )
