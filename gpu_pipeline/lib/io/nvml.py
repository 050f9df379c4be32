"""NVML sampling behind a small interface: the real backend (nvidia-ml-py) and a fake for tests.

`sample` polls every GPU at a fixed interval and writes the raw NVML readings (milliwatts, bytes)
as the `nvml_samples` landing format; the ingest converts units. Without an NVIDIA driver the
real backend raises `NvmlUnavailable` with one line saying why.

A run ends early, with the samples taken so far completed into the final file, on SIGINT or
SIGTERM and when NVML fails as a whole (`SamplingStopped`); a GPU NVML cannot read (one that
fell off the bus: Xid 79, "GPU is lost") is left out of the ticks it fails, with one warning.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpu_pipeline.lib.ingest.formats.nvml_csv import COLUMNS, MAGIC


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no library, no permission, no GPU)."""


class NvmlFailed(RuntimeError):
    """NVML failed as a whole while sampling (it could not count the GPUs)."""


class SamplingStopped(Exception):
    """Sampling ended before its duration: a signal (`signum`) or NVML failing (`reason`).

    `path` is the final file, completed with the `ticks` samples taken, or None when none was."""

    def __init__(
        self,
        path: Path | None,
        ticks: int,
        planned: int,
        signum: int | None = None,
        reason: str | None = None,
    ):
        self.path, self.ticks, self.planned = path, ticks, planned
        self.signum, self.reason = signum, reason
        super().__init__(path, ticks, planned, signum, reason)

    def __str__(self) -> str:
        return self.line()

    @property
    def exit_code(self) -> int:
        """128 + the signal's number (130 SIGINT, 143 SIGTERM), as a shell reports it; else 1."""
        return 128 + self.signum if self.signum is not None else 1

    def line(self) -> str:
        wrote = f"wrote {self.path}" if self.path else "nothing written"
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            return f"stopped by {name} after {self.ticks} of {self.planned} samples; {wrote}"
        return f"error: NVML failed after {self.ticks} samples ({self.reason}); {wrote}"


@dataclass
class Reading:
    gpu_uuid: str
    gpu_index: int
    gpu_model: str
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    driver_version: str | None = None


@dataclass
class GpuUnreadable:
    """A GPU NVML lists but could not read at this tick (e.g. GPU is lost)."""

    gpu_index: int
    reason: str
    gpu_uuid: str | None = None


