"""Configuration errors are one line (issue "Integrity, second pass", items 10-12).

Every GPU_PIPELINE_* variable is checked once, before anything runs (the CLI, the code location,
`dg check defs`); the price book, catalog and energy rates are checked cell by cell; a value that
does not hold is one line naming the variable (or file, line and column), the value and what is
allowed: exit 2, never a traceback."""

import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from helpers import MODELS, cli, cli_env, expo_lines, write_file

from gpu_pipeline.settings import (
    CHECKS,
    ENV_VARS,
    PROM_SETTINGS,
    Settings,
    SettingsError,
)

REPO = Path(__file__).resolve().parents[1]
TODAY = datetime.now(UTC).date()
LATER = TODAY + timedelta(days=2)

# --- 10. every variable: one line naming it, its value and what is allowed --------------------

# the issue's cases, as the CLI prints them
ISSUE_CASES = [
    (
        "GPU_PIPELINE_CHUNK_MB",
        "abc",
        "GPU_PIPELINE_CHUNK_MB=abc: not a whole number "
        "(allowed: a whole number of MiB from 16 to 1048576)",
    ),
    (
        "GPU_PIPELINE_CSV_TIMEZONE",
        "Mars/Olympus",
        "GPU_PIPELINE_CSV_TIMEZONE=Mars/Olympus: not a time zone "
        "(allowed: an IANA time zone such as UTC or Europe/Berlin)",
    ),
    (
        "GPU_PIPELINE_START_DATE",
        "2026-13-45",
        "GPU_PIPELINE_START_DATE=2026-13-45: not a date "
        "(allowed: a date YYYY-MM-DD, at most today in UTC)",
    ),
    (
        "GPU_PIPELINE_EXECUTOR",
        "banana",
        "GPU_PIPELINE_EXECUTOR=banana: unknown (allowed: in_process, multiprocess or k8s)",
    ),
    (
        "GPU_PIPELINE_MAX_FILE_MB",
        "0",
        "GPU_PIPELINE_MAX_FILE_MB=0: out of range "
        "(allowed: a whole number of MiB from 1 to 1048576)",
    ),
    (
        "GPU_PIPELINE_CACHE",
        "/etc/passwd",
        "GPU_PIPELINE_CACHE=/etc/passwd: a file, not a folder "
        "(allowed: a local folder this user can write, made if missing; unset: beside the lake)",
    ),
    (
        "GPU_PIPELINE_START_DATE",
        LATER.isoformat(),
        f"GPU_PIPELINE_START_DATE={LATER}: after today, {TODAY} in UTC: no day of it has a "
        "partition yet (allowed: a date YYYY-MM-DD, at most today in UTC)",
    ),
]

