"""Cost model: predicted fused-MoE time per layer and token count, with error bars.

Public API (pure Python; nothing is read or computed at import time)::

    from moedispatch import cost
    costs = cost.predict(layer, caps, backend_family="aiter-flydsl", padding=decision.padding, tokens=(1, 64, 4096))
    costs[1].to_dict()        # {"tokens": 64, "us": 85.0, "low": 82.4, "high": 93.5, "basis": "tuned"}
    cost.total([costs] * 57)  # the model's MoE time per token count (decode step, prefill chunk)
    cost.compare(a, b)        # "faster" | "slower" | "tie" (bars separate or not)
    cost.rank([("aiter-flydsl", 70, a), ("triton", 40, b)])   # [("aiter-flydsl", None), ("triton", "aiter-… vs …")]
    cost.reason("aiter-flydsl", a, "triton", b)
    # -> "aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens"
    cost.padding_overhead(layer, caps, backend_family="aiter-flydsl", padding=p, tokens=(4096,))  # ((4096, 0.21),)
    cost.untuned_csv(cost.tuning_worklist([(dispatch_plan, costs, 57)]))   # what to tune first, AITER's format

How one prediction is made, in order (``Cost.basis`` says which step answered):

1. ``plugin`` — a plugin's ``moe_cost`` hook (:mod:`moedispatch.core.hookspecs`) returned costs for its backend.
2. ``tuned`` — AITER backends only: a lint-clean row of AITER's tuned fused-MoE CSVs matches the layer's lookup key
   and the token count exactly; the prediction is that row's ``us`` (AITER's tuner measured it,
   ``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py``). Rows come from ``dispatch`` (the AITER dispatch model's
   per-bucket entries), ``rows``, or a lookup in :func:`moedispatch.data.aiter_configs.config_set_for`.
3. ``interpolated`` — clean rows of the same tuned shape exist at a lower and a higher token count: log-log
   interpolation between the two neighbours, along the roofline work ``t_mem + t_cmp`` (:func:`interpolate`).
   Outside the tuned token range the nearest row is scaled by the priors' ratio (basis ``roofline``).
4. ``roofline`` — everything else: expected distinct experts touched ``E·(1−(1−k/E)^M)`` × expert weight bytes
   (scales included, padded sizes when a padding is given) + activations, over the product's datasheet HBM bandwidth
   (gpus.toml ``[peak.*]``): ``t_mem``; useful FLOPs over the peak for the activation dtype: ``t_cmp``.

   - Decode (up to ``max_tokens``, 64, of a ``[[decode]]`` fit): latency plus bytes, ``fixed_us + t_mem /
     efficiency`` per (arch, CU count) — a fixed per-call term and an effective share of the *target's* datasheet
     bandwidth (so MI325X's faster HBM is credited), fit on the lint-clean tuned rows with at most that many tokens.
     The bytes grow with the experts touched, so 1 < 2 < 4 tokens predict rising times wherever more experts are
     touched.
   - Above: the efficiency priors of capability_db/cost_priors.toml (log-linear in those terms, per (arch, CU
     count, token bucket)) turn the roofline into a time, never less than at fewer tokens.

   Both are fit on lint-clean tuned rows by ``benchmarks/bench_cost_model.py --fit``; bars are leave-one-model-out
   residual quantiles (p10–p90) of the level that answered (from ``LARGE_M`` tokens the bucket priors also see weight
   bytes, intermediate size and block scaling, with bars of their own, level ``bucket_large``).

The ``tuned`` and ``interpolated`` bars are release-aware (:mod:`moedispatch.cost.release`): the same-release bars
when the planned AITER is exactly the rows' release, else widened to AITER's re-tuning spread across releases; the
detail says whose µs it is. Triton, emulation and third-party backends get this
   AITER roofline times their own factor band (``[backend.*]`` in the priors, with sources).

Where the AITER dispatch model marks a token count ``heuristic`` (no tuned row: AITER runs its untuned default
kernels), an AITER prediction — which every basis makes at tuned-kernel speed — is multiplied by the ``[heuristic]``
factor band of the priors (derived by :mod:`moedispatch.cost.heuristic` from the published same-shape A/Bs of
AITER's untuned default against a tuned row, capability_db/cost_heuristic_evidence.toml), so :func:`rank` does not
favour an untuned path over a tuned one.

Every prediction is at or above the datasheet roofline ``max(t_mem, t_cmp)`` for the bytes it must read and the
FLOPs it must do (nothing runs faster than the datasheet peaks).

Tuned-CSV rows are linted first (:func:`lint_rows`): a timing copied across token buckets of one shape, or a row
faster than the datasheet roofline, is not used (AITER still dispatches on it; its time is not believed).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from moedispatch._util import deadline
from moedispatch._util.caches import memoize
from moedispatch.core.costs import BASES, Cost, format_cost
from moedispatch.core.errors import UsageError
from moedispatch.core.families import kind_of
from moedispatch._util.log import get_logger
from moedispatch.core.workload import DEFAULT_TOKENS
from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.data import aiter_configs, capdb
from moedispatch.cost import release
from moedispatch.cost.geometry import Geometry, LARGE_M, _CSV_BYTES, bucket_of, model_features, roofline_us
from moedispatch.cost.lint import _row_get, _shape_key, lint_rows
from moedispatch.cost.priors import DecodeFit, Priors, load_priors
from moedispatch.cost.ranking import compare, rank, reason, total
from moedispatch.cost.worklist import UNTUNED_COLUMNS, tuning_worklist, untuned_csv

__all__ = [
    "Cost",
    "Geometry",
    "BASES",
    "predict",
    "predict_one",
    "total",
    "compare",
    "reason",
    "rank",
    "format_cost",
    "padding_overhead",
    "backend_kind",
    "bucket_of",
    "interpolate",
    "fit_decode",
    "fit_decode_fixed",
    "DecodeFit",
    "roofline_us",
    "model_features",
    "lint_rows",
    "load_priors",
    "tuning_worklist",
    "untuned_csv",
    "UNTUNED_COLUMNS",
    "Priors",
]



# -- hardware ----------------------------------------------------------------------------------------------------

def _target_peaks(caps: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """(datasheet peaks, product) of the target: its product's ``[peak.*]``, else the arch's first listed product
    with the same CU count."""
    product = getattr(caps, "product", None)
    peaks = capdb.product_peaks(product)
    facts = capdb.arch_facts(caps.gfx) if getattr(caps, "gfx", None) else None
    if peaks is not None:
        full = next((p["compute_units"] for p in (facts or {}).get("products", []) if p["name"] == product), None)
        cus = getattr(caps, "compute_units", None)
        if full and cus and cus < full:
            # A compute partition (CPX/QPX/DPX) sees a share of the CUs: the matrix peaks scale with them; HBM is
            # left at the full figure (a lower floor, never a claim of more speed).
            peaks = {k: (v * cus / full if k.endswith("_tflops") else v) for k, v in peaks.items()}
        return peaks, product
    for product in (facts or {}).get("products", []):
        if caps.compute_units in (None, product["compute_units"]):
            p = capdb.product_peaks(product["name"])
            if p is not None:
                return p, product["name"]
    return None, None


# -- tuned rows --------------------------------------------------------------------------------------------------

def _plan(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    """The AITER dispatch model's plan for the layer (no AITER environment: a library reads no env vars), or None
    when AITER cannot take the layer at all (then no tuned row can apply). Cached per layer signature."""
    try:
        return _plan_cached(layer.signature(), caps, padding, tokens)
    except TypeError:  # unhashable stand-ins
        return _plan_uncached(layer, caps, padding, tokens)


@memoize(maxsize=256)
def _plan_cached(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    return _plan_uncached(layer, caps, padding, tokens)


def _plan_uncached(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    try:
        return aiter_dispatch.plan_dispatch(layer, caps, tokens=tokens, env={}, padding=padding)
    except UsageError:
        return None


def _shape_rows(key: Any, caps: Any, q_dtype_a: str, env: tuple[tuple[str, str], ...] = ()) -> tuple[Any, ...]:
    """Every tuned row of the dispatch key's shape (any token) with activations ``q_dtype_a``, exact act_type
    first as AITER looks it up (then the act-wildcarded dict, ``aiter/fused_moe.py`` ``get_2stage_cfgs``), from the
    set AITER reads under ``env`` (``AITER_CONFIG_FMOE``; none: the release's)."""
    try:
        return _shape_rows_cached(key, caps, q_dtype_a, env)
    except TypeError:  # unhashable stand-ins
        return _shape_rows_uncached(key, caps, q_dtype_a, env)


@memoize(maxsize=256)
def _shape_rows_cached(key: Any, caps: Any, q_dtype_a: str, env: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
    return _shape_rows_uncached(key, caps, q_dtype_a, env)


def _shape_rows_uncached(key: Any, caps: Any, q_dtype_a: str, env: tuple[tuple[str, str], ...] = ()) -> tuple[Any, ...]:
    rows = aiter_configs.tuned_rows(
        config_set=aiter_configs.config_set_for(caps, dict(env), model_dims=frozenset({key.model_dim})),
        model_dim=key.model_dim, inter_dim=key.inter_dim,
        expert=key.expert, topk=key.topk, gfx=key.gfx, cu_num=key.cu_num, dtype=key.dtype, q_dtype_a=q_dtype_a,
        q_dtype_w=key.q_dtype_w, q_type=key.q_type, use_g1u1=key.use_g1u1, doweight_stage1=key.doweight_stage1)
    exact = [r for r in rows if r.act_type == key.act_type]
    return tuple(exact or rows)


def _row_shape(row: Any, caps: Any, env: tuple[tuple[str, str], ...] = ()) -> tuple[Any, ...]:
    """``row`` and the other tuned rows of its own shape in its file (any token) in the set AITER reads under ``env``:
    a row the dispatch found outside :func:`_shape_rows` (the act wildcard's) is linted with them, or a timing
    copied across its buckets looks measured."""
    try:
        return _row_shape_cached(row, caps, env)
    except TypeError:  # unhashable stand-ins
        return _row_shape_uncached(row, caps, env)


@memoize(maxsize=256)
def _row_shape_cached(row: Any, caps: Any, env: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
    return _row_shape_uncached(row, caps, env)


def _row_shape_uncached(row: Any, caps: Any, env: tuple[tuple[str, str], ...] = ()) -> tuple[Any, ...]:
    try:
        rows = aiter_configs.tuned_rows(
            config_set=aiter_configs.config_set_for(caps, dict(env), model_dims=frozenset({row.model_dim})),
            model_dim=row.model_dim, inter_dim=row.inter_dim, expert=row.expert, topk=row.topk, cu_num=row.cu_num,
            act_type=row.act_type, q_dtype_a=row.q_dtype_a, q_dtype_w=row.q_dtype_w, q_type=row.q_type)
    except (UsageError, AttributeError):
        return (row,)
    same = tuple(r for r in rows if _shape_key(r) == _shape_key(row))
    return same if row in same else same + (row,)


def _key_geometry(layer: Any, padding: Any, key: Any) -> Geometry:
    """The layer's geometry as AITER runs it: a fused shared expert (key.expert = experts + 1) is one more expert,
    always selected."""
    geo = Geometry.of_layer(layer, padding)
    fused = max(0, int(getattr(key, "expert", layer.experts_per_rank)) - layer.experts_per_rank)
    if not fused:
        return geo
    return Geometry(hidden=geo.hidden, inter=geo.inter, experts=geo.experts + fused,
                    experts_total=geo.experts_total + fused, top_k=geo.top_k + fused, w_bytes=geo.w_bytes,
                    a_bytes=geo.a_bytes, compute=geo.compute, gated=geo.gated, shared=fused,
                    block_scale=geo.block_scale)


def _rows_from_dispatch(dispatch: Iterable[Any], caps: Any) -> list[Any]:
    """Rows named by the AITER dispatch model's entries (``row`` attribute, or ``config`` = ``file:line``)."""
    out: list[Any] = []
    by_where: dict[str, Any] | None = None
    for entry in dispatch:
        if _row_get(entry, "basis") not in (None, "tuned"):
            continue
        row = _row_get(entry, "row")
        if row is None:
            config = _row_get(entry, "config")
            if isinstance(config, Mapping):
                row = config if "us" in config else None
            elif isinstance(config, str) and ":" in config:
                if by_where is None:
                    by_where = {r.where: r for r in aiter_configs.config_set_for(caps).rows}
                row = by_where.get(config)
        if row is not None:
            out.append(row)
    return out


# -- prediction --------------------------------------------------------------------------------------------------

backend_kind = kind_of  # the cost model's name for it (moedispatch.core.families.kind_of)


def _check_tokens(tokens: Iterable[int] | int) -> tuple[int, ...]:
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = (tokens,)
    try:
        out = tuple(tokens)
    except TypeError:
        raise UsageError(f"tokens must be positive integers, got {tokens!r}") from None
    if not out or any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in out):
        raise UsageError(f"tokens must be positive integers, got {list(out)!r}")
    return out


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _prior_us(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors,
              ref: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int]] | None:
    """The first prior of the chain bucket → arch_cu → arch that exists for (gfx, cu), evaluated at ``m``."""
    if ref is None:
        return None
    b = bucket_of(m)
    fitted = priors.buckets.get((gfx, cu), ()) if gfx else ()
    if fitted and not fitted[0] <= b <= fitted[-1]:
        b = fitted[0] if b < fitted[0] else fitted[-1]   # beyond the tuned range: the nearest end's prior
    for key in (("bucket", gfx, cu, b), ("arch_cu", gfx, cu, 0), ("arch", gfx, 0, 0)):
        model = priors.models.get(key)
        if model is not None:
            feats, coef = model
            return math.exp(_dot(coef, model_features(feats, geo, m, cu or 1, ref))), key
    return None


def _decode_us(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors,
               peaks: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int], DecodeFit] | None:
    """Latency plus bytes at ``m`` tokens when a ``[[decode]]`` fit for (gfx, cu), else for the arch (cu 0), covers
    ``m``: ``fixed_us + t_mem / efficiency`` with ``t_mem`` at ``peaks`` (the target's datasheet HBM). The fixed term
    is the layer's (activation, weight) pair's own (:attr:`Geometry.pair`) where the fit has one, else the fit's."""
    if peaks is None or not gfx:
        return None
    for c in (cu, 0):
        fit = priors.decode.get((gfx, c))
        if fit is not None:
            if m > fit.max_tokens:
                return None
            fit = priors.decode_pair.get((gfx, c, geo.pair), fit)
            t_mem = roofline_us(geo, m, peaks)[0]
            return fit.fixed_us + t_mem / fit.efficiency, ("decode", gfx, c, 0), fit
    return None


