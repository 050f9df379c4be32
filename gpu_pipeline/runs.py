"""Materializing a range of UTC days, as `gpu-pipeline materialize` does it: the run logic that
the CLI calls and whose result it prints.

Its own module, one layer above `definitions` (it builds the definitions and runs their job) and
below the CLI (which parses the arguments and prints): not in `defs/`, which `definitions`
imports (a module there could not import `build_definitions` without an arrow back up,
tests/test_layers.py).

`materialize_range(settings, request, say)`:

1. checks the days (`check_days`: none before the first partition, none not yet over);
2. builds the definitions the run uses and takes their resources (`run_resources`, resolved as
   the run resolves them): the reference files checked, the landing zone listed and its new
   files parsed into the cache (`warm_parse_cache`) with the run's own `LandingResource` and
   `LakeResource`, so the CLI and the run cannot disagree on an option (csv time zone, largest
   file, cache folder);
3. refuses a range whose landing files hold no records (unless allow_empty or pull);
4. creates the Dagster instance if needed, fails this host's orphaned runs, runs
   `daily_pipeline` over the whole range in one run, then `namespace_monthly_job` over the
   months of those days (a month is made from all its days), and refreshes the lake's views
   file when it no longer matches the lake;
5. returns a `RangeRun`: the run's status and failed steps, its own ledger (from its
   materializations, never what the lake holds by then) and the landing files rejected whole.

What it says while it works (warnings, parsing and step progress, notes) goes to `say`, a line at
a time; a request it refuses before anything is written raises `Refused` (exit code, message).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

from gpu_pipeline import settings

PACKAGE = Path(__file__).resolve().parent  # what the package ships: config/, sql/, reference/
# Dagster logs every step at DEBUG on the console, failures with their stack traces at ERROR;
# the CLI prints its own progress and one line per failure (--verbose shows Dagster's logs)
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# a run `execute_job` creates (multiprocess) gets its id from Dagster: this tag finds it
REQUEST_TAG = "gpu_pipeline/request"
# what the CLI says when GPU_PIPELINE_EXECUTOR=k8s: it runs the steps in its own process
K8S_NOTE = (
    "note: GPU_PIPELINE_EXECUTOR=k8s: gpu-pipeline materialize runs the steps in this process "
    "(a pod per step needs the cluster's run launcher: launch the job from the Dagster UI, "
    "a schedule or a backfill there)"
)
# the step that posts the daily digest (defs/notify.py), the last of a run
DIGEST_STEP = "daily_digest"
# at most this many files rejected whole are named with their reason, then a count
MAX_LISTED = 20

Say = Callable[[str], None]


class Refused(Exception):
    """A request refused before anything is written: `code` (the CLI's exit code), the message
    (its text), and `elsewhere`, the landing files rejected whole that are filed on days outside
    the range ((file, days) pairs: where the records the range lacks may have gone)."""

    def __init__(self, code: int, message: str, elsewhere: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.code, self.elsewhere = code, elsewhere or []


@dataclass(frozen=True)
class Request:
    """The days to materialize and how (the `materialize` command's flags)."""

    start: date
    end: date
    pull: bool = False  # fetch the days from the Prometheus-compatible server first
    allow_empty: bool = False  # write days without records
    replace_missing: bool = False  # rewrite days whose landing files are gone
    verbose: bool = False  # Dagster's own logs, and the stack traces of failed steps
    # post the digest of the last day (True), never (False), or as defs/notify.py decides (None)
    notify: bool | None = None


@dataclass
class RangeRun:
    """What a range's run did."""

    days: list[date]
    lake: object  # the run's lake (`Lake`, opened from its `LakeResource`)
    views: Path  # the lake's views file
    run_id: str = ""
    success: bool = False
    seconds: float = 0.0  # the run's own time
    server_missing: list[str] = field(default_factory=list)  # days the server had no data for
    failures: list[tuple[str, str]] = field(default_factory=list)  # (step, root cause)
    traces: list[str] = field(default_factory=list)  # failed steps' stack traces (verbose)
    views_error: str | None = None  # why the views file was not written, when it was not
    months: list[str] = field(default_factory=list)  # the months run again after the days
    ledger: dict[date, dict] = field(default_factory=dict)  # per day, the run's own ingest_log
    # the first MAX_LISTED files rejected whole with records on the days: (file, first reason)
    rejected_whole: list[tuple[str, str]] = field(default_factory=list)
    rejected_whole_total: int = 0
    rejected_elsewhere: list[tuple[str, str]] = field(default_factory=list)  # (file, its days)
    # days already in the lake, outside the run, that landing files it read hold records of
    # and the lake has not ingested them on (`lake_days_behind`): not run again by this run
    behind: list[date] = field(default_factory=list)
    # those of them no landing file holds a record of any more (a file replaced by one that no
    # longer reaches them): running them again needs --allow-empty
    behind_empty: list[date] = field(default_factory=list)

    @property
    def only_digest_failed(self) -> bool:
        """The run failed at posting the digest alone: every table and report is written."""
        return (
            not self.success
            and bool(self.failures)
            and {s for s, _ in self.failures} == {DIGEST_STEP}
        )


def init_instance() -> Path:
    """Create DAGSTER_HOME with the project's instance config if it has none."""
    home = settings.dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    import fcntl

    # two first runs at once must not both create the instance's databases: one does, under a
    # lock, and the other finds them made
    with open(home / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cfg.exists():
            shutil.copyfile(PACKAGE / "config" / "dagster.yaml", cfg)
        if not (home / "history" / "runs.db").exists():
            import dagster as dg

            with dg.DagsterInstance.from_config(str(home)) as instance:
                instance.get_runs(limit=1)  # creates the run, event and schedule storage
    return home


def check_days(s: settings.Settings, start: date, end: date) -> list[date]:
    """The days start..end, when each has a partition that can be written (Refused, exit 2)."""
    if end < start:
        raise Refused(2, f"--end {end} is before --start {start}")
    if end > settings.last_day():
        raise Refused(
            2,
            f"{end} is not over yet in UTC; the last day that can be materialized is "
            f"{settings.last_day()} (a day's partition opens once the day has ended)",
        )
    first = date.fromisoformat(s.start_date)
    if start < first:
        # the partitions begin at GPU_PIPELINE_START_DATE: a day before it has none to write
        raise Refused(
            2,
            f"{start} is before the first partition, {first} (GPU_PIPELINE_START_DATE); set "
            f"GPU_PIPELINE_START_DATE={start} or earlier to materialize it",
        )
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


@contextmanager
def run_resources(defs, instance=None) -> Iterator[dict[str, object]]:
    """The definitions' resources, resolved as a run resolves them (their `dg.EnvVar`s read,
    their config checked), by name: what the steps taken outside the run read, so that they
    use the run's options (outside a run the lake takes no day locks). `instance`: the run's,
    already open (else an in-memory one is made: ~0.5 s)."""
    import dagster as dg

    resources = {n: r for n, r in defs.resources.items() if isinstance(r, dg.ConfigurableResource)}
    # one instance for all of them (each resource's own context made an in-memory instance of
    # its own: ~0.05 s each, the first ~0.5 s)
    with ExitStack() as stack:
        instance = instance or stack.enter_context(dg.DagsterInstance.ephemeral())
        res = stack.enter_context(dg.build_resources(resources, instance))
        yield {name: getattr(res, name) for name in resources}


@contextmanager
def resources(s: settings.Settings) -> Iterator[dict[str, object]]:
    """The resources a run with settings `s` would use, resolved (`run_resources`): for a
    command that reads the lake or the reference files without running the job (`report`)."""
    from gpu_pipeline.definitions import build_definitions

    with run_resources(build_definitions(s, pull=False)) as res:
        yield res


def warm_parse_cache(landing, lake, say: Say, days: list[date] | None = None, ahead=None) -> list:
    """Parse new landing files up front, with progress; the run then reads the cache. `landing`
    and `lake`: the run's `LandingResource` and `LakeResource` (its parse options and cache);
    `days`: the run's (cached parses of other days are not checked); `ahead`: the parse already
    started in a process of its own (`ahead.Ahead`), waited for first."""
    from gpu_pipeline.lib.ingest.ahead import parse_new
    from gpu_pipeline.lib.ingest.landing import LandingRootError
    from gpu_pipeline.lib.ingest.remote import landing_root

    if ahead is not None:
        ahead.join()  # what it could not parse, this parses
    store = lake.open()
    try:  # an object-store landing zone is mirrored here first (the run's steps find it so)
        root, refused = landing_root(landing.root, store.cache_dir)
    except LandingRootError as e:
        if "://" in str(landing.root):  # nothing can be read: no run
            raise Refused(1, str(e)) from None
        root, refused = Path(landing.root), []  # the refusal is check_records' to word
    for key in refused:
        why = getattr(key, "why", "not a plain relative path")  # remote.Unmirrored
        say(f"warning: {landing.root}: object {key!r} not read: {why}")
    return parse_new(
        Path(root), store.cache_dir, landing.parse_options(), say, days, store.shared_cache
    )


def check_records(parsed: list, days: list[date], req: Request, raw: str, say: Say) -> None:
    """Refuse (exit 1) a range the landing files hold no record of, unless the request allows
    empty days or pulls them; note the days without records of a range that has some."""
    from gpu_pipeline.lib.ingest.ingest_log import rejected_elsewhere

    if req.pull:
        return  # the run's first step fetches the days; its ledger says what came
    remote = "://" in str(raw)  # an object store's prefix: named as given, never as a path
    where = str(raw) if remote else Path(raw).resolve()
    if not parsed and not req.allow_empty:
        why = "holds no files" if remote or Path(raw).is_dir() else "does not exist"
        raise Refused(
            1,
            f"the landing zone {where} {why}: nothing to materialize. Land exports there "
            "(or generate a fleet: gpu-pipeline generate), point --raw at them, or pass "
            "--allow-empty to write empty partitions",
        )
    # a day with records is not empty, even when every one of them is rejected: it runs, and
    # its ledger and quarantine say what happened
    empty = [d for d in days if not sum(pf.records_on(d) for pf in parsed)]
    if not empty or req.allow_empty:
        return
    if len(empty) == len(days):
        spans = sorted({d for pf in parsed for d in pf.record_days()})
        have = f"; the files hold records of {spans[0]}..{spans[-1]}" if spans else ""
        raise Refused(
            1,
            f"no records for {days[0]}..{days[-1]} in the {len(parsed)} landing file(s) of "
            f"{where}{have}. Pass --allow-empty to write empty partitions",
            rejected_elsewhere(parsed, days),
        )
    say(f"note: no records for {len(empty)} of the days: {', '.join(map(str, empty))}")


def materialize_range(s: settings.Settings, req: Request, say: Say) -> RangeRun:
    """Run `daily_pipeline` over req.start..req.end (see the module's docstring)."""
    days = check_days(s, req.start, req.end)
    # new landing files are parsed in a process of their own while Dagster is imported and the
    # resources resolved (`ahead`: seconds of one core the parse would otherwise wait for)
    ahead = None if req.pull or "://" in s.lake else _parse_ahead(s, say)
    try:
        return _materialize(s, req, say, days, ahead)
    finally:
        if ahead is not None:
            ahead.stop()


def _parse_ahead(s: settings.Settings, say: Say):
    from gpu_pipeline.lib.ingest.ahead import Ahead

    cache = settings.parse_cache_dir(s.lake, s.cache)
    return Ahead.start(s.raw, cache, s.csv_timezone, s.max_file_mb * 2**20, say)


def _materialize(s: settings.Settings, req: Request, say: Say, days: list[date], ahead):

    from gpu_pipeline.definitions import build_definitions
    from gpu_pipeline.lib.reference import check_files

    defs = build_definitions(s, pull=req.pull)
    with ExitStack() as stack:
        # the run's instance, opened while the files are parsed (`ahead`), resolves the
        # resources too
        instance = stack.enter_context(_open_instance())
        from gpu_pipeline.defs.orphans import heartbeat  # the runs' liveness tag, refreshed

        stack.enter_context(heartbeat(instance))
        with run_resources(defs, instance) as res:
            ref, landing, lake = res["reference"], res["landing"], res["lake"]
            # the reference files the run will read, checked before it starts (a ReferenceError:
            # every bad row, one line each)
            for warning in check_files(ref.prices, ref.catalog, ref.energy):
                say(f"warning: {warning}")
            if req.pull and not s.prom_url:
                raise Refused(2, "--pull needs a server: --url URL or GPU_PIPELINE_PROM_URL")
            parsed = warm_parse_cache(landing, lake, say, days, ahead)
            check_records(parsed, days, req, landing.root, say)
            say(
                f"materializing {len(days)} day(s) {req.start}..{req.end}: raw={s.raw} lake={s.lake}"
            )
            root = lake.root
            run = RangeRun(days=days, lake=lake.open(), views=settings.warehouse_path(root))
        from gpu_pipeline.defs.orphans import fail_orphaned_runs

        fail_orphaned_runs(instance, say)
        result = _execute(s, defs, instance, req, days, run, say)
        if run.success or run.only_digest_failed:  # the days' tables are written
            _run_months(defs, instance, req, run)
        if not run.success and not run.only_digest_failed:
            return run
        _refresh_views(defs, instance, run, root)
    run.ledger = run_ledger(result)
    _rejected_files(parsed, days, run)
    run.behind = lake_days_behind(s, lake, parsed, days)
    held = {d for pf in parsed for d in pf.record_days()}
    run.behind_empty = [d for d in run.behind if d not in held]
    return run


def _open_instance():
    """The project's Dagster instance (`init_instance`), opened: a context manager."""
    import dagster as dg

    return dg.DagsterInstance.from_config(str(init_instance()))


def _run_tags(job, days: list[date]) -> dict[str, str]:
    """As the UI tags its runs: one day, its partition (the runs list shows it); a range, its
    bounds and the days as a tag the runs list shows. And who runs it: a run left STARTED by a
    killed process is marked failed later (`fail_orphaned_runs`)."""
    if len(days) == 1:
        tags = dict(job.get_tags_for_partition_key(days[0].isoformat(), None))
    else:
        tags = {
            "dagster/asset_partition_range_start": days[0].isoformat(),
            "dagster/asset_partition_range_end": days[-1].isoformat(),
            "gpu_pipeline/days": f"{days[0]} → {days[-1]}",
        }
    from gpu_pipeline.defs.orphans import who_runs

    return {**tags, **who_runs()}


def _execute(s, defs, instance, req: Request, days: list[date], run: RangeRun, say: Say):
    """One run for the whole range (a UI backfill fans out into runs of up to
    GPU_PIPELINE_BACKFILL_DAYS days; the command is one run): every asset loops over the days,
    and Dagster's per-run cost is paid once. Fills
    `run` with what happened; returns Dagster's result (Refused, exit 1, when it cannot start)."""
    import dagster as dg

    run_config = {} if req.verbose else dict(QUIET)
    ops = {}
    if req.replace_missing:
        ops["ingest"] = {"config": {"replace_missing": True}}
    if req.notify is not None:
        ops[DIGEST_STEP] = {"config": {"notify": req.notify}}
    if ops:
        run_config["ops"] = ops
    t = time.perf_counter()
    request = str(uuid.uuid4())
    tags = {**_run_tags(defs.resolve_job_def("daily_pipeline"), days), REQUEST_TAG: request}
    watch = Progress(instance, request, t, say) if not req.verbose else None
    try:
        res = _launch(s, defs, instance, req, run_config, tags, say)
    except dg.DagsterError as e:
        raise Refused(
            1, f"the run could not start: {type(e).__name__}: {first_line(str(e))}"
        ) from None
    finally:
        if watch:
            watch.stop()
    for ev in res.get_asset_check_evaluations():
        if ev.check_name == "server_has_data" and not ev.passed:
            run.server_missing.append(ev.metadata["days_without_data"].value)
    run.run_id, run.success, run.seconds = res.run_id, res.success, time.perf_counter() - t
    if not res.success:
        run.failures = step_failures(res.all_events)
        if req.verbose:
            run.traces = [
                ev.step_failure_data.error.to_string()
                for ev in res.all_events
                if ev.is_step_failure
            ]
    return res


def _launch(s, defs, instance, req: Request, run_config: dict, tags: dict, say: Say):
    """Runs `daily_pipeline` where GPU_PIPELINE_EXECUTOR says: `multiprocess`, each step in a
    process of its own (`execute_job` on the job rebuilt from the code location,
    `gpu_pipeline.definitions.cli_job`); `in_process`, and `k8s` (said, `K8S_NOTE`), every
    step in this process. Dagster's result either way."""
    import dagster as dg

    if s.executor == "multiprocess":
        import json

        # the step processes inherit this environment; the flags' values go as the job's
        # arguments (paths: the run record keeps them), a --url through its variable (it may
        # carry a password, which the run record must not)
        flags = {n: getattr(s, n) for n in ("raw", "lake", "prices") if n not in s.from_env_fields}
        if s.prom_url and "prom.url" not in s.from_env_fields:
            os.environ[settings.PROM_SETTINGS["url"][0]] = s.prom_url
        job = dg.build_reconstructable_job(
            "gpu_pipeline.definitions",
            "cli_job",
            reconstructable_args=(json.dumps(flags, sort_keys=True), req.pull),
        )
        return dg.execute_job(
            job, instance=instance, run_config=run_config, tags=tags, raise_on_error=False
        )
    if s.executor == "k8s":
        say(K8S_NOTE)
    return defs.resolve_job_def("daily_pipeline").execute_in_process(
        instance=instance, raise_on_error=False, run_config=run_config, tags=tags
    )


def _run_months(defs, instance, req: Request, run: RangeRun) -> None:
    """The months of the run's days, made again from all their days in the lake (a late day
    changes its month's totals): one run of `namespace_monthly_job` after the days' run. Its
    failure fails the command, with the step and its cause."""
    from gpu_pipeline.lib.marts.namespace_monthly import MONTH_FORMAT

    keys = sorted({d.strftime(MONTH_FORMAT) for d in run.days})
    job = defs.resolve_job_def("namespace_monthly_job")
    if len(keys) == 1:
        tags = dict(job.get_tags_for_partition_key(keys[0], None))
    else:
        tags = {
            "dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1],
        }
    from gpu_pipeline.defs.orphans import who_runs

    tags |= who_runs()
    res = job.execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config={} if req.verbose else QUIET,
        tags=tags,
    )
    run.months = keys
    if not res.success:
        run.success = False
        run.failures = [*run.failures, *step_failures(res.all_events)]


def _refresh_views(defs, instance, run: RangeRun, root: str) -> None:
    """The views glob the lake at query time: the file is rewritten only when it no longer
    matches its lake (new lake, or a table that got its first partition)."""
    from gpu_pipeline.lib.io.warehouse import views_current

    if views_current(run.views, root):
        return
    views = defs.resolve_job_def("refresh_warehouse").execute_in_process(
        instance=instance, raise_on_error=False, run_config=QUIET
    )
    if not views.success:
        causes = [cause for _, cause in step_failures(views.all_events)]
        run.views_error = causes[0] if causes else "failed"


def _rejected_files(parsed: list, days: list[date], run: RangeRun) -> None:
    """The landing files rejected whole: those with records on the run's days (the first
    MAX_LISTED with their first reason), and those filed on other days."""
    from gpu_pipeline.lib.ingest.ingest_log import rejected_elsewhere

    on = set(days)
    whole = [pf for pf in parsed if pf.rejected_whole and on & set(pf.record_days())]
    run.rejected_whole_total = len(whole)
    for pf in whole[:MAX_LISTED]:
        reason = pf.quarantine.select("reason").head(1).collect()
        why = reason["reason"][0] if reason.height else pf.format
        run.rejected_whole.append((pf.file.source_file, first_line(why, 160)))
    run.rejected_elsewhere = rejected_elsewhere(parsed, days)


def lake_days_behind(s: settings.Settings, lake, parsed: list, days: list[date]) -> list[date]:
    """The days outside `days` that the lake holds (their `ingest_log` is written, within
    GPU_PIPELINE_START_DATE..yesterday) and that landing files the run read hold records of
    without the day having ingested them with their content: the landing-zone sensor's test
    (`sensors._not_in_lake`), asked of each such day on its own, after the run. A late file of
    02-01 with records of 01-31 names 01-31. Days not in the lake yet are not named (their first
    run reads the file), nor days without a partition, nor a day whose ingest_log is damaged
    (its own run names the file). `lake`: the run's `LakeResource`.

    Also the days whose ingest_log lists a file the run read with another content (the
    sensor's `_replaced_days`): a file replaced by one that no longer reaches such a day left
    its earlier records there, billed, until the day runs again (adversarial review). That
    reads each day's ingest_log (small files, a few ms a day)."""
    from gpu_pipeline.defs.sensors import _not_in_lake, _replaced_days
    from gpu_pipeline.lib.io.lake import DamagedPartition

    run, first = set(days), date.fromisoformat(s.start_date)
    read = [pf for pf in parsed if run & set(pf.touched_days())]
    store = lake.open()
    candidates = {d for pf in read for d in pf.record_days()} - run
    behind = set(_replaced_days(lake, [pf.file for pf in read]) if read else ()) - run
    for d in sorted(candidates - behind):
        if not store.exists("ingest_log", d):
            continue
        files = [pf.file for pf in read if d in pf.record_days()]
        try:
            if _not_in_lake(lake, files, {f.source_file: _OnDay(d) for f in files}):
                behind.add(d)
        except (OSError, DamagedPartition):  # a damaged ingest_log: its day's run says so
            continue
    return sorted(d for d in behind if first <= d <= settings.last_day())


@dataclass(frozen=True)
class _OnDay:
    """A landing file's parse as `_not_in_lake` sees it, narrowed to one day it touches."""

    day: date

    def touched_days(self) -> list[date]:
        return [self.day]


class Progress:
    """Says a run's progress while it works: each step's start and end with the elapsed time,
    and the per-day lines the assets log, read from the run's event log every half second (so a
    long backfill is never a silent terminal)."""

    def __init__(self, instance, request: str, t0: float, say: Say):
        self.instance, self.request, self.say = instance, request, say
        self.run_id = ""  # found by its REQUEST_TAG once the run exists
        self.t0 = time.time() - (time.perf_counter() - t0)  # the run's start, wall clock
        self.cursor: str | None = None
        self.started: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(0.5):
            self._poll()

    def _poll(self) -> None:
        import dagster as dg
        from dagster import DagsterEventType as T

        try:  # only what is new since the last poll (the cursor), never the whole log again
            if not self.run_id:
                found = self.instance.get_run_ids(
                    filters=dg.RunsFilter(tags={REQUEST_TAG: self.request}), limit=1
                )
                if not found:
                    return
                self.run_id = found[0]
            conn = self.instance.get_records_for_run(self.run_id, cursor=self.cursor)
        except Exception:  # the run's log may not exist yet; progress is best effort
            return
        self.cursor = conn.cursor
        for r in (rec.event_log_entry for rec in conn.records):
            ev, now = r.dagster_event, r.timestamp - self.t0
            if ev is not None and ev.step_key and ev.event_type == T.STEP_START:
                self.started[ev.step_key] = r.timestamp
                self.say(f"  {now:6.1f}s  {ev.step_key} started")
            elif (
                ev is not None and ev.step_key and ev.event_type in (T.STEP_SUCCESS, T.STEP_FAILURE)
            ):
                took = r.timestamp - self.started.get(ev.step_key, r.timestamp)
                state = "done" if ev.event_type == T.STEP_SUCCESS else "FAILED"
                self.say(f"  {now:6.1f}s  {ev.step_key} {state} ({took:.1f}s)")
            elif ev is None and r.user_message[:4].isdigit() and r.user_message[4:5] == "-":
                self.say(
                    f"  {now:6.1f}s    {first_line(r.user_message)[:160]}"
                )  # "2024-01-01: ..."

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self._poll()


def first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def step_failures(events) -> list[tuple[str, str]]:
    """(step, root cause) for each failed step: the innermost error of its chain, one line. A
    resource that failed to start (the S3 day lock, the store) fails its step before the step
    starts, with no step failure: it is named by its step; a run that failed with neither, by
    the run's own error ("run")."""
    import dagster as dg

    out = []
    failed_run = None
    for ev in events:
        if ev.event_type == dg.DagsterEventType.RUN_FAILURE:
            failed_run = ev
        if not (ev.is_step_failure or ev.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE):
            continue
        failure = (ev.step_key or "run", _root_cause(ev.event_specific_data.error))
        if failure not in out:  # a step's resource failure may be its step failure too
            out.append(failure)
    run_error = getattr(failed_run and failed_run.event_specific_data, "error", None)
    if not out and run_error is not None:
        out.append(("run", _root_cause(run_error)))
    return out


def _root_cause(err) -> str:
    """The innermost error of `err`'s chain (a SerializableErrorInfo), one line."""
    while err.cause is not None:
        err = err.cause
    msg = err.message.strip()
    # a blocking check's message lists the checks on the lines after its first
    if "asset check" in msg:
        msg = " ".join(ln.strip() for ln in msg.splitlines() if ln.strip())
    cls = err.cls_name or "Error"
    # a class of a package's is named with its module (dagster._core…events.Failure: …)
    msg = re.sub(rf"^[\w.]+\.{re.escape(cls)}: ", f"{cls}: ", msg)
    text = msg if msg.startswith(cls) else f"{cls}: {msg}"
    return first_line(text, 400)


def run_ledger(res) -> dict[date, dict]:
    """Per day, what this run's own ingest recorded (the ingest_log materializations' metadata):
    never what the lake holds by the time this prints (another run may have written since)."""
    out: dict[date, dict] = {}
    for ev in res.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization
        if mat.asset_key.path != ["ingest_log"] or not mat.partition:
            continue
        meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
        if "rows_read" in meta:
            out[date.fromisoformat(mat.partition)] = meta
    return out
