"""The cost model (moedispatch.cost.model): tuned rows are believed exactly, interpolation stays between its neighbours,
nothing is predicted faster than the datasheet roofline, bars widen as the basis weakens, the priors ship as
validated data, and a plugin can declare its own cost."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import pluggy
import pytest

from moedispatch.data import aiter_configs
from moedispatch.data import capdb
from moedispatch.cost import model as cost
from moedispatch.cost.geometry import FEATURE_SIZES
from moedispatch.core import hookspecs
from moedispatch.core.backend import Padding
from moedispatch.core.costs import Cost
from moedispatch.core.errors import CapabilityDBError, UsageError
from moedispatch.core.layers import MoELayer
from moedispatch.testing import fake_capabilities

ROOT = Path(__file__).resolve().parents[1]

# MiniMax-M3 MXFP4 as AITER tuned it at TP4 (shared expert fused: 129 experts, top-5):
# ROCm/aiter@e4048607:aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv (the index's head). AITER's
# activation-dtype policy (moedispatch.aiter.dispatch) runs its MXFP4 activations, and so these rows, from 256 tokens.
MINIMAX_TP4 = MoELayer.build(hidden=6144, intermediate=3072, experts=129, top_k=5, tp=4, weight="mxfp4",
                             act="mxfp4", activation="swigluoai_uninterleave")
# The same model at TP8 as moedispatch plans it: 384/rank padded to 512, no tuned row for 128 experts / top-4.
MINIMAX_TP8 = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4",
                             act="mxfp4", activation="swigluoai_uninterleave")
# DeepSeek-V4 FP8 x FP4 (dsv4_fp8fp4_tuned_fmoe.csv): its 32-token row (82.08 µs) is faster than the MI355X
# datasheet roofline for the bytes it must read (125 µs).
DSV4 = MoELayer.build(hidden=7168, intermediate=512, experts=385, top_k=7, weight="mxfp4", act="mxfp8")


@pytest.fixture(scope="module")
def mi355x():
    return fake_capabilities("MI355X", "0.1.20.post1")


FP4 = "torch.float4_e2m1fn_x2"


def _rows(layer, caps, **kw):
    """The tuned rows of a layer's shape, looked up independently of moedispatch.cost.model."""
    kw.setdefault("q_dtype_w", FP4)
    kw.setdefault("q_dtype_a", FP4)
    cs = aiter_configs.config_set_for(caps)
    return aiter_configs.tuned_rows(config_set=cs, model_dim=layer.hidden, inter_dim=layer.intermediate_per_rank,
                                    expert=layer.experts_per_rank, topk=layer.top_k, gfx=caps.gfx,
                                    cu_num=caps.compute_units, **kw)


def _width(c: Cost) -> float:
    return c.high / c.low


# -- tuned rows ---------------------------------------------------------------------------------------------------

def test_exact_tuned_row_is_the_prediction(mi355x):
    """Where the tuned CSV has the layer's shape and token bucket, the prediction is that row's us (basis tuned)."""
    rows = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}
    assert {256, 4096, 32768} <= set(rows)
    costs = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=(256, 4096, 32768))
    for c in costs:
        assert c.basis == "tuned"
        assert c.us == rows[c.tokens].us
        assert c.low <= c.us <= c.high
        assert rows[c.tokens].where in c.detail
    assert costs[1].to_dict() == {"tokens": 4096, "us": rows[4096].us, "low": round(costs[1].low, 4),
                                  "high": round(costs[1].high, 4), "basis": "tuned", "detail": costs[1].detail}
    # the JSON says whose µs it is (issue 26: every cost names its release); a total carries neither
    assert "µs of AITER v0.1.20.post1" in costs[1].to_dict()["detail"]
    assert set(costs[1].to_dict(with_basis=False)) == {"tokens", "us", "low", "high"}


def test_the_dispatch_plan_decides_which_rows_apply(mi355x):
    """The real MiniMax-M3 layer (128 experts, top-4) reaches the 129/top-5 rows only with the shared expert fused
    into the routed call (an engine choice the dispatch plan records); its roofline then reads that expert too."""
    from moedispatch.aiter import dispatch as aiter_dispatch

    layer = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=4, weight="mxfp4", act="mxfp4",
                           activation="swigluoai_uninterleave", shared_experts=1, shared_intermediate=3072)
    plain = cost.predict(layer, mi355x, backend_family="aiter-flydsl", tokens=(4096,))
    assert plain[0].basis == "roofline"
    fused = aiter_dispatch.plan_dispatch(layer, mi355x, tokens=(1, 4096), env={},
                                         assumptions=aiter_dispatch.Assumptions(fused_shared_expert=True))
    assert (fused.key.expert, fused.key.topk) == (129, 5)
    one, big = cost.predict(layer, mi355x, backend_family="aiter-flydsl", tokens=(1, 4096), dispatch=fused)
    assert (big.basis, big.us) == ("tuned", {r.token: r.us for r in _rows(MINIMAX_TP4, mi355x)}[4096])
    assert one.basis == "roofline"   # AITER runs bf16 activations at one token: no a4w4 row applies
    assert cost.predict(layer, mi355x, backend_family="aiter-flydsl", tokens=(1, 4096)) != (one, big)
    assert cost._key_geometry(layer, None, fused.key).shared == 1


def test_rows_and_dispatch_entries_are_used_as_given(mi355x):
    """Rows passed by the caller (or named by the AITER dispatch model's ``config``) are the tuned table."""
    rows = _rows(MINIMAX_TP4, mi355x)
    by_token = {r.token: r for r in rows}
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256, rows=rows)
    assert (c.basis, c.us) == ("tuned", by_token[256].us)
    entries = [{"tokens": [129, 256], "bucket": 256, "basis": "tuned", "config": by_token[256].where}]
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256, dispatch=entries)
    assert (c.basis, c.us) == ("tuned", by_token[256].us)
    heuristic = [{"tokens": [129, 256], "bucket": 256, "basis": "heuristic", "config": None}]
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256, dispatch=heuristic)
    assert c.basis == "roofline"


