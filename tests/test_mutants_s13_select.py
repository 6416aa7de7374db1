"""Survivors of the seed-13 mutation run in selector/plugins.py (_Collector.fail) and selector/runtime.py (the
allocation search behind issue 23): each test pins, on a real model / target / AITER release or a real plugin
mistake, the rule the mutated line decides — the event a failed plugin load is logged as, the order allocations are
tried in (smallest first) and that one a known issue blocks is skipped (not the end of the search), how a kept
allocation's note words tuned and heuristic buckets (one clause per kind, a single count as one number), and that a
token-dependent pad issue of a family AITER dispatches is reported where it runs."""

from __future__ import annotations

import logging
from dataclasses import replace

from moedispatch import hookimpl, plan_model
from moedispatch.aiter import dispatch as ad
from moedispatch.core.backend import Padding
from moedispatch.core.workload import SERVING_BUCKETS
from moedispatch.kit import rules
from moedispatch.selector import plugins as mp
from moedispatch.selector import runtime as rt
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"


def _layer(model: str, tp: int):
    return next(x for x in expand_layers(load_model(model), tp, 1) if x.kind == "moe")


# -- selector/plugins.py: _Collector.fail — a non-strict load failure is the plugin_load_failed warning -------------

def test_a_plugin_with_a_misspelt_hook_is_logged_as_plugin_load_failed(caplog):
    """pluggy accepts an implementation of a hook nobody specified: a plugin defining register_backend (no 's')
    contributes nothing. Not strict, the registry keeps going and logs the structured warning event
    ``plugin_load_failed`` whose error names the plugin and the hook (what log filters and `moedispatch backends`
    users search for); the record carries the same message."""

    class Typo:
        @hookimpl
        def register_backend(self):
            return []

    with caplog.at_level(logging.WARNING, logger="moedispatch"):
        reg = mp.build_registry([("acme", Typo())], load_entrypoints=False)
    message = ("unknown hook 'register_backend' (moedispatch hooks: moe_cost, register_backends) (did you mean "
               "'register_backends'?)")
    events = [r.structlog_event for r in caplog.records if getattr(r, "structlog_event", {}).get("event")]
    assert [(e["event"], e["error"]) for e in events] == [("plugin_load_failed", f"plugin 'acme': {message}")]
    (rec,) = [p for p in reg.plugins if p.name == "acme"]
    assert rec.errors == (message,)


# -- selector/runtime.py: _trial_allocations — allocations are tried smallest first --------------------------------

def test_trial_allocations_are_tried_smallest_allocation_first():
    """dispatched_padding keeps the first allocation AITER's dispatch runs correctly, so the trials go smallest
    allocation (hidden × intermediate per rank) first, ties by the smaller hidden. gpt-oss-120b at TP2 on MI355X
    (2880 × 1440/rank; FlyDSL's family table 3072 × 1536): 2880 × 1440, 2880 × 1472, then 2880 × 1536 and 3072 ×
    1440 (equal size), 3072 × 1472, the table, and 3072 × 2048 above it — 3072 × 1440 is larger than 2880 × 1472
    (4,423,680 vs 4,239,360), so it comes after it, not right after the unpadded allocation."""
    caps = fake_capabilities("MI355X", A20)
    layer = _layer("gpt-oss-120b", 2)
    backend = mp.get_registry().get("aiter-flydsl")
    static = backend.plan_padding(layer, caps)
    assert (static.hidden, static.intermediate_per_rank, static.hidden_multiple, static.intermediate_multiple) == (
        3072, 1536, 256, 256)
    trials = rt._trial_allocations(layer, static)
    assert trials == [(1, 1), (1, 64), (1, 128), (256, 1), (256, 64), (256, 256), (256, 1024)]
    sizes = []
    for hm, im in trials:
        plan = static if (hm, im) == (256, 256) else backend.padding_at(layer, caps, hm, im)
        sizes.append((plan.hidden, plan.intermediate_per_rank))
    assert sizes == [(2880, 1440), (2880, 1472), (2880, 1536), (3072, 1440), (3072, 1472), (3072, 1536), (3072, 2048)]
    assert [h * i for h, i in sizes] == sorted(h * i for h, i in sizes)


# -- selector/runtime.py: _kept_note and _spans — tuned and heuristic buckets, each group in its own clause ---------

