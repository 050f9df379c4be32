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

Bounds, whatever the server does: an answer is read in chunks and never past `max_response_mb`
(a larger one is TooLarge: the window is halved, as for a server's own "too many samples"), so
the pull's memory follows the cap times `concurrency`; a request (connect, headers, the whole
body) gets `request_timeout_s` in all, after which a watchdog shuts its connection down (a
server dripping a byte every few seconds never trips a per-read timeout); JSON nested past
Python's recursion limit is "not a Prometheus API response", one line. The first query that
fails stops the others (they make no further attempt) and is the one the PullError names.
PullError messages are one line.

What is fetched lands as the query_range JSON the pipeline parses, gzipped, one file per metric
and window under `<raw>/<cluster>/_pulled/<server>/<day>/`. The document starts as an API answer
does, `{"status":"success","data":{"resultType":"matrix","result":[...]},"gpu_pipeline":{...}}`,
so format detection, which reads a file's head, recognizes it whatever its size. Series are sorted
and the gzip carries no time, so a re-pull of the same data writes the same bytes and nothing is
re-ingested. Each file names the server, the query, its parameters and the [start, end) window
it holds (never credentials): `ingest_log.origin`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests
import urllib3

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
MIB = 2**20
CHUNK = 2**16  # bytes read at a time; the cap is checked after each
MATCHED = 2**16  # bytes of a non-JSON error body searched for a limit's words


class PullError(RuntimeError):
    """The server refused (4xx, an error body) or could not be reached after the retries."""


class TooLarge(Exception):
    """The server says this query is over its limits, or its answer is over ours: ask for less."""


class _Stopped(PullError):
    """Another query of the pull failed: no further attempt (that one's error is reported)."""


class _Expired(Exception):
    """The request's total time (request_timeout_s) ran out."""


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
    timeout_s: float = 60.0  # connect, and each read
    request_timeout_s: float = 180.0  # a whole request: connect, headers and the whole body
    max_response_mb: float = 32.0  # the largest answer read, MiB; a larger one is too large
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
        if not (self.request_timeout_s > 0 and self.max_response_mb > 0):
            raise ValueError("the request timeout and the largest answer must be positive")

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


# the watch of the request the current thread is making (connections run in the caller's thread)
_CURRENT = threading.local()


class _Watch:
    """One request's deadline: when it passes, the socket the request runs on is shut down,
    which ends a read blocked in any phase (headers, body). The socket itself is kept: once
    the headers say the connection closes after the body, the connection lets go of it and
    only the response reads it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sock = None
        self.expired = False

    def attach(self, conn) -> None:
        sock = getattr(conn, "sock", None)
        if sock is None:  # not connected yet: connect() attaches it
            return
        with self.lock:
            self.sock = sock
            late = self.expired
        if late:
            _shut(sock)

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            sock = self.sock
        if sock is not None:
            _shut(sock)


def _shut(sock) -> None:
    # the plain socket's shutdown (an SSLSocket's would drop its state under a reader); a
    # socket already closed has no descriptor left to shut (EBADF)
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watched:
    """A urllib3 connection that tells the current request's watch which socket it uses."""

    def connect(self):
        super().connect()
        if w := getattr(_CURRENT, "watch", None):
            w.attach(self)

    def request(self, *args, **kwargs):
        if w := getattr(_CURRENT, "watch", None):
            w.attach(self)
        return super().request(*args, **kwargs)


# named as urllib3's own, which its error messages print ("HTTPConnectionPool(host=...)")
class HTTPConnection(_Watched, urllib3.connection.HTTPConnection):
    pass


class HTTPSConnection(_Watched, urllib3.connection.HTTPSConnection):
    pass


class HTTPConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = HTTPConnection


class HTTPSConnectionPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = HTTPSConnection


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": HTTPConnectionPool,
            "https": HTTPSConnectionPool,
        }


def _line(text: object, limit: int = 600) -> str:
    """A message on one line (a server's HTML error page has many), its head and tail when it
    is long: a server's cause often comes last (VictoriaMetrics repeats the query first)."""
    one = " ".join(str(text).split())
    if len(one) <= limit:
        return one
    tail = limit * 2 // 5
    return f"{one[: limit - tail - 3]} … {one[-tail:]}"


