"""``moedispatch compare``: one model under several targets, AITER versions or TP/EP layouts, side by side.

Each variant is planned exactly as ``explain`` plans it (:func:`moedispatch.plan.plan.plan_model`); layers whose
decisions are identical in every variant form one group. Per group and variant: the backend, the padding, and — read
from the plan's own JSON entries when they are there (``aiter_dispatch``, ``cost``) — what AITER runs per token
bucket and the predicted time. Nothing here decides or predicts anything: a group that differs says why with the
differing decisions' own reasons, picked by kind (``decision``, ``failed``, ``outranked``, ``padding``), never by
reading their text.

JSON (schema ``moedispatch.compare/1``)::

    {"schema", "model", "axes": [str],
     "variants": [{label, target, product, compute_units, aiter_version, tp, ep, fingerprint, ok, warnings,
                   cost_total?}],
     "groups": [{layers: [int], kind, decisions: [{backend, padding, aiter_dispatch?, cost?} per variant],
                 differs: bool, differs_in: [str], why: [str]}]}
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from moedispatch._util.width import fit, wrap
from moedispatch.core.errors import UsageError
from moedispatch.core.reason import with_marker
from moedispatch.data.capdb import target_label
from moedispatch.engines.layout import heads_warning
from moedispatch.plan.plan import layer_span, plan_model, plan_to_json
from moedispatch.probe.targets import resolve_capabilities
from moedispatch.selector import plugins
from moedispatch.core.workload import Runtime, parse_tokens
from moedispatch.sources.models import load_model

__all__ = ["SCHEMA", "Variant", "Comparison", "parse_variants", "compare_plans", "compare_to_json", "render_table",
           "run_cli"]

SCHEMA = "moedispatch.compare/1"
#: At most this many variants in one comparison (a product of axes grows fast).
MAX_VARIANTS = 12
_AXES = ("target", "aiter_version", "tp", "ep")
_FLAGS = {"target": "--target", "aiter_version": "--aiter-version", "tp": "--tp", "ep": "--ep"}


@dataclass(frozen=True)
class Variant:
    """One way to run the model: a target (None: probe or default), an AITER version (None: the target's), TP, EP."""

    target: str | None = None
    aiter_version: str | None = None
    tp: int = 1
    ep: int = 1


def _split(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(not item for item in items):
        raise UsageError(f"{flag} takes a comma-separated list without empty items, got {text!r}")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} lists a value twice: {text!r}")
    return items


def _ints(items: list[str] | None, flag: str) -> list[int] | None:
    if items is None:
        return None
    out = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"{flag} takes comma-separated positive integers, got {item!r}") from None
        if value < 1:
            raise UsageError(f"{flag} takes comma-separated positive integers, got {value}")
        out.append(value)
    return out


def parse_variants(target: str | None = None, aiter_version: str | None = None, tp: str | None = None,
                   ep: str | None = None) -> tuple[list[Variant], list[str]]:
    """The variants the flags describe (the product of every comma-separated list) and the axes that vary.

    One-line :class:`UsageError` for fewer than two variants, empty or repeated items, non-integer TP/EP, or more
    than :data:`MAX_VARIANTS`.
    """
    values: dict[str, list[Any]] = {
        "target": _split(target, "--target") or [None],
        "aiter_version": _split(aiter_version, "--aiter-version") or [None],
        "tp": _ints(_split(tp, "--tp"), "--tp") or [1],
        "ep": _ints(_split(ep, "--ep"), "--ep") or [1],
    }
    axes = [axis for axis in _AXES if len(values[axis]) > 1]
    if not axes:
        raise UsageError("compare needs at least two variants: give two or more comma-separated values to --target, "
                         "--aiter-version, --tp or --ep (e.g. --target MI300X,MI355X)")
    variants = [Variant(*combo) for combo in itertools.product(*(values[a] for a in _AXES))]
    if len(variants) > MAX_VARIANTS:
        raise UsageError(f"compare takes at most {MAX_VARIANTS} variants; "
                         + " × ".join(f"{_FLAGS[a]} {len(values[a])}" for a in axes) + f" = {len(variants)}")
    return variants, axes