def _estimate(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors, ref: Mapping[str, Any] | None,
              peaks: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int]] | None:
    """The decode fit where it covers ``m``, else the efficiency prior (bucket → arch_cu → arch).

    Where only the arch-wide prior answers for a CU count that has a decode fit of its own (MI300X/MI325X's 304,
    MI308X's 80 when its tuned file is missing), the arch prior's curve is scaled to meet that CU count's decode fit
    at the fit's last token count (level ``arch_anchored``): the arch-wide prior pools every CU count of the arch and
    misses one count's level by a constant factor, which the count's own decode rows measure (leave-one-file-out in
    benchmarks/bench_cost_model.py: the 223 MI308X rows above 64 tokens predicted without ``tuned_fmoe.csv``, median
    error 16.0% → 11.0%, truth/prediction 1.14 → 0.97; checked on the cu-304 rows it was not chosen on: 14.4% →
    13.6%, p90 42.6% → 39.5%).
    """
    found = _decode_us(geo, m, gfx, cu, priors, peaks)
    if found is not None:
        return found[0], found[1]
    prior = _prior_us(geo, m, gfx, cu, priors, ref)
    if prior is None:
        return None
    own = priors.decode.get((gfx, cu)) if cu else None
    us, key = prior
    if prior[1][0] == "arch" and own is not None:
        # Both at the reference product's peaks the two were fit against: the factor is the CU count's level, not
        # a bandwidth credit (that is the roofline ratio below).
        edge = _decode_us(geo, own.max_tokens, gfx, cu, priors, ref)
        at_edge = _prior_us(geo, own.max_tokens, gfx, cu, priors, ref)
        if edge is not None and at_edge is not None:
            us, key = us * edge[0] / at_edge[0], ("arch_anchored", gfx, cu, 0)
    return us * _roofline_ratio(geo, m, peaks, ref), key


