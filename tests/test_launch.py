"""Issue 23: the decision is a launch the engine can make — padding from the kernels AITER's dispatcher runs, the
launch named after a family AITER runs, the engine flag from the release's per-quant-method map, caveats scoped to
what they are about, no emulation recipe while a native launch exists. Each rule pinned on its motivating case and
at its boundary (if the line that decides it breaks, a test here goes red).
"""

from __future__ import annotations

import pytest

from moedispatch import plan_model
from moedispatch.aiter import dispatch as ad
from moedispatch.aiter.activation import acting_env
from moedispatch.aiter.flydsl import FLYDSL_TILE_SOURCE, tile_misfit
from moedispatch.aiter.key import dispatch_key
from moedispatch.aiter.vocab import FP4, FP8, SILU, SWIGLU
from moedispatch.core.backend import Padding
from moedispatch.core.workload import Runtime
from moedispatch.engines import choice as ec
from moedispatch.engines.recipes import build_recipe
from moedispatch.plan.plan import plan_model as plan_full
from moedispatch.selector import runtime as rt
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def _plan(model: str, product: str = "MI355X", aiter: str | None = A20, tp: int = 8, ep: int = 1, **env):
    return plan_model(model, fake_capabilities(product, aiter), tp, ep, aiter_env=env or {})


def _texts(d) -> list[str]:
    return [r.text for r in d.reasons]


# -- FlyDSL's tile rule (AITER's own moe_kernels.py) ---------------------------------------------------------------

@pytest.mark.parametrize("name, inter, model_dim, version, problem", [
    # stage 2 tiles K = inter_dim: 256 does not divide 384 before 0.1.19 …
    ("flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic", 384, 6144, "0.1.18", "stage-2 tile_k 256"),
    # … from 0.1.19 AITER downgrades it to 128 (resolve_flydsl_stage2_tile_k): runs
    ("flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic", 384, 6144, "0.1.19", None),
    # 128 divides 128: runs everywhere
    ("flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic", 128, 6144, "0.1.16.post1", None),
    # 64 is not a multiple of 128: even 0.1.19's downgrade cannot fix it
    ("flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic", 64, 6144, A20, "stage-2 tile_k 128"),
    # stage 1 N over inter_dim matters for a16w4/a8w4 only ("a4w4 is unaffected")
    ("flydsl_moe1_abf16_wfp4_bf16_t32x256x256_w2", 384, 6144, "0.1.18", "stage-1 tile_n 256"),
    ("flydsl_moe1_afp4_wfp4_bf16_t32x256x256_w2", 384, 6144, "0.1.18", None),
    # a gate/up-interleaved stage 1 tiles both halves: 2 × 384 = 768 is a multiple of 256 (AITER tuned it there)
    ("flydsl_moe1_afp8_wfp4_bf16_t64x256x256_gui_fp8", 384, 7168, "0.1.18", None),
    # model_dim must be divided by stage 1's K tile
    ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2", 256, 2880, A20, "stage-1 tile_k 256 does not divide model_dim"),
    # not a FlyDSL kernel: no opinion
    ("cktile_moe_stage1 (default)", 384, 6144, "0.1.18", None),
])
def test_flydsl_tile_rule(name, inter, model_dim, version, problem):
    got, _ = tile_misfit(name, inter, model_dim, version)
    assert (got is None) == (problem is None), got
    if problem:
        assert problem in got


def test_the_0_1_19_downgrade_is_said():
    problem, note = tile_misfit("flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic", 384, 6144, "0.1.19")
    assert problem is None and "runs it with tile_k 128" in note


