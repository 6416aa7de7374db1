"""The second newcomer report's findings (issue 27), each reproduced with the report's command or call.

Each test fails on the code the report was written against (ed95a72) and passes now.
"""

from __future__ import annotations

import json
import os

import pytest

import moedispatch
from moedispatch import UsageError, select_moe_backend


def _one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, (proc.stdout[-300:], proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# -- 7. bad AITER env values are not silently replaced by defaults ------------------------------------------------

@pytest.mark.parametrize("pair", ["AITER_BF16_FP8_MOE_BOUND=lots", "AITER_BYPASS_TUNE_CONFIG=maybe",
                                  "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=1e3", "AITER_KSPLIT=two", "CU_NUM=eighty"])
def test_aiter_int_env_values_aiter_would_reject_exit_2(cli, pair):
    """AITER reads these with int() and raises ValueError; moedispatch says so instead of planning the default."""
    key, value = pair.split("=")
    line = _one_line_exit_2(cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-env", pair))
    assert line.startswith(f"moedispatch: {key}={value!r} is not an integer") and "ValueError" in line
    shell = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", env={key: value})
    assert _one_line_exit_2(shell) == line  # the shell and --aiter-env are one input


def test_aiter_switch_with_a_value_aiter_reads_as_off_warns(cli):
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-env", "AITER_FLYDSL_FORCE=true",
              "--format", "json")
    assert out.returncode == 0, out.stderr
    warnings = json.loads(out.stdout)["warnings"]
    assert any("AITER_FLYDSL_FORCE='true'" in w and "means off" in w for w in warnings)


def test_plugin_settings_are_checked(cli):
    line = _one_line_exit_2(cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X",
                                env={"MOEDISPATCH_PLUGIN_TIMEOUT": "soon"}))
    assert "MOEDISPATCH_PLUGIN_TIMEOUT='soon'" in line
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--format", "json",
              env={"MOEDISPATCH_DISABLE_PLUGINS": "aiter-flydls"})
    assert out.returncode == 0
    warnings = json.loads(out.stdout)["warnings"]
    assert any("MOEDISPATCH_DISABLE_PLUGINS" in w and "'aiter-flydls' (did you mean 'aiter-flydsl'?)" in w
               for w in warnings)


# -- 8. a token list has a stated cap ------------------------------------------------------------------------------

def test_token_count_cap(cli):
    line = _one_line_exit_2(cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tokens",
                                ",".join(str(i) for i in range(1, 20001))))
    assert "20000 token counts; at most 64" in line
    assert cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tokens", "1-131072",
               "--brief").returncode == 0
    with pytest.raises(UsageError, match="at most 64"):
        moedispatch.Runtime.build(range(1, 100))


# -- 9 / 2 / 3. the engine API: caps from a name, quant_config read, caveats on the Decision ------------------------

FIELDS = dict(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8, tp_size=8)


def test_caps_from_a_target_name():
    d = select_moe_backend(caps="MI300X", weight_quant="fp8", **FIELDS)
    assert d.target["product"] == "MI300X" and d.target["gfx"] == "gfx942"
    assert moedispatch.target("MI355X:CPX").compute_units == 32
    with pytest.raises(UsageError, match="caps must be Capabilities"):
        select_moe_backend(caps=3, **FIELDS)
    with pytest.raises(moedispatch.TargetError, match="did you mean 'MI300X'"):
        select_moe_backend(caps="MI3000X", **FIELDS)


def test_quant_config_keeps_the_fp8_block_size_and_its_caveats():
    """quant_config={"weight_block_size": [128, 128]} was dropped (per-tensor fp8), losing aiter#4783."""
    caps = moedispatch.target("MI300X", "0.1.20")
    d = select_moe_backend(caps=caps, weight_quant="fp8", quant_config={"weight_block_size": [128, 128]}, **FIELDS)
    assert d.layer.weight.granularity == "block128x128" and d.layer.act.granularity == "group128"
    assert any("aiter#4783" in r.text for r in d.caveats)
    line = str(d)
    assert "\n" not in line and line.startswith("layer 0: aiter-ck, no padding on gfx942 MI300X, AITER 0.1.20")
    assert "caveat: [aiter#4783]" in line

    class Fp8Config:  # vLLM's config object (vllm/model_executor/layers/quantization/fp8.py)
        weight_block_size = [128, 128]
        activation_scheme = "dynamic"

        @staticmethod
        def get_name():
            return "fp8"

    obj = select_moe_backend(caps=caps, quant_config=Fp8Config(), **FIELDS)
    assert obj.layer.weight.granularity == "block128x128"
    with pytest.raises(UsageError, match="disagrees with quant_config"):
        select_moe_backend(caps=caps, weight_quant="mxfp4", quant_config={"quant_method": "fp8"}, **FIELDS)
    with pytest.raises(UsageError, match="quant_config"):
        select_moe_backend(caps=caps, quant_config={"quant_method": "nonsense"}, **FIELDS)


