"""The lake on an object store: a local S3-compatible server on loopback, started by the test."""

from datetime import date, timedelta

import dagster as dg
import polars as pl
import pytest

moto_server = pytest.importorskip("moto.server")

from helpers import MODELS, expo_lines, write_file  # noqa: E402

from gpu_pipeline.defs import marts, raw, report, staging  # noqa: E402
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource  # noqa: E402
from gpu_pipeline.lib.io.lake import Lake  # noqa: E402

START = date(2024, 1, 1)


@pytest.fixture()
def s3(monkeypatch, tmp_path):
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(k, v)
    import boto3

    boto3.client("s3").create_bucket(Bucket="gpu-lake")
    try:
        yield "s3://gpu-lake/fleet"
    finally:
        server.stop()


def test_lake_round_trip_on_s3(s3, tmp_path):
    lake = Lake(s3, cache=tmp_path / "cache")  # parsed files and uploads stage on local disk
    assert lake.remote and lake.days("gpu_daily") == []
    df = pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "minutes": [10, 20]})
    path = lake.write("gpu_daily", START, df)
    assert str(path) == "gpu-lake/fleet/gpu_daily/date=2024-01-01/data.parquet"
    assert lake.exists("gpu_daily", START) and not lake.exists(
        "gpu_daily", START + timedelta(days=1)
    )
    back = lake.read("gpu_daily", START)
    assert back["minutes"].to_list() == [10, 20] and back["date"].to_list() == [START] * 2
    lake.write("gpu_daily", START + timedelta(days=2), df.head(1))
    assert lake.days("gpu_daily") == [
        START,
        START + timedelta(days=2),
    ]  # the _schema folder is no day
    assert lake.scan_days("gpu_daily", [START, START + timedelta(days=2)]).collect().height == 3
    lake.write("gpu_daily", START, df.head(1))  # replaced whole
    assert lake.read("gpu_daily", START).height == 1


def test_pipeline_materializes_into_s3(s3, tmp_path):
    for i in range(3):
        d = START + timedelta(days=i)
        lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, range(600, 700), 85, 100.0)
        lines += expo_lines(
            "GPU-E", MODELS["A100"], "n1", "good", d, range(600, 700), 95, 320.0, gpu=1
        )
        write_file(tmp_path / "raw" / "c1" / f"n1_{d.isoformat()}.prom", lines)
    resources = {
        "lake": LakeResource(root=s3, cache=str(tmp_path / "cache")),
        "landing": LandingResource(root=str(tmp_path / "raw")),
        "reference": ReferenceResource(),
    }
    assets = dg.load_assets_from_modules([raw, staging, marts, report])
    instance = dg.DagsterInstance.ephemeral()
    for i in range(3):
        res = dg.materialize(
            assets,
            partition_key=(START + timedelta(days=i)).isoformat(),
            resources=resources,
            instance=instance,
        )
        assert res.success
    lake = Lake(s3, cache=tmp_path / "cache")
    assert lake.days("gpu_minutes") == [START + timedelta(days=i) for i in range(3)]
    assert lake.read("gpu_minutes", START).height == 200
    assert lake.read("persistent_bottlenecks", START + timedelta(days=2))["gpu_uuid"].to_list() == [
        "GPU-s"
    ]
    w = lake.read("priced_waste", START)
    assert w["cost_usd"].sum() == pytest.approx(2 * 100 / 60 * 2.5)
