"""The selector: one pure function from (layer, capabilities, backends) to a :class:`Decision`.

Every output (table, JSON, logs, errors, engine API, recipes) renders the same ``Decision``; nothing re-derives it.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

from moedispatch._util.log import get_logger
from moedispatch._util.suggest import did_you_mean
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.capabilities import Capabilities
from moedispatch.kit.caveats import shard_caveats
from moedispatch.kit.rules import dispatch_decided
from moedispatch.core.decision import Decision, Rejection
from moedispatch.core.errors import CapabilityDBError, PluginError, UsageError
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason, texts
from moedispatch._util.caches import register
from moedispatch._util import deadline
from moedispatch._util.deadline import PluginTimeout
from moedispatch.core.families import FUSED_MOE_FAMILIES
from moedispatch.cost.ranking import rank, reason
from moedispatch.selector.plugins import plugin_manager_for
from moedispatch.selector.runtime import blocking_reasons, costs_for, dispatch_for, dispatch_reasons, dispatched_family_issues, dispatched_padding

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.workload import Runtime

__all__ = ["Rejection", "Decision", "select", "select_uncached", "clear_cache", "is_builtin"]

log = get_logger(__name__)


def _order(backend: Backend) -> tuple[int, str]:
    return (-backend.preference, backend.name)


def _fmt_exc(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_TRUSTED_PREFIXES = ("moedispatch_plugins.", "moedispatch.")
_trusted_types: dict[type, bool] = {}


def is_builtin(backend: Backend) -> bool:
    """True for the built-in backends (package ``moedispatch_plugins``): called directly, no deadline thread. A backend
    the plugin registry registered as a third-party plugin's is never one, whatever its class's ``__module__`` claims
    (the registration record decides); a backend used without a registry is judged by its class's module."""
    if deadline.registered_third_party(backend):
        return False
    cls = type(backend)
    trusted = _trusted_types.get(cls)
    if trusted is None:
        trusted = _trusted_types[cls] = (cls.__module__ + ".").startswith(_TRUSTED_PREFIXES)
    return trusted


def _call(backend: Backend, method: str, layer: MoELayer, caps: Capabilities) -> Any:
    """``backend.<method>(layer, caps)``: directly for built-ins; for third-party plugins on a worker thread with a
    deadline (:func:`moedispatch.selector.plugins.call_with_deadline`), so a plugin that hangs cannot hang selection; one that
    timed out once is disabled for the rest of the run, and what it prints is captured as a plugin warning."""
    fn = getattr(backend, method)
    if is_builtin(backend):
        return fn(layer, caps)
    return deadline.call_with_deadline(fn, (layer, caps), what=f"{method}()", owner=backend, where=f"layer {layer.index}")


def _plugin_failure(backend: Backend, message: str, strict: bool, exc: BaseException | None = None) -> Reason:
    """``plugin error: <message>`` (kind failed), or :class:`PluginError` under ``strict``."""
    if strict:
        raise PluginError(f"backend {backend.name!r}: {message}") from exc
    return Reason(f"plugin error: {message}", "failed")


def _failure_text(method: str, exc: BaseException) -> str:
    if isinstance(exc, PluginTimeout):
        return str(exc)
    return f"{method}() raised {_fmt_exc(exc)}"


def _check(backend: Backend, layer: MoELayer, caps: Capabilities, strict: bool) -> Verdict:
    try:
        verdict = _call(backend, "check", layer, caps)
    except CapabilityDBError:
        raise  # the installation's data is broken, not the plugin: one clear line for every caller
    except Exception as exc:  # a plugin's own bug, of any kind: that backend fails with the reason (strict: raises)
        return Verdict(False, (_plugin_failure(backend, _failure_text("check", exc), strict, exc),))
    problem = None
    if not isinstance(verdict, Verdict):
        problem = f"check() returned {type(verdict).__name__}, not a Verdict"
    elif not isinstance(verdict.supported, bool):
        problem = f"check() returned a Verdict whose supported is {type(verdict.supported).__name__}, not a bool"
    elif not isinstance(verdict.reasons, tuple) or not all(isinstance(r, Reason) for r in verdict.reasons):
        problem = "check() returned a Verdict whose reasons are not a tuple of str or Reason"
    elif not verdict.supported and not verdict.reasons:
        problem = "check() returned an unsupported Verdict with no reason"
    elif verdict.supported and any(r.kind == "failed" for r in verdict.reasons):
        problem = ("check() returned a supported Verdict carrying a 'failed' reason: "
                   + next(r.text for r in verdict.reasons if r.kind == "failed"))
    if problem:
        return Verdict(False, (_plugin_failure(backend, problem, strict),))
    if not is_builtin(backend):
        verdict = Verdict(verdict.supported, _claims(verdict.reasons))
    return verdict


