"""Where the installed AITER is: its distribution version and ``aiter`` package directory, read from files only.

Shared by the probe (which reports it) and the tuned-CSV reader (which reads the installed AITER's own CSVs);
``import aiter`` is never run (it imports torch and runs rocminfo at import: ROCm/aiter@v0.1.15.post3:aiter/jit/core.py).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path

from moedispatch._util.caches import register

__all__ = ["DIST", "dist_version", "version_file", "installed_aiter", "clear_cache"]

#: AITER's distribution name on PyPI and in ROCm images.
DIST = "amd-aiter"


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata must not break the probe
        return None


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.MULTILINE)


def version_file(pkg: Path) -> str | None:
    """``aiter/_version.py`` written by setuptools_scm at build time (ROCm/aiter@v0.1.15.post3:setup.py); read as
    text, never imported."""
    try:
        m = _VERSION_RE.search((pkg / "_version.py").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return m.group(1) if m else None


_installed_memo: dict[tuple[str, ...], tuple[str | None, str | None]] = {}
register(_installed_memo.clear, "installed AITER")


def installed_aiter() -> tuple[str | None, str | None]:
    """(version, ``aiter`` package directory) of the AITER this Python would import, read from files only.

    ``importlib.util.find_spec('aiter')`` locates the package without executing it (a top-level name); the version
    is the ``amd-aiter`` distribution's metadata, else ``aiter/_version.py`` read as text. Memoised per ``sys.path``
    (explain asks once per planned shape; walking the distribution's RECORD cost ~100 ms).
    """
    key = tuple(sys.path)
    hit = _installed_memo.get(key)
    if hit is not None:
        return hit
    version = dist_version(DIST)
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        spec = None
    pkg = Path(next(iter(spec.submodule_search_locations))) if spec is not None and \
        spec.submodule_search_locations else None
    if pkg is None or not (pkg / "fused_moe.py").is_file():
        result: tuple[str | None, str | None] = (version, None)
    else:
        result = (version or version_file(pkg), str(pkg))
    if len(_installed_memo) > 8:
        _installed_memo.clear()
    _installed_memo[key] = result
    return result


def clear_cache() -> None:
    """Forget the memoised installed AITER (``moedispatch.clear_caches()`` calls this)."""
    _installed_memo.clear()