# -- the comparison ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """Plans of one model, one per variant, and the axes that vary between them."""

    variants: tuple[Variant, ...]
    plans: tuple[Any, ...]  # moedispatch.plan.plan.Plan, one per variant
    axes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.plans)

    def label(self, i: int) -> str:
        """``gfx942 (MI300X)`` / ``AITER 0.1.15.post3`` / ``TP8`` — the varying axes of variant ``i``."""
        plan = self.plans[i]
        parts = []
        for axis in self.axes:
            if axis == "target":
                parts.append(target_label(plan.caps))
            elif axis == "aiter_version":
                parts.append(f"AITER {plan.caps.aiter_version}" if plan.caps.aiter_version else "no AITER")
            elif axis == "tp":
                parts.append(f"TP{plan.tp}")
            else:
                parts.append(f"EP{plan.ep}")
        return " ".join(parts)

    def groups(self) -> list[list[int]]:
        """Layer indices whose decisions are identical within every variant (across non-adjacent layers), in order
        of first appearance."""
        by_key: dict[tuple, list[int]] = {}
        for i in range(len(self.plans[0].decisions)):
            key = tuple(p.decisions[i].group_key() for p in self.plans)
            by_key.setdefault(key, []).append(i)
        return list(by_key.values())


def compare_plans(model: Any, variants: Sequence[Variant], axes: Sequence[str], *,
                  plan_variant: Callable[[Any, Variant], Any]) -> Comparison:
    """Plan ``model`` once per variant with ``plan_variant(model, variant) -> Plan``."""
    plans = tuple(plan_variant(model, v) for v in variants)
    sizes = {len(p.decisions) for p in plans}
    if len(sizes) != 1:  # pragma: no cover - one model always expands to the same layer count
        raise UsageError("the variants plan different layer counts; compare needs one model")
    return Comparison(tuple(variants), plans, tuple(axes))


def _runs(steps: list[dict[str, Any]]) -> list[tuple]:
    """What runs per token range, without where the deciding row sits (file:line names the release). A negative
    split-K is no split: the FlyDSL heuristic's ``split_k = -1`` (from v0.1.16) and ``0`` run alike — every reader
    of it tests ``ksplit > 0`` or ``> 1`` (ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1550, 1752, 1892, 2010,
    2035) — so 0.1.15 against 0.1.20 is no difference in what runs."""
    return [(tuple(s.get("tokens") or ()), s.get("stages"), s.get("family"), tuple(s.get("kernels") or ()),
             s.get("block_m"), max(s.get("ksplit") or 0, 0), s.get("activation_dtype"), s.get("basis"),
             s.get("raises"))
            for s in steps]


def _issues(decision: Any) -> list[dict[str, Any]]:
    """The known kernel × bucket issues (and AITER refusals) the decision's dispatch hits."""
    dispatch = getattr(decision, "dispatch", None)
    return [{"issue": h.issue, "tokens": list(h.tokens), "severity": h.severity, "effect": h.effect}
            for h in (dispatch.issues if dispatch is not None else ())]


