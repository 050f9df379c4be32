"""The CLI as a user runs it: generate, materialize on a persistent instance, query with SQL."""

import json
import os
import subprocess

import dagster as dg
import pytest
from helpers import cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    env = {**os.environ, "DAGSTER_HOME": str(tmp / "dh")}
    for k in ("GPU_PIPELINE_RAW", "GPU_PIPELINE_LAKE", "GPU_PIPELINE_PRICES"):
        env.pop(k, None)
    prices = tmp / "prices.csv"
    prices.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA100-SXM4-40GB,3.00,1.00\n"
    )
    cli(
        "generate",
        "--start",
        "2024-01-01",
        "--days",
        "2",
        "--gpus",
        "4",
        "--clusters",
        "1",
        "--out",
        str(tmp / "raw"),
        env=env,
    )
    out = cli(
        "materialize",
        "--start",
        "2024-01-01",
        "--end",
        "2024-01-02",
        "--raw",
        str(tmp / "raw"),
        "--lake",
        str(tmp / "lake"),
        "--prices",
        str(prices),
        "--summary",
        env=env,
    )
    return tmp, env, out.stdout


def test_materialize_reports_progress_and_summary(run):
    import re

    _, _, stdout = run
    assert "2024-01-01..2024-01-02  ok  run" in stdout  # the range in one run
    assert "GPUs: 4" in stdout and "GPU-hours: 192.0" in stdout
    assert "Most wasteful namespace / model" in stdout
    # the workloads wasting the most: cluster/namespace/workload, waste of cost, diagnosis -> action
    assert "Top workloads by recoverable waste (USD over the period):" in stdout
    top = stdout.split("Top workloads by recoverable waste")[1].split("Persistent")[0]
    assert (
        len(
            re.findall(r"^    \S+/\S+/\S+ +waste +\$[\d,.]+ of +\$[\d,.]+ +\w+ +-> \S+$", top, re.M)
        )
        == 4
    )
    # progress while the run works: each step's start and end with the elapsed time, per day
    assert re.search(r"^\s+\d+\.\ds  staging started$", stdout, re.M), stdout
    assert re.search(r"^\s+\d+\.\ds  staging done \(\d+\.\ds\)$", stdout, re.M)
    assert re.search(r"^\s+\d+\.\ds    2024-01-02: \d+ gpu_minutes rows", stdout, re.M)
    assert stdout.index("ingest started") < stdout.index("staging started")


