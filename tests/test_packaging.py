"""The package as a container image gets it: a wheel built from the repository, installed into a
fresh venv outside the checkout, runs generate, materialize, sql and report; `dg check defs`
loads the project; the version follows the changelog."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-3000:])
    return p


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files (the build writes beside its sources)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for f in filter(None, (x.decode() for x in files)):
        if not (REPO / f).exists():
            continue  # deleted in the working tree
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / f).is_symlink():
            os.symlink(os.readlink(REPO / f), src / f)
        elif (REPO / f).is_file():
            shutil.copy2(REPO / f, src / f)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp / "dist"), str(src)],
        cwd=tmp,
        env=env,
    )  # fmt: skip
    (whl,) = (tmp / "dist").glob("gpu_pipeline-*.whl")
    return whl


def test_the_wheel_ships_what_the_package_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in (
        "gpu_pipeline/sql/views.sql",
        "gpu_pipeline/sql/queries/fleet_trend.sql",
        "gpu_pipeline/config/dagster.yaml",
        "gpu_pipeline/config/rules.example.toml",
        "gpu_pipeline/reference/gpu_catalog.csv",
        "gpu_pipeline/reference/prices.csv",
        "gpu_pipeline/reference/energy.csv",
    ):
        assert need in names, need
    assert not any(n.startswith(("tests/", "benchmarks/", "data/")) for n in names)


def test_a_wheel_installed_outside_the_checkout_runs_the_commands(wheel, tmp_path):
    """A fresh venv holding only the wheel; the dependencies come from this venv's site-packages
    by a .pth line (never the checkout: this venv's editable install is not seen there)."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=os.environ)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "PYTHON"))}
    env |= {"DAGSTER_HOME": str(tmp_path / "dh"), "VIRTUAL_ENV": str(venv)}
    py = str(venv / "bin" / "python")
    run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", str(wheel)],
        cwd=tmp_path,
        env=env,
    )
    work = tmp_path / "work"  # the user's folder: no checkout anywhere above it
    work.mkdir()
    found = run([py, "-c", "import gpu_pipeline; print(gpu_pipeline.__file__)"], work, env)
    assert str(site) in found.stdout and str(REPO) not in found.stdout
    cli = str(venv / "bin" / "gpu-pipeline")
    run([cli, "generate", "--start", "2024-02-01", "--days", "1", "--gpus", "3",
         "--clusters", "1"], work, env)  # fmt: skip
    out = run([cli, "materialize", "--start", "2024-02-01", "--summary"], work, env).stdout
    assert "2024-02-01  ok" in out and "GPUs: 3" in out, out
    assert (tmp_path / "dh" / "dagster.yaml").is_file()  # the shipped instance config
    sql = run([cli, "sql", "--format", "csv", "SELECT count(*) AS n FROM fleet_daily"], work, env)
    assert sql.stdout.splitlines()[1] == "1", sql.stdout
    query = run(
        [cli, "sql", "-f", str(site / "gpu_pipeline/sql/queries/fleet_trend.sql")], work, env
    )
    assert "2024-02-01" in query.stdout
    run([cli, "report", "--date", "2024-02-01", "--out", str(work / "r.html")], work, env)
    page = (work / "r.html").read_text()
    assert "GPU efficiency report — 2024-02-01" in page and page.count("<img") >= 6


def test_dg_check_defs_loads_the_project():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PIPELINE_")}
    env["VIRTUAL_ENV"] = sys.prefix
    p = run([str(Path(sys.executable).with_name("dg")), "check", "defs"], REPO, env)
    assert "All definitions loaded successfully" in p.stdout + p.stderr


def test_the_version_follows_the_changelog():
    from gpu_pipeline import __version__

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    (latest,) = re.findall(r"^## (\d+\.\d+\.\d+)", (REPO / "CHANGELOG.md").read_text(), re.M)[:1]
    assert project == latest == __version__


def test_configuration_flows_through_resources_not_the_environment():
    """No module writes the process environment but allocator.py, and that only Polars'
    allocator variable (as Polars itself does on import); nothing under lib/ reads it (values
    arrive as arguments); only settings.py reads GPU_PIPELINE_* variables."""
    import ast

    writes, reads = [], []
    for path in sorted((REPO / "gpu_pipeline").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t for t in targets if isinstance(t, ast.Subscript)), None)
                if target is not None and "environ" in ast.unparse(target.value):
                    writes.append(f"{rel}:{ast.unparse(target.slice)}")
            elif isinstance(node, ast.Call):
                fn = ast.unparse(node.func)
                if fn.endswith(("environ.update", "environ.setdefault", "putenv", "environ.pop")):
                    writes.append(f"{rel}:{node.lineno}")
                if ("environ" in fn or fn.endswith("getenv")) and rel != "gpu_pipeline/settings.py":
                    reads.append(f"{rel}:{node.lineno}")
            elif (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value).endswith("environ")
                and rel != "gpu_pipeline/settings.py"
            ):
                reads.append(f"{rel}:{node.lineno}")
    assert writes == [
        "gpu_pipeline/allocator.py:'_RJEM_MALLOC_CONF'",
        # `materialize --url` with GPU_PIPELINE_EXECUTOR=multiprocess: the step processes inherit
        # the URL as if it had been exported (it may carry a password: never in the run record)
        "gpu_pipeline/runs.py:settings.PROM_SETTINGS['url'][0]",
    ]
    assert [r for r in reads if r.startswith("gpu_pipeline/lib/")] == []
    # the CLI's only use: the environment of the process it re-runs itself in (execve); the
    # allocator's: whether the allocator variables are set already; runs.py's: the --url write
    # above (a subscript on the left of `=` is walked as a subscript too)
    runs_write = [r for r in reads if r.startswith("gpu_pipeline/runs.py")]
    assert len(runs_write) == 1
    rest = [r for r in reads if r not in runs_write]
    assert all(r.startswith(("gpu_pipeline/cli.py", "gpu_pipeline/allocator.py")) for r in rest)
    allocator = (REPO / "gpu_pipeline/allocator.py").read_text()
    assert "GPU_PIPELINE_" not in allocator


def test_each_table_is_computed_in_the_file_named_after_it():
    """One home per table: `lib/ingest/<table>.py`, `lib/staging/<table>.py` or
    `lib/marts/<table>.py` defines what computes it (`DayAssembly` for gpu_samples, a function
    named after the table for the rest)."""
    import ast

    from gpu_pipeline.lib.schemas import TABLES

    lib = REPO / "gpu_pipeline" / "lib"
    for table in sorted(TABLES):
        homes = [
            p
            for layer in ("ingest", "staging", "marts")
            if (p := lib / layer / f"{table}.py").exists()
        ]
        assert len(homes) == 1, table
        body = ast.parse(homes[0].read_text()).body
        defined = {n.name for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert table in defined or (table == "gpu_samples" and "DayAssembly" in defined), (
            table,
            homes[0],
        )
