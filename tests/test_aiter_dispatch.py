"""The offline model of AITER's fused-MoE dispatch (moedispatch.aiter.dispatch / aiter_configs / aiter_lint).

Every case names where its expectation comes from: AITER's own code at the HEAD snapshot
(https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py, abbreviated FM),
AITER's dispatcher tests (op_tests/test_fhmoe.py at the same commit), the PyPI wheel amd-aiter 0.1.7.post2.dev18, or
dispatch lines users quoted in AITER/vLLM issues.
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest

from moedispatch.data import aiter_configs as ac
from moedispatch.aiter import dispatch as ad
from moedispatch.aiter.activation import activation_dtype
from moedispatch.aiter.fhmoe import fhmoe_config_scope, fhmoe_lookup, _fhmoe_rows, fhmoe_supports
from moedispatch.aiter.hazards import raising_hits
from moedispatch.aiter.issues import dispatch_issues, DispatchIssue, evaluate_issues
from moedispatch.aiter.key import dispatch_key, DispatchKey
from moedispatch.aiter.rules import get_padded_M
from moedispatch.aiter.steps import DispatchStep, kernel_family, parse_info_line
from moedispatch.aiter.vocab import BF16, FP4, FP8, FP8_FNUZ, I4, Q_1X128, Q_1X32, SILU, SITUV2, SWIGLU
from moedispatch.aiter.walk import dispatch_token
from moedispatch.core.workload import AITER_ENV, DEFAULT_TOKENS, aiter_env, parse_env_args, parse_tokens
from moedispatch.sources import models
from moedispatch.aiter.dispatch import Assumptions, plan_dispatch, simulate
from moedispatch.data.capdb import target_capabilities
from moedispatch.core.errors import UsageError
from moedispatch.core.layers import MoELayer, QuantSpec

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "aiter"
FM = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py"


def _installed() -> bool:
    try:
        md.distribution("amd-aiter")
    except md.PackageNotFoundError:
        return False
    return ac.installed_aiter()[1] is not None


needs_aiter = pytest.mark.skipif(not _installed(), reason="needs the PyPI amd-aiter wheel installed (.ci/run)")


@pytest.fixture(scope="module")
def head() -> ac.ConfigSet:
    return ac.load_config_set("head")


def moe(name: str, tp: int = 8, ep: int = 1) -> MoELayer:
    return next(lay for lay in models.expand_layers(models.load_model(name), tp, ep) if lay.kind == "moe")


def layer(**kw) -> MoELayer:
    base = dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, activation="silu",
                weight=QuantSpec("fp8", "block128x128", scale_dtype="fp32"),
                act=QuantSpec("fp8", "group128", scale_dtype="fp32", dynamic=True))
    base.update(kw)
    return MoELayer.build(**base)


MXFP4 = dict(weight="mxfp4", act="mxfp4")
MI355X = ("MI355X", "0.1.20.post1")


# -- buckets and policy (FM get_padded_M, _fused_moe_impl) ----------------------------------------------------

@pytest.mark.parametrize(("m", "head_bucket", "legacy_bucket"), [
    (1, 1, 16), (3, 4, 16), (4, 4, 16), (16, 16, 16), (17, 32, 32), (300, 512, 512), (1000, 1024, 1024),
    (1025, 2048, 1024), (8192, 8192, 1024), (32767, 32768, 1024), (32768, 32768, 1024), (100000, 32768, 1024),
    (131072, 131072, 1024), (500000, 131072, 1024),
])
def test_get_padded_m(m, head_bucket, legacy_bucket):
    """HEAD: next power of two below 32768 then tiers 32768/131072 (FM get_padded_M); 0.1.7: ≤16 → 16, capped 1024."""
    assert get_padded_M(m) == head_bucket
    assert get_padded_M(m, "legacy") == legacy_bucket


def _key(**kw) -> DispatchKey:
    base = dict(gfx="gfx950", cu_num=256, model_dim=6144, inter_dim=384, expert=129, topk=5, runtime_topk=5,
                act_type=SWIGLU, dtype=BF16, q_dtype_w=FP4, q_type=Q_1X32, use_g1u1=1, doweight_stage1=0,
                gate_mode="separated", is_ep=False)
    base.update(kw)
    return DispatchKey(**base)


@pytest.mark.parametrize(("key", "m", "env", "expected"), [
    # Swiglu SEPARATED: bf16 below GPTOSS_SWIGLU_MXFP4_BF16_BOUND (256), else fp4x2.
    (_key(), 255, {}, BF16), (_key(), 256, {}, FP4),
    (_key(), 1, {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}, FP4),
    # Swiglu / INTERLEAVE: bf16 unless gfx950 and M >= AITER_BF16_FP8_MOE_BOUND (256), then fp8.
    (_key(gate_mode="interleave"), 255, {}, BF16), (_key(gate_mode="interleave"), 256, {}, FP8),
    (_key(gate_mode="interleave", gfx="gfx942"), 4096, {}, BF16),
    (_key(act_type=SILU, gate_mode="interleave"), 4, {"AITER_BF16_FP8_MOE_BOUND": "0"}, FP8),
    # Silu SEPARATED MXFP4: fp4x2; a16wi4: bf16; mxfp8: fp8; SiTUv2: bf16 unless the a8w4/a4w4 switches.
    (_key(act_type=SILU), 1, {}, FP4), (_key(q_dtype_w=I4, act_type=SILU), 1, {}, BF16),
    (_key(q_dtype_w=FP8, act_type=SILU), 1, {}, FP8),
    (_key(act_type=SITUV2), 1, {}, BF16), (_key(act_type=SITUV2), 1, {"AITER_SITUV2_A8W4": "1"}, FP8),
    (_key(act_type=SITUV2), 1, {"AITER_SITUV2_A4W4": "1"}, FP4),
    # Non-MX: activations take the weight dtype.
    (_key(q_type=Q_1X128, q_dtype_w=FP8, act_type=SILU), 1, {}, FP8),
])
def test_activation_dtype_policy(key, m, env, expected):
    """FM _fused_moe_impl's activation-dtype policy by token count and env."""
    assert activation_dtype(m, key, env)[0] == expected


# -- the lookup key (engine assumptions) --------------------------------------------------------------------------

def test_key_fused_shared_expert_and_ep_topk():
    """A fused shared expert adds one expert and one top-k slot; under EP AITER HEAD looks up topk - 1
    (FM get_2stage_cfgs `topk -= int(is_ep)`), which misses tuned rows unless the caller appends a fake slot
    (https://github.com/ROCm/aiter/issues/3999)."""
    caps = target_capabilities(*MI355X)
    m3 = moe("MiniMax-M3-MXFP4")
    plain = dispatch_key(m3, caps)
    fused = dispatch_key(m3, caps, assumptions=Assumptions(fused_shared_expert=True))
    assert (plain.expert, plain.topk) == (128, 4) and (fused.expert, fused.topk) == (129, 5)
    ds = moe("DeepSeek-V3", tp=8, ep=8)
    ep = dispatch_key(ds, caps)
    assert ep.is_ep and ep.expert == 32 and (ep.runtime_topk, ep.topk) == (8, 7)
    slot = dispatch_key(ds, caps, assumptions=Assumptions(ep_fake_slot=True))
    assert (slot.runtime_topk, slot.topk) == (9, 8)
    assert dispatch_key(ds, caps, model="legacy").topk == 8  # 0.1.7 has no EP adjustment
    assert any("aiter#3999" in line for line in Assumptions().describe(ds))


def test_key_gate_mode_and_quant_mapping():
    """swigluoai_uninterleave → SEPARATED (vLLM PR #46419), swigluoai → INTERLEAVE; fp8 128x128 blocks →
    per_1x128 (FM quant_remap) with the arch's fp8 (e4m3fnuz on gfx942)."""
    caps950 = target_capabilities(*MI355X)
    assert dispatch_key(moe("MiniMax-M3-MXFP4"), caps950).gate_mode == "separated"
    assert dispatch_key(layer(activation="swigluoai", **MXFP4), caps950).gate_mode == "interleave"
    k942 = dispatch_key(layer(), target_capabilities("MI300X", "0.1.20.post1"))
    assert (k942.q_type, k942.q_dtype_w) == (Q_1X128, FP8_FNUZ)
    with pytest.raises(UsageError):
        dispatch_key(layer(weight="mxfp6", act="bf16"), caps950)


# -- Done when: MiniMax-M3-MXFP4 TP8 MI355X with the HEAD snapshot ----------------------------------------------

