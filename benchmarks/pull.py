"""`make bench-pull`: fetch time and bytes landed per GPU-day, pulling the demo fleet back from a
real VictoriaMetrics on loopback (Debian package `victoria-metrics`).

Generates one day of the demo fleet (50 GPUs, 3 clusters, 30 s scrapes, profiling fields) as
exposition files, imports them, then pulls the day twice (the second pull must change nothing)
and prints one line:
bench-pull: gpus=… seconds=… s_per_gpu_day=… mib=… kib_per_gpu_day=… samples=… repull_changed=…
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

DAY = date(2024, 1, 1)
GPUS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    from gpu_pipeline.lib.generate import generate
    from gpu_pipeline.lib.ingest.pull import PromServer, pull_day

    binary = shutil.which("victoria-metrics")
    if binary is None:
        print("bench-pull: victoria-metrics is not installed (apt-get install -y victoria-metrics)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"-storageDataPath={tmp / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=0s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        files = generate(tmp / "files", DAY, days=1, gpus=GPUS, clusters=3, seed=42)
        t = time.perf_counter()
        for f in files:
            req = urllib.request.Request(url + "/api/v1/import/prometheus", data=f.read_bytes())
            urllib.request.urlopen(req, timeout=120).read()
        urllib.request.urlopen(url + "/internal/force_flush", timeout=60).read()
        loaded = time.perf_counter() - t
        server = PromServer(url=url)
        rep = pull_day(server, DAY, tmp / "raw")
        again = pull_day(server, DAY, tmp / "raw")
        mib = rep.bytes / 2**20
        print(
            f"pulled {DAY}: {len(rep.files)} files, {rep.series:,} series, {rep.samples:,} samples, "
            f"{rep.queries} queries, {mib:.2f} MiB in {rep.seconds:.2f} s (import took {loaded:.1f} s)"
        )
        print(
            f"bench-pull: gpus={GPUS} seconds={rep.seconds:.2f} s_per_gpu_day={rep.seconds / GPUS:.4f} "
            f"mib={mib:.2f} kib_per_gpu_day={rep.bytes / 1024 / GPUS:.1f} samples={rep.samples} "
            f"repull_changed={again.written}"
        )
        return 0 if again.written == 0 and rep.samples else 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
