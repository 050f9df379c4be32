"""No sample lost, none invented, each on its own day: detection over the whole file, GPU
identity without a UUID, the times and headers real loggers write, rejections filed on the days
they concern, and the ledger counted in records."""

from __future__ import annotations

import gzip
import json
import os
import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from helpers import api_answer, assemble_day, cli, cli_env, expo_lines, write_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import LandingFile, list_landing, parse_landing_file
from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 1)
T = datetime(2024, 1, 1, 10, tzinfo=UTC).timestamp()
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def parse(tmp_path: Path, name: str, text: str | bytes):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return parse_landing_file(LandingFile(p, name, "0" * 64, p.stat().st_size, T))


def day(raw: Path, cache: Path, d: date = D):
    return assemble_day([load_or_parse(f, cache) for f in list_landing(raw)], d)


def gpus(out) -> int:
    return out.samples.get_column("gpu_uuid").n_unique()


# --- detection never depends on a prefix ---------------------------------------------------------


def test_a_federate_answer_keeps_its_gpu_series(tmp_path):
    """60 node_* lines before the DCGM lines: the GPU samples are kept, the others skipped."""
    node = [f'node_cpu_seconds_total{{cpu="{i}",mode="idle"}} {1000 + i}.5' for i in range(60)]
    dcgm = expo_lines("GPU-aa", "NVIDIA A10G", "h1", "ns", D, range(60), 50, 150)
    fmt, out = parse(tmp_path, "federate.prom", "\n".join(node + dcgm) + "\n")
    assert fmt == "dcgm_exposition"
    assert out.samples.height == 120 and out.quarantine.height == 0
    assert out.lines_skipped == 60  # counted, not rejected
    assert sum(out.records_by_day.values()) == 120


def test_the_pulls_own_json_past_64_kib_with_sorted_keys_is_recognized(tmp_path):
    values = [[T + 10 * i, str(i % 100)] for i in range(4000)]
    doc = {
        "data": {
            "result": [
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-bb"}, "values": values}
            ],
            "resultType": "matrix",
        },
        "status": "success",
    }
    text = json.dumps(doc, sort_keys=True)
    assert len(text) > 65536 and text.index('"resultType"') > 65536
    fmt, out = parse(tmp_path, "pulled.json", text)
    assert fmt == "prometheus_json"
    assert out.samples.height == 4000 and out.quarantine.height == 0


def test_any_json_object_is_read_as_json_and_told_what_is_wrong(tmp_path):
    fmt, out = parse(tmp_path, "other.json", json.dumps({"hello": [1] * 30000}))
    assert fmt == "prometheus_json"
    assert out.quarantine.height == 1
    assert "data" in out.quarantine["reason"][0]


