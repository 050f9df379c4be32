"""Pulling days from a Prometheus-compatible server: a real VictoriaMetrics on loopback (the
marts of pulled days equal those of the same scrape files), and a stub for faults."""

import json
import threading
import time
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import dagster as dg
import pytest
from helpers import cli, cli_env
from servers import load, start_victoria_metrics

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


def run(assets, raw: Path, lake: Path, day: date, url: str | None = None):
    res = {
        "lake": LakeResource(root=str(lake)),
        "landing": LandingResource(root=str(raw)),
        "reference": ReferenceResource(),
    }
    if url:
        res["prometheus"] = PromResource(url=url, cluster=CLUSTER, window_s=4 * 3600)
    return dg.materialize(
        assets,
        partition_key=day.isoformat(),
        resources=res,
        instance=dg.DagsterInstance.ephemeral(),
    )


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


class Stub(BaseHTTPRequestHandler):
    script: list = []  # (predicate on (path, params), status, body or "sleep")
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        params = {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode()).items()}
        Stub.seen.append((self.path, params))
        for when, status, body in Stub.script:
            if when(self.path, params):
                if body == "sleep":
                    time.sleep(2)
                    body = {"status": "success", "data": []}
                data = json.dumps(body(self.path, params) if callable(body) else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
        self.send_response(404)
        self.end_headers()


@pytest.fixture()
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    Stub.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def names(path, params):
    return {"status": "success", "data": ["DCGM_FI_DEV_GPU_UTIL", "up", "node_cpu_seconds_total"]}


def samples(path, params):
    """One sample a minute inside the asked window (`m[Ns]` at `time`)."""
    end = datetime.fromisoformat(params["time"].replace("Z", "+00:00")).timestamp()
    width = int(params["query"].rsplit("[", 1)[1].rstrip("s]"))
    values = [[t, "50"] for t in range(int(end) - width + 60, int(end) + 1, 60)]
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{**SERIES, "values": values}]},
    }


def server(url, **kw) -> PromServer:
    return PromServer(
        url, **{"timeout_s": 0.5, "backoff_s": 0.01, "retries": 2, "window_s": 6 * 3600, **kw}
    )


def is_names(p, q):
    return p == "/api/v1/label/__name__/values"


def is_query(p, q):
    return p == "/api/v1/query"


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

    # a server that refuses even 5 minutes of all hosts: one query per host
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
        (is_query, 200, samples),
    ]
    rep = pull_day(server(stub, window_s=600), date(2024, 1, 10), tmp_path / "h")
    assert rep.samples == 1440 and all(p.name.endswith("_h1.json.gz") for p in rep.files)


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


def test_credentials_reach_the_server_and_never_the_files(stub, tmp_path):
    Stub.script = [(is_names, 200, names), (is_query, 200, samples)]
    headers = []
    original = Stub.do_POST

    def spy(self):
        headers.append(self.headers.get("Authorization"))
        original(self)

    Stub.do_POST = spy
    try:
        url = stub.replace("http://", "http://user:secret@")
        rep = pull_day(server(url, token="t0ken"), date(2024, 1, 10), tmp_path)
    finally:
        Stub.do_POST = original
    assert set(headers) == {"Bearer t0ken"}
    import gzip

    text = "".join(gzip.decompress(p.read_bytes()).decode() for p in rep.files)
    assert "t0ken" not in text and "secret" not in text and stub in text
