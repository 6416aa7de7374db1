"""Survivors of the sampled mutation run (benchmarks/mutation.py --sample 0.02 --seed 11) in engines/choice.py,
engines/layout.py and selector/runtime.py: each test pins, on a real model / target / engine release, the rule the
mutated line decides, with the expected value derived from the rule's source (vLLM 0.33.0, AITER, config.json)."""

from __future__ import annotations

import json

import pytest

from moedispatch import plan_model
from moedispatch.aiter import dispatch as ad
from moedispatch.aiter.key import Assumptions
from moedispatch.core.backend import Padding
from moedispatch.core.workload import Runtime
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.engines.layout import GIB, realize_layout, weight_bytes_per_rank
from moedispatch.engines.recipes import engine_data
from moedispatch.plan.plan import plan_model as plan_spec
from moedispatch.selector import runtime as rt_mod
from moedispatch.sources.models import load_model
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"
ON = {"VLLM_ROCM_USE_AITER": "1"}
FUSED = {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def _caps(gfx):
    return capdb.target_capabilities(gfx, None)


def _vllm(gfx, env, hidden, inter_per_rank, *, mb="auto", activation="silu", experts=128, tp=8, **quant):
    return ec.engine_choice("vllm", "0.33.0", caps=_caps(gfx), env=env, moe_backend=mb, hidden_size=hidden,
                            intermediate_size=inter_per_rank * tp, tp_size=tp, num_experts=experts, top_k=8,
                            activation=activation, **quant)


# -- engines/choice.py: _engine_allocation_hits ------------------------------------------------------------------------

def test_an_engine_pick_aiter_does_not_run_is_not_judged_by_aiters_dispatch():
    """MiniMax-M3-MXFP4 TP8 on MI355X: vLLM 0.33.0 without VLLM_ROCM_USE_AITER ends on EMULATION (dequantize + Triton)
    at 6144 × 384. AITER's dispatcher would run CK-Tile stage 2 for decode at that allocation (ROCm/aiter#5233,
    wrong output) — but EMULATION never calls aiter.fused_moe, so that is no claim against the engine's pick: the
    comparison stays 'slower', not 'wrong'. Only an aiter.fused_moe family (the AITER pick, same allocation) meets
    it."""
    plan = plan_model("MiniMax-M3-MXFP4", fake_capabilities("MI355X", A20), 8, 1)
    d = _moe(plan)
    emu = ec.choice_for_layer(d.layer, plan.caps, "vllm", env={})
    assert (emu.backend, emu.family, emu.hidden, emu.intermediate_per_rank) == ("EMULATION", "emulation", 6144, 384)
    assert ec._engine_allocation_hits(d, emu) == []
    [c] = ec.compare_plan(plan, "vllm", env={})
    assert (c["verdict"], c["padding_differs"]) == ("slower", True)
    assert not any(w["issue"] == "ROCm/aiter#5233" for w in c["why_details"])
    aiter = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON)
    assert (aiter.family, aiter.hidden, aiter.intermediate_per_rank) == ("aiter-ck", 6144, 384)
    assert [r.issue for r in ec._engine_allocation_hits(d, aiter)] == ["ROCm/aiter#5233"]


# -- engines/choice.py: _mxfp4_by_activation (vLLM oracle/mxfp4.py _filter_by_activation) ---------------------------

W4A16 = dict(weight_quant="mxfp4", activation_quant="bf16")
W4A4 = dict(weight_quant="mxfp4", activation_quant="mxfp4")
W4A8 = dict(weight_quant="mxfp4", activation_quant="fp8")


def test_vllm_forced_non_bf16_mxfp4_backend_on_a_bf16_activation_layer_is_tried():
    """"without one [a requested activation key], prefer BF16 if the list has any, else keep the list as-is so explicit
    non-BF16 picks still land" (oracle/mxfp4.py _filter_by_activation): the one --moe-backend value vLLM 0.33.0's
    parser accepts whose map entry is a single non-BF16 backend, aiter_triton_mxfp4_mxfp4, is tried with its own key
    on a gpt-oss-style W4A16 SwiGLU-OAI layer (2880 × 360/rank) — and refused by the device (gfx1250 only), not by an
    empty candidate list."""
    c = _vllm("gfx950", ON, 2880, 360, mb="aiter_triton_mxfp4_mxfp4", activation="swigluoai", **W4A16)
    assert (c.backend, c.stage) == ("AITER_TRITON_MXFP4_MXFP4", "select")
    assert c.rejected == (("AITER_TRITON_MXFP4_MXFP4", "kernel does not support current device (gfx1250)"),)


