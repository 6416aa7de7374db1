"""Per-family rules as tables: each row is a real deployment with the source of its expected answer.

Targets are simulated from capability_db (no GPU). AITER 0.1.15.post3 unless a row says otherwise.
"""

from __future__ import annotations

import pytest

from moedispatch.core.reason import texts
from moedispatch.core.backend import Padding
from moedispatch.render.explain import plan_model
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.kit.rules import evaluate_issues, known_issues
from moedispatch.selector.pure import select

AITER = "0.1.15.post3"


def first_moe(model, target, tp, caps, builtins, aiter=AITER, ep=1):
    plan = plan_model(load_model(model), caps(target, aiter), tp, ep, backends=builtins)
    return next(d for d in plan.decisions if d.layer.kind == "moe")


# model, target, tp, backend, inter/rank -> padded, hidden -> padded, kernel inter pad, source
TABLE = [
    ("gpt-oss-120b", "gfx950", 1, "aiter-flydsl", 2880, 3072, 2880, 3072, 0,
     "vllm.md §12.6 (2880 -> 3072, 256 round-up); bias -> FlyDSL pads off from 0.1.15.post3 (aiter PR #3401)"),
    ("gpt-oss-120b", "gfx950", 2, "aiter-flydsl", 1440, 1536, 2880, 3072, 0, "vllm.md §12.6 TP2 1440 -> 1536"),
    ("gpt-oss-120b", "gfx950", 4, "aiter-flydsl", 720, 768, 2880, 3072, 0, "vllm.md §12.6 TP4 720 -> 768"),
    ("gpt-oss-120b", "gfx950", 8, "aiter-flydsl", 360, 512, 2880, 3072, 0, "vllm.md §12.6 TP8 360 -> 512"),
    ("gpt-oss-120b", "gfx942", 8, "aiter-triton", 360, 512, 2880, 3072, 0,
     "vllm-project/vllm#50622 (AITER Triton W4A16 is vLLM's gfx942 default for gpt-oss); 256/256 round-up; "
     "moe_gemm_a16w4 takes no pads and computes over the zero-filled round-up"),
    ("MiniMax-M3-MXFP4", "gfx950", 1, "aiter-flydsl", 3072, 3072, 6144, 6144, 0, "models_hw.md §A.4 (no pad)"),
    ("MiniMax-M3-MXFP4", "gfx950", 2, "aiter-flydsl", 1536, 1536, 6144, 6144, 0, "models_hw.md §A.4"),
    ("MiniMax-M3-MXFP4", "gfx950", 4, "aiter-flydsl", 768, 768, 6144, 6144, 0, "vllm.md §12.6 (TP4 768, no pad)"),
    ("MiniMax-M3-MXFP4", "gfx950", 8, "aiter-flydsl", 384, 512, 6144, 6144, 0,
     "vllm.md §12.6 (384 -> 512, model passes intermediate_pad=0, PR #46419)"),
    ("MiniMax-M3-MXFP4", "gfx942", 1, "emulation", 3072, 3072, 6144, 6144, 0, "vllm.md §4 W4A4 on gfx942"),
    ("MiniMax-M3-MXFP4", "gfx942", 2, "emulation", 1536, 1536, 6144, 6144, 0, "vllm.md §4"),
    ("MiniMax-M3-MXFP4", "gfx942", 4, "emulation", 768, 768, 6144, 6144, 0, "vllm.md §4"),
    ("MiniMax-M3-MXFP4", "gfx942", 8, "emulation", 384, 384, 6144, 6144, 0,
     "vllm.md §4; emulation pads MX only to 32 (vllm.md §12.2) and 384 is 32-aligned"),
    ("DeepSeek-V3", "gfx942", 8, "aiter-ck", 256, 256, 7168, 7168, 0, "aiter_sglang.md §3.3 a8w8blkscale, 128 tiles"),
    ("DeepSeek-V3", "gfx950", 8, "aiter-ck", 256, 256, 7168, 7168, 0, "aiter_sglang.md §3.3 a8w8blkscale"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx950", 8, "aiter-ck", 192, 256, 4096, 4096, 0,
     "SGLang PR #18684/#21097 (seeds/003): AITER pads w2 to 128 -> 256; verified GSM8K 0.980 at TP8"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx942", 8, "aiter-ck", 192, 256, 4096, 4096, 0, "as above"),
    ("Qwen3-30B-A3B", "gfx950", 4, "aiter-ck", 192, 192, 2048, 2048, 0,
     "vLLM PR #55368: CK bf16 N tile 64 when inter <= 192 (192 passes)"),
    ("Qwen3-30B-A3B", "gfx950", 8, "aiter-ck", 96, 128, 2048, 2048, 0, "vLLM PR #55368: 96 -> multiple of 64"),
    ("Mixtral-8x7B", "gfx942", 8, "aiter-ck", 1792, 1792, 4096, 4096, 0, "models_hw.md §A.4 (1792 = 14*128)"),
    ("grok-1", "gfx942", 8, "aiter-ck", 4096, 4096, 6144, 6144, 0, "models_hw.md §A.1 (GELU-gated, CK _gelu)"),
    ("Qwen3.5-397B-A17B-MXFP4", "gfx950", 8, "aiter-ck", 128, 256, 4096, 4096, 0,
     "vllm.md §12.2 ROCm MXFP4 256 round-up; SGLang seeds/003 verified amd/Qwen3.5-397B-A17B-MXFP4 TP8 on AITER"),
]


@pytest.mark.parametrize("model,target,tp,backend,inter,inter_p,hidden,hidden_p,kpad,source", TABLE,
                         ids=[f"{r[0]}-{r[1]}-tp{r[2]}" for r in TABLE])
def test_deployment_table(model, target, tp, backend, inter, inter_p, hidden, hidden_p, kpad, source, caps, builtins):
    d = first_moe(model, target, tp, caps, builtins)
    assert d.backend == backend, (source, d.reasons, [r.to_dict() for r in d.rejected])
    assert d.layer.intermediate_per_rank == inter
    assert (d.padding.intermediate_per_rank, d.padding.hidden) == (inter_p, hidden_p), source
    assert d.layer.hidden == hidden
    assert d.padding.kernel_intermediate_pad == kpad, source
    assert d.padding.zero_fill == (inter_p != inter or hidden_p != hidden)


def test_minimax_m21_mxfp4_style_384_per_rank_pads_past_the_missing_ck_tile(caps, builtins):
    """MiniMax-M2.1 MXFP4 at TP4 is 384/rank: CK has no a4w4 tile for 384 (vLLM #35637, ROCm/aiter#2191)."""
    layer = MoELayer.build(hidden=3072, intermediate=1536, experts=256, top_k=8, tp=4, weight="mxfp4",
                           act="mxfp4", model="MiniMax-M2.1-MXFP4")
    d = select(layer, caps("gfx950", AITER), builtins)
    assert d.backend == "aiter-ck"
    assert d.padding.intermediate_per_rank == 512 and d.padding.zero_fill
    assert any("aiter#2191" in r for r in texts(d.reasons))


def test_gpt_oss_before_flydsl_pad_forwarding_and_before_bias_guard(caps, builtins):
    """<= 0.1.14.post1 FlyDSL never receives pads (aiter#3184); 0.1.15 forwards them but not the bias guard, so the
    intermediate pad is forced to 0 for PR #3538 while the hidden pad is passed."""
    old = first_moe("gpt-oss-120b", "gfx950", 8, caps, builtins, aiter="0.1.14")
    assert old.backend == "aiter-flydsl"
    assert (old.padding.kernel_hidden_pad, old.padding.kernel_intermediate_pad) == (0, 0)
    mid = first_moe("gpt-oss-120b", "gfx950", 8, caps, builtins, aiter="0.1.15")
    assert (mid.padding.kernel_hidden_pad, mid.padding.kernel_intermediate_pad) == (192, 0)
    assert any("aiter-pr#3538" in r for r in texts(mid.reasons))


def test_cktile_kernel_pads_are_the_raw_pads(caps, builtins):
    """CK-Tile converts pads to granules itself; pre-rounding/doubling broke gpt-oss TP8 (vLLM #44679, #46201)."""
    layer = MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16",
                           activation="swigluoai", activation_params={"alpha": 1.702, "limit": 7.0}, has_bias=True)
    d = select(layer, caps("gfx950", AITER), builtins, force="aiter-cktile")
    assert (d.padding.intermediate_per_rank, d.padding.intermediate_pad) == (512, 152)
    assert (d.padding.kernel_hidden_pad, d.padding.kernel_intermediate_pad) == (192, 152)


