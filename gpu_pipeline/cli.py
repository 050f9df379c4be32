"""`gpu-pipeline`: GPU telemetry in a landing folder, cost and efficiency marts out (a Parquet
lake, DuckDB SQL, the Dagster asset graph)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import threading
import time
from datetime import date
from pathlib import Path
from urllib.parse import quote

from gpu_pipeline import settings

PACKAGE = Path(__file__).resolve().parent  # what the package ships: config/, sql/, reference/


def _day(s: str) -> date:
    try:
        return date.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {s!r}") from None


def _say(msg: str) -> None:
    print(msg, flush=True)


def _say_error(msg: str) -> None:
    """An error of `sql`, whose standard output is the results (a CSV or JSON file): on
    standard error."""
    print(msg, file=sys.stderr, flush=True)


def cmd_generate(a: argparse.Namespace) -> int:
    from gpu_pipeline.lib.generate import generate

    for flag, value, low, high in (
        ("--gpus", a.gpus, 1, 1_000_000),
        ("--clusters", a.clusters, 1, 3),
        ("--days", a.days, 1, 3660),
    ):
        if not low <= value <= high:
            _say(f"error: {flag} must be between {low:,} and {high:,}, not {value}")
            return 2
    out = Path(a.out or settings.current().raw)
    t = time.perf_counter()
    files = generate(
        out,
        a.start,
        a.days,
        a.gpus,
        a.clusters,
        a.seed,
        a.format,
        progress=lambda m: _say("  " + m),
    )
    size = sum(f.stat().st_size for f in files)
    _say(
        f"wrote {len(files)} files ({size / 2**20:,.0f} MiB) to {out} in {time.perf_counter() - t:.1f}s"
    )
    return 0


def _settings(a: argparse.Namespace) -> settings.Settings:
    """The environment's settings with this command's flags (--raw, --lake, --prices, --url)
    over them, each flag checked as its variable is (a SettingsError naming the flag); the
    definitions the command builds are bound to these (nothing is written into the process
    environment)."""
    flags: dict = {}
    for flag in ("raw", "lake", "prices"):
        v = getattr(a, flag, None)
        if v:
            settings.parse(settings.ENV_VARS[flag], v, name=f"--{flag}")
            # an object-store lake or landing zone stays the URI it is
            flags[flag] = v if flag in ("lake", "raw") and "://" in v else str(Path(v).resolve())
    s = settings.current().replace(**flags)
    if getattr(a, "url", None):
        settings.parse(settings.PROM_SETTINGS["url"][0], a.url, name="--url")
        s = s.replace(prom={**s.prom, "url": a.url})
    return s


def cmd_materialize(a: argparse.Namespace) -> int:
    """Run the days through `runs.materialize_range` and print what it did."""
    from gpu_pipeline.runs import Refused, Request, materialize_range

    s = _settings(a)
    req = Request(
        start=a.start,
        end=a.end or a.start,
        pull=a.pull,
        allow_empty=a.allow_empty,
        replace_missing=a.replace_missing,
        verbose=a.verbose,
        notify=a.notify,
    )
    t0 = time.perf_counter()
    try:
        run = materialize_range(s, req, _say)
    except Refused as e:
        _say(f"error: {e}")
        _say_rejected_elsewhere(e.elsewhere)
        return e.code
    if not _say_outcome(run):
        return 1
    _print_ledger(run)
    _say_rejected_elsewhere(run.rejected_elsewhere)
    _say_window_after(a, s, run)
    _say_lake_behind(a, s, run.behind, run.behind_empty)
    # a lake in an object store has no views file (lib/io/warehouse.py): the line says so
    views = "none (gpu-pipeline sql --lake says how to read it)" if "://" in s.lake else run.views
    _say(f"done in {time.perf_counter() - t0:.1f}s; lake {s.lake}, views {views}")
    _say_reports(s, run.days)
    if a.summary:
        _print_summary(run.lake, req.start, req.end)
        _say_hints(s, req.end, run.views, lake_flag=bool(a.lake))
    return 0


def _rerun_flags(a: argparse.Namespace, s: settings.Settings) -> str:
    """This run's --raw, --lake and --prices, for a command it advises (run with --lake X, the
    advice without it would run against the default lake)."""
    import shlex

    return "".join(
        f" --{n} {shlex.quote(str(getattr(s, n)))}"
        for n in ("raw", "lake", "prices")
        if getattr(a, n, None)
    )


def _say_window_after(a: argparse.Namespace, s: settings.Settings, run) -> None:
    """The later days in the lake whose persistence window reads the run's days: a run of a
    late day does not run them again (the landing-zone sensor does), so their
    persistent_bottlenecks keep the day as it was (adversarial review); the command that
    brings them up to date."""
    from datetime import timedelta

    from gpu_pipeline.defs.partitions import Partitioning

    end, window = run.days[-1], Partitioning.of(s).window_days
    later = [
        d
        for d in run.lake.days("persistent_bottlenecks")
        if end < d < end + timedelta(days=window) and d not in run.days
    ]
    if later:
        _say(
            f"  note: persistent_bottlenecks of {later[0]}..{later[-1]} read these days in their "
            f"{window}-day window and were not run again: {_cli_command()} materialize "
            f"--start {later[0]} --end {later[-1]}{_rerun_flags(a, s)}"
        )


def _say_lake_behind(
    a: argparse.Namespace, s: settings.Settings, behind: list[date], empty: list[date]
) -> None:
    """The days already in the lake that landing files this run read hold records of, and that
    did not ingest them (`runs.lake_days_behind`: a late file of the run's first day with the
    last hour of the day before): one line, with the command that runs them again (a command
    per span of consecutive days; this run's --raw, --lake and --prices repeated), with
    --allow-empty for a span with a day no landing file holds a record of any more (`empty`:
    the command said without it was refused, adversarial review)."""
    from datetime import timedelta

    if not behind:
        return
    flags = _rerun_flags(a, s)
    spans: list[list[date]] = []
    for d in behind:
        if spans and d - spans[-1][-1] == timedelta(days=1):
            spans[-1].append(d)
        else:
            spans.append([d])
    cmds = [
        f"{_cli_command()} materialize --start {sp[0]}"
        + (f" --end {sp[-1]}" if len(sp) > 1 else "")
        + flags
        + (" --allow-empty" if set(sp) & set(empty) else "")
        for sp in spans
    ]
    one = len(behind) == 1
    _say(
        f"  note: {', '.join(map(str, behind))} {'is' if one else 'are'} in the lake and "
        f"{'was' if one else 'were'} not run again, but landing files this run read hold records "
        f"of {'it' if one else 'them'} that the lake has not ingested (or it holds their earlier "
        f"content): {' ; '.join(cmds)}"
    )


def _say_outcome(run) -> bool:
    """The run's status line, and for a failed run the failed steps (with their stack traces
    under --verbose); for one that succeeded, a views file it could not write. Whether it
    succeeded."""
    for missing in run.server_missing:
        _say(f"  note: the server holds no DCGM samples for {missing}")
    status = "ok" if run.success else "FAILED"
    _say(f"  {run.days[0]}..{run.days[-1]}  {status}  run {run.run_id[:8]}  {run.seconds:.1f}s")
    if not run.success:
        for step, cause in run.failures:
            _say(f"    {step} failed: {cause}")
        _say(
            f"  full logs and stack traces: run {run.run_id} in the Dagster UI (make dev), "
            "or re-run with --verbose"
        )
        for trace in run.traces:
            _say(trace)
        if run.only_digest_failed:
            _say("  the tables and reports are written; only the digest was not posted")
        return False
    if run.months:
        _say(f"  months {', '.join(run.months)}: namespace_monthly written (gpu-pipeline showback)")
    if run.views_error is not None:
        _say(f"  note: views file {run.views} not written: {run.views_error}")
    return True


def _say_hints(s: settings.Settings, end: date, views: Path, lake_flag: bool) -> None:
    """Where to look further, after the summary: the hints query the lake this run wrote."""
    me, queries = _cli_command(), _queries_dir()
    if "://" in s.lake:  # no DuckDB over the store here: how to read it instead
        from gpu_pipeline.lib.io.warehouse import object_store_note

        _say(f"\nLook further:\n  {object_store_note(s.lake)}\n  make dev")
        return
    lake_opt = f" --lake {s.lake}" if lake_flag else ""
    _say(
        "\nLook further:\n"
        f"  {me} sql{lake_opt} -f {queries}/top_wasted_namespaces.sql\n"
        f"  {me} sql{lake_opt} -f {queries}/top_wasted_workloads.sql\n"
        f"  {me} sql{lake_opt} -f {queries}/persistent_offenders.sql\n"
        f"  {me} sql{lake_opt} -f {queries}/fleet_trend.sql\n"
        f'  {me} sql{lake_opt} "SELECT * FROM fleet_daily ORDER BY date"\n'
        f"  report for {end}: {settings.reports_dir(s.lake) / settings.report_name(end)}\n"
        f"  {_python_command()} -c {_open_views(views)}\n"
        "    (the views file, read-only, from Python; any DuckDB client opens it, the `duckdb` CLI"
        " is a separate install)\n"
        "  make dev                      (Dagster UI: runs, partitions, backfills)"
    )


def _python_command() -> str:
    """This interpreter, as the user can call it from here (`.venv/bin/python` after `make
    demo` without an activated venv; `python` when that is it)."""
    found = shutil.which("python")
    if found and Path(found).absolute() == Path(sys.executable).absolute():
        return "python"
    try:
        return str(Path(sys.executable).absolute().relative_to(Path.cwd()))
    except ValueError:
        return sys.executable


def _open_views(views: Path) -> str:
    """The `-c` program, quoted for the shell, that opens the views file read-only and lists
    its views (DuckDB's Python package is a dependency; the `duckdb` CLI is not)."""
    import json
    import shlex

    return shlex.quote(
        f"import duckdb; duckdb.connect({json.dumps(str(views))}, read_only=True)"
        '.sql("SHOW TABLES").show()'
    )


# at most this many report paths are printed one a line; a longer range names its first and last
MAX_REPORT_LINES = 3


def _say_reports(s: settings.Settings, days: list[date]) -> None:
    """Where the run's HTML reports are (the ones on disk: one a day)."""
    folder = settings.reports_dir(s.lake)
    found = [p for d in days if (p := folder / settings.report_name(d)).is_file()]
    if not found:
        return
    if len(found) <= MAX_REPORT_LINES:
        for i, path in enumerate(found):
            _say(f"{'  reports: ' if i == 0 else ' ' * 11}{path}")
    else:
        _say(f"  reports: {found[0]} .. {found[-1].name} ({len(found)} files in {folder})")


def _cli_command() -> str:
    """How this user can call the CLI again: its name when it is on PATH, else the path they ran
    (`.venv/bin/gpu-pipeline` after `make demo` without an activated venv)."""
    ran = Path(sys.argv[0])
    if ran.name == "gpu-pipeline":
        found = shutil.which("gpu-pipeline")
        if found and Path(found).resolve() == ran.resolve():
            return "gpu-pipeline"
        try:
            return str(ran.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(ran.resolve())
    return f"{sys.executable} -m gpu_pipeline.cli"


def _queries_dir() -> str:
    """The example queries, as a path that works from here."""
    repo = PACKAGE / "sql" / "queries"
    try:
        return str(repo.relative_to(Path.cwd()))
    except ValueError:
        return str(repo)


def _print_ledger(run) -> None:
    """What this run did with the landing files, per day: files, records, quarantine, rejects,
    the days it kept as they were."""
    ledger, days = run.ledger, run.days
    if not ledger:
        return
    _say("  day         files   records accepted   quarantined   duplicates")
    for d, r in sorted(ledger.items()):
        _say(
            f"  {d}  {r['files']:>5}  {r['rows_accepted']:>17,}  {r['rows_quarantined']:>12,}"
            f"  {r['rows_duplicate']:>11,}" + ("  (kept as it was)" if r.get("kept") else "")
        )
    for d, r in sorted(ledger.items()):
        read, bad = r["rows_read"], r["rows_quarantined"]
        if read and bad and (read - bad) < 0.95 * read:
            _say(
                f"  {d}: {bad:,} of its {read:,} records were rejected: its validation check "
                "(validation_pass_rate) failed"
                + ("; no GPU-minutes" if not r["rows_accepted"] else "")
            )
        if r.get("kept"):
            gone = r.get("files_gone") or []
            _say(
                f"  {d}: kept as it was: {len(gone)} landing file(s) it was made from are gone "
                f"({', '.join(gone[:3])}{' …' if len(gone) > 3 else ''}); rewrite it without them "
                "with --replace-missing"
            )
    if run.rejected_whole_total:
        _say(f"  {run.rejected_whole_total} file(s) rejected whole:")
        for name, why in run.rejected_whole:
            _say(f"    {name}: {why}")
        if run.rejected_whole_total > len(run.rejected_whole):
            _say(f"    … and {run.rejected_whole_total - len(run.rejected_whole)} more")
    if any(r["rows_quarantined"] for r in ledger.values()):
        _say(
            '  see them: gpu-pipeline sql "SELECT date, source_file, line, reason FROM quarantine '
            f"WHERE date BETWEEN '{days[0]}' AND '{days[-1]}' ORDER BY date, source_file, line\""
        )


def _say_rejected_elsewhere(away: list[tuple[str, str]]) -> None:
    """Name the landing files rejected whole whose quarantine rows are on days this run does not
    hold, and where they went (a file rejected today is seen by whoever runs its own days)."""
    if not away:
        return
    _say(f"  {len(away)} landing file(s) rejected whole are filed on days outside this run:")
    for name, where in away[:20]:
        _say(f"    {name} -> quarantine of {where}")
    if len(away) > 20:
        _say(f"    … and {len(away) - 20} more")


def _print_summary(lake, start: date, end: date) -> None:
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    _say("")
    _say(format_summary(fleet_summary(lake, start, end), start, end))


def cmd_summary(a: argparse.Namespace) -> int:
    s = _settings(a)
    end = a.end or a.start
    if end < a.start:
        _say(f"error: --end {end} is before --start {a.start}")
        return 2
    from gpu_pipeline.lib.io.lake import Lake, is_uri
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    if not is_uri(s.lake) and not Path(s.lake).is_dir():
        _say(
            f"error: the lake {s.lake} does not exist: nothing to summarize. Materialize some days "
            "first (gpu-pipeline materialize --start D), or point --lake at a lake"
        )
        return 1
    lake = Lake(s.lake)
    summary = fleet_summary(lake, a.start, end)
    if not summary["head"]["gpus"]:
        held = lake.days("gpu_minutes")
        has = (
            f"its gpu_minutes partitions span {held[0]}..{held[-1]}"
            if held
            else "it holds no gpu_minutes partition"
        )
        _say(f"error: no GPU-minutes in the lake {s.lake} for {a.start}..{end}; {has}")
        return 1
    _say(format_summary(summary, a.start, end))
    return 0


class SqlSession:
    """An analyst SQL connection of this process: see `open_sql_session`."""

    def __init__(self, con, s: settings.Settings, spill: Path | None, restricted: bool):
        self.con, self.settings, self.spill, self.restricted = con, s, spill, restricted
        self.timeout_s = s.sql_timeout_s

    def close(self) -> None:
        self.con.close()
        if self.spill is not None:  # inside the folder the sandbox keeps writable
            shutil.rmtree(self.spill, ignore_errors=True)


# at most this many "skipped" warnings, then a count
MAX_WARNINGS = 20


def _warn_skipped(skipped: list[tuple[str, str]]) -> None:
    for path, why in skipped[:MAX_WARNINGS]:
        print(f"warning: skipped {path}: {why}", file=sys.stderr)
    if len(skipped) > MAX_WARNINGS:
        print(f"warning: … and {len(skipped) - MAX_WARNINGS} more skipped", file=sys.stderr)


def open_sql_session(s: settings.Settings) -> SqlSession:
    """The lake's views over its checked partitions (links out of the lake refused, stray and
    corrupt partitions skipped with a warning on stderr), in a process that from here on can
    write nothing but its private spill folder and read nothing but its table folders and what
    Python and DuckDB need (Linux Landlock, made before DuckDB starts a thread: a thread started
    earlier would keep every right). Memory, threads and spill bounded by the settings.
    SqlError (LakeError) when the lake cannot be read."""
    import duckdb

    from gpu_pipeline.lib.io import sandbox
    from gpu_pipeline.lib.io.warehouse import (
        LakeError,
        SqlError,
        SqlLimits,
        connect_readonly,
        error_text,
        scan_partitions,
    )

    parts = scan_partitions(s.lake)
    _rss_bytes()  # its file is opened now: the sandbox keeps /proc out of reach
    private = sandbox.private_dir() if s.sql_spill_mb > 0 else None
    keep, spill = private if private else (None, None)
    try:
        restricted = False
        if sandbox.abi() >= 1:  # Linux 5.13 or newer; elsewhere DuckDB's allow-list stands alone
            try:
                dirs = [sandbox.open_dir(d) for d in parts.table_dirs()]
            except OSError as e:
                raise LakeError(f"the lake changed while it was opened: {e}") from None
            try:
                restricted = sandbox.restrict(keep, [*sandbox.runtime_paths(), *dirs])
            finally:
                for fd in dirs:
                    os.close(fd)
        limits = SqlLimits(
            memory_mb=s.sql_memory_mb,
            threads=s.sql_threads,
            spill_mb=s.sql_spill_mb,
            temp_dir=str(spill) if spill else None,
        )
        try:
            con = connect_readonly(parts, limits=limits)
        except duckdb.Error as e:
            raise SqlError(error_text(e)) from None
    except BaseException:
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
        raise
    _warn_skipped(parts.skipped)
    return SqlSession(con, s, spill, restricted)


def _spilled_bytes(folder: Path) -> int:
    """Bytes the files below `folder` take on disk."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
    return total


_STATM: list[int] = []  # /proc/self/statm, opened before the SQL sandbox closes /proc


def _rss_bytes() -> int:
    """This process's resident memory (0 where /proc/self/statm cannot be read)."""
    try:
        if not _STATM:
            _STATM.append(os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_STATM[0], 256, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Watchdog(threading.Thread):
    """Stops the session's query at GPU_PIPELINE_SQL_TIMEOUT_S, when its spill files pass
    GPU_PIPELINE_SQL_SPILL_MB (DuckDB's own `max_temp_directory_size` is set but not enforced
    by every version: 826 MB were spilled under a 1 MiB cap), or when the process's memory grows
    past `memory_cap` over what it held before the query (DuckDB's `memory_limit` bounds its
    buffer manager only: `repeat('x', 3e9)` took 6 GB under a 64 MiB limit), checked every
    0.05 s. DuckDB is then interrupted (again every 0.2 s, for a statement that starts after);
    a process still not done 10 s later (stuck outside DuckDB) is ended, and one over memory
    as soon as it grows by another limit's worth, or after a second (one function call, such
    as a `repeat`, is not interrupted until it returns)."""

    def __init__(self, session: SqlSession):
        super().__init__(daemon=True)
        self.session, self.stop, self.reason = session, threading.Event(), ""
        self.base = _rss_bytes()

    @staticmethod
    def memory_cap(memory_mb: int) -> int:
        """Bytes a query may add to the process: twice DuckDB's limit (its allocations outside
        the buffer manager, the result's batches on their way out) and 256 MiB."""
        return (2 * memory_mb + 256) << 20

    def _why(self, t0: float) -> str:
        s = self.session.settings
        if s.sql_timeout_s > 0 and time.monotonic() - t0 > s.sql_timeout_s:
            return f"the query was stopped after {s.sql_timeout_s} s (GPU_PIPELINE_SQL_TIMEOUT_S)"
        if self.session.spill is not None and _spilled_bytes(self.session.spill) > (
            s.sql_spill_mb << 20
        ):
            return (
                f"the query was stopped: its spill files passed {s.sql_spill_mb} MiB "
                "(GPU_PIPELINE_SQL_SPILL_MB)"
            )
        if self.base and _rss_bytes() - self.base > self.memory_cap(s.sql_memory_mb):
            return (
                "the query was stopped: the process's memory grew by more than "
                f"{self.memory_cap(s.sql_memory_mb) >> 20} MiB (twice "
                f"GPU_PIPELINE_SQL_MEMORY_MB={s.sql_memory_mb}, and 256)"
            )
        return ""

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(0.05):
            self.reason = self._why(t0)
            if self.reason:
                break
        else:
            return
        memory = "memory" in self.reason
        mb = self.session.settings.sql_memory_mb
        hard = time.monotonic() + (1 if memory else 10)
        self.session.con.interrupt()
        while not self.stop.wait(0.05 if memory else 0.2):
            self.session.con.interrupt()
            over = memory and _rss_bytes() - self.base > self.memory_cap(mb) + (mb << 20)
            if over or time.monotonic() > hard:
                _say_error(f"error: {self.reason}")
                os._exit(2)


def run_sql_session(session: SqlSession, query: str, fmt: str) -> int:
    """Run analyst SQL in the session and print each statement's result; one error line (with
    DuckDB's hints) and exit code 2 for a refused or failed statement, the timeout or too many
    spill files."""
    import duckdb

    from gpu_pipeline.lib.io.warehouse import SqlError, run_queries, write_result

    watch = _Watchdog(session)
    watch.start()
    try:
        first = True
        # each statement's result is printed before the next statement runs
        for rel in run_queries(session.con, query):
            if watch.reason:
                raise duckdb.InterruptException("stopped")
            if rel is None:
                continue
            if not first and fmt != "json":
                sys.stdout.write("\n")
            first = False
            write_result(rel, fmt, sys.stdout)
    except (SqlError, duckdb.InterruptException) as e:
        sys.stdout.flush()
        msg = str(e)
        if watch.reason:
            _say_error(f"error: {watch.reason}")
        elif msg.startswith("Out of Memory Error"):  # DuckDB's hints (SET …) do not apply here
            s = session.settings
            _say_error(
                f"error: {msg.splitlines()[0]}\n  the limits: GPU_PIPELINE_SQL_MEMORY_MB="
                f"{s.sql_memory_mb}, GPU_PIPELINE_SQL_SPILL_MB={s.sql_spill_mb} "
                f"{'(spilling)' if session.spill else '(no spill files)'}"
            )
        else:
            _say_error(f"error: {msg}")
        return 2
    finally:
        watch.stop.set()
    return 0


def _sql_query(a: argparse.Namespace) -> str:
    """The SQL to run: from -f FILE, the argument or stdin, bounded (SqlError)."""
    from gpu_pipeline.lib.io.warehouse import SQL_MAX_BYTES, SqlError, read_sql_file, sql_text

    if a.file:
        return read_sql_file(a.file)
    if a.query is not None:
        try:
            return sql_text(a.query.encode("utf-8"), "the query")
        except UnicodeEncodeError:
            raise SqlError("the query is not UTF-8 text") from None
    return sql_text(sys.stdin.buffer.read(SQL_MAX_BYTES + 1), "standard input")


def cmd_sql(a: argparse.Namespace) -> int:
    s = _settings(a)
    from gpu_pipeline.lib.io.warehouse import SqlError, is_lake, is_object_store, object_store_note

    try:
        query = _sql_query(a)
    except SqlError as e:
        _say_error(f"error: {e}")
        return 2
    lake = s.lake
    if is_object_store(lake):  # DuckDB cannot read the store here: how to read it instead
        _say_error(f"error: {object_store_note(lake)}")
        return 2
    if not is_lake(lake):
        _say_error(
            f"error: {lake} is not a gpu_pipeline lake (a folder of table folders with date= "
            "partitions); materialize some days first, or point --lake at one"
        )
        return 2
    try:
        session = open_sql_session(s)
    except SqlError as e:
        _say_error(f"error: {e}")
        return 2
    try:
        return run_sql_session(session, query, a.format)
    finally:
        session.close()


def cmd_pull(a: argparse.Namespace) -> int:
    from gpu_pipeline.lib.ingest.pull import PromServer, PullError, days_between, pull_day

    s = _settings(a)
    url = s.prom_url
    if not url:
        _say("error: no server: pass --url URL or set GPU_PIPELINE_PROM_URL")
        return 2
    end = a.end or a.start
    if end < a.start:
        _say(f"error: --end {end} is before --start {a.start}")
        return 2
    try:
        server = PromServer(**s.prom)
    except (ValueError, TypeError) as e:
        _say(f"error: {e}")
        return 2
    raw = Path(s.raw)
    _say(f"pulling {a.start}..{end} from {server.public_url} ({server.mode}) into {raw}")
    reports = []
    for day in days_between(a.start, end):
        try:
            rep = pull_day(server, day, raw, progress=lambda m: _say("  " + m))
        except PullError as e:
            _say(f"error: {e}")
            return 1
        reports.append(rep)
        _say(
            f"  {day}: {len(rep.files)} file(s) ({rep.written} changed), {rep.samples:,} samples, "
            f"{rep.series:,} series, {rep.bytes / 2**20:,.1f} MiB, {rep.seconds:.1f}s"
            + ("  NO DATA on the server" if rep.empty else "")
        )
        for w in rep.warnings[:10]:
            _say(f"    server warning: {w}")
    if all(r.empty for r in reports):
        _say(f"error: {server.public_url} holds no DCGM samples for {a.start}..{end}")
        return 1
    return 0


def cmd_sample(a: argparse.Namespace) -> int:
    """Sample into the landing zone. Stopped by SIGINT/SIGTERM or by NVML failing, the file is
    completed with what was sampled, one line says so (stderr), and the exit code is 130/143
    (128 + the signal) or 1; a GPU that cannot be read is one `warning:` line on stderr."""
    from gpu_pipeline.lib.io.nvml import NvmlUnavailable, PynvmlBackend, SamplingStopped, sample

    out = Path(a.out or Path(settings.current().raw) / "nvml")
    try:
        path = sample(PynvmlBackend(), a.interval, a.duration, out)
    except (NvmlUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SamplingStopped as e:
        print(e.line(), file=sys.stderr, flush=True)
        return e.exit_code
    _say(f"wrote {path}")
    return 0


def _not_a_file(out: Path) -> str | None:
    """Why `out` cannot be the file a command writes (a folder is there, or a path the system
    refuses to look at), or None."""
    try:
        if out.is_dir():
            return f"--out {out} is a folder: give the name of a file (in it, or elsewhere)"
    except OSError as e:  # a name over 255 bytes
        return f"cannot write {out}: {e.strerror or e}"
    return None


def cmd_report(a: argparse.Namespace) -> int:
    s = _settings(a)
    from gpu_pipeline.lib.io.lake import is_uri
    from gpu_pipeline.lib.io.report import build_report
    from gpu_pipeline.runs import resources

    if not is_uri(s.lake) and not Path(s.lake).is_dir():  # as summary and showback say it
        print(
            f"error: the lake {s.lake} does not exist: materialize the day first", file=sys.stderr
        )
        return 1

    # the lake, catalog, price book, energy rates and rules a run with these settings uses (its
    # resources), told to the report as the daily_report asset tells it (defs/report.py): the
    # appendix then names the files in force, not the shipped ones, and writes the same page
    with resources(s) as res:
        lake, ref = res["lake"], res["reference"]
        in_force = ref.in_force()
        try:
            rep = build_report(
                lake.open(),
                a.date,
                require_data=True,
                catalog=ref.load_catalog(),
                in_force=in_force,
            )
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    from gpu_pipeline.lib.io.lake import replace_file

    out = Path(a.out or settings.reports_dir(s.lake) / settings.report_name(a.date))
    if (why := _not_a_file(out)) is not None:
        _say(f"error: {why}")
        return 2
    try:
        replace_file(out, lambda tmp: tmp.write_text(rep.html))
    except OSError as e:
        _say(f"error: cannot write {out}: {e.strerror or e}")
        return 2
    _say(f"wrote {out} ({len(rep.charts)} charts)")
    return 0


def _month(s: str) -> date:
    from gpu_pipeline.lib.marts.namespace_monthly import parse_month

    try:
        return parse_month(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a month (YYYY-MM): {s!r}") from None


def cmd_showback(a: argparse.Namespace) -> int:
    """The month's namespace_monthly as the showback file (CSV or xlsx)."""
    from gpu_pipeline.lib.io.lake import Lake, is_uri
    from gpu_pipeline.lib.io.showback import NoMonth, showback_lines, write_showback

    s = _settings(a)
    if not is_uri(s.lake) and not Path(s.lake).is_dir():
        _say(f"error: the lake {s.lake} does not exist: materialize some days first")
        return 2
    label = a.month.strftime("%Y-%m")
    name = f"showback_{label}.{a.format}"
    out = Path(a.out) if a.out else settings.reports_dir(s.lake) / name
    if (why := _not_a_file(out)) is not None:
        _say(f"error: {why}")
        return 2
    try:
        df, about = write_showback(Lake(s.lake), a.month, a.format, out)
    except NoMonth as e:
        _say(f"error: {e}")
        return 2
    except OSError as e:
        _say(f"error: cannot write {out}: {e.strerror or e}")
        return 2
    for line in showback_lines(out, df, about):
        _say(line)
    return 0


def cmd_init_instance(_: argparse.Namespace) -> int:
    from gpu_pipeline.runs import init_instance

    _say(f"DAGSTER_HOME={init_instance()}")
    return 0


EXAMPLES = {
    "generate": "gpu-pipeline generate --start 2024-01-01 --days 7 --gpus 50",
    "materialize": "gpu-pipeline materialize --start 2024-01-01 --end 2024-01-07 --summary",
    "sql": 'gpu-pipeline sql "SELECT * FROM fleet_daily ORDER BY date" --format csv',
    "summary": "gpu-pipeline summary --start 2024-01-01 --end 2024-01-07",
    "pull": "gpu-pipeline pull --start 2026-11-20 --end 2026-11-22 --url http://prometheus:9090",
    "sample": "gpu-pipeline sample --interval 0.1 --duration 60",
    "report": "gpu-pipeline report --date 2024-01-07 --out report.html",
    "showback": "gpu-pipeline showback --month 2024-01 --format xlsx --out showback.xlsx",
    "init-instance": "gpu-pipeline init-instance",
}


def _command(sub, name: str, **kw) -> argparse.ArgumentParser:
    """A command whose --help ends with an example of it."""
    return sub.add_parser(
        name, epilog=f"example: {EXAMPLES[name]}", formatter_class=_Formatter, **kw
    )


class _Formatter(argparse.HelpFormatter):
    """Help wrapped between words only: a path (`/tmp/pytest-of-root/…`) is never cut at a
    hyphen, so it can be copied from the terminal as it is."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        text = " ".join(text.split())
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


class _CommandsFormatter(_Formatter):
    """The top-level help: every command on a line of its own with its one-line help (at least
    80 columns wide: no command's help is wrapped onto a second line)."""

    def __init__(self, prog: str) -> None:
        width = max(shutil.get_terminal_size().columns - 2, 78)
        super().__init__(prog, max_help_position=20, width=width)

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):  # the commands, without a header line
            return "".join(self._format_action(a) for a in action._get_subactions())
        return super()._format_action(action)


def _add_generate(sub, start: date) -> None:
    """The `generate` command (--start defaults to `start`, the first partition)."""
    g = _command(
        sub,
        "generate",
        help="write a synthetic fleet's scrapes into the landing zone",
    )
    g.add_argument("--start", type=_day, default=start, help="first UTC day (default %(default)s)")
    g.add_argument("--days", type=int, default=7, help="days to write (default %(default)s)")
    g.add_argument("--gpus", type=int, default=50, help="GPUs in the fleet (default %(default)s)")
    g.add_argument("--clusters", type=int, default=3, help="clusters, 1 to 3 (default %(default)s)")
    g.add_argument("--seed", type=int, default=42, help="random seed (default %(default)s)")
    g.add_argument(
        "--format",
        default="prom",
        choices=["prom", "prom.gz", "prom-json", "smi-csv"],
        help="dcgm-exporter scrapes, gzipped, Prometheus query_range JSON or nvidia-smi CSV "
        "(default %(default)s)",
    )
    g.add_argument("--out", help="landing folder (default GPU_PIPELINE_RAW or data/raw)")
    g.set_defaults(fn=cmd_generate)


def _add_materialize(sub) -> None:
    """The `materialize` command."""
    m = _command(sub, "materialize", help="run every asset for the given UTC days through Dagster")
    m.add_argument("--start", type=_day, required=True, help="first UTC day (YYYY-MM-DD)")
    m.add_argument("--end", type=_day, help="last UTC day, at most yesterday (default: --start)")
    m.add_argument("--raw", help="landing zone (default GPU_PIPELINE_RAW or data/raw)")
    m.add_argument(
        "--lake", help="lake root, a path or s3://… (default GPU_PIPELINE_LAKE or data/lake)"
    )
    m.add_argument(
        "--prices", help="price book CSV (default GPU_PIPELINE_PRICES or the shipped one)"
    )
    m.add_argument("--summary", action="store_true", help="print the fleet summary afterwards")
    m.add_argument(
        "--allow-empty",
        action="store_true",
        help="write the days even when the landing zone has no samples for them",
    )
    m.add_argument(
        "--replace-missing",
        action="store_true",
        help="rewrite days even when landing files they were made from are gone (by default "
        "such a day keeps its partitions)",
    )
    m.add_argument(
        "--verbose",
        action="store_true",
        help="show Dagster's logs and the stack traces of failures",
    )
    m.add_argument(
        "--pull",
        action="store_true",
        help="fetch the days from the Prometheus-compatible server first (GPU_PIPELINE_PROM_URL)",
    )
    m.add_argument("--url", help="with --pull: the server URL (default GPU_PIPELINE_PROM_URL)")
    m.add_argument(
        "--notify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="post the last day's digest to GPU_PIPELINE_NOTIFY_URL (--no-notify: never); "
        "by default only a range ending yesterday posts, once a day",
    )
    m.set_defaults(fn=cmd_materialize)


def _add_queries(sub) -> None:
    """The `sql` and `summary` commands: reading the lake."""
    s = _command(sub, "sql", help="read-only DuckDB SQL over the marts")
    s.add_argument("query", nargs="?", help="SQL to run (several statements: each result printed)")
    s.add_argument("-f", "--file", help="read the SQL from this file")
    s.add_argument("--lake", help="lake to query (default GPU_PIPELINE_LAKE or data/lake)")
    s.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="output format (default %(default)s; CSV encodes nested columns as JSON; JSON "
        "writes NaN and infinite numbers as null; a value Polars cannot hold exactly, e.g. a "
        "HUGEINT, is written as DuckDB's text of it; errors go to standard error)",
    )
    s.set_defaults(fn=cmd_sql)
    su = _command(sub, "summary", help="print the fleet summary for a range of days")
    su.add_argument("--start", type=_day, required=True, help="first UTC day (YYYY-MM-DD)")
    su.add_argument("--end", type=_day, help="last UTC day (default: --start)")
    su.add_argument("--lake", help="lake root (default GPU_PIPELINE_LAKE or data/lake)")
    su.set_defaults(fn=cmd_summary)


def _add_pull(sub) -> None:
    """The `pull` and `sample` commands: telemetry into the landing zone."""
    pu = _command(
        sub,
        "pull",
        help="fetch UTC days from a Prometheus-compatible server",
    )
    pu.add_argument("--start", type=_day, required=True, help="first UTC day (YYYY-MM-DD)")
    pu.add_argument("--end", type=_day, help="last UTC day (default: --start)")
    pu.add_argument("--url", help="server URL (default GPU_PIPELINE_PROM_URL)")
    pu.add_argument("--raw", help="landing folder (default GPU_PIPELINE_RAW or data/raw)")
    pu.set_defaults(fn=cmd_pull)
    sa = _command(sub, "sample", help="sample local GPUs through NVML into the landing zone")
    sa.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (0.1 = 10 Hz)"
    )
    sa.add_argument("--duration", type=float, default=60.0, help="seconds to sample for")
    sa.add_argument("--out", help="folder (default <landing>/nvml)")
    sa.set_defaults(fn=cmd_sample)


def _add_report(sub, reports: str) -> None:
    """The `report` command (writing into `reports` without --out) and `init-instance`."""
    r = _command(sub, "report", help="write the day's self-contained HTML report")
    r.add_argument("--date", type=_day, required=True, help="the UTC day (YYYY-MM-DD)")
    r.add_argument("--lake", help="lake root (default GPU_PIPELINE_LAKE or data/lake)")
    r.add_argument(
        "--prices",
        help="price book CSV the day was materialized with (default GPU_PIPELINE_PRICES or the "
        "shipped one)",
    )
    r.add_argument(
        "--out",
        help=f"file (default {reports}/gpu_report_DATE.html; with --lake, in that lake's reports)",
    )
    r.set_defaults(fn=cmd_report)
    sb = _command(sub, "showback", help="write a month's per-namespace showback (CSV or xlsx)")
    sb.add_argument("--month", type=_month, required=True, help="the UTC month (YYYY-MM)")
    sb.add_argument(
        "--format", choices=["csv", "xlsx"], default="csv", help="file format (default %(default)s)"
    )
    sb.add_argument("--lake", help="lake root (default GPU_PIPELINE_LAKE or data/lake)")
    sb.add_argument(
        "--out",
        help=f"file (default {reports}/showback_MONTH.FORMAT; with --lake, in that lake's reports)",
    )
    sb.set_defaults(fn=cmd_showback)
    i = _command(sub, "init-instance", help="create DAGSTER_HOME with the project's dagster.yaml")
    i.set_defaults(fn=cmd_init_instance)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-pipeline",
        description="GPU telemetry in a landing folder, cost and efficiency marts out: a Parquet "
        "lake, DuckDB SQL, the Dagster asset graph.",
        epilog="new here? make demo, then: gpu-pipeline <command> --help",
        formatter_class=_CommandsFormatter,
    )
    from gpu_pipeline import __version__

    p.add_argument("--version", action="version", version=f"gpu-pipeline {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, title="commands", metavar="<command>")
    try:
        start = date.fromisoformat(settings.current().start_date)
        # the folder `report` writes to without --out (argparse reads % in help as a format)
        reports = str(settings.reports_dir(settings.current().lake)).replace("%", "%%")
    except settings.SettingsError:  # --help still works; a command is refused by main()
        start = date.fromisoformat(settings.DEFAULT_START_DATE)
        reports = "<lake>/_reports"

    _add_generate(sub, start)
    _add_materialize(sub)
    _add_queries(sub)
    _add_pull(sub)
    _add_report(sub, reports)
    return p


def _quiet_db_retries(record) -> bool:
    """Drops dagster-postgres's warning per failed connection attempt (four lines each, with
    SQLAlchemy's link): a database that cannot be reached is said once, in `main`."""
    return not str(record.msg).startswith("Retrying failed database connection")


def _postgres_of_instance() -> dict[str, str] | None:
    """The Postgres the Dagster instance (DAGSTER_HOME/dagster.yaml) keeps its runs in: host,
    port, database, user and password (`{env: NAME}` values read from the environment), or None
    when it has none (SQLite) or its file cannot be read."""
    import yaml

    try:
        cfg = yaml.safe_load((settings.dagster_home() / "dagster.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(cfg, dict):
        return None
    found = [(cfg.get("storage") or {}).get("postgres")]
    found += [(cfg.get(k) or {}).get("config") for k in ("run_storage", "event_log_storage")]
    pg = next((c for c in found if isinstance(c, dict)), None)
    if pg is None:
        return None

    def value(v) -> str:
        return os.environ.get(v["env"], "") if isinstance(v, dict) and "env" in v else str(v or "")

    if "postgres_url" in pg:
        from sqlalchemy.engine import make_url

        try:
            url = make_url(value(pg["postgres_url"]))
        except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot read: nothing to name
            return {"host": "?", "port": "?", "db": "?", "user": "?", "password": ""}
        return {"host": url.host or "", "port": str(url.port or 5432), "db": url.database or "",
                "user": url.username or "", "password": url.password or ""}  # fmt: skip
    db = pg.get("postgres_db") or {}
    fields = {"host": "hostname", "port": "port", "db": "db_name", "user": "username"}
    out = {k: value(db.get(f)) for k, f in fields.items()} | {"password": value(db.get("password"))}
    return out | {"port": out["port"] or "5432"}


def _instance_db_error(e: BaseException) -> str | None:
    """One line for an error that is the Dagster instance's Postgres not answering or refusing
    the login (after dagster-postgres's retries): where (host, port, database, user, never the
    password) and the server's or driver's first line. None for any other error."""
    chain, cur = [], e
    while cur is not None and len(chain) < 32:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    pg_error = getattr(sys.modules.get("dagster_postgres.utils"), "DagsterPostgresException", ())
    sa = sys.modules.get("sqlalchemy.exc")
    op = next((x for x in chain if sa and isinstance(x, sa.OperationalError)), None)
    if op is None and not any(pg_error and isinstance(x, pg_error) for x in chain):
        return None
    pg = _postgres_of_instance()
    if pg is None:
        return None  # a SQLite instance's error: not this one
    why = str(getattr(op, "orig", None) or op or e).strip().splitlines()
    why = " ".join(why[0].split()) if why else type(e).__name__
    for secret in {pg["password"], quote(pg["password"], safe="")} - {""}:
        why = why.replace(secret, "***")
    return (
        f"the Dagster instance's Postgres database {pg['db']!r} at {pg['host']}:{pg['port']} "
        f"(user {pg['user']!r}) cannot be used: {why} (DAGSTER_HOME={settings.dagster_home()}; "
        "check DAGSTER_PG_HOST, DAGSTER_PG_PORT, DAGSTER_PG_DB, DAGSTER_PG_USERNAME and "
        "DAGSTER_PG_PASSWORD)"
    )


def main(argv: list[str] | None = None) -> int:
    import logging

    a = parser().parse_args(argv)
    logging.getLogger().addFilter(_quiet_db_retries)
    try:
        # every GPU_PIPELINE_* variable, checked once before any command reads one
        settings.current()
        return a.fn(a)
    except ValueError as e:
        from gpu_pipeline.lib.io.lake import DamagedPartition
        from gpu_pipeline.lib.reference import ReferenceError
        from gpu_pipeline.lib.rules import RulesError

        if isinstance(e, DamagedPartition):  # a lake file that is not Parquet: which, and why
            _say(f"error: {e}")
            return 1
        # settings, rules and reference files that do not hold: one line per problem
        if not isinstance(e, settings.SettingsError | RulesError | ReferenceError):
            raise
        for line in str(e).splitlines():
            _say(f"error: {line}")
        return 2
    except BrokenPipeError:  # `gpu-pipeline sql ... | head`: the reader has gone, not an error
        return 0
    except Exception as e:
        line = _instance_db_error(e)  # Postgres down, or a wrong password: one line, not ~190
        if line is None:
            raise
        _say(f"error: {line}")
        return 1


def run() -> None:
    """The command (`gpu-pipeline`, `python -m gpu_pipeline.cli`): `main`, then out without the
    interpreter's teardown. Everything is written and closed by then; what the teardown would
    do is free, object by object, what a day's run left (the Dagster definitions, the
    allocators' kept buffers): about a second on the 1,000-GPU day (benchmarks/README.md)."""
    import logging

    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):
            stream.flush()
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
