"""Operations: asset checks, the landing-zone sensor, atomic storage under SIGKILL, concurrent runs."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
from helpers import MODELS, expo_lines, start_materialize, write_file

from gpu_pipeline.definitions import defs
from gpu_pipeline.defs import checks, marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.defs.sensors import landing_files, landing_zone_sensor, plan_backfill
from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 10)
ASSETS = dg.load_assets_from_modules([raw, staging, marts, report])


# --- checks can fail ----------------------------------------------------------------------------


def test_checks_fail_on_wrong_numbers():
    log = pl.DataFrame(
        {
            "rows_read": [10, 5],
            "rows_accepted": [8, 5],
            "rows_quarantined": [1, 0],
            "rows_duplicate": [0, 0],
            "source_file": ["a", "b"],
        }
    )
    assert not checks.row_conservation(log).passed
    assert (
        checks.row_conservation(log.with_columns(pl.lit(1).alias("rows_duplicate"))).passed is False
    )
    ok = log.with_columns(rows_duplicate=pl.Series([1, 0]))
    assert checks.row_conservation(ok).passed
    q = pl.DataFrame({"reason": ["bad"] * 3, "source_file": ["a"] * 3})
    res = checks.validation_pass_rate(log.with_columns(rows_quarantined=pl.Series([9, 0])), q)
    assert not res.passed and res.severity == dg.AssetCheckSeverity.WARN
    assert "bad" in res.metadata["failure_cases"].value
    daily = pl.DataFrame({"minutes": [1440, 720]})
    assert checks.minutes_add_up(2160, daily).passed
    assert not checks.minutes_add_up(2159, daily).passed  # a row lost on its way to the file
    assert not checks.minutes_add_up(None, daily).passed
    h = pl.DataFrame(
        {
            "pct_idle": [50.0],
            "pct_underutilized": [30.0],
            "pct_productive": [10.0],
            "pct_compute_bound": [9.0],
            "pct_unknown": [0.0],
        }
    )
    assert not checks.phase_shares_sum_to_100(h).passed
    assert checks.phase_shares_sum_to_100(h.with_columns(pct_unknown=pl.lit(1.0))).passed
    w = pl.DataFrame(
        {
            "cost_usd": [1.0],
            "productive_usd": [0.5],
            "idle_waste_usd": [0.2],
            "stall_waste_usd": [0.1],
            "headroom_waste_usd": [0.1],
            "unmeasured_usd": [0.0],
            "hourly_waste_usd": [0.4],
            "monthly_waste_usd": [288.0],
        }
    )
    assert not checks.cost_split_sums_to_cost(w).passed
    assert checks.cost_split_sums_to_cost(
        w.with_columns(pl.lit(0.2).alias("headroom_waste_usd"))
    ).passed
    r = pl.DataFrame(
        {
            "utilization_savings_frac": [0.5],
            "measured_waste_frac": [0.4],
            "rate_savings_frac": [0.0],
            "total_savings_frac": [0.5],
        }
    )
    assert not checks.savings_within_measured_waste(r).passed


def resources(tmp_path):
    return {
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "landing": LandingResource(root=str(tmp_path / "raw")),
        "reference": ReferenceResource(),
    }


def plant_day(raw: Path, d: date, name: str | None = None, minutes=range(600, 700)):
    lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, minutes, 85, 100.0)
    lines += expo_lines("GPU-E", MODELS["A100"], "n1", "good", d, minutes, 95, 320.0, gpu=1)
    return write_file(raw / "c1" / (name or f"n1_{d.isoformat()}.prom"), lines)


def test_every_check_passes_on_a_real_run(tmp_path):
    # the whole day, so the coverage check passes too (a partial day warns: test_rules)
    plant_day(tmp_path / "raw", D, minutes=range(1440))
    result = dg.materialize(
        ASSETS,
        partition_key=D.isoformat(),
        resources=resources(tmp_path),
        instance=dg.DagsterInstance.ephemeral(),
    )
    evals = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evals == {
        "row_conservation": True,
        "validation_pass_rate": True,
        "utilization_present": True,
        "minutes_add_up": True,
        "phase_shares_sum_to_100": True,
        "cost_split_sums_to_cost": True,
        "savings_within_measured_waste": True,
        "fleet_coverage": True,
        "made_from_one_ingest": True,
    }


# --- the landing-zone sensor --------------------------------------------------------------------


FULL = [dg.AssetKey(k) for k in ("gpu_samples", "gpu_minutes", "persistent_bottlenecks")]


def test_plan_backfill_covers_late_days_and_the_window_after():
    plan = plan_backfill({date(2024, 1, 3)}, date(2024, 1, 1), date(2024, 1, 6), FULL)
    assert plan[dg.AssetKey("gpu_samples")] == ["2024-01-03"]
    assert plan[dg.AssetKey("gpu_minutes")] == ["2024-01-03"]
    # the window assets also for the days after, not past the last partition
    assert plan[dg.AssetKey("persistent_bottlenecks")] == [
        "2024-01-03",
        "2024-01-04",
        "2024-01-05",
        "2024-01-06",
    ]
    # a day before the first partition has no partition (and no GPU-day that a window could read)
    assert plan_backfill({date(2023, 12, 31)}, date(2024, 1, 1), date(2024, 1, 6), FULL) == {}


def tick(tmp_path, cursor, instance):
    with dg.build_sensor_context(
        cursor=cursor, resources=resources(tmp_path), instance=instance, definitions=defs
    ) as ctx:
        return landing_zone_sensor(ctx)


def parse_run(tmp_path, instance):
    res = dg.materialize([landing_files], resources=resources(tmp_path), instance=instance)
    assert res.success


def backfill_plan(result) -> dict[str, list[str]]:
    """{asset: partition keys} of the backfill a tick requests (one request)."""
    (req,) = result.run_requests
    subset = req.asset_graph_subset
    return {
        k.to_user_string(): sorted(subset.get_partitions_subset(k).get_partition_keys())
        for k in subset.asset_keys
    }


def test_sensor_parses_in_a_run_then_backfills_the_days_and_late_data(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    raw = tmp_path / "raw"
    plant_day(raw, D)
    plant_day(raw, D + timedelta(days=1))
    # new files: the tick asks for a parse run and does not move its cursor
    first = tick(tmp_path, None, instance)
    (req,) = first.run_requests
    assert req.asset_selection == [dg.AssetKey("landing_files")] and first.cursor is None
    parse_run(tmp_path, instance)
    planned = tick(tmp_path, None, instance)
    plan = backfill_plan(planned)
    assert plan["gpu_samples"] == plan["priced_waste"] == ["2024-01-10", "2024-01-11"]
    assert sorted(json.loads(planned.cursor)) == ["c1/n1_2024-01-10.prom", "c1/n1_2024-01-11.prom"]
    # nothing changed: nothing runs twice
    again = tick(tmp_path, planned.cursor, instance)
    assert isinstance(again, dg.SkipReason)
    # a late file for an earlier day: that day again, and the persistence window after it, in
    # one backfill (Dagster runs the window days after the late day's gpu_daily)
    plant_day(raw, D - timedelta(days=3), name="late_2024-01-07.prom")
    parse = tick(tmp_path, planned.cursor, instance).run_requests[0]
    assert parse.asset_selection == [dg.AssetKey("landing_files")]
    parse_run(tmp_path, instance)
    late = tick(tmp_path, planned.cursor, instance)
    plan = backfill_plan(late)
    assert plan["gpu_samples"] == plan["recommendations"] == ["2024-01-07"]
    window = [(D - timedelta(days=3) + timedelta(days=k)).isoformat() for k in range(7)]
    assert plan["persistent_bottlenecks"] == plan["daily_report"] == window
    # a changed file (same name, new content) counts as new
    plant_day(raw, D, minutes=range(600, 720))
    parse_run(tmp_path, instance)
    changed = tick(tmp_path, late.cursor, instance)
    assert backfill_plan(changed)["gpu_samples"] == ["2024-01-10"]


# --- atomic storage -----------------------------------------------------------------------------

WRITER = """
import sys, polars as pl
from datetime import date
from gpu_pipeline.lib.io.lake import Lake
lake = Lake(sys.argv[1])
n = 0
while True:
    n += 1
    lake.write("gpu_minutes", date(2024, 1, 1),
               pl.DataFrame({"gpu_uuid": ["GPU-x"] * 400_000, "samples": [n] * 400_000}))
    print(n, flush=True)