def test_the_closing_hints_work_as_printed(run):
    """Each `sql` hint after the summary runs as printed, on the lake the run wrote."""
    import shlex

    tmp, env, stdout = run
    hints = [ln.strip() for ln in stdout.splitlines() if " sql " in ln and "-readonly" not in ln]
    assert len(hints) == 5 and all(f"--lake {tmp / 'lake'}" in h for h in hints)
    for h in hints:
        p = subprocess.run(shlex.split(h), env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.strip(), (h, p.stdout, p.stderr)


def test_runs_are_recorded_in_the_persistent_instance(run):
    tmp, _, _ = run
    with dg.DagsterInstance.from_config(str(tmp / "dh")) as instance:
        runs = instance.get_runs()
        daily = [r for r in runs if r.job_name == "daily_pipeline"]
        assert [
            (
                r.tags["dagster/asset_partition_range_start"],
                r.tags["dagster/asset_partition_range_end"],
            )
            for r in daily
        ] == [("2024-01-01", "2024-01-02")]
        # both days' partitions are materialized by that one run
        keys = instance.get_materialized_partitions(dg.AssetKey("priced_waste"))
        assert keys == {"2024-01-01", "2024-01-02"}
        # the views file is written by its own asset, once, not by the partitioned runs; the
        # days' month by its own job, after them (instance.get_runs: newest first)
        assert [r.job_name for r in runs if r not in daily] == [
            "refresh_warehouse",
            "namespace_monthly_job",
        ]
        (month,) = [r for r in runs if r.job_name == "namespace_monthly_job"]
        assert month.tags["dagster/partition"] == "2024-01"
        # the lake's own views file, inside it (two lakes never share one)
        assert (tmp / "lake" / "_warehouse.duckdb").is_file()
        assert not (tmp / "warehouse.duckdb").exists()
        assert instance.get_latest_materialization_event(dg.AssetKey("priced_waste")) is not None


def test_each_day_of_a_range_run_has_its_own_metadata(run):
    """One run over two days records, per partition, that day's rows, file, charts and checks'
    failed days (the UI shows each partition's own numbers, not the range's)."""
    import polars as pl

    def latest(instance, key, day):
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[day]), limit=1
        ).records
        return record.asset_materialization.metadata

    tmp, _, _ = run
    with dg.DagsterInstance.from_config(str(tmp / "dh")) as instance:
        for table in ("gpu_samples", "gpu_minutes", "priced_waste", "persistent_bottlenecks"):
            for day in ("2024-01-01", "2024-01-02"):
                meta = latest(instance, table, day)
                path = meta["dagster/uri"].value
                assert f"date={day}" in path, (table, day, path)
                rows = pl.read_parquet(path).height
                assert meta["dagster/row_count"].value == rows, (table, day)
                assert rows > 0 or table == "persistent_bottlenecks"
                assert "rules" in meta or table == "gpu_samples"
        for day in ("2024-01-01", "2024-01-02"):
            meta = latest(instance, "daily_report", day)
            assert meta["dagster/uri"].value.endswith(f"gpu_report_{day}.html")
            charts = [k for k, v in meta.items() if "data:image/png;base64," in str(v.value)]
            assert len(charts) == meta["charts"].value >= 6
            assert all(len(k) <= 30 and not k.startswith("chart_") for k in charts), charts
        # a check of a range run names the days that failed (none here)
        ev = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey("priced_waste"), "cost_split_sums_to_cost")]
        )
        (execution,) = ev.values()
        meta = execution.event.asset_check_evaluation.metadata
        assert meta["failed_days"].value == "none" and meta["days"].value == 2


def test_sql_reads_marts_with_overridden_prices(run):
    tmp, env, _ = run
    out = cli(
        "sql",
        "--lake",
        str(tmp / "lake"),
        "--format",
        "json",
        "SELECT count(*) AS n, max(price_usd_per_hour) AS p FROM gpu_minutes",
        env=env,
    )
    assert json.loads(out.stdout) == [{"n": 4 * 1440 * 2, "p": 3.0}]
    q = cli(
        "sql",
        "--lake",
        str(tmp / "lake"),
        "--format",
        "csv",
        "-f",
        "sql/queries/fleet_trend.sql",
        env=env,
    )
    assert (
        q.stdout.splitlines()[0].startswith("date,gpus,gpu_hours")
        and len(q.stdout.splitlines()) == 3
    )


def test_bad_requests_fail_with_one_clear_line(run):
    tmp, env, _ = run
    p = cli("sql", "--lake", str(tmp / "lake"), "DELETE FROM gpu_minutes", env=env, check=False)
    assert (
        p.returncode == 2
        and p.stderr.strip() == "error: only read queries are allowed here, not DELETE"
    )
    p = cli("materialize", "--start", "2024-01-05", "--end", "2024-01-01", env=env, check=False)
    assert p.returncode == 2 and "before --start" in p.stdout and "Traceback" not in p.stderr
    p = cli(
        "materialize",
        "--start",
        "2024-01-01",
        "--prices",
        str(tmp / "nope.csv"),
        env=env,
        check=False,
    )
    assert p.returncode == 2 and p.stdout == (
        f"error: --prices {tmp / 'nope.csv'}: not found (allowed: a readable CSV file: the price "
        "book)\n"
    )
    for flag, value, message in (
        ("--gpus", "0", "error: --gpus must be between 1 and 1,000,000, not 0"),
        ("--clusters", "5", "error: --clusters must be between 1 and 3, not 5"),
        ("--days", "0", "error: --days must be between 1 and 3,660, not 0"),
    ):
        p = cli("generate", flag, value, "--out", str(tmp / "g"), env=env, check=False)
        assert p.returncode == 2 and p.stdout.strip() == message and not p.stderr, (flag, p)
    assert not (tmp / "g").exists()


