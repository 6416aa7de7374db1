"""One table per backend family: what it supports and the specific reason when it does not, each row with its source.

Layers are built directly (hidden, intermediate per rank at TP1, quant, activation, bias); targets are simulated from
capability_db. Expected reasons are substrings of the rule or known-issue text that must name the cause.
"""

from __future__ import annotations

import dataclasses

import pytest

from moedispatch.core.reason import texts
from moedispatch.data.capdb import target_capabilities
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.selector.plugins import build_registry

BACKENDS = {b.name: b for b in build_registry().backends}
FP8_BLOCK = QuantSpec("fp8", "block128x128", scale_dtype="fp32", fmt="e4m3fn")
FP8_GROUP = QuantSpec("fp8", "group128", scale_dtype="fp32", dynamic=True, fmt="e4m3fn")
FP8_TENSOR = QuantSpec("fp8", "tensor", scale_dtype="fp32", fmt="e4m3fn")
FP8_TOKEN = QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True, fmt="e4m3fn")
SWIGLU = {"alpha": 1.702, "limit": 7.0}


def L(weight="bf16", act="bf16", *, hidden=4096, inter=1536, activation="silu", bias=False, params=None,
      model_type=""):
    return MoELayer.build(hidden=hidden, intermediate=inter, experts=8, top_k=2, weight=weight, act=act,
                          activation=activation, activation_params=params or {}, has_bias=bias,
                          model_type=model_type)


def run(family, layer, target, aiter="0.1.15.post3", **caps_over):
    caps = dataclasses.replace(target_capabilities(target, aiter), **caps_over) if caps_over \
        else target_capabilities(target, aiter)
    return BACKENDS[family].check(layer, caps)