def test_hidden_files_and_folders_are_listed_with_why(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    write_file(raw / ".partial.prom", expo_lines("GPU-aa", "NVIDIA A10G", "h", None, D, [0], 1, 2))
    write_file(raw / ".snapshots" / "a.prom", ["x 1"])
    write_file(raw / "ok.prom", expo_lines("GPU-aa", "NVIDIA A10G", "h", None, D, [1], 1, 2))
    os.utime(raw / ".partial.prom", (T, T))
    os.utime(raw / ".snapshots", (T, T))
    files = list_landing(raw)
    names = sorted(f.source_file for f in files)
    assert names == [".partial.prom", ".snapshots", "ok.prom"]
    out = day(raw, cache)
    log = out.ingest_log.sort("source_file")
    assert log["source_file"].to_list() == names
    hidden = log.filter(pl.col("source_file").str.starts_with("."))
    assert hidden["format"].to_list() == ["skipped", "skipped"]
    assert all("hidden" in n for n in hidden["skip_reason"].to_list())
    assert hidden["rows_read"].to_list() == [0, 0]
    assert out.gpu_samples.height == 1  # the hidden copy's sample is not read


# --- a GPU is never invented, nor merged --------------------------------------------------------


def _stamp(t: float) -> str:
    dt = datetime.fromtimestamp(t, UTC)
    return dt.strftime("%Y/%m/%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d}"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(40, 400),
    interval=st.sampled_from([0.1, 1.0, 5.0]),
    seed=st.integers(0, 10_000),
)
def test_a_single_gpu_log_with_stalls_stays_one_gpu(tmp_path, n, interval, seed):
    rnd = random.Random(seed)
    rows, t = ["timestamp, power.draw [W], utilization.gpu [%]"], T
    for i in range(n):
        rows.append(f"{_stamp(t)}, {100 + i % 7}.5 W, {i % 100} %")
        t += interval + rnd.uniform(0, 0.004)
        if rnd.random() < 1 / 32:  # the logger stalls at a checkpoint
            t += rnd.uniform(2, 4)
    _, out = parse(tmp_path, "one.csv", "\n".join(rows) + "\n")
    assert out.quarantine.height == 0
    assert gpus(out) == 1
    assert out.samples.filter(pl.col("column") == "power_w").height == n


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    k=st.integers(2, 8),
    loops=st.integers(20, 120),
    interval=st.sampled_from([0.1, 1.0, 2.0]),
    bus=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_an_n_gpu_log_stays_n_gpus_each_series_its_own(tmp_path, k, loops, interval, bus, seed):
    """Rows of one iteration ms apart; with a bus id, each iteration lists the GPUs in another
    order. Each GPU's power encodes its number: no row may land on another GPU."""
    rnd = random.Random(seed)
    head = "timestamp, pci.bus_id, power.draw [W]" if bus else "timestamp, power.draw [W]"
    rows, t = [head], T
    for _ in range(loops):
        order = list(range(k))
        if bus:
            rnd.shuffle(order)
        offset = 0.0
        for g in order:
            stamp = _stamp(t + offset)
            offset += rnd.uniform(0.0, 0.002)  # nvidia-smi writes an iteration's rows ms apart
            cells = [stamp, f"00000000:{0x10 + g:02X}:00.0"] if bus else [stamp]
            rows.append(", ".join([*cells, f"{100 + g}.25 W"]))
        t += interval + rnd.uniform(0, 0.01)
        if rnd.random() < 0.05:
            t += rnd.uniform(2, 4)
    _, out = parse(tmp_path, "n.csv", "\n".join(rows) + "\n")
    assert out.quarantine.height == 0
    power = out.samples.filter(pl.col("column") == "power_w")
    per_gpu = power.group_by("gpu_uuid").agg(pl.col("value").unique(), pl.len())
    assert per_gpu.height == k
    assert sorted(v[0] for v in per_gpu["value"].to_list()) == [100.25 + g for g in range(k)]
    assert all(len(v) == 1 for v in per_gpu["value"].to_list())
    assert per_gpu["len"].to_list() == [loops] * k
    if bus:
        assert power["pci_bus_id"].n_unique() == k
        assert power["pci_bus_id"].str.contains(r"^00000000:[0-9A-F]{2}:00\.0$").all()


def test_the_eight_gpu_trace_is_eight_gpus_in_order(tmp_path):
    rows = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"]
    for i in range(50):
        for g in range(8):
            ms = 25 + (1 if g else 0)
            rows.append(f"{_stamp(T + i * 0.1 + ms / 1000)}, {60 + g}.00 W, 0 %, 132 MiB")
    _, out = parse(tmp_path, "trace.csv", "\n".join(rows) + "\n")
    power = out.samples.filter(pl.col("column") == "power_w")
    assert power.group_by("gpu_index").agg(pl.col("value").unique()).sort("gpu_index")[
        "value"
    ].to_list() == [[60.0 + g] for g in range(8)]


def test_a_partial_iteration_in_the_middle_is_quarantined_not_guessed(tmp_path):
    rows = ["timestamp, power.draw [W]"]
    for i in range(20):
        for g in range(4):
            if i == 10 and g == 2:
                continue  # one row missing: which GPU each of the other three is can't be told
            rows.append(f"{_stamp(T + i + g * 0.002)}, {100 + g} W")
    _, out = parse(tmp_path, "gap.csv", "\n".join(rows) + "\n")
    assert gpus(out) == 4
    assert out.quarantine.height == 3
    assert out.quarantine["reason"].str.contains("iteration").all()


def test_identity_by_bus_id_uses_the_host_when_known_else_the_file(tmp_path):
    text = "timestamp, pci.bus_id, utilization.gpu [%]\n" + "".join(
        f"{_stamp(T + i)}, 0000:3b:00.0, 5 %\n" for i in range(3)
    )
    _, a = parse(tmp_path, "a/log.csv", text)
    _, b = parse(tmp_path, "b/log.csv", text)
    assert a.samples["pci_bus_id"].unique().to_list() == ["00000000:3B:00.0"]
    assert a.samples["gpu_uuid"].n_unique() == 1
    assert a.samples["gpu_uuid"][0] != b.samples["gpu_uuid"][0]  # two files, two machines


def test_an_exposition_series_without_uuid_takes_its_bus_id_then_index(tmp_path):
    t = int(T * 1000)
    text = (
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",pci_bus_id="00000000:3B:00.0",Hostname="h1"}} 5 {t}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",pci_bus_id="00000000:86:00.0",Hostname="h1"}} 6 {t}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="2",Hostname="h1"}} 7 {t}\n'
    )
    _, out = parse(tmp_path, "nouuid.prom", text)
    assert out.quarantine.height == 0
    assert out.samples["gpu_uuid"].n_unique() == 3
    assert out.samples.sort("value")["pci_bus_id"].to_list() == [
        "00000000:3B:00.0",
        "00000000:86:00.0",
        None,
    ]


def test_gpu_0_of_two_scrape_targets_without_a_host_label_is_two_gpus(tmp_path):
    """A Prometheus answer whose series carry no UUID and no host label, only the `instance`
    Prometheus adds: GPU 0 of two targets was one GPU, the second's samples duplicates of the
    first's, or conflicts (adversarial review)."""
    res = [
        {
            "metric": {"__name__": name, "gpu": "0", "instance": inst, "job": "dcgm-exporter"},
            "values": [[T + 15 * i, str(v)] for i in range(8)],
        }
        for inst, v in (("gpu-node-1:9400", 10), ("gpu-node-2:9400", 90))
        for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE")
    ]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": res}}
    fmt, out = parse(tmp_path, "two_targets.json", json.dumps(doc))
    assert fmt == "prometheus_json" and out.quarantine.height == 0
    s = out.samples
    assert s.height == 32 and gpus(out) == 2
    util = s.filter(pl.col("column") == "gpu_util_pct")
    by_host = dict(util.group_by("hostname").agg(pl.col("value").mean()).iter_rows())
    assert by_host == {"gpu-node-1:9400": 10.0, "gpu-node-2:9400": 90.0}


