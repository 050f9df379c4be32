"""The exposition parser on hand-written snippets: every quirk, every reason."""

from datetime import UTC, datetime

import polars as pl
import pytest

from gpu_pipeline import native
from gpu_pipeline.lib.ingest.formats.common import Context
from gpu_pipeline.lib.ingest.formats.exposition import parse


@pytest.fixture(autouse=True, params=["native", "polars"])
def tokenizer(request, monkeypatch):
    """Every test twice: the file tokenized natively (gpu_pipeline/native), and by Polars' CSV
    reader (no C compiler, or a wheel install). tests/test_native.py fails if the native one is
    missing where a compiler is."""
    if request.param == "native" and not native.available():
        pytest.skip("the native tokenizer is not built here")
    monkeypatch.setattr(native, "enabled", request.param == "native")
    return request.param


def parse_exposition(text, file_time=None):
    return parse(text, Context("t.prom", file_time))


U = 'UUID="GPU-ABCDEF01-0000-1111-2222-333344445555"'
L = f'{{gpu="0",{U},modelName="NVIDIA A100-SXM4-40GB",Hostname="node-1"}}'
FILE_TIME = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def values(p, column):
    return p.samples.filter(pl.col("column") == column)["value"].to_list()


def test_help_type_present_and_absent_give_same_samples():
    body = [
        f"DCGM_FI_DEV_GPU_UTIL{L} 87 1709294400000",
        f"DCGM_FI_DEV_POWER_USAGE{L} 250.5 1709294400000",
    ]
    with_meta = (
        "\n".join(
            [
                "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
                "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
                "",
                *body,
            ]
        )
        + "\n"
    )
    bare = "\n".join(body) + "\n"
    a, b = parse_exposition(with_meta), parse_exposition(bare)
    assert a.samples.drop("line").equals(b.samples.drop("line"))
    assert a.lines_total == 5 and a.lines_skipped == 3 and b.lines_skipped == 0
    r = a.samples.sort("column").row(0, named=True)
    assert r["column"] == "gpu_util_pct" and r["value"] == 87.0
    assert r["gpu_uuid"] == "GPU-abcdef01-0000-1111-2222-333344445555"
    assert (
        r["gpu_model"] == "NVIDIA A100-SXM4-40GB"
        and r["hostname"] == "node-1"
        and r["gpu_index"] == 0
    )
    assert r["timestamp"] == datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def test_escaped_quotes_braces_and_commas_in_label_values():
    line = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="gpu-xyz",pod="we\\"ird}, pod",namespace="a\\\\b",'
        'hostname="h"} 42 1709294400000'
    )
    p = parse_exposition(line)
    r = p.samples.row(0, named=True)
    assert p.quarantine.height == 0
    assert r["pod"] == 'we"ird}, pod' and r["namespace"] == "a\\b" and r["hostname"] == "h"
    assert r["gpu_uuid"] == "GPU-xyz"


def test_without_timestamp_uses_file_time_else_quarantines():
    text = f"DCGM_FI_DEV_GPU_UTIL{L} 10\n"
    assert parse_exposition(text, file_time=FILE_TIME).samples["timestamp"].to_list() == [FILE_TIME]
    q = parse_exposition(text).quarantine
    assert q.height == 1 and q["reason"].item().startswith("no timestamp")


def test_openmetrics_float_seconds_timestamp():
    p = parse_exposition(f"DCGM_FI_DEV_GPU_UTIL{L} 10 1709294400.250\n")
    assert p.samples["timestamp"].item() == datetime(2024, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)


@pytest.mark.parametrize(
    "sentinel", ["2147483647", "2147483632", "140737488355328", "9223372036854775807", "NaN"]
)
def test_blank_sentinels_become_null(sentinel):
    p = parse_exposition(f"DCGM_FI_DEV_POWER_USAGE{L} {sentinel} 1709294400000\n")
    assert p.quarantine.height == 0
    assert values(p, "power_w") == [None]


