"""Integrity under attack: analysts cannot write, the lake cannot be forged, the landing zone
cannot leak, one file never stops a run, the checks can fail (issue "Integrity", items 1-10).

SPEC "Promises", and where each is attacked here:
- bad input never crashes a run, nothing lost silently: the malformed-input, bomb, odd-label,
  unreadable-file and conflict tests (and tests/test_properties.py);
- re-materializing gives the same contents, a killed run leaves a whole version:
  tests/test_pipeline.py (same bytes), tests/test_operations.py (SIGKILL), the concurrency test;
- analyst SQL is read-only, no user text spliced into SQL or paths: every DuckDB statement
  type, the file-level sandbox, `--lake /`, a quote in the lake path (tests/test_warehouse.py);
- a day of legitimate data never fails, MIG counts once: tests/test_real_fleets.py.
"""

import gzip
import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest
from helpers import (
    MODELS,
    assemble_day,
    cli,
    cli_env,
    expo_lines,
    materialize_args,
    ms,
    start_materialize,
    write_file,
)

from gpu_pipeline.defs import checks
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 10)


def run_query(con, sql: str):
    from gpu_pipeline.lib.io.warehouse import run_queries

    """The last statement's result of analyst SQL (the earlier ones run and are dropped)."""
    last = None
    for rel in run_queries(con, sql):
        if last is not None:
            last.fetchall()
        last = rel
    return last


def day_file(path: Path, uuid: str = "GPU-A", power: float = 200.0, minutes=range(30)) -> Path:
    return write_file(
        path, expo_lines(uuid, MODELS["A100"], "n1", "ns", D, minutes, 80, power, gpu=0)
    )


def materialize(tmp_path: Path, raw: Path, lake: Path, check=True, day: date = D):
    return cli(*materialize_args(day, raw, lake), env=cli_env(tmp_path), check=check)


