"""``triton``: Triton fused MoE as engines run it on ROCm without AITER.

vLLM ``TritonExperts`` (bf16/fp16, fp8 w8a8, int8 w8a8, int4/int8 weight-only), OAI ``triton_kernels`` MXFP4
W4A16 (``OAITritonExperts``, ``on_gfx9() or on_gfx1x()``), and ``TRITON_MXFP8`` native ``dot_scaled`` on gfx950,
read in vLLM main 017e9f4448. Padding follows ``K = w.shape - pad``.
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.kit.rules import Combo, RuleBackend

_V = "vllm-project/vllm@017e9f4448"
_FM = f"{_V}:vllm/model_executor/layers/fused_moe"

_CDNA = ("gfx90a", "gfx942", "gfx950")
_ALL = _CDNA + ("gfx1100", "gfx1201")
_FP8 = ("gfx942", "gfx950", "gfx1201")  # supports_fp8(): gfx94/gfx95/gfx12 (vllm/platforms/rocm.py)
_TE = f"{_FM}/fused_moe.py (TritonExperts)"
_MX4 = (f"{_FM}/experts/gpt_oss_triton_kernels_moe.py (OAI triton_kernels MXFP4 W4A16); ROCm MXFP4 round-up 256/256: "
        f"{_FM}/oracle/mxfp4.py (mxfp4_round_up_hidden_size_and_intermediate_size)")

COMBOS = (
    Combo("bf16", "bf16", _ALL, "Triton bf16", _TE),
    Combo("fp16", "fp16", _ALL, "Triton fp16", _TE),
    Combo("fp8", "fp8", _FP8, "Triton fp8 w8a8",
          _TE + f"; fp8 needs gfx94x/gfx95x/gfx12: {_V}:vllm/platforms/rocm.py (supports_fp8)"),
    Combo("int8", "int8", _ALL, "Triton int8 w8a8", _TE),
    Combo("int8", "bf16", _ALL, "Triton int8 weight-only (int_wna16)", _TE),
    Combo("int4", "bf16", _ALL, "Triton int4 weight-only (int_wna16)", _TE),
    Combo("mxfp4", "bf16", _CDNA + ("gfx1100", "gfx1201"), "OAI triton_kernels MXFP4 W4A16", _MX4,
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp8", "mxfp8", ("gfx950",), "Triton MXFP8 native dot_scaled (TRITON_MXFP8)",
          f"{_FM}/oracle/mxfp8.py (Mxfp8NativeTritonExperts, gfx950 only)", hidden_multiple=32, inter_multiple=32),
)


class Triton(RuleBackend):
    name = "triton"
    preference = 40
    family = "triton"
    pad_semantics = "trim"  # K = w.shape - pad: the pad is never read
    description = "Triton fused MoE (vLLM TritonExperts / OAI triton_kernels / native MXFP8 dot_scaled)"
    combos = COMBOS
    activations = {
        "silu": "TritonExperts", "gelu": "TritonExperts", "swigluoai": "OAI triton_kernels (gpt-oss)",
        "swigluoai_uninterleave": "TritonExperts SWIGLUOAI_UNINTERLEAVE",
    }
    bias_supported = True

    # Triton's MXFP4 MoE is W4A16: a checkpoint that quantizes activations is rejected through the known-issue table
    # (vllm#46142 in capability_db/known_issues.toml), not by a rule hard-coded here.


@hookimpl
def register_backends():
    return [Triton()]
