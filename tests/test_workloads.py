"""workload_efficiency (issue 33, part 1): a pod's owner from its name, the money of each
workload by hand (a MIG GPU's price split by slices), workloads adding up to their namespace,
and the mart on the demo fleet and on a real dcgm-exporter scrape of an EKS node."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from helpers import minutes_frame

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.namespace_efficiency import namespace_efficiency
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.marts.workload_efficiency import pod_owner, top_workloads
from gpu_pipeline.lib.marts.workload_efficiency import workload_efficiency as compute
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.schemas import validate
from gpu_pipeline.lib.staging.minute_runs import minute_runs

T0 = datetime(2024, 1, 1, 10, tzinfo=UTC)
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
EKS = "dcgm-exporter_h100x8_eks_pod-labels_sampled.prom"


# --- the pod's owner ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "owner"),
    [
        # Deployment: <deployment>-<ReplicaSet pod-template-hash>-<5 random>
        ("web-7d9f8c6b5d-x2kq9", "web"),
        ("coredns-5d78c9869d-8fr2v", "coredns"),
        ("resnet-50-7d9f8c6b5d-x2kq9", "resnet-50"),  # one suffix stripped, the -50 stays
        # StatefulSet (and the replicas of training operators): <name>-<ordinal>
        ("db-3", "db"),
        ("mnist-worker-0", "mnist-worker"),
        ("triton-12", "triton"),
        # Job: <job>-<5 random>; a real pod of the samples (NVIDIA Dynamo on EKS)
        ("train-x7k2p", "train"),
        ("vllm-agg-0-vllmdecodeworker-s65j5", "vllm-agg-0-vllmdecodeworker"),
        # CronJob: <cronjob>-<scheduled minute since the epoch>-<5 random>
        ("nightly-28458960-bq7zd", "nightly"),
        ("backup-db-29010845-5xw2k", "backup-db"),
        # bare pods
        ("mypod", "mypod"),
        ("jupyter", "jupyter"),
        # words are not generated suffixes: Kubernetes' alphabet has no vowels, no 0, 1 or 3
        ("bert-large", "bert-large"),
        ("train-abcde", "train-abcde"),
        ("llm-train", "llm-train"),
        ("web-7d9f8c6b5d-x2kq1", "web-7d9f8c6b5d-x2kq1"),  # a 1: not a generated suffix
        # the price of reading ordinals: a bare pod named like a replica loses its number
        ("resnet-50", "resnet"),
        (None, None),
    ],
)
def test_pod_owner_on_real_name_shapes(pod, owner):
    got = pl.select(pod_owner(pl.lit(pod, pl.String))).item()
    assert got == owner


# --- money by hand ----------------------------------------------------------------------------

PER_MIN = 2.5 / 60  # A100-SXM4-40GB on demand, per GPU-minute


def _row(i: int, gpu: str, pod: str | None, util: float, rfu: float, phase: str, diag: str, **kw):
    return {
        "minute": T0 + timedelta(minutes=i),
        "gpu_uuid": gpu,
        "namespace": "team" if pod else None,
        "pod": pod,
        "gpu_util_pct": util,
        "rfu_pct": rfu,
        "pif": rfu / 100,
        "efficiency_gap_pct": util - rfu,
        "phase": phase,
        "diagnosis": diag,
        "price_usd_per_hour": 2.5,
        "gpu_share": 1.0,
        **kw,
    }


def planted() -> pl.DataFrame:
    """Namespace `team`: Deployment `web` (two pods: GPU-a 60 busy starved minutes, GPU-b 30
    idle ones) and StatefulSet `db` (two pods on the 3g.20gb instances of one MIG A100, 60
    minutes each); the A100's free seventh is its physical row (no namespace, no pod).

    The instances carry an RFU here so that their split is worked by hand too (real instances
    have no power of their own: their busy minutes are `unmeasured_usd`, tests/test_real_fleets.py
    and the fleet day's MIG GPU)."""
    rows = []
    for i in range(60):
        rows.append(_row(i, "GPU-a", "web-7d9f8c6b5d-x2kq9", 80.0, 30.0, "productive", "data_starved"))  # fmt: skip
        if i < 30:
            rows.append(_row(i, "GPU-b", "web-7d9f8c6b5d-bq7zd", 5.0, 12.0, "idle", "idle"))
        mig = {"gpu_instance_profile": "3g.20gb", "gpu_share": 3 / 7}
        rows.append(_row(i, "GPU-m", "db-0", 40.0, 60.0, "underutilized", "low_occupancy", gpu_instance_id=1, **mig))  # fmt: skip
        rows.append(_row(i, "GPU-m", "db-1", 95.0, 90.0, "compute_bound", "compute_bound", gpu_instance_id=2, **mig))  # fmt: skip
        rows.append(_row(i, "GPU-m", None, 60.0, 70.0, "underutilized", "mixed", gpu_share=1 / 7))
    return minutes_frame(rows)


@pytest.fixture(scope="module")
def workloads() -> dict:
    w = compute(planted().lazy(), load_prices(), load_catalog())
    validate("workload_efficiency", w)
    return {r["workload"]: r for r in w.iter_rows(named=True)}


def test_a_deployments_pods_are_one_workload_by_hand(workloads):
    web = workloads["web"]
    assert (web["cluster"], web["namespace"], web["pods"], web["gpus"]) == ("c1", "team", 2, 2)
    assert web["gpu_hours"] == pytest.approx(1.5)  # 60 + 30 GPU-minutes
    assert web["avg_gpu_util_pct"] == pytest.approx((60 * 80 + 30 * 5) / 90)
    assert web["avg_rfu_pct"] == pytest.approx((60 * 30 + 30 * 12) / 90)
    assert (web["pct_idle"], web["pct_productive"]) == pytest.approx((100 / 3, 200 / 3))
    # GPU-a: productive 0.30, stall 0.80 - 0.30, headroom the rest; GPU-b: idle, all of it
    assert web["cost_usd"] == pytest.approx(90 * PER_MIN) == pytest.approx(3.75)
    assert web["productive_usd"] == pytest.approx(60 * 0.3 * PER_MIN)
    assert web["idle_waste_usd"] == pytest.approx(30 * PER_MIN)
    assert web["stall_waste_usd"] == pytest.approx(60 * 0.5 * PER_MIN)
    assert web["headroom_waste_usd"] == pytest.approx(60 * 0.2 * PER_MIN)
    assert web["total_waste_usd"] == pytest.approx(3.0)  # 1.25 idle + 1.25 stall + 0.50
    assert web["waste_frac"] == pytest.approx(0.8)
    assert web["hourly_waste_usd"] == pytest.approx(2.0)  # $3.00 over 1.5 GPU-hours
    assert (web["monthly_waste_usd"], web["yearly_waste_usd"]) == (1440.0, 17520.0)
    # most of its GPU-time starved; yet releasing the idle GPU recovers the most:
    # right_size 0.75 x idle 1/3 of cost = 0.25 > DALI 0.6 x stall 1/3 = 0.20 (= MIG 0.6 x 1/3)
    assert web["main_diagnosis"] == "data_starved"
    assert web["top_action"] == "right_size"


def test_a_statefulset_on_mig_slices_pays_its_slices(workloads):
    db = workloads["db"]
    # one physical GPU (its two instances), 2 x 3/7 of it for an hour
    assert (db["pods"], db["gpus"]) == (2, 1)
    assert db["gpu_hours"] == pytest.approx(6 / 7)
    assert db["avg_gpu_util_pct"] == pytest.approx(67.5)
    assert db["avg_rfu_pct"] == pytest.approx(75.0)
    assert (db["pct_underutilized"], db["pct_compute_bound"]) == pytest.approx((50.0, 50.0))
    slice_min = 3 / 7 * PER_MIN
    assert db["cost_usd"] == pytest.approx(120 * slice_min) == pytest.approx(2.5 * 6 / 7)
    # db-0: RFU 60 above utilization 40 -> productive 0.6, no stall, headroom 0.4;
    # db-1: productive 0.9, stall 0.05, headroom 0.05
    assert db["productive_usd"] == pytest.approx(60 * 1.5 * slice_min)
    assert db["stall_waste_usd"] == pytest.approx(60 * 0.05 * slice_min)
    assert db["headroom_waste_usd"] == pytest.approx(60 * 0.45 * slice_min)
    assert db["idle_waste_usd"] == 0.0
    hourly = 60 * 0.5 * slice_min / (6 / 7)
    assert db["monthly_waste_usd"] == round(hourly * 720, 2) == 450.0
    # a tie of GPU-time between two diagnoses goes to the first in DIAGNOSES order
    assert db["main_diagnosis"] == "compute_bound"
    # headroom 0.225 of cost: larger_batch 0.3 x 0.225 (low occupancy on half the active
    # minutes) beats AMP / BF16 0.25 x 0.225 and torch.compile 0.15 x 0.225
    assert db["top_action"] == "larger_batch"


def test_the_free_slices_are_idle_waste_of_no_workload(workloads):
    free = workloads[None]
    assert (free["namespace"], free["pods"], free["gpus"]) == (None, 0, 1)
    assert free["gpu_hours"] == pytest.approx(1 / 7)
    assert free["cost_usd"] == free["idle_waste_usd"] == pytest.approx(60 * PER_MIN / 7)
    assert (free["pct_idle"], free["main_diagnosis"]) == (100.0, "idle")


def test_workloads_add_up_to_their_namespace():
    m = planted()
    w = compute(m.lazy(), load_prices(), load_catalog())
    money = ["gpu_hours", "cost_usd", "idle_waste_usd", "stall_waste_usd", "headroom_waste_usd"]
    by_ns = w.group_by("cluster", "namespace").agg(pl.col(money).sum())
    pw = collect_stable(priced_waste(minute_runs(m.lazy())))
    by_pw = pw.group_by("cluster", "namespace").agg(pl.col(money).sum())
    both = by_ns.join(by_pw, on=["cluster", "namespace"], nulls_equal=True, suffix="_pw")
    assert both.height == by_ns.height == by_pw.height == 2  # team and the free slices
    for c in money:
        assert both[c].to_list() == pytest.approx(both[f"{c}_pw"].to_list(), abs=1e-9), c
    ns = collect_stable(namespace_efficiency(m.lazy())).filter(pl.col("namespace") == "team")
    team = w.filter(pl.col("namespace") == "team")
    assert team["cost_usd"].sum() == pytest.approx(ns["cost_usd"].item())
    assert team["total_waste_usd"].sum() == pytest.approx(ns["waste_usd"].item())
    # and the whole day's
    assert w["cost_usd"].sum() == pytest.approx(3.75 + 2.5)


def test_a_workload_without_a_price_has_no_cost_and_no_action():
    rows = [
        {**_row(i, "GPU-x", "job-x7k2p", 5.0, 10.0, "idle", "idle"), "price_usd_per_hour": None}
        for i in range(30)
    ]
    w = compute(minutes_frame(rows).lazy(), load_prices(), load_catalog()).row(0, named=True)
    assert (w["workload"], w["gpu_hours"]) == ("job", pytest.approx(0.5))
    assert w["cost_usd"] is None and w["total_waste_usd"] is None
    assert w["monthly_waste_usd"] is None and w["top_action"] is None


def test_top_workloads_over_days_rank_by_waste():
    m = planted()
    day2 = m.with_columns(pl.col("date") + timedelta(days=1), pl.col("minute") + timedelta(days=1))
    w = pl.concat([compute(x.lazy(), load_prices(), load_catalog()) for x in (m, day2)])
    top = top_workloads(w.lazy(), 2)
    assert top["workload"].to_list() == ["web", "db"]
    assert top["total_waste_usd"].to_list() == pytest.approx([6.0, 2 * 30 * 3 / 7 * PER_MIN])
    assert top["monthly_waste_per_gpu"][0] == pytest.approx(6.0 / 3.0 * 720)


# --- through the asset graph -------------------------------------------------------------------

ASSETS = dg.load_assets_from_modules([raw, staging, marts, report])


def _materialize(tmp: Path, day: date) -> Lake:
    r = dg.materialize(
        ASSETS,
        partition_key=day.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp / "lake")),
            "landing": LandingResource(root=str(tmp / "raw")),
            "reference": ReferenceResource(),
        },
        instance=dg.DagsterInstance.ephemeral(),
    )
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e.passed
        for e in r.get_asset_check_evaluations()
    }
    assert checks[("workload_efficiency", "cost_split_sums_to_cost")]
    return Lake(tmp / "lake")


