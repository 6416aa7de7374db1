"""``moedispatch lint`` (moedispatch/engines/lint.py) pinned in-process where a sampled mutation run left its rules
open: each test lints a real launch line (built-in models, MI300X / MI355X, vLLM 0.31-0.33 / SGLang 0.5.20-0.5.23
flags) and asserts the exact finding (severity, message, source, fix), the JSON fields and the exit code that a broken
line would change. The rule's source is named in each docstring where the code cites one.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shlex

import pytest

from moedispatch._util.width import wrap_shell
from moedispatch.cli import main
from moedispatch.core.errors import UsageError
from moedispatch.data import capdb
from moedispatch.engines import lint as L
from moedispatch.engines.recipes import engine_data
from moedispatch.plan.plan import plan_model
from moedispatch.probe.targets import resolve_capabilities
from moedispatch.selector.plugins import reset_registry
from moedispatch.sources.models import load_model

VLLM_SWITCH_SOURCE = ("vllm-project/vllm@v0.33.0:vllm/envs.py (VLLM_ROCM_USE_AITER default False); "
                      "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py "
                      "AiterExperts._supports_current_device; vllm-project/vllm#56945")


@pytest.fixture(autouse=True)
def _newest_aiter(monkeypatch, tmp_path):
    """Plan for capability_db's newest AITER (not the venv's); an empty HF cache; no VLLM_/AITER_ env."""
    monkeypatch.setenv("MOEDISPATCH_AITER_VERSION", "default")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for var in [v for v in os.environ if v.startswith(("VLLM_", "SGLANG_", "AITER_", "GPTOSS_"))]:
        monkeypatch.delenv(var)


def _lint(argv, target="MI355X", aiter=None, engine_version=None, model=None, env=None):
    launch = L.parse_launch(None, argv, env)
    return L.lint_launch(launch, target=target, aiter_version=aiter, model=model, engine_version=engine_version)


def _by_source(doc, needle):
    return [f for f in doc["findings"] if f["source"] and needle in f["source"]]


def _sev(doc, severity):
    return [f for f in doc["findings"] if f["severity"] == severity]


def _disable(monkeypatch, *names):
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", ",".join(names))
    reset_registry()


# -- reading the launch -------------------------------------------------------------------------------------------

DOCKER_SGLANG = ["docker", "run", "--rm", "--device=/dev/kfd", "-e", "SGLANG_USE_AITER=1", "--env",
                 "AITER_CONFIG_FMOE=/cfg/tuned_fmoe.csv", "--env=HF_TOKEN=hf_x",
                 "lmsysorg/sglang:v0.5.23-rocm700-mi35x",
                 "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "8"]


def test_docker_run_env_reaches_the_engine():
    """`docker run -e/--env K=V/--env=K=V` before the engine are its environment (lint.py _container_env)."""
    launch = L.parse_launch(None, DOCKER_SGLANG)
    assert launch.engine == "sglang" and launch.model == "Qwen/Qwen3-30B-A3B"
    assert launch.env == {"SGLANG_USE_AITER": "1", "AITER_CONFIG_FMOE": "/cfg/tuned_fmoe.csv", "HF_TOKEN": "hf_x"}
    assert launch.argv == DOCKER_SGLANG and launch.origin == "arguments"
    doc = L.lint_launch(launch, target="MI355X")
    # the container's AITER_CONFIG_FMOE is the one AITER reads: its finding is raised (sgl-project/sglang#37072)
    (fmoe,) = _by_source(doc, "sgl-project/sglang#37072")
    assert fmoe["message"].startswith("AITER_CONFIG_FMOE=/cfg/tuned_fmoe.csv replaces AITER's whole tuned set")
    assert doc["env"] == {"AITER_CONFIG_FMOE": "/cfg/tuned_fmoe.csv", "SGLANG_USE_AITER": "1"}


def test_every_engine_entry_point_is_recognised():
    """vLLM api_server, `sglang serve`, `python -m sglang.srt.server` are launches (lint.py _engine_of)."""
    api = ["python", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "4", "--model",
           "Qwen/Qwen3-30B-A3B"]
    launch = L.parse_launch(None, api)
    assert (launch.engine, launch.model, launch.flags) == ("vllm", "Qwen/Qwen3-30B-A3B", {"tp": "4"})
    serve = L.parse_launch(None, ["sglang", "serve", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "4"])
    assert (serve.engine, serve.model, serve.flags) == ("sglang", "Qwen/Qwen3-30B-A3B", {"tp": "4"})
    assert L.lint_launch(serve, target="MI355X")["engine"] == "sglang"
    srt = L.parse_launch(None, ["python3", "-m", "sglang.srt.server", "--model-path", "Qwen/Qwen3-30B-A3B"])
    assert (srt.engine, srt.model) == ("sglang", "Qwen/Qwen3-30B-A3B")


def test_a_value_option_at_the_end_needs_its_value():
    """`--tensor-parallel-size` as the last word: argparse rejects it, and so does lint (one UsageError line)."""
    with pytest.raises(UsageError, match=r"^--tensor-parallel-size needs a value$"):
        L.parse_launch(None, ["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size"])


def test_unusable_launches_say_what_is_missing():
    """The one-line messages of parse_launch: only env assignments, not an engine command, a script without one."""
    with pytest.raises(UsageError) as exc:
        L.parse_launch(None, ["env", "VLLM_ROCM_USE_AITER=1"])
    assert str(exc.value) == ("lint needs a FILE or engine arguments after `--` (e.g. -- vllm serve MODEL "
                              "--tensor-parallel-size 8)")
    with pytest.raises(UsageError) as exc:
        L.parse_launch(None, ["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "1e-4"])
    assert str(exc.value) == ("not a vLLM or SGLang launch: 'torchrun --nproc-per-node 8 train.py' (expected "
                              "`vllm serve …` or `python -m sglang.launch_server …`)")
    with pytest.raises(UsageError) as exc:
        L.parse_launch("export VLLM_ROCM_USE_AITER=1\necho ready\n")
    assert str(exc.value) == "no `vllm serve …` or `python -m sglang.launch_server …` line in the script"
    with pytest.raises(UsageError) as exc:
        L.parse_launch("echo ready\n", source="serve_mi355x.sh")
    assert str(exc.value).endswith("line in serve_mi355x.sh")


def test_an_exported_variable_expands_in_the_launch_line():
    """`export TP=4` then `--tensor-parallel-size $TP`: the script's own exports expand (and are the launch's env)."""
    script = ("export MODEL=Qwen/Qwen3-30B-A3B\nexport TP=4\nexport VLLM_ROCM_USE_AITER=1\n"
              "vllm serve $MODEL \\\n  --tensor-parallel-size ${TP} --port 8000\n")
    launch = L.parse_launch(script, source="serve.sh")
    assert launch.model == "Qwen/Qwen3-30B-A3B" and launch.flags == {"tp": "4"}
    assert launch.origin == "serve.sh"
    assert launch.argv == ["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "4", "--port", "8000"]


def test_the_report_says_what_was_parsed():
    """lint/1 `env` keeps what decides the MoE path (VLLM_/SGLANG_/AITER_/GPTOSS_, CU_NUM: core.workload.engine_env),
    not HF_TOKEN; `launch` is from/argv/model/options by dest (lint.schema.json)."""
    argv = ["VLLM_ROCM_USE_AITER=1", "VLLM_ROCM_USE_AITER_MOE=1", "AITER_BYPASS_TUNE_CONFIG=0",
            "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "HF_TOKEN=hf_x", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "-tp", "4",
            "--moe-backend", "aiter", "--max-num-batched-tokens", "8192"]
    doc = _lint(argv, env={"SGLANG_USE_AITER": "0"})
    assert doc["env"] == {"AITER_BYPASS_TUNE_CONFIG": "0", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0",
                          "SGLANG_USE_AITER": "0", "VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "1"}
    assert doc["launch"] == {"from": "arguments", "argv": argv[5:], "model": "Qwen/Qwen3-30B-A3B",
                             "options": {"max_num_batched_tokens": "8192", "moe_backend": "aiter",
                                         "tensor_parallel_size": "4"}}
    assert doc["parallel"] == {"tp": 4, "ep": 1}
    # vLLM's short alias -tp is an option its parser knows: no "has no option" error (options.json dest)
    assert not [f for f in doc["findings"] if "has no option" in f["message"]]


# -- what needs only the command line -----------------------------------------------------------------------------

def test_options_the_engine_parser_rejects():
    """vLLM 0.33's argparse rejects unknown options (engines/options.json): an error each, no fix."""
    argv = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size=4",
            "--enable-expert-paralel", "--max-logprbs", "-1", "-x", "--seed", "-1"]
    doc = _lint(argv)
    src = capdb.load_db_json("engines/options.json")["vllm"]["0.33.0"]["source"]
    bad = [f for f in doc["findings"] if "has no option" in f["message"]]
    assert [f["message"] for f in bad] == [
        "vllm 0.33.0 has no option --enable-expert-paralel (did you mean '--enable-expert-parallel'?): its argument "
        "parser rejects the launch (and moedispatch planned without it)",
        "vllm 0.33.0 has no option --max-logprbs (did you mean '--max-logprobs'?): its argument parser rejects the "
        "launch (and moedispatch planned without it)",
        "vllm 0.33.0 has no option -x: its argument parser rejects the launch (and moedispatch planned without it)"]
    assert all(f["severity"] == "error" and f["source"] == src and f["fix"] is None for f in bad)


