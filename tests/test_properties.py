"""Properties: parsers never crash and never lose a row on mutated input; the exposition parser
agrees with prometheus_client's on generated valid input."""

import json
from datetime import UTC, datetime

import polars as pl
import pytest
from helpers import assemble_day
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpu_pipeline.lib.ingest.formats import exposition, nvidia_smi, prom_json
from gpu_pipeline.lib.ingest.formats.common import Context

CTX = Context("f.prom", datetime(2024, 1, 1, tzinfo=UTC))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BASE_EXPO = (
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",pod="p\\"q",Hostname="h"} 87 1704103200000\n'
    'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",Hostname="h"} 250.5 1704103200000\n'
    'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1",Hostname="h"} 0.5\n'
    "DCGM_FI_DEV_GPU_TEMP 2147483647 1704103200000\n"
)
BASE_SMI = (
    "timestamp, uuid, utilization.gpu [%], power.draw [W]\n"
    "2024/01/01 10:00:00.000, GPU-1, 50 %, 100 W\n2024/01/01 10:01:00.000, GPU-1, [N/A], 90.5 W\n"
)
BASE_JSON = json.dumps(
    {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1"},
                    "values": [[1704103200, "5"], [1704103260, "NaN"]],
                }
            ],
        },
    }
)


@st.composite
def mutated(draw, base: str):
    text = base
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "crlf", "truncate"]))
        i = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:i] + draw(st.text(min_size=1, max_size=12)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 20)) :]
        elif op == "replace" and i < len(text):
            text = (
                text[:i]
                + draw(st.sampled_from(['"', "{", "}", ",", " ", "\n", "=", "\\", "x", "9"]))
                + text[i + 1 :]
            )
        elif op == "dup_line":
            lines = text.split("\n")
            k = draw(st.integers(0, max(0, len(lines) - 1)))
            text = "\n".join(lines[: k + 1] + lines[k:])
        elif op == "crlf":
            text = text.replace("\n", "\r\n")
        elif op == "truncate":
            text = text[:i]
    return text


def accounted(out) -> None:
    """Every line is skipped, a sample, or quarantined; none is both a sample and quarantined."""
    s_lines = set(out.samples["line"].to_list())
    q_lines = set(out.quarantine["line"].drop_nulls().to_list())
    assert out.lines_total == out.lines_skipped + len(s_lines | q_lines)
    # a wide CSV row may be partly accepted and partly quarantined (a bad cell), a text line never
    assert out.samples.height == out.samples.unique(["line", "column"]).height


@SETTINGS
@given(mutated(BASE_EXPO))
def test_exposition_never_crashes_or_loses_a_line(text):
    out = exposition.parse(text, CTX)
    accounted(out)
    assert not (set(out.samples["line"]) & set(out.quarantine["line"]))


@SETTINGS
@given(mutated(BASE_SMI))
# found by this test: a stray quote after a bare CR made the csv module raise
@example(
    "0timestamp, uuid, utilization.gpu [%], power.draw [W]\r\r\n2024/01/01 10:00:00.000, GPU-1, "
    '50 %, 100 W\r"\n2024/01/01 10:01:00.000, GPU-1, [N/A], 90.5 W\r\r\n'
)
# found by this test: a last line cut short in a log without identity rows (`.when` on a
# coalesced reason raised)
@example(
    "timestamp, uuid, utilization.gpu [%], power.draw [W]\r\r\n"
    "timestamp, uuid, utilization.gpu [%], power.draw [W]\r\r\n0"
)
def test_nvidia_smi_never_crashes_or_loses_a_line(text):
    if not nvidia_smi.detect(text.encode(), "x.csv"):
        return
    accounted(nvidia_smi.parse(text, CTX))


@SETTINGS
@given(mutated(BASE_JSON))
def test_prometheus_json_never_crashes_and_counts_every_record(text):
    try:
        out = prom_json.parse(text, CTX)
    except prom_json.WholeFile:
        return  # quarantined whole, with the reason
    # every record is a sample or quarantined; series of other things than GPUs are skipped
    assert out.samples.height + out.quarantine.height + out.lines_skipped == out.lines_total


LABEL_TEXT = st.text(alphabet=st.sampled_from(list('abc XYZ019_-.,{}=/"\\\n')), max_size=12)
METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": (0, 100),
    "DCGM_FI_DEV_POWER_USAGE": (0, 700),
    "DCGM_FI_PROF_SM_ACTIVE": (0, 1),
}


def escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition_lines(draw):
    lines, expected = [], []
    for _ in range(draw(st.integers(1, 12))):
        name = draw(st.sampled_from(sorted(METRICS)))
        lo, hi = METRICS[name]
        value = draw(st.floats(lo, hi, allow_nan=False))
        labels = {
            "UUID": "GPU-"
            + draw(st.sampled_from("0123456789abcdef"))
            + draw(st.text(alphabet="0123456789abcdef-", max_size=8)),
            "pod": draw(LABEL_TEXT),
            "namespace": draw(LABEL_TEXT),
            "Hostname": draw(LABEL_TEXT),
        }
        # plausible times only (2020 .. 2025): the parser quarantines times far from now
        ts = draw(st.integers(1_600_000_000_000, 1_750_000_000_000))
        body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r} {ts}")
        expected.append((name, labels, value, ts))
    return "\n".join(lines) + "\n"


@SETTINGS
@given(exposition_lines())
def test_exposition_agrees_with_prometheus_client(text):
    theirs = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    ours = exposition.parse(text, CTX)
    assert ours.quarantine.height == 0
    s = ours.samples.sort("line")
    assert s.height == len(theirs)
    for row, ref in zip(s.iter_rows(named=True), theirs, strict=True):
        assert row["value"] == ref.value
        assert row["timestamp"] == datetime.fromtimestamp(round(ref.timestamp * 1000) / 1000, UTC)
        assert row["pod"] == (ref.labels["pod"].strip() or None)
        assert row["namespace"] == (ref.labels["namespace"].strip() or None)
        assert row["hostname"] == (ref.labels["Hostname"].strip() or None)
        assert row["gpu_uuid"] == "GPU-" + ref.labels["UUID"].lower().removeprefix("gpu-")


def test_property_helpers_detect_real_losses():
    """The accounting check itself can fail: a parse that drops a line is caught."""
    out = exposition.parse(BASE_EXPO, CTX)
    out.samples = out.samples.filter(pl.col("line") != 3)
    try:
        accounted(out)
    except AssertionError:
        return
    raise AssertionError("accounted() did not notice a lost line")


# --- whole days of fleets with any fields missing: the run completes, GPUs count once -----------

FLEET_DAY = datetime(2024, 1, 10, tzinfo=UTC)
MODEL_NAMES = ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "Mystery GPU 9000", None]
FIELD_MODES = st.sampled_from(["present", "absent", "nan", "blank", "sometimes"])


