"""Rules of the cost model that survived the seed-14 mutation run: a fused shared expert keeps the layer's block
scaling (cost/model.py _key_geometry), what logger a failing cost plugin warns on (_plugin_costs), whose decode fit
and which product the decode detail names (_roofline_cost), the message for a target without peak figures, a
dispatch entry whose ``config`` is a row mapping (_rows_from_dispatch), when the decode fit's iteration stops
(fit_decode), a layer object without ``kind`` (predict), the lint-rejected rows a roofline prediction lists
(predict_one), the message of a band without its keys and the row counts of the [[decode]] fits (cost/priors.py),
and the label of head's rows for an AITER newer than the index (cost/release.py context_of). Each test pins one
rule on a real model, target and release."""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import types

import pytest

from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.core.errors import CapabilityDBError, UsageError
from moedispatch.cost import model as cost
from moedispatch.cost.priors import parse_priors
from moedispatch.data import aiter_index, capdb
from moedispatch.sources import models
from moedispatch.testing import fake_capabilities

from test_cost import MINIMAX_TP4, _rows
from test_mutants_s13_cost import A20, mi355x  # noqa: F401 (mi355x: the shared MI355X fixture)

DS_V3 = "a8w8_blockscale_tuned_fmoe_ds_v3.csv"


@pytest.fixture(scope="module")
def dsv3():
    """DeepSeek-V3's MoE layer at TP8 (capability_db/models/DeepSeek-V3.json): FP8 weights in 128x128 blocks, one
    shared expert."""
    layer = next(lay for lay in models.expand_layers(models.load_model("DeepSeek-V3"), 8, 1) if lay.kind == "moe")
    assert cost.Geometry.of_layer(layer).block_scale is True
    return layer


@pytest.fixture
def shipped():
    return copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))


# -- model.py _key_geometry: a fused shared expert adds an expert, not a weight format ------------------------------

def test_a_fused_shared_expert_keeps_the_layers_block_scaling(mi355x, dsv3):
    """DeepSeek-V3 FP8 with the shared expert fused (AITER's 257-expert / top-9 key of
    a8w8_blockscale_tuned_fmoe_ds_v3.csv) is still block-scaled: the key's geometry is the layer's plus the
    always-selected expert. At 2048 tokens (no clean row there) the prediction is the 512-token row scaled by the
    priors' ratio, and the bucket_large prior at 2048 sees block_scale = 1."""
    plan = aiter_dispatch.plan_dispatch(dsv3, mi355x, tokens=(512, 2048), env={},
                                        assumptions=aiter_dispatch.Assumptions(fused_shared_expert=True))
    assert (plan.key.expert, plan.key.topk, plan.key.q_type) == (257, 9, "QuantType.per_1x128")
    geo = dataclasses.replace(cost.Geometry.of_layer(dsv3), experts=257, experts_total=257, top_k=9, shared=1)
    assert cost._key_geometry(dsv3, None, plan.key) == geo
    tuned, big = cost.predict(dsv3, mi355x, backend_family="aiter-ck", tokens=(512, 2048), dispatch=plan)
    assert tuned.basis == "tuned" and tuned.detail.startswith(f"tuned row ROCm/aiter@v{A20}:") and DS_V3 in tuned.detail
    assert big.detail.startswith("roofline with bucket_large prior gfx950/256/2048 (fit against MI355X peaks); "
                                 "scaled from the tuned row at 512 tokens")
    priors, peaks = cost.load_priors(), capdb.product_peaks("MI355X")
    ratio = (cost._roofline_cost(geo, 2048, mi355x, priors, peaks, 0.0)[0]
             / cost._roofline_cost(geo, 512, mi355x, priors, peaks, 0.0)[0])
    assert big.us == pytest.approx(tuned.us * ratio, rel=1e-12)


# -- model.py _plugin_costs: the plugin warning is moedispatch's, under the cost model's logger ----------------------

def test_a_failing_cost_plugin_warns_on_the_cost_models_logger(mi355x, caplog):
    """The warning of a plugin that raises is a record of logger moedispatch.cost.model (under the library's
    ``moedispatch`` logger a host configures), never of the root logger."""

    def moe_cost(*, backend, layer, caps, tokens):
        raise RuntimeError("no table for 6144")

    with caplog.at_level(logging.WARNING, logger="moedispatch"):
        (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="acme-moe", tokens=2, pm=moe_cost)
    assert c.basis == "roofline"
    assert [r.name for r in caplog.records if getattr(r, "structlog_event", {}).get("event") == "plugin_cost_failed"] \
        == ["moedispatch.cost.model"]


# -- model.py _roofline_cost / priors.py _parse_decode: the decode detail names the (gfx, CU count) fit -------------

