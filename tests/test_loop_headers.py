"""GPUs of an nvidia-smi loop log without identity columns, whatever headers it holds: a header
printed before every iteration (`nvidia-smi --query-gpu=… --format=csv >> log` in a shell loop),
a logger restarted with another field order, a file parsed in 64 MiB pieces. The loop's
structure is decided over all of the file's rows (adversarial review B: r1, r2, r3)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from helpers import assemble_day

from gpu_pipeline.lib.ingest import landing
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
TRACE = SAMPLES / "trace_nvidia-smi-loop_8xh100_training_power-util_window.csv"
D = date(2025, 7, 26)
H1 = "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"
H2 = "timestamp, utilization.gpu [%], power.draw [W], memory.used [MiB]"


def _stamp(t: datetime) -> str:
    return f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}"


def _iteration(t: datetime, gpus: int, order: int = 1, skip: int | None = None) -> list[str]:
    """One loop iteration: GPU g's rows 1 ms apart, its power 100 + 50 g W (its number)."""
    rows = []
    for g in range(gpus):
        if g == skip:
            continue
        ts, p, u = _stamp(t + timedelta(milliseconds=g)), f"{100 + 50 * g}.25 W", f"{10 * g} %"
        rows.append(f"{ts}, {p}, {u}, {1000 * g} MiB" if order == 1 else f"{ts}, {u}, {p}, 0 MiB")
    return rows


def _ingest(tmp_path: Path, name: str, text: str, day: date = D):
    raw = tmp_path / "raw"
    (raw / name).parent.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(text)
    out = assemble_day([load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)], day)
    log = out.ingest_log.row(0, named=True)
    read, acc = log["rows_read"], log["rows_accepted"]
    assert read == acc + log["rows_quarantined"] + log["rows_duplicate"]
    return out, log


def _power_by_gpu(out) -> dict[str, set[float]]:
    s = out.gpu_samples.group_by("gpu_uuid").agg(pl.col("power_w").unique())
    return {u: set(p) for u, p in zip(s["gpu_uuid"], s["power_w"], strict=True)}


@pytest.mark.skipif(not TRACE.is_file(), reason="../shared/samples is not present")
def test_the_real_8xh100_trace_with_a_header_before_every_iteration_is_8_gpus(tmp_path):
    """r1: the trace as a shell loop writes it, its header before each 8 rows: 7 GPUs, 648 rows
    accepted, 1391 quarantined as conflicting duplicates and 1161 duplicates before."""
    lines = TRACE.read_text().splitlines()
    head, rows = lines[0], lines[1:]
    looped = []
    for i in range(0, len(rows), 8):
        looped += [head, *rows[i : i + 8]]
    out, log = _ingest(tmp_path / "a", "h100_watch_loop.csv", "\n".join(looped) + "\n")
    plain, plain_log = _ingest(tmp_path / "b", "h100.csv", TRACE.read_text())
    assert out.gpu_samples["gpu_uuid"].n_unique() == 8
    assert (log["rows_read"], log["rows_accepted"]) == (3200, 3200)
    assert (log["rows_quarantined"], log["rows_duplicate"]) == (0, 0)
    assert log["lines_skipped"] == 400  # the 400 headers
    # each GPU's series is the one the trace with a single header gives
    order = ["timestamp", "gpu_index"]
    cols = [*order, "power_w", "gpu_util_pct", "fb_used_mib"]
    assert (
        out.gpu_samples.sort(order).select(cols).equals(plain.gpu_samples.sort(order).select(cols))
    )
    assert plain_log["rows_accepted"] == 3200


def test_a_shell_loop_printing_its_header_every_iteration_keeps_each_gpu(tmp_path):
    """gen_loop.py repeat_header: 8 GPUs, a header before each iteration: 1 GPU before."""
    lines, t = [], datetime(2025, 7, 26, 10, tzinfo=UTC)
    for i in range(300):
        lines += [H1, *_iteration(t, 8)]
        t += timedelta(seconds=1, milliseconds=3 * (i % 5))
        if i % 97 == 96:
            t += timedelta(seconds=4)  # a stall: no new GPU
    out, log = _ingest(tmp_path, "loop.csv", "\n".join(lines) + "\n")
    assert _power_by_gpu(out) == {
        u: {100.25 + 50 * g} for g, u in enumerate(sorted(_power_by_gpu(out)))
    }
    assert len(_power_by_gpu(out)) == 8
    assert (log["rows_read"], log["rows_accepted"], log["lines_skipped"]) == (2400, 2400, 300)


