"""Issues 12 and 13 in the decision: what AITER's own dispatcher runs per token count, the padding those kernels
need, kernel × bucket bugs on the layer, predicted cost, and correct backends ordered by time.

Sources of the motivating cases:
- DeepSeek-V3 rows of the PyPI amd-aiter 0.1.7.post2.dev18 wheel's aiter/configs/tuned_fmoe.csv (installed here).
- MiniMax-M3-MXFP4 FlyDSL rows at inter_dim 384: ROCm/aiter@e4048607:aiter/configs/model_configs/
  minimax_m3_fp4_tuned_fmoe.csv (keyed on the fused shared expert, 129 experts / top-5; vllm-project/vllm#46474).
- aiter#3933: https://github.com/ROCm/aiter/issues/3933 (stage-1 kernel wrong only at bucket 4).
"""

from __future__ import annotations

import json

import pytest

from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.data.capdb import target_capabilities
from moedispatch.core.costs import Cost
from moedispatch.core.errors import UsageError
from moedispatch.core.layers import MoELayer
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.core.workload import Runtime, parse_tokens
from moedispatch.selector.pure import select, select_uncached

MI355X = ("MI355X", "0.1.20.post1")
NATIVE_ENV = {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}


def _minimax(tp: int = 8) -> MoELayer:
    return next(la for la in expand_layers(load_model("MiniMax-M3-MXFP4"), tp, 1) if la.kind == "moe")


def test_deepseek_v3_with_the_installed_aiter_names_kernels_and_rows_per_bucket(cli):
    """Issue 12, done when 1: the real PyPI amd-aiter's tuned_fmoe.csv decides DeepSeek-V3 TP8 on MI355X."""
    proc = cli("explain", "--model", "DeepSeek-V3", "--target", "MI355X", "--tp", "8", "--aiter-version",
               "installed", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["target"]["aiter_version"] == "0.1.7.post2.dev18"
    steps = data["layers"][3]["aiter_dispatch"]
    tuned = [s for s in steps if s["basis"] == "tuned"]
    assert [s["config"] for s in tuned] == ["aiter/configs/tuned_fmoe.csv:637", "aiter/configs/tuned_fmoe.csv:640",
                                            "aiter/configs/tuned_fmoe.csv:641"]
    assert all(s["family"] == "ck" and len(s["kernels"]) == 2 and "A8W8blkscale" in s["kernels"][0] for s in tuned)
    assert steps[0]["tokens"] == [1, 4] and steps[0]["basis"] == "heuristic" and steps[0]["family"] == "asm"
    assert data["tokens"] == [1, 4, 64, 512, 8192] and "cost_total" in data
    table = " ".join(cli("explain", "--model", "DeepSeek-V3", "--target", "MI355X", "--tp", "8", "--aiter-version",
                         "installed").stdout.split())
    assert "tuned row aiter/configs/tuned_fmoe.csv:637" in table and "(installed in this Python)" in table


def test_the_installed_aiter_is_the_default_and_another_one_is_said_not_silent(cli):
    """The contract (README): with an AITER installed and no --aiter-version / MOEDISPATCH_TARGET, plan for the installed one;
    when a flag or MOEDISPATCH_AITER_VERSION says otherwise, a warning says an AITER is installed."""
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--format", "json",
               env={"MOEDISPATCH_AITER_VERSION": ""})
    assert json.loads(proc.stdout)["target"]["aiter_version"] == "0.1.7.post2.dev18"
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--format", "json")  # fixture: "default"
    data = json.loads(proc.stdout)
    assert data["target"]["aiter_version"] == "0.1.20.post1"
    assert any("amd-aiter 0.1.7.post2.dev18 is installed" in w and "--aiter-version installed" in w
               for w in data["warnings"])
    proc = cli("explain", "--model", "Mixtral-8x7B", "--format", "json",
               env={"MOEDISPATCH_AITER_VERSION": "", "MOEDISPATCH_TARGET": "MI300X"})
    assert json.loads(proc.stdout)["target"]["aiter_version"] == "0.1.20.post1"  # MOEDISPATCH_TARGET says otherwise


