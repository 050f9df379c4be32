"""A lake in an object store has no DuckDB views: DuckDB reads the store only through its httpfs
extension, not available here. `materialize` wrote a views file over `<cwd>/s3:/…` (an empty
folder) whose every view was empty, and `gpu-pipeline sql --lake s3://…` said the lake was not a
lake (review). Now no file is written (one an earlier version left is removed), the
`warehouse_views` asset says how to read the lake, and `sql` refuses in that one line."""

import os
import subprocess
import sys
from datetime import date

import duckdb
import polars as pl
import pytest

moto_server = pytest.importorskip("moto.server")

from helpers import MODELS, cli_env, expo_lines, moto_s3, write_file  # noqa: E402

from gpu_pipeline import settings  # noqa: E402
from gpu_pipeline.cli import main  # noqa: E402
from gpu_pipeline.lib.io.warehouse import (  # noqa: E402
    LakeError,
    build_views_file,
    is_lake,
    object_store_note,
    views_current,
)

DAY = date(2024, 1, 1)
LAKE = "s3://lake1/fleet"


@pytest.fixture()
def s3(monkeypatch):
    with moto_s3(monkeypatch, "lake1"):
        yield LAKE


def _cli(cwd, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpu_pipeline.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_s3_lake_gets_no_views_file_and_sql_says_how_to_read_it(s3, tmp_path):
    import dagster as dg

    lines = expo_lines("GPU-S", MODELS["A100"], "n1", "team", DAY, range(600, 700), 85, 100.0)
    write_file(tmp_path / "raw" / "c1" / f"n1_{DAY}.prom", lines)
    env = cli_env(tmp_path) | {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    # the views file an earlier version wrote for this lake (views over <cwd>/s3:/lake1/fleet)
    stale = tmp_path / "data" / "cache" / settings.warehouse_path(LAKE).parent.name
    stale.mkdir(parents=True)
    duckdb.connect(str(stale / "_warehouse.duckdb")).close()
    out = _cli(tmp_path, env, "materialize", "--start", str(DAY), "--raw", str(tmp_path / "raw"),
               "--lake", LAKE)  # fmt: skip
    assert out.returncode == 0 and " ok " in out.stdout, out.stdout + out.stderr
    assert (
        f"; lake {LAKE}, views none (gpu-pipeline sql --lake says how to read it)\n" in out.stdout
    )
    assert "_warehouse.duckdb" not in out.stdout
    assert sorted(str(p) for p in tmp_path.rglob("*.duckdb*")) == []  # none written, stale gone
    note = object_store_note(LAKE)
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
        ev = instance.get_latest_materialization_event(dg.AssetKey("warehouse_views"))
        meta = ev.asset_materialization.metadata
    assert meta["note"].value == note and "dagster/uri" not in meta
    assert meta["views_file"].value == "none: the views file serves local lakes"
    # what the note says to run reads the lake's days
    got = pl.scan_parquet(f"{LAKE}/gpu_minutes/date=*/data.parquet", hive_partitioning=True)
    assert got.select("date").unique().collect()["date"].to_list() == [DAY]
    assert got.collect().height == 100
    sql = _cli(tmp_path, env, "sql", "--lake", LAKE, "SELECT count(*) FROM gpu_minutes")
    assert (sql.returncode, sql.stdout, sql.stderr) == (2, "", f"error: {note}\n")


def test_nothing_builds_views_over_an_object_store_lake(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    note = object_store_note("s3://b/p/")
    assert note.startswith("s3://b/p is a lake in an object store: `gpu-pipeline sql` and the ")
    assert 'pl.scan_parquet("s3://b/p/<table>/date=*/data.parquet", hive_partitioning=True)' in note
    with pytest.raises(LakeError) as e:
        build_views_file("s3://b/p", tmp_path / "w.duckdb")
    assert str(e.value) == object_store_note("s3://b/p")
    assert list(tmp_path.iterdir()) == [] and not is_lake("s3://b/p")
    # no file is what this version writes for such a lake: current without one, stale with one
    assert views_current(tmp_path / "w.duckdb", "s3://b/p")
    (tmp_path / "w.duckdb").write_bytes(b"")
    assert not views_current(tmp_path / "w.duckdb", "s3://b/p")
    assert main(["sql", "--lake", "s3://b/p", "SELECT 1"]) == 2
    assert capsys.readouterr().err == f"error: {object_store_note('s3://b/p')}\n"
