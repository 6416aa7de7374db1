"""How far AITER's tuned µs move between releases: the derivation behind the release-aware bars of
:mod:`moedispatch.cost.release` (capability_db/cost_release_drift.toml).

``scripts/build_cost_drift.py``, ``benchmarks/bench_cost_model.py`` and tests/test_cost_release.py all measure with
these functions: per release, the lint-clean rows of AITER's default tuned set on the targets the priors are fit for
(:func:`release_rows`), then every re-tuned key (:func:`retunings`) and every in-shape interpolation across a re-tuning
(:func:`interpolations`), summarized as a band (:func:`band_of`) whose held-out share :func:`held_out_share` checks.
Nothing is read at import.
"""

from __future__ import annotations

import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from moedispatch.cost import model as cost
from moedispatch.cost import reverted as reverted_rows
from moedispatch.data import aiter_configs, aiter_index, capdb

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["manifest", "ref_of", "release_rows", "Truth", "retunings", "interpolations", "band_of", "held_out_share"]

_REPO = "ROCm/aiter"


def manifest(data: str) -> list[tuple[str, str, str]]:
    """``(tag, commit, date)`` of ``data/manifest.toml`` in its order (release date; ``head`` last)."""
    with open(os.path.join(data, "manifest.toml"), "rb") as fh:
        doc = tomllib.load(fh)
    return [(tag, str(r["commit"]), str(r["date"])) for tag, r in doc["release"].items()]


def ref_of(tag: str, commit: str) -> str:
    """How a citation names a release: the tag, or head's commit (8 hex digits)."""
    return tag if tag.startswith("v") else commit[:8]


def release_rows(data: str | None,
                 reference: Mapping[tuple[str, int], str] | None = None) -> list[tuple[str, str, dict]]:
    """Per release of ``data`` (``../shared/aiter``; None: moedispatch's AITER index, derived from it): ``(tag,
    commit, {key: row})`` of the lint-clean, untagged, timed
    rows of AITER's default tuned set on the targets the priors are fit for (``reference``: (gfx, cu) → product;
    default the priors' ``[[reference]]``), first row per lookup key in AITER's merge order, without the rows AITER
    reverted (:mod:`moedispatch.cost.reverted`)."""
    if reference is None:
        reference = cost.load_priors().reference
    peaks = {k: capdb.product_peaks(p) for k, p in reference.items()}
    out = []
    listing = manifest(data) if data is not None else [(r.tag, r.commit, r.date) for r in aiter_index.releases()]
    for tag, commit, _date in listing:
        cs = aiter_configs.load_config_set(os.path.join(data, tag) if data is not None else tag)
        root = os.path.join(data, tag) if data is not None else ""

        def path_of(r: Any) -> str:
            return os.path.relpath(r.file, root).replace(os.sep, "/") if data is not None else r.file.split(":", 1)[-1]

        rows = [r for r in cs.rows if not r.tag and r.us and r.gfx and (r.gfx, r.cu_num) in peaks]
        rows, _reverted = reverted_rows.drop(tag, rows, path_of)
        clean, _rejected = cost.lint_rows(rows, lambda r: peaks[(r.gfx, r.cu_num)])
        keyed: dict[tuple, Any] = {}
        for r in clean:
            keyed.setdefault(r.key(), r._replace(file=path_of(r)))
        out.append((tag, commit, keyed))
    return out


@dataclass(frozen=True)
class Truth:
    """One truth of another release against a prediction from the rows' release: ``log(truth / prediction)``.

    ``pair`` is the index of the later release of the two consecutive releases compared; ``file`` is where the
    truth's row sits (``ROCm/aiter@<ref>:<path>``)."""

    pair: int
    log_ratio: float
    file: str
    key: tuple


def retunings(releases: Sequence[tuple[str, str, dict]], relation: str) -> list[Truth]:
    """Every key whose lint-clean µs differs between two consecutive releases: ``later`` = the later value against
    the earlier release's row (a user newer than the rows), ``earlier`` = the reverse."""
    out = []
    for i in range(1, len(releases)):
        a, (tb, cb, b) = releases[i - 1][2], releases[i]
        for key, rb in b.items():
            ra = a.get(key)
            if ra is None or float(ra.us) == float(rb.us):
                continue
            if relation == "later":
                out.append(Truth(i, math.log(float(rb.us) / float(ra.us)), f"{_REPO}@{ref_of(tb, cb)}:{rb.file}", key))
            else:
                ta, ca = releases[i - 1][0], releases[i - 1][1]
                out.append(Truth(i, math.log(float(ra.us) / float(rb.us)), f"{_REPO}@{ref_of(ta, ca)}:{ra.file}", key))
    return out


