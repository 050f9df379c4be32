"""Every table of a fleet's days stays the same (issue 34): a regression guard for optimizing the
ingest and staging passes.

A small multi-file landing zone is materialized through the CLI into a fresh lake: a generated
24-GPU, 3-cluster fleet (dcgm-exporter scrapes, 4 hosts) for three days, plus files read by the
other parsers and paths — an nvidia-smi CSV fleet (and the same file landed twice: duplicates),
a gzipped Prometheus query_range JSON, nvidia-smi -q -x snapshots, a hand-written scrape with
a MIG GPU, a pod with a straggler and bad lines (quarantined), a file no parser fits (rejected
whole) and a hidden file (skipped). Three days, so that `persistent_bottlenecks` (3 bottlenecked
days of the window) has rows on the last.

Every table of `TABLES` is fingerprinted per day: its row count; per column its null count,
for numbers sum, min and max (floats rounded to 9 significant digits and compared with a
relative tolerance of 1e-9), for everything else (strings, enums, booleans, dates, times,
lists; a float inside a list or struct rounded to 9 significant digits) the number of distinct values and a sha256 of them sorted, and with at most 12 distinct
values the rows of each; a sha256 of the table's
natural key (`KEYS`) sorted, and one of its rows without their float columns, so a row or an
exact value moved between GPUs is caught. The fingerprints are compared with the committed
golden file `tests/data/fleet_day_fingerprints.json`; a mismatch lists every table, day,
column and statistic that differs, with the old and the new value.

Regenerating the golden file: ONLY when a table is meant to change (a new column, a rule or
computation changed on purpose), run

    GPU_PIPELINE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_fleet_day_unchanged.py

(the test writes the file and skips), check `git diff tests/data/` shows only the intended
change, and say in the commit why the tables changed. An optimization must never need it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
from datetime import date
from pathlib import Path

import polars as pl
import pytest
from helpers import MODELS, cli, cli_env, expo_lines, ms, write_file

from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.schemas import TABLES

DAYS = [date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)]
GOLDEN = Path(__file__).parent / "data" / "fleet_day_fingerprints.json"
REGEN = os.environ.get("GPU_PIPELINE_REGEN_GOLDEN") == "1"
MTIME = 1704110400  # 2024-01-01 12:00 UTC: files without times of their own are filed on day 1

# each table's natural key (its grain: the pandera model's `unique`, with `date`, or the whole
# identity of a row where the model has none)
KEYS: dict[str, list[str]] = {
    "gpu_samples": ["gpu_uuid", "gpu_instance_id", "timestamp"],
    "quarantine": ["source_file", "line", "field", "reason"],
    "ingest_log": ["source_file"],
    "gpu_minutes": ["gpu_uuid", "gpu_instance_id", "minute"],
    "gpu_daily": ["gpu_uuid", "gpu_instance_id"],
    "hourly_fleet_metrics": ["hour", "cluster", "gpu_model"],
    "fleet_daily": ["date"],
    "persistent_bottlenecks": ["gpu_uuid", "gpu_instance_id"],
    "priced_waste": ["cluster", "namespace", "gpu_model"],
    "recommendations": ["namespace"],
    "gpu_health": ["gpu_uuid"],
    "stragglers": ["hour", "namespace", "pod", "gpu_uuid", "gpu_instance_id", "metric"],
    "efficiency_roi": ["scope", "gpu_model"],
    "namespace_efficiency": ["namespace"],
    "workload_efficiency": ["cluster", "namespace", "workload"],
    # partitioned by month (its first day, 2024-01-01: the other days have no partition)
    "namespace_monthly": ["cluster", "namespace"],
}

# Columns left out of the fingerprints because they legitimately differ between two runs over
# the same landing files. None today: building this landing zone and materializing it twice,
# into two tmp folders with their own lakes and Dagster instances, gave equal frames for every
# column of every table (checked by hand when this test was written): no table holds a run id
# or a wall-clock time, `source_file` is relative to the landing root, and the ingest id
# (`Lake.lineage`) is made of the inputs and is a Parquet key, not a column. A column added
# later that does vary (an `ingested_at`, an absolute path) goes here, with why.
EXCLUDED: dict[str, frozenset[str]] = {}

# a column of at most this many distinct values (a phase, a diagnosis) also counts each value
FEW = 12
SIG_DIGITS = 9
REL_TOL = 1e-9
# sums of money split into parts may be a rounding error off zero (-1e-13 vs 2e-14): below a
# billionth of a dollar, percent point, watt or kWh two values are the same
ABS_TOL = 1e-9


# --- the landing zone --------------------------------------------------------------------------


def _xml_snapshot(ts: str, gpus: list[tuple[str, str, int, int, float]]) -> str:
    """`nvidia-smi -q -x` of a two-GPU workstation (what Telegraf's nvidia_smi input runs)."""
    body = "".join(
        f"""
    <gpu id="{bus}">
        <product_name>NVIDIA RTX A5000</product_name>
        <uuid>{uuid}</uuid>
        <fb_memory_usage><total>24564 MiB</total><used>{mem} MiB</used></fb_memory_usage>
        <utilization><gpu_util>{util} %</gpu_util><memory_util>1 %</memory_util></utilization>
        <temperature><gpu_temp>40 C</gpu_temp></temperature>
        <gpu_power_readings><average_power_draw>{power:.2f} W</average_power_draw>
            <instant_power_draw>62.00 W</instant_power_draw>
            <current_power_limit>230.00 W</current_power_limit></gpu_power_readings>
    </gpu>"""
        for bus, uuid, util, mem, power in gpus
    )
    return (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
        f"<nvidia_smi_log>\n    <timestamp>{ts}</timestamp>\n    <driver_version>590.44.01"
        f"</driver_version>\n    <attached_gpus>{len(gpus)}</attached_gpus>{body}\n</nvidia_smi_log>\n"
    )


def _edge_lines(day: date) -> list[str]:
    """An hour of a hand-written host: a MIG A100 (two 3g.20gb instances), a two-GPU pod whose
    second GPU lags (a straggler), and bad lines among them."""
    minutes = range(600, 660)
    mig = []
    for m in minutes:
        t = ms(day, m)
        for gi, ns in ((1, "research"), (2, "inference")):
            lab = (
                f'gpu="0",UUID="GPU-0000e5e5-0000-4000-8000-00000000000a",'
                f'modelName="{MODELS["A100"]}",Hostname="edge-01",GPU_I_PROFILE="3g.20gb",'
                f'GPU_I_ID="{gi}",namespace="{ns}",pod="{ns}-mig-{gi}"'
            )
            # device-level fields repeat on every instance, as dcgm-exporter writes them
            mig.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} {150 + m % 7}.250 {t}")
            mig.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{lab}}} {0.2 + 0.3 * gi:.2f} {t}")
    fast = expo_lines(
        "GPU-0000e5e5-0000-4000-8000-00000000000b",
        MODELS["A10G"],
        "edge-01",
        "vision-train",
        day,
        minutes,
        85,
        240.5,
        gpu=1,
    )
    slow = expo_lines(
        "GPU-0000e5e5-0000-4000-8000-00000000000c",
        MODELS["A10G"],
        "edge-01",
        "vision-train",
        day,
        minutes,
        40,
        110.25,
        gpu=2,
    )
    slow = [line.replace('pod="vision-train-pod-2"', 'pod="vision-train-pod-1"') for line in slow]
    # lines alternate GPU_UTIL, POWER_USAGE
    fast[2] = fast[2].replace(" 85 ", " 150 ")  # utilization above 100 %
    fast[11] = fast[11].replace(" 240.500 ", " -4.000 ")  # negative power
    fast[20] = fast[20].rsplit(" ", 1)[0]  # no timestamp in a timestamped file
    slow[30] = slow[30].replace(" 40 ", " 4294967295 ")  # DCGM's blank sentinel for integers
    return [*mig, *fast, "this is not a metric line {", *slow]


