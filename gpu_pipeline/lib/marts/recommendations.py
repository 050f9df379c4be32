"""Recommendations per namespace and day, from the measured phase mix, diagnosis and waste.

Each rule that fires proposes an action with a fraction `f` of the namespace's cost it could
recover, an overlap group (actions recovering the same waste do not stack: MPS and DALI both
reclaim wall-clock the GPU sits without work) and a rationale quoting the measured numbers.

Combination, by construction never above 100 % nor above what was measured:
  utilization = min(1 - prod over groups (1 - max f in group), measured waste fraction)
  total       = 1 - (1 - utilization) x (1 - rate)      (spot is a rate, not an hours, saving)
Each f is a share (< 1) of one measured waste component, so every factor (1 - f) is in (0, 1].
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from gpu_pipeline.lib.money import allocated_minutes, mig_unallocated
from gpu_pipeline.lib.reference import by_model, model_key
from gpu_pipeline.lib.rules import (
    BOTTLENECK_DIAGNOSES,
    DAYS_PER_MONTH,
    DEFAULT,
    DIAGNOSIS,
    RECOMMEND,
    DiagnosisThresholds,
    RecommendationThresholds,
    Thresholds,
)
from gpu_pipeline.lib.samples import collect_stable, ratio
from gpu_pipeline.lib.schemas import RECOMMENDATIONS_SCHEMA
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNKING, Chunking, by_gpu_chunks

MIG_CAPABLE = r"A100|A800|A30|H100|H800|H200|B200|GB200"
BF16_CAPABLE = r"A100|A800|A10|A30|A40|L4|L40|H100|H800|H200|B200|GB200|RTX A|RTX 6000"
FP8_CAPABLE = r"H100|H800|H200|B200|GB200|L4|L40|RTX 6000 ADA"


@dataclass(frozen=True)
class Rule:
    action: str
    group: str  # overlap group: actions in one group recover the same waste
    when: Callable[[dict, RecommendationThresholds], bool]
    fraction: Callable[[dict, RecommendationThresholds], float]
    why: Callable[[dict], str]


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _idle(s: dict) -> str:
    return (
        f"idle {_pct(s['idle_share'])} of GPU-minutes: ${s['idle_usd']:,.2f}/day of the "
        f"namespace's ${s['cost_usd']:,.2f}/day paid for idle GPUs"
    )


def _starved(s: dict) -> str:
    why = (
        f"{_pct(s['data_starved'])} of active minutes data-starved (SM active < 30 %, or busy at "
        f"low power where no profiling fields exist), {_pct(s['bottlenecked'])} busy at low "
        f"power; stall ${s['stall_usd']:,.2f}/day"
    )
    if s["pcie_known"]:  # PCIe counters tell data loading from CPU work
        if s["pcie_loading"]:
            why += f"; PCIe RX busy in {_pct(s['pcie_busy'])} of them: data loading and host copies"
        else:
            why += (
                f"; PCIe RX quiet in {_pct(1 - s['pcie_busy'])} of them: CPU preprocessing "
                "(decode, augmentation) holds the GPU"
            )
    return why


def _idle_heavy(s: dict, r: RecommendationThresholds) -> bool:
    return s["idle_share"] >= r.idle_share_from


def _starved_heavy(s: dict, r: RecommendationThresholds) -> bool:
    return s["data_starved"] >= r.starved_share_from or s["unprofiled_bottleneck"]


def _compute_heavy(s: dict, r: RecommendationThresholds) -> bool:
    return s["compute_bound"] >= r.compute_share_from


def _tensor_idle(s: dict, r: RecommendationThresholds) -> bool:
    return s["tensor_cores_unused"] >= r.tensor_unused_share_from


def _precision(s: dict, r: RecommendationThresholds) -> float:
    share = r.amp_tensor_unused if _tensor_idle(s, r) else r.amp_compute_bound
    return share * s["headroom_frac"]


def _on(s: dict, p: str) -> dict:
    """The signals of the namespace's `p`-capable GPUs (`bf16`, `fp8`): their active minutes'
    shares and their headroom (`_signals`), read by the rule advising that precision."""
    return {**s, **s[p]}


def _precision_fires(s: dict, r: RecommendationThresholds, p: str) -> bool:
    """Advise precision `p` when some GPU supports it and its capable GPUs' active minutes are
    compute-bound or leave the tensor pipe idle (not the namespace's other GPUs')."""
    on = _on(s, p)
    return s[f"{p}_capable"] and (_tensor_idle(on, r) or _compute_heavy(on, r))


# the thresholds and fractions are rules (`rules.RecommendationThresholds`, `[recommendations]`)
RULES: tuple[Rule, ...] = (
    # idle-heavy: share or split the GPU, or give it back
    Rule(
        "MPS",
        "idle_wallclock",
        _idle_heavy,
        lambda s, r: r.mps * s["idle_frac"],
        lambda s: _idle(s) + ": pack small jobs onto shared GPUs with MPS",
    ),
    Rule(
        "MIG",
        "idle_wallclock",
        lambda s, r: _idle_heavy(s, r) and s["mig_capable"],
        lambda s, r: r.mig * s["idle_frac"],
        lambda s: _idle(s) + ": split GPUs into MIG instances sized to the jobs",
    ),
    Rule(
        "right_size",
        "idle_wallclock",
        _idle_heavy,
        lambda s, r: r.right_size * s["idle_frac"],
        lambda s: _idle(s) + ": release idle GPUs or move to a smaller SKU",
    ),
    # busy but starved: fix the input pipeline
    Rule(
        "DALI",
        "idle_wallclock",
        _starved_heavy,
        lambda s, r: r.dali * s["stall_frac"],
        lambda s: _starved(s) + ": decode/augment on the GPU with DALI",
    ),
    Rule(
        "num_workers",
        "idle_wallclock",
        _starved_heavy,
        lambda s, r: r.num_workers * s["stall_frac"],
        lambda s: _starved(s) + ": raise DataLoader num_workers and prefetching",
    ),
    Rule(
        "pin_memory",
        "idle_wallclock",
        _starved_heavy,
        lambda s, r: r.pin_memory * s["stall_frac"],
        lambda s: _starved(s) + ": pin_memory=True for async host-to-device copies",
    ),
    # communication-bound: fewer, larger synchronizations
    Rule(
        "gradient_accumulation",
        "batching",
        lambda s, r: s["communication_bound"] >= r.communication_share_from,
        lambda s, r: r.gradient_accumulation * s["stall_frac"],
        lambda s: (
            f"{_pct(s['communication_bound'])} of active minutes communication-bound (NVLink busy, SM < 30 %): "
            "accumulate gradients to all-reduce less often"
        ),
    ),
    Rule(
        "larger_batch",
        "batching",
        lambda s, r: (
            s["communication_bound"] >= r.communication_share_from
            or s["memory_bound"] >= r.memory_share_from
            or s["low_occupancy"] >= r.low_occupancy_share_from
            or s["underutilized"] >= r.underutilized_share_from
        ),
        lambda s, r: r.larger_batch * max(s["stall_frac"], s["headroom_frac"]),
        lambda s: (
            f"communication-bound {_pct(s['communication_bound'])}, memory-bound {_pct(s['memory_bound'])}, "
            f"low occupancy {_pct(s['low_occupancy'])}, underutilized (10-70 %) {_pct(s['underutilized'])} "
            "of active minutes: larger per-GPU batches"
        ),
    ),
    # memory-bound: fewer round trips to DRAM
    Rule(
        "fused_kernels",
        "kernels",
        lambda s, r: s["memory_bound"] >= r.memory_share_from or _compute_heavy(s, r),
        lambda s, r: (
            (
                r.fused_kernels_memory
                if s["memory_bound"] >= r.memory_share_from
                else r.fused_kernels_compute
            )
            * s["headroom_frac"]
        ),
        lambda s: (
            f"memory-bound {_pct(s['memory_bound'])}, compute-bound {_pct(s['compute_bound'])} of active "
            f"minutes; headroom ${s['headroom_usd']:,.2f}/day: fused kernels (FlashAttention, fused optimizers)"
        ),
    ),
    Rule(
        "torch.compile",
        "kernels",
        _compute_heavy,
        lambda s, r: r.torch_compile * s["headroom_frac"],
        lambda s: (
            f"compute-bound {_pct(s['compute_bound'])} of active minutes: torch.compile to fuse and tune kernels"
        ),
    ),
    # precision: use the tensor cores
    Rule(
        "AMP",
        "precision",
        lambda s, r: _tensor_idle(s, r) or _compute_heavy(s, r),
        _precision,
        lambda s: (
            f"tensor pipe idle in {_pct(s['tensor_cores_unused'])}, compute-bound in "
            f"{_pct(s['compute_bound'])} of active minutes: automatic mixed precision"
        ),
    ),
    # BF16 and FP8: over the GPUs that support them (their minutes' shares, their headroom)
    Rule(
        "BF16",
        "precision",
        lambda s, r: _precision_fires(s, r, "bf16"),
        lambda s, r: _precision(_on(s, "bf16"), r),
        lambda s: (
            f"tensor pipe idle in {_pct(s['bf16']['tensor_cores_unused'])}, compute-bound in "
            f"{_pct(s['bf16']['compute_bound'])} of the active minutes of BF16-capable GPUs: "
            "train in bfloat16 without loss scaling"
        ),
    ),
    Rule(
        "FP8",
        "precision",
        lambda s, r: s["fp8_capable"] and _compute_heavy(_on(s, "fp8"), r),
        lambda s, r: r.fp8 * s["fp8"]["headroom_frac"],
        lambda s: (
            f"compute-bound {_pct(s['fp8']['compute_bound'])} of active minutes on FP8-capable "
            "GPUs: FP8 (Transformer Engine) doubles tensor throughput"
        ),
    ),
)


def rule_minutes(minutes: pl.LazyFrame, prices: pl.DataFrame) -> pl.LazyFrame:
    """Minutes as namespaces own them (`allocated_minutes`: costs, weight `_w`) with `_spot`,
    the spot price of their model (null: none in the price book): what `rule_sums` reads."""
    spot = prices.lazy().select("model_key", pl.col("spot_usd_per_hour").alias("_spot"))
    return by_model(allocated_minutes(minutes), spot)


# the money a rule reads, summed over a group's minutes
RULE_MONEY = (
    "cost_usd",
    "productive_usd",
    "idle_waste_usd",
    "stall_waste_usd",
    "headroom_waste_usd",
)


def _rule_shares(pcie_busy_from: float, t: Thresholds) -> dict[str, tuple[pl.Expr, pl.Expr | None]]:
    """The shares rules read, by name: (the minutes counted, among which; None: all), each
    weighted by GPU share (MIG instances by slices); 0 where nothing qualifies."""
    active = pl.col("gpu_util_pct") >= t.idle_below
    starved = pl.col("diagnosis") == "data_starved"
    pcie = pl.col("pcie_rx_bytes_per_s")
    return {
        "idle_share": (pl.col("phase") == "idle", None),
        "bottlenecked": (pl.col("efficiency_class") == "bottlenecked", active),
        "underutilized": (pl.col("phase") == "underutilized", active),
        "_unknown": (pl.col("diagnosis") == "unknown", active),
        **{d: (pl.col("diagnosis") == d, active) for d in BOTTLENECK_DIAGNOSES},
        # of the data-starved minutes: how many have PCIe counters, how many with RX busy
        "pcie_measured": (pcie.is_not_null(), starved),
        "pcie_busy": (pcie >= pcie_busy_from, starved & pcie.is_not_null()),
        # on a GPU already split into MIG instances (an instance, or the free slices)
        "on_mig": (pl.col("gpu_instance_id").is_not_null() | mig_unallocated(), None),
    }


def rule_sums(
    pcie_busy_from: float = DIAGNOSIS.pcie_busy_from, t: Thresholds = DEFAULT
) -> list[pl.Expr]:
    """What a GPU's `rule_minutes` in a group add to the group's rule numbers (`rule_stats`):
    weights, money and the weights of each share's minutes, summed; whether one has a price.
    Aggregations over groups whose keys include `gpu_uuid` and `gpu_model`."""
    w = pl.col("_w")
    shares = _rule_shares(pcie_busy_from, t)
    return [
        w.sum().alias("_w"),
        pl.col("cost_usd").is_not_null().any().alias("_priced"),
        *[pl.col(c).sum() for c in RULE_MONEY],
        *[
            w.filter(cond if among is None else cond & among).sum().alias(f"_in_{name}")
            for name, (cond, among) in shares.items()
        ],
        *[
            (w if among is None else w.filter(among)).sum().alias(f"_of_{name}")
            for name, (_, among) in shares.items()
        ],
        # what spot would have cost for the same minutes (on-demand where a model has no spot price)
        (pl.coalesce("_spot", "price_usd_per_hour") * w / 60.0).sum().alias("_spot_cost"),
    ]


def rule_stats(
    pcie_busy_from: float = DIAGNOSIS.pcie_busy_from, t: Thresholds = DEFAULT
) -> list[pl.Expr]:
    """The measured numbers rules read, as aggregations of the `rule_sums` of a group's GPUs
    (a namespace's day here, a workload's in workload_efficiency)."""
    return [
        pl.col("gpu_uuid").n_unique().alias("gpus"),
        (pl.col("_w").sum() / 60.0).alias("gpu_hours"),
        pl.col("_priced").any(),
        *[pl.col(c).sum() for c in RULE_MONEY],
        *[
            ratio(pl.col(f"_in_{name}").sum(), pl.col(f"_of_{name}").sum())
            .fill_null(0.0)
            .alias(name)
            for name in _rule_shares(pcie_busy_from, t)
        ],
        pl.col("_spot_cost").sum(),
        pl.col("gpu_model").drop_nulls().unique().sort().alias("models"),
        *_capable_stats(),
    ]


# the precisions advised over the GPUs that support them, and the figures of those GPUs
PRECISIONS = ("bf16", "fp8")
PRECISION_SHARES = ("compute_bound", "tensor_cores_unused")


def _capable_stats() -> list[pl.Expr]:
    """Per precision, the figures of the group's GPUs that support it (`with_precisions`:
    `_bf16`, `_fp8` on each GPU's `rule_sums`): whether there is one, their active minutes'
    compute-bound and tensor-idle shares, their headroom dollars. None without the flags."""
    out = []
    for p in PRECISIONS:
        on = pl.col(f"_{p}")
        out += [
            on.any().alias(f"_{p}_capable"),
            pl.col("headroom_waste_usd").filter(on).sum().alias(f"_{p}_headroom_usd"),
            *[
                ratio(pl.col(f"_in_{n}").filter(on).sum(), pl.col(f"_of_{n}").filter(on).sum())
                .fill_null(0.0)
                .alias(f"_{p}_{n}")
                for n in PRECISION_SHARES
            ],
        ]
    return out


def with_precisions(per_gpu: pl.DataFrame, caps: dict | None = None) -> pl.DataFrame:
    """Each GPU's `rule_sums` with `_bf16` and `_fp8`: does its model support the precision
    (the catalog's `bf16` / `fp8`, else its name; `_capable`), decided once per model."""
    models = per_gpu["gpu_model"].drop_nulls().unique().to_list()
    flags = []
    for i, (p, rx) in enumerate(zip(PRECISIONS, (BF16_CAPABLE, FP8_CAPABLE), strict=True)):
        known = {m: _capable({"models": [m]}, caps or {}, i, rx) for m in models}
        flags.append(
            pl.col("gpu_model")
            .replace_strict(known, default=False, return_dtype=pl.Boolean)
            .fill_null(False)
            .alias(f"_{p}")
        )
    return per_gpu.with_columns(flags)


def namespace_stats(
    minutes: pl.LazyFrame,
    prices: pl.DataFrame,
    pcie_busy_from: float = DIAGNOSIS.pcie_busy_from,
    t: Thresholds = DEFAULT,
    chunking: Chunking = DEFAULT_CHUNKING,
    caps: dict | None = None,
) -> pl.DataFrame:
    """The measured numbers rules read, one row per day and namespace: each GPU's `rule_sums`
    a chunk of GPUs at a time (`by_gpu_chunks`), added up per namespace (`caps`: which
    precisions each model supports, `precision_caps`)."""
    per_gpu = by_gpu_chunks(
        minutes,
        lambda m: (
            rule_minutes(m, prices)
            .group_by("date", "namespace", "gpu_uuid", "gpu_model", maintain_order=True)
            .agg(*rule_sums(pcie_busy_from, t))
        ),
        chunking,
    )
    return collect_stable(
        with_precisions(per_gpu, caps)
        .lazy()
        .group_by("date", "namespace")
        .agg(*rule_stats(pcie_busy_from, t))
        .sort("date", "namespace", nulls_last=True)
    )


def _capable(
    row: dict, caps: dict[str, tuple[bool | None, bool | None]], which: int, rx: str
) -> bool:
    """Does any of the namespace's models support the precision? The catalog says (`bf16`, `fp8`
    columns); a model it leaves open is judged by its name."""
    for m in row["models"] or []:
        known = caps.get(_key(m), (None, None))[which]
        if known is None:
            known = _named(m, rx)
        if known:
            return True
    return False


# a day's groups name the same few models hundreds of times: each answer is worked out once
# (a Polars query each, ~0.3 ms; `make bench-day`: 0.4 s of workload_efficiency's 1.3 s)
@functools.lru_cache(maxsize=4096)
def _key(model: str) -> str:
    return pl.select(model_key(pl.lit(model))).item()


@functools.lru_cache(maxsize=4096)
def _named(model: str, rx: str) -> bool:
    """Does the model's name say the precision (`rx`, on the name in capitals)?"""
    return bool(pl.select(pl.lit(model.upper()).str.contains(rx)).item())


def actions(
    row: dict, caps: dict | None = None, r: RecommendationThresholds = RECOMMEND
) -> list[dict]:
    """The actions whose rules fire on a group's `rule_stats` row, each with its fraction of
    the group's cost, overlap group and rationale, in `RULES` order, then spot (the `rate`
    group) when its saving passes `r.rate_saving_from`. None on a group without a price (no
    money to weigh)."""
    if not row.get("_priced", True):
        return []
    cost = row["cost_usd"] or 0.0
    s = _signals(row, caps or {}, r, cost)
    details = []
    for rule in RULES:
        if rule.when(s, r):
            f = min(max(rule.fraction(s, r), 0.0), 1.0)
            if f > 0:
                details.append(
                    {
                        "action": rule.action,
                        "group": rule.group,
                        "fraction": f,
                        "rationale": rule.why(s),
                    }
                )
    rate = 1.0 - row["_spot_cost"] / cost if cost else 0.0
    if rate > r.rate_saving_from:
        details.append(
            {
                "action": "spot",
                "group": "rate",
                "fraction": rate,
                "rationale": f"spot prices would cut this namespace's ${cost:,.2f}/day by "
                f"{_pct(rate)} for interruption-tolerant work (checkpointed training, batch "
                "inference): the same work, a lower rate",
            }
        )
    return details


def top_waste_action(details: list[dict]) -> str | None:
    """The action recovering the largest share of the group's wasted GPU time (the first in
    `RULES` order on a tie); spot is a rate, not waste, and is never it. None: no waste
    action fires."""
    best = None
    for d in details:
        if d["group"] != "rate" and (best is None or d["fraction"] > best["fraction"]):
            best = d
    return None if best is None else best["action"]


def _recommend(
    row: dict, caps: dict | None = None, r: RecommendationThresholds = RECOMMEND
) -> dict:
    if not row.get("_priced", True):
        # no minute of the namespace has a price: its cost, waste and savings are unknown, not
        # $0 (a 0 would read as "nothing to save"); no rule fires without money to weigh
        return _unpriced(row)
    cost = row["cost_usd"] or 0.0
    idle, stall, headroom = (
        row[c] or 0.0 for c in ("idle_waste_usd", "stall_waste_usd", "headroom_waste_usd")
    )
    # float sums of the components can land a hair above 1: a fraction of cost is at most 1
    waste_frac = min(1.0, (idle + stall + headroom) / cost) if cost else 0.0
    details = actions(row, caps, r)
    utilization = _utilization_savings(details, waste_frac)
    rate = next((d["fraction"] for d in details if d["group"] == "rate"), 0.0)
    total = 1.0 - (1.0 - utilization) * (1.0 - rate)
    return {
        "date": row["date"],
        "namespace": row["namespace"],
        "gpus": row["gpus"],
        "gpu_hours": row["gpu_hours"],
        "cost_usd": cost,
        "measured_waste_frac": waste_frac,
        "actions": [d["action"] for d in details],
        "action_details": details,
        "naive_sum_frac": sum(d["fraction"] for d in details),
        "utilization_savings_frac": utilization,
        "rate_savings_frac": rate,
        "total_savings_frac": total,
        "monthly_cost_usd": cost * DAYS_PER_MONTH,
        "monthly_savings_usd": round(total * cost * DAYS_PER_MONTH, 2),
    }


def _signals(row: dict, caps: dict, r: RecommendationThresholds, cost: float) -> dict:
    """What the rules read of a namespace's day: its row, the waste in dollars and as fractions
    of `cost`, and the flags the thresholds and its models decide (an unprofiled bottleneck,
    PCIe measured and loading, MIG, bf16 and fp8 capable)."""
    models = " ".join(row["models"] or []).upper()
    return {
        **row,
        "idle_usd": row["idle_waste_usd"] or 0.0,
        "stall_usd": row["stall_waste_usd"] or 0.0,
        "headroom_usd": row["headroom_waste_usd"] or 0.0,
        "idle_frac": (row["idle_waste_usd"] or 0.0) / cost if cost else 0.0,
        "stall_frac": (row["stall_waste_usd"] or 0.0) / cost if cost else 0.0,
        "headroom_frac": (row["headroom_waste_usd"] or 0.0) / cost if cost else 0.0,
        "unprofiled_bottleneck": row["_unknown"] > r.unprofiled_unknown_above
        and row["bottlenecked"] >= r.unprofiled_bottlenecked_from,
        "pcie_known": row.get("pcie_measured", 0.0) >= r.pcie_measured_from,
        "pcie_loading": row.get("pcie_busy", 0.0) >= r.pcie_busy_share_from,
        # a namespace whose GPU-time is all on MIG instances (or free slices) is split already:
        # "split GPUs into MIG instances" is no advice for it (adversarial review)
        "mig_capable": bool(pl.select(pl.lit(models).str.contains(MIG_CAPABLE)).item())
        and row.get("on_mig", 0.0) < 0.999,
        **_precision_signals(row, caps, cost),
    }


def _precision_signals(row: dict, caps: dict, cost: float) -> dict:
    """Per precision: whether a GPU of the group supports it (`bf16_capable`, `fp8_capable`)
    and the shares and headroom fraction of those GPUs (`bf16`, `fp8`: `rule_stats`'
    `_capable_stats`). A row without them (one made by hand) reads the group's own."""
    out = {}
    for i, (p, rx) in enumerate(zip(PRECISIONS, (BF16_CAPABLE, FP8_CAPABLE), strict=True)):
        if f"_{p}_capable" not in row:
            out[f"{p}_capable"] = _capable(row, caps, i, rx)
            headroom = row["headroom_waste_usd"] or 0.0
            out[p] = {n: row[n] for n in PRECISION_SHARES}
        else:
            out[f"{p}_capable"] = bool(row[f"_{p}_capable"])
            headroom = row[f"_{p}_headroom_usd"] or 0.0
            out[p] = {n: row[f"_{p}_{n}"] for n in PRECISION_SHARES}
        out[p]["headroom_frac"] = headroom / cost if cost else 0.0
    return out


def _utilization_savings(details: list[dict], waste_frac: float) -> float:
    """The fraction of cost the utilization actions save together: within an overlap group the
    best one, the groups compounded (each saves from what the others leave), at most the
    measured waste (`waste_frac`)."""
    best: dict[str, float] = {}
    for d in details:
        if d["group"] != "rate":
            best[d["group"]] = max(best.get(d["group"], 0.0), d["fraction"])
    keep = 1.0
    for f in best.values():
        keep *= 1.0 - f
    return min(1.0 - keep, waste_frac)


def _unpriced(row: dict) -> dict:
    """The row of a namespace none of whose minutes has a price: money and fractions null."""
    money = (
        "cost_usd",
        "measured_waste_frac",
        "utilization_savings_frac",
        "rate_savings_frac",
        "total_savings_frac",
        "monthly_cost_usd",
        "monthly_savings_usd",
    )
    return {
        **{c: row[c] for c in ("date", "namespace", "gpus", "gpu_hours")},
        **dict.fromkeys(money),
        "actions": [],
        "action_details": [],
        "naive_sum_frac": 0.0,
    }


def precision_caps(catalog: pl.DataFrame | None) -> dict[str, tuple[bool | None, bool | None]]:
    """Which precisions the catalog says each model supports: model key -> (bf16, fp8); empty
    without a catalog or without those columns (the rules then judge models by name)."""
    if catalog is None or not {"bf16", "fp8"} <= set(catalog.columns):
        return {}
    return {
        row["model_key"]: (row["bf16"], row["fp8"])
        for row in catalog.select("model_key", "bf16", "fp8").iter_rows(named=True)
    }


def recommendations(
    minutes: pl.LazyFrame,
    prices: pl.DataFrame,
    catalog: pl.DataFrame | None = None,
    d: DiagnosisThresholds = DIAGNOSIS,
    r: RecommendationThresholds = RECOMMEND,
    t: Thresholds = DEFAULT,
    chunking: Chunking = DEFAULT_CHUNKING,
) -> pl.DataFrame:
    """One row per day and namespace (a small table: rules run per row of it, not per minute).
    `catalog`: the GPU catalog, whose `bf16` / `fp8` columns say which precisions to advise;
    `r`: when each action fires and what it recovers; `t`: what counts as an active minute."""
    caps = precision_caps(catalog)
    stats = namespace_stats(minutes, prices, d.pcie_busy_from, t, chunking, caps)
    rows = [_recommend(row, caps, r) for row in stats.iter_rows(named=True)]
    return (
        pl.DataFrame(rows, schema=RECOMMENDATIONS_SCHEMA)
        if rows
        else pl.DataFrame(schema=RECOMMENDATIONS_SCHEMA)
    )
