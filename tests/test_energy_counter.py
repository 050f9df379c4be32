"""Energy from the energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, `energy_mj`), which
survives gaps in the data (issue 13; docs/metrics.md, Energy): a minute's `energy_wh` is the
counter's increase since the GPU's previous minute row when it is >= 0 and plausible, else mean
power x 1 minute. gpu_daily, namespace_efficiency and namespace_monthly's energy are sums of it."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from gpu_pipeline.lib.marts.namespace_efficiency import namespace_efficiency
from gpu_pipeline.lib.marts.namespace_monthly import namespace_usage
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import collect_stable, conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA, validate
from gpu_pipeline.lib.staging.chunked import Chunking, minutes_by_chunk
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes
from gpu_pipeline.lib.staging.minute_runs import minute_runs

D = date(2024, 1, 1)
T0 = datetime(2024, 1, 1, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-40GB"  # the catalog's max power: 400 W; 7 MIG slices
CAT, PRICES = load_catalog(), load_prices()
MJ_PER_WH = 3.6e6


def _frame(rows: list[dict]) -> pl.DataFrame:
    return conform(pl.DataFrame(rows, infer_schema_length=None), GPU_SAMPLES_SCHEMA)


def _sample(gpu: str, second: int, **values) -> dict:
    base = {"date": D, "timestamp": T0 + timedelta(seconds=second), "gpu_uuid": gpu}
    return (
        base | {"cluster": "c1", "hostname": "h1", "gpu_model": A100, "source_file": "f"} | values
    )


def _gap_day() -> tuple[pl.DataFrame, dict]:
    """GPU-c, a sample every 30 s all day, its counter running at the power it reads (250 W,
    350 W every other hour): 04:00-06:00 has no sample at all (idle hours: the GPU is idle until
    08:00), 12:00-14:00 samples with the counter but no power reading. What the counter says."""
    rows, e, counter_at = [], 5e9, {}
    for i in range(2880):
        minute = i // 2
        p = 250.0 if (minute // 60) % 2 == 0 else 350.0
        e += p * 30 * 1000  # mJ over the 30 s before this sample
        counter_at[i] = e
        if 240 <= minute < 360:
            continue
        util = 5.0 if minute < 480 else 80.0
        power = None if 720 <= minute < 840 else p
        rows.append(_sample("GPU-c", 30 * i, gpu_util_pct=util, power_w=power, energy_mj=e))
    return _frame(rows), counter_at


def _minutes(samples: pl.DataFrame) -> pl.DataFrame:
    return validate("gpu_minutes", collect_stable(gpu_minutes(samples.lazy(), CAT, PRICES)))


def _daily(m: pl.DataFrame) -> dict:
    d = collect_stable(gpu_daily(minute_runs(m.lazy())))
    return {r["gpu_uuid"]: r for r in d.filter(pl.col("gpu_instance_id").is_null()).to_dicts()}


def test_the_counter_covers_four_hours_without_power():
    """gpu_daily's energy is the counter's increase over the day (its last reading less the
    first minute's last) plus the first minute's power x 1 minute: the 2 hours without rows and
    the 2 hours with rows but no power reading are in it. Power alone misses about a sixth."""
    samples, counter = _gap_day()
    m = _minutes(samples)
    first_power = 250.0  # minute 0's mean power
    want = (counter[2879] - counter[1]) / MJ_PER_WH / 1000 + first_power / 60 / 1000
    day = _daily(m)["GPU-c"]
    assert day["energy_kwh"] == pytest.approx(want, abs=1e-9)
    by_power = m.get_column("power_w").sum() / 60 / 1000
    assert day["energy_kwh"] > 1.15 * by_power
    # the minute after the gap has the gap's energy: 2 h 1 min at 250 W / 350 W
    after = m.filter(pl.col("minute") == T0 + timedelta(hours=6)).row(0, named=True)
    assert after["energy_wh"] == pytest.approx((counter[721] - counter[479]) / MJ_PER_WH)
    assert after["energy_wh"] == pytest.approx(250.0 + 350.0 + 250.0 / 60)
    # a minute with the counter but no power reading still has its energy
    noon = m.filter(pl.col("minute") == T0 + timedelta(hours=12, minutes=30)).row(0, named=True)
    assert noon["power_w"] is None and noon["energy_wh"] == pytest.approx(250.0 / 60)


def test_idle_energy_is_the_idle_minutes_energy():
    """idle_energy_kwh sums the idle minutes' energy_wh, the gap's energy with them when the
    minute after the gap is idle (here: 00:00-08:00 idle, the gap 04:00-06:00)."""
    samples, counter = _gap_day()
    m = _minutes(samples)
    day = _daily(m)["GPU-c"]
    # the first minute by power, then the counter up to 07:59's last reading
    want = 250.0 / 60 + (counter[959] - counter[1]) / MJ_PER_WH
    assert day["idle_energy_kwh"] == pytest.approx(want / 1000, abs=1e-9)
    idle = m.filter(pl.col("phase") == "idle")
    assert day["idle_energy_kwh"] == pytest.approx(idle["energy_wh"].sum() / 1000, abs=1e-12)


def _steady(gpu: str, jumps: dict[int, float], model: str = A100) -> pl.DataFrame:
    """A sample a minute for a day: power read as 240 W, the counter running at 300 W (5 Wh a
    minute); `jumps`: minute -> mJ added to the counter from that minute on (negative: a
    reset)."""
    rows, e = [], 1e9
    for i in range(1440):
        e += 300 * 60 * 1000 + jumps.get(i, 0.0)
        rows.append(
            _sample(gpu, 60 * i + 5, gpu_util_pct=50.0, power_w=240.0, energy_mj=e)
            | {"gpu_model": model}
        )
    return _frame(rows)


def _energy_at(m: pl.DataFrame, minute: int) -> float:
    return m.filter(pl.col("minute") == T0 + timedelta(minutes=minute))["energy_wh"].item()


def test_a_counter_reset_falls_back_to_power_for_that_minute():
    """A driver reload starts the counter again near 0: that minute's increase is negative, so
    the minute has its power x 1 minute (4 Wh); every other minute but the first its counter's
    increase (5 Wh)."""
    m = _minutes(_steady("GPU-r", {600: -1e9 - 600 * 300 * 60 * 1000 + 1e6}))
    assert _daily(m)["GPU-r"]["energy_kwh"] == pytest.approx((2 * 4.0 + 1438 * 5.0) / 1000)
    assert _energy_at(m, 600) == pytest.approx(4.0)
    assert _energy_at(m, 599) == pytest.approx(5.0) and _energy_at(m, 601) == pytest.approx(5.0)


@pytest.mark.parametrize("stuck_at", [0.0, 5e9])
def test_a_counter_that_does_not_move_falls_back_to_power(stuck_at):
    """A counter stuck at one value (unsupported, frozen, always 0) while the GPU reads 240 W:
    every minute has its power x 1 minute (4 Wh), not the counter's 0 (adversarial review: the
    day read 0.005 kWh)."""
    rows = [
        _sample("GPU-s", 60 * i + 5, gpu_util_pct=50.0, power_w=240.0, energy_mj=stuck_at)
        for i in range(1440)
    ]
    m = _minutes(_frame(rows))
    assert _daily(m)["GPU-s"]["energy_kwh"] == pytest.approx(1440 * 4.0 / 1000)
    # and one that moves by less than half of what the power reading drew
    slow = [r | {"energy_mj": 1e9 + i * 1000.0} for i, r in enumerate(rows)]
    assert _daily(_minutes(_frame(slow)))["GPU-s"]["energy_kwh"] == pytest.approx(5.76)


def test_an_implausible_jump_falls_back_to_power():
    """An increase above 1.5 x the GPU's max power over the time it covers (A100: 600 W, 10 Wh a
    minute) is not believed: power x 1 minute. Just below the bound it is."""
    plausible = (590 - 300) * 60 * 1000.0  # 590 W over the minute: 9.83 Wh
    m = _minutes(_steady("GPU-j", {700: 1e10, 800: plausible}))
    want = 2 * 4.0 + 1437 * 5.0 + 590 / 60
    assert _daily(m)["GPU-j"]["energy_kwh"] == pytest.approx(want / 1000)
    assert _energy_at(m, 700) == pytest.approx(4.0)
    assert _energy_at(m, 800) == pytest.approx(590 / 60)
    assert _energy_at(m, 701) == pytest.approx(5.0)


def test_without_a_max_power_the_bound_is_5000_w():
    """A model the catalog does not know and no power limit: no max power, so the counter is
    believed up to 5,000 W over the time it covers."""
    m = _minutes(
        _steady("GPU-x", {10: (4900 - 300) * 60 * 1000.0, 20: (5100 - 300) * 60 * 1000.0}, "X9")
    )
    assert m["max_power_w"].null_count() == m.height
    want = 2 * 4.0 + 1437 * 5.0 + 4900 / 60
    assert _daily(m)["GPU-x"]["energy_kwh"] == pytest.approx(want / 1000)
    assert _energy_at(m, 10) == pytest.approx(4900 / 60)
    assert _energy_at(m, 20) == pytest.approx(4.0)


def _mig_day() -> tuple[pl.DataFrame, float]:
    """An A100 split into a 3g (namespace a) and a 2g (b) instance for two hours: the counter on
    the physical GPU's row at 280 W, its power read as 200 W; minutes 30-59 have no physical
    row (only the instances report: made-up physical rows), 60-89 the counter but no power.
    And the GPU's energy by the counter (the first minute by power), Wh."""
    rows, e, first = [], 2e9, None
    for i in range(120):
        e += 280 * 60 * 1000
        first = e if i == 0 else first
        s = 60 * i + 5
        if not 30 <= i < 60:
            power = None if 60 <= i < 90 else 200.0
            rows.append(_sample("GPU-mig", s, power_w=power, energy_mj=e))
        for gi, profile, ns in ((1, "3g.20gb", "a"), (2, "2g.10gb", "b")):
            inst = {"gpu_instance_id": gi, "gpu_instance_profile": profile, "namespace": ns}
            rows.append(_sample("GPU-mig", s, prof_gr_engine_active=0.5) | inst)
    return _frame(rows), 200.0 / 60 + (e - first) / MJ_PER_WH


