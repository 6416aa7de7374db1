"""Every branch of the recipe rules (moedispatch/engines/recipes.py), each on the smallest case that takes it.

The real deployments are pinned by tests/test_golden_recipes.py and test_recipes_inprocess.py; some rules no built-in
model on a shipped engine release reaches today (an engine-level gate, a kernel-pad disagreement, an engine known
issue keyed on the MoE runner). Here those rules run on engine data edited in memory (capability_db/engines.toml with
one row added or changed) and on stand-in backends, so a changed line turns a test red. The release used, vLLM
0.30.0, is one engine_choice does not model, so the engines.toml rows alone decide.
"""

from __future__ import annotations

import copy

import pytest

from moedispatch.data import capdb
from moedispatch.engines import recipes
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.layers import MoELayer
from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.core.reason import Reason
from moedispatch.engines.recipes import build_recipe, engine_padding, matching_issues
from moedispatch.testing import fake_capabilities

V = "0.30.0"
A3 = "0.1.15.post3"


@pytest.fixture
def engines(monkeypatch):
    """A deep copy of capability_db/engines.toml that the recipes read instead of the file; edit it in the test."""
    real = capdb.load_toml
    data = copy.deepcopy(real("engines.toml"))

    def load(name):
        return data if name == "engines.toml" else real(name)

    monkeypatch.setattr(capdb, "load_toml", load)
    return data


def _fake(name, family, padding, preference=90):
    class Fake(Backend):
        def check(self, layer, caps):
            return Verdict.supported(f"{name} runs it")

        def plan_padding(self, layer, caps):
            return padding(layer)

    Fake.name, Fake.family, Fake.preference = name, family, preference
    return Fake()


def _builtins_but(*names):
    from moedispatch.selector.plugins import build_registry

    return tuple(b for b in build_registry().backends if b.name not in names)


def _plan(model, target="MI355X", tp=8, ep=1, backends=None, aiter=A3):
    return plan_model(load_model(model), fake_capabilities(target, aiter), tp, ep, backends=backends)


# -- engine known issues ------------------------------------------------------------------------------------------

_QWEN = MoELayer.build(hidden=2048, intermediate=768, experts=128, top_k=8, tp=8, model_type="qwen3_moe")


def _issue(i, **fields):
    return {"id": f"t{i}", "severity": "error", "message": f"m{i}", "fix": f"f{i}", "source": f"s{i}", **fields}


def test_each_engine_issue_predicate_filters_and_a_miss_does_not_stop_the_scan(engines):
    """Rows are checked one by one: a row that misses on any predicate is skipped, and the rows after it are still
    checked (each miss sits before a matching row)."""
    rows = [
        _issue(0, versions="<0.30"), _issue(1),
        _issue(2, model_types=["deepseek_v3"]), _issue(3, model_types=["qwen3_moe"]),
        _issue(4, min_ep=2), _issue(5, min_ep=1),
        _issue(6, families=["triton"]), _issue(7, families=["aiter"]),
        _issue(8, runner=["triton"]), _issue(9, runner=["auto"]),
        _issue(10, unaligned=32), _issue(11, unaligned=64),
        _issue(12, env={"X": "1"}), _issue(13, env={"Y": ""}), _issue(14, env={"Z": "1"}),
        _issue(15, weight=["fp8"]), _issue(16, gfx=["gfx942"]), _issue(17, gfx=["gfx950"]),
    ]
    engines["vllm"]["issue"] = rows
    got = matching_issues("vllm", V, _QWEN, "gfx950", ep=1, family="ck", env={"Z": "1"})
    assert [r["id"] for r in got] == ["t1", "t3", "t5", "t7", "t9", "t11", "t13", "t14", "t17"]
    # the runner: a launch that names one is matched on it; none means "auto"
    assert [r["id"] for r in matching_issues("vllm", V, _QWEN, "gfx950", ep=1, family="ck", env={},
                                             runner="triton") if r["id"] in ("t8", "t9")] == ["t8"]
    assert [r["id"] for r in matching_issues("vllm", V, _QWEN, "gfx950", ep=2, family="ck", env={})
            if r["id"] in ("t4", "t5")] == ["t4", "t5"]
    empty = copy.deepcopy(engines["vllm"])
    del empty["issue"]
    engines["vllm"] = empty
    assert matching_issues("vllm", V, _QWEN, "gfx950", ep=1, family="ck", env={}) == []


