"""Tests that kill surviving mutants of the AITER dispatch model (moedispatch/aiter/), found with
``benchmarks/mutation.py --only moedispatch/aiter/dispatch.py`` (before the module was split; now its walk.py etc.).

Every expectation comes from AITER's own code or capability_db data:

* FM = ROCm/aiter@e4048607 ``aiter/fused_moe.py`` (the HEAD the model replays; ``git show e4048607:aiter/fused_moe.py``
  in a ROCm/aiter clone). Line numbers below are at that commit.
* FM017 = ROCm/aiter@v0.1.7 ``aiter/fused_moe.py`` (byte-identical to the PyPI wheel amd-aiter 0.1.7.post2.dev18 the
  legacy rules model).
* The oracles ``fm_*`` below are line-for-line transcriptions of AITER functions, so a test that compares the model
  with one of them states AITER's answer, not the model's.

Tuned tables are synthetic one-row ``ConfigSet``\\ s where a case needs a row (AITER's lookup is an exact dict
lookup, FM get_2stage_cfgs ``_lookup_cfg``), so the tests run in well under a second each.
"""

from __future__ import annotations

import pytest

from moedispatch.aiter import dispatch as ad
from moedispatch.aiter.activation import activation_dtype
from moedispatch.aiter.fhmoe import fhmoe_config_scope, fhmoe_lookup, _fhmoe_rows, fhmoe_supports
from moedispatch.aiter.flydsl import _flydsl_heuristic_names
from moedispatch.aiter.hazards import pad_hazards, raising_hits
from moedispatch.aiter.heuristics import (_block_size_M, _ksplit, _one_stage_op, _situv2_a16w4_refusal, _stage2_name,
                                          _tier_block_m)
from moedispatch.aiter.issues import DispatchIssue, evaluate_issues, _issue_matches, IssueHit
from moedispatch.aiter.key import dispatch_key, DispatchKey
from moedispatch.aiter.lookup import _index
from moedispatch.aiter.rules import _at_least, get_padded_M, HEAD_RULES, LEGACY_RULES, lookup_rules
from moedispatch.aiter.steps import DispatchStep, _family, _group, kernel_family, parse_info_line
from moedispatch.aiter.vocab import (BF16, FP16, FP4, FP8, FP8_FNUZ, GELU, I4, I8, _label, Q_1X128, Q_1X32, Q_NO,
                                     Q_TENSOR, Q_TOKEN, SILU, SITUV2, SWIGLU, U32)
from moedispatch.aiter.walk import dispatch_token
from moedispatch.aiter.dispatch import Assumptions, plan_dispatch
from moedispatch.core.errors import UsageError
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.data import aiter_configs as ac
from moedispatch.data.capdb import target_capabilities
from moedispatch.data.tuned_row import TunedRow
from moedispatch.sources import models

FM = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py"
FM017 = "https://github.com/ROCm/aiter/blob/v0.1.7/aiter/fused_moe.py"
MI355X = ("MI355X", "0.1.20.post1")


# -- oracles: AITER's functions, transcribed ---------------------------------------------------------------------

def fm_get_block_size_M(token, topk, expert, inter_dim, cu_num):
    """FM get_block_size_M (lines 1227-1240; identical in FM017 except sorted()[0] for min())."""
    tgN = (inter_dim + 128 - 1) // 128
    tmp = []
    for el in [32, 64, 128]:
        max_num_tokens = token * topk + expert * el - topk
        tg_num = tgN * (max_num_tokens + el - 1) // el
        rnd = (tg_num + cu_num - 1) // cu_num
        empty = cu_num - tg_num % cu_num
        tmp.append((rnd, empty, el))
    return min(tmp, key=lambda x: x[:2])[-1]


def fm_get_ksplit(token, topk, expert, inter_dim, model_dim, cu_num, aiter_ksplit=0):
    """FM get_ksplit (lines 1252-1276)."""
    if aiter_ksplit != 0:
        return aiter_ksplit
    if token * topk > expert:
        return 0
    tg_num = ((inter_dim + 127) // 128) * (token * topk)
    if tg_num >= cu_num:
        return 0
    split_max = (cu_num + tg_num - 1) // tg_num
    for i in reversed(range(2, split_max + 1)):
        if (model_dim % i == 0) and ((model_dim // i) % 256 == 0):
            return i
    return 0


def fm_get_padded_M(M):
    """FM nextPow2 + get_padded_M (lines 1331-1345), _PADDED_M_TIERS = [32768, 131072]."""
    tiers = [32768, 131072]
    if M < tiers[0]:
        return 1 if M <= 1 else 1 << (M - 1).bit_length()
    for tier in reversed(tiers):
        if M >= tier:
            return tier
    return tiers[0]


def fm017_get_padded_M(M):
    """FM017 get_padded_M: 1..16 -> 16, < 1024 -> nextPow2, else 1024."""
    if 1 <= M <= 16:
        return 16
    if M < 1024:
        return 1 if M <= 0 else 1 << (M - 1).bit_length()
    return 1024


# -- helpers ------------------------------------------------------------------------------------------------------

def key(**kw) -> DispatchKey:
    base = dict(gfx="gfx950", cu_num=256, model_dim=7168, inter_dim=256, expert=256, topk=8, runtime_topk=8,
                act_type=SILU, dtype=BF16, q_dtype_w=FP8, q_type=Q_1X128, use_g1u1=1, doweight_stage1=0,
                gate_mode="separated", is_ep=False)
    base.update(kw)
    return DispatchKey(**base)


def row(k: DispatchKey, token: int, q_a: str, *, line: int = 2, gfx: str | None = "same", **kw) -> TunedRow:
    """A tuned row whose key is ``k`` at ``token`` with activation dtype ``q_a`` (a CSV line of AITER's table)."""
    base = dict(file="t.csv", line=line, gfx=k.gfx if gfx == "same" else gfx, cu_num=k.cu_num, token=token,
                model_dim=k.model_dim, inter_dim=k.inter_dim, expert=k.expert, topk=k.topk, act_type=k.act_type,
                dtype=k.dtype, q_dtype_a=q_a, q_dtype_w=k.q_dtype_w, q_type=k.q_type, use_g1u1=k.use_g1u1,
                doweight_stage1=k.doweight_stage1, block_m=32)
    base.update(kw)
    return TunedRow(**base)


def cs(*rows: TunedRow, broken: bool = False, warnings: tuple[str, ...] = (), dispatch: str = "head"
       ) -> ac.ConfigSet:
    return ac.ConfigSet(label="synthetic", origin="explicit", dispatch=dispatch, version=None, files=("t.csv",),
                        rows=tuple(rows), warnings=warnings, broken=broken)


def legacy(M: int, k: DispatchKey, c: ac.ConfigSet | None = None, env: dict | None = None) -> DispatchStep:
    return dispatch_token(M, k, c, env=env or {}, model="legacy")


def head_step(M: int, k: DispatchKey, c: ac.ConfigSet | None = None, env: dict | None = None,
              a: Assumptions | None = None, model: str = "head") -> DispatchStep:
    return dispatch_token(M, k, c, env=env or {}, assumptions=a, model=model)


def layer(**kw) -> MoELayer:
    base = dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, activation="silu",
                weight=QuantSpec("fp8", "block128x128", scale_dtype="fp32"),
                act=QuantSpec("fp8", "group128", scale_dtype="fp32", dynamic=True))
    base.update(kw)
    return MoELayer.build(**base)


def moe(name: str, tp: int = 8, ep: int = 1) -> MoELayer:
    return next(lay for lay in models.expand_layers(models.load_model(name), tp, ep) if lay.kind == "moe")


@pytest.fixture(scope="module")
def head() -> ac.ConfigSet:
    return ac.load_config_set("head")


# -- the 0.1.7 heuristics (FM017 get_2stage_cfgs) -----------------------------------------------------------------

I8_942 = dict(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8, inter_dim=512, expert=64, topk=6)


@pytest.mark.parametrize(("M", "one_stage"), [(32, False), (33, True), (64, True)])
def test_legacy_per_token_int8_runs_one_stage_above_bucket_32(M, one_stage):
    """FM017: per_Token with q_dtype_w in [i8, fp8] runs the 1-stage ASM kernel when ``token > 32`` (token = the
    padded M: 32 stays 32, 33 -> 64); the API is the fused_moe_1stage_dict value (aiter.fmoe_g1u1 for g1u1), block_m
    BLOCK_SIZE_M = 32, ksplit 0. Otherwise get_block_size_M picks block_m and, q_dtype_w i8 being no CK dtype, the
    last branch runs asm_stage1 + ck_moe_stage2 with block_m rounded up into [32, 64, 128]."""
    k = key(**I8_942)
    s = legacy(M, k)
    assert s.bucket == fm017_get_padded_M(M) and s.q_dtype_a == I8 and s.activation_dtype == "int8"
    assert s.buckets == (s.bucket,) and s.tokens == (M, M)
    if one_stage:
        assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.config) == (
            1, ("fmoe_g1u1 (default)",), 32, 0, "heuristic", None)
        assert s.family == "asm" and s.row is None
        assert s.notes[-1].startswith("1-stage ASM") and "fused_moe_1stage_dict" in s.notes[-1]
    else:
        bm = fm_get_block_size_M(s.bucket, 6, 64, 512, 304)
        bm = ([b for b in (32, 64, 128) if bm < b] + [128])[0] if bm not in (32, 64, 128) else bm
        assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis) == (
            2, ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"), bm, 0, "heuristic")
        assert s.family == "asm+ck" and s.notes[-1] == "ASM stage 1 + CK stage 2" and s.config is None


def test_legacy_int8_g1u0_names_its_own_one_stage_api():
    """FM017 fused_moe_1stage_dict['gfx942']: (Silu, per_Token, bf16, i8, i8, isG1U1=False) -> aiter.fmoe_int8_g1u0."""
    s = legacy(64, key(**I8_942, use_g1u1=0))
    assert s.stages == 1 and s.kernels == ("fmoe_int8_g1u0 (default)",)


@pytest.mark.parametrize(("M", "one_stage"), [(128, True), (255, False), (256, False)])
def test_legacy_unquantized_runs_one_stage_below_bucket_256(M, one_stage):
    """FM017: QuantType.No (bf16 weights, g1u0 Silu on gfx942 -> aiter.fmoe) runs 1-stage when ``token < 256``;
    else CK 2-stage (q_dtype_w bf16 is in the CK dtype list) with get_block_size_M's block_m and empty kernel
    names (the codegen's default instance)."""
    k = key(gfx="gfx942", cu_num=304, q_type=Q_NO, q_dtype_w=BF16, use_g1u1=0, inter_dim=768, expert=16,
            topk=2)
    s = legacy(M, k)
    if one_stage:
        assert (s.stages, s.kernels, s.block_m) == (1, ("fmoe (default)",), 32)
    else:
        assert (s.stages, s.kernels, s.block_m, s.ksplit) == (
            2, ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)"),
            fm_get_block_size_M(s.bucket, 2, 16, 768, 304), 0)
        assert s.family == "ck" and s.activation_dtype == "bf16"


@pytest.mark.parametrize(("inter_dim", "one_stage"), [(256, True), (512, True), (384, False)])
def test_legacy_blockscale_one_stage_needs_inter_dim_multiple_of_256(inter_dim, one_stage):
    """FM017: per_1x128 runs 1-stage (gfx950: aiter.fmoe_fp8_blockscale_g1u1) iff inter_dim % 256 == 0, at any token
    count; otherwise block_m 64 and, fp8 weights not being a CK dtype, asm_stage1 + ck_moe_stage2."""
    s = legacy(1, key(inter_dim=inter_dim))
    assert s.bucket == 16 and s.q_dtype_a == FP8 and s.activation_dtype == "fp8"
    if one_stage:
        assert (s.stages, s.kernels, s.block_m) == (1, ("fmoe_fp8_blockscale_g1u1 (default)",), 32)
    else:
        assert (s.stages, s.kernels, s.block_m, s.family) == (
            2, ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"), 64, "asm+ck")


def test_legacy_doweight_stage1_never_runs_one_stage_and_goes_to_ck():
    """FM017: ``not doweight_stage1 and (...) in fused_moe_1stage_dict`` gates 1-stage; per_1x128 with
    doweight_stage1 is a CK 2-stage case (block_m 64)."""
    s = legacy(64, key(doweight_stage1=1))
    assert (s.stages, s.kernels, s.block_m, s.family) == (
        2, ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)"), 64, "ck")


def test_legacy_per_token_fp8_with_doweight_is_asm_stage1():
    """FM017: per_Token fp8 with doweight_stage1 skips the 1-stage dict; fp8 is no CK dtype and per_Token is not
    per_1x128, so asm_stage1 + ck_moe_stage2 runs (block_m from get_block_size_M)."""
    k = key(q_type=Q_TOKEN, doweight_stage1=1, inter_dim=512, expert=32, topk=4)
    s = legacy(512, k)
    assert s.stages == 2 and s.kernels == ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)")
    assert s.block_m == fm_get_block_size_M(512, 4, 32, 512, 256)


def test_legacy_cktile_needs_per_1x32_swiglu():
    """FM017: the CK-Tile branch needs bf16/fp16 out AND per_1x32 AND Swiglu: a Swiglu per_1x128 layer (no 1-stage
    entry for Swiglu, fp8 not a CK dtype) runs asm_stage1 + ck_moe_stage2; a Silu per_1x32 layer runs CK 2-stage
    (fp4x2 is a CK dtype)."""
    s = legacy(1, key(act_type=SWIGLU, inter_dim=384))
    assert (s.family, s.kernels, s.block_m) == (
        "asm+ck", ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"), 64)
    t = legacy(1, key(q_type=Q_1X32, q_dtype_w=FP4, inter_dim=384))
    assert t.family == "ck" and t.kernels == ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)")


@pytest.mark.parametrize("M", [1, 1000])
def test_legacy_swiglu_mxfp4_is_cktile_with_block_m_16(M):
    """FM017: bf16 out, per_1x32, Swiglu -> cktile_moe_stage1/2 with block_m ``16 if token < 2048 else 32`` (token is
    at most 1024 in 0.1.7) and the heuristic ksplit 0; a matching tuned row only contributes its ksplit."""
    k = key(q_type=Q_1X32, q_dtype_w=FP4, act_type=SWIGLU, inter_dim=384)
    s = legacy(M, k)
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.family) == (
        2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), 16, 0, "heuristic", "cktile")
    assert s.q_dtype_a == FP4 and s.activation_dtype == "mxfp4"  # FM017: per_1x32 -> fp4x2 activations
    t = legacy(M, k, cs(row(k, s.bucket, FP4, ksplit=3, kernel1="ck_x", kernel2="ck_y", line=7)))
    assert (t.kernels, t.block_m, t.ksplit, t.basis, t.config, t.row) == (s.kernels, 16, 3, "heuristic", None, None)
    assert t.notes[-1] == "tuned row t.csv:7 matched but this path ignores its kernel names"


def test_legacy_tuned_one_stage_row():
    """FM017: a tuned row with run_1stage runs fused_moe_1stage with the row's kernelName1, block_m and ksplit."""
    k = key(**I8_942)
    r = row(k, 16, I8, kernel1="_ZN5aiter9fmoe_int8E", kernel2="", run_1stage=1, block_m=64, ksplit=2, line=9)
    s = legacy(3, k, cs(r))
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.config, s.row) == (
        1, ("_ZN5aiter9fmoe_int8E",), 64, 2, "tuned", "t.csv:9", r)
    assert s.family == "asm"


