"""A partition whose footer is sound but whose pages are not (bytes overwritten inside a column
chunk) fails only where a scan of it is collected: the staging pass (its day's gpu_samples,
read chunk by chunk), gpu_health, the marts of the day's gpu_minutes, the persistence window.
There, as for a file cut short (test_damaged_partition.py), the error is one DamagedPartition
naming the table, the day and the file, never the Parquet reader's own error, which names
none of them (nor which file of a scan of several days failed)."""

import random
import shutil
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow.parquet as pq
import pytest
from helpers import cli, two_made_days

from gpu_pipeline.defs import marts, staging
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import DamagedPartition, Lake

DAY1, DAY2 = date(2024, 1, 1), date(2024, 1, 2)


def _damage_pages(path, column: str = "gpu_uuid") -> None:
    """Overwrite the middle half of `column`'s chunk in the file's first row group with random
    bytes: its footer still reads, its pages do not decode."""
    meta = pq.read_metadata(path)
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index(column))
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o)
    size = chunk.total_compressed_size
    data = bytearray(path.read_bytes())
    rnd = random.Random(7)
    at, n = start + size // 4, max(size // 2, 1)
    data[at : at + n] = bytes(rnd.randrange(256) for _ in range(n))
    path.write_bytes(bytes(data))
    assert pq.read_metadata(path).num_rows == meta.num_rows  # the footer reads
    with pytest.raises(pl.exceptions.ComputeError):  # the pages do not
        pl.read_parquet(path, columns=[column])


def _remedy(day: date) -> str:
    return (
        f"materialize the day again (gpu-pipeline materialize --start {day} --replace-missing) "
        "or delete the file"
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two materialized days of 4 GPUs, with their landing files (`helpers.two_made_days`)."""
    return two_made_days(tmp_path_factory.mktemp("damaged_pages"))


def _copy(made, tmp_path, table: str, day: date):
    """A copy of the made lake with the pages of `table`'s `day` damaged: (lake, the file)."""
    shutil.copytree(made[0] / "lake", tmp_path / "lake")
    lake = Lake(tmp_path / "lake")
    path = lake.partition_file(table, day)
    _damage_pages(path)
    return lake, path


def _run(assets, lake: Lake, day: date) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        assets,
        resources={"lake": LakeResource(root=str(lake.root)), "reference": ReferenceResource()},
        partition_key=day.isoformat(),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _failures(r: dg.ExecuteInProcessResult) -> dict[str, str]:
    """Each failed step's error: the DamagedPartition of its chain, else its innermost error."""
    out = {}
    for ev in r.all_events:
        if ev.is_step_failure:
            err = ev.step_failure_data.error
            while err.cause is not None and err.cls_name != "DamagedPartition":
                err = err.cause
            out[ev.step_key] = f"{err.cls_name}: {err.message}"
    return out


def _says(table: str, day: date, path) -> str:
    return (
        f"DamagedPartition: gpu_pipeline.lib.io.lake.DamagedPartition: the {table} partition of "
        f"{day} is damaged: {path} is not readable Parquet; {_remedy(day)} (Parquet reader: "
    )


def test_damaged_pages_of_the_days_samples_fail_staging_and_gpu_health_naming_the_file(
    made, tmp_path
):
    """The day's own run: the staging pass reads its samples chunk by chunk as it writes
    gpu_minutes; its failure is the damaged file's, and the day's gpu_minutes stay as they
    were (nothing is published from a partial read)."""
    lake, path = _copy(made, tmp_path, "gpu_samples", DAY2)
    minutes = lake.partition_file("gpu_minutes", DAY2).read_bytes()
    r = _run([staging.staging, marts.gpu_health], lake, DAY2)
    assert not r.success
    failures = _failures(r)
    assert set(failures) == {"staging", "gpu_health"}, failures
    for step, error in failures.items():
        assert error.startswith(_says("gpu_samples", DAY2, path)), (step, error)
    assert lake.partition_file("gpu_minutes", DAY2).read_bytes() == minutes


def test_damaged_pages_of_the_days_minutes_fail_each_mart_naming_the_file(made, tmp_path):
    lake, path = _copy(made, tmp_path, "gpu_minutes", DAY2)
    of_minutes = [
        marts.recommendations,
        marts.stragglers,
        marts.efficiency_roi,
        marts.namespace_efficiency,
        marts.workload_efficiency,
    ]
    r = _run(of_minutes, lake, DAY2)
    failures = _failures(r)
    assert set(failures) == {a.key.path[-1] for a in of_minutes}, failures
    for step, error in failures.items():
        assert error.startswith(_says("gpu_minutes", DAY2, path)), (step, error)


def test_damaged_pages_in_the_persistence_window_name_the_day(made, tmp_path):
    """A run of DAY2 reads DAY1's gpu_daily for its persistence window."""
    lake, path = _copy(made, tmp_path, "gpu_daily", DAY1)
    failures = _failures(_run([marts.persistent_bottlenecks], lake, DAY2))
    assert list(failures) == ["persistent_bottlenecks"], failures
    assert failures["persistent_bottlenecks"].startswith(_says("gpu_daily", DAY1, path))


def test_a_scan_of_several_days_names_the_day_whose_pages_do_not_decode(made, tmp_path):
    """Polars' error names no file: the lake finds which of the scan's days it was, after the
    failure. An error no file explains (the query's own) passes as it is."""
    lake, path = _copy(made, tmp_path, "gpu_minutes", DAY2)
    days = [DAY1 - timedelta(days=1), DAY1, DAY2]  # the first is not in the lake
    with pytest.raises(DamagedPartition) as e, lake.reading("gpu_minutes", days):
        lake.scan_days("gpu_minutes", days).select("gpu_uuid").collect()
    assert (e.value.table, e.value.day, e.value.path) == ("gpu_minutes", DAY2, path)
    assert "zstd" in e.value.why or "thrift" in e.value.why, e.value.why
    with lake.reading("gpu_minutes", days):  # the damaged column chunk is not read
        assert lake.scan_days("gpu_minutes", days).select("date").collect().height > 0
    with pytest.raises(pl.exceptions.ColumnNotFoundError), lake.reading("gpu_minutes", [DAY1]):
        lake.scan_days("gpu_minutes", [DAY1]).select("no_such_column").collect()


def test_damaged_pages_in_an_object_store_lake_are_named_too(made, monkeypatch, tmp_path):
    """A lake on S3 (a local S3-compatible server) is read by pyarrow, whose error for pages
    that do not decode is an OSError, as for the store being unreachable: the file is fetched
    again and decoded to tell which."""
    pytest.importorskip("moto.server")
    from helpers import moto_s3

    local, path = _copy(made, tmp_path, "gpu_daily", DAY1)
    with moto_s3(monkeypatch, "gpu-lake"):
        import boto3

        s3 = boto3.client("s3")
        for day in (DAY1, DAY2):
            key = f"fleet/gpu_daily/date={day}/data.parquet"
            s3.put_object(
                Bucket="gpu-lake", Key=key, Body=local.partition_file("gpu_daily", day).read_bytes()
            )
        lake = Lake("s3://gpu-lake/fleet", cache=tmp_path / "cache")
        remote = f"gpu-lake/fleet/gpu_daily/date={DAY1}/data.parquet"
        for read in (lake.read_days, lake.scan_days):
            with pytest.raises(DamagedPartition) as e:
                read("gpu_daily", [DAY1, DAY2])
            assert (e.value.table, e.value.day, e.value.path) == ("gpu_daily", DAY1, remote)
        assert lake.read_days("gpu_daily", [DAY2]).height == 4


def test_materialize_of_a_kept_day_with_damaged_samples_says_which_in_one_line(made, tmp_path):
    """DAY2's landing file is gone, so its run keeps its gpu_samples (by default) and stages
    them again: the run's failure line names the damaged file and the remedy, exit 1."""
    tmp, env = made
    raw = tmp_path / "raw"
    shutil.copytree(tmp / "raw", raw)
    for f in raw.rglob(f"*_{DAY2}.prom"):
        f.unlink()
    lake, path = _copy(made, tmp_path, "gpu_samples", DAY2)
    p = cli("materialize", "--start", str(DAY2), "--raw", str(raw), "--lake", str(lake.root),
            "--allow-empty", env=env, check=False)  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if "staging failed" in ln]
    assert line.strip().startswith(
        f"staging failed: DamagedPartition: the gpu_samples partition of {DAY2} is damaged: "
        f"{path} is not readable Parquet; {_remedy(DAY2)} (Parquet reader: "
    ), line
    assert "Traceback" not in p.stdout + p.stderr
    assert "ComputeError" not in p.stdout + p.stderr


