"""Landing files -> `gpu_samples`, `quarantine`, `ingest_log` for one UTC day.

Each landing file is parsed once into a cache keyed by its content (sha256) and name, so a day's
run reads only that day's rows of each file. A day is then assembled: duplicates (same GPU,
instance, field and timestamp; first file in path order wins) are counted, the long samples are
pivoted to one row per GPU per timestamp, and every line of every file is accounted for.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import uuid
import zlib
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from gpu_pipeline.lib.fields import FIELD_COLUMNS
from gpu_pipeline.lib.formats import FORMATS
from gpu_pipeline.lib.formats.common import Context
from gpu_pipeline.lib.samples import (
    ATTR_COLUMNS,
    LONG_SCHEMA,
    QUARANTINE_LINE_SCHEMA,
    SAMPLE_ORDER,
    ParsedLines,
    collect_stable,
    conform,
)
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA, INGEST_LOG_SCHEMA, QUARANTINE_SCHEMA

# bump when parsing changes what a file yields, so cached parses are redone
PARSER_VERSION = "p4"
DEFAULT_CLUSTER = "default"
KEY = ("gpu_uuid", "gpu_instance_id", "timestamp")
META_SCHEMA = {
    "source_file": pl.String,
    "file_order": pl.Int32,
    "format": pl.String,
    "time_basis": pl.String,
    "sha256": pl.String,
    "file_bytes": pl.Int64,
    "file_lines": pl.Int64,
    "lines_skipped": pl.Int64,
    "home": pl.Boolean,
}


@dataclass(frozen=True)
class LandingFile:
    path: Path
    source_file: str  # path relative to the landing root, POSIX style
    sha256: str
    size: int
    mtime: float

    @property
    def dir_cluster(self) -> str | None:
        """The first folder below the landing root names the cluster when labels don't."""
        parts = self.source_file.split("/")
        return parts[0] if len(parts) > 1 else None


@dataclass
class ParsedFile:
    file: LandingFile
    format: str
    lines_total: int
    lines_skipped: int
    time_basis: str
    home_day: date  # where lines with no time of their own are accounted
    days: list[date]
    rows_by_day: dict[date, int]  # samples per UTC day (before duplicates are resolved)
    samples: pl.LazyFrame
    quarantine: pl.LazyFrame


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def list_landing(
    raw_root: str | os.PathLike, memo: str | os.PathLike | None = None
) -> list[LandingFile]:
    """Every regular, non-hidden file below the landing root, in path order, with its sha256.

    `memo` (a JSON file) remembers hashes by path, size and modification time, so unchanged
    files are not read again on every run.
    """
    root = Path(raw_root)
    if not root.is_dir():
        return []
    memo_path = Path(memo) if memo else None
    known: dict[str, str] = {}
    if memo_path and memo_path.is_file():
        try:
            known = json.loads(memo_path.read_text())
        except (OSError, ValueError):
            known = {}
    seen: dict[str, str] = {}
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        st = p.stat()
        key = f"{rel.as_posix()}|{st.st_size}|{st.st_mtime_ns}"
        sha = known.get(key) or _sha256(p)
        seen[key] = sha
        out.append(LandingFile(p, rel.as_posix(), sha, st.st_size, st.st_mtime))
    if memo_path and seen != known:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_name(f".{memo_path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(seen))
        tmp.replace(memo_path)
    return out


_ISO_TIME = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})[T_ ](\d{2})[-:]?(\d{2})[-:]?(\d{2})(?:[.,]\d+)?")
_EPOCH = re.compile(r"(?<!\d)(1\d{9}(?:\d{3})?)(?!\d)")
_ISO_DAY = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def time_from_name(name: str) -> datetime | None:
    """A sample time written in a file name: ISO-8601 date-time (UTC) or epoch s/ms."""
    base = Path(name).name
    if m := _ISO_TIME.search(base):
        try:
            return datetime(*map(int, m.groups()), tzinfo=UTC)
        except ValueError:
            pass
    if m := _EPOCH.search(base):
        v = int(m.group(1))
        return datetime.fromtimestamp(v / 1000 if v > 1e11 else v, tz=UTC)
    return None


