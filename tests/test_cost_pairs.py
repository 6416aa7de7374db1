"""Decode fixed term per (activation, weight) pair, and the arch prior anchored to a CU count's own decode fit
(moedispatch.cost.model, issue 26 items 1 and 5).

On gfx950 a single fixed decode term for every dtype pair under-predicted FP8 x FP8 and BF16-activation x 4-bit calls
and over-predicted FP8-activation x FP4 ones (leave-one-file-out, benchmarks/bench_cost_model.py
``decode_lofo_by_pair``): each pair with enough clean rows (``MIN_DECODE_ROWS`` from ``MIN_PAIR_FILES`` files) now has
its own fixed term at its (arch, CU count) fit's bandwidth share, fit by code and shipped in
capability_db/cost_priors.toml; other pairs take the (arch, CU count) term, listed in ``pairs_on_fallback``.
Above the decode range, a CU count that only the arch-wide prior covers is scaled to meet its own decode fit.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from pathlib import Path

import pytest

from moedispatch.core.errors import CapabilityDBError
from moedispatch.core.layers import MoELayer
from moedispatch.cost import model as cost
from moedispatch.data import capdb
from moedispatch.testing import fake_capabilities

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench():
    """benchmarks/bench_cost_model.py as a module (absent from mutation testing's scratch copy: skip there)."""
    if not (ROOT / "benchmarks" / "bench_cost_model.py").is_file():
        pytest.skip("benchmarks/ not in this tree")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_cost_model
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench_cost_model


def _layer(weight: str, act: str, **kw) -> MoELayer:
    args = dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8)
    args.update(kw)
    return MoELayer.build(weight=weight, act=act, **args)


# -- the pair ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weight, act, pair", [
    ("fp8", "fp8", "a8w8"), ("mxfp4", "mxfp4", "a4w4"), ("mxfp4", "bf16", "a16w4"), ("mxfp4", "fp8", "a8w4"),
    ("bf16", "bf16", "a16w16"), ("int4", "bf16", "a16w4"), ("mxfp6", "mxfp6", "a6w6"),
])
def test_pair_is_aiters_activation_weight_naming(weight, act, pair):
    """Bits per activation and weight element, scales not counted — AITER's a16w4 / a8w4 / a4w4 file names."""
    assert cost.Geometry.of_layer(_layer(weight, act)).pair == pair


@pytest.mark.parametrize("q_w, q_a, q_type, pair", [
    ("torch.float4_e2m1fn_x2", "torch.bfloat16", "QuantType.per_1x32", "a16w4"),
    ("torch.int4", "torch.bfloat16", "QuantType.per_Token", "a16w4"),
    ("torch.float8_e4m3fn", "torch.float8_e4m3fn", "QuantType.per_1x128", "a8w8"),
    ("torch.float4_e2m1fn_x2", "torch.float8_e4m3fn", "QuantType.per_1x32", "a8w4"),
])
def test_pair_of_a_tuned_row(q_w, q_a, q_type, pair):
    row = {"model_dim": 7168, "inter_dim": 256, "expert": 257, "topk": 9, "q_dtype_a": q_a, "q_dtype_w": q_w,
           "q_type": q_type, "use_g1u1": 1}
    assert cost.Geometry.of_row(row).pair == pair


# -- the fit -------------------------------------------------------------------------------------------------------

def test_fit_decode_fixed_is_the_weighted_median_of_the_rest():
    """a = median of (us − t/e) weighted by 1/us: the least absolute relative deviation, exactly."""
    pts = [(10.0, 30.0), (20.0, 40.0), (30.0, 90.0)]           # us − t/0.5 = 10, 0, 30 with weights 1/30, 1/40, 1/90
    assert cost.fit_decode_fixed(pts, 0.5) == pytest.approx(10.0)
    best = min((sum(abs((a + t / 0.5) / u - 1) for t, u in pts), a) for a in [x / 10 for x in range(0, 400)])[1]
    assert cost.fit_decode_fixed(pts, 0.5) == pytest.approx(best, abs=0.1)
    # Weighted by 1/us: two fast rows outweigh two slow ones (unweighted, the lower middle value would be 6).
    assert cost.fit_decode_fixed([(0.0, 5.0), (0.0, 6.0), (50.0, 100.0), (40.0, 100.0)], 1.0) == 5.0
    # Slow outliers do not move it.
    clean = [(x, 14.0 + x / 0.7) for x in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)]
    assert cost.fit_decode_fixed(clean, 0.7) == pytest.approx(14.0)
    assert cost.fit_decode_fixed(clean + [(1.0, 90.0), (2.0, 95.0)], 0.7) == pytest.approx(14.0)
    # The lower of the two middle values on an even split of the weight.
    assert cost.fit_decode_fixed([(0.0, 10.0), (0.0, 10.0 + 1e-9)], 1.0) == pytest.approx(10.0)
    assert cost.fit_decode_fixed([(40.0, 10.0), (40.0, 12.0)], 1.0) == 0.0     # never a negative latency
    with pytest.raises(ValueError):
        cost.fit_decode_fixed([(1.0, 0.0)], 1.0)