def test_a_uuid_column_of_n_a_falls_back_to_the_bus_id(tmp_path):
    """nvidia-smi writes `[N/A]` where it has no UUID: every row was quarantined as "GPU UUID
    'GPU-[n/a]' is not a UUID" though pci.bus_id told the GPUs apart (adversarial review)."""
    rows = [
        f"2024/01/01 10:00:{s:02d}.000, 00000000:{0x17 + g:02X}:00.0, [N/A], {40 + g} %, 300.00 W"
        for s in range(0, 60, 10)
        for g in (0, 1)
    ]
    head = "timestamp, pci.bus_id, uuid, utilization.gpu [%], power.draw [W]"
    fmt, out = parse(tmp_path, "h1/uuid_na.csv", "\n".join([head, *rows]) + "\n")
    assert fmt == "nvidia_smi_csv" and out.quarantine.height == 0
    assert out.samples.height == 24 and gpus(out) == 2
    assert out.samples["gpu_uuid"].str.starts_with("GPU-pci-").all()


# --- times and headers real loggers write ----------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [str(int(T)), f"{T:.3f}", str(int(T * 1000)), f"{T * 1000:.1f}"],
    ids=["epoch_s", "epoch_s_decimals", "epoch_ms", "epoch_ms_decimals"],
)
def test_epoch_timestamps_in_csv_time_columns(tmp_path, stamp):
    text = f"timestamp, uuid, utilization.gpu [%]\n{stamp}, GPU-cc, 42 %\n"
    _, out = parse(tmp_path, "epoch.csv", text)
    assert out.quarantine.height == 0
    assert out.samples["timestamp"].to_list() == [datetime.fromtimestamp(T, UTC)]


HEADERLESS = "".join(f"{_stamp(T + i)}, GPU-dd, NVIDIA A10G, {i} %, 100.{i} W\n" for i in range(10))


def test_a_headerless_csv_says_the_header_is_missing_and_how_to_give_one(tmp_path):
    fmt, out = parse(tmp_path, "noheader.csv", HEADERLESS)
    assert out.samples.height == 0 and out.quarantine.height == 1
    reason = out.quarantine["reason"][0]
    assert "header" in reason and "header.csv" in reason


