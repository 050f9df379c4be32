"""Real fleets' days: what real exports do to a day, each reproduced with a fixture of our own.

Every test here failed before the fix it names (issue "Real fleets' days", items 1-11).
"""

import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest
from helpers import (
    MODELS,
    assemble_day,
    cli,
    cli_env,
    expo_lines,
    materialize_args,
    mig_instance_lines,
    ms,
    write_file,
)

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake

ASSETS = dg.load_assets_from_modules([raw, staging, marts, report])
D = date(2025, 7, 26)
OLD = datetime(2025, 8, 1, 12, tzinfo=UTC).timestamp()  # mtime of fixtures: a past day


def run_query(con, sql: str):
    from gpu_pipeline.lib.io.warehouse import run_queries

    """The last statement's result of analyst SQL (the earlier ones run and are dropped)."""
    last = None
    for rel in run_queries(con, sql):
        if last is not None:
            last.fetchall()
        last = rel
    return last


def materialize(tmp_path: Path, day: date, prices: str = "") -> dg.ExecuteInProcessResult:
    return dg.materialize(
        ASSETS,
        partition_key=day.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(tmp_path / "raw")),
            "reference": ReferenceResource(prices=prices),
        },
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def loop_csv(path: Path, day: date, gpus: int = 2, loops: int = 300, bom: bool = False) -> Path:
    """An nvidia-smi loop log as `--query-gpu=timestamp,power.draw,utilization.gpu,memory.used`
    writes it: no uuid, no name, no power limit; rows of one loop milliseconds apart."""
    t0 = datetime(day.year, day.month, day.day, 23, 33, 42, tzinfo=UTC)
    rows = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"]
    for i in range(loops):
        for g in range(gpus):
            t = t0 + timedelta(milliseconds=100 * i + g)
            busy = i > loops // 3
            rows.append(
                f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}, "
                f"{(540.0 if busy else 70.0) + g:.2f} W, {90 if busy else 0} %, 41000 MiB"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(rows) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    os.utime(path, (OLD, OLD))
    return path


# --- 1. a day with minutes without RFU renders its report ---------------------------------------


def test_report_of_minutes_without_rfu(tmp_path):
    # no model name and no power limit: PIF, RFU and the ROI are unknown, the day is not
    loop_csv(tmp_path / "raw" / "trace.csv", D)
    res = materialize(tmp_path, D)
    assert res.success
    lake = Lake(tmp_path / "lake")
    m = lake.read("gpu_minutes", D)
    # 30 s of loop from 23:33:42: two minutes of two GPUs
    assert m.height == 4 and m["rfu_pct"].null_count() == 4
    roi = lake.read("efficiency_roi", D)
    assert roi["avg_rfu_pct"].null_count() == roi.height
    html = (tmp_path / "lake" / "_reports" / f"gpu_report_{D}.html").read_text()
    assert html.count("data:image/png;base64,") >= 5
    # what is unknown says so: no unit after n/a, no $0.00 for a day nobody priced, and the
    # empty charts say why they are empty
    assert "avg RFU<b>n/a</b>" in html and "gap<b>n/a</b>" in html and "n/a %" not in html
    assert "cost / day<b>n/a (no price)</b>" in html and "waste / day<b>n/a (no price)</b>" in html
    # power readings without a max power: the energy is known even though PIF is not
    assert "energy / day<b>n/a" not in html and " kWh ($" in html
    # the trend table's waste of the day too (it summed to $0.00 before)
    trend_row = html.split(f"<tr><td>{D}</td>", 1)[1].split("</tr>", 1)[0]
    assert trend_row.endswith("<td>n/a (no price)</td>") and "$" not in trend_row
    assert "No points: PIF (and RFU) need the GPU" in html
    # the scatter's title (drawn into the chart) says none has a PIF, not "all 0 GPU-minutes"
    from gpu_pipeline.lib.io.report.charts import scatter_shown

    assert scatter_shown(0, 0) == "none of this day's has a PIF"
    assert scatter_shown(4, 4) == "all 4 GPU-minutes"
    assert scatter_shown(30_000, 20_000) == "a random sample of 20,000 of 30,000 GPU-minutes"
    # the ROI bars' labels (drawn into the chart): an unpriced scope is not "$n/a/month"
    from gpu_pipeline.lib.io.report.charts import roi_label
    from gpu_pipeline.lib.io.report.data import Period

    assert roi_label(39.2, None) == "39% RFU\nn/a (no price)"
    assert roi_label(None, None) == "RFU n/a\nn/a (no price)"
    assert roi_label(45.0, 1234.5) == "45% RFU\n$1,234/month"
    # a day too little observed to stand for a month: the day's dollars it is made of
    assert roi_label(45.0, 1234.5, Period(monthly=False)) == "45% RFU\n$41.15/day"
    # no action anywhere: no empty actions table under the Recommendations chart
    assert "<th>action</th>" not in html
    assert "No RFU or PIF line: PIF (and RFU) need" in html
    # GPUs whose series carry no namespace are named so, never "None"
    assert "(no namespace)" in html and ">None<" not in html and "<b>None</b>" not in html
    # the marts too: a namespace none of whose minutes has a price has no cost, waste or
    # savings (null, not $0.00 and "nothing to save"; not NaN for its waste fraction), while
    # its energy, from power readings, is known
    rec = lake.read("recommendations", D).row(0, named=True)
    unknown = ("cost_usd", "measured_waste_frac", "total_savings_frac", "monthly_savings_usd")
    assert [rec[c] for c in unknown] == [None] * 4 and rec["actions"] == []
    nse = lake.read("namespace_efficiency", D).row(0, named=True)
    assert [nse[c] for c in ("cost_usd", "waste_usd", "waste_frac")] == [None] * 3
    assert nse["energy_kwh"] > 0 and nse["idle_energy_kwh"] == 0.0
    rec_row = html.split("<tr><td>(no namespace)</td><td>n/a (no price)</td>", 1)[1]
    assert rec_row.split("</tr>", 1)[0].endswith("<td>n/a (no price)</td>")  # savings $/month
    ns_row = html.split("<h2>Namespaces</h2>", 1)[1].split("</tr>", 2)[1]
    assert "<td>n/a</td>" in ns_row and ns_row.count("<td>n/a (no price)</td>") == 2
    # the terminal summary of such a day (`materialize --summary`) says the same, no traceback
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    text = format_summary(fleet_summary(lake, D, D), D, D)
    assert "avg RFU n/a  ->  gap n/a" in text
    # a busy minute without PIF has no class: the bottlenecked share says it does not know it
    assert "active minutes: 0.0 % (class unknown for 2 of 4: no PIF)" in text
    assert "cost n/a (no price)" in text and "$0.00" not in text
    assert "(no namespace)   (no model)" in text and "None" not in text


