"""The Dagster graph end to end on a planted fleet: materialize into a temp lake, check the marts."""

import hashlib
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline.definitions import defs
from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.schemas import TABLES

START = date(2024, 1, 1)
ASSETS = dg.load_assets_from_modules([raw, staging, marts, report])
# the tables with a partition a day (namespace_monthly's are months: tests/test_monthly.py)
DAILY_TABLES = [t for t in TABLES if t != "namespace_monthly"]


def test_definitions_load():
    job = defs.resolve_job_def("daily_pipeline")
    assert job.partitions_def == daily_partitions
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert keys == set(TABLES) | {
        "daily_report",
        "daily_digest",
        "warehouse_views",
        "landing_files",
    }
    job_keys = {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
    assert "warehouse_views" not in job_keys and "gpu_minutes" in job_keys
    assert "landing_files" not in job_keys  # unpartitioned: the sensor asks for it
    assert "daily_digest" in job_keys  # the schedule's runs post the digest
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert {
        "row_conservation",
        "validation_pass_rate",
        "minutes_add_up",
        "phase_shares_sum_to_100",
        "cost_split_sums_to_cost",
        "savings_within_measured_waste",
        "fleet_coverage",
    } <= checks
    assert any("freshness" in c for c in checks)
    # freshness is the sensor's to judge: a run (the demo, a backfill of past days) stays green
    job_checks = {k.name for k in job.asset_layer.asset_graph.asset_check_keys}
    assert job_checks and not any("freshness" in c for c in job_checks)
    assert {s.name for s in defs.sensors} == {
        "landing_zone_sensor",
        "freshness_checks_sensor",
        "monthly_automation_sensor",  # namespace_monthly's months follow their days
        "orphaned_runs_sensor",  # a killed materialize's run does not stay STARTED
    }
    spec = defs.resolve_assets_def("gpu_minutes").specs_by_key[dg.AssetKey("gpu_minutes")]
    cols = [c.name for c in spec.metadata["dagster/column_schema"].columns]
    assert cols[:3] == ["date", "minute", "gpu_uuid"] and "rfu_pct" in cols
    # the catalog documents every column of every table with its meaning
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        meta = defs.resolve_assets_def(key).specs_by_key[key].metadata
        if "dagster/column_schema" in meta:
            bare = [c.name for c in meta["dagster/column_schema"].columns if not c.description]
            assert not bare, (key, bare)
    # the views file is drawn downstream of every table it reads
    wh = defs.resolve_asset_graph().get(dg.AssetKey("warehouse_views"))
    assert {k.to_user_string() for k in wh.parent_keys} == set(TABLES)
    pif = next(c for c in spec.metadata["dagster/column_schema"].columns if c.name == "pif")
    assert "power_w / max_power_w" in pif.description
    graph = defs.resolve_asset_graph()
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert (
        groups["gpu_samples"] == "raw"
        and groups["gpu_minutes"] == "staging"
        and groups["priced_waste"] == "marts"
    )


def test_schedule_runs_yesterdays_partition():
    schedule = defs.resolve_schedule_def("daily_pipeline_schedule")
    ctx = dg.build_schedule_context(scheduled_execution_time=datetime(2024, 3, 5, 2, 0, tzinfo=UTC))
    reqs = list(schedule.evaluate_tick(ctx).run_requests or [])
    assert [r.partition_key for r in reqs] == ["2024-03-04"]


def plant(raw_dir, days: int):
    """Three A100 GPUs with known behaviour, 120 minutes a day from 10:00.

    GPU-S: util 85, 100 W (pif 0.25) every day -> bottlenecked every day.
    GPU-N: bottlenecked on days 0 and 2 only, efficient otherwise.
    GPU-E: util 95, 320 W (pif 0.8): efficient. A fourth GPU idles on day 0 only.
    """
    for i in range(days):
        d = START + timedelta(days=i)
        m = range(600, 720)
        lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, m, 85, 100.0, gpu=0)
        n_power = 100.0 if i in (0, 2) else 320.0
        lines += expo_lines("GPU-N", MODELS["A100"], "n1", "net", d, m, 80, n_power, gpu=1)
        lines += expo_lines("GPU-E", MODELS["A100"], "n1", "good", d, m, 95, 320.0, gpu=2)
        if i == 0:
            lines += expo_lines("GPU-I", MODELS["A100"], "n1", "idle", d, m, 3, 60.0, gpu=3)
        write_file(raw_dir / "cluster-a" / f"n1_{d.isoformat()}.prom", lines)


