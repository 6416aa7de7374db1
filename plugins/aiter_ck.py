"""``aiter-ck``: AITER classic CK 2-stage MoE (``ck_moe_stage1/2``, ``moe_ck2stages_*``) via ``aiter.fused_moe``.

Facts: ROCm/aiter csrc/ck_gemm_moe_2stages_codegen (gen_instances.py, gemm_moe_ck2stages_common.cuh) at
v0.1.15.post3; tile-divisibility crashes ROCm/aiter#5413, #5444; vLLM PR #55368.
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.kit.rules import Combo

from moedispatch_plugins._aiter import A3, AH, V, AiterFamily

_TILES = (f"{A3}:csrc/ck_gemm_moe_2stages_codegen/gen_instances.py (heuristic tiles); "
          f"{A3}:csrc/ck_gemm_moe_2stages_codegen/gemm_moe_ck2stages_common.cuh; ROCm/aiter#5413; ROCm/aiter#5444")


def _bf16_inter(inter: int, gfx: str | None) -> int:
    # Stage-1 N tile 64 when inter_dim <= 192 else 128; inter must divide by it (vLLM PR #55368; ROCm/aiter#5444).
    return 64 if inter <= 192 else 128


def _a8w8_inter(inter: int, gfx: str | None) -> int:
    # gfx950 fp8 stage-2 K tile is 256 for block_m 32/64 (KPerBlock=64 instances commented out: "gfx950 fp8 mfma
    # instruction limitation"); gfx942 follows the bf16 rule (derived: the "minimum safe alignment"). The fp8
    # per-tensor inter_dim 192 that has no stage-2 instance on MI300X either is a known issue (ROCm/aiter#3202 in
    # capability_db/known_issues.toml, padded to 256), not a wider alignment for every fp8 scheme.
    if gfx == "gfx950":
        return 256
    return 64 if inter <= 192 else 128


_BOTH = ("gfx942", "gfx950")
#: CK plain-fp8 SwiGLU-OAI (gpt-oss form): ROCm/aiter#3886, commit 78e45124a0, first tag v0.1.19.post1 (not in v0.1.19).
SWIGLU_SINCE = "0.1.19.post1"
_SWIGLU_SRC = ("ROCm/aiter#3886; ROCm/aiter@v0.1.20:csrc/ck_gemm_moe_2stages_codegen/gen_instances.py (swiglu x "
               "plain-f8 per_tensor / per_token instances)")

COMBOS = (
    Combo("bf16", "bf16", _BOTH, "CK 2-stage a16w16", _TILES, hidden_multiple=64, inter_multiple=_bf16_inter),
    Combo("fp16", "fp16", _BOTH, "CK 2-stage a16w16", _TILES, hidden_multiple=64, inter_multiple=_bf16_inter),
    Combo("fp8", "fp8", _BOTH, "CK 2-stage a8w8 (per-tensor Quant1 / per-token)", _TILES,
          weight_granularity=("tensor", "channel"), act_granularity=("tensor", "token"),
          hidden_multiple=128, inter_multiple=_a8w8_inter),
    Combo("fp8", "fp8", _BOTH, "CK 2-stage a8w8blkscale (per_1x128)", _TILES,
          weight_granularity=("block128x128",), act_granularity=("group128", "token"),
          hidden_multiple=128, inter_multiple=128),
    Combo("int8", "int8", _BOTH, "CK 2-stage a8w8 int8", _TILES, weight_granularity=("tensor", "channel"),
          hidden_multiple=128, inter_multiple=_a8w8_inter),
    Combo("int4", "fp8", ("gfx942",), "CK 2-stage a8w4 (MulABScaleWint4)", _TILES,
          hidden_multiple=128, inter_multiple=128),
    Combo("mxfp4", "mxfp4", ("gfx950",), "CK 2-stage a4w4 (per_1x32 fp4x2, preshuffled)",
          f"{_TILES}; 256 = vLLM's ROCm MXFP4 round-up ({V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py) "
          "and the gfx950 fp4 tile_k 256", feature="mxfp4_moe", hidden_multiple=256, inter_multiple=256),
)


class AiterCK(AiterFamily):
    name = "aiter-ck"
    preference = 80
    family = "ck"
    description = "AITER classic CK 2-stage fused MoE (aiter.fused_moe -> ck_moe_stage1/2)"
    combos = COMBOS
    activations = {
        "silu": "CK kernel names ..._silu",
        "gelu": "CK kernel names ..._gelu",
        "swigluoai": "CK plain-fp8 (per_tensor / per_token) swiglu_oai instances (ROCm/aiter#3886, >= 0.1.19.post1)",
    }
    bias_supported = False
    bias_source = (f"{A3}:aiter/fused_moe.py: ck_moe_stage1/2 take no bias tensors; bias is a CK-Tile (fp32) / FlyDSL "
                   "input")
    bias_confidence = "derived"
    # Say where the activation does run, so the reason is actionable.
    activation_hint = (
        "CK 2-stage kernels implement silu and gelu (kernel names ..._silu/_gelu; swiglu_oai only for plain fp8 from "
        "0.1.19.post1, ROCm/aiter#3886); AITER routes Swiglu MXFP4 to "
        "FlyDSL / CK-Tile ('SwiGLU MXFP4 ... not supported by CK2stages codegen; routing to CK-Tile (ROCM-25478)')",
        f"{A3}:csrc/ck_gemm_moe_2stages_codegen/gen_instances.py; {AH}:aiter/fused_moe.py")

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        failures = super().extra_checks(layer, caps, combo)
        if layer.activation == "swigluoai":
            plain_fp8 = (layer.weight.dtype == "fp8" and layer.act.dtype == "fp8"
                         and layer.weight.granularity in ("tensor", "channel")
                         and layer.act.granularity in ("tensor", "token"))
            if not plain_fp8:
                failures.append(Reason(
                    f"CK 2-stage kernels for {layer.weight.describe()} × {layer.act.describe()} implement silu and gelu "
                    "only; CK's swiglu_oai instances exist only for plain fp8 (per_tensor / per_token)", "failed",
                    _SWIGLU_SRC))
            elif caps.aiter_version is not None and not caps.aiter_at_least(SWIGLU_SINCE):
                failures.append(Reason(
                    f"CK fp8 swiglu_oai needs AITER >= {SWIGLU_SINCE} (ROCm/aiter#3886); target AITER is "
                    f"{caps.aiter_version}", "failed", _SWIGLU_SRC))
        return failures

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        notes: list[Reason | str] = []
        if padding.padded:
            notes.append(Reason(
                "kernel pads 0: classic CK ignores hidden_pad/intermediate_pad and computes over the zero-filled "
                "padded extent; passing 0 also keeps a pad-skipping family correct if AITER's dispatcher picks one "
                "instead", "padding", "ROCm/aiter#5413"))
        return 0, 0, notes


@hookimpl
def register_backends():
    return [AiterCK()]
