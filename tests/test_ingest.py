"""Landing files -> one day's gpu_samples / quarantine / ingest_log, with every line accounted for."""

import gzip
import os
from datetime import date

import polars as pl
import pytest
from helpers import MODELS, assemble_day, expo_lines, write_file

from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import DEFAULT_PARSE, list_landing
from gpu_pipeline.lib.schemas import validate

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)


def ingest(raw, cache, day):
    parsed = [load_or_parse(f, cache) for f in list_landing(raw)]
    out = assemble_day(parsed, day)
    validate("gpu_samples", out.gpu_samples)
    validate("ingest_log", out.ingest_log)
    validate("quarantine", out.quarantine)
    return out


def conserve(log: pl.DataFrame) -> bool:
    return (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    ).all()


def test_wide_rows_one_per_gpu_and_timestamp(tmp_path):
    lines = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(3), 80, 100.0)
    lines += expo_lines("GPU-B", MODELS["A100"], "n1", None, D1, range(3), 5, 60.0, gpu=1)
    write_file(tmp_path / "raw" / "c1" / "n1.prom", lines)
    out = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    s = out.gpu_samples
    assert s.height == 6
    assert s.filter(pl.col("gpu_uuid") == "GPU-a")["gpu_util_pct"].to_list() == [80.0] * 3
    assert s.filter(pl.col("gpu_uuid") == "GPU-b")["power_w"].to_list() == [60.0] * 3
    assert set(s["cluster"]) == {"c1"} and set(s["source_file"]) == {"c1/n1.prom"}
    assert s.filter(pl.col("gpu_uuid") == "GPU-a")["namespace"].to_list() == ["ns"] * 3
    log = out.ingest_log.row(0, named=True)
    assert (log["rows_read"], log["rows_accepted"], log["lines_skipped"], log["file_lines"]) == (
        12,
        12,
        2,
        14,
    )
    assert log["format"] == "dcgm_exposition" and len(log["sha256"]) == 64


def test_overlapping_scrapes_and_same_file_twice_are_counted_duplicates(tmp_path):
    a = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(0, 10), 80, 100.0)
    b = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(5, 15), 80, 100.0)
    write_file(tmp_path / "raw" / "a.prom", a)
    write_file(tmp_path / "raw" / "b.prom", b)
    write_file(tmp_path / "raw" / "c_copy_of_a.prom", a)
    out = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    assert out.gpu_samples.height == 15  # minutes 0..14, once each
    log = {r["source_file"]: r for r in out.ingest_log.iter_rows(named=True)}
    assert (log["a.prom"]["rows_accepted"], log["a.prom"]["rows_duplicate"]) == (20, 0)
    assert (log["b.prom"]["rows_accepted"], log["b.prom"]["rows_duplicate"]) == (10, 10)
    assert (
        log["c_copy_of_a.prom"]["rows_accepted"],
        log["c_copy_of_a.prom"]["rows_duplicate"],
    ) == (0, 20)
    assert log["a.prom"]["sha256"] == log["c_copy_of_a.prom"]["sha256"]
    assert conserve(out.ingest_log)


def test_file_spanning_midnight_lands_in_both_days_and_every_line_is_accounted(tmp_path):
    lines = expo_lines("GPU-A", MODELS["H100"], "n1", "ns", D1, range(1430, 1440), 95, 600.0)
    lines += expo_lines("GPU-A", MODELS["H100"], "n1", "ns", D2, range(0, 5), 95, 600.0)
    lines += ["garbage line without a time"]
    write_file(tmp_path / "raw" / "n1.prom", lines)
    d1 = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    d2 = ingest(tmp_path / "raw", tmp_path / "cache", D2)
    assert d1.gpu_samples.height == 10 and d2.gpu_samples.height == 5
    # untimed lines (comments, garbage) belong to the file's first day
    assert d1.quarantine.height == 1 and d2.quarantine.height == 0
    logs = pl.concat([d1.ingest_log, d2.ingest_log])
    assert conserve(logs)
    assert logs["rows_read"].sum() + logs["lines_skipped"].sum() == logs["file_lines"][0] == 33


