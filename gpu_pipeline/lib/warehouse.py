"""DuckDB over the lake: the views file (views only) and read-only analyst queries.

The `.duckdb` file holds only views, so it is rebuilt freely; analysts open it read-only. Queries
run with file access restricted to the lake and only read statements allowed, so SQL can read the
marts but never write a file or change the database.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from gpu_pipeline.lib.lake import Lake
from gpu_pipeline.lib.schemas import TABLES

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
VIEWS_SQL = SQL_DIR / "views.sql"
QUERIES_DIR = SQL_DIR / "queries"
READ_STATEMENTS = {"SELECT", "EXPLAIN", "PRAGMA"}


class SqlError(ValueError):
    """A query the analyst interface refuses or DuckDB cannot run."""


def _quote_path(root: Path) -> str:
    s = root.resolve().as_posix()
    if any(ch in s for ch in "\n\r\x00*?[]{}"):
        raise SqlError(f"lake path has characters not allowed in a path glob: {s!r}")
    return s.replace("'", "''")


def create_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path) -> None:
    """Run views.sql against `lake_root` (every table gets its zero-row schema file first)."""
    lake = Lake(lake_root)
    for table in TABLES:
        lake.ensure_schema(table)
    text = VIEWS_SQL.read_text().replace("{lake}", _quote_path(Path(lake_root)))
    for stmt in con.extract_statements(text):
        con.execute(stmt.query)


def build_views_file(lake_root: str | Path, db_path: str | Path) -> Path:
    """(Re)write the views-only DuckDB file for `lake_root`. Only the `warehouse_views` asset calls
    this in a running deployment: one writer, so parallel backfills never contend for the file."""
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = db_path.with_name(f".{db_path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with duckdb.connect(str(tmp)) as con:
        create_views(con, lake_root)
    tmp.replace(db_path)
    return db_path


def connect_readonly(lake_root: str | Path, db_path: str | Path) -> duckdb.DuckDBPyConnection:
    """Read-only connection that can read the lake and nothing else.

    The views file is opened read-only when it exists; otherwise the same views are created in an
    in-memory database, so reading never writes a file.
    """
    db_path = Path(db_path)
    if db_path.is_file():
        con = duckdb.connect(str(db_path), read_only=True)
    else:
        con = duckdb.connect(":memory:")
        create_views(con, lake_root)
    con.execute("SET allowed_directories = [?]", [Path(lake_root).resolve().as_posix() + "/"])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def run_query(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation | None:
    """Run analyst SQL: read statements only; returns the last statement's result."""
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as e:
        raise SqlError(str(e)) from None
    if not stmts:
        raise SqlError("no SQL statement given")
    for s in stmts:
        kind = s.type.name if hasattr(s.type, "name") else str(s.type)
        if kind.upper() not in READ_STATEMENTS:
            raise SqlError(f"only read queries are allowed here, not {kind}")
    try:
        for s in stmts[:-1]:
            con.execute(s.query)
        return con.sql(stmts[-1].query)
    except duckdb.Error as e:
        raise SqlError(str(e).splitlines()[0]) from None
