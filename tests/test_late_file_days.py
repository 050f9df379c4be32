"""`gpu-pipeline materialize` of a day whose late landing file also holds records of a day the
lake already has: the run reads the file for its own days only, so it names the other day, with
the command that brings it up to date (`runs.lake_days_behind`, the landing-zone sensor's
`_not_in_lake` asked after the run). Days before the first partition and days not in the lake
yet are not named: there is nothing to write, or their first run reads the file."""

from __future__ import annotations

import re
import shlex
import shutil
from datetime import date
from pathlib import Path

import polars as pl
import pytest
from helpers import MODELS, cli, cli_env, expo_lines, write_file

from gpu_pipeline import runs
from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.settings import Settings

LATE = "late"  # the late host's namespace
NOTE = re.compile(
    r"^  note: (.+?) (?:is|are) in the lake and (?:was|were) not run again, .*$", re.M
)


def _command(note: str) -> str:
    """The command a note line advises."""
    return note.split("earlier content): ", 1)[1]


def _late_gpu_hours(lake: Path, table: str, key) -> float:
    """The `late` namespace's GPU-hours in one partition of `table` (0 when it has none)."""
    rows = Lake(lake).read(table, key).filter(pl.col("namespace") == LATE)
    return float(rows["gpu_hours"].sum())


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    """A lake of 01-31..02-01 (first partition 01-31), then a late host's file filed on 02-01
    with records of 01-30 23:00 (before the first partition), 01-31 23:00 (a day in the lake),
    02-01 00:00 and 02-02 00:00 (a day not materialized yet): one H100, an hour a day."""
    tmp = tmp_path_factory.mktemp("late")
    env = {**cli_env(tmp), "GPU_PIPELINE_START_DATE": "2024-01-31"}
    env["GPU_PIPELINE_EXECUTOR"] = "in_process"
    raw, lake = tmp / "raw", tmp / "lake"
    gen = ("--days", "2", "--gpus", "2", "--clusters", "1", "--out", str(raw))
    cli("generate", "--start", "2024-01-31", *gen, env=env)
    flags = ("--raw", str(raw), "--lake", str(lake))
    cli("materialize", "--start", "2024-01-31", "--end", "2024-02-01", *flags, env=env)
    before = _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31))
    lines = []
    for day, minutes in (
        (date(2024, 1, 30), range(23 * 60, 24 * 60)),
        (date(2024, 1, 31), range(23 * 60, 24 * 60)),
        (date(2024, 2, 1), range(60)),
        (date(2024, 2, 2), range(60)),
    ):
        lines += expo_lines("GPU-late", MODELS["H100"], "late-node", LATE, day, minutes, 90, 500.0)
    write_file(raw / "us-east-train" / "late-node_2024-02-01.prom", lines)
    out = cli("materialize", "--start", "2024-02-01", *flags, env=env).stdout
    shutil.copytree(lake, tmp / "lake_then")  # the lake as that run left it
    return tmp, env, flags, before, out


def test_the_run_names_the_lake_day_the_late_file_holds_records_of(late):
    tmp, _, flags, before, out = late
    lake = tmp / "lake"
    # the run's own day has the late hour; the day before, in the lake, does not (yet)
    assert before == 0.0
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 2, 1)) == pytest.approx(1.0)
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31)) == 0.0
    # one line names it, and only it: 01-30 is before the first partition, 02-02 not in the
    # lake yet (its first run reads the file)
    assert NOTE.findall(out) == ["2024-01-31"], out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  note: 2024-01-31 ")]
    assert line.startswith(
        "  note: 2024-01-31 is in the lake and was not run again, but landing files this run "
        "read hold records of it that the lake has not ingested (or it holds their earlier "
        "content): "
    )
    command = _command(line)
    assert command.endswith(f"materialize --start 2024-01-31 {shlex.join(flags)}")
    assert "2024-01-30" not in out and "2024-02-02" not in out


def test_days_before_the_partitions_or_damaged_are_not_named(late):
    """`runs.lake_days_behind` on the lake the late run left: 01-31 behind; not with the first
    partition on 02-01 (GPU_PIPELINE_START_DATE), nor with 01-31's ingest_log damaged."""
    tmp, *_ = late
    lake = tmp / "lake_then"

    def behind(start_date: str) -> list[date]:
        s = Settings(raw=str(tmp / "raw"), lake=str(lake), start_date=start_date)
        with runs.run_resources(build_definitions(s)) as res:
            parsed = runs.warm_parse_cache(res["landing"], res["lake"], lambda _: None)
            return runs.lake_days_behind(s, res["lake"], parsed, [date(2024, 2, 1)])

    assert behind("2024-01-31") == [date(2024, 1, 31)]
    assert behind("2024-02-01") == []
    Path(Lake(lake).partition_file("ingest_log", date(2024, 1, 31))).write_bytes(b"not parquet")
    assert behind("2024-01-31") == []


def test_the_named_command_brings_the_day_and_its_month_up_to_date(late):
    tmp, env, flags, _, out = late
    lake = tmp / "lake"
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  note: 2024-01-31 ")]
    argv = shlex.split(_command(line))
    args = argv[argv.index("materialize") :]  # after how this user calls the CLI
    assert args == ["materialize", "--start", "2024-01-31", *flags]
    again = cli(*args, env=env).stdout
    assert NOTE.findall(again) == []
    # the late hour of 01-31 is in its day and in January's month now
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31)) == pytest.approx(1.0)
    monthly = (
        Lake(lake).read("namespace_monthly", date(2024, 1, 1)).filter(pl.col("namespace") == LATE)
    )
    assert monthly["gpu_hours"].to_list() == pytest.approx([1.0])
    # and the day the note was about is caught up: running 02-01 again names nothing
    assert NOTE.findall(cli("materialize", "--start", "2024-02-01", *flags, env=env).stdout) == []


def test_a_file_replaced_by_one_that_no_longer_reaches_a_lake_day_names_it(late):
    """A landing file the lake ingested on 01-31 and 02-01, replaced under the same name by one
    with 02-01's records only: the run of 02-01 names 01-31, which still bills the earlier
    content's hour (the sensor's `_replaced_days`), and its command takes that hour out."""
    tmp, env, flags, *_ = late
    raw, lake = Path(flags[1]), Path(flags[3])
    cli("materialize", "--start", "2024-01-31", "--end", "2024-02-01", *flags, env=env)
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31)) == pytest.approx(1.0)
    lines = expo_lines(
        "GPU-late", MODELS["H100"], "late-node", LATE, date(2024, 2, 1), range(60), 90, 500.0
    )
    write_file(raw / "us-east-train" / "late-node_2024-02-01.prom", lines)
    out = cli("materialize", "--start", "2024-02-01", *flags, env=env).stdout
    assert NOTE.findall(out) == ["2024-01-31"], out
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31)) == pytest.approx(1.0)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  note: 2024-01-31 ")]
    argv = shlex.split(_command(line))
    cli(*argv[argv.index("materialize") :], env=env)
    assert _late_gpu_hours(lake, "priced_waste", date(2024, 1, 31)) == 0.0
    assert NOTE.findall(cli("materialize", "--start", "2024-02-01", *flags, env=env).stdout) == []
