"""What actually runs, per token count: AITER's own dispatch and the predicted cost, as the selector uses them.

The selector (:func:`moedispatch.selector.pure.select`) takes an optional :class:`Runtime` — the token counts to plan for
and the AITER environment assumed. With it, every correct backend's padding plan is simulated through AITER's
dispatcher (AITER families: :mod:`moedispatch.aiter.dispatch`), known kernel × token-bucket bugs are evaluated
against the simulated kernels, each correct backend gets a predicted time (:mod:`moedispatch.cost.model`), and correct
backends are ordered by that time where the error bars separate them (preference breaks ties).

Everything here is a pure function of values; the CSV and priors loading behind it is lazy and cached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moedispatch.core.errors import UsageError
from moedispatch.core.reason import Reason
from moedispatch.core.workload import SERVING_BUCKETS, Runtime
from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.aiter.dispatch import Assumptions
from moedispatch.core.backend import Padding
from moedispatch.cost import model as cost
from moedispatch.kit.rules import evaluate_issues

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Backend
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

__all__ = ["dispatch_for", "dispatch_reasons", "blocking_reasons",
           "costs_for"]

def dispatch_for(layer: "MoELayer", caps: "Capabilities", padding: "Padding", runtime: Runtime) -> Any:
    """AITER's simulated dispatch of ``layer`` allocated as ``padding`` (a DispatchPlan)."""
    env = runtime.env_dict
    return aiter_dispatch.plan_dispatch(layer, caps, tokens=runtime.tokens, env=env, padding=padding,
                         assumptions=Assumptions.from_engine_env(layer, env))


def native_padding(backend: "Backend", layer: "MoELayer", caps: "Capabilities", padded: "Padding",
                   runtime: Runtime) -> "tuple[Padding, tuple[Reason, ...]] | None":
    """An unpadded plan for an AITER backend when AITER runs the unpadded shape natively: at every serving token
    bucket (and every planned count) a tuned row of the unpadded shape decides, no known kernel × bucket bug
    applies, and no known issue of the backend applies to the unpadded plan. Returns (padding, notes that replace
    the padded plan's known-issue notes) or None (keep the padded plan)."""
    if not padded.padded:
        return None
    unpadded = Padding.none(layer)
    outcome = evaluate_issues(backend.name, layer, caps, unpadded)
    if outcome.blocking:
        return None
    env = runtime.env_dict
    tokens = tuple(sorted(set(SERVING_BUCKETS) | set(runtime.tokens)))
    dp = aiter_dispatch.plan_dispatch(layer, caps, tokens=tokens, env=env, padding=unpadded,
                       assumptions=Assumptions.from_engine_env(layer, env))
    if not dp.steps or any(s.basis != "tuned" for s in dp.steps) or any(h.severity == "error" for h in dp.issues):
        return None
    rows = ", ".join(dict.fromkeys(s.config for s in dp.steps if s.config))
    note = Reason(f"no padding: AITER {dp.aiter_version} runs hidden {layer.hidden} × intermediate/rank "
                  f"{layer.intermediate_per_rank} natively — tuned rows decide every token bucket "
                  f"{tokens[0]}–{tokens[-1]} ({dp.configs}: {rows}); padding to {padded.hidden} × "
                  f"{padded.intermediate_per_rank} would only add work and miss those rows", "padding",
                  "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py (get_2stage_cfgs)")
    return Padding(hidden=layer.hidden, intermediate_per_rank=layer.intermediate_per_rank,
                   pad_semantics=padded.pad_semantics, notes=(note,)), outcome.notes


def _span(tokens: tuple[int, int]) -> str:
    lo, hi = tokens
    return f"token {lo}" if lo == hi == 1 else f"tokens {lo}" if lo == hi else f"tokens {lo}–{hi}"


def _fixed(hit: Any) -> str:
    """``; fixed upstream by <PR>`` when capability_db/dispatch_issues.toml names the fix (``fixed_by``)."""
    return f"; fixed upstream by {hit.fixed_by}" if getattr(hit, "fixed_by", None) else ""


def blocking_reasons(dispatch: Any) -> tuple[Reason, ...]:
    """Known wrong-output kernels AITER would pick for some token count, with no workaround: reject the path."""
    out = []
    for hit in dispatch.issues:
        if not hit.blocking:
            continue
        if hit.raises:
            env = ", ".join(f"{k}={v}" for k, v in hit.workaround_env)
            out.append(Reason(f"AITER cannot run this layer for {_span(hit.tokens)} (bucket {hit.bucket}): "
                              f"{hit.effect}; what runs instead: {hit.workaround}" + (f" [{env}]" if env else ""),
                              "failed", hit.source, hit.issue, hit.confidence))
        else:
            out.append(Reason(f"AITER's dispatcher runs {hit.kernel} for {_span(hit.tokens)} (bucket {hit.bucket}): "
                              f"{hit.effect}; no workaround known" + _fixed(hit), "failed", hit.source, hit.issue,
                              hit.confidence))
    return tuple(out)


def dispatch_reasons(dispatch: Any, backend: str, family: str | None) -> tuple[Reason, ...]:
    """What AITER will run for this layer, as reasons: which families at which token counts, the known kernel ×
    bucket bugs it would hit (warnings with their workaround), and the dispatch model's own notes."""
    out: list[Reason] = []
    steps = dispatch.steps
    families = dispatch.families
    if len(families) > 1:
        spans: dict[str, list[tuple[int, int]]] = {}
        for s in steps:
            spans.setdefault(s.family, []).append(s.tokens)
        where = ", ".join(f"{fam} for {_span((min(t[0] for t in ts), max(t[1] for t in ts)))}"
                          for fam, ts in spans.items())
        out.append(Reason(f"AITER's dispatcher picks the kernel family per token count ({where}); '{backend}' "
                          "names the family moedispatch checked for this layer", "note",
                          "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py (get_2stage_cfgs)"))
    for hit in dispatch.issues:
        if hit.blocking:
            continue  # blocking: reported as a rejection
        env = ", ".join(f"{k}={v}" for k, v in hit.workaround_env)
        cap = f"; or cap --max-num-batched-tokens at {hit.token_cap}" if hit.token_cap else ""
        kind = "warning" if hit.severity == "error" else "caveat"
        out.append(Reason(f"AITER's dispatcher runs {hit.kernel} for {_span(hit.tokens)} (bucket {hit.bucket}): "
                          f"{hit.effect}. Workaround: {hit.workaround}" + (f" [{env}]" if env else "") + cap
                          + _fixed(hit),
                          kind, hit.source, hit.issue, hit.confidence))
    confidence = dispatch.warning_confidence or ("confirmed",) * len(dispatch.warnings)
    for w, conf in zip(dispatch.warnings, confidence):
        out.append(Reason(w, "note", confidence=conf))
    return tuple(out)


def costs_for(backend: "Backend", layer: "MoELayer", caps: "Capabilities", padding: "Padding", runtime: Runtime,
              dispatch: Any = None, pm: Any = None) -> tuple[Any, ...]:
    """Predicted time per token count of ``backend`` running ``layer`` with ``padding`` (``()``: not predictable).
    ``pm``: the plugin manager whose ``moe_cost`` hook may answer for a third-party backend (basis ``plugin``)."""
    try:
        return cost.predict(layer, caps, backend_family=backend.name, padding=padding, tokens=runtime.tokens,
                            dispatch=dispatch, pm=pm)
    except UsageError:
        return ()

