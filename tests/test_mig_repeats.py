"""Device-level fields dcgm-exporter repeats on every MIG instance's label set are one reading of
the physical GPU: the repeats of one scrape are duplicates even where they differ slightly
(each instance's copy is a separate read), the first copy (file, then line order) is kept; a
second file whose reading of the GPU disagrees is still a conflicting duplicate, quarantined."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
from helpers import assembled_day, expo_lines, ms, write_file

from gpu_pipeline.defs.checks import validation_pass_rate

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
A800 = "dcgm-exporter_a800x8_mig-2g.20gb_error-values.prom"
D = date(2024, 3, 5)
MODEL = "NVIDIA A100-SXM4-40GB"


def _day(raw: Path, cache: Path, max_rows: int | None = None, general: bool = False):
    return assembled_day(raw, cache, D, max_rows, general)


def _conserved(log: pl.DataFrame) -> bool:
    total = log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    return bool((log["rows_read"] == total).all())


@pytest.mark.skipif(not (SAMPLES / A800).is_file(), reason="../shared/samples is not present")
def test_a_real_mig_scrapes_repeated_device_power_is_one_reading_not_a_conflict(tmp_path):
    """The A800 scrape repeats GPU 0's power on instances 3, 5 and 6: 78.174, 78.174, 78.446.
    The 78.446 was quarantined as a conflicting duplicate (21 quarantined, pass rate 0.9099);
    it is a duplicate, and the rejections left are the file's real ones (10 unknown
    ACCOUNTING_DATA, 10 'ERROR - FAILED TO CONVERT TO STRING')."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / f"a800_{D}T12:00:00Z.prom").write_bytes((SAMPLES / A800).read_bytes())
    out = _day(raw, tmp_path / "cache")
    q, log = out.quarantine, out.ingest_log
    assert not q["reason"].str.contains("conflicting duplicate").any()
    assert q.height == 20
    assert log.select("rows_read", "rows_accepted", "rows_quarantined", "rows_duplicate").row(
        0
    ) == (233, 195, 20, 18)
    assert _conserved(log)
    rate = validation_pass_rate(log, q).metadata["pass_rate"].value
    assert rate == pytest.approx(213 / 233)  # 0.9142 (it was 212 / 233 = 0.9099)
    gpu0 = out.gpu_samples.filter(pl.col("gpu_index") == 0)
    physical = gpu0.filter(pl.col("gpu_instance_id").is_null())
    assert physical.height == 1 and gpu0.height == 4  # the GPU and its three instances
    # the first instance's read (GPU_I_ID 3), not 78.446 nor a mean of the three
    assert physical.select("power_w", "gpu_temp_c", "sm_clock_mhz").row(0) == (78.174, 33, 1410)
    assert gpu0["power_w"].drop_nulls().to_list() == [78.174]


def _mig_scrape(powers: tuple[float, float, float], minutes: range) -> list[str]:
    """A MIG A100 (`GPU-mig`, instances 3, 5, 6) with its power repeated on each instance as
    `powers` (one value an instance), and each instance's own activity."""
    out = []
    for m in minutes:
        t = ms(D, m)
        for gi, p in zip((3, 5, 6), powers, strict=True):
            lab = (
                f'gpu="0",UUID="GPU-mig",modelName="{MODEL}",Hostname="h",'
                f'GPU_I_PROFILE="2g.20gb",GPU_I_ID="{gi}",namespace="ns{gi}",pod="p{gi}"'
            )
            out.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} {p:.3f} {t}")
            out.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{lab}}} 0.{gi} {t}")
    return out


