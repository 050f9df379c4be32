"""Runs `gpu-pipeline materialize` left STARTED when its process died (kill -9, out of memory, a
laptop closed): no daemon watches a run executed in its own process, and Dagster keeps it
STARTED. Such a run blocks what waits for runs in progress: `monthly_automation_sensor` never
brings a later day's month up to date while it stands (adversarial review). They are marked
failed by the next `materialize` and, with the daemon running, by `orphaned_runs_sensor`."""

import os
import socket
from collections.abc import Callable

import dagster as dg

# who started a CLI run: the host and process (its PID namespace and start time, so a pid seen
# from another namespace, or reused, is not taken for it), set on every run `materialize` makes
HOST_TAG, PID_TAG = "gpu_pipeline/host", "gpu_pipeline/pid"
NS_TAG, START_TAG = "gpu_pipeline/pid_ns", "gpu_pipeline/pid_started"


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _started(pid: int) -> str:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or ""."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def who_runs() -> dict[str, str]:
    """The tags naming this process as the runner of a run."""
    pid = os.getpid()
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(pid),
        NS_TAG: _pid_ns(),
        START_TAG: _started(pid),
    }


def _gone(pid: int, started: str | None) -> bool:
    """Has the process that ran a run ended: no such pid, or one started at another time (the
    pid reused)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    now = _started(pid)
    return bool(started and now and now != started)


def fail_orphaned_runs(
    instance: dg.DagsterInstance, say: Callable[[str], None], sure: bool = False
) -> int:
    """Runs this host's `materialize` started whose process is gone stay STARTED forever: mark
    them failed, saying why. How many were. A run started in another PID namespace (a daemon's
    container, the host) is not judged: its pid means another process here. With `sure`, nor is
    a run that does not name its namespace (written before it was recorded)."""
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
    n, ns = 0, _pid_ns()
    for run in started:
        pid = int(run.tags.get(PID_TAG, "0") or 0)
        their_ns = run.tags.get(NS_TAG)
        if pid <= 0 or pid == os.getpid() or (their_ns is None and sure):
            continue
        if their_ns is not None and their_ns != ns:
            continue
        if _gone(pid, run.tags.get(START_TAG)):
            instance.report_run_failed(
                run, f"the gpu-pipeline process {pid} running it ended before it finished"
            )
            say(
                f"note: run {run.run_id[:8]} was left unfinished by a killed process: marked failed"
            )
            n += 1
    return n


@dg.sensor(
    name="orphaned_runs_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def orphaned_runs_sensor(context: dg.SensorEvaluationContext):
    """Marks failed the runs of `gpu-pipeline materialize` on this host whose process is gone,
    so a killed command does not leave the month's automation waiting on it forever."""
    n = fail_orphaned_runs(context.instance, context.log.info, sure=True)
    return dg.SkipReason(
        f"{n} run(s) of a killed gpu-pipeline process marked failed"
        if n
        else "no run of a killed gpu-pipeline process"
    )
