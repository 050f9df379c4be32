"""The landing zone read once: a file is opened once, checked to be the one listed, hashed and
parsed from the same bytes (issue "Integrity, second pass", items 2 and 9)."""

from __future__ import annotations

import hashlib
import os
from datetime import date
from pathlib import Path

import polars as pl
from helpers import expo_lines, write_file

from gpu_pipeline.lib.ingest import cache as cache_mod
from gpu_pipeline.lib.ingest.cache import load_or_parse, parse_all
from gpu_pipeline.lib.ingest.gpu_samples import assemble_day
from gpu_pipeline.lib.ingest.landing import list_landing

D = date(2024, 1, 1)
SECRET = Path("/etc/passwd")


def genuine(raw: Path, minutes=range(10)) -> Path:
    return write_file(
        raw / "store" / "node.prom",
        expo_lines("GPU-aa", "NVIDIA A10G", "n1", "team", D, minutes, 50, 150),
    )


def test_a_link_swapped_between_listing_and_reading_reads_what_was_listed(tmp_path):
    """The link is resolved once, at listing; the read opens that file (never the link again),
    so a swap to /etc/passwd afterwards puts none of its text anywhere."""
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    real = genuine(raw)
    link = raw / "node_link.prom"
    link.symlink_to(real)
    (lf,) = [f for f in list_landing(raw) if f.source_file == "node_link.prom"]
    assert lf.problem is None
    link.unlink()
    link.symlink_to(SECRET)  # swapped after the listing
    pf = load_or_parse(lf, cache)
    assert pf.format == "dcgm_exposition" and pf.samples.collect().height == 20
    assert pf.file.sha256 == hashlib.sha256(real.read_bytes()).hexdigest()
    # the target swapped too: not read, not cached, nothing of the secret anywhere
    real.rename(raw / "store" / "moved.prom")
    real.symlink_to(SECRET)
    (lf2,) = [f for f in list_landing(raw / "store") if f.source_file == "node.prom"] or [None]
    assert lf2.problem  # a link out of the zone at listing: refused there
    pf = load_or_parse(lf, tmp_path / "cache2")
    q = pf.quarantine.collect()
    assert pf.format == "refused" and "changed between listing and reading" in q["reason"][0]
    secret = SECRET.read_text()[:40]
    assert secret not in "".join(q["raw"].drop_nulls().to_list())
    assert pf.samples.collect().height == 0
    assert not any((tmp_path / "cache2").glob("*/meta.json"))


def test_a_file_swapped_for_a_link_after_listing_is_not_followed(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    real = genuine(raw)
    (lf,) = list_landing(raw)
    real.unlink()
    real.symlink_to(SECRET)
    pf = load_or_parse(lf, cache)
    assert pf.format == "refused"
    assert pf.samples.collect().height == 0
    assert not any(cache.glob("*/meta.json"))


def test_a_file_replaced_by_another_after_listing_is_not_read(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    real = genuine(raw)
    (lf,) = list_landing(raw)
    other = raw / "other"
    other.write_text("not this one\n")
    os.replace(other, real)  # same path, another inode
    assert load_or_parse(lf, cache).format == "refused"


def test_the_hash_is_of_the_bytes_parsed(tmp_path):
    """A file appended to between the listing and the parse: its ledger's sha256 and counts are
    of the same bytes (146 lines hashed and 147 read before)."""
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    path = genuine(raw, range(10))
    (lf,) = list_landing(raw)
    with open(path, "a") as f:  # the exporter is still writing
        f.write("\n".join(expo_lines("GPU-aa", "NVIDIA A10G", "n1", "team", D, [11], 50, 150)))
        f.write("\n")
    parsed = parse_all([lf], cache)
    out = assemble_day(parsed, D)
    log = out.ingest_log.row(0, named=True)
    content = path.read_bytes()
    assert log["sha256"] == hashlib.sha256(content).hexdigest() != lf.sha256
    assert log["rows_read"] == log["rows_accepted"] == 22
    assert log["file_bytes"] == len(content)
    # the next listing finds the parse cached under that hash: not parsed again
    calls = []
    real_parse = cache_mod.parse_landing_file

    def counting(*a, **k):
        calls.append(1)
        return real_parse(*a, **k)

    cache_mod.parse_landing_file = counting
    try:
        again = assemble_day(parse_all(list_landing(raw), cache), D)
    finally:
        cache_mod.parse_landing_file = real_parse
    assert not calls
    assert again.ingest_log.equals(out.ingest_log)
    assert out.gpu_samples.filter(pl.col("timestamp").dt.minute() == 11).height == 1
