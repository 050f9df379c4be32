"""One home for the fleet's figures: `gpu-pipeline summary`, the views' `fleet_daily` and the lake's
`fleet_daily` partitions say the same, under rules that are not the defaults (issue "One home per
fact", item 1: the summary computed its own figures from gpu_minutes with the default idle
threshold, ignoring GPU_PIPELINE_RULES)."""

import json
import re
from datetime import date

import polars as pl
import pytest
from helpers import cli, cli_env

from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.rules import DEFAULT, PHASES

DAYS = [date(2024, 1, 1), date(2024, 1, 2)]
IDLE_BELOW = 50.0  # the default is 10 (the generated fleet has few minutes at 10-20 %)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two days of a generated fleet, materialized with `[phases] idle_below = 50`."""
    tmp = tmp_path_factory.mktemp("fleet_figures")
    env = cli_env(tmp)
    rules = tmp / "rules.toml"
    rules.write_text(f"[phases]\nidle_below = {IDLE_BELOW}\n")
    env["GPU_PIPELINE_RULES"] = str(rules)
    raw, lake = tmp / "raw", tmp / "lake"
    cli(
        "generate",
        "--start",
        "2024-01-01",
        "--days",
        "2",
        "--gpus",
        "6",
        "--out",
        str(raw),
        env=env,
    )
    cli(
        "materialize",
        *("--start", "2024-01-01", "--end", "2024-01-02", "--raw", str(raw), "--lake", str(lake)),
        env=env,
    )
    return env, lake


def summary(env: dict, lake, start: date, end: date) -> dict[str, float]:
    """The figures `gpu-pipeline summary` prints, by name (phase shares as pct_<phase>)."""
    out = cli("summary", "--start", str(start), "--end", str(end), "--lake", str(lake), env=env)
    text = out.stdout
    n = r"(-?[\d,]+\.\d)"
    found = {
        "gpus": float(re.search(r"GPUs: (\d+)", text)[1]),
        "gpu_hours": re.search(rf"GPU-hours: {n}", text)[1],
        "avg_gpu_util_pct": re.search(rf"avg utilization {n} %", text)[1],
        "avg_rfu_pct": re.search(rf"avg RFU {n} %", text)[1],
        "avg_efficiency_gap_pct": re.search(rf"gap {n} points", text)[1],
        "pct_active_bottlenecked": re.search(rf"active minutes: {n} %", text)[1],
    }
    shares = re.search(r"phase shares: (.*)", text)[1]
    for p in PHASES:
        m = re.search(rf"\b{p} {n} %", shares)
        found[f"pct_{p}"] = m[1] if m else "0.0"
    return {k: float(str(v).replace(",", "")) for k, v in found.items()}


def close(printed: float, value: float) -> bool:
    """`printed` is `value` as the summary rounds it (one decimal)."""
    return abs(printed - value) <= 0.05 + 1e-9


def test_summary_views_and_lake_agree_on_each_day(fleet):
    env, lake = fleet
    rows = Lake(lake).read_days("fleet_daily", DAYS).sort("date")
    assert rows.height == 2
    # the views file's fleet_daily is the lake's partitions
    views = cli(
        "sql",
        "--lake",
        str(lake),
        "--format",
        "json",
        "SELECT * FROM fleet_daily ORDER BY date",
        env=env,
    )
    viewed = json.loads(views.stdout)
    assert [r["date"] for r in viewed] == [str(d) for d in DAYS]
    for v, r in zip(viewed, rows.iter_rows(named=True), strict=True):
        for col, value in r.items():
            if col != "date":
                assert v[col] == pytest.approx(value, rel=1e-12), col
    # the summary of each day prints that day's row
    for r in rows.iter_rows(named=True):
        printed = summary(env, lake, r["date"], r["date"])
        for col, p in printed.items():
            assert close(p, r[col]), (r["date"], col, p, r[col])


def test_a_range_weights_each_day_by_its_minutes(fleet):
    """Over two days, each figure is the days' figures weighted by the minutes each is over:
    what counting the range's GPU-minutes at once gives (gpu_minutes and gpu_daily, the same
    rules), not a mean of the days."""
    env, lake = fleet
    printed = summary(env, lake, DAYS[0], DAYS[-1])
    store = Lake(lake)
    m = store.read_days("gpu_minutes", DAYS).filter(pl.col("gpu_instance_id").is_null())
    daily = store.read_days("gpu_daily", DAYS).filter(pl.col("gpu_instance_id").is_null())
    assert printed["gpus"] == m["gpu_uuid"].n_unique() == 6
    assert close(printed["gpu_hours"], m.height / 60)
    assert close(printed["avg_gpu_util_pct"], m["gpu_util_pct"].mean())
    for p in PHASES:
        assert close(printed[f"pct_{p}"], 100 * (m["phase"] == p).sum() / m.height), p
    share = 100 * daily["bottlenecked_minutes"].sum() / daily["active_minutes"].sum()
    assert close(printed["pct_active_bottlenecked"], share)


def test_the_summary_follows_the_rules_not_the_defaults(fleet):
    """The printed figures are the rules' (idle below 50 %): what the default idle threshold
    (10 %) gives differs, so a summary computing its own would fail the tests above."""
    env, lake = fleet
    printed = summary(env, lake, DAYS[0], DAYS[-1])
    m = (
        Lake(lake)
        .read_days("gpu_minutes", DAYS)
        .filter(pl.col("gpu_instance_id").is_null() & pl.col("gpu_util_pct").is_not_null())
    )
    util = pl.col("gpu_util_pct")
    idle = {t: 100 * m.filter(util < t).height / m.height for t in (IDLE_BELOW, DEFAULT.idle_below)}
    assert close(printed["pct_idle"], idle[IDLE_BELOW]) and not close(
        printed["pct_idle"], idle[DEFAULT.idle_below]
    )
    bottlenecked = (m["efficiency_class"] == "bottlenecked").sum()
    share = {t: 100 * bottlenecked / m.filter(util >= t).height for t in idle}
    assert bottlenecked > 0
    assert close(printed["pct_active_bottlenecked"], share[IDLE_BELOW])
    assert not close(printed["pct_active_bottlenecked"], share[DEFAULT.idle_below])