def test_cktile_mxfp4_wrong_output_issue_rejects_an_unpadded_384_plan(caps):
    """aiter#5233: CK-Tile MXFP4 stage 2 is silently wrong when inter_dim % 256 != 0 — an unpadded plan is refused."""
    layer = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16")
    outcome = evaluate_issues("aiter-cktile", layer, caps("gfx950", "0.1.19"), Padding.none(layer))
    assert any(r.issue == "aiter#5233" and r.kind == "failed" and "wrong output" in r.text for r in outcome.blocking)
    padded = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256)
    outcome = evaluate_issues("aiter-cktile", layer, caps("gfx950", "0.1.19"), padded)
    assert not outcome.blocking and any("avoids [aiter#5233]" in n for n in texts(outcome.notes))


def test_ck_bf16_rejects_224_unless_padded(caps):
    """ROCm/aiter#5444: BF16 CK rejects inter_dim 224 (1792 at TP8); the planner pads to 256."""
    layer = MoELayer.build(hidden=4096, intermediate=1792, experts=8, top_k=2, tp=8)
    assert any(r.issue == "aiter#5444" for r in
               evaluate_issues("aiter-ck", layer, caps("gfx942", AITER), Padding.none(layer)).blocking)
    from moedispatch.selector.plugins import get_registry

    d = select(layer, caps("gfx942", AITER), get_registry().backends)
    assert d.backend == "aiter-ck" and d.padding.intermediate_per_rank == 256


