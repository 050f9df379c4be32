"""The machine a benchmark ran on, in one line: its figures are compared across sessions, and
the same code measured 1.6x slower on another host processor (benchmarks/README.md, issue 34)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe() -> str:
    """Processor model, cores this process may use, memory, and Python."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        memory = f", {mem:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"machine: {model}, {cores} core(s){memory}, Python {platform.python_version()}"
