"""Survivors of the seed-14 mutation run in aiter/hazards.py, aiter/lint.py, aiter/rules.py, aiter/walk.py,
core/backend.py, core/workload.py and selector/runtime.py: each test pins, on a real model, target and AITER release
(or AITER's own tuned rows), the rule the mutated line decides — the effect a FlyDSL tile hazard states, which copied
timings the impossible-timing checks skip (any positive us, sub-microsecond ones included), the AITER release whose
default set an AITER_CONFIG_FMOE override is compared with (and the 20 rows it cites), the release rules of an AITER
dev/pre-release build, AITER_KSPLIT in the untuned a16wi4 FlyDSL fallback, the flydsl_fallback row looked up at the
requested token bucket, Padding.aligned's documented default intermediate multiple, the name a token-count error
gives its input, and the confidence of a dispatch warning that carries none.

FM = ROCm/aiter@e4048607 ``aiter/fused_moe.py`` (HEAD), release rules per :mod:`moedispatch.aiter.rules`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import moedispatch
from moedispatch.aiter import lint as aiter_lint
from moedispatch.aiter.dispatch import Assumptions, plan_dispatch
from moedispatch.aiter.flydsl import FLYDSL_TILE_SOURCE
from moedispatch.aiter.rules import lookup_rules
from moedispatch.core.backend import Padding
from moedispatch.core.errors import UsageError
from moedispatch.core.reason import Reason
from moedispatch.core.workload import MAX_TOKEN_COUNTS, MAX_TOKENS
from moedispatch.data import aiter_configs as ac
from moedispatch.selector.runtime import dispatch_reasons
from moedispatch.testing import fake_capabilities

from test_aiter_dispatch import moe
from test_aiter_lint_mutants import _checks, _fp8_950, _run, _set

A20 = "0.1.20.post1"


@pytest.fixture(scope="module")
def head():
    return ac.load_config_set("head")


# -- hazards.tile_hazards: the effect of a FlyDSL tile that does not fit -------------------------------------------

def test_a_flydsl_tile_hazard_states_aiters_out_of_bounds_effect():
    """AITER's own comment on a FlyDSL tile that does not divide the shape: the kernel reads out of bounds ("wrong
    output or memfault"). GLM-5.1-MXFP4 at TP32 on MI355X / AITER 0.1.20.post1 (64/rank, stage-2 tile_k 128): the
    blocking flydsl-tile hit's effect is exactly that sentence after the misfit, in the wording every other effect
    uses (the selector and recipes quote it after "AITER's dispatcher runs … :")."""
    dp = plan_dispatch(moe("GLM-5.1-MXFP4", tp=32), fake_capabilities("MI355X", A20), tokens=(1, 8192), env={})
    (hit,) = [h for h in dp.issues if h.issue == "flydsl-tile"]
    assert (hit.source, hit.severity, hit.blocking) == (FLYDSL_TILE_SOURCE, "error", True)
    assert hit.effect == ("FlyDSL kernel tile does not fit the allocation (stage-2 tile_k 128 does not divide "
                          "inter_dim 64): the kernel reads out of bounds — wrong output or a memory fault")


# -- aiter/lint._copies: a copied sub-microsecond timing is a copy too ---------------------------------------------

def test_a_copied_sub_microsecond_timing_is_not_judged_again_at_the_bucket_it_was_pasted_into(head):
    """copied-timing (lint.py docstring): a us repeated from a smaller bucket of the same shape is reported once, as
    copied, and not again as faster than HBM at the larger bucket — whatever its size, a sub-microsecond us (0.5) as
    well as any other positive one. AITER's tuned row a8w8_blockscale_tuned_fmoe_ds_v3.csv:331 (4096x384 E128 top-8,
    gfx950 cu_num 256) with us=0.5 at token 1 and pasted at token 16384: the token-1 row is faster than HBM (it is
    judged), the token-16384 copy is not."""
    r = _fp8_950(head)._replace(us=0.5)
    big = r._replace(token=16384, line=r.line + 1)
    assert aiter_lint.physical_floor_us(r, 8.0) > 0.5 and aiter_lint.physical_floor_us(big, 8.0) > 0.5
    assert aiter_lint.compute_floor_us(r, "MI355X") < 0.5 < aiter_lint.compute_floor_us(big, "MI355X")
    report = aiter_lint.lint(_set(head, [r, big]))
    (copied,) = _checks(report, "copied-timing")
    assert copied.rows == (r.where, big.where)
    assert [f.rows for f in _checks(report, "faster-than-hbm")] == [(r.where,)]
    assert not _checks(report, "faster-than-compute")  # 0.5 us is above the token-16384 copy's compute floor
    assert dict(report.counts)["rows_faster_than_hbm"] == 1


# -- aiter/lint._shadowed: an override is compared with the default set of the AITER it is planned for -------------

def test_an_override_is_compared_with_the_default_set_of_the_planned_aiter_release(shared_aiter, monkeypatch):
    """AITER_CONFIG_FMOE replaces the default set of the AITER that reads it (sglang PR 37072): ``moedispatch
    aiter-configs --aiter-version 0.1.12 --aiter-env AITER_CONFIG_FMOE=<v0.1.12's own tuned_fmoe.csv>`` compares the
    override with v0.1.12's default set (1888 rows: tuned_fmoe.csv and model_configs/), not with HEAD's: its 1735
    rows override theirs, the 153 model_configs rows are lost. The finding cites the first 20 overridden rows."""
    monkeypatch.setattr(ac, "installed_aiter", lambda: (None, None))  # no installed AITER decides the base set
    csv = shared_aiter / "v0.1.12" / "aiter" / "configs" / "tuned_fmoe.csv"
    data = json.loads(_run(aiter_version="0.1.12", aiter_env=[f"AITER_CONFIG_FMOE={csv}"]))
    assert (data["configs"]["origin"], data["configs"]["version"], data["configs"]["rows"]) == ("env", "0.1.12", 1735)
    (f,) = [f for f in data["findings"] if "replaces the default set" in f["message"]]
    assert f["message"] == ("AITER_CONFIG_FMOE replaces the default set (bundled index: AITER v0.1.12 (2026-04-10), "
                            "ROCm/aiter@05f2869299): 153 of its 1888 rows are no longer looked up, 1735 are "
                            "overridden by rows of the override")
    assert f["rows"] == [f"ROCm/aiter@v0.1.12:aiter/configs/tuned_fmoe.csv:{n}" for n in range(2, 22)]
    assert (f["severity"], f["source"]) == ("warning", "https://github.com/sgl-project/sglang/pull/37072")


# -- aiter/rules.lookup_rules: a dev or pre-release build takes the rules of the release range it falls in ---------

@pytest.mark.parametrize("version, rules", [
    ("0.1.7.post2.dev18", "v0.1.7"),  # the amd-aiter dev wheel of this repository's venv
    ("0.1.10.dev36+g1a2b3c4", "v0.1.9–v0.1.10"),
    ("0.1.16.post2.dev5", "v0.1.16.post1–v0.1.16.post6"),
    ("0.1.20.dev3", "v0.1.19.post1–v0.1.19.post2"),   # built after a v0.1.19.x tag: not v0.1.20's code
    ("0.1.19rc2", "v0.1.19"),           # a release candidate carries its release's code
    ("0.1.19rc2+gfx950", "v0.1.19"),
    ("0.1.17rc1.dev3", "v0.1.17"),      # a build after a release candidate: still that release's
    ("0.1.13.post1.dev4", "v0.1.13"),   # 4 commits after v0.1.13 (setuptools_scm bumps the tag's last number)
    ("0.1.18", "v0.1.18"),
])
def test_an_aiter_dev_or_prerelease_build_takes_the_rules_of_its_release_range(version, rules):
    """AITER wheels built from source carry dev/pre-release versions (``0.1.7.post2.dev18``, ``0.1.10.dev36+g…``).
    AITER versions builds with setuptools_scm's default guess-next-dev (ROCm/aiter pyproject.toml
    ``[tool.setuptools_scm]``): N commits after tag T a build is T with its last number bumped plus ``.devN``, so a
    dev build holds T's code, not the release it names — PEP 440 order places it (0.1.20.dev3 < 0.1.20: v0.1.19.x's
    rules). A release candidate (tag ``v0.1.17-rc0``, an ancestor of v0.1.17) carries its release's code: 0.1.19rc2
    takes v0.1.19's rules. The comparison is moedispatch's own (core.aiter_release): packaging's
    ``SpecifierSet.contains`` answered pre-releases differently across its releases 21–26 (pyproject: packaging>=21)."""
    assert lookup_rules(version).name == rules


def test_release_ranges_do_not_depend_on_the_installed_packaging(monkeypatch):
    """The ranges are decided without packaging's specifier logic (it changed between releases): lookup_rules must
    not import packaging.specifiers at all."""
    import sys

    monkeypatch.setitem(sys.modules, "packaging.specifiers", None)   # importing it now raises ImportError
    assert lookup_rules("0.1.19rc2").name == "v0.1.19"
    assert lookup_rules("0.1.16.post2.dev5").name == "v0.1.16.post1–v0.1.16.post6"


# -- walk._dispatch_cktile_or_wint4: the untuned a16wi4 fallback reads AITER_KSPLIT -------------------------------

def test_the_untuned_a16wi4_fallback_reads_aiter_ksplit_from_the_environment():
    """v0.1.13.post1–v0.1.19.post2 (Rules.wint4_ksplit): the untuned a16wi4 FlyDSL heuristic splits K with get_ksplit
    and names stage 1 ``…_kb{ksplit}`` (ROCm/aiter@v0.1.18:aiter/fused_moe.py lines 2118-2158); get_ksplit returns
    AITER_KSPLIT when set. Kimi-K2.5 (INT4 group-32, bf16 activations) at TP8 on MI300X (7168 x 256/rank; no gfx942
    tuned a16wi4 rows), AITER 0.1.18: without the variable M=1 splits 14 ways (7168 / 14 = 512), M=64 not at all;
    with AITER_KSPLIT=4 every bucket runs kb4, M=8192 too."""
    layer, caps = moe("Kimi-K2.5", tp=8), fake_capabilities("MI300X", "0.1.18")
    own = plan_dispatch(layer, caps, tokens=(1, 64), env={}).steps
    assert [(s.tokens, s.basis, s.kernels[0], s.block_m, s.ksplit) for s in own] == [
        ((1, 1), "heuristic", "flydsl_moe1_abf16_wint4_bf16_t16x128x128_kb14", 16, 14),
        ((64, 64), "heuristic", "flydsl_moe1_abf16_wint4_bf16_t16x128x128", 16, 0)]
    forced = plan_dispatch(layer, caps, tokens=(1, 64, 8192), env={"AITER_KSPLIT": "4"}).steps
    assert [(s.tokens, s.kernels, s.block_m, s.ksplit) for s in forced] == [
        ((1, 64), ("flydsl_moe1_abf16_wint4_bf16_t16x128x128_kb4", "flydsl_moe2_abf16_wint4_bf16_t16x128x128_atomic"),
         16, 4),
        ((8192, 8192), ("flydsl_moe1_abf16_wint4_bf16_t32x128x128_kb4",
                        "flydsl_moe2_abf16_wint4_bf16_t32x128x128_atomic"), 32, 4)]
    assert all("no tuned FlyDSL a16wi4 config: AITER's untuned a16wi4 fallback" in s.notes for s in forced)


# -- walk._dispatch_lookup_row: the flydsl_fallback row is looked up at the requested bucket ------------------------

def test_without_flydsl_the_fallback_row_of_the_requested_bucket_replaces_the_flydsl_row():
    """v0.1.11–v0.1.17 (Rules.flydsl_fallback_rows): flydsl not importable and the tuned row names FlyDSL kernels →
    AITER looks the requested token bucket up among the shape's ``flydsl_fallback`` rows and runs that row
    (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1062-1080). Kimi-K2.5-MXFP4 at TP4 on MI355X (7168 x 512/rank,
    E384 top-8), AITER 0.1.15.post3, M=1: kimik2_fp4_tuned_fmoe.csv:18 (FlyDSL stage 1) is swapped for its
    flydsl_fallback row :82 — CK 2-stage, block_m 32, tuned — not dropped for the heuristics."""
    where = "ROCm/aiter@v0.1.15.post3:aiter/configs/model_configs/kimik2_fp4_tuned_fmoe.csv"
    dp = plan_dispatch(moe("Kimi-K2.5-MXFP4", tp=4), fake_capabilities("MI355X", "0.1.15.post3"), tokens=(1,),
                       env={}, assumptions=Assumptions(flydsl_available=False))
    (s,) = dp.steps
    assert (s.basis, s.block_m, s.ksplit, s.row.where, s.row.tag) == ("tuned", 32, 0, f"{where}:82", "flydsl_fallback")
    assert s.kernels == (
        "moe_ck2stages_gemm1_64x32x32x128_1x1_MulABScaleShuffled_v3_Nswizzle0_Quant3_MulRoutedWeight0_silu_FP4X2_FP4X2_"
        "B16",
        "moe_ck2stages_gemm2_256x32x128x128_1x4_MulABScaleExpertWeightShuffled_v3_Nswizzle0_Quant3_MulRoutedWeight1_"
        "FP4X2_FP4X2_B16")
    assert f"flydsl is not importable: AITER swaps row {where}:18 for its flydsl_fallback row {where}:82" in s.notes


# -- core/backend.Padding.aligned: the intermediate multiple defaults to 1 (not padded) -----------------------------

def test_padding_aligned_leaves_the_intermediate_alone_unless_a_multiple_is_given():
    """docs/plugins.md: ``Padding.aligned(layer, *, hidden_multiple=1, intermediate_multiple=1, …)`` — a plugin that
    pads only hidden (gpt-oss-120b at TP8: 2880 → 3072 with hidden_multiple=256) gets intermediate per rank 360 as it
    is, and the plan records the alignment it satisfies: 256 × 1."""
    layer = moe("gpt-oss-120b", tp=8)
    assert (layer.hidden, layer.intermediate_per_rank) == (2880, 360)
    p = Padding.aligned(layer, hidden_multiple=256)
    assert (p.hidden, p.intermediate_per_rank, p.hidden_pad, p.intermediate_pad) == (3072, 360, 192, 0)
    assert (p.hidden_multiple, p.intermediate_multiple, p.zero_fill) == (256, 1, True)
    none = Padding.aligned(layer)
    assert (none.intermediate_multiple, none.padded, none.zero_fill) == (1, False, False)


# -- core/workload.Runtime.build: a token-count error names its input ---------------------------------------------

def test_runtime_build_names_its_token_counts_in_the_error():
    """Runtime.build checks the token counts (at most MAX_TOKEN_COUNTS per plan, each at most MAX_TOKENS); the one-line
    error starts with the name of what was given — ``tokens:`` (the CLI's parser says ``--tokens:``)."""
    with pytest.raises(UsageError) as many:
        moedispatch.Runtime.build(range(1, 100))
    assert str(many.value) == (f"tokens: 99 token counts; at most {MAX_TOKEN_COUNTS} per plan (a range lo-hi plans "
                               "AITER's buckets in it)")
    with pytest.raises(UsageError) as big:
        moedispatch.Runtime.build([1, MAX_TOKENS + 1])
    assert str(big.value) == (f"tokens: {MAX_TOKENS + 1} tokens in one MoE call is beyond any engine's batch (at most "
                              f"{MAX_TOKENS:,})")


# -- selector/runtime.dispatch_reasons: a warning without a stated confidence is confirmed ---------------------------

def test_a_dispatch_warning_without_a_stated_confidence_is_a_confirmed_note():
    """DispatchPlan.warning_confidence is empty by default (a DispatchPlan made without it); dispatch_reasons then
    reads every warning as confirmed — Reason's own default, what plan_dispatch states for a warning read from AITER's
    code. gpt-oss-120b at TP8 on MI355X / AITER 0.1.20.post1 with AITER_MOE_A8W4_BYPASS_QUANT=1 (FM
    fused_moe_2stages' debug bypass): the same confirmed note either way."""
    dp = plan_dispatch(moe("gpt-oss-120b", tp=8), fake_capabilities("MI355X", A20), tokens=(1, 8192),
                       env={"AITER_MOE_A8W4_BYPASS_QUANT": "1"})
    (warning,) = dp.warnings
    assert warning.startswith("AITER_MOE_A8W4_BYPASS_QUANT=1 is a debug switch") and dp.warning_confidence == (
        "confirmed",)
    bare = replace(dp, warning_confidence=())
    notes = [r for r in dispatch_reasons(bare, "aiter-flydsl", "flydsl") if r.text == warning]
    assert notes == [Reason(warning, "note", confidence="confirmed")]
    assert notes == [r for r in dispatch_reasons(dp, "aiter-flydsl", "flydsl") if r.text == warning]


@pytest.mark.parametrize("version, at_least", [("0.1.20", True), ("0.1.20.dev3", False), ("0.1.20rc1+rocm7", True),
                                               ("0.1.20.post1.dev2", True), ("0.1.19.post2", False), (None, False),
                                               ("not-a-version", False)])
def test_a_since_release_check_reads_a_build_as_the_release_it_carries(version, at_least):
    """rules._at_least (the 0.1.20 SiTUv2 gfx942 path, FlyDSL's tile resolve): a 0.1.20 release candidate takes
    0.1.20's rules and a 0.1.20.dev3 build (after a v0.1.19.x tag) v0.1.19.x's (lookup_rules above), so only the
    first is "at least 0.1.20" — one notion of a build's release (release_of)."""
    from moedispatch.aiter.rules import _at_least

    assert _at_least(version, "0.1.20") is at_least
