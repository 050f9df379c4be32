"""A new landing file is read once by `materialize`: hashed by its parse, not also at listing
(issue "The fleet-day at the speed of its reads": hashing every new file before parsing it took
3.4 s of a 1,000-GPU day). The hash stays the hash of the bytes parsed, the memo learns it, and
a file edited after it was listed is never remembered under the hash of other content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpu_pipeline.lib.ingest import landing
from gpu_pipeline.lib.ingest.cache import is_cached, parse_all
from gpu_pipeline.lib.ingest.landing import (
    ParseOptions,
    hash_memo,
    list_landing,
    remember_hashes,
)

SCRAPE = (
    'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{u}",modelName="NVIDIA A100-SXM4-80GB",'
    'Hostname="h1"}} {v} {ts}\n'
)


def scrape(uuid: str, values: list[int]) -> str:
    t0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
    return "".join(SCRAPE.format(u=uuid, v=v, ts=t0 + 60_000 * i) for i, v in enumerate(values))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def zone(tmp_path):
    raw = tmp_path / "raw" / "c1"
    raw.mkdir(parents=True)
    (raw / "a.prom").write_text(scrape("a", [10, 20, 30]))
    (raw / "b.prom").write_text(scrape("b", [40, 50]))
    return tmp_path / "raw", tmp_path / "cache"


def no_hashing(monkeypatch):
    def refuse(entry):
        raise AssertionError(f"{entry[0]} hashed at listing")

    monkeypatch.setattr(landing, "_hash_listed", refuse)


def test_new_files_are_hashed_by_their_parse_and_remembered(zone, monkeypatch):
    raw, cache = zone
    with monkeypatch.context() as m:
        no_hashing(m)
        files = list_landing(raw, hash_memo(cache), hash_new=False)
        assert [f.sha256 for f in files] == ["", ""]
        assert not any(is_cached(f, cache) for f in files)
        parsed = parse_all(files, cache)
    assert [pf.file.sha256 for pf in parsed] == [sha(f.path) for f in files]
    assert [pf.records_on(pf.days[0]) for pf in parsed] == [3, 2]
    remember_hashes(hash_memo(cache), [pf.file for pf in parsed])
    # the run's own listing (and the next run's) reads no file: the memo knows them, and
    # their parses are cached under those hashes
    with monkeypatch.context() as m:
        no_hashing(m)
        again = list_landing(raw, hash_memo(cache))
        assert [f.sha256 for f in again] == [sha(f.path) for f in again]
        assert all(is_cached(f, cache) for f in again)
        assert list_landing(raw, hash_memo(cache), hash_new=False) == again


def test_a_file_edited_after_listing_is_the_content_parsed(zone):
    raw, cache = zone
    files = list_landing(raw, hash_memo(cache), hash_new=False)
    a = files[0].path
    a.write_text(scrape("a", [90, 91, 92, 93]))  # in place: size and change time move
    parsed = parse_all(files, cache)
    assert parsed[0].file.sha256 == sha(a)
    assert parsed[0].records_on(parsed[0].days[0]) == 4
    remember_hashes(hash_memo(cache), [pf.file for pf in parsed])
    # remembered under the key it was listed with, which the edited file no longer has: the
    # next listing hashes it again. Its modification time moved too, and a parse is cached with
    # the time it was made with (a scrape without times is filed at it): parsed again, the same
    fresh = list_landing(raw, hash_memo(cache))
    assert fresh[0].sha256 == sha(a) and not is_cached(fresh[0], cache)
    again = parse_all(fresh, cache)[0]
    assert again.records_on(again.days[0]) == 4 and is_cached(fresh[0], cache)


def test_a_memo_entry_is_never_kept_for_other_content(zone):
    """An edit that restores size and modification time still moves the change time."""
    raw, cache = zone
    files = list_landing(raw, hash_memo(cache), hash_new=False)
    parsed = parse_all(files, cache)
    remember_hashes(hash_memo(cache), [pf.file for pf in parsed])
    a = files[0].path
    st = a.stat()
    body = a.read_bytes()
    a.write_bytes(body.replace(b"} 10 ", b"} 11 "))
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    relisted = list_landing(raw, hash_memo(cache), hash_new=False)
    assert relisted[0].sha256 == ""  # not the remembered hash of the old content
    assert parse_all(relisted, cache)[0].file.sha256 == sha(a)


def test_a_file_over_the_size_limit_listed_unhashed_is_hashed_before_it_is_cached(zone):
    """Its parse does not read it (refused whole), so its hash is taken apart: a cache entry
    is never keyed by an unknown hash (two such files of one name would share it)."""
    raw, cache = zone
    opts = ParseOptions(max_file_bytes=64)
    files = list_landing(raw, hash_memo(cache), hash_new=False)
    parsed = parse_all(files, cache, opts)
    assert [pf.file.sha256 for pf in parsed] == [sha(f.path) for f in files]
    assert all(pf.rejected_whole for pf in parsed)
    assert all(is_cached(pf.file, cache, opts) for pf in parsed)
