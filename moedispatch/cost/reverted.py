"""Rows of AITER's tuned fused-MoE CSVs that AITER itself reverted: flagged, with provenance, and left out of every
fit and every truth the cost model is measured on.

AITER sometimes merges tuned rows and reverts them days later (ROCm/aiter#3534 reverted #3487 the day after;
#3209 undid the ``kimik2_fp4_tuned_fmoe.csv`` part of the bulk merge #3004; #2836 put back the kernels of two Kimi
rows). A release cut between the two commits ships the reverted rows, and nothing in one snapshot tells them apart:
they pass :func:`moedispatch.cost.model.lint_rows`. capability_db/cost_reverted.toml, derived by
``scripts/build_cost_reverted.py`` from AITER's history and its release folders (``../shared/aiter/<tag>/``), lists
every revert commit on AITER's main that removed tuned rows and, per release, the rows of those reverts that the
release still carries (it does not contain the revert). Those rows are what :func:`drop` removes.

A row is the same row when its file, lookup key (without gfx, which older files lack), both kernel names and ``us``
(to 4 decimals) are the same: :func:`identity`. Nothing is read at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from moedispatch._util.caches import memoize
from moedispatch.core.errors import CapabilityDBError
from moedispatch.data import capdb

__all__ = ["REVERTED_FILE", "SCHEMA", "Revert", "Reverted", "identity", "key_text", "parse_reverted",
           "load_reverted", "drop"]

REVERTED_FILE = "cost_reverted.toml"
SCHEMA = "moedispatch.cost_reverted/1"


def _get(row: Any, name: str) -> Any:
    return row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)


_KEY = ("cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a", "q_dtype_w",
        "q_type", "use_g1u1", "doweight_stage1")


def key_text(row: Any) -> str:
    """The row's lookup key without gfx, as AITER's CSV columns spell it (``256,32,7168,512,…``)."""
    return ",".join(str(_get(row, k)) for k in _KEY)


def identity(path: str, row: Any) -> tuple[str, str, str, str, float]:
    """``(path, key, kernel1, kernel2, us)`` — what makes two rows of two versions of a file the same row."""
    us = _get(row, "us")
    return (path, key_text(row), str(_get(row, "kernel1") or ""), str(_get(row, "kernel2") or ""),
            round(float(us), 4) if us is not None else math.nan)


@dataclass(frozen=True)
class Revert:
    """One revert commit on AITER's main that removed tuned rows."""

    pr: int | None            # the reverting pull request
    reverts: int | None       # the pull request it reverts, when the commit names one
    commit: str
    date: str
    subject: str
    rows_removed: int
    rows_in_releases: int


@dataclass(frozen=True)
class Reverted:
    """capability_db/cost_reverted.toml, indexed: ``flagged[(release, identity)] = revert PR``."""

    reverts: tuple[Revert, ...]
    flagged: Mapping[tuple[str, tuple], int | None]
    provenance: Mapping[str, Any]

    def revert_of(self, release: str, path: str, row: Any) -> Revert | None:
        """The revert that removed this row of ``release`` (None: not a reverted row)."""
        if (release, identity(path, row)) not in self.flagged:
            return None
        pr = self.flagged[(release, identity(path, row))]
        return next(r for r in self.reverts if r.pr == pr)


def _int_or_none(value: Any, at: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CapabilityDBError(f"{at}: {key} must be a positive integer, got {value!r:.60}")
    return value


def parse_reverted(data: Mapping[str, Any], where: str = f"capability_db/{REVERTED_FILE}") -> Reverted:
    """Validate and index a parsed reverted-rows document; a broken entry raises CapabilityDBError."""
    if data.get("schema") != SCHEMA:
        raise CapabilityDBError(f"{where}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    prov = data.get("provenance")
    if not isinstance(prov, Mapping) or not all(isinstance(prov.get(k), str) and prov[k]
                                                for k in ("data", "repo", "script", "head_commit", "method")):
        raise CapabilityDBError(f"{where}: [provenance] needs non-empty strings data, repo, script, head_commit, "
                                "method")
    reverts = []
    for n, entry in enumerate(data.get("revert", [])):
        at = f"{where}: revert[{n}]"
        if not isinstance(entry, Mapping):
            raise CapabilityDBError(f"{at} must be a table")
        for key in ("commit", "date", "subject", "source"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise CapabilityDBError(f"{at} needs a non-empty string {key!r}")
        counts = []
        for key in ("rows_removed", "rows_in_releases"):
            v = entry.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise CapabilityDBError(f"{at}: {key} must be a count, got {v!r:.60}")
            counts.append(v)
        reverts.append(Revert(_int_or_none(entry.get("pr"), at, "pr"), _int_or_none(entry.get("reverts"), at,
                                                                                   "reverts"),
                              entry["commit"], entry["date"], entry["subject"], counts[0], counts[1]))
    prs = {r.pr for r in reverts}
    flagged: dict[tuple[str, tuple], int | None] = {}
    for n, entry in enumerate(data.get("row", [])):
        at = f"{where}: row[{n}]"
        if not isinstance(entry, Mapping):
            raise CapabilityDBError(f"{at} must be a table")
        for key in ("file", "key", "kernel1", "kernel2"):
            if not isinstance(entry.get(key), str):
                raise CapabilityDBError(f"{at} needs a string {key!r}")
        us = entry.get("us")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
            raise CapabilityDBError(f"{at}: us must be a positive finite number, got {us!r:.60}")
        if len(entry["key"].split(",")) != len(_KEY):
            raise CapabilityDBError(f"{at}: key must have the {len(_KEY)} lookup columns {', '.join(_KEY)}")
        pr = _int_or_none(entry.get("revert"), at, "revert")
        if pr not in prs:
            raise CapabilityDBError(f"{at}: revert {pr!r} is not a [[revert]] pr")
        releases = entry.get("releases")
        if not isinstance(releases, list) or not releases or not all(isinstance(t, str) for t in releases):
            raise CapabilityDBError(f"{at}: releases must be a non-empty list of release tags")
        ident = (entry["file"], entry["key"], entry["kernel1"], entry["kernel2"], round(float(us), 4))
        for tag in releases:
            flagged[(tag, ident)] = pr
    return Reverted(reverts=tuple(reverts), flagged=flagged, provenance=dict(prov))


@memoize(maxsize=1)
def load_reverted() -> Reverted:
    """capability_db/cost_reverted.toml, validated and indexed (cached; CapabilityDBError if broken)."""
    return parse_reverted(capdb.load_toml(REVERTED_FILE))


def drop(release: str, rows: Iterable[Any], path_of: Any = None,
         reverted: Reverted | None = None) -> tuple[list, list]:
    """``(kept, dropped)`` of ``rows`` of ``release``: dropped are the rows AITER reverted (each as ``(row,
    revert)``). ``path_of(row)`` gives the row's path inside the release (default: its ``file``)."""
    reverted = reverted if reverted is not None else load_reverted()
    kept, dropped = [], []
    for r in rows:
        path = path_of(r) if path_of is not None else _get(r, "file")
        rev = reverted.revert_of(release, path, r)
        if rev is None:
            kept.append(r)
        else:
            dropped.append((r, rev))
    return kept, dropped