def day_from_name(name: str) -> date | None:
    if m := _ISO_DAY.search(Path(name).name):
        try:
            return date(*map(int, m.groups()))
        except ValueError:
            return None
    return None


UTF8_BOM = b"\xef\xbb\xbf"


def _read_bytes(lf: LandingFile) -> tuple[bytes | None, str | None]:
    """(content as UTF-8 bytes, None), gunzipped, or (None, why the file cannot be read as text).

    Byte-order marks (Excel, Windows tools) are dropped; UTF-16 (PowerShell's `>`) is re-encoded.
    """
    data = lf.path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            return None, f"corrupt or truncated gzip: {e}"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError as e:
            return None, f"UTF-16 text that does not decode ({e.reason} at byte {e.start})"
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM) :]
    if b"\x00" in data[:65536]:
        return None, "binary content (NUL bytes): not a telemetry export"
    return data, None


def _decode(data: bytes) -> tuple[str | None, str | None]:
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text ({e.reason} at byte {e.start}): not a telemetry export"


# Exports people have that carry no usable time series: named, so the reason is precise.
UNSUPPORTED = (
    (
        re.compile(r"^\s*<\?xml|<nvidia_smi_log"),
        "nvidia-smi -q -x XML is a point-in-time report, not a time series; "
        "export with nvidia-smi --query-gpu=timestamp,uuid,... --format=csv instead",
    ),
    (
        re.compile(r"^\s*=+NVSMI LOG=+", re.M),
        "nvidia-smi -q text report is not a time series; "
        "export with nvidia-smi --query-gpu=timestamp,uuid,... --format=csv instead",
    ),
    (
        re.compile(r"^\s*#\s*(gpu|Entity)\s+\S+", re.M),
        "nvidia-smi dmon / dcgmi dmon output has no timestamps; "
        "run it with -o DT (nvidia-smi) or export through dcgm-exporter instead",
    ),
)


def detect_format(text: str, name: str) -> str | None:
    """The parser for this text, judged by its content; None when no parser fits."""
    head = text[:65536]
    if not head.strip():
        return "empty"
    for fmt, module in FORMATS.items():
        if module.detect(head, name):
            return fmt
    return None


def _whole_file(reason: str, raw: str) -> ParsedLines:
    q = pl.DataFrame(
        {"line": [None], "timestamp": [None], "reason": [reason], "raw": [raw[:2000]]},
        schema=QUARANTINE_LINE_SCHEMA,
    )
    return ParsedLines(pl.DataFrame(schema=LONG_SCHEMA), q, lines_total=1, lines_skipped=0)


def parse_landing_file(lf: LandingFile) -> tuple[str, ParsedLines]:
    """Read, detect and parse one landing file; a file no parser fits is quarantined whole."""
    data, why = _read_bytes(lf)
    if data is None:
        return "unreadable", _whole_file(why or "unreadable", repr(lf.path.read_bytes()[:200]))
    head = data[:65536].decode("utf-8", errors="ignore")  # for detection; the parsers validate all
    fmt = detect_format(head, lf.source_file)
    if fmt == "empty":
        n = len(data.splitlines())
        return fmt, ParsedLines(
            pl.DataFrame(schema=LONG_SCHEMA), pl.DataFrame(schema=QUARANTINE_LINE_SCHEMA), n, n
        )
    if fmt != "dcgm_exposition":  # exposition is read from bytes by Polars; the rest wants text
        text, why = _decode(data)
        if text is None:
            return "unreadable", _whole_file(why, repr(data[:200]))
    if fmt is None:
        reason = next((r for rx, r in UNSUPPORTED if rx.search(head)), None)
        return "unknown", _whole_file(
            reason
            or "unrecognized format: not dcgm-exporter exposition, Prometheus API JSON, nvidia-smi "
            "--query-gpu CSV, NVML samples or the seed CSV; file quarantined whole",
            text,
        )
    named = time_from_name(lf.source_file)
    ctx = Context(
        source_file=lf.source_file,
        # a single scrape saved with no time anywhere: its modification time is the best guess,
        # and ingest_log.time_basis says so (formats with a time column never use it)
        file_time=named or datetime.fromtimestamp(lf.mtime, UTC),
        file_time_basis="file_name" if named else "file_mtime",
        csv_timezone=csv_timezone(),
    )
    try:
        out = FORMATS[fmt].parse(data if fmt == "dcgm_exposition" else text, ctx)
    except Exception as e:  # a parser that gives up on a file quarantines it whole, with why
        return fmt, _whole_file(f"{fmt}: {e}", head)
    return fmt, ParsedLines(
        conform(out.samples, LONG_SCHEMA),
        conform(out.quarantine, QUARANTINE_LINE_SCHEMA),
        out.lines_total,
        out.lines_skipped,
        out.time_basis,
    )


