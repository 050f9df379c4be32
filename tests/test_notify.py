"""The daily digest (issue 33, notifications): posted to a webhook on loopback that records what it
received. The posted figures equal the marts'; a backfill of past days posts nothing; a hook that
stays down fails the digest alone, every mart written; the webhook's secret (its path) is never in
an error, a log line, the CLI's output or the run's event log."""

import json
import logging
import re
import shutil
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import polars as pl
import pytest
from dagster._serdes import serialize_value  # private: the snapshot as stored
from helpers import MODELS, cli, cli_env, expo_lines, ms, write_file

from gpu_pipeline import settings
from gpu_pipeline.defs import notify as notify_defs
from gpu_pipeline.defs.notify import NotifyResource, daily_digest, why_not
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.io.notify import (
    Delivery,
    Digest,
    NoAnswer,
    NotifyError,
    build_digest,
    post,
    slack_payload,
)
from gpu_pipeline.lib.schemas import TABLES
from gpu_pipeline.settings import CHECKS, Settings, SettingsError, url_origin

SECRET = "/services/T0SECRET1/B0SECRET2/xXs3cr3tT0k3nXx"
LAST = settings.last_day()  # set again as the module's tests start (`_days`)
DAYS = [LAST - timedelta(days=3 - i) for i in range(4)]


@pytest.fixture(scope="module", autouse=True)
def _days():
    """The schedule's day when this module's tests run, not when the suite was collected (a
    suite that runs over UTC midnight): the module takes about a minute."""
    global LAST, DAYS
    LAST = settings.last_day()
    DAYS = [LAST - timedelta(days=3 - i) for i in range(4)]


FAST = Delivery(attempts=4, backoff_s=(1.0, 2.0, 4.0), timeout_s=(2.0, 5.0))


