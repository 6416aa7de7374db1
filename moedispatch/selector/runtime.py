"""What actually runs, per token count: AITER's own dispatch and the predicted cost, as the selector uses them.

The selector (:func:`moedispatch.selector.pure.select`) takes an optional :class:`Runtime` — the token counts to plan for
and the AITER environment assumed. With it, every correct backend's padding plan is simulated through AITER's
dispatcher (AITER families: :mod:`moedispatch.aiter.dispatch`), known kernel × token-bucket bugs are evaluated
against the simulated kernels, each correct backend gets a predicted time (:mod:`moedispatch.cost.model`), and correct
backends are ordered by that time where the error bars separate them (preference breaks ties).

Everything here is a pure function of values; the CSV and priors loading behind it is lazy and cached.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from moedispatch._util import deadline
from moedispatch.core.errors import UsageError
from moedispatch.core.families import BACKEND_OF_FAMILY, family_of
from moedispatch.core.reason import Reason
from moedispatch.core.workload import Runtime
from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.aiter.key import Assumptions
from moedispatch.core.backend import Padding, round_up
from moedispatch.cost import model as cost
from moedispatch.kit.rules import evaluate_issues, issues_for

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Backend
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

__all__ = ["dispatch_for", "dispatch_reasons", "blocking_reasons", "dispatched_family_issues", "dispatched_padding",
           "costs_for"]

def dispatch_for(layer: "MoELayer", caps: "Capabilities", padding: "Padding", runtime: Runtime) -> Any:
    """AITER's simulated dispatch of ``layer`` allocated as ``padding`` (a DispatchPlan)."""
    env = runtime.env_dict
    return aiter_dispatch.plan_dispatch(layer, caps, tokens=runtime.tokens, env=env, padding=padding,
                         assumptions=Assumptions.from_engine_env(layer, env))


#: Intermediate-per-rank multiples tried below a family table's alignment, smallest allocation first (1: unpadded).
_TRIAL_MULTIPLES = (1, 64, 128, 256, 512)
_DISPATCH_SOURCE = "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py (get_2stage_cfgs)"