@pytest.mark.parametrize(("kernel1", "bm", "expected_bm", "family"), [
    ("moe_ck2stages_gemm1_256x32", 16, 16, "ck"),
    ("fmoe_stage1_bf16_pertokenInt8_g1u1", 16, 32, "asm+ck"),
    ("fmoe_stage1_bf16_pertokenInt8_g1u1", 96, 128, "asm+ck"),
    ("fmoe_stage1_bf16_pertokenInt8_g1u1", 48, 64, "asm+ck"),
    ("fmoe_stage1_bf16_pertokenInt8_g1u1", 256, 128, "asm+ck"),
    ("fmoe_stage1_bf16_pertokenInt8_g1u1", 64, 64, "asm+ck"),
])
def test_legacy_tuned_two_stage_rows(kernel1, bm, expected_bm, family):
    """FM017: a row whose kernelName1 holds "ck2stages" runs ck_moe_stage1/2 with the row's block_m as is; any other
    row takes the last branch (asm_stage1 + ck_moe_stage2), where a block_m outside [32, 64, 128] becomes the first
    larger one, else 128."""
    k = key(**I8_942)
    r = row(k, 64, I8, kernel1=kernel1, kernel2="moe_ck2stages_gemm2_x", block_m=bm, ksplit=4, line=5)
    s = legacy(40, k, cs(r))
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.config) == (
        2, (kernel1, "moe_ck2stages_gemm2_x"), expected_bm, 4, "tuned", "t.csv:5")
    assert s.family == family and s.row == r


def test_legacy_lookup_is_exact_on_activation_and_ignores_gfx():
    """FM017 keys (cu_num, token, …, str(activation), …) with no gfx and no act wildcard: a Gelu row does not
    answer a Silu lookup, and a row's gfx column is not read."""
    k = key(**I8_942)
    gelu = row(k, 64, I8, act_type=GELU, kernel1="moe_ck2stages_gemm1_g", kernel2="k2")
    assert legacy(64, k, cs(gelu)).basis == "heuristic"
    other_gfx = row(k, 64, I8, gfx="gfx950", kernel1="moe_ck2stages_gemm1_g", kernel2="k2")
    assert legacy(64, k, cs(other_gfx)).config == "t.csv:2"


def test_legacy_broken_table_and_online_tune_notes():
    """A table that did not load is no lookup at all (AITER raises reading it; the model says it used heuristics);
    AITER_ONLINE_TUNE=1 with no row tunes at first call (FM017 get_2stage_cfgs MainFunc), which the model cannot
    know offline and says so."""
    k = key(**I8_942)
    r = row(k, 64, I8, kernel1="moe_ck2stages_gemm1_g", kernel2="k2")
    broken = legacy(64, k, cs(r, broken=True))
    assert broken.basis == "heuristic" and broken.stages == 1
    assert "the tuned set has malformed lines: modelled with heuristics only" in broken.notes
    tune = legacy(64, k, cs(), env={"AITER_ONLINE_TUNE": "1"})
    assert ("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call; modelled as the heuristic"
            in tune.notes)
    assert not any("ONLINE_TUNE" in n for n in legacy(64, k, None, env={"AITER_ONLINE_TUNE": "1"}).notes)
    assert not any("ONLINE_TUNE" in n for n in legacy(64, k, cs(r), env={"AITER_ONLINE_TUNE": "1"}).notes)
    assert not any("ONLINE_TUNE" in n for n in legacy(64, k, cs(), env={"AITER_ONLINE_TUNE": "0"}).notes)
    assert legacy(64, k, cs()).notes == (legacy(64, k).notes)


def test_legacy_activation_dtype_is_the_weight_dtype_or_fp4():
    """FM017 fused_moe_: ``q_dtype_a = w1.dtype if w1.dtype != torch.uint32 else dtypes.fp8``, then fp4x2 for
    per_1x32; the first note says which."""
    s = legacy(1, key(**I8_942))
    name = LEGACY_RULES.name
    assert s.notes[0] == f"activations take the weight dtype ({name})"
    assert legacy(1, key(q_type=Q_1X32, q_dtype_w=FP4)).notes[0] == (
        f"per_1x32 quantizes activations to fp4x2 ({name})")
    assert activation_dtype(1, key(q_type=Q_TOKEN, q_dtype_w=U32), model="legacy")[0] == FP8


# -- the report formats: explain's table, the JSON contract, AITER's INFO line ----------------------------------

def _m25_plan(head):
    """MiniMax-M2.5 FP8 TP8/EP8 on MI350X (test_aiter_dispatch.py::test_aiter_3471_blockscale_32x384_at_8k): per_1x128
    decode runs CK 2-stage with get_ksplit's split-K (FM lines 2410-2419), M >= 64 the 1-stage ASM blockscale kernel
    (FM line 2398: token > 32 and inter_dim % 128 == 0), and capability_db/dispatch_issues.toml flags ROCm/aiter#3471
    at 8192 with token_cap 4096 and ROCm/aiter#3999 (EP looks up topk - 1, FM line 2217)."""
    m25 = layer(hidden=3072, intermediate=1536, experts=256, top_k=8, tp=8, ep=8)
    return plan_dispatch(m25, target_capabilities("MI350X", "0.1.20.post1"), configs=head, env={},
                         tokens=(1, 2, 64, 8192))


def test_table_lines_format_steps_issues_assumptions_and_warnings(head):
    """explain's table: one line per grouped step (a range prints lo–hi and every bucket; split-K only when > 1),
    one per issue (a token cap and a workaround env are appended), then the assumptions and warnings."""
    plan = _m25_plan(head)
    s1, s2, s3 = plan.steps
    assert (s1.tokens, s1.ksplit, s3.tokens, s3.buckets, s3.stages) == ((1, 1), 4, (64, 8192), (64, 8192), 1)
    kn = " + ".join(s1.kernels)
    expect = [
        f"tokens 1 (bucket 1): ck 2-stage {kn}, block_m {s1.block_m}, split-K 4, activations fp8 — heuristic",
        f"tokens 2 (bucket 2): ck 2-stage {kn}, block_m {s2.block_m}, split-K 2, activations fp8 — heuristic",
        "tokens 64–8192 (bucket 64/8192): asm 1-stage fmoe_fp8_blockscale_g1u1 (default), block_m 32, activations "
        "fp8 — heuristic",
    ]
    for h in plan.issues:
        toks = f"{h.tokens[0]}" if h.tokens[0] == h.tokens[1] else f"{h.tokens[0]}–{h.tokens[1]}"
        fix = ", ".join(f"{k}={v}" for k, v in h.workaround_env)
        expect.append(f"{h.severity} {h.issue} at tokens {toks} (bucket {h.bucket}, {h.kernel}): {h.effect}. "
                      f"Workaround: {h.workaround}{' [' + fix + ']' if fix else ''}"
                      f"{f'; cap --max-num-batched-tokens at {h.token_cap}' if h.token_cap else ''} ({h.source})")
    expect += [f"assumes {a}" for a in plan.assumptions] + [f"warning {w}" for w in plan.warnings]
    assert plan.table_lines() == expect
    cap = next(h for h in plan.issues if h.issue == "ROCm/aiter#3471")
    assert cap.tokens == (8192, 8192) and cap.token_cap == 4096 and not cap.workaround_env
    line = next(x for x in plan.table_lines() if "ROCm/aiter#3471" in x)
    assert line.startswith("error ROCm/aiter#3471 at tokens 8192 (bucket 8192, fmoe_fp8_blockscale_g1u1 (default)): ")
    assert line.endswith("; cap --max-num-batched-tokens at 4096 (https://github.com/ROCm/aiter/issues/3471)")
    ranged = next(x for x in plan.table_lines() if "ROCm/aiter#3999 at tokens 1–2 " in x)
    assert "(bucket 1, " in ranged and "[" not in ranged.split("Workaround: ")[1]
    # a tuned step says which row decided; a workaround env is printed in brackets
    import dataclasses

    tuned = dataclasses.replace(s2, basis="tuned", config="t.csv:4", buckets=())
    env_hit = dataclasses.replace(plan.issues[0], workaround_env=(("AITER_BYPASS_TUNE_CONFIG", "1"), ("X", "2")),
                                  token_cap=None, tokens=(3, 3))
    lines = dataclasses.replace(plan, steps=(tuned,), issues=(env_hit,), assumptions=("a",),
                                warnings=("w1", "w2")).table_lines()
    assert lines[0] == (f"tokens 2 (bucket 2): ck 2-stage {kn}, block_m {s2.block_m}, split-K 2, activations fp8 — "
                        "tuned t.csv:4")
    assert lines[1].startswith(f"{env_hit.severity} {env_hit.issue} at tokens 3 (bucket {env_hit.bucket}, ")
    assert lines[1].endswith(f"Workaround: {env_hit.workaround} [AITER_BYPASS_TUNE_CONFIG=1, X=2] ({env_hit.source})")
    assert lines[2:] == ["assumes a", "warning w1", "warning w2"]


def test_table_line_of_a_raising_step(head):
    """FM lines 854-880: a16w4 SiTUv2 under EP raises NotImplementedError before any lookup; the table says AITER
    raises (no kernel line), for the whole grouped range and each bucket."""
    plan = plan_dispatch(moe("Kimi-K3-MXFP4", ep=8), target_capabilities(*MI355X), configs=head, env={},
                         tokens=(1, 64))
    (step,) = plan.steps
    assert plan.table_lines()[0] == f"tokens 1–64 (bucket 1/64): AITER raises — {step.raises}"
    import dataclasses

    one = dataclasses.replace(plan, steps=(dataclasses.replace(step, tokens=(5, 5), buckets=()),), issues=(),
                              assumptions=(), warnings=("w",))
    assert one.table_lines() == [f"tokens 5 (bucket {step.bucket}): AITER raises — {step.raises}", "warning w"]
    ok = dataclasses.replace(step, tokens=(8, 8), buckets=(8,), raises=None, family="ck", stages=2,
                             kernels=("a", "b"), block_m=16, ksplit=1, activation_dtype="bf16", basis="heuristic")
    both = dataclasses.replace(one, steps=(one.steps[0], ok), warnings=())
    assert both.table_lines() == [f"tokens 5 (bucket {step.bucket}): AITER raises — {step.raises}",
                                  "tokens 8 (bucket 8): ck 2-stage a + b, block_m 16, activations bf16 — heuristic"]


def test_json_contract_of_plan_key_step_and_hit(head):
    """The explain JSON: the plan's fields, the key (AITER's _INDEX_COLS names, FM lines 2135-2150, plus the layout
    facts), each step's contract object and each hit, named as the attributes they carry."""
    import dataclasses

    plan = _m25_plan(head)
    d = plan.to_dict()
    assert d == {"layer": plan.layer_index, "aiter_dispatch": [s.to_dict() for s in plan.steps],
                 "key": plan.key.to_dict(), "tokens": list(plan.tokens), "aiter_env": dict(plan.env),
                 "assumptions": list(plan.assumptions), "configs": plan.configs,
                 "dispatch_model": plan.dispatch_model, "aiter_version": plan.aiter_version,
                 "warnings": list(plan.warnings), "issues": [h.to_dict() for h in plan.issues]}
    assert d["tokens"] == [1, 2, 64, 8192] and d["aiter_version"] == "0.1.20.post1" and d["assumptions"]
    assert d["dispatch_model"] == "HEAD e4048607 (v0.1.20+)" and d["issues"] and d["aiter_dispatch"]
    k = plan.key
    assert k.to_dict() == {f.name: getattr(k, f.name) for f in dataclasses.fields(k)}
    assert (k.topk, k.runtime_topk, k.is_ep, k.inter_dim, k.model_dim) == (7, 8, True, 1536, 3072)
    for h in plan.issues:
        assert h.to_dict() == {**{f.name: getattr(h, f.name) for f in dataclasses.fields(h)},
                               "tokens": list(h.tokens), "workaround_env": dict(h.workaround_env)}
    s = plan.steps[-1]
    assert s.to_dict()["tokens"] == [64, 8192]
    assert plan.data_used() == {"rows": plan.configs, "origin": plan.config_origin, "release": plan.config_release,
                                "rules": plan.dispatch_model, "rules_source": plan.rules_source}
    assert plan.data_used()["rules_source"] == FM and plan.config_origin == "explicit" or plan.config_origin


def test_info_line_is_aiters_log_line():
    """FM get_2stage_cfgs logs ``[fused_moe] using {1stage|2stage} {default|(kernelName1=…, kernelName2=…)} for
    {keys}`` with keys = (gfx, cu_num, token, model_dim, inter_dim, expert, topk, activation, str(dtype),
    str(q_dtype_a), str(q_dtype_w), str(q_type), use_g1u1, doweight_stage1) (FM lines 2205-2220, 2519); the activation
    is the pybind enum (``<ActivationType.Gelu: 1>``), and pandas reads an empty kernelName2 as nan."""
    k = key(act_type=GELU, inter_dim=384)
    two = row(k, 64, FP8, kernel1="moe_ck2stages_gemm1_a", kernel2="moe_ck2stages_gemm2_b", block_m=64)
    s = head_step(64, k, cs(two))
    body = ("('gfx950', 256, 64, 7168, 384, 256, 8, <ActivationType.Gelu: 1>, 'torch.bfloat16', "
            "'torch.float8_e4m3fn', 'torch.float8_e4m3fn', 'QuantType.per_1x128', 1, 0)")
    assert s.info_line(k) == ("[fused_moe] using 2stage (kernelName1='moe_ck2stages_gemm1_a', "
                              f"kernelName2='moe_ck2stages_gemm2_b') for {body}")
    one = row(k, 64, FP8, kernel1="_ZN5aiter_fmoe_x", kernel2="", run_1stage=1)
    s1 = head_step(64, k, cs(one))
    assert s1.stages == 1 and s1.info_line(k) == (
        f"[fused_moe] using 1stage (kernelName1='_ZN5aiter_fmoe_x', kernelName2=nan) for {body}")
    h = head_step(16, k)  # no row; per_1x128 runs 1-stage only for token > 32 (FM line 2398)
    assert h.basis == "heuristic" and h.info_line(k) == ("[fused_moe] using 2stage default for "
                                                         + body.replace(", 64, 7168,", ", 16, 7168,"))
    parsed = parse_info_line(s.info_line(k))
    assert parsed == {"stages": 2, "xbf16": False, "default": False,
                      "kernels": ("moe_ck2stages_gemm1_a", "moe_ck2stages_gemm2_b"),
                      "key": ("gfx950", "256", "64", "7168", "384", "256", "8", "<ActivationType.Gelu: 1>",
                              "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e4m3fn", "QuantType.per_1x128",
                              "1", "0")}


def test_parse_info_line_reads_default_and_xbf16_lines():
    """FM line 2519 prints `` xbf16`` after ``1stage`` for the xbf16 ASM variant and ``default`` with no tuned row
    (https://github.com/ROCm/aiter/issues/5769 quotes such a line)."""
    line = ("[aiter] [fused_moe] using 1stage xbf16 default for ('gfx950', 256, 512, 256, 2048, 8, 2, "
            "ActivationType.Silu, torch.bfloat16, torch.float8_e4m3fn)")
    assert parse_info_line(line) == {
        "stages": 1, "xbf16": True, "default": True, "kernels": (),
        "key": ("gfx950", "256", "512", "256", "2048", "8", "2", "ActivationType.Silu", "torch.bfloat16",
                "torch.float8_e4m3fn")}
    assert parse_info_line("no fused_moe line here") is None


# -- small AITER helpers the model transcribes --------------------------------------------------------------------

@pytest.mark.parametrize(("k", "op"), [
    (dict(q_type=Q_NO, act_type=SILU, use_g1u1=0), "fmoe"),
    (dict(q_type=Q_NO, act_type=GELU, use_g1u1=0), "fmoe_int8_g1u0"),
    (dict(q_type=Q_NO, act_type=SILU, use_g1u1=1), "fmoe_g1u1"),
    (dict(q_type=Q_TOKEN, doweight_stage1=1, use_g1u1=1), "fmoe_g1u1_tkw1"),
    (dict(q_type=Q_TOKEN, doweight_stage1=1, use_g1u1=0), "fmoe_int8_g1u0"),
    (dict(q_type=Q_TOKEN, doweight_stage1=0, use_g1u1=1), "fmoe_g1u1"),
    (dict(q_type=Q_TOKEN, doweight_stage1=0, use_g1u1=0), "fmoe_int8_g1u0"),
    (dict(q_type=Q_1X128, doweight_stage1=1, use_g1u1=1), "fmoe_fp8_blockscale_g1u1"),
    (dict(q_type=Q_1X32, use_g1u1=1), "fmoe_g1u1"),
])
def test_one_stage_op_by_quant_type(k, op):
    """FM fused_moe_1stage (lines 1094-1188): QuantType.No + Silu + g1u0 -> aiter.fmoe; per_Token + doweight_stage1 +
    g1u1 -> aiter.fmoe_g1u1_tkw1; else per_1x128 -> aiter.fmoe_fp8_blockscale_g1u1, g1u1 -> aiter.fmoe_g1u1, g1u0 ->
    aiter.fmoe_int8_g1u0."""
    assert _one_stage_op(key(**k)) == op


