"""Plugin manager: load the ``moedispatch.backends`` entry points once, lazily, with every failure isolated.

Built-in backends (package ``moedispatch_plugins``) come through the same entry points as third-party ones.
``MOEDISPATCH_LOAD_PLUGINS`` (allow-list) and ``MOEDISPATCH_DISABLE_PLUGINS`` (deny-list) take comma-separated
entry-point or backend names; an empty ``MOEDISPATCH_LOAD_PLUGINS`` loads none. A plugin that fails to import,
raises in ``register_backends`` or returns garbage is recorded (``PluginRecord.errors``) and skipped, unless
``strict`` is set, which raises :class:`PluginError` instead.

Third-party code runs under a deadline: importing a plugin, its ``register_backends`` and (in the selector) each
backend's ``check``/``plan_padding`` run on a daemon worker thread, and a call that does not return within
:func:`plugin_timeout` seconds (``MOEDISPATCH_PLUGIN_TIMEOUT``, default 10) is reported as
``… timed out after Ns`` while selection goes on; a plugin that timed out once is disabled for the rest of the run
(:mod:`moedispatch._util.deadline`). Built-in backends are called directly (no thread, microseconds).

What a third-party plugin prints to stdout while it is imported or registers its backends is captured (``sys.stdout``
always; file descriptor 1 too when the CLI switched :func:`moedispatch._util.deadline.set_fd_capture` on) and recorded
as a plugin warning (``PluginRecord.warnings``; ``Registry.warnings`` reads ``plugin 'acme' printed to stdout
during import: …``), so ``--format json`` stays JSON.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable, Sequence

import pluggy

from moedispatch.core import hookspecs
from moedispatch._util.log import get_logger
from moedispatch.core.backend import Backend
from moedispatch.core.errors import PluginError, UsageError
from moedispatch._util.suggest import did_you_mean

__all__ = ["PluginRecord", "Registry", "get_registry", "build_registry", "reset_registry", "call_with_deadline",
           "plugin_timeout", "PluginTimeout", "DEFAULT_PLUGIN_TIMEOUT_S"]

log = get_logger(__name__)

#: A third-party plugin import at least this slow gets a warning (README: explain takes about 0.2 s in all).
SLOW_IMPORT_S = 0.5
_clock = time.perf_counter

#: Seconds a third-party plugin call (import, register_backends, check, plan_padding) may take.
from moedispatch._util.caches import register
from moedispatch._util.deadline import (  # noqa: E402 - re-exported: the deadline machinery lives in deadline.py
    DEFAULT_PLUGIN_TIMEOUT_S, PluginTimeout, call_with_deadline, fd_stdout_captured, plugin_timeout, register_owner,
    reset_disabled, snippet)


@dataclass(frozen=True)
class PluginRecord:
    """One plugin as ``moedispatch backends`` shows it."""

    name: str
    package: str | None = None
    version: str | None = None
    hooks: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    builtin: bool = False
    #: Non-fatal problems, e.g. ``printed to stdout during import: 'hello'`` (captured, never on our stdout).
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``moedispatch backends --format json`` entry; ``warnings`` only when there are some."""
        out: dict[str, Any] = {
            "name": self.name, "package": self.package, "version": self.version, "hooks": list(self.hooks),
            "backends": list(self.backends), "errors": list(self.errors), "builtin": self.builtin,
        }
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


@dataclass(frozen=True)
class Registry:
    """The loaded backends (in registration order) and what each plugin contributed or failed with."""

    backends: tuple[Backend, ...]
    plugins: tuple[PluginRecord, ...]
    strict: bool = False
    owners: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # backend name -> plugin name
    #: The plugin manager the backends came from: optional hooks beyond discovery (``moe_cost``) are called on it.
    pm: Any = field(default=None, compare=False, repr=False)

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(f"{p.name}: {e}" for p in self.plugins for e in p.errors)

    @property
    def warnings(self) -> tuple[str, ...]:
        """``plugin 'acme' printed to stdout during import: 'hello'`` — one per plugin warning, for the plan."""
        return tuple(f"plugin {p.name!r} {w}" for p in self.plugins for w in p.warnings)

    def get(self, name: str) -> Backend | None:
        for backend in self.backends:
            if backend.name == name:
                return backend
        return None

    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    def owner(self, backend_name: str) -> str | None:
        return dict(self.owners).get(backend_name)


