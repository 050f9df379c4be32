"""`make bench-day`: one whole fleet-day end to end, through the real `gpu-pipeline materialize`,
against a DuckDB peer.

Generates one day of dcgm-exporter scrapes for a 1,000-GPU fleet (one scrape a minute, the
generator's nine fields, about 17 M lines) into a landing zone under benchmarks/out/ (kept between
runs), then runs `gpu-pipeline materialize` for that day in a fresh process (Dagster included, a
fresh lake, parse cache and instance) and reports its wall time, its peak RSS (wait4 of that
process: its own), the time and peak RSS of each stage (parse of the landing files, then every
Dagster step, from the run's event log; RSS sampled every 20 ms), and two references: Polars
reading the same files' lines (right before each of our runs: parse_x_read_lines is the median
of each run's parse over the reading just before it), and the DuckDB peer (benchmarks/day_duckdb.sql, run by
benchmarks/day_duckdb.py in a fresh process: the same files to gpu_minutes, hourly_fleet_metrics
and priced_waste in hand-written SQL), measured as ours is. Ours and the peer run
`BENCH_DAY_RUNS` times each (default 3), alternated; the figures are medians, the per-step table
the median run's. Then the peer's tables are checked against the lake's
(benchmarks/day_compare.py): the same rows, numbers within 1e-6 relative; the benchmark fails
when they differ. A run's lake, instance and peer folder are deleted when the benchmark ends,
not before the next run (`TRASH`).

The parent process only starts processes and reads /proc; it generates and imports nothing big.
Prints a table and one line:
bench-day: gpus=… lines=… runs=… wall_s=… parse_s=… read_lines_s=… parse_x_read_lines=…
           peak_rss_mib=… duckdb_s=… duckdb_peak_mib=… day_x_duckdb=<peer's wall / ours>
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "day"
DAY = "2024-01-01"
GPUS = int(os.environ.get("BENCH_DAY_GPUS", "1000"))
# ours and the DuckDB peer, each this many times (fresh processes, alternated): medians
RUNS = max(1, int(os.environ.get("BENCH_DAY_RUNS", "3")))
PY = sys.executable

READ_LINES = """
import sys, time, polars as pl
from pathlib import Path
files = sorted(p for p in Path(sys.argv[1]).rglob('*') if p.is_file() and not p.name.startswith('.'))
t = time.perf_counter(); n = 0
for f in files:
    n += pl.read_csv(f, has_header=False, separator='\\x1f', quote_char=None, infer_schema=False).height
print(time.perf_counter() - t, n)
"""

STEPS = """
import json, sys
import dagster as dg
from dagster import DagsterEventType as T
with dg.DagsterInstance.get() as inst:
    run = inst.get_runs(limit=1, filters=dg.RunsFilter(job_name='daily_pipeline'))[0]
    out = {}
    for r in inst.all_logs(run.run_id):
        ev = r.dagster_event
        if ev is None or not ev.step_key:
            continue
        if ev.event_type in (T.STEP_START, T.STEP_SUCCESS, T.STEP_FAILURE):
            out.setdefault(ev.step_key, {})[ev.event_type.value] = r.timestamp
    print(json.dumps({"run": run.run_id, "status": run.status.value, "steps": out}))