# a value each variable does not allow, and why (every variable settings.py reads has one)
BAD = {
    "GPU_PIPELINE_RAW": ("/etc/passwd", "a file, not a folder"),
    "GPU_PIPELINE_LAKE": ("ftp://host/lake", "not a local folder or a known store"),
    "GPU_PIPELINE_CACHE": ("/etc/passwd/cache", "/etc/passwd is a file, not a folder"),
    "GPU_PIPELINE_PRICES": ("/nonexistent/prices.csv", "not found"),
    "GPU_PIPELINE_CATALOG": ("/etc", "not a file"),
    "GPU_PIPELINE_ENERGY": ("/nonexistent/energy.csv", "not found"),
    "GPU_PIPELINE_RULES": ("/nonexistent/rules.toml", "not found"),
    "GPU_PIPELINE_START_DATE": ("20240101", "not a date"),
    "GPU_PIPELINE_EXECUTOR": ("threads", "unknown"),
    "GPU_PIPELINE_CHUNK_MB": ("8", "out of range"),
    "GPU_PIPELINE_CHUNK_GPUS": ("-1", "out of range"),
    "GPU_PIPELINE_SPLIT": ("hosts", "unknown"),
    "GPU_PIPELINE_CSV_TIMEZONE": ("CEST", "not a time zone"),
    "GPU_PIPELINE_MAX_FILE_MB": ("1.5", "not a whole number"),
    "GPU_PIPELINE_SENSOR_INTERVAL": ("0", "out of range"),
    "GPU_PIPELINE_BACKFILL_DAYS": ("367", "out of range"),
    "GPU_PIPELINE_PROM_URL": ("prometheus:9090", "not an http(s) URL with a host"),
    "GPU_PIPELINE_PROM_TOKEN": ("two words", "holds spaces or control characters"),
    "GPU_PIPELINE_PROM_USER": ("a:b", "holds a ':' or control characters"),
    "GPU_PIPELINE_PROM_PASSWORD": ("line\nbreak", "holds control characters"),
    "GPU_PIPELINE_PROM_CA_BUNDLE": ("/nonexistent/ca.pem", "not a readable file or folder"),
    "GPU_PIPELINE_PROM_VERIFY": ("maybe", "not a yes or no"),
    "GPU_PIPELINE_PROM_SELECTOR": ("cluster=east", "not a list of label matchers"),
    "GPU_PIPELINE_PROM_MODE": ("instant", "unknown"),
    "GPU_PIPELINE_PROM_STEP": ("0", "out of range"),
    "GPU_PIPELINE_PROM_WINDOW": ("30", "out of range"),
    "GPU_PIPELINE_PROM_CONCURRENCY": ("100", "out of range"),
    "GPU_PIPELINE_PROM_CLUSTER": ("../east", "not a folder name"),
    "GPU_PIPELINE_PROM_MAX_RESPONSE_MB": ("0", "out of range"),
    "GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S": ("soon", "not a whole number"),
    "GPU_PIPELINE_SQL_MEMORY_MB": ("8", "out of range"),
    "GPU_PIPELINE_SQL_THREADS": ("two", "not a whole number"),
    "GPU_PIPELINE_SQL_TIMEOUT_S": ("-1", "out of range"),
    "GPU_PIPELINE_SQL_SPILL_MB": ("lots", "not a whole number"),
    "GPU_PIPELINE_NOTIFY_URL": (
        "hooks.slack.com/services/T0/B0/X",
        "not an http(s) URL with a host",
    ),
    "GPU_PIPELINE_REPORT_BASE_URL": (
        "https://reports.example/gpu?sig=1",
        "has a ?query or #fragment (the report's file name is appended)",
    ),
}
# and a value each allows
GOOD = {
    "GPU_PIPELINE_RAW": "data/raw",
    "GPU_PIPELINE_LAKE": "s3://bucket/lake",
    "GPU_PIPELINE_CACHE": "data/not-made-yet/cache",
    "GPU_PIPELINE_PRICES": str(REPO / "gpu_pipeline/reference/prices.csv"),
    "GPU_PIPELINE_CATALOG": str(REPO / "gpu_pipeline/reference/gpu_catalog.csv"),
    "GPU_PIPELINE_ENERGY": str(REPO / "gpu_pipeline/reference/energy.csv"),
    "GPU_PIPELINE_RULES": str(REPO / "config/rules.example.toml"),
    "GPU_PIPELINE_START_DATE": TODAY.isoformat(),
    "GPU_PIPELINE_EXECUTOR": "multiprocess",
    "GPU_PIPELINE_CHUNK_MB": "16",
    "GPU_PIPELINE_CHUNK_GPUS": "0",
    "GPU_PIPELINE_SPLIT": "cluster",
    "GPU_PIPELINE_CSV_TIMEZONE": "Europe/Berlin",
    "GPU_PIPELINE_MAX_FILE_MB": "1048576",
    "GPU_PIPELINE_SENSOR_INTERVAL": "5",
    "GPU_PIPELINE_BACKFILL_DAYS": "1",
    "GPU_PIPELINE_PROM_URL": "https://user:pw@mimir.example:8080/prometheus",
    "GPU_PIPELINE_PROM_TOKEN": "eyJhbGciOi.J9x-_",
    "GPU_PIPELINE_PROM_USER": "grafana reader",
    "GPU_PIPELINE_PROM_PASSWORD": "p@ss word:1",
    "GPU_PIPELINE_PROM_CA_BUNDLE": "/etc/ssl/certs",
    "GPU_PIPELINE_PROM_VERIFY": "off",
    "GPU_PIPELINE_PROM_SELECTOR": "{cluster=\"east\", env=~'prod.*',}",
    "GPU_PIPELINE_PROM_MODE": "range",
    "GPU_PIPELINE_PROM_STEP": "15",
    "GPU_PIPELINE_PROM_WINDOW": "86400",
    "GPU_PIPELINE_PROM_CONCURRENCY": "8",
    "GPU_PIPELINE_PROM_MAX_RESPONSE_MB": "64",
    "GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S": "600",
    "GPU_PIPELINE_SQL_MEMORY_MB": "2048",
    "GPU_PIPELINE_SQL_THREADS": "4",
    "GPU_PIPELINE_SQL_TIMEOUT_S": "0",
    "GPU_PIPELINE_SQL_SPILL_MB": "0",
    "GPU_PIPELINE_PROM_CLUSTER": "east-1.prod",
    "GPU_PIPELINE_NOTIFY_URL": "https://hooks.slack.com/services/T0/B0/XXXX",
    "GPU_PIPELINE_REPORT_BASE_URL": "https://reports.example/gpu/",
}