@pytest.mark.parametrize(("token", "bm"), [(1, 16), (2047, 16), (2048, 32), (16383, 32), (16384, 64), (131072, 64)])
def test_tier_block_m(token, bm):
    """FM get_block_m / _cktile_block_m / the a16wi4 _tile_m: ``16 if token < 2048 else 32 if token < 16384 else 64``
    (lines 2465-2469, 2664, 2812)."""
    assert _tier_block_m(token) == bm


def test_tier_block_m_through_the_cktile_swiglu_path():
    """FM lines 2798-2840: SwiGLU MXFP4 with bf16 activations and preshuffled weights runs CK-Tile with the tier
    block_m and split-K at least 2 — per bucket."""
    k = key(q_type=Q_1X32, q_dtype_w=FP4, act_type=SWIGLU, inter_dim=384, expert=129, topk=5)
    got = [(s.block_m, s.family) for s in (head_step(m, k, env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "100000"})
                                           for m in (1, 2048, 16384))]
    assert got == [(16, "cktile"), (32, "cktile"), (64, "cktile")]


@pytest.mark.parametrize(("version", "M", "bucket"), [
    ("0.1.10", 1, 1), ("0.1.10", 2, 2), ("0.1.10", 3, 4), ("0.1.10", 16, 16), ("0.1.10", 17, 32),
    ("0.1.10", 1023, 1024), ("0.1.10", 1500, 1024), ("0.1.10", 5000, 2048), ("0.1.10", 20000, 16384),
    ("0.1.10", 0, 1), ("0.1.8", 0, 1), ("0.1.8", 1, 16), ("0.1.8", 2047, 1024), ("0.1.8", 2048, 2048),
    ("0.1.8", 16383, 2048), ("0.1.8", 16384, 16384),
    ("0.1.12", 1, 1), ("0.1.12", 20000, 32768), ("0.1.12", 40000, 32768),
    ("0.1.7", 1, 16), ("0.1.7", 5000, 1024),
])
def test_padded_m_per_release(version, M, bucket):
    """get_padded_M at each tag (ROCm/aiter v0.1.8 line 512, v0.1.10.post2 line 565, v0.1.12 line 607): v0.1.8
    (1 <= M <= 16 -> 16, nextPow2 below 1024, < 2048 -> 1024, < 16384 -> 2048, else 16384), v0.1.9-v0.1.11
    (1 <= M <= 16 -> nextPow2 too), v0.1.12 (nextPow2 below 32768, else 32768), v0.1.7 (FM017: 16 / nextPow2 / 1024);
    nextPow2 of 0 is 1."""
    assert get_padded_M(M, version) == bucket


@pytest.mark.parametrize("M", [1, 2, 3, 31, 32, 33, 32767, 32768, 32769, 131071, 131072, 500000])
def test_head_padded_m_is_aiters(M):
    """FM get_padded_M with _PADDED_M_TIERS = [32768, 131072]."""
    assert get_padded_M(M) == fm_get_padded_M(M)


def test_at_least_compares_public_versions():
    """The SiTUv2 a16w4 FlyDSL kernel runs on gfx942 from AITER 0.1.20 (ROCm/aiter#4502): the gate compares the
    public version (a ROCm local tag is ignored); no version or an unparsable one is not 0.1.20."""
    assert _at_least("0.1.20", "0.1.20") and _at_least("0.1.20.post1+rocm7.1", "0.1.20")
    assert not _at_least("0.1.19.post2", "0.1.20") and not _at_least(None, "0.1.20")
    assert not _at_least("not-a-version", "0.1.20")


@pytest.mark.parametrize(("version", "warned"), [("0.1.20", False), ("0.1.19.post2", True)])
def test_situv2_on_gfx942_is_no_mx_failure_from_0_1_20(version, warned):
    """Kimi-K3 (SiTUv2 MXFP4, bf16 activations) on MI300X: from 0.1.20 the a16w4 FlyDSL kernel runs on gfx942
    (ROCm/aiter#4502, FM line 858 allows gfx942), so the 'MX kernels need gfx950' warning is not given."""
    plan = plan_dispatch(moe("Kimi-K3-MXFP4"), target_capabilities("MI300X", version), env={}, tokens=(1,))
    assert any(w.startswith("AITER's MX (per_1x32)") for w in plan.warnings) is warned


def test_flydsl_heuristic_names():
    """FM lines 2723-2770 + aiter/ops/flydsl/moe_kernels.py flydsl_kernel_name / pick_flydsl_stage2_tile_k: a-dtype
    fp4 or fp8 (fp8 stage-1 names end ``_gui``), w-dtype fp8 or fp4, tile_m and suffixes per token tier, stage-2
    tile_k 256 when inter_dim % 256 == 0 else 128."""
    assert _flydsl_heuristic_names(1, FP8, FP4, 384) == (
        32, "flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w2_gui", "flydsl_moe2_afp8_wfp4_bf16_t32x128x128_atomic_bnt2")
    assert _flydsl_heuristic_names(2048, FP4, FP8, 512) == (
        64, "flydsl_moe1_afp4_wfp8_bf16_t64x128x256_w3_bnt0", "flydsl_moe2_afp4_wfp8_bf16_t64x128x256_atomic")
    assert _flydsl_heuristic_names(4096, FP4, FP4, 512) == (
        128, "flydsl_moe1_afp4_wfp4_bf16_t128x128x256_w2_bnt0", "flydsl_moe2_afp4_wfp4_bf16_t128x128x256_atomic")
    assert _flydsl_heuristic_names(16384, FP8_FNUZ, FP8_FNUZ, 256) == (
        64, "flydsl_moe1_afp8_wfp8_bf16_t64x128x256_w4_bnt0_gui", "flydsl_moe2_afp8_wfp8_bf16_t64x128x256_atomic")


def test_cktile_stage2_name_note():
    """FM line 2584: cktile_moe_stage2 is built without kernelName, so a row's cktile_* stage-2 name is not launched
    (CK-Tile picks its own instance); other names pass through."""
    assert _stage2_name("cktile_a8w4_bm32") == (
        "cktile_moe_stage2 (default)", ["the row's stage-2 name cktile_a8w4_bm32 is not passed to cktile_moe_stage2 "
                                        "(CK-Tile picks its instance)"])
    assert _stage2_name("moe_ck2stages_gemm2_x") == ("moe_ck2stages_gemm2_x", [])


# -- the FHMoE table (aiter/fhmoe.py at e4048607) -----------------------------------------------------------------

def _fhmoe_csv(tmp_path, rows, name="fhmoe.csv"):
    import csv

    fields = list(rows[0])
    path = tmp_path / name
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return str(path)


def test_fhmoe_rows_are_csv_rows(tmp_path):
    """capability_db/aiter_fhmoe.toml rows as AITER's tuned_fhmoe.csv spells them: the TOML's ``line`` (where the
    row sits) is not a CSV column; a missing file is no rows."""
    rows = _fhmoe_rows()
    assert rows and all("line" not in r for r in rows) and "kernelName1" in rows[0]
    assert _fhmoe_rows(str(tmp_path / "absent.csv")) == []
    assert _fhmoe_rows(_fhmoe_csv(tmp_path, rows)) == rows


def test_fhmoe_supports_checks_every_power_of_two_bucket(tmp_path):
    """aiter/fhmoe.py _supports_dsv4_i384_fhmoe_config: every get_padded_M(1 << e) up to max_tokens must have a row;
    a table missing bucket 4 does not support 8 tokens (but supports 2). fhmoe_config_scope passes the table and the
    environment through (AITER_BYPASS_TUNE_CONFIG rejects the table, supports_dsv4_i384_fhmoe line 394)."""
    rows = [r for r in _fhmoe_rows() if r["token"] != "4"]
    path = _fhmoe_csv(tmp_path, rows)
    assert fhmoe_supports(2, env={}, path=path) and not fhmoe_supports(8, env={}, path=path)
    args = dict(model_dim=7168, inter_dim=384, experts=385, topk=7, hidden_pad=0, intermediate_pad=0,
                gate_mode="interleave", doweight_stage1=False)
    assert fhmoe_config_scope(2, **args, env={}, path=path)
    assert not fhmoe_config_scope(8, **args, env={}, path=path)
    assert not fhmoe_config_scope(1, **args, env={"AITER_BYPASS_TUNE_CONFIG": "1"})


def test_fhmoe_lookup_keys_gate_mode_and_missing_columns(tmp_path):
    """get_2stage_cfgs(config_file=…) adds str(gate_mode) to the key (FM lines 2142-2143, 2228-2231): a SEPARATED
    lookup does not match INTERLEAVE rows, and a SEPARATED row answers it."""
    rows = _fhmoe_rows()
    assert fhmoe_lookup(1, gate_mode="separated", env={}) is None
    sep = [dict(r, gate_mode="GateMode.SEPARATED") for r in rows if r["token"] == "1"]
    path = _fhmoe_csv(tmp_path, sep)
    assert fhmoe_lookup(1, gate_mode="separated", env={}, path=path) == (sep[0]["kernelName1"],
                                                                           sep[0]["kernelName2"])
    assert fhmoe_lookup(1, gate_mode="interleave", env={}, path=path) is None


# -- native_inter_dims: which inter_dims have rows for the layer's key ----------------------------------------------

def test_native_inter_dims_follows_each_releases_key(monkeypatch):
    """Rows count for a layer's key as each release matches them (FM get_2stage_cfgs): HEAD keys on gfx
    (v0.1.16+), drops ``_tag == flydsl_fallback`` rows (v0.1.12+) and matches any activation (the act wildcard,
    v0.1.14+); v0.1.10 keys on neither gfx nor a wildcard and keeps fallback rows. CU_NUM overrides the CU count the
    key holds (aiter/jit/utils/chip_info.py get_cu_num_custom_op)."""
    for var in ("AITER_CONFIG_FMOE", "CU_NUM"):
        monkeypatch.delenv(var, raising=False)
    lay = layer(hidden=4096, intermediate=1024, experts=64, top_k=4, tp=1)
    caps = target_capabilities("MI355X", "0.1.20")
    k = dispatch_key(lay, caps)
    rows = [row(k, 16, FP8, inter_dim=900, cu_num=999),                          # another CU count
            row(k, 16, FP8, inter_dim=200, act_type=GELU),                    # another activation
            row(k, 16, FP8, inter_dim=100),
            row(k, 16, FP8, inter_dim=300, tag="flydsl_fallback"),
            row(k, 16, FP8, inter_dim=400, gfx="gfx942"),
            row(k, 16, FP8, inter_dim=500, gfx=None),
            row(k, 16, FP8, inter_dim=600, expert=63)]
    c = cs(*rows)
    assert ad.native_inter_dims(lay, caps, configs=c, env={}) == {100, 200, 500}
    old = target_capabilities("MI355X", "0.1.10")
    assert ad.native_inter_dims(lay, old, configs=c, env={}) == {100, 300, 400, 500}
    assert ad.native_inter_dims(lay, caps, configs=c, env={"CU_NUM": "999"}) == {900}
    monkeypatch.setenv("CU_NUM", "999")
    assert ad.native_inter_dims(lay, caps, configs=c) == {900}
    import dataclasses

    installed = dataclasses.replace(c, origin="installed", version="0.1.10")   # the installed AITER's own release
    assert ad.native_inter_dims(lay, caps, configs=installed, env={}) == {100, 300, 400, 500}
    ep = layer(hidden=4096, intermediate=1024, experts=64, top_k=4, tp=8, ep=8)   # v0.1.10 has no topk -= is_ep
    k10 = dispatch_key(ep, old, model="0.1.10")
    assert k10.topk == 4 and dispatch_key(ep, caps).topk == 3
    assert ad.native_inter_dims(ep, old, configs=cs(row(k10, 16, FP8, inter_dim=128)), env={}) == {128}


def test_native_inter_dims_reads_aiter_config_fmoe(tmp_path):
    """AITER_CONFIG_FMOE replaces the whole tuned set (aiter/jit/core.py), for the inter_dims as for the lookup."""
    import csv

    lay = layer(hidden=4096, intermediate=1024, experts=64, top_k=4, tp=1)
    caps = target_capabilities(*MI355X)
    k = dispatch_key(lay, caps)
    path = tmp_path / "tuned_fmoe.csv"
    cols = ["gfx", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
            "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1", "block_m", "ksplit", "kernelName1", "kernelName2"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerow([k.gfx, k.cu_num, 16, k.model_dim, 4242, k.expert, k.topk, k.act_type, k.dtype, FP8,
                    k.q_dtype_w, k.q_type, 1, 0, 32, 0, "moe_ck2stages_gemm1_x", "moe_ck2stages_gemm2_y"])
    assert ad.native_inter_dims(lay, caps, env={"AITER_CONFIG_FMOE": str(path)}) == {4242}


def test_native_inter_dims_reads_the_targets_tuned_set():
    """Without a set given, the target's release rows are read (MiniMax-M3 TP8, fused shared expert: AITER's
    minimax_m3_fp4_tuned_fmoe.csv has inter_dim 384 and 768 rows, test_aiter_dispatch.py)."""
    m3 = moe("MiniMax-M3-MXFP4")
    a = Assumptions(fused_shared_expert=True)
    assert ad.native_inter_dims(m3, target_capabilities(*MI355X), env={}, assumptions=a) == {384, 768}


def test_simulate_passes_the_padding_through(head):
    """simulate() is plan_dispatch().steps: a padded allocation is what the kernel sees (the key's inter_dim)."""
    from moedispatch.core.backend import Padding

    ds = layer(hidden=7168, intermediate=3072, experts=256, top_k=8, **{"weight": "mxfp4", "act": "mxfp4"})
    pad = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, zero_fill=True)
    caps = target_capabilities(*MI355X)
    steps = ad.simulate(ds, caps, configs=head, env={}, padding=pad, tokens=(1,))
    assert steps == plan_dispatch(ds, caps, configs=head, env={}, padding=pad, tokens=(1,)).steps
    assert steps != ad.simulate(ds, caps, configs=head, env={}, tokens=(1,))


# -- the lookup key ---------------------------------------------------------------------------------------------

def test_block_size_M_and_ksplit_are_aiters():
    """FM get_block_size_M and get_ksplit over a grid of shapes (asymmetric, so a swapped argument shows)."""
    for token in (1, 2, 4, 16, 64, 512, 4096):
        for topk, expert, inter_dim, cu in ((8, 256, 256, 256), (6, 48, 384, 304), (2, 8, 96, 80),
                                            (4, 129, 1536, 256), (9, 33, 640, 304), (8, 256, 257, 256),
                                            (1, 4, 4097, 304), (2, 16, 1025, 80)):
            assert _block_size_M(token, topk, expert, inter_dim, cu) == \
                fm_get_block_size_M(token, topk, expert, inter_dim, cu), (token, topk, expert, inter_dim, cu)
            for model_dim in (7168, 3072, 6144, 2048, 4096):
                assert _ksplit(token, topk, expert, inter_dim, model_dim, cu, {}) == \
                    fm_get_ksplit(token, topk, expert, inter_dim, model_dim, cu)
    assert _ksplit(512, 8, 256, 256, 7168, 256, {"AITER_KSPLIT": "3"}) == 3
    assert _ksplit(1, 8, 256, 256, 7168, 256, {"AITER_KSPLIT": "0"}) == fm_get_ksplit(1, 8, 256, 256, 7168, 256)


