"""Pulling days from a Prometheus-compatible server: a real VictoriaMetrics and a real
Prometheus 2.x on loopback (the pulled days' gpu_samples and marts equal those of the same scrape
files, edges included), and a stub for faults, request methods and window edges."""

import gzip
import json
import math
import re
import threading
import time
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dagster as dg
import pytest
from helpers import cli, cli_env
from servers import load, start_prometheus, start_victoria_metrics

from gpu_pipeline.defs import marts, report, staging
from gpu_pipeline.defs.pull import prometheus_export
from gpu_pipeline.defs.raw import build_ingest
from gpu_pipeline.defs.resources import (
    LakeResource,
    LandingResource,
    PromResource,
    ReferenceResource,
)
from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.ingest.landing import detect_format, list_landing, parse_landing_file
from gpu_pipeline.lib.ingest.pull import PromServer, PullError, pull_day
from gpu_pipeline.lib.io.lake import Lake

DAYS = [date(2026, 5, 1), date(2026, 5, 2)]
CLUSTER = "us-east-train"  # what generate() names the first cluster (its files' folder)


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vm")
    proc, url = start_victoria_metrics(tmp)
    try:
        files = generate(tmp / "files", DAYS[0], days=2, gpus=4, clusters=1, seed=7)
        load(url, files)
        yield url, tmp
    finally:
        proc.terminate()
        proc.wait(timeout=30)


ASSETS = [
    prometheus_export,
    build_ingest(("prometheus_export",)),
    *dg.load_assets_from_modules([staging, marts, report]),
]
FILE_ASSETS = [build_ingest(), *dg.load_assets_from_modules([staging, marts, report])]


def run(assets, raw: Path, lake: Path, day: date | list[date], url: str | None = None, **prom):
    """Materialize `assets` for a day, or for a range of days in one run (as a backfill does)."""
    res = {
        "lake": LakeResource(root=str(lake)),
        "landing": LandingResource(root=str(raw)),
        "reference": ReferenceResource(),
    }
    if url:
        res["prometheus"] = PromResource(url=url, cluster=CLUSTER, **{"window_s": 4 * 3600, **prom})
    if isinstance(day, list):
        which = {
            "tags": {
                "dagster/asset_partition_range_start": day[0].isoformat(),
                "dagster/asset_partition_range_end": day[-1].isoformat(),
            }
        }
    else:
        which = {"partition_key": day.isoformat()}
    return dg.materialize(assets, resources=res, instance=dg.DagsterInstance.ephemeral(), **which)


TABLES = (
    "gpu_samples",
    "gpu_minutes",
    "gpu_daily",
    "hourly_fleet_metrics",
    "priced_waste",
    "persistent_bottlenecks",
    "recommendations",
    "gpu_health",
    "stragglers",
    "efficiency_roi",
    "namespace_efficiency",
    "workload_efficiency",
)


def test_pulled_days_give_the_marts_of_the_scrape_files(vm):
    url, tmp = vm
    pulled, direct = tmp / "pulled", tmp / "direct"
    for day in DAYS:
        r = run(ASSETS, pulled / "raw", pulled / "lake", day, url)
        assert r.success
        checks = {e.check_name: e.passed for e in r.get_asset_check_evaluations()}
        assert checks["server_has_data"]
        assert run(FILE_ASSETS, tmp / "files", direct / "lake", day).success
    a, b = Lake(pulled / "lake"), Lake(direct / "lake")
    for day in DAYS:
        for t in TABLES:
            got, want = a.read(t, day), b.read(t, day)
            if "source_file" in got.columns:
                got, want = got.drop("source_file"), want.drop("source_file")
            assert got.height > 0 or t in ("persistent_bottlenecks", "stragglers"), t
            assert got.equals(want), (t, day)
    log = a.read("ingest_log", DAYS[0])
    assert log["origin"].str.starts_with(url).all() and log["rows_quarantined"].sum() == 0
    assert log["rows_accepted"].sum() == b.read("ingest_log", DAYS[0])["rows_accepted"].sum()


def test_a_repull_writes_the_same_bytes_and_nothing_new_is_ingested(vm):
    url, tmp = vm
    raw = tmp / "repull"
    server = PromServer(url, cluster=CLUSTER)
    first = pull_day(server, DAYS[0], raw)
    stamp = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.files}
    again = pull_day(server, DAYS[0], raw)
    assert again.written == 0 and again.files == first.files
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in again.files} == stamp
    assert first.samples == again.samples > 0


GONE = date(2024, 3, 20)  # the day after GPU-b left the fleet (23:58 the day before)


def gone_and_gap_lines() -> bytes:
    """30-s scrapes on 2024-03-19 and 20 of three GPUs: GPU-a throughout, GPU-b until 23:58 of
    the 19th, GPU-c with a 20-minute gap from 10:00 on the 20th."""
    lines, t0 = [], day_ms(GONE) - 86_400_000
    for k in range(2 * 2880):
        t = t0 + 30_000 * k
        gpus = ["a"]
        if t <= day_ms(GONE) - 120_000:
            gpus.append("b")
        if not day_ms(GONE) + 36_000_000 <= t < day_ms(GONE) + 37_200_000:
            gpus.append("c")
        lines += [
            f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-{g}",Hostname="n1",modelName="NVIDIA A100-SXM4-40GB"}}'
            f" 50 {t}"
            for g in gpus
        ]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("mode", ["raw", "range"])
def test_a_gpu_that_left_and_a_gap_are_not_filled_in_by_the_servers_lookback(vm, tmp_path, mode):
    """`range` mode asked for the bare selector: the server's 5-minute lookback carried GPU-b's
    last value of the day before into the day (a GPU invented, its minutes priced) and filled
    5 minutes of GPU-c's gap (adversarial review). Each grid point now takes the last sample of
    the step before it only."""
    url, tmp = vm
    if not (tmp / "gone.loaded").exists():
        f = tmp / "gone.prom"
        f.write_bytes(gone_and_gap_lines())
        load(url, [f])
        (tmp / "gone.loaded").touch()
    rep = pull_day(PromServer(url, cluster=CLUSTER, mode=mode), GONE, tmp_path)
    got = pulled_points(rep.files)
    per_gpu = {}
    for labels, _, _ in got:
        per_gpu[json.loads(labels)["UUID"]] = per_gpu.get(json.loads(labels)["UUID"], 0) + 1
    assert per_gpu == {"GPU-a": 2880, "GPU-c": 2880 - 40}, per_gpu
    assert {json.loads(k)["__name__"] for k, _, _ in got} == {"DCGM_FI_DEV_GPU_UTIL"}


