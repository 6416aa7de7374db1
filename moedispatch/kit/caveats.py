"""Layer-level caveats of the TP sharding itself, independent of the backend (kind ``caveat``).

The planner pads the *allocation*; it cannot re-block scales that a loader slices. These caveats are attached to
every MoE decision of the layer and travel into the plan's warnings.
"""

from __future__ import annotations

from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.core.costs import format_cost

__all__ = ["shard_caveats", "pad_ratio_caveat", "ep_alternative_layer", "SCALE_TILES", "SCALE_GROUPS", "PAD_RATIO",
           "PAD_RATIO_MIN"]

#: ``Reason.issue`` tags of the caveats (stable ids: consumers filter on them).
SCALE_TILES = "scale-tiles"
SCALE_GROUPS = "scale-groups"
PAD_RATIO = "pad-ratio"

#: A planned allocation at least this many times the per-rank intermediate shard is called out (``pad ratio``):
#: from 4× on, three quarters or more of every expert's weights, weight reads and GEMM work are zero pad.
PAD_RATIO_MIN = 4

_VLLM_FP8 = ("vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/fp8.py (refine_fp8_moe_block_shape, "
             "pad_tp_shard_to_weight_blocks); vllm-project/vllm@v0.33.0:vllm/model_executor/layers/quantization/utils/"
             "fp8_utils.py (validate_fp8_block_shape_moe)")
_SGLANG_PAD = "https://github.com/sgl-project/sglang/pull/18684; https://github.com/sgl-project/sglang/pull/21097"
_VLLM_GPTOSS = "https://github.com/vllm-project/vllm/blob/017e9f4448/vllm/model_executor/models/gpt_oss.py"


def shard_caveats(layer: MoELayer) -> tuple[Reason, ...]:
    """A TP shard that splits the checkpoint's block-FP8 scale tiles or MX scale groups."""
    out = []
    block = layer.weight.block
    if block and layer.moe_tp > 1 and (layer.intermediate_per_rank % block[0] or layer.intermediate_per_rank % block[1]):
        import math

        g = math.gcd(block[0], layer.intermediate_per_rank, layer.hidden)
        if g < 32:
            vllm = (f"vLLM 0.33 refuses this shape at weight creation (no scale block of at least 32 divides the shard "
                    f"and hidden: gcd = {g})")
        else:
            vllm = (f"vLLM 0.33 refines the scale blocks to {g} and then only its Triton MoE takes them: "
                    f"VLLM_ROCM_USE_AITER=1 with --moe-backend auto raises, and --moe-backend aiter pads the shard to "
                    f"{block[0]} (only when the global dims are {block[0]}-aligned)")
        text = (f"caveat [scale tiles]: the TP shard {layer.intermediate_per_rank} of intermediate {layer.intermediate} "
                f"splits the checkpoint's {block[0]}×{block[1]} scale tiles. {vllm}; SGLang accepts the shape on "
                f"AITER with 128-padding (GSM8K 0.980 for Qwen3-235B-FP8 at TP8)")
        if layer.intermediate % block[0] == 0:
            text += (f". Safer: expert parallelism (--ep {layer.tp}) keeps every expert whole ({layer.intermediate} = "
                     f"{layer.intermediate // block[0]}×{block[0]})")
        out.append(Reason(text, "caveat", f"{_VLLM_FP8}; {_SGLANG_PAD}", SCALE_TILES))
    if layer.weight.is_mx and layer.moe_tp > 1 and layer.intermediate_per_rank % 32:
        out.append(Reason(
            f"caveat [scale groups]: the TP shard {layer.intermediate_per_rank} of intermediate {layer.intermediate} "
            f"is not a multiple of the 32-element MX scale group, so an even split cuts E8M0 groups of w2; the loader "
            f"must shard in whole groups (vLLM's gpt_oss.py slices cdiv(I/32, tp)*32 per rank) or use expert "
            f"parallelism", "caveat", _VLLM_GPTOSS, SCALE_GROUPS, "confirmed"))
    return tuple(out)


def ep_alternative_layer(layer: MoELayer) -> MoELayer | None:
    """The same layer under expert parallelism over the TP ranks (``--ep tp``: vLLM's ``--enable-expert-parallel``
    sets the MoE TP to 1, :func:`moedispatch.core.layers.moe_tp_size`): each rank holds whole experts. ``None`` when the
    layer is not TP-sharded or its experts do not divide over the ranks."""
    import dataclasses

    if layer.kind != "moe" or layer.moe_tp <= 1 or layer.experts % layer.tp:
        return None
    return dataclasses.replace(layer, ep=layer.tp, intermediate_per_rank=layer.intermediate,
                               experts_per_rank=layer.experts // layer.tp)


def pad_ratio_caveat(decision, extra_bytes: int = 0, alternative=None) -> Reason | None:
    """A planned intermediate allocation of at least :data:`PAD_RATIO_MIN` × the TP shard (GLM-5 2048 at TP64:
    32/rank padded to 256 = 8×): the pad, what share of the expert weights and GEMM work it is, its bytes, and —
    when ``alternative`` (the selector's decision for :func:`ep_alternative_layer`) runs unpadded or with less pad —
    expert parallelism. The source is the chosen backend's own alignment rule (why the shard is padded that far)."""
    layer, padding = decision.layer, decision.padding
    if layer.kind != "moe" or decision.backend is None or layer.intermediate_per_rank <= 0:
        return None
    shard, alloc = layer.intermediate_per_rank, padding.intermediate_per_rank
    if alloc < PAD_RATIO_MIN * shard:
        return None
    rule = next((r for r in decision.reasons if r.kind == "padding" and r.source), None)
    ratio = alloc / shard
    text = (f"caveat [pad ratio]: {decision.backend} pads intermediate/rank {shard}→{alloc} ({ratio:g}× the shard of "
            f"{layer.intermediate} at MoE TP {layer.moe_tp}): {1 - shard / alloc:.1%} of every expert's w13/w2 "
            f"weights, weight reads and GEMM work is zero pad")
    if extra_bytes:
        text += f" (+{extra_bytes / 2**20:,.1f} MiB/rank per layer)"
    if alternative is not None and alternative.backend is not None:
        alt_pad = alternative.padding.intermediate_per_rank / alternative.layer.intermediate_per_rank
        if alt_pad < ratio:
            what = ("unpadded" if not alternative.padding.padded
                    else f"intermediate {alternative.layer.intermediate_per_rank}→{alternative.padding.intermediate_per_rank}")
            text += (f". Expert parallelism (--ep {layer.tp}) keeps every expert whole: {alternative.layer.experts_per_rank} "
                     f"experts × intermediate {alternative.layer.intermediate} per rank on {alternative.backend}, {what}")
            if decision.cost and alternative.cost:
                pairs = [(a, b) for a, b in zip(decision.cost, alternative.cost) if a.tokens == b.tokens]
                picks = [pairs[0], pairs[-1]] if len(pairs) > 1 else pairs
                text += " (predicted per layer " + "; ".join(
                    f"{format_cost(b)} vs {format_cost(a)} at {a.tokens} token{'s' if a.tokens != 1 else ''}"
                    for a, b in picks) + ")"
    return Reason(text, "caveat", rule.source if rule else None, PAD_RATIO, "derived")