def test_heuristic_block_m_and_ksplit_reach_the_step():
    """FM lines 2408-2419: without a row, per_1x128 takes block_m 64 above token 32 else 16, other quant types
    get_block_size_M(token, topk, expert, inter_dim); per_1x128/per_1x32 take get_ksplit(token, topk, expert,
    inter_dim, model_dim) (a per-token split, FM line 1252)."""
    k = key(expert=32, topk=7, inter_dim=1536, model_dim=3072, cu_num=256)
    for M in (1, 2, 4, 16, 32):
        s = head_step(M, k)
        assert s.block_m == 16 and s.ksplit == fm_get_ksplit(s.bucket, 7, 32, 1536, 3072, 256) and s.stages == 2
    assert head_step(1, k).ksplit == 4 and head_step(2, k).ksplit == 2
    assert head_step(64, key(inter_dim=192, expert=32, topk=7)).block_m == 64  # 192 % 128 != 0: 2-stage, block 64
    i8 = key(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8, inter_dim=384, expert=40, topk=6,
             model_dim=5120)
    s = head_step(16, i8)
    assert s.stages == 2 and s.ksplit == 0 and s.block_m == fm_get_block_size_M(16, 6, 40, 384, 304)


@pytest.mark.parametrize(("name", "family"), [
    ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2", "flydsl"), ("flydsl_mxmoe_g1_a4w4_x", "flydsl"),
    ("opus_moe2_a8w4_x", "opus"), ("cktile_moe_stage1 (default)", "cktile"), ("moe_cktile2stages_gemm1_x", "cktile"),
    ("moe_ck2stages_gemm1_256x32", "ck"), ("_ZN5aiter46fmoe_bf16_blockscaleFp8_g1u1_vs_ps_silu_64x256E", "asm"),
    ("fmoe_g1u1 (default)", "asm"), ("  flydsl_moe2_x ", "flydsl"), ("", "unknown"), (None, "unknown"),
    ("triton_moe", "unknown"),
])
def test_kernel_family_from_aiters_names(name, family):
    """AITER's own name tests: get_2stage_cfgs ``startswith("flydsl_")`` / ``"opus_"`` / ``"cktile_"``,
    ``"ck2stages" in kernelName1`` (FM lines 2596-2603, 2888), hsa code objects ``_ZN5aiter…`` / the fmoe APIs."""
    assert kernel_family(name) == family


def test_family_of_a_step():
    assert _family(()) == "unknown"
    assert _family(("fmoe_g1u1 (default)",)) == "asm"
    assert _family(("moe_ck2stages_gemm1_x", "moe_ck2stages_gemm2_y")) == "ck"
    assert _family(("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)")) == "asm+ck"
    assert _family(("flydsl_moe1_x", "cktile_moe_stage2 (default)")) == "flydsl+cktile"


@pytest.mark.parametrize(("dtype", "q_type", "label"), [
    (BF16, Q_NO, "bf16"), (FP16, Q_NO, "fp16"), (FP4, Q_1X32, "mxfp4"), (FP8, Q_1X32, "mxfp8"),
    (FP8, Q_TOKEN, "fp8"), (FP8_FNUZ, Q_1X128, "fp8"), (I8, Q_TOKEN, "int8"),
    (U32, Q_TOKEN, "uint32"),
])
def test_activation_labels(dtype, q_type, label):
    """The torch dtype strings AITER's CSVs hold (str(dtypes.*)) as the contract's activation labels."""
    assert _label(dtype, q_type) == label


@pytest.mark.parametrize(("weight", "gfx", "expected"), [
    (QuantSpec("bf16"), "gfx950", (Q_NO, BF16)), (QuantSpec("fp16"), "gfx950", (Q_NO, FP16)),
    ("mxfp4", "gfx950", (Q_1X32, FP4)), ("mxfp8", "gfx950", (Q_1X32, FP8)),
    (QuantSpec("fp8", "block128x128", scale_dtype="fp32"), "gfx942", (Q_1X128, FP8_FNUZ)),
    (QuantSpec("fp8", "block128x128", scale_dtype="fp32"), "gfx950", (Q_1X128, FP8)),
    (QuantSpec("fp8", "tensor", scale_dtype="fp32"), "gfx950", (Q_TENSOR, FP8)),
    (QuantSpec("fp8", "channel", scale_dtype="fp32"), "gfx942", (Q_TOKEN, FP8_FNUZ)),
    (QuantSpec("int8", "tensor", scale_dtype="fp32"), "gfx942", (Q_TENSOR, I8)),
    (QuantSpec("int8", "channel", scale_dtype="fp32"), "gfx942", (Q_TOKEN, I8)),
    (QuantSpec("int4", "group32", scale_dtype="bf16"), "gfx950", (Q_1X32, I4)),
    (QuantSpec("int4", "channel", scale_dtype="fp32"), "gfx942", (Q_TOKEN, U32)),
])
def test_quant_type_and_weight_dtype(weight, gfx, expected):
    """FM _fused_moe_impl: quant_type = quant_remap.get(…) (per_128x128 -> per_1x128), q_dtype_w = w1.dtype with
    dtypes.fp8 per arch (e4m3fnuz on gfx942, aiter/utility/dtypes.py); int4 with groups is the a16wi4 i4x2 path
    (per_1x32), packed int4 without groups is torch.uint32 per_Token."""
    caps = target_capabilities("MI300X" if gfx == "gfx942" else "MI355X", "0.1.20.post1")
    act = "bf16" if weight in ("mxfp4", "mxfp8") or getattr(weight, "dtype", "") in ("bf16", "fp16", "int4") else \
        QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True)
    if weight in ("mxfp4", "mxfp8"):
        act = weight
    k = dispatch_key(layer(weight=weight, act=act), caps)
    assert (k.q_type, k.q_dtype_w) == expected


def test_dispatch_key_refusals_and_overrides():
    """What AITER's fused_moe cannot take is a UsageError naming it; CU_NUM overrides the CU count of the key
    (chip_info.py get_cu_num_custom_op); a padding's kernel pads are the key's hidden_pad/intermediate_pad
    (fused_moe(hidden_pad=, intermediate_pad=))."""
    from moedispatch.core.backend import Padding

    caps = target_capabilities(*MI355X)
    dense = MoELayer.build(kind="dense", hidden=7168, intermediate=2048, tp=8)
    with pytest.raises(UsageError, match="dense MLP"):
        dispatch_key(dense, caps)
    with pytest.raises(UsageError, match="ActivationType"):
        dispatch_key(layer(activation="relu2"), caps)
    import dataclasses

    with pytest.raises(UsageError, match="gfx"):
        dispatch_key(layer(), dataclasses.replace(caps, gfx=None))
    with pytest.raises(UsageError, match="CU count"):
        dispatch_key(layer(), dataclasses.replace(caps, compute_units=0))
    assert dispatch_key(layer(), caps, env={"CU_NUM": "80"}).cu_num == 80
    assert dispatch_key(layer(), caps).cu_num == 256
    pad = Padding(hidden=7168, intermediate_per_rank=384, intermediate_pad=128, zero_fill=True)
    k = dispatch_key(layer(), caps, padding=pad)
    assert (k.model_dim, k.inter_dim, k.intermediate_pad, k.hidden_pad) == (
        7168, 384, pad.kernel_intermediate_pad, pad.kernel_hidden_pad)
    assert (dispatch_key(layer(), caps).inter_dim, dispatch_key(layer(), caps).intermediate_pad) == (256, 0)
    biased = dispatch_key(layer(has_bias=True), caps)
    assert biased.has_bias is True and dispatch_key(layer(), caps).has_bias is False
    k = dispatch_key(layer(), caps)
    assert (k.use_g1u1, k.doweight_stage1, k.dtype, k.act_type, k.gate_mode, k.is_ep) == (
        1, 0, BF16, SILU, "separated", False)
    assert dispatch_key(layer(activation="gelu_tanh"), caps).act_type == GELU
    assert dispatch_key(layer(model_type="llama4_text"), caps).doweight_stage1 == 1


@pytest.mark.parametrize(("model", "ep", "fused", "slot", "expected"), [
    ("head", 8, False, None, (32, 8, 7)), ("head", 8, True, None, (33, 10, 9)), ("head", 8, False, True, (32, 9, 8)),
    ("head", 1, True, None, (257, 9, 9)), ("head", 2, False, None, (128, 8, 7)), ("0.1.15", 8, False, None, (32, 8, 8)), ("0.1.16", 8, False, None, (32, 8, 7)),
    ("legacy", 8, True, None, (33, 10, 10)),
])
def test_expert_and_topk_per_release(model, ep, fused, slot, expected):
    """A fused shared expert is one more expert and top-k slot; under EP with the fake slot the caller passes
    topk + 1; AITER subtracts int(is_ep) from topk before the lookup from v0.1.16 (FM line 2217) — v0.1.15 does not.
    (expert, runtime topk, looked-up topk)."""
    caps = target_capabilities(*MI355X)
    a = Assumptions(fused_shared_expert=fused, ep_fake_slot=slot)
    k = dispatch_key(layer(tp=8, ep=ep), caps, assumptions=a, model=model)
    assert (k.expert, k.runtime_topk, k.topk) == expected and k.is_ep is (ep > 1)


def test_assumptions_resolve_and_describe():
    """Engine-side facts the key depends on (vLLM: gate_mode interleave for swigluoai, PR #46419; the EP fake slot
    with a fused shared expert, aiter#3999; apply_router_weight_on_input for Llama-4 -> doweight_stage1)."""
    plain = layer(tp=8, ep=8)
    a = Assumptions().resolve(plain)
    assert (a.gate_mode, a.ep_fake_slot, a.doweight_stage1) == ("separated", False, False)
    assert Assumptions(fused_shared_expert=True).resolve(plain).ep_fake_slot is True
    assert Assumptions(fused_shared_expert=True).resolve(layer()).ep_fake_slot is False
    assert Assumptions(ep_fake_slot=False, fused_shared_expert=True).resolve(plain).ep_fake_slot is False
    assert Assumptions().resolve(layer(activation="swigluoai", weight="mxfp4", act="mxfp4")).gate_mode == "interleave"
    assert Assumptions(gate_mode="separated").resolve(
        layer(activation="swigluoai", weight="mxfp4", act="mxfp4")).gate_mode == "separated"
    assert Assumptions(doweight_stage1=False).resolve(layer(model_type="llama4")).doweight_stage1 is False
    assert Assumptions().resolve(layer(model_type="llama4")).doweight_stage1 is True
    with pytest.raises(UsageError, match="gate_mode"):
        Assumptions(gate_mode="gugu").resolve(plain)
    assert Assumptions().describe(layer()) == (
        "shared expert not fused into the routed call (no extra expert or top-k slot)",
        "gate/up layout separated (fused_moe(gate_mode=))")
    lines = Assumptions(fused_shared_expert=True, flydsl_available=False, doweight_stage1=True).describe(plain)
    assert lines == (
        "fused shared expert: +1 expert, +1 top-k slot", "gate/up layout separated (fused_moe(gate_mode=))",
        "EP: AITER looks up topk - 1 (it strips a fake slot); the caller appends one, so the routed top-k is "
        "looked up",
        "flydsl not importable on the target: FlyDSL rows and heuristics are skipped",
        "router weight applied before stage 1 (doweight_stage1=1)")
    assert Assumptions().describe(plain)[2].endswith("the lookup uses top-k - 1 and can miss tuned rows (aiter#3999)")


