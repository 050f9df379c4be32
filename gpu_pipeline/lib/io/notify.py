"""The daily digest: a day's recoverable waste, its top three actions with their dollars, the GPUs
that became persistent bottlenecks that day and the GPUs to drain, as one message to a webhook.

- `build_digest(lake, day, report, t)`: the figures, read from the day's marts with the report's
  own functions (`report.data.money` for the waste, `top_actions` for what to do first,
  `money_period` for how its dollars are stated): the digest and the report never disagree;
- `slack_payload(digest)`: Slack's incoming-webhook JSON, `text` (the one-line summary a
  notification shows) and `blocks` (header, the figures, the lists, the report's link), which
  Mattermost and Teams' Slack-compatible endpoints take too;
- `post(url, payload)`: one POST, retried with backoff on connection errors, connect timeouts,
  408, 425, 429 (its Retry-After honoured up to a cap) and 5xx; `NotifyError` when the hook
  stays down; `NoAnswer`, not retried, when the digest was sent whole and no answer came in time
  (a webhook's POST is not idempotent: it may have been delivered).

Labels from the data (namespace, host, GPU, action) are `clean`ed (no control, format — bidi —
or separator character: each shows as U+FFFD), escaped, then cut (`fit`); a section's text never
exceeds Slack's 3,000 characters (`_section`), whatever the labels.

A webhook's secret is its URL's path (Slack: `/services/T…/B…/XXXX`): nothing here says more of
the URL than `settings.url_origin` (scheme, host, port), neither in a message nor in an error
(`_scrub` hides each path segment, query value, user and password wherever they show), and
urllib3's own debug lines, which name the path, are dropped while a digest is posted.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from urllib.parse import unquote_plus, urlsplit

import polars as pl

from gpu_pipeline.lib.display import ACTIONS, NO_NAMESPACE, NO_PRICE, plural, unsafe, usd
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.report import data
from gpu_pipeline.lib.io.report.data import MONTHLY, Period
from gpu_pipeline.lib.rules import DEFAULT, Thresholds
from gpu_pipeline.settings import url_origin

# GPUs listed by name under each heading (the rest counted): a message stays readable, and far
# inside Slack's limits (3,000 characters a section, 50 blocks)
MAX_LISTED = 10
# a GPU instance (MIG) is its own row of persistent_bottlenecks
GPU_KEY = pl.format("{}/{}", "gpu_uuid", pl.col("gpu_instance_id").fill_null(-1))


@dataclass(frozen=True)
class Digest:
    """What the digest of `day` says, before it is worded.

    `cost_usd`, `waste_usd`: the day's cost and recoverable waste (priced_waste: idle, stall and
    headroom dollars; None when nothing was priced). `actions`: `top_actions` (namespace,
    action, monthly_usd), stated in `period`. `new_bottlenecks`: today's persistent bottlenecks
    that were not yesterday's (all of today's when the lake has no partition of yesterday:
    `compared` False); `bottlenecks`: how many today. `drain`: gpu_health's `drain` GPUs
    (double-bit ECC, failed row remap). `report`: the day's report, a URL or a path."""

    day: date
    report: str
    gpus: int = 0
    cost_usd: float | None = None
    waste_usd: float | None = None
    period: Period = MONTHLY
    actions: list[dict] = field(default_factory=list)
    bottlenecks: int = 0
    new_bottlenecks: list[dict] = field(default_factory=list)
    compared: bool = True
    drain: list[dict] = field(default_factory=list)

    def figures(self) -> dict:
        """The digest's numbers as plain values (the asset's metadata)."""
        return {
            "day": self.day.isoformat(),
            "gpus": self.gpus,
            "cost_usd": self.cost_usd,
            "waste_usd": self.waste_usd,
            "actions": self.actions,
            "persistent_bottlenecks": self.bottlenecks,
            "new_persistent_bottlenecks": [r["gpu_uuid"] for r in self.new_bottlenecks],
            "drain": [r["gpu_uuid"] for r in self.drain],
            "report": self.report,
        }


