"""The native exposition tokenizer (gpu_pipeline/native) against the Polars CSV pass it stands in
for: line for line the same series, flags, values and timestamps, on text written every way the
format allows and some it does not, on one thread or several."""

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from gpu_pipeline import native
from gpu_pipeline.lib.ingest.formats import exposition as ex
from gpu_pipeline.lib.ingest.formats.common import Context

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))

VALUES = [
    "28", "1.5", "+5", "-0", "-0.0", "1e3", "1E-3", "1.e5", "1e+3", "1e0003", "1e00003", ".5",
    "-.5", "+.5", "5.", "00012", "0.000000000000000000000000001", "9007199254740993", "1e22",
    "1e23", "123456789012345678", "1234567890123456789", "12345678901234567890", "4.9e-324",
    "1.7976931348623157e308", "1e400", "NaN", "nan", "nAn", "-NaN", "+nan", "+Inf", "-Inf", "Inf",
    "inf", "INF", "Infinity", "-infinity", "0x10", "1_000", "1e", "1e+", ".", "+", "-", ".e1",
    "1..2", "e5", "3.14159", "0.1", "0.30000000000000004", "99.99", "-273.15",
]  # fmt: skip
TIMESTAMPS = [
    "1704103200000", "+5", "-0", "007", "123456789012345678", "1234567890123456789",
    "99999999999999999999", "1704103200.5", "1e12", "x", "",
]  # fmt: skip
SHAPES = [
    b"",  # a blank line
    b"\r",
    b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
    b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    b"   ",
    b"\t# indented comment",
    b"} 5",
    b"}}",
    b"no_labels 5",
    b"no_labels 5 1704103200000",
    b'm{a="x}y"} 7 1704103200000',  # a brace in a label value: cut there, like the CSV pass
    b'm{a="b"}',
    b'm{a="b"} ',
    b'm{a="b"}  7',
    b'm{a="b"}\t7',
    b'm{a="b"}7',
    b'm{a="b"} 7 1704103200000 extra',
    b'm{a="b"} 7 1704103200000 # {trace_id="t"} 1.0',
    b'm{a="b"} 7 1704103200000\r',
    b'm{a="b\\"c"} 8',
    b'm{a="b",c="d"} 9 1704103200000',
    b'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",modelName="NVIDIA A100 80GB"} 245.5 1704103200000',
]


def _lines() -> bytes:
    # the first line is an ordinary one: a first line with two braces makes Polars' CSV reader
    # refuse the whole file (the parse then reads it line by line), which is no comparison
    rows = [b'm{a="first"} 1 1704103200000']
    rows += [f'v{{k="{i}"}} {v} 1704103200000'.encode() for i, v in enumerate(VALUES)]
    rows += [f'v{{k="{i % 3}"}} {v}'.encode() for i, v in enumerate(VALUES)]
    rows += [f't{{k="{i}"}} 1 {t}'.encode() for i, t in enumerate(TIMESTAMPS)]
    rows += SHAPES
    return b"\n".join(rows * 3)


def _decoded(scanned: tuple[pl.DataFrame, pl.Series]) -> pl.DataFrame:
    """The scan with each line's series as text (codes are numbered differently by each)."""
    d, distinct = scanned
    series = distinct.gather(d.get_column("_code").fill_null(0))
    return d.with_columns(
        pl.when(pl.col("_code").is_not_null()).then(series).alias("_code"),
        # the CSV pass leaves `_lead` null where a line has no rest; both read null as False
        pl.col("_lead").fill_null(False),
    ).drop("_no_series")  # compared on its own: only the native scan tells blank lines


def _empty_lines(data: bytes) -> list[int]:
    """The numbers of the lines that are empty (a CR alone included)."""
    lines = data[:-1].split(b"\n") if data.endswith(b"\n") else data.split(b"\n")
    return [i for i, x in enumerate(lines, 1) if x in (b"", b"\r")]


def _both(source, monkeypatch) -> tuple[pl.DataFrame, pl.DataFrame]:
    mine = ex._scan_native(source)
    assert mine is not None
    # no series: the empty lines, not a line that starts with `}` (read the slow way); the CSV
    # pass can't tell the two apart and sends both the slow way
    blank = mine[0].filter(pl.col("_no_series")).get_column("line").to_list()
    assert blank == _empty_lines(
        bytes(source) if not isinstance(source, Path) else source.read_bytes()
    )
    monkeypatch.setattr(native, "enabled", False)
    polars = ex._scan(source)
    monkeypatch.setattr(native, "enabled", True)
    assert polars is not None
    return _decoded(mine), _decoded(polars)


