"""The project's error types.

Every error a user can cause derives from :class:`MoedispatchError`; its ``str()`` is one clear line. The CLI turns
:class:`UsageError` (bad input) into exit code 2 and :class:`NoBackendError` into exit code 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.decision import Decision

__all__ = [
    "MoedispatchError",
    "UsageError",
    "ModelError",
    "TargetError",
    "CapabilityDBError",
    "NoBackendError",
    "PluginError",
]


class MoedispatchError(Exception):
    """Base class: the message is one line meant for a human."""


class UsageError(MoedispatchError):
    """Bad input from the user (flags, model reference, checkpoint files). CLI exit code 2."""


class ModelError(UsageError):
    """A model reference or checkpoint config cannot be resolved or parsed."""


class TargetError(UsageError):
    """A target GPU / AITER version cannot be resolved."""


class CapabilityDBError(MoedispatchError):
    """A capability_db file is broken; the message names file, key and problem."""


class PluginError(MoedispatchError):
    """A plugin failed and strict plugin handling is on."""


class NoBackendError(MoedispatchError):
    """No registered backend can run a layer correctly (or a forced backend cannot).

    ``decision`` holds the full :class:`~moedispatch.selector.pure.Decision` (``backend`` is ``None``) with every
    rejection and its reasons.
    """

    def __init__(self, message: str, decision: "Decision") -> None:
        super().__init__(message)
        self.decision = decision
