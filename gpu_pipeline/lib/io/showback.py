"""The showback file: a month of `namespace_monthly` as the table a FinOps team sends to
namespace owners, in CSV or Excel (xlsx, written by XlsxWriter through Polars' `write_excel`).

Money is rounded to the cent (`money.cents`), GPU-hours and kWh to two decimals, RFU to one;
a namespace the telemetry does not name reads as the report says it (`display.NO_NAMESPACE`).
The workbook has the table (a header row, filters, frozen panes) and a second sheet saying what
the month covers (the month to date: the days so far) and what each column means.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from gpu_pipeline.lib import money
from gpu_pipeline.lib.columns import describe
from gpu_pipeline.lib.display import NO_NAMESPACE
from gpu_pipeline.lib.io.lake import Lake, replace_file
from gpu_pipeline.lib.marts.namespace_monthly import MONTH_FORMAT, month_days
from gpu_pipeline.lib.money import cents

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
)


class NoMonth(LookupError):
    """The lake holds no namespace_monthly partition of the month."""


def showback_table(lake: Lake, month: date) -> pl.DataFrame:
    """The month's rows as the file shows them (NoMonth when the lake has none)."""
    if not lake.exists(TABLE, month):
        held = [d.strftime(MONTH_FORMAT) for d in lake.days(TABLE)]
        has = f"it holds {', '.join(held)}" if held else "it holds no month yet"
        raise NoMonth(
            f"no {TABLE} for {month.strftime(MONTH_FORMAT)} in the lake {lake.uri}; {has} "
            "(gpu-pipeline materialize writes the months of its days)"
        )
    df = lake.read(TABLE, month)
    return df.select(
        "month",
        "cluster",
        pl.col("namespace").fill_null(NO_NAMESPACE),
        "days_covered",
        pl.col("gpu_hours").round(2),
        *[cents(pl.col(c)) for c in MONEY],
        pl.col("energy_kwh").round(2),
        pl.col("avg_rfu_pct").round(1),
    ).sort("cluster", "namespace")


def coverage(lake: Lake, month: date, today: date | None = None) -> dict:
    """What the month covers: its days in the lake, of how many, and whether it is the month
    to date."""
    today = today or datetime.now(UTC).date()
    days = month_days(month)
    have = [d for d in days if lake.exists("priced_waste", d)]
    return {
        "month": month.strftime(MONTH_FORMAT),
        "days_in_lake": len(have),
        "days_in_month": len(days),
        "first_day": str(have[0]) if have else "",
        "last_day": str(have[-1]) if have else "",
        "month_to_date": days[0] <= today <= days[-1],
    }


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

    formats = {c: "#,##0.00" for c in (*MONEY, "gpu_hours", "energy_kwh")}
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
            ("first day", about["first_day"]),
            ("last day", about["last_day"]),
            ("", ""),
            *[(c, describe(TABLE, c) or "") for c in COLUMNS],
        ]
        pl.DataFrame(notes, schema=["item", "value"], orient="row").write_excel(
            wb, worksheet="about", autofit=True, header_format={"bold": True}
        )


def write_showback(lake: Lake, month: date, fmt: str, out: Path) -> tuple[pl.DataFrame, dict]:
    """Write the month's showback file at `out` in `fmt` (csv or xlsx); its rows and what it
    covers."""
    if fmt not in FORMATS:
        raise ValueError(f"not a showback format: {fmt!r} (one of {', '.join(FORMATS)})")
    df = showback_table(lake, month)
    about = coverage(lake, month)
    if fmt == "csv":
        replace_file(out, lambda tmp: write_csv(df, tmp))
    else:
        replace_file(out, lambda tmp: write_xlsx(df, about, tmp))
    return df, about
