"""Every table has a contract that is enforced on every write (issue "One home per fact", item
5): a mart that forgets a column fails, it never writes a column of nulls."""

from __future__ import annotations

from datetime import date

import polars as pl
import pytest

from gpu_pipeline.defs.daily import DayWriter
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.schemas import MODELS, TABLES, ContractError, MissingColumns, to_contract
from gpu_pipeline.lib.staging.minute_runs import minute_runs

D = date(2024, 1, 1)


def test_every_table_has_a_model_of_its_columns():
    assert set(MODELS) == set(TABLES)
    for table, model in MODELS.items():
        assert list(model.columns) == list(TABLES[table]), table


def test_a_mart_that_forgets_a_column_fails_instead_of_writing_nulls():
    runs = minute_runs(pl.LazyFrame(schema=TABLES["gpu_minutes"]))
    with pytest.raises(MissingColumns, match="idle_waste_usd"):
        to_contract(priced_waste(runs).drop("idle_waste_usd"), "priced_waste")
    # gpu_samples may lack the fields a file does not give; nothing else may be missing
    s = pl.LazyFrame({"date": [D], "timestamp": [None], "gpu_uuid": ["GPU-a"]})
    assert to_contract(s, "gpu_samples").collect().width == len(TABLES["gpu_samples"])


@pytest.mark.parametrize("table", sorted(set(TABLES) - {"gpu_samples", "gpu_minutes"}))
def test_the_writer_validates_every_table(tmp_path, table):
    """A frame that breaks its table's contract (a required column null) is not written."""
    model = MODELS[table]
    required = [c for c, col in model.columns.items() if not col.nullable and c != "date"]
    assert required, table
    row = {c: None for c in TABLES[table]} | {"date": D}
    bad = pl.DataFrame([row], schema=TABLES[table])
    writer = DayWriter(Lake(str(tmp_path / "lake")), table)
    with pytest.raises(ContractError):
        writer.write(D, bad)
    assert not Lake(str(tmp_path / "lake")).exists(table, D)


def test_a_recommendation_names_only_actions_of_the_vocabulary():
    from gpu_pipeline.lib.schemas import validate

    row = {c: None for c in TABLES["recommendations"]} | {
        "date": D,
        "gpus": 1,
        "gpu_hours": 1.0,
        "actions": ["spot", "buy_more_gpus"],
    }
    bad = pl.DataFrame([row], schema=TABLES["recommendations"])
    with pytest.raises(ContractError, match="each in"):
        validate("recommendations", bad)
    ok = bad.with_columns(pl.Series("actions", [["spot", "DALI"]]))
    assert validate("recommendations", ok).height == 1


# -- the one-query check (`schemas.passes`) decides as pandera does ----------------------------

_MATCHING = {
    r"^GPU-[0-9a-z\-]+$": ("GPU-0a", "GPU-0b"),
    r"^\d{4}-\d{2}$": ("2024-01", "2024-02"),
    r"^(below_median|spread)(, (below_median|spread))*$": ("spread", "below_median"),
}


def _pandera_ok(model, df) -> bool:
    import pandera.errors as pe

    try:
        model.validate(df, lazy=True)
    except (pe.SchemaErrors, pe.SchemaError):
        return False
    return True


def _values(col, dtype, k: int):
    """A valid value of the column (the k-th of two) and one that breaks each of its checks."""
    from datetime import UTC, datetime, timedelta

    stats = {c.name: c.statistics for c in col.checks}
    bad = []
    if "isin" in stats:
        allowed = sorted(stats["isin"]["allowed_values"])
        good = allowed[k % len(allowed)]
        bad.append("not one of them")
    elif "str_matches" in stats:
        good = _MATCHING[stats["str_matches"]["pattern"]][k]
        bad.append("zz-does-not-match")
    elif dtype == pl.String:
        good = f"v{k}"
    elif dtype.is_temporal():
        base = datetime(2024, 1, 1, tzinfo=UTC) if dtype == pl.Datetime else D
        good = base + (timedelta(minutes=k) if dtype == pl.Datetime else timedelta(days=k))
    elif dtype == pl.Boolean:
        good = bool(k)
    elif isinstance(dtype, pl.List):
        good = []
        if col.checks:  # each element of a closed set
            bad.append(["not an action"])
    else:
        lo = stats.get("in_range", stats.get("greater_than_or_equal_to", {})).get("min_value")
        hi = stats.get("in_range", stats.get("less_than_or_equal_to", {})).get("max_value")
        good = (lo if lo is not None else (hi - 1 if hi is not None else 1)) + k
        if hi is not None and good > hi:
            good = hi
        if lo is not None:
            bad.append(lo - 1)
        if hi is not None:
            bad.append(hi + 1)
        if dtype.is_float():
            bad.append(float("nan"))
        if dtype.is_integer():
            good, bad = int(good), [int(b) for b in bad if b == b]
    return good, bad


