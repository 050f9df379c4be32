"""gpu_minutes -> minute runs: per GPU and hour, every sum, count, share and cost the minute-level
tables need (one group-by). gpu_daily, hourly_fleet_metrics and priced_waste are computed from
the runs, so a day processed in GPU chunks gives the tables of the day processed at once."""

from __future__ import annotations

import functools

import numpy as np
import polars as pl

from gpu_pipeline.lib.money import MONEY, minute_costs, minute_energy_wh
from gpu_pipeline.lib.rules import (
    CLASS_ENUM,
    DEFAULT,
    EFFICIENCY_CLASSES,
    PHASE_ENUM,
    PHASES,
    Thresholds,
)
from gpu_pipeline.lib.samples import (
    HOUR_MS,
    PHYSICAL,
    collect_stable,
    floor_ms,
    phase_share,
)
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA

# Marts over GPU-minutes are built from minute runs: consecutive minutes of one GPU within one
# hour whose attributes do not change, summed and counted once. Runs add up exactly over
# disjoint sets of GPUs, so a day processed in GPU chunks (gpu_pipeline.lib.staging.chunked) and a day
# processed at once give the same tables; on minutes in the lake's order (GPU, then time) a
# day of 1,440 rows per GPU becomes about 24 runs, and every mart is a small group-by of them.
HOURLY_KEYS = ("date", "hour", "cluster", "gpu_model")


HOURLY_MEANS = {
    "gpu_util_pct": "avg_gpu_util_pct",
    "pif": "avg_pif",
    "rfu_pct": "avg_rfu_pct",
    "efficiency_gap_pct": "avg_efficiency_gap_pct",
    "realized_tflops": "avg_realized_tflops",
}


RUN_KEYS = ("date", "gpu_uuid", "gpu_instance_id", "cluster", "gpu_model", "namespace", "hostname")


_COUNT, _SUM = pl.UInt32, pl.Float64
# the columns of a run, in order: its key, then what it adds up
RUNS_SCHEMA = {
    **{c: GPU_MINUTES_SCHEMA[c] for c in RUN_KEYS},
    "hour": GPU_MINUTES_SCHEMA["minute"],
    "_last_minute": GPU_MINUTES_SCHEMA["minute"],
    "_minutes": _COUNT,
    "_share": _SUM,
    **{f"_sum_{c}": _SUM for c in HOURLY_MEANS},
    **{f"_n_{c}": _COUNT for c in HOURLY_MEANS},
    **{f"_n_{p}": _COUNT for p in PHASES},
    "_n_phase": _COUNT,
    **{f"_sh_{p}": _SUM for p in PHASES},
    **{f"_c_{c}": _COUNT for c in EFFICIENCY_CLASSES},
    "_active": _COUNT,
    "price_usd_per_hour": _SUM,
    "_priced": pl.Boolean,
    "_energy_wh": _SUM,
    "_idle_energy_wh": _SUM,
    **{c: _SUM for c in MONEY},
}


def _sums(columns: list[str]) -> dict[str, pl.Expr]:
    """What each minute adds to its run's sums, by run column (null adds nothing)."""
    energy = minute_energy_wh(columns).fill_null(0.0)  # Wh of the minute
    return {
        "_share": pl.col("gpu_share").fill_null(1.0),
        **{f"_sum_{c}": pl.col(c).fill_null(0.0) for c in HOURLY_MEANS},
        # sub-minute phase shares summed: the hourly phase shares
        **{f"_sh_{p}": phase_share(columns, p).fill_null(0.0) for p in PHASES},
        # energy of the physical GPU, on its row (`energy_wh`: the counter's increase, else
        # mean W x 1 min; an instance's row would count the GPU again)
        "_energy_wh": pl.when(PHYSICAL).then(energy).otherwise(0.0),
        "_idle_energy_wh": pl.when(PHYSICAL & pl.col("phase").eq_missing("idle"))
        .then(energy)
        .otherwise(0.0),
        **{c: pl.col(c).fill_null(0.0) for c in MONEY},
    }


# the categories counted per run: (column, its categories, run column prefix)
_COUNTED = (
    ("phase", PHASE_ENUM, PHASES, "_n_"),
    ("efficiency_class", CLASS_ENUM, EFFICIENCY_CLASSES, "_c_"),
)


class _Segments:
    """Runs as contiguous slices of a frame's rows (`at`: the row each starts at)."""

    def __init__(self, starts: pl.Series):
        self.rows = starts.len()
        self.at = np.flatnonzero(starts.to_numpy())
        self.lengths = np.diff(np.append(self.at, self.rows)).astype(np.uint32)

    def sum(self, s: pl.Series) -> np.ndarray:
        """Per-run sums of a column without nulls (a float's, or a boolean's count of true)."""
        x = s.to_numpy()
        return np.add.reduceat(x, self.at, dtype=np.uint32 if x.dtype == np.bool_ else None)

    def non_null(self, s: pl.Series) -> np.ndarray:
        """Per-run counts of a column's values that are not null."""
        if not s.null_count():
            return self.lengths
        return self.lengths - np.add.reduceat(s.is_null().to_numpy(), self.at, dtype=np.uint32)

    def categories(self, codes: pl.Series, k: int) -> list[np.ndarray]:
        """Per-run counts of each of the codes 0 .. k-1 (an Enum's physical codes, null made k:
        counted in none): one segment sum of a 0/1 array per code (faster than a 2-D
        `bincount` over run ids)."""
        c = codes.to_numpy()
        return [np.add.reduceat(c == i, self.at, dtype=np.uint32) for i in range(k)]


