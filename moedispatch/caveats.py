"""Layer-level caveats of the TP sharding itself, independent of the backend (kind ``caveat``).

The planner pads the *allocation*; it cannot re-block scales that a loader slices. These caveats are attached to
every MoE decision of the layer and travel into the plan's warnings.
"""

from __future__ import annotations

from moedispatch.layers import MoELayer
from moedispatch.reason import Reason

__all__ = ["shard_caveats", "SCALE_TILES", "SCALE_GROUPS"]

#: ``Reason.issue`` tags of the two caveats (stable ids: consumers filter on them).
SCALE_TILES = "scale-tiles"
SCALE_GROUPS = "scale-groups"

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
