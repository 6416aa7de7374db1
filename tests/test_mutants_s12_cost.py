"""Rules of the cost model that survived a mutation run: the roofline lint of a release's index rows
(cost/drift.py release_rows), an unquantized layer's geometry (cost/geometry.py Geometry.of_layer), the uncached plan
for unhashable targets (cost/model.py _plan), what a cost plugin is given and what its failure logs (_plugin_costs),
the CU count of the arch-wide prior (_prior_us), dispatch steps that do not name their activation dtype
(_tuned_shapes), the decode fit's solve and reweighting (fit_decode), the bars of a prediction anchored on the
nearest tuned row (predict_one) and the messages of broken [[decode]] / [[model]] priors (cost/priors.py). Each test
pins one rule on a real model, target and release."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
import types

import pytest

from moedispatch.core.errors import CapabilityDBError
from moedispatch.core.layers import MoELayer
from moedispatch.cost import drift
from moedispatch.cost import model as cost
from moedispatch.cost.priors import parse_priors
from moedispatch.data import aiter_configs, aiter_index, capdb
from moedispatch.testing import fake_capabilities

from test_cost import MINIMAX_TP4, _rows

A20 = "0.1.20.post1"
TAG = "v" + A20
BF16 = "torch.bfloat16"
#: Qwen3-235B BF16 at TP4: qwen3_235b_bf16_tuned_fmoe.csv tunes 4096 x 384, 128 experts, top-8 on MI355X.
QWEN3_BF16_TP4 = MoELayer.build(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=4, weight="bf16",
                                act="bf16")
DSV3_FP8 = MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8")


@pytest.fixture(scope="module")
def mi355x():
    return fake_capabilities("MI355X", A20)


# -- drift.py release_rows: a release's rows are lint-clean against the target's datasheet peaks ---------------------

def test_release_rows_drop_a_row_faster_than_the_datasheet_roofline(monkeypatch):
    """The rows a release is measured with pass the cost lint at the reference product's peaks: a MiniMax-M3 FP4 row
    claiming 0.5 µs at 256 tokens (far below the MI355X roofline for the weights it must read) is not kept; its
    neighbours are."""
    load = aiter_configs.load_config_set
    real = load(TAG)
    mine = [r for r in real.rows if r.file.endswith("minimax_m3_fp4_tuned_fmoe.csv") and r.cu_num == 256]
    assert {r.token for r in mine} >= {128, 256, 512}
    fast = [r._replace(us=0.5) if r.token == 256 else r for r in mine]
    one = aiter_index.release(TAG)
    monkeypatch.setattr(drift.aiter_index, "releases", lambda: [one])
    monkeypatch.setattr(drift.aiter_configs, "load_config_set",
                        lambda name: dataclasses.replace(real, rows=tuple(fast)) if name == TAG else None)
    ((got_tag, _commit, keyed),) = drift.release_rows(None, {("gfx950", 256): "MI355X"})
    assert got_tag == TAG
    tokens = sorted(r.token for r in keyed.values())
    assert 256 not in tokens and {128, 512} <= set(tokens)
    assert all(r.us > 1.0 for r in keyed.values())


# -- geometry.py Geometry.of_layer: an unquantized layer is not block-scaled --------------------------------------

def test_a_bf16_layers_geometry_is_its_tuned_rows_geometry(mi355x):
    """A BF16 layer has no weight scales: its geometry (block_scale False, no scale bytes) is exactly the geometry of
    the AITER tuned row of its shape (qwen3_235b_bf16_tuned_fmoe.csv), and an MXFP4 layer is not block-scaled either."""
    (row,) = [r for r in _rows(QWEN3_BF16_TP4, mi355x, q_dtype_w=BF16, q_dtype_a=BF16) if r.token == 1]
    geo = cost.Geometry.of_layer(QWEN3_BF16_TP4)
    assert geo == cost.Geometry.of_row(row)
    assert geo.block_scale is False and geo.w_bytes == 2.0
    assert cost.Geometry.of_layer(MINIMAX_TP4).block_scale is False


# -- model.py _plan: an unhashable target is planned uncached, for the token counts asked -------------------------

def test_an_unhashable_target_gets_the_same_tuned_prediction(mi355x):
    """A Capabilities whose feature set is a plain (unhashable) set cannot key the plan cache: the plan is made
    uncached, for the same token counts, and MiniMax-M3 TP4 is predicted exactly as on the frozen target — the
    4096-token call from its tuned row."""
    loose = dataclasses.replace(mi355x, aiter_features=set(mi355x.aiter_features))
    with pytest.raises(TypeError):
        hash(loose)
    tokens = (1, 4096)
    got = cost.predict(MINIMAX_TP4, loose, backend_family="aiter-ck", tokens=tokens)
    assert got == cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=tokens)
    assert got[1].basis == "tuned" and "minimax_m3_fp4_tuned_fmoe.csv" in got[1].detail


# -- model.py _plugin_costs: a plain callable is given the layer; a failure is logged with its error ----------------

def test_a_plain_callable_cost_plugin_is_given_the_layer(mi355x):
    """The callable form of the moe_cost hook gets the layer it prices: a plugin pricing by the layer's hidden size
    answers for MiniMax-M3 (6144)."""

    def moe_cost(*, backend, layer, caps, tokens):
        return [{"tokens": t, "us": layer.hidden / 100 * t, "low": 1.0, "high": 1e9} for t in tokens]

    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="acme-moe", tokens=2, pm=moe_cost)
    assert (c.basis, c.us) == ("plugin", 122.88)


def test_a_failing_cost_plugin_is_logged_with_its_error(mi355x, caplog):
    """A plugin that raises never breaks the prediction (the roofline answers), and the warning names the backend
    and the exception, type and message."""

    def moe_cost(*, backend, layer, caps, tokens):
        raise RuntimeError("no table for 6144")

    with caplog.at_level(logging.WARNING, logger="moedispatch"):
        (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="acme-moe", tokens=2, pm=moe_cost)
    assert c.basis == "roofline"
    events = [r.structlog_event for r in caplog.records
              if getattr(r, "structlog_event", {}).get("event") == "plugin_cost_failed"]
    assert [(e["backend"], e["error"]) for e in events] == [("acme-moe", "RuntimeError: no table for 6144")]


# -- model.py _prior_us: the arch-wide prior sees the target's own CU count ---------------------------------------

def test_a_partition_is_predicted_by_the_arch_prior_at_its_own_cu_count():
    """MI300X:CPX (38 CUs) has no bucket or arch_cu prior: the gfx942 arch prior answers, whose last feature is
    log(CU count) — 38, not 1 — at the partition's peaks (matrix peaks scaled by 38/304)."""
    part = fake_capabilities("MI300X:CPX")
    assert (part.gfx, part.compute_units) == ("gfx942", 38)
    feats, coef = cost.load_priors().models[("arch", "gfx942", 0, 0)]
    assert coef[-1] != 0.0
    peaks = {k: (v * 38 / 304 if k.endswith("_tflops") else v) for k, v in capdb.product_peaks("MI300X").items()}
    x = cost.model_features(feats, cost.Geometry.of_layer(DSV3_FP8), 1024, 38, peaks)
    (c,) = cost.predict(DSV3_FP8, part, backend_family="aiter-ck", tokens=1024, rows=())
    assert "arch prior gfx942" in c.detail
    assert c.us == pytest.approx(math.exp(sum(a * b for a, b in zip(coef, x))))