def test_only_aiter_backends_use_tuned_rows(mi355x):
    """Triton runs its own kernels: AITER's tuned rows say nothing about it."""
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="triton", tokens=64)
    assert c.basis == "roofline"


# -- interpolation ------------------------------------------------------------------------------------------------

def test_interpolation_is_monotone_and_between_the_neighbours(mi355x):
    """Between two tuned buckets the prediction moves monotonically from one row's time to the other's."""
    rows = {r.token: r.us for r in _rows(MINIMAX_TP4, mi355x)}
    for lo, hi in ((256, 512), (1024, 2048), (8192, 16384)):
        tokens = tuple(range(lo + 1, hi, max(1, (hi - lo) // 23)))
        costs = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=tokens)
        assert all(c.basis == "interpolated" for c in costs)
        us = [rows[lo]] + [c.us for c in costs] + [rows[hi]]
        assert us == sorted(us) or us == sorted(us, reverse=True), (lo, hi, us)
        assert all(min(rows[lo], rows[hi]) <= u <= max(rows[lo], rows[hi]) for u in us)


def test_interpolate_follows_the_roofline_work():
    """The abscissa bends with the work: with it, a point nearer the upper row's work moves toward that row."""
    plain = cost.interpolate(3, (2, 10.0), (4, 20.0))
    assert math.isclose(plain, 10.0 * 2 ** math.log2(1.5), rel_tol=1e-12)
    bent = cost.interpolate(3, (2, 10.0), (4, 20.0), abscissa=lambda m: {2: 1.0, 3: 1.9, 4: 2.0}[m])
    assert plain < bent < 20.0


# -- physical floor and lint --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["MI300X", "MI325X", "MI308X", "MI350X", "MI355X"])
@pytest.mark.parametrize("backend", ["aiter-ck", "aiter-flydsl", "triton", "emulation", "acme-moe"])
def test_decode_never_below_the_hbm_roofline(target, backend):
    """Every decode prediction (and its low bar) is at or above the time to read its bytes at datasheet HBM speed."""
    caps = fake_capabilities(target)
    peaks = capdb.product_peaks(caps.product)
    layers = [MINIMAX_TP4, MINIMAX_TP8, DSV4,
              MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8"),
              MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, weight="bf16", act="bf16")]
    for layer in layers:
        # The bytes it must read: every touched expert's weights and scales, activations at their smallest (AITER
        # may quantize them to MXFP4 on the way in).
        geo = dataclasses.replace(cost.Geometry.of_layer(layer), a_bytes=0.5)
        for c in cost.predict(layer, caps, backend_family=backend, tokens=(1, 2, 8, 32, 64)):
            t_mem, _ = cost.roofline_us(geo, c.tokens, peaks)
            assert c.low >= t_mem * (1 - 1e-9) and c.us >= t_mem * (1 - 1e-9), (target, backend, layer, c)


def test_a_row_faster_than_physically_possible_is_not_believed(mi355x):
    """DSv4 FP8xFP4 at 32 tokens: the shipped 82.08 µs beats the 125 µs datasheet roofline, so it is linted out."""
    rows = _rows(DSV4, mi355x, q_dtype_a="torch.float8_e4m3fn")
    at32 = [r for r in rows if r.token == 32]
    assert at32 and at32[0].us == pytest.approx(82.08)
    (c,) = cost.predict(DSV4, mi355x, backend_family="aiter-flydsl", tokens=32, rows=rows)
    t_mem, t_cmp = cost.roofline_us(cost.Geometry.of_layer(DSV4), 32, capdb.product_peaks("MI355X"))
    assert c.us >= max(t_mem, t_cmp) > at32[0].us
    assert c.basis in ("interpolated", "roofline")


def test_lint_catches_timings_copied_across_buckets():
    """ds_v3 cu 80, 2048x192xE128: us=275.4024 for every bucket 2048…32768 — none of those rows is clean."""
    cs = aiter_configs.load_config_set("head")
    rows = [r for r in cs.rows if "ds_v3" in r.file and r.cu_num == 80 and r.model_dim == 2048
            and r.inter_dim == 192]
    copied = [r for r in rows if r.us == 275.4024]
    assert len(copied) == 5
    clean, rejected = cost.lint_rows(rows, lambda r: capdb.product_peaks("MI308X"))
    assert not any(r.us == 275.4024 for r in clean)
    assert sum("copied" in why for r, why in rejected if r.us == 275.4024) == 5


def test_a_copied_timing_reached_through_the_act_wildcard_is_not_believed():
    """Qwen3-30B-A3B at TP4 on MI308X (2048x192xE128 SiLU, bf16): AITER runs ds_v3's GELU rows at 2048+ tokens through
    the act wildcard, whose us=275.4024 is copied across every bucket 2048…32768 (the lint's own example). The
    wildcard row is linted with its shape's other buckets, so 4096 tokens is not predicted to take exactly as long as
    2048 (a copy passed as a `tuned` measurement), nor 1–8 tokens the 74.1222 µs copied across tuned_fmoe.csv's
    GELU rows."""
    caps = fake_capabilities("MI308X", "0.1.20.post1")
    layer = MoELayer.build(hidden=2048, intermediate=768, experts=128, top_k=8, tp=4, weight="bf16", act="bf16",
                           activation="silu")
    costs = cost.predict(layer, caps, backend_family="aiter-ck", tokens=(1, 2, 4, 8, 1024, 2048, 4096))
    copied = {275.4024, 74.1222}
    assert not [c for c in costs if c.basis == "tuned" and round(c.us, 4) in copied], costs
    assert all(a.us < b.us for a, b in zip(costs, costs[1:])), [round(c.us, 1) for c in costs]


# -- bars ---------------------------------------------------------------------------------------------------------

def test_bars_widen_as_the_basis_weakens(mi355x):
    """tuned < interpolated < roofline (AITER) < roofline (triton, emulation, unknown plugin backend)."""
    tuned, interp = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=(4096, 3000))
    assert (tuned.basis, interp.basis) == ("tuned", "interpolated")
    (roof,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl",
                           padding=Padding.aligned(MINIMAX_TP8, intermediate_multiple=256), tokens=64)
    assert roof.basis == "roofline"
    assert _width(tuned) < _width(interp) < _width(roof)
    for other in ("triton", "emulation", "acme-moe"):
        (c,) = cost.predict(MINIMAX_TP8, mi355x, backend_family=other,
                            padding=Padding.aligned(MINIMAX_TP8, intermediate_multiple=256), tokens=64)
        assert _width(c) > _width(roof), other


