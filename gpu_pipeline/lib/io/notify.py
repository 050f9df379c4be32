"""The daily digest: a day's recoverable waste, its top three actions with their dollars, the GPUs
that became persistent bottlenecks that day and the GPUs to drain, as one message to a webhook.

- `build_digest(lake, day, report, t)`: the figures, read from the day's marts with the report's
  own functions (`report.data.money` for the waste, `top_actions` for what to do first,
  `money_period` for how its dollars are stated): the digest and the report never disagree;
- `slack_payload(digest)`: Slack's incoming-webhook JSON, `text` (the one-line summary a
  notification shows) and `blocks` (header, the figures, the lists, the report's link), which
  Mattermost and Teams' Slack-compatible endpoints take too;
- `post(url, payload)`: one POST, retried with backoff on timeouts, connection errors, 408, 425,
  429 (its Retry-After honoured up to a cap) and 5xx; `NotifyError` when the hook stays down.

A webhook's secret is its URL's path (Slack: `/services/T…/B…/XXXX`): nothing here says more of
the URL than `settings.url_origin` (scheme, host, port), neither in a message nor in an error,
and urllib3's own debug lines, which name the path, are dropped while a digest is posted.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from urllib.parse import urlsplit

import polars as pl

from gpu_pipeline.lib.display import ACTIONS, NO_NAMESPACE, NO_PRICE, plural, usd
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.report import data
from gpu_pipeline.lib.io.report.data import MONTHLY, Period, label
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


def _esc(v: object) -> str:
    """Text from the data inside Slack mrkdwn: `&`, `<` and `>` escaped (a namespace named
    `<!channel>` must not ping anyone)."""
    return str(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(v: object, none: str = "(none)", n: int = 60) -> str:
    text = _esc(label(v, n, none)).replace("`", "'")
    return f"`{text}`"


def waste_line(d: Digest) -> str:
    """`$1,234.56 of $5,678.90 (21.7 %)` a day, or why there is no figure."""
    if d.cost_usd is None:
        return NO_PRICE if d.gpus else "no GPU data for the day"
    share = f" ({100 * (d.waste_usd or 0.0) / d.cost_usd:.1f} %)" if d.cost_usd else ""
    return f"{usd(d.waste_usd or 0.0)} of {usd(d.cost_usd)}{share}"


def action_lines(d: Digest) -> list[str]:
    """`1. Release idle GPUs (right_size) in ns: $1,234/month`, one per action."""
    return [
        f"{i}. {_esc(ACTIONS.get(a['action'], a['action']))} ({_code(a['action'])}) in "
        f"{_code(a['namespace'], NO_NAMESPACE)}: {d.period.usd(a['monthly_usd'])}"
        for i, a in enumerate(d.actions, 1)
    ]


def _listed(rows: list[dict], line: Callable[[dict], str]) -> str:
    out = [f"• {line(r)}" for r in rows[:MAX_LISTED]]
    if len(rows) > MAX_LISTED:
        out.append(f"… and {len(rows) - MAX_LISTED:,} more (see the report)")
    return "\n".join(out)


def _bottleneck(r: dict) -> str:
    return (
        f"{_code(r['gpu_uuid'])} on {_code(r['hostname'])} in "
        f"{_code(r['namespace'], NO_NAMESPACE)}: {r['days_bottlenecked']} of "
        f"{r['window_days']} days"
    )


def _drain(r: dict) -> str:
    return f"{_code(r['gpu_uuid'])} on {_code(r['hostname'])}: {_esc(label(r['reasons'], 120))}"


def report_link(report: str) -> str:
    """A URL as a link named after its file, a path as code."""
    if re.match(r"https?://", report) and not re.search(r"[\s<>|]", report):
        return f"<{report}|{_esc(report.rsplit('/', 1)[-1])}>"
    return _code(report, n=400)


def summary(d: Digest) -> str:
    """The one-line `text`: what a notification shows, and what a client without blocks shows."""
    top = (
        f"top action: {_esc(ACTIONS.get(d.actions[0]['action'], d.actions[0]['action']))} "
        f"{d.period.usd(d.actions[0]['monthly_usd'])}"
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
        blocks.append(
            _section("*New persistent bottlenecks*", [_listed(d.new_bottlenecks, _bottleneck)])
        )
    if d.drain:
        blocks.append(_section("*Drain: double-bit ECC or row remap*", [_listed(d.drain, _drain)]))
    context = [f"Report: {report_link(d.report)}"]
    if d.period.caveat:
        context.append(_esc(d.period.note))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": c} for c in context]})
    return {"text": summary(d), "blocks": blocks}


def _section(title: str, lines: list[str]) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join([title, *lines])}}


# --- delivery ------------------------------------------------------------------------------------


class NotifyError(Exception):
    """The hook did not take the digest: one line, naming the hook by `url_origin` only."""


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


def _scrub(text: str, url: str) -> str:
    """`text` (an exception's, a response body's) on one line, without any secret part of
    `url`: the URL itself, its path, query, user and password."""
    p = urlsplit(url)
    secrets = [url, p.path + (f"?{p.query}" if p.query else ""), p.path, p.query]
    secrets += [p.username or "", p.password or ""]
    for s in sorted({s for s in secrets if len(s.strip("/")) > 1}, key=len, reverse=True):
        text = text.replace(s, "<hidden>")
    return " ".join(text.split())[:200]


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (the HTTP-date form is not used by webhooks: None)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


@contextmanager
def _no_url_logs(url: str) -> Iterator[None]:
    """urllib3 logs each request's path at DEBUG (`"POST /services/T…/B…/XXXX HTTP/1.1" 200`):
    such lines are dropped while the digest is posted, whatever a deployment's python_logs
    capture (other lines, and other requests' lines, pass)."""
    p = urlsplit(url)
    secret = p.path.strip("/")
    log = logging.getLogger("urllib3.connectionpool")

    def no_path(record: logging.LogRecord) -> bool:
        return not secret or secret not in record.getMessage()

    log.addFilter(no_path)
    try:
        yield
    finally:
        log.removeFilter(no_path)


def _attempt(session, url: str, payload: dict, timeout: tuple[float, float]) -> tuple:
    """One POST: (status, Retry-After, why it failed or ""); never raises (an exception's text
    names the URL: it is scrubbed here, and no exception leaves with it as its cause)."""
    import requests

    try:
        r = session.post(url, json=payload, timeout=timeout, allow_redirects=False)
    except requests.Timeout:
        return None, None, f"no answer within {timeout[1]:g} s"
    except requests.RequestException as e:
        errno = re.search(r"\[Errno -?\d+\][^'\")]*", str(e))
        return None, None, _scrub(f"{type(e).__name__}: {errno[0] if errno else ''}", url)
    if 200 <= r.status_code < 300:
        return r.status_code, None, ""
    body = _scrub(r.text[:300], url)
    why = f"HTTP {r.status_code}" + (f": {body}" if body else "")
    if 300 <= r.status_code < 400:
        why += " (a redirect: the webhook URL moved?)"
    return r.status_code, r.headers.get("Retry-After"), why


def post(
    url: str,
    payload: dict,
    how: Delivery = Delivery(),
    log: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """POST `payload` as JSON to the webhook `url`; the attempts it took. Retries what may pass
    later (RETRY_STATUS, timeouts, connection errors); NotifyError on anything else or when the
    attempts run out. `log` hears each failed attempt, `url_origin` naming the hook."""
    import requests

    where = url_origin(url)
    session = requests.Session()
    why = ""
    with _no_url_logs(url), session:
        for attempt in range(1, how.attempts + 1):
            status, after, why = _attempt(session, url, payload, how.timeout_s)
            if not why:
                return attempt
            retry = status is None or status in RETRY_STATUS
            if not retry or attempt == how.attempts:
                break
            wait = how.backoff_s[min(attempt, len(how.backoff_s)) - 1]
            asked = _retry_after(after) if status == 429 else None
            if asked is not None and asked > how.max_retry_after_s:
                why += f" (asked to wait {asked:g} s, more than {how.max_retry_after_s:g})"
                break
            wait = max(wait, asked or 0.0)
            log(f"{where}: attempt {attempt} of {how.attempts}: {why}; again in {wait:g} s")
            sleep(wait)
    raise NotifyError(
        f"the webhook {where} did not take the digest after {attempt} attempt(s): {why}"
    )
