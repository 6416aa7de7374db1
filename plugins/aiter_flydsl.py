"""``aiter-flydsl``: AITER FlyDSL 2-stage MoE (``flydsl_moe1/2_*``) via ``aiter.fused_moe``.

Facts: ROCm/aiter aiter/ops/flydsl/moe_kernels.py, kernels/mixed_moe_gemm_2stage.py, fused_moe.py
_get_padding_for_flydsl at v0.1.15.post3.
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.backend import Padding
from moedispatch.capabilities import Capabilities
from moedispatch.layers import MoELayer
from moedispatch.reason import Reason
from moedispatch.rules import Combo, need_feature

from moedispatch_plugins._aiter import A3, V, AiterFamily, swiglu_decode_note, tuned_coverage_note

_KERNELS = f"{A3}:aiter/ops/flydsl/kernels/mixed_moe_gemm_2stage.py; {A3}:aiter/ops/flydsl/moe_kernels.py"
_SRC = (f"{_KERNELS} (fp4 kernels use gfx950 scaled MFMA; stage-1/2 tile_k 256 for fp4); hidden/inter rounded to "
        f"256 as vLLM/SGLang do for AITER MXFP4 ({V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py)")
_GFX950 = ("gfx950",)

COMBOS = (
    Combo("mxfp4", "mxfp4", _GFX950, "FlyDSL a4w4 (flydsl_moe*_afp4_wfp4_*)", _SRC, feature="flydsl_moe",
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp4", "bf16", _GFX950, "FlyDSL a16w4", _SRC, feature="flydsl_moe", hidden_multiple=256,
          inter_multiple=256),
    Combo("mxfp4", "fp8", _GFX950, "FlyDSL a8w4 (flydsl_moe*_afp8_wfp4_*)", _SRC, feature="flydsl_moe",
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp4", "mxfp8", _GFX950, "FlyDSL a8w4 (MXFP8 activations)", _SRC, feature="mxfp8_act_quant_sort",
          hidden_multiple=256, inter_multiple=256),
    Combo("int4", "bf16", _GFX950, "FlyDSL a16wi4 (flydsl_moe*_abf16_wint4_*, the only a16wi4 path)",
          f"{_KERNELS} (tuned for gfx950; receives no pads)", weight_granularity=("group32",),
          feature="flydsl_moe", hidden_multiple=128, inter_multiple=128),
    Combo("mxfp8", "mxfp8", _GFX950, "FlyDSL MXFP8 MoE (vLLM AiterMxfp8Experts)",
          f"{V}:vllm/model_executor/layers/fused_moe/experts/aiter_mxfp8_moe.py", feature="flydsl_mxfp8_moe",
          hidden_multiple=256,
          inter_multiple=256),
)


class AiterFlyDSL(AiterFamily):
    name = "aiter-flydsl"
    preference = 70
    family = "flydsl"
    description = "AITER FlyDSL 2-stage fused MoE (MXFP4/MXFP8 weights, gfx950)"
    combos = COMBOS
    activations = {
        "silu": "FlyDSL MoE Silu",
        "swigluoai": "FlyDSL Swiglu fp4 heuristics (aiter/fused_moe.py get_2stage_cfgs)",
        "swigluoai_uninterleave": "Swiglu with GateMode.SEPARATED (aiter#3123)",
    }
    bias_supported = True
    pad_semantics = "skip"

    def pad_semantics_for(self, layer: MoELayer, caps: Capabilities, kernel_hidden_pad: int,
                          kernel_intermediate_pad: int) -> str:
        # FlyDSL skips the padded sub-tiles it is told about; with no pad forwarded (AITER < 0.1.15, a bias under the
        # 0.1.15.post3 guard, or the PR #3538 workaround) it computes over the whole zero-filled extent.
        return "skip" if kernel_hidden_pad or kernel_intermediate_pad else "compute"

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        failures = super().extra_checks(layer, caps, combo)
        flydsl = caps.package("flydsl")
        if caps.aiter_version is not None and caps.source_of("packages") and flydsl is None:
            failures.append(Reason("the flydsl package is not installed: AITER uses flydsl_fallback rows or "
                                   "heuristics instead", "failed",
                                   f"{A3}:aiter/fused_moe.py (get_2stage_cfgs); {A3}:aiter/ops/flydsl/__init__.py"))
        return failures

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason | str]:
        return [*swiglu_decode_note(layer, combo), *tuned_coverage_note(caps)]

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        if not padding.padded:
            return 0, 0, []
        if need_feature(caps, "flydsl_pads", "FlyDSL pads") is not None:
            return 0, 0, [Reason(f"kernel pads 0: AITER {caps.aiter_version} never forwards pads to FlyDSL (pads "
                                 "reach it from 0.1.15); it computes over the zero-filled extent", "padding",
                                 "ROCm/aiter#3184")]
        if layer.has_bias and caps.has_feature("flydsl_pad_bias_guard"):
            return 0, 0, [Reason("kernel pads 0: with a bias AITER >= 0.1.15.post3 turns FlyDSL pad-skipping off "
                                 "(_get_padding_for_flydsl returns (0, 0))", "padding",
                                 f"{A3}:aiter/fused_moe.py (_get_padding_for_flydsl); ROCm/aiter#3401")]
        return padding.hidden_pad, padding.intermediate_pad, [Reason(
            "FlyDSL receives inter_dim_pad/model_dim_pad and skips whole padded sub-tiles", "padding",
            f"{A3}:aiter/fused_moe.py (_get_padding_for_flydsl); {_KERNELS}")]


@hookimpl
def register_backends():
    return [AiterFlyDSL()]
