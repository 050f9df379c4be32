"""A `gpu-pipeline materialize` killed mid-run left its run STARTED, and while it stood the
month's automation waited on it forever (a later day's month never caught up; adversarial
review). `orphaned_runs_sensor` marks such runs failed on its tick, as the next materialize does."""

import os
import socket
import subprocess
import sys

import dagster as dg

from gpu_pipeline.defs.orphans import (
    HOST_TAG,
    NS_TAG,
    PID_TAG,
    START_TAG,
    _pid_ns,
    _started,
    orphaned_runs_sensor,
)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _run(instance, job, tags) -> dg.DagsterRun:
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


def test_a_run_of_a_killed_process_is_marked_failed_by_the_sensor():
    @dg.op
    def noop():
        pass

    @dg.job
    def j():
        noop()

    host = socket.gethostname()
    with dg.DagsterInstance.ephemeral() as instance:
        ns, parent = _pid_ns(), os.getppid()
        me = {HOST_TAG: host, NS_TAG: ns}
        dead = _run(instance, j, {**me, PID_TAG: str(_dead_pid())})
        alive = _run(instance, j, {**me, PID_TAG: str(parent), START_TAG: _started(parent)})
        elsewhere = _run(instance, j, {HOST_TAG: host + "-other", NS_TAG: ns, PID_TAG: "1234567"})
        # a pid of another PID namespace (a daemon's container) means another process here
        other_ns = _run(instance, j, {**me, NS_TAG: "pid:[1]", PID_TAG: str(_dead_pid())})
        # the pid reused by a process started at another time: the run's own process is gone
        reused = _run(instance, j, {**me, PID_TAG: str(parent), START_TAG: "1"})
        untagged = _run(instance, j, {HOST_TAG: host, PID_TAG: str(_dead_pid())})  # an older run
        assert dead.status == dg.DagsterRunStatus.STARTED
        result = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "2 run(s) of a killed gpu-pipeline process marked failed" in str(result.skip_message)
        runs = (dead, alive, elsewhere, other_ns, reused, untagged)
        status = [instance.get_run_by_id(r.run_id).status for r in runs]
        failed, started = dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED
        assert status == [failed, started, started, started, failed, started]
        again = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "no run of a killed" in str(again.skip_message)
