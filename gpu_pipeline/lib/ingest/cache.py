"""Each landing file is parsed once into a cache keyed by its content, name and the parse options
(`ParseOptions`), so a day's run reads only that day's rows of each file; the cache checks
itself (a cached parse whose files changed is parsed again)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time
from pathlib import Path
from time import time as time_now

import numpy as np
import polars as pl

from gpu_pipeline.lib.ingest.formats.exposition import forget_series
from gpu_pipeline.lib.ingest.landing import (
    CHANGED,
    DEFAULT_PARSE,
    Changed,
    LandingFile,
    ParseOptions,
    PieceParse,
    _hash_listed,
    _ident,
    _sha256,
    _whole_file,
    home_day,
    learn_series,
    merge_pieces,
    parse_landing_file,
)
from gpu_pipeline.lib.ingest.shared_cache import SharedCache, plain_name
from gpu_pipeline.lib.samples import LONG_SCHEMA, SERIES_SCHEMA, ParsedLines

# bump when parsing changes what a file yields, so cached parses are redone
PARSER_VERSION = "p20"  # p20: in an exposition file without sample timestamps a series written again (scrapes appended to one file) is quarantined, not a duplicate of the first; nvidia-smi dmon blocks read with the header above them (a pmon block's rows quarantined); an implausible time's reason worded without the minute of the parse; p19: a Prometheus answer over 4 MiB is parsed a run of whole series at a time (over 64 MiB it was quarantined whole); a file name's `YYYYMMDD-HHMMSS` is its time; identity fixes of review 26 (nvidia-smi loops, records missing only their UUID); p18: lines above a file's content that no format reads (a banner, `curl -i`'s head) are quarantined records and the rest is read; a file rejected whole while read in pieces is filed on the days its text names, with its head; a row whose time does not parse on the day it names; p17: an nvidia-smi CSV loop log without identity columns decides its loop over the parts under one header, a restart's part and a later piece too short to show it taking the one seen; p16: a parse names the GPUs whose device-level fields it gives on MIG instances' label sets (meta.json `mig_gpus`); p15: a JSON Lines file cut short after whole answers keeps them (the tail one quarantined record); p14: nvidia-smi dmon -o DT; a header.csv for rows that do not start with a time; a CSV header written again starts a part read by it; a per-process listing refused; `[N/A]` attributes absent; `instance` tells hosts apart; XML loop logs and several JSON answers in a file; gzipped UTF-16; p13: a line that starts with `}` is quarantined, not skipped; a file in pieces decides its times once; times that name their zone, in CSV or a file name, and a local hour repeated at the end of summer time; p12: of one alias written twice on a series, the first written
# a cached parse keeps its samples by UTC day, then GPU, then time: a day's run reads only that
# day's row groups of a file, and assembling a day a range of GPUs at a time
# (`gpu_samples.DayAssembly`) only the row groups of the range (a GPU-day of 30 s samples of
# ten fields is ~29,000 rows: two row groups)
SAMPLES_ORDER = (pl.col("timestamp").dt.date(), "gpu_uuid", "timestamp", "line")
SAMPLES_ROW_GROUP = 16384


def _utc_days(ts: pl.Series) -> np.ndarray:
    """The UTC day (days since 1970-01-01) of each time of `ts` (no nulls): of times in
    milliseconds, as the cache keeps them, straight from their integers (no conversion)."""
    ms = (
        ts.to_physical() if ts.dtype == pl.Datetime("ms", ts.dtype.time_zone) else ts.dt.epoch("ms")
    )
    return ms.to_numpy() // 86_400_000


def keyed_in_cache_order(
    samples: pl.DataFrame, series: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Keyed samples and their series (`ParsedLines.series`) as cached: each series with its sid
    and `_g`, its GPU's rank among the file's UUIDs (sorted; 0: no UUID), each sample with its
    series' `_g`, in SAMPLES_ORDER (by day, `_g`, time, line: integers only). A range of UUIDs
    is then a range of `_g`, and a run of row groups (`ParsedFile.rows`)."""
    # a file's few dozen series: ranked in Python, not in three queries
    of_series = series.get_column("gpu_uuid").to_list()
    rank = {u: i for i, u in enumerate(sorted({u for u in of_series if u is not None}), 1)}
    n_uuids = len(rank)
    ranks = np.array([rank.get(u, 0) for u in of_series], dtype=np.int32)
    series = series.with_columns(
        pl.Series("sid", np.arange(len(of_series), dtype=np.int32)), pl.Series("_g", ranks)
    )
    samples = samples.with_columns(series.get_column("_g").gather(samples.get_column("sid")))
    if not samples.height:
        return samples, series
    ts, line = samples.get_column("timestamp"), samples.get_column("line")
    if ts.null_count() or line.null_count():
        day = pl.col("timestamp").dt.epoch("ms") // 86_400_000
        samples = samples.sort("timestamp", "line", nulls_last=False).sort(
            day * (n_uuids + 1) + pl.col("_g"), maintain_order=True, nulls_last=False
        )
        return samples, series
    if not (ts.is_sorted() and line.is_sorted()):  # a scrape's lines are in time order already
        samples = samples.sort("timestamp", "line")
        ts = samples.get_column("timestamp")
    # then stably by day and GPU: a few hundred distinct integers, sorted by radix when they fit
    # in 16 bits (a tenth of a comparison sort's time)
    day = _utc_days(ts)
    key = (day - day.min()) * (n_uuids + 1) + samples.get_column("_g").to_numpy()
    key = key.astype(np.int16) if key.max() < 2**15 else key
    return samples[np.argsort(key, kind="stable")], series


