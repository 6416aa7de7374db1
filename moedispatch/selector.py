"""The selector: one pure function from (layer, capabilities, backends) to a :class:`Decision`.

Every output (table, JSON, logs, errors, engine API, recipes) renders the same ``Decision``; nothing re-derives it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

from moedispatch._log import get_logger
from moedispatch.backend import Backend, Padding, Verdict
from moedispatch.capabilities import Capabilities
from moedispatch.errors import NoBackendError, PluginError, UsageError
from moedispatch.layers import MoELayer

__all__ = ["Rejection", "Decision", "select", "select_uncached"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Rejection:
    """A backend that was not chosen, and why (failed rules, or "supported, outranked by …")."""

    backend: str
    reasons: tuple[str, ...]
    supported: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Decision:
    """Which backend runs one layer, with what padding, and why; plus why every other backend did not.

    ``backend`` is ``None`` for dense layers and for MoE layers no backend can run (then ``NoBackendError``
    carries this Decision). ``padding`` is always present: for a chosen backend its plan, else the unpadded sizes.
    """

    layer: MoELayer
    backend: str | None
    padding: Padding
    reasons: tuple[str, ...]
    rejected: tuple[Rejection, ...] = ()
    family: str | None = None
    preference: int | None = None
    forced: bool = False
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.backend is not None or self.layer.kind == "dense"

    def rejection(self, backend: str) -> Rejection | None:
        for rej in self.rejected:
            if rej.backend == backend:
                return rej
        return None

    def to_dict(self) -> dict[str, Any]:
        """Exactly the decision fields of an explain layer entry: backend, padding, reasons, rejected."""
        return {
            "backend": self.backend,
            "padding": self.padding.to_dict(),
            "reasons": list(self.reasons),
            "rejected": [r.to_dict() for r in self.rejected],
        }

    def group_key(self) -> tuple:
        """Consecutive layers with equal keys render as one group."""
        return (self.layer.signature(), self.backend, self.padding, self.reasons, self.rejected, self.warnings)


def _order(backend: Backend) -> tuple[int, str]:
    return (-backend.preference, backend.name)


def _fmt_exc(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check(backend: Backend, layer: MoELayer, caps: Capabilities, strict: bool) -> Verdict:
    try:
        verdict = backend.check(layer, caps)
    except Exception as exc:
        if strict:
            raise PluginError(f"backend {backend.name!r}: check() raised {_fmt_exc(exc)}") from exc
        return Verdict(False, (f"plugin error: check() raised {_fmt_exc(exc)}",))
    if not isinstance(verdict, Verdict) or not all(isinstance(r, str) for r in verdict.reasons):
        message = f"plugin error: check() returned {type(verdict).__name__}, not a Verdict"
        if strict:
            raise PluginError(f"backend {backend.name!r}: {message[len('plugin error: '):]}")
        return Verdict(False, (message,))
    return verdict


def _plan(backend: Backend, layer: MoELayer, caps: Capabilities, strict: bool) -> Padding | str:
    """The backend's padding plan, or a reason string when the plugin failed or broke the Padding contract."""
    try:
        padding = backend.plan_padding(layer, caps)
    except Exception as exc:
        if strict:
            raise PluginError(f"backend {backend.name!r}: plan_padding() raised {_fmt_exc(exc)}") from exc
        return f"plugin error: plan_padding() raised {_fmt_exc(exc)}"
    problem = None
    if not isinstance(padding, Padding):
        problem = f"plan_padding() returned {type(padding).__name__}, not a Padding"
    elif padding.hidden - padding.hidden_pad != layer.hidden or \
            padding.intermediate_per_rank - padding.intermediate_pad != layer.intermediate_per_rank:
        problem = (f"plan_padding() returned sizes inconsistent with the layer (hidden {padding.hidden} - pad "
                   f"{padding.hidden_pad} != {layer.hidden} or intermediate {padding.intermediate_per_rank} - pad "
                   f"{padding.intermediate_pad} != {layer.intermediate_per_rank})")
    if problem:
        if strict:
            raise PluginError(f"backend {backend.name!r}: {problem}")
        return "plugin error: " + problem
    return padding


