"""Boundary cases of the engine rules (moedispatch/engines/recipes.py, moedispatch/engines/choice.py) that the golden
and branch tests leave open: each kills a mutant that survived ``benchmarks/mutation.py`` (issue 23), on a real
model / target / engine release where the line decides the outcome, with the rule's source in the docstring.
"""

from __future__ import annotations

import dataclasses

import pytest

import moedispatch
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.engines import recipes
from moedispatch.kit.rules import IssueOutcome
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"


def _plan(model: str, product: str = "MI355X", aiter: str | None = A20, tp: int = 8, ep: int = 1, **env):
    return moedispatch.plan_model(model, fake_capabilities(product, aiter), tp, ep, aiter_env=env or {})


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def _fields(p: Padding) -> tuple:
    """What the known-issue rules and AITER's dispatch model read of an allocation (not the recorded multiples)."""
    return (p.hidden, p.intermediate_per_rank, p.hidden_pad, p.intermediate_pad, p.kernel_hidden_pad,
            p.kernel_intermediate_pad, p.zero_fill, p.pad_semantics)


# -- recipes._allocation_issues: the allocation the kernel meets is the engine's ---------------------------------------

@pytest.mark.parametrize("model, env, engine, semantics, expected", [
    # DeepSeek-V4-Pro on AITER 0.1.20: the plan runs 7168 × 384 natively (ROCm/aiter#4130); vLLM 0.33.0 allocates 512
    # and passes intermediate_pad=128 (experts/rocm_aiter_moe.py): an intermediate pad only, so it must be zero-filled.
    ("DeepSeek-V4-Pro", {}, "vllm", None, (7168, 512, 0, 128, 0, 128, True, "compute")),
    # gpt-oss-120b: vLLM rounds 2880 × 360 up to 3072 × 512 and hands AITER hidden_pad // 128 * 128 = 128 (< 192) and
    # intermediate_pad // 64 * 64 = 128 (< 152): the kernel pads are the engine's, clamped to what it allocated.
    ("gpt-oss-120b", {}, "vllm", None, (3072, 512, 192, 152, 128, 128, True, "compute")),
    # MiniMax-M3 with GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 keeps 384; SGLang 0.5.23 allocates 512 (AITER_PADDING_SIZE) and
    # passes the difference. A plan whose kernel skips pad granules keeps that reading at the engine's allocation.
    ("MiniMax-M3-MXFP4", {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}, "sglang", "skip",
     (6144, 512, 0, 128, 0, 128, True, "skip")),
])
def test_the_known_issue_rules_and_the_dispatch_meet_the_engines_allocation(monkeypatch, model, env, engine,
                                                                            semantics, expected):
    plan = _plan(model, **env)
    d = _moe(plan)
    if semantics:
        d = dataclasses.replace(d, padding=dataclasses.replace(d.padding, pad_semantics=semantics))
    h, i, kh, ki = recipes.engine_padding(engine, d.layer, d.family)
    seen: dict[str, list[Padding]] = {"issues": [], "dispatch": []}
    real_eval, real_dispatch = recipes.evaluate_issues, recipes.dispatch_for

    def spy_eval(name, layer, caps, padding):
        seen["issues"].append((name, padding))
        return real_eval(name, layer, caps, padding)

    def spy_dispatch(layer, caps, padding, runtime):
        seen["dispatch"].append(padding)
        return real_dispatch(layer, caps, padding, runtime)

    monkeypatch.setattr(recipes, "evaluate_issues", spy_eval)
    monkeypatch.setattr(recipes, "dispatch_for", spy_dispatch)
    recipes._allocation_issues(plan, d, d.backend, h, i, kh, ki)
    assert [(n, _fields(p)) for n, p in seen["issues"]] == [(d.backend, expected)]
    assert [_fields(p) for p in seen["dispatch"]] == [expected]


def _stub_rules(monkeypatch, *, blocking=(), notes=(), dispatched=(), family=((), ()), reasons=()):
    monkeypatch.setattr(recipes, "evaluate_issues", lambda *a: IssueOutcome(tuple(blocking), tuple(notes)))
    monkeypatch.setattr(recipes, "dispatch_for", lambda *a: "dispatch")
    monkeypatch.setattr(recipes, "blocking_reasons", lambda dp: tuple(dispatched))
    monkeypatch.setattr(recipes, "dispatched_family_issues", lambda *a: family)
    monkeypatch.setattr(recipes, "dispatch_reasons", lambda *a: list(reasons))


def test_allocation_issues_are_said_at_the_engines_allocation_and_only_when_the_plan_does_not_meet_them(monkeypatch):
    """_allocation_issues keeps what the engine's allocation meets and the plan does not (an issue the plan already
    names is left out), prefixes where, and turns the kernel's caveats and the dispatch's notes into warnings of the
    recipe; a blocking issue stays a refusal."""
    plan = _plan("DeepSeek-V4-Pro")
    d = _moe(plan)
    d = dataclasses.replace(d, warnings=(*d.warnings, Reason("planned", "warning", None, "P#1")))
    where = "at the engine's allocation (7168 × 512, not the plan's 7168 × 384): "
    _stub_rules(
        monkeypatch,
        blocking=[Reason("wrong", "failed", "s", "A#1"), Reason("already", "failed", "s", "P#1")],
        notes=[Reason("crash at M 1", "caveat", "s", "B#1"), Reason("fyi", "note", "s", "C#1"),
               Reason("nameless", "caveat", "s", None), Reason("planned too", "warning", "s", "P#1"),
               Reason("warned", "warning", "s", "W#1")],
        dispatched=[Reason("bucket 4", "failed", "s", "D#1"), Reason("old", "failed", "s", "P#1")],
        family=((Reason("flydsl pad", "failed", "s", "E#1"),),
                (Reason("flydsl note", "caveat", "s", "F#1"), Reason("known", "caveat", "s", "P#1"))),
        reasons=[Reason("steers", "warning", "s", "G#1"), Reason("plain", "note", "s", "H#1"),
                 Reason("anon", "caveat", "s", None), Reason("again", "warning", "s", "P#1"),
                 Reason("tuned row", "caveat", "s", "K#1")],
    )
    refusals, warnings = recipes._allocation_issues(plan, d, d.backend, 7168, 512, 0, 128)
    assert [(r.text, r.kind, r.issue) for r in refusals] == [
        (where + "wrong", "failed", "A#1"), (where + "bucket 4", "failed", "D#1"),
        (where + "flydsl pad", "failed", "E#1")]
    assert [(r.text, r.kind, r.issue) for r in warnings] == [
        (where + "crash at M 1", "warning", "B#1"), (where + "warned", "warning", "W#1"),
        (where + "flydsl note", "warning", "F#1"),
        (where + "steers", "warning", "G#1"), (where + "tuned row", "warning", "K#1")]


def test_without_a_runtime_only_the_layers_known_issues_are_checked(monkeypatch):
    """AITER's dispatch is simulated only for a plan with a runtime (and a decision that carries its dispatch)."""
    plan = _plan("DeepSeek-V4-Pro")
    d = _moe(plan)
    _stub_rules(monkeypatch, blocking=[Reason("wrong", "failed", "s", "A#1")],
                dispatched=[Reason("bucket 4", "failed", "s", "D#1")])
    for p, dd in ((dataclasses.replace(plan, runtime=None), d), (plan, dataclasses.replace(d, dispatch=None))):
        refusals, _ = recipes._allocation_issues(p, dd, dd.backend, 7168, 512, 0, 128)
        assert [r.issue for r in refusals] == ["A#1"]


