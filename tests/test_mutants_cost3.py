"""Rules of the cost model that a sampled mutation run found under-tested: heuristic dispatch entries by their token
span (cost/model.py _heuristic_entry), a plain-callable cost plugin (_plugin_costs), the tuned-shape lookup for
unhashable stand-ins (_shape_rows), the 1/u weighting of the decode fixed term (fit_decode_fixed), the activation
dtype in the copied-timing lint's shape (cost/lint.py), whose-µs labels (cost/release.py) and the repository path of
an index row (cost/drift.py). Each test pins one rule on a real model, target and release."""

from __future__ import annotations

import dataclasses
import types

import pytest

from moedispatch.cost import drift, release
from moedispatch.cost import model as cost
from moedispatch.cost.lint import lint_rows
from moedispatch.data import aiter_configs, aiter_index, capdb
from moedispatch.testing import fake_capabilities

from test_cost import FP4, MINIMAX_TP4, _rows
from test_cost_heuristic import UNTUNED, UNTUNED_PAD

A20 = "0.1.20.post1"
TAG = "v" + A20
FP8 = "torch.float8_e4m3fn"
BF16 = "torch.bfloat16"


@pytest.fixture(scope="module")
def mi355x():
    return fake_capabilities("MI355X", A20)


# -- model.py _heuristic_entry: a dispatch entry covers every token count of its span [lo, hi] ------------------------

@pytest.mark.parametrize("entry", [
    {"tokens": [17, 64], "bucket": 64, "basis": "heuristic", "config": None},
    types.SimpleNamespace(tokens=(17, 64), basis="heuristic"),
])
def test_a_heuristic_entry_covers_its_whole_token_span(entry):
    """AITER runs untuned kernels for every M in the entry's [lo, hi] (both ends included), none outside."""
    inside = [m for m in range(1, 100) if cost._heuristic_entry(entry, m)]
    assert inside == list(range(17, 65))


def test_a_one_token_heuristic_entry_covers_that_token():
    """A span naming one token count ([8]) is lo = hi = 8."""
    entry = {"tokens": [8], "basis": "heuristic"}
    assert [m for m in (7, 8, 9) if cost._heuristic_entry(entry, m)] == [8]


def test_heuristic_entries_band_every_token_count_inside_their_span(mi355x):
    """Through predict: a token count strictly inside an entry's span (32 in [17, 64]) gets the [heuristic] band,
    exactly like its upper end (64)."""
    band = cost.load_priors().heuristic
    entries = [{"tokens": [1, 16], "bucket": 16, "basis": "tuned", "config": None},
               {"tokens": [17, 64], "bucket": 64, "basis": "heuristic", "config": None}]
    tokens = (8, 32, 64)
    marked = cost.predict(UNTUNED, mi355x, backend_family="aiter-ck", padding=UNTUNED_PAD, tokens=tokens,
                          dispatch=entries)
    plain = cost.predict(UNTUNED, mi355x, backend_family="aiter-ck", padding=UNTUNED_PAD, tokens=tokens, rows=())
    assert marked[0] == plain[0]
    for m, p in zip(marked[1:], plain[1:]):
        assert m.us == pytest.approx(p.us * band["factor"]) and "heuristic" in m.detail


# -- model.py _plugin_costs: a plain callable is called with the token counts ---------------------------------------

def test_a_plain_callable_cost_plugin_gets_the_token_counts(mi355x):
    """pm may be a callable with the hook's keyword arguments: it is asked for exactly the token counts predicted,
    and its answer (dicts) is the prediction, basis plugin, with the backend named in the detail."""
    asked = []

    def moe_cost(*, backend, layer, caps, tokens):
        asked.append(tuple(tokens))
        return [{"tokens": t, "us": 10.0 * t, "low": 9.0 * t, "high": 12.0 * t} for t in tokens]

    costs = cost.predict(UNTUNED, mi355x, backend_family="acme-moe", tokens=(1, 64), pm=moe_cost)
    assert asked == [(1, 64)]
    assert [(c.tokens, c.us, c.low, c.high, c.basis) for c in costs] == [
        (1, 10.0, 9.0, 12.0, "plugin"), (64, 640.0, 576.0, 768.0, "plugin")]
    assert all(c.detail == "declared by acme-moe's plugin" for c in costs)


# -- model.py _shape_rows: an unhashable key is looked up uncached, with the same arguments --------------------------

def test_shape_rows_of_an_unhashable_key_are_the_keys_rows(mi355x):
    """A stand-in key that cannot be hashed (SimpleNamespace) finds exactly the rows the real DispatchKey finds:
    per activation dtype asked (MiniMax-M3 TP4: FP4 rows from minimax_m3_fp4_tuned_fmoe.csv, none for BF16 although
    16 rows of the same dims have other activations), exact act_type."""
    plan = cost._plan(MINIMAX_TP4, mi355x, None, (1, 4096))
    stand_in = types.SimpleNamespace(**dataclasses.asdict(plan.key))
    with pytest.raises(TypeError):
        hash(stand_in)
    fp4 = cost._shape_rows(stand_in, mi355x, FP4)
    assert fp4 == cost._shape_rows(plan.key, mi355x, FP4)
    assert {r.token for r in fp4} == {r.token for r in _rows(MINIMAX_TP4, mi355x)} and len(fp4) == 16
    assert {(r.q_dtype_a, r.act_type) for r in fp4} == {(FP4, plan.key.act_type)}
    assert cost._shape_rows(stand_in, mi355x, BF16) == ()


