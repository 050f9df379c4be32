"""Every metric definition of docs/metrics.md against hand-computed values, boundaries included."""

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA, validate
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import efficiency_class_expr, gpu_minutes, phase_expr
from gpu_pipeline.lib.staging.minute_runs import minute_runs

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def samples(rows: list[dict]) -> pl.LazyFrame:
    base = {
        "date": date(2024, 1, 1),
        "gpu_uuid": "GPU-a",
        "cluster": "c1",
        "source_file": "f",
        "hostname": "h",
    }
    return conform(pl.DataFrame([{**base, **r} for r in rows]), GPU_SAMPLES_SCHEMA).lazy()


def minutes(rows: list[dict]) -> pl.DataFrame:
    return gpu_minutes(samples(rows), load_catalog(), load_prices()).collect()


@pytest.mark.parametrize(
    ("util", "phase"),
    [
        (0.0, "idle"),
        (9.999, "idle"),
        (10.0, "underutilized"),
        (69.99, "underutilized"),
        (70.0, "productive"),
        (89.99, "productive"),
        (90.0, "compute_bound"),
        (100.0, "compute_bound"),
    ],
)
def test_phase_boundaries(util, phase):
    out = pl.DataFrame({"u": [util]}).select(phase_expr(pl.col("u"))).item()
    assert out == phase


@pytest.mark.parametrize(
    ("util", "pif", "cls"),
    [
        (9.9, 0.9, "idle"),
        (10.0, 0.1, "inefficient"),
        (29.9, 0.9, "inefficient"),
        (30.0, 0.1, "moderate"),
        (69.9, 0.1, "moderate"),
        (70.0, 0.399, "bottlenecked"),
        (70.0, 0.4, "moderate"),
        (95.0, 0.599, "moderate"),
        (70.0, 0.6, "efficient"),
        (100.0, 1.0, "efficient"),
        (80.0, None, None),  # busy without power: can't tell
        (None, 0.5, None),
    ],
)
def test_efficiency_class_boundaries(util, pif, cls):
    df = pl.DataFrame({"u": [util], "p": [pif]}, schema={"u": pl.Float64, "p": pl.Float64})
    assert df.select(efficiency_class_expr(pl.col("u"), pl.col("p"))).item() == cls


def test_minute_metrics_a100_hand_computed():
    # two samples in one minute: util mean 80, power mean 120 W on a 400 W A100 -> pif 0.3
    out = minutes(
        [
            {
                "timestamp": T0 + timedelta(seconds=10),
                "gpu_util_pct": 70.0,
                "power_w": 100.0,
                "gpu_model": "NVIDIA A100-SXM4-40GB",
                "namespace": "ns1",
            },
            {
                "timestamp": T0 + timedelta(seconds=40),
                "gpu_util_pct": 90.0,
                "power_w": 140.0,
                "gpu_model": "NVIDIA A100-SXM4-40GB",
                "namespace": "ns1",
            },
        ]
    )
    r = out.row(0, named=True)
    assert out.height == 1
    assert r["minute"] == T0
    assert r["samples"] == 2
    assert r["gpu_util_pct"] == pytest.approx(80.0)
    assert r["power_w"] == pytest.approx(120.0)
    assert r["max_power_w"] == 400.0 and r["max_power_basis"] == "catalog"
    assert r["pif"] == pytest.approx(0.3)
    assert r["achievable_tflops"] == 102.0
    assert r["realized_tflops"] == pytest.approx(30.6)
    assert r["rfu_pct"] == pytest.approx(30.0)
    assert r["efficiency_gap_pct"] == pytest.approx(50.0)
    assert r["phase"] == "productive"
    assert r["efficiency_class"] == "bottlenecked"
    assert r["price_usd_per_hour"] == 2.5
    assert r["note"] is None
    validate("gpu_minutes", out)