class Client:
    """requests with the server's auth and TLS, retries with backoff, errors as PullError; each
    request bounded in time and size (PromServer.request_timeout_s, max_response_mb)."""

    def __init__(self, server: PromServer):
        self.server = server
        self.local = threading.local()
        self.stop = threading.Event()  # a query failed: the others make no further attempt

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
            s.mount("http://", _Adapter())
            s.mount("https://", _Adapter())
            self.local.session = s
        return s

    def get(self, path: str, params: dict) -> dict:
        """GET, parameters in the query string: what every server serves on label values."""
        try:
            return self.call("GET", path, params)
        except TooLarge as e:  # a listing cannot be asked for in smaller pieces
            raise PullError(f"{self.server.public_url}{path}: {e}") from None

    def post(self, path: str, params: dict) -> dict:
        """POST, parameters as a form body: for /api/v1/query and /api/v1/query_range."""
        return self.call("POST", path, params)

    def call(self, method: str, path: str, params: dict) -> dict:
        # the URL without its credentials: they travel in the session's auth, once
        p = urlsplit(self.server.url)
        netloc = p.hostname + (f":{p.port}" if p.port else "")
        url = p._replace(netloc=netloc).geturl().rstrip("/") + path
        where = f"{self.server.public_url}{path}"
        last = ""
        for attempt in range(self.server.retries + 1):
            if attempt:
                time.sleep(min(self.server.backoff_s * 2 ** (attempt - 1), 30.0))
            if self.stop.is_set():
                raise _Stopped(f"{where}: stopped, another query failed")
            try:
                status, data = self._exchange(method, url, params)
            except _Expired:
                last = (
                    f"no complete answer within {self.server.request_timeout_s:g} s "
                    "(GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S)"
                )
                continue
            except (
                requests.Timeout,
                requests.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
            ) as e:
                last = _line(f"{type(e).__name__}: {e}")
                continue
            except requests.RequestException as e:
                raise PullError(_line(f"{where}: {type(e).__name__}: {e}")) from None
            body, why = _json(data)
            error = body.get("error") if body else None
            # matched on the whole text: VictoriaMetrics names its limit after the query, twice
            full = str(error) if error else data[:MATCHED].decode("utf-8", "replace")
            message = _line(full)
            if TOO_LARGE.search(full) and status in (400, 422, 503, 200):
                raise TooLarge(message)
            if status in RETRY_STATUS:
                last = f"HTTP {status}: {message}"
                continue
            if status >= 400:
                raise PullError(f"{where}: HTTP {status}: {message}")
            if body is None:
                raise PullError(f"{where}: the answer is not a Prometheus API response: {why}")
            if body.get("status") == "error":
                raise PullError(f"{where}: {_line(body.get('errorType', 'error'))}: {message}")
            return body
        raise PullError(
            f"{where}: no answer after {self.server.retries + 1} attempts ({_line(last)})"
        )

    def _exchange(self, method: str, url: str, params: dict) -> tuple[int, bytes]:
        """One request: (HTTP status, body). The body is read in chunks and never past
        max_response_mb (TooLarge); at request_timeout_s from the start the watchdog shuts the
        connection down, whatever the request is waiting for (_Expired)."""
        server = self.server
        cap = int(server.max_response_mb * MIB)
        per_read = min(server.timeout_s, server.request_timeout_s)
        watch = _CURRENT.watch = _Watch()
        timer = threading.Timer(server.request_timeout_s, watch.expire)
        timer.daemon = True
        timer.start()
        r = None
        try:
            form = {"params": params} if method == "GET" else {"data": params}
            r = self._session().request(
                method, url, timeout=(per_read, per_read), stream=True, **form
            )
            over = TooLarge(
                f"the answer is over {server.max_response_mb:g} MiB "
                "(GPU_PIPELINE_PROM_MAX_RESPONSE_MB)"
            )
            size = r.headers.get("Content-Length", "")
            if size.isdigit() and int(size) > cap and not r.headers.get("Content-Encoding"):
                raise over
            chunks, n = [], 0
            for chunk in r.iter_content(CHUNK):
                n += len(chunk)
                if n > cap:
                    raise over
                chunks.append(chunk)
            if watch.expired:  # a body without a length ends at the shut-down as if complete
                raise _Expired
            return r.status_code, b"".join(chunks)
        except requests.RequestException:
            if watch.expired:
                raise _Expired from None
            raise
        finally:
            timer.cancel()
            _CURRENT.watch = None
            if r is not None:
                r.close()  # unread: the connection is closed, not drained