def test_a_day_the_server_has_no_data_for_is_a_visible_outcome(vm):
    url, tmp = vm
    r = run(ASSETS, tmp / "none" / "raw", tmp / "none" / "lake", date(2026, 4, 20), url)
    (check,) = [e for e in r.get_asset_check_evaluations() if e.check_name == "server_has_data"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["days_without_data"].value == "2026-04-20"


def test_the_daily_schedule_runs_the_pull(vm, monkeypatch):
    url, tmp = vm
    monkeypatch.setenv("GPU_PIPELINE_PROM_URL", url)
    monkeypatch.setenv("GPU_PIPELINE_PROM_CLUSTER", CLUSTER)
    monkeypatch.setenv("GPU_PIPELINE_RAW", str(tmp / "sched" / "raw"))
    monkeypatch.setenv("GPU_PIPELINE_LAKE", str(tmp / "sched" / "lake"))
    from gpu_pipeline.definitions import build_definitions

    defs = build_definitions()
    tick = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 5, 3, 2, tzinfo=UTC))
    (req,) = defs.resolve_schedule_def("daily_pipeline_schedule").evaluate_tick(tick).run_requests
    assert req.partition_key == "2026-05-02"
    job = defs.resolve_job_def("daily_pipeline")
    assert dg.AssetKey("prometheus_export") in job.asset_layer.selected_asset_keys
    res = job.execute_in_process(
        partition_key=req.partition_key, instance=dg.DagsterInstance.ephemeral()
    )
    assert res.success
    m = Lake(tmp / "sched" / "lake").read("gpu_minutes", date(2026, 5, 2))
    assert m.height == 4 * 1440


def test_the_cli_pulls_and_materializes_with_pull(vm, tmp_path):
    """`gpu-pipeline pull` and `materialize --pull`, as a user runs them: the pulled days give the
    summary and marts of the same scrape files materialized directly."""
    url, tmp = vm
    env = {**cli_env(tmp_path), "GPU_PIPELINE_PROM_CLUSTER": CLUSTER}
    days = ["--start", str(DAYS[0]), "--end", str(DAYS[1])]
    out = cli("pull", *days, "--url", url, "--raw", str(tmp_path / "raw"), env=env).stdout
    assert f"{DAYS[0]}: " in out and f"{DAYS[1]}: " in out and "NO DATA" not in out
    again = cli("pull", *days, "--url", url, "--raw", str(tmp_path / "raw"), env=env).stdout
    assert again.count("(0 changed)") == 2, again
    lake = tmp_path / "lake"
    pulled = cli(
        "materialize",
        *days,
        "--pull",
        "--url",
        url,
        "--raw",
        str(tmp_path / "raw2"),
        "--lake",
        str(lake),
        "--summary",
        env=env,
    ).stdout
    direct = cli(
        "materialize",
        *days,
        "--raw",
        str(tmp / "files"),
        "--lake",
        str(tmp_path / "direct"),
        "--summary",
        env=env,
    ).stdout
    summary = pulled[pulled.index("Fleet summary") :].replace(str(lake), "LAKE")
    assert summary == direct[direct.index("Fleet summary") :].replace(
        str(tmp_path / "direct"), "LAKE"
    )
    assert "avg utilization" in summary
    for day in DAYS:
        for t in ("gpu_minutes", "priced_waste", "hourly_fleet_metrics"):
            got = Lake(lake).read(t, day)
            want = Lake(tmp_path / "direct").read(t, day)
            assert got.height > 0 and got.drop("source_file", strict=False).equals(
                want.drop("source_file", strict=False)
            ), (t, day)
    refused = cli("materialize", *days, "--pull", "--lake", str(lake), env=env, check=False)
    assert refused.returncode == 2 and "--pull needs a server" in refused.stdout + refused.stderr


# --- a 50-GPU fleet, from a real VictoriaMetrics and a real Prometheus, sample for sample --------

FLEET_DAYS = [date(2026, 6, 1), date(2026, 6, 2)]
FLEET_GPUS = 50
MINUTE_MS = 60_000


def day_ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1000


def on_the_minute(text: str) -> str:
    """The generator's scrapes land up to 3 s into the minute; here they sit on it, so a sample
    falls on every window's and every day's first millisecond."""
    return re.sub(r" (\d+)$", lambda m: f" {int(m[1]) // MINUTE_MS * MINUTE_MS}", text, flags=re.M)


