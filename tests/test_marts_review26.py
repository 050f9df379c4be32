"""Review 26: a MIG GPU's RFU in the namespace means, the ROI's GPUs, precision advice over the
GPUs that support it, and the report scatter's empty text and axis."""

from datetime import UTC, datetime, timedelta

import matplotlib.pyplot as plt
import polars as pl
import pytest
from helpers import minutes_frame

from gpu_pipeline.lib.io.report import charts
from gpu_pipeline.lib.io.report.data import fleet_minutes, gpu_figures
from gpu_pipeline.lib.marts.efficiency_roi import efficiency_roi
from gpu_pipeline.lib.marts.namespace_efficiency import namespace_efficiency
from gpu_pipeline.lib.marts.namespace_monthly import namespace_usage, rfu_sums
from gpu_pipeline.lib.marts.recommendations import recommendations
from gpu_pipeline.lib.marts.workload_efficiency import workload_efficiency
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.rules import RECOMMEND
from gpu_pipeline.lib.samples import collect_stable

T0 = datetime(2024, 1, 1, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-40GB"
EMPTY = pl.DataFrame(
    schema={"gpu_util_pct": pl.Float64, "pif": pl.Float64, "efficiency_class": pl.String}
)


def _mig_day(instance_ns=("ns", "ns", "ns"), free_share=1 / 7) -> pl.DataFrame:
    """Two minutes of a whole A100 (RFU 40, util 50) in `ns` and of a MIG A100 (`GPU-mig`):
    its physical row (power: RFU 20; the free slices, `free_share`) and three 2-slice
    instances without power, at 70 % utilization, in `instance_ns`."""
    share = (1 - free_share) / 3
    rows = []
    for i in range(2):
        t = T0 + timedelta(minutes=i)
        common = {"minute": t, "gpu_model": A100, "price_usd_per_hour": 2.0}
        rows.append(
            common
            | {
                "gpu_uuid": "GPU-whole",
                "namespace": "ns",
                "gpu_util_pct": 50.0,
                "pif": 0.4,
                "rfu_pct": 40.0,
                "efficiency_gap_pct": 10.0,
                "power_w": 160.0,
                "phase": "underutilized",
                "gpu_share": 1.0,
            }
        )
        rows.append(
            common
            | {
                "gpu_uuid": "GPU-mig",
                "namespace": None,
                "gpu_util_pct": 70.0 * 3 * share,
                "pif": 0.2,
                "rfu_pct": 20.0,
                "efficiency_gap_pct": 70.0 * 3 * share - 20.0,
                "power_w": 80.0,
                "phase": "underutilized",
                "gpu_share": free_share,
            }
        )
        for gi, ns in zip((3, 5, 6), instance_ns, strict=True):
            rows.append(
                common
                | {
                    "gpu_uuid": "GPU-mig",
                    "gpu_instance_id": gi,
                    "gpu_instance_profile": "2g.20gb",
                    "namespace": ns,
                    "pod": f"{ns}-job-0",
                    "gpu_util_pct": 70.0,
                    "phase": "productive",
                    "gpu_share": share,
                }
            )
    return minutes_frame(rows)


def test_a_mig_gpus_rfu_counts_once_in_its_namespace():
    """Finding 1: the MIG GPU's power reached no namespace mean (the free slices' row had its
    RFU nulled, the instances have none): the namespace's RFU was the whole GPU's alone (40).
    Each physical GPU counted once: (40 + 20) / 2 = 30; the gap the same way."""
    m = _mig_day(instance_ns=("ns", "ns", "ns"))
    m = m.with_columns(pl.col("namespace").fill_null("ns"))
    ne = collect_stable(namespace_efficiency(m.lazy())).row(0, named=True)
    assert ne["avg_rfu_pct"] == pytest.approx(30.0)
    # utilization: the whole GPU's 50 and the MIG GPU's slice-weighted 6/7 x 70 = 60
    assert ne["avg_gpu_util_pct"] == pytest.approx((50 + 60) / 2)
    assert ne["avg_efficiency_gap_pct"] == pytest.approx(((50 - 40) + (60 - 20)) / 2)
    we = workload_efficiency(m.lazy(), load_prices())
    total_w = we["gpu_hours"].sum()
    rfu = (we["avg_rfu_pct"].fill_null(0) * we["gpu_hours"]).sum() / total_w
    assert rfu == pytest.approx(30.0)
    # the month's weights (namespace_monthly, the report's month to date) agree
    usage = collect_stable(namespace_usage(m.lazy())).row(0, named=True)
    assert usage["_rfu_sum"] / usage["_rfu_weight"] == pytest.approx(30.0)
    sums = collect_stable(rfu_sums(m.lazy())).row(0, named=True)
    assert sums["_rfu_sum"] / sums["_rfu_weight"] == pytest.approx(30.0)


def test_a_fully_allocated_mig_gpus_rfu_goes_to_its_instances_namespaces():
    """All slices held (the physical row's share 0): the GPU's RFU is allocated by slice
    share, so each instance's namespace sees it and, over namespaces, it weighs one GPU."""
    m = _mig_day(instance_ns=("a", "b", "b"), free_share=0.0)
    ne = collect_stable(namespace_efficiency(m.lazy()))
    by = {r["namespace"]: r for r in ne.iter_rows(named=True)}
    assert by["a"]["avg_rfu_pct"] == pytest.approx(20.0)
    assert by["b"]["avg_rfu_pct"] == pytest.approx(20.0)
    assert by["a"]["avg_efficiency_gap_pct"] == pytest.approx(70.0 - 20.0)
    usage = collect_stable(namespace_usage(m.lazy()))
    mig_weight = usage.filter(pl.col("namespace").is_in(["a", "b"]))["_rfu_weight"].sum()
    assert mig_weight == pytest.approx(2.0)  # two minutes of one GPU


def test_the_roi_counts_only_gpus_with_an_rfu_and_a_price():
    """Finding 2: a vGPU without power or price made the fleet's GPUs 3 while its mean RFU and
    price were over 2: the ROI was 3/2 too large."""
    rows = [
        {"gpu_uuid": f"GPU-{i}", "gpu_model": A100, "rfu_pct": 30.0, "price_usd_per_hour": 2.0}
        for i in range(2)
    ]
    rows.append({"gpu_uuid": "GPU-v", "gpu_model": "GRID A100-40C"})
    roi = collect_stable(efficiency_roi(minutes_frame(rows).lazy(), target_rfu_pct=60.0))
    fleet = roi.filter(pl.col("scope") == "fleet").row(0, named=True)
    assert fleet["gpus"] == 2 and fleet["avg_rfu_pct"] == pytest.approx(30.0)
    assert fleet["equivalent_gpus"] == pytest.approx(2.0)
    assert fleet["monthly_value_usd"] == pytest.approx(2.0 * 2.0 * 720)
    vgpu = roi.filter(pl.col("gpu_model") == "GRID A100-40C").row(0, named=True)
    assert vgpu["gpus"] == 0 and vgpu["avg_rfu_pct"] is None
    # a model with an RFU but no price: its own row keeps its RFU (value unknown), the fleet's
    # valuation leaves it out
    rows.append({"gpu_uuid": "GPU-x", "gpu_model": "Acme X1", "rfu_pct": 10.0})
    roi = collect_stable(efficiency_roi(minutes_frame(rows).lazy(), target_rfu_pct=60.0))
    fleet = roi.filter(pl.col("scope") == "fleet").row(0, named=True)
    assert fleet["gpus"] == 2 and fleet["avg_rfu_pct"] == pytest.approx(30.0)
    acme = roi.filter(pl.col("gpu_model") == "Acme X1").row(0, named=True)
    assert acme["gpus"] == 1 and acme["avg_rfu_pct"] == pytest.approx(10.0)
    assert acme["monthly_value_usd"] is None


def _precision_day() -> pl.DataFrame:
    """60 minutes of two namespaces. `t4`: a compute-bound Tesla T4 (no BF16, no FP8) beside
    an idle H100 and an idle L40S. `h100`: a compute-bound H100 and a compute-bound T4."""
    gpus = [
        ("t4", "GPU-t4a", "Tesla T4", 95.0, 50.0, "compute_bound", 0.53),
        ("t4", "GPU-h1", "NVIDIA H100 80GB HBM3", 0.0, 10.0, "idle", 4.0),
        ("t4", "GPU-l1", "NVIDIA L40S", 0.0, 10.0, "idle", 1.8),
        ("h100", "GPU-h2", "NVIDIA H100 80GB HBM3", 95.0, 50.0, "compute_bound", 4.0),
        ("h100", "GPU-t4b", "Tesla T4", 95.0, 70.0, "compute_bound", 0.53),
    ]
    rows = []
    for i in range(60):
        for ns, uuid, model, util, rfu, diag, price in gpus:
            phase = "idle" if util < 10 else "compute_bound"
            rows.append(
                {
                    "minute": T0 + timedelta(minutes=i),
                    "gpu_uuid": uuid,
                    "namespace": ns,
                    "gpu_model": model,
                    "gpu_util_pct": util,
                    "pif": rfu / 100,
                    "rfu_pct": rfu,
                    "phase": phase,
                    "efficiency_class": "idle" if util < 10 else "moderate",
                    "diagnosis": diag,
                    "price_usd_per_hour": price,
                    "gpu_share": 1.0,
                }
            )
    return minutes_frame(rows)


def test_precision_advice_reads_the_gpus_that_support_it():
    """Finding 3: FP8 and BF16 were advised for a namespace whose only busy GPU is a T4
    (neither precision), because its idle H100 and L40S support them."""
    rec = recommendations(_precision_day().lazy(), load_prices(), catalog=load_catalog())
    by = {r["namespace"]: r for r in rec.iter_rows(named=True)}
    t4 = by["t4"]
    assert "FP8" not in t4["actions"] and "BF16" not in t4["actions"]
    assert "AMP" in t4["actions"]  # FP16 autocast runs on the T4's tensor cores
    # beside a busy T4, a busy H100: FP8 is worth the H100's headroom only
    h = by["h100"]
    fp8 = next(d for d in h["action_details"] if d["action"] == "FP8")
    h100_headroom = 60 * 4.0 / 60 * (1 - 0.95)  # util 95, RFU 50: productive .5, stall .45
    assert fp8["fraction"] == pytest.approx(RECOMMEND.fp8 * h100_headroom / h["cost_usd"])
    assert "100 %" in fp8["rationale"]
    assert "BF16" in h["actions"]


def _no_util_minutes() -> pl.DataFrame:
    """A MIG GPU's physical minutes under nvidia-smi: power and PIF, utilization [N/A]."""
    rows = [
        {
            "minute": T0 + timedelta(minutes=i),
            "gpu_model": "NVIDIA H100 80GB HBM3",
            "power_w": 433.78,
            "pif": 433.78 / 700,
            "rfu_pct": 100 * 433.78 / 700,
            "phase": "unknown",
        }
        for i in range(3)
    ]
    return minutes_frame(rows)


def test_the_empty_scatter_says_what_the_minutes_lack():
    """Finding 4: with power and PIF but no utilization, the scatter said the day's GPUs
    report no power. It says utilization is missing; without PIF it still says so."""
    figures = fleet_minutes(gpu_figures(_no_util_minutes()))
    chart = charts.scatter(EMPTY, 0, lacking=charts.scatter_lacking(figures))
    assert "no power" not in chart.caption and "utilization" in chart.caption
    assert "PIF" in chart.caption
    no_pif = _no_util_minutes().with_columns(
        pl.lit(50.0).alias("gpu_util_pct"), pl.lit(None, pl.Float64).alias("pif"),
        pl.lit(None, pl.Float64).alias("rfu_pct"),
    )  # fmt: skip
    lacking = charts.scatter_lacking(fleet_minutes(gpu_figures(no_pif)))
    assert charts.scatter(EMPTY, 0, lacking=lacking).caption.startswith(
        "No points: PIF (and RFU) need the GPU"
    )
    assert charts.scatter_shown(0, 0, lacking) == "none of this day's has a PIF"
    assert charts.scatter_shown(0, 0, "util") == "none of this day's has a utilization"


def test_the_scatter_shows_points_at_zero_utilization_whole(monkeypatch):
    """Finding 5: xlim(0, 101) cut the points at 0 % utilization (idle GPUs) in half."""
    figs = []

    def keep(fig):
        fig.canvas.draw()
        figs.append(fig)
        return b""

    monkeypatch.setattr(charts, "_png", keep)
    pts = pl.DataFrame(
        {"gpu_util_pct": [0.0, 100.0], "pif": [0.1, 0.9], "efficiency_class": ["idle", "efficient"]}
    )
    charts.scatter(pts, 2)
    (fig,) = figs
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    radius = 3  # data units: more than a marker of s=4 (about 2 pt across) at this size
    assert lo < 0 and hi > 100 and lo <= -radius / 2 and hi >= 100 + radius / 2
    assert all(not c.get_clip_on() for c in ax.collections)
    plt.close(fig)