def test_a_backend_outside_the_registry_is_checked_under_its_own_name(monkeypatch):
    """A plan may be made with backends that are not registered (plan_model(backends=...)): the rules get the name
    the plan used."""
    plan = _plan("DeepSeek-V4-Pro")
    d = _moe(plan)
    names = []
    monkeypatch.setattr(recipes, "evaluate_issues", lambda name, *a: names.append(name) or IssueOutcome())
    monkeypatch.setattr(recipes, "dispatched_family_issues", lambda *a: (names.append(a[-1]), ((), ()))[1])
    assert recipes._allocation_issues(plan, d, "my-own-ck", 7168, 512, 0, 128) == ([], [])
    assert names == ["my-own-ck", "my-own-ck"]


# -- engines/choice.py: compare_decision / compare_plan ---------------------------------------------------------------


ON = {"VLLM_ROCM_USE_AITER": "1"}


def _compare(model, env=ON, mb="auto", engine="vllm", tp=8, **kw):
    plan = _plan(model, tp=tp)
    return plan, ec.compare_plan(plan, engine, env=env, moe_backend=mb, quant_method=plan.model.quant_method, **kw)


def test_a_refusal_is_the_verdict_with_the_engines_own_message_and_source():
    """vLLM 0.33.0 raises for a --moe-backend its parser accepts but the oracle's map does not know (hpc; oracle/
    unquantized.py map_unquantized_backend): the only reason is the refusal, and compare says so with that source."""
    plan, [c] = _compare("Qwen3-30B-A3B", env={}, mb="hpc")
    assert c["verdict"] == "refused" and c["engine"]["error"].startswith("moe_backend='hpc' is not supported")
    assert c["why_details"][0]["text"] == f"vllm 0.33.0 raises: {c['engine']['error']}"
    assert c["why_details"][0]["source"] == c["engine"]["reason_details"][0]["source"] == \
        "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/unquantized.py"
    d = _moe(plan)
    assert c["moedispatch"] == {"backend": d.backend, "hidden": d.padding.hidden,
                                "intermediate_per_rank": d.padding.intermediate_per_rank}


def test_an_engine_backend_with_no_moedispatch_counterpart_is_different():
    """Kimi-K2.5 (compressed-tensors INT4 W4A16) with --moe-backend marlin: vLLM 0.33.0's WNA16 oracle maps it to
    MARLIN (MarlinExperts, oracle/int_wna16.py), which no moedispatch backend models. (Its auto pick, TRITON —
    TritonWNA16Experts, a TritonExperts — is the triton backend's int4 weight-only path.)"""
    _, [c] = _compare("Kimi-K2.5", mb="marlin")
    assert c["verdict"] == "different"
    assert [(w["text"], w["kind"]) for w in c["why_details"]] == [
        ("moedispatch has no backend matching vllm's MARLIN", "note")]


def test_a_correct_slower_engine_pick_names_the_findings_that_apply_on_this_gpu():
    """MiniMax-M3-MXFP8 with --moe-backend triton: vLLM runs TRITON_MXFP8, correct but outranked; the recorded finding
    S7-S9-P3 (gfx950, MXFP8, AITER_MXFP8/TRITON_MXFP8) applies on the MI355X and says vLLM is right."""
    _, [c] = _compare("MiniMax-M3-MXFP8", mb="triton")
    assert c["verdict"] == "slower" and not c["padding_differs"]
    assert [w["kind"] for w in c["why_details"]] == ["outranked", "note"]
    assert c["why"][1].startswith("[S7-S9-P3-mxfp8-aiter] vllm 0.33.0 is right: ")


def test_a_finding_on_moedispatchs_side_says_so():
    """A [[finding]] with side = "moedispatch" reads "moedispatch is right" (P1-fp8-no-round-up), "open" reads
    "unresolved", and any other side names the engine release."""
    plan = _plan("DeepSeek-V3")
    d = _moe(plan)
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, quant_method="fp8")
    assert c.backend == "AITER" and (c.hidden, c.intermediate_per_rank) == (7168, 256)
    padded = dataclasses.replace(d, padding=dataclasses.replace(d.padding, intermediate_per_rank=512,
                                                                intermediate_pad=256))
    out = ec.compare_decision(padded, c, quant_method="fp8")
    assert out["padding_differs"]
    p1 = next(w for w in out["why"] if w.startswith("[P1-fp8-no-round-up]"))
    assert p1.startswith("[P1-fp8-no-round-up] moedispatch is right: ")


def test_same_family_with_another_allocation_cites_the_engines_padding_rule():
    """Same family, other allocation: the padding note carries the source of the engine's padding reason (vLLM's
    oracle/unquantized.py aiter_moe_intermediate_alignment), not of its decision."""
    plan = _plan("Qwen3-30B-A3B", tp=4)
    d = _moe(plan)
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON)
    assert (c.backend, c.intermediate_per_rank) == ("AITER", 192)
    padded = dataclasses.replace(d, padding=dataclasses.replace(d.padding, intermediate_per_rank=256,
                                                                intermediate_pad=64, zero_fill=True))
    out = ec.compare_decision(padded, c)
    assert out["verdict"] == "same" and out["padding_differs"]
    note = next(w for w in out["why_details"] if w["kind"] == "padding")
    assert note["text"] == "vllm allocates 2048 × 192, moedispatch plans 2048 × 256"
    assert note["source"] == next(r.source for r in c.reasons if r.kind == "padding") != c.reasons[0].source


def _named(name, supported):
    class Fake(Backend):
        def check(self, layer, caps):
            return Verdict.supported(f"{name} runs it") if supported else Verdict.unsupported(
                Reason(f"{name} cannot", "failed"), Reason(f"{name} second", "failed"))

        def plan_padding(self, layer, caps):
            return Padding.none(layer)

    Fake.name, Fake.family, Fake.preference = name, name, 50
    return Fake()


@pytest.mark.parametrize("cktile_ok, verdict, why", [
    (True, "slower", ["aiter.fused_moe can run this layer (aiter-cktile) but moedispatch prefers triton"]),
    (False, "wrong", ["aiter-cktile cannot"]),
])
def test_an_aiter_fused_moe_pick_is_judged_by_any_aiter_family_moedispatch_checked(cktile_ok, verdict, why):
    """vLLM's AITER runs aiter.fused_moe, whose own dispatcher picks the kernel family: when moedispatch did not check
    the engine's family itself, any AITER family it checked decides (correct → slower; rejected → wrong, with the
    first failed reason of each)."""
    from moedispatch.plan.plan import plan_model as plan_full
    from moedispatch.selector.plugins import build_registry
    from moedispatch.sources.models import load_model

    triton = build_registry().get("triton")
    plan = plan_full(load_model("Qwen3-30B-A3B"), fake_capabilities("MI355X", A20), 8, 1,
                     backends=(triton, _named("aiter-cktile", cktile_ok)), force="triton")
    d = _moe(plan)
    assert d.backend == "triton" and d.rejection("aiter-ck") is None
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON)
    assert c.family == "aiter-ck"
    out = ec.compare_decision(d, c)
    assert out["verdict"] == verdict and out["why"] == why


def test_the_engines_allocation_is_dispatched_with_aiters_defaults_not_this_shells(monkeypatch):
    """MiniMax-M3-MXFP4 TP8: vLLM 0.33.0 allocates 6144 × 384 (W4A4 aligns to 128), where AITER's default dispatch
    runs CK-Tile stage 2 for decode (ROCm/aiter#5233): wrong. The engine runs with its own AITER environment, so a
    GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 in this shell changes nothing."""
    plan = _plan("MiniMax-M3-MXFP4")
    monkeypatch.setenv("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0")
    [c] = ec.compare_plan(plan, "vllm", env=ON)
    assert c["verdict"] == "wrong" and c["padding_differs"]
    assert c["why_details"][0]["issue"] == "ROCm/aiter#5233"


