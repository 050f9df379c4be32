"""A day processed in GPU chunks gives the same tables as the day at once, and streams its writes."""

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from helpers import assemble_day
from polars.testing import assert_frame_equal

from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.io.lake import WRITE_OPTIONS, Lake
from gpu_pipeline.lib.marts.day_tables import DayTables
from gpu_pipeline.lib.marts.fleet_daily import fleet_daily
from gpu_pipeline.lib.marts.gpu_health import gpu_health, gpu_health_by_chunk
from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.rules import Thresholds
from gpu_pipeline.lib.samples import SAMPLE_ORDER, collect_stable, conform
from gpu_pipeline.lib.schemas import GPU_MINUTES_SCHEMA, GPU_SAMPLES_SCHEMA
from gpu_pipeline.lib.staging import chunked
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import INPUT_COLUMNS, gpu_minutes
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
        "fleet": collect_stable(fleet_daily(minute_runs(m.lazy()))),
    }


def _chunked(samples: pl.DataFrame, **kw) -> dict[str, pl.DataFrame]:
    tables = DayTables()
    m = pl.concat(
        [tables.add(c) for c in chunked.minutes_by_chunk(samples.lazy(), CAT, PRICES, **kw)]
    )
    out = {
        "minutes": m,
        "daily": tables.gpu_daily(),
        "hourly": tables.hourly_fleet_metrics(),
        "waste": tables.priced_waste(),
        "fleet": tables.fleet_daily(),
    }
    return out | {"chunks": tables.chunks}


@pytest.mark.parametrize(
    ("max_gpus", "split", "chunks"),
    [(1, "gpus", 13), (5, "gpus", 3), (100, "gpus", 1), (3, "cluster", None)],
)
def test_chunks_give_the_tables_of_one_pass(samples, max_gpus, split, chunks):
    one = _one_pass(samples)
    got = _chunked(samples, chunking=chunked.Chunking(gpus=max_gpus, split=split))
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
    # fleet_daily sums each GPU's runs, then the GPUs in UUID order: the same bits in any chunking
    assert_frame_equal(got["fleet"], one["fleet"], check_exact=True)
    assert got["fleet"].height == 1
    # a MIG GPU and its instances stay in one chunk: the physical row's utilization is theirs
    mig = minutes.filter(pl.col("gpu_uuid") == "GPU-mig0", pl.col("gpu_instance_id").is_null())
    assert mig["util_source"].unique().to_list() == ["mig_instances"]
    assert mig["gpu_util_pct"][0] == pytest.approx(100 * (3 * 0.7 + 2 * 0.2) / 7)


@pytest.mark.parametrize("max_gpus", [1, 5, 100])
def test_gpu_health_by_chunk_is_the_days_table(samples, max_gpus):
    """gpu_health computed a chunk of whole GPUs at a time is the table of the day at once (the
    MIG GPU's instances stay with it: only its physical row counts)."""
    hot = samples.with_columns(  # a hot GPU and an XID, so the table is not all `ok`
        pl.when(pl.col("gpu_uuid") == samples["gpu_uuid"][0])
        .then(pl.lit(95.0))
        .otherwise(pl.col("gpu_temp_c"))
        .alias("gpu_temp_c"),
        pl.when(pl.col("gpu_uuid") == samples["gpu_uuid"][-1])
        .then(pl.lit(79))
        .otherwise(pl.col("xid_errors"))
        .cast(samples.schema["xid_errors"])
        .alias("xid_errors"),
    )
    whole = collect_stable(gpu_health(hot.lazy(), CAT))
    got = gpu_health_by_chunk(hot.lazy(), CAT, chunking=chunked.Chunking(gpus=max_gpus))
    assert_frame_equal(got, whole)
    assert got.height == 13 and got["gpu_uuid"].is_unique().all()
    assert sorted(got["status"].unique().to_list()) == ["ok", "warn"]
    empty = gpu_health_by_chunk(hot.lazy().head(0), CAT)
    assert empty.height == 0 and empty.columns == whole.columns