def _claims(reasons: tuple[Reason, ...]) -> tuple[Reason, ...]:
    """A third-party plugin's reasons as what they are: its own word. One with no ``source`` cannot have been "read in
    the source" (confidence ``confirmed``, the default a plain string gets), so it is shown ``unconfirmed`` — the
    table's "(unconfirmed) = no primary source found" — instead of reading like a verified rule."""
    return tuple(replace(r, confidence="unconfirmed") if r.source is None and r.confidence == "confirmed" else r
                 for r in reasons)


def _plan(backend: Backend, layer: MoELayer, caps: Capabilities, strict: bool) -> Padding | Reason:
    """The backend's padding plan, or a failed Reason when the plugin failed or broke the Padding contract."""
    try:
        padding = _call(backend, "plan_padding", layer, caps)
    except CapabilityDBError:
        raise
    except Exception as exc:  # as in _check: the plugin's failure, said, never the selector's
        return _plugin_failure(backend, _failure_text("plan_padding", exc), strict, exc)
    problem = None
    if not isinstance(padding, Padding):
        problem = f"plan_padding() returned {type(padding).__name__}, not a Padding"
    elif padding.hidden - padding.hidden_pad != layer.hidden or \
            padding.intermediate_per_rank - padding.intermediate_pad != layer.intermediate_per_rank:
        problem = (f"plan_padding() returned sizes inconsistent with the layer (hidden {padding.hidden} - pad "
                   f"{padding.hidden_pad} != {layer.hidden} or intermediate {padding.intermediate_per_rank} - pad "
                   f"{padding.intermediate_pad} != {layer.intermediate_per_rank})")
    elif not isinstance(padding.notes, tuple) or not all(isinstance(n, Reason) for n in padding.notes):
        problem = "plan_padding() returned a Padding whose notes are not strings or Reasons"
    elif (broken := padding.zero_fill_problem()):   # the Backend contract's pad rule (docs/plugins.md)
        problem = f"plan_padding() breaks the pad contract: {broken}"
    if problem:
        return _plugin_failure(backend, problem, strict)
    notes = _claims(padding.notes) if not is_builtin(backend) else padding.notes
    if padding.hidden % padding.hidden_multiple or padding.intermediate_per_rank % padding.intermediate_multiple:
        # the multiples are "the alignment the plan satisfies" (docs/plugins.md); the plan API has always accepted
        # them as informational, so a plan that misses its own tile is still chosen — with a warning the user sees
        notes += (Reason(f"{backend.name}: plan_padding() returned sizes that are not the multiples it declares "
                         f"(hidden {padding.hidden} / hidden_multiple {padding.hidden_multiple}, intermediate_per_rank "
                         f"{padding.intermediate_per_rank} / intermediate_multiple {padding.intermediate_multiple}): "
                         "check the plugin's alignment", "warning", None, None, "derived"),)
    if notes is not padding.notes:
        # the plugin's Padding as it returned it, only its notes changed: a copy, not replace(), which would re-run
        # the constructor's checks on a value a plugin may have built around them (verify's numerics are what catch
        # such a plan, tests/test_verify.py)
        claimed = copy.copy(padding)
        object.__setattr__(claimed, "notes", notes)
        padding = claimed
    return padding