def test_minimax_m3_tp8_finds_its_384_rows_unpadded(head):
    """AITER ships tuned FlyDSL rows for MiniMax-M3 at inter_dim 384 (TP8, 129 experts = 128 + fused shared, top-5:
    model_configs/minimax_m3_fp4_tuned_fmoe.csv, aiter #3755). Unpadded, the lookup finds them from M = 256 (fp4
    activations); below 256 Swiglu SEPARATED runs bf16 activations, whose key has no row, and AITER routes to CK-Tile
    — where aiter#5233 is silently wrong at inter_dim % 256 != 0. GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 keeps fp4
    activations and the tuned rows for every bucket."""
    caps = target_capabilities(*MI355X)
    m3 = moe("MiniMax-M3-MXFP4")
    a = Assumptions(fused_shared_expert=True)
    plan = plan_dispatch(m3, caps, configs=head, env={}, assumptions=a, tokens=(1, 4, 64, 256, 512, 8192))
    assert plan.key.inter_dim == 384 and plan.key.model_dim == 6144
    *low, h256, h512, h8192 = plan.steps
    high = [h256, h512, h8192]
    # ksplit is per token count (CK-Tile split-K 12 / 4 / 2 at M = 1 / 4 / 64): one step each, never one range
    assert [(s.tokens, s.family, s.basis, s.activation_dtype, s.ksplit) for s in low] == [
        ((1, 1), "cktile", "heuristic", "bf16", 12), ((4, 4), "cktile", "heuristic", "bf16", 4),
        ((64, 64), "cktile", "heuristic", "bf16", 2)]
    for step in high:
        assert step.basis == "tuned" and step.family == "flydsl" and step.activation_dtype == "mxfp4"
        assert step.config.startswith("ROCm/aiter@e4048607:aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv:")
        assert step.row.inter_dim == 384
    assert [h.issue for h in plan.issues] == ["ROCm/aiter#5233"] and plan.issues[0].tokens == (1, 64)
    assert dict(plan.issues[0].workaround_env) == {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}
    fixed = plan_dispatch(m3, caps, configs=head, env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}, assumptions=a,
                          tokens=(1, 4, 64))
    assert all(s.basis == "tuned" and s.family == "flydsl" for s in fixed.steps) and not fixed.issues
    assert ad.native_inter_dims(m3, caps, configs=head, env={}, assumptions=a) == frozenset({384, 768})
    assert plan.families == ("cktile", "flydsl") and plan.backends == ("aiter-cktile", "aiter-flydsl")


def test_minimax_m3_rows_name_file_and_line(head):
    """The deciding row is named as file:line and its kernels are the row's (bucket 512 → line 27)."""
    caps = target_capabilities(*MI355X)
    (step,) = simulate(moe("MiniMax-M3-MXFP4"), caps, configs=head, env={}, tokens=(512,),
                       assumptions=Assumptions(fused_shared_expert=True))
    assert step.config == "ROCm/aiter@e4048607:aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv:27"
    assert step.kernels == ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w4", "flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic")
    assert step.to_dict() == {"tokens": [512, 512], "bucket": 512, "stages": 2, "family": "flydsl",
                              "kernels": list(step.kernels), "block_m": 32, "activation_dtype": "mxfp4",
                              "basis": "tuned", "config": step.config, "ksplit": 0, "raises": None}


# -- Done when: DeepSeek-V3 TP8 MI355X with the installed PyPI amd-aiter ---------------------------------------

@needs_aiter
def test_deepseek_v3_tp8_mi355x_installed_rows():
    """amd-aiter 0.1.7.post2.dev18's aiter/configs/tuned_fmoe.csv has DeepSeek-V3 TP8 rows for cu_num 256
    (7168x256, 256 experts, top-8, per_1x128 fp8): buckets 32…1024 name their CK 2-stage kernels and line; M ≤ 16
    falls in bucket 16, which has no row (1-stage ASM heuristic); M = 8192 lands in the 1024 cap."""
    caps = target_capabilities(*MI355X)
    cs = ac.load_config_set("installed")
    assert cs.origin == "installed" and cs.dispatch == "legacy" and len(cs.rows) == 773
    plan = plan_dispatch(moe("DeepSeek-V3"), caps, configs=cs, env={}, tokens=(1, 4, 64, 512, 8192))
    first, *rest = plan.steps
    assert (first.tokens, first.bucket, first.basis, first.kernels) == (
        (1, 4), 16, "heuristic", ("fmoe_fp8_blockscale_g1u1 (default)",))
    lines = {s.tokens: s.config for s in rest}
    assert lines == {(64, 64): "aiter/configs/tuned_fmoe.csv:637", (512, 512): "aiter/configs/tuned_fmoe.csv:640",
                     (8192, 8192): "aiter/configs/tuned_fmoe.csv:641"}
    for s in rest:
        assert s.family == "ck" and s.stages == 2 and s.block_m == 16
        assert s.kernels[0].startswith("moe_ck2stages_gemm1_256x16x128x256_1x4_MulABScaleExpertWeightA8W8blkscale")
        assert s.row.cu_num == 256 and s.row.q_type == "QuantType.per_1x128"


@needs_aiter
def test_installed_files_win_over_the_bundled_snapshot():
    """With AITER installed and the target's version read from its files, the installed CSVs are used."""
    caps = target_capabilities("MI355X", ac.installed_aiter()[0], aiter_source="files:amd-aiter")
    assert ac.config_set_for(caps).origin == "installed"
    assert ac.config_set_for(target_capabilities(*MI355X)).origin == "bundled"


# -- Done when: aiter#3933 flagged at its bucket -----------------------------------------------------------------

def test_aiter_3933_flagged_at_bucket_4(head):
    """DeepSeek-V4-Pro TP8 MI355X (7168x512, 384 experts, top-6, MXFP4 weights, SGLang's interleaved gate/up,
    AITER_BF16_FP8_MOE_BOUND=0 → fp8 activations) hits the _xcd4 stage-1 row only at bucket 4 (M = 3, 4):
    https://github.com/ROCm/aiter/issues/3933."""
    caps = target_capabilities(*MI355X)
    dsv4 = layer(hidden=7168, intermediate=4096, experts=384, top_k=6, **MXFP4)
    plan = plan_dispatch(dsv4, caps, configs=head, env={"AITER_BF16_FP8_MOE_BOUND": "0"},
                         assumptions=Assumptions(gate_mode="interleave"), tokens=(1, 2, 3, 4, 8, 64))
    hits = [h for h in plan.issues if h.issue == "ROCm/aiter#3933"]
    assert len(hits) == 1 and hits[0].tokens == (3, 4) and hits[0].bucket == 4
    assert "_xcd4" in hits[0].kernel and dict(hits[0].workaround_env) == {"AITER_BYPASS_TUNE_CONFIG": "1"}
    assert hits[0].severity == "error" and hits[0].source == "https://github.com/ROCm/aiter/issues/3933"
    older = plan_dispatch(dsv4, target_capabilities("MI355X", "0.1.13.post1"), configs=head,
                          env={"AITER_BF16_FP8_MOE_BOUND": "0"}, assumptions=Assumptions(gate_mode="interleave"),
                          tokens=(4,))
    assert not [h for h in older.issues if h.issue == "ROCm/aiter#3933"]  # the row entered with v0.1.14
    # A release candidate of v0.1.14 carries its code (and its tuned row): flagged, as v0.1.14 is. packaging's own
    # SpecifierSet(">=0.1.14").contains("0.1.14rc1", prereleases=True) says no: the range is decided on
    # core.aiter_release.release_of (0.1.14rc1 → 0.1.14), as the rule ranges are. A 0.1.14.dev3 build is 3 commits
    # after a v0.1.13.x tag (setuptools_scm guess-next-dev, ROCm/aiter pyproject.toml): not flagged; one after
    # v0.1.14 (0.1.14.post1.dev2) is.
    for version, flagged in (("0.1.14rc1", True), ("0.1.14.dev3+g1a2b", False), ("0.1.14.post1.dev2", True),
                             ("0.1.13.post1", False), ("0.1.16.post6", True)):
        rc = plan_dispatch(dsv4, target_capabilities("MI355X", version), configs=head,
                           env={"AITER_BF16_FP8_MOE_BOUND": "0"}, assumptions=Assumptions(gate_mode="interleave"),
                           tokens=(4,))
        assert bool([h for h in rc.issues if h.issue == "ROCm/aiter#3933"]) is flagged, version


