"""A pod's workload from its name (`pod_owner`): every name shape in one table, old and new,
and names made as Kubernetes makes them (pod-template-hash, generateName's 58-character cut,
Indexed Jobs) read back to their owner.

Kubernetes' generated parts (k8s.io/apimachinery/pkg/util/rand): a pod's random suffix is
`rand.String(5)` over "bcdfghjklmnpqrstvwxz2456789"; a ReplicaSet's pod-template-hash is
`rand.SafeEncodeString(fmt.Sprint(uint32 hash))`, one character per decimal digit (1 to 10 of
them, 8 to 10 for every hash from 10^7 up); a name from generateName is the prefix cut to 58
characters, then the 5 random ones."""

from __future__ import annotations

import random

import polars as pl
import pytest
from helpers import minutes_frame

from gpu_pipeline.lib.marts.workload_efficiency import pod_owner, with_workload

ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
MISTRAL = "mistral-7b-instruct-v2-predictor-00001-deployment"  # 49 characters

# (pod, workload): the names of tests/test_workloads.py and the shapes that were misread
CASES = [
    # Deployment: <deployment>-<ReplicaSet pod-template-hash>-<5 random>
    ("web-7d9f8c6b5d-x2kq9", "web"),
    ("coredns-5d78c9869d-8fr2v", "coredns"),
    ("resnet-50-7d9f8c6b5d-x2kq9", "resnet-50"),
    ("jupyter-alice-7d9f8c6b5d-x2kq9", "jupyter-alice"),
    ("web-7d9f8c6b-x2kq9", "web"),  # an 8-character hash (a uint32 below 10^8)
    # ... whose `<replicaset>-` is longer than 58 characters: cut there, the 5 random appended
    # with no dash (a 63-character name)
    (f"{MISTRAL}-7d9f8c6bx2kq9", MISTRAL),
    # StatefulSet (and the replicas of training operators): <name>-<ordinal>
    ("db-0", "db"),
    ("db-3", "db"),
    ("mnist-worker-0", "mnist-worker"),  # a PyTorchJob's worker 0: its replica set, deliberate
    ("triton-12", "triton"),
    # Job: <job>-<5 random>; a real pod of the samples (NVIDIA Dynamo on EKS)
    ("train-x7k2p", "train"),
    ("vllm-agg-0-vllmdecodeworker-s65j5", "vllm-agg-0-vllmdecodeworker"),
    # ... whose name has a word of the alphabet shorter than a hash: not a ReplicaSet hash
    ("convert-ckpts-x7k2p", "convert-ckpts"),
    ("eval-gpt4v-x7k2p", "eval-gpt4v"),
    # Indexed Job (Kubernetes >= 1.22): <job>-<index>-<5 random>, every index one workload
    ("train-0-x7k2p", "train"),
    ("train-1-q9z4m", "train"),
    ("train-17-q9z4m", "train"),
    # CronJob: <cronjob>-<scheduled minute since the epoch>-<5 random>, and its Indexed Job's
    ("nightly-28458960-bq7zd", "nightly"),
    ("backup-db-29010845-5xw2k", "backup-db"),
    ("nightly-28458960-0-bq7zd", "nightly"),
    ("nightly-28458960-3-bq7zd", "nightly"),
    # bare pods
    ("mypod", "mypod"),
    ("jupyter", "jupyter"),
    # words are not generated suffixes: Kubernetes' alphabet has no vowels, no 0, 1 or 3
    ("bert-large", "bert-large"),
    ("web-abcde", "web-abcde"),
    ("train-abcde", "train-abcde"),
    ("llm-train", "llm-train"),
    ("web-7d9f8c6b5d-x2kq1", "web-7d9f8c6b5d-x2kq1"),  # a 1: not a generated suffix
    # what a name cannot tell (no owner reference in the telemetry), documented in pod_owner:
    # a bare pod ending in a number reads as a replica; one whose last word is 5 characters
    # of the alphabet as a Job's pod (a fifth of real suffixes have no digit either)
    ("resnet-50", "resnet"),
    ("dump-pgsql", "dump"),
    (None, None),
]


def test_every_name_shape_in_one_frame():
    """The table, as a column of pod names (how `with_workload` reads them)."""
    pods = pl.DataFrame({"pod": [p for p, _ in CASES]}, schema={"pod": pl.String})
    got = pods.with_columns(pod_owner(pl.col("pod")).alias("workload"))
    assert got.rows() == CASES


@pytest.mark.parametrize(("pod", "owner"), CASES)
def test_pod_owner_name_shape(pod, owner):
    assert pl.select(pod_owner(pl.lit(pod, pl.String))).item() == owner


def _suffix(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(5))


def _template_hash(rng: random.Random) -> str:
    """A pod-template-hash: SafeEncodeString of the uint32's decimal digits (each digit's byte
    modulo the alphabet's length), for a hash of 10^7 or more."""
    return "".join(ALPHABET[ord(c) % len(ALPHABET)] for c in str(rng.randrange(10**7, 2**32)))


def _generated(prefix: str, rng: random.Random) -> str:
    """A name from generateName `prefix`: cut to 58 characters, then 5 random ones."""
    return prefix[:58] + _suffix(rng)


@pytest.mark.parametrize("length", [3, 20, 40, 46, 47, 48, 50, 55, 57])
def test_deployment_pods_made_as_kubernetes_makes_them(length):
    """Every pod of a Deployment whose name has `length` characters is the Deployment, whether
    generateName kept `<replicaset>-` whole (up to 46 characters with a 10-character hash) or
    cut it (its dash, the hash's end too, or the whole hash with its dash at 57)."""
    rng = random.Random(length)
    deployment = ("gpt-" + "x" * 60)[:length]
    pods = [
        _generated(f"{deployment}-{_template_hash(rng)}-", rng) for _ in range(200)
    ]  # fmt: skip
    got = pl.DataFrame({"pod": pods}).select(pod_owner(pl.col("pod")))["pod"]
    assert got.unique().to_list() == [deployment]


def test_indexed_job_pods_made_as_kubernetes_makes_them():
    """An Indexed Job's pods (`<job>-<index>-<5 random>`) and a CronJob's Indexed Job's are
    one workload each, whatever the index."""
    rng = random.Random(7)
    pods = [_generated(f"train-{i}-", rng) for i in range(40)]
    pods += [_generated(f"nightly-28458960-{i}-", rng) for i in range(40)]
    got = pl.DataFrame({"pod": pods}).select(pod_owner(pl.col("pod")))["pod"]
    assert got.to_list() == ["train"] * 40 + ["nightly"] * 40


def test_an_indexed_jobs_pods_are_one_workload_in_the_mart():
    """`with_workload` on a day's minutes: the four pods of an Indexed Job are one workload,
    the Deployment of a cut name its own."""
    rows = [
        {"gpu_uuid": f"GPU-{i}", "pod": f"train-{i}-{s}"}
        for i, s in enumerate(("x7k2p", "q9z4m", "bq7zd", "5xw2k"))
    ]
    rows.append({"gpu_uuid": "GPU-9", "pod": f"{MISTRAL}-7d9f8c6bx2kq9"})
    got = with_workload(minutes_frame(rows).lazy()).collect()
    assert got.group_by("workload").agg(pl.col("pod").n_unique()).sort("workload").rows() == [
        (MISTRAL, 1),
        ("train", 4),
    ]
