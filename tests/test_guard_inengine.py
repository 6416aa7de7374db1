"""The in-engine guard's engine-agnostic part (issue 24 items 1, 2, 4): settings, the launch an engine config
describes, the process-0 verdict, and what the vLLM/SGLang plugin modules do without their engine.

The guard inside the real vLLM 0.33.0 and SGLang 0.5.23 is tests/peers/test_guard_engines.py.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from moedispatch.core.errors import UsageError
from moedispatch.guard import launch as exec_launch
from moedispatch.guard import process0 as p0


# -- settings ---------------------------------------------------------------------------------------------------------

def test_mode_defaults_to_warn_and_the_config_channel_wins_over_the_environment():
    assert p0.settings({}) == p0.Settings("warn", None, "default")
    assert p0.settings({"MOEDISPATCH_GUARD": "Refuse"}).mode == "refuse"
    s = p0.settings({"MOEDISPATCH_GUARD": "warn", "MOEDISPATCH_TARGET": "MI300X"},
                    {"moedispatch": {"mode": "fix", "target": "MI355X"}})
    assert (s.mode, s.target, s.where) == ("fix", "MI355X", "additional config moedispatch.mode")
    assert p0.settings({"MOEDISPATCH_TARGET": "MI300X"}).target == "MI300X"
    assert p0.settings({}, {"other_platform_key": 1}).mode == "warn"  # another platform's additional config


@pytest.mark.parametrize("env, extra, needle", [
    ({"MOEDISPATCH_GUARD": "refsue"}, None, "MOEDISPATCH_GUARD='refsue': expected one of warn, refuse, fix, off"),
    ({}, {"moedispatch": {"mode": "strict"}}, "moedispatch.mode='strict'"),
    ({}, {"moedispatch": {"mode": 3}}, "expected one of"),
    ({}, {"moedispatch": "refuse"}, "must be an object"),
    ({}, {"moedispatch": {"mdoe": "refuse"}}, "unknown key(s) mdoe"),
    ({}, {"moedispatch": {"target": ""}}, "guard target must be a GPU name"),
    # A mistyped target is a setting it cannot honour (it was "could not check … starts unchecked", also in refuse).
    ({"MOEDISPATCH_GUARD": "refuse"}, {"moedispatch": {"target": "MI355"}},
     "additional config moedispatch.target='MI355': unknown target 'MI355' (did you mean 'MI355X'?)"),
    ({"MOEDISPATCH_GUARD": "refuse", "MOEDISPATCH_TARGET": "MI355"}, None, "MOEDISPATCH_TARGET='MI355': unknown"),
])
def test_a_setting_the_guard_cannot_honour_is_an_error_not_a_default(env, extra, needle):
    with pytest.raises(UsageError) as exc:
        p0.settings(env, extra)
    assert needle in str(exc.value)


def test_engine_releases_outside_the_model_turn_the_guard_off():
    assert p0.unmodelled("vllm", "0.33.0") is None and p0.unmodelled("vllm", "0.33.2") is None
    assert p0.unmodelled("sglang", "0.5.23") is None
    why = p0.unmodelled("vllm", "0.34.0")
    assert "vllm 0.34.0 is outside the releases moedispatch models (vllm 0.33.0)" in why
    assert "outside" in p0.unmodelled("sglang", "0.5.22")


# -- the launch an engine config describes ------------------------------------------------------------------------------

def test_launch_argv_is_what_lint_reads_back():
    from moedispatch.engines import lint

    argv = p0.launch_argv("vllm", "/m", tp=8, dp=2, ep_flag=True, moe_backend="aiter", max_batched_tokens=4096,
                          data_parallel_backend="ray")
    got = lint.parse_launch(None, argv, {}, {})
    assert (got.engine, got.model) == ("vllm", "/m")
    assert got.flags == {"tp": "8", "dp": "2", "ep_flag": True, "moe_backend": "aiter", "max_batched_tokens": "4096",
                         "data_parallel_backend": "ray"}
    assert "--data-parallel-size" not in p0.launch_argv("vllm", "/m", tp=8, data_parallel_backend="mp")
    argv = p0.launch_argv("sglang", "/m", tp=8, ep=8, dp=2, dp_attention=True, moe_backend="triton",
                          quantization="quark")
    got = lint.parse_launch(None, argv, {}, {})
    assert got.flags == {"tp": "8", "dp": "2", "ep": "8", "dp_attention": True, "moe_backend": "triton",
                         "quantization": "quark"}
    with pytest.raises(UsageError):
        p0.launch_argv("trtllm", "/m")


# -- the process-0 verdict --------------------------------------------------------------------------------------------

NEXT = p0.launch_argv("vllm", "Qwen3-Next-80B-A3B-FP8", tp=8)
AITER_ON = {"VLLM_ROCM_USE_AITER": "1"}


def _check(mode, argv=NEXT, env=AITER_ON, engine="vllm", version="0.33.0"):
    return p0.check(engine, version, argv, env, p0.Settings(mode, "MI355X"))


def test_refuse_on_a_known_wrong_launch_passes_a_verified_one():
    v = _check("refuse")  # FP8 block 128 with a 64 shard: vLLM's AITER refuses fp8_block_refined
    assert v.action == "refuse" and v.report[0].startswith("moedispatch guard (refuse): vllm 0.33.0 launch of")
    msg = p0.refusal_message("vllm", v)
    assert msg.startswith("moedispatch guard (refuse): this vllm 0.33.0 launch of Qwen3-Next-80B-A3B-FP8 is known-wrong")
    assert "fp8_block_refined" in msg and "(fix: " in msg and msg.endswith("To start it anyway: MOEDISPATCH_GUARD=warn.")
    assert "\n" not in msg
    assert _check("refuse", argv=p0.launch_argv("vllm", "Qwen3-30B-A3B", tp=8)).action == "pass"
    assert _check("warn").action == "pass"  # warn reports, never stops
    assert _check("off").action == "pass"


def test_the_advice_to_start_anyway_names_the_channel_that_chose_the_mode():
    """A mode from vLLM's --additional-config wins over MOEDISPATCH_GUARD, so "MOEDISPATCH_GUARD=warn" would change
    nothing: the report and the refusal name the config channel (it said MOEDISPATCH_GUARD=warn, already set)."""
    cfg = p0.settings({"MOEDISPATCH_GUARD": "warn"}, {"moedispatch": {"mode": "refuse", "target": "MI355X"}})
    v = p0.check("vllm", "0.33.0", NEXT, AITER_ON, cfg)
    channel = """--additional-config '{"moedispatch": {"mode": "warn"}}'"""
    assert v.action == "refuse" and v.report[-1].endswith("or launch it anyway with " + channel)
    msg = p0.refusal_message("vllm", v, cfg)
    assert msg.endswith(f"To start it anyway: {channel}.") and "MOEDISPATCH_GUARD" not in msg
    cfg = p0.settings({"MOEDISPATCH_GUARD": "warn"}, {"moedispatch": {"mode": "warn", "target": "MI355X"}})
    assert """--additional-config '{"moedispatch": {"mode": "refuse"}}' stops it""" in p0.check(
        "vllm", "0.33.0", NEXT, AITER_ON, cfg).report[-1]


def test_fix_sets_only_what_an_engine_process_can_still_change():
    v = _check("fix")
    assert (v.action, v.moe_backend, dict(v.env)) == ("fix", "aiter", {"VLLM_ROCM_USE_AITER_MOE": "1"})
    # After the fix the same launch checks clean (what the vLLM plugin verifies before it lets the launch go on).
    fixed = p0.launch_argv("vllm", "Qwen3-Next-80B-A3B-FP8", tp=8, moe_backend="aiter")
    assert _check("fix", argv=fixed, env={**AITER_ON, **v.env}).action == "pass"


def test_a_fix_that_is_another_layout_refuses_in_process(monkeypatch):
    def decide(argv, env, mode, lint_fn, switch=None):
        return exec_launch.Outcome("launch-fixed", tuple(list(argv)[:3] + ["--tensor-parallel-size", "8",
                                                                          "--enable-expert-parallel"]), dict(env),
                                   ("head", "moedispatch exec: launching the corrected command instead: …"),
                                   {"findings": [], "model": "M", "engine_version": "0.33.0"})

    monkeypatch.setattr(p0, "decide", decide)
    v = _check("fix", argv=p0.launch_argv("vllm", "M", tp=8))
    assert v.action == "refuse"
    assert "the fix changes ep_flag, which this engine process cannot change once configured" in v.report[-1]
    assert "relaunch with: vllm serve M --tensor-parallel-size 8 --enable-expert-parallel" in p0.refusal_message(
        "vllm", v)


def test_sglang_forced_triton_on_quark_mxfp4_is_refused_and_fixed_to_auto():
    argv = p0.launch_argv("sglang", "Qwen3-235B-A22B-Instruct-2507-MXFP4", tp=4, moe_backend="triton")
    env = {"SGLANG_USE_AITER": "1"}
    assert _check("refuse", argv=argv, env=env, engine="sglang", version="0.5.23").action == "refuse"
    v = _check("fix", argv=argv, env=env, engine="sglang", version="0.5.23")
    assert (v.action, v.moe_backend) == ("fix", "auto")


# -- the plugin modules without their engine --------------------------------------------------------------------------

def test_importing_the_plugins_imports_no_engine():
    code = ("import sys, moedispatch.guard.vllm, moedispatch.guard.sglang; "
            "print(sorted(m for m in ('vllm', 'sglang', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_entry_points_import_nothing_of_the_guard_when_it_is_off():
    """Every vLLM process loads the plugin: off, the entry point returns before the guard's ~0.1 s of imports; any
    other value reaches the guard's register, which validates it (a typo is still an error)."""
    code = ("import os, sys; os.environ['MOEDISPATCH_GUARD'] = sys.argv[1]; from moedispatch.guard import entry\n"
            "try:\n    entry.vllm()\nexcept Exception as exc:\n    print(type(exc).__name__)\n"
            "print(sorted(m for m in sys.modules if m.startswith('moedispatch.guard.')))")
    run = lambda mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,  # noqa
                                      check=True).stdout.split("\n")
    assert run("off")[0] == "['moedispatch.guard.entry']"
    typo = run("refsue")
    assert typo[0] == "RuntimeError" and "'moedispatch.guard.vllm'" in typo[1]
    meta = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'moedispatch-guard = "moedispatch.guard.entry:vllm"' in meta
    assert 'moedispatch-guard = "moedispatch.guard.entry:sglang"' in meta