def test_triton_and_emulation_are_slower_than_aiter_by_their_field_ratios(mi355x):
    """Triton ×1.7 (vLLM #56945), emulation ×20 (vLLM PR #50817) on the same roofline; each says its source."""
    pad = Padding.aligned(MINIMAX_TP8, intermediate_multiple=256)
    # The AITER roofline on the layer's own dtypes (rows=(): no dispatch plan, whose activation policy may differ).
    (aiter,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl", padding=pad, tokens=1, rows=())
    (triton,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="triton", padding=pad, tokens=1)
    (emu,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="emulation", padding=pad, tokens=1)
    assert triton.us == pytest.approx(aiter.us * 1.7)
    assert emu.us == pytest.approx(aiter.us * 20)
    assert "vllm-project/vllm/issues/56945" in triton.detail and "vllm-project/vllm/pull/50817" in emu.detail


def test_padding_costs_time_on_the_roofline(mi355x):
    """Padded sizes are what the kernel reads and computes: 384→512 per rank costs time at 4096 tokens."""
    (plain,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl", tokens=4096)
    (padded,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl", tokens=4096,
                             padding=Padding.aligned(MINIMAX_TP8, intermediate_multiple=256))
    assert padded.us > plain.us * 1.1


# -- totals and ranking -------------------------------------------------------------------------------------------

def test_total_sums_layers_per_token_count():
    a = (Cost(1, 10, 8, 12, "tuned"), Cost(64, 40, 35, 48, "interpolated"))
    b = (Cost(1, 20, 15, 30, "roofline"), Cost(64, 50, 45, 60, "tuned"))
    t = cost.total([a, b, a])
    assert [x.tokens for x in t] == [1, 64]
    assert (t[0].us, t[0].low, t[0].high, t[0].basis) == (40, 31, 54, "roofline")
    assert (t[1].us, t[1].low, t[1].high, t[1].basis) == (130, 115, 156, "interpolated")
    assert t[0].to_dict(with_basis=False) == {"tokens": 1, "us": 40, "low": 31, "high": 54}


def test_compare_by_whether_the_bars_separate():
    fast = (Cost(64, 41, 35, 48, "interpolated"),)
    slow = (Cost(64, 118, 80, 160, "roofline"),)
    near = (Cost(64, 45, 40, 90, "roofline"),)
    assert cost.compare(fast, slow) == "faster"
    assert cost.compare(slow, fast) == "slower"
    assert cost.compare(fast, near) == "tie"
    assert cost.compare(fast, (Cost(1, 9, 8, 10, "tuned"),)) == "tie"
    assert cost.reason("aiter-flydsl", fast, "triton", slow) == \
        "aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens"


def test_compare_mixed_outcomes_is_a_tie():
    a = (Cost(1, 10, 9, 11, "tuned"), Cost(64, 100, 90, 110, "tuned"))
    b = (Cost(1, 20, 18, 22, "tuned"), Cost(64, 50, 45, 55, "tuned"))
    assert cost.compare(a, b) == "tie"


# -- input checks -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens", [(), (0,), (-1,), (1.5,), ("64",), (True,)])
def test_bad_token_counts_are_usage_errors(mi355x, tokens):
    with pytest.raises(UsageError):
        cost.predict(MINIMAX_TP8, mi355x, backend_family="triton", tokens=tokens)


def test_a_dense_layer_has_no_moe_cost(mi355x):
    dense = MoELayer.build(kind="dense", hidden=6144, intermediate=12288, tp=8)
    with pytest.raises(UsageError, match="dense"):
        cost.predict(dense, mi355x, backend_family="aiter-ck", tokens=1)


def test_a_target_without_peaks_or_priors_has_no_cost():
    """gfx90a has neither tuned rows nor peak figures in the DB: no prediction (an empty tuple), never an error that
    would stop explain — unless a plugin declares one."""
    caps = fake_capabilities("gfx90a", "none")
    assert cost.predict(MINIMAX_TP8, caps, backend_family="triton", tokens=(1, 64)) == ()
    assert cost.total([()]) == ()
    mi300a = fake_capabilities("MI300A")    # gfx942 priors exist, but no MI300A peak figures
    assert cost.predict(MINIMAX_TP8, mi300a, backend_family="aiter-ck", tokens=(1, 64)) == ()


def test_a_product_without_its_own_prior_uses_the_arch_prior():
    """MI350P (128 CUs) has peaks but no tuned rows: the gfx950 arch prior answers, with its wider bars; at decode
    the arch's decode fit (any CU count) answers, at MI350P's own 4 TB/s."""
    caps = fake_capabilities("MI350P")
    decode, c = cost.predict(MINIMAX_TP8, caps, backend_family="aiter-flydsl", tokens=(64, 256), rows=())
    assert c.basis == "roofline" and "arch prior" in c.detail
    assert decode.basis == "roofline" and "decode latency plus bytes gfx950:" in decode.detail
    assert "MI350P's 4 TB/s" in decode.detail


# -- priors data --------------------------------------------------------------------------------------------------

def test_priors_load_with_provenance():
    p = cost.load_priors()
    assert p.provenance["commit"] == aiter_configs.aiter_index.release(p.provenance["snapshot"]).commit
    assert p.provenance["script"].startswith("benchmarks/bench_cost_model.py")
    assert ("bucket", "gfx950", 256, 64) in p.models
    assert all(len(coef) == FEATURE_SIZES[feats] for feats, coef in p.models.values())
    assert p.reference[("gfx950", 256)] == "MI355X"


@pytest.fixture
def serve_priors(monkeypatch):
    """serve_priors(mutate): the shipped priors document passed through mutate(doc), served to load_priors()."""
    real = capdb.load_toml.__wrapped__

    def serve(mutate):
        doc = real("cost_priors.toml")
        mutate(doc)
        monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == "cost_priors.toml" else real(name))
        cost.load_priors.cache_clear()

    yield serve
    cost.load_priors.cache_clear()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="moedispatch.cost_priors/0"), "schema"),
    (lambda d: d["model"][0].update(coef=[1.0]), "coef"),
    (lambda d: d["model"][0].update(features="cubic"), "features"),
    (lambda d: d["model"][0].pop("gfx"), "gfx"),
    (lambda d: d["model"][0].update(coef=[float("nan")] * len(d["model"][0]["coef"])), "finite"),
    (lambda d: d["band"][0].update(low=1.5), "low <= 1 <= high"),
    (lambda d: d["tuned"].update(high="wide"), "high"),
    (lambda d: d["provenance"].pop("commit"), "commit"),
    (lambda d: d["backend"].pop("triton"), "backend.triton"),
    (lambda d: d["backend"]["emulation"].update(factor=50.0), "low <= factor <= high"),
])
def test_malformed_priors_raise_capability_db_error(serve_priors, mi355x, mutate, message):
    serve_priors(mutate)
    with pytest.raises(CapabilityDBError, match=re.escape(message)) as err:
        cost.predict(MINIMAX_TP8, mi355x, backend_family="triton", tokens=1)
    assert "cost_priors.toml" in str(err.value) and "\n" not in str(err.value)