def test_aiter_4788_flagged_with_pre_fix_rows():
    """GLM-5.2-FP8 TP8 on MI300X with the glm5_1 rows before PR #4811 (fixture): buckets 32–256 pick the a16 16x256
    1-stage ASM kernels that gave GSM8K 0 (https://github.com/ROCm/aiter/issues/4788); the workaround is
    AITER_BYPASS_TUNE_CONFIG=1. At bucket 2048 the row is the 64x256 kernel the issue's log line shows."""
    caps = target_capabilities("MI300X", "0.1.19.post2")
    glm = layer(hidden=6144, intermediate=2048, experts=256, top_k=8)
    env = {"AITER_CONFIG_FMOE": str(FIX / "a8w8_blockscale_tuned_fmoe_glm5_1.pre-4811.csv")}
    a = Assumptions(fused_shared_expert=True)
    plan = plan_dispatch(glm, caps, env=env, assumptions=a, tokens=(16, 32, 64, 200, 2048))
    # Bucket 16's row is a FLAT (flat=2, emsort) 1-stage kernel, which 0.1.19.post2 refuses on gfx942 (aiter#4394:
    # metadata.flat = run_1stage and bool(int(cfg["flat"])), ROCm/aiter@v0.1.19.post2:aiter/fused_moe.py lines 837-839).
    assert [(h.issue, h.tokens) for h in plan.issues] == [("ROCm/aiter#4788", (32, 64)),
                                                          ("ROCm/aiter#4788", (200, 200)),
                                                          ("ROCm/aiter#4394", (16, 16))]
    assert all(dict(h.workaround_env) == {"AITER_BYPASS_TUNE_CONFIG": "1"} for h in plan.issues)
    # the fix upstream (dispatch_issues.toml fixed_by) reaches the hit, its JSON and the reason a user reads
    assert {h.fixed_by for h in plan.issues if h.issue == "ROCm/aiter#4788"} == {
        "https://github.com/ROCm/aiter/pull/4811"}
    assert plan.issues[0].to_dict()["fixed_by"] == "https://github.com/ROCm/aiter/pull/4811"
    from moedispatch.selector.runtime import dispatch_reasons

    said = [r for r in dispatch_reasons(plan, "aiter-asm", "asm") if r.issue == "ROCm/aiter#4788"]
    assert said and all(r.text.endswith("; fixed upstream by https://github.com/ROCm/aiter/pull/4811") for r in said)
    last = plan.steps[-1]
    assert last.stages == 1 and last.kernels == ("_ZN5aiter46fmoe_bf16_blockscaleFp8_g1u1_vs_ps_silu_64x256E",)
    quoted = parse_info_line("[aiter] [fused_moe] using 1stage (kernelName1='_ZN5aiter46fmoe_bf16_blockscaleFp8_"
                                "g1u1_vs_ps_silu_64x256E', kernelName2=nan) for ('gfx942', 304, 2048)")
    assert quoted["stages"] == last.stages and quoted["kernels"] == last.kernels
    assert parse_info_line(last.info_line(plan.key))["kernels"] == last.kernels
    bypass = plan_dispatch(glm, caps, env={**env, "AITER_BYPASS_TUNE_CONFIG": "1"}, assumptions=a, tokens=(64,))
    assert bypass.steps[0].basis == "heuristic" and not bypass.issues
    fixed = plan_dispatch(glm, target_capabilities("MI300X", "0.1.20"), env=env, assumptions=a, tokens=(64,))
    assert not fixed.issues  # PR #4811 is in v0.1.20


# -- replays of dispatch lines users quoted -----------------------------------------------------------------------

def test_replay_pr_3911_heuristic_flydsl_fallback(head, tmp_path, shared_aiter):
    """aiter PR #3911 quotes: `no tuned FlyDSL config for ('gfx950', 256, 1, 7168, 256, 256, 8, Silu, bf16, fp4x2,
    fp4x2, per_1x32, ...), using heuristic FlyDSL fallback (kn1='flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2', ...)`
    — DeepSeek-R1 MXFP4 TP8 at E=256/top-8 when the table had only E=257/top-9 rows. Replayed with the HEAD
    dsv3_fp4 rows minus the E=256 rows that PR added, as AITER_CONFIG_FMOE."""
    src = shared_aiter / "head/aiter/configs/model_configs/dsv3_fp4_tuned_fmoe.csv"
    with src.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["expert"] != "256"]
        fields = reader.fieldnames
    pre = tmp_path / "dsv3_fp4_tuned_fmoe.csv"
    with pre.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    caps = target_capabilities(*MI355X)
    r1 = layer(hidden=7168, intermediate=2048, experts=256, top_k=8, **MXFP4)
    (step,) = simulate(r1, caps, env={"AITER_CONFIG_FMOE": str(pre)}, tokens=(1,))
    assert (step.basis, step.family, step.block_m) == ("heuristic", "flydsl", 32)
    assert step.kernels[0] == "flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2"
    (tuned,) = simulate(r1, caps, configs=head, env={}, tokens=(1,))  # with the rows PR #3911 added
    assert tuned.basis == "tuned" and tuned.row.expert == 256


def test_replay_aiter_5769_default_one_stage(head):
    """https://github.com/ROCm/aiter/issues/5769 quotes `[fused_moe] using 1stage default for ('gfx950', 256, 512,
    256, 2048, 8, 2, Silu, bfloat16, fp8_e4m3fn, fp8_e4m3fn, QuantTyp…` (shrunk DeepSeek-V3.2, per_1x128): no row,
    so the per_1x128 heuristic runs 1-stage ASM (token > 32, inter_dim % 128 == 0) — and the open a1_scale
    over-read of that kernel is flagged."""
    caps = target_capabilities(*MI355X)
    small = layer(hidden=256, intermediate=2048, experts=8, top_k=2, tp=1)
    plan = plan_dispatch(small, caps, configs=head, env={}, tokens=(512,))
    (step,) = plan.steps
    assert (step.stages, step.basis, step.bucket, step.block_m) == (1, "heuristic", 512, 32)
    line = step.info_line(plan.key)
    assert line.startswith("[fused_moe] using 1stage default for ('gfx950', 256, 512, 256, 2048, 8, 2, ")
    assert [h.issue for h in plan.issues] == ["ROCm/aiter#5769"]


def test_aiter_3471_blockscale_32x384_at_8k(head):
    """MiniMax-M2.5 FP8 TP8/EP8 on MI350X crashed at M ≈ 8K in fmoe_bf16_blockscaleFp8_g1u1_vs_silu_32x384
    (https://github.com/ROCm/aiter/issues/3471, vllm-project/vllm#43605): the per_1x128 heuristic 1-stage path with
    inter_dim 1536 (a multiple of 384) and block_m 32 is flagged from 8192 tokens, with a token cap."""
    caps = target_capabilities("MI350X", "0.1.20.post1")
    m25 = layer(hidden=3072, intermediate=1536, experts=256, top_k=8, tp=8, ep=8)
    plan = plan_dispatch(m25, caps, configs=head, env={}, tokens=(64, 8192))
    hit = [h for h in plan.issues if h.issue == "ROCm/aiter#3471"]
    assert len(hit) == 1 and hit[0].tokens == (8192, 8192) and hit[0].token_cap == 4096
    assert any(h.issue == "ROCm/aiter#3999" for h in plan.issues)  # EP: topk 7 misses the tuned rows


# -- AITER's own dispatcher tests: op_tests/test_fhmoe.py --------------------------------------------------------

@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, True), ({"token_num": 2048}, True), ({"token_num": 0}, False), ({"token_num": 2049}, False),
    ({"model_dim": 7169}, False), ({"inter_dim": 512}, False), ({"experts": 384}, False), ({"topk": 6}, False),
    ({"hidden_pad": 128}, False), ({"intermediate_pad": 128}, False), ({"gate_mode": "separated"}, False),
    ({"doweight_stage1": True}, False),
])
def test_fhmoe_config_scope(overrides, expected):
    """op_tests/test_fhmoe.py::test_dsv4_i384_fhmoe_config_scope, case for case."""
    args = dict(token_num=1, model_dim=7168, inter_dim=384, experts=385, topk=7, hidden_pad=0, intermediate_pad=0,
                gate_mode="interleave", doweight_stage1=False)
    args.update(overrides)
    token = args.pop("token_num")
    assert fhmoe_config_scope(token, **args, env={}) is expected


@pytest.mark.parametrize(("max_tokens", "expected"), [(0, False), (1, True), (1536, True), (2048, True),
                                                     (2049, False), (True, False)])
def test_fhmoe_capability(max_tokens, expected):
    """op_tests/test_fhmoe.py::test_dsv4_i384_fhmoe_capability; AITER_BYPASS_TUNE_CONFIG rejects the table."""
    assert fhmoe_supports(max_tokens, env={}) is expected
    assert fhmoe_supports(1, env={"AITER_BYPASS_TUNE_CONFIG": "1"}) is False


@pytest.mark.parametrize(("num_tokens", "stage1", "stage2"), [
    (1, "flydsl_moe1_afp8_wfp4_bf16_t32x64x256_w4_gui_kw4_fp8", "flydsl_moe2_afp8_wfp4_bf16_t32x256x128_atomic"),
    (16, "flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w2_gui_fp8", "flydsl_moe2_afp8_wfp4_bf16_t32x128x128_atomic_bnt2"),
    (1536, "flydsl_moe1_afp8_wfp4_bf16_t64x128x256_w3_bnt0_gui", "flydsl_moe2_afp8_wfp4_bf16_t64x128x128_atomic"),
    (2048, "flydsl_moe1_afp8_wfp4_bf16_t64x128x256_w3_bnt0_gui", "flydsl_moe2_afp8_wfp4_bf16_t64x128x128_atomic"),
])
def test_fhmoe_uses_dedicated_config(num_tokens, stage1, stage2):
    """op_tests/test_fhmoe.py::test_dsv4_i384_fhmoe_uses_dedicated_config."""
    assert fhmoe_lookup(get_padded_M(num_tokens), env={}) == (stage1, stage2)