def _adds_up(lake: Lake, day: date) -> pl.DataFrame:
    """The day's workloads, after checking they add up to priced_waste's namespaces."""
    w = lake.read("workload_efficiency", day)
    money = ["gpu_hours", "cost_usd", "idle_waste_usd", "stall_waste_usd", "headroom_waste_usd"]
    keys = ["cluster", "namespace"]
    a = w.group_by(keys).agg(pl.col(money).sum()).sort(keys, nulls_last=False)
    b = lake.read("priced_waste", day).group_by(keys).agg(pl.col(money).sum())
    b = b.sort(keys, nulls_last=False)
    assert a.select(keys).equals(b.select(keys))
    for c in money:
        assert a[c].to_list() == pytest.approx(b[c].to_list(), abs=1e-9), c
    return w


def test_the_demo_fleets_workloads(tmp_path):
    """The generated fleet (its pods: one per namespace and host) through the asset graph."""
    from gpu_pipeline.lib.generate import generate

    day = date(2024, 1, 1)
    generate(tmp_path / "raw", day, 1, 12, 3, 42, "prom")
    w = _adds_up(_materialize(tmp_path, day), day)
    assert w.height and w["workload"].null_count() == 0
    assert w["gpus"].sum() == 12 and w["gpu_hours"].sum() == pytest.approx(12 * 24)
    # the generator names pods as their owners do: each workload is its owner's name, whatever
    # the host (a StatefulSet's replicas, a Job's or a Deployment's pods are one workload)
    from gpu_pipeline.lib.generate import POD_OWNERS

    owners = {o for owned in POD_OWNERS.values() for _, o in owned}
    assert set(w["workload"]) <= owners
    pods = _materialize(tmp_path, day).read("gpu_minutes", day)["pod"].unique()
    assert pods.len() > w["workload"].n_unique()  # several pods a workload
    # the idle notebooks waste every dollar they cost, and say so
    nb = w.filter(pl.col("namespace") == "notebooks").row(0, named=True)
    assert nb["total_waste_usd"] == pytest.approx(nb["cost_usd"])
    assert (nb["main_diagnosis"], nb["top_action"]) == ("idle", "right_size")
    # the analysts' query ranks them as the report and the summary do (`top_workloads`)
    from gpu_pipeline.lib.io.warehouse import QUERIES_DIR, connect_readonly, run_queries

    lake = Lake(tmp_path / "lake")
    con = connect_readonly(lake.root, tmp_path / "views.duckdb")
    sql = (QUERIES_DIR / "top_wasted_workloads.sql").read_text()
    (got,) = [r.pl() for r in run_queries(con, sql)]
    want = top_workloads(lake.scan_days("workload_efficiency", [day]), 10)
    assert got.height == min(10, w.height)
    assert got["workload"].to_list() == want["workload"].to_list()
    assert got["waste_usd"].to_list() == [round(x, 2) for x in want["total_waste_usd"]]
    assert got["top_action"].to_list() == want["top_action"].to_list()


