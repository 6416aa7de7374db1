"""Issue 2 acceptance: `moedispatch explain --model MiniMax-M3-MXFP4` end to end, as a user runs it.

Source of every expectation: reference seeds/000 (vLLM PR #46419: AITER MXFP4 MoE and EMULATION are the only
correct backends for amd/MiniMax-M3-MXFP4; TRITON_UNFUSED skips activation QDQ; AITER v0.1.13.post1 lacks the import
path), vllm.md §4 (W4A4 on gfx942 -> EMULATION), §12.6 (TP8 384 -> 512), §15.1 (60 layers, 3 dense).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

BASE = ["explain", "--model", "MiniMax-M3-MXFP4", "--tp", "8", "--format", "json"]


def _json(proc):
    assert proc.stdout.lstrip().startswith("{"), proc.stdout[:200] + proc.stderr
    return json.loads(proc.stdout)


def test_gfx950_aiter_015post3_picks_aiter_for_every_moe_layer(cli, explain_schema):
    """60 layers; 0-2 dense; 3-59 MoE W4A4 mxfp4 at 384/rank; an aiter-* backend each; triton rejected for act QDQ."""
    proc = cli(*BASE, "--target", "gfx950", "--aiter-version", "0.1.15.post3")
    assert proc.returncode == 0, proc.stderr
    data = _json(proc)
    jsonschema.validate(data, explain_schema)
    layers = data["layers"]
    assert len(layers) == 60
    assert [la["kind"] for la in layers[:3]] == ["dense"] * 3
    assert all(la["backend"] is None for la in layers[:3])
    moe = layers[3:]
    assert all(la["kind"] == "moe" for la in moe)
    for la in moe:
        assert {k: la["quant"][k] for k in ("weight", "activation", "granularity")} == {
            "weight": "mxfp4", "activation": "mxfp4", "granularity": "group32"}
        assert la["shape"]["intermediate_per_rank"] == 384
        assert la["backend"].startswith("aiter-")
        triton = next(r for r in la["rejected"] if r["backend"] == "triton")
        assert any("activation" in r and "quantiz" in r for r in triton["reasons"]), triton
    assert data["target"] == {"gfx": "gfx950", "product": "MI355X", "compute_units": 256,
                              "aiter_version": "0.1.15.post3", "source": "flag"}


def test_gfx950_tp8_padding_is_zero_filled_and_m3_passes_intermediate_pad_zero(cli):
    """384 -> 512 (256-aligned MXFP4), zero-filled; the kernel gets intermediate_pad=0 (vLLM PR #46419)."""
    data = _json(cli(*BASE, "--target", "gfx950", "--aiter-version", "0.1.15.post3"))
    pad = data["layers"][3]["padding"]
    assert pad["intermediate_per_rank"] == 512 and pad["intermediate_pad"] == 128
    assert pad["kernel_intermediate_pad"] == 0
    assert pad["zero_fill"] is True
    assert pad["hidden"] == 6144 and pad["hidden_pad"] == 0


def test_gfx942_selects_emulation_and_every_aiter_rejection_names_the_arch(cli):
    """MI300X has no MX matrix ops: emulation for all 57 MoE layers; aiter-* reasons mention gfx942 / gfx950."""
    proc = cli(*BASE, "--target", "gfx942", "--aiter-version", "0.1.15.post3")
    assert proc.returncode == 0, proc.stderr
    data = _json(proc)
    moe = [la for la in data["layers"] if la["kind"] == "moe"]
    assert len(moe) == 57 and {la["backend"] for la in moe} == {"emulation"}
    for la in moe:
        for rej in la["rejected"]:
            if rej["backend"].startswith("aiter-"):
                assert any("gfx942" in r and "gfx950" in r for r in rej["reasons"]), rej
    assert any("emulation" in w and "slow" in w for w in data["warnings"])


def test_aiter_013post1_on_gfx950_rejects_every_aiter_backend_with_the_version(cli):
    """AITER v0.1.13.post1 lacks GateMode / gate_mode (vLLM PR #46419; ROCm/aiter#3123)."""
    data = _json(cli(*BASE, "--target", "gfx950", "--aiter-version", "0.1.13.post1"))
    for la in data["layers"][3:]:
        assert not (la["backend"] or "").startswith("aiter-")
        for rej in la["rejected"]:
            if rej["backend"].startswith("aiter-"):
                assert any("0.1.13.post1" in r for r in rej["reasons"]), rej


def test_forced_triton_exits_3_with_reasons_and_prints_the_whole_plan(cli, explain_schema):
    proc = cli(*BASE, "--target", "gfx950", "--aiter-version", "0.1.15.post3", "--backend", "triton")
    assert proc.returncode == 3
    data = _json(proc)
    jsonschema.validate(data, explain_schema)
    assert len(data["layers"]) == 60
    assert all(la["backend"] is None for la in data["layers"])
    assert "triton" in proc.stderr and "activation" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["explain", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--tp", "zero"], "--tp"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--tp", "0"], "--tp"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--tp", "5"], "not divisible"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx999"], "unknown GPU arch"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--aiter-version", "banana"], "PEP 440"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--backend", "acme"], "unknown backend 'acme'"),
    (["explain", "--model", "MiniMax-M3-MXFP4", "--format", "yaml"], "--format"),
    (["explain"], "--model"),
    ([], "command is required"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_input_exits_2_with_one_line_and_no_traceback(cli, args, needle):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_json_format_prints_only_json_on_stdout_even_with_verbose_logs(cli):
    proc = cli("-vv", "--log-format", "json", *BASE, "--target", "gfx950")
    assert proc.returncode == 0
    json.loads(proc.stdout)  # nothing but JSON on stdout
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    names = {e["event"] for e in events}
    assert {"backend_selected", "backend_rejected", "dispatch_planned"} <= names


def test_no_target_no_gpu_uses_default_and_says_so_on_the_first_line(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("No AMD GPU found; using the default target gfx950 (MI355X)")


def test_table_groups_consecutive_layers_and_shows_rejections(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--tp", "8", "--target", "MI355X",
               "--aiter-version", "0.1.15.post3")
    out = proc.stdout
    assert "layers 0–2 (3 dense)" in out
    assert "layers 3–59 (57 MoE) → aiter-flydsl" in out
    assert "triton:" in out and "emulation: supported, slower: aiter-flydsl" in out


def test_explain_does_not_import_torch_aiter_or_amdsmi():
    """explain with flags giving the target is pure Python (issue 8)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from moedispatch.cli import main\n"
        "rc = main(['explain','--model','MiniMax-M3-MXFP4','--target','gfx950','--format','json'])\n"
        "bad = [m for m in ('torch','aiter','amdsmi') if m in sys.modules]\n"
        "assert rc == 0 and not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_backends_and_models_commands(cli):
    proc = cli("backends", "--format", "json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert [b["name"] for b in data["backends"]] == ["aiter-ck", "aiter-flydsl", "aiter-cktile", "aiter-asm",
                                                      "aiter-triton", "triton", "emulation"]
    assert all(p["builtin"] and not p["errors"] for p in data["plugins"])
    proc = cli("models", "--format", "json")
    names = {m["name"] for m in json.loads(proc.stdout)["models"]}
    assert {"MiniMax-M3-MXFP4", "gpt-oss-120b", "DeepSeek-V3", "Mixtral-8x7B"} <= names


def test_forced_failure_still_groups_consecutive_layers(cli):
    """The no-backend reason names no layer index, so layers 3–59 render as one group."""
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--tp", "8", "--backend", "triton")
    assert proc.returncode == 3
    assert "layers 3–59 (57 MoE) → NO BACKEND" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("moedispatch: 57 MoE layer(s) have no correct backend; "
                                                           "layer 3: forced backend 'triton' cannot run this layer")


def test_logging_options_work_after_the_subcommand(cli):
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--log-format", "json", "-q")
    assert proc.returncode == 0 and proc.stderr == ""
