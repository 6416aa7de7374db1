"""The :class:`Decision` value (and :class:`Rejection`): what every output renders.

Values only: no selection logic here. The selector builds Decisions; the table, the JSON, logs, errors, the engine
API and recipes read them (by ``Reason.kind``, never by text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import MoedispatchError
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason, texts

__all__ = ["Rejection", "Decision"]


@dataclass(frozen=True)
class Rejection:
    """A backend that was not chosen, and why (failed rules, or "supported, outranked by …")."""

    backend: str
    reasons: tuple[Reason, ...]
    supported: bool = False
    #: Predicted time per token count of a correct backend that lost (``moedispatch.cost.model.Cost``), when planned.
    cost: tuple[Any, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "reasons": texts(self.reasons),
                               "reason_details": [r.to_dict() for r in self.reasons]}
        if self.cost:
            out["cost"] = [c.to_dict() for c in self.cost]
        return out


@dataclass(frozen=True)
class Decision:
    """Which backend runs one layer, with what padding, and why; plus why every other backend did not.

    ``backend`` is ``None`` for dense layers and for MoE layers no backend can run (then ``NoBackendError``
    carries this Decision). ``padding`` is always present: for a chosen backend its plan, else the unpadded sizes.
    ``warnings`` are the reasons of kind ``warning`` (the user must act on them), ``target`` the target the decision
    was made for (``Capabilities.target_dict()``; engines see which GPU and AITER were assumed).
    """

    layer: MoELayer
    backend: str | None
    padding: Padding
    reasons: tuple[Reason, ...]
    rejected: tuple[Rejection, ...] = ()
    family: str | None = None
    preference: int | None = None
    forced: bool = False
    warnings: tuple[Reason, ...] = field(default=())
    caps: Capabilities | None = field(default=None, compare=False, repr=False)
    #: What AITER's own dispatcher runs per token count (``moedispatch.aiter.dispatch.DispatchPlan``) for an AITER
    #: backend planned with a ``Runtime``; None otherwise.
    dispatch: Any = field(default=None, compare=False, repr=False)
    #: Predicted time per token count of the chosen backend (``moedispatch.cost.model.Cost``), when planned.
    cost: tuple[Any, ...] = ()

    @property
    def target(self) -> dict[str, Any] | None:
        """The target this decision was made for (``Capabilities.target_dict()``: gfx, product, CUs, AITER, source)."""
        return self.caps.target_dict() if self.caps is not None else None

    @property
    def ok(self) -> bool:
        return self.backend is not None or self.layer.kind == "dense"

    def rejection(self, backend: str) -> Rejection | None:
        for rej in self.rejected:
            if rej.backend == backend:
                return rej
        return None

    def of_kind(self, *kinds: str) -> tuple[Reason, ...]:
        """This decision's reasons whose kind is one of ``kinds``."""
        return tuple(r for r in self.reasons if r.kind in kinds)

    @property
    def caveats(self) -> tuple[Reason, ...]:
        """Run-time risks the plan cannot rule out (reasons of kind ``caveat``: token-count dependent crashes and
        wrong output, scale-tile splits) — what explain prints as ``caveat`` lines. :attr:`warnings` are the ones the
        user must act on; an engine that logs a decision should log both."""
        return self.of_kind("caveat")

    def __str__(self) -> str:
        """One line an engine can log: layer, backend (or why none), padding, target, warnings and caveats."""
        layer = f"layer {self.layer.index}"
        if self.layer.kind == "dense":
            return f"{layer}: dense MLP (no MoE backend)"
        pad = self.padding
        padding = (f"padded to hidden {pad.hidden} × intermediate/rank {pad.intermediate_per_rank}"
                   if getattr(pad, "padded", False) else "no padding")
        target = self.target or {}
        where = " ".join(str(target[k]) for k in ("gfx", "product") if target.get(k))
        where += f", AITER {target['aiter_version']}" if target.get("aiter_version") else ""
        head = f"{layer}: {self.backend}" if self.backend else f"{layer}: NO correct backend"
        if self.backend is None:
            fails = [r.text for rej in self.rejected for r in rej.reasons if r.kind == "failed"][:1]
            head += f" ({fails[0]})" if fails else ""
        tail = "; ".join(f"{kind}: {r.text.removeprefix(kind + ' ')}"
                         for kind, rs in (("warning", self.warnings), ("caveat", self.caveats)) for r in rs)
        return f"{head}, {padding}" + (f" on {where}" if where else "") + (f" — {tail}" if tail else "")

    def to_dict(self) -> dict[str, Any]:
        """Exactly the decision fields of an explain layer entry: backend, padding, reasons (+ reason_details),
        rejected; ``aiter_dispatch`` and ``cost`` when the decision was planned with a Runtime."""
        return {
            "backend": self.backend,
            "padding": self.padding.to_dict(),
            "reasons": texts(self.reasons),
            "reason_details": [r.to_dict() for r in self.reasons],
            "rejected": [r.to_dict() for r in self.rejected],
            **({"aiter_dispatch": [s.to_dict() for s in self.dispatch.steps]} if self.dispatch is not None else {}),
            **({"cost": [c.to_dict() for c in self.cost]} if self.cost else {}),
        }

    def group_key(self) -> tuple:
        """Layers with equal keys render as one group."""
        return (self.layer.signature(), self.backend, self.padding, self.reasons, self.rejected, self.warnings)


class NoBackendError(MoedispatchError):
    """No registered backend can run a layer correctly (or a forced backend cannot).

    ``decision`` holds the full :class:`Decision` (``backend`` is ``None``) with every
    rejection and its reasons.
    """

    def __init__(self, message: str, decision: Decision) -> None:
        super().__init__(message)
        self.decision = decision
