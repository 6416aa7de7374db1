"""structlog for library code, routed through stdlib ``logging`` (logger ``moedispatch``).

A host that imports moedispatch sees nothing unless it configures ``logging``: the library never configures
structlog or logging (structlog issue #815). Only :mod:`moedispatch.cli` installs a handler and renderer.

Hot paths (selection runs per layer, engines call it per FusedMoE layer) pay one ``isEnabledFor`` check per event
when the level is off: :func:`get_logger` returns a thin wrapper that consults the stdlib logger's level *before*
structlog builds an event dict, and structlog itself is imported only when the first event is actually emitted.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["get_logger", "LOGGER_NAME"]

LOGGER_NAME = "moedispatch"

_DEBUG, _INFO, _WARNING, _ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


def _to_stdlib(logger: Any, method_name: str, event_dict: dict[str, Any]) -> Any:
    # Hand the structured event to stdlib logging unrendered; the CLI's handler renders it (JSON or console).
    # The plain message carries the key=value pairs too, so a host with a plain logging.Formatter sees the details.
    details = " ".join(f"{k}={v!r}" for k, v in event_dict.items() if k not in ("event", "level"))
    message = f"{event_dict.get('event', '')} {details}".strip()
    return (message,), {"extra": {"structlog_event": dict(event_dict)}}


class _Logger:
    """Level-gated front of a structlog ``BoundLogger`` over ``logging.getLogger(name)`` (built on first use)."""

    __slots__ = ("_std", "_bound")

    def __init__(self, name: str) -> None:
        self._std = logging.getLogger(name)
        self._bound: Any = None

    def _structlog(self) -> Any:
        bound = self._bound
        if bound is None:
            import structlog

            bound = self._bound = structlog.wrap_logger(
                self._std,
                processors=[structlog.stdlib.filter_by_level, structlog.stdlib.add_log_level, _to_stdlib],
                wrapper_class=structlog.stdlib.BoundLogger,
            )
        return bound

    def is_enabled(self, level: int) -> bool:
        return self._std.isEnabledFor(level)

    def debug(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(_DEBUG):
            self._structlog().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(_INFO):
            self._structlog().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(_WARNING):
            self._structlog().warning(event, **kw)

    warn = warning

    def error(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(_ERROR):
            self._structlog().error(event, **kw)

    def bind(self, **kw: Any) -> Any:
        return self._structlog().bind(**kw)


_null_added = False


def get_logger(name: str = LOGGER_NAME) -> Any:
    """A structlog logger over ``logging.getLogger(name)``; cheap, lazy, and silent unless the host configures."""
    global _null_added
    if not _null_added:
        # The stdlib's recommended library practice: a NullHandler keeps Python's last-resort handler from printing
        # our warnings to a host's stderr when the host configured no logging at all.
        logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
        _null_added = True
    return _Logger(name)