class NvmlBackend(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...

    def read_all(self) -> list[Reading | GpuUnreadable]:
        """Every GPU's readings; raises `NvmlFailed` when NVML fails as a whole."""
        ...


class PynvmlBackend:
    """The real NVML, through nvidia-ml-py. A field a GPU does not support is left empty."""

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        self._uuids: dict[int, str] = {}  # by index, to name a GPU whose handle is gone

    def open(self) -> None:
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML is not available ({e}); is an NVIDIA driver installed?"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()

    def _try(self, fn: Callable, *args):
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def read_all(self) -> list[Reading | GpuUnreadable]:
        nv = self._nv
        driver = self._try(nv.nvmlSystemGetDriverVersion)
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise NvmlFailed(f"nvmlDeviceGetCount: {e}") from None
        out: list[Reading | GpuUnreadable] = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid, name = str(nv.nvmlDeviceGetUUID(h)), str(nv.nvmlDeviceGetName(h))
            except nv.NVMLError as e:
                out.append(GpuUnreadable(i, str(e), self._uuids.get(i)))
                continue
            self._uuids[i] = uuid
            out.append(self._reading(h, i, uuid, name, driver))
        return out

    def _reading(self, h, i: int, uuid: str, name: str, driver) -> Reading:
        nv = self._nv
        util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
        return Reading(
            gpu_uuid=uuid,
            gpu_index=i,
            gpu_model=name,
            util_gpu_pct=None if util is None else util.gpu,
            util_mem_pct=None if util is None else util.memory,
            power_mw=self._try(nv.nvmlDeviceGetPowerUsage, h),
            power_limit_mw=self._try(nv.nvmlDeviceGetEnforcedPowerLimit, h),
            mem_used_bytes=None if mem is None else mem.used,
            mem_total_bytes=None if mem is None else mem.total,
            temp_c=self._try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            mem_clock_mhz=self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            driver_version=None if driver is None else str(driver),
        )


class FakeNvml:
    """A scripted NVML for tests: `readings(tick)` returns what the GPUs report at that tick (or
    raises `NvmlFailed`)."""

    def __init__(
        self,
        readings: Callable[[int], list[Reading | GpuUnreadable]],
        fail_open: str | None = None,
    ):
        self._readings = readings
        self._fail_open = fail_open
        self.tick = 0
        self.opened = self.closed = False

    def open(self) -> None:
        if self._fail_open:
            raise NvmlUnavailable(self._fail_open)
        self.opened = True

    def close(self) -> None:
        self.closed = True

    def read_all(self) -> list[Reading | GpuUnreadable]:
        out = self._readings(self.tick)
        self.tick += 1
        return out


def _fmt(v: object) -> str:
    if v is None:
        return ""
    return str(v).replace(",", ";")


class _Stop(BaseException):
    """Raised by `_Signals`: end the sampling."""

    def __init__(self, signum: int):
        self.signum = signum


class _Signals:
    """While in use, the first SIGINT or SIGTERM ends the sampling: it raises `_Stop` while
    `armed` (the sampling loop), else it is kept in `pending` for the loop to see; later ones
    are ignored while the file is completed. Only the main thread can set handlers."""

    def __init__(self) -> None:
        self.armed = False
        self.pending: int | None = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.pending is not None:
            return
        self.pending = signum
        if self.armed:
            raise _Stop(signum)

    def check(self) -> None:
        if self.pending is not None:
            raise _Stop(self.pending)

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def sample(
    backend: NvmlBackend,
    interval_s: float,
    duration_s: float,
    out_dir: str | Path,
    hostname: str | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    warn: Callable[[str], None] = _warn,
) -> Path:
    """Poll every GPU each `interval_s` for `duration_s`; returns the file written.

    Raises `SamplingStopped` (the file completed with what was sampled, if anything was) on
    SIGINT/SIGTERM or when NVML fails as a whole, `NvmlUnavailable` when NVML sees no GPUs.
    `warn` gets one line per GPU that cannot be read (left out of the ticks it fails)."""
    if not 0.1 <= interval_s <= 3600:
        raise ValueError("--interval must be between 0.1 s (10 Hz) and 3600 s")
    if duration_s <= 0:
        raise ValueError("--duration must be positive")
    n = max(1, round(duration_s / interval_s))
    with _Signals() as signals:
        run = _Run(backend, hostname or socket.gethostname(), warn, signals)
        backend.open()
        try:
            path = run.sample(interval_s, n, Path(out_dir), clock, sleep)
        finally:
            backend.close()
        if signals.pending is not None:  # came while the file was completed: say so
            raise SamplingStopped(path, run.ticks, n, signum=signals.pending)
        return path


class _Run:
    """One sampling run: its file (hidden `.part` until complete), the samples and rows taken."""

    def __init__(self, backend: NvmlBackend, hostname: str, warn: Callable[[str], None], signals):
        self.backend, self.hostname, self.warn, self.signals = backend, hostname, warn, signals
        self.ticks = self.rows = 0
        self.warned: set[int] = set()  # GPU indexes already warned about

    def sample(self, interval_s, n: int, out_dir: Path, clock, sleep) -> Path:
        start = clock()
        stamp = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
        path = out_dir / f"{self.hostname}_{stamp}.nvml.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name("." + path.name + ".part")  # hidden until complete: not ingested
        stop: SamplingStopped | None = None
        try:
            try:
                self.signals.armed = True
                with open(tmp, "w") as f:
                    f.write(MAGIC + "\n" + ",".join(COLUMNS) + "\n")
                    for k in range(n):
                        self.signals.check()
                        self._tick(f, clock(), k)
                        if k + 1 < n:
                            sleep(max(0.0, start + (k + 1) * interval_s - clock()))
            finally:
                self.signals.armed = False
        except (_Stop, KeyboardInterrupt) as e:
            signum = e.signum if isinstance(e, _Stop) else signal.SIGINT
            stop = SamplingStopped(None, self.ticks, n, signum=signum)
        except NvmlFailed as e:
            stop = SamplingStopped(None, self.ticks, n, reason=str(e))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.rows == 0:  # nothing sampled: no file
            tmp.unlink(missing_ok=True)
            if stop is None:
                raise NvmlUnavailable("NVML could not read any GPU; nothing written")
        else:
            tmp.replace(path)
        if stop is not None:
            stop.path = path if self.rows else None
            raise stop
        return path

    def _tick(self, f, t: float, k: int) -> None:
        """One sample of every GPU, written at once (a signal does not cut a row)."""
        readings = self.backend.read_all()
        if k == 0 and not readings:
            raise NvmlUnavailable("NVML sees no GPUs")
        lines = []
        for r in readings:
            if isinstance(r, GpuUnreadable):
                if r.gpu_index not in self.warned:
                    self.warned.add(r.gpu_index)
                    who = f"GPU {r.gpu_index}" + (f" ({r.gpu_uuid})" if r.gpu_uuid else "")
                    self.warn(
                        f"{who} cannot be read ({r.reason}); left out of the samples while it fails"
                    )
                continue
            row = {
                **r.__dict__,
                "timestamp_ms": int(t * 1000),
                "hostname": self.hostname,
                "gpu_instance_id": None,
                "gpu_instance_profile": None,
            }
            lines.append(",".join(_fmt(row.get(c)) for c in COLUMNS) + "\n")
        self.signals.armed = False  # a signal now waits: the counts say what the file holds
        f.write("".join(lines))
        f.flush()
        self.ticks += 1
        self.rows += len(lines)
        self.signals.armed = True
        self.signals.check()
