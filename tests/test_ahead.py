"""New landing files parsed in a process of their own while a CLI run starts
(`lib/ingest/ahead.py`, issue 34): the run then finds them in the cache. The same parse, the
same progress lines; a parse ahead that fails or is stopped leaves the work to the run."""

from datetime import date
from pathlib import Path

import polars as pl
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline import runs
from gpu_pipeline.lib.ingest import ahead
from gpu_pipeline.lib.ingest.ahead import Ahead, landing_bytes, parse_new
from gpu_pipeline.lib.ingest.cache import TMP_PREFIX, is_cached
from gpu_pipeline.lib.ingest.landing import ParseOptions, hash_memo, list_landing
from gpu_pipeline.settings import Settings

DAY = date(2024, 1, 1)
MAX = ParseOptions().max_file_bytes


def _zone(raw: Path) -> None:
    """Three exposition files on two days, and one file no parser reads."""
    for host in ("h1", "h2"):
        lines = expo_lines(f"GPU-{host}", MODELS["A100"], host, "ns", DAY, range(30), 50, 200)
        write_file(raw / "c1" / f"{host}.prom", lines)
    later = expo_lines("GPU-h3", MODELS["H100"], "h3", "ns", date(2024, 1, 2), range(5), 90, 600)
    write_file(raw / "c2" / "h3.prom", later)
    (raw / "c2" / "notes.txt").write_text("not telemetry\n")


def _summary(parsed) -> list[tuple]:
    return [
        (
            pf.file.source_file,
            pf.file.sha256,
            pf.format,
            pf.lines_total,
            pf.rows_by_day,
            pf.records_by_day,
            pf.quarantine.collect().select("line", "reason").rows(),
        )
        for pf in parsed
    ]


def test_a_parse_ahead_fills_the_cache_the_run_reads(tmp_path):
    raw, cache, fresh = tmp_path / "raw", tmp_path / "cache", tmp_path / "fresh"
    _zone(raw)
    said: list[str] = []
    job = Ahead.start(str(raw), cache, "UTC", MAX, said.append, min_bytes=0)
    assert job is not None and job.join()
    # its progress, as the run says it
    assert said[0].startswith("parsing 4 new landing file(s)")
    assert said[-1].startswith("  parsed 4/4 files")
    files = list_landing(raw, hash_memo(cache), hash_new=False)
    assert all(f.hashed and is_cached(f, cache, ParseOptions()) for f in files)
    # the run finds nothing new, and reads what a parse of its own would give
    again: list[str] = []
    parsed = parse_new(raw, cache, ParseOptions(), again.append, days=[DAY])
    assert again == []
    own = parse_new(raw, fresh, ParseOptions(), [].append, days=[DAY])
    assert _summary(parsed) == _summary(own)
    assert [pf.records_on(DAY) for pf in parsed] == [60, 60, 0, 0]
    assert parsed[-1].format == "unknown"  # notes.txt: quarantined whole, not lost


def test_a_failed_parse_ahead_leaves_the_parse_to_the_run(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    _zone(raw)
    said: list[str] = []
    job = Ahead.start(str(raw), cache, "Not/A_Zone", MAX, said.append, min_bytes=0)
    assert job is not None and job.join() is False  # the options are refused in that process
    assert said == [] and not list(cache.glob("*/meta.json"))
    run_said: list[str] = []
    parsed = parse_new(raw, cache, ParseOptions(), run_said.append)
    assert run_said[0].startswith("parsing 4 new landing file(s)")
    assert [pf.records_on(DAY) for pf in parsed] == [60, 60, 0, 0]


def test_stop_ends_a_parse_ahead_and_removes_what_it_was_writing(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    _zone(raw)
    cache.mkdir()
    job = Ahead.start(str(raw), cache, "UTC", MAX, [].append, min_bytes=0)
    # a parse it was writing (named by its process), and another process's
    mine = cache / f"{TMP_PREFIX}{job.proc.pid}-abc"
    theirs = cache / f"{TMP_PREFIX}{job.proc.pid + 1}-abc"
    for folder in (mine, theirs):
        folder.mkdir()
        (folder / "samples-00000.parquet").write_bytes(b"partial")
    job.stop()
    assert job.proc.returncode is not None and not job.reader.is_alive()
    if job.proc.returncode != 0:  # stopped midway (not ended already): its folders are gone
        assert not mine.exists()
    assert theirs.exists()
    job.stop()  # twice: nothing left to stop


def test_object_stores_and_small_zones_are_parsed_by_the_run(tmp_path):
    raw = tmp_path / "raw"
    _zone(raw)
    size = sum(p.stat().st_size for p in raw.rglob("*") if p.is_file())
    assert landing_bytes(raw, 10**12) == size
    assert landing_bytes(raw, 1) <= size  # counting stops once enough is found
    assert Ahead.start(str(raw), tmp_path / "c", "UTC", MAX, print) is None  # < AHEAD_BYTES
    assert Ahead.start(str(raw), tmp_path / "c", "UTC", MAX, print, min_bytes=size + 1) is None
    assert Ahead.start("s3://bucket/raw", tmp_path / "c", "UTC", MAX, print, min_bytes=0) is None
    assert Ahead.start(str(tmp_path / "none"), tmp_path / "c", "UTC", MAX, print, 0) is None
    assert not (tmp_path / "c").exists()


def _materialize(tmp_path: Path, name: str, monkeypatch) -> tuple[list[str], dict]:
    raw, lake = tmp_path / "raw", tmp_path / name
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / f"home-{name}"))
    said: list[str] = []
    s = Settings(raw=str(raw), lake=str(lake))
    run = runs.materialize_range(s, runs.Request(DAY, DAY), said.append)
    assert run.success
    tables = {
        t: pl.read_parquet(lake / t / f"date={DAY}" / "data.parquet")
        for t in ("gpu_samples", "ingest_log", "quarantine", "gpu_minutes", "priced_waste")
    }
    return said, tables


