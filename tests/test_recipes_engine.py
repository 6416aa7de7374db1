"""Issue 7: engine API equivalence with explain, launch recipes with reasons, operator logs."""

from __future__ import annotations

import json

from moedispatch.core.reason import texts

from moedispatch.api import plan_model, select_moe_backend
from moedispatch.render.explain import plan_to_json


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
    """vLLM 0.31 rounds MXFP4 on ROCm to 256/256 (384 -> 512): the AITER plan is realizable as planned."""
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--aiter-version", "0.1.15.post3",
               "--tp", "8", "--recipe", "vllm", "--engine-version", "0.31.0")
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


def test_vllm_033_w4a4_allocation_is_not_printed_as_aiter_where_the_kernel_needs_256(caps):
    """vLLM 0.32+ rounds W4A4 to 128 (MiniMax-M3 TP8 stays 384, oracle/mxfp4.py at v0.32.0); where the plan's AITER
    kernels need 256-multiples (the default: decode on CK-Tile heuristics) the recipe must not print
    --moe-backend aiter, and says why."""
    from moedispatch.plan.plan import plan_model
    from moedispatch.sources.models import load_model
    from moedispatch.engines.recipes import build_recipe
    from moedispatch.core.workload import Runtime

    plan = plan_model(load_model("MiniMax-M3-MXFP4"), caps("gfx950", "0.1.15.post3"), 8, 1,
                      runtime=Runtime.build(env={}))
    r = build_recipe(plan, "vllm", switches=False)
    assert r.version == "0.33.0"
    assert r.command is None or "--moe-backend aiter" not in r.command
    assert any("allocates hidden 6144 × intermediate/rank 384" in w for w in texts(r.warnings + r.refusals))


def test_vllm_033_realizes_the_aiter_plan_with_the_switches_that_make_384_native(cli):
    """The same model at vLLM 0.33: AITER's tuned FlyDSL rows run 384 natively with the fused shared expert and MXFP4
    decode activations (ROCm/aiter@e4048607:aiter/configs/model_configs/minimax_m3_fp4_tuned_fmoe.csv), which is what
    vLLM allocates: the recipe is the AITER launch with those switches exported — the AMD recipe
    (vllm-project/recipes#581) — not emulation."""
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--recipe", "vllm",
               "--format", "json")
    data = json.loads(proc.stdout)
    env = {e["name"]: e["value"] for e in data["env"]}
    assert data["backend"] == "aiter-flydsl" and "--moe-backend aiter" in data["command"]
    assert env["GPTOSS_SWIGLU_MXFP4_BF16_BOUND"] == "0" and env["VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS"] == "1"
    assert data["plan"]["layers"][3]["padding"]["intermediate_per_rank"] == 384
    assert data["plan"]["aiter_env"]["GPTOSS_SWIGLU_MXFP4_BF16_BOUND"] == "0"


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


def test_recipe_never_prints_aiter_where_the_engine_allocation_misses_the_kernel_alignment(cli):
    """Qwen3-30B-A3B bf16 at TP8: 96/rank. vLLM <= 0.30 does not pad bf16 but CK needs 64/128 (vLLM PR #55368):
    the recipe runs Triton and says why; vLLM 0.31+ pads 96 -> 128 itself (oracle/unquantized.py) and AITER holds."""
    base = ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "8", "--format", "json")
    old = json.loads(cli(*base, "--recipe", "vllm", "--engine-version", "0.30.0").stdout)
    assert "--moe-backend aiter" not in old["command"] and "--moe-backend triton" in old["command"]
    assert old["backend"] == "triton"
    assert any("intermediate/rank 96" in w and "aiter-ck" in w for w in old["warnings"])
    new = json.loads(cli(*base, "--recipe", "vllm").stdout)
    assert new["engine_version"] == "0.33.0" and "--moe-backend aiter" in new["command"]


def test_sglang_recipe_never_prints_aiter_auto_for_unquantized_qwen3_before_28244(cli):
    """SGLANG_USE_AITER=1 + auto garbled unquantized Qwen3-30B-A3B at TP8 until SGLang 0.5.21 (PR #28244): the recipe
    keeps SGLang off AITER there; from 0.5.21 SGLang's own gate runs the layer on Triton, and the recipe says so."""
    base = ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "8", "--recipe", "sglang",
            "--format", "json")
    for version in ("0.5.20", "0.5.23"):
        data = json.loads(cli(*base, "--engine-version", version).stdout)
        env = {e["name"]: e["value"] for e in data["env"]}
        assert env.get("SGLANG_USE_AITER") != "1" and "--moe-runner-backend auto" not in data["command"], version
        assert data["backend"] == "triton"
    old = json.loads(cli(*base, "--engine-version", "0.5.20").stdout)
    assert any("sgl-project/sglang#28244" in (w["source"] or "") for w in old["warning_details"])
    # at TP1 (768/rank, 128-aligned) AITER is safe on every release
    tp1 = json.loads(cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--recipe", "sglang",
                         "--engine-version", "0.5.20", "--format", "json").stdout)
    assert {e["name"]: e["value"] for e in tp1["env"]} == {"SGLANG_USE_AITER": "1"}


