"""Survivors of the mutation run in engines/choice.py, engines/layout.py, engines/lint.py, engines/paths.py and
engines/recipes.py: each test pins, on a real model / target / engine release (or the smallest launch that shows it),
the rule the mutated line decides, with the expected value derived from the rule's source (the engine's own code,
config.json, capability_db)."""

from __future__ import annotations

import json

import pytest

from moedispatch import UsageError
from test_engine_mutants import _named
from moedispatch.core.costs import Cost
from moedispatch.core.layers import QuantSpec
from moedispatch.core.reason import Reason
from moedispatch.core.workload import Runtime
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.engines import recipes
from moedispatch.engines.layout import GIB, attention_heads, realize_layout, weight_bytes_per_rank
from moedispatch.engines.lint import lint_launch, parse_launch, unknown_options
from moedispatch.engines.paths import LaunchPath
from moedispatch.plan.plan import plan_model as plan_spec
from moedispatch.selector.plugins import build_registry
from moedispatch.sources.models import load_model
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"
ON = {"VLLM_ROCM_USE_AITER": "1"}


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def _caps(gfx):
    return capdb.target_capabilities(gfx, None)


# -- engines/choice.py: _data (a release the engine model does not cover) ----------------------------------------------

def test_an_unmodelled_engine_release_points_at_the_recipes_that_cover_it():
    """The engine model covers only vLLM 0.33.0; capability_db/engines.toml's [vllm] releases (0.23.0 … 0.33.0) are
    what --recipe covers: asking the model for vLLM 0.25.0 says so and names the recipe range from that list."""
    releases = capdb.load_toml("engines.toml")["vllm"]["releases"]
    with pytest.raises(UsageError) as exc:
        ec.engine_choice("vllm", "0.25.0", caps=_caps("gfx950"), hidden_size=2048, intermediate_size=768,
                         num_experts=128, top_k=8)
    assert str(exc.value) == (
        "no model of vllm 0.25.0: capability_db/engines knows vllm 0.33.0 (a recipe for it: --recipe vllm "
        f"--engine-version 0.25.0; recipes cover vllm {releases[0]} … {releases[-1]})")
    assert (releases[0], releases[-1]) == ("0.23.0", "0.33.0")


# -- engines/choice.py: _vllm_allocation (create_weights' block_k check) -----------------------------------------------

def test_vllm_block_k_refusal_cites_the_weight_block_validation_not_the_oracle():
    """Fp8MoEMethod.create_weights raises from validate_fp8_block_shape_moe (fp8_utils.py) when the down projection's
    input shard (96) is not a whole block_k (128): 32x128 blocks on a 7000-wide layer cannot be refined (gcd 8), so
    vLLM raises on TRITON — and the refusal cites the [padding.fp8_block] source (fp8_utils.py), not the oracle."""
    c = ec.engine_choice("vllm", caps=_caps("gfx950"), env={}, hidden_size=7000, intermediate_size=96 * 8, tp_size=8,
                         num_experts=128, top_k=8, weight_quant="fp8", weight_granularity="block32x128",
                         activation_quant="fp8", activation_granularity="group128")
    assert (c.backend, c.stage) == ("TRITON", "create_weights")
    doc = capdb.load_toml("engines/vllm.toml")
    assert c.reasons[0] == Reason("vLLM 0.33.0 refuses the layer: The input_size of down's weight = 96 is not "
                                  "divisible by weight quantization block_k = 128.", "failed",
                                  doc["padding"]["fp8_block"]["source"])
    assert "fp8_utils.py (validate_fp8_block_shape_moe)" in c.reasons[0].source
    assert c.reasons[0].source != doc["oracle"]["fp8"]["source"]


# -- engines/choice.py: compare_decision (aiter.fused_moe judged by moedispatch's AITER families only) ----------------

def test_aiter_fused_moe_wrong_verdict_cites_only_the_aiter_families_rejections():
    """vLLM's AITER runs aiter.fused_moe; moedispatch did not check aiter-ck itself but rejected aiter-cktile: the
    verdict is 'wrong' with aiter-cktile's first failed reason. Another non-AITER backend moedispatch rejected
    (here a plugin 'my-gemm') says nothing about aiter.fused_moe and is not cited."""
    triton = build_registry().get("triton")
    plan = plan_spec(load_model("Qwen3-30B-A3B"), fake_capabilities("MI355X", A20), 8, 1,
                     backends=(triton, _named("aiter-cktile", False), _named("my-gemm", False)), force="triton")
    d = _moe(plan)
    assert d.backend == "triton" and d.rejection("aiter-ck") is None
    assert [(r.backend, r.supported) for r in d.rejected] == [("aiter-cktile", False), ("my-gemm", False)]
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON)
    assert c.family == "aiter-ck"
    out = ec.compare_decision(d, c)
    assert out["verdict"] == "wrong" and out["why"] == ["aiter-cktile cannot"]


# -- engines/layout.py: _raw_config and realize_layout (attention heads from config.json) ----------------------------