@pytest.fixture(autouse=True)
def built():
    if not HAS_CC:
        pytest.skip("no C compiler here: the parse takes its Polars path only")
    assert native.available(), f"{native.LIBRARY} is not built: run `make install`"


@pytest.mark.parametrize("ending", [b"", b"\n", b"\r\n"])
def test_every_line_as_the_csv_pass_reads_it(ending, monkeypatch):
    data = _lines().replace(b"\n", b"\r\n") if ending == b"\r\n" else _lines()
    mine, polars = _both(data + ending, monkeypatch)
    assert mine.height == polars.height == _lines().count(b"\n") + 1
    assert_frame_equal(mine, polars)
    # the numbers are Polars' own, NaN and infinities included (compared bit for bit)
    for c in ("value", "ts_ms"):
        a, b = mine.get_column(c).to_numpy(), polars.get_column(c).to_numpy()
        assert a.tobytes() == b.tobytes()
    # five ways of writing NaN, signed or not, with a timestamp and without, three times
    assert mine.filter(pl.col("value").is_nan()).height == 5 * 2 * 3


def test_threads_cut_the_text_at_line_ends_and_merge_the_series(monkeypatch):
    data = np.frombuffer(_lines() * 40, np.uint8)
    one = native.scan_exposition(data, 1)
    for threads in (2, 3, 8):
        many = native.scan_exposition(data, threads)
        series = [
            bytes(s.series_bytes[s.series_offsets[c] : s.series_offsets[c + 1]])
            if c != native.NO_CODE
            else None
            for s in (one, many)
            for c in s.code.tolist()[:: len(s.code) // 500]
        ]
        half = len(series) // 2
        assert series[:half] == series[half:]
        assert np.array_equal(one.flags, many.flags)
        assert one.value.tobytes() == many.value.tobytes()
        assert np.array_equal(one.ts, many.ts)
        assert sorted(one.odd_values[:, 0]) == sorted(many.odd_values[:, 0])
        assert len(one.series_offsets) == len(many.series_offsets)


def test_a_file_of_megabytes_is_read_on_the_pool_threads(tmp_path, monkeypatch):
    """A memory-mapped file above 1 MiB: several threads, the same frame as the CSV pass."""
    path = tmp_path / "node.prom"
    rows = [
        f'DCGM_FI_DEV_{f}{{gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-{g // 8}",modelName='
        f'"NVIDIA H100 80GB HBM3"}} {(g * 7 + t) % 101}.{t % 10} {1704103200000 + t * 30000}'
        for t in range(60)
        for g in range(64)
        for f in ("GPU_UTIL", "POWER_USAGE", "FB_USED")
    ]
    path.write_text("\n".join(rows) + "\n")
    assert path.stat().st_size > 2**20
    mine, polars = _both(path, monkeypatch)
    assert mine.height == len(rows) and mine.get_column("_code").n_unique() == 64 * 3
    assert_frame_equal(mine, polars)


def _rss_file_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("RssFile:")[1].split()[0]) / 1024


