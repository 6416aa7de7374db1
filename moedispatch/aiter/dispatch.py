"""What AITER will actually run: an offline model of ``aiter.fused_moe``'s kernel dispatch, per token count.

AITER picks the kernel itself, at run time, in ``aiter/fused_moe.py`` ``get_2stage_cfgs``: an exact lookup in its
merged tuned CSVs keyed on (gfx, cu_num, padded token count, model_dim, inter_dim, expert, topk, activation, dtype,
q_dtype_a, q_dtype_w, q_type, use_g1u1, doweight_stage1), then the same lookup with the activation wildcarded, then
smaller token tiers, then hard-coded heuristics (the 1-stage ASM table, block_m, ksplit, FlyDSL/CK-Tile routing), all
under environment overrides. This module replays that logic in pure Python (no aiter, torch, numpy or pandas; the
CSVs are read lazily by :mod:`moedispatch.data.aiter_configs`).

The lookup is modelled per AITER release (:class:`Rules`, :func:`lookup_rules`), as ``aiter/fused_moe.py`` reads
at each tag: the token buckets (``get_padded_M`` changed at v0.1.8, v0.1.9, v0.1.12 and v0.1.14), whether the key
holds ``gfx`` (v0.1.16+), whether it holds ``str(activation)`` (exact act match: ≤ v0.1.13, v0.1.18 and v0.1.19) or
the pybind enum (no exact match: v0.1.14–v0.1.17, v0.1.19.post1+), the act wildcard (v0.1.14+), the EP top-k strip
(v0.1.16+) and the activation-dtype policy (bound 512 ≤ v0.1.13.post1 except v0.1.13's 256, 256 after;
SEPARATED/INTERLEAVE rules from v0.1.14; MXFP8 from v0.1.16.post1; SiTUv2 from v0.1.19). The heuristic fallbacks are
modelled twice: on HEAD —
https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py (``get_2stage_cfgs``,
``get_block_size_M``, ``get_ksplit``, ``fused_moe_1stage_dict``; used for every release ≥ 0.1.8), with each
release's differences from HEAD as :class:`Rules` fields read in each tag's ``aiter/fused_moe.py`` (the FlyDSL
heuristic's scope, MXFP8, the 1-stage table, ``use_cfg``, a16wi4, the pre-gate_mode CK-Tile routing, the
flydsl_fallback rows; checked against each release's own code by tests/peers/aiter) — and on the PyPI wheel amd-aiter
0.1.7.post2.dev18 (``aiter/fused_moe.py`` in the wheel). Tuned rows come from the installed AITER or the bundled
snapshot (:mod:`moedispatch.data.aiter_configs`).

Public API (all pure, frozen, cached where it matters)::

    from moedispatch.aiter.dispatch import simulate, plan_dispatch, native_inter_dims
    steps = simulate(layer, caps, tokens=(1, 4, 64, 512, 8192))      # tuple[DispatchStep, ...]
    [s.to_dict() for s in steps]     # the explain contract: {tokens, bucket, stages, family, kernels, block_m,
                                     #                        activation_dtype, basis, config}
    plan = plan_dispatch(layer, caps)  # DispatchPlan: steps + key + assumptions + env + warnings + known-issue hits
    native_inter_dims(layer, caps)     # inter_dim values with tuned rows for this layer's key (e.g. {384, 768})

Assumptions the lookup key depends on (engine choices) are explicit (:class:`Assumptions`) and printed with every
plan: a fused shared expert adds one expert and one top-k slot; expert parallelism makes AITER subtract one top-k
slot (it expects a fake slot the caller may not append, aiter#3999); the gate/up layout (``gate_mode``) changes the
activation dtype of Swiglu MXFP4 layers.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from moedispatch._util.caches import memoize
from moedispatch.data import aiter_configs as _cfg
from moedispatch.data.aiter_configs import ConfigSet, TunedRow
from moedispatch.core.errors import CapabilityDBError, UsageError
from moedispatch.data import capdb
from moedispatch.core.families import BACKEND_OF_FAMILY
from moedispatch.core.workload import DEFAULT_TOKENS, PADDED_M_TIERS, aiter_env

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Padding
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

__all__ = [
    "Assumptions",
    "DispatchKey",
    "DispatchStep",
    "DispatchPlan",
    "IssueHit",
    "DispatchIssue",
    "simulate",
    "plan_dispatch",
    "dispatch_key",
    "dispatch_token",
    "get_padded_M",
    "Rules",
    "lookup_rules",
    "activation_dtype",
    "kernel_family",
    "native_inter_dims",
    "dispatch_issues",
    "evaluate_issues",
    "pad_hazards",
    "tile_hazards",
    "tile_misfit",
    "fhmoe_supports",
    "fhmoe_lookup",
    "fhmoe_config_scope",
    "parse_info_line",
]

_H = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879"
SRC_FUSED_MOE = f"{_H}/aiter/fused_moe.py"


def _env_int(env: Mapping[str, str], key: str, default: int) -> int:
    """``int(os.environ.get(key, default))`` as AITER reads it; a value int() rejects raises UsageError (AITER itself
    raises ValueError there — never a silent default)."""
    try:
        return int(str(env.get(key, default)))
    except ValueError:
        raise UsageError(f"{key}={env.get(key)!r} is not an integer: AITER reads it with int() and raises "
                         f"ValueError ({SRC_FUSED_MOE})") from None


# -- dtype / quant vocabulary (the strings AITER's CSVs hold) ---------------------------------------------------

BF16, FP16 = "torch.bfloat16", "torch.float16"
FP8, FP8_FNUZ = "torch.float8_e4m3fn", "torch.float8_e4m3fnuz"
FP4, I8, I4, U32 = "torch.float4_e2m1fn_x2", "torch.int8", "torch.int4", "torch.uint32"
Q_NO, Q_TENSOR, Q_TOKEN = "QuantType.No", "QuantType.per_Tensor", "QuantType.per_Token"
Q_1X32, Q_1X128 = "QuantType.per_1x32", "QuantType.per_1x128"
SILU, GELU, SWIGLU, SITUV2 = ("ActivationType.Silu", "ActivationType.Gelu", "ActivationType.Swiglu",
                              "ActivationType.Situv2")
#: ``ActivationType`` values (csrc/include/aiter_enum.h).
_ACT_VALUE = {"No": -1, "Silu": 0, "Gelu": 1, "Swiglu": 2, "Situv2": 3}
_ACT = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU, "swigluoai": SWIGLU, "swigluoai_uninterleave": SWIGLU,
        "swiglu": SWIGLU, "situ": SITUV2, "situv2": SITUV2}


def _fp8(gfx: str | None) -> str:
    """``aiter.utility.dtypes.fp8``: e4m3fnuz on gfx942, e4m3fn on gfx950 and later."""
    return FP8_FNUZ if gfx == "gfx942" else FP8


def _label(torch_dtype: str, q_type: str) -> str:
    """A torch dtype string as the contract's activation label."""
    if torch_dtype in (BF16, FP16):
        return "bf16" if torch_dtype == BF16 else "fp16"
    if torch_dtype == FP4:
        return "mxfp4"
    if torch_dtype in (FP8, FP8_FNUZ):
        return "mxfp8" if q_type == Q_1X32 else "fp8"
    if torch_dtype == I8:
        return "int8"
    return torch_dtype.replace("torch.", "")


# -- assumptions and the lookup key ------------------------------------------------------------------------------

#: Why an a8w4 layer's gate/up layout is interleaved by default.
A8W4_LAYOUT_SOURCE = ("ROCm/aiter@v0.1.20.post1:aiter/configs/model_configs/dsv4_fp8fp4_tuned_fmoe.csv (every "
                      "flydsl_moe1_afp8_wfp4_* kernel is _gui_: gate/up interleaved; the same in kimik2/gptoss/kimik3 "
                      "a8w4 tables of every release); sgl-project/sglang@v0.5.23:python/sglang/srt/layers/moe/"
                      "moe_runner/aiter.py (GateMode.INTERLEAVE unless SGLANG_USE_AITER_MOE_GU_ITLV=0)")


def _a8w4(layer: "MoELayer") -> bool:
    """FP8 activations × MXFP4 weights: AITER's a8w4 kernels, whose weights are laid out gate/up interleaved."""
    return layer.weight.dtype == "mxfp4" and layer.act.dtype == "fp8"


