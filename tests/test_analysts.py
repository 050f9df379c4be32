"""Analysts outside the CLI: every table folder of a real lake reads as a dataset with the first
thing a Python or SQL analyst types (pandas, pyarrow, Polars, DuckDB; Spark where it is
installed), `date` being the day its `date=` folder names. Lakes written before the day left the
files (partitions that still hold `date`) keep reading, through the lake's readers and the views."""

from __future__ import annotations

import importlib.util
import shutil
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest

from gpu_pipeline.defs import marts, monthly, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.warehouse import build_views_file, connect_readonly
from gpu_pipeline.lib.schemas import TABLES

START = date(2024, 1, 1)
DAYS = [START, START + timedelta(days=1)]
ASSETS = dg.load_assets_from_modules([raw, staging, marts, report])


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """A small generated fleet, two days materialized through the asset graph."""
    tmp = tmp_path_factory.mktemp("analysts")
    generate(tmp / "raw", START, len(DAYS), 4, 1, 42, "prom")
    res = {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }
    instance = dg.DagsterInstance.ephemeral()
    for d in DAYS:
        assert dg.materialize(
            ASSETS, partition_key=d.isoformat(), resources=res, instance=instance
        ).success
    # and their month (one partition, `date=2024-01-01`: the month's first day)
    month = [monthly.namespace_monthly]
    assert dg.materialize(month, partition_key="2024-01", resources=res, instance=instance).success
    return tmp / "lake"


def expected(root: Path) -> dict[str, dict[str, int]]:
    """Per table, the rows of each day as the lake reads them."""
    lk = Lake(root)
    out = {}
    for t in TABLES:
        days = [START] if t == "namespace_monthly" else DAYS  # a month: its first day
        assert lk.days(t) == days, t
        out[t] = {d.isoformat(): lk.read(t, d).height for d in days}
    assert sum(out["gpu_minutes"].values()) == 4 * 1440 * len(DAYS)
    return out


def counts(days: list) -> dict[str, int]:
    """Rows per day, from a column of days (dates, or their text)."""
    out: dict[str, int] = {}
    for d in days:
        key = d.isoformat() if isinstance(d, date) else str(d)
        out[key] = out.get(key, 0) + 1
    return out


def nonzero(c: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in c.items() if v}


def test_pandas_and_pyarrow_read_every_table_folder(lake):
    import pandas as pd
    import pyarrow.parquet as pq

    want = expected(lake)
    for t in TABLES:
        df = pd.read_parquet(lake / t)  # what a Python analyst types first
        assert isinstance(df["date"].dtype, pd.CategoricalDtype), t
        assert counts(df["date"].tolist()) == nonzero(want[t]), t
        assert set(TABLES[t]) <= set(df.columns), t
        table = pq.read_table(lake / t)
        assert counts(table.column("date").to_pylist()) == nonzero(want[t]), t


def test_polars_reads_every_table_folder(lake):
    want = expected(lake)
    for t in TABLES:
        df = pl.read_parquet(lake / t / "*" / "*.parquet", hive_partitioning=True)
        assert df.schema["date"] == pl.Date, t
        assert counts(df["date"].to_list()) == nonzero(want[t]), t
        scanned = pl.scan_parquet(lake / t).select("date").collect()
        assert scanned.schema["date"] == pl.Date
        assert counts(scanned["date"].to_list()) == nonzero(want[t]), t


def test_duckdb_reads_every_table_folder(lake):
    want = expected(lake)
    con = duckdb.connect()
    for t in TABLES:
        rows = con.execute(
            "SELECT date, typeof(date), count(*) FROM read_parquet(?, hive_partitioning = true) "
            "GROUP BY ALL ORDER BY date",
            [f"{lake}/{t}/*/*.parquet"],
        ).fetchall()
        assert all(kind == "DATE" for _, kind, _ in rows), (t, rows)
        assert {d.isoformat(): n for d, _, n in rows} == nonzero(want[t]), t