# -- model.py fit_decode_fixed: a weighted median of u - t/e with weights 1/u ----------------------------------------

def _relative_deviation(a, points, e):
    return sum(abs((a + t / e) / u - 1) for t, u in points)


def test_decode_fixed_term_is_the_1_over_u_weighted_median():
    """Least relative deviations: sum |a - (u - t/e)| / u. With e = 0.5 the candidates u - t/e are 10 (u=20), 20
    (u=40) and 80 (u=100); weights 1/u = .05, .025, .01 put half the weight on 10. An unweighted median would be 20,
    a u-weighted one 80."""
    points = [(10.0, 40.0), (5.0, 20.0), (10.0, 100.0)]
    a = cost.fit_decode_fixed(points, 0.5)
    assert a == pytest.approx(10.0)
    best = min(_relative_deviation(x / 10, points, 0.5) for x in range(0, 1001))
    assert _relative_deviation(a, points, 0.5) == pytest.approx(best)
    assert _relative_deviation(a, points, 0.5) < _relative_deviation(20.0, points, 0.5)


def test_decode_fixed_term_takes_the_lower_candidate_on_a_weight_tie():
    """Two pairs of equal u (equal weight): every a between their candidates 20 and 30 fits equally well; the lower
    one is taken."""
    points = [(5.0, 40.0), (10.0, 40.0)]
    assert _relative_deviation(20.0, points, 0.5) == pytest.approx(_relative_deviation(30.0, points, 0.5))
    assert cost.fit_decode_fixed(points, 0.5) == 20.0


# -- lint.py _shape_key: the activation dtype is part of the shape --------------------------------------------------

def test_equal_timings_of_two_activation_dtypes_are_not_a_copy(mi355x):
    """One CSV tuning the same dims for MXFP4 and MXFP8 activations holds two shapes: an equal µs across them is not a
    timing copied across token buckets; within one activation dtype it is."""
    peaks = capdb.product_peaks("MI355X")
    fp4 = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}[256]
    fp8 = fp4._replace(q_dtype_a=FP8, token=512, line=fp4.line + 40)   # MXFP8 x FP4, as kimik2_fp8fp4 tunes
    clean, rejected = lint_rows([fp4, fp8], lambda r: peaks)
    assert (clean, rejected) == ([fp4, fp8], [])
    copied = fp4._replace(token=512)
    clean, rejected = lint_rows([fp4, copied], lambda r: peaks)
    assert clean == [] and all("copied across token buckets" in why for _r, why in rejected)


# -- release.py context_of: whose µs the rows are -----------------------------------------------------------------

def test_release_context_labels_name_whose_rows_they_are(mi355x):
    """A release of the index: "AITER <tag> (<commit[:10]>)"; installed / explicit files: the set's own label, or
    "the tuned rows given" when it has none; describe() says "µs of <label>"."""
    cs = aiter_configs.config_set_for(mi355x)
    rel = aiter_index.release(cs.release)
    ctx = release.context_of(cs)
    assert (ctx.release, ctx.label, ctx.relation) == (TAG, f"AITER {TAG} ({rel.commit[:10]})", "exact")
    assert ctx.describe() == f"µs of AITER {TAG} ({rel.commit[:10]})"
    installed = dataclasses.replace(cs, origin="installed", release=None, label="installed AITER 0.1.20 (/opt/aiter)")
    ctx = release.context_of(installed)
    assert (ctx.release, ctx.label, ctx.relation) == (None, "installed AITER 0.1.20 (/opt/aiter)", "exact")
    ctx = release.context_of(dataclasses.replace(installed, label=""))
    assert (ctx.label, ctx.describe()) == ("the tuned rows given", "µs of the tuned rows given")


# -- drift.py release_rows: an index row's path is what follows "ROCm/aiter@<ref>:" --------------------------------

def test_index_row_paths_are_everything_after_the_ref(monkeypatch):
    """Index rows are filed as ROCm/aiter@<ref>:<path>; the path kept (what the reverted list and the citations
    match) is everything after the first colon, a colon inside the path included."""
    tag = TAG
    load = aiter_configs.load_config_set
    real = load(tag)
    mine = [r for r in real.rows if r.file.endswith("minimax_m3_fp4_tuned_fmoe.csv") and r.cu_num == 256]
    assert mine and all(r.file.count(":") == 1 for r in mine)
    ref = mine[0].file.split(":")[0]
    odd = "aiter/configs/model_configs/minimax:m3_fp4_tuned_fmoe.csv"
    rows = tuple(r._replace(file=f"{ref}:{odd}") for r in mine)
    one = aiter_index.release(tag)
    monkeypatch.setattr(drift.aiter_index, "releases", lambda: [one])
    monkeypatch.setattr(drift.aiter_configs, "load_config_set",
                        lambda name: dataclasses.replace(real, rows=rows) if name == tag else None)
    ((got_tag, _commit, keyed),) = drift.release_rows(None, {("gfx950", 256): "MI355X"})
    assert got_tag == tag and keyed
    assert {r.file for r in keyed.values()} == {odd}
    # the bundled rows themselves: the path after the ref
    monkeypatch.setattr(drift.aiter_configs, "load_config_set", load)
    ((_t, _c, keyed),) = drift.release_rows(None, {("gfx950", 256): "MI355X"})
    assert {r.file for r in keyed.values() if "minimax_m3_fp4" in r.file} == {
        "aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv"}