def test_engine_issues_refuse_or_warn_by_severity_once_each(engines):
    """An error row refuses the backend (kind failed), a warning row warns; the reason is "message — fix: fix" with
    the row's source, id and confidence; the runner is read from the backend row's --moe-runner argument."""
    engines["vllm"]["issue"] = [
        {"id": "boom", "severity": "error", "message": "garbled", "fix": "do not", "source": "o/r#1",
         "families": ["aiter"], "confidence": "unconfirmed"},
        {"id": "meh", "severity": "warning", "message": "slow", "fix": "wait", "source": "o/r#2",
         "families": ["triton"]},
    ]
    plan = _plan("Qwen3-30B-A3B")
    r = build_recipe(plan, "vllm", V, alternatives=False)
    assert r.backend == "triton"
    assert Reason("aiter-ck: garbled — fix: do not", "failed", "o/r#1", "boom", "unconfirmed").text in \
        [w.text.split("Not realizable: ", 1)[-1] for w in r.warnings]
    fell = next(w for w in r.warnings if w.issue == "boom")
    assert (fell.kind, fell.source, fell.confidence) == ("warning", "o/r#1", "unconfirmed")
    assert fell.text.startswith(f"vllm {V} cannot carry out the plan's first choice — recipe uses triton instead. "
                                "Not realizable: aiter-ck: garbled — fix: do not")
    slow = [w for w in r.warnings if w.issue == "meh"]
    assert slow == [Reason("slow — fix: wait", "warning", "o/r#2", "meh", "confirmed")]


def test_a_runner_keyed_issue_follows_the_runner_the_backend_row_passes(engines):
    """SGLang names its MoE runner (--moe-runner-backend): an issue of the auto runner does not touch a launch that
    passes --moe-runner-backend triton."""
    engines["sglang"]["issue"] = [{"id": "auto-only", "severity": "error", "message": "auto breaks", "fix": "no",
                                   "source": "o/r#3", "runner": ["auto"]}]
    plan = _plan("Qwen3-30B-A3B", backends=_builtins_but("aiter-ck", "aiter-cktile", "aiter-flydsl", "aiter-asm",
                                                          "aiter-triton"))
    assert {d.backend for d in plan.decisions if d.layer.kind == "moe"} == {"triton"}
    r = build_recipe(plan, "sglang", "0.5.20", alternatives=False)
    assert r.ok and not any(w.issue == "auto-only" for w in r.warnings + r.refusals), r.refusals


# -- gates, allocations, kernel pads --------------------------------------------------------------------------------

def test_an_engine_gate_refuses_an_unaligned_intermediate(engines):
    engines["vllm"]["gate"] = [{"families": ["aiter"], "weight": ["bf16"], "versions": ">=0.30", "gfx": ["gfx950"],
                                "intermediate_multiple": 256, "what": "the engine checks 256", "source": "o/r#9"}]
    plan = _plan("Qwen3-30B-A3B")
    r = build_recipe(plan, "vllm", V, alternatives=False)
    first = next(d for d in plan.decisions if d.layer.kind == "moe")
    gate = [w for w in r.warnings if w.source == "o/r#9"]  # vLLM 0.30 allocates the unpadded 96/rank
    assert gate and gate[0].text.endswith(f"Not realizable: {first.backend}: vllm {V} would not run {first.backend} "
                                          "for intermediate/rank 96: the engine checks 256")
    # the same gate on another arch, another family or an older release does not apply
    for key, value in (("gfx", ["gfx942"]), ("families", ["triton"]), ("versions", "<0.30")):
        engines["vllm"]["gate"][0][key] = value
        again = build_recipe(plan, "vllm", V, alternatives=False)
        assert not any("would not run aiter-ck" in w.text for w in again.warnings + again.refusals)
        engines["vllm"]["gate"][0][key] = {"gfx": ["gfx950"], "families": ["aiter"], "versions": ">=0.30"}[key]


