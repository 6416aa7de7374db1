"""Decode as latency plus bytes (moedispatch.cost.model, issue 26 item 1): a fixed per-call term and an effective
bandwidth per (arch, CU count), fit by code from AITER's tuned rows and shipped in capability_db/cost_priors.toml;
the bytes grow with the experts touched, so predictions rise from 1 to 2 to 4 tokens, never below the datasheet
roofline, with no "fastest tuned row" floor; the target's own HBM is credited (MI325X)."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moedispatch.core.errors import CapabilityDBError
from moedispatch.core.layers import MoELayer
from moedispatch.cost import model as cost
from moedispatch.data import aiter_configs, capdb
from moedispatch.testing import fake_capabilities

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_cost_model.py"

#: Qwen3-30B-A3B-like FP8 at TP4 (2048 x 192 per rank, 128 experts, top-8): small enough that its one-token call on
#: MI308X is below the fastest clean cu-80 tuned row (23.58 µs, the old floor).
SMALL = MoELayer.build(hidden=2048, intermediate=768, experts=128, top_k=8, tp=4, weight="fp8", act="fp8")
#: DeepSeek-V3-like FP8 at TP8 and gpt-oss-like MXFP4: larger decode calls.
DSV3 = MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8")
GPTOSS = MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, weight="mxfp4", act="mxfp4")
#: Every expert selected by every token (top_k = experts): the experts touched cannot grow.
ALL_EXPERTS = MoELayer.build(hidden=2048, intermediate=512, experts=8, top_k=8, weight="bf16", act="bf16")

TARGETS = ["MI300X", "MI325X", "MI308X", "MI350X", "MI355X", "MI350P"]


def _fit_for(caps, layer=None):
    """The decode fit answering for ``caps``: its CU count's, else the arch's; with ``layer``, the entry of the
    layer's (activation, weight) pair under it where one was fit (its own fixed term, the same efficiency)."""
    priors = cost.load_priors()
    cu = caps.compute_units if (caps.gfx, caps.compute_units) in priors.decode else 0
    fit = priors.decode[(caps.gfx, cu)]
    if layer is None:
        return fit
    return priors.decode_pair.get((caps.gfx, cu, cost.Geometry.of_layer(layer).pair), fit)


def _expert_bytes(layer) -> float:
    """One expert's gate/up and down weights with their scales, counted here, not with cost.Geometry."""
    w = layer.weight
    per_weight = w.bits / 8 + (1 / 32 if w.is_mx else 0.0)
    return layer.hidden * 3 * layer.intermediate_per_rank * per_weight


# -- the fit is code, from AITER's own data ------------------------------------------------------------------------

def test_shipped_decode_fit_is_rederived_from_aiters_own_csvs(shared_aiter, tmp_path):
    """Refitting from ../shared/aiter/head's tuned CSVs (not the bundled index) gives the shipped [[decode]] entries,
    heuristic band and priors: the constants are produced by code, not typed in."""
    out = tmp_path / "priors.toml"
    run = subprocess.run([sys.executable, str(BENCH), "--fit", "--aiter-data", str(shared_aiter), "--out", str(out)],
                         capture_output=True, text=True, check=True, timeout=300)
    assert f"tuned CSVs in {shared_aiter}" in run.stdout.splitlines()[0]
    fresh = tomllib.loads(out.read_text())
    shipped = tomllib.loads((ROOT / "capability_db" / "cost_priors.toml").read_text())
    manifest = tomllib.loads((shared_aiter / "manifest.toml").read_text())
    assert shipped["provenance"]["commit"] == fresh["provenance"]["commit"] == \
        manifest["release"][shipped["provenance"]["snapshot"]]["commit"]
    assert [(d["gfx"], d["cu"], d["max_tokens"], d["n"]) for d in fresh["decode"]] == \
        [(d["gfx"], d["cu"], d["max_tokens"], d["n"]) for d in shipped["decode"]]
    for a, b in zip(fresh["decode"], shipped["decode"]):
        assert (a["fixed_us"], a["efficiency"]) == pytest.approx((b["fixed_us"], b["efficiency"]), abs=2e-4)
    assert {(d["gfx"], d["cu"]) for d in shipped["decode"]} == {("gfx942", 0), ("gfx942", 80), ("gfx942", 304),
                                                                  ("gfx950", 0), ("gfx950", 256)}
    assert [(d.get("pair"), d.get("files"), d.get("pairs_on_fallback")) for d in fresh["decode"]] == \
        [(d.get("pair"), d.get("files"), d.get("pairs_on_fallback")) for d in shipped["decode"]]
    assert fresh["heuristic"] == shipped["heuristic"]
    for a, b in zip(fresh["model"], shipped["model"]):
        assert a["coef"] == pytest.approx(b["coef"], rel=1e-3, abs=1e-3)


