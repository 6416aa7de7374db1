"""The fitted priors (``capability_db/cost_priors.toml``, written by ``benchmarks/bench_cost_model.py --fit``):
validated and indexed (:func:`parse_priors`, :func:`load_priors`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from moedispatch._util.caches import memoize
from moedispatch.core.errors import CapabilityDBError
from moedispatch.data import capdb
from moedispatch.cost.geometry import FEATURE_SIZES

_PRIORS_FILE = "cost_priors.toml"
_PRIORS_SCHEMA = "moedispatch.cost_priors/1"
_PAIR = re.compile(r"a[0-9]{1,2}w[0-9]{1,2}")


@dataclass(frozen=True)
class Priors:
    """capability_db/cost_priors.toml, indexed. Build with :func:`load_priors`."""

    models: Mapping[tuple, tuple[str, tuple[float, ...]]]     # (level, gfx, cu, bucket) -> (features, coef)
    buckets: Mapping[tuple[str, int], tuple[int, ...]]       # (gfx, cu) -> fitted buckets, ascending
    bands: Mapping[tuple, tuple[float, float]]               # (level, gfx, cu) -> (low ratio, high ratio)
    reference: Mapping[tuple[str, int], str]                 # (gfx, cu) -> product the priors were fit against
    decode: Mapping[tuple[str, int], "DecodeFit"]            # (gfx, cu) (cu 0: any) -> latency-plus-bytes fit
    tuned: tuple[float, float]
    interpolated: tuple[float, float]
    generic: tuple[float, float, float]                      # efficiency, low ratio, high ratio
    backend: Mapping[str, Mapping[str, Any]]
    heuristic: Mapping[str, Any]                             # factor, low, high, source: AITER's untuned kernels
    provenance: Mapping[str, Any]
    #: (gfx, cu, pair) -> the decode fit with that (activation, weight) pair's own fixed term (:attr:`Geometry.pair`)
    decode_pair: Mapping[tuple[str, int, str], "DecodeFit"] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeFit:
    """``us = fixed_us + t_mem / efficiency`` up to ``max_tokens`` tokens (``t_mem`` at the target's datasheet HBM
    bandwidth), fit on ``n`` lint-clean tuned rows (:func:`fit_decode`)."""

    fixed_us: float
    efficiency: float
    max_tokens: int
    n: int = 0
    pair: str = ""          # "" for the (arch, CU count) fit; else the (activation, weight) pair of its fixed term


def _num(value: Any, where: str, key: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            (positive and value <= 0):
        raise CapabilityDBError(f"{where}: {key} must be a {'positive ' if positive else ''}finite number, "
                                f"got {value!r:.60}")
    return float(value)


def _band(entry: Any, where: str) -> tuple[float, float]:
    if not isinstance(entry, Mapping):
        raise CapabilityDBError(f"{where} must be a table with low and high")
    for key in ("low", "high"):
        if key not in entry:
            raise CapabilityDBError(f"{where} lacks key {key!r}")
    low, high = _num(entry["low"], where, "low"), _num(entry["high"], where, "high")
    if not low <= 1.0 <= high:
        raise CapabilityDBError(f"{where}: needs low <= 1 <= high (ratios to the prediction), got {low}, {high}")
    return low, high


def parse_priors(data: Mapping[str, Any], where: str = f"capability_db/{_PRIORS_FILE}") -> Priors:
    """Validate and index a parsed priors document; a broken entry raises CapabilityDBError naming key and problem."""
    if data.get("schema") != _PRIORS_SCHEMA:
        raise CapabilityDBError(f"{where}: schema must be {_PRIORS_SCHEMA!r}, got {data.get('schema')!r}")
    for table in ("provenance", "tuned", "interpolated", "generic", "backend", "heuristic"):
        if not isinstance(data.get(table), Mapping):
            raise CapabilityDBError(f"{where}: missing table [{table}]")
    for key in ("snapshot", "commit", "date", "script"):
        if not isinstance(data["provenance"].get(key), str) or not data["provenance"][key]:
            raise CapabilityDBError(f"{where}: [provenance] needs a non-empty string {key!r}")
    models, buckets = _parse_models(data, where)
    bands, reference = _parse_bands(data, where)
    decode, decode_pair = _parse_decode(data, where)
    gen = data["generic"]
    for key in ("efficiency", "low", "high"):
        if key not in gen:
            raise CapabilityDBError(f"{where}: [generic] lacks key {key!r}")
    generic = (_num(gen["efficiency"], f"{where}: [generic]", "efficiency"),) + _band(gen, f"{where}: [generic]")
    backend, heuristic = _parse_factors(data, where)
    return Priors(models=models, buckets={k: tuple(sorted(v)) for k, v in buckets.items()}, bands=bands,
                  reference=reference, decode=decode, tuned=_band(data["tuned"], f"{where}: [tuned]"),
                  interpolated=_band(data["interpolated"], f"{where}: [interpolated]"), generic=generic,
                  backend=backend, heuristic=heuristic, provenance=dict(data["provenance"]), decode_pair=decode_pair)


def _parse_models(data: Mapping[str, Any], where: str) -> tuple[dict[tuple, tuple[str, tuple[float, ...]]],
                                                                 dict[tuple[str, int], set[int]]]:
    """The [[model]] entries: {(level, gfx, cu, bucket): (features, coefficients)} and each arch's fitted buckets."""
    models: dict[tuple, tuple[str, tuple[float, ...]]] = {}
    buckets: dict[tuple[str, int], set[int]] = {}
    for n, m in enumerate(data.get("model", [])):
        at = f"{where}: model[{n}]"
        if not isinstance(m, Mapping):
            raise CapabilityDBError(f"{at} must be a table")
        for key in ("level", "gfx", "features", "coef"):
            if key not in m:
                raise CapabilityDBError(f"{at} lacks key {key!r}")
        feats = m["features"]
        if feats not in FEATURE_SIZES:
            raise CapabilityDBError(f"{at}: features {feats!r} unknown (known: {', '.join(FEATURE_SIZES)})")
        coef = m["coef"]
        if not isinstance(coef, list) or len(coef) != FEATURE_SIZES[feats]:
            raise CapabilityDBError(f"{at}: coef must be {FEATURE_SIZES[feats]} numbers for features {feats!r}")
        coef_t = tuple(_num(c, at, "coef", positive=False) for c in coef)
        level = m["level"]
        if level not in ("bucket", "arch_cu", "arch"):
            raise CapabilityDBError(f"{at}: level must be bucket, arch_cu or arch, got {level!r}")
        cu = int(_num(m.get("cu"), at, "cu")) if level != "arch" else 0
        b = int(_num(m.get("bucket"), at, "bucket")) if level == "bucket" else 0
        models[(level, str(m["gfx"]), cu, b)] = (feats, coef_t)
        if level == "bucket":
            buckets.setdefault((str(m["gfx"]), cu), set()).add(b)
    return models, buckets


