"""Asset checks evaluated on the partition just written (embedded `check_specs`), and freshness.

Blocking checks stop downstream assets of the run when a wrong number would flow on; the
validation pass rate only warns, since quarantining bad rows is the pipeline doing its job.
"""

import dagster as dg
import polars as pl

from gpu_pipeline.defs.metadata import markdown_preview
from gpu_pipeline.lib.rules import HOURS_PER_MONTH, PHASES

MIN_PASS_RATE = 0.95
CENT = 0.005
# metadata values that are rates or percentages of one day: never summed over a run's days
NOT_SUMMED = ("pass_rate", "coverage_pct", "warn_below_pct")


def merge(
    results: list[dg.AssetCheckResult], parts: str = "days", labels: list | None = None
) -> dg.AssetCheckResult:
    """One result for a run over several days (or a day's chunks): passed when every part
    passed; counts summed; `labels` name the parts (the days) so the failed ones are listed.

    Dagster 1.13 records one evaluation per check and step: a check result cannot name a
    partition of a range run (materializations can, see `daily.day_metadata`)."""
    first = results[0]
    meta: dict = {}
    for r in results:
        for k, v in r.metadata.items():
            val = getattr(v, "value", v)
            if isinstance(val, int | float) and not isinstance(val, bool) and k not in NOT_SUMMED:
                meta[k] = meta.get(k, 0) + val
            else:
                meta[k] = v  # markdown and rates: the last day's
    if len(results) > 1:
        # the coverage of the whole range, from its summed minutes
        if exp := meta.get("expected_gpu_minutes"):
            meta["coverage_pct"] = dg.MetadataValue.float(
                100.0 * meta["observed_gpu_minutes"] / exp
            )
        meta[parts] = len(results)
        meta[f"{parts}_failed"] = sum(not r.passed for r in results)
        if labels is not None:
            meta[f"failed_{parts}"] = (
                ", ".join(str(x) for x, r in zip(labels, results, strict=True) if not r.passed)
                or "none"
            )
    # the failed parts' own words ("no records landed for the day"), with their day
    said = [
        (f"{x}: " if labels is not None and len(results) > 1 else "") + r.description
        for x, r in zip(labels or [None] * len(results), results, strict=True)
        if r.description and not r.passed
    ]
    return dg.AssetCheckResult(
        asset_key=first.asset_key,
        check_name=first.check_name,
        passed=all(r.passed for r in results),
        severity=first.severity,
        metadata=meta,
        description="; ".join(said[:10])
        + (f" … and {len(said) - 10} more" if len(said) > 10 else "")
        if said
        else None,
    )


def spec(asset: str, name: str, description: str, blocking: bool = True) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(name=name, asset=asset, description=description, blocking=blocking)


def validation_pass_rate(log: pl.DataFrame, quarantine: pl.DataFrame) -> dg.AssetCheckResult:
    """Share of the day's rows that passed validation, with the failure cases."""
    read = int(log["rows_read"].sum())
    bad = int(log["rows_quarantined"].sum())
    rate = 0.0 if read == 0 else (read - bad) / read  # nothing read: nothing passed
    reasons = (
        quarantine.group_by("reason")
        .agg(pl.len().alias("rows"), pl.col("source_file").n_unique().alias("files"))
        .sort("rows", descending=True)
        .head(20)
    )
    return dg.AssetCheckResult(
        asset_key="gpu_samples",
        check_name="validation_pass_rate",
        # a day nothing landed for passed as 100 %: an exporter outage went green (review)
        passed=read > 0 and rate >= MIN_PASS_RATE,
        severity=dg.AssetCheckSeverity.WARN,
        description=None if read else "no records landed for the day",
        metadata={
            "pass_rate": dg.MetadataValue.float(rate),
            "rows_read": read,
            "rows_quarantined": bad,
            "failure_cases": dg.MetadataValue.md(
                markdown_preview(reasons, rows=20) if reasons.height else "none"
            ),
        },
    )


def utilization_present(log: pl.DataFrame) -> dg.AssetCheckResult:
    """Files that gave samples but no GPU utilization field at all (a hand-written header that
    names it differently, an export without it): their minutes' phase is unknown. Warns."""
    without = log.filter(
        (pl.col("rows_accepted") > 0)
        & ~pl.col("fields").list.contains("gpu_util_pct").fill_null(False)
    )
    return dg.AssetCheckResult(
        asset_key="gpu_samples",
        check_name="utilization_present",
        passed=without.height == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "files_without_utilization": without.height,
            "files": dg.MetadataValue.md(
                "\n".join(f"- {f}" for f in without["source_file"].head(20)) or "none"
            ),
        },
    )


def made_from_one_ingest(lake, day, tables: list[str]) -> dg.AssetCheckResult:
    """Every table of the day names the same ingest (`Lake.lineage`): a run killed between its
    steps, or another run of the day between them, leaves tables of two ingests side by side."""
    found = {t: lake.lineage(t, day) for t in tables}
    ids = {v for v in found.values() if v}
    raw = found.get("gpu_samples")
    off = sorted(t for t, v in found.items() if v and v != raw)
    return dg.AssetCheckResult(
        asset_key="daily_report",
        check_name="made_from_one_ingest",
        passed=len(ids) <= 1,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "ingests": len(ids),
            "tables_from_another_ingest": ", ".join(off) or "none",
        },
    )


