"""Marts against hand-computed values: phase shares, the 3-of-7-days rule, the cost split."""

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest
from helpers import minutes_frame
from polars.testing import assert_frame_equal

from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.persistent_bottlenecks import persistent_bottlenecks
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.money import MONEY, minute_costs
from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import GPU_DAILY_SCHEMA, GPU_MINUTES_SCHEMA
from gpu_pipeline.lib.staging.minute_runs import minute_runs

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def test_hourly_phase_shares_and_averages():
    rows = [
        {
            "minute": T0 + timedelta(minutes=i),
            "gpu_uuid": g,
            "gpu_util_pct": u,
            "pif": p,
            "rfu_pct": None if p is None else 100 * p,
            "efficiency_gap_pct": None if p is None else u - 100 * p,
            "realized_tflops": None if p is None else 102 * p,
            "phase": ph,
        }
        for i, (g, u, p, ph) in enumerate(
            [
                ("GPU-a", 5, 0.1, "idle"),
                ("GPU-a", 50, 0.3, "underutilized"),
                ("GPU-b", 80, 0.5, "productive"),
                ("GPU-b", 95, 0.9, "compute_bound"),
                ("GPU-b", None, None, None),
            ]
        )
    ]
    rows.append(
        {
            "minute": T0 + timedelta(hours=1),
            "gpu_uuid": "GPU-a",
            "gpu_util_pct": 0.0,
            "pif": 0.1,
            "rfu_pct": 10.0,
            "phase": "idle",
        }
    )
    h = hourly_fleet_metrics(minute_runs(minutes_frame(rows).lazy())).collect()
    assert h.height == 2
    first = h.row(0, named=True)
    assert first["gpus"] == 2 and first["gpu_minutes"] == 5
    assert first["avg_gpu_util_pct"] == pytest.approx(57.5)
    assert first["avg_pif"] == pytest.approx(0.45)
    assert first["avg_realized_tflops"] == pytest.approx(102 * 0.45)
    # the minute without a reading has no phase; the four others split 25 % each
    assert [
        first[f"pct_{p}"] for p in ("idle", "underutilized", "productive", "compute_bound")
    ] == [25.0] * 4
    shares = h.select(pl.sum_horizontal(pl.col("^pct_.*$"))).to_series()
    assert shares.to_list() == pytest.approx([100.0, 100.0])


def test_fleet_daily_counts_a_mig_gpu_once_and_its_coverage_by_hand():
    from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
    from gpu_pipeline.lib.rules import Thresholds

    def row(i, g, u, p, ph, cls=None, inst=None):
        return {
            "minute": T0 + timedelta(minutes=i),
            "gpu_uuid": g,
            "gpu_instance_id": inst,
            "gpu_util_pct": u,
            "pif": p,
            "rfu_pct": None if p is None else 100 * p,
            "efficiency_gap_pct": None if p is None else u - 100 * p,
            "phase": ph,
            "efficiency_class": cls,
        }

    rows = [
        row(0, "GPU-a", 5.0, 0.1, "idle", "idle"),
        row(1, "GPU-a", 15.0, 0.3, "underutilized", "inefficient"),
        row(2, "GPU-a", None, None, "unknown"),
        # a MIG GPU: its physical rows count, its instances' (utilization 90 %) never
        row(0, "GPU-m", 80.0, 0.2, "productive", "bottlenecked"),
        row(1, "GPU-m", 95.0, 0.9, "compute_bound", "efficient"),
        row(0, "GPU-m", 90.0, None, "compute_bound", inst=1),
        row(1, "GPU-m", 90.0, None, "compute_bound", inst=1),
    ]
    runs = minute_runs(minutes_frame(rows).lazy())
    f = fleet_daily(runs).collect().row(0, named=True)
    assert (f["gpus"], f["observed_gpu_minutes"], f["expected_gpu_minutes"]) == (2, 5, 2880)
    assert f["gpu_hours"] == pytest.approx(5 / 60)
    assert f["coverage_pct"] == pytest.approx(100 * 5 / 2880)
    assert f["avg_gpu_util_pct"] == pytest.approx((5 + 15 + 80 + 95) / 4)
    assert f["avg_pif"] == pytest.approx((0.1 + 0.3 + 0.2 + 0.9) / 4)
    assert f["avg_efficiency_gap_pct"] == pytest.approx((-5 - 15 + 60 + 5) / 4)
    shares = [f[f"pct_{p}"] for p in ("idle", "underutilized", "productive", "compute_bound")]
    assert shares == [20.0] * 4 and f["pct_unknown"] == 20.0
    # bottlenecked over active (>= 10 %) minutes: 1 of 3
    assert f["pct_active_bottlenecked"] == pytest.approx(100 / 3)
    # active by the rules' bound: at 20 %, the 15 % minute is not active (1 of 2)
    runs20 = minute_runs(minutes_frame(rows).lazy(), Thresholds(idle_below=20.0))
    assert fleet_daily(runs20).collect()["pct_active_bottlenecked"].item() == pytest.approx(50.0)