@pytest.mark.parametrize("num_tokens", [768, 2049])
def test_fhmoe_requires_exact_bucket(tmp_path, num_tokens):
    """op_tests/test_fhmoe.py::test_dsv4_i384_fhmoe_config_requires_exact_bucket: a missing bucket is no row
    (AITER raises NotImplementedError), even with AITER_ONLINE_TUNE=1."""
    missing = str(get_padded_M(num_tokens))
    table = _fhmoe_rows()  # capability_db/aiter_fhmoe.toml, as AITER's CSV spells it
    rows = [r for r in table if r["token"] != missing]
    fields = list(table[0])
    path = tmp_path / "gap.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    assert fhmoe_lookup(int(missing), env={"AITER_ONLINE_TUNE": "1"}, path=str(path)) is None


# -- the lookup and merge rules ---------------------------------------------------------------------------------

def _write(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


LEGACY_HEADER = ["cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
                 "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1", "block_m", "ksplit", "us1", "kernelName1",
                 "err1", "us2", "kernelName2", "err2", "us", "run_1stage", "tflops", "bw", "_tag"]
CK1 = "moe_ck2stages_gemm1_256x32x64x128_1x4_MulABScale_v1_Nswizzle0_Quant4_MulRoutedWeight0_silu_F8_F8_B16"
CK2 = "moe_ck2stages_gemm2_256x32x64x128_1x4_MulABScaleExpertWeight_v1_Nswizzle0_Quant4_MulRoutedWeight1_F8_F8_B16"


def _row(token, act="ActivationType.Silu", k1=CK1, k2=CK2, us=50.0, tag="", cu=256):
    return [cu, token, 7168, 256, 256, 8, act, "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e4m3fn",
            "QuantType.per_1x128", 1, 0, 32, 0, 20.0, k1, "0.0%", 30.0, k2, "0.0%", us, 0, 1.0, 1.0, tag]


def test_legacy_csv_backfills_gfx_and_drops_flydsl_fallback(tmp_path):
    """A CSV without a gfx column is backfilled from cu_num (256 → gfx950; aiter/jit/utils/chip_info.py
    gfx_from_cu_num) and flydsl_fallback rows never decide at HEAD."""
    p = _write(tmp_path / "tuned_fmoe.csv", LEGACY_HEADER, [_row(1, tag="flydsl_fallback", k1="cktile_a8w4_bm32"),
                                                   _row(1, us=60.0), _row(2, cu=80)])
    cs = ac.load_config_set(str(tmp_path), version="0.1.20")
    assert [(r.gfx, r.gfx_backfilled) for r in cs.rows] == [("gfx950", True)] * 2 + [("gfx942", True)]
    caps = target_capabilities(*MI355X)
    (step,) = simulate(layer(), caps, configs=cs, env={}, tokens=(1,))
    assert step.basis == "tuned" and step.config.endswith("tuned_fmoe.csv:3")


@pytest.mark.parametrize(("version", "line"), [
    ("0.1.20.post1", 2),   # key holds the pybind enum: only the act wildcard can match → first row (Gelu)
    ("0.1.15.post3", 2),   # same since v0.1.14
    ("0.1.18", 3),         # v0.1.18's key holds str(activation): the exact Silu row matches
    ("0.1.13.post1", 3),   # str(activation), no wildcard
    ("0.1.7", 3),
])
def test_act_match_per_release(tmp_path, version, line):
    """Whether a Silu layer gets the Gelu row listed first depends on the release: HEAD (and v0.1.14–v0.1.17,
    v0.1.19+) keys its exact dict on the ActivationType enum while the CSV holds strings, so the act-wildcard dict
    decides [derived]; v0.1.18 and ≤ v0.1.13 key on str(activation) (aiter/fused_moe.py at each tag)."""
    _write(tmp_path / "tuned_fmoe.csv", LEGACY_HEADER, [_row(16, act="ActivationType.Gelu", us=10.0), _row(16)])
    caps = target_capabilities("MI355X", version)
    cs = ac.load_config_set(str(tmp_path), version=version)
    (step,) = simulate(layer(), caps, configs=cs, env={}, tokens=(16,))
    assert step.config.endswith(f"tuned_fmoe.csv:{line}")
    assert any("Gelu" in n for n in step.notes) == (line == 2)


@pytest.mark.parametrize(("version", "m", "bucket"), [
    ("0.1.7", 3, 16), ("0.1.8", 3, 16), ("0.1.9", 3, 4), ("0.1.10.post2", 5000, 2048), ("0.1.11", 20000, 16384),
    ("0.1.12", 100000, 32768), ("0.1.13.post1", 200000, 32768), ("0.1.15.post3", 200000, 131072),
    ("0.1.20.post1", 3, 4),
])
def test_padded_m_per_release(version, m, bucket):
    """get_padded_M as written at each tag (v0.1.7, v0.1.8, v0.1.10.post2, v0.1.12, v0.1.13.post1, v0.1.15.post3)."""
    assert get_padded_M(m, version) == bucket


def test_ep_strip_and_bound_per_release():
    """`topk -= int(is_ep)` arrived in v0.1.16 (aiter PR #3377); ≤ v0.1.13 bf16/fp8 bound was 512
    (AITER_BF16_FP8_BOUND), from v0.1.14 256 (AITER_BF16_FP8_MOE_BOUND)."""
    caps = target_capabilities(*MI355X)
    ds = moe("DeepSeek-V3", tp=8, ep=8)
    assert dispatch_key(ds, caps, model="0.1.15.post3").topk == 8
    assert dispatch_key(ds, caps, model="0.1.16").topk == 7
    key = _key(gate_mode="interleave")
    assert activation_dtype(300, key, {}, "0.1.13.post1")[0] == BF16
    assert activation_dtype(300, key, {"AITER_BF16_FP8_BOUND": "256"}, "0.1.13.post1")[0] == FP8
    assert activation_dtype(300, key, {}, "0.1.15.post3")[0] == FP8


def test_large_token_tier_falls_back_to_smaller_tier(tmp_path):
    """FM _lookup_cfg: a miss at tier 131072 tries 32768."""
    p = _write(tmp_path / "tuned_fmoe.csv", LEGACY_HEADER, [_row(32768)])
    cs = ac.load_config_set(str(tmp_path), version="0.1.20")
    (step,) = simulate(layer(), target_capabilities(*MI355X), configs=cs, env={}, tokens=(200000,))
    assert step.bucket == 131072 and step.basis == "tuned" and any("32768 tier" in n for n in step.notes)


def test_aiter_config_fmoe_replaces_the_set(head, tmp_path, shared_aiter):
    """AITER_CONFIG_FMOE replaces the whole default set (aiter/jit/core.py get_config_file; the trap in
    sgl-project/sglang#37072): a shape tuned in the default set runs heuristics once the env names another file."""
    caps = target_capabilities(*MI355X)
    m3 = moe("MiniMax-M3-MXFP4")
    a = Assumptions(fused_shared_expert=True)
    assert simulate(m3, caps, configs=head, env={}, assumptions=a, tokens=(512,))[0].basis == "tuned"
    other = shared_aiter / "head/aiter/configs/model_configs/gptoss_fp4_tuned_fmoe.csv"
    env = {"AITER_CONFIG_FMOE": str(other)}
    plan = plan_dispatch(m3, caps, env=env, assumptions=a, tokens=(512,))
    assert plan.steps[0].basis == "heuristic" and plan.configs.startswith("AITER_CONFIG_FMOE=")


@pytest.mark.parametrize(("env", "family", "basis"), [
    ({}, "flydsl", "tuned"),
    ({"AITER_BYPASS_TUNE_CONFIG": "1"}, "flydsl", "heuristic"),
])
def test_bypass_tune_config(head, env, family, basis):
    """AITER_BYPASS_TUNE_CONFIG=1 ignores tuned rows (FM get_2stage_cfgs); a Silu MXFP4 layer then takes the FlyDSL
    heuristic (AITER_FLYDSL_FORCE defaults to 1)."""
    caps = target_capabilities(*MI355X)
    r1 = layer(hidden=7168, intermediate=2048, experts=256, top_k=8, **MXFP4)
    (step,) = simulate(r1, caps, configs=head, env=env, tokens=(64,))
    assert (step.family.split("+")[0], step.basis) == (family, basis)


def test_flydsl_force_off_routes_mxfp4_heuristic_to_ck(head):
    """With AITER_FLYDSL_FORCE=0 a Silu MXFP4 layer without a row is not sent to the FlyDSL heuristic; it falls
    through to CK 2-stage (q_dtype_w fp4x2 is in the CK list)."""
    caps = target_capabilities(*MI355X)
    odd = layer(hidden=4096, intermediate=4096, experts=64, top_k=4, **MXFP4)
    on = simulate(odd, caps, configs=head, env={"AITER_BYPASS_TUNE_CONFIG": "1"}, tokens=(64,))[0]
    off = simulate(odd, caps, configs=head, env={"AITER_BYPASS_TUNE_CONFIG": "1", "AITER_FLYDSL_FORCE": "0"},
                   tokens=(64,))[0]
    assert on.family == "flydsl" and off.family == "ck"


def test_consecutive_alike_counts_group(head):
    """Consecutive token counts that decide alike become one step with a [lo, hi] range."""
    caps = target_capabilities(*MI355X)
    steps = simulate(layer(), caps, configs=head, env={}, tokens=(1, 2, 3, 4, 64, 128))
    # get_ksplit differs at M = 1 / 2 / 3-4 (14 / 7 / 4): a range never carries one count's ksplit for the others
    assert [(s.tokens, s.ksplit) for s in steps] == [((1, 1), 14), ((2, 2), 7), ((3, 4), 4), ((64, 128), 0)]
    assert steps[2].buckets == (4,) and steps[3].buckets == (64, 128) and steps[3].bucket == 64


def test_malformed_csv_warns_with_file_and_line(tmp_path):
    """A row with more fields than the header (pandas fails on it) or a non-numeric key gives a warning naming file
    and line; dispatch then falls back to heuristics and says so. Never a traceback."""
    rows = [_row(1), _row(2) + ["extra"], ["256", "x"] + _row(4)[2:]]
    _write(tmp_path / "tuned_fmoe.csv", LEGACY_HEADER, rows)
    cs = ac.load_config_set(str(tmp_path), version="0.1.20")
    assert cs.broken
    assert any(w.endswith("tuned_fmoe.csv:3: 27 fields, the header has 26") for w in cs.warnings)
    assert any("tuned_fmoe.csv:4: bad number" in w for w in cs.warnings)
    plan = plan_dispatch(layer(), target_capabilities(*MI355X), configs=cs, env={}, tokens=(1,))
    assert plan.steps[0].basis == "heuristic" and any("malformed" in n for n in plan.steps[0].notes)
    assert any("tuned_fmoe.csv:3" in w for w in plan.warnings)
    (tmp_path / "bad").mkdir()
    _write(tmp_path / "bad" / "tuned_fmoe.csv", ["cu_num", "token"], [[256, 1]])
    bad = ac.load_config_set(str(tmp_path / "bad"), version="0.1.20")
    assert bad.broken and "tuned_fmoe.csv:1: header lacks column(s)" in bad.warnings[0]


def test_bad_input_is_one_line_usage_error(head):
    caps = target_capabilities(*MI355X)
    with pytest.raises(UsageError):
        simulate(layer(), caps, configs=head, tokens=(0,))
    with pytest.raises(UsageError):
        simulate(layer(), caps, configs=head, tokens=())
    with pytest.raises(UsageError):
        parse_env_args(["NOEQUALS"])
    with pytest.raises(UsageError):
        ac.load_config_set("/no/such/dir")


@pytest.mark.parametrize(("name", "family"), [
    ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w4", "flydsl"), ("flydsl_mxmoe_g1_a4w4_16x256x256_f16in_nt", "flydsl"),
    ("opus_moe2_afp8_wfp4_fp8_t64x256x256_sbm64_rbn3584", "opus"), ("cktile_a8w4_bm32", "cktile"),
    (CK1, "ck"), ("_ZN5aiter43fmoe_bf16_blockscaleFp8_g1u1_vs_silu_64x256E", "asm"),
    ("fmoe_fp8_blockscale_g1u1 (default)", "asm"), ("", "unknown"),
])
def test_kernel_family(name, family):
    """Families from AITER's kernel naming (FM dispatch on name prefixes)."""
    assert kernel_family(name) == family


def test_dispatch_issues_toml_loads_with_sources():
    issues = dispatch_issues()
    ids = {i.id for i in issues}
    assert {"ROCm/aiter#3933", "ROCm/aiter#4788", "ROCm/aiter#3471", "ROCm/aiter#5233"} <= ids
    for i in issues:
        assert i.source.startswith("https://github.com/") and i.confidence in ("confirmed", "derived", "unconfirmed")


# -- lint ------------------------------------------------------------------------------------------------------------

def test_lint_head_snapshot(head):
    """On the HEAD set: 598 rows share their us with another bucket of the same shape (copied timings), some rows
    are faster than reading their weights at 8 TB/s, cu_num 256 and 304 are each shared by two products."""
    from moedispatch.aiter import lint as aiter_lint

    report = aiter_lint.lint(head)
    summary = dict(report.counts)
    assert summary["rows"] == 2402 and summary["rows_copied_timing"] == 598
    assert summary["rows_faster_than_hbm"] >= 1
    # Newcomer minor 28: a timing copied into larger buckets is said once (copied-timing), not again as 170 rows
    # "faster than compute" at the buckets it was pasted into; the genuinely impossible measurements remain.
    copies = {w for f in report.findings if f.check == "copied-timing" for w in f.rows}
    fast = [f for f in report.findings if f.check in ("faster-than-compute", "faster-than-hbm")]
    assert fast and summary["rows_faster_than_compute"] < 10
    for f in fast:
        (where,) = f.rows
        same = [g for g in report.findings if g.check == "copied-timing" and where in g.rows]
        # never a copy: either not in a copied group, or the smallest bucket of it (the value's own bucket)
        assert not same or all(min(int(x) for x in _tokens(g)) == _token(f) for g in same), f.message
    assert copies
    shared = {f.message.split(" apply to ")[1].split(":")[0] for f in report.findings if f.check == "shared-cu-num"}
    assert any("MI300X" in s and "MI325X" in s for s in shared) and any("MI355X" in s and "MI350X" in s for s in shared)
    assert any(f.check == "shadowed" and "flydsl_fallback" in f.message for f in report.findings)


def _tokens(finding):
    return finding.message.split("for token buckets ")[1].split(" (copied")[0].split(", ")


def _token(finding):
    return int(finding.message.split(" at token ")[1].split(" ")[0])


def test_physical_floor():
    """A 7168x256 fp8 row at token 1 with top-8 reads 8 experts' weights: 8·7168·768 bytes = 44 MB → 5.5 µs at
    8 TB/s."""
    from moedispatch.aiter import lint as aiter_lint

    cs_row = ac.TunedRow(file="x", line=2, gfx="gfx950", cu_num=256, token=1, model_dim=7168, inter_dim=256,
                         expert=256, topk=8, act_type=SILU, dtype=BF16, q_dtype_a=FP8, q_dtype_w=FP8,
                         q_type=Q_1X128, use_g1u1=1, doweight_stage1=0, block_m=32, us=1.0)
    assert aiter_lint.physical_floor_us(cs_row, 8.0) == pytest.approx(8 * 7168 * 768 / 8e12 * 1e6)


def test_cli_aiter_configs(cli):
    out = cli("aiter-configs", "--aiter-version", "head", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "moedispatch.aiter_configs/1" and doc["summary"]["rows"] == 2402
    bad = cli("aiter-configs", "--aiter-version", "x!y")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    env = cli("aiter-configs", "--aiter-env", "NOPE")
    assert env.returncode == 2 and "KEY=VALUE" in env.stderr


def test_pure_python_and_lazy():
    """Importing and running the model imports no aiter/torch/numpy/pandas, and importing reads no CSV."""
    code = ("import sys; import moedispatch.aiter.dispatch as ad, moedispatch.data.aiter_configs as ac; "
            "assert ac._load_cached.cache_info().currsize == 0; "
            "from moedispatch.data.capdb import target_capabilities as t; from moedispatch.core.layers import MoELayer; "
            "l = MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight='mxfp4', "
            "act='mxfp4'); ad.simulate(l, t('MI355X', '0.1.20'), configs=ac.load_config_set('head'), env={}); "
            "bad = [m for m in ('aiter', 'torch', 'numpy', 'pandas') if m in sys.modules]; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_issue_predicates_bucket_version_and_stage(head):
    """An issue keyed on a bucket hits only that bucket; a version range outside the plan's AITER never hits; a
    stage-restricted regex looks only at that stage's kernel."""
    caps = target_capabilities(*MI355X)
    plan = plan_dispatch(layer(), caps, configs=head, env={}, tokens=(1, 4, 64))
    raw = [dispatch_token(m, plan.key, head, env={}) for m in (1, 4, 64)]
    base = dict(id="x#1", title="t", source="https://github.com/x/y/issues/1", status="open", kernel=".",
                effect="e", workaround="w", confidence="confirmed", severity="error")
    only4 = DispatchIssue(**base, buckets=(4,))
    assert [h.bucket for h in evaluate_issues(raw, plan.key, "0.1.20", [only4])] == [4]
    old = DispatchIssue(**base, aiter="<0.1.10")
    assert evaluate_issues(raw, plan.key, "0.1.20", [old]) == ()
    stage2 = DispatchIssue(**{**base, "kernel": "gemm1"}, stage=2)
    assert evaluate_issues(raw, plan.key, "0.1.20", [stage2]) == ()


@pytest.mark.parametrize("token", [32, 64])
def test_replay_op_tests_bm16_tiled_scale_boundary(head, token):
    """op_tests/test_moe_2stage.py::test_bm16_tiled_scale_boundary at the HEAD snapshot: get_2stage_cfgs for
    (7168, 512, 385 experts, top-7, per_1x32 fp8 x fp4x2, Silu, INTERLEAVE) at M = 32 and 64 picks block_m 16 and
    these two FlyDSL kernels. Here: DeepSeek-V4-Pro TP8 with a fused shared expert, interleaved gate/up and
    AITER_BF16_FP8_MOE_BOUND=0 (fp8 activations), as the test runs it."""
    caps = target_capabilities(*MI355X)
    dsv4 = layer(hidden=7168, intermediate=4096, experts=384, top_k=6, **MXFP4)
    (step,) = simulate(dsv4, caps, configs=head, env={"AITER_BF16_FP8_MOE_BOUND": "0"}, tokens=(token,),
                       assumptions=Assumptions(fused_shared_expert=True, gate_mode="interleave"))
    assert step.block_m == 16 and step.basis == "tuned" and step.q_dtype_a == FP8
    assert step.kernels == ("flydsl_moe1_afp8_wfp4_bf16_t16x128x256_w3_gui_fp8",
                            "flydsl_moe2_afp8_wfp4_bf16_t16x256x256_atomic")


def test_a8w4_bypass_quant_is_flagged(head):
    """AITER_MOE_A8W4_BYPASS_QUANT=1 makes fused_moe_2stages skip activation quantization and feed unit scales
    (FM "Debug bypass"): a plan whose steps run fp8 activations on MX weights warns."""
    caps = target_capabilities(*MI355X)
    dsv4 = layer(hidden=7168, intermediate=4096, experts=384, top_k=6, **MXFP4)
    env = {"AITER_BF16_FP8_MOE_BOUND": "0", "AITER_MOE_A8W4_BYPASS_QUANT": "1"}
    plan = plan_dispatch(dsv4, caps, configs=head, env=env, assumptions=Assumptions(gate_mode="interleave"),
                         tokens=(64,))
    assert any("AITER_MOE_A8W4_BYPASS_QUANT" in w for w in plan.warnings)
    clean = plan_dispatch(dsv4, caps, configs=head, env={"AITER_BF16_FP8_MOE_BOUND": "0"},
                          assumptions=Assumptions(gate_mode="interleave"), tokens=(64,))
    assert not any("BYPASS_QUANT" in w for w in clean.warnings)


def test_pad_hazard_when_the_picked_kernel_computes_over_pads(head):
    """A plan that pads intermediate 384 → 512 without zero-fill is unsafe wherever AITER picks a kernel that
    computes over the pad (ASM/CK: https://github.com/ROCm/aiter/issues/5413); zero-fill clears it."""
    from moedispatch.core.backend import Padding

    caps = target_capabilities(*MI355X)
    ds = layer(intermediate=3072)  # 384 per rank at TP8, fp8 128x128 blocks: CK/ASM family
    pad = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=0)
    plan = plan_dispatch(ds, caps, configs=head, env={}, padding=pad, tokens=(1, 64))
    hz = [h for h in plan.issues if h.issue == "pad-not-zeroed"]
    assert hz and hz[0].tokens == (1, 64) and plan.key.inter_dim == 512
    zeroed = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, zero_fill=True)
    assert not [h for h in plan_dispatch(ds, caps, configs=head, env={}, padding=zeroed, tokens=(1, 64)).issues
                if h.issue == "pad-not-zeroed"]


def test_compute_floor():
    """Useful FLOPs 2·M·k·D·(n1+I) at the fp8 peak (gpus.toml [peak.MI355X], 5.0 PF dense): a per_1x128 7168x256
    row at M=32768, top-8 needs 2·32768·8·7168·768 / 5.0e15 s ≈ 577 µs on MI355X; a product without peak figures
    gives no floor."""
    from moedispatch.aiter import lint as aiter_lint

    row = ac.TunedRow(file="x", line=2, gfx="gfx950", cu_num=256, token=32768, model_dim=7168, inter_dim=256,
                      expert=256, topk=8, act_type=SILU, dtype=BF16, q_dtype_a=FP8, q_dtype_w=FP8,
                      q_type=Q_1X128, use_g1u1=1, doweight_stage1=0, block_m=64, us=1.0)
    fp8 = aiter_lint._tflops("MI355X")[0][1]
    assert fp8 in (5000.0, 5033.2)
    assert aiter_lint.compute_floor_us(row, "MI355X") == pytest.approx(2 * 32768 * 8 * 7168 * 768 / (fp8 * 1e12) * 1e6)
    assert aiter_lint.compute_floor_us(row, "RX 9070 XT") is None


@pytest.mark.parametrize(("text", "expected"), [
    ("1,4,64,512,8192", (1, 4, 64, 512, 8192)), ("8192,1,1", (1, 8192)), ("3-20", (3, 4, 8, 16, 20)),
])
def test_parse_tokens(text, expected):
    assert parse_tokens(text) == expected


@pytest.mark.parametrize("text", ["", "a", "0", "5-2", "1,,x"])
def test_parse_tokens_rejects(text):
    with pytest.raises(UsageError):
        parse_tokens(text)


def test_assumptions_from_vllm_env():
    """VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 fuses a same-size single shared expert (MiniMax-M3, DeepSeek-V3:
    one shared expert of the routed size) into the routed call; off by default (vLLM's default)."""
    m3 = moe("MiniMax-M3-MXFP4")
    assert Assumptions.from_engine_env(m3, {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}).fused_shared_expert
    assert not Assumptions.from_engine_env(m3, {}).fused_shared_expert
    qwen = moe("Qwen3-235B-A22B-Instruct-2507-FP8")
    assert not Assumptions.from_engine_env(qwen, {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}).fused_shared_expert


def test_dispatch_warnings_carry_their_confidence_as_values():
    """Each dispatch warning has its confidence beside it (``warning_confidence``), and the reasons take it from
    there, not from the wording: the gfx942 MX failure is our inference (derived); a duplicate-row note is read."""
    from moedispatch.selector.runtime import dispatch_reasons

    mx = layer(hidden=7168, intermediate=2048, experts=256, top_k=8, weight="mxfp4", act="mxfp4")
    plan = plan_dispatch(mx, target_capabilities("MI300X", "0.1.20"), tokens=(1,))
    assert len(plan.warning_confidence) == len(plan.warnings)
    gfx = plan.warnings.index(next(w for w in plan.warnings if w.startswith("AITER's MX (per_1x32)")))
    assert plan.warning_confidence[gfx] == "derived"
    notes = {r.text: r.confidence for r in dispatch_reasons(plan, "aiter-ck", "ck") if r.kind == "note"}
    assert notes[plan.warnings[gfx]] == "derived"
    import dataclasses

    reworded = dataclasses.replace(plan, warnings=tuple(w.replace("(derived", "(inferred") for w in plan.warnings))
    assert {r.confidence for r in dispatch_reasons(reworded, "aiter-ck", "ck") if r.kind == "note"
            and r.text.startswith("AITER's MX")} == {"derived"}
    confirmed = dataclasses.replace(plan, warning_confidence=("confirmed",) * len(plan.warnings))
    assert all(r.confidence == "confirmed" for r in dispatch_reasons(confirmed, "aiter-ck", "ck") if r.kind == "note")


# -- what AITER's real code does where the model disagreed (peer run against ROCm/aiter@e4048607) -----------------
# Each case is the minimal case of one disagreement class; AITER's behaviour is quoted from aiter/fused_moe.py at
# e4048607 (line numbers in the model's docstrings and notes).

MI300X_HEAD = ("MI300X", "0.1.20.post1")


def test_rc1_w4a8_activation_is_the_arch_fp8(head):
    """q_dtype_a = w1.dtype if w1.dtype != torch.uint32 else dtypes.fp8 (line 759): dtypes.fp8 is e4m3fnuz on gfx942."""
    w4a8 = layer(hidden=2048, intermediate=96, experts=8, top_k=2, tp=1, weight=QuantSpec("int4", "channel"),
                 act=QuantSpec("fp8", "token", dynamic=True))
    (step,) = simulate(w4a8, target_capabilities(*MI300X_HEAD), configs=head, env={}, tokens=(1,))
    assert step.q_dtype_a == FP8_FNUZ and step.block_m == 32
    (step,) = simulate(w4a8, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,))
    assert step.q_dtype_a == FP8