@dataclass(frozen=True)
class Assumptions:
    """Engine choices the lookup key depends on. ``None`` fields are derived from the layer (see :meth:`resolve`).

    * ``fused_shared_expert``: the shared expert is folded into the routed call (vLLM
      ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1``; SGLang/ATOM for DeepSeek): +1 expert, +1 top-k slot.
      Default: off (vLLM's default).
    * ``ep_fake_slot``: under EP the caller appends one always-masked top-k slot, which AITER HEAD strips
      (``topk -= int(is_ep)``). vLLM's fused-shared-expert EP path appends it, its standard routing path does not
      (https://github.com/ROCm/aiter/issues/3999). Default: on only with a fused shared expert.
    * ``gate_mode``: ``separated`` or ``interleave`` gate/up layout passed to ``fused_moe(gate_mode=)``. Default:
      ``interleave`` for ``swigluoai`` (gpt-oss W4A16, vLLM ``shuffle_weight_a16w4(…, True)``) and for a8w4 (fp8
      activations × MXFP4 weights: every afp8_wfp4 stage-1 kernel in AITER's tuned CSVs of every release is ``_gui_``,
      gate/up interleaved, and SGLang passes ``GateMode.INTERLEAVE`` — :data:`A8W4_LAYOUT_SOURCE`), ``separated``
      otherwise (``swigluoai_uninterleave``: vLLM PR #46419).
    * ``flydsl_available``: ``aiter.ops.flydsl.utils.is_flydsl_available()`` on the target (default True: AITER
      pins flydsl).
    * ``weights_shuffled``: weights pre-shuffled (``is_shuffled``), as vLLM/SGLang do for AITER (default True).
    * ``doweight_stage1``: router weight applied before stage 1 (Llama-4 style ``apply_router_weight_on_input``).
    """

    fused_shared_expert: bool = False
    ep_fake_slot: bool | None = None
    gate_mode: str | None = None
    flydsl_available: bool = True
    weights_shuffled: bool = True
    doweight_stage1: bool | None = None
    out_dtype: str = BF16

    @classmethod
    def from_engine_env(cls, layer: "MoELayer", env: Mapping[str, str] | None = None, **overrides: Any
                        ) -> "Assumptions":
        """Assumptions an engine's environment implies: vLLM folds a model's shared expert into the routed AITER
        call when ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS`` is on (vllm-project/vllm PR #46474; the AMD
        MiniMax-M3 recipe sets it, vllm-project/recipes#581) and the layer has exactly one shared expert whose size
        matches the routed experts' — that is the (experts + 1, top-k + 1) key AITER's MiniMax-M3 and DeepSeek rows
        are tuned for."""
        env = dict(os.environ if env is None else env)
        flag = str(env.get("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "")).strip().lower() in ("1", "true", "yes")
        fused = flag and layer.shared_experts == 1 and layer.shared_intermediate in (0, layer.intermediate)
        return cls(fused_shared_expert=fused, **overrides)

    def resolve(self, layer: "MoELayer") -> "Assumptions":
        gate = self.gate_mode or ("interleave" if layer.activation == "swigluoai" or _a8w4(layer) else "separated")
        if gate not in ("separated", "interleave"):
            raise UsageError(f"gate_mode must be 'separated' or 'interleave', got {gate!r}")
        fake = self.ep_fake_slot if self.ep_fake_slot is not None else (self.fused_shared_expert and layer.ep > 1)
        doweight = self.doweight_stage1 if self.doweight_stage1 is not None else \
            layer.model_type.startswith("llama4")
        return replace(self, gate_mode=gate, ep_fake_slot=fake, doweight_stage1=doweight)

    def describe(self, layer: "MoELayer") -> tuple[str, ...]:
        a = self.resolve(layer)
        lines = [
            ("fused shared expert: +1 expert, +1 top-k slot" if a.fused_shared_expert
             else "shared expert not fused into the routed call (no extra expert or top-k slot)"),
            f"gate/up layout {a.gate_mode} (fused_moe(gate_mode=))",
        ]
        if layer.ep > 1:
            lines.append("EP: AITER looks up topk - 1 (it strips a fake slot); the caller "
                         + ("appends one, so the routed top-k is looked up" if a.ep_fake_slot else
                            "appends none, so the lookup uses top-k - 1 and can miss tuned rows (aiter#3999)"))
        if not a.flydsl_available:
            lines.append("flydsl not importable on the target: FlyDSL rows and heuristics are skipped")
        if a.doweight_stage1:
            lines.append("router weight applied before stage 1 (doweight_stage1=1)")
        return tuple(lines)


@dataclass(frozen=True)
class DispatchKey:
    """The parts of AITER's lookup key fixed by the layer (the token bucket and q_dtype_a vary per M)."""

    gfx: str
    cu_num: int
    model_dim: int
    inter_dim: int
    expert: int
    topk: int          # as looked up (after the EP adjustment)
    runtime_topk: int  # width of topk_ids passed to fused_moe
    act_type: str
    dtype: str
    q_dtype_w: str
    q_type: str
    use_g1u1: int
    doweight_stage1: int
    gate_mode: str
    is_ep: bool
    hidden_pad: int = 0
    intermediate_pad: int = 0
    #: Per-expert biases are passed (gpt-oss style bias1/bias2): AITER refuses some paths with them.
    has_bias: bool = False

    def aiter_tuple(self, token: int, q_dtype_a: str, *, with_gfx: bool = True) -> tuple:
        """The key as AITER logs it (``[fused_moe] using … for (...)``)."""
        k = (self.cu_num, token, self.model_dim, self.inter_dim, self.expert, self.topk, self.act_type, self.dtype,
             q_dtype_a, self.q_dtype_w, self.q_type, self.use_g1u1, self.doweight_stage1)
        return ((self.gfx,) + k) if with_gfx else k

    def to_dict(self) -> dict[str, Any]:
        return {"gfx": self.gfx, "cu_num": self.cu_num, "model_dim": self.model_dim, "inter_dim": self.inter_dim,
                "expert": self.expert, "topk": self.topk, "runtime_topk": self.runtime_topk,
                "act_type": self.act_type, "dtype": self.dtype, "q_dtype_w": self.q_dtype_w, "q_type": self.q_type,
                "use_g1u1": self.use_g1u1, "doweight_stage1": self.doweight_stage1, "gate_mode": self.gate_mode,
                "is_ep": self.is_ep, "hidden_pad": self.hidden_pad, "intermediate_pad": self.intermediate_pad,
                "has_bias": self.has_bias}


def _quant(layer: "MoELayer", gfx: str) -> tuple[str, str]:
    """(q_type, q_dtype_w) for the layer's weight QuantSpec; UsageError for schemes AITER's fused_moe lacks."""
    w = layer.weight
    gran = w.granularity or ""
    if w.dtype in ("bf16", "fp16"):
        return Q_NO, BF16 if w.dtype == "bf16" else FP16
    if w.dtype == "mxfp4":
        return Q_1X32, FP4
    if w.dtype == "mxfp8":
        return Q_1X32, FP8
    if w.dtype == "fp8":
        if w.block is not None:
            return Q_1X128, _fp8(gfx)   # quant_remap: per_128x128 -> per_1x128
        return (Q_TENSOR if gran == "tensor" else Q_TOKEN), _fp8(gfx)
    if w.dtype == "int8":
        return (Q_TENSOR if gran == "tensor" else Q_TOKEN), I8
    if w.dtype == "int4":
        return (Q_1X32, I4) if w.group_size else (Q_TOKEN, U32)
    raise UsageError(f"AITER's fused_moe has no {w.dtype} weight path to model")


def dispatch_key(layer: "MoELayer", caps: "Capabilities", *, padding: "Padding | None" = None,
                 assumptions: Assumptions | None = None, env: Mapping[str, str] | None = None,
                 model: "str | Rules" = "head") -> DispatchKey:
    """The lookup key for ``layer`` on ``caps`` (padded dims from ``padding`` when given)."""
    if layer.kind != "moe":
        raise UsageError(f"layer {layer.index} is a dense MLP: AITER's fused_moe does not run it")
    if not caps.gfx:
        raise UsageError("AITER dispatch needs a target GPU arch (gfx)")
    a = (assumptions or Assumptions()).resolve(layer)
    env = env or {}
    cu = _env_int(env, "CU_NUM", 0) or caps.compute_units or 0
    if cu <= 0:
        raise UsageError(f"AITER keys its tuned lookup on the CU count; unknown for {caps.arch_label}")
    act = _ACT.get(layer.activation)
    if act is None:
        raise UsageError(f"activation {layer.activation!r} has no AITER ActivationType")
    q_type, q_w = _quant(layer, caps.gfx)
    experts = layer.experts_per_rank + (1 if a.fused_shared_expert else 0)
    routed = layer.top_k + (1 if a.fused_shared_expert else 0)
    is_ep = layer.ep > 1
    runtime = routed + (1 if (is_ep and a.ep_fake_slot) else 0)
    looked_up = runtime - (1 if (is_ep and lookup_rules(model).ep_strip) else 0)
    return DispatchKey(
        gfx=caps.gfx, cu_num=cu,
        model_dim=padding.hidden if padding else layer.hidden,
        inter_dim=padding.intermediate_per_rank if padding else layer.intermediate_per_rank,
        expert=experts, topk=looked_up, runtime_topk=runtime, act_type=act, dtype=a.out_dtype, q_dtype_w=q_w,
        q_type=q_type, use_g1u1=1, doweight_stage1=int(bool(a.doweight_stage1)), gate_mode=a.gate_mode or "separated",
        is_ep=is_ep, hidden_pad=padding.kernel_hidden_pad if padding else 0,
        intermediate_pad=padding.kernel_intermediate_pad if padding else 0, has_bias=bool(layer.has_bias),
    )


# -- lookup rules per AITER release ---------------------------------------------------------------------------

_TAG = "https://github.com/ROCm/aiter/blob/{tag}/aiter/fused_moe.py"


@dataclass(frozen=True)
class Rules:
    """How one AITER release builds and matches its lookup key (read in ``aiter/fused_moe.py`` at each tag).

    ``padded_m``: ``v017`` (M ≤ 16 → 16, next power of two, 1024 cap), ``v08`` (≤16 → 16, pow2 < 1024, 1024 < 2048,
    2048 < 16384, else 16384), ``v09`` (as v08 but M ≤ 16 → next power of two), ``cap32768`` (pow2 below 32768, else
    32768), ``tiers`` (pow2 below 32768, tiers 32768/131072 with fallback to smaller tiers). ``act_exact``: the key
    holds ``str(activation)`` so the exact dict can match (False where it holds the pybind enum). ``act_policy``:
    ``v017`` (per_1x32 → fp4x2, else the weight dtype), ``swiglu512`` (Swiglu MXFP4 bf16 below 512, fp8 from 512 on
    gfx950), ``head`` (SEPARATED / INTERLEAVE / SiTUv2 rules). ``heuristics``: ``v017`` or ``head``.
    """

    name: str
    padded_m: str
    gfx_key: bool
    act_exact: bool
    act_wildcard: bool
    ep_strip: bool
    act_policy: str
    bound_env: str | None
    bound_default: int
    drop_fallback_rows: bool
    heuristics: str
    source: str
    #: _fused_moe_impl refuses a16w4 SiTUv2 under EP / bias / no FlyDSL / unshuffled weights (from v0.1.20; in
    #: v0.1.19.x SiTUv2 a16w4 routes to FlyDSL's mixed_moe with no such guard).
    situv2_guard: bool = False
    #: ``ActivationType.Situv2`` exists (v0.1.19+); before, a SiTUv2 layer cannot be handed to fused_moe at all.
    situv2: bool = False
    #: The untuned a16wi4 FlyDSL heuristic splits K with get_ksplit and names stage 1 ``…_kb{ksplit}`` (up to
    #: v0.1.19.post2: ROCm/aiter@v0.1.18:aiter/fused_moe.py lines 2118-2158); v0.1.20 dropped it (ksplit 0).
    wint4_ksplit: bool = True
    #: The untuned per_1x32 FlyDSL heuristic's scope (get_2stage_cfgs): ``none`` (before v0.1.14: no such branch);
    #: ``swiglu_a4w4`` — only Swiglu with fp4x2 activations and fp4x2 weights, and it keeps get_ksplit's value
    #: (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1320-1399: ``swiglu_mxfp4_flydsl``, ``int(ksplit)``);
    #: ``force_w4`` — AITER_FLYDSL_FORCE (default "1") opens it to every activation with fp4x2/fp8 activations, fp4x2
    #: weights only, ksplit -1 (ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1464-1553);
    #: ``force`` — fp8 (MXFP8) weights too (ROCm/aiter@v0.1.16.post1:aiter/fused_moe.py lines 1469-1479;
    #: v0.1.17 lines 1578-1590), and from v0.1.20 the a16w4 SiTUv2 route (``situv2_guard``).
    flydsl_heuristic: str = "force"
    #: The FlyDSL heuristic's stage-2 tile_k: 256 if inter_dim % 256 == 0 else 128 (ROCm/aiter@v0.1.16.post1:
    #: aiter/fused_moe.py line 1492; v0.1.17 line 1602; pick_flydsl_stage2_tile_k from v0.1.19); v0.1.16 always 256
    #: (ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1484-1512: ``flydsl_kernel_name(2, …, 128, 256, "atomic")``).
    flydsl_s2_tile_k_pick: bool = True
    #: MXFP8 (per_1x32 fp8 weights): fp8 activations in _fused_moe_impl (ROCm/aiter@v0.1.16.post1:aiter/fused_moe.py
    #: lines 408-410) and the gate_mode != SEPARATED CK-Tile branch excludes fp8 weights (line 1396), added by
    #: ROCm/aiter#3811 in v0.1.16.post1. Before, the weights take the generic per_1x32 activation branch (fp4x2;
    #: Swiglu/INTERLEAVE rules) and an interleaved Swiglu layer goes to CK-Tile (ROCm/aiter@v0.1.16:aiter/fused_moe.py
    #: lines 408-417, 1388-1393).
    mxfp8: bool = True
    #: Untuned SwiGLU MXFP4 that reached no other branch (unshuffled weights) routes to CK-Tile with split-K ≥ 2
    #: (ROCM-25478: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1698-1731); before, it goes on to CK 2-stage.
    swiglu_unshuffled_cktile: bool = True
    #: flydsl not importable and the tuned row names FlyDSL kernels: AITER swaps in the shape's ``flydsl_fallback``
    #: row (act wildcarded, the requested bucket), else drops the row for the heuristics
    #: (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 943-971, 1062-1080; v0.1.12 lines 765-790, 855-873, exact
    #: key; from v0.1.11 to v0.1.17 — v0.1.18 removed it and hands the names to the non-FlyDSL launchers).
    flydsl_fallback_rows: bool = False
    #: gfx1250 forces fp4x2 (or fp8 with AITER_FORCE_A8W4) activations (ROCm/aiter@v0.1.17:aiter/fused_moe.py lines
    #: 438-442); absent before.
    gfx1250_act: bool = True
    #: SiTUv2's activation dtype is decided before the Swiglu/INTERLEAVE branches, with AITER_SITUV2_A8W4 /
    #: AITER_SITUV2_A4W4 (ROCm/aiter@v0.1.19.post1:aiter/fused_moe.py lines 721-734). v0.1.19 tests it after them, so
    #: an INTERLEAVE SiTUv2 layer takes the Swiglu/INTERLEAVE bound (fp8 from AITER_BF16_FP8_MOE_BOUND on gfx950), and
    #: a SEPARATED one is bf16 unless AITER_SITUV2_A8W4=1 (no A4W4 switch) (ROCm/aiter@v0.1.19:aiter/fused_moe.py lines
    #: 611-630).
    situv2_act_first: bool = True
    #: fused_moe_1stage_dict keys this release does not have yet (HEAD's table minus these): gfx950 lacks Gelu
    #: per_1x128 before v0.1.12 (ROCm/aiter@v0.1.11:aiter/fused_moe.py fused_moe_1stage_dict) and the non-doweight
    #: per_Token fp8 Silu/Gelu entries before v0.1.11 (ROCm/aiter@v0.1.10.post2:aiter/fused_moe.py lines 546-552).
    one_stage_missing: frozenset = frozenset()
    #: The heuristic 1-stage conditions: ``head`` (v0.1.12+: per_1x128 needs inter_dim % 128 == 0, per_Token fp8 runs
    #: 1-stage when token > 16 or inter_dim % 128 != 0; ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 888-896);
    #: ``v08`` (v0.1.8–v0.1.10: per_1x128 needs inter_dim % 256 == 0, per_Token fp8 only token > 16;
    #: ROCm/aiter@v0.1.10.post2:aiter/fused_moe.py lines 718-723); ``v011`` (v0.1.11: as ``v08``, but a non-doweight
    #: per_Token fp8 layer on gfx950 runs 1-stage only when inter_dim == 192; ROCm/aiter@v0.1.11.post1:
    #: aiter/fused_moe.py lines 842-851).
    one_stage_conds: str = "head"
    #: ``use_cfg``: a Silu bf16 per_1x128 fp8 layer with token * topk <= 128 skips the tuned rows (v0.1.9–v0.1.12.x:
    #: ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 831-843; v0.1.10.post2 lines 678-690).
    blockscale_small_bypass: bool = False
    #: a16wi4 exists (per_1x32 int4 weights: bf16 activations and the FlyDSL a16wi4 heuristic) from v0.1.13.post1
    #: (ROCm/aiter@v0.1.13.post1:aiter/fused_moe.py lines 267-269); before, int4 per_1x32 weights take the generic
    #: per_1x32 activation (fp4x2; Swiglu bf16/fp8) and the ASM/CK heuristics.
    a16wi4: bool = True
    #: Before gate_mode (v0.1.14) every bf16 Swiglu per_1x32 layer goes to CK-Tile with get_block_m() and the plain
    #: ksplit (ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 999-1022; v0.1.10.post2 lines 780-801).
    swiglu_cktile_any_gate: bool = False
    #: The a16wi4 FlyDSL heuristic is tested before that Swiglu CK-Tile branch (v0.1.13.post1: ROCm/aiter@v0.1.13.post1:
    #: aiter/fused_moe.py lines 1026-1063 before 1064); from v0.1.14 the gate_mode CK-Tile branch comes first.
    wint4_before_swiglu_cktile: bool = False
    #: The 1-stage xbf16 switch (the row's ``xbf16`` column / AITER_XBFLOAT16) exists from v0.1.13
    #: (ROCm/aiter@v0.1.13:aiter/fused_moe.py run_1stage_xbf16); before, no xbf16 variant runs.
    xbf16: bool = True
    #: AITER_KSPLIT=-1 drops a tuned row's ksplit (from v0.1.13; ROCm/aiter@v0.1.14:aiter/fused_moe.py lines
    #: 1066-1069); before, the row's ksplit always applies (ROCm/aiter@v0.1.12:aiter/fused_moe.py line 922).
    ksplit_env_off: bool = True
    #: A tuned Opus row is dropped for unshuffled weights or an activation other than Silu/Swiglu/SiTUv2 (from
    #: v0.1.20: ROCm/aiter@v0.1.20.post1:aiter/fused_moe.py lines 2285-2309); v0.1.17–v0.1.19.x keep it (only
    #: cfg_is_supported's EP/bias/arch checks: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1277-1295).
    opus_discard: bool = True
    #: AITER_BYPASS_TUNE_CONFIG with an Opus row: HEAD validates the kept row against the heuristic block_m and raises
    #: ValueError (ROCm/aiter@e4048607:aiter/fused_moe.py lines 2452-2458, parse_stage2_config); v0.1.17–v0.1.19.x
    #: only read its values (stage2_cfg_values, no check: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1390-1396) and
    #: run the heuristics.
    opus_bypass_raises: bool = True


#: Heuristic fields of the releases before v0.1.16.post1 (FlyDSL heuristic without MXFP8, fixed stage-2 tile_k; no
#: ROCM-25478 branch; the flydsl_fallback rows replace FlyDSL rows when flydsl is missing).
_PRE_MXFP8 = dict(flydsl_s2_tile_k_pick=False, mxfp8=False, swiglu_unshuffled_cktile=False, gfx1250_act=False,
                  flydsl_fallback_rows=True)
#: Before gate_mode and a16wi4 (v0.1.13.x and older): every bf16 Swiglu MXFP4 layer → CK-Tile, no a16wi4.
_PRE_GATE = dict(_PRE_MXFP8, flydsl_heuristic="none", a16wi4=False, swiglu_cktile_any_gate=True)
#: Before v0.1.13: no xbf16, AITER_KSPLIT=-1 does not drop a row's ksplit.
_PRE_XBF16 = dict(_PRE_GATE, xbf16=False, ksplit_env_off=False)
#: v0.1.17–v0.1.19.x: Opus rows exist, without v0.1.20's discard checks or HEAD's bypass validation.
_PRE_OPUS_CHECKS = dict(opus_discard=False, opus_bypass_raises=False)
_ONE_STAGE_V011_MISSING = frozenset({("gfx950", (GELU, Q_1X128, BF16, FP8, FP8, 1, 0))})
_ONE_STAGE_V08_MISSING = _ONE_STAGE_V011_MISSING | {("gfx950", (SILU, Q_TOKEN, BF16, FP8, FP8, 1, 0)),
                                                    ("gfx950", (GELU, Q_TOKEN, BF16, FP8, FP8, 1, 0))}
_RULES: tuple[tuple[str, Rules], ...] = (
    ("<0.1.8", Rules("v0.1.7", "v017", False, True, False, False, "v017", None, 512, False, "v017",
                     _TAG.format(tag="v0.1.7"))),
    ("<0.1.9", Rules("v0.1.8", "v08", False, True, False, False, "v017", None, 512, False, "head",
                     _TAG.format(tag="v0.1.8"), one_stage_missing=_ONE_STAGE_V08_MISSING,
                     one_stage_conds="v08", **{**_PRE_XBF16, "flydsl_fallback_rows": False})),
    ("<0.1.11", Rules("v0.1.9–v0.1.10", "v09", False, True, False, False, "swiglu512", None, 512, False, "head",
                      _TAG.format(tag="v0.1.10.post2"), one_stage_missing=_ONE_STAGE_V08_MISSING,
                      one_stage_conds="v08", blockscale_small_bypass=True,
                      **{**_PRE_XBF16, "flydsl_fallback_rows": False})),
    ("<0.1.12", Rules("v0.1.11", "v09", False, True, False, False, "swiglu512", None, 512, False, "head",
                      _TAG.format(tag="v0.1.11.post1"), one_stage_missing=_ONE_STAGE_V011_MISSING,
                      one_stage_conds="v011", blockscale_small_bypass=True, **_PRE_XBF16)),
    ("<0.1.13", Rules("v0.1.12", "cap32768", False, True, False, False, "swiglu512", None, 512, True, "head",
                      _TAG.format(tag="v0.1.12"), blockscale_small_bypass=True, **_PRE_XBF16)),
    # v0.1.13 hard-codes the Swiglu MXFP4 bound at 256 (ROCm/aiter@v0.1.13:aiter/fused_moe.py line 266);
    # v0.1.13.post1 reads AITER_BF16_FP8_BOUND (default 512, line 266) and adds a16wi4.
    ("<0.1.13.post1", Rules("v0.1.13", "cap32768", False, True, False, False, "swiglu512", None, 256, True, "head",
                            _TAG.format(tag="v0.1.13"), **_PRE_GATE)),
    ("<0.1.14", Rules("v0.1.13.post1", "cap32768", False, True, False, False, "swiglu512", "AITER_BF16_FP8_BOUND",
                      512, True, "head", _TAG.format(tag="v0.1.13.post1"),
                      **{**_PRE_GATE, "a16wi4": True, "wint4_before_swiglu_cktile": True})),
    ("<0.1.16", Rules("v0.1.14–v0.1.15", "tiers", False, False, True, False, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                      True, "head", _TAG.format(tag="v0.1.15.post3"), flydsl_heuristic="swiglu_a4w4",
                      **_PRE_MXFP8)),
    ("<0.1.16.post1", Rules("v0.1.16", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                            True, "head", _TAG.format(tag="v0.1.16"), flydsl_heuristic="force_w4", **_PRE_MXFP8)),
    ("<0.1.17", Rules("v0.1.16.post1–v0.1.16.post6", "tiers", True, False, True, True, "head",
                      "AITER_BF16_FP8_MOE_BOUND", 256, True, "head", _TAG.format(tag="v0.1.16.post1"),
                      swiglu_unshuffled_cktile=False, gfx1250_act=False, flydsl_fallback_rows=True)),
    ("<0.1.18", Rules("v0.1.17", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                      True, "head", _TAG.format(tag="v0.1.17"), flydsl_fallback_rows=True, **_PRE_OPUS_CHECKS)),
    ("<0.1.19", Rules("v0.1.18", "tiers", True, True, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256, True,
                      "head", _TAG.format(tag="v0.1.18"), **_PRE_OPUS_CHECKS)),
    # v0.1.19 keys on str(activation) like v0.1.18 (ROCm/aiter@v0.1.19:aiter/fused_moe.py line 1814); v0.1.19.post1
    # went back to the pybind enum (ROCm/aiter@v0.1.19.post1:aiter/fused_moe.py line 2119).
    ("<0.1.19.post1", Rules("v0.1.19", "tiers", True, True, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                            True, "head", _TAG.format(tag="v0.1.19"), situv2=True, situv2_act_first=False,
                            **_PRE_OPUS_CHECKS)),
    ("<0.1.20", Rules("v0.1.19.post1–v0.1.19.post2", "tiers", True, False, True, True, "head",
                      "AITER_BF16_FP8_MOE_BOUND", 256, True, "head", _TAG.format(tag="v0.1.19.post2"), situv2=True,
                      **_PRE_OPUS_CHECKS)),
)
HEAD_RULES = Rules("HEAD e4048607 (v0.1.20+)", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND",
                   256, True, "head", SRC_FUSED_MOE, situv2_guard=True, situv2=True, wint4_ksplit=False)
LEGACY_RULES = _RULES[0][1]


def lookup_rules(version: "str | Rules | None") -> Rules:
    """The :class:`Rules` of an AITER version (``head``/``legacy`` and None accepted: HEAD / the 0.1.7 rules)."""
    if isinstance(version, Rules):
        return version
    if version in (None, "head"):
        return HEAD_RULES
    if version == "legacy":
        return LEGACY_RULES
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        public = Version(Version(str(version)).public)
    except InvalidVersion:
        return HEAD_RULES
    for spec, rules in _RULES:
        if SpecifierSet(spec).contains(public, prereleases=True):
            return rules
    return HEAD_RULES


# -- token buckets and the activation-dtype policy -------------------------------------------------------------

_TIERS = PADDED_M_TIERS  # _PADDED_M_TIERS (HEAD)


def _pow2(M: int) -> int:
    return 1 if M <= 1 else 1 << (M - 1).bit_length()


def get_padded_M(M: int, model: "str | Rules" = "head") -> int:
    """AITER's token bucket (``get_padded_M``) under a release's rules (``model``: ``head``, ``legacy``, a version
    or :class:`Rules`). HEAD: next power of two below 32768, then the tiers 32768 / 131072. 0.1.7: every M ≤ 16 →
    16, next power of two below 1024, 1024 above."""
    style = lookup_rules(model).padded_m
    if style in ("v017", "v08", "v09"):
        if 1 <= M <= 16:
            return 16 if style in ("v017", "v08") else _pow2(M)
        if M < 1024:
            return _pow2(M)
        if style == "v017":
            return 1024
        return 1024 if M < 2048 else 2048 if M < 16384 else 16384
    if style == "cap32768":
        return _pow2(M) if M < 32768 else 32768
    if M < _TIERS[0]:
        return 1 if M <= 1 else 1 << (M - 1).bit_length()
    for tier in reversed(_TIERS):
        if M >= tier:
            return tier
    return _TIERS[0]


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


# -- kernels and families ---------------------------------------------------------------------------------------

def kernel_family(name: str) -> str:
    """The AITER family a kernel name belongs to, from AITER's own naming: ``flydsl_*`` (incl. ``flydsl_mxmoe_*``)
    → flydsl; ``opus_*`` → opus; ``cktile_*``/``moe_cktile2stages*`` → cktile; ``*ck2stages*`` → ck;
    ``_ZN5aiter…``/``fmoe*`` (hsa code objects) → asm."""
    n = (name or "").strip()
    if n.startswith("flydsl_"):
        return "flydsl"
    if n.startswith("opus_"):
        return "opus"
    if n.startswith(("cktile_", "moe_cktile")):
        return "cktile"
    if "ck2stages" in n:
        return "ck"
    if n.startswith(("_ZN5aiter", "fmoe")):
        return "asm"
    return "unknown"


#: AITER kernel family → moedispatch backend name (the built-in plugins' names).


def _family(kernels: tuple[str, ...]) -> str:
    fams = [kernel_family(k) for k in kernels]
    if not fams:
        return "unknown"
    if len(fams) == 1 or fams[0] == fams[1]:
        return fams[0]
    return f"{fams[0]}+{fams[1]}"


@dataclass(frozen=True)
class DispatchStep:
    """What AITER runs for a range of token counts. ``to_dict()`` is the explain contract object.

    ``tokens`` is the (lo, hi) range of the requested token counts this step covers; ``bucket`` the padded M
    (``get_padded_M``) of ``lo`` (``buckets`` lists all). ``basis`` is ``tuned`` (a row decided: ``config`` is its
    ``file:line``) or ``heuristic`` (``config`` None). ``notes`` say why, with AITER's rule.
    """

    tokens: tuple[int, int]
    bucket: int
    stages: int
    family: str
    kernels: tuple[str, ...]
    block_m: int | None
    activation_dtype: str
    basis: str
    config: str | None
    ksplit: int = field(default=0, compare=False)
    buckets: tuple[int, ...] = field(default=(), compare=False)
    q_dtype_a: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    row: TunedRow | None = field(default=None, compare=False, repr=False)
    #: What AITER raises for these token counts instead of running (``"NotImplementedError: …"``), else None.
    raises: str | None = field(default=None, compare=False)

    def decision(self) -> tuple:
        """What grouping compares: everything but the token range and bucket (ksplit included: a range never
        reports one count's split for the others)."""
        return (self.stages, self.family, self.kernels, self.block_m, self.activation_dtype, self.basis,
                self.config, self.ksplit, self.raises)

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": [self.tokens[0], self.tokens[1]], "bucket": self.bucket, "stages": self.stages,
                "family": self.family, "kernels": list(self.kernels), "block_m": self.block_m,
                "activation_dtype": self.activation_dtype, "basis": self.basis, "config": self.config,
                "ksplit": self.ksplit, "raises": self.raises}

    def info_line(self, key: DispatchKey) -> str:
        """AITER's INFO line for this step, as ``get_2stage_cfgs`` prints it (for comparing with logs)."""
        k = key.aiter_tuple(self.bucket, self.q_dtype_a)
        if self.basis == "tuned" and self.row is not None:
            k2 = repr(self.row.kernel2) if self.row.kernel2 else "nan"  # pandas reads an empty cell as nan
            tag = f"(kernelName1={self.row.kernel1!r}, kernelName2={k2})"
        else:
            tag = "default"
        name = key.act_type.split(".")[-1]
        act = f"<ActivationType.{name}: {_ACT_VALUE.get(name, '?')}>"  # the pybind enum's repr in the key
        body = ", ".join(act if i == 7 else repr(v) for i, v in enumerate(k))
        return f"[fused_moe] using {'1stage' if self.stages == 1 else '2stage'} {tag} for ({body})"


# -- the lookup index ---------------------------------------------------------------------------------------------

_WILDCARD = "__ignore__"


@dataclass
class _Index:
    primary: dict[tuple, list[TunedRow]]
    fallback: dict[tuple, list[TunedRow]]
    duplicates: int
    #: ``_tag == "flydsl_fallback"`` rows, keyed exactly and act-wildcarded (Rules.flydsl_fallback_rows).
    fly_fallback: dict[tuple, list[TunedRow]] = field(default_factory=dict)


_INDEXES: dict[int, tuple[ConfigSet, _Index]] = {}


def _index(cs: ConfigSet) -> _Index:
    hit = _INDEXES.get(id(cs))
    if hit is not None and hit[0] is cs:
        return hit[1]
    primary: dict[tuple, list[TunedRow]] = {}
    fallback: dict[tuple, list[TunedRow]] = {}
    dups = 0
    fly: dict[tuple, list[TunedRow]] = {}
    for row in cs.rows:
        if row.tag == "flydsl_fallback":
            # Never in the main dicts; releases with Rules.flydsl_fallback_rows read them when flydsl is missing.
            fly.setdefault(("exact",) + row.key(with_gfx=False), []).append(row)
            fly.setdefault(("any",) + row.key(with_gfx=False, act=_WILDCARD), []).append(row)
            continue
        k = row.key(with_gfx=False)
        bucket = primary.setdefault(k, [])
        if any(r.gfx == row.gfx for r in bucket):
            dups += 1
        bucket.append(row)
        fallback.setdefault(row.key(with_gfx=False, act=_WILDCARD), []).append(row)
    idx = _Index(primary, fallback, dups, fly)
    _INDEXES[id(cs)] = (cs, idx)
    return idx


def _first(rows: list[TunedRow] | None, gfx: str, rules: Rules) -> TunedRow | None:
    for row in rows or ():
        if not rules.gfx_key or row.gfx in (gfx, None):
            return row
    return None


def _lookup(cs: ConfigSet, key: DispatchKey, token: int, q_a: str, model: "str | Rules") -> tuple[
        TunedRow | None, list[str]]:
    """The row AITER's lookup returns under a release's rules, with notes on how.

    Exact first (only where the key holds ``str(activation)``; at HEAD it holds the pybind ``ActivationType``
    while the CSV holds strings such as ``"ActivationType.Silu"``, so the exact dict cannot match — derived from
    get_2stage_cfgs ``keys[7] = activation``), then the act-wildcard dict (first row of the shape in merge order),
    then smaller token tiers."""
    rules = lookup_rules(model)
    idx = _index(cs)
    notes: list[str] = []
    tokens = [token]
    if rules.padded_m == "tiers" and token > _TIERS[0]:
        tokens += [t for t in reversed(_TIERS[:_TIERS.index(token)])] if token in _TIERS else []
    for t in tokens:
        k = key.aiter_tuple(t, q_a, with_gfx=False)
        exact = _first(idx.primary.get(k), key.gfx, rules)
        row = exact if rules.act_exact else None
        if row is None and rules.act_wildcard:
            row = _first(idx.fallback.get(k[:6] + (_WILDCARD,) + k[7:]), key.gfx, rules)
            if row is not None and row.act_type != key.act_type:
                notes.append(f"the first row of this shape is a {row.act_type.split('.')[-1]} row ({row.where}) and "
                             f"AITER's exact lookup cannot match the {key.act_type.split('.')[-1]} row"
                             + (f" at {exact.where}" if exact else "")
                             + (" (it keys on the ActivationType enum, the CSV on strings)" if not rules.act_exact
                                else "") + ": the act-wildcard match decides [derived]")
        if row is not None:
            if t != token:
                notes.append(f"no row at tier {token}; AITER falls back to the {t} tier")
            return row, notes
    return None, notes


# -- dispatch for one token count ---------------------------------------------------------------------------------

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


def _flydsl_heuristic_names(token: int, q_a: str, q_w: str, inter_dim: int, *, pick_tile_k: bool = True
                            ) -> tuple[int, str, str]:
    """The FlyDSL fallback names ``get_2stage_cfgs`` builds (``flydsl_kernel_name`` + tier suffixes); stage-2 tile_k
    256 always where the release does not pick it (``Rules.flydsl_s2_tile_k_pick``)."""
    a = "fp4" if q_a == FP4 else "fp8"
    w = "fp8" if q_w in (FP8, FP8_FNUZ) else "fp4"
    tk2 = 256 if (inter_dim % 256 == 0 or not pick_tile_k) else 128  # pick_flydsl_stage2_tile_k
    if token < 2048:
        tm, s1, s2 = 32, "_w2", "_bnt2"
    elif token < 4096:
        tm, s1, s2 = 64, "_w3_bnt0", ""
    elif token < 16384:
        tm, s1, s2 = 128, "_w2_bnt0", ""
    else:
        tm, s1, s2 = 64, "_w4_bnt0", ""
    kn1 = f"flydsl_moe1_a{a}_w{w}_bf16_t{tm}x128x256{s1}"
    kn2 = f"flydsl_moe2_a{a}_w{w}_bf16_t{tm}x128x{tk2}_atomic{s2}"
    if a == "fp8":
        kn1 += "_gui"
    return tm, kn1, kn2


def _tier_block_m(token: int) -> int:
    return 16 if token < 2048 else 32 if token < 16384 else 64


_MXMOE_BM = re.compile(r"_(\d+)x\d+x\d+")


def _dispatch_head(M: int, key: DispatchKey, cs: ConfigSet | None, env: Mapping[str, str],
                   a: Assumptions, rules: Rules = HEAD_RULES) -> DispatchStep:
    token = get_padded_M(M, rules)
    q_a, why_a = activation_dtype(M, key, env, rules)
    notes = [why_a]
    fp8 = _fp8(key.gfx)  # aiter.utility.dtypes.fp8 on this arch
    refused = _situv2_a16w4_refusal(key, q_a, a) if rules.situv2_guard else None
    if refused:
        return DispatchStep(tokens=(M, M), bucket=token, stages=2, family="none", kernels=(), block_m=None,
                            activation_dtype=_label(q_a, key.q_type), basis="heuristic", config=None,
                            buckets=(token,), q_dtype_a=q_a, notes=tuple(notes), raises=refused)
    row: TunedRow | None = None
    if cs is not None and not cs.broken:
        row, more = _lookup(cs, key, token, q_a, rules)
        notes += more
        if row is not None and not rules.xbf16 and row.xbf16:
            row = replace(row, xbf16=0)  # no xbf16 column read before v0.1.13 (Rules.xbf16)
        if row is not None and rules.blockscale_small_bypass and token * key.topk <= 128 and (
                key.act_type, key.dtype, q_a, key.q_dtype_w, key.q_type) == (SILU, BF16, fp8, fp8, Q_1X128):
            notes.append(f"use_cfg: Silu per_1x128 fp8 with token*topk <= 128 skips the tuned row {row.where} "
                         f"({rules.name})")
            row = None
        if row is not None and rules.flydsl_fallback_rows and not a.flydsl_available and (
                row.kernel1.startswith("flydsl_") or row.kernel2.startswith("flydsl_")):
            row, more = _flydsl_fallback_row(cs, key, token, q_a, rules, row)
            notes += more
    bypass = _env_int(env, "AITER_BYPASS_TUNE_CONFIG", 0) != 0
    opus_row: TunedRow | None = None
    if row is not None:
        kn1, kn2 = row.kernel1, row.kernel2
        has_opus = kn1.startswith("opus_") or kn2.startswith("opus_")
        if has_opus and not a.weights_shuffled and rules.opus_discard:
            notes.append(f"Opus row {row.where} discarded: weights not pre-shuffled")
            row = None
        elif kn1.startswith("opus_") and key.act_type not in (SILU, SWIGLU, SITUV2) and rules.opus_discard:
            notes.append(f"Opus row {row.where} discarded: activation {key.act_type} unsupported")
            row = None
        elif kn2.startswith("opus_"):
            why_not = ("requires gfx950, got " + key.gfx if key.gfx != "gfx950" else
                       "EP expert_mask/topk_ids are not supported" if key.is_ep else
                       "stage2 bias is not supported" if key.has_bias else None)
            if why_not:
                # aiter/ops/opus/moe_stage2_a8w4.py cfg_is_supported; fused_moe.py get_2stage_cfgs then drops cfg
                notes.append(f"Opus stage2 config unsupported ({why_not}): row {row.where} dropped, AITER uses "
                             "default heuristics")
                row = None
            else:
                opus_row = row
    if row is not None and bypass:
        notes.append(f"AITER_BYPASS_TUNE_CONFIG set: tuned row {row.where} ignored")
        row = None
    if row is None and cs is not None and not cs.broken and env.get("AITER_ONLINE_TUNE", "0") == "1":
        notes.append("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call (result unknown offline); "
                     "modelled as the heuristic it falls back to")
    if cs is not None and cs.broken:
        notes.append("the tuned set has malformed lines: modelled with heuristics only (" + "; ".join(cs.warnings[:2])
                     + ")")
    q_type, q_w = key.q_type, key.q_dtype_w
    shuffled = a.weights_shuffled
    fly = a.flydsl_available

    def step(stages: int, kernels: tuple[str, ...], block_m: int | None, basis: str, ksplit: int = 0,
             extra: Iterable[str] = (), family: str | None = None) -> DispatchStep:
        return DispatchStep(tokens=(M, M), bucket=token, stages=stages, family=family or _family(kernels),
                            kernels=kernels, block_m=block_m, activation_dtype=_label(q_a, q_type), basis=basis,
                            config=row.where if (basis == "tuned" and row is not None) else None, ksplit=ksplit,
                            buckets=(token,), q_dtype_a=q_a, notes=tuple(notes) + tuple(extra),
                            row=row if basis == "tuned" else None)

    if row is None:
        kn1 = kn2 = ""
        run_1stage = False
        one_key = (key.act_type, q_type, key.dtype, q_a, q_w, key.use_g1u1, key.doweight_stage1)
        api = None if (key.gfx, one_key) in rules.one_stage_missing else _ONE_STAGE_HEAD.get(key.gfx, {}).get(one_key)
        if api is not None:
            conds = rules.one_stage_conds
            if q_type == Q_1X128:
                run_1stage = token > 32 and key.inter_dim % (128 if conds == "head" else 256) == 0
            elif q_type == Q_TOKEN and q_w == I8:
                run_1stage = token > 32
            elif q_type == Q_TOKEN and q_w in (FP8, FP8_FNUZ):
                if conds == "v011" and key.gfx == "gfx950" and not key.doweight_stage1:
                    run_1stage = key.inter_dim == 192
                else:
                    run_1stage = token > 16 or (conds == "head" and key.inter_dim % 128 != 0)
            elif q_type != Q_1X32:
                run_1stage = token < 256
        if run_1stage:
            block_m = 32
            ksplit = 0
            api = _one_stage_op(key)
        else:
            block_m = (64 if token > 32 else 16) if q_type == Q_1X128 else \
                _block_size_M(token, key.topk, key.expert, key.inter_dim, key.cu_num)
            ksplit = _ksplit(token, key.topk, key.expert, key.inter_dim, key.model_dim, key.cu_num, env) \
                if q_type in (Q_1X128, Q_1X32) else 0
        row_run_1stage = run_1stage
        basis = "heuristic"
        if opus_row is not None and block_m != opus_row.block_m and rules.opus_bypass_raises:
            # The bypass keeps cfg, and parse_stage2_config(cfg, block_m) checks the heuristic block_m against the
            # Opus kernel's sort block_m (fused_moe.py get_2stage_cfgs; aiter/ops/opus/moe_stage2_a8w4.py).
            return DispatchStep(tokens=(M, M), bucket=token, stages=2, family="none", kernels=(), block_m=block_m,
                                activation_dtype=_label(q_a, q_type), basis="heuristic", config=None,
                                buckets=(token,), q_dtype_a=q_a, notes=tuple(notes),
                                raises=f"ValueError: requires sort block_m={opus_row.block_m}, got tuned "
                                       f"block_m={block_m} (AITER_BYPASS_TUNE_CONFIG with the Opus row "
                                       f"{opus_row.where})")
    else:
        kn1, kn2 = row.kernel1, row.kernel2
        block_m = row.block_m
        ksplit = 0 if (rules.ksplit_env_off and _env_int(env, "AITER_KSPLIT", 0) == -1) else row.ksplit
        row_run_1stage = bool(row.run_1stage)
        basis = "tuned"
    if row is not None and (kn1.startswith("flydsl_mxmoe_g") or kn2.startswith("flydsl_mxmoe_g")):
        m = _MXMOE_BM.search(kn1)
        bm = int(m.group(1)) if m else block_m
        if key.is_ep:
            return replace(step(2, (kn1, kn2), bm, basis, ksplit, ["FlyDSL MXFP4 a4w4 port (flydsl_mxmoe_*)"]),
                           raises="NotImplementedError: MXFP4 a4w4 FlyDSL port does not support expert-parallel "
                                  "yet (expert_mask is dropped by the output_aux sort path).")
        return step(2, (kn1, kn2), bm, basis, ksplit, ["FlyDSL MXFP4 a4w4 port (flydsl_mxmoe_*)"])
    if row_run_1stage:
        if row is None:
            xbf16 = q_type == Q_1X128 and key.gfx == "gfx950" and env.get("AITER_XBFLOAT16", "0") == "1" \
                and rules.xbf16
            name = f"{api} (default{', xbf16' if xbf16 else ''})"
            return step(1, (name,), block_m, basis, 0, ["1-stage ASM from fused_moe_1stage_dict: the asm "
                                                       "launcher picks the code object by inter_dim and block_m"])
        return step(1, (kn1,), block_m, basis, ksplit)
    is_fly1, is_fly2 = kn1.startswith("flydsl_"), kn2.startswith("flydsl_")
    is_opus1 = kn1.startswith("opus_moe1_")
    if is_opus1 or ((is_fly1 or is_fly2) and fly):
        k2, extra = _stage2_name(kn2)
        return step(2, (kn1, k2), block_m, basis, ksplit, extra)
    if row is not None and (is_fly1 or is_fly2) and not fly:
        notes.append(f"row {row.where} names FlyDSL kernels but flydsl is not importable: AITER falls through")
    wint4 = q_type == Q_1X32 and q_w == I4 and fly and rules.a16wi4
    if (key.gate_mode != "separated" or rules.swiglu_cktile_any_gate) and key.dtype in (BF16, FP16) \
            and q_type == Q_1X32 and key.act_type == SWIGLU and (q_w != fp8 or not rules.mxfp8) \
            and not (wint4 and rules.wint4_before_swiglu_cktile):
        bm = 32 if q_a == fp8 else _tier_block_m(token)
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), bm, "heuristic", ksplit,
                    extra + ["Swiglu MXFP4 with interleaved gate/up: CK-Tile 2-stage"])
    swiglu_bf16_cktile = (q_type == Q_1X32 and key.act_type == SWIGLU and q_a in (BF16, FP16) and q_w == FP4
                          and shuffled)
    if wint4:
        tm = _tier_block_m(token)
        kb = _ksplit(token, key.topk, key.expert, key.inter_dim, key.model_dim, key.cu_num, env) \
            if rules.wint4_ksplit else 0
        return step(2, (f"flydsl_moe1_abf16_wint4_bf16_t{tm}x128x128" + (f"_kb{kb}" if kb > 1 else ""),
                        f"flydsl_moe2_abf16_wint4_bf16_t{tm}x128x128_atomic"),
                    tm, "heuristic", kb, ["no tuned FlyDSL a16wi4 config: AITER's untuned a16wi4 fallback"])
    force = env.get("AITER_FLYDSL_FORCE", "1") == "1"
    fly_scope = rules.flydsl_heuristic
    if fly_scope == "swiglu_a4w4":  # ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1320-1330
        fly_acts, fly_a, fly_w = key.act_type == SWIGLU, (FP4,), (FP4,)
    elif fly_scope == "force_w4":  # ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1464-1476
        fly_acts, fly_a, fly_w = key.act_type == SWIGLU or force, (FP4, fp8), (FP4,)
    else:
        fly_acts, fly_a, fly_w = key.act_type in (SWIGLU, SITUV2) or force, (FP4, fp8), (FP4, fp8)
    use_mx_fly = (fly_scope != "none" and key.dtype in (BF16, FP16) and q_type == Q_1X32 and fly_acts
                  and q_a in fly_a and q_w in fly_w and shuffled and key.use_g1u1
                  and not key.doweight_stage1 and fly)
    situ_a16 = (key.dtype in (BF16, FP16) and q_type == Q_1X32 and key.act_type == SITUV2 and q_a == BF16
                and q_w == FP4 and shuffled and key.use_g1u1 and not key.doweight_stage1 and fly)
    if use_mx_fly or situ_a16:
        if situ_a16:
            tm, k1, k2 = _flydsl_heuristic_names(token, FP4, q_w, key.inter_dim)
            k1, k2 = k1.replace("_afp4_", "_abf16_"), k2.replace("_afp4_", "_abf16_")
        else:
            tm, k1, k2 = _flydsl_heuristic_names(token, q_a, q_w, key.inter_dim,
                                                 pick_tile_k=rules.flydsl_s2_tile_k_pick)
        extra = []
        if row is not None:
            extra.append(f"tuned row {row.where} names {_family((kn1, kn2))} kernels, but "
                         f"AITER_FLYDSL_FORCE={env.get('AITER_FLYDSL_FORCE', '1')} routes per_1x32 fp4/fp8 layers "
                         "without a FlyDSL row to the FlyDSL heuristic")
        # split_k -1 from v0.1.16; v0.1.14-v0.1.15 keep the ksplit computed above (int(ksplit)).
        return step(2, (k1, k2), tm, "heuristic", ksplit if fly_scope == "swiglu_a4w4" else -1,
                    extra + ["no tuned FlyDSL config: heuristic FlyDSL fallback"])
    if key.dtype in (BF16, FP16) and q_type == Q_1X32 and q_w == FP4 and shuffled \
            and not (key.act_type == SWIGLU and q_a == FP4) and (ksplit > 1 or swiglu_bf16_cktile):
        sk = max(int(ksplit), 2 if swiglu_bf16_cktile else 1)
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), _tier_block_m(token),
                    "heuristic", sk, extra + ["MXFP4 weights with bf16 activations (or split-K): CK-Tile 2-stage "
                                              "(CK 2-stage has no A16W4 heuristic kernel)"])
    if key.act_type == SWIGLU and q_w == FP4 and q_type == Q_1X32 and key.dtype in (BF16, FP16) and not kn1 \
            and rules.swiglu_unshuffled_cktile:
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), _tier_block_m(token),
                    "heuristic", max(int(ksplit), 2), ["SwiGLU MXFP4 with unshuffled weights: CK-Tile"])
    if (kn1 and "ck2stages" in kn1) or (not kn1 and ((q_type == Q_1X128 and key.doweight_stage1)
                                                     or q_w in (BF16, FP16, U32, FP4, fp8))):
        k1 = kn1 or "moe_ck2stages_gemm1 (default)"
        k2, extra = _stage2_name(kn2) if kn2 else ("moe_ck2stages_gemm2 (default)", [])
        if kn2.startswith("flydsl_") and not fly:
            # The FlyDSL stage 2 is taken only with is_flydsl_available(); otherwise ck_moe_stage2_fwd gets the
            # FlyDSL name (ROCm/aiter@e4048607:aiter/fused_moe.py lines 2888, 2909-2916).
            return replace(step(2, (k1, k2), block_m, basis, ksplit, extra, family="ck"),
                           raises=f"the CK stage-2 launcher is handed the FlyDSL kernel name {k2} because flydsl is "
                                  "not importable: no such kernel to launch")
        return step(2, (k1, k2), block_m, basis, ksplit,
                    extra + ([] if kn1 else ["CK 2-stage with the codegen's default instance for this shape"]))
    if block_m not in (16, 32, 64, 128):
        block_m = ([b for b in (16, 32, 64, 128) if block_m < b] + [128])[0]
    k1 = kn1 or "fmoe_stage1_g1u1 (default)"
    k2 = kn2 or "moe_ck2stages_gemm2 (default)"
    # The last branch's stage-2 launcher follows the row's stage-2 name: an Opus a8w4 instance → opus_a8w4_stage2,
    # cktile_* → cktile_moe_stage2, anything else → ck_moe_stage2_fwd (ROCm/aiter@e4048607:aiter/fused_moe.py
    # get_2stage_cfgs, last branch; the same at every tag from v0.1.17).
    s2 = "opus" if kn2.startswith("opus_moe2_") else "cktile" if kn2.startswith("cktile_") else "ck"
    launcher = {"opus": "Opus", "cktile": "CK-Tile", "ck": "CK"}[s2]
    if is_fly1 or is_fly2:
        # asm_stage1(kernelName=<flydsl name>) (+ ck_moe_stage2_fwd(kernelName=<flydsl name>)): the ASM launcher has
        # no such kernel.
        return replace(step(2, (k1, k2), block_m, basis, ksplit, [f"ASM stage 1 + {launcher} stage 2"],
                            family=f"asm+{s2}"),
                       raises=f"the ASM stage-1 and {launcher} stage-2 launchers are handed FlyDSL kernel names "
                              f"({k1}, {k2}) because flydsl is not importable: no such kernel to launch")
    return step(2, (k1, k2), block_m, basis, ksplit, [f"ASM stage 1 + {launcher} stage 2"],
                **({"family": f"asm+{s2}"} if s2 != "ck" else {}))


