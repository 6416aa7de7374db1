"""engine_choice() against the REAL vLLM 0.33.0 MoE oracles, run in their own environment (.peers-venv).

The oracles run unmodified on a CPU with two stand-in packages (tests/peers/stubs: an ``amdsmi`` reporting the
simulated gfx target, an ``aiter`` whose ``fused_moe`` has the real signature) and ``VLLM_ROCM_USE_AITER`` as the
switch; tests/peers/vllm_side.py makes the calls each quantization method makes. Skipped when the environment is
absent (build it with ``tests/peers/setup_env.sh``; ``.ci/run`` does).
"""

from __future__ import annotations

import collections

import pytest

import peers
from moedispatch.data import capdb
from moedispatch.engines.choice import engine_choice


@pytest.fixture
def vllm_oracle():
    data = peers.vllm_oracle_data()
    if data is None:
        pytest.skip("vLLM peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    return data


#: Cases where engine_choice may knowingly differ from vLLM 0.33.0, each with why. Empty: every case agrees.
KNOWN_EXCEPTIONS: dict[str, str] = {}


def _caps():
    return {g: capdb.target_capabilities(g, None) for g in ("gfx942", "gfx950")}


def _env(case):
    return peers.case_env(case)


def _ours(case, caps):
    ch = engine_choice("vllm", "0.33.0", caps=caps[case["gfx"]], env=_env(case), moe_backend=case["moe_backend"],
                       **peers.fields(case))
    return (ch.backend if ch.ok else None, ch.hidden, ch.intermediate_per_rank, ch.error is not None), ch


def _theirs(answer):
    err = answer["error"] is not None
    return (None if err else answer["backend"], answer["hidden"], answer["intermediate_per_rank"], err)


@pytest.fixture
def answers(vllm_oracle):
    return vllm_oracle["grid"]


def test_engine_choice_matches_real_vllm_on_the_grid(answers):
    """Backend, padded hidden and intermediate/rank, and refusal agree with vLLM 0.33.0 on >= 99% of >= 2,000 cases
    (schemes × gfx942/gfx950 × AITER on/off × activations × sizes, plus every forced --moe-backend value)."""
    cases, theirs = answers
    assert len(cases) >= 2000
    caps = _caps()
    misses = collections.Counter()
    example = {}
    for case, ans in zip(cases, theirs):
        ours, ch = _ours(case, caps)
        if ours != _theirs(ans):
            key = (case["scheme"], case.get("quant_method"), case["gfx"], case["aiter"], case["activation"],
                   case["moe_backend"])
            misses[key] += 1
            example.setdefault(key, (case, ours, _theirs(ans), ans["error"], ch.error))
    agree = 1 - sum(misses.values()) / len(cases)
    detail = "\n".join(f"{n}× {k}: ours {example[k][1]} ({example[k][4]}) vs vLLM {example[k][2]} ({example[k][3]})"
                       for k, n in misses.most_common(20))
    assert agree >= 0.99, f"agreement {agree:.4f} over {len(cases)} cases:\n{detail}"
    unexplained = [k for k in misses if str(k) not in KNOWN_EXCEPTIONS]
    assert not unexplained, f"agreement {agree:.4f}; unlisted exceptions:\n{detail}"


def test_flagship_and_issue_classes_against_real_vllm(answers):
    """The disagreement classes of the issue, as vLLM 0.33.0 itself answers them (not only as our model does)."""
    cases, theirs = answers
    by = {(c["scheme"], c.get("quant_method"), c["gfx"], c["aiter"], c["activation"], c["i"], c["h"],
           c["moe_backend"]): a for c, a in zip(cases, theirs)}
    # MiniMax-M3-MXFP4 TP8 on gfx950 with AITER: W4A4 keeps 384 (128 alignment), hidden 6144.
    a = by[("mxfp4_w4a4", None, "gfx950", True, "swigluoai_uninterleave", 384, 6144, "auto")]
    assert (a["backend"], a["hidden"], a["intermediate_per_rank"]) == ("AITER_MXFP4_MXFP4", 6144, 384)
    # FP8 on AITER: no round-up.
    a = by[("fp8_tensor", None, "gfx950", True, "silu", 1408, 2880, "auto")]
    assert (a["backend"], a["hidden"], a["intermediate_per_rank"]) == ("AITER", 2880, 1408)
    # FP8 block with a shard of 96: scales refined; AITER forced by the environment raises, Triton runs without it.
    assert by[("fp8_block", None, "gfx950", True, "silu", 96, 2880, "auto")]["error"]
    assert by[("fp8_block", None, "gfx950", False, "silu", 96, 2880, "auto")]["backend"] == "TRITON"
    # ... and 360 cannot be refined: weight creation raises.
    assert by[("fp8_block", None, "gfx950", False, "silu", 360, 2880, "auto")]["stage"] == "create_weights"
    # MXFP4 W4A16 + SiLU without AITER: OAI Triton takes only SwiGLU-OAI, auto ends on EMULATION.
    assert by[("mxfp4_w4a16", None, "gfx950", False, "silu", 384, 6144, "auto")]["backend"] == "EMULATION"
    # MXFP4 W4A16 on gfx942 with AITER: AITER's Triton a16w4 kernel.
    assert by[("mxfp4_w4a16", None, "gfx942", True, "swigluoai", 384, 2880, "auto")]["backend"] == \
        "AITER_TRITON_MXFP4_BF16"
    # MXFP8 on gfx950 with AITER: AITER_MXFP8, no padding; interleaved SwiGLU-OAI is refused by it (TRITON_MXFP8).
    a = by[("mxfp8", None, "gfx950", True, "silu", 384, 6144, "auto")]
    assert (a["backend"], a["hidden"], a["intermediate_per_rank"]) == ("AITER_MXFP8", 6144, 384)
    assert by[("mxfp8", None, "gfx950", True, "swigluoai", 384, 6144, "auto")]["backend"] == "TRITON_MXFP8"
    # MXFP8 with a shard not divisible by 32 raises at weight creation.
    assert by[("mxfp8", None, "gfx950", True, "silu", 360, 6144, "auto")]["stage"] == "create_weights"
