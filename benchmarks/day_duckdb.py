"""The DuckDB peer of `make bench-day`: runs benchmarks/day_duckdb.sql over a landing zone.

    python benchmarks/day_duckdb.py RAW OUT DAY [REFERENCE]

Writes OUT/gpu_minutes.parquet, OUT/hourly_fleet_metrics.parquet and OUT/priced_waste.parquet
for the UTC day DAY (YYYY-MM-DD) from the dcgm-exporter scrapes under RAW, the catalog and price
book read from REFERENCE (gpu_pipeline/reference by default). Imports nothing but DuckDB (not
gpu_pipeline, not Polars): its process is what a user's DuckDB script would be, so its wall time
and peak RSS (measured by benchmarks/day.py with wait4) are DuckDB's own. Prints the seconds.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path
from string import Template

import duckdb

HERE = Path(__file__).resolve().parent
SQL = HERE / "day_duckdb.sql"
REFERENCE = HERE.parent / "gpu_pipeline" / "reference"


def sql(raw: Path, out: Path, day: date, reference: Path, threads: int) -> str:
    start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
    for p in (raw, out, reference):
        if "'" in str(p):
            raise SystemExit(f"day_duckdb: a path with a quote is not supported: {p}")
    return Template(SQL.read_text()).substitute(
        raw=str(raw).rstrip("/"),
        out=str(out),
        reference=str(reference),
        threads=threads,
        day_start_ms=start,
        day_end_ms=start + 86_400_000,
    )


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    raw, out = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    day = date.fromisoformat(argv[2])
    reference = Path(argv[3]).resolve() if len(argv) == 4 else REFERENCE
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute(sql(raw, out, day, reference, os.cpu_count() or 1))
    con.close()
    print(f"{time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