def test_gfx942_fp8_block_reports_fnuz_conversion_and_the_m304_fault_caveat(caps, builtins):
    d = first_moe("DeepSeek-V3", "gfx942", 8, caps, builtins)
    assert any("e4m3fnuz" in r for r in texts(d.reasons))
    assert any("aiter#4783" in r and "caveat" in r for r in texts(d.reasons))


def test_no_aiter_falls_to_triton_for_fp8_and_names_the_missing_aiter(caps, builtins):
    d = first_moe("DeepSeek-V3", "gfx950", 8, caps, builtins, aiter="none")
    assert d.backend == "triton"
    ck = d.rejection("aiter-ck")
    assert any("AITER" in r and "not available" in r for r in texts(ck.reasons))


def test_gfx90a_has_no_fp8_so_only_emulation_runs_fp8_checkpoints(caps, builtins):
    d = first_moe("DeepSeek-V3", "gfx90a", 8, caps, builtins, aiter="none")
    assert d.backend == "emulation"
    assert any("gfx90a" in r for r in texts(d.rejection("triton").reasons))


def test_mxfp8_on_gfx950_uses_triton_dot_scaled_until_aiter_has_flydsl_mxfp8(caps, builtins):
    """vLLM's AITER_MXFP8 needs the FlyDSL MXFP8 MoE and AITER's minimax_m3_mxfp8 tuned CSV (ROCm/aiter#3811, in
    v0.1.16.post1); before that, TRITON_MXFP8 on gfx950 (vllm-project/vllm@017e9f4448:
    vllm/model_executor/layers/fused_moe/oracle/mxfp8.py)."""
    d = first_moe("MiniMax-M3-MXFP8", "gfx950", 4, caps, builtins, aiter="0.1.15.post3")
    assert d.backend == "triton"
    assert any("0.1.16.post1" in r for r in texts(d.rejection("aiter-flydsl").reasons))
    d = first_moe("MiniMax-M3-MXFP8", "gfx950", 4, caps, builtins, aiter="0.1.16.post1")
    assert d.backend == "aiter-flydsl"
    assert first_moe("MiniMax-M3-MXFP8", "gfx942", 4, caps, builtins).backend == "emulation"