def test_report_and_showback_write_through_links_never_and_refuse_a_folder(run):
    """A link planted where the report or the showback file goes is replaced, not followed:
    the file it points to outside the lake is left alone (adversarial review); `--out` naming a
    folder is one line, exit 2, not a traceback."""
    tmp, env, _ = run
    reports = tmp / "lake" / "_reports"
    reports.mkdir(exist_ok=True)
    victims = {}
    for name, args in (
        ("gpu_report_2024-01-02.html", ("report", "--date", "2024-01-02")),
        ("showback_2024-01.csv", ("showback", "--month", "2024-01")),
    ):
        victim = tmp / f"victim-{name}"
        victim.write_text("precious")
        (reports / name).unlink(missing_ok=True)
        (reports / name).symlink_to(victim)
        p = cli(*args, "--lake", str(tmp / "lake"), env=env)
        assert p.stdout.startswith(f"wrote {reports / name}")
        assert not (reports / name).is_symlink() and (reports / name).stat().st_size > 100
        victims[victim] = victim.read_text()
        p = cli(*args, "--lake", str(tmp / "lake"), "--out", str(tmp), env=env, check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert (
            p.stdout
            == f"error: --out {tmp} is a folder: give the name of a file (in it, or elsewhere)\n"
        )
    assert set(victims.values()) == {"precious"}


def test_a_late_day_names_the_later_days_whose_window_reads_it(run):
    """A run of one day does not run the six after it again: their persistent_bottlenecks read
    it in their window, and the run says so, with the command (adversarial review)."""
    tmp, env, _ = run
    args = ("--raw", str(tmp / "raw"), "--lake", str(tmp / "lake"))
    p = cli("materialize", "--start", "2024-01-01", *args, env=env)
    assert (
        "  note: persistent_bottlenecks of 2024-01-02..2024-01-02 read these days in their "
        "7-day window and were not run again: "
    ) in p.stdout
    # with this run's --raw and --lake: without them the advice would run the default lake
    flags = f"--raw {tmp / 'raw'} --lake {tmp / 'lake'}"
    assert f"materialize --start 2024-01-02 --end 2024-01-02 {flags}\n" in p.stdout
    p = cli("materialize", "--start", "2024-01-02", *args, env=env)
    assert "note: persistent_bottlenecks" not in p.stdout


def test_every_command_has_help_with_an_example():
    import argparse

    from gpu_pipeline.cli import EXAMPLES, parser

    p = parser()
    top = p.format_help()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(EXAMPLES)  # every command, each with an example
    for name, sp in sub.choices.items():
        assert f"  {name} " in top  # the top-level help lists it with its one-line help
        text = " ".join(sp.format_help().split())
        assert f"example: gpu-pipeline {name}" in text, name
        assert all(a.help for a in sp._actions if a.dest != "help"), name  # every option explained


def test_top_level_help_lists_every_command_on_a_line_of_its_own(monkeypatch):
    """`gpu-pipeline --help` in an 80-column terminal: each command and its whole one-line help
    on one line (none wrapped, none missing: pull, sample and report too)."""
    import argparse

    from gpu_pipeline.cli import parser

    monkeypatch.setenv("COLUMNS", "80")
    p = parser()
    lines = p.format_help().splitlines()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._get_subactions()}
    assert set(helps) == set(sub.choices)
    for name, text in helps.items():
        assert any(ln.split(None, 1) == [name, text] for ln in lines), (name, lines)
    assert all(len(ln) <= 80 for ln in lines)


