"""The landing zone: list its files (safely), read each one's bytes (gzip, BOM, UTF-16, size
limit), detect its format by content and parse it into long samples and quarantine records."""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import os
import re
import stat
import uuid
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl

from gpu_pipeline import native
from gpu_pipeline.lib.ingest.formats import FORMATS, exposition, prom_json
from gpu_pipeline.lib.ingest.formats.common import Context
from gpu_pipeline.lib.samples import (
    KEYED_SCHEMA,
    LONG_SCHEMA,
    QUARANTINE_LINE_SCHEMA,
    ParsedLines,
    conform,
)
from gpu_pipeline.settings import Settings

DEFAULT_CLUSTER = "default"


# a landing file larger than this (decompressed) is quarantined whole, not read into memory
MAX_FILE_BYTES = Settings.max_file_mb * 2**20


@dataclass(frozen=True)
class ParseOptions:
    """Everything besides a file's bytes and name that changes what its parse yields (so all of
    it is in the parse cache's key): the zone zone-less CSV times are read in, and the size
    above which a file is quarantined whole instead of read."""

    csv_timezone: str = Settings.csv_timezone
    max_file_bytes: int = MAX_FILE_BYTES

    def __post_init__(self) -> None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.csv_timezone)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(f"unknown CSV time zone {self.csv_timezone!r}") from e
        if self.max_file_bytes < 1:
            raise ValueError(f"the largest file must be a positive size, not {self.max_file_bytes}")


DEFAULT_PARSE = ParseOptions()


# quarantine keeps this much of a rejected line's or file's text
RAW_CHARS = 2000


@dataclass(frozen=True)
class LandingFile:
    path: Path
    source_file: str  # path relative to the landing root, POSIX style (\xNN for non-UTF-8 bytes)
    sha256: str  # of the content; "" when it cannot be read
    size: int
    mtime: float
    problem: str | None = None  # why the file is not read (a link out of the zone, an OS error)
    skipped: str | None = None  # why it is listed but not read (hidden): no record, not rejected
    header: str | None = None  # the header line of a `header.csv` in the same folder
    # what is opened: the file, or a link's target as resolved at listing, and that file's
    # (device, inode) as listed: a read checks it opened the very file that was listed
    target: Path | None = None
    ident: tuple[int, int] | None = None
    # the hash memo's key of the file as listed (path, size, times, inode): a parse that hashes
    # the bytes it reads remembers their hash under it (`remember_hashes`)
    memo_key: str | None = None

    @property
    def hashed(self) -> bool:
        """Whether `sha256` is known: a file listed with `hash_new=False` that the memo did not
        know has none until it is parsed (the parse hashes the bytes it reads)."""
        return bool(self.sha256)

    @property
    def dir_cluster(self) -> str | None:
        """The first folder below the landing root names the cluster when labels don't."""
        parts = self.source_file.split("/")
        return parts[0] if len(parts) > 1 else None


def _sha256(path: Path) -> str:
    """The sha256 of a file of our own (the parse cache's Parquet files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class Changed(OSError):
    """The file opened is not the file listed: a link or file swapped between the two."""


CHANGED = (
    "changed between listing and reading (a link or file swapped during the run): not read; "
    "the next run lists it again"
)


def open_landing(target: Path, ident: tuple[int, int]):
    """Open a listed landing file for reading, once: never through a link (O_NOFOLLOW), never a
    FIFO (no blocking open), and only the very file listed (its device and inode); else
    `Changed`."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.ENXIO):
            raise Changed(e.errno, CHANGED) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != ident:
            raise Changed(errno.ESTALE, CHANGED)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# how much of each new file `learn_series` reads ahead of its parse
HEAD_BYTES = 64 * 2**10


def learn_series(files: Iterable[LandingFile]) -> int:
    """The series the exposition files among `files` name in their first HEAD_BYTES, parsed in
    one table before the files are (`exposition.learn_series`: each file's parse then takes its
    series' rows from it). A file is opened as its parse opens it (`open_landing`); one that
    cannot be, is gzipped or is not exposition text is left out. Returns the series kept."""
    heads = []
    for lf in files:
        if lf.skipped or lf.problem:
            continue
        try:
            with open_landing(lf.target or lf.path, lf.ident or _ident(lf.path)) as f:
                head = f.read(HEAD_BYTES)
        except OSError:
            continue
        head = head[: head.rfind(b"\n") + 1]
        if head and exposition.detect(head, lf.source_file):
            heads.append(head)
    return exposition.learn_series(heads)


def _hash_listed(entry: tuple[Path, tuple[int, int]]) -> str | OSError:
    """The sha256 of a listed file, read through `open_landing`; the error when it can't be."""
    try:
        h = hashlib.sha256()
        with open_landing(*entry) as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError as e:
        return e


# files read (hashed, parsed) at a time: small files keep one core busy each
WORKERS = max(1, min(4, os.cpu_count() or 1))


def display_name(rel: str | os.PathLike) -> str:
    """A landing path as text: bytes that are not UTF-8 are shown as backslash-x escapes."""
    return os.fsencode(os.fspath(rel)).decode("utf-8", "backslashreplace")


def _entries(root: Path, rel: Path = Path()) -> list[tuple[Path, Path, bool]]:
    """(path, path relative to root, hidden) of every entry below `root` that is not a real
    folder, in path order; folders are walked, links to folders are entries (not followed). A
    hidden file or folder (its name starts with a dot: editors' swap files, partial uploads, a
    sync tool's state) is one entry, not walked."""
    out = []
    try:
        items = sorted(os.scandir(root / rel), key=lambda e: os.fsencode(e.name))
    except OSError:
        return out
    for e in items:
        if e.name.startswith("."):
            out.append((Path(e.path), rel / e.name, True))
        elif e.is_dir(follow_symlinks=False):
            out += _entries(root, rel / e.name)
        else:
            out.append((Path(e.path), rel / e.name, False))
    return out


HIDDEN = (
    "hidden {} (its name starts with a dot: an editor's swap file, a partial upload, a tool's "
    "state): not read; rename it without the dot to ingest it"
)
# where `gpu-pipeline pull` writes a day before it moves it in whole (lib/ingest/pull.py)
PULL_STAGING = re.compile(r"\.\d{4}-\d\d-\d\d\.\d+\.[0-9a-f]+\.partial")
PULL_STAGING_WHY = (
    "a pull's unfinished day (gpu-pipeline pull moves a day in only when every query has "
    "answered; this one was stopped): not read, and removed by the next pull"
)
# a headerless CSV (nvidia-smi --format=csv,noheader) takes its header from this file beside it
HEADER_FILE = "header.csv"


