"""Issue 14 (5): ``moedispatch lint`` on real launch lines from the field, each with its source.

Every launch is read, never executed; exit 0 without an error finding, 3 with one, 2 for unusable input.
"""

from __future__ import annotations

import json

import pytest

# sgl-project/sglang#28244 (description): the launch that produced garbage on MI355X before the fix.
SGLANG_28244 = ("SGLANG_USE_AITER=1 python3 -m sglang.launch_server \\\n  --model-path Qwen/Qwen3-30B-A3B \\\n"
                "  --tp 8 \\\n  --mem-fraction-static 0.8 \\\n  --port 30000\n")
# vllm-project/vllm#47158 (test plan): MiniMax-M3-MXFP8 with the AITER master flag and expert parallelism.
VLLM_47158 = ["VLLM_USE_BREAKABLE_CUDAGRAPH=0", "VLLM_ROCM_USE_AITER=1", "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1",
              "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT6", "vllm", "serve", "/weights", "--served-model-name",
              "mm3-test", "--tensor-parallel-size", "4", "--enable-expert-parallel"]
# sgl-project/sglang#28358 (the SGLang cookbook's MI300X cell, verbatim flags).
SGLANG_28358 = ["SGLANG_USE_AITER=1", "python3", "-m", "sglang.launch_server", "--model-path",
                "MiniMaxAI/MiniMax-M3-MXFP8", "--trust-remote-code", "--reasoning-parser", "auto", "--tool-call-parser",
                "auto", "--tp", "8", "--quantization", "mxfp8", "--dtype", "bfloat16", "--attention-backend", "aiter",
                "--moe-runner-backend", "triton", "--chunked-prefill-size", "8192", "--mem-fraction-static", "0.80"]


def _lint(cli, *args):
    proc = cli("lint", "--format", "json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def _sev(doc, severity):
    return [f for f in doc["findings"] if f["severity"] == severity]


def test_sglang_aiter_preshuffled_weights_read_by_triton_before_28244(cli, tmp_path):
    """The #28244 launch (a script) at SGLang 0.5.20 is an error with its source and the corrected line; at 0.5.23
    SGLang's own gate runs Triton (info only)."""
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\n# from sgl-project/sglang#28244\n" + SGLANG_28244)
    proc, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.5.20")
    assert proc.returncode == 3 and doc["schema"] == "moedispatch.lint/1" and doc["engine"] == "sglang"
    err = [f for f in _sev(doc, "error") if f["source"] == "sgl-project/sglang#28244"]
    assert err and "pre-shuffled" in err[0]["message"]
    assert any("SGLANG_USE_AITER=0" in (f["fix"] or "") and "--moe-runner-backend triton" in f["fix"]
               for f in _sev(doc, "error"))
    proc, doc = _lint(cli, str(script), "--target", "MI355X")
    assert proc.returncode == 0 and not _sev(doc, "error")
    assert any("Triton itself" in f["message"] for f in doc["findings"])


def test_expert_parallel_on_a_path_known_to_garble(cli):
    """The #47158 launch on gfx942: MiniMax-M3-MXFP8 with EP gave garbled tokens (InferenceX PR #1951) — error."""
    proc, doc = _lint(cli, "--target", "MI300X", "--model", "MiniMax-M3-MXFP8", "--", *VLLM_47158)
    assert proc.returncode == 3, doc
    assert doc["parallel"] == {"tp": 4, "ep": 4}
    assert any(f["source"] == "SemiAnalysisAI/InferenceX#1951" for f in _sev(doc, "error"))
    # its model is a local path: without --model the lint says so and exits 2
    proc = cli("lint", "--target", "MI300X", "--", *VLLM_47158)
    assert proc.returncode == 2 and "pass --model" in proc.stderr and "Traceback" not in proc.stderr


def test_aiter_master_flag_unset_where_the_plan_needs_aiter(cli):
    """vLLM's AITER switch defaults to off (vllm#56945): --moe-backend aiter without it fails (error); auto without
    it silently runs Triton (warning) — the fix line exports the switch."""
    line = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "4"]
    proc, doc = _lint(cli, "--target", "MI355X", "--engine-version", "0.31.0", "--", *line)
    warn = [f for f in _sev(doc, "warning") if "VLLM_ROCM_USE_AITER is unset" in f["message"]]
    assert proc.returncode == 0 and warn and "VLLM_ROCM_USE_AITER=1" in warn[0]["fix"]
    proc, doc = _lint(cli, "--target", "MI355X", "--engine-version", "0.31.0", "--", *line, "--moe-backend", "aiter")
    assert proc.returncode == 3 and any("without VLLM_ROCM_USE_AITER=1" in f["message"] for f in _sev(doc, "error"))
    proc, doc = _lint(cli, "--target", "MI355X", "--engine-version", "0.31.0", "--env", "VLLM_ROCM_USE_AITER=1",
                      "--", *line, "--moe-backend", "aiter")
    assert proc.returncode == 0 and not _sev(doc, "error")


