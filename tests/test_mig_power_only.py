"""A MIG GPU's device-level field that dcgm-exporter repeats on each instance's label set is one
reading of the GPU even in a file that gives nothing else of its instances (only the power
series, say): the parser marks the file's MIG GPUs (`ParsedLines.mig_gpus`, kept through the
parse cache in meta.json), and the repeats of one file at one time are duplicates, the first
kept. A non-MIG GPU read twice differently at one time, or another file reading the MIG GPU
differently, is still a conflicting duplicate."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
from helpers import assembled_day, ms

from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
A800 = "dcgm-exporter_a800x8_mig-2g.20gb_error-values.prom"
D = date(2024, 3, 5)
MIG = "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"  # the A800 sample's MIG GPU 0
WHOLE = "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"  # and its GPU 1, no MIG
MODEL = "NVIDIA A800-SXM4-80GB"
TAIL = (
    'Hostname="msxf-hpc-64-35-ai",DCGM_FI_DRIVER_VERSION="535.129.03",'
    'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"'
)
HEAD = ["# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
POWER = "DCGM_FI_DEV_POWER_USAGE"


def _labels(gpu: int, uuid: str, instance: int | None) -> str:
    """The A800 scrape's label set: an instance's carries GPU_I_PROFILE and GPU_I_ID."""
    mig = f'GPU_I_PROFILE="2g.20gb",GPU_I_ID="{instance}",' if instance is not None else ""
    return f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="{MODEL}",{mig}{TAIL}'


def _power_only(minutes: range, powers=(78.174, 78.174, 78.446), whole=(55.942,)) -> list[str]:
    """Power alone: GPU 0 under MIG, its power on instances 3, 5 and 6 (`powers`, one an
    instance); GPU 1 without MIG, its power once per value of `whole` (two: a real conflict)."""
    out = []
    for m in minutes:
        t = ms(D, m)
        for gi, p in zip((3, 5, 6), powers, strict=True):
            out.append(f"{POWER}{{{_labels(0, MIG, gi)}}} {p + m / 1000:.6f} {t}")
        out += [f"{POWER}{{{_labels(1, WHOLE, None)}}} {p:.6f} {t}" for p in whole]
    return out


def _prom_json(minutes: range, powers=(78.174, 78.174, 78.446)) -> str:
    """The same power series as a Prometheus query_range answer (a matrix per label set)."""
    result = []
    for gi, p in zip((3, 5, 6), powers, strict=True):
        metric = {
            "__name__": POWER,
            "gpu": "0",
            "UUID": MIG,
            "device": "nvidia0",
            "modelName": MODEL,
            "GPU_I_PROFILE": "2g.20gb",
            "GPU_I_ID": str(gi),
            "Hostname": "msxf-hpc-64-35-ai",
        }
        values = [[ms(D, m) / 1000, f"{p + m / 1000:.6f}"] for m in minutes]
        result.append({"metric": metric, "values": values})
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def _land(raw: Path, name: str, text: str) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(text)
    os.utime(raw / name, (ms(D, 30) / 1000,) * 2)


def _day(raw: Path, cache: Path, max_rows: int | None = None, general: bool = False):
    return assembled_day(raw, cache, D, max_rows, general)


def _conflicts(q: pl.DataFrame) -> pl.DataFrame:
    return q.filter(pl.col("reason").str.contains("conflicting duplicate"))


def _counts(log: pl.DataFrame) -> dict[str, tuple]:
    cols = ("rows_read", "rows_accepted", "rows_duplicate", "rows_quarantined")
    return {r[0]: r[1:] for r in log.select("source_file", *cols).iter_rows()}


# every line accepted (keyed parse); a line rejected (the general parse, `finalize`); the
# Prometheus API's answer (`formats.common.parsed`)
SHAPES = {
    "clean.prom": lambda m: "\n".join([*HEAD, *_power_only(m)]) + "\n",
    "rejected-line.prom": lambda m: (
        "\n".join([*HEAD, *_power_only(m), f"{POWER}{{{_labels(0, MIG, 3)}}} ERROR {ms(D, 0)}"])
        + "\n"
    ),
    "answer.json": _prom_json,
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_mig_gpus_power_repeated_on_its_instances_is_one_reading_with_nothing_else(
    tmp_path, name
):
    """Ten scrapes: GPU 0's power three times each (78.174 / 78.174 / 78.446 W, as the A800
    scrape has it), nothing else of its instances: one accepted, two duplicates a scrape."""
    raw = tmp_path / "raw"
    _land(raw, name, SHAPES[name](range(10)))
    for cache in ("parsed now", "read back"):  # the marker is kept by the parse cache
        out = _day(raw, tmp_path / "cache")
        q, log = out.quarantine, out.ingest_log
        assert _conflicts(q).is_empty(), cache
        whole = 0 if name == "answer.json" else 10  # GPU 1's power: one a scrape, no MIG
        rejected = 1 if name == "rejected-line.prom" else 0
        assert _counts(log)[name] == (30 + whole + rejected, 10 + whole, 20, rejected), cache
        gpu0 = out.gpu_samples.filter(pl.col("gpu_uuid") == MIG)
        assert gpu0.height == 10 and gpu0["gpu_instance_id"].is_null().all()
        # the first instance's read (GPU_I_ID 3) each minute
        assert gpu0["power_w"].to_list() == pytest.approx([78.174 + m / 1000 for m in range(10)])
        assert gpu0["timestamp"].min() == datetime(2024, 3, 5, 0, 0, 5, tzinfo=UTC)


def test_the_mig_marker_is_kept_in_the_parse_cache(tmp_path):
    raw = tmp_path / "raw"
    _land(raw, "a.prom", SHAPES["clean.prom"](range(3)))
    pf = load_or_parse(list_landing(raw)[0], tmp_path / "cache")
    assert pf.mig_gpus == [MIG]  # GPU 1 gives its power on no instance
    meta = json.loads((pf.pieces[0][0].parent / "meta.json").read_text())
    assert meta["mig_gpus"] == [MIG]
    assert load_or_parse(list_landing(raw)[0], tmp_path / "cache").mig_gpus == [MIG]


def test_a_non_mig_gpu_read_twice_differently_in_one_file_is_still_a_conflict(tmp_path):
    """GPU 1 (no MIG) has two powers at each time, in the file that marks GPU 0 as MIG and in a
    file of its own: conflicts both; GPU 0's repeats in the first stay duplicates."""
    raw = tmp_path / "raw"
    _land(raw, "a.prom", "\n".join([*HEAD, *_power_only(range(5), whole=(55.9, 57.1))]) + "\n")
    lines = [f"{POWER}{{{_labels(1, WHOLE, None)}}} {p} {ms(D, 40)}" for p in (60.0, 61.5)]
    _land(raw, "b.prom", "\n".join([*HEAD, *lines]) + "\n")
    for max_rows, general in ((None, False), (None, True), (20, True)):
        out = _day(raw, tmp_path / f"c{max_rows}{general}", max_rows, general)
        conflicts = _conflicts(out.quarantine)
        assert conflicts["source_file"].to_list() == ["a.prom"] * 5 + ["b.prom"]
        assert conflicts["reason"].str.contains(f"of {WHOLE} at this time is 57.1 here").sum() == 5
        assert conflicts["reason"].str.contains("is 61.5 here but 60.0 in b.prom").sum() == 1
        counts = _counts(out.ingest_log)
        assert counts["a.prom"] == (25, 10, 10, 5)  # GPU 0: 5 + 10 duplicates; GPU 1: 5 + 5
        assert counts["b.prom"] == (2, 1, 0, 1)