def tree_digest(root: Path) -> dict[str, str]:
    """Every file below root with its sha256 (what an attack must not change)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lake")
    day_file(tmp / "raw" / "n1_2024-01-10.prom")
    materialize(tmp, tmp / "raw", tmp / "lake")
    return tmp


# --- 1. analyst SQL cannot write -----------------------------------------------------------------

# one statement of every type DuckDB has; None: a type no SQL text produces
ATTACKS = {
    "ALTER": "ALTER VIEW gpu_minutes RENAME TO x",
    "ANALYZE": None,  # DuckDB 2.0 parses ANALYZE as a VACUUM statement (tried below)
    "ATTACH": "ATTACH '{lake}/evil.duckdb' AS evil",
    "CALL": "CALL pragma_version()",
    "COPY": "COPY (SELECT 1 AS a) TO '{lake}/priced_waste/date=2099-01-01/data.parquet'",
    "COPY_DATABASE": "COPY FROM DATABASE memory TO evil (SCHEMA)",
    "CREATE": "CREATE TABLE t AS SELECT 1",
    "CREATE_FUNC": None,  # CREATE MACRO / FUNCTION parse as CREATE (tried below)
    "DELETE": "DELETE FROM gpu_minutes",
    "DETACH": "DETACH memory",
    "DROP": "DROP VIEW gpu_minutes",
    "EXECUTE": "EXECUTE p",
    "EXPLAIN": "EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{lake}/gpu_minutes/date=2024-01-10/data.parquet'",
    "EXPORT": "EXPORT DATABASE '{lake}/export'",
    "EXTENSION": None,  # INSTALL parses as LOAD (tried below)
    "INSERT": "INSERT INTO gpu_minutes SELECT * FROM gpu_minutes",
    "INVALID": None,
    "LOAD": "INSTALL httpfs",
    "LOGICAL_PLAN": None,
    "MERGE_INTO": "MERGE INTO gpu_minutes USING gpu_minutes AS s ON false WHEN NOT MATCHED THEN INSERT *",
    "MULTI": "PIVOT (SELECT 1 AS a) ON a",
    "PRAGMA": "PRAGMA enable_profiling",
    "PREPARE": "PREPARE p AS SELECT 1",
    "RELATION": None,
    "SELECT": "SELECT count(*) FROM gpu_minutes",
    "SET": "SET enable_external_access = true",
    "TRANSACTION": "BEGIN TRANSACTION",
    "UPDATE": "UPDATE gpu_minutes SET power_w = 1.0",
    "VACUUM": "VACUUM",
    "VARIABLE_SET": None,  # SET VARIABLE parses as SET (tried below)
}


def test_every_duckdb_statement_type_is_covered():
    # a DuckDB upgrade that adds a statement type makes this fail until the type is tried below
    assert sorted(ATTACKS) == sorted(t for t in dir(duckdb.StatementType) if t.isupper())


@pytest.mark.parametrize("kind", sorted(k for k, v in ATTACKS.items() if v))
def test_only_plain_reads_pass_the_gate(lake, kind):
    from gpu_pipeline.lib.io.warehouse import SqlError, connect_readonly

    root = lake / "lake"
    sql = ATTACKS[kind].format(lake=root)
    before = tree_digest(root)
    con = connect_readonly(root, root / "_warehouse.duckdb")
    assert con.extract_statements(sql)[0].type.name == kind
    if kind == "SELECT":
        assert run_query(con, sql).fetchall() == [(30,)]
    else:
        with pytest.raises(SqlError, match="only read queries are allowed"):
            run_query(con, sql)
    assert tree_digest(root) == before


@pytest.mark.parametrize(
    "sql",
    [
        "EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{lake}/gpu_minutes/date=2024-01-10/data.parquet'",
        "COPY (SELECT * FROM priced_waste) TO '{lake}/priced_waste' (FORMAT parquet, PARTITION_BY (date))",
        "/* hidden */ EXPLAIN (ANALYZE) SELECT 1",
        "SELECT 1; COPY (SELECT 1.0 AS power_w) TO '{lake}/_ingest_cache/x.parquet'",
        "EXPLAIN COPY (SELECT 1) TO '{lake}/x.csv'",
        "CREATE MACRO m(a) AS a",
        "SET VARIABLE x = 1",
        "PRAGMA profiling_output='{lake}/p.txt'",
        "UPDATE EXTENSIONS",
        "LOAD httpfs",
        "ANALYZE",
    ],
)
def test_the_sql_command_refuses_writes_and_the_lake_is_unchanged(lake, sql):
    root = lake / "lake"
    before = tree_digest(root)
    p = cli("sql", "--lake", str(root), sql.format(lake=root), env=cli_env(lake), check=False)
    assert p.returncode == 2 and p.stderr.startswith("error: only read queries"), p.stderr
    assert tree_digest(root) == before


SANDBOX = """
import sys, duckdb
from gpu_pipeline.lib.io.sandbox import deny_writes
assert deny_writes(), "Landlock unavailable"
con = duckdb.connect()
try:
    con.execute(f"COPY (SELECT 1 AS a) TO '{sys.argv[1]}/gpu_minutes/forged.parquet'")
except duckdb.Error as e:
    print("refused:", e)
else:
    print("WROTE")
