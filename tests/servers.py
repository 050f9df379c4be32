"""Real servers the tests start on loopback, and stop."""

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_victoria_metrics(tmp: Path) -> tuple[subprocess.Popen, str]:
    """A real VictoriaMetrics on loopback (Debian package victoria-metrics; `make test` installs
    it). Fails, never skips, when it cannot start."""
    binary = shutil.which("victoria-metrics")
    if binary is None:
        pytest.fail(
            "victoria-metrics is not installed: `make test` installs it (apt-get install -y "
            "victoria-metrics); the pull is tested against a real server, not a mock"
        )
    port = free_port()
    log = open(tmp / "vm.log", "w")  # noqa: SIM115 - the server writes to it until it stops
    proc = subprocess.Popen(
        [
            binary,
            f"-storageDataPath={tmp / 'vmdata'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=0s",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail(f"victoria-metrics did not start: {(tmp / 'vm.log').read_text()[-2000:]}")


def load(url: str, files: list[Path]) -> None:
    """Import exposition files (ms timestamps) and make them searchable."""
    for f in files:
        req = urllib.request.Request(url + "/api/v1/import/prometheus", data=f.read_bytes())
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 204
    urllib.request.urlopen(url + "/internal/force_flush", timeout=30).read()
