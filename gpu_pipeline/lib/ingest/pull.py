"""Fetch a UTC day of DCGM series from a Prometheus-compatible server into the landing zone.

Prometheus, Thanos, Mimir and VictoriaMetrics answer the same HTTP API. For day D the puller
lists the metric names the server holds that day (`GET /api/v1/label/__name__/values`), keeps
those `lib/fields.py` understands (DCGM 3.x and 4.x names), and fetches each one window at a time:

- `raw` (default): an instant query with a range selector, `name{selector}[W]` at the window's
  end, which answers the scraped samples themselves, with their own timestamps, as a `matrix`.
  The pulled day is then the same samples a scrape archive holds: the same minutes and marts.
- `range`: `query_range` at a step, for servers that allow nothing else. Its points are the series'
  values on the step grid (the latest sample within the lookback), not the scrapes: a scrape at
  :35 reappears at the next :00, so minute means can shift by a sample.

Windows are [start, end), as the day is: a sample at 00:00:00.000 belongs to its day, one at the
next midnight to the next day. Servers differ at the edges of a range selector: VictoriaMetrics
(and Prometheus 3) answer (t - W, t], Prometheus 2.x [t - W, t]. So the query is evaluated at
end - 1 ms, which both answer with at least [start, end) (all of them store milliseconds), and
the points outside [start, end) are dropped before the file is written: every sample is fetched
once, on its own day. `range` mode asks for the grid points in [start, end) and is filtered the
same way. A window the server refuses as too large (samples per query, points per series) is
halved, down to MIN_WINDOW_S, then split per host label.

Methods: the label-values listings (`/api/v1/label/<name>/values`) are GET, the one method
Prometheus serves there (405 on POST); queries are POST (a form body, no URL length limit),
which Prometheus, Thanos, Mimir and VictoriaMetrics all serve on /api/v1/query and
/api/v1/query_range. Timeouts, connection errors, 429 and 5xx are retried with backoff; any
other 4xx or a `status: "error"` body stops the pull with the server's message (PullError).
`warnings` and Thanos partial responses are kept in the report.

What is fetched lands as the query_range JSON the pipeline parses, gzipped, one file per metric
and window under `<raw>/<cluster>/_pulled/<server>/<day>/`. The document starts as an API answer
does, `{"status":"success","data":{"resultType":"matrix","result":[...]},"gpu_pipeline":{...}}`,
so format detection, which reads a file's head, recognizes it whatever its size. Series are sorted
and the gzip carries no time, so a re-pull of the same data writes the same bytes and nothing is
re-ingested. Each file names the server, the query, its parameters and the [start, end) window
it holds (never credentials): `ingest_log.origin`.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from gpu_pipeline.lib.fields import METRIC_TO_COLUMN

DAY_S = 86400
MIN_WINDOW_S = 300
HOST_LABELS = ("Hostname", "hostname", "node", "instance")
# how servers say a query is too large (Prometheus, Thanos, Mimir, VictoriaMetrics)
TOO_LARGE = re.compile(
    r"too many samples|exceeded maximum resolution|maxSamplesPerQuery|maxPointsPerTimeseries|"
    r"max.?samples|maximum number of|exceeded the limit|limit exceeded|too many (series|chunks)",
    re.I,
)
RETRY_STATUS = {429, 500, 502, 503, 504}


class PullError(RuntimeError):
    """The server refused (4xx, an error body) or could not be reached after the retries."""


class TooLarge(Exception):
    """The server says this query is over its limits: ask for less."""


@dataclass(frozen=True)
class PromServer:
    """Where and how to ask. `selector`: extra label matchers, `cluster="east"` (braces optional)."""

    url: str
    token: str = ""
    username: str = ""
    password: str = ""
    ca_bundle: str = ""
    verify: bool = True
    selector: str = ""
    mode: str = "raw"  # raw | range
    step_s: int = 30
    window_s: int = 6 * 3600
    max_points: int = 11000
    concurrency: int = 2
    timeout_s: float = 60.0
    retries: int = 4
    backoff_s: float = 1.0
    cluster: str = "default"

    def __post_init__(self):
        if self.mode not in ("raw", "range"):
            raise ValueError(f"pull mode must be raw or range, not {self.mode!r}")
        if not re.match(r"^https?://", self.url):
            raise ValueError(f"server URL must start with http:// or https://, not {self.url!r}")
        if not (1 <= self.step_s <= 3600 and 60 <= self.window_s <= DAY_S):
            raise ValueError("step must be 1..3600 s and window 60..86400 s")

    @property
    def matchers(self) -> str:
        return self.selector.strip().strip("{}").strip()

    @property
    def public_url(self) -> str:
        """The URL without credentials, for provenance and logs."""
        p = urlsplit(self.url)
        host = p.hostname or ""
        port = f":{p.port}" if p.port else ""
        return f"{p.scheme}://{host}{port}{p.path}".rstrip("/")

    @property
    def folder(self) -> str:
        p = urlsplit(self.url)
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{p.hostname}_{p.port or ''}{p.path}").strip("_")


@dataclass
class PullReport:
    day: date
    files: list[Path] = field(default_factory=list)
    written: int = 0  # files whose bytes changed
    samples: int = 0
    series: int = 0
    bytes: int = 0
    queries: int = 0
    seconds: float = 0.0
    metrics: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.samples == 0


class Client:
    """requests with the server's auth and TLS, retries with backoff, errors as PullError."""

    def __init__(self, server: PromServer):
        self.server = server
        self.local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self.local, "session", None)
        if s is None:
            s = requests.Session()
            s.trust_env = False  # the configured credentials only, not ~/.netrc
            p = urlsplit(self.server.url)
            if self.server.token:
                s.headers["Authorization"] = f"Bearer {self.server.token}"
            elif self.server.username:
                s.auth = (self.server.username, self.server.password)
            elif p.username:  # credentials written in the URL
                s.auth = (unquote(p.username), unquote(p.password or ""))
            s.verify = self.server.ca_bundle or self.server.verify
            self.local.session = s
        return s

    def get(self, path: str, params: dict) -> dict:
        """GET, parameters in the query string: what every server serves on label values."""
        return self.call("GET", path, params)

    def post(self, path: str, params: dict) -> dict:
        """POST, parameters as a form body: for /api/v1/query and /api/v1/query_range."""
        return self.call("POST", path, params)

    def call(self, method: str, path: str, params: dict) -> dict:
        # the URL without its credentials: they travel in the session's auth, once
        p = urlsplit(self.server.url)
        netloc = p.hostname + (f":{p.port}" if p.port else "")
        url = p._replace(netloc=netloc).geturl().rstrip("/") + path
        last = ""
        for attempt in range(self.server.retries + 1):
            if attempt:
                time.sleep(min(self.server.backoff_s * 2 ** (attempt - 1), 30.0))
            try:
                if method == "GET":
                    r = self._session().get(url, params=params, timeout=self.server.timeout_s)
                else:
                    r = self._session().post(url, data=params, timeout=self.server.timeout_s)
            except (requests.Timeout, requests.ConnectionError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            body = _json(r)
            message = (body or {}).get("error") or r.text[:300].strip()
            if TOO_LARGE.search(str(message)) and r.status_code in (400, 422, 503, 200):
                raise TooLarge(message)
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {message}"
                continue
            if r.status_code >= 400:
                raise PullError(f"{self.server.public_url}{path}: HTTP {r.status_code}: {message}")
            if body is None:
                raise PullError(f"{self.server.public_url}{path}: the answer is not JSON")
            if body.get("status") == "error":
                raise PullError(
                    f"{self.server.public_url}{path}: {body.get('errorType', 'error')}: {message}"
                )
            return body
        raise PullError(
            f"{self.server.public_url}{path}: no answer after {self.server.retries + 1} attempts "
            f"({last})"
        )


def _json(r: requests.Response) -> dict | None:
    try:
        body = r.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _iso(t: float) -> str:
    """RFC 3339 in UTC, to the millisecond when the time has one (servers store milliseconds)."""
    ms = round(t * 1000)
    text = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def _in_window(series: list[dict], start: float, end: float) -> list[dict]:
    """The series' points with start <= t < end (to the millisecond), as `values` lists; series
    left without a point are dropped. A point whose time is not a number is kept: the ingest
    quarantines it with its reason, it is never dropped here."""
    lo, hi = round(start * 1000), round(end * 1000)
    out = []
    for s in series:
        if not isinstance(s, dict):
            out.append(s)
            continue
        points = s.get("values") if "values" in s else [s.get("value")]
        if not isinstance(points, list):
            points = [points]
        kept = [
            p
            for p in points
            if not (
                isinstance(p, list)
                and p
                and isinstance(p[0], int | float)
                and not isinstance(p[0], bool)
            )
            or lo <= round(p[0] * 1000) < hi
        ]
        if kept:
            out.append({"metric": s.get("metric") or {}, "values": kept})
    return out


def wanted(names: list[str]) -> list[str]:
    """The server's metric names that are telemetry fields gpu_pipeline understands."""
    return sorted(n for n in names if n.lower() in METRIC_TO_COLUMN)


def _selector(name: str, matchers: str) -> str:
    return f"{name}{{{matchers}}}" if matchers else name


def _fetch(
    client: Client, server: PromServer, name: str, matchers: str, start: int, end: int
) -> tuple[list[dict], list[str], str, dict]:
    """(series, warnings, query, parameters) of `name` over [start, end) (whole seconds);
    TooLarge when over the limits."""
    sel = _selector(name, matchers)
    if server.mode == "raw":
        # at end - 1 ms a range selector of the window's width answers (start - 1 ms, end - 1 ms]
        # (VictoriaMetrics, Prometheus 3) or [start - 1 ms, end - 1 ms] (Prometheus 2.x): both
        # hold [start, end), and _in_window drops the rest
        query = f"{sel}[{end - start}s]"
        params = {"time": _iso(end - 0.001)}
        body = client.post("/api/v1/query", {"query": query, **params})
    else:
        query = sel
        # the grid points in [start, end): start, start + step, ..., the last one before end
        last = start + (end - start - 1) // server.step_s * server.step_s
        if (last - start) // server.step_s + 1 > server.max_points:
            raise TooLarge(f"more than {server.max_points} points per series")
        params = {"start": _iso(start), "end": _iso(last), "step": f"{server.step_s}s"}
        body = client.post("/api/v1/query_range", {"query": query, **params})
    data = body.get("data") or {}
    result = _in_window(data.get("result") or [], start, end)
    warnings = [str(w) for w in body.get("warnings") or []]
    if body.get("isPartial") or data.get("isPartial"):  # Thanos partial_response
        warnings.append(f"{query}: partial response (some stores did not answer)")
    return result, warnings, query, params


def _host_values(client: Client, name: str, matchers: str, start: int, end: int):
    for label in HOST_LABELS:
        body = client.get(
            f"/api/v1/label/{label}/values",
            {"match[]": _selector(name, matchers), "start": _iso(start), "end": _iso(end - 0.001)},
        )
        values = body.get("data") or []
        if values:
            return label, sorted(values)
    return None, []


@dataclass
class Piece:
    name: str
    start: int  # the window [start, end), epoch seconds
    end: int
    part: str  # "" or the host it was split to
    series: list[dict]
    query: str
    params: dict  # the query's parameters besides the query (time, or start/end/step)


def _pieces(client: Client, server: PromServer, name: str, start: int, end: int, warnings):
    """The series of `name` over [start, end), in as many pieces as the server's limits ask."""
    try:
        result, w, query, params = _fetch(client, server, name, server.matchers, start, end)
        warnings += w
        return [Piece(name, start, end, "", result, query, params)]
    except TooLarge as too_large:
        if end - start > MIN_WINDOW_S:
            mid = start + (end - start) // 2
            return _pieces(client, server, name, start, mid, warnings) + _pieces(
                client, server, name, mid, end, warnings
            )
        label, hosts = _host_values(client, name, server.matchers, start, end)
        if not hosts:
            raise PullError(f"{name}: {too_large} even for {int(end - start)} s") from None
        out = []
        for h in hosts:
            m = ", ".join(x for x in (server.matchers, f'{label}="{_escape(h)}"') if x)
            try:
                result, w, query, params = _fetch(client, server, name, m, start, end)
            except TooLarge as e:
                raise PullError(
                    f"{name}{{{label}={h!r}}}: {e} even for {int(end - start)} s"
                ) from None
            warnings += w
            out.append(Piece(name, start, end, h, result, query, params))
        return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _document(server: PromServer, piece: Piece) -> bytes:
    """The query_range JSON of one piece, gzipped without a time: same data, same bytes.

    Keys in the order an API answer has them, `status` and `data.resultType` before the
    `result` array (so a reader of the head knows the format), never sorted; series sorted by
    their labels, labels sorted by name, the points as the server sent them."""
    series = sorted(
        (
            {"metric": dict(sorted((s.get("metric") or {}).items())), "values": s["values"]}
            for s in piece.series
            if isinstance(s, dict)
        ),
        key=lambda s: json.dumps(s["metric"], sort_keys=True),
    )
    # what is not a series object is kept as the server sent it: the ingest quarantines it
    series += sorted((s for s in piece.series if not isinstance(s, dict)), key=json.dumps)
    doc = {
        "status": "success",
        "data": {"resultType": "matrix", "result": series},
        "gpu_pipeline": {
            "server": server.public_url,
            "query": piece.query,
            "params": dict(sorted(piece.params.items())),
            "mode": server.mode,
            # the points the file holds: start <= t < end
            "window": {"start": _iso(piece.start), "end": _iso(piece.end), "closed": "left"},
        },
    }
    text = json.dumps(doc, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as g:
        g.write(text)
    return buf.getvalue()


def _name(piece: Piece) -> str:
    t = datetime.fromtimestamp(piece.start, UTC)
    part = f"_{re.sub(r'[^A-Za-z0-9_.-]+', '_', piece.part)}" if piece.part else ""
    return f"{piece.name}_{t:%H%M}{part}.json.gz"


def pull_day(
    server: PromServer,
    day: date,
    raw_root: str | Path,
    progress: Callable[[str], None] | None = None,
) -> PullReport:
    """Fetch day `day` (UTC) into the landing zone; the report says what came and what was said."""
    t0 = time.perf_counter()
    client = Client(server)
    start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    end = start + DAY_S  # the day is [start, end)
    report = PullReport(day)
    body = client.get(
        "/api/v1/label/__name__/values",
        {
            **({"match[]": "{" + server.matchers + "}"} if server.matchers else {}),
            "start": _iso(start),
            "end": _iso(end - 0.001),
        },
    )
    report.metrics = wanted([str(n) for n in body.get("data") or []])
    folder = Path(raw_root) / server.cluster / "_pulled" / server.folder / day.isoformat()
    windows = [(s, min(s + server.window_s, end)) for s in range(start, end, server.window_s)]
    jobs = [(name, s, e) for name in report.metrics for s, e in windows]
    lock = threading.Lock()

    def work(job):
        name, s, e = job
        warnings: list[str] = []
        pieces = _pieces(client, server, name, s, e, warnings)
        written = []
        for piece in pieces:
            if not piece.series:
                continue
            data = _document(server, piece)
            path = folder / _name(piece)
            changed = not path.is_file() or path.read_bytes() != data
            if changed:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
            written.append((path, changed, piece, len(data)))
        with lock:
            report.queries += len(pieces)
            report.warnings += warnings
            for path, changed, piece, size in written:
                report.files.append(path)
                report.written += changed
                report.bytes += size
                report.series += len(piece.series)
                report.samples += sum(len(s["values"]) for s in piece.series if isinstance(s, dict))
        return name

    done = 0
    with ThreadPoolExecutor(max_workers=max(1, server.concurrency)) as pool:
        for _ in pool.map(work, jobs):
            done += 1
            if progress and (done % max(1, len(jobs) // 10) == 0 or done == len(jobs)):
                progress(f"{day}: {done}/{len(jobs)} queries, {report.samples:,} samples")
    report.files.sort()
    report.seconds = time.perf_counter() - t0
    return report


def days_between(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]