def _decision_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A layer entry of the explain JSON cut to what compare shows: backend, padding, and when the plan has them
    the AITER dispatch per token bucket and the predicted cost."""
    out: dict[str, Any] = {"backend": entry.get("backend"),
                           "padding": entry.get("padding") if entry.get("kind") == "moe" else None}
    for key in ("aiter_dispatch", "cost"):
        if key in entry:
            out[key] = entry[key]
    return out


def _why_items(cmp: Comparison, index: int, differs_in: list[str]) -> list[tuple[str, tuple[Any, ...]]]:
    """Why a group differs, from the decisions' reasons by kind: each variant's ``decision`` reason (or its
    absence), why it did not choose what another variant chose (the rejection's ``failed`` reasons, else
    ``outranked``); with one backend everywhere, the ``padding`` reasons that are not the same in every variant."""
    decisions = [p.decisions[index] for p in cmp.plans]
    out: list[tuple[str, tuple[Any, ...]]] = []
    if "backend" in differs_in:
        chosen = {d.backend for d in decisions if d.backend}
        for i, d in enumerate(decisions):
            label = cmp.label(i)
            head = d.of_kind("decision")
            out.append((f"{label}: ", head[:1]) if d.backend and head else (f"{label}: no correct backend", ()))
            for other in sorted(chosen - {d.backend}):
                rej = d.rejection(other)
                if rej is None:
                    out.append((f"{label}: {other} is not registered", ()))
                    continue
                picked = tuple(r for r in rej.reasons if r.kind == "failed") or tuple(
                    r for r in rej.reasons if r.kind == "outranked")
                if picked:
                    out.append((f"{label}: not {other}: ", picked))
    if "known issues" in differs_in:
        for i, d in enumerate(decisions):
            hits = d.dispatch.issues if getattr(d, "dispatch", None) is not None else ()
            text = "; ".join(f"{h.issue} at tokens {h.tokens[0]}"
                             + (f"–{h.tokens[1]}" if h.tokens[1] != h.tokens[0] else "") + f": {h.effect}"
                             for h in hits)
            out.append((f"{cmp.label(i)}: known issues: {text or 'none'}", ()))
    if differs_in == ["padding"]:  # same backend, other padding (a changed backend explains its own padding)
        per_variant = [tuple(r for r in d.reasons if r.kind == "padding") for d in decisions]
        everywhere = set.intersection(*(set(p) for p in per_variant)) if per_variant else set()
        for i, reasons in enumerate(per_variant):
            out += [(f"{cmp.label(i)}: padding: ", (r,)) for r in reasons if r not in everywhere]
    return list(dict.fromkeys(out))


def _why_text(item: tuple[str, tuple[Any, ...]], cite: Callable[[Any], str] = str) -> str:
    prefix, reasons = item
    return prefix + "; ".join(cite(r) for r in reasons)


def _compared(key: str, value: Any) -> Any:
    """What of a decision entry's ``key`` must agree for the variants to be the same: an unpadded allocation is "no
    padding" whatever its per-rank sizes (TP4 and TP8 shard differently; neither pads)."""
    return "no padding" if key == "padding" and _padding(value) == "no padding" else value


def compare_to_json(cmp: Comparison) -> dict[str, Any]:
    """The ``moedispatch.compare/1`` document."""
    docs = [plan_to_json(p) for p in cmp.plans]
    variants = []
    for i, (plan, doc) in enumerate(zip(cmp.plans, docs)):
        target = doc["target"]
        entry: dict[str, Any] = {
            "label": cmp.label(i), "target": target.get("gfx"), "product": target.get("product"),
            "compute_units": target.get("compute_units"), "aiter_version": target.get("aiter_version"),
            "tp": plan.tp, "ep": plan.ep, "fingerprint": doc["fingerprint"], "ok": plan.ok,
            "warnings": doc["warnings"], "aiter_data": doc["aiter_data"],
        }
        if target.get("partition"):
            entry["partition"] = target["partition"]
        if "cost_total" in doc:
            entry["cost_total"] = doc["cost_total"]
        variants.append(entry)
    groups = []
    for indices in cmp.groups():
        first = indices[0]
        decisions = [_decision_entry(doc["layers"][first]) for doc in docs]
        for d, plan in zip(decisions, cmp.plans):
            d["known_issues"] = _issues(plan.decisions[first])
        differs_in = [key for key in ("backend", "padding") if len({json.dumps(_compared(key, d[key]), sort_keys=True)
                                                                     for d in decisions}) > 1]
        if not differs_in:
            # Same backend and padding: what AITER runs per bucket (its kernels, not which release's file:line
            # says so) and the known issues it hits can still differ — between AITER releases they usually do.
            if len({json.dumps(_runs(d.get("aiter_dispatch") or []), sort_keys=True) for d in decisions}) > 1:
                differs_in.append("dispatch")
            if len({json.dumps(d["known_issues"], sort_keys=True) for d in decisions}) > 1:
                differs_in.append("known issues")
        groups.append({"layers": indices, "kind": docs[0]["layers"][first]["kind"], "decisions": decisions,
                       "differs": bool(differs_in), "differs_in": differs_in,
                       "why": [_why_text(item) for item in _why_items(cmp, first, differs_in)] if differs_in
                       else []})
    return {"schema": SCHEMA, "model": docs[0]["model"], "axes": list(cmp.axes), "variants": variants,
            "groups": groups}


# -- table -----------------------------------------------------------------------------------------------------

def _scale(value: float) -> tuple[float, str, str]:
    """(divisor, unit, number format) a time of ``value`` µs is printed in: ms from 10,000 µs, one decimal below 10."""
    if value >= 10_000:
        return 1000.0, "ms", "{:,.1f}"
    return 1.0, "µs", "{:,.0f}" if value >= 10 else "{:.1f}"


def _us(value: float) -> str:
    div, unit, fmt = _scale(value)
    return f"{fmt.format(value / div)} {unit}"


