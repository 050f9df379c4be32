"""Analyst SQL, second pass (issue "Integrity, second pass"): links out of the lake, bounded
queries, corrupt and copied partitions, what analysts see of the views file.

Each test builds a small lake with `Lake.write` (two days of `gpu_daily` with known minutes, one
of `gpu_minutes`) and runs `gpu-pipeline sql` in a fresh process, as a user does.
"""

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import duckdb
import polars as pl
import pytest
from helpers import cli_env, minutes_frame

from gpu_pipeline.lib.io.lake import Lake

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)
MINUTES = {D1: [600, 400], D2: [1000, 40]}  # gpu_daily.minutes per GPU and day
TRUE_SUM = sum(sum(v) for v in MINUTES.values())  # 2040
SECRET = "TOP-SECRET-4f1c2b"


def make_lake(root: Path) -> Lake:
    lake = Lake(root)
    for day, mins in MINUTES.items():
        df = pl.DataFrame(
            {"gpu_uuid": [f"GPU-{i}" for i in range(len(mins))], "minutes": mins},
            schema_overrides={"minutes": pl.UInt32},
        )
        lake.write("gpu_daily", day, df)
    lake.write("gpu_minutes", D1, minutes_frame([{"gpu_util_pct": 50.0}]))
    return lake


@pytest.fixture()
def lake(tmp_path) -> Path:
    make_lake(tmp_path / "lake")
    return tmp_path / "lake"