def test_a_kept_note_words_tuned_and_heuristic_buckets_as_two_clauses():
    """Issue 23's kept-allocation note names, for the steps each covers, the tuned rows that decide and the FlyDSL
    heuristic kernels whose tiles divide the allocation, as two clauses joined by "; "; a span of one token count is
    that number ("64"), not "64–64". Case: Kimi-K2.5 (int4 group-32, a16wi4) at TP2 on MI355X / AITER 0.1.20.post1,
    7168 × 1024/rank unpadded, at every serving bucket: kimik2_i4_tuned_fmoe.csv rows 62–73 decide tokens 1–16, 64
    and 256–8192; at 32 and 128 AITER's untuned a16wi4 FlyDSL kernels run (tiles 128). Worded against a family table
    of 7168 × 2048 (a table this allocation is below)."""
    caps = fake_capabilities("MI355X", A20)
    layer = _layer("Kimi-K2.5", 2)
    plan = Padding.none(layer)
    dp = ad.plan_dispatch(layer, caps, tokens=SERVING_BUCKETS, env={}, padding=plan)
    assert [s.tokens[0] for s in dp.steps if s.basis != "tuned"] == [32, 128]
    assert {s.family for s in dp.steps} == {"flydsl"}
    note = rt._kept_note(Padding.aligned(layer, intermediate_multiple=2048), plan, dp, SERVING_BUCKETS)
    rows = ", ".join(f"ROCm/aiter@v0.1.20.post1:aiter/configs/model_configs/kimik2_i4_tuned_fmoe.csv:{n}"
                     for n in range(62, 74))
    assert note.kind == "padding" and note.text == (
        "no padding (not the family table's 7168 × 2048): every kernel AITER 0.1.20.post1 dispatches for tokens "
        f"1–8192 tiles 7168 × 1024 — tuned rows of this shape decide tokens 1–16, 64, 256–8192 ({rows}); FlyDSL "
        "heuristic kernels run tokens 32, 128 with inter_dim tiles that divide it (stage-1 tile_n 128, stage-2 "
        "tile_k 128)")
    assert rt._spans([s for s in dp.steps if s.basis != "tuned"]) == "tokens 32, 128"


# -- selector/runtime.py: dispatched_family_issues — a token-dependent pad issue is a note where that family runs ----

def test_a_token_dependent_pad_issue_of_a_dispatched_family_is_a_located_caveat(monkeypatch):
    """The pad arguments reach whatever family AITER dispatches: an issue about them that depends on run-time token
    counts (a ``tokens`` predicate: a caveat, not a refusal) is reported for a plan named after another family,
    prefixed with where AITER runs the affected family. Case (test_launch's): DeepSeek-V4 at TP8 on MI355X with
    AITER_BF16_FP8_MOE_BOUND=0, a plan named aiter-cktile handing FlyDSL intermediate_pad=128 — with FlyDSL's
    aiter-pr#3538 entry made token-dependent (a crash at M in [1, 2]), the plan gets no refusal but this caveat."""
    real = rules.known_issues()
    tokens = tuple(replace(i, effect="crash", predicate=i.predicate + (("tokens", (1, 2)),))
                   if i.id == "aiter-pr#3538" else i for i in real)
    monkeypatch.setattr(rules, "known_issues", lambda: tokens)
    caps = fake_capabilities("MI355X", A20)
    layer = _layer("DeepSeek-V4-Pro", 8)
    alloc = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=128,
                    zero_fill=True, pad_semantics="skip")
    dp = ad.plan_dispatch(layer, caps, tokens=(1, 8192), env={"AITER_BF16_FP8_MOE_BOUND": "0"}, padding=alloc)
    blocking, notes = rt.dispatched_family_issues(layer, caps, alloc, dp, "aiter-cktile")
    assert blocking == ()
    (note,) = notes
    assert (note.kind, note.issue) == ("caveat", "aiter-pr#3538")
    assert note.text == ("AITER's dispatcher runs flydsl for tokens 1–8192 at 7168 × 512/rank: caveat [aiter-pr#3538] "
                         "FlyDSL stage 1 leaves the padded tail tile unwritten when inter_dim_pad > 0 (crash at M in "
                         "[1, 2]); no workaround known")


# -- selector/runtime.py: dispatched_padding — an allocation a known issue blocks is skipped, the search goes on ------

def test_an_allocation_blocked_by_a_known_issue_is_skipped_and_the_table_says_why():
    """dispatched_padding tries allocations smallest first; one the backend's own known issues block is skipped (not
    the end of the search): the family table's allocation is then tried, and kept with a note naming the refused
    smaller one and the issue. Case: Qwen3-235B-A22B-Instruct-2507-MXFP4 at TP4 on MI355X / AITER 0.1.20.post1 on
    aiter-ck (CK a4w4): 4096 × 384/rank unpadded hits aiter#2191 (no CK a4w4 tile for inter_dim 384), so the plan is
    the table's 4096 × 512, saying why 384 is not kept."""
    d = next(d for d in plan_model("Qwen3-235B-A22B-Instruct-2507-MXFP4", fake_capabilities("MI355X", A20), 4, 1)
             .decisions if d.layer.kind == "moe")
    assert (d.backend, d.layer.intermediate_per_rank, d.padding.hidden, d.padding.intermediate_per_rank) == (
        "aiter-ck", 384, 4096, 512)
    note = d.padding.notes[0]
    assert (note.kind, note.text) == (
        "padding", "padded to 4096 × 512/rank, not 4096 × 384: at 4096 × 384 [aiter#2191] CK a4w4 MXFP4 has no tile "
                   "for inter_dim 384 (MiniMax-M2.1 MXFP4 at TP4) (crash, open)")
