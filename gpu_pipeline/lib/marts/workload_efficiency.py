"""gpu_minutes -> `workload_efficiency`: day x cluster x namespace x workload, where a workload
is the Kubernetes owner of the pod (`pod_owner`). GPU-hours, utilization vs RFU, phase shares,
the cost split and run rates of priced_waste, the main diagnosis and the top action.

Money comes from the same allocated minutes as namespace_efficiency and recommendations
(`money.allocated_minutes`: a MIG instance's minute costs its slices, the free slices are idle
waste on the physical GPU's row) and every minute falls in exactly one workload of its
namespace, so the workloads of a namespace add up to the namespace: cost and each waste kind.
"""

from __future__ import annotations

import polars as pl

from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.marts.recommendations import (
    actions,
    precision_caps,
    rule_minutes,
    rule_stats,
    rule_sums,
    top_waste_action,
    with_precisions,
)
from gpu_pipeline.lib.money import priced_rates, weighted_sums
from gpu_pipeline.lib.rules import (
    DEFAULT,
    DIAGNOSES,
    DIAGNOSIS,
    HOURS_PER_MONTH,
    PHASES,
    RECOMMEND,
    DiagnosisThresholds,
    RecommendationThresholds,
    Thresholds,
)
from gpu_pipeline.lib.samples import collect_stable, ratio
from gpu_pipeline.lib.schemas import to_contract
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks

# the grain of workload_efficiency
WORKLOAD_KEYS = ("date", "cluster", "namespace", "workload")
# the means it shows (weighted by GPU share), by column of the minutes
MEANS = {"gpu_util_pct": "avg_gpu_util_pct", "rfu_pct": "avg_rfu_pct"}

# the characters Kubernetes draws generated names from (k8s.io/apimachinery util/rand: no
# vowels, no 0, 1 or 3, so that no word is spelled): ReplicaSet hashes and random suffixes
_K8S = "[bcdfghjklmnpqrstvwxz2456789]"
# a pod named by generateName is `<generateName><5 random>`, its generateName cut to this many
# characters first (names are at most 63): a longer `<replicaset>-` loses its end, dash included
GENERATE_NAME_MAX = 58
TRUNCATED_NAME = GENERATE_NAME_MAX + 5
# (owner, pattern of its pod names, the length the whole name must have or None): tried in this
# order, the first that matches is stripped, once; group 1 is the owner's name
POD_NAME_RULES: tuple[tuple[str, str, int | None], ...] = (
    # CronJob: its Job is named <cronjob>-<scheduled time, minutes since the epoch>, the Job's
    # pod <job>-<5 random>, or <job>-<index>-<5 random> when the Job is Indexed
    ("CronJob", rf"^(.+)-[0-9]{{8,}}(?:-[0-9]{{1,5}})?-{_K8S}{{5}}$", None),
    # Deployment: its ReplicaSet is <deployment>-<pod-template-hash>, the pod <rs>-<5 random>;
    # the hash is a uint32's decimal digits, one character each: 8 to 10 of them for all but
    # 0.2 % of hashes (below 10^7), so a shorter word (`convert-ckpts-x7k2p`) is not one
    ("Deployment", rf"^(.+)-{_K8S}{{8,10}}-{_K8S}{{5}}$", None),
    # Indexed Job (Kubernetes >= 1.22): <job>-<completion index>-<5 random>
    ("Indexed Job", rf"^(.+)-[0-9]{{1,5}}-{_K8S}{{5}}$", None),
    # a Deployment whose `<replicaset>-` is longer than GENERATE_NAME_MAX: the hash's first
    # characters (all of them when only the dash is cut), then the 5 random with no dash
    # between (a name of TRUNCATED_NAME characters)
    ("Deployment", rf"^(.+)-{_K8S}{{6,15}}$", TRUNCATED_NAME),
    # Job (and DaemonSet, ReplicaSet, anything named by generateName): <owner>-<5 random>
    ("Job", rf"^(.+)-{_K8S}{{5}}$", None),
    # StatefulSet: <statefulset>-<ordinal> (and the replicas of PyTorchJob, MPIJob, Volcano)
    ("StatefulSet", r"^(.+)-[0-9]+$", None),
)