def test_fit_decode_recovers_latency_and_bandwidth_despite_outliers():
    """A least-absolute-relative-deviation fit: 14 µs + t_mem / 0.7 comes back from clean points, and a quarter of
    wild rows (3x slow) does not move it."""
    t = [0.5 * 1.3 ** i for i in range(40)]
    clean = [(x, 14.0 + x / 0.7) for x in t]
    assert cost.fit_decode(clean) == pytest.approx((14.0, 0.7), rel=1e-4)
    wild = [(x, u * 3 if i % 4 == 0 else u) for i, (x, u) in enumerate(clean)]
    assert cost.fit_decode(wild) == pytest.approx((14.0, 0.7), rel=1e-2)


def test_fit_decode_never_claims_more_than_the_datasheet_nor_negative_latency():
    """Rows faster than the datasheet bandwidth pin the efficiency at 1; rows that would need a negative fixed term
    get none."""
    fast = [(x, 5.0 + x / 1.25) for x in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)]
    fixed, eff = cost.fit_decode(fast)
    assert eff == 1.0 and fixed > 0
    steep = [(x, -3.0 + x / 0.5) for x in (10.0, 20.0, 40.0, 80.0)]
    fixed, eff = cost.fit_decode(steep)
    # refit as bytes alone: the bandwidth absorbs part of the negative offset (1/eff between the rows' us/t_mem)
    assert fixed == 0.0 and 1.7 < 1 / eff < 1.97
    with pytest.raises(ValueError):
        cost.fit_decode([(1.0, 2.0)])


# -- the shape of the decode curve --------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("backend", ["aiter-ck", "triton", "acme-moe"])
def test_decode_rises_with_the_experts_touched(target, backend):
    """1 < 2 < 4 < 8 tokens predict rising times wherever more experts are touched, each step by exactly the new
    experts' bytes at the fitted share of the target's HBM (times the backend's factor)."""
    caps = fake_capabilities(target)
    hbm = capdb.product_peaks(caps.product)["hbm_tbps"] * 1e6
    for layer in (SMALL, DSV3, GPTOSS):
        fit = _fit_for(caps, layer)
        costs = cost.predict(layer, caps, backend_family=backend, tokens=(1, 2, 4, 8), rows=())
        us = [c.us for c in costs]
        assert us[0] < us[1] < us[2] < us[3], (target, backend, layer.hidden, us)
        factor = us[0] / (fit.fixed_us + cost.roofline_us(cost.Geometry.of_layer(layer), 1,
                                                          capdb.product_peaks(caps.product))[0] / fit.efficiency)
        geo = cost.Geometry.of_layer(layer)
        for (m0, u0), (m1, u1) in zip(zip((1, 2, 4), us), zip((2, 4, 8), us[1:])):
            new_experts = geo.active_experts(m1) - geo.active_experts(m0)
            assert new_experts > 0
            weights = new_experts * _expert_bytes(layer) / hbm / fit.efficiency * factor
            assert weights < u1 - u0 < weights * 1.25, (target, backend, m0, m1)


def test_decode_is_flat_where_no_more_experts_can_be_touched():
    """With every expert selected by every token, only the activations grow: 1 → 4 tokens adds well under 1%."""
    caps = fake_capabilities("MI355X")
    one, four = cost.predict(ALL_EXPERTS, caps, backend_family="aiter-ck", tokens=(1, 4), rows=())
    assert one.us < four.us < one.us * 1.01


#: Smaller still (1024 x 256 per rank, 64 experts, top-4, FP8): at one token its bytes take about 1 µs on MI308X.
TINY = MoELayer.build(hidden=1024, intermediate=1024, experts=64, top_k=4, tp=4, weight="fp8", act="fp8")


def test_no_fastest_tuned_row_floor_on_mi308x():
    """MI308X: an FP8 call at one token costs the cu-80 fit's fixed term (the a8w8 pair's own) plus its bytes —
    for a tiny layer below the fastest clean cu-80 tuned row (23.58 µs, the removed floor) — and still rises to 2
    and 4 tokens."""
    caps = fake_capabilities("MI308X")
    cs = aiter_configs.load_config_set("head")
    rows = [r for r in cs.rows if r.cu_num == 80 and r.us and not r.tag]
    clean, _ = cost.lint_rows(rows, lambda r: capdb.product_peaks("MI308X"))
    fastest = min(r.us for r in clean)
    assert fastest == pytest.approx(23.5759)
    for layer in (TINY, SMALL):
        one, two, four = cost.predict(layer, caps, backend_family="aiter-ck", tokens=(1, 2, 4), rows=())
        fit = _fit_for(caps, layer)
        assert fit.pair == "a8w8"
        t_mem = cost.roofline_us(cost.Geometry.of_layer(layer), 1, capdb.product_peaks("MI308X"))[0]
        assert one.us == pytest.approx(fit.fixed_us + t_mem / fit.efficiency)
        assert one.us < two.us < four.us and fastest < four.us
        assert "floor" not in one.detail
    tiny = cost.predict(TINY, caps, backend_family="aiter-ck", tokens=1, rows=())[0]
    assert tiny.us < fastest