@pytest.mark.parametrize(("env", "shared", "size", "fused"), [
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}, 1, 0, True),
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": " TRUE "}, 1, 2048, True),
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "yes"}, 1, 2048, True),
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "0"}, 1, 2048, False),
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}, 2, 2048, False),
    ({"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}, 1, 4096, False),
    ({}, 1, 2048, False),
])
def test_assumptions_from_engine_env(env, shared, size, fused, monkeypatch):
    """vLLM folds exactly one same-size shared expert into the routed AITER call when
    VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS is truthy (vllm-project/vllm PR #46474); overrides pass through."""
    lay = layer(shared_experts=shared, shared_intermediate=size)
    a = Assumptions.from_engine_env(lay, env, gate_mode="interleave")
    assert a.fused_shared_expert is fused and a.gate_mode == "interleave"
    monkeypatch.setenv("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "1")
    assert Assumptions.from_engine_env(layer(shared_experts=1, shared_intermediate=2048)).fused_shared_expert


@pytest.mark.parametrize(("version", "facts"), [
    # (padded_m, gfx in the key, act wildcard, EP top-k strip, activation policy, bound env, 0.1.7 heuristics)
    ("legacy", ("v017", False, False, False, "v017", None, "v017")),
    ("0.1.7.post2.dev18", ("v017", False, False, False, "v017", None, "v017")),
    ("0.1.8", ("v08", False, False, False, "v017", None, "head")),
    ("0.1.10.post2", ("v09", False, False, False, "swiglu512", None, "head")),
    ("0.1.12", ("cap32768", False, False, False, "swiglu512", None, "head")),
    ("0.1.13.post1", ("cap32768", False, False, False, "swiglu512", "AITER_BF16_FP8_BOUND", "head")),
    ("0.1.14", ("tiers", False, True, False, "head", "AITER_BF16_FP8_MOE_BOUND", "head")),
    ("0.1.15.post3+rocm7.1", ("tiers", False, True, False, "head", "AITER_BF16_FP8_MOE_BOUND", "head")),
    ("0.1.15.dev3", ("tiers", False, True, False, "head", "AITER_BF16_FP8_MOE_BOUND", "head")),
    ("0.1.18", ("tiers", True, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", "head")),
])
def test_lookup_rules_per_release(version, facts):
    """What each release's aiter/fused_moe.py does (get_padded_M, _INDEX_COLS with gfx from v0.1.16, the act
    wildcard dict from v0.1.14, ``topk -= int(is_ep)`` from v0.1.16, the activation policy and its bound variable:
    none / AITER_BF16_FP8_BOUND in v0.1.13 / AITER_BF16_FP8_MOE_BOUND from v0.1.14); a ROCm local tag compares as the
    public version and a dev/pre-release falls in its own range."""
    r = lookup_rules(version)
    assert (r.padded_m, r.gfx_key, r.act_wildcard, r.ep_strip, r.act_policy, r.bound_env, r.heuristics) == facts
    assert lookup_rules(r) is r and r is not HEAD_RULES


@pytest.mark.parametrize("version", [None, "head", "0.1.20", "0.1.21.post2+rocm7.1", "not a version"])
def test_lookup_rules_head(version):
    """HEAD e4048607's rules for HEAD, releases from v0.1.20 and versions that do not parse."""
    assert lookup_rules(version) is HEAD_RULES
    assert lookup_rules("legacy") is LEGACY_RULES


# -- the activation dtype per release (FM _fused_moe_impl lines 759-807) -------------------------------------------

MX = dict(q_type=Q_1X32, q_dtype_w=FP4)


@pytest.mark.parametrize(("k", "M", "env", "q_a"), [
    (dict(MX, q_dtype_w=I4), 1, {}, BF16),                                        # a16wi4
    (dict(MX, q_dtype_w=FP8), 1, {}, FP8),                                        # mxfp8 on gfx950
    (dict(MX, q_dtype_w=FP8_FNUZ, gfx="gfx942"), 1, {}, FP8_FNUZ),                # mxfp8 = dtypes.fp8 on gfx942
    (dict(MX, q_dtype_w=FP8, gfx="gfx942"), 1, {}, FP4),                          # e4m3fn is not gfx942's fp8
    (dict(MX, act_type=SITUV2), 1, {"AITER_SITUV2_A8W4": "1", "AITER_SITUV2_A4W4": "1"}, FP8),
    (dict(MX, act_type=SITUV2, gfx="gfx942"), 1, {"AITER_SITUV2_A8W4": "1"}, FP8_FNUZ),
    (dict(MX, act_type=SITUV2), 1, {"AITER_SITUV2_A8W4": "0", "AITER_SITUV2_A4W4": "1"}, FP4),
    (dict(MX, act_type=SITUV2), 4096, {"AITER_SITUV2_A4W4": "0"}, BF16),
    (dict(MX, act_type=SWIGLU), 255, {}, BF16), (dict(MX, act_type=SWIGLU), 256, {}, FP4),
    (dict(MX, act_type=SWIGLU), 299, {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "300"}, BF16),
    (dict(MX, act_type=SWIGLU), 300, {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "300"}, FP4),
    (dict(MX, act_type=SWIGLU, gate_mode="interleave"), 255, {}, BF16),
    (dict(MX, act_type=SWIGLU, gate_mode="interleave"), 256, {}, FP8),
    (dict(MX, act_type=SWIGLU, gate_mode="interleave"), 99, {"AITER_BF16_FP8_MOE_BOUND": "100"}, BF16),
    (dict(MX, act_type=SWIGLU, gate_mode="interleave"), 100, {"AITER_BF16_FP8_MOE_BOUND": "100"}, FP8),
    (dict(MX, act_type=SWIGLU, gate_mode="interleave", gfx="gfx942"), 4096, {}, BF16),
    (dict(MX, act_type=SILU, gate_mode="interleave"), 512, {}, FP8),
    (dict(MX, act_type=SILU), 4096, {"AITER_BF16_FP8_MOE_BOUND": "0"}, FP4),       # SEPARATED Silu: fp4x2
    (dict(q_type=Q_TOKEN, q_dtype_w=U32, gfx="gfx942"), 1, {}, FP8_FNUZ),     # uint32 -> dtypes.fp8
    (dict(q_type=Q_TOKEN, q_dtype_w=U32), 1, {}, FP8),
    (dict(q_type=Q_TOKEN, q_dtype_w=I8), 1, {}, I8),
    (dict(q_type=Q_TOKEN, q_dtype_w=I8, gfx="gfx1250"), 1, {}, FP4),          # gfx1250 forces fp4x2 …
    (dict(q_type=Q_TOKEN, q_dtype_w=I8, gfx="gfx1250"), 1, {"AITER_FORCE_A8W4": "1"}, FP8),  # … or fp8
])
def test_head_activation_dtype(k, M, env, q_a):
    """FM _fused_moe_impl: i4x2 -> bf16; per_1x32 dtypes.fp8 weights -> fp8; SiTUv2 -> fp8 with AITER_SITUV2_A8W4=1,
    fp4x2 with AITER_SITUV2_A4W4=1, else bf16; Swiglu SEPARATED -> bf16 below GPTOSS_SWIGLU_MXFP4_BF16_BOUND (256)
    else fp4x2; Swiglu or INTERLEAVE -> bf16 off gfx950 or below AITER_BF16_FP8_MOE_BOUND (256) else fp8; other
    per_1x32 -> fp4x2; non-MX: the weight dtype (dtypes.fp8 for uint32); gfx1250: fp4x2, or fp8 with
    AITER_FORCE_A8W4=1."""
    got, why = activation_dtype(M, key(**k), env)
    assert got == q_a and why


def test_head_activation_dtype_reasons():
    """The reason names AITER's switch and bound (the values above come from FM lines 759-807)."""
    sep = key(**MX, act_type=SWIGLU)
    assert activation_dtype(255, sep, {})[1] == (
        "Swiglu SEPARATED: bf16 below GPTOSS_SWIGLU_MXFP4_BF16_BOUND=256 (M=255)")
    assert activation_dtype(256, sep, {})[1] == (
        "Swiglu SEPARATED: fp4x2 from GPTOSS_SWIGLU_MXFP4_BF16_BOUND=256 (M=256)")
    il = key(**MX, act_type=SWIGLU, gate_mode="interleave")
    assert activation_dtype(255, il, {})[1] == "Swiglu/INTERLEAVE: bf16 below AITER_BF16_FP8_MOE_BOUND=256 (M=255)"
    assert activation_dtype(256, il, {})[1] == "Swiglu/INTERLEAVE on gfx950: fp8 from AITER_BF16_FP8_MOE_BOUND=256 (M=256)"
    assert activation_dtype(256, key(**MX, act_type=SWIGLU, gate_mode="interleave", gfx="gfx942"), {})[1] == \
        "Swiglu/INTERLEAVE: bf16 off gfx950"
    why = activation_dtype(1, key(**dict(MX, q_dtype_w=FP8), gfx="gfx942"), {})[1]
    assert "torch.float8_e4m3fn weights are not gfx942's dtypes.fp8 (torch.float8_e4m3fnuz)" in why
    assert activation_dtype(1, key(**MX), {})[1] == "per_1x32: fp4x2 activations"
    assert activation_dtype(1, key(**MX, act_type=SITUV2), {})[1] == "SiTUv2 defaults to a16w4 (bf16 activations)"
    assert activation_dtype(1, key(**MX, act_type=SITUV2), {"AITER_SITUV2_A8W4": "1"})[1] == \
        "SiTUv2 with AITER_SITUV2_A8W4=1"
    assert activation_dtype(1, key(**MX, act_type=SITUV2), {"AITER_SITUV2_A4W4": "1"})[1] == \
        "SiTUv2 with AITER_SITUV2_A4W4=1"
    assert activation_dtype(1, key(**dict(MX, q_dtype_w=I4)), {})[1] == \
        "a16wi4: int4 weights run with bf16 activations"
    assert activation_dtype(1, key(**dict(MX, q_dtype_w=FP8)), {})[1] == \
        "mxfp8: fp8 activations with per-1x32 e8m0 scales"
    assert activation_dtype(1, key(q_type=Q_TOKEN, q_dtype_w=I8), {})[1] == "activations take the weight dtype"
    assert activation_dtype(1, key(q_type=Q_TOKEN, q_dtype_w=I8, gfx="gfx1250"), {})[1] == \
        "gfx1250 forces fp4/fp8 activations"


@pytest.mark.parametrize(("version", "k", "M", "env", "q_a"), [
    ("0.1.10", dict(MX, act_type=SWIGLU), 511, {}, BF16),
    ("0.1.10", dict(MX, act_type=SWIGLU), 512, {}, FP8),
    ("0.1.10", dict(MX, act_type=SWIGLU), 100, {"AITER_BF16_FP8_BOUND": "100"}, BF16),   # no env in 0.1.10
    ("0.1.10", dict(MX, act_type=SWIGLU, gfx="gfx942"), 4096, {}, BF16),
    ("0.1.10", dict(MX, act_type=SILU), 4096, {}, FP4),
    ("0.1.10", dict(MX, act_type=SILU, gate_mode="interleave"), 4096, {}, FP4),    # no INTERLEAVE rule yet
    ("0.1.10", dict(q_type=Q_1X128, q_dtype_w=FP8), 1, {}, FP8),
    ("0.1.13.post1", dict(MX, act_type=SWIGLU), 100, {"AITER_BF16_FP8_BOUND": "100"}, FP8),
    ("0.1.13.post1", dict(MX, act_type=SWIGLU), 99, {"AITER_BF16_FP8_BOUND": "100"}, BF16),
    ("0.1.13.post1", dict(MX, q_dtype_w=I4), 1, {}, BF16),
])
def test_activation_dtype_before_0_1_14(version, k, M, env, q_a):
    """v0.1.10.post2 lines 227-236 (bound 512, no env), v0.1.13.post1 lines 257-277 (AITER_BF16_FP8_BOUND, default
    512; a16wi4 -> bf16): per_1x32 Swiglu -> bf16 off gfx950 or below the bound, else fp8; other per_1x32 -> fp4x2."""
    got, why = activation_dtype(M, key(**k), env, version)
    assert got == q_a and why
    sw = key(**dict(MX, act_type=SWIGLU))
    n10, n13 = lookup_rules("0.1.10").name, lookup_rules("0.1.13.post1").name
    assert activation_dtype(512, sw, {}, "0.1.10")[1] == f"Swiglu MXFP4 on gfx950: fp8 from the bound=512 ({n10})"
    assert activation_dtype(511, sw, {}, "0.1.10")[1] == (
        f"Swiglu MXFP4: bf16 below the bound=512 or off gfx950 ({n10}, M=511)")
    assert activation_dtype(512, sw, {}, "0.1.13.post1")[1] == (
        f"Swiglu MXFP4 on gfx950: fp8 from AITER_BF16_FP8_BOUND=512 ({n13})")
    assert activation_dtype(1, key(**MX), {}, "0.1.10")[1] == f"per_1x32: fp4x2 activations ({n10})"
    if k.get("act_type") == SWIGLU and k.get("gfx") is None:
        assert ("AITER_BF16_FP8_BOUND" in why) is (version == "0.1.13.post1")


# -- the lookup (FM get_2stage_cfgs _lookup_cfg, lines 2253-2276) ------------------------------------------------

CK = dict(kernel1="moe_ck2stages_gemm1_a", kernel2="moe_ck2stages_gemm2_b", block_m=64)


def test_head_lookup_is_act_wildcard_first_row_in_merge_order():
    """At HEAD the key holds the pybind ActivationType while the CSV holds strings, so the exact dict never matches
    (FM line 2222 ``keys[7] = activation``) and the act-wildcard dict decides: the first row of the shape in merge
    order, whatever its activation. v0.1.18 keys on str(activation): the exact Silu row wins there."""
    k = key()
    gelu = row(k, 64, FP8, act_type=GELU, line=2, **CK)
    silu = row(k, 64, FP8, line=3, **dict(CK, kernel1="moe_ck2stages_gemm1_silu"))
    c = cs(gelu, silu)
    s = head_step(33, k, c)
    assert (s.basis, s.config, s.kernels[0], s.row) == ("tuned", "t.csv:2", "moe_ck2stages_gemm1_a", gelu)
    assert ("the first row of this shape is a Gelu row (t.csv:2) and AITER's exact lookup cannot match the Silu row "
            "at t.csv:3 (it keys on the ActivationType enum, the CSV on strings): the act-wildcard match decides "
            "[derived]") in s.notes
    exact = head_step(33, k, c, model="0.1.18")
    assert exact.config == "t.csv:3" and not any("act-wildcard" in n for n in exact.notes)
    only_gelu = head_step(33, k, cs(gelu), model="0.1.18")
    assert only_gelu.config == "t.csv:2"
    note = next(n for n in only_gelu.notes if "act-wildcard" in n)
    assert note == ("the first row of this shape is a Gelu row (t.csv:2) and AITER's exact lookup cannot match the "
                    "Silu row: the act-wildcard match decides [derived]")
    assert head_step(33, k, cs(gelu), model="0.1.13").basis == "heuristic"  # no wildcard before v0.1.14
    assert head_step(33, k, cs(silu), model="0.1.13").config == "t.csv:3"


def test_head_lookup_keys_on_gfx_from_0_1_16():
    """_INDEX_COLS starts with gfx from v0.1.16 (FM lines 2136-2150): a gfx942 row does not answer a gfx950 lookup;
    a row without gfx (legacy CSV) is backfilled from cu_num (256 -> gfx950, _ensure_gfx_column) and matches.
    v0.1.15 has no gfx column in the key."""
    k = key()
    other = row(k, 64, FP8, gfx="gfx942", **CK)
    assert head_step(64, k, cs(other)).basis == "heuristic"
    assert head_step(64, k, cs(other), model="0.1.15").config == "t.csv:2"
    assert head_step(64, k, cs(row(k, 64, FP8, gfx=None, **CK))).config == "t.csv:2"
    both = cs(other, row(k, 64, FP8, line=3, **CK))
    assert head_step(64, k, both).config == "t.csv:3"


def test_head_lookup_falls_back_to_smaller_tiers():
    """FM lines 2263-2275: token 131072 without a row tries the 32768 tier (primary, then wildcard); below the
    tiers there is no fallback, and v0.1.12 (cap 32768) has no tier list."""
    k = key(inter_dim=384)
    r = row(k, 32768, FP8, **CK)
    s = head_step(200000, k, cs(r))
    assert (s.bucket, s.config) == (131072, "t.csv:2")
    assert "no row at tier 131072; AITER falls back to the 32768 tier" in s.notes
    assert head_step(40000, k, cs(r)).notes.count("no row at tier 131072; AITER falls back to the 32768 tier") == 0
    assert head_step(10000, k, cs(r)).basis == "heuristic"                       # bucket 16384: no fallback
    assert head_step(100000, k, cs(row(k, 131072, FP8, **CK))).basis == "heuristic"  # no upward fallback


def test_index_skips_fallback_rows_and_counts_duplicates(head):
    """FM get_cfg_2stages drops ``_tag == flydsl_fallback`` rows and keeps the first of duplicate keys (with a
    warning); 0.1.7's pandas ``to_dict('index')`` raises on duplicates instead."""
    k = key()
    fb = row(k, 64, FP8, tag="flydsl_fallback", **CK)
    assert head_step(64, k, cs(fb)).basis == "heuristic"
    dup = cs(row(k, 64, FP8, line=2, **CK), row(k, 64, FP8, line=3, **CK),
             row(k, 64, FP8, line=4, gfx="gfx942", **CK))
    idx = _index(dup)
    assert idx.duplicates == 1 and _index(dup) is idx
    assert head_step(64, k, dup).config == "t.csv:2"
    lay = layer(hidden=7168, intermediate=2048, experts=256, top_k=8)
    caps = target_capabilities(*MI355X)
    plan = plan_dispatch(lay, caps, configs=dup, env={}, tokens=(64,))
    assert "1 tuned rows repeat a lookup key; AITER keeps the first" in plan.warnings
    old = plan_dispatch(lay, target_capabilities("MI355X", "0.1.7"), configs=dup, env={}, tokens=(64,))
    assert ("1 tuned rows repeat a lookup key; AITER keeps the first — pandas to_dict('index') raises on them in "
            "0.1.7") in old.warnings
    assert not any("repeat a lookup key" in w for w in plan_dispatch(lay, caps, configs=cs(), env={},
                                                                      tokens=(64,)).warnings)


# -- HEAD get_2stage_cfgs branches (FM lines 2281-2960) -------------------------------------------------------

SITU = dict(q_type=Q_1X32, q_dtype_w=FP4, act_type=SITUV2, inter_dim=512, expert=48, topk=6)


@pytest.mark.parametrize(("k", "a", "why"), [
    (dict(gfx="gfx1250"), {}, "requires the FlyDSL kernel on CDNA gfx942/gfx950 (gfx='gfx1250', "
                              "flydsl_available=True)"),
    ({}, {"flydsl_available": False}, "requires the FlyDSL kernel on CDNA gfx942/gfx950 (gfx='gfx950', "
                                      "flydsl_available=False)"),
    (dict(has_bias=True, is_ep=True), {}, "per-expert bias"),
    (dict(is_ep=True), {}, "expert-parallel masking"),
    ({}, {"weights_shuffled": False}, "non-preshuffled / non-g1u1 weights or doweight_stage1=True"),
    (dict(use_g1u1=0), {}, "non-preshuffled / non-g1u1 weights or doweight_stage1=True"),
    (dict(doweight_stage1=1), {}, "non-preshuffled / non-g1u1 weights or doweight_stage1=True"),
])
def test_situv2_a16w4_refusals(k, a, why):
    """FM _fused_moe_impl lines 854-880: a16w4 SiTUv2 raises NotImplementedError (first failing check wins) before
    any lookup: the step runs nothing, whatever rows the table holds."""
    kk = key(**SITU, **k)
    msg = f"NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 is not supported: {why}."
    assert _situv2_a16w4_refusal(kk, BF16, Assumptions(**a)) == msg
    r = row(kk, 1, BF16, kernel1="flydsl_moe1_abf16_x", kernel2="flydsl_moe2_abf16_y")
    s = head_step(1, kk, cs(r), a=Assumptions(**a))
    assert (s.raises, s.stages, s.family, s.kernels, s.block_m, s.basis, s.config, s.activation_dtype, s.bucket,
            s.q_dtype_a) == (msg, 2, "none", (), None, "heuristic", None, "bf16", 1, BF16)
    assert s.buckets == (1,) and s.tokens == (1, 1) and s.notes[0] == "SiTUv2 defaults to a16w4 (bf16 activations)"


def test_situv2_a16w4_runs_flydsl_where_allowed():
    """The guard applies only to bf16 activations x fp4x2 weights x SiTUv2 x per_1x32 (FM line 847); a supported
    call takes the a16w4 FlyDSL heuristic (FM lines 2694-2740: _a_type "bf16"); v0.1.19 has no guard."""
    ok = key(**SITU)
    assert _situv2_a16w4_refusal(ok, BF16, Assumptions()) is None
    assert _situv2_a16w4_refusal(key(**SITU, is_ep=True), FP8, Assumptions()) is None
    assert _situv2_a16w4_refusal(key(**dict(SITU, act_type=SWIGLU), is_ep=True), BF16, Assumptions()) is None
    assert _situv2_a16w4_refusal(key(**dict(SITU, q_dtype_w=FP8), is_ep=True), BF16, Assumptions()) is None
    assert _situv2_a16w4_refusal(key(**dict(SITU, q_type=Q_TOKEN), is_ep=True), BF16, Assumptions()) is None
    s = head_step(1, ok)
    assert s.raises is None and s.kernels == ("flydsl_moe1_abf16_wfp4_bf16_t32x128x256_w2",
                                              "flydsl_moe2_abf16_wfp4_bf16_t32x128x256_atomic_bnt2")
    assert (s.block_m, s.ksplit, s.family, s.basis) == (32, -1, "flydsl", "heuristic")
    assert head_step(1, key(**SITU, is_ep=True), model="0.1.19.post2").raises is None


MXI = dict(q_type=Q_1X32, q_dtype_w=FP4, act_type=SWIGLU, gate_mode="interleave", inter_dim=384,
           expert=384, topk=6)


def _opus(**kw):
    return dict(kernel1="flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w3_gui_fp8", kernel2="opus_moe2_a8w4_t32_x",
                block_m=32, **kw)


@pytest.mark.parametrize(("k", "a", "note"), [
    ({}, {"weights_shuffled": False}, "Opus row t.csv:2 discarded: weights not pre-shuffled"),
    (dict(gfx="gfx942"), {}, "Opus stage2 config unsupported (requires gfx950, got gfx942): row t.csv:2 dropped, "
                             "AITER uses default heuristics"),
    (dict(is_ep=True), {}, "Opus stage2 config unsupported (EP expert_mask/topk_ids are not supported): row t.csv:2 "
                           "dropped, AITER uses default heuristics"),
    (dict(has_bias=True), {}, "Opus stage2 config unsupported (stage2 bias is not supported): row t.csv:2 dropped, "
                              "AITER uses default heuristics"),
])
def test_opus_rows_refused(k, a, note):
    """FM lines 2294-2336: an Opus row is discarded unless both weights are pre-shuffled; an Opus stage-2 row is
    dropped where aiter/ops/opus cfg_is_supported refuses it (gfx950 only, no EP, no stage-2 bias)."""
    kk = key(**MXI, **k)
    r = row(kk, 256, FP8 if kk.gfx == "gfx950" else BF16, **_opus())
    s = head_step(256, kk, cs(r), a=Assumptions(**a))
    assert note in s.notes and s.basis == "heuristic" and not any(n.startswith("opus") for n in s.kernels)


def test_opus_stage1_row_needs_a_supported_activation():
    """FM lines 2303-2314: an opus_* stage-1 row is discarded for activations other than Silu/Swiglu/Situv2; an
    opus_moe1_ row otherwise runs (is_opus1, FM line 2604), flydsl or not."""
    kk = key(**dict(MXI, act_type=GELU))
    r = row(kk, 256, FP8, kernel1="opus_moe1_a8w4_x", kernel2="flydsl_moe2_afp8_y", block_m=32)
    s = head_step(256, kk, cs(r))
    assert "Opus row t.csv:2 discarded: activation ActivationType.Gelu unsupported" in s.notes and s.basis == "heuristic"
    ok = key(**MXI)
    s = head_step(256, ok, cs(row(ok, 256, FP8, kernel1="opus_moe1_a8w4_x", kernel2="moe_ck2stages_gemm2_y",
                                  block_m=32, ksplit=2)), a=Assumptions(flydsl_available=False))
    assert (s.basis, s.kernels, s.block_m, s.ksplit, s.family) == (
        "tuned", ("opus_moe1_a8w4_x", "moe_ck2stages_gemm2_y"), 32, 2, "opus+ck")


def test_opus_row_with_bypass_checks_the_sort_block_m():
    """AITER_BYPASS_TUNE_CONFIG keeps cfg (FM line 2369) and parse_stage2_config(cfg, block_m) raises when the
    heuristic block_m differs from the Opus kernel's sort block_m (FM line 2456); where they agree the heuristic
    path runs."""
    kk = key(**MXI)
    bm = fm_get_block_size_M(256, 6, 384, 384, 256)
    for opus_bm, raises in ((bm, False), (bm * 2, True)):
        r = row(kk, 256, FP8, **dict(_opus(), block_m=opus_bm))
        s = head_step(256, kk, cs(r), env={"AITER_BYPASS_TUNE_CONFIG": "1"})
        assert "AITER_BYPASS_TUNE_CONFIG set: tuned row t.csv:2 ignored" in s.notes
        if raises:
            assert s.raises == (f"ValueError: requires sort block_m={opus_bm}, got tuned block_m={bm} "
                                "(AITER_BYPASS_TUNE_CONFIG with the Opus row t.csv:2)")
            assert (s.stages, s.family, s.kernels, s.block_m, s.basis, s.config, s.q_dtype_a, s.buckets) == (
                2, "none", (), bm, "heuristic", None, FP8, (256,))
            assert s.activation_dtype == "mxfp8" and s.tokens == (256, 256) and s.bucket == 256
        else:  # the interleaved Swiglu MXFP4 branch (FM line 2660) then decides
            assert s.raises is None and s.family == "cktile" and s.basis == "heuristic"
    tuned = head_step(256, kk, cs(row(kk, 256, FP8, **_opus())), env={"AITER_BYPASS_TUNE_CONFIG": "0"})
    assert tuned.basis == "tuned" and tuned.kernels[1] == "opus_moe2_a8w4_t32_x" and tuned.family == "flydsl+opus"


def test_notes_for_online_tune_and_a_broken_table():
    """AITER_ONLINE_TUNE=1 tunes a missing shape at first call (FM lines 2279-2290): unknowable offline, noted; a
    table with malformed lines is not read (its first warnings are quoted)."""
    k = key(inter_dim=384)
    on = {"AITER_ONLINE_TUNE": "1"}
    note = ("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call (result unknown offline); modelled as the "
            "heuristic it falls back to")
    assert note in head_step(64, k, cs(), env=on).notes
    assert note not in head_step(64, k, None, env=on).notes
    assert note not in head_step(64, k, cs(), env={"AITER_ONLINE_TUNE": "0"}).notes
    assert note not in head_step(64, k, cs(row(k, 64, FP8, **CK)), env=on).notes
    bad = cs(row(k, 64, FP8, **CK), broken=True, warnings=("a.csv:3: bad", "a.csv:4: worse", "a.csv:5: third"))
    s = head_step(64, k, bad, env=on)
    assert s.basis == "heuristic" and note not in s.notes
    assert ("the tuned set has malformed lines: modelled with heuristics only (a.csv:3: bad; a.csv:4: worse)"
            in s.notes)


@pytest.mark.parametrize(("k", "M", "stages", "op"), [
    (dict(), 32, 2, None), (dict(), 33, 1, "fmoe_fp8_blockscale_g1u1"), (dict(inter_dim=192), 64, 2, None),
    (dict(gfx="gfx942", cu_num=304, q_dtype_w=FP8_FNUZ), 64, 1, "fmoe_fp8_blockscale_g1u1"),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8), 32, 2, None),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8), 33, 1, "fmoe_g1u1"),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8, use_g1u1=0), 64, 1, "fmoe_int8_g1u0"),
    (dict(q_type=Q_TOKEN), 16, 2, None), (dict(q_type=Q_TOKEN), 17, 1, "fmoe_g1u1"),
    (dict(q_type=Q_TOKEN, inter_dim=192), 1, 1, "fmoe_g1u1"),
    (dict(q_type=Q_TOKEN, doweight_stage1=1), 64, 1, "fmoe_g1u1_tkw1"),
    (dict(q_type=Q_TOKEN, q_dtype_w=BF16, use_g1u1=0), 128, 1, "fmoe_int8_g1u0"),
    (dict(q_type=Q_TOKEN, q_dtype_w=BF16, use_g1u1=0), 256, 2, None),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_NO, q_dtype_w=BF16, use_g1u1=0), 128, 1, "fmoe"),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_NO, q_dtype_w=BF16, use_g1u1=0), 129, 2, None),
    (dict(gfx="gfx942", cu_num=304, q_type=Q_NO, q_dtype_w=BF16, use_g1u1=0), 256, 2, None),
    (dict(q_type=Q_1X32, q_dtype_w=FP4), 1024, 2, None),
    (dict(gfx="gfx1250"), 64, 2, None),
])
def test_heuristic_one_stage_decision(k, M, stages, op):
    """FM lines 2381-2406: the 1-stage ASM path needs a fused_moe_1stage_dict entry for the arch, then per_1x128:
    token > 32 and inter_dim % 128 == 0; per_Token i8: token > 32; per_Token fp8: token > 16 or inter_dim % 128 != 0;
    other non-per_1x32: token < 256; per_1x32 never. The op is fused_moe_1stage's by quant type (lines 1094-1188),
    block_m BLOCK_SIZE_M (32)."""
    s = head_step(M, key(**k))
    assert s.stages == stages and s.basis == "heuristic" and s.config is None
    if op:
        assert (s.kernels, s.block_m, s.ksplit, s.family) == ((f"{op} (default)",), 32, 0, "asm")
        assert ("1-stage ASM from fused_moe_1stage_dict: the asm launcher picks the code object by inter_dim and "
                "block_m") in s.notes


