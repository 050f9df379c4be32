"""Real servers the tests start on loopback, and stop."""

import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
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


PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Postgres:
    """A real PostgreSQL 15 on 127.0.0.1 (Debian package postgresql; `make test` installs it):
    its own cluster in a temporary folder, a free port, the unix socket in that folder, one
    database and a user with a password. Fails, never skips, when it cannot start; `stop()`."""

    user, password, db = "dagster", "gpu-pipeline-test", "dagster"

    def __init__(self) -> None:
        if not (PG_BIN / "initdb").is_file():
            pytest.fail(
                f"PostgreSQL 15 is not installed (no {PG_BIN}/initdb): `make test` installs it "
                "(apt-get install -y postgresql); the Postgres storage is tested on a real server"
            )
        import os
        import tempfile

        # not under pytest's tmp folder: that one is private to this user, and initdb refuses
        # to run as root, so the server runs as Debian's `postgres` user
        self.dir = Path(tempfile.mkdtemp(prefix="gpu-pipeline-pg-"))
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        (self.dir / "pw").write_text(self.password + "\n")
        self._run(
            PG_BIN / "initdb",
            f"--pgdata={self.dir / 'data'}",
            f"--username={self.user}",
            f"--pwfile={self.dir / 'pw'}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.dir}"
            " -c fsync=off -c synchronous_commit=off"
        )
        self._run(
            PG_BIN / "pg_ctl", "-D", self.dir / "data", "-l", self.dir / "log", "-o", opts,
            "-w", "-t", "30", "start",
        )  # fmt: skip
        self.env = {
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_DB": self.db,
            "DAGSTER_PG_PORT": str(self.port),
        }
        # initdb made the databases postgres, template0 and template1: the instance's own one
        self.sql("postgres", f"CREATE DATABASE {self.db}")

    def _run(self, *args) -> None:
        p = subprocess.run(
            [*self.as_user, *map(str, args)], capture_output=True, text=True, timeout=60
        )
        if p.returncode != 0:
            log = self.dir / "log"
            tail = log.read_text()[-1500:] if log.exists() else ""
            self.stop()
            pytest.fail(
                f"postgres: {Path(args[0]).name} failed: {(p.stderr or p.stdout)[-1500:]}{tail}"
            )

    def connect(self, db: str = ""):
        """A psycopg2 connection to database `db` (default: the instance's), over TCP with the
        password, autocommitting."""
        import psycopg2

        con = psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=db or self.db,
        )
        con.autocommit = True
        return con

    def sql(self, db: str, statement: str) -> list[tuple]:
        """The rows of one statement on database `db`."""
        con = self.connect(db)
        try:
            with con.cursor() as cur:
                cur.execute(statement)
                return cur.fetchall() if cur.description else []
        finally:
            con.close()

    def stop(self) -> None:
        if (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run(
                [*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                 "fast", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)


REPO = Path(__file__).resolve().parents[1]


FAST_DAEMON = Path(__file__).resolve().parent / "fast_daemon"
DAEMON_INTERVAL_S = 5


@contextmanager
def dg_dev(env: dict, log: Path) -> Iterator[int]:
    """What `make dev` runs: `dg dev` (the project from pyproject.toml's [tool.dg]) on a free
    loopback port with `env`, its output in `log`; yields the port, and stops the server's
    process group (webserver, daemon, code server, runs) at the end."""
    port = free_port()
    dg_cli = str(Path(sys.executable).with_name("dg"))
    # the daemon's loops every DAEMON_INTERVAL_S, not Dagster's fixed 30 s (tests/fast_daemon)
    path = os.pathsep.join(p for p in (str(FAST_DAEMON), env.get("PYTHONPATH")) if p)
    env = {**env, "PYTHONPATH": path, "GPU_PIPELINE_TEST_DAEMON_INTERVAL": str(DAEMON_INTERVAL_S)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [dg_cli, "dev", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env={**env, "VIRTUAL_ENV": sys.prefix},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
