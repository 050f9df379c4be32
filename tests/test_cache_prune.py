"""The parse cache keeps what the landing zone holds, not its history: a parse of a file since
removed, replaced or appended to is removed once no run has used it for a day (`cache.prune`)."""

from __future__ import annotations

import os
import time
from datetime import date
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.ingest.cache import (
    PRUNE_AFTER_S,
    TMP_PREFIX,
    parse_all,
    prune,
)
from gpu_pipeline.lib.ingest.landing import ParseOptions, hash_memo, list_landing
from tests.helpers import expo_lines, write_file

D = date(2024, 1, 1)
OLD = time.time() - PRUNE_AFTER_S - 3600  # unused for longer than a day


def _parse(raw: Path, cache: Path, opts: ParseOptions | None = None):
    opts = opts or ParseOptions()
    return parse_all(list_landing(raw, hash_memo(cache)), cache, opts)


def _entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.is_dir() and len(p.name) == 32}


def _age(folder: Path, when: float = OLD) -> None:
    os.utime(folder, (when, when))


def _landing(raw: Path) -> tuple[Path, Path]:
    a = write_file(
        raw / "c1" / "a.prom", expo_lines("GPU-a", "NVIDIA A10G", "h", "ns", D, range(30), 50, 100)
    )
    b = write_file(
        raw / "c1" / "b.prom", expo_lines("GPU-b", "NVIDIA A10G", "h2", "ns", D, range(30), 60, 120)
    )
    return a, b


def test_parses_of_files_gone_or_grown_go_after_a_day_unused(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    a, b = _landing(raw)
    first = _entries_after(_parse(raw, cache), cache)
    assert len(first) == 2
    # a live log appended to, a file removed by retention
    with a.open("a") as f:
        f.write(
            "\n".join(expo_lines("GPU-a", "NVIDIA A10G", "h", "ns", D, range(30, 40), 50, 100))
            + "\n"
        )
    b.unlink()
    parsed = _parse(raw, cache)
    now = _entries(cache)
    assert len(now) == 3  # the appended log's new parse beside the two old ones
    current = now - first
    # the run's own parse, even aged, stays; so do an old run's parses used within the day
    for name in now:
        _age(cache / name)
    other = cache / ("f" * 32)  # a parse with other options, used an hour ago
    other.mkdir()
    (other / "meta.json").write_text("{}")
    _age(other, time.time() - 3600)
    stale_tmp, live_tmp = cache / f"{TMP_PREFIX}1-{'a' * 32}", cache / f"{TMP_PREFIX}2-{'b' * 32}"
    stale_tmp.mkdir(), live_tmp.mkdir()
    (stale_tmp / "samples-00000.parquet").write_bytes(b"x" * 100)
    _age(stale_tmp)
    (cache / "_landing").mkdir()
    _age(cache / "_landing")
    # other tools' folders in a cache folder shared with them, however old and named
    foreign = {
        "0123456789abcdef0123456789abcdef": ["metrics.json"],  # an MLflow-style run id
        "fedcba9876543210fedcba9876543210": ["meta.json", "extra"],  # one more folder inside
        f"{TMP_PREFIX}build": ["keep.o"],
        f"{TMP_PREFIX}3-{'c' * 32}": ["notes.txt"],
    }
    for name, files in foreign.items():
        (cache / name).mkdir()
        for f in files:
            (cache / name / f).mkdir() if f == "extra" else (cache / name / f).write_text("x")
        _age(cache / name)

    gone = prune(cache, parsed, ParseOptions())

    assert _entries(cache) == current | {other.name} | {n for n in foreign if len(n) == 32}
    assert (gone.parses, gone.temporary) == (2, 1)
    assert gone.bytes > 100
    assert not stale_tmp.exists() and live_tmp.exists()
    assert (cache / "_landing").is_dir() and hash_memo(cache).is_file()
    assert all((cache / name).is_dir() for name in foreign)
    # what is left reads as before: the appended log, whole
    again = _parse(raw, cache)
    assert len(_entries(cache)) == 4  # nothing parsed again
    assert again[0].samples.collect().height == 80


def _entries_after(parsed, cache: Path) -> set[str]:
    assert all(pf.pieces for pf in parsed)
    return _entries(cache)


def test_a_run_marks_the_parses_it_reads_used(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    _landing(raw)
    _parse(raw, cache)
    for name in _entries(cache):
        _age(cache / name)
    parsed = _parse(raw, cache)  # read from the cache: used now
    assert all(time.time() - (cache / n).stat().st_mtime < 600 for n in _entries(cache))
    # so a prune by a run with other options (which keeps none of them) leaves them
    assert prune(cache, [], ParseOptions("Europe/Berlin")).parses == 0
    assert len(_entries(cache)) == 2 and len(parsed) == 2


def test_a_run_prunes_the_cache_and_says_so(tmp_path):
    import dagster as dg

    from gpu_pipeline.defs.raw import build_ingest
    from gpu_pipeline.defs.resources import LakeResource, LandingResource

    raw, lake = tmp_path / "raw", tmp_path / "lake"
    a, _ = _landing(raw)

    def run():
        instance = dg.DagsterInstance.ephemeral()
        res = dg.materialize(
            [build_ingest()],
            partition_key=str(D),
            resources={
                "lake": LakeResource(root=str(lake)),
                "landing": LandingResource(root=str(raw)),
            },
            instance=instance,
        )
        assert res.success
        return [e.user_message for e in instance.all_logs(res.run_id)]

    run()
    cache = lake / "_ingest_cache"
    before = _entries(cache)
    with a.open("a") as f:
        f.write(
            "\n".join(expo_lines("GPU-a", "NVIDIA A10G", "h", "ns", D, range(30, 45), 50, 100))
            + "\n"
        )
    for name in before:
        _age(cache / name)
    logs = run()
    after = _entries(cache)
    assert len(after) == 2 and len(after & before) == 1  # a.prom's old parse is gone
    assert any(
        "parse cache: removed 1 parse(s) of files no longer in the landing" in m for m in logs
    )
    samples = pl.read_parquet(lake / "gpu_samples" / f"date={D}" / "*.parquet")
    assert samples.filter(pl.col("gpu_uuid") == "GPU-a").height == 45
