"""Every setting in one place: defaults from SPEC.md, overridable by `GPU_PIPELINE_*` variables.

This module is where the process environment is read (`Settings.from_env`), never written (the
one write in the package is Polars' allocator variable, `allocator.py`, not a setting). The
definitions bind the settings that came from the environment to the resources as `dg.EnvVar`s
(`definitions.build_definitions`); the CLI overrides some with its flags (`Settings.replace`)
and hands the result to the definitions it builds. Nothing under `lib/` reads the environment:
it gets values as arguments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_START_DATE = "2024-01-01"
DEFAULT_LAKE = "data/lake"

# field -> environment variable (the typed fields' types are the dataclass's)
ENV_VARS = {
    "raw": "GPU_PIPELINE_RAW",
    "lake": "GPU_PIPELINE_LAKE",
    "cache": "GPU_PIPELINE_CACHE",
    "prices": "GPU_PIPELINE_PRICES",
    "catalog": "GPU_PIPELINE_CATALOG",
    "energy": "GPU_PIPELINE_ENERGY",
    "rules": "GPU_PIPELINE_RULES",
    "start_date": "GPU_PIPELINE_START_DATE",
    "executor": "GPU_PIPELINE_EXECUTOR",
    "chunk_mb": "GPU_PIPELINE_CHUNK_MB",
    "chunk_gpus": "GPU_PIPELINE_CHUNK_GPUS",
    "split": "GPU_PIPELINE_SPLIT",
    "csv_timezone": "GPU_PIPELINE_CSV_TIMEZONE",
    "max_file_mb": "GPU_PIPELINE_MAX_FILE_MB",
    "sensor_interval_s": "GPU_PIPELINE_SENSOR_INTERVAL",
    "sql_memory_mb": "GPU_PIPELINE_SQL_MEMORY_MB",
    "sql_threads": "GPU_PIPELINE_SQL_THREADS",
    "sql_timeout_s": "GPU_PIPELINE_SQL_TIMEOUT_S",
    "sql_spill_mb": "GPU_PIPELINE_SQL_SPILL_MB",
}

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


def _typed(kind: type, var: str, v: str) -> object:
    if kind is bool:
        return v.strip().lower() not in ("0", "false", "no", "off")
    if kind is int:
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{var} must be a whole number, not {v!r}") from None
    return v


@dataclass(frozen=True)
class Settings:
    """What a deployment configures. Empty paths mean the shipped defaults."""

    raw: str = "data/raw"  # the landing zone
    lake: str = DEFAULT_LAKE  # a folder or an object-store URI
    cache: str = ""  # parsed landing files (local disk); "": beside the lake
    prices: str = ""
    catalog: str = ""  # extends the shipped GPU catalog
    energy: str = ""
    rules: str = ""  # the TOML rules file (thresholds)
    start_date: str = DEFAULT_START_DATE  # the first daily partition
    executor: str = "in_process"
    chunk_mb: int = 640  # memory budget of a chunk of GPUs
    chunk_gpus: int = 0  # 0: chunks follow the memory budget
    split: str = "gpus"  # or "cluster"
    csv_timezone: str = "UTC"  # the zone of zone-less CSV times
    max_file_mb: int = 1024  # larger landing files are quarantined whole
    sensor_interval_s: int = 60
    # `gpu-pipeline sql`: DuckDB's memory limit, worker threads, spill files; seconds per run (0: none)
    sql_memory_mb: int = 1024
    sql_threads: int = 2
    sql_timeout_s: int = 300
    sql_spill_mb: int = 4096  # 0: no spill files (a query larger than memory fails)
    prom: Mapping[str, object] = field(default_factory=dict)  # PROM_SETTINGS that are set
    # the fields whose value came from their environment variable (bound as dg.EnvVar);
    # pull settings as "prom.<name>"
    from_env_fields: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for name, var in ENV_VARS.items():
            v = env.get(var)
            if v not in (None, ""):
                values[name] = _typed(int if kinds[name] == "int" else str, var, v)
        prom = {
            name: _typed(kind, var, env[var])
            for name, (var, kind) in PROM_SETTINGS.items()
            if env.get(var) not in (None, "")
        }
        return cls(
            **values, prom=prom, from_env_fields=frozenset([*values, *(f"prom.{n}" for n in prom)])
        )

    def replace(self, **changes: object) -> Settings:
        """These settings with `changes` (from CLI flags): those fields no longer come from the
        environment."""
        prom = changes.pop("prom", self.prom)
        changed = set(changes) | {
            f"prom.{n}" for n in set(prom) | set(self.prom) if prom.get(n) != self.prom.get(n)
        }
        return dataclasses.replace(
            self, **changes, prom=prom, from_env_fields=self.from_env_fields - changed
        )

    @property
    def prom_url(self) -> str:
        return str(self.prom.get("url", ""))


def current() -> Settings:
    """The settings of this process's environment."""
    return Settings.from_env()


def _derived_home(lake: str) -> Path:
    """Where what is derived from a lake lives: inside it (local), or in a local folder keyed by
    the lake's URI (object store). Two lakes never share it."""
    if "://" in str(lake):
        return (
            Path("data").resolve() / "cache" / hashlib.sha256(str(lake).encode()).hexdigest()[:12]
        )
    return Path(lake).resolve()


def warehouse_path(lake: str) -> Path:
    """The lake's views-only DuckDB file: `data/warehouse.duckdb` for the default lake (SPEC),
    `<lake>/_warehouse.duckdb` for any other, so two lakes never share one."""
    if "://" not in str(lake) and Path(lake).resolve() == Path(DEFAULT_LAKE).resolve():
        return Path(DEFAULT_LAKE).resolve().parent / "warehouse.duckdb"
    return _derived_home(lake) / "_warehouse.duckdb"


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or "data/dagster_home").resolve()


def reports_dir(lake: str) -> Path:
    """The lake's HTML reports: `<lake>/_reports/`."""
    return _derived_home(lake) / "_reports"