"""


def test_the_sql_process_cannot_write_files_even_past_the_gate(lake):
    from gpu_pipeline.lib.io.sandbox import abi

    if abi() < 1:
        pytest.skip("this kernel has no Landlock: the statement gate alone guards writes")
    root = lake / "lake"
    out = subprocess.run(
        [sys.executable, "-c", SANDBOX, str(root)], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("refused:") and "Permission denied" in out
    assert not (root / "gpu_minutes" / "forged.parquet").exists()


# --- 3. --lake must name a lake; sql never writes ----------------------------------------------


def test_sql_refuses_a_folder_that_is_not_a_lake_and_writes_nothing(tmp_path):
    secret = tmp_path / "not_a_lake"
    secret.mkdir()
    (secret / "passwords.csv").write_text("user,password\nroot,hunter2\n")
    before = sorted(p.name for p in secret.rglob("*"))
    for lake in (secret, Path("/")):
        p = cli("sql", "--lake", str(lake), "SELECT 1", env=cli_env(tmp_path), check=False)
        assert p.returncode == 2 and "is not a gpu_pipeline lake" in p.stderr, p.stdout + p.stderr
    assert sorted(p.name for p in secret.rglob("*")) == before


def test_sql_cannot_read_beyond_the_tables(lake):
    root = lake / "lake"
    for sql in (
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT count(*) FROM read_parquet('{root}/_ingest_cache/*/samples-*.parquet')",
    ):
        p = cli("sql", "--lake", str(root), sql, env=cli_env(lake), check=False)
        assert p.returncode == 2 and "Permission Error" in p.stderr, p.stdout + p.stderr


# --- 2. the ingest cache keys and checks itself by content ---------------------------------------


def test_an_edit_in_place_with_its_mtime_restored_is_read_again(tmp_path):
    raw = tmp_path / "raw"
    f = day_file(raw / "n1.prom", power=177.0)
    st = os.stat(f)
    first = assemble_day(
        [load_or_parse(x, tmp_path / "c") for x in list_landing(raw, tmp_path / "c" / "m")], D
    )
    assert set(first.gpu_samples["power_w"]) == {177.0}
    f.write_text(f.read_text().replace(" 177.000 ", " 188.000 "))  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(f).st_size == st.st_size and os.stat(f).st_mtime_ns == st.st_mtime_ns
    again = assemble_day(
        [load_or_parse(x, tmp_path / "c") for x in list_landing(raw, tmp_path / "c" / "m")], D
    )
    assert set(again.gpu_samples["power_w"]) == {188.0}


def test_an_altered_cache_file_is_not_trusted(tmp_path):
    raw = tmp_path / "raw"
    day_file(raw / "n1.prom", power=177.0)
    (lf,) = list_landing(raw)
    load_or_parse(lf, tmp_path / "c")
    (cached,) = (tmp_path / "c").glob("*/samples-*.parquet")
    forged = pl.read_parquet(cached).with_columns(pl.lit(1.0).alias("value"))
    forged.write_parquet(cached)
    out = assemble_day([load_or_parse(lf, tmp_path / "c")], D)
    assert set(out.gpu_samples["power_w"]) == {177.0}


# --- 4. the landing zone cannot leak --------------------------------------------------------------


def test_links_out_of_the_landing_zone_are_refused_and_never_read(tmp_path):
    raw = tmp_path / "raw"
    day_file(raw / "good.prom")
    secret = tmp_path / "secret.txt"
    secret.write_text('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-s"} 42 1704880000000\nTOP SECRET\n')
    (raw / "h9_2026-01-05.prom").symlink_to(secret)
    (raw / "proc_mem.prom").symlink_to("/proc/self/mem")
    (raw / "dangling.prom").symlink_to(tmp_path / "gone.prom")
    (raw / "loop_a.prom").symlink_to(raw / "loop_b.prom")
    (raw / "loop_b.prom").symlink_to(raw / "loop_a.prom")
    (raw / "inside.prom").symlink_to(raw / "good.prom")  # inside the zone: read (a duplicate)
    files = {f.source_file: f for f in list_landing(raw)}
    assert files["inside.prom"].problem is None
    for name in ("h9_2026-01-05.prom", "proc_mem.prom"):
        assert "outside the landing zone" in files[name].problem
    for name in ("dangling.prom", "loop_a.prom", "loop_b.prom"):
        assert "cannot be followed" in files[name].problem
    parsed = [load_or_parse(f, tmp_path / "c") for f in files.values()]
    days = {d for p in parsed for d in [*p.days, p.home_day]}
    q = pl.concat([assemble_day(parsed, d).quarantine for d in days])
    assert "TOP SECRET" not in "".join(q["raw"].fill_null("")) and "42" not in "".join(
        q["raw"].fill_null("")
    )
    refused = q.filter(pl.col("reason").str.contains("symbolic link"))
    assert sorted(refused["source_file"]) == sorted(
        ["h9_2026-01-05.prom", "proc_mem.prom", "dangling.prom", "loop_a.prom", "loop_b.prom"]
    )


# --- 5. one file never stops a run ---------------------------------------------------------------


def test_unreadable_odd_and_strangely_named_files_are_records_not_failures(tmp_path, monkeypatch):
    import gpu_pipeline.lib.ingest.landing as ingest

    raw = tmp_path / "raw"
    day_file(raw / "good_2024-01-10.prom")
    os.mkfifo(raw / "pipe.prom")
    odd = os.fsencode(str(raw)) + b"/\xff\xfe_2024-01-10.prom"
    with open(odd, "wb") as f:
        f.write((raw / "good_2024-01-10.prom").read_bytes().replace(b"GPU-A", b"GPU-B"))
    (raw / "locked.prom").write_text("x")
    real = ingest.open_landing

    def no_permission(target, ident):
        if Path(target).name == "locked.prom":  # as root, chmod 000 would not stop the read
            raise PermissionError(13, "Permission denied")
        return real(target, ident)

    monkeypatch.setattr(ingest, "open_landing", no_permission)
    on_d = datetime(2024, 1, 10, 12, tzinfo=UTC).timestamp()  # refused files: home day = mtime
    for p in ("pipe.prom", "locked.prom"):
        os.utime(raw / p, (on_d, on_d))
    files = {f.source_file: f for f in list_landing(raw)}
    assert files["pipe.prom"].problem.startswith("not a regular file (FIFO)")
    assert files["locked.prom"].problem == "cannot be read: Permission denied"
    assert files["\\xff\\xfe_2024-01-10.prom"].problem is None
    out = assemble_day([load_or_parse(f, tmp_path / "c") for f in files.values()], D)
    assert set(out.gpu_samples["gpu_uuid"]) == {"GPU-a", "GPU-b"}
    log = {r["source_file"]: r for r in out.ingest_log.iter_rows(named=True)}
    assert log["locked.prom"]["rows_quarantined"] == 1 and log["locked.prom"]["format"] == "refused"
    assert checks.row_conservation(out.ingest_log).passed


# --- 6. odd label values never fail a day -------------------------------------------------------


def test_odd_uuid_labels_are_quarantined_or_resolved_and_the_day_runs(tmp_path):
    raw = tmp_path / "raw"
    t = ms(D, 600)
    lines = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D, range(600, 630), 80, 200.0)
    for uuid in ("GPU-abc def", "GPU-ünï", "MIG-3b6f/1/2", "MIG-1b2c3d4e-0000"):
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{uuid}",Hostname="n1"}} 50 {t}')
    write_file(raw / "n1_2024-01-10.prom", lines)
    p = materialize(tmp_path, raw, tmp_path / "lake")
    assert "ok  run" in p.stdout
    lake = Lake(tmp_path / "lake")
    s = lake.read("gpu_samples", D)
    # an old-style MIG device UUID names its GPU and instance: kept, on its physical GPU
    mig = s.filter(pl.col("gpu_uuid") == "GPU-3b6f")
    assert mig["gpu_instance_id"].to_list() == [1]
    reasons = lake.read("quarantine", D)["reason"].to_list()
    assert sum("is not a UUID" in r for r in reasons) == 2
    assert sum("names no parent GPU" in r for r in reasons) == 1


# --- 7. row_conservation can fail ---------------------------------------------------------------


def test_row_conservation_fails_on_a_planted_loss(tmp_path):
    raw = tmp_path / "raw"
    day_file(raw / "n1.prom")
    (pf,) = [load_or_parse(f, tmp_path / "c") for f in list_landing(raw)]
    assert checks.row_conservation(assemble_day([pf], D).ingest_log).passed
    pf.samples = pf.samples.filter(pl.col("line") % 7 != 0)  # lines lost between parse and day
    out = assemble_day([pf], D)
    res = checks.row_conservation(out.ingest_log)
    assert not res.passed and res.metadata["files_off"].value == 1
    assert out.ingest_log["rows_read"][0] == 60  # what the parser read, not what arrived


# --- 8. no rows on days nobody runs -------------------------------------------------------------


def test_files_and_lines_without_a_plausible_time_stay_on_a_real_day(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    f = raw / "scrape.prom"  # no timestamps, modification time 1970
    f.write_text('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1"} 5\nthis is garbage\n')
    os.utime(f, (0, 0))
    j = raw / "q.json"
    j.write_text(
        json.dumps(
            {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [
                        {
                            "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-2"},
                            "values": [[True, "7"], [-1704880000.0, "8"], [1704880000, "9"]],
                        }
                    ],
                },
            }
        )
    )
    parsed = {
        p.file.source_file: p for p in (load_or_parse(x, tmp_path / "c") for x in list_landing(raw))
    }
    today = datetime.now(UTC).date()
    assert parsed["scrape.prom"].home_day == today and parsed["scrape.prom"].days == []
    assert parsed["q.json"].days == [date(2024, 1, 10)]
    out = assemble_day(list(parsed.values()), date(2024, 1, 10))
    q = out.quarantine.filter(pl.col("source_file") == "q.json")
    reasons = sorted(q["reason"])
    assert len(reasons) == 2
    assert reasons[0].startswith("data.result[0].values[0]: the timestamp is not a number")
    assert reasons[1].startswith("implausible sample time -1704880000000 ms")
    assert all(d >= date(2000, 1, 1) for p in parsed.values() for d in [*p.days, p.home_day])


# --- 9. concurrent runs of one day; killed runs -------------------------------------------------


def test_concurrent_runs_of_one_day_leave_one_runs_tables(tmp_path):
    lake = tmp_path / "lake"
    for name, uuid in (("a", "GPU-A"), ("b", "GPU-B")):
        day_file(tmp_path / f"raw_{name}" / f"{name}_2024-01-10.prom", uuid, minutes=range(240))
    env = cli_env(tmp_path)
    cli("init-instance", env=env)
    for _ in range(3):
        procs = [start_materialize(D, tmp_path / f"raw_{n}", lake, env) for n in ("a", "b")]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        # a run that finds the other's file gone from its landing zone and its own new keeps
        # the day and fails, naming the file it did not ingest
        codes = [p.returncode for p in procs]
        assert 0 in codes and set(codes) <= {0, 1}, outs
        assert all("not ingested" in o for o, c in zip(outs, codes, strict=True) if c), outs
        lk = Lake(lake)
        uuids = {
            t: set(lk.read(t, D)["gpu_uuid"])
            for t in ("gpu_samples", "gpu_minutes", "gpu_daily", "gpu_health")
        }
        source = set(lk.read("ingest_log", D)["source_file"])
        # every table of the day from the same run (its own landing zone, its own GPU)
        assert len({frozenset(v) for v in uuids.values()}) == 1, uuids
        expected = (
            {"a_2024-01-10.prom"} if uuids["gpu_samples"] == {"GPU-a"} else {"b_2024-01-10.prom"}
        )
        assert source == expected


def test_a_run_waits_for_the_day_another_writer_holds(tmp_path):
    """Deterministic: while the day's lock is held (as another run holds it), a run of that day
    writes nothing and says it waits (without --verbose: a silent terminal looked hung); when
    it is released, the run completes. The run's lines are read until it says so (a fixed
    sleep was shorter than the run's start on a loaded machine)."""
    import time

    day_file(tmp_path / "raw" / "n1_2024-01-10.prom")
    env = cli_env(tmp_path)
    cli("init-instance", env=env)
    lake = Lake(tmp_path / "lake")
    waits = f"{D}: waiting for another run writing this day in {lake.root} to finish"
    lines: list[str] = []
    with lake.day_locks([D]):
        p = start_materialize(D, tmp_path / "raw", lake.root, env)
        deadline = time.monotonic() + 240
        while not any(waits in ln for ln in lines) and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:  # the run ended without waiting
                break
            lines.append(line)
        assert any(waits in ln for ln in lines), "".join(lines)
        time.sleep(2)  # still waiting, nothing written
        assert p.poll() is None, "".join(lines) + p.communicate()[0]
        assert not lake.exists("gpu_samples", D) and not lake.exists("gpu_minutes", D)
    out = "".join(lines) + p.communicate(timeout=300)[0]
    assert p.returncode == 0, out
    assert lake.read("gpu_minutes", D).height == 30