def _roofline_ratio(geo: Geometry, m: int, peaks: Mapping[str, Any] | None, ref: Mapping[str, Any] | None) -> float:
    """The target's roofline over the reference product's, at ``m``: the priors are fit as a kernel's efficiency
    against the reference's datasheet roofline (MI300X for cu 304, MI355X for gfx950/256), so a product with the same
    CU count keeps that efficiency at its own roofline — MI325X's 6.0 TB/s (MI300X 5.3, same compute peaks) is
    credited where the call is memory-bound, MI350X's lower compute peaks where it is compute-bound; 1 at the
    reference itself (the decode fit credits the target's HBM the same way: ``t_mem`` at its own peaks)."""
    if peaks is None or ref is None or peaks is ref:
        return 1.0
    return max(roofline_us(geo, m, peaks)) / max(roofline_us(geo, m, ref))


def _roofline_cost(geo: Geometry, m: int, caps: Any, priors: Priors, peaks: Mapping[str, Any] | None,
                   floor: float) -> tuple[float, float, float, str, str]:
    """(us, low, high, detail, level) from the decode fit or the efficiency priors, never below ``floor``.

    Priors are per token bucket, so the prediction at ``m`` is also kept at or above the prediction at every lower
    power of two (the decode fit's included): more tokens never take less time.
    """
    gfx, cu = getattr(caps, "gfx", None), getattr(caps, "compute_units", None) or 0
    ref_product = priors.reference.get((gfx, cu)) if gfx else None
    ref = (capdb.product_peaks(ref_product) if ref_product else None) or peaks
    found = _estimate(geo, m, gfx, cu, priors, ref, peaks)
    if found is not None:
        us, key = found
        lower = 1
        while lower < m:
            below = _estimate(geo, lower, gfx, cu, priors, ref, peaks)
            if below is not None and below[0] > us:
                us = below[0]
            lower *= 2
        level = "bucket_large" if key[0] == "bucket" and key[3] >= LARGE_M else key[0]
        band = priors.bands.get((level, gfx, cu)) or priors.bands.get((level, gfx, 0)) or priors.generic[1:]
        where = "/".join(str(k) for k in key[1:] if k)
        if level == "decode":
            fit = _decode_us(geo, m, gfx, cu, priors, peaks)[2]
            product = getattr(caps, "product", None) or "target"
            mine = priors.decode[(gfx, key[2])]
            fixed = (f"{fit.fixed_us:.1f} µs ({fit.pair}'s own, fit on its {fit.n} clean tuned rows)" if fit.pair else
                     f"{fit.fixed_us:.1f} µs")
            detail = (f"decode latency plus bytes {where}: {fixed} + bytes at {fit.efficiency:.0%} of "
                      f"{product}'s {float(peaks['hbm_tbps']):g} TB/s HBM (fit on {mine.n} clean tuned rows with "
                      f"<= {fit.max_tokens} tokens)")
        elif level == "arch_anchored":
            detail = (f"roofline with the arch prior {gfx} (fit against {ref_product or 'target'} peaks), scaled to "
                      f"meet the decode fit {where} at {priors.decode[(gfx, cu)].max_tokens} tokens")
        else:
            detail = f"roofline with {level} prior {where} (fit against {ref_product or 'target'} peaks)"
        product = getattr(caps, "product", None)
        if level != "decode" and ref is not peaks and product and product != ref_product:
            detail += f", at {product}'s own roofline"
    else:
        if peaks is None:
            raise UsageError(f"no peak throughput known for {getattr(caps, 'arch_label', gfx)}: add a [peak.<product>] "
                             "table to capability_db/gpus.toml")   # predict() returns () before this
        eff, lo, hi = priors.generic
        tm, tc = roofline_us(geo, m, peaks)
        us, band = max(tm, tc) / eff, (lo, hi)
        detail = f"roofline with the generic efficiency {eff:.2f} (no prior for {gfx} with {cu} CUs)"
        level = "generic"
    us = max(us, floor)
    return us, max(us * band[0], floor), max(us * band[1], us), detail, level