def test_the_engines_padded_allocation_is_zero_filled():
    """gpt-oss-120b: vLLM allocates 3072 × 512 with torch.zeros (AITER_MXFP4_BF16 round-up, oracle/mxfp4.py), so the
    pad regions AITER's kernels compute over are zeros: no pad-not-zeroed hit at the engine's allocation."""
    plan = _plan("gpt-oss-120b")
    d = _moe(plan)
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, quant_method="mxfp4")
    assert (c.backend, c.hidden, c.intermediate_per_rank) == ("AITER_MXFP4_BF16", 3072, 512)
    assert ec._engine_allocation_hits(d, c) == []


# -- engines/choice.py: _finding_applies on the recorded findings -----------------------------------------------------

def _finding(fid):
    return next(f for f in ec.findings("vllm") if f["id"] == fid)["when"]


def test_each_finding_predicate_is_checked():
    """The [[finding]] predicates of capability_db/engines/vllm.toml, on real layers: engine_backends, padding_differs,
    quant_methods and dims_not_multiple_of each decide."""
    plan = _plan("MiniMax-M3-MXFP4")
    d = _moe(plan)
    w4a4 = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON)
    assert w4a4.backend == "AITER_MXFP4_MXFP4"
    applies = ec._finding_applies
    assert applies(_finding("P2-mxfp4-w4a4-aiter-round-up-128"), d.layer, w4a4, "gfx950", "quark", True)
    assert not applies(_finding("P2-mxfp4-w4a4-aiter-round-up-128"), d.layer, w4a4, "gfx950", "quark", False)
    assert not applies(_finding("S6-mxfp4-w4a16-aiter-triton"), d.layer, w4a4, "gfx950", "quark", True)
    mx8 = _moe(_plan("MiniMax-M3-MXFP8"))
    assert (mx8.layer.hidden, mx8.layer.intermediate_per_rank) == (6144, 384)
    assert not applies(_finding("S8-mxfp8-shard-32"), mx8.layer, w4a4, "gfx950", "quark", False)
    odd = dataclasses.replace(mx8.layer, intermediate_per_rank=400)
    assert applies(_finding("S8-mxfp8-shard-32"), odd, w4a4, "gfx950", "quark", False)
    a16 = _moe(_plan("gpt-oss-120b")).layer
    dsv4 = dataclasses.replace(a16, model_type="deepseek_v4")
    assert applies(_finding("mxfp4-quant-method-dsv4"), dsv4, w4a4, "gfx950", "MXFP4", False)
    assert not applies(_finding("mxfp4-quant-method-dsv4"), dsv4, w4a4, "gfx950", "quark", False)
    assert not applies(_finding("mxfp4-quant-method-dsv4"), a16, w4a4, "gfx950", "mxfp4", False)


# -- engines/choice.py: recipe_engine_groups and render_comparison ---------------------------------------------------

def test_a_recipe_of_an_unmodelled_release_has_no_engine_groups():
    assert ec.recipe_engine_groups(_plan("Qwen3-30B-A3B"), recipes.Recipe("vllm", "0.30.0")) == {
        "engine_auto": None, "engine_forced": None}


def test_a_recipes_forced_backend_and_env_are_what_the_engine_is_compared_with():
    """The vLLM recipe of Kimi-K2.5 passes --moe-backend flydsl (compressed_tensors_moe.py get_moe_method); the
    forced comparison runs vLLM on it with the recipe's environment, the auto one without the flag."""
    plan = _plan("Kimi-K2.5")
    r = recipes.build_recipe(plan, "vllm")
    assert "--moe-backend flydsl" in r.command
    groups = ec.recipe_engine_groups(plan, r)
    assert [g["engine"]["moe_backend"] for g in groups["engine_auto"]] == ["auto"]
    assert [g["engine"]["moe_backend"] for g in groups["engine_forced"]] == ["flydsl"]
    assert [g["engine"]["backend"] for g in groups["engine_forced"]] == ["FLYDSL_W4A16"]


# -- engines/choice.py: the WNA16 oracle, SGLang's runner, vLLM's class checks -------------------------------------


WNA16_SRC = ("vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/int_wna16.py (map_wna16_backend, "
             "select_wna16_moe_backend, _get_priority_backends)")
SGL_BF16_SRC = ("sgl-project/sglang@v0.5.23:python/sglang/srt/layers/quantization/unquant.py "
                "(UnquantizedFusedMoEMethod._aiter_ck_moe_unsupported_reason, create_moe_runner)")


def _caps(gfx):
    return capdb.target_capabilities(gfx, None)


def _kimi_int4(gfx="gfx950", mb="auto", qm="compressed-tensors"):
    """Kimi-K2.5's routed experts: compressed-tensors INT4 group 32, bf16 activations, 7168 × 2048/rank at TP8."""
    return ec.engine_choice("vllm", caps=_caps(gfx), env={}, moe_backend=mb, quant_method=qm, hidden_size=7168,
                            intermediate_size=2048 * 8, tp_size=8, num_experts=384, top_k=8, weight_quant="int4",
                            weight_granularity="group32", activation_quant="bf16")


def _row(c):
    return (c.engine, c.version, c.moe_backend, c.backend, c.family, c.hidden, c.intermediate_per_rank, c.error,
            c.stage, c.kernel_class)


def test_vllm_wna16_flydsl_auto_forced_and_refused():
    """vLLM 0.33.0 on compressed-tensors INT4 W4A16 (compressed_tensors_moe.py get_moe_method; oracle/int_wna16.py):
    --moe-backend flydsl on gfx950 runs the FlyDSL class directly; auto is TRITON (derived: the ROCm priority list);
    a mapped value is forced; anything else raises, saying what FlyDSL needs."""
    fly = _kimi_int4(mb="flydsl")
    assert _row(fly) == ("vllm", "0.33.0", "flydsl", "FLYDSL_W4A16", "aiter-flydsl", 7168, 2048, None, None,
                         "CompressedTensorsW4A16FlydslMoEMethod")
    auto = _kimi_int4()
    assert _row(auto) == ("vllm", "0.33.0", "auto", "TRITON", "triton", 7168, 2048, None, None, "TritonWNA16Experts")
    assert auto.rejected == ()
    assert auto.reasons == (Reason("vLLM 0.33.0 picks TRITON (TritonWNA16Experts; the first backend of the ROCm auto "
                                   "list whose kernels run there)", "decision", WNA16_SRC, None, "derived"),)
    forced = _kimi_int4(mb="triton")
    assert _row(forced) == ("vllm", "0.33.0", "triton", "TRITON", "triton", 7168, 2048, None, None,
                            "TritonWNA16Experts")
    assert forced.reasons == (Reason("vLLM 0.33.0 picks TRITON (forced by --moe-backend triton)", "decision",
                                     WNA16_SRC),)
    expected = "Expected one of ['triton', 'marlin', 'humming', 'flashinfer_trtllm', 'emulation', 'rdna3']."
    aiter = _kimi_int4(mb="aiter")
    msg = (f"moe_backend='aiter' is not supported for WNA16 MoE. {expected} (FlyDSL W4A16 needs --moe-backend flydsl, "
           "compressed-tensors INT4 group 32, gfx950)")
    assert _row(aiter) == ("vllm", "0.33.0", "aiter", None, None, None, None, msg, "select", None)
    assert aiter.reasons == (Reason(f"vLLM 0.33.0 refuses the layer: {msg}", "failed", WNA16_SRC),)
    off = _kimi_int4(gfx="gfx942", mb="flydsl")
    assert off.error == (f"moe_backend='flydsl' is not supported for WNA16 MoE. {expected} (FlyDSL W4A16 needs "
                         "compressed-tensors INT4 group 32 on gfx950)")