def test_a_run_left_started_by_a_killed_process_is_marked_failed(tmp_path):
    import socket

    from dagster._core.storage.dagster_run import DagsterRun

    env = cli_env(tmp_path)
    cli("init-instance", env=env)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        run = DagsterRun(
            job_name="daily_pipeline",
            run_id="0" * 8 + "-0000-0000-0000-000000000000",
            status=dg.DagsterRunStatus.STARTED,
            tags={"gpu_pipeline/host": socket.gethostname(), "gpu_pipeline/pid": str(dead.pid)},
        )
        inst.add_run(run)
    day_file(tmp_path / "raw" / "n1_2024-01-10.prom")
    p = materialize(tmp_path, tmp_path / "raw", tmp_path / "lake")
    assert "left unfinished by a killed process: marked failed" in p.stdout
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        assert inst.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


# --- 10. resource bombs -------------------------------------------------------------------------

BOMB = """
import sys
from pathlib import Path
# this process's own peak: ru_maxrss would carry the pytest parent's over exec
Path("/proc/self/clear_refs").write_text("5")
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.ingest.cache import load_or_parse
(lf,) = list_landing(sys.argv[1])
pf = load_or_parse(lf, sys.argv[2])
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(pf.format, hwm // 1024)
print(pf.quarantine.collect()["reason"][0])
"""


