"""Adversarial review 25, landing zone.

- A file rejected whole while it is read in pieces (a gzip cut short, UTF-16 over a piece) is
  quarantined on the days its readable text names, with the head of that text: it was filed
  on its modification day with no text.
- Lines above a file's content that no format reads (a logger's banner or comment, the status
  line and headers `curl -i` writes) are records of their own, quarantined, and the rest is
  read as what it is: the whole file was one record, with a wrong reason ("nvidia-smi dmon
  output without dates" for `# gpu logger v1.2 started on node-7`).
- A row whose time does not parse is filed on the day its text names, not the file's first day.
"""

from __future__ import annotations

import gzip
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from helpers import assemble_day, landed

from gpu_pipeline.lib.ingest import landing
from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing, parse_landing_file

D, D2 = date(2025, 7, 26), date(2025, 7, 27)
MTIME = datetime(2025, 8, 15, 12, tzinfo=UTC).timestamp()  # copied into the zone on 08-15
HEADER = "timestamp, uuid, index, name, utilization.gpu [%], power.draw [W]"
JUNK = "a line above the file's {} content that no format reads"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def log_rows(gpus: int, seconds: int, start: datetime) -> list[str]:
    """nvidia-smi --query-gpu=timestamp,uuid,index,name,utilization.gpu,power.draw -l 1 rows."""
    out = []
    for s in range(seconds):
        for g in range(gpus):
            t = start + timedelta(seconds=s, milliseconds=g)
            out.append(
                f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}, "
                f"GPU-{g:08x}-1111-2222-3333-444444444444, {g}, NVIDIA H100 80GB HBM3, "
                f"{(s + g) % 100} %, {100 + g + s % 300}.50 W"
            )
    return out


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    return landed(tmp_path, name, data, MTIME)


