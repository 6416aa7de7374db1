"""Release-keyed dispatch rules (moedispatch.aiter.dispatch.Rules) against what each AITER release's own code does.

Every case is a minimal point of the peer run that found the difference — ``python tests/peers/aiter/harness.py
--grid quick --src "/work/.mirror/ROCm+aiter/repo@<tag>"``, AITER's real ``aiter/fused_moe.py`` of that tag run on a
CPU — with the grid's case label, the token count, and what AITER's code answered (stages, launcher family, kernel
names, the block_m handed to moe_sorting, ksplit, q_dtype_a). Each test names the rule (a ``Rules`` field), the
releases it is set on and the AITER source lines it encodes ("src <tag> L<a>-L<b>": ROCm/aiter@<tag>:aiter/fused_moe.py,
https://github.com/ROCm/aiter/blob/<tag>/aiter/fused_moe.py#L<a>-L<b>). A few cases come from the ci grid (its
flydsl_available=False variants) or from the source alone where no grid point reaches the rule; each says so. The
rows are each release's own tuned set from moedispatch's index (``load_config_set("<tag>")``), as the peer harness
uses.

Vocabulary: AITER's CK 2-stage heuristic launches report no kernel name; moedispatch names them
``moe_ck2stages_gemm1 (default)`` / ``moe_ck2stages_gemm2 (default)``, and CK-Tile ``cktile_moe_stage{1,2} (default)``.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from moedispatch.aiter.activation import activation_dtype
from moedispatch.aiter.key import Assumptions, DispatchKey
from moedispatch.aiter.rules import lookup_rules
from moedispatch.aiter.steps import DispatchStep
from moedispatch.aiter.vocab import BF16, FP4, FP8, FP8_FNUZ, I4, Q_1X128, Q_1X32, Q_TOKEN, SILU, SITUV2, SWIGLU
from moedispatch.aiter.walk import dispatch_token
from moedispatch.data import aiter_configs as ac

TARGETS = {"MI300X": ("gfx942", 304), "MI308X": ("gfx942", 80), "MI355X": ("gfx950", 256)}
CK = ("moe_ck2stages_gemm1 (default)", "moe_ck2stages_gemm2 (default)")
CKTILE = ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)")


@lru_cache(maxsize=None)
def rows(tag: str, model_dim: int) -> ac.ConfigSet:
    return ac.load_config_set(tag, version=tag.lstrip("v"), model_dims=frozenset({model_dim}))


def key(target: str, *, model_dim: int, inter_dim: int, expert: int, topk: int, act: str = SILU,
        q_w: str = FP4, gate_mode: str = "separated", is_ep: bool = False) -> DispatchKey:
    gfx, cu = TARGETS[target]
    q_type = Q_1X32 if q_w in (FP4, FP8, I4) else Q_TOKEN
    return DispatchKey(gfx=gfx, cu_num=cu, model_dim=model_dim, inter_dim=inter_dim, expert=expert, topk=topk,
                          runtime_topk=topk, act_type=act, dtype=BF16, q_dtype_w=q_w, q_type=q_type, use_g1u1=1,
                          doweight_stage1=0, gate_mode=gate_mode, is_ep=is_ep)


def decide(tag: str, k: DispatchKey, M: int, *, env: dict | None = None,
           assumptions: Assumptions | None = None) -> DispatchStep:
    return dispatch_token(M, k, rows(tag, k.model_dim), env=env or {}, assumptions=assumptions,
                             model=tag.lstrip("v"))


def brief(s: DispatchStep) -> tuple:
    return (s.stages, s.kernels, s.block_m, s.ksplit, s.q_dtype_a)


# -- which Rules each release gets ------------------------------------------------------------------------------

@pytest.mark.parametrize("version, name", [
    ("0.1.8", "v0.1.8"), ("0.1.10.post2", "v0.1.9–v0.1.10"), ("0.1.11.post1", "v0.1.11"), ("0.1.12.post2", "v0.1.12"),
    ("0.1.13", "v0.1.13"), ("0.1.13.post1", "v0.1.13.post1"), ("0.1.14", "v0.1.14–v0.1.15"),
    ("0.1.15.post3", "v0.1.14–v0.1.15"), ("0.1.16", "v0.1.16"),
    ("0.1.16.post1", "v0.1.16.post1–v0.1.16.post6"), ("0.1.16.post6", "v0.1.16.post1–v0.1.16.post6"),
    ("0.1.17", "v0.1.17"), ("0.1.18", "v0.1.18"), ("0.1.19", "v0.1.19"),
    ("0.1.19.post1", "v0.1.19.post1–v0.1.19.post2"), ("0.1.19.post2", "v0.1.19.post1–v0.1.19.post2"),
])
def test_release_boundaries(version, name):
    assert lookup_rules(version).name == name


# -- Rules.flydsl_heuristic ---------------------------------------------------------------------------------------

MXFP4_SILU = dict(model_dim=2880, inter_dim=128, expert=8, topk=2)  # "mxfp4 silu D2880 I128 E8 k2"


def test_flydsl_heuristic_swiglu_a4w4_only_before_v0_1_16():
    """v0.1.14–v0.1.15: the untuned FlyDSL fallback is ``swiglu_mxfp4_flydsl`` — Swiglu, fp4x2 activations and
    weights only — so an MXFP4 Silu layer goes on to CK 2-stage. Peer case "mxfp4 silu D2880 I128 E8 k2" on MI300X,
    M=1: AITER v0.1.15.post3 ran CK stage 1 + CK stage 2 (no kernel names), block_m 32, ksplit 0, q_dtype_a fp4x2.
    """
    assert lookup_rules("0.1.15.post3").flydsl_heuristic == "swiglu_a4w4"  # src v0.1.15.post3 L1320-L1330
    s = decide("v0.1.15.post3", key("MI300X", **MXFP4_SILU), 1)
    assert brief(s) == (2, CK, 32, 0, FP4)
    assert s.family == "ck"


def test_flydsl_heuristic_force_from_v0_1_16():
    """v0.1.16: AITER_FLYDSL_FORCE (default "1") opens the FlyDSL fallback to every activation with fp4x2/fp8
    activations and fp4x2 weights, split_k -1 (src v0.1.16 L1464-L1553). The same peer case at v0.1.16 ran
    flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2 + flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic_bnt2, block_m 32,
    ksplit -1."""
    assert lookup_rules("0.1.16").flydsl_heuristic == "force_w4"
    s = decide("v0.1.16", key("MI300X", **MXFP4_SILU), 1)
    assert brief(s) == (2, ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2",
                            "flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic_bnt2"), 32, -1, FP4)
    # AITER_FLYDSL_FORCE=0 closes it again for Silu.
    assert decide("v0.1.16", key("MI300X", **MXFP4_SILU), 1, env={"AITER_FLYDSL_FORCE": "0"}).kernels == CK


def test_flydsl_heuristic_keeps_get_ksplit_before_v0_1_16():
    """v0.1.14–v0.1.15 return ``int(ksplit)`` (get_ksplit's value) from the FlyDSL fallback, not -1
    (src v0.1.15.post3 L1392-L1399). Peer case "MiniMax-M3-MXFP4 TP1 EP1" on MI300X (6144x3072, E128 k4, Swiglu
    SEPARATED), M=256: AITER ran flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2 + …_t32x128x256_atomic_bnt2, ksplit 0."""
    k = key("MI300X", model_dim=6144, inter_dim=3072, expert=128, topk=4, act=SWIGLU)
    s = decide("v0.1.15.post3", k, 256)
    assert brief(s) == (2, ("flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w2",
                            "flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic_bnt2"), 32, 0, FP4)
    assert decide("v0.1.16", k, 256).ksplit == -1


def test_flydsl_heuristic_no_mxfp8_weights_at_v0_1_16():
    """v0.1.16's FlyDSL fallback takes fp4x2 weights only (``q_dtype_w == dtypes.fp4x2``, src v0.1.16 L1471), and its
    MXFP8 weights get fp4x2 activations (no mxfp8 branch): peer case "mxfp8 silu D2880 I128 E8 k2" on MI355X, M=1 ran
    CK 2-stage, block_m 32, ksplit 0, q_dtype_a fp4x2."""
    s = decide("v0.1.16", key("MI355X", **MXFP4_SILU, q_w=FP8), 1)
    assert brief(s) == (2, CK, 32, 0, FP4)


# -- Rules.flydsl_s2_tile_k_pick ----------------------------------------------------------------------------------

def test_flydsl_stage2_tile_k_fixed_256_up_to_v0_1_16():
    """Up to v0.1.16 the FlyDSL fallback's stage 2 is always ``…x128x256_atomic`` (src v0.1.16 L1484-L1512); from
    v0.1.16.post1 tile_k is 128 when inter_dim % 256 != 0 (src v0.1.16.post1 L1492). Peer case "MiniMax-M3-MXFP4
    TP8 EP1" on MI300X (6144x384, E128 k4), M=256: AITER v0.1.15.post3 and v0.1.16 ran
    flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic_bnt2."""
    k = key("MI300X", model_dim=6144, inter_dim=384, expert=128, topk=4, act=SWIGLU)
    for tag in ("v0.1.15.post3", "v0.1.16"):
        assert decide(tag, k, 256).kernels[1] == "flydsl_moe2_afp4_wfp4_bf16_t32x128x256_atomic_bnt2", tag
    assert not lookup_rules("0.1.16").flydsl_s2_tile_k_pick
    assert decide("v0.1.17", k, 256).kernels[1] == "flydsl_moe2_afp4_wfp4_bf16_t32x128x128_atomic_bnt2"


# -- Rules.mxfp8 ----------------------------------------------------------------------------------------------------

def test_mxfp8_activation_before_v0_1_16_post1():
    """Before ROCm/aiter#3811 (v0.1.16.post1) per_1x32 fp8 weights take the generic per_1x32 branch: fp4x2
    activations for Silu (src v0.1.15.post3 L321-L334). Peer case "mxfp8 silu D2880 I128 E8 k2" on MI355X, M=1:
    AITER v0.1.15.post3 ran CK 2-stage, block_m 32, ksplit 0, q_dtype_a fp4x2 (HEAD: fp8 and FlyDSL a8w8)."""
    k = key("MI355X", **MXFP4_SILU, q_w=FP8)
    assert activation_dtype(1, k, {}, "0.1.15.post3")[0] == FP4
    assert activation_dtype(1, k, {}, "0.1.17")[0] == FP8
    assert brief(decide("v0.1.15.post3", k, 1)) == (2, CK, 32, 0, FP4)


def test_mxfp8_interleaved_swiglu_goes_to_cktile_before_v0_1_16_post1():
    """Before v0.1.16.post1 the gate_mode != SEPARATED CK-Tile branch has no ``q_dtype_w != dtypes.fp8`` guard
    (src v0.1.15.post3 L1244-L1249; added at v0.1.16.post1 L1396). Peer case "mxfp8 swigluoai D2880 I128 E8 k2"
    (INTERLEAVE) on MI355X, M=1024: AITER v0.1.15.post3 ran CK-Tile stage 1 + 2, block_m 32 (fp8 activations from
    AITER_BF16_FP8_MOE_BOUND=256), ksplit 0, q_dtype_a fp8."""
    k = key("MI355X", **MXFP4_SILU, q_w=FP8, act=SWIGLU, gate_mode="interleave")
    assert brief(decide("v0.1.15.post3", k, 1024)) == (2, CKTILE, 32, 0, FP8)
    assert decide("v0.1.17", k, 1024).family == "flydsl"


# -- Rules.flydsl_fallback_rows and Rules.swiglu_unshuffled_cktile (ci grid: the flydsl_available=False variants) --

NO_FLYDSL = Assumptions(flydsl_available=False)


def test_flydsl_fallback_row_replaces_a_flydsl_row_without_flydsl_up_to_v0_1_17():
    """v0.1.11–v0.1.17: flydsl not importable and the tuned row names FlyDSL kernels → AITER takes the shape's
    ``_tag == flydsl_fallback`` row (act wildcarded from v0.1.14), else the heuristics (src v0.1.15.post3 L943-L971,
    L1062-L1080); v0.1.18 removed it. Peer case (ci grid) "Kimi-K2.5-MXFP4 TP4 EP1 [flydsl_available=False]" on MI355X
    (7168x512, E384 k8, Silu MXFP4), M=1: AITER v0.1.15.post3 ran the fallback row's
    moe_ck2stages_gemm1_64x32x32x128_…_silu_FP4X2_FP4X2_B16 + moe_ck2stages_gemm2_256x32x128x128_…_FP4X2_FP4X2_B16,
    block_m 32, ksplit 0 (with flydsl: flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w3_kb14_fp4 + the CK stage 2)."""
    k = key("MI355X", model_dim=7168, inter_dim=512, expert=384, topk=8)
    s = decide("v0.1.15.post3", k, 1, assumptions=NO_FLYDSL)
    assert s.kernels == (
        "moe_ck2stages_gemm1_64x32x32x128_1x1_MulABScaleShuffled_v3_Nswizzle0_Quant3_MulRoutedWeight0_silu_FP4X2_FP4X2_"
        "B16",
        "moe_ck2stages_gemm2_256x32x128x128_1x4_MulABScaleExpertWeightShuffled_v3_Nswizzle0_Quant3_MulRoutedWeight1_"
        "FP4X2_FP4X2_B16")
    assert (s.block_m, s.ksplit, s.q_dtype_a, s.basis) == (32, 0, FP4, "tuned")
    assert s.row is not None and s.row.tag == "flydsl_fallback"
    assert decide("v0.1.15.post3", k, 1).kernels[0] == "flydsl_moe1_afp4_wfp4_bf16_t32x128x256_w3_kb14_fp4"
    assert lookup_rules("0.1.17").flydsl_fallback_rows and not lookup_rules("0.1.18").flydsl_fallback_rows


def test_no_rocm_25478_cktile_branch_before_v0_1_17():
    """ROCM-25478 (untuned SwiGLU MXFP4 that no earlier branch took → CK-Tile, split-K ≥ 2) arrives in v0.1.17
    (src v0.1.17 L1698-L1731); before, such a layer goes on to CK 2-stage. Peer case (ci grid) "MiniMax-M3-MXFP4 TP1
    EP1 [flydsl_available=False]" on MI300X (6144x3072, E128 k4, Swiglu SEPARATED), M=256: fp4x2 activations, the
    FlyDSL heuristic is out (no flydsl) — AITER v0.1.15.post3 ran CK 2-stage (no names), block_m 128, ksplit 0."""
    k = key("MI300X", model_dim=6144, inter_dim=3072, expert=128, topk=4, act=SWIGLU)
    assert brief(decide("v0.1.15.post3", k, 256, assumptions=NO_FLYDSL)) == (2, CK, 128, 0, FP4)
    assert decide("v0.1.17", k, 256, assumptions=NO_FLYDSL).kernels == CKTILE
    assert not lookup_rules("0.1.16.post6").swiglu_unshuffled_cktile


# -- Rules.opus_bypass_raises / Rules.opus_discard (v0.1.17–v0.1.19.x Opus rows) -----------------------------------

def test_bypass_with_an_opus_row_runs_the_heuristics_before_v0_1_20():
    """AITER_BYPASS_TUNE_CONFIG=1 keeps the tuned Opus row as cfg; HEAD validates it against the heuristic block_m and
    raises ValueError (src e4048607 L2452-L2458), v0.1.17–v0.1.19.x only read its values (src v0.1.17 L1390-L1396) and
    run the heuristic. Peer case (ci grid) "tuned 7168x512 E384 k6 Silu per_1x32 float4_e2m1fn_x2 interleave
    [AITER_BYPASS_TUNE_CONFIG=1]" on MI355X, M=512: AITER v0.1.17 ran flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w2_gui +
    flydsl_moe2_afp8_wfp4_bf16_t32x128x256_atomic_bnt2, block_m 32, ksplit -1, q_dtype_a fp8."""
    k = key("MI355X", model_dim=7168, inter_dim=512, expert=384, topk=6, gate_mode="interleave")
    env = {"AITER_BYPASS_TUNE_CONFIG": "1"}
    s = decide("v0.1.17", k, 512, env=env)
    assert brief(s) == (2, ("flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w2_gui",
                            "flydsl_moe2_afp8_wfp4_bf16_t32x128x256_atomic_bnt2"), 32, -1, FP8)
    assert s.raises is None
    head = dispatch_token(512, k, rows("v0.1.17", 7168), env=env, model="head")
    assert head.raises and head.raises.startswith("ValueError: requires sort block_m=32")


def test_opus_rows_not_discarded_for_unshuffled_weights_before_v0_1_20():
    """v0.1.20 drops a tuned Opus row for unshuffled weights (src v0.1.20.post1 L2285-L2309); v0.1.17–v0.1.19.x have
    no such check (src v0.1.17 L1277-L1295 only cfg_is_supported). Derived from the source: no grid point pairs an
    Opus row with unshuffled weights."""
    assert not lookup_rules("0.1.19.post2").opus_discard and lookup_rules("0.1.20.post1").opus_discard
    k = key("MI355X", model_dim=7168, inter_dim=512, expert=384, topk=6, gate_mode="interleave")
    unshuffled = Assumptions(weights_shuffled=False)
    s17 = decide("v0.1.17", k, 512, assumptions=unshuffled)
    assert s17.basis == "tuned" and s17.kernels[1].startswith("opus_")
    s20 = dispatch_token(512, k, rows("v0.1.17", 7168), env={}, assumptions=unshuffled, model="0.1.20.post1")
    assert s20.basis == "heuristic"


# -- v0.1.19: Rules.act_exact and Rules.situv2_act_first --------------------------------------------------------

def test_v0_1_19_keys_on_the_activation_string():
    """v0.1.19 builds its key with ``str(activation)`` (src v0.1.19 L1814), as v0.1.18 does, so the exact dict
    matches the Silu row before the act-wildcard dict can return the shape's first (Gelu) row; v0.1.19.post1 went
    back to the pybind enum (src v0.1.19.post1 L2119). Peer case "DeepSeek-V3 TP4 EP1" on MI308X (7168x512, E256 k8,
    per_1x128 fp8), M=32: AITER v0.1.19 ran moe_ck2stages_gemm1_…_MulRoutedWeight0_silu_F8_F8_B16, block_m 16."""
    assert lookup_rules("0.1.19").act_exact and not lookup_rules("0.1.19.post1").act_exact
    k = key("MI308X", model_dim=7168, inter_dim=512, expert=256, topk=8, q_w=FP8_FNUZ)
    k = DispatchKey(**{**k.__dict__, "q_type": Q_1X128})
    s = decide("v0.1.19", k, 32)
    assert s.kernels == (
        "moe_ck2stages_gemm1_256x16x128x256_1x4_MulABScaleExpertWeightA8W8blkscale_v1_Nswizzle0_Quant4_"
        "MulRoutedWeight0_silu_F8_F8_B16",
        "moe_ck2stages_gemm2_256x16x128x256_1x4_MulABScaleExpertWeightA8W8blkscale_v1_Nswizzle0_Quant4_"
        "MulRoutedWeight1_F8_F8_B16")
    assert (s.block_m, s.ksplit, s.q_dtype_a, s.basis) == (16, 0, FP8_FNUZ, "tuned")


def test_v0_1_19_situv2_interleave_takes_the_interleave_bound():
    """v0.1.19 tests SiTUv2 after the Swiglu/INTERLEAVE branches (src v0.1.19 L611-L630), so an INTERLEAVE SiTUv2
    layer on gfx950 gets fp8 activations from AITER_BF16_FP8_MOE_BOUND=256; from v0.1.19.post1 SiTUv2 is decided
    first (bf16 a16w4 by default; src v0.1.19.post1 L721-L734). Peer case "tuned 3584x384 E896 k16 Situv2 per_1x32
    float4_e2m1fn_x2 interleave" on MI355X, M=256: AITER v0.1.19 ran the tuned a8w4 row
    flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w4_gui_xcd4_fp8 + flydsl_moe2_afp8_wfp4_bf16_t32x128x128_atomic_persist,
    block_m 32, ksplit 0, q_dtype_a fp8."""
    assert not lookup_rules("0.1.19").situv2_act_first and lookup_rules("0.1.19.post2").situv2_act_first
    k = key("MI355X", model_dim=3584, inter_dim=384, expert=896, topk=16, act=SITUV2, gate_mode="interleave")
    assert brief(decide("v0.1.19", k, 256)) == (2, ("flydsl_moe1_afp8_wfp4_bf16_t32x128x256_w4_gui_xcd4_fp8",
                                                    "flydsl_moe2_afp8_wfp4_bf16_t32x128x128_atomic_persist"),
                                                32, 0, FP8)
    assert activation_dtype(255, k, {}, "0.1.19")[0] == BF16
    assert activation_dtype(256, k, {}, "0.1.19.post2")[0] == BF16
    # SEPARATED: bf16, fp8 only with AITER_SITUV2_A8W4 (v0.1.19 has no A4W4 switch).
    sep = DispatchKey(**{**k.__dict__, "gate_mode": "separated"})
    assert activation_dtype(256, sep, {"AITER_SITUV2_A4W4": "1"}, "0.1.19")[0] == BF16
    assert activation_dtype(256, sep, {"AITER_SITUV2_A8W4": "1"}, "0.1.19")[0] == FP8


# -- before gate_mode / a16wi4 / v0.1.12's 1-stage rules (v0.1.8–v0.1.13.post1) ------------------------------------

FP8_BLOCK_SILU = dict(model_dim=2880, inter_dim=128, expert=8, topk=2)  # "fp8_block silu D2880 I128 E8 k2"


def test_one_stage_table_lacks_fp8_per_token_on_gfx950_before_v0_1_11():
    """v0.1.8–v0.1.10's gfx950 fused_moe_1stage_dict has no non-doweight per_Token fp8 entry (src v0.1.10.post2
    L546-L552; Rules.one_stage_missing). Peer case "fp8_token silu D2880 I128 E8 k2" on MI355X, M=32: AITER
    v0.1.10.post2 ran CK 2-stage (no names), block_m 32, ksplit 0, q_dtype_a fp8 (HEAD: 1-stage fmoe_g1u1)."""
    k = DispatchKey(**{**key("MI355X", **FP8_BLOCK_SILU, q_w=FP8).__dict__, "q_type": Q_TOKEN})
    assert brief(decide("v0.1.10.post2", k, 32)) == (2, CK, 32, 0, FP8)
    assert decide("v0.1.12", k, 32).stages == 1


def test_one_stage_blockscale_needs_inter_dim_256_before_v0_1_12():
    """Before v0.1.12 the heuristic per_1x128 1-stage needs inter_dim % 256 == 0 (src v0.1.10.post2 L718-L719;
    v0.1.12 L888-L890 relaxed it to 128; Rules.one_stage_conds). Peer case "fp8_block silu D2880 I128 E8 k2" on
    MI300X, M=64: AITER v0.1.10.post2 ran CK 2-stage (no names), block_m 64, ksplit 0 (HEAD: 1-stage
    fmoe_fp8_blockscale_g1u1)."""
    k = DispatchKey(**{**key("MI300X", **FP8_BLOCK_SILU, q_w=FP8_FNUZ).__dict__, "q_type": Q_1X128})
    assert brief(decide("v0.1.10.post2", k, 64)) == (2, CK, 64, 0, FP8_FNUZ)
    assert decide("v0.1.12", k, 64).stages == 1


def test_use_cfg_skips_small_blockscale_rows_v0_1_9_to_v0_1_12():
    """``use_cfg`` (src v0.1.12 L831-L843, v0.1.10.post2 L678-L690): a Silu bf16 per_1x128 fp8 layer with
    token * topk <= 128 ignores its tuned rows (Rules.blockscale_small_bypass). Peer case "DeepSeek-V3 TP4 EP1" on
    MI308X (7168x512, E256 k8), M=4: AITER v0.1.10.post2 ran CK 2-stage with no kernel names (the heuristic), block_m
    16, ksplit 0; at M=32 (token*topk = 256) the tuned …MulRoutedWeight0_silu_F8_F8_B16 row ran."""
    k = DispatchKey(**{**key("MI308X", model_dim=7168, inter_dim=512, expert=256, topk=8,
                                q_w=FP8_FNUZ).__dict__, "q_type": Q_1X128})
    s = decide("v0.1.10.post2", k, 4)
    assert brief(s) == (2, CK, 16, 0, FP8_FNUZ) and s.basis == "heuristic"
    assert any("use_cfg" in n for n in s.notes)
    assert decide("v0.1.10.post2", k, 32).basis == "tuned"
    assert decide("v0.1.13", k, 4).basis == "tuned"  # use_cfg is gone in v0.1.13
    assert lookup_rules("0.1.12").blockscale_small_bypass and not lookup_rules("0.1.8").blockscale_small_bypass


def test_no_a16wi4_before_v0_1_13_post1():
    """Before v0.1.13.post1 there is no a16wi4: per_1x32 int4 weights take the generic per_1x32 activation
    (fp4x2 for Silu) and the ASM stage 1 + CK stage 2 heuristic (src v0.1.12 L268-L275; a16wi4 added at
    v0.1.13.post1 L267-L269; Rules.a16wi4). Peer case "Kimi-K2.5 TP1 EP1" on MI300X (7168x2048, E384 k8, int4
    group-32), M=1: AITER v0.1.12 ran ASM stage 1 + CK stage 2 (no names), block_m 32, ksplit 2, q_dtype_a fp4x2."""
    k = key("MI300X", model_dim=7168, inter_dim=2048, expert=384, topk=8, q_w=I4)
    for tag in ("v0.1.10.post2", "v0.1.12"):
        assert brief(decide(tag, k, 1)) == (2, ("fmoe_stage1_g1u1 (default)", "moe_ck2stages_gemm2 (default)"),
                                            32, 2, FP4), tag
    assert decide("v0.1.14", k, 1).kernels[0].startswith("flydsl_moe1_abf16_wint4")
    assert activation_dtype(1, k, {}, "0.1.13.post1")[0] == BF16


def test_every_swiglu_mxfp4_layer_goes_to_cktile_before_gate_mode():
    """Before v0.1.14 (no gate_mode) every bf16 Swiglu per_1x32 layer goes to CK-Tile with get_block_m() (32 for fp8
    activations, else the token tier) and the plain ksplit (src v0.1.12 L999-L1022; v0.1.10.post2 L780-L801;
    Rules.swiglu_cktile_any_gate). Peer case "MiniMax-M3-MXFP4 TP1 EP1" (6144x3072, E128 k4, SEPARATED): AITER
    v0.1.10.post2 ran CK-Tile, block_m 16, ksplit 0, bf16 on MI300X at M=4, and block_m 32, ksplit 0, fp8 on MI355X
    at M=1024 (bound 512)."""
    mm = dict(model_dim=6144, inter_dim=3072, expert=128, topk=4, act=SWIGLU)
    assert brief(decide("v0.1.10.post2", key("MI300X", **mm), 4)) == (2, CKTILE, 16, 0, BF16)
    assert brief(decide("v0.1.10.post2", key("MI355X", **mm), 1024)) == (2, CKTILE, 32, 0, FP8)
    assert decide("v0.1.14", key("MI300X", **mm), 4).ksplit == 2  # gate_mode era: SEPARATED bf16 split-K 2


def test_v0_1_13_swiglu_bound_is_256_without_env():
    """v0.1.13 hard-codes ``bf16_fp8_bound = 256`` (src v0.1.13 L266); v0.1.13.post1 reads AITER_BF16_FP8_BOUND
    (default 512, src v0.1.13.post1 L266). Derived from the source (not in a peer run)."""
    k = key("MI355X", model_dim=6144, inter_dim=3072, expert=128, topk=4, act=SWIGLU)
    assert activation_dtype(256, k, {"AITER_BF16_FP8_BOUND": "1024"}, "0.1.13")[0] == FP8
    assert activation_dtype(256, k, {}, "0.1.13.post1")[0] == BF16
    assert activation_dtype(512, k, {}, "0.1.13.post1")[0] == FP8


def test_no_xbf16_or_ksplit_off_before_v0_1_13():
    """AITER_XBFLOAT16 and the row's xbf16 column are read from v0.1.13 (run_1stage_xbf16), and AITER_KSPLIT=-1 drops
    a tuned row's ksplit from v0.1.13 (src v0.1.14 L1066-L1069; v0.1.12 L922 always takes cfg["ksplit"]). Derived from
    the source: the quick grid sets no environment."""
    r12, r14 = lookup_rules("0.1.12"), lookup_rules("0.1.14")
    assert (r12.xbf16, r12.ksplit_env_off, r14.xbf16, r14.ksplit_env_off) == (False, False, True, True)
    k = DispatchKey(**{**key("MI355X", model_dim=7168, inter_dim=256, expert=256, topk=8, q_w=FP8).__dict__,
                          "q_type": Q_1X128})
    env = {"AITER_XBFLOAT16": "1", "AITER_BYPASS_TUNE_CONFIG": "1"}
    assert "xbf16" not in decide("v0.1.12", k, 64, env=env).kernels[0]
    assert "xbf16" in decide("v0.1.14", k, 64, env=env).kernels[0]


def test_v0_1_11_fp8_per_token_one_stage_only_at_inter_dim_192_on_gfx950():
    """v0.1.11 runs a non-doweight per_Token fp8 layer 1-stage on gfx950 only when inter_dim == 192 (src
    v0.1.11.post1 L847-L851; Rules.one_stage_conds = "v011"). Peer case "fp8_token silu D2880 I128 E8 k2" on MI355X,
    M=32: AITER v0.1.11.post1 ran CK 2-stage (no names), block_m 32, ksplit 0, q_dtype_a fp8."""
    k = DispatchKey(**{**key("MI355X", **FP8_BLOCK_SILU, q_w=FP8).__dict__, "q_type": Q_TOKEN})
    assert brief(decide("v0.1.11.post1", k, 32)) == (2, CK, 32, 0, FP8)
    k192 = DispatchKey(**{**k.__dict__, "inter_dim": 192})
    assert dispatch_token(32, k192, None, env={}, model="0.1.11.post1").stages == 1


def test_v0_1_13_post1_tests_a16wi4_before_the_swiglu_cktile_branch():
    """v0.1.13.post1 (a16wi4, no gate_mode yet) tests the a16wi4 FlyDSL heuristic before the every-Swiglu CK-Tile
    branch (src v0.1.13.post1 L1026-L1063 before L1064; Rules.wint4_before_swiglu_cktile). Peer case "int4_g32
    swigluoai D2880 I128 E8 k2" on MI300X, M=1: AITER v0.1.13.post1 ran flydsl_moe1_abf16_wint4_bf16_t16x128x128 +
    flydsl_moe2_abf16_wint4_bf16_t16x128x128_atomic, block_m 16, ksplit 0, bf16 (v0.1.12: no a16wi4, CK-Tile)."""
    k = key("MI300X", **MXFP4_SILU, q_w=I4, act=SWIGLU, gate_mode="interleave")
    assert brief(decide("v0.1.13.post1", k, 1)) == (2, ("flydsl_moe1_abf16_wint4_bf16_t16x128x128",
                                                        "flydsl_moe2_abf16_wint4_bf16_t16x128x128_atomic"),
                                                    16, 0, BF16)
    assert decide("v0.1.12", k, 1).kernels == CKTILE