def _daily(days_flags: dict[str, list[tuple[date, bool]]]) -> pl.LazyFrame:
    rows = [
        {
            "date": d,
            "gpu_uuid": g,
            "hostname": "h",
            "namespace": "ns",
            "gpu_model": "m",
            "minutes": 100,
            "active_minutes": 100,
            "bottlenecked_minutes": 80 if flag else 10,
            "bottlenecked_day": flag,
        }
        for g, days in days_flags.items()
        for d, flag in days
    ]
    return conform(pl.DataFrame(rows), GPU_DAILY_SCHEMA).lazy()


D = date(2024, 1, 10)


def day(n: int) -> date:
    return D - timedelta(days=n)


def test_persistent_three_of_seven():
    daily = _daily(
        {
            "GPU-three": [(day(6), True), (day(3), True), (day(0), True), (day(1), False)],
            "GPU-two": [(day(5), True), (day(0), True), (day(2), False)],
            # the bottlenecked day D-7 lies outside the window
            "GPU-old": [(day(7), True), (day(4), True), (day(0), True)],
            "GPU-none-today": [(day(6), True), (day(5), True), (day(4), True)],
        }
    )
    p = persistent_bottlenecks(daily, D).collect()
    assert sorted(p["gpu_uuid"].to_list()) == ["GPU-none-today", "GPU-three"]
    r = p.filter(pl.col("gpu_uuid") == "GPU-three").row(0, named=True)
    assert r["days_bottlenecked"] == 3
    assert r["window_days"] == 4
    assert r["active_minutes"] == 400 and r["bottlenecked_minutes"] == 250
    assert r["bottleneck_share"] == pytest.approx(250 / 400)
    assert r["date"] == D


def test_persistent_first_days_of_data():
    start = date(2024, 1, 1)
    daily = _daily(
        {
            "GPU-x": [
                (start, True),
                (start + timedelta(days=1), True),
                (start + timedelta(days=2), True),
            ]
        }
    )
    assert persistent_bottlenecks(daily, start).collect().height == 0
    assert persistent_bottlenecks(daily, start + timedelta(days=1)).collect().height == 0
    third = persistent_bottlenecks(daily, start + timedelta(days=2)).collect()
    assert third["gpu_uuid"].to_list() == ["GPU-x"] and third["window_days"].item() == 3


def _priced_rows():
    # price 2.50 $/h -> 1/24 $ per minute
    return [
        {"minute": T0, "gpu_util_pct": 5.0, "rfu_pct": 12.0, "pif": 0.12, "phase": "idle"},
        {
            "minute": T0 + timedelta(minutes=1),
            "gpu_util_pct": 80.0,
            "rfu_pct": 30.0,
            "pif": 0.3,
            "phase": "productive",
        },
        {
            "minute": T0 + timedelta(minutes=2),
            "gpu_util_pct": 40.0,
            "rfu_pct": 60.0,
            "pif": 0.6,
            "phase": "underutilized",
        },
        {
            "minute": T0 + timedelta(minutes=3),
            "gpu_util_pct": 95.0,
            "rfu_pct": None,
            "pif": None,
            "phase": "compute_bound",
        },
    ]


