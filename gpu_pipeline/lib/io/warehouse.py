"""DuckDB over the lake: the views file (views only) and read-only analyst queries.

One view per lake table, generated from the column contract (`schemas.TABLES`): a typed empty
relation unioned by name with the table's partitions (`<lake>/<table>/*/data.parquet`), so every
view has every contract column whether or not a partition exists yet or was written before a
column was added. DuckDB cannot glob nothing, so a table with no partition gets the typed empty
relation alone; the views file records which tables had data when it was written, and a file
that no longer matches its lake is rebuilt (`materialize`, the `warehouse_views` asset) or, by
`gpu-pipeline sql`, replaced by the same views built in memory.

The `.duckdb` file holds only views, so it is rebuilt freely; analysts open it read-only. Queries
run with file access restricted to the lake and only read statements allowed, so SQL can read the
marts but never write a file or change the database.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import duckdb
import polars as pl

from gpu_pipeline.lib.io.lake import Lake
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
_LEADING = re.compile(r"^(\s+|--[^\n]*\n?|/\*.*?\*/)*", re.S)
# a view (the file holds views only) naming the lake and which tables had data when it was written
STATE_VIEW = "_gpu_pipeline_lake"


class SqlError(ValueError):
    """A query the analyst interface refuses or DuckDB cannot run."""


def _quote_path(root: Path) -> str:
    s = root.resolve().as_posix()
    if any(ch in s for ch in "\n\r\x00*?[]{}"):
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


def table_view_sql(table: str, lake_root: str | Path, has_data: bool) -> str:
    cols = ", ".join(f'CAST(NULL AS {duck_type(t)}) AS "{c}"' for c, t in TABLES[table].items())
    typed = f"SELECT {cols} WHERE false"
    if not has_data:
        return f"CREATE OR REPLACE VIEW {table} AS {typed}"
    glob = f"{_quote_path(Path(lake_root))}/{table}/*/data.parquet"
    return (
        f"CREATE OR REPLACE VIEW {table} AS {typed} UNION ALL BY NAME "
        f"SELECT * FROM read_parquet('{glob}', union_by_name = true, hive_partitioning = false)"
    )


def lake_state(lake_root: str | Path) -> str:
    """The lake's path and the tables that have at least one partition, as one string."""
    lake = Lake(lake_root)
    with_data = [t for t in TABLES if lake.days(t)]
    return json.dumps({"lake": Path(lake_root).resolve().as_posix(), "tables": with_data})


def create_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path) -> None:
    """One view per table (typed; the partitions where there are any), then `sql/views.sql`."""
    state = lake_state(lake_root)
    with_data = set(json.loads(state)["tables"])
    for table in TABLES:
        con.execute(table_view_sql(table, lake_root, table in with_data))
    for stmt in con.extract_statements(VIEWS_SQL.read_text()):
        con.execute(stmt.query)
    quoted = state.replace("'", "''")
    con.execute(f"CREATE OR REPLACE VIEW {STATE_VIEW} AS SELECT '{quoted}' AS state")


def views_current(db_path: str | Path, lake_root: str | Path) -> bool:
    """Does the views file exist, point at this lake, and know which of its tables have data?"""
    if not Path(db_path).is_file():
        return False
    try:
        with duckdb.connect(str(db_path), read_only=True) as con:
            row = con.execute(f"SELECT state FROM {STATE_VIEW}").fetchone()
    except duckdb.Error:
        return False
    return bool(row) and row[0] == lake_state(lake_root)