@pytest.mark.parametrize("table", sorted(TABLES))
def test_the_one_query_check_decides_as_pandera_does(table):
    """A valid frame passes without pandera; every broken one (a null, a NaN, a value past each
    check, a duplicate key, a column missing, extra, moved or of another type) fails both ways:
    `passes` never lets through what pandera refuses."""
    from gpu_pipeline.lib.schemas import passes

    model, schema = MODELS[table], TABLES[table]
    rows, breaks = [{}, {}], []
    for c, dtype in schema.items():
        col = model.columns[c]
        for k in (0, 1):
            rows[k][c], bad = _values(col, dtype, k)
        breaks += [(c, b) for b in bad] + ([(c, None)] if not col.nullable else [])
    base = pl.DataFrame(rows, schema=schema)
    assert _pandera_ok(model, base) and passes(model, base), table
    frames = []
    for c, b in breaks:
        try:  # a value the column's type cannot hold (an enum's stranger, -1 unsigned) is out
            frames.append(base.with_columns(pl.Series(c, [b, base[c][1]], dtype=schema[c])))
        except (TypeError, OverflowError, pl.exceptions.InvalidOperationError):
            continue
    if model.unique:
        frames.append(pl.concat([base.head(1), base.head(1)]))
    first, last = list(schema)[0], list(schema)[-1]
    frames += [
        base.with_columns(pl.lit(1).alias("extra")),
        base.drop(last),
        base.select(last, *[c for c in schema if c != last]),
        base.with_columns(pl.col(first).cast(pl.String)),
    ]
    frames += [
        base.with_columns(pl.col(c).cast(pl.Float32 if dtype == pl.Float64 else pl.Int64))
        for c, dtype in schema.items()
        if dtype in (pl.Float64, pl.Int32)
    ][:3]
    refused = 0
    for df in frames:
        ok = _pandera_ok(model, df)
        assert passes(model, df) == ok, (table, df.head(2))
        refused += not ok
    # all but a NaN where a bound lets it through (NaN sorts above every number in Polars)
    assert refused >= len(frames) - sum(b != b for _, b in breaks if isinstance(b, float)) > 5


def test_pandera_runs_only_to_word_a_failure(monkeypatch):
    """A valid frame is returned without pandera's query per check; a broken one still gets
    pandera's failure cases."""
    import pandera.polars as pa

    from gpu_pipeline.lib.schemas import validate

    calls: list[int] = []
    real = pa.DataFrameSchema.validate
    monkeypatch.setattr(
        pa.DataFrameSchema, "validate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    row = {c: None for c in TABLES["recommendations"]} | {"date": D, "gpus": 1, "gpu_hours": 1.0}
    ok = pl.DataFrame([row | {"actions": ["spot"]}], schema=TABLES["recommendations"])
    assert validate("recommendations", ok) is ok and calls == []
    with pytest.raises(ContractError, match="each in"):
        validate("recommendations", ok.with_columns(pl.Series("actions", [["buy_more_gpus"]])))
    assert calls == [1]


def test_conform_gives_the_schema_and_keeps_a_frame_that_has_it():
    """`samples.conform` (the parse's frames to their schema): a frame with the schema's columns
    in order and types comes back as it is; any other gets the schema's columns, in its order
    and types, missing ones null and extra ones dropped, as the lazy select it replaces."""
    from gpu_pipeline.lib.samples import conform, conform_lazy

    schema = {
        "line": pl.Int64,
        "timestamp": pl.Datetime("ms", "UTC"),
        "value": pl.Float64,
        "pod": pl.String,
        "kind": pl.Enum(["a", "b"]),
    }
    ok = pl.DataFrame(
        {"line": [1, 2], "timestamp": [0, 60_000], "value": [1.5, None], "pod": ["p", None]},
        schema_overrides={"timestamp": pl.Datetime("ms", "UTC")},
    ).with_columns(pl.Series("kind", ["a", None], pl.Enum(["a", "b"])))
    assert conform(ok, schema) is ok and conform(ok.clear(), schema).schema == ok.schema
    others = [
        ok.select("value", "line", "timestamp", "pod", "kind"),  # another order
        ok.with_columns(pl.col("timestamp").cast(pl.Datetime("us", "UTC"))),  # another unit
        ok.with_columns(pl.col("timestamp").dt.replace_time_zone(None)),  # no time zone
        ok.with_columns(pl.col("line").cast(pl.Int32), extra=pl.lit(1)),  # a type, a column more
        ok.drop("pod", "kind"),  # columns missing
        ok.drop("pod").head(0),  # no rows
    ]
    for df in others:
        got = conform(df, schema)
        assert got is not df
        assert got.schema == pl.Schema(schema)
        assert got.equals(conform_lazy(df.lazy(), schema).collect())
    assert conform(others[4], schema).get_column("pod").to_list() == [None, None]
    # a type given as a class means its default: a time in milliseconds is converted
    loose = {"timestamp": pl.Datetime}
    ms = ok.select("timestamp")
    assert conform(ms, loose).equals(conform_lazy(ms.lazy(), loose).collect())
    assert conform(ms, loose).schema["timestamp"] == pl.Datetime("us")
