"""The series of many files parsed in one table ahead of their parse (`learn_series`, issue 34)
give every file exactly the series table, samples and quarantine its own parse gives: for
series the table holds, series it lacks (a pod that starts later in the day), series whose GPU
identity is made from their file's name (never taken from the table), label escapes, labels
twice, MIG instances, the exporter's own pod, other exporters' series and the real fleets'
exports beside the checkout."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from gpu_pipeline import native
from gpu_pipeline.lib.ingest import cache as cache_mod
from gpu_pipeline.lib.ingest.cache import parse_all
from gpu_pipeline.lib.ingest.formats import exposition
from gpu_pipeline.lib.ingest.formats.common import Context
from gpu_pipeline.lib.ingest.landing import HEAD_BYTES, learn_series, list_landing

pytestmark = pytest.mark.skipif(not native.available(), reason="needs the native tokenizer")

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
T0 = 1_704_067_200_000  # 2024-01-01
H100 = 'modelName="NVIDIA H100 80GB HBM3"'


def _lines(
    labels: str, minutes: range, metrics=("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE")
):
    return [f"{m}{labels} {50 + i % 7} {T0 + i * 60_000}" for i in minutes for m in metrics]


CASES: dict[str, list[str]] = {
    "plain": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000001",{H100},Hostname="n1"}}',
        range(30),
    ),
    # a pod that starts after the file's first HEAD_BYTES: its series are not in the table
    "late_pod": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000002",{H100},Hostname="n2",pod="a"}}',
        range(900),
    )
    + _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000002",{H100},Hostname="n2",pod="b"}}',
        range(900, 960),
    ),
    # no UUID: the identity is made of the bus id within the host, or within the file
    "host_scoped": _lines(
        f'{{gpu="0",pci_bus_id="00000000:1A:00.0",{H100},Hostname="n3"}}', range(20)
    ),
    "file_scoped": _lines(f'{{gpu="1",pci_bus_id="00000000:1B:00.0",{H100}}}', range(20))
    + _lines(f'{{gpu="2",UUID="GPU-aa000000-0000-0000-0000-000000000003",{H100}}}', range(20)),
    "escapes": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000004",{H100},Hostname="n4",'
        'pod="a\\"b\\\\c",namespace="x}}y"}}',
        range(20),
    ),
    "twice": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000005",{H100},gpu="1",Hostname="n5"}}',
        range(20),
    ),
    "mig": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000006",{H100},Hostname="n6",'
        'GPU_I_ID="1",GPU_I_PROFILE="3g.40gb",namespace="t1",pod="p1"}}',
        range(20),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_POWER_USAGE"),
    ),
    "exporter_pod": _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000007",{H100},Hostname="n7",'
        'namespace="gpu-operator",pod="nvidia-dcgm-exporter-x9",container="nvidia-dcgm-exporter"}}',
        range(20),
    ),
    "other_series": ['go_goroutines{job="x"} 7 ' + str(T0), "node_load1 0.5 " + str(T0)]
    + _lines(
        f'{{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000008",{H100},Hostname="n8"}}',
        range(20),
    )
    + _lines(
        '{gpu="0",UUID="GPU-aa000000-0000-0000-0000-000000000008",Hostname="n8"}',
        range(3),
        ("DCGM_FI_NOT_A_FIELD",),
    ),
}


@pytest.fixture(autouse=True)
def _no_book():
    exposition.forget_series()
    yield
    exposition.forget_series()


def _texts() -> dict[str, bytes]:
    out = {f"{k}.prom": ("\n".join(v) + "\n").encode() for k, v in CASES.items()}
    for p in sorted(SAMPLES.glob("*.prom")) if SAMPLES.is_dir() else []:
        out[p.name] = p.read_bytes()
    return out


def _keys(text: bytes) -> pl.DataFrame:
    scanned = exposition._scan_native(text)
    assert scanned is not None
    return pl.DataFrame({"s": scanned[1]})


def test_late_pod_is_past_the_head():
    text = _texts()["late_pod.prom"]
    assert len(text) > HEAD_BYTES and b'pod="b"' not in text[:HEAD_BYTES]


def test_each_file_gets_the_table_its_own_parse_gives():
    texts = _texts()
    heads = [t[:HEAD_BYTES][: t[:HEAD_BYTES].rfind(b"\n") + 1] for t in texts.values()]
    kept = exposition.learn_series(heads)
    book = exposition._book
    assert book is not None and kept == len(book.rows) >= 15
    # series made from their file's name are left to the file; those made within a host kept
    assert not any('pci_bus_id="00000000:1B:00.0"' in s for s in book.rows)
    assert any('pci_bus_id="00000000:1A:00.0"' in s for s in book.rows)
    partial = 0
    for name, text in texts.items():
        keys = _keys(text)
        got, cols = exposition._series_table(keys, name)
        want, want_cols = exposition._parse_series(keys, name)
        assert cols == want_cols
        assert got.equals(want), name
        hits = sum(s in book.rows for s in keys["s"].to_list())
        partial += 0 < hits < keys.height
    assert partial >= 2  # the late pod, the file-scoped series (some of each file in the table)


def test_parses_are_the_same_with_the_table(tmp_path):
    texts = _texts()
    ctxs = {name: Context(name) for name in texts}
    plain = {n: exposition.parse(t, ctxs[n]) for n, t in texts.items()}
    exposition.learn_series(list(texts.values()))
    for n, t in texts.items():
        got = exposition.parse(t, ctxs[n])
        assert got.samples.equals(plain[n].samples), n
        assert got.quarantine.equals(plain[n].quarantine), n
    # two files with the same series but no UUID nor host: two GPUs, as without the table
    a = exposition.parse(texts["file_scoped.prom"], Context("a/x.prom"))
    b = exposition.parse(texts["file_scoped.prom"], Context("b/x.prom"))
    made = [
        set(p.samples["gpu_uuid"]) - {"GPU-aa000000-0000-0000-0000-000000000003"} for p in (a, b)
    ]
    assert made[0] and made[1] and made[0] != made[1]


def test_parse_all_learns_then_forgets(tmp_path, monkeypatch):
    """A landing zone of several files is parsed to the same cache with the table as without
    it; the table is dropped when the parse ends."""
    raw = tmp_path / "raw"
    for name, text in _texts().items():
        (raw / "c1").mkdir(parents=True, exist_ok=True)
        (raw / "c1" / name).write_bytes(text)
    files = list_landing(raw, {})
    learned: list[int] = []
    real = cache_mod.learn_series
    monkeypatch.setattr(cache_mod, "learn_series", lambda fs: learned.append(real(fs)) or 0)
    with_book = parse_all(files, tmp_path / "a")
    assert learned and learned[0] >= 15 and exposition._book is None
    monkeypatch.setattr(cache_mod, "learn_series", lambda fs: 0)
    without = parse_all(list_landing(raw, {}), tmp_path / "b")
    rows = 0
    for x, y in zip(with_book, without, strict=True):
        assert x.file.source_file == y.file.source_file
        sx, sy = x.samples.collect(), y.samples.collect()
        assert sx.equals(sy), x.file.source_file
        assert x.quarantine.collect().equals(y.quarantine.collect()), x.file.source_file
        rows += sx.height
    assert rows > 2000


def test_heads_that_cannot_be_read_are_left_out(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.prom").write_text("\n".join(CASES["plain"]) + "\n")
    (raw / "b.csv").write_text("timestamp, utilization.gpu [%]\n2024/01/01 00:00:00.000, 5 %\n")
    files = list_landing(raw, {})
    (raw / "a.prom").unlink()  # gone between listing and reading: not read, no error
    assert learn_series(files) == 0 and exposition._book is None


def test_an_alias_written_twice_takes_the_first_written_every_time():
    """`UUID` and `uuid` (one attribute, one alias once lowercased) on one series: the first
    written names the GPU, in a file's own parse and in the table of many files alike (the join
    and sort that pick it keep their order: they picked either, run to run)."""
    lines = []
    for g in range(300):
        first, second = f"GPU-{g:08x}-aaaa", f"GPU-{g:08x}-bbbb"
        order = (f'UUID="{first}",uuid="{second}"', f'uuid="{first}",UUID="{second}"')[g % 2]
        lines += _lines(f'{{gpu="{g % 8}",{order},{H100},Hostname="h{g // 8}"}}', range(2))
    text = ("\n".join(lines) + "\n").encode()
    for attempt in range(2):
        if attempt:
            exposition.learn_series([text])
        for _ in range(10):
            uuids = set(exposition.parse(text, Context("x.prom")).samples["gpu_uuid"].to_list())
            assert uuids == {f"GPU-{g:08x}-aaaa" for g in range(300)}
