"""GPU catalog and price book: CSV files shipped in `gpu_pipeline/reference/`, loaded here only.

Model names in the data (`modelName`, nvidia-smi `name`) are matched through `model_key`, which
ignores vendor prefixes, case and `-`/`_`/space differences ("NVIDIA A100-SXM4-40GB" ==
"A100-SXM4-40GB" == "a100 sxm4 40gb"). A name matches a row only when its key is equal: vGPU
profiles ("GRID A100-40C", "NVIDIA A100-20C") never fall onto their board's row (docs/metrics.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "reference"
DEFAULT_CATALOG = REFERENCE_DIR / "gpu_catalog.csv"
DEFAULT_PRICES = REFERENCE_DIR / "prices.csv"
DEFAULT_ENERGY = REFERENCE_DIR / "energy.csv"
ENERGY_SCHEMA = {"cluster": pl.String, "usd_per_kwh": pl.Float64, "co2_g_per_kwh": pl.Float64}

CATALOG_SCHEMA = {
    "gpu_model": pl.String,
    "max_power_w": pl.Float64,
    "idle_power_w": pl.Float64,
    "theoretical_fp16_tflops": pl.Float64,
    "achievable_fp16_tflops": pl.Float64,
    # compute slices of a MIG-capable model (7 on A100/H100 class, 4 on A30); empty otherwise
    "mig_slices": pl.Int64,
    # tensor-core precisions beyond FP16 (for precision advice); empty: judged from the name
    "bf16": pl.Boolean,
    "fp8": pl.Boolean,
    "source": pl.String,
}
# columns a user's catalog may leave out
OPTIONAL = {"source", "mig_slices", "bf16", "fp8"}
PRICES_SCHEMA = {
    "gpu_model": pl.String,
    "on_demand_usd_per_hour": pl.Float64,
    "spot_usd_per_hour": pl.Float64,
    # where the price comes from (list price or estimate); SPEC's price book has the three
    # columns above, so a user's book may leave it out (it is then null)
    "source": pl.String,
}


class ReferenceError(ValueError):
    """A catalog or price file that cannot be used as it is."""


def model_key(expr: pl.Expr) -> pl.Expr:
    """Normalized model name used to join data to the catalog and price book."""
    return (
        expr.str.to_uppercase()
        .str.replace_all(r"[-_\s]+", " ")
        .str.strip_chars()
        .str.replace(r"^(NVIDIA |TESLA |GEFORCE |QUADRO )+", "")
    )


def _read(path: Path, schema: dict[str, pl.DataType], what: str) -> pl.DataFrame:
    if not Path(path).is_file():
        raise ReferenceError(f"{what} file not found: {path}")
    df = pl.read_csv(path, schema_overrides=schema, comment_prefix="#")
    missing = [c for c in schema if c not in df.columns and c not in OPTIONAL]
    if missing:
        required = [c for c in schema if c not in OPTIONAL]
        optional = [c for c in schema if c in OPTIONAL]
        raise ReferenceError(
            f"{what} {path} lacks column(s) {missing}; expected {required} (optional: {optional})"
        )
    df = df.with_columns(
        pl.col("gpu_model").str.strip_chars(),
        *[
            pl.lit(None, schema[c]).alias(c)
            for c in OPTIONAL
            if c in schema and c not in df.columns
        ],
    )
    dup = df.group_by(model_key(pl.col("gpu_model")).alias("k")).len().filter(pl.col("len") > 1)
    if dup.height:
        raise ReferenceError(f"{what} {path} lists a model twice: {dup['k'].to_list()}")
    return df.with_columns(model_key(pl.col("gpu_model")).alias("model_key"))


def load_catalog(extra: str | os.PathLike | None = None) -> pl.DataFrame:
    """The shipped catalog, extended (and overridden per model) by the file `extra`."""
    base = _read(DEFAULT_CATALOG, CATALOG_SCHEMA, "GPU catalog")
    if extra:
        more = _read(Path(extra), CATALOG_SCHEMA, "GPU catalog")
        if "source" not in more.columns:
            more = more.with_columns(pl.lit(str(extra)).alias("source"))
        base = pl.concat(
            [
                base.join(more.select("model_key"), on="model_key", how="anti"),
                more.select(base.columns),
            ]
        )
    return base.sort("gpu_model")


def load_prices(path: str | os.PathLike | None = None) -> pl.DataFrame:
    """The price book: `path`, else the shipped defaults."""
    path = path or DEFAULT_PRICES
    return _read(Path(path), PRICES_SCHEMA, "price book").sort("gpu_model")


def load_energy(path: str | os.PathLike | None = None) -> pl.DataFrame:
    """Electricity $/kWh and grid gCO2/kWh per cluster (`*`: every other cluster): `path`, else
    the shipped defaults."""
    path = Path(path or DEFAULT_ENERGY)
    if not path.is_file():
        raise ReferenceError(f"energy rates file not found: {path}")
    df = pl.read_csv(path, schema_overrides=ENERGY_SCHEMA, comment_prefix="#")
    missing = [c for c in ENERGY_SCHEMA if c not in df.columns]
    if missing:
        raise ReferenceError(
            f"energy rates {path} lack column(s) {missing}; expected {list(ENERGY_SCHEMA)}"
        )
    df = df.select(list(ENERGY_SCHEMA)).with_columns(pl.col("cluster").str.strip_chars())
    bad = df.filter(
        pl.col("usd_per_kwh").is_null()
        | (pl.col("usd_per_kwh") < 0)
        | pl.col("co2_g_per_kwh").is_null()
        | (pl.col("co2_g_per_kwh") < 0)
    )
    if bad.height:
        raise ReferenceError(f"energy rates {path}: rates must be numbers >= 0: {bad.rows()}")
    if df["cluster"].is_duplicated().any():
        raise ReferenceError(f"energy rates {path} list a cluster twice")
    return df


def energy_rates(energy: pl.DataFrame, cluster: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """($/kWh, gCO2/kWh) of `cluster`: its own row, else the `*` row, else null."""
    rates = {
        r["cluster"]: (r["usd_per_kwh"], r["co2_g_per_kwh"]) for r in energy.iter_rows(named=True)
    }
    default = rates.get("*", (None, None))
    keys = [k for k in rates if k != "*"]
    usd = cluster.replace_strict(
        keys, [rates[k][0] for k in keys], default=default[0], return_dtype=pl.Float64
    )
    co2 = cluster.replace_strict(
        keys, [rates[k][1] for k in keys], default=default[1], return_dtype=pl.Float64
    )
    return usd, co2