def test_guard_off_registers_nothing(monkeypatch):
    from moedispatch.guard import vllm as gv

    monkeypatch.setenv("MOEDISPATCH_GUARD", "off")
    monkeypatch.setattr(gv, "_STATE", {})
    gv.register()  # would import vllm (absent here) if it did anything
    assert gv._STATE == {}
    monkeypatch.setenv("MOEDISPATCH_GUARD", "refsue")
    with pytest.raises(RuntimeError, match="moedispatch guard: MOEDISPATCH_GUARD='refsue'"):
        gv.register()


def test_observed_pick_and_digest():
    from moedispatch.guard import vllm as gv

    enum = types.SimpleNamespace(name="AITER_MXFP4_MXFP4")
    assert gv.observed_pick(types.SimpleNamespace(mxfp4_backend=enum)) == "AITER_MXFP4_MXFP4"
    assert gv.observed_pick(types.SimpleNamespace(unquantized_backend=None, fp8_backend="TRITON")) == "TRITON"
    assert gv.observed_pick(object()) is None
    a = p0.Verdict("pass", (), doc={"findings": [{"severity": "info", "message": "x"}]})
    b = p0.Verdict("pass", ("other report",), doc={"findings": [{"severity": "info", "message": "x"}]})
    c = p0.Verdict("pass", (), doc={"findings": [{"severity": "error", "message": "x"}]})
    assert gv.digest(a) == gv.digest(b) != gv.digest(c)