@st.composite
def fleet(draw):
    """Exposition lines of a few GPUs over a few minutes, each field present, absent, NaN, a
    DCGM blank or present only some minutes; some GPUs without model or namespace; some split
    into MIG instances (device-level fields repeated on each, as dcgm-exporter writes them)."""
    minutes = draw(st.integers(2, 4))
    lines, physical = [], set()
    for g in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(MODEL_NAMES))
        ns = draw(st.sampled_from([None, "a", "b"]))
        modes = {f: draw(FIELD_MODES) for f in ("util", "power", "limit", "sm")}
        mig = draw(st.booleans())
        profiles = draw(
            st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), min_size=1, max_size=3)
        )
        base = f'gpu="{g}",UUID="GPU-{g:04d}",Hostname="h{g % 2}"'
        if model:
            base += f',modelName="{model}"'
        label_sets = (
            [
                base
                + f',GPU_I_ID="{i + 1}",GPU_I_PROFILE="{p}"'
                + (f',namespace="{ns}"' if ns else "")
                for i, p in enumerate(profiles)
            ]
            if mig
            else [base + (f',namespace="{ns}"' if ns else "")]
        )
        for m in range(minutes):
            t = int((FLEET_DAY.timestamp() + 60 * m + 5) * 1000)
            for labels in label_sets:
                fields = {
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if mig else "DCGM_FI_DEV_GPU_UTIL": (
                        "util",
                        0.6 if mig else 75,
                    ),
                    "DCGM_FI_DEV_POWER_USAGE": ("power", 180.5),
                    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("limit", 400),
                    "DCGM_FI_PROF_SM_ACTIVE": ("sm", 0.4),
                }
                for name, (f, value) in fields.items():
                    mode = modes[f]
                    if mode == "absent" or (mode == "sometimes" and m % 2):
                        continue
                    v = {"nan": "NaN", "blank": "2147483647"}.get(mode, str(value))
                    lines.append(f"{name}{{{labels}}} {v} {t}")
                    physical.add((g, m))
    return lines, physical


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(fleet())
def test_days_with_missing_fields_complete_and_count_each_gpu_once(tmp_path_factory, day_fleet):
    from gpu_pipeline.lib.ingest.cache import load_or_parse
    from gpu_pipeline.lib.ingest.landing import list_landing
    from gpu_pipeline.lib.io.lake import Lake
    from gpu_pipeline.lib.io.report import build_report
    from gpu_pipeline.lib.marts.day_tables import DayTables
    from gpu_pipeline.lib.marts.efficiency_roi import efficiency_roi
    from gpu_pipeline.lib.marts.gpu_health import gpu_health
    from gpu_pipeline.lib.marts.namespace_efficiency import namespace_efficiency
    from gpu_pipeline.lib.marts.recommendations import recommendations
    from gpu_pipeline.lib.marts.stragglers import stragglers
    from gpu_pipeline.lib.reference import load_catalog, load_prices
    from gpu_pipeline.lib.samples import collect_stable
    from gpu_pipeline.lib.schemas import validate
    from gpu_pipeline.lib.staging.chunked import minutes_by_chunk

    lines, physical = day_fleet
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "raw").mkdir()
    (tmp / "raw" / "f.prom").write_text("\n".join(lines) + "\n")
    day = FLEET_DAY.date()
    files = [load_or_parse(f, tmp / "cache") for f in list_landing(tmp / "raw")]
    out = assemble_day(files, day)
    log = out.ingest_log
    # every line is a sample, a duplicate (MIG repeats) or a quarantined record
    assert log["rows_read"].sum() == len(lines)
    assert (
        log["rows_read"] == log["rows_accepted"] + log["rows_quarantined"] + log["rows_duplicate"]
    ).all()
    samples = validate("gpu_samples", out.gpu_samples)
    catalog, prices = load_catalog(), load_prices()
    tables = DayTables()
    chunks = [
        tables.add(validate("gpu_minutes", m))
        for m in minutes_by_chunk(samples.lazy(), catalog, prices)
    ]
    minutes = pl.concat(chunks) if chunks else None
    lake = Lake(tmp / "lake")
    hourly, waste = tables.hourly_fleet_metrics(), tables.priced_waste()
    # GPU-minutes: each physical GPU once per minute it shows in, MIG or not
    gpu_minutes = len({(g, m) for g, m in physical}) if samples.height else 0
    got = (
        samples.select(
            pl.struct("gpu_uuid", pl.col("timestamp").dt.truncate("1m")).n_unique()
        ).item()
        if samples.height
        else 0
    )
    assert hourly["gpu_minutes"].sum() == got <= gpu_minutes
    assert waste["gpu_hours"].sum() == pytest.approx(got / 60)
    # fleet_daily counts each physical GPU once, its coverage against GPUs seen x 1,440
    fleet = validate("fleet_daily", tables.fleet_daily())
    assert fleet["observed_gpu_minutes"].sum() == got
    if got:
        seen = samples["gpu_uuid"].n_unique()
        assert fleet.row(0, named=True)["expected_gpu_minutes"] == seen * 1440
        assert fleet["coverage_pct"].item() == pytest.approx(100 * got / (seen * 1440))
    if minutes is not None:
        ns = collect_stable(namespace_efficiency(minutes.lazy()))
        assert ns["gpu_hours"].sum() == pytest.approx(got / 60)
        # energy is allocated like GPU-hours: the namespaces' adds up to the physical GPUs'
        gpus = tables.gpu_daily().filter(pl.col("gpu_instance_id").is_null())
        assert ns["energy_kwh"].sum() == pytest.approx(gpus["energy_kwh"].sum(), abs=1e-12)
        lake.write("gpu_minutes", day, minutes)
        lake.write("gpu_daily", day, tables.gpu_daily())
        lake.write("hourly_fleet_metrics", day, hourly)
        lake.write("priced_waste", day, waste)
        lake.write("fleet_daily", day, fleet)
        lake.write(
            "recommendations",
            day,
            validate("recommendations", recommendations(minutes.lazy(), prices)),
        )
        lake.write("efficiency_roi", day, collect_stable(efficiency_roi(minutes.lazy())))
        lake.write("namespace_efficiency", day, ns)
        lake.write("gpu_health", day, collect_stable(gpu_health(samples.lazy(), catalog)))
        lake.write("stragglers", day, collect_stable(stragglers(minutes.lazy())))
    rep = build_report(lake, day)
    assert rep.html.startswith("<!doctype html>") and "GPU efficiency report" in rep.html