def _sidecar_header(path: Path, real_root: Path) -> str | None:
    """The first non-blank line of a `header.csv` (at most 64 KiB read), None when it can't be
    read the way landing files are (a link out of the zone, not a regular file)."""
    why, st, target = _refusal(path, real_root)
    if why:
        return None
    try:
        with open_landing(target, (st.st_dev, st.st_ino)) as f:
            head = f.read(65536).decode("utf-8", "replace").lstrip("\ufeff")
    except OSError:
        return None
    return next((ln.strip() for ln in head.splitlines() if ln.strip()), None)


def _refusal(path: Path, real_root: Path) -> tuple[str | None, os.stat_result | None, Path | None]:
    """(why `path` is not read, None, None) or (None, the stat of what is read, its path): the
    file itself, or a link's target resolved now, which must stay in the zone. What is read
    later is checked to be this very file (`open_landing`)."""
    try:
        lst = os.lstat(path)
        target = path
        if stat.S_ISLNK(lst.st_mode):
            try:
                target = Path(os.path.realpath(path, strict=True))
            except OSError as e:
                why = os.strerror(e.errno) if e.errno else str(e)
                return (
                    f"symbolic link that cannot be followed ({why}: dangling or a loop)",
                    None,
                    None,
                )
            if not target.is_relative_to(real_root):
                return "symbolic link to a file outside the landing zone: not followed", None, None
            lst = os.lstat(target)
        elif not Path(os.path.realpath(path)).is_relative_to(real_root):
            return "reached through a folder that leaves the landing zone: not read", None, None
        if stat.S_ISDIR(lst.st_mode):
            return "symbolic link to a folder: not followed", None, None
        if not stat.S_ISREG(lst.st_mode):
            kind = "FIFO" if stat.S_ISFIFO(lst.st_mode) else "socket or device"
            return f"not a regular file ({kind}): not read", None, None
        return None, lst, target
    except OSError as e:
        return f"cannot be read: {e.strerror or e}", None, None


class LandingRootError(OSError):
    """The landing zone itself cannot be read: a run must not go on as if it were empty."""


def check_landing_root(raw_root: str | os.PathLike) -> Path:
    """The landing root as a readable local folder, else LandingRootError with one line: a run
    that cannot see its input must fail, never replace a day's partitions with empty ones."""
    text = os.fspath(raw_root)
    if "://" in text:
        raise LandingRootError(
            f"landing zone {text}: only s3:// object-store landing zones are read: point "
            "GPU_PIPELINE_RAW at s3://bucket/prefix, a local folder or a mounted volume"
        )
    root = Path(text)
    try:
        if not root.exists():
            raise LandingRootError(
                f"landing zone {root} does not exist (a volume not mounted? GPU_PIPELINE_RAW, "
                "--raw): nothing was read and no partition was changed"
            )
        if not root.is_dir():
            raise LandingRootError(f"landing zone {root} is not a folder")
        os.scandir(root).close()
    except PermissionError:
        raise LandingRootError(f"landing zone {root} cannot be read: permission denied") from None
    return root


def list_landing(
    raw_root: str | os.PathLike, memo: str | os.PathLike | None = None, hash_new: bool = True
) -> list[LandingFile]:
    """Every non-hidden file below the landing root, in path order, with its sha256.

    A file that cannot be read — a link leaving the landing zone (never followed), a dangling link
    or loop, a FIFO or device, an OS error — is listed with its `problem` and quarantined whole:
    it never stops the other files. `memo` (a JSON file) remembers hashes by path, size,
    modification and change time and inode, so unchanged files are not read again; an edit that
    restores the modification time still changes the change time, which nothing can set back.

    `hash_new=False`: files the memo does not know are listed without their hash (`sha256`
    ""), for a caller that parses them right away: the parse hashes the bytes it reads, once,
    and `remember_hashes` puts that hash in the memo (reading every new file twice, to hash it
    and then to parse it, took 3.4 s of a 1,000-GPU day's 29).
    """
    root = Path(raw_root)
    if not root.is_dir():
        return []
    real_root = root.resolve()
    memo_path = Path(memo) if memo else None
    known = _read_memo(memo_path)
    seen: dict[str, str] = {}
    out = []
    entries = []
    headers: dict[Path, str | None] = {}
    walk = _entries(root)
    order = {e[0]: i for i, e in enumerate(walk)}
    for path, rel, hidden in walk:
        name = display_name(rel.as_posix())
        if hidden:
            out.append(_hidden_file(path, name))
            continue
        if path.name == HEADER_FILE:
            headers[path.parent] = _sidecar_header(path, real_root)
        why, st, target = _refusal(path, real_root)
        key = None if why else f"{name}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
        ident = None if why else (st.st_dev, st.st_ino)
        entries.append((path, name, why, st, key, target, ident))
    hashed = _hash_new(entries, known) if hash_new else {}
    for path, name, why, st, key, target, ident in entries:
        if why is None:
            sha = known.get(key) or hashed.get(path, "")
            if isinstance(sha, Changed):
                why = CHANGED
            elif isinstance(sha, OSError):
                why = f"cannot be read: {sha.strerror or sha}"
            else:
                if sha:
                    seen[key] = sha
                header = headers.get(path.parent) if path.name != HEADER_FILE else None
                out.append(
                    LandingFile(
                        path,
                        name,
                        sha,
                        st.st_size,
                        st.st_mtime,
                        header=header,
                        target=target,
                        ident=ident,
                        memo_key=key,
                    )
                )
                continue
        out.append(_unread_file(path, name, why))
    out.sort(key=lambda f: order[f.path])  # the walk's path order
    if memo_path and (seen != known if hash_new else not seen.items() <= known.items()):
        # without hash_new, the memo keeps what it knew of files not hashed yet: the parse
        # adds them (a file gone from the zone is dropped by the next full listing)
        _write_memo(memo_path, seen if hash_new else {**known, **seen})
    return out


def remember_hashes(memo: str | os.PathLike, files: list[LandingFile]) -> None:
    """Add the hashes of `files` (as their parse read them) to the memo, each under the key
    the file was listed with. A file changed after it was listed has another key now (its
    change time moved), so a hash is never remembered for content it was not of."""
    memo_path = Path(memo)
    known = _read_memo(memo_path)
    new = {f.memo_key: f.sha256 for f in files if f.memo_key and f.sha256}
    if not new.items() <= known.items():
        _write_memo(memo_path, {**known, **new})


def _read_memo(memo_path: Path | None) -> dict[str, str]:
    """The hashes `list_landing` remembered (memo key -> sha256); none when there is no memo
    or it cannot be read."""
    if memo_path and memo_path.is_file():
        try:
            return json.loads(memo_path.read_text())
        except (OSError, ValueError):
            return {}
    return {}