def test_a_header_file_beside_a_headerless_csv_gives_its_header(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    (raw / "node1").mkdir(parents=True)
    (raw / "node1" / "noheader.csv").write_text(HEADERLESS)
    (raw / "node1" / "header.csv").write_text(
        "timestamp, uuid, name, utilization.gpu [%], power.draw [W]\n"
    )
    out = day(raw, cache)
    assert out.gpu_samples.height == 10
    assert out.gpu_samples.sort("timestamp")["gpu_util_pct"].to_list() == [
        float(i) for i in range(10)
    ]
    log = out.ingest_log
    assert log["format"].to_list() == ["nvidia_smi_csv"] and log["rows_read"].to_list() == [10]
    assert log["lines_skipped"].to_list() == [0]  # the header line is not the file's
    # the header is part of the parse: a new header, a new parse
    (raw / "node1" / "header.csv").write_text(
        "timestamp, uuid, name, power.draw [W], utilization.gpu [%]\n"
    )
    again = day(raw, cache)
    assert again.gpu_samples.sort("timestamp")["power_w"].to_list() == [float(i) for i in range(10)]


def test_a_header_file_gives_its_header_to_rows_that_do_not_start_with_a_time(tmp_path):
    """`--query-gpu=index,uuid,timestamp,…` with `noheader` and a header.csv beside: refused as
    an unrecognized format, the rows starting with an index (adversarial review)."""
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    (raw / "node1").mkdir(parents=True)
    (raw / "node1" / "header.csv").write_text(
        "index, uuid, timestamp, utilization.gpu [%], power.draw [W]\n"
    )
    rows = "".join(
        f"{g}, GPU-d{g}, {_stamp(T + i)}, {10 * g + i} %, 300.00 W\n"
        for i in range(10)
        for g in (0, 1)
    )
    (raw / "node1" / "log.csv").write_text(rows)
    out = day(raw, cache)
    assert out.gpu_samples.height == 20 and out.quarantine.height == 0
    assert out.gpu_samples.filter(pl.col("gpu_uuid") == "GPU-d1")["gpu_util_pct"].sum() == 145.0


def test_hand_written_headers_map_to_their_fields_and_the_rest_is_listed(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    raw.mkdir()
    (raw / "mine.csv").write_text(
        "time, gpu_uuid, gpu_utilization[%], temperature[°C], power(W), fan_speed[%], job\n"
        + "".join(
            f"{_stamp(T + 60 * i)}, GPU-ee, {10 + i}, 60, 200.5, 30, train\n" for i in range(5)
        )
    )
    out = day(raw, cache)
    s = out.gpu_samples.sort("timestamp")
    assert s["gpu_util_pct"].to_list() == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert s["gpu_temp_c"].to_list() == [60.0] * 5 and s["power_w"].to_list() == [200.5] * 5
    assert out.ingest_log["columns_ignored"].to_list() == [["fan_speed[%]", "job"]]


def _xml(ts: str, gpus: list[tuple[str, str, str, str]]) -> str:
    body = "".join(
        f"""
    <gpu id="{bus}">
        <product_name>NVIDIA RTX A5000</product_name>
        <uuid>{uuid}</uuid>
        <fb_memory_usage><total>24564 MiB</total><used>{mem} MiB</used></fb_memory_usage>
        <utilization><gpu_util>{util} %</gpu_util><memory_util>1 %</memory_util></utilization>
        <temperature><gpu_temp>40 C</gpu_temp></temperature>
        <gpu_power_readings><average_power_draw>61.50 W</average_power_draw>
            <instant_power_draw>62.00 W</instant_power_draw>
            <current_power_limit>230.00 W</current_power_limit></gpu_power_readings>
    </gpu>"""
        for bus, uuid, util, mem in gpus
    )
    return (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
        f"<nvidia_smi_log>\n    <timestamp>{ts}</timestamp>\n    <driver_version>590.44.01"
        f"</driver_version>\n    <attached_gpus>{len(gpus)}</attached_gpus>{body}\n</nvidia_smi_log>\n"
    )


def test_an_xml_snapshot_is_a_sample_at_its_timestamp(tmp_path):
    xml = _xml(
        "Mon Jan  1 10:00:00 2024",
        [("00000000:01:00.0", "GPU-x1", "7", "100"), ("00000000:02:00.0", "GPU-x2", "9", "200")],
    )
    fmt, out = parse(tmp_path, "snap.xml", xml)
    assert fmt == "nvidia_smi_xml"
    assert out.quarantine.height == 0
    s = out.samples.pivot(on="column", index=["gpu_uuid", "timestamp"], values="value").sort(
        "gpu_uuid"
    )
    assert s["gpu_uuid"].to_list() == ["GPU-x1", "GPU-x2"]
    assert s["timestamp"].to_list() == [datetime(2024, 1, 1, 10, tzinfo=UTC)] * 2
    assert s["gpu_util_pct"].to_list() == [7.0, 9.0]
    assert s["power_w"].to_list() == [61.5, 61.5]
    assert s["power_limit_w"].to_list() == [230.0, 230.0]
    assert sum(out.records_by_day.values()) == 2  # a record is one GPU of one snapshot


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="needs ../shared/samples beside the repo")
def test_the_real_xml_snapshots_are_samples(tmp_path):
    for name, n in (
        ("nvidia-smi_q-x_2x-rtx-a5000_v13dtd.xml", 2),
        ("nvidia-smi_q-x_a100-sxm4-80gb_mig_v12dtd.xml", 1),
    ):
        fmt, out = parse(tmp_path, name, (SAMPLES / name).read_bytes())
        assert fmt == "nvidia_smi_xml", name
        assert out.quarantine.height == 0, out.quarantine
        assert out.samples["gpu_uuid"].n_unique() == n
        assert out.samples.filter(pl.col("column") == "power_w")["value"].is_not_null().all()


def test_a_header_written_again_with_other_columns_reads_the_rows_below_it_by_it(tmp_path):
    """A logger restarted with another --query-gpu order appends a second header: the rows
    below it were read with the first header's columns, 60 W taken for 60 % utilization and
    20 % for 20 W, nothing quarantined (adversarial review)."""
    u = "GPU-aaaaaaaa-1111-1111-1111-111111111111"
    first = [f"2024/01/01 10:00:{s:02d}.000, {u}, 20 %, 60.00 W" for s in range(0, 60, 10)]
    second = [f"2024/01/01 10:01:{s:02d}.000, {u}, 60.00 W, 20 %" for s in range(0, 60, 10)]
    again = [f"2024/01/01 10:02:{s:02d}.000, {u}, 60.00 W, 20 %" for s in range(0, 60, 10)]
    text = "\n".join(
        [
            "timestamp, uuid, utilization.gpu [%], power.draw [W]",
            *first,
            "timestamp, uuid, power.draw [W], utilization.gpu [%]",
            *second,
            "timestamp, uuid, power.draw [W], utilization.gpu [%]",  # the same again
            *again,
        ]
    )
    fmt, out = parse(tmp_path, "h1/gpu0.csv", text + "\n")
    assert fmt == "nvidia_smi_csv" and out.quarantine.height == 0
    s = out.samples
    assert s.height == 36
    assert set(s.filter(pl.col("column") == "gpu_util_pct")["value"]) == {20.0}
    assert set(s.filter(pl.col("column") == "power_w")["value"]) == {60.0}
    assert out.lines_total == 21 and out.lines_skipped == 3  # the three headers
    assert sorted(s["line"].unique()) == [*range(2, 8), *range(9, 15), *range(16, 22)]


def test_a_per_process_listing_is_not_read_as_the_gpus_memory(tmp_path):
    """`nvidia-smi --query-compute-apps` output: each process's used_memory became the GPU's
    fb_used_mib, the second process a conflicting duplicate (adversarial review)."""
    text = (
        "timestamp, gpu_uuid, pid, process_name, used_memory [MiB]\n"
        "2024/01/01 10:00:00.000, GPU-aaaaaaaa-1111-1111-1111-111111111111, 1234, python, 20000 MiB\n"
        "2024/01/01 10:00:00.000, GPU-aaaaaaaa-1111-1111-1111-111111111111, 5678, python, 30000 MiB\n"
    )
    _, out = parse(tmp_path, "h1/apps.csv", text)
    assert out.samples.height == 0 and out.rejected_whole
    assert "per-process listing" in out.quarantine["reason"][0]


def test_a_gzipped_utf16_export_is_read_as_the_plain_one_is(tmp_path):
    """A PowerShell `>` capture (UTF-16 with a BOM) gzipped was refused as "binary content"
    from its first 64 KiB, half of them NUL (adversarial review); uncompressed it was read."""
    u = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
    rows = [
        f"2024/01/01 10:{s // 60:02d}:{s % 60:02d}.000, {u}, 50 %, 300.00 W"
        for s in range(0, 3600, 5)
    ]
    text = "\r\n".join(["timestamp, uuid, utilization.gpu [%], power.draw [W]", *rows]) + "\r\n"
    data = b"\xff\xfe" + text.encode("utf-16-le")
    assert len(data) > 65536
    outs = [parse(tmp_path, n, d) for n, d in (("a.csv", data), ("b.csv.gz", gzip.compress(data)))]
    for fmt, out in outs:
        assert fmt == "nvidia_smi_csv" and out.quarantine.height == 0
        assert out.samples.height == 2 * 720


_XML_GPU = """  <gpu id="00000000:{bus}:00.0">
    <product_name>NVIDIA RTX A5000</product_name>
    <uuid>GPU-{uuid}</uuid>
    <utilization><gpu_util>{util} %</gpu_util><memory_util>1 %</memory_util></utilization>
    <gpu_power_readings><power_draw>{power} W</power_draw>
      <current_power_limit>230.00 W</current_power_limit></gpu_power_readings>
  </gpu>
"""
_XML_SNAPSHOT = (
    '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
    "<nvidia_smi_log>\n  <timestamp>Fri Nov 20 10:00:00 2025</timestamp>\n"
    "  <driver_version>580.65.06</driver_version>\n  <attached_gpus>2</attached_gpus>\n"
    + _XML_GPU.format(bus="01", uuid="8a0c1a1e-0000-4000-8000-000000000001", util=40, power="95.20")
    + _XML_GPU.format(bus="02", uuid="8a0c1a1e-0000-4000-8000-000000000002", util=7, power="31.05")
    + "</nvidia_smi_log>\n"
)


def test_an_xml_loop_log_is_read_snapshot_by_snapshot(tmp_path):
    """`nvidia-smi -q -x -l 10 > loop.xml` appends a whole document per snapshot: refused whole
    as "junk after document element", one record for 24 (adversarial review). A last snapshot
    cut short is one quarantined record."""
    import re

    tmpl = _XML_SNAPSHOT  # two GPUs, as nvidia-smi -q -x writes them (not ../shared/samples: CI)
    snaps = [
        re.sub(
            r"<timestamp>.*?</timestamp>",
            f"<timestamp>Mon Jan  1 10:{s // 60:02d}:{s % 60:02d} 2024</timestamp>",
            tmpl,
            count=1,
        )
        for s in range(0, 120, 10)
    ]
    fmt, out = parse(tmp_path, "loop.xml", "\n".join(snaps) + "\n")
    assert fmt == "nvidia_smi_xml" and out.quarantine.height == 0
    assert out.lines_total == 24 and sum(out.records_by_day.values()) == 24
    util = out.samples.filter(pl.col("column") == "gpu_util_pct")
    assert util.height == 24 and util["timestamp"].n_unique() == 12 and gpus(out) == 2
    cut = "\n".join(snaps) + "\n" + snaps[0][: len(snaps[0]) // 2]
    _, out = parse(tmp_path, "cut.xml", cut)
    assert out.lines_total == 25 and out.quarantine.height == 1
    assert "cut short" in out.quarantine["reason"][0]


def test_several_api_answers_in_one_file_are_read_answer_by_answer(tmp_path):
    """JSON Lines of `query` answers, or an array of them: refused whole ("truncated", one
    record for 16; adversarial review). A last line cut short after them is one quarantined
    record (tests/test_prom_json_cut_tail.py)."""
    answers = [api_answer(T + 15 * k) for k in range(8)]
    lines = "".join(json.dumps(a) + "\n" for a in answers)
    for name, text in (("a.jsonl", lines), ("b.json", json.dumps(answers))):
        fmt, out = parse(tmp_path, name, text)
        assert fmt == "prometheus_json" and out.quarantine.height == 0, name
        assert out.samples.height == 16 and gpus(out) == 2, name
        assert sorted(set(out.samples["value"])) == [40.0, 41.0]
    _, out = parse(tmp_path, "cut.jsonl", lines + json.dumps(answers[0])[:50])
    assert not out.rejected_whole and out.samples.height == 16
    assert out.quarantine["line"].to_list() == [17]
    assert "after 8 whole answers: the last answer cut short" in out.quarantine["reason"][0]


DMON_HEAD = [
    "#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk",
    "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %    MHz    MHz",
]


def test_nvidia_smi_dmon_with_dates_is_read(tmp_path):
    """`nvidia-smi dmon -o DT`: refused as an unrecognized format, though the reason given for
    plain dmon said to run it with -o DT (adversarial review). Its header comes again every
    screenful; `-` is no value; the time is local as for CSV."""
    rows = [
        f" 20240101   10:{s // 60:02d}:{s % 60:02d}    {g:>3}    {100 + 10 * g}     53      -     {10 + g}      2"
        "      0      0      0      0   9001   2520"
        for s in range(0, 120)
        for g in (0, 1)
    ]
    text = "\n".join([*DMON_HEAD, *rows[:120], *DMON_HEAD, *rows[120:]]) + "\n"
    fmt, out = parse(tmp_path, "h1/dmon.txt", text)
    assert fmt == "nvidia_smi_dmon" and out.quarantine.height == 0
    assert out.lines_total == 244 and out.lines_skipped == 4
    assert sum(out.records_by_day.values()) == 240 and gpus(out) == 2
    s = out.samples
    power = (
        s.filter(pl.col("column") == "power_w").group_by("gpu_index").agg(pl.col("value").mean())
    )
    assert dict(power.iter_rows()) == {0: 100.0, 1: 110.0}
    mtemp = s.filter(pl.col("column") == "mem_temp_c")["value"]
    assert mtemp.fill_nan(None).null_count() == mtemp.len()  # "-": no value
    assert s["timestamp"].min() == datetime(2024, 1, 1, 10, tzinfo=UTC)
    assert set(out.columns_ignored) == {"jpg", "ofa"}


def test_nvidia_smi_pmon_is_not_read_as_the_gpus_utilization(tmp_path):
    """`nvidia-smi pmon -o DT` has dmon's `# Date Time gpu` header: one process's sm % became
    the GPU's utilization, the next a conflicting duplicate (review of the dmon format)."""
    text = (
        "# Date       Time        gpu         pid   type     sm    mem    command\n"
        "# YYYYMMDD   HH:MM:SS    Idx           #    C/G      %      %    name\n"
        " 20240101   10:00:00      0      12345     C     45     10    python\n"
        " 20240101   10:00:00      0      12346     C     30      5    python\n"
    )
    _, out = parse(tmp_path, "h1/pmon.log", text)
    assert out.rejected_whole and out.samples.height == 0
    assert "pmon" in out.quarantine["reason"][0]


def test_dmon_without_dates_is_refused_on_the_day_it_names_or_says_how(tmp_path):
    plain = DMON_HEAD[0].replace("#Date       Time        ", "# ")
    _, out = parse(tmp_path, "dmon_plain.txt", plain + "\n    0    109     53\n")
    assert out.rejected_whole and "-o DT" in out.quarantine["reason"][0]
    assert "--query-gpu" in out.quarantine["reason"][0]


# --- every rejection on a day someone will look at ---------------------------------------------


def test_a_file_rejected_whole_is_filed_on_the_days_it_names(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    raw.mkdir()
    broken = raw / "cut.json"
    broken.write_text(
        '{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}, '
        f'"values":[[{T:.3f},"1"],[{T + 86400:.3f},"2"]'
    )  # truncated
    now = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    os.utime(broken, (now, now))
    for d in (D, D + timedelta(days=1)):
        out = day(raw, cache, d)
        assert out.quarantine.height == 1, d
        assert out.ingest_log["rows_quarantined"].to_list() == [1]
    assert day(raw, cache, date(2024, 3, 1)).quarantine.height == 0


def test_a_day_whose_rows_are_all_rejected_completes_and_says_so(tmp_path):
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    lines = expo_lines("GPU-ff", "NVIDIA A10G", "h", "ns", D, range(30), 500, 150)  # util 500 %
    write_file(raw / "bad.prom", [ln for ln in lines if "GPU_UTIL" in ln])
    env = cli_env(tmp_path)
    p = cli(
        "materialize",
        "--start",
        str(D),
        "--raw",
        str(raw),
        "--lake",
        str(lake),
        env=env,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lk = Lake(str(lake))
    assert lk.scan_days("quarantine", [D]).collect().height == 30
    log = lk.scan_days("ingest_log", [D]).collect()
    assert log["rows_read"].to_list() == [30] and log["rows_quarantined"].to_list() == [30]
    assert lk.scan_days("gpu_minutes", [D]).collect().height == 0
    assert "validation" in p.stdout and "30" in p.stdout
    report = (lake.parent / "lake" / "_reports").glob("*.html")
    html = next(iter(sorted(lake.rglob(f"gpu_report_{D}.html")))).read_text()
    assert "rejected" in html and "30" in html
    del report


def test_materialize_names_files_rejected_whole_that_other_days_hold(tmp_path):
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    write_file(
        raw / "good.prom", expo_lines("GPU-aa", "NVIDIA A10G", "h", "ns", D, range(5), 50, 150)
    )
    (raw / "cut.json").write_text(
        f'{{"status":"success","data":{{"resultType":"matrix","result":[[{T + 5 * 86400:.3f},"1"'
    )
    env = cli_env(tmp_path)
    p = cli("materialize", "--start", str(D), "--raw", str(raw), "--lake", str(lake), env=env)
    assert "cut.json" in p.stdout and str(D + timedelta(days=5)) in p.stdout


# --- one unit: records -------------------------------------------------------------------------


def test_rows_count_records_a_csv_row_is_one(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    raw.mkdir()
    rows = ["timestamp, uuid, utilization.gpu [%], power.draw [W]"]
    rows += [f"{_stamp(T + 60 * i)}, GPU-gg, {i} %, 100 W" for i in range(75)]
    rows.append(
        f"{_stamp(T + 4500)}, GPU-gg, 150 %, 100 W"
    )  # util impossible: kept row, one value out
    rows.append(f"{_stamp(T + 4560)}, GPU-gg, 150 %, -5 W")  # both impossible: the row is rejected
    rows.append("garbage")  # wrong number of cells: rejected whole
    (raw / "log.csv").write_text("\n".join(rows) + "\n")
    out = day(raw, cache)
    log = out.ingest_log.row(0, named=True)
    assert log["rows_read"] == 78
    assert (log["rows_accepted"], log["rows_quarantined"], log["rows_duplicate"]) == (76, 2, 0)
    q = out.quarantine
    assert q.filter(~pl.col("record_kept")).get_column("line").unique().sort().to_list() == [78, 79]
    kept = q.filter(pl.col("record_kept"))
    assert kept["line"].to_list() == [77] and kept["field"].to_list() == ["gpu_util_pct"]
    # the same file again is 78 duplicate records
    (raw / "log_copy.csv").write_text("\n".join(rows) + "\n")
    again = (
        day(raw, cache)
        .ingest_log.filter(pl.col("source_file") == "log_copy.csv")
        .row(0, named=True)
    )
    assert (again["rows_accepted"], again["rows_duplicate"], again["rows_quarantined"]) == (
        0,
        76,
        2,
    )


def test_gzip_of_a_large_pull_is_recognized(tmp_path):
    values = [[T + 10 * i, "5"] for i in range(8000)]
    doc = {
        "data": {
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": "GPU-hh"},
                    "values": values,
                }
            ],
            "resultType": "matrix",
        },
        "status": "success",
    }
    fmt, out = parse(tmp_path, "p.json.gz", gzip.compress(json.dumps(doc, sort_keys=True).encode()))
    assert fmt == "prometheus_json" and out.samples.height == 8000


def test_a_file_without_utilization_warns_through_a_check(tmp_path):
    import dagster as dg

    from gpu_pipeline.defs.raw import build_ingest
    from gpu_pipeline.defs.resources import LakeResource, LandingResource

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "power_only.csv").write_text(
        "timestamp, uuid, power.draw [W]\n"
        + "".join(f"{_stamp(T + 60 * i)}, GPU-ii, 100 W\n" for i in range(5))
    )
    write_file(
        raw / "full.prom", expo_lines("GPU-jj", "NVIDIA A10G", "h", "ns", D, range(5), 50, 150)
    )
    res = dg.materialize(
        [build_ingest()],
        partition_key=str(D),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(raw)),
        },
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert res.success
    ev = {e.check_name: e for e in res.get_asset_check_evaluations()}["utilization_present"]
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN
    assert ev.metadata["files_without_utilization"].value == 1
    assert (
        "power_only.csv" in ev.metadata["files"].value
        and "full.prom" not in ev.metadata["files"].value
    )


# --- the parse cache serves a parse only to the file it was made of ---------------------------------


def _untimed_scrape(uuids: tuple[str, ...]) -> str:
    """One scrape of idle GPUs, saved with no time anywhere (curl > file): what two idle hosts
    write byte for byte alike."""
    return "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="{u}",Hostname="h"}} 0\n'
        for i, u in enumerate(uuids)
    )