#: A small MoE checkpoint whose text model sits under ``language_config`` (multimodal wrappers, e.g. DeepSeek-VL2):
#: 24 attention heads, 6 KV heads.
WRAPPED = {"model_type": "wrapper", "architectures": ["WrapperForConditionalGeneration"],
           "language_config": {"model_type": "mixtral", "hidden_size": 1024, "num_hidden_layers": 4,
                               "intermediate_size": 512, "num_local_experts": 8, "num_experts_per_tok": 2,
                               "num_attention_heads": 24, "num_key_value_heads": 6, "vocab_size": 32000}}


def test_attention_heads_are_read_from_a_language_config_alone(tmp_path):
    """A checkpoint whose text part is only under language_config (no text_config, no llm_config): its heads are
    read there (24 / 6), and TP 16 is refused as the engine does ('Total number of attention heads (24) must be
    divisible by tensor parallel size (16)')."""
    (tmp_path / "config.json").write_text(json.dumps(WRAPPED))
    spec = load_model(str(tmp_path))
    assert attention_heads(spec) == (24, 6)
    from moedispatch.engines.recipes import engine_data

    eng = engine_data("vllm")["vllm"]
    plan = plan_spec(spec, fake_capabilities("MI300X", A20), 16, 1)
    layout = realize_layout(plan, "vllm", eng)
    assert [r.text for r in layout.errors] == [
        f"{spec.name} has 24 attention heads: not divisible by TP 16 (the engine refuses: 'Total number of attention "
        "heads (24) must be divisible by tensor parallel size (16)')"]


def test_kv_heads_neither_divided_nor_replicated_by_tp_are_refused_with_the_counts(tmp_path):
    """24 attention heads divide by TP 4, but 6 KV heads neither divide by 4 nor is 4 a multiple of 6: the engine
    can neither split nor replicate them per rank; the refusal names the model, both counts and why."""
    (tmp_path / "config.json").write_text(json.dumps(WRAPPED))
    spec = load_model(str(tmp_path))
    from moedispatch.engines.recipes import engine_data

    eng = engine_data("vllm")["vllm"]
    plan = plan_spec(spec, fake_capabilities("MI300X", A20), 4, 1)
    layout = realize_layout(plan, "vllm", eng)
    assert layout.errors == [Reason(f"{spec.name} has 6 KV heads: TP 4 neither divides them nor is a multiple of them "
                                    "(KV heads are split or replicated per rank)", "failed",
                                    eng.get("heads_source", eng.get("layout_source", eng.get("source"))))]


# -- engines/lint.py: _engine_of, _int, _ray_env_findings, unknown_options -------------------------------------------

def test_only_vllm_or_sglang_serve_is_an_engine_launch():
    """`<x> serve` is an engine launch only when x is vllm or sglang: `ollama serve MODEL` is not one (lint refuses
    it), while `sglang serve MODEL` is SGLang with its arguments after `serve`."""
    with pytest.raises(UsageError, match=r"^not a vLLM or SGLang launch: 'ollama serve Qwen3-30B-A3B'"):
        parse_launch(argv=["ollama", "serve", "Qwen3-30B-A3B"])
    launch = parse_launch(argv=["sglang", "serve", "--model-path", "Qwen3-30B-A3B", "--tp-size", "8"])
    assert (launch.engine, launch.model, launch.flags["tp"]) == ("sglang", "Qwen3-30B-A3B", "8")


def test_a_non_integer_tp_is_a_usage_error_naming_the_flag_and_value():
    """`--tensor-parallel-size eight`: lint cannot plan a layout; the error says which setting and what it got."""
    launch = parse_launch(argv=["vllm", "serve", "Qwen3-30B-A3B", "--tensor-parallel-size", "eight"])
    with pytest.raises(UsageError) as exc:
        lint_launch(launch, target="MI300X", aiter_version=A20)
    assert str(exc.value) == "the launch's tensor-parallel size must be an integer, got 'eight'"
    launch = parse_launch(argv=["vllm", "serve", "Qwen3-30B-A3B", "--tensor-parallel-size", "$TP"])
    with pytest.raises(UsageError) as exc:   # a script variable nothing set: say so and how to give it
        lint_launch(launch, target="MI300X", aiter_version=A20)
    assert str(exc.value) == ("the launch's tensor-parallel size must be an integer, got '$TP' — a variable the "
                              "launch does not set? give it with --env NAME=VALUE")


def test_ray_dp_warns_about_an_aiter_variable_the_launch_sets_even_when_the_plan_does_not_need_it():
    """gpt-oss-120b TP8 DP2 on MI300X with --data-parallel-backend ray: the plan's path is not AITER's dispatcher, so
    the recipe exports no AITER variable; AITER_LOG_MORE=1, which the launch sets, still does not reach the remote
    ranks (Ray copies only VLLM_, … prefixes): a warning names it as the launch's."""
    argv = ["env", "AITER_LOG_MORE=1", "vllm", "serve", "gpt-oss-120b", "--tensor-parallel-size", "8",
            "--data-parallel-size", "2", "--data-parallel-backend", "ray"]
    doc = lint_launch(parse_launch(argv=argv), target="MI300X", aiter_version=A20)
    ray = [f for f in doc["findings"] if f["message"].startswith("--data-parallel-backend ray:")]
    assert len(ray) == 1 and ray[0]["severity"] == "warning"
    assert "from this shell: AITER_LOG_MORE (the launch sets it) will not reach the remote ranks" in ray[0]["message"]
    assert ray[0]["fix"] == "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=AITER_"