def test_large_legitimate_counter_is_not_a_sentinel():
    p = parse_exposition(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{L} 5551899580 1709294400000\n")
    assert values(p, "energy_mj") == [5551899580.0]


def test_garbage_and_bad_values_quarantined_with_reasons():
    text = "\r\n".join(
        [
            f"DCGM_FI_DEV_GPU_UTIL{L} 50 1709294400000",
            "this is not exposition",
            f"DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION{L} ERROR - FAILED TO CONVERT TO STRING",
            f"DCGM_FI_DEV_GPU_UTIL{L} abc 1709294400000",
            f"DCGM_FI_DEV_GPU_UTIL{L} 4294967295 1709294400000",
            f"DCGM_FI_DEV_POWER_USAGE{L} -5 1709294400000",
            f"DCGM_FI_PROF_SM_ACTIVE{L} 7.5 1709294400000",
            f"go_gc_duration_seconds{L} 0.1 1709294400000",
            'DCGM_FI_DEV_GPU_UTIL{Hostname="h"} 50 1709294400000',
            f"DCGM_FI_DEV_GPU_UTIL{L} 50 notatime",
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{U} 50 1709294400000',
        ]
    )  # CRLF endings and no final newline
    p = parse_exposition(text)
    assert p.lines_total == 11 and p.samples.height == 1
    reasons = dict(
        zip(p.quarantine["line"].to_list(), p.quarantine["reason"].to_list(), strict=True)
    )
    # a series of something else than a GPU (line 8) is skipped, not rejected
    assert set(reasons) == set(range(2, 12)) - {8} and p.lines_skipped == 1
    assert reasons[2].startswith("malformed exposition line")
    assert reasons[3] == "value is not a number: 'ERROR - FAILED TO CONVERT TO STRING'"
    assert reasons[4] == "value is not a number: 'abc'"
    assert reasons[5].startswith("impossible value 4294967295 for gpu_util_pct")
    assert reasons[6].startswith("impossible value -5 for power_w")
    assert reasons[7].startswith("impossible value 7.5 for prof_sm_active")
    assert reasons[9].startswith("no GPU identity: no UUID, PCI bus id or GPU index")
    assert reasons[10].startswith("timestamp is not a number")
    assert reasons[11].startswith("malformed exposition line")
    # the raw text is kept verbatim (without the CR)
    assert p.quarantine.filter(pl.col("line") == 2)["raw"].item() == "this is not exposition"


@pytest.mark.parametrize("timed", [True, False], ids=["timed", "untimed"])
def test_a_sample_cut_before_its_closing_brace_is_quarantined_not_skipped(timed):
    """A logger that wrapped a line before its `}`: the head is malformed, and so are the lines
    that start with `}` (one with the value, one alone), not blank lines. Blank and comment
    lines stay skipped."""
    ts = " 1709294400000" if timed else ""
    head, tail = f"DCGM_FI_DEV_GPU_UTIL{L} 50{ts}".split("}", 1)
    text = "\n".join(
        [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            f"DCGM_FI_DEV_POWER_USAGE{L} 300{ts}",
            head,
            "}" + tail,
            "}",
            "",
            f"DCGM_FI_DEV_GPU_UTIL{L} 60{ts}",
            "",
        ]
    )
    p = parse_exposition(text, None if timed else FILE_TIME)
    assert p.lines_total == 7  # the last "" ends line 7
    assert p.samples.sort("column")["value"].to_list() == [60.0, 300.0]  # gpu_util, power
    assert p.quarantine.sort("line")["line"].to_list() == [3, 4, 5]
    assert p.quarantine["reason"].str.starts_with("malformed exposition line").all()
    assert p.quarantine.sort("line")["raw"].to_list()[1:] == ["}" + tail, "}"]
    assert p.lines_skipped == 2  # the comment and the empty line


def test_old_metric_names_and_lowercase_labels():
    text = (
        'dcgm_gpu_utilization{gpu="0",uuid="GPU-1",hostname="h",exported_namespace="team",namespace="monitoring"}'
        " 33 1709294400000\n"
        'dcgm_power_usage{gpu="0",uuid="GPU-1",hostname="h"} 120 1709294400000\n'
    )
    p = parse_exposition(text)
    assert p.quarantine.height == 0
    assert values(p, "gpu_util_pct") == [33.0]
    assert p.samples["namespace"].to_list() == ["team", None]
    assert values(p, "power_w") == [120.0]


def test_exported_namespace_wins_over_scrape_namespace():
    text = (
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1",namespace="gpu-operator",exported_namespace="team-a",'
        'pod="dcgm-exporter-x",exported_pod="train-0"} 90 1709294400000\n'
    )
    r = parse_exposition(text).samples.row(0, named=True)
    assert r["namespace"] == "team-a" and r["pod"] == "train-0"


def test_mig_instance_labels():
    text = (
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-1",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3",'
        'Hostname="h"} 0.5 1709294400000\n'
    )
    r = parse_exposition(text).samples.row(0, named=True)
    assert r["gpu_instance_id"] == 3 and r["gpu_instance_profile"] == "2g.20gb"
    assert r["column"] == "prof_gr_engine_active" and r["value"] == 0.5


def test_rejected_lines_of_a_clean_file_are_quoted_as_written():
    # LF endings, well-formed lines: every line takes the fast path, which keeps no text; the
    # lines it rejects are read again, so reasons quote the value and the line as written
    lines = [
        f"DCGM_FI_DEV_GPU_UTIL{L} 50 1709294400000",
        f"DCGM_FI_DEV_POWER_USAGE{L} -5.00 1709294400000",
        f"DCGM_FI_DEV_POWER_USAGE{L} 1e30 1709294400000",
        f"DCGM_FI_DEV_GPU_UTIL{L} 60",
        f"DCGM_FI_DEV_XYZZY{L} 0.1 1709294400000",
        f"go_gc_duration_seconds{L} 0.1 1709294400000",  # not a GPU's: skipped
        f"DCGM_FI_DEV_GPU_UTIL{L} 70 1709294460000",
    ]
    p = parse_exposition("\n".join(lines) + "\n", file_time=FILE_TIME)
    assert p.lines_skipped == 1
    assert p.samples["value"].to_list() == [50.0, 70.0]
    q = dict(zip(p.quarantine["line"], p.quarantine["reason"], strict=True))
    assert q[2].startswith("impossible value -5.00 for power_w")
    assert q[3].startswith("impossible value 1e30 for power_w")
    assert q[4] == "no timestamp on this line while the file's other samples carry theirs: " + (
        "not filed on a guessed day"
    )
    assert q[5].startswith("unknown metric 'DCGM_FI_DEV_XYZZY'")
    assert p.quarantine["raw"].to_list() == lines[1:5]
    assert p.time_basis == "sample"


def test_untimed_file_takes_the_file_time_on_the_fast_path():
    text = f"DCGM_FI_DEV_GPU_UTIL{L} 10\nDCGM_FI_DEV_POWER_USAGE{L} 11\n"
    p = parse_exposition(text, file_time=FILE_TIME)
    assert p.samples["timestamp"].to_list() == [FILE_TIME, FILE_TIME]
    assert p.time_basis == "file_name" and p.quarantine.height == 0


def test_integer_seconds_and_a_garbage_timestamp_among_integers():
    # integer timestamps of seconds size: the file is read as seconds (no text needed)
    p = parse_exposition(
        f"DCGM_FI_DEV_GPU_UTIL{L} 10 1709294400\nDCGM_FI_DEV_GPU_UTIL{L} 11 1709294460\n"
    )
    assert p.samples["timestamp"].to_list() == [FILE_TIME, datetime(2024, 3, 1, 12, 1, tzinfo=UTC)]
    # one timestamp that is no integer sends the file through the reading that keeps the text
    text = f"DCGM_FI_DEV_GPU_UTIL{L} 10 1709294400000\nDCGM_FI_DEV_GPU_UTIL{L} 11 12:00\n"
    p = parse_exposition(text)
    assert p.samples["timestamp"].to_list() == [FILE_TIME]
    assert p.quarantine["reason"].to_list() == ["timestamp is not a number: '12:00'"]
    assert p.quarantine["raw"].to_list() == [f"DCGM_FI_DEV_GPU_UTIL{L} 11 12:00"]


CLEAN_FILES = {
    # HELP/TYPE lines, MIG instances repeating a device-level field, a unit scaled on read
    # (Hz -> MHz), a blank sentinel, two days
    "mig, scaled, sentinel, two days": (
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        + "".join(
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="GPU-1",GPU_I_ID="{i}",GPU_I_PROFILE="3g.40gb",'
            f'Hostname="h",namespace="team-{i}",pod="p{i}"}} 300 {ts}\n'
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-1",GPU_I_ID="{i}",'
            f'GPU_I_PROFILE="3g.40gb",Hostname="h",namespace="team-{i}",pod="p{i}"}} 0.{i + 4} {ts}\n'
            for i in (1, 2)
            for ts in (1709251140000, 1709251200000)
        )
        + f"DCGM_FI_DEV_SM_CLOCK_HERTZ{L} 1410000000 1709251200000\n"
        + f"DCGM_FI_DEV_GPU_UTIL{L} 2147483647 1709251200000\n",
        None,
        "tokens",
    ),
    # a /federate answer: other series (skipped), comments and blank lines among three GPUs'
    "other series, comments, blank lines, three GPUs": (
        "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\n"
        'node_load1{instance="h"} 0.5 1709251200000\n\n'
        + "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="h"}} {10 * g} {ts}\n'
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",UUID="GPU-{g}",Hostname="h"}} {100 + g} {ts}\n'
            'go_goroutines{instance="h"} 12 ' + f"{ts}\n"
            for ts in (1709251140000, 1709251200000)
            for g in range(3)
        ),
        None,
        "tokens",
    ),
    # the times' unit is decided from them (seconds): the frame's way
    "integer seconds": (
        f"DCGM_FI_DEV_GPU_UTIL{L} 10 1709294400\nDCGM_FI_DEV_GPU_UTIL{L} 11 1709294460\n",
        None,
        "frame",
    ),
    "untimed, the file's time": (
        f"DCGM_FI_DEV_GPU_UTIL{L} 10\nDCGM_FI_DEV_POWER_USAGE{L} 11\n",
        FILE_TIME,
        "frame",
    ),
}


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("name", list(CLEAN_FILES))
def test_clean_file_route_equals_the_general_one(name, keyed, monkeypatch):
    """A file whose every line is accepted takes a short route: straight from the native tokens
    (`_clean_tokens`, a timed file) or from the scanned frame (`_clean_samples`: the Polars
    reader, or an untimed file). It must yield exactly what the general route (`finalize`)
    yields for the same file."""
    from gpu_pipeline.lib.ingest.formats import exposition

    text, file_time, native_route = CLEAN_FILES[name]
    taken = []
    routes = {"_clean_tokens": "tokens", "_clean_samples": "frame"}
    for fn, route in routes.items():
        short = getattr(exposition, fn)

        def spy(*args, route=route, short=short):
            out = short(*args)
            taken.append(route if out is not None else None)
            return out

        monkeypatch.setattr(exposition, fn, spy)
    clean = parse(text, Context("t.prom", file_time), keyed)
    assert (clean.series is not None) == keyed  # keyed as asked: the cache's form
    clean = clean.unkeyed()
    for fn in routes:
        monkeypatch.setattr(exposition, fn, lambda *args: None)
    general = parse_exposition(text, file_time)
    route = native_route if exposition.native.available() else "frame"
    assert [t for t in taken if t] == [route]
    assert clean.samples.height > 0 and clean.quarantine.height == 0
    assert clean.samples.equals(general.samples)
    assert clean.samples.schema == general.samples.schema
    assert clean.quarantine.schema == general.quarantine.schema
    assert (clean.lines_total, clean.lines_skipped, clean.time_basis) == (
        general.lines_total,
        general.lines_skipped,
        general.time_basis,
    )
    assert clean.records_by_day == general.records_by_day
    if name.startswith("mig"):
        s = clean.samples
        # the device-level power is the GPU's, once per minute; instance fields stay per instance
        power = s.filter(pl.col("column") == "power_w")
        assert power["gpu_instance_id"].null_count() == power.height == 4
        assert sorted(clean.records_by_day.values()) == [4, 6]
        assert values(clean, "sm_clock_mhz") == [1410.0]
        assert values(clean, "gpu_util_pct") == [None]


def test_a_rejected_line_sends_the_file_the_general_way(monkeypatch):
    from gpu_pipeline.lib.ingest.formats import exposition

    taken = []
    for fn in ("_clean_tokens", "_clean_samples"):
        short = getattr(exposition, fn)
        monkeypatch.setattr(
            exposition, fn, lambda *a, short=short: taken.append(out := short(*a)) or out
        )
    p = parse_exposition(
        f"DCGM_FI_DEV_GPU_UTIL{L} 50 1709294400000\nDCGM_FI_DEV_GPU_UTIL{L} 150 1709294400000\n"
    )
    assert all(t is None for t in taken) and taken  # the short routes declined it
    assert values(p, "gpu_util_pct") == [50.0]
    assert p.quarantine["reason"].to_list() == [
        "impossible value 150 for gpu_util_pct (valid 0.0..100.0)"
    ]
