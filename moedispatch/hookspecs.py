"""Hook specifications (pluggy project ``moedispatch``; entry-point group ``moedispatch.backends``).

Module-level specs only (no ``self``), one docstring template. See ``docs/plugins.md`` for the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.backend import Backend

__all__ = ["hookspec", "hookimpl", "PROJECT", "ENTRY_POINT_GROUP", "register_backends"]

#: pluggy project name.
PROJECT = "moedispatch"
#: Entry-point group third-party (and built-in) plugins register under.
ENTRY_POINT_GROUP = "moedispatch.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorator for plugin hook implementations: ``@moedispatch.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- discovery -------------------------------------------------------------------------------------------------

@hookspec
def register_backends() -> "Iterable[Backend]":  # type: ignore[empty-body]
    """Return the backends this plugin contributes.

    Every implementation is called once per plugin manager. Return cheap declarations (instances of
    :class:`moedispatch.Backend`); import kernels lazily, never here. The host checks each object: a non-``Backend``
    or a duplicate ``name`` is reported as a plugin error naming the plugin (an exception under ``strict``).

    :returns: an iterable of :class:`moedispatch.Backend` instances.

    .. versionadded:: 0.1
    """