def test_an_iteration_missing_a_gpu_under_repeated_headers_is_quarantined_not_guessed(tmp_path):
    """A call that listed 7 of the 8 GPUs: its rows' GPUs cannot be told; the others' can."""
    lines, t = [], datetime(2025, 7, 26, 10, tzinfo=UTC)
    for i in range(50):
        lines += [H1, *_iteration(t, 8, skip=3 if i == 20 else None)]
        t += timedelta(seconds=1)
    out, log = _ingest(tmp_path, "loop.csv", "\n".join(lines) + "\n")
    assert len(_power_by_gpu(out)) == 8
    assert all(len(p) == 1 for p in _power_by_gpu(out).values())
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (399, 392, 7)
    assert out.quarantine["reason"].str.contains("loop iteration").all()


def test_a_restart_with_another_field_order_stopped_after_one_iteration(tmp_path):
    """r2: a long 8-GPU loop log, then the logger restarted with another field order and
    stopped after one iteration: those 8 rows were all GPU 0 (7 of them a conflicting
    duplicate or a value filed on the wrong GPU)."""
    lines, t = [H1], datetime(2025, 7, 26, 10, tzinfo=UTC)
    for _ in range(300):
        lines += _iteration(t, 8)
        t += timedelta(seconds=1)
    t += timedelta(minutes=5)
    lines += [H2, *_iteration(t, 8, order=2)]
    out, log = _ingest(tmp_path, "loop_restart_short.csv", "\n".join(lines) + "\n")
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (2408, 2408, 0)
    gpus = _power_by_gpu(out)
    assert len(gpus) == 8 and all(len(p) == 1 for p in gpus.values())
    last = out.gpu_samples.filter(pl.col("timestamp") >= t).sort("timestamp")
    assert last["gpu_index"].to_list() == list(range(8))
    assert last["power_w"].to_list() == [100.25 + 50 * g for g in range(8)]


def test_the_short_last_piece_of_a_large_loop_log_continues_its_loop(tmp_path, monkeypatch):
    """r3: a loop log over the piece size whose last piece holds the last 3 rows of an
    iteration (GPUs 5, 6, 7): they were filed as GPU 0. Pieces shrunk to 64 KiB here."""
    lines, t = [H1], datetime(2025, 7, 26, 4, tzinfo=UTC)
    while sum(len(ln) + 1 for ln in lines) < 70_000:
        lines += _iteration(t, 8)
        t += timedelta(milliseconds=100)
    lines = lines[:-3]  # the last iteration ends at GPU 4 ...
    cut = sum(len(ln) + 1 for ln in lines)
    lines += _iteration(t, 8)[5:]  # ... at the piece's end; GPUs 5, 6, 7 past it
    monkeypatch.setattr(landing, "PIECE_BYTES", cut)
    out, log = _ingest(tmp_path, "h100_loop.csv", "\n".join(lines) + "\n")
    n = len(lines) - 1
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (n, n, 0)
    gpus = _power_by_gpu(out)
    assert len(gpus) == 8 and all(len(p) == 1 for p in gpus.values())
    tail = out.gpu_samples.filter(pl.col("timestamp") >= t).sort("timestamp")
    assert tail["gpu_index"].to_list() == [5, 6, 7]
    assert tail["power_w"].to_list() == [350.25, 400.25, 450.25]


def test_a_single_gpu_shell_loop_with_a_header_each_row_and_stalls_stays_one_gpu(tmp_path):
    """A guard: one GPU's row under each header, 1 s apart with stalls, in a file with another
    field order later: never more than one GPU."""
    lines, t = [], datetime(2025, 7, 26, 10, tzinfo=UTC)
    for i in range(200):
        lines += [H1 if i < 150 else H2, *_iteration(t, 1, order=1 if i < 150 else 2)]
        t += timedelta(seconds=1, milliseconds=i % 4)
        if i % 31 == 30:
            t += timedelta(seconds=3)
    out, log = _ingest(tmp_path, "one.csv", "\n".join(lines) + "\n")
    assert out.gpu_samples["gpu_uuid"].n_unique() == 1
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (200, 200, 0)