def _parse_bands(data: Mapping[str, Any], where: str) -> tuple[dict[tuple, tuple[float, float]],
                                                                dict[tuple[str, int], str]]:
    """The [[band]] entries per (level, gfx, cu) and the [[reference]] product of each (gfx, CU count)."""
    bands: dict[tuple, tuple[float, float]] = {}
    for n, entry in enumerate(data.get("band", [])):
        at = f"{where}: band[{n}]"
        if not isinstance(entry, Mapping) or "level" not in entry or "gfx" not in entry:
            raise CapabilityDBError(f"{at} needs level, gfx, low and high")
        bands[(entry["level"], str(entry["gfx"]), int(entry.get("cu", 0)))] = _band(entry, at)
    reference: dict[tuple[str, int], str] = {}
    for n, entry in enumerate(data.get("reference", [])):
        at = f"{where}: reference[{n}]"
        if not isinstance(entry, Mapping) or not {"gfx", "cu", "product"} <= set(entry):
            raise CapabilityDBError(f"{at} needs gfx, cu and product")
        reference[(str(entry["gfx"]), int(entry["cu"]))] = str(entry["product"])
    return bands, reference


def _parse_decode(data: Mapping[str, Any], where: str) -> tuple[dict[tuple[str, int], DecodeFit],
                                                                 dict[tuple[str, int, str], DecodeFit]]:
    """The [[decode]] fits per (gfx, cu), and per activation × weight bits pair (whose parent must exist)."""
    decode: dict[tuple[str, int], DecodeFit] = {}
    decode_pair: dict[tuple[str, int, str], DecodeFit] = {}
    for n, entry in enumerate(data.get("decode", [])):
        at = f"{where}: decode[{n}]"
        if not isinstance(entry, Mapping) or not {"gfx", "cu", "fixed_us", "efficiency", "max_tokens"} <= set(entry):
            raise CapabilityDBError(f"{at} needs gfx, cu, fixed_us, efficiency and max_tokens")
        eff = _num(entry["efficiency"], at, "efficiency")
        if eff > 1:
            raise CapabilityDBError(f"{at}: efficiency must be <= 1 (a share of the datasheet bandwidth), got {eff}")
        pair = entry.get("pair", "")
        if not isinstance(pair, str) or (pair and not _PAIR.fullmatch(pair)):
            raise CapabilityDBError(f"{at}: pair must be like 'a8w4' (activation and weight bits), got {pair!r:.60}")
        fit = DecodeFit(fixed_us=_num(entry["fixed_us"], at, "fixed_us", positive=False), efficiency=eff,
                        max_tokens=int(_num(entry["max_tokens"], at, "max_tokens")), n=int(entry.get("n", 0)),
                        pair=pair)
        key = (str(entry["gfx"]), int(_num(entry["cu"], at, "cu", positive=False)))
        if pair:
            decode_pair[key + (pair,)] = fit
        else:
            decode[key] = fit
    for (g, c, pair), fit in decode_pair.items():
        parent = decode.get((g, c))
        if parent is None or (parent.efficiency, parent.max_tokens) != (fit.efficiency, fit.max_tokens):
            raise CapabilityDBError(f"{where}: decode {g}/{c} pair {pair} needs a decode entry for {g}/{c} without a "
                                    "pair with the same efficiency and max_tokens (a pair has its own fixed term "
                                    "only)")
    return decode, decode_pair


