"""Survivors of the seed-13 mutation run in engines/choice.py, engines/layout.py, engines/lint.py and
engines/recipes.py: each test pins, on a real model / target / engine release (or the smallest launch that shows it),
the rule the mutated line decides — the default release of the engine model, the serving buckets the engine's
allocation is dispatched at, vLLM's reading of --moe-backend values the ROCm build does not have, a partition's share
of its own product's HBM, the lint's pad warning, fix-line quoting, the switch's stated value and CU_NUM under Ray,
the family SGLang serves its converted experts on, which warnings a converted plan carries, and the recipe header's
partition — with the expected value derived from the rule's source (the engine's own code, capability_db)."""

from __future__ import annotations

import json
import shlex

from moedispatch.core.reason import Reason
from moedispatch.core.workload import SERVING_BUCKETS, Runtime
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.engines import recipes
from moedispatch.engines.layout import product_memory_gib
from moedispatch.engines.lint import lint_launch, parse_launch
from moedispatch.plan.plan import plan_model as plan_spec
from moedispatch.sources.models import load_model
from moedispatch.testing import fake_capabilities
from test_engine_mutants import A20, ON, _caps, _compare, _kimi_int4, _moe, _plan, _row
from test_lint_mutants import _disable, _newest_aiter  # noqa: F401 - autouse: empty HF cache, clean env

FP8_SRC = "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/fp8.py"
MXFP4_SRC = "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
NOT_ROCM = "kernel does not support current device (not a ROCm backend)"


def _lint(argv, target="MI355X", aiter=A20):
    return lint_launch(parse_launch(argv=argv), target=target, aiter_version=aiter)


# -- engines/choice.py: _data (the default release) -------------------------------------------------------------------

def test_the_default_engine_release_is_the_newest_by_version_not_by_string(monkeypatch):
    """'The newest release is the default' (choice.ENGINES): newest by version order. With SGLang 0.5.9 and 0.5.23
    both modelled, the default is 0.5.23 — as strings '0.5.9' sorts after '0.5.23', a release the capability_db
    model (versions >=0.5.23,<0.5.24) does not cover."""
    monkeypatch.setitem(ec.ENGINES, "sglang", {"0.5.9": "engines/sglang.toml", "0.5.23": "engines/sglang.toml"})
    c = ec.engine_choice("sglang", caps=_caps("gfx950"), env={}, hidden_size=2048, intermediate_size=768,
                         tp_size=1, num_experts=128, top_k=8)
    assert (c.version, c.backend) == ("0.5.23", "TRITON")


# -- engines/choice.py: _engine_allocation_hits (every serving bucket) ------------------------------------------------

def test_the_engines_allocation_hit_spans_every_serving_bucket_it_covers():
    """MiniMax-M3-MXFP4 TP8 on MI355X: vLLM 0.33.0 allocates 6144 × 384, where AITER's dispatcher runs the CK-Tile
    stage-2 heuristic kernel (ROCm/aiter#5233) for every serving bucket from 1 to 128 (SERVING_BUCKETS: the powers of
    two to 8192). The hit names that whole span, not the span of the five default planning counts (1, 4, 64, …)."""
    assert SERVING_BUCKETS[:9] == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    _, [c] = _compare("MiniMax-M3-MXFP4")
    assert c["verdict"] == "wrong"
    assert c["why"][0] == (
        "at the 6144 × 384 the engine allocates, AITER's dispatcher runs cktile_moe_stage2 (default) for tokens 1–128 "
        "(bucket 1): silently wrong MoE output (stage-2 rel. L2 error 10.3 at inter_dim 384, 8.0 at 640; measured at "
        "E=256/top-8 and E=129/top-5, aiter 0.1.19) (https://github.com/ROCm/aiter/issues/5233)")


# -- engines/choice.py: _vllm_fp8_block, _vllm_wna16, _VllmCall.backend_key (--moe-backend values) -------------------

