"""Runs `gpu-pipeline materialize` left STARTED when its process died (kill -9, out of memory, a
laptop closed): no daemon watches a run executed in its own process, and Dagster keeps it
STARTED. Such a run blocks what waits for runs in progress: `monthly_automation_sensor` never
brings a later day's month up to date while it stands (adversarial review). They are marked
failed by the next `materialize` and, with the daemon running, by `orphaned_runs_sensor`."""

import os
import socket
from collections.abc import Callable

import dagster as dg

# who started a CLI run: the host and process, set on every run `materialize` makes
HOST_TAG, PID_TAG = "gpu_pipeline/host", "gpu_pipeline/pid"


def who_runs() -> dict[str, str]:
    """The tags naming this process as the runner of a run."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def fail_orphaned_runs(instance: dg.DagsterInstance, say: Callable[[str], None]) -> int:
    """Runs this host's `materialize` started whose process is gone stay STARTED forever: mark
    them failed, saying why. How many were."""
    # NOT_STARTED too: a process killed between creating its run and starting it
    started = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[
                dg.DagsterRunStatus.NOT_STARTED,
                dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED,
            ],
            tags={HOST_TAG: socket.gethostname()},
        )
    )
    n = 0
    for run in started:
        pid = int(run.tags.get(PID_TAG, "0") or 0)
        if pid <= 0 or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            instance.report_run_failed(
                run, f"the gpu-pipeline process {pid} running it ended before it finished"
            )
            say(
                f"note: run {run.run_id[:8]} was left unfinished by a killed process: marked failed"
            )
            n += 1
        except PermissionError:
            pass  # alive, another user's
    return n


@dg.sensor(
    name="orphaned_runs_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def orphaned_runs_sensor(context: dg.SensorEvaluationContext):
    """Marks failed the runs of `gpu-pipeline materialize` on this host whose process is gone,
    so a killed command does not leave the month's automation waiting on it forever."""
    n = fail_orphaned_runs(context.instance, context.log.info)
    return dg.SkipReason(
        f"{n} run(s) of a killed gpu-pipeline process marked failed"
        if n
        else "no run of a killed gpu-pipeline process"
    )
