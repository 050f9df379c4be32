"""The Dagster UI on a real `dg dev` (loopback), driven through the GraphQL the UI sends: the
resource page, the runs list of CLI runs, a "Materialize all" backfill of past days (freshness
stays out of it), the metadata of its materializations, and the freshness sensor judging.

The helpers are tests/test_e2e_server.py's; one server serves every test of this module, in
order (the sensor's test comes after the backfill's).
"""

import shutil
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from helpers import cli, cli_env
from servers import dg_dev
from test_e2e_server import (
    LAUNCH,
    LOCATION,
    START_SENSOR,
    TICKS,
    gql,
    wait_backfills,
    wait_for,
)

from gpu_pipeline.lib.generate import generate

REPO = Path(__file__).resolve().parents[1]
CLI_DAY = date(2026, 3, 1)  # `gpu-pipeline materialize` of one day
BACKFILL = [date(2026, 3, 2), date(2026, 3, 3)]  # a "Materialize all" backfill from the UI
CLI_RANGE = [date(2026, 3, 4), date(2026, 3, 5)]  # `gpu-pipeline materialize` of a range
PRICES = "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA100-SXM4-40GB,3.25,1.25\n"
FRESHNESS_ASSETS = ["priced_waste", "recommendations", "persistent_bottlenecks", "daily_report"]

RESOURCE = """query($name: String!) { topLevelResourceDetailsOrError(resourceSelector: {
  repositoryLocationName: "gpu_pipeline", repositoryName: "__repository__", resourceName: $name
}) { __typename ... on ResourceDetails { configFields { name description }
  configuredValues { key value type } } } }"""
RUNS_FEED = """{ runsFeedOrError(limit: 50, view: RUNS) { ... on RunsFeedConnection {
  results { ... on Run { runId jobName tags { key value } } } } } }"""
# what the UI's LaunchAssetLoaderQuery reads before "Materialize all"
ASSET_NODES = "{ assetNodes { assetKey { path } isExecutable isObservable } }"
CHECK_EXECUTIONS = """query($key: AssetKeyInput!) {
  assetCheckExecutions(assetKey: $key, checkName: "freshness_check", limit: 50) {
    runId status evaluation { success description } } }"""