def test_mig_namespaces_share_the_counters_energy():
    """The instances' namespaces get the physical GPU's counter energy by slice share (a 3/7,
    b 2/7, the free slices 2/7 on the GPU's own namespace): they add up to the GPU's
    gpu_daily energy, the made-up rows' gap included, in namespace_efficiency and in the
    month's namespace_usage alike."""
    samples, want_wh = _mig_day()
    m = _minutes(samples)
    gpu = _daily(m)["GPU-mig"]["energy_kwh"]
    assert gpu == pytest.approx(want_wh / 1000, abs=1e-9)
    # an instance's row has no energy of its own (device-level, like power)
    assert m.filter(pl.col("gpu_instance_id").is_not_null())["energy_wh"].null_count() == 240
    ns = {r["namespace"]: r for r in collect_stable(namespace_efficiency(m.lazy())).to_dicts()}
    assert sum(r["energy_kwh"] for r in ns.values()) == pytest.approx(gpu, rel=1e-12)
    assert ns["a"]["energy_kwh"] == pytest.approx(3 / 7 * gpu, rel=1e-12)
    assert ns["b"]["energy_kwh"] == pytest.approx(2 / 7 * gpu, rel=1e-12)
    assert ns[None]["energy_kwh"] == pytest.approx(2 / 7 * gpu, rel=1e-12)
    usage = collect_stable(namespace_usage(m.lazy()))
    assert usage["energy_kwh"].sum() == pytest.approx(gpu, rel=1e-12)


