"""Golden recipes with AITER's dispatch in the plan: every line of the launches a user would paste, pinned.

tests/test_golden_decisions.py pins recipes of plans made without a Runtime. A plan made with one (``--tokens``,
``--aiter-env``, and by default in the CLI) adds what recipes do only then: the AITER switch under which the engine's
allocation is native (the recipe re-made under it, with the switch exported), the AITER environment the plan's
simulation assumed, the workarounds of kernel × bucket bugs the chosen path needs, and the nearest safe alternatives
of a refused launch. Each entry records the recipe value, its reasons (kind, text, source, issue, confidence), the
plan it realizes and the table a user reads.

The cases were chosen by covering every branch of moedispatch/engines/recipes.py that a grid of 13 models × 2 targets × 2
AITER releases × 7 engine releases × 5 layouts × 3 runtimes reaches, twice, plus the deployments people ask about.
After an intended change, regenerate and review:

    python tests/test_golden_recipes.py && git diff tests/golden/recipes.json
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.engines.recipes import build_recipe, render_recipe
from moedispatch.core.workload import Runtime
from moedispatch.testing import fake_capabilities

GOLDEN = Path(__file__).parent / "golden" / "recipes.json"
A3, A20 = "0.1.15.post3", "0.1.20.post1"
TOKENS = (1, 4, 64, 4096)
#: Runtimes: none (preference only), the default env, and fp8 activations for MX weights (AITER_BF16_FP8_MOE_BOUND=0).
RUNTIMES = {None: None, "rt": {}, "bound0": {"AITER_BF16_FP8_MOE_BOUND": "0"}}

#: (model, target, AITER, engine, engine version, tp, ep, runtime)
CASES = [
    # chosen by branch coverage (two cases per branch where two exist)
    ("MiniMax-M3-MXFP8", "MI300X", A3, "vllm", "0.23.0", 2, 1, "rt"),
    ("MiniMax-M3-MXFP8", "MI355X", A20, "sglang", None, 8, 1, "bound0"),
    ("Kimi-K3-MXFP4", "MI355X", A20, "vllm", None, 8, 1, "bound0"),
    ("Mixtral-8x7B", "MI300X", A20, "sglang", None, 8, 8, "bound0"),
    ("Qwen3-30B-A3B", "MI355X", A20, "sglang", None, 8, 1, None),
    ("gpt-oss-120b", "MI300X", A20, "vllm", "0.28.0", 8, 1, None),
    ("MiniMax-M3-MXFP8", "MI355X", A20, "vllm", "0.28.0", 8, 1, "rt"),
    ("Mixtral-8x7B", "MI355X", A3, "sglang", "0.5.20", 1, 1, None),
    ("Qwen3-30B-A3B", "MI300X", A3, "sglang", "0.5.20", 4, 1, None),
    ("Kimi-K3-MXFP4", "MI355X", A20, "sglang", "0.5.18", 2, 1, "rt"),
    ("MiniMax-M3-MXFP8", "MI300X", A3, "sglang", "0.5.18", 8, 1, "rt"),
    ("gpt-oss-120b", "MI300X", A20, "sglang", "0.5.18", 8, 1, None),
    ("Mixtral-8x7B", "MI300X", A20, "sglang", "0.5.18", 8, 8, "bound0"),
    ("Qwen3-30B-A3B", "MI355X", A3, "sglang", None, 8, 1, None),
    ("Kimi-K3-MXFP4", "MI355X", A3, "vllm", None, 8, 1, "rt"),
    ("MiniMax-M3-MXFP8", "MI355X", A20, "vllm", "0.28.0", 8, 1, "bound0"),
    ("Mixtral-8x7B", "MI355X", A20, "sglang", None, 8, 1, None),
    ("Qwen3-30B-A3B", "MI300X", A3, "sglang", "0.5.18", 4, 1, None),
    # the deployments people ask about, with AITER's dispatch in the plan
    ("MiniMax-M3-MXFP4", "MI355X", A3, "vllm", None, 8, 1, "rt"),       # realized under the fused-shared + decode switch
    ("MiniMax-M3-MXFP4", "MI355X", A3, "vllm", "0.31.0", 8, 1, "rt"),
    ("MiniMax-M3-MXFP4", "MI355X", A20, "sglang", None, 8, 8, "rt"),
    ("DeepSeek-V3", "MI355X", A3, "vllm", None, 8, 1, "rt"),
    ("DeepSeek-V3", "MI300X", A20, "sglang", None, 8, 8, "rt"),
    ("DeepSeek-V4-Pro", "MI355X", A20, "vllm", None, 8, 1, "bound0"),
    ("DeepSeek-V4-Pro", "MI355X", A20, "sglang", None, 8, 8, "rt"),
    ("gpt-oss-120b", "MI355X", A20, "vllm", None, 1, 1, "rt"),
    ("gpt-oss-120b", "MI300X", A20, "vllm", None, 8, 1, "rt"),
    ("GLM-5.1-MXFP4", "MI355X", A20, "vllm", None, 8, 1, "rt"),
    ("GLM-5.1-MXFP4", "MI355X:CPX", A20, "vllm", None, 64, 1, "rt"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "MI300X", A3, "vllm", None, 8, 1, "rt"),
    ("Qwen3-Next-80B-A3B-FP8", "MI300X", A20, "sglang", None, 4, 1, "rt"),
    ("Kimi-K2.5", "MI355X", A20, "vllm", None, 8, 1, "rt"),
    # refused launches: the nearest safe alternatives are searched with the plan's runtime
    ("Qwen3-30B-A3B", "MI355X", A3, "vllm", None, 3, 1, "rt"),
    ("DeepSeek-V3", "MI300X", A3, "vllm", None, 1, 1, "rt"),
    ("Qwen3-30B-A3B", "MI355X", A3, "sglang", None, 1, 8, "rt"),
    ("MiniMax-M3-MXFP8", "MI300X", A3, "vllm", None, 8, 8, "rt"),
]


def _reasons(reasons) -> list[list]:
    return [[r.kind, r.text, r.source, r.issue, r.confidence] for r in reasons]


def _key(case) -> str:
    return " ".join(str(x) for x in case)


def plan_of(case, backends):
    """The plan of one CASE (its model, target, AITER release, layout and runtime)."""
    model, target, aiter, engine, version, tp, ep, rt = case
    env = RUNTIMES[rt]
    runtime = None if env is None else Runtime.build(tokens=TOKENS, env={}, overrides=env)
    return plan_model(load_model(model), fake_capabilities(target, aiter), tp, ep, backends=backends,
                      runtime=runtime)


def record(case, backends) -> dict:
    model, target, aiter, engine, version, tp, ep, rt = case
    plan = plan_of(case, backends)
    r = build_recipe(plan, engine, version)
    out = r.to_dict()
    for key in ("warning_details", "reason_details"):
        out.pop(key, None)
    out["warnings"] = _reasons(r.warnings)
    out["reasons"] = _reasons(r.refusals)
    out["caveats"] = _reasons(r.caveats)
    realized = r.plan or plan
    out["realized_plan"] = {
        "remade": r.plan is not None,
        "aiter_env": [list(kv) for kv in (realized.runtime.env if realized.runtime is not None else ())],
        "moe": sorted({(d.backend or "-", d.padding.intermediate_per_rank) for d in realized.decisions
                       if d.layer.kind == "moe"}),
    }
    out["table"] = render_recipe(plan, engine, version=version, recipe=r).splitlines()[1:]  # line 0: fingerprint
    return out


def regenerate() -> None:
    from moedispatch.selector.plugins import build_registry

    backends = build_registry().backends
    out = {_key(c): record(c, backends) for c in CASES}
    GOLDEN.write_text(json.dumps(out, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


_DATA: dict = {}


def _golden() -> dict:
    if not _DATA:
        _DATA.update(json.loads(GOLDEN.read_text(encoding="utf-8")))
    return _DATA


REGENERATE = ("differs from tests/golden/recipes.json; after an intended change regenerate with `python "
              "tests/test_golden_recipes.py` and review `git diff tests/golden/`")


@pytest.mark.parametrize("case", CASES, ids=[_key(c) for c in CASES])
def test_recipe_matches_the_golden_file(builtins, case):
    from test_golden_decisions import _first_difference

    golden = _golden()
    assert _key(case) in golden, f"no golden entry {_key(case)}: {REGENERATE}"
    now = json.loads(json.dumps(record(case, builtins)))
    assert now == golden[_key(case)], f"{REGENERATE}; first difference {_first_difference(golden[_key(case)], now)}"


def test_no_stale_entries():
    assert set(_golden()) == {_key(c) for c in CASES}, REGENERATE


def test_the_golden_recipes_exercise_what_only_runtime_plans_do():
    """The file is worth its size only if it holds the runtime-only behaviour: a recipe re-made under an AITER
    switch, an exported AITER environment, a refusal with alternatives."""
    golden = _golden()
    assert any(v["realized_plan"]["remade"] for v in golden.values())
    assert any(e.get("why", "").startswith("the plan's simulation") for v in golden.values() for e in v["env"])
    assert any(v["command"] is None and v["alternatives"] for v in golden.values())


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    regenerate()
