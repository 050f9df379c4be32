"""The fleet summary `make demo` prints: read from the marts, for a range of days."""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl

from gpu_pipeline.lib.display import NO_NAMESPACE, NO_PRICE, num, text, usd
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.rules import DEFAULT, HOURS_PER_MONTH, PHASES


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def _priced_sums() -> list[pl.Expr]:
    """Cost and waste summed, null (not $0) where nothing was priced."""
    return [priced_total(c) for c in ("cost_usd", "total_waste_usd")]


def fleet_summary(lake: Lake, start: date, end: date) -> dict:
    days = _days(start, end)
    # fleet totals count each physical GPU once (MIG instances are parts of it)
    m = lake.scan_days("gpu_minutes", days).filter(pl.col("gpu_instance_id").is_null())
    head = (
        m.select(
            pl.col("gpu_uuid").n_unique().alias("gpus"),
            (pl.len() / 60.0).alias("gpu_hours"),
            pl.col("gpu_util_pct").mean().alias("util"),
            pl.col("rfu_pct").mean().alias("rfu"),
            pl.col("efficiency_gap_pct").mean().alias("gap"),
            *[
                (100.0 * (pl.col("phase") == p).sum() / pl.col("phase").count()).alias(p)
                for p in PHASES
            ],
            (
                100.0
                * (pl.col("efficiency_class") == "bottlenecked").sum()
                / (pl.col("gpu_util_pct") >= DEFAULT.idle_below).sum()
            ).alias("bottlenecked_active_pct"),
            (pl.col("gpu_util_pct") >= DEFAULT.idle_below).sum().alias("active_minutes"),
            ((pl.col("gpu_util_pct") >= DEFAULT.idle_below) & pl.col("efficiency_class").is_null())
            .sum()
            .alias("active_unclassed"),
        )
        .collect()
        .row(0, named=True)
    )
    waste = (
        lake.scan_days("priced_waste", days)
        .group_by("namespace", "gpu_model")
        .agg(pl.col("gpu_hours").sum(), *_priced_sums())
        .with_columns(
            (pl.col("total_waste_usd") / pl.col("gpu_hours") * HOURS_PER_MONTH).alias(
                "monthly_waste_per_gpu"
            )
        )
        .sort("total_waste_usd", descending=True, nulls_last=True)
        .head(5)
        .collect()
    )
    totals = lake.scan_days("priced_waste", days).select(*_priced_sums()).collect()
    with_data = m.select(pl.col("date").unique().sort()).collect()["date"].to_list()
    persistent = (
        lake.scan_days("persistent_bottlenecks", days)
        .group_by("gpu_uuid", "hostname", "namespace", "gpu_model")
        .agg(pl.len().alias("days_flagged"), pl.col("bottleneck_share").mean())
        .sort("days_flagged", "bottleneck_share", descending=True)
        .collect()
    )
    return {
        "days": days,
        "days_with_data": with_data,
        "head": head,
        "waste": waste,
        "totals": totals.row(0, named=True),
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
