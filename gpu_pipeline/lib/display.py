"""How numbers and missing values read wherever a person sees them (the report, the terminal)."""

from __future__ import annotations

import unicodedata

NO_NAMESPACE = "(no namespace)"  # GPUs whose series carry no namespace label
NO_PRICE = "n/a (no price)"  # no minute of the period has a price (model not in the price book)
NO_WORKLOAD = "(no pod)"  # GPU-minutes whose series carry no pod label: no workload
NO_POWER = "n/a (no power)"  # no minute of the period has a power reading: energy is unknown


def num(v: float | None, fmt: str, none: str = "n/a", unit: str = "") -> str:
    """`v` formatted with its unit, or `none` (no unit) when there is no value (None or NaN)."""
    return none if v is None or v != v else format(v, fmt) + unit


def text(v: object, none: str) -> str:
    """A label from the data, or `none` in its place."""
    return none if v is None else str(v)


# what a label from the data must not carry to a reader as it is (the terminal, the digest):
# control characters (a newline or CR starts a line of the label's choosing; ESC colours the
# screen or plants a link), format characters, among them the bidi controls (U+202A–U+202E,
# U+2066–U+2069, U+200E, U+200F, U+061C), which reverse the text after them ("$2,160/month"
# read "htnom/061,2$"), line and paragraph separators (U+2028, U+2029) and lone surrogates
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def unsafe(ch: str) -> bool:
    """Is `ch` a character a label must not show as it is (UNSAFE_CATEGORIES)?"""
    return unicodedata.category(ch) in UNSAFE_CATEGORIES


def usd(v: float | None, fmt: str = ",.2f", none: str = "n/a") -> str:
    """Dollars (`$1,234.00`), or `none` when nothing was priced."""
    return none if v is None or v != v else "$" + format(v, fmt)


def plural(n: int, word: str, many: str = "") -> str:
    """`1 GPU`, `2 GPUs` (`many`: an irregular plural)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


# what people read in place of the marts' codes (the code stays in a tooltip)
ACTIONS = {
    "DALI": "Decode and augment on the GPU (NVIDIA DALI)",
    "num_workers": "More data-loader workers",
    "pin_memory": "Pinned host memory for copies",
    "AMP": "Automatic mixed precision",
    "BF16": "Train in bfloat16",
    "FP8": "FP8 on the tensor cores",
    "torch.compile": "Compile the model (torch.compile)",
    "larger_batch": "Larger batches per GPU",
    "gradient_accumulation": "Accumulate gradients, sync less often",
    "MPS": "Share GPUs between small jobs (MPS)",
    "MIG": "Split GPUs into right-sized slices (MIG)",
    "right_size": "Release idle GPUs",
    "spot": "Run on spot capacity",
    "fused_kernels": "Fused kernels",
}
# an action's overlap group: the waste it recovers
GROUPS = {
    "idle_wallclock": "time the GPU waits for work",
    "batching": "synchronization and batch size",
    "kernels": "kernel efficiency",
    "precision": "numeric precision",
    "rate": "price per GPU-hour",
}
DIAGNOSES = {
    "idle": "idle",
    "data_starved": "waiting for input data",
    "communication_bound": "waiting on GPU-to-GPU communication",
    "memory_bound": "limited by memory bandwidth",
    "compute_bound": "busy with math (compute-bound)",
    "tensor_cores_unused": "tensor cores unused",
    "low_occupancy": "kernels too small for the GPU",
    "mixed": "mixed",
    "unknown": "unknown (no profiling data)",
}
STRAGGLER_RULES = {
    "below_median": "far below its pod's median",
    "spread": "slowest GPU of an uneven pod",
}
METRICS = {"sm_active_pct": "SM active %", "gpu_util_pct": "utilization %"}