@pytest.mark.parametrize("target", TARGETS)
def test_decode_and_its_low_bar_are_at_or_above_the_hbm_roofline(target):
    """At every decode token count the prediction and its low bar are at or above the bytes at datasheet HBM."""
    caps = fake_capabilities(target)
    peaks = capdb.product_peaks(caps.product)
    for layer in (SMALL, DSV3, GPTOSS, ALL_EXPERTS):
        for c in cost.predict(layer, caps, backend_family="aiter-ck", tokens=(1, 2, 3, 4, 8, 16, 33, 64), rows=()):
            t_mem, t_cmp = cost.roofline_us(cost.Geometry.of_layer(layer), c.tokens, peaks)
            assert c.low >= max(t_mem, t_cmp) * (1 - 1e-9), (target, layer.hidden, c)


def test_mi325x_decode_is_credited_its_bandwidth():
    """MI325X shares MI300X's rows (cu_num 304) and fixed term, but its bytes move at 6.0 instead of 5.3 TB/s."""
    for layer in (SMALL, DSV3):
        fit = _fit_for(fake_capabilities("MI300X"), layer)
        a = cost.predict(layer, fake_capabilities("MI300X"), backend_family="aiter-ck", tokens=(1, 8, 64), rows=())
        b = cost.predict(layer, fake_capabilities("MI325X"), backend_family="aiter-ck", tokens=(1, 8, 64), rows=())
        for x, y in zip(a, b):
            assert y.us < x.us
            assert (y.us - fit.fixed_us) / (x.us - fit.fixed_us) == pytest.approx(5.3 / 6.0)


def test_decode_bars_are_the_decode_bands():
    """The decode answer carries the p10/p90 of its own leave-one-file-out residuals ([[band]] level decode)."""
    caps = fake_capabilities("MI355X")
    (c,) = cost.predict(DSV3, caps, backend_family="aiter-ck", tokens=16, rows=())
    low, high = cost.load_priors().bands[("decode", "gfx950", 256)]
    assert (c.low / c.us, c.high / c.us) == pytest.approx((low, high))
    assert low < 1 < high


def test_above_the_decode_range_the_priors_answer_and_never_dip():
    """Past max_tokens the bucket priors answer again, never below the decode fit at 64 tokens."""
    caps = fake_capabilities("MI308X")
    for layer in (SMALL, DSV3):
        at64, at65, at128 = cost.predict(layer, caps, backend_family="aiter-ck", tokens=(64, 65, 128), rows=())
        assert "decode latency" in at64.detail and "prior" in at128.detail
        assert at64.us <= at65.us <= at128.us


# -- priors data ----------------------------------------------------------------------------------------------------

@pytest.fixture
def serve_priors(monkeypatch):
    """serve_priors(mutate): the shipped priors document passed through mutate(doc), served to load_priors()."""
    real = capdb.load_toml.__wrapped__

    def serve(mutate):
        doc = copy.deepcopy(real("cost_priors.toml"))
        mutate(doc)
        monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == "cost_priors.toml" else real(name))
        cost.load_priors.cache_clear()

    yield serve
    cost.load_priors.cache_clear()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["decode"][0].update(efficiency=1.2), "efficiency must be <= 1"),
    (lambda d: d["decode"][0].pop("fixed_us"), "fixed_us"),
    (lambda d: d["decode"][0].update(max_tokens=0), "max_tokens"),
    (lambda d: d.pop("heuristic"), "[heuristic]"),
    (lambda d: d["heuristic"].update(low=0.8), "1 <= low <= factor <= high"),
    (lambda d: d["heuristic"].pop("source"), "source"),
])
def test_malformed_decode_or_heuristic_priors_raise(serve_priors, mutate, message):
    serve_priors(mutate)
    with pytest.raises(CapabilityDBError, match=re.escape(message)) as err:
        cost.predict(SMALL, fake_capabilities("MI355X"), backend_family="triton", tokens=1)
    assert "cost_priors.toml" in str(err.value)


def test_without_a_decode_fit_the_priors_answer(serve_priors):
    """A priors document without [[decode]] still predicts (bucket priors at small M), above the roofline."""
    serve_priors(lambda d: d.pop("decode"))
    caps = fake_capabilities("MI355X")
    (c,) = cost.predict(DSV3, caps, backend_family="aiter-ck", tokens=4, rows=())
    assert "bucket prior" in c.detail
    assert c.us >= cost.roofline_us(cost.Geometry.of_layer(DSV3), 4, capdb.product_peaks("MI355X"))[0]


