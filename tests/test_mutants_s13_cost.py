"""Rules of the cost model that survived the seed-13 mutation run: the shape the copied-timing lint groups rows by
(cost/lint.py _shape_key: the CU count and the top-k are part of it) and which dispatch entries lend their tuned row
to a prediction (cost/model.py _rows_from_dispatch: only a tuned — or unlabelled — entry; a heuristic one prices as
untuned even when it names a row). Each test pins one rule on a real AITER tuned row, model and target."""

from __future__ import annotations

import pytest

from moedispatch.cost import model as cost
from moedispatch.cost.lint import lint_rows
from moedispatch.data import aiter_configs, capdb
from moedispatch.testing import fake_capabilities

from test_cost import MINIMAX_TP4, _rows

A20 = "0.1.20.post1"
GLM51 = "a8w8_blockscale_tuned_fmoe_glm5_1.csv"


@pytest.fixture(scope="module")
def mi355x():
    return fake_capabilities("MI355X", A20)


@pytest.fixture(scope="module")
def glm51_512():
    """AITER HEAD's a8w8_blockscale_tuned_fmoe_glm5_1.csv line 17: GLM-5.1 FP8 at TP8 under the fused shared expert
    (6144 x 256, 257 experts, top-9) on MI300X (gfx942, 304 CUs), token 512, 310.917 µs."""
    cs = aiter_configs.load_config_set("head")
    (row,) = [r for r in cs.rows if r.file.endswith(GLM51) and r.line == 17]
    assert (row.gfx, row.cu_num, row.token, row.expert, row.topk, row.us) == ("gfx942", 304, 512, 257, 9, 310.917)
    return row


def _peaks(row):
    return capdb.product_peaks({304: "MI300X", 80: "MI308X"}[row.cu_num])


# -- lint.py _shape_key: a timing copied across token buckets is judged within one (CU count, top-k, ...) shape ------

def test_equal_timings_on_two_cu_counts_are_not_a_copy(glm51_512):
    """One CSV tuning GLM-5.1 for MI300X (304 CUs) and MI308X (80 CUs), as glm5_1.csv does, holds two shapes: the same
    µs at 512 tokens on both GPUs is not a timing copied across token buckets — both rows stay clean; within one CU
    count the same µs at another bucket is a copy."""
    mi308x = glm51_512._replace(cu_num=80, line=40)
    assert lint_rows([glm51_512, mi308x], _peaks) == ([glm51_512, mi308x], [])
    copied = glm51_512._replace(token=1024, line=18)
    clean, rejected = lint_rows([glm51_512, copied], _peaks)
    assert clean == [] and [why for _r, why in rejected] == ["us=310.917 is copied across token buckets of this shape"] * 2


def test_equal_timings_at_two_top_ks_are_not_a_copy(glm51_512):
    """The routed top-k is part of the shape (GLM-5.1 tunes top-9 with the fused shared expert): a top-8 row of the
    same dims with the same µs at another bucket is another shape's timing, not a copy — both rows stay clean."""
    top8 = glm51_512._replace(topk=8, token=1024, line=41)
    assert lint_rows([glm51_512, top8], _peaks) == ([glm51_512, top8], [])


# -- model.py _rows_from_dispatch: only a tuned (or unlabelled) entry's row is a measurement of what runs -----------

def test_a_heuristic_dispatch_entry_does_not_lend_its_row(mi355x):
    """Dispatch entries passed to predict: an entry marked heuristic says AITER runs untuned kernels there, so the
    row it names (here minimax_m3_fp4_tuned_fmoe.csv:10, MiniMax-M3 TP4 at 256 tokens, 181 µs) is not a timing of
    what runs — the prediction is the roofline with the heuristic band, exactly as for a heuristic entry naming no
    row. An entry without a basis is used as given (the tuned row's µs)."""
    row = {r.token: r for r in _rows(MINIMAX_TP4, mi355x)}[256]
    assert row.where.endswith("minimax_m3_fp4_tuned_fmoe.csv:10")

    def entry(**kw):
        return [{"tokens": [129, 256], "bucket": 256, **kw}]

    (named,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256,
                            dispatch=entry(basis="heuristic", config=row.where))
    (bare,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256,
                           dispatch=entry(basis="heuristic", config=None))
    assert named == bare and named.basis == "roofline" and "untuned (heuristic) kernels" in named.detail
    (given,) = cost.predict(MINIMAX_TP4, mi355x, backend_family="aiter-ck", tokens=256,
                            dispatch=entry(config=row.where))
    assert (given.basis, given.us) == ("tuned", row.us)
