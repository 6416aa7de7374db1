"""Render a plan: JSON (schema ``moedispatch.explain/1``) and a table.

Renderers only format Decisions and read reasons by kind; they never re-derive selection logic. Planning itself
(:class:`Plan`, :func:`plan_model`) lives in :mod:`moedispatch.plan.plan` and is re-exported here.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from moedispatch._util.width import fit, wrap
from moedispatch.core.decision import Decision
from moedispatch.plan.plan import SCHEMA, Plan, aiter_data, cost_total, layer_span, padded_bytes, plan_model, plan_to_json
from moedispatch.core.reason import Reason, with_marker
from moedispatch.core.costs import format_cost
from moedispatch.data.capdb import partition_of, partitions_for
from moedispatch.kit.caveats import PAD_RATIO_MIN

__all__ = ["Plan", "plan_model", "plan_to_json", "render_json", "render_table", "padded_bytes", "SCHEMA",
           "LEGEND"]

#: The table's one-line legend for confidence markers.
LEGEND = ("(derived) = moedispatch's inference from the cited sources, not verified upstream; (unconfirmed) = no "
          "primary source found")


def render_json(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=2, sort_keys=False) + "\n"


# -- table -----------------------------------------------------------------------------------------------------

def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _wrap(text: str, indent: str, width: int | None = None) -> list[str]:
    return wrap(text, indent, width)


#: Why the plan assumes its AITER version (the provenance of ``aiter_version``), for the target line.
TARGET_WHY = {"flag": "from --target", "env": "from MOEDISPATCH_TARGET", "probe": "probed",
               "default": "default: no GPU found"}
_AITER_WHY = {"default": "default: the newest capability_db knows", "flag": "--aiter-version",
              "env": "MOEDISPATCH_TARGET", "probe": "installed", "installed": "installed in this Python"}


def _step_line(step: Any, act: str | None = None) -> str:
    """One AITER dispatch step; ``act``: the checkpoint's activation quantization, so a step that runs other
    activations says at once that this is AITER's own policy (its reason is under "why")."""
    lo, hi = step.tokens
    toks = f"{lo}" if lo == hi else f"{lo}–{hi}"
    why = f"tuned row {step.config}" if step.basis == "tuned" else "AITER heuristic"
    if getattr(step, "raises", None):
        return f"tokens {toks}: AITER raises — {step.raises}"
    kernels = " + ".join(step.kernels)
    split = f", split-K {step.ksplit}" if getattr(step, "ksplit", 0) > 1 else ""
    policy = (f" (AITER's own activation policy, not the checkpoint's {act}: see why)"
              if act and step.activation_dtype and act not in ("bf16", "fp16") and step.activation_dtype != act
              else "")
    return (f"tokens {toks}: {step.family} {step.stages}-stage {kernels}, block_m {step.block_m}{split}, "
            f"{step.activation_dtype} activations{policy} — {why}")


def _costs_line(costs: Sequence[Any], *, basis: bool = True) -> str:
    parts = []
    for c in costs:
        unit = "token" if c.tokens == 1 else "tokens"
        parts.append(f"{c.tokens} {unit} {format_cost(c)}" + (f" {c.basis}" if basis else ""))
    return " · ".join(parts)


def _basis_lines(costs: Sequence[Any]) -> list[str]:
    """How each cost was computed, once per distinct ``detail``: ``tokens 1, 4, 64: <detail>``."""
    spans: dict[str, list[int]] = {}
    for c in costs:
        if c.detail:
            spans.setdefault(c.detail, []).append(c.tokens)
    return [f"{'token' if toks == [1] else 'tokens'} {', '.join(map(str, toks))}: {detail}"
            for detail, toks in spans.items()]


def _pad_ratio_text(layer: Any, p: Any) -> str:
    """`` (8× the shard, see the pad-ratio caveat)`` when the allocation is ≥ caveats.PAD_RATIO_MIN × the shard."""
    shard = layer.intermediate_per_rank
    if shard > 0 and p.intermediate_per_rank >= PAD_RATIO_MIN * shard:
        return f" ({p.intermediate_per_rank / shard:g}× the shard: see caveat [pad ratio])"
    return ""