def _write_memo(memo_path: Path, seen: dict[str, str]) -> None:
    """Replace the memo with `seen`, atomically (a temporary file beside it, renamed)."""
    memo_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo_path.with_name(f".{memo_path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(seen))
    tmp.replace(memo_path)


def _hidden_file(path: Path, name: str) -> LandingFile:
    """A hidden file or folder, listed as skipped with the reason (not read)."""
    try:
        lst = os.lstat(path)
        kind, mtime = ("folder" if stat.S_ISDIR(lst.st_mode) else "file"), lst.st_mtime
    except OSError:
        kind, mtime = "file", datetime.now(UTC).timestamp()
    if kind == "folder" and PULL_STAGING.fullmatch(path.name):
        return LandingFile(path, name, "", 0, mtime, skipped=PULL_STAGING_WHY)
    return LandingFile(path, name, "", 0, mtime, skipped=HIDDEN.format(kind))


def _unread_file(path: Path, name: str, why: str) -> LandingFile:
    """A file that cannot be read, listed with its `problem` (quarantined whole)."""
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        mtime = datetime.now(UTC).timestamp()
    return LandingFile(path, name, "", 0, mtime, problem=why)


def _hash_new(entries: list[tuple], known: dict[str, str]) -> dict[Path, str | OSError]:
    """By path, the sha256 of each readable entry the memo does not know, or the OSError met
    reading it (`Changed`: not the file listed); read and hashed a few at a time (hashlib
    releases the GIL)."""
    new = [e for e in entries if e[4] is not None and e[4] not in known]
    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(
            zip(
                [e[0] for e in new],
                pool.map(_hash_listed, [(e[5], e[6]) for e in new]),
                strict=True,
            )
        )


_ISO_TIME = re.compile(
    r"(\d{4})-?(\d{2})-?(\d{2})[-T_ ](\d{2})[-:]?(\d{2})[-:]?(\d{2})(?:[.,]\d+)?"
    r"(?:Z|([+-])(\d{2})[:-]?(\d{2})(?!\d))?"
)


_EPOCH = re.compile(r"(?<!\d)(1\d{9}(?:\d{3})?)(?!\d)")


_ISO_DAY = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def _name_zone(sign: str | None, hh: str | None, mm: str | None) -> timezone:
    """The zone after a time in a file name: its offset (`+01:00`, `-0500`, `+01-00`) when it
    is one a zone has (up to 14 h, in quarter hours), else UTC (`Z`, nothing, or digits that
    are not an offset: a counter)."""
    if sign is None or int(hh) > 14 or int(mm) not in (0, 15, 30, 45):
        return UTC
    offset = timedelta(hours=int(hh), minutes=int(mm))
    return timezone(-offset if sign == "-" else offset)


def time_from_name(name: str) -> datetime | None:
    """A sample time written in a file name: ISO-8601 date-time (UTC unless it names its
    offset: an offset was dropped, filing a scrape hours off, adversarial review) or epoch
    s/ms."""
    base = Path(name).name
    if m := _ISO_TIME.search(base):
        try:
            local = datetime(*map(int, m.groups()[:6]), tzinfo=_name_zone(*m.groups()[6:]))
            return local.astimezone(UTC)
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


def _plausible(t: datetime | None, window: tuple[int, int]) -> bool:
    return t is not None and window[0] <= t.timestamp() * 1000 <= window[1]


def home_day(days: list[date], name: str, mtime: float) -> date:
    """Where a file's records without a time of their own are accounted: its first day of
    samples, else a plausible date in its name, else its plausible modification day, else today
    (a file stamped 1970 or 2100 never opens a day of its own)."""
    if days:
        return days[0]
    window = Context("").time_window()
    named = day_from_name(name)
    if named and _plausible(datetime(named.year, named.month, named.day, tzinfo=UTC), window):
        return named
    m = datetime.fromtimestamp(mtime, UTC)
    return m.date() if _plausible(m, window) else datetime.now(UTC).date()


UTF8_BOM = b"\xef\xbb\xbf"


GZIP_MAGIC = b"\x1f\x8b"


class _Hashing:
    """A file object that hashes every byte read through it."""

    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        b = self.f.read(size)
        self.h.update(b)
        self.n += len(b)
        return b

    def read_whole(self, size: int) -> tuple[bytes, bool | None]:
        """The rest of the file, `size` bytes as it was opened (more or less if it changed
        since), each chunk hashed as it is read; and whether it is plain text (None: not told,
        `native.read_whole`)."""
        data, plain = native.read_whole(self.f, size, self.h.update)
        self.n += len(data)
        if len(data) == size and (more := self.read()):  # it grew since: the rest as well
            return data + more, None
        return data, plain

    def drain(self) -> None:
        """Read (and hash) the rest, so the hash is the whole file's."""
        while self.read(1 << 22):
            pass


@dataclass(frozen=True)
class Read:
    """What reading a landing file gave: its text as UTF-8 bytes (None: not readable as text,
    `why`), the sha256 of the bytes read, and their first 200 bytes (for the quarantine)."""

    data: bytes | None
    why: str | None
    sha256: str
    head: bytes
    size: int  # bytes read from the file (before gunzip)


class _Prefixed:
    """`f` with `head` (already read from it) put back in front."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def read(self, size: int = -1) -> bytes:
        if self.head:
            out, self.head = self.head, b""
            return out + (self.f.read(size - len(out)) if size > len(out) else b"")
        return self.f.read(size)


def _ident(path: Path) -> tuple[int, int]:
    """The (device, inode) of a file given by path only (tests, callers without a listing)."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino


_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 13)) + b"\x7f"


def _looks_binary(head: bytes) -> bool:
    """Binary, not text with a stray bad byte (that line alone is quarantined): more than 1 % NUL
    bytes, or more than 5 % control bytes."""
    if not head:
        return False
    controls = len(head) - len(head.translate(None, _CONTROL))
    return head.count(0) * 100 > len(head) or controls * 20 > len(head)


