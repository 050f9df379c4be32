"""Reference implementations the benchmark measures us against, on the same inputs.

- pandas: the seed notebook's method (row-wise metrics with numpy, then groupby per mart).
- DuckDB: hand-written SQL of the same marts.
They compute the same numbers as gpu_pipeline's marts (tests/test_bench_references.py checks it).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import polars as pl

MAX_POWER = {"H100 80GB HBM3": 700.0, "A100-SXM4-40GB": 400.0, "A10G": 300.0}
ACHIEVABLE = {"H100 80GB HBM3": 646.0, "A100-SXM4-40GB": 102.0, "A10G": 35.0}
PRICE = {"H100 80GB HBM3": 4.0, "A100-SXM4-40GB": 2.5, "A10G": 1.01}


def pandas_marts(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    d = df.copy()
    d["max_power_w"] = d["gpu_model"].map(MAX_POWER)
    d["pif"] = (d["power_w"] / d["max_power_w"]).clip(0, 1)
    d["rfu_pct"] = d["pif"] * 100
    d["realized_tflops"] = d["gpu_model"].map(ACHIEVABLE) * d["pif"]
    d["gap"] = d["gpu_util_pct"] - d["rfu_pct"]
    u = d["gpu_util_pct"]
    d["phase"] = np.select(
        [u < 10, u < 70, u < 90], ["idle", "underutilized", "productive"], "compute_bound"
    )
    d["cls"] = np.select(
        [u < 10, (u >= 70) & (d["pif"] < 0.4), (u >= 70) & (d["pif"] >= 0.6), u < 30],
        ["idle", "bottlenecked", "efficient", "inefficient"],
        "moderate",
    )
    cost = d["gpu_model"].map(PRICE) / 60
    idle = d["phase"] == "idle"
    stall = (u - d["rfu_pct"]).clip(lower=0) / 100
    d["cost"] = cost
    d["productive"] = np.where(idle, 0, cost * d["pif"])
    d["idle_w"] = np.where(idle, cost, 0)
    d["stall_w"] = np.where(idle, 0, cost * stall)
    d["head_w"] = np.where(idle, 0, cost * (1 - d["pif"] - stall))
    d["hour"] = d["timestamp"].dt.floor("h")
    for p in ("idle", "underutilized", "productive", "compute_bound"):
        d[f"is_{p}"] = d["phase"] == p
    hourly = d.groupby(["hour", "cluster", "gpu_model"]).agg(
        gpus=("gpu_uuid", "nunique"),
        gpu_minutes=("gpu_uuid", "size"),
        avg_util=("gpu_util_pct", "mean"),
        avg_pif=("pif", "mean"),
        avg_rfu=("rfu_pct", "mean"),
        avg_gap=("gap", "mean"),
        avg_tflops=("realized_tflops", "mean"),
        pct_idle=("is_idle", "mean"),
        pct_underutilized=("is_underutilized", "mean"),
        pct_productive=("is_productive", "mean"),
        pct_compute_bound=("is_compute_bound", "mean"),
    )
    waste = d.groupby(["cluster", "namespace", "gpu_model"]).agg(
        gpu_minutes=("gpu_uuid", "size"),
        cost=("cost", "sum"),
        productive=("productive", "sum"),
        idle=("idle_w", "sum"),
        stall=("stall_w", "sum"),
        headroom=("head_w", "sum"),
    )
    d["active"] = u >= 10
    d["bott"] = d["cls"] == "bottlenecked"
    daily = d.groupby("gpu_uuid").agg(
        minutes=("gpu_uuid", "size"),
        active=("active", "sum"),
        bottlenecked=("bott", "sum"),
        avg_pif=("pif", "mean"),
    )
    return {"hourly": hourly, "waste": waste, "daily": daily}


# The fastest DuckDB we could write for the same marts: no temp table, each mart one GROUP BY
# straight over the Parquet file, hour buckets on the integer epoch, the catalog joined as a
# VALUES list (a hash join on three rows), phases as comparisons rather than strings.
_ENRICHED = """
SELECT s.cluster, s.namespace, s.gpu_model, s.gpu_uuid, s.timestamp,
  s.gpu_util_pct AS u, s.power_w,
  least(greatest(s.power_w / c.max_power, 0), 1) AS pif, c.achievable, c.price / 60 AS cost