def test_report_help_names_the_folder_report_writes_to(run):
    """`report --help` gives the default output as the real path for the lake in use, and
    `report` without --out writes exactly there."""
    tmp, env, _ = run
    env = {**env, "GPU_PIPELINE_LAKE": str(tmp / "lake")}
    help_text = " ".join(cli("report", "--help", env=env).stdout.split())
    folder = tmp / "lake" / "_reports"
    assert f"(default {folder}/gpu_report_DATE.html;" in help_text, help_text
    out = cli("report", "--date", "2024-01-02", env=env).stdout
    assert out.startswith(f"wrote {folder / 'gpu_report_2024-01-02.html'} ("), out


def test_summary_refuses_what_it_cannot_summarize_with_one_line(run):
    """Like materialize: exit 2 for a request that cannot be right (--end before --start), 1
    when there is nothing to summarize (no lake, no GPU-minutes in the range); one line, no
    traceback."""
    tmp, env, _ = run
    lake = str(tmp / "lake")
    for args, rc, line in (
        (
            ("--start", "2024-01-05", "--end", "2024-01-01", "--lake", lake),
            2,
            "error: --end 2024-01-01 is before --start 2024-01-05",
        ),
        (
            ("--start", "2024-01-01", "--lake", str(tmp / "no_lake")),
            1,
            f"error: the lake {tmp / 'no_lake'} does not exist: nothing to summarize. Materialize "
            "some days first (gpu-pipeline materialize --start D), or point --lake at a lake",
        ),
        (
            ("--start", "2023-06-01", "--end", "2023-06-07", "--lake", lake),
            1,
            f"error: no GPU-minutes in the lake {lake} for 2023-06-01..2023-06-07; its "
            "gpu_minutes partitions span 2024-01-01..2024-01-02",
        ),
    ):
        p = cli("summary", *args, env=env, check=False)
        assert (p.returncode, p.stdout, p.stderr) == (rc, line + "\n", ""), (args, p)


def test_report_of_a_lake_that_does_not_exist_says_so(run):
    """It said "no gpu_minutes for D … materialize the day first", as of a lake without the
    day (new-user review); summary and showback name the missing lake."""
    tmp, env, _ = run
    p = cli("report", "--date", "2024-01-01", "--lake", str(tmp / "no_lake"), env=env, check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert (
        p.stderr == f"error: the lake {tmp / 'no_lake'} does not exist: materialize the day first\n"
    )


def test_summary_of_a_range_with_gaps_says_which_days_have_no_data(run):
    tmp, env, _ = run
    out = cli(
        "summary",
        "--start",
        "2023-12-30",
        "--end",
        "2024-01-03",
        "--lake",
        str(tmp / "lake"),
        env=env,
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "Fleet summary 2023-12-30 .. 2024-01-03"
    assert lines[1] == ("  5 days asked, 2 with data: 2023-12-30..2023-12-31, 2024-01-03 have none")
    assert "GPUs: 4" in out  # the days with data, summarized
    full = cli(
        "summary",
        "--start",
        "2024-01-01",
        "--end",
        "2024-01-02",
        "--lake",
        str(tmp / "lake"),
        env=env,
    )
    assert "with data" not in full.stdout  # every day has data: nothing to say


def test_plain_materialize_prints_where_the_reports_are(run, tmp_path):
    """Without --summary, materialize still says where each day's report is."""
    tmp, env, _ = run
    env = {**env, "DAGSTER_HOME": str(tmp_path / "dh")}
    lake = tmp_path / "lake"
    out = cli(
        "materialize",
        "--start",
        "2024-01-01",
        "--end",
        "2024-01-02",
        "--raw",
        str(tmp / "raw"),
        "--lake",
        str(lake),
        env=env,
    ).stdout
    reports = [lake / "_reports" / f"gpu_report_2024-01-0{i}.html" for i in (1, 2)]
    assert all(r.is_file() for r in reports)
    assert f"  reports: {reports[0]}\n           {reports[1]}\n" in out, out
    assert "Fleet summary" not in out