def test_minimax_m3_keeps_384_unpadded_where_tuned_rows_decide_every_bucket(caps, builtins):
    """Issue 12, done when 2: with the fused shared expert (the key AITER's MiniMax-M3 rows are tuned for) and MXFP4
    decode activations, AITER runs inter_dim 384 natively at every bucket: no 384 -> 512 pad."""
    rt = Runtime.build(env={}, overrides=NATIVE_ENV)
    d = select(_minimax(), caps(*MI355X), builtins, runtime=rt)
    assert d.backend == "aiter-flydsl"
    assert d.padding.intermediate_per_rank == 384 and not d.padding.padded
    note = next(r for r in d.reasons if r.kind == "padding" and r.text.startswith("no padding"))
    assert "minimax_m3_fp4_tuned_fmoe.csv:" in note.text and "1–8192" in note.text
    assert all(s.basis == "tuned" and s.family == "flydsl" for s in d.dispatch.steps)
    assert not any(r.issue == "aiter-pr#3538" for r in d.reasons)  # a pad-skipping note of the padded plan: gone
    assert all(c.basis == "tuned" for c in d.cost)


@pytest.mark.parametrize("env", [{}, {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}])
def test_minimax_m3_pads_where_decode_falls_to_heuristics(caps, builtins, env):
    """Without the fused shared expert no row matches; with it but bf16 decode activations (AITER's Swiglu
    SEPARATED policy below 256 tokens) decode runs CK-Tile heuristics, wrong at inter_dim % 256 (aiter#5233):
    the plan keeps the 512 alignment."""
    d = select(_minimax(), caps(*MI355X), builtins, runtime=Runtime.build(env={}, overrides=env))
    assert d.backend == "aiter-flydsl" and d.padding.intermediate_per_rank == 512


def test_aiter_3933_is_flagged_at_its_bucket_with_its_workaround(caps, builtins):
    """Issue 12, done when 3: DeepSeek-V4-like MXFP4 W4A8 (fp8 activations from AITER_BF16_FP8_MOE_BOUND=0),
    interleaved gate/up, TP8 on MI355X: the bucket-4 stage-1 kernel is named with the workaround."""
    layer = MoELayer.build(hidden=7168, intermediate=4096, experts=384, top_k=6, tp=8, weight="mxfp4", act="mxfp4",
                           activation="swigluoai")
    rt = Runtime.build((1, 2, 3, 4, 8, 64), env={}, overrides={"AITER_BF16_FP8_MOE_BOUND": "0"})
    d = select(layer, caps(*MI355X), builtins, runtime=rt)
    hit = next(r for r in d.warnings if r.issue == "ROCm/aiter#3933")
    assert "tokens 3–4 (bucket 4)" in hit.text and "AITER_BYPASS_TUNE_CONFIG=1" in hit.text
    assert hit.source == "https://github.com/ROCm/aiter/issues/3933"
    rt_bypass = Runtime.build((1, 2, 3, 4, 8, 64), env={}, overrides={"AITER_BF16_FP8_MOE_BOUND": "0",
                                                                       "AITER_BYPASS_TUNE_CONFIG": "1"})
    d = select(layer, caps(*MI355X), builtins, runtime=rt_bypass)
    assert not any(r.issue == "ROCm/aiter#3933" for r in d.reasons)


def test_a_known_wrong_kernel_with_no_workaround_rejects_the_aiter_path(caps, builtins, monkeypatch):
    """A kernel × bucket bug with no workaround rejects AITER for the layer; the next correct backend runs."""
    import moedispatch.aiter.dispatch as ad

    real = ad.plan_dispatch

    def no_workaround(*args, **kwargs):
        plan = real(*args, **kwargs)
        step = plan.steps[0]
        hit = ad.IssueHit(issue="test#1", tokens=step.tokens, bucket=step.bucket, kernel=step.kernels[0],
                          effect="garbled output", workaround="", workaround_env=(), token_cap=None,
                          source="https://github.com/ROCm/aiter/issues/1", confidence="confirmed", severity="error")
        from dataclasses import replace

        return replace(plan, issues=(hit,))

    monkeypatch.setattr(ad, "plan_dispatch", no_workaround)
    layer = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=1)
    d = select_uncached(layer, caps(*MI355X), builtins, runtime=Runtime.build(env={}))
    assert d.backend == "triton"
    for name in ("aiter-ck",):
        rej = d.rejection(name)
        assert rej is not None and not rej.supported and rej.reasons[0].issue == "test#1"
        assert "no workaround known" in rej.reasons[0].text


