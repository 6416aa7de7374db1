"""engine_choice("sglang") against the REAL SGLang 0.5.23 code that runs on a CPU: the unquantized AITER CK gate
(AITER runner or the Triton fallback) and the intermediate/rank SGLang allocates with SGLANG_USE_AITER=1 for bf16,
FP8 and Quark MXFP4 W4A4 (sglang.srt.layers.moe.utils.get_moe_weight_sizes). Skipped when .peers-venv is absent."""

from __future__ import annotations

import pytest

import peers
from moedispatch.data import capdb
from moedispatch.engines.choice import engine_choice


@pytest.fixture
def sglang_oracle():
    data = peers.sglang_oracle_data()
    if data is None:
        pytest.skip("SGLang peer environment absent (.peers-venv with sglang): run tests/peers/setup_env.sh")
    return data


def test_engine_choice_matches_real_sglang_gate_and_padding(sglang_oracle):
    """Every case agrees: runner (bf16 gate) and allocated intermediate/rank."""
    cases, answers = sglang_oracle
    assert len(cases) >= 300
    caps = {g: capdb.target_capabilities(g, None) for g in ("gfx942", "gfx950")}
    misses = []
    for case, ans in zip(cases, answers):
        f = dict(peers.SCHEMES[peers.SGLANG_SCHEMES[case["scheme"]]])
        ch = engine_choice("sglang", "0.5.23", caps=caps[case["gfx"]], env={"SGLANG_USE_AITER": "1"},
                           hidden_size=case["h"], intermediate_size=case["i"] * 8, tp_size=8, num_experts=128,
                           top_k=8, activation=case["activation"], **f)
        if (ch.backend, ch.intermediate_per_rank) != (ans["backend"], ans["intermediate_per_rank"]):
            misses.append(f"{case}: ours {ch.backend} {ch.intermediate_per_rank} vs SGLang {ans}")
    assert not misses, "\n".join(misses[:20])
