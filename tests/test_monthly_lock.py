"""namespace_monthly under the lake's day locks (`monthly.write_month`): a month is read and
written holding the lock of every day of it, so it never reads a day a daily run is rewriting,
two runs of one month write it one after the other, and a daily run of one of its days waits
for it (or it for the daily run). Locally (a file lock) and on an S3 lake (an S3 lock).

The planted day: 2024-01-31, one A100 of cluster-a/ns1 busy for an hour.
"""

import threading
import time
import uuid
from datetime import date

import dagster as dg
import pytest
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline.defs import marts, monthly, raw, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.namespace_monthly import month_days

JAN, DAY = date(2024, 1, 1), date(2024, 1, 31)
DAILY = dg.load_assets_from_modules([raw, staging, marts])
SOURCES = ("priced_waste", "gpu_minutes")


def resources(tmp, root=None) -> dict:
    return {
        "lake": LakeResource(root=root or str(tmp / "lake"), cache=str(tmp / "cache")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted day materialized (its priced_waste and gpu_minutes in the lake)."""
    tmp = tmp_path_factory.mktemp("monthly_lock")
    lines = expo_lines("GPU-A", MODELS["A100"], "a1", "ns1", DAY, range(600, 660), 80, 200.0)
    write_file(tmp / "raw" / "cluster-a" / f"a1_{DAY}.prom", lines)
    res = dg.materialize(DAILY, partition_key=str(DAY), resources=resources(tmp))
    assert res.success
    return tmp


def build_month(tmp, root=None, instance=None):
    return dg.materialize(
        [monthly.namespace_monthly],
        partition_key="2024-01",
        resources=resources(tmp, root),
        instance=instance,
        raise_on_error=False,
    )


class Busy(Exception):
    pass


def busy(lake: Lake, day: date) -> bool:
    """Whether another holder has the lake's lock of `day`: probed through `day_locks`, whose
    `waiting` is called (here: gives up) when the day is held."""

    def give_up(_day):
        raise Busy

    try:
        with lake.day_locks([day], give_up):
            return False
    except Busy:
        return True


def probing(monkeypatch, probe: Lake, days: list[date]) -> list[tuple[str, list[date]]]:
    """While the month reads its days' tables and writes its own, which of `days` were free
    (not held): (what was done, the free days), one entry per read or write."""
    seen: list[tuple[str, list[date]]] = []
    read_days, write = Lake.read_days, Lake.write

    def look(what: str) -> None:
        seen.append((what, [d for d in days if not busy(probe, d)]))

    def probed_read_days(self, table, days_):
        if table in SOURCES:
            look(f"read {table}")
        return read_days(self, table, days_)

    def probed_write(self, table, day, df, lineage=None):
        if table == monthly.TABLE:
            look(f"write {table}")
        return write(self, table, day, df, lineage)

    monkeypatch.setattr(Lake, "read_days", probed_read_days)
    monkeypatch.setattr(Lake, "write", probed_write)
    return seen


def test_a_month_holds_every_day_of_it_while_it_reads_and_writes(planted, monkeypatch):
    lake = Lake(planted / "lake")
    seen = probing(monkeypatch, lake, month_days(JAN))
    res = build_month(planted)
    assert res.success
    assert [what for what, _ in seen] == ["read priced_waste", "write namespace_monthly"]
    assert all(free == [] for _, free in seen), f"days of the month not locked: {seen}"
    assert not any(busy(lake, d) for d in month_days(JAN))  # all released at the end


def _stamp(path) -> tuple[int, int] | None:
    return (path.stat().st_ino, path.stat().st_mtime_ns) if path.exists() else None


def test_a_month_waits_for_a_run_writing_one_of_its_days(planted):
    """A daily run holds 2024-01-31: the month takes the days before it, then waits; it is
    written once the day is let go, and its run says what it waited for."""
    lake, instance = Lake(planted / "lake"), dg.DagsterInstance.ephemeral()
    month_file = lake.partition_file(monthly.TABLE, JAN)
    before = _stamp(month_file)
    done: list = []
    with lake.day_locks([DAY]):
        t = threading.Thread(target=lambda: done.append(build_month(planted, instance=instance)))
        t.start()
        deadline = time.monotonic() + 120
        while t.is_alive() and not busy(lake, JAN) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.is_alive(), "the month was built while a run held a day of it"
        assert busy(lake, JAN)  # it holds the days before the one it waits for
        time.sleep(0.5)
        assert t.is_alive() and _stamp(month_file) == before
    t.join(120)
    assert not t.is_alive() and done[0].success
    assert _stamp(month_file) != before
    said = [e.user_message for e in instance.all_logs(done[0].run_id)]
    assert any(f"waiting for another run writing {DAY}" in m for m in said), said


def test_two_runs_of_a_month_and_a_run_of_its_day_at_once_all_end(planted):
    """Two builds of January and a run of 2024-01-31 started together: no deadlock, each ends,
    and the month is the one its day makes."""
    results: dict[str, object] = {}

    def run(name, fn):
        results[name] = fn()

    jobs = [
        ("month 1", lambda: build_month(planted)),
        (
            "day",
            lambda: dg.materialize(DAILY, partition_key=str(DAY), resources=resources(planted)),
        ),
        ("month 2", lambda: build_month(planted)),
    ]
    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a run never ended (deadlock)"
    assert all(r.success for r in results.values())
    lake = Lake(planted / "lake")
    got = lake.read(monthly.TABLE, JAN)
    want, _ = monthly.compute_month(lake, JAN)
    assert got.drop("date").equals(want.drop("date", strict=False))
    assert got["gpu_hours"].sum() == pytest.approx(1.0)


def test_on_an_s3_lake_a_month_holds_its_days_s3_locks(planted, monkeypatch, tmp_path):
    pytest.importorskip("moto.server")
    from helpers import moto_s3

    with moto_s3(monkeypatch, "gpu-lake"):
        uri = f"s3://gpu-lake/month-{uuid.uuid4().hex[:8]}"
        s3 = Lake(uri, cache=tmp_path / "cache")
        local = Lake(planted / "lake")
        for table in SOURCES:
            s3.write(table, DAY, local.read(table, DAY))
        seen = probing(monkeypatch, Lake(uri, cache=tmp_path / "probe"), [JAN, DAY])
        res = build_month(planted, root=uri)
        assert res.success
        assert [what for what, _ in seen] == ["read priced_waste", "write namespace_monthly"]
        assert all(free == [] for _, free in seen), f"days of the month not locked: {seen}"
        assert s3.read(monthly.TABLE, JAN)["gpu_hours"].sum() == pytest.approx(1.0)
        assert not any(busy(s3, d) for d in (JAN, DAY))  # the lock objects were deleted