@pytest.mark.parametrize("mb", ["aiter_mxfp4_fp8", "aiter_mxfp4_mxfp4", "AITER-MXFP4-FP8"])
def test_vllm_refuses_moe_backend_values_its_parser_does_not_accept(mb):
    """map_mxfp4_backend maps aiter_mxfp4_fp8 / aiter_mxfp4_mxfp4, but they are not MoEBackend values
    (vllm/config/kernel.py:122-147): `vllm serve --moe-backend aiter_mxfp4_fp8` dies in argparse ('invalid choice'),
    so no launch reaches AITER_MXFP4_FP8 / AITER_MXFP4_MXFP4 that way (earlier this model let them land)."""
    c = _vllm("gfx950", ON, 2880, 360, mb=mb, activation="swigluoai", **W4A16)
    assert (c.backend, c.stage, c.hidden) == (None, "args", None)
    assert c.error.startswith("argument --moe-backend: invalid choice: 'aiter_mxfp4_")


def test_vllm_forced_aiter_on_a_bf16_activation_layer_tries_only_the_bf16_variants():
    """--moe-backend aiter maps to five AITER MXFP4 backends; for a bf16-activation layer the oracle keeps the BF16
    ones (AITER_MXFP4_BF16, AITER_TRITON_MXFP4_BF16) and raises on the last of them when neither runs (gfx950
    without VLLM_ROCM_USE_AITER): the W4A8 / W4A4 variants are never tried."""
    c = _vllm("gfx950", {}, 2880, 360, mb="aiter", activation="swigluoai", **W4A16)
    assert c.rejected == (("AITER_MXFP4_BF16", "kernel does not support current device (aiter_moe)"),
                          ("AITER_TRITON_MXFP4_BF16", "kernel does not support current device (aiter)"))
    assert c.error == ("MXFP4 MoE backend AITER_TRITON_MXFP4_BF16 does not support the deployment configuration since "
                       "kernel does not support current device (aiter).")


@pytest.mark.parametrize("quant, first", [(W4A4, "AITER_MXFP4_MXFP4"), (W4A8, "AITER_MXFP4_FP8")])
def test_vllm_quantized_activations_put_emulation_before_the_bf16_fallbacks(quant, first):
    """_filter_by_activation: the backends matching the requested activation *or EMULATION* come first, the BF16 ones
    after as a fallback. A SwiGLU-OAI W4A4 / W4A8 layer on gfx950 without AITER: the matching AITER backend refuses the
    device, EMULATION takes the layer before the bf16 OAI Triton kernel (which would accept SwiGLU-OAI) is reached."""
    c = _vllm("gfx950", {}, 2880, 360, activation="swigluoai", **quant)
    assert (c.backend, c.error) == ("EMULATION", None)
    assert [b for b, _ in c.rejected] == [first]


def test_vllm_quantized_activations_fall_back_to_the_bf16_backends_past_emulation():
    """The BF16 backends follow EMULATION once each: with 1024 experts EMULATION's moe_align_block_size refuses
    (fewer than 1024 padded experts), and the W4A4 SwiGLU-OAI layer lands on the bf16 OAI Triton kernel."""
    c = _vllm("gfx950", {}, 2880, 360, activation="swigluoai", experts=1024, **W4A4)
    assert (c.backend, c.error) == ("TRITON", None)
    assert [b for b, _ in c.rejected] == ["AITER_MXFP4_MXFP4", "EMULATION", "AITER_MXFP4_BF16",
                                          "AITER_TRITON_MXFP4_BF16"]


# -- engines/choice.py: _vllm_allocation -----------------------------------------------------------------------------

