"""The showback, the report's month to date and the summary say what their rows hold (review of
namespace_monthly's readers):

1. showback's rows are those of the days it claims: a day written after the stored month (the
   schedule's daily run with `monthly_automation_sensor` off) makes the month computed from the
   days, and says so; a day written without data is named as such;
2. the report's month to date weights RFU by the GPU-hours that have one, as namespace_monthly;
3. the summary's headline RFU and gap are over the minutes that have them (`rfu_minutes`);
4. GPU-hours without a price are counted (`unpriced_gpu_hours`) in namespace_monthly, the
   showback file and the summary;
5. the showback's printed parts add up to its printed cost (largest remainder).

Planted fleets (A100-SXM4-40GB: $2.50 per GPU-hour, 400 W max power; RFU = power / 400 W here):
- February 2024, c1/train, GPU-a at util 90 and 200 W (RFU 50): 600 min on 02-28 and 02-29
  (materialized with their month), then 300 min on 02-27 (its day only);
- July 2024, namespace x: GPU-f1 600 min at 200 W on 07-01 (RFU 50), 60 min at 400 W on 07-02
  (RFU 100) beside GPU-f2, 540 min without a power reading (no RFU);
- May 2024, 600 min a day on 05-01 and 05-02 of: namespace `mixed`, an A100 (200 W) and an
  `NVIDIA Foo 9000` (not in the price book); namespace `unpriced`, a Foo only.
"""

from __future__ import annotations

import csv
import math
import random
import shutil
from datetime import date

import dagster as dg
import pytest
from helpers import MODELS, ms, write_file

from gpu_pipeline.defs import marts, monthly, raw, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.showback import cents_adding_up, showback_lines, write_showback
from gpu_pipeline.lib.schemas import TABLES

DAILY = dg.load_assets_from_modules([raw, staging, marts])
A100, FOO = MODELS["A100"], "NVIDIA Foo 9000"
FEB, MAY, JUL = date(2024, 2, 1), date(2024, 5, 1), date(2024, 7, 1)


def lines(uuid, model, ns, pod, day, minutes, util, power, gpu=0) -> list[str]:
    """A GPU's utilization (and power, unless None) each minute, dcgm-exporter's labels."""
    lab = f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="{model}",Hostname="h"'
    lab += f',namespace="{ns}",pod="{pod}"'
    out = []
    for m in minutes:
        t = ms(day, m)
        out.append(f"DCGM_FI_DEV_GPU_UTIL{{{lab}}} {util:g} {t}")
        if power is not None:
            out.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} {power:.3f} {t}")
    return out


def resources(tmp) -> dict:
    return {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }


def run_days(tmp, days, month: str | None = None) -> None:
    """The daily assets of each day (as the schedule runs them), then `month`'s partition."""
    instance = dg.DagsterInstance.ephemeral()
    for d in days:
        res = dg.materialize(
            DAILY, partition_key=str(d), resources=resources(tmp), instance=instance
        )
        assert res.success
    if month:
        res = dg.materialize(
            [monthly.namespace_monthly],
            partition_key=month,
            resources=resources(tmp),
            instance=instance,
        )
        assert res.success


# --- 1. showback's rows are those of the days it claims ------------------------------------------


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    """Feb 28 and 29 with their month, then Feb 27 by its day only: the stored month is older
    than its days."""
    tmp = tmp_path_factory.mktemp("late_day")
    for d in (date(2024, 2, 28), date(2024, 2, 29)):
        write_file(
            tmp / "raw" / "c1" / f"h_{d}.prom",
            lines("GPU-a", A100, "train", "p0", d, range(600), 90, 200),
        )
    run_days(tmp, [date(2024, 2, 28), date(2024, 2, 29)], "2024-02")
    d = date(2024, 2, 27)
    write_file(
        tmp / "raw" / "c1" / f"h_{d}.prom",
        lines("GPU-a", A100, "train", "p0", d, range(300), 90, 200),
    )
    run_days(tmp, [d])
    return tmp


