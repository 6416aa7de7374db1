"""``aiter-triton``: AITER's Triton MXFP4 MoE GEMMs (``aiter.ops.triton.moe.moe_op_gemm_a16w4`` / ``_a8w4``).

Not reached through ``aiter.fused_moe``: vLLM calls the Triton GEMMs itself (``AiterW4A16ExpertsMonolithic``, backend
``AITER_TRITON_MXFP4_BF16``; ``AiterW4A8ExpertsMonolithic`` for W4A8), with AITER's routing. Facts:

- ``moe_gemm_a16w4`` (bf16 activations × MXFP4 weights, fused SwiGLU) since ROCm/aiter#2770 (first tag v0.1.14);
  read at ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/ops/triton/moe/moe_op_gemm_a16w4.py.
- vllm-project/vllm#50622 split it out of ``AITER_MXFP4_BF16`` as its own backend, "available on gfx942 / gfx950 /
  gfx1250" and auto-selected for gpt-oss where CK is unavailable, i.e. the default for a16w4 on gfx942 (gpt-oss-120b
  GSM8K 0.903 vs Triton ~0.906 at TP1).
- vllm-project/vllm#55934: on MI300X at TP8, gpt-oss-120b GSM8K 0.925 (``aiter_triton_mxfp4_bf16``) vs 0.920
  (``triton``), about 2× the output throughput (c1 264 vs 133 tok/s).
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.kit.rules import Combo, RuleBackend

_AH = "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879"
_V = "vllm-project/vllm@017e9f4448"
_A16W4 = (f"{_AH}:aiter/ops/triton/moe/moe_op_gemm_a16w4.py (moe_gemm_a16w4, apply_swiglu); ROCm/aiter#2770; "
          "gfx942/gfx950: vllm-project/vllm#50622; parity and ~2x Triton throughput on MI300X: "
          "vllm-project/vllm#55934")
_A8W4 = (f"{_AH}:aiter/ops/triton/moe/moe_op_gemm_a8w4.py; "
         f"{_V}:vllm/model_executor/layers/fused_moe/experts/aiter_mxfp4_w4a8_moe.py (AiterW4A8ExpertsMonolithic, "
         "on_gfx950() or on_gfx1250())")
_ROUND_UP = f"{_V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py (ROCm MXFP4 round-up 256/256)"
#: The first AITER tag that ships moe_gemm_a16w4 (ROCm/aiter#2770, commit dde1703ebf, 2026-04-27).
MIN_AITER = "0.1.14"

COMBOS = (
    Combo("mxfp4", "bf16", ("gfx942", "gfx950"), "AITER Triton moe_gemm_a16w4 (W4A16)", f"{_A16W4}; {_ROUND_UP}",
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp4", "fp8", ("gfx950",), "AITER Triton moe_gemm_a8w4 (W4A8)", f"{_A8W4}; {_ROUND_UP}",
          hidden_multiple=256, inter_multiple=256),
)


class AiterTriton(RuleBackend):
    name = "aiter-triton"
    # Between aiter-asm (50) and triton (40): an AITER path vLLM auto-selects over Triton where CK has no kernel
    # (vllm-project/vllm#50622), at GSM8K parity and ~2x Triton's throughput (vllm-project/vllm#55934).
    preference = 45
    family = "aiter-triton"
    requires_aiter = True
    min_cdna = 3
    arch_source = f"{_V}:vllm/_aiter_ops.py (is_aiter_found_and_supported: CDNA >= 3)"
    # The GEMM takes no pad arguments: it computes over the zero-filled round-up (SwiGLU of a zero gate/up is 0).
    pad_semantics = "compute"
    description = "AITER Triton MXFP4 MoE GEMMs (moe_gemm_a16w4 / moe_gemm_a8w4), called by vLLM directly"
    combos = COMBOS
    activations = {
        "swigluoai": "moe_gemm_a16w4(apply_swiglu=True, swiglu_add_residual=True): gpt-oss SwiGLU",
    }
    activation_hint = (
        "AITER's Triton MXFP4 MoE GEMMs fuse only gpt-oss's SwiGLU (apply_swiglu, swiglu_add_residual); vLLM "
        "auto-selects them for gpt-oss", _A16W4)
    bias_supported = True
    bias_source = f"{_AH}:aiter/ops/triton/moe/moe_op_gemm_a16w4.py (bias argument)"

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        failures: list[Reason | str] = []
        if caps.aiter_version is not None and not caps.aiter_at_least(MIN_AITER):
            failures.append(Reason(f"AITER Triton moe_gemm_a16w4 needs AITER >= {MIN_AITER} (ROCm/aiter#2770); target "
                                   f"AITER is {caps.aiter_version}", "failed", "ROCm/aiter#2770"))
        if layer.ep > 1:
            failures.append(Reason(
                f"expert parallelism (ep={layer.ep}) not supported: vLLM's AITER Triton monolithic experts take no "
                "all-to-all, no EPLB and dp_size <= 1", "failed",
                f"{_V}:vllm/model_executor/layers/fused_moe/experts/aiter_mxfp4_w4a8_moe.py", confidence="derived"))
        return failures

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        if not padding.padded:
            return 0, 0, []
        return 0, 0, [Reason("kernel pads 0: moe_gemm_a16w4 takes no pad arguments and computes over the "
                             "zero-filled round-up (zero gate and up give a zero SwiGLU output)", "padding",
                             _A16W4, confidence="derived")]


@hookimpl
def register_backends():
    return [AiterTriton()]
