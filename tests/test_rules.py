"""Rules you can tune without editing code: a TOML file (GPU_PIPELINE_RULES) and run config,
checked, and written into every materialization they shaped."""

import re
from datetime import UTC, date, datetime

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline.defs import marts, raw, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.gpu_health import gpu_health
from gpu_pipeline.lib.reference import load_catalog
from gpu_pipeline.lib.rules import RULE_KEYS, RULES, HealthThresholds, RulesError, load_rules
from gpu_pipeline.lib.samples import collect_stable, conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA

D = date(2024, 2, 6)


def test_defaults_follow_the_spec_and_domain():
    r = RULES.flat()
    assert set(r) == set(RULE_KEYS)
    assert (
        r["phases.idle_below"],
        r["phases.productive_from"],
        r["phases.compute_bound_from"],
    ) == (
        10.0,
        70.0,
        90.0,
    )
    assert r["health.hot_from_c"] == 80.0  # temperature alert above 80 C
    assert r["bottlenecks.window_days"] == 7 and r["bottlenecks.persistent_min_days"] == 3


def test_a_rules_file_overrides_defaults_and_bad_files_say_what_is_wrong(tmp_path):
    f = tmp_path / "rules.toml"
    f.write_text("[phases]\nidle_below = 20\n[health]\nhot_from_c = 85.5\n")
    r = load_rules(str(f))
    assert (r.thresholds.idle_below, r.health.hot_from_c, r.thresholds.productive_from) == (
        20.0,
        85.5,
        70.0,
    )
    # run config over the file
    r = load_rules(str(f), {"health.hot_from_c": 90, "roi.target_rfu_pct": 75})
    assert (r.thresholds.idle_below, r.health.hot_from_c, r.roi_target_rfu_pct) == (
        20.0,
        90.0,
        75.0,
    )
    cases = {
        "[health]\nhot = 80\n": "line 2: unknown rule health.hot (did you mean health.hot_from_c? "
        "config/rules.example.toml lists every rule)",
        "[phases]\nidle_below = 120\n": "line 2: phases.idle_below = 120 is out of range [0, 100]",
        "[phases]\nidle_below = 80\n": "the rules must keep phases.idle_below <= "
        "phases.productive_from (80 > 70)",
        "[bottlenecks]\nwindow_days = 2.5\n": "line 2: bottlenecks.window_days must be a whole "
        "number, not 2.5",
        "[health]\nhot_from_c = 'warm'\n": "line 2: health.hot_from_c must be a number, not 'warm'",
        "[roi]\ntarget_rfu_pct = nan\n": "line 2: roi.target_rfu_pct = nan is out of range [1, 100]",
        "idle_below = 5\n": "line 1: idle_below = 5 is not a [section] (e.g. [health])",
    }
    for text, message in cases.items():
        f.write_text(text)
        with pytest.raises(RulesError) as e:
            load_rules(str(f))
        assert str(e.value) == f"rules file {f}: {message}", text
    f.write_text("[phases\n")
    with pytest.raises(RulesError, match=re.escape(f"rules file {f}: not TOML: ")):
        load_rules(str(f))
    with pytest.raises(RulesError, match="No such file"):
        load_rules(str(tmp_path / "missing.toml"))
    with pytest.raises(RulesError, match="can only be set in the rules file"):
        load_rules(None, {"bottlenecks.window_days": 5})


def test_every_problem_of_a_rules_file_is_its_own_line_in_file_order(tmp_path):
    f = tmp_path / "rules.toml"
    f.write_text(
        "# thresholds\n"
        "[phases]\n"
        "idle_bellow = 5\n"
        "productive_from = 95\n"
        "[health]\n"
        "hot_from_c = 300\n"
        "[recommendations]\n"
        "mps = -0.5\n"
        "mystery = 1\n"
    )
    with pytest.raises(RulesError) as e:
        load_rules(str(f))
    assert e.value.problems == [
        "line 3: unknown rule phases.idle_bellow (did you mean phases.idle_below? "
        "config/rules.example.toml lists every rule)",
        "line 6: health.hot_from_c = 300 is out of range [0, 130]",
        "line 8: recommendations.mps = -0.5 is out of range [0, 1]",
        "line 9: unknown rule recommendations.mystery (config/rules.example.toml lists every rule)",
        "the rules must keep phases.productive_from <= phases.compute_bound_from (95 > 90)",
    ]
    assert str(e.value).splitlines()[0] == f"rules file {f}: {e.value.problems[0]}"
    # run config: the same checks, every problem at once
    with pytest.raises(RulesError) as e:
        load_rules(None, {"health.hot": 1, "phases.idle_below": -1})
    assert str(e.value).splitlines() == [
        "run config: unknown rule health.hot (did you mean health.hot_from_c? "
        "config/rules.example.toml lists every rule)",
        "run config: phases.idle_below = -1 is out of range [0, 100]",
    ]


