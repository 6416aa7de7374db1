"""Plan a whole model: one :class:`~moedispatch.core.decision.Decision` per layer, the plan's warnings, its fingerprint
and its JSON (schema ``moedispatch.explain/1``). Renderers live in :mod:`moedispatch.render.explain`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from moedispatch._util.log import get_logger
from moedispatch.core.backend import Backend
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.decision import Decision
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import MoELayer
from moedispatch.core.workload import dispatch_env
from moedispatch.sources.models import ModelSpec, expand_layers
from moedispatch.core.reason import Reason, texts
from moedispatch.selector.pure import select
from moedispatch._util.deadline import collect_plugin_notices
from moedispatch.cost.ranking import total
from moedispatch.data.aiter_configs import config_set_for
from moedispatch.data.capdb import target_entry
from moedispatch.kit.caveats import PAD_RATIO_MIN, ep_alternative_layer, pad_ratio_caveat
from moedispatch.selector import plugins

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.workload import Runtime

__all__ = ["Plan", "plan_model", "plan_to_json", "plan_to_brief_json", "padded_bytes", "layer_entry", "group_entry",
           "layer_span", "cost_total", "SCHEMA", "BRIEF_SCHEMA"]

SCHEMA = "moedispatch.explain/1"
#: ``explain --brief --format json``: the same plan with each reason once (docs/schemas/explain-brief.schema.json).
BRIEF_SCHEMA = "moedispatch.explain-brief/1"
log = get_logger(__name__)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    caps: Capabilities
    tp: int
    ep: int
    decisions: tuple[Decision, ...]
    warnings: tuple[Reason, ...]
    #: The token counts and AITER environment the plan assumed (None: planned without run-time simulation).
    runtime: "Runtime | None" = None
    #: ``((first layer index of a group, what-if reasons), …)`` when asked for (``explain --what-if``).
    what_if: tuple[tuple[int, tuple[Reason, ...]], ...] = ()
    #: The attention (and dense layers') TP when it is narrower than the MoE's ``tp``: data-parallel attention without
    #: expert parallelism — vLLM shards its experts tensor-parallel over all TP × DP ranks
    #: (vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make,
    #: flatten_tp_across_dp_and_pcp), SGLang over its whole --tp-size (server_args: moe_tp_size = tp_size //
    #: ep_size). None: the same as ``tp``.
    attention_tp: int | None = None

    @property
    def dense_tp(self) -> int:
        """The TP of attention and the dense layers (``attention_tp``, else ``tp``)."""
        return self.attention_tp or self.tp

    def what_if_for(self, group: Sequence[Decision]) -> tuple[Reason, ...]:
        first = group[0].layer.index
        return next((r for i, r in self.what_if if i == first), ())

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.decisions)

    @property
    def layers(self) -> tuple[Decision, ...]:
        return self.decisions

    def to_dict(self) -> dict[str, Any]:
        """The explain JSON document (schema ``moedispatch.explain/1``)."""
        return plan_to_json(self)

    def groups(self) -> tuple[tuple[Decision, ...], ...]:
        """Layers whose decisions are identical, across non-adjacent layers, in order of first appearance
        (Llama-4-Maverick's 24 MoE layers alternate with dense ones: one group of 24)."""
        by_key: dict[tuple, list[Decision]] = {}
        for d in self.decisions:
            by_key.setdefault(d.group_key(), []).append(d)
        return tuple(tuple(g) for g in by_key.values())

    @property
    def decision_fingerprint(self) -> str:
        """Hash of what must agree across ranks and nodes: the target (gfx, product, CUs, partition, AITER version —
        not how it was named), the parallelism, per layer the backend and padding (kernel pads included), the AITER
        environment the plan assumed, and which AITER rows and dispatch rules it read. Display-only inputs do not
        enter: token counts planned, costs, reason wording. Computable offline for an expected target
        (``explain --target … --format json`` → ``decision_fingerprint``); equal plans on two ranks give equal hashes.
        """
        target = {k: v for k, v in target_entry(self.caps).items() if k != "source"}
        layers = [{"index": d.layer.index, "kind": d.layer.kind, "backend": d.backend,
                   "padding": d.padding.to_dict() if d.layer.kind == "moe" else None} for d in self.decisions]
        aiter = [{"rules": u["rules"], "rows": u["release"] or (u["origin"] if u["origin"] == "installed"
                                                                  else u["rows"])} for u in aiter_data(self)]
        payload = json.dumps({"target": target, "parallel": [self.tp, self.ep], "layers": layers,
                              "aiter_env": dispatch_env(dict(self.runtime.env)) if self.runtime is not None else {},
                              "aiter": aiter}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def fingerprint(self) -> str:
        """Stable hash of the whole plan as shown (target and how it was named, parallelism, every decision with its
        reasons, dispatch per planned token count and cost): it changes with ``--tokens`` and wording. Ranks compare
        :attr:`decision_fingerprint` instead."""
        payload = json.dumps({"target": self.caps.target_dict(), "parallel": [self.tp, self.ep],
                              "layers": [layer_entry(d) for d in self.decisions]}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _target_entry(caps: Capabilities) -> dict[str, Any]:
    """The JSON ``target``: ``caps.target_dict()`` plus ``partition`` for a compute-partition target."""
    return target_entry(caps)


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


def _pad_ratio_warnings(decisions: Sequence[Decision], caps: Capabilities, backends: Sequence[Backend],
                        runtime: "Runtime | None") -> list[Reason]:
    """``caveat [pad ratio]`` (moedispatch.kit.caveats.pad_ratio_caveat) once per group of layers padded to ≥ 4× their
    TP shard, with the expert-parallel alternative re-planned by the selector itself (only for such groups)."""
    groups: dict[tuple, list[Decision]] = {}
    for d in decisions:
        if (d.backend is not None and d.layer.kind == "moe"
                and d.padding.intermediate_per_rank >= PAD_RATIO_MIN * d.layer.intermediate_per_rank):
            groups.setdefault((d.layer.signature(), d.backend, d.padding), []).append(d)
    out = []
    for members in groups.values():
        d = members[0]
        alt_layer = ep_alternative_layer(d.layer)
        alternative = None
        if alt_layer is not None:
            try:
                alternative = select(alt_layer, caps, backends, runtime=runtime)
            except NoBackendError:
                alternative = None
        reason = pad_ratio_caveat(d, padded_bytes(d.layer, d)[1], alternative)
        if reason is not None:
            idx = [m.layer.index for m in members]
            out.append(Reason(f"{len(idx)} MoE layer(s) ({_ranges(idx)}): {reason.text}", "warning", reason.source,
                              reason.issue, reason.confidence))
    return out


def _unpriced_warnings(decisions: Sequence[Decision], caps: Capabilities, runtime: Any) -> list[Reason]:
    """One warning when the plan was costed (a Runtime) but no chosen MoE backend got a cost: the target has no
    datasheet peaks in capability_db/gpus.toml (MI300A, gfx90a, gfx1100 …) — the report would otherwise just lack
    its cost lines and total."""
    chosen = [d for d in decisions if d.layer.kind == "moe" and d.backend]
    if runtime is None or not chosen or any(d.cost for d in chosen):
        return []
    return [Reason(f"no cost for {caps.arch_label}: capability_db/gpus.toml has no datasheet peaks ([peak.<product>]"
                   " table) for it, so nothing is priced; backends are ordered by correctness and preference only",
                   "warning", "capability_db/gpus.toml")]


def _tuned_set_warnings(decisions: Sequence[Decision], caps: Capabilities) -> list[Reason]:
    """What is wrong with a tuned set the user pointed AITER at (``AITER_CONFIG_FMOE``, ``--aiter-configs`` /
    ``MOEDISPATCH_AITER_CONFIGS``) — a file that does not exist, a CSV that is no tuned fmoe table — once per plan,
    naming the set: the layers then run on AITER's heuristics, which is no default to pass over in silence."""
    for d in decisions:
        if d.dispatch is not None and d.dispatch.config_origin in ("env", "explicit"):
            cs = config_set_for(caps, dict(d.dispatch.env))
            problems = list(cs.warnings) + ([cs.merge_error] if cs.merge_error else [])
            return [Reason(f"tuned set {cs.label}: {w}", "warning") for w in problems]
    return []


def plan_model(
    model: ModelSpec,
    caps: Capabilities,
    tp: int = 1,
    ep: int = 1,
    *,
    backends: Sequence[Backend] | None = None,
    force: str | None = None,
    strict: bool = False,
    warnings: Sequence[Reason | str] = (),
    runtime: "Runtime | None" = None,
) -> Plan:
    """One Decision per layer (layers no backend can run get ``backend=None`` and their rejections).

    With a :class:`~moedispatch.selector.runtime.Runtime` every MoE decision also says what AITER's dispatcher runs per token
    count and the predicted time (and correct backends are ordered by it); the plan gains ``tokens``,
    ``aiter_env`` and ``cost_total``."""
    if backends is None:
        registry = plugins.get_registry(strict=strict)
        backends = registry.backends
        warnings = (tuple(warnings) + tuple(Reason(f"plugin error: {e}", "warning") for e in registry.errors)
                    + tuple(Reason(w, "warning") for w in registry.warnings))
    layers = expand_layers(model, tp, ep)
    decisions = []
    with collect_plugin_notices() as notices:  # what third-party plugins print, which were disabled after a timeout
        for layer in layers:
            try:
                decisions.append(select(layer, caps, backends, force, strict=strict, runtime=runtime))
            except NoBackendError as exc:
                decisions.append(exc.decision)
    out_warnings = _plan_warnings(model, caps, decisions, backends, warnings, notices.texts(), runtime)
    plan = Plan(model, caps, tp, ep, tuple(decisions), tuple(dict.fromkeys(out_warnings)), runtime)
    counts: dict[str, int] = {}
    for d in decisions:
        if d.layer.kind == "moe":
            key = d.backend or "none"
            counts[key] = counts.get(key, 0) + 1
    log.info("dispatch_planned", model=model.name, target=caps.gfx, aiter=caps.aiter_version, tp=tp, ep=ep,
             backends=counts, fingerprint=plan.fingerprint)
    return plan


def _plan_warnings(model: ModelSpec, caps: Capabilities, decisions: Sequence[Decision], backends: Sequence[Backend],
                   warnings: Sequence[Reason | str], notices: Sequence[str],
                   runtime: "Runtime | None") -> list[Reason]:
    """The plan's warnings: the caller's, what plugins printed, AITER's notes, the target's and the model's (and its
    unconfirmed facts), each chosen backend's once with its layers, a pre-padded checkpoint, run-time caveats,
    pad ratios, the installed tuned set, layers with no backend."""
    out_warnings: list[Reason] = [Reason.coerce(w, "warning").with_kind("warning") for w in warnings]
    out_warnings += [Reason(text, "warning") for text in notices]
    out_warnings += [Reason(text, "warning", "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py") for text in
                     (runtime.notes if runtime is not None else ())]
    out_warnings += [Reason.coerce(n, "warning").with_kind("warning") for n in (*caps.notes, *model.notes)]
    unconfirmed = tuple(getattr(model, "unconfirmed", ()) or ())
    if unconfirmed:
        out_warnings.append(Reason(
            f"{model.name}: unconfirmed model facts ({', '.join(unconfirmed)}) — taken from third-party copies, no "
            "published primary config found; check the checkpoint's own config.json before trusting this plan",
            "warning",
            None, None, "unconfirmed"))
    out_warnings += _backend_warnings(decisions, caps)
    out_warnings += _prepadded_warnings(model, decisions)
    # Run-time caveats of the chosen paths (scale-tile splits, token-count dependent bugs) travel as warnings.
    out_warnings += [r.with_kind("warning") for d in decisions if d.backend for r in d.of_kind("caveat")]
    out_warnings += _pad_ratio_warnings(decisions, caps, backends, runtime)
    out_warnings += _tuned_set_warnings(decisions, caps)
    out_warnings += _unpriced_warnings(decisions, caps, runtime)
    missing = [d.layer.index for d in decisions if not d.ok]
    if missing:
        out_warnings.append(Reason(f"{len(missing)} MoE layer(s) have no backend: {_ranges(missing)}", "warning"))
    return out_warnings


def _backend_warnings(decisions: Sequence[Decision], caps: Capabilities) -> list[Reason]:
    """Warnings the chosen backends raise (e.g. a slow reference path), once per distinct warning with its layers."""
    out_warnings: list[Reason] = []
    by_warning: dict[tuple[str | None, Reason], list[int]] = {}
    for d in decisions:
        for w in d.warnings:
            by_warning.setdefault((d.backend, w), []).append(d.layer.index)
    for (backend, w), indices in by_warning.items():
        where = f" on {caps.arch_label}" + (f" with AITER {caps.aiter_version}" if caps.aiter_version
                                             else " without AITER")
        out_warnings.append(Reason(
            f"{len(indices)} MoE layer(s) ({_ranges(indices)}) run on {backend}{where}: {w.text}", "warning",
            w.source, w.issue, w.confidence))
    return out_warnings


def _prepadded_warnings(model: ModelSpec, decisions: Sequence[Decision]) -> list[Reason]:
    """A checkpoint stored pre-padded: what the plan allocates against what is stored, and how to load it."""
    out_warnings: list[Reason] = []
    if model.prepadded and model.stored_intermediate:
        moe = [d for d in decisions if d.layer.kind == "moe"]
        if moe:
            d0 = moe[0]
            stored = model.stored_intermediate // d0.layer.moe_tp
            alloc = d0.padding.intermediate_per_rank
            out_warnings.append(Reason(
                f"pre-padded checkpoint: experts are stored {model.stored_intermediate} wide but the model is "
                f"{d0.layer.intermediate} ({d0.layer.intermediate_per_rank}/rank); the plan allocates {alloc}/rank — "
                + ("load only the first " f"{d0.layer.intermediate_per_rank} columns of each rank's slice (vLLM "
                   "_load_w13/_load_w2 narrow with the unpadded size) and keep the rest zero"
                   if stored != alloc else "the stored zeros fill the planned pad exactly"), "warning",
                "vllm-project/vllm@017e9f4448:vllm/model_executor/layers/fused_moe/routed_experts.py"))
    return out_warnings


# -- JSON ------------------------------------------------------------------------------------------------------

def layer_entry(d: Decision) -> dict[str, Any]:
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
    if layer.act.quantized:   # the table's "dynamic": scales computed per call, or stored in the checkpoint
        entry["quant"]["activation_scales"] = "dynamic" if layer.act.dynamic else "static"
    entry.update(d.to_dict())
    if layer.kind == "moe":
        total, extra = padded_bytes(layer, d)
        entry["padded_bytes"] = extra
        entry["activation_fn"] = layer.activation
    return entry


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The explain JSON (``explain --engine`` adds ``engine_auto``: :func:`moedispatch.engines.choice.engine_auto`)."""
    totals = [padded_bytes(d.layer, d) for d in plan.decisions]
    return {
        "schema": SCHEMA,
        "model": plan.model.to_dict(),
        "target": _target_entry(plan.caps),
        "parallel": {"tp": plan.tp, "ep": plan.ep},
        "layers": [layer_entry(d) for d in plan.decisions],
        "groups": [{**group_entry(g), **({"what_if": texts(plan.what_if_for(g))} if plan.what_if_for(g) else {})}
                   for g in plan.groups()],
        **_runtime_entries(plan),
        "warnings": texts(plan.warnings),
        "warning_details": [w.to_dict() for w in plan.warnings],
        "padded_bytes": sum(extra for _, extra in totals),
        "fingerprint": plan.fingerprint,
        "decision_fingerprint": plan.decision_fingerprint,
        "aiter_data": aiter_data(plan),
    }


def plan_to_brief_json(plan: Plan) -> dict[str, Any]:
    """``explain --brief --format json`` (``moedispatch.explain-brief/1``): the plan with each distinct reason once.

    explain/1 repeats every reason per layer, twice (``reasons`` and ``reason_details``), and again per rejected
    backend — 1–2 MB for a 60–94-layer model although its layers form a handful of groups. Here ``reasons`` is the
    table of distinct reasons (``{text, kind, source, issue, confidence}``, in order of first use) and everything
    else refers to it by index: each group (the layers that share one decision, with that decision, its shape and
    quant once), each rejected backend, each warning. The plan-level fields are explain/1's."""
    table: dict[Reason, int] = {}

    def ref(reasons: Sequence[Reason]) -> list[int]:
        return [table.setdefault(r, len(table)) for r in reasons]

    groups = []
    for g in plan.groups():
        d = g[0]
        entry = {k: v for k, v in layer_entry(d).items()
                 if k not in ("index", "reasons", "reason_details", "rejected")}
        entry = {"layers": [x.layer.index for x in g], **entry, "reasons": ref(d.reasons),
                 "rejected": [{"backend": r.backend, "supported": r.supported, "reasons": ref(r.reasons),
                               **({"cost": [c.to_dict() for c in r.cost]} if r.cost else {})} for r in d.rejected],
                 "warnings": ref(d.warnings)}
        if plan.what_if_for(g):
            entry["what_if"] = ref(plan.what_if_for(g))
        groups.append(entry)
    full = plan_to_json(plan)
    warnings = ref(plan.warnings)
    out = {"schema": BRIEF_SCHEMA, **{k: full[k] for k in ("model", "target", "parallel")},
           "groups": groups, **_runtime_entries(plan), "warnings": warnings,
           **{k: full[k] for k in ("padded_bytes", "fingerprint", "decision_fingerprint", "aiter_data")}}
    out["reasons"] = [r.to_dict() for r in table]
    return out


def aiter_data(plan: Plan) -> list[dict[str, Any]]:
    """Which AITER tuned rows and dispatch rules the plan's simulated dispatch read (one entry per distinct source;
    empty when no layer was planned through AITER's dispatch)."""
    seen: dict[str, dict[str, Any]] = {}
    for d in plan.decisions:
        if d.dispatch is not None:
            used = d.dispatch.data_used()
            seen.setdefault(json.dumps(used, sort_keys=True), used)
    return list(seen.values())




def cost_total(plan: Plan) -> tuple[Any, ...]:
    """The model's MoE time per token count (sum over MoE layers), or ``()`` when some MoE layer has no prediction."""
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    if not moe or any(not d.cost for d in moe):
        return ()
    return total(d.cost for d in moe)


def _runtime_entries(plan: Plan) -> dict[str, Any]:
    if plan.runtime is None:
        return {}
    return {"tokens": list(plan.runtime.tokens), "aiter_env": dict(plan.runtime.env),
            "cost_total": [c.to_dict(with_basis=False) for c in cost_total(plan)]}


def group_entry(group: Sequence[Decision]) -> dict[str, Any]:
    """The JSON ``groups`` entry: the layers that share one decision, and that decision's headline fields."""
    d = group[0]
    return {"layers": [g.layer.index for g in group], "kind": d.layer.kind, "backend": d.backend,
            "padding": d.padding.to_dict() if d.layer.kind == "moe" else None,
            "warnings": texts(d.warnings)}


def layer_span(indices: Sequence[int]) -> str:
    """``layer 3`` / ``layers 3–59`` / ``layers 1,3,…,47`` (an arithmetic progression) / ``layers 0–2, 7, 9``."""
    idx = list(indices)
    if len(idx) == 1:
        return f"layer {idx[0]}"
    step = idx[1] - idx[0]
    if len(idx) > 3 and step > 1 and all(b - a == step for a, b in zip(idx, idx[1:])):
        return f"layers {idx[0]},{idx[1]},…,{idx[-1]}"
    return f"layers {_ranges(idx)}"


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


