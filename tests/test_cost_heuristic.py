"""The heuristic band (moedispatch.cost.model, issue 26 item 2): where the AITER dispatch model marks a token count
heuristic (DispatchStep.basis != "tuned": no tuned row, AITER runs its default kernels), the prediction — made at
tuned-kernel speed on every basis — is multiplied by a sourced factor band (derived from the published same-shape
untuned-vs-tuned A/Bs in capability_db/cost_heuristic_evidence.toml, tests/test_cost_heuristic_evidence.py), so the
cost ranking no longer prefers an untuned path over a tuned one on the strength of tuned-speed arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.core.backend import Padding
from moedispatch.core.costs import Cost
from moedispatch.core.layers import MoELayer
from moedispatch.cost import heuristic
from moedispatch.cost import model as cost
from moedispatch.data import capdb
from moedispatch.testing import fake_capabilities

# MiniMax-M3 MXFP4 at TP8, 384/rank padded to 512: no tuned row, so AITER runs heuristics at every token count.
UNTUNED = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="mxfp4",
                         activation="swigluoai_uninterleave")
UNTUNED_PAD = Padding.aligned(UNTUNED, intermediate_multiple=256)
# The TP4 shape AITER tuned (minimax_m3_fp4_tuned_fmoe.csv): tuned from 256 tokens, heuristic below.
TUNED = MoELayer.build(hidden=6144, intermediate=3072, experts=129, top_k=5, tp=4, weight="mxfp4", act="mxfp4",
                       activation="swigluoai_uninterleave")
TOKENS = (1, 8, 64, 4096)


@pytest.fixture(scope="module")
def mi355x():
    return fake_capabilities("MI355X", "0.1.20.post1")


@pytest.fixture(scope="module")
def band():
    return cost.load_priors().heuristic


def _as_tuned(plan):
    """The same plan with every step marked tuned (no rows exist for it: the prediction is the plain roofline)."""
    return dataclasses.replace(plan, steps=tuple(dataclasses.replace(s, basis="tuned") for s in plan.steps))


def test_the_band_is_sourced_and_never_makes_a_call_faster(band):
    """[heuristic] in the priors is what the evidence derives (x1.17 within 1.0–1.32), naming every thread."""
    assert 1.0 <= band["low"] <= band["factor"] <= band["high"]
    assert dict(band) == heuristic.band(heuristic.load_evidence())
    assert (band["factor"], band["low"], band["high"]) == (1.1695, 1.0, 1.3179)
    for thread in ("https://github.com/sgl-project/sglang/pull/37072", "https://github.com/ROCm/aiter/pull/1528",
                   "https://github.com/ROCm/aiter/pull/5144", "https://github.com/ROCm/ATOM/pull/2200"):
        assert thread in band["source"]


def test_a_heuristic_step_is_priced_with_the_band(mi355x, band):
    """Every token count of the untuned layer: us × factor, low × low (never under the roofline), high × high,
    and the detail says why, with the sources; the basis still says how the tuned-speed figure was made."""
    plan = aiter_dispatch.plan_dispatch(UNTUNED, mi355x, tokens=TOKENS, env={}, padding=UNTUNED_PAD)
    assert all(s.basis != "tuned" for s in plan.steps)
    heur = cost.predict(UNTUNED, mi355x, backend_family="aiter-flydsl", padding=UNTUNED_PAD, tokens=TOKENS,
                        dispatch=plan)
    plain = cost.predict(UNTUNED, mi355x, backend_family="aiter-flydsl", padding=UNTUNED_PAD, tokens=TOKENS,
                         dispatch=_as_tuned(plan))
    peaks = capdb.product_peaks("MI355X")
    for h, p in zip(heur, plain):
        assert h.basis == p.basis == "roofline"
        assert h.us == pytest.approx(p.us * band["factor"])
        assert h.low == pytest.approx(p.low * band["low"]) and h.high == pytest.approx(p.high * band["high"])
        assert "untuned (heuristic) kernels" in h.detail and "cost_heuristic_evidence.toml" in h.detail
        assert "heuristic" not in p.detail
        geo = cost._key_geometry(UNTUNED, UNTUNED_PAD, plan.key)
        assert h.low >= max(cost.roofline_us(geo, h.tokens, peaks)) * (1 - 1e-9)


def test_only_the_heuristic_token_counts_get_the_band(mi355x, band):
    """MiniMax-M3 TP4: the tuned rows from 256 tokens are the prediction as they are; below, where AITER runs
    heuristics (bf16 activations, no row), the band applies."""
    tokens = (1, 64, 256, 4096)
    plan = aiter_dispatch.plan_dispatch(TUNED, mi355x, tokens=tokens, env={})
    basis = {m: next(s.basis for s in plan.steps if s.tokens[0] <= m <= s.tokens[1]) for m in tokens}
    assert basis == {1: "heuristic", 64: "heuristic", 256: "tuned", 4096: "tuned"}
    costs = cost.predict(TUNED, mi355x, backend_family="aiter-flydsl", tokens=tokens, dispatch=plan)
    plain = cost.predict(TUNED, mi355x, backend_family="aiter-flydsl", tokens=tokens, dispatch=_as_tuned(plan))
    for c, p in zip(costs, plain):
        if basis[c.tokens] == "tuned":
            assert c == p and c.basis == "tuned" and "heuristic" not in c.detail
        else:
            assert c.us == pytest.approx(p.us * band["factor"])


def test_dispatch_entries_marked_heuristic_get_the_band(mi355x, band):
    """Entries passed as dispatch (objects or dicts with basis and tokens) mark heuristic token counts too."""
    tokens = (8, 64)
    entries = [{"tokens": [1, 16], "bucket": 16, "basis": "heuristic", "config": None},
               {"tokens": [17, 64], "bucket": 64, "basis": "tuned", "config": None}]
    marked = cost.predict(UNTUNED, mi355x, backend_family="aiter-ck", padding=UNTUNED_PAD, tokens=tokens,
                          dispatch=entries)
    plain = cost.predict(UNTUNED, mi355x, backend_family="aiter-ck", padding=UNTUNED_PAD, tokens=tokens, rows=())
    assert marked[0].us == pytest.approx(plain[0].us * band["factor"])
    assert marked[1] == plain[1]


def test_non_aiter_backends_are_not_priced_as_aiter_heuristics(mi355x):
    """Triton's own factor band is its whole story: AITER's dispatch says nothing about Triton's kernels."""
    plan = aiter_dispatch.plan_dispatch(UNTUNED, mi355x, tokens=TOKENS, env={}, padding=UNTUNED_PAD)
    with_plan = cost.predict(UNTUNED, mi355x, backend_family="triton", padding=UNTUNED_PAD, tokens=TOKENS,
                             dispatch=plan)
    without = cost.predict(UNTUNED, mi355x, backend_family="triton", padding=UNTUNED_PAD, tokens=TOKENS)
    assert with_plan == without and all("heuristic" not in c.detail for c in with_plan)