def _sample(gfx, cu, pair_w, pair_a, t_mem, us, file):
    class S:
        pass
    s = S()
    s.gfx, s.cu, s.m, s.us, s.file = gfx, cu, 4, us, file
    a_bytes = {"a16": 2.0, "a8": 1.0, "a4": 0.5}[pair_a]
    w_bytes = {"w16": 2.0, "w8": 1.0, "w4": 0.5}[pair_w]
    # the roofline is stubbed to return t_mem per geometry object (the test below)
    s.geo = cost.Geometry(hidden=1, inter=1, experts=1, experts_total=1, top_k=1, w_bytes=w_bytes, a_bytes=a_bytes,
                          compute="bf16", gated=True)
    s.t_mem = t_mem
    return s


def test_decode_fits_give_a_pair_its_own_term_only_with_enough_rows_and_files(monkeypatch, bench):
    """A pair with MIN_DECODE_ROWS rows from MIN_PAIR_FILES files gets its own fixed term at the parent's
    efficiency; one file or too few rows: listed on the fallback, no entry."""
    assert (bench.MIN_DECODE_ROWS, bench.MIN_PAIR_FILES) == (12, 2)
    samples = []
    for i in range(12):   # a8w8: 12 rows in 2 files, 10 µs above the bytes
        s = _sample("gfx950", 256, "w8", "a8", 10.0 + i, 10.0 + i / 0.5 + 10.0, f"f{i % 2}")
        samples.append(s)
    for i in range(12):   # a4w4: 12 rows, one file
        samples.append(_sample("gfx950", 256, "w4", "a4", 10.0 + i, 10.0 + i / 0.5 + 5.0, "g"))
    for i in range(11):   # a16w4: 11 rows in 3 files
        samples.append(_sample("gfx950", 256, "w4", "a16", 10.0 + i, 10.0 + i / 0.5 + 30.0, f"h{i % 3}"))
    geos = {id(s.geo): s.t_mem for s in samples}
    monkeypatch.setattr(bench.cost, "roofline_us", lambda geo, m, peaks: (geos[id(geo)], 0.0))
    fits = bench.decode_fits(samples, {("gfx950", 256): {}})
    fixed, eff, n, fallback = fits[("gfx950", 256)]
    assert n == 35
    assert sorted(fallback) == ["a16w4: 11 rows in 3 files", "a4w4: 12 rows in 1 file"]
    assert ("gfx950", 256, "a8w8") in fits and ("gfx950", 256, "a4w4") not in fits
    a, e, n_pair, files = fits[("gfx950", 256, "a8w8")]
    assert (e, n_pair, files) == (eff, 12, 2)
    assert a == pytest.approx(cost.fit_decode_fixed([(s.t_mem, s.us) for s in samples[:12]], eff))
    assert list(fits)[0] == ("gfx950", 0)   # each (gfx, cu) entry before its pairs


# -- what predict does with it -------------------------------------------------------------------------------------

def _t_mem(layer, m, product):
    return cost.roofline_us(cost.Geometry.of_layer(layer), m, capdb.product_peaks(product))[0]


@pytest.mark.parametrize("weight, act", [("fp8", "fp8"), ("mxfp4", "mxfp4"), ("mxfp4", "fp8"), ("mxfp4", "bf16")])
def test_gfx950_decode_uses_the_pairs_own_fixed_term(weight, act):
    layer = _layer(weight, act)
    pair = cost.Geometry.of_layer(layer).pair
    priors = cost.load_priors()
    fit, parent = priors.decode_pair[("gfx950", 256, pair)], priors.decode[("gfx950", 256)]
    assert fit.efficiency == parent.efficiency and fit.fixed_us != parent.fixed_us and fit.pair == pair
    c = cost.predict(layer, fake_capabilities("MI355X"), backend_family="aiter-ck", tokens=2, rows=())[0]
    assert c.us == pytest.approx(fit.fixed_us + _t_mem(layer, 2, "MI355X") / fit.efficiency)
    assert f"{fit.fixed_us:.1f} µs ({pair}'s own, fit on its {fit.n} clean tuned rows)" in c.detail