def _costs(costs: Sequence[dict[str, Any]]) -> str:
    """``1 tok 34 µs (26–56) · …``: each cost with its bars (two variants' costs are only as different as their bars
    allow); the bars in the point's unit."""
    def one(c: dict[str, Any]) -> str:
        us = _us(c["us"])
        if c.get("low") is None or c.get("high") is None:
            return f"{c['tokens']} tok {us}"
        div, _unit, fmt = _scale(c["us"])
        return f"{c['tokens']} tok {us} ({fmt.format(c['low'] / div)}–{fmt.format(c['high'] / div)})"
    return " · ".join(one(c) for c in costs if "tokens" in c and "us" in c)


def _dispatch(steps: Sequence[dict[str, Any]]) -> str:
    parts = []
    for s in steps:
        lo, hi = (s.get("tokens") or [None, None])[:2]
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        if s.get("raises"):
            parts.append(f"{span} tok AITER raises")
            continue
        split = f" split-K {s.get('ksplit')}" if (s.get("ksplit") or 0) > 1 else ""
        parts.append(f"{span} tok {s.get('family')} {s.get('stages')}-stage block_m {s.get('block_m')}{split} "
                     f"({s.get('basis')})")
    return "; ".join(parts)


def _padding(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    if not (p.get("hidden_pad") or p.get("intermediate_pad")):
        return "no padding"
    hidden = p["hidden"] - p.get("hidden_pad", 0)
    inter = p["intermediate_per_rank"] - p.get("intermediate_pad", 0)
    sem = f" ({p['pad_semantics']})" if p.get("pad_semantics") else ""
    return f"pad hidden {hidden}→{p['hidden']}, intermediate/rank {inter}→{p['intermediate_per_rank']}{sem}"


def render_table(cmp: Comparison, doc: dict[str, Any] | None = None, *, width: int | None = None) -> str:
    """The comparison for people; ``width`` as :func:`moedispatch.render.explain.render_table` (``None``: unwrapped)."""

    def _wrap(text: str, indent: str) -> list[str]:
        return wrap(text, indent, width)

    doc = doc or compare_to_json(cmp)
    numbers: dict[str, int] = {}

    def cite(reason: Any) -> str:
        """``text [3]``: sources are numbered and listed once at the end (the JSON keeps them on each line)."""
        number = f" [{numbers.setdefault(reason.source, len(numbers) + 1)}]" if reason.source else ""
        return with_marker(reason.text, reason.confidence, number)

    model = cmp.plans[0].model
    letters = [chr(ord("A") + i) for i in range(len(cmp.plans))]
    lines = [f"model   {model.name} ({model.source}" + (f", {model.architecture}" if model.architecture else "")
             + f") across {', '.join(_FLAGS[a] for a in cmp.axes)}"]
    lw = max(len(cmp.label(i)) for i in range(len(cmp.plans)))
    for i, (plan, v) in enumerate(zip(cmp.plans, doc["variants"])):
        caps = plan.caps
        detail = target_label(caps) + (f", {caps.compute_units} CUs" if caps.compute_units else "")
        detail += f", AITER {caps.aiter_version}" if caps.aiter_version else ", no AITER"
        lines.append(f"  {letters[i]}  {detail}; tp={plan.tp} ep={plan.ep}; fingerprint {v['fingerprint']}")
        for used in v.get("aiter_data") or ():  # what this variant's AITER dispatch read
            lines += _wrap(f"rows {used['rows']}; rules {used['rules']}", "       ")
    lines.append("")
    differ = 0
    for g in doc["groups"]:
        idx = g["layers"]
        count = f"{len(idx)} {'MoE' if g['kind'] == 'moe' else 'dense'}"
        span = layer_span(idx)
        if g["kind"] != "moe":
            lines.append(f"{span} ({count}) → dense MLP in every variant")
            continue
        differ += len(idx) if g["differs"] else 0
        state = f"DIFFERS in {' and '.join(g['differs_in'])}" if g["differs"] else \
            "same backend, padding, dispatch and known issues"
        lines.append(f"{span} ({count}): {state}")
        bw = max(len(d["backend"] or "NO BACKEND") for d in g["decisions"])
        for i, d in enumerate(g["decisions"]):
            lines.append(f"    {letters[i]}  {cmp.label(i):<{lw}}  {d['backend'] or 'NO BACKEND':<{bw}}  "
                         f"{_padding(d['padding'])}")
            if d.get("aiter_dispatch"):
                lines += _wrap(_dispatch(d["aiter_dispatch"]), f"       {' ' * lw}  aiter ")
            if d.get("cost"):
                lines += _wrap(_costs(d["cost"]), f"       {' ' * lw}  cost  ")
        whys = [_why_text(item, cite) for item in _why_items(cmp, idx[0], g["differs_in"])] if g["differs"] else []
        for n, why in enumerate(whys):
            lines += _wrap(why, "    why " if n == 0 else "        ")
    totals = [(i, v["cost_total"]) for i, v in enumerate(doc["variants"]) if v.get("cost_total")]
    if totals:
        lines.append("")
        lines.append("predicted MoE time per forward pass on one rank:")
        for i, costs in totals:
            lines += _wrap(_costs(costs), f"  {letters[i]}  {cmp.label(i):<{lw}}  ")
    lines.append("")
    moe = sum(1 for d in cmp.plans[0].decisions if d.layer.kind == "moe")
    lines.append(f"summary {differ} of {moe} MoE layers differ between the variants")
    for i, plan in enumerate(cmp.plans):
        missing = [d.layer.index for d in plan.decisions if not d.ok]
        if missing:
            lines.append(f"        {letters[i]} {cmp.label(i)}: {len(missing)} MoE layer(s) have no correct backend")
    warnings = sorted({w for v in doc["variants"] for w in v["warnings"]},
                      key=lambda w: min(n for n, v in enumerate(doc["variants"]) if w in v["warnings"]))
    if warnings:
        lines.append("")
        for w in warnings:
            where = [letters[i] for i, v in enumerate(doc["variants"]) if w in v["warnings"]]
            scope = "" if len(where) == len(letters) else f"[{','.join(where)}] "
            lines += _wrap(scope + w, "warning ")
    if numbers:
        lines.append("")
        for source, n in numbers.items():
            lines += _wrap(source, f"[{n}]".ljust(8))
    return fit("\n".join(lines), width) + "\n"


# -- CLI -------------------------------------------------------------------------------------------------------

def _runtime(args: Any) -> Any:
    """The explain run-time assumptions (token counts, AITER env) when this install plans them, else None."""
    overrides = {}
    for item in getattr(args, "aiter_env", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--aiter-env takes KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    tokens = parse_tokens(args.tokens) if getattr(args, "tokens", None) else None
    return Runtime.build(tokens, overrides=overrides)


def run_cli(args: Any, emit: Callable[[str], None]) -> int:
    """``moedispatch compare``: exit 0; 3 when some variant has a MoE layer with no backend (all still printed)."""
    import inspect
    import sys

    variants, axes = parse_variants(args.target, args.aiter_version, args.tp, args.ep)
    model = load_model(args.model)
    strict = bool(getattr(args, "strict_plugins", False))
    registry = plugins.get_registry(strict=strict)
    runtime = _runtime(args)
    extra = {"runtime": runtime} if runtime is not None and "runtime" in inspect.signature(plan_model).parameters \
        else {}
    resolved = [resolve_capabilities(v.target, v.aiter_version) for v in variants]  # bad targets fail before planning

    def plan_variant(model: Any, variant: Variant) -> Any:
        caps, first_line = resolved[variants.index(variant)]
        heads = heads_warning(model, variant.tp)
        warnings = (([first_line] if first_line else []) + [f"plugin error: {e}" for e in registry.errors]
                    + list(registry.warnings) + ([heads] if heads else []))
        return plan_model(model, caps, variant.tp, variant.ep, backends=registry.backends, strict=strict,
                          warnings=warnings, **extra)

    cmp = compare_plans(model, variants, axes, plan_variant=plan_variant)
    doc = compare_to_json(cmp)
    if args.format == "json":
        emit(json.dumps(doc, indent=2))
    else:
        emit(render_table(cmp, doc, width=getattr(args, "width", None)))
    if not cmp.ok:
        for i, plan in enumerate(cmp.plans):
            missing = [d for d in plan.decisions if not d.ok]
            if missing:
                sys.stderr.write(f"moedispatch: {cmp.label(i)}: {len(missing)} MoE layer(s) have no correct backend; "
                                 f"layer {missing[0].layer.index}: {missing[0].reasons[0]}\n")
        return 3
    return 0
