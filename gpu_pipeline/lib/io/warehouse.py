"""DuckDB over the lake: the views file (views only) and read-only analyst queries.

One view per lake table, generated from the column contract (`schemas.TABLES`): a typed empty
relation unioned by name with the table's partitions, so every view has every contract column
whether or not a partition exists yet or was written before a column was added.
A partition's `date` is its folder's day (DuckDB's hive partitioning, typed DATE; files written
before the day left them hold it too, and the folder's day wins), or, for a lake below a
`key=value` folder of its own, read from the file's `date=` folder by name. A link from a
partition to a file in any other folder is skipped: its day would be read from that folder.

Which files a view reads (`scan_partitions`): `<lake>/<table>/date=YYYY-MM-DD/data.parquet` with a
real day in the name and a Parquet file behind it (the PAR1 magic at both ends and a footer length
that fits; DuckDB's own read of the footer when the view cannot be built). Anything else in a
table's folder (`date=2024-01-02.bak`, `date=20240102`, a truncated file) is skipped with a
warning naming it. A table folder or partition that is a link to outside the lake makes the lake
refused (`LakeError`).

- `gpu-pipeline sql` builds the views in memory, each listing its table's checked files; SQL may
  read exactly those files (DuckDB `allowed_paths`) and nothing else.
- The views file (`build_views_file`, for any DuckDB client) globs
  `<table>/date=[0-9]…/data.parquet`, so days written later are read without a rebuild; a table
  with a partition the glob would match but cannot be read lists its good files instead. The
  file records (in a view's comment) which tables had data and which were listed; a file that no
  longer matches its lake is rebuilt (`materialize`, the `warehouse_views` asset).

The `.duckdb` file holds only views, so it is rebuilt freely; analysts open it read-only.

A lake in an object store (`s3://…`) has neither: DuckDB reads object storage only through its
`httpfs` extension, which cannot be downloaded here. `scan_partitions` (so `gpu-pipeline sql` and
`build_views_file`) refuses such a lake with `object_store_note`, which says how to read it
instead (Polars); the `warehouse_views` asset records that note and writes no file.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from gpu_pipeline.lib.io.lake import DATA_FILE, LEGACY_SCHEMA_DIR, partition_day
from gpu_pipeline.lib.schemas import TABLES

# shipped inside the package (`sql/` at the repository root links here)
SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
VIEWS_SQL = SQL_DIR / "views.sql"
QUERIES_DIR = SQL_DIR / "queries"
# PRAGMAs that only describe the database (others change settings or write profiler output)
READ_PRAGMAS = {
    "table_info",
    "show",
    "show_tables",
    "show_tables_expanded",
    "version",
    "platform",
    "database_list",
    "database_size",
    "storage_info",
    "functions",
}
# the words an EXPLAIN option list may hold: FORMAT and its names (ANALYZE, in any spelling or
# quoting, runs the statement explained)
EXPLAIN_OPTION_WORDS = {"format", "text", "json", "html", "graphviz", "yaml", "mermaid", ","}
# the views file's record of its lake, kept in the comment of one table's view: a view of its
# own would show in SHOW TABLES
STATE_ON = "gpu_samples"
STATE_PREFIX = "gpu_pipeline lake state: "
# the partitions a views-file glob reads: the digits of date=YYYY-MM-DD (DuckDB globs have no
# repetition; a name like date=2024-02-30 matches, and its table is then listed instead)
PARTITION_GLOB = "date=[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]/" + DATA_FILE
_GLOBBED = re.compile(r"date=\d{4}-\d{2}-\d{2}")
# an error shows DuckDB's hints (Did you mean, candidate columns, the line and caret), bounded
ERROR_LINES, ERROR_WIDTH = 8, 300
# analyst SQL read from a file or stdin: at most this many bytes
SQL_MAX_BYTES = 1 << 20

assert STATE_ON in TABLES


class SqlError(ValueError):
    """A query the analyst interface refuses or DuckDB cannot run."""


class LakeError(SqlError):
    """A lake the analyst interface refuses to read (a link out of it, an object store)."""


def is_object_store(lake: str | os.PathLike) -> bool:
    """Is `lake` a URI (`s3://bucket/prefix`), not a local folder?"""
    return "://" in str(lake)


def object_store_note(lake: str | os.PathLike) -> str:
    """One line: why an object-store lake has no DuckDB views (file or `gpu-pipeline sql`), and
    how to read it instead."""
    lake = str(lake).rstrip("/")
    return (
        f"{lake} is a lake in an object store: `gpu-pipeline sql` and the DuckDB views file serve "
        "local lakes only (DuckDB reads object storage only through its httpfs extension, not "
        f'available here); read it with Polars, pl.scan_parquet("{lake}/<table>/date=*/'
        'data.parquet", hive_partitioning=True), or with a DuckDB that has httpfs '
        "(docs/deploy.md, Object storage)"
    )


_NOT_IN_PATHS = "\n\r\x00*?[]{}"  # line breaks, NUL and what DuckDB reads as a glob


def _quote_path(root: Path) -> str:
    s = root.as_posix()
    if any(ch in s for ch in _NOT_IN_PATHS):
        raise SqlError(f"lake path has characters not allowed in a path glob: {s!r}")
    return s.replace("'", "''")


def duck_type(dt: pl.DataType) -> str:
    """The DuckDB type a Parquet column of this Polars type reads as."""
    if isinstance(dt, pl.Datetime):
        return "TIMESTAMP WITH TIME ZONE" if dt.time_zone else "TIMESTAMP"
    if isinstance(dt, pl.List):
        return f"{duck_type(dt.inner)}[]"
    if isinstance(dt, pl.Struct):
        return "STRUCT(" + ", ".join(f'"{f.name}" {duck_type(f.dtype)}' for f in dt.fields) + ")"
    if isinstance(dt, pl.Enum | pl.Categorical):
        return "VARCHAR"
    return {
        pl.String: "VARCHAR",
        pl.Boolean: "BOOLEAN",
        pl.Date: "DATE",
        pl.Float64: "DOUBLE",
        pl.Float32: "FLOAT",
        pl.Int64: "BIGINT",
        pl.Int32: "INTEGER",
        pl.UInt32: "UINTEGER",
        pl.UInt64: "UBIGINT",
    }[dt.base_type()]


# -- which files the views read --------------------------------------------------------------


@dataclass
class Partitions:
    """What the views of a lake read: each table's partition files (real paths, by day), the
    entries skipped and why, and the tables a glob cannot stand for."""

    root: Path  # the lake's real path
    files: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    listed: set[str] = field(default_factory=set)

    def table_dirs(self) -> list[Path]:
        """The table folders (real paths) of the tables with data."""
        return [self.root / t for t in TABLES if self.files.get(t)]

    def all_files(self) -> list[str]:
        return [f for t in TABLES for f in self.files.get(t, [])]


def parquet_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a Parquet file DuckDB can open (None: it looks like one). Cheap: the
    PAR1 magic at both ends and a footer length that fits, two small reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size < 12:
            return f"not Parquet ({st.st_size} bytes)"
        head, tail = os.pread(fd, 4, 0), os.pread(fd, 8, st.st_size - 8)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    finally:
        os.close(fd)
    if head != b"PAR1" or tail[4:] != b"PAR1":
        return "not Parquet (no PAR1 magic at both ends: truncated or another format)"
    if not 0 < int.from_bytes(tail[:4], "little") <= st.st_size - 12:
        return "not Parquet (its footer length does not fit the file)"
    return None


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(path))


def _link_out(path: str | Path, real: str | Path, root: Path) -> LakeError:
    return LakeError(
        f"{path} is a link to {real}, outside the lake {root}: a lake's table folders and "
        "partitions must be inside it (replace the link with the folder or file itself)"
    )


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def scan_partitions(lake_root: str | Path) -> Partitions:
    """Each table's readable partitions; what is skipped and why. LakeError when a table folder,
    a `date=` folder or a `data.parquet` is a link to outside the lake.

    Links are resolved only where there are links (a `date=` folder or `data.parquet` that is
    one): a lake without links costs one open and two small reads per partition. A lake in an
    object store is refused (LakeError, `object_store_note`): read as a local path, it would be
    an empty folder below the working directory, and every view empty."""
    if is_object_store(lake_root):
        raise LakeError(object_store_note(lake_root))
    root = _real(lake_root)
    _quote_path(root)
    parts = Partitions(root)
    root_s = root.as_posix()
    for table in TABLES:
        parts.files[table] = []
        td = root / table
        if not os.path.lexists(td):
            continue
        real_td = _real(td)
        if not _inside(real_td.as_posix(), root_s):
            raise _link_out(td, real_td, root)
        if real_td != td:  # a link to another folder of the lake (another table's, the cache)
            parts.skipped.append((str(td), f"a link to {real_td}, not a table folder"))
            continue
        try:
            entries = sorted(os.scandir(td), key=lambda e: e.name)
        except OSError as e:
            parts.skipped.append((str(td), f"cannot be listed ({e.strerror})"))
            continue
        td_s = td.as_posix()
        seen: dict[str, str] = {}
        for entry in entries:
            if entry.name == LEGACY_SCHEMA_DIR:
                continue  # an earlier version's schema folder, dropped at the next write
            if partition_day(entry.name) is None:
                parts.skipped.append((entry.path, "not a date=YYYY-MM-DD partition"))
                if _GLOBBED.fullmatch(entry.name):
                    parts.listed.add(table)
                continue
            file = f"{entry.path}/{DATA_FILE}"
            try:
                linked = entry.is_symlink() or stat.S_ISLNK(os.lstat(file).st_mode)
            except OSError:
                continue  # no data.parquet: a day being written for the first time
            real = os.path.realpath(file) if linked else file
            if not _inside(real, root_s):  # a broken link too: it may be made to work later
                raise _link_out(entry.path if entry.is_symlink() else file, real, root)
            why = None
            if not _inside(real, td_s):
                why = f"a link to {real}, outside its table folder"
            elif linked and os.path.dirname(real) != f"{td_s}/{entry.name}":
                # the day is read from the folder the file is in (hive partitioning)
                why = f"a link to {real}, outside its own {entry.name} folder"
            elif any(ch in real for ch in _NOT_IN_PATHS):
                why = f"a link to {real}, a path DuckDB would read as a glob"
            elif real in seen:
                why = f"the same file as {seen[real]}"
            else:
                why = parquet_problem(real)
            if why is not None:
                parts.skipped.append((file, why))
                parts.listed.add(table)
                continue
            seen[real] = file
            parts.files[table].append(real)
    return parts


# -- the views -----------------------------------------------------------------------------------


def _file_literal(path: str) -> str:
    """A file path as a SQL string literal (a glob character would make DuckDB glob it)."""
    if any(ch in path for ch in _NOT_IN_PATHS):
        raise SqlError(f"a partition path has characters not allowed in a path: {path!r}")
    return "'" + path.replace("'", "''") + "'"


def hive_safe(root: Path) -> bool:
    """Can DuckDB's hive partitioning read the partitions below `root`: no folder of its path
    is named like `key=value` (DuckDB reads every such folder of a file's path as a column, the
    first one of a name winning: `/backup/date=2020-01-01/lake` would give every row that day)."""
    return not any("=" in part for part in Path(root).parts)


# the column naming a file, in views over a lake whose path is not hive-safe
_FILE_COLUMN = "gpu_pipeline_file"
_DAY_OF_FILE = r"/date=([0-9]{4}-[0-9]{2}-[0-9]{2})/[^/]*$"


def table_view_sql(
    table: str, source: str | list[str] | None, root: str | Path | None = None
) -> str:
    """The view of `table` over `source`: a glob (SQL-quoted already), a list of files, or
    nothing (the typed empty relation alone: DuckDB cannot glob nothing).

    A partition's `date` is its folder's day (hive partitioning, typed DATE); files written
    before the day left them still hold a `date` column, which the folder's day overrides. Over a
    lake `root` whose path has `key=value` folders of its own, the day is taken from the file's
    `date=` folder by name instead."""
    cols = ", ".join(f'CAST(NULL AS {duck_type(t)}) AS "{c}"' for c, t in TABLES[table].items())
    typed = f"SELECT {cols} WHERE false"
    if not source:
        return f"CREATE OR REPLACE VIEW {table} AS {typed}"
    files = (
        f"'{source}'" if isinstance(source, str) else f"[{', '.join(map(_file_literal, source))}]"
    )
    if root is None or hive_safe(Path(root)):
        return (
            f"CREATE OR REPLACE VIEW {table} AS {typed} UNION ALL BY NAME "
            f"SELECT * FROM read_parquet({files}, union_by_name = true, "
            "hive_partitioning = true, hive_types = {'date': DATE})"
        )
    return (
        f"CREATE OR REPLACE VIEW {table} AS SELECT * EXCLUDE ({_FILE_COLUMN}) REPLACE "
        f"(CAST(regexp_extract({_FILE_COLUMN}, '{_DAY_OF_FILE}', 1) AS DATE) AS date) FROM "
        f"({typed} UNION ALL BY NAME SELECT * FROM read_parquet({files}, union_by_name = true, "
        f"hive_partitioning = false, filename = '{_FILE_COLUMN}'))"
    )


def _readable(con: duckdb.DuckDBPyConnection, parts: Partitions, table: str) -> list[str]:
    """The files of `table` whose footer DuckDB reads (the others skipped with its reason)."""
    good = []
    for f in parts.files[table]:
        try:
            con.execute(f"DESCRIBE SELECT * FROM read_parquet({_file_literal(f)})")
        except duckdb.Error as e:
            parts.skipped.append((f, f"not readable as Parquet: {str(e).splitlines()[0]}"))
        else:
            good.append(f)
    return good


def create_views(
    con: duckdb.DuckDBPyConnection, lake: str | Path | Partitions, glob: bool = False
) -> Partitions:
    """One view per table (typed; its partitions where there are any), then `sql/views.sql`.

    Views list their tables' checked files; with `glob`, a table whose every partition is
    readable globs its folder instead. A table DuckDB still cannot read (a footer the cheap check
    let through) has its files read one by one and the unreadable ones skipped. Returns the
    partitions read (with what was skipped)."""
    parts = lake if isinstance(lake, Partitions) else scan_partitions(lake)
    for table in TABLES:
        files = parts.files[table]
        source: str | list[str] | None = files or None
        if glob and files and table not in parts.listed:
            source = f"{_quote_path(parts.root)}/{table}/{PARTITION_GLOB}"
        try:
            con.execute(table_view_sql(table, source, parts.root))
        except duckdb.Error:
            if not files:
                raise
            parts.files[table] = files = _readable(con, parts, table)
            parts.listed.add(table)
            con.execute(table_view_sql(table, files or None, parts.root))
    for stmt in con.extract_statements(VIEWS_SQL.read_text()):
        con.execute(stmt.query)
    return parts


def views_version(root: Path) -> str:
    """A digest of how this version writes the views of a lake at `root` (how a view reads its
    partitions, the contract's columns, `sql/views.sql`): a views file written otherwise (before
    `date` came from the partition's folder, say) no longer matches its lake."""
    text = "\n".join(table_view_sql(t, "?", root) for t in TABLES) + VIEWS_SQL.read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lake_state(parts: Partitions) -> str:
    """The lake's path, the tables with data, the files of the listed tables and the views'
    version, as one string."""
    rel = {t: [Path(f).relative_to(parts.root).as_posix() for f in parts.files[t]] for t in TABLES}
    return json.dumps(
        {
            "lake": parts.root.as_posix(),
            "tables": [t for t in TABLES if parts.files[t]],
            "listed": {t: rel[t] for t in sorted(parts.listed)},
            "views": views_version(parts.root),
        }
    )


# everything a database file can hold that an analyst opening it would read or run: its views
# (with their SQL and comments), tables, macros, sequences, indexes, types and schemas. The
# catalog functions are DuckDB's own (`system.main.`): a file of table macros named like them
# answered for them, with the genuine file's catalog (adversarial review).
_CATALOG_SQL = """
SELECT 'view', schema_name, view_name, sql, comment FROM system.main.duckdb_views()
  WHERE database_name = $db AND NOT internal
UNION ALL SELECT 'table', schema_name, table_name, sql, comment FROM system.main.duckdb_tables()
  WHERE database_name = $db
UNION ALL SELECT 'macro', schema_name, function_name, macro_definition, comment
  FROM system.main.duckdb_functions() WHERE database_name = $db AND NOT internal
UNION ALL SELECT 'sequence', schema_name, sequence_name, sql, comment
  FROM system.main.duckdb_sequences() WHERE database_name = $db
UNION ALL SELECT 'index', schema_name, index_name, sql, comment
  FROM system.main.duckdb_indexes() WHERE database_name = $db
UNION ALL SELECT 'type', schema_name, type_name, logical_type, comment
  FROM system.main.duckdb_types() WHERE database_name = $db AND NOT internal
UNION ALL SELECT 'schema', schema_name, schema_name, sql, comment
  FROM system.main.duckdb_schemas() WHERE database_name = $db AND NOT internal
"""
# how long reading a views file's catalog may take (a genuine one takes milliseconds)
CATALOG_TIMEOUT_S = 10.0


def _catalog(con: duckdb.DuckDBPyConnection, database: str) -> list[tuple]:
    """The catalog of `database` in `con`, sorted; the query is interrupted after
    CATALOG_TIMEOUT_S (duckdb.Error then)."""
    timer = threading.Timer(CATALOG_TIMEOUT_S, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        rows = con.execute(_CATALOG_SQL, {"db": database}).fetchall()
    finally:
        timer.cancel()
    return sorted(rows, key=lambda r: tuple(str(v) for v in r))


def _write_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path) -> Partitions:
    """The views file's content, in `con`: the views and the state comment."""
    parts = create_views(con, scan_partitions(lake_root), glob=True)
    state = (STATE_PREFIX + lake_state(parts)).replace("'", "''")
    con.execute(f"COMMENT ON VIEW {STATE_ON} IS '{state}'")
    return parts


def _held_catalog(db_path: str | Path) -> list[tuple]:
    """The catalog of the views file `db_path`, read so that nothing in it runs: the file is
    attached read-only to an empty in-memory database, so its macros are not on the search path
    (a table macro named `duckdb_views` over range(1e12) hung every materialize: adversarial
    review), and the catalog functions are named in full besides."""
    path = os.path.abspath(db_path).replace("'", "''")
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    with duckdb.connect(":memory:", config=config) as con:
        con.execute(f"ATTACH '{path}' AS held_views (READ_ONLY, TYPE duckdb)")
        return _catalog(con, "held_views")


def views_current(db_path: str | Path, lake_root: str | Path) -> bool:
    """Does the views file hold exactly what this version would write for the lake now: the
    same views (reading the same tables and files), with the same state comment, and nothing
    else (a file whose comment was kept while a view was changed or a macro added is not: an
    analyst opening it would read what it says, not the lake; adversarial review). Nothing in
    the file runs while it is read, and the reading is bounded (`_held_catalog`); a file with a
    macro is not current (this version writes none). For a lake in an object store, which has
    no views file, it is current when there is none."""
    if is_object_store(lake_root):
        return not os.path.lexists(db_path)
    if not Path(db_path).is_file():
        return False
    try:
        held = _held_catalog(db_path)
        if any(row[0] == "macro" for row in held):
            return False
        with duckdb.connect(":memory:") as con:
            _write_views(con, lake_root)
            (database,) = con.execute("SELECT current_database()").fetchone()
            want = _catalog(con, database)
    except (duckdb.Error, SqlError, OSError):
        return False
    return held == want


def build_views_file(
    lake_root: str | Path,
    db_path: str | Path,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """(Re)write the views-only DuckDB file for `lake_root`: written under a unique name and
    renamed into place, so readers keep the version they opened and two writers never meet.
    `warn` gets one line per skipped file or folder. LakeError for a lake in an object store
    (before anything is written)."""
    if is_object_store(lake_root):
        raise LakeError(object_store_note(lake_root))
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = db_path.with_name(f".{db_path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with duckdb.connect(str(tmp)) as con:
            parts = _write_views(con, lake_root)
        os.replace(tmp, db_path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
    for path, why in parts.skipped if warn else ():
        warn(f"skipped {path}: {why}")
    return db_path


def remove_views_file(db_path: str | Path) -> bool:
    """Remove a views file (and its write-ahead log): one an earlier version wrote for a lake in
    an object store held only empty views. Whether there was one."""
    db_path = Path(db_path)
    there = os.path.lexists(db_path)
    db_path.unlink(missing_ok=True)
    db_path.with_name(db_path.name + ".wal").unlink(missing_ok=True)
    return there


@dataclass(frozen=True)
class SqlLimits:
    """What one analyst query may take: DuckDB's memory and threads, and spill files (at most
    `spill_mb` in `temp_dir`; none without a folder or with 0)."""

    memory_mb: int = 1024
    threads: int = 2
    spill_mb: int = 4096
    temp_dir: str | None = None


def connect_readonly(
    lake_root: str | Path | Partitions,
    db_path: str | Path | None = None,
    limits: SqlLimits | None = None,
) -> duckdb.DuckDBPyConnection:
    """Read-only connection that can read the lake's partition files and nothing else.

    The views are built in a fresh in-memory database (a few milliseconds), never taken from a
    file: nothing on disk is opened for writing, a stale or foreign views file cannot mislead,
    and DuckDB's per-process database cache cannot hand back another connection's settings.
    (`db_path` is accepted for callers that name the views file; it is not opened.) Memory,
    threads and spill files are bounded by `limits`; the configuration is then locked.
    """
    lim = limits or SqlLimits()
    spill = lim.temp_dir if lim.temp_dir and lim.spill_mb > 0 else ""
    con = duckdb.connect(
        ":memory:",
        config={
            "memory_limit": f"{max(lim.memory_mb, 1)}MiB",
            "threads": max(lim.threads, 1),
            "temp_directory": spill,
            "max_temp_directory_size": f"{max(lim.spill_mb, 0) if spill else 0}MiB",
        },
    )
    parts = create_views(con, lake_root)
    # SQL may read the checked partition files, nothing else (their folders, the cache,
    # reports, anything beyond); DuckDB compares the path strings, Landlock the files
    con.execute("SET allowed_directories = ?", [[]])
    con.execute("SET allowed_paths = ?", [parts.all_files()])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def error_text(e: BaseException, context: bool = True) -> str:
    """DuckDB's message with its hints (Did you mean …, candidate bindings; with `context` the
    line and caret), blank lines dropped, at most ERROR_LINES lines of ERROR_WIDTH characters.
    Errors raised while a result is fetched point into the text DuckDB's Python layer ran, not
    the query as written: they are shown without `context`."""
    lines = [ln.rstrip() for ln in str(e).splitlines() if ln.strip()]
    if not context:
        cut = next((i for i, ln in enumerate(lines) if re.match(r"LINE \d+:", ln)), len(lines))
        lines = lines[:cut]
    lines = [ln if len(ln) <= ERROR_WIDTH else ln[: ERROR_WIDTH - 1] + "…" for ln in lines]
    if len(lines) > ERROR_LINES:
        lines = [*lines[: ERROR_LINES - 1], f"… ({len(lines) - ERROR_LINES + 1} more lines)"]
    return "\n".join(lines) or type(e).__name__


def sql_text(data: bytes, source: str) -> str:
    """Analyst SQL from bytes read from `source`: UTF-8 text (a BOM allowed), else SqlError."""
    if len(data) > SQL_MAX_BYTES:
        raise SqlError(f"{source} is larger than 1 MiB: not read as SQL")
    if b"\x00" in data:
        raise SqlError(f"{source} is not UTF-8 text (it holds NUL bytes: a binary file?)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SqlError(
            f"{source} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def read_sql_file(path: str | os.PathLike) -> str:
    """The SQL in file `path`: a regular file (not a FIFO, a device like /dev/zero or a folder)
    of at most SQL_MAX_BYTES of UTF-8 text; else SqlError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    except OSError as e:
        raise SqlError(f"{path} cannot be read: {e.strerror}") from None
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a folder" if stat.S_ISDIR(kind) else "a FIFO, device or socket"
            raise SqlError(f"{path} is not a regular file ({what}): give a file of SQL")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(SQL_MAX_BYTES + 1)
    except OSError as e:
        raise SqlError(f"{path} cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)
    return sql_text(data, str(path))


def _tokens(sql: str) -> list[tuple[int, str]]:
    """The tokens of `sql` as DuckDB's own tokenizer reads them (the scanner its parser uses:
    nested block comments, quoted names and strings alike), comments dropped: (offset, text).
    The tokenizer counts UTF-8 bytes; the offsets here are the string's characters (read as
    characters, a comment of non-ASCII text shifted every later token, and `EXPLAIN /*é…*/
    (ANALYZE) CREATE …` passed as the SELECT after it: adversarial review)."""
    found = duckdb.tokenize(sql)
    # the byte offset each character starts at: a token's byte offset -> its character's
    at = list(itertools.accumulate((len(c.encode("utf-8")) for c in sql), initial=0))
    chars = [bisect.bisect_left(at, start) for start, _ in found]
    out = []
    for k, (_, kind) in enumerate(found):
        if kind != duckdb.token_type.comment:
            end = chars[k + 1] if k + 1 < len(found) else len(sql)
            out.append((chars[k], sql[chars[k] : end].strip()))
    return out


def _kind(stmt) -> str:
    return stmt.type.name if hasattr(stmt.type, "name") else str(stmt.type)


def _one_select(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Does DuckDB read `sql` as exactly one SELECT statement?"""
    try:
        found = con.extract_statements(sql)
    except Exception:  # noqa: BLE001 - a parser error, or a statement of no known type
        return False
    return len(found) == 1 and _kind(found[0]) == "SELECT"


def _explain_refusal(con: duckdb.DuckDBPyConnection, sql: str) -> str | None:
    """Why an EXPLAIN is not a plain read (None: it explains one SELECT without running it).

    Decided from DuckDB's own reading, not a pattern over the text (a `)` in a comment ended the
    options a regex read, and `EXPLAIN (ANALYZE) CREATE …` ran: adversarial review): the tokens
    come from DuckDB's tokenizer, and what EXPLAIN explains must parse, on its own, as one SELECT.
    Its grammar has no ambiguity, so text after EXPLAIN that parses as a SELECT is what it
    explains (`EXPLAIN (SELECT 1)`); an option list may hold FORMAT and nothing else."""
    toks = _tokens(sql)
    words = [t.lower() for _, t in toks]
    if len(words) < 2 or words[0] != "explain":
        return "EXPLAIN in a form not read here"
    if words[1] in ("analyze", "analyse"):
        return "EXPLAIN ANALYZE (it runs the statement it explains)"
    if _one_select(con, sql[toks[1][0] :]):
        return None
    if words[1] == "(" and ")" in words[2:]:
        close = words.index(")", 2)
        options = [w.strip("\"'") for w in words[2:close]]
        if all(w in EXPLAIN_OPTION_WORDS for w in options):
            rest = sql[toks[close + 1][0] :] if close + 1 < len(toks) else ""
            return None if _one_select(con, rest) else "EXPLAIN of anything but a SELECT"
        if any("analy" in w for w in options):
            return "EXPLAIN ANALYZE (it runs the statement it explains)"
        return "EXPLAIN with options other than FORMAT"
    return "EXPLAIN of anything but a SELECT"


def _refusal(con: duckdb.DuckDBPyConnection, stmt) -> str | None:
    """Why a statement is not a plain read (None: it is one).

    SELECT (with DESCRIBE, SHOW, SUMMARIZE, FROM, VALUES, WITH) reads; EXPLAIN does when it
    explains a SELECT without running it (EXPLAIN ANALYZE runs its statement, a COPY too);
    PRAGMA does for the describing ones of READ_PRAGMAS. Anything else is refused. The words
    are read with DuckDB's tokenizer (comments anywhere, as DuckDB skips them).
    """
    kind = _kind(stmt)
    if kind == "SELECT":
        return None
    if kind == "EXPLAIN":
        return _explain_refusal(con, stmt.query)
    if kind == "PRAGMA":
        words = [t for _, t in _tokens(stmt.query)]
        name = words[1] if len(words) > 1 and words[0].lower() == "pragma" else ""
        if name.lower() in READ_PRAGMAS:
            return None
        return (
            f"PRAGMA {name}".strip()
            + " (only "
            + ", ".join(sorted(READ_PRAGMAS))
            + " describe without changing anything)"
        )
    return kind


def statements(con: duckdb.DuckDBPyConnection, sql: str) -> list:
    """The statements of `sql`, each a plain read, else SqlError naming the first that isn't."""
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise SqlError(error_text(e)) from None
    except Exception:  # noqa: BLE001 - a statement this DuckDB cannot even classify is refused
        raise SqlError(
            "only read queries are allowed here, not a statement of unknown type"
        ) from None
    if not stmts:
        raise SqlError("no SQL statement given")
    for s in stmts:
        try:
            why = _refusal(con, s)
        except Exception:  # noqa: BLE001
            why = "a statement of unknown type"
        if why is not None:
            raise SqlError(f"only read queries are allowed here, not {why}")
    return stmts


def is_lake(root: str | Path) -> bool:
    """Is `root` a gpu_pipeline lake: a folder with at least one table folder of partitions?
    (A lake in an object store is not looked at here: `is_object_store`.)"""
    if is_object_store(root):
        return False
    root = Path(root)
    return root.is_dir() and any(
        (root / t).is_dir() and any((root / t).glob("date=*/data.parquet")) for t in TABLES
    )


def run_queries(con: duckdb.DuckDBPyConnection, sql: str):
    """Run analyst SQL (read statements only; all are checked before any runs), yielding each
    statement's result relation (None for a statement without rows). Consume each result
    before asking for the next: the next statement runs then."""
    for s in statements(con, sql):
        try:
            rel = con.sql(s.query)
        except duckdb.Error as e:
            raise SqlError(error_text(e)) from None
        yield rel


NESTED_TYPES = {"list", "struct", "map", "array", "union", "variant"}
# the types Polars takes from Arrow and writes as CSV and JSON exactly, as they always were
# (NaN and infinite floats: NaN, inf in CSV; null in JSON, which has no such numbers)
PLAIN_TYPES = {
    "boolean",
    "tinyint",
    "smallint",
    "integer",
    "bigint",
    "utinyint",
    "usmallint",
    "uinteger",
    "ubigint",
    "float",
    "double",
    "decimal",
    "varchar",
    "uuid",
    "enum",
    "null",
}
# times Polars writes in its own way, within its calendar only (years to ±262,143; a TIME before
# 24:00): a value beyond (infinity) is an error naming the column, not a panic or a null
CHECKED_TYPES = {
    "timestamp",
    "timestamp_s",
    "timestamp_ms",
    "timestamp_ns",
    "timestamp with time zone",
    "time",
}
# Polars' calendar in microseconds from 1970 (about ±261,800 years; its own reaches ±262,143)
CHECKED_EPOCH_US = 8_200_000_000_000_000_000
# Every other type is written as DuckDB's text of it, so no value is silently wrong: HUGEINT and
# UHUGEINT (Arrow carries them as 38-digit decimals, a large UHUGEINT as a negative number),
# DATE (its text is Polars' own for years 0-9999; `infinity` panicked), INTERVAL, BLOB, BIT,
# BIGNUM, TIME WITH TIME ZONE, GEOMETRY, TIME_NS and any type this version does not know; a UNION
# or VARIANT as its JSON text (adversarial review). In JSON, a nested column keeps its shape with
# such values as text (and its dates and times as DuckDB's text of them, as CSV has them).
BATCH_ROWS = 50_000


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _text_leaves(t: duckdb.DuckDBPyType) -> duckdb.DuckDBPyType | None:
    """The type `t` with every value not of a PLAIN_TYPES type as VARCHAR, lists, arrays, structs
    and maps kept; None when that is `t` itself."""
    kind, text = t.id, duckdb.sqltype("VARCHAR")
    if kind in ("list", "array"):
        child = _text_leaves(t.children[0][1])
        if child is None:
            return None
        return (
            duckdb.list_type(child)
            if kind == "list"
            else duckdb.array_type(child, t.children[1][1])
        )
    if kind in ("struct", "map"):
        parts = [(name, _text_leaves(ct)) for name, ct in t.children]
        if all(new is None for _, new in parts):
            return None
        types = [new or ct for (_, new), (_, ct) in zip(parts, t.children, strict=True)]
        if kind == "map":
            return duckdb.map_type(*types)
        return duckdb.struct_type({name: ty for (name, _), ty in zip(parts, types, strict=True)})
    return None if kind in PLAIN_TYPES else text


def _checked(i: int, t: duckdb.DuckDBPyType, name: str, fmt: str) -> str:
    """Column `i` as it is, or an error naming it for a value Polars cannot write."""
    if t.id == "time":
        ok = f"#{i} < TIME '24:00:00'"
    else:
        ok = f"isfinite(#{i}) AND epoch_us(#{i}) BETWEEN -{CHECKED_EPOCH_US} AND {CHECKED_EPOCH_US}"
    why = (
        _sql_string(f"column {name} holds ")
        + f" || #{i}::VARCHAR || "
        + _sql_string(
            f", a {t.id.upper()} value --format {fmt} cannot write: cast the column to "
            "VARCHAR, or use --format table"
        )
    )
    return f"CASE WHEN #{i} IS NULL OR ({ok}) THEN #{i} ELSE error({why}) END"


def _column(i: int, t: duckdb.DuckDBPyType, name: str, fmt: str):
    """Column `i` as it is written as `fmt` (csv, json); None: as it is."""
    q = '"' + name.replace('"', '""') + '"'
    if t.id in PLAIN_TYPES:
        return None
    if t.id in CHECKED_TYPES:
        return duckdb.SQLExpression(f"{_checked(i, t, name, fmt)} AS {q}")
    if t.id in NESTED_TYPES and (fmt == "csv" or t.id in ("union", "variant")):
        return duckdb.SQLExpression(f"to_json(#{i})::VARCHAR AS {q}")
    if t.id in NESTED_TYPES:
        target = _text_leaves(t)
        return None if target is None else duckdb.SQLExpression(f"#{i}").cast(target).alias(name)
    return duckdb.SQLExpression(f"#{i}::VARCHAR AS {q}")


def _printable(rel: duckdb.DuckDBPyRelation, nested_as_json: bool) -> duckdb.DuckDBPyRelation:
    """The relation as it is written as CSV (`nested_as_json`: nested columns as JSON text) or
    JSON: the columns Polars would not write exactly as DuckDB's text, times checked."""
    names = _unique(rel.columns)
    fmt = "csv" if nested_as_json else "json"
    # columns by position: two of one name (`SELECT a.x, b.x`) are two columns, each its own
    # (by name, both were the first: adversarial review)
    changed = names != rel.columns
    cols = []
    for i, (c, t) in enumerate(zip(names, rel.types, strict=True), 1):
        col = _column(i, t, c, fmt)
        changed = changed or col is not None
        q = '"' + c.replace('"', '""') + '"'
        cols.append(col if col is not None else duckdb.SQLExpression(f"#{i} AS {q}"))
    return rel.select(*cols) if changed else rel


def flat_frame(rel: duckdb.DuckDBPyRelation) -> pl.DataFrame:
    """The relation as a frame whose nested columns (lists, structs, maps, variants) are JSON
    text, so it can be written as CSV."""
    try:
        return _printable(rel, nested_as_json=True).pl()
    except duckdb.Error as e:
        raise SqlError(error_text(e, context=False)) from None


def _unique(names: list[str]) -> list[str]:
    """Column names made unique for CSV and JSON (`SELECT a.x, b.x`: x, x_1), as DuckDB does."""
    out: list[str] = []
    for n in names:
        m, i = n, 0
        while m in out or (m != n and m in names):
            i += 1
            m = f"{n}_{i}"
        out.append(m)
    return out


def _batches(rel: duckdb.DuckDBPyRelation, fmt: str):
    """The text of a result as CSV or JSON (an array of row objects), in pieces of BATCH_ROWS
    rows; each piece is made before any of it is written."""
    reader = _printable(rel, nested_as_json=fmt == "csv").to_arrow_reader(BATCH_ROWS)
    names = _unique(reader.schema.names)
    first = True
    for batch in reader:
        df = pl.from_arrow(batch.rename_columns(names))
        if fmt == "csv":
            yield df.write_csv(include_header=first)
        elif df.height:
            yield ("[" if first else ",") + df.write_json()[1:-1]
        else:
            continue
        first = False
    if fmt == "csv" and first:
        yield pl.from_arrow(reader.schema.empty_table().rename_columns(names)).write_csv()
    if fmt == "json":
        yield "[]\n" if first else "]\n"


def write_result(rel: duckdb.DuckDBPyRelation, fmt: str, out) -> None:
    """Print a result as a table (DuckDB's box, at most 200 rows shown), CSV or JSON (an array
    of row objects). CSV and JSON are streamed BATCH_ROWS rows at a time, so a large result
    never sits whole in this process's memory. SqlError (one message) if DuckDB fails, or for
    a time Polars cannot write (infinity); a column of another type Polars would not write
    exactly is DuckDB's text of it (`_printable`). JSON has no NaN or infinite numbers: a float
    that is one is null there (NaN, inf in CSV)."""
    try:
        if fmt == "table":
            rel.show(max_width=200, max_rows=200)
            return
        for text in _batches(rel, fmt):
            out.write(text)
    except duckdb.Error as e:
        raise SqlError(error_text(e, context=False)) from None
    except BrokenPipeError:  # `sql … | head`: the reader has gone (the CLI exits quietly)
        raise
    except pl.exceptions.PanicException as e:
        # a value Polars cannot take or write as text, past `_printable`: one line, not a
        # panic's traceback (adversarial review)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SqlError(
            f"this result cannot be written as {fmt} ({why}): cast the column to VARCHAR, or "
            "use --format table"
        ) from None
    except (OSError, pl.exceptions.PolarsError) as e:  # DuckDB's error through Arrow's reader
        raise SqlError(error_text(e, context=False)) from None