def _json(data: bytes) -> tuple[dict | None, str]:
    """The body as a JSON object, or None and why not (one line, never a RecursionError)."""
    try:
        body = json.loads(data)
    except RecursionError:
        return None, "nested too deep"
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None, "not JSON"
    return (body, "") if isinstance(body, dict) else (None, "not a JSON object")


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
        if not _is_series(s):
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
                and math.isfinite(p[0] * 1000.0)  # 1e308 s is no time either
            )
            or lo <= round(p[0] * 1000) < hi
        ]
        if kept:
            out.append({"metric": s.get("metric") or {}, "values": kept})
    return out


def _is_series(s: object) -> bool:
    """A series object: a JSON object whose `metric`, if any, is an object of labels. Anything
    else is kept as the server sent it, for the ingest to quarantine with its reason."""
    return isinstance(s, dict) and isinstance(s.get("metric") or {}, dict)


def _warnings(body: dict) -> list[str]:
    """The answer's `warnings`: a list of messages, or one message."""
    w = body.get("warnings")
    if not w:
        return []
    return [str(x) for x in w] if isinstance(w, list) else [str(w)]


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
        # each grid point's last sample of the step before it, (t - step, t]: the bare selector
        # would carry a series' last value over the server's 5-minute lookback, past a gap and
        # into the day after a GPU left (adversarial review)
        query = f"last_over_time({sel}[{server.step_s * 1000 - 1}ms])"
        # the grid points in [start, end): start, start + step, ..., the last one before end
        last = start + (end - start - 1) // server.step_s * server.step_s
        if (last - start) // server.step_s + 1 > server.max_points:
            raise TooLarge(f"more than {server.max_points} points per series")
        params = {"start": _iso(start), "end": _iso(last), "step": f"{server.step_s}s"}
        body = client.post("/api/v1/query_range", {"query": query, **params})
    data = body.get("data")
    result = data.get("result", False) if isinstance(data, dict) else False
    if result is None:
        result = []
    if not isinstance(result, list):
        raise PullError(
            f"{server.public_url}: {query}: the answer is not a Prometheus API response: "
            "data.result is not a list"
        )
    result = _in_window(result, start, end)
    if server.mode == "range":  # a function's answer has no metric name
        for r in result:
            if _is_series(r):
                r["metric"] = {"__name__": name, **(r.get("metric") or {})}
    warnings = _warnings(body)
    if body.get("isPartial") or data.get("isPartial"):  # Thanos partial_response
        warnings.append(f"{query}: partial response (some stores did not answer)")
    return result, warnings, query, params


def _listing(client: Client, body: dict, label: str) -> list[str]:
    values = body.get("data") or []
    if not isinstance(values, list):
        raise PullError(
            f"{client.server.public_url}/api/v1/label/{label}/values: the answer is not a "
            "Prometheus API response: data is not a list"
        )
    return [str(v) for v in values]


def _host_values(client: Client, name: str, matchers: str, start: int, end: int, labels):
    """The first of `labels` that the series of `name` (within `matchers`) carry over
    [start, end), with its values; (None, []) when none is carried."""
    for i, label in enumerate(labels):
        body = client.get(
            f"/api/v1/label/{label}/values",
            {"match[]": _selector(name, matchers), "start": _iso(start), "end": _iso(end - 0.001)},
        )
        values = _listing(client, body, label)
        if values:
            return i, sorted(values)
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
    """The series of `name` over [start, end), in as many pieces as the server's limits (and
    max_response_mb) ask; yielded one at a time, so only one piece's answer is held at once."""
    try:
        result, w, query, params = _fetch(client, server, name, server.matchers, start, end)
    except TooLarge as e:
        too_large = str(e)  # not the exception: its traceback holds the dropped answer's chunks
    else:
        warnings += w
        yield Piece(name, start, end, "", result, query, params)
        return
    if end - start > MIN_WINDOW_S:
        mid = start + (end - start) // 2
        yield from _pieces(client, server, name, start, mid, warnings)
        yield from _pieces(client, server, name, mid, end, warnings)
        return
    yield from _by_host(client, server, name, (start, end), server.matchers, too_large, warnings)


