"""The second newcomer report's input findings (issue 27), each with the report's command: a safetensors header that
contradicts config.json (major 11 / report M12), ``lint -`` (minor 18), and the minors the bad-input suite turned up
(``lint --env`` naming the wrong flag, the Git LFS pointer, an unknown model_type, ``verify --seed -1``).

The CLI runs in-process (``moedispatch.cli.main``); checkpoints are written in ``tmp_path`` with sparse data, so
expert tensors of a real model's size cost no disk.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import struct
from pathlib import Path

import pytest

from moedispatch.core.errors import ModelError
from moedispatch.sources.checkpoint import PREPAD_MAX_MULTIPLE, prepad_multiple
from moedispatch.sources.models import load_model


def run(argv, monkeypatch, *, stdin: str | None = None, env: dict | None = None,
        stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    """``moedispatch ARGV`` in-process: (exit code, stdout, stderr); ``stdout`` a stream to print into (e.g. one that
    says it is a terminal)."""
    from moedispatch.cli import main

    monkeypatch.setenv("MOEDISPATCH_AITER_VERSION", "default")
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    out, err = stdout if stdout is not None else io.StringIO(), io.StringIO()
    logger = logging.getLogger("moedispatch")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "" and "Traceback" not in err, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- checkpoints --------------------------------------------------------------------------------------------------

_BITS = {"BF16": 16, "F32": 32, "U8": 8, "F8_E4M3": 8}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = math.ceil(math.prod(shape) * _BITS[dtype] / 8)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)  # zero data as a hole


#: GLM-4.5-Air's published config.json (zai-org/GLM-4.5-Air: hidden 4096, moe_intermediate_size 1408), cut to one
#: dense and one MoE layer of 8 experts so the header stays small; the sizes the report lied about are the real ones.
GLM_AIR = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 4096,
           "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 8, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 96,
           "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "torch_dtype": "bfloat16"}


def glm_folder(tmp: Path, *, hidden: int = 4096, inter: int = 1408, config: dict | None = None) -> Path:
    """The report's ``<scratch>/bad/lie_*`` folders: GLM-4.5-Air's config, expert tensors stored [inter, hidden]."""
    folder = tmp / "ckpt"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config or GLM_AIR))
    tensors = {}
    for e in range(8):
        base = f"model.layers.1.mlp.experts.{e}"
        tensors[f"{base}.gate_proj.weight"] = ("BF16", (inter, hidden))
        tensors[f"{base}.up_proj.weight"] = ("BF16", (inter, hidden))
        tensors[f"{base}.down_proj.weight"] = ("BF16", (hidden, inter))
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def test_hidden_that_contradicts_the_config_is_an_error(tmp_path, monkeypatch):
    """`explain --model <scratch>/bad/lie_hidden --target MI300X --tp 8`: experts stored [1408, 5120] under a
    config with hidden 4096 were "pre-padded: hidden stored as 5120", exit 0."""
    folder = glm_folder(tmp_path, hidden=5120)
    line = one_line_error(*run(["explain", "--model", str(folder), "--target", "MI300X", "--tp", "8"], monkeypatch))
    assert "hidden_size is 4096" in line and "stores 5120" in line and str(folder / "model.safetensors") in line
    assert "expert weights keep the model's hidden size" in line


def test_intermediate_twice_the_config_is_no_pre_padding(tmp_path, monkeypatch):
    """`lie_bigger`: intermediate stored 2816 = 2 × 1408 was accepted as "+1408" of pre-padding."""
    folder = glm_folder(tmp_path, inter=2816)
    line = one_line_error(*run(["explain", "--model", str(folder), "--target", "MI300X", "--tp", "8"], monkeypatch))
    assert "intermediate size is 1408" in line and "stores 2816, which is no pre-padding of 1408" in line
    assert str(folder / "model.safetensors") in line and "2× the config" in line


@pytest.mark.parametrize("stored", [1400, 1024])
def test_intermediate_smaller_than_the_config_is_an_error(tmp_path, monkeypatch, stored):
    folder = glm_folder(tmp_path, inter=stored)
    line = one_line_error(*run(["explain", "--model", str(folder), "--target", "MI300X"], monkeypatch))
    assert "intermediate size is 1408" in line and f"stores {stored}" in line


def test_genuine_pre_padding_still_loads(tmp_path):
    """1408 stored as 1536 (176 → 192 per rank at TP8, a round-up to 256) is pre-padding, planned as before."""
    spec = load_model(str(glm_folder(tmp_path, inter=1536)))
    assert spec.prepadded and spec.stored_intermediate == 1536 and spec.layers[1].intermediate == 1408
    assert any("rounded up to a multiple of 256" in n for n in spec.notes)


@pytest.mark.parametrize("config, stored, multiple", [
    (2880, 3072, 256),   # gpt-oss MXFP4: vLLM's ROCm round-up to 256
    (1408, 1536, 256),   # GLM-4.5-Air at TP8, 176 → 192 per rank
    (96, 128, 64),       # tests/test_checkpoint.py's pre-padded gpt-oss-style folder
    (1400, 1408, 16),
    (1408, 1408, None),  # not larger: no pre-pad
    (1408, 2816, None),  # 2×: a fused gate_up or another model
    (512, 1024, None),   # 2× too, though a round-up to 1024 reaches it (Qwen3-Next's 512 with gate and up fused)
    (256, 1024, None),   # 4×: a whole multiple is never a pre-pad
    (1408, 4096, None),  # beyond one PREPAD_MAX_MULTIPLE round-up
    (1408, 1500, None),  # not a power-of-two multiple
])
def test_prepad_multiple(config, stored, multiple):
    assert prepad_multiple(config, stored) == multiple
    assert PREPAD_MAX_MULTIPLE == 1024


def test_git_lfs_pointer_says_so(tmp_path, monkeypatch):
    """Minor 26: a Git LFS pointer as *.safetensors said "safetensors header claims 2336927755350992246 bytes"."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GLM_AIR))
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a21\n"
                                              "size 4987654321\n")
    line = one_line_error(*run(["explain", "--model", str(folder)], monkeypatch))
    assert "a Git LFS pointer" in line and "git lfs pull" in line and "2336927755350992246" not in line