def test_triton_forced_with_the_aiter_master_switch_on(cli):
    """vllm-project/recipes#581: VLLM_ROCM_USE_AITER=1 conflicts with --moe-backend triton for MiniMax-M3 MXFP8."""
    line = ["VLLM_ROCM_USE_AITER=1", "vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "4",
            "--moe-backend", "triton"]
    proc, doc = _lint(cli, "--target", "MI355X", "--", *line)
    assert any(f["source"] == "vllm-project/recipes#581" for f in _sev(doc, "warning")), doc["findings"]


def test_aiter_config_fmoe_replaces_the_tuned_set(cli):
    """AITER_CONFIG_FMOE replaces (does not merge) AITER's tuned CSVs (sgl-project/sglang#37072)."""
    proc, doc = _lint(cli, "--target", "MI355X", "--env", "AITER_CONFIG_FMOE=/tmp/my_tuned_fmoe.csv", "--",
                      *SGLANG_28358)
    f = [x for x in _sev(doc, "warning") if "AITER_CONFIG_FMOE" in x["message"]]
    assert f and f[0]["source"] == "sgl-project/sglang#37072"


def test_a_tp_the_model_cannot_shard(cli):
    """The #28244 line at --tp 3: Qwen3-30B-A3B's 32 heads do not split over 3 GPUs (vLLM/SGLang refuse)."""
    line = SGLANG_28244.replace("--tp 8", "--tp 3").replace("\\\n", " ").split()
    proc, doc = _lint(cli, "--target", "MI355X", "--", *line)
    assert proc.returncode == 3
    assert any("TP 3" in f["message"] or "tp" in f["message"].lower() for f in _sev(doc, "error"))