def test_rc2_one_stage_op_follows_the_quant_type(head):
    """fused_moe_1stage picks aiter.fmoe_fp8_blockscale_g1u1 for per_1x128 (line 1178), whatever the dict's value."""
    (step,) = simulate(layer(hidden=2048, intermediate=128, experts=8, top_k=2, tp=1),
                       target_capabilities(*MI300X_HEAD), configs=head, env={}, tokens=(64,))
    assert step.stages == 1 and step.kernels == ("fmoe_fp8_blockscale_g1u1 (default)",)


def test_rc3_gfx942_mxfp8_is_not_dtypes_fp8(head):
    """On gfx942 dtypes.fp8 is e4m3fnuz, so e4m3fn MX weights miss the mxfp8 branch (line 772): fp4x2 activations,
    no FlyDSL (its test is q_dtype_w in (fp4x2, dtypes.fp8)), ASM stage 1 + CK stage 2 with get_ksplit."""
    mxfp8 = layer(hidden=2048, intermediate=96, experts=8, top_k=2, tp=1, weight="mxfp8", act="mxfp8")
    (step,) = simulate(mxfp8, target_capabilities(*MI300X_HEAD), configs=head, env={}, tokens=(1,))
    assert (step.q_dtype_a, step.family, step.ksplit) == (FP4, "asm+ck", 8)
    (on_950,) = simulate(mxfp8, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,))
    assert on_950.q_dtype_a == FP8 and on_950.family == "flydsl"


