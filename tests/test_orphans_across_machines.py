"""Runs of `gpu-pipeline materialize` on machines sharing one Dagster instance (Postgres).

(a) A run whose CLI process on another host was SIGKILLed stayed STARTED forever: only runs of
this host were looked at (review). Its process refreshes a heartbeat tag while it runs; a run
whose heartbeat is older than STALE_SECONDS is marked failed from any machine, naming the host
and the heartbeat's age. (b) Two machines with one hostname (cloned images) both read the
initial PID namespace's constant inode, so B took A's live run's pid for one of its own, found
it gone and marked the run failed (A then recorded its success on a failed run). A run names
its machine and boot; its pid is judged only on that machine, boot and PID namespace."""

import os
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from helpers import dead_pid, started_run

from gpu_pipeline.defs import orphans
from gpu_pipeline.defs.orphans import (
    HOST_TAG,
    NS_TAG,
    PID_TAG,
    START_TAG,
    fail_orphaned_runs,
    who_runs,
)

BEAT_TAG = getattr(orphans, "BEAT_TAG", "gpu_pipeline/heartbeat")
MACHINE_TAG = getattr(orphans, "MACHINE_TAG", "gpu_pipeline/machine")
FAILED, STARTED = dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED


@dg.op
def noop():
    pass


@dg.job
def j():
    noop()


NOW = datetime(2026, 11, 28, 9, 0, 0, tzinfo=UTC)


