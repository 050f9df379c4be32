"""Benchmark inputs, generated in one vectorized pass: a fleet-hour of exposition, fleet-days of minutes."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import polars as pl

# (field, decimals, top of its range)
FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", 0, 100),
    ("DCGM_FI_DEV_POWER_USAGE", 3, 700),
    ("DCGM_FI_DEV_GPU_TEMP", 0, 90),
    ("DCGM_FI_DEV_MEMORY_TEMP", 0, 90),
    ("DCGM_FI_DEV_FB_USED", 0, 81920),
    ("DCGM_FI_DEV_SM_CLOCK", 0, 1980),
    ("DCGM_FI_PROF_SM_ACTIVE", 6, 1),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 6, 1),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 6, 1),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", 0, 8e9),
)
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A10G")
DAY = date(2024, 1, 1)


def exposition_hour(path: Path, gpus: int = 2000, interval_s: int = 30, seed: int = 1) -> int:
    """Write one hour of scrapes of `gpus` GPUs (ten fields, per-sample ms timestamps); returns lines."""
    rng = np.random.default_rng(seed)
    g = np.arange(gpus)
    labels = pl.DataFrame(
        {
            "g": g,
            "lab": [
                f'gpu="{i % 8}",UUID="GPU-{uuid.UUID(int=(int(rng.integers(0, 2**62)) << 64) | int(i))}",'
                f'pci_bus_id="00000000:{0x10 + i % 8:02X}:00.0",device="nvidia{i % 8}",modelName="{MODELS[i % 3]}",'
                f'Hostname="node-{i // 8:04d}",DCGM_FI_DRIVER_VERSION="535.129.03",container="main",'
                f'namespace="team-{i % 17}",pod="job-{i // 8:04d}-x"'
                for i in g
            ],
        }
    )
    t0 = int(datetime(DAY.year, DAY.month, DAY.day, 10, tzinfo=UTC).timestamp() * 1000)
    ts = pl.DataFrame(
        {"ts": t0 + np.arange(3600 // interval_s, dtype=np.int64) * interval_s * 1000}
    )
    fields = pl.DataFrame(
        {
            "f": [f for f, _, _ in FIELDS],
            "k": range(len(FIELDS)),
            "top": [float(t) for _, _, t in FIELDS],
            "dec": [d for _, d, _ in FIELDS],
        }
    )
    series = labels.join(fields, how="cross")
    frame = (
        ts.join(series, how="cross")
        .with_columns(
            (pl.Series("r", rng.random(ts.height * series.height)) * pl.col("top")).alias("v")
        )
        .with_columns(
            pl.when(pl.col("dec") == 0)
            .then(pl.col("v").round(0).cast(pl.Int64).cast(pl.String))
            .otherwise(pl.col("v").round(6).cast(pl.String))
            .alias("v")
        )
    )
    lines = (
        frame.sort("ts", "k", "g")
        .select(
            pl.concat_str(
                "f",
                pl.lit("{"),
                "lab",
                pl.lit("} "),
                "v",
                pl.lit(" "),
                pl.col("ts").cast(pl.String),
            )
        )
        .to_series()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines.to_list()) + "\n")
    return lines.len()


def gpu_minutes_day(gpus: int, seed: int = 2) -> pl.DataFrame:
    """One day of per-GPU-minute utilization and power, shaped like `gpu_samples` at 1/minute."""
    rng = np.random.default_rng(seed)
    n = gpus * 1440
    g = np.repeat(np.arange(gpus), 1440)
    minute = np.tile(np.arange(1440, dtype=np.int64), gpus)
    t0 = int(datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC).timestamp() * 1000)
    workload = rng.integers(0, 6, gpus)[g]
    util = np.clip(
        np.choose(workload, [95, 86, 82, 50, 2, 40]) + rng.normal(0, 6, n), 0, 100
    ).round()
    pif = np.clip(
        np.choose(workload, [0.78, 0.27, 0.45, 0.45, 0.12, 0.35]) + rng.normal(0, 0.06, n), 0.02, 1
    )
    tdp = np.array([700.0, 400.0, 300.0])[g % 3]
    return pl.DataFrame(
        {
            "date": pl.Series([DAY] * n, dtype=pl.Date),
            "timestamp": pl.Series(t0 + minute * 60_000, dtype=pl.Int64)
            .cast(pl.Datetime("ms"))
            .dt.replace_time_zone("UTC"),
            "gpu_uuid": pl.Series(np.char.add("GPU-", g.astype(str))),
            "gpu_instance_id": pl.Series([None] * n, dtype=pl.Int32),
            "hostname": pl.Series(np.char.add("node-", (g // 8).astype(str))),
            "cluster": pl.Series(np.char.add("c", (g % 3).astype(str))),
            "namespace": pl.Series(np.char.add("team-", (g % 17).astype(str))),
            "gpu_model": pl.Series(np.array([m.removeprefix("NVIDIA ") for m in MODELS])[g % 3]),
            "gpu_util_pct": util,
            "power_w": (pif * tdp).round(2),
        }
    )
