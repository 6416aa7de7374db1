"""AITER's hard-coded fallbacks when no tuned row decides (``aiter/fused_moe.py``): the 1-stage ASM tables
(``fused_moe_1stage_dict`` at HEAD and in the 0.1.7 wheel) and the op ``fused_moe_1stage`` calls,
``get_block_size_M``, ``get_ksplit``, the tier block_m, how a stage-2 name is launched, and the a16w4 SiTUv2 guard.
Pure functions of the key, token bucket and environment."""

from __future__ import annotations

from typing import Mapping

from moedispatch.aiter.env import _env_int
from moedispatch.aiter.key import Assumptions, DispatchKey
from moedispatch.aiter.vocab import (BF16, FP4, FP8, FP8_FNUZ, FP16, GELU, I4, I8, Q_1X32, Q_1X128, Q_NO, Q_TOKEN,
                                     SILU, SITUV2)


#: fused_moe_1stage_dict (HEAD): (activation, q_type, dtype, q_dtype_a, q_dtype_w, use_g1u1, doweight_stage1) -> API.
_ONE_STAGE_HEAD: dict[str, dict[tuple, str]] = {
    "gfx942": {
        (SILU, Q_NO, BF16, BF16, BF16, 0, 0): "fmoe",
        (SILU, Q_NO, FP16, FP16, FP16, 0, 0): "fmoe",
        (GELU, Q_TOKEN, BF16, FP8_FNUZ, I4, 1, 0): "fmoe_g1u1",
        (SILU, Q_1X32, BF16, FP4, FP4, 1, 0): "fmoe_g1u1",
        (SILU, Q_TOKEN, BF16, I8, I8, 1, 0): "fmoe_g1u1",
        (GELU, Q_TOKEN, BF16, I8, I8, 1, 0): "fmoe_g1u1",
        (SILU, Q_TOKEN, BF16, FP8_FNUZ, FP8_FNUZ, 1, 0): "fmoe_g1u1",
        (GELU, Q_TOKEN, BF16, FP8_FNUZ, FP8_FNUZ, 1, 0): "fmoe_g1u1",
        (SILU, Q_1X128, BF16, FP8_FNUZ, FP8_FNUZ, 1, 0): "fmoe_g1u1",
        (SILU, Q_TOKEN, BF16, I8, I8, 0, 0): "fmoe_int8_g1u0",
        (GELU, Q_TOKEN, BF16, I8, I8, 0, 0): "fmoe_int8_g1u0",
    },
    "gfx950": {
        (SILU, Q_1X32, BF16, FP4, FP4, 1, 0): "fmoe_g1u1",
        (SILU, Q_1X128, BF16, FP8, FP8, 1, 0): "fmoe_fp8_blockscale_g1u1",
        (GELU, Q_1X128, BF16, FP8, FP8, 1, 0): "fmoe_fp8_blockscale_g1u1",
        (SILU, Q_TOKEN, BF16, BF16, BF16, 0, 0): "fmoe",
        (SILU, Q_TOKEN, BF16, FP8, FP8, 1, 1): "fmoe_g1u1_tkw1",
        (SILU, Q_TOKEN, BF16, FP8, FP8, 1, 0): "fmoe_g1u1",
        (GELU, Q_TOKEN, BF16, FP8, FP8, 1, 0): "fmoe_g1u1",
    },
}
#: fused_moe_1stage_dict in amd-aiter 0.1.7.post2.dev18 (no doweight_stage1 column).
_ONE_STAGE_LEGACY: dict[str, dict[tuple, str]] = {
    "gfx942": {k[:6]: v for k, v in _ONE_STAGE_HEAD["gfx942"].items()},
    "gfx950": {(SILU, Q_1X32, BF16, FP4, FP4, 1): "fmoe_g1u1", (SILU, Q_1X128, BF16, FP8, FP8, 1):
               "fmoe_fp8_blockscale_g1u1"},
}


