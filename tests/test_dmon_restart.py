"""`nvidia-smi dmon -o DT` restarted with other `-s` groups: the header that follows names other
columns, and its rows are read with it (as the --query-gpu CSV reader reads the rows below a
header written again). Every row was read with the file's first header: at 08:05 the `sm` 97 %
became a power of 97 W and 70211 MB of framebuffer an impossible decoder utilization; with
another number of columns, each row was quarantined as "expected 14 comma-separated fields"
(adversarial review). A header repeated with the same columns (every screenful) is skipped."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
from helpers import assembled_day

from gpu_pipeline.lib.ingest.landing import (
    PieceParse,
    list_landing,
    merge_pieces,
    parse_landing_file,
)

D = date(2024, 6, 10)
HEAD_A = [
    "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa",
    "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %",
]
HEAD_B = [
    "#Date       Time        gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm",
    "#YYYYMMDD   HH:MM:SS    Idx      %      %      %      %      %      %     MB     MB     MB",
]
REPRO = [
    *HEAD_A,
    " 20240610   08:00:00      0    309     63      -     95     40      0      0      0      0",
    " 20240610   08:00:01      0    308     63      -     96     41      0      0      0      0",
    *HEAD_B,
    " 20240610   08:05:00      0     97     42      0      0      0      0  70211      5      0",
    " 20240610   08:05:01      0     98     42      0      0      0      0  70211      5      0",
]
# a logger restarted with -s pucm: 14 columns, then -s u: 7
HEAD_WIDE = [
    "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa"
    "   mclk   pclk",
    "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %"
    "    MHz    MHz",
]
HEAD_NARROW = [
    "#Date       Time        gpu     sm    mem    enc    dec",
    "#YYYYMMDD   HH:MM:SS    Idx      %      %      %      %",
]


def _landed(tmp_path: Path, lines: list[str]) -> Path:
    raw = tmp_path / "raw"
    (raw / "h1").mkdir(parents=True)
    (raw / "h1" / "dmon.txt").write_text("\n".join(lines) + "\n")
    return raw


def _parse(tmp_path: Path, lines: list[str]):
    return parse_landing_file(list_landing(_landed(tmp_path, lines))[0])


def _values(out, column: str) -> dict[datetime, float]:
    s = out.samples.filter(pl.col("column") == column)
    return dict(zip(s["timestamp"], s["value"], strict=True))


def _at(minute: int, second: int) -> datetime:
    return datetime(2024, 6, 10, 8, minute, second, tzinfo=UTC)


def test_rows_below_a_header_with_other_columns_are_read_with_it(tmp_path):
    fmt, out = _parse(tmp_path, REPRO)
    assert fmt == "nvidia_smi_dmon"
    assert out.quarantine.height == 0, out.quarantine["reason"].to_list()
    # `sm` is dmon's utilization (as utilization.gpu)
    assert _values(out, "gpu_util_pct") == {
        _at(0, 0): 95.0,
        _at(0, 1): 96.0,
        _at(5, 0): 97.0,
        _at(5, 1): 98.0,
    }
    assert _values(out, "power_w") == {_at(0, 0): 309.0, _at(0, 1): 308.0}  # none at 08:05
    assert _values(out, "dec_util_pct") == {
        t: 0.0 for t in (_at(0, 0), _at(0, 1), _at(5, 0), _at(5, 1))
    }
    assert _values(out, "fb_used_mib") == {_at(5, 0): 70211.0, _at(5, 1): 70211.0}
    assert set(out.samples["gpu_index"]) == {0}
    assert out.lines_total == 8 and out.lines_skipped == 4
    assert sum(out.records_by_day.values()) == 4
    assert set(out.columns_ignored) == {"jpg", "ofa", "bar1", "ccpm"}
    assert "fb_used_mib" in out.fields and "power_w" in out.fields


def test_a_header_with_another_number_of_columns_reads_its_rows(tmp_path):
    lines = [
        *HEAD_WIDE,
        " 20240610   08:00:00      0    309     63      -     95     40      0      0      0      0"
        "   1593   1980",
        *HEAD_NARROW,
        " 20240610   08:05:00      0     97     42      0      0",
        " 20240610   08:05:01      1     12      3      0      0",
    ]
    _, out = _parse(tmp_path, lines)
    assert out.quarantine.height == 0, out.quarantine["reason"].to_list()
    assert _values(out, "gpu_util_pct") == {_at(0, 0): 95.0, _at(5, 0): 97.0, _at(5, 1): 12.0}
    assert _values(out, "sm_clock_mhz") == {_at(0, 0): 1980.0}
    assert _values(out, "power_w") == {_at(0, 0): 309.0}
    assert sorted(set(out.samples["gpu_index"])) == [0, 1]
    assert sum(out.records_by_day.values()) == 3 and out.lines_skipped == 4


def test_a_short_row_is_quarantined_as_whitespace_separated(tmp_path):
    _, out = _parse(tmp_path, [*HEAD_NARROW, " 20240610   08:05:00      0     97     42"])
    assert out.quarantine.height == 1
    assert out.quarantine["reason"][0] == "expected 7 whitespace-separated fields, found 5"


def test_the_same_header_written_again_is_still_skipped(tmp_path):
    rows = [
        f" 20240610   08:00:{s:02d}      0    {300 + s}     63      -     {s}     40      0      0"
        "      0      0"
        for s in range(6)
    ]
    lines = [*HEAD_A, *rows[:3], *HEAD_A, *rows[3:]]
    _, out = _parse(tmp_path, lines)
    assert out.quarantine.height == 0
    assert out.lines_total == 10 and out.lines_skipped == 4
    assert _values(out, "power_w") == {_at(0, s): 300.0 + s for s in range(6)}
    assert _values(out, "gpu_util_pct") == {_at(0, s): float(s) for s in range(6)}
    assert set(out.columns_ignored) == {"jpg", "ofa"}


def test_the_ledger_counts_every_row_once(tmp_path):
    out = assembled_day(_landed(tmp_path, REPRO), tmp_path / "cache", D)
    log = out.ingest_log
    row = log.select("rows_read", "rows_accepted", "rows_quarantined", "rows_duplicate").row(0)
    assert row == (4, 4, 0, 0)
    assert out.quarantine.height == 0


def test_a_file_read_in_pieces_reads_each_block_with_its_header(tmp_path):
    """A large file is parsed in pieces: the rows at the top of a later piece belong to the
    header the piece before ended under."""
    rows_a = [
        f" 20240610   08:00:{s:02d}      0    {300 + s}     63      -     {s}     40      0      0"
        "      0      0"
        for s in range(30)
    ]
    rows_b = [
        f" 20240610   08:05:{s:02d}      0     {40 + s}     42      0      0      0      0  70211"
        "      5      0"
        for s in range(60)
    ]
    lines = [*HEAD_A, *rows_a[:20], *HEAD_A, *rows_a[20:], *HEAD_B, *rows_b]
    lf = list_landing(_landed(tmp_path, lines))[0]
    _, whole = parse_landing_file(lf)
    pp = PieceParse(lf, piece_bytes=1024)
    parts = list(pp)
    assert pp.rejected is None, pp.rejected[1].quarantine["reason"].to_list()
    assert len(parts) > 3
    _, out = merge_pieces(parts)
    for o in (whole, out):
        assert o.quarantine.height == 0, o.quarantine["reason"].to_list()
        assert _values(o, "power_w") == {_at(0, s): 300.0 + s for s in range(30)}
        assert _values(o, "gpu_util_pct") == {
            **{_at(0, s): float(s) for s in range(30)},
            **{_at(5, s): 40.0 + s for s in range(60)},
        }
        assert o.lines_total == len(lines) and o.lines_skipped == 6
        assert sum(o.records_by_day.values()) == 90
    assert out.samples.sort("line", "column").equals(whole.samples.sort("line", "column"))


def test_a_pmon_block_in_a_dmon_log_leaves_the_dmon_rows_read(tmp_path):
    """`nvidia-smi pmon -o DT` written into the same log after dmon: its rows are processes,
    each quarantined as one record; the dmon rows above it are read (the first version of the
    block reader refused the whole log for it, review of the dmon fix)."""
    pmon = [
        "# Date       Time        gpu         pid   type     sm    mem    command",
        "# YYYYMMDD   HH:MM:SS    Idx           #    C/G      %      %    name",
        " 20240610   08:10:00      0      12345     C     45     10    python",
        " 20240610   08:10:00      0      12346     C     30      5    python",
    ]
    _, out = _parse(tmp_path, REPRO[:4] + pmon)
    assert not out.rejected_whole
    assert _values(out, "power_w") == {_at(0, 0): 309.0, _at(0, 1): 308.0}
    assert _values(out, "gpu_util_pct") == {_at(0, 0): 95.0, _at(0, 1): 96.0}
    q = out.quarantine.sort("line")
    assert q["line"].to_list() == [7, 8]
    assert set(q["reason"]) == {
        "a row of nvidia-smi pmon (a process's share, not the GPU's) in a dmon log: not read"
    }
    assert "pid" not in out.columns_ignored