def _sglang_bf16(mb, env, i=96, gfx="gfx950"):
    return ec.engine_choice("sglang", caps=_caps(gfx), env=env, moe_backend=mb, hidden_size=2880,
                            intermediate_size=i * 8, tp_size=8, num_experts=128, top_k=8, weight_quant="bf16",
                            activation="silu")


AITER_ON = {"SGLANG_USE_AITER": "1"}


def test_sglang_bf16_runner_falls_back_to_triton_and_says_why():
    """SGLang 0.5.23 (unquant.py _aiter_ck_moe_unsupported_reason): with SGLANG_USE_AITER and an intermediate/rank
    that is not 128-aligned, auto runs TRITON with a warning; --moe-runner-backend aiter raises."""
    auto = _sglang_bf16("auto", AITER_ON)
    assert _row(auto) == ("sglang", "0.5.23", "auto", "TRITON", "triton", 2880, 96, None, None, None)
    assert auto.rejected == (("AITER", "intermediate_size_per_partition=96 is not 128-aligned"),)
    assert auto.reasons[:2] == (
        Reason("SGLang 0.5.23 runs the TRITON MoE runner (--moe-runner-backend auto with SGLANG_USE_AITER=1)",
               "decision", SGL_BF16_SRC),
        Reason("aiter CK fused-MoE does not support this layer: intermediate_size_per_partition=96 is not "
               "128-aligned; using triton MoE runner", "warning", SGL_BF16_SRC))
    plain = _sglang_bf16("auto", {})
    assert plain.reasons[0].text == ("SGLang 0.5.23 runs the TRITON MoE runner (--moe-runner-backend auto without "
                                     "SGLANG_USE_AITER)")
    forced = _sglang_bf16("aiter", AITER_ON)
    msg = ("moe_runner_backend=aiter is not supported: intermediate_size_per_partition=96 is not 128-aligned; use "
           "--moe-runner-backend triton.")
    assert _row(forced) == ("sglang", "0.5.23", "aiter", None, None, None, None, msg, "select", None)
    assert forced.reasons == (Reason(f"SGLang 0.5.23 refuses the layer: {msg}", "failed", SGL_BF16_SRC),)
    bogus = _sglang_bf16("bogus", {})
    assert _row(bogus) == ("sglang", "0.5.23", "bogus", None, None, None, None, "no such runner; got 'bogus'.",
                           "select", None)


def _mxfp8(**params):
    """An MXFP8 SwiGLU-OAI (uninterleaved) layer on gfx950 with AITER on: vLLM's AiterMxfp8Experts takes only alpha
    1.702 / beta 1.0 (experts/aiter_mxfp8_moe.py), else the auto list moves on to TRITON_MXFP8."""
    layer = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=8, tp=8,
                           activation="swigluoai_uninterleave", activation_params=params, weight="mxfp8",
                           act="mxfp8", model_type="minimax_m3")
    return ec.choice_for_layer(layer, _caps("gfx950"), "vllm", env=ON)


def test_vllm_mxfp8_aiter_takes_only_the_hardcoded_swiglu_constants():
    assert _mxfp8().backend == "AITER_MXFP8"                       # no parameters: the defaults, 1.702 and 1.0
    assert _mxfp8(alpha=1.702, beta=1.0).backend == "AITER_MXFP8"
    for alpha, beta in ((1.702, 0.5), (1.0, 1.0)):
        c = _mxfp8(alpha=alpha, beta=beta)
        assert c.backend == "TRITON_MXFP8"
        assert c.rejected == (("AITER_MXFP8", f"kernel hardcodes SwiGLU-OAI with alpha=1.702 and beta=1.0; got "
                                              f"swiglu_alpha={alpha} and swiglu_beta={beta}"),)


def test_vllm_triton_refuses_more_than_1023_padded_experts():
    """TritonExperts' moe_align_block_size takes fewer than 1024 padded experts (max_padded_experts = 1023)."""
    def bf16(experts):
        return ec.engine_choice("vllm", caps=_caps("gfx950"), env={}, hidden_size=2048, intermediate_size=768 * 8,
                                tp_size=8, num_experts=experts, top_k=8, weight_quant="bf16")
    assert bf16(992).backend == "TRITON"
    big = bf16(1000)
    assert big.error and ("TRITON", "kernel's moe_align_block_size requires fewer than 1024 padded experts") in \
        big.rejected


def test_explains_engine_lines():
    """render_comparison (explain's table): one line per MoE group — engine release, flag, environment (sorted), what
    the engine runs or raises, the verdict — then the reasons."""
    plan = _plan("Qwen3-30B-A3B")
    bogus = ec.render_comparison(ec.compare_plan(plan, "vllm", env={}, moe_backend="hpc"))
    expected = ("moe_backend='hpc' is not supported for unquantized MoE. Expected one of ['triton', "
                "'batched_triton', 'aiter', 'flashinfer_trtllm', 'flashinfer_cutlass'].")
    assert bogus == [f"engine  layers 0–47: vllm 0.33.0 --moe-backend hpc (default environment) → raises at select: "
                     f"{expected} — REFUSED by the engine",
                     f"        vllm 0.33.0 raises: {expected} "
                     "(vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/unquantized.py)"]
    env = {"VLLM_ROCM_USE_AITER_MOE": "1", "VLLM_ROCM_USE_AITER": "1"}
    assert ec.render_comparison(ec.compare_plan(plan, "vllm", env=env), env=env) == [
        "engine  layers 0–47: vllm 0.33.0 --moe-backend auto (VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1) → "
        "AITER (aiter-ck), allocates 2048 × 128/rank — same kernel family as moedispatch"]
    kimi = ec.render_comparison(ec.compare_plan(_plan("Kimi-K2.5"), "vllm"))
    assert kimi == ["engine  layers 1–60: vllm 0.33.0 --moe-backend auto (default environment) → TRITON (triton), "
                    "allocates 7168 × 256/rank — correct, but moedispatch prefers another",
                    "        triton is correct for this layer but moedispatch prefers aiter-flydsl"]
    m3 = ec.render_comparison(ec.compare_plan(_plan("MiniMax-M3-MXFP4"), "vllm", env=ON), env=ON)
    assert m3[0] == ("engine  layers 3–59: vllm 0.33.0 --moe-backend auto (VLLM_ROCM_USE_AITER=1) → AITER_MXFP4_MXFP4 "
                     "(aiter-ck), allocates 6144 × 384/rank — WRONG for this layer per moedispatch; padding differs")
    sgl = ec.render_comparison(ec.compare_plan(_plan("MiniMax-M3-MXFP8"), "sglang", env=AITER_ON))
    assert sgl == ["engine  layers 3–59: engine_choice: the SGLang 0.5.23 model covers bf16, FP8 and Quark MXFP4 W4A4 "
                   "MoE layers, not mxfp8"]
    fp8 = ec.compare_plan(_plan("Qwen3-30B-A3B"), "sglang", env=AITER_ON, moe_backend="triton")
    assert ec.render_comparison(fp8)[0].startswith(
        "engine  layers 0–47: sglang 0.5.23 --moe-runner-backend triton (default environment) → TRITON (triton)")


def _vllm_layer(gfx="gfx950", env=ON, mb="auto", aiter=None, **q):
    caps = _caps(gfx) if aiter is None else dataclasses.replace(_caps(gfx), aiter_version=aiter)
    return ec.engine_choice("vllm", caps=caps, env=env, moe_backend=mb, hidden_size=2048,
                            intermediate_size=768 * 8, tp_size=8, num_experts=128, top_k=8, **q)