# -- 12. compare says what it compared ----------------------------------------------------------------------------

def test_compare_names_each_release_rows(cli):
    out = cli("compare", "--model", "Qwen3-235B-A22B-Instruct-2507-FP8", "--target", "MI300X", "--tp", "8",
              "--aiter-version", "0.1.15.post3,0.1.20.post1")
    assert out.returncode == 0, out.stderr
    assert "rows bundled index: AITER v0.1.15.post3" in out.stdout
    assert "rows bundled index: AITER v0.1.20.post1" in out.stdout


# -- minors: an ASCII terminal ------------------------------------------------------------------------------------

def test_ascii_terminal_gets_ascii_not_a_traceback(cli):
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", env={"PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "layers 3-59 (57 MoE) -> " in out.stdout
    doc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--format", "json",
              env={"PYTHONIOENCODING": "ascii"})
    assert doc.returncode == 0 and json.loads(doc.stdout)["schema"].startswith("moedispatch.explain/")
    bad = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-env", "X",
              env={"PYTHONIOENCODING": "ascii"})
    _one_line_exit_2(bad)
    assert os.environ.get("PYTHONIOENCODING") != "ascii"  # the test process itself is untouched


# -- 4. lint forwards known kernel × bucket issues with the severity their data declares --------------------------

def test_lint_reports_a_dispatch_issue_with_its_data_severity(cli):
    """DeepSeek-R1-0528 (DeepSeek-V3 architecture) on MI355X got 'no findings' despite aiter#5769 (severity warning
    in capability_db/dispatch_issues.toml)."""
    out = cli("lint", "--target", "MI355X", "--model", "DeepSeek-V3", "--env", "VLLM_ROCM_USE_AITER=1",
              "--format", "json", "--", "vllm", "serve", "deepseek-ai/DeepSeek-R1-0528", "--tensor-parallel-size", "8")
    findings = json.loads(out.stdout)["findings"]
    hit = [f for f in findings if "a1_scale" in f["message"]]
    assert hit and hit[0]["severity"] == "warning" and hit[0]["source"].endswith("/5769")


def test_lint_error_severity_exits_3_and_its_workaround_is_recognised(cli):
    """aiter#3997 (severity error) on AITER 0.1.17: an error finding with the env fix, exit 3; the launch that
    already exports AITER_KSPLIT=-1 is clean of it."""
    base = ["lint", "--target", "MI300X", "--aiter-version", "0.1.17", "--model", "Qwen3.5-397B-A17B-FP8", "--env",
            "VLLM_ROCM_USE_AITER=1", "--format", "json"]
    launch = ["--", "vllm", "serve", "Qwen/Qwen3.5-397B-A17B-FP8", "--tensor-parallel-size", "8"]
    out = cli(*base, *launch)
    assert out.returncode == 3, out.stderr
    errors = [f for f in json.loads(out.stdout)["findings"] if f["severity"] == "error"]
    assert any("gibberish" in f["message"] and f["fix"].startswith("export AITER_KSPLIT=-1") for f in errors)
    fixed = cli(*base[:-2], "--env", "AITER_KSPLIT=-1", "--format", "json", *launch)
    assert not [f for f in json.loads(fixed.stdout)["findings"] if "gibberish" in f["message"]]


# -- 5. lint reads a launch as the engine's own argument parser does ---------------------------------------------

LINT = ("lint", "--target", "MI355X", "--model", "MiniMax-M3-MXFP4", "--format", "json", "--")