# -- model.py _tuned_shapes: a plan step without an activation dtype has no tuned shape --------------------------

def test_a_plan_step_without_an_activation_dtype_is_predicted_by_the_roofline(mi355x):
    """A dispatch plan is read by duck typing (key and steps): a step that does not say its activation dtype
    (q_dtype_a) looks up no tuned rows, exactly like one that says "" — the roofline answers, with the heuristic
    band where the step is untuned."""
    plan = cost._plan(MINIMAX_TP4, mi355x, None, (64,))
    bare = types.SimpleNamespace(tokens=(1, 64), basis="heuristic", row=None)
    named = types.SimpleNamespace(tokens=(1, 64), basis="heuristic", row=None, q_dtype_a="")
    got = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=(64,),
                       dispatch=types.SimpleNamespace(key=plan.key, steps=(bare,)))
    assert got == cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=(64,),
                               dispatch=types.SimpleNamespace(key=plan.key, steps=(named,)))
    assert got[0].basis == "roofline" and "untuned (heuristic) kernels" in got[0].detail


# -- model.py fit_decode: the exact line, and robustness to an outlier (relative L1) ------------------------------

def test_decode_fit_recovers_an_exact_latency_plus_bytes_line():
    """Points exactly on us = 5 + 2 t_mem: fixed_us 5, efficiency 1/2."""
    a, e = cost.fit_decode([(t, 5 + 2 * t) for t in (1, 2, 3, 4, 5)])
    assert (a, e) == (pytest.approx(5.0), pytest.approx(0.5))