def _ago(seconds: float, now: datetime | None = None) -> str:
    t = (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    return t.isoformat(timespec="seconds")


def _status(instance, run) -> dg.DagsterRunStatus:
    return instance.get_run_by_id(run.run_id).status


def test_a_killed_run_of_another_host_is_failed_once_its_heartbeat_is_old(monkeypatch):
    """What orphaned_runs_sensor does on the daemon's machine, for a CLI run on ops-laptop."""
    monkeypatch.setattr(orphans, "_utcnow", lambda: NOW, raising=False)
    with dg.DagsterInstance.ephemeral() as instance:
        laptop = {HOST_TAG: "ops-laptop", PID_TAG: "4242", NS_TAG: "pid:[4026531836]",
                  START_TAG: "123", MACHINE_TAG: "laptop-machine-id/laptop-boot-id"}  # fmt: skip
        killed = started_run(instance, j, {**laptop, BEAT_TAG: _ago(7 * 60 + 12, NOW)})
        alive = started_run(instance, j, {**laptop, PID_TAG: "4243", BEAT_TAG: _ago(40, NOW)})
        older = started_run(instance, j, {k: v for k, v in laptop.items() if k != MACHINE_TAG})
        said: list[str] = []
        assert fail_orphaned_runs(instance, said.append, sure=True) == 1
        assert [_status(instance, r) for r in (killed, alive, older)] == [FAILED, STARTED, STARTED]
        assert said == [
            f"note: run {killed.run_id[:8]} of gpu-pipeline process 4242 on ops-laptop sent no "
            "heartbeat for 7 min 12 s: marked failed"
        ]
        failure = instance.get_records_for_run(
            killed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
        ).records[0]
        assert failure.event_log_entry.dagster_event.message == (
            "no heartbeat from the gpu-pipeline process 4242 on ops-laptop for 7 min 12 s (it was "
            "killed, or its machine stopped or lost the instance's database)"
        )


def test_a_clone_with_the_same_hostname_does_not_judge_another_machines_pid():
    """Machine A (this hostname, the initial PID namespace, a pid that is dead here) is live:
    its heartbeat is fresh. B must not mark its run failed; this machine's own killed run is."""
    with dg.DagsterInstance.ephemeral() as instance:
        me, dead = who_runs(), str(dead_pid())
        clone = started_run(instance, j, {**me, PID_TAG: dead, START_TAG: "77",
                                MACHINE_TAG: "other-machine/other-boot", BEAT_TAG: _ago(5)})  # fmt: skip
        mine = started_run(instance, j, {**me, PID_TAG: dead, START_TAG: "77", BEAT_TAG: _ago(5)})
        said: list[str] = []
        assert fail_orphaned_runs(instance, said.append, sure=True) == 1
        assert [_status(instance, r) for r in (clone, mine)] == [STARTED, FAILED]
        assert said == [
            f"note: run {mine.run_id[:8]} was left unfinished by a killed process: marked failed"
        ]
        with open("/etc/machine-id") as m, open("/proc/sys/kernel/random/boot_id") as b:
            assert me[MACHINE_TAG] == f"{m.read().strip()}/{b.read().strip()}"


def test_the_heartbeat_keeps_this_process_runs_fresh(monkeypatch):
    with dg.DagsterInstance.ephemeral() as instance:
        assert BEAT_TAG not in who_runs()  # no heartbeat running: an earlier version's tags
        with orphans.heartbeat(instance, every=0.2):
            tags = who_runs()
            run = started_run(
                instance, j, {**tags, BEAT_TAG: _ago(3600)}
            )  # as if its beat were old
            other = started_run(
                instance, j, {**tags, PID_TAG: str(os.getpid() + 1), BEAT_TAG: _ago(3600)}
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                beat = instance.get_run_by_id(run.run_id).tags[BEAT_TAG]
                if datetime.fromisoformat(beat) > datetime.now(UTC) - timedelta(seconds=60):
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the heartbeat did not refresh the run's tag")
        assert datetime.fromisoformat(tags[BEAT_TAG]) > datetime.now(UTC) - timedelta(seconds=60)
        # another process's run (another pid) is not this process's to refresh
        assert instance.get_run_by_id(other.run_id).tags[BEAT_TAG] == other.tags[BEAT_TAG]
        assert BEAT_TAG not in who_runs()
        # from another machine: this process's run is alive, the other one's heartbeat is old
        monkeypatch.setattr(orphans, "machine_id", lambda: "another/machine")
        assert fail_orphaned_runs(instance, lambda _: None) == 1
        assert [_status(instance, r) for r in (run, other)] == [STARTED, FAILED]


def test_a_killed_materialize_is_failed_from_another_machine_by_its_heartbeat(
    tmp_path, monkeypatch
):
    """End to end: `materialize`'s run carries the heartbeat; SIGKILLed, it is left STARTED, and
    another machine marks it failed once the heartbeat is STALE_SECONDS old, not before."""
    import signal
    from datetime import date

    from helpers import (
        MODELS,
        cli_env,
        expo_lines,
        start_materialize,
        write_file,
    )

    from gpu_pipeline.runs import init_instance

    day = date(2024, 1, 1)
    lines = expo_lines("GPU-S", MODELS["A100"], "n1", "team", day, range(0, 1440), 85, 100.0)
    write_file(tmp_path / "raw" / "c1" / f"n1_{day}.prom", lines)
    env = cli_env(tmp_path)
    # the instance made before the command starts: opened by this process while the command
    # creates its databases, both would migrate them
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    init_instance()
    proc = start_materialize(day, tmp_path / "raw", tmp_path / "lake", env)
    run = None
    try:
        deadline = time.monotonic() + 120
        while run is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
                runs = instance.get_runs(filters=dg.RunsFilter(statuses=[STARTED]))
                run = next((r for r in runs if BEAT_TAG in r.tags), None)
        assert run is not None, proc.communicate()[0] if proc.poll() is not None else "no run"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert run.tags[PID_TAG] == str(proc.pid) and run.tags[MACHINE_TAG] == orphans.machine_id()
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
        run = instance.get_run_by_id(run.run_id)  # its last heartbeat, before the kill
    beat = datetime.fromisoformat(run.tags[BEAT_TAG])
    monkeypatch.setattr(orphans, "machine_id", lambda: "another/machine")  # the daemon's
    said: list[str] = []
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
        monkeypatch.setattr(orphans, "_utcnow", lambda: beat + timedelta(seconds=299))
        assert fail_orphaned_runs(instance, said.append, sure=True) == 0
        assert _status(instance, run) == STARTED
        monkeypatch.setattr(orphans, "_utcnow", lambda: beat + timedelta(seconds=301))
        assert fail_orphaned_runs(instance, said.append, sure=True) == 1
        assert _status(instance, run) == FAILED
    host = run.tags[HOST_TAG]
    assert said == [
        f"note: run {run.run_id[:8]} of gpu-pipeline process {proc.pid} on {host} sent no "
        "heartbeat for 5 min 1 s: marked failed"
    ]
