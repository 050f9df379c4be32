"""A day nothing landed for is not a green day: the run may write its empty partitions (the
schedule runs whether or not data came), but its checks and the freshness check warn (an
exporter outage went all green: adversarial review)."""

from datetime import UTC, date, datetime

import dagster as dg
import polars as pl

from gpu_pipeline.defs import checks
from gpu_pipeline.defs.sensors import judge_freshness

DAY = date(2024, 3, 9)
NOW = datetime(2024, 3, 10, 7, tzinfo=UTC)  # past the day's freshness deadline


def _materialized(instance: dg.DagsterInstance, rows: int) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key="priced_waste",
            partition=DAY.isoformat(),
            metadata={"dagster/row_count": dg.MetadataValue.int(rows)},
        )
    )


def test_freshness_warns_on_a_day_written_empty():
    with dg.DagsterInstance.ephemeral() as instance:
        missing = judge_freshness(instance, dg.AssetKey("priced_waste"), NOW, date(2024, 1, 1))
        assert not missing.passed and "was not there" in missing.description
        _materialized(instance, 0)
        empty = judge_freshness(instance, dg.AssetKey("priced_waste"), NOW, date(2024, 1, 1))
        assert not empty.passed and empty.severity == dg.AssetCheckSeverity.WARN
        assert "empty: no data landed" in empty.description
        _materialized(instance, 12)
        ok = judge_freshness(instance, dg.AssetKey("priced_waste"), NOW, date(2024, 1, 1))
        assert ok.passed and "is there" in ok.description


def test_no_records_and_no_gpus_warn():
    log = pl.DataFrame(
        {"rows_read": [], "rows_quarantined": []},
        schema={"rows_read": pl.Int64, "rows_quarantined": pl.Int64},
    )
    q = pl.DataFrame(
        {"reason": [], "source_file": []}, schema={"reason": pl.String, "source_file": pl.String}
    )
    rate = checks.validation_pass_rate(log, q)
    assert not rate.passed and rate.description == "no records landed for the day"
    some = log.vstack(pl.DataFrame({"rows_read": [10], "rows_quarantined": [0]}))
    assert rate.metadata["pass_rate"].value == 0.0
    assert checks.validation_pass_rate(some, q).passed
    merged = checks.merge([rate, checks.validation_pass_rate(some, q)], labels=["d1", "d2"])
    assert not merged.passed and merged.description == "d1: no records landed for the day"
    assert checks.merge([rate]).description == "no records landed for the day"
    daily = pl.DataFrame(
        schema={
            "gpu_uuid": pl.String,
            "hostname": pl.String,
            "cluster": pl.String,
            "minutes": pl.Int64,
            "coverage_pct": pl.Float64,
            "gpu_instance_id": pl.String,
        }
    )
    cov = checks.fleet_coverage(pl.DataFrame(), daily, 95.0)
    assert not cov.passed and cov.severity == dg.AssetCheckSeverity.WARN
    assert cov.description == "no GPU seen: nothing landed for the day"
