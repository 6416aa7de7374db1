"""Engine recipes built in-process (the CLI tests in test_recipes_engine.py run them in a subprocess): the same real
deployments, pinned on the recipe values, so that benchmarks/mutation.py can select these tests for recipe mutants.

Targets are simulated from capability_db (no GPU); engine facts come from capability_db/engines.toml (vLLM 0.23.0 …
0.33.0, SGLang 0.5.18 … 0.5.23, each row with its source there).
"""

from __future__ import annotations

import json

import pytest

from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.engines.recipes import build_recipe, render_recipe

AITER = "0.1.15.post3"


@pytest.fixture
def recipe(caps):
    """recipe(model, target, engine, tp=1, ep=1, version=None, aiter=None) -> (Recipe, JSON dict, table text)."""

    def make(model, target, engine, *, tp=1, ep=1, version=None, aiter=None):
        plan = plan_model(load_model(model), caps(target, aiter), tp=tp, ep=ep)
        r = build_recipe(plan, engine, version)
        text = render_recipe(plan, engine, fmt="json", version=version)
        assert text.startswith('{\n  "schema": "moedispatch.recipe/1",\n') and text.endswith("}\n")  # indent 2
        data = json.loads(text)
        table = render_recipe(plan, engine, fmt="table", version=version)
        return r, data, table

    return make


def _env(data):
    return {e["name"]: e["value"] for e in data["env"]}


def test_vllm_031_minimax_m3_mxfp4_runs_aiter_as_planned(recipe):
    """vLLM 0.31 rounds MXFP4 on ROCm to 256/256 (MiniMax-M3 TP8: 384 -> 512), which is the FlyDSL plan's allocation:
    the recipe selects AITER (VLLM_ROCM_USE_AITER=1, VLLM_ROCM_USE_AITER_MOE=1, --moe-backend aiter)."""
    r, data, table = recipe("MiniMax-M3-MXFP4", "gfx950", "vllm", tp=8, version="0.31.0", aiter=AITER)
    assert r.ok and data["backend"] == "aiter-flydsl" and data["engine_version"] == "0.31.0"
    assert _env(data)["VLLM_ROCM_USE_AITER"] == "1" and _env(data)["VLLM_ROCM_USE_AITER_MOE"] == "1"
    assert "--moe-backend aiter" in data["command"] and "--tensor-parallel-size 8" in data["command"]
    assert data["command"].startswith("vllm serve amd/MiniMax-M3-MXFP4")
    assert data["reasons"] == [] and data["plan_fingerprint"] and data["schema"] == "moedispatch.recipe/1"
    assert data["plan"]["schema"] == "moedispatch.explain/1" and data["plan"]["parallel"] == {"tp": 8, "ep": 1}
    assert not any("allocates" in w for w in data["warnings"])
    lines = table.splitlines()
    assert lines[0].startswith("# vllm 0.31.0 recipe for MiniMax-M3-MXFP4 on gfx950")
    assert "export VLLM_ROCM_USE_AITER=1" in lines and "# MoE plan: aiter-flydsl" in lines
    for i, line in enumerate(lines):
        if line.startswith("export "):
            assert lines[i - 1].startswith("# ") and "(" in lines[i - 1]  # every env line has its reason and source


def test_vllm_033_w4a4_allocation_misses_flydsl_alignment(recipe):
    """vLLM 0.32+ rounds W4A4 to 128 (MiniMax-M3 TP8 stays 384/rank, oracle/mxfp4.py at v0.32.0); FlyDSL a4w4 needs
    256-multiples, so the recipe does not print --moe-backend aiter and says why, with the allocation's source."""
    r, data, _ = recipe("MiniMax-M3-MXFP4", "gfx950", "vllm", tp=8, aiter=AITER)
    assert data["engine_version"] == "0.33.0"
    assert data["command"] is None or "--moe-backend aiter" not in data["command"]
    why = [d for d in data["warning_details"] + data["reason_details"]
           if "allocates hidden 6144 × intermediate/rank 384" in d["text"]]
    assert why and all("oracle/mxfp4.py" in (d["source"] or "") for d in why)