def test_binary_and_unknown_files_quarantined_whole(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "junk_2024-01-01.bin").write_bytes(bytes(range(256)) * 4)
    (raw / "report_2024-01-01.xml").write_text(
        "<?xml version='1.0'?>\n<nvidia_smi_log></nvidia_smi_log>\n"
    )
    (raw / "broken_2024-01-01.prom.gz").write_bytes(
        gzip.compress(b"DCGM_FI_DEV_GPU_UTIL 1\n" * 100)[:40]
    )
    write_file(
        raw / "good.prom", expo_lines("GPU-A", MODELS["A10G"], "n", "ns", D1, range(2), 50, 150.0)
    )
    out = ingest(raw, tmp_path / "cache", D1)
    q = {r["source_file"]: r for r in out.quarantine.iter_rows(named=True)}
    assert q["junk_2024-01-01.bin"]["reason"].startswith("binary content")
    assert q["report_2024-01-01.xml"]["reason"] == (
        "nvidia_smi_xml: nvidia-smi XML without a <gpu> reading"
    )
    assert q["broken_2024-01-01.prom.gz"]["reason"].startswith("corrupt or truncated gzip")
    assert all(r["line"] is None for r in q.values())
    log = {r["source_file"]: r for r in out.ingest_log.iter_rows(named=True)}
    assert (
        log["junk_2024-01-01.bin"]["rows_read"],
        log["junk_2024-01-01.bin"]["rows_quarantined"],
    ) == (1, 1)
    assert log["junk_2024-01-01.bin"]["format"] == "unreadable"
    assert out.gpu_samples.height == 2 and conserve(out.ingest_log)


def test_a_days_quarantine_read_a_few_files_at_a_time_is_the_quarantine_read_at_once(
    tmp_path, monkeypatch
):
    """The day's quarantine reads its files' rejected lines `FILES_AT_ONCE` files at a time
    (one query over a 10,000-GPU day's 1,668 files held ~250 MiB): the same rows, reasons and
    order with one or two files at a time as all at once, whatever each file's columns
    (lines rejected with a time, a file rejected whole without one, two exporters that
    disagree: a conflict the assembly adds)."""
    from gpu_pipeline.lib.ingest import quarantine as q

    raw = tmp_path / "raw"
    for i in range(5):
        lines = expo_lines(f"GPU-{i}", MODELS["A100"], f"n{i}", "ns", D1, range(3), 50, 100.0)
        if i % 2:
            lines += [f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-{i}"}} oops 1704067200000']
            lines += [f'DCGM_FI_DEV_POWER_USAGE{{UUID="GPU-{i}"}} 1e300 1704067260000']
        write_file(raw / f"n{i}.prom", lines)
    (raw / "junk_2024-01-01.bin").write_bytes(bytes(range(256)) * 4)
    other = expo_lines("GPU-0", MODELS["A100"], "n0", "ns", D1, range(1), 99, 100.0)
    write_file(raw / "z_other_exporter.prom", other)  # GPU-0's first minute, another value
    parsed = [load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)]
    tables = {}
    for at_once in (1, 2, 10_000):
        monkeypatch.setattr(q, "FILES_AT_ONCE", at_once)
        tables[at_once] = assemble_day(parsed, D1).quarantine
    whole = tables[10_000]
    reasons = whole.get_column("reason").to_list()
    assert whole.height == 6 and whole.get_column("source_file").n_unique() == 4
    assert any(r.startswith("binary content") for r in reasons)
    assert sum("conflict" in r or "disagree" in r for r in reasons) >= 1
    for at_once in (1, 2):
        assert tables[at_once].equals(whole)
    # and the batches alone: frames of other columns and types, in order
    frames = [
        pl.LazyFrame({"a": [1, 2], "b": ["x", "y"]}),
        pl.LazyFrame({"a": [3]}),
        pl.LazyFrame({"c": [None, 1.5], "a": [4, 5]}),
    ]
    one = pl.concat(frames, how="diagonal_relaxed").collect()
    for at_once in (1, 2, 3):
        assert q.in_batches(frames, at_once).equals(one)