def _and(*matchers: str) -> str:
    return ", ".join(m for m in matchers if m)


def _by_host(client, server, name, window, matchers, too_large, warnings, labels=HOST_LABELS):
    """The series of `name` over `window` that the server refuses at once, one host at a time:
    the first of `labels` the series carry, a query per value, then the series without that
    label (`label=""`), split the same way by the labels after it when they are too many still.
    Every series is asked for: a series without the first label is not left out."""
    start, end = window
    i, hosts = _host_values(client, name, matchers, start, end, labels)
    if i is None:
        raise PullError(f"{_selector(name, matchers)}: {too_large} even for {end - start} s")
    label = labels[i]
    prefix = "" if labels is HOST_LABELS else f"{label}="
    for h in hosts:
        m = _and(matchers, f'{label}="{_escape(h)}"')
        try:
            result, w, query, params = _fetch(client, server, name, m, start, end)
        except TooLarge as e:
            raise PullError(f"{name}{{{label}={h!r}}}: {e} even for {end - start} s") from None
        warnings += w
        yield Piece(name, start, end, prefix + h, result, query, params)
        result = None  # not held while the next host is fetched
    rest = _and(matchers, f'{label}=""')
    try:
        result, w, query, params = _fetch(client, server, name, rest, start, end)
    except TooLarge as e:
        yield from _by_host(client, server, name, window, rest, str(e), warnings, labels[i + 1 :])
        return
    warnings += w
    yield Piece(name, start, end, f"no-{label}", result, query, params)


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
            if _is_series(s)
        ),
        key=lambda s: json.dumps(s["metric"], sort_keys=True),
    )
    # what is not a series object is kept as the server sent it: the ingest quarantines it
    series += sorted((s for s in piece.series if not _is_series(s)), key=json.dumps)
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


def _metrics_wanted(client: Client, server: PromServer, start: int, end: int) -> list[str]:
    """The metric names the server holds over [start, end) (within its matchers) that the
    pipeline reads (`wanted`)."""
    body = client.get(
        "/api/v1/label/__name__/values",
        {
            **({"match[]": "{" + server.matchers + "}"} if server.matchers else {}),
            "start": _iso(start),
            "end": _iso(end - 0.001),
        },
    )
    return wanted(_listing(client, body, "__name__"))


def _write_piece(server: PromServer, piece: Piece, path: Path) -> tuple[int, int, int]:
    """Write one piece's document to `path`: (bytes, series, samples)."""
    try:
        data = _document(server, piece)
    except RecursionError:
        raise PullError(
            f"{server.public_url}: {piece.query}: the answer is not a Prometheus API "
            "response: nested too deep"
        ) from None
    path.write_bytes(data)
    points = sum(len(x["values"]) for x in piece.series if _is_series(x))
    return len(data), len(piece.series), points


def _publish(staging: Path, folder: Path) -> tuple[list[Path], int]:
    """Move a whole pulled day from `staging` into `folder`, a file at a time, leaving a file
    that already holds the same bytes untouched (its time too: a re-pull of unchanged data is
    not parsed again). Files of an earlier pull this one did not write (another window size,
    a day the server has since let go) are kept. (paths, files changed)."""
    files = sorted(staging.iterdir())
    if files:
        folder.mkdir(parents=True, exist_ok=True)
    paths, changed = [], 0
    for f in files:
        dst = folder / f.name
        paths.append(dst)
        same = dst.is_file() and dst.stat().st_size == f.stat().st_size
        if same and dst.read_bytes() == f.read_bytes():
            continue
        f.replace(dst)
        changed += 1
    return paths, changed


