"""The fleet summary `make demo` and `gpu-pipeline summary` print, for a range of days: read from
the marts, computed by none of its own rules.

The fleet's figures are the `fleet_daily` mart's (made in the staging pass with the rules in
force, GPU_PIPELINE_RULES: phases, the active threshold, classes). One day prints its row as it
is; a range weights each day's figure by the GPU-minutes it is over (docs/metrics.md, "The
fleet's day"), recovered from the row itself:

- GPU-hours: the days' `gpu_hours` summed;
- phase shares (`pct_<phase>`, over the observed GPU-minutes): weighted by
  `observed_gpu_minutes`;
- utilization (`avg_gpu_util_pct`, over the minutes with a utilization reading): weighted by
  those minutes, observed x (100 - `pct_unknown`) / 100 (a minute is `unknown` exactly when it
  has no utilization);
- RFU and the gap (`avg_rfu_pct`, `avg_efficiency_gap_pct`, over the minutes that have them, a
  count the row does not keep): weighted by the minutes with a utilization reading, which
  they need (exact when every such minute also has a power reading, or the share that has one
  is the same each day);
- the bottlenecked share of active minutes (`pct_active_bottlenecked`): weighted by the active
  minutes, observed x (100 - `pct_idle` - `pct_unknown`) / 100 (active: utilization at or above
  the rules' `phases.idle_below`, the minutes neither idle nor unknown).

A day without a figure (null: nothing to average) weighs nothing in it. What `fleet_daily`
cannot give for a range comes from `gpu_daily` (physical GPUs' rows, same rules): the GPUs seen
(a GPU seen on two days is one GPU) and how many active minutes have no efficiency class (busy
without a power reading). Waste: `priced_waste`, summed; the workloads wasting the most:
`workload_efficiency` (`top_workloads`); persistent bottlenecks: `persistent_bottlenecks`.
"""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl

from gpu_pipeline.lib.display import NO_NAMESPACE, NO_PRICE, NO_WORKLOAD, num, text, usd
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.marts.workload_efficiency import top_workloads
from gpu_pipeline.lib.rules import EFFICIENCY_CLASSES, HOURS_PER_MONTH, PHASES
from gpu_pipeline.lib.samples import ratio


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def _priced_sums() -> list[pl.Expr]:
    """Cost and waste summed, null (not $0) where nothing was priced."""
    return [priced_total(c) for c in ("cost_usd", "total_waste_usd")]


def _weighted(value: str, weight: pl.Expr) -> pl.Expr:
    """The days' `value` averaged with `weight`, the days without a value left out (null when
    none has one)."""
    w = pl.when(pl.col(value).is_not_null()).then(weight)
    return pl.when(w.sum() > 0).then((pl.col(value) * w).sum() / w.sum()).alias(value)


def fleet_figures(lake: Lake, days: list[date]) -> dict:
    """The range's fleet figures from its `fleet_daily` rows (see the module's docstring), with
    the days that have data; `gpus` 0 when none has."""
    minutes = pl.col("observed_gpu_minutes").cast(pl.Float64)
    with_util = minutes * (100.0 - pl.col("pct_unknown")) / 100.0
    active = minutes * (100.0 - pl.col("pct_idle") - pl.col("pct_unknown")) / 100.0
    rows = lake.scan_days("fleet_daily", days).filter(pl.col("observed_gpu_minutes") > 0)
    head = (
        rows.select(
            pl.col("gpu_hours").sum(),
            _weighted("avg_gpu_util_pct", with_util),
            _weighted("avg_rfu_pct", with_util),
            _weighted("avg_efficiency_gap_pct", with_util),
            *[_weighted(f"pct_{p}", minutes) for p in PHASES],
            _weighted("pct_active_bottlenecked", active),
            pl.col("date").sort().implode().alias("days_with_data"),
        )
        .collect()
        .row(0, named=True)
    )
    gpus = lake.scan_days("gpu_daily", days).filter(pl.col("gpu_instance_id").is_null())
    classed = pl.sum_horizontal(f"class_{c}_minutes" for c in EFFICIENCY_CLASSES if c != "idle")
    counts = (
        gpus.select(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            pl.col("active_minutes").sum(),
            (pl.col("active_minutes") - classed).sum().alias("active_unclassed"),
        )
        .collect()
        .row(0, named=True)
    )
    return {
        "gpus": counts["gpus"] if head["days_with_data"] else 0,
        "gpu_hours": head["gpu_hours"],
        "util": head["avg_gpu_util_pct"],
        "rfu": head["avg_rfu_pct"],
        "gap": head["avg_efficiency_gap_pct"],
        **{p: head[f"pct_{p}"] for p in PHASES},
        "bottlenecked_active_pct": head["pct_active_bottlenecked"],
        "active_minutes": counts["active_minutes"],
        "active_unclassed": counts["active_unclassed"],
        "days_with_data": head["days_with_data"],
    }


# the workloads the summary lists (sql/queries/top_wasted_workloads.sql lists more)
TOP_WORKLOADS = 5


