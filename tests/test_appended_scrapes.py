"""dcgm-exporter scrapes appended to one file without per-sample timestamps (`curl -s
node:9400/metrics >> dcgm_scrapes_<time>.prom` from cron): the file's time stands for every
line, so a series written again is a later scrape whose time is unknown. Its first line keeps
the file's time; the later ones are quarantined with that reason, not counted as duplicates or
conflicts of the same file (adversarial review)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
from helpers import assemble_day

from gpu_pipeline import native
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.formats.common import Context
from gpu_pipeline.lib.ingest.formats.exposition import parse
from gpu_pipeline.lib.ingest.landing import (
    PieceParse,
    list_landing,
    merge_pieces,
    parse_landing_file,
)


@pytest.fixture(autouse=True, params=["native", "polars"])
def tokenizer(request, monkeypatch):
    """Every test with the native tokenizer and with Polars' CSV reader (as test_exposition)."""
    if request.param == "native" and not native.available():
        pytest.skip("the native tokenizer is not built here")
    monkeypatch.setattr(native, "enabled", request.param == "native")
    return request.param


D = date(2024, 6, 10)
NAME = "dcgm_scrapes_2024-06-10T08:00:00Z.prom"
AT = datetime(2024, 6, 10, 8, 0, tzinfo=UTC)
UUID = "GPU-5e5c7d1a-0000-1111-2222-333344445555"
LABELS = (
    f'{{gpu="0",UUID="{UUID}",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}}'
)
UTIL = [0, 0, 100, 100, 0, 0]
POWER = [70, 70, 650, 650, 70, 70]
REPEATED_UNTIMED = (
    "series written again in a file without sample timestamps (scrapes appended to one file?): "
    "its time is unknown; export with timestamps (dcgm-exporter text with per-sample times, or "
    "one scrape a file)"
)


def scrape(util: float, power: float, labels: str = LABELS, ts: int | None = None) -> str:
    """One dcgm-exporter scrape of one GPU, as `curl node:9400/metrics` writes it."""
    at = "" if ts is None else f" {ts}"
    return (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"DCGM_FI_DEV_GPU_UTIL{labels} {util:g}{at}\n"
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        f"DCGM_FI_DEV_POWER_USAGE{labels} {power:.3f}{at}\n"
    )


def appended(labels: str = LABELS) -> str:
    return "".join(scrape(u, p, labels) for u, p in zip(UTIL, POWER, strict=True))


def land(tmp_path: Path, text: str, name: str = NAME) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(text)
    return raw


def _check_repro(p) -> None:
    """Two samples at the file's time (the first scrape), ten records quarantined as later
    scrapes of unknown time."""
    s = p.samples.sort("column")
    assert s["column"].to_list() == ["gpu_util_pct", "power_w"]
    assert s["value"].to_list() == [0.0, 70.0]
    assert s["timestamp"].to_list() == [AT, AT]
    assert p.quarantine.height == 10
    assert set(p.quarantine["reason"]) == {REPEATED_UNTIMED}
    assert p.quarantine["line"].min() > 6  # the first scrape's lines are kept
    assert p.lines_total - p.lines_skipped == 12
    assert p.time_basis == "file_name"


def test_appended_untimed_scrapes_keep_the_first_and_quarantine_the_rest(tmp_path):
    raw = land(tmp_path, appended())
    (lf,) = list_landing(raw)
    fmt, p = parse_landing_file(lf)
    assert fmt == "dcgm_exposition"
    _check_repro(p)
    # the quarantine quotes each line as written
    assert p.quarantine["raw"].str.starts_with("DCGM_FI_DEV_").all()


def test_appended_untimed_scrapes_through_the_day(tmp_path):
    raw = land(tmp_path, appended())
    files = [load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)]
    day = assemble_day(files, D)
    # gpu_samples is wide: the two samples are one row of the GPU at the file's time
    row = day.gpu_samples.select("timestamp", "gpu_util_pct", "power_w").rows()
    assert row == [(AT, 0.0, 70.0)]
    log = day.ingest_log.row(0, named=True)
    assert (log["rows_read"], log["rows_accepted"]) == (12, 2)
    assert (log["rows_quarantined"], log["rows_duplicate"]) == (10, 0)
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    )
    assert set(day.quarantine["reason"]) == {REPEATED_UNTIMED}


