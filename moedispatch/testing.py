"""Helpers for testing a moedispatch backend plugin without a GPU.

A plugin author checks a backend against tables of layers × simulated targets::

    from moedispatch.testing import assert_backend_contract, fake_capabilities, layer, registered

    LAYERS = [layer(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2),
              layer(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, tp_size=8,
                    weight_quant="fp8")]
    TARGETS = [fake_capabilities("gfx942"), fake_capabilities("gfx950", aiter_version="none")]

    def test_contract():
        assert_backend_contract(AcmeMoE(), LAYERS, TARGETS)

    def test_wins_bf16():
        with registered(moedispatch_acme) as registry:   # built-ins + this plugin, process-wide in the block
            decision = moedispatch.select_moe_backend(LAYERS[0], TARGETS[0])
        assert decision.backend == "acme-moe"

Nothing here imports torch, probes a device or reads entry points of other third-party plugins. With pytest
installed, ``pytest_plugins = ["moedispatch.testing"]`` adds the fixtures ``moedispatch_caps``,
``moedispatch_layer`` and ``moedispatch_clean_env``. See ``docs/plugins.md`` ("Testing a plugin").

.. versionadded:: 0.1
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import re
import threading
import types
from typing import Any, Callable, Iterable, Sequence

from moedispatch.core import hookspecs
from moedispatch.selector import plugins as _plugins
from moedispatch.core.reason import Reason
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.capabilities import Capabilities
from moedispatch.data.capdb import target_capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.selector.plugins import Registry
from moedispatch.core.fields import layer_from_fields as _layer_from_fields

__all__ = [
    "fake_capabilities",
    "layer",
    "registered",
    "RegisteredRegistry",
    "assert_backend_contract",
    "ContractResult",
    "builtin_plugins",
]

_BACKEND_NAME = re.compile(r"^[a-z0-9]+(?:[-_.][a-z0-9]+)*$")
_CAPS_FIELDS = {f.name for f in dataclasses.fields(Capabilities)}
_FROZENSET_FIELDS = {"aiter_features", "aiter_catalog", "tuned_cu_nums"}
_TUPLE_FIELDS = {"packages", "gpus", "provenance", "unknown", "notes"}


# -- targets and layers ----------------------------------------------------------------------------------------

def fake_capabilities(target: str | None = "gfx950", aiter_version: str | None = None, **overrides: Any) -> Capabilities:
    """Capabilities of a simulated target, exactly as ``moedispatch explain --target`` builds them.

    :param target: a gfx name (``gfx942``, ``gfx950``, ``gfx90a``, …) or product (``MI300X``, ``MI355X``);
        ``None`` is the capability_db default target.
    :param aiter_version: the AITER on the target (``"0.1.15.post3"``); ``None`` the newest version capability_db
        knows; ``"none"`` no AITER at all.
    :param overrides: any :class:`~moedispatch.Capabilities` field, replaced after the target is built
        (``native_mx=False``, ``aiter_features={"mxfp4_moe"}``, ``packages={"flydsl": "0.2.0"}``). Sets and
        dicts are frozen so the result stays hashable (the selector caches on it).
    :raises TypeError: for a name that is not a Capabilities field.
    """
    caps = target_capabilities(target, aiter_version)
    if not overrides:
        return caps
    unknown = sorted(set(overrides) - _CAPS_FIELDS)
    if unknown:
        raise TypeError(f"fake_capabilities() got unknown Capabilities field(s) {', '.join(unknown)}; "
                        f"fields are {', '.join(sorted(_CAPS_FIELDS))}")
    fixed: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in _FROZENSET_FIELDS and value is not None and not isinstance(value, frozenset):
            value = frozenset(value)
        elif key in _TUPLE_FIELDS and isinstance(value, dict):
            value = tuple(sorted(value.items()))
        elif key in _TUPLE_FIELDS and not isinstance(value, tuple):
            value = tuple(value)
        fixed[key] = value
    return dataclasses.replace(caps, **fixed)


def layer(**fields: Any) -> MoELayer:
    """A per-rank :class:`~moedispatch.MoELayer` from the fields an engine passes to ``select_moe_backend``.

    Required: ``hidden_size``, ``intermediate_size`` (the full per-expert size), ``num_experts``, ``top_k``.
    Optional: ``tp_size``, ``ep_size`` (they do the sharding), ``weight_quant``, ``activation_quant`` (labels or
    :class:`~moedispatch.QuantSpec`), ``weight_granularity``, ``activation_granularity``, ``activation``
    (``silu``, ``gelu``, ``swigluoai``…), ``swiglu_alpha``, ``swiglu_limit``, ``has_bias``, ``model``,
    ``model_type``, ``index``; vLLM/SGLang spellings (``num_local_experts``, ``topk``…) are accepted too.

    :raises moedispatch.UsageError: for a missing or unknown field, or a shape that does not shard.
    """
    return _layer_from_fields(dict(fields))


# -- registries ------------------------------------------------------------------------------------------------

def builtin_plugins() -> list[tuple[str, Any]]:
    """``(entry-point name, module)`` for each built-in backend plugin (the ``moedispatch`` distribution's own)."""
    found = []
    for ep in md.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if ep.value.split(":")[0].startswith("moedispatch_plugins") or (
                dist is not None and dist.metadata["Name"] == "moedispatch"):
            found.append((ep.name, ep.load()))
    return sorted(found, key=lambda item: item[0])


def _as_plugin(obj: Any) -> tuple[str, Any]:
    """Accept what an author has at hand: a module/object with hookimpls, a Backend, a hook function, a pair."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str):
        return obj
    if isinstance(obj, Backend):
        backend = obj

        @hookspecs.hookimpl
        def register_backends():
            return [backend]

        return backend.name, types.SimpleNamespace(__name__=backend.name, register_backends=register_backends)
    if isinstance(obj, types.FunctionType):
        hook = obj.__name__
        if not hasattr(obj, hookspecs.PROJECT + "_impl"):
            raise TypeError(f"{hook}() is not decorated with @moedispatch.hookimpl")
        name = f"{obj.__module__}.{hook}"
        return name, types.SimpleNamespace(__name__=name, **{hook: obj})
    if isinstance(obj, type):
        raise TypeError(f"registered() got the class {obj.__name__}; pass an instance (a Backend) or a plugin module")
    name = getattr(obj, "__name__", None) or type(obj).__name__
    return str(name), obj


class RegisteredRegistry(Registry):
    """A :class:`~moedispatch.selector.plugins.Registry` that, used as a context manager, is also the process-wide one.

    Inside ``with registered(...) as registry:`` every caller of :func:`moedispatch.selector.plugins.get_registry` —
    ``select_moe_backend``, ``plan_model``, the CLI's ``main()`` run in-process — sees this registry; the previous
    one is restored on exit (also on error). Not for concurrent use from several threads.
    """

    def __enter__(self) -> "RegisteredRegistry":
        strict_cache: dict[bool, Registry] = {self.strict: self}
        given, builtins, entrypoints = self.__dict__["_build_args"]

        def get_registry(*, strict: bool = False, refresh: bool = False) -> Registry:
            if strict not in strict_cache:
                strict_cache[strict] = _build(given, builtins, entrypoints, strict=strict)
            return strict_cache[strict]

        with _stack_lock:
            _stack.append(_plugins.get_registry)
            _plugins.get_registry = get_registry  # type: ignore[assignment]
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with _stack_lock:
            _plugins.get_registry = _stack.pop()  # type: ignore[assignment]


_stack: list[Callable[..., Registry]] = []
_stack_lock = threading.Lock()


def _build(given: list[tuple[str, Any]], builtins: bool, entrypoints: bool, *, strict: bool) -> Registry:
    if entrypoints:
        registry = _plugins.build_registry(given, load_entrypoints=True, strict=strict)
        return registry
    base = builtin_plugins() if builtins else []
    registry = _plugins.build_registry(base + given, load_entrypoints=False, strict=strict)
    # The built-ins came in as inline plugins: give their records the provenance entry points would have.
    names = {name for name, _ in base}
    try:
        version: str | None = md.version("moedispatch")
    except md.PackageNotFoundError:  # pragma: no cover - running from a source tree
        version = None
    records = tuple(dataclasses.replace(p, builtin=True, package="moedispatch", version=version)
                    if p.name in names else p for p in registry.plugins)
    return dataclasses.replace(registry, plugins=records)


def registered(
    *plugins: Any,
    builtins: bool = True,
    entrypoints: bool = False,
    strict: bool = False,
) -> RegisteredRegistry:
    """A registry of the built-in backends plus ``plugins``, built the way moedispatch builds its own.

    Each of ``plugins`` may be a plugin module (or any object) with ``@hookimpl`` functions, a
    :class:`~moedispatch.Backend` instance (wrapped in a one-backend plugin named after it), a bare ``@hookimpl``
    function, or a ``(name, object)`` pair. Errors are isolated exactly as in production: a plugin that raises
    or returns garbage shows up in ``registry.errors`` and ``registry.plugins[i].errors`` (or raises
    :class:`~moedispatch.PluginError` with ``strict=True``).

    Call it for a value, or use it in a ``with`` block to make it the process-wide registry for the block.

    :param builtins: include the built-in backends (default). ``False``: only ``plugins``.
    :param entrypoints: also load every installed ``moedispatch.backends`` entry point, third-party ones included
        (default ``False``: the result does not depend on what else is installed, and an installed copy of the
        plugin under test does not collide with the one passed here).
    :param strict: raise :class:`~moedispatch.PluginError` on the first plugin failure.

    ``MOEDISPATCH_DISABLE_PLUGINS`` and ``MOEDISPATCH_LOAD_PLUGINS`` apply as in production; clear them (the
    ``moedispatch_clean_env`` fixture) for tests that must not depend on the environment.
    """
    given = [_as_plugin(p) for p in plugins]
    registry = _build(given, builtins, entrypoints, strict=strict)
    result = RegisteredRegistry(**{f.name: getattr(registry, f.name) for f in dataclasses.fields(Registry)})
    object.__setattr__(result, "_build_args", (given, builtins, entrypoints))  # frozen: not a compared field
    return result


# -- the backend contract --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ContractResult:
    """One (layer, target) cell of :func:`assert_backend_contract`: the verdict and, when supported, the plan."""

    layer: MoELayer
    caps: Capabilities
    verdict: Verdict
    padding: Padding | None

    @property
    def supported(self) -> bool:
        return bool(self.verdict.supported)


def _where(backend: Backend, layer_: MoELayer, caps: Capabilities) -> str:
    return (f"backend {backend.name!r} on {caps.arch_label} (AITER {caps.aiter_version or 'none'}), layer "
            f"{layer_.index} [hidden {layer_.hidden}, intermediate/rank {layer_.intermediate_per_rank}, "
            f"experts/rank {layer_.experts_per_rank}, top_k {layer_.top_k}, weights {layer_.weight.describe()}, "
            f"activations {layer_.act.describe()}, {layer_.activation}{', bias' if layer_.has_bias else ''}]")


def _check_verdict(verdict: Any, where: str) -> Verdict:
    if not isinstance(verdict, Verdict):
        raise AssertionError(f"{where}: check() returned {type(verdict).__name__}, not a moedispatch.Verdict")
    if not isinstance(verdict.supported, bool):
        raise AssertionError(f"{where}: Verdict.supported must be a bool, got {verdict.supported!r}")
    if isinstance(verdict.reasons, tuple) and any(isinstance(r, str) and not r.strip() for r in verdict.reasons):
        raise AssertionError(f"{where}: a Verdict has an empty reason: {verdict.reasons!r}")
    if not isinstance(verdict.reasons, tuple) or not all(isinstance(r, Reason) for r in verdict.reasons):
        raise AssertionError(f"{where}: Verdict.reasons must be a tuple of str or moedispatch.Reason, got "
                             f"{verdict.reasons!r}")
    if not verdict.supported and not verdict.reasons:
        raise AssertionError(f"{where}: an unsupported Verdict must say why (no reasons given)")
    return verdict


def _check_padding(padding: Any, layer_: MoELayer, where: str) -> Padding:
    if not isinstance(padding, Padding):
        raise AssertionError(f"{where}: plan_padding() returned {type(padding).__name__}, not a moedispatch.Padding")
    problems = []
    if padding.hidden - padding.hidden_pad != layer_.hidden:
        problems.append(f"hidden {padding.hidden} - hidden_pad {padding.hidden_pad} != layer hidden {layer_.hidden}")
    if padding.intermediate_per_rank - padding.intermediate_pad != layer_.intermediate_per_rank:
        problems.append(f"intermediate_per_rank {padding.intermediate_per_rank} - intermediate_pad "
                        f"{padding.intermediate_pad} != layer intermediate_per_rank {layer_.intermediate_per_rank}")
    if padding.hidden_multiple > 1 and padding.hidden % padding.hidden_multiple:
        problems.append(f"hidden {padding.hidden} is not a multiple of hidden_multiple {padding.hidden_multiple}")
    if padding.intermediate_multiple > 1 and padding.intermediate_per_rank % padding.intermediate_multiple:
        problems.append(f"intermediate_per_rank {padding.intermediate_per_rank} is not a multiple of "
                        f"intermediate_multiple {padding.intermediate_multiple}")
    if (broken := padding.zero_fill_problem()):
        problems.append(broken)
    if problems:
        raise AssertionError(f"{where}: plan_padding() is inconsistent with the layer: " + "; ".join(problems))
    return padding


def assert_backend_contract(
    backend: Backend,
    layers: Iterable[MoELayer],
    caps_list: Iterable[Capabilities] | Capabilities,
) -> list[ContractResult]:
    """Check ``backend`` against every layer × target the way the selector relies on it; return the results.

    Asserts that the backend has a valid ``name`` (lower case, hyphens) and an int ``preference``; that
    ``check(layer, caps)`` returns a :class:`~moedispatch.Verdict` whose ``reasons`` are strings and, when
    unsupported, at least one non-empty reason; that for supported layers ``plan_padding(layer, caps)`` returns a
    :class:`~moedispatch.Padding` consistent with the layer (allocated size − pad == original size, sizes are
    multiples of the recorded alignment, a kernel pad smaller than the allocated pad requires ``zero_fill``); and
    that both are pure (asked twice, equal answers). Raises ``AssertionError`` naming the backend, target and layer.

    :returns: one :class:`ContractResult` per (layer, target), in table order, for further assertions.
    """
    if not isinstance(backend, Backend):
        raise AssertionError(f"{backend!r} is not a moedispatch.Backend instance")
    if not isinstance(backend.name, str) or not _BACKEND_NAME.match(backend.name):
        raise AssertionError(f"backend name {backend.name!r} must be lower-case words joined by hyphens "
                             "(e.g. 'acme-moe')")
    if not isinstance(backend.preference, int) or isinstance(backend.preference, bool):
        raise AssertionError(f"backend {backend.name!r}: preference must be an int, got {backend.preference!r}")
    targets: Sequence[Capabilities] = [caps_list] if isinstance(caps_list, Capabilities) else list(caps_list)
    table = list(layers)
    if not table or not targets:
        raise AssertionError("assert_backend_contract() needs at least one layer and one target")
    results = []
    for caps in targets:
        for layer_ in table:
            where = _where(backend, layer_, caps)
            verdict = _check_verdict(backend.check(layer_, caps), where)
            again = backend.check(layer_, caps)
            if again != verdict:
                raise AssertionError(f"{where}: check() is not pure: {verdict!r} then {again!r}")
            padding = None
            if verdict.supported:
                padding = _check_padding(backend.plan_padding(layer_, caps), layer_, where)
                again_pad = backend.plan_padding(layer_, caps)
                if again_pad != padding:
                    raise AssertionError(f"{where}: plan_padding() is not pure: {padding!r} then {again_pad!r}")
            results.append(ContractResult(layer_, caps, verdict, padding))
    return results


# -- pytest fixtures (``pytest_plugins = ["moedispatch.testing"]``) --------------------------------------------

try:  # pytest is a test-time dependency only
    import pytest as _pytest
except ImportError:  # pragma: no cover
    _pytest = None  # type: ignore[assignment]

if _pytest is not None:

    @_pytest.fixture
    def moedispatch_caps() -> Callable[..., Capabilities]:
        """The :func:`fake_capabilities` factory: ``moedispatch_caps("gfx942", aiter_version="none")``."""
        return fake_capabilities

    @_pytest.fixture
    def moedispatch_layer() -> Callable[..., MoELayer]:
        """The :func:`layer` factory: ``moedispatch_layer(hidden_size=4096, intermediate_size=14336, …)``."""
        return layer

    @_pytest.fixture
    def moedispatch_clean_env(monkeypatch: Any):
        """No ``MOEDISPATCH_*`` variable from the developer's shell; a fresh process-wide registry before and after."""
        for var in ("MOEDISPATCH_LOAD_PLUGINS", "MOEDISPATCH_DISABLE_PLUGINS", "MOEDISPATCH_TARGET"):
            monkeypatch.delenv(var, raising=False)
        _plugins.reset_registry()
        yield
        _plugins.reset_registry()
