"""Launch paths: what an engine release can make run for a plan's MoE layers, the unit a recipe decides among.

A launch path is one way the engine release selects its MoE path for the layers' quant method — the arguments and
environment of one capability_db/engines.toml backend row — with the allocation the engine then makes and, on
``aiter.fused_moe``, what AITER's dispatcher runs per token count at that allocation. Several of moedispatch's
backends can be one path: ``aiter-ck``, ``aiter-cktile``, ``aiter-flydsl`` and ``aiter-asm`` are all
``--moe-backend aiter`` on vLLM, where no flag picks among them — AITER does, per bucket. So the recipe chooses a
path; the family AITER runs is an outcome of it (issue 23 item 1).

This module holds the value and its ranking (pure); :mod:`moedispatch.engines.recipes` evaluates each path (the
engine's own pick, allocation, gates and known issues, and the cost at the engine's allocation). Paths are ranked as
the selector ranks backends (:func:`moedispatch.cost.ranking.rank`): a realizable path moves above another only when
its predicted-time bars lie wholly below the other's; otherwise the plan's order (its correctness-then-cost ranking
of the backends) stands. Refused paths follow, each with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from moedispatch.core.costs import Cost, format_cost
from moedispatch.core.reason import Reason, texts
from moedispatch.cost.ranking import rank

__all__ = ["LaunchPath", "rank_paths"]


@dataclass(frozen=True)
class LaunchPath:
    """One engine launch path for the MoE layers.

    ``args``/``env``: the engine arguments and environment that select it; ``backends``: the plan's correct backends
    this path is, in the plan's order; ``backend``: the first of them whose checks pass at the engine's allocation
    (None: the path is refused, ``refusals`` say why per backend); ``costs``: the MoE layers' total predicted time per
    planned token count at the engine's allocation (``()``: not predicted); ``families``: what AITER runs there
    (aiter.fused_moe paths); ``why``: the ranking's reason when cost, not the plan's order, put it below the path
    above it. ``rows``/``warnings``: the engine rows and the notes of realizing it (for the recipe)."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    backends: tuple[str, ...]
    backend: str | None
    refusals: tuple[Reason, ...] = ()
    costs: tuple[Cost, ...] = ()
    families: tuple[str, ...] = ()
    why: str | None = None
    rows: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    warnings: tuple[Reason, ...] = field(default=(), compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.backend is not None

    @property
    def label(self) -> str:
        """``VLLM_ROCM_USE_AITER=1 --moe-backend aiter``: the path as a user sets it (its env, then its arguments);
        a backend with no engine row is named by the backend."""
        words = [f"{k}={v}" for k, v in self.env] + list(self.args)
        return " ".join(words) or f"({self.backends[0]}: no engine flag)"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "args": list(self.args), "env": dict(self.env), "backends": list(self.backends),
                "backend": self.backend, "ok": self.ok, "families": list(self.families),
                "cost_total": [c.to_dict(with_basis=False) for c in self.costs], "why": self.why,
                "reasons": texts(self.refusals)}

    def summary(self) -> str:
        """One line: the path, what runs, its predicted MoE time at the largest planned token count, or why not."""
        if not self.ok:
            first = self.refusals[0].text if self.refusals else "refused"
            more = f" (+{len(self.refusals) - 1} more)" if len(self.refusals) > 1 else ""
            return f"{self.label}: refused — {first}{more}"
        runs = f"AITER runs {'+'.join(self.families)}" if self.families else f"runs {self.backend}"
        at = (f"; MoE total {format_cost(self.costs[-1])} at {self.costs[-1].tokens} "
              f"token{'s' if self.costs[-1].tokens != 1 else ''}") if self.costs else ""
        return f"{self.label}: {runs}{at}"


def rank_paths(paths: Sequence[LaunchPath]) -> list[LaunchPath]:
    """The realizable paths best first — the plan's order, a path moving up only past one whose bars it beats
    (:func:`moedispatch.cost.ranking.rank`) — then the refused ones in the plan's order."""
    ok = [p for p in paths if p.ok]
    order = rank([(p.label, -i, p.costs) for i, p in enumerate(ok)])
    by_label = {p.label: p for p in ok}
    return [replace(by_label[name], why=why) for name, why in order] + [p for p in paths if not p.ok]
