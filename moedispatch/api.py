"""The engine API: ``select_moe_backend()`` for an inference engine building a FusedMoE layer.

Probes once per process when no capabilities are given (falling back to the capability_db default target with a
warning when no GPU is found), caches decisions, and is thread-safe: the registry and probe are loaded under a
lock; ``select`` is a pure cached function of frozen inputs.
"""

from __future__ import annotations

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
from moedispatch.core.workload import Runtime
from moedispatch.core.decision import Decision
from moedispatch.selector.pure import select

from moedispatch.probe.targets import (cli_aiter_version, default_target_warning,  # noqa: F401 - API
                                       installed_aiter_warning, resolve_capabilities)
from moedispatch.plan.plan import plan_model as _plan
from moedispatch.selector import plugins
from moedispatch.core.errors import ModelError
from moedispatch.core.layers import QuantSpec
from moedispatch.sources.models import ModelSpec, load_model
from moedispatch.sources.quant import parse_quantization_config

__all__ = ["select_moe_backend", "plan_model", "default_capabilities", "resolve_capabilities", "target"]

log = get_logger(__name__)

_lock = threading.Lock()
_caps: Capabilities | None = None


def target(name: str, aiter_version: str | None = None) -> Capabilities:
    """Capabilities of a simulated target, as ``--target`` builds them: a product or arch, optionally one compute
    partition (``"MI300X"``, ``"gfx950"``, ``"MI355X:CPX"``), with the AITER release planned for (default: the newest
    capability_db knows). A name capability_db does not know raises :class:`TargetError` (with a did-you-mean)."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"target(): expected a product or arch name such as 'MI300X' or 'gfx950', got {name!r}")
    return capdb.target_capabilities(name, aiter_version)


def _quant_from_engine(fields: dict[str, Any]) -> dict[str, Any]:
    """``quant_config=`` as an engine holds it — the checkpoint's quantization_config dict, or vLLM/SGLang's config
    object (``weight_block_size``, ``activation_scheme``, ``get_name()``) — read into ``weight_quant`` /
    ``activation_quant`` QuantSpecs (an FP8 block size is kept: block128x128 weights, group128 activations). A
    ``weight_quant`` label given too must agree with it; an unreadable config is a one-line UsageError."""
    qc = fields.pop("quant_config", None)
    if qc is None:
        return fields
    if not isinstance(qc, dict):  # an engine's QuantizationConfig object
        name = qc.get_name() if callable(getattr(qc, "get_name", None)) else getattr(qc, "quant_method", None)
        qc = {k: getattr(qc, k) for k in ("weight_block_size", "activation_scheme", "fmt") if
              getattr(qc, k, None) is not None} | ({"quant_method": str(name)} if name else {})
    qc = dict(qc)
    label = fields.get("weight_quant")
    if "quant_method" not in qc and isinstance(label, str):
        qc["quant_method"] = label
    if isinstance(qc.get("weight_block_size"), tuple):
        qc["weight_block_size"] = list(qc["weight_block_size"])
    try:
        scheme = parse_quantization_config(qc, "quant_config")
    except ModelError as exc:
        raise UsageError(f"select_moe_backend(): {exc}") from None
    if scheme is None:
        return fields
    if isinstance(label, str) and QuantSpec.parse(label).dtype != scheme.weight.dtype:
        raise UsageError(f"select_moe_backend(): weight_quant={label!r} disagrees with quant_config "
                         f"({scheme.method}: {scheme.weight.dtype} weights)")
    if fields.get("weight_granularity") not in (None, scheme.weight.granularity):
        raise UsageError(f"select_moe_backend(): weight_granularity={fields['weight_granularity']!r} disagrees with "
                         f"quant_config ({scheme.weight.granularity})")
    out = {k: v for k, v in fields.items() if k not in ("weight_granularity", "activation_granularity")}
    out["weight_quant"] = scheme.weight
    out.setdefault("activation_quant", scheme.act)
    if isinstance(out["activation_quant"], str):
        out["activation_quant"] = QuantSpec.parse(out["activation_quant"], dynamic=True,
                                                  granularity=fields.get("activation_granularity")
                                                  or scheme.act.granularity)
    return out


def _as_caps(caps: Any) -> Capabilities:
    """``caps=`` as given to the engine API: Capabilities, or a target name (``"MI300X"``)."""
    if isinstance(caps, Capabilities):
        return caps
    if isinstance(caps, str):
        return target(caps)
    raise UsageError(f"caps must be Capabilities (moedispatch.target('MI300X')) or a target name such as 'MI300X', "
                     f"got {type(caps).__name__}")


def default_capabilities() -> Capabilities:
    """Probe once per process (thread-safe); with no GPU, the DB default target and a logged warning. The AITER
    planned for is explain's (``MOEDISPATCH_AITER_VERSION``, else the one installed in this Python), so the engine
    and the CLI never disagree."""
    global _caps
    with _lock:
        if _caps is None:
            caps, line = resolve_capabilities(None, cli_aiter_version(None))
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
    caps = (_caps if _caps is not None else default_capabilities()) if caps is None else _as_caps(caps)
    registry = _registry(strict)
    if layer is not None:
        if layer_fields:
            raise UsageError("select_moe_backend(): pass either layer= or layer fields, not both")
        return _with_target_warning(select(layer, caps, registry.backends, force, strict=strict,
                                           runtime=_runtime()), caps)
    # Fast path: an engine asks with the same raw values for every layer of a model; key on them (and on the
    # identity of caps and registry) before building and hashing a MoELayer. The key holds each value's type: 4096.0
    # == 4096 and True == 1 hash alike, and a value the normal path rejects must not hit a cached Decision.
    try:
        key = (tuple((k, type(v), v) for k, v in layer_fields.items()), force, strict)
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
    layer = _layer_from_fields(_quant_from_engine(dict(layer_fields)))
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
    caps = default_capabilities() if caps is None else _as_caps(caps)
    registry = plugins.get_registry(strict=strict)
    return _plan(spec, caps, tp, ep, backends=registry.backends, force=force, strict=strict,
                 warnings=default_target_warning(caps) + tuple(f"plugin error: {e}" for e in registry.errors)
                 + tuple(registry.warnings) + installed_aiter_warning(caps),
                 runtime=Runtime.build(tokens, overrides=aiter_env))