def _landed(raw: Path, name: str, text: str, when: datetime) -> None:
    p = raw / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    os.utime(p, (when.timestamp(), when.timestamp()))


def test_identical_untimed_scrapes_in_two_folders_are_filed_at_their_own_times(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    text = _untimed_scrape(("GPU-a", "GPU-b"))
    _landed(raw, "clusterA/metrics.prom", text, datetime(2024, 1, 1, 12, tzinfo=UTC))
    _landed(raw, "clusterB/metrics.prom", text, datetime(2024, 1, 2, 12, tzinfo=UTC))
    parsed = {
        pf.file.source_file: pf for pf in (load_or_parse(f, cache) for f in list_landing(raw))
    }
    assert parsed["clusterA/metrics.prom"].days == [date(2024, 1, 1)]
    assert parsed["clusterB/metrics.prom"].days == [date(2024, 1, 2)]
    for d, cluster in ((date(2024, 1, 1), "clusterA"), (date(2024, 1, 2), "clusterB")):
        out = day(raw, cache, d)
        log = out.ingest_log.row(0, named=True)
        assert out.ingest_log.height == 1 and log["source_file"] == f"{cluster}/metrics.prom"
        assert (log["rows_accepted"], log["rows_duplicate"]) == (2, 0)
        assert out.gpu_samples["timestamp"].dt.date().unique().to_list() == [d]


def test_a_scrape_landed_again_under_its_name_is_filed_at_its_new_time(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    text = _untimed_scrape(("GPU-a",))
    _landed(raw, "node1/metrics.prom", text, datetime(2024, 1, 1, 12, tzinfo=UTC))
    assert day(raw, cache).gpu_samples.height == 1
    _landed(raw, "node1/metrics.prom", text, datetime(2024, 1, 2, 12, tzinfo=UTC))
    (pf,) = [load_or_parse(f, cache) for f in list_landing(raw)]
    assert pf.days == [date(2024, 1, 2)]
    out = day(raw, cache, date(2024, 1, 2))
    assert out.gpu_samples["timestamp"].to_list() == [datetime(2024, 1, 2, 12, tzinfo=UTC)]


def test_identical_bus_id_logs_in_two_folders_stay_two_gpus_through_the_cache(tmp_path):
    raw, cache = tmp_path / "raw", tmp_path / "cache"
    text = "timestamp, pci.bus_id, utilization.gpu [%]\n" + "".join(
        f"{_stamp(T + 60 * i)}, 0000:3b:00.0, 5 %\n" for i in range(3)
    )
    for folder in ("a", "b"):
        _landed(raw, f"{folder}/log.csv", text, datetime(2024, 1, 1, 12, tzinfo=UTC))
    out = day(raw, cache)
    assert out.gpu_samples["gpu_uuid"].n_unique() == 2
    assert out.gpu_samples.group_by("cluster").len().sort("cluster").rows() == [("a", 3), ("b", 3)]
    assert out.ingest_log["rows_duplicate"].to_list() == [0, 0]


# --- times that name their zone ----------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-01-01T11:00:00.000+01:00",
        "2024-01-01T05:00:00-05:00",
        "2024-01-01T11:00:00.000+0100",
        "2024-01-01 10:00:00.000 UTC",
        "2024-01-01T10:00:00.000Z",
    ],
)
@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin"])
def test_a_csv_time_that_names_its_zone_is_that_instant_whatever_the_csv_zone(tmp_path, stamp, tz):
    """ISO-8601 times with an offset were refused as not understood, and a `Z` time was read in
    the CSV zone (adversarial review)."""
    from gpu_pipeline.lib.ingest.landing import ParseOptions

    text = f"timestamp, uuid, utilization.gpu [%]\n{stamp}, GPU-cc, 42 %\n"
    p = tmp_path / "zoned.csv"
    p.write_text(text)
    lf = LandingFile(p, "zoned.csv", "0" * 64, p.stat().st_size, T)
    _, out = parse_landing_file(lf, ParseOptions(csv_timezone=tz))
    assert out.quarantine.height == 0
    assert out.samples["timestamp"].to_list() == [datetime.fromtimestamp(T, UTC)]