def test_the_guard_stays_off_where_the_engine_does_not_run_on_rocm(monkeypatch, capsys):
    """An engine on another platform (vLLM on CUDA) is not judged by AMD rules unless a target is named."""
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0+cu130"))
    monkeypatch.delenv("MOEDISPATCH_TARGET", raising=False)
    monkeypatch.delenv("MOEDISPATCH_GUARD", raising=False)
    state: dict = {}
    assert p0.installable("vllm", state, lambda: False) is None
    assert "moedispatch guard: off — vllm is not running on ROCm here" in capsys.readouterr().err
    monkeypatch.setenv("MOEDISPATCH_TARGET", "MI355X")
    state = {}
    assert p0.installable("vllm", state, lambda: False) == "0.33.0" and state["version"] == "0.33.0"
    assert p0.installable("vllm", state, lambda: False) is None  # once per process
    monkeypatch.delenv("MOEDISPATCH_TARGET")
    assert p0.installable("vllm", {}, lambda: True) == "0.33.0"
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.34.0"))
    assert p0.installable("vllm", {}, lambda: True) is None
    assert "off — vllm 0.34.0 is outside the releases" in capsys.readouterr().err


def test_worker_lines_that_read_alike_are_said_by_rank_0_only(monkeypatch, capsys):
    """At TP 8 every worker printed 'layer check ready …' and the all-clear summary: eight identical lines. Rank 0
    says them; a finding (STALE, a worker that differs) is said by every worker."""
    from moedispatch.guard import vllm as guard

    for rank, expected in (("0", 1), ("3", 0)):
        monkeypatch.setenv("RANK", rank)
        guard._info("moedispatch guard: layer check ready in 0.05 s")
        assert capsys.readouterr().err.count("layer check ready") == expected, rank
    monkeypatch.setenv("RANK", "nonsense")
    assert guard._rank() == 0


