"""A partition file of the lake that is not readable Parquet (cut short, overwritten with
garbage) fails every read with one error that names the table, the day and the file, and says
what to do: the persistence mart (gpu_daily of its 7-day window), `gpu-pipeline summary` and
`materialize` never show the Parquet reader's own error, which names none of them."""

import shutil
from datetime import date, timedelta

import dagster as dg
import polars as pl
import pytest
from helpers import cli, two_made_days

from gpu_pipeline.defs import marts
from gpu_pipeline.defs.resources import LakeResource, ReferenceResource
from gpu_pipeline.lib.io.lake import DamagedPartition, Lake

D = date(2024, 3, 10)


def _remedy(day: date) -> str:
    return (
        f"materialize the day again (gpu-pipeline materialize --start {day} --replace-missing) "
        "or delete the file"
    )


def _cut(path) -> None:
    """The file cut short: its first 300 bytes (no footer)."""
    data = path.read_bytes()
    path.write_bytes(data[:300])


def _gpu_day(day: date, bottlenecked: bool) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "gpu_uuid": ["GPU-a", "GPU-b"],
            "hostname": ["h1", "h1"],
            "cluster": ["c1", "c1"],
            "namespace": ["train", "infer"],
            "gpu_model": ["NVIDIA A100-SXM4-40GB"] * 2,
            "minutes": [1440, 1440],
            "active_minutes": [600, 600],
            "bottlenecked_minutes": [400 if bottlenecked else 0, 0],
            "bottlenecked_day": [bottlenecked, False],
        }
    )


def _run_persistence(lake_root) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [marts.persistent_bottlenecks],
        resources={"lake": LakeResource(root=str(lake_root)), "reference": ReferenceResource()},
        partition_key=D.isoformat(),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_a_damaged_gpu_day_in_the_persistence_window_names_the_file_and_what_to_do(tmp_path):
    """GPU-a is bottlenecked on D-4, D-2 and D; D-3's gpu_daily file is cut short. The mart's
    step fails with the damaged file's table, day and path and the remedy; once the file is
    deleted (one of the remedies) the window reads the six other days."""
    lake = Lake(tmp_path / "lake")
    for k in range(7):
        day = D - timedelta(days=6 - k)
        lake.write("gpu_daily", day, _gpu_day(day, bottlenecked=k in (2, 4, 6)))
    damaged_day = D - timedelta(days=3)
    damaged = lake.partition_file("gpu_daily", damaged_day)
    _cut(damaged)

    with pytest.raises(DamagedPartition) as e:
        lake.read_days("gpu_daily", [D - timedelta(days=i) for i in range(7)])
    assert (e.value.table, e.value.day, e.value.path) == ("gpu_daily", damaged_day, damaged)

    r = _run_persistence(tmp_path / "lake")
    assert not r.success
    (failure,) = [ev for ev in r.all_events if ev.is_step_failure]
    err = failure.step_failure_data.error
    while err.cause is not None and err.cls_name != "DamagedPartition":
        err = err.cause
    assert err.cls_name == "DamagedPartition", err
    assert err.message.startswith(
        "gpu_pipeline.lib.io.lake.DamagedPartition: the gpu_daily partition of "
        f"{damaged_day} is damaged: {damaged} is "
        f"not readable Parquet; {_remedy(damaged_day)} (Parquet reader: parquet: File out of "
        "specification"
    ), err.message
    assert not lake.exists("persistent_bottlenecks", D)  # nothing written from a partial window

    damaged.unlink()
    assert _run_persistence(tmp_path / "lake").success
    pb = lake.read("persistent_bottlenecks", D)
    assert pb.select(
        "gpu_uuid", "window_days", "days_bottlenecked", "active_minutes", "bottlenecked_minutes"
    ).to_dicts() == [
        {
            "gpu_uuid": "GPU-a",
            "window_days": 6,
            "days_bottlenecked": 3,
            "active_minutes": 3600,
            "bottlenecked_minutes": 1200,
        }
    ]


def test_a_damaged_file_read_lazily_fails_where_it_is_scanned(tmp_path):
    """`scan_days` (what the summary and the report read through) reads each file's footer as
    it scans: garbage in place of the file is a DamagedPartition there, for a table of the
    contract and for any other."""
    lake = Lake(tmp_path / "lake")
    for table in ("gpu_daily", "some_table"):
        for day in (D, D + timedelta(days=1)):
            lake.write(table, day, _gpu_day(day, bottlenecked=False))
        path = lake.partition_file(table, D + timedelta(days=1))
        path.write_bytes(b"not parquet at all")
        with pytest.raises(DamagedPartition, match=f"the {table} partition of 2024-03-11 is"):
            lake.scan_days(table, [D, D + timedelta(days=1)])
        with pytest.raises(DamagedPartition, match="The file must end with PAR1"):
            lake.read(table, D + timedelta(days=1))
        assert lake.scan_days(table, [D]).collect().height == 2  # the sound day still reads