def row_conservation(log: pl.DataFrame) -> dg.AssetCheckResult:
    """Every row read is accepted, quarantined or a counted duplicate."""
    off = log.filter(
        pl.col("rows_read")
        != pl.col("rows_accepted") + pl.col("rows_quarantined") + pl.col("rows_duplicate")
    )
    return dg.AssetCheckResult(
        asset_key="ingest_log",
        check_name="row_conservation",
        passed=off.height == 0,
        metadata={
            "files": log.height,
            "files_off": off.height,
            "rows_read": int(log["rows_read"].sum()) if log.height else 0,
        },
    )


def fleet_coverage(
    fleet: pl.DataFrame, daily: pl.DataFrame, warn_below: float
) -> dg.AssetCheckResult:
    """The day's data covers at least `warn_below` % of its GPU-minutes (observed GPU-minutes /
    (GPUs seen x 1,440)); below, a warning listing the least covered GPUs. A day without any
    GPU-minute warns too: no GPU was seen (an exporter outage, not a fleet at rest)."""
    if fleet.height:
        row = fleet.row(0, named=True)
        observed, expected, gpus = (
            row["observed_gpu_minutes"],
            row["expected_gpu_minutes"],
            row["gpus"],
        )
        coverage = row["coverage_pct"]
    else:
        observed = expected = gpus = 0
        coverage = None
    low = (
        daily.filter(pl.col("gpu_instance_id").is_null(), pl.col("coverage_pct") < warn_below)
        .sort("coverage_pct", "gpu_uuid")
        .select("gpu_uuid", "hostname", "cluster", "minutes", "coverage_pct")
    )
    return dg.AssetCheckResult(
        asset_key="fleet_daily",
        check_name="fleet_coverage",
        passed=coverage is not None and coverage >= warn_below,  # no GPU seen: nothing covered
        description="no GPU seen: nothing landed for the day" if coverage is None else None,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            **({} if coverage is None else {"coverage_pct": dg.MetadataValue.float(coverage)}),
            "warn_below_pct": dg.MetadataValue.float(warn_below),
            "observed_gpu_minutes": observed,
            "expected_gpu_minutes": expected,
            # a day's GPUs; summed over a range run's days, GPU-days
            "gpu_days": gpus,
            "gpu_days_below": low.height,
            "least_covered_gpus": dg.MetadataValue.md(
                markdown_preview(low, rows=10) if low.height else "none"
            ),
        },
    )


def minutes_add_up(written_rows: int | None, daily: pl.DataFrame) -> dg.AssetCheckResult:
    """The day's gpu_minutes file holds as many rows as gpu_daily counts GPU-minutes: two
    counts of separate paths (the file's own footer; the minute runs), so a write that lost or
    repeated rows fails. (Each chunk's uniqueness is the gpu_minutes model's to enforce.)"""
    counted = int(daily.get_column("minutes").sum()) if daily.height else 0
    written = written_rows or 0
    return dg.AssetCheckResult(
        asset_key="gpu_minutes",
        check_name="minutes_add_up",
        passed=written == counted,
        metadata={"rows_in_file": written, "gpu_minutes_counted": counted},
    )


def phase_shares_sum_to_100(h: pl.DataFrame) -> dg.AssetCheckResult:
    total = h.select(pl.sum_horizontal([pl.col(f"pct_{p}") for p in PHASES]).alias("t")).filter(
        pl.col("t").is_not_null()
    )
    off = total.filter((pl.col("t") - 100).abs() > 1e-6).height
    return dg.AssetCheckResult(
        asset_key="hourly_fleet_metrics",
        check_name="phase_shares_sum_to_100",
        passed=off == 0,
        metadata={"groups": total.height, "groups_off": off},
    )


def cost_split_sums_to_cost(
    w: pl.DataFrame, asset_key: str = "priced_waste"
) -> dg.AssetCheckResult:
    """Each priced group's split adds up to its cost, and its monthly waste is the hourly one
    x 24 x 30 to the cent (priced_waste, workload_efficiency)."""
    parts = pl.sum_horizontal(
        "productive_usd",
        "idle_waste_usd",
        "stall_waste_usd",
        "headroom_waste_usd",
        "unmeasured_usd",
    )
    priced = w.filter(pl.col("cost_usd").is_not_null())
    off = priced.filter((parts - pl.col("cost_usd")).abs() > CENT)
    monthly_off = priced.filter(
        (
            pl.col("monthly_waste_usd") - (pl.col("hourly_waste_usd") * HOURS_PER_MONTH).round(2)
        ).abs()
        > CENT
    )
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name="cost_split_sums_to_cost",
        passed=off.height == 0 and monthly_off.height == 0,
        metadata={
            "groups": priced.height,
            "groups_off": off.height,
            "monthly_off": monthly_off.height,
        },
    )


def savings_within_measured_waste(r: pl.DataFrame) -> dg.AssetCheckResult:
    bad = r.filter(
        (pl.col("utilization_savings_frac") > pl.col("measured_waste_frac") + 1e-9)
        | (pl.col("total_savings_frac") > 1)
        | (
            (
                1
                - (1 - pl.col("utilization_savings_frac")) * (1 - pl.col("rate_savings_frac"))
                - pl.col("total_savings_frac")
            ).abs()
            > 1e-9
        )
    )
    return dg.AssetCheckResult(
        check_name="savings_within_measured_waste",
        passed=bad.height == 0,
        metadata={"namespaces": r.height, "namespaces_off": bad.height},
    )