class _Fast(Backend):
    name = "fast-moe"
    preference = 1
    family = "fast"

    def check(self, layer, caps):
        return Verdict.supported("bf16 MoE anywhere")

    def plan_padding(self, layer, caps):
        return Padding.none(layer)


def _registry_with_cost(us: "float | dict[int, float]"):
    import types

    from moedispatch.testing import registered

    @hookimpl
    def register_backends():
        return [_Fast()]

    @hookimpl
    def moe_cost(backend, layer, caps, tokens):
        if backend != "fast-moe":
            return None
        at = us if isinstance(us, dict) else dict.fromkeys(tokens, us)
        return [Cost(t, at[t], at[t] * 0.9, at[t] * 1.1, "plugin") for t in tokens]

    module = types.ModuleType("fast_moe_plugin")
    module.register_backends, module.moe_cost = register_backends, moe_cost
    return registered(module)


def test_a_much_faster_correct_backend_wins_over_preference_and_says_why(caps):
    """Issue 13 item 3: order by predicted time where the bars separate; the winning reason says it. The plugin's
    claim is physical (at or above the datasheet roofline: 88 µs at 1 token, 353 µs at 64 on MI355X) and its bars lie
    below aiter-ck's (115–220 µs, 416–794 µs); a claim below the roofline would be ignored for the model's own."""
    registry = _registry_with_cost({1: 95.0, 64: 370.0})
    layer = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=1)
    d = select_uncached(layer, caps(*MI355X), registry.backends, runtime=Runtime.build((1, 64), env={}))
    assert d.backend == "fast-moe" and d.cost[0].basis == "plugin"
    assert "predicted faster than the higher-preference aiter-ck" in d.reasons[0].text
    assert " vs aiter-ck " in d.reasons[0].text and "µs" in d.reasons[0].text
    rej = d.rejection("aiter-ck")
    assert rej.supported and rej.cost and rej.reasons[0].text.startswith("supported, slower")


def test_overlapping_bars_leave_preference_in_charge(caps):
    registry = _registry_with_cost(10_000.0)  # slower than everything: never promoted
    layer = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=1)
    d = select_uncached(layer, caps(*MI355X), registry.backends, runtime=Runtime.build((1, 64), env={}))
    assert d.backend == "aiter-ck"
    assert "highest preference (80)" in d.reasons[0].text


def test_engine_api_and_explain_carry_the_same_dispatch_and_cost(caps):
    from moedispatch import select_moe_backend
    from moedispatch.api import plan_model
    from moedispatch.plan.plan import plan_to_json

    c = caps(*MI355X)
    entry = plan_to_json(plan_model("Qwen3-30B-A3B", c, tp=4))["layers"][0]
    d = select_moe_backend(caps=c, hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, tp_size=4,
                           model="Qwen3-30B-A3B", model_type="qwen3_moe")
    got = d.to_dict()
    assert got["aiter_dispatch"] == entry["aiter_dispatch"] and got["cost"] == entry["cost"]


@pytest.mark.parametrize("text", ["", "0", "1,x", "-4", "1,,0"])
def test_bad_token_lists_are_one_line_errors(cli, text):
    with pytest.raises(UsageError):
        parse_tokens(text)
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--tokens", text)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_bad_aiter_env_is_a_one_line_error(cli):
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--aiter-env", "NOEQUALS")
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr


def test_plan_json_carries_tokens_env_and_totals(cli, explain_schema):
    import jsonschema

    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--tokens", "1,64,4096",
               "--aiter-env", "AITER_ONLINE_TUNE=0", "--format", "json")
    data = json.loads(proc.stdout)
    jsonschema.validate(data, explain_schema)
    assert data["tokens"] == [1, 64, 4096] and data["aiter_env"] == {"AITER_ONLINE_TUNE": "0"}
    totals = {t["tokens"]: t for t in data["cost_total"]}
    per_layer = {c["tokens"]: c for c in data["layers"][3]["cost"]}
    assert totals[1]["us"] == pytest.approx(per_layer[1]["us"] * 57, rel=1e-3)
    assert all(t["low"] <= t["us"] <= t["high"] for t in data["cost_total"])


