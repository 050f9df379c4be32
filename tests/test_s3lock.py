"""The day lock of an S3 lake (`lib/io/s3lock.py`) on a local S3-compatible server: a day held is
renewed while a later day is waited for, expiry is judged on the waiter's own monotonic clock
(never by comparing two machines' wall clocks), a renewal that fails is retried, and a lock lost
fails its holder before it writes (`check_held`) and when its block ends."""

import threading
import time
import uuid
from datetime import date, timedelta

import pytest

moto_server = pytest.importorskip("moto.server")

from helpers import moto_s3  # noqa: E402

from gpu_pipeline.lib.io import s3lock  # noqa: E402
from gpu_pipeline.lib.io.lake import Lake  # noqa: E402

START = date(2024, 1, 1)
D1, D2 = START, START + timedelta(days=1)


@pytest.fixture()
def s3(monkeypatch):
    """A lake URI on a moto server of this test: a prefix of its own (moto's store is the
    process's, shared by the tests' servers)."""
    with moto_s3(monkeypatch, "gpu-lake"):
        yield f"s3://gpu-lake/locks-{uuid.uuid4().hex[:8]}"


def _prefix(uri: str) -> str:
    return uri.removeprefix("s3://gpu-lake/")


def _lock_key(uri: str, day: date) -> str:
    return f"{_prefix(uri)}/_locks/{day.isoformat()}.lock"


def _take_over(uri: str, day: date) -> None:
    """Another run's lock in place of the holder's (what a waiter that broke it leaves)."""
    import boto3

    body = b'{"owner": "other-host:1:abcd1234", "token": "x"}'
    boto3.client("s3").put_object(Bucket="gpu-lake", Key=_lock_key(uri, day), Body=body)


class _FlakyClient:
    """A boto3 client whose renewals (`put_object` If-Match) fail with a network error: the
    first `fail` of them, or all of them (`always`)."""

    def __init__(self, client, fail: int = 0, always: bool = False):
        self._client, self.fail, self.always, self.failed = client, fail, always, 0

    def put_object(self, **kw):
        from botocore.exceptions import EndpointConnectionError

        if "IfMatch" in kw and (self.always or self.failed < self.fail):
            self.failed += 1
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        return self._client.put_object(**kw)

    def __getattr__(self, name):
        return getattr(self._client, name)


def _run_threads(args: list[tuple], target) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(*a):
        try:
            target(*a)
        except BaseException as e:  # noqa: BLE001 (a thread's failure is the test's)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=a, daemon=True) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_a_day_held_is_renewed_while_a_later_day_is_waited_for(s3, monkeypatch):
    """Run "a" holds D1 and waits for D2 (held by "h"): its D1 lock is renewed meanwhile, so
    "c", waiting for D1, never takes it over; the two never write D1 at once."""
    monkeypatch.setattr(s3lock, "TTL_S", 3.0)
    monkeypatch.setattr(s3lock, "RENEW_S", 0.5)
    lake = Lake(s3)
    spans: dict[str, tuple[float, float]] = {}

    # each run starts once the one before it is where the test needs it (a fixed delay let a
    # loaded machine start "c" before "a": it held D1 first and never waited)
    h_holds, a_waits = threading.Event(), threading.Event()

    def run(name, days, hold, after, holds, waits):
        assert after is None or after.wait(30), name
        with lake.day_locks(days, waiting=lambda d: waits and waits.set()):
            if holds:
                holds.set()
            t0 = time.monotonic()
            time.sleep(hold)
            spans[name] = (t0, time.monotonic())

    runs = [
        ("h", [D2], 8, None, h_holds, None),
        ("a", [D1, D2], 2, h_holds, None, a_waits),  # holds D1, waits for D2
        ("c", [D1], 6, a_waits, None, None),
    ]
    errors = _run_threads(runs, run)
    assert errors == []
    (a0, a1), (c0, c1), (h0, h1) = spans["a"], spans["c"], spans["h"]
    assert a1 <= c0 or c1 <= a0, spans  # D1: one after the other
    assert a1 <= h0 or h1 <= a0, spans  # D2 too
    assert c0 >= a1  # "c" waited for "a", which held D1 first


def test_a_clock_ahead_never_breaks_a_live_lock(s3, monkeypatch):
    """A waiter whose wall clock is 150 s ahead of the holder's does not take a lock renewed
    moments ago: expiry is not judged by comparing two machines' clocks."""
    holder = s3lock.S3DayLock("gpu-lake", _prefix(s3), START)
    assert holder.try_acquire()
    real = time.time
    monkeypatch.setattr(s3lock.time, "time", lambda: real() + 150)
    waiter = s3lock.S3DayLock("gpu-lake", _prefix(s3), START)
    assert not (waiter.try_acquire() or waiter.try_acquire())
    holder.renew()  # still the holder's
    assert holder.problem() is None


