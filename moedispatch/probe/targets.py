"""Which machine a plan is for: ``--target`` / ``caps=``, else ``MOEDISPATCH_TARGET``, else the probe, else the
capability_db default target (said, never silent); which AITER: ``--aiter-version``, ``MOEDISPATCH_AITER_VERSION``,
the installed one, or the newest capability_db knows.
"""

from __future__ import annotations

import os

from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import TargetError, UsageError
from moedispatch.core.reason import Reason
from moedispatch.data import capdb
from moedispatch.data.aiter_install import installed_aiter
from moedispatch.probe.system import capabilities_from_probe, probe

__all__ = ["resolve_capabilities", "cli_aiter_version", "installed_aiter_warning", "default_target_warning",
           "DEFAULT_TARGET"]


def resolve_capabilities(target: str | None = None, aiter_version: str | None = None) -> tuple[Capabilities, str | None]:
    """Capabilities for explain/engines: flags, else ``MOEDISPATCH_TARGET``, else the probe, else the DB default.

    Returns ``(caps, first_line)`` where ``first_line`` announces a default target (None otherwise).
    ``aiter_version="installed"`` plans for the AITER installed in this Python (read from its files, never
    imported): its version and its own tuned CSVs.
    """
    env_target = os.environ.get("MOEDISPATCH_TARGET") or None
    aiter_source = "flag"
    if aiter_version is not None and aiter_version.strip().lower() == "installed":
        version, pkg = installed_aiter()
        if version is None or pkg is None:
            raise UsageError("--aiter-version installed: no AITER (PyPI/ROCm distribution amd-aiter) is installed in "
                             "this Python environment")
        aiter_version, aiter_source = version, "installed"
    if target is not None:
        return capdb.target_capabilities(target, aiter_version, aiter_source=aiter_source), None
    if env_target is not None:
        try:
            return capdb.target_capabilities(env_target, aiter_version, target_source="env",
                                             aiter_source=aiter_source), None
        except TargetError as exc:
            raise TargetError(f"MOEDISPATCH_TARGET={env_target!r}: {exc}") from None
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
    ``MOEDISPATCH_TARGET`` does not say otherwise (the installed AITER is the default: README), else None."""
    if flag is not None:
        return flag
    env = (os.environ.get("MOEDISPATCH_AITER_VERSION") or "").strip()
    if env:
        return None if env.lower() == "default" else env
    if os.environ.get("MOEDISPATCH_TARGET"):
        return None
    version, pkg = installed_aiter()
    return "installed" if version is not None and pkg is not None else None


def installed_aiter_warning(caps: Capabilities) -> tuple[Reason, ...]:
    """When an AITER is installed here but the plan assumes another version, say so (never silently)."""
    if caps.source_of("aiter_version") in ("installed", "probe") or caps.source == "probe":
        return ()
    version, pkg = installed_aiter()
    if version is None or pkg is None or version == caps.aiter_version:
        return ()
    planned = f"AITER {caps.aiter_version}" if caps.aiter_version else "no AITER"
    return (Reason(f"amd-aiter {version} is installed in this Python ({pkg}) but the plan assumes {planned}; pass "
                   "--aiter-version installed to plan for the installed AITER and its own tuned CSVs", "warning"),)


#: ``Reason.issue`` of the default-target warning (consumers filter on it, never on its text).
DEFAULT_TARGET = "default-target"


def default_target_warning(caps: Capabilities) -> tuple[Reason, ...]:
    """The warning every plan/decision made for the capability_db default target carries (no GPU was found)."""
    if caps.source != "default":
        return ()
    aiter = f"AITER {caps.aiter_version}" if caps.aiter_version else "no AITER"
    return (Reason(f"no AMD GPU found: planned for the default target {caps.gfx} ({caps.product}) with {aiter}; pass "
                   "--target (in Python caps=moedispatch.target(\"MI300X\")) or set MOEDISPATCH_TARGET for the GPU "
                   "you deploy on", "warning", issue=DEFAULT_TARGET),)
