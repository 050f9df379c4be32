"""`gpu-pipeline sample` when the run does not go to plan: SIGINT/SIGTERM, a GPU lost mid-run
(Xid 79), NVML failing as a whole, no GPUs. A fake `pynvml` first on PYTHONPATH stands in for
nvidia-ml-py, scripted through environment variables (adversarial review)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from helpers import cli_env

from gpu_pipeline.lib.ingest.landing import list_landing, parse_landing_file
from gpu_pipeline.lib.io.nvml import (
    FakeNvml,
    GpuUnreadable,
    NvmlFailed,
    NvmlUnavailable,
    PynvmlBackend,
    Reading,
    SamplingStopped,
    sample,
)

# nvidia-ml-py's surface that the sampler uses. FAKE_NVML_GPUS: how many GPUs (default 2);
# FAKE_NVML_LOST=i and FAKE_NVML_LOST_AT=k: GPU i is lost (handle, UUID, name raise GpuIsLost)
# from the k-th count on (0-based); FAKE_NVML_COUNT_FAILS_AT=k: nvmlDeviceGetCount raises from
# its k-th call on.
FAKE_PYNVML = """
import os
from types import SimpleNamespace

NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
NVML_ERROR_UNKNOWN, NVML_ERROR_GPU_IS_LOST = 999, 15
_counts = 0


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value

    def __str__(self):
        return {15: "GPU is lost", 999: "Unknown Error"}.get(self.value, str(self.value))


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self):
        super().__init__(NVML_ERROR_GPU_IS_LOST)


def _env(name, default=-1):
    return int(os.environ.get(name, default))


def _lost(i):
    return i == _env("FAKE_NVML_LOST") and _counts > _env("FAKE_NVML_LOST_AT", 0)


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return "550.54.15"


def nvmlDeviceGetCount():
    global _counts
    _counts += 1
    if 0 <= _env("FAKE_NVML_COUNT_FAILS_AT") < _counts:
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return _env("FAKE_NVML_GPUS", 2)


def nvmlDeviceGetHandleByIndex(i):
    if _lost(i):
        raise NVMLError_GpuIsLost()
    return i


def nvmlDeviceGetUUID(h):
    return f"GPU-00000000-0000-0000-0000-00000000000{h}"


def nvmlDeviceGetName(h):
    return "NVIDIA L4"


def nvmlDeviceGetUtilizationRates(h):
    return SimpleNamespace(gpu=40 + h, memory=5)


def nvmlDeviceGetMemoryInfo(h):
    return SimpleNamespace(used=2 * 2**30, total=24 * 2**30)


def nvmlDeviceGetPowerUsage(h):
    return 36000 + 1000 * h


def nvmlDeviceGetEnforcedPowerLimit(h):
    return 72000


def nvmlDeviceGetTemperature(h, sensor):
    return 50


def nvmlDeviceGetClockInfo(h, clock):
    return 1500
"""


@pytest.fixture
def fake_pynvml(tmp_path):
    """The folder holding the fake `pynvml.py` (for PYTHONPATH)."""
    d = tmp_path / "fake_nvml"
    d.mkdir()
    (d / "pynvml.py").write_text(FAKE_PYNVML)
    return d


def fake_backend(fake_dir: Path) -> PynvmlBackend:
    """The real backend on a fresh copy of the fake module."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", fake_dir / "pynvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    backend = PynvmlBackend()
    backend._nv = mod
    return backend


def sample_cli(
    fake_dir: Path, out: Path, tmp_path: Path, env: dict, *args: str
) -> subprocess.Popen:
    full = {**cli_env(tmp_path), **env, "PYTHONPATH": str(fake_dir)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_pipeline.cli", "sample", *args, "--out", str(out)],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cli(fake_dir, out, tmp_path, env, *args) -> tuple[int, str, str]:
    p = sample_cli(fake_dir, out, tmp_path, env, *args)
    stdout, stderr = p.communicate(timeout=120)
    return p.returncode, stdout, stderr


def parsed(path: Path):
    """The file as the ingest lists and parses it: listed, not skipped."""
    (lf,) = [f for f in list_landing(path.parent) if f.path.name == path.name]
    assert lf.skipped is None and lf.problem is None
    fmt, out = parse_landing_file(lf)
    assert fmt == "nvml_samples" and out.quarantine.height == 0
    return out.samples


def power_by_gpu(samples: pl.DataFrame) -> dict[str, int]:
    power = samples.filter(pl.col("column") == "power_w")
    return dict(power.group_by("gpu_uuid").len().sort("gpu_uuid").iter_rows())


def data_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 2)
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_completes_the_file_with_what_was_sampled(tmp_path, fake_pynvml, signum):
    out = tmp_path / "nvml"
    p = sample_cli(fake_pynvml, out, tmp_path, {}, "--interval", "0.1", "--duration", "600")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and p.poll() is None:
        parts = list(out.glob(".*.part")) if out.is_dir() else []
        if parts and data_rows(parts[0]) >= 6:
            break
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    p.send_signal(signum)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    m = re.fullmatch(rf"stopped by {name} after (\d+) of 6000 samples; wrote (\S+)\n", stderr)
    assert m and stdout == "", stderr
    ticks, path = int(m[1]), Path(m[2])
    assert ticks >= 3 and path.parent == out and path.name.endswith(".nvml.csv")
    assert [f.name for f in out.iterdir()] == [path.name]  # no .part left
    samples = parsed(path)
    assert set(power_by_gpu(samples).values()) == {ticks}  # both GPUs, every sample taken


