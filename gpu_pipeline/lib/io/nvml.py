"""NVML sampling behind a small interface: the real backend (nvidia-ml-py) and a fake for tests.

`sample` polls every GPU at a fixed interval and writes the raw NVML readings (milliwatts, bytes)
as the `nvml_samples` landing format; the ingest converts units. Without an NVIDIA driver the
real backend raises `NvmlUnavailable` with one line saying why.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpu_pipeline.lib.ingest.formats.nvml_csv import COLUMNS, MAGIC


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no library, no permission)."""


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


class NvmlBackend(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...
    def read_all(self) -> list[Reading]: ...


class PynvmlBackend:
    """The real NVML, through nvidia-ml-py. A field a GPU does not support is left empty."""

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml

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

    def read_all(self) -> list[Reading]:
        nv = self._nv
        out = []
        driver = self._try(nv.nvmlSystemGetDriverVersion)
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
            out.append(
                Reading(
                    gpu_uuid=str(nv.nvmlDeviceGetUUID(h)),
                    gpu_index=i,
                    gpu_model=str(nv.nvmlDeviceGetName(h)),
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
            )
        return out


class FakeNvml:
    """A scripted NVML for tests: `readings(tick)` returns what the GPUs report at that tick."""

    def __init__(self, readings: Callable[[int], list[Reading]], fail_open: str | None = None):
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

    def read_all(self) -> list[Reading]:
        out = self._readings(self.tick)
        self.tick += 1
        return out


def _fmt(v: object) -> str:
    if v is None:
        return ""
    return str(v).replace(",", ";")


def sample(
    backend: NvmlBackend,
    interval_s: float,
    duration_s: float,
    out_dir: str | Path,
    hostname: str | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Path:
    """Poll every GPU each `interval_s` for `duration_s`; returns the file written."""
    if not 0.1 <= interval_s <= 3600:
        raise ValueError("--interval must be between 0.1 s (10 Hz) and 3600 s")
    if duration_s <= 0:
        raise ValueError("--duration must be positive")
    hostname = hostname or socket.gethostname()
    backend.open()
    try:
        start = clock()
        stamp = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
        path = Path(out_dir) / f"{hostname}_{stamp}.nvml.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(
            "." + path.name + ".part"
        )  # hidden until complete: not ingested half-written
        n = max(1, round(duration_s / interval_s))
        with open(tmp, "w") as f:
            f.write(MAGIC + "\n" + ",".join(COLUMNS) + "\n")
            for k in range(n):
                t = clock()
                for r in backend.read_all():
                    row = {
                        **r.__dict__,
                        "timestamp_ms": int(t * 1000),
                        "hostname": hostname,
                        "gpu_instance_id": None,
                        "gpu_instance_profile": None,
                    }
                    f.write(",".join(_fmt(row.get(c)) for c in COLUMNS) + "\n")
                f.flush()
                if k + 1 < n:
                    sleep(max(0.0, start + (k + 1) * interval_s - clock()))
        tmp.replace(path)
        return path
    finally:
        backend.close()
