"""The showback file: a month of `namespace_monthly` as the table a FinOps team sends to
namespace owners, in CSV or Excel (xlsx, written by XlsxWriter through Polars' `write_excel`).

The rows are always those of the days the file says it covers, the month's `priced_waste`
partitions in the lake now (`month_rows`): the stored month when it is what those days sum to,
else (a day written since the month was made, by a schedule's run while
`monthly_automation_sensor` is off; a month never made) the month computed from the days as
`namespace_monthly_job` makes it, and `about["computed"]` says why (the lake's partition is
not rewritten: showback only reads). A day written without any GPU-minute (`--allow-empty`) is
a day in the lake without data, named as such (`empty_days`).

Money is rounded to the cent so that each row's printed parts add up to its printed cost
(`cents_adding_up`: largest remainder), GPU-hours and kWh to two decimals, RFU to one; a
namespace the telemetry does not name reads as the report says it (`display.NO_NAMESPACE`).
The workbook has the table (a header row, filters, frozen panes) and a second sheet saying what
the month covers (the month to date: the days so far) and what each column means.
"""

from __future__ import annotations

import math
import shlex
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from gpu_pipeline.lib import money
from gpu_pipeline.lib.columns import describe
from gpu_pipeline.lib.display import NO_NAMESPACE
from gpu_pipeline.lib.io.lake import Lake, replace_file
from gpu_pipeline.lib.marts.namespace_monthly import (
    KEYS,
    MONTH_FORMAT,
    month_days,
    month_money,
    month_of_days,
)
from gpu_pipeline.lib.money import cents
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking

TABLE = "namespace_monthly"
FORMATS = ("csv", "xlsx")
# the money columns of the file: the minutes' (money.MONEY) and their waste total
MONEY = (*money.MONEY, "total_waste_usd")
# the file's columns, in order
COLUMNS = (
    "month",
    "cluster",
    "namespace",
    "days_covered",
    "gpu_hours",
    *MONEY,
    "energy_kwh",
    "avg_rfu_pct",
    # added after the others (a file's columns are a contract: added, never moved)
    "unpriced_gpu_hours",
)
# the parts a row's cost is split into (money.MONEY after cost_usd); total_waste_usd is the sum
# of the waste among them
PARTS = money.MONEY[1:]
WASTE_PARTS = ("idle_waste_usd", "stall_waste_usd", "headroom_waste_usd")
# the sums a stored month is checked against its days with (`_matches`)
CHECKED = ("days_covered", "gpu_hours", "unpriced_gpu_hours", *MONEY)
# two sums of the same rows differ by float rounding only: within this relative tolerance
SAME_SUM = 1e-9


class NoMonth(LookupError):
    """The lake holds neither a namespace_monthly partition of the month nor a day of it."""


def lake_days(lake: Lake, month: date) -> tuple[list[date], list[date]]:
    """The month's days the lake holds (a `priced_waste` partition), and those of them written
    without any GPU-minute (a zero-row partition: `materialize --allow-empty`)."""
    days = [d for d in month_days(month) if lake.exists("priced_waste", d)]
    return days, [d for d in days if lake.row_count("priced_waste", d) == 0]


def _no_month(lake: Lake, month: date) -> NoMonth:
    held = [d.strftime(MONTH_FORMAT) for d in lake.days(TABLE)]
    has = f"it holds {', '.join(held)}" if held else "it holds no month yet"
    return NoMonth(
        f"no {TABLE} for {month.strftime(MONTH_FORMAT)} in the lake {lake.uri}; {has} "
        "(gpu-pipeline materialize writes the months of its days)"
    )