def test_h100_and_a10g_catalog_values():
    out = minutes(
        [
            {
                "timestamp": T0,
                "gpu_uuid": "GPU-h",
                "gpu_util_pct": 95.0,
                "power_w": 560.0,
                "gpu_model": "NVIDIA H100 80GB HBM3",
            },
            {
                "timestamp": T0,
                "gpu_uuid": "GPU-g",
                "gpu_util_pct": 50.0,
                "power_w": 150.0,
                "gpu_model": "NVIDIA A10G",
            },
        ]
    ).sort("gpu_uuid")
    g, h = out.rows(named=True)
    assert h["pif"] == pytest.approx(0.8) and h["realized_tflops"] == pytest.approx(646 * 0.8)
    assert h["efficiency_class"] == "efficient" and h["phase"] == "compute_bound"
    assert g["pif"] == pytest.approx(0.5) and g["realized_tflops"] == pytest.approx(17.5)
    assert g["efficiency_class"] == "moderate"


def test_pif_is_clipped_to_one():
    out = minutes(
        [{"timestamp": T0, "gpu_util_pct": 100.0, "power_w": 450.0, "gpu_model": "A100-SXM4-40GB"}]
    )
    assert out["pif"].item() == 1.0 and out["rfu_pct"].item() == 100.0


def test_unknown_model_kept_with_power_limit_basis_and_reason():
    out = minutes(
        [
            {
                "timestamp": T0,
                "gpu_util_pct": 50.0,
                "power_w": 100.0,
                "power_limit_w": 250.0,
                "gpu_model": "Mystery GPU X",
            }
        ]
    )
    r = out.row(0, named=True)
    assert r["max_power_w"] == 250.0 and r["max_power_basis"] == "power_limit"
    assert r["pif"] == pytest.approx(0.4) and r["rfu_pct"] == pytest.approx(40.0)
    assert r["achievable_tflops"] is None and r["realized_tflops"] is None
    assert "not in GPU catalog" in r["note"] and "no price" in r["note"]


def test_unknown_model_without_power_limit_has_no_pif():
    out = minutes(
        [{"timestamp": T0, "gpu_util_pct": 95.0, "power_w": 100.0, "gpu_model": "Mystery"}]
    )
    r = out.row(0, named=True)
    assert r["pif"] is None and r["efficiency_class"] is None and r["phase"] == "compute_bound"
    assert "no max power" in r["note"]


def test_minutes_split_per_gpu_and_mig_instance():
    rows = [
        {
            "timestamp": T0,
            "gpu_instance_id": 1,
            "gpu_util_pct": 50.0,
            "power_w": 100.0,
            "gpu_model": "A100-SXM4-40GB",
        },
        {
            "timestamp": T0,
            "gpu_instance_id": 2,
            "gpu_util_pct": 10.0,
            "power_w": 100.0,
            "gpu_model": "A100-SXM4-40GB",
        },
        {
            "timestamp": T0 + timedelta(minutes=1),
            "gpu_instance_id": 1,
            "gpu_util_pct": 5.0,
            "power_w": 100.0,
            "gpu_model": "A100-SXM4-40GB",
        },
    ]
    out = minutes(rows)
    inst = out.filter(pl.col("gpu_instance_id").is_not_null())
    assert inst.height == 3
    assert sorted(inst["phase"].to_list()) == ["idle", "underutilized", "underutilized"]
    # the physical GPU gets a row in every minute its instances show (counted once), carrying
    # their slice-weighted utilization (no profile: one slice of 7 each) and the free slices
    phys = out.filter(pl.col("gpu_instance_id").is_null()).sort("minute")
    assert phys.height == 2
    assert phys["gpu_util_pct"].to_list() == pytest.approx([(50 + 10) / 7, 5 / 7])
    assert phys["gpu_share"].to_list() == pytest.approx([5 / 7, 6 / 7])


def _day_minutes(active: int, bottlenecked: int, idle: int = 0) -> pl.LazyFrame:
    rows = []
    for i in range(active):
        util, power = (80.0, 100.0) if i < bottlenecked else (80.0, 300.0)  # pif 0.25 vs 0.75
        rows.append(
            {
                "timestamp": T0 + timedelta(minutes=i),
                "gpu_util_pct": util,
                "power_w": power,
                "gpu_model": "A100-SXM4-40GB",
            }
        )
    for j in range(idle):
        rows.append(
            {
                "timestamp": T0 + timedelta(minutes=active + j),
                "gpu_util_pct": 2.0,
                "power_w": 50.0,
                "gpu_model": "A100-SXM4-40GB",
            }
        )
    return gpu_minutes(samples(rows), load_catalog(), load_prices())