def test_a_large_file_hands_back_its_pages_as_it_goes(tmp_path, monkeypatch):
    """Above 16 MiB a memory-mapped file's pages are handed back behind the scan (they are
    read again if needed: the odd tokens at the end are read after the scan)."""
    path = tmp_path / "big.prom"
    row = 'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g:05d}",Hostname="node-{h:04d}"}} {v} {t}\n'
    with path.open("w") as f:
        for t in range(200):
            f.write(
                "".join(
                    row.format(g=g, h=g // 8, v=(g + t) % 100, t=1_700_000_000_000 + t)
                    for g in range(2000)
                )
            )
        f.write('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-00000",Hostname="node-0000"} 0x1 1\n')
    assert path.stat().st_size > 32 * 2**20
    data = np.memmap(path, np.uint8, mode="r")
    before = _rss_file_mib()
    assert native.scan_exposition(data, 2) is not None
    # every page of the 33 MiB was read; all but the last <16 MiB of each thread's part handed back
    assert _rss_file_mib() - before < 20
    del data
    mine, polars = _both(path, monkeypatch)
    assert mine.height == 200 * 2000 + 1
    assert_frame_equal(mine, polars)


def test_text_that_is_not_ascii_is_left_to_polars(monkeypatch):
    data = 'DCGM_FI_DEV_GPU_UTIL{a="Niño"} 1 1704103200000\n'.encode()
    assert ex._scan_native(data) is None  # Polars' reader checks the UTF-8
    got = ex.parse(data, Context("f"))
    assert got.samples.height == 0 and got.quarantine.height == 1  # no GPU: unkept, as before


def test_many_numbers_written_oddly_go_to_polars_csv_reader(monkeypatch):
    odd = b"\n".join(f'm{{a="{i}"}} 0x{i} 1704103200000'.encode() for i in range(5000))
    assert ex._scan_native(odd) is None
    few = b"\n".join(f'm{{a="{i}"}} {i} 1704103200000'.encode() for i in range(5000))
    assert ex._scan_native(few + b'\nm{a="x"} 0x1 1704103200000') is not None


def test_the_parse_is_the_same_either_way(tmp_path, monkeypatch):
    """Whole parses, native and Polars: samples, quarantine and counts equal."""
    # the shapes as DCGM series (without a GPU identity: quarantined with their reasons); other
    # series would be skipped, which compares less
    dcgm = b"\n".join(
        b"DCGM_" + ln if ln[:1].isalpha() and not ln.startswith(b"DCGM") else ln
        for ln in _lines().split(b"\n")
    )
    text = (
        dcgm
        + b"\n"
        + b"\n".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="h",modelName="NVIDIA A10G"}} '
            f"{g * 10} {1704103200000 + g}".encode()
            for g in range(8)
        )
    )
    path = Path(tmp_path / "mixed.prom")
    path.write_bytes(text)
    ctx = Context(str(path))
    mine = ex.parse(path, ctx)
    monkeypatch.setattr(native, "enabled", False)
    polars = ex.parse(path, ctx)
    # the eight GPUs and the power line among the shapes (three times)
    assert mine.samples.height == 8 + 3 and mine.quarantine.height > 100
    assert_frame_equal(mine.samples, polars.samples)
    assert_frame_equal(mine.quarantine, polars.quarantine)
    assert (mine.lines_total, mine.lines_skipped, mine.time_basis, mine.records_by_day) == (
        polars.lines_total,
        polars.lines_skipped,
        polars.time_basis,
        polars.records_by_day,
    )


@pytest.mark.parametrize("data", [b"", b"\n", b"\r\n\r\n", b"# only a comment\n", b"}"])
def test_files_with_no_sample_are_counted_alike(data, monkeypatch):
    mine = ex.parse(data, Context("f"))
    monkeypatch.setattr(native, "enabled", False)
    polars = ex.parse(data, Context("f"))
    assert ex._scan_native(data) is None  # off: the Polars pass
    monkeypatch.setattr(native, "enabled", True)
    assert ex._scan_native(data)[0].height == len(data.splitlines())
    assert (mine.lines_total, mine.lines_skipped) == (polars.lines_total, polars.lines_skipped)
    assert mine.samples.height == polars.samples.height == 0
    assert_frame_equal(mine.quarantine, polars.quarantine)


def test_a_library_built_from_another_version_is_not_used(monkeypatch):
    """A stale build (exposition.c changed, `make` not run since) is left alone: Polars pass."""
    monkeypatch.setattr(native, "VERSION", native.VERSION + 1)
    native._load.cache_clear()
    try:
        assert not native.available() and ex._scan_native(b'm{a="b"} 1\n') is None
    finally:
        monkeypatch.undo()
        native._load.cache_clear()
    assert native.available()


def _plain(data: bytes) -> bool:
    return b"\x00" not in data and data.isascii()


def test_plain_text_is_told_as_python_tells_it(monkeypatch):
    """`plain_text` (no NUL byte, ASCII only: the landing file's common case, checked outside
    Python's lock) says what `bytes.isascii` and a NUL search say: a bad byte at any place of
    a 16-byte step, in the tail after the last step, past a 64 KiB block, or none."""
    base = bytes(range(1, 128)) * 1100  # every plain byte, ~140 KB: three blocks
    cases = [b"", b"a", base, base[:15], base[:16], base[:17]]
    for bad in (b"\x00", b"\x80", b"\xff", "é".encode()):
        for at in (0, 1, 15, 16, 17, 65535, 65536, len(base) - 1, len(base)):
            cases.append(base[:at] + bad + base[at:])
        cases.append(bad)
    assert native.available()
    for data in cases:
        assert native.plain_text(data) is _plain(data), (len(data), data[:20])
    assert sum(_plain(d) for d in cases) == 6  # the bad bytes were in the others
    assert native.plain_text(bytearray(base)) is None  # not bytes: left to Python's passes
    monkeypatch.setattr(native, "enabled", False)
    assert native.plain_text(base) is None  # off: Python's own two passes


