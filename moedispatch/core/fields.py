"""Normalise the layer fields an engine passes to ``select_moe_backend()`` into a :class:`MoELayer`.

vLLM's and SGLang's FusedMoE spell the same values differently; the aliases map them, the constructor arguments
that do not change which kernel is correct are accepted and ignored, anything else is a one-line UsageError.
"""

from __future__ import annotations

from typing import Any

from moedispatch._util.suggest import did_you_mean
from moedispatch.core.errors import UsageError
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.core.layers import integer, moe_tp_size

__all__ = ["normalize_fields", "layer_from_fields"]

# Names engines use for the same values (vLLM FusedMoE / FusedMoEConfig, SGLang FusedMoE).
_ALIASES = {
    "hidden_dim": "hidden_size",
    "num_local_experts": "num_experts",
    "global_num_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "experts": "num_experts",
    "topk": "top_k",
    "num_experts_per_tok": "top_k",
    "experts_per_token": "top_k",
    "tp": "tp_size",
    "ep": "ep_size",
    "moe_intermediate_size": "intermediate_size",
    "bias": "has_bias",
    "activation_fn": "activation",
    "hidden_act": "activation",
    "model_name": "model",
}
_FIELDS = {"quant_config", "hidden_size", "intermediate_size", "num_experts", "top_k", "tp_size", "ep_size", "weight_quant",
           "activation_quant", "activation", "has_bias", "model", "weight_granularity", "activation_granularity",
           "activation_params", "model_type", "swiglu_alpha", "swiglu_limit", "index"}

# What vLLM's FusedMoE / SGLang's FusedMoE also receive that does not change which kernel is correct: accepted so an
# engine can pass its constructor arguments through unchanged (vllm fused_moe/layer.py FusedMoE.__init__).
_IGNORED = {"params_dtype", "dp_size", "pcp_size", "renormalize", "prefix", "use_grouped_topk", "num_expert_group",
            "topk_group", "scoring_func", "routed_scaling_factor", "e_score_correction_bias",
            "custom_routing_function", "reduce_results", "apply_router_weight_on_input",
            "enable_eplb", "num_redundant_experts", "is_act_and_mul", "layer_id", "is_sequence_parallel",
            "router_logits_dtype", "zero_expert_num", "zero_expert_type", "n_shared_experts", "routing_method_type",
            # The checkpoint's quantization_config.quant_method: engine_choice() routes MX checkpoints by it; which
            # kernel is correct does not depend on it.
            "quant_method"}


def normalize_fields(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fields = dict(fields)
    per_partition = fields.pop("intermediate_size_per_partition", None)
    for key, value in fields.items():
        if key in _IGNORED:
            continue
        name = _ALIASES.get(key, key)
        if name not in _FIELDS:
            raise UsageError(f"select_moe_backend() got an unknown layer field {key!r}"
                             f"{did_you_mean(key, (*_FIELDS, *_ALIASES))}")
        if name in out and out[name] != value:
            raise UsageError(f"select_moe_backend(): {key!r} conflicts with another alias of {name!r}")
        out[name] = value
    if per_partition is not None:
        # vLLM's FusedMoE holds the per-rank size; the full size is per-rank × MoE TP degree.
        sizes = (("intermediate_size_per_partition", per_partition), ("tp_size", out.get("tp_size", 1)),
                 ("ep_size", out.get("ep_size", 1)))
        per_partition, tp, ep = (integer(f"select_moe_backend(): {name}", value) for name, value in sizes)
        full = per_partition * moe_tp_size(tp, ep)
        if out.setdefault("intermediate_size", full) != full:
            raise UsageError(f"select_moe_backend(): intermediate_size {out['intermediate_size']} disagrees with "
                             f"intermediate_size_per_partition {per_partition} at this tp/ep")
    return out


def layer_from_fields(fields: dict[str, Any]) -> MoELayer:
    f = normalize_fields(fields)
    missing = [k for k in ("hidden_size", "intermediate_size", "num_experts", "top_k") if k not in f]
    if missing:
        raise UsageError(f"select_moe_backend() needs {', '.join(missing)} (or pass layer=MoELayer)")
    weight = f.get("weight_quant", "bf16")
    act = f.get("activation_quant", weight if isinstance(weight, str) and weight in ("bf16", "fp16") else "bf16")
    weight_q = QuantSpec.parse(weight, granularity=f.get("weight_granularity"))
    act_q = QuantSpec.parse(act, granularity=f.get("activation_granularity"), dynamic=True)
    params = dict(f.get("activation_params") or {})
    if "swiglu_alpha" in f:
        params["alpha"] = float(f["swiglu_alpha"])
    if "swiglu_limit" in f:
        params["limit"] = float(f["swiglu_limit"])
    activation = str(f.get("activation", "silu")).lower()
    if activation.startswith("swigluoai"):
        params.setdefault("alpha", 1.702)
        params.setdefault("limit", 7.0)
    has_bias = f.get("has_bias", False)
    if not isinstance(has_bias, bool):  # bool("false") is True: never guess
        raise UsageError(f"select_moe_backend(): has_bias must be True or False, got {has_bias!r}")
    return MoELayer.build(  # build() rejects a non-integer size or degree (8.7 is not truncated to 8)
        index=f.get("index", 0), hidden=f["hidden_size"], intermediate=f["intermediate_size"],
        experts=f["num_experts"], top_k=f["top_k"], tp=f.get("tp_size", 1), ep=f.get("ep_size", 1),
        activation=activation, activation_params=params, has_bias=has_bias,
        weight=weight_q, act=act_q, model=str(f.get("model", "")), model_type=str(f.get("model_type", "")),
    )