class Hook:
    """A webhook on 127.0.0.1: records each POST (path, content type, JSON) and answers from
    `answers` (status, headers, body) in turn, then `default` (after `delay` seconds). An error
    body echoes the request's path, as some servers do: the error the pipeline reports must not."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.received: list[tuple[str, str, dict]] = []
        self.answers: list[tuple[int, dict, str]] = []
        self.default = (200, {}, "ok")
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.received.append(
                    (self.path, self.headers.get("Content-Type", ""), json.loads(body))
                )
                if hook.answers:
                    status, headers, text = hook.answers.pop(0)
                else:
                    (status, headers, text), _ = hook.default, time.sleep(hook.delay)
                data = (text if status < 400 else f"{text} at {self.path}").encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server.socket.fileno() != -1:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.stop()


def _no_secret(text: str) -> None:
    for part in SECRET.strip("/").split("/")[1:]:
        assert part not in text, text[-3000:]


# --- delivery ------------------------------------------------------------------------------------


def test_post_retries_with_backoff_then_succeeds(hook):
    hook.answers = [(500, {}, "boom"), (503, {}, "busy")]
    waits: list[float] = []
    assert post(hook.url, {"text": "hi"}, FAST, sleep=waits.append) == 3
    assert waits == [1.0, 2.0]
    assert [(p, t) for p, t, _ in hook.received] == [(SECRET, "application/json")] * 3
    assert all(body == {"text": "hi"} for _, _, body in hook.received)


def test_post_honours_retry_after_within_a_cap(hook):
    hook.answers = [(429, {"Retry-After": "3"}, "slow down")]
    waits: list[float] = []
    said: list[str] = []
    assert post(hook.url, {"text": "hi"}, FAST, log=said.append, sleep=waits.append) == 2
    assert waits == [3.0] and len(said) == 1
    _no_secret(said[0])
    # asked to wait longer than the cap: it gives up at once, saying so
    hook.answers = [(429, {"Retry-After": "120"}, "later")]
    with pytest.raises(NotifyError) as e:
        post(hook.url, {"text": "hi"}, FAST, sleep=waits.append)
    assert "asked to wait 120 s, more than 30" in str(e.value) and len(hook.received) == 3


def test_a_hook_that_stays_down_is_one_line_without_the_secret(hook):
    """Every attempt fails (the body echoes the path): NotifyError after 4 attempts, one line
    naming the hook by scheme and host; no log record of any logger holds the path (urllib3's
    DEBUG lines name it)."""
    hook.default = (500, {}, "internal error")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    root, keep = logging.getLogger(), Keep(logging.DEBUG)
    level = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    waits: list[float] = []
    try:
        with pytest.raises(NotifyError) as e:
            post(hook.url, {"text": "hi"}, FAST, sleep=waits.append)
    finally:
        root.removeHandler(keep)
        root.setLevel(level)
    msg = str(e.value)
    assert "\n" not in msg and len(hook.received) == 4 and waits == [1.0, 2.0, 4.0]
    origin = hook.url.removesuffix(SECRET)
    assert msg.startswith(f"the webhook {origin}/<hidden> did not take the digest after 4 ")
    assert "HTTP 500: internal error at <hidden>" in msg
    _no_secret(msg)
    _no_secret("\n".join(records))
    assert e.value.__cause__ is None and e.value.__context__ is None


def test_a_refused_connection_and_a_client_error(hook):
    """A 404 (a deleted webhook) is not retried; a closed port is, and neither error names the
    path."""
    hook.default = (404, {}, "no_service")
    with pytest.raises(NotifyError) as e:
        post(hook.url, {"text": "hi"}, FAST, sleep=lambda _: None)
    assert len(hook.received) == 1 and "HTTP 404: no_service at <hidden>" in str(e.value)
    closed = hook.url
    hook.stop()
    with pytest.raises(NotifyError) as e:
        post(closed, {"text": "hi"}, FAST, sleep=lambda _: None)
    assert "after 4 attempt(s): ConnectionError" in str(e.value), str(e.value)
    _no_secret(str(e.value))


def test_an_error_body_that_echoes_parts_of_the_url_shows_none_of_them(hook):
    """A 404 whose body echoes a path segment, the query's value, the user, and a token cut
    short (`XXXXSEC`), after enough text that the old 300-character cut fell inside a secret:
    the failure shows the status and a short excerpt, none of them."""
    port = hook.server.server_address[1]
    url = f"http://alice:pw@127.0.0.1:{port}/services/TSECRET/BSECRET/XXXXSECRET?token=QSECRET"
    hook.default = (404, {}, "no_service XXXXSECRET token QSECRET user alice, seen XXXXSEC")
    with pytest.raises(NotifyError) as e:
        post(url, {"text": "hi"}, FAST, sleep=lambda _: None)
    msg = str(e.value)
    assert msg.startswith(f"the webhook http://127.0.0.1:{port}/<hidden> did not take the digest")
    assert "HTTP 404: no_service <hidden> token <hidden> user <hidden>" in msg, msg
    for secret in ("TSECRET", "BSECRET", "XXXXSEC", "QSECRET", "alice"):
        assert secret not in msg, msg
    hook.default = (500, {}, "x" * 293 + " XXXXSECRET and more")  # across the old cut
    with pytest.raises(NotifyError) as e:
        post(url, {"text": "hi"}, Delivery(attempts=1), sleep=lambda _: None)
    assert "XXXXSEC" not in str(e.value) and len(str(e.value)) < 300, str(e.value)


def test_a_slow_hook_gets_the_digest_once(hook):
    """A hook that takes the digest and answers after the read timeout: it may have been
    delivered, so it is not sent again; one line says so. Connect errors and 5xx are still
    retried (test_post_retries_with_backoff_then_succeeds, test_a_refused_connection...)."""
    hook.delay = 1.5
    waits: list[float] = []
    with pytest.raises(NoAnswer) as e:
        post(hook.url, {"text": "hi"}, Delivery(timeout_s=(2.0, 0.5)), sleep=waits.append)
    assert len(hook.received) == 1 and waits == []
    origin = hook.url.removesuffix(SECRET)
    assert str(e.value) == (
        f"the webhook {origin}/<hidden> did not answer within 0.5 s after the digest was sent "
        "(attempt 1): it may have been delivered; not sent again (a webhook post is not "
        "idempotent)"
    )
    # a 503 first, then the slow answer: two posts, the second not repeated
    hook.answers = [(503, {}, "busy")]
    with pytest.raises(NoAnswer) as e:
        post(hook.url, {"text": "hi"}, Delivery(timeout_s=(2.0, 0.5)), sleep=waits.append)
    assert len(hook.received) == 3 and waits == [1.0] and "(attempt 2)" in str(e.value)


def test_the_webhook_variable_never_shows_its_path():
    assert url_origin("https://hooks.slack.com" + SECRET) == "https://hooks.slack.com/<hidden>"
    assert url_origin("https://u:pw@chat.example:8443/hooks/abc?x=1") == (
        "https://chat.example:8443/<hidden>"
    )
    assert url_origin("hooks.slack.com" + SECRET) == "<hidden>"
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"GPU_PIPELINE_NOTIFY_URL": "ftp://hooks.slack.com" + SECRET})
    assert e.value.lines == [
        "GPU_PIPELINE_NOTIFY_URL='ftp://hooks.slack.com/<hidden>': not an http(s) URL with a host "
        f"(allowed: {CHECKS['GPU_PIPELINE_NOTIFY_URL'].allowed})"
    ]
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"GPU_PIPELINE_REPORT_BASE_URL": "https://reports.example/r?sig=1"})
    assert "has a ?query or #fragment" in str(e.value)


def test_the_message_escapes_labels_from_the_data():
    d = Digest(
        day=LAST,
        report="s3://bucket/lake/_reports/gpu_report.html",
        gpus=2,
        cost_usd=10.0,
        waste_usd=4.0,
        actions=[{"namespace": "<!channel>", "action": "right_size", "monthly_usd": 90.0}],
    )
    p = slack_payload(d)
    text = json.dumps(p)
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert p["text"].startswith(f"GPU waste {LAST}: $4.00 of $10.00 (40.0 %) recoverable")
    assert p["blocks"][-1]["elements"][0]["text"] == (
        "Report: `s3://bucket/lake/_reports/gpu_report.html`"
    )


@pytest.mark.parametrize(
    ("notify", "tags", "days_ago", "before", "posts"),  # days before the schedule's day
    [
        (None, {}, 0, None, True),  # the CLI or the UI, yesterday
        (None, {"dagster/schedule_name": "daily_pipeline_schedule"}, 2, None, 1),
        (None, {"dagster/backfill": "abc"}, 0, None, False),  # a backfill's run
        (None, {}, 1, None, False),  # a past day
        (None, {}, 0, "run12345", False),  # posted already
        (True, {"dagster/backfill": "abc"}, 9, "run12345", True),
        (False, {"dagster/schedule_name": "s"}, 0, None, False),
    ],
)
def test_which_runs_post(notify, tags, days_ago, before, posts):
    day = settings.last_day() - timedelta(days=days_ago)
    why = why_not(notify, "http://hook.example/x", tags, day, before)
    assert (why is None) == bool(posts), why
    assert why_not(True, "", {}, LAST, None) == "GPU_PIPELINE_NOTIFY_URL is unset"


# --- the demo-like fleet through the CLI ---------------------------------------------------------


def _plant(raw, i: int, day) -> None:
    """GPU-OLD: bottlenecked (util 85 at 100 W on an A100) all four days, a persistent
    bottleneck from the third; GPU-NEW: from the second day, a new one on the last; GPU-BAD:
    two double-bit ECC errors on the last day (drain)."""
    m = range(600, 720)
    lines = expo_lines("GPU-OLD", MODELS["A100"], "p1", "starved", day, m, 85, 100.0, gpu=0)
    power = 100.0 if i >= 1 else 320.0
    lines += expo_lines("GPU-NEW", MODELS["A100"], "p1", "net", day, m, 85, power, gpu=1)
    lines += expo_lines("GPU-BAD", MODELS["A100"], "p1", "good", day, m, 95, 320.0, gpu=2)
    if i == 3:
        labels = (
            '{gpu="2",UUID="GPU-BAD",device="nvidia2",modelName="'
            + MODELS["A100"]
            + '",Hostname="p1",namespace="good",pod="good-pod-2"}'
        )
        lines += [f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{labels} 2 {ms(day, k)}" for k in m]
    write_file(raw / "cluster-p" / f"p1_{day.isoformat()}.prom", lines)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A generated fleet (6 GPUs) over the four days ending yesterday, the planted GPUs beside
    it, materialized as `make demo` does it with the webhook set."""
    tmp = tmp_path_factory.mktemp("notify")
    env = cli_env(tmp)
    cli("generate", "--start", str(DAYS[0]), "--days", "4", "--gpus", "6", "--clusters", "1",
        "--out", str(tmp / "raw"), env=env)  # fmt: skip
    for i, d in enumerate(DAYS):
        _plant(tmp / "raw", i, d)
    hook = Hook()
    env |= {
        "GPU_PIPELINE_NOTIFY_URL": hook.url,
        "GPU_PIPELINE_REPORT_BASE_URL": "https://reports.example/gpu/",
    }
    out = cli("materialize", "--start", str(DAYS[0]), "--end", str(LAST), "--raw",
              str(tmp / "raw"), "--lake", str(tmp / "lake"), env=env)  # fmt: skip
    yield tmp, env, hook, out
    hook.stop()


