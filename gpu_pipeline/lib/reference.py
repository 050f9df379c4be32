"""GPU catalog, price book and energy rates: CSV files shipped in `gpu_pipeline/reference/`,
loaded here only.

Model names in the data (`modelName`, nvidia-smi `name`) are matched through `model_key`, which
ignores vendor prefixes, case and `-`/`_`/space differences ("NVIDIA A100-SXM4-40GB" ==
"A100-SXM4-40GB" == "a100 sxm4 40gb"). A name matches a row only when its key is equal: vGPU
profiles ("GRID A100-40C", "NVIDIA A100-20C") never fall onto their board's row (docs/metrics.md).

Every cell is checked when a file is read (`read_checked`): known columns only, numbers finite
and not negative (money never is), prices below a bound no real one reaches (a unit mistake),
one row per model or cluster. What does not hold is a
ReferenceError of one line per problem naming the file, the line and the column; what is odd but
possible (a spot price above on-demand) is a warning line (`reference_warnings`).
"""

from __future__ import annotations

import csv
import difflib
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

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
    # where the price comes from (list price or estimate); the price book's contract is the three
    # columns above, so a user's book may leave it out (it is then null)
    "source": pl.String,
}


class ReferenceError(ValueError):
    """A catalog, price book or energy rates file that cannot be used as it is: one line per
    problem (`problems`), each naming the file, the line and the column."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def model_key(expr: pl.Expr) -> pl.Expr:
    """Normalized model name used to join data to the catalog and price book."""
    return (
        expr.str.to_uppercase()
        .str.replace_all(r"[-_\s]+", " ")
        .str.strip_chars()
        .str.replace(r"^(NVIDIA |TESLA |GEFORCE |QUADRO )+", "")
    )


def by_model(rows: pl.LazyFrame, table: pl.LazyFrame) -> pl.LazyFrame:
    """`rows` with the columns of `table` (a catalog or price book's, keyed by `model_key`) for
    their `gpu_model` (null where it has no row). The key is worked out once per distinct model
    name, not once per row: a day's minutes name a handful of models a million times (three
    regular expressions a row, and a string column as long as the day); each row then takes
    its model's values by a lookup, not a join (which held the day's rows once more)."""
    names = rows.select("gpu_model").unique().filter(pl.col("gpu_model").is_not_null())
    models = (
        names.collect()
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(table.collect(), on="model_key", how="left")
        .drop("model_key")
    )
    name = pl.col("gpu_model")
    return rows.with_columns(
        name.replace_strict(
            models.get_column("gpu_model"), models.get_column(c), default=None, return_dtype=t
        ).alias(c)
        for c, t in models.schema.items()
        if c != "gpu_model"
    )


# --- what each column's cells allow ------------------------------------------------------------


class Column(NamedTuple):
    """A reference column: what its cells allow (`allowed`, as an error line says it)."""

    allowed: str
    parse: Callable[[str], object]  # a cell's value, or ValueError(why it is not allowed)
    empty: bool = False  # an empty cell is allowed (null)


def _number(
    low: float = 0.0, above: bool = False, high: tuple[float, str] | None = None
) -> Callable[[str], float]:
    """A finite number >= low (> low with `above`), at most `high` (its bound, and what a
    number above it likely is) when given."""

    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise ValueError("not a number") from None
        if not math.isfinite(x):
            raise ValueError("not finite")
        if x < low or (above and x == low):
            raise ValueError("negative" if x < 0 else "zero" if x == 0 else "too small")
        if high is not None and x > high[0]:
            raise ValueError(f"above {high[0]:,g}: {high[1]}")
        return x

    return parse


# the most a GPU-hour is priced at: no GPU rents for more than a few tens of dollars an hour, and a
# price of 1.7e308 passed, made every cost infinite and failed the run on a cost check that did
# not name the price (adversarial review); above it is a unit mistake
MAX_USD_PER_GPU_HOUR = (1000.0, "a price per month or per year, or in cents? USD per GPU-hour")
MAX_USD_PER_KWH = (100.0, "in cents? USD per kWh")


def _whole(low: int, high: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", v):
            raise ValueError("not a whole number")
        if not low <= int(v) <= high:
            raise ValueError("out of range")
        return int(v)

    return parse


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise ValueError("not true or false")
    return v.lower() == "true"


def _name(v: str) -> str:
    if not v:
        raise ValueError("empty")
    return v


_TFLOPS = "a finite number >= 0, or empty (unknown)"
_PRICE = f"a finite number from 0 to {MAX_USD_PER_GPU_HOUR[0]:,g}, USD per GPU-hour"
CATALOG_COLUMNS = {
    "gpu_model": Column("the model's name", _name),
    "max_power_w": Column(
        "a finite number of watts > 0, or empty (the power limit seen is used)",
        _number(above=True),
        empty=True,
    ),
    "idle_power_w": Column("a finite number of watts >= 0, or empty", _number(), empty=True),
    "theoretical_fp16_tflops": Column(_TFLOPS, _number(), empty=True),
    "achievable_fp16_tflops": Column(_TFLOPS, _number(), empty=True),
    "mig_slices": Column("a whole number from 1 to 7, or empty (no MIG)", _whole(1, 7), empty=True),
    "bf16": Column("true, false or empty", _bool, empty=True),
    "fp8": Column("true, false or empty", _bool, empty=True),
    "source": Column("any text", str, empty=True),
}
PRICES_COLUMNS = {
    "gpu_model": Column("the model's name", _name),
    "on_demand_usd_per_hour": Column(_PRICE, _number(high=MAX_USD_PER_GPU_HOUR)),
    "spot_usd_per_hour": Column(
        f"{_PRICE}, or empty (no spot price)", _number(high=MAX_USD_PER_GPU_HOUR), empty=True
    ),
    "source": Column("any text", str, empty=True),
}
ENERGY_COLUMNS = {
    "cluster": Column("a cluster name, or * for every other cluster", _name),
    "usd_per_kwh": Column(
        f"a finite number from 0 to {MAX_USD_PER_KWH[0]:,g}, USD per kWh",
        _number(high=MAX_USD_PER_KWH),
    ),
    "co2_g_per_kwh": Column("a finite number >= 0, grams of CO2 per kWh", _number()),
}


# --- reading -----------------------------------------------------------------------------------


def _records(path: Path, what: str) -> list[tuple[int, list[str]]]:
    """The CSV records of `path` (cells stripped) with the line each starts on; `#` comment
    lines and blank lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ReferenceError(f"{what} {path}: not text (UTF-8)") from None
    except OSError as e:
        raise ReferenceError(f"{what} {path}: {e.strerror}") from None
    numbered = [
        (n, line)
        for n, line in enumerate(text.splitlines(keepends=True), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    pulled: list[int] = []  # the lines the CSV reader has taken, in order

    def feed():
        for n, line in numbered:
            pulled.append(n)
            yield line

    out: list[tuple[int, list[str]]] = []
    mark = 0
    try:
        for row in csv.reader(feed()):
            out.append((pulled[mark], [c.strip() for c in row]))
            mark = len(pulled)
    except csv.Error as e:
        line = pulled[mark] if mark < len(pulled) else (pulled or [1])[-1]
        raise ReferenceError(f"{what} {path} line {line}: not CSV ({e})") from None
    return out


def read_checked(
    path: str | os.PathLike,
    columns: dict[str, Column],
    schema: dict[str, pl.DataType],
    what: str,
    optional: set[str] | frozenset[str] = frozenset(),
) -> pl.DataFrame:
    """`path` as a frame of `schema` (absent `optional` columns null) with a `line` column (the
    line each row is on), every cell checked against `columns`: a ReferenceError of one line per
    problem (file, line, column, value, what is allowed) when any does not hold."""
    path = Path(path)
    if not path.is_file():
        raise ReferenceError(f"{what} file not found: {path}")
    records = _records(path, what)
    if not records:
        raise ReferenceError(f"{what} {path}: no header line (expected {', '.join(columns)})")
    (head, header), rows = records[0], records[1:]
    at = f"{what} {path} line {head}"
    # a column of its own (a region, a note) is kept out of the way; one that looks like a known
    # column the file lacks is a misspelling, whose values would otherwise be lost
    absent = [c for c in columns if c not in header]
    problems = [
        f"{at}: unknown column {c!r} (did you mean {near[0]}? allowed: {', '.join(columns)})"
        for c in header
        if c not in columns and (near := difflib.get_close_matches(c, absent, n=1, cutoff=0.8))
    ]
    problems += [f"{at}: column {c!r} twice" for c in dict.fromkeys(header) if header.count(c) > 1]
    missing = [c for c in columns if c not in header and c not in optional]
    if missing:
        required = [c for c in columns if c not in optional]
        problems.append(
            f"{at}: lacks column(s) {missing}; expected {required} "
            f"(optional: {[c for c in columns if c in optional]})"
        )
    if problems:
        raise ReferenceError(problems)
    data: dict[str, list] = {c: [] for c in schema}
    lines: list[int] = []
    for n, row in rows:
        if len(row) != len(header):
            problems.append(
                f"{what} {path} line {n}: {len(row)} fields, the header has {len(header)}"
            )
            continue
        cells = dict(zip(header, row, strict=True))
        for c in schema:
            v, col = cells.get(c, ""), columns[c]
            if c not in cells or (v == "" and col.empty):
                data[c].append(None)
                continue
            try:
                data[c].append(col.parse(v))
            except ValueError as e:
                data[c].append(None)
                problems.append(f"{what} {path} line {n}, {c}={v!r}: {e} (allowed: {col.allowed})")
        lines.append(n)
    if problems:
        raise ReferenceError(problems)
    return pl.DataFrame(
        {**{c: pl.Series(c, data[c], dtype=t) for c, t in schema.items()}, "line": lines},
        schema={**schema, "line": pl.Int64},
    )


def _once(df: pl.DataFrame, key: pl.Expr, column: str, what: str, path: Path) -> None:
    """A ReferenceError naming each row whose `key` an earlier row has already."""
    first: dict[str, int] = {}
    problems = []
    for k, name, n in df.select(key.alias("k"), column, "line").iter_rows():
        if k in first:
            problems.append(
                f"{what} {path} line {n}, {column}={name!r}: lists {k} twice (first on line "
                f"{first[k]}; one row each)"
            )
        first.setdefault(k, n)
    if problems:
        raise ReferenceError(problems)


def _read(path: Path, columns: dict[str, Column], schema: dict, what: str) -> pl.DataFrame:
    df = read_checked(path, columns, schema, what, OPTIONAL)
    _once(df, model_key(pl.col("gpu_model")), "gpu_model", what, path)
    return df.with_columns(model_key(pl.col("gpu_model")).alias("model_key"))


def reference_warnings(
    df: pl.DataFrame, what: str, path: str | os.PathLike, columns: dict[str, Column]
) -> list[str]:
    """Lines for what is odd but possible in the file `path` that `read_checked` read as `df`:
    columns the pipeline does not read (ignored), a spot price above on-demand (a real price
    book can have one: then no spot saving is proposed), achievable TFLOPS above theoretical,
    idle power at or above max power."""
    head, header = _records(Path(path), what)[0]
    out = [
        f"{what} {path} line {head}: column {c!r} is not one the pipeline reads: ignored "
        f"(known: {', '.join(columns)})"
        for c in header
        if c not in columns
    ]
    pairs = (
        ("spot_usd_per_hour", "on_demand_usd_per_hour", "above", "no spot saving is proposed"),
        ("achievable_fp16_tflops", "theoretical_fp16_tflops", "above", "RFU is judged by it"),
        ("idle_power_w", "max_power_w", "at or above", "an idle GPU draws less than its max"),
    )
    for a, b, how, note in pairs:
        if a not in df.columns or b not in df.columns or "line" not in df.columns:
            continue
        odd = pl.col(a) >= pl.col(b) if how == "at or above" else pl.col(a) > pl.col(b)
        for n, va, vb in df.filter(odd).select("line", a, b).iter_rows():
            out.append(f"{what} {path} line {n}, {a}={va:g}: {how} {b}={vb:g} ({note})")
    return out


def _path(path: str | os.PathLike | None, default: Path) -> Path:
    return Path(path) if path else default


def read_catalog(extra: str | os.PathLike | None = None) -> pl.DataFrame:
    """The file `extra` (else the shipped catalog) checked, with its `line` column."""
    return _read(_path(extra, DEFAULT_CATALOG), CATALOG_COLUMNS, CATALOG_SCHEMA, "GPU catalog")


def read_prices(path: str | os.PathLike | None = None) -> pl.DataFrame:
    """The price book `path` (else the shipped one) checked, with its `line` column."""
    return _read(_path(path, DEFAULT_PRICES), PRICES_COLUMNS, PRICES_SCHEMA, "price book")


def read_energy(path: str | os.PathLike | None = None) -> pl.DataFrame:
    """The energy rates `path` (else the shipped ones) checked, with its `line` column."""
    path = _path(path, DEFAULT_ENERGY)
    df = read_checked(path, ENERGY_COLUMNS, ENERGY_SCHEMA, "energy rates")
    _once(df, pl.col("cluster"), "cluster", "energy rates", path)
    return df


def check_files(
    prices: str | os.PathLike | None = None,
    catalog: str | os.PathLike | None = None,
    energy: str | os.PathLike | None = None,
) -> list[str]:
    """Check the price book, the catalog (the shipped one and `catalog`) and the energy rates
    in force: a ReferenceError of every problem in all of them, else the warning lines."""
    files = [(read_prices, prices or DEFAULT_PRICES, "price book", PRICES_COLUMNS)]
    files += [
        (read_catalog, p, "GPU catalog", CATALOG_COLUMNS) for p in (DEFAULT_CATALOG, catalog) if p
    ]
    files += [(read_energy, energy or DEFAULT_ENERGY, "energy rates", ENERGY_COLUMNS)]
    problems, warnings = [], []
    for read, path, what, columns in files:
        try:
            df = read(path)
        except ReferenceError as e:
            problems += e.problems
            continue
        warnings += reference_warnings(df, what, path, columns)
    if problems:
        raise ReferenceError(problems)
    return warnings


def load_catalog(extra: str | os.PathLike | None = None) -> pl.DataFrame:
    """The shipped catalog, extended (and overridden per model) by the file `extra`."""
    base = read_catalog().drop("line")
    if extra:
        more = read_catalog(extra).drop("line")
        if more["source"].is_null().all():
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
    return read_prices(path).drop("line").sort("gpu_model")


def load_energy(path: str | os.PathLike | None = None) -> pl.DataFrame:
    """Electricity $/kWh and grid gCO2/kWh per cluster (`*`: every other cluster): `path`, else
    the shipped defaults."""
    return read_energy(path).drop("line")


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


def prices_used(
    minutes: pl.DataFrame | pl.LazyFrame, path: str | os.PathLike | None = None
) -> pl.DataFrame:
    """The price book entries a day's GPU-minutes were priced with: one row per model of the
    physical GPUs in `minutes` (`gpu_minutes` rows), with its GPU-hours, the $/GPU-hour its
    minutes carry (`usd_per_hour`, the on-demand price applied when the day was computed) and the
    price book's row for it (`path`, else the shipped one): `on_demand_usd_per_hour`,
    `spot_usd_per_hour`, `source`, `file` and `line`; those are null for a model the book does
    not list (its minutes have no price). `matches` is False when the minutes carry another
    price than the book's on-demand one: the day was computed with another price book (compute
    it again to price it with this one)."""
    file = _path(path, DEFAULT_PRICES)
    book = read_prices(file).select(
        "model_key",
        "on_demand_usd_per_hour",
        "spot_usd_per_hour",
        "source",
        pl.lit(str(file)).alias("file"),
        "line",
    )
    applied = pl.col("price_usd_per_hour")
    used = (
        minutes.lazy()
        .filter(pl.col("gpu_instance_id").is_null())  # a MIG GPU counts once, on its own row
        .group_by("gpu_model")
        .agg(
            (pl.len() / 60.0).alias("gpu_hours"),
            applied.max().alias("usd_per_hour"),
            applied.min().alias("_lowest"),
            applied.null_count().alias("_unpriced"),
            pl.len().alias("_minutes"),
        )
        .with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        # streamed: a day's minutes are never whole in memory, and counts, lowest and highest
        # are the same in any order (a streamed sum would not be)
        .collect(engine="streaming")
        .join(book, on="model_key", how="left")
    )
    book_price = pl.col("on_demand_usd_per_hour")
    return used.select(
        "gpu_model",
        "gpu_hours",
        "usd_per_hour",
        "on_demand_usd_per_hour",
        "spot_usd_per_hour",
        "source",
        "file",
        "line",
        pl.when(book_price.is_null())
        .then(pl.col("_unpriced") == pl.col("_minutes"))  # unlisted, and unpriced in the data
        .otherwise(
            (pl.col("_unpriced") == 0)
            & (pl.col("usd_per_hour") == book_price)
            & (pl.col("_lowest") == book_price)
        )
        .alias("matches"),
    ).sort("gpu_model", nulls_last=True)