def test_the_ranking_no_longer_prefers_an_untuned_path_on_tuned_speed(mi355x):
    """A tuned path measured 1.45× the untuned path's tuned-speed prediction: without the band the untuned path's
    bars sit wholly below and the ranking puts it first; priced as the heuristic it runs, the bars overlap and the
    preference (the tuned path) decides."""
    plan = aiter_dispatch.plan_dispatch(UNTUNED, mi355x, tokens=(8,), env={}, padding=UNTUNED_PAD)
    (heur,) = cost.predict(UNTUNED, mi355x, backend_family="aiter-flydsl", padding=UNTUNED_PAD, tokens=8,
                           dispatch=plan)
    (plain,) = cost.predict(UNTUNED, mi355x, backend_family="aiter-flydsl", padding=UNTUNED_PAD, tokens=8,
                            dispatch=_as_tuned(plan))
    lo, hi = cost.load_priors().tuned
    us = plain.us * 1.45
    tuned = (Cost(8, us, us * lo, us * hi, "tuned", "a tuned row"),)
    assert cost.compare((plain,), tuned) == "faster"            # the bias: tuned-speed arithmetic for both
    assert [n for n, _ in cost.rank([("tuned-path", 60, tuned), ("untuned-path", 50, (plain,))])] == \
        ["untuned-path", "tuned-path"]
    assert cost.compare((heur,), tuned) == "tie"
    assert cost.rank([("tuned-path", 60, tuned), ("untuned-path", 50, (heur,))]) == \
        [("tuned-path", None), ("untuned-path", None)]
    # A heuristic path that is faster even at its worst still wins on cost.
    fast = (Cost(8, heur.us / 4, heur.low / 4, heur.high / 4, heur.basis, heur.detail),)
    assert cost.rank([("tuned-path", 60, tuned), ("untuned-path", 50, fast)])[0][0] == "untuned-path"
