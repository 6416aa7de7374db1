"""The project's error types.

Every error a user can cause derives from :class:`MoedispatchError`; its ``str()`` is one clear line. The CLI turns
:class:`UsageError` (bad input) into exit code 2 and :class:`~moedispatch.core.decision.NoBackendError` (it
carries a Decision, so it lives beside it) into exit code 3.
"""

from __future__ import annotations

__all__ = [
    "MoedispatchError",
    "UsageError",
    "ModelError",
    "TargetError",
    "CapabilityDBError",
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
