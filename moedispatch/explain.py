"""Plan a whole model (one Decision per layer) and render it: JSON (schema ``moedispatch.explain/1``) and a table.

Renderers only format Decisions; they never re-derive selection logic.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

from moedispatch._log import get_logger
from moedispatch.backend import Backend
from moedispatch.capabilities import Capabilities
from moedispatch.errors import NoBackendError
from moedispatch.layers import MoELayer
from moedispatch.models import ModelSpec, expand_layers
from moedispatch.selector import Decision, select

__all__ = ["Plan", "plan_model", "plan_to_json", "render_json", "render_table", "padded_bytes", "SCHEMA"]

SCHEMA = "moedispatch.explain/1"
log = get_logger(__name__)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    caps: Capabilities
    tp: int
    ep: int
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.decisions)

    @property
    def layers(self) -> tuple[Decision, ...]:
        return self.decisions

    def to_dict(self) -> dict[str, Any]:
        """The explain JSON document (schema ``moedispatch.explain/1``)."""
        return plan_to_json(self)

    @property
    def fingerprint(self) -> str:
        """Stable hash of everything that must agree across ranks (target, parallelism, every decision)."""
        payload = json.dumps({"target": self.caps.target_dict(), "parallel": [self.tp, self.ep],
                              "layers": [_layer_entry(d) for d in self.decisions]}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def padded_bytes(layer: MoELayer, decision: Decision) -> tuple[int, int]:
    """(bytes of routed-expert weights per rank as allocated, extra bytes the padding adds), scales included."""
    if layer.kind != "moe":
        return 0, 0

    def weight_bytes(hidden: int, inter: int) -> int:
        elems = layer.experts_per_rank * 3 * hidden * inter  # w13 [E, 2I, H] + w2 [E, H, I]
        total = elems * layer.weight.bits / 8
        if layer.weight.is_mx:
            total += elems / 32  # one E8M0 byte per 32 elements
        elif layer.weight.block:
            bn, bk = layer.weight.block
            total += layer.experts_per_rank * 4 * (-(-2 * inter // bn) * -(-hidden // bk)
                                                   + -(-hidden // bn) * -(-inter // bk))
        return int(total)

    base = weight_bytes(layer.hidden, layer.intermediate_per_rank)
    padded = weight_bytes(decision.padding.hidden, decision.padding.intermediate_per_rank)
    return padded, padded - base


def plan_model(
    model: ModelSpec,
    caps: Capabilities,
    tp: int = 1,
    ep: int = 1,
    *,
    backends: Sequence[Backend] | None = None,
    force: str | None = None,
    strict: bool = False,
    warnings: Sequence[str] = (),
) -> Plan:
    """One Decision per layer (layers no backend can run get ``backend=None`` and their rejections)."""
    if backends is None:
        from moedispatch.plugins import get_registry

        registry = get_registry(strict=strict)
        backends = registry.backends
        warnings = tuple(warnings) + tuple(f"plugin error: {e}" for e in registry.errors)
    layers = expand_layers(model, tp, ep)
    decisions = []
    for layer in layers:
        try:
            decisions.append(select(layer, caps, backends, force, strict=strict))
        except NoBackendError as exc:
            decisions.append(exc.decision)
    out_warnings = list(warnings) + list(caps.notes) + list(model.notes)
    emulated = [d.layer.index for d in decisions if d.backend == "emulation"]
    if emulated:
        out_warnings.append(
            f"{len(emulated)} MoE layer(s) run on emulation, the slow reference path (dequantizes on the fly; ~20× "
            f"slower decode in vLLM #50817): no native kernel is correct for them on {caps.arch_label}"
            + (f" with AITER {caps.aiter_version}" if caps.aiter_version else " without AITER")
            + " — do not serve traffic with this plan")
    if model.prepadded and model.stored_intermediate:
        moe = [d for d in decisions if d.layer.kind == "moe"]
        if moe:
            d0 = moe[0]
            stored = model.stored_intermediate // d0.layer.moe_tp
            alloc = d0.padding.intermediate_per_rank
            out_warnings.append(
                f"pre-padded checkpoint: experts are stored {model.stored_intermediate} wide but the model is "
                f"{d0.layer.intermediate} ({d0.layer.intermediate_per_rank}/rank); the plan allocates {alloc}/rank — "
                + ("load only the first " f"{d0.layer.intermediate_per_rank} columns of each rank's slice (vLLM "
                   "_load_w13/_load_w2 narrow with the unpadded size, vllm.md §12.1) and keep the rest zero"
                   if stored != alloc else "the stored zeros fill the planned pad exactly"))
    caveats = dict.fromkeys(r for d in decisions for r in d.reasons if r.startswith("caveat [scale"))
    out_warnings += list(caveats)
    missing = [d.layer.index for d in decisions if not d.ok]
    if missing:
        out_warnings.append(f"{len(missing)} MoE layer(s) have no backend: {_ranges(missing)}")
    plan = Plan(model, caps, tp, ep, tuple(decisions), tuple(dict.fromkeys(out_warnings)))
    counts: dict[str, int] = {}
    for d in decisions:
        if d.layer.kind == "moe":
            key = d.backend or "none"
            counts[key] = counts.get(key, 0) + 1
    log.info("dispatch_planned", model=model.name, target=caps.gfx, aiter=caps.aiter_version, tp=tp, ep=ep,
             backends=counts, fingerprint=plan.fingerprint)
    return plan


# -- JSON ------------------------------------------------------------------------------------------------------

def _layer_entry(d: Decision) -> dict[str, Any]:
    layer = d.layer
    entry: dict[str, Any] = {
        "index": layer.index,
        "kind": layer.kind,
        "shape": {
            "hidden": layer.hidden,
            "intermediate": layer.intermediate,
            "intermediate_per_rank": layer.intermediate_per_rank,
            "experts": layer.experts,
            "experts_per_rank": layer.experts_per_rank,
            "top_k": layer.top_k,
        },
        "quant": {
            "weight": layer.weight.dtype,
            "activation": layer.act.dtype,
            "granularity": layer.weight.granularity,
            "activation_granularity": layer.act.granularity,
        },
    }
    entry.update(d.to_dict())
    if layer.kind == "moe":
        total, extra = padded_bytes(layer, d)
        entry["padded_bytes"] = extra
        entry["activation_fn"] = layer.activation
    return entry


def plan_to_json(plan: Plan) -> dict[str, Any]:
    totals = [padded_bytes(d.layer, d) for d in plan.decisions]
    return {
        "schema": SCHEMA,
        "model": plan.model.to_dict(),
        "target": plan.caps.target_dict(),
        "parallel": {"tp": plan.tp, "ep": plan.ep},
        "layers": [_layer_entry(d) for d in plan.decisions],
        "warnings": list(plan.warnings),
        "padded_bytes": sum(extra for _, extra in totals),
        "fingerprint": plan.fingerprint,
    }


def render_json(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=2, sort_keys=False) + "\n"


# -- table -----------------------------------------------------------------------------------------------------

def _ranges(indices: Sequence[int]) -> str:
    parts, start, prev = [], None, None
    for i in indices:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}–{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        parts.append(f"{start}–{prev}" if start != prev else str(start))
    return ", ".join(parts)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _wrap(text: str, indent: str, width: int = 116) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=indent,
                         subsequent_indent=" " * len(indent) + "  ") or [indent]


def render_table(plan: Plan, *, first_line: str | None = None) -> str:
    caps = plan.caps
    lines: list[str] = []
    if first_line:
        lines.append(first_line)
    target = f"{caps.arch_label}"
    if caps.compute_units:
        target += f", {caps.compute_units} CUs"
    target += f", AITER {caps.aiter_version}" if caps.aiter_version else ", no AITER"
    lines.append(f"model   {plan.model.name} ({plan.model.source}"
                 + (f", {plan.model.architecture}" if plan.model.architecture else "") + ")")
    lines.append(f"target  {target} [{caps.source}]")
    lines.append(f"layout  tp={plan.tp} ep={plan.ep}; {plan.model.moe_layers} MoE of {len(plan.model.layers)} layers;"
                 f" plan fingerprint {plan.fingerprint}")
    lines.append("")
    groups: list[list[Decision]] = []
    for d in plan.decisions:
        if groups and groups[-1][-1].group_key() == d.group_key() and groups[-1][-1].layer.index + 1 == d.layer.index:
            groups[-1].append(d)
        else:
            groups.append([d])
    for group in groups:
        d = group[0]
        layer = d.layer
        idx = [g.layer.index for g in group]
        span = f"layer {idx[0]}" if len(idx) == 1 else f"layers {idx[0]}–{idx[-1]}"
        count = f"{len(idx)} {'MoE' if layer.kind == 'moe' else 'dense'}"
        if layer.kind == "dense":
            lines.append(f"{span} ({count}) → dense MLP, no MoE backend "
                         f"(hidden {layer.hidden}, intermediate {layer.intermediate})")
            continue
        head = f"{span} ({count}) → {d.backend or 'NO BACKEND'}"
        lines.append(head)
        lines.append(f"    shape   hidden {layer.hidden}, intermediate {layer.intermediate} → "
                     f"{layer.intermediate_per_rank}/rank, experts {layer.experts} → {layer.experts_per_rank}/rank, "
                     f"top-{layer.top_k}, {layer.activation}")
        lines.append(f"    quant   weights {layer.weight.describe()}, activations {layer.act.describe()}")
        p = d.padding
        if d.backend:
            if p.padded:
                _, extra = padded_bytes(layer, d)
                lines += _wrap(
                    f"hidden {layer.hidden}→{p.hidden}, intermediate/rank {layer.intermediate_per_rank}→"
                    f"{p.intermediate_per_rank}; kernel pads hidden={p.kernel_hidden_pad} "
                    f"intermediate={p.kernel_intermediate_pad}; zero-fill {'yes' if p.zero_fill else 'no'}; "
                    f"+{_human_bytes(extra)}/rank per layer", "    padding ")
            else:
                lines.append("    padding none needed")
        for reason in d.reasons:
            lines += _wrap(reason, "    why     " if reason is d.reasons[0] else "            ")
        for rej in d.rejected:
            lines += _wrap(f"{rej.backend}: " + "; ".join(rej.reasons), "    not     ")
    total = sum(padded_bytes(d.layer, d)[1] for d in plan.decisions)
    if total:
        lines.append("")
        lines.append(f"padding adds {_human_bytes(total)} of expert weights per rank over the whole model")
    if plan.warnings:
        lines.append("")
        for w in plan.warnings:
            lines += _wrap(w, "warning ")
    return "\n".join(lines) + "\n"
