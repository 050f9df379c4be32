"""Prometheus API answers one after another (JSON Lines) whose last one is cut short: the whole
answers are read and the cut tail is one quarantined record with its reason, so the file's
ledger adds up (rows_read = accepted + quarantined + duplicate). It was refused whole ("after 8
whole answers: truncated"), its 16 good samples with it."""

import json
from datetime import UTC, date, datetime

import polars as pl
from helpers import api_answer, assemble_day

from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import LandingFile, list_landing, parse_landing_file

D = date(2024, 1, 1)
T = datetime(2024, 1, 1, 10, tzinfo=UTC).timestamp()
CUT_WHY = (
    "not valid JSON at line 9 column 46 (Unterminated string starting at) after 8 whole "
    "answers: the last answer cut short (the writer stopped while writing it), or text that is "
    "not an answer; not read"
)


ANSWERS = [api_answer(T + 15 * k) for k in range(8)]
LINES = "".join(json.dumps(a) + "\n" for a in ANSWERS)
TAIL = json.dumps(ANSWERS[0])[:50]  # the ninth answer, cut after 50 characters


def _parse(tmp_path, name: str, text: str):
    p = tmp_path / "raw" / "c1" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return parse_landing_file(LandingFile(p, f"c1/{name}", "0" * 64, p.stat().st_size, T))


def _expected_samples() -> list[tuple]:
    return sorted(
        (datetime.fromtimestamp(T + 15 * k, UTC), f"gpu-{g}", 40.0 + g)
        for k in range(8)
        for g in (0, 1)
    )


def test_whole_answers_before_a_cut_last_one_are_kept_and_the_tail_quarantined(tmp_path):
    fmt, out = _parse(tmp_path, "cut_2024-01-01.jsonl", LINES + TAIL)
    assert fmt == "prometheus_json" and not out.rejected_whole
    assert out.lines_total == 17 and out.lines_skipped == 0
    got = out.samples.select("timestamp", pl.col("gpu_uuid").str.to_lowercase(), "value").rows()
    assert sorted(got) == _expected_samples()
    assert out.quarantine.select("line", "reason", "raw", "record_kept").to_dicts() == [
        {"line": 17, "reason": CUT_WHY, "raw": TAIL, "record_kept": False}
    ]

    # the ingest step's ledger and quarantine of the day: every record in exactly one place
    parsed = [load_or_parse(f, tmp_path / "cache") for f in list_landing(tmp_path / "raw")]
    day = assemble_day(parsed, D)
    (log,) = day.ingest_log.to_dicts()
    assert (log["format"], log["source_file"]) == ("prometheus_json", "c1/cut_2024-01-01.jsonl")
    assert (log["rows_read"], log["rows_accepted"], log["rows_quarantined"]) == (17, 16, 1)
    assert log["rows_duplicate"] == 0
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    )
    assert day.gpu_samples.height == 16
    (q,) = day.quarantine.to_dicts()
    assert (q["source_file"], q["line"], q["reason"], q["raw"]) == (
        "c1/cut_2024-01-01.jsonl",
        17,
        CUT_WHY,
        TAIL,
    )


def test_text_after_the_last_answer_is_one_quarantined_record(tmp_path):
    """A line that is not JSON at the end (a `curl` error appended to the dump) is the tail."""
    msg = "curl: (18) transfer closed with 1234 bytes remaining to read\n"
    _, out = _parse(tmp_path, "tail.jsonl", LINES + msg)
    assert out.samples.height == 16 and out.lines_total == 17
    (q,) = out.quarantine.to_dicts()
    assert q["line"] == 17 and q["raw"] == msg
    assert q["reason"].startswith("not valid JSON at line 9 column 1 (Expecting value) after 8")


def test_one_whole_answer_then_a_cut_one(tmp_path):
    _, out = _parse(tmp_path, "one.jsonl", json.dumps(ANSWERS[0]) + "\n" + TAIL)
    assert sorted(out.samples["value"]) == [40.0, 41.0] and out.lines_total == 3
    assert out.quarantine.select("line", "raw").rows() == [(3, TAIL)]


def test_an_answer_damaged_between_whole_ones_still_refuses_the_file_whole(tmp_path):
    """Only the last answer is taken for cut short: damage with whole answers after it is not
    a tail (those answers would be in no table), so the file is refused whole, as before."""
    text = "".join(json.dumps(a) + "\n" for a in ANSWERS[:4]) + TAIL + "\n"
    text += "".join(json.dumps(a) + "\n" for a in ANSWERS[4:])
    _, out = _parse(tmp_path, "middle.jsonl", text)
    assert out.rejected_whole and out.samples.height == 0
    assert "after 4 whole answers: truncated or not an API response" in out.quarantine["reason"][0]


def test_a_single_answer_cut_short_is_still_refused_whole(tmp_path):
    """Nothing whole to keep: the file is refused whole with the parser's reason."""
    _, out = _parse(tmp_path, "single.json", json.dumps(ANSWERS[0])[:80])
    assert out.rejected_whole and out.samples.height == 0
    assert "truncated or not an API response" in out.quarantine["reason"][0]


def test_the_days_are_those_of_the_whole_answers(tmp_path):
    """The cut record has no time of its own: it is filed on the file's day, not a new one."""
    late = [api_answer(T + 86400 - 36000 - 5 + k) for k in range(2)]  # 23:59:55, 23:59:56
    text = "".join(json.dumps(a) + "\n" for a in late) + TAIL
    _, out = _parse(tmp_path, "late_2024-01-01.jsonl", text)
    assert out.samples["timestamp"].dt.date().unique().to_list() == [D]
    assert out.samples["timestamp"].max() == datetime(2024, 1, 1, 23, 59, 56, tzinfo=UTC)
    # the four points on their day; the cut record on none of its own (the file's home day)
    assert out.records_by_day == {D: 4, None: 1}