def test_a_file_read_whole_is_hashed_and_told_plain_chunk_by_chunk(tmp_path):
    """`read_whole` reads a file into one `bytes` a chunk at a time, hashing and checking each
    chunk as it comes: the same bytes, hash and plain-text answer as reading it whole, for a
    bad byte just before, at or after a chunk's edge, in the last chunk, or nowhere; a file
    that ends before the size it was opened with is cut where it ends."""
    import hashlib

    step = native.READ_CHUNK
    base = (bytes(range(32, 127)) + b"\n") * (3 * step // 96 + 7)  # a bit over three chunks
    cases = [b"", b"a\n", base, base[: step - 1], base[:step], base[: step + 1]]
    for bad in (b"\x00", b"\x80", "é".encode()):
        for at in (0, step - 1, step, step + 1, 2 * step, len(base) - 1, len(base)):
            cases.append(base[:at] + bad + base[at:])
    path = tmp_path / "f"
    for data in cases:
        path.write_bytes(data)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            got, plain = native.read_whole(f, len(data), h.update)
            assert f.read() == b""  # read to its end
        assert type(got) is bytes and got == data, len(data)
        assert h.hexdigest() == hashlib.sha256(data).hexdigest()
        assert plain is (_plain(data) if data else None), (len(data), data[:20])
    # opened at one size, shorter when read: what is there; longer: the size asked for
    path.write_bytes(base)
    for size in (len(base) + 5, len(base) - 5):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            got, plain = native.read_whole(f, size, h.update)
        assert got == base[:size] and h.hexdigest() == hashlib.sha256(got).hexdigest()
        assert plain is True


def test_bad_bytes_at_chunk_edges_of_a_large_file_are_quarantined_by_line(tmp_path, monkeypatch):
    """A landing file over a few read chunks, with a NUL byte or invalid UTF-8 right at a
    chunk's edge: its parse (read whole, chunk by chunk) quarantines exactly those lines and
    hashes the whole file; the same file without them is told plain as it is read, and its
    lines are not searched again."""
    import hashlib

    from gpu_pipeline.lib.ingest import landing
    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing

    t0, lab = 1704844800000, '{UUID="GPU-a",gpu="0"}'
    lines = [f"DCGM_FI_DEV_GPU_UTIL{lab} {i % 100} {t0 + i * 1000}\n" for i in range(120_000)]
    clean = "".join(lines).encode()
    assert len(clean) > 3 * native.READ_CHUNK
    ends = np.cumsum([len(x) for x in lines])
    # the lines holding each chunk edge's first byte, and the last line
    marked = sorted({int(np.searchsorted(ends, k * native.READ_CHUNK, "right")) for k in (1, 2)})
    marked.append(len(lines) - 1)
    body = bytearray(clean)
    for n, bad in zip(marked, (b"\x00", b"\xff", b"\x00"), strict=True):
        at = int(ends[n - 1]) if n else 0
        body[at + 5] = bad[0]  # inside the metric name: the line is not text
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "bad.prom").write_bytes(bytes(body))
    (raw / "ok.prom").write_bytes(clean)
    searched = []
    real = landing._bad_lines
    monkeypatch.setattr(landing, "_bad_lines", lambda d: searched.append(len(d)) or real(d))
    parsed = {
        pf.file.source_file: pf
        for pf in (load_or_parse(f, tmp_path / "c") for f in list_landing(raw))
    }
    bad = parsed["bad.prom"]
    q = bad.quarantine.collect().sort("line")
    assert q["line"].to_list() == [n + 1 for n in marked]
    assert len(marked) == 3 and q["reason"][0] == q["reason"][2] == "line has NUL bytes: not text"
    assert q["reason"][1].startswith("line is not UTF-8 text")
    assert bad.file.sha256 == hashlib.sha256(bytes(body)).hexdigest()
    ok = parsed["ok.prom"]
    assert ok.quarantine.collect().height == 0
    assert ok.file.sha256 == hashlib.sha256(clean).hexdigest()
    assert searched == [len(body)]  # the bad file searched line by line; the plain one not


def test_a_read_that_reports_more_than_it_was_given_is_an_error():
    """`read_whole` fills a bytes object it created uninitialised: a file object whose
    `readinto` reports more bytes than the room it was given, or no data (None), is an error,
    never a result holding bytes that were not read."""
    import io

    class Overreporting:
        def __init__(self):
            self.b = io.BytesIO(b"A\n" * 100)

        def readinto(self, buf):
            k = self.b.readinto(buf)
            return len(buf) + 1 if k else k

    class NoData:
        def readinto(self, buf):
            return None

    for f in (Overreporting(), NoData()):
        with pytest.raises(OSError, match="read gave"):
            native.read_whole(f, 4000, lambda c: None)
