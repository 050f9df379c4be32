"""Compare the DuckDB peer's tables (benchmarks/day_duckdb.sql) with gpu_pipeline's lake.

    python benchmarks/day_compare.py LAKE PEER_OUT DAY

On the columns both compute: the same rows (gpu_minutes joined on gpu_uuid and minute,
hourly_fleet_metrics on hour, cluster and gpu_model, priced_waste on cluster, namespace and
gpu_model), numbers equal within 1e-6 relative, labels and categories equal. Prints the largest
difference per column; exits 1 with one line per difference when they differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.money import MONEY
from gpu_pipeline.lib.rules import PHASES

REL = 1e-6
# table -> (join keys, numeric columns, exact columns: labels, categories, counts)
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "gpu_minutes": (
        ("gpu_uuid", "minute"),
        (
            "gpu_util_pct",
            "power_w",
            "max_power_w",
            "pif",
            "achievable_tflops",
            "realized_tflops",
            "rfu_pct",
            "efficiency_gap_pct",
            "price_usd_per_hour",
            *[f"phase_share_{p}" for p in PHASES],
            "gpu_share",
            "gpu_temp_c",
            "fb_used_mib",
            "prof_sm_active",
            "prof_sm_occupancy",
            "prof_pipe_tensor_active",
            "prof_dram_active",
            "pcie_rx_bytes_per_s",
            "nvlink_rx_bytes_per_s",
        ),
        (
            "hostname",
            "cluster",
            "namespace",
            "pod",
            "gpu_model",
            "util_source",
            "max_power_basis",
            "phase",
            "efficiency_class",
            "diagnosis",
            "diagnosis_basis",
        ),
    ),
    "hourly_fleet_metrics": (
        ("hour", "cluster", "gpu_model"),
        (
            "avg_gpu_util_pct",
            "avg_pif",
            "avg_rfu_pct",
            "avg_efficiency_gap_pct",
            "avg_realized_tflops",
            *[f"pct_{p}" for p in PHASES],
        ),
        ("gpus", "gpu_minutes"),
    ),
    "priced_waste": (
        ("cluster", "namespace", "gpu_model"),
        (
            "gpu_hours",
            "price_usd_per_hour",
            *MONEY,
            "total_waste_usd",
            "waste_frac",
            "hourly_waste_usd",
            "monthly_waste_usd",
            "yearly_waste_usd",
        ),
        ("gpus",),
    ),
}


def _normalized(df: pl.DataFrame, keys: tuple[str, ...], cols: list[str]) -> pl.DataFrame:
    """Keys and columns only, times as epoch milliseconds, categories as strings."""
    out = []
    for c in (*keys, *cols):
        s = df.get_column(c)
        if s.dtype == pl.Datetime or isinstance(s.dtype, pl.Datetime):
            s = s.dt.epoch("ms")
        elif s.dtype in (pl.Categorical,) or isinstance(s.dtype, pl.Enum):
            s = s.cast(pl.String)
        elif s.dtype.is_integer():
            s = s.cast(pl.Int64)
        out.append(s)
    return pl.DataFrame(out)


# rows of a table compared at a time: gpu_minutes of a 10,000-GPU day (14.4 M rows, both sides
# joined) does not fit in memory at once, so it is compared a hash-range of GPUs at a time
PART_ROWS = 2_000_000


def _part_stats(a: pl.DataFrame, b: pl.DataFrame, keys, numeric, exact) -> dict:
    """Row counts, and per column the largest relative difference and the rows that differ, of
    one part of a table (`a` ours, `b` the peer's)."""
    j = a.join(b, on=list(keys), how="inner", suffix="_peer", nulls_equal=True)
    out = {"a": a.height, "b": b.height, "j": j.height}
    for c in numeric:
        x, y = pl.col(c).cast(pl.Float64), pl.col(f"{c}_peer").cast(pl.Float64)
        scale = pl.max_horizontal(x.abs(), y.abs())
        rel = pl.when(x == y).then(0.0).otherwise((x - y).abs() / scale)
        out[c] = j.select(
            rel.max().alias("max_rel"),
            (x.is_null() != y.is_null()).sum().alias("nulls"),
            (rel > REL).sum().alias("bad"),
            x.is_null().sum().alias("ours_null"),
        ).row(0, named=True)
    for c in exact:
        out[c] = j.select((pl.col(c).ne_missing(pl.col(f"{c}_peer"))).sum()).item()
    return out


def _add(total: dict, part: dict) -> dict:
    if not total:
        return part
    for k, v in part.items():
        if isinstance(v, dict):
            t = total[k]
            t["max_rel"] = max(t["max_rel"] or 0.0, v["max_rel"] or 0.0)
            for n in ("nulls", "bad", "ours_null"):
                t[n] += v[n]
        else:
            total[k] += v
    return total


def compare(lake: Path, peer: Path, day: str) -> list[str]:
    problems: list[str] = []
    for table, (keys, numeric, exact) in TABLES.items():
        ours_file = lake / table / f"date={day}" / "data.parquet"
        peer_file = peer / f"{table}.parquet"
        cols = list(numeric + exact)
        ours_n = pl.scan_parquet(ours_file).select(pl.len()).collect().item()
        parts = max(1, -(-ours_n // PART_ROWS)) if "gpu_uuid" in keys else 1
        total: dict = {}
        for p in range(parts):
            part = pl.col("gpu_uuid").hash() % parts == p if parts > 1 else pl.lit(True)
            ours = pl.scan_parquet(ours_file).filter(part).collect()
            if "gpu_instance_id" in ours.columns and ours["gpu_instance_id"].is_not_null().any():
                problems.append(
                    f"{table}: the lake has MIG instance rows, which the peer does not make"
                )
            a = _normalized(ours, keys, cols)
            del ours
            b = _normalized(pl.scan_parquet(peer_file).filter(part).collect(), keys, cols)
            total = _add(total, _part_stats(a, b, keys, numeric, exact))
            del a, b
        line = f"  {table}: rows ours {total['a']:,}, peer {total['b']:,}, "
        print(line + f"matched on keys {total['j']:,}")
        if not (total["a"] == total["b"] == total["j"]):
            problems.append(
                f"{table}: row counts differ (ours {total['a']:,}, peer {total['b']:,}, "
                f"{total['j']:,} matched on {', '.join(keys)})"
            )
        diffs = []
        for c in numeric:
            r = total[c]
            max_rel = r["max_rel"] or 0.0
            diffs.append(
                f"{c} {max_rel:.1e}" + (" (all null)" if r["ours_null"] == total["j"] else "")
            )
            if r["nulls"] or r["bad"]:
                problems.append(
                    f"{table}.{c}: {r['bad']:,} rows differ by more than {REL:g} relative "
                    f"(max {max_rel:.3g}), {r['nulls']:,} null on one side only"
                )
        for c in exact:
            bad = total[c]
            diffs.append(f"{c} {'=' if not bad else f'{bad:,} differ'}")
            if bad:
                problems.append(f"{table}.{c}: {bad:,} rows differ")
        print("    max relative difference: " + ", ".join(diffs))
    return problems


def main(argv: list[str]) -> int:
    lake, peer, day = Path(argv[0]), Path(argv[1]), argv[2]
    problems = compare(lake, peer, day)
    for p in problems:
        print(f"  DIFFERS: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