def select_uncached(
    layer: MoELayer,
    caps: Capabilities,
    backends: Sequence[Backend],
    force: str | None = None,
    strict: bool = False,
    runtime: "Runtime | None" = None,
) -> Decision:
    """Ask every backend, keep the correct ones, order by preference, plan padding for the winner.

    With a :class:`~moedispatch.selector.runtime.Runtime` (token counts, AITER env), every correct backend's plan also goes
    through AITER's simulated dispatch (AITER families: a kernel × token-bucket bug with no workaround rejects the
    path) and gets a predicted cost; correct backends are then ordered by predicted time where the error bars
    separate them, preference breaking ties.

    Raises :class:`NoBackendError` (carrying the Decision) when nothing can run the layer or the forced backend
    cannot; :class:`UsageError` for a forced name that is not registered.
    """
    names = [b.name for b in backends]
    if force is not None and force not in names:
        raise UsageError(f"unknown backend {force!r}{did_you_mean(str(force), names)}; registered: "
                         f"{', '.join(sorted(names)) or 'none'}")
    if layer.kind == "dense":
        return Decision(layer, None, Padding.none(layer),
                        (Reason("dense MLP layer: not a MoE layer, no MoE backend is selected", "decision"),),
                        caps=caps)

    verdicts = {b.name: _check(b, layer, caps, strict) for b in backends}
    ranked = sorted(backends, key=_order)
    candidates = [b for b in ranked if verdicts[b.name].supported]
    if force is not None:
        candidates = [b for b in candidates if b.name == force]

    failed_plans: dict[str, Reason] = {}
    winner: Backend | None = None
    padding: Padding | None = None
    plans: dict[str, Padding] = {}
    dispatch: dict[str, Any] = {}
    costs: dict[str, tuple] = {}
    slower: dict[str, str] = {}
    blocked: dict[str, tuple[Reason, ...]] = {}
    replaced: dict[str, tuple[Reason, ...]] = {}  # known-issue notes of a plan replaced by an unpadded native one
    for candidate in candidates:
        plan = _plan(candidate, layer, caps, strict)
        if isinstance(plan, Reason):
            failed_plans[candidate.name] = plan
            continue
        if runtime is None:
            winner, padding = candidate, plan
            break
        plans[candidate.name] = plan
    if runtime is not None and plans:
        winner, padding = _by_runtime(layer, caps, [c for c in candidates if c.name in plans], plans, runtime,
                                      blocked, dispatch, costs, slower, replaced)

    rejected = _rejections(ranked, winner, verdicts, force, blocked, failed_plans, slower, costs)
    if winner is None or padding is None:
        _no_backend(layer, caps, backends, verdicts, rejected, force, blocked, failed_plans)
    head = _head(winner, candidates, force, failed_plans, blocked, slower, costs)
    runtime_reasons: tuple[Reason, ...] = ()
    if winner.name in dispatch:
        runtime_reasons = dispatch_reasons(dispatch[winner.name], winner.name, winner.family)
    verdict_reasons = verdicts[winner.name].reasons
    if getattr(dispatch.get(winner.name), "config_origin", None) in ("env", "explicit"):
        # a tuned set the user named (AITER_CONFIG_FMOE, --pin-file): a known issue about a row AITER ships is decided
        # by its dispatch issue over the rows AITER reads now (a hit is one of the dispatch model's own reasons)
        decided = dispatch_decided()
        verdict_reasons = tuple(r for r in verdict_reasons if not (r.kind == "caveat" and r.issue in decided))
    if winner.name in replaced:  # the padded plan's known-issue notes no longer apply to the unpadded one
        verdict_reasons = tuple(r for r in verdict_reasons if not (r.kind == "note" and r.issue is not None)) \
            + replaced[winner.name]
    reasons = ((Reason(head, "decision"),) + verdict_reasons + padding.notes + shard_caveats(layer)
               + runtime_reasons)
    warnings = tuple(r for r in reasons if r.kind == "warning")
    decision = Decision(
        layer, winner.name, padding, reasons, tuple(rejected), family=winner.family,
        preference=winner.preference, forced=force is not None, warnings=warnings, caps=caps,
        dispatch=dispatch.get(winner.name), cost=costs.get(winner.name, ()),
    )
    _log_decision(decision)
    return decision