def test_vllm_fp8_forced_cuda_backend_on_an_unaligned_shard_pads_then_refuses():
    """Qwen3-235B-A22B-Instruct-2507-FP8 TP8 on MI300X: 128x128 FP8 blocks, a 192-wide shard (refinable to 64x64).
    --moe-backend deep_gemm maps to DEEPGEMM, which has no ROCm expert class: it cannot take refined blocks, so
    oracle/fp8.py pads the shard to whole 128-blocks (192 → 256) for the forced backend, then raises because DEEPGEMM
    does not run on this device."""
    plan = _plan("Qwen3-235B-A22B-Instruct-2507-FP8", product="MI300X")
    d = _moe(plan)
    assert (d.layer.intermediate_per_rank, d.layer.weight.block) == (192, (128, 128))
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, moe_backend="deep_gemm",
                            quant_method=plan.model.quant_method)
    msg = f"FP8 MoE backend DEEPGEMM does not support the deployment configuration since {NOT_ROCM}."
    assert _row(c) == ("vllm", "0.33.0", "deep_gemm", "DEEPGEMM", None, None, None, msg, "select", None)
    assert c.reasons == (
        Reason(f"vLLM 0.33.0 refuses the layer: {msg}", "failed", FP8_SRC),
        Reason("vLLM pads the TP shard to whole 128-blocks for the forced backend (192 → 256)", "padding", FP8_SRC),
        Reason(f"DEEPGEMM: {NOT_ROCM}", "failed", FP8_SRC))


def test_vllm_wna16_reads_a_dashed_moe_backend_as_underscores():
    """vLLM normalizes --moe-backend values (dashes are underscores) for every oracle, the WNA16 one included:
    Kimi-K2.5's INT4 experts with --moe-backend flashinfer-trtllm are forced onto FLASHINFER_TRTLLM, exactly as with
    flashinfer_trtllm (oracle/int_wna16.py map_wna16_backend), not refused as an unknown value."""
    dashed, plain = _kimi_int4(mb="flashinfer-trtllm"), _kimi_int4(mb="flashinfer_trtllm")
    assert _row(dashed) == _row(plain) == ("vllm", "0.33.0", "flashinfer_trtllm", "FLASHINFER_TRTLLM", None, 7168,
                                           2048, None, None, "TrtLlmMxint4ExpertsMonolithic")
    assert dashed.reasons[0].text == "vLLM 0.33.0 picks FLASHINFER_TRTLLM (forced by --moe-backend flashinfer_trtllm)"


def test_vllm_mxfp4_w4a4_forced_marlin_is_kept_as_a_bf16_activation_backend_and_refused():
    """MiniMax-M3-MXFP4 (Quark MXFP4 W4A4) TP8 on MI355X with --moe-backend marlin: MARLIN is a W4A16 backend
    (no activation key in the engine model: bf16 activations), so _filter_by_activation keeps it after the (absent)
    W4A4 ones; vLLM then raises because MARLIN has no ROCm kernel — never an empty backend list."""
    plan = _plan("MiniMax-M3-MXFP4")
    d = _moe(plan)
    assert (d.layer.weight.dtype, d.layer.act.dtype) == ("mxfp4", "mxfp4")
    c = ec.choice_for_layer(d.layer, plan.caps, "vllm", env=ON, moe_backend="marlin",
                            quant_method=plan.model.quant_method)
    msg = f"MXFP4 MoE backend MARLIN does not support the deployment configuration since {NOT_ROCM}."
    assert _row(c) == ("vllm", "0.33.0", "marlin", "MARLIN", None, None, None, msg, "select", None)
    assert c.rejected == (("MARLIN", NOT_ROCM),)
    assert c.reasons[0] == Reason(f"vLLM 0.33.0 refuses the layer: {msg}", "failed", MXFP4_SRC)


# -- engines/layout.py: product_memory_gib (the product's own partition modes) -----------------------------------------

def test_a_partition_of_mi300a_gets_its_own_products_share_of_hbm():
    """capability_db/gpus.toml: MI300A (228 CUs, 128 GiB) has its own modes SPX/TPX/CPX (1/3/6), not gfx942's
    SPX/DPX/QPX/CPX (1/2/4/8) of MI300X. A TPX rank gets a third of 128 GiB, a CPX rank a sixth: gpt-oss-120b at TP 1
    (~68 GiB of weights) fits a whole MI300A but not a TPX partition's 39 GiB."""
    assert capdb.partitions_for("gfx942", "MI300A") == {"SPX": 1, "TPX": 3, "CPX": 6}
    assert product_memory_gib(fake_capabilities("MI300A:TPX", A20)) == (
        "MI300A TPX partition (1/3 of the device's HBM)", 128 / 3)
    assert product_memory_gib(fake_capabilities("MI300A:CPX", A20)) == (
        "MI300A CPX partition (1/6 of the device's HBM)", 128 / 6)
    model = load_model("gpt-oss-120b")
    assert recipes.build_recipe(plan_spec(model, fake_capabilities("MI300A", A20), 1, 1), "vllm",
                                alternatives=False).ok
    r = recipes.build_recipe(plan_spec(model, fake_capabilities("MI300A:TPX", A20), 1, 1), "vllm", alternatives=False)
    assert not r.ok
    fit = next(x for x in r.refusals if x.text.startswith("weights do not fit"))
    assert fit.text == ("weights do not fit: ~68 GiB per rank vs 39 GiB usable on one MI300A TPX partition (1/3 of the "
                        "device's HBM) (43 GiB × 0.92 --gpu-memory-utilization default) at tp=1 ep=1")