@pytest.mark.parametrize(("assume", "why"), [
    ({}, "expert-parallel masking"),
    ({"flydsl_available": False}, "requires the FlyDSL kernel"),
])
def test_rc4_a16w4_situv2_refusals_raise(head, assume, why):
    """_fused_moe_impl raises NotImplementedError for a16w4 SiTUv2 under EP / without FlyDSL / with bias or
    unshuffled weights (lines 854-880). Kimi-K3-MXFP4 at EP8 hits it at every M: the plan says so, and the hit blocks
    (no environment makes this call run: AITER_SITUV2_A8W4=1 changes the activation numerics)."""
    k3 = moe("Kimi-K3-MXFP4", tp=8, ep=8 if not assume else 1)
    plan = plan_dispatch(k3, target_capabilities(*MI355X), configs=head, env={}, tokens=(1, 64),
                         assumptions=Assumptions(**assume))
    (step,) = plan.steps
    assert step.tokens == (1, 64) and step.family == "none" and why in step.raises
    assert step.raises.startswith("NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 is not supported")
    (hit,) = plan.issues
    assert hit.issue == "aiter-raises" and hit.raises and hit.blocking and not hit.workaround_env
    assert plan.backends == ()
    a8w4 = plan_dispatch(k3, target_capabilities(*MI355X), configs=head, env={"AITER_SITUV2_A8W4": "1"},
                         tokens=(1, 64), assumptions=Assumptions(**assume))
    assert not any(s.raises for s in a8w4.steps) or assume  # without FlyDSL a8w4 goes elsewhere