def test_showback_of_a_month_older_than_its_days_is_computed_from_them(late, tmp_path):
    lake = Lake(late / "lake")
    stored = lake.read("namespace_monthly", FEB).row(0, named=True)
    assert stored["days_covered"] == 2 and stored["cost_usd"] == pytest.approx(50.0)
    df, about = write_showback(lake, FEB, "csv", tmp_path / "feb.csv")
    (row,) = df.iter_rows(named=True)
    # the days it claims (3 of 29) are the days its row holds: 10 + 10 + 5 GPU-hours at $2.50
    assert about["days_in_lake"] == 3
    assert row["days_covered"] == 3 and row["gpu_hours"] == 25.0 and row["cost_usd"] == 62.5
    assert about.get("days_with_data") == 3
    assert (about["first_day"], about["last_day"]) == ("2024-02-27", "2024-02-29")
    priced = lake.read_days("priced_waste", [date(2024, 2, d) for d in (27, 28, 29)])
    assert row["cost_usd"] == round(priced["cost_usd"].sum(), 2)
    assert row["energy_kwh"] == 5.0 and row["avg_rfu_pct"] == 50.0  # 200 W x 25 h
    with open(tmp_path / "feb.csv") as f:
        (got,) = list(csv.DictReader(f))
    assert (got["days_covered"], got["gpu_hours"], got["cost_usd"]) == ("3", "25.0", "62.5")
    # it says which it did, and how to store the month; the lake's partition is left as it was
    said = showback_lines(tmp_path / "feb.csv", df, about)
    assert "2024-02: 3 of 29 days" in said[0]
    assert said[1].startswith("  note: the lake's namespace_monthly for 2024-02 is older than")
    assert "20.00 GPU-hours in 1 row; its days now 25.00 GPU-hours in 1 row" in said[1]
    assert "computed from its 3 day(s) in the lake, not stored" in said[1]
    assert "--select namespace_monthly --partition 2024-02" in said[1]
    assert lake.read("namespace_monthly", FEB)["days_covered"].to_list() == [2]


def test_a_day_written_without_data_is_named_and_a_current_month_is_read(late, tmp_path):
    tmp = tmp_path / "copy"
    shutil.copytree(late, tmp)
    # Feb 26 without a landing file (`materialize --allow-empty`), and the month made again
    run_days(tmp, [date(2024, 2, 26)], "2024-02")
    lake = Lake(tmp / "lake")
    assert lake.row_count("priced_waste", date(2024, 2, 26)) == 0
    df, about = write_showback(lake, FEB, "csv", tmp_path / "feb.csv")
    assert about.get("computed") is None  # the stored month is its days': read as it is
    # 4 days in the lake, and the day without data named: only 3 of them have data, the first
    # on Feb 27
    assert about["days_in_lake"] == 4 and about["first_day"] == "2024-02-27"
    assert about.get("days_with_data") == 3 and about.get("empty_days") == ["2024-02-26"]
    assert df["days_covered"].to_list() == [3] and df["cost_usd"].to_list() == [62.5]
    said = showback_lines(tmp_path / "feb.csv", df, about)
    assert said == [
        f"wrote {tmp_path / 'feb.csv'} (1 rows; 2024-02: 4 of 29 days, 1 of them without data "
        "(2024-02-26: no GPU-minute))"
    ]


# --- 2 and 3. RFU over the GPU-hours (minutes) that have one --------------------------------------


@pytest.fixture(scope="module")
def rfu_lake(tmp_path_factory) -> Lake:
    tmp = tmp_path_factory.mktemp("rfu_weight")
    d1, d2 = date(2024, 7, 1), date(2024, 7, 2)
    write_file(
        tmp / "raw" / "c1" / f"h_{d1}.prom",
        lines("GPU-f1", A100, "x", "svc-0", d1, range(600), 90, 200),
    )
    f2 = lines("GPU-f2", A100, "x", "svc-1", d2, range(540), 90, None, 1)
    write_file(
        tmp / "raw" / "c1" / f"h_{d2}.prom",
        lines("GPU-f1", A100, "x", "svc-0", d2, range(60), 90, 400) + f2,
    )
    run_days(tmp, [d1, d2], "2024-07")
    return Lake(tmp / "lake")


# (600 min x RFU 50 + 60 min x RFU 100) / the 660 minutes with an RFU; by GPU-hours (10 h a day
# at RFU 50 and 100) it read 75.0
RFU = (600 * 50 + 60 * 100) / 660