def fit_decode(points: Iterable[tuple[float, float]], *, iterations: int = 60) -> tuple[float, float]:
    """``(fixed_us, efficiency)`` of ``us ≈ fixed_us + t_mem / efficiency`` over ``points`` = ``(t_mem, us)``.

    Least absolute *relative* deviations (the median of ``|pred/us − 1|`` is what the benchmark scores), by
    iteratively reweighted least squares in pure Python; constrained to ``fixed_us >= 0`` and ``efficiency <= 1``
    (nothing streams faster than the datasheet bandwidth ``t_mem`` is computed with). Deterministic.
    """
    pts = [(float(t), float(u)) for t, u in points if u > 0]
    if len(pts) < 2:
        raise ValueError(f"fit_decode needs at least 2 points, got {len(pts)}")

    def solve(fix_b: float | None, fix_a: float | None) -> tuple[float, float]:
        a, b = 0.0, 1.0
        last = (math.nan, math.nan)
        w = [1.0] * len(pts)
        for _ in range(iterations):
            # residual r = (a + b t) / u - 1; weighted least squares in (a, b), one of them possibly fixed
            saa = sab = sbb = sa1 = sb1 = 0.0
            for (t, u), wi in zip(pts, w):
                x, y = 1 / u, t / u
                saa += wi * x * x
                sab += wi * x * y
                sbb += wi * y * y
                sa1 += wi * x * (1 - (fix_b or 0.0) * y)
                sb1 += wi * y * (1 - (fix_a or 0.0) * x)
            if fix_b is not None:
                a, b = sa1 / saa, fix_b
            elif fix_a is not None:
                a, b = fix_a, sb1 / sbb
            else:
                det = saa * sbb - sab * sab
                a = (sa1 * sbb - sb1 * sab) / det
                b = (saa * sb1 - sab * sa1) / det
            if abs(a - last[0]) <= 1e-8 * max(1.0, abs(a)) and abs(b - last[1]) <= 1e-8 * max(1.0, abs(b)):
                break
            last = (a, b)
            w = [1 / max(abs((a + b * t) / u - 1), 1e-4) for t, u in pts]
        return a, b

    a, b = solve(None, None)
    if b < 1.0:                 # faster than the datasheet: pin the bandwidth at the datasheet figure
        a, b = solve(1.0, None)
    if a < 0.0:                 # no negative latency: all of it is bytes
        a, b = 0.0, max(solve(None, 0.0)[1], 1.0)
    return max(a, 0.0), 1 / b