@pytest.mark.parametrize("release, view, argv_has, argv_not", [
    # 0.5.22+: resolution turns the deprecated spelling into attn_dp_size = N, dp_size = 1, the flag off
    ("0.5.23", dict(dp_size=1, enable_dp_attention=False, attn_dp_size=4), ["--attn-dp-size", "4"],
     ["--enable-dp-attention", "--dp-size"]),
    # before 0.5.22 the flag stays on and attn_dp_size is derived from it (no --attn-dp-size flag exists)
    ("0.5.21", dict(dp_size=4, enable_dp_attention=True, attn_dp_size=4), ["--dp-size", "4", "--enable-dp-attention"],
     ["--attn-dp-size"]),
])
def test_the_sglang_guard_rebuilds_data_parallel_attention_in_the_release_s_spelling(monkeypatch, release, view,
                                                                                       argv_has, argv_not):
    """The guard lints the command its resolved server args describe: on 0.5.21 it wrote --attn-dp-size as well,
    a flag that release's parser rejects — lint's error, and a refusal in refuse mode, for a valid launch."""
    from moedispatch.engines import lint as L
    from moedispatch.guard import sglang as g

    overrides = types.ModuleType("sglang.srt.arg_groups.overrides")
    overrides.resolved_view = lambda sa: sa
    for name in ("sglang", "sglang.srt", "sglang.srt.arg_groups"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.arg_groups.overrides", overrides)
    sa = types.SimpleNamespace(model_path="Qwen/Qwen3-30B-A3B", tp_size=8, ep_size=1, moe_runner_backend="auto",
                               chunked_prefill_size=None, quantization=None, **view)
    argv = g.launch_from(sa)
    joined = " ".join(argv)
    assert " ".join(argv_has) in joined and not [a for a in argv_not if a in argv]
    doc = L.lint_launch(L.parse_launch(None, argv), target="MI355X", aiter_version="0.1.20", engine_version=release)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert L._plan_layout(L.parse_launch(None, argv)) == (8, 1, 2)