def test_vllm_reads_humming_and_marlin_as_auto_for_unquantized_experts():
    """oracle/unquantized.py: --moe-backend marlin/humming on an unquantized layer is the auto selection
    ([oracle.unquantized] as_auto), not a forced backend that the map would refuse."""
    c = _vllm_layer(env={}, mb="marlin", weight_quant="bf16")
    assert (c.backend, c.error, c.moe_backend) == ("TRITON", None, "marlin")
    assert c.reasons[0].text == ("vLLM 0.33.0 picks TRITON (TritonExperts; first backend of the auto list that accepts "
                                 "the layer)")


def test_vllm_runs_per_channel_fp8_on_aiters_channel_class():
    c = _vllm_layer(weight_quant="fp8", weight_granularity="channel", activation_quant="fp8")
    assert (c.backend, c.kernel_class) == ("AITER", "AiterFp8ChannelExperts")


@pytest.mark.parametrize("aiter, backend", [("0.1.14", "AITER_MXFP8"), ("0.1.13", "TRITON_MXFP8")])
def test_vllm_mxfp8_aiter_needs_aiters_gate_mode_from_0_1_14(aiter, backend):
    """AiterMxfp8Experts needs fused_moe_supports_gate_mode (AITER >= 0.1.14, experts/aiter_mxfp8_moe.py)."""
    c = _vllm_layer(aiter=aiter, weight_quant="mxfp8", activation_quant="mxfp8")
    assert c.backend == backend


def test_the_forced_comparison_runs_with_the_recipes_environment():
    """Qwen3-30B-A3B on vLLM: the recipe passes --moe-backend aiter and exports VLLM_ROCM_USE_AITER=1; AITER's experts
    need that switch (rocm_aiter_ops.is_fused_moe_enabled), so the forced comparison accepts the layer."""
    plan = _plan("Qwen3-30B-A3B")
    r = recipes.build_recipe(plan, "vllm")
    assert "--moe-backend aiter" in r.command and {"name": "VLLM_ROCM_USE_AITER", "value": "1"}.items() <= \
        next(e for e in r.env if e["name"] == "VLLM_ROCM_USE_AITER").items()
    forced = ec.recipe_engine_groups(plan, r)["engine_forced"]
    assert [(g["engine"]["moe_backend"], g["engine"]["backend"], g["engine"]["error"]) for g in forced] == [
        ("aiter", "AITER", None)]


def _fp8_block(h, inter, tp, mb, env=ON, gran="block128x128"):
    return ec.engine_choice("vllm", caps=_caps("gfx950"), env=env, moe_backend=mb, hidden_size=h,
                            intermediate_size=inter, tp_size=tp, num_experts=128, top_k=8, weight_quant="fp8",
                            weight_granularity=gran, activation_quant="fp8", activation_granularity="group128")


def test_vllm_fp8_block_shards_refine_pad_or_raise():
    """oracle/fp8.py (refine_fp8_moe_block_shape, pad_tp_shard_to_weight_blocks) on 128x128 FP8 blocks whose TP shard
    (96) is not a whole block: a forced Triton takes the refined 32x32 scales; a forced AITER pads the shard to 128
    when the global dimensions are 128-aligned and raises when the hidden size (2880) is not; at TP 1 there is no
    shard to pad, so AITER meets the refined scales and refuses them."""
    tri = _fp8_block(2880, 768, 8, "triton")
    assert (tri.backend, tri.intermediate_per_rank, tri.error) == ("TRITON", 96, None)
    assert tri.reasons[1].text == ("vLLM refines the 128x128 FP8 scale blocks to 32x32 to fit intermediate/rank 96; "
                                   "only Triton takes refined blocks")
    padded = _fp8_block(3072, 768, 8, "aiter")
    assert (padded.backend, padded.intermediate_per_rank) == ("AITER", 128)
    assert padded.reasons[1] == Reason("vLLM pads the TP shard to whole 128-blocks for the forced backend (96 → 128)",
                                       "padding", "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/"
                                       "oracle/fp8.py")
    raised = _fp8_block(2880, 768, 8, "aiter")
    assert raised.error == ("Block-aligned FP8 TP sharding requires 128-aligned global expert dimensions, pure TP, and "
                            "no LoRA or expert bias.")
    tp1 = _fp8_block(2880, 96, 1, "aiter")
    assert tp1.error == ("FP8 MoE backend AITER does not support the deployment configuration since kernel does not "
                         "support quantization scheme fp8_block_refined.")


def test_vllm_fp8_other_block_shapes():
    """Blocks other than 128x128 are 'refined' blocks only Triton takes; the refined size is the gcd of both block
    sides, the shard and the hidden size (32x128 blocks, shard 192 → 32x32)."""
    sq = _fp8_block(2048, 768 * 8, 8, "auto", env={}, gran="block64x64")
    assert (sq.backend, sq.error) == ("TRITON", None)
    odd = _fp8_block(7168, 192 * 8, 8, "auto", env={}, gran="block32x128")
    assert odd.reasons[1].text.startswith("vLLM refines the 32x128 FP8 scale blocks to 32x32 to fit")


def test_vllm_quark_mxfp8_refuses_an_expert_bias():
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env=ON, hidden_size=6144, intermediate_size=384 * 8,
                         tp_size=8, num_experts=128, top_k=8, weight_quant="mxfp8", activation_quant="mxfp8",
                         has_bias=True)
    assert c.error == "Quark MXFP8 MoE does not support biases."
    assert c.reasons[0].source == ec._data("vllm", None)[1]["padding"]["mxfp8"]["source"]


def _mxfp4_a16(mb, qm, model_type="deepseek_v4", ep=1, env=ON):
    return ec.engine_choice("vllm", caps=_caps("gfx950"), env=env, moe_backend=mb, quant_method=qm, hidden_size=7168,
                            intermediate_size=3072 * 8, tp_size=8, ep_size=ep, num_experts=256, top_k=8,
                            weight_quant="mxfp4", activation_quant="bf16", model_type=model_type)


def test_vllm_mxfp4_refusals_name_the_oracle_and_unmodelled_backends():
    """A DeepSeek-V4-style MXFP4 W4A16 checkpoint (quant_method mxfp4) goes through
    select_deepseek_v4_mxfp4_moe_backend, whose refusal names MXFP4 (oracle/mxfp4.py); a backend of the map with no
    ROCm kernel (MARLIN) is rejected as 'not a ROCm backend', not a crash."""
    bogus = _mxfp4_a16("hpc", "mxfp4")   # a --moe-backend value the parser accepts, absent from the MXFP4 map
    assert bogus.error.startswith("moe_backend='hpc' is not supported for mxfp4 MoE. Expected one of ")
    marlin = _mxfp4_a16("marlin", "quark")
    assert marlin.error == ("MXFP4 MoE backend MARLIN does not support the deployment configuration since kernel "
                            "does not support current device (not a ROCm backend).")


def test_vllm_says_expert_parallelism_is_not_modelled():
    c = _mxfp4_a16("auto", "quark", ep=8)
    caveat = next(r for r in c.reasons if r.kind == "caveat")
    assert caveat == Reason("expert parallelism is not modelled: vLLM's all-to-all backend and DP change which classes "
                            "accept the layer (the AITER Triton monolithic kernels refuse all-to-all); this is the "
                            "TP-only answer", "caveat",
                            "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py", None,
                            "derived")


# -- survivors of a second random 5% sample of engines/choice.py and engines/recipes.py (issue 23) --------------------


