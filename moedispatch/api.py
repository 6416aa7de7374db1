"""The engine API: ``select_moe_backend()`` for an inference engine building a FusedMoE layer.

Probes once per process when no capabilities are given (falling back to the capability_db default target with a
warning when no GPU is found), caches decisions, and is thread-safe: the registry and probe are loaded under a
lock; ``select`` is a pure cached function of frozen inputs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from moedispatch._util.caches import register
from moedispatch.data import capdb
from moedispatch._util.log import get_logger
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import UsageError
from moedispatch.core.decision import NoBackendError
from moedispatch.core.fields import layer_from_fields as _layer_from_fields
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.core.workload import Runtime
from moedispatch.core.decision import Decision
from moedispatch.selector.pure import select

from moedispatch.probe.targets import (default_target_warning, installed_aiter_warning,  # noqa: F401 - API
                                       resolve_capabilities)
from moedispatch.plan.plan import plan_model as _plan
from moedispatch.selector import plugins
from moedispatch.sources.models import ModelSpec, load_model

__all__ = ["select_moe_backend", "plan_model", "default_capabilities", "resolve_capabilities"]

log = get_logger(__name__)

_lock = threading.Lock()
_caps: Capabilities | None = None


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
        return _with_target_warning(select(layer, caps, registry.backends, force, strict=strict,
                                           runtime=_runtime()), caps)
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
        decision = _with_target_warning(select(layer, caps, registry.backends, force, strict=strict,
                                               runtime=_runtime()), caps)
    except NoBackendError as exc:
        if key is not None:
            _remember(memo[2], key, exc)
        raise
    if key is not None:
        _remember(memo[2], key, decision)
    return decision


_runtime_once: list[Runtime] = []


def _runtime() -> Runtime:
    """The engine API's run-time assumptions: default token counts and this process's AITER environment, read once
    per process (an engine's environment is fixed at start-up) so ``to_dict()`` equals explain's layer entry."""
    if not _runtime_once:
        _runtime_once.append(Runtime.build())
    return _runtime_once[0]


def _with_target_warning(decision: Decision, caps: Capabilities) -> Decision:
    extra = default_target_warning(caps)
    if not extra:
        return decision
    from dataclasses import replace

    return replace(decision, warnings=decision.warnings + extra)


# id(caps) -> (caps, registry, {(raw fields, force, strict): Decision | NoBackendError}); the stored caps/registry
# objects keep the ids valid and are compared by identity, so a new registry (reset_registry) or caps starts over.
_fast: dict[int, tuple[Capabilities, Any, dict]] = {}
register(_fast.clear, "engine API decisions")
register(_runtime_once.clear, "engine API run-time assumptions")


def _remember(memo: dict, key: tuple, value: Any) -> None:
    if len(memo) >= 4096:
        memo.clear()
    memo[key] = value


def _registry(strict: bool) -> Any:
    return plugins.get_registry(strict=strict)


def plan_model(model: Any, caps: Capabilities | None = None, tp: int = 1, ep: int = 1, *,
               force: str | None = None, strict: bool = False, tokens: Any = None,
               aiter_env: dict[str, str] | None = None):
    """The whole model's plan (one Decision per layer) with a stable ``fingerprint``.

    Each MoE decision says what AITER's dispatcher runs per token count and the predicted time (``tokens``: the
    counts to plan for, default decode and prefill sizes; ``aiter_env``: AITER variables on top of this process's
    environment) — the same plan ``moedispatch explain`` prints.

    ``model`` is a reference (built-in name, checkpoint folder, config.json) or a ModelSpec. Ranks of a multi-node
    deployment can all-gather ``plan.fingerprint`` and refuse to start when they disagree.
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if caps is None:
        caps = default_capabilities()
    registry = plugins.get_registry(strict=strict)
    return _plan(spec, caps, tp, ep, backends=registry.backends, force=force, strict=strict,
                 warnings=default_target_warning(caps) + tuple(f"plugin error: {e}" for e in registry.errors)
                 + tuple(registry.warnings) + installed_aiter_warning(caps),
                 runtime=Runtime.build(tokens, overrides=aiter_env))