@pytest.mark.parametrize(
    ("active", "bottlenecked", "expected"),
    [(59, 59, False), (60, 30, True), (60, 29, False), (200, 100, True), (200, 99, False)],
)
def test_bottlenecked_day_rule(active, bottlenecked, expected):
    d = (
        gpu_daily(minute_runs(_day_minutes(active, bottlenecked, idle=30)))
        .collect()
        .row(0, named=True)
    )
    assert d["active_minutes"] == active
    assert d["bottlenecked_minutes"] == bottlenecked
    assert d["minutes"] == active + 30
    assert d["idle_minutes"] == 30 and d["class_idle_minutes"] == 30
    assert d["bottlenecked_day"] is expected


def test_a_10hz_sawtooth_is_half_idle_and_half_compute_bound():
    """10 Hz NVML samples bouncing 100 % <-> 0 % every 5 s: the minute's phase (minute mean 50 %)
    stays underutilized, its sub-minute shares say half idle, half compute-bound, and the hourly
    shares and the idle dollars follow the shares."""
    from datetime import UTC, date, datetime, timedelta

    from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
    from gpu_pipeline.lib.marts.priced_waste import priced_waste
    from gpu_pipeline.lib.reference import load_catalog, load_prices
    from gpu_pipeline.lib.samples import collect_stable, conform
    from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    t0 = datetime(2024, 3, 1, 10, tzinfo=UTC)
    n = 2 * 600  # two minutes at 10 Hz
    busy = [(i // 50) % 2 == 0 for i in range(n)]  # 5 s busy, 5 s idle
    samples = conform(
        pl.DataFrame(
            {
                "date": [date(2024, 3, 1)] * n,
                "timestamp": [t0 + timedelta(milliseconds=100 * i) for i in range(n)],
                "gpu_uuid": ["GPU-saw"] * n,
                "cluster": ["c1"] * n,
                "namespace": ["ns"] * n,
                "gpu_model": ["NVIDIA A100-SXM4-40GB"] * n,
                "gpu_util_pct": [100.0 if b else 0.0 for b in busy],
                "power_w": [400.0 if b else 50.0 for b in busy],
            }
        ),
        GPU_SAMPLES_SCHEMA,
    )
    prices = load_prices()
    m = collect_stable(gpu_minutes(samples.lazy(), load_catalog(), prices))
    assert m.height == 2 and set(m["phase"]) == {"underutilized"}  # the minute mean is 50 %
    assert m["phase_share_idle"].to_list() == [0.5, 0.5]
    assert m["phase_share_compute_bound"].to_list() == [0.5, 0.5]
    assert (m.select(pl.sum_horizontal(pl.col("^phase_share_.*$")))).to_series().to_list() == [
        1.0,
        1.0,
    ]
    h = collect_stable(hourly_fleet_metrics(minute_runs(m.lazy()))).row(0, named=True)
    assert (h["pct_idle"], h["pct_underutilized"], h["pct_compute_bound"]) == (50.0, 0.0, 50.0)
    price = prices.filter(pl.col("gpu_model") == "A100-SXM4-40GB")["on_demand_usd_per_hour"].item()
    cost = 2 * price / 60
    w = collect_stable(priced_waste(minute_runs(m.lazy()))).row(0, named=True)
    # PIF = mean power 225 W / 400 W = 0.5625 > the busy half: productive is capped at 0.5
    assert w["idle_waste_usd"] == pytest.approx(cost / 2)
    assert w["productive_usd"] == pytest.approx(cost / 2)
    assert w["stall_waste_usd"] == 0.0 and w["headroom_waste_usd"] == pytest.approx(0.0, abs=1e-12)
    assert w["cost_usd"] == pytest.approx(cost)
