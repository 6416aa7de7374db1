"""``aiter-cktile``: AITER CK-Tile 2-stage MoE (``moe_cktile2stages_gemm1/2``) via ``aiter.fused_moe``.

Facts: ROCm/aiter csrc/ck_tile_gemm_moe_2stages, aiter/fused_moe.py cktile_moe_stage1/2 at v0.1.15.post3. Inputs are only fp8×pk_fp4 and bf16×pk_fp4 with bf16 output.
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.kit.rules import Combo

from moedispatch_plugins._aiter import A3, V, AiterFamily

_FILES = f"{A3}:aiter/fused_moe.py (cktile_moe_stage1/2); {A3}:csrc/ck_tile_gemm_moe_2stages"
_SRC = (f"{_FILES}: inputs fp8×pk_fp4 / bf16×pk_fp4, bf16 out; 256 = vLLM's ROCm MXFP4 round-up "
        f"({V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py)")
_GFX950 = ("gfx950",)

COMBOS = (
    Combo("mxfp4", "bf16", _GFX950, "CK-Tile a16w4", _SRC, feature="cktile_mxfp4", hidden_multiple=256,
          inter_multiple=256),
    Combo("mxfp4", "fp8", _GFX950, "CK-Tile a8w4 (cktile_a8w4_*)", _SRC, feature="cktile_mxfp4",
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp4", "mxfp8", _GFX950, "CK-Tile a8w4 (MXFP8 activations)", _SRC, feature="cktile_mxfp4",
          hidden_multiple=256, inter_multiple=256),
)


class AiterCKTile(AiterFamily):
    name = "aiter-cktile"
    preference = 60
    family = "cktile"
    pad_semantics = "skip"  # n_pad_zeros / k_pad_zeros granules are skipped
    description = "AITER CK-Tile 2-stage fused MoE (MXFP4 weights; bf16 or fp8 activations)"
    combos = COMBOS
    activations = {
        "silu": "a4w4/a16w4 Silu (ROCm/aiter#3741)",
        "swigluoai": "a16w4 gpt-oss Swiglu (+bias)",
        "swigluoai_uninterleave": "Swiglu with GateMode.SEPARATED (aiter#3123)",
    }
    bias_supported = True

    def scheme_failure(self, layer: MoELayer, caps: Capabilities) -> Reason | None:
        if layer.weight.dtype == "mxfp4" and layer.act.dtype in ("mxfp4", "mxfp6"):
            return Reason(f"CK-Tile takes bf16 or fp8 activations with fp4 weights (inputs fp8×pk_fp4, bf16×pk_fp4): "
                          f"it would not apply the checkpoint's {layer.act.dtype.upper()} activation QDQ", "failed",
                          _FILES)
        return None

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        notes: list[Reason | str] = []
        if padding.padded:
            notes.append(Reason(
                "kernel pads = the real pads: AITER turns them into whole skipped granules itself (stage 1 "
                "n_pad_zeros = intermediate_pad//64*64*2, k_pad_zeros = hidden_pad//128*128; stage 2 "
                "n_pad_zeros = hidden_pad//64*64, k_pad_zeros = intermediate_pad//128*128). Do not pre-round or "
                "double them (GSM8K 0.896 -> 0.684)", "padding",
                f"{A3}:aiter/fused_moe.py (cktile_moe_stage1/2); vllm-project/vllm#44679; vllm-project/vllm#46201"))
        return padding.hidden_pad, padding.intermediate_pad, notes


@hookimpl
def register_backends():
    return [AiterCKTile()]
