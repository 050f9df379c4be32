"""Every input format and its quirks, on hand-written fixtures; the real samples when present."""

import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
from helpers import assemble_day

from gpu_pipeline.lib.generate import generate
from gpu_pipeline.lib.ingest.cache import is_cached, load_or_parse
from gpu_pipeline.lib.ingest.landing import (
    DEFAULT_PARSE,
    LandingFile,
    ParseOptions,
    list_landing,
    parse_landing_file,
)
from gpu_pipeline.lib.io.nvml import FakeNvml, Reading, sample
from gpu_pipeline.lib.marts.hourly_fleet_metrics import hourly_fleet_metrics
from gpu_pipeline.lib.marts.priced_waste import priced_waste
from gpu_pipeline.lib.reference import load_catalog, load_prices
from gpu_pipeline.lib.samples import collect_stable
from gpu_pipeline.lib.staging.gpu_daily import gpu_daily
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes
from gpu_pipeline.lib.staging.minute_runs import minute_runs

D = date(2024, 1, 1)
T = 1704103200  # 2024-01-01 10:00:00 UTC
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def parse_text(tmp_path, name: str, text: str | bytes, opts: ParseOptions = DEFAULT_PARSE):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    fmt, out = parse_landing_file(LandingFile(p, name, "0" * 64, p.stat().st_size, T), opts)
    return fmt, out


def field(out, column):
    return out.samples.filter(pl.col("column") == column)["value"].to_list()


def day(raw, cache, d=D):
    return assemble_day([load_or_parse(f, cache) for f in list_landing(raw)], d)


# --- Prometheus HTTP API JSON -------------------------------------------------------------------


def test_prometheus_query_range_matrix_with_nan_and_exporter_labels(tmp_path):
    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_POWER_USAGE",
                        "UUID": "GPU-AA",
                        "Hostname": "n1",
                        "modelName": "NVIDIA A10G",
                        "namespace": "gpu-operator",
                        "pod": "nvidia-dcgm-exporter-x7",
                        "container": "nvidia-dcgm-exporter",
                    },
                    "values": [[T, "150.5"], [T + 60, "NaN"], [T + 120, "-3"]],
                },
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_GPU_UTIL",
                        "UUID": "GPU-AA",
                        "exported_namespace": "team",
                        "exported_pod": "train-1",
                        "namespace": "gpu-operator",
                    },
                    "values": [[T, "88"]],
                },
                {"metric": {"UUID": "GPU-AA"}, "values": [[T, "1"]]},
            ],
        },
    }
    fmt, out = parse_text(tmp_path, "q.json", json.dumps(doc))
    assert fmt == "prometheus_json" and out.lines_total == 5
    assert field(out, "power_w") == [150.5, None]  # NaN is "no value"
    util = out.samples.filter(pl.col("column") == "gpu_util_pct").row(0, named=True)
    assert util["value"] == 88 and util["namespace"] == "team" and util["pod"] == "train-1"
    power = out.samples.filter(pl.col("column") == "power_w").row(0, named=True)
    assert (
        power["namespace"] is None and power["pod"] is None
    )  # the exporter's own pod is not a workload
    reasons = sorted(out.quarantine["reason"].to_list())
    assert reasons[0].startswith("impossible value -3 for power_w")
    assert reasons[1] == "series has no __name__ label (an expression result?)"
    assert '"value":[' in out.quarantine["raw"][0]


def test_prometheus_vector_and_error_body(tmp_path):
    vec = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1"},
                    "value": [T + 0.5, "61"],
                }
            ],
        },
    }
    _, out = parse_text(tmp_path, "v.json", json.dumps(vec, indent=2))
    assert out.samples["timestamp"].to_list() == [
        datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=UTC)
    ]
    err = {"status": "error", "errorType": "bad_data", "error": 'invalid parameter "query"'}
    fmt, out = parse_text(tmp_path, "e.json", json.dumps(err))
    assert out.samples.height == 0 and out.quarantine.height == 1
    assert (
        out.quarantine["reason"].item()
        == 'prometheus_json: Prometheus API error: bad_data: invalid parameter "query"'
    )
    _, out = parse_text(tmp_path, "t.json", json.dumps(vec)[:40])
    assert out.quarantine["reason"].item().startswith("prometheus_json: not valid JSON at line 1")


# --- nvidia-smi --query-gpu CSV -----------------------------------------------------------------