def _binary_head(head: bytes) -> bool:
    """`_looks_binary` of a file's first bytes, UTF-16 (with its BOM) read as the text it is:
    half its bytes are NUL, and a gzipped UTF-16 export was refused as binary (adversarial
    review)."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        even = head[: len(head) // 2 * 2]
        return _looks_binary(even.decode("utf-16", "replace").encode("utf-8"))
    return _looks_binary(head)


def _bad_lines(data: bytes) -> tuple[bytes, list[tuple[int, str, str]]]:
    """Blank out lines with NUL bytes or invalid UTF-8 (numbering kept): (clean data, and for
    each such line (number, reason, its text with the bad bytes escaped))."""
    if native.plain_text(data):  # the common case, in one pass outside Python's lock
        return data, []
    if b"\x00" not in data:
        if data.isascii():  # the common case, checked at memory speed: valid UTF-8
            return data, []
        try:
            data.decode("utf-8")
            return data, []
        except UnicodeDecodeError:
            pass
    lines = data.split(b"\n")
    bad = []
    for i, ln in enumerate(lines):
        why = None
        if b"\x00" in ln:
            why = "line has NUL bytes: not text"
        else:
            try:
                ln.decode("utf-8")
            except UnicodeDecodeError as e:
                why = f"line is not UTF-8 text ({e.reason} at byte {e.start})"
        if why:
            bad.append((i + 1, why, ln.decode("utf-8", "backslashreplace")[:RAW_CHARS]))
            lines[i] = b""
    return b"\n".join(lines), bad


def _decode(data: bytes) -> tuple[str | None, str | None]:
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text ({e.reason} at byte {e.start}): not a telemetry export"


# Exports people have that carry no usable time series: named, so the reason is precise.
UNSUPPORTED = (
    (
        re.compile(r"^\s*=+NVSMI LOG=+", re.M),
        "nvidia-smi -q text report: not read (its XML form, nvidia-smi -q -x, is a sample at its "
        "timestamp; a loop of nvidia-smi --query-gpu=timestamp,uuid,... --format=csv a time "
        "series)",
    ),
    (
        re.compile(r"^\s*#\s*(Time\s+)?gpu\s+\S+", re.M),
        "nvidia-smi dmon output without dates: run it with -o DT (date and time on each row), "
        "or log with nvidia-smi --query-gpu=timestamp,uuid,utilization.gpu,power.draw "
        "--format=csv -l 1",
    ),
    (
        re.compile(r"^\s*#\s*Entity\s+\S+", re.M),
        "dcgmi dmon output has no timestamps: export through dcgm-exporter instead",
    ),
)


# formats read line by line: a bad line is quarantined alone; JSON and XML are one document
LINE_FORMATS = {"dcgm_exposition", "nvidia_smi_csv", "nvml_samples", "seed_csv", "nvidia_smi_dmon"}


def detect_format(data: bytes, name: str) -> str | None:
    """The parser for this content, judged by the whole of it (each format looks at as much as
    it needs); None when no parser fits."""
    if re.search(rb"\S", data) is None:
        return "empty"
    if Path(name).name == HEADER_FILE:
        return "csv_header"
    for fmt, module in FORMATS.items():
        if module.detect(data, name):
            return fmt
    return None


# a file no format fits may be one whose first lines hide it: a logger's banner or comment, the
# status line and headers `curl -i` writes. At most this many lines, ending in the first
# JUNK_BYTES, are tried (each line a record of its own, quarantined with JUNK_WHY)
JUNK_LINES = 20
JUNK_BYTES = 4096
JUNK_WHY = (
    "a line above the file's {} content that no format reads (a logger's banner or comment, "
    "the status line or a header `curl -i` writes): not telemetry"
)


def _past_junk(clean: bytes, name: str) -> tuple[str | None, int]:
    """(format, n) of a file no format fits as a whole (`detect_format` None) whose text after
    its first n lines is a format's: the fewest such lines, at most JUNK_LINES within
    JUNK_BYTES; (None, 0) when there are none. A file whose first lines a format reads as its
    own (`# HELP`, `#Date Time gpu`) is detected whole and never comes here; a dmon log without
    dates stays unknown (its rows are no format's without their header either)."""
    end = 0
    for n in range(1, JUNK_LINES + 1):
        end = clean.find(b"\n", end, JUNK_BYTES) + 1
        if not end:
            break
        if detect_format(clean[end : end + 65536], name) in FORMATS:  # a cheap look first
            fmt = detect_format(clean[end:], name)
            if fmt in FORMATS:
                return fmt, n
    return None, 0


def _after_lines(data: bytes, n: int) -> int:
    """Where the text after the first `n` lines of `data` starts."""
    end = 0
    for _ in range(n):
        end = data.find(b"\n", end) + 1
    return end


# times a file rejected whole may still name: ISO-8601 / nvidia-smi date-times, ctime (XML),
# and epoch seconds or milliseconds where exports write them (a JSON [t, "v"] pair, the end of
# an exposition line, the first cell of a CSV row)
_NAMED_TIMES = re.compile(
    r"(?P<iso>(?:19|20)\d\d[-/](?:0[1-9]|1[0-2])[-/](?:0[1-9]|[12]\d|3[01])[T _]\d\d:\d\d)"
    r"|(?P<ymd>(?:19|20)\d\d(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])[ \t]+\d\d:\d\d:\d\d)"
    r"|(?P<ctime>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|"
    r"Dec) +\d{1,2} \d\d:\d\d:\d\d \d{4})"
    r"|\[\s*(?P<pair>1\d{9}(?:\.\d+)?)\s*,"
    r"|[ \t](?P<tail>1\d{9}(?:\d{3})?)[ \t]*\r?$"
    r"|^(?P<cell>1\d{9}(?:\.\d+)?|1\d{12})[ \t]*,",
    re.M,
)
# how much of a rejected file is searched for the times it names: its start and its end
NAMED_SCAN_CHARS = 4 * 2**20


def named_days(text: str) -> list[date]:
    """The plausible UTC days a text names (see _NAMED_TIMES), searched in its first and last
    NAMED_SCAN_CHARS characters; at most 366, the earliest."""
    lo, hi = Context("").time_window()
    parts = (
        [text]
        if len(text) <= 2 * NAMED_SCAN_CHARS
        else [text[:NAMED_SCAN_CHARS], text[-NAMED_SCAN_CHARS:]]
    )
    days: set[date] = set()
    for part in parts:
        for m in _NAMED_TIMES.finditer(part):
            try:
                if m["iso"]:
                    t = datetime.strptime(m["iso"][:10].replace("/", "-"), "%Y-%m-%d")
                    t = t.replace(tzinfo=UTC)
                elif m["ymd"]:
                    t = datetime.strptime(m["ymd"][:8], "%Y%m%d").replace(tzinfo=UTC)
                elif m["ctime"]:
                    t = datetime.strptime(" ".join(m["ctime"].split()), "%a %b %d %H:%M:%S %Y")
                    t = t.replace(tzinfo=UTC)
                else:
                    v = float(m["pair"] or m["tail"] or m["cell"])
                    t = datetime.fromtimestamp(v / 1000 if v >= 1e11 else v, UTC)
            except (ValueError, OverflowError, OSError):
                continue
            if lo <= t.timestamp() * 1000 <= hi:
                days.add(t.date())
    return sorted(days)[:366]


def _whole_file(
    reason: str, raw: str, days: list[date] | None = None, changed: bool = False
) -> ParsedLines:
    """A file rejected as a whole: one record, quarantined on each of the `days` its content
    names (so whoever looks at a day the file held sees it), else on the file's home day."""
    days = days or []
    n = max(1, len(days))
    q = pl.DataFrame(
        {
            "line": [None] * n,
            "timestamp": [datetime(d.year, d.month, d.day, tzinfo=UTC) for d in days] or [None],
            "reason": [reason] * n,
            "raw": [raw[:RAW_CHARS]] * n,
            "field": [None] * n,
            "record_kept": [False] * n,
        },
        schema=QUARANTINE_LINE_SCHEMA,
    )
    return ParsedLines(
        pl.DataFrame(schema=LONG_SCHEMA),
        q,
        lines_total=1,
        lines_skipped=0,
        records_by_day={d: 1 for d in days} if days else {None: 1},
        rejected_whole=True,
        changed=changed,
    )


def _cap_raw(q: pl.DataFrame) -> pl.DataFrame:
    """A quarantined line keeps at most RAW_CHARS of its text (a 50 MB label stays out)."""
    long = pl.col("raw").str.len_chars() > RAW_CHARS
    return q.with_columns(
        pl.when(long)
        .then(
            pl.format(
                "{}… ({} characters)",
                pl.col("raw").str.slice(0, RAW_CHARS),
                pl.col("raw").str.len_chars(),
            )
        )
        .otherwise(pl.col("raw"))
        .alias("raw")
    )


# a line-based file (exposition, CSV) larger than this is parsed this much text at a time, so a
# parse's memory follows the piece, not the file (a 700 MiB scrape's parse peaks at ~0.85 GiB,
# 1.9 GiB read whole); a Prometheus answer is cut between its series (`PieceParse._cut`, and
# into runs of `prom_json.RUN_BYTES`); an XML document, parsed whole, may be at most this large
PIECE_BYTES = 64 * 2**20


class _Stop(Exception):
    """Reading a file stops here; the message is the reason (a quarantine reason)."""


class _Seen:
    """As much of the text a piece parse has read of a file as rejecting it whole needs
    (`whole`): its first NAMED_SCAN_CHARS bytes (a copy) and the last NAMED_SCAN_CHARS read
    after them (views of the chunks that hold them), never the whole file. A gzip cut short or
    a UTF-16 log over a piece was filed on its modification day, with no text (adversarial
    review)."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail: list[memoryview] = []  # the last chunks read after the head
        self.kept = 0  # bytes in `tail`
        self.n = 0  # bytes read

    def add(self, chunk: bytes) -> None:
        self.n += len(chunk)
        rest = memoryview(chunk)
        if len(self.head) < NAMED_SCAN_CHARS:
            room = NAMED_SCAN_CHARS - len(self.head)
            self.head += rest[:room]
            rest = rest[room:]
        if rest:
            self.tail.append(rest)
            self.kept += len(rest)
            while self.kept - len(self.tail[0]) >= NAMED_SCAN_CHARS:
                self.kept -= len(self.tail.pop(0))

    def whole(self, reason: str) -> ParsedLines:
        """The file rejected whole: on the days the text read names, with its first lines."""
        head, tail = bytes(self.head), b"".join(self.tail)[-NAMED_SCAN_CHARS:]
        enc = "utf-8"
        if head[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 (its BOM): read as what it is
            enc = "utf-16-le" if head[:2] == b"\xff\xfe" else "utf-16-be"
            head, tail = head[2:], tail[(self.n - len(tail)) % 2 :]
        text = head.decode(enc, "replace").lstrip("\ufeff")
        days = named_days(text + "\n" + tail.decode(enc, "replace"))
        return _whole_file(reason, text[:RAW_CHARS], days)


def _gunzip_chunks(f, limit: int) -> Iterator[bytes]:
    """Decompressed chunks of a gzip stream (every member), at most 1 MiB each; _Stop past
    `limit` bytes, at binary content or at a corrupt or truncated stream."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    open_member, total, head = False, 0, b""
    try:
        while chunk := f.read(1 << 20):
            while chunk:
                open_member = True
                out = d.decompress(chunk, 1 << 20)
                chunk = d.unconsumed_tail
                total += len(out)
                if total > limit:
                    raise _Stop(f"decompresses to more than {limit:,} bytes: not read")
                if len(head) < 65536:
                    head += out[: 65536 - len(head)]
                    if len(head) >= 65536 and _binary_head(head):  # a bomb of zeros stops here
                        raise _Stop(
                            "binary content (NUL and control bytes): not a telemetry export"
                        )
                if d.eof:  # a member ended; another may follow in the same file
                    chunk = d.unused_data + chunk
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    open_member = False
                if out:
                    yield out
    except zlib.error as e:
        raise _Stop(f"corrupt or truncated gzip: {e}") from None
    if open_member:
        raise _Stop("corrupt or truncated gzip: the stream ends before its end marker")


_JSON_START = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*[\[{]")


class PieceParse:
    """A landing file parsed a piece at a time: iterate for (format, ParsedLines) of each piece,
    lines numbered in the file. The file is opened once (`open_landing`), gunzipped as it is
    read and cut at line ends every `piece_bytes`; afterwards `sha256` and `size` are of the
    bytes read. A file whose content fits one piece, or is one document (JSON, XML), is parsed
    whole, as `parse_landing_file` does. When the file turns out to be rejected as a whole
    after some pieces (a gzip that ends early, a piece its parser gives up on), `rejected`
    holds that one result and the pieces given before it are void. With `keyed`, a piece may
    come keyed by series (`ParsedLines.series`)."""

    def __init__(
        self,
        lf: LandingFile,
        opts: ParseOptions = DEFAULT_PARSE,
        piece_bytes: int = 0,
        keyed: bool = False,
    ):
        self.lf, self.opts, self.keyed = lf, opts, keyed
        self.piece_bytes = piece_bytes or PIECE_BYTES
        self.sha256: str | None = None
        self.size: int | None = None
        self.rejected: tuple[str, ParsedLines] | None = None
        self._plain: bytes | None = None  # the file read whole, when it is plain text
        self._seen = _Seen()  # what a rejection of the whole file keeps of its text
        self._json: bool | None = None  # the text starts as JSON does (`_cut`)
        self.series_cuts = 0  # pieces cut between two series of a JSON answer (`_cut`)

    def _chunks(self, raw) -> Iterator[bytes]:
        """The file's text in chunks: gunzipped (at most 1 MiB a chunk), or as read (a file
        no larger than a piece in one read, the way it was always read)."""
        f = _Hashing(raw)
        self._hashing = f
        self._raw_size = os.fstat(raw.fileno()).st_size
        if self._raw_size <= self.piece_bytes:
            data, plain = f.read_whole(self._raw_size)
            self._plain = data if plain else None
            if data[:2] == GZIP_MAGIC:
                yield from _gunzip_chunks(io.BytesIO(data), self.opts.max_file_bytes)
            elif len(data) > self.opts.max_file_bytes:
                raise _Stop(
                    f"larger than {self.opts.max_file_bytes:,} bytes: not read (max_file_mb)"
                )
            else:
                yield data
            return
        magic = f.read(2)
        if magic == GZIP_MAGIC:
            yield from _gunzip_chunks(_Prefixed(magic, f), self.opts.max_file_bytes)
            return
        if self._raw_size > self.opts.max_file_bytes:
            raise _Stop(f"larger than {self.opts.max_file_bytes:,} bytes: not read (max_file_mb)")
        yield magic
        while chunk := f.read(1 << 22):
            yield chunk

    def _cut(self, buf: bytearray) -> Iterator[bytes]:
        """Whole pieces off the front of `buf`, each cut at its last line end; in a JSON file,
        between two series of an answer where it can be (`prom_json.series_cut`)."""
        if self._json is None:  # told by the text's first byte
            self._json = _JSON_START.match(buf) is not None
        while len(buf) >= self.piece_bytes:
            if self._json and (cut := prom_json.series_cut(buf, self.piece_bytes)):
                self.series_cuts += 1
                yield bytes(buf[:cut])
                del buf[:cut]
                continue
            # the last line end within the piece; a longer line is one piece to its end
            cut = buf.rfind(b"\n", 0, self.piece_bytes) + 1 or buf.find(b"\n") + 1
            if not cut:
                return  # a line longer than what was read so far: read on
            yield bytes(buf[:cut])
            del buf[:cut]

    def _pieces(self, raw) -> Iterator[bytes]:
        buf = bytearray()
        first: bytes | None = None  # the first chunk as read, while it may be the whole text
        given = False
        for chunk in self._chunks(raw):
            self._seen.add(chunk)
            if first is None and not buf and not given:
                first = chunk
                continue
            if first is not None:
                buf += first
                first = None
            buf += chunk
            for piece in self._cut(buf):
                given = True
                yield piece
        if first is not None:
            if len(first) < self.piece_bytes:
                yield first
                return
            buf += first
            for piece in self._cut(buf):
                given = True
                yield piece
        if buf or not given:
            yield bytes(buf)

    def __iter__(self) -> Iterator[tuple[str, ParsedLines]]:
        lf = self.lf
        if lf.skipped or lf.problem:
            yield parse_landing_file(lf, self.opts)
            return
        try:
            with open_landing(lf.target or lf.path, lf.ident or _ident(lf.path)) as raw:
                yield from self._parse(raw)
                if self._hashing is None:  # not read: the listing's hash and size stand
                    self.sha256, self.size = lf.sha256, lf.size
                else:
                    self.sha256, self.size = self._hashing.h.hexdigest(), self._hashing.n
        except Changed:
            self.rejected = ("refused", _whole_file(CHANGED, "", changed=True))
        except OSError as e:
            why = f"cannot be read: {e.strerror or e}"
            self.rejected = ("refused", _whole_file(why, "", changed=True))

    def _drain(self) -> None:
        """Hash the rest (the file's sha256 is of all it holds), unless it is over the size
        limit: then it is not read, and the listing's hash stands."""
        if self._raw_size > self.opts.max_file_bytes:
            self._hashing = None
            return
        self._hashing.drain()

    def _reject(self, fmt: str, parsed: ParsedLines) -> None:
        self.rejected = (fmt, parsed)
        self._drain()

    def _parse(self, raw) -> Iterator[tuple[str, ParsedLines]]:
        pieces = self._pieces(raw)
        try:
            first = next(pieces)
            second = next(pieces, None)
        except _Stop as e:
            self._reject("unreadable", self._seen.whole(str(e)))
            return
        if second is None and len(first) <= self.piece_bytes:  # one piece: the whole file
            if len(first) > prom_json.RUN_BYTES and (framed := self._answer(first)):
                yield from self._answer_pieces(framed[0], None, iter(()), *framed[1:])
                return
            plain = first is self._plain
            yield _parse_read(self.lf, _text_read(first, "", 0), self.opts, self.keyed, plain)
            return
        if first[:2] in (b"\xff\xfe", b"\xfe\xff"):
            why = f"UTF-16 text over {self.piece_bytes:,} bytes: convert it to UTF-8 to read it"
            self._reject("unreadable", self._seen.whole(why))
            return
        if first.startswith(UTF8_BOM):
            first = first[len(UTF8_BOM) :]
        if _looks_binary(first[:65536]):
            why = "binary content (NUL and control bytes): not a telemetry export"
            self._reject("unreadable", _whole_file(why, repr(first[:200])))
            return
        clean, _ = _bad_lines(first)
        fmt, junk = detect_format(clean, self.lf.source_file), 0
        if fmt is None:  # lines above the content that no format reads (`_past_junk`)
            fmt, junk = _past_junk(clean, self.lf.source_file)
        if fmt == "prometheus_json" and self.series_cuts and (frame := prom_json.frame(first)):
            yield from self._answer_pieces(first, second, pieces, *frame)
            return
        if fmt not in LINE_FORMATS:
            text = first.decode("utf-8", "replace")
            if fmt in ("prometheus_json", "nvidia_smi_xml"):
                why = (
                    f"{fmt} document over {self.piece_bytes:,} bytes: not read (a document is "
                    "parsed whole; land smaller ones: shorter pull windows, one snapshot a file)"
                )
            else:
                why = (
                    "unrecognized format: not dcgm-exporter exposition, Prometheus API JSON, "
                    "nvidia-smi --query-gpu CSV or -q -x XML, NVML samples or the seed CSV; file "
                    "quarantined whole"
                )
            self._reject(
                "unknown" if fmt is None else fmt, _whole_file(why, text, named_days(text))
            )
            return
        prefix = _header_prefix(fmt, first[_after_lines(first, junk) :])
        n_prefix = prefix.count(b"\n")
        offset = 0
        times = None  # the first piece's decision on the file's times, for the later ones
        loop = None  # the CSV loop the previous piece ended in (`Context.loop`)
        try:
            rest = [second] if second is not None else []
            for i, piece in enumerate(itertools.chain([first], rest, pieces)):
                data = piece if i == 0 else prefix + piece
                got, out = _parse_text(
                    self.lf, data, self.opts, fmt, self.keyed, times=times, loop=loop, junk=junk
                )
                junk = 0  # the first piece's lines above the content, read with it
                times, loop = out.times or times, out.loop  # `exposition._times_out`
                if out.rejected_whole:  # this piece's parser gave up: the file as a whole
                    self._reject(got, out)
                    return
                shift = offset - (n_prefix if i else 0)
                if i and n_prefix:
                    out.lines_total -= n_prefix
                    out.lines_skipped -= n_prefix
                if shift:
                    out.samples = out.samples.with_columns(pl.col("line") + shift)
                    out.quarantine = out.quarantine.with_columns(pl.col("line") + shift)
                offset += piece.count(b"\n")
                if out.last_header:  # the rows after a header written again, in later pieces
                    prefix, n_prefix = out.last_header.encode() + b"\n", 1
                yield got, out
        except _Stop as e:
            self._reject("unreadable", self._seen.whole(str(e)))

    def _answer(self, text: bytes) -> tuple[bytes, bytes, bytes] | None:
        """A file read whole that is a Prometheus answer too large to parse in one go
        (`prom_json.RUN_BYTES`): (its text without a BOM, `prom_json.frame`); else None."""
        if _JSON_START.match(text) is None:
            return None
        text = text[len(UTF8_BOM) :] if text.startswith(UTF8_BOM) else text
        if detect_format(text[:65536], self.lf.source_file) != "prometheus_json":
            return None
        framed = prom_json.frame(text)
        return (text, *framed) if framed else None

    def _answer_pieces(
        self,
        first: bytes,
        second: bytes | None,
        pieces: Iterator[bytes],
        prefix: bytes,
        close: bytes,
    ) -> Iterator[tuple[str, ParsedLines]]:
        """A Prometheus answer over a piece (cut between its series, `_cut`) or over RUN_BYTES:
        each run of its series (`prom_json.runs`) parsed as an answer of its own, framed by the
        text before the first series (`prefix`) and the brackets it leaves open (`close`);
        records and series numbered on through the file."""
        offset = series = 0
        try:
            rest = [second] if second is not None else []
            runs = prom_json.runs(itertools.chain([first], rest, pieces))
            run = next(runs)
            for i in itertools.count():
                after = next(runs, None)
                body = run if i == 0 else prefix + run.lstrip(b" \t\r\n")[1:]  # its comma
                text = body if after is None else body + close
                got, out = _parse_text(self.lf, text, self.opts, "prometheus_json")
                if out.rejected_whole or got != "prometheus_json":
                    self._reject(got, out)
                    return
                if i:
                    out.samples = out.samples.with_columns(pl.col("line") + offset)
                    out.quarantine = prom_json.renumbered(
                        out.quarantine.with_columns(pl.col("line") + offset), series
                    )
                offset += out.lines_total
                series += prom_json.series_in(run)
                yield got, out
                if after is None:
                    return
                run = after
        except _Stop as e:
            self._reject("unreadable", self._seen.whole(str(e)))


def _header_prefix(fmt: str, first: bytes) -> bytes:
    """The lines a CSV format's later pieces need in front of them: its magic and header."""
    from gpu_pipeline.lib.ingest.formats import nvidia_smi

    lines = first.split(b"\n", 8)
    if fmt == "nvml_samples":
        n = 2
    elif fmt == "seed_csv":
        n = 1
    elif fmt == "nvidia_smi_csv":
        at = next((i for i, ln in enumerate(lines) if ln.strip()), 0)
        header = lines[at].decode("utf-8", "replace")
        n = at + 1 if nvidia_smi._is_header(header.strip("\r")) else 0
    else:
        n = 0
    return b"".join(ln + b"\n" for ln in lines[:n])


def _text_read(data: bytes, sha: str, size: int) -> Read:
    """A `Read` of text read whole: a BOM dropped, UTF-16 re-encoded, binary content refused."""
    head = data[:200]
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError as e:
            why = f"UTF-16 text that does not decode ({e.reason} at byte {e.start})"
            return Read(None, why, sha, head, size)
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM) :]
    if _looks_binary(data[:65536]):
        why = "binary content (NUL and control bytes): not a telemetry export"
        return Read(None, why, sha, head, size)
    return Read(data, None, sha, head, size)


def parse_landing_file(
    lf: LandingFile, opts: ParseOptions = DEFAULT_PARSE
) -> tuple[str, ParsedLines]:
    """Read, detect and parse one landing file (its pieces put together: `PieceParse`); a file
    no parser fits is quarantined whole, on the days its content names (else its home day)."""
    if lf.skipped:  # listed, not read: no record
        return "skipped", ParsedLines(
            pl.DataFrame(schema=LONG_SCHEMA), pl.DataFrame(schema=QUARANTINE_LINE_SCHEMA), 0, 0
        )
    if lf.problem:  # never opened: its content (a link out of the zone) stays unread
        return "refused", _whole_file(lf.problem, "")
    pp = PieceParse(lf, opts)
    parts = list(pp)
    fmt, out = pp.rejected or merge_pieces(parts)
    out.sha256, out.bytes_read = pp.sha256 or lf.sha256, pp.size
    return fmt, out


def merge_pieces(parts: list[tuple[str, ParsedLines]]) -> tuple[str, ParsedLines]:
    """The pieces of one file's parse as one (in the long form)."""
    if len(parts) == 1:
        return parts[0][0], parts[0][1].unkeyed()
    fmt = parts[0][0]
    outs = [p.unkeyed() for _, p in parts]
    records: dict = {}
    for o in outs:
        for d, n in o.records_by_day.items():
            records[d] = records.get(d, 0) + n
    return fmt, ParsedLines(
        pl.concat([o.samples for o in outs]),
        pl.concat([o.quarantine for o in outs]),
        sum(o.lines_total for o in outs),
        sum(o.lines_skipped for o in outs),
        next((o.time_basis for o in outs if o.time_basis != "sample"), "sample"),
        records,
        outs[0].origin,
        outs[0].columns_ignored,
        sorted({f for o in outs for f in o.fields}),
        mig_gpus=sorted({u for o in outs for u in o.mig_gpus}),
    )


def _parse_read(
    lf: LandingFile, read: Read, opts: ParseOptions, keyed: bool = False, plain: bool = False
) -> tuple[str, ParsedLines]:
    """Detect and parse a file read whole (`_text_read`; `plain`: its bytes are known to be
    plain text, `native.read_whole`)."""
    if read.data is None:
        return "unreadable", _whole_file(read.why or "unreadable", repr(read.head))
    return _parse_text(lf, read.data, opts, keyed=keyed, plain=plain)


def _bad_lines_quarantined(bad: list[tuple[int, str, str]]) -> pl.DataFrame:
    """The quarantine records of lines `_bad_lines` blanked out: (number, reason, text) each."""
    return pl.DataFrame(
        {
            "line": [b[0] for b in bad],
            "timestamp": [None] * len(bad),
            "reason": [b[1] for b in bad],
            "raw": [b[2] for b in bad],
            "field": [None] * len(bad),
            "record_kept": [False] * len(bad),
        },
        schema=QUARANTINE_LINE_SCHEMA,
    )


def _parse_text(
    lf: LandingFile,
    data: bytes,
    opts: ParseOptions,
    fmt: str | None = None,
    keyed: bool = False,
    plain: bool = False,
    times: tuple | None = None,
    loop: tuple | None = None,
    junk: int = 0,
) -> tuple[str, ParsedLines]:
    """Parse text (UTF-8 bytes) of `lf` in format `fmt`, detected from it when None (`keyed`:
    exposition samples may come keyed by series, `ParsedLines.series`; `plain`: `data` is known
    to be plain text, no NUL and ASCII only; `times`: a later piece's, as the file's first piece
    decided them, `Context.times`; `loop`: the CSV loop the previous piece ended in,
    `Context.loop`; `junk`: the first lines are not the format's, `_past_junk`)."""
    clean, bad = (data, []) if plain else _bad_lines(data)
    fmt = fmt or detect_format(clean, lf.source_file)
    if fmt is None and lf.header:  # headerless rows in the columns a header.csv beside names
        fmt = detect_format(lf.header.strip("\r\n").encode() + b"\n" + clean, lf.source_file)
        fmt = fmt if fmt == "nvidia_smi_csv" else None
    if fmt is None:  # lines above the content that no format reads: a banner, `curl -i`'s head
        fmt, junk = _past_junk(clean, lf.source_file)
    if bad and (fmt not in LINE_FORMATS or len(bad) * 2 > clean.count(b"\n") + 1):
        text, why = _decode(data)
        readable = data.decode("utf-8", "replace")
        return "unreadable", _whole_file(why or bad[0][1], readable[:200], named_days(readable))
    cut = _after_lines(clean, junk)
    head, data = clean[:cut], clean[cut:]
    if fmt in ("empty", "csv_header"):
        n = len(data.splitlines())
        return fmt, ParsedLines(
            pl.DataFrame(schema=LONG_SCHEMA), pl.DataFrame(schema=QUARANTINE_LINE_SCHEMA), n, n
        )
    # the exposition parser reads the bytes; the others (and the quarantine) need the text
    text = "" if fmt == "dcgm_exposition" else data.decode("utf-8")
    if fmt is None:
        head = text[:65536]
        reason = next((r for rx, r in UNSUPPORTED if rx.search(head)), None)
        return "unknown", _whole_file(
            reason
            or "unrecognized format: not dcgm-exporter exposition, Prometheus API JSON, nvidia-smi "
            "--query-gpu CSV or -q -x XML, NVML samples or the seed CSV; file quarantined whole",
            text,
            named_days(text),
        )
    ctx = _context(lf, opts, times, loop)
    try:
        expo = fmt == "dcgm_exposition"
        out = FORMATS[fmt].parse(data, ctx, keyed) if expo else FORMATS[fmt].parse(text, ctx)
    except Exception as e:  # a parser that gives up on a file quarantines it whole, with why
        text = text or data.decode("utf-8", "replace")
        return fmt, _whole_file(f"{fmt}: {e}", text[:RAW_CHARS], named_days(text))
    quarantine, records, total, skipped = _ledger(out, bad, head, fmt)
    return fmt, ParsedLines(
        conform(out.samples, LONG_SCHEMA if out.series is None else KEYED_SCHEMA),
        _cap_raw(quarantine),
        total,
        skipped,
        out.time_basis,
        records,
        out.origin,
        out.columns_ignored,
        out.fields,
        out.rejected_whole,
        series=out.series,
        times=out.times,
        last_header=out.last_header,
        loop=out.loop,
        mig_gpus=out.mig_gpus,
    )


def _ledger(
    out: ParsedLines, bad: list[tuple[int, str, str]], head: bytes, fmt: str
) -> tuple[pl.DataFrame, dict, int, int]:
    """The parse's quarantine, records per day, lines and skipped lines, with the lines it was
    not given: the `bad` ones (`_bad_lines`: blanked, so one record each, not a skipped blank
    line) and the `head` above the content that no format reads (`_past_junk`: one record a
    line, a blank one skipped; the parse's lines and records are numbered below it). Records
    whose time does not parse are filed on the day their text names (`_on_named_days`)."""
    n = head.count(b"\n")
    if n:
        out.samples = out.samples.with_columns(pl.col("line") + n)
        out.quarantine = out.quarantine.with_columns(pl.col("line") + n)
    quarantine, records = _on_named_days(
        conform(out.quarantine, QUARANTINE_LINE_SCHEMA), dict(out.records_by_day)
    )
    total, skipped = out.lines_total, out.lines_skipped
    if bad:  # the blanked lines: one quarantine record each, not skipped blank lines
        quarantine = pl.concat([quarantine, _bad_lines_quarantined(bad)])
        records[None] = records.get(None, 0) + len(bad)
        skipped -= len(bad)
    if n:
        lines = head.decode("utf-8", "replace").split("\n")[:n]
        why = JUNK_WHY.format(fmt)
        junk = [(i + 1, why, ln.rstrip("\r")) for i, ln in enumerate(lines) if ln.strip()]
        quarantine = pl.concat([_bad_lines_quarantined(junk), quarantine])
        records[None] = records.get(None, 0) + len(junk)
        total, skipped = total + n, skipped + n - len(junk)
    return quarantine, records, total, skipped


# a time that names its day but does not parse (`2025/07/27 25:61:00`), as a quarantine reason
# quotes it: the date at its start (nvidia-smi, ISO-8601, dmon -o DT)
_UNPARSED_DAY = (
    r"^timestamp not understood: '\s*((?:19|20)\d\d)[-/]?(0[1-9]|1[0-2])[-/]?"
    r"(0[1-9]|[12]\d|3[01])[T _]"
)


def _on_named_days(q: pl.DataFrame, records: dict) -> tuple[pl.DataFrame, dict]:
    """Records quarantined because their time does not parse, filed on the plausible day their
    time's text names (its midnight) instead of the file's home day, and counted there
    (`records`, by day). A 07-27 row with an impossible time was filed on the file's first day,
    07-26 (adversarial review)."""
    if not records.get(None) or q.height == 0:
        return q, records
    lo, hi = Context("").time_window()
    ymd = pl.col("reason").str.extract_groups(_UNPARSED_DAY)
    day = pl.concat_str([ymd.struct[i] for i in range(3)], separator="-")
    at = day.str.to_date("%Y-%m-%d", strict=False).cast(pl.Datetime("ms"))
    at = at.dt.replace_time_zone("UTC")
    named = pl.when(pl.col("timestamp").is_null() & at.dt.epoch("ms").is_between(lo, hi))
    # every row of a record (a CSV row's values) with it
    q = q.with_columns(named.then(at).max().over("line").alias("_named"))
    moved = q.filter(pl.col("_named").is_not_null()).unique("line")
    if moved.height == 0 or moved.height > records[None]:
        return q.drop("_named"), records
    records = dict(records)
    for d, n in moved.group_by(pl.col("_named").dt.date()).len().iter_rows():
        records[d] = records.get(d, 0) + n
    records[None] -= moved.height
    if not records[None]:
        del records[None]
    at_named = pl.when(pl.col("timestamp").is_null()).then("_named").otherwise("timestamp")
    return q.with_columns(at_named.alias("timestamp")).drop("_named"), records


def _context(
    lf: LandingFile, opts: ParseOptions, times: tuple | None, loop: tuple | None
) -> Context:
    """What a parser may know of `lf` besides its text (`_parse_text`)."""
    named = time_from_name(lf.source_file)
    return Context(
        source_file=lf.source_file,
        # a single scrape saved with no time anywhere: its modification time is the best guess,
        # and ingest_log.time_basis says so (formats with a time column never use it)
        file_time=named or datetime.fromtimestamp(lf.mtime, UTC),
        file_time_basis="file_name" if named else "file_mtime",
        csv_timezone=opts.csv_timezone,
        csv_header=lf.header,
        times=times,
        loop=loop,
    )


def hash_memo(cache_root: str | os.PathLike) -> Path:
    return Path(cache_root) / "_hashes.json"