def _ingest(tmp_path: Path, day: date):
    parsed = [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")]
    return parsed, assemble_day(parsed, day)


def _lines(tmp_path: Path) -> list[int]:
    """The file lines of the (one) landing file's samples, as its parse numbers them."""
    (lf,) = list_landing(tmp_path / "raw")
    return sorted(parse_landing_file(lf)[1].samples["line"].unique())


def _log(day) -> dict:
    (log,) = day.ingest_log.to_dicts()
    assert log["rows_read"] == (
        log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    )
    return log


# --- files rejected whole while read in pieces: on the days their text names -----------------


def test_a_gzip_cut_short_is_quarantined_on_the_days_its_text_names(tmp_path):
    text = "\n".join([HEADER, *log_rows(8, 3600, datetime(2025, 7, 26, 23, 30))]) + "\n"
    packed = gzip.compress(text.encode())
    _write(tmp_path, "gpus_log.csv.gz", packed[: len(packed) * 6 // 10])
    parsed, day = _ingest(tmp_path, D)
    (pf,) = parsed
    assert pf.rejected_whole and pf.record_days() == [D, D2]  # not 2025-08-15
    (q,) = day.quarantine.to_dicts()
    assert q["reason"].startswith("corrupt or truncated gzip")
    assert q["raw"] == text[: landing.RAW_CHARS]  # the head of the readable text
    log = _log(day)
    assert (log["rows_read"], log["rows_quarantined"], log["format"]) == (1, 1, "unreadable")
    _, day2 = _ingest(tmp_path, D2)
    assert day2.quarantine["raw"].to_list() == [text[: landing.RAW_CHARS]]
    assert _log(day2)["rows_read"] == 1


def test_utf16_over_a_piece_is_quarantined_on_the_days_its_text_names(tmp_path, monkeypatch):
    monkeypatch.setattr(landing, "PIECE_BYTES", 64 * 2**10)
    text = "\n".join([HEADER, *log_rows(8, 1200, datetime(2025, 7, 26, 23, 50))]) + "\n"
    _write(tmp_path, "win_log_utf16.csv", text.encode("utf-16"))
    parsed, day = _ingest(tmp_path, D)
    (pf,) = parsed
    assert pf.rejected_whole and pf.record_days() == [D, D2]
    (q,) = day.quarantine.to_dicts()
    assert q["reason"].startswith("UTF-16 text over 65,536 bytes")
    assert q["raw"] == text[: landing.RAW_CHARS]  # the text, not the repr of its bytes
    assert (_log(day)["rows_read"], _log(day)["rows_quarantined"]) == (1, 1)


def test_what_a_rejection_keeps_of_the_text_read_is_bounded():
    """The first NAMED_SCAN_CHARS bytes and about the last NAMED_SCAN_CHARS: not the file."""
    seen = landing._Seen()
    chunk = b"x" * 2**20
    for _ in range(40):
        seen.add(chunk)
    assert len(seen.head) == landing.NAMED_SCAN_CHARS
    assert landing.NAMED_SCAN_CHARS <= seen.kept <= landing.NAMED_SCAN_CHARS + 2**20
    seen.add(b"\n2025/07/27 10:00:00.000, GPU-1\n")
    out = seen.whole("cut short")
    assert out.records_by_day == {D2: 1} and out.quarantine["raw"][0] == "x" * landing.RAW_CHARS


# --- lines above the content that no format reads -------------------------------------------


def test_a_comment_line_above_a_csv_log_is_one_quarantined_record(tmp_path):
    rows = log_rows(8, 3600, datetime(2025, 7, 26))
    banner = "# gpu logger v1.2 started on node-7"
    _write(tmp_path, "commented.csv", "\n".join([banner, HEADER, *rows, ""]).encode())
    parsed, day = _ingest(tmp_path, D)
    assert parsed[0].format == "nvidia_smi_csv" and not parsed[0].rejected_whole
    assert day.gpu_samples.height == 28_800  # a row per GPU and time
    (q,) = day.quarantine.to_dicts()
    assert (q["line"], q["raw"]) == (1, banner)
    assert q["reason"].startswith(JUNK.format("nvidia_smi_csv"))
    log = _log(day)
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (28_801, 28_800, 1)
    assert (log["lines_skipped"], log["file_lines"]) == (1, 28_802)  # the header line
    assert _lines(tmp_path) == list(range(3, 28_803))  # numbered in the file


def test_a_banner_and_a_blank_line_above_a_csv_log(tmp_path):
    rows = log_rows(2, 60, datetime(2025, 7, 26, 12))
    text = "\n".join(["Starting GPU monitoring...", "", HEADER, *rows, ""])
    _write(tmp_path, "banner.csv", text.encode())
    _, day = _ingest(tmp_path, D)
    assert day.quarantine.select("line", "raw").rows() == [(1, "Starting GPU monitoring...")]
    log = _log(day)
    assert (log["format"], log["rows_read"], log["rows_accepted"]) == ("nvidia_smi_csv", 121, 120)
    assert (log["lines_skipped"], log["file_lines"]) == (2, 123)  # the blank line, the header


def test_a_json_answer_saved_with_curl_i(tmp_path):
    """The status line and headers are records 1 and 2; the answer's records follow them."""
    t = datetime(2025, 7, 26, 10, tzinfo=UTC).timestamp()
    results = ",".join(
        f'{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-{g}","gpu":"{g}",'
        f'"Hostname":"n1"}},"value":[{t},"{40 + g}"]}}'
        for g in range(4)
    )
    body = f'{{"status":"success","data":{{"resultType":"vector","result":[{results}]}}}}\n'
    head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
    _write(tmp_path, "util_curl_i.json", (head + body).encode())
    parsed, day = _ingest(tmp_path, D)
    assert parsed[0].format == "prometheus_json"
    assert sorted(day.gpu_samples["gpu_util_pct"]) == [40.0, 41.0, 42.0, 43.0]
    assert day.quarantine.select("line", "raw").rows() == [
        (1, "HTTP/1.1 200 OK"),
        (2, "Content-Type: application/json"),
    ]
    assert set(day.quarantine["reason"]) == {
        JUNK.format("prometheus_json") + landing.JUNK_WHY.split("reads", 1)[1]
    }
    assert _lines(tmp_path) == [3, 4, 5, 6]
    log = _log(day)
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (6, 4, 2)


def test_lines_above_a_log_read_in_pieces(tmp_path, monkeypatch):
    """Later pieces are read with the header below the banner, lines numbered in the file."""
    monkeypatch.setattr(landing, "PIECE_BYTES", 64 * 2**10)
    rows = log_rows(8, 600, datetime(2025, 7, 26, 8))
    _write(tmp_path, "big.csv", "\n".join(["# logger started", HEADER, *rows, ""]).encode())
    parsed, day = _ingest(tmp_path, D)
    assert parsed[0].format == "nvidia_smi_csv" and not parsed[0].rejected_whole
    assert day.quarantine.select("line", "raw").rows() == [(1, "# logger started")]
    log = _log(day)
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (4801, 4800, 1)
    assert (log["lines_skipped"], log["file_lines"]) == (1, 4802)
    assert _lines(tmp_path) == list(range(3, 4803))


def test_a_dmon_log_without_dates_below_a_banner_is_still_refused_whole(tmp_path):
    dmon = (
        "monitoring started\n"
        "# gpu    pwr  gtemp  mtemp     sm    mem\n"
        "# Idx      W      C      C      %      %\n"
        + "    0    109     53      -     10      2\n"
        * 20
    )
    fmt, out = parse_landing_file(
        landing.LandingFile(
            _write(tmp_path, "d.txt", dmon.encode()), "d.txt", "0" * 64, len(dmon), MTIME
        )
    )
    assert fmt == "unknown" and out.rejected_whole and out.lines_total == 1
    assert out.quarantine["reason"][0].startswith("nvidia-smi dmon output without dates")


def test_text_that_is_no_format_stays_one_record_and_the_lines_tried_are_bounded(tmp_path):
    prose = "".join(f"line {i} of a note\n" for i in range(20))  # JUNK_LINES
    csv = "\n".join([HEADER, *log_rows(1, 5, datetime(2025, 7, 26))]) + "\n"
    for name, text in (("note.txt", prose * 3), ("late.csv", prose + "one more\n" + csv)):
        p = _write(tmp_path, name, text.encode())
        lf = landing.LandingFile(p, name, "0" * 64, len(text), MTIME)
        fmt, out = parse_landing_file(lf)
        assert fmt == "unknown" and out.rejected_whole and out.lines_total == 1, name


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="../shared/samples is not present")
@pytest.mark.parametrize(
    "sample",
    sorted(p.name for p in SAMPLES.glob("*") if p.suffix in (".prom", ".json", ".xml", ".csv")),
)
def test_a_real_export_below_a_banner_is_read_as_without_it(tmp_path, sample):
    data = (SAMPLES / sample).read_bytes()
    plain = _write(tmp_path, sample, data)
    fmt, out = parse_landing_file(landing.LandingFile(plain, sample, "", len(data), MTIME))
    banner = b"=== collected by ops script v3 on node-7 ===\n"
    p = _write(tmp_path, "b_" + sample, banner + data)
    fmt_b, out_b = parse_landing_file(landing.LandingFile(p, sample, "", 0, MTIME))  # same name
    assert fmt_b == fmt and not out_b.rejected_whole
    assert out_b.samples.drop("line").equals(out.samples.drop("line"))
    assert out_b.quarantine.height == out.quarantine.height + 1
    assert out_b.quarantine.filter(pl.col("line") == 1)["raw"].to_list() == [banner.decode()[:-1]]
    assert out_b.lines_total == out.lines_total + 1


# --- a row whose time does not parse: on the day it names ----------------------------------


def test_a_row_with_an_impossible_time_is_filed_on_the_day_it_names(tmp_path):
    rows = log_rows(2, 120, datetime(2025, 7, 26, 23, 59))
    at = 200  # a row of 07-27 00:00:40
    assert rows[at].startswith("2025/07/27 00:00:40")
    rows[at] = "2025/07/27 25:61:00.000" + rows[at][23:]
    _write(tmp_path, "two_days.csv", "\n".join([HEADER, *rows, ""]).encode())
    _, day1 = _ingest(tmp_path, D)
    parsed, day2 = _ingest(tmp_path, D2)
    assert day1.quarantine.height == 0
    assert set(day2.quarantine["line"]) == {at + 2}
    assert set(day2.quarantine["timestamp"].dt.date()) == {D2}
    assert set(day2.quarantine["reason"]) == {"timestamp not understood: '2025/07/27 25:61:00.000'"}
    assert parsed[0].records_by_day == {D: 120, D2: 120}
    log1, log2 = _log(day1), _log(day2)
    assert (log1["rows_read"], log1["rows_accepted"]) == (120, 120)
    assert (log2["rows_read"], log2["rows_accepted"], log2["rows_quarantined"]) == (120, 119, 1)
