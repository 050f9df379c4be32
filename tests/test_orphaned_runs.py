"""A `gpu-pipeline materialize` killed mid-run left its run STARTED, and while it stood the
month's automation waited on it forever (a later day's month never caught up; adversarial
review). `orphaned_runs_sensor` marks such runs failed on its tick, as the next materialize does."""

import os
import socket

import dagster as dg
from helpers import dead_pid, started_run

from gpu_pipeline.defs.orphans import (
    HOST_TAG,
    NS_TAG,
    PID_TAG,
    START_TAG,
    _pid_ns,
    _started,
    orphaned_runs_sensor,
)


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
        dead = started_run(instance, j, {**me, PID_TAG: str(dead_pid())})
        alive = started_run(instance, j, {**me, PID_TAG: str(parent), START_TAG: _started(parent)})
        elsewhere = started_run(
            instance, j, {HOST_TAG: host + "-other", NS_TAG: ns, PID_TAG: "1234567"}
        )
        # a pid of another PID namespace (a daemon's container) means another process here
        other_ns = started_run(instance, j, {**me, NS_TAG: "pid:[1]", PID_TAG: str(dead_pid())})
        # the pid reused by a process started at another time: the run's own process is gone
        reused = started_run(instance, j, {**me, PID_TAG: str(parent), START_TAG: "1"})
        untagged = started_run(
            instance, j, {HOST_TAG: host, PID_TAG: str(dead_pid())}
        )  # an older run
        assert dead.status == dg.DagsterRunStatus.STARTED
        result = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "2 run(s) of a killed gpu-pipeline process marked failed" in str(result.skip_message)
        runs = (dead, alive, elsewhere, other_ns, reused, untagged)
        status = [instance.get_run_by_id(r.run_id).status for r in runs]
        failed, started = dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED
        assert status == [failed, started, started, started, failed, started]
        again = orphaned_runs_sensor(dg.build_sensor_context(instance=instance))
        assert "no run of a killed" in str(again.skip_message)