@pytest.mark.parametrize("env, hidden, inter, quant, backend", [
    # oracle/unquantized.py rounds the shard (64 up to 192, 128 above) for AITER only; Triton takes it as it is.
    ({}, 2048, 96, dict(weight_quant="bf16"), "TRITON"),
    ({}, 2880, 360, dict(weight_quant="bf16"), "TRITON"),
    # The FP8 oracle has no AITER round-up (that is unquantized_round_up_hidden_size_and_intermediate_size's), and the
    # 32-divisibility check is Quark MXFP8's create_weights: a 360 shard (360 % 32 = 8) is allocated as it is.
    (ON, 2048, 96, dict(weight_quant="fp8", activation_quant="fp8"), "AITER"),
    (ON, 2880, 360, dict(weight_quant="fp8", weight_granularity="channel", activation_quant="fp8"), "AITER"),
])
def test_vllm_allocates_unquantized_triton_and_fp8_shards_unpadded(env, hidden, inter, quant, backend):
    c = _vllm("gfx950", env, hidden, inter, **quant)
    assert (c.backend, c.error, c.hidden, c.intermediate_per_rank) == (backend, None, hidden, inter)


# -- engines/layout.py: weight_bytes_per_rank and _dense_params (derived estimate, exact arithmetic) ----------------

def _gqa(hidden, heads, kv, head_dim):
    """q, k, v and o projections of one attention layer (config.json: num_attention_heads, num_key_value_heads,
    head_dim)."""
    return hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden


def _mla(hidden, heads, q_lora, kv_lora, nope, rope, v):
    """DeepSeek MLA: q (through q_lora_rank when set), kv_a (kv_lora_rank + rope), kv_b (nope + v per head), o."""
    q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
    return q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * hidden


def test_weight_bytes_qwen3_30b_gqa_untied_all_moe():
    """Qwen3-30B-A3B (48 MoE layers, 128 experts, hidden 2048, 32 heads / 4 KV heads of 128, vocab 151936, untied)
    at TP8, bf16: routed experts at the allocation (2 bytes), attention and embeddings + lm_head split over TP."""
    plan = plan_model("Qwen3-30B-A3B", fake_capabilities("MI300X", A20), 8, 1)
    experts = 48 * 128 * 3 * 2048 * 96 * 2
    split = 48 * _gqa(2048, 32, 4, 128) + 151936 * 2048 * 2
    assert weight_bytes_per_rank(plan, allocation=(2048, 96)) == experts + split / 8 * 2
    d = _moe(plan)
    at_plan = (d.padding.hidden, d.padding.intermediate_per_rank)
    assert weight_bytes_per_rank(plan) == weight_bytes_per_rank(plan, allocation=at_plan)
    # expert_bits (the width the engine holds after a load-time conversion) replaces the checkpoint's 16
    assert weight_bytes_per_rank(plan, allocation=(2048, 96), expert_bits=8) == experts / 2 + split / 8 * 2