def test_priors_schema_covers_decode_and_heuristic():
    """docs/schemas/cost_priors.schema.json accepts the shipped [[decode]] / [heuristic] and rejects broken ones."""
    import json

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "cost_priors.schema.json").read_text())
    doc = tomllib.loads((ROOT / "capability_db" / "cost_priors.toml").read_text())
    jsonschema.validate(doc, schema)
    for mutate in (lambda d: d["decode"][0].update(efficiency=1.5), lambda d: d["decode"][0].pop("max_tokens"),
                   lambda d: d["heuristic"].update(low=0.5), lambda d: d.pop("heuristic"),
                   lambda d: d.update(floor=[{"gfx": "gfx950", "cu": 0, "us": 14.6}])):
        broken = copy.deepcopy(doc)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


# -- the MI308X bandwidth fact, from the same rows ---------------------------------------------------------------------

def test_mi308x_measured_ceiling_is_what_its_tuned_decode_rows_imply():
    """gpus.toml's MI308X measured_hbm_tbps is the highest bandwidth a lint-clean cu-80 tuned row with at most 64
    tokens implies (bytes moved ÷ us), recomputed here; most such rows exceed the old 2.0 TB/s figure."""
    peak = capdb.product_peaks("MI308X")
    cs = aiter_configs.load_config_set("head")
    rows = [r for r in cs.rows if r.cu_num == 80 and r.gfx == "gfx942" and r.us and not r.tag and r.token <= 64]
    clean, _ = cost.lint_rows(rows, lambda r: peak)
    implied = [cost.Geometry.of_row(r).bytes_moved(r.token) / r.us / 1e6 for r in clean]
    assert len(implied) == 143
    assert peak["measured_hbm_tbps"] == round(max(implied), 3)
    assert sum(t > 2.0 for t in implied) == 126
    assert peak["measured_confidence"] == "derived"
    assert "ROCm/aiter@" + cs.commit in peak["measured_source"]
    assert peak["measured_hbm_tbps"] < peak["hbm_tbps"]


# -- the benchmark measures it ----------------------------------------------------------------------------------------

def test_benchmark_reports_the_decode_figures():
    """The benchmark's JSON keeps its keys and adds the decode figures measured in the same run: the LOFO decode
    slope follows the rows' (every pair rising), decode is never under the roofline, the MI308X ceiling is the
    bandwidth its rows imply, and the per-basis coverage of the bars is reported."""
    import json

    out = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, check=True, timeout=300)
    bench = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("in_shape_median", "lofo_median", "lofo_p90", "naive_roofline_median", "bucket_prior_lofo_median",
                "lofo_median_by_target", "rows", "clean_rows", "snapshot", "seconds", "machine"):
        assert key in bench
    slope = bench["decode_slope"]
    assert slope["rises"] == 1.0 and slope["n"] > 500
    assert abs(slope["pred_median"] / slope["truth_median"] - 1) < 0.1
    ratio = bench["decode_roofline_ratio"]
    assert all(r["min"] >= 1 and r["low_min"] >= 1 for r in ratio.values())
    assert bench["decode_lofo_median"] < bench["lofo_median"]
    mi308x = bench["decode_implied_tbps"]["gfx942/80"]
    assert mi308x["max"] == mi308x["measured_ceiling"] == capdb.product_peaks("MI308X")["measured_hbm_tbps"]
    assert mi308x["above_ceiling"] == 0
    cover = bench["coverage"]
    assert set(cover) == {"tuned", "interpolated", "roofline", "heuristic"} and 0 < cover["heuristic"] <= 1
    assert 0.7 <= cover["roofline"] <= 0.9 and 0.7 <= cover["interpolated"] <= 0.9
    assert 0 < cover["tuned"] < 1 and bench["coverage_n"]["tuned"] > 100
    # The per-pair fixed terms leave no gfx950 pair with >= 12 decode rows off by more than 10% in its median
    # (with one shared term: a8w8 at M <= 4 1.15, a16w4 1.27, a8w4 0.89 truth/prediction).
    for key, v in bench["decode_lofo_by_pair"].items():
        if key.startswith("gfx950/256") and not key.split()[1] == "a16w16" and v["n"] >= 12:
            assert 0.9 <= v["truth_over_pred"] <= 1.15, key
    assert math.isclose(bench["decode_fit"]["gfx950/256"]["fixed_us"],
                        cost.load_priors().decode[("gfx950", 256)].fixed_us, abs_tol=0.01)