def test_an_engine_release_newer_than_the_data_is_assumed_aloud():
    """--engine-version beyond capability_db's newest: a warning says the rules are assumed from the newest."""
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "4"],
                engine_version="0.34.0")
    assert doc["engine_version"] == "0.34.0"
    assert {"severity": "warning", "source": None, "fix": None,
            "message": "--engine-version 0.34.0: vllm 0.34.0 is newer than the newest release capability_db knows "
                       "(0.33.0); its rules and options are assumed from 0.33.0"} in doc["findings"]


def test_aiter_config_fmoe_fix_line():
    """AITER_CONFIG_FMOE replaces the tuned set (sgl-project/sglang#37072): unset it or list the defaults."""
    doc = _lint(["AITER_CONFIG_FMOE=/tmp/my_tuned_fmoe.csv", "SGLANG_USE_AITER=1", "python3", "-m",
                 "sglang.launch_server", "--model-path", "MiniMaxAI/MiniMax-M3-MXFP8", "--tp", "8"])
    (f,) = _by_source(doc, "sgl-project/sglang#37072")
    assert f["severity"] == "warning"
    assert f["fix"] == "unset AITER_CONFIG_FMOE, or list the default tuned CSVs with it (':'-separated)"


def test_moe_backend_aiter_without_the_switch_is_said_once():
    """--moe-backend aiter without VLLM_ROCM_USE_AITER=1 fails (vllm#56945): no 'slower' warning too."""
    doc = _lint(["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "4", "--moe-backend", "aiter"],
                engine_version="0.31.0")
    about = [f for f in doc["findings"] if "VLLM_ROCM_USE_AITER" in f["message"]]
    assert about == [{"severity": "error", "source": VLLM_SWITCH_SOURCE, "fix": "export VLLM_ROCM_USE_AITER=1",
                      "message": "--moe-backend aiter without VLLM_ROCM_USE_AITER=1: vLLM's AiterExperts refuses (the "
                                 "master switch defaults to off) and the launch fails"}]
    # vLLM 0.33's modelled oracle refuses the same launch (its own words): still no 'silently slower' warning
    doc = _lint(["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "4", "--moe-backend", "aiter"])
    assert [f["severity"] for f in doc["findings"] if "VLLM_ROCM_USE_AITER" in f["message"]] == ["error"]
    assert not [f for f in doc["findings"] if "silently slower" in f["message"]]


# -- what the engine runs against the plan ------------------------------------------------------------------------

def test_switch_off_is_silently_slower_with_the_launch_as_the_fix():
    """Switch off and --moe-backend triton is silently slower (vllm#56945); exporting the switch alone would not
    change the forced Triton path, so the fix is the user's line with the recipe's options; AITER's own dispatch
    issues (ROCm/aiter#3999 under EP) are not this launch's: it runs Triton."""
    argv = ["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--enable-expert-parallel", "--moe-backend=triton",
            "--tensor-parallel-size", "4", "--moe-backend", "triton", "--max-model-len", "65536"]
    doc = _lint(argv)
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["severity"] == "warning" and slow["source"] == VLLM_SWITCH_SOURCE
    assert slow["message"] == ("VLLM_ROCM_USE_AITER is unset and --moe-backend triton: vllm runs the MoE on triton "
                               "while the plan's correct fastest path is aiter-flydsl (AITER) — silently slower")
    recipe = ("VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 VLLM_USE_BREAKABLE_CUDAGRAPH=0 vllm serve "
              "MiniMaxAI/MiniMax-M3-MXFP8 --enable-expert-parallel --moe-backend aiter --tensor-parallel-size 4 "
              "--max-model-len 65536 --attention-backend TRITON_ATTN")
    assert slow["fix"] == recipe
    assert doc["parallel"] == {"tp": 4, "ep": 4}
    assert not _by_source(doc, "ROCm/aiter/issues/3999")
    # on the recipe itself ROCm/aiter#3999 (EP looks up topk - 1) is said, with the 'info' severity its data declares
    doc = _lint(shlex.split(recipe))
    (ep,) = _by_source(doc, "ROCm/aiter/issues/3999")
    assert ep["severity"] == "info" and ep["fix"] is None    # the recipe is the launch: nothing to change
    assert ep["message"].startswith("AITER runs flydsl_moe1_afp8_wfp8_bf16_t32x128x256_w2_gui for tokens 1–512 "
                                    "(bucket 1): under expert parallelism AITER looks up topk - 1")


def test_a_forced_slower_backend_with_the_switch_on_is_said_and_fixed_by_the_recipe():
    """--moe-backend emulation (or triton) with VLLM_ROCM_USE_AITER=1: the switch is not the cause, the flag is — a
    warning naming the flag, the full recipe as the fix (it once said nothing: lint followed only the switch)."""
    argv = ["VLLM_ROCM_USE_AITER=1", "VLLM_USE_BREAKABLE_CUDAGRAPH=0", "vllm", "serve", "amd/MiniMax-M3-MXFP4",
            "--tensor-parallel-size", "8", "--moe-backend", "emulation", "--attention-backend", "TRITON_ATTN"]
    (slow,) = [f for f in _lint(argv)["findings"] if "silently slower" in f["message"]]
    assert slow["message"].startswith("--moe-backend emulation: vllm runs the MoE on emulation while the plan's "
                                      "correct fastest path is aiter-flydsl (AITER) — silently slower (emulation")
    assert "--moe-backend aiter" in slow["fix"] and "emulation" not in slow["fix"]


def test_a_launch_without_its_command_line_gets_the_recipe_as_the_fix():
    """A Launch without argv (a host's parsed config) gets the recipe's one-line command (lint.py _fix)."""
    launch = L.Launch("vllm", "amd/MiniMax-M3-MXFP4", {"tp": "8"}, {}, [])
    doc = L.lint_launch(launch, target="MI355X")
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["fix"] == ("export VLLM_ROCM_USE_AITER=1; the full recipe: VLLM_ROCM_USE_AITER=1 "
                           "VLLM_ROCM_USE_AITER_MOE=1 VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 "
                           "VLLM_USE_BREAKABLE_CUDAGRAPH=0 GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 vllm serve "
                           "amd/MiniMax-M3-MXFP4 --tensor-parallel-size 8 --moe-backend aiter --attention-backend "
                           "TRITON_ATTN")


def test_every_aiter_fused_moe_backend_is_the_engines_aiter_path():
    """Each backend of vLLM's `--moe-backend aiter` row (engines.toml) is the engine's aiter family."""
    row = next(r for r in engine_data("vllm")["vllm"]["backend"]
               if any(a["arg"] == "--moe-backend aiter" for a in r["args"]))
    assert row["backends"] and all(L._fam_of(b) == "aiter" for b in row["backends"])
    assert L._fam_of("triton") == "triton" and L._fam_of("no-such-backend") is None


def test_a_plan_on_aiter_asm_without_the_switch(monkeypatch):
    """A plan on aiter-asm without VLLM_ROCM_USE_AITER is silently slower (vllm#56945); with it, clean."""
    _disable(monkeypatch, "aiter-ck")
    doc = _lint(["vllm", "serve", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "8"], target="MI300X")
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["message"] == ("VLLM_ROCM_USE_AITER is unset: vllm runs the MoE on triton while the plan's correct "
                               "fastest path is aiter-asm (AITER) — silently slower")
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "8"],
                target="MI300X", engine_version="0.31.0")
    assert not _sev(doc, "error") and not _sev(doc, "warning"), doc["findings"]


def test_vllm_031_auto_with_the_switch_runs_aiter_on_gfx942():
    """vLLM 0.31 auto with VLLM_ROCM_USE_AITER=1 (_MOE default 1) runs AITER on gfx942/gfx950 (envs.py)."""
    line = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8"]
    caps, _ = resolve_capabilities("MI300X", None)
    d0 = next(d for d in plan_model(load_model("MiniMax-M3-MXFP4"), caps, 8, 1, warnings=[]).decisions
              if d.layer.kind == "moe")
    ck = next(r for r in d0.rejected if r.backend == "aiter-ck")  # the first AITER backend the plan rejects
    assert len(ck.reasons) >= 2 and ck.reasons[0].text.startswith("needs gfx950 for weights mxfp4")
    reasons = f"{ck.reasons[0].text}; {ck.reasons[1].text}"
    for extra in ([], ["--moe-backend", "aiter"]):
        doc = _lint(["VLLM_ROCM_USE_AITER=1", *line, *extra], target="MI300X", engine_version="0.31.0")
        (err,) = _sev(doc, "error")
        assert err["message"] == "vllm runs this MoE on aiter, which is wrong for the layer: " + reasons
        assert err["source"].startswith("ROCm/aiter@v0.1.15.post3:csrc/ck_gemm_moe_2stages_codegen/gen_instances.py")
        assert err["fix"] == ("VLLM_ROCM_USE_AITER=1 vllm serve amd/MiniMax-M3-MXFP4 --tensor-parallel-size 8 "
                              "--moe-backend emulation")   # the line's own assignment stays
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "VLLM_ROCM_USE_AITER_MOE=0", *line], target="MI300X",
                engine_version="0.31.0")
    assert not _sev(doc, "error"), doc["findings"]


