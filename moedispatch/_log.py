"""structlog for library code, routed through stdlib ``logging`` (logger ``moedispatch``).

A host that imports moedispatch sees nothing unless it configures ``logging``: the library never configures
structlog or logging (structlog issue #815). Only :mod:`moedispatch.cli` installs a handler and renderer.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["get_logger", "LOGGER_NAME"]

LOGGER_NAME = "moedispatch"


def _to_stdlib(logger: Any, method_name: str, event_dict: dict[str, Any]) -> Any:
    # Hand the structured event to stdlib logging unrendered; the CLI's handler renders it (JSON or console).
    return (event_dict.get("event", ""),), {"extra": {"structlog_event": dict(event_dict)}}


_null_added = False


def get_logger(name: str = LOGGER_NAME) -> Any:
    """A structlog logger over ``logging.getLogger(name)``; cheap, lazy, and silent unless the host configures."""
    global _null_added
    if not _null_added:
        # The stdlib's recommended library practice: a NullHandler keeps Python's last-resort handler from printing
        # our warnings to a host's stderr when the host configured no logging at all.
        logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
        _null_added = True
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, structlog.stdlib.add_log_level, _to_stdlib],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
