"""Real servers the tests start on loopback, and stop."""

import gzip
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


def to_openmetrics(files: list[Path], out: Path) -> int:
    """The samples of exposition files (the generator's: `name{labels} value timestamp_ms`,
    families repeated per scrape) as one OpenMetrics text, what `promtool tsdb
    create-blocks-from openmetrics` reads: each family once (`# TYPE`, then its samples in the
    files' order, so each series' times increase), timestamps in seconds, `# EOF` last.
    Returns the number of samples."""
    types: dict[str, str] = {}
    parts: dict[str, Path] = {}
    sinks = {}
    n = 0
    try:
        for f in files:
            opener = gzip.open if f.name.endswith(".gz") else open
            with opener(f, "rt") as lines:
                for line in lines:
                    if line.startswith("#"):
                        bits = line.split()
                        if len(bits) >= 4 and bits[1] == "TYPE":
                            types.setdefault(bits[2], bits[3])
                        continue
                    if not line.strip():
                        continue
                    head, value, ms = line.rsplit(" ", 2)
                    name = head.split("{", 1)[0]
                    if name not in sinks:
                        parts[name] = out.with_name(f"{out.name}.{len(parts)}")
                        sinks[name] = open(parts[name], "w")  # noqa: SIM115 - closed below
                    t = int(ms)
                    sinks[name].write(f"{head} {value} {t // 1000}.{t % 1000:03d}\n")
                    n += 1
    finally:
        for sink in sinks.values():
            sink.close()
    with open(out, "w") as dest:
        for name, part in parts.items():
            dest.write(f"# TYPE {name} {types.get(name, 'unknown')}\n")
            with open(part) as src:
                shutil.copyfileobj(src, dest)
            part.unlink()
        dest.write("# EOF\n")
    return n


def start_prometheus(tmp: Path, files: list[Path]) -> tuple[subprocess.Popen, str]:
    """A real Prometheus on loopback (Debian package prometheus, 2.x; `make test` installs it)
    holding the samples of the exposition `files`: converted to OpenMetrics, made into TSDB
    blocks by `promtool tsdb create-blocks-from openmetrics`, served from a data directory and
    a port of its own (no scrape targets, a 100-year retention; a system-wide prometheus service
    is neither needed nor touched). Fails, never skips, when it cannot start."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.fail(
            "prometheus / promtool are not installed: `make test` installs them (apt-get install "
            "-y prometheus); the pull is tested against a real server, not a mock"
        )
    history, tsdb = tmp / "history.om", tmp / "prom-tsdb"
    to_openmetrics(files, history)
    made = subprocess.run(
        # one block per 54 h (the hidden flag; 2 h by default): promtool reads the input once per
        # block, and the history is a few days
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=54h"]
        + ["--quiet", str(history), str(tsdb)],
        capture_output=True,
        text=True,
    )
    history.unlink()
    if made.returncode != 0:
        pytest.fail(f"promtool could not make blocks: {(made.stdout + made.stderr)[-2000:]}")
    config = tmp / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - the server writes to it until it stops
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=30)
    pytest.fail(f"prometheus did not start: {(tmp / 'prometheus.log').read_text()[-2000:]}")