def test_gzip_file_parses_like_plain(tmp_path):
    lines = expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(4), 80, 100.0)
    write_file(tmp_path / "plain" / "x.prom", lines)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "x.prom.gz").write_bytes(
        gzip.compress((tmp_path / "plain" / "x.prom").read_bytes())
    )
    a = ingest(tmp_path / "plain", tmp_path / "c1", D1).gpu_samples.drop("source_file")
    b = ingest(tmp_path / "gz", tmp_path / "c2", D1).gpu_samples.drop("source_file")
    assert a.equals(b)


def test_cluster_label_wins_over_folder_and_root_files_get_default(tmp_path):
    labelled = [
        ln.replace('Hostname="n1"', 'Hostname="n1",cluster="prod-a"')
        for ln in expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(1), 80, 100.0)
    ]
    write_file(tmp_path / "raw" / "folder-c" / "a.prom", labelled)
    write_file(
        tmp_path / "raw" / "folder-c" / "b.prom",
        expo_lines("GPU-B", MODELS["A100"], "n2", "ns", D1, [0], 1, 1.0),
    )
    write_file(
        tmp_path / "raw" / "c.prom",
        expo_lines("GPU-C", MODELS["A100"], "n3", "ns", D1, [0], 1, 1.0),
    )
    s = ingest(tmp_path / "raw", tmp_path / "cache", D1).gpu_samples
    clusters = dict(zip(s["gpu_uuid"], s["cluster"], strict=True))
    assert clusters == {"GPU-a": "prod-a", "GPU-b": "folder-c", "GPU-c": "default"}


def test_reingesting_unchanged_files_uses_cache_and_changes_nothing(tmp_path):
    write_file(
        tmp_path / "raw" / "a.prom",
        expo_lines("GPU-A", MODELS["A100"], "n1", "ns", D1, range(5), 80, 100.0),
    )
    first = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    cached = sorted(os.listdir(tmp_path / "cache"))
    second = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    assert sorted(os.listdir(tmp_path / "cache")) == cached and len(cached) == 1
    assert first.gpu_samples.equals(second.gpu_samples)
    assert first.ingest_log.equals(second.ingest_log)


def test_hidden_files_and_empty_landing_zone(tmp_path):
    (tmp_path / "raw").mkdir()
    write_file(tmp_path / "raw" / ".partial.prom", ["not read"])
    out = ingest(tmp_path / "raw", tmp_path / "cache", D1)
    assert out.gpu_samples.height == 0 and out.ingest_log.height == 0 and out.quarantine.height == 0
    assert ingest(tmp_path / "nope", tmp_path / "cache", D1).gpu_samples.height == 0