def _trial_allocations(layer: "MoELayer", static: "Padding") -> list[tuple[int, int]]:
    """(hidden multiple, intermediate multiple) pairs, smallest allocation first: those below the family table's
    ``static`` allocation, the table's own, and two coarser multiples of its intermediate alignment above it (for a
    table allocation AITER's dispatch cannot run). Each allocation once, with its smallest multiples."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for hm in dict.fromkeys((1, static.hidden_multiple)):
        for im in _TRIAL_MULTIPLES:
            h, i = round_up(layer.hidden, hm), round_up(layer.intermediate_per_rank, im)
            if h <= static.hidden and i <= static.intermediate_per_rank:
                out.setdefault((h, i), (hm, im))
    out[(static.hidden, static.intermediate_per_rank)] = (static.hidden_multiple, static.intermediate_multiple)
    for k in (2, 4):
        im = static.intermediate_multiple * k
        i = round_up(layer.intermediate_per_rank, im)
        if i > static.intermediate_per_rank:
            out.setdefault((static.hidden, i), (static.hidden_multiple, im))
    return [out[k] for k in sorted(out, key=lambda hi: (hi[0] * hi[1], hi))]


def _misfit(dp: Any, below_table: bool) -> str | None:
    """Why AITER's dispatch of an allocation cannot be planned, or None. Below the family table the evidence must be
    positive: no known-wrong or raising kernel even with a workaround, and no heuristic kernel outside FlyDSL (whose
    tiles the dispatch model checks) — those kernels' tiles are known only from the table. At or above the table only
    a blocking hit counts (one with an environment workaround is exported by the recipe)."""
    for hit in dp.issues:
        if hit.blocking or (below_table and hit.severity == "error"):
            env = ", ".join(f"{k}={v}" for k, v in hit.workaround_env)
            return (f"AITER's dispatcher runs {hit.kernel} for {_span(hit.tokens)} (bucket {hit.bucket}) — "
                    f"[{hit.issue}] {hit.effect}" + (f" (AITER steers away with {env})" if env else ""))
    if not below_table:
        return None
    for s in dp.steps:
        if s.raises:
            return f"AITER raises for {_span(s.tokens)}: {s.raises}"
        if s.basis != "tuned" and s.family != "flydsl":
            return (f"AITER runs heuristic {' + '.join(s.kernels)} for {_span(s.tokens)}; no tuned row of this shape "
                    "shows those kernels tile it")
    return None


def dispatched_padding(backend: "Backend", layer: "MoELayer", caps: "Capabilities", static: "Padding",
                       runtime: Runtime) -> "tuple[Padding, tuple[Reason, ...] | None] | None":
    """The least allocation every kernel AITER's dispatcher runs can tile, at every serving token bucket (and every
    planned count), for an AITER backend, starting below its family table's allocation (``static``).

    An allocation below the table is kept when, at every bucket, a tuned row of that shape decides (AITER's tuner ran
    and checked the kernel there) or a FlyDSL kernel whose tiles divide it runs (AITER's own tile rule, see
    :func:`moedispatch.aiter.flydsl.tile_misfit`), no known kernel × bucket bug applies, and no known issue of the
    backend applies to it. The table's allocation is kept unless AITER's dispatch of it is blocked; then a coarser
    multiple of its alignment is tried. Returns (padding, the backend's known-issue notes for it) for another
    allocation; (the table's padding with a note saying why no smaller one is kept and which AITER switches would keep
    it, None) — the table's known-issue notes stand; or None when there is nothing to say (or nothing runs)."""
    if not hasattr(backend, "padding_at"):
        return None
    env = runtime.env_dict
    tokens = runtime.serving_buckets()
    table = (static.hidden, static.intermediate_per_rank)
    refused: tuple[int, int, str] | None = None
    for hm, im in _trial_allocations(layer, static):
        plan = static if (hm, im) == (static.hidden_multiple, static.intermediate_multiple) else \
            backend.padding_at(layer, caps, hm, im)
        alloc = (plan.hidden, plan.intermediate_per_rank)
        below = alloc != table and alloc[0] * alloc[1] < table[0] * table[1]
        outcome = evaluate_issues(backend.name, layer, caps, plan)
        if outcome.blocking:
            refused = refused or (*alloc, outcome.blocking[0].text)
            continue
        dp = aiter_dispatch.plan_dispatch(layer, caps, tokens=tokens, env=env, padding=plan,
                                          assumptions=Assumptions.from_engine_env(layer, env))
        why = _misfit(dp, below)
        if why is None:
            others = dispatched_family_issues(layer, caps, plan, dp, backend.name)[0]
            why = others[0].text if others else None
        if why is not None:
            refused = refused or (*alloc, why + (_switches(layer, caps, plan, dp, env, tokens) if below else ""))
            continue
        if alloc == table:
            if refused is None:
                return None
            note = Reason(f"padded to {table[0]} × {table[1]}/rank, not {refused[0]} × {refused[1]}: at "
                          f"{refused[0]} × {refused[1]} {refused[2]}", "padding", _DISPATCH_SOURCE)
            return replace(static, notes=(note,) + static.notes), None
        if below:
            note = _kept_note(static, plan, dp, tokens)
        else:   # above the table: tried only after the table itself was refused (_trial_allocations' order)
            assert refused is not None
            note = Reason(f"padded to {alloc[0]} × {alloc[1]}/rank, beyond the family table's {table[0]} × "
                          f"{table[1]}: at {refused[0]} × {refused[1]} {refused[2]}", "padding", _DISPATCH_SOURCE)
        return replace(plan, notes=(note,) + plan.notes), outcome.notes
    return None


def _switches(layer: "MoELayer", caps: "Capabilities", plan: "Padding", dp: Any, env: dict[str, str],
              tokens: tuple[int, ...]) -> str:
    """``; with X=1 AITER runs this allocation correctly`` when the known issues' environment workarounds (and the
    engine switch whose fused key AITER's rows are tuned for) make the dispatch trustworthy, else ``""``."""
    switch = {k: v for h in dp.issues for k, v in h.workaround_env}
    if not switch or all(env.get(k) == v for k, v in switch.items()):
        return ""
    trial = {**env, **switch}
    again = aiter_dispatch.plan_dispatch(layer, caps, tokens=tokens, env=trial, padding=plan,
                                         assumptions=Assumptions.from_engine_env(layer, trial))
    if _misfit(again, True) is not None:
        return ""
    what = ", ".join(f"{k}={v}" for k, v in switch.items())
    return (f"; with {what} AITER runs {plan.intermediate_per_rank}/rank correctly at every bucket "
            f"({', '.join(dict.fromkeys(s.family for s in again.steps))}) — export it to keep this allocation")


def _kept_note(static: "Padding", plan: "Padding", dp: Any, tokens: tuple[int, ...]) -> Reason:
    tuned = [s for s in dp.steps if s.basis == "tuned"]
    heur = [s for s in dp.steps if s.basis != "tuned"]
    parts = []
    if tuned:
        parts.append(f"tuned rows of this shape decide {_spans(tuned)} "
                     f"({', '.join(dict.fromkeys(s.config for s in tuned if s.config))})")
    if heur:
        tiles = sorted({f"stage-{t[0]} {'tile_n' if t[0] == 1 else 'tile_k'} {t[2] if t[0] == 1 else t[3]}"
                        for s in heur for k in s.kernels for t in [aiter_dispatch.flydsl_tile(k)] if t})
        parts.append(f"FlyDSL heuristic kernels run {_spans(heur)} with inter_dim tiles that divide it "
                     f"({', '.join(tiles)})")
    what = ("no padding" if not plan.padded
            else f"allocate {plan.hidden} × {plan.intermediate_per_rank}/rank")
    return Reason(f"{what} (not the family table's {static.hidden} × {static.intermediate_per_rank}): every kernel "
                  f"AITER {dp.aiter_version} dispatches for tokens {tokens[0]}–{tokens[-1]} tiles "
                  f"{plan.hidden} × {plan.intermediate_per_rank} — " + "; ".join(parts),
                  "padding", f"{_DISPATCH_SOURCE}; {aiter_dispatch.FLYDSL_TILE_SOURCE}")


def _spans(steps: list[Any]) -> str:
    """``tokens 1–1024, 4096–8192`` for the steps' token ranges, consecutive ranges merged."""
    merged: list[list[int]] = []
    for s in steps:
        if merged and s.tokens[0] <= merged[-1][1] * 2:
            merged[-1][1] = s.tokens[1]
        else:
            merged.append([s.tokens[0], s.tokens[1]])
    return "tokens " + ", ".join(f"{lo}" if lo == hi else f"{lo}–{hi}" for lo, hi in merged)


#: Known-issue predicate / workaround keys about the pad arguments handed to aiter.fused_moe.
_PAD_KEYS = {"kernel_inter_pad_gt", "kernel_intermediate_pad", "pad_semantics"}


def dispatched_family_issues(layer: "MoELayer", caps: "Capabilities", padding: "Padding", dispatch: Any,
                             backend: str) -> tuple[tuple[Reason, ...], tuple[Reason, ...]]:
    """(blocking, notes): the known issues (capability_db/known_issues.toml) of the AITER families the dispatch runs
    at this allocation other than ``backend``'s own — the launch is what AITER runs, not the family a plan names
    (e.g. a plan named aiter-ck that hands FlyDSL a non-zero intermediate_pad meets FlyDSL's bug there)."""
    blocking: list[Reason] = []
    notes: list[Reason] = []
    own = family_of(backend)
    for fams in dict.fromkeys(s.family for s in dispatch.steps):
        for fam in fams.split("+"):
            other = BACKEND_OF_FAMILY.get(fam)
            if other is None or fam == own:
                continue
            spans = [s.tokens for s in dispatch.steps if fam in s.family.split("+")]
            where = (f"AITER's dispatcher runs {fam} for {_span((spans[0][0], spans[-1][1]))} at "
                     f"{padding.hidden} × {padding.intermediate_per_rank}/rank: ")
            # Only the issues about the pad arguments travel: the call hands every family AITER picks the same
            # pads, while a family's dtype/shape predicates describe the layer as that family would be asked for it
            # (AITER's own kernel × bucket issues cover what the dispatched kernel meets).
            pads = {i.id for i in issues_for(other, caps) if _PAD_KEYS & (set(i.pred) | set(i.fix))}
            outcome = evaluate_issues(other, layer, caps, padding)
            blocking += [replace(r, text=where + r.text) for r in outcome.blocking if r.issue in pads]
            notes += [replace(r, text=where + r.text) for r in outcome.notes
                      if r.issue in pads and r.kind in ("caveat", "warning")]
    return tuple(dict.fromkeys(blocking)), tuple(dict.fromkeys(notes))


def _span(tokens: tuple[int, int]) -> str:
    lo, hi = tokens
    return f"token {lo}" if lo == hi == 1 else f"tokens {lo}" if lo == hi else f"tokens {lo}–{hi}"


def _fixed(hit: Any) -> str:
    """``; fixed upstream by <PR>`` when capability_db/dispatch_issues.toml names the fix (``fixed_by``)."""
    return f"; fixed upstream by {hit.fixed_by}" if getattr(hit, "fixed_by", None) else ""


def _where(hits: Sequence[Any]) -> str:
    """``K1 for tokens 1–4 (bucket 1) and K2 for tokens 64–8192 (bucket 64)``: the kernels × buckets of one issue."""
    parts = [f"{h.kernel} for {_span(h.tokens)} (bucket {h.bucket})" for h in hits]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _by_issue(hits: Iterable[Any]) -> list[list[Any]]:
    """Hits of one known issue with the same effect and workaround, grouped (in order of first appearance): one
    issue met at several kernels × buckets is said once."""
    groups: dict[tuple, list[Any]] = {}
    for h in hits:
        key = (h.issue, h.effect, h.workaround, h.workaround_env, h.token_cap, h.raises, h.blocking, h.severity)
        groups.setdefault(key, []).append(h)
    return list(groups.values())


def blocking_reasons(dispatch: Any) -> tuple[Reason, ...]:
    """Known wrong-output kernels AITER would pick for some token count, with no workaround: reject the path."""
    out = []
    for hits in _by_issue(h for h in dispatch.issues if h.blocking):
        hit = hits[0]
        if hit.raises:
            env = ", ".join(f"{k}={v}" for k, v in hit.workaround_env)
            where = " and ".join(f"{_span(h.tokens)} (bucket {h.bucket})" for h in hits)
            out.append(Reason(f"AITER cannot run this layer for {where}: "
                              f"{hit.effect}; what runs instead: {hit.workaround}" + (f" [{env}]" if env else ""),
                              "failed", hit.source, hit.issue, hit.confidence))
        else:
            out.append(Reason(f"AITER's dispatcher runs {_where(hits)}: "
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
    for hits in _by_issue(h for h in dispatch.issues if not h.blocking):  # blocking: reported as a rejection
        hit = hits[0]
        env = ", ".join(f"{k}={v}" for k, v in hit.workaround_env)
        cap = f"; or cap --max-num-batched-tokens at {hit.token_cap}" if hit.token_cap else ""
        kind = "warning" if hit.severity == "error" else "caveat"
        out.append(Reason(f"AITER's dispatcher runs {_where(hits)}: "
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
    if pm is not None and hasattr(pm, "hook"):
        hook = pm.hook.moe_cost

        def guarded(**kwargs: Any) -> Any:
            # A third-party moe_cost runs as check()/plan_padding() do: on a worker thread with the plugin deadline
            # (a hanging hook disables its plugin) and with its prints captured, never on the report's stdout.
            return deadline.call_with_deadline(lambda: hook(**kwargs), what="moe_cost()", owner=backend,
                                               where=f"layer {layer.index}")
        pm = guarded
    try:
        return cost.predict(layer, caps, backend_family=backend.name, padding=padding, tokens=runtime.tokens,
                            dispatch=dispatch, pm=pm)
    except UsageError:
        return ()

