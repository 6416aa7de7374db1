"""Hook specifications (pluggy project ``moedispatch``; entry-point group ``moedispatch.backends``).

Module-level specs only (no ``self``), one docstring template. See ``docs/plugins.md`` for the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Backend
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.costs import Cost
    from moedispatch.core.layers import MoELayer

__all__ = ["hookspec", "hookimpl", "PROJECT", "ENTRY_POINT_GROUP", "register_backends", "moe_cost"]

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


# -- cost ------------------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def moe_cost(backend: str, layer: "MoELayer", caps: "Capabilities",
             tokens: "tuple[int, ...]") -> "Iterable[Cost] | None":  # type: ignore[empty-body]
    """Declare the predicted time of one fused-MoE call of your backend, per token count.

    Called by :func:`moedispatch.cost.model.predict` (when it is given the plugin manager) for every backend, built-in or
    not; answer only for your own backends (check ``backend``) and return ``None`` otherwise. Without an answer
    the backend gets the cost model's roofline with the ``other`` factor band and wide bars.

    :param backend: the backend's name (``Backend.name``).
    :param layer: the per-rank :class:`moedispatch.MoELayer`.
    :param caps: the target :class:`moedispatch.Capabilities`.
    :param tokens: the token counts to predict, a tuple of positive ints.
    :returns: one :class:`moedispatch.cost.model.Cost` (or a mapping with ``tokens``, ``us``, ``low``, ``high``) per token
        count in ``tokens``, with ``0 < low <= us <= high`` in microseconds — or ``None``. The basis is recorded as
        ``plugin``. A malformed answer or an exception is logged and the roofline answers instead.

    Stops at first non-None result.

    .. versionadded:: 0.2
    """
