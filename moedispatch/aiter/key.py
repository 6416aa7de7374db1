"""The lookup key AITER builds for a layer: the engine choices it depends on (:class:`Assumptions`: fused shared
expert, EP fake slot, gate/up layout, flydsl, shuffled weights, doweight_stage1), the key's layer-fixed parts
(:class:`DispatchKey`), the weight quantisation as AITER's q_type/q_dtype_w (:func:`_quant`) and
:func:`dispatch_key`, which puts them together under a release's rules."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping

from moedispatch.aiter.env import _env_int
from moedispatch.aiter.rules import Rules, lookup_rules
from moedispatch.aiter.vocab import (_ACT, BF16, FP4, FP8, FP16, I4, I8, Q_1X32, Q_1X128, Q_NO, Q_TENSOR, Q_TOKEN, U32,
                                     _fp8)
from moedispatch.core.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Padding
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer


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