def test_decode_fit_ignores_one_outlier_like_a_least_relative_deviation_fit():
    """Least absolute relative deviations (reweighted by 1/|pred/us - 1|): four points on us = 5 + 2 t_mem and one
    at 40 µs where the line says 11 — the fit stays on the line (a least-squares-like fit would be pulled to it)."""
    points = [(t, 5 + 2 * t) for t in (1, 2, 4, 5)] + [(3, 40.0)]
    a, e = cost.fit_decode(points)
    assert (a, e) == (pytest.approx(5.0, rel=1e-4), pytest.approx(0.5, rel=1e-4))


# -- model.py predict_one: beyond the tuned range the bars stay the roofline's ------------------------------------

def test_a_prediction_anchored_on_the_nearest_tuned_row_keeps_the_roofline_bars(mi355x):
    """MiniMax-M3 TP4 is tuned up to 32768 tokens: at 65536 the prediction is the 32768-token row scaled by the
    prior's ratio, and its bars are the roofline prediction's, relative to the value (low/us, high/us)."""
    rows = _rows(MINIMAX_TP4, mi355x)
    assert max(r.token for r in rows) == 32768
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=65536, rows=rows)
    (p,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=65536, rows=())
    assert "scaled from the tuned row at 32768 tokens" in c.detail and c.us != pytest.approx(p.us)
    assert (c.low / c.us, c.high / c.us) == pytest.approx((p.low / p.us, p.high / p.us))


# -- priors.py: broken [[decode]] and [[model]] entries name the entry and the key ---------------------------------

@pytest.fixture
def shipped():
    return copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))


def test_a_decode_entry_without_its_keys_names_them(shipped):
    """A [[decode]] entry lacking efficiency: the message names the entry and every key it needs."""
    shipped["decode"][0].pop("efficiency")
    with pytest.raises(CapabilityDBError, match=re.escape(
            "cost_priors.toml: decode[0] needs gfx, cu, fixed_us, efficiency and max_tokens")):
        parse_priors(shipped)


def test_a_decode_entry_with_a_bad_max_tokens_names_max_tokens(shipped):
    """max_tokens 0 in [[decode]]: "decode[0]: max_tokens must be a positive finite number, got 0"."""
    shipped["decode"][0]["max_tokens"] = 0
    with pytest.raises(CapabilityDBError, match=re.escape(
            "decode[0]: max_tokens must be a positive finite number, got 0")):
        parse_priors(shipped)


def test_a_bucket_model_with_a_bad_bucket_names_bucket(shipped):
    """A bucket-level [[model]] whose bucket is a string: the message names the entry and the bucket key."""
    n = next(i for i, m in enumerate(shipped["model"]) if m["level"] == "bucket")
    shipped["model"][n]["bucket"] = "64"
    with pytest.raises(CapabilityDBError, match=re.escape(
            f"model[{n}]: bucket must be a positive finite number, got '64'")):
        parse_priors(shipped)