def test_a_gzip_bomb_is_refused_without_reaching_memory(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    # ~1 MiB of gzip that decompresses to 1 GiB of zeros, written in pieces (no GiB in this test)
    with gzip.open(raw / "bomb_2024-01-10.prom.gz", "wb", compresslevel=9) as f:
        block = b"\0" * (1 << 24)
        for _ in range(64):
            f.write(block)
    assert (raw / "bomb_2024-01-10.prom.gz").stat().st_size < 2 << 20
    out = subprocess.run(
        [sys.executable, "-c", BOMB, str(raw), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    fmt, peak_mib = out[0].split()
    # imports alone take ~150 MiB; 1 GiB of zeros never reaches memory
    assert fmt == "unreadable" and int(peak_mib) < 400, out
    assert out[1].startswith("binary content")


def test_a_fifty_megabyte_label_is_one_short_quarantine_row(tmp_path):
    raw = tmp_path / "raw"
    huge = "X" * 50_000_000
    day_file(raw / "good.prom")
    write_file(
        raw / "huge.prom",
        [f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-h",modelName="{huge}"}} 50 {ms(D, 5)}'],
    )
    out = assemble_day([load_or_parse(f, tmp_path / "c") for f in list_landing(raw)], D)
    q = out.quarantine.filter(pl.col("source_file") == "huge.prom")
    assert q["reason"].to_list() == ["label value longer than 1024 bytes: line not read"]
    assert len(q["raw"][0]) < 3000
    assert set(out.gpu_samples["gpu_uuid"]) == {"GPU-a"}


# --- smaller, same spirit -----------------------------------------------------------------------


def test_infinities_huge_values_and_bad_bytes_are_quarantined_by_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    t = ms(D, 5)
    lab = '{UUID="GPU-z",gpu="0"}'
    body = (
        f"DCGM_FI_DEV_POWER_USAGE{lab} +Inf {t}\n"
        f"DCGM_FI_DEV_POWER_USAGE{lab} 1e300 {t + 60000}\n"
        f"DCGM_FI_DEV_FB_USED{lab} 1e308 {t}\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{lab} 1e300 {t}\n"
        f"DCGM_FI_DEV_GPU_UTIL{lab} 1e30 {t}\n"
        f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-z",pod="p\\x00"}} 10 {t + 120000}\n'
    ).encode()
    body = (
        body.replace(b"\\x00", b"\x00")
        + b'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-z",pod="\xff"} 9 '
        + str(t + 180000).encode()
        + b"\n"
    )
    body += f"DCGM_FI_DEV_GPU_UTIL{lab} 33 {t + 240000}\n".encode()
    (raw / "f.prom").write_bytes(body)
    (pf,) = [load_or_parse(f, tmp_path / "c") for f in list_landing(raw)]
    q = pf.quarantine.collect().sort("line")
    assert q["line"].to_list() == [1, 2, 3, 4, 5, 6, 7]
    assert all(r.startswith("impossible value") for r in q["reason"][:5])
    assert q["reason"][5] == "line has NUL bytes: not text"
    assert q["reason"][6].startswith("line is not UTF-8 text")
    assert pf.samples.collect()["value"].to_list() == [33.0]


def test_conflicting_duplicates_are_quarantined_with_both_values(tmp_path):
    raw = tmp_path / "raw"
    day_file(raw / "a.prom", power=200.0, minutes=range(3))
    day_file(raw / "b.prom", power=250.0, minutes=range(3))  # another exporter, other power
    day_file(raw / "c.prom", power=200.0, minutes=range(3))  # the same again: plain duplicates
    out = assemble_day([load_or_parse(f, tmp_path / "c") for f in list_landing(raw)], D)
    log = {r["source_file"]: r for r in out.ingest_log.iter_rows(named=True)}
    assert (log["b.prom"]["rows_quarantined"], log["b.prom"]["rows_duplicate"]) == (3, 3)
    assert (log["c.prom"]["rows_quarantined"], log["c.prom"]["rows_duplicate"]) == (0, 6)
    reason = out.quarantine.filter(pl.col("source_file") == "b.prom")["reason"][0]
    assert "power_w" in reason and "250" in reason and "200" in reason and "a.prom" in reason
    assert set(out.gpu_samples["power_w"]) == {200.0}
    assert checks.row_conservation(out.ingest_log).passed


def test_quoted_commas_duplicate_labels_and_json_shapes(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "s.csv").write_text(
        "timestamp, name, uuid, utilization.gpu [%]\n"
        '2024/01/10 10:00:00.000, "NVIDIA A100, 40GB", GPU-1, 50 %\n'
    )
    (raw / "d.prom").write_text(
        f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-2",gpu="0",gpu="1"}} 5 {ms(D, 1)}\n'
    )
    (raw / "bad.json").write_text(json.dumps({"status": "success", "data": [1, 2]}))
    parsed = {
        p.file.source_file: p for p in (load_or_parse(f, tmp_path / "c") for f in list_landing(raw))
    }
    assert parsed["s.csv"].samples.collect()["gpu_model"].to_list() == ["NVIDIA A100, 40GB"]
    (why,) = parsed["d.prom"].quarantine.collect()["reason"].to_list()
    assert why == "label 'gpu' appears twice in one series"
    (why,) = parsed["bad.json"].quarantine.collect()["reason"].to_list()
    assert 'field "data" is not an object' in why and "Error" not in why


def test_timestamp_units_are_decided_once_per_file(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lab = '{UUID="GPU-1"}'
    # milliseconds below 1e11 (1972): not read as seconds one by one, but judged with the file
    t0 = 86_400_000
    (raw / "ms.prom").write_text(
        "".join(f"DCGM_FI_DEV_GPU_UTIL{lab} 5 {t0 + 60_000 * i}\n" for i in range(60))
    )
    # float milliseconds (OpenMetrics floats are seconds; these are plainly ms)
    t1 = ms(D, 0)
    (raw / "fms.prom").write_text(
        "".join(f"DCGM_FI_DEV_GPU_UTIL{lab} 5 {t1 + 60_000 * i}.5\n" for i in range(3))
    )
    parsed = {
        p.file.source_file: p for p in (load_or_parse(f, tmp_path / "c") for f in list_landing(raw))
    }
    assert parsed["fms.prom"].days == [D]
    ms_file = parsed["ms.prom"]
    assert ms_file.days == []  # 1972 in ms is implausible: quarantined, not spread over 42 days
    assert ms_file.quarantine.collect().height == 60
