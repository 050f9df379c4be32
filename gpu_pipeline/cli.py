"""`gpu-pipeline`: generate, materialize, sql, summary, init-instance."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from gpu_pipeline import settings

REPO_ROOT = Path(__file__).resolve().parents[1]
# Dagster logs every step at DEBUG on the console; the CLI prints its own progress lines
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _day(s: str) -> date:
    try:
        return date.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {s!r}") from None


def _say(msg: str) -> None:
    print(msg, flush=True)


def init_instance() -> Path:
    """Create DAGSTER_HOME with the project's instance config if it has none."""
    home = settings.dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        shutil.copyfile(REPO_ROOT / "config" / "dagster.yaml", cfg)
    return home


def cmd_generate(a: argparse.Namespace) -> int:
    from gpu_pipeline.lib.generate import generate

    out = Path(a.out or settings.raw_root())
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


def _set_env(a: argparse.Namespace) -> None:
    for flag, var in (
        ("raw", "GPU_PIPELINE_RAW"),
        ("lake", "GPU_PIPELINE_LAKE"),
        ("prices", "GPU_PIPELINE_PRICES"),
    ):
        v = getattr(a, flag, None)
        if v:
            os.environ[var] = str(Path(v).resolve()) if flag != "lake" or "://" not in v else v


def cmd_materialize(a: argparse.Namespace) -> int:
    _set_env(a)
    end = a.end or a.start
    if end < a.start:
        _say(f"error: --end {end} is before --start {a.start}")
        return 2
    if a.prices and not Path(a.prices).is_file():
        _say(f"error: price book not found: {a.prices}")
        return 2
    first = date.fromisoformat(settings.start_date())
    if a.start < first:
        # partitions are built from this variable when the definitions load, just below
        os.environ["GPU_PIPELINE_START_DATE"] = a.start.isoformat()
        _say(
            f"note: partitions start at {a.start} for this command (GPU_PIPELINE_START_DATE was {first})"
        )
    init_instance()
    import dagster as dg

    from gpu_pipeline.definitions import build_definitions

    defs = build_definitions()
    job = defs.resolve_job_def("daily_pipeline")
    t0 = time.perf_counter()
    _warm_parse_cache()
    days = [a.start + timedelta(days=i) for i in range((end - a.start).days + 1)]
    _say(
        f"materializing {len(days)} day(s) {a.start}..{end}: raw={settings.raw_root()} lake={settings.lake_root()}"
    )
    with dg.DagsterInstance.get() as instance:
        # one run for the whole range, as a backfill from the UI runs it (single-run backfill
        # policy): every asset loops over the days, and Dagster's per-run cost is paid once
        t = time.perf_counter()
        res = job.execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_config=QUIET,
            tags={
                "dagster/asset_partition_range_start": days[0].isoformat(),
                "dagster/asset_partition_range_end": days[-1].isoformat(),
            },
        )
        status = "ok" if res.success else "FAILED"
        _say(
            f"  {days[0]}..{days[-1]}  {status}  run {res.run_id[:8]}  {time.perf_counter() - t:.1f}s"
        )
        if not res.success:
            for ev in res.all_events:
                if ev.is_failure and ev.step_failure_data:
                    _say(f"    {ev.step_key}: {ev.step_failure_data.error.message.strip()[:500]}")
            return 1
        db = settings.warehouse_path()
        # the views glob the lake at query time: the file is written once per lake, by its asset
        if not db.is_file() or not _views_match(db, settings.lake_root()):
            res = defs.resolve_job_def("refresh_warehouse").execute_in_process(
                instance=instance, raise_on_error=False, run_config=QUIET
            )
            if not res.success:
                _say(
                    f"  note: views file {db} not written; `gpu-pipeline sql` still works without it"
                )
    _say(f"done in {time.perf_counter() - t0:.1f}s; lake {settings.lake_root()}, views {db}")
    if a.summary:
        _print_summary(a.start, end)
        _say(
            "\nLook further:\n"
            "  gpu-pipeline sql -f sql/queries/top_wasted_namespaces.sql\n"
            "  gpu-pipeline sql -f sql/queries/persistent_offenders.sql\n"
            "  gpu-pipeline sql -f sql/queries/fleet_trend.sql\n"
            '  gpu-pipeline sql "SELECT * FROM fleet_daily ORDER BY date"\n'
            f"  report for {end}: {settings.reports_dir() / f'gpu_report_{end.isoformat()}.html'}\n"
            f"  duckdb -readonly {db}        (any DuckDB client; views only)\n"
            "  make dev                      (Dagster UI: runs, partitions, backfills)"
        )
    return 0


