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