def scrape_at(text: str, at_ms: int, to_ms: int) -> str:
    """The samples of `text` stamped `at_ms`, restamped `to_ms`."""
    return "".join(
        f"{ln[: ln.rindex(' ')]} {to_ms}\n" for ln in re.findall(rf"^.* {at_ms}$", text, re.M)
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two days of 50 GPUs' scrape files (1-minute scrapes on the minute), the gpu_samples and
    ingest_log they give, and two more files for the servers only: every series one millisecond
    before the first day, and at the first millisecond after the second (no pulled day may hold
    either)."""
    tmp = tmp_path_factory.mktemp("fleet")
    files, before, after = [], [], []
    first, end = day_ms(FLEET_DAYS[0]), day_ms(FLEET_DAYS[-1]) + 86_400_000
    generated = generate(tmp / "gen", FLEET_DAYS[0], days=2, gpus=FLEET_GPUS, clusters=1, seed=29)
    for f in generated:
        text = on_the_minute(f.read_text())
        f.unlink()
        out = tmp / "files" / f.relative_to(tmp / "gen")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        files.append(out)
        before.append(scrape_at(text, first, first - 1))
        after.append(scrape_at(text, end - MINUTE_MS, end))
    edges = [tmp / "edges" / "before.prom", tmp / "edges" / "after.prom"]
    edges[0].parent.mkdir()
    edges[0].write_text("".join(before))
    edges[1].write_text("".join(after))
    assert run([build_ingest()], tmp / "files", tmp / "direct", FLEET_DAYS).success
    # the servers get them in time order (promtool needs each series' times increasing)
    return [edges[0], *files, edges[1]], Lake(tmp / "direct")


@pytest.fixture(scope="module")
def fleet_vm(fleet, tmp_path_factory):
    proc, url = start_victoria_metrics(tmp_path_factory.mktemp("fleet_vm"))
    try:
        load(url, fleet[0])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fleet_prometheus(fleet, tmp_path_factory):
    proc, url = start_prometheus(tmp_path_factory.mktemp("fleet_prom"), fleet[0])
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


SERVERS = {"victoria-metrics": "fleet_vm", "prometheus": "fleet_prometheus"}


@pytest.mark.parametrize("kind", SERVERS)
def test_pulled_fleet_days_are_the_scrape_files_sample_for_sample(fleet, kind, request, tmp_path):
    """The reported loss: 8 GPUs pulled from a real server gave 1 in gpu_samples (files past
    64 KiB not recognized: `status` came after the samples), the day's 00:00:00 sample was
    missing (VictoriaMetrics) or a window's edge came twice (Prometheus 2.x), and Prometheus
    refused the POSTed metric listing. Here the whole pulled day (one file per metric, each
    well past 1 MiB) equals the scrape files' gpu_samples row for row, from 00:00:00 to
    23:59:00 of both days, nothing counted twice, nothing quarantined."""
    url = request.getfixturevalue(SERVERS[kind])
    _, direct = fleet
    raw, lake = tmp_path / "raw", Lake(tmp_path / "lake")
    assets = [prometheus_export, build_ingest(("prometheus_export",))]
    assert run(assets, raw, tmp_path / "lake", FLEET_DAYS, url, window_s=86400).success
    for day in FLEET_DAYS:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        pulled = sorted((raw / CLUSTER / "_pulled").rglob(f"{day}/*.json.gz"))
        assert len(pulled) == 9  # the generator's DCGM fields, one file each
        times = []
        for p in pulled:
            text = gzip.decompress(p.read_bytes())
            assert len(text) > 2**20, (p.name, len(text))  # 16 times the 64 KiB head
            assert text.startswith(b'{"status":"success","data":{"resultType":"matrix"')
            doc = json.loads(text)
            assert len(doc["data"]["result"]) == FLEET_GPUS
            times += [t for s in doc["data"]["result"] for t, _ in s["values"]]
        # one sample per series per minute, each of the day's minutes (the edges' extra samples
        # one millisecond before the first day and at the end of the second are not there)
        t0 = start.timestamp()
        assert sorted(set(times)) == [t0 + 60 * i for i in range(1440)]
        assert len(times) == 9 * FLEET_GPUS * 1440

        got, want = lake.read("gpu_samples", day), direct.read("gpu_samples", day)
        assert want.height == FLEET_GPUS * 1440 and want["gpu_uuid"].n_unique() == FLEET_GPUS
        assert want["timestamp"].min() == start
        assert want["timestamp"].max() == start + timedelta(hours=23, minutes=59)
        assert got.drop("source_file").equals(want.drop("source_file")), (kind, day)

        log = lake.read("ingest_log", day)
        assert log.height == 9 and set(log["format"]) == {"prometheus_json"}
        assert log["rows_duplicate"].sum() == 0 and log["rows_quarantined"].sum() == 0
        assert log["rows_accepted"].sum() == 9 * FLEET_GPUS * 1440
        assert direct.read("ingest_log", day)["rows_accepted"].sum() == 9 * FLEET_GPUS * 1440
        assert lake.read("quarantine", day).height == 0


@pytest.mark.parametrize("kind", SERVERS)
def test_windows_of_a_day_meet_without_a_gap_or_an_overlap(fleet, kind, request, tmp_path):
    """Pulled in 6-hour windows (the default), a day holds the very points of one whole-day
    window: 00:00, 06:00, 12:00 and 18:00 each once, in the window they start. (One host's 8
    GPUs, through the selector, to keep it quick.)"""
    url = request.getfixturevalue(SERVERS[kind])
    day, host = FLEET_DAYS[0], f'Hostname="{CLUSTER}-node-00"'
    whole = pull_day(
        PromServer(url, cluster=CLUSTER, selector=host, window_s=86400), day, tmp_path / "day"
    )
    parts = pull_day(PromServer(url, cluster=CLUSTER, selector=host), day, tmp_path / "6h")
    assert len(whole.files) == 9 and len(parts.files) == 36
    got, want = pulled_points(parts.files), pulled_points(whole.files)
    assert len(got) == len(want) == 9 * 8 * 1440
    assert sorted(got) == sorted(want)
    t0 = day_ms(day) / 1000
    for p in parts.files:
        doc = json.loads(gzip.decompress(p.read_bytes()))
        lo = epoch(doc["gpu_pipeline"]["window"]["start"])
        ts = {t for s in doc["data"]["result"] for t, _ in s["values"]}
        assert min(ts) == lo and max(ts) == lo + 6 * 3600 - 60 and (lo - t0) % (6 * 3600) == 0


def test_without_a_server_the_graph_reads_files_only(monkeypatch):
    monkeypatch.delenv("GPU_PIPELINE_PROM_URL", raising=False)
    from gpu_pipeline.definitions import build_definitions

    graph = build_definitions().resolve_asset_graph()
    assert dg.AssetKey("prometheus_export") not in graph.get_all_asset_keys()
    assert graph.get(dg.AssetKey("gpu_samples")).parent_keys == set()


# --- faults, from a stub that does what a real server won't on demand -------------------------

SERIES = {
    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1", "Hostname": "h1"},
}


class Stream:
    """A body the stub writes as it goes (HTTP/1.0, no Content-Length: it ends when the stub
    closes): `chunks(path, params)` yields bytes, or a number of seconds to wait. `raw`: the
    chunks are the whole answer, status line and headers included. The bytes each answer got
    out before the client went away are in `Stub.sent`."""

    def __init__(self, chunks, raw=False):
        self.chunks, self.raw = chunks, raw


class Stub(BaseHTTPRequestHandler):
    """Serves the label-values listings on GET only (POST: 405, as Prometheus does), queries on
    GET and POST; parameters from the query string or the form body."""

    script: list = []  # (predicate on (path, params), status, body, bytes, Stream or "sleep")
    seen: list = []  # (path, params)
    methods: list = []  # (method, path)
    sent: list = []  # (params, bytes of a Stream body written)

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        self.answer("GET", url.path, parse_qs(url.query))

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.answer("POST", urlsplit(self.path).path, parse_qs(self.rfile.read(n).decode()))

    def answer(self, method, path, query):
        params = {k: v[0] for k, v in query.items()}
        Stub.seen.append((path, params))
        Stub.methods.append((method, path))
        if method == "POST" and path.startswith("/api/v1/label/"):
            self.send_response(405)
            self.send_header("Content-Length", "18")
            self.end_headers()
            self.wfile.write(b"Method Not Allowed")
            return
        for when, status, body in Stub.script:
            if when(path, params):
                if body == "sleep":
                    time.sleep(2)
                    body = {"status": "success", "data": []}
                if isinstance(body, Stream):
                    self.stream(status, body, params)
                    return
                if isinstance(body, bytes):
                    data = body
                else:
                    data = json.dumps(body(path, params) if callable(body) else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
        self.send_response(404)
        self.end_headers()

    def stream(self, status, body, params):
        n = 0
        try:
            if not body.raw:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
            for chunk in body.chunks(params):
                if isinstance(chunk, bytes):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    n += len(chunk)
                else:
                    time.sleep(chunk)
        except OSError:  # the client closed: it read no further
            pass
        Stub.sent.append((params, n))


@pytest.fixture()
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    Stub.seen, Stub.methods, Stub.sent = [], [], []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def names(path, params):
    return {"status": "success", "data": ["DCGM_FI_DEV_GPU_UTIL", "up", "node_cpu_seconds_total"]}


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def matrix(values):
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{**SERIES, "values": values}]},
    }


def samples(path, params, closed=False):
    """One sample a minute, on the minute, in the asked range selector `m[Ns]` at `time`:
    (time - N, time] as VictoriaMetrics (and Prometheus 3) answer, or [time - N, time] when
    `closed`, as Prometheus 2.x does."""
    hi = epoch(params["time"])
    lo = hi - int(params["query"].rsplit("[", 1)[1].rstrip("s]"))
    first = math.ceil(lo / 60) * 60
    if first == lo and not closed:
        first += 60
    return matrix([[t, "50"] for t in range(first, math.floor(hi) + 1, 60)])


def closed_samples(path, params):
    return samples(path, params, closed=True)


def grid(path, params):
    """query_range: a point at start, start + step, ... up to end included (every server)."""
    lo, hi, step = epoch(params["start"]), epoch(params["end"]), int(params["step"].rstrip("s"))
    return matrix([[t, "50"] for t in range(int(lo), math.floor(hi) + 1, step)])


def server(url, **kw) -> PromServer:
    return PromServer(
        url, **{"timeout_s": 0.5, "backoff_s": 0.01, "retries": 2, "window_s": 6 * 3600, **kw}
    )


def is_names(p, q):
    return p == "/api/v1/label/__name__/values"


def is_query(p, q):
    return p == "/api/v1/query"


def is_range(p, q):
    return p == "/api/v1/query_range"


def test_a_503_then_success_is_retried(stub, tmp_path):
    calls = {"n": 0}

    def flaky(p, q):
        calls["n"] += 1
        return calls["n"] == 1 and is_query(p, q)

    Stub.script = [
        (is_names, 200, names),
        (flaky, 503, {"status": "error", "error": "overloaded"}),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub), date(2024, 1, 10), tmp_path)
    assert rep.samples == 1440 and rep.metrics == ["DCGM_FI_DEV_GPU_UTIL"]
    assert calls["n"] >= 5  # 4 windows + the retried one


def test_a_timeout_is_retried_then_reported(stub, tmp_path):
    Stub.script = [(is_names, 200, names), (is_query, 200, "sleep")]
    with pytest.raises(PullError, match=r"no answer after 3 attempts \(ReadTimeout"):
        pull_day(server(stub, concurrency=1), date(2024, 1, 10), tmp_path)


def test_an_error_body_fails_with_the_servers_message(stub, tmp_path):
    Stub.script = [
        (is_names, 200, names),
        (
            is_query,
            400,
            {"status": "error", "errorType": "bad_data", "error": "parse error at char 7"},
        ),
    ]
    with pytest.raises(PullError, match="HTTP 400: parse error at char 7"):
        pull_day(server(stub), date(2024, 1, 10), tmp_path)
    Stub.script = [(is_names, 401, {"status": "error", "error": "authentication required"})]
    with pytest.raises(PullError, match="401: authentication required"):
        pull_day(server(stub), date(2024, 1, 10), tmp_path)


def test_a_window_over_the_servers_limit_is_split_in_time_then_by_host(stub, tmp_path):
    def too_big(p, q):  # over 90 minutes at once is more than this server allows
        return is_query(p, q) and int(q["query"].rsplit("[", 1)[1].rstrip("s]")) > 5400

    Stub.script = [
        (is_names, 200, names),
        (
            too_big,
            422,
            {
                "status": "error",
                "errorType": "execution",
                "error": "query processing would load too many samples into memory",
            },
        ),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub), date(2024, 1, 10), tmp_path)
    assert rep.samples == 1440  # every minute once: the halves meet without overlap
    widths = {
        int(q["query"].rsplit("[", 1)[1].rstrip("s]")) for p, q in Stub.seen if is_query(p, q)
    }
    assert widths == {21600, 10800, 5400}
    files = sorted(p.name for p in rep.files)
    assert len(files) == 16 and files[0] == "DCGM_FI_DEV_GPU_UTIL_0000.json.gz"

    # a server that refuses even 5 minutes of all hosts: one query per host, then one for the
    # series without the host label (none here)
    def per_host_only(p, q):
        return is_query(p, q) and "Hostname=" not in q["query"]

    Stub.script = [
        (is_names, 200, names),
        (
            lambda p, q: p == "/api/v1/label/Hostname/values",
            200,
            {"status": "success", "data": ["h1"]},
        ),
        (
            per_host_only,
            422,
            {"status": "error", "error": "exceeded maximum resolution of 11,000 points"},
        ),
        (lambda p, q: is_query(p, q) and 'Hostname=""' in q["query"], 200, matrix([])),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub, window_s=600), date(2024, 1, 10), tmp_path / "h")
    assert rep.samples == 1440 and all(p.name.endswith("_h1.json.gz") for p in rep.files)


OTHER = {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-2", "hostname": "h2"}}


def test_a_window_split_by_host_keeps_the_series_without_the_host_label(stub, tmp_path):
    """Split per `Hostname`, the series that carry only `hostname` (or no host label) were never
    asked for: 84 of a GPU's 120 samples gone, exit 0 (adversarial review). They are asked for
    as `Hostname=""`, split by the next host label when that is refused too."""

    def refused(p, q):
        return is_query(p, q) and not re.search(r'hostname="h[12]"', q["query"], re.I)

    def other(path, params):
        body = samples(path, params)
        body["data"]["result"][0]["metric"] = OTHER["metric"]
        return body

    Stub.script = [
        (is_names, 200, names),
        (lambda p, q: p.endswith("/Hostname/values"), 200, {"status": "success", "data": ["h1"]}),
        (lambda p, q: p.endswith("/hostname/values"), 200, {"status": "success", "data": ["h2"]}),
        (lambda p, q: p.startswith("/api/v1/label/"), 200, {"status": "success", "data": []}),
        (lambda p, q: is_query(p, q) and 'hostname=""' in q["query"], 200, matrix([])),
        (refused, 422, {"status": "error", "error": "query would load too many samples"}),
        (lambda p, q: is_query(p, q) and 'hostname="h2"' in q["query"], 200, other),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub, window_s=600), date(2024, 1, 10), tmp_path)
    assert rep.samples == 2 * 1440
    got = pulled_points(rep.files)
    assert len({(k, t) for k, t, _ in got}) == 2 * 1440
    assert {json.loads(k)["UUID"] for k, _, _ in got} == {"GPU-1", "GPU-2"}
    assert {p.name.split("_", 6)[-1] for p in rep.files} == {"h1.json.gz", "hostname_h2.json.gz"}


# --- bounds: the answer's size, the request's time, the JSON's depth ------------------------

MIB = 2**20


def width(q) -> int:
    return int(q["query"].rsplit("[", 1)[1].rstrip("s]"))


def endless(params, total=64 * MIB):
    """A well-formed matrix answer of `total` bytes (64 series of 1 MiB), written 64 KiB at a
    time: what a server answers a query over a fleet far larger than the cap allows."""
    yield b'{"status":"success","data":{"resultType":"matrix","result":['
    point = b'[1704844800,"50"],'
    for i in range(total // MIB):
        yield b'%s{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-%d"},"values":[' % (
            b"," if i else b"",
            i,
        )
        for _ in range(16):
            yield point * (2**16 // len(point))
        yield point[:-1] + b"]}"
    yield b"]}}"


def test_an_answer_over_the_cap_is_not_read_past_it_and_the_window_is_halved(stub, tmp_path):
    """The reported 4 x 75 MB took the pull to 1.55 GB: an answer is read 64 KiB at a time and
    dropped past GPU_PIPELINE_PROM_MAX_RESPONSE_MB, as a server's own "too many samples" is:
    the window is halved, and the halves, small enough, complete the day."""
    Stub.script = [
        (is_names, 200, names),
        (lambda p, q: is_query(p, q) and width(q) > 10800, 200, Stream(endless)),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub, max_response_mb=1), DAY, tmp_path)
    assert rep.samples == 1440  # every minute of the day, from the 3-hour halves
    assert {width(q) for p, q in Stub.seen if is_query(p, q)} == {21600, 10800}
    big = [n for q, n in Stub.sent]
    assert len(big) == 4
    # the client stopped at the cap: what the stub got out is the cap plus the sockets' buffers,
    # far from the 64 MiB each answer holds (the old client read them all)
    assert all(n < 16 * MIB for n in big), big

    # a server whose answers stay over the cap down to 5 minutes, with no host label to split
    # by: the pull ends with one line
    Stub.script = [
        (is_names, 200, names),
        (is_query, 200, Stream(endless)),
        (lambda p, q: p.startswith("/api/v1/label/"), 200, {"status": "success", "data": []}),
    ]
    Stub.sent = []
    with pytest.raises(PullError) as e:
        pull_day(server(stub, max_response_mb=1, window_s=600), DAY, tmp_path / "min")
    assert "\n" not in str(e.value)
    assert re.fullmatch(
        r"DCGM_FI_DEV_GPU_UTIL: the answer is over 1 MiB \(GPU_PIPELINE_PROM_MAX_RESPONSE_MB\) "
        r"even for 300 s",
        str(e.value),
    ), str(e.value)
    assert all(n < 16 * MIB for _, n in Stub.sent)


def drip_body(params):
    """Headers, the start of an answer, then a byte every 0.2 s: never a read timeout (0.5 s
    here, 60 s by default), never an end (the old client waited the whole 15 s of it)."""
    yield b'{"status":"success","data":'
    for _ in range(75):
        yield 0.2
        yield b" "


def drip_headers(params):
    """The status line, then the headers a byte every 0.2 s."""
    yield b"HTTP/1.0 200 OK\r\nX-Slow: "
    for _ in range(75):
        yield 0.2
        yield b"a"


@pytest.mark.parametrize(
    "drip", [Stream(drip_body), Stream(drip_headers, raw=True)], ids=["body", "headers"]
)
def test_a_request_gets_a_total_time_not_a_time_per_read(stub, tmp_path, drip):
    """A server dripping a byte every 5 s held the pull past 150 s (the 60 s limit was per
    read): a request (connect, headers, body) gets GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S in all,
    is retried as a timeout is, and the pull ends with one line naming the limit. The first
    query that fails stops the others: the day does not wait for every window's retries."""
    Stub.script = [(is_names, 200, names), (is_query, 200, drip)]
    t0 = time.perf_counter()
    with pytest.raises(PullError) as e:
        pull_day(server(stub, request_timeout_s=1, retries=1), DAY, tmp_path)
    took = time.perf_counter() - t0
    assert "\n" not in str(e.value)
    assert re.fullmatch(
        r".*/api/v1/query: no answer after 2 attempts \(no complete answer within 1 s "
        r"\(GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S\)\)",
        str(e.value),
    ), str(e.value)
    assert took < 5, took  # 2 attempts of 1 s, for the 2 queries in flight; the others never ran
    assert len([1 for p, q in Stub.seen if is_query(p, q)]) <= 4


DEEP = 200_000


def test_json_nested_too_deep_is_one_line_from_the_cli(stub, tmp_path):
    """A 200k-deep answer printed a 55-line RecursionError traceback from `gpu-pipeline pull`:
    now one line, exit 1."""
    deep = b'{"status":"success","data":{"resultType":"matrix","result":[%s%s]}}' % (
        b"[" * DEEP,
        b"]" * DEEP,
    )
    Stub.script = [(is_names, 200, names), (is_query, 200, deep)]
    env = {**cli_env(tmp_path), "GPU_PIPELINE_PROM_CLUSTER": CLUSTER}
    out = cli(
        "pull",
        "--start",
        str(DAY),
        "--url",
        stub,
        "--raw",
        str(tmp_path / "raw"),
        env=env,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text and "RecursionError" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("pulling "), text
    assert re.fullmatch(
        r"error: DCGM_FI_DEV_GPU_UTIL \[2024-01-1\dT\d\d:00:00Z, 2024-01-1\dT\d\d:00:00Z\): "
        r"http://127\.0\.0\.1:\d+/api/v1/query: the answer is not a Prometheus API "
        r"response: nested too deep",
        lines[1],
    ), text


def test_a_landed_json_file_nested_too_deep_is_quarantined_whole_with_why(tmp_path):
    """The same document landed as a file (a pull from elsewhere, a copy): rejected whole with
    a reason a person reads, not Python's recursion message."""
    raw = tmp_path / "raw"
    (raw / CLUSTER).mkdir(parents=True)
    (raw / CLUSTER / "deep.json").write_bytes(
        b'{"status":"success","data":{"resultType":"matrix","result":[%s%s]}}'
        % (b"[" * DEEP, b"]" * DEEP)
    )
    (lf,) = list_landing(raw)
    fmt, out = parse_landing_file(lf)
    assert fmt == "prometheus_json" and out.rejected_whole
    (reason,) = out.quarantine["reason"].to_list()
    assert reason == (
        "prometheus_json: not a Prometheus API response: nested too deep (an API answer is a "
        "few levels deep)"
    )


def test_warnings_and_partial_answers_are_kept(stub, tmp_path):
    def warned(p, q):
        body = samples(p, q)
        return {
            **body,
            "warnings": ["store 3 did not answer"],
            "data": {**body["data"], "isPartial": True},
        }

    Stub.script = [(is_names, 200, names), (is_query, 200, warned)]
    rep = pull_day(server(stub), date(2024, 1, 10), tmp_path)
    assert "store 3 did not answer" in rep.warnings
    assert any("partial response" in w for w in rep.warnings)


def hostile(change):
    def answer(p, q):
        body = samples(p, q)
        change(body)
        return body

    return answer


def _warnings_int(b):
    b["warnings"] = 5


def _warnings_text(b):
    b["warnings"] = "careful"


def _metric_list(b):
    b["data"]["result"][0]["metric"] = ["x"]


def _far_time(b):
    b["data"]["result"][0]["values"].append([1e308, "1"])


@pytest.mark.parametrize(
    ("change", "warnings", "points"),
    [
        (_warnings_int, ["5"], 1440),
        (_warnings_text, ["careful"], 1440),  # not seven warnings of a letter each
        (_metric_list, [], 0),  # kept as sent, for the ingest to quarantine
        (_far_time, [], 1444),
    ],
)
def test_odd_answers_are_taken_as_they_are_without_a_traceback(
    stub, tmp_path, change, warnings, points
):
    """Each of these ended `gpu-pipeline pull` in a TypeError, AttributeError or
    OverflowError traceback (adversarial review)."""
    Stub.script = [(is_names, 200, names), (is_query, 200, hostile(change))]
    rep = pull_day(server(stub), date(2024, 1, 10), tmp_path)
    assert rep.warnings == warnings * 4  # one a window
    assert rep.samples == points
    if change is _metric_list:
        docs = [json.loads(gzip.decompress(p.read_bytes())) for p in rep.files]
        assert [d["data"]["result"][0]["metric"] for d in docs] == [["x"]] * 4
    if change is _far_time:  # a point no window holds is kept: the ingest says why
        docs = [json.loads(gzip.decompress(p.read_bytes())) for p in rep.files]
        assert all([1e308, "1"] in d["data"]["result"][0]["values"] for d in docs)


def test_an_answer_whose_data_is_not_an_object_is_not_taken_for_no_data(stub, tmp_path):
    Stub.script = [(is_names, 200, names), (is_query, 200, {"status": "success", "data": []})]
    with pytest.raises(PullError, match="not a Prometheus API response"):
        pull_day(server(stub), date(2024, 1, 10), tmp_path)


VM_LIMIT = (
    'error when exporting data for query="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{cluster=\\"east\\"}" '
    "on the time range (start=1710028800000, end=1710050399999): cannot fetch data for "
    '"filters=[{__name__=\\"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE\\",cluster=\\"east\\"}], '
    'timeRange=[2024-03-10T00:00:00Z..2024-03-10T05:59:59.999Z]": cannot select more than '
    "-search.maxSamplesPerQuery=1500 samples; possible solutions: to increase the "
    "-search.maxSamplesPerQuery; to reduce time range for the query; to use more specific "
    "label filters in order to select lower number of series"
)


def test_a_limit_named_late_in_a_long_message_halves_the_window(stub, tmp_path):
    """VictoriaMetrics names its limit after the query, twice: past 300 characters the words
    were cut before they were looked for, and the pull failed (adversarial review)."""
    assert len(VM_LIMIT) > 300 and VM_LIMIT.index("maxSamplesPerQuery") > 300

    def wide(p, q):
        return is_query(p, q) and width(q) > 10800

    Stub.script = [
        (is_names, 200, names),
        (wide, 422, {"status": "error", "errorType": "422", "error": VM_LIMIT}),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub), date(2024, 1, 10), tmp_path)
    assert rep.samples == 1440 and len(rep.files) == 8


def test_a_failed_pull_leaves_the_day_as_it_was_and_names_the_query(stub, tmp_path):
    """A pull that failed at noon left the morning's files in the landing zone, and the next
    run took them for the whole day (adversarial review). Now the day's files are moved in only
    once every query has answered; the error names the metric and window."""
    Stub.script = [(is_names, 200, names), (is_query, 200, samples)]
    srv = server(stub, concurrency=1)
    first = pull_day(srv, date(2024, 1, 10), tmp_path)
    before = {p: p.read_bytes() for p in first.files}

    def afternoon(p, q):
        return is_query(p, q) and epoch(q["time"]) > epoch("2024-01-10T12:00:00Z")

    def changed(p, q):
        body = samples(p, q)
        body["data"]["result"][0]["values"] = [
            [t, "99"] for t, _ in body["data"]["result"][0]["values"]
        ]
        return body

    Stub.script = [
        (is_names, 200, names),
        (afternoon, 500, {"status": "error", "error": "boom"}),
        (is_query, 200, changed),
    ]
    with pytest.raises(PullError) as e:
        pull_day(srv, date(2024, 1, 10), tmp_path)
    assert str(e.value).startswith(
        "DCGM_FI_DEV_GPU_UTIL [2024-01-10T12:00:00Z, 2024-01-10T18:00:00Z): "
    )
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(before) and all(p.read_bytes() == b for p, b in before.items())
    assert not [p for p in tmp_path.rglob(".*")]  # no staging folder left behind
    # a first pull that fails leaves nothing
    with pytest.raises(PullError):
        pull_day(srv, date(2024, 1, 11), tmp_path / "fresh")
    assert not [p for p in (tmp_path / "fresh").rglob("*") if p.is_file()]


def test_a_killed_pulls_staging_folder_is_said_and_removed_by_the_next_pull(stub, tmp_path):
    """SIGTERM skips a pull's `finally`: its hidden staging folder stayed, listed as a hidden
    folder "rename it without the dot to ingest it" (a partial day), and every pull left one
    more (review of the staging change)."""
    import os
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    srv = server(stub)
    day_dir = tmp_path / "default" / "_pulled" / srv.folder
    stale = day_dir / f".2024-01-10.{dead.pid}.0123abcd.partial"
    running = day_dir / f".2024-01-10.{os.getpid()}.4567cdef.partial"
    for d in (stale, running):
        d.mkdir(parents=True)
        (d / "DCGM_FI_DEV_GPU_UTIL_0000.json.gz").write_bytes(b"half a day")
    (lf,) = [f for f in list_landing(tmp_path) if f.source_file.endswith("0123abcd.partial")]
    assert lf.skipped and "pull's unfinished day" in lf.skipped and "rename" not in lf.skipped
    Stub.script = [(is_names, 200, names), (is_query, 200, samples)]
    rep = pull_day(srv, date(2024, 1, 10), tmp_path)
    assert rep.samples == 1440
    assert not stale.exists() and running.exists()  # a live pull's folder is left alone


def test_hosts_whose_file_names_would_meet_get_a_file_each(stub, tmp_path):
    """`node a` and `node_a` make the same file name: the second overwrote the first."""

    def per_host_only(p, q):
        return is_query(p, q) and 'Hostname="node' not in q["query"]

    def host(p, q):
        body = samples(p, q)
        h = re.search(r'Hostname="([^"]*)"', q["query"])[1]
        body["data"]["result"][0]["metric"] = {**SERIES["metric"], "UUID": h, "Hostname": h}
        return body

    Stub.script = [
        (is_names, 200, names),
        (
            lambda p, q: p.endswith("/Hostname/values"),
            200,
            {"status": "success", "data": ["node a", "node_a"]},
        ),
        (lambda p, q: is_query(p, q) and 'Hostname=""' in q["query"], 200, matrix([])),
        (per_host_only, 422, {"status": "error", "error": "too many samples"}),
        (is_query, 200, host),
    ]
    rep = pull_day(server(stub, window_s=300), date(2024, 1, 10), tmp_path)
    assert rep.samples == 2 * 1440 and len(rep.files) == 2 * 288
    assert {json.loads(k)["UUID"] for k, _, _ in pulled_points(rep.files)} == {"node a", "node_a"}
    assert "DCGM_FI_DEV_GPU_UTIL_0000_node_a-2.json.gz" in {p.name for p in rep.files}


def test_credentials_reach_the_server_and_never_the_files(stub, tmp_path):
    Stub.script = [(is_names, 200, names), (is_query, 200, samples)]
    headers = []
    original = Stub.answer

    def spy(self, *args):
        headers.append((args[0], self.headers.get("Authorization")))
        original(self, *args)

    Stub.answer = spy
    try:
        url = stub.replace("http://", "http://user:secret@")
        rep = pull_day(server(url, token="t0ken"), date(2024, 1, 10), tmp_path)
    finally:
        Stub.answer = original
    assert set(headers) == {("GET", "Bearer t0ken"), ("POST", "Bearer t0ken")}

    text = "".join(gzip.decompress(p.read_bytes()).decode() for p in rep.files)
    assert "t0ken" not in text and "secret" not in text and stub in text


# --- methods, window edges, the files' shape --------------------------------------------------

DAY = date(2024, 1, 10)
START = int(datetime(2024, 1, 10, tzinfo=UTC).timestamp())
END = START + 86400


def pulled_points(files) -> list[tuple[str, float, str]]:
    """(labels, time, value) of every point of the pulled files, in file order."""
    out = []
    for p in files:
        doc = json.loads(gzip.decompress(p.read_bytes()))
        for s in doc["data"]["result"]:
            key = json.dumps(s["metric"], sort_keys=True)
            out += [(key, t, v) for t, v in s["values"]]
    return out


def test_label_values_are_asked_with_get_and_queries_with_post(stub, tmp_path):
    """Prometheus serves /api/v1/label/<name>/values on GET only (405 on POST, the stub too):
    the metric names and the host split are GETs; the queries stay POSTs (all servers)."""

    def per_host_only(p, q):  # in the day's first window: the host split
        return is_query(p, q) and "Hostname=" not in q["query"] and q["time"] < "2024-01-10T01"

    Stub.script = [
        (is_names, 200, names),
        (
            lambda p, q: p == "/api/v1/label/Hostname/values",
            200,
            {"status": "success", "data": ["h1"]},
        ),
        (per_host_only, 422, {"status": "error", "error": "too many samples"}),
        (lambda p, q: is_query(p, q) and 'Hostname=""' in q["query"], 200, matrix([])),
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub, window_s=600), DAY, tmp_path)
    assert rep.samples == 1440
    by_path: dict[str, set] = {}
    for method, path in Stub.methods:
        by_path.setdefault(path, set()).add(method)
    assert by_path == {
        "/api/v1/label/__name__/values": {"GET"},
        "/api/v1/label/Hostname/values": {"GET"},
        "/api/v1/query": {"POST"},
    }
    (listing,) = [q for p, q in Stub.seen if is_names(p, q)]
    assert listing == {"start": "2024-01-10T00:00:00Z", "end": "2024-01-10T23:59:59.999Z"}