def _decode_entry(doc, gfx, cu, pair=""):
    (entry,) = [d for d in doc["decode"] if (d["gfx"], d["cu"], d.get("pair", "")) == (gfx, cu, pair)]
    return entry


def test_the_decode_detail_names_the_cu_counts_own_fit_and_its_row_counts(dsv3, shipped):
    """DeepSeek-V3 FP8 (a8w8) decoding one token on MI300X (gfx942, 304 CUs): the gfx942/304 [[decode]] fit answers
    — not the arch-wide gfx942/0 one — with the a8w8 pair's own fixed term; the detail states both fits' values and
    the number of clean tuned rows (``n``) each was fit on, as capability_db/cost_priors.toml records them."""
    own, pair = _decode_entry(shipped, "gfx942", 304), _decode_entry(shipped, "gfx942", 304, "a8w8")
    arch = _decode_entry(shipped, "gfx942", 0, "a8w8")
    assert (pair["fixed_us"], pair["n"]) != (arch["fixed_us"], arch["n"])
    peaks = capdb.product_peaks("MI300X")
    (c,) = cost.predict(dsv3, fake_capabilities("MI300X"), backend_family="aiter-ck", tokens=1, rows=())
    assert c.detail == (
        f"decode latency plus bytes gfx942/304: {pair['fixed_us']:.1f} µs (a8w8's own, fit on its {pair['n']} clean "
        f"tuned rows) + bytes at {own['efficiency']:.0%} of MI300X's {float(peaks['hbm_tbps']):g} TB/s HBM (fit on "
        f"{own['n']} clean tuned rows with <= {own['max_tokens']} tokens)")
    t_mem = cost.roofline_us(cost.Geometry.of_layer(dsv3), 1, peaks)[0]
    assert c.us == pytest.approx(pair["fixed_us"] + t_mem / own["efficiency"], rel=1e-12)


# -- model.py _roofline_cost: a target that names no product -----------------------------------------------------

def test_a_target_without_a_product_is_named_target_in_the_decode_detail():
    """A duck-typed target with only gfx950 and 256 CUs (no ``product`` attribute) gets the peaks of gfx950's
    256-CU product (MI355X) and MI355X's roofline prediction of MiniMax-M3 TP4 at one token; the decode detail calls
    the product "target"."""
    bare = types.SimpleNamespace(gfx="gfx950", compute_units=256)
    (c,) = cost.predict(MINIMAX_TP4, bare, backend_family="aiter-ck", tokens=1, rows=())
    (named,) = cost.predict(MINIMAX_TP4, fake_capabilities("MI355X"), backend_family="aiter-ck", tokens=1, rows=())
    assert "of MI355X's 8 TB/s HBM" in named.detail
    assert (c.us, c.low, c.high, c.basis) == (named.us, named.low, named.high, named.basis)
    assert c.detail == named.detail.replace("of MI355X's 8 TB/s HBM", "of target's 8 TB/s HBM")


def test_the_roofline_without_peaks_names_the_arch_and_product():
    """MI250X (gfx90a) has no [peak.*] table: predict answers () before the roofline; the roofline itself, asked
    without peaks, names the target by its arch label."""
    mi250x = fake_capabilities("MI250X")
    assert cost.predict(MINIMAX_TP4, mi250x, backend_family="triton", tokens=64) == ()
    with pytest.raises(UsageError, match=re.escape(
            "no peak throughput known for gfx90a (MI250X): add a [peak.<product>] table to capability_db/gpus.toml")):
        cost._roofline_cost(cost.Geometry.of_layer(MINIMAX_TP4), 64, mi250x, cost.load_priors(), None, 0.0)


# -- model.py _rows_from_dispatch: a ``config`` given as a row mapping -------------------------------------------

def test_a_dispatch_entry_whose_config_is_a_row_mapping_lends_that_row(mi355x):
    """A dispatch entry's ``config`` may be the tuned row itself (a mapping with its columns, ``us`` among them, and
    its ``where``): MiniMax-M3 TP4's 256-token row of minimax_m3_fp4_tuned_fmoe.csv as a dict is the prediction at
    256 tokens."""
    row = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}[256]
    config = {**row._asdict(), "where": row.where}
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256,
                        dispatch=[{"tokens": [129, 256], "basis": "tuned", "config": config}])
    assert (c.basis, c.us) == ("tuned", row.us) and c.detail.startswith(f"tuned row {row.where}")