def test_gpu_peaks_load_with_sources():
    """gpus.toml [peak.*]: datasheet HBM and dense matrix peaks per product, each with a source."""
    assert capdb.product_peaks("MI300X")["hbm_tbps"] == 5.3
    assert capdb.product_peaks("MI325X")["hbm_tbps"] == 6.0
    assert capdb.product_peaks("MI355X")["hbm_tbps"] == 8.0
    assert capdb.product_peaks("MI355X")["fp4_tflops"] == 10000.0
    assert "fp4_tflops" not in capdb.product_peaks("MI300X")
    for name in ("MI300X", "MI325X", "MI308X", "MI350X", "MI355X", "MI350P"):
        peak = capdb.product_peaks(name)
        assert peak["source"] and peak["confidence"] in ("confirmed", "derived", "unconfirmed")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["peak"]["MI355X"].update(hbm_tbps=0), "hbm_tbps"),
    (lambda d: d["peak"]["MI355X"].pop("source"), "source"),
    (lambda d: d["peak"].update(MI999X={"hbm_tbps": 1, "bf16_tflops": 1, "source": "x", "confidence": "derived"}),
     "MI999X"),
    (lambda d: d["peak"]["MI300X"].pop("measured_source"), "measured_source"),
])
def test_malformed_peaks_raise_capability_db_error(monkeypatch, mutate, message):
    real = capdb.load_toml.__wrapped__
    doc = real("gpus.toml")
    mutate(doc)
    monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == "gpus.toml" else real(name))
    capdb.gpus.cache_clear()
    try:
        with pytest.raises(CapabilityDBError, match=re.escape(message)):
            capdb.gpus()
    finally:
        capdb.gpus.cache_clear()


# -- plugin hook --------------------------------------------------------------------------------------------------

def _pm(*plugins):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for n, plugin in enumerate(plugins):
        pm.register(plugin, name=f"cost-plugin-{n}")
    return pm


def test_hook_moe_cost(mi355x):
    """A plugin's moe_cost answer for its own backend is the prediction (basis plugin); others are untouched."""
    plugin = types.SimpleNamespace()

    @hookspecs.hookimpl
    def moe_cost(backend, layer, caps, tokens):
        if backend != "acme-moe":
            return None
        return [Cost(t, 10.0 * t, 9.0 * t, 12.0 * t, "plugin") for t in tokens]

    plugin.moe_cost = moe_cost
    pm = _pm(plugin)
    costs = cost.predict(MINIMAX_TP8, mi355x, backend_family="acme-moe", tokens=(1, 64), pm=pm)
    assert [(c.tokens, c.us, c.basis) for c in costs] == [(1, 10.0, "plugin"), (64, 640.0, "plugin")]
    (other,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="triton", tokens=1, pm=pm)
    assert other.basis == "roofline"


@pytest.mark.parametrize("answer", [
    lambda tokens: [{"tokens": 1, "us": 5.0, "low": 6.0, "high": 7.0}],          # low > us
    lambda tokens: [{"tokens": 1, "us": 5.0, "low": 4.0, "high": 6.0}],          # 64 missing
    lambda tokens: [{"tokens": t, "us": "fast"} for t in tokens],                 # garbage
    lambda tokens: 1 / 0,                                                          # the plugin raises
])
def test_a_broken_cost_plugin_falls_back_to_the_roofline(mi355x, answer):
    plugin = types.SimpleNamespace()

    @hookspecs.hookimpl
    def moe_cost(backend, layer, caps, tokens):
        return answer(tokens)

    plugin.moe_cost = moe_cost
    costs = cost.predict(MINIMAX_TP8, mi355x, backend_family="acme-moe", tokens=(1, 64), pm=_pm(plugin))
    assert [c.basis for c in costs] == ["roofline", "roofline"]