def series_per_day(samples: pl.DataFrame) -> pl.DataFrame:
    """Keyed samples counted by day (`d`, the UTC date) and series (`sid`): the rows of
    `group_by(d, sid).len()`, in (d, sid) order. Counted by NumPy (one `bincount` over a few
    hundred day x series cells) when every sample has a time: a tenth of a hash group-by's."""
    ts = samples.get_column("timestamp")
    if samples.height and not ts.null_count():
        day = _utc_days(ts)
        sid = samples.get_column("sid").to_numpy().astype(np.int64)
        lo, n_sid = int(day.min()), int(sid.max()) + 1
        cells = (int(day.max()) - lo + 1) * n_sid
        if sid.min() >= 0 and cells <= 1 << 20:
            counts = np.bincount((day - lo) * n_sid + sid, minlength=cells)
            at = np.flatnonzero(counts)
            return pl.DataFrame(
                {
                    "d": pl.Series(at // n_sid + lo, dtype=pl.Int32).cast(pl.Date),
                    "sid": pl.Series(at % n_sid).cast(samples.schema["sid"]),
                    "len": pl.Series(counts[at]).cast(pl.get_index_type()),
                }
            )
    day = pl.col("timestamp").dt.date().alias("d")
    return samples.group_by(day, "sid").len().sort("d", "sid", nulls_last=False)


def in_cache_order(samples: pl.DataFrame) -> pl.DataFrame:
    """`samples` in SAMPLES_ORDER. Sorted by time and line first (a file is mostly in time order
    already: cheap), then stably by one integer per day and GPU (the GPU's rank among the file's
    few UUIDs): a quarter of the time of one sort by the four keys, one of them a string."""
    if samples.is_empty():
        return samples
    uuids = samples.get_column("gpu_uuid").drop_nulls().unique().sort()
    ranks = pl.int_range(1, uuids.len() + 1, dtype=pl.Int64, eager=True)
    gpu = pl.col("gpu_uuid").replace_strict(uuids, ranks, default=0)  # no GPU: first
    day = pl.col("timestamp").dt.epoch("ms") // 86_400_000
    return samples.sort("timestamp", "line", nulls_last=False).sort(
        day * (uuids.len() + 1) + gpu, maintain_order=True, nulls_last=False
    )


META_SCHEMA = {
    "source_file": pl.String,
    "file_order": pl.Int32,
    "format": pl.String,
    "time_basis": pl.String,
    "sha256": pl.String,
    "file_bytes": pl.Int64,
    "file_lines": pl.Int64,
    "lines_skipped": pl.Int64,
    "home": pl.Boolean,
    "rows_read": pl.Int64,
    "origin": pl.String,
    "columns_ignored": pl.List(pl.String),
    "fields": pl.List(pl.String),
    "skip_reason": pl.String,
}


@dataclass
class ParsedFile:
    file: LandingFile
    format: str
    lines_total: int
    lines_skipped: int
    time_basis: str
    home_day: date  # where lines with no time of their own are accounted
    days: list[date]
    rows_by_day: dict[date, int]  # samples per UTC day (before duplicates are resolved)
    records_by_day: dict[date | None, int]  # records read per day (None: the home day's own)
    quarantine: pl.LazyFrame
    origin: str | None = None
    columns_ignored: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    skip_reason: str | None = None  # why a listed file was not read (hidden)
    # the GPUs whose device-level fields the file gives on MIG instances' label sets
    # (`ParsedLines.mig_gpus`): their repeats of one time in this file are one reading
    mig_gpus: list[str] = field(default_factory=list)

    # the file as a whole was rejected: refused, unreadable, of no known format, or given up
    # on by its parser (one record, quarantined on the days it names)
    rejected_whole: bool = False
    # the cached samples: (samples file, its series table or None when not keyed) per piece
    pieces: list[tuple[Path, Path | None]] = field(default_factory=list)
    # samples held otherwise (a file not cached; or set: `samples`)
    frames: pl.LazyFrame | None = None

    @property
    def samples(self) -> pl.LazyFrame:
        """The file's samples in the long form (`LONG_SCHEMA`)."""
        if self.frames is not None:
            return self.frames
        if not self.pieces:
            return pl.LazyFrame(schema=LONG_SCHEMA)
        return pl.concat([_piece(s, t) for s, t in self.pieces])

    @samples.setter
    def samples(self, frames: pl.LazyFrame) -> None:
        self.frames = frames

    def rows(self, day: date, uuids: tuple[str, str] | None = None, no_uuid: bool = True):
        """The file's samples of `day` in the long form; with `uuids` (lowest, highest), only
        those of GPUs in that range (and, `no_uuid`, those without a UUID). A cached keyed
        piece reads only the row groups of the range (its `_g`, the GPUs' ranks)."""
        in_day = pl.col("timestamp").dt.date() == day
        if self.frames is not None or not self.pieces:
            rows = self.samples.filter(in_day)
            if uuids is None:
                return rows
            rng = pl.col("gpu_uuid").is_between(pl.lit(uuids[0]), pl.lit(uuids[1]))
            return rows.filter(rng | pl.col("gpu_uuid").is_null() if no_uuid else rng)
        return pl.concat([_piece(s, t, day, uuids, no_uuid) for s, t in self.pieces])

    def touched_days(self) -> list[date]:
        """Every day this file has a ledger row on: its samples', its records' and its home day."""
        return sorted({*self.days, *self.record_days(), self.home_day})

    def record_days(self) -> list[date]:
        """The days this file's records are accounted on (its home day for timeless ones)."""
        days = {d for d, n in self.records_by_day.items() if n and d is not None}
        if self.records_by_day.get(None):
            days.add(self.home_day)
        return sorted(days)

    def records_on(self, day: date) -> int:
        """Records of this file accounted on `day` (the ledger's rows_read)."""
        n = self.records_by_day.get(day, 0)
        return n + (self.records_by_day.get(None, 0) if day == self.home_day else 0)


def read_series(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A keyed piece's series table (one row per sid, in sid order: `sid`, `_g`,
    `SERIES_SCHEMA`) and its samples per day and series (`date`, `sid`, `len`)."""
    table = pl.read_parquet(path, glob=False)  # a lake path may hold [x]*?: read literally
    counts = table.select("date", "sid", "len").drop_nulls("date")
    return table.drop("date", "len").unique("sid", keep="first").sort("sid"), counts


def gpu_ranks(table: pl.DataFrame) -> list[tuple[str, int]]:
    """A piece's GPUs (its series `table`): (UUID, rank `_g`) in UUID order, for `rank_range`."""
    ranks = table.select("gpu_uuid", "_g").drop_nulls("gpu_uuid").unique().sort("gpu_uuid")
    return list(ranks.iter_rows())


def rank_range(ranks: list[tuple[str, int]], uuids: tuple[str, str], no_uuid: bool) -> pl.Expr:
    """The keyed samples of a piece (its `gpu_ranks`) whose GPU's UUID is in `uuids` (lowest,
    highest), and those without a UUID when `no_uuid`: a range of `_g`, the GPUs' ranks (they
    rank in UUID order), which the row groups' statistics prune."""
    g = [r for u, r in ranks if uuids[0] <= u <= uuids[1]]  # code point order: UTF-8 byte order
    lo, hi = (min(g), max(g)) if g else (1, 0)
    keep = pl.col("_g").is_between(lo, hi)
    return keep | (pl.col("_g") == 0) if no_uuid else keep


def _piece(
    samples: Path,
    series: Path | None,
    day: date | None = None,
    uuids: tuple[str, str] | None = None,
    no_uuid: bool = True,
) -> pl.LazyFrame:
    """One cached piece's samples in the long form: of `day` and the GPUs in `uuids` when given."""
    rows = pl.scan_parquet(samples, glob=False)
    if series is None:  # cached in the long form
        if day is not None:
            rows = rows.filter(pl.col("timestamp").dt.date() == day)
        if uuids is not None:
            rng = pl.col("gpu_uuid").is_between(pl.lit(uuids[0]), pl.lit(uuids[1]))
            rows = rows.filter(rng | pl.col("gpu_uuid").is_null() if no_uuid else rng)
        return rows
    table, _ = read_series(series)
    if uuids is not None:
        rows = rows.filter(rank_range(gpu_ranks(table), uuids, no_uuid))
    if day is not None:
        start = int(datetime.combine(day, time(), UTC).timestamp() * 1000)
        t = pl.col("timestamp").dt.epoch("ms")
        rows = rows.filter(t.is_between(start, start + 86_399_999))
    attrs = table.select("sid", *SERIES_SCHEMA).lazy()
    return rows.join(attrs, on="sid", how="left", maintain_order="left").select(list(LONG_SCHEMA))


# a parse being written: `<TMP_PREFIX><pid>-<random>`, renamed to its key when complete
TMP_PREFIX = ".tmp-"


def _cache_key(lf: LandingFile, opts: ParseOptions) -> str:
    # everything that changes what a parse yields: the parser, the content, the path in the
    # landing zone (its name may carry the sample time; a GPU known by its bus id alone is told
    # apart by the file it is in), the modification time (a scrape without any time is filed at
    # it, and so are its timeless records), the options (CSV time zone, size limit) and a
    # headerless CSV's header. Identical bytes in two folders, or landed again later, are two
    # parses: served one another's, a second idle host's scrape was filed at the first one's
    # time and counted as its duplicates (issue 34's adversarial review)
    return hashlib.sha256(
        f"{PARSER_VERSION}\0{lf.sha256}\0{lf.source_file}\0{lf.mtime!r}\0{opts.csv_timezone}"
        f"\0{opts.max_file_bytes}\0{lf.header or ''}".encode()
    ).hexdigest()[:32]


def is_cached(
    lf: LandingFile,
    cache_root: str | os.PathLike,
    opts: ParseOptions = DEFAULT_PARSE,
    shared: SharedCache | None = None,
) -> bool:
    """Need `lf` no parse: never opened, or its parse is cached here or in `shared`."""
    if lf.problem is not None or lf.skipped is not None:
        return True
    if not lf.hashed:
        return False
    key = _cache_key(lf, opts)
    return (Path(cache_root) / key / "meta.json").is_file() or (
        shared is not None and shared.has(key)
    )


def _uncached(lf: LandingFile, fmt: str, parsed) -> ParsedFile:
    """A file that is not cached: never opened (refused, hidden), or not readable this run."""
    return ParsedFile(
        file=lf,
        format=fmt,
        lines_total=parsed.lines_total,
        lines_skipped=0,
        time_basis="sample",
        home_day=home_day([], lf.source_file, lf.mtime),
        days=[],
        rows_by_day={},
        records_by_day=parsed.records_by_day,
        frames=parsed.samples.lazy(),
        quarantine=parsed.quarantine.lazy(),
        skip_reason=lf.skipped,
        rejected_whole=parsed.rejected_whole,
        mig_gpus=parsed.mig_gpus,
    )


def _write_cache(
    lf: LandingFile, cache_root: Path, opts: ParseOptions
) -> tuple[Path, LandingFile] | ParsedFile:
    """Parse `lf` a piece at a time (`PieceParse`: memory follows the piece, not the file), each
    piece's samples written to the cache as they come, and cache the parse under the hash of the
    bytes it read (the listed ones unless the file changed since: then the parse is of the new
    bytes, and `lf` comes back with their hash and size); a file that could not be read this run
    is not cached."""
    # named by the process: a parse stopped midway (`ahead.Ahead.stop`) leaves no folder behind
    tmp = cache_root / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        pp = PieceParse(lf, opts, keyed=True)
        pieces = _write_pieces(pp, tmp)
        if pp.rejected:
            if pp.rejected[1].changed:
                shutil.rmtree(tmp, ignore_errors=True)
                return _uncached(lf, *pp.rejected)
            for f in tmp.iterdir():
                f.unlink()
            pieces = _write_pieces([pp.rejected], tmp)
    except Exception as e:  # noqa: BLE001 - one file's failure stays that file's
        for f in tmp.iterdir():
            f.unlink()
        pieces = _write_pieces(
            [("unreadable", _whole_file(f"could not be parsed: {type(e).__name__}: {e}", ""))],
            tmp,
        )
        pp = None
    if pp is not None and pp.sha256 and pp.sha256 != lf.sha256:
        lf = replace(lf, sha256=pp.sha256, size=pp.size or lf.size)
    if not lf.hashed:  # listed unhashed, and the parse did not read it to its end
        sha = _hash_listed((lf.target or lf.path, lf.ident or _ident(lf.path)))
        if isinstance(sha, OSError):
            shutil.rmtree(tmp, ignore_errors=True)
            why = CHANGED if isinstance(sha, Changed) else f"cannot be read: {sha.strerror or sha}"
            return _uncached(lf, "refused", _whole_file(why, "", changed=True))
        lf = replace(lf, sha256=sha)
    cdir = cache_root / _cache_key(lf, opts)
    if (cdir / "meta.json").is_file():  # these bytes were cached meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return cdir, lf
    meta = _meta(lf, pieces, tmp)
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        tmp.rename(cdir)
    except OSError:  # another run cached the same file meanwhile: same content, keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return cdir, lf


def _meta(lf: LandingFile, pieces: tuple, tmp: Path) -> dict:
    """A cached parse's `meta.json`: its counts, days and files (`_write_pieces`' result)."""
    fmt, parsed, rows_by_day, files = pieces
    days = sorted(rows_by_day)
    return {
        "format": fmt,
        "lines_total": parsed.lines_total,
        "lines_skipped": parsed.lines_skipped,
        "time_basis": parsed.time_basis,
        # timeless records go to the first day with samples, else with records
        "home_day": home_day(
            days or sorted(d for d in parsed.records_by_day if d), lf.source_file, lf.mtime
        ).isoformat(),
        "rejected_whole": parsed.rejected_whole,
        "days": [d.isoformat() for d in days],
        "rows_by_day": {d.isoformat(): n for d, n in rows_by_day.items()},
        "origin": parsed.origin,
        "records_by_day": {
            (d.isoformat() if d else ""): n for d, n in parsed.records_by_day.items()
        },
        "columns_ignored": parsed.columns_ignored,
        "fields": parsed.fields,
        "mig_gpus": parsed.mig_gpus,
        # what was parsed: the content's hash and size as read
        "file_sha256": lf.sha256,
        "file_bytes": lf.size,
        "samples": [f for f in files if f.startswith("samples")],
        # each samples file's series table, when its samples are keyed ("" when not)
        "series": [
            f"series-{f[8:]}" if f"series-{f[8:]}" in files else ""
            for f in files
            if f.startswith("samples")
        ],
        "quarantine": [f for f in files if f.startswith("quarantine")],
        # the cache checks itself: a cached file that no longer has this hash is parsed again
        "sha256": {name: _sha256(tmp / name) for name in files},
    }


# what a written piece keeps of its samples: none (one empty frame for all, ~0.3 ms a file)
_NO_SAMPLES = pl.DataFrame(schema=LONG_SCHEMA)


def _write_pieces(parts, folder: Path) -> tuple[str, ParsedLines, dict, list[str]] | None:
    """Write each piece's samples (in cache order) and quarantine into `folder` as they come:
    (format, the pieces' counts as one parse without frames, samples per day, file names), or
    None when there was no piece."""
    files: list[str] = []
    counts: list[tuple[str, ParsedLines]] = []
    rows_by_day: dict[date, int] = {}
    for i, (fmt, parsed) in enumerate(parts):
        name = f"samples-{i:05d}.parquet"
        day = pl.col("timestamp").dt.date().alias("d")
        if parsed.series is None:
            per_day = parsed.samples.group_by(day).len()
            in_cache_order(parsed.samples).write_parquet(
                folder / name, row_group_size=SAMPLES_ROW_GROUP
            )
        else:
            samples, series = keyed_in_cache_order(parsed.samples, parsed.series)
            # four numbers a sample: uncompressed, half the time of zstd for 2.5x the bytes
            # (~5 % of the text's size), and read back faster (benchmarks/README.md, issue 34)
            samples.write_parquet(
                folder / name, row_group_size=SAMPLES_ROW_GROUP, compression="uncompressed"
            )
            # each series' samples per day beside it: a day's assembly cuts its chunks from them
            # without reading the samples (`keyed_day.KeyedDay.per_file`)
            by_day = series_per_day(samples)
            per_day = by_day.group_by("d").agg(pl.col("len").sum())
            series.join(by_day.rename({"d": "date"}), on="sid", how="left").write_parquet(
                folder / f"series-{i:05d}.parquet"
            )
            files.append(f"series-{i:05d}.parquet")
        per_day = per_day.drop_nulls("d")
        for d, n in zip(per_day["d"].to_list(), per_day["len"].to_list(), strict=True):
            rows_by_day[d] = rows_by_day.get(d, 0) + n
        qname = f"quarantine-{i:05d}.parquet"
        parsed.quarantine.write_parquet(folder / qname)
        files += [name, qname]
        empty = ParsedLines(
            _NO_SAMPLES,
            parsed.quarantine.clear(),
            parsed.lines_total,
            parsed.lines_skipped,
            parsed.time_basis,
            parsed.records_by_day,
            parsed.origin,
            parsed.columns_ignored,
            parsed.fields,
            parsed.rejected_whole,
            mig_gpus=parsed.mig_gpus,
        )
        counts.append((fmt, empty))
        del parsed
    if not counts:
        return None
    fmt, merged = merge_pieces(counts)
    return fmt, merged, dict(sorted(rows_by_day.items())), files


# the cached parses this process wrote or found intact, each with what its files were then
# (`_stamp`): found again unchanged, a parse is not hashed again (a day's run reads the cache
# twice: to plan, then in its ingest step; `make bench-day`'s 168 files: ~0.2 s a pass)
_CHECKED: dict[Path, tuple] = {}


def _stamp(cdir: Path, meta: dict) -> tuple | None:
    """Inode, size, modification and change times of a cached parse's files: a file written,
    replaced or touched since has another (the change time cannot be set back)."""
    try:
        names = ["meta.json", *meta["sha256"]]
        return tuple(
            (n, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            for n in names
            for st in [os.stat(cdir / n, follow_symlinks=False)]
        )
    except (OSError, KeyError, TypeError):
        return None


def checked() -> dict[str, list]:
    """What this process found intact or wrote (`_CHECKED`), as JSON values: for the process
    that started this one's parse (`ahead`), which then need not hash those files again."""
    return {str(cdir): [list(f) for f in stamp] for cdir, stamp in _CHECKED.items()}


def trust_checked(stamps: dict[str, list]) -> None:
    """Take what a parse process of ours found intact or wrote (`checked`): a cached parse whose
    files still have those stamps is not hashed again here."""
    for cdir, stamp in stamps.items():
        _CHECKED[Path(cdir)] = tuple(tuple(f) for f in stamp)


def _cache_intact(cdir: Path, meta: dict) -> bool:
    stamp = _stamp(cdir, meta)
    if stamp is not None and _CHECKED.get(cdir) == stamp:
        return True
    try:
        ok = bool(meta["sha256"]) and all(
            _sha256(cdir / name) == sha for name, sha in meta["sha256"].items()
        )
    except (OSError, KeyError, AttributeError):
        return False
    if ok and stamp is not None:
        _CHECKED[cdir] = stamp
    return ok


def _touches(meta: dict, days: Collection[date] | None) -> bool:
    """Whether a cached parse has a record or sample on one of `days` (None: on any day)."""
    if days is None:
        return True
    touched = {*meta["days"], *(d for d, n in meta["records_by_day"].items() if d and n)}
    touched.add(meta["home_day"])
    return not touched.isdisjoint(d.isoformat() for d in days)


def _day(text: object) -> bool:
    """An ISO date as `_meta` writes it (`date.isoformat`, nothing else)."""
    try:
        return isinstance(text, str) and date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


def _count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _counts(by_day: object, blank: bool = False) -> bool:
    """Counts by ISO day (and by "": timeless records, when `blank`)."""
    return isinstance(by_day, dict) and all(
        (_day(d) or (blank and d == "")) and _count(n) for d, n in by_day.items()
    )


def _strings(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _meta_ok(meta: object) -> bool:
    """Whether `meta` is a cached parse's meta.json as `_meta` writes it: every field of its
    type (days ISO dates, counts whole numbers), and every file it lists a plain file name of
    its folder whose hash it records (`_cache_intact` checks exactly what is read). A copy from
    the object store, or a file damaged on disk, is not trusted otherwise."""
    if not isinstance(meta, dict):
        return False
    m, hashes = meta, meta.get("sha256")
    if not (
        isinstance(hashes, dict) and hashes and all(isinstance(h, str) for h in hashes.values())
    ):
        return False
    samples, series, quarantine = m.get("samples"), m.get("series"), m.get("quarantine")
    if not (_strings(samples) and _strings(series) and _strings(quarantine) and quarantine):
        return False
    listed = [*samples, *(s for s in series if s), *quarantine]
    return (
        len(series) == len(samples)
        and all(plain_name(n) and n in hashes for n in listed)
        and all(plain_name(n) for n in hashes)
        and all(isinstance(m.get(k), str) for k in ("format", "time_basis"))
        and all(_count(m.get(k)) for k in ("lines_total", "lines_skipped"))
        and _day(m.get("home_day"))
        and _strings(m.get("days"))
        and all(_day(d) for d in m["days"])
        and _counts(m.get("rows_by_day"))
        and _counts(m.get("records_by_day"), blank=True)
        and isinstance(m.get("origin"), str | None)
        and all(_strings(m.get(k, [])) for k in ("columns_ignored", "fields", "mig_gpus"))
        and isinstance(m.get("rejected_whole", False), bool)
    )


def _read_meta(meta_path: Path) -> dict | None:
    """A cached parse's meta.json, None when it cannot be read or is not one (`_meta_ok`)."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    return meta if _meta_ok(meta) else None


def _usable(cdir: Path, meta: dict | None, days: Collection[date] | None, shared) -> bool:
    """Whether the cached parse `cdir` (its `meta`, None when unusable) can be read by a run
    of `days`: intact when it holds one of them (fetched first from `shared`, the object
    store's copy); otherwise its quarantine there (every run lists the files rejected whole:
    a scan is never made of a file that is not on disk)."""
    if meta is None:
        return False
    if not _touches(meta, days):  # not read by this run beyond its quarantine: not hashed
        return all((cdir / name).is_file() for name in meta["quarantine"])
    if shared is not None:  # what the run reads of a parse fetched as its meta.json alone
        shared.fetch_files(cdir.name, cdir, list(meta["sha256"]))
    return _cache_intact(cdir, meta)


def load_or_parse(
    lf: LandingFile,
    cache_root: str | os.PathLike,
    opts: ParseOptions = DEFAULT_PARSE,
    days: Collection[date] | None = None,
    shared: SharedCache | None = None,
) -> ParsedFile:
    """The parse of `lf` with `opts`, from the cache when this content was parsed the same way
    before and the cached parse is intact (its Parquet files still have the hashes recorded
    beside them). With `days`, a cached parse with nothing on those days is not checked: the
    run will not read it (a day's run checks what it reads; its work does not grow with the
    landing zone's history: issue 35), beyond its meta.json and that its quarantine is there.
    `shared`: the cache's copy in the lake's object store, looked up before a parse and given
    each new one (`shared_cache`). A damaged, missing or forged parse is parsed again."""
    if lf.problem or lf.skipped:  # nothing to cache: the file is never opened
        fmt, parsed = parse_landing_file(lf, opts)
        return _uncached(lf, fmt, parsed)
    cache_root = Path(cache_root)
    cdir = cache_root / _cache_key(lf, opts)
    meta_path = cdir / "meta.json"
    written = None
    for attempt in range(2):
        if shared is not None and not attempt and lf.hashed and not meta_path.is_file():
            shared.fetch_meta(cdir.name, cdir)  # another machine's parse of these bytes
        # a file listed unhashed is not looked up: its hash comes from its parse
        if not (lf.hashed and meta_path.is_file()):
            written = _write_cache(lf, cache_root, opts)
            if isinstance(written, ParsedFile):
                return written
            cdir, lf = written
            meta_path = cdir / "meta.json"
            if shared is not None:
                shared.put(cdir.name, cdir)
        meta = _read_meta(meta_path)
        if meta is not None and written is not None and not attempt:  # parsed just now
            if (stamp := _stamp(cdir, meta)) is not None:  # its files not hashed again
                _CHECKED[cdir] = stamp
            break
        if _usable(cdir, meta, days, shared):
            _used(cdir)
            break
        # altered, damaged or missing since it was written: parse the file again, never trust it
        shutil.rmtree(cdir, ignore_errors=True)
        if attempt:
            raise RuntimeError(f"ingest cache {cdir} cannot be written intact")
    return _from_meta(lf, cdir, meta)


# A cached parse is removed (`prune`) once no run has used it for this long and it is not the
# parse of a landing file as the run that prunes listed it: the parse of a file since removed,
# replaced or appended to (a live log gets a new parse each time it grew), or made by an older
# parser or with other options. The parse of a log appended to all day was kept for every
# version it had, for ever: the cache grew with the landing zone's history, not its size
# (adversarial review). A day's wait leaves a parse alone while any run that listed its file
# may still read it, and a run with other options (another CSV time zone) keeps its own.
PRUNE_AFTER_S = 24 * 3600
_KEY = re.compile(r"[0-9a-f]{32}")


def _used(cdir: Path) -> None:
    """Mark a cached parse used now (its folder's modification time; `prune` goes by it). The
    files in it keep their stamps (`_stamp`), so nothing is hashed again for it."""
    # a cache this user may read but not write: nothing is pruned by it either
    with contextlib.suppress(OSError):
        os.utime(cdir)


@dataclass(frozen=True)
class Pruned:
    """What `prune` removed: cached parses, left-over temporary folders, and their bytes."""

    parses: int = 0
    temporary: int = 0
    bytes: int = 0


def prune(
    cache_root: str | os.PathLike,
    parsed: Collection[ParsedFile],
    opts: ParseOptions = DEFAULT_PARSE,
    after_s: float = PRUNE_AFTER_S,
    now: float | None = None,
) -> Pruned:
    """Remove the cached parses that are not of `parsed` (every landing file as this run listed
    and parsed it, with `opts`) and that no run has used for `after_s` seconds, and the
    temporary folders a stopped parse left that long ago. Only folders that are the cache's own
    are touched (`_ours`): the hash memo, a remote landing zone's mirror and anything else put
    there stay, whatever their names (adversarial review: a cache folder shared with other
    tools lost their 32-hex-digit folders). The object store's copy of the cache
    (`shared_cache`) is not pruned here."""
    root = Path(cache_root)
    now = time_now() if now is None else now
    keep = {_cache_key(pf.file, opts) for pf in parsed if pf.file.hashed}
    parses = temporary = size = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return Pruned()
    for e in entries:
        if e.name in keep:  # the cheap tests first: a cache of many parses is not read through
            continue
        try:
            if now - e.stat(follow_symlinks=False).st_mtime < after_s:
                continue
            kind = _ours(e)
            if kind is None:
                continue
            folder = sum(f.stat().st_size for f in Path(e.path).iterdir())
        except OSError:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        if not os.path.lexists(e.path):
            parses, temporary = parses + (kind == "parse"), temporary + (kind == "tmp")
            size += folder
    return Pruned(parses, temporary, size)


# what a cached parse's folder holds (`_write_pieces`, `_write_cache`), and a temporary one's name
_FILE = re.compile(r"meta\.json|(samples|series|quarantine)-\d{5}\.parquet")
_TMP = re.compile(re.escape(TMP_PREFIX) + r"\d+-[0-9a-f]{32}")


def _ours(e: os.DirEntry) -> str | None:
    """ "parse" for a folder that is a cached parse (named by its key, its meta.json in it),
    "tmp" for one a parse was writing (`_write_cache`), None for anything else: only plain
    files of the names a parse writes, no folder or link among them."""
    if not e.is_dir(follow_symlinks=False):
        return None
    kind = "parse" if _KEY.fullmatch(e.name) else "tmp" if _TMP.fullmatch(e.name) else None
    if kind is None:
        return None
    try:
        inside = list(os.scandir(e.path))
        if not all(_FILE.fullmatch(f.name) and f.is_file(follow_symlinks=False) for f in inside):
            return None
        if kind == "parse" and "meta.json" not in {f.name for f in inside}:
            return None
    except OSError:
        return None
    return kind


def _from_meta(lf: LandingFile, cdir: Path, meta: dict) -> ParsedFile:
    """The parse of `lf` cached in `cdir`, as its meta.json (checked: `_meta_ok`) says."""
    return ParsedFile(
        file=lf,
        format=meta["format"],
        lines_total=meta["lines_total"],
        lines_skipped=meta["lines_skipped"],
        time_basis=meta["time_basis"],
        home_day=date.fromisoformat(meta["home_day"]),
        days=[date.fromisoformat(d) for d in meta["days"]],
        rows_by_day={date.fromisoformat(d): n for d, n in meta["rows_by_day"].items()},
        records_by_day={
            (date.fromisoformat(d) if d else None): n for d, n in meta["records_by_day"].items()
        },
        pieces=[
            (cdir / f, cdir / t if t else None)
            for f, t in zip(meta["samples"], meta["series"], strict=True)
        ],
        quarantine=pl.scan_parquet([cdir / f for f in meta["quarantine"]], glob=False),
        origin=meta.get("origin"),
        columns_ignored=meta.get("columns_ignored", []),
        fields=meta.get("fields", []),
        rejected_whole=meta.get("rejected_whole", False),
        mig_gpus=meta.get("mig_gpus", []),
    )


# files at most this large are parsed a few at a time; larger ones one by one (a parse holds
# about twice its file in memory)
CONCURRENT_PARSE_BYTES = 64 * 2**20
# one file more than cores (at most 4): while one parse runs Python (under the GIL), the others
# keep Polars' threads busy (measured: benchmarks/README.md, "Measurements behind the code")
PARSE_WORKERS = max(1, min(4, (os.cpu_count() or 1) + 1))


def parse_all(
    files: list[LandingFile],
    cache_root: str | os.PathLike,
    opts: ParseOptions = DEFAULT_PARSE,
    done: Callable[[LandingFile, ParsedFile], None] | None = None,
    days: Collection[date] | None = None,
    shared: SharedCache | None = None,
) -> list[ParsedFile]:
    """`load_or_parse` of every file, in order. The files not cached yet are parsed first, the
    small ones `PARSE_WORKERS` at a time (a file of one host keeps Polars' threads busy only part of
    the time), each large one alone; `done(file, parsed)` is called as each is cached. `days`:
    the days the caller will read, `shared` the cache's copy in the object store (`load_or_parse`)."""
    todo = [i for i, f in enumerate(files) if not is_cached(f, cache_root, opts, shared)]
    parsed: dict[int, ParsedFile] = {}

    def one(i: int) -> None:
        parsed[i] = load_or_parse(files[i], cache_root, opts, days, shared)
        if done:
            done(files[i], parsed[i])

    small = [i for i in todo if files[i].size <= CONCURRENT_PARSE_BYTES]
    if len(todo) > 1:  # their series parsed in one table first: not ~70 small queries a file
        learn_series([files[i] for i in todo])
    try:
        if small:
            with ThreadPoolExecutor(PARSE_WORKERS) as pool:
                list(pool.map(one, small))
        for i in todo:
            if files[i].size > CONCURRENT_PARSE_BYTES:
                one(i)
    finally:
        forget_series()
    # the files parsed just now are not read back; the others come from the cache
    return [
        parsed.get(i) or load_or_parse(f, cache_root, opts, days, shared)
        for i, f in enumerate(files)
    ]