def test_a_row_mapping_without_where_is_named_once(mi355x):
    """A config mapping without ``where`` (a caller's own row): the detail says "tuned row" once — it said "tuned row
    tuned row"."""
    rows = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}
    entry = lambda t, lo: {"tokens": [lo, t], "basis": "tuned", "config": {**rows[t]._asdict(), "where": ""}}  # noqa: E731
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256, dispatch=[entry(256, 129)])
    assert c.detail.startswith("tuned row;") or c.detail == "tuned row", c.detail
    assert "tuned row tuned row" not in c.detail


# -- model.py fit_decode: iterate until fixed_us moves by at most 1e-8 -------------------------------------------

def test_the_decode_fit_iterates_until_the_fixed_term_moves_by_at_most_1e_8():
    """Convergence is judged per coefficient, relative to max(1, |value|): a fixed term below 1 µs (0.77 here) must
    move by at most 1e-8 µs between steps. On these points the 6th step still moves it by more than that, so the fit
    takes a 7th step and returns that one."""
    points = [(4, 5.84), (16, 20.02), (26, 33.7), (32, 44.03)]
    five, six, seven = (cost.fit_decode(points, iterations=k) for k in (5, 6, 7))
    assert 0 < six[0] < 1 and 1e-8 < abs(six[0] - five[0]) <= 2e-8
    assert abs(seven[0] - six[0]) <= 1e-8
    assert cost.fit_decode(points) == seven != six


# -- model.py predict: a layer object without ``kind`` is a MoE layer --------------------------------------------

class _NoKind:
    """A layer object from another library: MoELayer's attributes, without ``kind``."""

    def __init__(self, layer):
        self._layer = layer

    def __getattr__(self, name):
        if name == "kind":
            raise AttributeError(name)
        return getattr(self._layer, name)


def test_a_layer_without_a_kind_is_priced_as_a_moe_layer(mi355x):
    """predict prices any layer that does not say it is dense: MiniMax-M3 TP4 without ``kind`` gets the prediction
    of the MoELayer."""
    layer = _NoKind(MINIMAX_TP4)
    assert not hasattr(layer, "kind")
    got = cost.predict(layer, mi355x, backend_family="aiter-ck", tokens=(1, 4096), rows=())
    assert got == cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=(1, 4096), rows=())


# -- model.py predict_one: the rows the lint rejected are listed, "; "-separated ---------------------------------

def test_a_roofline_prediction_lists_the_first_three_rejected_rows(mi355x, dsv3):
    """DeepSeek-V3 FP8 with the fused shared expert at 2048 tokens on MI355X: ds_v3.csv's 1-, 2- and 4-token rows
    share 77.4907 µs (a timing copied across token buckets) and are not used; the detail lists the first three,
    each "file:line: why", separated by "; "."""
    plan = aiter_dispatch.plan_dispatch(dsv3, mi355x, tokens=(2048,), env={},
                                        assumptions=aiter_dispatch.Assumptions(fused_shared_expert=True))
    (c,) = cost.predict(dsv3, mi355x, backend_family="aiter-ck", tokens=2048, dispatch=plan)
    where = f"ROCm/aiter@v{A20}:aiter/configs/model_configs/{DS_V3}"
    assert c.basis == "roofline"
    assert c.detail.endswith("; tuned rows not used: " + "; ".join(
        f"{where}:{line}: us=77.4907 is copied across token buckets of this shape" for line in (352, 353, 354)))


# -- priors.py _band: a band without low or high names the key -----------------------------------------------------

def test_a_band_without_its_high_names_the_entry_and_the_key(shipped):
    """A [[band]] entry lacking high: "cost_priors.toml: band[0] lacks key 'high'"."""
    shipped["band"][0].pop("high")
    with pytest.raises(CapabilityDBError, match=re.escape("capability_db/cost_priors.toml: band[0] lacks key 'high'")):
        parse_priors(shipped)


# -- release.py context_of: head's rows for an AITER newer than the index ----------------------------------------

def test_a_newer_aiter_is_told_the_rows_are_heads_commit(mi355x):
    """AITER 0.1.21 is newer than every release of the index: MiniMax-M3 TP4 at 4096 tokens is head's tuned row, and
    the detail says whose µs they are — "AITER main @ <commit> (<date>)" — and that the bars are widened."""
    newer = fake_capabilities("MI355X", "0.1.21")
    head = aiter_index.release("head")
    row = {r.token: r for r in _rows(MINIMAX_TP4, newer)}[4096]
    (c,) = cost.predict(MINIMAX_TP4, newer, backend_family="aiter-ck", tokens=4096)
    assert c.detail == (f"tuned row {row.where}; µs of AITER main @ {head.commit[:10]} ({head.date}); planned for a "
                        "newer AITER (0.1.21): bars widened to AITER's re-tuning spread across releases "
                        "(capability_db/cost_release_drift.toml)")