def test_hot_minutes_follow_the_temperature_rule():
    # five minutes at 78, 81, 83, 86, 90 C: 4 at or above 80 (the default), 2 at or above 85
    temps = [78.0, 81.0, 83.0, 86.0, 90.0]
    samples = pl.DataFrame(
        {
            "date": [D] * 5,
            "timestamp": [datetime(2024, 2, 6, 10, i, 5, tzinfo=UTC) for i in range(5)],
            "gpu_uuid": ["GPU-t"] * 5,
            "gpu_model": [MODELS["A100"]] * 5,
            "gpu_temp_c": temps,
            "power_w": [100.0] * 5,
        }
    )
    samples = conform(samples, GPU_SAMPLES_SCHEMA).lazy()
    cat = load_catalog()
    default = collect_stable(gpu_health(samples, cat)).row(0, named=True)
    strict = collect_stable(gpu_health(samples, cat, HealthThresholds(hot_from_c=85.0))).row(
        0, named=True
    )
    assert (default["hot_minutes"], strict["hot_minutes"]) == (4, 2)
    assert "4 min at or above 80.0 C" in default["reasons"]


def _land(raw_dir):
    # one hour: GPU-a at 15 % (underutilized by default, idle when idle_below = 20), GPU-b at 95 %
    lines = expo_lines("GPU-a", MODELS["A100"], "n1", "team", D, range(600, 660), 15, 150.0)
    lines += expo_lines("GPU-b", MODELS["A100"], "n1", "team", D, range(600, 660), 95, 380.0, gpu=1)
    write_file(raw_dir / "c1" / f"n1_{D}.prom", lines)


def _materialize(tmp_path, reference: ReferenceResource, run_config=None):
    assets = [raw.ingest, staging.staging, marts.gpu_health, marts.efficiency_roi]
    return dg.materialize(
        assets,
        partition_key=D.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(tmp_path / "raw")),
            "reference": reference,
        },
        instance=dg.DagsterInstance.ephemeral(),
        run_config=run_config,
    )


def test_the_rules_in_force_shape_the_marts_and_are_in_their_metadata(tmp_path):
    _land(tmp_path / "raw")
    r = _materialize(tmp_path, ReferenceResource())
    hourly = Lake(tmp_path / "lake").read("hourly_fleet_metrics", D)
    # two GPUs, one hour: 50 % of GPU-minutes underutilized (15 %), 50 % compute-bound (95 %)
    assert hourly.select("pct_idle", "pct_underutilized", "pct_compute_bound").row(0) == (
        0.0,
        50.0,
        50.0,
    )
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text("[phases]\nidle_below = 20\n[roi]\ntarget_rfu_pct = 80\n")
    r = _materialize(tmp_path, ReferenceResource(rules=str(rules_file)))
    hourly = Lake(tmp_path / "lake").read("hourly_fleet_metrics", D)
    assert hourly.select("pct_idle", "pct_underutilized", "pct_compute_bound").row(0) == (
        50.0,
        0.0,
        50.0,
    )
    roi = Lake(tmp_path / "lake").read("efficiency_roi", D)
    assert set(roi["target_rfu_pct"]) == {80.0}
    # fleet_daily follows the rules too (the view it replaced hard-coded 10 %): GPU-a idle
    fleet = Lake(tmp_path / "lake").read("fleet_daily", D).row(0, named=True)
    assert (fleet["pct_idle"], fleet["pct_underutilized"], fleet["pct_compute_bound"]) == (
        50.0,
        0.0,
        50.0,
    )
    meta = {
        m.asset_key.path[-1]: m.metadata
        for m in r.asset_materializations_for_node("staging")
        + r.asset_materializations_for_node("efficiency_roi")
    }
    assert meta["hourly_fleet_metrics"]["rules"].value["phases.idle_below"] == 20.0
    assert meta["efficiency_roi"]["rules"].value["roi.target_rfu_pct"] == 80.0
    # run config over the file: back to 10 % for this run only
    r = _materialize(
        tmp_path,
        ReferenceResource(rules=str(rules_file)),
        {"resources": {"reference": {"config": {"rule_overrides": {"phases.idle_below": 10.0}}}}},
    )
    hourly = Lake(tmp_path / "lake").read("hourly_fleet_metrics", D)
    assert hourly["pct_idle"].item() == 0.0
    (m,) = [
        m
        for m in r.asset_materializations_for_node("staging")
        if m.asset_key.path[-1] == "gpu_minutes"
    ]
    assert m.metadata["rules"].value["phases.idle_below"] == 10.0