def _flydsl_fallback_row(cs: ConfigSet, key: DispatchKey, token: int, q_a: str, rules: Rules, row: TunedRow
                         ) -> tuple[TunedRow | None, list[str]]:
    """Releases with ``Rules.flydsl_fallback_rows`` (v0.1.11-v0.1.17): flydsl is not importable and the tuned row
    names FlyDSL kernels, so AITER looks the requested bucket up among the ``flydsl_fallback`` rows (act wildcarded
    from v0.1.14, exact before) and takes that row, else drops the row for the heuristics
    (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1062-1080)."""
    k = key.aiter_tuple(token, q_a, with_gfx=False)
    look = ("any",) + k[:6] + (_WILDCARD,) + k[7:] if rules.act_wildcard else ("exact",) + k
    fb = _first(_index(cs).fly_fallback.get(look), key.gfx, rules)
    if fb is not None:
        return fb, [f"flydsl is not importable: AITER swaps row {row.where} for its flydsl_fallback row {fb.where}"]
    return None, [f"flydsl is not importable and row {row.where} has no flydsl_fallback row: AITER drops it for the "
                  "default heuristics"]


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


def _dispatch_legacy(M: int, key: DispatchKey, cs: ConfigSet | None, env: Mapping[str, str],
                     a: Assumptions, rules: Rules = LEGACY_RULES) -> DispatchStep:
    token = get_padded_M(M, rules)
    q_a, why_a = activation_dtype(M, key, env, rules)
    notes = [why_a]
    row = None
    if cs is not None and not cs.broken:
        row, more = _lookup(cs, key, token, q_a, rules)
        notes += more
    if cs is not None and cs.broken:
        notes.append("the tuned set has malformed lines: modelled with heuristics only")
    if row is None and cs is not None and env.get("AITER_ONLINE_TUNE", "0") == "1":
        notes.append("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call; modelled as the heuristic")
    q_type, q_w = key.q_type, key.q_dtype_w

    def step(stages: int, kernels: tuple[str, ...], block_m: int, basis: str, ksplit: int = 0,
             extra: Iterable[str] = ()) -> DispatchStep:
        return DispatchStep(tokens=(M, M), bucket=token, stages=stages, family=_family(kernels), kernels=kernels,
                            block_m=block_m, activation_dtype=_label(q_a, q_type), basis=basis,
                            config=row.where if (basis == "tuned" and row is not None) else None, ksplit=ksplit,
                            buckets=(token,), q_dtype_a=q_a, notes=tuple(notes) + tuple(extra),
                            row=row if basis == "tuned" else None)

    if row is None:
        run_1stage = False
        api = None
        if not key.doweight_stage1:
            api = _ONE_STAGE_LEGACY.get(key.gfx, {}).get((key.act_type, q_type, key.dtype, q_a, q_w, key.use_g1u1))
        if api is not None:
            if q_type == Q_1X128:
                run_1stage = key.inter_dim % 256 == 0
            elif q_type == Q_TOKEN and q_w in (I8, FP8, FP8_FNUZ):
                run_1stage = token > 32
            elif q_type != Q_1X32:
                run_1stage = token < 256
        block_m = 32 if run_1stage else (64 if q_type == Q_1X128 else
                                         _block_size_M(token, key.topk, key.expert, key.inter_dim, key.cu_num))
        kn1 = kn2 = ""
        basis = "heuristic"
        ksplit = 0
        if run_1stage:
            return step(1, (f"{_one_stage_op(key, tkw1=False)} (default)",), block_m, basis, 0,
                        ["1-stage ASM: fused_moe_1stage_dict decides 1-stage, the quant type picks the op"])
    else:
        kn1, kn2, block_m, ksplit, basis = row.kernel1, row.kernel2, row.block_m, row.ksplit, "tuned"
        if row.run_1stage:
            return step(1, (kn1,), block_m, basis, ksplit)
    if key.dtype in (BF16, FP16) and q_type == Q_1X32 and key.act_type == SWIGLU:
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), 16 if token < 2048 else 32,
                    "heuristic", ksplit, extra)
    if "ck2stages" in kn1 or (q_type == Q_1X128 and key.doweight_stage1) or q_w in (BF16, FP16, U32, FP4):
        return step(2, (kn1 or "moe_ck2stages_gemm1 (default)", kn2 or "moe_ck2stages_gemm2 (default)"), block_m,
                    basis, ksplit)
    if block_m not in (32, 64, 128):
        block_m = ([b for b in (32, 64, 128) if block_m < b] + [128])[0]
    return step(2, (kn1 or "fmoe_stage1_g1u1 (default)", kn2 or "moe_ck2stages_gemm2 (default)"), block_m, basis,
                ksplit, ["ASM stage 1 + CK stage 2"])


