"""End to end on a real `dagster dev` (loopback): the landing-zone sensor turned on for real, late
data, then a backfill launched over GraphQL as the UI launches it, with the real samples landed.

The end state of the sensor's backfills must equal a clean run of the same files, day by day.
"""

import json
import os
import shutil
import time
import urllib.request
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines, write_file
from servers import dg_dev, load, start_victoria_metrics

from gpu_pipeline.defs import marts, report, staging
from gpu_pipeline.defs import raw as raw_assets
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.io.lake import Lake

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO.parent / "shared" / "samples"
LATE = date(2026, 4, 2)  # clear of the samples' days
DAYS = [LATE + timedelta(days=i) for i in range(3)]  # the first lands after the others
PRICES = (
    "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA100-SXM4-40GB,3.0,1.0\n"
    "H100 80GB HBM3,5.0,2.0\n"
)
OLD = datetime(2025, 8, 1, 12, tzinfo=UTC).timestamp()
# the samples landed here: the trace without model or power limit (no RFU, 2025-07-26), the files
# without a time of their own (MIG exposition, vGPU, garbage, the CRLF copy, the file landed
# twice: filed on their mtime day), nvidia-smi under MIG (utilization [N/A], 2026-07-14). Every
# sample day also runs through the CLI in test_real_fleets; here each backfilled day costs runs.
SKIPPED = (
    "trace_nvidia-smi-loop_2x-titanx",
    "prometheus-api_query",
    "nvidia-smi_query-gpu_all-fields_rtx",
    "nvidia-smi_q-x",  # snapshots of days of their own (2023-08-04, 2025-12-30)
)
SAMPLE_DAYS = ["2025-07-26", "2025-08-01", "2026-07-14"]
PARTITIONED = [
    "gpu_samples",
    "quarantine",
    "ingest_log",
    "gpu_minutes",
    "gpu_daily",
    "hourly_fleet_metrics",
    "persistent_bottlenecks",
    "priced_waste",
    "fleet_daily",
    "recommendations",
    "gpu_health",
    "stragglers",
    "efficiency_roi",
    "namespace_efficiency",
    "workload_efficiency",
    "daily_report",
]


def plant(raw_dir: Path, d: date) -> None:
    """GPU-S starved (util 85 at 100 W on an A100) every day; GPU-E efficient on an H100."""
    lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, range(600, 720), 85, 100.0)
    lines += expo_lines("GPU-E", MODELS["H100"], "n1", "good", d, range(600, 720), 95, 560.0, gpu=1)
    write_file(raw_dir / "cluster-a" / f"n1_{d.isoformat()}.prom", lines)


def land_samples(rawd: Path) -> None:
    """The real samples, plus what tools do to files: a CRLF copy, a file landed twice."""
    if not SAMPLES.is_dir():
        return  # a checkout without ../shared: the sensor and late-data part still runs
    rawd.mkdir(parents=True)
    for f in SAMPLES.iterdir():
        if f.name != "README.md" and not f.name.startswith(SKIPPED):
            (rawd / f.name).write_bytes(f.read_bytes())
    expo = (SAMPLES / "dcgm-exporter_l40s_1gpu_k8s-helm_prof.prom").read_bytes()
    (rawd / "crlf.prom").write_bytes(expo.replace(b"\n", b"\r\n"))
    (rawd / "twice.prom").write_bytes(expo)
    for p in rawd.iterdir():
        os.utime(p, (OLD, OLD))  # files without a time of their own are filed on this day


def gql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    assert "errors" not in out, out
    return out["data"]


def wait_for(fn, timeout: float, what: str, log: Path | None = None):
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
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}: {last}\n{tail}")


PULL_DAYS = [date(2026, 5, 1) + timedelta(days=i) for i in range(3)]
PULL_CLUSTER = "us-east-train"  # the generated cluster: pulled and file minutes name it alike


@pytest.fixture()
def server(tmp_path):
    rawd = tmp_path / "raw"
    for d in DAYS[1:]:
        plant(rawd, d)
    land_samples(rawd / "samples")
    # a real Prometheus-compatible server holding three more days, which only it has
    vm, vm_url = start_victoria_metrics(tmp_path)
    load(vm_url, generate(tmp_path / "vmfiles", PULL_DAYS[0], days=3, gpus=2, clusters=1, seed=3))
    (tmp_path / "prices.csv").write_text(PRICES)
    home = tmp_path / "dh"
    home.mkdir()
    shutil.copyfile(REPO / "config" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GPU_PIPELINE_RAW": str(rawd),
        "GPU_PIPELINE_LAKE": str(tmp_path / "lake"),
        "GPU_PIPELINE_PRICES": str(tmp_path / "prices.csv"),
        "GPU_PIPELINE_SENSOR_INTERVAL": "5",
        "GPU_PIPELINE_PROM_URL": vm_url,
        "GPU_PIPELINE_PROM_CLUSTER": PULL_CLUSTER,
    }
    try:
        with dg_dev(env, tmp_path / "dev.log") as port:
            yield port, tmp_path
    finally:
        vm.terminate()
        vm.wait(timeout=30)