def test_namespace_marts_by_gpu_chunks_are_the_tables_of_the_whole_day(tmp_path):
    """The marts of a day's minutes sum each GPU's minutes a chunk of whole GPUs at a time
    (`by_gpu_chunks`), then add the GPUs' sums up: each table, to the last bit of every sum, is
    the same however the day is cut (a GPU a chunk, three, the whole day in one), and its
    numbers are those of the minutes grouped directly (GPU-hours, weighted means, money, the
    mode of the active minutes' diagnoses, GPUs, straggler hours); a MIG instance still draws
    its power from its physical GPU's row, which is in another namespace (none)."""
    from gpu_pipeline.lib.generate import generate
    from gpu_pipeline.lib.marts.efficiency_roi import efficiency_roi
    from gpu_pipeline.lib.marts.recommendations import namespace_stats
    from gpu_pipeline.lib.marts.stragglers import stragglers
    from gpu_pipeline.lib.rules import DEFAULT
    from gpu_pipeline.lib.staging.chunked import Chunking

    day = date(2024, 1, 1)
    generate(tmp_path / "raw", day, 1, 24, 3, 7, "prom")
    fleet = _materialize(tmp_path, day).scan_days("gpu_minutes", [day])
    mig = planted().with_columns(
        pl.when(pl.col("gpu_instance_id").is_null() & (pl.col("gpu_uuid") == "GPU-m"))
        .then(300.0)
        .otherwise(pl.col("power_w"))
        .alias("power_w")
    )
    tables = {}
    for gpus in (1, 3, 10_000):
        c = Chunking(gpus=gpus)
        tables[gpus] = [
            f(m, c)
            for m in (fleet, mig.lazy())
            for f in (
                lambda m, c: compute(m, load_prices(), load_catalog(), chunking=c),
                lambda m, c: collect_stable(namespace_efficiency(m, chunking=c)),
                lambda m, c: namespace_stats(m, load_prices(), chunking=c),
                lambda m, c: collect_stable(efficiency_roi(m, chunking=c)),
                lambda m, c: collect_stable(stragglers(m, chunking=c)),
            )
        ]
    workloads, namespaces, stats, roi, _ = tables[10_000][:5]
    assert workloads.height > 10 and workloads["namespace"].n_unique() > 4
    team = tables[10_000][6].filter(pl.col("namespace") == "team")
    assert team["energy_kwh"].item() == pytest.approx(2 * 60 * 300.0 * 3 / 7 / 60 / 1000)
    for gpus in (1, 3):
        for got, want in zip(tables[gpus], tables[10_000], strict=True):
            assert got.equals(want)

    # the same numbers as the minutes grouped directly
    m = fleet.collect()
    w = pl.col("gpu_share").fill_null(1.0)
    active = pl.col("gpu_util_pct") >= DEFAULT.idle_below
    direct = (
        m.group_by("namespace")
        .agg(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            (w.sum() / 60).alias("gpu_hours"),
            ((pl.col("rfu_pct") * w).sum() / w.filter(pl.col("rfu_pct").is_not_null()).sum()).alias(
                "avg_rfu_pct"
            ),
            pl.col("diagnosis").filter(active).mode().sort().first().alias("dominant_diagnosis"),
        )
        .sort("namespace")
    )
    got = namespaces.sort("namespace").select(direct.columns)
    assert got["gpus"].to_list() == direct["gpus"].to_list()
    assert (
        got["dominant_diagnosis"].cast(pl.String).to_list()
        == direct["dominant_diagnosis"].cast(pl.String).to_list()
    )
    for c in ("gpu_hours", "avg_rfu_pct"):
        assert got[c].to_list() == pytest.approx(direct[c].to_list(), rel=1e-12)
    assert stats.sort("namespace")["gpu_hours"].to_list() == pytest.approx(
        direct["gpu_hours"].to_list(), rel=1e-12
    )
    # a namespace's workloads add up to the namespace: GPU-hours and cost
    by_ns = (
        workloads.group_by("namespace").agg(pl.col("gpu_hours", "cost_usd").sum()).sort("namespace")
    )
    assert by_ns["gpu_hours"].to_list() == pytest.approx(direct["gpu_hours"].to_list(), rel=1e-12)
    assert by_ns["cost_usd"].to_list() == pytest.approx(
        namespaces.sort("namespace")["cost_usd"].to_list(), rel=1e-12
    )
    physical = m.filter(pl.col("gpu_instance_id").is_null())
    fleet_roi = roi.filter(pl.col("scope") == "fleet")
    assert fleet_roi["gpus"].item() == physical["gpu_uuid"].n_unique()
    assert fleet_roi["avg_rfu_pct"].item() == pytest.approx(physical["rfu_pct"].mean(), rel=1e-12)