def test_the_files_do_not_hold_the_partition_column(lake):
    """The day is in the folder's name only (the column in the file is what pyarrow refuses)."""
    import pyarrow.parquet as pq

    for t in TABLES:
        for f in (lake / t).glob("date=*/data.parquet"):
            names = pq.read_schema(f).names
            assert "date" not in names and names == [c for c in TABLES[t] if c != "date"], t


@pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None or shutil.which("java") is None,
    reason="Spark: needs pyspark (pip install pyspark) and a JVM (java 17)",
)
def test_spark_reads_every_table_folder(lake):
    from pyspark.sql import SparkSession

    want = expected(lake)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("gpu_pipeline analysts")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        for t in TABLES:
            df = spark.read.parquet(str(lake / t))
            assert dict(df.dtypes)["date"] == "date", t
            got = {r["date"].isoformat(): r["count"] for r in df.groupBy("date").count().collect()}
            assert got == nonzero(want[t]), t
    finally:
        spark.stop()


# -- lakes written before `date` left the files ------------------------------------------------


def old_style(lk: Lake, table: str, day: date, df: pl.DataFrame) -> None:
    """A partition as earlier versions wrote it: `date` stored in the file, first."""
    from gpu_pipeline.lib.samples import conform

    path = lk.partition_file(table, day)
    path.parent.mkdir(parents=True, exist_ok=True)
    conform(df.with_columns(pl.lit(day).alias("date")), TABLES[table]).write_parquet(path)


def test_an_old_partition_beside_a_new_one_reads_everywhere(tmp_path):
    root = tmp_path / "lake"
    lk = Lake(root)
    old, new = date(2024, 1, 1), date(2024, 1, 2)
    old_style(
        lk, "gpu_daily", old, pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "minutes": [1, 2]})
    )
    lk.write("gpu_daily", new, pl.DataFrame({"gpu_uuid": ["GPU-c"], "minutes": [3]}))
    import pyarrow.parquet as pq

    assert "date" in pq.read_schema(lk.partition_file("gpu_daily", old)).names
    assert "date" not in pq.read_schema(lk.partition_file("gpu_daily", new)).names
    schema = pl.Schema(TABLES["gpu_daily"])
    for day, uuids in ((old, ["GPU-a", "GPU-b"]), (new, ["GPU-c"])):
        df = lk.read("gpu_daily", day)
        assert df.schema == schema and df["date"].to_list() == [day] * len(uuids)
        assert df["gpu_uuid"].to_list() == uuids
    both = lk.read_days("gpu_daily", [old, new])
    scanned = lk.scan_days("gpu_daily", [old, new]).collect()
    for df in (both, scanned):
        assert df.schema == schema
        assert df.select("date", "gpu_uuid").rows() == [
            (old, "GPU-a"),
            (old, "GPU-b"),
            (new, "GPU-c"),
        ]
    # the DuckDB views: in memory (`gpu-pipeline sql`) and the views file (a glob)
    query = "SELECT date, typeof(date), gpu_uuid, minutes FROM gpu_daily ORDER BY gpu_uuid"
    want = [(old, "DATE", "GPU-a", 1), (old, "DATE", "GPU-b", 2), (new, "DATE", "GPU-c", 3)]
    assert connect_readonly(root).execute(query).fetchall() == want
    db = build_views_file(root, tmp_path / "views.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(query).fetchall() == want
        (sql,) = con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'gpu_daily'"
        ).fetchone()
        assert "date=[0-9]" in sql and "hive_partitioning = true" in sql  # globbed


@pytest.mark.parametrize("above", ["env=prod", "date=2020-01-01"])
def test_views_take_the_day_from_the_partition_under_a_lake_path_with_key_value_folders(
    tmp_path, above
):
    """DuckDB reads every `key=value` folder of a path as a column, the first of a name winning:
    a lake below such a folder still has each row on its own partition's day, and no column
    from the folders above it."""
    root = tmp_path / above / "lake"
    lk = Lake(root)
    lk.write("gpu_daily", date(2024, 1, 2), pl.DataFrame({"gpu_uuid": ["GPU-c"], "minutes": [3]}))
    old_style(lk, "gpu_daily", date(2024, 1, 1), pl.DataFrame({"gpu_uuid": ["GPU-a"]}))
    query = "SELECT * FROM gpu_daily ORDER BY gpu_uuid"
    for con in (
        connect_readonly(root),
        duckdb.connect(str(build_views_file(root, tmp_path / "v.duckdb")), read_only=True),
    ):
        rel = con.sql(query)
        assert rel.columns == list(TABLES["gpu_daily"])
        assert [(r[0], r[1]) for r in rel.fetchall()] == [
            (date(2024, 1, 1), "GPU-a"),
            (date(2024, 1, 2), "GPU-c"),
        ]
        con.close()


