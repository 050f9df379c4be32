"""The Parquet lake: `<root>/<table>/date=YYYY-MM-DD/data.parquet`, one file per partition.

A partition's day is its folder's name: the file holds every column of the table's contract but
`date`, which readers add from the folder (`read`, `read_days`, `scan_days` here; hive
partitioning in DuckDB, pandas/pyarrow, Polars and Spark). A file that also held `date` would
make pyarrow (and so pandas) refuse the folder: the column in the files and the one from the
folder names would not merge. Partitions written before still hold it, and still read.

A partition is one file. On a local disk it is written beside its final name and swapped in with
an atomic rename; on an object store (`s3://bucket/prefix`, credentials and endpoint from the
usual AWS_* variables) it is written locally and uploaded in one go, which stores publish
atomically. Either way a reader, or a run killed mid-write, sees a complete previous or new
version. Rows are sorted by the caller and nothing run-specific is written, so a re-run gives
the same bytes.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from gpu_pipeline.lib.ingest.shared_cache import SharedCache
from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import TABLES
from gpu_pipeline.settings import parse_cache_dir

if TYPE_CHECKING:
    import pyarrow.parquet as pq

DATA_FILE = "data.parquet"
# the column a partition's folder names (`date=YYYY-MM-DD`), not stored in its file
PARTITION_COLUMN = "date"
# earlier versions kept a zero-row schema file in `<table>/_schema/`; a table's folder now holds
# nothing but its `date=` partitions (any engine reads `<table>/*/*.parquet` with hive partitioning)
LEGACY_SCHEMA_DIR = "_schema"
_SAFE = re.compile(r"^[a-z_][a-z0-9_]*$")
_PARTITION = re.compile(r"date=(\d{4}-\d{2}-\d{2})")
# zstd level 2, not Polars' default 3: faster to encode for a few more bytes (level 1: many more
# bytes; measured on a day of gpu_minutes: benchmarks/README.md, "Measurements behind the code")
# Row groups of 131,072 rows: a streamed write (`write_frames`) holds a row group's rows until
# it is full, beside the chunks being computed; 262,144 held 36 MiB more in the 10,000-GPU
# staging pass, for no speed (benchmarks/README.md, issue 34), and a chunk of GPUs read back
# (`chunked.plan`) over-reads less of its first and last row group.
WRITE_OPTIONS = {
    "compression": "zstd",
    "compression_level": 2,
    "statistics": True,
    "row_group_size": 131072,
}


def is_uri(root: str | os.PathLike) -> bool:
    return "://" in str(root)


# the Parquet key under which a partition names the ingest it was made from
LINEAGE_KEY = "gpu_pipeline.ingest"


def _lineage_meta(lineage: str | None) -> dict:
    return {"metadata": {LINEAGE_KEY: lineage}} if lineage else {}


# a write's temporary file not touched for this long was left by a killed write (a live one is
# written to continuously, then renamed at once)
STRAY_AFTER_S = 60.0


def _remove_stray(folder: Path, pattern: str) -> None:
    """Remove temporary files killed writes left in `folder` (untouched for STRAY_AFTER_S)."""
    now = time.time()
    for stray in folder.glob(pattern):
        try:
            if now - stray.stat().st_mtime > STRAY_AFTER_S:
                stray.unlink()
        except OSError:
            pass  # another writer took care of it


def replace_file(final: Path, write: Callable[[Path], None]) -> None:
    """Write the local file `final` atomically: `write(tmp)` makes it beside `final` under a
    fresh name, and it is renamed over `final`. A link at `final` is replaced, never followed
    (a report or showback file linked to a file outside the lake overwrote that file:
    adversarial review); if `write` fails, the previous version stays. Temporary files a killed
    write left are removed once old (`STRAY_AFTER_S`)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stray(final.parent, f".{final.name}.*.tmp")
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def partition_day(name: str) -> date | None:
    """The day a partition folder's name holds: exactly `date=YYYY-MM-DD`, a real day (not
    `date=2024-01-02.bak`, `date=20240102` or `date=2024-02-30`); None for any other name."""
    m = _PARTITION.fullmatch(name)
    if m is None:
        return None
    try:
        return date.fromisoformat(m.group(1))
    except ValueError:
        return None


