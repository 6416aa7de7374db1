"""Issue 23 item 1: a recipe decides among the launch paths the engine release has, not among AITER's families.

A launch path is one engine row's flags and environment for the layers' quant method (capability_db/engines.toml);
AITER's families behind one `--moe-backend aiter` are one path, and what AITER runs there is an outcome, shown per
path. Realizable paths are ranked by the MoE layers' predicted time at the engine's allocation where the bars
separate, else in the plan's order; refused ones follow with why.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from moedispatch import plan_model
from moedispatch.core.costs import Cost
from moedispatch.core.reason import Reason
from moedispatch.engines.paths import LaunchPath, rank_paths
from moedispatch.engines.recipes import build_recipe, render_recipe
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"


def _recipe(model, product, tp, engine, aiter=A20, ep=1):
    plan = plan_model(model, fake_capabilities(product, aiter), tp, ep)
    return plan, build_recipe(plan, engine)


def _costs(*us):
    return tuple(Cost(t, u, u * 0.9, u * 1.1, "tuned") for t, u in zip((1, 64, 8192), us))


def test_aiters_families_behind_one_flag_are_one_path_and_what_runs_is_its_outcome():
    """DeepSeek-V3 FP8 on MI300X, vLLM 0.33: aiter-ck and aiter-asm are both `--moe-backend aiter` with the AITER
    switches (vllm/config/kernel.py MoEBackend: no flag picks a family) — one path, realized through aiter-ck, on
    which AITER runs CK and ASM; Triton is a second path, emulation a refused third."""
    _plan, recipe = _recipe("DeepSeek-V3", "MI300X", 8, "vllm")
    labels = [p.label for p in recipe.paths]
    assert labels[0] == "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 --moe-backend aiter"
    aiter = recipe.paths[0]
    assert aiter.backends == ("aiter-ck", "aiter-asm") and aiter.backend == "aiter-ck" and aiter.ok
    assert set(aiter.families) == {"ck", "asm"}
    assert [p.args for p in recipe.paths].count(("--moe-backend aiter",)) == 1  # one path, not one per family
    triton = next(p for p in recipe.paths if p.backends == ("triton",))
    assert triton.ok and triton.label == "VLLM_ROCM_USE_AITER_MOE=0 --moe-backend triton" and not triton.families
    assert recipe.backend == "aiter-ck" and "--moe-backend aiter" in recipe.command


def test_the_taken_path_is_the_recipes_command():
    """The recipe is the first realizable path rendered as a command: its flags are the command's, its environment
    exported — never a second decision."""
    for model, product, tp, engine in [("GLM-5.1-MXFP4", "MI355X", 16, "vllm"), ("Kimi-K2.5", "MI355X", 8, "vllm"),
                                       ("DeepSeek-V3", "MI300X", 8, "sglang")]:
        _plan, recipe = _recipe(model, product, tp, engine)
        taken = next(p for p in recipe.paths if p.ok)
        assert all(a in recipe.command for a in taken.args), (model, taken.label)
        exported = {e["name"]: e["value"] for e in recipe.env}
        assert all(exported.get(k) == v for k, v in taken.env), (model, taken.label, exported)


def test_kimi_k25_int4_path_is_moe_backend_flydsl_and_the_others_say_why_not():
    """vLLM 0.33 reaches FlyDSL INT4 W4A16 (compressed-tensors) only with `--moe-backend flydsl`
    (vllm/model_executor/layers/fused_moe/oracle/int_wna16.py); its Triton path (TritonWNA16Experts, the triton
    backend's int4 weight-only path) and emulation are correct and slower, ranked after it; on MI308X (gfx942: no
    FlyDSL a16wi4) Triton is taken."""
    _plan, recipe = _recipe("Kimi-K2.5", "MI355X", 8, "vllm")
    assert recipe.paths[0].label == "--moe-backend flydsl" and recipe.paths[0].families == ("flydsl",)
    assert [p.backends[0] for p in recipe.paths[1:]] == ["triton", "emulation"] and all(p.ok for p in recipe.paths)
    _plan, recipe = _recipe("Kimi-K2.5", "MI308X", 8, "vllm")
    assert recipe.ok and recipe.paths[0].backends == ("triton",) and "--moe-backend triton" in recipe.paths[0].label


def test_every_realizable_path_is_costed_at_the_engines_allocation():
    """GLM-5.1-MXFP4 TP16 (128/rank): the AITER path and the emulation path both carry the MoE total per planned
    token count; AITER's is lower at every count and the emulation path says by how much (the ranking's reason)."""
    _plan, recipe = _recipe("GLM-5.1-MXFP4", "MI355X", 16, "vllm")
    aiter, emu = recipe.paths[0], next(p for p in recipe.paths if p.backends == ("emulation",))
    assert [c.tokens for c in aiter.costs] == [1, 4, 64, 512, 8192] == [c.tokens for c in emu.costs]
    assert all(a.high < e.low for a, e in zip(aiter.costs, emu.costs))
    assert emu.why and emu.why.startswith(aiter.label) and "µs" in emu.why


def test_a_faster_path_beyond_the_bars_moves_up_and_overlapping_ones_keep_the_plans_order():
    """The ranking is the selector's (cost/ranking.py rank): a later path moves above an earlier one only when its
    bars lie wholly below; with overlapping bars the plan's order stands; refused paths come last."""
    a = LaunchPath(("--moe-backend aiter",), (), ("aiter-ck",), "aiter-ck", costs=_costs(100, 200, 4000))
    b = LaunchPath(("--moe-backend triton",), (), ("triton",), "triton", costs=_costs(50, 90, 1500))
    c = LaunchPath(("--moe-backend x",), (), ("x",), "x", costs=_costs(102, 205, 4100))
    no = LaunchPath(("--moe-backend emulation",), (), ("emulation",), None, (Reason("emulation: no", "failed"),))
    ranked = rank_paths([a, no, c, b])
    assert [p.label for p in ranked] == ["--moe-backend triton", "--moe-backend aiter", "--moe-backend x",
                                         "--moe-backend emulation"]
    assert ranked[0].why is None and ranked[1].why.startswith("--moe-backend triton")
    assert ranked[2].why is None  # overlapping bars with aiter: the plan's order, no cost reason
    # without costs nothing moves
    assert [p.label for p in rank_paths([replace_costs(a), replace_costs(b)])] == ["--moe-backend aiter",
                                                                                   "--moe-backend triton"]


