"""Rules of the cost model that survived the seed-16 mutation run (benchmarks/mutation.py --only
'moedispatch/cost/*.py' --sample 0.02 --seed 16): a plugin cost below the datasheet roofline is raised to it, low bar
included (_at_least_the_roofline); a callable cost hook gets the target and a plugin manager's hook wins over a
callable (_plugin_costs); a heuristic dispatch entry before a tuned one, and an entry that hands the row itself
(_rows_from_dispatch); the tuned shape's doweight_stage1 (_shape_rows_uncached); a target with neither a product nor
an arch (_target_peaks); bars that only touch (ranking.compare); the heuristic evidence's numbers
(heuristic._positive); and the key an interpolation truth names (drift.interpolations). Each test pins one rule."""

from __future__ import annotations

import math
import types

import pytest

from moedispatch.core.costs import Cost
from moedispatch.core.errors import CapabilityDBError
from moedispatch.cost import drift, heuristic, ranking
from moedispatch.cost import model as cost
from moedispatch.data import aiter_configs
from moedispatch.testing import fake_capabilities

from test_cost import MINIMAX_TP4, _rows
from test_mutants_s13_cost import A20, mi355x  # noqa: F401 (mi355x: the shared MI355X fixture)


# -- model.py _at_least_the_roofline ---------------------------------------------------------------------------

def test_a_plugin_cost_below_the_roofline_is_raised_to_it_low_bar_included(mi355x):
    """A plugin's 1 µs (range 1 µs up to well above the device's limit) at 256 tokens: the point and the low bar
    become the datasheet roofline, the high bar stays — no kernel is faster than the device."""
    floor = max(cost.roofline_us(cost.Geometry.of_layer(MINIMAX_TP4), 256, fake_peaks(mi355x)))

    def hook(backend, layer, caps, tokens):
        return [{"tokens": t, "us": 1.0, "low": 1.0, "high": 10 * floor} for t in tokens]

    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="acme", tokens=256, pm=hook)
    assert c.basis == "plugin" and c.us == pytest.approx(floor) and c.low == pytest.approx(floor)
    assert c.high == pytest.approx(10 * floor) and f"raised from 1 µs to the datasheet roofline {floor:.1f} µs" in c.detail


def fake_peaks(caps):
    return cost._target_peaks(caps)[0]


# -- model.py _plugin_costs --------------------------------------------------------------------------------------

def test_a_callable_cost_hook_is_handed_the_target(mi355x):
    seen = {}

    def hook(backend, layer, caps, tokens):
        seen["caps"] = caps
        return None

    cost.predict(MINIMAX_TP4, mi355x, backend_family="acme", tokens=256, pm=hook)
    assert seen["caps"] is mi355x


def test_a_plugin_manager_that_is_also_callable_is_asked_through_its_hook(mi355x):
    """pm may be a pluggy PluginManager (its ``hook.moe_cost``) or a plain callable: an object with a ``hook`` is
    asked through it even when it is callable too."""
    floor = max(cost.roofline_us(cost.Geometry.of_layer(MINIMAX_TP4), 256, fake_peaks(mi355x)))

    class Manager:
        def __init__(self):
            self.hook = types.SimpleNamespace(moe_cost=lambda **kw: [
                {"tokens": t, "us": 2 * floor, "low": floor, "high": 3 * floor} for t in kw["tokens"]])

        def __call__(self, **kw):
            raise AssertionError("called instead of its hook")

    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="acme", tokens=256, pm=Manager())
    assert (c.basis, c.us) == ("plugin", pytest.approx(2 * floor))


# -- model.py _rows_from_dispatch ------------------------------------------------------------------------------

def test_a_heuristic_entry_before_a_tuned_one_does_not_hide_it(mi355x):
    """The dispatch model lists its entries by token range: untuned small counts first, then a tuned row. The
    tuned row after a heuristic entry is still used (it was dropped with everything after the first non-tuned
    entry), and an entry may hand the row object itself (``row``, no ``config``)."""
    row = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}[256]
    entries = [{"tokens": [1, 128], "basis": "heuristic"}, {"tokens": [129, 256], "basis": "tuned", "row": row}]
    assert cost._rows_from_dispatch(entries, mi355x) == [row]
    (c,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256, dispatch=entries)
    assert (c.basis, c.us) == ("tuned", row.us)


# -- model.py _shape_rows_uncached: doweight_stage1 is part of the tuned shape ------------------------------------

def test_the_tuned_shape_keeps_doweight_stage1():
    """MI308X's tuned_fmoe.csv has the Qwen3-30B-A3B TP1 FP8 per-tensor shape (4096 x 384, 128 experts, top-8) with
    doweight_stage1 0 and 1, timed apart: each lookup returns only its own."""
    caps = fake_capabilities("MI308X", A20)
    base = dict(model_dim=4096, inter_dim=384, expert=128, topk=8, gfx="gfx942", cu_num=80,
                dtype="torch.bfloat16", q_dtype_w="torch.float8_e4m3fnuz", q_type="QuantType.per_Tensor", use_g1u1=1,
                act_type="ActivationType.Silu")
    both = aiter_configs.tuned_rows(config_set=aiter_configs.config_set_for(caps), q_dtype_a="torch.float8_e4m3fnuz",
                                    **{k: v for k, v in base.items() if k != "act_type"})
    assert {r.doweight_stage1 for r in both} == {0, 1}
    for dw in (0, 1):
        key = types.SimpleNamespace(**base, doweight_stage1=dw)
        rows = cost._shape_rows_uncached(key, caps, "torch.float8_e4m3fnuz")
        assert rows and {r.doweight_stage1 for r in rows} == {dw}