MATERIALIZATIONS = (
    "query($key: AssetKeyInput!, $p: [String!]) { assetNodeOrError(assetKey: $key) { ... on "
    "AssetNode { assetMaterializations(partitions: $p) { partition metadataEntries { label ... on "
    "IntMetadataEntry { intValue } ... on PathMetadataEntry { path } } } } } }"
)

LOCATION = (
    "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
    "locationOrLoadError { __typename } } } } }"
)
START_SENSOR = """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
  __typename ... on Sensor { sensorState { id status } } ... on PythonError { message } } }"""
TICKS = """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
  ... on Sensor { sensorState { ticks(limit: 1) { status skipReason } } } } }"""
STOP_SENSOR = """mutation($id: String!) { stopSensor(id: $id) { __typename } }"""
BACKFILLS = (
    """{ partitionBackfillsOrError { ... on PartitionBackfills { results { id status } } } }"""
)
LAUNCH = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
RUNS = """query($tags: [ExecutionTag!]) { runsOrError(filter: {tags: $tags}) {
  ... on Runs { results { runId status jobName tags { key value } } } } }"""
DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def backfills(port: int) -> list[dict]:
    return gql(port, BACKFILLS)["partitionBackfillsOrError"]["results"]


def wait_backfills(port: int, n: int, log: Path) -> list[dict]:
    """Wait until there are `n` backfills and all are done; they must all have succeeded."""

    def done():
        b = backfills(port)
        return b if len(b) >= n and all(x["status"] in DONE for x in b) else None

    b = wait_for(done, 400, f"{n} backfill(s) to finish", log)
    assert all(x["status"] in ("COMPLETED", "COMPLETED_SUCCESS") for x in b), (b, log_tail(log))
    for x in b:
        runs = gql(port, RUNS, {"tags": [{"key": "dagster/backfill", "value": x["id"]}]})
        results = runs["runsOrError"]["results"]
        assert results and all(r["status"] == "SUCCESS" for r in results), results
    return b


def log_tail(log: Path) -> str:
    return log.read_text()[-3000:]


def clean_run(tmp: Path, days: list[date], raw: Path | None = None, lake: str = "clean") -> Lake:
    """The same files, materialized day by day in order in a fresh lake, in process."""
    assets = dg.load_assets_from_modules([raw_assets, staging, marts, report])
    res = {
        "lake": LakeResource(root=str(tmp / lake)),
        "landing": LandingResource(root=str(raw or tmp / "raw")),
        "reference": ReferenceResource(prices=str(tmp / "prices.csv")),
    }
    instance = dg.DagsterInstance.ephemeral()
    for d in days:
        assert dg.materialize(assets, partition_key=d.isoformat(), resources=res, instance=instance)
    return Lake(tmp / lake)


