"""No vLLM recipe moedispatch prints carries a --moe-backend the REAL vLLM 0.33.0 refuses for that model's layers.

Every built-in model × gfx942/gfx950 × TP 1/8: build the vLLM recipe, take its ``--moe-backend`` value and its
environment, and ask the real oracles (tests/peers/vllm_side.py) for each MoE layer group. Skipped when the peer
environment (.peers-venv) is absent.
"""

from __future__ import annotations

import pytest

import peers
from moedispatch.engines.choice import choice_for_layer


@pytest.fixture
def vllm_oracle():
    data = peers.vllm_oracle_data()
    if data is None:
        pytest.skip("vLLM peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    return data


def test_no_recipe_forced_backend_is_refused_by_real_vllm(vllm_oracle):
    """Every forced --moe-backend (with the recipe's env) is accepted by vLLM 0.33.0 for every MoE layer group, and
    engine_choice predicts the same backend and allocation."""
    cases, meta, answers = vllm_oracle["recipes"]
    assert cases, "no recipe with a launch command was built"
    refused, mismatched = [], []
    for case, ans, (name, gfx, tp, layer, caps, plan) in zip(cases, answers, meta):
        if ans["error"]:
            refused.append(f"{name} {gfx} tp{tp} --moe-backend {case['moe_backend']} env={case['env']}: {ans['error']}")
        ch = choice_for_layer(layer, caps, "vllm", "0.33.0", env=case["env"], moe_backend=case["moe_backend"],
                              quant_method=case.get("quant_method"))
        ours = (ch.backend if ch.ok else None, ch.hidden, ch.intermediate_per_rank)
        theirs = (None if ans["error"] else ans["backend"], ans["hidden"], ans["intermediate_per_rank"])
        if ours != theirs:
            mismatched.append(f"{name} {gfx} tp{tp}: ours {ours} vs vLLM {theirs}")
    assert not mismatched, "\n".join(mismatched)
    assert not refused, "\n".join(refused)
