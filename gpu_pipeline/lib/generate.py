"""Deterministic synthetic fleet in the seed project's shape, written as dcgm-exporter scrapes.

Default: 50 GPUs, 3 clusters, 7 days, one scrape a minute, the seed workload mix (efficient
training 30 %, data-starved 20 %, network bottleneck 15 %, moderate 20 %, idle 10 %, bursty
inference 5 %). One file per host per day, `<out>/<cluster>/<host>_<YYYY-MM-DD>.prom`, each a
concatenation of scrapes with HELP/TYPE and per-sample millisecond timestamps. The same fleet can
be written as Prometheus `query_range` JSON (`prom-json`) or nvidia-smi CSV (`smi-csv`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

# (workload, share, namespace); shares from the seed project
WORKLOADS: tuple[tuple[str, float, str], ...] = (
    ("efficient_training", 0.30, "llm-pretrain"),
    ("data_starved", 0.20, "vision-train"),
    ("network_bottleneck", 0.15, "dist-finetune"),
    ("moderate", 0.20, "research"),
    ("idle", 0.10, "notebooks"),
    ("bursty_inference", 0.05, "inference"),
)
# each namespace's workloads as Kubernetes names their pods (the owner's kind and name):
# StatefulSet `name-<ordinal>`, Job `name-<5>`, CronJob `name-<minutes>-<5>`, Deployment
# `name-<10>-<5>` (generated parts in Kubernetes' alphabet), so the demo's workloads are what
# `workload_efficiency` finds; a namespace of two workloads puts each host's pod in one of them
POD_OWNERS: dict[str, tuple[tuple[str, str], ...]] = {
    "llm-pretrain": (("StatefulSet", "llama-pretrain-worker"),),
    "vision-train": (("Job", "resnet-train"),),
    "dist-finetune": (("StatefulSet", "finetune-worker"),),
    "research": (("Deployment", "sweep-runner"), ("CronJob", "eval-nightly")),
    "notebooks": (("Deployment", "jupyter-alice"), ("Deployment", "jupyter-bob")),
    "inference": (("Deployment", "vllm-server"),),
}
# the characters of the random parts of generated names (k8s.io/apimachinery's rand)
K8S_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# (cluster, modelName as dcgm-exporter reports it, max power W, GPUs per host)
CLUSTERS: tuple[tuple[str, str, float, int], ...] = (
    ("us-east-train", "NVIDIA A100-SXM4-40GB", 400.0, 8),
    ("us-west-train", "NVIDIA H100 80GB HBM3", 700.0, 8),
    ("eu-central-infer", "NVIDIA A10G", 300.0, 4),
)
# (DCGM field, HELP text, type, value format decimals)
METRICS: tuple[tuple[str, str, int], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 3),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 0),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", 6),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", 6),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", 6),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus, in bytes per second.",
        0,
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "The rate of data received over NVLink, in bytes per second.",
        0,
    ),
)


@dataclass(frozen=True)
class Gpu:
    cluster: str
    hostname: str
    index: int
    uuid: str
    model: str
    max_power_w: float
    workload: str
    namespace: str
    pod: str


def _apportion(n: int, shares: list[float]) -> list[int]:
    """Largest-remainder split of n by shares (exact total, deterministic)."""
    raw = [s * n for s in shares]
    counts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))[: n - sum(counts)]:
        counts[i] += 1
    return counts


def build_fleet(gpus: int = 50, clusters: int = 3, seed: int = 42) -> list[Gpu]:
    if gpus < 1 or not 1 <= clusters <= len(CLUSTERS):
        raise ValueError(f"need gpus >= 1 and 1 <= clusters <= {len(CLUSTERS)}")
    rnd = random.Random(seed)
    per_cluster = _apportion(gpus, [1 / clusters] * clusters)
    workloads = [
        w
        for (w, _, _), k in zip(
            WORKLOADS, _apportion(gpus, [s for _, s, _ in WORKLOADS]), strict=True
        )
        for _ in range(k)
    ]
    rnd.shuffle(workloads)
    ns = {w: n for w, _, n in WORKLOADS}
    ordinals: dict[tuple[str, str], int] = {}
    fleet: list[Gpu] = []
    for (cname, model, tdp, per_host), count in zip(CLUSTERS[:clusters], per_cluster, strict=False):
        for i in range(count):
            host = f"{cname}-node-{i // per_host:02d}"
            w = workloads[len(fleet)]
            # one pod per namespace per host: a multi-GPU job, as a scheduler would place it
            pod = _pod_name(ns[w], host, seed, ordinals)
            fleet.append(
                Gpu(
                    cname,
                    host,
                    i % per_host,
                    f"GPU-{uuid.UUID(int=rnd.getrandbits(128))}",
                    model,
                    tdp,
                    w,
                    ns[w],
                    pod,
                )
            )
    return fleet


def _k8s_chars(key: str, n: int) -> str:
    """`n` characters of Kubernetes' generated-name alphabet, fixed by `key`."""
    x, out = zlib.crc32(key.encode()) | (zlib.crc32(key[::-1].encode()) << 32), []
    for _ in range(n):
        x, r = divmod(x, len(K8S_ALPHABET))
        out.append(K8S_ALPHABET[r])
    return "".join(out)


