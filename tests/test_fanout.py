"""A UI backfill fans out into several runs on a real `dagster dev` (loopback), at most two at
once (the run queue of config/dagster.yaml), and ends with the same tables as the CLI's one run.

`GPU_PIPELINE_BACKFILL_DAYS=2`: the 4-day backfill is two runs of two days for the ingest, the
staging pass and the one-day marts, then persistent_bottlenecks and daily_report, whose window
reads earlier days' gpu_daily, in runs of their own once those days are written.
"""

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from servers import dg_dev
from test_e2e_server import (
    LAUNCH,
    LOCATION,
    PARTITIONED,
    backfills,
    gql,
    log_tail,
    wait_for,
)

from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.io.lake import LINEAGE_KEY, Lake

REPO = Path(__file__).resolve().parents[1]
DAYS = [date(2026, 3, 2) + timedelta(days=i) for i in range(4)]
PER_RUN = 2
RUNS = """query($tags: [ExecutionTag!]) { runsOrError(filter: {tags: $tags}) {
  ... on Runs { results { runId status startTime endTime assetSelection { path }
  tags { key value } } } } }"""


@contextmanager
def dev_server(tmp: Path, per_run: int):
    """`dg dev` on loopback over the landing zone `tmp/raw` and the lake `tmp/lake`, with the
    shipped instance config (a run queue of two runs) and backfills of `per_run` days a run;
    yields its port, stopped at the end."""
    home = tmp / "dh"
    home.mkdir()
    instance = yaml.safe_load((REPO / "config" / "dagster.yaml").read_text())
    assert instance["run_queue"]["max_concurrent_runs"] == 2, instance  # what the test counts on
    # the shipped config, but a queue that looks every second rather than every 5 (the daemon's
    # 30 s between looks at a backfill is Dagster's own, not a setting: `dg_dev` shortens it)
    instance["run_queue"]["dequeue_interval_seconds"] = 1
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GPU_PIPELINE_RAW": str(tmp / "raw"),
        "GPU_PIPELINE_LAKE": str(tmp / "lake"),
        "GPU_PIPELINE_BACKFILL_DAYS": str(per_run),
    }
    with dg_dev(env, tmp / "dev.log") as port:
        yield port


@pytest.fixture()
def fanout_server(tmp_path):
    generate(tmp_path / "raw", DAYS[0], days=len(DAYS), gpus=6, clusters=2, seed=5)
    with dev_server(tmp_path, PER_RUN) as port:
        yield port, tmp_path


