"""The fleet summary `make demo` and `gpu-pipeline summary` print, for a range of days: read from
the marts, computed by none of its own rules.

The fleet's figures are the `fleet_daily` mart's (made in the staging pass with the rules in
force, GPU_PIPELINE_RULES: phases, the active threshold, classes). One day prints its row as it
is; a range weights each day's figure by the GPU-minutes it is over (docs/metrics.md, "The
fleet's day" and "Months and ranges"), recovered from the row itself (RFU and the gap: from the
day's minutes):

- GPU-hours: the days' `gpu_hours` summed;
- phase shares (`pct_<phase>`, over the observed GPU-minutes): weighted by
  `observed_gpu_minutes`;
- utilization (`avg_gpu_util_pct`, over the minutes with a utilization reading): weighted by
  those minutes, observed x (100 - `pct_unknown`) / 100 (a minute is `unknown` exactly when it
  has no utilization);
- RFU and the gap (`avg_rfu_pct`, `avg_efficiency_gap_pct`, over the minutes that have them, a
  count the row does not keep): weighted by the day's physical GPU-minutes with an RFU, and
  with both an RFU and a utilization (the gap's), counted in its `gpu_minutes` (`rfu_weights`),
  so a range's RFU is the mean over its minutes with an RFU, what `rfu_minutes` gives; a day
  without `gpu_minutes` (a lake of marts only) falls back to its minutes with a utilization
  reading (exact only when each of them has a power reading too);
- the bottlenecked share of active minutes (`pct_active_bottlenecked`): weighted by the active
  minutes, observed x (100 - `pct_idle` - `pct_unknown`) / 100 (active: utilization at or above
  the rules' `phases.idle_below`, the minutes neither idle nor unknown).

A day without a figure (null: nothing to average) weighs nothing in it. What `fleet_daily`
cannot give for a range comes from `gpu_daily` (physical GPUs' rows, same rules): the GPUs seen
(a GPU seen on two days is one GPU) and how many active minutes have no efficiency class (busy
without a power reading). Waste: `priced_waste`, summed, with the GPU-hours of its rows
without a price (`unpriced_gpu_hours`: their cost is unknown, not $0); the workloads wasting
the most: `workload_efficiency` (`top_workloads`); persistent bottlenecks:
`persistent_bottlenecks`.
"""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl

from gpu_pipeline.lib.display import (
    NO_NAMESPACE,
    NO_PRICE,
    NO_WORKLOAD,
    num,
    plural,
    text,
    unsafe,
    usd,
)
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.marts.workload_efficiency import top_workloads
from gpu_pipeline.lib.rules import EFFICIENCY_CLASSES, HOURS_PER_MONTH, PHASES
from gpu_pipeline.lib.samples import PHYSICAL, ratio

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(ch: str) -> str:
    """A character a label must not show (`display.unsafe`) as its escape (`\\r`, `\\x1b`,
    `\\u202e`), any other as itself."""
    if ch in _NAMED:
        return _NAMED[ch]
    if not unsafe(ch):
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def shown(v: object, none: str) -> str:
    """A label from the data (namespace, model, host, workload, …) as the terminal prints it:
    `none` in place of no label; control characters (Unicode Cc: CR, ESC, BEL, C1) and bidi
    controls escaped as `gpu-pipeline sql`'s table shows them, so a label can neither move the
    cursor, colour the screen, plant a hyperlink (OSC 8) nor reorder the line, and its width is
    the width it is padded to."""
    s = text(v, none)
    if s.isprintable():  # neither a control nor a format character, nor a separator
        return s
    return "".join(map(_escaped, s))


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def _priced_sums() -> list[pl.Expr]:
    """Cost and waste summed, null (not $0) where nothing was priced."""
    return [priced_total(c) for c in ("cost_usd", "total_waste_usd")]


def _unpriced_hours() -> list[pl.Expr]:
    """priced_waste's GPU-hours, and those of its rows without a price (no cost: a model the
    price book lacks), as namespace_monthly's `unpriced_gpu_hours`."""
    h = pl.col("gpu_hours")
    return [h.sum(), h.filter(pl.col("cost_usd").is_null()).sum().alias("unpriced_gpu_hours")]