@pytest.mark.parametrize(
    ("name", "utc"),
    [
        ("n_2024-01-01T11:00:00+01:00.prom", "2024-01-01T10:00"),
        ("n_2024-01-01T05:00:00-05:00.prom", "2024-01-01T10:00"),
        ("n_20240101T110000+0100.prom", "2024-01-01T10:00"),
        ("n_2024-01-01T11-00-00+01-00.prom", "2024-01-01T10:00"),
        ("n_2024-01-01T10:00:00Z.prom", "2024-01-01T10:00"),
        ("n_2024-01-01_10-00-00.prom", "2024-01-01T10:00"),
        ("n_2024-01-01_10-00-00-0001.prom", "2024-01-01T10:00"),  # a counter, not an offset
        # `date +%Y%m%d-%H%M%S`: filed on its modification day before (adversarial review 26)
        ("dcgm_20260311-235930.prom", "2026-03-11T23:59:30"),
        ("dcgm_2026-03-11-23-59-30.prom", "2026-03-11T23:59:30"),
    ],
)
def test_a_time_in_a_file_name_keeps_its_offset(name, utc):
    from gpu_pipeline.lib.ingest.landing import time_from_name

    assert time_from_name(name) == datetime.fromisoformat(utc).replace(tzinfo=UTC)