def test_a_dead_lock_is_taken_whatever_the_clocks_say(s3, monkeypatch):
    """A lock whose holder stopped renewing it is taken once its ETag stayed the same for TTL_S
    on the waiter's monotonic clock, even when the waiter's wall clock is far behind."""
    monkeypatch.setattr(s3lock, "TTL_S", 1.0)
    dead = s3lock.S3DayLock("gpu-lake", _prefix(s3), START)
    assert dead.try_acquire()
    real = time.time
    monkeypatch.setattr(s3lock.time, "time", lambda: real() - 1000)
    took: list[float] = []

    def wait():
        t0 = time.monotonic()
        with Lake(s3).day_locks([START]):
            took.append(time.monotonic() - t0)

    assert _run_threads([()], wait) == []
    assert len(took) == 1 and 1.0 <= took[0] < 10, took


def test_a_failed_renewal_is_retried(s3, monkeypatch):
    """Two renewals that fail with a network error are retried: the lock stays the holder's,
    a waiter does not take it over, and the holder's block ends without an error."""
    monkeypatch.setattr(s3lock, "TTL_S", 2.0)
    monkeypatch.setattr(s3lock, "RENEW_S", 0.3)
    real = s3lock._client
    flaky = _FlakyClient(real(), fail=2)
    clients = iter([flaky])
    monkeypatch.setattr(s3lock, "_client", lambda: next(clients, None) or real())
    lake = Lake(s3)
    spans: dict[str, tuple[float, float]] = {}

    def run(name, delay):
        time.sleep(delay)
        with lake.day_locks([START]):
            t0 = time.monotonic()
            time.sleep(5 if name == "holder" else 0.2)
            spans[name] = (t0, time.monotonic())

    assert _run_threads([("holder", 0), ("waiter", 0.5)], run) == []
    assert spans["holder"][1] <= spans["waiter"][0], spans  # one after the other
    assert flaky.failed == 2


def test_a_lock_taken_over_fails_its_holder(s3, monkeypatch):
    """A lock another run took over: `check_held` (before a partition is published) raises
    LockLost naming the day and the new owner; the block ends with LockLost; the other run's
    lock is not deleted."""
    monkeypatch.setattr(s3lock, "RENEW_S", 0.2)
    import boto3

    with pytest.raises(s3lock.LockLost) as lost, Lake(s3).day_locks([START]):
        s3lock.check_held(s3, START)  # held: nothing
        _take_over(s3, START)
        time.sleep(1.0)  # a few renewals
        with pytest.raises(s3lock.LockLost) as early:
            s3lock.check_held(s3, START)
        assert "2024-01-01" in str(early.value) and "other-host:1:abcd1234" in str(early.value)
        s3lock.check_held(s3, START + timedelta(days=5))  # a day not held: nothing
        s3lock.check_held("s3://gpu-lake/another-lake", START)  # another lake: nothing
    assert "2024-01-01" in str(lost.value) and s3 in str(lost.value)
    body = boto3.client("s3").get_object(Bucket="gpu-lake", Key=_lock_key(s3, START))["Body"]
    assert b"other-host" in body.read()
    s3lock.check_held(s3, START)  # released: this process holds no lock of the day any more


def test_renewals_failing_too_long_lose_the_lock(s3, monkeypatch):
    """Renewals that keep failing: once a waiter could take the lock over, `check_held` raises
    LockLost saying it was not renewed, with the last error."""
    monkeypatch.setattr(s3lock, "TTL_S", 2.0)
    monkeypatch.setattr(s3lock, "RENEW_S", 0.2)
    real = s3lock._client
    monkeypatch.setattr(s3lock, "_client", lambda: _FlakyClient(real(), always=True))
    with pytest.raises(s3lock.LockLost, match="not renewed"), Lake(s3).day_locks([START]):
        s3lock.check_held(s3, START)
        time.sleep(2.2)
        with pytest.raises(s3lock.LockLost, match="not renewed .*Could not connect"):
            s3lock.check_held(s3)


def test_a_day_lost_while_waiting_for_a_later_one_fails_before_the_block(s3, monkeypatch):
    """Run "a" holds D1 and waits for D2; D1 is taken over meanwhile: "a" fails with LockLost
    without entering its block (nothing written)."""
    monkeypatch.setattr(s3lock, "RENEW_S", 0.2)
    monkeypatch.setattr(s3lock, "POLL_S", 0.1)
    h = s3lock.S3DayLock("gpu-lake", _prefix(s3), D2)
    assert h.try_acquire()
    entered, waiting = [], threading.Event()

    def run_a():
        with Lake(s3).day_locks([D1, D2], waiting=lambda d: waiting.set()):
            entered.append(True)

    errors: list[BaseException] = []

    def guarded():
        try:
            run_a()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=guarded, daemon=True)
    t.start()
    assert waiting.wait(30)
    _take_over(s3, D1)
    t.join(30)
    h.release()
    assert not t.is_alive() and entered == []
    assert len(errors) == 1 and isinstance(errors[0], s3lock.LockLost), errors
    assert "2024-01-01" in str(errors[0])
