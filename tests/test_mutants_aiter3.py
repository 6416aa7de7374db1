"""Surviving mutants of the AITER dispatch model that a sampled mutation run found: the rounds/empty-CU terms of
``get_block_size_M`` (aiter/heuristics.py), the consecutive-step sentinel of ``evaluate_issues`` (aiter/issues.py)
and the stage-2 launcher names of the last get_2stage_cfgs branch (aiter/walk.py ``_dispatch_ck_or_asm``).

FM = ROCm/aiter@e4048607 ``aiter/fused_moe.py``, the HEAD the model replays (line numbers at that commit)."""

from __future__ import annotations

import pytest

from moedispatch.aiter.dispatch import Assumptions, simulate
from moedispatch.aiter.issues import DispatchIssue, evaluate_issues
from moedispatch.aiter.key import DispatchKey
from moedispatch.aiter.vocab import BF16, FP4, FP8, Q_1X32, Q_1X128, SILU
from moedispatch.aiter.walk import dispatch_token
from moedispatch.core.layers import MoELayer
from moedispatch.data import aiter_configs as ac
from moedispatch.data.capdb import target_capabilities
from moedispatch.sources import models

MI355X = ("MI355X", "0.1.20.post1")  # gfx950, 256 CUs


@pytest.fixture(scope="module")
def head() -> ac.ConfigSet:
    return ac.load_config_set("head")


# -- heuristics._block_size_M: FM get_block_size_M (lines 1227-1240) ---------------------------------------------

@pytest.mark.parametrize(("M", "block_m"), [(512, 64), (1024, 128), (2048, 128)])
def test_block_size_M_counts_full_waves_and_idle_cus_as_aiter_does(head, M, block_m):
    """Qwen3-30B-A3B at TP8 (bf16, inter_dim 96, 128 experts, top-8) on MI355X has no tuned row, so CK 2-stage takes
    get_block_size_M's block_m. tgN = ceil(96/128) = 1, so tg_num(el) = 128 + ceil(8*(M-1)/el), and AITER keeps the
    el with the least (rnd = ceil(tg_num/cu_num), empty = cu_num - tg_num % cu_num), the first on a tie:
      M=512:  tg_num 256/192/160 for el 32/64/128 -> (1, 256), (1, 64), (1, 96): 64 (256 % 256 == 0 leaves
              `empty` at 256, so a `tg / cu` for `tg % cu` picks 32);
      M=1024: 384/256/192 -> (2, 128), (1, 256), (1, 64): 128;
      M=2048: 640/384/256 -> (3, 128), (2, 128), (1, 256): 128 (one full wave; `(tg + cu + 1) // cu` counts 2
              waves for 256 and 384 alike and picks 64)."""
    lay = next(x for x in models.expand_layers(models.load_model("Qwen3-30B-A3B"), 8, 1) if x.kind == "moe")
    assert (lay.intermediate_per_rank, lay.experts_per_rank, lay.top_k) == (96, 128, 8)
    (s,) = simulate(lay, target_capabilities(*MI355X), configs=head, env={}, tokens=(M,))
    assert (s.family, s.basis, s.bucket) == ("ck", "heuristic", M)
    assert s.block_m == block_m


# -- issues.evaluate_issues: a range merges only consecutive steps of the same entry -----------------------------

def _issue(**kw) -> DispatchIssue:
    base = dict(id="ROCm/aiter#0000", title="t", source="https://example.org/1", status="open", kernel="ck2stages",
                effect="e", workaround="w", confidence="confirmed", severity="error")
    base.update(kw)
    return DispatchIssue(**base)


def test_two_entries_of_one_issue_keep_their_own_token_ranges():
    """dispatch_issues.toml may list one upstream issue as several entries (ids are not required unique), e.g. one
    per token range. Each entry's hits are its own runs of consecutive steps: an entry whose first match is step i
    never extends (or shrinks) the previous entry's hit, whatever i is (`last` starts below every i - 1)."""
    k = DispatchKey(gfx="gfx950", cu_num=256, model_dim=7168, inter_dim=384, expert=256, topk=8, runtime_topk=8,
                    act_type=SILU, dtype=BF16, q_dtype_w=FP8, q_type=Q_1X128, use_g1u1=1, doweight_stage1=0,
                    gate_mode="separated", is_ep=False)
    steps = [dispatch_token(m, k, None, env={}) for m in (1, 2, 4, 16)]  # all CK 2-stage (heuristic, default names)
    assert all(s.kernels[0] == "moe_ck2stages_gemm1 (default)" for s in steps)
    small, large = _issue(tokens_max=2), _issue(tokens_min=16)          # steps 0-1, and step 3 only
    want_small, want_large = ((1, 2), "moe_ck2stages_gemm1 (default)"), ((16, 16), "moe_ck2stages_gemm1 (default)")
    # the second entry's first match is step 3, right after step 2 (a sentinel of +2 would merge it)
    assert [(h.tokens, h.kernel) for h in evaluate_issues(steps, k, None, [small, large])] == [want_small, want_large]
    # the second entry's first match is step 0 (a sentinel of -1 would merge it into the first entry's hit)
    assert [(h.tokens, h.kernel) for h in evaluate_issues(steps, k, None, [large, small])] == [want_large, want_small]