def test_vllm_minimax_m3_mxfp8_on_mi300x_is_loud_emulation(recipe):
    """gfx942 has no MX matrix instructions: MiniMax-M3-MXFP8 runs on emulation with its slow-path warning, AITER on
    for the rest and AITER MHA off (the q/prob scales), --moe-backend auto (MXFP8 has no explicit emulation value)."""
    r, data, _ = recipe("MiniMax-M3-MXFP8", "MI300X", "vllm", tp=8)
    env = {e["name"]: e for e in data["env"]}
    assert env["VLLM_ROCM_USE_AITER"]["value"] == "1" and env["VLLM_ROCM_USE_AITER_MHA"]["value"] == "0"
    assert "q/prob scales" in env["VLLM_ROCM_USE_AITER_MHA"]["why"]
    assert data["backend"] == "emulation" and "--moe-backend auto" in data["command"]
    assert any("run on emulation" in w and "slow reference path" in w for w in data["warnings"])


def test_vllm_bf16_allocation_before_031_falls_back_to_triton(recipe):
    """Qwen3-30B-A3B bf16 TP8 is 96/rank: vLLM <= 0.30 does not pad bf16, classic CK needs 64/128 (vLLM PR #55368),
    so the recipe runs Triton and says why; vLLM 0.31+ pads 96 -> 128 itself and AITER holds."""
    r, old, _ = recipe("Qwen3-30B-A3B", "MI355X", "vllm", tp=8, version="0.30.0")
    assert old["backend"] == "triton" and "--moe-backend triton" in old["command"]
    assert "--moe-backend aiter" not in old["command"]
    assert any("intermediate/rank 96" in w and "aiter-ck" in w for w in old["warnings"])
    _, new, _ = recipe("Qwen3-30B-A3B", "MI355X", "vllm", tp=8)
    assert new["engine_version"] == "0.33.0" and "--moe-backend aiter" in new["command"]


def test_sglang_unquantized_qwen3_stays_off_aiter_before_28244(recipe):
    """SGLANG_USE_AITER=1 + auto garbled unquantized Qwen3-30B-A3B at TP8 until SGLang 0.5.21 (PR #28244); at TP1
    (768/rank) AITER is safe on every release."""
    for version in ("0.5.20", "0.5.23"):
        _, data, _ = recipe("Qwen3-30B-A3B", "MI355X", "sglang", tp=8, version=version)
        assert _env(data).get("SGLANG_USE_AITER") != "1", version
        assert "--moe-runner-backend auto" not in data["command"] and data["backend"] == "triton"
    _, old, _ = recipe("Qwen3-30B-A3B", "MI355X", "sglang", tp=8, version="0.5.20")
    assert any("sgl-project/sglang#28244" in (w["source"] or "") for w in old["warning_details"])
    _, tp1, _ = recipe("Qwen3-30B-A3B", "MI355X", "sglang", version="0.5.20")
    assert _env(tp1) == {"SGLANG_USE_AITER": "1"}