def test_cluster_split_never_mixes_clusters(samples):
    for chunk in chunked.plan(samples.lazy(), chunked.Chunking(gpus=3, split="cluster")):
        clusters = samples.filter(chunk.predicate)["cluster"].unique().to_list()
        assert clusters == [chunk.cluster]
    planned = {
        c.cluster for c in chunked.plan(samples.lazy(), chunked.Chunking(gpus=3, split="cluster"))
    }
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
    got = _chunked(both, chunking=chunked.Chunking(gpus=2))["minutes"]
    assert got.height == 1440 * 3 and got["samples"].unique().to_list() == [2]
    assert_frame_equal(got, _one_pass(both)["minutes"])
    # utilization is the mean of the minute's two samples
    first = plain.row(0, named=True)["gpu_util_pct"]
    assert got.row(0, named=True)["gpu_util_pct"] == pytest.approx(first * 0.75)


def test_a_chunk_reads_only_the_columns_its_minutes_are_computed_from(samples):
    """gpu_minutes of all of a day's sample columns is gpu_minutes of INPUT_COLUMNS alone (what
    a staging chunk reads), minute-level and 30 s samples, MIG included. Every column holds
    values, so a column the minutes read and INPUT_COLUMNS lacked would change them."""
    rng = np.random.default_rng(11)
    filled = samples.with_columns(
        [
            pl.col(c).fill_null(pl.Series(rng.uniform(0.0, 1.0, samples.height)))
            for c, dtype in samples.schema.items()
            if dtype == pl.Float64
        ]
        + [
            pl.col(c).fill_null(pl.format("{}-{}", pl.lit(c), pl.int_range(pl.len()) % 3))
            for c, dtype in samples.schema.items()
            if dtype == pl.String and c not in ("gpu_uuid", "gpu_instance_profile")
        ]
    )
    assert set(INPUT_COLUMNS) < set(filled.columns)
    assert (
        filled.null_count()
        .select(pl.all().exclude("gpu_instance_id", "gpu_instance_profile", "gpu_index"))
        .sum_horizontal()
        .item()
        == 0
    )
    half = filled.with_columns(pl.col("timestamp") + pl.duration(seconds=30))
    for day, minute_level in ((filled, True), (pl.concat([filled, half]), False)):
        day = day.sort(*SAMPLE_ORDER, nulls_last=False)
        kw = {"already_minutes": minute_level, "presorted": True}
        whole = collect_stable(gpu_minutes(day.lazy(), CAT, PRICES, **kw))
        read = collect_stable(gpu_minutes(day.select(INPUT_COLUMNS).lazy(), CAT, PRICES, **kw))
        assert_frame_equal(read, whole)
        assert whole["gpu_instance_id"].drop_nulls().n_unique() == 2  # MIG instances in it
    # and the staging pass, which reads only those, gives the minutes of all the columns
    assert_frame_equal(
        _chunked(filled, chunking=chunked.Chunking(gpus=5))["minutes"], _one_pass(filled)["minutes"]
    )


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
        assert_frame_equal(got[k], want[k], check_exact=k == "fleet")
    with pytest.raises(ValueError, match="at least 16"):
        chunked.Chunking(mb=1)


def _footer(path) -> pq.FileMetaData:
    return pq.read_metadata(path)


def _written(frame: pl.DataFrame, path, group_rows: int, **options) -> str:
    frame.write_parquet(path, **(WRITE_OPTIONS | {"row_group_size": group_rows} | options))
    return str(path)


