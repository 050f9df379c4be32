"""The landing zone read once: a file is opened once, checked to be the one listed, hashed and
parsed from the same bytes (issue "Integrity, second pass", items 2 and 9)."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
from helpers import assemble_day, expo_lines, write_file

from gpu_pipeline.lib.ingest import cache as cache_mod
from gpu_pipeline.lib.ingest.cache import load_or_parse, parse_all
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.io.lake import Lake

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


# --- 0. a missing landing zone never wipes good partitions ---------------------------------------


def _run(tmp_path, raw, replace_missing: bool | None = None):
    import dagster as dg

    from gpu_pipeline.defs import marts, report, staging
    from gpu_pipeline.defs.raw import build_ingest
    from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource

    config = (
        {"ops": {"ingest": {"config": {"replace_missing": replace_missing}}}}
        if replace_missing is not None
        else None
    )
    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize(
        [build_ingest(), *dg.load_assets_from_modules([staging, marts, report])],
        partition_key=str(D),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(raw)),
            "reference": ReferenceResource(),
        },
        instance=instance,
        raise_on_error=False,
        run_config=config,
    )
    res.logs = [e.user_message for e in instance.all_logs(res.run_id)]
    return res


def _partitions(lake: Path) -> dict[str, bytes]:
    return {
        p.relative_to(lake).as_posix(): p.read_bytes()
        for p in sorted(lake.glob("*/date=*/data.parquet"))
    }


def test_an_unreachable_landing_zone_fails_the_run_and_changes_no_partition(tmp_path):
    raw = tmp_path / "raw"
    genuine(raw)
    assert _run(tmp_path, raw).success
    before = _partitions(tmp_path / "lake")
    assert len(before) >= 10
    for root, words in (
        (tmp_path / "not-mounted", "does not exist"),
        ("gs://bucket/landing", "only s3:// object-store landing zones are read"),
        (raw / "store" / "node.prom", "is not a folder"),
    ):
        res = _run(tmp_path, root)
        assert not res.success
        (failure,) = [e for e in res.all_events if e.is_step_failure]
        message = failure.step_failure_data.error.message.strip()
        assert words in message and "\n" not in message, message
        assert _partitions(tmp_path / "lake") == before, root


def test_a_day_whose_files_are_gone_keeps_its_partitions_unless_told(tmp_path):
    raw = tmp_path / "raw"
    genuine(raw)
    write_file(
        raw / "other.prom", expo_lines("GPU-bb", "NVIDIA A10G", "n2", "team", D, range(5), 90, 200)
    )
    assert _run(tmp_path, raw).success
    lake = Lake(str(tmp_path / "lake"))
    assert lake.read("gpu_samples", D)["gpu_uuid"].n_unique() == 2
    before = _partitions(tmp_path / "lake")
    (raw / "other.prom").unlink()  # the volume lost a file
    res = _run(tmp_path, raw)
    assert res.success
    raw_tables = ("gpu_samples", "quarantine", "ingest_log")
    after = _partitions(tmp_path / "lake")
    for name, data in before.items():
        if name.split("/")[0] in raw_tables:
            assert after[name] == data, name  # kept, byte for byte
    assert lake.read("gpu_samples", D)["gpu_uuid"].n_unique() == 2
    warned = [m for m in res.logs if "kept as it was" in m]
    assert warned and "other.prom" in warned[0]
    meta = [
        m.event_specific_data.materialization.metadata
        for m in res.get_asset_materialization_events()
        if m.asset_key.path == ["ingest_log"]
    ]
    assert meta[0]["kept"].value is True and meta[0]["files_gone"].value == ["other.prom"]
    # told otherwise: the day is made again from what is there
    assert _run(tmp_path, raw, replace_missing=True).success
    assert lake.read("gpu_samples", D)["gpu_uuid"].to_list()[:1] == ["GPU-aa"]
    assert lake.read("gpu_samples", D)["gpu_uuid"].n_unique() == 1


def test_a_new_file_of_a_kept_day_fails_the_run_instead_of_waiting_unseen(tmp_path):
    """Retention removed one of a day's files, then a late host's file landed for that day:
    the day was kept as it was, the new file's records were in no table, and the run said ok
    (adversarial review). Now the run fails and names the file and the two ways out."""
    raw = tmp_path / "raw"
    genuine(raw)
    write_file(
        raw / "other.prom", expo_lines("GPU-bb", "NVIDIA A10G", "n2", "team", D, range(5), 90, 200)
    )
    assert _run(tmp_path, raw).success
    (raw / "other.prom").unlink()
    write_file(
        raw / "late" / "n3.prom",
        expo_lines("GPU-cc", "NVIDIA A10G", "n3", "team", D, range(5), 50, 100),
    )
    res = _run(tmp_path, raw)
    assert not res.success
    lines = [m for m in res.logs if "not ingested" in m]
    assert lines and "late/n3.prom" in lines[0] and "--replace-missing" in lines[0]
    lake = Lake(str(tmp_path / "lake"))
    assert sorted(lake.read("gpu_samples", D)["gpu_uuid"].unique()) == ["GPU-aa", "GPU-bb"]
    # rewritten from the landing zone as it is: the late file is in, the gone one out
    assert _run(tmp_path, raw, replace_missing=True).success
    assert sorted(lake.read("gpu_samples", D)["gpu_uuid"].unique()) == ["GPU-aa", "GPU-cc"]


# --- 5. stray temporary files; 12. paths are literal -----------------------------------------


def test_a_killed_writes_temporary_file_is_removed_by_the_next_write(tmp_path):
    import time as _time

    lake = Lake(str(tmp_path / "lake"))
    df = pl.DataFrame({"date": [D], "source_file": ["a"]})
    path = Path(lake.write("quarantine", D, df))
    stray = path.with_name(".data.parquet.0123abcd.tmp")
    stray.write_bytes(b"half a parquet file")
    old = _time.time() - 3600
    os.utime(stray, (old, old))
    fresh = path.with_name(".data.parquet.4567cdef.tmp")  # a write in progress: not touched
    fresh.write_bytes(b"being written")
    lake.write("quarantine", D, df)
    assert not stray.exists() and fresh.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == [fresh.name, "data.parquet"]


def test_paths_with_glob_characters_are_read_as_written(tmp_path):
    from helpers import cli, cli_env

    raw, lake = tmp_path / "land[x]" / "raw", tmp_path / "lake[1]*?"
    genuine(raw)
    p = cli(
        "materialize",
        "--start",
        str(D),
        "--raw",
        str(raw),
        "--lake",
        str(lake),
        env=cli_env(tmp_path),
    )
    assert f"{D}..{D}  ok" in p.stdout
    assert Lake(str(lake)).read("gpu_samples", D).height == 10
    # DuckDB reads such a path as a glob (`a[b]` reads `ab`): SQL refuses the lake, and says so
    assert "characters not allowed in a path glob" in p.stdout
    q = cli("sql", "--lake", str(lake), "SELECT 1", env=cli_env(tmp_path), check=False)
    assert q.returncode == 2 and "characters not allowed in a path glob" in q.stdout + q.stderr


# --- 8. the run's summary tells its own truth; a day made of two ingests is caught ------------


def test_a_day_made_from_two_ingests_fails_its_check(tmp_path):
    """A run killed right after its ingest leaves new gpu_samples beside gpu_minutes of the
    older input: every partition names the ingest it was made from, and the check says so."""
    import dagster as dg

    from gpu_pipeline.defs.raw import build_ingest
    from gpu_pipeline.defs.report import daily_report
    from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource

    raw = tmp_path / "raw"
    genuine(raw)
    assert _run(tmp_path, raw).success
    lake = Lake(str(tmp_path / "lake"))
    first = lake.lineage("gpu_samples", D)
    assert first and lake.lineage("gpu_minutes", D) == first == lake.lineage("priced_waste", D)
    genuine(raw, range(20))  # new input; the next run is killed after its ingest
    res = {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "landing": LandingResource(root=str(raw)),
        "reference": ReferenceResource(),
    }
    inst = dg.DagsterInstance.ephemeral()
    assert dg.materialize(
        [build_ingest()], partition_key=str(D), resources=res, instance=inst
    ).success
    assert lake.lineage("gpu_samples", D) != first and lake.lineage("gpu_minutes", D) == first
    out = dg.materialize(
        [daily_report], partition_key=str(D), resources=res, instance=inst, raise_on_error=False
    )
    (ev,) = [e for e in out.get_asset_check_evaluations() if e.check_name == "made_from_one_ingest"]
    assert not ev.passed
    off = ev.metadata["tables_from_another_ingest"].value
    assert "gpu_minutes" in off and "priced_waste" in off and "quarantine" not in off


def test_concurrent_runs_each_print_their_own_counts(tmp_path):
    """Two `materialize` of one day on one lake with different inputs: each prints the counts of
    what it read itself, whichever wrote the lake last."""
    import re as _re

    from helpers import cli, cli_env, start_materialize

    env = cli_env(tmp_path)
    cli("init-instance", env=env)
    ra, rb = tmp_path / "a", tmp_path / "b"
    genuine(ra, range(10))  # 20 records
    genuine(rb, range(25))  # 50 records
    for _ in range(2):
        pa = start_materialize(D, ra, tmp_path / "lake", env)
        pb = start_materialize(D, rb, tmp_path / "lake", env)
        outs = [p.communicate(timeout=300)[0] for p in (pa, pb)]
        for out, n in zip(outs, (20, 50), strict=True):
            row = _re.search(rf"^  {D}\s+(\d+)\s+([\d,]+)", out, _re.M)
            assert row and int(row.group(2).replace(",", "")) == n, out


def test_a_run_left_not_started_by_a_killed_process_is_marked_failed(tmp_path):
    import socket
    import subprocess
    import sys

    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun
    from helpers import cli, cli_env, materialize_args

    env = cli_env(tmp_path)
    cli("init-instance", env=env)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        run = DagsterRun(
            job_name="daily_pipeline",
            run_id="1" * 8 + "-0000-0000-0000-000000000000",
            status=dg.DagsterRunStatus.NOT_STARTED,
            tags={"gpu_pipeline/host": socket.gethostname(), "gpu_pipeline/pid": str(dead.pid)},
        )
        inst.add_run(run)
    genuine(tmp_path / "raw")
    p = cli(*materialize_args(D, tmp_path / "raw", tmp_path / "lake"), env=env)
    assert "left unfinished by a killed process: marked failed" in p.stdout
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        assert inst.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


# --- 6. memory follows a budget, not the file ----------------------------------------------------


def _pieces_equal_whole(path: Path, piece_bytes: int) -> int:
    from gpu_pipeline.lib.ingest.landing import PieceParse, merge_pieces

    (lf,) = list_landing(path.parent)
    whole = PieceParse(lf, piece_bytes=1 << 30)
    (one,) = list(whole)
    pp = PieceParse(lf, piece_bytes=piece_bytes)
    parts = list(pp)
    assert pp.rejected is None and whole.rejected is None
    fmt, merged = merge_pieces(parts)
    assert fmt == one[0]
    a, b = one[1], merged
    order = ["line", "column"]
    assert a.samples.sort(order).equals(b.samples.sort(order))
    assert a.quarantine.sort("line").equals(b.quarantine.sort("line"))
    assert (a.lines_total, a.lines_skipped, a.records_by_day) == (
        b.lines_total,
        b.lines_skipped,
        b.records_by_day,
    )
    assert pp.sha256 == whole.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    return len(parts)


def test_a_header_written_again_in_a_later_piece_reads_the_rows_after_it(tmp_path):
    """A CSV over the piece size whose second header (other column order) falls in a later
    piece: those rows were read with the first header, put in front of every piece (power and
    utilization swapped, nothing quarantined; review of the mid-file header fix)."""
    u = "GPU-aaaaaaaa-1111-1111-1111-111111111111"
    lines = ["timestamp, uuid, utilization.gpu [%], power.draw [W]"]
    for s in range(3000):
        if s == 1000:
            lines.append("timestamp, uuid, power.draw [W], utilization.gpu [%]")
        if s == 2000:
            lines.append("timestamp, uuid, utilization.gpu [%], power.draw [W]")
        t = f"2024/01/01 {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.000"
        lines.append(
            f"{t}, {u}, 10 %, 60.00 W" if s < 1000 or s >= 2000 else f"{t}, {u}, 60.00 W, 10 %"
        )
    path = tmp_path / "raw" / "big.csv"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    for size in (4096, 65536, 20000):
        _pieces_equal_whole(path, size)
    from gpu_pipeline.lib.ingest.landing import PieceParse, merge_pieces

    (lf,) = list_landing(path.parent)
    _, out = merge_pieces(list(PieceParse(lf, piece_bytes=4096)))
    s = out.samples
    assert set(s.filter(pl.col("column") == "gpu_util_pct")["value"]) == {10.0}
    assert set(s.filter(pl.col("column") == "power_w")["value"]) == {60.0}
    assert out.quarantine.height == 0 and out.lines_skipped == 3


def test_a_file_parsed_in_pieces_is_the_file_parsed_whole(tmp_path):
    import gzip

    # exposition with comments, a bad line now and then, two GPUs; gzipped
    lines = []
    for m in range(600):
        lines += expo_lines("GPU-aa", "NVIDIA A10G", "n1", "team", D, [m], 50 + m % 40, 150)
        if m % 97 == 0:
            lines += ["# HELP x", 'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-aa"} notanumber 1704067200000']
    text = ("\n".join(lines) + "\n").encode()
    expo = tmp_path / "e" / "scrape.prom.gz"
    expo.parent.mkdir()
    expo.write_bytes(gzip.compress(text))
    assert _pieces_equal_whole(expo, 16384) > 5
    # an nvidia-smi loop without identity, pieces cut inside iterations
    rows = ["timestamp, power.draw [W], utilization.gpu [%]"]
    for i in range(800):
        for g in range(3):
            ms = 100 * i + g
            rows.append(
                f"2024/01/01 10:{ms // 60000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}, {100 + g} W, {g} %"
            )
    csv = tmp_path / "c" / "loop.csv"
    csv.parent.mkdir()
    csv.write_text("\n".join(rows) + "\n")
    assert _pieces_equal_whole(csv, 4096) > 5


def test_a_file_in_pieces_decides_its_times_once(tmp_path):
    """A timed dump with plain scrapes (no timestamps) appended: in pieces, the last piece is
    mostly untimed, yet its lines are quarantined as in the file parsed whole (`curl` lines in
    a timed file are not filed at the modification time), not filed on that day."""
    lines = []
    for m in range(400):
        lines += expo_lines("GPU-aa", "NVIDIA A10G", "n1", "team", D, [m], 50 + m % 40, 150)
    labels = '{gpu="0",UUID="GPU-aa",modelName="NVIDIA A10G",Hostname="n1"}'
    lines += [f"DCGM_FI_DEV_GPU_UTIL{labels} 5"] * 30  # three plain scrapes, no times
    path = tmp_path / "e" / "dump.prom"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    mtime = datetime(2024, 1, 3, 12, tzinfo=UTC).timestamp()
    os.utime(path, (mtime, mtime))
    assert _pieces_equal_whole(path, 4096) > 5
    from gpu_pipeline.lib.ingest.landing import PieceParse, merge_pieces

    (lf,) = list_landing(path.parent)
    _, merged = merge_pieces(list(PieceParse(lf, piece_bytes=4096)))
    assert merged.samples.height == 800 and merged.time_basis == "sample"
    assert merged.quarantine.height == 30
    assert merged.quarantine["reason"].str.contains("no timestamp on this line").all()
    assert merged.records_by_day == {D: 800, None: 30}  # none filed on the 3rd


def test_a_large_files_parse_peaks_within_the_budget(tmp_path):
    """A 15 MiB .prom.gz that inflates to 700 MiB peaked at 1.9 GiB before; in pieces the peak
    follows the piece, ~0.85 GiB whatever the file (measured in a fresh process: its own VmHWM
    after the file is written)."""
    import subprocess
    import sys

    script = f"""
