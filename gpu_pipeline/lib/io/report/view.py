"""What the report's template prints: the report's data worded and formatted as plain text
(numbers with their units, missing values as what they mean, codes with their labels) and tables
as rows of such text. No markup: the template lays it out and escapes every value."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from gpu_pipeline.lib.display import (
    ACTIONS,
    DIAGNOSES,
    GROUPS,
    METRICS,
    NO_NAMESPACE,
    NO_POWER,
    NO_PRICE,
    NO_WORKLOAD,
    STRAGGLER_RULES,
    num,
    plural,
)
from gpu_pipeline.lib.io.report import data
from gpu_pipeline.lib.io.report.charts import Chart
from gpu_pipeline.lib.io.report.data import Period, label, pct_down
from gpu_pipeline.lib.marts.priced_waste import priced_total
from gpu_pipeline.lib.marts.workload_efficiency import top_workloads
from gpu_pipeline.lib.rules import DAYS_PER_MONTH, PHASES, Rules, Thresholds
from gpu_pipeline.lib.samples import MINUTES_PER_DAY


@dataclass(frozen=True)
class Coded:
    """A mart's code(s) as people read them: (label, code) each; label None: an unknown code,
    shown as is. The template shows the label, the code in a tooltip."""

    parts: tuple[tuple[str | None, str], ...]


def coded(code: object, labels: dict[str, str]) -> Coded:
    """Codes joined by ", " (a straggler flagged by two rules) each get their label."""
    return Coded(tuple((labels.get(c), c) for c in str(code).split(", ")))


@dataclass(frozen=True)
class Label:
    """A label from the data (namespace, pod, workload, host, model, cluster, GPU): telemetry's
    text, anything up to 1 KiB, bidi controls included. The template isolates it (`<bdi>`), so
    it never reorders the text around it (a namespace ending in U+202E once turned "$2,160" after
    it into "061,2$"), and lets it wrap anywhere; `text` is at most the characters its place
    allows, `full` the whole label when it was cut (the tooltip), else ""."""

    text: str
    full: str = ""


# a label in a table cell: its first characters, the whole in a tooltip (1,000 characters made a
# column as wide as ten screens)
CELL_CHARS = 60
# a label in a sentence
SENTENCE_CHARS = 200


def shown(v: object, n: int = CELL_CHARS, none: str = NO_NAMESPACE) -> Label | str:
    """A label from the data as the template prints it (`Label`), cut to `n` characters; `none`
    (our own words, not the data's) where there is no label."""
    if v is None:
        return none
    s = str(v)
    return Label(s) if len(s) <= n else Label(label(s, n), s)


# the columns whose values are labels from the data (`shown` in a table)
LABEL_COLUMNS = frozenset(
    ("namespace", "workload", "pod", "hostname", "gpu_model", "cluster", "gpu_uuid")
)


@dataclass
class Table:
    heads: list[str]
    rows: list[list[str | Coded | Label]] = field(default_factory=list)
    cls: str = ""


# table headers for people, not column names
LABELS = {
    "gpu_uuid": "GPU",
    "hostname": "host",
    "gpu_model": "model",
    "gpus": "GPUs",
    "gpu_hours": "GPU-hours",
    "gpu_minutes": "GPU-minutes",
    "days_bottlenecked": "bottlenecked days",
    "bottleneck_share": "active minutes bottlenecked",
    "measured_waste_frac": "measured waste",
    "naive_sum_frac": "naive sum",
    "utilization_savings_frac": "waste actions' savings",
    "rate_savings_frac": "spot (rate) savings",
    "total_savings_frac": "total savings",
    "monthly_savings_usd": "savings $/month",
    "avg_gpu_util_pct": "utilization %",
    "avg_rfu_pct": "RFU %",
    "util": "utilization %",
    "rfu": "RFU %",
    "pct_idle": "idle %",
    "pct_active_bottlenecked": "active minutes bottlenecked %",
    # two definitions, each header saying which: namespace_efficiency's mode of the active
    # minutes (idle left out), workload_efficiency's (SPEC) most of the GPU-time, idle included
    "dominant_diagnosis": "main diagnosis of active minutes",
    "main_diagnosis": "main diagnosis (idle included)",
    "top_action": "top action",
    "total_waste_usd": "waste $/day",
    "monthly_waste_per_gpu": "waste $/GPU-month",
    "cost_usd": "cost $/day",
    "waste_usd": "waste $/day",
    "energy_kwh": "energy kWh",
    "idle_energy_kwh": "idle kWh",
    "energy_usd": "energy $/day",
    "co2_kg": "CO₂ kg",
    "pod_median": "pod median",
    "points_below": "points below",
    "pod_stddev": "pod std dev",
    "theoretical_tflops": "theoretical TFLOPS",
    "achievable_tflops": "achievable TFLOPS",
    "realized_tflops": "realized TFLOPS",
    "realized_pct_of_achievable": "realized / achievable",
    "action": "action",
    "group": "waste it recovers",
    "fraction": "share of cost",
    "rationale": "measured evidence",
    "rule": "why flagged",
    "metric": "measured as",
    "status": "status",
    "reasons": "reasons",
    "on_day": "on this day",
    "remaining_usd": "after the waste actions $/day",
}

Format = Callable[[object], str]


def table(
    df: pl.DataFrame,
    cols: list[str],
    fmt: dict[str, Format] | None = None,
    missing: dict[str, str] | None = None,
    codes: dict[str, dict[str, str]] | None = None,
    heads: dict[str, str] | None = None,
    cls: str = "",
) -> Table:
    """`cols` of `df`, each formatted by `fmt[col]`; an empty cell says `missing[col]` (a
    namespace: "(no namespace)"); a column of `codes` reads as its labels, one of LABEL_COLUMNS
    as a `Label` (isolated, cut); `heads` overrides a column's header (LABELS otherwise)."""
    fmt, codes, heads = fmt or {}, codes or {}, heads or {}
    missing = {"namespace": NO_NAMESPACE} | (missing or {})

    def cell(c: str, v: object) -> str | Coded | Label:
        if v is None:
            return missing.get(c, "")
        if c in codes:
            return coded(v, codes[c])
        if c in fmt:
            return fmt[c](v)
        return shown(v) if c in LABEL_COLUMNS else str(v)

    rows = [[cell(c, r[c]) for c in cols] for r in df.select(cols).iter_rows(named=True)]
    return Table([heads.get(c) or LABELS.get(c, c) for c in cols], rows, cls)


def dollars(v: float) -> str:
    return f"${v:,.2f}"


def share(v: float) -> str:
    return f"{100 * v:.1f} %"


def one(v: float) -> str:
    return f"{v:.1f}"


# under half a cent: nothing (what rounds to $0.00)
CENT = 0.005
UNMEASURED = "unmeasured"


def waste_text(waste: float | None, cost: float | None, unmeasured: float | None) -> str:
    """A row's waste as people read it: "$0.00" is no waste, so a row whose cost is all
    `unmeasured_usd` (a MIG instance's busy minutes: no power reading, no RFU; minutes without
    utilization) says so, with the dollars; a row partly unmeasured says how much beside its
    waste. No price: NO_PRICE."""
    if waste is None or cost is None:
        return NO_PRICE
    if unmeasured is None or unmeasured < CENT:
        return dollars(waste)
    if cost - unmeasured < CENT:
        return f"{UNMEASURED} ({dollars(unmeasured)})"
    return f"{dollars(waste)} (+ {dollars(unmeasured)} {UNMEASURED})"


def with_waste_text(
    df: pl.DataFrame, unmeasured: pl.DataFrame | None, on: list[str], waste: str
) -> pl.DataFrame:
    """`df` with `_waste`: its `waste` column as `waste_text` words it, the unmeasured dollars
    (`unmeasured_usd` of `unmeasured`, by `on`) beside it; `_unmeasured_all`: the row's cost is
    all unmeasured (its waste per GPU-month is no figure either)."""
    if unmeasured is None:
        u = pl.lit(None, pl.Float64)
    else:
        df = df.join(unmeasured.select(*on, "unmeasured_usd"), on=on, how="left", nulls_equal=True)
        u = pl.col("unmeasured_usd")
    df = df.with_columns(u.alias("_u"))
    texts = [waste_text(w, c, x) for w, c, x in df.select(waste, "cost_usd", "_u").iter_rows()]
    all_unmeasured = [t.startswith(UNMEASURED) for t in texts]
    return df.with_columns(
        pl.Series("_waste", texts, pl.String),
        pl.Series("_unmeasured_all", all_unmeasured, pl.Boolean),
    )


# --- the top: coverage, figures, what to do ------------------------------------------------------


def partial(fleet: dict, daily: pl.DataFrame, t: Thresholds) -> dict | None:
    """The banner of a day the data covers only part of (observed GPU-minutes below GPUs seen
    x 1,440): the coverage, observed vs expected GPU-minutes, the GPUs with gaps; None when the
    day is complete."""
    observed, expected = fleet["observed_gpu_minutes"], fleet["expected_gpu_minutes"]
    if not expected or observed >= expected:
        return None
    gaps, gpus = data.coverage_gaps(daily), fleet["gpus"]
    least = gaps.row(0, named=True) if gaps.height else None
    return {
        "coverage": pct_down(fleet["coverage_pct"]),
        "observed": f"{observed:,}",
        "expected": f"{expected:,}",
        "gpus": plural(gpus, "GPU"),
        "day_minutes": f"{MINUTES_PER_DAY:,}",
        "warn": fleet["coverage_pct"] < t.coverage_warn_below,
        "warn_below": f"{t.coverage_warn_below:g}",
        "gaps": f"{gaps.height:,}" if gaps.height else "",
        "have": "has" if gaps.height == 1 else "have",
        "least": least and shown(least["gpu_uuid"], CELL_CHARS),
        "least_coverage": least and pct_down(100.0 * least["minutes"] / MINUTES_PER_DAY),
        "least_minutes": least and f"{least['minutes']:,}",
    }


# the day's priced_waste partition is missing: no money figure, and not for want of a price
NO_PRICED_WASTE = "n/a (no priced_waste for this day: materialize it again)"


def same_minutes(m: dict | None) -> bool:
    """Utilization, RFU and the gap are over the same GPU-minutes (or it is not known)."""
    return m is None or m["util"] == m["rfu"] == m["both"]


def minutes_note(m: dict | None) -> dict | None:
    """The line under the figures when utilization, RFU and the gap are averages over different
    GPU-minutes (`data.fleet_minutes`): how many each is over, and utilization and RFU over the
    gap's minutes; None when they are over the same ones."""
    if same_minutes(m):
        return None
    return {
        "observed": f"{m['observed']:,}",
        "util": f"{m['util']:,}",
        "rfu": f"{m['rfu']:,}",
        "both": f"{m['both']:,}",
        "util_pct": num(m["util_pct"], ".1f", unit=" %"),
        "rfu_pct": num(m["rfu_pct"], ".1f", unit=" %"),
    }


def kpis(
    fleet: dict,
    waste: pl.DataFrame,
    namespaces: pl.DataFrame | None,
    minutes: dict | None = None,
    priced: bool = True,
) -> list[tuple]:
    """The figures at the top: the fleet's (fleet_daily), its money (priced_waste; `priced`
    False: the lake has no partition of it) and energy (namespace_efficiency), each (name,
    value). `minutes` (`data.fleet_minutes`): when the gap is over fewer minutes than
    utilization, utilization over the gap's minutes stands beside it."""
    cost, wasted = data.money(waste)
    no_money = NO_PRICE if priced else NO_PRICED_WASTE
    out = [
        ("GPUs", num(fleet["gpus"], "d")),
        ("GPU-hours", num(fleet["gpu_hours"], ",.1f")),
        ("coverage", "n/a" if fleet["coverage_pct"] is None else pct_down(fleet["coverage_pct"])),
        ("avg utilization", num(fleet["avg_gpu_util_pct"], ".1f", unit=" %")),
        ("avg RFU", num(fleet["avg_rfu_pct"], ".1f", unit=" %")),
        ("gap", num(fleet["avg_efficiency_gap_pct"], ".1f", unit=" pts")),
        ("cost / day", no_money if cost is None else dollars(cost)),
        ("waste / day", no_money if cost is None else dollars(wasted or 0.0)),
    ]
    if not same_minutes(minutes):
        out.insert(6, ("utilization where RFU known", num(minutes["util_pct"], ".1f", unit=" %")))
    unpriced = data.unpriced_hours(waste)
    if cost is not None and unpriced:  # cost and waste are over the priced GPU-hours only
        out.append(("GPU-hours without a price", f"{unpriced[0]:,.1f} of {unpriced[1]:,.1f}"))
    e = data.energy(namespaces)
    if e is not None:
        # a namespace without any power reading has no energy (null): a day of only such
        # namespaces has no known energy (not 0 kWh)
        on = e["powered"]
        out += [
            (
                "energy / day",
                f"{e['energy_kwh']:,.1f} kWh (${e['energy_usd']:,.2f})" if on else NO_POWER,
            ),
            ("idle energy / day", f"{e['idle_energy_kwh']:,.1f} kWh" if on else NO_POWER),
            ("CO₂ / day", f"{e['co2_kg']:,.1f} kg" if on else NO_POWER),
        ]
    return out


def phases(fleet: dict, t: Thresholds) -> dict:
    """The fleet's phase shares of its GPU-minutes (unknown only when some are) and the share
    of its active minutes that were bottlenecked, as fleet_daily has them, with the rules' bounds."""
    shares = [
        (p.replace("_", "-"), num(fleet[f"pct_{p}"], ".1f", unit=" %"))
        for p in PHASES
        if p != "unknown" or fleet["pct_unknown"]
    ]
    return {
        "shares": shares,
        "bottlenecked": num(
            fleet["pct_active_bottlenecked"],
            ".1f",
            "n/a (no active minute)",
            " % of active minutes",
        ),
        "idle_below": f"{t.idle_below:g}",
        "productive_from": f"{t.productive_from:g}",
        "compute_bound_from": f"{t.compute_bound_from:g}",
        "busy": f"utilization ≥ {t.productive_from:g} %, PIF < {t.bottleneck_pif_below:g}",
    }


def first(rec: pl.DataFrame, period: Period) -> dict:
    """What to do first: recoverable waste only, by dollars a month (or the observed day's)."""
    top = data.top_actions(rec)
    items = [
        {
            "action": coded(r["action"], ACTIONS),
            "namespace": shown(r["namespace"], SENTENCE_CHARS),
            "usd": period.usd(r["monthly_usd"]),
            "rationale": str(r["rationale"]),
        }
        for r in top.iter_rows(named=True)
    ]
    return {"items": items, "note": period.note, "cls": "caveat" if period.caveat else "note"}


def price(rec: pl.DataFrame, period: Period) -> dict | None:
    """Paying less for the same work: spot, per namespace, on the cost left after the waste
    (`table`), and the cost its footnote multiplies (`cost`): the month's, or the observed
    day's when the column is per day (`period`)."""
    p = data.price_actions(rec)
    if p.height == 0:
        return None
    t = table(
        p,
        ["namespace", "monthly_usd", "rate_savings_frac", "cost_usd", "remaining_usd"],
        {
            "monthly_usd": period.usd,
            "rate_savings_frac": lambda v: f"{100 * v:.0f} %",
            "cost_usd": dollars,
            "remaining_usd": dollars,
        },
        heads={"monthly_usd": f"spot saves {period.unit}", "rate_savings_frac": "spot discount"},
    )
    cost = (
        "monthly cost" if period.monthly else "the day's observed cost (not projected to a month)"
    )
    return {"table": t, "cost": cost}


def bottlenecked_today(daily: pl.DataFrame) -> list[tuple[Label | str, str]]:
    """Each namespace with bottlenecked GPU-days and how many GPUs, most bottlenecked first."""
    return [
        (shown(r["namespace"], SENTENCE_CHARS), plural(r["gpus"], "GPU"))
        for r in data.bottlenecked_namespaces(daily).iter_rows(named=True)
    ]


# --- the charts and the tables under them --------------------------------------------------------


def chart(c: Chart, after: tuple[str, object] | None = None) -> dict:
    """A chart for the template: its title, the PNG as base64, its caption or why nothing is
    drawn; `after`: the section under it (kind, its values)."""
    return {
        "title": c.title,
        "png": base64.b64encode(c.png).decode() if not c.empty else "",
        "caption": c.caption,
        "empty": c.empty,
        "after": after,
    }


TREND_COLUMNS = ("date", "gpu_minutes", "coverage", "util", "rfu", "waste_usd")


def trend_table(cal: pl.DataFrame) -> Table:
    """The trend's days as a table; a day the lake lacks says so in every cell."""
    rows = []
    for r in cal.iter_rows(named=True):
        if r["gpu_minutes"] is None:
            rows.append([str(r["date"])] + ["no data"] * (len(TREND_COLUMNS) - 1))
            continue
        rows.append(
            [
                str(r["date"]),
                f"{r['gpu_minutes']:,}",
                "n/a" if r["coverage_pct"] is None else pct_down(r["coverage_pct"]),
                num(r["util"], ".1f"),
                num(r["rfu"], ".1f"),
                NO_PRICE if r["waste_usd"] is None else dollars(r["waste_usd"]),
            ]
        )
    return Table([LABELS.get(c, c) for c in TREND_COLUMNS], rows)


def capacity_table(capacity: pl.DataFrame) -> Table:
    tflops = ("theoretical_tflops", "achievable_tflops", "realized_tflops")
    return table(
        capacity,
        ["gpu_model", "gpus", *tflops, "realized_pct_of_achievable"],
        {c: (lambda v: num(v, ",.0f")) for c in tflops}
        | {"realized_pct_of_achievable": lambda v: num(v, ".1f", unit=" %")},
    )


def persistent(pb: pl.DataFrame, daily: pl.DataFrame, t: Thresholds) -> dict | None:
    """Persistent bottlenecks, each saying what it did on this day; how many sent no data."""
    if pb.height == 0:
        return None
    p = data.persistent_on_day(pb, daily).with_columns(
        # the bottlenecked days of the window's days with data (the summary's words too)
        pl.format("{} of {}", "days_bottlenecked", "window_days").alias("_days")
    )
    unseen = p.filter(~pl.col("seen")).height
    cols = ["gpu_uuid", "hostname", "namespace", "gpu_model", "_days"]
    w = t.window_days
    return {
        "min_days": t.persistent_min_days,
        "window": t.window_days,
        "unseen": unseen,
        "gpus": plural(p.height, "GPU"),
        "table": table(
            p,
            [*cols, "bottleneck_share", "on_day"],
            {"bottleneck_share": lambda v: f"{100 * v:.0f} %", "_days": str},
            heads={
                "_days": f"bottlenecked days (last {w})",
                "bottleneck_share": f"active minutes bottlenecked (last {w} days)",
            },
        ),
    }


SAVINGS = (
    "measured_waste_frac",
    "naive_sum_frac",
    "utilization_savings_frac",
    "rate_savings_frac",
    "total_savings_frac",
)


def recommendation_tables(rec: pl.DataFrame, period: Period) -> dict:
    """The actions per namespace (None: no action anywhere, nothing priced or nothing to fix)
    and the savings per namespace, most first."""
    details = data.recommendation_details(rec)
    per = 1 if period.monthly else DAYS_PER_MONTH
    ranked = rec.sort(
        ["monthly_savings_usd", "namespace"], descending=[True, False], nulls_last=True
    )
    actions = table(
        details,
        ["namespace", "action", "group", "fraction", "rationale"],
        {"fraction": share},
        codes={"action": ACTIONS, "group": GROUPS},
    )
    savings = table(
        ranked,
        ["namespace", *SAVINGS, "monthly_savings_usd"],
        dict.fromkeys(SAVINGS, share) | {"monthly_savings_usd": lambda v: f"${v / per:,.2f}"},
        # a namespace none of whose minutes has a price: nothing to weigh
        dict.fromkeys([c for c in SAVINGS if c != "naive_sum_frac"], NO_PRICE)
        | {"monthly_savings_usd": NO_PRICE},
        heads={"monthly_savings_usd": f"savings {period.unit}"},
    )
    return {"actions": actions if details.height else None, "savings": savings}


# --- the sections below the charts ---------------------------------------------------------------

NAMESPACE_NUMBERS = (
    "gpu_hours",
    "avg_gpu_util_pct",
    "avg_rfu_pct",
    "pct_idle",
    "pct_active_bottlenecked",
    "energy_kwh",
    "idle_energy_kwh",
    "co2_kg",
)
ENERGY = ("energy_kwh", "idle_energy_kwh", "energy_usd", "co2_kg")


def namespaces_table(nse: pl.DataFrame, waste: pl.DataFrame | None = None) -> Table:
    """The namespaces, money first: at 700 px the table scrolls, and cost and waste stay in
    view. `waste`: the day's priced_waste, for the cost no minute's reading could split (a MIG
    tenant's: "unmeasured", not $0.00 of waste)."""
    money = ("cost_usd", "_waste", "energy_usd")
    unmeasured = (
        None if waste is None else waste.group_by("namespace").agg(priced_total("unmeasured_usd"))
    )
    rows = with_waste_text(nse, unmeasured, ["namespace"], "waste_usd")
    if waste is not None:  # a namespace partly on models without a price says how much
        rows = _with_unpriced(rows, waste)
    return table(
        rows,
        ["namespace", *money, "gpus", *NAMESPACE_NUMBERS[:5], "dominant_diagnosis"]
        + list(NAMESPACE_NUMBERS[5:]),
        dict.fromkeys(NAMESPACE_NUMBERS, one)
        | dict.fromkeys(("cost_usd", "energy_usd"), dollars)
        | {"_waste": str},
        # a namespace on models without a price has no cost; one without power readings
        # no energy (the mart's null)
        dict.fromkeys(("cost_usd", "waste_usd"), NO_PRICE)
        | dict.fromkeys(
            # no active minute: no bottleneck share, no diagnosis
            ("avg_gpu_util_pct", "avg_rfu_pct", "pct_active_bottlenecked", "dominant_diagnosis"),
            "n/a",
        )
        | dict.fromkeys(ENERGY, NO_POWER),
        codes={"dominant_diagnosis": DIAGNOSES},
        heads={"_waste": LABELS["waste_usd"]},
        cls="namespaces",
    )


def _with_unpriced(rows: pl.DataFrame, waste: pl.DataFrame) -> pl.DataFrame:
    """`rows` (namespaces with their `_waste` text) with the GPU-hours of each that no price
    covers beside a waste that has a figure: a namespace whose H100 hours had no price read
    "$0.00" of waste as if all were counted (adversarial review)."""
    hours = pl.col("gpu_hours").filter(pl.col("cost_usd").is_null()).sum().alias("_unpriced")
    per = waste.group_by("namespace").agg(hours)
    rows = rows.join(per, on="namespace", how="left", nulls_equal=True)
    text = (
        pl.when((pl.col("_unpriced") > 0) & pl.col("cost_usd").is_not_null())
        .then(
            pl.format(
                "{} (not over {} GPU-h without a price)", "_waste", pl.col("_unpriced").round(1)
            )
        )
        .otherwise(pl.col("_waste"))
    )
    return rows.with_columns(text.alias("_waste")).drop("_unpriced")


# the workloads the report lists
TOP_WORKLOADS = 10


WORKLOAD = ["cluster", "namespace", "workload"]


def workloads_table(we: pl.DataFrame) -> Table:
    """The day's workloads with the most recoverable waste (`top_workloads`), money first; a
    workload whose cost is all unmeasured (MIG) says so, not $0.00."""
    money = ("_waste", "cost_usd")
    unmeasured = we.group_by(WORKLOAD).agg(priced_total("unmeasured_usd"))
    top = with_waste_text(
        top_workloads(we.lazy(), TOP_WORKLOADS), unmeasured, WORKLOAD, "total_waste_usd"
    )
    per_gpu = [
        f"n/a ({UNMEASURED})" if u else NO_PRICE if v is None else dollars(v)
        for v, u in top.select("monthly_waste_per_gpu", "_unmeasured_all").iter_rows()
    ]
    return table(
        top.with_columns(pl.Series("_per_gpu", per_gpu, pl.String)),
        ["namespace", "workload", *money, "_per_gpu", "gpu_hours", "cluster"]
        + ["main_diagnosis", "top_action"],
        {"_waste": str, "_per_gpu": str, "cost_usd": dollars, "gpu_hours": one},
        # a workload on models without a price has no cost (the mart's null); no rule fires
        {"cost_usd": NO_PRICE}
        | {"workload": NO_WORKLOAD, "main_diagnosis": "n/a", "top_action": "none"},
        codes={"main_diagnosis": DIAGNOSES, "top_action": ACTIONS},
        heads={"_waste": LABELS["total_waste_usd"], "_per_gpu": LABELS["monthly_waste_per_gpu"]},
        cls="workloads",
    )


def month_table(m: data.MonthToDate | None, day) -> dict | None:
    """The month to date, one line per namespace: days, GPU-hours, cost, waste, energy, RFU; a
    namespace whose cost is all unmeasured (MIG) says so, as in the namespaces table, not $0.00."""
    if m is None or not m.namespaces.height:
        return None
    ns = m.namespaces
    unmeasured = ns.select("namespace", "unmeasured_usd")  # month_to_date's, from priced_waste
    cols = ["namespace", "days_covered", "gpu_hours", "cost_usd", "_waste", "energy_kwh"]
    return {
        "note": f"{m.first:%B %Y} from {m.first} to {day}: {plural(len(m.days), 'day')} of it "
        "in the lake. All clusters together; gpu-pipeline showback writes the month per "
        "cluster and namespace.",
        "table": table(
            with_waste_text(ns, unmeasured, ["namespace"], "waste_usd"),
            [*cols, "avg_rfu_pct"],
            {"gpu_hours": one, "energy_kwh": one, "avg_rfu_pct": one}
            | {"cost_usd": dollars, "_waste": str},
            {"cost_usd": NO_PRICE, "energy_kwh": NO_POWER, "avg_rfu_pct": "n/a"},
            # the month's totals, not per day (LABELS' cost is the day's)
            heads={"days_covered": "days", "cost_usd": "cost", "_waste": "waste"}
            | {"energy_kwh": "kWh"},
            cls="month",
        ),
    }


def health(h: pl.DataFrame, rules: Rules) -> dict:
    """The GPUs ok of all, the rule for a warning, the ok GPUs that were hot for less than it
    (counted, not listed: a minute's spike is no alert), and the table of the others."""
    r = rules.health
    bad = h.filter(pl.col("status") != "ok")
    warm = h.filter(pl.col("status") == "ok", pl.col("hot_minutes") > 0)
    return {
        "ok": h.height - bad.height,
        "gpus": plural(h.height, "GPU"),
        "warn_after": plural(r.hot_warn_minutes, "minute"),
        "hot_from": f"{r.hot_from_c:g}",
        "warn_minutes": r.hot_warn_minutes,
        "warm": f"{warm.height:,}" if warm.height else "",
        "warm_most": plural(int(warm["hot_minutes"].max()), "minute") if warm.height else "",
        "table": table(bad, ["gpu_uuid", "hostname", "status", "reasons"]) if bad.height else None,
    }


def stragglers_table(strag: pl.DataFrame) -> Table:
    numbers = ("value", "pod_median", "points_below", "pod_stddev")
    return table(
        strag.head(50),
        ["hour", "pod", "gpu_uuid", "rule", "metric", *numbers],
        dict.fromkeys(numbers, one),
        codes={"rule": STRAGGLER_RULES, "metric": METRICS},
    )


def no_data(ingest: dict) -> dict:
    """A day without GPU-minutes: what was read and rejected, and the most common reasons."""
    if not ingest["read"]:
        return {"read": ""}
    reasons = [
        (str(r["reason"])[:300], f"{r['len']:,}") for r in ingest["reasons"].iter_rows(named=True)
    ]
    return {
        "read": f"{ingest['read']:,}",
        "files": f"{ingest['files']:,}",
        "rejected": f"{ingest['rejected']:,}",
        "failed": bool(ingest["rejected"]),
        "duplicate": f"{ingest['duplicate']:,}" if ingest["duplicate"] else "",
        "reasons": reasons,
    }


def appendix(m: data.Marts, f: data.InForce) -> dict:
    """The appendix a reader checks the dollars against: the price book entries of the day's
    models (file, line, source; `reference.prices_used`) and those the day's minutes were
    priced otherwise than the book says, the energy rates of its clusters and the rules in
    force, each changed rule beside its default; an unreadable file: why."""
    from gpu_pipeline.lib.reference import DEFAULT_ENERGY, DEFAULT_PRICES, ReferenceError

    out = {
        "told": f.told,
        "prices": {"file": f.prices, "default": DEFAULT_PRICES.name},
        "energy": {"file": f.energy, "default": DEFAULT_ENERGY.name},
        "rules": rules(f),
    }
    try:
        out["prices"] |= prices(m.minutes, f.prices)
    except ReferenceError as e:
        out["prices"]["error"] = str(e)
    try:
        rates = data.energy_rates_of_day(m.gpus, f.energy)
    except ReferenceError as e:
        out["energy"]["error"] = str(e)
    else:
        out["energy"]["table"] = table(
            rates,
            ["cluster", "usd_per_kwh", "co2_g_per_kwh", "row"],
            {"usd_per_kwh": lambda v: f"${v:,.3f}", "co2_g_per_kwh": lambda v: f"{v:,.0f}"},
            {"cluster": "(no cluster)", "usd_per_kwh": "none", "co2_g_per_kwh": "none"},
            heads={"usd_per_kwh": "$/kWh", "co2_g_per_kwh": "g CO₂/kWh", "row": "rate from"},
            cls="appendix",
        )
    return out


def prices(m: pl.LazyFrame, path: str | None) -> dict:
    """The price book's entries the day used, and its models priced otherwise than the book
    says (raises ReferenceError: the book cannot be read)."""
    from gpu_pipeline.lib.reference import prices_used

    used = prices_used(m, path)
    entries = table(
        used,
        ["gpu_model", "gpu_hours", "usd_per_hour", "spot_usd_per_hour", "source", "line"],
        {"gpu_hours": lambda v: f"{v:,.1f}", "usd_per_hour": dollars}
        | {"spot_usd_per_hour": dollars},
        {
            "usd_per_hour": "no price (not in the price book)",
            "spot_usd_per_hour": "none",
            "source": "not in the price book",
            "line": "–",
            "gpu_model": "(no model)",
        },
        heads={
            "usd_per_hour": "on-demand $/GPU-hour",
            "spot_usd_per_hour": "spot $/GPU-hour",
            "line": "line",
        },
        cls="appendix",
    )
    other = [
        {
            "model": shown(r["gpu_model"], SENTENCE_CHARS, "(no model)"),
            "applied": num(r["usd_per_hour"], ",.2f", "no price"),
            "book": num(r["on_demand_usd_per_hour"], ",.2f", "no price"),
        }
        for r in used.filter(~pl.col("matches")).iter_rows(named=True)
    ]
    return {"table": entries, "other": other}


def rules(f: data.InForce) -> dict:
    """The rules in force, by section of the rules file, each changed one with its default."""
    sections: dict[str, list[tuple[str, str, str]]] = {}
    changed = 0
    for sec, key, v, default in data.rules_in_force(f.rules):
        sections.setdefault(sec, []).append(
            (key, f"{v:g}", "" if default is None else f"{default:g}")
        )
        changed += default is not None
    return {"file": f.rules_file, "changed": plural(changed, "rule"), "sections": sections}


def context(d: data.ReportData, drawn: list[Chart], f: data.InForce) -> dict:
    """The template's values for a day with GPU-minutes: each section's, None where the day
    has nothing to show; each chart with the section under it."""
    m, t = d.marts, d.t
    after = {
        "Fleet trend": lambda: ("trend", trend_table(d.trend)),
        "GPU model comparison": lambda: ("capacity", capacity_table(d.capacity)),
        "Bottlenecked GPUs": lambda: ("persistent", persistent(m.persistent, m.daily, t)),
        "Recommendations": lambda: ("recommendations", recommendation_tables(m.rec, d.period)),
    }
    nse, strag, we = m.namespaces, m.stragglers, m.workloads
    return {
        "day": d.day,
        "partial": partial(d.fleet, m.daily, t),
        "kpis": kpis(d.fleet, m.waste, nse, data.fleet_minutes(m.gpus), m.priced),
        "minutes": minutes_note(data.fleet_minutes(m.gpus)),
        "phases": phases(d.fleet, t),
        "first": None if m.rec is None else first(m.rec, d.period),
        "price": None if m.rec is None else price(m.rec, d.period),
        "spot": coded("spot", ACTIONS),
        "bottlenecked": bottlenecked_today(m.daily),
        "charts": [chart(c, after[c.title]() if c.title in after else None) for c in drawn],
        "namespaces": namespaces_table(nse, m.waste) if nse is not None and nse.height else None,
        "workloads": workloads_table(we) if we is not None and we.height else None,
        "month": month_table(d.month, d.day),
        "health": None if m.health is None else health(m.health, f.rules),
        "stragglers": stragglers_table(strag) if strag is not None and strag.height else None,
        "appendix": appendix(m, f),
    }