def test_unusable_input_is_one_line_exit_2(cli, tmp_path):
    for args in (["lint"], ["lint", str(tmp_path / "missing.sh")], ["lint", "--", "ls", "-l"],
                 ["lint", "--", "vllm", "serve", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size", "x"]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    empty = tmp_path / "empty.sh"
    empty.write_text("echo hi\n")
    assert cli("lint", str(empty)).returncode == 2


def test_table_output_names_severity_source_and_fix(cli):
    line = SGLANG_28244.replace("\\\n", " ").split()
    proc = cli("lint", "--target", "MI355X", "--engine-version", "0.5.20", "--", *line)
    assert proc.returncode == 3
    assert "ERROR" in proc.stdout and "source: sgl-project/sglang#28244" in proc.stdout and "fix:" in proc.stdout


def test_a_forced_backend_the_engine_refuses(cli):
    """vLLM 0.33's MXFP8 map has no 'emulation' (oracle/mxfp8.py): forcing it fails to start — error, and the fix line
    is the recipe (auto, which ends on EMULATION on gfx942)."""
    line = ["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--tensor-parallel-size", "8", "--moe-backend", "emulation"]
    proc, doc = _lint(cli, "--target", "MI300X", "--", *line)
    assert proc.returncode == 3
    err = [f for f in _sev(doc, "error") if "not supported for mxfp8" in f["message"]]
    assert err and "--moe-backend auto" in err[0]["fix"]


def test_lint_never_tracebacks_on_odd_launches(capsys):
    """Fuzzed launch lines and scripts: exit 0, 2 or 3 with one line on stderr, never a traceback."""
    from hypothesis import given, settings, strategies as st

    from moedispatch.cli import main

    words = st.sampled_from(["vllm", "serve", "python3", "-m", "sglang.launch_server", "--model-path", "--tp", "8",
                             "3", "0", "x", "--tensor-parallel-size", "--enable-expert-parallel", "--ep-size",
                             "--data-parallel-size", "--moe-backend", "aiter", "triton", "emulation", "auto",
                             "--moe-runner-backend", "Qwen/Qwen3-30B-A3B", "amd/MiniMax-M3-MXFP4", "DeepSeek-V3",
                             "SGLANG_USE_AITER=1", "VLLM_ROCM_USE_AITER=1", "AITER_CONFIG_FMOE=/x.csv", "env", "'",
                             "--tp=4", "--dp-size", "--enable-dp-attention", "\\", "#"])

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(st.lists(words, max_size=10), st.sampled_from([["--target", "MI355X"], ["--target", "MI300X"], []]))
    def check(tokens, target):
        rc = main(["lint", "--format", "json", *target, "--", *tokens])
        err = capsys.readouterr().err
        assert rc in (0, 2, 3), (tokens, rc)
        assert "Traceback" not in err
        if rc == 2:
            assert err.count("\n") == 1, err

    check()


# SemiAnalysisAI/InferenceX@286dc1ae7d78a3514286e192c50ebf35f6a47296:benchmarks/single_node/fixed_seq_len/
# gptoss_fp4_mi355x.sh — the env and launch lines of the production gpt-oss-120b MI355X benchmark (excerpt).
INFERENCEX_GPTOSS = r'''
export VLLM_ROCM_USE_AITER=1
export VLLM_USE_ROCM_AITER_MXFP4=1
export AITER_BF16_FP8_BOUND=0
ATTN_BACKEND="--attention-backend ROCM_AITER_UNIFIED_ATTN"
SPEC_DECODE="--speculative-config {\"method\":\"ngram\",\"num_speculative_tokens\":3,\"prompt_lookup_min\":2,\"prompt_lookup_max\":64}"
SERVER_LOG=/workspace/server.log
version=`rocm-smi --showfw | grep MEC | head -n 1 |  awk '{print $NF}'`
if [[ "$version" == "" || $version -lt 177 ]]; then
  export HSA_NO_SCRATCH_RECLAIM=1
fi
vllm serve $MODEL --port $PORT \
  $ATTN_BACKEND \
  --tensor-parallel-size=$TP \
  --gpu-memory-utilization 0.97 \
  --max-model-len $MAX_MODEL_LEN \
  --block-size=64 \
  --no-enable-prefix-caching \
  $SPEC_DECODE > $SERVER_LOG 2>&1 &
'''


def test_a_production_script_with_shell_variables_lints_clean_and_loses_aiter_when_the_export_goes(cli, tmp_path):
    """The InferenceX gpt-oss-120b MI355X script (variables from --env, `$VAR` flags, redirections, an `if` block):
    no error or warning at TP 1/2/4/8; without its `export VLLM_ROCM_USE_AITER=1` the MoE silently runs off AITER."""
    script = tmp_path / "gptoss_fp4_mi355x.sh"
    script.write_text(INFERENCEX_GPTOSS)
    for tp in ("1", "2", "4", "8"):
        proc, doc = _lint(cli, str(script), "--target", "MI355X", "--env", "MODEL=openai/gpt-oss-120b",
                          "--env", f"TP={tp}")
        assert proc.returncode == 0 and doc["parallel"]["tp"] == int(tp), (tp, doc)
        assert not _sev(doc, "error") and not _sev(doc, "warning"), (tp, doc["findings"])
    script.write_text(INFERENCEX_GPTOSS.replace("export VLLM_ROCM_USE_AITER=1\n", ""))
    proc, doc = _lint(cli, str(script), "--target", "MI355X", "--env", "MODEL=openai/gpt-oss-120b", "--env", "TP=8")
    warn = [f for f in _sev(doc, "warning") if "VLLM_ROCM_USE_AITER is unset" in f["message"]]
    assert proc.returncode == 0 and warn and warn[0]["fix"].startswith("export VLLM_ROCM_USE_AITER=1")
    assert "vllm-project/vllm#56945" in warn[0]["source"]


@pytest.mark.parametrize("model, target, engine", [
    ("MiniMax-M3-MXFP4", "MI355X", "vllm"), ("GLM-4.7", "MI300X", "sglang"), ("gpt-oss-120b", "MI300X", "vllm"),
    # SGLang re-quantizes MXFP8 experts to block-FP8 at load on gfx942 and serves them on its Triton runner: the
    # recipe plans the converted experts, and lint once checked the checkpoint's MXFP8 on Triton (an ERROR).
    ("MiniMax-M3-MXFP8", "MI300X", "sglang"),
])
def test_the_tools_own_recipes_lint_clean(cli, tmp_path, model, target, engine):
    """A recipe moedispatch prints, linted as a launch script, raises no error or warning finding (a recipe that
    its own linter flags, or a lint fix that contradicts the recipe, would send users in circles)."""
    proc = cli("explain", "--model", model, "--target", target, "--tp", "8", "--recipe", engine)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "serve.sh"
    script.write_text(proc.stdout)
    lint = cli("lint", str(script), "--target", target, "--format", "json")
    findings = json.loads(lint.stdout)["findings"]
    assert lint.returncode == 0 and not [f for f in findings if f["severity"] in ("error", "warning")], findings


@pytest.mark.parametrize("runner", [None, "auto", "aiter"])
def test_sglang_mxfp8_on_gfx942_needs_the_explicit_triton_runner(cli, runner):
    """SGLang 0.5.23 converts MXFP8 experts to block-FP8 on gfx942 and honours only an explicit triton runner there:
    auto, and aiter (overridden with a warning), resolve to flashinfer_trtllm, which dies at weight load
    (arg_groups/overrides.py _moe_runner_backend_quant_constraints, sgl-project/sglang#35272) — one error naming the
    launch's runner, with the recipe's launch as the fix; with triton the converted experts lint clean."""
    flags = ["--moe-runner-backend", runner] if runner else []
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "MiniMaxAI/MiniMax-M3-MXFP8", "--tp-size", "8"]
    proc, doc = _lint(cli, "--target", "MI300X", "--env", "SGLANG_USE_AITER=0", "--", *argv, *flags)
    (err,) = _sev(doc, "error")
    assert proc.returncode == 3
    assert err["message"].startswith("sglang 0.5.23 serves these converted experts on gfx942 only with an explicit "
                                     "--moe-runner-backend triton: auto, and any other runner it overrides, resolve "
                                     "to flashinfer_trtllm")
    assert err["message"].endswith(f"(the launch has {runner or 'no --moe-runner-backend'})")
    assert "overrides.py" in err["source"] and err["fix"].endswith("--moe-runner-backend triton")
    (info,) = [f for f in doc["findings"] if "checked as the converted experts" in f["message"]]
    assert "(fp8 block128x128)" in info["message"] and "sgl-project/sglang#32036" in info["source"]
    assert not [f for f in doc["findings"] if "run on emulation" in f["message"]]   # the unconverted plan's line
    proc, doc = _lint(cli, "--target", "MI300X", "--env", "SGLANG_USE_AITER=0", "--", *argv,
                      "--moe-runner-backend", "triton")
    assert proc.returncode == 0 and not _sev(doc, "error") and not _sev(doc, "warning"), doc["findings"]
    # vLLM's own conversion (dequantized to BF16, emulation) has no runner rule: nothing of this is said there.
    proc, doc = _lint(cli, "--target", "MI300X", "--", "vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "-tp", "8")
    assert not [f for f in doc["findings"] if "converted experts" in f["message"]]


def test_sglang_refusing_a_forced_runner_is_reported_as_its_refusal(cli):
    """SGLang 0.5.23 raises for Quark MXFP4 with any runner but AITER (quark_w4a4_mxfp4_moe.py create_moe_runner):
    lint says the launch is refused, with that source — not that Triton would run it with wrong output."""
    proc, doc = _lint(cli, "--target", "MI355X", "--env", "SGLANG_USE_AITER=1", "--", "python", "-m",
                      "sglang.launch_server", "--model-path", "Qwen3.5-397B-A17B-MXFP4", "--tp", "4",
                      "--moe-runner-backend", "triton")
    assert proc.returncode == 3
    err = _sev(doc, "error")
    assert len(err) == 1 and "sglang 0.5.23 refuses this launch" in err[0]["message"]
    assert "requires the AITER runner" in err[0]["message"] and "quark_w4a4_mxfp4_moe.py" in err[0]["source"]
    assert "--moe-runner-backend auto" in err[0]["fix"]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.21"])
def test_a_data_parallel_attention_recipe_lints_clean_on_its_release(cli, tmp_path, version):
    """--tp 1 --ep 8 is SGLang's world 8 with attention TP 1: --attn-dp-size 8 from 0.5.22, --dp-size 8
    --enable-dp-attention before it (sgl-project/sglang@v0.5.22 server_args.py:415-422)."""
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--target", "MI355X", "--tp", "1", "--ep", "8", "--recipe",
               "sglang", "--engine-version", version)
    assert proc.returncode == 0, proc.stderr
    assert ("--attn-dp-size 8" in proc.stdout) == (version == "0.5.23")
    script = tmp_path / "serve.sh"
    script.write_text(proc.stdout)
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", version)
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")], doc["findings"]
    assert not [f for f in doc["findings"] if "deprecated" in f["message"]]


def _full_recipe(doc):
    fixes = {f["fix"].split("the full recipe: ", 1)[1] for f in doc["findings"] if "the full recipe: " in (f["fix"] or "")}
    assert len(fixes) == 1, doc["findings"]
    return fixes.pop()


def test_data_parallel_attention_spelled_for_another_release(cli, tmp_path):
    """--attn-dp-size on SGLang 0.5.21 (its parser has no such flag) is an error with the old spelling as the fix;
    the deprecated spelling on 0.5.23 is said (removed after 2026-12-31). Either way the full recipe keeps one
    spelling: both together are refused by SGLang ("--dp-size 8 with --attn-dp-size 8 ... not supported")."""
    head = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp-size 8 --ep-size 8 "
    script = tmp_path / "serve.sh"
    script.write_text(head + "--attn-dp-size 8\n")
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.5.21")
    err = [f for f in _sev(doc, "error") if "--attn-dp-size" in f["message"]]
    assert len(err) == 1 and err[0]["message"].startswith("sglang 0.5.21 has no --attn-dp-size (added in 0.5.22)")
    assert err[0]["fix"].startswith("--dp-size 8 --enable-dp-attention") and "v0.5.21" in err[0]["source"]
    fix = _full_recipe(doc)
    assert "--dp-size 8 --enable-dp-attention" in fix and "--attn-dp-size" not in fix
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.5.23")
    assert not [f for f in doc["findings"] if "attn-dp-size" in f["message"]]
    script.write_text(head + "--dp-size 8 --enable-dp-attention\n")
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.5.23")
    said = [f for f in _sev(doc, "info") if "deprecated" in f["message"]]
    assert len(said) == 1 and said[0]["fix"] == "--attn-dp-size 8 instead of --dp-size 8 --enable-dp-attention"
    fix = _full_recipe(doc)
    assert "--attn-dp-size 8" in fix and "--enable-dp-attention" not in fix and "--dp-size" not in fix
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.5.21")
    assert not [f for f in doc["findings"] if "deprecated" in f["message"] or "attn-dp-size" in f["message"]]
    assert "--dp-size 8 --enable-dp-attention" in _full_recipe(doc)


def test_a_pre_release_engine_is_said_once(cli, tmp_path):
    script = tmp_path / "serve.sh"
    script.write_text("vllm serve Qwen/Qwen3-30B-A3B\n")
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.33.0rc1")
    pre = [f for f in doc["findings"] if "pre-release" in f["message"]]
    assert len(pre) == 1 and pre[0]["severity"] == "warning" and "--engine-version 0.33.0" in pre[0]["message"]
    _, doc = _lint(cli, str(script), "--target", "MI355X", "--engine-version", "0.33.0")
    assert not [f for f in doc["findings"] if "pre-release" in f["message"]]
