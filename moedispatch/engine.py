"""The engine API: ``select_moe_backend()`` for an inference engine building a FusedMoE layer.

Probes once per process when no capabilities are given (falling back to the capability_db default target with a
warning when no GPU is found), caches decisions, and is thread-safe: the registry and probe are loaded under a
lock; ``select`` is a pure cached function of frozen inputs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from moedispatch import capdb
from moedispatch._log import get_logger
from moedispatch.capabilities import Capabilities
from moedispatch.errors import NoBackendError, UsageError
from moedispatch.layers import MoELayer, QuantSpec
from moedispatch.selector import Decision, select

__all__ = ["select_moe_backend", "plan_model", "default_capabilities", "resolve_capabilities"]

log = get_logger(__name__)

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
_FIELDS = {"hidden_size", "intermediate_size", "num_experts", "top_k", "tp_size", "ep_size", "weight_quant",
           "activation_quant", "activation", "has_bias", "model", "weight_granularity", "activation_granularity",
           "activation_params", "model_type", "swiglu_alpha", "swiglu_limit", "index"}

_lock = threading.Lock()
_caps: Capabilities | None = None


def resolve_capabilities(target: str | None = None, aiter_version: str | None = None) -> tuple[Capabilities, str | None]:
    """Capabilities for explain/engines: flags, else ``MOEDISPATCH_TARGET``, else the probe, else the DB default.

    Returns ``(caps, first_line)`` where ``first_line`` announces a default target (None otherwise).
    """
    env_target = os.environ.get("MOEDISPATCH_TARGET") or None
    if target is not None:
        return capdb.target_capabilities(target, aiter_version), None
    if env_target is not None:
        return capdb.target_capabilities(env_target, aiter_version, target_source="flag"), None
    from moedispatch.probe import capabilities_from_probe, probe

    caps = capabilities_from_probe(probe(), aiter_version=aiter_version)
    if caps is not None:
        return caps, None
    caps = capdb.target_capabilities(None, aiter_version)
    if aiter_version is None:
        aiter = f"AITER {caps.aiter_version} (the newest in capability_db)"
    else:
        aiter = f"AITER {caps.aiter_version} (--aiter-version)" if caps.aiter_version else "no AITER (--aiter-version)"
    line = (f"No AMD GPU found; using the default target {caps.gfx} ({caps.product}) with {aiter} "
            f"(pass --target or set MOEDISPATCH_TARGET to choose)")
    return caps, line


def default_capabilities() -> Capabilities:
    """Probe once per process (thread-safe); with no GPU, the DB default target and a logged warning."""
    global _caps
    with _lock:
        if _caps is None:
            caps, line = resolve_capabilities()
            if line:
                log.warning("no_gpu_found", message=line)
            _caps = caps
        return _caps


# What vLLM's FusedMoE / SGLang's FusedMoE also receive that does not change which kernel is correct: accepted so an
# engine can pass its constructor arguments through unchanged (vllm fused_moe/layer.py FusedMoE.__init__).
_IGNORED = {"params_dtype", "dp_size", "pcp_size", "renormalize", "prefix", "use_grouped_topk", "num_expert_group",
            "topk_group", "scoring_func", "routed_scaling_factor", "e_score_correction_bias",
            "custom_routing_function", "reduce_results", "quant_config", "apply_router_weight_on_input",
            "enable_eplb", "num_redundant_experts", "is_act_and_mul", "layer_id", "is_sequence_parallel",
            "router_logits_dtype", "zero_expert_num", "zero_expert_type", "n_shared_experts", "routing_method_type"}


def _normalize(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fields = dict(fields)
    per_partition = fields.pop("intermediate_size_per_partition", None)
    for key, value in fields.items():
        if key in _IGNORED:
            continue
        name = _ALIASES.get(key, key)
        if name not in _FIELDS:
            raise UsageError(f"select_moe_backend() got an unknown layer field {key!r}")
        if name in out and out[name] != value:
            raise UsageError(f"select_moe_backend(): {key!r} conflicts with another alias of {name!r}")
        out[name] = value
    if per_partition is not None:
        # vLLM's FusedMoE holds the per-rank size; the full size is per-rank × MoE TP degree.
        from moedispatch.layers import moe_tp_size

        full = per_partition * moe_tp_size(int(out.get("tp_size", 1)), int(out.get("ep_size", 1)))
        if out.setdefault("intermediate_size", full) != full:
            raise UsageError(f"select_moe_backend(): intermediate_size {out['intermediate_size']} disagrees with "
                             f"intermediate_size_per_partition {per_partition} at this tp/ep")
    return out


def _layer_from_fields(fields: dict[str, Any]) -> MoELayer:
    f = _normalize(fields)
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
    return MoELayer.build(
        index=int(f.get("index", 0)), hidden=f["hidden_size"], intermediate=f["intermediate_size"],
        experts=f["num_experts"], top_k=f["top_k"], tp=int(f.get("tp_size", 1)), ep=int(f.get("ep_size", 1)),
        activation=activation, activation_params=params, has_bias=bool(f.get("has_bias", False)),
        weight=weight_q, act=act_q, model=str(f.get("model", "")), model_type=str(f.get("model_type", "")),
    )


def select_moe_backend(
    layer: MoELayer | None = None,
    caps: Capabilities | None = None,
    *,
    force: str | None = None,
    strict: bool = False,
    **layer_fields: Any,
) -> Decision:
    """Select the backend for one FusedMoE layer.

    Pass ``layer`` or the values an engine holds (``hidden_size``, ``intermediate_size`` — the full per-expert
    size —, ``num_experts``, ``top_k``, ``tp_size``, ``ep_size``, ``weight_quant``, ``activation_quant``,
    ``activation``, ``has_bias``, ``model``; optional ``weight_granularity``/``activation_granularity``, defaulting
    to ``group32`` for MX labels and ``tensor`` otherwise; vLLM/SGLang spellings are accepted as aliases).
    ``caps=None`` probes once per process. Raises :class:`NoBackendError` (with the Decision) when nothing is
    correct, or when ``force`` names a backend that fails its checks — never a silent fallback.
    """
    if caps is None:
        caps = _caps if _caps is not None else default_capabilities()
    registry = _registry(strict)
    if layer is not None:
        if layer_fields:
            raise UsageError("select_moe_backend(): pass either layer= or layer fields, not both")
        return select(layer, caps, registry.backends, force, strict=strict)
    # Fast path: an engine asks with the same raw values for every layer of a model; key on them (and on the
    # identity of caps and registry) before building and hashing a MoELayer.
    try:
        key = (tuple(layer_fields.items()), force, strict)
        hash(key)
    except TypeError:  # an unhashable value (e.g. activation_params as a dict): the normal path
        key = None
    if key is not None:
        memo = _fast.get(id(caps))
        if memo is not None and memo[0] is caps and memo[1] is registry:
            hit = memo[2].get(key)
            if hit is not None:
                if type(hit) is NoBackendError:
                    raise NoBackendError(str(hit), hit.decision)
                return hit
        else:
            memo = (caps, registry, {})
            if len(_fast) >= 64:
                _fast.clear()
            _fast[id(caps)] = memo
    layer = _layer_from_fields(layer_fields)
    try:
        decision = select(layer, caps, registry.backends, force, strict=strict)
    except NoBackendError as exc:
        if key is not None:
            _remember(memo[2], key, exc)
        raise
    if key is not None:
        _remember(memo[2], key, decision)
    return decision


# id(caps) -> (caps, registry, {(raw fields, force, strict): Decision | NoBackendError}); the stored caps/registry
# objects keep the ids valid and are compared by identity, so a new registry (reset_registry) or caps starts over.
_fast: dict[int, tuple[Capabilities, Any, dict]] = {}


def _remember(memo: dict, key: tuple, value: Any) -> None:
    if len(memo) >= 4096:
        memo.clear()
    memo[key] = value


def _registry(strict: bool) -> Any:
    from moedispatch.plugins import get_registry

    return get_registry(strict=strict)


def plan_model(model: Any, caps: Capabilities | None = None, tp: int = 1, ep: int = 1, *,
               force: str | None = None, strict: bool = False):
    """The whole model's plan (one Decision per layer) with a stable ``fingerprint``.

    ``model`` is a reference (built-in name, checkpoint folder, config.json) or a ModelSpec. Ranks of a multi-node
    deployment can all-gather ``plan.fingerprint`` and refuse to start when they disagree.
    """
    from moedispatch.explain import plan_model as _plan
    from moedispatch.models import ModelSpec, load_model
    from moedispatch.plugins import get_registry

    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if caps is None:
        caps = default_capabilities()
    registry = get_registry(strict=strict)
    return _plan(spec, caps, tp, ep, backends=registry.backends, force=force, strict=strict,
                 warnings=tuple(f"plugin error: {e}" for e in registry.errors))