def test_vllm_031_forced_triton_and_emulation():
    """vLLM 0.31 --moe-backend triton/triton_unfused runs Triton (recipes#581, vllm#46142); emulation too."""
    f8 = ["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "8"]
    for runner in ("triton", "triton_unfused"):
        doc = _lint(["VLLM_ROCM_USE_AITER=1", *f8, "--moe-backend", runner], engine_version="0.31.0")
        said = [f for f in doc["findings"] if f["severity"] != "info"]
        assert {f["severity"] for f in said} == {"warning"} and len(said) == 2, said
        assert any(f["source"] == "vllm-project/recipes#581" for f in said)
        assert any(f"--moe-backend {runner}: vllm runs the MoE on triton" in f["message"] for f in said)
    doc = _lint(["VLLM_ROCM_USE_AITER=1", *f8], engine_version="0.31.0")
    assert not [f for f in doc["findings"] if f["severity"] != "info"], doc["findings"]
    doc = _lint([*f8, "--moe-backend", "emulation"], engine_version="0.31.0")
    (slow,) = _sev(doc, "warning")
    assert slow["message"] == ("VLLM_ROCM_USE_AITER is unset and --moe-backend emulation: vllm runs the MoE on "
                               "emulation while the plan's correct fastest path is aiter-flydsl (AITER) — silently "
                               "slower (emulation dequantizes to BF16: the slow reference path, not for serving)")
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8",
                 "--moe-backend", "triton"], engine_version="0.31.0")
    (err,) = _sev(doc, "error")
    assert err["message"] == ("vllm runs this MoE on triton, which is wrong for the layer: [vllm#46142] Triton MXFP4 "
                              "MoE (TRITON / TRITON_UNFUSED) does not apply activation QDQ (wrong output, open; route "
                              "to aiter-flydsl)")
    assert err["source"].startswith("vllm-project/vllm#46142")
    assert err["fix"] == ("VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 "
                          "VLLM_USE_BREAKABLE_CUDAGRAPH=0 vllm serve amd/MiniMax-M3-MXFP4 --tensor-parallel-size 8 "
                          "--moe-backend aiter --attention-backend TRITON_ATTN")


def test_a_forced_family_with_no_registered_backend(monkeypatch):
    """A forced family with no registered backend (plugin disabled): an error saying so, recipe as fix."""
    _disable(monkeypatch, "triton")
    doc = _lint(["VLLM_ROCM_USE_AITER=0", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "4",
                 "--moe-backend", "triton"], engine_version="0.31.0")
    (err,) = _sev(doc, "error")
    assert err == {"severity": "error", "source": None,
                   "message": "vllm runs this MoE on triton, which is wrong for the layer: no backend of that family "
                              "is registered",
                   "fix": "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 vllm serve Qwen/Qwen3-30B-A3B "
                          "--tensor-parallel-size 4 --moe-backend aiter"}


def test_sglang_forced_aiter_runner_on_a_layer_aiter_cannot_run():
    """SGLang --moe-runner-backend aiter runs AITER: MXFP4 on gfx942 is wrong for it (no FP4 MFMA) — error."""
    doc = _lint(["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path",
                 "amd/MiniMax-M3-MXFP4", "--tp", "8", "--moe-runner-backend", "aiter"], target="MI300X")
    (err,) = _sev(doc, "error")
    assert err["message"].startswith("sglang runs this MoE on aiter, which is wrong for the layer: needs gfx950")


def test_sglang_gate_info_reads_the_switch_as_sglang_does():
    """SGLang 0.5.21+ runs unaligned BF16 MoE on Triton itself (sglang.gate, unquant.py): info + source."""
    q = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "8"]
    gate = engine_data("sglang")["sglang"]["gate"][0]
    doc = _lint(["SGLANG_USE_AITER=true", *q])
    (info,) = [f for f in doc["findings"] if "Triton itself" in f["message"]]
    assert info == {"severity": "info", "source": gate["source"], "fix": None,
                    "message": "sglang 0.5.23 runs this MoE on Triton itself with SGLANG_USE_AITER=1: " + gate["what"]}
    doc = _lint(["SGLANG_USE_AITER=1", *q, "--moe-runner-backend", "triton"])
    assert not [f for f in doc["findings"] if "Triton itself" in f["message"]]
    assert not _sev(doc, "error") and not _sev(doc, "warning")


def test_sglang_28244_needs_the_auto_runner():
    """sgl-project/sglang#28244 (< 0.5.21) needs the auto runner (engines.toml runner), not aiter."""
    q = ["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp",
         "8"]
    doc = _lint(q, engine_version="0.5.20")
    assert _by_source(doc, "sgl-project/sglang#28244") and doc["engine_version"] == "0.5.20"
    doc = _lint([*q, "--moe-runner-backend", "aiter"], engine_version="0.5.20")
    assert not [f for f in doc["findings"] if f["source"] == "sgl-project/sglang#28244"]
    (err,) = _sev(doc, "error")
    assert err["message"].startswith("sglang 0.5.20 allocates hidden 2048 × intermediate/rank 96 for this layer")


def test_unconfirmed_engine_issues_say_so():
    """An unconfirmed engine issue (SemiAnalysisAI/InferenceX#1951) says '(unconfirmed)', source, fix."""
    doc = _lint(["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "4",
                 "--enable-expert-parallel"], target="MI300X")
    (f,) = _by_source(doc, "SemiAnalysisAI/InferenceX#1951")
    assert f == {"severity": "error", "source": "SemiAnalysisAI/InferenceX#1951",
                 "message": "MiniMax-M3-MXFP8 on gfx942 with expert parallelism produced garbled tokens (unconfirmed)",
                 "fix": "drop --enable-expert-parallel (TP only), as the MI300X recipes do"}


def test_sglang_layout_flags():
    """SGLang --enable-dp-attention splits attention TP over --dp-size, the MoE stays tensor-parallel over the whole
    --tp-size without --ep-size (moe_ep_setup.py: moe_tp_size = tp_size // moe_ep_size // moe_dp_size); --ep-size is
    the EP degree (server_args.py). Returns (MoE plan tp, ep, attention tp)."""
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-235B-A22B-Instruct-2507", "--tp", "8"]
    assert L._plan_layout(L.parse_launch(None, [*base, "--dp", "2", "--enable-dp-attention"])) == (8, 1, 4)
    assert L._plan_layout(L.parse_launch(None, [*base, "--dp", "3", "--enable-dp-attention"])) == (8, 1, 8)
    assert L._plan_layout(L.parse_launch(None, [*base, "--dp", "8", "--enable-dp-attention", "--ep-size", "8"])) == (
        8, 8, 1)
    # 1 < EP < TP with data-parallel attention: the MoE's TP is tp_size // ep_size = 4 (runtime_context.py
    # derive_spawn_ranks), not the attention TP // EP = 2 it was planned at (plan tp 4, ep 2).
    launch = L.parse_launch(None, [*base, "--dp", "2", "--enable-dp-attention", "--ep-size", "2"])
    assert L._plan_layout(launch) == (8, 2, 4)
    from moedispatch.core.layers import moe_tp_size

    assert moe_tp_size(*L._plan_layout(launch)[:2]) == 4
    doc = _lint(["SGLANG_USE_AITER=1", *base, "--ep-size", "8"], target="MI300X")
    assert doc["parallel"] == {"tp": 8, "ep": 8}


def test_sglang_attn_dp_size_is_data_parallel_attention():
    """SGLang 0.5.23 deprecates `--dp-size N --enable-dp-attention` for `--attn-dp-size N` (server_args.py: "Use
    --attn-dp-size <dp-size> instead"); the old spelling resolves to attn_dp_size = N only when --attn-dp-size is not
    given (arg_groups/parallel_hook.py _handle_deprecated_dp_attention), and attention TP = tp_size // attn_dp_size
    (runtime_context.py derive_attn_tp_size). lint read --attn-dp-size as nothing: attention TP 8."""
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-235B-A22B-Instruct-2507", "--tp", "8"]
    assert L._plan_layout(L.parse_launch(None, [*base, "--attn-dp-size", "2"])) == (8, 1, 4)
    assert L._plan_layout(L.parse_launch(None, [*base, "--attention-data-parallel-size", "8", "--ep-size", "8"])) \
        == (8, 8, 1)
    assert L._plan_layout(L.parse_launch(None, [*base, "--attn-dp-size", "4", "--dp", "2", "--enable-dp-attention"])) \
        == (8, 1, 2)                                    # --attn-dp-size given: the old spelling adds nothing
    assert L._plan_layout(L.parse_launch(None, [*base, "--attn-dp-size", "3"])) == (8, 1, 8)
    with pytest.raises(UsageError, match=r"attention data-parallel size \(--attn-dp-size\) must be an integer"):
        L._plan_layout(L.parse_launch(None, [*base, "--attn-dp-size", "two"]))


