"""Every setting in one place: defaults documented in README "Where data goes", overridable by `GPU_PIPELINE_*` variables.

This module is where the process environment is read (`Settings.from_env`), never written (the
one write in the package is Polars' allocator variable, `allocator.py`, not a setting). The
definitions bind the settings that came from the environment to the resources as `dg.EnvVar`s
(`definitions.build_definitions`); the CLI overrides some with its flags (`Settings.replace`)
and hands the result to the definitions it builds. Nothing under `lib/` reads the environment:
it gets values as arguments.

Every variable has a check (`CHECKS`: what it allows, and how its text becomes a value);
`from_env` runs them all, so a value that is not allowed is a SettingsError of one line per
variable, naming it, its value and what is allowed. The CLI's `main` and the code location
(`definitions.py`) call it before anything else reads a setting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import NamedTuple

DEFAULT_START_DATE = "2024-01-01"
DEFAULT_LAKE = "data/lake"
# days per run of a backfill from the UI or the sensor (BackfillPolicy.multi_run): a run's own
# cost (a process, Dagster, Polars, the definitions) is paid once for that many days, and the
# run queue runs the backfill's runs side by side (measured: docs/deploy.md, "Backfills")
DEFAULT_BACKFILL_DAYS = 7

# field -> environment variable (the typed fields' types are the dataclass's)
ENV_VARS = {
    "raw": "GPU_PIPELINE_RAW",
    "lake": "GPU_PIPELINE_LAKE",
    "cache": "GPU_PIPELINE_CACHE",
    "prices": "GPU_PIPELINE_PRICES",
    "catalog": "GPU_PIPELINE_CATALOG",
    "energy": "GPU_PIPELINE_ENERGY",
    "rules": "GPU_PIPELINE_RULES",
    "start_date": "GPU_PIPELINE_START_DATE",
    "executor": "GPU_PIPELINE_EXECUTOR",
    "chunk_mb": "GPU_PIPELINE_CHUNK_MB",
    "chunk_gpus": "GPU_PIPELINE_CHUNK_GPUS",
    "split": "GPU_PIPELINE_SPLIT",
    "csv_timezone": "GPU_PIPELINE_CSV_TIMEZONE",
    "max_file_mb": "GPU_PIPELINE_MAX_FILE_MB",
    "sensor_interval_s": "GPU_PIPELINE_SENSOR_INTERVAL",
    "backfill_days": "GPU_PIPELINE_BACKFILL_DAYS",
    "sql_memory_mb": "GPU_PIPELINE_SQL_MEMORY_MB",
    "sql_threads": "GPU_PIPELINE_SQL_THREADS",
    "sql_timeout_s": "GPU_PIPELINE_SQL_TIMEOUT_S",
    "sql_spill_mb": "GPU_PIPELINE_SQL_SPILL_MB",
    "notify_url": "GPU_PIPELINE_NOTIFY_URL",
    "report_base_url": "GPU_PIPELINE_REPORT_BASE_URL",
}

# the Prometheus-compatible server to pull from: name -> (environment variable, type)
PROM_SETTINGS = {
    "url": ("GPU_PIPELINE_PROM_URL", str),
    "token": ("GPU_PIPELINE_PROM_TOKEN", str),
    "username": ("GPU_PIPELINE_PROM_USER", str),
    "password": ("GPU_PIPELINE_PROM_PASSWORD", str),
    "ca_bundle": ("GPU_PIPELINE_PROM_CA_BUNDLE", str),
    "verify": ("GPU_PIPELINE_PROM_VERIFY", bool),
    "selector": ("GPU_PIPELINE_PROM_SELECTOR", str),
    "mode": ("GPU_PIPELINE_PROM_MODE", str),
    "step_s": ("GPU_PIPELINE_PROM_STEP", int),
    "window_s": ("GPU_PIPELINE_PROM_WINDOW", int),
    "concurrency": ("GPU_PIPELINE_PROM_CONCURRENCY", int),
    "max_response_mb": ("GPU_PIPELINE_PROM_MAX_RESPONSE_MB", int),
    "request_timeout_s": ("GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S", int),
    "cluster": ("GPU_PIPELINE_PROM_CLUSTER", str),
}


class SettingsError(ValueError):
    """GPU_PIPELINE_* variables whose values are not allowed: one line each, naming the variable,
    its value and what is allowed (`lines`)."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