def test_shipped_pair_terms_order_as_the_rows_say():
    """gfx950: FP8-activation x FP4 fastest, then FP4 x FP4, then the shared term, FP8 x FP8, BF16 x 4-bit slowest
    (the leave-one-file-out truth/prediction ratios of the shared term: 0.89, 0.95, —, 1.15, 1.27 at M <= 4)."""
    d = cost.load_priors().decode_pair
    shared = cost.load_priors().decode[("gfx950", 256)].fixed_us
    order = [d[("gfx950", 256, p)].fixed_us for p in ("a8w4", "a4w4")] + [shared] + \
        [d[("gfx950", 256, p)].fixed_us for p in ("a8w8", "a16w4")]
    assert order == sorted(order)


def test_a_pair_without_its_own_term_takes_the_cu_counts():
    """BF16 x BF16 on gfx950 has 7 clean decode rows in one file: on the fallback, the (gfx950, 256) term answers."""
    layer = _layer("bf16", "bf16")
    priors = cost.load_priors()
    assert ("gfx950", 256, "a16w16") not in priors.decode_pair
    parent = priors.decode[("gfx950", 256)]
    shipped = copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))
    entry = next(d for d in shipped["decode"] if (d["gfx"], d["cu"]) == ("gfx950", 256) and "pair" not in d)
    assert entry["pairs_on_fallback"] == ["a16w16: 7 rows in 1 file"]
    c = cost.predict(layer, fake_capabilities("MI355X"), backend_family="aiter-ck", tokens=1, rows=())[0]
    assert c.us == pytest.approx(parent.fixed_us + _t_mem(layer, 1, "MI355X") / parent.efficiency)
    assert "'s own" not in c.detail


def test_a_cu_count_without_a_fit_takes_the_arch_pairs():
    """MI350P (gfx950, 128 CUs) has no fit of its own: the arch's (cu 0) entry and its pair terms answer."""
    layer = _layer("fp8", "fp8")
    fit = cost.load_priors().decode_pair[("gfx950", 0, "a8w8")]
    c = cost.predict(layer, fake_capabilities("MI350P"), backend_family="aiter-ck", tokens=1, rows=())[0]
    assert c.us == pytest.approx(fit.fixed_us + _t_mem(layer, 1, "MI350P") / fit.efficiency)


# -- the arch prior anchored on a CU count's decode fit --------------------------------------------------------------

def _arch_prior(layer, m, product):
    feats, coef = cost.load_priors().models[("arch", "gfx942", 0, 0)]
    x = cost.model_features(feats, cost.Geometry.of_layer(layer), m, 304, capdb.product_peaks(product))
    return math.exp(sum(a * b for a, b in zip(coef, x)))


def _roofline(layer, m, product):
    return max(cost.roofline_us(cost.Geometry.of_layer(layer), m, capdb.product_peaks(product)))


@pytest.mark.parametrize("target", ["MI300X", "MI325X"])
def test_mi300x_above_decode_is_the_arch_prior_scaled_to_its_decode_fit(target):
    """cu 304 has no bucket prior: the arch prior's curve, times decode(64) / arch prior(64) — both at MI300X's
    peaks, the reference the two were fit against — so MI325X gets the same factor, and then its own roofline over
    MI300X's (its 6.0 TB/s credited where the call is memory-bound, as the decode fit credits it below 64 tokens)."""
    layer = _layer("fp8", "fp8")
    priors = cost.load_priors()
    fit = priors.decode_pair[("gfx942", 304, "a8w8")]
    edge = fit.fixed_us + _t_mem(layer, 64, "MI300X") / fit.efficiency
    scale = edge / _arch_prior(layer, 64, "MI300X")
    assert abs(scale - 1) > 0.02   # the anchor moves the prior
    costs = cost.predict(layer, fake_capabilities(target), backend_family="aiter-ck", tokens=(256, 1024), rows=())
    for c in costs:
        own = _roofline(layer, c.tokens, target) / _roofline(layer, c.tokens, "MI300X")
        assert c.us == pytest.approx(_arch_prior(layer, c.tokens, "MI300X") * scale * own)
        assert (own < 1) == (target == "MI325X")   # memory-bound at 256 and 1024 tokens: MI325X is faster
        assert "scaled to meet the decode fit gfx942/304 at 64 tokens" in c.detail
        assert ("at MI325X's own roofline" in c.detail) == (target == "MI325X")
        low, high = priors.bands[("arch_anchored", "gfx942", 304)]
        assert (c.low / c.us, c.high / c.us) == pytest.approx((low, high))


