"""Every recipe moedispatch prints is a launch its own linter passes: each golden recipe case that yields a launch
(tests/test_golden_recipes.py CASES) is rendered, read back as a launch script and linted for the same target, AITER
and engine release — no error, and no warning the recipe does not state itself (a known issue with no workaround is
said by both). A recipe its linter flags (or a lint fix that contradicts the recipe)
sends users in circles, and the engine guard refuses what lint calls an error: MiniMax-M3-MXFP8 on MI300X under
SGLang (experts re-quantized to block-FP8 at load, served by Triton) was such a case."""

from __future__ import annotations

import pytest

from moedispatch.engines import lint as L
from moedispatch.engines.recipes import build_recipe, render_recipe

from test_golden_recipes import CASES, _key, plan_of


@pytest.mark.parametrize("case", CASES, ids=[_key(c) for c in CASES])
def test_a_printed_recipe_lints_clean(builtins, case):
    model, target, aiter, engine, version, _tp, _ep, _rt = case
    plan = plan_of(case, builtins)
    recipe = build_recipe(plan, engine, version)
    if not recipe.ok:
        pytest.skip("no launch printed: the recipe refuses (its alternatives are golden-tested)")
    text = render_recipe(plan, engine, version=version, recipe=recipe)
    doc = L.lint_launch(L.parse_launch(text), target=target, aiter_version=aiter, model=model,
                        engine_version=version)
    stated = {w.issue.split("#")[-1] for w in recipe.warnings if w.issue}
    bad = [f for f in doc["findings"] if f["severity"] == "error" or f["severity"] == "warning" and not any(
        f"/issues/{n}" in (f["source"] or "") or f"#{n}" in (f["source"] or "") for n in stated)]
    assert not bad, "\n".join(f"{f['severity']}: {f['message']}" for f in bad)


@pytest.mark.parametrize("case", CASES, ids=[_key(c) for c in CASES])
def test_a_refused_recipes_alternatives_lint_without_error(builtins, case):
    """The nearest safe launches a refused recipe offers (another TP/EP, release or engine) are launches too: none
    of them, with the environment it carries, is one lint calls an error (they once carried no environment, so a
    vLLM ``--moe-backend aiter`` alternative lacked the master switch it cannot start without)."""
    model, target, aiter, engine, version, _tp, _ep, _rt = case
    plan = plan_of(case, builtins)
    recipe = build_recipe(plan, engine, version)
    if recipe.ok or not recipe.alternatives:
        pytest.skip("a printed launch (linted above), or no alternative")
    for alt in recipe.alternatives:
        launch = "".join(f"export {k}={v}\n" for k, v in alt["env"].items()) + alt["command"]
        doc = L.lint_launch(L.parse_launch(launch), target=target, aiter_version=aiter, model=model,
                            engine_version=alt["engine_version"])
        errors = [f["message"] for f in doc["findings"] if f["severity"] == "error"]
        assert not errors, (alt["change"], alt["command"], errors)


def test_lints_fix_for_a_refused_launch_carries_the_alternatives_environment():
    """DeepSeek-V3 at TP 1 on MI300X does not fit: lint's fix is the nearest alternative (--tp 4) with the AITER
    switches its --moe-backend aiter cannot start without."""
    doc = L.lint_launch(L.parse_launch(None, ["vllm", "serve", "deepseek-ai/DeepSeek-V3", "--moe-backend", "aiter"],
                                       {"VLLM_ROCM_USE_AITER": "1"}),
                        target="MI300X", aiter_version="0.1.15.post3", model="DeepSeek-V3")
    fixes = {f["fix"] for f in doc["findings"] if f["severity"] == "error"}
    assert "--tp 4: VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 vllm serve deepseek-ai/DeepSeek-V3 " \
           "--tensor-parallel-size 4 --moe-backend aiter" in fixes, fixes
