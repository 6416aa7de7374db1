"""How accurate is moedispatch's MoE cost model? Measured on the bundled AITER tuned fused-MoE CSVs.

    python benchmarks/bench_cost_model.py            # evaluate; the LAST line is one JSON object
    python benchmarks/bench_cost_model.py --fit      # also refit capability_db/cost_priors.toml from these rows
    python benchmarks/bench_cost_model.py --fit --aiter-data ../shared/aiter   # the same from AITER's own CSVs

Data: every row of one release of moedispatch's AITER index (``capability_db/aiter_index.json``, derived from
``../shared/aiter`` by ``scripts/build_aiter_index.py``), or with ``--aiter-data DIR`` AITER's own tuned CSVs of that
release under ``DIR/<release>/aiter/configs`` (the same rows; tests/test_cost_decode.py refits from them), read with
:mod:`moedispatch.data.aiter_configs`, linted with :func:`moedispatch.cost.model.lint_rows` (copied timings, rows faster than
the datasheet roofline) and without tagged rows. Errors are ``|pred/actual − 1|``.

* ``in_shape_*`` — leave one token bucket out: each clean row predicted by log-log interpolation (along the roofline
  work ``t_mem + t_cmp``) between the nearest lower and upper clean rows of the same tuned shape (same file) — what
  ``predict`` does between tuned buckets.
* ``lofo_*`` — leave one model's file out: the efficiency priors and decode fits are refit without that file and
  every one of its rows is predicted through ``moedispatch.cost.model``'s own roofline path (``basis = roofline``),
  i.e. a model AITER has never tuned.
* ``decode_*`` — decode (at most ``DECODE_MAX_TOKENS`` tokens) as latency plus bytes: ``decode_slope`` compares the
  leave-one-file-out predicted ratio us(2M)/us(M) with the tuned rows' own ratio over every shape with clean rows at
  both M and 2M; ``decode_roofline_ratio`` is the prediction ÷ the HBM roofline per product on the untuned path at
  M = 1…64 for every clean decode shape of its CU count (never below 1); ``decode_implied_tbps`` is the HBM bandwidth
  each clean decode row implies (bytes moved ÷ us) beside the product's measured ceiling in gpus.toml.
* ``coverage`` — share of truths inside the [low, high] bars per basis, each bar built without the truth's own file
  (:func:`coverage`); goal 75–85%.
* ``release_heldout_*`` — keys an older release of the index had and the snapshot (the planned release) has not,
  each at its latest lint-clean µs, predicted from the snapshot's rows and priors (never fit on them) with the bars of
  a user on an older AITER (:func:`release_heldout`); per basis in ``release_heldout_by_basis``; goal median <= 6%,
  p90 <= 20%. ``lofo_large_m`` — the leave-one-file-out errors at >= ``cost.LARGE_M`` tokens.
* ``naive_roofline_*`` — the datasheet roofline ``max(t_mem, t_cmp)`` with efficiency 1, same rows, same run;
  ``bucket_prior_lofo_*`` — the roofline divided by the median efficiency per (arch, CU count, token bucket) of the
  other files (the "careful roofline" to beat).

Rows are keyed by ``cu_num``; the priors are fit against the peaks of one product per (gfx, CU count):
MI355X for 256 (MI350X rows are indistinguishable), MI300X for 304 (MI325X-tuned rows share the key, e.g.
https://github.com/ROCm/aiter/pull/5500), MI308X for 80. numpy speeds the fit up when installed; pure Python works.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import defaultdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from moedispatch.data import aiter_configs
from moedispatch.data import capdb
from moedispatch.cost import model as cost
from moedispatch.cost import priors as cost_priors
from moedispatch.cost import drift, heuristic, release, reverted

#: Product whose datasheet peaks the priors are fit against, per (gfx, cu_num) of the tuned rows.
REFERENCE = {("gfx950", 256): "MI355X", ("gfx942", 304): "MI300X", ("gfx942", 80): "MI308X"}
#: Minimum rows for a prior of each level (fewer: the next level answers).
MIN_ROWS = {"bucket": 12, "arch_cu": 150, "arch": 40}
#: Tuned-row bars: AITER tunes with near-uniform synthetic routing (torch.randn scores), real traffic is skewed, so
#: a real call is at or above the tuned time; "apples-to-oranges" per https://github.com/ROCm/aiter/issues/5156.
TUNED_BAND = {"low": 0.97, "high": 1.10}
#: Non-AITER backends: factor on the AITER roofline prediction, with the field reports behind each.
BACKENDS = {
    "triton": {"factor": 1.7, "low": 1.0, "high": 3.7, "confidence": "derived",
               "source": "https://github.com/vllm-project/vllm/issues/56945 (Triton MoE instead of AITER: 1.7x "
                         "slower at short prompts, 3.7x at 12k prompt tokens, end to end with the attention backend "
                         "also changed)"},
    "emulation": {"factor": 20.0, "low": 10.0, "high": 40.0, "confidence": "derived",
                  "source": "https://github.com/vllm-project/vllm/pull/50817 (Kimi-K3 on MI325X: decode 4.27 -> "
                            "99.67 tok/s once it left the dequantize-to-BF16 MoE emulation, about 20x)"},
    "aiter-triton": {"factor": 0.85, "low": 0.5, "high": 1.85, "confidence": "derived",
                     "source": "Triton's band halved: AITER's Triton MXFP4 MoE (aiter-triton) gives about 2x the "
                               "output throughput of plain Triton for gpt-oss-120b on MI300X "
                               "(https://github.com/vllm-project/vllm/pull/55934, 264 vs 133 tok/s)"},
    "other": {"factor": 1.0, "low": 0.8, "high": 4.0, "confidence": "unconfirmed",
              "source": "no field data for third-party kernels: the AITER roofline prediction, bounded below by "
                        "0.8x and above by Triton's worst ratio (https://github.com/vllm-project/vllm/issues/56945)"},
}
LEVELS = ("bucket", "arch_cu", "arch")
#: Decode: latency plus bytes (moedispatch.cost.model.fit_decode) on the clean rows with at most this many tokens,
#: per (gfx, CU count) with at least MIN_DECODE_ROWS rows (as many as a bucket prior needs, MIN_ROWS), and per gfx
#: (cu 0) for CU counts without a fit.
DECODE_MAX_TOKENS = 64
MIN_DECODE_ROWS = 12
#: An (activation, weight) pair gets its own decode fixed term with at least MIN_DECODE_ROWS clean decode rows from at
#: least this many files (one file is one model's shapes: a leave-one-file-out fit must still have one to learn from).
MIN_PAIR_FILES = 2
#: Products whose decode predictions are checked against their HBM roofline: (gfx, cu_num of their rows).
DECODE_PRODUCTS = {"MI355X": ("gfx950", 256), "MI300X": ("gfx942", 304), "MI325X": ("gfx942", 304),
                   "MI308X": ("gfx942", 80)}

try:  # optional: a 10x faster fit
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


# -- data ------------------------------------------------------------------------------------------------------

class Sample:
    __slots__ = ("row", "file", "gfx", "cu", "m", "us", "geo", "shape")

    def __init__(self, row):
        self.row, self.file, self.gfx, self.cu = row, row.file, row.gfx, row.cu_num
        self.m, self.us = row.token, float(row.us)
        self.geo = cost.Geometry.of_row(row)
        self.shape = row.shape() + (row.file,)


def load(snapshot: str, aiter_data: str | None = None):
    """(config set, timed rows, clean samples, rejected, reference peaks) of release ``snapshot``: from the bundled
    index, or from AITER's CSVs under ``aiter_data/<snapshot>`` (commit from its manifest.toml)."""
    if aiter_data:
        with open(os.path.join(aiter_data, "manifest.toml"), "rb") as fh:
            entry = tomllib.load(fh).get("release", {}).get(snapshot, {})
        cs = dataclasses.replace(aiter_configs.load_config_set(os.path.join(aiter_data, snapshot)),
                                 commit=entry.get("commit"))
    else:
        cs = aiter_configs.load_config_set(snapshot)
    rows = [r for r in cs.rows if not r.tag and r.us and r.gfx and (r.gfx, r.cu_num) in REFERENCE]
    root = os.path.join(aiter_data, snapshot) if aiter_data else ""
    rows, reverted_out = reverted.drop(snapshot, rows, lambda r: os.path.relpath(r.file, root).replace(os.sep, "/")
                                       if aiter_data else r.file.split(":", 1)[-1])
    peaks = {k: capdb.product_peaks(p) for k, p in REFERENCE.items()}
    clean, rejected = cost.lint_rows(rows, lambda r: peaks[(r.gfx, r.cu_num)])
    rejected += [(r, f"reverted by ROCm/aiter#{rev.pr} ({rev.date})") for r, rev in reverted_out]
    return cs, rows, [Sample(r) for r in clean], rejected, peaks


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def summary(errs):
    return {"median": statistics.median(errs), "p90": pct(errs, 0.9), "n": len(errs)}