# -- engines/lint.py: _family_findings, _fix_from_launch, _moe_findings, _ray_env_findings ---------------------------

def test_lint_warns_about_the_kernel_pads_vllm_passes_to_the_family_it_runs():
    """gpt-oss-120b TP8 on MI355X with AITER 0.1.15 (FlyDSL reads its pad arguments from 0.1.15, ROCm/aiter#3184):
    the plan allocates what vLLM allocates (3072 × 512) but hands FlyDSL hidden_pad 192 and intermediate_pad 0 (the
    aiter-pr#3538 workaround); vLLM passes hidden_pad // 128 * 128 = 128 and intermediate_pad // 64 * 64 = 128
    (experts/rocm_aiter_moe.py). The launch runs AITER, so lint says so as a warning with the fix line."""
    argv = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "gpt-oss-120b", "--tensor-parallel-size", "8"]
    doc = _lint(argv, aiter="0.1.15")
    pads = [f for f in doc["findings"] if "passes hidden_pad" in f["message"]]
    assert pads == [{
        "severity": "warning",
        "message": "vllm 0.33.0 passes hidden_pad=128, intermediate_pad=128 to aiter.fused_moe; the plan needs 192, 0 "
                   "for aiter-flydsl",
        "source": "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py; "
                  "vllm-project/vllm#44679",
        "fix": "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 vllm serve gpt-oss-120b --tensor-parallel-size 8 "
               "--moe-backend aiter"}]