def test_an_allocation_that_meets_the_alignment_another_way_is_a_derived_warning():
    """vLLM allocates 192/rank for Qwen3-30B-A3B at TP4 (a multiple of 64); a plan that pads to 256 with alignment 64
    holds either way: a warning that both hold, not a refusal."""
    ck = _fake("aiter-ck", "ck", lambda la: Padding(hidden=la.hidden, intermediate_per_rank=256, intermediate_pad=64,
                                                    kernel_intermediate_pad=64, zero_fill=True,
                                                    intermediate_multiple=64))
    plan = _plan("Qwen3-30B-A3B", tp=4, backends=_builtins_but("aiter-ck") + (ck,))
    r = build_recipe(plan, "vllm", V, alternatives=False)
    assert r.ok and r.backend == "aiter-ck"
    assert Reason(f"vllm {V} allocates hidden 2048 × intermediate/rank 192 (zero-filled); the plan's 2048 × 256 is "
                  "one valid choice of the kernel's alignment (1 × 64): both hold", "warning", None, None,
                  "derived") in r.warnings
    tri = _fake("triton", "triton", lambda la: Padding(hidden=la.hidden, intermediate_per_rank=256,
                                                       intermediate_pad=64, kernel_intermediate_pad=64,
                                                       zero_fill=True, intermediate_multiple=64), preference=95)
    plan_t = _plan("Qwen3-30B-A3B", tp=4, backends=_builtins_but("triton") + (tri,))
    assert not any("both hold" in w.text for w in build_recipe(plan_t, "vllm", V, alternatives=False).warnings)


_BF16_ALLOC = {"families": ["aiter"], "weight": ["bf16"], "versions": ">=0.30", "hidden": 128, "intermediate": 0,
               "source": "o/r#6"}


def test_kernel_pads_the_engine_passes_are_checked_under_skip_semantics(engines):
    """Under "skip" the kernel reads hidden_pad/intermediate_pad: vLLM passes intermediate_pad = 32 // 64 * 64 = 0
    for Qwen3-30B-A3B at TP8 (96 → 128), a plan that needs 32 is warned about, with vLLM's source; under "compute"
    the kernel pads are not read."""
    def pad(semantics):
        return lambda la: Padding(hidden=la.hidden, intermediate_per_rank=128, intermediate_pad=32,
                                  kernel_intermediate_pad=32, zero_fill=True, intermediate_multiple=64,
                                  pad_semantics=semantics)

    engines["vllm"]["allocation"].insert(0, dict(_BF16_ALLOC))  # vLLM rounding 96 up to 128 for AITER
    fly = _fake("aiter-flydsl", "flydsl", pad("skip"))
    plan = _plan("Qwen3-30B-A3B", backends=_builtins_but("aiter-flydsl") + (fly,))
    r = build_recipe(plan, "vllm", V, alternatives=False)
    assert r.backend == "aiter-flydsl"
    assert Reason(f"vllm {V} passes hidden_pad=0, intermediate_pad=0 to aiter.fused_moe; the plan needs 0, 32 for "
                  "aiter-flydsl", "warning", "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/experts/"
                  "rocm_aiter_moe.py; vllm-project/vllm#44679") in r.warnings
    sgl = build_recipe(plan, "sglang", "0.5.20", alternatives=False)
    assert not any("passes hidden_pad" in w.text for w in sgl.warnings)  # SGLang passes the real differences
    plan_c = _plan("Qwen3-30B-A3B", backends=_builtins_but("aiter-flydsl") + (_fake("aiter-flydsl", "flydsl",
                                                                                     pad("compute")),))
    assert not any("passes hidden_pad" in w.text for w in build_recipe(plan_c, "vllm", V, alternatives=False).warnings)


