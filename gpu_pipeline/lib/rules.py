"""The metric thresholds of docs/metrics.md, defined once; every transform and test reads them here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

import polars as pl


@dataclass(frozen=True)
class Thresholds:
    # phase by minute-mean utilization: idle < 10 <= underutilized < 70 <= productive < 90 <= compute_bound
    idle_below: float = 10.0
    productive_from: float = 70.0
    compute_bound_from: float = 90.0
    # efficiency class
    inefficient_below: float = 30.0
    bottleneck_pif_below: float = 0.4
    efficient_pif_from: float = 0.6
    # a GPU-day is bottlenecked with >= 60 active minutes, >= 50 % of them bottlenecked
    day_min_active_minutes: int = 60
    day_min_bottleneck_share: float = 0.5
    # persistent: >= 3 bottlenecked days within D-6..D
    window_days: int = 7
    persistent_min_days: int = 3
    # data coverage (observed GPU-minutes / (GPUs seen x 1,440) x 100) below which a day warns
    coverage_warn_below: float = 90.0
    # below this coverage the report does not project the day's dollars to a month: it shows
    # what the observed hours cost (a few minutes of a day are no month's run rate)
    coverage_month_from: float = 50.0


DEFAULT = Thresholds()

# a minute without any utilization reading (nvidia-smi under MIG reports `[N/A]`) is still a
# GPU-minute: its phase is `unknown`, so the phase shares of every group still sum to 100
PHASES = ("idle", "underutilized", "productive", "compute_bound", "unknown")
MEASURED_PHASES = PHASES[:4]
EFFICIENCY_CLASSES = ("idle", "bottlenecked", "efficient", "inefficient", "moderate")


@dataclass(frozen=True)
class DiagnosisThresholds:
    """The profiling decision tree (docs/metrics.md, "Diagnosis"): SM activity first, then DRAM, tensor, occupancy."""

    sm_underfed_below: float = 0.30  # SM active < 30 %: the GPU is under-fed
    sm_busy_from: float = 0.70  # > 70 %: compute or memory bound
    dram_bound_from: float = 0.80  # DRAM active > 80 %: memory bound
    tensor_unused_below: float = 0.05  # tensor pipe ~0 while busy: no mixed precision
    occupancy_low_below: float = 0.20  # resident warps / max: kernels or batches too small
    nvlink_busy_from: float = (
        5e9  # NVLink RX bytes/s that make an under-fed GPU communication-bound
    )
    pcie_busy_from: float = 1e9  # PCIe RX bytes/s: the host is pushing data (data loading)


DIAGNOSIS = DiagnosisThresholds()
DIAGNOSES = (
    "idle",
    "data_starved",
    "communication_bound",
    "memory_bound",
    "compute_bound",
    "tensor_cores_unused",
    "low_occupancy",
    "mixed",
    "unknown",
)
# the diagnoses a recommendation rule can act on (not idle, mixed or unknown)
BOTTLENECK_DIAGNOSES = DIAGNOSES[1:7]


@dataclass(frozen=True)
class HealthThresholds:
    """GPU-level health and stragglers."""

    hot_from_c: float = 80.0  # temperature alert above 80 C (throttling near 85 C)
    # a GPU warns when it is hot this many minutes of the day: a minute's spike is no alert
    hot_warn_minutes: int = 15
    power_capped_from: float = 0.98  # power at >= 98 % of its limit
    straggler_points: float = 15.0  # an hour this far below its pod's median
    # a synchronous job straggles when the std dev of its GPUs' SM activity > 0.15
    straggler_spread_from: float = 0.15


HEALTH = HealthThresholds()


@dataclass(frozen=True)
class RecommendationThresholds:
    """When a recommendation fires (shares of a namespace's GPU-minutes or active minutes) and
    the fraction of one measured waste component (idle, stall or headroom) it is expected to
    recover. Each rationale quotes the measured numbers that made its rule fire."""

    # triggers
    idle_share_from: float = 0.25  # MPS, MIG, right_size: idle share of GPU-minutes
    starved_share_from: float = 0.2  # DALI, num_workers, pin_memory: data-starved active minutes
    unprofiled_unknown_above: float = 0.5  # no profiling fields on most active minutes ...
    unprofiled_bottlenecked_from: float = 0.2  # ... and this many busy at low power: starved
    pcie_measured_from: float = 0.5  # PCIe counters on this share of the starved minutes ...
    pcie_busy_share_from: float = 0.5  # ... RX busy on this share: data loading, else CPU work
    communication_share_from: float = 0.2  # gradient_accumulation, larger_batch
    memory_share_from: float = 0.2  # larger_batch, fused_kernels
    low_occupancy_share_from: float = 0.2  # larger_batch
    underutilized_share_from: float = 0.5  # larger_batch
    compute_share_from: float = 0.3  # fused_kernels, torch.compile, AMP, BF16, FP8
    tensor_unused_share_from: float = 0.2  # AMP, BF16
    rate_saving_from: float = 0.001  # spot: below this the price book has no real spot discount
    # fractions of the waste component each action recovers
    mps: float = 0.5  # of idle
    mig: float = 0.6  # of idle
    right_size: float = 0.75  # of idle
    dali: float = 0.6  # of stall
    num_workers: float = 0.5  # of stall
    pin_memory: float = 0.25  # of stall
    gradient_accumulation: float = 0.4  # of stall
    larger_batch: float = 0.3  # of the larger of stall and headroom
    fused_kernels_memory: float = 0.3  # of headroom, memory-bound
    fused_kernels_compute: float = 0.1  # of headroom, compute-bound only
    torch_compile: float = 0.15  # of headroom
    amp_tensor_unused: float = 0.5  # of headroom (AMP, BF16), tensor pipe idle
    amp_compute_bound: float = 0.25  # of headroom (AMP, BF16), compute-bound only
    fp8: float = 0.4  # of headroom


RECOMMEND = RecommendationThresholds()
ROI_TARGET_RFU_PCT = 60.0
# run rates (SPEC): a month is 30 days, a year 365, of 24 hours
DAYS_PER_MONTH = 30
HOURS_PER_MONTH = 24 * DAYS_PER_MONTH
HOURS_PER_YEAR = 24 * 365


@dataclass(frozen=True)
class Rules:
    """Every threshold in force for a run: defaults, then the rules file, then run config."""

    thresholds: Thresholds = DEFAULT
    diagnosis: DiagnosisThresholds = DIAGNOSIS
    health: HealthThresholds = HEALTH
    recommend: RecommendationThresholds = RECOMMEND
    roi_target_rfu_pct: float = ROI_TARGET_RFU_PCT

    def flat(self) -> dict[str, float]:
        """`section.key` -> value, as the rules file and run config name them."""
        return {
            f"{sec}.{key}": getattr(getattr(self, part), field or key)
            if part
            else getattr(self, field)
            for sec, key, part, field, _, _ in _KEYS
        }


RULES = Rules()

# section, key, Rules part (None: a field of Rules itself), Rules field, type, (low, high)
_PCT, _RATIO = (0.0, 100.0), (0.0, 1.0)
_KEYS: tuple[tuple[str, str, str | None, str, type, tuple[float, float]], ...] = (
    ("phases", "idle_below", "thresholds", "", float, _PCT),
    ("phases", "productive_from", "thresholds", "", float, _PCT),
    ("phases", "compute_bound_from", "thresholds", "", float, _PCT),
    ("classes", "inefficient_below", "thresholds", "", float, _PCT),
    ("classes", "bottleneck_pif_below", "thresholds", "", float, _RATIO),
    ("classes", "efficient_pif_from", "thresholds", "", float, _RATIO),
    ("bottlenecks", "day_min_active_minutes", "thresholds", "", int, (0, 1440)),
    ("bottlenecks", "day_min_bottleneck_share", "thresholds", "", float, _RATIO),
    ("bottlenecks", "window_days", "thresholds", "", int, (1, 31)),
    ("bottlenecks", "persistent_min_days", "thresholds", "", int, (1, 31)),
    ("coverage", "warn_below", "thresholds", "coverage_warn_below", float, _PCT),
    ("coverage", "month_from", "thresholds", "coverage_month_from", float, _PCT),
    ("diagnosis", "sm_underfed_below", "diagnosis", "", float, _RATIO),
    ("diagnosis", "sm_busy_from", "diagnosis", "", float, _RATIO),
    ("diagnosis", "dram_bound_from", "diagnosis", "", float, _RATIO),
    ("diagnosis", "tensor_unused_below", "diagnosis", "", float, _RATIO),
    ("diagnosis", "occupancy_low_below", "diagnosis", "", float, _RATIO),
    ("diagnosis", "nvlink_busy_from", "diagnosis", "", float, (0.0, 1e13)),
    ("diagnosis", "pcie_busy_from", "diagnosis", "", float, (0.0, 1e13)),
    ("health", "hot_from_c", "health", "", float, (0.0, 130.0)),
    ("health", "hot_warn_minutes", "health", "", int, (1, 1440)),
    ("health", "power_capped_from", "health", "", float, _RATIO),
    ("health", "straggler_points", "health", "", float, _PCT),
    ("health", "straggler_spread_from", "health", "", float, _RATIO),
    ("roi", "target_rfu_pct", None, "roi_target_rfu_pct", float, (1.0, 100.0)),
    *(
        ("recommendations", f.name, "recommend", "", float, _RATIO)
        for f in fields(RecommendationThresholds)
    ),
)
RULE_KEYS = tuple(f"{sec}.{key}" for sec, key, *_ in _KEYS)
# the window shapes which partitions a day depends on: fixed when the definitions load
LOAD_TIME_KEYS = ("bottlenecks.window_days",)


class RulesError(ValueError):
    """A rules file or override that does not hold: one line per problem (`problems`), each
    naming the rule (and its line in the file), the value and what is allowed; the message
    prefixes each with `where` (the file, or "run config")."""

    def __init__(self, where: str, problems: list[str]):
        self.where, self.problems = where, problems
        super().__init__("\n".join(f"{where}: {p}" for p in problems))


def _key_lines(text: str) -> dict[str, int]:
    """`section.key` -> its line in a TOML text (plain `[section]` tables and `key = ` lines;
    other spellings are simply not found)."""
    out: dict[str, int] = {}
    section = ""
    for n, line in enumerate(text.splitlines(), 1):
        if m := re.match(r"\s*\[\s*([A-Za-z0-9_-]+)\s*\]\s*(#.*)?$", line):
            section = m.group(1)
        elif section and (m := re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)):
            out.setdefault(f"{section}.{m.group(1)}", n)
    return out


def _near(name: str) -> str:
    """The rule `name` was probably meant to be (a misspelt or shortened key, or section), or
    ""."""
    import difflib

    sec, _, key = name.partition(".")
    sections = list(dict.fromkeys(k.partition(".")[0] for k in RULE_KEYS))
    for s in [sec] if sec in sections else difflib.get_close_matches(sec, sections, n=1):
        keys = [k.partition(".")[2] for k in RULE_KEYS if k.startswith(f"{s}.")]
        near = difflib.get_close_matches(key, keys, n=1) or [k for k in keys if k.startswith(key)]
        if near:
            return f"{s}.{near[0]}"
    return ""


def _problems(values: dict[str, object], lines: dict[str, int]) -> tuple[list[str], dict]:
    """The problems of `values` (`section.key` -> value), one line each, and the valid values
    by Rules part."""

    def at(name: str) -> str:
        return f"line {lines[name]}: " if name in lines else ""

    out: list[str] = []
    for name in sorted(set(values) - set(RULE_KEYS), key=lambda k: lines.get(k, 0)):
        near = _near(name)
        hint = f"did you mean {near}? " if near else ""
        out.append(
            f"{at(name)}unknown rule {name} ({hint}config/rules.example.toml lists every rule)"
        )
    parts: dict[str | None, dict[str, object]] = {
        "thresholds": {},
        "diagnosis": {},
        "health": {},
        "recommend": {},
        None: {},
    }
    for sec, key, part, field, kind, (low, high) in _KEYS:
        name = f"{sec}.{key}"
        if name not in values:
            continue
        v = values[name]
        if isinstance(v, bool) or not isinstance(v, int | float):
            out.append(f"{at(name)}{name} must be a number, not {v!r}")
        elif kind is int and (not math.isfinite(v) or float(v) != int(v)):
            out.append(f"{at(name)}{name} must be a whole number, not {v!r}")
        elif not low <= v <= high:
            out.append(f"{at(name)}{name} = {v} is out of range [{low:g}, {high:g}]")
        else:
            parts[part][field or key] = kind(v)
    return out, parts


def rules_from(values: dict[str, object], where: str = "rules", lines=None) -> Rules:
    """Rules from `section.key` -> value (defaults for the rest); unknown keys, wrong types,
    out-of-range values and inconsistent orders are a RulesError of one line each (`lines`:
    where each key is in the file)."""
    problems, parts = _problems(values, lines or {})
    rules = Rules(
        thresholds=replace(DEFAULT, **parts["thresholds"]),
        diagnosis=replace(DIAGNOSIS, **parts["diagnosis"]),
        health=replace(HEALTH, **parts["health"]),
        recommend=replace(RECOMMEND, **parts["recommend"]),
        **parts[None],
    )
    t, d = rules.thresholds, rules.diagnosis
    for lo, hi, what in (
        (t.idle_below, t.productive_from, "phases.idle_below <= phases.productive_from"),
        (
            t.productive_from,
            t.compute_bound_from,
            "phases.productive_from <= phases.compute_bound_from",
        ),
        (
            t.bottleneck_pif_below,
            t.efficient_pif_from,
            "classes.bottleneck_pif_below <= classes.efficient_pif_from",
        ),
        (
            t.persistent_min_days,
            t.window_days,
            "bottlenecks.persistent_min_days <= bottlenecks.window_days",
        ),
        (
            d.sm_underfed_below,
            d.sm_busy_from,
            "diagnosis.sm_underfed_below <= diagnosis.sm_busy_from",
        ),
    ):
        if lo > hi:
            problems.append(f"the rules must keep {what} ({lo:g} > {hi:g})")
    if problems:
        raise RulesError(where, problems)
    return rules


def _flatten(doc: dict, lines: dict[str, int], text: str) -> tuple[dict[str, object], list[str]]:
    out: dict[str, object] = {}
    problems: list[str] = []
    for sec, body in doc.items():
        if not isinstance(body, dict):
            n = next(
                (
                    i
                    for i, ln in enumerate(text.splitlines(), 1)
                    if re.match(rf"\s*{re.escape(sec)}\s*=", ln)
                ),
                None,
            )
            problems.append(
                f"{f'line {n}: ' if n else ''}{sec} = {body!r} is not a [section] (e.g. [health])"
            )
            continue
        for key, v in body.items():
            out[f"{sec}.{key}"] = v
    return out, problems


def load_rules(path: str | None = None, overrides: dict[str, object] | None = None) -> Rules:
    """Defaults, then the TOML rules file `path` ([phases], [classes], [bottlenecks],
    [coverage], [diagnosis], [health], [roi], [recommendations]), then `overrides` (`section.key` -> value, from run config)."""
    import tomllib

    values: dict[str, object] = {}
    if path:
        where = f"rules file {path}"
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise RulesError(where, [e.strerror or str(e)]) from None
        except UnicodeDecodeError:
            raise RulesError(where, ["not text (UTF-8)"]) from None
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise RulesError(where, [f"not TOML: {e}"]) from None
        lines = _key_lines(text)
        values, problems = _flatten(doc, lines, text)
        try:
            rules_from(values, where, lines)  # the file alone must hold
        except RulesError as e:
            problems += e.problems
        if problems:  # in the file's order; what has no line (the rules' orders) last
            line = re.compile(r"line (\d+): ")
            at = [int(m.group(1)) if (m := line.match(p)) else len(text) for p in problems]
            order = sorted(range(len(problems)), key=at.__getitem__)
            raise RulesError(where, [problems[i] for i in order])
    if overrides:
        fixed = sorted(set(overrides) & set(LOAD_TIME_KEYS))
        if fixed:
            raise RulesError(
                "run config",
                [
                    f"{k} shapes the partition dependencies and can only be set in the rules "
                    "file (GPU_PIPELINE_RULES)"
                    for k in fixed
                ],
            )
        values = {**values, **overrides}
    return rules_from(
        values, "run config" if overrides else f"rules file {path}" if path else "rules"
    )


# Categorical columns are Enums: one byte a row instead of a string, and cheap to compare
UTIL_SOURCES = ("gpu_util", "prof_gr_engine_active", "mig_instances")
POWER_BASES = ("catalog", "power_limit")
# power: utilization and power; power_pcie: with PCIe counters too (no profiling fields)
DIAGNOSIS_BASES = ("dcgm_profiling", "utilization", "power", "power_pcie", "none")
PHASE_ENUM = pl.Enum(PHASES)
CLASS_ENUM = pl.Enum(EFFICIENCY_CLASSES)
DIAGNOSIS_ENUM = pl.Enum(DIAGNOSES)
UTIL_SOURCE_ENUM = pl.Enum(UTIL_SOURCES)
POWER_BASIS_ENUM = pl.Enum(POWER_BASES)
DIAGNOSIS_BASIS_ENUM = pl.Enum(DIAGNOSIS_BASES)


# the actions a recommendation may name (the recommendations model allows no other)
VOCABULARY = (
    "DALI",
    "num_workers",
    "pin_memory",
    "AMP",
    "BF16",
    "FP8",
    "torch.compile",
    "larger_batch",
    "gradient_accumulation",
    "MPS",
    "MIG",
    "right_size",
    "spot",
    "fused_kernels",
)