def test_weight_bytes_grok1_head_dim_from_heads_and_tied_embeddings():
    """grok-1 has no head_dim (6144 / 48 heads = 128) and ties its embeddings (one vocab × hidden matrix)."""
    plan = plan_model("grok-1", fake_capabilities("MI300X", A20), 8, 1)
    experts = 64 * 8 * 3 * 6144 * 4096 * 2
    split = 64 * _gqa(6144, 48, 8, 6144 // 48) + 131072 * 6144
    assert weight_bytes_per_rank(plan, allocation=(6144, 4096)) == experts + split / 8 * 2


def test_weight_bytes_deepseek_v3_mla_dense_layers_shared_expert_fp8():
    """DeepSeek-V3 FP8: MLA with q_lora_rank 1536 / kv_lora_rank 512 (nope 128, rope 64, v 128) on 61 layers, three
    dense MLPs of 18432, one 2048-wide shared expert on the 58 MoE layers; an FP8 checkpoint holds it all at 1 byte."""
    plan = plan_model("DeepSeek-V3", fake_capabilities("MI300X", A20), 8, 1)
    experts = 58 * 256 * 3 * 7168 * 256 * 1
    split = (61 * _mla(7168, 128, 1536, 512, 128, 64, 128) + 3 * 3 * 7168 * 18432 + 58 * 3 * 7168 * 2048
             + 129280 * 7168 * 2)
    assert weight_bytes_per_rank(plan, allocation=(7168, 256)) == experts + split / 8 * 1


#: deepseek-ai/DeepSeek-V2-Lite config.json (the fields moedispatch reads): MLA without a q LoRA (q_lora_rank null),
#: two shared experts (one MLP of 2 × 1408, DeepseekV2MoE.shared_experts), one dense first layer.
DSV2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
             "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
             "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
             "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "vocab_size": 102400, "first_k_dense_replace": 1, "moe_layer_freq": 1,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}


@pytest.mark.parametrize("omit", [(), ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")])
def test_weight_bytes_mla_without_q_lora_and_two_shared_experts(tmp_path, omit):
    """A DeepSeek-V2-Lite checkpoint folder at TP2: q is one hidden × heads × (nope + rope) projection; the two shared
    experts are a single MLP of their total width 2816 (counted once, not once per shared expert). A config.json that
    leaves the MLA head sizes to transformers' DeepseekV2Config defaults (nope 128, rope 64, v 128) reads the same."""
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in DSV2_LITE.items() if k not in omit}))
    plan = plan_model(str(tmp_path), fake_capabilities("MI300X", A20), 2, 1)
    assert (plan.model.shared_experts, plan.model.shared_intermediate) == (2, 2 * 1408)
    experts = 26 * 64 * 3 * 2048 * 704 * 2
    split = (27 * _mla(2048, 16, 0, 512, 128, 64, 128) + 1 * 3 * 2048 * 10944 + 26 * 3 * 2048 * 2816
             + 102400 * 2048 * 2)
    assert weight_bytes_per_rank(plan, allocation=(2048, 704)) == experts + split / 2 * 2


def test_weight_bytes_mx_experts_carry_their_e8m0_scales_unless_converted():
    """MiniMax-M3-MXFP4 TP8: MXFP4 experts are 4 bits per weight plus one E8M0 scale byte per 32 weights; held as BF16
    after a load-time conversion (expert_bits 16) there are no MX scales. The dense part (60 layers of 64 heads / 4 KV
    heads of 128, three dense MLPs of 12288, a 3072-wide shared expert, untied vocab 200064) stays bf16."""
    plan = plan_model("MiniMax-M3-MXFP4", fake_capabilities("MI355X", A20), 8, 1)
    elems = 57 * 128 * 3 * 6144 * 512
    split = 60 * _gqa(6144, 64, 4, 128) + 3 * 3 * 6144 * 12288 + 57 * 3 * 6144 * 3072 + 200064 * 6144 * 2
    assert weight_bytes_per_rank(plan, allocation=(6144, 512)) == elems * 4 / 8 + elems / 32 + split / 8 * 2
    assert weight_bytes_per_rank(plan, allocation=(6144, 512), expert_bits=16) == elems * 2 + split / 8 * 2


def test_weight_bytes_of_a_config_without_attention_or_vocab_count_only_the_mlps():
    """DeepSeek-V4-Pro's built-in config.json carries the MoE part only (no attention heads, no vocab_size): the
    estimate counts what the config says — 58 MoE layers of 384 MXFP4 experts (E8M0 scales), three dense MLPs of
    18432 and the 3072-wide shared expert — and nothing for attention or embeddings it cannot size."""
    plan = plan_model("DeepSeek-V4-Pro", fake_capabilities("MI355X", A20), 8, 1)
    elems = 58 * 384 * 3 * 7168 * 384
    split = 3 * 3 * 7168 * 18432 + 58 * 3 * 7168 * 3072
    assert weight_bytes_per_rank(plan, allocation=(7168, 384)) == elems * 4 / 8 + elems / 32 + split / 8 * 2


# -- engines/layout.py: Layout.to_dict ---------------------------------------------------------------------------

