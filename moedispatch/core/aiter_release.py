"""Which AITER release a version string carries: one notion for every release range moedispatch decides.

AITER versions its builds with setuptools_scm (ROCm/aiter@e4048607 pyproject.toml ``[tool.setuptools_scm]``, no
``version_scheme``: the default ``guess-next-dev``; setup.py ``use_scm_version=True``):

* a release tag is the release (``v0.1.19`` → 0.1.19; a local part such as ``+rocm7.1`` or a nightly's ``+20261201``
  is a label, dropped);
* a release-candidate tag and a build after one (``0.1.17rc1.dev3``) carry that release's code: **the release**
  (``v0.1.17-rc0`` is an ancestor of v0.1.17, 5 commits before it; ``v0.1.13-rc5`` is v0.1.13's own commit);
* a build N commits after a tag is the tag with its last number bumped plus ``.devN`` (after v0.1.18: 0.1.19.dev4;
  after v0.1.7.post1: 0.1.7.post2.dev18, the PyPI amd-aiter wheel): it holds the earlier tag's code and part of what
  came after, never the bumped release — it **keeps its dev part**, so PEP 440 order puts it after the tag it was
  built from and before the release it names.

Ranges (``>=0.1.17,<0.1.18``) are decided on that release in plain PEP 440 order (:func:`in_range`), not by
packaging's ``SpecifierSet.contains``: that excludes pre-releases by default and a ``<V`` never admits a pre-release
of V (so ``0.1.19.dev4`` was outside ``<0.1.19`` and outside ``>=0.1.17``), and what it said for pre-releases changed
across packaging 21–26. Nothing is read at import.
"""

from __future__ import annotations

import operator
import re
from typing import Any

__all__ = ["release_of", "in_range", "range_problem"]

_CLAUSE = re.compile(r"\s*(==|!=|<=|>=|<|>)\s*([^\s,]+)\s*")
_OPS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt,
        ">": operator.gt}


def release_of(version: str) -> Any:
    """The release AITER ``version`` carries, as a packaging ``Version`` (None if it does not parse): a pre-release
    (``0.1.19rc2``, ``0.1.17rc1.dev3``) is its release (0.1.19, 0.1.17); a dev build without one keeps its dev part
    (``0.1.19.dev4+g1a2b`` → 0.1.19.dev4, between v0.1.18 and v0.1.19); the local part is dropped."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(str(version).strip())
    except InvalidVersion:
        return None
    post = f".post{v.post}" if v.post is not None else ""
    base = f"{v.epoch}!{'.'.join(map(str, v.release))}{post}"
    if v.pre is None and v.dev is not None:
        return Version(f"{base}.dev{v.dev}")
    return Version(base)


def _clauses(spec: str) -> list[tuple[str, Any]]:
    from packaging.version import InvalidVersion, Version

    out = []
    for part in spec.split(","):
        m = _CLAUSE.fullmatch(part)
        if m is None:
            raise ValueError(f"{part.strip()!r} is not one of ==, !=, <, <=, >, >= and a version")
        try:
            out.append((m.group(1), Version(m.group(2))))
        except InvalidVersion:
            raise ValueError(f"{m.group(2)!r} is not a PEP 440 version") from None
    return out


def range_problem(spec: str) -> str | None:
    """Why ``spec`` cannot be a release range (None when it can): comma-separated ``==``/``!=``/``<``/``<=``/``>``/
    ``>=`` clauses with PEP 440 versions (no ``~=``, ``===`` or wildcards: plain order decides them)."""
    try:
        _clauses(spec)
    except ValueError as exc:
        return str(exc)
    return None


def in_range(version: str, spec: str) -> bool:
    """Whether the release ``version`` carries (:func:`release_of`) satisfies every clause of ``spec`` in plain PEP 440
    order (False for a version that does not parse; ValueError for a spec :func:`range_problem` refuses)."""
    release = release_of(version)
    if release is None:
        return False
    return all(_OPS[op](release, bound) for op, bound in _clauses(spec))
