"""The benchmark's references compute the same marts as gpu_pipeline (so the timings compare like with like)."""

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from references import duckdb_marts, pandas_marts  # noqa: E402

from data import gpu_minutes_day  # noqa: E402
from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.priced_waste import priced_waste  # noqa: E402
from gpu_pipeline.lib.reference import load_catalog, load_prices  # noqa: E402
from gpu_pipeline.lib.samples import collect_stable  # noqa: E402
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes  # noqa: E402
from gpu_pipeline.lib.staging.minute_runs import minute_runs


@pytest.fixture(scope="module")
def ours_and_refs():
    samples = gpu_minutes_day(30)
    m = collect_stable(
        gpu_minutes(samples.lazy(), load_catalog(), load_prices(), already_minutes=True, mig=False)
    )
    ours = {
        "hourly": collect_stable(hourly_fleet_metrics(minute_runs(m.lazy()))),
        "waste": collect_stable(priced_waste(minute_runs(m.lazy()))),
        "daily": collect_stable(gpu_daily(minute_runs(m.lazy()))),
    }
    return ours, pandas_marts(samples.to_pandas()), duckdb_marts(samples)


def test_priced_waste_matches_both_references(ours_and_refs):
    ours, pd_out, duck = ours_and_refs
    w = (
        ours["waste"]
        .select(
            pl.col(
                "cost_usd",
                "productive_usd",
                "idle_waste_usd",
                "stall_waste_usd",
                "headroom_waste_usd",
            ).sum()
        )
        .row(0)
    )
    p = pd_out["waste"][["cost", "productive", "idle", "stall", "headroom"]].sum().tolist()
    d = (
        pl.from_arrow(duck["waste"])
        .select(pl.col("cost", "productive", "idle", "stall", "headroom").sum())
        .row(0)
    )
    assert w == pytest.approx(p, rel=1e-9) and w == pytest.approx(d, rel=1e-9)
    assert ours["waste"].height == len(pd_out["waste"]) == duck["waste"].num_rows


def test_hourly_and_daily_match(ours_and_refs):
    ours, pd_out, duck = ours_and_refs
    h = ours["hourly"].sort("hour", "cluster", "gpu_model")
    ph = pd_out["hourly"].reset_index().sort_values(["hour", "cluster", "gpu_model"])
    assert h["avg_pif"].to_list() == pytest.approx(ph["avg_pif"].tolist(), rel=1e-9)
    assert h["pct_idle"].to_list() == pytest.approx((100 * ph["pct_idle"]).tolist(), rel=1e-9)
    assert h.height == duck["hourly"].num_rows
    d = ours["daily"].sort("gpu_uuid")
    pdd = pd_out["daily"].reset_index().sort_values("gpu_uuid")
    assert d["bottlenecked_minutes"].to_list() == pdd["bottlenecked"].tolist()
    assert d["active_minutes"].to_list() == pdd["active"].tolist()


def test_the_benchmarks_name_their_machine():
    """Both benchmarks print the machine they ran on: the processor as /proc/cpuinfo names it
    and the cores this process may use (figures of different hosts differ by 1.6x)."""
    import os

    from machine import describe

    line = describe()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in cpuinfo.read_text().splitlines()
                if ln.startswith("model name")
            ),
            None,
        )
        if model:
            assert line.startswith(f"machine: {model}, ")
    assert f", {len(os.sched_getaffinity(0))} core(s)" in line
    for script in ("run.py", "day.py"):
        text = (Path(__file__).resolve().parents[1] / "benchmarks" / script).read_text()
        assert "print(describe(), flush=True)" in text
