"""The engine API: ``select_moe_backend()`` for an inference engine building a FusedMoE layer.

Probes once per process when no capabilities are given (falling back to the capability_db default target with a
warning when no GPU is found), caches decisions, and is thread-safe: the registry and probe are loaded under a
lock; ``select`` is a pure cached function of frozen inputs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from moedispatch.data import capdb
from moedispatch._util.log import get_logger
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import NoBackendError, UsageError
from moedispatch.core.fields import layer_from_fields as _layer_from_fields
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.selector.runtime import Runtime
from moedispatch.core.decision import Decision
from moedispatch.selector.pure import select

__all__ = ["select_moe_backend", "plan_model", "default_capabilities", "resolve_capabilities"]

log = get_logger(__name__)

_lock = threading.Lock()
_caps: Capabilities | None = None


def resolve_capabilities(target: str | None = None, aiter_version: str | None = None) -> tuple[Capabilities, str | None]:
    """Capabilities for explain/engines: flags, else ``MOEDISPATCH_TARGET``, else the probe, else the DB default.

    Returns ``(caps, first_line)`` where ``first_line`` announces a default target (None otherwise).
    ``aiter_version="installed"`` plans for the AITER installed in this Python (read from its files, never
    imported): its version and its own tuned CSVs.
    """
    env_target = os.environ.get("MOEDISPATCH_TARGET") or None
    aiter_source = "flag"
    if aiter_version is not None and aiter_version.strip().lower() == "installed":
        from moedispatch.data.aiter_configs import installed_aiter

        version, pkg = installed_aiter()
        if version is None or pkg is None:
            raise UsageError("--aiter-version installed: no AITER (PyPI/ROCm distribution amd-aiter) is installed in "
                             "this Python environment")
        aiter_version, aiter_source = version, "installed"
    if target is not None:
        return capdb.target_capabilities(target, aiter_version, aiter_source=aiter_source), None
    if env_target is not None:
        from moedispatch.core.errors import TargetError

        try:
            return capdb.target_capabilities(env_target, aiter_version, target_source="env",
                                             aiter_source=aiter_source), None
        except TargetError as exc:
            raise TargetError(f"MOEDISPATCH_TARGET={env_target!r}: {exc}") from None
    from moedispatch.probe.system import capabilities_from_probe, probe

    caps = capabilities_from_probe(probe(), aiter_version=aiter_version)
    if caps is not None:
        return caps, None
    caps = capdb.target_capabilities(None, aiter_version, aiter_source=aiter_source)
    if aiter_version is None:
        aiter = f"AITER {caps.aiter_version} (the newest in capability_db)"
    elif aiter_source == "installed":
        aiter = f"AITER {caps.aiter_version} (installed in this Python)"
    else:
        aiter = f"AITER {caps.aiter_version} (--aiter-version)" if caps.aiter_version else "no AITER (--aiter-version)"
    line = (f"No AMD GPU found; using the default target {caps.gfx} ({caps.product}) with {aiter} "
            f"(pass --target or set MOEDISPATCH_TARGET to choose)")
    return caps, line


def cli_aiter_version(flag: str | None) -> str | None:
    """The AITER version the CLI plans for: ``--aiter-version`` when given, else ``MOEDISPATCH_AITER_VERSION``
    (``default`` = the newest capability_db knows), else ``installed`` when an AITER is installed in this Python and
    ``MOEDISPATCH_TARGET`` does not say otherwise (DESIGN.md: the installed AITER is the default), else None."""
    if flag is not None:
        return flag
    env = (os.environ.get("MOEDISPATCH_AITER_VERSION") or "").strip()
    if env:
        return None if env.lower() == "default" else env
    if os.environ.get("MOEDISPATCH_TARGET"):
        return None
    from moedispatch.data.aiter_configs import installed_aiter

    version, pkg = installed_aiter()
    return "installed" if version is not None and pkg is not None else None


def installed_aiter_warning(caps: Capabilities) -> tuple[Reason, ...]:
    """When an AITER is installed here but the plan assumes another version, say so (never silently)."""
    if caps.source_of("aiter_version") in ("installed", "probe") or caps.source == "probe":
        return ()
    from moedispatch.data.aiter_configs import installed_aiter

    version, pkg = installed_aiter()
    if version is None or pkg is None or version == caps.aiter_version:
        return ()
    planned = f"AITER {caps.aiter_version}" if caps.aiter_version else "no AITER"
    return (Reason(f"amd-aiter {version} is installed in this Python ({pkg}) but the plan assumes {planned}; pass "
                   "--aiter-version installed to plan for the installed AITER and its own tuned CSVs", "warning"),)


#: ``Reason.issue`` of the default-target warning (consumers filter on it, never on its text).
DEFAULT_TARGET = "default-target"


def _default_target_warning(caps: Capabilities) -> tuple[Reason, ...]:
    """The warning every plan/decision made for the capability_db default target carries (no GPU was found)."""
    if caps.source != "default":
        return ()
    aiter = f"AITER {caps.aiter_version}" if caps.aiter_version else "no AITER"
    return (Reason(f"no AMD GPU found: planned for the default target {caps.gfx} ({caps.product}) with {aiter}; pass "
                   "caps= / --target or set MOEDISPATCH_TARGET for the GPU you deploy on", "warning",
                   issue=DEFAULT_TARGET),)


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
    extra = _default_target_warning(caps)
    if not extra:
        return decision
    from dataclasses import replace

    return replace(decision, warnings=decision.warnings + extra)


# id(caps) -> (caps, registry, {(raw fields, force, strict): Decision | NoBackendError}); the stored caps/registry
# objects keep the ids valid and are compared by identity, so a new registry (reset_registry) or caps starts over.
_fast: dict[int, tuple[Capabilities, Any, dict]] = {}


def _remember(memo: dict, key: tuple, value: Any) -> None:
    if len(memo) >= 4096:
        memo.clear()
    memo[key] = value


def _registry(strict: bool) -> Any:
    from moedispatch.selector.plugins import get_registry

    return get_registry(strict=strict)


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
    from moedispatch.plan.plan import plan_model as _plan
    from moedispatch.sources.models import ModelSpec, load_model
    from moedispatch.selector.plugins import get_registry

    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if caps is None:
        caps = default_capabilities()
    registry = get_registry(strict=strict)
    return _plan(spec, caps, tp, ep, backends=registry.backends, force=force, strict=strict,
                 warnings=_default_target_warning(caps) + tuple(f"plugin error: {e}" for e in registry.errors)
                 + tuple(registry.warnings) + installed_aiter_warning(caps),
                 runtime=Runtime.build(tokens, overrides=aiter_env))