FROM {src} s JOIN {catalog} USING (gpu_model)
"""
_HOURLY = """
SELECT epoch_ms(timestamp) // 3600000 AS hour, cluster, gpu_model,
  count(DISTINCT gpu_uuid) AS gpus, count(*) AS n, avg(u) AS avg_util, avg(pif) AS avg_pif,
  100 * avg(pif) AS avg_rfu, avg(u - 100 * pif) AS avg_gap, avg(achievable * pif) AS avg_tflops,
  100 * avg((u < 10)::INT) AS pct_idle, 100 * avg((u >= 10 AND u < 70)::INT) AS pct_underutilized,
  100 * avg((u >= 70 AND u < 90)::INT) AS pct_productive, 100 * avg((u >= 90)::INT) AS pct_compute_bound
FROM m GROUP BY ALL
"""
_WASTE = """
SELECT cluster, namespace, gpu_model, count(*) AS n, sum(cost) AS cost,
  sum(CASE WHEN u < 10 THEN 0 ELSE cost * pif END) AS productive,
  sum(CASE WHEN u < 10 THEN cost ELSE 0 END) AS idle,
  sum(CASE WHEN u < 10 THEN 0 ELSE cost * greatest(u - 100 * pif, 0) / 100 END) AS stall,
  sum(CASE WHEN u < 10 THEN 0 ELSE cost * (1 - pif - greatest(u - 100 * pif, 0) / 100) END) AS headroom
FROM m GROUP BY ALL
"""
_DAILY = """
SELECT gpu_uuid, count(*) AS minutes, sum((u >= 10)::INT) AS active,
  sum((u >= 70 AND pif < 0.4)::INT) AS b, avg(pif) AS avg_pif
FROM m GROUP BY ALL
"""
MART_SQL = {"hourly": _HOURLY, "waste": _WASTE, "daily": _DAILY}


def _catalog_sql() -> str:
    rows = ", ".join(f"('{m}', {MAX_POWER[m]}, {ACHIEVABLE[m]}, {PRICE[m]})" for m in MAX_POWER)
    return f"(VALUES {rows}) AS c(gpu_model, max_power, achievable, price)"


def _src(samples, con) -> str:
    if isinstance(samples, str):
        return f"read_parquet('{samples}')"
    con.register("samples_in", samples.to_arrow())
    return "samples_in"


def duckdb_marts(samples: pl.DataFrame | str) -> dict[str, object]:
    """The three marts, each one query over the source (a frame, or a Parquet file DuckDB reads
    itself); nothing materialized in between."""
    con = duckdb.connect()
    m = "(" + _ENRICHED.format(src=_src(samples, con), catalog=_catalog_sql()) + ")"
    out = {t: con.sql(f"WITH m AS {m} {q}").to_arrow_table() for t, q in MART_SQL.items()}
    con.close()
    return out


def duckdb_copy_marts(samples: str, sink: str) -> dict[str, object]:
    """What `marts+write` does, in DuckDB: the enriched minutes written to Parquet with COPY, in
    the lake's compression and level (zstd 2: DuckDB's default level 3 would be 1.2 s slower on
    the 10,000-GPU day), and the three marts, each a query over the source file."""
    from gpu_pipeline.lib.io.lake import WRITE_OPTIONS

    codec, level = WRITE_OPTIONS["compression"], WRITE_OPTIONS["compression_level"]
    con = duckdb.connect()
    m = "(" + _ENRICHED.format(src=_src(samples, con), catalog=_catalog_sql()) + ")"
    con.execute(
        f"""COPY (SELECT *, u - 100 * pif AS gap, 100 * pif AS rfu, achievable * pif AS tflops,
        CASE WHEN u < 10 THEN 'idle' WHEN u < 70 THEN 'underutilized' WHEN u < 90 THEN 'productive'
        ELSE 'compute_bound' END AS phase FROM {m}) TO '{sink}'
        (FORMAT parquet, COMPRESSION {codec}, COMPRESSION_LEVEL {level})"""
    )
    out = {t: con.sql(f"WITH m AS {m} {q}").to_arrow_table() for t, q in MART_SQL.items()}
    con.close()
    return out


# The first reference (kept for comparison): every enriched column materialized in a temp table.
DUCKDB_SQL = """
CREATE OR REPLACE TEMP TABLE m AS
SELECT *, u - rfu AS gap, CASE WHEN u < 10 THEN 'idle' WHEN u < 70 THEN 'underutilized'
  WHEN u < 90 THEN 'productive' ELSE 'compute_bound' END AS phase,
  CASE WHEN u < 10 THEN 'idle' WHEN u >= 70 AND pif < 0.4 THEN 'bottlenecked'
  WHEN u >= 70 AND pif >= 0.6 THEN 'efficient' WHEN u < 30 THEN 'inefficient' ELSE 'moderate' END AS cls