def _variables_read() -> set[str]:
    return {*ENV_VARS.values(), *(var for var, _ in PROM_SETTINGS.values())}


def test_every_variable_read_has_a_check_and_is_documented():
    """Every GPU_PIPELINE_* variable settings.py reads, and every one the package names, has its
    line in CHECKS, a bad and a good example here, and a row in README "Operating it"."""
    named = set()
    for path in (REPO / "gpu_pipeline").rglob("*.py"):
        named |= set(
            re.findall(r"GPU_PIPELINE_[A-Z][A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", path.read_text())
        )
    assert _variables_read() <= set(CHECKS)
    assert named <= set(CHECKS), named - set(CHECKS)
    assert set(BAD) == set(CHECKS) == set(GOOD)
    readme = (REPO / "README.md").read_text()
    operating = readme[readme.index("## Operating it") :]
    operating = operating[: operating.index("\n## ", 4)]
    for var, check in CHECKS.items():
        assert f"| `{var}` |" in operating, var
        assert check.allowed in " ".join(operating.split()), (var, check.allowed)


@pytest.mark.parametrize("var", sorted(CHECKS))
def test_each_variable_refuses_a_bad_value_with_one_line(var):
    value, why = BAD[var]
    with pytest.raises(SettingsError) as e:
        Settings.from_env({var: value})
    shown = "<hidden>" if CHECKS[var].secret else (value if "\n" not in value else repr(value))
    assert e.value.lines == [f"{var}={shown}: {why} (allowed: {CHECKS[var].allowed})"] or (
        # values the shell would quote are shown quoted
        len(e.value.lines) == 1
        and e.value.lines[0].startswith(f"{var}=")
        and e.value.lines[0].endswith(f": {why} (allowed: {CHECKS[var].allowed})")
    ), e.value.lines
    assert "\n" not in e.value.lines[0]
    Settings.from_env({var: GOOD[var]})  # a value it allows is taken


def test_secrets_are_never_shown():
    with pytest.raises(SettingsError) as e:
        Settings.from_env(
            {
                "GPU_PIPELINE_PROM_TOKEN": "s3cret token",
                "GPU_PIPELINE_PROM_URL": "ftp://me:s3cret@host",
            }
        )
    assert "s3cret" not in str(e.value) and len(e.value.lines) == 2
    assert "GPU_PIPELINE_PROM_URL='ftp://me:<hidden>@host'" in str(e.value)


def test_an_unwritable_cache_folder_is_refused(tmp_path):
    if os.geteuid() == 0:  # root writes through mode bits: a folder no one can create files in
        ro, where = Path("/sys"), "/sys"
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        where = str(ro)
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"GPU_PIPELINE_CACHE": str(ro / "cache")})
    assert e.value.lines == [
        f"GPU_PIPELINE_CACHE={ro / 'cache'}: cannot write in {where}: Permission denied "
        f"(allowed: {CHECKS['GPU_PIPELINE_CACHE'].allowed})"
    ]


def test_all_bad_variables_are_named_at_once():
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"GPU_PIPELINE_CHUNK_MB": "abc", "GPU_PIPELINE_PROM_MODE": "x"})
    assert [ln.split("=")[0] for ln in e.value.lines] == [
        "GPU_PIPELINE_CHUNK_MB",
        "GPU_PIPELINE_PROM_MODE",
    ]


