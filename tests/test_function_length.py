"""No function over 80 lines (issue 32): a function that long is several steps without names.

A function's length runs from its `def` line to its last line, as `ast` counts them
(end_lineno - lineno + 1, decorators not included); a nested function counts on its own, and
the function around it counts it too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_pipeline"
MAX_LINES = 80

# (path relative to gpu_pipeline/, function name). These go when the CLI and report splits
# land: those files are being changed elsewhere. An exemption that no longer names a long
# function fails the test below, so none outlives its reason.
EXEMPT = {
    ("cli.py", "cmd_materialize"),
    ("cli.py", "parser"),
    ("lib/io/report.py", "build_report"),
    ("lib/io/report.py", "dollars_appendix"),
}


def function_lengths() -> list[tuple[str, str, int, int]]:
    """(path relative to gpu_pipeline/, name, first line, length) of every function."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((rel, node.name, node.lineno, node.end_lineno - node.lineno + 1))
    return out


def test_no_function_over_80_lines():
    long = [
        f"{rel}:{line} {name} ({n} lines)"
        for rel, name, line, n in function_lengths()
        if n > MAX_LINES and (rel, name) not in EXEMPT
    ]
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)


def test_exemptions_are_not_stale():
    lengths: dict[tuple[str, str], list[int]] = {}
    for rel, name, _, n in function_lengths():
        lengths.setdefault((rel, name), []).append(n)
    gone = sorted(f"{rel} {name}" for rel, name in EXEMPT if (rel, name) not in lengths)
    short = sorted(
        f"{rel} {name} ({max(lengths[rel, name])} lines)"
        for rel, name in EXEMPT
        if (rel, name) in lengths and max(lengths[rel, name]) <= MAX_LINES
    )
    assert not gone, "exempted functions that no longer exist (drop them):\n" + "\n".join(gone)
    assert not short, f"exempted functions now {MAX_LINES} lines or fewer (drop them):\n" + (
        "\n".join(short)
    )