# under half a cent: what rounds to $0.00
CENT = 0.005


def waste_usd(r: dict) -> str:
    """A row's waste (`total_waste_usd` of `cost_usd`, `unmeasured_usd` of it no reading could
    split): "unmeasured" where all its cost is (a MIG tenant's: $0.00 would read as no waste)."""
    u = r.get("unmeasured_usd")
    if r["cost_usd"] is not None and u is not None and u >= CENT and r["cost_usd"] - u < CENT:
        return "unmeasured"
    return usd(r["total_waste_usd"])


def unmeasured_note(r: dict) -> str:
    """`, $0.71 unmeasured` for a row with unmeasured cost, else ""."""
    u = r.get("unmeasured_usd")
    return f", {usd(u)} unmeasured" if u is not None and u >= CENT else ""


def _weighted(value: str, weight: pl.Expr) -> pl.Expr:
    """The days' `value` averaged with `weight`, the days without a value left out (null when
    none has one)."""
    w = pl.when(pl.col(value).is_not_null()).then(weight)
    return pl.when(w.sum() > 0).then((pl.col(value) * w).sum() / w.sum()).alias(value)


def rfu_weights(minutes: pl.LazyFrame) -> pl.LazyFrame:
    """Per day, the physical GPUs' minutes with an RFU (`_rfu_minutes`) and with both an RFU
    and a utilization (`_gap_minutes`): what `fleet_daily`'s `avg_rfu_pct` and
    `avg_efficiency_gap_pct` are means over (a count the row does not keep)."""
    util, rfu = pl.col("gpu_util_pct"), pl.col("rfu_pct")
    return (
        minutes.filter(PHYSICAL)
        .group_by("date")
        .agg(
            rfu.count().cast(pl.Float64).alias("_rfu_minutes"),
            (util.is_not_null() & rfu.is_not_null()).sum().cast(pl.Float64).alias("_gap_minutes"),
        )
    )


