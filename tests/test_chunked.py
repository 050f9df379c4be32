"""A day processed in GPU chunks gives the same tables as the day at once, and streams its writes."""

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.gpu_samples import assemble_day
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import SAMPLE_ORDER, collect_stable, conform
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA, GPU_SAMPLES_SCHEMA
from gpu_pipeline.lib.staging import chunked
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes
from gpu_pipeline.lib.staging.minute_runs import minute_runs

D = date(2024, 1, 1)
CAT, PRICES = load_catalog(), load_prices()


def _mig_gpu(minutes: int = 30) -> pl.DataFrame:
    """One A100 split into a 3g and a 2g instance: device fields on the physical row only."""
    t0 = datetime(2024, 1, 1, 9, tzinfo=UTC)
    rows = []
    for i in range(minutes):
        ts = t0 + timedelta(minutes=i)
        base = {"date": D, "timestamp": ts, "gpu_uuid": "GPU-mig0", "cluster": "c0"}
        base |= {"gpu_model": "A100-SXM4-40GB", "hostname": "h-mig", "source_file": "f"}
        rows.append(base | {"gpu_instance_id": None, "power_w": 150.0 + i})
        rows.append(
            base
            | {"gpu_instance_id": 1, "gpu_instance_profile": "3g.20gb", "namespace": "a"}
            | {"prof_gr_engine_active": 0.7}
        )
        rows.append(
            base
            | {"gpu_instance_id": 2, "gpu_instance_profile": "2g.10gb", "namespace": "b"}
            | {"prof_gr_engine_active": 0.2 + i / 100}
        )
    return conform(pl.DataFrame(rows, infer_schema_length=None), GPU_SAMPLES_SCHEMA)


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> pl.DataFrame:
    tmp = tmp_path_factory.mktemp("chunked")
    generate(tmp / "raw", D, days=1, gpus=12, clusters=3, seed=5)
    day = assemble_day([load_or_parse(f, tmp / "cache") for f in list_landing(tmp / "raw")], D)
    assert day.gpu_samples.height == 12 * 1440
    return pl.concat([day.gpu_samples, _mig_gpu()]).sort(*SAMPLE_ORDER, nulls_last=False)


def _one_pass(samples: pl.DataFrame) -> dict[str, pl.DataFrame]:
    m = collect_stable(gpu_minutes(samples.lazy(), CAT, PRICES))
    return {
        "minutes": m,
        "daily": collect_stable(gpu_daily(minute_runs(m.lazy()))),
        "hourly": collect_stable(hourly_fleet_metrics(minute_runs(m.lazy()))),
        "waste": collect_stable(priced_waste(minute_runs(m.lazy()))),
    }


def _chunked(samples: pl.DataFrame, **kw) -> dict[str, pl.DataFrame]:
    tables = chunked.DayTables()
    m = pl.concat(
        [tables.add(c) for c in chunked.minutes_by_chunk(samples.lazy(), CAT, PRICES, **kw)]
    )
    out = {
        "minutes": m,
        "daily": tables.gpu_daily(),
        "hourly": tables.hourly_fleet_metrics(),
        "waste": tables.priced_waste(),
    }
    return out | {"chunks": tables.chunks}