"""


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _tree_rss_kib(pid: int) -> int:
    """RSS of the process and its children (a multiprocess executor's steps). A child that is
    its parent forked and not yet replaced by the program it starts (the same command line:
    a `subprocess` between fork and exec) shares the parent's pages: it is not counted again
    (summed, its RSS counted the ~0.5-1 GiB parent twice for that instant)."""
    total = _rss_kib(pid)
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        kids = []
    own = _cmdline(pid) if kids else None
    return total + sum(_tree_rss_kib(k) for k in kids if own is None or _cmdline(k) != own)


# where the runs' lakes, instances and peer folders go when the next run starts: deleted once the
# benchmark ends. Deleted right before the next run, their thousands of files made that run's
# files slow to create (ext4 without a journal skips the inodes freed in the last seconds, and
# looks each one up: 0.35 ms a file instead of 0.035, about 1 s of a run), a cost no daily run
# pays and the peer, writing a few files, hardly did
TRASH = OUT / ".trash"


def discard(path: Path) -> None:
    """Move `path` (if any) into TRASH, to be deleted by `empty_trash` at the end."""
    if path.exists():
        TRASH.mkdir(parents=True, exist_ok=True)
        path.rename(TRASH / f"{path.name}-{time.time_ns()}")


def empty_trash() -> None:
    shutil.rmtree(TRASH, ignore_errors=True)


def generate(raw: Path) -> None:
    marker = raw / f".complete_{GPUS}"
    if marker.is_file():
        return
    shutil.rmtree(raw, ignore_errors=True)
    print(f"generating one day of scrapes for {GPUS:,} GPUs into {raw} …", flush=True)
    args = ["generate", "--start", DAY, "--days", "1", "--gpus", str(GPUS), "--clusters", "3"]
    subprocess.run([PY, "-m", "gpu_pipeline.cli", *args, "--out", str(raw)], check=True)
    marker.touch()


def run_ours(raw: Path, lake: Path, home: Path) -> dict | None:
    """`gpu-pipeline materialize` of the day in a fresh process, a fresh lake (and so a fresh
    parse cache, `<lake>/_ingest_cache`) and a fresh Dagster instance: its wall time, its own
    peak RSS (wait4) and per stage the time and sampled RSS. None if it failed."""
    discard(lake)
    discard(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PIPELINE_")}
    env["DAGSTER_HOME"] = str(home)
    cmd = [PY, "-m", "gpu_pipeline.cli", "materialize", "--start", DAY]
    cmd += ["--raw", str(raw), "--lake", str(lake)]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.time(), _tree_rss_kib(proc.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    said: list[tuple[float, str]] = []
    for line in proc.stdout:
        said.append((time.time(), line.rstrip()))
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    done.set()
    sampler.join()
    if proc.returncode:
        print("\n".join(s for _, s in said[-40:]))
        print(f"bench-day: materialize failed (exit {proc.returncode})")
        return None
    peak_mib = usage.ru_maxrss / 1024

    def peak_between(a: float, b: float) -> float:
        inside = [r for t, r in samples if a <= t <= b]
        return max(inside, default=0) / 1024

    def when(prefix: str) -> float:
        return next(t for t, s in said if s.lstrip().startswith(prefix))

    # the parse: from its first line to its last progress line (`parsed N/N files`); the CLI
    # readies the run meanwhile (the files are parsed in a process of their own: `ahead`)
    parse_a, run_said = when("parsing "), when("materializing ")
    parse_b = max((t for t, s in said if s.lstrip().startswith("parsed ")), default=run_said)
    steps = json.loads(
        subprocess.run(
            [PY, "-c", STEPS], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    rows = [
        ("parse landing files (CLI)", parse_b - parse_a, peak_between(parse_a, parse_b)),
        ("  then until the run is ready", run_said - parse_b, peak_between(parse_b, run_said)),
    ]
    stage_of = {}
    for key, ev in sorted(steps["steps"].items(), key=lambda kv: kv[1].get("STEP_START", 0)):
        a, b = ev.get("STEP_START"), ev.get("STEP_SUCCESS") or ev.get("STEP_FAILURE")
        if a is None or b is None:
            continue
        rows.append((f"step {key}", b - a, peak_between(a, b)))
        stage_of[key] = b - a
    run_a = min(ev.get("STEP_START", 1e18) for ev in steps["steps"].values())
    run_b = max(ev.get("STEP_SUCCESS", ev.get("STEP_FAILURE", 0)) for ev in steps["steps"].values())
    # after the day's run: the month's run, the views' run and the exit (the 10,000-GPU day's
    # peak was once here, in the month's run, where no step row showed it)
    rows.append(
        ("after the run (month, views, exit)", t0 + wall - run_b, peak_between(run_b, 1e18))
    )

    def total(*names: str) -> float:
        return sum(v for k, v in stage_of.items() if any(n in k for n in names))

    stages = {
        "parse": parse_b - parse_a,
        "assemble": total("gpu_samples", "ingest"),
        "staging": total("staging"),
        "marts": total(
            "persistent_bottlenecks",
            "recommendations",
            "gpu_health",
            "stragglers",
            "efficiency_roi",
            "namespace_efficiency",
            "workload_efficiency",
        ),
        "report": total("daily_report"),
    }
    return {
        "wall": wall,
        "peak": peak_mib,
        "rows": rows,
        "run": run_b - run_a,
        "between": run_b - run_a - sum(stage_of.values()),
        "stages": stages,
    }


def run_peer(raw: Path, out: Path) -> dict | None:
    """The DuckDB peer (benchmarks/day_duckdb.py) in a fresh process, into a fresh folder: its
    wall time (process start .. exit, as ours) and its own peak RSS (wait4). None if it failed."""
    discard(out)
    t0 = time.time()
    proc = subprocess.Popen(
        [PY, str(HERE / "day_duckdb.py"), str(raw), str(out), DAY],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    if os.waitstatus_to_exitcode(status):
        print(said[-4000:])
        print(f"bench-day: the DuckDB peer failed (exit {os.waitstatus_to_exitcode(status)})")
        return None
    return {"wall": wall, "peak": usage.ru_maxrss / 1024, "inside": float(said.split()[-1])}


def read_lines(raw: Path) -> tuple[float, int]:
    """Polars reading the lines of the landing files, in a fresh process: (seconds, lines)."""
    ref = subprocess.run(
        [PY, "-c", READ_LINES, str(raw)], capture_output=True, text=True, check=True
    )
    secs, lines = ref.stdout.split()
    return float(secs), int(lines)


def main() -> int:
    raw, lake, home = OUT / "raw", OUT / "lake", OUT / "dagster_home"
    peer_out = OUT / "duckdb"
    generate(raw)
    files = [p for p in raw.rglob("*") if p.is_file() and not p.name.startswith(".")]
    size = sum(p.stat().st_size for p in files)
    # the reference once to warm the page cache (and count the lines), then again right before
    # each of our runs: each run's parse is compared with the reading just before it, so the
    # machine's speed at that moment (it drifts by a fifth over minutes here) is in both
    lines = read_lines(raw)[1]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe

    print(describe(), flush=True)
    print(f"landing zone: {len(files)} files, {size / 2**30:.2f} GiB, {lines:,} lines", flush=True)

    # ours and the peer alternated, each run in a fresh process: the machine's noise gets the
    # same chances at both
    ours: list[dict] = []
    peer: list[dict] = []
    for i in range(RUNS):
        read_s = read_lines(raw)[0]
        o = run_ours(raw, lake, home)
        if o is None:
            return 1
        d = run_peer(raw, peer_out)
        if d is None:
            return 1
        o["read"] = read_s
        ours.append(o)
        peer.append(d)
        print(
            f"run {i + 1}/{RUNS}: gpu-pipeline materialize {o['wall']:.2f} s "
            f"(peak {o['peak']:.0f} MiB; parse {o['stages']['parse']:.2f} s, Polars reading "
            f"the lines just before {read_s:.2f} s), DuckDB peer {d['wall']:.2f} s "
            f"(peak {d['peak']:.0f} MiB; its SQL {d['inside']:.2f} s)",
            flush=True,
        )
    # the median run (the lower middle of an even count): its table is a real run's
    med = sorted(ours, key=lambda r: r["wall"])[(RUNS - 1) // 2]
    dmed = sorted(peer, key=lambda r: r["wall"])[(RUNS - 1) // 2]
    peak_mib = statistics.median_low(r["peak"] for r in ours)
    duck_peak = statistics.median_low(r["peak"] for r in peer)

    print(
        f"\none fleet-day, {GPUS:,} GPUs, {lines:,} lines, `gpu-pipeline materialize` {DAY}"
        f" (the median of {RUNS} run(s)):"
    )
    for name, secs, peak in med["rows"]:
        print(f"  {name:<46} {secs:8.2f} s   peak {peak:7.0f} MiB")
    print(f"  {'run (first step start .. last step end)':<46} {med['run']:8.2f} s")
    print(f"  {'  of which between steps (Dagster)':<46} {med['between']:8.2f} s")
    print(
        f"  {'whole command (process start .. exit)':<46} {med['wall']:8.2f} s   peak "
        f"{med['peak']:7.0f} MiB"
    )
    print(f"  {'reference: Polars reads the lines (before it)':<46} {med['read']:8.2f} s")
    print(
        f"  {'peer: DuckDB SQL (benchmarks/day_duckdb.sql)':<46} {dmed['wall']:8.2f} s   peak "
        f"{dmed['peak']:7.0f} MiB"
    )
    stages = med["stages"]
    print("  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()))
    if RUNS > 1:
        print(
            "  all runs (s): ours "
            + ", ".join(f"{r['wall']:.1f}" for r in ours)
            + "; DuckDB "
            + ", ".join(f"{r['wall']:.1f}" for r in peer)
        )

    # the last run's lake against the last peer run's tables (a process of its own)
    print(f"\nthe DuckDB peer's tables against the lake ({lake}):")
    check = subprocess.run(
        [PY, str(HERE / "day_compare.py"), str(lake), str(peer_out), DAY], text=True
    )
    wall = statistics.median(r["wall"] for r in ours)
    duck = statistics.median(r["wall"] for r in peer)
    parse_s = statistics.median(r["stages"]["parse"] for r in ours)
    read_s = statistics.median(r["read"] for r in ours)
    parse_x = statistics.median(r["stages"]["parse"] / r["read"] for r in ours)
    print(
        f"bench-day: gpus={GPUS} lines={lines} runs={RUNS} wall_s={wall:.1f} "
        f"parse_s={parse_s:.1f} read_lines_s={read_s:.1f} "
        f"parse_x_read_lines={parse_x:.2f} peak_rss_mib={peak_mib:.0f} "
        f"duckdb_s={duck:.1f} duckdb_peak_mib={duck_peak:.0f} day_x_duckdb={duck / wall:.3f}"
    )
    if check.returncode:
        print(
            "bench-day: FAILED: the DuckDB peer's tables differ from gpu-pipeline's "
            "(the DIFFERS lines above)"
        )
        return 1
    return 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        empty_trash()
    sys.exit(code)
