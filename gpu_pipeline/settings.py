"""Where things live: defaults from SPEC.md, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_START_DATE = "2024-01-01"


def raw_root() -> str:
    return os.environ.get("GPU_PIPELINE_RAW", "data/raw")


def lake_root() -> str:
    return os.environ.get("GPU_PIPELINE_LAKE", "data/lake")


def prices_path() -> str:
    return os.environ.get("GPU_PIPELINE_PRICES", "")


def catalog_path() -> str:
    return os.environ.get("GPU_PIPELINE_CATALOG", "")


def start_date() -> str:
    return os.environ.get("GPU_PIPELINE_START_DATE", DEFAULT_START_DATE)


def _local_home(lake: str | None) -> Path:
    """The local folder beside the lake (data/ for data/lake); data/ when the lake is an object store."""
    lake = lake or lake_root()
    return Path("data").resolve() if "://" in str(lake) else Path(lake).resolve().parent


def warehouse_path(lake: str | None = None) -> Path:
    """The views-only DuckDB file sits beside the lake: data/lake -> data/warehouse.duckdb."""
    return _local_home(lake) / "warehouse.duckdb"


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or "data/dagster_home").resolve()


def reports_dir(lake: str | None = None) -> Path:
    """Reports sit beside the lake: data/lake -> data/reports/."""
    return _local_home(lake) / "reports"
