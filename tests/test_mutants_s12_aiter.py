"""Survivors of the sampled mutation run in the AITER dispatch model (aiter/env.py, aiter/lint.py, aiter/walk.py):
each test pins, on a real layer shape / tuned row / release, the rule the mutated line decides — the bad value an
integer variable's error names, the tuned set ``aiter-configs`` lints under AITER_CONFIG_FMOE, the CK 2-stage vs ASM
split of get_2stage_cfgs, the a16wi4 step's stage count, the Opus-row discard, the release's FlyDSL-heuristic scope
and the pre-v0.1.12 1-stage inter_dim rule.

FM = ROCm/aiter@e4048607 ``aiter/fused_moe.py`` (HEAD), release rules per :mod:`moedispatch.aiter.rules`."""

from __future__ import annotations

import argparse
import json

import pytest

from moedispatch.aiter import lint as aiter_lint
from moedispatch.aiter.dispatch import simulate
from moedispatch.aiter.key import Assumptions, DispatchKey
from moedispatch.aiter.vocab import (BF16, FP4, FP8, FP8_FNUZ, I4, I8, Q_1X32, Q_1X128, Q_TOKEN, SILU,
                                     SRC_FUSED_MOE)
from moedispatch.aiter.walk import dispatch_token
from moedispatch.core.errors import UsageError
from moedispatch.core.layers import MoELayer
from moedispatch.data import aiter_configs as ac
from moedispatch.data.capdb import target_capabilities

MI355X = ("MI355X", "0.1.20.post1")  # gfx950, 256 CUs
CK = ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)")
DSV4_138 = "ROCm/aiter@e4048607:aiter/configs/model_configs/dsv4_fp8fp4_tuned_fmoe.csv:138"


@pytest.fixture(scope="module")
def head() -> ac.ConfigSet:
    return ac.load_config_set("head")


def _key(gfx: str = "gfx942", cu: int = 304, **kw) -> DispatchKey:
    """DeepSeek-V3 at TP8 on MI300X by default: 7168 x 256 per rank, 256 experts, top-8, fp8 per_1x128 (fnuz)."""
    base = dict(gfx=gfx, cu_num=cu, model_dim=7168, inter_dim=256, expert=256, topk=8, runtime_topk=8, act_type=SILU,
                dtype=BF16, q_dtype_w=FP8_FNUZ, q_type=Q_1X128, use_g1u1=1, doweight_stage1=0,
                gate_mode="separated", is_ep=False)
    base.update(kw)
    return DispatchKey(**base)


# -- env._env_int: a value int() rejects is an error that names it -----------------------------------------------

def test_a_non_integer_aiter_variable_is_refused_naming_the_value_given():
    """AITER reads AITER_BYPASS_TUNE_CONFIG with int(os.environ.get(...)): a flag set to 'true' raises ValueError
    there, so the model refuses it as bad input — and the message quotes the value the user set (not None), so they
    can see what to fix."""
    with pytest.raises(UsageError) as exc:
        dispatch_token(64, _key(), None, env={"AITER_BYPASS_TUNE_CONFIG": "true"})
    assert str(exc.value) == ("AITER_BYPASS_TUNE_CONFIG='true' is not an integer: AITER reads it with int() and raises "
                              f"ValueError ({SRC_FUSED_MOE})")


# -- lint.run_cli: AITER_CONFIG_FMOE replaces the set, whatever release is named ---------------------------------

def test_aiter_configs_lints_the_env_override_also_for_a_named_release(tmp_path):
    """aiter-configs --aiter-version v0.1.12 --aiter-env AITER_CONFIG_FMOE=<csv>: AITER_CONFIG_FMOE replaces AITER's
    whole tuned set, so the file given is what gets linted (origin env, its two rows) — not the release's bundled
    set. Rows are two lines of AITER v0.1.12's tuned_fmoe.csv (MI308X, 80 CUs, 6144 x 4096 E8 top-2)."""
    csv = tmp_path / "my_tuned_fmoe.csv"
    csv.write_text(
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
        "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw\n"
        "80,512,6144,4096,8,2,ActivationType.Silu,torch.bfloat16,torch.float8_e4m3fnuz,torch.float8_e4m3fnuz,"
        "QuantType.per_Token,1,0,64,0,373.4158,_ZN5aiter48fmoe_stage1_bf16_pertokenFp8_g1u1_64x128_2tg_pf3E,0.0%,"
        "268.4886,moe_ck2stages_gemm2_256x64x128x256_1x4_MulABScaleExpertWeight_v3_Nswizzle0_Quant2_MulRoutedWeight1"
        "_F8_F8_B16,2.3%,641.9044,0,240.88,955.62\n"
        "80,512,6144,4096,8,2,ActivationType.Silu,torch.bfloat16,torch.int8,torch.int8,QuantType.per_Tensor,1,0,64,0,"
        "386.1143,_ZN5aiter49fmoe_stage1_bf16_pertokenInt8_g1u1_64x128_2tg_pf3E,0.0%,250.0186,"
        "moe_ck2stages_gemm2_256x64x128x256_1x4_MulABScaleExpertWeight_v3_Nswizzle0_Quant1_MulRoutedWeight1_I8_I8_B16,"
        "2.1%,636.1329000000001,0,243.06,964.29\n")
    for version in ("v0.1.12", "bundled"):
        out: list[str] = []
        args = argparse.Namespace(aiter_env=[f"AITER_CONFIG_FMOE={csv}"], aiter_version=version, configs=None,
                                  format="json")
        assert aiter_lint.run_cli(args, out.append) == 0
        cfg = json.loads(out[0])["configs"]
        assert (cfg["origin"], cfg["label"]) == ("env", f"AITER_CONFIG_FMOE={csv}"), version
        assert cfg["files"] == [str(csv)], version