# -- walk._dispatch_ck_or_asm: the stage-2 launcher the row's stage-2 name selects --------------------------------
# FM get_2stage_cfgs, last branch: asm_stage1 + opus_a8w4_stage2 (opus_moe2_*), cktile_moe_stage2 (cktile_*), else
# ck_moe_stage2_fwd. DeepSeek-V4's a8w4 rows (aiter/configs/model_configs/dsv4_fp8fp4_tuned_fmoe.csv) name each.

def _dsv4(**kw) -> MoELayer:
    base = dict(hidden=7168, intermediate=384, experts=384, top_k=6, tp=1, activation="silu", weight="mxfp4",
                act="fp8")
    base.update(kw)
    return MoELayer.build(**base)


@pytest.mark.parametrize(("lay", "line", "launcher", "s2"), [
    (_dsv4(), 146, "Opus", "opus"),                                # flydsl_moe1_* + opus_moe2_*
    (_dsv4(intermediate=3072, experts=48), 98, "CK-Tile", "cktile"),  # flydsl_moe1_* + cktile_a8w4_bm32
])
def test_flydsl_rows_without_flydsl_name_the_stage_2_launcher(head, lay, line, launcher, s2):
    """flydsl not importable: the row's FlyDSL stage 1 goes to asm_stage1 and its stage 2 to the launcher its name
    selects; both are handed names they have no kernel for."""
    (s,) = simulate(lay, target_capabilities(*MI355X), configs=head, env={}, tokens=(256,),
                    assumptions=Assumptions(flydsl_available=False, gate_mode="interleave"))
    k1, k2 = s.kernels
    assert k1.startswith("flydsl_moe1_") and s.family == f"asm+{s2}"
    assert s.config.endswith(f"dsv4_fp8fp4_tuned_fmoe.csv:{line}")
    assert (s.stages, s.block_m, s.ksplit) == (2, s.row.block_m, s.row.ksplit)  # the row's block_m and ksplit
    assert s.notes[-1] == f"ASM stage 1 + {launcher} stage 2"
    assert s.raises == (f"the ASM stage-1 and {launcher} stage-2 launchers are handed FlyDSL kernel names ({k1}, {k2}) "
                        "because flydsl is not importable: no such kernel to launch")


def test_an_asm_row_with_an_opus_stage_2_runs_asm_and_opus(head):
    """dsv4 csv line 165 (385 experts = 384 + the fused shared one, top-7, token 2048): cktile_a8w4_bm64 stage 1
    (no ck2stages name: the last branch) with an opus_moe2_* stage 2, which runs on opus_a8w4_stage2."""
    k = DispatchKey(gfx="gfx950", cu_num=256, model_dim=7168, inter_dim=384, expert=385, topk=7, runtime_topk=7,
                    act_type=SILU, dtype=BF16, q_dtype_w=FP4, q_type=Q_1X32, use_g1u1=1, doweight_stage1=0,
                    gate_mode="interleave", is_ep=False)
    s = dispatch_token(2048, k, head, env={}, assumptions=Assumptions(flydsl_available=False, gate_mode="interleave"))
    assert s.config.endswith("dsv4_fp8fp4_tuned_fmoe.csv:165") and s.raises is None
    assert (s.family, s.kernels[0]) == ("asm+opus", "cktile_a8w4_bm64") and s.kernels[1].startswith("opus_moe2_")
    assert (s.stages, s.block_m, s.ksplit) == (2, s.row.block_m, s.row.ksplit) == (2, 64, 0)  # line 165
    assert s.notes[-1] == "ASM stage 1 + Opus stage 2"
