"""A day's run checks and reads only the cached parses that hold that day (issue 35): with 30
days landed, a one-day run verifies one day's files, as it does with 10; a damaged cache of
another day is not its business, and is caught (and parsed again) by that day's run."""

from __future__ import annotations

import os
import time
from datetime import date, timedelta

import polars as pl
from helpers import cli, cli_env, expo_lines, write_file

from gpu_pipeline.lib.ingest import cache
from gpu_pipeline.lib.ingest.landing import list_landing

D0 = date(2024, 1, 1)


def _land(raw, days: int) -> None:
    """One scrape file a day for one host of 2 GPUs, named by its day."""
    for i in range(days):
        d = D0 + timedelta(days=i)
        lines = [
            ln
            for g in range(2)
            for ln in expo_lines(
                f"GPU-{g}", "NVIDIA A100-SXM4-80GB", "h1", "ns", d, range(60), 40, 250, g
            )
        ]
        write_file(raw / f"h1_{d}.prom", lines)


def _verified(monkeypatch, files, root, days) -> tuple[list, int]:
    """`parse_all` of `files` for `days` as a new process would (none of the cache checked in
    this one yet), and how many cached Parquet files it hashed."""
    monkeypatch.setattr(cache, "_CHECKED", {})
    hashed = []
    real = cache._sha256
    monkeypatch.setattr(cache, "_sha256", lambda p: hashed.append(p) or real(p))
    parsed = cache.parse_all(files, root, days=days)
    monkeypatch.setattr(cache, "_sha256", real)
    return parsed, len(hashed)


def test_a_days_run_checks_only_its_days_cached_parses(tmp_path, monkeypatch):
    counts = {}
    for n in (10, 30):
        raw, root = tmp_path / f"raw{n}", tmp_path / f"cache{n}"
        _land(raw, n)
        files = list_landing(raw)
        cache.parse_all(files, root)  # every file parsed once (the cache is warm)
        parsed, counts[n] = _verified(monkeypatch, files, root, [D0 + timedelta(days=5)])
        assert len(parsed) == n  # every file is still listed and accounted
        # the day's file and nothing else: its samples, series and quarantine
        assert counts[n] == 3
        _, every = _verified(monkeypatch, files, root, None)
        assert every == 3 * n  # without days, every cached parse is checked
    assert counts[10] == counts[30]


def test_a_damaged_cache_of_another_day_is_caught_by_its_own_days_run(tmp_path, monkeypatch):
    raw, root = tmp_path / "raw", tmp_path / "cache"
    _land(raw, 3)
    files = list_landing(raw)
    first = cache.parse_all(files, root)
    day1 = next(pf for pf in first if pf.days == [D0])
    samples = day1.pieces[0][0]
    pl.DataFrame({"x": [1]}).write_parquet(samples)  # damaged behind the cache's back
    later = cache.parse_all(files, root, days=[D0 + timedelta(days=2)])
    assert sum(pf.days == [D0] for pf in later) == 1  # listed, not read, not checked
    again = cache.parse_all(files, root, days=[D0])
    pf = next(pf for pf in again if pf.days == [D0])
    rows = pf.rows(D0).collect()
    assert rows.height == 2 * 60 * 2 and rows["gpu_uuid"].n_unique() == 2  # parsed again


def test_one_day_of_thirty_materializes_as_it_does_alone(tmp_path):
    """The day's tables are the same whether 1 or 30 days are landed (its ingest names only
    the files that hold it)."""
    env = cli_env(tmp_path)
    day = D0 + timedelta(days=4)
    out = {}
    for n in (1, 30):
        raw, lake = tmp_path / f"raw{n}", tmp_path / f"lake{n}"
        if n == 1:
            lines = [
                ln
                for g in range(2)
                for ln in expo_lines(
                    f"GPU-{g}", "NVIDIA A100-SXM4-80GB", "h1", "ns", day, range(60), 40, 250, g
                )
            ]
            write_file(raw / f"h1_{day}.prom", lines)
        else:
            _land(raw, n)
        cli("materialize", "--start", str(day), "--raw", str(raw), "--lake", str(lake), env=env)
        out[n] = {
            t: pl.read_parquet(lake / t / f"date={day}" / "data.parquet")
            for t in ("gpu_samples", "gpu_minutes", "priced_waste")
        }
    for t in out[1]:
        a, b = out[1][t], out[30][t]
        if "source_file" in a.columns:  # the same file name, under another landing root
            a, b = a.drop("source_file"), b.drop("source_file")
        assert a.height > 0 and a.equals(b), t


def test_a_parse_checked_in_this_process_is_hashed_again_only_when_touched(tmp_path, monkeypatch):
    """A run reads the cache twice (to plan, then in its ingest step): a parse this process
    wrote or found intact is not hashed again while its files are as they were; a file
    rewritten in place since, even to its size and modification time, is (its change time
    moved), and its damage is caught."""
    raw, root = tmp_path / "raw", tmp_path / "cache"
    _land(raw, 2)
    files = list_landing(raw)
    first = cache.parse_all(files, root)
    hashed = []
    real = cache._sha256
    monkeypatch.setattr(cache, "_sha256", lambda p: hashed.append(p) or real(p))
    cache.parse_all(files, root, days=[D0])
    assert hashed == []  # written by this process, unchanged
    samples = next(pf for pf in first if pf.days == [D0]).pieces[0][0]
    st = samples.stat()
    data = bytearray(samples.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped, in place
    time.sleep(0.05)  # past the clock tick of its writing (file times move by ticks)
    with open(samples, "r+b") as f:
        f.write(data)
    os.utime(samples, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (samples.stat().st_size, samples.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again = cache.parse_all(files, root, days=[D0])
    assert samples in hashed  # its change time moved: hashed, found damaged, parsed again
    pf = next(pf for pf in again if pf.days == [D0])
    assert pf.rows(D0).collect().height == 2 * 60 * 2
    hashed.clear()
    cache.parse_all(files, root, days=[D0])
    assert hashed == []  # the new parse is as this process wrote it