def _rejections(ranked: Sequence[Backend], winner: Backend | None, verdicts: dict[str, Verdict], force: str | None,
                blocked: dict[str, tuple[Reason, ...]], failed_plans: dict[str, Reason], slower: dict[str, str],
                costs: dict[str, tuple]) -> list[Rejection]:
    """Every backend but the winner, with why: blocked by AITER's dispatch, its plan failed, unsupported, not
    considered or not chosen under --backend, slower, or outranked by preference."""
    rejected: list[Rejection] = []
    for b in ranked:
        if winner is not None and b is winner:
            continue
        verdict = verdicts[b.name]
        if b.name in blocked:
            # Correct by its rules, but AITER's dispatcher would run a known-wrong kernel for some token count.
            rejected.append(Rejection(b.name, blocked[b.name]))
        elif b.name in failed_plans:
            rejected.append(Rejection(b.name, (failed_plans[b.name],)))
        elif not verdict.supported:
            rejected.append(Rejection(b.name, verdict.reasons))
        elif winner is None:
            # Only reachable when another backend was forced and failed.
            rejected.append(Rejection(b.name, (Reason(f"supported, not considered: --backend {force} was forced",
                                                      "outranked"),) + verdict.reasons, supported=True))
        elif force is not None:
            rejected.append(Rejection(b.name, (Reason(f"supported, not chosen: --backend {force} was forced",
                                                      "outranked"),) + verdict.reasons, supported=True))
        elif b.name in slower:
            text = slower[b.name] if slower[b.name].startswith(SAME_LAUNCH) else f"slower: {slower[b.name]}"
            rejected.append(Rejection(b.name, (Reason(f"supported, {text}", "outranked"),)
                                      + verdict.reasons, supported=True, cost=costs.get(b.name, ())))
        else:
            cmp = ">" if winner.preference > b.preference else "=" if winner.preference == b.preference else "<"
            tie = ", name order" if cmp == "=" else ""
            rejected.append(Rejection(
                b.name,
                (Reason(f"supported, outranked by {winner.name} (preference {winner.preference} {cmp} "
                        f"{b.preference}{tie})", "outranked"),)
                + verdict.reasons,
                supported=True,
                cost=costs.get(b.name, ()),
            ))
    return rejected


def _no_backend(layer: MoELayer, caps: Capabilities, backends: Sequence[Backend], verdicts: dict[str, Verdict],
                rejected: list[Rejection], force: str | None, blocked: dict[str, tuple[Reason, ...]],
                failed_plans: dict[str, Reason]) -> NoReturn:
    """Raise NoBackendError, carrying the Decision with every rejection: the forced backend's own reasons, no
    backend registered, or each backend's first reason."""
    # The reason names no layer index, so consecutive identical layers still group; the exception text does.
    if force is not None:
        why = "; ".join(texts(blocked.get(force) or ([failed_plans[force]] if force in failed_plans
                                                     else verdicts[force].reasons)))
        message = f"forced backend {force!r} cannot run this layer: {why}"
    elif not backends:
        message = ("no backends are registered (check MOEDISPATCH_LOAD_PLUGINS / MOEDISPATCH_DISABLE_PLUGINS, "
                   "or that moedispatch is installed so its entry points exist)")
    else:
        message = f"no backend can run this layer correctly on {caps.arch_label}: " + "; ".join(
            f"{r.backend}: {r.reasons[0]}" for r in rejected)
    decision = Decision(layer, None, Padding.none(layer), (Reason(message, "failed"),), tuple(rejected),
                        forced=force is not None, caps=caps)
    _log_decision(decision)
    raise NoBackendError(f"layer {layer.index}: {message}", decision)


def _head(winner: Backend, candidates: Sequence[Backend], force: str | None, failed_plans: dict[str, Reason],
          blocked: dict[str, tuple[Reason, ...]], slower: dict[str, str], costs: dict[str, tuple]) -> str:
    """The decision's first line: forced, named after the family AITER runs, faster than the higher preference,
    the highest preference among the supported, or the only correct backend."""
    supported_names = [b.name for b in candidates if b.name not in failed_plans and b.name not in blocked]
    top = max((b for b in candidates if b.name in supported_names), key=lambda b: (b.preference, [-ord(c) for c in b.name]))
    if force is not None:
        head = f"forced with --backend {winner.name}; its checks pass"
    elif slower.get(top.name, "").startswith(SAME_LAUNCH):
        head = (f"{winner.name}: correct for this layer; AITER's dispatcher never runs the higher-preference "
                f"{top.name}'s family at this allocation: both name the same launch, which is named after the "
                "family AITER runs")
    elif len(supported_names) > 1 and winner is not top:
        head = (f"{winner.name}: correct for this layer and predicted faster than the higher-preference "
                f"{top.name}: {_cost_reason(winner.name, costs, top.name)}")
    elif len(supported_names) > 1:
        head = (f"{winner.name}: correct for this layer, highest preference ({winner.preference}) among supported "
                f"[{', '.join(supported_names)}]")
        runner = next((n for n in supported_names if n != winner.name and costs.get(n)), None)
        if costs.get(winner.name) and runner is not None:
            head += f"; {_cost_reason(winner.name, costs, runner)}"
    else:
        head = f"{winner.name}: the only backend that is correct for this layer"
    return head