def csv_timezone() -> str:
    return os.environ.get("GPU_PIPELINE_CSV_TIMEZONE", "UTC")


def _cache_key(lf: LandingFile) -> str:
    # everything that changes what a parse yields: the parser, the content, the name (it may
    # carry the sample time) and the zone zone-less CSV times are read in
    return hashlib.sha256(
        f"{PARSER_VERSION}\0{lf.sha256}\0{Path(lf.source_file).name}\0{csv_timezone()}".encode()
    ).hexdigest()[:32]


def is_cached(lf: LandingFile, cache_root: str | os.PathLike) -> bool:
    return (Path(cache_root) / _cache_key(lf) / "meta.json").is_file()


def load_or_parse(lf: LandingFile, cache_root: str | os.PathLike) -> ParsedFile:
    """The parse of `lf`, from the cache when this content was parsed before."""
    cdir = Path(cache_root) / _cache_key(lf)
    meta_path = cdir / "meta.json"
    if not meta_path.is_file():
        try:
            fmt, parsed = parse_landing_file(lf)
            per_day = (
                parsed.samples.group_by(pl.col("timestamp").dt.date().alias("d"))
                .len()
                .drop_nulls("d")
                .sort("d")
            )
            rows_by_day = dict(zip(per_day["d"].to_list(), per_day["len"].to_list(), strict=True))
        except Exception as e:  # noqa: BLE001 - one file's failure stays that file's
            fmt, parsed = (
                "unreadable",
                _whole_file(f"could not be parsed: {type(e).__name__}: {e}", ""),
            )
            rows_by_day = {}
        days = sorted(rows_by_day)
        home = (
            (days[0] if days else None)
            or day_from_name(lf.source_file)
            or datetime.fromtimestamp(lf.mtime, UTC).date()
        )
        tmp = Path(cache_root) / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        parsed.samples.sort("timestamp", "line").write_parquet(
            tmp / "samples.parquet", row_group_size=65536
        )
        parsed.quarantine.write_parquet(tmp / "quarantine.parquet")
        meta = {
            "format": fmt,
            "lines_total": parsed.lines_total,
            "lines_skipped": parsed.lines_skipped,
            "time_basis": parsed.time_basis,
            "home_day": home.isoformat(),
            "days": [d.isoformat() for d in days],
            "rows_by_day": {d.isoformat(): n for d, n in rows_by_day.items()},
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(cdir)
        except OSError:  # another run cached the same file meanwhile: same content, keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads(meta_path.read_text())
    return ParsedFile(
        file=lf,
        format=meta["format"],
        lines_total=meta["lines_total"],
        lines_skipped=meta["lines_skipped"],
        time_basis=meta["time_basis"],
        home_day=date.fromisoformat(meta["home_day"]),
        days=[date.fromisoformat(d) for d in meta["days"]],
        rows_by_day={date.fromisoformat(d): n for d, n in meta.get("rows_by_day", {}).items()},
        samples=pl.scan_parquet(cdir / "samples.parquet"),
        quarantine=pl.scan_parquet(cdir / "quarantine.parquet"),
    )


@dataclass
class DayIngest:
    gpu_samples: pl.DataFrame
    quarantine: pl.DataFrame
    ingest_log: pl.DataFrame


def _in_day(day: date) -> pl.Expr:
    return pl.col("timestamp").dt.date() == day


def assemble_day(files: list[ParsedFile], day: date) -> DayIngest:
    """Dedupe, pivot and account one UTC day of the parsed landing files."""
    longs, quars, metas = [], [], []
    for order, pf in enumerate(files):
        src = pf.file.source_file
        dir_cluster = pf.file.dir_cluster or DEFAULT_CLUSTER
        if day in pf.days:
            longs.append(
                pf.samples.filter(_in_day(day)).with_columns(
                    pl.lit(src).alias("source_file"),
                    pl.lit(order).alias("file_order"),
                    pl.col("cluster").fill_null(dir_cluster),
                )
            )
        q = pf.quarantine.filter(
            _in_day(day) | (pl.col("timestamp").is_null() & pl.lit(pf.home_day == day))
        ).with_columns(pl.lit(src).alias("source_file"))
        quars.append(q)
        metas.append(
            {
                "source_file": src,
                "file_order": order,
                "format": pf.format,
                "time_basis": pf.time_basis,
                "sha256": pf.file.sha256,
                "file_bytes": pf.file.size,
                "file_lines": pf.lines_total,
                "lines_skipped": pf.lines_skipped if pf.home_day == day else 0,
                "home": pf.home_day == day,
            }
        )

    long = (
        collect_stable(pl.concat(longs))
        if longs
        else pl.DataFrame(schema={**LONG_SCHEMA, "source_file": pl.String, "file_order": pl.Int32})
    )
    long = long.sort("file_order", "line").with_columns(
        (
            ~pl.struct("gpu_uuid", "gpu_instance_id", "column", "timestamp").is_first_distinct()
        ).alias("dup")
    )
    quarantine = (
        collect_stable(pl.concat(quars)).sort("source_file", "line", nulls_last=False)
        if quars
        else pl.DataFrame(schema={**QUARANTINE_LINE_SCHEMA, "source_file": pl.String})
    )

    accepted = long.filter(~pl.col("dup"))
    wide = accepted.pivot(
        on="column",
        on_columns=list(FIELD_COLUMNS),
        index=list(KEY),
        values="value",
        aggregate_function="first",
    )
    attrs = [c for c in ATTR_COLUMNS if c not in KEY]
    ids = accepted.group_by(list(KEY)).agg(
        *[pl.col(c).drop_nulls().first() for c in attrs], pl.col("source_file").first()
    )
    gpu_samples = (
        ids.join(wide, on=list(KEY), how="left", nulls_equal=True)
        .with_columns(pl.lit(day).alias("date"))
        .sort(*SAMPLE_ORDER, nulls_last=False)
    )
    gpu_samples = conform(gpu_samples, GPU_SAMPLES_SCHEMA)

    counts = long.group_by("source_file").agg(
        (~pl.col("dup")).sum().alias("rows_accepted"),
        pl.col("dup").sum().alias("rows_duplicate"),
        pl.col("timestamp").min().alias("first_sample"),
        pl.col("timestamp").max().alias("last_sample"),
    )
    qcounts = quarantine.group_by("source_file").agg(pl.len().alias("rows_quarantined"))
    log = (
        pl.DataFrame(metas, schema=META_SCHEMA)
        .join(counts, on="source_file", how="left")
        .join(qcounts, on="source_file", how="left")
        .with_columns(
            pl.col("rows_accepted", "rows_duplicate", "rows_quarantined")
            .fill_null(0)
            .cast(pl.Int64)
        )
        .filter(
            pl.col("home")
            | (pl.col("rows_accepted") + pl.col("rows_duplicate") + pl.col("rows_quarantined") > 0)
        )
        .with_columns(
            (pl.col("rows_accepted") + pl.col("rows_duplicate") + pl.col("rows_quarantined")).alias(
                "rows_read"
            ),
            pl.lit(day).alias("date"),
        )
        .sort("file_order")
    )
    return DayIngest(
        gpu_samples=gpu_samples,
        quarantine=conform(quarantine.with_columns(pl.lit(day).alias("date")), QUARANTINE_SCHEMA),
        ingest_log=conform(log, INGEST_LOG_SCHEMA),
    )


def hash_memo(cache_root: str | os.PathLike) -> Path:
    return Path(cache_root) / "_hashes.json"