def fit_decode_fixed(points: Iterable[tuple[float, float]], efficiency: float) -> float:
    """``fixed_us`` of ``us ≈ fixed_us + t_mem / efficiency`` over ``points`` = ``(t_mem, us)`` with the
    ``efficiency`` given (a pair's own fixed term under its (arch, CU count) fit's bandwidth share): least absolute
    relative deviations, exactly — ``|(a + t/e)/u − 1| = |a − (u − t/e)| / u``, so ``a`` is the median of
    ``u − t/e`` weighted by ``1/u`` (the lower one on a tie). Never negative."""
    pts = sorted((float(u) - float(t) / efficiency, 1 / float(u)) for t, u in points if u > 0)
    if not pts:
        raise ValueError("fit_decode_fixed needs at least 1 point")
    half = sum(w for _v, w in pts) / 2
    acc = 0.0
    for value, w in pts:
        acc += w
        if acc >= half:
            return max(value, 0.0)
    return max(pts[-1][0], 0.0)  # pragma: no cover - float rounding only


def interpolate(m: int, lo: tuple[int, float], hi: tuple[int, float],
                abscissa: Callable[[int], float] | None = None) -> float:
    """Log-log interpolation of the time at ``m`` tokens between tuned rows ``lo = (m0, us0)``, ``hi = (m1, us1)``.

    The abscissa is ``log(abscissa(m))`` — :func:`predict` passes the roofline work ``t_mem + t_cmp``, which bends
    with the expected number of experts touched (leave-one-bucket-out median error 3.3% vs 4.7% for ``log m``); it
    increases with ``m``, so the result is monotone in ``m`` and lies between the two rows. Default: ``log m``.
    """
    (m0, u0), (m1, u1) = lo, hi
    x = abscissa or float
    x0, x1 = math.log(x(m0)), math.log(x(m1))
    f = (math.log(x(m)) - x0) / (x1 - x0) if x1 != x0 else 0.0
    f = min(max(f, 0.0), 1.0)
    return math.exp(math.log(u0) + f * (math.log(u1) - math.log(u0)))


def _plugin_costs(pm: Any, backend: str, layer: Any, caps: Any, tokens: tuple[int, ...]) -> tuple[Cost, ...] | None:
    log = get_logger(__name__)
    try:
        if callable(pm) and not hasattr(pm, "hook"):
            result = pm(backend=backend, layer=layer, caps=caps, tokens=tokens)
        else:
            result = pm.hook.moe_cost(backend=backend, layer=layer, caps=caps, tokens=tokens)
    except Exception as exc:  # noqa: BLE001 - a broken plugin never breaks explain; the roofline answers instead
        error = f"{type(exc).__name__}: {exc}"
        if deadline.first_time("plugin_cost_failed", backend, error):  # asked per layer group: said once per run
            log.warning("plugin_cost_failed", backend=backend, error=error)
        return None
    if result is None:
        return None
    try:
        got: dict[int, Cost] = {}
        for item in result:
            if isinstance(item, Cost):
                c = item
            else:
                c = Cost(int(item["tokens"]), float(item["us"]), float(item["low"]), float(item["high"]), "plugin")
            got[c.tokens] = Cost(c.tokens, c.us, c.low, c.high, "plugin", c.detail or f"declared by {backend}'s plugin")
        missing = [t for t in tokens if t not in got]
        if missing:
            raise ValueError(f"no cost for tokens {missing}")
    except (TypeError, KeyError, ValueError) as exc:
        if deadline.first_time("plugin_cost_invalid", backend, str(exc)):
            log.warning("plugin_cost_invalid", backend=backend, error=str(exc))
        return None
    return tuple(got[t] for t in tokens)


def _at_least_the_roofline(costs: tuple[Cost, ...], backend: str, layer: Any, caps: Any,
                           padding: Any) -> tuple[Cost, ...] | None:
    """A plugin's answer, each cost raised to the datasheet roofline of the target where it is below it (no kernel
    runs faster than the device: a 0.001 µs answer must not win a ranking); as it is where the target has no peaks.
    None — the answer is invalid, logged once, and the cost model answers instead — where a whole claimed range lies
    below the roofline: raised, it became a zero-width bar at the roofline that ranked as if measured."""
    peaks, _product = _target_peaks(caps)
    if peaks is None:
        return costs
    geo = Geometry.of_layer(layer, padding)
    out = []
    for c in costs:
        floor = max(roofline_us(geo, c.tokens, peaks))
        if c.high < floor:
            error = (f"{c.tokens} token(s): {c.low:g}–{c.high:g} µs is below the datasheet roofline {floor:.1f} µs "
                     "(faster than the device)")
            if deadline.first_time("plugin_cost_invalid", backend, "below the roofline"):
                get_logger(__name__).warning("plugin_cost_invalid", backend=backend, error=error)
            return None
        if c.us < floor:
            c = Cost(c.tokens, floor, max(c.low, floor), c.high, c.basis,
                     f"{c.detail}; raised from {c.us:g} µs to the datasheet roofline {floor:.1f} µs")
        out.append(c)
    return tuple(out)