def _fields(payload: dict) -> dict[str, str]:
    section = next(b for b in payload["blocks"] if b["type"] == "section" and "fields" in b)
    return dict(f["text"].lstrip("*").split("*\n", 1) for f in section["fields"])


def _lake_file(tmp, table: str, day) -> pl.DataFrame:
    return pl.read_parquet(tmp / "lake" / table / f"date={day.isoformat()}" / "data.parquet")


def test_the_run_posts_one_digest_whose_figures_are_the_marts(fleet):
    tmp, _, hook, out = fleet
    assert len(hook.received) == 1, out.stdout
    path, kind, payload = hook.received[0]
    assert (path, kind) == (SECRET, "application/json")
    assert set(payload) == {"text", "blocks"}
    assert payload["blocks"][0]["text"]["text"] == f"GPU waste digest — {LAST}"
    f = _fields(payload)
    waste = _lake_file(tmp, "priced_waste", LAST)
    cost, wasted = waste["cost_usd"].sum(), waste["total_waste_usd"].sum()
    assert wasted > 0
    assert f["Recoverable waste / day"] == (
        f"${wasted:,.2f} of ${cost:,.2f} ({100 * wasted / cost:.1f} %)"
    )
    assert f["GPUs"] == str(_lake_file(tmp, "fleet_daily", LAST)["gpus"][0])
    # persistence: today's against yesterday's, by hand
    today = set(_lake_file(tmp, "persistent_bottlenecks", LAST)["gpu_uuid"])
    before = set(_lake_file(tmp, "persistent_bottlenecks", DAYS[2])["gpu_uuid"])
    new = today - before
    assert "GPU-new" in new and "GPU-old" in today - new
    assert f["New persistent bottlenecks"] == (
        f"{len(new)} GPU{'s' * (len(new) != 1)}, of {len(today)} today"
    )
    text = json.dumps(payload)
    assert all(f"`{g}`" in text for g in new) and "`GPU-old`" not in text
    health = _lake_file(tmp, "gpu_health", LAST)
    assert health.filter(pl.col("status") == "drain")["gpu_uuid"].to_list() == ["GPU-bad"]
    (reasons,) = health.filter(pl.col("status") == "drain")["reasons"]
    assert f["Critical health (drain)"] == "1 GPU" and f": {reasons}" in text
    assert payload["blocks"][-1]["elements"][0]["text"] == (
        f"Report: <https://reports.example/gpu/gpu_report_{LAST}.html|gpu_report_{LAST}.html>"
    )
    _the_actions_are_the_recommendations(tmp, payload)