def test_queries_ask_for_the_day_cut_at_its_edges(stub, tmp_path):
    """raw: `m[6h]` at each window's end - 1 ms; range: the grid points from the window's start
    to its last step before the end."""
    Stub.script = [(is_names, 200, names), (is_query, 200, samples), (is_range, 200, grid)]
    pull_day(server(stub), DAY, tmp_path / "raw")
    asked = sorted((q["time"], q["query"]) for p, q in Stub.seen if is_query(p, q))
    assert asked == [
        (f"2024-01-10T{h:02d}:59:59.999Z", "DCGM_FI_DEV_GPU_UTIL[21600s]") for h in (5, 11, 17, 23)
    ]
    Stub.seen = []
    pull_day(server(stub, mode="range", step_s=30), DAY, tmp_path / "range")
    asked = sorted((q["start"], q["end"], q["step"]) for p, q in Stub.seen if is_range(p, q))
    assert asked == [
        (f"2024-01-10T{h:02d}:00:00Z", f"2024-01-10T{h + 5:02d}:59:30Z", "30s")
        for h in (0, 6, 12, 18)
    ]


@pytest.mark.parametrize(
    "answer",
    [samples, closed_samples, grid],
    ids=["left-open (VictoriaMetrics)", "closed (Prometheus 2.x)", "query_range"],
)
def test_a_day_holds_each_sample_once_from_its_first_second_on(stub, tmp_path, answer):
    """Whatever a server does at a range selector's edges, the pulled day holds each minute
    from 00:00:00 to 23:59:00 exactly once, and the next midnight not at all."""
    mode = "range" if answer is grid else "raw"
    Stub.script = [(is_names, 200, names), (is_query, 200, answer), (is_range, 200, answer)]
    rep = pull_day(server(stub, mode=mode, step_s=60), DAY, tmp_path)
    times = sorted(t for _, t, _ in pulled_points(rep.files))
    assert times == list(range(START, END, 60))
    assert rep.samples == 1440