def test_an_hpc_job_label_names_the_workload(tmp_path):
    """dcgm-exporter's `hpc_job` label (its Slurm mapping) is the workload of the GPUs it is on,
    over the pod's owner; a GPU without it keeps its pod's owner."""
    from helpers import MODELS, expo_lines, write_file

    day = date(2024, 1, 1)
    lines = []
    for gpu, job in ((0, "4711"), (1, "4711"), (2, None)):
        for line in expo_lines(
            f"GPU-h{gpu}", MODELS["A100"], "n1", "hpc", day, range(60), 80, 200.0, gpu
        ):
            lines.append(line.replace("}", f',hpc_job="{job}"}}', 1) if job else line)
    write_file(tmp_path / "raw" / f"n1_{day}.prom", lines)
    lake = _materialize(tmp_path, day)
    samples = lake.read("gpu_samples", day)
    assert samples.group_by("gpu_uuid").agg(pl.col("hpc_job").first()).sort("gpu_uuid").rows() == [
        ("GPU-h0", "4711"),
        ("GPU-h1", "4711"),
        ("GPU-h2", None),
    ]
    w = _adds_up(lake, day).sort("workload")
    assert w.select("workload", "gpus", "pods").rows() == [("4711", 2, 2), ("hpc-pod", 1, 1)]
    assert w["gpu_hours"].to_list() == pytest.approx([2.0, 1.0])