def _stored_schema(schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    """A table's contract as its files hold it: without the partition's `date`."""
    return {c: t for c, t in schema.items() if c != PARTITION_COLUMN}


def _with_day(lf: pl.LazyFrame, table: str, day: date) -> pl.LazyFrame:
    """A partition's frame with its `date` first, as the table's contract has it: the day of its
    folder, or the file's own `date` (partitions written before the day left the files)."""
    if table not in TABLES or PARTITION_COLUMN in lf.collect_schema().names():
        return lf
    return lf.select(pl.lit(day, dtype=pl.Date).alias(PARTITION_COLUMN), pl.all())


class DamagedPartition(ValueError):
    """A partition's file that is not readable Parquet (cut short, overwritten, not Parquet at
    all, or pages that do not decode behind a sound footer): the message names the table, the
    day and the file, and what to do about it. Raised by every read of the lake (`read`,
    `read_days`, `scan_days`, and the collection of a scan inside `Lake.reading`), so a caller
    never shows the Parquet reader's own error, which names neither."""

    def __init__(self, table: str, day: date, path: Path | str, why: object):
        self.table, self.day, self.path = table, day, path
        self.why = " ".join(str(why).split())[:300]  # the reader's words, on one line
        # what to do comes before the reader's words: a run's one-line failure cuts at 300
        super().__init__(
            f"the {table} partition of {day} is damaged: {path} is not readable Parquet; "
            f"materialize the day again (gpu-pipeline materialize --start {day} "
            f"--replace-missing) or delete the file (Parquet reader: {self.why})"
        )

    def __reduce__(self):  # crosses process boundaries (a step's process, a pool) whole
        return type(self), (self.table, self.day, self.path, self.why)


def _unreadable() -> tuple[type[Exception], ...]:
    """What the Parquet readers raise for a file that is not readable Parquet: Polars'
    ComputeError (a local file), pyarrow's ArrowInvalid (one in an object store)."""
    import pyarrow as pa

    return (pl.exceptions.ComputeError, pa.ArrowInvalid)


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a file of the lake may raise, damaged pages among other causes (a query's
    own error, a file gone, an unreachable store): Polars' errors and panics (a panic is no
    Exception), pyarrow's, and OSError. Which it is, `Lake.reading` finds out."""
    import pyarrow as pa

    return (pl.exceptions.PolarsError, pl.exceptions.PanicException, pa.ArrowException, OSError)