def test_report_of_a_day_without_power_readings(tmp_path):
    """Utilization only (an exporter without the power field): the report's energy, idle
    energy and CO₂ say they are unknown instead of 0.0 kWh ($0.00) and 0.0 kg."""
    t0 = datetime(D.year, D.month, D.day, 10, 0, tzinfo=UTC)
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-0a",modelName="NVIDIA H100 80GB HBM3",'
        f'Hostname="n0"}} 80 {int((t0 + timedelta(minutes=i)).timestamp() * 1000)}'
        for i in range(30)
    ]
    path = tmp_path / "raw" / "util_only.prom"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    assert materialize(tmp_path, D).success
    m = Lake(tmp_path / "lake").read("gpu_minutes", D)
    assert m.height == 30 and m["power_w"].null_count() == 30
    html = (tmp_path / "lake" / "_reports" / f"gpu_report_{D}.html").read_text()
    assert "energy / day<b>n/a (no power)</b>" in html
    assert "idle energy / day<b>n/a (no power)</b>" in html
    assert "CO₂ / day<b>n/a (no power)</b>" in html and "0.0 kWh" not in html
    # the mart says it does not know either (null, not 0 kWh); the namespace table says why
    nse = Lake(tmp_path / "lake").read("namespace_efficiency", D).row(0, named=True)
    energy = ("energy_kwh", "idle_energy_kwh", "energy_usd", "co2_kg")
    assert [nse[c] for c in energy] == [None] * 4 and nse["cost_usd"] > 0
    # money first (cost, waste, energy $), the energy quantities last
    ns_row = html.split("<h2>Namespaces</h2>", 1)[1].split("</tr>", 2)[1]
    assert ns_row.count("<td>n/a (no power)</td>") == 4
    assert ns_row.endswith("<td>n/a (no power)</td>" * 3)


# --- 2. utilization [N/A] under MIG: the minute still counts ------------------------------------

MIG_SMI = (
    "timestamp, name, uuid, utilization.gpu [%], power.draw [W], power.limit [W]\n"
    "2026/07/14 10:00:05.000, NVIDIA H100 80GB HBM3, GPU-00000000-0000-0000-0000-000000000001, "
    "[N/A], 433.78 W, 700.00 W\n"
    "2026/07/14 10:01:05.000, NVIDIA H100 80GB HBM3, GPU-00000000-0000-0000-0000-000000000001, "
    "[N/A], 447.35 W, 700.00 W\n"
)


def test_utilization_na_under_mig_does_not_fail_the_day(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "mig.csv").write_text(MIG_SMI)
    day = date(2026, 7, 14)
    res = materialize(tmp_path, day)
    assert res.success
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks["phase_shares_sum_to_100"]
    h = Lake(tmp_path / "lake").read("hourly_fleet_metrics", day)
    # counted, in a phase of their own: the shares still add up
    assert h["gpu_minutes"].to_list() == [2] and h["pct_unknown"].to_list() == [100.0]
    m = Lake(tmp_path / "lake").read("gpu_minutes", day)
    assert m["phase"].to_list() == ["unknown", "unknown"]
    assert m["pif"].to_list() == pytest.approx([433.78 / 700, 447.35 / 700])


# --- 3. a failed run says why, in one line ------------------------------------------------------