def _release_context(caps: Any, env: tuple[tuple[str, str], ...] = ()) -> release.ReleaseContext | None:
    """Whose µs the tuned rows of a plan for ``caps`` are (the tuned set :func:`_shape_rows` reads under ``env``), or
    None when that cannot be said (then the same-release bars apply)."""
    try:
        return release.context_of(aiter_configs.config_set_for(caps, dict(env), model_dims=frozenset({0})))
    except (UsageError, KeyError, TypeError, AttributeError):
        return None


def _whose(ctx: release.ReleaseContext | None) -> str:
    return f"; {ctx.describe()}" if ctx is not None else ""


def _heuristic_entry(entry: Any, m: int) -> bool:
    """A dispatch entry (object or dict with ``basis`` and ``tokens`` = [lo, hi]) that says AITER runs untuned
    kernels at ``m`` tokens."""
    basis, span = _row_get(entry, "basis"), _row_get(entry, "tokens")
    if basis in (None, "tuned") or not span:
        return False
    try:
        lo, hi = int(span[0]), int(span[-1])
    except (TypeError, ValueError, IndexError):
        return False
    return lo <= m <= hi


def _heuristic_band(c: Cost, band: Mapping[str, Any], floor: float) -> Cost:
    """``c`` (a prediction at tuned-kernel speed) where AITER runs its untuned (heuristic) kernels: × the
    ``[heuristic]`` factor, bars × its low and high."""
    factor, flo, fhi = float(band["factor"]), float(band["low"]), float(band["high"])
    us = c.us * factor
    # the evidence file and its counts (the table's source also lists every thread: the file names them)
    source = (f"capability_db/cost_heuristic_evidence.toml: {band['n']} untuned-vs-tuned timings, {band['threads']} "
              f"threads" if "n" in band and "threads" in band else band["source"])
    return Cost(c.tokens, us, min(max(c.low * flo, floor), us), max(c.high * fhi, us), c.basis,
                f"{c.detail}; × {factor:g} ({flo:g}–{fhi:g}): AITER runs untuned (heuristic) kernels here ({source})")


def _at(where: str) -> str:
    """`` (where)`` for a tuned row's source; empty when the row names none (rows handed in as mappings without
    ``where``)."""
    return f" ({where})" if where else ""


def predict_one(geo: Geometry, m: int, table: Mapping[int, tuple[float, str]], caps: Any, priors: Priors,
                peaks: Mapping[str, Any], *, kind: str = "aiter", ctx: "release.ReleaseContext | None" = None,
                skipped: Sequence[str] = ()) -> Cost:
    """One token count of :func:`predict` (before the heuristic band): ``table`` = ``{tokens: (us, where)}`` of the
    lint-clean tuned rows of the shape AITER looks up, ``ctx`` whose µs they are (None: the same-release bars).
    The benchmark's release held-out test calls it with an older release's truths against head's rows."""
    floor = max(roofline_us(geo, m, peaks))   # nothing runs faster than the datasheet peaks
    known = sorted(table)
    if m in table:
        us, where = table[m]
        lo, hi = release.bars_for("tuned", ctx, priors.tuned)
        return Cost(m, us, min(us, max(us * lo, floor)), us * hi, "tuned",
                    f"tuned row{' ' + where if where else ''}{_whose(ctx)}")
    below = [t for t in known if t < m]
    above = [t for t in known if t > m]
    if kind == "aiter" and below and above:
        a, b = below[-1], above[0]
        work = lambda t: sum(roofline_us(geo, t, peaks))  # noqa: E731 - the abscissa: roofline work
        us = max(interpolate(m, (a, table[a][0]), (b, table[b][0]), work), floor)
        lo, hi = release.bars_for("interpolated", ctx, priors.interpolated)
        return Cost(m, us, max(us * lo, floor), us * hi, "interpolated",
                    f"log-log between tuned rows at {a}{_at(table[a][1])} and {b}{_at(table[b][1])} tokens"
                    f"{_whose(ctx)}")
    us, low, high, detail, _level = _roofline_cost(geo, m, caps, priors, peaks, floor)
    if below or above:
        # Beyond the tuned token range of this shape: anchor on the nearest tuned row and scale it by the
        # prior's ratio between the two token counts (one bucket out: median error 4.5% against 7.6% for the
        # prior alone, measured on the bundled rows); the bars stay the roofline's.
        t = below[-1] if below else above[0]
        anchor_us, anchor_where = table[t]
        fitted = priors.buckets.get((getattr(caps, "gfx", None), getattr(caps, "compute_units", None) or 0))
        if not fitted or bucket_of(m) > fitted[-1]:
            # Past the largest fitted bucket the priors would extrapolate; the work itself scales instead
            # (compute-bound at these sizes: time grows with the FLOPs).
            ratio = sum(roofline_us(geo, m, peaks)) / sum(roofline_us(geo, t, peaks))
        else:
            ratio = us / _roofline_cost(geo, t, caps, priors, peaks, 0.0)[0]
        anchored = max(anchor_us * ratio, floor)
        low, high, us = max(low * anchored / us, floor), high * anchored / us, anchored
        detail += (f"; scaled from the tuned row at {t} tokens ({anchor_where + ', ' if anchor_where else ''}"
                   f"{anchor_us:.1f} µs){_whose(ctx)}")
    if skipped:
        detail += f"; tuned rows not used: {'; '.join(skipped[:3])}"
    if kind != "aiter":
        entry = priors.backend.get(kind) or priors.backend["other"]
        factor, flo, fhi = float(entry["factor"]), float(entry["low"]), float(entry["high"])
        us, low, high = us * factor, max(low * flo, floor), high * fhi
        detail = f"{detail}; × {factor:g} ({flo:g}–{fhi:g}) for {kind} ({entry['source']})"
    return Cost(m, us, min(low, us), max(high, us), "roofline", detail)


