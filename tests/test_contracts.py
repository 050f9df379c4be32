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