def build_landing(tmp: Path, env: dict) -> Path:
    raw = tmp / "raw"
    gen = ("generate", "--start", str(DAYS[0]), "--days", str(len(DAYS)))
    cli(*gen, "--gpus", "24", "--clusters", "3", "--out", str(raw), env=env)
    # other parsers: an nvidia-smi CSV fleet (its folder names its cluster) and a gzipped
    # query_range answer, other seeds (other GPUs)
    cli(*gen, "--gpus", "4", "--clusters", "1", "--seed", "7", "--format", "smi-csv",
        "--out", str(tmp / "csv"), env=env)  # fmt: skip
    cli("generate", "--start", str(DAYS[0]), "--days", "1", "--gpus", "2", "--clusters", "1",
        "--seed", "11", "--format", "prom-json", "--out", str(tmp / "json"), env=env)  # fmt: skip
    lab = raw / "lab-smi"
    lab.mkdir()
    for p in sorted((tmp / "csv").glob("*/*.csv")):
        shutil.copy(p, lab / p.name.replace("us-east-train", "lab"))
    # the same file landed twice: its second copy is all duplicates
    shutil.copy(lab / f"lab-node-00_{DAYS[0]}.csv", lab / f"lab-node-00_{DAYS[0]}.copy.csv")
    pulled = raw / "pulled"
    pulled.mkdir()
    for p in sorted((tmp / "json").glob("*/*.json")):
        (pulled / f"{p.name}.gz").write_bytes(gzip.compress(p.read_bytes(), 1, mtime=0))
    # a folder of nvidia-smi -q -x snapshots is a time series
    ws = raw / "ws" / "workstation-01"
    ws.mkdir(parents=True)
    for i in range(3):
        gpus = [
            ("00000000:01:00.0", "GPU-5a7e0001-0000-4000-8000-000000000001", 7 + 40 * i,
             100 + i, 61.5 + i),
            ("00000000:02:00.0", "GPU-5a7e0001-0000-4000-8000-000000000002", 90 - i, 2000,
             180.25),
        ]  # fmt: skip
        (ws / f"snap_{i}.xml").write_text(_xml_snapshot(f"Mon Jan  1 10:{i:02d}:00 2024", gpus))
    edge = raw / "edge"
    write_file(edge / f"edge-01_{DAYS[0]}.prom", _edge_lines(DAYS[0]))
    # no parser fits: rejected whole, on its modification day
    (edge / "dmon.txt").write_text(
        "# gpu   pwr  gtemp  sm\n# Idx     W      C   %\n    0    61     40   7\n"
    )
    (edge / ".edge-01.prom.swp").write_bytes(b"\x00swap")  # hidden: listed as skipped
    for p in raw.rglob("*"):
        os.utime(p, (MTIME, MTIME))
    return raw