def test_layout_dict_names_the_parallelism_and_rounds_the_memory_to_a_tenth():
    """vLLM 0.33.0 on MI300X (192 GiB, --gpu-memory-utilization default 0.92 → 176.64 GiB usable): Qwen3-30B-A3B at
    tp=4 ep=8 is TP 4 × DP 2 (world 8); the weights and the budget are said to a tenth of a GiB."""
    plan = plan_model("Qwen3-30B-A3B", fake_capabilities("MI300X", A20), 4, 8)
    layout = realize_layout(plan, "vllm", engine_data("vllm")["vllm"])
    gib = weight_bytes_per_rank(plan) / GIB
    assert round(gib, 1) != round(gib, 2)
    assert layout.to_dict() == {"tp": 4, "ep": 8, "dp": 2, "world_size": 8, "weights_per_rank_gib": round(gib, 1),
                                "memory_budget_gib": 176.6}


def test_layout_dict_of_a_gpu_of_unknown_memory_says_null():
    """A target whose product capability_db does not list (e.g. a probed device id it does not know) has no memory
    budget: the layout's dict says null for both figures rather than failing."""
    plan = plan_model("Qwen3-30B-A3B", fake_capabilities("gfx942", A20, product=None), 8, 1)
    layout = realize_layout(plan, "vllm", engine_data("vllm")["vllm"])
    assert layout.to_dict() == {"tp": 8, "ep": 1, "dp": 1, "world_size": 8, "weights_per_rank_gib": None,
                                "memory_budget_gib": None}


# -- selector/runtime.py: _switches, _kept_note, blocking_reasons --------------------------------------------------

def _runtime_moe(model, product, aiter, tp, ep=1, env=None):
    rt = Runtime.build(env={}, overrides=env or {})
    plan = plan_spec(load_model(model), fake_capabilities(product, aiter), tp, ep, runtime=rt)
    return _moe(plan), plan.caps, rt


def _dispatch(d, caps, pad, env, tokens, **assume):
    return ad.plan_dispatch(d.layer, caps, tokens=tokens, env=env, padding=pad,
                            assumptions=Assumptions(**assume) if assume else Assumptions.from_engine_env(d.layer, env))


@pytest.fixture(scope="module")
def dsv4_384():
    """DeepSeek-V4-Pro TP8 on MI355X / AITER 0.1.20.post1 at 7168 × 384/rank (MXFP4 W4A8, the fused shared expert
    off and on): bf16 decode activations run CK-Tile stage 2 for tokens 1–8 (ROCm/aiter#5233, wrong output), whose
    workaround AITER_BF16_FP8_MOE_BOUND=0 quantizes the activations at every bucket."""
    out = {}
    for fused in (False, True):
        d, caps, rt = _runtime_moe("DeepSeek-V4-Pro", "MI355X", A20, 8, env=FUSED if fused else None)
        pad = Padding(hidden=7168, intermediate_per_rank=384)
        env, tokens = rt.env_dict, rt.serving_buckets()
        out[fused] = (d, caps, pad, _dispatch(d, caps, pad, env, tokens), env, tokens)
    return out


@pytest.mark.parametrize("fused", [False, True])
def test_switches_names_every_family_aiter_runs_under_the_switch(dsv4_384, fused):
    """The suggestion lists, in bucket order, the families AITER's dispatch runs at every serving bucket with the
    switch exported — keyed as the engine calls AITER: with VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS the shared
    expert is folded in (E + 1, top-k + 1, the key DeepSeek's tuned rows are for), and other rows decide."""
    d, caps, pad, dp, env, tokens = dsv4_384[fused]
    assert [(h.issue, h.tokens, h.workaround_env) for h in dp.issues] == [
        ("ROCm/aiter#5233", (1, 8), (("AITER_BF16_FP8_MOE_BOUND", "0"),))]
    switched = {**env, "AITER_BF16_FP8_MOE_BOUND": "0"}
    again = _dispatch(d, caps, pad, switched, tokens, fused_shared_expert=fused)
    families = list(dict.fromkeys(s.family for s in again.steps))
    other = _dispatch(d, caps, pad, switched, tokens, fused_shared_expert=not fused)
    assert len(families) >= 2 and families != list(dict.fromkeys(s.family for s in other.steps))
    assert rt_mod._switches(d.layer, caps, pad, dp, env, tokens) == (
        f"; with AITER_BF16_FP8_MOE_BOUND=0 AITER runs 384/rank correctly at every bucket ({', '.join(families)}) "
        "— export it to keep this allocation")