def test_heuristic_one_stage_xbf16():
    """FM lines 2404-2405: gfx950 per_1x128 1-stage with AITER_XBFLOAT16=1 runs the xbf16 variant."""
    k = key()
    assert head_step(64, k, env={"AITER_XBFLOAT16": "1"}).kernels == ("fmoe_fp8_blockscale_g1u1 (default, xbf16)",)
    assert head_step(64, k, env={"AITER_XBFLOAT16": "0"}).kernels == ("fmoe_fp8_blockscale_g1u1 (default)",)
    k942 = key(gfx="gfx942", cu_num=304, q_dtype_w=FP8_FNUZ)
    assert head_step(64, k942, env={"AITER_XBFLOAT16": "1"}).kernels == ("fmoe_fp8_blockscale_g1u1 (default)",)


def test_tuned_rows_one_and_two_stage():
    """FM lines 2427-2436: a row gives block_m, ksplit (0 with AITER_KSPLIT=-1), kernel names and run_1stage; a
    1-stage row runs fused_moe_1stage with kernelName1."""
    k = key(inter_dim=384)
    one = row(k, 64, FP8, kernel1="_ZN5aiter_fmoe_bs_x", run_1stage=1, block_m=64, ksplit=2)
    s = head_step(64, k, cs(one))
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.config, s.row, s.family) == (
        1, ("_ZN5aiter_fmoe_bs_x",), 64, 2, "tuned", "t.csv:2", one, "asm")
    two = row(k, 64, FP8, ksplit=3, **CK)
    s = head_step(64, k, cs(two))
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.row, s.family) == (
        2, ("moe_ck2stages_gemm1_a", "moe_ck2stages_gemm2_b"), 64, 3, "tuned", two, "ck")
    assert head_step(64, k, cs(two), env={"AITER_KSPLIT": "-1"}).ksplit == 0
    assert head_step(64, k, cs(two), env={"AITER_KSPLIT": "5"}).ksplit == 3
    ck1 = head_step(64, k, cs(row(k, 64, FP8, kernel1="moe_ck2stages_gemm1_a", kernel2="", block_m=64)))
    assert ck1.kernels == ("moe_ck2stages_gemm1_a", "moe_ck2stages_gemm2 (default)") and ck1.basis == "tuned"
    tile2 = head_step(64, k, cs(row(k, 64, FP8, kernel1="moe_ck2stages_gemm1_a", kernel2="cktile_s2_x",
                                    block_m=64)))
    assert tile2.kernels == ("moe_ck2stages_gemm1_a", "cktile_moe_stage2 (default)")
    assert any("cktile_s2_x" in n for n in tile2.notes)


@pytest.mark.parametrize(("kn1", "kn2", "bm", "ep"), [
    ("flydsl_mxmoe_g1_a4w4_64x256x256_nt", "flydsl_mxmoe_g2_a4w4_64x256x256_atomic", 64, False),
    ("flydsl_mxmoe_g1_a4w4_nosize", "flydsl_mxmoe_g2_a4w4_64x256x256", 48, False),
    ("flydsl_moe1_afp4_wfp4_bf16_t16x128x256", "flydsl_mxmoe_g2_a4w4_16x256x256", 48, False),
    ("flydsl_mxmoe_g1_a4w4_128x256x256", "flydsl_mxmoe_g2_a4w4_128x256x256", 128, True),
])
def test_mxfp4_a4w4_port_rows(kn1, kn2, bm, ep):
    """FM lines 2471-2493: an a4w4 port name (flydsl_mxmoe_g*) in either stage routes to the port with block_m the
    stage-1 name's <BM> (aiter/ops/flydsl/mxfp4_kname.py: flydsl_mxmoe_g1_a4w4_<BM>x256x256[_flags]; a name it cannot
    parse -> the row's block_m) and the row's ksplit; FM line 937: under EP it raises."""
    k = key(**dict(MX, act_type=SILU, inter_dim=256, expert=257, topk=9), is_ep=ep)
    r = row(k, 1, FP4, kernel1=kn1, kernel2=kn2, block_m=48, ksplit=2)
    s = head_step(1, k, cs(r))
    assert (s.stages, s.kernels, s.block_m, s.ksplit, s.basis, s.config) == (2, (kn1, kn2), bm, 2, "tuned", "t.csv:2")
    assert "FlyDSL MXFP4 a4w4 port (flydsl_mxmoe_*)" in s.notes
    if ep:
        assert s.raises == ("NotImplementedError: MXFP4 a4w4 FlyDSL port does not support expert-parallel yet "
                            "(expert_mask is dropped by the output_aux sort path).")
    else:
        assert s.raises is None


def test_flydsl_rows_run_with_flydsl_and_fall_through_without():
    """FM line 2523: FlyDSL-named rows run when is_flydsl_available(); without it AITER falls through the later
    branches (the row's names stay kernelName1/2)."""
    k = key(**dict(MX, act_type=SILU, inter_dim=384, expert=129, topk=5))
    r = row(k, 256, FP4, kernel1="flydsl_moe1_afp4_x", kernel2="flydsl_moe2_afp4_y", block_m=32, ksplit=0)
    s = head_step(256, k, cs(r))
    assert (s.kernels, s.family, s.basis, s.raises) == (("flydsl_moe1_afp4_x", "flydsl_moe2_afp4_y"), "flydsl",
                                                        "tuned", None)
    no = head_step(256, k, cs(r), a=Assumptions(flydsl_available=False))
    assert "row t.csv:2 names FlyDSL kernels but flydsl is not importable: AITER falls through" in no.notes
    assert no.raises and no.kernels[0] == "flydsl_moe1_afp4_x"