def test_failed_materialize_prints_the_root_cause_not_a_traceback(tmp_path):
    write_file(
        tmp_path / "raw" / "n1_2024-01-10.prom",
        expo_lines("GPU-A", MODELS["A100"], "n1", "ns", date(2024, 1, 10), range(60), 80, 200.0),
    )
    bad = tmp_path / "prices.csv"
    bad.write_text("gpu_model,on_demand_usd_per_hour\nA100-SXM4-40GB,2.5\n")
    env = cli_env(tmp_path)
    p = cli(
        "materialize",
        "--start",
        "2024-01-10",
        "--raw",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
        "--prices",
        str(bad),
        env=env,
        check=False,
    )
    out = p.stdout + p.stderr
    # the price book is checked before the run starts (tests/test_config_errors.py)
    assert p.returncode == 2
    assert "Traceback" not in out and "CheckError" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert lines and all("lacks column(s) ['spot_usd_per_hour']" in ln for ln in lines), out


# --- 4. MIG: a physical GPU counts once, its price split by slices ------------------------------


def mig_lines(day: date, minutes: range) -> list[str]:
    """One A100 with three 2g.20gb instances (namespaces a, b, c) and one whole A100 (ns d)."""
    out = mig_instance_lines(day, minutes, MODELS["A100"])
    out += expo_lines("GPU-whole", MODELS["A100"], "h", "d", day, minutes, 80, 320.0, gpu=1)
    return out


def test_mig_gpu_counts_once_and_its_price_is_split_by_slices(tmp_path):
    day = date(2024, 1, 10)
    write_file(tmp_path / "raw" / "h_2024-01-10.prom", mig_lines(day, range(600, 603)))
    assert materialize(tmp_path, day).success
    lake = Lake(tmp_path / "lake")
    from gpu_pipeline.lib.io.warehouse import connect_readonly

    con = connect_readonly(lake.root, tmp_path / "no-views-file.duckdb")  # views in memory
    ((gpus, hours, util),) = run_query(
        con, "SELECT gpus, gpu_hours, avg_gpu_util_pct FROM fleet_daily"
    ).fetchall()
    # two physical GPUs for three minutes: 0.1 GPU-hours, not 0.25 with the instance rows
    assert (gpus, hours) == (2, pytest.approx(2 * 3 / 60))
    # the MIG GPU's utilization is its instances' slice-weighted activity: 6/7 x 90 %
    assert util == pytest.approx((6 / 7 * 90 + 80) / 2)
    w = lake.read("priced_waste", day).sort("namespace", nulls_last=False)
    price = 2.5 / 60  # A100-SXM4-40GB on demand, per GPU-minute
    assert w["namespace"].to_list() == [None, "a", "b", "c", "d"]
    assert w["gpu_hours"].to_list() == pytest.approx([3 / 7 / 60, *[3 * 2 / 7 / 60] * 3, 3 / 60])
    assert w["cost_usd"].to_list() == pytest.approx(
        [3 * price / 7, *[3 * price * 2 / 7] * 3, 3 * price]
    )
    assert w["gpu_hours"].sum() == pytest.approx(hours)
    # the free slice is idle waste of the GPU's owner (no namespace on the physical GPU)
    assert w["idle_waste_usd"][0] == pytest.approx(w["cost_usd"][0])
    h = lake.read("hourly_fleet_metrics", day)
    assert (h["gpus"][0], h["gpu_minutes"][0]) == (2, 6)
    ns = lake.read("namespace_efficiency", day).sort("namespace", nulls_last=False)
    assert ns["gpu_hours"].sum() == pytest.approx(hours)


def test_a_gpu_split_into_mig_already_is_not_advised_to_split(tmp_path):
    """The free slice of a MIG A100 (no namespace: idle by definition) was advised to "split
    GPUs into right-sized slices (MIG)"; an idle whole A100 still is (adversarial review)."""
    day, minutes = date(2024, 1, 10), range(600, 630)
    lines = mig_instance_lines(day, minutes, MODELS["A100"])
    lines += expo_lines("GPU-idle", MODELS["A100"], "h2", "idle", day, minutes, 0, 60.0, gpu=1)
    write_file(tmp_path / "raw" / "h_2024-01-10.prom", lines)
    assert materialize(tmp_path, day).success
    rec = Lake(tmp_path / "lake").read("recommendations", day)
    actions = dict(zip(rec["namespace"], map(set, rec["actions"].to_list()), strict=True))
    assert "MIG" in actions["idle"] and "right_size" in actions["idle"]
    assert "MIG" not in actions[None] and "right_size" in actions[None]


# --- 5. sql: nested columns as CSV, several statements ------------------------------------------


