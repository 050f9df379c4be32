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


def markdown_preview(df: pl.DataFrame, rows: int = 5, max_cols: int = 12) -> str:
    head = df.head(rows).select(df.columns[:max_cols])

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v).replace("|", "\\|")[:60]

    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in head.iter_rows()]
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
