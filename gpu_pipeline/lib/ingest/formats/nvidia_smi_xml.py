"""`nvidia-smi -q -x` XML (what Telegraf's `nvidia_smi` input runs every interval): one snapshot
of every GPU at the log's `<timestamp>`, a sample like a single scrape; a folder of snapshots is
a time series.

The timestamp (`Tue Dec 30 09:46:54 2025`) has no zone: UTC unless configured, as for CSV. A
record is one `<gpu>` of the snapshot. Values carry units in their text (`67.03 W`, `50 MiB`)
or read `N/A`. Power: `power_draw`, else `average_power_draw`, else `instant_power_draw`
(schema v12 and v13, `gpu_power_readings` or the older `power_readings`).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime
from zoneinfo import ZoneInfo

import polars as pl

from gpu_pipeline.lib.ingest.formats.common import NA_VALUES, Context, parsed
from gpu_pipeline.lib.ingest.formats.wide_csv import NUMBER_RX
from gpu_pipeline.lib.samples import ParsedLines

# canonical field -> paths below <gpu>, first with a value wins
PATHS: dict[str, list[str]] = {
    "gpu_util_pct": ["utilization/gpu_util"],
    "mem_copy_util_pct": ["utilization/memory_util"],
    "enc_util_pct": ["utilization/encoder_util"],
    "dec_util_pct": ["utilization/decoder_util"],
    "power_w": [
        f"{block}/{name}"
        for name in ("power_draw", "average_power_draw", "instant_power_draw")
        for block in ("gpu_power_readings", "power_readings")
    ],
    "power_limit_w": [
        f"{block}/{name}"
        for name in ("enforced_power_limit", "current_power_limit", "power_limit")
        for block in ("gpu_power_readings", "power_readings")
    ],
    "fb_used_mib": ["fb_memory_usage/used"],
    "fb_free_mib": ["fb_memory_usage/free"],
    "fb_reserved_mib": ["fb_memory_usage/reserved"],
    "gpu_temp_c": ["temperature/gpu_temp"],
    "mem_temp_c": ["temperature/memory_temp"],
    "sm_clock_mhz": ["clocks/sm_clock"],
    "mem_clock_mhz": ["clocks/mem_clock"],
}
TIME_FORMAT = "%a %b %d %H:%M:%S %Y"


def detect(data: bytes, name: str) -> bool:
    head = data[:4096].lstrip()
    return (head.startswith(b"<?xml") or head.startswith(b"<")) and b"<nvidia_smi_log" in (
        data[:65536]
    )


def _text(e: ET.Element | None) -> str | None:
    if e is None or e.text is None:
        return None
    t = e.text.strip()
    return t or None


SNAPSHOT = re.compile(r"<nvidia_smi_log\b.*?</nvidia_smi_log>", re.S)


def _root(text: str) -> ET.Element:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"nvidia-smi XML that does not parse: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"XML whose root is <{root.tag}>, not nvidia-smi's <nvidia_smi_log>")
    return root


def parse(text: str, ctx: Context) -> ParsedLines:
    """One snapshot, or the snapshots `nvidia-smi -q -x -l N > file` appends one after another
    (each with its own XML declaration: not one document, and refused whole as "junk after
    document element" before; adversarial review). A last snapshot cut short is one record,
    quarantined."""
    multi = text.count("<nvidia_smi_log") > 1
    docs = SNAPSHOT.findall(text) if multi else []
    roots = [_root(d) for d in docs] if multi else [_root(text)]
    rows, n = [], 0
    for root in roots:
        got, gpus = _snapshot_rows(root, ctx, n)
        rows += got
        n += gpus
    tail = text[text.rfind("</nvidia_smi_log>") :] if multi else ""
    if "<nvidia_smi_log" in tail:
        n += 1
        cut = "a snapshot cut short (the logger stopped while writing it): not read"
        rows.append({**dict.fromkeys(rows[0] if rows else ()), "line": n, "pre_reason": cut})
        rows[-1]["raw"] = tail[tail.find("<nvidia_smi_log") :][:200]
    return _parsed(rows, n, ctx)


def _snapshot_rows(root: ET.Element, ctx: Context, n0: int) -> tuple[list[dict], int]:
    """One snapshot's rows (one per GPU and field), its GPUs numbered from n0 + 1."""
    stamp = _text(root.find("timestamp"))
    ts_ms = None
    if stamp:
        try:
            local = datetime.strptime(" ".join(stamp.split()), TIME_FORMAT)
            ts_ms = int(local.replace(tzinfo=ZoneInfo(ctx.csv_timezone)).timestamp() * 1000)
        except ValueError:
            ts_ms = None
    driver = _text(root.find("driver_version"))
    rows = []
    gpus = root.findall("gpu")
    for n, gpu in enumerate(gpus, start=n0 + 1):
        ids = {
            "gpu_uuid": _text(gpu.find("uuid")),
            "pci_bus_id": gpu.get("id") or _text(gpu.find("pci/pci_bus_id")),
            "gpu_index": _text(gpu.find("minor_number")),
            "gpu_model": _text(gpu.find("product_name")),
            "driver_version": driver,
        }
        raw = f'<gpu id="{ids["pci_bus_id"]}"> {ids["gpu_model"]} {ids["gpu_uuid"]} at {stamp}'
        reason = None if ts_ms is not None else f"timestamp not understood: {stamp!r}"
        for column, paths in PATHS.items():
            values = [_text(gpu.find(p)) for p in paths]
            value_s = next((v for v in values if v is not None and v not in NA_VALUES), None)
            if value_s is None:
                value_s = next((v for v in values if v is not None), None)
            if value_s is None:
                continue  # the snapshot has no such element: not a field of this file
            rows.append(
                {
                    "line": n,
                    "raw": raw,
                    "ts_ms": ts_ms,
                    "column": column,
                    "metric": paths[0].rsplit("/", 1)[-1],
                    "value_s": value_s,
                    "pre_reason": reason,
                    **ids,
                }
            )
    return rows, len(gpus)


def _parsed(rows: list[dict], records: int, ctx: Context) -> ParsedLines:
    if not rows:
        raise ValueError("nvidia-smi XML without a <gpu> reading")
    g = pl.DataFrame(
        rows,
        schema={k: (pl.Int64 if k in ("line", "ts_ms") else pl.String) for k in rows[0]},
    ).with_columns(
        pl.when(pl.col("value_s").is_in(list(NA_VALUES)))
        .then(float("nan"))
        .otherwise(pl.col("value_s").str.extract(NUMBER_RX, 1).cast(pl.Float64, strict=False))
        .alias("value"),
        pl.col("ts_ms").cast(pl.Int64),
    )
    out = parsed(
        g,
        lines_total=records,
        lines_skipped=0,
        window=ctx.time_window(),
        source_file=ctx.source_file,
        multi=True,
    )
    out.fields = sorted(set(g.get_column("column").drop_nulls().to_list()))
    return out