def test_engine_padding_steps_and_kernel_pads(engines):
    """vLLM's unquantized AITER allocation steps by 64 up to 192/rank and by 128 above; its kernel pads are the
    128-floored hidden pad and the 64-floored intermediate pad (doubled at MoE TP 1), 0 for MiniMax-M3."""
    def lay(i, hidden=2048, tp=8, model_type="qwen3_moe"):
        return MoELayer.build(hidden=hidden, intermediate=i * tp, experts=8, top_k=2, tp=tp, model_type=model_type)

    engines["vllm"]["allocation"].insert(0, dict(_BF16_ALLOC))  # intermediate 0: vLLM's own 64/128 step
    assert engine_padding("vllm", lay(192), "ck", V)[:2] == (2048, 192)
    assert engine_padding("vllm", lay(193), "ck", V)[:2] == (2048, 256)
    assert engine_padding("vllm", lay(130), "triton", V) == (2048, 130, None, None)
    h, i, kh, ki = engine_padding("vllm", lay(160, hidden=2900), "ck", V)
    assert (h, i) == (2944, 192) and (kh, ki) == (0, 0)            # hidden pad 44 → 0, intermediate pad 32 → 0
    engines["vllm"]["allocation"][0]["hidden"] = 512
    h, i, kh, ki = engine_padding("vllm", lay(160, hidden=2944), "ck", V)
    assert (h, kh) == (3072, 128)                                   # hidden pad 128 is passed whole
    h, i, kh, ki = engine_padding("vllm", lay(160, hidden=2304), "ck", V)
    assert (h, kh) == (2560, 256)                                   # and 256
    assert engine_padding("vllm", lay(100, tp=1), "ck", V)[3] == 56 // 64 * 64 * 2
    assert engine_padding("vllm", lay(120, tp=1), "ck", V)[3] == 0
    assert engine_padding("vllm", lay(300, tp=1), "ck", V)[3] == 2 * 64 and lay(300, tp=1).moe_tp == 1
    for mt in ("minimax_m3", "minimax_m3_vl"):
        assert engine_padding("vllm", lay(300, tp=1, model_type=mt), "ck", V)[3] == 0
    engines["sglang"]["allocation"].insert(0, {**_BF16_ALLOC, "versions": ">=0.5"})
    assert engine_padding("sglang", lay(193), "ck", "0.5.20")[2:] == (0, 256 - 193)  # SGLang passes the real pads


# -- the recipe as a whole -------------------------------------------------------------------------------------------

def test_a_release_newer_than_the_data_is_assumed_with_a_derived_warning():
    plan = _plan("Qwen3-30B-A3B")
    r = build_recipe(plan, "vllm", "9.0.0", alternatives=False)
    newest = recipes.engine_data("vllm")["vllm"]["newest"]
    assert r.warnings[len(plan.warnings)] == Reason(
        f"vllm 9.0.0 is newer than the newest release capability_db knows ({newest}): its rules are assumed",
        "warning", None, None, "derived")


def test_layers_without_a_backend_refuse_the_launch():
    plan = _plan("Qwen3-30B-A3B", backends=())
    r = build_recipe(plan, "vllm", V, alternatives=False)
    n = sum(1 for d in plan.decisions if d.layer.kind == "moe")
    assert r.refusals[0] == Reason(f"{n} MoE layer(s) have no correct backend: no launch realizes this plan", "failed")
    assert r.command is None and r.backend is None


def test_plan_warnings_come_first_and_refusals_are_kept_when_every_backend_is_refused(engines):
    engines["vllm"]["issue"] = [{"id": "all", "severity": "error", "message": "nothing runs", "fix": "none",
                                 "source": "o/r#4"}]
    plan = _plan("MiniMax-M3-MXFP4")
    r = build_recipe(plan, "vllm", V, alternatives=False)
    assert r.warnings[:len(plan.warnings)] == list(plan.warnings) and plan.warnings
    assert r.command is None
    candidates = recipes._candidates(plan)
    assert [x.text for x in r.refusals if x.issue == "all"] == [f"{b}: nothing runs — fix: none" for b in candidates]