def test_sensor_late_data_and_a_ui_backfill_on_dagster_dev(server):
    port, tmp = server
    log = tmp / "dev.log"

    def loaded():
        entries = gql(port, LOCATION)["workspaceOrError"]["locationEntries"]
        return entries and all(e["loadStatus"] == "LOADED" for e in entries) and entries

    (entry,) = wait_for(loaded, 180, "the code location to load", log)
    assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation"
    assert entry["name"] == "gpu_pipeline"  # [tool.dg.project] code_location_name
    selector = {
        "repositoryName": "__repository__",
        "repositoryLocationName": entry["name"],
        "sensorName": "landing_zone_sensor",
    }
    # history first, from the UI: a backfill of every asset over the planted days and the
    # samples' days (Dagster may carry the persistence window, and depending on its walk
    # daily_report, to days without data: their runs succeed too)
    out = gql(
        port,
        LAUNCH,
        {
            "p": {
                "partitionNames": [d.isoformat() for d in DAYS[1:]]
                + (SAMPLE_DAYS if SAMPLES.is_dir() else []),
                "assetSelection": [{"path": [k]} for k in PARTITIONED],
            }
        },
    )
    assert out["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", out
    wait_backfills(port, 1, log)

    # then the sensor, over a lake that already holds those files: nothing to run again
    started = gql(port, START_SENSOR, {"s": selector})["startSensor"]
    assert started["__typename"] == "Sensor", started

    def ticked():
        ticks = gql(port, TICKS, {"s": selector})["sensorOrError"]["sensorState"]["ticks"]
        return ticks if ticks and ticks[0]["status"] in ("SKIPPED", "SUCCESS") else None

    tick = wait_for(ticked, 120, "the sensor's first tick", log)[0]
    assert tick["status"] == "SKIPPED" and "already in the lake" in tick["skipReason"], tick

    # the late day lands: the sensor parses it in a run, then backfills it and the window after
    # it, the window days only once the late day's gpu_daily is written
    plant(tmp / "raw", LATE)
    wait_backfills(port, 2, log)
    parse_runs = gql(port, RUNS, {"tags": [{"key": "trigger", "value": "landing_zone"}]})
    parses = [
        r
        for r in parse_runs["runsOrError"]["results"]
        if not any(t["key"] == "dagster/backfill" for t in r["tags"])
    ]
    assert len(parses) == 1 and parses[0]["status"] == "SUCCESS"
    gql(port, STOP_SENSOR, {"id": started["sensorState"]["id"]})

    lake = Lake(tmp / "lake")
    pb = lake.read("persistent_bottlenecks", DAYS[2])
    # GPU-S was bottlenecked on all three days: persistent on the third (issue item 11)
    assert pb["gpu_uuid"].to_list() == ["GPU-s"] and pb["days_bottlenecked"].to_list() == [3]
    window = [LATE + timedelta(days=k) for k in range(9)]
    clean = clean_run(tmp, window)
    # the data days in full; the days after them only got their window assets (no data of
    # their own), whose persistence must read the late day like a clean run does
    for table, days in (
        ("gpu_minutes", DAYS),
        ("gpu_daily", DAYS),
        ("priced_waste", DAYS),
        ("persistent_bottlenecks", window),
    ):
        for d in days:
            got, want = lake.read(table, d), clean.read(table, d)
            assert got.equals(want), (table, d, got, want)
    assert [d for d in window if lake.exists("gpu_minutes", d)] == DAYS

    # a 3-day UI backfill of days only the Prometheus-compatible server has: pulled, then the
    # same marts as the scrape files give (GPU_PIPELINE_PROM_URL is all that was configured)
    out = gql(
        port,
        LAUNCH,
        {
            "p": {
                "partitionNames": [d.isoformat() for d in PULL_DAYS],
                "assetSelection": [{"path": [k]} for k in ["prometheus_export", *PARTITIONED]],
            }
        },
    )
    assert out["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", out
    wait_backfills(port, 3, log)
    files = clean_run(tmp, PULL_DAYS, raw=tmp / "vmfiles", lake="vmclean")
    for d in PULL_DAYS:
        got, want = lake.read("gpu_minutes", d), files.read("gpu_minutes", d)
        assert got.height == 2 * 1440 and got.equals(want), d
        assert lake.read("priced_waste", d).equals(files.read("priced_waste", d)), d
        pulled = lake.read("ingest_log", d).filter(pl.col("origin").is_not_null())
        assert pulled.height > 0 and pulled["rows_accepted"].sum() > 0
    # what the UI shows for that 3-day range run: each day's own rows and file, per partition
    for table in ("gpu_minutes", "priced_waste"):
        got = gql(
            port,
            MATERIALIZATIONS,
            {"key": {"path": [table]}, "p": [d.isoformat() for d in PULL_DAYS]},
        )["assetNodeOrError"]["assetMaterializations"]
        latest = {}
        for m in got:  # newest first
            latest.setdefault(m["partition"], m)
        assert sorted(latest) == [d.isoformat() for d in PULL_DAYS], got
        for day, m in latest.items():
            meta = {e["label"]: e.get("intValue", e.get("path")) for e in m["metadataEntries"]}
            assert f"date={day}" in meta["dagster/uri"], (table, day, meta)
            assert meta["dagster/row_count"] == lake.read(table, date.fromisoformat(day)).height

    # the real samples, backfilled from the UI: every day they touch went through
    if not SAMPLES.is_dir():
        return
    for d in SAMPLE_DAYS:
        html = (tmp / "lake" / "_reports" / f"gpu_report_{d}.html").read_text()
        assert "data:image/png;base64," in html, d
    seen = set(
        pl.concat([lake.read("ingest_log", date.fromisoformat(d)) for d in SAMPLE_DAYS])[
            "source_file"
        ]
    )
    for f in SAMPLES.iterdir():
        if f.name != "README.md" and not f.name.startswith(SKIPPED):
            assert f"samples/{f.name}" in seen, f.name
    assert {"samples/crlf.prom", "samples/twice.prom"} <= seen
    mig = lake.read("gpu_minutes", date(2025, 8, 1)).filter(pl.col("gpu_instance_id").is_null())
    assert mig.height == mig["gpu_uuid"].n_unique()  # one scrape: each physical GPU once
