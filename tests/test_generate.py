"""The synthetic fleet: deterministic, in the seed's shape, and its workloads show in the metrics."""

import os
import subprocess
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
from helpers import assemble_day

from gpu_pipeline.lib.generate import build_fleet, generate
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

D = date(2024, 1, 1)


def test_default_fleet_shape_and_mix():
    fleet = build_fleet()
    assert len(fleet) == 50 and len({g.uuid for g in fleet}) == 50
    assert len({g.cluster for g in fleet}) == 3
    mix = Counter(g.workload for g in fleet)
    assert mix == {
        "efficient_training": 15,
        "data_starved": 10,
        "network_bottleneck": 8,
        "moderate": 10,
        "idle": 5,
        "bursty_inference": 2,
    }


def test_generation_is_deterministic(tmp_path):
    a = generate(tmp_path / "a", D, days=1, gpus=6, clusters=2, seed=7)
    b = generate(tmp_path / "b", D, days=1, gpus=6, clusters=2, seed=7)
    assert [p.relative_to(tmp_path / "a") for p in a] == [p.relative_to(tmp_path / "b") for p in b]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
    c = generate(tmp_path / "c", D, days=1, gpus=6, clusters=2, seed=8)
    assert a[0].read_bytes() != c[0].read_bytes()


def test_workloads_show_in_the_metrics(tmp_path):
    generate(tmp_path / "raw", D, days=1, gpus=20, clusters=2, seed=3)
    day = assemble_day(
        [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")], D
    )
    assert day.quarantine.height == 0
    assert day.gpu_samples.height == 20 * 1440
    m = collect_stable(gpu_minutes(day.gpu_samples.lazy(), load_catalog(), load_prices()))
    by_ns = m.group_by("namespace").agg(
        pl.col("gpu_util_pct").mean().alias("util"),
        pl.col("pif").mean().alias("pif"),
        (pl.col("efficiency_class") == "bottlenecked").mean().alias("bottlenecked"),
        (pl.col("phase") == "idle").mean().alias("idle"),
    )
    r = {row["namespace"]: row for row in by_ns.iter_rows(named=True)}
    assert (
        r["vision-train"]["util"] > 75 and r["vision-train"]["bottlenecked"] > 0.9
    )  # data-starved
    assert r["llm-pretrain"]["pif"] > 0.7 and r["llm-pretrain"]["bottlenecked"] < 0.01  # efficient
    assert r["notebooks"]["idle"] > 0.99  # idle


def _without_times(path) -> list[str]:
    """An exposition file's lines without their timestamps (the last field of a sample)."""
    return [
        ln if ln.startswith("#") else ln.rsplit(" ", 1)[0] for ln in path.read_text().splitlines()
    ]


def test_the_numbers_do_not_depend_on_the_week(tmp_path):
    """The demo is generated for the week ending yesterday: whatever week that is, the fleet's
    values (and so every figure `make demo` prints) are the same; only the times move."""
    a = generate(tmp_path / "a", D, days=2, gpus=3, clusters=1, seed=42)
    later = date(2026, 11, 18)  # another weekday, another year
    b = generate(tmp_path / "b", later, days=2, gpus=3, clusters=1, seed=42)
    assert [p.name for p in b] == [
        f"us-east-train-node-00_{later + timedelta(days=i)}.prom" for i in range(2)
    ]
    for x, y in zip(a, b, strict=True):
        assert _without_times(x) == _without_times(y), (x.name, y.name)
        assert x.read_bytes() != y.read_bytes()  # the timestamps are the days'
    # and the first day is what it always was: a run from 2024-01-01 writes the same bytes as
    # the day of its own (the README's figures were measured on that week)
    one = generate(tmp_path / "one", D, days=1, gpus=3, clusters=1, seed=42)
    assert one[0].read_bytes() == a[0].read_bytes()


def test_make_demo_generates_the_week_ending_yesterday():
    """`make demo` on a clean clone: the seven UTC days ending yesterday (the UI's default
    partition range shows them), the same START for generate and materialize."""
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("START", "END", "DAYS")}
    out = subprocess.run(
        ["make", "-n", "demo"], cwd=repo, env=env, capture_output=True, text=True, check=True
    ).stdout
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    start = yesterday - timedelta(days=6)
    assert f"gpu-pipeline generate --start {start} --days 7" in out, out
    assert f"gpu-pipeline materialize --start {start} --end {yesterday} --summary" in out, out
    # other days on request
    out = subprocess.run(
        ["make", "-n", "demo", "START=2024-01-01"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "materialize --start 2024-01-01 --end 2024-01-07" in out, out