def test_sampling_stopped_in_process_keeps_the_samples(tmp_path):
    """The library: a KeyboardInterrupt in the wait (no handler installed) ends it the same."""
    calls = []

    def sleep(s):
        calls.append(s)
        if len(calls) == 2:
            raise KeyboardInterrupt

    reading = Reading("GPU-A", 0, "NVIDIA L4", power_mw=36000.0)
    with pytest.raises(SamplingStopped) as e:
        sample(FakeNvml(lambda t: [reading]), 1.0, 10.0, tmp_path, hostname="box", sleep=sleep)
    assert (e.value.ticks, e.value.exit_code, e.value.path.parent) == (2, 130, tmp_path)
    assert str(e.value) == f"stopped by SIGINT after 2 of 10 samples; wrote {e.value.path}"
    assert [f.name for f in tmp_path.iterdir()] == [e.value.path.name]
    assert power_by_gpu(parsed(e.value.path)) == {"GPU-a": 2}


def test_a_lost_gpu_is_left_out_with_one_warning(tmp_path, fake_pynvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_LOST", "1")
    monkeypatch.setenv("FAKE_NVML_LOST_AT", "2")
    warnings = []
    path = sample(
        fake_backend(fake_pynvml), 0.1, 0.5, tmp_path, hostname="box", warn=warnings.append
    )
    assert warnings == [
        "GPU 1 (GPU-00000000-0000-0000-0000-000000000001) cannot be read (GPU is lost); "
        "left out of the samples while it fails"
    ]
    uuids = sorted(power_by_gpu(parsed(path)).items())
    assert [n for _, n in uuids] == [5, 2]  # GPU 0 every tick, GPU 1 before it was lost


def test_the_command_goes_on_past_a_lost_gpu(tmp_path, fake_pynvml):
    env = {"FAKE_NVML_LOST": "0", "FAKE_NVML_LOST_AT": "0"}  # lost from the start: no UUID
    out = tmp_path / "nvml"
    rc, stdout, stderr = run_cli(
        fake_pynvml, out, tmp_path, env, "--interval", "0.1", "--duration", "0.4"
    )
    assert rc == 0 and "Traceback" not in stderr
    assert stderr == (
        "warning: GPU 0 cannot be read (GPU is lost); left out of the samples while it fails\n"
    )
    (path,) = out.iterdir()
    assert stdout == f"wrote {path}\n"
    assert list(power_by_gpu(parsed(path)).values()) == [4]


def test_nvml_failing_as_a_whole_keeps_what_was_sampled(tmp_path, fake_pynvml):
    out = tmp_path / "nvml"
    env = {"FAKE_NVML_COUNT_FAILS_AT": "3"}
    rc, stdout, stderr = run_cli(
        fake_pynvml, out, tmp_path, env, "--interval", "0.1", "--duration", "2"
    )
    (path,) = out.iterdir()
    assert (rc, stdout) == (1, "")
    assert stderr == (
        f"error: NVML failed after 3 samples (nvmlDeviceGetCount: Unknown Error); wrote {path}\n"
    )
    assert set(power_by_gpu(parsed(path)).values()) == {3}


def test_nvml_failing_before_a_sample_leaves_no_file(tmp_path, fake_pynvml):
    out = tmp_path / "nvml"
    env = {"FAKE_NVML_COUNT_FAILS_AT": "0"}
    rc, stdout, stderr = run_cli(
        fake_pynvml, out, tmp_path, env, "--interval", "0.1", "--duration", "2"
    )
    assert (rc, stdout) == (1, "")
    assert stderr == (
        "error: NVML failed after 0 samples (nvmlDeviceGetCount: Unknown Error); nothing written\n"
    )
    assert not list(out.iterdir())


def test_no_gpus_is_an_error_and_no_file(tmp_path, fake_pynvml):
    out = tmp_path / "nvml"
    rc, stdout, stderr = run_cli(
        fake_pynvml, out, tmp_path, {"FAKE_NVML_GPUS": "0"}, "--interval", "0.1", "--duration", "1"
    )
    assert (rc, stdout, stderr) == (1, "", "error: NVML sees no GPUs\n")
    assert not out.exists() or not list(out.iterdir())


def test_fake_backend_failures_in_process(tmp_path):
    """FakeNvml scripts the same: an unreadable GPU, then NVML failing."""

    def readings(tick):
        if tick == 3:
            raise NvmlFailed("nvmlDeviceGetCount: Unknown Error")
        return [Reading("GPU-A", 0, "NVIDIA L4", power_mw=1.0), GpuUnreadable(1, "GPU is lost")]

    warnings = []
    with pytest.raises(SamplingStopped) as e:
        sample(
            FakeNvml(readings), 0.1, 1, tmp_path, "box", sleep=lambda s: None, warn=warnings.append
        )
    assert (e.value.ticks, e.value.exit_code, e.value.reason) == (
        3,
        1,
        "nvmlDeviceGetCount: Unknown Error",
    )
    assert len(warnings) == 1 and power_by_gpu(parsed(e.value.path)) == {"GPU-a": 3}
    with pytest.raises(NvmlUnavailable, match="^NVML sees no GPUs$"):
        sample(FakeNvml(lambda t: []), 0.1, 1, tmp_path / "none", "box", sleep=lambda s: None)
    assert not list((tmp_path / "none").iterdir())
    assert sorted(os.listdir(tmp_path)) == sorted(["none", e.value.path.name])