def test_the_engines_allocation_hit_cites_the_kernels_issue():
    """The wrong-kernel hit at the engine's allocation (MiniMax-M3-MXFP4 TP8, vLLM 6144 × 384, ROCm/aiter#5233) carries
    the source of the AITER issue that records it, so a reader can check the claim."""
    _, [c] = _compare("MiniMax-M3-MXFP4")
    hit = c["why_details"][0]
    assert (hit["issue"], hit["source"]) == ("ROCm/aiter#5233", "https://github.com/ROCm/aiter/issues/5233")


def test_a_gfx_bound_finding_does_not_apply_on_another_gpu():
    """S7-S9-P3 (capability_db/engines/vllm.toml) is about MXFP8 on gfx950 only: on gfx942 it is not said."""
    mx8 = _moe(_plan("MiniMax-M3-MXFP8"))
    c = ec.choice_for_layer(mx8.layer, _caps("gfx950"), "vllm", env=ON)
    assert c.backend == "AITER_MXFP8"
    assert ec._finding_applies(_finding("S7-S9-P3-mxfp8-aiter"), mx8.layer, c, "gfx950", "quark", False)
    assert not ec._finding_applies(_finding("S7-S9-P3-mxfp8-aiter"), mx8.layer, c, "gfx942", "quark", False)


def test_a_findings_confidence_is_carried_into_the_comparison():
    """P1-fp8-no-round-up is recorded with confidence "derived" (capability_db/engines/vllm.toml): the comparison's
    note must not upgrade it to confirmed."""
    plan = _plan("DeepSeek-V3")
    d = _moe(plan)
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, quant_method="fp8")
    padded = dataclasses.replace(d, padding=dataclasses.replace(d.padding, intermediate_per_rank=512,
                                                                intermediate_pad=256))
    out = ec.compare_decision(padded, c, quant_method="fp8")
    p1 = next(w for w in out["why_details"] if w["text"].startswith("[P1-fp8-no-round-up]"))
    assert p1["confidence"] == "derived"


def test_sglang_reads_a_runner_value_with_dashes_as_underscores():
    """The runner value is normalized like vLLM's --moe-backend (dashes are underscores): flashinfer-cutlass and
    flashinfer_cutlass get the same answer, which names the underscore spelling."""
    def bf16(mb):
        return ec.engine_choice("sglang", caps=_caps("gfx950"), env={}, moe_backend=mb, hidden_size=2880,
                                intermediate_size=2880 * 8, tp_size=8, num_experts=128, top_k=4, weight_quant="bf16")
    dashed, plain = bf16("flashinfer-cutlass"), bf16("flashinfer_cutlass")
    assert _row(dashed) == _row(plain) == ("sglang", "0.5.23", "flashinfer_cutlass", None, None, None, None,
                                           "no such runner; got 'flashinfer_cutlass'.", "select", None)


def test_sglang_quark_mxfp4_refuses_any_runner_but_aiter():
    """quark_w4a4_mxfp4_moe.py create_moe_runner: Quark MXFP4 MoE requires the AITER runner; SGLang says so."""
    c = ec.engine_choice("sglang", caps=_caps("gfx950"), env={}, moe_backend="triton", quant_method="quark",
                         hidden_size=6144, intermediate_size=3072, tp_size=8, num_experts=128, top_k=4,
                         weight_quant="mxfp4", activation_quant="mxfp4")
    assert c.error == "Quark MXFP4 MoE currently requires the AITER runner; got 'triton'."


def test_vllm_runs_w4a8_on_aiters_a8w4_triton_kernel():
    """gpt-oss with FP8 activations × MXFP4 weights (W4A8) on gfx950: the mxfp4 oracle keys AITER_MXFP4_FP8 on the
    afp8 activation (act_key), so vLLM 0.33.0 runs AiterW4A8ExpertsMonolithic (experts/aiter_mxfp4_w4a8_moe.py)."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env=ON, quant_method="quark", hidden_size=2880,
                         intermediate_size=2880, tp_size=1, num_experts=128, top_k=4, weight_quant="mxfp4",
                         activation_quant="fp8", activation="swigluoai", model_type="gpt_oss")
    assert (c.backend, c.kernel_class, c.error, c.rejected) == ("AITER_MXFP4_FP8", "AiterW4A8ExpertsMonolithic",
                                                                None, ())


def test_vllm_int8_weight_only_experts_take_the_wna16_oracle():
    """oracle/int_wna16.py serves INT4 and INT8 weight-only experts alike (W8A16 too): auto is TritonWNA16Experts."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env={}, hidden_size=4096, intermediate_size=1536 * 8,
                         tp_size=8, num_experts=128, top_k=8, weight_quant="int8", weight_granularity="channel",
                         activation_quant="bf16")
    assert (c.backend, c.kernel_class, c.error) == ("TRITON", "TritonWNA16Experts", None)


def test_vllm_flydsl_w4a16_refuses_channel_wise_int4_with_its_message():
    """FlyDSL W4A16 needs group 32 (compressed_tensors_moe.py get_moe_method): a per-channel INT4 checkpoint with
    --moe-backend flydsl is refused with vLLM's message, not a crash on the granularity."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env={}, moe_backend="flydsl", quant_method="compressed-tensors",
                         hidden_size=7168, intermediate_size=2048 * 8, tp_size=8, num_experts=384, top_k=8,
                         weight_quant="int4", weight_granularity="channel", activation_quant="bf16")
    assert c.backend is None and c.error.startswith("moe_backend='flydsl' is not supported for WNA16 MoE.")


def test_a_comparison_for_a_patch_release_names_that_release():
    """capability_db/engines/vllm.toml models vLLM >=0.33,<0.34: asked about 0.33.1, the engine's reasons name 0.33.1,
    the release the user runs."""
    _, [c] = _compare("Qwen3-30B-A3B", engine_version="0.33.1")
    assert c["engine"]["engine_version"] == "0.33.1"
    assert c["engine"]["reasons"][0].startswith("vLLM 0.33.1 picks AITER")


def test_a_recipes_engine_groups_use_the_recipes_own_release():
    """recipe_engine_groups compares on the recipe's release (0.33.1 here), both on auto and on the forced value."""
    plan = _plan("Qwen3-30B-A3B")
    r = recipes.build_recipe(plan, "vllm", "0.33.1")
    assert r.ok and r.version == "0.33.1" and "--moe-backend aiter" in r.command
    groups = ec.recipe_engine_groups(plan, r)
    assert [g["engine"]["engine_version"] for g in groups["engine_auto"] + groups["engine_forced"]] == ["0.33.1"] * 2


def test_an_sglang_recipes_forced_runner_is_what_the_engine_is_compared_with():
    """Qwen3-30B-A3B on SGLang 0.5.23: the recipe passes --moe-runner-backend triton (server_args.py), so the forced
    comparison runs SGLang's triton runner."""
    plan = _plan("Qwen3-30B-A3B")
    r = recipes.build_recipe(plan, "sglang")
    assert "--moe-runner-backend triton" in r.command
    forced = ec.recipe_engine_groups(plan, r)["engine_forced"]
    assert [(g["engine"]["moe_backend"], g["engine"]["backend"]) for g in forced] == [("triton", "TRITON")]


def test_a_layout_that_cannot_be_planned_is_skipped_for_the_next_nearest(monkeypatch):
    """_alternatives walks the layouts nearest first; one that cannot be planned is passed over, not the end of the
    search."""
    plan = _plan("Qwen3-30B-A3B")
    real = recipes._replan
    tried = []

    def replan(p, tp, ep):
        tried.append((tp, ep))
        return None if len(tried) == 1 else real(p, tp, ep)

    monkeypatch.setattr(recipes, "_replan", replan)
    alts = recipes._alternatives(plan, "vllm", "0.33.0")
    layout = [a for a in alts if a["change"].startswith("--tp")]
    assert len(tried) >= 2 and len(layout) == 1