def test_minute_cost_split_hand_computed():
    m = minutes_frame([{**r, "price_usd_per_hour": 2.5} for r in _priced_rows()])
    c = minute_costs(m.lazy()).collect()
    per_min = 2.5 / 60
    assert c["cost_usd"].to_list() == pytest.approx([per_min] * 4)
    assert c["idle_waste_usd"].to_list() == pytest.approx([per_min, 0, 0, 0])
    assert c["productive_usd"].to_list() == pytest.approx([0, 0.3 * per_min, 0.6 * per_min, 0])
    assert c["stall_waste_usd"].to_list() == pytest.approx([0, 0.5 * per_min, 0, 0])
    assert c["headroom_waste_usd"].to_list() == pytest.approx([0, 0.2 * per_min, 0.4 * per_min, 0])
    assert c["unmeasured_usd"].to_list() == pytest.approx([0, 0, 0, per_min])


def test_priced_waste_sums_to_the_cent_and_run_rates():
    rows = [{**r, "price_usd_per_hour": 2.5} for r in _priced_rows()[:3]] * 20
    rows = [{**r, "minute": T0 + timedelta(minutes=i)} for i, r in enumerate(rows)]
    w = priced_waste(minute_runs(minutes_frame(rows).lazy())).collect().row(0, named=True)
    per_min = 2.5 / 60
    assert w["gpu_hours"] == pytest.approx(1.0)
    assert w["cost_usd"] == pytest.approx(2.5)
    assert w["idle_waste_usd"] == pytest.approx(20 * per_min)
    assert w["stall_waste_usd"] == pytest.approx(20 * 0.5 * per_min)
    assert w["headroom_waste_usd"] == pytest.approx(20 * 0.6 * per_min)
    assert w["productive_usd"] == pytest.approx(20 * 0.9 * per_min)
    parts = (
        w["productive_usd"] + w["idle_waste_usd"] + w["stall_waste_usd"] + w["headroom_waste_usd"]
    )
    assert round(parts, 2) == round(w["cost_usd"], 2)
    assert w["total_waste_usd"] == pytest.approx(20 * 2.1 * per_min)
    hourly = w["total_waste_usd"] / w["gpu_hours"]
    assert w["hourly_waste_usd"] == pytest.approx(hourly)
    assert w["monthly_waste_usd"] == round(hourly * 720, 2)
    assert w["yearly_waste_usd"] == round(hourly * 8760, 2)
    assert w["waste_frac"] == pytest.approx(2.1 / 3)


def test_priced_waste_without_price_is_null_not_zero():
    w = priced_waste(minute_runs(minutes_frame(_priced_rows()).lazy())).collect().row(0, named=True)
    assert w["gpu_hours"] == pytest.approx(4 / 60)
    assert w["cost_usd"] is None and w["total_waste_usd"] is None