@functools.cache
def _per_minute(
    columns: tuple[str, ...], t: Thresholds
) -> tuple[tuple[pl.Expr, ...], tuple[str, ...]]:
    """What `minute_runs` takes of each minute (whether it starts a run, its keys, values and
    what it adds to its run's sums), and the names of the sums: built once per set of columns
    and thresholds, not once per chunk (~300 expressions built in Python: ~4 ms a chunk, a
    tenth of a 10,000-GPU staging pass's time; benchmarks/README.md, issue 34). Expressions are
    immutable: the same tuple serves every query."""
    minute_ms = pl.col("minute").dt.epoch("ms")
    # the hour as a number to compare rows by; as a time only once per run (below)
    keys = [pl.col(c) for c in RUN_KEYS] + [minute_ms // HOUR_MS]
    sums = _sums(list(columns))
    first = pl.int_range(pl.len()) == 0
    exprs = (
        (first | pl.any_horizontal([k.ne_missing(k.shift()) for k in keys])).alias("_start"),
        *[pl.col(c) for c in RUN_KEYS],
        pl.col("minute"),
        minute_ms.alias("_minute_ms"),
        pl.col("price_usd_per_hour").fill_null(float("nan")),
        *[pl.col(c) for c in HOURLY_MEANS],
        # the categories' codes, null as one past the last (`_Segments.categories`)
        *[
            pl.col(c).cast(enum).to_physical().fill_null(pl.lit(len(names), pl.UInt8)).alias(c)
            for c, enum, names, _ in _COUNTED
        ],
        (pl.col("gpu_util_pct") >= t.idle_below).fill_null(False).alias("_active"),
        *[e.alias(c) for c, e in sums.items()],
    )
    return exprs, tuple(sums)


def minute_runs(minutes: pl.LazyFrame, t: Thresholds = DEFAULT) -> pl.LazyFrame:
    """Runs of minutes (one GPU, one hour, the same attributes): minutes, sums and non-null
    counts of the averaged metrics, phase/class/active counts, money, highest price.

    Correct in any row order (a run is consecutive rows with the same key; rows of one key
    apart make several runs, which add up the same); rows in GPU-then-time order make the runs
    long. A run is a contiguous slice of rows, so its sums are segment sums (`numpy.add.reduceat`
    over the run starts), its category counts the same over one 0/1 array per category: a
    fifth of what a group-by costs per column.
    """
    columns = tuple(minutes.collect_schema().names())  # resolved once, not once per phase
    per_minute, sums = _per_minute(columns, t)
    frame = collect_stable(minute_costs(minutes).select(per_minute))
    if frame.height == 0:
        return pl.LazyFrame(schema=RUNS_SCHEMA)
    seg = _Segments(frame.get_column("_start"))
    col = frame.get_column
    price = np.fmax.reduceat(col("price_usd_per_hour").to_numpy(), seg.at)
    out = {"_minutes": seg.lengths}
    for c, _, names, prefix in _COUNTED:
        per = seg.categories(col(c), len(names))
        out |= {f"{prefix}{n}": v for n, v in zip(names, per, strict=True)}
    out |= {
        "_last_minute": np.maximum.reduceat(col("_minute_ms").to_numpy(), seg.at),
        **{c: seg.sum(col(c)) for c in sums},
        **{f"_n_{c}": seg.non_null(col(c)) for c in HOURLY_MEANS},
        # a minute has a phase unless its code is the null one
        "_n_phase": sum(out[f"_n_{p}"] for p in PHASES),
        "_active": seg.sum(col("_active")),
        "price_usd_per_hour": price,
        # a minute has a cost when its model has a price
        "_priced": ~np.isnan(price),
    }
    # built column by column, without a query: a query over ~40 literal columns cost ~5 ms a
    # chunk to plan, more than its rows (benchmarks/README.md, issue 34)
    idx = pl.Series(seg.at, dtype=pl.get_index_type())
    first = pl.DataFrame([col(c) for c in (*RUN_KEYS, "minute")])[idx]
    hour = first.select(floor_ms(pl.col("minute"), HOUR_MS)).to_series()
    # the keys as the schema has them, whatever types the minutes came with (as the query cast)
    keys = {c: first.get_column(c) for c in RUN_KEYS} | {"hour": hour.alias("hour")}
    return pl.DataFrame(
        [
            keys[c].cast(t)
            if c in keys
            else pl.Series(c, out[c], t, nan_to_null=c == "price_usd_per_hour")
            for c, t in RUNS_SCHEMA.items()
        ]
    ).lazy()
