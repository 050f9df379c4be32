"""A day's lock on an S3 lake: an object created only if absent (`If-None-Match: *`), renewed
while its holder runs (a put `If-Match` its own ETag), deleted at the end (`If-Match` again).

Two runs of one day on one object-store lake then write its tables one after the other, as the
local lake's `flock` makes them. A run killed while holding the lock stops renewing it: once a
waiting run has seen the lock object keep one ETag for `TTL_S` on its own monotonic clock, it
deletes it — conditionally on that ETag, so that two waiters never both take over — and takes
it. Expiry never compares two machines' wall clocks (the holder's and the waiter's may disagree
by minutes); every renewal writes a new body, so a live lock's ETag changes every `RENEW_S`.

A run holding several days renews each from the moment it holds it, also while it waits for a
later day. A renewal that fails for a network or server error is retried; a lock found taken
over, or not renewed for so long that a waiter may take it (`TTL_S` less a margin), is lost:
`check_held` (before a partition is published) raises `LockLost`, and so does the end of the
`s3_day_locks` block, and a wait for a later day stops with it. pyarrow's filesystems cannot
write conditionally: this speaks to S3 through boto3 (the same endpoint and credentials
variables).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager, suppress
from datetime import date

TTL_S = 120.0  # a lock whose ETag a waiter saw unchanged for this long is a dead run's
RENEW_S = 20.0
POLL_S = 1.0

log = logging.getLogger(__name__)

_BUSY = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
_GONE = ("PreconditionFailed", "NoSuchKey", "412", "404")

# the locks this process holds, for `check_held`
_ACTIVE: set[S3DayLock] = set()
_ACTIVE_GUARD = threading.Lock()


class LockLost(RuntimeError):
    """A day's lock its run no longer holds (taken over, or not renewed in time): another run
    may be writing the day, so this one must not write it."""


def _client():
    import boto3
    from botocore.config import Config

    # a session of its own: endpoint and credentials read from the AWS_* variables now (boto3's
    # default session keeps what it read first); short timeouts, network errors retried
    config = Config(
        connect_timeout=10, read_timeout=30, retries={"mode": "standard", "max_attempts": 3}
    )
    return boto3.session.Session().client("s3", config=config)


def _code(e: Exception) -> str:
    response = getattr(e, "response", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
    return response.get("Error", {}).get("Code", "") or str(status)


def _split(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


class S3DayLock:
    """The lock object `<prefix>/_locks/<day>.lock` of bucket `bucket`."""

    def __init__(self, bucket: str, prefix: str, day: date, client=None):
        self.bucket, self.day = bucket, day
        self.uri = f"s3://{bucket}/{prefix.strip('/')}".rstrip("/")
        self.key = f"{prefix.strip('/')}/_locks/{day.isoformat()}.lock".lstrip("/")
        self.client = client or _client()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.etag: str | None = None
        self.sent_at = 0.0  # monotonic: when the write of the lock's current ETag was sent
        self.lost: str | None = None  # why the lock is not this holder's any more
        self.error: str | None = None  # the last renewal's error, retried
        # the bodies sent since the last write known to have succeeded: token -> when sent
        self._sent: dict[str, float] = {}
        self._seen: tuple[str, float] | None = None  # waiting: the holder's ETag, first seen

    def _body(self) -> bytes:
        # a new token each write: a renewed lock's ETag changes (what waiters watch). `renewed`
        # is for waiters of earlier versions (they compared it with their clock); not read here
        token = uuid.uuid4().hex
        self._sent[token] = time.monotonic()
        body = {"owner": self.owner, "token": token, "renewed": time.time()}
        return json.dumps(body).encode()

    def _took(self, etag: str, token: str | None = None) -> None:
        """The lock holds the body `token` (None: the last one sent) at `etag`."""
        token = token or next(reversed(self._sent))
        self.etag, self.sent_at, self.error = etag, self._sent[token], None
        self._sent.clear()

    def try_acquire(self) -> bool:
        from botocore.exceptions import ClientError

        self._sent.clear()  # an earlier try that created the lock unanswered: expires, taken
        try:
            r = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*"
            )
        except ClientError as e:
            if _code(e) not in _BUSY:
                raise
            return self._break_if_expired()
        self._took(r["ETag"])
        return True

    def _read(self) -> tuple[str, dict] | None:
        """The lock object's ETag and body; None when it is gone. ValueError: not our JSON."""
        from botocore.exceptions import ClientError

        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise
        body = json.loads(got["Body"].read())
        if not isinstance(body, dict):
            raise ValueError("not a lock of ours")
        return got["ETag"], body

    def _mine(self, body: dict) -> str | None:
        """The token of `body` when it is one this holder sent since its last write known to
        have succeeded (a write that succeeded whose answer was lost): the lock is its own."""
        token = body.get("token")
        return token if body.get("owner") == self.owner and token in self._sent else None

    def _break_if_expired(self) -> bool:
        """Waiting: delete the lock of a holder that stopped renewing it — its ETag unchanged
        for TTL_S on this process's monotonic clock — conditionally on that ETag. True: the
        lock is this holder's own (its create succeeded and only the answer was lost)."""
        from botocore.exceptions import ClientError

        try:
            seen = self._read()
        except ClientError:
            return False  # the store answers again later: the clock keeps running
        except ValueError:  # not our JSON: a lock written by something else stays
            return False
        if seen is None:
            self._seen = None  # gone meanwhile: the next try creates it
            return False
        etag, body = seen
        if token := self._mine(body):
            self._took(etag, token)
            return True
        now = time.monotonic()
        if self._seen is None or self._seen[0] != etag:
            self._seen = (etag, now)  # new, or renewed since: its age counts from now
        elif now - self._seen[1] > TTL_S:
            # renewed or taken over by another waiter meanwhile: try again
            with suppress(ClientError):
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)
            self._seen = None
        return False

    def renew(self) -> None:
        """Renew the lock (the renewer thread's round): never raises. A lock found taken over
        is `lost`; any other error is kept in `error` and retried on the next round."""
        if self.lost:
            return
        try:
            r = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=self.etag
            )
            self._took(r["ETag"])
        except Exception as e:  # noqa: BLE001 (every error is kept; the thread must go on)
            if _code(e) in _GONE:
                self._lost_or_retry(e)
            else:
                self.error = f"{type(e).__name__}: {e}"
                log.warning("renewing the lock %s failed (retried): %s", self.key, self.error)

    def _lost_or_retry(self, e: Exception) -> None:
        """A renewal refused (412/404): lost, unless the lock holds the body just sent."""
        try:
            seen = self._read()
        except ValueError:  # replaced by an object that is not a lock of ours
            seen = ("", {})
        except Exception as read_error:  # noqa: BLE001 (unknown yet: the next round sees)
            self.error = f"{type(e).__name__}: {e}; then {read_error}"
            return
        if seen is not None and (token := self._mine(seen[1])):
            self._took(seen[0], token)
            return
        owner = seen[1].get("owner") if seen else None
        self.lost = f"taken over by {owner}" if owner else "its lock object was deleted or replaced"
        log.error("the lock %s is lost: %s", self.key, self.lost)

    def problem(self) -> str | None:
        """Why this holder must not write the day any more: the lock was taken over, or it was
        not renewed for so long that a waiting run may take it over; None while it is held."""
        if self.lost:
            return self.lost
        late = time.monotonic() - self.sent_at
        if late > TTL_S - min(RENEW_S, TTL_S / 4):
            why = f": {self.error}" if self.error else ""
            return f"not renewed for {late:.0f} s (a waiting run takes it after {TTL_S:.0f} s){why}"
        return None

    def release(self) -> None:
        # lost (taken over): not ours to delete any more, the If-Match fails; a release that
        # fails leaves the lock to expire
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except Exception as e:  # noqa: BLE001
            if _code(e) not in _GONE:
                log.warning("releasing the lock %s failed: %s", self.key, e)