def test_sglang_dp_attention_with_ep_keeps_its_layout_in_the_fix_and_says_the_moe_tp():
    """DeepSeek-V3 --tp 8 --dp 2 --enable-dp-attention --ep-size 2 on MI355X: the info names MoE TP 4 and attention
    TP 4; the fix (the recipe) keeps --tp-size 8 --ep-size 2 and the attention DP 2 (it was --tp-size 4 --ep-size 2,
    another launch), spelled --attn-dp-size 2 on 0.5.23 (the deprecated spelling dropped: both together are refused)
    and --enable-dp-attention --dp-size 2 on 0.5.21."""
    doc = _lint(["python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "8",
                 "--ep-size", "2", "--enable-dp-attention", "--dp", "2"], target="MI355X")
    infos = [f["message"] for f in doc["findings"] if "data-parallel attention" in f["message"]]
    assert infos == ["data-parallel attention with expert parallelism: sglang 0.5.23 shards the MoE by its own sizes "
                     "(TP 8 / EP 2: MoE TP 4), the attention at TP 4"]
    fixes = [f["fix"] for f in doc["findings"] if f.get("fix") and "launch_server" in f["fix"]]
    assert fixes and all("--tp-size 8 --ep-size 2 --attn-dp-size 2" in fx and "--enable-dp-attention" not in fx
                         and "--dp-size" not in fx for fx in fixes), fixes
    doc = _lint(["python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "8",
                 "--ep-size", "2", "--enable-dp-attention", "--dp", "2"], target="MI355X", engine_version="0.5.21")
    fixes = [f["fix"] for f in doc["findings"] if f.get("fix") and "launch_server" in f["fix"]]
    assert fixes and all("--tp-size 8 --ep-size 2 --enable-dp-attention --dp-size 2" in fx for fx in fixes), fixes


def test_sglang_moe_dp_size_is_not_planned_and_says_so():
    """--moe-dp-size 2 (MoE data-parallel over context-parallel groups): lint does not plan a MoE sharding it does
    not model — a warning naming it, no MoE finding, no error."""
    doc = _lint(["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path",
                 "deepseek-ai/DeepSeek-V3", "--tp", "8", "--moe-dp-size", "2"], target="MI355X")
    warn = [f for f in doc["findings"] if "--moe-dp-size" in f["message"]]
    assert len(warn) == 1 and warn[0]["severity"] == "warning" and "runtime_context.py" in warn[0]["source"]
    assert not [f for f in doc["findings"] if f["severity"] == "error"]


def test_an_expert_parallel_size_that_does_not_divide_cites_the_engines_ep_rule():
    """--tp 8 --ep-size 3: the error names SGLang's EP rule (moe_ep_setup.py), not the attention heads' source."""
    doc = _lint(["python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "8",
                 "--ep-size", "3"], target="MI355X")
    (err,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert "moe_ep_setup.py" in err["source"] and err["fix"].startswith("pick an expert-parallel size")


def test_vllm_has_no_aiter_gate():
    """Only SGLang has an own AITER gate (engines.toml sglang.gate): for vLLM the gate check finds none."""
    launch = L.parse_launch(None, ["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "8"])
    caps, _ = resolve_capabilities("MI355X", None)
    plan = plan_model(load_model("Qwen3-30B-A3B"), caps, 8, 1, warnings=[])
    assert launch.engine == "vllm" and L._gate_fails("vllm", "0.33.0", plan) is None
    assert L._gate_fails("sglang", "0.5.23", plan)["intermediate_multiple"] == 128


# -- AITER's dispatch issues ----------------------------------------------------------------------------------------

QWEN_NEXT = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8",
             "--tensor-parallel-size", "4"]


def test_a_dispatch_issue_with_an_env_workaround():
    """ROCm/aiter#3997 (AITER < 0.1.18): fix exports AITER_KSPLIT=-1, then the launch; env handles it."""
    doc = _lint(QWEN_NEXT, target="MI300X", aiter="0.1.17")
    assert doc["target"]["aiter_version"] == "0.1.17"
    (f,) = _by_source(doc, "ROCm/aiter/pull/3997")
    assert f["severity"] == "error"
    assert f["message"].startswith("AITER runs moe_ck2stages_gemm1 (default) for tokens 1–4 (bucket 1): gibberish "
                                   "output: each split of the block-fp8 CK stage-1 GEMM")
    assert ". Workaround: AITER >= 0.1.18, or AITER_KSPLIT=-1 (no split-K" in f["message"]
    assert f["fix"] == ("export AITER_KSPLIT=-1; VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 AITER_KSPLIT=-1 vllm serve "
                        "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 --tensor-parallel-size 4 --moe-backend aiter")
    assert any(f["message"].startswith("caveat [aiter#4783]") for f in _sev(doc, "info"))
    doc = _lint(["AITER_KSPLIT=-1", *QWEN_NEXT], target="MI300X", aiter="0.1.17")
    assert not _by_source(doc, "ROCm/aiter/pull/3997")


def test_a_dispatch_issue_at_one_token_count():
    """ROCm/aiter#3997 on MiniMax-M2.1 TP8 (MI300X, AITER 0.1.17) hits one token count: 'token 1' (with
    --moe-backend aiter: under auto vLLM 0.33 refuses the refined 64-blocks and AITER runs nothing)."""
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "MiniMaxAI/MiniMax-M2.1", "--tensor-parallel-size", "8",
                 "--moe-backend", "aiter"], target="MI300X", aiter="0.1.17")
    (f,) = _by_source(doc, "ROCm/aiter/pull/3997")
    assert " for token 1 (bucket 1): " in f["message"]


def test_a_token_cap_handles_one_issue_and_not_the_next():
    """--max-num-batched-tokens 4096 handles ROCm/aiter#3471 (token_cap), not ROCm/aiter#5769. The fix of each is what
    addresses it: the launch with the cap for #3471 (exec --guard fix can run it); for #5769 (no workaround in AITER) none
    — the recipe's line was offered for both, though the recipe's own launch hits both (its aiter_runs issues)."""
    line = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
            "--tensor-parallel-size", "1"]
    doc = _lint(line, aiter="0.1.17")
    (crash,) = _by_source(doc, "ROCm/aiter/issues/3471")
    assert crash["severity"] == "error" and " for token 8192 (bucket 8192): GPU memory access fault" in crash["message"]
    assert crash["fix"] == ("VLLM_ROCM_USE_AITER=1 vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 "
                            "--tensor-parallel-size 1 --max-num-batched-tokens 4096")
    doc = _lint([*line, "--max-num-batched-tokens", "4096"], aiter="0.1.17")
    assert not _by_source(doc, "ROCm/aiter/issues/3471")
    (over,) = _by_source(doc, "ROCm/aiter/issues/5769")
    assert over["severity"] == "warning" and over["fix"] is None


def _one_layer(name):
    """The model as an engine loads it with --hf-overrides '{"num_hidden_layers": 1}' (the guard's spec)."""
    spec = load_model(name)
    return dataclasses.replace(spec, layers=spec.layers[:1])


def test_a_one_layer_debug_launch_reports_every_issue_it_meets():
    """One MoE layer (hf-overrides debug): a handled issue hides no other; the SGLang gate reads it."""
    launch = L.parse_launch(None, ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
                                   "--tensor-parallel-size", "1", "--max-num-batched-tokens", "4096"])
    doc = L.lint_launch(launch, target="MI355X", aiter_version="0.1.17",
                        spec=_one_layer("Qwen3-235B-A22B-Instruct-2507-FP8"))
    assert not _by_source(doc, "ROCm/aiter/issues/3471")
    assert [f["severity"] for f in _by_source(doc, "ROCm/aiter/issues/5769")] == ["warning"]
    launch = L.parse_launch(None, ["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path",
                                   "Qwen/Qwen3-30B-A3B", "--tp", "8"])
    doc = L.lint_launch(launch, target="MI355X", spec=_one_layer("Qwen3-30B-A3B"))
    assert [f["severity"] for f in doc["findings"] if "Triton itself" in f["message"]] == ["info"]


# -- the plan cannot run ---------------------------------------------------------------------------------------------