MATERIALIZATIONS = """query($key: AssetKeyInput!, $p: [String!]) { assetNodeOrError(assetKey: $key) {
  ... on AssetNode { assetMaterializations(partitions: $p) { partition runId metadataEntries {
    label ... on MarkdownMetadataEntry { mdStr } ... on TextMetadataEntry { text }
    ... on JsonMetadataEntry { jsonString } } } } } }"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    days = [CLI_DAY, *BACKFILL, *CLI_RANGE]
    generate(tmp / "raw", days[0], days=len(days), gpus=4, clusters=1, seed=7)
    (tmp / "prices.csv").write_text(PRICES)
    home = tmp / "dh"
    home.mkdir()
    shutil.copyfile(REPO / "config" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **cli_env(tmp),
        "GPU_PIPELINE_RAW": str(tmp / "raw"),
        "GPU_PIPELINE_LAKE": str(tmp / "lake"),
        "GPU_PIPELINE_PRICES": str(tmp / "prices.csv"),
        "GPU_PIPELINE_CHUNK_MB": "256",
    }
    # runs from the CLI first, in the instance the UI then reads: one day, then a range
    cli("materialize", "--start", str(CLI_DAY), env=env)
    cli("materialize", "--start", str(CLI_RANGE[0]), "--end", str(CLI_RANGE[-1]), env=env)
    with dg_dev(env, tmp / "dev.log") as port:

        def loaded():
            entries = gql(port, LOCATION)["workspaceOrError"]["locationEntries"]
            return entries and all(e["loadStatus"] == "LOADED" for e in entries) and entries

        wait_for(loaded, 180, "the code location to load", tmp / "dev.log")
        yield port, tmp


def test_resource_fields_name_their_variable_and_the_value_in_force(ui):
    port, tmp = ui
    fields, values = {}, {}
    for name in ("lake", "landing", "reference"):
        r = gql(port, RESOURCE, {"name": name})["topLevelResourceDetailsOrError"]
        assert r["__typename"] == "ResourceDetails", r
        fields[name] = {f["name"]: f["description"] or "" for f in r["configFields"]}
        values[name] = {v["key"]: (v["type"], v["value"]) for v in r["configuredValues"]}
    lake, landing, ref = fields["lake"], fields["landing"], fields["reference"]
    # a variable that is set: its name is the field's value (an EnvVar), and the description
    # says what it resolved to
    assert values["lake"]["chunk_mb"] == ("ENV_VAR", "GPU_PIPELINE_CHUNK_MB")
    assert lake["chunk_mb"].startswith("GPU_PIPELINE_CHUNK_MB (default: 400)")
    assert lake["chunk_mb"].endswith("In force: 256")
    assert values["lake"]["root"] == ("ENV_VAR", "GPU_PIPELINE_LAKE")
    assert lake["root"].startswith("GPU_PIPELINE_LAKE") and str(tmp / "lake") in lake["root"]
    assert landing["root"].startswith("GPU_PIPELINE_RAW") and str(tmp / "raw") in landing["root"]
    assert (
        ref["prices"].startswith("GPU_PIPELINE_PRICES")
        and str(tmp / "prices.csv") in (ref["prices"])
    )
    # a variable that is not set: the default's value, and what it stands for in the text
    assert values["lake"]["split"] == ("VALUE", '"gpus"')
    assert lake["split"] == "GPU_PIPELINE_SPLIT (default: gpus). In force: gpus"
    for field, var in (("energy", "GPU_PIPELINE_ENERGY"), ("catalog", "GPU_PIPELINE_CATALOG")):
        assert values["reference"][field] == ("VALUE", '""')
        assert ref[field].startswith(var) and "In force: shipped: " in ref[field], ref[field]
    assert ref["rules"].startswith("GPU_PIPELINE_RULES") and "built-in" in ref["rules"]
    assert str(tmp / "lake" / "_ingest_cache") in lake["cache"]
    # every field but the run-config one names its variable
    for name, f in fields.items():
        for field, text in f.items():
            assert text.startswith("GPU_PIPELINE_") or field == "rule_overrides", (name, field)


def _runs(port: int) -> list[dict]:
    runs = gql(port, RUNS_FEED)["runsFeedOrError"]["results"]
    return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in runs]


def test_cli_runs_show_their_days_in_the_runs_list(ui):
    port, _ = ui
    daily = [r for r in _runs(port) if r["jobName"] == "daily_pipeline"]
    one = [r for r in daily if r["tags"].get("dagster/partition") == str(CLI_DAY)]
    # one day: the partition tag, which the runs list shows beside the run (as for the UI's
    # own runs of one partition); a range cannot carry it (Dagster refuses both at once)
    assert len(one) == 1, daily
    assert "dagster/asset_partition_range_start" not in one[0]["tags"]
    (rng,) = [r for r in daily if "dagster/asset_partition_range_start" in r["tags"]]
    assert rng["tags"]["dagster/asset_partition_range_start"] == str(CLI_RANGE[0])
    assert rng["tags"]["dagster/asset_partition_range_end"] == str(CLI_RANGE[-1])
    # the list shows tags of the runs' own (not dagster/...): the range is one of them
    assert rng["tags"]["gpu_pipeline/days"] == f"{CLI_RANGE[0]} → {CLI_RANGE[-1]}"


def test_materialize_all_backfill_of_past_days_leaves_freshness_alone(ui):
    port, tmp = ui
    nodes = gql(port, ASSET_NODES)["assetNodes"]
    # "Materialize all" on the asset graph, two past days picked: the mutation the UI sends
    # (LaunchAssetChoosePartitionsDialog, the hidden asset job: no checks named, so Dagster
    # adds every check of the assets)
    selection = [
        {"path": n["assetKey"]["path"]}
        for n in nodes
        if n["isExecutable"] and not n["isObservable"]
    ]
    # 16 tables (namespace_monthly: the month of the days comes along), report, digest, views,
    # landing_files
    assert len(selection) == 20
    out = gql(
        port,
        LAUNCH,
        {
            "p": {
                "tags": [],
                "assetSelection": selection,
                "partitionNames": [str(d) for d in BACKFILL],
                "fromFailure": False,
            }
        },
    )
    assert out["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", out
    backfill_id = out["launchPartitionBackfill"]["backfillId"]
    wait_backfills(port, 1, tmp / "dev.log")
    runs = {r["runId"] for r in _runs(port) if r["tags"].get("dagster/backfill") == backfill_id}
    assert runs
    for asset in FRESHNESS_ASSETS:
        execs = gql(port, CHECK_EXECUTIONS, {"key": {"path": [asset]}})["assetCheckExecutions"]
        mine = [e for e in execs if e["runId"] in runs]
        # yesterday is not in this lake: a freshness check judged at the end of the backfill
        # said "overdue"; it is not judged there at all (planned with the asset, skipped)
        assert all(e["evaluation"] is None for e in mine), (asset, mine)
        assert all(e["status"] == "SKIPPED" for e in mine), (asset, mine)
        assert not [e for e in execs if e["status"] == "FAILED"], (asset, execs)

    # what those runs recorded, per partition: the ingest_log preview names files, not paths
    got = gql(port, MATERIALIZATIONS, {"key": {"path": ["ingest_log"]}, "p": [str(BACKFILL[0])]})[
        "assetNodeOrError"
    ]["assetMaterializations"]
    m = next(m for m in got if m["runId"] in runs)
    preview = next(e["mdStr"] for e in m["metadataEntries"] if e["label"] == "preview")
    name = f"us-east-train-node-00_{BACKFILL[0]}.prom"
    assert f"| {name} |" in preview and "us-east-train/" not in preview, preview

    # priced_waste: the price book entries used and whose book, the energy rates, the rules
    got = gql(port, MATERIALIZATIONS, {"key": {"path": ["priced_waste"]}, "p": [str(BACKFILL[1])]})[
        "assetNodeOrError"
    ]["assetMaterializations"]
    meta = {
        e["label"]: e.get("mdStr") or e.get("text") or e.get("jsonString")
        for e in next(m for m in got if m["runId"] in runs)["metadataEntries"]
    }
    assert "| NVIDIA A100-SXM4-40GB | 3.25 | 1.25 |" in meta["prices_used"], meta["prices_used"]
    assert meta["price_book"] == f"GPU_PIPELINE_PRICES: {tmp / 'prices.csv'}"
    assert "| us-east-train | 0.12 | 400 | * |" in meta["energy_rates_in_force"]
    assert meta["energy_rates"].startswith("shipped default: ")
    assert '"health.hot_from_c"' in meta["rules"]


def test_the_freshness_sensor_judges_freshness(ui):
    port, tmp = ui
    selector = {
        "repositoryName": "__repository__",
        "repositoryLocationName": "gpu_pipeline",
        "sensorName": "freshness_checks_sensor",
    }
    started = gql(port, START_SENSOR, {"s": selector})["startSensor"]
    assert started["__typename"] == "Sensor", started
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    if datetime.now(UTC).hour < 6:  # before 06:00 the day before yesterday is expected
        yesterday -= timedelta(days=1)

    def judged():
        out = {}
        for asset in FRESHNESS_ASSETS:
            execs = gql(port, CHECK_EXECUTIONS, {"key": {"path": [asset]}})
            done = [e for e in execs["assetCheckExecutions"] if e["evaluation"] is not None]
            if not done:
                return None
            out[asset] = done[0]
        return out

    verdicts = wait_for(judged, 240, "the freshness sensor's run", tmp / "dev.log")
    for asset, e in verdicts.items():
        # the lake has March 2026 only: yesterday's partition is missing, and the sensor says so
        assert e["status"] == "FAILED" and e["evaluation"]["success"] is False, (asset, e)
        assert f"{asset} of {yesterday} was not there by" in e["evaluation"]["description"], e
    # judged by the sensor's run of the checks alone
    by_id = {r["runId"]: r for r in _runs(port)}
    for e in verdicts.values():
        assert by_id[e["runId"]]["tags"].get("gpu_pipeline/freshness") == "sensor", e

    # and judged once: until the next deadline or a new materialization, the ticks skip
    def skipped():
        ticks = gql(port, TICKS, {"s": selector})["sensorOrError"]["sensorState"]["ticks"]
        return ticks if ticks and ticks[0]["status"] == "SKIPPED" else None

    tick = wait_for(skipped, 120, "a freshness tick with nothing due", tmp / "dev.log")[0]
    assert "verdict for the latest deadline" in tick["skipReason"], tick
