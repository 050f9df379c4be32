"""A `gpu-pipeline materialize` killed mid-run left its run STARTED, and while it stood the
month's automation waited on it forever (a later day's month never caught up; adversarial
review). `orphaned_runs_sensor` marks such runs failed on its tick, as the next materialize does."""

import os
import socket
import subprocess
import sys

import dagster as dg

from gpu_pipeline.defs.orphans import HOST_TAG, PID_TAG, orphaned_runs_sensor


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _started(instance, job, tags) -> dg.DagsterRun:
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
        dead = _started(instance, j, {HOST_TAG: host, PID_TAG: str(_dead_pid())})
        alive = _started(instance, j, {HOST_TAG: host, PID_TAG: str(os.getppid())})
        elsewhere = _started(instance, j, {HOST_TAG: host + "-other", PID_TAG: "1234567"})
        assert dead.status == dg.DagsterRunStatus.STARTED
        result = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "1 run(s) of a killed gpu-pipeline process marked failed" in str(result.skip_message)
        status = [instance.get_run_by_id(r.run_id).status for r in (dead, alive, elsewhere)]
        assert status == [
            dg.DagsterRunStatus.FAILURE,
            dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.STARTED,
        ]
        again = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "no run of a killed" in str(again.skip_message)