def test_unknown_model_type_is_planned_with_a_warning(tmp_path, monkeypatch):
    """Minor 24: an unknown model_type (acme_moe) was planned with no remark."""
    cfg = {**GLM_AIR, "model_type": "acme_moe", "architectures": ["AcmeMoeForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(["explain", "--model", str(tmp_path), "--target", "MI300X", "--format", "json"], monkeypatch)
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert any("model_type 'acme_moe' is no family moedispatch has a config of" in w and "activation silu" in w
               for w in warnings)
    with pytest.raises(ModelError):  # and a real contradiction still fails with it
        load_model(str(glm_folder(tmp_path / "sub", hidden=5120, config=cfg)))


# -- lint ---------------------------------------------------------------------------------------------------------

LAUNCH = """#!/bin/bash
export VLLM_ROCM_USE_AITER=1
MODEL=${MODEL:-amd/MiniMax-M3-MXFP4}
vllm serve $MODEL \\
    --tensor-parallel-size 8 --trust-remote-code
"""


def test_lint_reads_the_launch_from_stdin(monkeypatch, tmp_path):
    """Minor 18: `lint -` said "cannot read -"; like ruff, `-` is stdin, and it lints what a FILE would."""
    code, out, err = run(["lint", "-", "--target", "MI355X", "--format", "json"], monkeypatch, stdin=LAUNCH)
    assert code in (0, 3) and "Traceback" not in err, err
    doc = json.loads(out)
    assert doc["model"] == "MiniMax-M3-MXFP4" and doc["parallel"]["tp"] == 8
    assert doc["env"]["VLLM_ROCM_USE_AITER"] == "1"
    script = tmp_path / "launch.sh"
    script.write_text(LAUNCH)
    from_file = json.loads(run(["lint", str(script), "--target", "MI355X", "--format", "json"], monkeypatch)[1])
    assert (doc["launch"].pop("from"), from_file["launch"].pop("from")) == ("stdin", str(script))
    assert from_file == doc  # the same launch, read from a file or from stdin (only where it came from differs)


@pytest.mark.parametrize("stdin, needle", [("", "stdin is empty"), ("echo hello\n", "line in stdin")])
def test_lint_stdin_without_a_launch(monkeypatch, stdin, needle):
    assert needle in one_line_error(*run(["lint", "-"], monkeypatch, stdin=stdin))


def test_lint_file_and_engine_args_together_is_an_error(monkeypatch, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text(LAUNCH)
    line = one_line_error(*run(["lint", str(script), "--", "vllm", "serve", "x"], monkeypatch))
    assert "not both" in line and "launch.sh" in line


def test_lint_env_error_names_lints_flag(monkeypatch):
    """Minor 17: `lint --env FOO …` answered "--aiter-env 'FOO': expected KEY=VALUE"."""
    line = one_line_error(*run(["lint", "--env", "FOO", "--", "vllm", "serve", "amd/MiniMax-M3-MXFP4"], monkeypatch))
    assert line.startswith("moedispatch: --env 'FOO': expected KEY=VALUE")


def test_lint_engine_version_beyond_the_data_warns(monkeypatch):
    code, out, err = run(["lint", "--target", "MI355X", "--engine-version", "99.0", "--format", "json", "--", "vllm",
                          "serve", "amd/MiniMax-M3-MXFP4", "-tp", "8"], monkeypatch)
    findings = json.loads(out)["findings"]
    assert any(f["severity"] == "warning" and f["message"].startswith("--engine-version 99.0: vllm 99.0 is newer")
               for f in findings)


# -- verify -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["-1", str(2 ** 63), "9" * 30])
def test_verify_seed_out_of_range(monkeypatch, seed):
    """Minor 27: `verify --seed -1` was accepted; a 30-digit seed ended in torch's OverflowError traceback."""
    line = one_line_error(*run(["verify", "--model", "gpt-oss-20b", "--seed", seed], monkeypatch))
    assert "--seed" in line and "0 … 2**63-1" in line


def test_verify_more_experts_than_the_layer_has(monkeypatch):
    line = one_line_error(*run(["verify", "--model", "gpt-oss-20b", "--target", "MI355X", "--experts", "999"],
                               monkeypatch))
    assert line == "moedispatch: --experts 999 is more than the 32 experts of layer 0"


def test_a_tp_that_does_not_divide_the_heads_is_said(cli):
    """explain --tp 3 on a 32-head model (intermediate 768 does shard by 3): the MoE plan is made as asked, and the
    plan's warnings say no engine launches it — in the text, the JSON and compare alike (it was stderr only, absent
    from the JSON and from compare: newcomer review)."""
    needle = "--tp 3: Qwen3-30B-A3B has 32 attention heads, not divisible by 3"
    proc = cli("explain", "--model", "Qwen3-30B-A3B", "--tp", "3")
    assert proc.returncode in (0, 3) and needle in proc.stdout
    doc = json.loads(cli("explain", "--model", "Qwen3-30B-A3B", "--tp", "3", "--format", "json").stdout)
    assert any(needle in w for w in doc["warnings"])
    cmp = json.loads(cli("compare", "--model", "Qwen3-30B-A3B", "--tp", "3,4", "--format", "json").stdout)
    assert [any(needle in w for w in v["warnings"]) for v in cmp["variants"]] == [True, False]
    assert "attention heads" not in cli("explain", "--model", "GLM-5.1-MXFP4", "--tp", "8").stdout


@pytest.mark.parametrize("target", ["MI300A", "gfx90a"])
def test_a_target_without_datasheet_peaks_says_it_is_not_priced(cli, target):
    """No cost line and no total, silently (newcomer review): now one warning says why."""
    doc = json.loads(cli("explain", "--model", "Mixtral-8x7B", "--target", target, "--format", "json").stdout)
    assert any(w.startswith("no cost for ") and "no datasheet peaks" in w for w in doc["warnings"]), doc["warnings"]
    priced = json.loads(cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", "--format", "json").stdout)
    assert not any(w.startswith("no cost for ") for w in priced["warnings"])


def test_a_what_if_switch_that_changes_activations_carries_the_accuracy_caveat(cli):
    """MiniMax-M3-MXFP4 TP8 on MI355X: --what-if recommends GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 (its gain is the padding it
    drops); the recipe's line for the same switch warned it changes numerics, the what-if did not (newcomer review).
    One helper now (plan.whatif.numerics_change) says it for both."""
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--aiter-version",
              "0.1.20.post1", "--what-if", env={"COLUMNS": "1000"})
    line = next(x for x in out.stdout.splitlines() if "what-if set GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0" in x)
    assert "changes numerics: at tokens 1–64 AITER runs mxfp4 activations instead of bf16" in line
    assert "check accuracy (e.g. GSM8K) before serving" in line


def test_the_taken_path_is_costed_under_the_environment_the_recipe_exports(cli):
    """MiniMax-M3-MXFP4 TP8 on MI355X, vLLM: the recipe exports VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 (and the
    switch GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0); its [taken] line was costed without the fusion variable (31,504 µs at
    8192 tokens, heuristic kernels) while explain under both variables predicts the fused shape's tuned rows. The two
    now agree (newcomer review)."""
    common = ("--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--aiter-version", "0.1.20.post1")
    recipe = cli("explain", *common, "--recipe", "vllm", "--tokens", "8192", env={"COLUMNS": "1000"}).stdout
    assert "export VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1" in recipe
    taken = next(x for x in recipe.splitlines() if x.startswith("#   [taken]"))
    doc = json.loads(cli("explain", *common, "--tokens", "8192", "--format", "json", "--aiter-env",
                         "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1", "--aiter-env",
                         "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0").stdout)
    us = doc["cost_total"][0]["us"]
    assert f"MoE total {us:,.0f} µs" in taken, (taken, us)


def test_a_forced_backend_that_cannot_run_offers_dropping_it_first(cli):
    """--backend aiter-asm on MiniMax-M3-MXFP4 (its activation is not ASM's): the nearest alternative offered was
    another layout (--tp 8 --ep 8) with the selector's choice; the nearest change is to drop --backend."""
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--aiter-version",
              "0.1.20.post1", "--backend", "aiter-asm", "--recipe", "vllm", "--format", "json")
    alt = json.loads(out.stdout)["alternatives"]
    assert alt[0]["change"] == "drop --backend" and alt[0]["backend"] == "aiter-flydsl"
    assert alt[0]["env"].get("GPTOSS_SWIGLU_MXFP4_BF16_BOUND") == "0"   # the switch vLLM's allocation needs