def test_a_day_assembled_in_gpu_ranges_equals_the_day_at_once(tmp_path):
    """A day over the memory budget is assembled a range of GPUs at a time, each range read
    from the cached files that hold its GPUs: the same
    gpu_samples (in SAMPLE_ORDER), quarantine and ingest_log as the day assembled at once,
    duplicates and conflicting duplicates included."""
    from gpu_pipeline.lib.ingest.gpu_samples import DayAssembly

    d = date(2024, 3, 5)
    raw = tmp_path / "raw"
    for h in range(4):
        lines = []
        for g in range(3):
            lines += expo_lines(
                f"GPU-{h}{g}",
                MODELS["A100"],
                f"n{h}",
                f"ns{g}",
                d,
                range(0, 90),
                50 + g,
                200.0,
                gpu=g,
            )
        write_file(raw / "c1" / f"n{h}_{d}.prom", lines)
    # the same host landed twice (duplicates), and a third copy that disagrees on one sample
    twice = (raw / "c1" / f"n1_{d}.prom").read_text()
    (raw / "c1" / f"n1_{d}_copy.prom").write_text(twice)
    (raw / "c2").mkdir()
    (raw / "c2" / f"n2_{d}.prom").write_text(
        (raw / "c1" / f"n2_{d}.prom").read_text().replace(" 50 ", " 77 ", 1)
    )
    parsed = [load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)]
    whole = assemble_day(parsed, d, max_rows=10**9)
    chunked = DayAssembly(parsed, d, max_rows=400)  # a GPU-day here is 180 rows: two GPUs a range
    parts = list(chunked.gpu_samples())
    q = chunked.quarantine()
    assert chunked.chunks == len(parts) >= 6  # GPUs landed twice count twice
    assert pl.concat(parts).equals(whole.gpu_samples)
    assert q.equals(whole.quarantine) and chunked.ingest_log(q).equals(whole.ingest_log)
    assert "conflicting duplicate" in q["reason"].str.join("|").item()
    log = whole.ingest_log
    assert log["rows_duplicate"].sum() > 0 and whole.gpu_samples.height == 12 * 90
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_duplicate"] + log["rows_quarantined"]
    ).all()


def test_a_cached_parse_keeps_its_samples_by_day_then_gpu(tmp_path):
    """The cache keeps a file's samples by UTC day, then GPU, then time, in row groups of
    SAMPLES_ROW_GROUP rows: a range of GPUs of one day is a run of row groups (what the
    assembly of a day range by range reads), whatever order the file was written in."""
    import pyarrow.parquet as pq

    from gpu_pipeline.lib.ingest.cache import SAMPLES_ROW_GROUP, _cache_key

    lines = []
    for day in (D2, D1):  # written later day first, GPUs interleaved within a minute
        for g in (3, 1, 2):
            lines += expo_lines(
                f"GPU-{g}", MODELS["A100"], "n0", "ns", day, range(20), 50, 200.0, gpu=g
            )
    write_file(tmp_path / "raw" / "n0.prom", lines)
    (lf,) = list_landing(tmp_path / "raw")
    pf = load_or_parse(lf, tmp_path / "cache")
    cached = pf.samples.collect()
    assert cached.height == 2 * 3 * 20 * 2  # two days, three GPUs, 20 minutes, two fields
    keys = cached.select(pl.col("timestamp").dt.date().alias("d"), "gpu_uuid", "timestamp", "line")
    assert keys.equals(keys.sort("d", "gpu_uuid", "timestamp", "line"))
    assert keys["d"].to_list()[0] == D1 and keys["gpu_uuid"].to_list()[0] == "GPU-1"
    meta = pq.ParquetFile(
        tmp_path / "cache" / _cache_key(lf, DEFAULT_PARSE) / "samples-00000.parquet"
    )
    assert all(
        meta.metadata.row_group(i).num_rows <= SAMPLES_ROW_GROUP
        for i in range(meta.metadata.num_row_groups)
    )


def test_cache_order_is_the_four_key_sort():
    """`in_cache_order` (two cheap sorts) orders exactly like one sort by SAMPLES_ORDER: days,
    GPUs (one without a UUID), times and lines shuffled."""
    import random

    from gpu_pipeline.lib.ingest.cache import SAMPLES_ORDER, in_cache_order

    rnd = random.Random(7)
    base = 1_704_067_200_000  # 2024-01-01
    rows = [
        (line, base + rnd.randrange(3 * 86_400_000), rnd.choice(["GPU-b", "GPU-a", "GPU-c", None]))
        for line in range(1, 2001)
    ]
    rows += [(9999, rows[5][1], rows[5][2])]  # the same GPU and time on a later line
    rnd.shuffle(rows)
    df = pl.DataFrame(rows, schema=["line", "ts", "gpu_uuid"], orient="row").select(
        "line", pl.col("ts").cast(pl.Datetime("ms", "UTC")).alias("timestamp"), "gpu_uuid"
    )
    assert in_cache_order(df).equals(df.sort(*SAMPLES_ORDER, nulls_last=False))
    assert in_cache_order(df.clear()).height == 0