def test_a_switch_realized_recipe_keeps_the_release_asked_for():
    """MiniMax-M3-MXFP4 TP8 on vLLM 0.32.0 is realized with GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 (the what-if switch):
    the recipe is still vLLM 0.32.0's."""
    r = recipes.build_recipe(_plan("MiniMax-M3-MXFP4"), "vllm", "0.32.0")
    assert r.ok and r.plan is not None and r.version == "0.32.0"
    assert r.warnings[0].text.startswith("vllm 0.32.0 allocates what AITER runs natively only with "
                                         "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0")


def test_the_recipe_header_says_when_there_is_no_aiter():
    plan = moedispatch.plan_model("Qwen3-30B-A3B", dataclasses.replace(fake_capabilities("MI355X", None),
                                                                       aiter_version=None), 8, 1)
    head = recipes.render_recipe(plan, "vllm").splitlines()[0]
    assert head.startswith("# vllm 0.33.0 recipe for Qwen3-30B-A3B on gfx950 (MI355X), no AITER, tp=8 ep=1")


def test_vllm_fp8_refined_blocks_take_the_gcd_of_both_block_sides():
    """refine_fp8_moe_block_shape (oracle/fp8.py): 128x32 blocks on a 192 shard refine to gcd(128, 32, 192, 7168) = 32,
    not the 64 that block_n alone would allow (block_k 32 would split a 64 block)."""
    c = _fp8_block(7168, 192 * 8, 8, "triton", gran="block128x32")
    assert (c.backend, c.error) == ("TRITON", None)
    assert c.reasons[1].text == ("vLLM refines the 128x32 FP8 scale blocks to 32x32 to fit intermediate/rank 192; "
                                 "only Triton takes refined blocks")


def _aiter_env_layer(gfx, **q):
    return _vllm_layer(gfx=gfx, env=ON, **q)


def test_vllm_says_why_it_tried_aiter_first_with_the_oracles_source():
    """oracle/fp8.py: with VLLM_ROCM_USE_AITER set, vLLM tries AITER before its auto list; the note cites the oracle."""
    c = _aiter_env_layer("gfx950", weight_quant="fp8", weight_granularity="channel", activation_quant="fp8")
    note = next(r for r in c.reasons if r.text == "VLLM_ROCM_USE_AITER is set: vLLM tries AITER first")
    assert (c.backend, note.kind, note.source) == (
        "AITER", "note", "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/fp8.py")


def test_vllm_fp8_with_aiter_forced_on_a_gpu_aiter_cannot_run_raises_on_aiter():
    """oracle/fp8.py raises when VLLM_ROCM_USE_AITER forces AITER and its experts refuse the device (MI250, gfx90a):
    the refusal is AITER's, so the choice names AITER and its family."""
    c = _aiter_env_layer("gfx90a", weight_quant="fp8", weight_granularity="channel", activation_quant="fp8")
    assert (c.backend, c.family, c.stage) == ("AITER", "aiter-ck", "select")
    assert c.error == ("FP8 MoE backend AITER does not support the deployment configuration since kernel does not "
                       "support current device (aiter_moe).")


def test_vllm_unquantized_falls_back_past_aiter_once():
    """oracle/unquantized.py: VLLM_ROCM_USE_AITER on a GPU AITER's experts refuse (gfx90a) warns and falls back to the
    auto list without AITER: AITER is rejected once, TRITON runs."""
    c = _aiter_env_layer("gfx90a", weight_quant="bf16")
    assert (c.backend, c.error) == ("TRITON", None)
    assert c.rejected == (("AITER", "kernel does not support current device (aiter_moe)"),)
    assert [r.kind for r in c.reasons] == ["decision", "warning", "failed"]


@pytest.mark.parametrize("inter, allocated", [(96, 128), (130, 192), (192, 192), (200, 256)])
def test_vllm_aiter_unquantized_rounds_the_shard_up_to_64_then_128(inter, allocated):
    """oracle/unquantized.py aiter_moe_intermediate_alignment: AITER's unquantized experts get intermediate/rank rounded
    up to a multiple of 64 up to 192, of 128 above: each shard lands on the next multiple, never below its size."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env=ON, hidden_size=2048, intermediate_size=inter, tp_size=1,
                         num_experts=128, top_k=8, weight_quant="bf16")
    assert (c.backend, c.hidden, c.intermediate_per_rank) == ("AITER", 2048, allocated)


def test_vllm_fp8_refuses_a_shard_that_is_not_a_whole_block_k():
    """Fp8MoEMethod.create_weights (oracle/fp8.py): 32x128 blocks on a 96 shard with a hidden size of fewer than five
    factors of 2 cannot be refined to 32 (gcd 8), so the down projection's input (96) is not a whole block_k (128):
    vLLM raises at weight creation, on the backend it chose."""
    c = _fp8_block(7000, 96 * 8, 8, "auto", env={}, gran="block32x128")
    assert (c.backend, c.stage) == ("TRITON", "create_weights")
    assert c.error == "The input_size of down's weight = 96 is not divisible by weight quantization block_k = 128."


def test_a_dense_layer_has_no_engine_choice():
    plan = _plan("DeepSeek-V3")
    dense = next(d for d in plan.decisions if d.layer.kind != "moe")
    with pytest.raises(moedispatch.UsageError, match=r"^engine_choice: the layer is dense \(no MoE backend\)$"):
        ec.choice_for_layer(dense.layer, plan.caps, "vllm")


def test_a_launch_is_named_after_the_family_aiter_runs_there():
    """gpt-oss-120b TP8 on vLLM 0.33.0: the plan's first choice is aiter-flydsl, but at vLLM's allocation AITER's
    dispatcher runs CK-Tile at every bucket; aiter-cktile is realized with the same arguments, so the recipe is named
    after it and says so (issue 23: no recipe names a family the engine cannot make AITER run)."""
    r = recipes.build_recipe(_plan("gpt-oss-120b"), "vllm")
    assert r.ok and r.backend == "aiter-cktile"
    assert [x["families"] for x in r.runs] == [["cktile"]]
    assert Reason("the launch is aiter.fused_moe; AITER runs cktile there, not flydsl: named aiter-cktile (moedispatch "
                  "checked aiter-flydsl and aiter-cktile for it; both hold)", "note") in r.warnings


@pytest.mark.parametrize("model, tp, engine, runs, backend", [
    # AITER runs ASM for Llama-4-Maverick FP8 at vLLM's allocation; the plan has no aiter-asm candidate to name.
    ("Llama-4-Maverick-17B-128E-Instruct-FP8", 8, "vllm", "asm", "aiter-ck"),
    # MiniMax-M2.5-MXFP4 TP4 on SGLang: AITER runs FlyDSL, but no FlyDSL backend of the plan is realized by SGLang with
    # the recipe's arguments and environment, so the name stays and a warning says what runs.
    ("MiniMax-M2.5-MXFP4", 4, "sglang", "flydsl", "aiter-ck"),
])
def test_a_launch_named_after_a_family_aiter_does_not_run_says_so(model, tp, engine, runs, backend):
    r = recipes.build_recipe(_plan(model, tp=tp), engine)
    assert r.ok and r.backend == backend
    fam = backend.removeprefix("aiter-")
    assert Reason(f"the launch is aiter.fused_moe: at {engine}'s allocation AITER runs {runs}, not {fam}; '{backend}' "
                  "names the family whose rules moedispatch checked the allocation against", "warning") in r.warnings


def test_a_launch_keeps_its_name_when_its_family_runs_one_stage():
    """Kimi-K2.5-MXFP4 TP8 on vLLM: at some buckets AITER runs FlyDSL stage 1 with CK stage 2 ("flydsl+ck"), so CK
    does run there: the aiter-ck launch keeps its name and needs no note about what runs."""
    r = recipes.build_recipe(_plan("Kimi-K2.5-MXFP4"), "vllm")
    assert r.ok and r.backend == "aiter-ck"
    assert "flydsl+ck" in [f for x in r.runs for f in x["families"]]
    assert not [w for w in r.warnings if w.text.startswith("the launch is aiter.fused_moe")]


def test_sglangs_gfx942_mxfp8_conversion_plans_dynamic_block_fp8_activations():
    """SGLang re-quantizes MXFP8 experts to block-FP8 at load on gfx942 (sgl-project/sglang#32036); its block-FP8 MoE
    path quantizes activations per 128-element token group at run time (capability_db/engines.toml `to`): the plan of
    the converted experts has dynamic fp8/group128 activations, not stored scales."""
    plan = _plan("MiniMax-M3-MXFP8", product="MI300X")
    converted, conv = recipes.converted_plan(plan, "sglang")
    layer = _moe(converted).layer
    assert (layer.weight.describe(), layer.act.describe()) == ("fp8/block128x128", "fp8/group128 dynamic")
    assert conv["family"] == "triton"


def test_sglang_bf16_aiter_on_gfx950_refuses_swiglu_oai_and_says_why():
    """unquant.py _aiter_ck_moe_unsupported_reason: on gfx950 the aiter CK bf16 kernels do not implement SwiGLU-OAI
    (gemm1_alpha / gemm1_clamp_limit), so auto with SGLANG_USE_AITER runs Triton and warns with that reason."""
    c = ec.engine_choice("sglang", caps=_caps("gfx950"), env=AITER_ON, hidden_size=2880, intermediate_size=128 * 8,
                         tp_size=8, num_experts=128, top_k=4, weight_quant="bf16", activation="swigluoai")
    why = ("activation=swiglu with gemm1_alpha / gemm1_clamp_limit (SwiGLU-OAI) is not implemented by the aiter CK "
           "bf16 fused-MoE kernels")
    assert (c.backend, c.rejected) == ("TRITON", (("AITER", why),))
    assert c.reasons[1] == Reason(f"aiter CK fused-MoE does not support this layer: {why}; using triton MoE runner",
                                  "warning", SGL_BF16_SRC)


@pytest.mark.parametrize("tp, refined", [(1, False), (2, True)])
def test_vllm_fp8_blocks_are_refined_for_block_k_only_when_the_shard_is_split(tp, refined):
    """oracle/fp8.py: a shard must be a whole block_n, and a whole block_k only when TP splits the down projection's
    input. 64x128 blocks with intermediate/rank 192: whole at TP 1 (nothing refined), refined to 64x64 at TP 2."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env={}, moe_backend="triton", hidden_size=2048,
                         intermediate_size=192 * tp, tp_size=tp, num_experts=128, top_k=8, weight_quant="fp8",
                         weight_granularity="block64x128", activation_quant="fp8", activation_granularity="group128")
    assert (c.backend, c.error, c.intermediate_per_rank) == ("TRITON", None, 192)
    note = ("vLLM refines the 64x128 FP8 scale blocks to 64x64 to fit intermediate/rank 192; only Triton takes refined "
            "blocks")
    assert (note in [r.text for r in c.reasons]) is refined