def _no_traceback(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.parametrize(("var", "value", "line"), ISSUE_CASES, ids=lambda x: str(x)[:20])
def test_the_issues_cases_stop_materialize_with_one_line(tmp_path, var, value, line):
    env = {**cli_env(tmp_path), var: value}
    p = cli(
        "materialize",
        "--start",
        "2024-01-01",
        "--raw",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
        env=env,
        check=False,
    )
    # the cases were written at collection: "today" may have moved on since (UTC midnight)
    line = line.replace(f"today, {TODAY} in UTC", f"today, {datetime.now(UTC).date()} in UTC")
    assert (p.returncode, p.stdout, p.stderr) == (2, f"error: {line}\n", "")
    assert not (tmp_path / "dh").exists() and not (tmp_path / "lake").exists()


def test_every_command_checks_the_settings_first(tmp_path):
    env = {**cli_env(tmp_path), "GPU_PIPELINE_CHUNK_MB": "abc"}
    line = f"error: {ISSUE_CASES[0][2]}\n"
    commands = {
        "generate": ["--out", str(tmp_path / "g")],
        "materialize": ["--start", "2024-01-01"],
        "sql": ["SELECT 1"],
        "summary": ["--start", "2024-01-01"],
        "pull": ["--start", "2024-01-01", "--url", "http://127.0.0.1:9"],
        "sample": ["--duration", "0.1", "--out", str(tmp_path / "s")],
        "report": ["--date", "2024-01-01"],
        "init-instance": [],
        "showback": ["--month", "2024-01"],
    }
    from gpu_pipeline.cli import EXAMPLES

    assert set(commands) == set(EXAMPLES)
    for cmd, args in commands.items():
        p = cli(cmd, *args, env=env, check=False)
        assert (p.returncode, p.stdout, p.stderr) == (2, line, ""), cmd
    assert not any((tmp_path / d).exists() for d in ("g", "s", "dh"))
    # help still works, to find out what to set
    assert "materialize" in cli("--help", env=env).stdout


def test_a_flag_is_checked_as_its_variable_is(tmp_path):
    env = cli_env(tmp_path)
    p = cli("materialize", "--start", "2024-01-01", "--lake", "/etc/passwd", env=env, check=False)
    assert (p.returncode, p.stderr) == (2, "")
    assert p.stdout == (
        "error: --lake /etc/passwd: a file, not a folder "
        f"(allowed: {CHECKS['GPU_PIPELINE_LAKE'].allowed})\n"
    )


def test_the_code_location_fails_to_load_with_the_one_line(tmp_path):
    """`dg check defs` (as `dg dev` / `dagster dev` load the code location): our line, not the
    import chain of the module that read the variable first."""
    env = {
        **cli_env(tmp_path),
        "GPU_PIPELINE_CSV_TIMEZONE": "Mars/Olympus",
        "DAGSTER_HOME": str(tmp_path / "dh"),
    }
    env.pop("VIRTUAL_ENV", None)
    p = subprocess.run(
        [str(Path(sys.executable).parent / "dg"), "check", "defs"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert ISSUE_CASES[1][2] in out, out
    ours = [
        ln for ln in out.splitlines() if ln.strip().startswith("File ") and "gpu_pipeline" in ln
    ]
    assert len(ours) <= 1 and "gpu_pipeline/defs" not in out, out  # one frame: definitions.py
    _no_traceback(p)


# --- 12. days before GPU_PIPELINE_START_DATE are refused ---------------------------------------


def test_days_before_the_first_partition_are_refused(tmp_path):
    env = {**cli_env(tmp_path), "GPU_PIPELINE_START_DATE": "2024-06-01"}
    p = cli(
        "materialize",
        "--start",
        "2024-05-30",
        "--end",
        "2024-06-02",
        "--raw",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
        env=env,
        check=False,
    )
    assert (p.returncode, p.stderr) == (2, "")
    assert p.stdout == (
        "error: 2024-05-30 is before the first partition, 2024-06-01 (GPU_PIPELINE_START_DATE); "
        "set GPU_PIPELINE_START_DATE=2024-05-30 or earlier to materialize it\n"
    )
    assert not (tmp_path / "lake").exists()


# --- 11. reference files: money never negative, one line per bad cell -------------------------

HEAD = "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\n"


def test_a_negative_price_stops_materialize_with_its_line(tmp_path):
    prices = tmp_path / "prices.csv"
    prices.write_text(HEAD + "A10G,1.01,0.40\nA100-SXM4-40GB,-1e6,1.00\n")
    p = cli(
        "materialize",
        "--start",
        "2024-01-01",
        "--raw",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
        "--prices",
        str(prices),
        env=cli_env(tmp_path),
        check=False,
    )
    assert (p.returncode, p.stderr) == (2, "")
    assert p.stdout == (
        f"error: price book {prices} line 3, on_demand_usd_per_hour='-1e6': negative "
        "(allowed: a finite number from 0 to 1,000, USD per GPU-hour)\n"
    )


def test_an_odd_spot_price_is_a_warning_not_an_error(tmp_path):
    prices = tmp_path / "prices.csv"
    prices.write_text(HEAD + "A10G,1.01,1.50\n")
    env = {**cli_env(tmp_path), "GPU_PIPELINE_PRICES": str(prices)}
    p = cli(
        "materialize", "--start", "2024-01-01", "--raw", str(tmp_path / "raw"), env=env, check=False
    )
    _no_traceback(p)
    assert p.stdout.splitlines()[0] == (
        f"warning: price book {prices} line 2, spot_usd_per_hour=1.5: above "
        "on_demand_usd_per_hour=1.01 (no spot saving is proposed)"
    )
    assert "landing zone" in p.stdout and p.returncode == 1  # it went on (to find no data)


D = date(2024, 2, 6)


def test_a_run_with_a_negative_price_fails_its_step_with_the_line(tmp_path):
    """A Dagster run (UI, schedule, sensor) reads the price book in its steps: the step fails
    with the lines as its message; no cost is written."""
    from gpu_pipeline.defs import raw, staging
    from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
    from gpu_pipeline.lib.io.lake import Lake

    lines = expo_lines("GPU-a", MODELS["A100"], "n1", "team", D, range(600, 660), 50, 200.0)
    write_file(tmp_path / "raw" / "c1" / f"n1_{D}.prom", lines)
    prices = tmp_path / "prices.csv"
    prices.write_text(HEAD + "A100-SXM4-40GB,-1e6,1.00\nA10G,1.01,nan\n")
    r = dg.materialize(
        [raw.ingest, staging.staging],
        partition_key=D.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(tmp_path / "raw")),
            "reference": ReferenceResource(prices=str(prices)),
        },
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not r.success
    (failure,) = [ev for ev in r.all_events if ev.is_step_failure]
    err = failure.step_failure_data.error
    while err.cause is not None:
        err = err.cause
    assert err.cls_name == "ReferenceError"
    message = err.message.strip().removeprefix("gpu_pipeline.lib.reference.ReferenceError: ")
    assert message.splitlines() == [
        f"price book {prices} line 2, on_demand_usd_per_hour='-1e6': negative "
        "(allowed: a finite number from 0 to 1,000, USD per GPU-hour)",
        f"price book {prices} line 3, spot_usd_per_hour='nan': not finite "
        "(allowed: a finite number from 0 to 1,000, USD per GPU-hour, or empty (no spot price))",
    ]
    assert Lake(tmp_path / "lake").days("gpu_minutes") == []


@pytest.mark.parametrize(
    "var", ["GPU_PIPELINE_LAKE", "GPU_PIPELINE_RAW", "GPU_PIPELINE_PRICES", "GPU_PIPELINE_CACHE"]
)
def test_a_path_the_system_refuses_to_look_at_is_one_line(tmp_path, var):
    """A folder name over 255 bytes raised OSError out of the check (adversarial review)."""
    value = str(tmp_path / ("a" * 300) / "x")
    with pytest.raises(SettingsError) as e:
        Settings.from_env({var: value})
    assert len(e.value.lines) == 1 and "File name too long" in e.value.lines[0]
    assert e.value.lines[0].startswith(f"{var}={value}:")
