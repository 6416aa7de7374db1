"""Issue 15's practitioner checks on the built-in models: the decision and the source on the line that matters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moedispatch import plan_model
from moedispatch.sources.models import parse_config
from moedispatch.testing import fake_capabilities


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def _sources(decision) -> str:
    return " ".join(r.source or "" for r in decision.reasons)


def test_kimi_k3_explains_instead_of_exiting_2():
    """SiTU parses (hidden_act situ -> situv2) and the CLI plans the model with exit 0."""
    proc = subprocess.run([sys.executable, "-m", "moedispatch", "explain", "--model", "Kimi-K3-MXFP4", "--target",
                           "MI355X", "--aiter-version", "0.1.20.post1", "--tp", "8", "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    layer = next(la for la in json.loads(proc.stdout)["layers"] if la["kind"] == "moe")
    assert layer["backend"] == "aiter-flydsl" and layer["padding"]["intermediate_per_rank"] == 384


@pytest.mark.parametrize("hidden_act", ["situ", "SiTU", "situv2"])
def test_situ_spellings_parse(hidden_act):
    cfg = {"architectures": ["X"], "model_type": "kimi_k3", "hidden_size": 3584, "moe_intermediate_size": 3072,
           "n_routed_experts": 896, "num_experts_per_tok": 16, "num_hidden_layers": 2, "hidden_act": hidden_act,
           "situ_beta": 2.0}
    spec = parse_config(cfg, name="k3", source="path")
    assert spec.activation == "situv2" and dict(spec.activation_params) == {"beta": 2.0}


def test_kimi_k3_on_mi325x_needs_aiter_0_1_20():
    """gfx942 FlyDSL SiTUv2 arrived with ROCm/aiter#4502 (v0.1.20); before it the plan falls back to emulation."""
    old = _moe(plan_model("Kimi-K3-MXFP4", tp=8, caps=fake_capabilities("MI325X", "0.1.19")))
    new = _moe(plan_model("Kimi-K3-MXFP4", tp=8, caps=fake_capabilities("MI325X", "0.1.20")))
    assert old.backend == "emulation" and new.backend == "aiter-flydsl"
    assert "ROCm/aiter#4502" in " ".join(r.text for r in old.rejection("aiter-flydsl").reasons)


def test_gpt_oss_on_mi300x_runs_aiter_triton():
    d = _moe(plan_model("gpt-oss-120b", tp=8, caps=fake_capabilities("MI300X")))
    assert d.backend == "aiter-triton" and d.padding.intermediate_per_rank == 512
    assert "vllm-project/vllm#50622" in _sources(d) and "vllm-project/vllm#55934" in _sources(d)
    assert d.rejection("triton").supported  # Triton stays correct, only outranked


def test_minimax_m3_mxfp4_ep8_runs_aiter_with_whole_experts():
    d = _moe(plan_model("MiniMax-M3-MXFP4", tp=8, ep=8, caps=fake_capabilities("MI355X")))
    assert d.backend == "aiter-flydsl" and d.padding.intermediate_per_rank == 3072
    assert "ROCm/aiter#3832" in _sources(d)  # the a4w4 port's expert_mask caveat at recent AITER


def test_deepseek_v4_w4a8_tp8():
    """Before AITER 0.1.18 FlyDSL a8w4 needs 256-aligned K: 384/rank pads to 512, where the bucket-4 xcd4 kernel
    (aiter#3933) is flagged. From 0.1.18 (ROCm/aiter#4130, sgl-project/sglang#31450) 384 runs unpadded."""
    old = _moe(plan_model("DeepSeek-V4-Pro", tp=8, caps=fake_capabilities("MI355X", "0.1.17")))
    assert old.backend == "aiter-flydsl" and old.padding.intermediate_per_rank == 512
    assert any(r.issue == "aiter#3933" for r in old.reasons)  # the bucket-4 xcd4 wrong-output caveat
    new = _moe(plan_model("DeepSeek-V4-Pro", tp=8, caps=fake_capabilities("MI355X")))
    assert new.backend == "aiter-flydsl" and new.padding.intermediate_per_rank == 384
    assert "ROCm/aiter#4130" in _sources(new)
