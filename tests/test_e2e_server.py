"""End to end with the real servers: `dagster dev` on loopback, a backfill launched over GraphQL."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pytest
from helpers import MODELS, expo_lines, write_file

REPO = Path(__file__).resolve().parents[1]
DAYS = [date(2024, 1, 1) + timedelta(days=i) for i in range(3)]
PARTITIONED = [
    "gpu_samples",
    "quarantine",
    "ingest_log",
    "gpu_minutes",
    "gpu_daily",
    "hourly_fleet_metrics",
    "persistent_bottlenecks",
    "priced_waste",
    "recommendations",
    "gpu_health",
    "stragglers",
    "efficiency_roi",
    "namespace_efficiency",
    "daily_report",
]


def gql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn, timeout: float, what: str):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = fn()
            if last:
                return last
        except OSError as e:  # server not up yet
            last = e
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}: {last}")


@pytest.fixture()
def server(tmp_path):
    raw = tmp_path / "raw"
    for d in DAYS:
        lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, range(600, 720), 85, 100.0)
        lines += expo_lines(
            "GPU-E", MODELS["H100"], "n1", "good", d, range(600, 720), 95, 560.0, gpu=1
        )
        write_file(raw / "cluster-a" / f"n1_{d.isoformat()}.prom", lines)
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA100-SXM4-40GB,3.0,1.0\n"
        "H100 80GB HBM3,5.0,2.0\n"
    )
    home = tmp_path / "dh"
    home.mkdir()
    shutil.copyfile(REPO / "config" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GPU_PIPELINE_RAW": str(raw),
        "GPU_PIPELINE_LAKE": str(tmp_path / "lake"),
        "GPU_PIPELINE_PRICES": str(prices),
    }
    dagster = str(Path(sys.executable).with_name("dagster"))
    with open(tmp_path / "dev.log", "w") as log:
        proc = subprocess.Popen(
            [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield port, tmp_path
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


LOCATION = (
    "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
    "locationOrLoadError { __typename } } } } }"
)
LAUNCH = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status } ... on PythonError { message } } }"""
RUNS = """query($id: String!) { runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
  ... on Runs { results { status } } } }"""


def test_backfill_through_graphql_on_dagster_dev(server):
    port, tmp = server

    def loaded():
        entries = gql(port, LOCATION)["data"]["workspaceOrError"]["locationEntries"]
        return entries and all(e["loadStatus"] == "LOADED" for e in entries) and entries

    entries = wait_for(loaded, 180, "the code location to load")
    assert entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation"

    out = gql(
        port,
        LAUNCH,
        {
            "p": {
                "partitionNames": [d.isoformat() for d in DAYS],
                "assetSelection": [{"path": [k]} for k in PARTITIONED],
            }
        },
    )
    launch = out["data"]["launchPartitionBackfill"]
    assert launch["__typename"] == "LaunchBackfillSuccess", out
    bid = launch["backfillId"]

    def done():
        status = gql(port, STATUS, {"id": bid})["data"]["partitionBackfillOrError"]["status"]
        return status if status not in ("REQUESTED",) else None

    status = wait_for(done, 480, "the backfill to finish")
    runs = gql(port, RUNS, {"id": bid})["data"]["runsOrError"]["results"]
    assert status in ("COMPLETED", "COMPLETED_SUCCESS"), (
        status,
        runs,
        (tmp / "dev.log").read_text()[-3000:],
    )
    assert runs and all(r["status"] == "SUCCESS" for r in runs)

    lake = tmp / "lake"
    con = duckdb.connect()
    minutes = con.sql(
        f"SELECT date, count(*) FROM read_parquet('{lake}/gpu_minutes/date=*/data.parquet') "
        "GROUP BY date ORDER BY date"
    ).fetchall()
    assert [(d, n) for d, n in minutes] == [(d, 240) for d in DAYS]
    waste = con.sql(
        f"SELECT namespace, sum(cost_usd) FROM read_parquet('{lake}/priced_waste/date=*/data.parquet') "
        "GROUP BY namespace ORDER BY namespace"
    ).fetchall()
    assert waste == [("good", pytest.approx(3 * 2 * 5.0)), ("starved", pytest.approx(3 * 2 * 3.0))]
    pb = con.sql(
        f"SELECT date, gpu_uuid FROM read_parquet('{lake}/persistent_bottlenecks/date=*/data.parquet')"
    ).fetchall()
    # GPU-s is bottlenecked on all three days: persistent from the third on (Dagster also carries the
    # 7-day window forward to the days after the backfill, which is what late data needs); only GPU-s
    assert {g for _, g in pb} == {"GPU-s"}
    assert min(d for d, _ in pb) == DAYS[2]
    assert (tmp / "reports" / "gpu_report_2024-01-03.html").is_file()