def _check_timeout_env() -> None:
    """``MOEDISPATCH_PLUGIN_TIMEOUT`` must be a positive number of seconds (never silently the default)."""
    raw = os.environ.get("MOEDISPATCH_PLUGIN_TIMEOUT")
    if raw is None or raw.strip() == "":
        return
    try:
        ok = math.isfinite(float(raw)) and float(raw) > 0  # inf / nan: never a deadline
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"MOEDISPATCH_PLUGIN_TIMEOUT={raw!r}: expected a positive, finite number of seconds "
                         f"(default {DEFAULT_PLUGIN_TIMEOUT_S:g})")


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


def _hook_names() -> tuple[str, ...]:
    """The hooks a plugin may implement: every function of moedispatch/core/hookspecs.py marked as a spec."""
    return tuple(sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), f"{hookspecs.PROJECT}_spec")))


def _fmt_exc(exc: BaseException) -> str:
    """``Type: message`` on one line: a multi-line message keeps its lines, joined (pluggy's PluginValidationError puts
    the useful part — which argument the spec lacks — on its second line)."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Collector:
    def __init__(self, strict: bool, deny: list[str]) -> None:
        self.strict = strict
        self.deny = set(deny)
        self.backends: list[Backend] = []
        self.owner: dict[str, str] = {}
        self.records: list[PluginRecord] = []
        self.warnings: dict[str, list[str]] = {}  # plugin name -> warnings not yet in its record
        self.denied: set[str] = set()  # backend names the deny list dropped (MOEDISPATCH_DISABLE_PLUGINS)
        self.dists: dict[str, str] = {}  # plugin name -> "distribution version" that registered it first

    def fail(self, message: str) -> None:
        if self.strict:
            raise PluginError(message)
        log.warning("plugin_load_failed", error=message)

    def add_plugin(
        self,
        pm: pluggy.PluginManager,
        name: str,
        module: Any,
        *,
        package: str | None,
        version: str | None,
        builtin: bool,
    ) -> None:
        errors: list[str] = []
        contributed: list[str] = []
        token = object()  # one per plugin registration: a timeout in one of its backends disables them all
        dist = " ".join(x for x in (package, version) if x) or "an inline plugin"
        if pm.get_plugin(name) is not None:
            # Two installed distributions declare one entry-point name (a renamed package next to the old one): say
            # which, instead of pluggy's "Plugin name already registered" dump of every module in the manager.
            message = (f"cannot register plugin: entry point name {name!r} of {dist} is already taken by "
                       f"{self.dists.get(name, 'another plugin')}; uninstall one of them or rename this entry point")
            self.fail(f"plugin {name!r}: {message}")
            self.records.append(PluginRecord(name, package, version, (), (), (message,), builtin))
            return
        try:
            pm.register(module, name=name)
        except Exception as exc:  # pluggy validation errors, duplicate registration
            message = f"cannot register plugin: {_fmt_exc(exc)}"
            self.fail(f"plugin {name!r}: {message}")
            self.records.append(PluginRecord(name, package, version, (), (), (message,), builtin))
            return
        self.dists[name] = dist
        callers = pm.get_hookcallers(module) or ()
        hooks = tuple(sorted(h.name for h in callers))
        # pluggy accepts an implementation of a hook nobody specified (a typo such as register_backend): say so.
        for caller in callers:
            if caller.spec is None:
                message = (f"unknown hook {caller.name!r} (moedispatch hooks: "
                           f"{', '.join(_hook_names())}){did_you_mean(caller.name, _hook_names())}")
                self.fail(f"plugin {name!r}: {message}")
                errors.append(message)
        for impl in pm.hook.register_backends.get_hookimpls():
            if impl.plugin is not module:
                continue
            # Called one plugin at a time (not through pm.hook) so a failure is attributed to its plugin; there is
            # one hook and no wrappers, so nothing of pluggy's call ordering is bypassed that matters here.
            try:
                if builtin:
                    items = _collect(impl.function)
                else:
                    printed: list[str] = []
                    try:
                        with fd_stdout_captured(printed):
                            items = call_with_deadline(_collect, (impl.function,), what="register_backends",
                                                       plugin=name, output=printed)
                    finally:
                        self.printed(name, "register_backends()", printed)
            except (PluginTimeout, _BadReturn) as exc:
                message = str(exc)
                self.fail(f"plugin {name!r}: {message}")
                errors.append(message)
                continue
            except Exception as exc:  # a plugin's own bug, of any kind: reported as that plugin's failure
                message = f"register_backends raised {_fmt_exc(exc)}"
                self.fail(f"plugin {name!r}: {message}")
                errors.append(message)
                continue
            for item in items:
                try:
                    problem = _validate_backend(item)
                except Exception as exc:  # a name/preference property that raises
                    problem = f"register_backends returned a backend whose attributes raise {_fmt_exc(exc)}"
                if problem:
                    self.fail(f"plugin {name!r}: {problem}")
                    errors.append(problem)
                    continue
                if item.name in self.deny:
                    self.denied.add(item.name)
                    continue
                if item.name in self.owner:
                    message = (f"duplicate backend name {item.name!r} (already registered by plugin "
                               f"{self.owner[item.name]!r}); ignored")
                    self.fail(f"plugin {name!r}: {message}")
                    errors.append(message)
                    continue
                self.owner[item.name] = name
                if not builtin:
                    register_owner(item, name, token)
                self.backends.append(item)
                contributed.append(item.name)
        if "register_backends" not in hooks and not errors:
            # pluggy registers a module with no @hookimpl function silently: the plugin would show as "ok"
            self.warnings.setdefault(name, []).append(
                "implements no register_backends hook (is it decorated with @moedispatch.hookimpl?): it contributes "
                "no backend")
        self.records.append(PluginRecord(name, package, version, hooks, tuple(contributed), tuple(errors), builtin,
                                         tuple(self.warnings.pop(name, ()))))

    def timed(self, name: str, seconds: float) -> None:
        """A plugin import slower than :data:`SLOW_IMPORT_S` is said (every process that plans pays it, silently)."""
        if seconds >= SLOW_IMPORT_S:
            self.warnings.setdefault(name, []).append(
                f"took {seconds:.1f} s to import (every process that plans pays it; explain itself takes about "
                f"0.2 s): import heavy modules inside its hooks, or skip it with MOEDISPATCH_DISABLE_PLUGINS={name}")
            log.warning("plugin_import_slow", plugin=name, seconds=round(seconds, 2))

    def printed(self, name: str, what: str, outputs: list[str]) -> None:
        """Record what plugin ``name`` printed during ``what`` (a plugin warning; never our stdout)."""
        text = "".join(outputs)
        if text.strip():
            self.warnings.setdefault(name, []).append(f"printed to stdout during {what}: {snippet(text)}")
            log.warning("plugin_printed", plugin=name, call=what, output=snippet(text))

    def record_failure(self, name: str, package: str | None, version: str | None, message: str,
                       builtin: bool) -> None:
        self.fail(f"plugin {name!r}: {message}")
        self.records.append(PluginRecord(name, package, version, (), (), (message,), builtin,
                                         tuple(self.warnings.pop(name, ()))))


class _BadReturn(Exception):
    pass


def _collect(register: Any) -> list[Any]:
    """Call a ``register_backends`` implementation and materialize its iterable (inside the deadline)."""
    result = register()
    if result is None:
        return []
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        raise _BadReturn(f"register_backends returned {type(result).__name__}, not an iterable of moedispatch.Backend")
    return list(result)


def _validate_backend(item: Any) -> str | None:
    if not isinstance(item, Backend):
        return f"register_backends returned {type(item).__name__!s} ({item!r:.60}), not a moedispatch.Backend"
    if not isinstance(item.name, str) or not item.name or item.name != item.name.strip():
        return f"backend {type(item).__name__} has no valid name (got {item.name!r})"
    if not isinstance(item.preference, int) or isinstance(item.preference, bool):
        return f"backend {item.name!r} preference must be an int, got {type(item.preference).__name__}"
    if _UNLISTABLE.search(item.name):   # the allow/deny lists split on commas: a name must be listable there
        return (f"backend name {item.name!r} has a comma or whitespace, which MOEDISPATCH_LOAD_PLUGINS / "
                "MOEDISPATCH_DISABLE_PLUGINS cannot name (convention: lower-case words joined by hyphens, 'acme-moe')")
    family = getattr(item, "family", None)
    if family is not None and not isinstance(family, str):
        return f"backend {item.name!r} family must be a string or None, got {type(family).__name__}"
    if not isinstance(getattr(item, "description", ""), str):
        return f"backend {item.name!r} description must be a string, got {type(item.description).__name__}"
    return None


#: What a backend name may not hold: the allow/deny lists are comma-separated and stripped (the plugin API fixes no
#: other rule; lower-case words joined by hyphens is the convention).
_UNLISTABLE = re.compile(r"[,\s]")


def _new_pm() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def build_registry(
    plugins: Sequence[tuple[str, ModuleType | Any]] = (),
    *,
    load_entrypoints: bool = True,
    strict: bool = False,
) -> Registry:
    """Build a fresh registry: entry points (filtered by the env allow/deny lists) plus ``plugins`` given inline.

    ``plugins`` are ``(name, module_or_object)`` pairs with ``@hookimpl`` functions, for tests and embedding.
    """
    _check_timeout_env()
    allow = _env_list("MOEDISPATCH_LOAD_PLUGINS")
    deny = _env_list("MOEDISPATCH_DISABLE_PLUGINS") or []
    collector = _Collector(strict, deny)
    pm = _new_pm()
    if load_entrypoints:
        eps = [(ep, *_dist_info(getattr(ep, "dist", None))) for ep in _entry_points()]
        ep_names = {ep.name for ep, _p, _v in eps}
        # An allow-list naming a backend (not an entry point) cannot be matched before loading: load every plugin
        # then and keep the named backends below.
        by_backend = allow is not None and any(a not in ep_names for a in allow)
        # Built-ins register first: a third-party backend reusing a built-in's name is the duplicate, never the
        # built-in (entry points sorted by name alone let an 'aaa-…' plugin take over 'aiter-ck').
        for ep, package, version in sorted(eps, key=lambda t: (not _is_builtin(t[0], t[1]), t[0].name)):
            if ep.name in deny or (allow is not None and ep.name not in allow and not by_backend):
                continue
            builtin = _is_builtin(ep, package)
            try:
                if builtin:
                    module = ep.load()
                else:
                    printed: list[str] = []
                    started = _clock()
                    try:
                        with fd_stdout_captured(printed):
                            module = call_with_deadline(ep.load, what="import", plugin=ep.name, output=printed)
                    finally:
                        collector.printed(ep.name, "import", printed)
                    collector.timed(ep.name, _clock() - started)
            except PluginTimeout as exc:
                collector.record_failure(ep.name, package, version, str(exc), builtin)
                continue
            except Exception as exc:  # whatever a plugin's import raises is that plugin's failure, not ours
                collector.record_failure(ep.name, package, version, f"import failed: {_fmt_exc(exc)}", builtin)
                continue
            collector.add_plugin(pm, ep.name, module, package=package, version=version, builtin=builtin)
    for name, module in plugins:
        if name in deny or (allow is not None and name not in allow and load_entrypoints):
            continue
        collector.add_plugin(pm, name, module, package=None, version=None, builtin=False)
    if allow is not None:
        # An allow-list may also name backends: keep only those (entry-point names were filtered above).
        keep = [b for b in collector.backends if b.name in allow or collector.owner[b.name] in allow]
        known = {ep.name for ep in _entry_points()} if load_entrypoints else set()
        known |= {b.name for b in collector.backends} | {name for name, _ in plugins}
        unmatched = [a for a in allow if a not in known]
        if unmatched or not allow:
            message = (f"MOEDISPATCH_LOAD_PLUGINS={os.environ.get('MOEDISPATCH_LOAD_PLUGINS', '')!r} "
                       + (f"matches no plugin or backend: {', '.join(unmatched)}" if unmatched
                          else "is empty: no plugins loaded")
                       + f" (known: {', '.join(sorted(known)) or 'none'})")
            collector.records.append(PluginRecord("MOEDISPATCH_LOAD_PLUGINS", None, None, (), (), (message,), False))
    else:
        keep = collector.backends
    if deny:
        known = ({ep.name for ep in _entry_points()} if load_entrypoints else set()) | {n for n, _ in plugins}
        # a backend name is listable too: the one the list dropped (collector.denied) matched
        unmatched = [d for d in deny if d not in known and d not in collector.denied]
        if unmatched:
            hints = [f"{d!r}{did_you_mean(d, sorted(known))}" for d in unmatched]
            message = (f"names no installed plugin: {', '.join(hints)} — nothing was "
                       f"disabled for it (installed: {', '.join(sorted(known)) or 'none'})")
            collector.records.append(PluginRecord("MOEDISPATCH_DISABLE_PLUGINS", None, None, (), (), (message,), False))
    registry = Registry(
        backends=tuple(keep),
        plugins=tuple(collector.records),
        strict=strict,
        owners=tuple(sorted(collector.owner.items())),
        pm=pm,
    )
    _recent.append(registry)
    del _recent[:-16]  # the last few registries built (tests and hosts build their own): for optional hooks
    return registry


_DIST_CACHE: dict[str, tuple[str | None, str | None]] = {}


#: The distribution that ships the built-in backends (its package ``moedispatch_plugins``).
_BUILTIN_DIST = "moedispatch"


def _is_builtin(ep: Any, package: str | None) -> bool:
    """Whether an entry point is a built-in backend (trusted: called without the deadline thread). The distribution
    that declares it decides — moedispatch itself, pointing into its ``moedispatch_plugins`` package — never the text
    of a module name, which any third-party distribution can choose (``moedispatch_plugins_acme``)."""
    module = ep.value.split(":")[0].strip()
    return package == _BUILTIN_DIST and (module == "moedispatch_plugins" or module.startswith("moedispatch_plugins."))


def _dist_info(dist: Any) -> tuple[str | None, str | None]:
    """(name, version) of an entry point's distribution, parsing each METADATA file once per process."""
    if dist is None:
        return None, None
    key = str(getattr(dist, "_path", id(dist)))
    if key not in _DIST_CACHE:
        try:
            meta = dist.metadata
            _DIST_CACHE[key] = (meta["Name"], meta["Version"])
        except Exception:  # a broken dist-info must not break loading
            _DIST_CACHE[key] = (None, None)
    return _DIST_CACHE[key]


