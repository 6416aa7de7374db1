"""Survivors of the seed-13 mutation run in the AITER dispatch model (aiter/hazards.py, aiter/issues.py,
aiter/walk.py): each test pins, on a real model, target and AITER release, the rule the mutated line decides — the
kernel pair a FlyDSL tile hazard names, CK's integer k-tiles-per-split count behind ROCm/aiter#3997, the tuned row
v0.1.9–v0.1.12's ``use_cfg`` bypass drops, and the token bucket of a SiTUv2 call to an AITER without SiTUv2.

FM = ROCm/aiter@e4048607 ``aiter/fused_moe.py`` (HEAD), release rules per :mod:`moedispatch.aiter.rules`."""

from __future__ import annotations

from moedispatch.aiter.dispatch import Assumptions, plan_dispatch
from moedispatch.aiter.flydsl import FLYDSL_TILE_SOURCE
from moedispatch.testing import fake_capabilities

from test_aiter_dispatch import moe

A20 = "0.1.20.post1"
CK = ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)")


# -- hazards.tile_hazards: the hit names every kernel of the step, joined by " + " -----------------------------------

def test_a_flydsl_tile_hazard_names_both_kernels_of_the_step():
    """GLM-5.1-MXFP4 at TP32 on MI355X / AITER 0.1.20.post1 allocates 64/rank: AITER's FlyDSL heuristic runs a stage-1
    and a stage-2 kernel whose stage-2 tile_k 128 does not divide inter_dim 64. The blocking flydsl-tile hit names
    the step's kernels as AITER runs them, "stage1 + stage2" (the selector quotes it: "AITER's dispatcher runs
    <kernel> for …")."""
    caps = fake_capabilities("MI355X", A20)
    dp = plan_dispatch(moe("GLM-5.1-MXFP4", tp=32), caps, tokens=(1, 8192), env={})
    (hit,) = [h for h in dp.issues if h.issue == "flydsl-tile"]
    first = dp.steps[0]
    assert first.kernels == ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2",
                             "flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic_bnt2")
    assert hit.kernel == ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2 + "
                          "flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic_bnt2")
    assert (hit.tokens, hit.bucket, hit.blocking, hit.source) == ((1, 8192), 1, True, FLYDSL_TILE_SOURCE)
    assert "stage-2 tile_k 128 does not divide inter_dim 64" in hit.effect


# -- issues._issue_matches: k-tiles per split is CK's integer K / (SplitK * KPerBlock) ------------------------------

def test_aiter_3997_counts_k_tiles_per_split_with_integer_division():
    """ROCm/aiter#3997 (capability_db/dispatch_issues.toml): CK's block-fp8 stage 1 computes KBatch = K / (SplitK *
    KPerBlock) in integers and skips its output memset unless KBatch > 1 (fixed in v0.1.18). DeepSeek-V3 at TP8 on
    MI300X, M=1, AITER 0.1.17: model_dim 7168, block_m 16 (KPerBlock 256). get_ksplit's own split 14 gives 7168 //
    3584 = 2 k-tiles per split — no hit; AITER_KSPLIT=16 gives 7168 // 4096 = 1 (not 1.75) — the stage-1 kernel
    accumulates onto unzeroed memory: an error hit on moe_ck2stages_gemm1 at token 1, AITER_KSPLIT=-1 its workaround.
    v0.1.18 has the fix."""
    layer = moe("DeepSeek-V3", tp=8)
    (own,) = plan_dispatch(layer, fake_capabilities("MI300X", "0.1.17"), tokens=(1,), env={}).steps
    assert (own.kernels, own.block_m, own.ksplit) == (CK, 16, 14)
    assert not plan_dispatch(layer, fake_capabilities("MI300X", "0.1.17"), tokens=(1,), env={}).issues
    env = {"AITER_KSPLIT": "16"}
    dp = plan_dispatch(layer, fake_capabilities("MI300X", "0.1.17"), tokens=(1,), env=env)
    assert (dp.steps[0].block_m, dp.steps[0].ksplit) == (16, 16)
    (hit,) = dp.issues
    assert (hit.issue, hit.tokens, hit.bucket, hit.kernel, hit.severity, hit.workaround_env) == (
        "ROCm/aiter#3997", (1, 1), 1, "moe_ck2stages_gemm1 (default)", "error", (("AITER_KSPLIT", "-1"),))
    assert not plan_dispatch(layer, fake_capabilities("MI300X", "0.1.18"), tokens=(1,), env=env).issues


# -- walk._dispatch_lookup_row: use_cfg drops the tuned row (None), the heuristics decide ---------------------------

def test_use_cfg_drops_the_small_blockscale_row_and_the_heuristic_runs():
    """v0.1.9–v0.1.12 ``use_cfg`` (src v0.1.12 L831-L843): a Silu bf16 per_1x128 fp8 layer with token * topk <= 128
    ignores its tuned row — no row at all, so get_2stage_cfgs builds the heuristic default. DeepSeek-V3 at TP4 on
    MI308X (7168 x 512, 256 experts, top-8), AITER 0.1.12: at M=4 (4 x 8 = 32) the tuned_fmoe.csv:993 row is
    skipped — CK 2-stage default, block_m 16, no ksplit, no config — with flydsl importable or not (v0.1.12 swaps
    FlyDSL rows only for a row it still has); at M=32 (256 > 128) the tuned row :996 runs."""
    layer = moe("DeepSeek-V3", tp=4)
    where = "ROCm/aiter@v0.1.12:aiter/configs/tuned_fmoe.csv"
    for fly in (True, False):
        small, big = plan_dispatch(layer, fake_capabilities("MI308X", "0.1.12"), tokens=(4, 32), env={},
                                   assumptions=Assumptions(flydsl_available=fly)).steps
        assert (small.basis, small.config, small.kernels, small.block_m, small.ksplit) == ("heuristic", None, CK, 16, 0)
        assert small.row is None
        assert f"use_cfg: Silu per_1x128 fp8 with token*topk <= 128 skips the tuned row {where}:993 (v0.1.12)" \
            in small.notes
        assert (big.basis, big.config) == ("tuned", f"{where}:996")


# -- walk.dispatch_token: a SiTUv2 call to an AITER without SiTUv2 is still bucketed ---------------------------------

def test_a_situv2_call_to_the_0_1_7_wheel_reports_the_wheels_bucket():
    """ActivationType gains Situv2 in v0.1.19: the 0.1.7 wheel raises AttributeError before any kernel — but the
    call still has its token bucket, the wheel's get_padded_M (every M <= 16 -> 16). Kimi-K3-MXFP4 at TP8 on MI355X,
    AITER 0.1.7, M=1..40000: one raising step whose bucket is 16 (buckets 16 and 1024), and the blocking
    aiter-raises hit is reported at bucket 16."""
    dp = plan_dispatch(moe("Kimi-K3-MXFP4", tp=8), fake_capabilities("MI355X", "0.1.7"), tokens=(1, 3000, 40000),
                       env={})
    (step,) = dp.steps
    assert "has no attribute 'Situv2'" in step.raises
    assert (step.tokens, step.bucket, step.buckets, step.to_dict()["bucket"]) == ((1, 40000), 16, (16, 1024), 16)
    (hit,) = dp.issues
    assert (hit.issue, hit.tokens, hit.bucket, hit.blocking) == ("aiter-raises", (1, 40000), 16, True)