class Lake:
    def __init__(self, root: str | os.PathLike, cache: str | os.PathLike | None = None):
        """`cache`: where parsed landing files are kept (local disk); default beside the lake,
        or under `data/cache/` for a lake in an object store."""
        self.uri = str(root)
        self.cache = Path(cache) if cache else None
        self.remote = is_uri(root)
        if self.remote:
            import pyarrow.fs as pafs

            self.fs, self.base = pafs.FileSystem.from_uri(self.uri)
            self.root = self.uri
        else:
            self.fs, self.base = None, None
            self.root = Path(root)

    # -- paths -------------------------------------------------------------------------------
    def table_dir(self, table: str) -> Path | str:
        if not _SAFE.match(table):
            raise ValueError(f"not a table name: {table!r}")
        return f"{self.base}/{table}" if self.remote else self.root / table

    def partition_file(self, table: str, day: date) -> Path | str:
        d = self.table_dir(table)
        name = f"date={day.isoformat()}"
        return f"{d}/{name}/{DATA_FILE}" if self.remote else d / name / DATA_FILE

    @property
    def cache_dir(self) -> Path:
        """Parsed landing files; always on local disk (`cache`, else beside the lake)."""
        return parse_cache_dir(self.uri, str(self.cache or ""))

    @property
    def shared_cache(self) -> SharedCache | None:
        """For a lake in an object store, the parse cache's copy beside it
        (`<lake>/_ingest_cache/`): what one machine parsed, another need not parse again."""
        return SharedCache(self.fs, f"{self.base}/_ingest_cache") if self.remote else None

    # -- writing -----------------------------------------------------------------------------
    def _publish(self, final: Path | str, write: Callable[[Path], None]) -> None:
        """Publish the file `write(path)` produces at `final` atomically: written beside it and
        renamed into place (local), or written to a local staging file and uploaded in one go
        (object store). If `write` fails, the previous version stays."""
        if not self.remote:
            replace_file(final, write)
            return
        staging = self.cache_dir / "_upload"
        staging.mkdir(parents=True, exist_ok=True)
        _remove_stray(staging, "*.parquet")
        tmp = staging / f"{uuid.uuid4().hex}.parquet"
        try:
            write(tmp)
            if self.uri.startswith("s3://"):  # a day's lock lost meanwhile: stop, publish nothing
                from gpu_pipeline.lib.io.s3lock import check_held

                check_held(self.uri)
            self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
            with open(tmp, "rb") as src, self.fs.open_output_stream(final) as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        finally:
            tmp.unlink(missing_ok=True)

    def put_report(self, name: str, local: Path) -> str | None:
        """Beside an object-store lake, a copy of the report file `local` at
        `<lake>/_reports/<name>` (its URI); None for a local lake (its reports are in it)."""
        uri = self.report_uri(name)
        if uri is None:
            return None
        final = f"{self.base}/_reports/{name}"
        self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        with open(local, "rb") as src, self.fs.open_output_stream(final) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        return uri

    def report_uri(self, name: str) -> str | None:
        """Where an object-store lake keeps the report file `name` (`put_report`); None for a
        local lake (its reports are in `settings.reports_dir`)."""
        if not self.remote:
            return None
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
            raise ValueError(f"not a report name: {name!r}")
        return f"{self.uri.rstrip('/')}/_reports/{name}"

    def _replace(self, final: Path | str, df: pl.DataFrame, lineage: str | None = None) -> None:
        """Publish `df` at `final` atomically."""
        self._publish(
            final, lambda path: df.write_parquet(path, **WRITE_OPTIONS, **_lineage_meta(lineage))
        )

    def write_frames(
        self,
        table: str,
        day: date,
        frames: Iterable[pl.DataFrame],
        lineage: str | None = None,
    ) -> tuple[Path | str, int]:
        """Replace the day's partition of `table` with the frames one after another, streamed
        into one file: only one frame is in memory at a time. Returns the file and its rows.

        Published like `write`, once every frame is written; an error in a frame leaves the
        previous version.
        """
        from polars.io.plugins import register_io_source

        schema = TABLES[table]
        stored = _stored_schema(schema)
        self._drop_legacy(table)
        rows = 0

        def source(*_):
            nonlocal rows
            for df in frames:
                df = conform(df, stored)
                rows += df.height
                yield df

        final = self.partition_file(table, day)
        self._publish(
            final,
            lambda path: register_io_source(source, schema=stored).sink_parquet(
                path, **WRITE_OPTIONS, **_lineage_meta(lineage)
            ),
        )
        return final, rows

    def _drop_legacy(self, table: str) -> None:
        """Remove the zero-row `_schema` folder earlier versions kept beside the partitions."""
        if self.remote:
            return
        legacy = self.table_dir(table) / LEGACY_SCHEMA_DIR
        if legacy.is_dir():
            shutil.rmtree(legacy, ignore_errors=True)

    def write(
        self, table: str, day: date, df: pl.DataFrame, lineage: str | None = None
    ) -> Path | str:
        """Replace the day's partition of `table` with `df` (conformed to the table's contract,
        without `date`: the folder names the day). `lineage`: the ingest the partition was made
        from, kept in the file (`lineage()`)."""
        if table in TABLES:
            df = conform(df, _stored_schema(TABLES[table]))
            self._drop_legacy(table)
        final = self.partition_file(table, day)
        self._replace(final, df, lineage)
        return final

    def row_count(self, table: str, day: date) -> int | None:
        """The rows of the day's partition, from its file's footer (None: no partition)."""
        meta = self.footer(table, day)
        return None if meta is None else meta.num_rows

    def lineage(self, table: str, day: date) -> str | None:
        """Which ingest of the day the partition was made from (written by `write`): an id of
        the day's raw tables' run and day; None without a partition or an id."""
        path = self.partition_file(table, day)
        try:
            if self.remote:
                import pyarrow.parquet as pq

                meta = pq.read_metadata(path, filesystem=self.fs).metadata or {}
                value = meta.get(LINEAGE_KEY.encode())
                return value.decode() if value else None
            return pl.read_parquet_metadata(path).get(LINEAGE_KEY)
        except (OSError, pl.exceptions.PolarsError):
            return None

    # -- one writer per day ------------------------------------------------------------------
    @contextmanager
    def day_locks(self, days: Iterable[date], waiting: Callable[[date], None] | None = None):
        """Hold an exclusive lock on each of these days (`<lake>/_locks/<day>.lock`) until the
        block ends: two runs of one day write its tables one after the other, never mixed.
        Days are locked in order, so two runs over overlapping ranges never deadlock; a lock is
        released by the kernel when its process dies. An S3 lake's day is locked by an object
        created only if absent, renewed while held, taken over when its holder stopped renewing
        it (`s3lock.py`); other object stores are not locked."""
        if self.remote:
            if self.uri.startswith("s3://"):
                from gpu_pipeline.lib.io.s3lock import s3_day_locks

                with s3_day_locks(self.uri, days, waiting):
                    yield
            else:
                yield
            return
        folder = self.root / "_locks"
        folder.mkdir(parents=True, exist_ok=True)
        fds: list[int] = []
        try:
            for day in sorted(set(days)):
                fd = os.open(folder / f"{day.isoformat()}.lock", os.O_CREAT | os.O_RDWR, 0o644)
                fds.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if waiting:
                        waiting(day)
                    fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            for fd in fds:
                os.close(fd)  # closing the descriptor releases its lock

    # -- reading -----------------------------------------------------------------------------
    def _exists(self, path: Path | str) -> bool:
        if self.remote:
            import pyarrow.fs as pafs

            return self.fs.get_file_info(path).type == pafs.FileType.File
        return Path(path).is_file()

    def _read(self, path: Path | str) -> pl.DataFrame:
        """The file's columns as stored (a partition's day is not among them: see `read`)."""
        if self.remote:
            import pyarrow.parquet as pq

            # one file: no partitioning is discovered from its path
            return pl.from_arrow(pq.read_table(path, filesystem=self.fs, partitioning=None))
        return pl.read_parquet(path, glob=False)  # a path is a path, never a pattern

    def exists(self, table: str, day: date) -> bool:
        return self._exists(self.partition_file(table, day))

    def footer(self, table: str, day: date) -> pq.FileMetaData | None:
        """The Parquet footer of the day's partition of `table` (its rows, row groups and their
        statistics), read without a row, on disk or in the object store; None without one."""
        import pyarrow.parquet as pq

        path = self.partition_file(table, day)
        try:
            fs = {"filesystem": self.fs} if self.remote else {}
            return pq.read_metadata(path, **fs)
        except (OSError, ValueError):
            return None

    def _undecodable(self, path: Path | str) -> BaseException | None:
        """The reader's error if a page of the file does not decode, found by decoding every
        column of every row group, nothing kept (Polars' streaming engine on a local file; for
        one in an object store, its bytes fetched once, then pyarrow a row group at a time);
        None when all decode, or when the file cannot be had at all (gone, an unreachable
        store): then it is not known to be damaged. Only ever after a read failed."""
        if not self.remote:
            try:
                pl.scan_parquet(path, glob=False).select(pl.all().null_count()).collect(
                    engine="streaming"
                )
            except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
                return e
            except OSError:
                return None  # gone, unreadable disk: not a file whose bytes do not decode
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            with self.fs.open_input_file(path) as f:
                data = f.read()
        except OSError:
            return None  # the store, not the file
        try:
            pf = pq.ParquetFile(pa.BufferReader(data))
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
        except (pa.ArrowException, OSError) as e:
            return e
        return None

    @contextmanager
    def reading(self, table: str | tuple[str, ...], days: Iterable[date]):
        """Collect frames that scan these days of `table` (`scan_days`) inside this block: a
        file whose footer reads but whose pages do not decode (bytes overwritten inside a
        column chunk) fails only there, with the Parquet reader's error, which names no file
        (nor which file of a scan of several days). Such an error becomes the DamagedPartition
        of the first of the days whose file does not decode (each read again, only after the
        failure: a read that succeeds costs nothing more); an error no file explains (a
        query's own, an unreachable store) passes as it is. `table`: one, or the tables the
        block scans (each day's file of each is checked, in that order)."""
        days = list(days)
        try:
            yield
        except DamagedPartition:
            raise
        except _read_errors():
            for name in (table,) if isinstance(table, str) else table:
                for day in days:
                    if not self.exists(name, day):
                        continue
                    path = self.partition_file(name, day)
                    why = self._undecodable(path)
                    if why is not None:
                        raise DamagedPartition(name, day, path, why) from None
            raise

    def read(self, table: str, day: date) -> pl.DataFrame:
        """The day's partition with its `date` (from the folder; a file written before `date`
        left the files keeps its own). DamagedPartition when its file is not readable Parquet."""
        path = self.partition_file(table, day)
        with self.reading(table, [day]):  # pages pyarrow (an object store) cannot decode
            try:
                return _with_day(self._read(path).lazy(), table, day).collect()
            except _unreadable() as e:
                raise DamagedPartition(table, day, path, e) from None

    def _scan(self, table: str, day: date, path: Path | str) -> pl.LazyFrame:
        """The day's partition as a lazy frame with its `date`; its footer is read now, so a
        file that is not Parquet (cut short, overwritten) is a DamagedPartition here, not an
        error of the Parquet reader where the frame is collected. (A local file whose footer
        reads but whose pages do not fails only when collected: see `reading`; a file in an
        object store is read now, its pages too.)"""
        with self.reading(table, [day]):
            try:
                lf = self._read(path).lazy() if self.remote else pl.scan_parquet(path, glob=False)
                if table not in TABLES:
                    lf.collect_schema()  # the footer (`_with_day` reads it for a contract's table)
                return _with_day(lf, table, day)
            except _unreadable() as e:
                raise DamagedPartition(table, day, path, e) from None

    def read_days(self, table: str, days: list[date]) -> pl.DataFrame:
        """The given days of `table`, read now (one version of each, even if a run replaces a
        partition later): for reads of days another run may be writing."""
        frames = [self.read(table, d) for d in days if self.exists(table, d)]
        return (
            pl.concat(frames, how="diagonal_relaxed")
            if frames
            else pl.DataFrame(schema=TABLES[table])
        )

    def scan_days(self, table: str, days: list[date]) -> pl.LazyFrame:
        """The given days of `table` that exist, as one frame (an empty, typed frame if none do),
        each with its `date` (see `read`). Collected inside `reading(table, days)`, a file
        whose pages do not decode is a DamagedPartition too."""
        found = [(d, self.partition_file(table, d)) for d in days if self.exists(table, d)]
        if not found:
            return pl.LazyFrame(schema=TABLES[table])
        frames = [self._scan(table, d, f) for d, f in found]
        # partitions of one version have one schema (a plain concat); older ones may lack columns
        same = all(f.collect_schema() == frames[0].collect_schema() for f in frames[1:])
        return pl.concat(frames, how="vertical" if same else "diagonal_relaxed")

    def days(self, table: str) -> list[date]:
        if self.remote:
            import pyarrow.fs as pafs

            infos = self.fs.get_file_info(
                pafs.FileSelector(self.table_dir(table), allow_not_found=True)
            )
            names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
            names = [n for n in names if self._exists(f"{self.table_dir(table)}/{n}/{DATA_FILE}")]
        else:
            d = self.table_dir(table)
            names = [p.parent.name for p in d.glob(f"date=*/{DATA_FILE}")] if d.is_dir() else []
        return sorted(d for d in map(partition_day, names) if d is not None)
