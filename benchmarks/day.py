"""`make bench-day`: one whole fleet-day end to end, through the real `gpu-pipeline materialize`.

Generates one day of dcgm-exporter scrapes for a 1,000-GPU fleet (30 s, the generator's fields,
about 29 M lines) into a landing zone under benchmarks/out/ (kept between runs), then runs
`gpu-pipeline materialize` for that day in a fresh process (Dagster included, a fresh lake and
instance) and reports its wall time, its peak RSS (wait4 of that process: its own), the time and
peak RSS of each stage (parse of the landing files, then every Dagster step, from the run's event
log; RSS sampled every 20 ms), and the reference: Polars reading the same files' lines.

The parent process only starts processes and reads /proc; it generates and imports nothing big.
Prints a table and one line:
bench-day: gpus=… lines=… wall_s=… parse_s=… read_lines_s=… parse_x_read_lines=… peak_rss_mib=…
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "day"
DAY = "2024-01-01"
GPUS = int(os.environ.get("BENCH_DAY_GPUS", "1000"))
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


def _tree_rss_kib(pid: int) -> int:
    """RSS of the process and its children (a multiprocess executor's steps)."""
    total = _rss_kib(pid)
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    return total + sum(_tree_rss_kib(int(k)) for k in kids)


def generate(raw: Path) -> None:
    marker = raw / f".complete_{GPUS}"
    if marker.is_file():
        return
    shutil.rmtree(raw, ignore_errors=True)
    print(f"generating one day of scrapes for {GPUS:,} GPUs into {raw} …", flush=True)
    args = ["generate", "--start", DAY, "--days", "1", "--gpus", str(GPUS), "--clusters", "3"]
    subprocess.run([PY, "-m", "gpu_pipeline.cli", *args, "--out", str(raw)], check=True)
    marker.touch()


def main() -> int:
    raw, lake, home = OUT / "raw", OUT / "lake", OUT / "dagster_home"
    generate(raw)
    files = [p for p in raw.rglob("*") if p.is_file() and not p.name.startswith(".")]
    size = sum(p.stat().st_size for p in files)
    # the reference twice, best of both: the second reads the files from the page cache, as the
    # parse right after it does
    reads = []
    for _ in range(2):
        ref = subprocess.run(
            [PY, "-c", READ_LINES, str(raw)], capture_output=True, text=True, check=True
        )
        reads.append(ref.stdout.split())
    read_s, lines = min(float(r[0]) for r in reads), int(reads[0][1])
    print(f"landing zone: {len(files)} files, {size / 2**30:.2f} GiB, {lines:,} lines", flush=True)

    shutil.rmtree(lake, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
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
        return 1
    peak_mib = usage.ru_maxrss / 1024

    def peak_between(a: float, b: float) -> float:
        inside = [r for t, r in samples if a <= t <= b]
        return max(inside, default=0) / 1024

    def when(prefix: str) -> float:
        return next(t for t, s in said if s.lstrip().startswith(prefix))

    parse_a, parse_b = when("parsing "), when("materializing ")
    steps = json.loads(
        subprocess.run(
            [PY, "-c", STEPS], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    rows = [("parse landing files (CLI)", parse_b - parse_a, peak_between(parse_a, parse_b))]
    stage_of = {}
    for key, ev in sorted(steps["steps"].items(), key=lambda kv: kv[1].get("STEP_START", 0)):
        a, b = ev.get("STEP_START"), ev.get("STEP_SUCCESS") or ev.get("STEP_FAILURE")
        if a is None or b is None:
            continue
        rows.append((f"step {key}", b - a, peak_between(a, b)))
        stage_of[key] = b - a
    run_a = min(ev.get("STEP_START", 1e18) for ev in steps["steps"].values())
    run_b = max(ev.get("STEP_SUCCESS", ev.get("STEP_FAILURE", 0)) for ev in steps["steps"].values())
    in_steps = sum(stage_of.values())

    def total(*names: str) -> float:
        return sum(v for k, v in stage_of.items() if any(n in k for n in names))

    print(f"\none fleet-day, {GPUS:,} GPUs, {lines:,} lines, `gpu-pipeline materialize` {DAY}:")
    for name, secs, peak in rows:
        print(f"  {name:<46} {secs:8.2f} s   peak {peak:7.0f} MiB")
    print(f"  {'run (first step start .. last step end)':<46} {run_b - run_a:8.2f} s")
    print(f"  {'  of which between steps (Dagster)':<46} {run_b - run_a - in_steps:8.2f} s")
    print(
        f"  {'whole command (process start .. exit)':<46} {wall:8.2f} s   peak {peak_mib:7.0f} MiB"
    )
    print(f"  {'reference: Polars reads the lines':<46} {read_s:8.2f} s")
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
        ),
        "report": total("daily_report"),
    }
    print("  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()))
    print(
        f"bench-day: gpus={GPUS} lines={lines} wall_s={wall:.1f} parse_s={stages['parse']:.1f} "
        f"read_lines_s={read_s:.1f} parse_x_read_lines={stages['parse'] / read_s:.2f} "
        f"peak_rss_mib={peak_mib:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