def test_a_partition_keeps_the_plain_arch_prior_and_its_band():
    """MI300X:CPX (38 CUs) has no decode fit of its own: nothing to anchor on, the plain arch prior and its band."""
    layer = _layer("fp8", "fp8", tp=8)
    caps = fake_capabilities("MI300X")
    import dataclasses
    part = dataclasses.replace(caps, compute_units=38)
    priors = cost.load_priors()
    geo = cost.Geometry.of_layer(layer)
    us, _low, _high, detail, level = cost._roofline_cost(geo, 1024, part, priors,
                                                         capdb.product_peaks("MI300X"), 0.0)
    assert level == "arch" and "arch prior gfx942" in detail and "scaled" not in detail
    low, high = priors.bands[("arch", "gfx942", 0)]
    assert (_low / us, _high / us) == pytest.approx((low, high))


# -- data validation -----------------------------------------------------------------------------------------------

@pytest.fixture
def serve_priors(monkeypatch):
    real = capdb.load_toml.__wrapped__

    def serve(mutate):
        doc = copy.deepcopy(real("cost_priors.toml"))
        mutate(doc)
        monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == "cost_priors.toml" else real(name))
        cost.load_priors.cache_clear()

    yield serve
    cost.load_priors.cache_clear()


def _pair_entry(doc, gfx="gfx950", cu=256, pair="a8w8"):
    return next(d for d in doc["decode"] if (d["gfx"], d["cu"], d.get("pair")) == (gfx, cu, pair))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: _pair_entry(d).update(pair="fp8"), "pair must be like 'a8w4'"),
    (lambda d: _pair_entry(d).update(pair=8), "pair must be like 'a8w4'"),
    (lambda d: _pair_entry(d).update(efficiency=0.5), "with the same efficiency and max_tokens"),
    (lambda d: _pair_entry(d).update(max_tokens=32), "with the same efficiency and max_tokens"),
    (lambda d: d.update(decode=[e for e in d["decode"] if "pair" in e or e["cu"] != 256]),
     "needs a decode entry for gfx950/256 without a pair"),
])
def test_malformed_pair_entries_raise(serve_priors, mutate, message):
    serve_priors(mutate)
    with pytest.raises(CapabilityDBError, match=re.escape(message)) as err:
        cost.load_priors()
    assert "cost_priors.toml" in str(err.value)


def test_a_valid_edit_of_a_pair_term_is_what_predict_uses(serve_priors):
    serve_priors(lambda d: _pair_entry(d).update(fixed_us=99.0))
    layer = _layer("fp8", "fp8")
    c = cost.predict(layer, fake_capabilities("MI355X"), backend_family="aiter-ck", tokens=1, rows=())[0]
    fit = cost.load_priors().decode_pair[("gfx950", 256, "a8w8")]
    assert fit.fixed_us == 99.0
    assert c.us == pytest.approx(99.0 + _t_mem(layer, 1, "MI355X") / fit.efficiency)


def test_schema_covers_pairs_and_the_anchored_band():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "cost_priors.schema.json").read_text())
    doc = copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))
    jsonschema.validate(doc, schema)
    assert any("pair" in d for d in doc["decode"]) and any(b["level"] == "arch_anchored" for b in doc["band"])
    for mutate in (lambda d: _pair_entry(d).update(pair="fp8xfp8"), lambda d: _pair_entry(d).pop("files"),
                   lambda d: _pair_entry(d).update(pairs_on_fallback=["a4w4: 1 rows in 1 file"]),
                   lambda d: next(e for e in d["decode"] if "pair" not in e).update(files=2),
                   lambda d: next(e for e in d["decode"] if "pairs_on_fallback" in e).update(
                       pairs_on_fallback=["a16w16 has 7 rows"]),
                   lambda d: d["band"][0].update(level="arch_pinned")):
        broken = copy.deepcopy(doc)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


def test_a_product_sharing_the_reference_cu_count_is_priced_at_its_own_roofline():
    """The priors are a kernel's efficiency against the reference product's roofline (gfx950/256: MI355X). MI350X
    has MI355X's CUs and HBM but lower clocks: a compute-bound call (MXFP4 at 32k tokens) is slower by the peak
    ratio, a memory-bound one (a few hundred tokens of BF16 experts) is not; the reference itself is unchanged."""
    compute = _layer("mxfp4", "mxfp4", tp=1)
    memory = _layer("bf16", "bf16", tp=8)
    for layer, m in ((compute, 32768), (memory, 256)):
        ratio = _roofline(layer, m, "MI350X") / _roofline(layer, m, "MI355X")
        (a,) = cost.predict(layer, fake_capabilities("MI355X"), backend_family="aiter-ck", tokens=m, rows=())
        (b,) = cost.predict(layer, fake_capabilities("MI350X"), backend_family="aiter-ck", tokens=m, rows=())
        assert b.us == pytest.approx(a.us * ratio)
        assert (ratio > 1.05) == (layer is compute)
        assert "at MI350X's own roofline" in b.detail and "own roofline" not in a.detail