def test_engine_caveat_rows_apply_on_every_predicate(engines):
    plan = _plan("Qwen3-30B-A3B", tp=8, ep=1)
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    base = {"engine": "vllm"}
    ok = recipes._caveat_applies
    assert ok(base, "vllm", plan, "aiter-ck", moe)
    assert not ok(base, "sglang", plan, "aiter-ck", moe)
    assert ok({**base, "quant": ["bf16"]}, "vllm", plan, "aiter-ck", moe)
    assert not ok({**base, "quant": ["mxfp4"]}, "vllm", plan, "aiter-ck", moe)
    assert not ok({**base, "min_ep": 2}, "vllm", plan, "aiter-ck", moe)
    assert ok({**base, "max_ep": 1}, "vllm", plan, "aiter-ck", moe)
    ep8 = _plan("Qwen3-30B-A3B", tp=8, ep=8)
    assert not ok({**base, "max_ep": 1}, "vllm", ep8, "aiter-ck", moe)
    assert ok({**base, "min_ep": 2}, "vllm", ep8, "aiter-ck", moe)
    assert not ok({**base, "min_ep": 2, "max_ep": 4}, "vllm", ep8, "aiter-ck", moe)
    assert not ok({**base, "models": ["DeepSeek-V3"]}, "vllm", plan, "aiter-ck", moe)
    assert not ok({**base, "model_types": ["deepseek_v3"]}, "vllm", plan, "aiter-ck", moe)
    assert not ok({**base, "gfx": ["gfx942"]}, "vllm", plan, "aiter-ck", moe)
    assert not ok({**base, "when_backends": ["triton"]}, "vllm", plan, "aiter-ck", moe)
    # a caveat row's env, args and note reach the recipe, with its confidence
    engines["caveat"] = [{"engine": "vllm", "quant": ["bf16"], "env": [{"name": "E", "value": "1", "why": "w",
                                                                          "source": "o/r#5"}],
                          "args": [{"arg": "--x", "why": "w", "source": "o/r#5"}], "note": "careful",
                          "source": "o/r#5", "confidence": "derived"}]
    r = build_recipe(plan, "vllm", V, alternatives=False)
    assert {"name": "E", "value": "1", "why": "w", "source": "o/r#5"} in r.env
    assert any(a["arg"] == "--x" for a in r.args) and "--x" in r.command
    assert Reason("careful", "caveat", "o/r#5", None, "derived") in r.caveats
    # the backend rows' own arguments are kept next to the caveat's
    assert len(r.args) > 1


def test_usage_errors_name_the_engine_and_a_valid_version():
    from moedispatch.core.errors import UsageError

    with pytest.raises(UsageError, match=r"^no recipe for engine 'tgi'; known: vllm, sglang$"):
        recipes.engine_data("tgi")
    newest = recipes.engine_data("vllm")["vllm"]["newest"]
    with pytest.raises(UsageError, match=rf"^engine version 'x\.y' is not a PEP 440 version \(e\.g\. {newest}\)$"):
        build_recipe(_plan("Qwen3-30B-A3B"), "vllm", "x.y")
    with pytest.raises(UsageError, match=r"e\.g\. 0\.5\.2"):
        engine_padding("sglang", _QWEN, "ck", "x.y")


def test_alternatives_search_the_nearest_layouts_then_releases_then_the_other_engine(engines):
    """A launch refused at TP 3 (the heads do not divide at any release): the nearest layout that works, tried from
    TP 1 up. A launch refused only by this release: another release, then the other engine."""
    plan = _plan("Qwen3-30B-A3B", target="MI355X", tp=3)
    alts = recipes._alternatives(plan, "vllm", V)
    assert [a["change"] for a in alts] == ["--tp 2"]
    assert alts[0]["engine"] == "vllm" and alts[0]["engine_version"] == V and alts[0]["command"].startswith("vllm")
    assert recipes._alternatives(_plan("Qwen3-30B-A3B", tp=4, ep=4), "vllm", V)[0]["change"] == "--tp 4"
    assert recipes._alternatives(_plan("Qwen3-30B-A3B", tp=1), "vllm", V)[0]["change"] == "--tp 2"
    assert recipes._alternatives(_plan("Qwen3-30B-A3B", tp=2), "vllm", V)[0]["change"] == "--tp 1"
    engines["vllm"]["issue"] = [{"id": "rel", "severity": "error", "message": "m", "fix": "f", "source": "s",
                                 "versions": f"=={V}"}]
    alts = recipes._alternatives(_plan("Qwen3-30B-A3B", tp=8), "vllm", V)
    newest = engines["vllm"]["newest"]
    assert [(a["change"], a["engine_version"]) for a in alts] == [
        (f"--engine-version {newest}", newest), ("--recipe sglang", engines["sglang"]["newest"])]
    engines["vllm"]["issue"][0]["versions"] = f"<={V}"
    older = recipes._alternatives(_plan("Qwen3-30B-A3B", tp=8), "vllm", "0.29.0")
    assert older[0]["change"] == f"--engine-version {newest}"


