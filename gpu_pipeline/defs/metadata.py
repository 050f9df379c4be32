"""Materialization metadata shared by all assets: column schema, row count, preview, path."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from gpu_pipeline.lib.columns import describe
from gpu_pipeline.lib.schemas import TABLES


def column_schema(table: str) -> dg.TableSchema:
    """The table's columns, types and meanings (the UI's Columns tab and the catalog)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(c, str(t), description=describe(table, c))
            for c, t in TABLES[table].items()
        ]
    )


def spec_metadata(table: str) -> dict:
    """Static metadata so the UI's Columns tab is filled before the first run."""
    return {"dagster/column_schema": column_schema(table)}


# columns holding a landing file's path: a preview shows the file's name (a path in a narrow
# column wraps over many lines in the UI); the table keeps the path
PATH_COLUMNS = {"source_file"}


def markdown_preview(df: pl.DataFrame, rows: int = 5, max_cols: int = 12) -> str:
    head = df.head(rows).select(df.columns[:max_cols])

    def fmt(column: str, v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if column in PATH_COLUMNS and isinstance(v, str):
            v = v.rstrip("/").rsplit("/", 1)[-1]
        return "" if v is None else str(v).replace("|", "\\|")[:60]

    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    lines += [
        "| " + " | ".join(fmt(c, v) for c, v in zip(head.columns, row, strict=True)) + " |"
        for row in head.iter_rows()
    ]
    return "\n".join(lines)


def table_metadata(df: pl.DataFrame, path: Path, rows: int) -> dict:
    """A day's partition: its rows, its file and a preview of `df` (its first rows)."""
    return {
        "dagster/row_count": dg.MetadataValue.int(rows),
        # a local partition by its full path (the UI is often run from another folder)
        "dagster/uri": dg.MetadataValue.path(
            str(path if "://" in str(path) else Path(path).resolve())
        ),
        "preview": dg.MetadataValue.md(markdown_preview(df)),
    }


def _source(path: str, variable: str, shipped: Path) -> str:
    """Which file reference data came from: the user's (named by its variable) or the shipped."""
    if path:
        return f"{variable}: {Path(path).resolve()}"
    return f"shipped default: {shipped}"


def _md_table(header: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        if v is None:
            return "—"
        return f"{v:g}" if isinstance(v, float) else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pricing_metadata(
    used: pl.DataFrame,
    waste: pl.DataFrame,
    energy: pl.DataFrame,
    prices_path: str = "",
    energy_path: str = "",
) -> dict:
    """What a day's money was computed with: the price book entries of its GPU models ($/h on
    demand and spot; `used`: `reference.prices_used` of its minutes) and which price book, the
    energy rates of its clusters and which file."""
    from gpu_pipeline.lib.reference import DEFAULT_ENERGY, DEFAULT_PRICES

    rates = {r["cluster"]: r for r in energy.iter_rows(named=True)}
    clusters = sorted(c for c in waste["cluster"].unique().to_list() if c is not None)
    energy_rows = []
    for c in clusters:
        row = c if c in rates else "*" if "*" in rates else None  # its own row, else `*`
        r = rates.get(row) if row else None
        energy_rows.append(
            [
                c,
                r["usd_per_kwh"] if r else None,
                r["co2_g_per_kwh"] if r else None,
                row or "no rate",
            ]
        )
    return {
        "prices_used": dg.MetadataValue.md(
            _md_table(
                ["GPU model", "$/h on demand", "$/h spot", "price book line", "source"],
                [
                    [m, od if od is not None else "no price", spot, line, src]
                    for m, od, spot, line, src in used.select(
                        "gpu_model",
                        "on_demand_usd_per_hour",
                        "spot_usd_per_hour",
                        "line",
                        "source",
                    ).iter_rows()
                ],
            )
            if used.height
            else "no GPU model priced this day"
        ),
        "price_book": dg.MetadataValue.text(
            _source(prices_path, "GPU_PIPELINE_PRICES", DEFAULT_PRICES)
        ),
        "energy_rates_in_force": dg.MetadataValue.md(
            _md_table(["cluster", "$/kWh", "gCO2/kWh", "energy rates row"], energy_rows)
            if energy_rows
            else "no cluster this day"
        ),
        "energy_rates": dg.MetadataValue.text(
            _source(energy_path, "GPU_PIPELINE_ENERGY", DEFAULT_ENERGY)
        ),
    }