def new_persistent(today: pl.DataFrame, yesterday: pl.DataFrame | None) -> pl.DataFrame:
    """Today's persistent bottlenecks that were not the day before's (all of them when there is
    no day before to compare with), most days bottlenecked first."""
    if yesterday is not None:
        today = today.filter(~GPU_KEY.is_in(yesterday.select(GPU_KEY).to_series().implode()))
    return today.sort(
        ["days_bottlenecked", "bottleneck_share", "gpu_uuid"], descending=[True, True, False]
    )


def critical(health: pl.DataFrame | None) -> pl.DataFrame:
    """The GPUs gpu_health says to drain: their math cannot be trusted."""
    if health is None:
        return pl.DataFrame(schema={c: pl.String for c in ("gpu_uuid", "hostname", "reasons")})
    return health.filter(pl.col("status") == "drain").sort("gpu_uuid")


def build_digest(lake: Lake, day: date, report: str, t: Thresholds = DEFAULT) -> Digest:
    """The digest of `day`, read from the lake's marts (a table the lake lacks counts as empty)."""
    cost, waste = data.money(data.read(lake, "priced_waste", day))
    fleet = data.read(lake, "fleet_daily", day)
    rec = data.read_if(lake, "recommendations", day)
    top = data.top_actions(rec) if rec is not None else pl.DataFrame()
    before = day - timedelta(days=1)
    prior = (
        data.read(lake, "persistent_bottlenecks", before)
        if lake.exists("persistent_bottlenecks", before)
        else None
    )
    pb = data.read(lake, "persistent_bottlenecks", day)
    new = new_persistent(pb, prior)
    gpu = ["gpu_uuid", "hostname", "namespace", "days_bottlenecked", "window_days"]
    return Digest(
        day=day,
        report=report,
        gpus=int(fleet["gpus"][0]) if fleet.height else 0,
        cost_usd=cost,
        waste_usd=waste,
        period=data.money_period(fleet.row(0, named=True), t) if fleet.height else MONTHLY,
        actions=top.select("namespace", "action", "monthly_usd").to_dicts() if top.height else [],
        bottlenecks=pb.height,
        new_bottlenecks=new.select(gpu).to_dicts(),
        compared=prior is not None,
        drain=critical(data.read_if(lake, "gpu_health", day))
        .select("gpu_uuid", "hostname", "reasons")
        .to_dicts(),
    )


# --- the message ---------------------------------------------------------------------------------


# shown instead of each character a label must not carry (`display.unsafe`): visibly not part
# of a legitimate label
UNSAFE_MARK = "\N{REPLACEMENT CHARACTER}"
# Slack's limit of a section's text (and of a context element's): a longer one fails the message
# (invalid_blocks), every day, whatever else it says
SECTION_CHARS = 3000
_ENTITY = re.compile(r"&(?:amp|lt|gt);")


def clean(v: object) -> str:
    """`v` as text without a character a label must not carry (`display.unsafe`, a newline or a
    bidi control among them): each becomes UNSAFE_MARK."""
    return "".join(UNSAFE_MARK if unsafe(c) else c for c in str(v))