def dispatch_token(M: int, key: DispatchKey, config_set: ConfigSet | None, *, env: Mapping[str, str] | None = None,
                   assumptions: Assumptions | None = None, model: "str | Rules | None" = None) -> DispatchStep:
    """What AITER runs for exactly ``M`` tokens (one ungrouped step)."""
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise UsageError(f"token counts must be positive integers, got {M!r}")
    rules = lookup_rules(model if model is not None else
                         (config_set.version if config_set is not None and config_set.version else None))
    a = assumptions or Assumptions()
    if key.act_type == SITUV2 and not rules.situv2:
        q_a = BF16
        return DispatchStep(tokens=(M, M), bucket=get_padded_M(M, rules), stages=2, family="none", kernels=(),
                            block_m=None, activation_dtype=_label(q_a, key.q_type), basis="heuristic", config=None,
                            buckets=(get_padded_M(M, rules),), q_dtype_a=q_a,
                            raises=f"AttributeError: type object 'ActivationType' has no attribute 'Situv2' (AITER "
                                   f"{rules.name} has no SiTUv2 activation: csrc/include/aiter_enum.h)")
    fn = _dispatch_legacy if rules.heuristics == "v017" else _dispatch_head
    return fn(M, key, config_set, dict(env or {}), a, rules)