def test_the_documented_cost_hook_example_runs(mi355x):
    """docs/plugins.md's moe_cost example, registered as a plugin, answers for its backend on gfx950."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    (code,) = re.findall(r"<!-- example: moe_cost -->\s*\n```python\n(.*?)\n```", text, re.DOTALL)
    module = types.ModuleType("plugins_md_cost_example")
    exec(compile(code, "docs/plugins.md:moe_cost", "exec"), module.__dict__)
    costs = cost.predict(MINIMAX_TP8, mi355x, backend_family="halfprec-moe", tokens=(1, 64, 128),
                         pm=_pm(module))
    assert [(c.us, c.basis) for c in costs] == [(18.0, "plugin"), (70.0, "plugin"), (73.2, "plugin")]


# -- the benchmark ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cost_model.py")], capture_output=True,
                         text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_benchmark_meets_its_accuracy_goals(bench):
    """In-shape median ≤ 5%, leave-one-model-out median ≤ 12% and better than per-bucket median efficiencies."""
    assert bench["in_shape_median"] <= 0.05
    assert bench["lofo_median"] <= 0.12
    assert bench["lofo_median"] < bench["bucket_prior_lofo_median"] < bench["naive_roofline_median"]
    assert bench["clean_rows"] < bench["rows"]


def test_the_documented_large_m_accuracy_is_what_the_benchmark_prints(bench):
    """docs/cost-model.md's leave-one-file-out figures at >= 2048 tokens are the benchmark's (``lofo_large_m``)."""
    text = (ROOT / "docs" / "cost-model.md").read_text()
    got = re.search(r"Leave-one-file-out at ≥ 2048 tokens: median ([\d.]+) %, p90 ([\d.]+) %", text)
    assert got is not None
    assert (float(got[1]), float(got[2])) == (round(bench["lofo_large_m"]["median"] * 100, 1),
                                              round(bench["lofo_large_m"]["p90"] * 100, 1))


def test_the_documented_roofline_bars_are_the_shipped_ones():
    """docs/cost-model.md's bars table quotes, for the roofline basis, shipped bands only: gfx950's per level, and
    the generic band a level without a band of its own takes (MI308X's bucket priors, a gfx950 partition's arch
    prior)."""
    text = (ROOT / "docs" / "cost-model.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `roofline` |"))
    quoted = {(float(a), float(b)) for a, b in re.findall(r"(\d\.\d\d)–(\d\.\d\d) ×", row)}
    priors = cost.load_priors()
    gfx950 = {(round(lo, 2), round(hi, 2)) for (_level, gfx, _cu), (lo, hi) in priors.bands.items() if gfx == "gfx950"}
    generic = (round(priors.generic[1], 2), round(priors.generic[2], 2))
    assert quoted == gfx950 | {generic}
    assert not {("bucket", "gfx942", 80), ("bucket", "gfx942", 0), ("arch", "gfx950", 0)} & set(priors.bands)


def test_the_documented_drop_where_aiter_switches_activation_dtype():
    """docs/cost-model.md: a prediction can fall with more tokens where AITER's activation-dtype policy switches
    kernels — its example, MiniMax-M3-MXFP4 at TP8 on MI355X, as explain plans it."""
    from moedispatch import api

    text = " ".join((ROOT / "docs" / "cost-model.md").read_text().split())
    got = re.search(r"MiniMax-M3-MXFP4 at TP8 on MI355X (\d+) µs at 128 tokens with bf16 activations, (\d+) µs at "
                    r"256 with MXFP4 ones", text)
    assert got is not None
    plan = api.plan_model("MiniMax-M3-MXFP4", api.target("MI355X", aiter_version="0.1.20.post1"), tp=8,
                          tokens=(128, 256))
    a, b = next(d.cost for d in plan.decisions if d.layer.kind == "moe")
    assert (round(a.us), round(b.us)) == (int(got[1]), int(got[2]))
    assert b.us < a.us


def test_shipped_priors_are_what_the_benchmark_fits(tmp_path):
    """capability_db/cost_priors.toml is reproducible: refitting from the bundled CSVs gives the same coefficients."""
    import tomllib

    out = tmp_path / "priors.toml"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cost_model.py"), "--fit", "--out", str(out)],
                   capture_output=True, text=True, check=True, timeout=300)
    fresh = tomllib.loads(out.read_text())
    shipped = tomllib.loads((ROOT / "capability_db" / "cost_priors.toml").read_text())
    assert [(m["level"], m["gfx"], m.get("cu"), m.get("bucket")) for m in fresh["model"]] == \
        [(m["level"], m["gfx"], m.get("cu"), m.get("bucket")) for m in shipped["model"]]
    for a, b in zip(fresh["model"], shipped["model"]):
        assert a["coef"] == pytest.approx(b["coef"], rel=1e-3, abs=1e-3)
    assert [(b["level"], b["gfx"], b["cu"], b["n"]) for b in fresh["band"]] == \
        [(b["level"], b["gfx"], b["cu"], b["n"]) for b in shipped["band"]]
    for a, b in zip(fresh["band"], shipped["band"]):
        assert (a["low"], a["high"]) == pytest.approx((b["low"], b["high"]), abs=2e-4)
    assert "floor" not in fresh and "floor" not in shipped   # no fastest-tuned-row floor any more
    assert [(d["gfx"], d["cu"], d["max_tokens"], d["n"]) for d in fresh["decode"]] == \
        [(d["gfx"], d["cu"], d["max_tokens"], d["n"]) for d in shipped["decode"]]
    for a, b in zip(fresh["decode"], shipped["decode"]):
        assert (a["fixed_us"], a["efficiency"]) == pytest.approx((b["fixed_us"], b["efficiency"]), abs=2e-4)
    assert fresh["heuristic"] == shipped["heuristic"]


# -- geometry -----------------------------------------------------------------------------------------------------

def test_roofline_bytes_count_the_experts_touched_and_their_scales():
    """E·(1−(1−k/E)^M) experts read, each D·(2I + I) MXFP4 weights at 0.5 B plus one E8M0 scale per 32."""
    pad = Padding.aligned(MINIMAX_TP8, intermediate_multiple=256)
    geo = cost.Geometry.of_layer(MINIMAX_TP8, pad)
    assert (geo.hidden, geo.inter, geo.w_bytes, geo.compute) == (6144, 512, 0.5 + 1 / 32, "fp4")
    assert geo.active_experts(1) == pytest.approx(4)
    assert geo.active_experts(64) == pytest.approx(128 * (1 - (1 - 4 / 128) ** 64))
    weights = 4 * 6144 * (2 * 512 + 512) * (0.5 + 1 / 32)
    acts = 6144 * 0.5 + 2 * 4 * 512 * 0.5 + 2 * 6144
    assert geo.bytes_moved(1) == pytest.approx(weights + acts)
    assert geo.flops(1) == 2 * 4 * 6144 * (2 * 512 + 512)
    ep = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, ep=8, weight="mxfp4",
                        act="mxfp4")
    geo_ep = cost.Geometry.of_layer(ep)
    assert geo_ep.active_experts(64) == pytest.approx(16 * (1 - (1 - 4 / 128) ** 64))
    # Under EP (tp 8 = ep 8: whole 3072-wide experts) this rank computes only the assignments that land on its
    # 16 of 128 experts.
    assert geo_ep.inter == 3072
    assert geo_ep.flops(64) == pytest.approx(2 * 64 * 4 * (16 / 128) * 6144 * (3 * 3072))
    acts_ep = 64 * 6144 * 0.5 + 2 * 64 * 4 * (16 / 128) * 3072 * 0.5 + 2 * 64 * 6144
    assert geo_ep.bytes_moved(64) == pytest.approx(geo_ep.active_experts(64) * 6144 * 3 * 3072 * (0.5 + 1 / 32)
                                                   + acts_ep)


def test_a_fused_shared_expert_is_read_once_not_sampled():
    """Kimi-K2 rows have 385 experts / top-9 (384 routed + the shared one, always selected): counting the shared
    expert as always touched keeps its 32-token row (143.2 µs) above the roofline instead of linting it out."""
    cs = aiter_configs.load_config_set("head")
    (row,) = [r for r in cs.rows if r.file.endswith("kimik2_fp4_tuned_fmoe.csv") and r.line == 39]
    geo = cost.Geometry.of_row(row)
    assert (geo.experts, geo.top_k, geo.shared) == (385, 9, 1)
    assert geo.active_experts(32) == pytest.approx(1 + 384 * (1 - (1 - 8 / 384) ** 32))
    clean, _ = cost.lint_rows([row], lambda r: capdb.product_peaks("MI355X"))
    assert clean == [row]


def test_a_tiny_call_is_the_decode_latency_plus_its_bytes(mi355x):
    """A tiny layer at one token costs the gfx950 decode fit's fixed term plus its few bytes at the fitted share of
    MI355X's HBM — not the fastest clean tuned row (the old 14.65 µs floor), and still above the roofline."""
    tiny = MoELayer.build(hidden=128, intermediate=32, experts=8, top_k=1, weight="bf16", act="bf16")
    (c,) = cost.predict(tiny, mi355x, backend_family="aiter-ck", tokens=1, rows=())
    fit = cost.load_priors().decode[("gfx950", 256)]
    t_mem = cost.roofline_us(cost.Geometry.of_layer(tiny), 1, capdb.product_peaks("MI355X"))[0]
    assert 5 < fit.fixed_us < 30 and 0.3 < fit.efficiency <= 1
    assert c.us == pytest.approx(fit.fixed_us + t_mem / fit.efficiency)
    assert "decode latency plus bytes" in c.detail and "latency floor" not in c.detail