def _coverage_check(result) -> dg.AssetCheckEvaluation:
    (ev,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "fleet_coverage"]
    return ev


def test_a_partial_day_warns_below_the_coverage_rule(tmp_path):
    """Two GPUs for one hour: 120 of 2 x 1,440 GPU-minutes, 4.2 % of the day. The coverage check
    warns (a WARN, the run succeeds) below coverage.warn_below: 90 % by default, here 4 %."""
    _land(tmp_path / "raw")
    r = _materialize(tmp_path, ReferenceResource())
    assert r.success
    fleet = Lake(tmp_path / "lake").read("fleet_daily", D).row(0, named=True)
    assert (fleet["gpus"], fleet["observed_gpu_minutes"], fleet["expected_gpu_minutes"]) == (
        2,
        120,
        2880,
    )
    assert fleet["coverage_pct"] == pytest.approx(100 * 120 / 2880)
    daily = Lake(tmp_path / "lake").read("gpu_daily", D)
    assert daily["coverage_pct"].to_list() == pytest.approx([100 * 60 / 1440] * 2)
    ev = _coverage_check(r)
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN
    assert ev.metadata["coverage_pct"].value == pytest.approx(100 * 120 / 2880)
    assert ev.metadata["warn_below_pct"].value == 90.0
    assert ev.metadata["gpu_days_below"].value == 2
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text("[coverage]\nwarn_below = 4\n")
    r = _materialize(tmp_path, ReferenceResource(rules=str(rules_file)))
    ev = _coverage_check(r)
    assert ev.passed and ev.metadata["warn_below_pct"].value == 4.0
    assert load_rules(str(rules_file)).flat()["coverage.warn_below"] == 4.0


def test_the_example_rules_file_lists_every_rule_with_its_default():
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "config" / "rules.example.toml"
    assert load_rules(str(example)) == RULES
    import tomllib

    listed = {f"{s}.{k}" for s, body in tomllib.loads(example.read_text()).items() for k in body}
    assert listed == set(RULE_KEYS)


def test_a_bad_rules_file_stops_the_cli_with_one_line(tmp_path):
    from helpers import cli, cli_env

    bad = tmp_path / "rules.toml"
    bad.write_text("[phases]\nidle_below = 99\n")
    _land(tmp_path / "raw")
    env = {**cli_env(tmp_path), "GPU_PIPELINE_RULES": str(bad)}
    p = cli(
        "materialize",
        "--start",
        str(D),
        "--raw",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
        env=env,
        check=False,
    )
    assert (p.returncode, p.stderr) == (2, "") and "Traceback" not in p.stdout
    # checked with the other settings, before anything runs: one line per problem
    assert p.stdout == (
        f"error: GPU_PIPELINE_RULES={bad}: the rules must keep phases.idle_below <= "
        "phases.productive_from (99 > 70) (allowed: a TOML rules file whose rules are known and "
        "in range, as in config/rules.example.toml)\n"
    )
    bad.write_text("[phases]\nidle_below = 'x'\n[health]\nhot_from_c = 500\n")
    p = cli("sql", "SELECT 1", env=env, check=False)
    allowed = "(allowed: a TOML rules file whose rules are known and in range, as in " + (
        "config/rules.example.toml)"
    )
    assert p.returncode == 2 and p.stdout.splitlines() == [
        f"error: GPU_PIPELINE_RULES={bad}: line 2: phases.idle_below must be a number, not 'x' "
        + allowed,
        f"error: GPU_PIPELINE_RULES={bad}: line 4: health.hot_from_c = 500 is out of range "
        "[0, 130] " + allowed,
    ]
