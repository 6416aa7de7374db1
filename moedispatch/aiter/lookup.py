"""AITER's tuned-row lookup over a :class:`~moedispatch.data.aiter_configs.ConfigSet`: the per-set index (exact
key, act-wildcarded key, ``flydsl_fallback`` rows), the exact → act-wildcard → smaller-tier walk of
``get_2stage_cfgs`` under a release's rules (:func:`_lookup`), and the ``flydsl_fallback`` swap of releases that
have it (:func:`_flydsl_fallback_row`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from moedispatch.aiter.key import DispatchKey
from moedispatch.aiter.rules import _TIERS, Rules, lookup_rules
from moedispatch.data.aiter_configs import ConfigSet, TunedRow


_WILDCARD = "__ignore__"


@dataclass
class _Index:
    primary: dict[tuple, list[TunedRow]]
    fallback: dict[tuple, list[TunedRow]]
    duplicates: int
    #: ``_tag == "flydsl_fallback"`` rows, keyed exactly and act-wildcarded (Rules.flydsl_fallback_rows).
    fly_fallback: dict[tuple, list[TunedRow]] = field(default_factory=dict)


_INDEXES: dict[int, tuple[ConfigSet, _Index]] = {}


def _index(cs: ConfigSet) -> _Index:
    hit = _INDEXES.get(id(cs))
    if hit is not None and hit[0] is cs:
        return hit[1]
    primary: dict[tuple, list[TunedRow]] = {}
    fallback: dict[tuple, list[TunedRow]] = {}
    dups = 0
    fly: dict[tuple, list[TunedRow]] = {}
    for row in cs.rows:
        if row.tag == "flydsl_fallback":
            # Never in the main dicts; releases with Rules.flydsl_fallback_rows read them when flydsl is missing.
            fly.setdefault(("exact",) + row.key(with_gfx=False), []).append(row)
            fly.setdefault(("any",) + row.key(with_gfx=False, act=_WILDCARD), []).append(row)
            continue
        k = row.key(with_gfx=False)
        bucket = primary.setdefault(k, [])
        if any(r.gfx == row.gfx for r in bucket):
            dups += 1
        bucket.append(row)
        fallback.setdefault(row.key(with_gfx=False, act=_WILDCARD), []).append(row)
    idx = _Index(primary, fallback, dups, fly)
    _INDEXES[id(cs)] = (cs, idx)
    return idx


def _first(rows: list[TunedRow] | None, gfx: str, rules: Rules) -> TunedRow | None:
    for row in rows or ():
        if not rules.gfx_key or row.gfx in (gfx, None):
            return row
    return None


def _lookup(cs: ConfigSet, key: DispatchKey, token: int, q_a: str, model: "str | Rules") -> tuple[
        TunedRow | None, list[str]]:
    """The row AITER's lookup returns under a release's rules, with notes on how.

    Exact first (only where the key holds ``str(activation)``; at HEAD it holds the pybind ``ActivationType``
    while the CSV holds strings such as ``"ActivationType.Silu"``, so the exact dict cannot match — derived from
    get_2stage_cfgs ``keys[7] = activation``), then the act-wildcard dict (first row of the shape in merge order),
    then smaller token tiers."""
    rules = lookup_rules(model)
    idx = _index(cs)
    notes: list[str] = []
    tokens = [token]
    if rules.padded_m == "tiers" and token > _TIERS[0]:
        tokens += [t for t in reversed(_TIERS[:_TIERS.index(token)])] if token in _TIERS else []
    for t in tokens:
        k = key.aiter_tuple(t, q_a, with_gfx=False)
        exact = _first(idx.primary.get(k), key.gfx, rules)
        row = exact if rules.act_exact else None
        if row is None and rules.act_wildcard:
            row = _first(idx.fallback.get(k[:6] + (_WILDCARD,) + k[7:]), key.gfx, rules)
            if row is not None and row.act_type != key.act_type:
                notes.append(f"the first row of this shape is a {row.act_type.split('.')[-1]} row ({row.where}) and "
                             f"AITER's exact lookup cannot match the {key.act_type.split('.')[-1]} row"
                             + (f" at {exact.where}" if exact else "")
                             + (" (it keys on the ActivationType enum, the CSV on strings)" if not rules.act_exact
                                else "") + ": the act-wildcard match decides [derived]")
        if row is not None:
            if t != token:
                notes.append(f"no row at tier {token}; AITER falls back to the {t} tier")
            return row, notes
    return None, notes


def _flydsl_fallback_row(cs: ConfigSet, key: DispatchKey, token: int, q_a: str, rules: Rules, row: TunedRow
                         ) -> tuple[TunedRow | None, list[str]]:
    """Releases with ``Rules.flydsl_fallback_rows`` (v0.1.11-v0.1.17): flydsl is not importable and the tuned row
    names FlyDSL kernels, so AITER looks the requested bucket up among the ``flydsl_fallback`` rows (act wildcarded
    from v0.1.14, exact before) and takes that row, else drops the row for the heuristics
    (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1062-1080)."""
    k = key.aiter_tuple(token, q_a, with_gfx=False)
    look = ("any",) + k[:6] + (_WILDCARD,) + k[7:] if rules.act_wildcard else ("exact",) + k
    fb = _first(_index(cs).fly_fallback.get(look), key.gfx, rules)
    if fb is not None:
        return fb, [f"flydsl is not importable: AITER swaps row {row.where} for its flydsl_fallback row {fb.where}"]
    return None, [f"flydsl is not importable and row {row.where} has no flydsl_fallback row: AITER drops it for the "
                  "default heuristics"]