@pytest.mark.parametrize("gfx, mb, backend, allocated", [
    ("gfx950", "triton_unfused", "TRITON_UNFUSED", (3072, 512)),     # CDNA4: 256/256
    ("gfx942", "triton_unfused", "TRITON_UNFUSED", (2944, 384)),     # TRITON_UNFUSED with SiLU off CDNA4: 128/128
    ("gfx950", "aiter", "AITER_MXFP4_BF16", (2944, 384)),            # AITER W4A16 with SiLU: 128/128
    ("gfx942", "aiter", "AITER_TRITON_MXFP4_BF16", (3072, 512)),     # everything else: 256/256
])
def test_vllm_mxfp4_round_up_sees_the_backend_the_activation_and_cdna4(gfx, mb, backend, allocated):
    """mxfp4_round_up_hidden_size_and_intermediate_size (oracle/mxfp4.py), for a Mxfp4Config checkpoint whose method
    passes the activation (quantization/mxfp4.py): SiLU W4A16 on AITER, and TRITON_UNFUSED off CDNA4, align to 128;
    the rest to 256. A 2880 × 360/rank SiLU layer shows each."""
    c = ec.engine_choice("vllm", caps=_caps(gfx), env=ON, moe_backend=mb, quant_method="mxfp4", hidden_size=2880,
                         intermediate_size=360 * 8, tp_size=8, num_experts=256, top_k=8, weight_quant="mxfp4",
                         activation_quant="bf16", activation="silu", model_type="deepseek_v4")
    assert (c.backend, c.error, (c.hidden, c.intermediate_per_rank)) == (backend, None, allocated)


def test_vllm_fp8_forced_aiter_on_a_whole_block_shard_pads_nothing():
    """oracle/fp8.py pads the TP shard only when it is not a whole 128-block: DeepSeek-V3's 7168 × 256/rank at TP8 with
    --moe-backend aiter is taken as it is (no shard padding)."""
    c = _fp8_block(7168, 256 * 8, 8, "aiter")
    assert (c.backend, c.error, c.intermediate_per_rank) == ("AITER", None, 256)
    assert [r.kind for r in c.reasons] == ["decision", "padding"]
    assert not [r for r in c.reasons if "pads the TP shard" in r.text]


def test_a_converted_plans_recipe_keeps_the_callers_warnings():
    """The plan of the experts SGLang converts at load (MXFP8 → block FP8 on gfx942) carries the caller's warnings (a
    guessed target, the installed AITER): the recipe still says them."""
    from moedispatch.plan.plan import plan_model as plan_full
    from moedispatch.sources.models import load_model

    said = Reason("the target was guessed from the product name", "warning")
    plan = plan_full(load_model("MiniMax-M3-MXFP8"), fake_capabilities("MI300X", A20), 8, 1, warnings=[said])
    assert said in plan.warnings and recipes.converted_plan(plan, "sglang") is not None
    r = recipes.build_recipe(plan, "sglang")
    assert said in r.warnings


# -- survivors of the sampled full-scope mutation run (benchmarks/mutation.py --sample 0.03 --seed 7) -----------------

def test_vllm_aiter_moe_switch_without_the_master_switch_drops_aiter_instead_of_raising():
    """oracle/fp8.py: VLLM_ROCM_USE_AITER_MOE=1 with VLLM_ROCM_USE_AITER=0 does not put AITER first (both must be on),
    so the FP8 oracle walks its auto list without AITER rather than raising on AITER's refusal."""
    c = _fp8_block(3072, 1536, 8, "auto", env={"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_USE_AITER_MOE": "1"})
    assert c.ok and c.backend != "AITER"
    assert not any("tries AITER first" in r.text for r in c.reasons)


def test_sglang_forced_runner_says_the_flag_alone():
    """The decision line of a forced SGLang runner names the flag alone; SGLANG_USE_AITER is said only for auto."""
    kw = dict(caps=_caps("gfx950"), hidden_size=2048, intermediate_size=768, tp_size=1, num_experts=128, top_k=8)
    forced = ec.engine_choice("sglang", moe_backend="triton", **kw)
    assert forced.reasons[0].text.endswith("MoE runner (--moe-runner-backend triton)"), forced.reasons[0].text
    auto = ec.engine_choice("sglang", moe_backend="auto", **kw)
    assert "SGLANG_USE_AITER" in auto.reasons[0].text