@pytest.mark.parametrize("target", ["MI300X", "MI308X", "MI355X", "MI350P"])
def test_more_tokens_never_take_less_time(target):
    """Priors are per token bucket; the roofline prediction still never decreases as tokens grow."""
    caps = fake_capabilities(target)
    layers = [MINIMAX_TP8, DSV4, MoELayer.build(hidden=256, intermediate=64, experts=8, top_k=2, weight="bf16",
                                                act="bf16"),
              MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8")]
    tokens = tuple(sorted({int(1.5 ** i) for i in range(28)}))
    for layer in layers:
        for backend in ("triton", "acme-moe"):
            us = [c.us for c in cost.predict(layer, caps, backend_family=backend, tokens=tokens)]
            assert us == sorted(us), (target, layer.hidden, backend)


# gpt-oss-120b MXFP4 at TP1, padded 2880 -> 3072 (vLLM's MXFP4 round-up to 256): gptoss_fp4_tuned_fmoe.csv tunes
# this shape from 256 tokens up only.
GPTOSS = MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, weight="mxfp4", act="mxfp4",
                        activation="swigluoai")
GPTOSS_PAD = Padding.aligned(GPTOSS, hidden_multiple=256, intermediate_multiple=256)


def test_beyond_the_tuned_range_the_nearest_row_anchors_the_roofline(mi355x):
    """Below the smallest tuned bucket (gpt-oss at 64 tokens) and above the largest (MiniMax-M3 at 50k tokens) the
    nearest tuned row is scaled, so the prediction stays on the right side of it; the bars stay the roofline's."""
    cs = aiter_configs.config_set_for(mi355x)
    shape = aiter_configs.tuned_rows(config_set=cs, model_dim=3072, inter_dim=3072, expert=128, topk=4, gfx="gfx950",
                                     cu_num=256, q_dtype_a=FP4, q_dtype_w=FP4)
    rows = {r.token: r.us for r in shape}
    assert min(rows) == 256
    low_side, at256 = cost.predict(GPTOSS, mi355x, backend_family="aiter-flydsl", padding=GPTOSS_PAD,
                                   tokens=(64, 256), rows=shape)
    assert at256.basis == "tuned" and at256.us == rows[256]
    assert low_side.basis == "roofline" and low_side.us <= rows[256] and "256 tokens" in low_side.detail

    last = max(r.token for r in _rows(MINIMAX_TP4, mi355x))
    top, beyond = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=(last, 50000))
    work = lambda t: sum(cost.roofline_us(cost.Geometry.of_layer(MINIMAX_TP4), t, capdb.product_peaks("MI355X")))
    assert beyond.us == pytest.approx(top.us * work(50000) / work(last))
    assert _width(beyond) > _width(top)


def test_padding_overhead_is_bounded_by_the_padded_work(mi355x):
    """MiniMax-M3 TP8, 384→512 per rank: the intermediate work grows by 1/3, so the predicted extra time is positive
    and at most a third, at decode and at prefill alike."""
    pad = Padding.aligned(MINIMAX_TP8, intermediate_multiple=256)
    overhead = cost.padding_overhead(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl", padding=pad,
                                     tokens=(1, 64, 4096, 32768))
    assert [t for t, _ in overhead] == [1, 64, 4096, 32768]
    assert all(0 < extra <= 1 / 3 + 1e-9 for _, extra in overhead), overhead
    assert cost.padding_overhead(MINIMAX_TP8, mi355x, backend_family="triton", padding=Padding.none(MINIMAX_TP8),
                                 tokens=64) == ((64, 0.0),)