def _warm_parse_cache() -> None:
    """Parse new landing files up front, with progress; the runs then read the cache."""
    from gpu_pipeline.lib.ingest import hash_memo, is_cached, list_landing, load_or_parse
    from gpu_pipeline.lib.lake import Lake

    cache = Lake(settings.lake_root()).cache_dir
    todo = [
        f for f in list_landing(settings.raw_root(), hash_memo(cache)) if not is_cached(f, cache)
    ]
    if not todo:
        return
    total = sum(f.size for f in todo)
    _say(f"parsing {len(todo)} new landing file(s), {total / 2**20:,.0f} MiB")
    t, done, step = time.perf_counter(), 0, max(1, len(todo) // 10)
    for i, f in enumerate(todo, 1):
        load_or_parse(f, cache)
        done += f.size
        if i % step == 0 or i == len(todo):
            rate = done / 2**20 / max(time.perf_counter() - t, 1e-9)
            _say(f"  parsed {i}/{len(todo)} files ({rate:,.0f} MiB/s)")


def _print_summary(start: date, end: date) -> None:
    from gpu_pipeline.lib.lake import Lake
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    _say("")
    _say(format_summary(fleet_summary(Lake(settings.lake_root()), start, end), start, end))


def cmd_summary(a: argparse.Namespace) -> int:
    _set_env(a)
    _print_summary(a.start, a.end or a.start)
    return 0


def cmd_sql(a: argparse.Namespace) -> int:
    _set_env(a)
    from gpu_pipeline.lib.warehouse import SqlError, connect_readonly, run_query

    if a.file:
        try:
            query = Path(a.file).read_text()
        except OSError as e:
            _say(f"error: cannot read {a.file}: {e.strerror}")
            return 2
    elif a.query:
        query = a.query
    else:
        query = sys.stdin.read()
    lake = settings.lake_root()
    db = settings.warehouse_path(lake)
    if a.lake and db.is_file() and not _views_match(db, lake):
        db = Path("/nonexistent/views.duckdb")  # another lake's views: build them in memory instead
    try:
        con = connect_readonly(lake, db)
        rel = run_query(con, query)
    except SqlError as e:
        _say(f"error: {e}")
        return 2
    if rel is None:
        return 0
    if a.format == "table":
        rel.show(max_width=200, max_rows=200)
    else:
        import polars as pl

        df: pl.DataFrame = rel.pl()
        sys.stdout.write(df.write_csv() if a.format == "csv" else df.write_json() + "\n")
    return 0


def cmd_sample(a: argparse.Namespace) -> int:
    from gpu_pipeline.lib.nvml import NvmlUnavailable, PynvmlBackend, sample

    out = Path(a.out or Path(settings.raw_root()) / "nvml")
    try:
        path = sample(PynvmlBackend(), a.interval, a.duration, out)
    except (NvmlUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    _say(f"wrote {path}")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    _set_env(a)
    from gpu_pipeline.lib.lake import Lake
    from gpu_pipeline.lib.report import build_report

    try:
        rep = build_report(Lake(settings.lake_root()), a.date)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = Path(a.out or settings.reports_dir() / f"gpu_report_{a.date.isoformat()}.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(rep.html)
    _say(f"wrote {out} ({len(rep.charts)} charts)")
    return 0


def _views_match(db: Path, lake: str) -> bool:
    """Does the views file point at this lake?"""
    import duckdb

    try:
        with duckdb.connect(str(db), read_only=True) as con:
            sql = con.execute(
                "SELECT sql FROM duckdb_views() WHERE view_name = 'gpu_minutes'"
            ).fetchone()
    except duckdb.Error:
        return False
    return bool(sql) and str(Path(lake).resolve()) in sql[0]


def cmd_init_instance(_: argparse.Namespace) -> int:
    _say(f"DAGSTER_HOME={init_instance()}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-pipeline", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    start = date.fromisoformat(settings.start_date())

    g = sub.add_parser(
        "generate", help="write a synthetic fleet's dcgm-exporter scrapes into the landing zone"
    )
    g.add_argument("--start", type=_day, default=start)
    g.add_argument("--days", type=int, default=7)
    g.add_argument("--gpus", type=int, default=50)
    g.add_argument("--clusters", type=int, default=3)
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--format", default="prom", choices=["prom", "prom.gz", "prom-json", "smi-csv"])
    g.add_argument("--out", help="landing folder (default GPU_PIPELINE_RAW or data/raw)")
    g.set_defaults(fn=cmd_generate)

    m = sub.add_parser("materialize", help="run every asset for the given UTC days through Dagster")
    m.add_argument("--start", type=_day, required=True)
    m.add_argument("--end", type=_day)
    m.add_argument("--raw")
    m.add_argument("--lake")
    m.add_argument("--prices")
    m.add_argument("--summary", action="store_true", help="print the fleet summary afterwards")
    m.set_defaults(fn=cmd_materialize)

    s = sub.add_parser("sql", help="read-only DuckDB SQL over the marts (views of sql/views.sql)")
    s.add_argument("query", nargs="?")
    s.add_argument("-f", "--file")
    s.add_argument("--lake")
    s.add_argument("--format", choices=["table", "csv", "json"], default="table")
    s.set_defaults(fn=cmd_sql)

    su = sub.add_parser("summary", help="print the fleet summary for a range of days")
    su.add_argument("--start", type=_day, required=True)
    su.add_argument("--end", type=_day)
    su.add_argument("--lake")
    su.set_defaults(fn=cmd_summary)

    sa = sub.add_parser("sample", help="sample local GPUs through NVML into the landing zone")
    sa.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (0.1 = 10 Hz)"
    )
    sa.add_argument("--duration", type=float, default=60.0, help="seconds to sample for")
    sa.add_argument("--out", help="folder (default <landing>/nvml)")
    sa.set_defaults(fn=cmd_sample)

    r = sub.add_parser("report", help="write the day's self-contained HTML report")
    r.add_argument("--date", type=_day, required=True)
    r.add_argument("--lake")
    r.add_argument("--out", help="file (default data/reports/gpu_report_<date>.html)")
    r.set_defaults(fn=cmd_report)

    i = sub.add_parser("init-instance", help="create DAGSTER_HOME with the project's dagster.yaml")
    i.set_defaults(fn=cmd_init_instance)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