@pytest.mark.parametrize(
    ("max_gpus", "split", "chunks"),
    [(1, "gpus", 13), (5, "gpus", 3), (100, "gpus", 1), (3, "cluster", None)],
)
def test_chunks_give_the_tables_of_one_pass(samples, max_gpus, split, chunks):
    one = _one_pass(samples)
    got = _chunked(samples, max_gpus=max_gpus, split=split)
    if chunks is None:  # each cluster's GPUs cut into threes
        per_cluster = samples.group_by("cluster").agg(pl.col("gpu_uuid").n_unique())["gpu_uuid"]
        chunks = sum(-(-n // max_gpus) for n in per_cluster)
        assert chunks > len(per_cluster)
    assert got["chunks"] == chunks
    minutes = got["minutes"]
    if split == "cluster":  # clusters first, then GPUs: same rows, another order
        minutes = minutes.sort("gpu_uuid", "gpu_instance_id", "minute", nulls_last=False)
    assert_frame_equal(minutes, one["minutes"])
    assert_frame_equal(got["daily"], one["daily"])
    # sums of partial sums: the same numbers up to float rounding
    assert_frame_equal(got["hourly"], one["hourly"], check_exact=False, rel_tol=1e-12)
    assert_frame_equal(got["waste"], one["waste"], check_exact=False, rel_tol=1e-12)
    # a MIG GPU and its instances stay in one chunk: the physical row's utilization is theirs
    mig = minutes.filter(pl.col("gpu_uuid") == "GPU-mig0", pl.col("gpu_instance_id").is_null())
    assert mig["util_source"].unique().to_list() == ["mig_instances"]
    assert mig["gpu_util_pct"][0] == pytest.approx(100 * (3 * 0.7 + 2 * 0.2) / 7)


def test_cluster_split_never_mixes_clusters(samples):
    for chunk in chunked.plan(samples.lazy(), max_gpus=3, split="cluster"):
        clusters = samples.filter(chunk.predicate)["cluster"].unique().to_list()
        assert clusters == [chunk.cluster]
    planned = {c.cluster for c in chunked.plan(samples.lazy(), 3, "cluster")}
    assert planned == set(samples["cluster"].unique()) and len(planned) == 4


def test_unsorted_30s_samples_are_regrouped_per_minute(samples):
    """Two samples a minute in shuffled order: inspect sorts them and the minutes regroup."""
    plain = samples.filter(pl.col("gpu_instance_id").is_null()).head(1440 * 3)
    later = plain.with_columns(
        pl.col("timestamp") + pl.duration(seconds=30), pl.col("gpu_util_pct") / 2
    )
    both = pl.concat([plain, later]).sample(fraction=1.0, shuffle=True, seed=1)
    df, shape = chunked.inspect(both)
    assert (shape.presorted, shape.one_per_minute, shape.mig) == (False, False, False)
    assert df.equals(both.sort(*SAMPLE_ORDER, nulls_last=False))
    _, shape = chunked.inspect(plain)
    assert (shape.presorted, shape.one_per_minute) == (True, True)
    got = _chunked(both, max_gpus=2, split="gpus")["minutes"]
    assert got.height == 1440 * 3 and got["samples"].unique().to_list() == [2]
    assert_frame_equal(got, _one_pass(both)["minutes"])
    # utilization is the mean of the minute's two samples
    first = plain.row(0, named=True)["gpu_util_pct"]
    assert got.row(0, named=True)["gpu_util_pct"] == pytest.approx(first * 0.75)


def test_chunk_size_and_split_come_from_the_settings(monkeypatch):
    """GPU_PIPELINE_CHUNK_GPUS / _SPLIT reach the staging pass through the lake resource."""
    monkeypatch.setenv("GPU_PIPELINE_CHUNK_GPUS", "250")
    monkeypatch.setenv("GPU_PIPELINE_SPLIT", "cluster")
    lake = build_definitions().resources["lake"]
    assert lake.chunk_gpus == dg.EnvVar.int("GPU_PIPELINE_CHUNK_GPUS")
    with dg.build_resources({"lake": lake}) as r:
        assert r.lake.chunking() == chunked.Chunking(gpus=250, split="cluster")
    with pytest.raises(ValueError, match="positive"):
        chunked.Chunking(gpus=0)
    with pytest.raises(ValueError, match="gpus, cluster"):
        chunked.Chunking(split="rack")


def test_chunks_follow_the_memory_budget_by_default(samples):
    budget = chunked.Chunking(mb=16)
    # 1.5 KiB a row (two chunks in flight): 10,922 rows, seven minute-level GPUs of 1,440 rows
    assert chunked.Chunking().gpus is None and budget.rows == 16 * 2**20 // 1536 == 10_922
    rows = samples.group_by("gpu_uuid").len().sort("gpu_uuid")
    chunks = chunked.plan(samples.lazy(), chunking=budget)
    sizes = [rows.filter(pl.col("gpu_uuid").is_in(c.uuids))["len"].sum() for c in chunks]
    assert all(n <= budget.rows for n in sizes) and sum(sizes) == samples.height
    assert [len(c.uuids) for c in chunks][0] == 7
    # rows in any order make the same plan
    shuffled = samples.sample(fraction=1.0, shuffle=True, seed=2)
    assert chunked.plan(shuffled.lazy(), chunking=budget) == chunks
    # a GPU alone over the budget is a chunk of its own, nothing is dropped
    assert chunked.cut_by_size(["a", "b", "c"], [5, 20, 1], None, 10) == [["a"], ["b"], ["c"]]
    # the tables are those of one pass whatever the chunking
    got = _chunked(samples, chunking=budget)
    assert got["chunks"] == len(chunks) > 1
    want = _one_pass(samples)
    for k in want:
        assert_frame_equal(got[k], want[k])
    with pytest.raises(ValueError, match="at least 16"):
        chunked.Chunking(mb=1)


@pytest.mark.parametrize("pieces", [1, 6])
def test_the_plan_of_a_large_in_memory_day(pieces):
    """A remote lake's day is an in-memory frame, in one piece or several: its plan must not take
    Polars 2.1's streaming `rle` (it panics on a frame of more than one morsel)."""
    uuids = np.repeat([f"GPU-{i:04d}" for i in range(300)], 1440)
    frame = pl.DataFrame({"gpu_uuid": uuids})
    step = frame.height // pieces
    day = pl.concat([frame.slice(i, step) for i in range(0, frame.height, step)], rechunk=False)
    assert day.n_chunks() == pieces
    chunks = chunked.plan(day.lazy(), chunking=chunked.Chunking(mb=64))  # 43,690 rows: 30 GPUs
    assert [len(c.uuids) for c in chunks] == [30] * 10
    assert [u for c in chunks for u in c.uuids] == [f"GPU-{i:04d}" for i in range(300)]


def test_an_empty_day_gives_empty_typed_tables():
    tables = chunked.DayTables()
    empty = pl.LazyFrame(schema=GPU_SAMPLES_SCHEMA)
    assert list(chunked.minutes_by_chunk(empty, CAT, PRICES)) == []
    assert tables.gpu_daily().height == 0 and tables.hourly_fleet_metrics().height == 0
    assert tables.priced_waste().columns[:4] == ["date", "cluster", "namespace", "gpu_model"]


def test_streamed_write_is_one_file_and_an_error_keeps_the_previous_version(tmp_path, samples):
    lake = Lake(tmp_path / "lake")
    frames = list(chunked.minutes_by_chunk(samples.lazy(), CAT, PRICES, max_gpus=4))
    path, rows = lake.write_frames("gpu_minutes", D, iter(frames))
    # twelve GPUs a day, and the MIG GPU's physical row and two instances for 30 minutes
    assert rows == sum(f.height for f in frames) == 12 * 1440 + 3 * 30
    before = path.read_bytes()
    assert_frame_equal(pl.read_parquet(path), pl.concat(frames))

    def failing():
        yield frames[0]
        raise RuntimeError("chunk 2 failed")

    with pytest.raises(RuntimeError, match="chunk 2 failed"):
        lake.write_frames("gpu_minutes", D, failing())
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["data.parquet"]  # no temp file left
    # same frames, same bytes
    lake.write_frames("gpu_minutes", D, iter(frames))
    assert path.read_bytes() == before
    assert pl.read_parquet(path).schema == pl.Schema(GPU_MINUTES_SCHEMA)
