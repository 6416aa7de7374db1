"""AITER's activation-dtype policy (``_fused_moe_impl``): the dtype the activations are quantised to for ``M``
tokens under a release's rules — the 0.1.7 rule, the Swiglu-MXFP4 bound of v0.1.9–v0.1.13.x, and HEAD's SEPARATED /
INTERLEAVE / SiTUv2 / MXFP8 / a16wi4 / gfx1250 rules — with the reason, for the plan's notes; and which of the
policy's variables act under a call shape (:func:`acting_env`: a bound AITER does not read for this gate/up layout is
never offered as a workaround)."""

from __future__ import annotations

from typing import Mapping

from moedispatch.aiter.env import _env_int
from moedispatch.aiter.key import DispatchKey
from moedispatch.aiter.rules import Rules, lookup_rules
from moedispatch.aiter.vocab import BF16, FP4, FP8, FP8_FNUZ, I4, Q_1X32, SITUV2, SWIGLU, U32, _fp8


def activation_dtype(M: int, key: DispatchKey, env: Mapping[str, str] | None = None,
                     model: "str | Rules" = "head") -> tuple[str, str]:
    """(q_dtype_a, why) — ``_fused_moe_impl``'s activation dtype for ``M`` tokens under a release's rules."""
    env = env or {}
    rules = lookup_rules(model)
    if rules.act_policy == "v017":
        if key.q_type == Q_1X32:
            return FP4, f"per_1x32 quantizes activations to fp4x2 ({rules.name})"
        return (_fp8(key.gfx) if key.q_dtype_w == U32 else key.q_dtype_w), \
            f"activations take the weight dtype ({rules.name})"
    if rules.act_policy == "swiglu512" and key.q_type == Q_1X32:
        if key.q_dtype_w == I4 and rules.a16wi4:
            return BF16, "a16wi4: int4 weights run with bf16 activations"
        if key.act_type == SWIGLU:
            bound = _env_int(env, rules.bound_env, rules.bound_default) if rules.bound_env else rules.bound_default
            if key.gfx != "gfx950" or M < bound:
                return BF16, f"Swiglu MXFP4: bf16 below {rules.bound_env or 'the bound'}={bound} or off gfx950 " \
                             f"({rules.name}, M={M})"
            return FP8, f"Swiglu MXFP4 on gfx950: fp8 from {rules.bound_env or 'the bound'}={bound} ({rules.name})"
        return FP4, f"per_1x32: fp4x2 activations ({rules.name})"
    # dtypes.fp8 is per-arch (aiter/utility/dtypes.py get_dtype_fp8: e4m3fnuz on gfx942): fused_moe.py line 759
    fp8 = _fp8(key.gfx)
    q_a = fp8 if key.q_dtype_w == U32 else key.q_dtype_w
    why = "activations take the weight dtype"
    if key.q_type == Q_1X32:
        if key.q_dtype_w == I4 and rules.a16wi4:
            return BF16, "a16wi4: int4 weights run with bf16 activations"
        if key.q_dtype_w == fp8 and rules.mxfp8:
            return fp8, "mxfp8: fp8 activations with per-1x32 e8m0 scales"
        if key.act_type == SITUV2 and rules.situv2_act_first:
            if env.get("AITER_SITUV2_A8W4", "0") == "1":
                return fp8, "SiTUv2 with AITER_SITUV2_A8W4=1"
            if env.get("AITER_SITUV2_A4W4", "0") == "1":
                return FP4, "SiTUv2 with AITER_SITUV2_A4W4=1"
            return BF16, "SiTUv2 defaults to a16w4 (bf16 activations)"
        if key.act_type == SWIGLU and key.gate_mode == "separated":
            bound = _env_int(env, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND", 256)
            if M < bound:
                return BF16, f"Swiglu SEPARATED: bf16 below GPTOSS_SWIGLU_MXFP4_BF16_BOUND={bound} (M={M})"
            return FP4, f"Swiglu SEPARATED: fp4x2 from GPTOSS_SWIGLU_MXFP4_BF16_BOUND={bound} (M={M})"
        if key.act_type == SWIGLU or key.gate_mode == "interleave":
            bound = _env_int(env, "AITER_BF16_FP8_MOE_BOUND", 256)
            if key.gfx != "gfx950" or M < bound:
                return BF16, (f"Swiglu/INTERLEAVE: bf16 below AITER_BF16_FP8_MOE_BOUND={bound} (M={M})"
                              if key.gfx == "gfx950" else "Swiglu/INTERLEAVE: bf16 off gfx950")
            return FP8, f"Swiglu/INTERLEAVE on gfx950: fp8 from AITER_BF16_FP8_MOE_BOUND={bound} (M={M})"
        if key.act_type == SITUV2:
            # v0.1.19: SiTUv2 reaches its own branch only SEPARATED; no AITER_SITUV2_A4W4 (Rules.situv2_act_first).
            if env.get("AITER_SITUV2_A8W4", "0") == "1":
                return fp8, "SiTUv2 SEPARATED with AITER_SITUV2_A8W4=1"
            return BF16, "SiTUv2 SEPARATED: a16w4 (bf16 activations)"
        if key.q_dtype_w in (FP8, FP8_FNUZ):
            return FP4, (f"per_1x32 {key.q_dtype_w} weights are not {key.gfx}'s dtypes.fp8 ({fp8}): AITER takes the "
                         "generic per_1x32 branch (fp4x2 activations)")
        return FP4, "per_1x32: fp4x2 activations"
    if key.gfx == "gfx1250" and rules.gfx1250_act:
        return (FP8 if env.get("AITER_FORCE_A8W4", "0") == "1" else FP4), "gfx1250 forces fp4/fp8 activations"
    return q_a, why


#: Activation-policy variables and the call shape under which AITER reads them (fused_moe.py _fused_moe_impl: the
#: SEPARATED Swiglu branch reads GPTOSS_SWIGLU_MXFP4_BF16_BOUND, the Swiglu-or-INTERLEAVE branch after it
#: AITER_BF16_FP8_MOE_BOUND); see :func:`activation_dtype`.
_ACTS_UNDER = {
    "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": lambda key: key.act_type == SWIGLU and key.gate_mode == "separated",
    "AITER_BF16_FP8_MOE_BOUND": lambda key: not (key.act_type == SWIGLU and key.gate_mode == "separated")
    and (key.act_type == SWIGLU or key.gate_mode == "interleave"),
}


def acting_env(env: tuple[tuple[str, str], ...], key: DispatchKey) -> tuple[tuple[str, str], ...]:
    """The workaround variables that act under this call shape (an activation-policy bound AITER does not read for
    this gate/up layout is a no-op: never exported as a fix)."""
    return tuple((k, v) for k, v in env if k not in _ACTS_UNDER or _ACTS_UNDER[k](key))