def _the_actions_are_the_recommendations(tmp, payload: dict) -> None:
    """Each action's dollars: its fraction of the namespace's monthly cost, capped by the waste
    measured there (recommendations), as the report's "What to do first" prints them."""
    (block,) = [b for b in payload["blocks"] if b.get("text", {}).get("text", "").startswith(
        "*Top actions*")]  # fmt: skip
    lines = block["text"]["text"].splitlines()[1:]
    assert 1 <= len(lines) <= 3
    rec = {r["namespace"]: r for r in _lake_file(tmp, "recommendations", LAST).to_dicts()}
    html = (tmp / "lake" / "_reports" / f"gpu_report_{LAST}.html").read_text()
    for i, line in enumerate(lines, 1):
        m = re.fullmatch(rf"{i}\. .+ \(`(\S+)`\) in `(\S+)`: \$([\d,]+)/month", line)
        assert m, line
        action, ns, dollars = m[1], m[2], int(m[3].replace(",", ""))
        r = rec[ns]
        (detail,) = [a for a in r["action_details"] if a["action"] == action]
        expected = min(detail["fraction"], r["measured_waste_frac"]) * r["monthly_cost_usd"]
        assert dollars == round(expected), (line, expected)
        assert f"${dollars:,}/month" in html


def test_the_secret_is_in_no_output_and_no_event(fleet):
    tmp, _, _, out = fleet
    assert " ok " in out.stdout
    _no_secret(out.stdout + out.stderr)
    with dg.DagsterInstance.from_config(str(tmp / "dh")) as instance:
        (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="daily_pipeline"))
        logs = instance.all_logs(run.run_id)
        assert any("digest posted to http://127.0.0.1" in (e.user_message or "") for e in logs)
        _no_secret("\n".join(str(e) for e in logs) + str(run))
        # the job's snapshot (what the UI shows of the resource): the variable, not its value
        snap = serialize_value(instance.get_job_snapshot(run.job_snapshot_id))
        assert "GPU_PIPELINE_NOTIFY_URL" in snap
        _no_secret(snap)
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("daily_digest"), asset_partitions=[str(LAST)]),
            limit=1,
        ).records  # fmt: skip
        meta = record.asset_materialization.metadata
        assert meta["posted"].value is True and meta["attempts"].value == 1
        assert meta["digest"].value["drain"] == ["GPU-bad"]