def _group(steps: list[DispatchStep]) -> tuple[DispatchStep, ...]:
    out: list[DispatchStep] = []
    for s in steps:
        if out and out[-1].decision() == s.decision():
            prev = out[-1]
            buckets = prev.buckets + tuple(b for b in s.buckets if b not in prev.buckets)
            notes = prev.notes + tuple(n for n in s.notes if n not in prev.notes)
            out[-1] = replace(prev, tokens=(prev.tokens[0], s.tokens[1]), buckets=buckets, notes=notes)
        else:
            out.append(s)
    return tuple(out)


# -- plans ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DispatchIssue:
    """One known issue keyed on kernel × token bucket × AITER version (capability_db/dispatch_issues.toml)."""

    id: str
    title: str
    source: str
    status: str
    kernel: str
    effect: str
    workaround: str
    confidence: str
    severity: str
    stage: int | None = None
    buckets: tuple[int, ...] = ()
    tokens_min: int | None = None
    tokens_max: int | None = None
    gfx: tuple[str, ...] = ()
    aiter: str = ""
    basis: str | None = None
    stages: int | None = None
    q_type: str | None = None
    q_dtype_a: tuple[str, ...] = ()
    q_dtype_w: str | None = None
    act_type: str | None = None
    shape: tuple[tuple[str, int], ...] = ()
    inter_dim_multiple_of: int | None = None
    inter_dim_not_multiple_of: int | None = None
    intermediate_pad_min: int | None = None
    block_m: int | None = None
    ep: bool | None = None
    workaround_env: tuple[tuple[str, str], ...] = ()
    token_cap: int | None = None
    fixed_by: str | None = None
    #: step.ksplit at least this (split-K in use)
    ksplit_min: int | None = None
    #: model_dim // (ksplit * k_per_block[block_m]) at most this: k-tiles per split (CK stage 1's KBatch)
    k_tiles_per_split_max: int | None = None
    k_per_block: tuple[tuple[int, int], ...] = ()
    #: the deciding tuned row has flat >= 1 (a FLAT 1-stage ASM kernel: no external moe_sort)
    row_flat: bool | None = None
    #: AITER raises (or refuses to launch) instead of computing: see IssueHit.raises
    raises: bool = False
    #: How a plan may pin a correct kernel for the bucket instead (:mod:`moedispatch.aiter.pin`): ``neighbour`` =
    #: the kernel the same key's nearest clean bucket uses, written to an AITER_CONFIG_FMOE file. None: no pin.
    pin: str | None = None


