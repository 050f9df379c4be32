"""Analyst SQL, adversarial review: the statement gate read EXPLAIN's options with a pattern a
comment could end early; a views file of table macros named like DuckDB's catalog functions
passed as current (or hung the check); `--format csv|json` printed wrong UHUGEINTs and Rust
panics for values Polars cannot write."""

import io
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import duckdb
import polars as pl
import pytest
from helpers import cli_env

from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.warehouse import (
    SqlError,
    build_views_file,
    statements,
    views_current,
    write_result,
)


@pytest.fixture()
def lake(tmp_path) -> Path:
    root = tmp_path / "lake"
    df = pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "minutes": [600, 40]})
    Lake(root).write("gpu_daily", date(2024, 1, 1), df)
    return root


def sql(tmp_path: Path, lake: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpu-pipeline sql --lake LAKE ARGS` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gpu_pipeline.cli", "sql", "--lake", str(lake), *args],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- 1. the statement gate reads EXPLAIN as DuckDB does ----------------------------------------

REPRO = "EXPLAIN ( -- ) SELECT 1 /*\n ANALYZE) CREATE TABLE pwn AS SELECT 42 AS x -- */\n;\n"


@pytest.mark.parametrize(
    "query",
    [
        REPRO,
        "EXPLAIN ( -- ) SELECT 1 /*\n ANALYZE) CREATE MACRO pwn() AS 42 -- */",
        "EXPLAIN ( -- ) SELECT 1 /*\n ANALYZE) CALL pragma_version() -- */",
        "EXPLAIN ( /* ) SELECT 1 */ ANALYZE) CREATE TABLE pwn AS SELECT 1",
        "EXPLAIN ( /* /* ) */ SELECT 1 */ ANALYZE) CREATE TABLE pwn AS SELECT 1",  # nested
        "EXPLAIN (FORMAT 'a)b', ANALYZE) CREATE TABLE pwn AS SELECT 1",
        "explain (format json, analyze) create table pwn as select 1",
        'EXPLAIN ("analyze") SELECT 1',
        "EXPLAIN (analyse) SELECT 1",
        "EXPLAIN (ANALYZE false) SELECT 1",  # DuckDB analyzes all the same
        "explain analyze select 1",
        "/* ( */ EXPLAIN /* ) */ ANALYSE SELECT 1",
        "EXPLAIN CREATE TABLE pwn AS SELECT 1",
        "EXPLAIN (FORMAT json) CREATE TABLE pwn AS SELECT 1",
        # the tokenizer's offsets are bytes: non-ASCII text in a comment shifted every later
        # token onto the SELECT at the end (adversarial review)
        *(
            "EXPLAIN /*" + "é" * body.index("SELECT") + "*/ " + body
            for body in (
                "(ANALYZE) CREATE TABLE pwn AS SELECT 'x' AS note",
                "(ANALYZE) CREATE OR REPLACE VIEW fleet_daily AS SELECT 1 AS x",
            )
        ),
    ],
)
def test_explain_that_runs_or_explains_a_write_is_refused(query):
    con = duckdb.connect()
    with pytest.raises(SqlError, match="only read queries are allowed"):
        statements(con, query)
    assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)


@pytest.mark.parametrize(
    "query",
    [
        "EXPLAIN SELECT 1",
        "explain select ')' AS x -- ) ANALYZE",
        "/* c ( */ EXPLAIN /* ) */ SELECT ') analyze (' AS x",
        "EXPLAIN (FORMAT json) SELECT 1",
        "EXPLAIN (format 'json') select 1",
        "EXPLAIN (SELECT 1)",
        "EXPLAIN (FORMAT json) (SELECT 1) UNION (SELECT 2)",
        "EXPLAIN SUMMARIZE SELECT 1",
        "PRAGMA /* c */ show_tables",
    ],
)
def test_explain_of_a_select_still_passes(query):
    con = duckdb.connect()
    assert len(statements(con, query)) == 1
    con.sql(query).fetchall()  # runs


def test_the_commented_explain_analyze_is_refused_by_the_command(tmp_path, lake):
    file = tmp_path / "gate.sql"
    file.write_text(REPRO + "SELECT * FROM pwn;\n")
    p = sql(tmp_path, lake, "-f", str(file), "--format", "csv")
    assert p.returncode == 2 and "only read queries are allowed here, not EXPLAIN ANALYZE" in (
        p.stdout + p.stderr
    )
    assert "42" not in p.stdout


# --- 2. a views file is read without running anything in it ------------------------------------

CATALOG_FUNCTIONS = ["duckdb_tables", "duckdb_views", "duckdb_functions", "duckdb_sequences"]
CATALOG_FUNCTIONS += ["duckdb_indexes", "duckdb_types", "duckdb_schemas"]


def test_a_views_file_whose_macros_answer_for_the_catalog_is_not_current(tmp_path, lake):
    """The review's forgery: the genuine catalog kept in tables, table macros named like
    DuckDB's catalog functions returning it, a view that lies and one that reads /etc/passwd."""
    db = build_views_file(lake, tmp_path / "v.duckdb")
    assert views_current(db, lake)
    with duckdb.connect(str(db)) as con:
        for fn in CATALOG_FUNCTIONS:
            where = (
                " WHERE NOT starts_with(table_name, '_duckdb_')" if fn == "duckdb_tables" else ""
            )
            con.execute(f'CREATE TABLE main."_{fn}" AS SELECT * FROM {fn}(){where}')
        con.execute("CREATE OR REPLACE VIEW gpu_daily AS SELECT 'GPU-forged' AS gpu_uuid")
        con.execute("CREATE VIEW main.etc_passwd AS SELECT * FROM read_text('/etc/passwd')")
        for fn in CATALOG_FUNCTIONS:
            con.execute(f'CREATE MACRO main.{fn}() AS TABLE SELECT * FROM main."_{fn}"')
        # the shadowing works for a client that opens the file
        assert "etc_passwd" not in {
            r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()
        }
    assert not views_current(db, lake)
    db = build_views_file(lake, db)  # what materialize then does
    assert views_current(db, lake)


HANG = """
import sys, time, duckdb
from gpu_pipeline.lib.io.warehouse import views_current
db, lake = sys.argv[1:]
with duckdb.connect(db) as con:
    con.execute("CREATE MACRO main.duckdb_views() AS TABLE SELECT 'main' AS schema_name, "
                "'x' AS view_name, NULL::VARCHAR AS sql, NULL::VARCHAR AS comment, "
                "false AS internal, 'memory' AS database_name "
                "FROM range(1000000000000) t(i) WHERE i < 0")
t = time.monotonic()
print(views_current(db, lake), round(time.monotonic() - t, 1))
"""


def test_a_views_file_with_a_macro_that_never_ends_is_checked_in_seconds(tmp_path, lake):
    db = build_views_file(lake, tmp_path / "v.duckdb")
    try:
        p = subprocess.run(
            [sys.executable, "-c", HANG, str(db), str(lake)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("views_current ran the file's macro (still running after 30 s)")
    current, seconds = p.stdout.split()
    assert current == "False" and float(seconds) < 10, p.stdout + p.stderr


# --- 3. csv and json: exact values, no panic ---------------------------------------------------


def written(query: str, fmt: str) -> str:
    out = io.StringIO()
    write_result(duckdb.connect().sql(query), fmt, out)
    return out.getvalue()


UHUGE = (
    "SELECT 340282366920938463463374607431768211455::UHUGEINT AS u, "
    "(2::UHUGEINT ** 127)::UHUGEINT AS v"
)


def test_uhugeint_and_hugeint_are_written_exactly():
    big, half = "340282366920938463463374607431768211455", "170141183460469231731687303715884105728"
    assert written(UHUGE, "csv") == f"u,v\n{big},{half}\n"
    assert json.loads(written(UHUGE, "json")) == [{"u": big, "v": half}]
    # a HUGEINT (what sum() of integers gives) is written as it always was
    assert written("SELECT sum(x) AS s FROM range(4) t(x)", "csv") == "s\n6\n"
    assert written("SELECT sum(x) AS s FROM range(4) t(x)", "json") == '[{"s":"6"}]\n'


@pytest.mark.parametrize(
    ("query", "csv", "js"),
    [
        ("SELECT 'infinity'::DATE AS d", "d\ninfinity\n", [{"d": "infinity"}]),
        ("SELECT 1::VARIANT AS v", "v\n1\n", [{"v": "1"}]),
        ("SELECT [INTERVAL 1 DAY] AS li", 'li\n"[""1 day""]"\n', [{"li": ["1 day"]}]),
        ("SELECT union_value(k := 1) AS u", 'u\n"{""k"":1}"\n', [{"u": '{"k":1}'}]),
        ("SELECT [DATE 'infinity'] AS ld", 'ld\n"[""infinity""]"\n', [{"ld": ["infinity"]}]),
        (
            "SELECT {'a': [1::UHUGEINT], 'b': INTERVAL 2 DAYS} AS s",
            's\n"{""a"":[1],""b"":""2 days""}"\n',
            [{"s": {"a": ["1"], "b": "2 days"}}],
        ),
    ],
)
def test_values_polars_cannot_write_are_written_as_duckdbs_text(query, csv, js):
    assert written(query, "csv") == csv
    assert json.loads(written(query, "json")) == js


def test_nan_and_infinity_are_null_in_json_and_kept_in_csv():
    q = "SELECT 'nan'::DOUBLE AS n, 'inf'::FLOAT AS i, 1.5::DOUBLE AS x"
    assert written(q, "csv") == "n,i,x\nNaN,inf,1.5\n"
    assert written(q, "json") == '[{"n":null,"i":null,"x":1.5}]\n'


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 'infinity'::TIMESTAMP AS t",
        "SELECT '-infinity'::TIMESTAMPTZ AS t",
        "SELECT TIMESTAMP '294246-01-01' AS t",
        "SELECT TIME '24:00:00' AS t",  # was null, silently
    ],
)
def test_a_time_polars_cannot_write_is_one_error_naming_the_column(query):
    for fmt in ("csv", "json"):
        with pytest.raises(SqlError, match=r"column t holds .*cast the column to VARCHAR"):
            written(query, fmt)


ORDINARY = (
    "SELECT 1::TINYINT AS a, 3::BIGINT AS c, 4::UBIGINT AS d, 1.5::FLOAT AS e, 0.1::DOUBLE AS f,"
    " 1e-7::DOUBLE AS g, 12.345::DECIMAL(10,3) AS h, NULL AS k, true AS l, 'a,b\"c' AS m,"
    " UUID '00000000-0000-0000-0000-000000000001' AS n, DATE '2024-03-01' AS o,"
    " TIMESTAMP '2024-03-01 01:02:03.456789' AS p, TIMESTAMPTZ '2024-03-01 01:00:00+00' AS q,"
    " TIME '01:02:03.25' AS r, [1, 2] AS s, {'x': 'y'} AS t, INTERVAL 3 DAYS AS u, 1 AS a"
)


def test_ordinary_results_are_written_as_before():
    assert written(ORDINARY, "csv") == (
        "a,c,d,e,f,g,h,k,l,m,n,o,p,q,r,s,t,u,a_1\n"
        '1,3,4,1.5,0.1,1e-7,12.345,,true,"a,b""c",00000000-0000-0000-0000-000000000001,'
        "2024-03-01,2024-03-01T01:02:03.456789,2024-03-01T01:00:00.000000+0000,"
        '01:02:03.250000000,"[1,2]","{""x"":""y""}",3 days,1\n'
    )
    assert written(ORDINARY, "json") == (
        '[{"a":1,"c":3,"d":4,"e":1.5,"f":0.1,"g":1e-7,"h":"12.345","k":null,"l":true,'
        '"m":"a,b\\"c","n":"00000000-0000-0000-0000-000000000001","o":"2024-03-01",'
        '"p":"2024-03-01 01:02:03.456789","q":"2024-03-01T01:00:00+00:00","r":"01:02:03.250",'
        '"s":[1,2],"t":{"x":"y"},"u":"3 days","a_1":1}]\n'
    )
    assert written("SELECT 1 AS a WHERE false", "csv") == "a\n"
    assert written("SELECT 1 AS a WHERE false", "json") == "[]\n"


ODD = [
    UHUGE,
    "SELECT 'infinity'::DATE AS d",
    "SELECT 1::VARIANT AS v",
    "SELECT [INTERVAL 1 DAY] AS li",
    "SELECT union_value(k := 1) AS u",
    "SELECT 'infinity'::TIMESTAMP AS t",
]


def test_the_command_prints_no_panic_for_odd_values(tmp_path, lake):
    script = tmp_path / "odd.sql"
    for fmt in ("csv", "json"):
        for query in ODD:
            script.write_text(query)
            p = sql(tmp_path, lake, "-f", str(script), "--format", fmt)
            everything = p.stdout + p.stderr
            assert "panicked" not in everything and "Traceback" not in everything, everything
            if p.returncode:
                assert p.returncode == 2 and everything.count("error:") == 1, everything
            if query == UHUGE:
                assert p.returncode == 0 and "-1" not in p.stdout, everything