def replace_costs(p):
    from dataclasses import replace
    return replace(p, costs=())


def test_a_refused_path_is_said_once_with_its_first_reason_and_a_count():
    p = LaunchPath(("--moe-backend aiter",), (("VLLM_ROCM_USE_AITER", "1"),), ("aiter-ck", "aiter-flydsl"), None,
                   (Reason("aiter-ck: one", "failed"), Reason("aiter-flydsl: two", "failed")))
    assert p.summary() == "VLLM_ROCM_USE_AITER=1 --moe-backend aiter: refused — aiter-ck: one (+1 more)"
    assert LaunchPath((), (), ("emulation",), None).label == "(emulation: no engine flag)"


def test_the_recipe_text_and_json_carry_the_paths():
    """`explain --recipe` lists the paths, the taken one marked; the JSON's launch_paths validate against
    docs/schemas/recipe.schema.json."""
    plan, recipe = _recipe("DeepSeek-V3", "MI300X", 8, "vllm")
    text = render_recipe(plan, "vllm", recipe=recipe)
    assert "# launch paths vllm 0.33.0 has for the MoE layers (best first):" in text
    assert "#   [taken] VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 --moe-backend aiter: AITER runs ck+asm" in text
    assert "#   [no] --moe-backend emulation: refused — emulation: " in text
    doc = json.loads(render_recipe(plan, "vllm", fmt="json", recipe=recipe))
    assert doc["launch_paths"][0]["backends"] == ["aiter-ck", "aiter-asm"] and doc["launch_paths"][0]["ok"]
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    schema = json.loads((root / "docs" / "schemas" / "recipe.schema.json").read_text())
    path_schema = {**schema["$defs"]["launch_path"], "$defs": schema["$defs"]}
    for p in doc["launch_paths"]:
        jsonschema.validate(p, path_schema)


@pytest.mark.parametrize("model, product, tp, engine", [("DeepSeek-V4-Pro", "MI355X", 8, "vllm")])
def test_no_realizable_native_path_refuses_instead_of_printing_emulation(model, product, tp, engine):
    """DeepSeek-V4-Pro TP8 with AITER_BF16_FP8_MOE_BOUND=0 on vLLM: the AITER path is refused at the engine's
    allocation (aiter-pr#3538), emulation is realizable but the slow reference path: no command, the native
    alternatives named (issue 23 item 5) — the path ranking does not bring emulation back."""
    plan = plan_model(model, fake_capabilities(product, A20), tp, 1, aiter_env={"AITER_BF16_FP8_MOE_BOUND": "0"})
    recipe = build_recipe(plan, engine)
    assert recipe.command is None and recipe.alternatives
    assert any(p.ok and p.backends == ("emulation",) for p in recipe.paths)
    assert any(not p.ok and "aiter" in p.label for p in recipe.paths)


def test_an_aiter_switch_is_part_of_the_path_it_makes_realizable():
    """MiniMax-M3-MXFP4 TP8 on MI355X, vLLM 0.33 (allocates 384/rank): without GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0
    decode runs CK-Tile heuristics at 384, wrong per ROCm/aiter#5233, so that path is refused naming the issue (not a
    family's tile table); with the switch AITER's FlyDSL rows decide every bucket — the taken path carries it."""
    _plan, recipe = _recipe("MiniMax-M3-MXFP4", "MI355X", 8, "vllm")
    taken = recipe.paths[0]
    assert ("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0") in taken.env and taken.families == ("flydsl",)
    bare = [p for p in recipe.paths if not p.ok and p.args == ("--moe-backend aiter",)]
    assert len(bare) == 1 and ("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0") not in bare[0].env
    why = bare[0].refusals[0].text
    assert "allocates hidden 6144 × intermediate/rank 384" in why and "ROCm/aiter#5233" in why
    assert "needs multiples" not in why
    exported = {e["name"]: e["value"] for e in recipe.env}
    assert all(exported.get(k) == v for k, v in taken.env)