def _esc(v: object) -> str:
    """Text from the data inside Slack mrkdwn: `clean`, then `&`, `<` and `>` escaped (a
    namespace named `<!channel>` must not ping anyone)."""
    return clean(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fit(escaped: str, n: int) -> str:
    """An escaped text cut to at most `n` characters ("…" last when cut), never inside an
    entity (`&amp;`, `&lt;`, `&gt;`): the cut comes after escaping, so the limit holds for what
    is sent."""
    if len(escaped) <= n:
        return escaped
    cut = n - 1
    for m in _ENTITY.finditer(escaped, max(0, cut - 4), cut + 4):
        if m.start() < cut < m.end():
            cut = m.start()
    return escaped[:cut] + "…"


def _code(v: object, none: str = "(none)", n: int = 60) -> str:
    """A label from the data as inline code, at most `n` characters between its backticks."""
    text = fit(_esc(none if v is None else v).replace("`", "'"), n)
    return f"`{text}`"


def _name(action: str) -> str:
    """An action's words (ACTIONS), or its name from the data, escaped and cut."""
    return fit(_esc(ACTIONS.get(action, action)), 80)


def waste_line(d: Digest) -> str:
    """`$1,234.56 of $5,678.90 (21.7 %)` a day, or why there is no figure."""
    if d.cost_usd is None:
        return NO_PRICE if d.gpus else "no GPU data for the day"
    share = f" ({100 * (d.waste_usd or 0.0) / d.cost_usd:.1f} %)" if d.cost_usd else ""
    return f"{usd(d.waste_usd or 0.0)} of {usd(d.cost_usd)}{share}"


def action_lines(d: Digest) -> list[str]:
    """`1. Release idle GPUs (right_size) in ns: $1,234/month`, one per action."""
    return [
        f"{i}. {_name(a['action'])} ({_code(a['action'])}) in "
        f"{_code(a['namespace'], NO_NAMESPACE)}: {d.period.usd(a['monthly_usd'])}"
        for i, a in enumerate(d.actions, 1)
    ]


def _bottleneck(r: dict) -> str:
    return (
        f"{_code(r['gpu_uuid'])} on {_code(r['hostname'])} in "
        f"{_code(r['namespace'], NO_NAMESPACE)}: {r['days_bottlenecked']} of "
        f"{r['window_days']} days"
    )


def _drain(r: dict) -> str:
    reasons = fit(_esc("(none)" if r["reasons"] is None else r["reasons"]), 120)
    return f"{_code(r['gpu_uuid'])} on {_code(r['hostname'])}: {reasons}"


def _listed(title: str, rows: list[dict], line: Callable[[dict], str]) -> dict:
    """A section listing MAX_LISTED of `rows`, then how many more."""
    return _section(title, [f"• {line(r)}" for r in rows[:MAX_LISTED]], len(rows[MAX_LISTED:]))


def report_link(report: str) -> str:
    """A URL as a link named after its file, a path as code."""
    plain = clean(report) == report and len(report) <= 1000
    if plain and re.match(r"https?://", report) and not re.search(r"[\s<>|]", report):
        return f"<{report}|{fit(_esc(report.rsplit('/', 1)[-1]), 200)}>"
    return _code(report, n=400)


def summary(d: Digest) -> str:
    """The one-line `text`: what a notification shows, and what a client without blocks shows."""
    top = (
        f"top action: {_name(d.actions[0]['action'])} {d.period.usd(d.actions[0]['monthly_usd'])}"
        if d.actions
        else "no action to recover it"
    )
    waste = waste_line(d) + (" recoverable" if d.cost_usd is not None else "")
    return (
        f"GPU waste {d.day}: {waste}; {top}; "
        f"{plural(len(d.new_bottlenecks), 'new persistent bottleneck')}; "
        f"{plural(len(d.drain), 'GPU')} to drain"
    )


def slack_payload(d: Digest) -> dict:
    """Slack's incoming-webhook JSON: `text` (`summary`) and `blocks`."""
    new = f"{plural(len(d.new_bottlenecks), 'GPU')}, of {d.bottlenecks:,} today" + (
        "" if d.compared else " (the lake has no day before to compare with)"
    )
    fields = [
        ("Recoverable waste / day", waste_line(d)),
        ("GPUs", f"{d.gpus:,}"),
        ("New persistent bottlenecks", new),
        ("Critical health (drain)", plural(len(d.drain), "GPU")),
    ]
    blocks: list[dict] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"GPU waste digest — {d.day}"}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in fields],
        },
        _section(f"*Top actions* ({d.period.unit})", action_lines(d) or ["none"]),
    ]
    if d.new_bottlenecks:
        blocks.append(_listed("*New persistent bottlenecks*", d.new_bottlenecks, _bottleneck))
    if d.drain:
        blocks.append(_listed("*Drain: double-bit ECC or row remap*", d.drain, _drain))
    context = [f"Report: {report_link(d.report)}"]
    if d.period.caveat:
        context.append(_esc(d.period.note))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": c} for c in context]})
    return {"text": summary(d), "blocks": blocks}