def test_table_shows_dispatch_cost_and_totals(cli):
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--tokens",
              "1,64,4096").stdout
    assert "    aiter   tokens 1: cktile 2-stage" in out and "split-K" in out  # ksplit per token count
    assert "    cost    1 token " in out and "µs" in out
    assert "total   predicted MoE time per forward pass on one rank (57 MoE layers; the fused-MoE calls only" in out


def test_what_if_names_the_cheapest_change_and_what_the_padding_costs(cli):
    """Issue 13 item 4: MiniMax-M3-MXFP4 TP8 pads 384→512 by default (decode would run CK-Tile at 384: aiter#5233);
    the env switch under which every kernel AITER dispatches at 384 tiles it (MXFP4 decode on FlyDSL, issue 23) is the
    cheapest faster path, with the predicted gain."""
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--what-if", "--format",
               "json")
    data = json.loads(proc.stdout)
    moe = next(g for g in data["groups"] if g["kind"] == "moe")
    pad, change = moe["what_if"]
    assert pad.startswith("what-if: the pad 384→512 (intermediate/rank) costs +") and "at 8192 tokens" in pad
    assert "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0" in change
    assert "384 unpadded" in change and "at 8192 tokens (-" in change
    # with the switches already set there is nothing cheaper to suggest and nothing padded
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--what-if", "--format",
               "json", "--aiter-env", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "--aiter-env",
               "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1")
    assert "what_if" not in next(g for g in json.loads(proc.stdout)["groups"] if g["kind"] == "moe")


def test_tuning_list_is_aiters_untuned_csv_ranked_by_predicted_time(cli):
    """Issue 13 item 5: the shapes that fall to heuristics, in AITER's untuned-CSV columns, heaviest first."""
    proc = cli("explain", "--model", "Qwen3-235B-A22B-Instruct-2507", "--target", "MI355X", "--tp", "8",
               "--tuning-list")
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == ("token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
                        "doweight_stage1")
    assert len(lines) > 1 and all(ln.split(",")[1:5] == ["4096", "192", "128", "8"] for ln in lines[1:])
    assert int(lines[1].split(",")[0]) == 8192  # the largest bucket costs the most time: first
    assert "run on AITER heuristics" in proc.stderr


def test_tuning_list_leaves_out_shapes_aiters_tuned_csv_already_has(cli, shared_aiter):
    """gpt-oss-120b TP8 on MI355X: buckets 1, 4, 64 of 3072 × 512 have rows in gptoss_a16w4_tuned_fmoe.csv; AITER
    looks them up but its Swiglu MXFP4 bf16 CK-Tile path ignores their kernel names (so the plan says heuristic).
    They are not untuned shapes — AITER's tuner skips them — so the list names only the fp8 buckets 512 and 8192."""
    proc = cli("explain", "--model", "gpt-oss-120b", "--target", "MI355X", "--tp", "8", "--aiter-version",
               "0.1.20.post1", "--tuning-list")
    assert proc.returncode == 0, proc.stderr
    rows = [ln.split(",") for ln in proc.stdout.strip().splitlines()[1:]]
    assert [(r[0], r[7]) for r in rows] == [("8192", "torch.float8_e4m3fn"), ("512", "torch.float8_e4m3fn")]
    tuned = (shared_aiter / "v0.1.20.post1/aiter/configs/model_configs/gptoss_a16w4_tuned_fmoe.csv").read_text()
    for r in rows:  # and none of what it names is in AITER's own tuned CSV
        assert "gfx950,256," + ",".join(r) + "," not in tuned
    assert "gfx950,256,1," + ",".join(["3072", "512"] + rows[0][3:7] + ["torch.bfloat16"] + rows[0][8:]) in tuned
    assert proc.stderr.startswith("moedispatch: 2 shape(s) of gpt-oss-120b run on AITER heuristics")