@dataclass(frozen=True)
class IssueHit:
    """A known issue that AITER's dispatch would hit: which tokens/bucket, what happens, what to do."""

    issue: str
    tokens: tuple[int, int]
    bucket: int
    kernel: str
    effect: str
    workaround: str
    workaround_env: tuple[tuple[str, str], ...]
    token_cap: int | None
    source: str
    confidence: str
    severity: str
    #: The change that fixes it upstream (dispatch_issues.toml ``fixed_by``), when one is known.
    fixed_by: str | None = None
    #: AITER raises (or cannot launch) for these tokens instead of running: the path is rejected whatever the
    #: workaround (which then names the configuration that does run).
    raises: bool = False

    @property
    def has_workaround(self) -> bool:
        return bool(self.workaround_env or self.token_cap or self.workaround)

    @property
    def blocking(self) -> bool:
        """The path cannot be planned: AITER raises and no environment/token cap makes it run (a recipe exports
        those), or a known wrong-output kernel has no workaround at all."""
        if self.severity != "error":
            return False
        if self.raises:
            return not (self.workaround_env or self.token_cap)
        return not self.has_workaround

    def to_dict(self) -> dict[str, Any]:
        return {"issue": self.issue, "tokens": list(self.tokens), "bucket": self.bucket, "kernel": self.kernel,
                "effect": self.effect, "workaround": self.workaround, "workaround_env": dict(self.workaround_env),
                "token_cap": self.token_cap, "source": self.source, "confidence": self.confidence,
                "severity": self.severity, "fixed_by": self.fixed_by, "raises": self.raises}


@dataclass(frozen=True)
class DispatchPlan:
    """The simulated dispatch of one layer: ``steps`` (grouped) and everything they assumed."""

    layer_index: int
    steps: tuple[DispatchStep, ...]
    key: DispatchKey
    tokens: tuple[int, ...]
    env: tuple[tuple[str, str], ...]
    assumptions: tuple[str, ...]
    configs: str
    dispatch_model: str
    aiter_version: str | None
    warnings: tuple[str, ...] = ()
    issues: tuple[IssueHit, ...] = ()
    #: The confidence of each of :attr:`warnings`, in order (``"derived"`` where the model infers rather than reads).
    warning_confidence: tuple[str, ...] = ()
    #: Where the tuned rows came from (ConfigSet.origin: installed | bundled | env | explicit) and, for the bundled
    #: index, which AITER release's rows; where the dispatch rules were read.
    config_origin: str = ""
    config_release: str | None = None
    rules_source: str = ""

    def data_used(self) -> dict[str, Any]:
        """What the plan read: the tuned rows (origin, release, label) and the dispatch rules (name, source)."""
        return {"rows": self.configs, "origin": self.config_origin, "release": self.config_release,
                "rules": self.dispatch_model, "rules_source": self.rules_source}

    @property
    def families(self) -> tuple[str, ...]:
        """Distinct families in token order (``("asm",)``; ``("cktile", "flydsl")`` when it changes with M)."""
        seen: list[str] = []
        for s in self.steps:
            if s.family not in seen:
                seen.append(s.family)
        return tuple(seen)

    @property
    def backends(self) -> tuple[str, ...]:
        """moedispatch backend names of the families AITER runs, in token order (``aiter-cktile``, ``aiter-flydsl``;
        a mixed step such as ``flydsl+ck`` contributes both; ``opus`` has no moedispatch backend: ``aiter-opus``)."""
        seen: list[str] = []
        for fam in self.families:
            for part in fam.split("+"):
                if part == "none":  # AITER raises: no family runs
                    continue
                name = BACKEND_OF_FAMILY.get(part, f"aiter-{part}")
                if name not in seen:
                    seen.append(name)
        return tuple(seen)

    def table_lines(self) -> list[str]:
        """Human lines for explain's table: one per step, then issues, assumptions and warnings."""
        lines = []
        for s in self.steps:
            toks = f"{s.tokens[0]}" if s.tokens[0] == s.tokens[1] else f"{s.tokens[0]}–{s.tokens[1]}"
            why = f"tuned {s.config}" if s.basis == "tuned" else "heuristic"
            if s.raises:
                lines.append(f"tokens {toks} (bucket {'/'.join(map(str, s.buckets or (s.bucket,)))}): AITER raises "
                             f"— {s.raises}")
                continue
            split = f", split-K {s.ksplit}" if s.ksplit > 1 else ""
            lines.append(f"tokens {toks} (bucket {'/'.join(map(str, s.buckets or (s.bucket,)))}): {s.family} "
                         f"{s.stages}-stage {' + '.join(s.kernels)}, block_m {s.block_m}{split}, activations "
                         f"{s.activation_dtype} — {why}")
        for h in self.issues:
            toks = f"{h.tokens[0]}" if h.tokens[0] == h.tokens[1] else f"{h.tokens[0]}–{h.tokens[1]}"
            fix = ", ".join(f"{k}={v}" for k, v in h.workaround_env)
            cap = f"; cap --max-num-batched-tokens at {h.token_cap}" if h.token_cap else ""
            lines.append(f"{h.severity} {h.issue} at tokens {toks} (bucket {h.bucket}, {h.kernel}): {h.effect}. "
                         f"Workaround: {h.workaround}{' [' + fix + ']' if fix else ''}{cap} ({h.source})")
        lines += [f"assumes {a}" for a in self.assumptions]
        lines += [f"warning {w}" for w in self.warnings]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer_index, "aiter_dispatch": [s.to_dict() for s in self.steps],
                "key": self.key.to_dict(), "tokens": list(self.tokens), "aiter_env": dict(self.env),
                "assumptions": list(self.assumptions), "configs": self.configs,
                "dispatch_model": self.dispatch_model, "aiter_version": self.aiter_version,
                "warnings": list(self.warnings), "issues": [h.to_dict() for h in self.issues]}


def _tokens(tokens: Iterable[int]) -> tuple[int, ...]:
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise UsageError(f"token counts must be positive integers, got {t!r}")
        out.append(t)
    if not out:
        raise UsageError("no token counts given")
    return tuple(sorted(set(out)))


def plan_dispatch(layer: "MoELayer", caps: "Capabilities", *, tokens: Iterable[int] = DEFAULT_TOKENS,
                  env: Mapping[str, str] | None = None, padding: "Padding | None" = None,
                  configs: ConfigSet | None = None, assumptions: Assumptions | None = None) -> DispatchPlan:
    """Simulate AITER's dispatch of ``layer`` for every token count; group alike consecutive counts; evaluate the
    known dispatch issues.

    ``env`` is the AITER environment (None: :func:`aiter_env` of ``os.environ``); ``padding`` the allocation the
    kernel sees (None: the unpadded per-rank shape); ``configs`` the tuned set (None:
    :func:`moedispatch.data.aiter_configs.config_set_for` — the installed AITER's CSVs when it is the one planned for,
    else the bundled snapshot). Bad input raises :class:`~moedispatch.core.errors.UsageError` (one line).
    """
    env_d = aiter_env() if env is None else {str(k): str(v) for k, v in env.items()}
    # Only rows of this layer's model_dim (unpadded or padded) can match its key: parse just those lines.
    dims = frozenset({layer.hidden} | ({padding.hidden} if padding is not None else set()))
    cs = configs or _cfg.config_set_for(caps, env_d, model_dims=dims)
    a = (assumptions or Assumptions()).resolve(layer)
    # The installed AITER is what runs when its files are planned for; otherwise the target's version.
    version = cs.version if cs.origin == "installed" else (caps.aiter_version or cs.version)
    rules = lookup_rules(version)
    key = dispatch_key(layer, caps, padding=padding, assumptions=a, env=env_d, model=rules)
    counts = _tokens(tokens)
    raw = [dispatch_token(m, key, cs, env=env_d, assumptions=a, model=rules) for m in counts]
    steps = _group(raw)
    warnings = list(cs.notes) + list(cs.warnings)
    if cs.merge_error:
        warnings.append(cs.merge_error)
    idx = _index(cs)
    if idx.duplicates:
        warnings.append(f"{idx.duplicates} tuned rows repeat a lookup key; AITER keeps the first"
                        + (" — pandas to_dict('index') raises on them in 0.1.7" if rules is LEGACY_RULES else ""))
    derived: set[int] = set()
    if rules is not HEAD_RULES and rules.heuristics == "head":
        derived.add(len(warnings))
        warnings.append(f"AITER {version}: key, buckets and activation policy follow {rules.name} ({rules.source}); "
                        f"the heuristic fallbacks are modelled on HEAD e4048607 (derived)")
    situ_gfx942 = key.act_type == SITUV2 and all(s.q_dtype_a == BF16 for s in raw) and _at_least(version, "0.1.20")
    if key.q_type == Q_1X32 and key.q_dtype_w in (FP4, FP8) and key.gfx != "gfx950" and not situ_gfx942:
        # (The a16w4 SiTUv2 FlyDSL kernel runs on gfx942 from AITER 0.1.20: ROCm/aiter#4502.)
        # fp4x2/MX kernels (FlyDSL mixed_moe, CK-Tile a16w4, ASM MXfp4) use gfx950 scaled MFMA; the gfx942 ASM
        # table has no MXfp4 code object and the fp4 quant cannot emit fp4x2 there (sgl-project/sglang#35525).
        derived.add(len(warnings))
        warnings.append(f"AITER's MX (per_1x32) fused-MoE kernels need gfx950; on {key.gfx} this dispatch fails at "
                        "run time (derived: " + SRC_FUSED_MOE + ", https://github.com/sgl-project/sglang/pull/35525)")
    if env_d.get("AITER_MOE_A8W4_BYPASS_QUANT", "0") == "1" and key.q_type == Q_1X32 and any(
            s.q_dtype_a in (FP8, FP8_FNUZ) for s in raw):
        # fused_moe_2stages: "Debug bypass: skip real quant, feed unit scales" (a1 = hidden_states.to(fp8)).
        warnings.append("AITER_MOE_A8W4_BYPASS_QUANT=1 is a debug switch: the fp8-activation (a8w4/mxfp8) steps cast "
                        "activations to fp8 with unit scales instead of quantizing them — wrong output for real "
                        f"weights ({SRC_FUSED_MOE})")
    hits = (raising_hits(raw, key, env_d) + evaluate_issues(raw, key, version)
            + pad_hazards(raw, key, padding, has_bias=layer.has_bias) + tile_hazards(steps, key, version))
    return DispatchPlan(layer_index=layer.index, steps=steps, key=key, tokens=counts,
                        env=tuple(sorted(env_d.items())), assumptions=a.describe(layer), configs=cs.label,
                        dispatch_model=rules.name, aiter_version=version, warnings=tuple(warnings),
                        issues=hits, warning_confidence=tuple("derived" if i in derived else "confirmed"
                                                              for i in range(len(warnings))),
                        config_origin=cs.origin, config_release=cs.release, rules_source=rules.source)


