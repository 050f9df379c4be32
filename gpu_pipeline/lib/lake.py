"""The Parquet lake: `<root>/<table>/date=YYYY-MM-DD/data.parquet`, one file per partition.

A partition is one file, written beside its final name and swapped in with an atomic rename, so a
reader (or a run killed mid-write) always sees a complete previous or new version. Rows are
sorted by the caller and nothing run-specific is written, so a re-run gives the same bytes.
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import date
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import TABLES

DATA_FILE = "data.parquet"
# a zero-row file with the table's columns, so a DuckDB view over `<table>/*/data.parquet` binds
# before the first partition exists (and picks partitions up as they appear)
SCHEMA_DIR = "_schema"
_SAFE = re.compile(r"^[a-z_][a-z0-9_]*$")


class Lake:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def table_dir(self, table: str) -> Path:
        if not _SAFE.match(table):
            raise ValueError(f"not a table name: {table!r}")
        return self.root / table

    def partition_file(self, table: str, day: date) -> Path:
        return self.table_dir(table) / f"date={day.isoformat()}" / DATA_FILE

    @property
    def cache_dir(self) -> Path:
        return self.root / "_ingest_cache"

    def ensure_schema(self, table: str) -> Path:
        """Write the table's zero-row schema file if it is missing (or its columns changed)."""
        path = self.table_dir(table) / SCHEMA_DIR / DATA_FILE
        schema = TABLES[table]
        if path.is_file() and pl.read_parquet_schema(path) == schema:
            return path
        self._replace(path, pl.DataFrame(schema=schema))
        return path

    def _replace(self, final: Path, df: pl.DataFrame) -> None:
        """Write `df` beside `final` and swap it in atomically."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{DATA_FILE}.{uuid.uuid4().hex}.tmp")
        try:
            df.write_parquet(tmp, compression="zstd", statistics=True, row_group_size=262144)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def write(self, table: str, day: date, df: pl.DataFrame) -> Path:
        """Replace the day's partition of `table` with `df` (conformed to the table's contract)."""
        if table in TABLES:
            df = conform(df.with_columns(pl.lit(day).alias("date")), TABLES[table])
            self.ensure_schema(table)
        final = self.partition_file(table, day)
        self._replace(final, df)
        return final

    def exists(self, table: str, day: date) -> bool:
        return self.partition_file(table, day).is_file()

    def read(self, table: str, day: date) -> pl.DataFrame:
        return pl.read_parquet(self.partition_file(table, day))

    def scan_days(self, table: str, days: list[date]) -> pl.LazyFrame:
        """The given days of `table` that exist, as one frame (an empty, typed frame if none do)."""
        files = [self.partition_file(table, d) for d in days if self.exists(table, d)]
        if not files:
            return pl.LazyFrame(schema=TABLES[table])
        return pl.scan_parquet(files)

    def days(self, table: str) -> list[date]:
        d = self.table_dir(table)
        if not d.is_dir():
            return []
        out = []
        for p in d.glob(f"date=*/{DATA_FILE}"):
            try:
                out.append(date.fromisoformat(p.parent.name.removeprefix("date=")))
            except ValueError:
                continue
        return sorted(out)