SMI = (
    "timestamp, name, uuid, index, utilization.gpu [%], power.draw [W], power.draw.instant [W], "
    "memory.used [MiB], temperature.gpu, power.limit [W]\n"
    "2024/01/01 10:00:00.000, NVIDIA A100-SXM4-40GB, GPU-ABC, 0, 91 %, 250.50 W, 251 W, 1024 MiB, 60, 400.00 W\n"
    "2024/01/01 10:01:00.000, NVIDIA A100-SXM4-40GB, GPU-ABC, 0, [N/A], [N/A], 120.5 W, [Not Supported], N/A, "
    "[Insufficient Permissions]\n"
    "2024/01/01 10:02:00.000, NVIDIA A100-SXM4-40GB, GPU-ABC, 0, 4294967295 %, 100 W, 1 W, 1 MiB, 50, 400 W\n"
    "2024/01/01 10:03:00.000, NVIDIA A100-SXM4-40GB, GPU-ABC, 0, 50 %\n"
    "yesterday, NVIDIA A100-SXM4-40GB, GPU-ABC, 0, 50 %, 1 W, 1 W, 1 MiB, 50, 400 W\n"
)


def test_nvidia_smi_units_na_spellings_and_bad_rows(tmp_path):
    fmt, out = parse_text(tmp_path, "smi.csv", SMI)
    assert fmt == "nvidia_smi_csv" and out.lines_total == 6 and out.lines_skipped == 1
    s = out.samples
    assert set(s["gpu_uuid"]) == {"GPU-abc"} and set(s["gpu_model"]) == {"NVIDIA A100-SXM4-40GB"}
    # power.draw first, power.draw.instant where power.draw says N/A
    assert field(out, "power_w") == [250.5, 120.5, 100.0]
    assert field(out, "gpu_util_pct") == [91.0, None]
    assert field(out, "fb_used_mib") == [1024.0, None, 1.0] and field(out, "power_limit_w") == [
        400.0,
        None,
        400.0,
    ]
    assert s.filter(pl.col("line") == 2)["timestamp"][0] == datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
    reasons = dict(zip(out.quarantine["line"], out.quarantine["reason"], strict=True))
    assert reasons[4].startswith("impossible value 4294967295 % for gpu_util_pct")
    assert reasons[5] == "expected 10 comma-separated fields, found 5"
    assert reasons[6] == "timestamp not understood: 'yesterday'"


def test_nvidia_smi_nounits_any_order_subset_and_timezone(tmp_path):
    text = "power.draw,uuid,timestamp\n100.25,gpu-xyz,2024/01/01 11:00:00\n"
    _, out = parse_text(tmp_path, "a.csv", text)
    assert field(out, "power_w") == [100.25]
    assert out.samples["timestamp"][0] == datetime(2024, 1, 1, 11, 0, tzinfo=UTC)
    _, out = parse_text(tmp_path, "b.csv", text, ParseOptions(csv_timezone="Europe/Berlin"))
    assert out.samples["timestamp"][0] == datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="unknown CSV time zone"):
        ParseOptions(csv_timezone="Mars/Olympus")