def select_uncached(
    layer: MoELayer,
    caps: Capabilities,
    backends: Sequence[Backend],
    force: str | None = None,
    strict: bool = False,
) -> Decision:
    """Ask every backend, keep the correct ones, order by preference, plan padding for the winner.

    Raises :class:`NoBackendError` (carrying the Decision) when nothing can run the layer or the forced backend
    cannot; :class:`UsageError` for a forced name that is not registered.
    """
    names = [b.name for b in backends]
    if force is not None and force not in names:
        raise UsageError(f"unknown backend {force!r}; registered: {', '.join(sorted(names)) or 'none'}")
    if layer.kind == "dense":
        return Decision(layer, None, Padding.none(layer),
                        ("dense MLP layer: not a MoE layer, no MoE backend is selected",))

    verdicts = {b.name: _check(b, layer, caps, strict) for b in backends}
    ranked = sorted(backends, key=_order)
    candidates = [b for b in ranked if verdicts[b.name].supported]
    if force is not None:
        candidates = [b for b in candidates if b.name == force]

    failed_plans: dict[str, str] = {}
    winner: Backend | None = None
    padding: Padding | None = None
    for candidate in candidates:
        plan = _plan(candidate, layer, caps, strict)
        if isinstance(plan, str):
            failed_plans[candidate.name] = plan
            continue
        winner, padding = candidate, plan
        break

    rejected: list[Rejection] = []
    for b in ranked:
        if winner is not None and b is winner:
            continue
        verdict = verdicts[b.name]
        if b.name in failed_plans:
            rejected.append(Rejection(b.name, (failed_plans[b.name],)))
        elif not verdict.supported:
            rejected.append(Rejection(b.name, verdict.reasons))
        elif winner is None:
            # Only reachable when another backend was forced and failed.
            rejected.append(Rejection(b.name, (f"supported, not considered: --backend {force} was forced",)
                                      + verdict.reasons, supported=True))
        elif force is not None:
            rejected.append(Rejection(b.name, (f"supported, not chosen: --backend {force} was forced",)
                                      + verdict.reasons, supported=True))
        else:
            cmp = ">" if winner.preference > b.preference else "=" if winner.preference == b.preference else "<"
            tie = ", name order" if cmp == "=" else ""
            rejected.append(Rejection(
                b.name,
                (f"supported, outranked by {winner.name} (preference {winner.preference} {cmp} {b.preference}{tie})",)
                + verdict.reasons,
                supported=True,
            ))

    for rej in rejected:
        if not rej.supported:
            log.debug("backend_rejected", layer=layer.index, backend=rej.backend, reasons=list(rej.reasons))

    if winner is None or padding is None:
        if force is not None:
            head = f"forced backend {force!r} cannot run layer {layer.index}"
            why = "; ".join(failed_plans.get(force, "") and [failed_plans[force]] or verdicts[force].reasons)
            message = f"{head}: {why}"
        else:
            message = f"no backend can run layer {layer.index} correctly on {caps.arch_label}: " + "; ".join(
                f"{r.backend}: {r.reasons[0]}" for r in rejected)
        decision = Decision(layer, None, Padding.none(layer), (message,), tuple(rejected), forced=force is not None)
        log.info("backend_selected", layer=layer.index, backend=None, reasons=[message])
        raise NoBackendError(message, decision)

    supported_names = [b.name for b in candidates if b.name not in failed_plans]
    if force is not None:
        head = f"forced with --backend {winner.name}; its checks pass"
    elif len(supported_names) > 1:
        head = (f"{winner.name}: correct for this layer, highest preference ({winner.preference}) among supported "
                f"[{', '.join(supported_names)}]")
    else:
        head = f"{winner.name}: the only backend that is correct for this layer"
    reasons = (head,) + verdicts[winner.name].reasons + padding.notes
    warnings = tuple(r for r in verdicts[winner.name].reasons if r.upper().startswith("WARNING"))
    decision = Decision(
        layer, winner.name, padding, reasons, tuple(rejected), family=winner.family,
        preference=winner.preference, forced=force is not None, warnings=warnings,
    )
    log.info("backend_selected", layer=layer.index, backend=winner.name, reasons=list(reasons),
             padding=padding.to_dict())
    return decision


@functools.lru_cache(maxsize=4096)
def _select_cached(layer: MoELayer, caps: Capabilities, backends: tuple[Backend, ...], force: str | None,
                   strict: bool) -> Decision | NoBackendError:
    try:
        return select_uncached(layer, caps, backends, force, strict)
    except NoBackendError as exc:
        return exc


def select(
    layer: MoELayer,
    caps: Capabilities,
    backends: Sequence[Backend],
    force: str | None = None,
    *,
    strict: bool = False,
) -> Decision:
    """Cached :func:`select_uncached` (inputs are hashable frozen values; backends by identity)."""
    result = _select_cached(layer, caps, tuple(backends), force, strict)
    if isinstance(result, NoBackendError):
        raise NoBackendError(str(result), result.decision)
    return result
