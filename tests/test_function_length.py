"""No function over 80 lines (issue 32): a function that long is several steps without names.

A function's length runs from its `def` line to its last line, as `ast` counts them
(end_lineno - lineno + 1, decorators not included); a nested function counts on its own, and
the function around it counts it too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpu_pipeline"
MAX_LINES = 80


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
        if n > MAX_LINES
    ]
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)
