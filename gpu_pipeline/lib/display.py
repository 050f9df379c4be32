"""How numbers and missing values read wherever a person sees them (the report, the terminal)."""

from __future__ import annotations

NO_NAMESPACE = "(no namespace)"  # GPUs whose series carry no namespace label
NO_PRICE = "n/a (no price)"  # no minute of the period has a price (model not in the price book)
NO_POWER = "n/a (no power)"  # no minute of the period has a power reading: energy is unknown


def num(v: float | None, fmt: str, none: str = "n/a", unit: str = "") -> str:
    """`v` formatted with its unit, or `none` (no unit) when there is no value (None or NaN)."""
    return none if v is None or v != v else format(v, fmt) + unit


def text(v: object, none: str) -> str:
    """A label from the data, or `none` in its place."""
    return none if v is None else str(v)


def usd(v: float | None, fmt: str = ",.2f", none: str = "n/a") -> str:
    """Dollars (`$1,234.00`), or `none` when nothing was priced."""
    return none if v is None or v != v else "$" + format(v, fmt)