def _parse_factors(data: Mapping[str, Any], where: str) -> tuple[dict[str, Mapping[str, Any]], dict[str, Any]]:
    """The [backend.*] factor bands (triton, emulation and other required) and the [heuristic] band."""
    backend: dict[str, Mapping[str, Any]] = {}
    for name, entry in data["backend"].items():
        at = f"{where}: [backend.{name}]"
        if not isinstance(entry, Mapping) or "factor" not in entry or "source" not in entry:
            raise CapabilityDBError(f"{at} needs factor, low, high and source")
        factor = _num(entry["factor"], at, "factor")
        low, high = _num(entry.get("low"), at, "low"), _num(entry.get("high"), at, "high")
        if not low <= factor <= high:
            raise CapabilityDBError(f"{at}: needs low <= factor <= high, got {low}, {factor}, {high}")
        backend[name] = dict(entry)
    for required in ("triton", "emulation", "other"):
        if required not in backend:
            raise CapabilityDBError(f"{where}: missing table [backend.{required}]")
    heuristic = dict(data["heuristic"])
    at = f"{where}: [heuristic]"
    if not isinstance(heuristic.get("source"), str) or not heuristic["source"]:
        raise CapabilityDBError(f"{at} needs factor, low, high and source")
    factor = _num(heuristic.get("factor"), at, "factor")
    low, high = _num(heuristic.get("low"), at, "low"), _num(heuristic.get("high"), at, "high")
    if not 1.0 <= low <= factor <= high:
        raise CapabilityDBError(f"{at}: needs 1 <= low <= factor <= high (untuned kernels are not faster than "
                                f"tuned ones), got {low}, {factor}, {high}")
    return backend, heuristic


@memoize(maxsize=1)
def load_priors() -> Priors:
    """capability_db/cost_priors.toml, validated and indexed (cached; CapabilityDBError if broken)."""
    return parse_priors(capdb.load_toml(_PRIORS_FILE))