def test_sql_csv_of_nested_columns_and_several_statements(tmp_path):
    day = date(2024, 1, 10)
    write_file(tmp_path / "raw" / "h_2024-01-10.prom", mig_lines(day, range(600, 630)))
    assert materialize(tmp_path, day).success
    env, lake = cli_env(tmp_path), str(tmp_path / "lake")
    p = cli(
        "sql",
        "--lake",
        lake,
        "--format",
        "csv",
        "SELECT namespace, actions FROM recommendations WHERE namespace = 'd'",
        env=env,
    )
    rows = p.stdout.strip().splitlines()
    assert rows[0] == "namespace,actions" and rows[1].startswith('d,"[')
    assert isinstance(json.loads(pl.read_csv(p.stdout.encode())["actions"][0]), list)
    cli("sql", "--lake", lake, "--format", "csv", "SELECT * FROM duckdb_settings()", env=env)
    p = cli("sql", "--lake", lake, "--format", "csv", "SELECT 1 AS a; SELECT 2 AS b", env=env)
    assert p.stdout.split() == ["a", "1", "b", "2"]
    assert "Traceback" not in p.stderr


# --- 6. a table's folder holds nothing but its partitions ---------------------------------------


def test_table_folders_hold_only_partitions_and_read_with_hive_partitioning(tmp_path):
    day = date(2024, 1, 10)
    write_file(tmp_path / "raw" / "h_2024-01-10.prom", mig_lines(day, range(600, 603)))
    assert materialize(tmp_path, day).success
    root = tmp_path / "lake"
    tables = [p for p in root.iterdir() if not p.name.startswith("_")]
    assert len(tables) == 15  # with fleet_daily and workload_efficiency
    for t in tables:
        assert [p.name for p in t.iterdir()] == ["date=2024-01-10"], t
        ((n,),) = duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{t}/*/*.parquet', hive_partitioning = true)"
        ).fetchall()
        assert n == Lake(root).read(t.name, day).height


# --- 7. byte-order marks: the time column is found, the day is right ----------------------------


def test_csv_with_a_byte_order_mark_is_filed_on_its_own_day(tmp_path):
    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing

    loop_csv(tmp_path / "raw" / "bom.csv", D, bom=True)
    (pf,) = [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")]
    assert pf.days == [D] and pf.time_basis == "sample"
    assert pf.samples.collect().height == 2 * 300 * 3


# --- 8. two lakes in one folder share nothing ---------------------------------------------------


def test_two_lakes_side_by_side_keep_their_own_views_and_reports(tmp_path):
    env = cli_env(tmp_path)
    day = date(2024, 1, 10)
    for name, power in (("A", 100.0), ("B", 300.0)):
        write_file(
            tmp_path / f"raw{name}" / "n1_2024-01-10.prom",
            expo_lines("GPU-A", MODELS["A100"], "n1", "ns", day, range(60), 80, power),
        )
        cli(
            "materialize",
            "--start",
            str(day),
            "--raw",
            str(tmp_path / f"raw{name}"),
            "--lake",
            str(tmp_path / "lakes" / name),
            env=env,
        )
    for name, power in (("A", 100.0), ("B", 300.0)):
        p = cli(
            "sql",
            "--lake",
            str(tmp_path / "lakes" / name),
            "--format",
            "csv",
            "SELECT avg(power_w) AS p FROM gpu_minutes",
            env=env,
        )
        assert p.stdout.split() == ["p", str(power)]
        assert (tmp_path / "lakes" / name / "_warehouse.duckdb").is_file()
        assert (tmp_path / "lakes" / name / "_reports" / f"gpu_report_{day}.html").is_file()
    assert not (tmp_path / "lakes" / "warehouse.duckdb").exists()


# --- 9. malformed input is quarantined; one file's failure stays that file's --------------------


def test_implausible_times_and_values_are_quarantined_not_filed(tmp_path):
    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing

    day = date(2024, 1, 10)
    good = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", day, range(60), 80, 200.0)
    raw = tmp_path / "raw"
    write_file(raw / "good.prom", good)
    lab = f'{{gpu="0",UUID="GPU-B",modelName="{MODELS["A100"]}",Hostname="n2"}}'
    t = ms(day, 5)
    write_file(
        raw / "bad.prom",
        [
            f"DCGM_FI_DEV_GPU_UTIL{lab} 50 {t * 1_000_000}",  # nanoseconds
            f"DCGM_FI_DEV_GPU_UTIL{lab} 50 {ms(date(1970, 1, 2), 0)}",
            f"DCGM_FI_DEV_GPU_UTIL{lab} 50 {ms(date(2100, 1, 1), 0)}",
            f"DCGM_FI_DEV_POWER_USAGE{lab} 1e30 {t}",
            f"DCGM_FI_DEV_POWER_USAGE{lab} +Inf {t}",
            f"DCGM_FI_DEV_GPU_UTIL{lab} 50 {t}",
        ],
    )
    files = [load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)]
    bad = next(f for f in files if f.file.source_file == "bad.prom")
    assert bad.days == [day] and bad.home_day == day  # no 1970, 2100 or year 50205
    out = assemble_day(files, day)
    q = out.quarantine.filter(pl.col("source_file") == "bad.prom").sort("line")
    reasons = q["reason"].to_list()
    assert len(reasons) == 5
    assert all(r.startswith("implausible sample time") for r in reasons[:3])
    assert all(r.startswith("impossible value") for r in reasons[3:])
    assert q["timestamp"].null_count() == 3  # accounted on the file's home day
    s = out.gpu_samples.filter(pl.col("gpu_uuid") == "GPU-b")
    assert s["gpu_util_pct"].to_list() == [50.0] and s["power_w"].to_list() == [None]


def test_a_broken_file_never_fails_another_days_run(tmp_path):
    day = date(2024, 1, 10)
    raw = tmp_path / "raw"
    write_file(
        raw / "good_2024-01-10.prom",
        expo_lines("GPU-A", MODELS["A100"], "n1", "ns", day, range(60), 80, 200.0),
    )
    lab = f'{{gpu="0",UUID="GPU-B",modelName="{"X" * 5_000_000}",Hostname="n2"}}'
    ns_t = ms(date(2024, 1, 12), 5) * 1_000_000
    write_file(raw / "other.prom", [f"DCGM_FI_DEV_GPU_UTIL{lab} 50 {ns_t}"])
    p = cli(*materialize_args(day, raw, tmp_path / "lake"), env=cli_env(tmp_path), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert Lake(tmp_path / "lake").read("gpu_minutes", day).height == 60


def test_a_five_megabyte_label_does_not_kill_the_report(tmp_path):
    day = date(2024, 1, 10)
    long = "X" * 5_000_000
    write_file(
        tmp_path / "raw" / "big_2024-01-10.prom",
        expo_lines("GPU-A", long, "n1", long, day, range(2), 80, 200.0)
        + expo_lines("GPU-B", MODELS["A100"], "n1", "ns", day, range(2), 80, 200.0, gpu=1),
    )
    res = materialize(tmp_path, day)
    assert res.success
    assert (tmp_path / "lake" / "_reports" / f"gpu_report_{day}.html").is_file()
    # the label never reaches a mart: its lines are quarantined with a short raw text
    q = Lake(tmp_path / "lake").read("quarantine", day)
    assert q.height == 4 and q["raw"].str.len_chars().max() < 3000


# --- 10. a backfill reaches days without data: their report is written, not failed --------------


TARGET = """
import json, dagster as dg
from datetime import datetime, UTC
from dagster._core.execution.asset_backfill import AssetBackfillData
from gpu_pipeline.definitions import defs
graph = defs.resolve_asset_graph()
t = AssetBackfillData.from_asset_partitions(
    asset_graph=graph,
    partition_names=["2026-03-02", "2026-03-03", "2026-03-04"],
    asset_selection=[k for k in graph.get_all_asset_keys() if graph.get(k).is_partitioned],
    dynamic_partitions_store=dg.DagsterInstance.ephemeral(),
    backfill_start_timestamp=datetime(2026, 4, 1, tzinfo=UTC).timestamp(),
    all_partitions=False,
).target_subset
print(json.dumps({k.to_user_string(): sorted(t.get_partitions_subset(k).get_partition_keys())
                  for k in t.asset_keys}))
"""


def test_backfill_target_carries_the_window_forward_and_those_days_succeed(tmp_path):
    """A 3-day UI backfill asks for 9 days of daily_report: Dagster walks the 7-day window
    mappings downstream (gpu_daily of D feeds persistent_bottlenecks of D..D+6; fleet_daily and
    priced_waste of D feed daily_report's trend of D..D+6, declared since backfills fan out).
    Before the trend was declared, whether daily_report followed depended on the order Dagster's
    breadth-first walk met its parents (the hash seed). Those days have no minutes; their report
    is the "no data" report."""
    targets = []
    for seed in ("0", "1"):
        out = subprocess.run(
            [sys.executable, "-c", TARGET],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        targets.append(json.loads(out.splitlines()[-1]))
    window = [f"2026-03-{d:02d}" for d in range(2, 11)]
    for t in targets:
        assert t["persistent_bottlenecks"] == window  # always: one parent, the window mapping
        assert t["gpu_minutes"] == window[:3]
    assert [t["daily_report"] for t in targets] == [window, window]  # whatever the seed
    (tmp_path / "raw").mkdir()
    later = date(2026, 3, 9)
    res = dg.materialize(
        [
            a
            for a in ASSETS
            if {k.to_user_string() for k in a.keys} & {"persistent_bottlenecks", "daily_report"}
        ],
        partition_key=later.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "reference": ReferenceResource(),  # the rules of the persistence window
        },
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert res.success
    html = (tmp_path / "lake" / "_reports" / f"gpu_report_{later}.html").read_text()
    assert "No GPU-minutes for this day" in html


# --- every real export of ../shared/samples, together, through the CLI --------------------------

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def _stamp(t: datetime) -> str:
    return f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}"


def land_real_world_logs(raw: Path) -> dict[str, date]:
    """What real loggers write besides the samples, each on a day of its own data: a single-GPU
    1 s loop that stalls 2-4 s every ~32 samples, a loop keyed only by pci.bus_id (GPUs in
    another order each iteration), a `date +%s` loop, a headerless log with a header.csv beside
    it and one without, a /federate answer with 60 node_* series first. Returns file -> day."""
    import random

    rnd = random.Random(29)
    out = {}
    day = date(2025, 11, 21)
    t = datetime(2025, 11, 21, 10, tzinfo=UTC)
    rows = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"]
    for i in range(2880):  # 48 minutes of one GPU
        rows.append(f"{_stamp(t)}, {250 + i % 50}.50 W, {60 + i % 30} %, 4000 MiB")
        t += timedelta(seconds=1, milliseconds=rnd.uniform(0, 3))
        if i % 32 == 31:
            t += timedelta(seconds=rnd.uniform(2, 4))  # the logger stalls at a checkpoint
    (raw / "logs").mkdir(parents=True)
    (raw / "logs" / "single_gpu_stalls.csv").write_text("\n".join(rows) + "\n")
    out["logs/single_gpu_stalls.csv"] = day
    rows, t = (
        ["timestamp, pci.bus_id, power.draw [W], utilization.gpu [%]"],
        datetime(2025, 11, 21, 12, tzinfo=UTC),
    )
    for _ in range(600):
        order = [0, 1, 2, 3]
        rnd.shuffle(order)
        for j, g in enumerate(order):
            rows.append(
                f"{_stamp(t + timedelta(milliseconds=j))}, 00000000:{0x18 + g:02X}:00.0, "
                f"{100 + 50 * g}.0 W, {20 * g} %"
            )
        t += timedelta(seconds=1)
    (raw / "logs" / "busid.csv").write_text("\n".join(rows) + "\n")
    out["logs/busid.csv"] = day
    t0 = int(datetime(2026, 3, 10, 8, tzinfo=UTC).timestamp())
    (raw / "logs" / "epoch.csv").write_text(
        "timestamp,uuid,name,utilization.gpu,power.draw\n"
        + "".join(
            f"{t0 + 5 * i},GPU-epoch0,NVIDIA L4,{i % 100},{40 + i % 30}.5\n" for i in range(720)
        )
    )
    out["logs/epoch.csv"] = date(2026, 3, 10)
    body = "".join(
        f"{_stamp(datetime(2026, 6, 24, 9, tzinfo=UTC) + timedelta(seconds=10 * i))}, "
        f"GPU-nohdr{k}, NVIDIA L40S, {30 + k} %, {200 + k}.0 W\n"
        for i in range(360)
        for k in range(2)
    )
    for folder in ("noheader", "noheader_bare"):
        (raw / folder).mkdir()
        (raw / folder / "gpu.csv").write_text(body)
        out[f"{folder}/gpu.csv"] = date(2026, 6, 24)
    (raw / "noheader" / "header.csv").write_text(
        "timestamp, uuid, name, utilization.gpu [%], power.draw [W]\n"
    )
    node = [f'node_cpu_seconds_total{{cpu="{i}",mode="idle"}} {1000 + i}.5' for i in range(60)]
    lines = expo_lines(
        "GPU-fed0", MODELS["H100"], "fed1", "team", date(2026, 7, 14), range(60), 80, 500
    )
    write_file(raw / "federate.prom", node + lines)
    out["federate.prom"] = date(2026, 7, 14)
    return out


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="../shared/samples is not present")
def test_every_day_of_the_real_samples_materializes_and_reports(tmp_path):
    """The whole of ../shared/samples, what tools do to files on the way, and the logs real
    loggers write, landed together: every day they touch completes, each record accounted on its
    own day, no GPU the files do not hold."""
    import gzip

    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing

    raw = tmp_path / "raw"
    raw.mkdir()
    names = sorted(f.name for f in SAMPLES.iterdir() if f.name != "README.md")
    for n in names:
        (raw / n).write_bytes((SAMPLES / n).read_bytes())
    # what people's tools do to files on the way: a cut gzip, CRLF, a BOM, a file landed twice
    expo = (SAMPLES / "dcgm-exporter_l40s_1gpu_k8s-helm_prof.prom").read_bytes()
    gz = gzip.compress(expo)
    (raw / "mut_truncated.prom.gz").write_bytes(gz[: len(gz) // 2])
    (raw / "mut_crlf.prom").write_bytes(expo.replace(b"\n", b"\r\n"))
    trace = "trace_nvidia-smi-loop_8xh100_training_power-util_window.csv"
    (raw / "mut_bom.csv").write_bytes(b"\xef\xbb\xbf" + (SAMPLES / trace).read_bytes())
    (raw / "again").mkdir()
    (raw / "again" / "copy.prom").write_bytes(expo)
    logs = land_real_world_logs(raw)
    landed = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file())
    for p in raw.rglob("*"):
        os.utime(p, (OLD, OLD))  # files without a time of their own are filed on this day
    parsed = [load_or_parse(f, tmp_path / "scratch") for f in list_landing(raw)]
    days = sorted({str(d) for pf in parsed for d in pf.touched_days()})
    assert days == [
        "2023-08-04",  # the A100 MIG nvidia-smi -q -x snapshot
        "2025-07-26",
        "2025-08-01",
        "2025-11-21",
        "2025-12-30",  # the 2x RTX A5000 snapshot
        "2026-03-10",
        "2026-06-24",
        "2026-07-14",
    ]
    env, lake = cli_env(tmp_path), tmp_path / "lake"
    env["GPU_PIPELINE_START_DATE"] = days[0]  # a 2023 snapshot among the samples
    for d in days:
        p = cli("materialize", "--start", d, "--raw", str(raw), "--lake", str(lake), env=env)
        assert f"{d}..{d}  ok" in p.stdout
        html = (lake / "_reports" / f"gpu_report_{d}.html").read_text()
        assert "<h1>GPU efficiency report" in html and "data:image/png;base64," in html
    lk = Lake(lake)
    log = pl.concat([lk.read("ingest_log", date.fromisoformat(d)) for d in days])
    q = pl.concat([lk.read("quarantine", date.fromisoformat(d)) for d in days])
    assert set(log["source_file"]) | set(q["source_file"]) == set(landed)
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    ).all()
    # the CRLF copy and the file landed twice are the same samples: kept once (the first file
    # in path order wins), the other two copies counted as duplicates
    same = log.filter(
        pl.col("source_file").is_in(
            ["dcgm-exporter_l40s_1gpu_k8s-helm_prof.prom", "again/copy.prom", "mut_crlf.prom"]
        )
    )
    n = same["rows_accepted"].sum()
    assert n > 20 and same["rows_duplicate"].sum() == 2 * n
    # the BOM copy of the trace (identity-less rows: GPUs of its own) is filed on the trace's day
    bom = log.filter(pl.col("source_file") == "mut_bom.csv")
    assert bom["date"].to_list() == [D] and bom["rows_accepted"].to_list() == [3200]  # rows
    # the loggers' files: each on its own day, every GPU the file holds and no other
    for name, d in logs.items():
        assert log.filter(pl.col("source_file") == name)["date"].to_list() == [d], name
    samples = pl.concat([lk.read("gpu_samples", date.fromisoformat(d)) for d in days])

    def gpus(name: str) -> int:
        return samples.filter(pl.col("source_file") == name)["gpu_uuid"].n_unique()

    assert gpus("logs/single_gpu_stalls.csv") == 1
    single = lk.read("gpu_daily", date(2025, 11, 21)).filter(
        pl.col("gpu_uuid").is_in(
            samples.filter(pl.col("source_file") == "logs/single_gpu_stalls.csv")["gpu_uuid"]
            .unique()
            .implode()
        )
    )
    # one GPU, one row a minute it was seen (48 min of samples and ~4 min of stalls): not 32
    stalls = samples.filter(pl.col("source_file") == "logs/single_gpu_stalls.csv")
    seen = stalls.select(pl.col("timestamp").dt.truncate("1m").n_unique()).item()
    assert single["minutes"].to_list() == [seen] and 48 < seen < 60
    bus = samples.filter(pl.col("source_file") == "logs/busid.csv")
    per = bus.group_by("pci_bus_id").agg(pl.col("power_w").unique()).sort("pci_bus_id")
    assert per["power_w"].to_list() == [[100.0], [150.0], [200.0], [250.0]]
    assert gpus("logs/epoch.csv") == 1 and gpus("noheader/gpu.csv") == 2
    assert gpus("federate.prom") == 1
    fed = log.filter(pl.col("source_file") == "federate.prom").row(0, named=True)
    assert (fed["rows_read"], fed["rows_accepted"], fed["lines_skipped"]) == (120, 120, 62)
    bare = q.filter(pl.col("source_file") == "noheader_bare/gpu.csv")
    assert bare["date"].to_list() == [date(2026, 6, 24)]
    assert "header.csv" in bare["reason"][0]
    _the_days_workloads_months_and_digests(lk, [date.fromisoformat(d) for d in days])


def _the_days_workloads_months_and_digests(lk: Lake, days: list[date]) -> None:
    """Issue 33 on the real samples: each day's workloads add up to its namespaces, each month
    to its days, and each day's digest says the day's marts."""
    from gpu_pipeline.lib.io.notify import build_digest, slack_payload

    money = ["gpu_hours", "cost_usd", "idle_waste_usd", "stall_waste_usd", "headroom_waste_usd"]
    by_month: dict[date, list[pl.DataFrame]] = {}
    for d in days:
        pw = lk.read("priced_waste", d)
        we = lk.read("workload_efficiency", d)
        assert we.height and we["gpus"].min() >= 1, d
        for c in money:
            assert we[c].sum() == pytest.approx(pw[c].sum(), abs=1e-9), (d, c)
        by_month.setdefault(d.replace(day=1), []).append(pw)
        digest = build_digest(lk, d, f"gpu_report_{d}.html")
        cost = pw.filter(pl.col("cost_usd").is_not_null())
        if cost.height:
            assert digest.cost_usd == pytest.approx(cost["cost_usd"].sum(), abs=1e-9)
            assert digest.waste_usd == pytest.approx(cost["total_waste_usd"].sum(), abs=1e-9)
        else:  # nothing priced: no dollars, not $0
            assert digest.cost_usd is None and digest.waste_usd is None
        payload = slack_payload(digest)
        assert str(d) in payload["text"] and payload["blocks"], d
    for month, frames in by_month.items():
        m = lk.read("namespace_monthly", month)
        pw = pl.concat(frames)
        assert m["days_covered"].max() <= len(frames) and m["month"].unique().to_list() == [
            f"{month:%Y-%m}"
        ]
        for c in money:
            assert m[c].sum() == pytest.approx(pw[c].sum(), abs=1e-9), (month, c)


def test_the_fleet_time_series_legend_covers_no_reading(monkeypatch):
    """A morning of idle GPUs (the samples' 2025-11-22: one hour, utilization 5 %, RFU 17 %) put
    its points under a legend fixed in the lower left corner: the legend now stands beside the
    panels, one for all five series."""
    import matplotlib.pyplot as plt

    from gpu_pipeline.lib.io.report import charts as rep
    from gpu_pipeline.lib.io.report.data import hourly_series
    from gpu_pipeline.lib.samples import conform
    from gpu_pipeline.lib.schemas import TABLES

    # the hour as hourly_fleet_metrics has it: 18 GPU-minutes
    hourly = conform(
        pl.DataFrame(
            {
                "hour": [datetime(2025, 11, 22, 0, tzinfo=UTC)],
                "gpu_minutes": [18],
                "avg_gpu_util_pct": [4.8],
                "avg_rfu_pct": [17.1],
                "avg_pif": [0.171],
                "avg_efficiency_gap_pct": [-12.3],
                "avg_realized_tflops": [11.0],
            }
        ),
        TABLES["hourly_fleet_metrics"],
    )
    fig = _captured_figure(monkeypatch, rep.timeseries, hourly_series(hourly))
    try:
        r = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert len(legends) == 1
        assert [t.get_text() for t in legends[0].get_texts()] == [
            "utilization %",
            "RFU %",
            "gap (points)",
            "avg PIF",
            "fleet realized TFLOPS",
        ]
        box = legends[0].get_window_extent(r)
        assert not any(box.overlaps(ax.get_window_extent(r)) for ax in fig.axes)
    finally:
        plt.close(fig)


def _captured_figure(monkeypatch, chart, *args):
    """The matplotlib figure a report chart function draws, laid out as it is saved."""
    from gpu_pipeline.lib.io.report import charts as rep

    figs = []
    monkeypatch.setattr(rep, "_png", lambda fig: figs.append(fig) or b"")
    chart(*args)
    (fig,) = figs
    fig.tight_layout()
    fig.canvas.draw()
    return fig


def test_a_day_without_active_gpus_says_so_in_the_bottlenecks_chart(monkeypatch):
    """The samples' 2026-03-10 (16 H100s, utilization 0 %) drew empty axes from -0.04 to 0.04;
    a partial day whose one GPU was busy at full power drew one bar of 0 minutes: an empty plot.
    No chart then, the reason instead; a bar for each GPU with bottlenecked minutes."""
    import matplotlib.pyplot as plt

    from gpu_pipeline.lib.io.report import charts as rep

    daily = pl.DataFrame(
        {
            "gpu_uuid": ["GPU-a", "GPU-b"],
            "namespace": [None, "ns"],
            "active_minutes": [0, 0],
            "bottlenecked_minutes": [0, 0],
            "bottlenecked_day": [False, False],
        }
    )
    chart = rep.bottlenecks(daily)
    assert chart.png == b"" and chart.empty == (
        "No GPU was active (utilization >= 10 %) on this day: none can be bottlenecked."
    )
    busy = daily.with_columns(pl.Series("active_minutes", [60, 45]))
    chart = rep.bottlenecks(busy)
    assert chart.png == b"" and chart.empty.startswith("No GPU had a bottlenecked minute")
    some = busy.with_columns(pl.Series("bottlenecked_minutes", [30, 0]))
    fig = _captured_figure(monkeypatch, rep.bottlenecks, some)
    try:
        (ax,) = fig.axes
        assert ax.axison and not ax.texts and len(ax.patches) == 1
    finally:
        plt.close(fig)


def test_the_recommendations_legend_covers_no_bar(monkeypatch):
    """In the lower right corner it covered the lowest namespace's bar (the samples' 2026-03-10)."""
    import matplotlib.pyplot as plt

    from gpu_pipeline.lib.io.report import charts as rep

    r = pl.DataFrame(
        {
            "namespace": ["dynamo-workload", None],
            "utilization_savings_frac": [0.75, 0.75],
            "total_savings_frac": [0.8875, 0.8875],
            "monthly_savings_usd": [2.0, 27.0],
        }
    )
    fig = _captured_figure(monkeypatch, rep.recommendations, r)
    try:
        renderer = fig.canvas.get_renderer()
        (ax,) = fig.axes
        box = ax.get_legend().get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer))
    finally:
        plt.close(fig)
