"""Runs `gpu-pipeline materialize` left STARTED when its process died (kill -9, out of memory, a
laptop closed): no daemon watches a run executed in its own process, and Dagster keeps it
STARTED. Such a run blocks what waits for runs in progress: `monthly_automation_sensor` never
brings a later day's month up to date while it stands (adversarial review). They are marked
failed by the next `materialize` and, with the daemon running, by `orphaned_runs_sensor`.

Which runs are orphaned, on an instance several machines share (Postgres):

- on the machine that ran it (the same machine id and boot, and PID namespace): its process is
  gone (no such pid, or one started at another time). Not by host name and namespace alone:
  cloned machines share a hostname, and every Linux host's initial PID namespace has the same
  inode, so one machine's live pid would be judged on another (review);
- from anywhere else: its heartbeat, a tag (`BEAT_TAG`) the running process refreshes every
  BEAT_SECONDS (`heartbeat`, around `materialize`'s runs), is older than STALE_SECONDS. A run
  without one (an earlier version's) is judged on its own host only, as before. A process that
  stops for longer (a laptop suspended mid-run) has its run marked failed too.
"""

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import dagster as dg

# who started a CLI run: the host and process (its PID namespace and start time, so a pid seen
# from another namespace, or reused, is not taken for it), set on every run `materialize` makes
HOST_TAG, PID_TAG = "gpu_pipeline/host", "gpu_pipeline/pid"
NS_TAG, START_TAG = "gpu_pipeline/pid_ns", "gpu_pipeline/pid_started"
# the machine and its boot: `<machine-id>/<boot_id>` (/etc/machine-id, "-" without one;
# /proc/sys/kernel/random/boot_id, new at every boot); "" where neither can be read
MACHINE_TAG = "gpu_pipeline/machine"
# when the running process last said it is alive (UTC, ISO 8601), while `heartbeat` runs
BEAT_TAG = "gpu_pipeline/heartbeat"
BEAT_SECONDS = 30
STALE_SECONDS = 300  # ten beats missed
IN_PROGRESS = [
    # NOT_STARTED too: a process killed between creating its run and starting it
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


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


def _first_line(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def machine_id() -> str:
    """This machine and boot: `<machine-id>/<boot_id>`, or "" without a boot id (not Linux)."""
    boot = _first_line("/proc/sys/kernel/random/boot_id")
    return f"{_first_line('/etc/machine-id') or '-'}/{boot}" if boot else ""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _now() -> str:
    return _utcnow().isoformat(timespec="seconds")


def who_runs() -> dict[str, str]:
    """The tags naming this process as the runner of a run (with a heartbeat while `heartbeat`
    runs in this process)."""
    pid = os.getpid()
    tags = {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(pid),
        NS_TAG: _pid_ns(),
        START_TAG: _started(pid),
        MACHINE_TAG: machine_id(),
    }
    if _beating is not None:
        tags[BEAT_TAG] = _now()
    return tags


class Heartbeat:
    """Refreshes BEAT_TAG, every `every` seconds in a daemon thread, on the runs in progress that
    name this process (host, machine, pid and its start time) as their runner."""

    def __init__(self, instance: dg.DagsterInstance, every: float = BEAT_SECONDS) -> None:
        me = who_runs()
        keys = (HOST_TAG, PID_TAG, START_TAG, MACHINE_TAG)
        self.tags = {k: me[k] for k in keys if me[k]}
        self.instance, self.every = instance, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name="gpu-pipeline-heartbeat", daemon=True
        )

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            self.beat()

    def beat(self) -> int:
        """Refresh the tag now; how many runs. A beat that fails is missed, not raised: the next
        one tries again."""
        try:
            runs = self.instance.get_runs(
                filters=dg.RunsFilter(statuses=IN_PROGRESS, tags=self.tags)
            )
            now = _now()
            for run in runs:
                self.instance.add_run_tags(run.run_id, {BEAT_TAG: now})
            return len(runs)
        except Exception:  # noqa: BLE001 - the database away for a moment; runs go on
            return 0


_beating: Heartbeat | None = None


@contextmanager
def heartbeat(instance: dg.DagsterInstance, every: float = BEAT_SECONDS) -> Iterator[Heartbeat]:
    """While open, the runs this process makes carry BEAT_TAG (`who_runs`), refreshed every
    `every` seconds: any machine sharing the instance can tell a killed one (`fail_orphaned_runs`).
    Opened twice in one process, the first one serves."""
    global _beating
    if _beating is not None:
        yield _beating
        return
    beat = _beating = Heartbeat(instance, every)
    beat.thread.start()
    try:
        yield beat
    finally:
        _beating = None
        beat.stopped.set()
        beat.thread.join(timeout=10)


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


def _on_this_machine(tags: dict[str, str], sure: bool) -> bool:
    """Was the run's process one of this machine's, boot's and PID namespace's (so its pid can
    be looked up here)? A run of an earlier version, without MACHINE_TAG: by host name and
    namespace as it was judged then (with `sure`, not without a namespace)."""
    theirs, mine, ns = tags.get(MACHINE_TAG), machine_id(), tags.get(NS_TAG)
    if theirs is not None and (theirs or mine):
        return theirs == mine and ns == _pid_ns()
    if tags.get(HOST_TAG) != socket.gethostname():
        return False
    return ns == _pid_ns() if ns is not None else not sure


def _age_text(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _beat_age(tags: dict[str, str], now: datetime) -> float | None:
    """Seconds since the run's heartbeat, or None without one (or one that cannot be read)."""
    try:
        beat = datetime.fromisoformat(tags[BEAT_TAG])
    except (KeyError, ValueError):
        return None
    return (now - beat).total_seconds() if beat.tzinfo else None


def orphaned_because(run: dg.DagsterRun, sure: bool, now: datetime) -> tuple[str, str] | None:
    """(why, the line to say) when the run's process is gone, else None (alive, or not known)."""
    tags = run.tags
    try:
        pid = int(tags.get(PID_TAG, "0") or 0)
    except ValueError:
        pid = 0
    host = tags.get(HOST_TAG)
    if host is None or pid <= 0:
        return None  # not a run of `materialize`
    short = run.run_id[:8]
    if _on_this_machine(tags, sure):
        if pid == os.getpid() or not _gone(pid, tags.get(START_TAG)):
            return None
        return (
            f"the gpu-pipeline process {pid} running it ended before it finished",
            f"note: run {short} was left unfinished by a killed process: marked failed",
        )
    age = _beat_age(tags, now)
    if age is None or age <= STALE_SECONDS:
        return None
    return (
        f"no heartbeat from the gpu-pipeline process {pid} on {host} for {_age_text(age)} (it was "
        "killed, or its machine stopped or lost the instance's database)",
        f"note: run {short} of gpu-pipeline process {pid} on {host} sent no heartbeat for "
        f"{_age_text(age)}: marked failed",
    )


def fail_orphaned_runs(
    instance: dg.DagsterInstance, say: Callable[[str], None], sure: bool = False
) -> int:
    """Mark failed, saying why, the runs of `materialize` whose process is gone: on this
    machine, by its pid; elsewhere, by its heartbeat (the module's docstring). How many were.
    With `sure`, a run of this host that names neither its machine nor its namespace (written
    before they were recorded) is not judged."""
    now, n = _utcnow(), 0
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS)):
        found = orphaned_because(run, sure, now)
        if found is None:
            continue
        instance.report_run_failed(run, found[0])
        say(found[1])
        n += 1
    return n


@dg.sensor(
    name="orphaned_runs_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def orphaned_runs_sensor(context: dg.SensorEvaluationContext):
    """Marks failed the runs of `gpu-pipeline materialize` whose process is gone (on this
    machine, or with a heartbeat too old on any other), so a killed command does not leave the
    month's automation waiting on it forever."""
    n = fail_orphaned_runs(context.instance, context.log.info, sure=True)
    return dg.SkipReason(
        f"{n} run(s) of a killed gpu-pipeline process marked failed"
        if n
        else "no run of a killed gpu-pipeline process"
    )