class _Dist:
    """Name and version of a distribution, read from its METADATA/PKG-INFO header lines only."""

    __slots__ = ("_path", "metadata")

    def __init__(self, path: str) -> None:
        self._path = path
        self.metadata: dict[str, str] = {}
        for leaf in ("METADATA", "PKG-INFO"):
            try:
                with open(os.path.join(path, leaf), encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if not line.strip():
                            break  # the headers end at the first blank line
                        key, sep, value = line.partition(":")
                        if sep and key in ("Name", "Version") and key not in self.metadata:
                            self.metadata[key] = value.strip()
                break
            except OSError:
                continue


@dataclass(frozen=True)
class _EntryPoint:
    name: str
    value: str
    dist: Any

    def load(self) -> Any:
        """``module:attr.path [extras]`` as importlib.metadata.EntryPoint reads it (its ``pattern``;
        https://packaging.python.org/en/latest/specifications/entry-points/): the extras are not part of the name."""
        module, _, attr = self.value.partition("[")[0].partition(":")
        obj = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj


def _scan_entry_points(group: str) -> list[_EntryPoint] | None:
    """Entry points of ``group`` from ``*.dist-info`` / ``*.egg-info`` folders on sys.path, first distribution of a
    name wins (as importlib.metadata does). ``None`` when sys.path holds something only importlib.metadata can read
    (a zip). Reading entry_points.txt directly keeps ``import importlib.metadata`` (≈12 ms with its email parser)
    off explain's start-up path."""
    import sys

    seen: set[str] = set()
    found: list[_EntryPoint] = []
    for entry in sys.path:
        path = entry or "."
        if not os.path.isdir(path):
            if os.path.isfile(path):
                return None
            continue
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for leaf in names:
            if not leaf.endswith((".dist-info", ".egg-info")):
                continue
            key = leaf.rsplit(".", 1)[0].split("-")[0].lower().replace(".", "_")
            if key in seen:
                continue
            seen.add(key)
            info = os.path.join(path, leaf)
            try:
                with open(os.path.join(info, "entry_points.txt"), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            section = None
            dist = None
            for raw in text.splitlines():
                line = raw.strip()
                if not line or line.startswith(("#", ";")):
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                    continue
                if section == group and "=" in line:
                    name, _, value = line.partition("=")
                    dist = dist or _Dist(info)
                    found.append(_EntryPoint(name.strip(), value.strip(), dist))
    return found


def _entry_points() -> Iterable[Any]:
    found = _scan_entry_points(hookspecs.ENTRY_POINT_GROUP)
    if found is not None:
        return found
    import importlib.metadata as md

    return md.entry_points(group=hookspecs.ENTRY_POINT_GROUP)


_lock = threading.Lock()
_cache: dict[bool, Registry] = {}


def get_registry(*, strict: bool = False, refresh: bool = False) -> Registry:
    """The process-wide registry, loaded on first use (thread-safe). ``refresh=True`` reloads entry points."""
    with _lock:
        if refresh or strict not in _cache:
            _cache[strict] = build_registry(strict=strict)
        return _cache[strict]


def plugin_manager_for(backend: Backend) -> Any:
    """The plugin manager of a loaded registry that holds ``backend`` (for optional hooks such as ``moe_cost``),
    or None."""
    for registry in [*_cache.values(), *reversed(_recent)]:
        if any(b is backend for b in registry.backends):
            return registry.pm
    return None


_recent: list[Registry] = []


def reset_registry() -> None:
    """Forget the cached registry and which plugins timed out (tests; after installing or removing a plugin
    in-process)."""
    with _lock:
        _cache.clear()
    reset_disabled()


register(reset_registry, "plugin registry")
