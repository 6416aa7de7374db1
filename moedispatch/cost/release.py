"""Release-aware error bars: how far AITER's tuned µs move between releases, and which bars a cost gets.

A ``tuned`` or ``interpolated`` prediction is AITER's tuner's measurement in *one* release (the rows' release). A user
whose AITER is exactly that release runs those rows: the bars are the routing-skew band ``[tuned]`` and the in-shape
band ``[interpolated]`` of capability_db/cost_priors.toml. A user whose AITER is another build (a dev build between
releases, a nightly newer than the index, an unparseable version) meets AITER's re-tunings too: every key re-tuned
between two releases moved by a p10–p90 spread of about 0.81–1.14× (later ÷ earlier), far outside ``[0.97, 1.10]``.
Those bars come from capability_db/cost_release_drift.toml, derived by ``scripts/build_cost_drift.py`` from AITER's
tuned CSVs per release (``../shared/aiter/<tag>/``) with the release pair and files of every re-tuning it counts.

Relations (the user's AITER against the rows' release), decided by :func:`context_of` from the tuned set a plan
reads (:func:`moedispatch.data.aiter_configs.config_set_for`):

* ``exact`` — the rows are the user's own: that release of the index, the installed AITER's files, or a folder
  passed with ``MOEDISPATCH_AITER_CONFIGS`` / ``AITER_CONFIG_FMOE``;
* ``later`` — the user's AITER is newer than the rows' release (a dev build after it, or newer than the index:
  planned with ``head``);
* ``earlier`` — older than every release of the index (planned with the oldest);
* ``unknown`` — a version that does not parse.

The derivation of the bands from AITER's history lives in :mod:`moedispatch.cost.drift` (build script, benchmark and
tests measure the same thing there). Nothing is read at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from moedispatch._util.caches import memoize
from moedispatch.core.aiter_release import release_of
from moedispatch.core.errors import CapabilityDBError
from moedispatch.data import aiter_index, capdb


__all__ = ["DRIFT_FILE", "SCHEMA", "RELATIONS", "BASES", "ReleaseContext", "Drift", "context_of", "load_drift",
           "parse_drift", "bars_for", "SHARE"]

DRIFT_FILE = "cost_release_drift.toml"
SCHEMA = "moedispatch.cost_release_drift/1"
RELATIONS = ("exact", "later", "earlier", "unknown")
#: The bases whose bars depend on the release (the roofline priors' bars are leave-one-model-out already).
BASES = ("tuned", "interpolated")
#: Share of truths the bars are stated to hold: p10–p90.
SHARE = 0.8


# -- which release's µs ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReleaseContext:
    """Whose µs a tuned row is (``label``: ``AITER v0.1.18``) and how the user's AITER relates to it."""

    release: str | None     # the index's tag of the rows (``v0.1.18``, ``head``); None for installed / explicit files
    label: str
    relation: str           # one of RELATIONS
    version: str | None     # the AITER version planned for

    def describe(self) -> str:
        """``µs of AITER v0.1.18's tuned rows (planned for 0.1.18.post3: …)``, for a cost's detail."""
        text = f"µs of {self.label}"
        if self.relation == "exact":
            return text
        what = {"later": "a newer AITER", "earlier": "an older AITER", "unknown": "an AITER of unknown release"}
        return (f"{text}; planned for {what[self.relation]} ({self.version}): bars widened to AITER's re-tuning "
                f"spread across releases (capability_db/{DRIFT_FILE})")


def _version(text: str | None) -> Any:
    return None if text is None else release_of(text)


def context_of(cs: Any) -> ReleaseContext:
    """The :class:`ReleaseContext` of a :class:`~moedispatch.data.aiter_configs.ConfigSet` (origin, release, version)."""
    origin, tag, version = getattr(cs, "origin", None), getattr(cs, "release", None), getattr(cs, "version", None)
    if origin != "bundled" or not tag:
        label = f"{cs.label}" if getattr(cs, "label", None) else "the tuned rows given"
        return ReleaseContext(None, label, "exact", version)
    rel = aiter_index.release(tag)
    label = f"AITER {rel.tag} ({rel.commit[:10]})" if rel.version is not None else \
        f"AITER main @ {rel.commit[:10]} ({rel.date})"
    if not getattr(cs, "notes", ()):
        return ReleaseContext(tag, label, "exact", version)
    asked = _version(version)
    if asked is None:
        return ReleaseContext(tag, label, "unknown", version)
    if rel.version is None:          # head: planned for a version newer than every release
        return ReleaseContext(tag, label, "later", version)
    return ReleaseContext(tag, label, "later" if asked > rel.version else "earlier", version)


# -- the shipped bands -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Drift:
    """capability_db/cost_release_drift.toml, indexed: ``bands[(basis, relation)] = (low, high)`` (ratios of the
    truth in another release to the prediction from the rows' release) for relations other than ``exact``."""

    bands: Mapping[tuple[str, str], tuple[float, float]]
    provenance: Mapping[str, Any]


def parse_drift(data: Mapping[str, Any], where: str = f"capability_db/{DRIFT_FILE}") -> Drift:
    """Validate and index a parsed drift document; a broken entry raises CapabilityDBError naming key and problem."""
    if data.get("schema") != SCHEMA:
        raise CapabilityDBError(f"{where}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    prov = data.get("provenance")
    if not isinstance(prov, Mapping) or not all(isinstance(prov.get(k), str) and prov[k]
                                                for k in ("data", "script", "first", "last", "method")):
        raise CapabilityDBError(f"{where}: [provenance] needs non-empty strings data, script, first, last, method")
    table = data.get("band")
    if not isinstance(table, Mapping):
        raise CapabilityDBError(f"{where}: missing table [band]")
    bands: dict[tuple[str, str], tuple[float, float]] = {}
    for basis in BASES:
        for relation in RELATIONS[1:]:
            entry = (table.get(basis) or {}).get(relation) if isinstance(table.get(basis), Mapping) else None
            at = f"{where}: [band.{basis}.{relation}]"
            if not isinstance(entry, Mapping):
                raise CapabilityDBError(f"{at} is missing")
            vals = []
            for key in ("low", "high"):
                v = entry.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise CapabilityDBError(f"{at}: {key} must be a positive finite number, got {v!r:.60}")
                vals.append(float(v))
            if not vals[0] <= 1.0 <= vals[1]:
                raise CapabilityDBError(f"{at}: needs low <= 1 <= high (ratios to the prediction), got {vals}")
            bands[(basis, relation)] = (vals[0], vals[1])
    return Drift(bands=bands, provenance=dict(prov))


@memoize(maxsize=1)
def load_drift() -> Drift:
    """capability_db/cost_release_drift.toml, validated and indexed (cached; CapabilityDBError if broken)."""
    return parse_drift(capdb.load_toml(DRIFT_FILE))


def bars_for(basis: str, ctx: ReleaseContext | None, same_release: tuple[float, float]) -> tuple[float, float]:
    """The ``(low, high)`` ratios of a ``tuned`` / ``interpolated`` prediction: ``same_release`` (the priors' band)
    when the user runs the rows' release, else the wider of it and the re-tuning band at each end."""
    if ctx is None or ctx.relation == "exact":
        return same_release
    lo, hi = load_drift().bands[(basis, ctx.relation)]
    return min(lo, same_release[0]), max(hi, same_release[1])


# -- derivation (build script, benchmark, tests) -------------------------------------------------------------------