def test_layout_ep_over_replicas_gets_a_data_parallel_size(cli):
    """--tp 1 --ep 8 is 8 GPUs: vLLM needs --data-parallel-size 8 with EP; SGLang --tp-size 8 with DP attention."""
    base = ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "1", "--ep", "8", "--format", "json")
    v = json.loads(cli(*base, "--recipe", "vllm").stdout)
    assert "--data-parallel-size 8" in v["command"] and "--enable-expert-parallel" in v["command"]
    assert v["layout"]["world_size"] == 8
    s = json.loads(cli(*base, "--recipe", "sglang").stdout)
    assert all(x in s["command"] for x in ("--tp-size 8", "--ep-size 8", "--attn-dp-size 8"))
    assert "--enable-dp-attention" not in s["command"]   # deprecated since SGLang 0.5.22
    # vLLM has no spelling for experts over 2 of 8 TP ranks: refused, exit 3
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "8", "--ep", "2", "--recipe",
               "vllm", "--format", "json")
    assert proc.returncode == 3 and json.loads(proc.stdout)["command"] is None


def test_tp_that_does_not_divide_the_attention_heads_is_refused_with_an_alternative(cli):
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "3", "--recipe", "vllm",
               "--format", "json")
    assert proc.returncode == 3, proc.stderr
    data = json.loads(proc.stdout)
    assert data["command"] is None
    assert any("32 attention heads" in r and "TP 3" in r for r in data["reasons"])
    assert data["alternatives"] and data["alternatives"][0]["command"]
    assert "no safe vllm" in proc.stderr and "Traceback" not in proc.stderr
    table = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "3", "--recipe", "vllm")
    assert table.returncode == 3 and "NO SAFE LAUNCH" in table.stdout and "vllm serve" not in table.stdout