def predict(layer: Any, caps: Any, *, backend_family: str, padding: Any = None,
            tokens: Iterable[int] | int = DEFAULT_TOKENS, dispatch: Iterable[Any] | None = None,
            rows: Iterable[Any] | None = None, pm: Any = None) -> tuple[Cost, ...]:
    """Predicted time of one fused-MoE call of ``layer`` on ``caps`` per token count, in the order of ``tokens``.

    :param layer: a routed-expert :class:`~moedispatch.core.layers.MoELayer` (per-rank sizes).
    :param caps: the target :class:`~moedispatch.core.capabilities.Capabilities` (gfx, product, compute_units, AITER).
    :param backend_family: the backend's name (``aiter-flydsl``, ``triton``, ``emulation``, a plugin's name) or an
        AITER family (``ck``, ``flydsl``…); see :func:`backend_kind`. Only AITER backends use tuned rows.
    :param padding: the :class:`~moedispatch.core.backend.Padding` the backend runs with (padded sizes are what it reads
        and computes, and what AITER's tuned lookup keys on); None = unpadded.
    :param tokens: token counts (tokens entering the layer on this rank: decode batch size, prefill chunk).
    :param dispatch: what AITER runs for this layer: a :class:`moedispatch.aiter.dispatch.DispatchPlan` (its key —
        padded dims, fused shared expert, EP top-k — and per-token activation dtype pick the tuned shape; pass the
        plan explain already built, with its ``--aiter-env``), or an iterable of dispatch entries (objects or dicts
        with ``basis`` and ``row`` or ``config`` = ``file:line``) whose tuned rows are used as they are. None: the
        plan is simulated here with no AITER environment variables. Token counts its steps (or entries, by their
        ``tokens`` range) mark other than ``tuned`` run AITER's heuristic kernels: their prediction gets the
        ``[heuristic]`` factor band.
    :param rows: tuned rows of this layer's exact lookup key (any token), if the caller already has them (they win
        over ``dispatch``).
    :param pm: a pluggy PluginManager with the ``moe_cost`` hookspec (or a callable with the hook's arguments): a
        plugin's answer wins, with basis ``plugin``.
    :returns: one :class:`Cost` per token count — or ``()`` when nothing can be predicted: a target product without
        peak figures in gpus.toml (gfx90a, MI300A, RDNA) and no plugin answer. Explain shows no cost there.
    :raises UsageError: a dense layer or bad token counts.
    """
    tokens = _check_tokens(tokens)
    if getattr(layer, "kind", "moe") != "moe":
        raise UsageError(f"layer {getattr(layer, 'index', '?')} is dense: no MoE cost")
    if pm is not None:
        plugin = _plugin_costs(pm, backend_family, layer, caps, tokens)
        plugin = _at_least_the_roofline(plugin, backend_family, layer, caps, padding) if plugin is not None else None
        if plugin is not None:
            return plugin
    kind = backend_kind(backend_family)
    priors = load_priors()
    geo = Geometry.of_layer(layer, padding)
    peaks, _product = _target_peaks(caps)
    if peaks is None:
        return ()   # no datasheet figures: no physical floor to stand on, so no honest prediction

    # Tuned rows per token count: {m: rows of the shape AITER looks up for m} (see _tuned_shapes).
    shapes, geos, heuristic, ctx, geo = _tuned_shapes(layer, caps, padding, tokens, kind, geo, rows, dispatch)
    tables: dict[int, tuple[dict[int, tuple[float, str]], list[str]]] = {}

    def table_for(m: int) -> tuple[dict[int, tuple[float, str]], list[str]]:
        found = [r for r in shapes.get(m, ()) if not _row_get(r, "tag")]
        cache_key = id(shapes.get(m))
        if cache_key not in tables:
            clean, rejected = lint_rows(found, lambda r: peaks)
            t: dict[int, tuple[float, str]] = {}
            for r in clean:
                t.setdefault(int(_row_get(r, "token")),
                             (float(_row_get(r, "us")), str(_row_get(r, "where", "") or "")))
            tables[cache_key] = (t, [f"{_row_get(r, 'where', '?')}: {why}" for r, why in rejected])
        return tables[cache_key]

    out: list[Cost] = []
    layer_geo = geo

    def add(c: Cost, floor: float) -> None:
        out.append(_heuristic_band(c, priors.heuristic, floor) if c.tokens in heuristic else c)

    for m in tokens:
        geo = geos.get(m, layer_geo)
        table, skipped = table_for(m)
        add(predict_one(geo, m, table, caps, priors, peaks, kind=kind, ctx=ctx, skipped=skipped),
            max(roofline_us(geo, m, peaks)))
    return _no_faster_than_the_whole_device(tuple(out), layer, caps, backend_family, padding, tokens, rows)