def _digest_alone(tmp, hook, day, tags=None, notify=None, url=None, lake=None):
    """`daily_digest` of `day` alone, on the fleet's lake (or `lake`) and instance."""
    with dg.DagsterInstance.from_config(str(tmp / "dh")) as instance:
        res = dg.materialize(
            [daily_digest],
            partition_key=day.isoformat(),
            resources={
                "lake": LakeResource(root=str(lake or tmp / "lake")),
                "reference": ReferenceResource(),
                "notify": NotifyResource(url=hook.url if url is None else url),
            },
            run_config={"ops": {"daily_digest": {"config": {"notify": notify}}}},
            instance=instance,
            tags=tags or {},
            raise_on_error=False,
        )
        assert res.success
        (mat,) = res.asset_materializations_for_node("daily_digest")
        return {k: v.value for k, v in mat.metadata.items()}


def test_a_backfill_posts_nothing_unless_asked(fleet):
    """The CLI's run of past days, a run of a backfill, a re-run of a day already posted, the
    URL unset: nothing posted, the materialization says why. Run config notify: true posts."""
    tmp, env, hook, _ = fleet
    n = len(hook.received)
    out = cli("materialize", "--start", str(DAYS[0]), "--end", str(DAYS[1]), "--raw",
              str(tmp / "raw"), "--lake", str(tmp / "lake"), env=env)  # fmt: skip
    assert " ok " in out.stdout and len(hook.received) == n
    meta = _digest_alone(tmp, hook, LAST, tags={"dagster/backfill": "bf1"})
    assert meta["posted"] is False and meta["why"].startswith("a run of backfill bf1")
    meta = _digest_alone(tmp, hook, LAST)
    assert meta["posted"] is False and "posted the digest of" in meta["why"]
    meta = _digest_alone(tmp, hook, LAST, url="")
    assert meta["why"] == "GPU_PIPELINE_NOTIFY_URL is unset"
    assert len(hook.received) == n
    meta = _digest_alone(tmp, hook, DAYS[1], tags={"dagster/backfill": "bf1"}, notify=True)
    assert meta["posted"] is True and len(hook.received) == n + 1
    assert hook.received[-1][2]["blocks"][0]["text"]["text"].endswith(str(DAYS[1]))


def test_the_report_path_is_linked_without_a_base_url(fleet):
    tmp, _, _, _ = fleet
    path = str((tmp / "lake" / "_reports" / f"gpu_report_{LAST}.html").resolve())
    d = build_digest(Lake(tmp / "lake"), LAST, path)
    assert slack_payload(d)["blocks"][-1]["elements"][0]["text"] == f"Report: `{path}`"