def _powered_fleet() -> pl.DataFrame:
    """Two GPUs without a counter (nvidia-smi): one reading power every 20 s, with some
    readings missing, one a minute."""
    rows = []
    for i in range(3 * 180):
        p = None if i % 7 == 0 else 100.0 + (i * 37) % 300
        rows.append(_sample("GPU-p", 20 * i, gpu_util_pct=float(i % 100), power_w=p))
    for i in range(180):
        p = None if i % 11 == 0 else 150.0 + (i * 13) % 200
        rows.append(_sample("GPU-q", 60 * i + 5, gpu_util_pct=float(i % 50), power_w=p))
    return _frame(rows)


def test_a_fleet_without_counters_keeps_its_power_energy():
    """No counter: a minute's energy is its mean power x 1 minute (null without power), and
    gpu_daily's and the namespaces' energy are what they were, the same with a GPU that has a
    counter in the same chunk."""
    fleets = {"alone": _powered_fleet(), "beside": pl.concat([_powered_fleet(), _gap_day()[0]])}
    for name, samples in fleets.items():
        m = _minutes(samples).filter(pl.col("gpu_uuid") != "GPU-c")
        by_power = m.get_column("power_w") / 60.0
        assert (m["energy_wh"] == by_power).all() and m["energy_wh"].null_count() > 0, name
        assert m["energy_wh"].null_count() == by_power.null_count(), name
        day = _daily(m)
        for gpu in ("GPU-p", "GPU-q"):
            want = m.filter(pl.col("gpu_uuid") == gpu)["power_w"].sum() / 60 / 1000
            assert day[gpu]["energy_kwh"] == pytest.approx(want, rel=1e-12), name
        ns = collect_stable(namespace_efficiency(m.lazy()))
        assert ns["energy_kwh"].sum() == pytest.approx(m["power_w"].sum() / 60 / 1000, rel=1e-12)


def test_minutes_stored_before_energy_wh_keep_their_power_energy():
    """A lake day of gpu_minutes written before `energy_wh` existed: its energy is mean power
    x 1 minute, as it was (the daily tables, the namespaces)."""
    m = _minutes(_powered_fleet()).drop("energy_wh")
    want = m["power_w"].sum() / 60 / 1000
    daily = _daily(m)
    assert daily["GPU-p"]["energy_kwh"] + daily["GPU-q"]["energy_kwh"] == pytest.approx(want)
    ns = collect_stable(namespace_efficiency(m.lazy()))
    assert ns["energy_kwh"].sum() == pytest.approx(want, rel=1e-12)
    assert collect_stable(namespace_usage(m.lazy()))["energy_kwh"].sum() == pytest.approx(want)


def test_chunked_staging_gives_the_days_energy():
    """A GPU is whole in one chunk, so the counter's increases of a day staged a GPU at a time
    are those of the day at once (30-s samples regrouped, a sample a minute taken as minutes,
    a MIG GPU's made-up rows)."""
    samples = pl.concat(
        [
            _gap_day()[0],
            _steady("GPU-r", {600: -1e9}),
            _mig_day()[0],
            _powered_fleet(),
        ]
    )
    whole = _minutes(samples)
    chunks = minutes_by_chunk(samples.lazy(), CAT, PRICES, chunking=Chunking(gpus=1))
    assert_frame_equal(pl.concat(list(chunks)), whole)
    assert whole.filter(pl.col("gpu_uuid") == "GPU-c")["energy_wh"].null_count() == 0