def test_expert_parallel_layouts(recipe):
    """--tp 1 --ep 8 is 8 GPUs: vLLM --data-parallel-size 8 --enable-expert-parallel; SGLang --tp-size 8 --ep-size 8
    --attn-dp-size 8 (--dp-size 8 --enable-dp-attention before SGLang 0.5.22). vLLM cannot spell experts over 2 of 8
    TP ranks: refused."""
    _, v, _ = recipe("Qwen3-30B-A3B", "MI355X", "vllm", ep=8)
    assert "--data-parallel-size 8" in v["command"] and "--enable-expert-parallel" in v["command"]
    assert v["layout"]["world_size"] == 8
    _, s, _ = recipe("Qwen3-30B-A3B", "MI355X", "sglang", ep=8)
    assert all(x in s["command"] for x in ("--tp-size 8", "--ep-size 8", "--attn-dp-size 8"))
    assert "--dp-size" not in s["command"] and "--enable-dp-attention" not in s["command"]
    _, old, _ = recipe("Qwen3-30B-A3B", "MI355X", "sglang", ep=8, version="0.5.21")   # before --attn-dp-size existed
    assert all(x in old["command"] for x in ("--tp-size 8", "--ep-size 8", "--dp-size 8", "--enable-dp-attention"))
    assert "--attn-dp-size" not in old["command"]
    r, bad, table = recipe("Qwen3-30B-A3B", "MI355X", "vllm", tp=8, ep=2)
    assert not r.ok and bad["command"] is None and bad["reasons"]
    assert "NO SAFE LAUNCH" in table and "vllm serve" not in table.split("NO SAFE LAUNCH")[1].split("\n#   ")[0]


def test_tp_that_does_not_divide_the_heads_is_refused_with_an_alternative(recipe):
    """Qwen3-30B-A3B has 32 attention heads: TP 3 is refused, and the nearest safe launch is offered."""
    r, data, table = recipe("Qwen3-30B-A3B", "MI355X", "vllm", tp=3)
    assert not r.ok and data["command"] is None
    assert any("32 attention heads" in x and "TP 3" in x for x in data["reasons"])
    alt = data["alternatives"]
    assert alt and alt[0]["command"] and alt[0]["change"].startswith("--tp ")
    assert all(a["command"] for a in alt) and {a["engine"] for a in alt} <= {"vllm", "sglang"}
    assert "NO SAFE LAUNCH" in table and "nearest safe alternatives" in table


def test_weights_that_do_not_fit_are_refused(recipe):
    """DeepSeek-V3 (671B, FP8) at TP1 cannot fit one MI300X (192 GiB); TP8 can."""
    r, data, _ = recipe("DeepSeek-V3", "MI300X", "vllm")
    assert not r.ok and any("do not fit" in x and "MI300X" in x for x in data["reasons"])
    assert data["alternatives"][0]["change"].startswith("--tp ")
    ok, big, _ = recipe("DeepSeek-V3", "MI300X", "vllm", tp=8)
    assert ok.ok and big["layout"]["weights_per_rank_gib"] < 177


def test_mxfp8_on_gfx942_counts_the_dequantized_experts(recipe):
    """vLLM dequantizes MiniMax-M3-MXFP8's experts to BF16 on gfx942 (ROCm/MAD#201): TP4 on MI300X does not fit,
    TP8 does; SGLang re-quantizes to block-FP8 (SGLang PR #32036) and says so."""
    r, tp4, _ = recipe("MiniMax-M3-MXFP8", "MI300X", "vllm", tp=4)
    assert not r.ok and any("BF16" in x and "do not fit" in x for x in tp4["reasons"])
    assert recipe("MiniMax-M3-MXFP8", "MI300X", "vllm", tp=8)[0].ok
    _, sgl, _ = recipe("MiniMax-M3-MXFP8", "MI300X", "sglang", tp=4)
    assert any("block-FP8" in c for c in sgl["caveats"])


def test_recipe_warnings_include_the_plan_warnings(recipe, caps):
    """A recipe repeats every plan warning (here the unconfirmed model facts of Qwen3-30B-A3B) before its own."""
    plan = plan_model(load_model("Qwen3-30B-A3B"), caps("MI355X"), tp=8)
    r = build_recipe(plan, "vllm")
    assert [w for w in r.warnings[:len(plan.warnings)]] == list(plan.warnings)
    assert any("unconfirmed model facts" in w.text for w in r.warnings)


def test_unknown_engine_and_bad_version_are_usage_errors(caps):
    """An engine moedispatch has no data for, or a version that is not PEP 440, is bad input (exit 2 in the CLI)."""
    from moedispatch.core.errors import UsageError

    plan = plan_model(load_model("Qwen3-30B-A3B"), caps("MI355X"), tp=8)
    with pytest.raises(UsageError):
        build_recipe(plan, "tgi")
    with pytest.raises(UsageError, match="PEP 440"):
        build_recipe(plan, "vllm", "latest")