def _cost_reason(a: str, costs: dict[str, tuple], b: str) -> str:
    return reason(a, costs[a], b, costs[b])


def _by_runtime(layer: MoELayer, caps: Capabilities, candidates: list[Backend], plans: dict[str, Padding],
                runtime: "Runtime", blocked: dict[str, tuple[Reason, ...]], dispatch: dict[str, Any],
                costs: dict[str, tuple], slower: dict[str, str],
                replaced: dict[str, tuple[Reason, ...]]) -> tuple[Backend | None, Padding | None]:
    """Simulate AITER's dispatch of each correct plan, drop paths that hit a known-wrong kernel with no
    workaround, predict costs, and order by predicted time (preference breaks ties). Fills the dicts in place."""
    alive: list[Backend] = []
    for b in candidates:
        if b.family in FUSED_MOE_FAMILIES and is_builtin(b):
            native = dispatched_padding(b, layer, caps, plans[b.name], runtime)
            if native is not None:
                plans[b.name] = native[0]
                if native[1] is not None:
                    replaced[b.name] = native[1]
            dp = dispatch_for(layer, caps, plans[b.name], runtime)
            why = blocking_reasons(dp) + dispatched_family_issues(layer, caps, plans[b.name], dp, b.name)[0]
            if why:
                blocked[b.name] = why
                continue
            dispatch[b.name] = dp
        alive.append(b)
    for b in alive:
        if is_builtin(b):
            costs[b.name] = costs_for(b, layer, caps, plans[b.name], runtime, dispatch.get(b.name))
        else:  # a third-party backend: its plugin's moe_cost hook, else a roofline with the wide "other" band
            costs[b.name] = costs_for(b, layer, caps, plans[b.name], runtime, None, plugin_manager_for(b))
    order = rank([(b.name, b.preference, costs[b.name]) for b in alive])
    if not order:
        return None, None
    by_name = {b.name: b for b in alive}
    for name, why in order[1:]:
        if why is not None:
            slower[name] = why
    winner = by_name[order[0][0]]
    same = _same_launch(winner, alive, plans, dispatch)
    if same is not None:
        renamed = {winner.name, *same[1]} - {same[0].name}
        for name in renamed:
            slower[name] = same[2]
        winner = same[0]
        # A loser compared with a backend that is now "the same launch" is compared with the named winner instead
        # (GLM-5.1-MXFP4 TP64: "emulation slower: aiter-asm 20 µs vs …" while the layer is aiter-flydsl's).
        for name, why in order[1:]:
            if name not in renamed and why is not None and any(why.startswith(f"{r} ") for r in renamed):
                slower[name] = _cost_reason(winner.name, costs, name)
    return winner, plans[winner.name]


#: How a backend that names the same AITER launch as the winner is reported.
SAME_LAUNCH = "same launch as"


def _runs(b: Backend, dp: Any) -> int:
    """How many of the dispatch's steps run ``b``'s family (alone or in a mixed 2-stage pair)."""
    return sum(1 for s in dp.steps if b.family in s.family.split("+"))