@pytest.mark.skipif(not (SAMPLES / EKS).is_file(), reason="../shared/samples is not present")
def test_a_real_eks_scrape_names_its_workload(tmp_path):
    """The real scrape of an 8 x H100 EKS node: one GPU runs the decode worker of an NVIDIA
    Dynamo graph (pod vllm-agg-0-vllmdecodeworker-s65j5), the others no pod."""
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    (raw_dir / EKS).write_bytes((SAMPLES / EKS).read_bytes())
    # the scrape has no times of its own: it is filed on its file's day
    day = date(2025, 8, 1)
    stamp = datetime(2025, 8, 1, 12, tzinfo=UTC).timestamp()
    os.utime(raw_dir / EKS, (stamp, stamp))
    w = _adds_up(_materialize(tmp_path, day), day)
    named = w.filter(pl.col("workload").is_not_null()).row(0, named=True)
    assert (named["namespace"], named["workload"]) == (
        "dynamo-workload",
        "vllm-agg-0-vllmdecodeworker",
    )
    assert (named["pods"], named["gpus"]) == (1, 1)
    # the scrape: one sample a GPU, utilization 0 -> an idle minute, its whole cost idle waste
    assert named["gpu_hours"] == pytest.approx(1 / 60)
    assert named["cost_usd"] == pytest.approx(named["idle_waste_usd"])
    assert named["main_diagnosis"] == "idle"
    assert w["gpus"].sum() == 8
