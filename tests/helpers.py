"""Test helpers: write planted dcgm-exporter exposition and build tiny frames by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA

MODELS = {"A100": "NVIDIA A100-SXM4-40GB", "H100": "NVIDIA H100 80GB HBM3", "A10G": "NVIDIA A10G"}


def ms(day: date, minute: int, second: int = 5) -> int:
    t = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(
        minutes=minute, seconds=second
    )
    return int(t.timestamp() * 1000)


def expo_lines(
    uuid: str,
    model: str,
    host: str,
    namespace: str | None,
    day: date,
    minutes: range | list[int],
    util: float,
    power: float,
    gpu: int = 0,
) -> list[str]:
    """One GPU_UTIL and one POWER_USAGE sample per minute (dcgm-exporter label set)."""
    pod = f',namespace="{namespace}",pod="{namespace}-pod-{gpu}"' if namespace else ""
    labels = f'{{gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="{model}",Hostname="{host}"{pod}}}'
    out = []
    for m in minutes:
        t = ms(day, m)
        out.append(f"DCGM_FI_DEV_GPU_UTIL{labels} {util:g} {t}")
        out.append(f"DCGM_FI_DEV_POWER_USAGE{labels} {power:.3f} {t}")
    return out


def mig_instance_lines(day: date, minutes, model: str, gpu: str = "0") -> list[str]:
    """One GPU (`GPU-mig`, host `h`) split into three 2g.20gb instances (GPU_I_ID 3, 5, 6;
    namespaces a, b, c) each busy 0.9 (`prof_gr_engine_active`); its power (200 W) repeated on
    every instance, as dcgm-exporter writes device-level fields."""
    out = []
    for m in minutes:
        t = ms(day, m)
        for gi, ns in ((3, "a"), (5, "b"), (6, "c")):
            lab = (
                f'gpu="{gpu}",UUID="GPU-mig",modelName="{model}",Hostname="h",'
                f'GPU_I_PROFILE="2g.20gb",GPU_I_ID="{gi}",namespace="{ns}",pod="{ns}-0"'
            )
            out.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} 200 {t}")
            out.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{lab}}} 0.9 {t}")
    return out


def write_file(path: Path, lines: list[str], header: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    path.write_text("\n".join((head if header else []) + lines) + "\n")
    return path


def landed(tmp_path: Path, name: str, data: bytes, mtime: float) -> Path:
    """`data` landed as `<tmp_path>/raw/<name>`, modified at `mtime` (when it was copied in)."""
    p = tmp_path / "raw" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, (mtime, mtime))
    return p


def minutes_frame(rows: list[dict]) -> pl.DataFrame:
    """A gpu_minutes frame from partial rows (missing columns null, defaults for keys)."""
    base = {
        "date": date(2024, 1, 1),
        "minute": datetime(2024, 1, 1, tzinfo=UTC),
        "gpu_uuid": "GPU-a",
        "cluster": "c1",
        "namespace": "ns",
        "gpu_model": "A100-SXM4-40GB",
    }
    return conform(pl.DataFrame([{**base, **r} for r in rows]), GPU_MINUTES_SCHEMA)


def cli(*args, env, check=True) -> subprocess.CompletedProcess:
    """`gpu-pipeline ARGS` in a fresh process, as a user runs it."""
    p = subprocess.run(
        [sys.executable, "-m", "gpu_pipeline.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def cli_env(tmp_path: Path) -> dict:
    """The environment of a user with their own Dagster instance and no GPU_PIPELINE_* set."""
    import os

    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh")}
    for k in list(env):
        if k.startswith("GPU_PIPELINE_"):
            env.pop(k)
    return env


def materialize_args(day, raw: Path, lake: Path) -> list[str]:
    return ["materialize", "--start", str(day), "--raw", str(raw), "--lake", str(lake)]


def start_materialize(day, raw: Path, lake: Path, env: dict) -> subprocess.Popen:
    """`gpu-pipeline materialize` of one day, running in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_pipeline.cli", *materialize_args(day, raw, lake)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@dataclass
class DayIngest:
    gpu_samples: pl.DataFrame
    quarantine: pl.DataFrame
    ingest_log: pl.DataFrame


def assemble_day(files: list, day: date, max_rows: int | None = None) -> DayIngest:
    """The whole day at once: the chunks of `DayAssembly` put together, with the day's
    quarantine and ingest_log (what the ingest step writes)."""
    from gpu_pipeline.lib.ingest.gpu_samples import DayAssembly

    a = DayAssembly(files, day, max_rows)
    samples = pl.concat(list(a.gpu_samples()))
    quarantine = a.quarantine()
    return DayIngest(
        gpu_samples=samples, quarantine=quarantine, ingest_log=a.ingest_log(quarantine)
    )


@contextmanager
def moto_s3(monkeypatch, bucket: str) -> Iterator[str]:
    """An S3-compatible server (moto) on loopback for one test, the AWS_* variables pointing at
    it, `bucket` created; yields its endpoint URL and stops the server."""
    from moto import server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for k, v in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            monkeypatch.setenv(k, v)
        import boto3

        boto3.client("s3").create_bucket(Bucket=bucket)
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def dead_pid() -> int:
    """The pid of a process that has ended (for runs whose runner is gone)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def started_run(instance, job, tags: dict):
    """A run of `job` recorded as STARTED in `instance` with `tags` (as a killed runner left it)."""
    import dagster as dg

    run = instance.create_run_for_job(job, tags=tags)
    instance.handle_new_event(
        dg.EventLogEntry(
            error_info=None,
            level="debug",
            user_message="",
            run_id=run.run_id,
            timestamp=0.0,
            dagster_event=dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=job.name),
        )
    )
    return instance.get_run_by_id(run.run_id)


def api_answer(t: float) -> dict:
    """A Prometheus `query` answer: GPU-0 at 40 %, GPU-1 at 41 % utilization at time t."""
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_GPU_UTIL",
                        "UUID": f"GPU-{g}",
                        "Hostname": "n1",
                    },
                    "value": [t, str(40 + g)],
                }
                for g in (0, 1)
            ],
        },
    }


def two_made_days(tmp: Path) -> tuple[Path, dict]:
    """2024-01-01..02 of 4 GPUs generated into `tmp`/raw and materialized into `tmp`/lake by the
    CLI: (tmp, its environment)."""
    env = cli_env(tmp)
    cli("generate", "--start", "2024-01-01", "--days", "2", "--gpus", "4", "--clusters", "1",
        "--out", str(tmp / "raw"), env=env)  # fmt: skip
    cli("materialize", "--start", "2024-01-01", "--end", "2024-01-02", "--raw", str(tmp / "raw"),
        "--lake", str(tmp / "lake"), env=env)  # fmt: skip
    return tmp, env


def assembled_day(raw: Path, cache: Path, day: date, max_rows: int | None = None, general=False):
    """`day` of the landing zone `raw` as a run assembles it (parsed into `cache`); `general`:
    each file's samples read as the general way reads them (not keyed)."""
    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing

    files = [load_or_parse(f, cache) for f in list_landing(raw)]
    if general:
        for pf in files:
            pf.samples = pf.samples.collect().lazy()
    return assemble_day(files, day, max_rows)