def test_another_file_reading_the_mig_gpu_otherwise_is_still_a_conflict(tmp_path):
    """b.prom reads GPU 0 at 90 W where a.prom read 78.174: its three copies conflict (its own
    repeats agree with its first, but that first is not the kept reading)."""
    raw = tmp_path / "raw"
    _land(raw, "a.prom", "\n".join([*HEAD, *_power_only(range(4))]) + "\n")
    _land(raw, "b.prom", "\n".join([*HEAD, *_power_only(range(4), (90.0, 90.0, 90.2))]) + "\n")
    out = _day(raw, tmp_path / "cache")
    conflicts = _conflicts(out.quarantine)
    mig = conflicts.filter(pl.col("reason").str.contains(MIG))
    assert mig.height == 12 and set(mig["source_file"]) == {"b.prom"}
    counts = _counts(out.ingest_log)
    assert counts["a.prom"] == (16, 8, 8, 0)
    assert counts["b.prom"] == (16, 0, 4, 12)  # GPU 1's 55.942: a duplicate, agreeing


@pytest.mark.skipif(not (SAMPLES / A800).is_file(), reason="../shared/samples is not present")
def test_the_a800_scrapes_power_lines_alone_are_one_reading_per_gpu(tmp_path):
    """The real A800 scrape cut to its power series: GPU 0's 78.174 / 78.174 / 78.446 W with no
    instance metric beside them. The 78.446 was a conflicting duplicate; it is a duplicate."""
    text = (SAMPLES / A800).read_text().splitlines()
    power = [ln for ln in text if POWER in ln]
    raw = tmp_path / "raw"
    _land(raw, f"a800_{D}T12:00:00Z.prom", "\n".join(power) + "\n")
    out = _day(raw, tmp_path / "cache")
    assert out.quarantine.is_empty()
    assert out.ingest_log.select(
        "rows_read", "rows_accepted", "rows_duplicate", "rows_quarantined"
    ).row(0) == (10, 8, 2, 0)
    gpu0 = out.gpu_samples.filter(pl.col("gpu_index") == 0)
    assert gpu0["power_w"].to_list() == [78.174]