def build_views_file(lake_root: str | Path, db_path: str | Path) -> Path:
    """(Re)write the views-only DuckDB file for `lake_root`: written under a unique name and
    renamed into place, so readers keep the version they opened and two writers never meet."""
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = db_path.with_name(f".{db_path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with duckdb.connect(str(tmp)) as con:
            create_views(con, lake_root)
        os.replace(tmp, db_path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
    return db_path


def connect_readonly(
    lake_root: str | Path, db_path: str | Path | None = None, spill: bool = True
) -> duckdb.DuckDBPyConnection:
    """Read-only connection that can read the lake's tables and nothing else.

    The views are built in a fresh in-memory database (a few milliseconds), never taken from a
    file: nothing on disk is opened for writing, a stale or foreign views file cannot mislead,
    and DuckDB's per-process database cache cannot hand back another connection's settings.
    (`db_path` is accepted for callers that name the views file; it is not opened.)
    """
    con = duckdb.connect(":memory:")
    create_views(con, lake_root)
    if not spill:  # DuckDB writes nothing, not even temporary files of a large sort
        con.execute("SET temp_directory = ''")
    # SQL may read the tables' folders, nothing else of the lake (cache, reports) or beyond
    root = Path(lake_root).resolve()
    con.execute("SET allowed_directories = ?", [[(root / t).as_posix() + "/" for t in TABLES]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _strip(sql: str) -> str:
    """The statement without leading blanks and comments."""
    return sql[_LEADING.match(sql).end() :]


def _refusal(con: duckdb.DuckDBPyConnection, stmt) -> str | None:
    """Why a statement is not a plain read (None: it is one).

    SELECT (with DESCRIBE, SHOW, SUMMARIZE, FROM, VALUES, WITH) reads; EXPLAIN does when it
    explains a SELECT without running it (EXPLAIN ANALYZE runs its statement, a COPY too);
    PRAGMA does for the describing ones of READ_PRAGMAS. Anything else is refused.
    """
    kind = stmt.type.name if hasattr(stmt.type, "name") else str(stmt.type)
    text = _strip(stmt.query)
    if kind == "SELECT":
        return None
    if kind == "EXPLAIN":
        m = re.match(r"EXPLAIN\s+(\(([^)]*)\)\s*)?(ANALY[SZ]E\b)?", text, re.I)
        if m is None or m.group(3) or re.search(r"ANALY[SZ]E", m.group(2) or "", re.I):
            return "EXPLAIN ANALYZE runs the statement it explains"
        inner = con.extract_statements(text[m.end() :])
        if len(inner) != 1 or _refusal(con, inner[0]) is not None:
            return "EXPLAIN of anything but a SELECT"
        return None
    if kind == "PRAGMA":
        m = re.match(r"PRAGMA\s+([A-Za-z_]+)", text, re.I)
        if m and m.group(1).lower() in READ_PRAGMAS:
            return None
        return (
            f"PRAGMA {m.group(1) if m else ''}".strip()
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
        raise SqlError(str(e).splitlines()[0]) from None
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
    """Is `root` a gpu_pipeline lake: a folder with at least one table folder of partitions?"""
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
            yield con.sql(s.query)
        except duckdb.Error as e:
            raise SqlError(str(e).splitlines()[0]) from None


def run_query(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation | None:
    """Run analyst SQL; the last statement's result (the earlier ones run and are dropped)."""
    stmts = statements(con, sql)
    try:
        for s in stmts[:-1]:
            rel = con.sql(s.query)
            if rel is not None:
                rel.fetchall()
        return con.sql(stmts[-1].query)
    except duckdb.Error as e:
        raise SqlError(str(e).splitlines()[0]) from None


NESTED_TYPES = {"list", "struct", "map", "array", "union", "variant"}


def flat_frame(rel: duckdb.DuckDBPyRelation) -> pl.DataFrame:
    """The relation as a frame whose nested columns (lists, structs, maps, variants) are JSON
    text, so it can be written as CSV."""
    nested = [t.id in NESTED_TYPES for t in rel.types]
    cols = [
        duckdb.SQLExpression(f'to_json("{c}")::VARCHAR AS "{c}"')
        if n
        else duckdb.ColumnExpression(c)
        for c, n in zip(rel.columns, nested, strict=True)
    ]
    try:
        return (rel.select(*cols) if any(nested) else rel).pl()
    except duckdb.Error as e:
        raise SqlError(str(e).splitlines()[0]) from None
