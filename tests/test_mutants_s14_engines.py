"""Survivors of the seed-14 mutation run in engines/choice.py, engines/layout.py, engines/lint.py and
engines/recipes.py: each test pins, on a real model / target / engine release, the rule the mutated line decides —
vLLM's warning when VLLM_ROCM_USE_AITER asks for AITER on a GPU its experts refuse, the source of the note that vLLM
refines FP8 scale blocks, a forced --moe-backend with no ROCm expert class on an unaligned FP8 shard, the source of the
weights-leave-little-KV-cache warning, the lint JSON's layout and the recipe header's partition of the target's own
product — with the expected value derived from the rule's source (the engine's own code, capability_db)."""

from __future__ import annotations

import json

from moedispatch import plan_model
from moedispatch.core.reason import Reason
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.engines import recipes
from moedispatch.engines.lint import render_lint
from moedispatch.testing import fake_capabilities
from test_engine_mutants import A20, ON, _moe, _plan, _row
from test_lint_mutants import _newest_aiter  # noqa: F401 - autouse: empty HF cache, clean env
from test_mutants_s13_engines import FP8_SRC, _lint

UNQUANTIZED_SRC = "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/unquantized.py"


# -- engines/choice.py: _vllm_aiter_env (the unquantized oracle warns and falls back) --------------------------------

def test_vllm_warns_and_falls_back_when_the_aiter_switch_asks_for_aiter_on_a_gpu_it_refuses():
    """oracle/unquantized.py: with VLLM_ROCM_USE_AITER=1 AITER is tried first; where its experts cannot run the layer
    vLLM logs a warning and falls back to the rest of its list. Qwen3-30B-A3B (BF16 experts) at TP1 on MI250X (gfx90a,
    which AiterUnquantizedExperts does not support): TRITON runs, and the warning says what was requested, why AITER
    refused and that vLLM warns and falls back — in vLLM's own words and case."""
    plan = plan_model("Qwen3-30B-A3B", fake_capabilities("MI250X", None), 1, 1)
    d = _moe(plan)
    assert (d.layer.weight.dtype, d.layer.act.dtype) == ("bf16", "bf16")
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, quant_method=plan.model.quant_method)
    assert _row(c) == ("vllm", "0.33.0", "auto", "TRITON", "triton", 2048, 768, None, None, "TritonExperts")
    assert c.reasons[1] == Reason("VLLM_ROCM_USE_AITER_MOE=1 was requested, but AITER does not support the layer "
                                  "(kernel does not support current device (aiter_moe)); vLLM warns and falls back",
                                  "warning", UNQUANTIZED_SRC)


# -- engines/choice.py: _vllm_fp8_block (the refined-blocks note, a forced backend with no ROCm class) --------------

def test_vllms_fp8_block_refinement_note_cites_the_fp8_oracle():
    """Qwen3-235B-A22B-Instruct-2507-FP8 TP8 on MI300X (128x128 FP8 blocks, a 192-wide shard): oracle/fp8.py refines
    the scale blocks to gcd(128, 128, 192, 4096) = 64, which only TritonExperts takes; vLLM picks TRITON, and the note
    saying so cites the FP8 oracle it was read from."""
    plan = _plan("Qwen3-235B-A22B-Instruct-2507-FP8", product="MI300X")
    d = _moe(plan)
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env={}, quant_method=plan.model.quant_method)
    assert (c.backend, c.kernel_class, c.intermediate_per_rank) == ("TRITON", "TritonExperts", 192)
    assert Reason("vLLM refines the 128x128 FP8 scale blocks to 64x64 to fit intermediate/rank 192; only Triton "
                  "takes refined blocks", "note", FP8_SRC) in c.reasons


# -- engines/layout.py: realize_layout (weights that leave little KV cache) ----------------------------------------

def test_weights_leaving_little_kv_cache_is_a_warning_citing_the_engines_memory_default():
    """DeepSeek-V3 (FP8, ~671 B parameters) at TP4 on MI300X for vLLM 0.33.0: ~156 GiB of weights per rank fit the
    177 GiB budget (192 GiB × 0.92, --gpu-memory-utilization's default: capability_db/engines.toml memory_source) but
    take more than 80 % of it — a derived warning that cites where the 0.92 comes from."""
    plan = plan_model("DeepSeek-V3", fake_capabilities("MI300X", A20), 4, 1)
    r = recipes.build_recipe(plan, "vllm", alternatives=False)
    assert r.ok and round(r.layout.budget_gib, 2) == 176.64
    (kv,) = [w for w in r.warnings if "for the KV cache" in w.text]
    assert kv == Reason("~156 GiB of weights per rank leave ~20 GiB of the 177 GiB budget on MI300X for the KV cache",
                        "warning", "vllm-project/vllm@v0.33.0:vllm/config/cache.py (gpu_memory_utilization default "
                        "0.92)", None, "derived")


# -- engines/lint.py: render_lint (the JSON layout) ----------------------------------------------------------------

def test_lint_json_is_indented_like_every_json_output():
    """``moedispatch lint --format json`` prints the lint document indented by two spaces, one key a line, as the
    explain and recipe JSON are (a stable layout to diff and read), then a newline."""
    doc = _lint(["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "8"])
    text = render_lint(doc, "json")
    assert json.loads(text) == doc
    assert text == json.dumps(doc, indent=2) + "\n"
    assert text.splitlines()[:3] == ["{", '  "schema": "moedispatch.lint/1",', '  "engine": "vllm",']


# -- engines/recipes.py: render_recipe (the partition of the target's own product) ---------------------------------

def test_the_recipe_header_names_the_partition_mode_of_the_products_own_table():
    """capability_db/gpus.toml: MI300A (228 CUs) partitions SPX/TPX/CPX; a TPX partition has 76 CUs. The recipe's
    first line names it from MI300A's own modes: "TPX partition (76 CUs)" (76 CUs is also an MI300X QPX partition,
    304 / 4 — the product decides)."""
    assert capdb.partitions_for("gfx942", "MI300A") == {"SPX": 1, "TPX": 3, "CPX": 6}
    plan = plan_model("gpt-oss-20b", fake_capabilities("MI300A:TPX", A20), 1, 1)
    head = recipes.render_recipe(plan, "vllm").splitlines()[0]
    assert head == (f"# vllm 0.33.0 recipe for gpt-oss-20b on gfx942 (MI300A), TPX partition (76 CUs), AITER {A20}, "
                    f"tp=1 ep=1 (plan {plan.fingerprint})")
