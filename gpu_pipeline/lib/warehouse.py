"""DuckDB over the lake: the views file (views only) and read-only analyst queries.

The `.duckdb` file holds only views, so it is rebuilt freely; analysts open it read-only. Queries
run with file access restricted to the lake and only read statements allowed, so SQL can read the
marts but never write a file or change the database.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from gpu_pipeline.lib.schemas import TABLES

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
VIEWS_SQL = SQL_DIR / "views.sql"
QUERIES_DIR = SQL_DIR / "queries"
READ_STATEMENTS = {"SELECT", "EXPLAIN", "PRAGMA"}
_DUCK_TYPES = {
    "String": "VARCHAR",
    "Float64": "DOUBLE",
    "Int64": "BIGINT",
    "Int32": "INTEGER",
    "UInt32": "UINTEGER",
    "Boolean": "BOOLEAN",
    "Date": "DATE",
}


class SqlError(ValueError):
    """A query the analyst interface refuses or DuckDB cannot run."""


def _quote_path(root: Path) -> str:
    s = root.resolve().as_posix()
    if any(ch in s for ch in "\n\r\x00*?[]{}"):
        raise SqlError(f"lake path has characters not allowed in a path glob: {s!r}")
    return s.replace("'", "''")


def _empty_view(table: str) -> str:
    cols = []
    for c, t in TABLES[table].items():
        duck = (
            "TIMESTAMPTZ" if str(t).startswith("Datetime") else _DUCK_TYPES.get(str(t), "VARCHAR")
        )
        cols.append(f"CAST(NULL AS {duck}) AS {c}")
    return f"CREATE OR REPLACE VIEW {table} AS SELECT {', '.join(cols)} WHERE false"


def create_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path) -> None:
    """Run views.sql against `lake_root`; a table with no partitions yet gets an empty typed view."""
    root = Path(lake_root)
    text = VIEWS_SQL.read_text().replace("{lake}", _quote_path(root))
    for stmt in con.extract_statements(text):
        sql = stmt.query
        table = next((t for t in TABLES if f"VIEW {t} AS" in sql), None)
        if table and not any((root / table).glob("date=*/data.parquet")):
            sql = _empty_view(table)
        con.execute(sql)


def build_views_file(lake_root: str | Path, db_path: str | Path) -> Path:
    """(Re)write the views-only DuckDB file for `lake_root`."""
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(db_path)) as con:
        create_views(con, lake_root)
    return db_path


def connect_readonly(lake_root: str | Path, db_path: str | Path) -> duckdb.DuckDBPyConnection:
    """Read-only connection to the views file, able to read the lake and nothing else."""
    db_path = Path(db_path)
    if not db_path.is_file():
        build_views_file(lake_root, db_path)
    con = duckdb.connect(str(db_path), read_only=True)
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