# (family, layer, target, aiter, supported, reason substring, source)
ROWS = [
    # aiter-ck — classic CK 2-stage
    ("aiter-ck", L(), "gfx942", "0.1.15.post3", True, "a16w16", "aiter_sglang.md §2.1 (a16w16 on 942/950)"),
    ("aiter-ck", L(FP8_TENSOR, FP8_TOKEN), "gfx950", "0.1.15.post3", True, "a8w8", "aiter_sglang.md §2.1 per_Token"),
    ("aiter-ck", L(FP8_BLOCK, FP8_GROUP), "gfx942", "0.1.15.post3", True, "blkscale", "aiter_sglang.md §3.3"),
    ("aiter-ck", L(QuantSpec("int4", "channel"), FP8_TOKEN), "gfx942", "0.1.15.post3", True, "a8w4",
     "aiter_sglang.md §2.1 per_Token fp8 × int4 (gfx942)"),
    ("aiter-ck", L(QuantSpec("int4", "channel"), FP8_TOKEN), "gfx950", "0.1.15.post3", False, "needs gfx942",
     "aiter_sglang.md §2.1: a8w4 MulABScaleWint4 is gfx942 only"),
    ("aiter-ck", L("mxfp4", "mxfp4"), "gfx950", "0.1.15.post3", True, "a4w4", "aiter_sglang.md §2.1 a4w4"),
    ("aiter-ck", L("mxfp4", "mxfp4"), "gfx942", "0.1.15.post3", False, "no MX/FP4 scaled-MFMA",
     "aiter_sglang.md §2.1 (MXFP4 fails on gfx942); models_hw.md §B.2"),
    ("aiter-ck", L("mxfp4", "bf16"), "gfx950", "0.1.15.post3", False, "no aiter-ck kernel for weights mxfp4 × "
     "activations bf16", "aiter_sglang.md §2.1: a16w4 is CK-Tile/FlyDSL only"),
    ("aiter-ck", L(activation="swigluoai", params=SWIGLU), "gfx950", "0.1.15.post3", False, "silu and gelu only",
     "aiter_sglang.md §3.3 kernel names _silu/_gelu"),
    ("aiter-ck", L(activation="gelu"), "gfx942", "0.1.15.post3", True, "a16w16", "CK kernel names _gelu"),
    ("aiter-ck", L(bias=True), "gfx942", "0.1.15.post3", False, "bias", "ck_moe_stage1/2 take no bias [D]"),
    ("aiter-ck", L(), "gfx90a", "0.1.15.post3", False, "CDNA3", "vllm.md §1.1: CDNA >= 3, gfx90a excluded"),
    ("aiter-ck", L(), "gfx942", "none", False, "not available", "vllm.md §9: AITER must be importable"),
    # aiter-asm — ASM 1-stage
    ("aiter-asm", L(FP8_TENSOR, FP8_TOKEN), "gfx942", "0.1.15.post3", True, "pertokenFp8", "aiter_sglang.md §3.1"),
    ("aiter-asm", L(FP8_TENSOR, FP8_TOKEN), "gfx950", "0.1.15.post3", False, "needs gfx942",
     "aiter_sglang.md §3.1: pertokenFp8 subGU table listed for gfx942"),
    ("aiter-asm", L(FP8_BLOCK, FP8_GROUP), "gfx950", "0.1.15.post3", True, "blockscaleFp8", "aiter_sglang.md §3.1"),
    ("aiter-asm", L("mxfp4", "mxfp4"), "gfx950", "0.1.15.post3", True, "pertokenMXfp4", "aiter_sglang.md §3.1"),
    ("aiter-asm", L(), "gfx942", "0.1.15.post3", False, "no aiter-asm kernel", "g1u0 bf16 asm is ungated only"),
    # aiter-cktile — CK-Tile
    ("aiter-cktile", L("mxfp4", "bf16", activation="swigluoai", params=SWIGLU, bias=True), "gfx950", "0.1.15.post3",
     True, "a16w4", "aiter_sglang.md §3.4 a16w4 (+bias)"),
    ("aiter-cktile", L("mxfp4", FP8_TENSOR), "gfx950", "0.1.15.post3", True, "a8w4", "aiter_sglang.md §3.4"),
    ("aiter-cktile", L("mxfp4", "mxfp4"), "gfx950", "0.1.15.post3", False, "bf16 or fp8 activations",
     "aiter_sglang.md §3.4: inputs fp8×pk_fp4 / bf16×pk_fp4 only"),
    ("aiter-cktile", L(FP8_BLOCK, FP8_GROUP), "gfx950", "0.1.15.post3", False, "no aiter-cktile kernel",
     "aiter_sglang.md §3.4"),
    ("aiter-cktile", L("mxfp4", "bf16"), "gfx950", "0.1.10", False, ">= 0.1.12", "ROCm/aiter PR #2642"),
    # aiter-flydsl — FlyDSL
    ("aiter-flydsl", L("mxfp4", "mxfp4", activation="swigluoai_uninterleave", params=SWIGLU,
                       model_type="minimax_m3_vl"), "gfx950", "0.1.15.post3", True, "a4w4",
     "vLLM PR #46419 (MiniMax-M3-MXFP4 on AITER)"),
    ("aiter-flydsl", L("mxfp4", "mxfp4", activation="swigluoai_uninterleave", params=SWIGLU), "gfx950",
     "0.1.13.post1", False, "gate_mode", "ROCm/aiter#3123 (>= 0.1.14)"),
    ("aiter-flydsl", L("mxfp4", "mxfp4", activation="swigluoai", params={"alpha": 1.702, "limit": 10.0}), "gfx950",
     "0.1.14", False, "swiglu_limit", "aiter_sglang.md §4.1: swiglu_limit new after 0.1.13.post1"),
    ("aiter-flydsl", L("int4", "bf16"), "gfx950", "0.1.15.post3", False, "no aiter-flydsl kernel",
     "a16wi4 needs group-32 int4 weights (Kimi-K2 style), per-channel int4 has no FlyDSL path"),
    ("aiter-flydsl", L(QuantSpec("int4", "group32"), "bf16"), "gfx950", "0.1.15.post3", True, "a16wi4",
     "aiter_sglang.md §2.1 a16wi4"),
    ("aiter-flydsl", L("mxfp8", "mxfp8"), "gfx950", "0.1.15.post3", False, ">= 0.1.16.post1",
     "vllm-project/vllm@017e9f4448:vllm/model_executor/layers/fused_moe/experts/aiter_mxfp8_moe.py; ROCm/aiter#3811"),
    ("aiter-flydsl", L("mxfp4", "bf16"), "gfx942", "0.1.15.post3", False, "needs gfx950",
     "aiter_sglang.md §3.5: gfx942 FlyDSL fp4 only in open PRs #3926/#5583"),
    # triton
    ("triton", L(), "gfx90a", "none", True, "Triton bf16", "vllm.md §1.7"),
    ("triton", L(FP8_TENSOR, FP8_TOKEN), "gfx90a", "none", False, "needs gfx1201 or gfx942 or gfx950",
     "supports_fp8(): gfx94/gfx95/gfx12 (models_hw.md §B.2)"),
    ("triton", L("mxfp4", "bf16", activation="swigluoai", params=SWIGLU, bias=True), "gfx942", "none", True,
     "triton_kernels", "vllm.md §1.5, §4 (W4A16 on gfx942 -> TRITON)"),
    ("triton", L("mxfp4", "mxfp4"), "gfx950", "none", False, "[vllm#46142]",
     "vLLM #46142, PR #46419"),
    ("triton", L("mxfp4", FP8_TENSOR), "gfx950", "none", False, "route to aiter-flydsl",
     "vllm.md §1.2 (AITER_MXFP4_FP8)"),
    ("triton", L("mxfp8", "mxfp8"), "gfx950", "none", True, "dot_scaled", "vllm.md §1.4, §7"),
    ("triton", L("mxfp8", "mxfp8"), "gfx942", "none", False, "needs gfx950", "vllm.md §7: gfx942 -> EMULATION"),
    # aiter-triton — AITER's Triton MXFP4 MoE GEMMs (moe_gemm_a16w4 / a8w4), vLLM's gfx942 default for gpt-oss
    ("aiter-triton", L("mxfp4", "bf16", activation="swigluoai", params=SWIGLU, bias=True), "gfx942", "0.1.15.post3",
     True, "moe_gemm_a16w4", "vllm-project/vllm#50622; vllm-project/vllm#55934"),
    ("aiter-triton", L("mxfp4", "bf16", activation="swigluoai", params=SWIGLU), "gfx942", "0.1.13.post1", False,
     "needs AITER >= 0.1.14", "ROCm/aiter#2770 (first tag v0.1.14)"),
    ("aiter-triton", L("mxfp4", "mxfp4"), "gfx950", "0.1.15.post3", False, "no aiter-triton kernel", "W4A16/W4A8 only"),
    ("aiter-triton", L("mxfp4", "bf16", activation="silu"), "gfx950", "0.1.15.post3", False,
     "activation silu not supported", "apply_swiglu is gpt-oss's SwiGLU only"),
    # emulation
    ("emulation", L("mxfp4", "mxfp4"), "gfx942", "none", True, "slow reference path", "vllm.md §14; vLLM #50817"),
    ("emulation", L(QuantSpec("mxfp6", "group32", scale_dtype="e8m0", fmt="e3m2"), "bf16"), "gfx90a", "none", True,
     "quantize-dequantize", "vllm.md §4: MXFP6 schemes force EMULATION"),
]


@pytest.mark.parametrize("family,layer,target,aiter,supported,needle,source", ROWS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_family_table(family, layer, target, aiter, supported, needle, source):
    verdict = run(family, layer, target, aiter)
    assert verdict.supported is supported, (source, verdict.reasons)
    assert any(needle in r for r in texts(verdict.reasons)), (source, needle, verdict.reasons)


def test_every_family_has_rows():
    assert {r[0] for r in ROWS} == set(BACKENDS)


def test_flydsl_pin_mismatch_takes_every_aiter_family_down():
    """An older flydsl than AITER pins breaks `import aiter.fused_moe` (aiter_sglang.md §3.5, §8.3)."""
    layer = L("mxfp4", "mxfp4")
    bad = run("aiter-ck", layer, "gfx950", "0.1.15.post3", packages=(("flydsl", "0.1.7"),))
    assert not bad.supported and any("does not satisfy AITER 0.1.15.post3's pin flydsl==0.1.9.dev599" in r
                                     for r in texts(bad.reasons))
    assert run("aiter-ck", layer, "gfx950", "0.1.15.post3", packages=(("flydsl", "0.1.9.dev599"),)).supported
