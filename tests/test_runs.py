"""`gpu_pipeline.runs`: the run logic of `gpu-pipeline materialize`, out of the CLI (issue "One
home per fact", item 4). The steps it takes outside the run (parsing the landing files into the
cache) use the run's own resources; the CLI only parses arguments and prints."""

import ast
from datetime import date
from pathlib import Path

import pytest
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline import runs
from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.settings import Settings

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_pipeline"


def test_the_steps_outside_the_run_use_the_run_resources(tmp_path, monkeypatch):
    """Options set by variables (bound as `dg.EnvVar`s) and by flags (values) reach the cache
    warming as they reach the run: the CSV time zone, the largest file, the cache folder."""
    raw, lake, cache = tmp_path / "raw", tmp_path / "lake", tmp_path / "cache"
    day = date(2024, 1, 1)
    write_file(
        raw / "a.prom", expo_lines("GPU-a", MODELS["A100"], "h1", "ns", day, range(3), 50, 200)
    )
    monkeypatch.setenv("GPU_PIPELINE_CSV_TIMEZONE", "Europe/Paris")
    monkeypatch.setenv("GPU_PIPELINE_MAX_FILE_MB", "5")
    monkeypatch.setenv("GPU_PIPELINE_CACHE", str(cache))
    s = Settings.from_env().replace(raw=str(raw), lake=str(lake))  # as the CLI's flags do
    with runs.run_resources(build_definitions(s)) as res:
        landing, lk = res["landing"], res["lake"]
        opts = landing.parse_options()
        assert (opts.csv_timezone, opts.max_file_bytes) == ("Europe/Paris", 5 * 2**20)
        assert (landing.root, lk.root) == (str(raw), str(lake))
        said: list[str] = []
        parsed = runs.warm_parse_cache(landing, lk, said.append)
    assert [pf.records_on(day) for pf in parsed] == [6]
    assert said[0] == "parsing 1 new landing file(s), 0 MiB"
    assert any(cache.iterdir()) and not lake.exists()  # the cache the settings name


def test_refusals_say_why_before_anything_runs(tmp_path):
    s = Settings(raw=str(tmp_path / "raw"), lake=str(tmp_path / "lake"))
    with pytest.raises(runs.Refused) as e:
        runs.check_days(s, date(2024, 1, 5), date(2024, 1, 1))
    assert (e.value.code, str(e.value)) == (2, "--end 2024-01-01 is before --start 2024-01-05")
    with pytest.raises(runs.Refused) as e:
        runs.check_records(
            [],
            [date(2024, 1, 1)],
            runs.Request(date(2024, 1, 1), date(2024, 1, 1)),
            tmp_path / "raw",
            print,
        )
    assert e.value.code == 1 and "does not exist: nothing to materialize" in str(e.value)


@pytest.mark.parametrize("module", ["cli.py", "runs.py", "lib/summary.py"])
def test_no_function_over_80_lines(module):
    tree = ast.parse((PACKAGE / module).read_text())
    long = [
        (n.name, n.end_lineno - n.lineno + 1)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno >= 80
    ]
    assert long == []


def test_the_cli_holds_no_run_logic():
    """cli.py neither builds definitions nor runs a job nor reads the landing zone."""
    text = (PACKAGE / "cli.py").read_text()
    for word in (
        "build_definitions",
        "execute_in_process",
        "LakeResource",
        "LandingResource",
        "parse_all",
        "DagsterInstance",
    ):
        assert word not in text, word
