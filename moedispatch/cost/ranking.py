"""Totals and comparisons of predicted costs: :func:`total` over layers, :func:`compare` / :func:`reason` of two
backends (bars separate or not), :func:`rank` of a layer's correct candidates."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from moedispatch.core.costs import Cost, format_cost


_WEAKEST = {"tuned": 0, "interpolated": 1, "plugin": 2, "roofline": 3}


def total(costs_per_layer: Iterable[Sequence[Cost]]) -> tuple[Cost, ...]:
    """The model's total MoE time per token count: sums of ``us``, ``low`` and ``high`` over the layers.

    Pass one cost tuple per MoE layer (a model with 57 identical MoE layers passes 57 tuples). Bounds add up
    (errors of identical layers are fully correlated, so the sum of bounds is the honest bound). The total at the
    decode batch size is the decode step's MoE time; at the prefill chunk size, a prefill chunk's. Its basis is the
    weakest basis among the layers; use ``to_dict(with_basis=False)`` for the contract's ``cost_total``.
    """
    sums: dict[int, list[float]] = {}
    basis: dict[int, str] = {}
    order: list[int] = []
    for costs in costs_per_layer:
        for c in costs:
            if c.tokens not in sums:
                sums[c.tokens] = [0.0, 0.0, 0.0]
                basis[c.tokens] = c.basis
                order.append(c.tokens)
            s = sums[c.tokens]
            s[0] += c.us
            s[1] += c.low
            s[2] += c.high
            if _WEAKEST[c.basis] > _WEAKEST[basis[c.tokens]]:
                basis[c.tokens] = c.basis
    return tuple(Cost(t, sums[t][0], sums[t][1], sums[t][2], basis[t], "sum over MoE layers") for t in order)


def _pairs(a: Sequence[Cost], b: Sequence[Cost]) -> list[tuple[Cost, Cost]]:
    bt = {c.tokens: c for c in b}
    return [(c, bt[c.tokens]) for c in a if c.tokens in bt]


def compare(a_costs: Sequence[Cost], b_costs: Sequence[Cost]) -> str:
    """``"faster"`` if a's bars lie wholly below b's at some common token count and above at none; ``"slower"``
    the other way round; else ``"tie"`` (overlapping bars, mixed outcomes or no common token count)."""
    faster = slower = False
    for a, b in _pairs(a_costs, b_costs):
        if a.high < b.low:
            faster = True
        elif a.low > b.high:
            slower = True
    if faster and not slower:
        return "faster"
    if slower and not faster:
        return "slower"
    return "tie"


def reason(a_name: str, a_costs: Sequence[Cost], b_name: str, b_costs: Sequence[Cost],
           tokens: int | None = None) -> str:
    """``"aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens"``: at ``tokens``, else at the
    token count where the bars are furthest apart (the first common one when none separate)."""
    pairs = _pairs(a_costs, b_costs)
    if not pairs:
        return f"{a_name} vs {b_name}: no common token count"
    if tokens is not None:
        chosen = [p for p in pairs if p[0].tokens == tokens] or pairs[:1]
        a, b = chosen[0]
    else:
        def gap(p: tuple[Cost, Cost]) -> float:
            x, y = p
            return max(math.log(y.low / x.high), math.log(x.low / y.high))
        a, b = max(pairs, key=gap)
    unit = "token" if a.tokens == 1 else "tokens"
    return f"{a_name} {format_cost(a)} vs {b_name} {format_cost(b)} at {a.tokens} {unit}"


def rank(candidates: Sequence[tuple[str, int, Sequence[Cost]]]) -> list[tuple[str, str | None]]:
    """Order correct backends by predicted time where the bars separate them; preference breaks ties.

    :param candidates: ``(name, preference, costs)`` per correct backend (``costs`` may be ``()``: not predicted).
    :returns: ``[(name, why), ...]`` best first. ``why`` is ``None`` for the winner; for every other backend it is
        the :func:`reason` text against the backend ranked just above it when their bars separate (cost decided),
        else ``None`` (preference decided, as before).

    Start from preference order (higher first, ties by name); a backend moves above its neighbour only when
    :func:`compare` says ``"faster"``, so a backend without a prediction never moves and never gets overtaken.
    """
    order = sorted(candidates, key=lambda c: (-c[1], c[0]))
    for _ in range(len(order) ** 2):
        moved = False
        for i in range(1, len(order)):
            if order[i][2] and order[i - 1][2] and compare(order[i][2], order[i - 1][2]) == "faster":
                order[i - 1], order[i] = order[i], order[i - 1]
                moved = True
        if not moved:
            break
    out: list[tuple[str, str | None]] = []
    for i, (name, _pref, costs) in enumerate(order):
        why = None
        if i:
            above = order[i - 1]
            if costs and above[2] and compare(above[2], costs) == "faster":
                why = reason(above[0], above[2], name, costs)
        out.append((name, why))
    return out