def _same_launch(winner: Backend, alive: list[Backend], plans: dict[str, Padding],
                 dispatch: dict[str, Any]) -> tuple[Backend, list[str], str] | None:
    """AITER backends handing aiter.fused_moe the same allocation and pad arguments are one launch, whose dispatcher
    picks the family per token bucket: a winner whose family AITER runs at no bucket is named after the same-launch backend
    whose family runs at most of them (never a family that does not run).
    Returns (that backend, the other names of the same launch, why) or None when the winner already is it."""
    if winner.name not in dispatch:
        return None
    dp = dispatch[winner.name]
    def call(p: Padding) -> tuple:  # what aiter.fused_moe is handed: the allocation and the pad arguments
        return p.hidden, p.intermediate_per_rank, p.kernel_hidden_pad, p.kernel_intermediate_pad, p.zero_fill

    same = [b for b in alive if b.name in dispatch and dispatch[b.name].steps == dp.steps
            and call(plans[b.name]) == call(plans[winner.name])]
    if _runs(winner, dp):
        return None  # AITER runs the winner's family at some bucket: the name holds
    best = max(same, key=lambda b: (_runs(b, dp), b is winner))
    if best is winner or not _runs(best, dp):
        return None
    fams = ", ".join(dict.fromkeys(s.family for s in dp.steps))
    why = (f"{SAME_LAUNCH} {best.name} (aiter.fused_moe with the same allocation and pads): AITER's dispatcher runs {fams} "
           f"there, so the layer is named after the family it runs")
    return best, [b.name for b in same if b is not best], why


def _log_decision(decision: Decision) -> None:
    """``backend_rejected`` (debug, one per failed backend) and ``backend_selected`` (info) events; free when the
    ``moedispatch`` logger's level filters them (checked before any event dict is built)."""
    if not log.is_enabled(logging.INFO):
        return
    layer = decision.layer
    if log.is_enabled(logging.DEBUG):
        for rej in decision.rejected:
            if not rej.supported:
                log.debug("backend_rejected", layer=layer.index, backend=rej.backend, reasons=texts(rej.reasons))
    if decision.backend is None:
        log.info("backend_selected", layer=layer.index, backend=None, reasons=texts(decision.reasons))
    else:
        log.info("backend_selected", layer=layer.index, backend=decision.backend, reasons=texts(decision.reasons),
                 padding=decision.padding.to_dict())


# -- caching ---------------------------------------------------------------------------------------------------
#
# Two levels, both plain dicts (thread-safe under the GIL; two threads racing on one key compute equal Decisions):
#   * exact: (layer, caps, backends, force, strict) -> Decision | NoBackendError
#   * shape: the same with the layer's index-free signature, used only when every backend is built-in (built-ins
#     never look at the layer index), so the 57 identical MoE layers of a model are selected once and re-indexed.
# Bounded: a full cache is cleared (decisions are cheap to recompute; engines ask a handful of shapes).

_CACHE_MAX = 4096
_exact: dict[tuple, Decision | NoBackendError] = {}
_shape: dict[tuple, Decision] = {}


def clear_cache() -> None:
    """Forget every cached decision (tests, benchmarks of the uncached path)."""
    _exact.clear()
    _shape.clear()


register(clear_cache, "selector decisions")


def _select_cached(layer: MoELayer, caps: Capabilities, backends: tuple[Backend, ...], force: str | None,
                   strict: bool, runtime: "Runtime | None" = None) -> Decision | NoBackendError:
    key = (layer, caps, backends, force, strict, runtime)
    try:
        return _exact[key]
    except KeyError:
        pass
    result: Decision | NoBackendError
    shape_key = None
    if layer.kind == "moe" and all(is_builtin(b) for b in backends):
        shape_key = (layer.signature(), caps, backends, force, strict, runtime)
        hit = _shape.get(shape_key)
        if hit is not None:
            result = replace(hit, layer=layer)
            _log_decision(result)
            _store(_exact, key, result)
            return result
    try:
        result = select_uncached(layer, caps, backends, force, strict, runtime)
    except NoBackendError as exc:
        result = exc  # its message names the layer index: not shared through the shape cache
    else:
        if shape_key is not None:
            _store(_shape, shape_key, result)
    _store(_exact, key, result)
    return result


def _store(cache: dict, key: tuple, value: Any) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def select(
    layer: MoELayer,
    caps: Capabilities,
    backends: Sequence[Backend],
    force: str | None = None,
    *,
    strict: bool = False,
    runtime: "Runtime | None" = None,
) -> Decision:
    """Cached :func:`select_uncached` (inputs are hashable frozen values; backends by identity)."""
    result = _select_cached(layer, caps, backends if type(backends) is tuple else tuple(backends), force, strict,
                            runtime)
    if type(result) is NoBackendError:
        raise NoBackendError(str(result), result.decision)
    return result