def test_switches_does_not_suggest_a_switch_that_leaves_heuristic_kernels():
    """GLM-5-FP8 TP8 on MI300X / AITER 0.1.19.post2 at 6144 × 256: the tuned FLAT ASM rows raise on gfx942 for tokens
    4–8 (ROCm/aiter#4394), worked around by AITER_BYPASS_TUNE_CONFIG=1 — which runs untuned CK heuristics, whose tiles
    no tuned row of this shape vouches for. Below a family table that is no evidence: no switch is suggested."""
    d, caps, rt = _runtime_moe("GLM-5-FP8", "MI300X", "0.1.19.post2", 8)
    pad = Padding(hidden=6144, intermediate_per_rank=256)
    env, tokens = rt.env_dict, rt.serving_buckets()
    dp = _dispatch(d, caps, pad, env, tokens)
    assert [(h.issue, h.workaround_env, h.blocking) for h in dp.issues] == [
        ("ROCm/aiter#4394", (("AITER_BYPASS_TUNE_CONFIG", "1"),), False)]
    bypass = _dispatch(d, caps, pad, {**env, "AITER_BYPASS_TUNE_CONFIG": "1"}, tokens)
    assert not bypass.issues and any(s.basis != "tuned" and s.family != "flydsl" for s in bypass.steps)
    assert rt_mod._switches(d.layer, caps, pad, dp, env, tokens) == ""


def test_a_kept_allocation_under_flydsl_heuristics_names_their_inter_dim_tiles():
    """MiniMax-M3-MXFP8 TP8 on MI355X / AITER 0.1.20.post1: no tuned row, FlyDSL heuristics at every bucket; their
    stage-1 N tile (128) and stage-2 K tile (pick_flydsl_stage2_tile_k: 128, as 384 % 256 != 0) divide 384, so the
    plan keeps 384 below the family table's 512 and says which tiles decide."""
    d, _, _ = _runtime_moe("MiniMax-M3-MXFP8", "MI355X", A20, 8)
    assert (d.backend, d.padding.hidden, d.padding.intermediate_per_rank) == ("aiter-flydsl", 6144, 384)
    note = d.padding.notes[0]
    assert note.source == f"{rt_mod._DISPATCH_SOURCE}; {ad.FLYDSL_TILE_SOURCE}"
    assert note.kind == "padding" and note.text == (
        "no padding (not the family table's 6144 × 512): every kernel AITER 0.1.20.post1 dispatches for tokens "
        "1–8192 tiles 6144 × 384 — FlyDSL heuristic kernels run tokens 1–8192 with inter_dim tiles that divide it "
        "(stage-1 tile_n 128, stage-2 tile_k 128)")


def test_an_aiter_refusal_is_reported_under_its_own_issue_id():
    """Kimi-K3-MXFP4 at EP8 on MI355X: AITER raises NotImplementedError for a16w4 SiTUv2 under expert parallelism at
    every token count, and no environment makes that call run. The rejection carries the hit's id (aiter-raises),
    its source (aiter/fused_moe.py) and confidence, so a reader can tell it from a known kernel bug."""
    d, caps, rt = _runtime_moe("Kimi-K3-MXFP4", "MI355X", A20, 8, ep=8)
    dp = ad.plan_dispatch(d.layer, caps, tokens=(1, 64), env={})
    (hit,) = dp.issues
    assert (hit.issue, hit.raises, hit.blocking) == ("aiter-raises", True, True)
    (r,) = rt_mod.blocking_reasons(dp)
    assert (r.kind, r.issue, r.source, r.confidence) == ("failed", "aiter-raises", hit.source, "confirmed")
    assert r.text.startswith("AITER cannot run this layer for tokens 1–64 (bucket 1): AITER refuses this call: "
                             "NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 is not supported")