# -- in-shape interpolation -------------------------------------------------------------------------------------

def in_shape(samples, peaks):
    """(errors, log residuals, naive roofline errors, files) of leave-one-bucket-out interpolation."""
    by = defaultdict(list)
    for s in samples:
        by[s.shape].append(s)
    errs, logres, naive, files = [], [], [], []
    for group in by.values():
        group.sort(key=lambda s: s.m)
        for i in range(1, len(group) - 1):
            lo, s, hi = group[i - 1], group[i], group[i + 1]
            pk = peaks[(s.gfx, s.cu)]
            pred = cost.interpolate(s.m, (lo.m, lo.us), (hi.m, hi.us), lambda t: sum(cost.roofline_us(s.geo, t, pk)))
            errs.append(abs(pred / s.us - 1))
            logres.append(math.log(s.us / pred))
            naive.append(abs(max(cost.roofline_us(s.geo, s.m, pk)) / s.us - 1))
            files.append(s.file)
    return errs, logres, naive, files


# -- fitting ----------------------------------------------------------------------------------------------------

def _solve(a, b):
    """Gaussian elimination with partial pivoting (pure Python)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def fit_l1(xs, ys, ridge=1e-3, iters=15):
    """Least absolute deviations in log space (IRLS): a median fit, robust to the rows lint cannot catch."""
    p = len(xs[0])
    if _np is not None:
        x, y = _np.array(xs), _np.array(ys)
        w = _np.ones(len(ys))
        for _ in range(iters + 1):
            a = (x * w[:, None]).T @ x + ridge * _np.eye(p)
            coef = _np.linalg.solve(a, (x * w[:, None]).T @ y)
            w = 1 / _np.maximum(_np.abs(y - x @ coef), 1e-3)
        return [float(c) for c in coef]
    w = [1.0] * len(ys)
    coef = [0.0] * p
    for _ in range(iters + 1):
        a = [[sum(w[n] * xs[n][i] * xs[n][j] for n in range(len(ys))) + (ridge if i == j else 0) for j in range(p)]
             for i in range(p)]
        b = [sum(w[n] * xs[n][i] * ys[n] for n in range(len(ys))) for i in range(p)]
        coef = _solve(a, b)
        w = [1 / max(abs(ys[n] - sum(c * v for c, v in zip(coef, xs[n]))), 1e-3) for n in range(len(ys))]
    return coef


def groups_of(samples):
    """Samples per prior key of each level."""
    out = defaultdict(list)
    for s in samples:
        out[("bucket", s.gfx, s.cu, cost.bucket_of(s.m))].append(s)
        out[("arch_cu", s.gfx, s.cu, 0)].append(s)
        out[("arch", s.gfx, 0, 0)].append(s)
    return out


FEATURES = {"bucket": "bucket", "arch_cu": "arch_cu", "arch": "arch"}


def fit_group(key, members, peaks):
    feats = FEATURES[key[0]]
    if key[0] == "bucket" and key[3] >= cost.LARGE_M:
        feats = "bucket_large"   # + weight bytes, intermediate size, block scaling (moedispatch.cost.model.LARGE_M)
    xs = [cost.model_features(feats, s.geo, s.m, s.cu, peaks[(s.gfx, s.cu)]) for s in members]
    ys = [math.log(s.us) for s in members]
    if feats == "arch" and len({s.cu for s in members}) == 1:
        # One CU count only (gfx950: 256): the log(cu) term is not identifiable, so it must not extrapolate.
        return feats, fit_l1([x[:-1] for x in xs], ys) + [0.0]
    return feats, fit_l1(xs, ys)


def decode_fits(samples, peaks, reuse=None, touched=frozenset()):
    """The latency-plus-bytes decode model: ``{(gfx, cu): (fixed_us, efficiency, n, fallback)}`` per (gfx, CU count)
    with at least MIN_DECODE_ROWS clean rows of at most DECODE_MAX_TOKENS tokens, and per gfx (cu 0) over all its
    rows; ``t_mem`` at each row's reference product's datasheet HBM. Under each, ``{(gfx, cu, pair): (fixed_us,
    efficiency, n, files)}`` for every (activation, weight) pair (``cost.Geometry.pair``) with at least
    MIN_DECODE_ROWS rows from at least MIN_PAIR_FILES files: its own fixed term at the parent's efficiency
    (``cost.fit_decode_fixed``); ``fallback`` lists the pairs with fewer (they take the parent's fixed term). Keys
    not in ``touched`` (and their pairs) are taken from ``reuse``."""
    points = defaultdict(list)
    for s in samples:
        if s.m <= DECODE_MAX_TOKENS:
            t_mem = cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])[0]
            points[(s.gfx, s.cu)].append((t_mem, s.us, s.geo.pair, s.file))
            points[(s.gfx, 0)].append((t_mem, s.us, s.geo.pair, s.file))
    out = {}
    for key, pts in sorted(points.items()):
        if len(pts) < MIN_DECODE_ROWS:
            continue
        if reuse is not None and key not in touched and key in reuse:
            out.update((k, v) for k, v in reuse.items() if k[:2] == key)
            continue
        fixed, eff = cost.fit_decode([(t, u) for t, u, _p, _f in pts])
        out[key] = None   # the (gfx, cu) entry first, its pairs after it
        by_pair = defaultdict(list)
        for t, u, pair, f in pts:
            by_pair[pair].append((t, u, f))
        fallback = []
        for pair, pp in sorted(by_pair.items()):
            files = len({f for _t, _u, f in pp})
            if len(pp) >= MIN_DECODE_ROWS and files >= MIN_PAIR_FILES:
                out[key + (pair,)] = (cost.fit_decode_fixed([(t, u) for t, u, _f in pp], eff), eff, len(pp), files)
            else:
                fallback.append(f"{pair}: {len(pp)} rows in {files} file{'s' if files != 1 else ''}")
        out[key] = (fixed, eff, len(pts), fallback)
    return out


def fit_models(samples, peaks, reuse=None, touched=frozenset()):
    """{key: (features, coef)} for every group with enough rows; groups not in ``touched`` are taken from ``reuse``
    (a fit on a superset that differs only in the touched groups)."""
    models = {}
    for key, members in groups_of(samples).items():
        if len(members) < MIN_ROWS[key[0]]:
            continue
        if reuse is not None and key not in touched and key in reuse:
            models[key] = reuse[key]
            continue
        models[key] = fit_group(key, members, peaks)
    return models


def _decode_entry(key, value):
    """One [[decode]] entry: (gfx, cu) with the pairs left on its fixed term, or (gfx, cu, pair) with its files."""
    a, e, n, extra = value
    entry = {"gfx": key[0], "cu": key[1]}
    if len(key) == 3:
        entry["pair"] = key[2]
    entry.update({"fixed_us": round(a, 4), "efficiency": round(e, 4), "max_tokens": DECODE_MAX_TOKENS, "n": n})
    if len(key) == 3:
        entry["files"] = extra
    elif extra:
        entry["pairs_on_fallback"] = extra
    return entry


def priors_doc(models, bands, interp_band, generic, provenance, decode=None):
    doc = {
        "schema": "moedispatch.cost_priors/1",
        "provenance": provenance,
        "tuned": {**TUNED_BAND, "confidence": "derived", "source": "https://github.com/ROCm/aiter/issues/5156",
                  "note": "tuned times are measured with near-uniform synthetic routing; real routing is skewed"},
        "interpolated": interp_band,
        "generic": generic,
        "heuristic": heuristic.band(heuristic.load_evidence()),
        "backend": BACKENDS,
        "reference": [{"gfx": g, "cu": c, "product": p} for (g, c), p in sorted(REFERENCE.items())],
        "decode": [_decode_entry(k, v) for k, v in sorted((decode or {}).items())],
        "model": [],
        "band": [],
    }
    for (level, gfx, cu, b), (feats, coef) in sorted(models.items()):
        entry = {"level": level, "gfx": gfx}
        if level != "arch":
            entry["cu"] = cu
        if level == "bucket":
            entry["bucket"] = b
        entry.update({"features": feats, "coef": [round(c, 6) for c in coef]})
        doc["model"].append(entry)
    for (level, gfx, cu), (lo, hi, n) in sorted(bands.items()):
        doc["band"].append({"level": level, "gfx": gfx, "cu": cu, "low": round(lo, 4), "high": round(hi, 4), "n": n})
    return doc


class _Caps:
    """The slice of Capabilities the roofline path reads."""

    def __init__(self, gfx, cu, product=None):
        self.gfx, self.compute_units, self.product = gfx, cu, product or REFERENCE[(gfx, cu)]
        self.arch_label = f"{gfx} ({self.product})"


def band_of(logres):
    return min(math.exp(pct(logres, 0.10)), 1.0), max(math.exp(pct(logres, 0.90)), 1.0), len(logres)


def lofo(samples, peaks, full, base_doc, decode):
    """Leave one file out through cost._roofline_cost (priors and decode fit refit without the file); returns
    errors, per-level log residuals, errors by target and ``{id(sample): (prediction, level)}``."""
    files = sorted({s.file for s in samples})
    all_groups = groups_of(samples)
    errs, res = [], defaultdict(list)
    by_target = defaultdict(list)
    preds = {}
    for f in files:
        train = [s for s in samples if s.file != f]
        held = [s for s in samples if s.file == f]
        touched = frozenset(k for k, members in all_groups.items() if any(s.file == f for s in members))
        models = fit_models(train, peaks, reuse=full, touched=touched)
        held_decode = {k for s in held if s.m <= DECODE_MAX_TOKENS for k in ((s.gfx, s.cu), (s.gfx, 0))}
        fresh = priors_doc(models, {}, {}, {}, {}, decode_fits(train, peaks, reuse=decode, touched=held_decode))
        doc = dict(base_doc, model=fresh["model"], band=[], decode=fresh["decode"])
        priors = cost_priors.parse_priors(doc)
        for s in held:
            tm, tc = cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])
            us, _lo, _hi, _detail, level = cost._roofline_cost(s.geo, s.m, _Caps(s.gfx, s.cu), priors,
                                                               peaks[(s.gfx, s.cu)], max(tm, tc))
            preds[id(s)] = (us, level)
            if level == "arch_anchored":
                # The plain arch prior still answers for CU counts without a decode fit of their own (compute
                # partitions): its band keeps its own residuals, measured on the same rows without the anchor.
                plain = dataclasses.replace(priors, decode={k: v for k, v in priors.decode.items() if not k[1]})
                us_plain = cost._roofline_cost(s.geo, s.m, _Caps(s.gfx, s.cu), plain, peaks[(s.gfx, s.cu)],
                                               max(tm, tc))[0]
                res[("arch", s.gfx, 0)].append(math.log(s.us / us_plain))
            errs.append(abs(us / s.us - 1))
            by_target[f"{s.gfx}/{s.cu}"].append(abs(us / s.us - 1))
            res[(level, s.gfx, s.cu)].append(math.log(s.us / us))
            res[(level, s.gfx, 0)].append(math.log(s.us / us))
    return errs, res, by_target, preds


def decode_by_pair(samples, preds):
    """Leave-one-file-out decode errors per target, (activation, weight) pair and M <= 4 / M > 4: ``{"gfx950/256
    a8w8 M<=4": {"n", "median" error, "truth_over_pred" median}}`` — where a shared fixed term would miss."""
    out = defaultdict(list)
    for s in samples:
        if s.m <= DECODE_MAX_TOKENS:
            us = preds[id(s)][0]
            out[f"{s.gfx}/{s.cu} {s.geo.pair} {'M<=4' if s.m <= 4 else 'M>4'}"].append((abs(us / s.us - 1), s.us / us))
    return {k: {"n": len(v), "median": round(statistics.median(e for e, _r in v), 4),
                "truth_over_pred": round(statistics.median(r for _e, r in v), 4)} for k, v in sorted(out.items())}


def decode_slope(samples, preds):
    """Leave-one-file-out predicted us(2M)/us(M) against the rows' own, over shapes with clean rows at M and 2M
    (2M <= DECODE_MAX_TOKENS). ``rises`` = share of those pairs predicted to rise (each touches more experts)."""
    by = defaultdict(dict)
    for s in samples:
        if s.m <= DECODE_MAX_TOKENS:
            by[s.shape][s.m] = s
    truth, pred, err, rises = [], [], [], 0
    for rows in by.values():
        for m, s in rows.items():
            t = rows.get(2 * m)
            if t is None or s.geo.active_experts(2 * m) <= s.geo.active_experts(m):
                continue
            rt, rp = t.us / s.us, preds[id(t)][0] / preds[id(s)][0]
            truth.append(rt)
            pred.append(rp)
            err.append(abs(rp / rt - 1))
            rises += rp > 1.0 + 1e-9
    return {"truth_median": round(statistics.median(truth), 4), "pred_median": round(statistics.median(pred), 4),
            "error_median": round(statistics.median(err), 4), "rises": round(rises / len(pred), 4), "n": len(pred)}


def decode_roofline_ratio(samples, priors):
    """Per product: prediction ÷ HBM roofline (t_mem at its datasheet bandwidth) on the untuned roofline path at
    M = 1, 2, 4 … DECODE_MAX_TOKENS, over the distinct geometries of the clean decode rows of its (gfx, CU count):
    median, median at M = 1, and the minimum of the prediction's and of its low bar's ratio (never below 1)."""
    shapes = {(s.gfx, s.cu, s.geo) for s in samples if s.m <= DECODE_MAX_TOKENS}
    out = {}
    for product, (gfx, cu) in DECODE_PRODUCTS.items():
        pk = capdb.product_peaks(product)
        caps = _Caps(gfx, cu, product)
        ratios, at1, lows = [], [], []
        for g, c, geo in sorted(shapes, key=repr):
            if (g, c) != (gfx, cu):
                continue
            m = 1
            while m <= DECODE_MAX_TOKENS:
                tm, tc = cost.roofline_us(geo, m, pk)
                us, low, _hi, _d, _l = cost._roofline_cost(geo, m, caps, priors, pk, max(tm, tc))
                ratios.append(us / tm)
                lows.append(low / tm)
                if m == 1:
                    at1.append(us / tm)
                m *= 2
        out[product] = {"median": round(statistics.median(ratios), 3), "m1_median": round(statistics.median(at1), 3),
                        "min": round(min(ratios), 3), "low_min": round(min(lows), 3), "n": len(ratios)}
    return out


def implied_tbps(samples, peaks):
    """Per target: the HBM bandwidth clean decode rows imply (bytes moved ÷ us, TB/s) — median and max — and how
    many exceed the reference product's measured ceiling in gpus.toml (``measured_hbm_tbps``)."""
    out = {}
    for (gfx, cu), product in sorted(REFERENCE.items()):
        tbps = [s.geo.bytes_moved(s.m) / s.us / 1e6 for s in samples
                if (s.gfx, s.cu) == (gfx, cu) and s.m <= DECODE_MAX_TOKENS]
        ceiling = peaks[(gfx, cu)].get("measured_hbm_tbps")
        out[f"{gfx}/{cu}"] = {"product": product, "median": round(statistics.median(tbps), 3),
                              "max": round(max(tbps), 3), "n": len(tbps), "measured_ceiling": ceiling,
                              "above_ceiling": sum(round(t, 3) > ceiling for t in tbps) if ceiling else None}
    return out


def _nested_band(entries, file):
    """p10/p90 band of the ``(file, log residual)`` entries of other files (None under 20 of them)."""
    others = [r for f, r in entries if f != file]
    return band_of(others)[:2] if len(others) >= 20 else None


def coverage(samples, preds, generic, in_res, in_files, releases):
    """Share of truths inside the [low, high] bars per basis, each bar built without the truth's own file:

    * ``roofline`` — leave-one-file-out predictions (decode fits and priors) against the p10/p90 band of the
      other files' residuals of the level that answered (per (gfx, CU count), else per gfx, else the generic band);
    * ``interpolated`` — in-shape interpolation against the band of the other files' in-shape residuals;
    * ``tuned`` — every re-tuning between two consecutive releases (a key's lint-clean µs in one release against
      its row in the other, both directions), against the release-aware ``tuned`` bars
      (:mod:`moedispatch.cost.release`) derived without that release pair;
    * ``heuristic`` — the published untuned-vs-tuned A/Bs of capability_db/cost_heuristic_evidence.toml, each
      thread's ratios against the ``[heuristic]`` band derived from the other threads
      (:func:`moedispatch.cost.heuristic.held_out_coverage`).
    """
    res = defaultdict(list)
    for s in samples:
        us, level = preds[id(s)]
        for key in ((level, s.gfx, s.cu), (level, s.gfx, 0)):
            res[key].append((s.file, math.log(s.us / us)))
    inside = []
    for s in samples:
        us, level = preds[id(s)]
        band = _nested_band(res[(level, s.gfx, s.cu)], s.file) or _nested_band(res[(level, s.gfx, 0)], s.file) \
            or (generic["low"], generic["high"])
        inside.append(band[0] <= s.us / us <= band[1])
    pairs = list(zip(in_files, in_res))
    in_inside = []
    for f, r in pairs:
        band = _nested_band(pairs, f)
        in_inside.append(band[0] <= math.exp(r) <= band[1])
    tuned = []
    for relation in ("later", "earlier"):
        truths = drift.retunings(releases, relation)
        for pair in sorted({t.pair for t in truths}):
            band = drift.band_of(t.log_ratio for t in truths if t.pair != pair)
            lo, hi = min(band[0], TUNED_BAND["low"]), max(band[1], TUNED_BAND["high"])
            tuned += [lo <= math.exp(t.log_ratio) <= hi for t in truths if t.pair == pair]
    share = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
    heur, n_heur = heuristic.held_out_coverage(heuristic.load_evidence())
    return {"roofline": share(inside), "interpolated": share(in_inside), "tuned": share(tuned),
            "heuristic": round(heur, 4),
            "n": {"roofline": len(inside), "interpolated": len(in_inside), "tuned": len(tuned), "heuristic": n_heur}}


def release_heldout(releases, snapshot, priors, peaks):
    """Rows an older release had and release ``snapshot`` (the planned one) has not: each key's latest lint-clean
    µs, predicted through :func:`moedispatch.cost.model.predict_one` from ``snapshot``'s clean rows of the same
    tuned shape (exact activation first, then AITER's act wildcard) and the priors fit on ``snapshot`` — which never
    saw them — with the bars of a user whose AITER is older than the rows' release (``earlier``).

    Returns ``{basis: [(error, inside the bars)]}``."""
    tags = [t for t, _c, _r in releases]
    if snapshot not in tags:
        return {}
    at = tags.index(snapshot)
    planned = releases[at][2]
    truths = {}
    for tag, _commit, rows in releases[:at]:
        for key, row in rows.items():
            if key not in planned:
                truths[key] = (tag, row)             # later releases overwrite: the latest value
    shapes, wild = defaultdict(dict), defaultdict(dict)
    for row in planned.values():
        shapes[row.shape()].setdefault(row.token, (float(row.us), row.where))
        wild[row.shape()[:6] + row.shape()[7:]].setdefault(row.token, (float(row.us), row.where))
    out = defaultdict(list)
    for key, (tag, row) in sorted(truths.items(), key=lambda kv: repr(kv[0])):
        table = shapes.get(row.shape()) or wild.get(row.shape()[:6] + row.shape()[7:]) or {}
        ctx = release.ReleaseContext(snapshot, f"AITER {snapshot}", "earlier", tag)
        c = cost.predict_one(cost.Geometry.of_row(row), row.token, table, _Caps(row.gfx, row.cu_num), priors,
                             peaks[(row.gfx, row.cu_num)], ctx=ctx)
        out[c.basis].append((abs(c.us / float(row.us) - 1), c.low <= float(row.us) <= c.high))
    return out


def baselines(samples, peaks):
    naive, careful = [], []
    effs = defaultdict(list)
    for s in samples:
        tm, tc = cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])
        naive.append(abs(max(tm, tc) / s.us - 1))
        effs[(s.gfx, s.cu, cost.bucket_of(s.m))].append((s.file, max(tm, tc) / s.us))
    for s in samples:
        tm, tc = cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])
        others = [e for f, e in effs[(s.gfx, s.cu, cost.bucket_of(s.m))] if f != s.file]
        if others:
            careful.append(abs(max(tm, tc) / statistics.median(others) / s.us - 1))
    return naive, careful


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="rewrite capability_db/cost_priors.toml from this run")
    ap.add_argument("--snapshot", default="head", help="release of the AITER index (head, v0.1.18, …)")
    ap.add_argument("--out", help="with --fit: write the priors here instead of capability_db/cost_priors.toml")
    ap.add_argument("--aiter-data", metavar="DIR",
                    help="read the release's tuned CSVs from DIR/<snapshot>/aiter/configs (AITER's own files, e.g. "
                         "../shared/aiter) instead of the bundled index")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cs, rows, samples, rejected, peaks = load(args.snapshot, args.aiter_data)
    copied = sum("copied" in why for _, why in rejected)
    fast = sum("faster" in why for _, why in rejected)
    gone = sum("reverted by" in why for _, why in rejected)
    print(f"{cs.label}: {len(rows)} timed untagged rows, {len(samples)} clean "
          f"({copied} copied across buckets, {fast} faster than the datasheet roofline; {gone} more rows left out: "
          f"AITER reverted them, capability_db/{reverted.REVERTED_FILE})", flush=True)

    in_errs, in_res, naive_in, in_files = in_shape(samples, peaks)
    lo, hi, n = band_of(in_res)
    interp_band = {"low": round(lo, 4), "high": round(hi, 4), "n": n, "confidence": "derived",
                   "note": "p10/p90 of actual/predicted, leave-one-bucket-out over the clean rows"}

    full = fit_models(samples, peaks)
    effs = sorted(max(cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])) / s.us for s in samples)
    eff = statistics.median(effs)
    gen_res = [math.log(s.us / (max(cost.roofline_us(s.geo, s.m, peaks[(s.gfx, s.cu)])) / eff)) for s in samples]
    glo, ghi, _ = band_of(gen_res)
    generic = {"efficiency": round(eff, 4), "low": round(glo, 4), "high": round(ghi, 4),
               "note": "median roofline efficiency of all clean rows (archs without a prior)"}
    provenance = {
        "snapshot": args.snapshot, "commit": cs.commit or "", "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "script": "benchmarks/bench_cost_model.py --fit", "rows": len(rows), "clean_rows": len(samples),
        "lint_copied": copied, "lint_faster_than_roofline": fast, "reverted_rows": gone,
        "method": "log(us) = coef . features, least absolute deviations (IRLS), per level: bucket = (gfx, cu, "
                  "token bucket) if >= 12 rows, arch_cu = (gfx, cu) if >= 150, arch = gfx if >= 40; decode (<= "
                  f"{DECODE_MAX_TOKENS} tokens) = fixed_us + t_mem / efficiency, least absolute relative deviations "
                  f"(moedispatch.cost.model.fit_decode), per (gfx, cu) if >= {MIN_DECODE_ROWS} rows and per gfx, each "
                  f"(activation, weight) pair with >= {MIN_DECODE_ROWS} rows from >= {MIN_PAIR_FILES} files getting "
                  "its own fixed term at that efficiency (moedispatch.cost.model.fit_decode_fixed; the others, listed "
                  "in pairs_on_fallback, take the (gfx, cu) term); above the decode range, a CU count answered by the "
                  "arch prior is scaled to meet its own decode fit at max_tokens (band level arch_anchored); "
                  "bands = p10/p90 of leave-one-model-file-out residuals of the level that answered",
    }
    decode = decode_fits(samples, peaks)
    base_doc = priors_doc(full, {}, interp_band, generic, provenance, decode)
    lofo_errs, res, by_target, preds = lofo(samples, peaks, full, base_doc, decode)
    bands = {k: band_of(v) for k, v in res.items() if len(v) >= 20}
    naive, careful = baselines(samples, peaks)
    doc = priors_doc(full, bands, interp_band, generic, provenance, decode)
    fitted = cost_priors.parse_priors(doc)
    slope = decode_slope(samples, preds)
    ratio = decode_roofline_ratio(samples, fitted)
    tbps = implied_tbps(samples, peaks)
    releases = drift.release_rows(args.aiter_data, REFERENCE)
    cover = coverage(samples, preds, generic, in_res, in_files, releases)
    held = release_heldout(releases, args.snapshot, fitted, peaks)
    held_all = [e for v in held.values() for e, _i in v]
    large = [abs(preds[id(s_)][0] / s_.us - 1) for s_ in samples if s_.m >= cost.LARGE_M]
    large_hi = [abs(preds[id(s_)][0] / s_.us - 1) for s_ in samples
                if s_.gfx == "gfx950" and 16384 <= cost.bucket_of(s_.m) <= 32768]

    if args.fit:
        path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "capability_db",
                                        "cost_priors.toml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(_to_toml(doc))
        print(f"wrote {os.path.normpath(path)}: {len(doc['model'])} priors, {len(doc['band'])} bands",
              flush=True)

    ins, lof, nai, car = summary(in_errs), summary(lofo_errs), summary(naive), summary(careful)
    print(f"in-shape interpolation   n={ins['n']:5d} median {ins['median']:.1%} p90 {ins['p90']:.1%}", flush=True)
    print(f"roofline + priors, LOFO  n={lof['n']:5d} median {lof['median']:.1%} p90 {lof['p90']:.1%}", flush=True)
    print(f"bucket-median eff, LOFO  n={car['n']:5d} median {car['median']:.1%} p90 {car['p90']:.1%}", flush=True)
    print(f"naive datasheet roofline n={nai['n']:5d} median {nai['median']:.1%} p90 {nai['p90']:.1%}", flush=True)
    for key, (a, e, n_rows, extra) in decode.items():
        if len(key) == 3:
            print(f"  pair {key[2]}: own fixed term {a:.1f} µs ({n_rows} clean rows in {extra} files)", flush=True)
            continue
        print(f"decode fit {key[0]}/{key[1] or 'any'}: {a:.1f} µs + t_mem / {e:.3f} ({n_rows} clean rows <= "
              f"{DECODE_MAX_TOKENS} tokens)" + (f"; on its fixed term: {', '.join(extra)}" if extra else ""),
              flush=True)
    dec = [abs(preds[id(s_)][0] / s_.us - 1) for s_ in samples if s_.m <= DECODE_MAX_TOKENS]
    print(f"decode (<= {DECODE_MAX_TOKENS} tokens), LOFO n={len(dec):4d} median {statistics.median(dec):.1%} "
          f"p90 {pct(dec, 0.9):.1%}", flush=True)
    by_pair = decode_by_pair(samples, preds)
    print("  by target, pair and M, LOFO (median error, truth/pred): " + "; ".join(
        f"{k} {v['median']:.1%} {v['truth_over_pred']:.2f} (n={v['n']})" for k, v in by_pair.items()), flush=True)
    print(f"decode slope us(2M)/us(M), LOFO: predicted median {slope['pred_median']:.3f} vs rows "
          f"{slope['truth_median']:.3f}; median error {slope['error_median']:.1%}; rising in {slope['rises']:.1%} "
          f"of {slope['n']} pairs (goal: 100%)", flush=True)
    for product, r in ratio.items():
        print(f"decode ÷ HBM roofline, {product:6s} untuned: median {r['median']:.2f} (M=1: {r['m1_median']:.2f}), "
              f"min {r['min']:.2f}, low bar min {r['low_min']:.2f} (goal: >= 1) over {r['n']}", flush=True)
    print("inside the bars, each built without the truth's own file (heuristic: own thread; goal 75-85%): " + ", ".join(
        f"{b} {v:.1%} of {cover['n'][b]}" if v is not None else f"{b} not measurable (no data)"
        for b, v in cover.items() if b != "n"), flush=True)
    hb = doc["heuristic"]
    print(f"heuristic band (untuned ÷ tuned, {hb['n']} same-shape A/Bs in {hb['threads']} threads, "
          f"capability_db/{heuristic.EVIDENCE_FILE}): x{hb['factor']:.2f} ({hb['low']:.2f}-{hb['high']:.2f})",
          flush=True)
    print(f"roofline + priors, LOFO at >= {cost.LARGE_M} tokens n={len(large)} median {statistics.median(large):.1%} "
          f"p90 {pct(large, 0.9):.1%}; gfx950 16k-32k p90 {pct(large_hi, 0.9):.1%} (was 42-46% without the "
          "large-M terms)", flush=True)
    if held_all:
        print(f"release held-out ({len(held_all)} keys older releases had and {args.snapshot} has not, predicted "
              f"from {args.snapshot}'s rows; goal median <= 6%, p90 <= 20%): median {statistics.median(held_all):.1%} "
              f"p90 {pct(held_all, 0.9):.1%}", flush=True)
        for basis, v in sorted(held.items()):
            errs_b = [e for e, _i in v]
            print(f"  {basis:12s} n={len(v):4d} median {statistics.median(errs_b):.1%} p90 {pct(errs_b, 0.9):.1%}; "
                  f"inside the bars {sum(i for _e, i in v) / len(v):.1%} (goal 75-85%)", flush=True)
    for target, t in tbps.items():
        print(f"decode rows' implied HBM, {target} ({t['product']}): median {t['median']:.2f} TB/s, max "
              f"{t['max']:.2f}; {t['above_ceiling']} of {t['n']} above the measured ceiling {t['measured_ceiling']}",
              flush=True)
    result = {
        "in_shape_median": round(ins["median"], 4), "in_shape_p90": round(ins["p90"], 4), "in_shape_n": ins["n"],
        "lofo_median": round(lof["median"], 4), "lofo_p90": round(lof["p90"], 4), "lofo_n": lof["n"],
        "naive_roofline_median": round(nai["median"], 4), "naive_roofline_p90": round(nai["p90"], 4),
        # The naive roofline fits nothing, so its leave-one-model-out error is its error on every row; in-shape
        # is the same rows the interpolation predicted.
        "naive_in_shape_median": round(statistics.median(naive_in), 4),
        "naive_in_shape_p90": round(pct(naive_in, 0.9), 4),
        "naive_lofo_median": round(nai["median"], 4), "naive_lofo_p90": round(nai["p90"], 4),
        "bucket_prior_lofo_median": round(car["median"], 4), "bucket_prior_lofo_p90": round(car["p90"], 4),
        "lofo_median_by_target": {k: round(statistics.median(v), 4) for k, v in sorted(by_target.items())},
        "decode_lofo_median": round(statistics.median(dec), 4), "decode_lofo_p90": round(pct(dec, 0.9), 4),
        "decode_fit": {"/".join(map(str, k)): {"fixed_us": round(a, 2), "efficiency": round(e, 3), "n": n_rows}
                       for k, (a, e, n_rows, _x) in decode.items()},
        "decode_lofo_by_pair": by_pair,
        "decode_slope": slope, "decode_roofline_ratio": ratio, "decode_implied_tbps": tbps,
        "coverage": {b: v for b, v in cover.items() if b != "n"}, "coverage_n": cover["n"],
        "release_heldout_median": round(statistics.median(held_all), 4) if held_all else None,
        "release_heldout_p90": round(pct(held_all, 0.9), 4) if held_all else None,
        "release_heldout_n": len(held_all),
        "release_heldout_by_basis": {b: {"n": len(v), "median": round(statistics.median(e for e, _i in v), 4),
                                         "p90": round(pct([e for e, _i in v], 0.9), 4),
                                         "coverage": round(sum(i for _e, i in v) / len(v), 4)}
                                     for b, v in sorted(held.items())},
        "lofo_large_m": {"median": round(statistics.median(large), 4), "p90": round(pct(large, 0.9), 4),
                         "n": len(large), "gfx950_16k_32k_p90": round(pct(large_hi, 0.9), 4)},
        "rows": len(rows), "clean_rows": len(samples), "snapshot": cs.label,
        "seconds": round(time.perf_counter() - t0, 1), "numpy": _np is not None,
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}".replace("  ", " "),
    }
    print(json.dumps(result))
    return 0


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def _to_toml(doc) -> str:
    """The priors document as TOML (tables first, then arrays of tables), with a header saying where it came from."""
    out = ["# Efficiency priors and error bars of moedispatch's MoE cost model (moedispatch/cost/model.py).",
           "# GENERATED by `python benchmarks/bench_cost_model.py --fit` from one release of moedispatch's AITER index",
           "# (capability_db/aiter_index.json, see [provenance]); do not edit by hand, refit instead.", "",
           f"schema = {_toml_value(doc['schema'])}", ""]
    for name in ("provenance", "tuned", "interpolated", "generic"):
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in doc[name].items()]
        out.append("")
    out.append("[heuristic]")
    out += [f"{k} = {_toml_value(v)}" for k, v in doc["heuristic"].items()]
    out.append("")
    for name, entry in doc["backend"].items():
        out.append(f"[backend.{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
        out.append("")
    for array in ("reference", "decode", "band", "model"):
        for entry in doc[array]:
            out.append(f"[[{array}]]")
            out += [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
