"""The import graph runs one way: a module imports only from its own layer or those below it
(issue "One home per fact": no arrow back up, as the one from staging to the marts was)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_pipeline"

# lowest first; a module belongs to the first layer with a prefix of its name
LAYERS = [
    [
        "gpu_pipeline.allocator",
        "gpu_pipeline.native",
        "gpu_pipeline.lib.fields",
        "gpu_pipeline.lib.rules",
        "gpu_pipeline.lib.display",
        "gpu_pipeline.lib.reference",
        "gpu_pipeline.lib.generate",
    ],
    [
        "gpu_pipeline.lib.samples",
        "gpu_pipeline.lib.columns",
        "gpu_pipeline.lib.schemas",
        "gpu_pipeline.settings",
    ],
    ["gpu_pipeline.lib.money"],
    ["gpu_pipeline.lib.staging"],
    ["gpu_pipeline.lib.ingest", "gpu_pipeline.lib.marts"],
    ["gpu_pipeline.lib.io"],
    ["gpu_pipeline.lib.summary", "gpu_pipeline.defs"],
    ["gpu_pipeline.definitions"],
    ["gpu_pipeline.runs"],
    ["gpu_pipeline.cli"],
]


def layer(module: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every gpu_pipeline module `path` imports, at the top or inside a function."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("gpu_pipeline")}


def test_every_module_has_a_layer():
    packages = {"gpu_pipeline", "gpu_pipeline.lib"}  # the faces of packages, nothing in them
    assert [m for m in modules() if m not in packages and layer(m) is None] == []


def test_no_import_runs_back_up():
    known = modules()
    up = []
    for name, path in sorted(known.items()):
        mine = layer(name)
        for imported in imports(path, name):
            if imported not in known and imported.rsplit(".", 1)[0] in known:
                imported = imported.rsplit(".", 1)[0]  # a name from a module
            theirs = layer(imported) if imported in known else None
            if mine is not None and theirs is not None and theirs > mine:
                up.append(f"{name} (layer {mine}) imports {imported} (layer {theirs})")
    assert up == []


def test_configuration_enters_through_build_definitions(tmp_path):
    """Partitions, the window mapping and the sensor interval come from the settings given to
    `build_definitions`, not from the environment when a module is imported."""
    import dagster as dg

    from gpu_pipeline.definitions import build_definitions
    from gpu_pipeline.settings import Settings

    rules = tmp_path / "rules.toml"
    rules.write_text("[bottlenecks]\nwindow_days = 3\npersistent_min_days = 2\n")
    s = Settings().replace(
        start_date="2023-06-01", sensor_interval_s=7, rules=str(rules), backfill_days=3
    )
    defs = build_definitions(s)
    graph = defs.resolve_asset_graph()
    starts = {
        graph.get(k).partitions_def.start.date().isoformat()
        for k in graph.get_all_asset_keys()
        if graph.get(k).partitions_def is not None
    }
    assert starts == {"2023-06-01"}
    assert defs.resolve_job_def("daily_pipeline").partitions_def.start.year == 2023
    window = graph.get(dg.AssetKey("persistent_bottlenecks")).partition_mappings[
        dg.AssetKey("gpu_daily")
    ]
    assert window.start_offset == -2
    # the report's 7-day trend is not the persistence window: it stays 7 days
    trend = graph.get(dg.AssetKey("daily_report")).partition_mappings[dg.AssetKey("fleet_daily")]
    assert trend.start_offset == -6
    # every daily asset (and so its checks) fans a backfill out into runs of 3 days
    policies = {
        graph.get(k).backfill_policy
        for k in graph.get_all_asset_keys()
        if graph.get(k).partitions_def is not None
    }
    assert policies == {dg.BackfillPolicy.multi_run(3)}
    assert {x.name: x.minimum_interval_seconds for x in defs.sensors}["landing_zone_sensor"] == 7
    # nothing global: the defaults again
    other = build_definitions(Settings()).resolve_job_def("daily_pipeline")
    assert other.partitions_def.start.date().isoformat() == "2024-01-01"


def test_no_module_reads_the_environment_when_imported():
    """Only `settings.Settings.from_env` reads GPU_PIPELINE_* variables, called by the entry
    points (the CLI, `definitions.py`), never at a module's top level."""
    offenders = []
    for name, path in modules().items():
        if name in ("gpu_pipeline.definitions", "gpu_pipeline.settings", "gpu_pipeline.cli"):
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:  # top-level statements only
            for call in ast.walk(node):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    break
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, (ast.Name, ast.Attribute))
                    and getattr(call.func, "id", getattr(call.func, "attr", ""))
                    in (
                        "current",
                        "from_env",
                    )
                ):
                    offenders.append(f"{name}:{call.lineno}")
    assert offenders == []