def _runs_reference(m: pl.DataFrame) -> pl.DataFrame:
    """minute_runs by a plain group-by: right when no run's key comes back after another run
    (then a run and a group are the same minutes)."""
    from gpu_pipeline.lib.rules import EFFICIENCY_CLASSES, PHASES
    from gpu_pipeline.lib.samples import phase_share
    from gpu_pipeline.lib.staging.minute_runs import HOURLY_MEANS, RUN_KEYS, RUNS_SCHEMA

    hour = (pl.col("minute").dt.epoch("ms") // 3_600_000 * 3_600_000).cast(pl.Datetime("ms", "UTC"))
    costs = minute_costs(m.lazy()).with_columns(hour.alias("hour"))
    columns = m.columns
    idle = pl.col("phase") == "idle"
    energy = pl.col("power_w").fill_null(0.0) / 60.0
    physical = pl.col("gpu_instance_id").is_null()
    return (
        costs.group_by(*RUN_KEYS, "hour", maintain_order=True)
        .agg(
            pl.col("minute").max().alias("_last_minute"),
            pl.len().alias("_minutes"),
            pl.col("gpu_share").fill_null(1.0).sum().alias("_share"),
            *[pl.col(c).fill_null(0.0).sum().alias(f"_sum_{c}") for c in HOURLY_MEANS],
            *[pl.col(c).count().alias(f"_n_{c}") for c in HOURLY_MEANS],
            *[(pl.col("phase") == p).sum().alias(f"_n_{p}") for p in PHASES],
            pl.col("phase").count().alias("_n_phase"),
            *[phase_share(columns, p).fill_null(0.0).sum().alias(f"_sh_{p}") for p in PHASES],
            *[(pl.col("efficiency_class") == c).sum().alias(f"_c_{c}") for c in EFFICIENCY_CLASSES],
            (pl.col("gpu_util_pct") >= 10).sum().alias("_active"),
            pl.col("price_usd_per_hour").max(),
            pl.col("price_usd_per_hour").is_not_null().any().alias("_priced"),
            pl.when(physical).then(energy).otherwise(0.0).sum().alias("_energy_wh"),
            pl.when(physical & idle).then(energy).otherwise(0.0).sum().alias("_idle_energy_wh"),
            *[pl.col(c).fill_null(0.0).sum() for c in MONEY],
        )
        .select(list(RUNS_SCHEMA))
        .cast(RUNS_SCHEMA)
        .collect()
    )


def test_minute_runs_are_the_group_by_of_their_minutes():
    """Every sum, count, category count, price and time of a run, and the run table's types,
    against a plain group-by (runs built column by column: issue 34). Minutes of a MIG GPU and
    its instance, an hour boundary, a namespace that changes mid-hour, a model without a price,
    minutes without utilization, power or class."""
    rows = []
    for i in range(150):  # GPU-a: two hours and a half, its namespace changes at minute 100
        u = None if i % 17 == 0 else float((i * 7) % 100)
        p = None if i % 23 == 0 else ((i * 13) % 100) / 100
        rows.append(
            {
                "minute": T0 + timedelta(minutes=i),
                "namespace": "train" if i < 100 else "serve",
                "gpu_util_pct": u,
                "power_w": None if p is None else 400 * p,
                "pif": p,
                "rfu_pct": None if p is None else 100 * p,
                "efficiency_gap_pct": None if p is None or u is None else u - 100 * p,
                "realized_tflops": None if p is None else 102 * p,
                "phase": "unknown" if u is None else ("idle" if u < 10 else "productive"),
                "efficiency_class": None if u is None or (u >= 70 and p is None) else "moderate",
                "price_usd_per_hour": 2.5,
            }
        )
    for i in range(70):  # a MIG GPU of a model without a price: its physical row and one instance
        for inst, share in ((None, 4 / 7), (3, 3 / 7)):
            rows.append(
                {
                    "minute": T0 + timedelta(minutes=i),
                    "gpu_uuid": "GPU-m",
                    "gpu_instance_id": inst,
                    "gpu_model": "H100 80GB HBM3",
                    "gpu_share": share,
                    "gpu_util_pct": float(i % 40),
                    "power_w": 300.0,
                    "pif": 0.5,
                    "rfu_pct": 50.0,
                    "phase": "idle" if i % 40 < 10 else "underutilized",
                    "phase_share_idle": 0.25,
                    "efficiency_class": "inefficient",
                }
            )
    base = {
        "date": date(2024, 1, 1),
        "gpu_uuid": "GPU-a",
        "cluster": "c1",
        "gpu_model": "A100-SXM4-40GB",
        "namespace": "ns",
    }
    # every row's columns, not the first hundred's
    frame = pl.DataFrame([{**base, **r} for r in rows], infer_schema_length=None)
    m = conform(frame, GPU_MINUTES_SCHEMA).sort("gpu_uuid", "gpu_instance_id", "minute")
    got = minute_runs(m.lazy()).collect()
    want = _runs_reference(m)
    assert got.schema == want.schema
    assert got.height == 4 + 4 == want.height  # GPU-a: 0-59, 60-99, 100-119, 120-149
    assert_frame_equal(got, want, check_exact=False, rel_tol=1e-12)
    assert got.get_column("_priced").to_list() == [True] * 4 + [False] * 4


def test_minute_runs_have_their_schema_whatever_types_the_keys_come_with():
    """A run table has RUNS_SCHEMA's types even from minutes whose keys have other ones (the
    runs are built column by column; nothing casts them on the way)."""
    from gpu_pipeline.lib.staging.minute_runs import RUNS_SCHEMA

    m = minutes_frame([{"gpu_util_pct": 50.0}]).with_columns(
        pl.col("gpu_instance_id").cast(pl.Int64), pl.col("cluster").cast(pl.Categorical)
    )
    runs = minute_runs(m.lazy()).collect()
    assert runs.schema == pl.Schema(RUNS_SCHEMA)
    assert runs.select("cluster", "_minutes", "_active").row(0) == ("c1", 1, 1)


def _full_mig_gpu(price: float | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """An A100 whose instances hold all 7 slices (4g + 3g), one sample a minute for an hour, and
    the price book (its A100 row at `price` when given): (priced_waste, gpu_minutes)."""
    from gpu_pipeline.lib.reference import load_catalog, load_prices
    from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    t0 = datetime(2024, 1, 1, 9, tzinfo=UTC)
    rows = []
    for i in range(60):
        base = {"date": date(2024, 1, 1), "timestamp": t0 + timedelta(minutes=i)}
        base |= {"gpu_uuid": "GPU-full", "cluster": "c0", "gpu_model": "A100-SXM4-40GB"}
        base |= {"hostname": "h", "source_file": "f"}
        rows.append(base | {"gpu_instance_id": None, "power_w": 250.0})
        for gi, profile, ns, act in ((1, "4g.20gb", "a", 0.8), (2, "3g.20gb", "b", 0.3)):
            inst = {"gpu_instance_id": gi, "gpu_instance_profile": profile, "namespace": ns}
            rows.append(base | inst | {"prof_gr_engine_active": act})
    samples = conform(pl.DataFrame(rows, infer_schema_length=None), GPU_SAMPLES_SCHEMA)
    prices = load_prices()
    if price is not None:
        prices = prices.with_columns(
            pl.when(pl.col("gpu_model").str.contains("A100"))
            .then(pl.lit(price))
            .otherwise(pl.col(c))
            .alias(c)
            for c in prices.columns
            if c.endswith("usd_per_hour") or c.startswith("price")
        )
    minutes = gpu_minutes(samples.lazy(), load_catalog(), prices).collect()
    return priced_waste(minute_runs(minutes.lazy())).collect(), minutes


@pytest.mark.parametrize("price", [None, 0.0], ids=["priced", "price_0"])
def test_a_day_with_nothing_to_divide_by_has_null_ratios_and_passes_its_contract(price):
    """The free slices of a fully allocated MIG GPU have 0 GPU-hours, and a price of $0 (owned
    hardware) costs $0: their waste fraction and hourly waste are null, not NaN, which failed
    the day's contract (adversarial review)."""
    from gpu_pipeline.lib.schemas import validate

    waste, _ = _full_mig_gpu(price)
    validate("priced_waste", waste)  # raised ContractError: waste_frac NaN
    free = waste.filter(pl.col("namespace").is_null()).row(0, named=True)
    assert free["gpu_hours"] == 0 and free["waste_frac"] is None
    assert free["hourly_waste_usd"] is None
    teams = waste.filter(pl.col("namespace").is_not_null())
    assert teams["gpu_hours"].round(9).to_list() == [round(4 / 7, 9), round(3 / 7, 9)]
    assert not any(waste.select(pl.col(pl.Float64).is_nan().any()).row(0))
    if price == 0.0:
        assert teams["cost_usd"].to_list() == [0.0, 0.0]
        assert teams["waste_frac"].to_list() == [None, None]
        assert teams["hourly_waste_usd"].to_list() == [0.0, 0.0]