def test_priors_validate_against_their_schema():
    """capability_db/cost_priors.toml validates against docs/schemas/cost_priors.schema.json, which is not vacuous."""
    import copy
    import tomllib

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "cost_priors.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = tomllib.loads((ROOT / "capability_db" / "cost_priors.toml").read_text())
    jsonschema.validate(doc, schema)
    for mutate in (lambda d: d["band"][0].update(low=1.2),
                   lambda d: next(m for m in d["model"] if m["level"] == "bucket").pop("bucket"),
                   lambda d: d["backend"]["triton"].pop("source"), lambda d: d["provenance"].update(commit="HEAD")):
        broken = copy.deepcopy(doc)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


def test_act_type_wildcard_rows_are_the_shape_too(mi355x):
    """AITER retries the lookup with the activation wildcarded (aiter/fused_moe.py get_2stage_cfgs): a SiLU layer of
    a shape tuned only with Swiglu runs those rows, so its neighbours interpolate as well."""
    silu = dataclasses.replace(MINIMAX_TP4, activation="silu")
    between, exact = cost.predict(silu, mi355x, backend_family="aiter-ck", tokens=(3000, 4096))
    rows = {r.token: r.us for r in _rows(MINIMAX_TP4, mi355x)}
    assert (exact.basis, exact.us) == ("tuned", rows[4096])
    assert between.basis == "interpolated" and rows[2048] < between.us < rows[4096]


def test_an_installed_aiters_exact_row_is_the_prediction():
    """With AITER installed and probed, its own tuned_fmoe.csv decides (legacy dispatch for amd-aiter 0.1.7): the
    prediction at a tuned bucket equals that file's row (DeepSeek-V3-like bf16 7168x256, 256 experts, top-8)."""
    version, pkg = aiter_configs.installed_aiter()
    if pkg is None:
        pytest.skip("amd-aiter is not installed in this Python")
    caps = fake_capabilities("MI355X", version)
    caps = dataclasses.replace(caps, provenance=tuple(p for p in caps.provenance if p[0] != "aiter_version")
                               + (("aiter_version", "probe:files"),))
    cs = aiter_configs.config_set_for(caps)
    assert cs.origin == "installed"
    layer = MoELayer.build(hidden=7168, intermediate=256, experts=256, top_k=8, weight="bf16", act="bf16")
    rows = aiter_configs.tuned_rows(config_set=cs, model_dim=7168, inter_dim=256, expert=256, topk=8, cu_num=256,
                                    act_type="ActivationType.Silu", q_dtype_w="torch.bfloat16")
    if not rows:
        pytest.skip(f"the installed AITER {version} has no bf16 7168x256 row for 256 CUs")
    row = min(rows, key=lambda r: r.token)
    (c,) = cost.predict(layer, caps, backend_family="aiter-ck", tokens=row.token)
    assert (c.basis, c.us) == ("tuned", row.us)
    assert row.where in c.detail


def test_rank_orders_by_time_where_bars_separate_and_by_preference_otherwise():
    fast = (Cost(64, 41, 35, 48, "interpolated"),)
    slow = (Cost(64, 118, 80, 160, "roofline"),)
    near = (Cost(64, 45, 40, 90, "roofline"),)
    # triton is preferred less but cost decides only where bars separate
    assert cost.rank([("triton", 90, slow), ("aiter-flydsl", 70, fast)]) == [
        ("aiter-flydsl", None), ("triton", "aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens")]
    assert cost.rank([("a", 10, near), ("b", 20, fast)]) == [("b", None), ("a", None)]      # overlap: preference
    assert cost.rank([("a", 10, fast), ("b", 20, near)]) == [("b", None), ("a", None)]
    assert cost.rank([("plugin", 50, ()), ("aiter-ck", 40, fast)]) == [("plugin", None), ("aiter-ck", None)]
    three = cost.rank([("emu", 5, (Cost(64, 900, 500, 1800, "roofline"),)), ("triton", 40, slow),
                       ("aiter", 30, fast)])
    assert [n for n, _ in three] == ["aiter", "triton", "emu"]
    assert three[2][1].startswith("triton 118 µs")
    emu_preferred = cost.rank([("emu", 50, (Cost(64, 900, 500, 1800, "roofline"),)), ("triton", 40, slow),
                               ("aiter", 30, fast)])
    assert [n for n, _ in emu_preferred] == ["aiter", "triton", "emu"]


