"""How much slower AITER's untuned (heuristic) fused-MoE kernels are than a tuned row: the evidence and its band.

Where AITER's dispatcher finds no tuned row it runs its default kernel choice; every basis of the cost model predicts
at tuned-kernel speed, so :func:`moedispatch.cost.model.predict` multiplies those token counts by the ``[heuristic]``
band of capability_db/cost_priors.toml. That band is derived here from capability_db/cost_heuristic_evidence.toml:
every published same-shape, same-GPU A/B of AITER's untuned default against a tuned row we found (one thread per
``[[pair]]`` table, one ratio per token count; leads whose numbers do not measure this are listed ``[[excluded]]``
with why). :func:`band` is what ``benchmarks/bench_cost_model.py --fit`` writes; :func:`held_out_coverage` is the
benchmark's ``coverage["heuristic"]``: each thread's ratios against a band derived from the other threads.

The band's low end is 1: the tuned row is the fastest of a sweep whose candidates include the default's kernel
instance, so the untuned call is not faster (sglang#37072 measured 1.02× at 2 tokens). Every published ratio is above 1,
so :func:`moedispatch.cost.drift.band_of` moves the p10–p90 band down to 1 rather than stretching it: it holds as many
ratios as p10–p90 does (15 of 17), not every ratio up to p90. Nothing is read at import.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from moedispatch._util.caches import memoize
from moedispatch.core.errors import CapabilityDBError
from moedispatch.cost import drift
from moedispatch.data import capdb

__all__ = ["EVIDENCE_FILE", "SCHEMA", "Pair", "parse_evidence", "load_evidence", "band", "held_out_coverage"]

EVIDENCE_FILE = "cost_heuristic_evidence.toml"
SCHEMA = "moedispatch.cost_heuristic_evidence/1"
_TEXT = ("source", "where", "gpu", "gfx", "shape")


@dataclass(frozen=True)
class Pair:
    """One token count of one thread's A/B: AITER's untuned default and a tuned row, same shape, same GPU."""

    source: str
    gfx: str
    cu: int
    tokens: int
    untuned_us: float
    tuned_us: float

    @property
    def ratio(self) -> float:
        return self.untuned_us / self.tuned_us


def _positive(value: Any, at: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CapabilityDBError(f"{at}: needs positive finite numbers, got {value!r:.60}")
    return float(value)


def _pairs_of(entry: Any, at: str) -> list[Pair]:
    if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) and entry[k] for k in _TEXT):
        raise CapabilityDBError(f"{at} needs non-empty strings {', '.join(_TEXT)}")
    if not str(entry["source"]).startswith("https://github.com/"):
        raise CapabilityDBError(f"{at}: source must be the thread's https://github.com/ address, got "
                                f"{entry['source']!r:.80}")
    cu = entry.get("cu")
    if isinstance(cu, bool) or not isinstance(cu, int) or cu < 0:
        raise CapabilityDBError(f"{at}: cu must be a whole number >= 0 (0: not stated), got {cu!r:.40}")
    lists = [entry.get(k) for k in ("tokens", "untuned_us", "tuned_us")]
    if not all(isinstance(v, list) and v for v in lists) or len({len(v) for v in lists}) != 1:
        raise CapabilityDBError(f"{at}: tokens, untuned_us and tuned_us must be lists of the same length")
    out = []
    for m, u, t in zip(*lists):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise CapabilityDBError(f"{at}: tokens must be whole numbers >= 1, got {m!r:.40}")
        out.append(Pair(entry["source"], entry["gfx"], cu, m, _positive(u, at), _positive(t, at)))
    return out


def parse_evidence(data: Mapping[str, Any], where: str = f"capability_db/{EVIDENCE_FILE}") -> tuple[Pair, ...]:
    """Validate the evidence document; a broken entry raises CapabilityDBError naming the entry and the problem."""
    if data.get("schema") != SCHEMA:
        raise CapabilityDBError(f"{where}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    tables = data.get("pair")
    if not isinstance(tables, list) or not tables:
        raise CapabilityDBError(f"{where}: needs at least one [[pair]]")
    for i, entry in enumerate(data.get("excluded") or []):
        if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) and entry[k]
                                                     for k in ("source", "why")):
            raise CapabilityDBError(f"{where}: [[excluded]] #{i + 1} needs non-empty strings source and why")
    pairs = [p for i, entry in enumerate(tables) for p in _pairs_of(entry, f"{where}: [[pair]] #{i + 1}")]
    sources = [entry["source"] for entry in tables]
    if len(set(sources)) != len(sources):
        raise CapabilityDBError(f"{where}: one [[pair]] table per thread (a source is listed twice)")
    return tuple(pairs)


@memoize(maxsize=1)
def load_evidence() -> tuple[Pair, ...]:
    """capability_db/cost_heuristic_evidence.toml, validated (cached; CapabilityDBError if broken)."""
    return parse_evidence(capdb.load_toml(EVIDENCE_FILE))


def band(pairs: Sequence[Pair]) -> dict[str, Any]:
    """The ``[heuristic]`` table: ``factor`` = the median ratio, ``low``/``high`` = :func:`drift.band_of` of the
    ratios (as many as p10–p90 hold, from 1), rounded outwards to 4 digits so the bars still hold the ratios at their
    ends, ``n`` pairs, ``threads``, and a ``source`` naming every thread."""
    ratios = [p.ratio for p in pairs]
    low, high = drift.band_of(math.log(r) for r in ratios)
    threads = list(dict.fromkeys(p.source for p in pairs))
    return {"factor": round(statistics.median(ratios), 4), "low": math.floor(low * 1e4) / 1e4,
            "high": math.ceil(high * 1e4) / 1e4,
            "n": len(ratios), "threads": len(threads), "confidence": "derived",
            "source": f"capability_db/{EVIDENCE_FILE}: {len(ratios)} untuned-vs-tuned AITER fused-MoE timings of "
                      f"the same shape from {', '.join(threads)}"}


def held_out_coverage(pairs: Sequence[Pair]) -> tuple[float, int]:
    """``(share, n)``: the share of pairs inside the ``[low, high]`` of a band derived without their own thread
    (leave one thread out — the threads, not the token counts, are the independent measurements)."""
    inside = 0
    for source in dict.fromkeys(p.source for p in pairs):
        others = [p for p in pairs if p.source != source]
        if not others:
            continue
        b = band(others)
        inside += sum(b["low"] <= p.ratio <= b["high"] for p in pairs if p.source == source)
    return inside / len(pairs), len(pairs)