def materialize(tmp: Path, raw: Path, **settings: str) -> Lake:
    env = {**cli_env(tmp), **settings}
    lake = tmp / "lake"
    cli("materialize", "--start", str(DAYS[0]), "--end", str(DAYS[-1]),
        "--raw", str(raw), "--lake", str(lake), env=env)  # fmt: skip
    return Lake(lake)


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("fleet_day_landing")
    return build_landing(tmp, cli_env(tmp))


@pytest.fixture(scope="module")
def lake(landing, tmp_path_factory) -> Lake:
    return materialize(tmp_path_factory.mktemp("fleet_day_lake"), landing)


# --- fingerprints ------------------------------------------------------------------------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _number(x, is_float: bool):
    if x is None:
        return None
    if not is_float:
        return int(x)
    x = float(x)
    return float(f"{x:.{SIG_DIGITS}g}") if math.isfinite(x) else str(x)  # JSON has no nan/inf


def _rounded(v):
    """A nested value with its floats rounded as a column's are (`_number`)."""
    if isinstance(v, float):
        return _number(v, True)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


def _as_text(s: pl.Series) -> pl.Series:
    """Each value as text (null stays null): nested values as JSON, their floats rounded to
    SIG_DIGITS like a float column's (a fraction inside `action_details` may move in its last
    bit with the order of a sum, as a float column's sum may)."""
    if isinstance(s.dtype, pl.List | pl.Struct | pl.Array):
        return pl.Series(
            s.name,
            [None if v is None else json.dumps(_rounded(v), sort_keys=True) for v in s.to_list()],
            pl.String,
        )
    return s.cast(pl.String)


def _rows_sha(df: pl.DataFrame) -> str:
    text = pl.DataFrame([_as_text(df[c]) for c in df.columns]) if df.columns else df
    return _sha(text.sort(text.columns, nulls_last=True).write_csv()) if df.height else _sha("")


def fingerprint(df: pl.DataFrame, table: str) -> dict:
    schema = {c: t for c, t in TABLES[table].items() if c not in EXCLUDED.get(table, ())}
    columns = {}
    for c, dtype in schema.items():
        s = df[c]
        stats: dict = {"nulls": s.null_count()}
        if dtype.is_numeric():
            f = dtype.is_float()
            stats |= {
                "sum": _number(s.sum(), f) if s.null_count() < s.len() else None,
                "min": _number(s.min(), f),
                "max": _number(s.max(), f),
            }
        else:
            text = _as_text(s).drop_nulls()
            values = text.unique().sort()
            stats |= {"n_unique": values.len(), "sha256": _sha("\n".join(values.to_list()))}
            if values.len() <= FEW:  # a phase, class, status...: how many rows of each
                counts = text.value_counts().rows()
                stats |= {f"count[{v}]": n for v, n in sorted(counts)}
        columns[c] = stats
    exact = [c for c, t in schema.items() if not t.is_float()]
    return {
        "rows": df.height,
        "key_sha256": _rows_sha(df.select(KEYS[table])),
        # the key with every non-float column: a phase, a count or a label moved between rows
        "exact_rows_sha256": _rows_sha(df.select(exact)),
        "columns": columns,
    }