def _stale(stored: pl.DataFrame, want: pl.DataFrame) -> str | None:
    """How the stored month differs from what its days' priced_waste gives now (`want`, rows
    and sums `CHECKED`), in words; None when it does not."""
    lacks = [c for c in CHECKED if c not in stored.columns]
    if lacks:
        return f"was made before its column(s) {', '.join(lacks)}"
    both = stored.select(*KEYS, *CHECKED).join(
        want.select(*KEYS, *CHECKED), on=list(KEYS), nulls_equal=True, suffix="_days"
    )
    same = stored.height == want.height == both.height
    for c in CHECKED if same else ():
        a, b = pl.col(c).cast(pl.Float64), pl.col(f"{c}_days").cast(pl.Float64)
        equal = (a.is_null() & b.is_null()) | ((a - b).abs() <= SAME_SUM * b.abs().clip(1.0, None))
        same = both.select(equal.fill_null(False).all()).item()
        if not same:
            break
    return None if same else "is older than its days"


def _sums(df: pl.DataFrame) -> str:
    rows = "1 row" if df.height == 1 else f"{df.height} rows"
    return f"{df['gpu_hours'].sum():,.2f} GPU-hours in {rows}"


def store_command(lake: Lake, month: date) -> str:
    """The command that makes the month again from its days and stores it (what
    `namespace_monthly_job` runs)."""
    return (
        f"GPU_PIPELINE_LAKE={shlex.quote(lake.uri)} dagster asset materialize -m "
        f"gpu_pipeline.definitions --select {TABLE} --partition {month.strftime(MONTH_FORMAT)}"
    )


def month_rows(
    lake: Lake, month: date, days: list[date], chunking: Chunking = DEFAULT_CHUNKING
) -> tuple[pl.DataFrame, str | None]:
    """The month's namespace_monthly rows made from `days` (its days in the lake, `lake_days`),
    and None when they are the stored partition's, else why they were computed from the days
    (the stored month is older than its days, or there is none). NoMonth without either."""
    label = month.strftime(MONTH_FORMAT)
    stored = lake.read(TABLE, month) if lake.exists(TABLE, month) else None
    if stored is None and not days:
        raise _no_month(lake, month)
    priced = lake.read_days("priced_waste", days)
    stale = "" if stored is None else _stale(stored, collect_stable(month_money(priced.lazy())))
    if stale is None:
        return stored, None
    minutes = (lake.scan_days("gpu_minutes", [d]) for d in days)
    with lake.reading("gpu_minutes", days):  # a page that does not decode is named
        rows = month_of_days(priced.lazy(), minutes, month, chunking)
    if stored is None:
        why = f"the lake has no {TABLE} for {label}"
    else:  # made before a day was written (or written again), or before a column was added
        why = (
            f"the lake's {TABLE} for {label} {stale} ({_sums(stored)}; its days now {_sums(rows)})"
        )
    return rows, f"{why}: the rows are computed from its {len(days)} day(s) in the lake"


def cents_adding_up(total: float | None, parts: list[float | None]) -> list[float | None]:
    """`parts` of `total` in cents, adding up to `total` rounded to the cent (largest remainder:
    each part rounded down, then the cents left given one each to the parts with the largest
    remainders, the first on a tie). Parts that cannot add up to it (a null one, or sums more
    than a cent a part apart) are each rounded on their own."""
    if (
        total is None
        or not math.isfinite(total)
        or any(p is None or not math.isfinite(p) for p in parts)
    ):
        return [None if p is None else round(p, 2) for p in parts]  # NaN stays NaN, not an error
    scaled = [round(p * 100.0, 6) for p in parts]  # a rounding error off a cent is that cent
    floors = [math.floor(x) for x in scaled]
    left = round(total * 100.0) - sum(floors)
    if not 0 <= left <= len(parts):
        return [round(p, 2) for p in parts]
    # remainders to a ten-thousandth of a cent: equal ones tie (the first part goes first)
    order = sorted(range(len(parts)), key=lambda i: (-round(scaled[i] - floors[i], 4), i))
    for i in order[:left]:
        floors[i] += 1
    return [f / 100.0 for f in floors]