# -- load-time conversions -------------------------------------------------------------------------------------------

class _FutureCK(Backend):
    """A hypothetical AITER CK MXFP8 kernel on gfx942: a plan for a path the engines convert away."""

    name, preference, family = "aiter-ck", 80, "ck"

    def check(self, layer, caps):
        return Verdict.supported("a future CK MXFP8 kernel")

    def plan_padding(self, layer, caps):
        return Padding.none(layer)


def test_a_load_time_conversion_refuses_the_planned_path_except_sglangs_triton_requantization(engines):
    """vLLM dequantizes MXFP8 experts on gfx942 (ROCm/MAD#201): a CK plan is not what it runs — refused with the
    conversion's text, source and confidence. SGLang re-quantizes them to block-FP8 for its Triton path
    (sgl-project/sglang#32036): that conversion is a caveat on the recipe, not a refusal. The same Triton conversion
    on vLLM would refuse."""
    conv = engines["vllm"]["conversion"][0]
    conv["confidence"] = "derived"
    backends = _builtins_but("aiter-ck") + (_FutureCK(),)
    plan = _plan("MiniMax-M3-MXFP8", target="MI300X", backends=backends)
    r = build_recipe(plan, "vllm", V, alternatives=False)
    why = next(w for w in r.warnings if "does not run aiter-ck here" in w.text)
    assert why.text.endswith(f"Not realizable: aiter-ck: vllm {V} does not run aiter-ck here: {conv['what']}")
    assert (why.source, why.confidence, why.issue) == (conv["source"], "derived", None)
    assert Reason(conv["what"], "caveat", conv["source"], None, "derived") in r.caveats
    sgl_conv = engines["sglang"]["conversion"][0]
    sgl = build_recipe(plan, "sglang", "0.5.20", alternatives=False)
    assert not any("does not run" in w.text for w in sgl.warnings + sgl.refusals)
    # SGLang serves the converted experts: the recipe plans them (block-FP8 on its forced Triton runner) and says so.
    (cav,) = [c for c in sgl.caveats if c.text.startswith(sgl_conv["what"])]
    assert cav.text.endswith("the recipe plans the converted experts (fp8 block128x128) on triton")
    assert cav.source == f"{sgl_conv['source']}; {sgl_conv['to_source']}" and cav.kind == "caveat"
    assert sgl.backend == "triton" and "--moe-runner-backend triton" in sgl.command
    conv["family"] = "triton"
    again = build_recipe(plan, "vllm", V, alternatives=False)
    assert any("does not run aiter-ck here" in w.text for w in again.warnings + again.refusals)


# -- what the plan's AITER dispatch adds ------------------------------------------------------------------------------

def test_the_recipe_exports_the_workaround_env_of_a_kernel_bucket_bug_on_the_chosen_path(monkeypatch, engines):
    """A kernel × bucket bug with a workaround environment (severity error) on the chosen AITER path: the recipe
    exports the workaround with why and source; a warning-severity hit's env is not exported; the plan's own AITER
    environment is exported as what the simulation assumed."""
    import dataclasses

    import moedispatch.aiter.dispatch as ad
    from moedispatch.core.workload import Runtime

    real = ad.plan_dispatch

    def with_hits(*args, **kwargs):
        plan = real(*args, **kwargs)
        step = plan.steps[0]
        hit = dict(bucket=step.bucket, kernel=step.kernels[0], workaround="set it", token_cap=None,
                   confidence="confirmed")
        return dataclasses.replace(plan, issues=(
            ad.IssueHit(issue="t#err", tokens=(3, 4), effect="garbled", workaround_env=(("AITER_FIX", "1"),),
                        source="o/r#7", severity="error", **hit),
            ad.IssueHit(issue="t#warn", tokens=(5, 6), effect="slow", workaround_env=(("AITER_SLOW", "1"),),
                        source="o/r#8", severity="warning", **hit)))

    monkeypatch.setattr(ad, "plan_dispatch", with_hits)
    engines["vllm"]["allocation"].insert(0, dict(_BF16_ALLOC))  # vLLM allocating the AITER plan's 128/rank
    from moedispatch.selector import pure as selector

    selector.clear_cache()
    plan = plan_model(load_model("Qwen3-30B-A3B"), fake_capabilities("MI355X", A3), 8, 1,
                      runtime=Runtime.build((1, 64), env={}, overrides={"AITER_ONLINE_TUNE": "0"}))
    first = next(d for d in plan.decisions if d.layer.kind == "moe")
    assert first.backend.startswith("aiter") and first.dispatch is not None
    r = build_recipe(plan, "vllm", V, alternatives=False, switches=False)
    assert r.backend == first.backend, r.warnings
    env = {e["name"]: e for e in r.env}
    kernel = first.dispatch.steps[0].kernels[0]
    assert env["AITER_FIX"] == {"name": "AITER_FIX", "value": "1", "source": "o/r#7",
                                "why": f"workaround of t#err: without it AITER runs {kernel} for tokens 3–4 (garbled)"}
    assert "AITER_SLOW" not in env
    assert env["AITER_ONLINE_TUNE"]["value"] == "0"
    assert env["AITER_ONLINE_TUNE"]["why"].startswith("the plan's simulation of AITER's dispatch assumed it")
    assert "export AITER_FIX=1" in render_table(plan, r)
    selector.clear_cache()


