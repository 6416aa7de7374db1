"""The :class:`Cost` value (a predicted fused-MoE time with its error bar) and its one text form.

A value of the plugin API: a plugin answering ``moe_cost`` returns it (``from moedispatch.cost import Cost`` or
``from moedispatch import Cost``); the cost model (:mod:`moedispatch.cost.model`) computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cost", "BASES", "format_cost"]

#: The contract's ``basis`` values.
BASES = ("tuned", "interpolated", "roofline", "plugin")


@dataclass(frozen=True)
class Cost:
    """Predicted time of one fused-MoE call at ``tokens`` tokens: ``us`` within ``[low, high]`` microseconds.

    ``basis`` is one of :data:`BASES`; ``detail`` says how it was computed (row ``file:line`` and whose release's µs,
    prior used, the heuristic factor, …): the contract dict carries it as ``detail`` (an extension) when non-empty.
    """

    tokens: int
    us: float
    low: float
    high: float
    basis: str
    detail: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"Cost.basis must be one of {', '.join(BASES)}, got {self.basis!r}")
        if not (0 < self.low <= self.us <= self.high) or not all(map(math.isfinite, (self.low, self.us, self.high))):
            raise ValueError(f"Cost needs 0 < low <= us <= high (finite), got {self.low}, {self.us}, {self.high}")

    def to_dict(self, *, with_basis: bool = True) -> dict[str, Any]:
        """The contract's ``{tokens, us, low, high, basis}`` and ``detail`` when there is one (``with_basis=False``: a
        ``cost_total`` entry, neither)."""
        out: dict[str, Any] = {"tokens": self.tokens, "us": round(self.us, 4), "low": round(self.low, 4),
                               "high": round(self.high, 4)}
        if with_basis:
            out["basis"] = self.basis
            if self.detail:
                out["detail"] = self.detail
        return out


def format_cost(c: Cost) -> str:
    """``41 µs (35–48)``; one decimal below 10 µs."""
    def f(x: float) -> str:
        return f"{x:.1f}" if x < 10 else f"{x:,.0f}"
    return f"{f(c.us)} µs ({f(c.low)}–{f(c.high)})"
