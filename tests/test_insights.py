"""Diagnosis, recommendations, health, stragglers, ROI and the report, on hand-made data."""

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest
from helpers import MODELS, minutes_frame
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_pipeline.lib.marts.efficiency_roi import efficiency_roi
from gpu_pipeline.lib.marts.gpu_health import gpu_health
from gpu_pipeline.lib.marts.namespace_efficiency import namespace_efficiency
from gpu_pipeline.lib.marts.recommendations import _recommend, recommendations
from gpu_pipeline.lib.marts.stragglers import stragglers
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.rules import VOCABULARY, HealthThresholds
from gpu_pipeline.lib.samples import collect_stable, conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA
from gpu_pipeline.lib.staging.gpu_minutes import diagnosis_expr
from gpu_pipeline.lib.staging.minute_runs import minute_runs

T0 = datetime(2024, 1, 1, tzinfo=UTC)
D = date(2024, 1, 1)


@pytest.mark.parametrize(
    ("util", "sm", "dram", "tensor", "occ", "nvlink", "pif", "expected"),
    [
        (5, 0.9, None, None, None, None, None, "idle"),
        (90, None, None, None, None, None, None, "unknown"),
        (90, 0.29, 0.1, 0.1, None, 0.0, None, "data_starved"),
        (90, 0.29, 0.1, 0.1, None, 6e9, None, "communication_bound"),
        (90, 0.29, 0.8, 0.1, None, 6e9, None, "memory_bound"),
        (90, 0.30, 0.1, 0.04, None, None, None, "tensor_cores_unused"),
        (90, 0.50, 0.1, 0.2, 0.1, None, None, "low_occupancy"),
        (90, 0.50, 0.1, 0.2, None, None, None, "mixed"),
        (90, 0.70, 0.79, 0.5, None, None, None, "compute_bound"),
        (90, 0.70, 0.80, 0.5, None, None, None, "memory_bound"),
        (90, 0.95, 0.2, 0.0, None, None, None, "tensor_cores_unused"),
        # no profiling fields: power decides (NVML / nvidia-smi fleets)
        (98, None, None, None, None, None, 0.85, "compute_bound"),
        (95, None, None, None, None, None, 0.20, "data_starved"),
        (95, None, None, None, None, None, 0.50, "unknown"),
        (50, None, None, None, None, None, 0.85, "unknown"),
        (95, None, None, None, None, None, None, "unknown"),
    ],
)
def test_diagnosis_decision_tree(util, sm, dram, tensor, occ, nvlink, pif, expected):
    df = pl.DataFrame(
        {
            "gpu_util_pct": [util],
            "prof_sm_active": [sm],
            "prof_dram_active": [dram],
            "prof_pipe_tensor_active": [tensor],
            "prof_sm_occupancy": [occ],
            "nvlink_rx_bytes_per_s": [nvlink],
            "pif": [pif],
        },
        schema={
            c: pl.Float64
            for c in (
                "gpu_util_pct",
                "prof_sm_active",
                "prof_dram_active",
                "prof_pipe_tensor_active",
                "prof_sm_occupancy",
                "nvlink_rx_bytes_per_s",
                "pif",
            )
        },
    )
    assert df.select(diagnosis_expr()).item() == expected


def planted_minutes() -> pl.DataFrame:
    """Three namespaces for 120 minutes: data-starved A100s, idle A10Gs, compute-bound H100s."""
    rows = []
    for i in range(120):
        t = T0 + timedelta(minutes=i)
        for g in range(2):
            rows.append(
                {
                    "minute": t,
                    "gpu_uuid": f"GPU-s{g}",
                    "namespace": "starved",
                    "gpu_model": "A100-SXM4-40GB",
                    "gpu_util_pct": 88.0,
                    "pif": 0.25,
                    "rfu_pct": 25.0,
                    "phase": "productive",
                    "efficiency_class": "bottlenecked",
                    "diagnosis": "data_starved",
                    "price_usd_per_hour": 2.5,
                }
            )
            rows.append(
                {
                    "minute": t,
                    "gpu_uuid": f"GPU-i{g}",
                    "namespace": "idle",
                    "gpu_model": "A10G",
                    "gpu_util_pct": 1.0,
                    "pif": 0.1,
                    "rfu_pct": 10.0,
                    "phase": "idle",
                    "efficiency_class": "idle",
                    "diagnosis": "idle",
                    "price_usd_per_hour": 1.01,
                }
            )
            rows.append(
                {
                    "minute": t,
                    "gpu_uuid": f"GPU-c{g}",
                    "namespace": "compute",
                    "gpu_model": "H100 80GB HBM3",
                    "gpu_util_pct": 97.0,
                    "pif": 0.8,
                    "rfu_pct": 80.0,
                    "phase": "compute_bound",
                    "efficiency_class": "efficient",
                    "diagnosis": "compute_bound",
                    "price_usd_per_hour": 4.0,
                }
            )
    return minutes_frame(rows)