def fingerprints(lake: Lake) -> dict:
    return {t: {str(d): fingerprint(lake.read_days(t, [d]), t) for d in DAYS} for t in TABLES}


def dump(fps: dict) -> str:
    """The fingerprints as JSON, a column's statistics on one line (a small, readable diff)."""
    lines = ["{"]
    for i, (t, days) in enumerate(fps.items()):
        lines.append(f" {json.dumps(t)}: {{")
        for j, (d, fp) in enumerate(days.items()):
            lines.append(f"  {json.dumps(d)}: {{")
            for k, v in fp.items():
                if k != "columns":
                    lines.append(f"   {json.dumps(k)}: {json.dumps(v)},")
            lines.append('   "columns": {')
            cols = [f"    {json.dumps(c)}: {json.dumps(st)}" for c, st in fp["columns"].items()]
            lines.append(",\n".join(cols))
            lines.append("   }")
            lines.append("  }" + ("," if j < len(days) - 1 else ""))
        lines.append(" }" + ("," if i < len(fps) - 1 else ""))
    return "\n".join([*lines, "}"]) + "\n"


def _same(old, new) -> bool:
    if isinstance(old, float) and isinstance(new, float):
        return math.isclose(old, new, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return old == new


def differences(old: dict, new: dict) -> list[str]:
    """Every statistic that differs, as `table day column.stat: old -> new`."""
    out = []

    def pair(where: str, a: dict, b: dict) -> list[str]:
        """Keys of both (tables in pipeline order, the rest in `b`'s); a key missing on one
        side is a difference already said."""
        order = [*TABLES, *map(str, DAYS), *b, *a]
        for k in sorted(set(a) | set(b), key=order.index):
            if k not in b:
                out.append(f"{where}{k}: {a[k]!r} -> (missing)")
            elif k not in a:
                out.append(f"{where}{k}: (missing) -> {b[k]!r}")
        return [k for k in sorted(set(a) & set(b), key=order.index)]

    for t in pair("", old, new):
        for d in pair(f"{t} ", old[t], new[t]):
            o, n = old[t][d], new[t][d]
            whole_o, whole_n = ({k: v for k, v in fp.items() if k != "columns"} for fp in (o, n))
            for stat in pair(f"{t} {d} ", whole_o, whole_n):
                if o[stat] != n[stat]:
                    out.append(f"{t} {d} {stat}: {o[stat]!r} -> {n[stat]!r}")
            for c in pair(f"{t} {d} column ", o["columns"], n["columns"]):
                oc, nc = o["columns"][c], n["columns"][c]
                for stat in pair(f"{t} {d} {c}.", oc, nc):
                    if not _same(oc[stat], nc[stat]):
                        out.append(f"{t} {d} {c}.{stat}: {oc[stat]!r} -> {nc[stat]!r}")
    return out


# --- tests -------------------------------------------------------------------------------------


def test_the_fleet_covers_every_table(lake):
    """Every table has rows on some day, so no fingerprint is of an empty table only."""
    assert set(KEYS) == set(TABLES), "a new table needs its natural key in KEYS"
    empty = [t for t in TABLES if all(lake.read_days(t, [d]).height == 0 for d in DAYS)]
    assert not empty, f"tables without a row on any day: {empty}"


def test_every_table_of_the_fleet_days_is_unchanged(lake):
    got = fingerprints(lake)
    if REGEN:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(dump(got))
        pytest.skip(f"wrote {GOLDEN}: check its diff and say in the commit why tables changed")
    assert GOLDEN.exists(), f"no {GOLDEN}: run with GPU_PIPELINE_REGEN_GOLDEN=1 (module docstring)"
    want = json.loads(GOLDEN.read_text())
    diff = differences(want, got)
    if diff:
        more = f"\n  ... and {len(diff) - 200} more" if len(diff) > 200 else ""
        pytest.fail(
            f"{len(diff)} fingerprint(s) of the fleet's tables changed (golden -> now); if the"
            " change is intended, regenerate (see the module docstring):\n  "
            + "\n  ".join(diff[:200])
            + more,
            pytrace=False,
        )
