"""Summary statistics of a list of samples."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any


def summary(values: Iterable[float | None]) -> dict[str, Any]:
    """n, min, median, mean, max (and stdev from two samples on); None fields when empty."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"n": 0, "min": None, "median": None, "mean": None, "max": None, "stdev": None}
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs),
            "max": max(xs), "stdev": statistics.stdev(xs) if len(xs) > 1 else None}


def change(new: float | None, old: float | None) -> float | None:
    """Relative change new vs old (+0.24 means +24%); None when not computable."""
    if new is None or old is None or old == 0:
        return None
    return new / old - 1.0


def ratio(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return new / old


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if v < 1000 else f"{v:,.0f}"


def fmt_change(c: float | None) -> str:
    if c is None:
        return "-"
    return f"{c * 100:+.0f}%"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"