def render_table(plan, r):
    from moedispatch.engines.recipes import render_recipe

    return render_recipe(plan, r.engine, version=r.version, recipe=r)


def test_a_runtime_plan_with_no_backend_for_some_layer_is_refused_not_crashed():
    from moedispatch.core.workload import Runtime

    plan = plan_model(load_model("Qwen3-30B-A3B"), fake_capabilities("MI355X", A3), 8, 1, backends=(),
                      runtime=Runtime.build((1,), env={}))
    r = build_recipe(plan, "vllm", V)
    assert r.command is None and r.refusals[0].text.endswith("no launch realizes this plan")


def test_the_engines_own_allocation_is_checked_for_known_issues_when_it_differs_from_the_plan():
    """From AITER 0.1.18 the DeepSeek-V4 W4A8 plan runs 384/rank natively on FlyDSL (ROCm/aiter#4130), but vLLM
    0.33.0 still allocates 512 and passes intermediate_pad=128, which FlyDSL stage 1 mishandles (aiter-pr#3538):
    the kernel meets the engine's allocation, so the recipe does not print FlyDSL there. With AITER 0.1.17 the plan
    itself pads to 512 (with kernel pad 0) and the check adds nothing."""
    plan = _plan("DeepSeek-V4-Pro", aiter="0.1.20.post1")
    assert {d.padding.intermediate_per_rank for d in plan.decisions if d.layer.kind == "moe"} == {384}
    r = build_recipe(plan, "vllm", "0.33.0", alternatives=False)
    assert r.ok and r.backend != "aiter-flydsl"
    hit = next(w for w in r.warnings if w.issue == "aiter-pr#3538")
    assert ("Not realizable: aiter-flydsl: at the engine's allocation (7168 × 512, not the plan's 7168 × 384): "
            "[aiter-pr#3538]") in hit.text and hit.kind == "warning"
    old = build_recipe(_plan("DeepSeek-V4-Pro", aiter="0.1.17"), "vllm", "0.33.0", alternatives=False)
    assert not any("at the engine's allocation" in w.text for w in old.warnings + old.refusals)


def test_an_engine_without_the_optional_tables_still_gets_a_recipe(engines):
    """engines.toml requires only the backend rows of an engine (docs/schemas/engines.schema.json): an engine
    release with no allocation, conversion, gate or known-issue rows, and no caveats at all, gets a plain recipe."""
    for engine in ("vllm", "sglang"):
        for table in ("allocation", "conversion", "gate", "issue"):
            engines[engine].pop(table, None)
    engines.pop("caveat", None)
    plan = _plan("Qwen3-30B-A3B")
    for engine, version in (("vllm", V), ("sglang", "0.5.20")):
        r = build_recipe(plan, engine, version)
        assert r.ok and not r.caveats, (engine, r.refusals)
        assert engine_padding(engine, _QWEN, "ck", version)[:2] == (2048, 96)