def interpolations(releases: Sequence[tuple[str, str, dict]], relation: str,
                   reference: Mapping[tuple[str, int], str] | None = None) -> list[Truth]:
    """For every tuned shape whose rows changed between two consecutive releases, each row of the truth's release
    predicted the way :func:`moedispatch.cost.model.predict` interpolates — log-log along the roofline work between
    the nearest lower and upper clean rows of the same shape, other than its own token count — from the other
    release's rows (``later``: rows of the earlier release, truths of the later; ``earlier``: the reverse)."""
    if reference is None:
        reference = cost.load_priors().reference
    peaks = {k: capdb.product_peaks(p) for k, p in reference.items()}

    def shapes(rows: dict) -> dict[tuple, dict[int, Any]]:
        by: dict[tuple, dict[int, Any]] = defaultdict(dict)
        for r in rows.values():
            by[r.shape()][r.token] = r
        return by

    out = []
    for i in range(1, len(releases)):
        (ta, ca, a), (tb, cb, b) = releases[i - 1], releases[i]
        sa, sb = shapes(a), shapes(b)
        if relation == "later":
            src, truth, tag, commit = sa, sb, tb, cb
        else:
            src, truth, tag, commit = sb, sa, ta, ca
        for shape, rows in truth.items():
            other = src.get(shape)
            if not other or {m: float(r.us) for m, r in other.items()} == {m: float(r.us) for m, r in rows.items()}:
                continue
            for m, r in rows.items():
                below = [t for t in other if t < m]
                above = [t for t in other if t > m]
                if not below or not above:
                    continue
                lo, hi = other[max(below)], other[min(above)]
                geo = cost.Geometry.of_row(r)
                pk = peaks[(r.gfx, r.cu_num)]
                pred = cost.interpolate(m, (lo.token, float(lo.us)), (hi.token, float(hi.us)),
                                        lambda t: sum(cost.roofline_us(geo, t, pk)))
                out.append(Truth(i, math.log(float(r.us) / pred), f"{_REPO}@{ref_of(tag, commit)}:{r.file}",
                                 r.key()))
    return out


def band_of(log_ratios: Iterable[float]) -> tuple[float, float]:
    """``(low, high)``: p10 and p90 of the ratios (nearest rank), holding 1 — the prediction is inside its own bars.

    Where the whole lower tenth lies above 1 (or the upper tenth below it) that end is 1, and the band *moves* to it
    rather than stretching: the other end comes in by as many ratios as the band gained at this end, so the band holds
    as many ratios as p10–p90 does (about 80%) and not every ratio between 1 and p90 as well (the heuristic band's
    ratios are all above 1: [1, p90] held 15 of its 17 pairs, 88%)."""
    v = sorted(log_ratios)
    n = len(v)
    lo, hi = int(0.1 * n), int(0.9 * n)      # nearest rank: both < n
    if v[lo] > 0:            # p10 above 1: the band starts at 1, past every ratio below p10 (below <= lo)
        below = sum(x < 0 for x in v)
        return 1.0, math.exp(v[below + hi - lo])
    if v[hi] < 0:            # p90 below 1: the band ends at 1 (above <= n - 1 - hi)
        above = sum(x > 0 for x in v)
        return math.exp(v[n - 1 - above - (hi - lo)]), 1.0
    return math.exp(v[lo]), math.exp(v[hi])


def held_out_share(truths: Sequence[Truth]) -> float:
    """Share of truths inside a band derived without their own release pair (leave one release pair out): what
    the bars hold on re-tunings they were not derived from."""
    inside = 0
    for pair in sorted({t.pair for t in truths}):
        lo, hi = band_of(t.log_ratio for t in truths if t.pair != pair)
        inside += sum(lo <= math.exp(t.log_ratio) <= hi for t in truths if t.pair == pair)
    return inside / len(truths)