def test_rc4_kimi_k3_ep8_explain_never_plans_a_path_aiter_raises_on(cli):
    """Done when: explain --model Kimi-K3-MXFP4 --target MI355X --tp 8 --ep 8 never plans a path AITER raises on."""
    out = cli("explain", "--model", "Kimi-K3-MXFP4", "--target", "MI355X", "--tp", "8", "--ep", "8",
              "--aiter-version", "0.1.20.post1", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for entry in doc["layers"]:
        assert not any(s.get("raises") for s in entry.get("aiter_dispatch") or []), entry["backend"]
        assert entry["backend"] != "aiter-flydsl"


def test_rc5_flydsl_rows_without_flydsl_reach_asm_and_ck_launchers(head):
    """A FlyDSL-named row with flydsl not importable falls through to the last branch: asm_stage1 and
    ck_moe_stage2_fwd are handed FlyDSL names — family asm+ck, and nothing to launch."""
    (step,) = simulate(moe("MiniMax-M2.5-MXFP4", tp=4), target_capabilities(*MI355X), configs=head, env={},
                       tokens=(1,), assumptions=Assumptions(flydsl_available=False))
    assert step.family == "asm+ck" and step.kernels[0].startswith("flydsl_moe1_") and "FlyDSL kernel names" in step.raises
    assert step.config.endswith("minimax_m25_fp4_tuned_fmoe.csv:18")


def test_the_last_branch_hands_stage_2_to_the_launcher_its_name_selects(head):
    """Without flydsl a DeepSeek-V4 a8w4 row (FlyDSL stage 1, Opus stage 2) falls through to the last branch: stage 1
    is asm_stage1 (handed a FlyDSL name), stage 2 goes to opus_a8w4_stage2_wrapper, not ck_moe_stage2_fwd
    (ROCm/aiter@e4048607:aiter/fused_moe.py get_2stage_cfgs, last branch: is_opus_a8w4_stage2_kernel / cktile_ /
    else CK). Found by the AITER peer suite once a8w4 dispatched FP8 activations (issue 23)."""
    ds4 = layer(hidden=7168, intermediate=384, experts=384, top_k=6, tp=1, weight="mxfp4", act="fp8")
    (step,) = simulate(ds4, target_capabilities(*MI355X), configs=head, env={}, tokens=(256,),
                       assumptions=Assumptions(flydsl_available=False, gate_mode="interleave"))
    assert step.kernels[0].startswith("flydsl_moe1_") and step.kernels[1].startswith("opus_moe2_")
    assert step.family == "asm+opus" and "Opus stage-2" in step.raises


def test_rc6_bypass_with_an_opus_row_raises(head):
    """AITER_BYPASS_TUNE_CONFIG keeps cfg; parse_stage2_config(cfg, heuristic block_m) raises ValueError when the
    Opus kernel's sort block_m differs (line 2456; aiter/ops/opus/moe_stage2_a8w4.py)."""
    ds4 = layer(hidden=7168, intermediate=384, experts=384, top_k=6, tp=1, **MXFP4)
    a = Assumptions(gate_mode="interleave")
    (tuned,) = simulate(ds4, target_capabilities(*MI355X), configs=head, env={}, tokens=(256,), assumptions=a)
    assert tuned.kernels[1].startswith("opus_moe2_") and tuned.block_m == 32 and tuned.raises is None
    plan = plan_dispatch(ds4, target_capabilities(*MI355X), configs=head, env={"AITER_BYPASS_TUNE_CONFIG": "1"},
                         tokens=(256,), assumptions=a)
    assert plan.steps[0].raises.startswith("ValueError: requires sort block_m=32, got tuned block_m=64")
    assert plan.issues[0].blocking and "unset AITER_BYPASS_TUNE_CONFIG" in plan.issues[0].workaround


def test_rc7_a_cktile_stage2_name_is_not_launched(head):
    """cktile_moe_stage2 is built without kernelName (line 2584): the row's cktile_a8w4_bm32 is dropped."""
    l = layer(hidden=7168, intermediate=3072, experts=48, top_k=6, tp=1, **MXFP4)
    (step,) = simulate(l, target_capabilities(*MI355X), configs=head, env={}, tokens=(256,),
                       assumptions=Assumptions(gate_mode="interleave"))
    assert step.config.endswith("dsv4_fp8fp4_tuned_fmoe.csv:98")
    assert step.kernels[1] == "cktile_moe_stage2 (default)" and any("cktile_a8w4_bm32" in n for n in step.notes)


def test_rc8_opus_rows_are_refused_under_ep(head):
    """_opus_a8w4.cfg_is_supported rejects EP: AITER drops the row and runs the FlyDSL heuristic."""
    l = layer(hidden=7168, intermediate=384, experts=384 * 8, top_k=6, tp=1, ep=8, **MXFP4)
    (step,) = simulate(l, target_capabilities(*MI355X), configs=head, env={}, tokens=(256,),
                       assumptions=Assumptions(gate_mode="interleave", ep_fake_slot=True))
    assert (step.basis, step.family) == ("heuristic", "flydsl") and not any(k.startswith("opus") for k in step.kernels)
    assert any("Opus stage2 config unsupported (EP" in n for n in step.notes)


def test_rc9_the_a4w4_port_raises_under_ep(head):
    """'MXFP4 a4w4 FlyDSL port does not support expert-parallel yet' (line 937)."""
    k25 = layer(hidden=7168, intermediate=256, experts=384 * 8, top_k=8, tp=8, ep=8, **MXFP4)
    a = Assumptions(fused_shared_expert=True, ep_fake_slot=True)
    plan = plan_dispatch(k25, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,), assumptions=a)
    (step,) = plan.steps
    assert step.kernels[0].startswith("flydsl_mxmoe_g1_a4w4") and "does not support expert-parallel" in step.raises
    assert plan.issues[0].blocking
    tp_only = layer(hidden=7168, intermediate=2048, experts=384, top_k=8, tp=8, **MXFP4)
    (ok,) = simulate(tp_only, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,),
                     assumptions=Assumptions(fused_shared_expert=True))
    assert ok.raises is None and ok.kernels[0].startswith("flydsl_mxmoe_g1_a4w4")