def pod_owner(pod: pl.Expr) -> pl.Expr:
    """The workload a pod belongs to: its name without the suffix Kubernetes generated.

    `web-7d9f8c6b5d-x2kq9` (Deployment) -> `web`; `db-3` (StatefulSet) -> `db`;
    `train-x7k2p` (Job) -> `train`; `train-0-x7k2p` (Indexed Job) -> `train`;
    `nightly-28458960-bq7zd` and `nightly-28458960-0-bq7zd` (CronJob) -> `nightly`; a bare
    pod `mypod` -> `mypod`; no pod -> null. Only one suffix is stripped (the first rule of
    `POD_NAME_RULES` that matches), so `resnet-50-7d9f8c6b5d-x2kq9` -> `resnet-50`. Generated
    suffixes use Kubernetes' alphabet only (no vowels, no 0, 1, 3): `bert-large` and
    `train-abcde` keep their last word, and a ReplicaSet hash has 8 to 10 characters, so
    `eval-gpt4v-x7k2p` -> `eval-gpt4v`. A 63-character Deployment pod whose generateName was
    cut (`<deployment>-7d9f8c6bx2kq9`) -> the Deployment.

    What a name cannot tell (the telemetry carries no owner reference): a bare pod whose name
    ends in a number reads as a StatefulSet replica (`resnet-50` -> `resnet`), a Job's pod
    whose name ends in one as an Indexed Job's (`resnet-50-x7k2p` -> `resnet`), and a bare pod
    whose last word is 5 characters of the alphabet as a Job's pod (`dump-pgsql` -> `dump`:
    a fifth of real suffixes have no digit either, so the digits cannot tell them apart).
    """
    (_, rx, length), *rest = POD_NAME_RULES
    out = pl.when(_named_so(pod, rx, length)).then(pod.str.replace(rx, "$1"))
    for _, rx, length in rest:
        out = out.when(_named_so(pod, rx, length)).then(pod.str.replace(rx, "$1"))
    return out.otherwise(pod)


def _named_so(pod: pl.Expr, rx: str, length: int | None) -> pl.Expr:
    """The pod's name matches a rule of `POD_NAME_RULES`: its pattern (and length, if any)."""
    hit = pod.str.contains(rx)
    return hit if length is None else hit & (pod.str.len_chars() == length)


