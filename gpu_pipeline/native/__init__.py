"""Native code for the loops Polars cannot do fast enough: tokenizing exposition text, and
telling plain text (no NUL, ASCII only) at memory speed.

`exposition.c` is compiled by `make install` with the system C compiler into `LIBRARY` and
loaded here with ctypes (no Python API, no build step in pip). Where it is absent — no compiler,
an install from a wheel — or `enabled` is False, the callers take their Polars path: the same
results, slower (`benchmarks/README.md`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LIBRARY = Path(__file__).with_name("libgpu_pipeline_native.so")
# exposition.c's EXPO_VERSION: a library built from another version is not loaded
VERSION = 3
# tests switch the native path off to compare it with the Polars path
enabled = True

# per-line flags set by expo_scan (exposition.c); NO_SERIES: an empty line (a line that starts
# with `}` has no series and no code, and is not one: read the slow way, quarantined)
NO_SERIES, LEAD, HAS_TS, VALUE, TS = 1, 2, 4, 8, 16
NO_CODE = 2**32 - 1

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


@functools.cache
def _load() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        lib.expo_version.restype = ctypes.c_int
        if lib.expo_version() != VERSION:  # built from an older exposition.c: `make` rebuilds it
            return None
    except (OSError, AttributeError):
        return None
    lib.expo_scan.argtypes = [_ptr, _i64, ctypes.c_int, ctypes.c_int]
    lib.expo_scan.restype = _ptr
    lib.expo_counts.argtypes = [_ptr, ctypes.POINTER(_i64)]
    lib.expo_counts.restype = None
    lib.expo_fill.argtypes = [_ptr] * 9
    lib.expo_fill.restype = None
    lib.expo_free.argtypes = [_ptr]
    lib.expo_free.restype = None
    lib.expo_plain.argtypes = [_ptr, _i64]
    lib.expo_plain.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Is the native tokenizer built, loadable and enabled?"""
    return enabled and _load() is not None


def plain_text(data: bytes) -> bool | None:
    """Is `data` plain text: no NUL byte, only ASCII? One pass in C, outside Python's lock (a
    landing file's `isascii` and NUL search held it while other files' parses waited). None
    when the library is not available, or `data` is not `bytes` (Python's passes read it)."""
    lib = _load() if enabled else None
    if lib is None or type(data) is not bytes:
        return None
    return bool(lib.expo_plain(data, len(data)))


# a file read whole (`read_whole`) is read this much at a time: each chunk is hashed and told
# plain text while the processor's cache still holds it (a 25 MiB file hashed after its read
# whole: ~1.1 GB/s here, read from memory; a chunk just read: ~1.8)
READ_CHUNK = 1 << 19

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]


def read_whole(f, size: int, update) -> tuple[bytes, bool | None]:
    """The next `size` bytes of the binary file `f` (fewer where it ends sooner) as one `bytes`
    object, read a chunk at a time into it, with `update(chunk)` (a hash's) called on each chunk
    just read; and whether they are plain text (`plain_text`; None when not told). The object
    is filled in place before anyone else sees it: no copy of the file is made."""
    lib = _load() if enabled else None
    if size <= 0:
        return b"", None
    out = _new_bytes(None, size)  # uninitialised: every byte is written below, or cut off
    addr = ctypes.cast(ctypes.c_char_p(out), ctypes.c_void_p).value
    view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
    plain, got = lib is not None, 0
    try:
        while got < size:
            room = view[got : got + READ_CHUNK]
            n = f.readinto(room)
            if n is None or not 0 <= n <= len(room):  # no data from a blocking file; a count
                # past the room given would hand out bytes never written
                raise OSError(f"read gave {n!r} for {len(room)} bytes asked")
            if not n:
                break
            chunk = view[got : got + n]
            update(chunk)
            plain = plain and bool(lib.expo_plain(addr + got, n))
            got += n
    finally:
        view.release()
    if got < size:  # the file ended sooner: only what was read
        out = out[:got]
    return out, (plain if lib is not None else None)


@dataclass(frozen=True)
class ExpositionScan:
    """Per line: the series code (`NO_CODE`: none), value, timestamp and flags (valid only
    where `VALUE` / `TS` are set); the distinct series in code order (Arrow string offsets and
    bytes); (line index, byte offset, length) of each value / timestamp token left to Polars."""

    code: np.ndarray
    value: np.ndarray
    ts: np.ndarray
    flags: np.ndarray
    series_offsets: np.ndarray
    series_bytes: np.ndarray
    odd_values: np.ndarray
    odd_ts: np.ndarray


def scan_exposition(data: np.ndarray, threads: int) -> ExpositionScan | None:
    """Tokenize exposition text (`data`: its bytes as uint8, not copied) on `threads` threads;
    None when the library is not available, ran out of memory, or the text is not ASCII.

    A read-only `numpy.memmap` of a file has its pages handed back as they are read (they stay
    in the page cache): a file of gigabytes is not held in the process while the parse goes on.
    """
    lib = _load() if enabled else None
    if lib is None:
        return None
    mapped = isinstance(data, np.memmap) and data.mode == "r" and data.offset == 0
    handle = lib.expo_scan(data.ctypes.data, data.size, threads, int(mapped))
    if not handle:
        return None
    try:
        counts = (_i64 * 6)()
        lib.expo_counts(handle, counts)
        n, n_series, n_bytes, n_odd_v, n_odd_t, non_ascii = counts
        if non_ascii:  # Polars reads it: its reader checks the UTF-8
            return None
        out = ExpositionScan(
            code=np.empty(n, np.uint32),
            value=np.empty(n, np.float64),
            ts=np.empty(n, np.int64),
            flags=np.empty(n, np.uint8),
            series_offsets=np.empty(n_series + 1, np.int64),
            series_bytes=np.empty(n_bytes, np.uint8),
            odd_values=np.empty((n_odd_v, 3), np.int64),
            odd_ts=np.empty((n_odd_t, 3), np.int64),
        )
        lib.expo_fill(
            handle,
            *(
                a.ctypes.data
                for a in (
                    out.code,
                    out.value,
                    out.ts,
                    out.flags,
                    out.series_offsets,
                    out.series_bytes,
                    out.odd_values,
                    out.odd_ts,
                )
            ),
        )
        return out
    finally:
        lib.expo_free(handle)