def test_a_run_with_its_files_parsed_ahead_writes_the_same_day(tmp_path, monkeypatch):
    _zone(tmp_path / "raw")
    started: list[Ahead] = []
    start = Ahead.start.__func__

    def spy(cls, *a, **k):
        job = start(cls, *a, **k)
        started.append(job)
        return job

    monkeypatch.setattr(Ahead, "start", classmethod(spy))
    monkeypatch.setattr(ahead, "AHEAD_BYTES", 0)
    said, tables = _materialize(tmp_path, "ahead", monkeypatch)
    assert len(started) == 1 and started[0] is not None and started[0].proc.returncode == 0
    parsing = [i for i, s in enumerate(said) if s.startswith("parsing ")]
    assert len(parsing) == 1 and parsing[0] < said.index(
        next(s for s in said if s.startswith("materializing "))
    )
    monkeypatch.setattr(ahead, "AHEAD_BYTES", 10**15)  # the run parses them itself
    said_own, own = _materialize(tmp_path, "own", monkeypatch)
    assert started[-1] is None and any(s.startswith("parsing ") for s in said_own)
    for t, df in tables.items():
        keep = [c for c in df.columns if c not in ("ingest_id", "source_path")]
        assert df.select(keep).equals(own[t].select(keep)), t


def test_what_the_parse_ahead_wrote_is_not_hashed_again_unless_it_changed(tmp_path, monkeypatch):
    """The parse process ends with the stamps of the cached parses it wrote (`cache.checked`):
    the run trusts them while the files keep those stamps, and hashes a file that changed."""
    from gpu_pipeline.lib.ingest import cache as cache_mod

    raw, cache = tmp_path / "raw", tmp_path / "cache"
    _zone(raw)
    said: list[str] = []
    job = Ahead.start(str(raw), cache, "UTC", MAX, said.append, min_bytes=0)
    assert job is not None and job.join()
    assert not any(s.startswith(ahead.CHECKED) for s in said)  # not said: taken
    folders = {p.parent for p in cache.glob("*/meta.json")}
    assert len(folders) == 4 and folders <= set(cache_mod._CHECKED)
    hashed: list[Path] = []
    real = cache_mod._sha256
    monkeypatch.setattr(cache_mod, "_sha256", lambda p: hashed.append(p) or real(p))
    parsed = parse_new(raw, cache, ParseOptions(), [].append, days=[DAY])
    assert hashed == [] and [pf.records_on(DAY) for pf in parsed] == [60, 60, 0, 0]
    # a cached file rewritten since (another inode, change time): hashed, found bad, parsed again
    victim = next(
        f / "samples-00000.parquet" for f in folders if str(DAY) in (f / "meta.json").read_text()
    )
    data = victim.read_bytes()
    victim.unlink()
    victim.write_bytes(data[:-9] + b"tampered!")
    again = parse_new(raw, cache, ParseOptions(), [].append, days=[DAY])
    assert victim in hashed
    assert [pf.records_on(DAY) for pf in again] == [60, 60, 0, 0]