# -- model.py _target_peaks ---------------------------------------------------------------------------------------

def test_a_target_with_neither_product_nor_arch_has_no_peaks():
    assert cost._target_peaks(types.SimpleNamespace(product=None, gfx=None, compute_units=None)) == (None, None)


# -- ranking.py compare: bars that touch do not separate -----------------------------------------------------------

def test_bars_that_only_touch_are_a_tie():
    a = [Cost(64, 12.0, 10.0, 14.0, "roofline")]
    b = [Cost(64, 8.0, 6.0, 10.0, "roofline")]
    assert ranking.compare(a, b) == "tie" and ranking.compare(b, a) == "tie"
    assert ranking.compare(a, [Cost(64, 8.0, 6.0, 9.9, "roofline")]) == "slower"


# -- heuristic.py _positive ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.inf, math.nan, "12.5", None, True, 0, -3.0])
def test_the_heuristic_evidence_takes_positive_finite_numbers_only(value):
    with pytest.raises(CapabilityDBError, match="x.toml: needs positive finite numbers"):
        heuristic._positive(value, "x.toml")
    assert heuristic._positive(12, "x.toml") == 12.0


# -- drift.py interpolations: each truth names its key -------------------------------------------------------------

def test_each_interpolation_truth_names_the_key_of_its_row():
    releases = drift.release_rows(None)
    truths = drift.interpolations(releases, "later")
    assert truths
    keys = {key for _tag, _commit, rows in releases for key in rows}
    assert all(t.key in keys for t in truths)
    assert all(t.key[0] in ("gfx942", "gfx950") for t in truths)


# -- seed-17 survivors (drawn after the tests above; its 90.9% is the figure, these tests come after it) -----------

def test_a_citation_names_a_tagged_release_by_its_tag_and_head_by_its_commit():
    assert drift.ref_of("v0.1.20.post1", "de07f3885e0000") == "v0.1.20.post1"
    assert drift.ref_of("head", "e4048607a5123456") == "e4048607"


def test_rows_read_from_aiters_folder_name_their_file_inside_the_release(shared_aiter, monkeypatch, tmp_path):
    """release_rows(data) names each row's file relative to the release folder (``aiter/configs/…``), whatever the
    working directory — what the reverted-row list and every drift citation match on."""
    monkeypatch.chdir(tmp_path)
    releases = drift.release_rows(str(shared_aiter))
    files = {r.file for _tag, _commit, rows in releases for r in rows.values()}
    assert files and all(f.startswith("aiter/configs/") and f.endswith(".csv") for f in files), sorted(files)[:3]


def test_a_top_1_row_with_an_odd_expert_count_has_no_fused_shared_expert():
    """Only top-k > 1 can carry an always-selected shared expert among its k (top-1 would route nothing else)."""
    from moedispatch.cost.geometry import _fused_shared

    assert (_fused_shared(257, 9), _fused_shared(129, 5), _fused_shared(9, 1), _fused_shared(9, 2)) == (1, 1, 0, 1)
    assert (_fused_shared(7, 2), _fused_shared(256, 8)) == (0, 0)


def test_heuristic_evidence_of_another_schema_says_which():
    with pytest.raises(CapabilityDBError, match="schema must be 'moedispatch.cost_heuristic_evidence/1', got 'x/2'"):
        heuristic.parse_evidence({"schema": "x/2", "pair": []})


def test_a_band_without_its_gfx_is_a_capability_db_error():
    import copy

    from moedispatch.cost.priors import parse_priors
    from moedispatch.data import capdb

    shipped = copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))
    shipped["band"][0].pop("gfx")
    with pytest.raises(CapabilityDBError, match=r"band\[0\] needs level, gfx, low and high"):
        parse_priors(shipped)


def test_a_decode_fit_without_its_row_count_counts_none():
    """``n`` (the clean rows a [[decode]] fit stands on, said in the detail) is 0 when the entry does not give it —
    never a made-up 1."""
    import copy

    from moedispatch.cost.priors import parse_priors
    from moedispatch.data import capdb

    shipped = copy.deepcopy(capdb.load_toml.__wrapped__("cost_priors.toml"))
    entry = shipped["decode"][0]
    entry.pop("n", None)
    key = (str(entry["gfx"]), int(entry["cu"]))
    fit = parse_priors(shipped).decode_pair.get((*key, entry["pair"])) if entry.get("pair") else \
        parse_priors(shipped).decode[key]
    assert fit.n == 0


def test_the_decode_fit_stops_when_the_bandwidth_term_moves_by_at_most_1e_8_relative():
    """The slope (1 / efficiency, about 1.83 here) converges relative to max(1, |b|) like the fixed term: on these
    points the fit stops at its 28th step and returns it (a tolerance of 1e-8 / |b| ran on and returned another)."""
    points = [(15.32, 41.39), (25.44, 53.43), (33.38, 80.51), (40.79, 88.0), (26.9, 62.45), (46.93, 104.96)]
    assert cost.fit_decode(points) == cost.fit_decode(points, iterations=28) != cost.fit_decode(points, iterations=27)