FROM (SELECT s.*, s.gpu_util_pct AS u, least(greatest(s.power_w / c.max_power, 0), 1) AS pif,
             100 * least(greatest(s.power_w / c.max_power, 0), 1) AS rfu,
             c.achievable * least(greatest(s.power_w / c.max_power, 0), 1) AS tflops, c.price / 60 AS cost
      FROM samples s JOIN catalog c USING (gpu_model));
CREATE OR REPLACE TEMP TABLE hourly AS
SELECT date_trunc('hour', timestamp) AS hour, cluster, gpu_model, count(DISTINCT gpu_uuid) AS gpus, count(*) AS n,
  avg(u), avg(pif), avg(rfu), avg(gap), avg(tflops),
  avg((phase = 'idle')::INT), avg((phase = 'underutilized')::INT), avg((phase = 'productive')::INT),
  avg((phase = 'compute_bound')::INT)
FROM m GROUP BY ALL;
CREATE OR REPLACE TEMP TABLE waste AS
SELECT cluster, namespace, gpu_model, count(*) AS n, sum(cost) AS cost,
  sum(CASE WHEN phase = 'idle' THEN 0 ELSE cost * pif END) AS productive,
  sum(CASE WHEN phase = 'idle' THEN cost ELSE 0 END) AS idle,
  sum(CASE WHEN phase = 'idle' THEN 0 ELSE cost * greatest(u - rfu, 0) / 100 END) AS stall,
  sum(CASE WHEN phase = 'idle' THEN 0 ELSE cost * (1 - pif - greatest(u - rfu, 0) / 100) END) AS headroom
FROM m GROUP BY ALL;
CREATE OR REPLACE TEMP TABLE daily AS
SELECT gpu_uuid, count(*) AS minutes, sum((u >= 10)::INT) AS active, sum((cls = 'bottlenecked')::INT) AS b,
  avg(pif) AS avg_pif
FROM m GROUP BY ALL;
"""


def duckdb_temp_table_marts(samples: pl.DataFrame | str) -> dict[str, object]:
    """`samples`: a frame, or the path of a Parquet file DuckDB reads itself."""
    con = duckdb.connect()
    catalog = pl.DataFrame(
        {
            "gpu_model": list(MAX_POWER),
            "max_power": list(MAX_POWER.values()),
            "achievable": [ACHIEVABLE[m] for m in MAX_POWER],
            "price": [PRICE[m] for m in MAX_POWER],
        }
    )
    if isinstance(samples, str):
        con.execute(f"CREATE VIEW samples AS SELECT * FROM read_parquet('{samples}')")
    else:
        con.register("samples", samples.to_arrow())
    con.register("catalog", catalog.to_arrow())
    con.execute(DUCKDB_SQL)
    out = {t: con.sql(f"SELECT * FROM {t}").to_arrow_table() for t in ("hourly", "waste", "daily")}
    con.close()
    return out