def _money_in_cents(df: pl.DataFrame) -> pl.DataFrame:
    """Each row's money in cents: cost rounded, its parts adding up to it (`cents_adding_up`),
    total_waste_usd the sum of the waste parts as rounded (null where the lake's is)."""
    rows = [cents_adding_up(r[0], list(r[1:])) for r in df.select("cost_usd", *PARTS).iter_rows()]
    parts = pl.DataFrame(rows, schema=dict.fromkeys(PARTS, pl.Float64), orient="row")
    waste = pl.sum_horizontal(WASTE_PARTS).round(2)
    return df.with_columns(cents(pl.col("cost_usd")), *parts.get_columns()).with_columns(
        pl.when(pl.col("total_waste_usd").is_not_null()).then(waste).alias("total_waste_usd")
    )


def showback_table(rows: pl.DataFrame) -> pl.DataFrame:
    """The month's rows (`month_rows`) as the file shows them."""
    if "unpriced_gpu_hours" not in rows.columns:  # a partition written before the column
        rows = rows.with_columns(pl.lit(None, pl.Float64).alias("unpriced_gpu_hours"))
    df = rows.select(
        "month",
        "cluster",
        pl.col("namespace").fill_null(NO_NAMESPACE),
        "days_covered",
        pl.col("gpu_hours").round(2),
        *MONEY,
        pl.col("energy_kwh").round(2),
        pl.col("avg_rfu_pct").round(1),
        pl.col("unpriced_gpu_hours").round(2),
    ).sort("cluster", "namespace")
    return _money_in_cents(df).select(COLUMNS)


def coverage(month: date, days: list[date], empty: list[date], today: date | None = None) -> dict:
    """What the month covers: its days in the lake (`lake_days`), of how many, those of them
    without data, and whether it is the month to date."""
    today = today or datetime.now(UTC).date()
    all_days = month_days(month)
    data = [d for d in days if d not in empty]
    return {
        "month": month.strftime(MONTH_FORMAT),
        "days_in_lake": len(days),
        "days_with_data": len(data),
        "empty_days": [str(d) for d in empty],
        "days_in_month": len(all_days),
        "first_day": str(data[0]) if data else "",
        "last_day": str(data[-1]) if data else "",
        "month_to_date": all_days[0] <= today <= all_days[-1],
        "computed": None,
    }


def covered(about: dict) -> str:
    """`3 of 29 days, 1 of them without data (2024-02-26)`: what the file covers, in words."""
    text = f"{about['days_in_lake']} of {about['days_in_month']} days"
    empty = about.get("empty_days") or []
    if empty:
        them = "it" if about["days_in_lake"] == 1 else "them"
        text += f", {len(empty)} of {them} without data ({', '.join(empty)}: no GPU-minute)"
    return text


def showback_lines(out: Path, df: pl.DataFrame, about: dict) -> list[str]:
    """What `gpu-pipeline showback` prints: the file, its rows and days, and where its rows
    were computed from the days rather than read from the stored month, why."""
    to_date = ", month to date" if about["month_to_date"] else ""
    lines = [f"wrote {out} ({df.height} rows; {about['month']}: {covered(about)}{to_date})"]
    if about.get("computed"):
        lines.append(
            f"  note: {about['computed']}, not stored; to store the month: {about['store']}"
        )
    if about.get("rates"):
        lines.append(f"  note: {about['rates']}")
    return lines


# a cell a spreadsheet would read as a formula (OWASP's "CSV injection"): the telemetry's labels
# are other people's text, and a showback file is opened in a spreadsheet
FORMULA_START = r"^[=+\-@\t\r]"


def _as_text(df: pl.DataFrame) -> pl.DataFrame:
    """The text columns with a cell that starts like a formula given a leading `'`, which a
    spreadsheet shows as text (Kubernetes names never start so: only forged labels change)."""
    text = [c for c, t in df.schema.items() if t == pl.String]
    return df.with_columns(
        pl.when(pl.col(c).str.contains(FORMULA_START))
        .then(pl.lit("'") + pl.col(c))
        .otherwise(pl.col(c))
        .alias(c)
        for c in text
    )


def write_csv(df: pl.DataFrame, out: Path) -> None:
    _as_text(df).write_csv(out)