def test_a_misfit_tile_is_a_blocking_dispatch_hit():
    caps = fake_capabilities("MI355X", A20)
    layer = next(x for x in expand_layers(load_model("GLM-5.1-MXFP4"), 32, 1) if x.kind == "moe")  # 64/rank
    dp = ad.plan_dispatch(layer, caps, tokens=(1, 8192), env={})
    hits = [h for h in dp.issues if h.issue == "flydsl-tile"]
    assert hits and all(h.blocking for h in hits) and "inter_dim 64" in hits[0].effect
    assert FLYDSL_TILE_SOURCE in hits[0].source
    padded = Padding.aligned(layer, intermediate_multiple=128)
    assert not [h for h in ad.plan_dispatch(layer, caps, tokens=(1, 8192), env={}, padding=padded).issues
                if h.issue == "flydsl-tile"]


# -- padding is the least allocation every dispatched kernel tiles ---------------------------------------------------

def test_glm51_mxfp4_tp16_runs_128_per_rank_on_aiter():
    """Done when: GLM-5.1-MXFP4 at TP16 on MI355X plans 128/rank on AITER (AITER's FlyDSL heuristic tiles 128 there,
    not the family table's 256)."""
    d = _moe(_plan("GLM-5.1-MXFP4", tp=16))
    assert d.backend == "aiter-flydsl" and not d.padding.padded and d.padding.intermediate_per_rank == 128
    assert {s.family for s in d.dispatch.steps} == {"flydsl"}
    note = next(t for t in _texts(d) if t.startswith("no padding (not the family table's 6144 × 256)"))
    assert "stage-2 tile_k 128" in note


def test_glm51_mxfp4_tp16_before_the_128_tile_keeps_the_table():
    """v0.1.15.post3's FlyDSL heuristic tiles stage 2 by 256: 128 would read out of bounds, so the table's 256 holds."""
    d = _moe(_plan("GLM-5.1-MXFP4", aiter="0.1.15.post3", tp=16))
    assert d.padding.intermediate_per_rank == 256


def test_glm51_tp32_pads_64_to_128_not_256():
    d = _moe(_plan("GLM-5.1-MXFP4", tp=32))
    assert d.padding.intermediate_per_rank == 128
    assert any(t.startswith("allocate 6144 × 128/rank (not the family table's 6144 × 256)") for t in _texts(d))


def test_minimax_m3_tp8_default_plan_names_aiter_5233_and_the_switch_that_keeps_384():
    """Done when: the default plan pads 384 → 512 because decode would run CK-Tile heuristics at 384 (aiter#5233),
    says so, and names the switch under which AITER runs 384 correctly."""
    d = _moe(_plan("MiniMax-M3-MXFP4"))
    assert d.padding.intermediate_per_rank == 512
    note = next(t for t in _texts(d) if t.startswith("padded to 6144 × 512/rank, not 6144 × 384"))
    assert "ROCm/aiter#5233" in note and "cktile" in note
    assert "with GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 AITER runs 384/rank correctly at every bucket" in note
    kept = _moe(_plan("MiniMax-M3-MXFP4", GPTOSS_SWIGLU_MXFP4_BF16_BOUND="0"))
    assert kept.padding.intermediate_per_rank == 384 and not kept.padding.padded


def test_dsv4_w4a8_before_0_1_18_pads_for_the_scale_shuffle():
    """ROCm/aiter#4130 (v0.1.18) taught shuffle_scale K/32 not divisible by 8: before it, a8w4 at 384 is refused by the
    dispatch model (as data: dispatch_issues.toml), so the dispatch-derived search cannot drop the table's 512."""
    old = _moe(_plan("DeepSeek-V4-Pro", aiter="0.1.17"))
    assert old.padding.intermediate_per_rank == 512
    new = _moe(_plan("DeepSeek-V4-Pro", aiter="0.1.18"))
    assert new.padding.intermediate_per_rank == 384