def sql(tmp_path: Path, lake: Path, *args: str, env: dict | None = None, timeout: float = 120):
    """`gpu-pipeline sql --lake LAKE ARGS` in a fresh process; (returncode, stdout, stderr)."""
    e = {**cli_env(tmp_path), "SQL_TEST_SECRET": SECRET, **(env or {})}
    p = subprocess.run(
        [sys.executable, "-m", "gpu_pipeline.cli", "sql", "--lake", str(lake), *args],
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stdout, p.stderr


def no_traceback(out: str, err: str) -> None:
    assert "Traceback" not in out + err, out + err


# --- 1. links out of the lake ---------------------------------------------------------------


def _table_linked_to_root(lake: Path, outside: Path) -> str:
    shutil.rmtree(lake / "quarantine", ignore_errors=True)
    (lake / "quarantine").symlink_to("/")
    return f"SELECT content FROM read_text('{lake}/quarantine/etc/passwd')"


def _partition_file_linked_out(lake: Path, outside: Path) -> str:
    part = lake / "gpu_daily" / "date=2024-01-03"
    part.mkdir()
    (part / "data.parquet").symlink_to("/etc/passwd")
    return f"SELECT content FROM read_text('{part}/data.parquet')"


def _partition_folder_linked_out(lake: Path, outside: Path) -> str:
    (outside / "data.parquet").write_text(SECRET)
    (lake / "gpu_daily" / "date=2024-01-03").symlink_to(outside)
    return f"SELECT content FROM read_text('{lake}/gpu_daily/date=2024-01-03/data.parquet')"


@pytest.mark.parametrize(
    "plant", [_table_linked_to_root, _partition_file_linked_out, _partition_folder_linked_out]
)
def test_a_lake_with_links_out_of_it_is_refused(tmp_path, lake, plant):
    outside = tmp_path / "outside"
    outside.mkdir()
    query = plant(lake, outside)
    for q in (
        query,
        "SELECT 1",
        f"SELECT content FROM read_text('{lake}/../../proc/self/environ')",
    ):
        rc, out, err = sql(tmp_path, lake, q)
        assert rc == 2, out + err
        lines = err.strip().splitlines()  # errors on standard error, results on standard output
        assert len(lines) == 1 and lines[0].startswith("error: ") and "link" in lines[0], err
        assert out == "", out
        assert "root:" not in out + err and SECRET not in out + err
        no_traceback(out, err)


def test_allowed_paths_are_resolved_and_only_partitions_are_readable(tmp_path):
    """The lake reached through a link (data/lake -> elsewhere) works; SQL reads the partition
    files and nothing else, not even a stray link inside a table folder."""
    real = tmp_path / "real_lake"
    make_lake(real)
    (tmp_path / "via").symlink_to(real)
    (real / "gpu_daily" / "notes.txt").symlink_to("/etc/passwd")
    lake = tmp_path / "via"
    rc, out, err = sql(tmp_path, lake, "SELECT sum(minutes) AS m FROM gpu_daily", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["m", str(TRUE_SUM)], out + err
    for q in (
        f"SELECT content FROM read_text('{lake}/gpu_daily/notes.txt')",
        f"SELECT content FROM read_text('{real}/gpu_daily/notes.txt')",
        f"SELECT count(*) FROM read_parquet('{real}/gpu_daily/*/data.parquet')",
    ):
        rc, out, err = sql(tmp_path, lake, q)
        assert rc == 2 and "root:" not in out + err and "Permission Error" in err, out + err


# A link swapped in after the checks: the process itself (Landlock) can no longer read outside
# the table folders, whatever DuckDB's allow-list says. The driver opens the session the way
# `gpu-pipeline sql` does, says "ready", waits while the test swaps the links, runs the query,
# then reads the swapped paths again through a DuckDB connection of its own without any
# allow-list, and through Python: only the process's own rights stand there.
SWAP_DRIVER = """
import sys
import duckdb
from gpu_pipeline import cli, settings
s = settings.current().replace(lake=sys.argv[1])
session = cli.open_sql_session(s)
print("ready", flush=True)
sys.stdin.readline()
rc = cli.run_sql_session(session, sys.argv[2], "csv")
raw = duckdb.connect(config={"threads": 4})
for path in sys.argv[3:]:
    try:
        print("duckdb:", raw.sql(f"SELECT content FROM read_text('{path}')").fetchall())
    except duckdb.Error as e:
        print("duckdb:", str(e).splitlines()[0])
    try:
        print("python:", open(path).read())
    except OSError as e:
        print("python:", e.strerror)
sys.exit(rc)
"""


def test_a_link_swapped_in_after_the_checks_still_cannot_read_outside(tmp_path):
    from gpu_pipeline.lib.io.sandbox import abi

    if abi() < 1:
        pytest.skip("this kernel has no Landlock: resolution and refusal alone guard reads")
    lake = tmp_path / "lake"
    lk = make_lake(lake)
    for i in range(3, 9):  # more partitions: DuckDB reads several files on its worker threads
        lk.write("gpu_daily", date(2024, 1, i), pl.DataFrame({"gpu_uuid": ["GPU-x"]}))
    outside = tmp_path / "outside"
    (outside / "date=2024-01-01").mkdir(parents=True)
    (outside / "date=2024-01-01" / "data.parquet").write_text(SECRET)
    files = sorted((lake / "gpu_daily").glob("date=*/data.parquet"))
    moved = lake / "gpu_minutes" / "date=2024-01-01" / "data.parquet"
    query = (
        "SELECT content FROM read_text(["
        + ", ".join(f"'{f}'" for f in files)
        + f"]); SELECT content FROM read_text('{moved}')"
    )
    env = {**cli_env(tmp_path), "SQL_TEST_SECRET": SECRET}
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SWAP_DRIVER,
            str(lake),
            query,
            str(files[0]),
            str(files[-1]),
            str(moved),
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for f in files:  # every partition file becomes a link to a secret
            f.unlink()
            f.symlink_to("/etc/passwd" if f != files[-1] else "/proc/self/environ")
        shutil.rmtree(lake / "gpu_minutes")  # and a table folder becomes a link out
        (lake / "gpu_minutes").symlink_to(outside)
        out, err = p.communicate("go\n", timeout=120)
    finally:
        p.kill()
    assert p.returncode == 2 and err.startswith("error: "), out + err
    assert "root:" not in out + err and SECRET not in out + err
    tried = [line for line in out.splitlines() if line.startswith(("duckdb:", "python:"))]
    assert len(tried) == 6 and all("Permission denied" in line for line in tried), out
    no_traceback(out, err)


def test_sandbox_restricts_reads_of_threads_started_after_it(tmp_path):
    from gpu_pipeline.lib.io.sandbox import abi

    if abi() < 1:
        pytest.skip("this kernel has no Landlock")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "a.txt").write_text("fine")
    code = f"""
import threading
from gpu_pipeline.lib.io.sandbox import restrict, runtime_paths
assert restrict(None, [*runtime_paths(), {str(allowed)!r}])
out = []
def read(p):
    try:
        out.append(open(p).read()[:20])
    except PermissionError:
        out.append("denied")
for p in ({str(allowed / "a.txt")!r}, "/etc/passwd", "/proc/self/environ"):
    t = threading.Thread(target=read, args=(p,)); t.start(); t.join()
import duckdb  # lazily imported after: Python can still import what it needs
con = duckdb.connect(config={{"threads": 2}})
try:
    con.sql("SELECT * FROM read_text('/etc/passwd')").fetchall()
    out.append("READ")
except duckdb.Error as e:
    out.append("denied" if "Permission denied" in str(e) else str(e))
print(out)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "['fine', 'denied', 'denied', 'denied']", r.stdout + r.stderr


# --- 2. bounded analyst queries ---------------------------------------------------------------


def test_sql_runs_with_memory_threads_and_spill_limits(tmp_path, lake):
    env = {
        "GPU_PIPELINE_SQL_MEMORY_MB": "256",
        "GPU_PIPELINE_SQL_THREADS": "1",
        "GPU_PIPELINE_SQL_SPILL_MB": "100",
    }
    q = (
        "SELECT current_setting('memory_limit') AS m, current_setting('threads') AS t, "
        "current_setting('max_temp_directory_size') AS s"
    )
    rc, out, err = sql(tmp_path, lake, q, "--format", "csv", env=env)
    assert rc == 0, out + err
    assert out.splitlines()[1] == "256.0 MiB,1,100.0 MiB", out
    rc, out, err = sql(tmp_path, lake, q, "--format", "csv")  # the defaults
    assert rc == 0 and out.splitlines()[1].startswith("1.0 GiB,"), out + err


def test_a_query_past_the_timeout_is_interrupted_with_one_line(tmp_path, lake):
    env = {"GPU_PIPELINE_SQL_TIMEOUT_S": "2"}
    t0 = time.monotonic()
    try:
        rc, out, err = sql(
            tmp_path,
            lake,
            "SELECT count(*) FROM range(100000000000) t(i) WHERE hash(i) = 0",
            env=env,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the query ran on past its timeout")
    assert time.monotonic() - t0 < 30
    assert rc == 2 and err.strip().splitlines() == [
        "error: the query was stopped after 2 s (GPU_PIPELINE_SQL_TIMEOUT_S)"
    ], out + err
    no_traceback(out, err)


def run_with_peak(args: list[str], env: dict, stdout=subprocess.PIPE) -> tuple[int, str, str, int]:
    """`gpu-pipeline ARGS`: (returncode, stdout, stderr, peak resident KiB). The peak is the
    child's own VmHWM, polled (rusage would count the memory of the forked parent)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "gpu_pipeline.cli", *args],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak_kb = 0
    while p.poll() is None:
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
            peak_kb = max(peak_kb, int(status.split("VmHWM:")[1].split()[0]))
        except (OSError, IndexError):
            pass
        time.sleep(0.02)
    out = p.stdout.read() if p.stdout else ""
    return p.returncode, out, p.stderr.read(), peak_kb


def test_a_query_past_the_memory_limit_fails_with_one_line_and_bounded_memory(tmp_path, lake):
    env = {
        **cli_env(tmp_path),
        "GPU_PIPELINE_SQL_MEMORY_MB": "100",
        "GPU_PIPELINE_SQL_SPILL_MB": "0",
    }
    q = "SELECT max(len(l)) FROM (SELECT list(i) AS l FROM range(200000000) t(i) GROUP BY i % 3)"
    rc, out, err, peak_kb = run_with_peak(["sql", "--lake", str(lake), q], env)
    assert rc == 2, out + err
    assert err.startswith("error: Out of Memory Error"), out + err
    assert "GPU_PIPELINE_SQL_MEMORY_MB=100" in err and len(err.splitlines()) == 2, err
    assert 0 < peak_kb < 1_000_000, peak_kb  # under 1 GB (DuckDB's default limit: 80 % of RAM)
    no_traceback(out, err)


@pytest.mark.parametrize(
    "q",
    [
        "SELECT length(repeat('x', 3000000000))",  # one call: not interruptible until it returns
        "SELECT length(repeat(repeat('x', 100000), 30000))",
    ],
)
def test_memory_duckdb_allocates_outside_its_limit_is_bounded_too(tmp_path, lake, q):
    """DuckDB's memory_limit bounds its buffer manager only: these took 6 GB under a 64 MiB
    limit (adversarial review). The process's own growth is watched as well."""
    env = {**cli_env(tmp_path), "GPU_PIPELINE_SQL_MEMORY_MB": "64"}
    rc, out, err, peak_kb = run_with_peak(["sql", "--lake", str(lake), q], env)
    assert rc == 2, out + err
    assert err.strip().splitlines() == [
        "error: the query was stopped: the process's memory grew by more than 384 MiB "
        "(twice GPU_PIPELINE_SQL_MEMORY_MB=64, and 256)"
    ], out + err
    assert 0 < peak_kb < 1_200_000, peak_kb
    no_traceback(out, err)


def test_spill_files_stay_in_a_private_folder_and_are_bounded(tmp_path, lake):
    """A GROUP BY larger than memory spills (826 MB here): to this process's own folder in
    TMPDIR, stopped past GPU_PIPELINE_SQL_SPILL_MB (DuckDB's max_temp_directory_size alone did
    not hold), removed at exit."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    q = (
        "SELECT count(*) AS groups, sum(c) AS n FROM "
        "(SELECT hash(i) AS g, count(*) AS c FROM range(30000000) t(i) GROUP BY g)"
    )
    base = {**cli_env(tmp_path), "TMPDIR": str(tmp), "GPU_PIPELINE_SQL_MEMORY_MB": "100"}
    rc, out, err, _ = run_with_peak(["sql", "--lake", str(lake), "--format", "csv", q], base)
    assert rc == 0 and out.splitlines() == ["groups,n", "30000000,30000000"], out + err
    private = tmp / f"gpu-pipeline-sql-{os.getuid()}"
    assert private.is_dir() and (private.stat().st_mode & 0o777) == 0o700
    assert list(private.iterdir()) == []  # this run's folder is gone
    env = {**base, "GPU_PIPELINE_SQL_SPILL_MB": "50"}
    p = subprocess.Popen(
        [sys.executable, "-m", "gpu_pipeline.cli", "sql", "--lake", str(lake), q],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    while p.poll() is None:
        size = 0
        for dirpath, _, files in os.walk(private):
            for f in files:
                with contextlib.suppress(OSError):
                    size += os.stat(os.path.join(dirpath, f)).st_blocks * 512
        peak = max(peak, size)
        time.sleep(0.02)
    out, err = p.stdout.read(), p.stderr.read()
    assert p.returncode == 2 and err.strip().splitlines() == [
        "error: the query was stopped: its spill files passed 50 MiB (GPU_PIPELINE_SQL_SPILL_MB)"
    ], out + err
    assert 0 < peak < 400 << 20, peak
    assert list(private.iterdir()) == []
    no_traceback(out, err)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_large_result_is_streamed_not_held(tmp_path, lake, fmt):
    """20 million rows as CSV or JSON: printed as they come (all of them), in bounded memory
    (held whole, as a frame and then a string, they took 2.4 GB)."""
    q = "SELECT i, i * 2 AS j, 'row ' || i AS s FROM range(20000000) t(i)"
    out_file = tmp_path / f"out.{fmt}"
    with out_file.open("w") as f:
        rc, _, err, peak_kb = run_with_peak(
            ["sql", "--lake", str(lake), "--format", fmt, q], cli_env(tmp_path), stdout=f
        )
    assert rc == 0, err
    assert 0 < peak_kb < 600_000, peak_kb
    with out_file.open("rb") as f:
        f.seek(-200, os.SEEK_END)
        tail = f.read().decode()
    last = (
        '{"i":19999999,"j":39999998,"s":"row 19999999"}]'
        if fmt == "json"
        else "19999999,39999998,row 19999999"
    )
    assert tail.rstrip("\n").endswith(last), tail


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "q.fifo")
    return tmp_path / "q.fifo"


def _binary(tmp_path: Path) -> Path:
    (tmp_path / "b.sql").write_bytes(b"SELECT 1;\x00\xff\xfe\x89PNG")
    return tmp_path / "b.sql"


def _latin1(tmp_path: Path) -> Path:
    (tmp_path / "l.sql").write_bytes("SELECT 'café';".encode("latin-1"))
    return tmp_path / "l.sql"


def _huge(tmp_path: Path) -> Path:
    (tmp_path / "h.sql").write_text("SELECT 1;\n" * 200_000)  # 2 MB
    return tmp_path / "h.sql"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda tmp: Path("/dev/zero"), "is not a regular file"),
        (_fifo, "is not a regular file"),
        (lambda tmp: tmp, "is not a regular file"),
        (_binary, "is not UTF-8 text"),
        (_latin1, "is not UTF-8 text"),
        (_huge, "larger than 1 MiB"),
    ],
)
def test_sql_files_are_read_bounded_and_as_text(tmp_path, lake, make, says):
    def cap_memory():  # the unfixed reader of /dev/zero takes GBs: never let it take the machine
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    path = make(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "gpu_pipeline.cli", "sql", "--lake", str(lake), "-f", str(path)],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap_memory,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and says in lines[0], p.stdout + p.stderr
    assert lines[0].startswith(f"error: {path} ")
    no_traceback(p.stdout, p.stderr)


def test_sql_file_with_a_bom_and_stdin_are_read(tmp_path, lake):
    f = tmp_path / "bom.sql"
    f.write_bytes("\ufeffSELECT 'é' AS x".encode())
    rc, out, err = sql(tmp_path, lake, "-f", str(f), "--format", "csv")
    assert rc == 0 and out.splitlines() == ["x", "é"], out + err


# --- 3. a corrupt partition is skipped, not fatal -----------------------------------------------


def _garbage(f: Path) -> None:
    f.write_text("this is not parquet\n")


def _truncated(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:200])


def _bad_footer(f: Path) -> None:  # the magic is right, the footer garbage: DuckDB cannot bind it
    data = f.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    f.write_bytes(data[: -8 - n] + b"\x07" * n + data[-8:])


@pytest.mark.parametrize("corrupt", [_garbage, _truncated, _bad_footer])
def test_a_corrupt_partition_is_skipped_with_one_warning(tmp_path, lake, corrupt):
    from gpu_pipeline.lib.io.warehouse import build_views_file

    bad = lake / "gpu_daily" / "date=2024-01-02" / "data.parquet"
    corrupt(bad)
    rc, out, err = sql(tmp_path, lake, "SELECT 1 AS one", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["one", "1"], out + err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and str(bad) in warnings[0], err
    rc, out, err = sql(tmp_path, lake, "SELECT sum(minutes) AS m FROM gpu_daily", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["m", str(sum(MINUTES[D1]))], out + err
    # the views file materialize writes builds too, and reads the good partitions
    db = build_views_file(lake, tmp_path / "w.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT sum(minutes) FROM gpu_daily").fetchall() == [(sum(MINUTES[D1]),)]
        assert con.sql("SELECT count(DISTINCT date) FROM gpu_daily").fetchall() == [(1,)]


# --- 4. only date=YYYY-MM-DD partitions are read ----------------------------------------------


def test_copied_and_oddly_named_partitions_are_not_counted(tmp_path, lake):
    from gpu_pipeline.lib.io.warehouse import build_views_file

    td = lake / "gpu_daily"
    shutil.copytree(td / "date=2024-01-02", td / "date=2024-01-02.bak")
    shutil.copytree(td / "date=2024-01-02", td / "date=20240102")  # ISO "basic" format
    shutil.copytree(td / "date=2024-01-02", td / "copy of date=2024-01-01")
    shutil.copytree(td / "date=2024-01-02", td / "date=2024-02-30")  # no such day
    rc, out, err = sql(tmp_path, lake, "SELECT sum(minutes) AS m FROM gpu_daily", "--format", "csv")
    assert rc == 0 and out.splitlines() == ["m", str(TRUE_SUM)], out + err
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    for name in (
        "date=2024-01-02.bak",
        "date=20240102",
        "copy of date=2024-01-01",
        "date=2024-02-30",
    ):
        assert sum(str(td / name) in line for line in warned) == 1, (name, err)
    assert len(warned) == 4, err
    assert Lake(lake).days("gpu_daily") == [D1, D2]
    db = build_views_file(lake, tmp_path / "w.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT sum(minutes) FROM gpu_daily").fetchall() == [(TRUE_SUM,)]


# --- 5. what analysts see --------------------------------------------------------------------


def test_show_tables_lists_only_tables_and_views(tmp_path, lake):
    from gpu_pipeline.lib.io.warehouse import build_views_file, views_current

    rc, out, err = sql(tmp_path, lake, "SHOW TABLES", "--format", "csv")
    assert rc == 0 and "gpu_daily" in out and "_gpu_pipeline" not in out, out + err
    db = build_views_file(lake, tmp_path / "w.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        names = [r[0] for r in con.sql("SHOW ALL TABLES").fetchall()]
    assert not [n for n in names if n.startswith("_")], names
    assert views_current(db, lake)
    Lake(lake).write("quarantine", D1, pl.DataFrame({"reason": ["x"]}))  # a first partition
    assert not views_current(db, lake)


@pytest.mark.parametrize(
    ("query", "hint"),
    [
        ("SELECT * FROM gpu_daly", 'Did you mean "gpu_daily"'),
        ("SELECT minutess FROM gpu_daily", 'Candidate bindings: "minutes"'),
        ("SELEC 1", "LINE 1: SELEC 1"),
    ],
)
def test_errors_keep_duckdb_hints_without_a_traceback(tmp_path, lake, query, hint):
    rc, out, err = sql(tmp_path, lake, query)
    assert rc == 2 and err.startswith("error: ") and hint in err, out + err
    assert len(err.splitlines()) <= 10 and out == ""
    no_traceback(out, err)


def test_an_error_while_printing_results_is_one_error_not_a_traceback(tmp_path, lake):
    for fmt in ("table", "csv", "json"):
        rc, out, err = sql(tmp_path, lake, "SELECT 'a'::INT", "--format", fmt)
        assert rc == 2 and err.startswith("error: Conversion Error"), out + err
        no_traceback(out, err)


def test_results_are_written_column_by_column_or_refused_in_one_line():
    """Two columns of one name are each its own in CSV and JSON (by name, both were the
    first's); a geometry is its text; a time Polars cannot write (an infinite timestamp) is one
    error, not a panic (adversarial review), an infinite date its text."""
    import io
    import json

    from gpu_pipeline.lib.io.warehouse import SqlError, write_result

    con = duckdb.connect()
    q = "SELECT [1, 2] AS a, ['x'] AS a, INTERVAL 1 DAY AS i, INTERVAL 2 DAY AS i, 7 AS a"
    out = io.StringIO()
    write_result(con.sql(q), "json", out)
    assert json.loads(out.getvalue()) == [
        {"a": [1, 2], "a_1": ["x"], "i": "1 day", "i_1": "2 days", "a_2": 7}
    ]
    out = io.StringIO()
    write_result(con.sql(q), "csv", out)
    assert out.getvalue().splitlines() == ["a,a_1,i,i_1,a_2", '"[1,2]","[""x""]",1 day,2 days,7']
    for fmt in ("csv", "json"):
        with pytest.raises(SqlError):  # one line, naming the column
            write_result(con.sql("SELECT 'infinity'::TIMESTAMP AS t"), fmt, io.StringIO())
    out = io.StringIO()  # a DATE is DuckDB's text of it (the same as Polars' in years 0-9999)
    write_result(con.sql("SELECT 'infinity'::DATE AS d"), "csv", out)
    assert out.getvalue() == "d\ninfinity\n"