def _block_size_M(token: int, topk: int, expert: int, inter_dim: int, cu_num: int) -> int:
    """``get_block_size_M``: the block_m in {32, 64, 128} with the fewest waves over the CUs, then least idle."""
    tg_n = (inter_dim + 127) // 128
    options = []
    for el in (32, 64, 128):
        max_tokens = token * topk + expert * el - topk
        tg = tg_n * (max_tokens + el - 1) // el
        options.append((((tg + cu_num - 1) // cu_num), cu_num - tg % cu_num, el))
    return min(options, key=lambda x: x[:2])[-1]


def _ksplit(token: int, topk: int, expert: int, inter_dim: int, model_dim: int, cu_num: int,
            env: Mapping[str, str]) -> int:
    """``get_ksplit`` (only for per_1x128/per_1x32 decode where the grid underfills the GPU)."""
    forced = _env_int(env, "AITER_KSPLIT", 0)
    if forced:
        return forced
    if token * topk > expert:
        return 0
    tg = ((inter_dim + 127) // 128) * token * topk
    if tg >= cu_num:
        return 0
    for i in range((cu_num + tg - 1) // tg, 1, -1):
        if model_dim % i == 0 and (model_dim // i) % 256 == 0:
            return i
    return 0


def _tier_block_m(token: int) -> int:
    return 16 if token < 2048 else 32 if token < 16384 else 64


def _situv2_a16w4_refusal(key: DispatchKey, q_a: str, a: Assumptions) -> str | None:
    """``_fused_moe_impl``'s guard for a16w4 SiTUv2 (bf16 activations × MXFP4 weights): the NotImplementedError it
    raises before any lookup, or None (ROCm/aiter@e4048607:aiter/fused_moe.py lines 854-880)."""
    if not (key.q_type == Q_1X32 and key.q_dtype_w == FP4 and q_a == BF16 and key.act_type == SITUV2):
        return None
    fly = a.flydsl_available
    for bad, why in (
        (key.gfx not in ("gfx942", "gfx950") or not fly,
         f"requires the FlyDSL kernel on CDNA gfx942/gfx950 (gfx={key.gfx!r}, flydsl_available={fly})"),
        (key.has_bias, "per-expert bias"),
        (key.is_ep, "expert-parallel masking"),
        (not (a.weights_shuffled and key.use_g1u1 and not key.doweight_stage1),
         "non-preshuffled / non-g1u1 weights or doweight_stage1=True"),
    ):
        if bad:
            return f"NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 is not supported: {why}."
    return None


def _one_stage_op(key: DispatchKey, *, tkw1: bool = True) -> str:
    """The ASM op ``fused_moe_1stage`` calls — chosen from the quant type, not from ``fused_moe_1stage_dict``'s value
    (ROCm/aiter@e4048607:aiter/fused_moe.py lines 1094-1188; amd-aiter 0.1.7.post2.dev18 aiter/fused_moe.py lines
    313-400, which has no tkw1 branch: ``tkw1=False``)."""
    if key.q_type == Q_NO and key.act_type == SILU and not key.use_g1u1:
        return "fmoe"
    if tkw1 and key.q_type == Q_TOKEN and key.doweight_stage1 and key.use_g1u1:
        return "fmoe_g1u1_tkw1"
    if key.q_type == Q_1X128:
        return "fmoe_fp8_blockscale_g1u1"
    return "fmoe_g1u1" if key.use_g1u1 else "fmoe_int8_g1u0"


def _stage2_name(kn2: str) -> tuple[str, list[str]]:
    """A tuned row's stage-2 name as AITER launches it: a ``cktile_*`` name is not passed to ``cktile_moe_stage2``
    (it builds the partial without kernelName), so CK-Tile picks its own instance."""
    if kn2.startswith("cktile_"):
        return "cktile_moe_stage2 (default)", [f"the row's stage-2 name {kn2} is not passed to cktile_moe_stage2 "
                                               "(CK-Tile picks its instance)"]
    return kn2, []