def _pod_name(namespace: str, host: str, seed: int, ordinals: dict) -> str:
    """The pod of `namespace`'s workload on `host`, named as its owner kind names pods (one pod
    a host: a replica of a StatefulSet counts up, a Job's or Deployment's pod gets its own
    suffix; a Deployment's pods share their ReplicaSet's hash)."""
    owners = POD_OWNERS[namespace]
    kind, owner = owners[hashlib.sha256(f"{seed}/{host}".encode()).digest()[0] % len(owners)]
    if kind == "StatefulSet":
        k = ordinals.setdefault((owner, host), len([o for o in ordinals if o[0] == owner]))
        return f"{owner}-{k}"
    suffix = _k8s_chars(f"{seed}/{host}/{owner}", 5)
    if kind == "Job":
        return f"{owner}-{suffix}"
    if kind == "CronJob":  # the scheduled time in minutes since the epoch names the Job
        return f"{owner}-{28_458_960 + zlib.crc32(host.encode()) % 7 * 1440}-{suffix}"
    return f"{owner}-{_k8s_chars(f'{seed}/{owner}', 10)}-{suffix}"


def _signals(w: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Minute series of utilization (%), PIF and profiling ratios for one GPU-day of workload w."""

    def nrm(mu: float, sd: float) -> np.ndarray:
        return rng.normal(mu, sd, n)

    gb = 1e9
    if w == "efficient_training":
        util, pif, sm, tensor, dram = (
            nrm(95, 3),
            nrm(0.78, 0.06),
            nrm(0.85, 0.05),
            nrm(0.55, 0.08),
            nrm(0.40, 0.06),
        )
        pcie, nvlink = nrm(2 * gb, 0.4 * gb), nrm(3 * gb, 0.5 * gb)
    elif w == "data_starved":  # the host's loader bursts data over PCIe, the SMs wait
        util, pif, sm, tensor, dram = (
            nrm(86, 6),
            nrm(0.27, 0.05),
            nrm(0.22, 0.05),
            nrm(0.08, 0.03),
            nrm(0.12, 0.04),
        )
        pcie, nvlink = (
            np.where(rng.random(n) < 0.3, nrm(6 * gb, gb), nrm(0.3 * gb, 0.1 * gb)),
            nrm(0.5 * gb, 0.1 * gb),
        )
    elif w == "network_bottleneck":  # collectives keep NVLink busy while the SMs wait
        util, pif, sm, tensor, dram = (
            nrm(82, 6),
            nrm(0.47, 0.05),
            nrm(0.24, 0.05),
            nrm(0.18, 0.05),
            nrm(0.20, 0.05),
        )
        pcie, nvlink = nrm(0.5 * gb, 0.1 * gb), nrm(30 * gb, 5 * gb)
    elif w == "moderate":
        util, pif, sm, tensor, dram = (
            nrm(50, 12),
            nrm(0.45, 0.08),
            nrm(0.45, 0.08),
            nrm(0.25, 0.06),
            nrm(0.30, 0.06),
        )
        pcie, nvlink = nrm(1 * gb, 0.2 * gb), nrm(2 * gb, 0.4 * gb)
    elif w == "idle":
        util, pif = np.abs(nrm(0, 2)), nrm(0.12, 0.015)
        sm, tensor, dram = np.abs(nrm(0, 0.01)), np.zeros(n), np.abs(nrm(0, 0.01))
        pcie, nvlink = np.abs(nrm(0.001 * gb, 0.001 * gb)), np.zeros(n)
    else:  # bursty inference: a third of the minutes serve traffic
        busy = rng.random(n) < 0.33
        util = np.where(busy, nrm(78, 12), np.abs(nrm(4, 2)))
        pif = np.where(busy, nrm(0.55, 0.08), nrm(0.15, 0.02))
        sm = np.where(busy, nrm(0.6, 0.1), np.abs(nrm(0.03, 0.01)))
        tensor, dram = sm * 0.5, sm * 0.4
        pcie, nvlink = (
            np.where(busy, nrm(1.5 * gb, 0.3 * gb), np.abs(nrm(0.01 * gb, 0.01 * gb))),
            np.zeros(n),
        )
    clip01 = lambda a: np.clip(a, 0.0, 1.0)  # noqa: E731
    return {
        "util": np.clip(np.rint(util), 0, 100),
        "pif": np.clip(pif, 0.03, 1.0),
        "sm": clip01(sm),
        "tensor": clip01(tensor),
        "dram": clip01(dram),
        "pcie": np.rint(np.clip(pcie, 0, None)),
        "nvlink": np.rint(np.clip(nvlink, 0, None)),
    }


# the numbers of a generated day depend on the seed and on the day's place in the run (its index
# from `start`), never on its date: the demo's week prints the same figures whatever week it is
# generated for. Day k draws what the day EPOCH + k drew when days were keyed by their date, so a
# run starting on EPOCH writes the bytes earlier releases wrote.
EPOCH = date(2024, 1, 1)


def _host_day_frame(gpus: list[Gpu], day: date, seed: int, index: int) -> pl.DataFrame:
    """One row per GPU per scrape: ts (epoch ms), g (index into `gpus`), one column per metric.
    `index`: the day's place in the run (0 for its first day) keys its random draws."""
    n = 24 * 60
    t0 = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
    key = EPOCH.toordinal() + index
    rng = np.random.default_rng([seed, key, zlib.crc32(gpus[0].hostname.encode())])
    # scrapes land a little after each minute starts, as a real scrape loop does
    ts = t0 + np.arange(n, dtype=np.int64) * 60_000 + rng.integers(0, 3000, n)
    frames = []
    for k, g in enumerate(gpus):
        s = _signals(g.workload, n, rng)
        temp = np.rint(30 + 50 * s["pif"] + rng.normal(0, 1.5, n))
        fb = np.rint(np.where(s["util"] > 10, 0.6, 0.02) * 40960 + rng.normal(0, 200, n)).clip(0)
        values = [
            s["util"],
            s["pif"] * g.max_power_w,
            temp,
            fb,
            s["sm"],
            s["tensor"],
            s["dram"],
            s["pcie"],
            s["nvlink"],
        ]
        frames.append(
            pl.DataFrame(
                {"ts": ts, "g": np.full(n, k, np.int16)}
                | {
                    name: np.round(v, dec)
                    for (name, _, dec), v in zip(METRICS, values, strict=True)
                }
            )
        )
    return pl.concat(frames).sort("ts", "g")


def _value_str(name: str, dec: int) -> pl.Expr:
    return pl.col(name).cast(pl.Int64).cast(pl.String) if dec == 0 else pl.col(name).cast(pl.String)


def _labels(g: Gpu) -> dict[str, str]:
    return {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "pci_bus_id": f"00000000:{0x10 + g.index:02X}:00.0",
        "device": f"nvidia{g.index}",
        "modelName": g.model,
        "Hostname": g.hostname,
        "DCGM_FI_DRIVER_VERSION": "535.129.03",
        "container": "main",
        "namespace": g.namespace,
        "pod": g.pod,
    }


def _to_exposition(frame: pl.DataFrame, gpus: list[Gpu]) -> str:
    """Concatenated scrapes: per scrape, each family's HELP/TYPE then one sample per GPU."""
    labels = pl.DataFrame(
        {
            "g": np.arange(len(gpus), dtype=np.int16),
            "lab": [",".join(f'{k}="{v}"' for k, v in _labels(g).items()) for g in gpus],
        }
    )
    f = frame.join(labels, on="g", how="left")
    parts = []
    for k, (name, _, dec) in enumerate(METRICS):
        parts.append(
            f.select(
                "ts",
                pl.lit(k, pl.Int8).alias("k"),
                (pl.col("g").cast(pl.Int32) + 1).alias("o"),
                pl.concat_str(
                    pl.lit(name + "{"),
                    "lab",
                    pl.lit("} "),
                    _value_str(name, dec),
                    pl.lit(" "),
                    pl.col("ts").cast(pl.String),
                ).alias("line"),
            )
        )
    headers = (
        pl.DataFrame(
            {
                "k": np.arange(len(METRICS), dtype=np.int8),
                "line": [f"# HELP {m} {h}\n# TYPE {m} gauge" for m, h, _ in METRICS],
            }
        )
        .join(frame.select("ts").unique(), how="cross")
        .with_columns(pl.lit(0, pl.Int32).alias("o"))
    )
    out = pl.concat([headers.select("ts", "k", "o", "line"), *parts]).sort("ts", "k", "o")
    return "\n".join(out.get_column("line").to_list()) + "\n"


def _to_prom_json(frame: pl.DataFrame, gpus: list[Gpu]) -> str:
    """A Prometheus `query_range` (matrix) response holding every metric of every GPU."""
    result = []
    for k, g in enumerate(gpus):
        sub = frame.filter(pl.col("g") == k)
        ts = (sub["ts"] / 1000.0).to_list()
        for name, _, dec in METRICS:
            vals = sub.select(_value_str(name, dec)).to_series().to_list()
            result.append(
                {
                    "metric": {"__name__": name, **_labels(g), "job": "dcgm-exporter"},
                    "values": [[t, v] for t, v in zip(ts, vals, strict=True)],
                }
            )
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


SMI_HEADER = (
    "timestamp, uuid, index, name, utilization.gpu [%], power.draw [W], temperature.gpu, "
    "memory.used [MiB]"
)


def _to_smi_csv(frame: pl.DataFrame, gpus: list[Gpu]) -> str:
    """`nvidia-smi --query-gpu=timestamp,uuid,index,name,utilization.gpu,power.draw,… --format=csv`."""
    meta = pl.DataFrame(
        {
            "g": np.arange(len(gpus), dtype=np.int16),
            "uuid": [g.uuid for g in gpus],
            "idx": [str(g.index) for g in gpus],
            "name": [g.model for g in gpus],
        }
    )
    f = frame.join(meta, on="g", how="left").sort("ts", "g")
    lines = (
        f.select(
            pl.concat_str(
                pl.from_epoch("ts", time_unit="ms").dt.strftime("%Y/%m/%d %H:%M:%S%.3f"),
                pl.lit(", "),
                "uuid",
                pl.lit(", "),
                "idx",
                pl.lit(", "),
                "name",
                pl.lit(", "),
                _value_str("DCGM_FI_DEV_GPU_UTIL", 0),
                pl.lit(" %, "),
                pl.col("DCGM_FI_DEV_POWER_USAGE").cast(pl.String),
                pl.lit(" W, "),
                _value_str("DCGM_FI_DEV_GPU_TEMP", 0),
                pl.lit(", "),
                _value_str("DCGM_FI_DEV_FB_USED", 0),
                pl.lit(" MiB"),
            )
        )
        .to_series()
        .to_list()
    )
    return SMI_HEADER + "\n" + "\n".join(lines) + "\n"


# --format -> (file suffix, writer, gzip?)
WRITERS = {
    "prom": (".prom", _to_exposition, False),
    "prom.gz": (".prom.gz", _to_exposition, True),
    "prom-json": (".json", _to_prom_json, False),
    "smi-csv": (".csv", _to_smi_csv, False),
}


def generate(
    out_dir: str | Path,
    start: date,
    days: int = 7,
    gpus: int = 50,
    clusters: int = 3,
    seed: int = 42,
    fmt: str = "prom",
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write the fleet's scrape archive; returns the files written (same inputs, same bytes).
    The values depend on the seed and each day's place from `start`, not on the dates: the same
    fleet generated for another week differs only in its timestamps and file names."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(WRITERS)}")
    suffix, writer, gz = WRITERS[fmt]
    fleet = build_fleet(gpus, clusters, seed)
    hosts: dict[tuple[str, str], list[Gpu]] = {}
    for g in fleet:
        hosts.setdefault((g.cluster, g.hostname), []).append(g)
    written = []
    for d in range(days):
        day = start + timedelta(days=d)
        for (cluster, host), members in sorted(hosts.items()):
            path = Path(out_dir) / cluster / f"{host}_{day.isoformat()}{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = writer(_host_day_frame(members, day, seed, d), members).encode()
            path.write_bytes(gzip.compress(data, 1, mtime=0) if gz else data)
            written.append(path)
        if progress:
            progress(f"generated {day.isoformat()}: {len(hosts)} hosts, {len(fleet)} GPUs")
    return written