# -- release-keyed bugs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "hit"), [("0.1.17", True), ("0.1.18", False)])
def test_split_k_with_one_k_tile_per_split_before_0_1_18(version, hit):
    """Done when: Qwen3.5-FP8 TP8 on AITER 0.1.17 warns of the one-k-tile split-K at batch 1; 0.1.18 does not
    (ROCm/aiter PR #3997: get_ksplit gives 16 at M=1, model_dim 4096 / 16 = 256 = one k-tile of the block_m-16
    instance)."""
    caps = target_capabilities("MI300X", version)
    plan = plan_dispatch(moe("Qwen3.5-397B-A17B-FP8", tp=8), caps, env={}, tokens=(1, 4))
    assert [(s.tokens, s.ksplit) for s in plan.steps] == [((1, 1), 16), ((4, 4), 8)]
    hits = [h for h in plan.issues if h.issue == "ROCm/aiter#3997"]
    assert [h.tokens for h in hits] == ([(1, 1)] if hit else [])   # M=4: split 8 → two k-tiles per split
    if hit:
        assert dict(hits[0].workaround_env) == {"AITER_KSPLIT": "-1"} and not hits[0].blocking
        fixed = plan_dispatch(moe("Qwen3.5-397B-A17B-FP8", tp=8), caps, env={"AITER_KSPLIT": "-1"}, tokens=(1,))
        assert not [h for h in fixed.issues if h.issue == "ROCm/aiter#3997"]


@pytest.mark.parametrize(("version", "hit"), [("0.1.19", False), ("0.1.19.post1", True), ("0.1.19.post2", True),
                                              ("0.1.20", False)])
def test_flat_rows_refused_on_gfx942_in_0_1_19_post1_and_post2(version, hit):
    """v0.1.19.post1/.post2 assert FLAT kernels are gfx950-only while their glm5_1 rows pick one on gfx942 at
    buckets 4 and 8 (PR #4628; fixed by #4558 in v0.1.20; v0.1.19 allowed gfx942)."""
    plan = plan_dispatch(moe("GLM-5-FP8", tp=8), target_capabilities("MI300X", version), env={}, tokens=(1, 4, 8, 64))
    flat = [s for s in plan.steps if s.row is not None and s.row.flat]
    hits = [h for h in plan.issues if h.issue == "ROCm/aiter#4394"]
    if hit:
        assert [s.tokens for s in flat] == [(4, 4), (8, 8)] and [h.tokens for h in hits] == [(4, 8)]
        assert all(h.raises and dict(h.workaround_env) == {"AITER_BYPASS_TUNE_CONFIG": "1"} for h in hits)
    else:
        assert not hits


def test_compare_shows_the_flat_difference_between_releases(cli):
    """Done when: compare --model GLM-5-FP8 --target MI300X --aiter-version 0.1.19.post1,0.1.20 shows it."""
    out = cli("compare", "--model", "GLM-5-FP8", "--target", "MI300X", "--tp", "8", "--aiter-version",
              "0.1.19.post1,0.1.20", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    moe_groups = [g for g in doc["groups"] if g["kind"] == "moe"]
    assert moe_groups and all(g["differs"] and "known issues" in g["differs_in"] for g in moe_groups)
    a, b = moe_groups[0]["decisions"]
    assert [i["issue"] for i in a["known_issues"]].count("ROCm/aiter#4394") == 1
    assert not [i for i in b["known_issues"] if i["issue"] == "ROCm/aiter#4394"]
    text = cli("compare", "--model", "GLM-5-FP8", "--target", "MI300X", "--tp", "8", "--aiter-version",
               "0.1.19.post1,0.1.20").stdout
    assert "DIFFERS in known issues" in text and "FLAT fmoe asm kernels are gfx950-only" in text


# -- the PyPI wheel (0.1.7 rules) against its own code, and SiTUv2 before it existed ---------------------------------

def test_legacy_one_stage_op_and_fp8_flavour():
    """amd-aiter 0.1.7.post2.dev18 aiter/fused_moe.py: fused_moe_1stage picks the op by quant type (lines 313-400;
    per_1x128 → fmoe_fp8_blockscale_g1u1) and q_dtype_a = dtypes.fp8 for uint32 weights (line 220: e4m3fnuz on
    gfx942)."""
    caps = target_capabilities("MI300X", "0.1.7")
    # the wheel's heuristic: per_1x128 runs 1-stage when inter_dim % 256 == 0
    key = dispatch_key(layer(hidden=2048, intermediate=256, experts=8, top_k=2, tp=1), caps, model="legacy")
    step = dispatch_token(64, key, None, env={}, model="legacy")
    assert step.stages == 1 and step.kernels == ("fmoe_fp8_blockscale_g1u1 (default)",)
    w4a8 = layer(hidden=2048, intermediate=96, experts=8, top_k=2, tp=1, weight=QuantSpec("int4", "channel"),
                 act=QuantSpec("fp8", "token", dynamic=True))
    key = dispatch_key(w4a8, caps, model="legacy")
    assert dispatch_token(1, key, None, env={}, model="legacy").q_dtype_a == FP8_FNUZ


@pytest.mark.parametrize(("version", "raises"), [("0.1.7", True), ("0.1.18", True), ("0.1.19", False)])
def test_situv2_cannot_be_asked_of_an_aiter_without_it(version, raises):
    """ActivationType gains Situv2 in v0.1.19 (aiter_enum.h; absent from the 0.1.7 wheel and v0.1.18)."""
    k3 = moe("Kimi-K3-MXFP4", tp=8)
    plan = plan_dispatch(k3, target_capabilities("MI355X", version), env={}, tokens=(1,))
    (step,) = plan.steps
    assert bool(step.raises and "has no attribute 'Situv2'" in step.raises) == raises
    if raises:
        assert plan.issues[0].blocking


def test_ck_stage1_row_with_a_flydsl_stage2_without_flydsl(head):
    """fused_moe.py lines 2888, 2909-2916: a CK stage-1 row's FlyDSL stage 2 runs only with flydsl importable;
    otherwise ck_moe_stage2_fwd is handed the FlyDSL name (MiniMax-M2.5-MXFP4 TP2, M=4096, row :46)."""
    (step,) = simulate(moe("MiniMax-M2.5-MXFP4", tp=2), target_capabilities(*MI355X), configs=head, env={},
                       tokens=(4096,), assumptions=Assumptions(flydsl_available=False))
    assert step.config.endswith("minimax_m25_fp4_tuned_fmoe.csv:46") and "ck2stages" in step.kernels[0]
    assert step.family == "ck" and step.kernels[1].startswith("flydsl_moe2") and "CK stage-2" in step.raises
    (fly,) = simulate(moe("MiniMax-M2.5-MXFP4", tp=2), target_capabilities(*MI355X), configs=head, env={},
                      tokens=(4096,))
    assert fly.raises is None


def test_a_hit_range_never_spans_a_step_it_does_not_apply_to(head):
    """evaluate_issues / raising_hits / pad_hazards merge only consecutive steps: an issue at tokens 1 and 8 with a
    clean step at 4 between them is two hits, never one for 1–8 (found by the mutation run)."""
    def step(m, kernels, raises=None):
        return DispatchStep(tokens=(m, m), bucket=m, stages=2, family="ck", kernels=kernels, block_m=16,
                               activation_dtype="fp8", basis="heuristic", config=None, raises=raises)

    key = dispatch_key(layer(), target_capabilities(*MI355X))
    issue = DispatchIssue(id="x", title="t", source="s", status="open", kernel="^bad", effect="e", workaround="w",
                             confidence="derived", severity="error")
    steps = [step(1, ("bad1", "k2")), step(4, ("good1", "k2")), step(8, ("bad1", "k2"))]
    assert [h.tokens for h in evaluate_issues(steps, key, "0.1.20", issues=[issue])] == [(1, 1), (8, 8)]
    raising = [step(1, (), "ValueError: x"), step(4, ("good1",)), step(8, (), "ValueError: x")]
    assert [h.tokens for h in raising_hits(raising, key, {})] == [(1, 1), (8, 8)]
    together = [step(1, ("bad1", "k2")), step(2, ("bad1", "k2"))]
    assert [h.tokens for h in evaluate_issues(together, key, "0.1.20", issues=[issue])] == [(1, 2)]