def test_a_partition_linked_to_another_days_folder_is_skipped(tmp_path):
    """The views read a partition's day from the folder its file is in: a `date=` folder that
    is a link to another day's folder would give that day's rows a second day. It is skipped,
    named."""
    root = tmp_path / "lake"
    lk = Lake(root)
    lk.write("gpu_daily", date(2024, 1, 5), pl.DataFrame({"gpu_uuid": ["GPU-a"]}))
    (root / "gpu_daily" / "date=2024-01-01").symlink_to(root / "gpu_daily" / "date=2024-01-05")
    from gpu_pipeline.lib.io.warehouse import scan_partitions

    parts = scan_partitions(root)
    assert [Path(f).parent.name for f in parts.files["gpu_daily"]] == ["date=2024-01-05"]
    (skipped,) = [why for p, why in parts.skipped if "date=2024-01-01" in p]
    assert "outside its own date=2024-01-01 folder" in skipped
    con = connect_readonly(root)
    assert con.execute("SELECT date, gpu_uuid FROM gpu_daily").fetchall() == [
        (date(2024, 1, 5), "GPU-a")
    ]


@pytest.mark.parametrize(
    "forgery",
    [
        "CREATE OR REPLACE VIEW gpu_daily AS SELECT 'GPU-forged' AS gpu_uuid",
        "CREATE MACRO waste(x) AS x * 0",
        "CREATE TABLE notes AS SELECT 1 AS a",
        "CREATE SCHEMA other",
        "CREATE TYPE mood AS ENUM ('ok')",
        "CREATE SEQUENCE s",
        "COMMENT ON VIEW gpu_daily IS 'audited'",
    ],
)
def test_a_views_file_changed_behind_the_state_comment_is_not_current(tmp_path, forgery):
    """The state comment alone said "current": a file with a view changed or an object added,
    the comment kept, survived materialize (adversarial review). Now its whole catalog must be
    what this version writes."""
    from gpu_pipeline.lib.io.warehouse import views_current

    root = tmp_path / "lake"
    Lake(root).write("gpu_daily", date(2024, 1, 1), pl.DataFrame({"gpu_uuid": ["GPU-a"]}))
    db = build_views_file(root, tmp_path / "v.duckdb")
    assert views_current(db, root)
    with duckdb.connect(str(db)) as con:
        con.execute(forgery)
    assert not views_current(db, root)
    db = build_views_file(root, db)
    assert views_current(db, root)


def test_a_views_file_written_before_is_rebuilt(tmp_path):
    """A views file an earlier version wrote (its views reading `date` from the files) no longer
    matches its lake: materialize rewrites it, so the new partitions' days are not NULL there."""
    import json

    from gpu_pipeline.lib.io.warehouse import STATE_ON, STATE_PREFIX, views_current

    root = tmp_path / "lake"
    Lake(root).write("gpu_daily", date(2024, 1, 1), pl.DataFrame({"gpu_uuid": ["GPU-a"]}))
    db = build_views_file(root, tmp_path / "v.duckdb")
    assert views_current(db, root)
    with duckdb.connect(str(db)) as con:  # the state as the earlier version recorded it
        (comment,) = con.execute(
            "SELECT comment FROM duckdb_views() WHERE view_name = ?", [STATE_ON]
        ).fetchone()
        state = json.loads(comment.removeprefix(STATE_PREFIX))
        del state["views"]
        old = (STATE_PREFIX + json.dumps(state)).replace("'", "''")
        con.execute(f"COMMENT ON VIEW {STATE_ON} IS '{old}'")
    assert not views_current(db, root)