def test_recommendations_follow_the_measured_mix():
    r = recommendations(planted_minutes().lazy(), load_prices())
    by = {row["namespace"]: row for row in r.iter_rows(named=True)}
    assert {"DALI", "num_workers", "pin_memory"} <= set(by["starved"]["actions"])
    assert {"MPS", "MIG", "right_size"} & set(by["idle"]["actions"])
    assert "MIG" not in by["idle"]["actions"]  # A10G cannot be partitioned
    assert {"AMP", "BF16", "FP8"} <= set(by["compute"]["actions"])
    for row in by.values():
        assert set(row["actions"]) <= set(VOCABULARY)
        assert 0 <= row["utilization_savings_frac"] <= row["measured_waste_frac"] + 1e-12
        assert row["total_savings_frac"] == pytest.approx(
            1 - (1 - row["utilization_savings_frac"]) * (1 - row["rate_savings_frac"])
        )
        assert all(0 < d["fraction"] <= 1 for d in row["action_details"])
        assert all(d["rationale"] for d in row["action_details"])
        assert row["monthly_savings_usd"] == round(
            row["total_savings_frac"] * row["cost_usd"] * 30, 2
        )
    # the idle namespace: adding the fractions would promise more than everything it spends
    idle = by["idle"]
    assert idle["naive_sum_frac"] > 1.0 and idle["total_savings_frac"] < 1.0
    # overlapping actions (one group) don't stack: MPS and right_size recover the same idle time
    assert idle["utilization_savings_frac"] == pytest.approx(
        0.75
    )  # the best in the group, not the sum
    # spot where the price book has a spot price: A10G 0.40 vs 1.01
    assert idle["rate_savings_frac"] == pytest.approx(1 - 0.40 / 1.01)
    starved = by["starved"]
    assert "95" not in starved["action_details"][0]["rationale"]
    assert "100 % of active minutes data-starved" in starved["action_details"][0]["rationale"]


def test_recommendation_triggers_and_fractions_are_rules():
    """[recommendations] in the rules file moves what an action recovers and when it fires."""
    from gpu_pipeline.lib.rules import load_rules

    rules = load_rules(
        None,
        {"recommendations.right_size": 0.5, "recommendations.underutilized_share_from": 0.0},
    )
    r = recommendations(planted_minutes().lazy(), load_prices(), r=rules.recommend)
    by = {row["namespace"]: row for row in r.iter_rows(named=True)}
    right = next(d for d in by["idle"]["action_details"] if d["action"] == "right_size")
    idle_frac = right["fraction"] / 0.5
    default = recommendations(planted_minutes().lazy(), load_prices())
    was = next(
        d
        for row in default.iter_rows(named=True)
        if row["namespace"] == "idle"
        for d in row["action_details"]
        if d["action"] == "right_size"
    )
    assert was["fraction"] == pytest.approx(0.75 * idle_frac)
    # a trigger at 0: larger batches are advised where nothing else calls for them
    assert "larger_batch" not in {
        a
        for row in default.iter_rows(named=True)
        if row["namespace"] == "compute"
        for a in row["actions"]
    }
    assert "larger_batch" in by["compute"]["actions"]


