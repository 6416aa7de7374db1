"""Issue 7: engine API equivalence with explain, launch recipes with reasons, operator logs."""

from __future__ import annotations

import json

from moedispatch.engine import plan_model, select_moe_backend
from moedispatch.explain import plan_to_json


def test_vllm_fused_moe_fields_give_the_same_decision_as_explain(caps):
    """The values vLLM's FusedMoE holds for MiniMax-M3-MXFP4 at TP8 (vllm.md §15.1) -> same Decision as explain."""
    c = caps("gfx950", "0.1.15.post3")
    plan = plan_model("MiniMax-M3-MXFP4", c, tp=8)
    explained = plan_to_json(plan)["layers"][3]
    d = select_moe_backend(
        caps=c, hidden_size=6144, intermediate_size=3072, num_experts=128, top_k=4, tp_size=8, ep_size=1,
        weight_quant="mxfp4", activation_quant="mxfp4", activation="swigluoai_uninterleave", swiglu_alpha=1.702,
        swiglu_limit=7.0, has_bias=False, model="MiniMax-M3-MXFP4", model_type="minimax_m3_vl", index=3)
    assert d.to_dict() == {k: explained[k] for k in ("backend", "padding", "reasons", "reason_details", "rejected",
                                                     "aiter_dispatch", "cost")}
    # vLLM spellings are aliases
    d2 = select_moe_backend(caps=c, hidden_dim=6144, moe_intermediate_size=3072, global_num_experts=128, topk=4,
                            tp_size=8, weight_quant="mxfp4", activation_quant="mxfp4",
                            activation="swigluoai_uninterleave", model_type="minimax_m3_vl", index=3,
                            model="MiniMax-M3-MXFP4")
    assert d2 == d


def test_plan_fingerprint_is_stable_and_changes_with_the_plan(caps):
    c = caps("gfx950", "0.1.15.post3")
    a = plan_model("MiniMax-M3-MXFP4", c, tp=8).fingerprint
    assert a == plan_model("MiniMax-M3-MXFP4", c, tp=8).fingerprint
    assert a != plan_model("MiniMax-M3-MXFP4", c, tp=4).fingerprint
    assert a != plan_model("MiniMax-M3-MXFP4", caps("gfx942", "0.1.15.post3"), tp=8).fingerprint


def test_vllm_recipe_for_minimax_m3_mxfp4_on_gfx950(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--aiter-version", "0.1.15.post3",
               "--tp", "8", "--recipe", "vllm")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("export VLLM_ROCM_USE_AITER=1", "export VLLM_ROCM_USE_AITER_MOE=1", "--moe-backend aiter",
                   "--tensor-parallel-size 8", "vllm serve amd/MiniMax-M3-MXFP4"):
        assert needle in out
    # every env line is preceded by its reason with a source
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("export "):
            assert lines[i - 1].startswith("# ") and "(" in lines[i - 1]


def test_vllm_recipe_for_minimax_m3_mxfp8_on_mi300x_has_aiter_on_and_mha_off_with_reason(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP8", "--target", "MI300X", "--tp", "8", "--recipe", "vllm",
               "--format", "json")
    data = json.loads(proc.stdout)
    env = {e["name"]: e for e in data["env"]}
    assert env["VLLM_ROCM_USE_AITER"]["value"] == "1"
    assert env["VLLM_ROCM_USE_AITER_MHA"]["value"] == "0"
    assert "q/prob scales" in env["VLLM_ROCM_USE_AITER_MHA"]["why"]
    # both hold at once: the MoE itself has no native MX path on gfx942 and is loudly emulation
    assert data["backend"] == "emulation"
    assert any("run on emulation" in w and "slow reference path" in w for w in data["warnings"])
    assert "--moe-backend auto" in data["command"]  # MXFP8 has no explicit emulation value (vllm.md §3)


def test_recipe_reports_where_the_engine_allocation_misses_the_kernel_alignment(cli):
    """Qwen3-30B-A3B bf16 at TP8: 96/rank; vLLM does not pad bf16 but CK needs 128 (vLLM PR #55368, aiter#5444)."""
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "gfx950", "--tp", "8", "--recipe", "vllm",
               "--format", "json")
    warnings = json.loads(proc.stdout)["warnings"]
    assert any("intermediate/rank 96" in c and "128" in c and "#55368" in c for c in warnings)
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "gfx950", "--tp", "8", "--recipe", "sglang",
               "--format", "json")
    data = json.loads(proc.stdout)
    assert {e["name"]: e["value"] for e in data["env"]} == {"SGLANG_USE_AITER": "1"}
    # SGLang pads AITER MoE to 128 itself (PRs #18684/#21097): no allocation disagreement
    assert not [w for w in data["warnings"] if "allocates" in w]


def test_logs_are_quiet_by_default_even_when_stderr_is_not_a_tty(cli):
    """Issue 16: the level never follows the TTY — without -v a non-TTY stderr gets no per-layer INFO events."""
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--format", "json")
    assert proc.returncode == 0 and "backend_selected" not in proc.stderr
    proc = cli("--log-format", "json", "explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8")
    assert "backend_selected" not in proc.stderr


def test_json_logs_carry_one_event_per_decision(cli):
    proc = cli("-v", "--log-format", "json", "explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8",
               "--format", "json")
    events = [json.loads(line) for line in proc.stderr.splitlines()]
    selected = [e for e in events if e["event"] == "backend_selected"]
    assert sorted(e["layer"] for e in selected) == list(range(3, 60))
    assert all(e["backend"] == "aiter-flydsl" and e["reasons"] and e["padding"]["intermediate_per_rank"] == 512
               for e in selected)
    assert any(e["event"] == "dispatch_planned" for e in events)


def test_engine_accepts_fusedmoe_constructor_arguments_and_per_partition_size(caps):
    """vLLM's FusedMoE(...) arguments pass through; intermediate_size_per_partition is per rank (× MoE TP)."""
    c = caps("gfx950", "0.1.15.post3")
    base = dict(caps=c, hidden_size=4096, num_experts=8, top_k=2, tp_size=8)
    a = select_moe_backend(intermediate_size=14336, **base)
    b = select_moe_backend(intermediate_size_per_partition=1792, params_dtype="bfloat16", dp_size=1,
                           renormalize=True, prefix="model.layers.0.block_sparse_moe.experts", **base)
    assert a == b and a.layer.intermediate == 14336
    import pytest

    from moedispatch.errors import UsageError

    with pytest.raises(UsageError, match="unknown layer field 'hiden_size'"):
        select_moe_backend(hiden_size=1, **{k: v for k, v in base.items() if k != "hidden_size"})
    with pytest.raises(UsageError, match="intermediate must be an integer"):
        select_moe_backend(intermediate_size=3072.5, **base)
    with pytest.raises(UsageError, match="^ep 3 must divide tp 8"):
        select_moe_backend(intermediate_size=14336, ep_size=3, **base)