# -- walk._dispatch_ck_or_asm: CK 2-stage needs per_1x128 AND doweight_stage1 (or a CK weight dtype) ---------------

def test_doweight_per_token_int8_without_a_row_runs_asm_stage1_not_ck():
    """FM get_2stage_cfgs: without a tuned row, CK 2-stage (the codegen default) is taken for a ck2stages name, for
    per_1x128 *with* doweight_stage1, or for bf16/fp16/uint32/fp4x2/fp8 weights; anything else is ASM stage 1 + CK
    stage 2. Case: a Llama-4-style router-weight-on-input (doweight_stage1=1) int8 per-token layer on MI300X, M=64 —
    no 1-stage entry for doweight, int8 weights, not per_1x128: fmoe_stage1_g1u1 + CK stage 2, block_m 32."""
    s = dispatch_token(64, _key(q_dtype_w=I8, q_type=Q_TOKEN, doweight_stage1=1), None, env={})
    assert (s.stages, s.family, s.kernels, s.block_m) == (
        2, "asm+ck", ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"), 32)
    assert s.notes[-1] == "ASM stage 1 + CK stage 2"


# -- walk._dispatch_cktile_or_wint4: the a16wi4 fallback is a 2-stage run -----------------------------------------

def test_untuned_a16wi4_flydsl_fallback_is_two_stages():
    """FM: per_1x32 int4 weights with flydsl importable and no tuned row take AITER's untuned a16wi4 FlyDSL fallback,
    a stage-1 and a stage-2 kernel (flydsl_moe1_… + flydsl_moe2_…_atomic). Case: Kimi-K2.5 int4 group-32 at TP1
    (7168 x 2048, 384 experts, top-8) on MI300X, M=1: 2 stages, tile 16, bf16 activations."""
    s = dispatch_token(1, _key(q_dtype_w=I4, q_type=Q_1X32, inter_dim=2048, expert=384), None, env={})
    assert (s.stages, s.kernels, s.block_m, s.family, s.activation_dtype) == (
        2, ("flydsl_moe1_abf16_wint4_bf16_t16x128x128", "flydsl_moe2_abf16_wint4_bf16_t16x128x128_atomic"), 16,
        "flydsl", "bf16")
    assert "2stage" in s.info_line(_key(q_dtype_w=I4, q_type=Q_1X32, inter_dim=2048, expert=384))


# -- walk._dispatch_filter_row: an Opus stage-1 row needs pre-shuffled weights ----------------------------------

def test_an_opus_stage1_row_is_discarded_for_unshuffled_weights(head):
    """FM get_2stage_cfgs: a row naming an opus_* kernel in *either* stage is dropped when the weights are not
    pre-shuffled. dsv4 csv line 138 (DeepSeek-V4 a8w4, 7168 x 384, 384 experts, top-6, token 1) names an
    opus_moe1_* stage 1 with a FlyDSL stage 2. With fp8 activations at M=1 (AITER_BF16_FP8_MOE_BOUND=1) it runs when
    the weights are shuffled and is discarded, with a note, when they are not (CK 2-stage default instead)."""
    lay = MoELayer.build(hidden=7168, intermediate=384, experts=384, top_k=6, tp=1, activation="silu",
                         weight="mxfp4", act="fp8")
    env = {"AITER_BF16_FP8_MOE_BOUND": "1"}
    caps = target_capabilities(*MI355X)
    (ok,) = simulate(lay, caps, configs=head, env=env, tokens=(1,), assumptions=Assumptions(weights_shuffled=True))
    assert (ok.basis, ok.config) == ("tuned", DSV4_138) and ok.kernels[0].startswith("opus_moe1_")
    (s,) = simulate(lay, caps, configs=head, env=env, tokens=(1,), assumptions=Assumptions(weights_shuffled=False))
    assert (s.basis, s.config, s.kernels, s.q_dtype_a) == ("heuristic", None, CK, FP8)
    assert f"Opus row {DSV4_138} discarded: weights not pre-shuffled" in s.notes


# -- walk._dispatch_flydsl_heuristic: v0.1.14-v0.1.15 open the FlyDSL heuristic to Swiglu a4w4 only ------------------

@pytest.mark.parametrize("version", ["0.1.14", "0.1.15.post3"])
def test_silu_mxfp4_stays_off_the_flydsl_heuristic_before_v0_1_16(version):
    """ROCm/aiter@v0.1.15.post3 fused_moe.py lines 1320-1330: the untuned FlyDSL heuristic takes only Swiglu with
    fp4x2 activations and weights (Rules.flydsl_heuristic = swiglu_a4w4); v0.1.16 opens it to every activation
    (AITER_FLYDSL_FORCE default 1). Case: a Silu MXFP4 layer (7168 x 384, 256 experts, top-8) on MI355X, M=256, no
    tuned row: CK 2-stage default before v0.1.16, FlyDSL from v0.1.16."""
    k = _key(gfx="gfx950", cu=256, q_dtype_w=FP4, q_type=Q_1X32, inter_dim=384)
    s = dispatch_token(256, k, None, env={}, model=version)
    assert (s.q_dtype_a, s.kernels, s.family, s.ksplit) == (FP4, CK, "ck", 0)
    assert not any("FlyDSL" in n for n in s.notes)
    assert dispatch_token(256, k, None, env={}, model="0.1.16").family == "flydsl"


# -- walk._dispatch_heuristic_choice: v0.1.9-v0.1.11 run per_1x128 1-stage only for inter_dim % 256 == 0 ----------

@pytest.mark.parametrize("version", ["0.1.10.post2", "0.1.11.post1"])
def test_old_releases_run_blockscale_one_stage_at_inter_dim_multiple_of_256(version):
    """v0.1.9-v0.1.11 (Rules.one_stage_conds v08/v011): an untuned per_1x128 fp8 layer with a 1-stage entry runs
    1-stage ASM for token > 32 when inter_dim % 256 == 0 (HEAD: % 128). Case: DeepSeek-V3 at TP8 on MI300X (7168 x
    256 per rank, 256 experts, top-8), M=64: fmoe_fp8_blockscale_g1u1 1-stage, block_m 32; at inter_dim 384 (a
    multiple of 128, not of 256) it stays 2-stage there."""
    s = dispatch_token(64, _key(), None, env={}, model=version)
    assert (s.stages, s.kernels, s.block_m) == (1, ("fmoe_fp8_blockscale_g1u1 (default)",), 32)
    assert dispatch_token(64, _key(inter_dim=384), None, env={}, model=version).stages == 2



def test_a_pre_v0_1_13_release_reads_an_xbf16_row_as_a_plain_row(shared_aiter):
    """v0.1.12's get_2stage_cfgs reads no xbf16 column (Rules.xbf16): a row tuned with xbf16=1 (v0.1.13's
    qwen3next_80b_fp8_tuned_fmoe.csv, passed as AITER_CONFIG_FMOE) is used as a plain row. The substitution once
    called dataclasses.replace on the TunedRow NamedTuple, and `explain --aiter-version 0.1.12` died with a
    TypeError traceback (found by a mutation helper: walk._dispatch_lookup_row)."""
    from moedispatch.aiter.dispatch import plan_dispatch
    from moedispatch.plan.plan import plan_model
    from moedispatch.sources.models import load_model
    from moedispatch.testing import fake_capabilities

    csv = shared_aiter / "v0.1.13" / "aiter" / "configs" / "model_configs" / "qwen3next_80b_fp8_tuned_fmoe.csv"
    cs = ac.load_config_set(str(shared_aiter / "v0.1.13" / "aiter"), version="0.1.12")
    caps = fake_capabilities("MI355X", "0.1.12")
    layer = next(d.layer for d in plan_model(load_model("Qwen3-Next-80B-A3B-FP8"), caps, 1, 1).decisions
                 if d.layer.kind == "moe")
    (step,) = plan_dispatch(layer, caps, tokens=(64,), env={}, configs=cs).steps
    assert (step.basis, step.stages, step.config) == ("tuned", 1, f"{csv}:8")
    assert step.kernels == ("_ZN5aiter48fmoe_bf16_blockscaleBf16_g1u1_vs_pf2_silu_16x128E",)