def test_aiter_triton_is_not_costed_from_fused_moe_rows(mi355x):
    """aiter-triton calls AITER's Triton GEMMs directly (not aiter.fused_moe): no tuned row applies; its factor is
    Triton's halved (about 2x Triton's throughput, vllm-project/vllm#55934)."""
    assert cost.backend_kind("aiter-triton") == "aiter-triton" and cost.backend_kind("aiter-ck") == "aiter"
    (tuned,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=4096)
    (at,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-triton", tokens=4096)
    (tr,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="triton", tokens=4096)
    assert tuned.basis == "tuned" and at.basis == "roofline"
    assert at.us == pytest.approx(tr.us / 2)
    assert "vllm-project/vllm/pull/55934" in at.detail


@pytest.mark.parametrize("target", ["MI300X", "MI308X", "MI355X"])
def test_every_builtin_models_decode_cost_is_at_or_above_its_hbm_roofline(target):
    """Across the built-in models as explain plans them (TP 8, decode token counts), each chosen backend's predicted
    time and low bar are at or above the time to read the touched experts' weights and scales at datasheet HBM
    speed on that product."""
    from moedispatch.sources.models import builtin_models, load_model
    from moedispatch.plan.plan import plan_model
    from moedispatch.core.workload import Runtime

    caps = fake_capabilities(target)
    peaks = capdb.product_peaks(caps.product)
    checked = 0
    for entry in builtin_models():
        spec = load_model(entry["name"])
        try:
            plan = plan_model(spec, caps, tp=8, runtime=Runtime.build((1, 4, 64), env={}))
        except UsageError:
            continue   # a model that does not shard over TP 8
        for d in plan.decisions:
            if d.layer.kind != "moe" or not d.cost:
                continue
            geo = dataclasses.replace(cost.Geometry.of_layer(d.layer, d.padding), a_bytes=0.5)
            for c in d.cost:
                t_mem, _ = cost.roofline_us(geo, c.tokens, peaks)
                assert c.low >= t_mem * (1 - 1e-9), (entry["name"], d.backend, c)
            checked += 1
    assert checked > 10


def test_tuning_worklist_lists_heuristic_buckets_in_aiters_untuned_format(mi355x, shared_aiter):
    """MiniMax-M3 TP8 padded to 512 has no tuned row: every bucket is a work item, heaviest first, in AITER's own
    untuned_fmoe.csv columns; the TP4 shape tuned from 256 tokens only lists its small buckets."""
    from moedispatch.aiter import dispatch as aiter_dispatch

    pad = Padding.aligned(MINIMAX_TP8, intermediate_multiple=256)
    tokens = (1, 3, 64, 4096)
    plan8 = aiter_dispatch.plan_dispatch(MINIMAX_TP8, mi355x, tokens=tokens, env={}, padding=pad)
    cost8 = cost.predict(MINIMAX_TP8, mi355x, backend_family="aiter-flydsl", padding=pad, tokens=tokens, dispatch=plan8)
    plan4 = aiter_dispatch.plan_dispatch(MINIMAX_TP4, mi355x, tokens=tokens, env={})
    cost4 = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-flydsl", tokens=tokens, dispatch=plan4)
    rows = cost.tuning_worklist([(plan8, cost8, 57), (plan4, cost4, 1)])
    assert [r["weight"] for r in rows] == sorted((r["weight"] for r in rows), reverse=True)
    tp8 = [r for r in rows if r["inter_dim"] == 512]
    assert sorted(r["token"] for r in tp8) == [1, 4, 64, 4096]          # 3 tokens look up bucket 4
    assert all(r["layers"] == 57 and r["weight"] == pytest.approx(57 * r["us"]) for r in tp8)
    assert sorted(r["token"] for r in rows if r["inter_dim"] == 768) == [1, 4, 64]   # 4096 is tuned
    header = (shared_aiter / "head" / "aiter" / "configs" / "untuned_fmoe.csv").read_text().splitlines()[0]
    text = cost.untuned_csv(rows)
    assert text.splitlines()[0] == header
    assert text.splitlines()[1].split(",")[:5] == ["4096", "6144", "512", "128", "4"]


def test_a_compute_partition_scales_the_matrix_peaks():
    """MI300X in CPX mode exposes 38 of its 304 CUs: compute-bound prefill is predicted slower than on the whole
    GPU, and its floor uses an eighth of the FLOPs (gfx942 partitions, capability_db/gpus.toml)."""
    full = fake_capabilities("MI300X")
    cpx = dataclasses.replace(full, compute_units=38)
    layer = MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8")
    (a,) = cost.predict(layer, full, backend_family="triton", tokens=8192)
    (b,) = cost.predict(layer, cpx, backend_family="triton", tokens=8192)
    assert b.us > a.us * 2
    peaks, _ = cost._target_peaks(cpx)
    assert peaks["fp8_tflops"] == pytest.approx(2614.9 * 38 / 304) and peaks["hbm_tbps"] == 5.3


def test_a_plugin_cost_given_as_mappings_keeps_its_bars(mi355x):
    """moe_cost may answer with mappings (tokens, us, low, high): each value is kept, ``high`` included."""
    plugin = types.SimpleNamespace()

    @hookspecs.hookimpl
    def moe_cost(backend, layer, caps, tokens):
        return [{"tokens": t, "us": 10.0, "low": 9.0, "high": 12.5} for t in tokens] if backend == "acme-moe" else None

    plugin.moe_cost = moe_cost
    (c,) = cost.predict(MINIMAX_TP8, mi355x, backend_family="acme-moe", tokens=1, pm=_pm(plugin))
    assert (c.us, c.low, c.high, c.basis) == (10.0, 9.0, 12.5, "plugin")


def test_fit_decode_fixed_uses_every_positive_time():
    """Sub-microsecond times are times too: only zero or negative ones are left out of the weighted median."""
    assert cost.fit_decode_fixed([(0.0, 0.5), (0.0, 0.6), (0.0, 0.7)], 1.0) == pytest.approx(0.6)
    assert cost.fit_decode_fixed([(0.0, 0.0), (0.0, 2.0)], 1.0) == pytest.approx(2.0)


def test_explain_text_says_how_each_cost_was_computed_once_per_way(cli):
    """Under the cost line, each distinct way a cost was computed (the tuned row and whose release's µs, the prior,
    the heuristic factor) is said once, with the token counts it covers — the text had the basis word only."""
    out = cli("explain", "--model", "DeepSeek-R1", "--target", "MI300X", "--aiter-version", "0.1.19", "--tp", "8",
              "--tokens", "1,4,512").stdout
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("    cost    "))
    assert lines[at + 1].strip().startswith("tokens 1, 4: decode latency plus bytes gfx942/304")
    assert "AITER runs untuned (heuristic) kernels here (capability_db/cost_heuristic_evidence.toml" in out
    assert any(line.strip().startswith("tokens 512: roofline with the arch prior gfx942") for line in lines[at:at + 8])


def test_the_total_says_a_shared_expert_outside_the_fused_call_is_not_in_it(cli):
    """DeepSeek's shared expert runs outside the fused-MoE call unless it is fused into it: the per-forward total is
    of the fused-MoE calls, and says so for a model with shared experts (it read as the whole MoE time)."""
    ds = cli("explain", "--model", "DeepSeek-R1", "--target", "MI300X", "--tp", "8", "--tokens", "1").stdout
    mm = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp", "4", "--tokens", "1").stdout
    assert "the fused-MoE calls only: a shared expert run outside them is not included" in ds
    assert "shared expert" not in next(line for line in mm.splitlines() if line.startswith("total "))