def test_a_sample_at_the_days_start_is_kept_and_one_at_its_end_is_not(stub, tmp_path):
    """A server whose answer spills past the asked window (here: the same points whatever is
    asked): only [start, end) is written, to the millisecond."""
    spill = [START - 60, START - 0.001, START, START + 60, END - 0.001, END, END + 60]
    Stub.script = [
        (is_names, 200, names),
        (is_query, 200, matrix([[t, "7"] for t in spill])),
    ]
    rep = pull_day(server(stub, window_s=86400), DAY, tmp_path)
    assert [t for _, t, _ in pulled_points(rep.files)] == [START, START + 60, END - 0.001]
    assert rep.samples == 3
    (path,) = rep.files
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert doc["gpu_pipeline"]["window"] == {
        "start": "2024-01-10T00:00:00Z",
        "end": "2024-01-11T00:00:00Z",
        "closed": "left",
    }
    assert doc["gpu_pipeline"]["params"] == {"time": "2024-01-10T23:59:59.999Z"}


def test_pulled_files_say_what_they_are_before_their_samples(stub, tmp_path):
    """A file far past 64 KiB starts as an API answer does, `status` and `resultType` before
    the `result` array, as an API answer reads. The same data makes the same
    bytes (keys in the writer's order, not sorted; a gzip without a time)."""

    def wide(p, q):
        body = samples(p, q)
        (one,) = body["data"]["result"]
        body["data"]["result"] = [
            {"metric": {**one["metric"], "UUID": f"GPU-{i}"}, "values": one["values"]}
            for i in range(100)
        ]
        return body

    Stub.script = [(is_names, 200, names), (is_query, 200, wide)]
    rep = pull_day(server(stub, window_s=86400), DAY, tmp_path)
    (path,) = rep.files
    text = gzip.decompress(path.read_bytes())
    assert len(text) > 2**20, len(text)
    assert text.startswith(b'{"status":"success","data":{"resultType":"matrix","result":[{')
    assert text.index(b'"gpu_pipeline":') > len(text) - 400
    assert detect_format(text, path.name) == "prometheus_json"
    assert path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip MTIME
    first = path.read_bytes()
    again = pull_day(server(stub, window_s=86400), DAY, tmp_path / "again")
    assert again.files[0].read_bytes() == first