def fleet_figures(lake: Lake, days: list[date]) -> dict:
    """The range's fleet figures from its `fleet_daily` rows (see the module's docstring), with
    the days that have data; `gpus` 0 when none has."""
    minutes = pl.col("observed_gpu_minutes").cast(pl.Float64)
    with_util = minutes * (100.0 - pl.col("pct_unknown")) / 100.0
    active = minutes * (100.0 - pl.col("pct_idle") - pl.col("pct_unknown")) / 100.0
    rows = (
        lake.scan_days("fleet_daily", days)
        .filter(pl.col("observed_gpu_minutes") > 0)
        .join(rfu_weights(lake.scan_days("gpu_minutes", days)), on="date", how="left")
    )
    head = (
        rows.select(
            pl.col("gpu_hours").sum(),
            _weighted("avg_gpu_util_pct", with_util),
            _weighted("avg_rfu_pct", pl.coalesce("_rfu_minutes", with_util)),
            _weighted("avg_efficiency_gap_pct", pl.coalesce("_gap_minutes", with_util)),
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


def rfu_minutes(minutes: pl.LazyFrame) -> dict | None:
    """Which GPU-minutes the fleet's averages are over (physical GPUs' rows, as `fleet_daily`):
    `observed`, those with a utilization (`util`), an RFU (`rfu`) and both (`both`: the gap's),
    and utilization and RFU over `both`. None without any minute (a lake of marts only).

    Utilization is over every minute with a reading, RFU only over those with a power reading
    and a max power (a model not in the catalog that reports no power limit has none), so the
    three headline figures may be over different minutes: the summary and the report say so."""
    util, rfu = pl.col("gpu_util_pct"), pl.col("rfu_pct")
    both = util.is_not_null() & rfu.is_not_null()
    r = (
        minutes.filter(pl.col("gpu_instance_id").is_null())
        .select(
            pl.len().alias("observed"),
            util.count().alias("util"),
            rfu.count().alias("rfu"),
            both.sum().alias("both"),
            util.filter(both).mean().alias("util_pct"),
            rfu.filter(both).mean().alias("rfu_pct"),
        )
        .collect()
        .row(0, named=True)
    )
    return r if r["observed"] else None


def same_minutes(m: dict | None) -> bool:
    """Utilization, RFU and the gap are averages over the same GPU-minutes (or it is unknown)."""
    return m is None or m["util"] == m["rfu"] == m["both"]


def minutes_lines(m: dict) -> list[str]:
    """What the headline's figures are over, when not over the same GPU-minutes."""
    return [
        f"utilization is over {m['util']:,} of {m['observed']:,} GPU-minutes, RFU over "
        f"{m['rfu']:,}, the gap over the {m['both']:,} with both",
        "(a minute without a power reading or a max power has no RFU): over those "
        f"{m['both']:,}, utilization {num(m['util_pct'], '.1f', unit=' %')} vs RFU "
        f"{num(m['rfu_pct'], '.1f', unit=' %')}",
    ]


# the workloads the summary lists (sql/queries/top_wasted_workloads.sql lists more)
TOP_WORKLOADS = 5


# what `fleet_summary` scans: a page of them that does not decode is named (`Lake.reading`)
_SCANNED = (
    "fleet_daily",
    "gpu_minutes",
    "gpu_daily",
    "priced_waste",
    "workload_efficiency",
    "persistent_bottlenecks",
)


def fleet_summary(lake: Lake, start: date, end: date) -> dict:
    days = _days(start, end)
    with lake.reading(_SCANNED, days):
        return _fleet_summary(lake, days)


def _fleet_summary(lake: Lake, days: list[date]) -> dict:
    head = fleet_figures(lake, days)
    waste = (
        lake.scan_days("priced_waste", days)
        .group_by("namespace", "gpu_model")
        .agg(pl.col("gpu_hours").sum(), *_priced_sums(), priced_total("unmeasured_usd"))
        .with_columns(
            ratio("total_waste_usd", "gpu_hours", HOURS_PER_MONTH).alias("monthly_waste_per_gpu")
        )
        .sort("total_waste_usd", descending=True, nulls_last=True)
        .head(5)
        .collect()
    )
    totals = (
        lake.scan_days("priced_waste", days).select(*_priced_sums(), *_unpriced_hours()).collect()
    )
    return {
        "days": days,
        "days_with_data": head.pop("days_with_data"),
        "head": head,
        "minutes": rfu_minutes(lake.scan_days("gpu_minutes", days)),
        "waste": waste,
        "totals": totals.row(0, named=True),
        "workloads": _with_unmeasured(lake.scan_days("workload_efficiency", days)),
        "persistent": persistent_gpus(lake.scan_days("persistent_bottlenecks", days)),
    }


def persistent_gpus(rows: pl.LazyFrame) -> pl.DataFrame:
    """The GPUs of the period's `persistent_bottlenecks` rows: on how many of its days each was
    a persistent bottleneck (`days_persistent`), and its last such day's row (`date`: its
    window ends there; `days_bottlenecked` of `window_days`, the days with data in it;
    `bottleneck_share`, of the window's active minutes), as the day's report shows them. Most
    days first."""
    last = ("date", "days_bottlenecked", "window_days", "bottleneck_share")
    return (
        rows.group_by("gpu_uuid", "hostname", "namespace", "gpu_model")
        .agg(pl.len().alias("days_persistent"), pl.col(*last).sort_by("date").last())
        .sort(
            ["days_persistent", "days_bottlenecked", "bottleneck_share", "gpu_uuid"],
            descending=[True, True, True, False],
            nulls_last=True,
        )
        .collect()
    )


def _with_unmeasured(rows: pl.LazyFrame) -> pl.DataFrame:
    """The workloads wasting the most (`top_workloads`), each with its `unmeasured_usd`."""
    keys = ["cluster", "namespace", "workload"]
    u = rows.group_by(keys).agg(priced_total("unmeasured_usd")).collect()
    top = top_workloads(rows, TOP_WORKLOADS)
    return top.join(u, on=keys, how="left", nulls_equal=True, maintain_order="left")


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
                shown(r["cluster"], "?"),
                shown(r["namespace"], NO_NAMESPACE),
                shown(r["workload"], NO_WORKLOAD),
            )
        )
        out.append(
            f"    {name:<44} waste {waste_usd(r):>11} of {usd(r['cost_usd']):>11}"
            f"   {shown(r['main_diagnosis'], 'n/a'):<19} -> {shown(r['top_action'], '(none)')}"
            + unmeasured_note(r)
        )
    return out