@pytest.mark.parametrize("case", ["in_order", "shuffled", "null_time"])
def test_keyed_cache_order_is_the_four_key_sort(case):
    """`keyed_in_cache_order` (a file in time order: one radix sort of day and GPU rank) orders
    keyed samples exactly like one sort by day, GPU rank, time and line, whatever their order."""
    import random

    from gpu_pipeline.lib.ingest.cache import keyed_in_cache_order

    rnd = random.Random(11)
    base = 1_704_067_200_000  # 2024-01-01
    series = pl.DataFrame({"gpu_uuid": ["GPU-c", None, "GPU-a", "GPU-b", "GPU-a"]})
    rows = sorted(
        (base + rnd.randrange(3 * 86_400_000) // 1000 * 1000, rnd.randrange(5)) for _ in range(3000)
    )
    df = pl.DataFrame(
        {
            "line": range(1, len(rows) + 1),
            "timestamp": [t for t, _ in rows],
            "value": [float(i) for i in range(len(rows))],
            "sid": [s for _, s in rows],
        },
        schema={"line": pl.Int64, "timestamp": pl.Int64, "value": pl.Float64, "sid": pl.Int32},
    ).with_columns(pl.col("timestamp").cast(pl.Datetime("ms", "UTC")))
    if case == "shuffled":
        df = df.sample(fraction=1.0, shuffle=True, seed=3)
    if case == "null_time":
        df = df.with_columns(
            pl.when(pl.col("line") % 97 == 0)
            .then(None)
            .otherwise(pl.col("timestamp"))
            .alias("timestamp")
        )
    got, table = keyed_in_cache_order(df, series)
    assert table["_g"].to_list() == [3, 0, 1, 2, 1] and table["sid"].to_list() == [0, 1, 2, 3, 4]
    day = pl.col("timestamp").dt.epoch("ms") // 86_400_000
    ranked = df.with_columns(
        pl.Series("_g", [[3, 0, 1, 2, 1][s] for s in df["sid"]], dtype=pl.Int32)
    )
    # by time and line, then stably by day and rank (no time: first, in line order)
    want = ranked.sort("timestamp", "line", nulls_last=False).sort(
        day * 4 + pl.col("_g"), maintain_order=True, nulls_last=False
    )
    assert got.equals(want.select(got.columns)) and got.height == 3000
    if case != "null_time":  # the four keys at once
        assert got.equals(ranked.sort(day, "_g", "timestamp", "line").select(got.columns))


@pytest.mark.parametrize("case", ["one_day", "days", "before_1970", "null_time", "empty"])
def test_series_per_day_counts_as_a_group_by(case):
    """`series_per_day` (NumPy's bincount of day x series) gives the rows of the group-by it
    replaced, in (day, series) order: days either side of midnight, times before 1970, a sample
    without a time (the group-by itself then), no samples."""
    import random

    from gpu_pipeline.lib.ingest.cache import series_per_day

    rnd = random.Random(5)
    base = {"before_1970": -86_400_000 * 3 - 5000}.get(case, 1_704_067_200_000)
    span = 3_600_000 if case == "one_day" else 3 * 86_400_000
    n = 0 if case == "empty" else 5000
    df = pl.DataFrame(
        {
            "timestamp": [base + rnd.randrange(span) for _ in range(n)],
            "sid": [rnd.choice([0, 2, 3, 7, 40]) for _ in range(n)],
        },
        schema={"timestamp": pl.Int64, "sid": pl.Int32},
    ).with_columns(pl.col("timestamp").cast(pl.Datetime("ms", "UTC")))
    if case == "null_time":
        df = df.with_columns(
            pl.when(pl.int_range(pl.len()) % 50 == 0)
            .then(None)
            .otherwise("timestamp")
            .alias("timestamp")
        )
    want = (
        df.group_by(pl.col("timestamp").dt.date().alias("d"), "sid")
        .len()
        .sort("d", "sid", nulls_last=False)
    )
    got = series_per_day(df)
    assert got.schema == want.schema and got.equals(want), (got, want)
    assert got["len"].sum() == n and (case == "empty") == got.is_empty()
    if case in ("days", "before_1970"):
        assert got["d"].n_unique() >= 3


def test_files_parsed_a_few_at_a_time_give_what_one_at_a_time_gives(tmp_path, monkeypatch):
    """`parse_all` parses new small files concurrently, a large one alone: every file once, in
    any order, the results in the landing order and equal to parsing each alone."""
    from gpu_pipeline.lib.ingest import cache as cache_mod
    from gpu_pipeline.lib.ingest.cache import parse_all

    raw = tmp_path / "raw"
    for h in range(6):
        lines = expo_lines(f"GPU-{h}", MODELS["A100"], f"n{h}", "ns", D1, range(30), 40 + h, 150.0)
        write_file(raw / f"n{h}.prom", lines)
    (raw / "junk.bin").write_bytes(b"\x00\x01" * 100)
    files = list_landing(raw)
    big = max(files, key=lambda f: f.size)
    monkeypatch.setattr(cache_mod, "CONCURRENT_PARSE_BYTES", big.size - 1)  # one file is 'large'
    seen = []
    together = parse_all(files, tmp_path / "c1", done=lambda f, pf: seen.append(f.source_file))
    assert sorted(seen) == sorted(f.source_file for f in files)  # each new file once
    assert [p.file.source_file for p in together] == [f.source_file for f in files]
    alone = [load_or_parse(f, tmp_path / "c2") for f in files]
    for a, b in zip(together, alone, strict=True):
        assert (a.format, a.days, a.rows_by_day) == (b.format, b.days, b.rows_by_day)
        assert a.samples.collect().equals(b.samples.collect())
        assert a.quarantine.collect().equals(b.quarantine.collect())
    formats = {p.file.source_file: p.format for p in together}
    assert formats.pop("junk.bin") == "unreadable"  # quarantined whole
    assert set(formats.values()) == {"dcgm_exposition"}
    seen.clear()
    parse_all(files, tmp_path / "c1", done=lambda f, pf: seen.append(f))
    assert seen == []  # all cached: nothing parsed again


def test_ranges_are_validated_in_batches_of_the_same_rows(tmp_path):
    """`validated_batches` joins consecutive ranges into batches of up to `rows` rows (a range
    of more rows alone, never copied into a batch), the same rows in the same order, and still
    rejects a range that breaks the contract."""
    import pytest

    from gpu_pipeline.lib.schemas import ContractError, validated_batches

    raw = tmp_path / "raw"
    for g in range(5):
        write_file(
            raw / f"n{g}.prom",
            expo_lines(f"GPU-{g}", MODELS["A100"], f"n{g}", "ns", D1, range(60), 50, 200.0),
        )
    day = assemble_day([load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)], D1)
    ranges = [day.gpu_samples.slice(i, 50) for i in range(0, day.gpu_samples.height, 50)]
    batches = list(validated_batches("gpu_samples", iter(ranges), rows=120))
    assert [b.height for b in batches] == [100, 100, 100]
    assert pl.concat(batches).equals(day.gpu_samples)
    batches = list(validated_batches("gpu_samples", iter(ranges), rows=200))
    assert [b.height for b in batches] == [200, 100]  # the last batch: what is left
    assert pl.concat(batches).equals(day.gpu_samples)
    batches = list(validated_batches("gpu_samples", iter(ranges), rows=40))
    assert [b.height for b in batches] == [50] * 6
    assert all(b is r for b, r in zip(batches, ranges, strict=True))  # alone: the frame itself
    bad = ranges[3].with_columns(pl.lit("not-a-uuid").alias("gpu_uuid"))
    with pytest.raises(ContractError, match="gpu_uuid"):
        list(validated_batches("gpu_samples", iter(ranges[:3] + [bad]), rows=120))