def test_a_tp_that_cannot_shard_the_model():
    """A TP that cannot shard the MoE: one error with engines.toml heads_source and a TP fix."""
    doc = _lint(["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "5"])
    (err,) = _sev(doc, "error")
    assert err["message"] == ("TP 5 / EP 1 cannot shard Qwen3-30B-A3B: intermediate size 768 is not divisible by the "
                              "MoE TP degree 5")
    assert err["source"] == engine_data("sglang")["sglang"]["heads_source"]
    assert err["fix"] == "pick a TP that divides the model (e.g. 1, 2, 4, 8)"
    assert (doc["engine_version"], doc["model"], doc["parallel"]) == ("0.5.23", "Qwen3-30B-A3B", {"tp": 5, "ep": 1})
    assert doc["target"]["gfx"] == "gfx950"


def test_no_backend_for_the_moe_layers(monkeypatch):
    """With the emulation plugin disabled nothing runs MiniMax-M3-MXFP8 on MI300X: one error, pointing at explain."""
    _disable(monkeypatch, "emulation")
    doc = _lint(["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "8"], target="MI300X")
    assert _sev(doc, "error") == [{"severity": "error", "source": None, "fix": "see `moedispatch explain`",
                                   "message": "some MoE layer has no correct backend on this target: no launch runs "
                                              "it correctly"}]


def test_a_repo_id_not_in_the_cache_still_gets_the_command_line_checks():
    """An uncached HF repo: command-line checks still run, and a warning says how to get the config."""
    ref = "mistralai/Mixtral-8x22B-Instruct-v0.1"
    doc = _lint(["vllm", "serve", ref, "--tensor-parallel-size", "8", "--moe-backend", "aiter"],
                engine_version="0.32.0")
    assert (doc["engine_version"], doc["model"], doc["parallel"]) == ("0.32.0", ref, {"tp": 8, "ep": 1})
    assert [f["severity"] for f in doc["findings"]] == ["error", "warning"]
    warn = doc["findings"][1]
    assert warn["message"].startswith(f"cannot read the launch's model {ref!r} (")
    assert warn["message"].endswith("): only the command line and its environment were checked — none of the MoE "
                                    "plan's checks ran")
    assert warn["fix"] == (f"fetch its config.json first (hf download {ref} config.json) or pass --model with a "
                           "built-in name, a checkpoint folder or config.json")


# -- Ray data-parallel actors --------------------------------------------------------------------------------------

RAY = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8",
       "--data-parallel-size", "2", "--moe-backend", "aiter", "--data-parallel-backend", "ray"]


def test_ray_actors_copy_only_some_prefixes():
    """Ray DP actors copy only DEFAULT_ENV_VAR_PREFIXES (vllm/ray/ray_env.py); names are comma-separated."""
    doc = _lint(["GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "AITER_LOG_MORE=1", *RAY], aiter="0.1.20.post1")
    (f,) = [x for x in doc["findings"] if x["message"].startswith("--data-parallel-backend ray:")]
    assert f["message"].startswith("--data-parallel-backend ray: vLLM's Ray data-parallel actors copy only VLLM_, "
                                   "FLASH_ATTENTION_, LMCACHE_, NCCL_, UCX_, HF_, HUGGING_FACE_ variables (and "
                                   "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY) from this shell: AITER_LOG_MORE")
    names = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY=AITER_LOG_MORE, GPTOSS_SWIGLU_MXFP4_BF16_BOUND"
    doc = _lint(["GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "AITER_LOG_MORE=1", names, *RAY], aiter="0.1.20.post1")
    assert not [x for x in doc["findings"] if x["message"].startswith("--data-parallel-backend ray:")]


# -- the report and the CLI ----------------------------------------------------------------------------------------

def _doc(findings):
    return {"schema": L.SCHEMA, "engine": "vllm", "engine_version": "0.33.0", "model": "Qwen3-30B-A3B",
            "target": {"gfx": "gfx950"}, "parallel": {"tp": 4, "ep": 1}, "env": {}, "launch": {},
            "findings": findings}


def test_the_table_wraps_each_part_at_its_column():
    """render_lint at a width: header hangs 4, message/source/fix wrap under their text; '?'/'none'."""
    text = L.render_lint(_doc([{"severity": "warning", "message": ("word " * 30).strip(),
                                "source": ("vllm-project/vllm#1 " * 6).strip(),
                                "fix": ("export VLLM_ROCM_USE_AITER=1 " * 4).strip()}]), "table", 60)
    assert text == ("lint vllm 0.33.0 launch of Qwen3-30B-A3B on gfx950 (?),\n"
                    "    AITER none, tp=4 ep=1\n"
                    "  WARNING word word word word word word word word word word\n"
                    "          word word word word word word word word word word\n"
                    "          word word word word word word word word word word\n"
                    "          source: vllm-project/vllm#1 vllm-project/vllm#1\n"
                    "                  vllm-project/vllm#1 vllm-project/vllm#1\n"
                    "                  vllm-project/vllm#1 vllm-project/vllm#1\n"
                    "          fix:    export VLLM_ROCM_USE_AITER=1 export \\\n"
                    "                  VLLM_ROCM_USE_AITER=1 export \\\n"
                    "                  VLLM_ROCM_USE_AITER=1 export \\\n"
                    "                  VLLM_ROCM_USE_AITER=1\n")
    assert L.render_lint(_doc([]), "table", None) == ("lint vllm 0.33.0 launch of Qwen3-30B-A3B on gfx950 (?), AITER "
                                                      "none, tp=4 ep=1\n  no findings\n")
    named = _doc([])
    named["target"] = {"gfx": "gfx942", "product": "MI300X", "aiter_version": "0.1.17"}
    assert L.render_lint(named, "table", None).startswith("lint vllm 0.33.0 launch of Qwen3-30B-A3B on gfx942 "
                                                          "(MI300X), AITER 0.1.17, tp=4 ep=1\n")


def _args(**kw):
    base = dict(file=None, engine_args=[], env=[], target="MI355X", aiter_version=None, model=None,
                engine_version=None, format="json", width=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_run_cli_reads_stdin_strips_the_separator_and_honours_the_width(monkeypatch):
    """`lint -` reads stdin (empty: one-line error); a leading `--` is dropped; the table fits the width."""
    out: list[str] = []
    monkeypatch.setattr("sys.stdin", io.StringIO("SGLANG_USE_AITER=1 python3 -m sglang.launch_server --model-path "
                                                 "Qwen/Qwen3-30B-A3B --tp 8\n"))
    rc = L.run_cli(_args(file="-", engine_version="0.5.20"), out.append)
    doc = json.loads(out[-1])
    assert rc == 3 and doc["launch"]["from"] == "stdin" and _by_source(doc, "sgl-project/sglang#28244")
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    with pytest.raises(UsageError, match="stdin is empty"):
        L.run_cli(_args(file="-"), out.append)
    rc = L.run_cli(_args(engine_args=["--", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "4",
                                      "--moe-backend", "aiter"], format="table", width=70), out.append)
    assert rc == 3 and out[-1].splitlines()[:2] == [
        "lint vllm 0.33.0 launch of Qwen3-30B-A3B on gfx950 (MI355X), AITER", "    0.1.20.post1, tp=4 ep=1"]


def test_run_cli_file_and_engine_args_are_exclusive(tmp_path):
    """FILE and `-- engine args` together: one UsageError naming both (the first three engine words, '…' after)."""
    script = tmp_path / "serve.sh"
    script.write_text("vllm serve Qwen/Qwen3-30B-A3B\n")
    with pytest.raises(UsageError) as exc:
        L.run_cli(_args(file=str(script), engine_args=["vllm", "serve", "Qwen/Qwen3-30B-A3B", "-tp", "4"]), print)
    assert str(exc.value).endswith(f"(got {str(script)!r} and vllm serve Qwen/Qwen3-30B-A3B …)")
    with pytest.raises(UsageError) as exc:
        L.run_cli(_args(file=str(script), engine_args=["vllm", "serve"]), print)
    assert str(exc.value).endswith(f"(got {str(script)!r} and vllm serve)")
    with pytest.raises(UsageError) as exc:
        L.run_cli(_args(engine_args=["vllm", "serve", "Qwen/Qwen3-30B-A3B"], env=["VLLM_ROCM_USE_AITER"]), print)
    assert str(exc.value) == "--env 'VLLM_ROCM_USE_AITER': expected KEY=VALUE (e.g. AITER_BYPASS_TUNE_CONFIG=1)"


def test_cli_lint_of_a_script_with_the_shell_environment(monkeypatch, tmp_path, capsys):
    """`moedispatch lint serve.sh`: its name as `from`; this shell's SGLANG_ env and --aiter-version count."""
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\n# Qwen3-30B-A3B – MI355X (sgl-project/sglang#28244)\n"
                      "python3 -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp 8\n", encoding="utf-8")
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    rc = main(["lint", str(script), "--target", "MI355X", "--aiter-version", "0.1.17", "--engine-version", "0.5.20",
               "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["launch"]["from"] == str(script)
    assert doc["env"] == {"SGLANG_USE_AITER": "1"} and doc["target"]["aiter_version"] == "0.1.17"
    assert _by_source(doc, "sgl-project/sglang#28244")


def test_the_containers_env_wins_over_the_hosts_and_its_fix_goes_into_the_container():
    """Inside `docker run -e K=V` the engine reads the container's value, not the host's export (docker run
    reference: -e sets the container's environment); a fix for a container launch sets -e on the run line — a
    variable exported on the host reaches only the docker CLI — replacing the launch's own -e of that name."""
    from moedispatch.engines.lint import lint_launch, parse_launch

    host0_container1 = ("export VLLM_ROCM_USE_AITER=0\ndocker run --rm -e VLLM_ROCM_USE_AITER=1 rocm/vllm:latest "
                        "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8\n")
    assert parse_launch(host0_container1).env["VLLM_ROCM_USE_AITER"] == "1"
    off = ("docker run --rm -e VLLM_ROCM_USE_AITER=0 rocm/vllm:latest vllm serve deepseek-ai/DeepSeek-V3 "
           "--tensor-parallel-size 8\n")
    doc = lint_launch(parse_launch(off), target="MI300X", model="DeepSeek-V3")
    slower = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert len(slower) == 1
    fix = slower[0]["fix"]
    assert fix.startswith("add -e VLLM_ROCM_USE_AITER=1 to `docker run`; the full recipe: docker run ")
    full = fix.split("the full recipe: ", 1)[1]
    assert "-e VLLM_ROCM_USE_AITER=1" in full and "VLLM_ROCM_USE_AITER=0" not in full
    assert not full.startswith("VLLM_") and "rocm/vllm:latest vllm serve deepseek-ai/DeepSeek-V3" in full


# -- the fix line replaces the user's whole command line ----------------------------------------------------------

def test_a_fix_line_keeps_the_assignments_written_on_the_commands_own_line():
    """`VLLM_ROCM_USE_AITER=1 vllm serve …`: the assignment is part of the command the pasted fix replaces, so the fix
    repeats it (it once dropped it, and the pasted line ran vLLM without AITER: envs.py reads VLLM_ROCM_USE_AITER
    default off). gpt-oss-120b TP8 on MI355X at AITER 0.1.15: vLLM's pads differ from the plan's (a warning with the
    recipe as fix)."""
    launch = L.parse_launch(None, ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "gpt-oss-120b",
                                   "--tensor-parallel-size", "8"])
    assert launch.prefix_env == {"VLLM_ROCM_USE_AITER": "1"} and launch.env == {"VLLM_ROCM_USE_AITER": "1"}
    doc = L.lint_launch(launch, target="MI355X", aiter_version="0.1.15")
    (pads,) = [f for f in doc["findings"] if "passes hidden_pad" in f["message"]]
    assert pads["fix"] == ("VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1 vllm serve gpt-oss-120b "
                           "--tensor-parallel-size 8 --moe-backend aiter")


def test_a_fix_line_gives_the_recipes_value_in_place_of_the_users_own_assignment():
    """A script whose engine line sets VLLM_ROCM_USE_AITER=0 and another variable: the fix keeps the other one, puts
    the recipe's =1 in place of the =0 (not beside it), and does not repeat an `export` (it stays set); the switch
    advice says to change the line's own assignment — an export would not override it."""
    script = ("export HF_HOME=/models\n"
              "VLLM_ROCM_USE_AITER=0 MY_TAG=a vllm serve openai/gpt-oss-120b --tensor-parallel-size 8\n")
    launch = L.parse_launch(script)
    assert launch.prefix_env == {"VLLM_ROCM_USE_AITER": "0", "MY_TAG": "a"}
    assert launch.env == {"HF_HOME": "/models", "VLLM_ROCM_USE_AITER": "0", "MY_TAG": "a"}
    doc = L.lint_launch(launch, target="MI355X")
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["fix"] == ("write VLLM_ROCM_USE_AITER=1 for VLLM_ROCM_USE_AITER=0 before the command; the full recipe: "
                           "VLLM_ROCM_USE_AITER=1 MY_TAG=a VLLM_ROCM_USE_AITER_MOE=1 vllm serve openai/gpt-oss-120b "
                           "--tensor-parallel-size 8 --moe-backend aiter")


def test_assignments_before_docker_stay_as_written_and_the_container_gets_e():
    """Before `docker run` an assignment reaches only the docker CLI: it stays as written, and what the recipe needs
    goes into the container as -e (https://docs.docker.com/reference/cli/docker/container/run/#env)."""
    argv = ["DOCKER_HOST=unix:///d.sock", "docker", "run", "--rm", "img", "vllm", "serve", "openai/gpt-oss-120b",
            "--tensor-parallel-size", "8"]
    launch = L.parse_launch(None, argv)
    assert launch.prefix_env == {"DOCKER_HOST": "unix:///d.sock"}
    (slow,) = [f for f in L.lint_launch(launch, target="MI355X")["findings"] if "silently slower" in f["message"]]
    assert slow["fix"].startswith("add -e VLLM_ROCM_USE_AITER=1 to `docker run`; the full recipe: "
                                  "DOCKER_HOST=unix:///d.sock docker run -e VLLM_ROCM_USE_AITER=1 ")


# -- what reaches an engine inside a container --------------------------------------------------------------------

def test_a_hosts_export_does_not_reach_the_engine_inside_docker_run():
    """docker run starts the container with its own environment: the host's `export VLLM_ROCM_USE_AITER=1` (or one
    set before `docker`) reaches the docker CLI, not vLLM — so vLLM runs Triton and lint says so (it once read the
    host's export as the engine's and called this launch clean)."""
    script = ("export VLLM_ROCM_USE_AITER=1\n"
              "docker run --rm rocm/vllm:latest vllm serve openai/gpt-oss-120b --tensor-parallel-size 8\n")
    launch = L.parse_launch(script)
    assert launch.env == {} and L.in_container(launch)
    (slow,) = [f for f in L.lint_launch(launch, target="MI355X")["findings"] if "silently slower" in f["message"]]
    assert slow["message"].startswith("VLLM_ROCM_USE_AITER is unset: vllm runs the MoE on triton")
    prefixed = L.parse_launch(None, ["VLLM_ROCM_USE_AITER=1", "docker", "run", "img", "vllm", "serve", "x"])
    assert prefixed.env == {} and prefixed.prefix_env == {"VLLM_ROCM_USE_AITER": "1"}


def test_docker_run_e_without_a_value_passes_the_hosts_variable():
    """`-e VAR` (no value) copies VAR from the environment docker runs in (the script's export, the line's own
    assignment, or the caller's environment); an unset one passes nothing."""
    script = ("export VLLM_ROCM_USE_AITER=1\n"
              "docker run --rm -e VLLM_ROCM_USE_AITER -e AITER_KSPLIT --env=HF_TOKEN rocm/vllm:latest "
              "vllm serve openai/gpt-oss-120b --tensor-parallel-size 8\n")
    assert L.parse_launch(script, variables={"HF_TOKEN": "hf_x"}).env == {"VLLM_ROCM_USE_AITER": "1",
                                                                          "HF_TOKEN": "hf_x"}
    line = ["VLLM_ROCM_USE_AITER=1", "docker", "run", "-e", "VLLM_ROCM_USE_AITER", "img", "vllm", "serve", "x"]
    assert L.parse_launch(None, line).env == {"VLLM_ROCM_USE_AITER": "1"}
    doc = L.lint_launch(L.parse_launch(script), target="MI355X")
    assert not [f for f in doc["findings"] if "silently slower" in f["message"]]


def test_lint_cli_does_not_give_the_callers_environment_to_a_container(monkeypatch, capsys):
    """`moedispatch lint` reads VLLM_*/SGLANG_*/AITER_* of the shell it runs in as the engine's environment — but
    not for a `docker run` launch, whose engine sees only the container's -e."""
    import json as _json

    from moedispatch.cli import main

    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    bare = ["vllm", "serve", "openai/gpt-oss-120b", "--tensor-parallel-size", "8"]
    for argv, slower in ((bare, False), (["docker", "run", "--rm", "img", *bare], True),
                         (["docker", "run", "-e", "VLLM_ROCM_USE_AITER", "img", *bare], False)):
        main(["lint", "--format", "json", "--target", "MI355X", "--", *argv])
        doc = _json.loads(capsys.readouterr().out)
        assert any("silently slower" in f["message"] for f in doc["findings"]) is slower, argv


def test_lint_reads_aiters_gptoss_bound_and_cu_num_from_the_shell_as_exec_does(monkeypatch, capsys):
    """AITER reads GPTOSS_SWIGLU_MXFP4_BF16_BOUND (aiter/fused_moe.py line 76) — not an AITER_ name: lint once kept only
    VLLM_/SGLANG_/AITER_ from the shell, so with the bound exported it still reported ROCm/aiter#5233 (exit 3) while
    `exec --guard refuse` in the same shell let the launch through. Both read core.workload.engine_env now."""
    import json as _json

    from moedispatch.cli import main
    from moedispatch.guard import launch as guard

    for k, v in (("VLLM_ROCM_USE_AITER", "1"), ("VLLM_ROCM_USE_AITER_MOE", "1"),
                 ("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "1"), ("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"),
                 ("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "0"), ("CU_NUM", "256")):
        monkeypatch.setenv(k, v)
    argv = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8", "--moe-backend", "aiter",
            "--attention-backend", "TRITON_ATTN"]
    rc = main(["lint", "--format", "json", "--target", "MI355X", "--aiter-version", "0.1.20.post1", "--", *argv])
    doc = _json.loads(capsys.readouterr().out)
    assert rc == 0 and not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert doc["env"]["GPTOSS_SWIGLU_MXFP4_BF16_BOUND"] == "0" and doc["env"]["CU_NUM"] == "256"
    out = guard.decide(argv, dict(os.environ), "refuse", guard._lint, target="MI355X", aiter_version="0.1.20.post1")
    assert out.action == "launch"


def test_vllm_data_parallel_without_expert_parallel_shards_the_moe_over_every_rank():
    """vLLM 0.33 flattens the MoE's TP across DP when --enable-expert-parallel is off (fused_moe/config.py
    FusedMoEParallelConfig.make): DP 2 × TP 8 runs the experts at TP 16; with EP, EP 16 and MoE TP 1."""
    base = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8", "--data-parallel-size", "2"]
    assert L._plan_layout(L.parse_launch(None, base)) == (16, 1, 8)
    assert L._plan_layout(L.parse_launch(None, [*base, "--enable-expert-parallel"])) == (8, 16, 8)
    assert L._plan_layout(L.parse_launch(None, base[:5])) == (8, 1, 8)


@pytest.mark.parametrize("argv", [
    ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "deepseek-ai/DeepSeek-V3", "--data-parallel-size", "8",
     "--trust-remote-code"],
    ["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3", "--tp",
     "8", "--enable-dp-attention", "--dp", "8", "--trust-remote-code"],
])
def test_deepseek_with_data_parallel_attention_fits_eight_gpus(argv):
    """DeepSeek-V3 on 8 MI355X with data-parallel attention and no EP (SGLang's standard DeepSeek launch, vLLM's DP
    8): the experts are tensor-parallel over all 8 ranks, ~80 GiB of weights per rank — it was planned at TP 1
    (~625 GiB per rank: "weights do not fit", exit 3, and `exec --guard refuse` stopped a standard launch)."""
    doc = _lint(argv, target="MI355X")
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert doc["parallel"] == {"tp": 8, "ep": 1}
    (dp,) = [f for f in doc["findings"] if f["message"].startswith("data-parallel attention without expert")]
    assert dp["severity"] == "info" and "(MoE TP 8, attention TP 1)" in dp["message"]
    launch = L.parse_launch(None, argv)
    caps, _ = resolve_capabilities("MI355X", None)
    plan = dataclasses.replace(plan_model(load_model("DeepSeek-V3"), caps, 8, 1, warnings=[]), attention_tp=1)
    from moedispatch.engines.layout import GIB, weight_bytes_per_rank
    per_rank = weight_bytes_per_rank(plan) / GIB
    at_tp8 = weight_bytes_per_rank(dataclasses.replace(plan, attention_tp=None)) / GIB
    assert 60 < at_tp8 < per_rank < 130     # attention and dense layers replicated per data-parallel rank
    assert launch.engine in ("vllm", "sglang")


def test_a_data_parallel_attention_layout_renders_as_the_engine_spells_it():
    """Plan.attention_tp realized: vLLM DP 2 × TP 4 is `--tensor-parallel-size 4 --data-parallel-size 2` (no
    --enable-expert-parallel); SGLang's is `--tp-size 8 --attn-dp-size 2` (`--dp-size 2 --enable-dp-attention` before 0.5.22); heads are checked at the
    attention TP (gpt-oss-120b: 64 heads, 8 KV heads — TP 4 splits them, MoE TP 8 is a plan value only)."""
    from moedispatch.engines.layout import realize_layout

    caps = capdb.target_capabilities("gfx950", None)
    plan = dataclasses.replace(plan_model(load_model("gpt-oss-120b"), caps, 8, 1, warnings=[]), attention_tp=4)
    vllm = realize_layout(plan, "vllm", engine_data("vllm")["vllm"])
    assert [a["arg"] for a in vllm.args] == ["--tensor-parallel-size 4", "--data-parallel-size 2"]
    assert (vllm.world, vllm.dp, vllm.errors) == (8, 2, [])
    sgl = realize_layout(plan, "sglang", engine_data("sglang")["sglang"])
    assert [a["arg"] for a in sgl.args] == ["--tp-size 8", "--attn-dp-size 2"]
    for version, spelled in (("0.5.22", ["--attn-dp-size 2"]), ("0.5.21", ["--dp-size 2", "--enable-dp-attention"])):
        sgl = realize_layout(plan, "sglang", engine_data("sglang")["sglang"], version=version)
        assert [a["arg"] for a in sgl.args] == ["--tp-size 8"] + spelled
    odd = dataclasses.replace(plan, attention_tp=3)   # 64 heads are not divisible by attention TP 3
    assert any("not divisible by TP 3" in r.text for r in realize_layout(odd, "vllm", engine_data("vllm")["vllm"]).errors)


# -- shell syntax on the engine's line ------------------------------------------------------------------------------

INFERENCEX_TAIL = """export VLLM_ROCM_USE_AITER=1
MODEL=amd/MiniMax-M3-MXFP4
vllm serve $MODEL --port 8888 \\
  --tensor-parallel-size 8 \\
  --max-model-len "$MAX_MODEL_LEN" \\
  --disable-log-requests > /tmp/server.log 2>&1 &
"""


def test_redirections_and_background_after_the_engine_are_shell_not_engine_arguments():
    """InferenceX-style `vllm serve … > /tmp/server.log 2>&1 &`: the redirections and `&` are the shell's — lint once
    handed them to vLLM's argument list and its fix quoted them ('>' '2>&1' '&': argparse rejects them) and put the
    recipe's options after them. Now the engine's words end before them; the fix adds its options there and keeps the
    shell syntax, unquoted, at the end."""
    launch = L.parse_launch(INFERENCEX_TAIL)
    assert launch.shell_tail == [">", "/tmp/server.log", "2>&1", "&"]
    assert launch.argv[-1] == "--disable-log-requests" and launch.model == "amd/MiniMax-M3-MXFP4"
    doc = L.lint_launch(launch, target="MI355X", aiter_version="0.1.20.post1")
    fixes = [f["fix"] for f in doc["findings"] if f["fix"] and "vllm serve" in f["fix"]]
    assert fixes
    for fix in fixes:
        assert fix.endswith(" --attention-backend TRITON_ATTN > /tmp/server.log 2>&1 &"), fix
        assert ' --max-model-len "$MAX_MODEL_LEN" ' in fix   # the unexpanded variable still expands when pasted


@pytest.mark.parametrize("tail", [["|", "tee", "log"], ["&&", "echo", "up"], [">>", "a.log"], ["2>", "err.log"],
                                  [">/tmp/x.log"], ["&>", "all.log"], [";", "sleep", "1"]])
def test_each_kind_of_shell_syntax_ends_the_engines_arguments(tail):
    launch = L.parse_launch(None, ["vllm", "serve", "m", "--port", "1", *tail])
    assert launch.argv == ["vllm", "serve", "m", "--port", "1"] and launch.shell_tail == tail


def test_a_fix_word_is_quoted_for_the_shell_it_is_pasted_into():
    assert L._shell_word("--tensor-parallel-size") == "--tensor-parallel-size"
    assert L._shell_word("$MAX_MODEL_LEN") == '"$MAX_MODEL_LEN"' and L._shell_word("${TP:-8}") == '"${TP:-8}"'
    assert L._shell_word('{"a": 1}') == "'{\"a\": 1}'" and L._shell_word("a b") == "'a b'"
    assert L._shell_word('$X"y') == "'$X\"y'"   # a double quote inside: single quotes, literal


def test_lint_and_exec_plan_for_the_aiter_explain_plans_for(monkeypatch):
    """Without --aiter-version, explain plans for the AITER installed in this Python (probe.targets.cli_aiter_version);
    lint and exec planned for capability_db's newest — so the recipe explain printed got a lint warning. All three
    resolve the version the same way now (MOEDISPATCH_AITER_VERSION=default: the newest)."""
    from moedispatch.guard import launch as guard

    seen = []
    monkeypatch.setattr(L, "lint_launch", lambda launch, **kw: seen.append(kw["aiter_version"]) or {
        "findings": [], "engine": "vllm", "engine_version": "0.33.0", "model": "m"})
    monkeypatch.setattr(L, "render_lint", lambda doc, fmt, width=None: "")
    monkeypatch.setattr(guard, "run", lambda argv, **kw: seen.append(kw["aiter_version"]) or 0)
    monkeypatch.setattr("moedispatch.probe.targets.installed_aiter", lambda: ("0.1.7.post2", "/site/aiter"))
    monkeypatch.delenv("MOEDISPATCH_AITER_VERSION", raising=False)
    assert main(["lint", "--", "vllm", "serve", "m"]) == 0 and main(["exec", "--", "vllm", "serve", "m"]) == 0
    assert seen == ["installed", "installed"]
    monkeypatch.setenv("MOEDISPATCH_AITER_VERSION", "default")
    main(["lint", "--", "vllm", "serve", "m"])
    main(["exec", "--aiter-version", "0.1.18", "--", "vllm", "serve", "m"])
    assert seen[2:] == [None, "0.1.18"]


def test_kimi_int4_on_mi308x_lints_as_the_recipe_plans_it():
    """Kimi-K2.5 (compressed-tensors INT4) on MI308X with vLLM 0.33: the WNA16 oracle's TRITON is TritonWNA16Experts,
    the triton backend's int4 weight-only path (engines/vllm.toml oracle.wna16 families). The recipe once refused it
    ("no moedispatch backend") and told the user to downgrade vLLM while lint passed the same launch; now the recipe
    takes it, lint passes it, and a --moe-backend flydsl launch (gfx950 only) gets it as the fix."""
    triton = ["VLLM_ROCM_USE_AITER_MOE=0", "vllm", "serve", "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8",
              "--moe-backend", "triton"]
    assert not [f for f in _lint(triton, target="MI308X")["findings"] if f["severity"] != "info"]
    fly = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8",
           "--moe-backend", "flydsl"]
    (err,) = _sev(_lint(fly, target="MI308X"), "error")
    assert err["fix"] == ("VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=0 vllm serve moonshotai/Kimi-K2.5 "
                          "--tensor-parallel-size 8 --moe-backend triton")


# -- the newcomer review of lint and exec (this round) ------------------------------------------------------------

def test_vllms_model_may_follow_the_options_and_its_cli_module_is_a_launch():
    """`vllm serve --tensor-parallel-size 8 MODEL` (argparse takes model_tag after options) and `python -m
    vllm.entrypoints.cli.main serve MODEL` (serve is the subcommand, not the model)."""
    late = L.parse_launch(None, ["vllm", "serve", "--tensor-parallel-size", "8", "openai/gpt-oss-120b"])
    assert (late.model, late.flags) == ("openai/gpt-oss-120b", {"tp": "8"})
    mod = L.parse_launch(None, ["python", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--tensor-parallel-size",
                                "2"])
    assert (mod.engine, mod.model, mod.flags) == ("vllm", "m", {"tp": "2"})


def test_a_partition_target_is_named_in_lints_header_and_json():
    doc = _lint(["vllm", "serve", "openai/gpt-oss-120b", "--tensor-parallel-size", "8"], target="MI355X:CPX",
                aiter="0.1.20.post1")
    assert doc["target"]["partition"] == "CPX" and doc["target"]["compute_units"] == 32
    assert L.render_lint(doc).splitlines()[0].startswith(
        "lint vllm 0.33.0 launch of gpt-oss-120b on gfx950 (MI355X CPX, 32 CUs), AITER 0.1.20.post1")


def test_a_fix_line_wraps_as_one_shell_command_and_drops_an_option_the_parser_rejects():
    """A fix wrapped at plain spaces, pasted into a shell, ran as several broken commands: it now breaks only between
    shell words, each broken line ending in a backslash (bash reads it back as one command). An option
    the engine release rejects (SGLang 0.5.23 has no --enable-ep-moe) is said as its own error and left out of the
    corrected command, which must start."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "amd/MiniMax-M3-MXFP4", "--tp-size", "8",
            "--enable-ep-moe"]
    doc = _lint(argv, aiter="0.1.20.post1")
    assert any(f["message"].startswith("sglang 0.5.23 has no option --enable-ep-moe") for f in _sev(doc, "error"))
    fixes = [f["fix"] for f in doc["findings"] if f["fix"]]
    assert fixes and all("--enable-ep-moe" not in fix for fix in fixes)
    text = L.render_lint(doc, width=60)   # wrapped between shell words with ` \` continuations: bash reads it back
    for fix in fixes:
        wrapped = wrap_shell(fix, "          fix:    ", 60)
        assert "\n".join(wrapped) in text and all(len(line) <= 60 or " " not in line.strip() for line in wrapped)
        pasted = "\n".join([wrapped[0][len("          fix:    "):]] + wrapped[1:])
        assert shlex.split(pasted.replace("\\\n", " ")) == shlex.split(fix)


def test_what_lint_cannot_read_exactly_is_said():
    """A script that branches (its exports are read in order, conditions ignored) and a container's --env-file (not
    read): each a warning naming it and how to give the values."""
    script = ('if [ "$TP" = 8 ]; then\n  export GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0\nfi\n'
              "docker run --rm --env-file ./vllm.env img vllm serve amd/MiniMax-M3-MXFP4 --tensor-parallel-size 8\n")
    launch = L.parse_launch(script, source="serve.sh")
    assert launch.notes == [
        'serve.sh sets GPTOSS_SWIGLU_MXFP4_BF16_BOUND inside a branch or loop (`if [ "$TP" = 8 ]; then`): lint '
        "reads every assignment in order and ignores the conditions — check the values it used (the JSON report's "
        "env) or give them with --env K=V",
        "docker run --env-file ./vllm.env: lint does not read it — give its variables with --env K=V"]
    doc = L.lint_launch(launch, target="MI355X", aiter_version="0.1.20.post1")
    assert [f["message"] for f in doc["findings"] if f["message"] in launch.notes] == launch.notes
    # a branch that sets what the launch does not read (InferenceX's HSA_NO_SCRATCH_RECLAIM) is no concern of lint's
    quiet = L.parse_launch('if [ -z "$v" ]; then\n  export HSA_NO_SCRATCH_RECLAIM=1\nfi\nvllm serve m\n')
    assert quiet.notes == []
    used = L.parse_launch('if true; then\n  TP=8\nfi\nvllm serve m --tensor-parallel-size $TP\n', source="s.sh")
    assert used.notes[0].startswith("s.sh sets TP inside a branch or loop (`if true; then`)")


def test_a_release_older_than_every_modelled_one_is_not_judged_by_another_releases_rules():
    """vLLM 0.20.0 (capability_db models 0.23.0–0.33.0): lint once said ERROR "no known way to select triton" (exit 3,
    and `exec --guard refuse` refused) — a gap in moedispatch's data, not a known-wrong launch. Now a warning says the
    MoE checks did not run, as the in-engine guard turns itself off for an unmodelled release."""
    doc = _lint(["vllm", "serve", "openai/gpt-oss-120b"], engine_version="0.20.0", aiter="0.1.20.post1")
    assert not _sev(doc, "error")
    (w,) = [f for f in _sev(doc, "warning") if "outside the releases" in f["message"]]
    assert w["message"].startswith("vllm 0.20.0 is outside the releases moedispatch models (0.23.0–0.33.0): only the "
                                   "command line and its environment were checked")
    assert not [f for f in _sev(_lint(["vllm", "serve", "openai/gpt-oss-120b"], engine_version="0.23.0"), "warning")
                if "outside the releases" in f["message"]]


# -- a new user's review (h1) ---------------------------------------------------------------------------------------

def test_vllm_s_own_pick_off_aiter_is_not_blamed_on_the_switch():
    """Kimi-K2.5 INT4 on vLLM 0.33 with the AITER switch on and no --moe-backend runs TritonWNA16 (FlyDSL needs
    --moe-backend flydsl: compressed_tensors_moe.py get_moe_method): silently slower, said with the flag as the cause
    and the recipe as the fix — with the switch off too (exporting it alone changes nothing)."""
    line = ["vllm", "serve", "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8"]
    for env in (["VLLM_ROCM_USE_AITER=1"], []):
        doc = _lint(env + line)
        (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
        assert slow["severity"] == "warning" and slow["message"].startswith(
            "--moe-backend auto (vllm 0.33.0's own pick for compressed-tensors experts, whatever VLLM_ROCM_USE_AITER "
            "says): vllm runs the MoE on triton while the plan's correct fastest path is aiter-flydsl")
        assert "int_wna16.py" in slow["source"]
        assert slow["fix"].endswith("vllm serve moonshotai/Kimi-K2.5 --tensor-parallel-size 8 --moe-backend flydsl")
        assert not slow["fix"].startswith("export")
    doc = _lint(["VLLM_ROCM_USE_AITER=1", *line, "--moe-backend", "flydsl"])
    assert not [f for f in doc["findings"] if "silently slower" in f["message"]]


def test_vllm_s_own_pick_of_emulation_is_said_without_a_safe_recipe():
    """DeepSeek-V4-Pro on MI355X: vLLM 0.33 auto picks EMULATION (AITER_MXFP4_FP8 lacks SiLU) with the switch on or
    off; no vLLM 0.33 launch at TP8 carries the plan, yet the reference path is said, with the nearest alternative."""
    for env in (["VLLM_ROCM_USE_AITER=1"], []):
        doc = _lint(env + ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Pro", "--tensor-parallel-size", "8"])
        (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
        assert "runs the MoE on emulation" in slow["message"] and "not for serving" in slow["message"]
        assert slow["fix"] and "--enable-expert-parallel" in slow["fix"]


def test_a_launch_the_engine_refuses_runs_no_aiter_kernel():
    """vLLM 0.33 refuses DeepSeek-V4-Pro with --moe-backend triton (no SiLU in its MXFP4 Triton kernel): the error
    says so, and what AITER's dispatcher would run (ROCm/aiter#5233) is not reported for a launch AITER never runs."""
    doc = _lint(["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "deepseek-ai/DeepSeek-V4-Pro", "--tensor-parallel-size",
                 "8", "--moe-backend", "triton"])
    assert any("refuses this launch" in f["message"] for f in _sev(doc, "error"))
    assert not [f for f in doc["findings"] if f["message"].startswith("AITER runs ")]
    assert not _by_source(doc, "aiter/issues/5233")


def test_a_misspelled_option_s_value_is_neither_the_model_nor_in_the_fix():
    """`--tensor-paralel-size 2` (did you mean --tensor-parallel-size, a value option): its `2` is its value — not
    vLLM's positional model when the option comes first, and left out of the corrected line with the option."""
    doc = _lint(["vllm", "serve", "--tensor-paralel-size", "2", "Qwen/Qwen3-30B-A3B"], target="MI300X")
    assert doc["launch"]["model"] == "Qwen/Qwen3-30B-A3B" and doc["model"] == "Qwen3-30B-A3B"
    assert any(f["message"].startswith("vllm 0.33.0 has no option --tensor-paralel-size (did you mean") for f in
               _sev(doc, "error"))
    doc = _lint(["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-paralel-size", "2", "--max-model-len", "4096"],
                target="MI300X")
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["fix"].endswith("vllm serve Qwen/Qwen3-30B-A3B --max-model-len 4096 --moe-backend aiter")
    # a misspelled value option followed by another option has no value: only the typo is left out
    doc = _lint(["vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-paralel-size", "--max-model-len", "4096"],
                target="MI300X")
    assert [f["message"].split(" (")[0] for f in _sev(doc, "error")] == [
        "vllm 0.33.0 has no option --tensor-paralel-size"]
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["fix"].endswith("vllm serve Qwen/Qwen3-30B-A3B --max-model-len 4096 --moe-backend aiter")


def test_a_compose_file_is_not_read_as_a_shell_script():
    """`command: vllm serve …` in a compose file: its `environment:` is not shell, so lint says what it read instead
    of reporting the AITER switch unset (and a fix line starting `command:`)."""
    text = ("services:\n  vllm:\n    environment:\n      - VLLM_ROCM_USE_AITER=1\n"
            "    command: vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 2\n")
    with pytest.raises(UsageError, match=r"compose.yaml reads as YAML \(`command: vllm serve .*not a shell script"):
        L.parse_launch(text, source="compose.yaml")


def test_a_script_passing_its_own_arguments_keeps_them_in_the_fix():
    """`vllm serve … "$@"` (a wrapper script passing its arguments on): the corrected line keeps `"$@"` for the
    shell to expand, not a quoted literal `'$@'` that vLLM would receive as an argument."""
    launch = L.parse_launch('#!/bin/bash\nvllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 8 "$@"\n')
    doc = L.lint_launch(launch, target="MI355X")
    (slow,) = [f for f in doc["findings"] if "silently slower" in f["message"]]
    assert slow["fix"].endswith('vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 8 "$@" --moe-backend aiter')
    assert L._shell_word("$1") == '"$1"' and L._shell_word("${@}") == '"${@}"' and L._shell_word("a b") == "'a b'"
