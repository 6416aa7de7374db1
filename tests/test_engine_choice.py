"""engine_choice(): what vLLM 0.33.0 / SGLang 0.5.23 do on their own, without the engines installed.

Every vLLM expectation below is what the real vLLM 0.33.0 oracle answered for the same layer (tests/peers/ runs them
all again, plus 5,000 more, when .peers-venv exists); the SGLang ones follow sgl-project/sglang@v0.5.23's
quantization methods (capability_db/engines/sglang.toml names the files).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import moedispatch
from moedispatch.data import capdb
from moedispatch.engines.choice import (EngineChoice, choice_for_layer, compare_plan, engine_choice, findings,
                                       parse_engine_spec)
from moedispatch.core.errors import UsageError
from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model, plan_to_json

ON = {"VLLM_ROCM_USE_AITER": "1"}
Q = {
    "bf16": dict(weight_quant="bf16"),
    "fp8": dict(weight_quant="fp8", activation_quant="fp8"),
    "fp8b": dict(weight_quant="fp8", weight_granularity="block128x128", activation_quant="fp8",
                 activation_granularity="group128"),
    "w4a16": dict(weight_quant="mxfp4", activation_quant="bf16"),
    "w4a4": dict(weight_quant="mxfp4", activation_quant="mxfp4"),
    "mxfp8": dict(weight_quant="mxfp8", activation_quant="mxfp8"),
}


@pytest.fixture(scope="module")
def caps():
    return {g: capdb.target_capabilities(g, None) for g in ("gfx942", "gfx950")}


def _vllm(caps, gfx, q, act, h, i, env=None, mb="auto", **kw):
    return engine_choice("vllm", "0.33.0", caps=caps[gfx], env=env or {}, moe_backend=mb, hidden_size=h,
                         intermediate_size=i * 8, tp_size=8, num_experts=128, top_k=8, activation=act, **Q[q], **kw)


# (gfx, scheme, activation, hidden, I/rank, env, --moe-backend, quant_method) → (backend, hidden, I/rank, error?)
CASES = [
    # The flagship: MiniMax-M3-MXFP4 TP8 on gfx950 with AITER keeps 384 (W4A4 aligns the intermediate to 128).
    ("gfx950", "w4a4", "swigluoai_uninterleave", 6144, 384, ON, "auto", None, ("AITER_MXFP4_MXFP4", 6144, 384, False)),
    # ... and without the AITER switch (vLLM's default) ends on EMULATION, 32-aligned.
    ("gfx950", "w4a4", "swigluoai_uninterleave", 6144, 384, {}, "auto", None, ("EMULATION", 6144, 384, False)),
    ("gfx950", "w4a4", "silu", 2880, 96, ON, "auto", None, ("AITER_MXFP4_MXFP4", 3072, 128, False)),
    # bf16 / fp8 with SwiGLU-OAI: vLLM runs AITER (CK 64/128 intermediate rule for bf16, no FP8 round-up).
    ("gfx950", "bf16", "swigluoai", 2880, 360, ON, "auto", None, ("AITER", 2880, 384, False)),
    ("gfx942", "bf16", "silu", 2880, 96, ON, "auto", None, ("AITER", 2880, 128, False)),
    ("gfx950", "fp8", "silu", 2880, 1408, ON, "auto", None, ("AITER", 2880, 1408, False)),
    ("gfx950", "bf16", "silu", 4096, 192, {}, "auto", None, ("TRITON", 4096, 192, False)),
    # FP8 128x128 with shard 96: scales refined to 32 → forced-by-env AITER raises; without AITER Triton runs.
    ("gfx950", "fp8b", "silu", 2880, 96, ON, "auto", None, (None, None, None, True)),
    ("gfx950", "fp8b", "silu", 2880, 96, {}, "auto", None, ("TRITON", 2880, 96, False)),
    # ... shard 360 cannot be refined (gcd 8): weight creation raises.
    ("gfx950", "fp8b", "silu", 2880, 360, {}, "auto", None, (None, None, None, True)),
    # --moe-backend aiter pads a non-refinable-for-AITER shard to whole blocks (global dims 128-aligned).
    ("gfx950", "fp8b", "silu", 6144, 96, ON, "aiter", None, ("AITER", 6144, 128, False)),
    # MXFP4 W4A16 + SiLU without AITER: OAI Triton takes only SwiGLU-OAI → EMULATION; --moe-backend triton raises.
    ("gfx950", "w4a16", "silu", 2880, 360, {}, "auto", None, ("EMULATION", 2880, 384, False)),
    ("gfx950", "w4a16", "silu", 2880, 360, {}, "triton", None, (None, None, None, True)),
    ("gfx950", "w4a16", "swigluoai", 2880, 360, {}, "auto", None, ("TRITON", 3072, 512, False)),
    # MXFP4 W4A16 on gfx942 with AITER: AITER's Triton a16w4 kernel, 256/256.
    ("gfx942", "w4a16", "swigluoai", 2880, 360, ON, "auto", None, ("AITER_TRITON_MXFP4_BF16", 3072, 512, False)),
    # gfx950 with AITER: AITER W4A16 (CK), 256/256 from a Quark checkpoint ...
    ("gfx950", "w4a16", "silu", 2880, 96, ON, "auto", None, ("AITER_MXFP4_BF16", 3072, 256, False)),
    # ... but 128/128 from an `mxfp4` (non-gpt-oss) checkpoint, whose quant method passes the activation.
    ("gfx950", "w4a16", "silu", 2880, 96, ON, "auto", "mxfp4", ("AITER_MXFP4_BF16", 2944, 128, False)),
    ("gfx942", "w4a16", "swigluoai", 2880, 96, ON, "auto", "mxfp4", ("EMULATION", 2880, 96, False)),
    # MXFP8: AITER_MXFP8 on gfx950 with AITER, no padding; interleaved SwiGLU-OAI → TRITON_MXFP8; gfx942 emulates.
    ("gfx950", "mxfp8", "silu", 6144, 384, ON, "auto", None, ("AITER_MXFP8", 6144, 384, False)),
    ("gfx950", "mxfp8", "swigluoai", 6144, 384, ON, "auto", None, ("TRITON_MXFP8", 6144, 384, False)),
    ("gfx942", "mxfp8", "silu", 6144, 384, ON, "auto", None, ("EMULATION", 6144, 384, False)),
    # MXFP8 with a shard not divisible by 32: weight creation raises; --moe-backend emulation is not an MXFP8 value.
    ("gfx950", "mxfp8", "silu", 6144, 360, ON, "auto", None, (None, None, None, True)),
    ("gfx950", "mxfp8", "silu", 6144, 384, {}, "emulation", None, (None, None, None, True)),
]


@pytest.mark.parametrize("gfx,q,act,h,i,env,mb,qm,expected", CASES)
def test_vllm_choice_matches_the_real_oracle(caps, gfx, q, act, h, i, env, mb, qm, expected):
    """Backend, allocation and refusal as the real vLLM 0.33.0 answered them."""
    kw = {"quant_method": qm} if qm else {}
    ch = _vllm(caps, gfx, q, act, h, i, env, mb, **kw)
    assert (ch.backend if ch.ok else None, ch.hidden, ch.intermediate_per_rank, not ch.ok) == expected, ch.to_dict()


def test_choice_reasons_cite_the_release_and_refusals_say_where(caps):
    """The decision reason names vLLM's class and cites vllm@v0.33.0; a refusal carries vLLM's own error text and
    the stage (selection or weight creation)."""
    ch = _vllm(caps, "gfx950", "w4a4", "swigluoai_uninterleave", 6144, 384, ON)
    assert ch.kernel_class == "AiterMxfp4Experts" and ch.family == "aiter-ck"
    assert ch.reasons[0].kind == "decision" and "vllm-project/vllm@v0.33.0:" in ch.reasons[0].source
    assert any(r.kind == "padding" and "mxfp4_round_up" in r.source for r in ch.reasons)
    bad = _vllm(caps, "gfx950", "fp8b", "silu", 2880, 360, {})
    assert bad.stage == "create_weights" and "not divisible by weight quantization block_n = 128" in bad.error
    forced = _vllm(caps, "gfx950", "w4a16", "silu", 2880, 360, {}, "triton")
    assert forced.stage == "select" and "MoEActivation.SILU" in forced.error
    d = bad.to_dict()
    assert set(d) >= {"backend", "family", "hidden", "intermediate_per_rank", "error", "reasons", "reason_details"}
    json.dumps(d)


def test_env_semantics_follow_vllm(caps):
    """VLLM_ROCM_USE_AITER absent means off; 'true' counts; VLLM_ROCM_USE_AITER_MOE=0 keeps AITER's MoE off; no
    AITER installed means off whatever the environment says."""
    assert _vllm(caps, "gfx950", "bf16", "silu", 4096, 256, {"VLLM_ROCM_USE_AITER": "true"}).backend == "AITER"
    assert _vllm(caps, "gfx950", "bf16", "silu", 4096, 256, {"VLLM_ROCM_USE_AITER": "0"}).backend == "TRITON"
    off = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}
    assert _vllm(caps, "gfx950", "bf16", "silu", 4096, 256, off).backend == "TRITON"
    none = capdb.target_capabilities("gfx950", "none")
    ch = engine_choice("vllm", caps=none, env=ON, hidden_size=4096, intermediate_size=2048, tp_size=8, num_experts=64,
                       top_k=8)
    assert ch.backend == "TRITON"


def test_sglang_runner_and_padding(caps):
    """SGLang 0.5.23: AITER with SGLANG_USE_AITER (FP8 pads I/rank to 128, packed MXFP4 to 256), the unquantized CK
    gate refuses shards that are not 128-aligned and SwiGLU-OAI on gfx95x, Quark MXFP4 needs the AITER runner."""
    on = {"SGLANG_USE_AITER": "1"}

    def sg(gfx, q, act, i, env, mb="auto"):
        return engine_choice("sglang", caps=caps[gfx], env=env, moe_backend=mb, hidden_size=2880,
                             intermediate_size=i * 8, tp_size=8, num_experts=128, top_k=8, activation=act, **Q[q])

    assert (sg("gfx950", "fp8", "silu", 360, on).backend, sg("gfx950", "fp8", "silu", 360, on).intermediate_per_rank) \
        == ("AITER", 384)
    assert sg("gfx950", "fp8", "silu", 360, {}).backend == "TRITON"
    assert sg("gfx950", "w4a4", "silu", 384, on).intermediate_per_rank == 512
    assert sg("gfx950", "bf16", "silu", 96, on).backend == "TRITON"
    assert sg("gfx950", "bf16", "swigluoai", 256, on).backend == "TRITON"
    assert sg("gfx942", "bf16", "swigluoai", 256, on).backend == "AITER"
    assert not sg("gfx950", "bf16", "silu", 96, on, "aiter").ok
    assert not sg("gfx950", "w4a4", "silu", 384, on, "triton").ok
    with pytest.raises(UsageError, match="SGLang 0.5.23 model covers"):
        sg("gfx950", "mxfp8", "silu", 384, on)


@pytest.mark.parametrize("call,match", [
    (lambda c: engine_choice("tgi", caps=c, hidden_size=64, intermediate_size=64, num_experts=8, top_k=2),
     "unknown engine"),
    (lambda c: engine_choice("vllm", "0.20.0", caps=c, hidden_size=64, intermediate_size=64, num_experts=8, top_k=2),
     "no model of vllm 0.20.0"),
    (lambda c: engine_choice("vllm", "x.y", caps=c, hidden_size=64, intermediate_size=64, num_experts=8, top_k=2),
     "not a PEP 440 version"),
    (lambda c: engine_choice("vllm", caps=c, moe_backend="nope", hidden_size=64, intermediate_size=64, num_experts=8,
                             top_k=2), None),
    (lambda c: engine_choice("vllm", caps=c, hidden_size=64, intermediate_size=64, num_experts=8, top_k=2, bogus=1),
     "unknown layer field"),
    (lambda c: engine_choice("vllm", caps=c, env=["X"], hidden_size=64, intermediate_size=64, num_experts=8, top_k=2),
     "env must be a mapping"),
    (lambda c: parse_engine_spec("sglang@"), None),
])
def test_bad_input_is_one_usage_error_or_a_refusal(caps, call, match):
    """Bad input raises one UsageError; an unknown --moe-backend value is vLLM's own refusal (not a crash): its parser's
    'invalid choice' (vllm/config/kernel.py MoEBackend), before any oracle runs."""
    if match is None:
        out = call(caps["gfx950"])
        assert out is not None and (not isinstance(out, EngineChoice)
                                    or ("invalid choice: 'nope'" in out.error and out.stage == "args"))
        return
    with pytest.raises(UsageError, match=match):
        call(caps["gfx950"])


def test_public_api_and_quant_method_accepted_by_select(caps):
    """moedispatch.engines.choice / EngineChoice are exported lazily; select_moe_backend takes the same fields."""
    assert moedispatch.EngineChoice is EngineChoice
    ch = moedispatch.engine_choice("vllm", caps=caps["gfx950"], env=ON, hidden_size=4096, intermediate_size=1536,
                                   num_experts=64, top_k=8)
    assert ch.backend == "AITER"
    d = moedispatch.select_moe_backend(caps=caps["gfx950"], hidden_size=4096, intermediate_size=1536, num_experts=64,
                                       top_k=8, quant_method="fp8")
    assert d.backend


def test_compare_plan_classifies_each_group(caps):
    """MiniMax-M3-MXFP4 TP8 gfx950: with AITER vLLM runs aiter.fused_moe but allocates 384, not the plan's 512 — and
    at 384 with vLLM's default AITER environment decode runs CK-Tile heuristics, wrong per ROCm/aiter#5233: "wrong";
    without AITER it emulates (correct, slower). gpt-oss-120b gfx942 without AITER: vLLM's Triton is correct but
    outranked. A model whose scheme is not modelled for SGLang says so instead of guessing."""
    m3 = plan_model(load_model("MiniMax-M3-MXFP4"), caps["gfx950"], tp=8)
    [on] = compare_plan(m3, "vllm", "0.33.0", env=ON)
    assert on["verdict"] == "wrong" and on["padding_differs"]
    assert any(w["issue"] == "ROCm/aiter#5233" for w in on["why_details"])
    assert on["engine"]["intermediate_per_rank"] == 384 and on["moedispatch"]["intermediate_per_rank"] == 512
    [off] = compare_plan(m3, "vllm", env={})
    assert off["verdict"] == "slower" and off["engine"]["backend"] == "EMULATION"
    auto = compare_plan(m3, "vllm", "0.33.0", env=ON, quant_method=m3.model.quant_method)
    assert auto[0]["layers"][0] == 3 and "engine_auto" not in plan_to_json(m3)
    m8 = plan_model(load_model("MiniMax-M3-MXFP8"), caps["gfx950"], tp=8)
    assert compare_plan(m8, "sglang", env={"SGLANG_USE_AITER": "1"})[0]["verdict"] == "unmodelled"
    layer = next(d.layer for d in m3.decisions if d.layer.kind == "moe")
    assert choice_for_layer(layer, caps["gfx950"], "vllm", env=ON).backend == "AITER_MXFP4_MXFP4"


def test_explain_engine_flag_through_the_cli():
    """explain --engine prints the engine's own choice per group (table) or engine_auto (JSON); a bad engine spec or
    --engine-env is exit 2 with one line."""
    base = [sys.executable, "-m", "moedispatch", "explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950",
            "--tp", "8"]
    r = subprocess.run(base + ["--brief", "--engine", "vllm", "--engine-env", "VLLM_ROCM_USE_AITER=1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "vllm 0.33.0 --moe-backend auto (VLLM_ROCM_USE_AITER=1) → AITER_MXFP4_MXFP4" in r.stdout
    r = subprocess.run(base + ["--format", "json", "--engine", "vllm@0.33.0"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["engine_auto"][0]["engine"]["backend"] == "EMULATION"
    for bad in (["--engine", "vllm@0.1"], ["--engine", "foo"], ["--engine", "vllm", "--engine-env", "X"]):
        r = subprocess.run(base + bad, capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_findings_resolve_every_issue_class_with_a_v0_33_source():
    """Each disagreement class of issue 17 is recorded with who is right, the rule to follow and a vLLM v0.33.0
    source the selector/recipes engineers can cite."""
    got = {f["id"]: f for f in findings("vllm", "0.33.0")}
    for prefix in ("S1-", "P2-", "P1-", "S2-S3-", "S5-", "S6-", "S7-S9-P3-", "S8-"):
        f = next(v for k, v in got.items() if k.startswith(prefix))
        assert f["side"] in ("vllm", "moedispatch", "open") and f["rule"]
        assert "vllm-project/vllm@v0.33.0:" in f["source"]
        assert f["confidence"] in ("confirmed", "derived", "unconfirmed")


def test_comparison_lines_carry_the_matching_finding(caps):
    """Where vLLM and the plan differ, the comparison names the resolved class and who is right: the flagship's 384 vs
    512 is P2 (open: vLLM's 384 is safe only under the switches that make AITER's tuned 384 rows decide every
    bucket); a Quark MXFP4 W4A16 SiLU layer without AITER is S5."""
    m3 = plan_model(load_model("MiniMax-M3-MXFP4"), caps["gfx950"], tp=8)
    [on] = compare_plan(m3, "vllm", env=ON)
    assert any(w.startswith("[P2-mxfp4-w4a4-aiter-round-up-128] unresolved") for w in on["why"])
    from moedispatch.engines.choice import compare_decision
    from moedispatch.core.fields import layer_from_fields
    from moedispatch.selector.pure import select
    from moedispatch.selector.plugins import get_registry

    layer = layer_from_fields(dict(hidden_size=2880, intermediate_size=2880, tp_size=8, num_experts=128, top_k=4,
                                   activation="silu", **Q["w4a16"]))
    d = select(layer, caps["gfx950"], get_registry().backends)
    ch = choice_for_layer(layer, caps["gfx950"], "vllm")
    assert ch.backend == "EMULATION"
    out = compare_decision(d, ch)
    assert any(w.startswith("[S5-mxfp4-w4a16-silu-triton]") for w in out["why"])


def test_recipe_json_carries_engine_auto_and_engine_forced():
    """explain --recipe vllm --format json: per MoE group what vLLM does on auto and with the recipe's forced value
    (both with the recipe's env); the forced value is one vLLM accepts for every group."""
    r = subprocess.run([sys.executable, "-m", "moedispatch", "explain", "--model", "gpt-oss-120b", "--target", "gfx942",
                        "--tp", "8", "--recipe", "vllm", "--format", "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    forced = next(a["arg"].split()[-1] for a in d["args"] if a["arg"].startswith("--moe-backend"))
    assert d["engine_forced"] and all(g["engine"]["moe_backend"] == forced for g in d["engine_forced"])
    assert all(g["verdict"] != "refused" for g in d["engine_forced"])
    assert all(g["engine"]["moe_backend"] == "auto" for g in d["engine_auto"])


def test_a_bug_in_the_dispatch_model_is_not_read_as_no_known_issue(caps, monkeypatch):
    """The engine comparison asks the dispatch model which kernels the engine's allocation runs; a shape the model
    cannot key (UsageError) makes no claim, but any other failure is a bug and must surface, not turn a 'wrong'
    verdict into 'same' (it was an ``except Exception``)."""
    from moedispatch.aiter import dispatch as aiter_dispatch

    m3 = plan_model(load_model("MiniMax-M3-MXFP4"), caps["gfx950"], tp=8)
    assert compare_plan(m3, "vllm", env=ON)  # the AITER path is compared against the dispatch model

    def broken(*args, **kwargs):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(aiter_dispatch, "plan_dispatch", broken)
    with pytest.raises(RuntimeError, match="planted bug"):
        compare_plan(m3, "vllm", env=ON)

    def unkeyable(*args, **kwargs):
        raise UsageError("AITER dispatch needs a target GPU arch (gfx)")

    monkeypatch.setattr(aiter_dispatch, "plan_dispatch", unkeyable)
    assert compare_plan(m3, "vllm", env=ON)


def test_an_unmodelled_engine_release_suggests_a_recipe_only_within_the_recipes_range():
    from moedispatch.engines.choice import _data

    """--engine vllm@0.1 suggested "--recipe vllm --engine-version 0.1", a recipe that release cannot have (recipes
    cover 0.23.0 … 0.33.0): following it gave one "no known way to select …" per backend."""
    with pytest.raises(UsageError) as old:
        _data("vllm", "0.1")
    assert "a recipe for it" not in str(old.value) and "recipes cover vllm 0.23.0 … 0.33.0" in str(old.value)
    with pytest.raises(UsageError) as covered:
        _data("vllm", "0.30")
    assert "a recipe for it: --recipe vllm --engine-version 0.30" in str(covered.value)