def _tuned_shapes(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...], kind: str, geo: "Geometry",
                  rows: Iterable[Any] | None, dispatch: Any) -> tuple[dict[int, list[Any]], dict[int, "Geometry"],
                                                                   set[int], Any, "Geometry"]:
    """Tuned rows per token count: (``{m: rows of the shape AITER looks up for m}``, the geometry per m where the
    dispatch model's activation-dtype policy changes q_dtype_a with M, the token counts AITER runs untuned
    (heuristic) kernels at, whose µs the tuned rows are and how the user's AITER relates to that release, the
    layer's geometry as AITER's lookup key pads it). One shape for every m, except where the activation dtype
    changes."""
    shapes: dict[int, list[Any]] = {}
    geos: dict[int, Geometry] = {}
    heuristic: set[int] = set()   # token counts the dispatch model says AITER runs untuned (heuristic) kernels at
    ctx = None                    # whose µs the tuned rows are, and how the user's AITER relates to that release
    if kind == "aiter" and getattr(caps, "aiter_version", None) is not None:
        ctx = _release_context(caps)
        if rows is not None:
            given = list(rows)
            shapes = {m: given for m in tokens}
        elif dispatch is not None and not hasattr(dispatch, "steps"):
            entries = list(dispatch)
            given = _rows_from_dispatch(entries, caps)
            shapes = {m: given for m in tokens}
            heuristic = {m for m in tokens for e in entries if _heuristic_entry(e, m)}
        else:
            plan = dispatch if dispatch is not None else _plan(layer, caps, padding, tokens)
            if plan is not None:
                geo = _key_geometry(layer, padding, plan.key)
                # a tuned set the user named (AITER_CONFIG_FMOE, explain --pin-file) is what AITER reads: its rows,
                # linted together (a pinned row carries its neighbour's µs: copied, not measured at its bucket)
                own = tuple(getattr(plan, "env", ())) if getattr(plan, "config_origin", "") in ("env", "explicit") \
                    else ()
                if own:
                    ctx = _release_context(caps, own)
                for m in tokens:
                    step = next((st for st in plan.steps if st.tokens[0] <= m <= st.tokens[1]), None)
                    q_a = getattr(step, "q_dtype_a", "") if step is not None else ""
                    found = list(_shape_rows(plan.key, caps, q_a, own)) if q_a else []
                    if q_a in _CSV_BYTES:
                        a = _CSV_BYTES[q_a]
                        geos[m] = replace(geo, a_bytes=a, compute={2.0: "bf16", 1.0: "fp8", 0.5: "fp4"}[a])
                    if step is not None and step.basis == "tuned" and step.row is not None \
                            and step.row not in found:
                        # the act-wildcard or a smaller tier's row, with its shape's other buckets for the lint
                        found += [r for r in _row_shape(step.row, caps, own) if r not in found]
                    if step is not None and step.basis != "tuned":
                        heuristic.add(m)
                    shapes[m] = found
    return shapes, geos, heuristic, ctx, geo


def _no_faster_than_the_whole_device(costs: tuple[Cost, ...], layer: Any, caps: Any, backend_family: str,
                                     padding: Any, tokens: tuple[int, ...], rows: Any) -> tuple[Cost, ...]:
    """A compute partition (``--target MI355X:CPX``) runs the same work on a share of the CUs and of the fabric, so
    its prediction is never below the whole device's (tuned rows at the full CU count included). Needed because the
    priors are fitted per (arch, CU count): a partition's count has none and falls back to the arch-wide prior,
    which can undercut the whole device's."""
    import dataclasses

    gfx, cu, product = getattr(caps, "gfx", None), getattr(caps, "compute_units", None), getattr(caps, "product", None)
    if not costs or not dataclasses.is_dataclass(caps) or not capdb.partition_of(gfx, product, cu):
        return costs
    full = next(p["compute_units"] for p in (capdb.arch_facts(gfx) or {})["products"] if p["name"] == product)
    whole = predict(layer, dataclasses.replace(caps, compute_units=full), backend_family=backend_family,
                    padding=padding, tokens=tokens, rows=rows)
    out = []
    for c, w in zip(costs, whole):
        if w.us > c.us:
            c = Cost(c.tokens, w.us, max(c.low, w.low), max(c.high, w.high), c.basis,
                     f"{c.detail}; raised to the whole {product}'s prediction ({full} CUs, {w.basis}): a partition is "
                     "never faster")
        out.append(c)
    return tuple(out) + costs[len(out):]


def padding_overhead(layer: Any, caps: Any, *, backend_family: str, padding: Any,
                     tokens: Iterable[int] | int = DEFAULT_TOKENS) -> tuple[tuple[int, float], ...]:
    """What a padding costs: ``((tokens, extra), ...)`` with ``extra`` = padded / unpadded − 1 (``0.29`` = 29%
    slower), both predicted on the roofline path (tuned rows exist for one of the two shapes at most, so mixing bases
    would compare a measurement with a model). For a what-if line such as "pad 384→512 costs +21% at 4096 tokens".
    """
    plain = predict(layer, caps, backend_family=backend_family, tokens=tokens, rows=())
    padded = predict(layer, caps, backend_family=backend_family, tokens=tokens, rows=(), padding=padding)
    return tuple((a.tokens, b.us / a.us - 1) for a, b in zip(plain, padded))