def width(text: str) -> int:
    """A text's length as Slack may count it: UTF-16 code units (an emoji counts two)."""
    return len(text.encode("utf-16-le")) // 2


def _section(title: str, lines: list[str], more: int = 0) -> dict:
    """A section: `title`, `lines`, then `… and N more` for the `more` items not listed. Its
    text never exceeds SECTION_CHARS: the last lines that would take it past are counted among
    the ones not listed (the lines are built short: labels `fit` after escaping)."""
    kept = list(lines)
    while True:
        n = more + len(lines) - len(kept)
        tail = [f"… and {n:,} more (see the report)"] if n else []
        text = "\n".join([title, *kept, *tail])
        if width(text) <= SECTION_CHARS or not kept:
            return {"type": "section", "text": {"type": "mrkdwn", "text": text}}
        kept.pop()


# --- delivery ------------------------------------------------------------------------------------


class NotifyError(Exception):
    """The hook did not take the digest: one line, naming the hook by `url_origin` only."""


class NoAnswer(NotifyError):
    """The digest was sent whole but the hook did not answer within the read timeout: it may
    have been delivered. Not retried (a webhook's POST is not idempotent: a slow hook would
    post it again each attempt); the caller decides what an unconfirmed digest is."""


@dataclass(frozen=True)
class Delivery:
    """How a digest is posted: `attempts` in all, waiting `backoff_s[i]` before attempt i+2
    (or what a 429's Retry-After asks, up to `max_retry_after_s`; asked for more, it gives up),
    each attempt bounded by `timeout_s` (connect, read)."""

    attempts: int = 4
    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0)
    timeout_s: tuple[float, float] = (5.0, 10.0)
    max_retry_after_s: float = 30.0


RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# a part of the URL this long or longer is hidden wherever it shows (a path segment, a query
# value, the user, the password, the fragment); and so is a word of a message this long or
# longer that is part of one of them (a server that echoes a token's first characters)
SECRET_MIN = 4
ECHO_MIN = 6
# what is shown of an error answer's body, once scrubbed
BODY_CHARS = 120


def url_secrets(url: str) -> list[str]:
    """The parts of `url` that may be secret, as written and percent-decoded, longest first:
    the URL, its path, each path segment, its query and each query value, its user, password
    and fragment (the scheme, host and port, which `url_origin` shows, are not)."""
    p = urlsplit(url)
    parts = [url, p.path, p.query, p.fragment, *p.path.split("/")]
    parts += [pair.partition("=")[2] for pair in re.split(r"[&;]", p.query)]
    parts = [x for x in parts if len(x.strip("/")) >= SECRET_MIN]
    parts += [x for x in (p.username, p.password) if x and len(x) > 1]  # as short as they come
    parts += [unquote_plus(x) for x in parts]
    return sorted({x for x in parts if len(x.strip("/")) > 1}, key=len, reverse=True)


def _scrub(text: str, url: str, n: int = 200) -> str:
    """`text` (an exception's, a response body's) on one line, at most `n` characters, without
    any secret part of `url` (`url_secrets`), nor a word of ECHO_MIN characters or more that is
    part of one of them. Scrubbed whole, then cut: a secret across the cut does not leave a
    piece of itself behind."""
    secrets = url_secrets(url)
    for s in secrets:
        text = text.replace(s, "<hidden>")
    parts = [s for s in secrets if s not in (url, unquote_plus(url))]  # not the host

    def echo(m: re.Match) -> str:
        return "<hidden>" if any(m[0] in s for s in parts) else m[0]

    text = re.sub(rf"[\w.~%+-]{{{ECHO_MIN},}}", echo, clean(" ".join(text.split())))
    return text if len(text) <= n else text[: n - 1] + "…"


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (the HTTP-date form is not used by webhooks: None)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