def test_appended_untimed_scrapes_of_an_odd_series_read_the_slow_way():
    # a `}` inside a label value: the series is read line by line; the same rule holds
    odd = LABELS.replace('Hostname="n1"', 'Hostname="n}1"')
    p = parse(appended(odd), Context(NAME, AT))
    _check_repro(p)


def test_one_untimed_scrape_is_unchanged():
    p = parse(scrape(40, 300), Context(NAME, AT))
    assert p.quarantine.height == 0
    assert sorted(p.samples["value"].to_list()) == [40.0, 300.0]
    assert p.samples["timestamp"].to_list() == [AT, AT]
    assert p.time_basis == "file_name"


def test_timed_scrapes_appended_are_all_accepted():
    t0 = int(AT.timestamp() * 1000)
    text = "".join(
        scrape(u, w, ts=t0 + 60_000 * i) for i, (u, w) in enumerate(zip(UTIL, POWER, strict=True))
    )
    p = parse(text, Context(NAME, AT))
    assert p.quarantine.height == 0 and p.samples.height == 12
    util = p.samples.filter(pl.col("column") == "gpu_util_pct").sort("timestamp")
    assert util["value"].to_list() == UTIL
    assert p.time_basis == "sample"


def test_appended_untimed_scrapes_across_pieces(tmp_path):
    # a file parsed a piece at a time: a series of the first piece written again in a later
    # piece is caught too
    text = "".join(scrape(u, w) for u, w in zip(UTIL * 4, POWER * 4, strict=True))
    (lf,) = list_landing(land(tmp_path, text))
    parts = list(PieceParse(lf, piece_bytes=1024))
    assert len(parts) > 2
    _, p = merge_pieces(parts)
    assert p.samples.height == 2 and p.quarantine.height == 46
    assert set(p.quarantine["reason"]) == {REPEATED_UNTIMED}


@pytest.mark.parametrize(
    "later",
    [
        LABELS.replace('Hostname="n1"}', 'Hostname="n1",namespace="b",pod="b-0"}'),  # a new pod
        '{Hostname="n1",modelName="NVIDIA H100 80GB HBM3",device="nvidia0",'
        f'UUID="{UUID}",gpu="0"}}',  # the labels in another order
        LABELS.replace(f'UUID="{UUID}"', f'UUID="{UUID.lower()}"'),  # written otherwise
    ],
    ids=["pod changed", "label order", "uuid case"],
)
def test_a_later_scrape_of_the_same_gpu_with_other_labels_is_written_again(tmp_path, later):
    """Written again is a reading of the same GPU and field, not the same label text: a pod
    that came between two appended scrapes, or labels in another order, made the later
    scrape's lines a first reading of their own, filed at the file's time as a duplicate or a
    conflict of the first (review of the first version)."""
    raw = land(tmp_path, scrape(0, 70) + "".join(scrape(100, 650, later) for _ in range(5)))
    (lf,) = list_landing(raw)
    _, p = parse_landing_file(lf)
    _check_repro(p)


def test_a_gpu_shared_by_two_pods_in_one_scrape_is_not_written_again(tmp_path):
    """dcgm-exporter writes a GPU shared by time-slicing once per pod: in one scrape without
    timestamps those lines are not a later scrape (they stay duplicates of each other); a
    second scrape appended, with its comments again, is."""
    pods = [LABELS.replace('Hostname="n1"}', f'Hostname="n1",pod="{p}"}}') for p in "ab"]
    one = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        + "".join(f"DCGM_FI_DEV_GPU_UTIL{lab} 40\n" for lab in pods)
        + "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        + "".join(f"DCGM_FI_DEV_POWER_USAGE{lab} 200.000\n" for lab in pods)
    )
    raw = land(tmp_path, one)
    (lf,) = list_landing(raw)
    _, p = parse_landing_file(lf)
    assert p.samples.height == 4 and p.quarantine.height == 0
    raw = land(tmp_path / "two", one + one)
    (lf,) = list_landing(raw)
    _, p = parse_landing_file(lf)
    assert p.samples.height == 4 and p.quarantine.height == 4
    assert set(p.quarantine["reason"]) == {REPEATED_UNTIMED}