def cli_materialize(tmp: Path) -> Lake:
    """The same days as one in-process run of `gpu-pipeline materialize`, into another lake."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp / "cli_home")}
    env.pop("GPU_PIPELINE_BACKFILL_DAYS", None)
    args = ["materialize", "--start", str(DAYS[0]), "--end", str(DAYS[-1])]
    args += ["--raw", str(tmp / "raw"), "--lake", str(tmp / "cli_lake")]
    code = "from gpu_pipeline.cli import run; run()"
    p = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return Lake(tmp / "cli_lake")


def most_at_once(runs: list[dict]) -> int:
    """The most runs that were STARTED at one moment (from their start and end times)."""
    spans = [(r["startTime"], r["endTime"]) for r in runs]
    return max(sum(s <= t < e for s, e in spans) for t, _ in spans)


def compare_lakes(got: Lake, want: Lake) -> list[str]:
    """Every table's partition of every day equal as frames; returns the files whose bytes
    differ (none are expected: nothing run-specific is written, the lineage names the ingest
    by its content)."""
    differ = []
    # the days' tables: the backfill of days selects no month (tests/test_monthly.py has them)
    tables = sorted(
        p.name
        for p in Path(want.root).iterdir()
        if not p.name.startswith("_") and p.name != "namespace_monthly"
    )
    assert "persistent_bottlenecks" in tables and "gpu_minutes" in tables, tables
    for table in tables:
        assert want.days(table) == DAYS, (table, want.days(table))
        for d in DAYS:
            a, b = got.partition_file(table, d), want.partition_file(table, d)
            assert pl.read_parquet(a).equals(pl.read_parquet(b)), (table, d)
            meta = [pq.read_metadata(f).metadata.get(LINEAGE_KEY.encode()) for f in (a, b)]
            assert meta[0] == meta[1], (table, d, meta)  # the same ingest, by content
            if Path(a).read_bytes() != Path(b).read_bytes():
                differ.append(f"{table}/{d}")
    return differ


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def assets_of(run: dict) -> set[str]:
    return {a["path"][-1] for a in run["assetSelection"]}


def backfill_runs(port: int, days: list[date], log: Path) -> list[dict]:
    """Launch a backfill of every daily asset over `days` as the UI does, wait until it is
    done; its runs (all of them must have succeeded)."""

    def loaded():
        entries = gql(port, LOCATION)["workspaceOrError"]["locationEntries"]
        return entries and all(e["loadStatus"] == "LOADED" for e in entries) and entries

    wait_for(loaded, 180, "the code location to load", log)
    params = {
        "partitionNames": [d.isoformat() for d in days],
        "assetSelection": [{"path": [k]} for k in PARTITIONED],
    }
    out = gql(port, LAUNCH, {"p": params})["launchPartitionBackfill"]
    assert out["__typename"] == "LaunchBackfillSuccess", out

    def finished():
        (b,) = backfills(port)
        return b if b["status"] not in ("REQUESTED", "CANCELING") else None

    b = wait_for(finished, 300, "the backfill to finish", log)
    assert b["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), (b, log_tail(log))
    tags = [{"key": "dagster/backfill", "value": out["backfillId"]}]
    runs = gql(port, RUNS, {"tags": tags})["runsOrError"]["results"]
    assert runs and all(r["status"] == "SUCCESS" for r in runs), runs
    return sorted(runs, key=lambda r: r["startTime"])


def describe(runs: list[dict]) -> str:
    t0 = runs[0]["startTime"]
    return "\n".join(
        f"{r['startTime'] - t0:6.1f} .. {r['endTime'] - t0:6.1f} s  "
        f"{tags_of(r)['dagster/asset_partition_range_start']}.."
        f"{tags_of(r)['dagster/asset_partition_range_end']}  {sorted(assets_of(r))[:3]}"
        for r in runs
    )


def test_a_ui_backfill_fans_out_two_runs_at_a_time(fanout_server):
    port, tmp = fanout_server
    t = time.time()
    cli = cli_materialize(tmp)  # while the code location loads
    print(f"CLI's one run: {time.time() - t:.1f} s")
    runs = backfill_runs(port, DAYS, tmp / "dev.log")
    print(f"backfill done at {time.time() - t:.1f} s:\n{describe(runs)}")
    # ceil(4 / 2) runs of the ingest, staging and one-day marts, then the window assets' own
    # runs; never a run of more than two days (single-run: one run of the four days)
    base = [r for r in runs if "gpu_daily" in assets_of(r)]
    assert len(base) == 2 and len(runs) > 2, describe(runs)
    for r in runs:
        first, last = (
            date.fromisoformat(tags_of(r)[f"dagster/asset_partition_range_{k}"])
            for k in ("start", "end")
        )
        assert (last - first).days < PER_RUN, describe(runs)
    assert most_at_once(runs) == 2, describe(runs)  # side by side, never more than the queue's 2
    # a run of a window asset (persistent_bottlenecks, daily_report) for days ..E starts only
    # after the run that wrote gpu_daily and fleet_daily of every backfilled day up to E ended
    for r in runs:
        if assets_of(r) & {"persistent_bottlenecks", "daily_report"}:
            end = tags_of(r)["dagster/asset_partition_range_end"]
            for w in base:
                if tags_of(w)["dagster/asset_partition_range_start"] <= end:
                    assert r["startTime"] >= w["endTime"], describe(runs)
    differ = compare_lakes(Lake(tmp / "lake"), cli)
    assert differ == [], differ