class Check(NamedTuple):
    """What a variable allows (`allowed`, as its error line and README say it) and `parse`: the
    value from the variable's text, or ValueError(why it is not allowed; a line per problem)."""

    allowed: str
    parse: Callable[[str], object]
    secret: bool = False  # never shown in an error line
    # how the value is shown in an error line
    show: Callable[[str], str] = shlex.quote


def _whole(low: int, high: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", v.strip()):
            raise ValueError("not a whole number")
        n = int(v)
        if not low <= n <= high:
            raise ValueError("out of range")
        return n

    return parse


def _decimal(low: float, high: float) -> Callable[[str], float]:
    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise ValueError("not a number") from None
        if not low <= x <= high:  # NaN is never in range
            raise ValueError("out of range")
        return x

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in choices:
            raise ValueError("unknown")
        return v

    return parse


def _flag(v: str) -> bool:
    word = v.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("not a yes or no")


def _day(v: str) -> str:
    from datetime import UTC, date, datetime

    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
            raise ValueError
        day = date.fromisoformat(v)
    except ValueError:
        raise ValueError("not a date") from None
    today = datetime.now(UTC).date()
    if day > today:
        raise ValueError(f"after today, {today} in UTC: no day of it has a partition yet")
    return v


def _zone(v: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        ZoneInfo(v)
    except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        raise ValueError("not a time zone") from None
    return v


def _writable(folder: Path) -> None:
    """ValueError unless this process can create files in `folder` (or its nearest existing
    ancestor, for a folder not made yet): tried, not judged from mode bits (root, read-only
    mounts)."""
    import tempfile

    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise ValueError(f"{here} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=here):
            pass
    except OSError as e:
        raise ValueError(f"cannot write in {here}: {e.strerror}") from None


_FROM_ENV = (
    "the store's credentials, endpoint and region come from environment variables "
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION), "
    "never from the URI"
)


def _store_uri(rest: str) -> None:
    """ValueError for an object-store URI (`rest`: after `scheme://`) that holds more than a
    bucket and a prefix: user info (credentials) or a port, ?options or a #fragment. pyarrow
    would read some of them and the lock's S3 client none (a second endpoint), and the URI is
    shown in logs and kept in Dagster's event log (a secret in it would be too)."""
    bucket = rest.partition("/")[0].partition("?")[0].partition("#")[0]
    if "@" in bucket or ":" in bucket:
        raise ValueError(f"holds credentials (user:password@) or a port: {_FROM_ENV}")
    if "?" in rest or "#" in rest:
        raise ValueError(f"holds ?options or a #fragment: {_FROM_ENV}")
    if not bucket:
        raise ValueError("names no bucket (s3://bucket/prefix)")


def _shown_location(v: str) -> str:
    """A folder or store URI as an error line shows it: never a URI's user info (credentials),
    ?options or #fragment (they may hold secrets)."""
    scheme, sep, rest = v.partition("://")
    if sep:
        if "@" in rest:  # everything up to the last '@': a password may hold '/', '?', '#'
            rest = "<hidden>@" + rest.rpartition("@")[2]
        for mark in "?#":
            if mark in rest:
                rest = rest.partition(mark)[0] + mark + "<hidden>"
        v = f"{scheme}{sep}{rest}"
    return shlex.quote(v)


def _folder(uri_schemes: tuple[str, ...] = (), writable: bool = False) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if "://" in v:
            scheme, _, rest = v.partition("://")
            if scheme not in uri_schemes or not rest.strip("/"):
                raise ValueError(
                    "not a local folder" + (" or a known store" if uri_schemes else "")
                )
            _store_uri(rest)
            return v
        p = Path(v)
        if p.exists() and not p.is_dir():
            raise ValueError("a file, not a folder")
        if writable:
            _writable(p)
        return v

    return parse


def _file(v: str) -> str:
    p = Path(v)
    if not p.exists():
        raise ValueError("not found")
    if not p.is_file():
        raise ValueError("not a file")
    if not os.access(p, os.R_OK):
        raise ValueError("not readable")
    return v


def _rules_file(v: str) -> str:
    _file(v)
    from gpu_pipeline.lib.rules import RulesError, load_rules

    try:
        load_rules(v)
    except RulesError as e:
        raise ValueError("\n".join(e.problems)) from None
    return v


def _url(v: str) -> str:
    from urllib.parse import urlsplit

    try:
        p = urlsplit(v)
        p.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        raise ValueError("not a URL") from None
    if p.scheme not in ("http", "https") or not p.hostname or re.search(r"\s", v):
        raise ValueError("not an http(s) URL with a host")
    return v


def _no_password(url: str) -> str:
    """`url` with the password of its user info (if any) hidden."""
    return re.sub(r"(?<=://)([^/@:]*):[^/@]*@", r"\1:<hidden>@", url)


def url_origin(url: str) -> str:
    """What may be shown of a URL whose path is a secret (a Slack webhook's
    `https://hooks.slack.com/services/T…/B…/XXXX`): its scheme, host and port, then `/<hidden>`
    when it has a path, query or fragment; never its user info. `<hidden>` when it has no
    scheme and host to show."""
    from urllib.parse import urlsplit

    try:
        p = urlsplit(url.strip())
        host, port = p.hostname, p.port
    except ValueError:
        return "<hidden>"
    if not p.scheme or not host or re.search(r"[\x00-\x20\x7f]", f"{p.scheme}{host}"):
        return "<hidden>"
    host = f"[{host}]" if ":" in host else host
    rest = "/<hidden>" if p.path.strip("/") or p.query or p.fragment else ""
    return f"{p.scheme}://{host}{f':{port}' if port else ''}{rest}"


def _base_url(v: str) -> str:
    from urllib.parse import urlsplit

    _url(v)
    p = urlsplit(v)
    if p.query or p.fragment or "?" in v or "#" in v:
        raise ValueError("has a ?query or #fragment (the report's file name is appended)")
    return v


def _printable(v: str) -> str:
    if re.search(r"[\x00-\x20\x7f]", v):
        raise ValueError("holds spaces or control characters")
    return v


def _user(v: str) -> str:
    if ":" in v or re.search(r"[\x00-\x1f\x7f]", v):
        raise ValueError("holds a ':' or control characters")
    return v


def _password(v: str) -> str:
    if re.search(r"[\x00-\x1f\x7f]", v):
        raise ValueError("holds control characters")
    return v


def _ca_bundle(v: str) -> str:
    p = Path(v)
    if not (p.is_file() or p.is_dir()) or not os.access(p, os.R_OK):
        raise ValueError("not a readable file or folder")
    return v


_STRING = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`"
_MATCHER = rf"\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:{_STRING})\s*"
_MATCHERS = re.compile(rf"\{{?\s*(?:{_MATCHER}(?:,{_MATCHER})*,?)?\s*\}}?")


def _selector(v: str) -> str:
    if not _MATCHERS.fullmatch(v.strip()):
        raise ValueError("not a list of label matchers")
    return v


def _cluster(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", v):
        raise ValueError("not a folder name")
    return v


def _executor(v: str) -> str:
    _one_of("in_process", "multiprocess", "k8s")(v)
    if v == "k8s":
        import importlib.util

        if importlib.util.find_spec("dagster_k8s") is None:
            raise ValueError("k8s needs the dagster-k8s package, which is not installed")
    return v


_CSV = "a readable CSV file"
# every variable read, with what it allows: a new setting adds its line here (a variable without
# one is read by its type alone, and tests/test_config_errors.py fails until it has one)
CHECKS: dict[str, Check] = {
    "GPU_PIPELINE_RAW": Check(
        "a local folder (not a file) or s3://bucket/prefix", _folder(("s3",)), show=_shown_location
    ),
    "GPU_PIPELINE_LAKE": Check(
        "a local folder (not a file) or s3://bucket/prefix", _folder(("s3",)), show=_shown_location
    ),
    "GPU_PIPELINE_CACHE": Check(
        "a local folder this user can write, made if missing; unset: beside the lake",
        _folder(writable=True),
        show=_shown_location,
    ),
    "GPU_PIPELINE_PRICES": Check(f"{_CSV}: the price book", _file),
    "GPU_PIPELINE_CATALOG": Check(f"{_CSV}: GPU catalog rows", _file),
    "GPU_PIPELINE_ENERGY": Check(f"{_CSV}: energy rates", _file),
    "GPU_PIPELINE_RULES": Check(
        "a TOML rules file whose rules are known and in range, as in config/rules.example.toml",
        _rules_file,
    ),
    "GPU_PIPELINE_START_DATE": Check("a date YYYY-MM-DD, at most today in UTC", _day),
    "GPU_PIPELINE_EXECUTOR": Check("in_process, multiprocess or k8s", _executor),
    "GPU_PIPELINE_CHUNK_MB": Check("a whole number of MiB from 16 to 1048576", _whole(16, 2**20)),
    "GPU_PIPELINE_CHUNK_GPUS": Check(
        "a whole number of GPUs from 0 (chunks follow the memory budget) to 1000000",
        _whole(0, 1_000_000),
    ),
    "GPU_PIPELINE_SPLIT": Check("gpus or cluster", _one_of("gpus", "cluster")),
    "GPU_PIPELINE_CSV_TIMEZONE": Check("an IANA time zone such as UTC or Europe/Berlin", _zone),
    "GPU_PIPELINE_MAX_FILE_MB": Check("a whole number of MiB from 1 to 1048576", _whole(1, 2**20)),
    "GPU_PIPELINE_SENSOR_INTERVAL": Check(
        "a whole number of seconds from 1 to 86400", _whole(1, 86400)
    ),
    "GPU_PIPELINE_BACKFILL_DAYS": Check("a whole number of days from 1 to 366", _whole(1, 366)),
    "GPU_PIPELINE_PROM_URL": Check(
        "an http:// or https:// URL with a host", _url, show=lambda v: shlex.quote(_no_password(v))
    ),
    "GPU_PIPELINE_PROM_TOKEN": Check("a token without spaces", _printable, secret=True),
    "GPU_PIPELINE_PROM_USER": Check("a user name without ':'", _user),
    "GPU_PIPELINE_PROM_PASSWORD": Check("a password on one line", _password, secret=True),
    "GPU_PIPELINE_PROM_CA_BUNDLE": Check("a readable CA file or folder", _ca_bundle),
    "GPU_PIPELINE_PROM_VERIFY": Check("true or false (yes/no, on/off, 1/0)", _flag),
    "GPU_PIPELINE_PROM_SELECTOR": Check(
        'label matchers such as cluster="east",env=~"prod.*" (braces optional)', _selector
    ),
    "GPU_PIPELINE_PROM_MODE": Check("raw or range", _one_of("raw", "range")),
    "GPU_PIPELINE_PROM_STEP": Check("a whole number of seconds from 1 to 3600", _whole(1, 3600)),
    "GPU_PIPELINE_PROM_WINDOW": Check(
        "a whole number of seconds from 60 to 86400", _whole(60, 86400)
    ),
    "GPU_PIPELINE_PROM_CONCURRENCY": Check("a whole number from 1 to 64", _whole(1, 64)),
    "GPU_PIPELINE_PROM_CLUSTER": Check(
        "a folder name: letters, digits, '_', '.', '-', not starting with '.'", _cluster
    ),
    "GPU_PIPELINE_PROM_MAX_RESPONSE_MB": Check(
        "a whole number of MiB from 1 to 4096", _whole(1, 4096)
    ),
    "GPU_PIPELINE_PROM_REQUEST_TIMEOUT_S": Check(
        "a whole number of seconds from 1 to 86400", _whole(1, 86400)
    ),
    "GPU_PIPELINE_SQL_MEMORY_MB": Check(
        "a whole number of MiB from 64 to 1048576", _whole(64, 2**20)
    ),
    "GPU_PIPELINE_SQL_THREADS": Check("a whole number from 1 to 256", _whole(1, 256)),
    "GPU_PIPELINE_SQL_TIMEOUT_S": Check(
        "a whole number of seconds from 0 (no limit) to 86400", _whole(0, 86400)
    ),
    "GPU_PIPELINE_SQL_SPILL_MB": Check(
        "a whole number of MiB from 0 (no spill) to 1048576", _whole(0, 2**20)
    ),
    # a webhook's secret is its path (Slack: /services/T…/B…/XXXX): only scheme and host shown
    "GPU_PIPELINE_NOTIFY_URL": Check(
        "an http:// or https:// webhook URL with a host; only its scheme and host are ever shown",
        _url,
        show=lambda v: shlex.quote(url_origin(v)),
    ),
    "GPU_PIPELINE_REPORT_BASE_URL": Check(
        "an http:// or https:// URL with a host, without ?query or #fragment", _base_url
    ),
}


def _by_type(kind: type) -> Check:
    """The check of a variable that has no line in CHECKS yet: its type's."""
    if kind is bool:
        return Check("true or false", _flag)
    if kind is int:
        return Check("a whole number", _whole(-(2**63), 2**63 - 1))
    if kind is float:
        return Check("a number", _decimal(-math.inf, math.inf))
    return Check("any text", str)


def problem(var: str, text: str, check: Check, why: str, name: str | None = None) -> list[str]:
    """The error lines of `var` (or the flag `name`) set to `text`: one per reason."""
    shown = "<hidden>" if check.secret else check.show(text)
    return [
        f"{name or var}{' ' if name else '='}{shown}: {reason} (allowed: {check.allowed})"
        for reason in why.splitlines() or ["not allowed"]
    ]


def parse(var: str, text: str, kind: type = str, name: str | None = None) -> object:
    """The value of `var` (or of the CLI flag `name` standing in for it) from its text; a
    SettingsError of one line per problem when it is not allowed."""
    check = CHECKS.get(var) or _by_type(kind)
    try:
        return check.parse(text)
    except ValueError as e:
        raise SettingsError(problem(var, text, check, str(e), name)) from None
    except OSError as e:  # a path the system cannot look at (a name over 255 bytes, no access)
        raise SettingsError(problem(var, text, check, e.strerror or str(e), name)) from None


@dataclass(frozen=True)
class Settings:
    """What a deployment configures. Empty paths mean the shipped defaults."""

    raw: str = "data/raw"  # the landing zone
    lake: str = DEFAULT_LAKE  # a folder or an object-store URI
    cache: str = ""  # parsed landing files (local disk); "": beside the lake
    prices: str = ""
    catalog: str = ""  # extends the shipped GPU catalog
    energy: str = ""
    rules: str = ""  # the TOML rules file (thresholds)
    start_date: str = DEFAULT_START_DATE  # the first daily partition
    executor: str = "in_process"
    # memory budget of a chunk of GPUs: 400 MiB (~273,000 sample rows: two of the lake's row
    # groups, `chunked.row_group_plan`) keeps the 10,000-GPU day's run within 1 GiB (952 MiB)
    # and the staging pass ahead of DuckDB (benchmarks/README.md, issue 34)
    chunk_mb: int = 400
    chunk_gpus: int = 0  # 0: chunks follow the memory budget
    split: str = "gpus"  # or "cluster"
    csv_timezone: str = "UTC"  # the zone of zone-less CSV times
    max_file_mb: int = 1024  # larger landing files are quarantined whole
    sensor_interval_s: int = 60
    # days per run of a UI or sensor backfill (the backfill's runs share the run queue)
    backfill_days: int = DEFAULT_BACKFILL_DAYS
    # `gpu-pipeline sql`: DuckDB's memory limit, worker threads, spill files; seconds per run (0: none)
    sql_memory_mb: int = 1024
    sql_threads: int = 2
    sql_timeout_s: int = 300
    sql_spill_mb: int = 4096  # 0: no spill files (a query larger than memory fails)
    # the daily digest's webhook ("": no digest) and where the reports are served ("": their
    # path in the lake is what the digest links)
    notify_url: str = ""
    report_base_url: str = ""
    prom: Mapping[str, object] = field(default_factory=dict)  # PROM_SETTINGS that are set
    # the fields whose value came from their environment variable (bound as dg.EnvVar);
    # pull settings as "prom.<name>"
    from_env_fields: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Every setting whose variable is set (and not empty), each checked (`CHECKS`): a
        SettingsError of one line per variable that is not allowed."""
        env = os.environ if environ is None else environ
        types = {"int": int, "float": float, "bool": bool}
        kinds = {f.name: types.get(str(f.type), str) for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        prom: dict[str, object] = {}
        bad: list[str] = []
        wanted = [
            *((values, name, var, kinds[name]) for name, var in ENV_VARS.items()),
            *((prom, name, var, kind) for name, (var, kind) in PROM_SETTINGS.items()),
        ]
        for into, name, var, kind in wanted:
            if env.get(var) in (None, ""):
                continue
            try:
                into[name] = parse(var, env[var], kind)
            except SettingsError as e:
                bad += e.lines
        if bad:
            raise SettingsError(bad)
        return cls(
            **values, prom=prom, from_env_fields=frozenset([*values, *(f"prom.{n}" for n in prom)])
        )

    def replace(self, **changes: object) -> Settings:
        """These settings with `changes` (from CLI flags): those fields no longer come from the
        environment."""
        prom = changes.pop("prom", self.prom)
        changed = set(changes) | {
            f"prom.{n}" for n in set(prom) | set(self.prom) if prom.get(n) != self.prom.get(n)
        }
        return dataclasses.replace(
            self, **changes, prom=prom, from_env_fields=self.from_env_fields - changed
        )

    @property
    def prom_url(self) -> str:
        return str(self.prom.get("url", ""))


def last_day() -> date:
    """The last complete UTC day: yesterday (today's partition opens at midnight); the day the
    schedule runs."""
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC).date() - timedelta(days=1)


def current() -> Settings:
    """The settings of this process's environment (SettingsError: the variables not allowed)."""
    return Settings.from_env()


def _derived_home(lake: str) -> Path:
    """Where what is derived from a lake lives: inside it (local), or in a local folder keyed by
    the lake's URI (object store). Two lakes never share it."""
    if "://" in str(lake):
        return (
            Path("data").resolve() / "cache" / hashlib.sha256(str(lake).encode()).hexdigest()[:12]
        )
    return Path(lake).resolve()


def parse_cache_dir(lake: str, cache: str = "") -> Path:
    """Where a lake's parsed landing files are kept, always on local disk: `cache` when set,
    else beside the lake, or under `data/cache/` named by the URI of a lake in an object store."""
    if cache:
        return Path(cache)
    if "://" in str(lake):
        return Path("data") / "cache" / hashlib.sha256(str(lake).encode()).hexdigest()[:12]
    return Path(lake) / "_ingest_cache"


def warehouse_path(lake: str) -> Path:
    """The lake's views-only DuckDB file: `data/warehouse.duckdb` for the default lake (SPEC),
    `<lake>/_warehouse.duckdb` for any other, so two lakes never share one."""
    if "://" not in str(lake) and Path(lake).resolve() == Path(DEFAULT_LAKE).resolve():
        return Path(DEFAULT_LAKE).resolve().parent / "warehouse.duckdb"
    return _derived_home(lake) / "_warehouse.duckdb"


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or "data/dagster_home").resolve()


def reports_dir(lake: str) -> Path:
    """The lake's HTML reports: `<lake>/_reports/`."""
    return _derived_home(lake) / "_reports"


def report_name(day: date) -> str:
    """The day's HTML report file, in `reports_dir` (and beside an object-store lake)."""
    return f"gpu_report_{day.isoformat()}.html"