def test_summary_report_and_showback_name_damaged_pages_of_the_minutes(made, tmp_path):
    """The readers outside the runs that scan gpu_minutes lazily (the summary's RFU weights,
    the report's charts and month to date, a showback computed from its days) name the file
    too; the CLI's summary says it in one line, exit 1."""
    from gpu_pipeline.lib.io.report import build_report
    from gpu_pipeline.lib.io.showback import month_rows
    from gpu_pipeline.lib.summary import fleet_summary

    shutil.copytree(made[0] / "lake", tmp_path / "lake")
    lake = Lake(tmp_path / "lake")
    path = lake.partition_file("gpu_minutes", DAY1)
    _damage_pages(path, "rfu_pct")  # a column each of them reads
    said = f"the gpu_minutes partition of {DAY1} is damaged: {path} is not readable Parquet"
    with pytest.raises(DamagedPartition, match=said.replace(".", r"\.")) as e:
        fleet_summary(lake, DAY1, DAY2)
    assert e.value.path == path
    for day in (DAY1, DAY2):  # DAY2's month to date reads DAY1's minutes
        with pytest.raises(DamagedPartition) as e:
            build_report(lake, day)
        assert (e.value.table, e.value.day, e.value.path) == ("gpu_minutes", DAY1, path)
    month = date(2024, 1, 1)
    Path(lake.partition_file("namespace_monthly", month)).unlink()  # computed from its days
    with pytest.raises(DamagedPartition) as e:
        month_rows(lake, month, [DAY1, DAY2])
    assert e.value.path == path
    p = cli("summary", "--start", str(DAY1), "--end", str(DAY2), "--lake", str(lake.root),
            env=made[1], check=False)  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    assert said in p.stdout + p.stderr and "Traceback" not in p.stdout + p.stderr
