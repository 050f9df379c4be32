"""The memory allocators of a pipeline process: freed buffers kept for the next chunk.

A staging pass allocates and frees column buffers of a few MiB thousands of times (each chunk's
columns, in Polars and in NumPy). Left to their defaults, both allocators hand most of those
pages back to the kernel as soon as they are freed and map fresh ones for the next chunk, which
the kernel zeroes page by page: on the 10,000-GPU day that was 0.3–0.4 of the pass's 2.6 CPU
seconds (`perf`: `clear_page_erms`, page faults). Kept for reuse, the same buffers serve chunk
after chunk; the peak stays what the chunks need at once (`benchmarks/README.md`).

These settings, each only where the environment does not set it already:

- Polars' jemalloc reads `_RJEM_MALLOC_CONF` once, when Polars is first imported: pages a chunk
  freed are returned after 1 s unused (`JEMALLOC_CONF`; Polars' own setting starts after 0.5 s).
  Longer is no faster and keeps what one step freed into the next (benchmarks/README.md,
  "Measurements behind the code"). One arena for every thread (`narenas:1`; jemalloc's default
  is four a core): the pages one thread freed serve the next allocation of any other, instead
  of waiting out the decay in an arena of their own while another arena maps fresh ones. The
  1,000-GPU day's peak went from 921-931 to 790-800 MiB, the 10,000-GPU day's from 1,198 to
  1,019 MiB, and the staging pass got no slower (benchmarks/README.md, issue 34). `gpu_pipeline`
  sets it on import, so it
  applies when gpu_pipeline is imported before Polars (the CLI, the Dagster code location and
  their subprocesses, which inherit it); imported after Polars, it changes nothing.
- glibc malloc (NumPy's buffers): blocks up to 32 MiB come from the heap instead of a fresh
  mapping each, and the heap is trimmed when more than 64 MiB of it is free: the values glibc
  itself moves to once blocks that large were freed, set from the start (`mallopt`; skipped
  when `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_ARENA_MAX` or
  `GLIBC_TUNABLES` is set, and on any other C library). Larger thresholds were no faster and
  kept more memory. One arena (`ARENA_MAX`) for all threads, and the heap trimmed as each step
  ends (`release`): what a step freed is not held through the next one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

JEMALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:1000,narenas:1"
MMAP_THRESHOLD = 32 * 2**20  # glibc's own upper bound for it on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc sets it when it raises the threshold
# one heap for every thread: glibc's default of 8 a core kept each thread's freed blocks in a
# heap of its own (the 1,000-GPU day's peak: 1,067 MiB with one, 1,177 with the default, both
# trimmed after each step; benchmarks/README.md)
ARENA_MAX = 1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # <malloc.h>
_GLIBC_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
)
_libc: ctypes.CDLL | None = None  # set by `configure` when it applied the glibc settings


def configure() -> dict[str, bool]:
    """Apply both settings where they can still take effect; says which did."""
    applied = {"jemalloc": False, "glibc": False}
    if "polars" not in sys.modules and "_RJEM_MALLOC_CONF" not in os.environ:
        os.environ["_RJEM_MALLOC_CONF"] = JEMALLOC_CONF
        applied["jemalloc"] = True
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        if not any(v in os.environ for v in _GLIBC_VARIABLES):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                applied["glibc"] = bool(
                    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                    and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                    and libc.mallopt(_M_ARENA_MAX, ARENA_MAX)
                )
                global _libc
                _libc = libc if applied["glibc"] else None
            except (OSError, AttributeError):  # no usable C library: the defaults stay
                pass
    return applied


# A process that parses landing files and exits (`lib/ingest/ahead.py`) keeps what it frees for
# the next file: a file's buffers (its text, ~25 MiB, and its columns) come back at once, and
# handed back to the kernel they were mapped and zeroed again page by page — ~800,000 page
# faults and a quarter of the parse's CPU for the 1,000-GPU day's 168 files; kept: ~100,000,
# the parse 8.5-9.5 -> 7.4-8.3 s, the same peak (~0.4 GiB; benchmarks/README.md, issue 34).
# Blocks up to 64 MiB from the heap, the heap trimmed only past 1 GiB free, Polars' pages
# returned after 10 s. Its jemalloc keeps its default arenas: one arena parsed no faster
# (168 files, 5 runs paired: 6.97 against 6.83 s) and the parse is not the run's peak.
PARSE_PROCESS_GLIBC = {
    "MALLOC_ARENA_MAX": str(ARENA_MAX),
    "MALLOC_MMAP_THRESHOLD_": str(2 * MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}
PARSE_PROCESS_JEMALLOC = "dirty_decay_ms:10000,muzzy_decay_ms:10000"


def parse_process_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` for a parse process (above): the allocators' settings the environment does not
    make itself (`_RJEM_MALLOC_CONF` as `configure` set it is this module's, and replaced)."""
    env = dict(environ)
    if not any(v in environ for v in _GLIBC_VARIABLES):
        env.update(PARSE_PROCESS_GLIBC)
    if environ.get("_RJEM_MALLOC_CONF", JEMALLOC_CONF) == JEMALLOC_CONF:
        env["_RJEM_MALLOC_CONF"] = PARSE_PROCESS_JEMALLOC
    return env


def release() -> None:
    """Hand the C heap's free pages back to the kernel (`malloc_trim`), where `configure` set
    glibc up: a step's last buffers are not carried into the next step (called as each step
    ends, `defs.daily.DayWriter.result`; a few milliseconds)."""
    if _libc is not None:
        _libc.malloc_trim(0)