def test_a_recipe_value_without_a_layout_serializes():
    """A Recipe built by hand (a plugin or a test) need not have a layout: its JSON says null."""
    from moedispatch.engines.recipes import Recipe

    data = Recipe("vllm", "0.33.0").to_dict()
    assert data["layout"] is None and data["command"] == "" and data["engine_version"] == "0.33.0"
    assert data["schema"] == "moedispatch.recipe/1" and data["alternatives"] == [] and data["reasons"] == []


def test_an_engine_that_converts_the_experts_does_not_run_the_planned_path(caps):
    """On gfx942 vLLM dequantizes MXFP8 experts to BF16 and serves them through emulation (ROCm/MAD#201). A plan
    for an AITER path (here a hypothetical AITER CK MXFP8 kernel on gfx942) is then not what vLLM runs: the recipe
    says so, with the conversion's source, and falls back to a backend vLLM does run. SGLang re-quantizes to
    block-FP8 (sgl-project/sglang#32036) and its recipe carries that conversion as a caveat."""
    from moedispatch.core.backend import Backend, Padding, Verdict
    from moedispatch.selector.plugins import build_registry

    class FutureCK(Backend):
        name, preference, family = "aiter-ck", 80, "ck"

        def check(self, layer, caps):
            return Verdict.supported("a future CK MXFP8 kernel")

        def plan_padding(self, layer, caps):
            return Padding.none(layer)

    backends = tuple(b for b in build_registry().backends if b.name != "aiter-ck") + (FutureCK(),)
    plan = plan_model(load_model("MiniMax-M3-MXFP8"), caps("MI300X"), tp=8, backends=backends)
    assert {d.backend for d in plan.decisions if d.layer.kind == "moe"} == {"aiter-ck"}
    r = build_recipe(plan, "vllm")
    # What vLLM would run is its emulation fallback: never printed while a native launch exists (issue 23 item 5);
    # the refusal says why and names it.
    assert r.backend is None and r.command is None
    why = [w for w in r.refusals if "does not run aiter-ck here: " in w.text]
    assert why and "dequantizes the MXFP8 experts to BF16" in why[0].text, [w.text for w in r.refusals]
    assert "ROCm/MAD#201" in why[0].source and why[0].kind == "failed"
    assert any("the only vllm 0.33.0 launch left for this layout is emulation" in w.text for w in r.refusals)
    assert r.alternatives and all(a["backend"] != "emulation" for a in r.alternatives)
    sgl = build_recipe(plan, "sglang")
    assert any("re-quantizes the MXFP8 experts to block-FP8" in c.text and "sglang#32036" in (c.source or "")
               for c in sgl.caveats)


@pytest.mark.parametrize("version, said", [("0.33.0rc1", "0.33.0"), ("0.33.1.dev45+g1234abc", "0.33.1"),
                                           ("0.33.0", None), ("0.33.0+rocm700", None)])
def test_a_pre_release_is_judged_as_one_and_says_so(recipe, version, said):
    """PEP 440 orders 0.33.0rc1 before 0.33.0, so a rule that starts at 0.33 (vLLM's own AITER pads, its parser's
    --moe-backend values) is not applied to it: the recipe says so instead of silently judging it as 0.32."""
    _, data, table = recipe("Qwen3-30B-A3B", "MI355X", "vllm", version=version)
    notes = [w for w in data["warnings"] if "pre-release" in w]
    if said is None:
        assert not notes
    else:
        assert notes == [f"vllm {version} is a pre-release of {said}: judged by the rules of the releases before "
                         f"{said} (a rule that starts at {said} is not applied to it); if it already has {said}'s "
                         f"changes, pass --engine-version {said}"]
        assert "pre-release" in table