@contextmanager
def _no_url_logs(url: str) -> Iterator[None]:
    """urllib3 logs each request's path at DEBUG (`"POST /services/T…/B…/XXXX HTTP/1.1" 200`):
    such lines, and any naming a secret part of the URL, are dropped while the digest is posted,
    whatever a deployment's python_logs capture (other lines, other requests' lines, pass)."""
    secrets = url_secrets(url)
    log = logging.getLogger("urllib3.connectionpool")

    def no_path(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(s in message for s in secrets)

    log.addFilter(no_path)
    try:
        yield
    finally:
        log.removeFilter(no_path)


@dataclass(frozen=True)
class Answer:
    """One attempt: the HTTP `status` (None: no answer), its Retry-After, why it failed ("":
    it did not) and whether the digest was sent whole without an answer in time (`sent`)."""

    status: int | None = None
    retry_after: str | None = None
    why: str = ""
    sent: bool = False


def _read_timeout(e: Exception) -> bool:
    """A timeout after the request was sent whole: waiting for the answer (requests'
    ReadTimeout), or reading its body (a ConnectionError around urllib3's ReadTimeoutError).
    A connect timeout, or one while sending, is not: nothing reached the hook's handler."""
    import requests
    from urllib3.exceptions import ReadTimeoutError

    if isinstance(e, requests.ConnectTimeout):
        return False
    return isinstance(e, requests.ReadTimeout) or any(
        isinstance(a, ReadTimeoutError) for a in e.args
    )


def _attempt(session, url: str, payload: dict, timeout: tuple[float, float]) -> Answer:
    """One POST; never raises (an exception's text names the URL: it is scrubbed here, and no
    exception leaves with it as its cause)."""
    import requests

    try:
        r = session.post(url, json=payload, timeout=timeout, allow_redirects=False)
    except requests.RequestException as e:
        if _read_timeout(e):
            return Answer(why=f"no answer within {timeout[1]:g} s", sent=True)
        if isinstance(e, requests.Timeout):
            return Answer(why=f"could not connect within {timeout[0]:g} s")
        errno = re.search(r"\[Errno -?\d+\][^'\")]*", str(e))
        return Answer(why=_scrub(f"{type(e).__name__}: {errno[0] if errno else ''}", url))
    if 200 <= r.status_code < 300:
        return Answer(r.status_code)
    body = _scrub(r.text[:65536], url, BODY_CHARS)
    why = f"HTTP {r.status_code}" + (f": {body}" if body else "")
    if 300 <= r.status_code < 400:
        why += " (a redirect: the webhook URL moved?)"
    return Answer(r.status_code, r.headers.get("Retry-After"), why)


def post(
    url: str,
    payload: dict,
    how: Delivery = Delivery(),
    log: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """POST `payload` as JSON to the webhook `url`; the attempts it took. Retries what may pass
    later (RETRY_STATUS, connection errors and connect timeouts); NotifyError on anything else or
    when the attempts run out; NoAnswer when the digest was sent whole and no answer came in
    time (not retried: it may have been delivered). `log` hears each failed attempt,
    `url_origin` naming the hook."""
    import requests

    where = url_origin(url)
    session = requests.Session()
    why = ""
    with _no_url_logs(url), session:
        for attempt in range(1, how.attempts + 1):
            a = _attempt(session, url, payload, how.timeout_s)
            why = a.why
            if not why:
                return attempt
            if a.sent:
                raise NoAnswer(
                    f"the webhook {where} did not answer within {how.timeout_s[1]:g} s after the "
                    f"digest was sent (attempt {attempt}): it may have been delivered; not sent "
                    "again (a webhook post is not idempotent)"
                )
            retry = a.status is None or a.status in RETRY_STATUS
            if not retry or attempt == how.attempts:
                break
            wait = how.backoff_s[min(attempt, len(how.backoff_s)) - 1]
            asked = _retry_after(a.retry_after) if a.status == 429 else None
            if asked is not None and asked > how.max_retry_after_s:
                why += f" (asked to wait {asked:g} s, more than {how.max_retry_after_s:g})"
                break
            wait = max(wait, asked or 0.0)
            log(f"{where}: attempt {attempt} of {how.attempts}: {why}; again in {wait:g} s")
            sleep(wait)
    raise NotifyError(
        f"the webhook {where} did not take the digest after {attempt} attempt(s): {why}"
    )
