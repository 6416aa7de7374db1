"""One registry of moedispatch's caches, so ``moedispatch.clear_caches()`` forgets everything in one call.

Every memoised function is declared with :func:`memoize` (``functools.lru_cache`` that registers itself) and every
module-level cache registers its ``clear`` with :func:`register`. Only modules that were imported hold caches, so
clearing the registered ones clears them all. Registering is appending a bound method to a list: no work at import.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

__all__ = ["memoize", "register", "clear_all", "registered"]

F = TypeVar("F", bound=Callable[..., Any])

_clearers: list[tuple[str, Callable[[], None]]] = []


def register(clear: Callable[[], None], name: str | None = None) -> Callable[[], None]:
    """Register a cache's ``clear`` callable (e.g. ``register(_cache.clear, "probe._cache")``); returns it."""
    _clearers.append((name or getattr(clear, "__qualname__", repr(clear)), clear))
    return clear


def memoize(maxsize: int | None = 128) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize)`` whose ``cache_clear`` is registered for :func:`clear_all`."""
    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        register(cached.cache_clear, f"{fn.__module__}.{fn.__qualname__}")
        return cached  # type: ignore[return-value]
    return wrap


def registered() -> tuple[str, ...]:
    """The names of the registered caches (for tests and ``--debug`` output)."""
    return tuple(name for name, _ in _clearers)


def clear_all() -> None:
    """Forget every registered cache: capability_db and AITER data, model references, decisions, the plugin
    registry, the probe report. The next call re-reads and re-decides (e.g. after editing capability_db in a test)."""
    for _, clear in list(_clearers):
        clear()
