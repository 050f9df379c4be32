"""`gpu-pipeline materialize` honours GPU_PIPELINE_EXECUTOR: `multiprocess` runs each step in a
process of its own and writes the same lake as a run in one process; `k8s` says that the CLI
runs the steps in its own process, and does."""

from pathlib import Path

import polars as pl
from helpers import cli, cli_env, materialize_args

DAY = "2024-01-01"


def step_pids(home: Path) -> tuple[list[int], int]:
    """The pids of the run's STEP_START events, and the pid of the CLI process that ran it."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="daily_pipeline"))
        starts = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.STEP_START
        ).records
        pids = [r.event_log_entry.dagster_event.pid for r in starts]
        return pids, int(run.tags["gpu_pipeline/pid"])


def lake_files(lake: Path) -> dict[str, Path]:
    return {
        str(f.relative_to(lake)): f
        for f in lake.glob("*/date=*/*.parquet")
        if not f.parts[len(lake.parts)].startswith("_")
    }


def test_multiprocess_runs_steps_apart_and_writes_the_same_lake(tmp_path):
    base = cli_env(tmp_path)
    raw = tmp_path / "raw"
    cli("generate", "--start", DAY, "--days", "1", "--gpus", "3", "--clusters", "1",
        "--out", str(raw), env=base)  # fmt: skip
    lakes, pids = {}, {}
    for kind in ("k8s", "multiprocess"):
        env = {**base, "GPU_PIPELINE_EXECUTOR": kind, "DAGSTER_HOME": str(tmp_path / kind)}
        lakes[kind] = tmp_path / f"lake_{kind}"
        out = cli(*materialize_args(DAY, raw, lakes[kind]), env=env).stdout
        assert " ok " in out, out
        says_k8s = "GPU_PIPELINE_EXECUTOR=k8s: gpu-pipeline materialize runs the steps in this"
        assert (says_k8s in out) == (kind == "k8s"), out
        assert "staging done" in out  # the progress lines, either way
        pids[kind] = step_pids(tmp_path / kind)
    steps, cli_pid = pids["k8s"]
    assert len(steps) >= 9 and set(steps) == {cli_pid}  # every step in the CLI's process
    steps, cli_pid = pids["multiprocess"]
    assert len(steps) >= 9 and cli_pid not in steps
    assert len(set(steps)) == len(steps)  # a process per step
    one, apart = lake_files(lakes["k8s"]), lake_files(lakes["multiprocess"])
    assert len(one) >= 12 and one.keys() == apart.keys()
    for name, f in one.items():
        assert pl.read_parquet(f).equals(pl.read_parquet(apart[name])), name