def test_everything_that_changes_a_parse_is_in_the_cache_key(tmp_path):
    """The same file read with another CSV time zone or size limit is parsed again, never
    served from the cache of the other options."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.csv").write_text("power.draw,uuid,timestamp\n100.25,gpu-xyz,2024/01/01 11:00:00\n")
    (lf,) = list_landing(raw)
    cache = tmp_path / "cache"
    utc = load_or_parse(lf, cache)
    berlin = ParseOptions(csv_timezone="Europe/Berlin")
    assert not is_cached(lf, cache, berlin)
    got = load_or_parse(lf, cache, berlin)
    hour = lambda pf: pf.samples.collect()["timestamp"][0].hour  # noqa: E731
    assert (hour(utc), hour(got)) == (11, 10)
    assert hour(load_or_parse(lf, cache)) == 11  # each options' parse kept apart
    tiny = ParseOptions(max_file_bytes=10)
    assert not is_cached(lf, cache, tiny)
    assert load_or_parse(lf, cache, tiny).format == "unreadable"


def test_nvidia_smi_loop_log_without_identity(tmp_path):
    rows = ["timestamp,power.draw [W],utilization.gpu [%]"]
    for k in range(5):  # 3 GPUs per loop, 100 ms apart, rows of one loop 1-20 ms apart
        for g in range(3):
            rows.append(
                f"2024/01/01 10:00:{k // 10:02d}.{(k % 10) * 100 + g * 7:03d}, {100 + g} W, {10 * g} %"
            )
    _, out = parse_text(tmp_path, "loop.csv", "\n".join(rows) + "\n")
    assert out.quarantine.height == 0
    power = out.samples.filter(pl.col("column") == "power_w")
    per_gpu = power.group_by("gpu_index").agg(pl.col("value").unique()).sort("gpu_index")
    assert per_gpu["value"].to_list() == [[100.0], [101.0], [102.0]]
    assert power["gpu_uuid"].str.starts_with("GPU-idx-").all()


# --- NVML samples -------------------------------------------------------------------------------


def fake_readings(tick):
    return [
        Reading(
            "GPU-NV1",
            0,
            "NVIDIA L4",
            util_gpu_pct=40 + tick,
            util_mem_pct=5,
            power_mw=36000.0,
            power_limit_mw=72000.0,
            mem_used_bytes=2 * 2**30,
            mem_total_bytes=24 * 2**30,
            temp_c=50,
        )
    ]


def test_nvml_sampler_writes_raw_units_and_ingest_converts(tmp_path):
    clock = iter([T + 0.05 * i for i in range(100)])
    backend = FakeNvml(fake_readings)
    path = sample(
        backend,
        1.0,
        3.0,
        tmp_path / "raw" / "nvml",
        hostname="box",
        clock=lambda: next(clock),
        sleep=lambda s: None,
    )
    assert backend.opened and backend.closed and path.name.startswith("box_2024-01-01T10-00-00Z")
    assert not list(path.parent.glob(".*"))
    fmt, out = parse_landing_file(LandingFile(path, path.name, "0" * 64, 1, T))
    assert fmt == "nvml_samples"
    assert field(out, "power_w") == [36.0] * 3
    assert field(out, "power_limit_w") == [72.0] * 3
    assert field(out, "fb_used_mib") == [2048.0] * 3
    assert field(out, "gpu_util_pct") == [40.0, 41.0, 42.0]
    assert set(out.samples["hostname"]) == {"box"} and set(out.samples["gpu_uuid"]) == {"GPU-nv1"}


def test_nvml_sampler_rejects_bad_rates():
    with pytest.raises(ValueError, match="between 0.1 s"):
        sample(FakeNvml(fake_readings), 0.01, 1, "/nonexistent")


def test_sample_command_without_driver_fails_with_one_line(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_pipeline.cli",
            "sample",
            "--interval",
            "0.5",
            "--duration",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if p.returncode == 0:
        pytest.skip("an NVIDIA driver is present on this machine")
    assert p.returncode == 1
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert p.stderr.startswith("error: NVML is not available") and "Traceback" not in p.stderr


# --- the seed notebook project's CSV ------------------------------------------------------------


def test_seed_csv_with_percent_profiling_columns(tmp_path):
    head = (
        "ACTIVITYDATE,ACTIVITYHOUR,HOSTNAME,SCRAPETIME,CLOUDREGION,CLUSTERNAME,MODELNAME,UUID,NAMESPACE,"
        "DCGM_FI_DEV_GPU_UTIL,DCGM_FI_DEV_POWER_USAGE,DCGM_FI_DEV_FB_USED,DCGM_FI_PROF_GR_ENGINE_ACTIVE,"
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,NODEGROUP,POD,CONTAINER"
    )
    rows = [
        "01/01/24,10,ip-1,01/01/24 10:00,us-west-2,ai-factory-cluster-1,NVIDIA H100 80GB HBM3,GPU-1234abcd-1234-5678,"
        "ml-training,90,350.5,60000,90,81,,workload-0001-1234,primary",
        "01/01/24,10,ip-1,01/01/24 10:01,us-west-2,ai-factory-cluster-1,NVIDIA H100 80GB HBM3,GPU-1234abcd-1234-5678,"
        "ml-training,20,150,60000,20,0,,workload-0001-1234,primary",
    ]
    fmt, out = parse_text(tmp_path, "synthetic_dcgm_metrics.csv", "\n".join([head, *rows]) + "\n")
    assert fmt == "seed_csv" and out.quarantine.height == 0
    assert field(out, "prof_gr_engine_active") == [0.9, 0.2]  # percent read as a ratio
    assert field(out, "prof_pipe_tensor_active") == [0.81, 0.0]
    r = out.samples.row(0, named=True)
    assert (r["cluster"], r["namespace"], r["pod"], r["hostname"]) == (
        "ai-factory-cluster-1",
        "ml-training",
        "workload-0001-1234",
        "ip-1",
    )
    assert r["timestamp"] == datetime(2024, 1, 1, 10, 0, tzinfo=UTC)


# --- exposition: renamed fields, MIG ------------------------------------------------------------


def test_dcgm_47_renamed_fields_are_aliases_with_units(tmp_path):
    lab = '{gpu="0",UUID="GPU-1",hostname="h"}'
    text = (
        "\n".join(
            [
                f"DCGM_FI_DEV_GPU_UTIL_RATIO{lab} 0.87 {T}000",
                f"DCGM_FI_DEV_FB_USED_BYTES{lab} 1073741824 {T}000",
                f"DCGM_FI_DEV_SM_CLOCK_HERTZ{lab} 1410000000 {T}000",
                f"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{lab} 12.5 {T}000",
                f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{lab} 61 {T}000",
                f"DCGM_FI_PROF_TENSOR_UTIL_RATIO{lab} 0.4 {T}000",
                f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{lab} 4 {T}000",
            ]
        )
        + "\n"
    )
    _, out = parse_text(tmp_path, "new.prom", text)
    got = dict(zip(out.samples["column"], out.samples["value"], strict=True))
    assert got == pytest.approx(
        {
            "gpu_util_pct": 87.0,
            "fb_used_mib": 1024.0,
            "sm_clock_mhz": 1410.0,
            "energy_mj": 12500.0,
            "gpu_temp_c": 61.0,
            "prof_pipe_tensor_active": 0.4,
            "clock_event_reasons": 4.0,
        }
    )


MIG = """# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-M",modelName="NVIDIA A100-SXM4-40GB",Hostname="h",GPU_I_PROFILE="3g.20gb",GPU_I_ID="1",namespace="a",pod="pa"} 200 TS
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-M",modelName="NVIDIA A100-SXM4-40GB",Hostname="h",GPU_I_PROFILE="2g.10gb",GPU_I_ID="2",namespace="b",pod="pb"} 200 TS
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-M",modelName="NVIDIA A100-SXM4-40GB",Hostname="h",GPU_I_PROFILE="3g.20gb",GPU_I_ID="1",namespace="a",pod="pa"} 0.7 TS
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-M",modelName="NVIDIA A100-SXM4-40GB",Hostname="h",GPU_I_PROFILE="2g.10gb",GPU_I_ID="2",namespace="b",pod="pb"} 0.35 TS
"""


def test_mig_device_fields_once_per_gpu_and_utilization_source(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "mig.prom").write_text(MIG.replace("TS", f"{T}000"))
    out = day(raw, tmp_path / "cache")
    log = out.ingest_log.row(0, named=True)
    assert (log["rows_read"], log["rows_accepted"], log["rows_duplicate"]) == (4, 3, 1)
    s = out.gpu_samples.sort("gpu_instance_id", nulls_last=False)
    assert s["gpu_instance_id"].to_list() == [None, 1, 2]
    assert s["power_w"].to_list() == [200.0, None, None]  # once, on the physical GPU
    assert s["namespace"].to_list() == [None, "a", "b"]
    m = collect_stable(gpu_minutes(out.gpu_samples.lazy(), load_catalog(), load_prices()))
    m = m.sort("gpu_instance_id", nulls_last=False)
    assert m["util_source"].to_list() == [
        "mig_instances",
        "prof_gr_engine_active",
        "prof_gr_engine_active",
    ]
    assert m["gpu_util_pct"].to_list() == pytest.approx(
        [100 * (3 * 0.7 + 2 * 0.35) / 7, 70.0, 35.0]
    )
    assert m["pif"].to_list()[0] == pytest.approx(0.5) and m["pif"].to_list()[1:] == [None, None]
    # the GPU's price is split by slice share: 3g -> 3/7, 2g -> 2/7, the free 2/7 on its own row
    assert m["price_usd_per_hour"].to_list() == [2.5, 2.5, 2.5]
    assert m["gpu_share"].to_list() == pytest.approx([2 / 7, 3 / 7, 2 / 7])
    assert "MIG instance" in m["note"][1]
    w = collect_stable(priced_waste(minute_runs(m.lazy()))).sort("namespace", nulls_last=False)
    # one physical GPU-minute in all, its $2.50/h split among the owner (free slices) and a, b
    assert w["gpu_hours"].sum() == pytest.approx(1 / 60)
    assert w["namespace"].to_list() == [None, "a", "b"]
    assert w["cost_usd"].to_list() == pytest.approx([2.5 / 60 * f for f in (2 / 7, 3 / 7, 2 / 7)])
    # the free slices are idle waste of the GPU's owner
    assert w["idle_waste_usd"][0] == pytest.approx(2.5 / 60 * 2 / 7)
    h = collect_stable(hourly_fleet_metrics(minute_runs(m.lazy())))
    assert (h["gpus"][0], h["gpu_minutes"][0]) == (1, 1)


# --- the same fleet written three ways ----------------------------------------------------------


def test_three_formats_give_the_same_gpu_minutes(tmp_path):
    daily = {}
    for fmt in ("prom", "prom-json", "smi-csv"):
        generate(tmp_path / fmt, D, days=1, gpus=6, clusters=2, seed=11, fmt=fmt)
        got = day(tmp_path / fmt, tmp_path / f"cache-{fmt}")
        assert got.quarantine.height == 0
        m = collect_stable(gpu_minutes(got.gpu_samples.lazy(), load_catalog(), load_prices()))
        daily[fmt] = (
            collect_stable(gpu_daily(minute_runs(m.lazy())))
            .drop("hostname", "namespace")
            .sort("gpu_uuid")
        )
    counts = [c for c in daily["prom"].columns if c.endswith("_minutes") or c == "minutes"]
    for fmt in ("prom-json", "smi-csv"):
        assert daily[fmt].select(counts).equals(daily["prom"].select(counts)), fmt
        assert (daily[fmt]["avg_pif"] - daily["prom"]["avg_pif"]).abs().max() < 0.001
        assert daily[fmt]["cluster"].to_list() == daily["prom"]["cluster"].to_list()


# --- mutated copies -----------------------------------------------------------------------------


def test_mutated_copies_quarantine_and_stop_nothing_else(tmp_path):
    raw = tmp_path / "raw"
    generate(raw, D, days=1, gpus=2, clusters=1, seed=5)
    good = next(raw.rglob("*.prom"))
    data = good.read_bytes()
    (raw / "truncated_2024-01-01.prom").write_bytes(data[: len(data) // 2 + 7])
    (raw / "crlf_2024-01-01.prom").write_bytes(data.replace(b"\n", b"\r\n"))
    (raw / "junk_2024-01-01.prom").write_bytes(os.urandom(4096).replace(b"\x00", b"\x01") + b"\x00")
    out = day(raw, tmp_path / "cache")
    log = {r["source_file"]: r for r in out.ingest_log.iter_rows(named=True)}
    assert log["junk_2024-01-01.prom"]["rows_quarantined"] == 1
    assert (
        log["crlf_2024-01-01.prom"]["rows_duplicate"]
        == log[good.relative_to(raw).as_posix()]["rows_accepted"]
    )
    assert log["truncated_2024-01-01.prom"]["rows_quarantined"] <= 1  # at most the cut line
    assert out.gpu_samples.height == 2 * 1440
    assert (
        out.ingest_log["rows_read"]
        == out.ingest_log["rows_accepted"]
        + out.ingest_log["rows_quarantined"]
        + out.ingest_log["rows_duplicate"]
    ).all()


# --- real third-party exports ------------------------------------------------------------------


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="../shared/samples is not present")
def test_real_samples_ingest_and_are_accounted_for(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in SAMPLES.iterdir():
        if f.name != "README.md":
            (raw / f.name).write_bytes(f.read_bytes())
            os.utime(raw / f.name, (T, T))
    files = [load_or_parse(f, tmp_path / "cache") for f in list_landing(raw)]
    days = sorted({d for f in files for d in f.days} | {f.home_day for f in files})
    outs = [assemble_day(files, d) for d in days]
    log = pl.concat([o.ingest_log for o in outs])
    assert sorted(set(log["source_file"])) == sorted(f.name for f in raw.iterdir())
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    ).all()
    fmt = dict(zip(log["source_file"], log["format"], strict=False))
    for name in ("nvidia-smi_dmon_l40s_load.txt", "nvidia-smi_q_text_h100-mig_load.txt"):
        assert fmt[name] == "unknown"
        assert log.filter(pl.col("source_file") == name)["rows_quarantined"].sum() == 1
    # an nvidia-smi -q -x snapshot is a sample at its timestamp: one record per GPU
    xml = log.filter(pl.col("source_file") == "nvidia-smi_q-x_a100-sxm4-80gb_mig_v12dtd.xml")
    assert fmt["nvidia-smi_q-x_a100-sxm4-80gb_mig_v12dtd.xml"] == "nvidia_smi_xml"
    assert (xml["rows_read"].sum(), xml["rows_accepted"].sum()) == (1, 1)
    s = pl.concat([o.gpu_samples for o in outs], how="diagonal_relaxed")

    def power(src):
        return sorted(s.filter(pl.col("source_file") == src)["power_w"].drop_nulls().to_list())

    # power readings as the files state them; the MIG GPU's once
    a800 = s.filter(pl.col("source_file").str.starts_with("dcgm-exporter_a800"))
    assert a800.filter(pl.col("gpu_index") == 0)["power_w"].drop_nulls().to_list() == [78.174]
    assert power("nvidia-smi_query-gpu_all-fields_h100-mig_driver590_load.csv") == [433.78]
    assert power(
        "nvidia-smi_query-gpu_all-fields_rtx2080super_windows-wddm_driver610_load.csv"
    ) == [97.99]
    assert power("dcgm-exporter_t4_1gpu_no-help-type.prom") == [68.244]
    assert max(power("trace_nvidia-smi-loop_8xh100_training_power-util_window.csv")) == 572.08
    assert len(power("prometheus-api_query_vector_DCGM_FI_DEV_POWER_USAGE_h100x16.json")) == 16
    trace = s.filter(pl.col("source_file").str.starts_with("trace_nvidia-smi-loop_8xh100"))
    assert trace["gpu_uuid"].n_unique() == 8
    q = pl.concat([o.quarantine for o in outs])
    assert q.filter(pl.col("reason").str.contains("ERROR - FAILED TO CONVERT")).height == 10
    assert q.filter(pl.col("raw").str.starts_with("* Connection #0")).height == 1


def test_nvidia_smi_header_naming_no_field_quarantines_every_row():
    """Found by hypothesis: a mangled header left no field to read; its rows were lost."""
    from gpu_pipeline.lib.ingest.formats import nvidia_smi
    from gpu_pipeline.lib.ingest.formats.common import Context

    text = (
        "timestamp, uuid,0 utilization.gpu [%], power.draw [W]\r0\r\r\n"
        "2024/01/01 10:00:00.000, GPU-1, 50 %, 100 W\r\r\r\n"
        "2024/01/01 10:01:00.000, GPU-1, [N/A], 90.5 W\r\r\r\n"
    )
    out = nvidia_smi.parse(text, Context("smi.csv"))
    assert out.samples.height == 0
    assert out.quarantine["line"].to_list() == [2, 3]
    assert out.quarantine["reason"].str.contains("no telemetry field").all()
    assert out.lines_total == out.lines_skipped + out.quarantine.height


def test_prometheus_json_timestamp_out_of_range_is_quarantined():
    """Found by hypothesis: a timestamp beyond int64 milliseconds crashed the parser."""
    from gpu_pipeline.lib.ingest.formats import prom_json
    from gpu_pipeline.lib.ingest.formats.common import Context

    text = json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {
                        "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1"},
                        "values": [[17041031704103260, "50"], [1704103200, "60"]],
                    }
                ],
            },
        }
    )
    out = prom_json.parse(text, Context("q.json"))
    assert out.samples["value"].to_list() == [60.0]
    assert out.quarantine["reason"].to_list() == ["timestamp out of range: 1.704103170410326e+16"]


def test_records_by_day_one_day_and_several():
    from datetime import date

    from gpu_pipeline.lib.ingest.formats.common import records_by_day

    day = 1_704_067_200_000  # 2024-01-01
    lo, hi = day - 10 * 86_400_000, day + 10 * 86_400_000
    one = [day, day + 86_399_999, None, 5, day + 1]
    several = [*one, day + 86_400_000]
    frame = pl.DataFrame({"ts_ms": one}, schema={"ts_ms": pl.Int64})
    # one day: its plausible rows, the null and implausible times under None
    assert records_by_day(frame, lo, hi) == {date(2024, 1, 1): 3, None: 2}
    assert records_by_day(frame.head(2), lo, hi) == {date(2024, 1, 1): 2}
    assert records_by_day(pl.DataFrame({"ts_ms": several}), lo, hi) == {
        date(2024, 1, 1): 3,
        date(2024, 1, 2): 1,
        None: 2,
    }
    assert records_by_day(frame.clear(), lo, hi) == {}
    assert records_by_day(frame.slice(2, 2), lo, hi) == {None: 2}