def _remove_stale_staging(folder: Path) -> None:
    """Staging folders of this day left by a pull that was killed (SIGTERM, SIGKILL: its
    `finally` never ran); one of a pull still running (its process alive) is left alone."""
    for d in folder.parent.glob(f".{folder.name}.*.partial") if folder.parent.is_dir() else ():
        try:
            pid = int(d.name.split(".")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


@contextlib.contextmanager
def _staging(folder: Path, root: Path):
    """A hidden staging folder beside the day's `folder`, removed at the end with each folder
    made for it (the cluster's, `_pulled`, the server's, the landing root) that is left empty:
    a pull that lands nothing (a day the server holds nothing for, a pull that fails) leaves
    nothing behind, not an empty server folder."""
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    above = [staging.parent]
    while above[-1] != root and above[-1] != above[-1].parent:
        above.append(above[-1].parent)
    made = [d for d in above if not d.exists()]  # deepest first
    for attempt in range(3):
        try:
            staging.mkdir(parents=True)
            break
        except FileNotFoundError:  # another pull's clean-up removed a folder above it meanwhile
            if attempt == 2:
                raise
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for d in made:
            try:
                d.rmdir()
            except OSError:  # not empty: the day landed, or another pull's day is there
                break


def _unique(name: str, used: set[str]) -> str:
    """`name`, or with -2, -3 … before its extension when another piece of the day has it
    (two hosts whose names differ only in characters a file name cannot hold)."""
    stem, ext = name.removesuffix(".json.gz"), ".json.gz"
    out, k = name, 1
    while out in used:
        k += 1
        out = f"{stem}-{k}{ext}"
    used.add(out)
    return out


def pull_day(
    server: PromServer,
    day: date,
    raw_root: str | Path,
    progress: Callable[[str], None] | None = None,
) -> PullReport:
    """Fetch day `day` (UTC) into the landing zone; the report says what came and what was said.

    The day's files are written to a hidden folder beside the day's and moved in once every
    query has answered: a pull that fails leaves the day as it was, never a part of it that a
    later run would take for the whole (adversarial review)."""
    t0 = time.perf_counter()
    client = Client(server)
    start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    end = start + DAY_S  # the day is [start, end)
    report = PullReport(day)
    report.metrics = _metrics_wanted(client, server, start, end)
    folder = Path(raw_root) / server.cluster / "_pulled" / server.folder / day.isoformat()
    windows = [(s, min(s + server.window_s, end)) for s in range(start, end, server.window_s)]
    jobs = [(name, s, e) for name in report.metrics for s, e in windows]
    lock = threading.Lock()
    failures: list[Exception] = []
    used: set[str] = set()

    def work(job):
        try:
            return fetch(job)
        except _Stopped:
            raise
        except Exception as e:
            name, s, e_ = job
            err = e
            if isinstance(e, PullError) and not str(e).startswith(name):  # which query failed
                err = PullError(f"{name} [{_iso(s)}, {_iso(e_)}): {e}")
            with lock:
                failures.append(err)
            client.stop.set()  # the other queries make no further attempt
            raise

    def fetch(job):
        name, s, e = job
        warnings: list[str] = []
        written = []  # (bytes, series, samples): a piece is written, then dropped
        queries = 0
        for piece in _pieces(client, server, name, s, e, warnings):
            queries += 1
            if not piece.series:
                continue
            with lock:
                path = staging / _unique(_name(piece), used)
            written.append(_write_piece(server, piece, path))
            del piece
        with lock:
            report.queries += queries
            report.warnings += warnings
            for size, series, points in written:
                report.bytes += size
                report.series += series
                report.samples += points
        return name

    _remove_stale_staging(folder)
    done = 0
    try:
        with _staging(folder, Path(raw_root)) as staging:
            with ThreadPoolExecutor(max_workers=max(1, server.concurrency)) as pool:
                for _ in pool.map(work, jobs):
                    done += 1
                    if progress and (done % max(1, len(jobs) // 10) == 0 or done == len(jobs)):
                        progress(f"{day}: {done}/{len(jobs)} queries, {report.samples:,} samples")
            report.files, report.written = _publish(staging, folder)
    except Exception:
        if failures:  # the first query that failed, not one it stopped
            raise failures[0] from None
        raise
    report.seconds = time.perf_counter() - t0
    return report


def days_between(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]