"""


def test_sigkill_mid_write_leaves_a_complete_partition(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write(
        "gpu_minutes",
        date(2024, 1, 1),
        pl.DataFrame({"gpu_uuid": ["GPU-x"] * 10, "samples": [0] * 10}),
    )
    for delay in (0.3, 0.9, 1.7):
        p = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(lake.root)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        df = lake.read("gpu_minutes", date(2024, 1, 1))  # readable, and one whole version
        assert df.height in (10, 400_000)
        assert df["samples"].n_unique() == 1
        assert lake.days("gpu_minutes") == [date(2024, 1, 1)]
        visible = sorted(
            p.name
            for p in lake.partition_file("gpu_minutes", date(2024, 1, 1)).parent.iterdir()
            if not p.name.startswith(".")
        )
        assert visible == ["data.parquet"]


def test_two_days_at_once_do_not_interfere(tmp_path):
    raw = tmp_path / "raw"
    plant_day(raw, D)
    plant_day(raw, D + timedelta(days=1))
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh")}
    # the instance exists before the runs, as it does in any deployment
    subprocess.run([sys.executable, "-m", "gpu_pipeline.cli", "init-instance"], env=env, check=True)
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        assert inst.get_runs() == []
    procs = [
        start_materialize(d, raw, tmp_path / "lake", env) for d in ("2024-01-10", "2024-01-11")
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lake = Lake(tmp_path / "lake")
    for d in (D, D + timedelta(days=1)):
        m = lake.read("gpu_minutes", d)
        assert m.height == 200 and set(m["date"]) == {d}


def test_turning_the_sensor_on_over_a_backfilled_lake_reruns_nothing(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    plant_day(tmp_path / "raw", D)
    assert dg.materialize(
        ASSETS, partition_key=D.isoformat(), resources=resources(tmp_path), instance=instance
    ).success
    first = tick(tmp_path, None, instance)  # the sensor has never seen these files
    assert not first.run_requests and "already in the lake" in first.skip_reason.skip_message
    assert json.loads(first.cursor) == {"c1/n1_2024-01-10.prom": ANY_SHA}
    # the same name with other content is news again
    plant_day(tmp_path / "raw", D, minutes=range(600, 720))
    parse_run(tmp_path, instance)
    assert backfill_plan(tick(tmp_path, first.cursor, instance))["gpu_samples"] == [str(D)]


def test_a_replaced_file_runs_again_the_days_its_old_content_was_on(tmp_path):
    """A file over midnight replaced by one on the first day only: the second day ran again
    too, or it kept the old samples, billed (adversarial review)."""
    instance = dg.DagsterInstance.ephemeral()
    raw, nxt = tmp_path / "raw", D + timedelta(days=1)
    plant_day(raw, D, name="n1.prom", minutes=range(1380, 1500))  # 23:00 to 01:00
    for d in (D, nxt):
        assert dg.materialize(
            ASSETS, partition_key=d.isoformat(), resources=resources(tmp_path), instance=instance
        ).success
    first = tick(tmp_path, None, instance)
    assert not first.run_requests and "already in the lake" in first.skip_reason.skip_message
    plant_day(raw, D, name="n1.prom", minutes=range(1380, 1440))  # the first day's hour only
    parse_run(tmp_path, instance)
    # a damaged ingest_log of another day does not stop the tick
    bad = Lake(tmp_path / "lake").partition_file("ingest_log", D - timedelta(days=5))
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PAR1 not parquet PAR1")
    plan = backfill_plan(tick(tmp_path, first.cursor, instance))
    assert plan["gpu_samples"] == plan["priced_waste"] == [str(D), str(nxt)]


def test_a_file_over_midnight_runs_only_the_day_that_has_not_ingested_it(tmp_path):
    """A file over midnight whose first day a CLI backfill ran: the sensor runs the second day
    (and its window) only, not the first again; a damaged or missing ingest_log of the second
    day is a day to run, not a failed tick."""
    instance = dg.DagsterInstance.ephemeral()
    raw, nxt = tmp_path / "raw", D + timedelta(days=1)
    plant_day(raw, D, name="n1.prom", minutes=range(1380, 1500))  # 23:00 to 01:00
    assert dg.materialize(
        ASSETS, partition_key=D.isoformat(), resources=resources(tmp_path), instance=instance
    ).success
    lake = Lake(tmp_path / "lake")
    assert lake.exists("ingest_log", D) and not lake.exists("ingest_log", nxt)
    window = [(nxt + timedelta(days=k)).isoformat() for k in range(7)]
    for damaged in (False, True):
        if damaged:  # an ingest_log of the second day that is not Parquet
            bad = lake.partition_file("ingest_log", nxt)
            bad.parent.mkdir(parents=True, exist_ok=True)
            bad.write_bytes(b"PAR1 not parquet PAR1")
        plan = backfill_plan(tick(tmp_path, None, instance))
        assert plan["gpu_samples"] == plan["priced_waste"] == [str(nxt)], damaged
        assert plan["persistent_bottlenecks"] == plan["daily_report"] == window, damaged


class _AnySha(str):
    def __eq__(self, other):
        return isinstance(other, str) and len(other) == 64


ANY_SHA = _AnySha()


def test_allocator_settings_apply_before_polars_and_leave_the_environments_own():
    """gpu_pipeline sets Polars' jemalloc decay before Polars loads (not after, not over a value
    the environment gives) and glibc's thresholds (not when the environment sets them)."""
    from gpu_pipeline import allocator

    probe = (
        "import os, json, sys\n"
        "first = sys.argv[1]\n"
        "if first == 'polars': import polars\n"
        "import gpu_pipeline\n"
        "print(json.dumps([gpu_pipeline.ALLOCATOR, os.environ.get('_RJEM_MALLOC_CONF')]))\n"
    )

    def run(first: str, **env: str) -> list:
        ours = ("_RJEM_MALLOC_CONF", *allocator._GLIBC_VARIABLES)
        clean = {k: v for k, v in os.environ.items() if k not in ours}
        out = subprocess.run(
            [sys.executable, "-c", probe, first],
            env={**clean, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout)

    assert run("gpu_pipeline") == [{"jemalloc": True, "glibc": True}, allocator.JEMALLOC_CONF]
    applied, conf = run("polars")  # too late for jemalloc: Polars' own setting stays
    assert applied == {"jemalloc": False, "glibc": True} and conf != allocator.JEMALLOC_CONF
    applied, conf = run("gpu_pipeline", _RJEM_MALLOC_CONF="dirty_decay_ms:0", GLIBC_TUNABLES="")
    assert applied == {"jemalloc": False, "glibc": False} and conf == "dirty_decay_ms:0"
    applied, _ = run("gpu_pipeline", MALLOC_ARENA_MAX="4")  # the environment's own arenas
    assert applied == {"jemalloc": True, "glibc": False}
    # Polars' jemalloc takes the setting: it says so on stderr when it refuses a pair
    code = "import gpu_pipeline, polars as pl; pl.DataFrame({'a': range(10**6)}).sum()"
    clean = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    for conf, refused in ((None, False), (allocator.JEMALLOC_CONF + ",no_such_pair:1", True)):
        env = clean if conf is None else {**clean, "_RJEM_MALLOC_CONF": conf}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and ("Invalid conf pair" in out.stderr) is refused
    assert "narenas:1" in allocator.JEMALLOC_CONF.split(",")


def test_a_parse_process_keeps_what_it_frees_unless_the_environment_says_otherwise():
    """The parse ahead's process (`ingest.ahead`) keeps its freed buffers (glibc's thresholds
    raised, jemalloc's decay longer), except where the environment sets its own."""
    from gpu_pipeline import allocator

    env = allocator.parse_process_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["MALLOC_ARENA_MAX"] == "1"
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) == 2**30
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) == 64 * 2**20
    assert env["_RJEM_MALLOC_CONF"] == allocator.PARSE_PROCESS_JEMALLOC
    # this module's own jemalloc setting (`configure`) is replaced; the environment's is kept
    ours = allocator.parse_process_env({"_RJEM_MALLOC_CONF": allocator.JEMALLOC_CONF})
    assert ours["_RJEM_MALLOC_CONF"] == allocator.PARSE_PROCESS_JEMALLOC
    theirs = allocator.parse_process_env({"_RJEM_MALLOC_CONF": "dirty_decay_ms:0"})
    assert theirs["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:0"
    own_glibc = allocator.parse_process_env({"MALLOC_ARENA_MAX": "4"})
    assert own_glibc["MALLOC_ARENA_MAX"] == "4" and "MALLOC_TRIM_THRESHOLD_" not in own_glibc


def test_release_hands_freed_heap_pages_back():
    """Blocks freed between blocks still held stay in the heap (glibc trims only its top);
    `allocator.release` hands their pages back: the RSS falls by about what was freed."""
    probe = (
        "import gpu_pipeline, numpy as np\n"
        "from gpu_pipeline import allocator\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS'))"
        ".split()[1]) // 1024\n"
        "blocks = [np.ones(4 * 2**20 // 8) for _ in range(60)]\n"
        "kept = blocks[1::2]\n"
        "del blocks\n"
        "before = rss()\n"
        "allocator.release()\n"
        "print(before, rss())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    before, after = map(int, out.split())
    assert before - after >= 100, (before, after)  # 30 blocks of 4 MiB freed between kept ones