def test_a_hook_that_is_down_fails_the_digest_alone(fleet, tmp_path):
    """Yesterday into a new lake while the hook answers 500: the run fails at daily_digest only,
    with one line naming the hook by scheme and host; every table's partition, the report and
    the views file are written."""
    src, env, _, _ = fleet
    down = Hook()
    down.default = (500, {}, "down")
    env = {**env, "GPU_PIPELINE_NOTIFY_URL": down.url, "DAGSTER_HOME": str(tmp_path / "dh")}
    env.pop("GPU_PIPELINE_REPORT_BASE_URL")
    try:
        out = cli("materialize", "--start", str(LAST), "--raw", str(src / "raw"), "--lake",
                  str(tmp_path / "lake"), env=env, check=False)  # fmt: skip
    finally:
        down.stop()
    assert out.returncode == 1 and len(down.received) == 4, out.stdout
    failed = [ln.strip() for ln in out.stdout.splitlines() if " failed: " in ln]
    origin = down.url.removesuffix(SECRET)
    assert failed == [
        f"daily_digest failed: Failure: the webhook {origin}/<hidden> did not take the digest "
        "after 4 attempt(s): HTTP 500: down at <hidden>"
    ], out.stdout
    assert "only the digest was not posted" in out.stdout
    _no_secret(out.stdout + out.stderr)
    lake = Lake(tmp_path / "lake")
    # every table written: the days' partitions, and the month's (its first day) after them
    month = LAST.replace(day=1)
    assert [
        t for t in TABLES if not lake.exists(t, month if t == "namespace_monthly" else LAST)
    ] == []
    assert (tmp_path / "lake" / "_reports" / f"gpu_report_{LAST}.html").is_file()
    assert (tmp_path / "lake" / "_warehouse.duckdb").is_file()
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
        (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="daily_pipeline"))
        _no_secret("\n".join(str(e) for e in instance.all_logs(run.run_id)))
        done = instance.get_materialized_partitions(dg.AssetKey("priced_waste"))
        assert done == {str(LAST)}
        assert not instance.get_materialized_partitions(dg.AssetKey("daily_digest"))


def test_fleets_sharing_an_instance_each_post_their_digest(fleet, tmp_path):
    """Two fleets, each its lake and its hook, one DAGSTER_HOME: the second's digest of the day
    is posted to its hook (it was "posted the digest of … already"), once; the first's lake to
    a new hook posts too; the metadata names the hook by a hash, never its URL."""
    tmp, _, first, _ = fleet
    other = tmp_path / "lake"
    shutil.copytree(tmp / "lake", other, ignore=shutil.ignore_patterns("_locks"))
    second = Hook()
    try:
        meta = _digest_alone(tmp, second, LAST, lake=other)
        assert meta["posted"] is True and len(second.received) == 1, meta.get("why")
        assert meta["lake"] == str(other.resolve()) and meta["confirmed"] is True
        _no_secret(json.dumps(meta))
        meta = _digest_alone(tmp, second, LAST, lake=f"{other}/")  # the same lake, spelt otherwise
        assert meta["posted"] is False and "from this lake to this hook already" in meta["why"]
        n = len(first.received)
        meta = _digest_alone(tmp, first, LAST, lake=other)  # the second lake to the first hook
        assert meta["posted"] is True and len(first.received) == n + 1
        meta = _digest_alone(tmp, second, LAST)  # the first lake to the second hook
        assert meta["posted"] is True and len(second.received) == 2
    finally:
        second.stop()


def test_a_slow_hook_is_posted_once_and_said_unconfirmed(fleet, tmp_path, monkeypatch):
    """The asset with a hook that answers after its read timeout: the run succeeds, the hook
    got the digest once, the materialization says posted but not confirmed, with the one line;
    the next run of the day does not post it again."""
    tmp, _, _, _ = fleet
    other = tmp_path / "lake"
    shutil.copytree(tmp / "lake", other, ignore=shutil.ignore_patterns("_locks"))
    monkeypatch.setattr(notify_defs, "DELIVERY", Delivery(timeout_s=(2.0, 0.5)))
    slow = Hook()
    slow.delay = 1.5
    try:
        meta = _digest_alone(tmp, slow, LAST, lake=other)
        assert len(slow.received) == 1
        assert meta["posted"] is True and meta["confirmed"] is False
        assert "did not answer within 0.5 s after the digest was sent" in meta["why"]
        assert "may have been delivered" in meta["why"]
        _no_secret(json.dumps(meta))
        meta = _digest_alone(tmp, slow, LAST, lake=other)
        assert meta["posted"] is False and len(slow.received) == 1
    finally:
        slow.stop()