def test_interleaved_swiglu_mxfp4_is_cktile():
    """FM lines 2617-2647: gate_mode != SEPARATED, bf16 out, per_1x32, Swiglu, non-fp8 weights -> CK-Tile with
    get_block_m() (32 for fp8 activations, else the token tier) and the heuristic ksplit; a non-FlyDSL row's names
    are ignored there."""
    k = key(**dict(MXI, inter_dim=384))
    s = head_step(256, k, a=Assumptions(flydsl_available=False))
    assert (s.stages, s.kernels, s.block_m, s.family, s.basis) == (
        2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), 32, "cktile", "heuristic")
    assert s.q_dtype_a == FP8 and "Swiglu MXFP4 with interleaved gate/up: CK-Tile 2-stage" in s.notes
    low = head_step(1, k)
    assert (low.q_dtype_a, low.block_m, low.family) == (BF16, 16, "cktile")
    assert low.ksplit == fm_get_ksplit(1, 6, 384, 384, 7168, 256)
    assert head_step(4096, k, env={"AITER_BF16_FP8_MOE_BOUND": "100000"}).block_m == 32
    r = row(k, 256, FP8, **CK)
    t = head_step(256, k, cs(r), a=Assumptions(flydsl_available=False))
    assert t.basis == "heuristic" and t.config is None and t.row is None
    assert "tuned row t.csv:2 matched but this path ignores its kernel names" in t.notes


def test_a16wi4_untuned_flydsl_fallback():
    """FM lines 2652-2692: per_1x32 i4x2 weights with FlyDSL -> flydsl_kernel_name(1/2, "bf16", "int4", "bf16",
    tile_m, 128, 128[, "atomic"]) with tile_m = block_m from the token tier and ksplit 0."""
    k = key(q_type=Q_1X32, q_dtype_w=I4, inter_dim=384)
    s = head_step(4096, k)
    assert (s.kernels, s.block_m, s.ksplit, s.basis, s.family) == (
        ("flydsl_moe1_abf16_wint4_bf16_t32x128x128", "flydsl_moe2_abf16_wint4_bf16_t32x128x128_atomic"), 32, 0,
        "heuristic", "flydsl")
    assert "no tuned FlyDSL a16wi4 config: AITER's untuned a16wi4 fallback" in s.notes
    assert head_step(4096, k, a=Assumptions(flydsl_available=False)).family != "flydsl"


def test_mxfp4_flydsl_heuristic_and_its_switches():
    """FM lines 2694-2790: use_mxfp4_flydsl needs bf16/fp16 out, per_1x32, (Swiglu/SiTUv2 or AITER_FLYDSL_FORCE=1),
    fp4x2/fp8 activations and weights, preshuffled g1u1 weights, no doweight_stage1 and FlyDSL; ksplit -1. A
    non-FlyDSL row matched there is overridden."""
    k = key(**dict(MX, act_type=SILU, inter_dim=384, expert=129, topk=5))
    s = head_step(256, k)
    assert (s.kernels, s.block_m, s.ksplit, s.family, s.basis) == (
        ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2", "flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic_bnt2"), 32, -1,
        "flydsl", "heuristic")
    assert "no tuned FlyDSL config: heuristic FlyDSL fallback" in s.notes
    t = head_step(256, k, cs(row(k, 256, FP4, **CK)))
    assert t.family == "flydsl" and t.basis == "heuristic"
    assert ("tuned row t.csv:2 names ck kernels, but AITER_FLYDSL_FORCE=1 routes per_1x32 fp4/fp8 layers without a "
            "FlyDSL row to the FlyDSL heuristic") in t.notes
    for off in (dict(env={"AITER_FLYDSL_FORCE": "0"}), dict(a=Assumptions(weights_shuffled=False)),
                dict(a=Assumptions(flydsl_available=False))):
        assert head_step(256, k, **off).family != "flydsl"
    assert head_step(256, key(**dict(MX, act_type=SILU, inter_dim=384, use_g1u1=0))).family != "flydsl"
    assert head_step(256, key(**dict(MX, act_type=SILU, inter_dim=384, doweight_stage1=1))).family != "flydsl"
    assert head_step(256, key(**dict(MX, act_type=SILU, inter_dim=384, dtype="torch.float32"))).family != "flydsl"
    sw = key(**dict(MX, act_type=SWIGLU, inter_dim=384))
    assert head_step(256, sw, env={"AITER_FLYDSL_FORCE": "0"}).family == "flydsl"   # Swiglu needs no force
    fp16 = key(**dict(MX, act_type=SILU, inter_dim=384, dtype=FP16))
    assert head_step(256, fp16).family == "flydsl"


def test_mxfp4_cktile_split_k_and_bf16_paths():
    """FM lines 2798-2840: bf16 out, per_1x32, fp4x2 weights, preshuffled, not (Swiglu with fp4x2 activations) and
    (ksplit > 1 or Swiglu with bf16 activations) -> CK-Tile with split_k = max(ksplit, 2 for Swiglu-bf16 else 1)
    and the tier block_m; the Swiglu MXFP4 path with no kernelName1 and unshuffled weights is CK-Tile too
    (lines 2842-2872: split_k max(ksplit, 2))."""
    k = key(**dict(MX, act_type=SILU, inter_dim=384, expert=129, topk=5))
    nofly = Assumptions(flydsl_available=False)
    s = head_step(1, k, a=nofly)
    ks = fm_get_ksplit(1, 5, 129, 384, 7168, 256)
    assert ks > 1 and (s.kernels, s.ksplit, s.block_m, s.family) == (
        ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), ks, 16, "cktile")
    assert any(n.startswith("MXFP4 weights with bf16 activations (or split-K): CK-Tile 2-stage") for n in s.notes)
    big = head_step(8192, k, a=nofly)
    assert big.family != "cktile" and fm_get_ksplit(8192, 5, 129, 384, 7168, 256) == 0
    sw = key(**dict(MX, act_type=SWIGLU, inter_dim=384, expert=129, topk=5))
    b = head_step(8192, sw, env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "100000"}, a=nofly)
    assert (b.q_dtype_a, b.ksplit, b.block_m, b.family) == (BF16, 2, 32, "cktile")
    assert any(n.startswith("MXFP4 weights with bf16 activations (or split-K): CK-Tile 2-stage") for n in b.notes)
    assert not any("unshuffled" in n for n in b.notes)
    r = row(sw, 8192, BF16, **CK)
    t = head_step(8192, sw, cs(r), env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "100000"}, a=nofly)
    assert t.basis == "heuristic" and "tuned row t.csv:2 matched but this path ignores its kernel names" in t.notes
    un = head_step(8192, sw, env={"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "100000"},
                   a=Assumptions(weights_shuffled=False))
    assert (un.kernels, un.ksplit, un.block_m, un.family) == (
        ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), 2, 32, "cktile")
    assert "SwiGLU MXFP4 with unshuffled weights: CK-Tile" in un.notes
    fp4 = head_step(8192, sw, a=Assumptions(weights_shuffled=False))           # fp4x2 activations, unshuffled
    assert fp4.q_dtype_a == FP4 and fp4.family == "cktile" and fp4.ksplit == 2


def test_ck_two_stage_default_and_asm_last_branch():
    """FM lines 2874-2960: no kernelName1 and (per_1x128 with doweight_stage1, or q_dtype_w in bf16/fp16/uint32/
    fp4x2/dtypes.fp8) -> CK 2-stage with the codegen default; otherwise asm_stage1 + ck_moe_stage2 with block_m
    rounded up into [16, 32, 64, 128]."""
    ck = head_step(16, key(q_dtype_w=FP8, inter_dim=384))
    assert (ck.kernels, ck.family, ck.block_m) == (
        ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)"), "ck", 16)
    assert "CK 2-stage with the codegen's default instance for this shape" in ck.notes
    dw = head_step(64, key(gfx="gfx942", cu_num=304, q_dtype_w=FP8, doweight_stage1=1))
    assert dw.family == "ck" and dw.block_m == 64        # e4m3fn is not gfx942's fp8: only doweight makes it CK
    i8 = key(gfx="gfx942", cu_num=304, q_type=Q_TOKEN, q_dtype_w=I8, inter_dim=384, expert=40, topk=6)
    s = head_step(16, i8)
    assert (s.kernels, s.family) == (("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"), "asm+ck")
    assert s.block_m == fm_get_block_size_M(16, 6, 40, 384, 304) and "ASM stage 1 + CK stage 2" in s.notes
    for bm, want in ((8, 16), (24, 32), (48, 64), (100, 128), (256, 128), (64, 64)):
        r = row(i8, 16, I8, kernel1="fmoe_stage1_bf16_x", kernel2="moe_ck2stages_gemm2_y", block_m=bm)
        t = head_step(16, i8, cs(r))
        assert (t.block_m, t.kernels, t.family, t.basis) == (
            want, ("fmoe_stage1_bf16_x", "moe_ck2stages_gemm2_y"), "asm+ck", "tuned")
    r = row(i8, 16, I8, kernel1="fmoe_stage1_bf16_x", kernel2="", block_m=64)
    assert head_step(16, i8, cs(r)).kernels == ("fmoe_stage1_bf16_x", "moe_ck2stages_gemm2 (default)")
    fly = row(i8, 16, I8, kernel1="flydsl_moe1_x", kernel2="flydsl_moe2_y", block_m=32)
    s = head_step(16, i8, cs(fly), a=Assumptions(flydsl_available=False))
    assert (s.ksplit, s.block_m, s.basis, s.config) == (0, 32, "tuned", "t.csv:2") and "ASM stage 1 + CK stage 2" in s.notes
    assert s.family == "asm+ck" and s.raises == (
        "the ASM stage-1 and CK stage-2 launchers are handed FlyDSL kernel names (flydsl_moe1_x, flydsl_moe2_y) "
        "because flydsl is not importable: no such kernel to launch")


# -- known issues: capability_db/dispatch_issues.toml predicates (its header documents each) --------------------

def issue(**kw) -> DispatchIssue:
    base = dict(id="X#1", title="t", source="https://example.org/1", status="open", kernel="ck2stages", effect="e",
                workaround="w", confidence="confirmed", severity="error")
    base.update(kw)
    return DispatchIssue(**base)


def _ck_step(k: DispatchKey, M: int = 16) -> DispatchStep:
    s = head_step(M, k)
    assert s.family == "ck" and s.kernels == ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)")
    return s


@pytest.mark.parametrize(("pred", "hit", "miss"), [
    ("gfx", ("gfx950",), ("gfx942",)),
    ("buckets", (16,), (32,)),
    ("tokens_min", 16, 17), ("tokens_max", 16, 15),
    ("basis", "heuristic", "tuned"), ("stages", 2, 1),
    ("q_type", Q_1X128, Q_TOKEN), ("q_dtype_w", FP8, FP8_FNUZ), ("q_dtype_a", (BF16, FP8), (BF16,)),
    ("act_type", SILU, GELU),
    ("shape", (("expert", 256), ("inter_dim", 384)), (("expert", 256), ("inter_dim", 512))),
    ("inter_dim_multiple_of", 128, 256), ("inter_dim_not_multiple_of", 256, 128),
    ("intermediate_pad_min", 0, 1), ("block_m", 16, 32), ("ep", False, True),
    ("ksplit_min", 0, 1), ("stage", 1, None), ("row_flat", False, True),
])
def test_issue_predicates(pred, hit, miss):
    """An issue hits a step only when every predicate given matches (capability_db/dispatch_issues.toml header):
    each predicate on a CK 2-stage heuristic step at M=16 (bucket 16, block_m 16, inter_dim 384, expert 256)."""
    k = key(inter_dim=384)
    s = _ck_step(k)
    assert _issue_matches(issue(**{pred: hit}), s, k, "0.1.20") == "moe_ck2stages_gemm1 (default)"
    if pred == "stage":
        assert _issue_matches(issue(stage=2), s, k, "0.1.20") == "moe_ck2stages_gemm2 (default)"
        assert _issue_matches(issue(stage=2, kernel="gemm1"), s, k, "0.1.20") is None
        return
    assert _issue_matches(issue(**{pred: miss}), s, k, "0.1.20") is None


def test_issue_version_range_and_kernel_regex():
    """``aiter`` is a PEP 440 specifier on the release the planned AITER version carries (rules.release_of: a
    release candidate of 0.1.17 is 0.1.17); no version or an unparsable one matches no ranged issue; ``kernel`` is
    searched (re.search) in each kernel name."""
    k = key(inter_dim=384)
    s = _ck_step(k)
    rng = issue(aiter=">=0.1.17,<0.1.20")
    assert _issue_matches(rng, s, k, "0.1.19.post2+rocm7.1") == "moe_ck2stages_gemm1 (default)"
    assert _issue_matches(rng, s, k, "0.1.17rc1") == "moe_ck2stages_gemm1 (default)"
    assert _issue_matches(rng, s, k, "0.1.16.post6") is None and _issue_matches(rng, s, k, "0.1.20") is None
    assert _issue_matches(rng, s, k, "0.1.20rc1") is None   # 0.1.20's code, outside <0.1.20
    assert _issue_matches(rng, s, k, None) is None and _issue_matches(rng, s, k, "garbage") is None
    assert _issue_matches(issue(), s, k, None) == "moe_ck2stages_gemm1 (default)"
    assert _issue_matches(issue(kernel="gemm2"), s, k, None) == "moe_ck2stages_gemm2 (default)"
    assert _issue_matches(issue(kernel="^gemm2"), s, k, None) is None


def test_issue_pads_ep_and_k_tiles_per_split():
    """``intermediate_pad_min`` compares the kernel's intermediate pad, ``ep`` expert parallelism;
    ``k_tiles_per_split_max`` bounds model_dim // (ksplit * K per block[block_m]) and needs split-K (ksplit >= 2)
    with a K per block for the step's block_m (ROCm/aiter PR #3997: one k-tile per split)."""
    k = key(inter_dim=384, intermediate_pad=128, is_ep=True, model_dim=4096)
    s = _ck_step(k)
    assert _issue_matches(issue(intermediate_pad_min=128, ep=True), s, k, None)
    assert _issue_matches(issue(intermediate_pad_min=129), s, k, None) is None
    import dataclasses

    split = dataclasses.replace(s, ksplit=16)
    kt = issue(k_tiles_per_split_max=1, k_per_block=((16, 256),))
    assert _issue_matches(kt, split, k, None) == "moe_ck2stages_gemm1 (default)"       # 4096 // (16*256) = 1
    assert _issue_matches(kt, dataclasses.replace(s, ksplit=8), k, None) is None        # 2 k-tiles per split
    assert _issue_matches(kt, dataclasses.replace(s, ksplit=1), k, None) is None
    assert _issue_matches(kt, dataclasses.replace(split, block_m=32), k, None) is None  # no K for block_m 32
    assert _issue_matches(issue(ksplit_min=16), split, k, None)
    assert _issue_matches(issue(ksplit_min=17), split, k, None) is None
    flat = row(k, 16, FP8, flat=1, run_1stage=1, kernel1="_ZN5aiter_flat_x")
    t = dataclasses.replace(s, row=flat)
    assert _issue_matches(issue(row_flat=True), t, k, None) and _issue_matches(issue(row_flat=False), t, k, None) is None
    assert _issue_matches(issue(row_flat=True), dataclasses.replace(t, row=flat._replace(flat=0)), k, None) is None


def test_evaluate_issues_one_hit_per_run_of_steps():
    """One hit per (issue, kernel) over consecutive token counts, with the issue's effect, workaround, env, cap,
    source, confidence, severity, fix and raises carried over."""
    k = key(inter_dim=384)
    steps = [head_step(m, k) for m in (1, 2, 4, 16, 64)]
    assert [s.stages for s in steps] == [2, 2, 2, 2, 1]
    iss = issue(workaround_env=(("AITER_KSPLIT", "-1"),), token_cap=4096, fixed_by="https://x/pr/1", raises=True,
                confidence="derived", severity="warning")
    hits = evaluate_issues(steps, k, "0.1.20", [iss])
    assert len(hits) == 1
    h = hits[0]
    assert (h.issue, h.tokens, h.bucket, h.kernel) == ("X#1", (1, 16), 1, "moe_ck2stages_gemm1 (default)")
    assert (h.effect, h.workaround, h.workaround_env, h.token_cap, h.source, h.confidence, h.severity, h.fixed_by,
            h.raises) == ("e", "w", (("AITER_KSPLIT", "-1"),), 4096, "https://example.org/1", "derived", "warning",
                          "https://x/pr/1", True)
    two = evaluate_issues(steps, k, None, [issue(kernel="gemm1|fmoe"), issue(id="Y#2", kernel="fmoe")])
    assert [(h.issue, h.tokens, h.kernel) for h in two] == [
        ("X#1", (1, 16), "moe_ck2stages_gemm1 (default)"), ("X#1", (64, 64), "fmoe_fp8_blockscale_g1u1 (default)"),
        ("Y#2", (64, 64), "fmoe_fp8_blockscale_g1u1 (default)")]
    assert evaluate_issues(steps, k, None, []) == ()
    assert all(isinstance(h, IssueHit) for h in evaluate_issues(steps, k, "0.1.20"))