def run_days(tmp_path, days: list[date], instance=None):
    res = {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "landing": LandingResource(root=str(tmp_path / "raw")),
        "reference": ReferenceResource(),
    }
    instance = instance or dg.DagsterInstance.ephemeral()
    for d in days:
        result = dg.materialize(
            ASSETS, partition_key=d.isoformat(), resources=res, instance=instance
        )
        assert result.success
    return Lake(tmp_path / "lake")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    plant(tmp / "raw", 4)
    lake = run_days(tmp, [START + timedelta(days=i) for i in range(4)])
    return tmp, lake


def test_recommendations_and_report_for_planted_namespaces(planted):
    tmp, lake = planted
    rec = {r["namespace"]: r for r in lake.read("recommendations", START).iter_rows(named=True)}
    # no profiling fields here: busy at low power is enough to call the input pipeline
    assert {"DALI", "num_workers"} <= set(rec["starved"]["actions"])
    assert {"MPS", "MIG", "right_size"} & set(rec["idle"]["actions"])
    for r in rec.values():
        assert r["utilization_savings_frac"] <= r["measured_waste_frac"] + 1e-12
        assert r["total_savings_frac"] <= 1
    # reports live in their lake (two lakes never share them)
    html = (tmp / "lake" / "_reports" / "gpu_report_2024-01-01.html").read_text()
    assert html.count("data:image/png;base64,") >= 5 and "http" not in html.replace(
        "http-equiv", ""
    )
    assert "Bottlenecked today" in html and "<b><bdi>starved</bdi></b>" in html
    # four GPUs for two hours of the day: it says so before any figure
    partial = html.index("Partial data")
    assert partial < html.index("class='kpis'") < html.index("What to do first")
    banner = html[partial : html.index("</p>", partial)]
    assert "covers 8.3 % of its GPU-minutes" in banner
    assert "480 observed of 5,760 expected (4 GPUs seen × 1,440 minutes)" in banner
    # the report opens with what to do first: the top actions by dollars a month
    first = html[html.index("What to do first") : html.index("</ol>")]
    assert first.count("<li>") == 3 and "a month" in first
    # tables speak to people: no column names with underscores in their headers
    import re

    headers = re.findall(r"<th>([^<]*)</th>", html)
    assert headers and not [h for h in headers if "_" in h], headers
    health = lake.read("gpu_health", START)
    assert health.height == 4 and set(health["status"]) == {"ok"}


def test_every_table_written_for_every_day(planted):
    _, lake = planted
    for t in DAILY_TABLES:
        assert lake.days(t) == [START + timedelta(days=i) for i in range(4)], t


def test_fleet_daily_is_a_table_with_the_days_coverage(planted):
    _, lake = planted
    f = lake.read("fleet_daily", START).row(0, named=True)
    # GPU-S 85 % at 100 W (bottlenecked), GPU-N 80 % at 100 W (bottlenecked on day 0), GPU-E
    # 95 % at 320 W (efficient), GPU-I 3 % (idle): 120 minutes each
    assert (f["gpus"], f["gpu_hours"], f["observed_gpu_minutes"]) == (4, 8.0, 480)
    assert f["expected_gpu_minutes"] == 4 * 1440
    assert f["coverage_pct"] == pytest.approx(100 * 480 / 5760)
    assert f["avg_gpu_util_pct"] == pytest.approx((85 + 80 + 95 + 3) / 4)
    assert f["avg_pif"] == pytest.approx((100 + 100 + 320 + 60) / 400 / 4)
    assert (f["pct_idle"], f["pct_productive"], f["pct_compute_bound"]) == (25.0, 50.0, 25.0)
    assert f["pct_active_bottlenecked"] == pytest.approx(100 * 240 / 360)
    # on day 1 GPU-N is efficient and GPU-I gone: three GPUs, one bottlenecked
    f = lake.read("fleet_daily", START + timedelta(days=1)).row(0, named=True)
    assert (f["gpus"], f["expected_gpu_minutes"]) == (3, 3 * 1440)
    assert f["pct_active_bottlenecked"] == pytest.approx(100 / 3)
    daily = lake.read("gpu_daily", START)
    assert daily["coverage_pct"].to_list() == pytest.approx([100 * 120 / 1440] * 4)