@pytest.mark.parametrize("order", ["by_time", "by_gpu"])
def test_a_local_time_log_over_the_end_of_summer_time_keeps_both_hours(tmp_path, order):
    """Europe/Berlin 2024-10-27: 02:00-02:59 twice. A log written in order has its second
    02:xx hour after the first, and it is that hour, not a duplicate of the first (60 rows a
    GPU were quarantined as conflicting duplicates; adversarial review)."""
    from zoneinfo import ZoneInfo

    from gpu_pipeline.lib.ingest.landing import ParseOptions

    berlin, t0 = ZoneInfo("Europe/Berlin"), datetime(2024, 10, 26, 23, 0, tzinfo=UTC)
    instants = [t0 + timedelta(minutes=m) for m in range(240)]  # 23:00Z to 03:00Z
    rows = [(t, g) for t in instants for g in ("GPU-aa", "GPU-bb")]
    if order == "by_gpu":
        rows.sort(key=lambda r: r[1])
    text = "timestamp, uuid, utilization.gpu [%]\n" + "".join(
        f"{t.astimezone(berlin):%Y/%m/%d %H:%M:%S}.000, {g}, 50 %\n" for t, g in rows
    )
    p = tmp_path / "berlin.csv"
    p.write_text(text)
    lf = LandingFile(p, "berlin.csv", "0" * 64, p.stat().st_size, T)
    _, out = parse_landing_file(lf, ParseOptions(csv_timezone="Europe/Berlin"))
    assert out.quarantine.height == 0
    got = out.samples.filter(pl.col("column") == "gpu_util_pct").sort("line")
    assert got["timestamp"].to_list() == [t for t, _ in rows]