def _at_least(version: str | None, floor: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version(Version(version).public) >= Version(floor)
    except InvalidVersion:
        return False


def simulate(layer: "MoELayer", caps: "Capabilities", *, tokens: Iterable[int] = DEFAULT_TOKENS,
             env: Mapping[str, str] | None = None, padding: "Padding | None" = None,
             configs: ConfigSet | None = None, assumptions: Assumptions | None = None) -> tuple[DispatchStep, ...]:
    """The grouped dispatch steps of :func:`plan_dispatch` (``[s.to_dict() for s in steps]`` is explain's
    ``aiter_dispatch``)."""
    return plan_dispatch(layer, caps, tokens=tokens, env=env, padding=padding, configs=configs,
                         assumptions=assumptions).steps


def native_inter_dims(layer: "MoELayer", caps: "Capabilities", *, configs: ConfigSet | None = None,
                      assumptions: Assumptions | None = None, env: Mapping[str, str] | None = None) -> frozenset[int]:
    """inter_dim values AITER has tuned rows for at this layer's key (gfx, cu_num, model_dim, experts, topk,
    dtypes, q_type, activation — any token bucket, any activation dtype), in the tuned set for ``caps``.

    MiniMax-M3-MXFP4 at TP8 on MI355X with the HEAD snapshot: ``{384, 768}`` — AITER runs 384 natively, so
    padding it to 512 buys nothing there (it misses the tuned rows instead).
    """
    env_d = aiter_env() if env is None else dict(env)
    cs = configs or _cfg.config_set_for(caps, env_d, model_dims=frozenset({layer.hidden}))
    version = cs.version if cs.origin == "installed" else (caps.aiter_version or cs.version)
    rules = lookup_rules(version)
    key = dispatch_key(layer, caps, assumptions=assumptions, env=env_d, model=rules)
    dims = set()
    for row in cs.rows:
        if row.tag == "flydsl_fallback" and rules.drop_fallback_rows:
            continue
        if rules.gfx_key and row.gfx not in (key.gfx, None):
            continue
        if (row.cu_num, row.model_dim, row.expert, row.topk, row.dtype, row.q_dtype_w, row.q_type,
                row.use_g1u1, row.doweight_stage1) == (key.cu_num, key.model_dim, key.expert, key.topk, key.dtype,
                                                       key.q_dtype_w, key.q_type, key.use_g1u1,
                                                       key.doweight_stage1):
            if not rules.act_wildcard and row.act_type != key.act_type:
                continue
            dims.add(row.inter_dim)
    return frozenset(dims)


# -- known dispatch issues ----------------------------------------------------------------------------------------

_ISSUE_FIELDS = {"id": str, "title": str, "source": str, "status": str, "kernel": str, "effect": str,
                 "workaround": str, "confidence": str, "severity": str}


@memoize(maxsize=1)
def dispatch_issues() -> tuple[DispatchIssue, ...]:
    """capability_db/dispatch_issues.toml, checked at load (a broken entry raises CapabilityDBError naming it)."""
    where = "capability_db/dispatch_issues.toml"
    data = capdb.load_toml("dispatch_issues.toml")
    items = data.get("issue")
    if not isinstance(items, list) or not items:
        raise CapabilityDBError(f"{where}: no [[issue]] entries")
    out = []
    for n, raw in enumerate(items):
        at = f"{where}: issue[{n}]"
        if not isinstance(raw, dict):
            raise CapabilityDBError(f"{at} must be a table")
        for name, kind in _ISSUE_FIELDS.items():
            if not isinstance(raw.get(name), kind):
                raise CapabilityDBError(f"{at} ({raw.get('id', '?')}): {name} must be a string")
        if raw["confidence"] not in ("confirmed", "derived", "unconfirmed"):
            raise CapabilityDBError(f"{at} ({raw['id']}): confidence must be confirmed|derived|unconfirmed")
        if raw["severity"] not in ("error", "warning", "info"):
            raise CapabilityDBError(f"{at} ({raw['id']}): severity must be error|warning|info")
        try:
            re.compile(raw["kernel"])
        except re.error as exc:
            raise CapabilityDBError(f"{at} ({raw['id']}): kernel is not a regular expression: {exc}") from None
        if raw.get("aiter"):
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:
                SpecifierSet(raw["aiter"])
            except InvalidSpecifier:
                raise CapabilityDBError(f"{at} ({raw['id']}): aiter = {raw['aiter']!r} is not a specifier") from None
        if raw.get("pin") not in (None, "neighbour"):
            raise CapabilityDBError(f"{at} ({raw['id']}): pin must be \"neighbour\" (or absent)")
        known = set(DispatchIssue.__dataclass_fields__)
        extra = set(raw) - known
        if extra:
            raise CapabilityDBError(f"{at} ({raw['id']}): unknown key(s) {', '.join(sorted(extra))}")
        values = dict(raw)
        for name in ("buckets", "gfx", "q_dtype_a"):
            if name in values:
                values[name] = tuple(values[name])
        if "shape" in values:
            values["shape"] = tuple(sorted(values["shape"].items()))
        if "workaround_env" in values:
            values["workaround_env"] = tuple(sorted((k, str(v)) for k, v in values["workaround_env"].items()))
        if "k_per_block" in values:
            try:
                values["k_per_block"] = tuple(sorted((int(k), int(v)) for k, v in values["k_per_block"].items()))
            except (AttributeError, ValueError):
                raise CapabilityDBError(f"{at} ({raw['id']}): k_per_block must map block_m to K per block") from None
        try:
            out.append(DispatchIssue(**values))
        except TypeError as exc:
            raise CapabilityDBError(f"{at} ({raw['id']}): {exc}") from None
    return tuple(out)


def _issue_matches(issue: DispatchIssue, step: DispatchStep, key: DispatchKey, version: str | None) -> str | None:
    """The kernel name the issue matches in this (ungrouped) step, or None."""
    if issue.gfx and key.gfx not in issue.gfx:
        return None
    if issue.aiter:
        if version is None:
            return None
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            if not SpecifierSet(issue.aiter).contains(Version(Version(version).public), prereleases=True):
                return None
        except InvalidVersion:
            return None
    if issue.buckets and step.bucket not in issue.buckets:
        return None
    if issue.tokens_min is not None and step.tokens[1] < issue.tokens_min:
        return None
    if issue.tokens_max is not None and step.tokens[0] > issue.tokens_max:
        return None
    if issue.basis and step.basis != issue.basis:
        return None
    if issue.stages and step.stages != issue.stages:
        return None
    if issue.q_type and key.q_type != issue.q_type:
        return None
    if issue.q_dtype_w and key.q_dtype_w != issue.q_dtype_w:
        return None
    if issue.q_dtype_a and step.q_dtype_a not in issue.q_dtype_a:
        return None
    if issue.act_type and key.act_type != issue.act_type:
        return None
    for name, value in issue.shape:
        if getattr(key, name) != value:
            return None
    if issue.inter_dim_multiple_of and key.inter_dim % issue.inter_dim_multiple_of:
        return None
    if issue.inter_dim_not_multiple_of and key.inter_dim % issue.inter_dim_not_multiple_of == 0:
        return None
    if issue.intermediate_pad_min is not None and key.intermediate_pad < issue.intermediate_pad_min:
        return None
    if issue.block_m is not None and step.block_m != issue.block_m:
        return None
    if issue.ep is not None and key.is_ep != issue.ep:
        return None
    if issue.ksplit_min is not None and step.ksplit < issue.ksplit_min:
        return None
    if issue.k_tiles_per_split_max is not None:
        kpb = dict(issue.k_per_block).get(step.block_m or 0)
        if not kpb or step.ksplit < 2 or key.model_dim // (step.ksplit * kpb) > issue.k_tiles_per_split_max:
            return None
    if issue.row_flat is not None and (step.row is not None and step.row.flat >= 1) != issue.row_flat:
        return None
    pattern = re.compile(issue.kernel)
    kernels = step.kernels if issue.stage is None else step.kernels[issue.stage - 1: issue.stage]
    for name in kernels:
        if pattern.search(name):
            return name
    return None


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


def evaluate_issues(steps: Iterable[DispatchStep], key: DispatchKey, aiter_version: str | None,
                    issues: Iterable[DispatchIssue] | None = None) -> tuple[IssueHit, ...]:
    """Known issues hit by the simulated dispatch, one hit per (issue, consecutive token range)."""
    hits: list[IssueHit] = []
    steps = tuple(steps)
    for issue in (dispatch_issues() if issues is None else issues):
        last = -2  # index of the step that made hits[-1]: a range merges only consecutive steps
        for i, step in enumerate(steps):
            name = _issue_matches(issue, step, key, aiter_version)
            if name is None:
                continue
            prev = hits[-1] if hits else None
            if prev and last == i - 1 and prev.issue == issue.id and prev.kernel == name:
                hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
                last = i
                continue
            last = i
            hits.append(IssueHit(issue=issue.id, tokens=step.tokens, bucket=step.bucket, kernel=name,
                                 effect=issue.effect, workaround=issue.workaround,
                                 workaround_env=acting_env(issue.workaround_env, key), token_cap=issue.token_cap,
                                 source=issue.source, confidence=issue.confidence, severity=issue.severity,
                                 fixed_by=issue.fixed_by, raises=issue.raises))
    return tuple(hits)


def raising_hits(steps: Iterable[DispatchStep], key: DispatchKey, env: Mapping[str, str]) -> tuple[IssueHit, ...]:
    """One blocking hit per run of token counts where AITER raises instead of running (DispatchStep.raises)."""
    hits: list[IssueHit] = []
    last = -2  # a range merges only consecutive steps
    for i, s in enumerate(steps):
        if not s.raises:
            continue
        if hits and last == i - 1 and hits[-1].effect.endswith(s.raises):
            prev = hits[-1]
            hits[-1] = replace(prev, tokens=(prev.tokens[0], s.tokens[1]))
            last = i
            continue
        last = i
        workaround, wenv = "none known for this configuration", ()
        if "SiTUv2" in s.raises:
            # Not an env workaround: it changes the activation numerics (fp8 instead of the checkpoint's bf16).
            workaround = ("AITER_SITUV2_A8W4=1 runs SiTUv2 with fp8 activations (AITER's a8w4 rows), which none of "
                          "these refusals apply to — a different numerics than the checkpoint's bf16 activations")
        elif "AITER_BYPASS_TUNE_CONFIG" in s.raises:
            workaround = "unset AITER_BYPASS_TUNE_CONFIG (the tuned Opus row runs)"
        elif "expert-parallel" in s.raises:
            workaround = "no expert parallelism for this layer (TP only), or a tuned set without flydsl_mxmoe rows"
        elif "flydsl is not importable" in s.raises:
            workaround = "install the flydsl AITER pins (the row's FlyDSL kernels then run)"
        hits.append(IssueHit(issue="aiter-raises", tokens=s.tokens, bucket=s.bucket,
                             kernel=" + ".join(s.kernels) or "no kernel", effect="AITER refuses this call: "
                             + s.raises, workaround=workaround, workaround_env=wenv, token_cap=None,
                             source=SRC_FUSED_MOE, confidence="confirmed", severity="error", raises=True))
    return tuple(hits)


def pad_hazards(steps: Iterable[DispatchStep], key: DispatchKey, padding: "Padding | None", *,
                has_bias: bool = False) -> tuple[IssueHit, ...]:
    """Steps whose kernels would read padded weights the plan does not make safe.

    * ASM and classic CK take no pad arguments and compute over the padded extent: pad regions must be zero
      (https://github.com/ROCm/aiter/issues/5413).
    * FlyDSL drops the pads when a bias is passed (FM ``_get_padding_for_flydsl`` returns (0, 0)): same.
    * CK-Tile skips whole granules only (``intermediate_pad // 64 * 64``, ``hidden_pad // 128 * 128`` in FM): a
      remainder is computed over, so it must be zero.
    """
    if padding is None or padding.zero_fill:
        return ()
    ipad, hpad = padding.kernel_intermediate_pad, padding.kernel_hidden_pad
    apad_i, apad_h = padding.intermediate_pad, padding.hidden_pad
    if not (apad_i or apad_h):
        return ()
    hits: list[IssueHit] = []
    last = -2  # a range merges only consecutive steps
    for i, step in enumerate(steps):
        fams = set(step.family.split("+"))
        why = None
        if fams & {"ck", "asm"}:
            why = ("ASM/CK kernels take no pad arguments and compute over the padded extent, so the pad regions must "
                   "be zero", "https://github.com/ROCm/aiter/issues/5413")
        elif "flydsl" in fams and has_bias and (ipad or hpad):
            why = ("FlyDSL drops the pad arguments when a bias is passed and computes over the padded extent",
                   f"{SRC_FUSED_MOE} (_get_padding_for_flydsl)")
        elif "cktile" in fams and (ipad % 64 or hpad % 128 or ipad < apad_i or hpad < apad_h):
            why = ("CK-Tile skips only whole 64-wide N / 128-wide K granules of the pads it is given; the rest is "
                   "computed over", f"{SRC_FUSED_MOE} (cktile_moe_stage1/2 n_pad_zeros, k_pad_zeros)")
        elif "flydsl" in fams and (ipad < apad_i or hpad < apad_h):
            why = ("FlyDSL skips only the pads it is passed (inter_dim_pad/model_dim_pad); the rest is computed over",
                   f"{SRC_FUSED_MOE} (_flydsl_stage1_wrapper)")
        if why is None:
            continue
        prev = hits[-1] if hits else None
        if prev and last == i - 1 and prev.issue == "pad-not-zeroed" and prev.effect.startswith(why[0]):
            hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
            last = i
            continue
        last = i
        hits.append(IssueHit(issue="pad-not-zeroed", tokens=step.tokens, bucket=step.bucket,
                             kernel=" + ".join(step.kernels), effect=why[0] + "; the plan does not zero-fill them",
                             workaround="allocate the padded weights (and scales) with zeros", workaround_env=(),
                             token_cap=None, source=why[1], confidence="derived", severity="error"))
    return tuple(hits)


#: FlyDSL kernel names carry their tile: ``flydsl_moe{stage}_a{act}_w{weight}_…_t{tile_m}x{tile_n}x{tile_k}``.
_FLYDSL_TILE = re.compile(r"^flydsl_moe([12])_a([a-z0-9]+)_w([a-z0-9]+)_.*?_t(\d+)x(\d+)x(\d+)")
#: FlyDSL's tile constraints, in AITER's own words: stage 1's gate/up (N) tile must divide inter_dim for bf16/fp8
#: activations × fp4 weights ("a4w4 is unaffected"), stage 2's K tile must divide inter_dim, else "OOB -> wrong output
#: or memfault"; from v0.1.19 both are downgraded to 128 at launch where 128 divides. The model_dim axes (stage-1 K,
#: stage-2 N) must be divided by their tiles as well (the same file's tile-alignment notes).
FLYDSL_TILE_SOURCE = ("ROCm/aiter@v0.1.19:aiter/ops/flydsl/moe_kernels.py (flydsl_moe_stage1: 'The gate/up (N) axis "
                      "tile must divide inter_dim … Applies to both a16w4 and a8w4; a4w4 is unaffected'; "
                      "resolve_flydsl_stage1_tile_n, resolve_flydsl_stage2_tile_k: 256 if inter_dim % 256 == 0 else "
                      "128; the gfx1250 MXScale shape-alignment notes); ROCm/aiter#4397")
FLYDSL_TILE_RESOLVE_SINCE = "0.1.19"


def flydsl_tile(name: str) -> tuple[int, int, int, int] | None:
    """(stage, tile_m, tile_n, tile_k) of a FlyDSL MoE kernel name, or None for any other kernel."""
    m = _FLYDSL_TILE.match(name)
    return (int(m.group(1)), int(m.group(4)), int(m.group(5)), int(m.group(6))) if m else None


def tile_misfit(name: str, inter_dim: int, model_dim: int, version: str | None) -> tuple[str | None, str | None]:
    """(problem, note) of running FlyDSL kernel ``name`` on an allocation of ``inter_dim`` × ``model_dim``.

    problem: a tile that does not divide its axis and that this AITER does not resolve — the kernel reads out of
    bounds. note: AITER >= 0.1.19 replaces an inter_dim tile that does not divide by 128 where 128 divides (it runs,
    with another tile than the row names). (None, None) for a kernel that tiles the shape or is not FlyDSL.
    """
    m = _FLYDSL_TILE.match(name)
    if m is None:
        return None, None
    stage, act, weight = int(m.group(1)), m.group(2), m.group(3)
    tn, tk = int(m.group(5)), int(m.group(6))
    inter_tile, dim_tile = (tn, tk) if stage == 1 else (tk, tn)
    axis, other = ("tile_n", "tile_k") if stage == 1 else ("tile_k", "tile_n")
    if model_dim % dim_tile:
        return f"stage-{stage} {other} {dim_tile} does not divide model_dim {model_dim}", None
    if stage == 1 and not (weight == "fp4" and act in ("bf16", "fp8")):
        return None, None  # AITER: the stage-1 N-tile constraint is a16w4/a8w4's; "a4w4 is unaffected"
    # A gate/up-interleaved (_gui) stage 1 tiles N over both halves, 2 × inter_dim (derived: AITER's tuner measured
    # 0.0% error for t…x256x… _gui_ kernels at inter_dim 384 in ROCm/aiter@v0.1.18:aiter/configs/model_configs/
    # dsv4_fp8fp4_tuned_fmoe.csv, before the 0.1.19 downgrade existed).
    extent = 2 * inter_dim if stage == 1 and "_gui" in name else inter_dim
    if extent % inter_tile == 0:
        return None, None
    if _at_least(version, FLYDSL_TILE_RESOLVE_SINCE) and inter_dim % 128 == 0:
        return None, (f"{name}: AITER {version} runs it with {axis} 128 (its {axis} {inter_tile} does not divide "
                      f"inter_dim {inter_dim})")
    return f"stage-{stage} {axis} {inter_tile} does not divide inter_dim {inter_dim}", None


def tile_hazards(steps: Iterable[DispatchStep], key: DispatchKey, version: str | None) -> tuple[IssueHit, ...]:
    """Steps whose FlyDSL kernels cannot tile the allocated shape (``key.inter_dim`` × ``key.model_dim``): AITER's
    own comment says such a tile reads out of bounds ("wrong output or memfault"). Blocking: the only fix is an
    allocation the tiles divide."""
    hits: list[IssueHit] = []
    for step in steps:
        problems = [p for k in step.kernels for p in [tile_misfit(k, key.inter_dim, key.model_dim, version)[0]] if p]
        if not problems:
            continue
        prev = hits[-1] if hits else None
        effect = ("FlyDSL kernel tile does not fit the allocation (" + "; ".join(problems)
                  + "): the kernel reads out of bounds — wrong output or a memory fault")
        if prev and prev.effect == effect and prev.tokens[1] < step.tokens[0]:
            hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
            continue
        hits.append(IssueHit(issue="flydsl-tile", tokens=step.tokens, bucket=step.bucket,
                             kernel=" + ".join(step.kernels), effect=effect,
                             workaround="", workaround_env=(), token_cap=None, source=FLYDSL_TILE_SOURCE,
                             confidence="confirmed", severity="error"))
    return tuple(hits)


# -- the dedicated FHMoE table (aiter/fhmoe.py) -------------------------------------------------------------------

def _fhmoe_rows(path: str | None = None) -> list[dict[str, str]]:
    """The FHMoE table's rows as AITER's CSV spells them: ``path`` (a CSV) when given, else moedispatch's derived
    ``capability_db/aiter_fhmoe.toml`` (main @ e4048607; see ``scripts/build_aiter_index.py --fhmoe``)."""
    if path is None:
        doc = capdb.load_toml("aiter_fhmoe.toml")
        key = {k: str(v) for k, v in doc["key"].items()}
        return [{**key, **{k: str(v) for k, v in row.items() if k != "line"}} for row in doc["row"]]
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError:
        return []


def fhmoe_lookup(token: int, *, model_dim: int = 7168, inter_dim: int = 384, expert: int = 385, topk: int = 7,
                 hidden_pad: int = 0, intermediate_pad: int = 0, gate_mode: str = "interleave",
                 doweight_stage1: bool = False, q_dtype_a: str = FP8, q_dtype_w: str = FP4, gfx: str = "gfx950",
                 cu_num: int = 256, env: Mapping[str, str] | None = None, path: str | None = None
                 ) -> tuple[str, str] | None:
    """``get_2stage_cfgs(config_file=tuned_fhmoe.csv)``: the exact-bucket row's (kernelName1, kernelName2), or None
    where AITER raises ``NotImplementedError('The dedicated FHMoE path requires an exact tuned config row …')``
    (a missing bucket, a duplicate row, or ``AITER_BYPASS_TUNE_CONFIG``). Keys add (shared_expert_id = expert - 1,
    hidden_pad, intermediate_pad, gate_mode) and match the activation as a string (Silu)."""
    if _env_int(dict(env or {}), "AITER_BYPASS_TUNE_CONFIG", 0):
        return None
    gm = "GateMode.INTERLEAVE" if gate_mode == "interleave" else "GateMode.SEPARATED"
    want = {"gfx": gfx, "cu_num": str(cu_num), "token": str(token), "model_dim": str(model_dim),
            "inter_dim": str(inter_dim), "expert": str(expert), "topk": str(topk),
            "shared_expert_id": str(expert - 1), "act_type": SILU, "dtype": BF16, "q_dtype_a": q_dtype_a,
            "q_dtype_w": q_dtype_w, "q_type": Q_1X32, "use_g1u1": "1", "doweight_stage1": str(int(doweight_stage1)),
            "hidden_pad": str(hidden_pad), "intermediate_pad": str(intermediate_pad), "gate_mode": gm}
    rows = _fhmoe_rows(path)
    keys = [tuple(r.get(c, "") for c in want) for r in rows]
    if len(set(keys)) != len(keys):
        return None  # "Duplicate dedicated FHMoE rows"
    for r in rows:
        if all(r.get(c, "").strip() == v for c, v in want.items()):
            return r["kernelName1"], r["kernelName2"]
    return None


def fhmoe_supports(max_tokens: Any, *, env: Mapping[str, str] | None = None, path: str | None = None) -> bool:
    """``aiter.fhmoe.supports_dsv4_i384_fhmoe``: the FHMoE table covers every padded M up to ``max_tokens``."""
    if type(max_tokens) is not int or max_tokens <= 0:
        return False
    required = {get_padded_M(1 << e) for e in range(max_tokens.bit_length())} | {get_padded_M(max_tokens)}
    return all(fhmoe_lookup(t, env=env, path=path) is not None for t in required)


def fhmoe_config_scope(token_num: int, *, model_dim: int, inter_dim: int, experts: int, topk: int, hidden_pad: int,
                       intermediate_pad: int, gate_mode: str, doweight_stage1: bool,
                       env: Mapping[str, str] | None = None, path: str | None = None) -> bool:
    """``aiter.fhmoe._uses_dsv4_fhmoe_config``: the DSv4 i384 contract and a table covering ``token_num``."""
    return ((model_dim, inter_dim, experts, topk) == (7168, 384, 385, 7) and hidden_pad == 0
            and intermediate_pad == 0 and gate_mode == "interleave" and not doweight_stage1
            and fhmoe_supports(token_num, env=env, path=path))


# -- AITER's INFO line -------------------------------------------------------------------------------------------

_INFO = re.compile(r"\[fused_moe\] using (?P<stages>1stage|2stage)(?P<xbf16> xbf16)? (?P<what>default|\(.*?\)) "
                   r"for \((?P<key>.*)\)")


def parse_info_line(line: str) -> dict[str, Any] | None:
    """Parse AITER's ``[fused_moe] using … for (...)`` log line into stages, kernel names and the key values."""
    m = _INFO.search(line)
    if not m:
        return None
    what = m.group("what")
    kernels: tuple[str, ...] = ()
    if what != "default":
        names = re.findall(r"kernelName\d=(?:'([^']*)'|(nan|None))", what)
        kernels = tuple(a for a, _b in names if a)
    parts = [p.strip().strip("'\"") for p in m.group("key").split(",")]
    return {"stages": 1 if m.group("stages") == "1stage" else 2, "xbf16": bool(m.group("xbf16")),
            "default": what == "default", "kernels": kernels, "key": tuple(parts)}