def test_weights_that_do_not_fit_are_refused(cli):
    """DeepSeek-V3 (671B, FP8) at TP1 on one MI300X (192 GiB) cannot hold its weights; TP8 can."""
    proc = cli("explain", "--model", "DeepSeek-V3", "--target", "MI300X", "--recipe", "vllm", "--format", "json")
    assert proc.returncode == 3
    data = json.loads(proc.stdout)
    assert data["command"] is None and any("do not fit" in r and "MI300X" in r for r in data["reasons"])
    assert data["alternatives"][0]["change"].startswith("--tp ")
    ok = cli("explain", "--model", "DeepSeek-V3", "--target", "MI300X", "--tp", "8", "--recipe", "vllm",
             "--format", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["layout"]["weights_per_rank_gib"] < 177


def test_mxfp8_on_gfx942_counts_the_dequantized_bf16_experts(cli):
    """vLLM dequantizes MiniMax-M3-MXFP8's experts to BF16 on gfx942 (ROCm/MAD#201): TP4 on MI300X does not fit,
    TP8 does; SGLang re-quantizes to block-FP8 (sglang PR #32036) and fits at TP4."""
    base = ("explain", "--model", "MiniMax-M3-MXFP8", "--target", "MI300X", "--format", "json")
    tp4 = cli(*base, "--tp", "4", "--recipe", "vllm")
    assert tp4.returncode == 3 and any("BF16" in r and "do not fit" in r for r in json.loads(tp4.stdout)["reasons"])
    assert cli(*base, "--tp", "8", "--recipe", "vllm").returncode == 0
    sgl = json.loads(cli(*base, "--tp", "4", "--recipe", "sglang").stdout)
    assert any("block-FP8" in c for c in sgl["caveats"])


def test_recipe_warnings_carry_the_plan_warnings(cli, monkeypatch):
    """With no GPU and no --target the recipe (table and JSON) says it used the default target, like explain."""
    monkeypatch.delenv("MOEDISPATCH_TARGET", raising=False)
    for fmt in ("json", "table"):
        proc = cli("explain", "--model", "Qwen3-30B-A3B", "--tp", "8", "--recipe", "vllm", "--format", fmt)
        out = proc.stdout if fmt == "table" else " ".join(json.loads(proc.stdout)["warnings"])
        assert "default target" in out, out[:400]
        assert "unconfirmed model facts" in out


def test_engine_decision_carries_its_target_and_warnings():
    """select_moe_backend() with no caps names the target it assumed and warns when it is the default."""
    from moedispatch.data import capdb

    d = select_moe_backend(caps=capdb.target_capabilities("gfx950", "0.1.15.post3"), hidden_size=2048,
                           intermediate_size=768, num_experts=128, top_k=8, tp_size=8)
    assert d.target["gfx"] == "gfx950" and d.target["aiter_version"] == "0.1.15.post3"


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

    from moedispatch.core.errors import UsageError

    with pytest.raises(UsageError, match="unknown layer field 'hiden_size'"):
        select_moe_backend(hiden_size=1, **{k: v for k, v in base.items() if k != "hidden_size"})
    with pytest.raises(UsageError, match="intermediate must be an integer"):
        select_moe_backend(intermediate_size=3072.5, **base)
    with pytest.raises(UsageError, match="^ep 3 must divide tp 8"):
        select_moe_backend(intermediate_size=14336, ep_size=3, **base)


def test_every_forced_vllm_backend_is_one_vllm_033_accepts_for_the_layer(caps):
    """The engine model of vLLM 0.33.0 (moedispatch.engines.choice, checked against its real oracles) accepts the
    --moe-backend each recipe prints, with the recipe's env, for every MoE layer, and runs the recipe's family."""
    from moedispatch.engines.choice import choice_for_layer
    from moedispatch.engines.recipes import build_recipe

    for model, target, tp in [("MiniMax-M3-MXFP4", "gfx950", 8), ("MiniMax-M3-MXFP4", "gfx950", 4),
                              ("MiniMax-M3-MXFP8", "gfx942", 8), ("Qwen3-30B-A3B", "gfx950", 8),
                              ("Qwen3-30B-A3B", "gfx942", 4), ("DeepSeek-V3", "gfx950", 8),
                              ("gpt-oss-120b", "gfx950", 8), ("gpt-oss-20b", "gfx942", 4),
                              ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx942", 8)]:
        c = caps(target, "0.1.20.post1")
        plan = plan_model(model, c, tp=tp)
        r = build_recipe(plan, "vllm")
        if not r.ok:
            continue
        forced = next((a["arg"].split()[-1] for a in r.args if a["arg"].startswith("--moe-backend")), "auto")
        env = {e["name"]: e["value"] for e in r.env}
        for d in {d.layer.signature(): d for d in plan.decisions if d.layer.kind == "moe"}.values():
            ch = choice_for_layer(d.layer, c, "vllm", "0.33.0", env=env, moe_backend=forced,
                                  quant_method=plan.model.quant_method)
            assert ch.ok, (model, target, tp, forced, ch.error)


def test_engine_padding_takes_a_family_or_a_builtin_backend_name():
    """Round 1's engine_padding(engine, layer, backend) took a backend name; a family is the round-2 spelling. Both
    give vLLM 0.33's MXFP4 W4A16 round-up for gpt-oss-120b at TP8 (2880 -> 3072, 360 -> 512; oracle/mxfp4.py)."""
    from moedispatch.core.layers import MoELayer
    from moedispatch.engines.recipes import engine_padding

    layer = MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16",
                           activation="swigluoai")
    by_family = engine_padding("vllm", layer, "flydsl", "0.33.0")
    assert engine_padding("vllm", layer, "aiter-flydsl", "0.33.0") == by_family
    assert by_family[:2] == (3072, 512)


def test_vllm_033_kernel_pads_follow_its_aiter_moe_pads():
    """vllm-project/vllm@v0.33.0 experts/rocm_aiter_moe.py:239-272 (aiter_moe_pads): at TP 1 the intermediate pad is
    doubled for the fused gate/up weight — except on the MXFP4 W4A4 SiLU path, where AITER doubles it ("doubling it
    here as well masks live intermediate rows") — and SITU's pads pass through unrounded. A 2880 × 2880 layer at TP 1:
    W4A4 allocates 2944 (pad 64), W4A16 3072 (pad 192), hidden 3072 (pad 192). Before 0.33 every TP-1 pad doubled
    (vllm-project/vllm#44679)."""
    from moedispatch.core.layers import MoELayer
    from moedispatch.engines.recipes import engine_padding

    def pads(act, aq, version="0.33.0"):
        layer = MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, weight="mxfp4", act=aq,
                               activation=act)
        return engine_padding("vllm", layer, "aiter-ck", version)

    assert pads("silu", "mxfp4") == (3072, 2944, 128, 64)         # not doubled: AITER doubles it
    assert pads("gelu", "mxfp4") == (3072, 2944, 128, 128)        # doubled (only SiLU is exempt)
    assert pads("silu", "bf16") == (3072, 3072, 128, 384)         # W4A16: doubled
    assert pads("situ", "bf16") == (3072, 3072, 192, 192)         # SITU: unrounded, undoubled
    assert pads("silu", "mxfp4", "0.32.0") == (3072, 2944, 128, 128)
