"""The keyed cache and the integer day assembly (issue 34) give exactly what the long form and
the general assembly give: the same samples for every file, and the same gpu_samples,
quarantine and ingest_log for a day, whatever the chunks, with duplicates, conflicts, MIG
instances, several days in one file and pods that change during the day."""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl
import pytest
from helpers import assemble_day, expo_lines, ms, write_file

from gpu_pipeline.lib.ingest import keyed_day
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing, parse_landing_file
from gpu_pipeline.lib.samples import LONG_SCHEMA

D = date(2024, 1, 1)
D2 = D + timedelta(days=1)
MODEL = "NVIDIA H100 80GB HBM3"


def _mig_lines(day: date, power: bool = True) -> list[str]:
    """A MIG GPU: two instances' activity, device-level power on each (re-keyed to the GPU:
    duplicates of each other)."""
    out = []
    for inst in (1, 2):
        lab = (
            f'{{gpu="3",UUID="GPU-mig0",modelName="{MODEL}",Hostname="h3",GPU_I_ID="{inst}",'
            f'GPU_I_PROFILE="3g.40gb",namespace="team{inst}",pod="p{inst}-7d9f8c6b5d-x2kq9"}}'
        )
        for m in range(0, 30):
            t = ms(day, m)
            out += [f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{lab} 0.{inst}5 {t}"]
            out += [f"DCGM_FI_DEV_POWER_USAGE{lab} 300.5 {t}"] if power else []
    return out


@pytest.fixture
def landing(tmp_path):
    raw = tmp_path / "raw"
    # host a: 3 GPUs over two days; the pod of GPU a1 changes at minute 40
    lines = []
    for g in range(3):
        lines += expo_lines(f"GPU-a{g}", MODEL, "ha", "train", D, range(0, 40), 50 + g, 300, g)
        ns = "infer" if g == 1 else "train"
        lines += expo_lines(f"GPU-a{g}", MODEL, "ha", ns, D, range(40, 90), 60 + g, 310, g)
        lines += expo_lines(f"GPU-a{g}", MODEL, "ha", "train", D2, range(0, 20), 70, 320, g)
    write_file(raw / "ha.prom", lines)
    # host b: 2 GPUs; a second exporter repeats GPU b0 (same values: duplicates) and b1 with
    # another value at some times (conflicts: quarantined)
    b = [
        ln
        for g in range(2)
        for ln in expo_lines(f"GPU-b{g}", MODEL, "hb", "eval", D, range(0, 60), 30, 200, g)
    ]
    write_file(raw / "hb.prom", b)
    again = expo_lines("GPU-b0", MODEL, "hb", "eval", D, range(10, 30), 30, 200, 0)
    again += expo_lines("GPU-b1", MODEL, "hb", "eval", D, range(50, 55), 31, 200, 1)
    write_file(raw / "hb_copy.prom", again)
    write_file(raw / "mig.prom", _mig_lines(D) + _mig_lines(D2, power=False))
    return raw


def _parsed(raw, cache):
    return [load_or_parse(f, cache) for f in list_landing(raw)]


def _general(files):
    """The same parses, read as the general way reads them (the long form)."""
    for pf in files:
        pf.samples = pf.samples.collect().lazy()  # `frames` set: not keyed any more
    return files


def test_a_keyed_parse_is_the_long_parse(landing, tmp_path):
    for lf in list_landing(landing):
        cached = load_or_parse(lf, tmp_path / "c")
        assert cached.pieces and all(t is not None for _, t in cached.pieces), lf.source_file
        keyed = cached.samples.collect()
        _, long = parse_landing_file(lf)
        assert keyed.schema == pl.Schema(LONG_SCHEMA)
        order = ["line", "column"]
        assert keyed.sort(order).equals(long.samples.sort(order)), lf.source_file
        # a day's rows of a range of GPUs read by row groups are those rows of the whole
        part = cached.rows(D, ("GPU-a1", "GPU-b0"), no_uuid=False).collect()
        whole = keyed.filter(
            (pl.col("timestamp").dt.date() == D)
            & pl.col("gpu_uuid").is_between(pl.lit("GPU-a1"), pl.lit("GPU-b0"))
        )
        assert part.sort(order).equals(whole.sort(order))


@pytest.mark.parametrize("max_rows", [None, 150, 1])
@pytest.mark.parametrize("day", [D, D2])
def test_the_integer_assembly_is_the_general_one(landing, tmp_path, max_rows, day):
    keyed = _parsed(landing, tmp_path / "c")
    assert keyed_day.keyed_only(list(enumerate(keyed)))
    general = _general(_parsed(landing, tmp_path / "c"))
    assert not keyed_day.keyed_only(list(enumerate(general)))
    a, b = assemble_day(keyed, day, max_rows), assemble_day(general, day, max_rows)
    assert a.gpu_samples.height > 0
    assert a.gpu_samples.equals(b.gpu_samples)
    assert a.quarantine.equals(b.quarantine)
    assert a.ingest_log.equals(b.ingest_log)
    if day == D:  # the conflicts are there, and the changed pod is on its own rows
        # GPU b1's utilization differs at 5 times (its power does not: duplicates)
        assert a.quarantine["reason"].str.contains("conflicting duplicate").sum() == 5
        a1 = a.gpu_samples.filter(pl.col("gpu_uuid") == "GPU-a1")
        assert a1.group_by("namespace").len().sort("namespace").rows() == [
            ("infer", 50),
            ("train", 40),
        ]
        assert (
            a.ingest_log.filter(pl.col("source_file").str.ends_with("hb_copy.prom"))[
                "rows_duplicate"
            ].item()
            == 20 * 2 + 5
        )


def test_a_range_without_duplicates_takes_the_integer_way(landing, tmp_path, monkeypatch):
    """The integer way is taken where it can be (a range with a duplicate goes the general way,
    and the result is the same either way: the test above)."""
    calls = {"integer": 0, "general": 0}
    real = keyed_day.KeyedDay.assemble

    def counted(self, rows):
        out = real(self, rows)
        calls["general" if out is None else "integer"] += 1
        return out

    monkeypatch.setattr(keyed_day.KeyedDay, "assemble", counted)
    files = _parsed(landing, tmp_path / "c")
    day2 = assemble_day(files, D2, None)  # day 2: no duplicates
    assert calls == {"integer": 1, "general": 0}
    mig = day2.gpu_samples.filter(pl.col("gpu_uuid") == "GPU-mig0")
    assert mig.group_by("gpu_instance_id", "namespace").len().sort("gpu_instance_id").rows() == [
        (1, "team1", 30),
        (2, "team2", 30),
    ]
    assemble_day(files, D, None)  # day 1: duplicates and conflicts
    assert calls == {"integer": 1, "general": 1}


def test_series_tables_are_read_together_or_one_by_one(tmp_path):
    """A day's series tables are read in one call, each row with its piece's index; tables of
    other shapes (a column one lacks) are read one at a time, to the same rows."""
    from gpu_pipeline.lib.ingest.keyed_day import _series_tables

    a, b, c = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    pl.DataFrame({"sid": [0, 1], "len": [3, 4]}).write_parquet(a)
    pl.DataFrame({"sid": [0], "len": [5]}).write_parquet(b)
    pl.DataFrame({"sid": [0], "len": [6], "extra": ["x"]}).write_parquet(c)
    same = _series_tables([b, a])
    assert same.select("_p", "sid", "len").rows() == [(0, 0, 5), (1, 0, 3), (1, 1, 4)]
    mixed = _series_tables([a, c])
    assert mixed.select("_p", "sid", "len").rows() == [(0, 0, 3), (0, 1, 4), (1, 0, 6)]
    assert mixed["extra"].to_list() == [None, None, "x"]


def test_ranges_assembled_two_at_a_time_come_in_order():
    """`in_order` computes a few items at once and gives their results in the items' order; a
    failure is raised where its item comes."""
    import threading
    import time

    from gpu_pipeline.lib.ingest.gpu_samples import in_order

    running, most = [0], [0]
    lock = threading.Lock()

    def slow(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02 if i % 3 else 0.05)  # later items may finish first
        with lock:
            running[0] -= 1
        return i * i

    assert list(in_order(slow, list(range(9)), 2)) == [i * i for i in range(9)]
    assert most[0] == 2
    assert list(in_order(slow, [3], 2)) == [9] and list(in_order(slow, [], 2)) == []

    def fails(i: int) -> int:
        if i == 4:
            raise ValueError("range 4")
        return i

    got = []
    with pytest.raises(ValueError, match="range 4"):
        for r in in_order(fails, list(range(8)), 2):
            got.append(r)
    assert got == [0, 1, 2, 3]