def test_trial_allocations_go_below_the_table_then_above_it():
    layer = next(x for x in expand_layers(load_model("MiniMax-M3-MXFP4"), 8, 1) if x.kind == "moe")
    static = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256)
    trials = rt._trial_allocations(layer, static)
    assert trials[0] == (1, 1)                          # unpadded first
    assert (256, 256) in trials                          # the table's own
    assert trials.index((1, 1)) < trials.index((256, 256)) < trials.index((256, 1024))  # a coarser one last
    sizes = [(-(-layer.hidden // h) * h) * (-(-layer.intermediate_per_rank // i) * i) for h, i in trials]
    assert sizes == sorted(sizes)


# -- the call shape -------------------------------------------------------------------------------------------------

def test_a8w4_dispatches_interleaved_with_fp8_activations():
    """AITER's a8w4 kernels are _gui_ (every afp8_wfp4 stage-1 row of every release): the bare plan of an FP8-
    activation MXFP4 checkpoint dispatches FP8 activations, not FP4."""
    d = _moe(_plan("DeepSeek-V4-Pro"))
    assert d.dispatch.steps[-1].q_dtype_a == FP8
    assert any("afp8_wfp4" in k for k in d.dispatch.steps[-1].kernels)
    assert not any(s.q_dtype_a == FP4 for s in d.dispatch.steps)


def test_dsv4_sglang_bound0_flags_aiter_3933_at_bucket_4():
    """Done when: the DSV4-style a8w4 recipe with AITER_BF16_FP8_MOE_BOUND=0 flags aiter#3933 at bucket 4 (the tuned
    bucket-4 xcd4 stage-1 row of the 512 shape)."""
    plan = _plan("DeepSeek-V4-Pro", aiter="0.1.17", AITER_BF16_FP8_MOE_BOUND="0")
    hit = [h for h in _moe(plan).dispatch.issues if h.issue == "ROCm/aiter#3933"]
    assert hit and hit[0].bucket == 4 and "xcd4" in hit[0].kernel
    recipe = build_recipe(plan, "sglang")
    assert any("3933" in (w.issue or "") or "3933" in w.text for w in recipe.warnings)


def test_a_workaround_env_is_kept_only_where_it_acts():
    """GPTOSS_SWIGLU_MXFP4_BF16_BOUND is read for Swiglu SEPARATED only; AITER_BF16_FP8_MOE_BOUND for Swiglu or
    INTERLEAVE (fused_moe.py _fused_moe_impl)."""
    both = (("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0"), ("AITER_BF16_FP8_MOE_BOUND", "0"), ("AITER_KSPLIT", "-1"))
    from dataclasses import replace
    caps = fake_capabilities("MI355X", A20)
    layer = next(x for x in expand_layers(load_model("MiniMax-M3-MXFP4"), 8, 1) if x.kind == "moe")
    key = dispatch_key(layer, caps)
    assert key.gate_mode == "separated" and key.act_type == SWIGLU
    assert acting_env(both, key) == (("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0"), ("AITER_KSPLIT", "-1"))
    inter = replace(key, gate_mode="interleave")
    assert acting_env(both, inter) == (("AITER_BF16_FP8_MOE_BOUND", "0"), ("AITER_KSPLIT", "-1"))
    silu = replace(key, act_type=SILU, gate_mode="separated")
    assert acting_env(both, silu) == (("AITER_KSPLIT", "-1"),)


# -- the launch's name ------------------------------------------------------------------------------------------------

def test_a_launch_is_named_after_a_family_aiter_runs():
    """GLM-5.1 TP16: aiter-ck wins the family table's preference, but AITER runs FlyDSL at every bucket of the same
    allocation: the layer is aiter-flydsl and aiter-ck is reported as the same launch."""
    d = _moe(_plan("GLM-5.1-MXFP4", tp=16))
    assert d.backend == "aiter-flydsl"
    ck = next(r for r in d.rejected if r.backend == "aiter-ck")
    assert ck.supported and ck.reasons[0].text.startswith("supported, same launch as aiter-flydsl")
    assert d.reasons[0].text.startswith("aiter-flydsl: correct for this layer; AITER's dispatcher never runs")


def test_a_launch_with_other_pad_arguments_keeps_its_name():
    """gpt-oss-120b TP8 on 0.1.13.post1: AITER runs CK-Tile everywhere, but the aiter-cktile plan passes other pads
    (vLLM#44679's doubled-pad bug lives there): not the same launch, the name stays."""
    d = _moe(_plan("gpt-oss-120b", aiter="0.1.13.post1"))
    assert d.backend == "aiter-flydsl" and d.padding.kernel_intermediate_pad == 0


# -- the engine flag from the release's per-quant-method map ----------------------------------------------------------

def test_kimi_k25_int4_on_vllm_0_33_is_moe_backend_flydsl():
    """Done when: compressed-tensors INT4 W4A16 reaches FlyDSL in vLLM 0.33 only with --moe-backend flydsl; aiter
    raises (map_wna16_backend)."""
    plan = _plan("Kimi-K2.5")
    recipe = build_recipe(plan, "vllm")
    assert recipe.ok and "--moe-backend flydsl" in recipe.command and "--moe-backend aiter" not in recipe.command
    layer = _moe(plan).layer
    caps = fake_capabilities("MI355X", A20)
    fly = ec.choice_for_layer(layer, caps, "vllm", "0.33.0", moe_backend="flydsl", quant_method="compressed-tensors")
    assert fly.ok and fly.family == "aiter-flydsl" and fly.kernel_class == "CompressedTensorsW4A16FlydslMoEMethod"
    aiter = ec.choice_for_layer(layer, caps, "vllm", "0.33.0", moe_backend="aiter", quant_method="compressed-tensors")
    assert not aiter.ok and "moe_backend='aiter' is not supported for WNA16 MoE" in aiter.error
    auto = ec.choice_for_layer(layer, caps, "vllm", "0.33.0", moe_backend="auto", quant_method="compressed-tensors")
    assert auto.ok and auto.backend == "TRITON"
    # FlyDSL W4A16 is gfx950-only in vLLM: on gfx942 the value is not a WNA16 backend
    gfx942 = ec.choice_for_layer(layer, fake_capabilities("MI300X", A20), "vllm", "0.33.0", moe_backend="flydsl",
                                 quant_method="compressed-tensors")
    assert not gfx942.ok and "moe_backend='flydsl' is not supported for WNA16 MoE" in gfx942.error


def test_glm51_vllm_recipe_is_an_aiter_launch():
    """Done when: the vLLM 0.33 recipe for GLM-5.1-MXFP4 TP16 (vLLM allocates 128 for AITER w4a4) launches AITER,
    not the emulation fallback."""
    recipe = build_recipe(_plan("GLM-5.1-MXFP4", tp=16), "vllm")
    assert recipe.ok and recipe.backend == "aiter-flydsl" and "--moe-backend aiter" in recipe.command


# -- caveats scoped to what they are about ------------------------------------------------------------------------------

def test_minimax_m3_ep_recipe_keeps_the_model_wide_settings():
    """Done when: under EP the recipe keeps TRITON_ATTN and VLLM_USE_BREAKABLE_CUDAGRAPH=0 (model-wide); only the
    shared-expert fusion is no-EP."""
    ep = build_recipe(_plan("MiniMax-M3-MXFP4", ep=8), "vllm")
    assert ep.ok and "--attention-backend TRITON_ATTN" in ep.command
    names = {e["name"] for e in ep.env}
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" in names and "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS" not in names
    tp = build_recipe(_plan("MiniMax-M3-MXFP4"), "vllm")
    assert "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS" in {e["name"] for e in tp.env}


# -- no emulation recipe while a native launch exists ----------------------------------------------------------------

def test_no_emulation_recipe_while_a_native_launch_exists():
    """DeepSeek-V4 (Quark a8w4) on vLLM 0.33 TP8 with AITER_BF16_FP8_MOE_BOUND=0: vLLM allocates 512 and hands FlyDSL
    intermediate_pad=128 (aiter-pr#3538); the only launch left at TP8 is emulation — refused, naming TP8/EP8."""
    recipe = build_recipe(_plan("DeepSeek-V4-Pro", AITER_BF16_FP8_MOE_BOUND="0"), "vllm")
    assert not recipe.ok and recipe.command is None
    assert any("aiter-pr#3538" in r.text for r in recipe.refusals)
    assert any("the only vllm 0.33.0 launch left for this layout is emulation" in r.text for r in recipe.refusals)
    assert recipe.alternatives and recipe.alternatives[0]["change"] == "--tp 8 --ep 8"
    assert all(a["backend"] != "emulation" for a in recipe.alternatives)


# -- the pad arguments reach whatever family AITER runs ------------------------------------------------------------------

def test_pad_issues_of_the_family_aiter_runs_apply_to_a_plan_named_otherwise():
    """A plan named aiter-cktile that hands FlyDSL intermediate_pad > 0 meets FlyDSL's aiter-pr#3538 wherever AITER
    runs FlyDSL; issues about dtypes of another family do not travel."""
    caps = fake_capabilities("MI355X", A20)
    layer = next(x for x in expand_layers(load_model("DeepSeek-V4-Pro"), 8, 1) if x.kind == "moe")
    alloc = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=128,
                    zero_fill=True, pad_semantics="skip")
    dp = ad.plan_dispatch(layer, caps, tokens=(1, 8192), env={"AITER_BF16_FP8_MOE_BOUND": "0"}, padding=alloc)
    blocking, _ = rt.dispatched_family_issues(layer, caps, alloc, dp, "aiter-cktile")
    assert [r.issue for r in blocking] == ["aiter-pr#3538"]
    assert blocking[0].text.startswith("AITER's dispatcher runs flydsl for tokens 1–8192 at 7168 × 512/rank: ")
    none, _ = rt.dispatched_family_issues(layer, caps, alloc, dp, "aiter-flydsl")  # its own: evaluated elsewhere
    assert none == ()
    zero = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, zero_fill=True)
    assert rt.dispatched_family_issues(layer, caps, zero, dp, "aiter-cktile")[0] == ()


# -- every recipe in tests: what it names runs, and what it reports is the dispatch model's --------------------------

def _recipe_cases():
    import test_golden_recipes as g
    return [c for c in g.CASES if g.RUNTIMES[c[7]] is not None]


@pytest.mark.parametrize("case", _recipe_cases(), ids=lambda c: " ".join(map(str, c)))
def test_a_recipe_names_a_family_aiter_runs_and_reports_the_dispatch_models_runs(case):
    """Done when: no recipe names a family the engine cannot make AITER run; for every recipe in tests the families
    it reports per bucket equal the dispatch model's for the engine's allocation and call shape."""
    import test_golden_recipes as g
    from moedispatch.aiter.key import Assumptions
    from moedispatch.core.families import FUSED_MOE_FAMILIES, family_of

    model, target, aiter, engine, version, tp, ep, rt_key = case
    runtime = Runtime.build(tokens=g.TOKENS, env={}, overrides=g.RUNTIMES[rt_key])
    caps = fake_capabilities(target, aiter)
    plan = plan_full(load_model(model), caps, tp, ep, runtime=runtime)
    recipe = build_recipe(plan, engine, version)
    if not recipe.ok or family_of(recipe.backend) not in FUSED_MOE_FAMILIES:
        assert recipe.runs == []
        return
    realized = recipe.plan or plan
    assert recipe.runs, "an aiter.fused_moe launch reports what AITER runs"
    env = {**realized.runtime.env_dict, **{e["name"]: e["value"] for e in recipe.env}}
    ran = set()
    for run in recipe.runs:
        d = next(x for x in realized.decisions if x.layer.index == run["layers"][0])
        h, i = run["allocation"]
        kh, ki = run["kernel_pads"]
        alloc = Padding(hidden=h, intermediate_per_rank=i, hidden_pad=h - d.layer.hidden,
                        intermediate_pad=i - d.layer.intermediate_per_rank, kernel_hidden_pad=kh,
                        kernel_intermediate_pad=ki, zero_fill=(h, i) != (d.layer.hidden, d.layer.intermediate_per_rank))
        dp = ad.plan_dispatch(d.layer, caps, tokens=realized.runtime.tokens, env=env, padding=alloc,
                              assumptions=Assumptions.from_engine_env(d.layer, env))
        assert [s.to_dict() for s in dp.steps] == run["steps"]
        ran |= {f for s in dp.steps for f in s.family.split("+")}
        if engine == "vllm" and (version or "0.33.0") == "0.33.0":  # the engine model checked against vLLM's code
            forced = next(a["arg"].split()[-1] for a in recipe.args if a["arg"].startswith("--moe-backend"))
            ch = ec.choice_for_layer(d.layer, caps, "vllm", "0.33.0", env=env, moe_backend=forced,
                                     quant_method=realized.model.quant_method)
            if ch.ok and ch.intermediate_per_rank:
                assert (ch.hidden, ch.intermediate_per_rank) == (h, i)
    named = family_of(recipe.backend)
    assert named in ran or any("names the family whose rules moedispatch checked" in w.text for w in recipe.warnings)


def test_the_recipe_check_covers_aiter_launches():
    """Not vacuous: at least 8 of the recipe cases above are aiter.fused_moe launches with reported runs."""
    import test_golden_recipes as g
    from moedispatch.core.families import FUSED_MOE_FAMILIES, family_of

    n = 0
    for model, target, aiter, engine, version, tp, ep, rt_key in _recipe_cases():
        plan = plan_full(load_model(model), fake_capabilities(target, aiter), tp, ep,
                         runtime=Runtime.build(tokens=g.TOKENS, env={}, overrides=g.RUNTIMES[rt_key]))
        r = build_recipe(plan, engine, version)
        n += bool(r.ok and family_of(r.backend) in FUSED_MOE_FAMILIES and r.runs)
    assert n >= 8, n


# -- numerics of an exported switch (issue 23 item 4) ----------------------------------------------------------------

def _env_of(recipe, name):
    return next(e for e in recipe.env if e["name"] == name)


def test_a_switch_that_changes_the_activation_dtype_says_so_with_its_reason():
    """MiniMax-M3-MXFP4 TP8 (Swiglu SEPARATED): vLLM 0.33's 384 allocation is native only with
    GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0, which makes AITER quantize decode activations to MXFP4 where its policy runs
    bf16 below 256 tokens (fused_moe.py _fused_moe_impl): the export says why (the switch's own reason, not "the plan
    assumed it") and what it changes, at which token counts; the path AITER runs by default stays unsaid."""
    recipe = build_recipe(_plan("MiniMax-M3-MXFP4"), "vllm")
    e = _env_of(recipe, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND")
    assert e["value"] == "0" and e["why"].startswith("keep MXFP4 activations at every batch size")
    assert "allocates what AITER runs natively only with it" in e["why"]
    assert e["numerics"].startswith("changes numerics: at tokens 1–64 AITER runs mxfp4 activations instead of bf16")
    assert "No published accuracy evaluation" in e["numerics"]
    # a call-shape switch that leaves every activation dtype as it is says nothing about numerics
    assert "numerics" not in _env_of(recipe, "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS")


def test_a_bound_the_call_shape_does_not_read_changes_no_numerics():
    """DeepSeek-V4-Pro a8w4 is gate/up interleaved: AITER_BF16_FP8_MOE_BOUND=0 runs fp8 activations where the
    default runs bf16 (below 256 tokens), while GPTOSS_SWIGLU_MXFP4_BF16_BOUND (read for Swiglu SEPARATED only) changes
    nothing there — a user's --aiter-env of it is exported as assumed, without a numerics claim."""
    recipe = build_recipe(_plan("DeepSeek-V4-Pro", aiter="0.1.17", AITER_BF16_FP8_MOE_BOUND="0",
                                GPTOSS_SWIGLU_MXFP4_BF16_BOUND="0"), "sglang")
    bound = _env_of(recipe, "AITER_BF16_FP8_MOE_BOUND")
    assert "fp8 activations instead of bf16" in bound["numerics"], bound
    assert "at tokens 1–64" in bound["numerics"]
    assert "numerics" not in _env_of(recipe, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND")
