"""The engine guard inside the REAL vLLM 0.33.0 and SGLang 0.5.23 (issue 24 items 1–4, 6), on this CPU.

Each case is one fresh engine process (the engines load their plugins once per process) in .peers-venv, where
moedispatch is installed with its entry points, so each engine's OWN loader discovers the guard
(``vllm.general_plugins`` / ``sglang.srt.plugins``). vLLM: ``EngineArgs(...).create_engine_config()`` (process 0),
then one MoE layer's ``RoutedExperts(...)`` through vLLM's ``PluggableLayer.__new__`` (what each worker builds).
SGLang: ``load_plugins()`` then ``ServerArgs(...).resolve_once()``. Model folders hold the built-in models' config.json
(no weights: ``load_format="dummy"``). Drivers: tests/peers/vllm_guard_side.py, tests/peers/sglang_guard_side.py.
Skipped without .peers-venv (``tests/peers/setup_env.sh``; ``.ci/run`` builds it).
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import peers

HERE = Path(__file__).resolve().parent
MODELS = HERE.parents[1] / "capability_db" / "models"


def _folder(root: Path, name: str, *, bf16: bool = False) -> str:
    config = json.loads((MODELS / f"{name}.json").read_text())["config"]
    if bf16:  # the same architecture unquantized (bf16 SwiGLU-OAI experts)
        config.pop("quantization_config", None)
        config["torch_dtype"] = "bfloat16"
        name += "-bf16"
    folder = root / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _run(python: str, script: str, args: list[str], env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SGLANG_", "AITER_", "MOEDISPATCH_",
                                                                     "GUARD_"))}
    r = subprocess.run([python, str(HERE / script), *args], capture_output=True, text=True, timeout=400,
                       env={**base, "PEERS_GFX": "gfx950", "MOEDISPATCH_TARGET": "MI355X", **env})
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and lines, f"driver failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    out = json.loads(lines[-1])
    out["stderr"] = r.stderr
    return out


VLLM_ON = {"VLLM_ROCM_USE_AITER": "1", "PEERS_TP": "8"}
SGLANG_ON = {"SGLANG_USE_AITER": "1"}

#: name → (driver, args (model folder named by key), env)
CASES = {
    # Done-when: refuse stops in process 0 what lint calls errors ...
    "refuse-qwen3next": ("vllm", ["model", "Qwen3-Next-80B-A3B-FP8", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "refuse"}),
    "refuse-bf16-oai": ("vllm", ["model", "gpt-oss-120b:bf16", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "refuse"}),
    # ... and lets a verified launch through unchanged.
    "refuse-verified": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "refuse"}),
    # fix: a launch the real oracle accepts, per layer.
    "fix-qwen3next": ("vllm", ["model", "Qwen3-Next-80B-A3B-FP8", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "fix"}),
    "fix-bf16-oai": ("vllm", ["model", "gpt-oss-120b:bf16", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "fix"}),
    # warn never raises (vLLM itself then refuses the layer, as it does without the guard).
    "warn-qwen3next": ("vllm", ["model", "Qwen3-Next-80B-A3B-FP8", "8"], {**VLLM_ON}),
    # The engine's own config channel carries the mode (and wins over the environment).
    "additional-config": ("vllm", ["model", "Qwen3-Next-80B-A3B-FP8", "8"],
                          {**VLLM_ON, "MOEDISPATCH_GUARD": "warn",
                           "GUARD_ADDITIONAL_CONFIG": json.dumps({"moedispatch": {"mode": "refuse"}})}),
    "bad-mode": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "MOEDISPATCH_GUARD": "refsue"}),
    # A mistyped target in refuse mode stops the launch (it started unchecked: a newcomer's review).
    "bad-target": ("vllm", ["model", "Qwen3-Next-80B-A3B-FP8", "8"],
                   {**VLLM_ON, "MOEDISPATCH_GUARD": "refuse", "MOEDISPATCH_TARGET": "MI355"}),
    # The stale-model alarm: fires on a planted wrong fact, quiet on the real data (every case above).
    "planted": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "GUARD_PLANT": "unquantized-silu"}),
    # Guards on the guard.
    "newer-vllm": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "GUARD_FAKE_VERSION": "0.34.1",
                                                             "MOEDISPATCH_GUARD": "refuse"}),
    "other-oot-before": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "GUARD_OTHER_OOT": "before"}),
    "other-oot-after": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "GUARD_OTHER_OOT": "after"}),
    "not-observed": ("vllm", ["model", "Qwen3-30B-A3B", "8"], {**VLLM_ON, "GUARD_NO_LAYER": "1"}),
    # SGLang: Quark MXFP4 with a forced Triton runner is refused in process 0's resolution; auto passes; fix.
    "sglang-refuse-triton": ("sglang", ["Qwen3-235B-A22B-Instruct-2507-MXFP4", "4", "triton"],
                             {**SGLANG_ON, "MOEDISPATCH_GUARD": "refuse"}),
    "sglang-refuse-auto": ("sglang", ["Qwen3-235B-A22B-Instruct-2507-MXFP4", "4", "auto"],
                           {**SGLANG_ON, "MOEDISPATCH_GUARD": "refuse"}),
    "sglang-fix-triton": ("sglang", ["Qwen3-235B-A22B-Instruct-2507-MXFP4", "4", "triton"],
                          {**SGLANG_ON, "MOEDISPATCH_GUARD": "fix"}),
    # A mode SGLang's plugin loader would swallow (it only logs a failing plugin): stopped at resolution instead.
    "sglang-bad-mode": ("sglang", ["Qwen3-235B-A22B-Instruct-2507-MXFP4", "4", "triton"],
                        {**SGLANG_ON, "MOEDISPATCH_GUARD": "refsue"}),
    # SGLang per layer: its own FusedMoE(...) resolves AITER at TP2 (intermediate/rank 384) and Triton at TP4 (192,
    # its AITER CK gate needs 128-aligned shards); the guard's hook predicts both, and alarms on a planted fact.
    "sglang-layer-tp2": ("sglang", ["Qwen3-30B-A3B", "2", "auto"], {**SGLANG_ON, "GUARD_LAYER": "1"}),
    "sglang-layer-tp4": ("sglang", ["Qwen3-30B-A3B", "4", "auto"], {**SGLANG_ON, "GUARD_LAYER": "1"}),
    "sglang-layer-planted": ("sglang", ["Qwen3-30B-A3B", "4", "auto"],
                             {**SGLANG_ON, "GUARD_LAYER": "1", "GUARD_PLANT": "sglang-bf16-alignment"}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    python = peers.peers_python()
    if python is None or not peers.has_vllm(python):
        pytest.skip("vLLM/SGLang peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    root = tmp_path_factory.mktemp("guard-models")

    def one(item):
        name, (engine, args, env) = item
        args = list(args)
        i = 1 if engine == "vllm" else 0
        model, _, variant = args[i].partition(":")
        args[i] = _folder(root, model, bf16=variant == "bf16")
        script = "vllm_guard_side.py" if engine == "vllm" else "sglang_guard_side.py"
        return name, _run(python, script, args, env)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, CASES.items()))


def test_refuse_stops_known_wrong_vllm_launches_in_process_0(runs):
    for name, why in (("refuse-qwen3next", "fp8_block_refined"), ("refuse-bf16-oai", "swiglu_oai")):
        r = runs[name]
        assert not r["ok"] and "moedispatch guard (refuse)" in r["error"] and why in r["error"], (name, r["error"])
        assert "layer" not in r  # no config, so no worker and no weights
    r = runs["refuse-verified"]
    assert r["ok"] and r["moe_backend"] == "auto" and "launching as given" in r["stderr"]
    assert r["layer"]["cls"] == "MoedispatchGuardedRoutedExperts"  # vLLM's own __new__ picked the guard's subclass
    assert (r["layer"]["backend"], r["layer"]["error"]) == ("AITER", None)


def test_fix_produces_a_launch_the_real_oracle_accepts(runs):
    r = runs["fix-qwen3next"]  # FP8 block, I/rank 64: AITER forced, vLLM pads the shard to whole 128 blocks
    assert r["ok"] and r["moe_backend"] == "aiter" and r["env"]["VLLM_ROCM_USE_AITER_MOE"] == "1"
    assert (r["layer"]["backend"], r["layer"]["intermediate"], r["layer"]["error"]) == ("AITER", 128, None)
    assert "the corrected launch checks clean" in r["stderr"]
    r = runs["fix-bf16-oai"]  # bf16 SwiGLU-OAI: CK has no such kernel; Triton runs it
    assert r["ok"] and r["moe_backend"] == "triton"
    assert (r["layer"]["backend"], r["layer"]["error"]) == ("TRITON", None)
    for name in ("fix-qwen3next", "fix-bf16-oai"):  # process 0's fix reached the layer: no worker-side difference
        assert "differs from process 0" not in runs[name]["stderr"], name


def test_warn_never_raises_and_the_config_channel_sets_the_mode(runs):
    r = runs["warn-qwen3next"]
    assert r["ok"] and "launching as given anyway (warn mode" in r["stderr"]
    assert "does not support" in r["layer"]["error"]  # vLLM's own refusal, unchanged by the guard
    r = runs["additional-config"]
    assert not r["ok"] and "moedispatch guard (refuse)" in r["error"]
    r = runs["bad-mode"]
    assert not r["ok"] and "MOEDISPATCH_GUARD='refsue'" in r["error"] and "expected one of" in r["error"]
    r = runs["bad-target"]
    assert not r["ok"] and "MOEDISPATCH_TARGET='MI355': unknown target 'MI355'" in r["error"], r
    assert "starts unchecked" not in r["stderr"]


def test_stale_model_alarm_fires_on_a_planted_fact_and_is_quiet_on_real_data(runs):
    r = runs["planted"]
    assert "STALE" in r["stderr"] and "vLLM picked AITER, moedispatch predicted TRITON" in r["stderr"]
    r = runs["sglang-layer-planted"]
    assert "STALE" in r["stderr"] and "SGLang picked TRITON, moedispatch predicted AITER" in r["stderr"]
    quiet = [n for n, r in runs.items() if "planted" not in n and "STALE" in r["stderr"]]
    assert not quiet, quiet


def test_guards_on_the_guard(runs):
    r = runs["newer-vllm"]  # refuse mode, but the release is not modelled: off, with one line, nothing judged
    assert r["ok"] and "off — vllm 0.34.1 is outside the releases moedispatch models" in r["stderr"]
    assert r["layer"]["cls"] == "RoutedExperts"
    for name in ("other-oot-before", "other-oot-after"):
        r = runs[name]
        assert r["ok"] and r["layer"]["cls"] == "OtherPluginRoutedExperts", name  # no duplicate-name crash
        assert "the per-layer check steps aside" in r["stderr"], name


def test_sglang_resolution_hook_refuses_and_fixes(runs):
    r = runs["sglang-refuse-triton"]
    assert r["hooked"] and not r["ok"] and "moedispatch guard (refuse)" in r["error"] and "triton" in r["error"]
    r = runs["sglang-refuse-auto"]
    assert r["ok"] and r["moe_runner_backend"] == "auto"
    r = runs["sglang-fix-triton"]
    assert r["ok"] and r["moe_runner_backend"] == "auto" and "the corrected launch checks clean" in r["stderr"]
    r = runs["sglang-bad-mode"]
    assert not r["ok"] and "MOEDISPATCH_GUARD='refsue': expected one of" in r["error"], r


def test_sglang_per_layer_check_follows_sglangs_own_layer(runs):
    for name, runner in (("sglang-layer-tp2", "AITER"), ("sglang-layer-tp4", "TRITON")):
        r = runs[name]
        assert r["hooked"] and r["layer"]["patched"], name  # the hook is applied, not silently skipped
        assert (r["layer"]["runner"], r["layer"]["error"]) == (runner, None), (name, r["layer"])
        assert "layer check ready in" in r["stderr"] and "NOT ACTIVE" not in r["stderr"], name


def test_a_model_whose_moe_never_passes_routed_experts_is_reported_not_observed(runs):
    r = runs["not-observed"]
    assert r["ok"] and r["create_model_wrapped"] and "layer" not in r
    assert "not observed — none of this model's 48 MoE layer(s) was built through vLLM's RoutedExperts" in r["stderr"]
    r = runs["refuse-verified"]
    assert "per-layer check compared 1 of 48 MoE layer(s): all as moedispatch predicted" in r["stderr"]
    assert "per-layer check compared 1 of 48 MoE layer(s): 2 STALE finding(s) above" in runs["planted"]["stderr"]


def test_overhead_is_reported_once_per_process(runs):
    for name in ("refuse-verified", "fix-qwen3next"):
        err = runs[name]["stderr"]
        assert err.count("process-0 check took") == 1 and err.count("layer check ready in") == 1, name