def write_xlsx(df: pl.DataFrame, about: dict, out: Path) -> None:
    """The table on sheet `showback`, what it covers and its columns' meanings on `about`."""
    import xlsxwriter

    formats = {c: "#,##0.00" for c in (*MONEY, "gpu_hours", "energy_kwh", "unpriced_gpu_hours")}
    # every string a string: XlsxWriter otherwise writes one that starts with `=` as a formula,
    # which runs when the workbook is opened (adversarial review: a namespace label did)
    with xlsxwriter.Workbook(out, {"strings_to_formulas": False, "strings_to_urls": False}) as wb:
        df.write_excel(
            wb,
            worksheet="showback",
            column_formats={**formats, "avg_rfu_pct": "0.0"},
            header_format={"bold": True},
            autofit=True,
            freeze_panes=(1, 0),
            table_style="Table Style Light 9",
        )
        notes = [
            ("month", about["month"]),
            ("month to date", "yes: the days so far" if about["month_to_date"] else "no"),
            ("days in the lake", f"{about['days_in_lake']} of {about['days_in_month']}"),
            ("days without data", ", ".join(about.get("empty_days") or []) or "none"),
            ("first day", about["first_day"]),
            ("last day", about["last_day"]),
            ("made from", about.get("computed") or f"the lake's {TABLE}, current with its days"),
            *([("to store the month", about["store"])] if about.get("computed") else []),
            *([("prices", about["rates"])] if about.get("rates") else []),
            (
                "money",
                "rounded to the cent; each row's parts add up to its cost (largest remainder)",
            ),
            ("", ""),
            *[(c, describe(TABLE, c) or "") for c in COLUMNS],
        ]
        pl.DataFrame(notes, schema=["item", "value"], orient="row").write_excel(
            wb, worksheet="about", autofit=True, header_format={"bold": True}
        )


def price_changes(lake: Lake, days: list[date]) -> str | None:
    """The models the month's days were priced at different rates (a price book edited or
    another one given between the days' runs), each with its rates and days, in words; None
    when every model had one rate. A rate is a day's cost over its GPU-hours of the model in
    priced_waste (each minute costs its price x its GPU share / 60). The month added the days'
    dollars as they were, with no word of two books (adversarial review)."""
    rate = (pl.col("cost_usd").sum() / pl.col("gpu_hours").sum()).round(4).alias("rate")
    per = (
        lake.scan_days("priced_waste", days)
        .filter(pl.col("cost_usd").is_not_null() & (pl.col("gpu_hours") > 0))
        .group_by("gpu_model", "date")
        .agg(rate)
        .collect()
    )
    parts = []
    for (model,), g in per.sort("gpu_model", "date").group_by("gpu_model", maintain_order=True):
        if g.get_column("rate").n_unique() < 2:
            continue
        spans = g.group_by("rate", maintain_order=True).agg(pl.col("date"))
        said = [
            f"${r:,.2f} ({', '.join(str(d) for d in ds)})"
            for r, ds in spans.select("rate", "date").iter_rows()
        ]
        parts.append(f"{model} at {' and '.join(said)}")
    if not parts:
        return None
    return (
        "the days were priced at different rates (the price book changed between their runs): "
        + "; ".join(parts)
        + "; run the days again with one book to bill at one rate"
    )


def write_showback(lake: Lake, month: date, fmt: str, out: Path) -> tuple[pl.DataFrame, dict]:
    """Write the month's showback file at `out` in `fmt` (csv or xlsx); its rows and what it
    covers (`about["computed"]`: why the rows were computed from the days, or None)."""
    if fmt not in FORMATS:
        raise ValueError(f"not a showback format: {fmt!r} (one of {', '.join(FORMATS)})")
    days, empty = lake_days(lake, month)
    rows, computed = month_rows(lake, month, days)
    df = showback_table(rows)
    about = coverage(month, days, empty) | {
        "computed": computed,
        "store": store_command(lake, month) if computed else None,
        "rates": price_changes(lake, days),
    }
    if fmt == "csv":
        replace_file(out, lambda tmp: write_csv(df, tmp))
    else:
        replace_file(out, lambda tmp: write_xlsx(df, about, tmp))
    return df, about