@pytest.mark.parametrize(("group_rows", "chunks"), [(2_000, 2), (6_000, 3)])
def test_chunks_cut_from_the_files_row_groups(samples, tmp_path, group_rows, chunks):
    """A day's file in SAMPLE_ORDER (as the lake writes it): its footer cuts the chunks, whole
    row groups up to the budget, without counting any GPU's rows; the ranges meet end to end,
    every GPU is in exactly one chunk, and the tables are those of one pass."""
    path = _written(samples, tmp_path / "day.parquet", group_rows)
    budget = chunked.Chunking(mb=16)  # 10,922 rows: five groups of 2,000, one of 6,000
    ranges = chunked.row_group_plan(_footer(path), budget)
    groups = -(-samples.height // group_rows)
    assert len(ranges) == -(-groups // (budget.rows // group_rows)) == chunks
    assert ranges[0].lo is None and ranges[-1].hi is None
    assert all(a.hi == b.lo and a.hi is not None for a, b in zip(ranges, ranges[1:], strict=False))
    scan = pl.scan_parquet(path)
    gpus = [set(scan.filter(r.predicate).collect()["gpu_uuid"]) for r in ranges]
    sizes = [scan.filter(r.predicate).select(pl.len()).collect().item() for r in ranges]
    assert sum(sizes) == samples.height and set().union(*gpus) == set(samples["gpu_uuid"])
    assert sum(len(g) for g in gpus) == samples["gpu_uuid"].n_unique()  # none in two chunks
    assert all(0 < n <= budget.rows + 1_440 for n in sizes)  # a straddling GPU moves on
    got = _chunked(scan, chunking=budget, footer=_footer(path))
    assert got["chunks"] == chunks
    want = _one_pass(samples)
    for k in want:
        assert_frame_equal(got[k], want[k], check_exact=k in ("minutes", "daily", "fleet"))


def test_row_groups_cut_chunks_only_when_the_footer_says_enough(samples, tmp_path):
    """Out of UUID order, a row group over the budget, no UUID statistics, a null UUID, UUIDs
    as bytes, chunks by GPU count or cluster: no plan from the footer (the rows of each GPU are counted, and the
    tables are the same). One GPU over many groups is one chunk, never an empty one."""
    budget = chunked.Chunking(mb=16)
    shuffled = samples.sample(fraction=1.0, shuffle=True, seed=3)
    unsorted = _written(shuffled, tmp_path / "shuffled.parquet", 2_000)
    assert chunked.row_group_plan(_footer(unsorted), budget) is None
    got = _chunked(pl.scan_parquet(unsorted), chunking=budget, footer=_footer(unsorted))
    assert got["chunks"] == len(chunked.plan(samples.lazy(), budget))
    assert_frame_equal(got["minutes"], _one_pass(samples)["minutes"])
    sorted_ = _written(samples, tmp_path / "sorted.parquet", 2_000)
    assert chunked.row_group_plan(_footer(sorted_), chunked.Chunking(gpus=3)) is None
    assert (
        chunked.row_group_plan(_footer(sorted_), chunked.Chunking(mb=16, split="cluster")) is None
    )
    assert (
        chunked.row_group_plan(_footer(_written(samples, tmp_path / "big.parquet", 20_000)), budget)
        is None
    )
    bare = _written(samples, tmp_path / "bare.parquet", 2_000, statistics=False)
    assert chunked.row_group_plan(_footer(bare), budget) is None
    uuids = pl.DataFrame({"gpu_uuid": ["a"] * 100 + ["b"] * 25_000 + ["c"] * 100})
    spans = chunked.row_group_plan(_footer(_written(uuids, tmp_path / "b.parquet", 1_000)), budget)
    assert spans == [chunked.UuidRange(None, "b"), chunked.UuidRange("b", None)]
    null = uuids.with_columns(
        pl.when(pl.int_range(pl.len()) == 5)
        .then(None)
        .otherwise(pl.col("gpu_uuid"))
        .alias("gpu_uuid")
    )
    assert null["gpu_uuid"].null_count() == 1
    assert (
        chunked.row_group_plan(_footer(_written(null, tmp_path / "n.parquet", 1_000)), budget)
        is None
    )
    # a footer that does not describe the rows (all of them sort below "b": the second chunk is
    # empty) still puts every GPU in one chunk: the day's tables, whatever the footer says
    other = _chunked(
        samples, chunking=budget, footer=_footer(_written(uuids, tmp_path / "o.parquet", 1_000))
    )
    assert other["chunks"] == 2 and samples["gpu_uuid"].max() < "b"
    for k, want in _one_pass(samples).items():
        assert_frame_equal(other[k], want, check_exact=k in ("minutes", "daily", "fleet"))
    binary = uuids.with_columns(pl.col("gpu_uuid").cast(pl.Binary))
    assert (
        chunked.row_group_plan(_footer(_written(binary, tmp_path / "x.parquet", 1_000)), budget)
        is None
    )
    empty = _written(samples.clear(), tmp_path / "empty.parquet", 2_000)
    assert chunked.row_group_plan(_footer(empty), budget) == []


def test_the_lakes_own_day_files_cut_their_chunks(samples, tmp_path):
    """A day of gpu_samples as the lake writes it qualifies for the plan from its footer (in
    SAMPLE_ORDER, UUID statistics, row groups within a chunk), and the default chunk holds two
    of the lake's row groups; a day the lake does not hold has no file to plan from."""
    lake = Lake(tmp_path / "lake")
    assert lake.footer("gpu_samples", D) is None
    lake.write("gpu_samples", D, samples)
    meta = lake.footer("gpu_samples", D)
    assert meta.num_rows == samples.height == lake.row_count("gpu_samples", D)
    assert chunked.row_group_plan(meta) == [chunked.UuidRange(None, None)]  # one group, one chunk
    assert chunked.Chunking().rows // WRITE_OPTIONS["row_group_size"] == 2


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
    tables = DayTables()
    empty = pl.LazyFrame(schema=GPU_SAMPLES_SCHEMA)
    assert list(chunked.minutes_by_chunk(empty, CAT, PRICES)) == []
    assert tables.gpu_daily().height == 0 and tables.hourly_fleet_metrics().height == 0
    assert tables.fleet_daily().height == 0 and tables.fleet_daily().columns[:2] == ["date", "gpus"]
    assert tables.priced_waste().columns[:4] == ["date", "cluster", "namespace", "gpu_model"]


def test_streamed_write_is_one_file_and_an_error_keeps_the_previous_version(tmp_path, samples):
    lake = Lake(tmp_path / "lake")
    frames = list(
        chunked.minutes_by_chunk(samples.lazy(), CAT, PRICES, chunking=chunked.Chunking(gpus=4))
    )
    path, rows = lake.write_frames("gpu_minutes", D, iter(frames))
    # twelve GPUs a day, and the MIG GPU's physical row and two instances for 30 minutes
    assert rows == sum(f.height for f in frames) == 12 * 1440 + 3 * 30
    before = path.read_bytes()
    # the file holds every column but `date`, which its folder names; the lake reads it back
    assert_frame_equal(pl.read_parquet(path), pl.concat(frames).drop("date"))
    assert_frame_equal(lake.read("gpu_minutes", D), pl.concat(frames))

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
    assert pl.read_parquet(path).schema == pl.Schema(
        {c: t for c, t in GPU_MINUTES_SCHEMA.items() if c != "date"}
    )


# the view analysts had before fleet_daily was a table (sql/views.sql up to 0.17.1), with the
# idle bound it hard-coded as a parameter
OLD_FLEET_DAILY_VIEW = """
SELECT
    date,
    count(DISTINCT gpu_uuid)                                   AS gpus,
    count(*) / 60.0                                            AS gpu_hours,
    avg(gpu_util_pct)                                          AS avg_gpu_util_pct,
    avg(rfu_pct)                                               AS avg_rfu_pct,
    avg(efficiency_gap_pct)                                    AS avg_efficiency_gap_pct,
    avg(pif)                                                   AS avg_pif,
    100.0 * count(*) FILTER (phase = 'idle') / count(*)          AS pct_idle,
    100.0 * count(*) FILTER (phase = 'underutilized') / count(*) AS pct_underutilized,
    100.0 * count(*) FILTER (phase = 'productive') / count(*)    AS pct_productive,
    100.0 * count(*) FILTER (phase = 'compute_bound') / count(*) AS pct_compute_bound,
    100.0 * count(*) FILTER (phase = 'unknown') / count(*)       AS pct_unknown,
    100.0 * count(*) FILTER (efficiency_class = 'bottlenecked')
          / nullif(count(*) FILTER (gpu_util_pct >= {idle_below}), 0)    AS pct_active_bottlenecked
FROM minutes
WHERE gpu_instance_id IS NULL
GROUP BY date
"""


@pytest.mark.parametrize(
    "t",
    [Thresholds(), Thresholds(idle_below=25.0, productive_from=60.0, compute_bound_from=95.0)],
    ids=["default_rules", "other_rules"],
)
def test_fleet_daily_gives_the_old_views_numbers_and_follows_the_rules(samples, t):
    """The table the staging pass writes equals what the hand-written view computed in DuckDB
    over gpu_minutes (on the default rules; on others, the view with the rules' idle bound),
    plus the day's coverage: twelve GPUs the whole day and a MIG GPU for 30 minutes."""
    import duckdb

    tables = DayTables(t=t)
    minutes = pl.concat(
        [
            tables.add(c)
            for c in chunked.minutes_by_chunk(
                samples.lazy(), CAT, PRICES, t, chunking=chunked.Chunking(gpus=5)
            )
        ]
    )
    got = tables.fleet_daily()
    con = duckdb.connect()
    con.register("minutes", minutes.to_arrow())
    want = pl.from_arrow(con.sql(OLD_FLEET_DAILY_VIEW.format(idle_below=t.idle_below)).arrow())
    assert want.height == got.height == 1
    for c in want.columns:
        w, g = want[c].item(), got[c].item()
        assert g == (pytest.approx(w, rel=1e-12) if isinstance(w, float) else w), c
    # the rules moved minutes between phases: not the default rules' numbers
    assert got["pct_idle"].item() > 0
    row = got.row(0, named=True)
    # a MIG GPU counts once: 13 physical GPUs, 12 x 1,440 + 30 of 13 x 1,440 GPU-minutes
    assert row["gpus"] == 13
    assert (
        row["observed_gpu_minutes"]
        == 12 * 1440 + 30
        == minutes.filter(pl.col("gpu_instance_id").is_null()).height
    )
    assert row["expected_gpu_minutes"] == 13 * 1440
    assert row["coverage_pct"] == pytest.approx(100 * (12 * 1440 + 30) / (13 * 1440))
    assert row["gpu_hours"] == pytest.approx((12 * 1440 + 30) / 60)
    phases = ["idle", "underutilized", "productive", "compute_bound", "unknown"]
    assert sum(row[f"pct_{p}"] for p in phases) == pytest.approx(100.0)
    daily = tables.gpu_daily()
    mig = daily.filter(pl.col("gpu_uuid") == "GPU-mig0")
    assert mig["coverage_pct"].to_list() == pytest.approx([100 * 30 / 1440] * 3)
    assert daily.filter(pl.col("gpu_uuid") != "GPU-mig0")["coverage_pct"].unique().to_list() == [
        100.0
    ]


def test_fleet_daily_idle_bound_is_the_rules_not_10(samples):
    """pct_active_bottlenecked counts active minutes by the rules' idle bound (the view
    hard-coded 10): with idle below 25 %, minutes at 10-25 % are no longer active."""
    t = Thresholds(idle_below=25.0)
    tables = DayTables(t=t)
    minutes = pl.concat(
        [tables.add(c) for c in chunked.minutes_by_chunk(samples.lazy(), CAT, PRICES, t)]
    ).filter(pl.col("gpu_instance_id").is_null())
    active = minutes.filter(pl.col("gpu_util_pct") >= 25.0).height
    between = minutes.filter(pl.col("gpu_util_pct").is_between(10.0, 25.0, closed="left")).height
    bottlenecked = minutes.filter(pl.col("efficiency_class") == "bottlenecked").height
    assert between > 0 and bottlenecked > 0
    got = tables.fleet_daily()["pct_active_bottlenecked"].item()
    assert got == pytest.approx(100 * bottlenecked / active)
    assert got != pytest.approx(100 * bottlenecked / (active + between))


def test_fleet_daily_is_the_same_bytes_collect_after_collect(tmp_path):
    """Re-materializing a day gives the same contents: fleet_daily's float sums changed in the
    last bit from one collect of the same runs to the next (a filter ahead of its group-by; 44
    of 100 collects on a 50-GPU day, adversarial review)."""
    generate(tmp_path / "raw", D, days=1, gpus=50, clusters=3, seed=42)
    files = [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")]
    tables = DayTables()
    for m in chunked.minutes_by_chunk(assemble_day(files, D).gpu_samples.lazy(), CAT, PRICES):
        tables.add(m)
    runs = pl.concat(tables.runs)
    first = collect_stable(fleet_daily(runs.lazy()))
    assert first.height == 1 and first["gpus"].item() == 50
    differ = sum(not collect_stable(fleet_daily(runs.lazy())).equals(first) for _ in range(60))
    assert differ == 0