@pytest.mark.parametrize(("raises", "workaround"), [
    ("NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 is not supported: expert-parallel masking.",
     "AITER_SITUV2_A8W4=1 runs SiTUv2 with fp8 activations (AITER's a8w4 rows), which none of these refusals apply "
     "to — a different numerics than the checkpoint's bf16 activations"),
    ("ValueError: requires sort block_m=32, got tuned block_m=64 (AITER_BYPASS_TUNE_CONFIG with the Opus row x:2)",
     "unset AITER_BYPASS_TUNE_CONFIG (the tuned Opus row runs)"),
    ("NotImplementedError: MXFP4 a4w4 FlyDSL port does not support expert-parallel yet (…).",
     "no expert parallelism for this layer (TP only), or a tuned set without flydsl_mxmoe rows"),
    ("the ASM stage-1 and CK stage-2 launchers are handed FlyDSL kernel names (a, b) because flydsl is not "
     "importable: no such kernel to launch", "install the flydsl AITER pins (the row's FlyDSL kernels then run)"),
    ("SomethingElse: boom", "none known for this configuration"),
])
def test_raising_hits(raises, workaround):
    """Each step where AITER raises (FM lines 854-880, 937, 2456; the launchers) is one blocking hit per run of
    token counts, with the workaround that makes the call run."""
    import dataclasses

    base = head_step(16, key(inter_dim=384))
    steps = [dataclasses.replace(base, tokens=(m, m), bucket=m, raises=raises) for m in (1, 2)]
    steps.append(dataclasses.replace(base, tokens=(4, 4), kernels=(), raises=raises))
    (h,) = raising_hits(steps, key(), {})
    # a step that runs between two that raise splits the range (ranges merge consecutive steps only)
    gap = steps[:1] + [dataclasses.replace(base, tokens=(2, 2), bucket=2, raises=None)] + steps[2:]
    assert [x.tokens for x in raising_hits(gap, key(), {})] == [(1, 1), (4, 4)]
    assert (h.issue, h.tokens, h.bucket, h.kernel, h.effect, h.workaround, h.workaround_env, h.token_cap, h.source,
            h.confidence, h.severity, h.raises) == (
        "aiter-raises", (1, 4), 1, "moe_ck2stages_gemm1 (default) + moe_ck2stages_gemm2 (default)",
        "AITER refuses this call: " + raises, workaround, (), None, FM, "confirmed", "error", True)
    assert h.blocking
    other = dataclasses.replace(base, tokens=(8, 8), kernels=(), raises="Other: x")
    hits = raising_hits(steps + [other], key(), {})
    assert [x.tokens for x in hits] == [(1, 4), (8, 8)] and hits[1].kernel == "no kernel"
    assert raising_hits([base], key(), {}) == ()


def _pad_steps(families):
    import dataclasses

    base = head_step(16, key(inter_dim=384))
    return [dataclasses.replace(base, tokens=(m, m), bucket=m, family=f) for m, f in zip((1, 2, 4, 8), families)]


def test_pad_hazards_by_family():
    """ASM/CK take no pad arguments and compute over the padded extent (https://github.com/ROCm/aiter/issues/5413);
    FlyDSL drops its pads when a bias is passed (FM _get_padding_for_flydsl) and skips only the pads it is passed;
    CK-Tile skips whole granules (FM cktile_moe_stage1 k_pad_zeros = hidden_pad // 128 * 128). Consecutive steps of
    one kind are one hit; a zero-filled or unpadded allocation has none."""
    from moedispatch.core.backend import Padding

    k = key(inter_dim=512)
    pad = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=128)
    hits = pad_hazards(_pad_steps(["ck", "asm+ck", "asm", "flydsl"]), k, pad)
    assert [(h.issue, h.tokens, h.source) for h in hits] == [
        ("pad-not-zeroed", (1, 4), "https://github.com/ROCm/aiter/issues/5413")]
    h = hits[0]
    assert h.effect == ("ASM/CK kernels take no pad arguments and compute over the padded extent, so the pad regions "
                        "must be zero; the plan does not zero-fill them")
    assert (h.bucket, h.kernel, h.workaround, h.workaround_env, h.token_cap, h.confidence, h.severity) == (
        1, "moe_ck2stages_gemm1 (default) + moe_ck2stages_gemm2 (default)",
        "allocate the padded weights (and scales) with zeros", (), None, "derived", "error")
    biased = pad_hazards(_pad_steps(["flydsl"]), k, pad, has_bias=True)
    assert biased[0].source == f"{FM} (_get_padding_for_flydsl)" and biased[0].effect.startswith(
        "FlyDSL drops the pad arguments when a bias is passed")
    short = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=0)
    fly = pad_hazards(_pad_steps(["flydsl"]), k, short)
    assert fly[0].source == f"{FM} (_flydsl_stage1_wrapper)" and fly[0].effect.startswith("FlyDSL skips only the pads")
    assert pad_hazards(_pad_steps(["flydsl"]), k, short, has_bias=True)[0].source.endswith("(_flydsl_stage1_wrapper)")
    assert pad_hazards(_pad_steps(["cktile"]), k, pad) == ()
    assert pad_hazards(_pad_steps(["cktile"]), k, short)[0].source == (
        f"{FM} (cktile_moe_stage1/2 n_pad_zeros, k_pad_zeros)")
    odd = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=96, kernel_intermediate_pad=96)
    assert pad_hazards(_pad_steps(["cktile"]), k, odd)
    hid = Padding(hidden=7232, intermediate_per_rank=512, hidden_pad=64, kernel_hidden_pad=64)
    assert pad_hazards(_pad_steps(["cktile"]), k, hid) and pad_hazards(_pad_steps(["flydsl"]), k, hid) == ()
    hid0 = Padding(hidden=7232, intermediate_per_rank=512, hidden_pad=64)
    assert pad_hazards(_pad_steps(["flydsl"]), k, hid0) and pad_hazards(_pad_steps(["opus", "none"]), k, hid0) == ()
    assert pad_hazards(_pad_steps(["ck"]), k, None) == ()
    assert pad_hazards(_pad_steps(["ck"]), k, Padding(hidden=7168, intermediate_per_rank=512)) == ()
    zeroed = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, zero_fill=True)
    assert pad_hazards(_pad_steps(["ck"]), k, zeroed) == ()
    mixed = pad_hazards(_pad_steps(["ck", "flydsl", "cktile"]), k, short)
    assert [x.tokens for x in mixed] == [(1, 1), (2, 2), (4, 4)]


# -- plans: tokens, grouping, warnings ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "4"])
def test_token_counts_must_be_positive_integers(bad):
    """fused_moe takes M = topk_ids.shape[0] tokens: a plan's token counts are positive integers."""
    with pytest.raises(UsageError, match="positive integers"):
        dispatch_token(bad, key(), None)
    with pytest.raises(UsageError, match="positive integers"):
        ad._tokens([4, bad])


def test_tokens_sorted_unique_and_not_empty():
    assert ad._tokens([512, 1, 4, 4]) == (1, 4, 512)
    with pytest.raises(UsageError, match="no token counts"):
        ad._tokens([])


def test_dispatch_token_reads_the_sets_release():
    """Without a model, the rules are the tuned set's release (0.1.7: FM017 buckets, bucket 16 at M = 1)."""
    old = ac.ConfigSet(label="x", origin="installed", dispatch="legacy", version="0.1.7", files=(), rows=())
    assert dispatch_token(1, key(), old).bucket == 16
    assert dispatch_token(1, key(), cs()).bucket == 1
    assert dispatch_token(1, key(), None).bucket == 1
    assert dispatch_token(1, key(), old, model="head").bucket == 1


def test_grouping_merges_alike_consecutive_counts():
    """Consecutive token counts with the same decision are one step: the range, every bucket once, every note
    once; a different decision (here the per-count get_ksplit, FM line 1252) starts a new step."""
    k = key(expert=32, topk=7, inter_dim=1536, model_dim=3072)
    steps = [head_step(m, k) for m in (1, 2, 3, 4, 64, 100, 128)]
    g = _group(steps)
    assert [(s.tokens, s.buckets, s.ksplit) for s in g] == [
        ((1, 1), (1,), 4), ((2, 2), (2,), 2), ((3, 4), (4,), fm_get_ksplit(4, 7, 32, 1536, 3072, 256)),
        ((64, 128), (64, 128), 0)]
    assert len(set(g[-1].notes)) == len(g[-1].notes)
    assert _group([]) == ()


def test_plan_reads_the_process_env_and_stringifies_a_given_one(head, monkeypatch):
    """No env: the AITER variables of this process (aiter_env); a given env's values are strings as os.environ's."""
    lay = layer(hidden=3072, intermediate=1536, experts=256, top_k=8, tp=8, ep=8)
    caps = target_capabilities("MI350X", "0.1.20.post1")
    monkeypatch.setenv("AITER_KSPLIT", "3")
    assert plan_dispatch(lay, caps, configs=head, tokens=(1,)).steps[0].ksplit == 3
    assert plan_dispatch(lay, caps, configs=head, env={}, tokens=(1,)).steps[0].ksplit == 4
    p = plan_dispatch(lay, caps, configs=head, env={"AITER_KSPLIT": 5}, tokens=(1,))
    assert p.steps[0].ksplit == 5 and p.env == (("AITER_KSPLIT", "5"),)


def test_plan_fields_and_version_rules(head):
    """The plan records the tokens, env, assumptions, tuned set and the rules (the release the target runs: its
    version, else the set's); releases other than HEAD whose heuristics are modelled on HEAD say so (derived)."""
    lay = layer(hidden=4096, intermediate=1024, experts=64, top_k=4, tp=1, index=3)
    caps = target_capabilities("MI355X", "0.1.15")
    r15 = lookup_rules("0.1.15")
    p = plan_dispatch(lay, caps, configs=head, env={"AITER_KSPLIT": "0"}, tokens=(4, 1, 4))
    assert (p.layer_index, p.tokens, p.env, p.aiter_version, p.dispatch_model) == (
        3, (1, 4), (("AITER_KSPLIT", "0"),), "0.1.15", r15.name)
    assert (p.configs, p.config_origin, p.config_release, p.rules_source) == (
        head.label, head.origin, head.release, r15.source)
    assert r15.source.startswith("https://github.com/ROCm/aiter/blob/v0.1.15")
    assert p.assumptions == Assumptions().describe(lay) and p.key == dispatch_key(lay, caps, model="0.1.15")
    note = (f"AITER 0.1.15: key, buckets and activation policy follow {r15.name} ({r15.source}); the heuristic "
            "fallbacks are modelled on HEAD e4048607 (derived)")
    i = p.warnings.index(note)
    assert p.warning_confidence[i] == "derived" and len(p.warning_confidence) == len(p.warnings)
    assert all(c == "confirmed" for j, c in enumerate(p.warning_confidence) if j != i)
    h = plan_dispatch(lay, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,))
    assert not any("modelled on HEAD" in w for w in h.warnings) and h.dispatch_model == "HEAD e4048607 (v0.1.20+)"
    legacy_plan = plan_dispatch(lay, target_capabilities("MI355X", "0.1.7"), configs=head, env={}, tokens=(1,))
    assert legacy_plan.dispatch_model == LEGACY_RULES.name and not any("modelled on HEAD" in w for w in legacy_plan.warnings)
    inst = ac.ConfigSet(label="inst", origin="installed", dispatch="legacy", version="0.1.7", files=(), rows=(),
                        notes=("n1",), warnings=("w1",), merge_error="ValueError: dup")
    q = plan_dispatch(lay, caps, configs=inst, env={}, tokens=(1,))
    assert q.aiter_version == "0.1.7" and q.dispatch_model == LEGACY_RULES.name and q.steps[0].bucket == 16
    assert q.warnings[:3] == ("n1", "w1", "ValueError: dup")
    assert plan_dispatch(lay, caps, configs=cs(), env={}, tokens=(1,)).warnings == (note,)


@pytest.mark.parametrize(("target", "weight", "warned"), [
    ("MI300X", "mxfp4", True), ("MI300X", "mxfp8", True), ("MI355X", "mxfp4", False),
])
def test_mx_on_gfx942_is_a_derived_failure_warning(target, weight, warned):
    """fp4x2/MX kernels use gfx950 scaled MFMA; the gfx942 ASM table has no MXfp4 code object
    (sgl-project/sglang#35525): per_1x32 fp4x2/fp8 weights off gfx950 are warned about, as derived."""
    lay = layer(weight=weight, act=weight)
    p = plan_dispatch(lay, target_capabilities(target, "0.1.20"), env={}, tokens=(1,))
    mx = [i for i, w in enumerate(p.warnings) if w.startswith("AITER's MX (per_1x32) fused-MoE kernels need gfx950; "
                                                               f"on {p.key.gfx} this dispatch fails at run time")]
    assert bool(mx) is warned
    if warned:
        assert p.warning_confidence[mx[0]] == "derived" and "sglang/pull/35525" in p.warnings[mx[0]]


def test_a8w4_bypass_quant_warning(head):
    """fused_moe_2stages: AITER_MOE_A8W4_BYPASS_QUANT=1 is a debug bypass (a1 = hidden_states.to(fp8), unit scales)
    for the fp8-activation per_1x32 steps only."""
    dsv4 = layer(hidden=7168, intermediate=4096, experts=384, top_k=6, weight="mxfp4", act="mxfp4")
    a = Assumptions(gate_mode="interleave")
    caps = target_capabilities(*MI355X)
    msg = ("AITER_MOE_A8W4_BYPASS_QUANT=1 is a debug switch: the fp8-activation (a8w4/mxfp8) steps cast activations "
           f"to fp8 with unit scales instead of quantizing them — wrong output for real weights ({FM})")
    on = {"AITER_MOE_A8W4_BYPASS_QUANT": "1"}
    assert msg in plan_dispatch(dsv4, caps, configs=head, env=on, assumptions=a, tokens=(1, 512)).warnings
    assert msg not in plan_dispatch(dsv4, caps, configs=head, env=on, assumptions=a, tokens=(1,)).warnings  # bf16
    assert msg not in plan_dispatch(dsv4, caps, configs=head, env={"AITER_MOE_A8W4_BYPASS_QUANT": "0"},
                                    assumptions=a, tokens=(512,)).warnings
    assert msg not in plan_dispatch(layer(), caps, configs=head, env=on, tokens=(512,)).warnings  # not per_1x32


def test_plan_issue_order_raises_then_known_then_pads(head):
    """A plan's hits: AITER refusals first, then capability_db issues, then pad hazards."""
    from moedispatch.core.backend import Padding

    k3 = moe("Kimi-K3-MXFP4", ep=8)
    p = plan_dispatch(k3, target_capabilities(*MI355X), configs=head, env={}, tokens=(1,))
    assert p.issues[0].issue == "aiter-raises"
    ds = layer(hidden=7168, intermediate=3072, experts=256, top_k=8)
    pad = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128)
    q = plan_dispatch(ds, target_capabilities(*MI355X), configs=head, env={}, padding=pad, tokens=(1, 64))
    ids = [h.issue for h in q.issues]
    assert ids[-1] == "pad-not-zeroed" and q.key.inter_dim == 512