def test_an_option_after_a_flag_is_still_checked():
    """argparse: a flag option (--enable-expert-parallel) takes no value, so the token after it is the next option;
    a misspelled one there is rejected (vLLM 0.33.0's parser: 'unrecognized arguments')."""
    launch = parse_launch(argv=["vllm", "serve", "Qwen3-30B-A3B", "--enable-expert-parallel",
                                "--tensor-paralel-sise", "8"])
    bad = [tok for tok, _ in unknown_options(launch, "0.33.0")]
    assert bad == ["--tensor-paralel-sise"]


# -- engines/paths.py: LaunchPath.summary --------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, word", [(1, "token"), (2, "tokens"), (256, "tokens")])
def test_a_paths_summary_says_token_in_the_singular_only_for_one(tokens, word):
    """The one-line summary gives the MoE total at the largest planned token count: '1 token', '2 tokens'."""
    cost = Cost(tokens, 41.0, 35.0, 48.0, "tuned")
    p = LaunchPath(("--moe-backend", "aiter"), (("VLLM_ROCM_USE_AITER", "1"),), ("aiter-ck",), "aiter-ck",
                   costs=(cost,), families=("ck",))
    assert p.summary() == (f"VLLM_ROCM_USE_AITER=1 --moe-backend aiter: AITER runs ck; MoE total 41 µs (35–48) at "
                           f"{tokens} {word}")


# -- engines/recipes.py: _layout, _name_after_what_runs, converted_plan -----------------------------------------------

def test_the_recipes_layout_weighs_the_experts_at_the_launched_backends_allocation():
    """Qwen3.5-397B-A17B-MXFP4 TP16 on MI355X, vLLM 0.33.0: the plan's first choice (aiter-ck, vLLM allocates
    4096 × 128) is not realizable and the recipe (no alternatives) launches EMULATION, which vLLM allocates at the
    MXFP4 block of 32: 4096 × 64. The layout's weights per rank are the emulation's, not aiter-ck's."""
    plan = plan_spec(load_model("Qwen3.5-397B-A17B-MXFP4"), fake_capabilities("MI355X", A20), 16, 1)
    assert _moe(plan).backend == "aiter-ck"
    r = recipes.build_recipe(plan, "vllm", alternatives=False)
    assert r.ok and r.backend == "emulation"
    assert r.layout.weights_gib == weight_bytes_per_rank(plan, (4096, 64)) / GIB
    assert r.layout.weights_gib != weight_bytes_per_rank(plan, (4096, 128)) / GIB


def test_a_launch_named_after_a_family_aiter_does_not_run_lists_each_family_once():
    """Kimi-K2.5-MXFP4 TP8 planned with aiter-asm only: at vLLM's allocation AITER runs FlyDSL stage 1 with CK stage
    2 ('flydsl+ck') at some buckets and FlyDSL at others — never ASM. The warning lists the families that run, each
    once (flydsl, ck), not the per-bucket combinations."""
    asm = build_registry().get("aiter-asm")
    plan = plan_spec(load_model("Kimi-K2.5-MXFP4"), fake_capabilities("MI355X", A20), 8, 1, backends=(asm,),
                     runtime=Runtime.build(env={}))
    r = recipes.build_recipe(plan, "vllm")
    assert r.ok and r.backend == "aiter-asm"
    assert [x["families"] for x in r.runs] == [["flydsl+ck", "flydsl"]]
    assert Reason("the launch is aiter.fused_moe: at vllm's allocation AITER runs flydsl, ck, not asm; 'aiter-asm' "
                  "names the family whose rules moedispatch checked the allocation against", "warning") in r.warnings


def test_sglangs_converted_block_fp8_activations_have_fp32_scales():
    """SGLang re-quantizes MXFP8 experts to block-FP8 at load on gfx942 and quantizes activations per 128-element
    token group at run time with fp32 scales (per_token_group_quant_fp8): the converted plan's activations are
    fp8/group128, dynamic, fp32-scaled — as every other non-MX QuantSpec (never an unset scale dtype)."""
    plan = plan_spec(load_model("MiniMax-M3-MXFP8"), fake_capabilities("MI300X", A20), 8, 1)
    converted, conv = recipes.converted_plan(plan, "sglang")
    layer = _moe(converted).layer
    assert layer.act == QuantSpec("fp8", "group128", scale_dtype="fp32", dynamic=True)
    assert layer.weight == QuantSpec("fp8", "block128x128", scale_dtype="fp32")