def test_the_month_to_date_rfu_is_weighted_as_namespace_monthly(rfu_lake):
    from gpu_pipeline.lib.io.report import view
    from gpu_pipeline.lib.io.report.data import namespaces_month_to_date

    m = namespaces_month_to_date(rfu_lake, date(2024, 7, 2))
    (row,) = m.namespaces.iter_rows(named=True)
    assert row["namespace"] == "x" and row["gpu_hours"] == pytest.approx(20.0)
    assert row["avg_rfu_pct"] == pytest.approx(RFU)  # 54.5
    monthly_row = rfu_lake.read("namespace_monthly", JUL).row(0, named=True)
    assert monthly_row["avg_rfu_pct"] == pytest.approx(row["avg_rfu_pct"], rel=1e-12)
    t = view.month_table(m, date(2024, 7, 2))["table"]
    (cells,) = t.rows
    assert cells[t.heads.index("RFU %")] == "54.5"  # the report's month to date line


def test_the_summary_headline_rfu_and_gap_are_over_the_minutes_with_an_rfu(rfu_lake):
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    d1, d2 = date(2024, 7, 1), date(2024, 7, 2)
    s = fleet_summary(rfu_lake, d1, d2)
    h, m = s["head"], s["minutes"]
    assert (m["util"], m["rfu"], m["both"]) == (1200, 660, 660)
    assert h["util"] == pytest.approx(90.0)
    assert h["rfu"] == pytest.approx(RFU) == pytest.approx(m["rfu_pct"])
    assert h["gap"] == pytest.approx(90.0 - RFU)
    text = format_summary(s, d1, d2)
    assert "avg utilization 90.0 %  vs  avg RFU 54.5 %  ->  gap 35.5 points" in text, text
    assert "over those 660, utilization 90.0 % vs RFU 54.5 %" in text


# --- 4. GPU-hours without a price ----------------------------------------------------------------


@pytest.fixture(scope="module")
def unpriced_lake(tmp_path_factory) -> Lake:
    tmp = tmp_path_factory.mktemp("unpriced")
    days = [date(2024, 5, 1), date(2024, 5, 2)]
    for d in days:
        out = lines("GPU-m1", A100, "mixed", "m-0", d, range(600), 90, 200)
        out += lines("GPU-m2", FOO, "mixed", "m-1", d, range(600), 90, 200, 1)
        out += lines("GPU-u1", FOO, "unpriced", "u-0", d, range(600), 90, 200, 2)
        write_file(tmp / "raw" / "c1" / f"h_{d}.prom", out)
    run_days(tmp, days, "2024-05")
    return Lake(tmp / "lake")


def test_namespace_monthly_and_showback_count_the_unpriced_gpu_hours(unpriced_lake, tmp_path):
    spec = ["days_covered", "gpu_hours", "cost_usd", "idle_waste_usd", "stall_waste_usd"]
    spec += ["headroom_waste_usd", "total_waste_usd", "energy_kwh", "avg_rfu_pct"]
    assert set(spec) <= set(TABLES["namespace_monthly"])  # SPEC's columns stay
    rows = {
        r["namespace"]: r
        for r in unpriced_lake.read("namespace_monthly", MAY).iter_rows(named=True)
    }
    mixed, alone = rows["mixed"], rows["unpriced"]
    assert mixed["gpu_hours"] == pytest.approx(40.0) and mixed["cost_usd"] == pytest.approx(50.0)
    assert mixed["unpriced_gpu_hours"] == pytest.approx(20.0)  # the Foo's 2 x 10 h
    assert alone["gpu_hours"] == pytest.approx(20.0) and alone["cost_usd"] is None
    assert alone["unpriced_gpu_hours"] == pytest.approx(20.0)
    write_showback(unpriced_lake, MAY, "csv", tmp_path / "may.csv")
    with open(tmp_path / "may.csv") as f:
        got = {r["namespace"]: r for r in csv.DictReader(f)}
    assert (got["mixed"]["gpu_hours"], got["mixed"]["unpriced_gpu_hours"]) == ("40.0", "20.0")
    assert got["mixed"]["cost_usd"] == "50.0"
    assert got["unpriced"]["unpriced_gpu_hours"] == "20.0" and got["unpriced"]["cost_usd"] == ""


