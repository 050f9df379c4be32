"""A Prometheus API answer over a piece (64 MiB: a day of one DCGM field for ~1,000 GPUs at a
15 s step) is read a run of whole series at a time, each run framed as an answer of its own:
it was one quarantined record ("document over 67,108,864 bytes: not read"), its samples lost.

The pieces give what the answer parsed whole gives (samples, quarantine with its reasons'
series numbers, counts, sha256), for compact, spaced and indented JSON, an array of answers,
JSON Lines of answers and gzip; an answer cut short is still refused whole, and JSON that
cannot be cut between series is refused with the reason it had.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
from helpers import assemble_day, landed

from gpu_pipeline.lib.ingest import landing
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.formats import prom_json
from gpu_pipeline.lib.ingest.landing import PieceParse, list_landing, merge_pieces

D = date(2025, 7, 26)
T0 = int(datetime(2025, 7, 26, tzinfo=UTC).timestamp())
MTIME = datetime(2025, 8, 15, 12, tzinfo=UTC).timestamp()


def answer(gpus: int, points: int = 30, t0: int = T0, bad: bool = True) -> dict:
    """A query_range answer of DCGM_FI_DEV_GPU_UTIL: one series a GPU, a point a minute; with
    `bad`, one point of the third series from the end not a [time, "value"] pair and one NaN."""
    result = []
    for i in range(gpus):
        values = [[t0 + 60 * k, str((7 * i + k) % 100)] for k in range(points)]
        if bad and i == gpus - 3:
            values[2] = [t0 + 120, "oops", 3]
            values[4] = [t0 + 240, "NaN"]
        labels = {
            "__name__": "DCGM_FI_DEV_GPU_UTIL",
            "UUID": f"GPU-{i:08d}-0000-0000-0000-000000000000",
            "Hostname": f"node-{i // 8}",
            "modelName": "NVIDIA A100-SXM4-80GB",
            "metric": "a label named metric",
        }
        result.append({"metric": labels, "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    return landed(tmp_path, name, data, MTIME)


def _in_pieces(path: Path, piece_bytes: int) -> tuple[PieceParse, PieceParse, list]:
    (lf,) = list_landing(path.parent)
    whole = PieceParse(lf, piece_bytes=1 << 30)
    pp = PieceParse(lf, piece_bytes=piece_bytes)
    return whole, pp, [list(whole), list(pp)]


SHAPES = {
    "compact.json": lambda: json.dumps(answer(60), separators=(",", ":")).encode(),
    "spaced.json": lambda: json.dumps(answer(60)).encode(),
    "indented.json": lambda: json.dumps(answer(60), indent=2).encode(),
    "array.json": lambda: json.dumps([answer(30), answer(30, t0=T0 + 3600)]).encode(),
    "lines.jsonl": lambda: (
        json.dumps(answer(30)) + "\n" + json.dumps(answer(30, t0=T0 + 3600)) + "\n"
    ).encode(),
    "packed.json.gz": lambda: gzip.compress(json.dumps(answer(60)).encode()),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_an_answer_read_in_runs_of_series_is_the_answer_read_whole(tmp_path, name):
    path = _write(tmp_path, name, SHAPES[name]())
    whole, pp, ((one,), parts) = _in_pieces(path, 8192)
    assert whole.rejected is None and pp.rejected is None
    assert pp.series_cuts >= 4 and len(parts) == pp.series_cuts + 1
    fmt, merged = merge_pieces(parts)
    assert fmt == one[0] == "prometheus_json"
    a, b = one[1], merged
    order = ["line", "column"]
    assert a.samples.height == b.samples.height > 1700
    assert a.samples.sort(order).equals(b.samples.sort(order))
    assert a.quarantine.sort("line").equals(b.quarantine.sort("line"))
    # the series numbers in the reasons are the answer's, not a run's
    assert any(r.startswith("data.result[57].values[2]") for r in b.quarantine["reason"])
    assert (a.lines_total, a.lines_skipped, a.records_by_day) == (
        b.lines_total,
        b.lines_skipped,
        b.records_by_day,
    )
    assert pp.sha256 == whole.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_answer_cut_short_is_still_refused_whole(tmp_path):
    text = json.dumps(answer(60)).encode()
    path = _write(tmp_path, "cut.json", text[: len(text) * 9 // 10])
    _, pp, ((one,), _) = _in_pieces(path, 8192)
    assert pp.series_cuts >= 4
    for fmt, out in (one, pp.rejected):
        assert fmt == "prometheus_json" and out.rejected_whole
        assert "not valid JSON" in out.quarantine["reason"][0]


def test_json_that_cannot_be_cut_between_series_keeps_its_reason(tmp_path):
    """One series larger than a piece, and JSON that is not an answer: as before."""
    one = json.dumps(answer(1, points=2000, bad=False)).encode()
    other = json.dumps({"rows": [{"metric": "x", "v": i} for i in range(3000)]}).encode()
    for name, data in (("one_series.json", one), ("not_an_answer.json", other)):
        path = _write(tmp_path / name, name, data)
        _, pp, _ = _in_pieces(path, 8192)
        fmt, out = pp.rejected
        assert pp.series_cuts == 0 and out.rejected_whole
        assert "over 8,192 bytes: not read" in out.quarantine["reason"][0], name


def test_series_cuts_only_between_series():
    text = json.dumps(answer(5, points=3, bad=False), indent=1).encode()
    starts = [m.start() for m in prom_json._SERIES_START.finditer(text)]
    assert len(starts) == 5
    cut = prom_json.series_cut(text, len(text))
    assert cut and text[:cut].rstrip().endswith(b"}") and cut < starts[-1]
    assert text[cut:].lstrip()[:1] == b","
    # a quoted `"metric"` in a label's value, or a label named metric, is no place to cut
    assert prom_json.series_cut(b'[{"metric":{"a":"{\\"metric\\": {"}}]', 40) == 0
    assert prom_json.series_cut(b'{"metric":{"metric":"x"}}', 25) == 0
    prefix, close = prom_json.frame(text)
    assert json.loads(prefix + text[starts[0] : cut] + close)["data"]["result"][0]["values"]
    assert close == b"]}}" and prom_json.frame(b'{"a": "[{\\"metric\\": {"}') is None


def test_a_day_of_a_large_answer_reaches_the_day(tmp_path, monkeypatch):
    """Through the cache and the day's assembly, a piece of 256 KiB: every point a sample of
    its GPU, the bad point quarantined, the ledger's counts conserved."""
    monkeypatch.setattr(landing, "PIECE_BYTES", 256 * 2**10)
    data = json.dumps(answer(64, points=1440)).encode()
    assert len(data) > 4 * landing.PIECE_BYTES
    _write(tmp_path, "vm_export.json", data)
    parsed = [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")]
    day = assemble_day(parsed, D)
    (log,) = day.ingest_log.to_dicts()
    assert log["format"] == "prometheus_json"
    assert log["rows_read"] == 64 * 1440
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    )
    assert log["rows_quarantined"] == 1  # the bad point; the NaN is a point without a value
    samples = day.gpu_samples
    assert samples["gpu_uuid"].n_unique() == 64
    assert samples.filter(pl.col("gpu_util_pct").is_not_null()).height == 64 * 1440 - 2
