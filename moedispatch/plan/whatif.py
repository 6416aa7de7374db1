"""What-if: per layer group, the cheapest change that unlocks a faster correct path, with its predicted gain; and the
tuning work-list (the shapes AITER runs on heuristics, in AITER's untuned-CSV format).

Changes are tried cheapest first — an AITER environment switch, then a newer AITER release — by re-planning the
layer with the selector itself (so the alternative is as correct as the plan) and comparing predicted times at the
largest planned token count. Off explain's default path: ``moedispatch explain --what-if`` / ``--tuning-list``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from moedispatch.core.errors import UsageError
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import QuantSpec
from moedispatch.core.reason import Reason
from moedispatch.core.families import FUSED_MOE_FAMILIES
from moedispatch.cost.model import padding_overhead
from moedispatch.cost.worklist import UNTUNED_COLUMNS, tuning_worklist, untuned_csv
from moedispatch.core.costs import format_cost
from moedispatch.data import aiter_configs, capdb
from moedispatch.selector.pure import select
from moedispatch.selector.runtime import dispatch_for
from moedispatch.core.workload import Runtime

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Backend
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.decision import Decision
    from moedispatch.core.layers import MoELayer
    from moedispatch.plan.plan import Plan

__all__ = ["what_if", "plan_what_if", "tuning_list", "switch_variants", "MIN_GAIN"]

#: A change is worth naming when it saves at least this share of the layer's predicted time.
MIN_GAIN = 0.05

_FM = "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py"
#: Environment switches that change what AITER runs (cheapest changes: no new software), with their source.
_SWITCHES: tuple[tuple[tuple[tuple[str, str], ...], str, str], ...] = (
    ((("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0"),),
     "keep MXFP4 activations at every batch size (AITER's Swiglu policy otherwise runs bf16 below 256 tokens)",
     f"{_FM} (fused_moe_)"),
    ((("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "1"),),
     "fold the shared expert into the routed AITER call (the key AITER's model rows are tuned for)",
     "https://github.com/vllm-project/vllm/pull/46474"),
    ((("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0"), ("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "1")),
     "MXFP4 activations at every batch size and the shared expert folded into the routed call",
     f"{_FM} (fused_moe_); https://github.com/vllm-project/vllm/pull/46474"),
)


def numerics_change(layer: "MoELayer", caps: "Capabilities", padding: Any, tokens: Sequence[int],
                    env: dict[str, str], before: dict[str, str]) -> str | None:
    """What running under ``env`` instead of ``before`` changes numerically for the layer: the activation dtype AITER
    quantizes to, per token count (the dispatch model's activation policy, fused_moe.py ``_fused_moe_impl``), with the
    accuracy caveat; None when it changes none. One home for recipes' switches and --what-if's."""
    def dtypes(e: dict[str, str]) -> dict[int, str]:
        dp = dispatch_for(layer, caps, padding, Runtime(tokens=tuple(tokens), env=tuple(sorted(e.items()))))
        return {t: s.activation_dtype for s in dp.steps for t in tokens if s.tokens[0] <= t <= s.tokens[1]}

    on, off = dtypes(env), dtypes(before)
    changed: dict[tuple[str | None, str | None], list[int]] = {}
    for t in tokens:
        if on.get(t) != off.get(t):
            changed.setdefault((off.get(t), on.get(t)), []).append(t)
    if not changed:
        return None
    parts = [f"at {_tok_range(ts[0], ts[-1])} AITER runs {new} activations instead of {old}"
             for (old, new), ts in changed.items()]
    return ("changes numerics: " + "; ".join(parts) + f" (layer {layer.index}'s call shape). No published "
            "accuracy evaluation of this switch is known to moedispatch: check accuracy (e.g. GSM8K) before serving")


def _tok_range(lo: int, hi: int) -> str:
    return "token 1" if lo == hi == 1 else f"tokens {lo}" if lo == hi else f"tokens {lo}–{hi}"


def switch_variants(runtime: "Runtime") -> list[tuple[tuple[tuple[str, str], ...], str, str, "Runtime"]]:
    """``[(switch, why, source, runtime with the switch)]`` for each AITER switch not already set in ``runtime``,
    cheapest first — shared by --what-if and by recipes that need the engine's allocation to be native."""
    env = runtime.env_dict
    return [(switch, why, source, Runtime(runtime.tokens, tuple(sorted({**env, **dict(switch)}.items()))))
            for switch, why, source in _SWITCHES if not all(env.get(k) == v for k, v in switch)]


def _us(decision: "Decision") -> float | None:
    return decision.cost[-1].us if decision.cost else None


def _padding_text(d: "Decision") -> str:
    p, layer = d.padding, d.layer
    if not p.padded:
        return f"{d.backend} runs hidden {layer.hidden} × intermediate/rank {layer.intermediate_per_rank} unpadded"
    return f"{d.backend} with intermediate/rank {layer.intermediate_per_rank}→{p.intermediate_per_rank}"


def what_if(decision: "Decision", caps: "Capabilities", backends: Sequence["Backend"],
            runtime: "Runtime") -> tuple[Reason, ...]:
    """For one planned MoE decision: what its padding costs, and the cheapest change that makes the layer faster
    (correct by the same rules), as Reasons of kind ``note``."""
    out: list[Reason] = []
    layer, tokens = decision.layer, max(runtime.tokens)
    if decision.backend is None or layer.kind != "moe":
        return ()
    if decision.padding.padded:
        over = padding_overhead(layer, caps, backend_family=decision.backend, padding=decision.padding,
                                tokens=(tokens,))
        if over and over[0][1] > 0.005:
            out.append(Reason(f"what-if: the pad {layer.intermediate_per_rank}→{decision.padding.intermediate_per_rank}"
                              f" (intermediate/rank) costs +{over[0][1]:.0%} at {tokens} tokens (roofline estimate)",
                              "note", confidence="derived"))
    base = _us(decision)
    if base is None:
        return tuple(out)
    trials: list[tuple[str, str, Runtime, Any]] = []
    if decision.family in FUSED_MOE_FAMILIES:
        for switch, why, source, variant in switch_variants(runtime):
            trials.append((f"set {' '.join(f'{k}={v}' for k, v in switch)} ({why})", source, variant, caps))
    newest = capdb.default_aiter_version()
    if caps.aiter_version and caps.aiter_version != newest and caps.gfx:
        try:
            newer = capdb.target_capabilities(capdb.target_spec(caps) or caps.gfx, newest)
        except UsageError:  # a target the DB cannot rebuild at the newest AITER: no upgrade what-if
            newer = None
        if newer is not None:
            trials.append((f"upgrade AITER {caps.aiter_version} → {newest}", "https://github.com/ROCm/aiter/tags",
                           runtime, newer))
    for change, source, variant, target in trials:
        try:
            alt = select(layer, target, backends, runtime=variant)
        except NoBackendError:
            continue
        alt_us = _us(alt)
        if alt_us is None or alt_us >= base * (1 - MIN_GAIN):
            continue
        numerics = numerics_change(layer, caps, alt.padding, runtime.tokens, variant.env_dict, runtime.env_dict) \
            if variant is not runtime else None   # a switch that changes activations carries recipes' caveat
        out.append(Reason(
            f"what-if: {change}: {_padding_text(alt)}, {format_cost(alt.cost[-1])} vs {format_cost(decision.cost[-1])} "
            f"at {tokens} tokens ({alt_us / base - 1:+.0%})" + (f"; {numerics}" if numerics else ""), "note", source,
            None, "derived"))
        break  # the cheapest change that helps
    else:
        if decision.backend == "emulation":  # no switch or release helps: say what would run natively instead
            out += _native_alternatives(decision, caps, backends, runtime)
    return tuple(out)


#: Checkpoint formats tried for a layer that only emulation runs, most compact first: FP8 with 128×128 weight blocks
#: and dynamic per-token-group activations (DeepSeek-V3's and Qwen3-FP8's published quantization_config:
#: huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json "weight_block_size": [128, 128]), then BF16.
_CHECKPOINTS: tuple[tuple[str, QuantSpec, QuantSpec], ...] = (
    ("an FP8 checkpoint (128×128 weight blocks)", QuantSpec("fp8", "block128x128"),
     QuantSpec("fp8", "group128", dynamic=True)),
    ("a BF16 checkpoint", QuantSpec("bf16"), QuantSpec("bf16")),
)


def _native(layer: "MoELayer", target: "Capabilities", backends: Sequence["Backend"],
            runtime: "Runtime") -> "Decision | None":
    try:
        alt = select(layer, target, backends, runtime=runtime)
    except NoBackendError:
        return None
    return alt if alt.backend not in (None, "emulation") and alt.cost else None


def _source_of(alt: "Decision") -> str | None:
    return next((r.source for r in alt.reasons if r.source), None)


def _native_alternatives(decision: "Decision", caps: "Capabilities", backends: Sequence["Backend"],
                         runtime: "Runtime") -> list[Reason]:
    """For a layer only emulation runs (newcomer minor 3): the nearest target that runs the same checkpoint natively
    (newest AITER, newest arch first), and the first other checkpoint format that runs natively on this target —
    each re-planned by the selector, so the alternative is as correct as the plan."""
    out: list[Reason] = []
    layer, tokens, base = decision.layer, max(runtime.tokens), decision.cost[-1]
    here = capdb.target_label(caps)

    def versus(alt: "Decision") -> str:
        return (f"{alt.backend}, {format_cost(alt.cost[-1])} vs {format_cost(base)} on emulation at {tokens} tokens "
                f"({alt.cost[-1].us / base.us - 1:+.0%})")

    archs = capdb.gpus()["arch"]
    for gfx in sorted(archs, key=lambda g: -archs[g]["cdna"]):
        if gfx == caps.gfx or archs[gfx]["cdna"] < 1:
            continue
        product = archs[gfx]["products"][0]["name"]
        alt = _native(layer, capdb.target_capabilities(product), backends, runtime)
        if alt is not None:
            out.append(Reason(f"what-if: this checkpoint on {gfx} ({product}) with AITER "
                              f"{capdb.default_aiter_version()}: {versus(alt)}", "note", _source_of(alt), None,
                              "derived"))
            break
    for label, weight, act in _CHECKPOINTS:
        if (layer.weight.dtype, layer.act.dtype) == (weight.dtype, act.dtype):
            continue
        alt = _native(replace(layer, weight=weight, act=act), caps, backends, runtime)
        if alt is not None:
            out.append(Reason(f"what-if: {label} of {layer.model or 'this model'} on {here} (other weights: check "
                              f"its accuracy): {versus(alt)}", "note", _source_of(alt), None, "derived"))
            break
    return out


def plan_what_if(plan: "Plan", backends: Sequence["Backend"]) -> tuple[tuple[int, tuple[Reason, ...]], ...]:
    """``((first layer of the group, what-if reasons), …)`` for every MoE group of a plan made with a Runtime."""
    if plan.runtime is None:
        return ()
    out = []
    for group in plan.groups():
        d = group[0]
        if d.layer.kind == "moe" and d.backend is not None:
            reasons = what_if(d, plan.caps, backends, plan.runtime)
            if reasons:
                out.append((d.layer.index, reasons))
    return tuple(out)


def tuning_list(plan: "Plan") -> tuple[str, int]:
    """(AITER untuned-CSV text, number of shapes): the model's shapes that fall to AITER heuristics, highest
    predicted time × layers first (what tuning could save)."""
    entries = [(g[0].dispatch, g[0].cost, len(g)) for g in plan.groups() if g[0].dispatch is not None and g[0].cost]
    rows = [r for r in tuning_worklist(entries) if not _tuned_already(plan, r)]
    return untuned_csv(rows), len(rows)


def _tuned_already(plan: "Plan", row: dict[str, Any]) -> bool:
    """The tuned set AITER reads already has a row of this key and bucket: AITER looks it up but the path runs its
    heuristics anyway (Swiglu MXFP4 bf16 on CK-Tile ignores the row's kernel names), so tuning it again — AITER's
    tuner skips a shape its tuned CSV has — changes nothing; it is not an untuned shape."""
    env = plan.runtime.env_dict if plan.runtime is not None else {}
    cs = aiter_configs.config_set_for(plan.caps, env, model_dims=frozenset({row["model_dim"]}))
    return bool(aiter_configs.tuned_rows(config_set=cs, gfx=row["gfx"], cu_num=row["cu_num"],
                                         **{c: row[c] for c in UNTUNED_COLUMNS}))