def test_the_summary_says_how_many_gpu_hours_have_no_price(unpriced_lake):
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    d1, d2 = date(2024, 5, 1), date(2024, 5, 2)
    s = fleet_summary(unpriced_lake, d1, d2)
    text = format_summary(s, d1, d2)
    assert "GPU-hours: 60.0" in text
    assert (
        "  cost $50.00, of which waste $25.00 (over 20.0 of 60.0 GPU-hours: 40.0 have no price "
        "in the price book)"
    ) in text, text
    assert s["totals"]["unpriced_gpu_hours"] == pytest.approx(40.0)


# --- 5. printed parts add up to the printed cost -------------------------------------------------


def test_cents_of_the_parts_add_up_to_the_cent_of_the_total():
    # each part rounded on its own: 1.35 + 0 + 1.89 + 0.81 + 0 = 4.05 for a cost of 4.04
    parts = [1.3451, 0.0, 1.8851, 0.8051, 0.0]
    got = cents_adding_up(4.0353, parts)
    assert got == [1.35, 0.0, 1.89, 0.8, 0.0]
    assert round(sum(got), 2) == 4.04
    # a NaN amount (not a number the lake should hold) is shown as it is, not an error
    nan = float("nan")
    got = cents_adding_up(nan, [1.0, 2.0])
    assert got == [1.0, 2.0]
    got = cents_adding_up(3.0, [nan, 2.004])
    assert math.isnan(got[0]) and got[1] == 2.0
    # parts already in cents stay as they are; a rounding error off a cent is that cent
    assert cents_adding_up(10.0, [7.25, 0.0, 1.5, 1.25, 0.0]) == [7.25, 0.0, 1.5, 1.25, 0.0]
    assert cents_adding_up(0.3, [0.1 + 0.2 - 0.1, 0.1 - 1e-13, 0.0]) == [0.2, 0.1, 0.0]
    assert cents_adding_up(None, [None, None]) == [None, None]
    rng = random.Random(7)
    for _ in range(2000):
        p = [rng.choice([0.0, rng.uniform(0, 500)]) for _ in range(5)]
        c = cents_adding_up(sum(p), p)
        assert round(sum(c) * 100) == round(sum(p) * 100)
        assert all(abs(a - b) < 0.01 + 1e-9 for a, b in zip(c, p, strict=True))


def test_the_showback_rows_parts_add_up_to_their_cost(tmp_path):
    """A month whose row's parts, each rounded, would not add up to its cost: its file's do
    (the stored month, current with its one day)."""
    import polars as pl

    lake = Lake(tmp_path / "lake")
    day, jan = date(2024, 1, 5), date(2024, 1, 1)
    keys = {"cluster": "c1", "namespace": "vision-train", "gpu_hours": 1.6141}
    money = {
        "cost_usd": 4.0353,
        "productive_usd": 1.3451,
        "idle_waste_usd": 0.0,
        "stall_waste_usd": 1.8851,
        "headroom_waste_usd": 0.8051,
        "unmeasured_usd": 0.0,
        "total_waste_usd": 2.6902,
    }
    priced = {"gpu_model": A100, "gpus": 1, "price_usd_per_hour": 2.5}
    lake.write("priced_waste", day, pl.DataFrame([keys | priced | money]))
    month = {"month": "2024-01", "days_covered": 1, "unpriced_gpu_hours": 0.0}
    lake.write("namespace_monthly", jan, pl.DataFrame([keys | month | money]))
    df, about = write_showback(lake, jan, "csv", tmp_path / "jan.csv")
    assert about.get("computed") is None
    with open(tmp_path / "jan.csv") as f:
        (row,) = list(csv.DictReader(f))
    parts = ["productive_usd", "idle_waste_usd", "stall_waste_usd", "headroom_waste_usd"]
    assert [row[c] for c in ["cost_usd", *parts, "unmeasured_usd"]] == [
        "4.04",
        "1.35",
        "0.0",
        "1.89",
        "0.8",
        "0.0",
    ]
    assert row["total_waste_usd"] == "2.69"  # idle + stall + headroom as printed
    cents = [round(float(row[c]) * 100) for c in [*parts, "unmeasured_usd"]]
    assert sum(cents) == round(float(row["cost_usd"]) * 100)