def test_each_average_is_weighted_by_the_minutes_it_is_over(tmp_path):
    """Two hand-made days: utilization weighs the minutes with a reading (not `unknown`), the
    bottlenecked share the active minutes (neither idle nor unknown), phase shares every
    observed minute; a day without a figure weighs nothing; GPUs are counted once over the
    range, MIG instances not at all."""
    from gpu_pipeline.lib.summary import fleet_figures

    lake = Lake(tmp_path / "lake")
    day = {
        "gpus": 1,
        "expected_gpu_minutes": 1440,
        "pct_underutilized": 0.0,
        "pct_productive": 0.0,
        "pct_compute_bound": 0.0,
    }
    days = [
        {
            "observed_gpu_minutes": 1000,
            "gpu_hours": 1000 / 60,
            "pct_unknown": 20.0,
            "pct_idle": 30.0,
            "avg_gpu_util_pct": 50.0,
            "avg_rfu_pct": 40.0,
            "avg_efficiency_gap_pct": 10.0,
            "pct_active_bottlenecked": 10.0,
        },
        {
            "observed_gpu_minutes": 3000,
            "gpu_hours": 50.0,
            "pct_unknown": 0.0,
            "pct_idle": 10.0,
            "avg_gpu_util_pct": 70.0,
            "avg_rfu_pct": None,
            "avg_efficiency_gap_pct": None,
            "pct_active_bottlenecked": 40.0,
        },
    ]
    for d, row in zip(DAYS, days, strict=True):
        lake.write("fleet_daily", d, pl.DataFrame([{**day, **row}]))
    gpus = [("GPU-a", None, 400), ("GPU-b", None, 300), ("GPU-c", 1, 900)]
    for d in DAYS:
        rows = [
            {
                "gpu_uuid": u,
                "gpu_instance_id": i,
                "active_minutes": active,
                "class_bottlenecked_minutes": 100,
                "class_moderate_minutes": 50,
            }
            for u, i, active in gpus[: 1 if d == DAYS[0] else 3]
        ]
        lake.write("gpu_daily", d, pl.DataFrame(rows))
    f = fleet_figures(lake, DAYS)
    assert f["gpus"] == 2 and f["days_with_data"] == DAYS
    assert f["gpu_hours"] == pytest.approx(1000 / 60 + 50)
    assert f["util"] == pytest.approx((50 * 800 + 70 * 3000) / 3800)
    assert f["bottlenecked_active_pct"] == pytest.approx((10 * 500 + 40 * 2700) / 3200)
    assert f["idle"] == pytest.approx((30 * 1000 + 10 * 3000) / 4000)
    assert f["unknown"] == pytest.approx(20 * 1000 / 4000)
    assert f["rfu"] == 40.0 and f["gap"] == 10.0
    # physical GPUs' active minutes, and those of them with no class
    assert (f["active_minutes"], f["active_unclassed"]) == (1100, 1100 - 3 * 150)
    # a range without data: no GPUs, no figure
    empty = fleet_figures(lake, [date(2024, 2, 1)])
    assert empty["gpus"] == 0 and empty["util"] is None and empty["days_with_data"] == []


def report_figures(html: str) -> dict[str, float]:
    """The fleet's figures the report prints: its KPIs and its phase line."""
    kpi = dict(re.findall(r"<div class='kpi'>([^<]+)<b>([^<]+)</b></div>", html))
    n = r"(-?[\d,]+\.\d)"
    found = {
        "gpus": kpi["GPUs"],
        "gpu_hours": kpi["GPU-hours"],
        "avg_gpu_util_pct": re.match(n, kpi["avg utilization"])[1],
        "avg_rfu_pct": re.match(n, kpi["avg RFU"])[1],
        "avg_efficiency_gap_pct": re.match(n, kpi["gap"])[1],
    }
    phases = re.search(r"<p>Phases of the day's GPU-minutes(.*?)</p>", html, re.S)[1]
    found["pct_active_bottlenecked"] = re.search(rf"Bottlenecked \(.*?\): <b>{n} %", phases)[1]
    for p in PHASES:
        m = re.search(rf"\b{p.replace('_', '-')} <b>{n} %</b>", phases)
        found[f"pct_{p}"] = m[1] if m else "0.0"
    return {k: float(str(v).replace(",", "")) for k, v in found.items()}


def test_the_report_prints_fleet_daily_under_the_rules(fleet, tmp_path):
    """The report of each day (the one the run wrote, and `gpu-pipeline report`'s) prints the
    day's fleet_daily row, computed with `idle_below = 50`, and says which bound it used."""
    from gpu_pipeline import settings

    env, lake = fleet
    for r in Lake(lake).read_days("fleet_daily", DAYS).sort("date").iter_rows(named=True):
        day = r["date"]
        out = tmp_path / f"{day}.html"
        cli("report", "--date", str(day), "--lake", str(lake), "--out", str(out), env=env)
        written = settings.reports_dir(lake) / f"gpu_report_{day}.html"
        for html in (out.read_text(), written.read_text()):
            printed = report_figures(html)
            assert "utilization below 50 % idle" in html
            for col, p in printed.items():
                assert close(p, r[col]), (day, col, p, r[col])