@pytest.fixture
def landing(tmp_path) -> Path:
    """Four files of one host and hour:
    - a.prom: the MIG GPU, its power read 200.0 / 200.3 / 199.8 on the three instances, and a
      whole GPU (`GPU-w`) at 300 W;
    - b.prom: the same MIG GPU and minutes from another source whose reading of it is 250 W
      (but 200.0 on instance 5, the kept value), and `GPU-w` at 310 W;
    - c.prom: minutes 10-19 of the MIG GPU again, its first copy agreeing (200.0) and the
      others not: one reading, all duplicates;
    - d.prom: a whole GPU (`GPU-x`, no MIG) under two pods' label sets with two powers."""
    raw = tmp_path / "raw"
    minutes = range(0, 20)
    write_file(
        raw / "a.prom",
        _mig_scrape((200.0, 200.3, 199.8), minutes)
        + expo_lines("GPU-w", MODEL, "h", "ns", D, minutes, 50, 300.0, gpu=1),
    )
    write_file(
        raw / "b.prom",
        _mig_scrape((250.0, 200.0, 250.0), minutes)
        + expo_lines("GPU-w", MODEL, "h", "ns", D, minutes, 50, 310.0, gpu=1),
    )
    write_file(raw / "c.prom", _mig_scrape((200.0, 201.0, 199.0), range(10, 20)))
    write_file(
        raw / "d.prom",
        expo_lines("GPU-x", MODEL, "h", "p1", D, minutes, 40, 100.0, gpu=2)
        + expo_lines("GPU-x", MODEL, "h", "p2", D, minutes, 40, 101.0, gpu=2),
    )
    for f in raw.iterdir():
        os.utime(f, (ms(D, 30) / 1000,) * 2)
    return raw


def test_mig_repeats_of_one_scrape_are_duplicates_and_a_disagreeing_file_a_conflict(
    landing, tmp_path
):
    out = _day(landing, tmp_path / "cache")
    q, log = out.quarantine, out.ingest_log
    assert _conserved(log)
    per = {r["source_file"]: r for r in log.iter_rows(named=True)}
    # a.prom: 20 minutes x (3 activity + 1 power) kept, the two other power repeats duplicates
    # (200.3 and 199.8 differ from 200.0: separate reads of one device, not a conflict)
    assert (per["a.prom"]["rows_accepted"], per["a.prom"]["rows_duplicate"]) == (80 + 40, 40)
    assert per["a.prom"]["rows_quarantined"] == 0
    conflicts = q.filter(pl.col("reason").str.contains("conflicting duplicate"))
    by_file = conflicts.group_by("source_file").len().sort("source_file").rows()
    # b.prom reads the MIG GPU 250 W (instances 3 and 6: 40 lines) against a.prom's 200 W, and
    # GPU-w 310 W against 300 W (20 lines); d.prom's second pod's 101 W is not a MIG repeat
    assert by_file == [("b.prom", 60), ("d.prom", 20)]
    assert (
        conflicts.filter(pl.col("source_file") == "b.prom")["reason"]
        .str.contains("of GPU-mig at this time is 250.0 here but 200.0 in a.prom")
        .sum()
        == 40
    )
    # b.prom's activity, GPU-w's utilization and instance 5's power (200.0, the kept value) are
    # duplicates; c.prom's reading agrees with the kept one, so its 201/199 repeats are too
    assert per["b.prom"]["rows_duplicate"] == 60 + 20 + 20
    assert per["b.prom"]["rows_quarantined"] == 60
    assert (per["c.prom"]["rows_duplicate"], per["c.prom"]["rows_quarantined"]) == (60, 0)
    s = out.gpu_samples
    mig = s.filter((pl.col("gpu_uuid") == "GPU-mig") & pl.col("gpu_instance_id").is_null())
    assert mig.height == 20 and set(mig["power_w"]) == {200.0}
    assert mig["timestamp"].min() == datetime(2024, 3, 5, 0, 0, 5, tzinfo=UTC)
    assert set(s.filter(pl.col("gpu_uuid") == "GPU-w")["power_w"]) == {300.0}


@pytest.mark.parametrize("max_rows", [None, 100])
def test_mig_repeats_are_the_same_whichever_way_the_day_is_assembled(landing, tmp_path, max_rows):
    """In ranges of GPUs or at once, from keyed or long parses: the same tables."""
    whole = _day(landing, tmp_path / "c1")
    for general in (False, True):
        other = _day(landing, tmp_path / f"c{general}", max_rows, general)
        assert other.gpu_samples.equals(whole.gpu_samples)
        assert other.quarantine.equals(whole.quarantine)
        assert other.ingest_log.equals(whole.ingest_log)
