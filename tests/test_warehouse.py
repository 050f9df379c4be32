"""DuckDB views over the lake, and the read-only analyst interface."""

from datetime import UTC, date, datetime

import polars as pl
import pytest
from helpers import minutes_frame

from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.warehouse import (
    QUERIES_DIR,
    SqlError,
    build_views_file,
    connect_readonly,
    run_queries,
)
from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import TABLES
from gpu_pipeline.lib.staging.minute_runs import minute_runs

D = date(2024, 1, 1)


def run_query(con, sql: str):
    """The last statement's result of analyst SQL (the earlier ones run and are dropped)."""
    last = None
    for rel in run_queries(con, sql):
        if last is not None:
            last.fetchall()
        last = rel
    return last


@pytest.fixture()
def lake(tmp_path):
    root = tmp_path / "it's a lake"  # a quote in the path must not break (or inject into) the SQL
    lk = Lake(root)
    rows = [
        {
            "minute": datetime(2024, 1, 1, 0, i, tzinfo=UTC),
            "gpu_uuid": g,
            "namespace": ns,
            "gpu_util_pct": u,
            "rfu_pct": r,
            "pif": r / 100,
            "efficiency_gap_pct": u - r,
            "phase": ph,
            "price_usd_per_hour": 3.0,
        }
        for i, (g, ns, u, r, ph) in enumerate(
            [
                ("GPU-a", "team-a", 90.0, 20.0, "compute_bound"),
                ("GPU-a", "team-a", 5.0, 10.0, "idle"),
                ("GPU-b", "team-b", 80.0, 70.0, "productive"),
            ]
        )
    ]
    m = minutes_frame(rows)
    lk.write("gpu_minutes", D, m)
    lk.write("priced_waste", D, collect_stable(priced_waste(minute_runs(m.lazy()))))
    lk.write("fleet_daily", D, collect_stable(fleet_daily(minute_runs(m.lazy()))))
    return lk


def test_views_read_the_lake_and_curated_views_work(lake, tmp_path):
    db = build_views_file(lake.root, tmp_path / "w.duckdb")
    con = connect_readonly(lake.root, db)
    assert run_query(con, "SELECT count(*) FROM gpu_minutes").fetchall()[0] == (3,)
    fd = run_query(
        con, "SELECT gpus, gpu_hours, avg_gpu_util_pct, pct_idle FROM fleet_daily"
    ).fetchall()[0]
    assert fd[0] == 2 and fd[1] == pytest.approx(3 / 60) and fd[2] == pytest.approx(175 / 3)
    assert fd[3] == pytest.approx(100 / 3)
    # a table of the lake now, with the day's coverage: 3 of 2 x 1,440 GPU-minutes
    cov = run_query(
        con, "SELECT observed_gpu_minutes, expected_gpu_minutes, coverage_pct FROM fleet_daily"
    ).fetchall()[0]
    assert cov[:2] == (3, 2880) and cov[2] == pytest.approx(100 * 3 / 2880)
    ns = dict(run_query(con, "SELECT namespace, total_waste_usd FROM namespace_waste").fetchall())
    per_min = 3.0 / 60
    assert ns["team-a"] == pytest.approx(
        per_min * (0.7 + 0.1) + per_min
    )  # busy minute: stall .7 + headroom .1
    # every table has a view, typed even when the lake has no partition of it yet
    for t in TABLES:
        cols = [r[0] for r in run_query(con, f"DESCRIBE {t}").fetchall()]
        assert cols == list(TABLES[t]), t


def test_shipped_queries_run(lake, tmp_path):
    con = connect_readonly(lake.root, build_views_file(lake.root, tmp_path / "w.duckdb"))
    queries = sorted(QUERIES_DIR.glob("*.sql"))
    assert len(queries) >= 3
    results = {q.stem: run_query(con, q.read_text()).pl() for q in queries}
    top = results["top_wasted_namespaces"]
    assert top["namespace"].to_list()[0] == "team-a"
    assert results["fleet_trend"]["gpus"].to_list() == [2]


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO 'x.csv'",
        "CREATE TABLE t AS SELECT 1",
        "DROP VIEW gpu_minutes",
        "SELECT 1; DELETE FROM gpu_minutes",
        "ATTACH 'other.duckdb'",
        "INSTALL httpfs",
    ],
)
def test_writes_are_refused(lake, tmp_path, sql):
    con = connect_readonly(lake.root, build_views_file(lake.root, tmp_path / "w.duckdb"))
    with pytest.raises(SqlError):
        run_query(con, sql)
    assert run_query(con, "SELECT count(*) FROM gpu_minutes").fetchall()[0] == (3,)


def test_files_outside_the_lake_are_unreadable(lake, tmp_path):
    secret = tmp_path / "secret.csv"
    pl.DataFrame({"a": [1]}).write_csv(secret)
    con = connect_readonly(lake.root, build_views_file(lake.root, tmp_path / "w.duckdb"))
    with pytest.raises(SqlError):
        run_query(con, f"SELECT * FROM read_csv('{secret}')")