def test_no_spot_price_means_no_rate_savings(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA10G,1.01,\n")
    r = recommendations(
        planted_minutes().filter(pl.col("namespace") == "idle").lazy(),
        pl.read_csv(p).pipe(
            lambda df: df.with_columns(
                pl.lit("A10G").alias("model_key"), pl.col("spot_usd_per_hour").cast(pl.Float64)
            )
        ),
    )
    assert r["rate_savings_frac"].to_list() == [0.0] and "spot" not in r["actions"][0]


fracs = st.floats(0, 1)


@settings(max_examples=200, deadline=None)
@given(
    idle=fracs, stall=fracs, head=fracs, shares=st.lists(fracs, min_size=9, max_size=9), spot=fracs
)
def test_savings_never_exceed_measured_waste_or_one(idle, stall, head, shares, spot):
    total_w = idle + stall + head
    if total_w > 1:
        idle, stall, head = idle / total_w, stall / total_w, head / total_w
    cost = 100.0
    row = {
        "date": D,
        "namespace": "ns",
        "gpus": 1,
        "gpu_hours": 1.0,
        "cost_usd": cost,
        "productive_waste_usd": 0.0,
        "idle_waste_usd": idle * cost,
        "stall_waste_usd": stall * cost,
        "headroom_waste_usd": head * cost,
        "idle_share": shares[0],
        "bottlenecked": shares[1],
        "underutilized": shares[2],
        "_unknown": shares[3],
        "data_starved": shares[4],
        "communication_bound": shares[5],
        "memory_bound": shares[6],
        "compute_bound": shares[7],
        "tensor_cores_unused": shares[8],
        "low_occupancy": shares[0],
        "_spot_cost": cost * (1 - spot),
        "models": ["H100 80GB HBM3"],
    }
    out = _recommend(row)
    assert 0 <= out["utilization_savings_frac"] <= out["measured_waste_frac"] + 1e-9 <= 1 + 1e-9
    assert 0 <= out["total_savings_frac"] <= 1
    assert out["total_savings_frac"] == pytest.approx(
        1 - (1 - out["utilization_savings_frac"]) * (1 - out["rate_savings_frac"])
    )


def test_efficiency_roi_seed_example():
    # 50 GPUs at 45 % RFU, raised to 60 %: the work of 50 x 15 / 45 = 16.7 more GPUs
    rows = [{"gpu_uuid": f"GPU-{i}", "rfu_pct": 45.0, "price_usd_per_hour": 2.0} for i in range(50)]
    roi = collect_stable(efficiency_roi(minutes_frame(rows).lazy(), target_rfu_pct=60.0))
    fleet = roi.filter(pl.col("scope") == "fleet").row(0, named=True)
    assert fleet["gpus"] == 50 and fleet["equivalent_gpus"] == pytest.approx(50 * 15 / 45)
    assert round(fleet["equivalent_gpus"]) == 17
    assert fleet["monthly_value_usd"] == pytest.approx(50 * 15 / 45 * 2.0 * 720)
    assert roi.filter(pl.col("scope") == "model").height == 1


def test_namespace_efficiency_table():
    n = collect_stable(namespace_efficiency(planted_minutes().lazy()))
    by = {r["namespace"]: r for r in n.iter_rows(named=True)}
    assert (
        by["starved"]["dominant_diagnosis"] == "data_starved"
        and by["starved"]["pct_active_bottlenecked"] == 100
    )
    assert by["idle"]["pct_idle"] == 100 and by["idle"]["pct_active_bottlenecked"] is None
    assert by["compute"]["gpus"] == 2 and by["compute"]["gpu_hours"] == pytest.approx(4.0)


def test_gpu_health_statuses():
    def s(uuid, i, **kw):
        return {
            "date": D,
            "timestamp": T0 + timedelta(minutes=i),
            "gpu_uuid": uuid,
            "cluster": "c",
            "source_file": "f",
            "gpu_model": "A100-SXM4-40GB",
            **kw,
        }

    rows = [
        s("GPU-hot", i, gpu_temp_c=86.0 if i < 3 else 70.0, power_w=399.0, power_limit_w=400.0)
        for i in range(5)
    ]
    rows += [
        s("GPU-ecc", i, ecc_dbe_volatile=1.0 if i == 4 else 0.0, xid_errors=79.0 if i == 2 else 0.0)
        for i in range(5)
    ]
    rows += [
        s("GPU-ok", i, gpu_temp_c=60.0, power_w=100.0, clock_event_reasons=4.0 if i == 0 else 0.0)
        for i in range(5)
    ]
    h = collect_stable(
        gpu_health(conform(pl.DataFrame(rows), GPU_SAMPLES_SCHEMA).lazy(), load_catalog())
    )
    by = {r["gpu_uuid"]: r for r in h.iter_rows(named=True)}
    # 3 hot minutes: listed, but below the 15 minutes from which a GPU warns
    assert by["GPU-hot"]["hot_minutes"] == 3 and by["GPU-hot"]["status"] == "ok"
    assert by["GPU-hot"]["reasons"] == "3 min at or above 80.0 C (max 86.0; warns from 15 min)"
    assert by["GPU-hot"]["power_capped_minutes"] == 5  # 399 of 400 W
    assert by["GPU-ecc"]["status"] == "drain" and by["GPU-ecc"]["xid_codes"] == [79]
    assert "double-bit ECC" in by["GPU-ecc"]["reasons"]
    assert (
        by["GPU-ok"]["status"] == "ok" and by["GPU-ok"]["power_capped_minutes"] == 1
    )  # SW power cap bit


def test_a_hot_gpu_warns_only_after_the_minutes_the_rules_set(tmp_path):
    """A minute at 80 C is not an alert (the demo: 13 of 50 GPUs `warn` for "1 min at or above
    80.0 C"): a GPU warns from `health.hot_warn_minutes` hot minutes of the day (15, or the
    rules file's)."""
    from gpu_pipeline.lib.rules import load_rules

    def day(hot: int) -> pl.DataFrame:
        return conform(
            pl.DataFrame(
                {
                    "date": [D] * 60,
                    "timestamp": [T0 + timedelta(minutes=i) for i in range(60)],
                    "gpu_uuid": [f"GPU-{hot}"] * 60,
                    "source_file": ["f"] * 60,
                    "gpu_model": ["A100-SXM4-40GB"] * 60,
                    "gpu_temp_c": [81.0 if i < hot else 60.0 for i in range(60)],
                }
            ),
            GPU_SAMPLES_SCHEMA,
        )

    samples = pl.concat([day(n) for n in (1, 14, 15, 30)]).lazy()
    status = dict(
        collect_stable(gpu_health(samples, load_catalog())).select("gpu_uuid", "status").rows()
    )
    assert status == {"GPU-1": "ok", "GPU-14": "ok", "GPU-15": "warn", "GPU-30": "warn"}
    rules = tmp_path / "rules.toml"
    rules.write_text("[health]\nhot_warn_minutes = 30\n")
    h = load_rules(str(rules)).health
    assert h.hot_warn_minutes == 30
    status = dict(
        collect_stable(gpu_health(samples, load_catalog(), h)).select("gpu_uuid", "status").rows()
    )
    assert status == {"GPU-1": "ok", "GPU-14": "ok", "GPU-15": "ok", "GPU-30": "warn"}
    rules.write_text("[health]\nhot_warn_minutes = 0\n")
    with pytest.raises(ValueError, match="health.hot_warn_minutes = 0 is out of range"):
        load_rules(str(rules))


def test_stragglers_fifteen_points_below_the_pod_median():
    rows = []
    for i in range(60):
        for g, sm in (("GPU-a", 0.80), ("GPU-b", 0.82), ("GPU-c", 0.60), ("GPU-d", 0.70)):
            rows.append(
                {
                    "minute": T0 + timedelta(minutes=i),
                    "gpu_uuid": g,
                    "pod": "job-1",
                    "prof_sm_active": sm,
                    "gpu_util_pct": 99.0,
                }
            )
    rows.append(
        {
            "minute": T0,
            "gpu_uuid": "GPU-solo",
            "pod": "job-2",
            "prof_sm_active": 0.1,
            "gpu_util_pct": 99.0,
        }
    )
    s = collect_stable(stragglers(minutes_frame(rows).lazy()))
    assert s["gpu_uuid"].to_list() == ["GPU-c"]  # 15 below the median 75; GPU-d is 5 below
    r = s.row(0, named=True)
    assert r["metric"] == "sm_active_pct" and r["pod_median"] == pytest.approx(75.0)
    assert r["points_below"] == pytest.approx(15.0) and r["pod_gpus"] == 4


def test_stragglers_by_spread_name_the_slowest_gpu():
    """A pod whose GPUs' SM activity spreads with a std dev above 0.15 straggles."""
    pods = {
        # median 72, the slowest 12 below (not below_median); population std dev:
        # mean 80.8, squares 432.64 + 2 x 77.44 + 2 x 368.64 = 1324.8, / 5 = 264.96 -> 16.28
        "spread-only": [0.60, 0.72, 0.72, 1.00, 1.00],
        # median 70, 50 is 20 below, std dev 20: both rules
        "both": [0.90, 0.50],
        # median 76, 62 is 14 below, std dev 14: neither
        "neither": [0.90, 0.90, 0.62, 0.62],
    }
    rows = [
        {
            "minute": T0 + timedelta(minutes=i),
            "gpu_uuid": f"GPU-{pod}-{g}",
            "pod": pod,
            "prof_sm_active": sm,
            "gpu_util_pct": 99.0,
        }
        for pod, values in pods.items()
        for g, sm in enumerate(values)
        for i in range(60)
    ]
    s = collect_stable(stragglers(minutes_frame(rows).lazy()))
    by = {r["gpu_uuid"]: r for r in s.iter_rows(named=True)}
    assert set(by) == {"GPU-spread-only-0", "GPU-both-1"}
    r = by["GPU-spread-only-0"]
    assert r["rule"] == "spread" and r["points_below"] == pytest.approx(12.0)
    assert r["pod_stddev"] == pytest.approx((1324.8 / 5) ** 0.5)
    r = by["GPU-both-1"]
    assert r["rule"] == "below_median, spread" and r["pod_stddev"] == pytest.approx(20.0)
    # a stricter spread rule (0.25) leaves only the median rule
    strict = collect_stable(
        stragglers(minutes_frame(rows).lazy(), HealthThresholds(straggler_spread_from=0.25))
    )
    assert strict["gpu_uuid"].to_list() == ["GPU-both-1"] and strict["rule"].to_list() == [
        "below_median"
    ]


def test_advice_without_profiling_fields_comes_from_power_and_pcie():
    """An NVML-only fleet (utilization, power, PCIe; no DCP fields): a namespace busy at high
    power on FP8-capable H100s gets precision and kernel advice, namespaces busy at low power
    get input-pipeline advice, split by PCIe into data loading and CPU preprocessing."""
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    gpus = [
        # uuid, model, namespace, util, power W, PCIe RX bytes/s
        ("GPU-x", MODELS["H100"], "llm", 98.0, 620.0, None),  # PIF 620/700 = 0.886
        ("GPU-y", MODELS["A100"], "etl", 95.0, 80.0, 1e8),  # PIF 0.2, PCIe quiet
        ("GPU-z", MODELS["A100"], "loader", 95.0, 80.0, 3e9),  # PIF 0.2, PCIe busy
    ]
    samples = pl.DataFrame(
        {
            "date": [D] * 180,
            "timestamp": [T0 + timedelta(minutes=10 * 60 + i) for _ in gpus for i in range(60)],
            "gpu_uuid": [g[0] for g in gpus for _ in range(60)],
            "gpu_model": [g[1] for g in gpus for _ in range(60)],
            "namespace": [g[2] for g in gpus for _ in range(60)],
            "gpu_util_pct": [g[3] for g in gpus for _ in range(60)],
            "power_w": [g[4] for g in gpus for _ in range(60)],
            "pcie_rx_bytes_per_s": [g[5] for g in gpus for _ in range(60)],
        }
    )
    samples = conform(samples, GPU_SAMPLES_SCHEMA)
    cat, prices = load_catalog(), load_prices()
    m = collect_stable(gpu_minutes(samples.lazy(), cat, prices))
    by = {
        r["gpu_uuid"]: r
        for r in m.group_by("gpu_uuid")
        .agg(pl.col("diagnosis").first(), pl.col("diagnosis_basis").first())
        .iter_rows(named=True)
    }
    assert (by["GPU-x"]["diagnosis"], by["GPU-x"]["diagnosis_basis"]) == ("compute_bound", "power")
    assert (by["GPU-y"]["diagnosis"], by["GPU-y"]["diagnosis_basis"]) == (
        "data_starved",
        "power_pcie",
    )
    rec = {r["namespace"]: r for r in recommendations(m.lazy(), prices, cat).iter_rows(named=True)}
    llm = rec["llm"]
    assert {"AMP", "BF16", "FP8", "torch.compile", "fused_kernels"} <= set(llm["actions"])
    assert not {"DALI", "num_workers"} & set(llm["actions"])
    # the catalog, not the name, says A100s have no FP8: a compute-bound A100 namespace gets none
    a100 = m.filter(pl.col("gpu_uuid") == "GPU-x").with_columns(
        pl.lit(MODELS["A100"]).alias("gpu_model"), pl.lit("a100-llm").alias("namespace")
    )
    a100_rec = recommendations(a100.lazy(), prices, cat).row(0, named=True)
    assert "FP8" not in a100_rec["actions"] and "BF16" in a100_rec["actions"]
    for ns, cause in (("etl", "CPU preprocessing"), ("loader", "data loading")):
        r = rec[ns]
        assert {"DALI", "num_workers", "pin_memory"} <= set(r["actions"]), ns
        dali = next(d for d in r["action_details"] if d["action"] == "DALI")
        assert cause in dali["rationale"], (ns, dali["rationale"])
        # savings stay capped by the measured waste
        assert r["utilization_savings_frac"] <= r["measured_waste_frac"] + 1e-12


def test_report_trend_and_capacity_by_hand(tmp_path):
    """The 7-day trend reads the days the lake holds (their fleet_daily row, and the waste of
    their priced_waste summed); capacity is theoretical vs achievable vs realized TFLOPS per
    model, all computed here by hand."""
    from gpu_pipeline.lib.io.lake import DamagedPartition, Lake
    from gpu_pipeline.lib.io.report import build_report
    from gpu_pipeline.lib.io.report.data import fleet_capacity, fleet_trend, gpu_figures
    from gpu_pipeline.lib.schemas import TABLES

    lake = Lake(tmp_path / "lake")
    d1, d3 = date(2024, 1, 5), date(2024, 1, 7)  # 2024-01-06 is not in the lake

    def fleet(d, minutes, util, rfu):
        gpus = -(-minutes // 1440)
        row = {"date": d, "gpus": gpus, "observed_gpu_minutes": minutes}
        row |= {"expected_gpu_minutes": gpus * 1440, "coverage_pct": 100 * minutes / 1440 / gpus}
        row |= {"gpu_hours": minutes / 60, "avg_gpu_util_pct": util, "avg_rfu_pct": rfu}
        return conform(pl.DataFrame([row]), TABLES["fleet_daily"])

    def waste(d, amounts):
        return conform(
            pl.DataFrame({"date": [d] * len(amounts), "total_waste_usd": amounts}),
            TABLES["priced_waste"],
        )

    # the fleet's means are fleet_daily's (the staging pass computes them, the report reads them)
    lake.write("fleet_daily", d1, fleet(d1, 240, 80.0, 50.0))
    lake.write("priced_waste", d1, waste(d1, [3.0, 4.5]))
    lake.write("fleet_daily", d3, fleet(d3, 120, 70.0, 35.0))
    lake.write("priced_waste", d3, waste(d3, [2.25]))
    t = fleet_trend(lake, d3)
    assert t["date"].to_list() == [d1, d3]
    # waste: 3.0 + 4.5 = 7.5
    assert t.row(0) == (d1, 240, 80.0, 50.0, 7.5)
    assert t.row(1) == (d3, 120, 70.0, 35.0, 2.25)
    # another day's damaged partition is a gap in the trend, not a failed report; the report
    # day's own must be readable
    d2 = date(2024, 1, 6)
    lake.write("fleet_daily", d2, fleet(d2, 60, 10.0, 5.0))
    part = lake.partition_file("fleet_daily", d2)
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    assert fleet_trend(lake, d3)["date"].to_list() == [d1, d3]
    with pytest.raises(DamagedPartition, match="the fleet_daily partition of 2024-01-06"):
        fleet_trend(lake, d2)

    # two H100s, two minutes each, at PIF 0.5 and 0.25: realized 323 and 161.5 TFLOPS
    m = minutes_frame(
        [
            {
                "date": d3,
                "minute": T0 + timedelta(minutes=i),
                "gpu_uuid": g,
                "gpu_model": "H100 80GB HBM3",
                "achievable_tflops": 646.0,
                "pif": pif,
                "realized_tflops": 646.0 * pif,
                "rfu_pct": 100 * pif,
                "gpu_util_pct": 95.0,
            }
            for g, pif in (("GPU-1", 0.5), ("GPU-2", 0.25))
            for i in range(2)
        ]
    )
    cap = fleet_capacity(gpu_figures(m), load_catalog()).row(0, named=True)
    assert cap["gpus"] == 2 and cap["theoretical_tflops"] == 2 * 1979
    assert cap["achievable_tflops"] == 2 * 646
    assert cap["realized_tflops"] == pytest.approx(2 * (323 + 161.5) / 2)  # 484.5
    assert cap["realized_pct_of_achievable"] == pytest.approx(37.5)
    lake.write("gpu_minutes", d3, m)
    html = build_report(lake, d3).html
    assert "Fleet trend" in html and "Fleet capacity per model" in html
    assert "<td>3,958</td><td>1,292</td><td>484</td><td>37.5 %</td>" in html


def test_energy_per_gpu_day_and_namespace_by_hand(tmp_path):
    """kWh from mean power x minutes (idle kWh its own line), priced per cluster, with CO2."""
    from gpu_pipeline.lib.reference import load_energy
    from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    # GPU-a (c1, ns a): 30 idle minutes at 100 W, 30 busy at 400 W; GPU-b (c2, ns b): 60 at 300 W
    rows = [
        ("GPU-a", "c1", "a", 5.0 if i < 30 else 90.0, 100.0 if i < 30 else 400.0) for i in range(60)
    ]
    rows += [("GPU-b", "c2", "b", 80.0, 300.0) for _ in range(60)]
    samples = conform(
        pl.DataFrame(
            {
                "date": [D] * 120,
                "timestamp": [T0 + timedelta(minutes=i % 60) for i in range(120)],
                "gpu_uuid": [r[0] for r in rows],
                "cluster": [r[1] for r in rows],
                "namespace": [r[2] for r in rows],
                "gpu_model": [MODELS["A100"]] * 120,
                "gpu_util_pct": [r[3] for r in rows],
                "power_w": [r[4] for r in rows],
            }
        ),
        GPU_SAMPLES_SCHEMA,
    )
    m = collect_stable(gpu_minutes(samples.lazy(), load_catalog(), load_prices()))
    daily = {
        r["gpu_uuid"]: r
        for r in collect_stable(gpu_daily(minute_runs(m.lazy()))).iter_rows(named=True)
    }
    # (30 x 100 + 30 x 400) W-min / 60 = 250 Wh; idle 30 x 100 / 60 = 50 Wh; GPU-b 300 Wh
    assert daily["GPU-a"]["energy_kwh"] == pytest.approx(0.25)
    assert daily["GPU-a"]["idle_energy_kwh"] == pytest.approx(0.05)
    assert daily["GPU-b"]["energy_kwh"] == pytest.approx(0.30)
    assert daily["GPU-b"]["idle_energy_kwh"] == 0.0
    rates = tmp_path / "energy.csv"
    rates.write_text("cluster,usd_per_kwh,co2_g_per_kwh\nc2,0.30,100\n*,0.10,500\n")
    ns = {
        r["namespace"]: r
        for r in collect_stable(namespace_efficiency(m.lazy(), load_energy(rates))).iter_rows(
            named=True
        )
    }
    # a: 0.25 kWh x $0.10 = $0.025, x 500 g = 0.125 kg; b: 0.3 kWh x $0.30 = $0.09, x 100 g = 0.03 kg
    assert (ns["a"]["energy_kwh"], ns["a"]["idle_energy_kwh"]) == pytest.approx((0.25, 0.05))
    assert (ns["a"]["energy_usd"], ns["a"]["co2_kg"]) == pytest.approx((0.025, 0.125))
    assert (ns["b"]["energy_usd"], ns["b"]["co2_kg"]) == pytest.approx((0.09, 0.03))
    rates.write_text("cluster,usd_per_kwh,co2_g_per_kwh\nc2,-1,100\n")
    with pytest.raises(Exception, match="line 2, usd_per_kwh='-1': negative"):
        load_energy(rates)


def test_report_says_when_a_days_data_is_partial(tmp_path):
    """Near the top, before the figures: coverage, observed vs expected GPU-minutes and the GPU
    with the largest gap; nothing on a complete day; a warning below coverage.warn_below."""
    from gpu_pipeline.lib.io.lake import Lake
    from gpu_pipeline.lib.io.report import build_report
    from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
    from gpu_pipeline.lib.rules import Thresholds
    from gpu_pipeline.lib.staging.gpu_daily import gpu_daily

    def day(lake: Lake, minutes_of: dict[str, int], with_fleet: bool = True) -> None:
        rows = [
            {"minute": T0 + timedelta(minutes=i), "gpu_uuid": g, "gpu_util_pct": 50.0}
            | {"pif": 0.5, "rfu_pct": 50.0, "phase": "underutilized", "gpu_share": 1.0}
            for g, n in minutes_of.items()
            for i in range(n)
        ]
        m = minutes_frame(rows)
        lake.write("gpu_minutes", D, m)
        lake.write("gpu_daily", D, collect_stable(gpu_daily(minute_runs(m.lazy()))))
        if with_fleet:
            lake.write("fleet_daily", D, collect_stable(fleet_daily(minute_runs(m.lazy()))))

    def banner(html: str) -> str:
        start = html.index("<p class='partial")
        assert start < html.index("class='kpis'")  # above the figures
        return html[start : html.index("</p>", start)]

    complete = Lake(tmp_path / "complete")
    day(complete, {"GPU-a": 1440, "GPU-b": 1440})
    html = build_report(complete, D).html
    assert "Partial data" not in html and "<div class='kpi'>coverage<b>100.0 %</b>" in html

    # GPU-b lost 140 minutes: 2,740 of 2,880 GPU-minutes, 95.1 % (above the 90 % warning)
    partial = Lake(tmp_path / "partial")
    day(partial, {"GPU-a": 1440, "GPU-b": 1300})
    b = banner(build_report(partial, D).html)
    assert "this day's telemetry covers 95.1 % of its GPU-minutes" in b
    assert "2,740 observed of 2,880 expected (2 GPUs seen × 1,440 minutes)" in b
    assert (
        "1 of 2 GPUs has gaps; the least covered is <bdi>GPU-b</bdi> (90.2 %, 1,300 minutes)" in b
    )
    assert "class='partial'" in b and "below the" not in b
    # the same day under a stricter rule: a warning
    b = banner(build_report(partial, D, t=Thresholds(coverage_warn_below=99.0)).html)
    assert "class='partial warn'" in b and "below the 99 % at which the fleet_coverage" in b
    # a lake written before fleet_daily existed: the same numbers, from the minutes
    old = Lake(tmp_path / "old")
    day(old, {"GPU-a": 1440, "GPU-b": 1300}, with_fleet=False)
    assert "2,740 observed of 2,880 expected" in banner(build_report(old, D).html)
    # an hour of one GPU: 4.1 % (rounded down, as every coverage the report prints)
    hour = Lake(tmp_path / "hour")
    day(hour, {"GPU-a": 60})
    b = banner(build_report(hour, D).html)
    assert "covers 4.1 %" in b and "class='partial warn'" in b and "below the 90 %" in b


def _mig_tenants_day() -> pl.DataFrame:
    """An A100 split into a 3g (namespace a: idle 30 minutes, then busy) and a 2g (b) instance,
    the GPU at 280 W on its physical row (instances carry no power), and a whole A100 of
    namespace w at 300 W; 60 minutes."""
    rows = []
    for i in range(60):
        ts = T0 + timedelta(minutes=i)
        base = {"date": D, "timestamp": ts, "cluster": "c1", "gpu_model": MODELS["A100"]}
        base |= {"source_file": "f"}
        mig = base | {"gpu_uuid": "GPU-mig", "hostname": "h1"}
        rows.append(mig | {"power_w": 280.0})
        rows.append(
            mig
            | {"gpu_instance_id": 1, "gpu_instance_profile": "3g.20gb", "namespace": "a"}
            | {"prof_gr_engine_active": 0.05 if i < 30 else 0.9}
        )
        rows.append(
            mig
            | {"gpu_instance_id": 2, "gpu_instance_profile": "2g.10gb", "namespace": "b"}
            | {"prof_gr_engine_active": 0.5}
        )
        rows.append(
            base
            | {"gpu_uuid": "GPU-w", "hostname": "h2", "namespace": "w"}
            | {"gpu_util_pct": 80.0, "power_w": 300.0}
        )
    return conform(pl.DataFrame(rows, infer_schema_length=None), GPU_SAMPLES_SCHEMA)


def test_mig_tenants_get_the_gpus_energy_by_slice_share():
    """A MIG instance's namespace gets the physical GPU's energy x its slice share, the free
    slices the rest (idle, on the GPU's own namespace): namespace energy adds up to the fleet's."""
    from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    m = collect_stable(gpu_minutes(_mig_tenants_day().lazy(), load_catalog(), load_prices()))
    daily = collect_stable(gpu_daily(minute_runs(m.lazy())))
    physical = daily.filter(pl.col("gpu_instance_id").is_null())
    # 280 W x 60 min = 0.28 kWh on the MIG GPU, 300 W x 60 min = 0.30 kWh on the whole one
    assert dict(physical.select("gpu_uuid", "energy_kwh").iter_rows()) == pytest.approx(
        {"GPU-mig": 0.28, "GPU-w": 0.30}
    )
    ns = {
        r["namespace"]: r
        for r in collect_stable(namespace_efficiency(m.lazy())).iter_rows(named=True)
    }
    # a: 3/7 of 0.28 = 0.12 kWh, idle its first 30 minutes: 0.06; b: 2/7 of 0.28 = 0.08, never
    # idle; the 2 free slices: 0.08 kWh, all idle, on the physical GPU's namespace (none)
    assert (ns["a"]["energy_kwh"], ns["a"]["idle_energy_kwh"]) == pytest.approx((0.12, 0.06))
    assert (ns["b"]["energy_kwh"], ns["b"]["idle_energy_kwh"]) == pytest.approx((0.08, 0.0))
    assert (ns[None]["energy_kwh"], ns[None]["idle_energy_kwh"]) == pytest.approx((0.08, 0.08))
    assert ns["w"]["energy_kwh"] == pytest.approx(0.30)
    # priced at the default rates ($0.12 / kWh, 400 g / kWh)
    assert (ns["a"]["energy_usd"], ns["a"]["co2_kg"]) == pytest.approx((0.0144, 0.048))
    assert (ns["b"]["energy_usd"], ns["b"]["co2_kg"]) == pytest.approx((0.0096, 0.032))
    # nothing lost, nothing counted twice: the namespaces' energy is the physical GPUs'
    total = sum(r["energy_kwh"] for r in ns.values())
    assert total == pytest.approx(physical["energy_kwh"].sum(), rel=1e-12)
    assert total == pytest.approx(0.58, rel=1e-12)


def test_what_to_do_first_ranks_recoverable_waste_and_spot_apart():
    """What to do first is waste (idle, stall, headroom: how the GPUs are used), by dollars a
    month; spot, a lower price for the same work, is ranked on its own (the demo's #1 was "spot
    for llm-pretrain", its most efficient namespace)."""
    from gpu_pipeline.lib.io.report.data import price_actions, top_actions
    from gpu_pipeline.lib.schemas import TABLES

    def act(action, group, f):
        return {"action": action, "group": group, "fraction": f, "rationale": f"why {action}"}

    rec = conform(
        pl.DataFrame(
            [
                {
                    "namespace": "a",
                    "cost_usd": 100.0,
                    "monthly_cost_usd": 3000.0,
                    "measured_waste_frac": 0.5,
                    "utilization_savings_frac": 0.5,
                    "rate_savings_frac": 0.6,
                    "total_savings_frac": 0.8,
                    "action_details": [
                        act("DALI", "idle_wallclock", 0.3),
                        act("MPS", "idle_wallclock", 0.6),  # capped by the 50 % measured
                        act("larger_batch", "batching", 0.2),
                        act("spot", "rate", 0.6),  # a price, not waste: not in the list
                    ],
                },
                {
                    "namespace": "b",
                    "cost_usd": 1000 / 30,
                    "monthly_cost_usd": 1000.0,
                    "measured_waste_frac": 0.9,
                    "utilization_savings_frac": 0.4,
                    "rate_savings_frac": 0.5,
                    "total_savings_frac": 0.7,
                    "action_details": [act("AMP", "precision", 0.2), act("FP8", "precision", 0.4)],
                },
            ],
            schema_overrides={"action_details": TABLES["recommendations"]["action_details"]},
        ),
        TABLES["recommendations"],
    )
    top = top_actions(rec)
    # a: MPS min(0.6, 0.5) x 3000 = 1500 (DALI, 900, recovers the same idle time: one line per
    # namespace and group); larger_batch 0.2 x 3000 = 600; b: FP8 0.4 x 1000 = 400 (not AMP)
    assert top.select("namespace", "action", "monthly_usd").rows() == [
        ("a", "MPS", 1500.0),
        ("a", "larger_batch", 600.0),
        ("b", "FP8", 400.0),
    ]
    assert "spot" not in top["action"].to_list()
    assert top["rationale"].to_list()[0] == "why MPS"
    # spot, apart: its rate on the cost the waste actions leave, (total - utilization) x month
    spot = price_actions(rec)
    assert spot.select("namespace", "rate_savings_frac").rows() == [("a", 0.6), ("b", 0.5)]
    assert spot["monthly_usd"].to_list() == pytest.approx([0.3 * 3000, 0.3 * 1000])
    assert spot["remaining_usd"].to_list() == pytest.approx([50.0, 0.6 * 1000 / 30])
    # three different actions: MPS again elsewhere (c, 0.9 x 1000 = 900) does not take a line
    more = pl.concat(
        [
            rec,
            rec.filter(pl.col("namespace") == "b").with_columns(
                pl.lit("c").alias("namespace"),
                pl.lit([act("MPS", "idle_wallclock", 0.9)])
                .cast(TABLES["recommendations"]["action_details"])
                .alias("action_details"),
            ),
        ]
    )
    assert top_actions(more)["action"].to_list() == ["MPS", "larger_batch", "FP8"]


def test_prices_used_names_the_price_book_entries_of_the_days_models(tmp_path):
    """The $/GPU-hour a day's minutes carry, beside the price book row it came from (file, line,
    source): what the report's appendix prints and the run's metadata can show."""
    from gpu_pipeline.lib.reference import DEFAULT_PRICES, prices_used

    m = minutes_frame(
        # a MIG instance of GPU-a: its physical GPU counts once
        [
            {"gpu_uuid": "GPU-a", "gpu_instance_id": 1, "gpu_model": MODELS["A100"]}
            | {"price_usd_per_hour": 2.5, "minute": T0}
        ]
        + [
            {"gpu_uuid": "GPU-a", "gpu_instance_id": None, "gpu_model": MODELS["A100"]}
            | {"price_usd_per_hour": 2.5, "minute": T0 + timedelta(minutes=i)}
            for i in range(90)
        ]
        + [
            {"gpu_uuid": "GPU-x", "gpu_instance_id": None, "gpu_model": "Mystery GPU"}
            | {"price_usd_per_hour": None, "minute": T0 + timedelta(minutes=i)}
            for i in range(30)
        ]
    )
    assert m["gpu_instance_id"].null_count() == 120
    used = {r["gpu_model"]: r for r in prices_used(m).iter_rows(named=True)}
    a100 = used[MODELS["A100"]]
    assert (a100["gpu_hours"], a100["usd_per_hour"], a100["on_demand_usd_per_hour"]) == (
        1.5,
        2.5,
        2.5,
    )
    assert a100["spot_usd_per_hour"] == 1.0 and a100["source"].startswith("(estimate)")
    assert a100["file"] == str(DEFAULT_PRICES) and a100["matches"]
    lines = DEFAULT_PRICES.read_text().splitlines()
    assert lines[a100["line"] - 1].startswith("A100-SXM4-40GB,2.50,1.00,")
    mystery = used["Mystery GPU"]
    assert mystery["on_demand_usd_per_hour"] is None and mystery["source"] is None
    assert mystery["usd_per_hour"] is None and mystery["matches"]  # unlisted, and unpriced
    # the user's book (GPU_PIPELINE_PRICES): another price for the A100 than the day carries
    book = tmp_path / "prices.csv"
    book.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nNVIDIA A100-SXM4-40GB,3.10,\n"
    )
    a100 = prices_used(m, book).filter(pl.col("gpu_model") == MODELS["A100"]).row(0, named=True)
    assert (a100["on_demand_usd_per_hour"], a100["spot_usd_per_hour"]) == (3.1, None)
    assert (a100["file"], a100["line"], a100["source"]) == (str(book), 2, None)
    assert a100["usd_per_hour"] == 2.5 and not a100["matches"]


def test_the_reports_minute_figures_are_read_a_chunk_of_gpus_at_a_time(monkeypatch):
    """The report never holds a day's GPU-minutes: per GPU its sums, counts and extremes are
    read a chunk of GPUs at a time (`gpu_figures`), the per-model means added up from them
    (`model_figures`) are the means over the minutes, and the scatter's points are every
    drawable minute of the physical GPUs or, over SCATTER_POINTS of them, about that many drawn
    by a hash of the GPU and minute: the same minutes however the day is cut."""
    from gpu_pipeline.lib.io.report import data
    from gpu_pipeline.lib.staging.chunked import Chunking

    rows = []
    for g in range(7):
        for i in range(60):
            rows.append(
                {
                    "gpu_uuid": f"GPU-{g}",
                    "gpu_model": MODELS["A100"] if g % 2 else MODELS["H100"],
                    "cluster": f"c{g % 3}",
                    "minute": T0 + timedelta(minutes=i),
                    "gpu_util_pct": None if i % 11 == 0 else float((g * 7 + i) % 100),
                    "rfu_pct": float((g * 3 + i) % 50),
                    "pif": None if i % 13 == 0 else ((g + i) % 10) / 10,
                    "realized_tflops": float(g * 10 + i),
                    "achievable_tflops": 100.0 + g,
                    "efficiency_class": "efficient",
                }
            )
    # a MIG instance of GPU-1: part of its GPU, never a GPU or a point of its own
    mig = minutes_frame([rows[61] | {"gpu_instance_id": 1, "gpu_util_pct": 99.0, "pif": 0.99}])
    m = pl.concat([minutes_frame(rows), mig]).sort("gpu_uuid", "gpu_instance_id", "minute")
    assert m["gpu_instance_id"].null_count() == 420
    physical = m.filter(pl.col("gpu_instance_id").is_null())
    drawable = physical.filter(pl.col("pif").is_not_null() & pl.col("gpu_util_pct").is_not_null())

    by = [data.gpu_figures(m.lazy(), Chunking(gpus=n)) for n in (1, 3, 100)]
    assert all(b.equals(by[0]) for b in by)
    gpus = by[0]
    assert gpus.height == 7 and gpus["minutes"].sum() == 420
    assert gpus["points"].sum() == drawable.height
    models = data.model_figures(gpus)
    direct = (
        physical.group_by("gpu_model")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("gpu_util_pct", "rfu_pct", "realized_tflops").mean(),
            pl.col("achievable_tflops").max(),
        )
        .sort("gpu_model")
    )
    assert models.columns == direct.columns
    assert models["gpus"].to_list() == direct["gpus"].to_list() == [3, 4]
    for c in ("gpu_util_pct", "rfu_pct", "realized_tflops", "achievable_tflops"):
        assert models[c].to_list() == pytest.approx(direct[c].to_list(), rel=1e-12)
    rates = data.energy_rates_of_day(gpus, None)
    assert rates["cluster"].to_list() == ["c0", "c1", "c2"]

    # every drawable minute, in the day's order, while there are few
    pts = data.scatter_points(m.lazy(), drawable.height, Chunking(gpus=2))
    assert pts.equals(drawable.select("gpu_util_pct", "pif", "efficiency_class"))
    # over the cap: about SCATTER_POINTS minutes, the same ones however the day is cut
    monkeypatch.setattr(data, "SCATTER_POINTS", 100)
    drawn = [data.scatter_points(m.lazy(), drawable.height, Chunking(gpus=n)) for n in (1, 3, 100)]
    assert all(d.equals(drawn[0]) for d in drawn)
    assert 60 <= drawn[0].height <= 140
    assert drawn[0].join(drawable, on=drawn[0].columns, how="anti").height == 0
