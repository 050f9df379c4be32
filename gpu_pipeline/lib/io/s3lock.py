"""A day's lock on an S3 lake: an object created only if absent (`If-None-Match: *`), renewed
while its holder runs (a put `If-Match` its own ETag), deleted at the end (`If-Match` again).

Two runs of one day on one object-store lake then write its tables one after the other, as the
local lake's `flock` makes them. A run killed while holding the lock stops renewing it: once
it is `TTL_S` old, a waiting run deletes it — conditionally on the ETag it read, so that two
waiters never both take over — and takes it. pyarrow's filesystems cannot write conditionally:
this speaks to S3 through boto3 (the same endpoint and credentials variables).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager, suppress
from datetime import date

TTL_S = 120.0  # a lock not renewed for this long is a dead run's
RENEW_S = 20.0
POLL_S = 1.0


def _client():
    import boto3

    # a session of its own: endpoint and credentials read from the AWS_* variables now (boto3's
    # default session keeps what it read first)
    return boto3.session.Session().client("s3")


def _code(e: Exception) -> str:
    return getattr(e, "response", {}).get("Error", {}).get("Code", "")


class S3DayLock:
    """The lock object `<prefix>/_locks/<day>.lock` of bucket `bucket`."""

    def __init__(self, bucket: str, prefix: str, day: date, client=None):
        self.bucket, self.day = bucket, day
        self.key = f"{prefix.strip('/')}/_locks/{day.isoformat()}.lock".lstrip("/")
        self.client = client or _client()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.etag: str | None = None

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "renewed": time.time()}).encode()

    def try_acquire(self) -> bool:
        from botocore.exceptions import ClientError

        try:
            r = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*"
            )
        except ClientError as e:
            if _code(e) not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            self._break_if_expired()
            return False
        self.etag = r["ETag"]
        return True

    def _break_if_expired(self) -> None:
        """Delete the lock of a holder that stopped renewing it (ETag-conditional)."""
        from botocore.exceptions import ClientError

        try:
            head = self.client.get_object(Bucket=self.bucket, Key=self.key)
            renewed = json.loads(head["Body"].read()).get("renewed", 0)
            if time.time() - renewed > TTL_S:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=head["ETag"])
        except ClientError:
            pass  # gone meanwhile, or taken over by another waiter: try again
        except ValueError:  # not our JSON: a lock written by something else stays
            pass

    def renew(self) -> None:
        r = self.client.put_object(
            Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=self.etag
        )
        self.etag = r["ETag"]

    def release(self) -> None:
        from botocore.exceptions import ClientError

        # expired and taken over: not ours to delete any more
        with suppress(ClientError):
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)


@contextmanager
def s3_day_locks(uri: str, days, waiting=None):
    """Hold the S3 locks of `days` (in date order: two runs of overlapping ranges never
    deadlock) of the lake at `uri` (`s3://bucket/prefix`) until the block ends."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    held: list[S3DayLock] = []
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(RENEW_S):
            for lock in held:
                lock.renew()

    renewer = threading.Thread(target=renew, daemon=True, name="s3-day-locks")
    try:
        for day in sorted(set(days)):
            lock = S3DayLock(bucket, prefix, day, held[0].client if held else None)
            if not lock.try_acquire():
                if waiting:
                    waiting(day)
                while not lock.try_acquire():
                    time.sleep(POLL_S)
            held.append(lock)
        renewer.start()
        yield
    finally:
        stop.set()
        if renewer.is_alive():
            renewer.join()
        for lock in held:
            lock.release()
