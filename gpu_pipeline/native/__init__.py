"""Native code for the loops Polars and NumPy cannot do fast enough: tokenizing exposition
text (`exposition.c`) and the staging pass's per-run reductions (`segments.c`).

Both are compiled by `make install` with the system C compiler into `LIBRARY` and loaded here
with ctypes (no Python API, no build step in pip). Where it is absent — no compiler, an install
from a wheel — or `enabled` is False, the callers take their Polars / NumPy path: the same
results, slower (`benchmarks/README.md`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LIBRARY = Path(__file__).with_name("libgpu_pipeline_native.so")
# exposition.c's EXPO_VERSION and segments.c's SEG_VERSION: the functions of a library built
# from another version of their file are not used
VERSION = 1
SEG_VERSION = 1
# tests switch the native path off to compare it with the Polars path
enabled = True

# per-line flags set by expo_scan (exposition.c)
NO_SERIES, LEAD, HAS_TS, VALUE, TS = 1, 2, 4, 8, 16
NO_CODE = 2**32 - 1

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


@functools.cache
def _library() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(LIBRARY))
    except OSError:
        return None


def _says(lib: ctypes.CDLL | None, symbol: str, version: int) -> bool:
    """Was `lib` built from the source version this module expects? (An older build lacks the
    symbol or says another number: `make` rebuilds it.)"""
    try:
        fn = getattr(lib, symbol)
    except AttributeError:  # also: lib is None
        return False
    fn.restype = ctypes.c_int
    return fn() == version


@functools.cache
def _load() -> ctypes.CDLL | None:
    lib = _library()
    if not _says(lib, "expo_version", VERSION):
        return None
    lib.expo_scan.argtypes = [_ptr, _i64, ctypes.c_int, ctypes.c_int]
    lib.expo_scan.restype = _ptr
    lib.expo_counts.argtypes = [_ptr, ctypes.POINTER(_i64)]
    lib.expo_counts.restype = None
    lib.expo_fill.argtypes = [_ptr] * 9
    lib.expo_fill.restype = None
    lib.expo_free.argtypes = [_ptr]
    lib.expo_free.restype = None
    return lib


def available() -> bool:
    """Is the native tokenizer built, loadable and enabled?"""
    return enabled and _load() is not None


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


@functools.cache
def _segments() -> ctypes.CDLL | None:
    lib = _library()
    if not _says(lib, "seg_version", SEG_VERSION):
        return None
    for name, ptr in (
        ("seg_sum_f64", _ptr),
        ("seg_count_u8", _ptr),
        ("seg_max_i64", _ptr),
        ("seg_fmax_f64", _ptr),
    ):
        getattr(lib, name).argtypes = [ptr, _ptr, _i64, _i64, _ptr]
        getattr(lib, name).restype = None
    lib.seg_count_codes.argtypes = [_ptr, _ptr, _i64, _i64, ctypes.c_int32, _ptr]
    lib.seg_count_codes.restype = None
    return lib


class Segments:
    """Reductions over runs of consecutive rows (`at`: each run's first row, strictly increasing
    from 0; `rows`: the rows in all), equal to the matching `numpy.ufunc.reduceat` to the bit:
    `sum` (float64: np.add), `max` (int64: np.maximum), `fmax` (float64: np.fmax), `count`
    (booleans: true values), `codes` (uint8 codes: rows of each code below `ncodes`).
    Built only where the library is available (`segments()`)."""

    def __init__(self, lib: ctypes.CDLL, at: np.ndarray, rows: int):
        self._lib = lib
        self._at = np.ascontiguousarray(at, dtype=np.int64)
        self._rows = rows

    def _run(self, name: str, x: np.ndarray, out_dtype) -> np.ndarray:
        if x.shape != (self._rows,):
            raise ValueError(f"{name}: {x.shape} values for {self._rows} rows")
        x = np.ascontiguousarray(x)
        out = np.empty(len(self._at), out_dtype)
        getattr(self._lib, name)(
            x.ctypes.data, self._at.ctypes.data, len(self._at), self._rows, out.ctypes.data
        )
        return out

    def sum(self, x: np.ndarray) -> np.ndarray:
        return self._run("seg_sum_f64", x.astype(np.float64, copy=False), np.float64)

    def max(self, x: np.ndarray) -> np.ndarray:
        return self._run("seg_max_i64", x.astype(np.int64, copy=False), np.int64)

    def fmax(self, x: np.ndarray) -> np.ndarray:
        return self._run("seg_fmax_f64", x.astype(np.float64, copy=False), np.float64)

    def count(self, x: np.ndarray) -> np.ndarray:
        return self._run("seg_count_u8", x.astype(np.bool_, copy=False).view(np.uint8), np.uint32)

    def codes(self, codes: np.ndarray, ncodes: int) -> np.ndarray:
        """(ncodes, runs) counts."""
        if codes.shape != (self._rows,) or not 0 < ncodes <= 256:
            raise ValueError(f"codes: {codes.shape} for {self._rows} rows, {ncodes} codes")
        c = np.ascontiguousarray(codes, dtype=np.uint8)
        out = np.empty((ncodes, len(self._at)), np.uint32)
        self._lib.seg_count_codes(
            c.ctypes.data, self._at.ctypes.data, len(self._at), self._rows, ncodes, out.ctypes.data
        )
        return out


def segments(at: np.ndarray, rows: int) -> Segments | None:
    """Native reductions over the runs starting at `at`; None when the library is not built,
    is from another segments.c, or `enabled` is False (the caller takes its NumPy path)."""
    lib = _segments() if enabled else None
    if lib is None or rows == 0:
        return None
    return Segments(lib, at, rows)