def test_a_damaged_file_in_an_object_store_lake_is_named_too(monkeypatch, tmp_path):
    """The same error from a lake on S3 (a local S3-compatible server), where pyarrow reads."""
    pytest.importorskip("moto.server")
    from helpers import moto_s3

    with moto_s3(monkeypatch, "gpu-lake"):
        import boto3

        lake = Lake("s3://gpu-lake/fleet", cache=tmp_path / "cache")
        for day in (D, D + timedelta(days=1)):
            lake.write("gpu_daily", day, _gpu_day(day, bottlenecked=True))
        key = "fleet/gpu_daily/date=2024-03-11/data.parquet"
        boto3.client("s3").put_object(Bucket="gpu-lake", Key=key, Body=b"PAR1 cut sh")
        with pytest.raises(DamagedPartition) as e:
            lake.read_days("gpu_daily", [D, D + timedelta(days=1)])
        assert str(e.value).startswith(
            f"the gpu_daily partition of 2024-03-11 is damaged: gpu-lake/{key} is not readable "
            f"Parquet; {_remedy(D + timedelta(days=1))} (Parquet reader: "
        ), e.value
        with pytest.raises(DamagedPartition, match="2024-03-11 is damaged: gpu-lake/fleet/"):
            lake.scan_days("gpu_daily", [D, D + timedelta(days=1)])
        assert lake.read_days("gpu_daily", [D])["bottlenecked_minutes"].to_list() == [400, 0]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two materialized days of 4 GPUs, with their landing files (`helpers.two_made_days`)."""
    return two_made_days(tmp_path_factory.mktemp("damaged"))


def _damaged_copy(made, tmp_path, day: str):
    tmp, env = made
    lake = tmp_path / "lake"
    shutil.copytree(tmp / "lake", lake)
    damaged = lake / "gpu_daily" / f"date={day}" / "data.parquet"
    _cut(damaged)
    return lake, damaged, env


def test_summary_over_a_damaged_gpu_daily_names_the_file_and_what_to_do(made, tmp_path):
    lake, damaged, env = _damaged_copy(made, tmp_path, "2024-01-02")
    days = ("--start", "2024-01-01", "--end", "2024-01-02")
    p = cli("summary", *days, "--lake", str(lake), env=env, check=False)
    assert p.returncode == 1
    last = (p.stdout + p.stderr).strip().splitlines()[-1]
    assert last.endswith(
        f"the gpu_daily partition of 2024-01-02 is damaged: {damaged} is not readable Parquet; "
        f"{_remedy(date(2024, 1, 2))} (Parquet reader: parquet: File out of specification: "
        "The file must end with PAR1 or PARE)"
    ), p.stdout + p.stderr
    assert "polars.exceptions" not in p.stderr  # the reader's own error is not what is shown
    assert "Traceback" not in p.stdout + p.stderr  # one line, as for a settings error
    rep = cli("report", "--date", "2024-01-02", "--lake", str(lake), env=env, check=False)
    assert rep.returncode == 1 and "Traceback" not in rep.stdout + rep.stderr, rep.stderr
    assert "the gpu_daily partition of 2024-01-02 is damaged" in rep.stdout + rep.stderr
    # a range that does not reach the damaged day is summarized as before
    ok = cli("summary", "--start", "2024-01-01", "--lake", str(lake), env=env)
    assert "GPUs: 4    GPU-hours: 96.0" in ok.stdout


def test_materialize_over_a_damaged_gpu_day_says_which_and_the_remedy_repairs_it(made, tmp_path):
    """A run of 2024-01-02 reads 2024-01-01's gpu_daily for its persistence window: its
    failure line names the file; materializing 2024-01-01 again as it says repairs the lake."""
    lake, damaged, env = _damaged_copy(made, tmp_path, "2024-01-01")
    raw = str(made[0] / "raw")
    p = cli("materialize", "--start", "2024-01-02", "--raw", raw, "--lake", str(lake),
            env=env, check=False)  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if "persistent_bottlenecks failed" in ln]
    assert line.strip().startswith(
        "persistent_bottlenecks failed: DamagedPartition: the gpu_daily partition of 2024-01-01 "
        f"is damaged: {damaged} is not readable Parquet; {_remedy(date(2024, 1, 1))}"
    ), line
    cli("materialize", "--start", "2024-01-01", "--end", "2024-01-02", "--replace-missing",
        "--raw", raw, "--lake", str(lake), env=env)  # fmt: skip
    assert Lake(lake).read("gpu_daily", date(2024, 1, 1)).height == 4
    out = cli("summary", "--start", "2024-01-01", "--end", "2024-01-02", "--lake", str(lake),
              env=env).stdout  # fmt: skip
    assert "GPUs: 4    GPU-hours: 192.0" in out