def test_gpu_minutes_counts_and_pif(planted):
    _, lake = planted
    m = lake.read("gpu_minutes", START)
    assert m.height == 4 * 120
    per_gpu = (
        m.group_by("gpu_uuid")
        .agg(
            pl.len(),
            (pl.col("efficiency_class") == "bottlenecked").sum().alias("b"),
            pl.col("pif").mean(),
        )
        .sort("gpu_uuid")
    )
    assert per_gpu.rows() == [
        ("GPU-e", 120, 0, pytest.approx(0.8)),
        ("GPU-i", 120, 0, pytest.approx(0.15)),
        ("GPU-n", 120, 120, pytest.approx(0.25)),
        ("GPU-s", 120, 120, pytest.approx(0.25)),
    ]
    assert set(m["cluster"]) == {"cluster-a"}
    phases = m.group_by("phase").len().sort(pl.col("phase").cast(pl.String)).rows()
    assert phases == [("compute_bound", 120), ("idle", 120), ("productive", 240)]


def test_persistent_bottlenecks_three_of_seven(planted):
    _, lake = planted
    flagged = {
        d: lake.read("persistent_bottlenecks", d)["gpu_uuid"].to_list()
        for d in lake.days("gpu_daily")
    }
    # GPU-S from its third day; GPU-N has only two bottlenecked days in any window
    assert flagged == {
        START: [],
        START + timedelta(days=1): [],
        START + timedelta(days=2): ["GPU-s"],
        START + timedelta(days=3): ["GPU-s"],
    }
    row = lake.read("persistent_bottlenecks", START + timedelta(days=3)).row(0, named=True)
    assert (
        row["window_days"],
        row["days_bottlenecked"],
        row["active_minutes"],
        row["bottlenecked_minutes"],
    ) == (4, 4, 480, 480)
    assert row["namespace"] == "starved" and row["bottleneck_share"] == 1.0


def test_priced_waste_matches_hand_computation(planted):
    _, lake = planted
    w = {r["namespace"]: r for r in lake.read("priced_waste", START).iter_rows(named=True)}
    per_min = 2.5 / 60  # A100-SXM4-40GB default price
    assert w["idle"]["idle_waste_usd"] == pytest.approx(120 * per_min)
    s = w["starved"]  # util 85, rfu 25
    assert s["productive_usd"] == pytest.approx(120 * per_min * 0.25)
    assert s["stall_waste_usd"] == pytest.approx(120 * per_min * 0.60)
    assert s["headroom_waste_usd"] == pytest.approx(120 * per_min * 0.15)
    assert s["cost_usd"] == pytest.approx(5.0)
    for r in w.values():
        parts = (
            r["productive_usd"]
            + r["idle_waste_usd"]
            + r["stall_waste_usd"]
            + r["headroom_waste_usd"]
        )
        assert abs(parts - r["cost_usd"]) < 0.005
        assert r["monthly_waste_usd"] == round(r["hourly_waste_usd"] * 720, 2)


def test_hourly_metrics_for_planted_hours(planted):
    _, lake = planted
    h = lake.read("hourly_fleet_metrics", START)
    assert h["hour"].to_list() == [
        datetime(2024, 1, 1, 10, tzinfo=UTC),
        datetime(2024, 1, 1, 11, tzinfo=UTC),
    ]
    r = h.row(0, named=True)
    assert r["gpus"] == 4 and r["gpu_minutes"] == 240
    assert r["pct_idle"] == 25.0 and r["pct_productive"] == 50.0 and r["pct_compute_bound"] == 25.0


def test_rematerializing_gives_identical_bytes(planted, tmp_path):
    tmp, lake = planted
    before = {
        t: hashlib.sha256(lake.partition_file(t, START).read_bytes()).hexdigest()
        for t in DAILY_TABLES
    }
    run_days(tmp, [START])
    after = {
        t: hashlib.sha256(lake.partition_file(t, START).read_bytes()).hexdigest()
        for t in DAILY_TABLES
    }
    assert before == after


def test_first_partition_with_empty_landing_zone(tmp_path):
    (tmp_path / "raw").mkdir()
    lake = run_days(tmp_path, [START])
    assert lake.read("persistent_bottlenecks", START).height == 0
    assert lake.read("gpu_minutes", START).columns == list(TABLES["gpu_minutes"])