def _raise_if_lost(locks) -> None:
    lost = [(lock, why) for lock in locks if (why := lock.problem())]
    if lost:
        raise LockLost(
            "; ".join(
                f"the lock of {lock.day} on {lock.uri} was lost ({why})" for lock, why in lost
            )
            + ": another run may be writing the day, so this run stopped writing it; run the "
            "day again"
        )


def check_held(uri: str, day: date | None = None) -> None:
    """LockLost if this process took the lock of `day` (None: of any day) of the lake at `uri`
    and no longer holds it; call it before publishing a partition. Nothing when this process
    holds no such lock (a write outside a run's `s3_day_locks`)."""
    bucket, prefix = _split(uri)
    lake = f"s3://{bucket}/{prefix}".rstrip("/")
    with _ACTIVE_GUARD:
        locks = [lock for lock in _ACTIVE if lock.uri == lake and day in (None, lock.day)]
    _raise_if_lost(locks)


def _renew_rounds(held: list[S3DayLock], stop: threading.Event) -> None:
    """Renew every lock in `held` (it grows as days are taken) every RENEW_S; after a failed
    renewal, sooner."""
    wait = RENEW_S
    while not stop.wait(wait):
        locks = list(held)
        for lock in locks:
            lock.renew()
        failing = any(lock.error and not lock.lost for lock in locks)
        wait = min(RENEW_S, max(POLL_S, RENEW_S / 4)) if failing else RENEW_S


@contextmanager
def s3_day_locks(uri: str, days, waiting=None):
    """Hold the S3 locks of `days` (in date order: two runs of overlapping ranges never
    deadlock) of the lake at `uri` (`s3://bucket/prefix`) until the block ends. Each day is
    renewed from the moment it is held. LockLost when a day held was lost: while waiting for a
    later day (the block does not run), or by the block's end."""
    bucket, prefix = _split(uri)
    held: list[S3DayLock] = []
    stop = threading.Event()
    renewer = threading.Thread(
        target=_renew_rounds, args=(held, stop), daemon=True, name="s3-day-locks"
    )
    renewer.start()  # before the first day is held: a day held is renewed while others wait
    try:
        for day in sorted(set(days)):
            lock = S3DayLock(bucket, prefix, day, held[0].client if held else None)
            if not lock.try_acquire():
                if waiting:
                    waiting(day)
                while not lock.try_acquire():
                    _raise_if_lost(held)
                    time.sleep(POLL_S)
            held.append(lock)
            with _ACTIVE_GUARD:
                _ACTIVE.add(lock)
        _raise_if_lost(held)  # one lost while the last day was being taken
        yield
        stop.set()
        renewer.join()
        _raise_if_lost(held)
    finally:
        stop.set()
        renewer.join()
        with _ACTIVE_GUARD:
            _ACTIVE.difference_update(held)
        for lock in held:
            lock.release()
