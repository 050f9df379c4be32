"""Where things live: defaults from SPEC.md, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_START_DATE = "2024-01-01"


def raw_root() -> str:
    return os.environ.get("GPU_PIPELINE_RAW", "data/raw")


DEFAULT_LAKE = "data/lake"


def lake_root() -> str:
    return os.environ.get("GPU_PIPELINE_LAKE", DEFAULT_LAKE)


def prices_path() -> str:
    return os.environ.get("GPU_PIPELINE_PRICES", "")


def catalog_path() -> str:
    return os.environ.get("GPU_PIPELINE_CATALOG", "")


def energy_path() -> str:
    """Electricity $/kWh and gCO2/kWh per cluster; empty: the shipped defaults."""
    return os.environ.get("GPU_PIPELINE_ENERGY", "")


def rules_path() -> str:
    """The TOML rules file (thresholds) in force; empty: the defaults of lib/rules.py."""
    return os.environ.get("GPU_PIPELINE_RULES", "")


def executor() -> str:
    return os.environ.get("GPU_PIPELINE_EXECUTOR", "in_process")


def start_date() -> str:
    return os.environ.get("GPU_PIPELINE_START_DATE", DEFAULT_START_DATE)


def _derived_home(lake: str | None) -> Path:
    """Where what is derived from a lake lives: inside it (local), or in a local folder keyed by
    the lake's URI (object store). Two lakes never share it."""
    import hashlib

    lake = lake or lake_root()
    if "://" in str(lake):
        return (
            Path("data").resolve() / "cache" / hashlib.sha256(str(lake).encode()).hexdigest()[:12]
        )
    return Path(lake).resolve()


def warehouse_path(lake: str | None = None) -> Path:
    """The lake's views-only DuckDB file: `data/warehouse.duckdb` for the default lake (SPEC),
    `<lake>/_warehouse.duckdb` for any other, so two lakes never share one."""
    lake = lake or lake_root()
    if "://" not in str(lake) and Path(lake).resolve() == Path(DEFAULT_LAKE).resolve():
        return Path(DEFAULT_LAKE).resolve().parent / "warehouse.duckdb"
    return _derived_home(lake) / "_warehouse.duckdb"


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or "data/dagster_home").resolve()


def reports_dir(lake: str | None = None) -> Path:
    """The lake's HTML reports: `<lake>/_reports/`."""
    return _derived_home(lake) / "_reports"


# the Prometheus-compatible server to pull from: name -> (environment variable, type)
PROM_SETTINGS = {
    "url": ("GPU_PIPELINE_PROM_URL", str),
    "token": ("GPU_PIPELINE_PROM_TOKEN", str),
    "username": ("GPU_PIPELINE_PROM_USER", str),
    "password": ("GPU_PIPELINE_PROM_PASSWORD", str),
    "ca_bundle": ("GPU_PIPELINE_PROM_CA_BUNDLE", str),
    "verify": ("GPU_PIPELINE_PROM_VERIFY", bool),
    "selector": ("GPU_PIPELINE_PROM_SELECTOR", str),
    "mode": ("GPU_PIPELINE_PROM_MODE", str),
    "step_s": ("GPU_PIPELINE_PROM_STEP", int),
    "window_s": ("GPU_PIPELINE_PROM_WINDOW", int),
    "concurrency": ("GPU_PIPELINE_PROM_CONCURRENCY", int),
    "cluster": ("GPU_PIPELINE_PROM_CLUSTER", str),
}


def prom_url() -> str:
    return os.environ.get("GPU_PIPELINE_PROM_URL", "")


def prom_settings(url: str | None = None) -> dict:
    """The pull settings the environment sets (typed), `url` overriding GPU_PIPELINE_PROM_URL."""
    out = {}
    for name, (var, kind) in PROM_SETTINGS.items():
        v = os.environ.get(var)
        if v is None or v == "":
            continue
        if kind is bool:
            out[name] = v.strip().lower() not in ("0", "false", "no", "off")
        elif kind is int:
            out[name] = int(v)
        else:
            out[name] = v
    if url:
        out["url"] = url
    return out
