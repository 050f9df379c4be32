"""`make bench`: each stage against its references on the same input, in one run.

Stages run in fresh processes (spawn) so each reports its own peak RSS; times are best of N.
Prints a table, then one line:
bench: parse_x_prometheus_client=… parse_x_read_lines=… marts_x_duckdb=… marts_x_pandas=… peak_rss_mib=…
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
EXPO = OUT / "fleet_hour.prom"
PROM_CLIENT_LINES = 240_000  # prometheus_client reads ~20k lines/s: it and we both get this slice


def _best(fn, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_lines(path: str) -> tuple[float, float]:
    import polars as pl

    t = _best(
        lambda: pl.read_csv(
            path, has_header=False, separator="\x1f", quote_char=None, infer_schema=False
        ),
        5,
    )
    return t, _rss_mib()


def parse_ours(path: str) -> tuple[float, float]:
    from gpu_pipeline.lib.formats.common import Context
    from gpu_pipeline.lib.formats.exposition import parse

    out = parse(Path(path), Context(path))
    assert out.quarantine.height == 0 and out.samples.height > 0
    return _best(lambda: parse(Path(path), Context(path)), 5), _rss_mib()


def parse_slice_ours(path: str) -> tuple[float, float]:
    from gpu_pipeline.lib.formats.common import Context
    from gpu_pipeline.lib.formats.exposition import parse

    with open(path, "rb") as f:
        data = b"".join(f.readlines()[:PROM_CLIENT_LINES])
    return _best(lambda: parse(data, Context(path)), 3), _rss_mib()


def parse_slice_prometheus_client(path: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with open(path, "rb") as f:
        text = b"".join(f.readlines()[:PROM_CLIENT_LINES]).decode()

    def run():
        n = sum(len(f.samples) for f in text_string_to_metric_families(text))
        assert n == PROM_CLIENT_LINES

    return _best(run, 1), _rss_mib()


def _minutes(gpus: int):
    sys.path.insert(0, str(HERE))
    from data import gpu_minutes_day

    return gpu_minutes_day(gpus)


def marts_ours(gpus: int) -> tuple[float, float]:
    import polars as pl

    from gpu_pipeline.lib.marts import hourly_fleet_metrics, priced_waste
    from gpu_pipeline.lib.metrics import gpu_daily, gpu_minutes
    from gpu_pipeline.lib.reference import load_catalog, load_prices
    from gpu_pipeline.lib.samples import collect_stable

    samples = _minutes(gpus)
    catalog, prices = load_catalog(), load_prices()

    def run():
        lf = gpu_minutes(samples.lazy(), catalog, prices, already_minutes=True, mig=False)
        m = collect_stable(lf).lazy()
        marts = [f(m) for f in (hourly_fleet_metrics, priced_waste, gpu_daily)]
        out = pl.collect_all(marts, engine="in-memory")
        assert out[0].height > 0

    return _best(run, 3), _rss_mib()


def marts_duckdb(gpus: int) -> tuple[float, float]:
    sys.path.insert(0, str(HERE))
    from references import duckdb_marts

    samples = _minutes(gpus)
    return _best(lambda: duckdb_marts(samples), 3), _rss_mib()


def marts_pandas(gpus: int) -> tuple[float, float]:
    sys.path.insert(0, str(HERE))
    from references import pandas_marts

    df = _minutes(gpus).to_pandas()
    return _best(lambda: pandas_marts(df), 1 if gpus > 5000 else 2), _rss_mib()


def stage(fn, *args) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args)


def main() -> int:
    sys.path.insert(0, str(HERE))
    from data import exposition_hour

    if not EXPO.is_file():
        print("generating a fleet-hour of exposition (2,000 GPUs, 30 s, ten fields)…", flush=True)
        exposition_hour(EXPO)
    with open(EXPO, "rb") as f:
        n_lines = sum(1 for _ in f)
    rows = []

    def record(name: str, what: str, t: float, rss: float, n: int):
        rows.append((name, what, t, rss, n))
        print(
            f"  {name:<28} {what:<26} {t:8.3f} s  {n / t:>12,.0f} rows/s  peak {rss:7.0f} MiB",
            flush=True,
        )

    p = str(EXPO)
    record("read lines (Polars)", f"{n_lines:,} lines", *stage(read_lines, p), n_lines)
    record("parse (gpu_pipeline)", f"{n_lines:,} lines", *stage(parse_ours, p), n_lines)
    record(
        "parse slice (gpu_pipeline)",
        f"{PROM_CLIENT_LINES:,} lines",
        *stage(parse_slice_ours, p),
        PROM_CLIENT_LINES,
    )
    record(
        "parse slice (prometheus_client)",
        f"{PROM_CLIENT_LINES:,} lines",
        *stage(parse_slice_prometheus_client, p),
        PROM_CLIENT_LINES,
    )
    for gpus in (2000, 10000):
        n = gpus * 1440
        for name, fn in (
            ("marts (gpu_pipeline)", marts_ours),
            ("marts (DuckDB SQL)", marts_duckdb),
            ("marts (pandas)", marts_pandas),
        ):
            record(name, f"{gpus:,} GPUs, {n:,} GPU-min", *stage(fn, gpus), n)

    t = {(r[0], r[1]): r[2] for r in rows}
    rss = {(r[0], r[1]): r[3] for r in rows}
    lines = f"{n_lines:,} lines"
    sl = f"{PROM_CLIENT_LINES:,} lines"
    big = "10,000 GPUs, 14,400,000 GPU-min"
    ratios = {
        "parse_x_prometheus_client": t[("parse slice (prometheus_client)", sl)]
        / t[("parse slice (gpu_pipeline)", sl)],
        "parse_x_read_lines": t[("parse (gpu_pipeline)", lines)]
        / t[("read lines (Polars)", lines)],
        "marts_x_duckdb": t[("marts (DuckDB SQL)", big)] / t[("marts (gpu_pipeline)", big)],
        "marts_x_pandas": t[("marts (pandas)", big)] / t[("marts (gpu_pipeline)", big)],
    }
    peak = max(v for k, v in rss.items() if k[0].endswith("(gpu_pipeline)"))
    print()
    print(
        "targets: parse_x_prometheus_client >= 50, parse_x_read_lines <= 3, marts_x_duckdb > 1, "
        "marts_x_pandas >= 4, peak_rss_mib < 3072 (10,000-GPU day)"
    )
    print(
        "bench: "
        + " ".join(f"{k}={v:.2f}" for k, v in ratios.items())
        + f" peak_rss_mib={peak:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