def fleet_summary(lake: Lake, start: date, end: date) -> dict:
    days = _days(start, end)
    head = fleet_figures(lake, days)
    waste = (
        lake.scan_days("priced_waste", days)
        .group_by("namespace", "gpu_model")
        .agg(pl.col("gpu_hours").sum(), *_priced_sums())
        .with_columns(
            ratio("total_waste_usd", "gpu_hours", HOURS_PER_MONTH).alias("monthly_waste_per_gpu")
        )
        .sort("total_waste_usd", descending=True, nulls_last=True)
        .head(5)
        .collect()
    )
    totals = lake.scan_days("priced_waste", days).select(*_priced_sums()).collect()
    persistent = (
        lake.scan_days("persistent_bottlenecks", days)
        .group_by("gpu_uuid", "hostname", "namespace", "gpu_model")
        .agg(pl.len().alias("days_flagged"), pl.col("bottleneck_share").mean())
        .sort("days_flagged", "bottleneck_share", descending=True)
        .collect()
    )
    return {
        "days": days,
        "days_with_data": head.pop("days_with_data"),
        "head": head,
        "waste": waste,
        "totals": totals.row(0, named=True),
        "workloads": top_workloads(lake.scan_days("workload_efficiency", days), TOP_WORKLOADS),
        "persistent": persistent,
    }


def _spans(days: list[date]) -> list[str]:
    """Days as runs of consecutive days: `2024-01-03`, `2024-01-05..2024-01-07`."""
    runs: list[list[date]] = []
    for d in sorted(days):
        if runs and d - runs[-1][-1] == timedelta(days=1):
            runs[-1].append(d)
        else:
            runs.append([d])
    return [f"{r[0]}" if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs]


# at most this many runs of days without data are named, then a count
MAX_GAPS = 8


def coverage_line(days: list[date], with_data: list[date]) -> str | None:
    """`7 days asked, 5 with data: 2024-01-03, 2024-01-06 have none`; None when every day has
    data."""
    missing = sorted(set(days) - set(with_data))
    if not missing:
        return None
    spans = _spans(missing)
    named = ", ".join(spans[:MAX_GAPS]) + (
        f", … ({len(missing)} days in all)" if len(spans) > MAX_GAPS else ""
    )
    verb = "has" if len(missing) == 1 else "have"
    return f"{len(days)} days asked, {len(days) - len(missing)} with data: {named} {verb} none"


def _workload_lines(w: pl.DataFrame) -> list[str]:
    """The workloads wasting the most (none listed for a lake without workload_efficiency)."""
    if not w.height:
        return []
    out = ["", "  Top workloads by recoverable waste (USD over the period):"]
    for r in w.iter_rows(named=True):
        # the cluster too: one owner's name in two clusters is two workloads
        name = "/".join(
            (
                text(r["cluster"], "?"),
                text(r["namespace"], NO_NAMESPACE),
                text(r["workload"], NO_WORKLOAD),
            )
        )
        out.append(
            f"    {name:<44} waste {usd(r['total_waste_usd']):>11} of {usd(r['cost_usd']):>11}"
            f"   {text(r['main_diagnosis'], 'n/a'):<19} -> {text(r['top_action'], '(none)')}"
        )
    return out


def format_summary(s: dict, start: date, end: date) -> str:
    h = s["head"]
    if not h["gpus"]:
        return f"No GPU-minutes in the lake for {start}..{end}."
    gaps = coverage_line(s["days"], s["days_with_data"])
    t = s["totals"]
    priced = t["cost_usd"] is not None  # a sum over no priced minute is null
    cost = (
        f"  cost ${t['cost_usd']:,.2f}, of which waste ${t['total_waste_usd'] or 0:,.2f}"
        if priced
        else f"  cost {NO_PRICE}: no GPU-minute of the period has a price (price book)"
    )
    out = [
        f"Fleet summary {start} .. {end}",
        *([f"  {gaps}"] if gaps else []),
        f"  GPUs: {h['gpus']}    GPU-hours: {h['gpu_hours']:,.1f}",
        f"  avg utilization {num(h['util'], '.1f', unit=' %')}  vs  avg RFU "
        f"{num(h['rfu'], '.1f', unit=' %')}  ->  gap {num(h['gap'], '.1f', unit=' points')}",
        "  phase shares: "
        + ", ".join(f"{p} {num(h[p], '.1f', unit=' %')}" for p in PHASES if p != "unknown" or h[p]),
        "  bottlenecked share of active minutes: "
        + num(h["bottlenecked_active_pct"], ".1f", "n/a (no active minute)", " %")
        + (
            f" (class unknown for {h['active_unclassed']:,} of {h['active_minutes']:,}: no PIF)"
            if h["active_unclassed"]
            else ""
        ),
        cost,
        "",
        "  Most wasteful namespace / model (USD over the period):",
    ]
    for r in s["waste"].iter_rows(named=True):
        out.append(
            f"    {text(r['namespace'], NO_NAMESPACE):<16} {text(r['gpu_model'], '(no model)'):<24}"
            f" waste {usd(r['total_waste_usd']):>11} of {usd(r['cost_usd']):>11}"
            f"   ({usd(r['monthly_waste_per_gpu'], ',.0f')}/GPU-month)"
        )
    out += _workload_lines(s["workloads"])
    p = s["persistent"]
    out += ["", f"  Persistent bottlenecks: {p.height} GPU(s)"]
    for r in p.head(10).iter_rows(named=True):
        out.append(
            f"    {r['gpu_uuid']}  {text(r['hostname'], '(no hostname)'):<24}"
            f" {text(r['namespace'], NO_NAMESPACE):<16} flagged {r['days_flagged']} day(s),"
            f" {num(r['bottleneck_share'] and 100 * r['bottleneck_share'], '.0f', 'n/a', ' %')}"
            " of active minutes bottlenecked"
        )
    if p.height > 10:
        out.append(
            f"    … and {p.height - 10} more (gpu-pipeline sql -f sql/queries/persistent_offenders.sql)"
        )
    return "\n".join(out)
