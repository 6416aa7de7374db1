"""Survivors of the mutation run in kit/rules.py (evaluate_issues), selector/plugins.py (_Collector.add_plugin) and
selector/runtime.py (_kept_note): each test pins, on a real model / target / AITER release or a real built-in plugin,
the rule the mutated line decides, with the expected value derived from the rule's source (known_issues.toml's
confidence ladder, the entry point's distribution, AITER's tuned model_configs rows)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from moedispatch import plan_model
from moedispatch.core.backend import Padding
from moedispatch.core.layers import MoELayer
from moedispatch.kit import rules
from moedispatch.selector import plugins as mp
from moedispatch.testing import fake_capabilities


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


# -- kit/rules.py: evaluate_issues — an "avoids" note carries the weakest confidence of the issues it names ------------

def test_an_avoided_issue_note_carries_an_unconfirmed_issues_confidence(monkeypatch, caps):
    """known_issues.toml: confidence is confirmed | derived | unconfirmed, and a note built from issues is only as
    sure as the least sure of them: unconfirmed before derived before confirmed. Case: MiniMax-M3-MXFP4's TP8 layer
    (6144 × 384/rank, MXFP4) on CK-Tile / gfx950 / AITER 0.1.19, padded to 256 — the plan avoids aiter#5233. With that
    entry marked "unconfirmed" (no primary source), the 'avoids [aiter#5233]' note must say unconfirmed, never
    'confirmed'."""
    real = rules.known_issues
    marked = tuple(replace(i, confidence="unconfirmed") if i.id == "aiter#5233" else i for i in real())
    monkeypatch.setattr(rules, "known_issues", lambda: marked)
    layer = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16")
    padded = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256)
    outcome = rules.evaluate_issues("aiter-cktile", layer, caps("gfx950", "0.1.19"), padded)
    assert not outcome.blocking
    (note,) = [n for n in outcome.notes if n.text.startswith("avoids [aiter#5233]")]
    assert (note.kind, note.issue, note.confidence) == ("note", "aiter#5233", "unconfirmed")
    assert note.text == ("avoids [aiter#5233] (CK-Tile MXFP4 stage 2 mis-indexes E8M0 scales when inter_dim % 256 != 0): "
                         "the plan pads intermediate to a multiple of 256")
    # The same layer with the shipped entry (confirmed) says confirmed: the confidence comes from the issue.
    monkeypatch.setattr(rules, "known_issues", real)
    (shipped,) = [n for n in rules.evaluate_issues("aiter-cktile", layer, caps("gfx950", "0.1.19"), padded).notes
                  if n.text.startswith("avoids [aiter#5233]")]
    assert shipped.confidence == "confirmed"


# -- selector/plugins.py: _Collector.add_plugin — a built-in that cannot register is still reported as built-in -------

def test_a_builtin_entry_point_that_cannot_register_is_still_reported_as_builtin(monkeypatch):
    """`moedispatch backends` marks a plugin built-in when moedispatch's own distribution declares it, pointing into
    moedispatch_plugins — also when registering it fails. Case: a stale second entry point of moedispatch 0.1.0,
    'triton-stale = moedispatch_plugins.triton' (the module the 'triton' entry point already registered): pluggy
    refuses the module under a second name; the record is that plugin's error, and it stays builtin = true (its
    origin is moedispatch, not a third party)."""
    import moedispatch_plugins.triton as triton_module

    real = list(mp._entry_points())
    package, version = mp._dist_info(next(e for e in real if e.name == "triton").dist)
    assert package == "moedispatch"
    stale = SimpleNamespace(name="triton-stale", value="moedispatch_plugins.triton", load=lambda: triton_module,
                            dist=SimpleNamespace(metadata={"Name": "moedispatch", "Version": version},
                                                 _path="triton-stale:s12"))
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [stale])
    reg = mp.build_registry()
    rec = next(p for p in reg.plugins if p.name == "triton-stale")
    (error,) = rec.errors
    assert error.startswith("cannot register plugin: ValueError: Plugin already registered under a different name: "
                            "triton-stale=")
    assert (rec.package, rec.version, rec.hooks, rec.backends, rec.builtin) == ("moedispatch", version, (), (), True)
    assert rec.to_dict()["builtin"] is True
    assert reg.names().count("triton") == 1 and reg.owner("triton") == "triton"


# -- selector/runtime.py: _kept_note — only steps no tuned row decides are FlyDSL heuristic kernels ------------------

def test_a_kept_allocation_decided_by_tuned_rows_names_no_heuristic_kernels():
    """Issue 23: an allocation below the family table is kept when at every bucket a tuned row of that shape decides
    or FlyDSL heuristic kernels whose tiles divide it run; the note names each group for the steps it covers.
    Case: MiniMax-M3-MXFP4 TP8 on MI355X / AITER 0.1.20.post1 under vLLM's fused shared expert (129 experts, top-5)
    with GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0: AITER's minimax_m3_fp4_tuned_fmoe.csv rows decide every bucket 1–8192,
    so 384/rank is kept, the note cites those rows — and says nothing of FlyDSL heuristic kernels, which run at no
    bucket."""
    env = {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0", "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}
    d = _moe(plan_model("MiniMax-M3-MXFP4", fake_capabilities("MI355X", "0.1.20.post1"), 8, 1, aiter_env=env))
    assert (d.backend, d.padding.hidden, d.padding.intermediate_per_rank) == ("aiter-flydsl", 6144, 384)
    assert {s.basis for s in d.dispatch.steps} == {"tuned"}
    note = d.padding.notes[0]
    rows = ", ".join(f"ROCm/aiter@v0.1.20.post1:aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv:{n}"
                     for n in range(18, 32))
    assert note.kind == "padding" and note.text == (
        "no padding (not the family table's 6144 × 512): every kernel AITER 0.1.20.post1 dispatches for tokens "
        f"1–8192 tiles 6144 × 384 — tuned rows of this shape decide tokens 1–8192 ({rows})")
    assert "heuristic" not in note.text