import gzip, os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from helpers import expo_lines
from datetime import date
raw = Path({str(tmp_path / "raw")!r}); raw.mkdir()
D = date(2024, 1, 1)
with gzip.open(raw / "big.prom.gz", "wt", compresslevel=1) as f:
    for g in range(40):
        f.write("\\n".join(expo_lines(f"GPU-{{g:04d}}", "NVIDIA A10G", f"host-{{g // 8}}-with-a-long-name", "team", D, range(1440), 50, 150, gpu=g % 8) * 36) + "\\n")
open("/proc/self/clear_refs", "w").write("5")
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing
(lf,) = list_landing(raw)
pf = load_or_parse(lf, {str(tmp_path / "cache")!r})
hwm = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) // 1024
print(hwm, sum(pf.rows_by_day.values()), gzip.open(raw / "big.prom.gz").seek(0, 2))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    peak_mib, rows, text_bytes = map(int, out.stdout.split())
    assert text_bytes > 650 * 2**20  # the file is eleven pieces
    assert rows == 40 * 1440 * 2 * 36  # every line a sample (duplicates are the assembly's)
    assert peak_mib < 1100, f"{peak_mib} MiB for {text_bytes / 2**20:.0f} MiB of text"


def test_a_json_document_larger_than_a_piece_is_refused_with_why(tmp_path):
    import json as _json

    from gpu_pipeline.lib.ingest.landing import PieceParse

    doc = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"x": "y" * 100}] * 2000},
    }
    path = tmp_path / "raw" / "big.json"
    path.parent.mkdir()
    path.write_text(_json.dumps(doc))
    (lf,) = list_landing(path.parent)
    pp = PieceParse(lf, piece_bytes=65536)
    assert list(pp) == []
    fmt, out = pp.rejected
    assert (
        fmt == "prometheus_json"
        and "document over 65,536 bytes: not read" in out.quarantine["reason"][0]
    )
    assert pp.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