def unpriced_note(t: dict) -> str:
    """` (over 20.0 of 60.0 GPU-hours: 40.0 have no price)` for totals with GPU-hours of a model
    the price book lacks, whose cost is unknown and in neither figure; else ""."""
    u = t.get("unpriced_gpu_hours") or 0.0
    if u <= 0:
        return ""
    h = t["gpu_hours"]
    return f" (over {h - u:,.1f} of {h:,.1f} GPU-hours: {u:,.1f} have no price in the price book)"


def format_summary(s: dict, start: date, end: date) -> str:
    h = s["head"]
    if not h["gpus"]:
        return f"No GPU-minutes in the lake for {start}..{end}."
    gaps = coverage_line(s["days"], s["days_with_data"])
    t = s["totals"]
    priced = t["cost_usd"] is not None  # a sum over no priced minute is null
    cost = (
        f"  cost ${t['cost_usd']:,.2f}, of which waste ${t['total_waste_usd'] or 0:,.2f}"
        + unpriced_note(t)
        if priced
        else f"  cost {NO_PRICE}: no GPU-minute of the period has a price (price book)"
    )
    out = [
        f"Fleet summary {start} .. {end}",
        *([f"  {gaps}"] if gaps else []),
        f"  GPUs: {h['gpus']}    GPU-hours: {h['gpu_hours']:,.1f}",
        f"  avg utilization {num(h['util'], '.1f', unit=' %')}  vs  avg RFU "
        f"{num(h['rfu'], '.1f', unit=' %')}  ->  gap {num(h['gap'], '.1f', unit=' points')}"
        + ("" if same_minutes(s.get("minutes")) else "  (over different GPU-minutes:)"),
        *(
            []
            if same_minutes(s.get("minutes"))
            else [f"    {x}" for x in minutes_lines(s["minutes"])]
        ),
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
            f"    {shown(r['namespace'], NO_NAMESPACE):<16} {shown(r['gpu_model'], '(no model)'):<24}"
            f" waste {waste_usd(r):>11} of {usd(r['cost_usd']):>11}"
            + (
                f"   (n/a/GPU-month{unmeasured_note(r)})"
                if waste_usd(r) == "unmeasured"
                else f"   ({usd(r['monthly_waste_per_gpu'], ',.0f')}/GPU-month{unmeasured_note(r)})"
            )
        )
    out += _workload_lines(s["workloads"])
    out += persistent_lines(s["persistent"], len(s["days"]))
    return "\n".join(out)


def persistent_lines(p: pl.DataFrame, days: int) -> list[str]:
    """The persistent bottlenecks (`persistent_gpus`) of a period of `days` days, 10 listed: on
    how many of its days each was one, and its last window's bottlenecked days and share of
    active minutes, in the words of the report's table."""
    out = ["", f"  Persistent bottlenecks: {p.height} GPU(s)"]
    for r in p.head(10).iter_rows(named=True):
        share = r["bottleneck_share"]
        out.append(
            f"    {shown(r['gpu_uuid'], '?')}  {shown(r['hostname'], '(no hostname)'):<24}"
            f" {shown(r['namespace'], NO_NAMESPACE):<16} persistent on {r['days_persistent']} of"
            f" {plural(days, 'day')}; window to {r['date']}: bottlenecked days"
            f" {r['days_bottlenecked']} of {r['window_days']}, active minutes bottlenecked"
            f" {num(share and 100 * share, '.0f', 'n/a', ' %')}"
        )
    if p.height > 10:
        out.append(
            f"    … and {p.height - 10} more (gpu-pipeline sql -f sql/queries/persistent_offenders.sql)"
        )
    return out