def _brief_line(d: Decision, span: str, count: str) -> str:
    layer, p = d.layer, d.padding
    if layer.kind == "dense":
        return f"{span} ({count}) → dense MLP"
    dims = ([f"hidden {layer.hidden}→{p.hidden}"] if p.hidden_pad else []) + \
        ([f"intermediate/rank {layer.intermediate_per_rank}→{p.intermediate_per_rank}"] if p.intermediate_pad else [])
    pad = f"pad {', '.join(dims)} ({p.pad_semantics})" if p.padded else "no padding"
    extra = f"; {len(d.warnings)} warning(s)" if d.warnings else ""
    return f"{span} ({count}) → {d.backend or 'NO BACKEND'}: {pad}{extra}"


class _Sources:
    """Numbered sources for the table: a reason prints ``text [3]`` and the sources are listed once at the end, so
    the 57 identical layers' citations do not drown the decision (the JSON keeps every source on its reason)."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def __call__(self, reason: Reason) -> str:
        number = ""
        if reason.source:
            number = f" [{self.numbers.setdefault(reason.source, len(self.numbers) + 1)}]"
        return with_marker(reason.text, reason.confidence, number)

    def lines(self, width: int | None = None) -> list[str]:
        out: list[str] = []
        for source, n in self.numbers.items():
            out += _wrap(source, f"[{n}]".ljust(8), width)
        return out


def render_table(plan: Plan, *, first_line: str | None = None, brief: bool = False, width: int | None = None) -> str:
    """The plan for people. ``width``: the columns every line fits in (:func:`moedispatch._util.width.terminal_width`;
    ``None``, the default, wraps nothing); only a token longer than a line (a path, a URL) can exceed it."""

    def wrapped(text: str, indent: str) -> list[str]:
        return _wrap(text, indent, width)

    cite = _Sources()
    lines: list[str] = []
    if first_line:
        lines.append(first_line)
    lines += _header_lines(plan, width)
    for group in plan.groups():
        d = group[0]
        layer = d.layer
        idx = [g.layer.index for g in group]
        span = layer_span(idx)
        count = f"{len(idx)} {'MoE' if layer.kind == 'moe' else 'dense'}"
        if brief:
            lines.append(_brief_line(d, span, count))
            continue
        if layer.kind == "dense":
            lines.append(f"{span} ({count}) → dense MLP, no MoE backend "
                         f"(hidden {layer.hidden}, intermediate {layer.intermediate})")
            continue
        lines += _group_lines(plan, group, span, count, cite, width)
    totals = cost_total(plan)
    if totals and not brief:
        lines.append("")
        moe = sum(1 for d in plan.decisions if d.layer.kind == "moe")
        shared = any(d.layer.kind == "moe" and d.layer.shared_experts for d in plan.decisions)
        lines += wrapped(f"predicted MoE time per forward pass on one rank ({moe} MoE layers"
                         + ("; the fused-MoE calls only: a shared expert run outside them is not included"
                            if shared else "") + "): " + _costs_line(totals, basis=False), "total   ")
    total = sum(padded_bytes(d.layer, d)[1] for d in plan.decisions)
    if total:
        lines.append("")
        lines.append(f"padding adds {_human_bytes(total)} of expert weights per rank over the whole model")
    if plan.warnings:
        lines.append("")
        for w in plan.warnings:  # the label says warning once (a caveat raised to a warning opens with "caveat ")
            lines += wrapped(cite(w).removeprefix("caveat "), "warning ")
    if cite.numbers:
        lines.append("")
        lines.append("sources")
        lines += cite.lines(width)
    if any(r.confidence != "confirmed" for r in _all_reasons(plan)):
        lines.append("")
        lines.append(f"legend  {LEGEND}")
    # The header, dense-layer and legend lines are built whole; fit() keeps them inside the width too.
    return fit("\n".join(lines), width) + "\n"


def _header_lines(plan: Plan, width: int | None) -> list[str]:
    """model / target / layout / aiter lines: what was planned, where the target and the AITER came from."""
    caps = plan.caps
    lines: list[str] = []
    # Where the target and the AITER came from, in words, each right after what it qualifies (newcomer minor 7: a
    # bracketed [flag] beside "(default: …)" was two notations on one line, neither in the legend).
    target = f"{caps.arch_label}"
    mode = partition_of(caps.gfx, caps.product, caps.compute_units)
    if mode and caps.compute_units:
        n = partitions_for(caps.gfx, caps.product)[mode]
        target += f", {mode} partition: {caps.compute_units} CUs (1/{n} of {caps.compute_units * n}; derived)"
    elif caps.compute_units:
        target += f", {caps.compute_units} CUs"
    target += f" ({TARGET_WHY.get(caps.source, caps.source)})"
    target += f", AITER {caps.aiter_version}" if caps.aiter_version else ", no AITER"
    target += f" ({_AITER_WHY.get(caps.source_of('aiter_version') or '', caps.source_of('aiter_version') or '?')})"
    lines.append(f"model   {plan.model.name} ({plan.model.source}"
                 + (f", {plan.model.architecture}" if plan.model.architecture else "") + ")")
    lines.append(f"target  {target}")
    lines.append(f"layout  tp={plan.tp} ep={plan.ep}; {plan.model.moe_layers} MoE of {len(plan.model.layers)} layers;"
                 f" plan fingerprint {plan.fingerprint}, decision fingerprint {plan.decision_fingerprint}")
    for used in aiter_data(plan):
        lines += _wrap(f"rows {used['rows']}; rules {used['rules']} ({used['rules_source']})", "aiter   ", width)
    lines.append("")
    return lines


def _group_lines(plan: Plan, group: Sequence[Decision], span: str, count: str, cite: "_Sources",
                 width: int | None) -> list[str]:
    """One MoE layer group: backend, shape, quant, padding, what AITER runs, cost, what-if, why, caveats, warnings
    and the backends not chosen."""

    def wrapped(text: str, indent: str) -> list[str]:
        return _wrap(text, indent, width)

    d = group[0]
    layer = d.layer
    lines: list[str] = []
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
            lines += wrapped(
                f"hidden {layer.hidden}→{p.hidden}, intermediate/rank {layer.intermediate_per_rank}→"
                f"{p.intermediate_per_rank}{_pad_ratio_text(layer, p)}; kernel pads hidden={p.kernel_hidden_pad} "
                f"intermediate={p.kernel_intermediate_pad} ({p.pad_semantics}); zero-fill {'yes' if p.zero_fill else 'no'}; "
                f"+{_human_bytes(extra)}/rank per layer", "    padding ")
        else:
            lines.append("    padding none needed")
    if d.dispatch is not None:
        for n, step in enumerate(d.dispatch.steps):
            lines += wrapped(_step_line(step, layer.act.dtype), "    aiter   " if n == 0 else "            ")
        for assumption in d.dispatch.assumptions:
            lines += wrapped(f"assumes {assumption}", "            ")
    if d.cost:
        lines += wrapped(_costs_line(d.cost), "    cost    ")
        for line in _basis_lines(d.cost):
            lines += wrapped(line, "            ")
    for reason in plan.what_if_for(group):
        lines += wrapped(cite(reason).removeprefix("what-if: "), "    what-if ")
    why = [r for r in d.reasons if r.kind not in ("caveat", "warning")]
    for n, reason in enumerate(why):
        lines += wrapped(cite(reason), "    why     " if n == 0 else "            ")
    for reason in d.of_kind("caveat"):  # the label says caveat once (texts from known issues open with it)
        lines += wrapped(cite(reason).removeprefix("caveat "), "    caveat  ")
    for reason in d.of_kind("warning"):
        lines += wrapped(cite(reason), "    warning ")
    for rej in d.rejected:
        lines += wrapped(f"{rej.backend}: " + "; ".join(cite(r) for r in rej.reasons), "    not     ")
    return lines


def _all_reasons(plan: Plan) -> list[Reason]:
    out = list(plan.warnings)
    for d in plan.decisions:
        out += d.reasons
        for rej in d.rejected:
            out += rej.reasons
    return out