def test_kimi_k3_situv2_on_gfx942_is_not_called_a_failing_mx_dispatch(caps, builtins):
    """FlyDSL's a16w4 SiTUv2 kernel runs on gfx942 from AITER 0.1.20 (ROCm/aiter#4502): the dispatch model's generic
    "MX fused-MoE kernels need gfx950" note must not contradict the plan there."""
    layer = next(la for la in expand_layers(load_model("Kimi-K3-MXFP4"), 8, 1) if la.kind == "moe")
    d = select(layer, caps("MI300X", "0.1.20.post1"), builtins, runtime=Runtime.build(env={}))
    assert d.backend == "aiter-flydsl"
    assert not any("need gfx950" in r.text for r in d.reasons)


def test_tuning_list_json_and_token_cap(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--tuning-list",
               "--format", "json")
    data = json.loads(proc.stdout)
    assert data["schema"] == "moedispatch.tuning-list/1" and data["rows"] and data["untuned_csv"].startswith("token,")
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--tokens", "99999999999")
    assert proc.returncode == 2 and "at most 131,072" in proc.stderr


def test_one_issue_met_at_several_kernels_and_buckets_is_said_once():
    """Newcomer minor 5: DeepSeek-V3 --tp 1 --ep 8 printed two near-identical "topk - 1" warnings, one per kernel ×
    bucket of the same issue. One issue is one reason naming every kernel × bucket; another issue stays apart."""
    from types import SimpleNamespace

    from moedispatch.aiter.issues import IssueHit
    from moedispatch.selector.runtime import blocking_reasons, dispatch_reasons

    def hit(issue, kernel, tokens, bucket, severity="warning", workaround="AITER_X=1", env=(("AITER_X", "1"),)):
        return IssueHit(issue, tokens, bucket, kernel, "looks up topk - 1", workaround, env, None, "src", "confirmed",
                        severity)

    hits = (hit("pr#3377", "ck_gemm1", (1, 4), 1), hit("pr#3377", "fmoe_g1u1", (64, 8192), 64),
            hit("aiter#1", "ck_gemm1", (1, 4), 1, workaround="other", env=()))
    dispatch = SimpleNamespace(steps=(), families=("ck",), issues=hits, warnings=(), warning_confidence=())
    said = [r for r in dispatch_reasons(dispatch, "aiter-ck", "ck") if r.issue]
    assert [r.issue for r in said] == ["pr#3377", "aiter#1"]
    assert said[0].text.startswith("AITER's dispatcher runs ck_gemm1 for tokens 1–4 (bucket 1) and fmoe_g1u1 for "
                                   "tokens 64–8192 (bucket 64): looks up topk - 1. Workaround: AITER_X=1")
    blocking = tuple(hit("aiter#2", k, t, b, severity="error", workaround="", env=()) for k, t, b in
                     (("k1", (1, 1), 1), ("k2", (2, 2), 2)))
    (reason,) = blocking_reasons(SimpleNamespace(issues=blocking))
    assert reason.text.startswith("AITER's dispatcher runs k1 for token 1 (bucket 1) and k2 for tokens 2 (bucket 2)")


def test_a_launch_handles_an_issue_by_its_env_workaround_or_a_token_cap():
    """IssueHit.handled_by, the one rule lint and fleet share: every variable of the workaround env set (any other
    value is not the workaround), or the batch capped at or below the issue's token cap."""
    from moedispatch.aiter.issues import IssueHit

    hit = IssueHit("aiter#1", (1, 8), 1, "k", "wrong", "set it", (("AITER_X", "0"), ("AITER_Y", "1")), 256, "src",
                   "confirmed", "error")
    assert hit.handled_by({"AITER_X": "0", "AITER_Y": "1"}, None)
    assert not hit.handled_by({"AITER_X": "0"}, None) and not hit.handled_by({"AITER_X": "1", "AITER_Y": "1"}, None)
    assert hit.handled_by({}, 256) and hit.handled_by({}, 8) and not hit.handled_by({}, 257)
    assert not hit.handled_by({}, None)
    no_cap = IssueHit("aiter#2", (1, 8), 1, "k", "wrong", "none", (), None, "src", "confirmed", "error")
    assert not no_cap.handled_by({}, 1)