MODELS = ["gpt-oss-120b", "MiniMax-M3-MXFP4", "DeepSeek-V3", "Qwen3-235B-A22B-Instruct-2507-FP8", "Qwen3-30B-A3B",
          "Mixtral-8x7B", "grok-1", "MiniMax-M2.1", "GLM-4.7", "Kimi-K2", "Qwen3.5-397B-A17B-MXFP4",
          "MiniMax-M3-MXFP8", "Qwen3-235B-A22B-Instruct-2507-MXFP4", "grok-2", "gpt-oss-20b"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("target,aiter", [("gfx942", AITER), ("gfx950", AITER), ("gfx950", "0.1.19"),
                                          ("gfx950", "0.1.13.post1")])
def test_invariants_over_models_targets_and_tp(model, target, aiter, caps, builtins):
    """No decision lands on an unsupported tile or an unfixed wrong-output issue; pads are aligned and zero-filled."""
    spec = load_model(model)
    c = caps(target, aiter)
    by_name = {b.name: b for b in builtins}
    for tp in (1, 2, 4, 8):
        layers = expand_layers(spec, tp, 1)  # every model here shards at TP 1-8: an error fails the case
        layer = next(la for la in layers if la.kind == "moe")
        d = select(layer, c, builtins)
        p = d.padding
        assert p.hidden % p.hidden_multiple == 0 and p.intermediate_per_rank % p.intermediate_multiple == 0
        assert p.zero_fill == p.padded
        if d.backend != "emulation":
            assert not evaluate_issues(d.backend, layer, c, p).blocking
            assert by_name[d.backend].check(layer, c).supported
        if d.backend and d.backend.startswith("aiter-"):
            # AITER pre-shuffles weights: shuffle_weight asserts rows % 16 == 0 and last dim % 32 == 0 in storage
            # elements (two fp4 per byte) — aiter/ops/shuffle.py (aiter_sglang.md §4.4).
            per_byte = 2 if layer.weight.dtype in ("mxfp4", "int4") else 1
            assert (2 * p.intermediate_per_rank) % 16 == 0 and (p.hidden // per_byte) % 32 == 0, (model, tp)
            assert p.hidden % 16 == 0 and (p.intermediate_per_rank // per_byte) % 32 == 0, (model, tp)


def test_every_known_issue_has_id_source_and_effect():
    issues = known_issues()
    assert len(issues) >= 7
    for i in issues:
        assert i.id and i.source and i.effect
    ids = {i.id for i in issues}
    assert {"aiter#5233", "aiter-pr#3538", "aiter#5413", "aiter#5444", "aiter#2191", "aiter#4783",
            "vllm-pr#46419"} <= ids


def test_probed_aiter_without_tuned_rows_for_304_cus_is_noted(caps, builtins):
    """v0.1.15.post3 ships tuned fmoe rows only for cu_num 80 and 256 (aiter_sglang.md §6.1): MI300X runs heuristics."""
    import dataclasses

    c = dataclasses.replace(caps("MI300X", AITER), tuned_cu_nums=frozenset({80, 256}))
    d = first_moe("DeepSeek-V3", "gfx942", 8, lambda *a: c, builtins)
    assert any("no rows for cu_num 304" in r for r in texts(d.reasons))
    c = dataclasses.replace(caps("MI355X", AITER), tuned_cu_nums=frozenset({80, 256}))
    d = first_moe("DeepSeek-V3", "gfx950", 8, lambda *a: c, builtins)
    assert any("have rows for cu_num 256" in r for r in texts(d.reasons))


def test_aiter_asm_pads_to_the_smallest_subgu_multiple(caps):
    """hsa/gfx942 pertokenFp8 subGU_n {128..512 step 64} (aiter_sglang.md §3.1): 704 -> 768, 192 stays 192."""
    from moedispatch_plugins.aiter_asm import AiterAsm

    asm = AiterAsm()
    c = caps("gfx942", AITER)
    for inter, padded in ((5632, 5632), (1536, 1536), (192 * 8, 1536)):
        layer = MoELayer.build(hidden=5120, intermediate=inter, experts=8, top_k=2, weight="fp8", act="fp8")
        assert asm.plan_padding(layer, c).intermediate_per_rank == padded
    layer = MoELayer.build(hidden=5120, intermediate=704, experts=8, top_k=2, weight="fp8", act="fp8")
    assert asm.plan_padding(layer, c).intermediate_per_rank == 768
    layer = MoELayer.build(hidden=5120, intermediate=192, experts=8, top_k=2, weight="fp8", act="fp8")
    assert asm.plan_padding(layer, c).intermediate_per_rank == 192


def test_aiter_asm_requires_the_probed_kernel_table(caps):
    """With a probed catalog, the asm table for this arch/quant/activation must exist (hsa/<gfx>/fmoe/*.csv)."""
    import dataclasses

    from moedispatch_plugins.aiter_asm import AiterAsm

    layer = MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight=QuantSpec(
        "fp8", "block128x128", scale_dtype="fp32"), act=QuantSpec("fp8", "group128", dynamic=True))
    base = caps("gfx950", AITER)
    with_table = dataclasses.replace(base, aiter_catalog=frozenset({"gfx950:fmoe_bf16_blockscaleFp8_g1u1_silu"}))
    without = dataclasses.replace(base, aiter_catalog=frozenset({"gfx950:fmoe_bf16_pertokenFp8_g1u1_silu"}))
    assert AiterAsm().check(layer, with_table).supported
    verdict = AiterAsm().check(layer, without)
    assert not verdict.supported
    assert any("fmoe_bf16_blockscaleFp8_g1u1_silu" in r and "gfx950" in r for r in texts(verdict.reasons))
    assert AiterAsm().check(layer, base).supported  # simulated target: no catalog to contradict the DB


def test_padded_mx_plan_explains_its_scale_tensors(caps, builtins):
    """E8M0 pad scales must not be 0xFF (NaN): the plan says so, with the padded scale shapes."""
    d = first_moe("MiniMax-M3-MXFP4", "gfx950", 8, caps, builtins)
    note = next(r for r in texts(d.reasons) if r.startswith("scales:"))
    assert "[128, 2×512, 192]" in note and "[128, 6144, 16]" in note and "0xFF" in note
    d = first_moe("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx950", 8, caps, builtins)
    assert any(r.startswith("block scales:") and "[128, 2×2, 32]" in r for r in texts(d.reasons))


def test_block_fp8_shard_that_splits_scale_tiles_is_flagged(caps, builtins):
    """Qwen3-235B-FP8 at TP8 is 192/rank: it splits 128×128 scale tiles (models_hw.md §A.4; vLLM refuses it,
    'not divisible by weight quantization block_n'; SGLang runs it on AITER with padding, seeds/003)."""
    plan = plan_model(load_model("Qwen3-235B-A22B-Instruct-2507-FP8"), caps("gfx950", AITER), 8, 1,
                      backends=builtins)
    assert any(w.startswith("caveat [scale tiles]") and "--ep 8" in w for w in texts(plan.warnings))
    ok = plan_model(load_model("Qwen3-235B-A22B-Instruct-2507-FP8"), caps("gfx950", AITER), 8, 8, backends=builtins)
    assert not any("scale tiles" in w for w in texts(ok.warnings))
    assert not any("scale tiles" in w.text for w in plan_model(load_model("DeepSeek-V3"), caps("gfx950", AITER), 8, 1,
                                                           backends=builtins).warnings)


@pytest.mark.parametrize("inter, tp, refuses", [(1536, 8, False), (2880, 8, True)])
def test_scale_tile_caveat_says_what_vllm_033_does_with_the_shard(inter, tp, refuses):
    """vLLM 0.33 refines 128x128 scale blocks to gcd(128, I/rank, hidden) when that is >= 32 (Triton only; env-forced
    AITER raises) and refuses the shape below 32 (vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/
    oracle/fp8.py refine_fp8_moe_block_shape): Qwen3-235B-FP8 TP8 (192/rank) refines to 64, a 360/rank shard refuses."""
    from moedispatch.kit.caveats import SCALE_TILES, shard_caveats
    from moedispatch.core.layers import QuantSpec

    layer = MoELayer.build(hidden=4096, intermediate=inter, experts=128, top_k=8, tp=tp,
                           weight=QuantSpec("fp8", "block128x128"), act=QuantSpec("fp8", "group128", dynamic=True))
    (caveat,) = [r for r in shard_caveats(layer) if r.issue == SCALE_TILES]
    assert caveat.kind == "caveat" and "v0.33.0" in caveat.source
    assert ("refuses this shape" in caveat.text) is refuses
    assert ("refines the scale blocks to 64" in caveat.text) is (not refuses)


@pytest.mark.parametrize("version, affected", [("0.1.15", True), ("0.1.15rc1", True), ("0.1.15.dev7+g1a2b", False),
                                               ("0.1.15.post1.dev2", True), ("0.1.14.post2", False),
                                               ("0.1.14.post3.dev1", False)])
def test_known_issue_ranges_read_a_build_as_the_release_it_carries(version, affected):
    """aiter-pr#3538's range ``>=0.1.15``: a release candidate of 0.1.15 carries its FlyDSL pad code
    (core.aiter_release.release_of: 0.1.15rc1 → 0.1.15), as the dispatch rules and dispatch issues read it;
    packaging's own ``Version("0.1.15rc1") in SpecifierSet(">=0.1.15")`` is False (and what it says for pre-releases
    changed across packaging 21–26). A dev build names the release after the tag it was built from (setuptools_scm
    guess-next-dev): 0.1.15.dev7 is before 0.1.15, 0.1.15.post1.dev2 after it."""
    from moedispatch.kit.rules import _version_in

    assert _version_in(">=0.1.15", version) is affected