def test_lint_misspelled_flag_is_an_error_with_did_you_mean(cli):
    out = cli(*LINT, "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-paralel-size", "8", "--trust-remote-code")
    assert out.returncode == 3
    errors = [f["message"] for f in json.loads(out.stdout)["findings"] if f["severity"] == "error"]
    assert any("has no option --tensor-paralel-size (did you mean '--tensor-parallel-size'?)" in m for m in errors)
    # vLLM 0.33 has -tp but no --tp (argparse rejects it: no option starts with --tp)
    tp = cli(*LINT, "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tp", "8")
    assert any("has no option --tp (did you mean '-tp'?)" in f["message"] for f in json.loads(tp.stdout)["findings"])


@pytest.mark.parametrize("spelling", [["--tensor_parallel_size", "8"], ["--tensor-parallel", "8"], ["-tp", "8"],
                                      ["--tensor-parallel-size=8"]])
def test_lint_reads_the_spellings_vllm_accepts(cli, spelling):
    """FlexibleArgumentParser reads _ as -, argparse takes a unique prefix (allow_abbrev): all of these are TP 8."""
    out = cli(*LINT, "vllm", "serve", "amd/MiniMax-M3-MXFP4", *spelling)
    doc = json.loads(out.stdout)
    assert doc["parallel"]["tp"] == 8 and not [f for f in doc["findings"] if "has no option" in f["message"]]


def test_lint_reads_docker_run_env(cli):
    """`docker run -e VLLM_ROCM_USE_AITER=1 …` was not read (a false 'unset' warning)."""
    out = cli(*LINT, "docker", "run", "--rm", "-e", "VLLM_ROCM_USE_AITER=1", "--env=VLLM_ROCM_USE_AITER_MOE=1",
              "rocm/vllm:latest", "vllm", "serve", "amd/MiniMax-M3-MXFP4", "-tp", "8")
    doc = json.loads(out.stdout)
    assert doc["env"]["VLLM_ROCM_USE_AITER"] == "1" and doc["env"]["VLLM_ROCM_USE_AITER_MOE"] == "1"
    assert not [f for f in doc["findings"] if "VLLM_ROCM_USE_AITER is unset" in f["message"]]


def test_sglang_options_are_sglangs(cli):
    """SGLang 0.5.23 reads --tp-size, its alias --tensor-parallel-size and the prefix --tp as one option (tp_size);
    --tensor-parallel-sizes is no option of it."""
    base = ("lint", "--target", "MI355X", "--model", "MiniMax-M3-MXFP4", "--format", "json", "--", "python", "-m",
            "sglang.launch_server", "--model-path", "amd/MiniMax-M3-MXFP4")
    for flag in ("--tp-size", "--tensor-parallel-size", "--tp"):
        doc = json.loads(cli(*base, flag, "8").stdout)
        assert doc["parallel"]["tp"] == 8 and not [f for f in doc["findings"] if "has no option" in f["message"]]
    bad = json.loads(cli(*base, "--tensor-parallel-sizes", "8").stdout)
    assert any("sglang 0.5.23 has no option --tensor-parallel-sizes" in f["message"] for f in bad["findings"])


# -- 6. lint's fix line is the user's command with the minimal changes ------------------------------------------

def test_lint_fix_keeps_the_users_flags_and_model_id(cli):
    out = cli(*LINT, "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--trust-remote-code", "--max-model-len", "32768",
              "-tp", "8")
    fixes = [f["fix"] for f in json.loads(out.stdout)["findings"] if f["fix"]]
    assert fixes
    for fix in fixes:
        line = fix.split("the full recipe: ")[-1]
        assert "vllm serve amd/MiniMax-M3-MXFP4 --trust-remote-code --max-model-len 32768" in line
        assert line.count("--tensor-parallel-size 8") == 1 and " -tp " not in line  # replaced in place, not twice


# -- 13. verify's header names the AITER it assumed -------------------------------------------------------------

def test_verify_header_names_the_aiter(cli):
    pytest.importorskip("torch")
    out = cli("verify", "--model", "Mixtral-8x7B", "--target", "MI300X", "--tp", "8", "--aiter-version", "0.1.20")
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout.splitlines()[0].startswith("verify Mixtral-8x7B layer 0 on gfx942 (MI300X) with AITER 0.1.20 "
                                                 "(flag): backend ")