def with_workload(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Minutes with their `workload`: the HPC job where the exporter names one (its `hpc_job`
    label: a Slurm job's GPUs), else `pod_owner` of their pod; null without either. Worked out
    once per distinct pod, not once per minute."""
    pods = minutes.select("pod").unique().filter(pl.col("pod").is_not_null())
    owners = pods.with_columns(pod_owner(pl.col("pod")).alias("_owner"))
    return (
        minutes.join(owners, on="pod", how="left", maintain_order="left")
        .with_columns(pl.coalesce("hpc_job", "_owner").alias("workload"))
        .drop("_owner")
    )


def _sums(d: DiagnosisThresholds, t: Thresholds) -> list[pl.Expr]:
    """What a GPU's minutes in a workload (and in one pod) add to the workload's numbers: the
    rules' sums (`rule_sums`) and the table's own (unmeasured cost, the weights of the means,
    of each phase and of each diagnosis)."""
    w = pl.col("_w")
    return [
        *rule_sums(d.pcie_busy_from, t),
        pl.col("unmeasured_usd").sum(),
        *[e.alias(f"_{k}_{c}") for c in MEANS for k, e in zip("xw", weighted_sums(c), strict=True)],
        *[w.filter(pl.col("phase") == p).sum().alias(f"_wp_{p}") for p in PHASES],
        *[w.filter(pl.col("diagnosis") == x).sum().alias(f"_wd_{x}") for x in DIAGNOSES],
    ]


def _main_diagnosis() -> pl.Expr:
    """The diagnosis of most of the group's GPU-time (weighted by GPU share, idle included; the
    first in `DIAGNOSES` order on a tie); null when no minute has one."""
    weights = pl.concat_list([pl.col(f"_wd_{x}").sum() for x in DIAGNOSES])
    best = weights.list.arg_max().replace_strict(
        list(range(len(DIAGNOSES))), list(DIAGNOSES), return_dtype=pl.String
    )
    return pl.when(weights.list.max() > 0).then(best).alias("main_diagnosis")


def _aggregations(d: DiagnosisThresholds, t: Thresholds) -> list[pl.Expr]:
    """A workload's numbers from its GPUs' `_sums`: the rules' (gpus, GPU-hours, money,
    shares: `rule_stats`) and the table's own (pods, unmeasured cost, means, phase shares, main
    diagnosis)."""
    return [
        *rule_stats(d.pcie_busy_from, t),
        pl.col("pod").drop_nulls().n_unique().alias("pods"),
        pl.col("unmeasured_usd").sum(),
        *[
            ratio(pl.col(f"_x_{c}").sum(), pl.col(f"_w_{c}").sum()).alias(name)
            for c, name in MEANS.items()
        ],
        *[
            (100.0 * ratio(pl.col(f"_wp_{p}").sum(), pl.col("_w").sum())).alias(f"pct_{p}")
            for p in PHASES
        ],
        _main_diagnosis(),
    ]


def workload_efficiency(
    minutes: pl.LazyFrame,
    prices: pl.DataFrame,
    catalog: pl.DataFrame | None = None,
    d: DiagnosisThresholds = DIAGNOSIS,
    r: RecommendationThresholds = RECOMMEND,
    t: Thresholds = DEFAULT,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.DataFrame:
    """One row per day, cluster, namespace and workload (null: minutes without a pod).

    Minutes are weighted by their GPU share (a MIG instance by its slices), as in
    namespace_efficiency; money is priced_waste's split (`money.priced_rates`: null where no
    minute has a price); `top_action` is what the recommendation rules advise first for the
    workload's own numbers (`recommendations.top_waste_action`; spot is not a waste action).
    Each GPU's sums per workload and pod are taken a chunk of GPUs at a time
    (`by_gpu_chunks`), then added up per workload.
    """
    per_gpu = by_gpu_chunks(
        minutes,
        lambda m: (
            rule_minutes(with_workload(m), prices)
            .group_by(*WORKLOAD_KEYS, "gpu_uuid", "gpu_model", "pod", maintain_order=True)
            .agg(*_sums(d, t))
        ),
        chunking,
    )
    caps = precision_caps(catalog)
    stats = collect_stable(
        with_precisions(per_gpu, caps).lazy().group_by(*WORKLOAD_KEYS).agg(*_aggregations(d, t))
    )
    top = [top_waste_action(actions(row, caps, r)) for row in stats.iter_rows(named=True)]
    out = stats.lazy().with_columns(pl.Series("top_action", top, pl.String)).pipe(priced_rates)
    return (
        to_contract(out, "workload_efficiency")
        .sort("cluster", "namespace", "workload", nulls_last=False)
        .pipe(collect_stable)
    )


def top_workloads(rows: pl.LazyFrame, n: int = 10) -> pl.DataFrame:
    """The `n` workloads with the most recoverable waste (idle + stall + headroom) over the days
    of `rows` (workload_efficiency rows), most first: their GPU-hours, cost and waste summed,
    the waste per GPU-month (waste / GPU-hours x 720), and the main diagnosis and top action of
    their most wasteful day. Workloads without a price come last."""
    worst = pl.col("total_waste_usd").fill_null(-1.0)
    return (
        rows.group_by("cluster", "namespace", "workload")
        .agg(
            pl.col("gpu_hours").sum(),
            *[priced_total(c) for c in ("cost_usd", "total_waste_usd")],
            pl.col("main_diagnosis", "top_action").sort_by(worst, "date").last(),
        )
        .with_columns(
            ratio("total_waste_usd", "gpu_hours", HOURS_PER_MONTH).alias("monthly_waste_per_gpu")
        )
        .sort(
            "total_waste_usd",
            "cluster",
            "namespace",
            "workload",
            descending=[True, False, False, False],
            nulls_last=True,
        )  # fmt: skip
        .head(n)
        .pipe(collect_stable)
    )