#: MiniMax-M3-MXFP8 TP4 on MI355X with AITER's switch set off and a JSON --compilation-config (a value with spaces,
#: braces and quotes).
SWITCH_OFF = ["VLLM_ROCM_USE_AITER=0", "vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "4",
              "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']


def test_a_switch_set_off_is_named_with_its_value_in_the_slower_warning():
    """VLLM_ROCM_USE_AITER=0 (the launch sets it, to off) is said as it stands — 'VLLM_ROCM_USE_AITER=0' — not as
    'unset': the fix is the same (export it as 1), but the user must see that their own setting is the cause."""
    (slow,) = [f for f in _lint(SWITCH_OFF)["findings"] if "silently slower" in f["message"]]
    assert slow["message"] == ("VLLM_ROCM_USE_AITER=0: vllm runs the MoE on triton while the plan's correct fastest "
                               "path is aiter-flydsl (AITER) — silently slower")


def test_a_lint_fix_line_keeps_the_shell_quoting_of_the_users_arguments():
    """The fix is the user's own command with the recipe's changes, to paste into a shell: the JSON value of
    --compilation-config is quoted (shlex.quote), so the pasted line gives vLLM the same single argument."""
    (slow,) = [f for f in _lint(SWITCH_OFF)["findings"] if "silently slower" in f["message"]]
    recipe = ("VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 "
              "VLLM_USE_BREAKABLE_CUDAGRAPH=0 vllm serve MiniMaxAI/MiniMax-M3-MXFP8 --tensor-parallel-size 4 "
              "--compilation-config '{\"cudagraph_mode\": \"PIECEWISE\"}' --moe-backend aiter --attention-backend "
              "TRITON_ATTN")
    assert slow["fix"] == ("write VLLM_ROCM_USE_AITER=1 for VLLM_ROCM_USE_AITER=0 before the command; the full "
                           "recipe: " + recipe)
    words = shlex.split(recipe)
    assert words[words.index("--compilation-config") + 1] == '{"cudagraph_mode": "PIECEWISE"}'


def test_ray_dp_warns_that_cu_num_set_by_the_launch_does_not_reach_the_remote_ranks():
    """AITER keys its tuned lookup on CU_NUM when set (aiter/jit/utils/chip_info.py get_cu_num): a launch on MI355X
    CPX partitions (32 CUs) that sets CU_NUM=32 with --data-parallel-backend ray loses it on the remote ranks (Ray
    copies only VLLM_, … prefixes, vllm/ray/ray_env.py): a warning names it as the launch's, with the prefix to copy."""
    argv = ["CU_NUM=32", "vllm", "serve", "gpt-oss-120b", "--tensor-parallel-size", "8", "--data-parallel-size", "2",
            "--data-parallel-backend", "ray"]
    doc = _lint(argv, target="MI355X:CPX")
    ray = [f for f in doc["findings"] if f["message"].startswith("--data-parallel-backend ray:")]
    assert len(ray) == 1 and ray[0]["severity"] == "warning"
    assert "from this shell: CU_NUM (the launch sets it) will not reach the remote ranks" in ray[0]["message"]
    assert ray[0]["fix"] == "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=CU_"


# -- engines/recipes.py: converted_plan (the conversion's family), render_recipe (the partition) ----------------------

def test_sglangs_converted_block_fp8_experts_are_planned_on_triton(tmp_path):
    """SGLang 0.5.23 re-quantizes MXFP8 experts to block-FP8 at load on gfx942 and serves them on its Triton runner
    only (capability_db/engines.toml [[sglang.conversion]] family/runner "triton", sgl-project/sglang#35272). An MXFP8
    checkpoint of Qwen3-30B-A3B (SiLU experts, which aiter-ck would otherwise take as block-FP8) on MI300X: the
    converted plan is forced onto triton, and the recipe launches --moe-runner-backend triton with AITER off."""
    cfg = dict(capdb.load_json("models/Qwen3-30B-A3B.json")["config"])
    cfg["quantization_config"] = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
                                  "ignored_layers": ["lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = plan_spec(load_model(str(tmp_path)), fake_capabilities("MI300X", A20), 8, 1)
    assert _moe(plan).backend == "emulation"
    converted, conv = recipes.converted_plan(plan, "sglang")
    assert (conv["family"], conv["runner"]) == ("triton", "triton")
    d = _moe(converted)
    assert d.backend == "triton" and d.layer.weight.describe() == "fp8/block128x128"
    assert _moe(plan_spec(converted.model, plan.caps, 8, 1)).backend == "aiter-ck"  # what an unforced plan would pick
    r = recipes.build_recipe(plan, "sglang")
    assert r.ok and r.backend == "triton"
    assert "--moe-runner-backend triton" in [a["arg"] for a in r.args]
    assert [(e["name"], e["value"]) for e in r.env] == [("SGLANG_USE_AITER", "0")]


def test_a_converted_plan_states_the_runtimes_env_notes_in_their_own_place(monkeypatch):
    """MiniMax-M3-MXFP8 TP8 on MI300X for SGLang (MXFP8 → block-FP8 at load) with a mistyped
    MOEDISPATCH_DISABLE_PLUGINS (a plugin error every plan reports) and AITER_ONLINE_TUNE=yes (AITER reads only "1":
    a note of the runtime). The original plan under the same runtime says that note itself, so it is not the caller's
    to carry: the converted plan (and the recipe) state it where any plan does — after the plugin error."""
    _disable(monkeypatch, "aiter-ckk")
    rt = Runtime.build(env={"AITER_ONLINE_TUNE": "yes"})
    plan = plan_spec(load_model("MiniMax-M3-MXFP8"), fake_capabilities("MI300X", A20), 8, 1, runtime=rt)
    note = ("AITER_ONLINE_TUNE='yes': AITER compares it with \"1\", so this value means off (AITER treats only \"1\" "
            "as on)")
    assert plan.warnings[0].text.startswith("plugin error: MOEDISPATCH_DISABLE_PLUGINS: names no installed plugin: "
                                            "'aiter-ckk'")
    assert plan.warnings[1].text == note
    converted, _ = recipes.converted_plan(plan, "sglang")
    assert converted.warnings[:2] == plan.warnings[:2]
    assert recipes.build_recipe(plan, "sglang").warnings[:2] == list(plan.warnings[:2])


def test_the_recipe_header_names_the_compute_partition():
    """A recipe for one CPX partition of an MI300X (38 of 304 CUs) says so in its first line, as the target does."""
    plan = plan_spec(load_model("gpt-oss-20b"), fake_capabilities("MI300X:CPX", A20), 1, 1)
    head = recipes.render_recipe(plan, "sglang").splitlines()[0]
    assert head == (f"# sglang 0.5.23 recipe for gpt-oss-20b on gfx942 (MI300X), CPX partition (38 CUs), AITER {A20}, "
                    f"tp=1 ep=1 (plan {plan.fingerprint})")
