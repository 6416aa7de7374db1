"""Issue 16: output people can live with — grouping across non-adjacent layers, --brief, JSON groups, provenance
of the target and AITER, did-you-mean, ``python -m moedispatch``, help on every flag, --version."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moedispatch.cli import _build_parser


def test_maverick_groups_its_alternating_layers_into_two_groups(cli):
    """Llama-4-Maverick's 24 MoE layers alternate with dense ones: one group each, not 48 groups."""
    proc = cli("explain", "--model", "Llama-4-Maverick-17B-128E-Instruct-FP8", "--target", "MI355X", "--brief")
    assert proc.returncode == 0, proc.stderr
    groups = [ln for ln in proc.stdout.splitlines() if ln.startswith(("layer ", "layers "))]
    assert groups == ["layers 0,2,…,46 (24 dense) → dense MLP", "layers 1,3,…,47 (24 MoE) → aiter-ck: no padding"]


def test_json_groups_list_every_layer_once(cli):
    proc = cli("explain", "--model", "Llama-4-Maverick-17B-128E-Instruct-FP8", "--target", "MI355X", "--format",
               "json")
    data = json.loads(proc.stdout)
    groups = data["groups"]
    assert sorted(i for g in groups for i in g["layers"]) == list(range(48))
    moe = next(g for g in groups if g["kind"] == "moe")
    assert moe["layers"] == list(range(1, 48, 2)) and moe["backend"] == "aiter-ck"
    assert moe["padding"] == data["layers"][1]["padding"]


def test_brief_is_much_shorter_than_the_full_table(cli):
    full = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8").stdout
    brief = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--brief").stdout
    assert "layers 3–59 (57 MoE) → aiter-flydsl: pad intermediate/rank 384→512 (compute)" in brief
    assert len(brief.splitlines()) * 3 < len(full.splitlines())


@pytest.mark.parametrize("args, expected", [
    (["--model", "MiniMax-M3-MXFP5"], "did you mean 'MiniMax-M3-MXFP8'?"),
    (["--model", "Mixtral-8x7B", "--target", "MI355"], "did you mean 'MI355X'?"),
    (["--model", "Mixtral-8x7B", "--target", "gfx95"], "did you mean 'gfx950'?"),
    (["--model", "Mixtral-8x7B", "--target", "gfx950", "--backend", "trito"], "did you mean 'triton'?"),
])
def test_did_you_mean_on_a_typo_with_exit_2_and_one_line(cli, args, expected):
    proc = cli("explain", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_target_line_says_where_target_and_aiter_come_from(cli):
    """One notation (words in parentheses after what they qualify), not a bracketed [flag] beside "(default: …)"
    (newcomer minor 7)."""
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI300X", "--brief")
    assert ("target  gfx942 (MI300X), 304 CUs (from --target), AITER 0.1.20.post1 (default: the newest "
            "capability_db knows)\n") in proc.stdout
    assert "[flag]" not in proc.stdout
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI300X", "--aiter-version", "0.1.15.post3",
               "--brief")
    assert "AITER 0.1.15.post3 (--aiter-version)\n" in proc.stdout
    env = {"MOEDISPATCH_TARGET": "MI300X"}
    proc = cli("explain", "--model", "Mixtral-8x7B", "--format", "json", env=env)
    assert json.loads(proc.stdout)["target"]["source"] == "env"
    out = cli("explain", "--model", "Mixtral-8x7B", "--brief", env=env).stdout
    assert "gfx942 (MI300X), 304 CUs (from MOEDISPATCH_TARGET), " in out and "[env]" not in out
    assert "gfx950 (MI355X), 256 CUs (default: no GPU found), " in cli("explain", "--model", "Mixtral-8x7B",
                                                                      "--brief").stdout


def test_python_dash_m_runs_the_same_cli():
    proc = subprocess.run([sys.executable, "-m", "moedispatch", "explain", "--model", "Mixtral-8x7B", "--target",
                           "gfx942", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema"] == "moedispatch.explain/1"


def test_every_flag_of_every_command_has_help_text():
    parser = _build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, sub in [("moedispatch", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if action.option_strings and action.help is None:
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, missing


def test_version_names_the_capability_db_snapshot_and_releases(cli):
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("moedispatch ")
    assert "AITER" in proc.stdout and "vllm through" in proc.stdout and "sglang through" in proc.stdout
    assert "ROCm/aiter@" in proc.stdout  # the tuned-CSV snapshot's commit


def test_library_plan_and_cli_json_carry_the_same_default_target_warning(cli, monkeypatch):
    """Issue 14 item 4: with no GPU and no target, plan_model().to_dict() has the warning the CLI's JSON has."""
    import moedispatch.api as engine
    from moedispatch.data.capdb import target_capabilities

    cli_warnings = json.loads(cli("explain", "--model", "Mixtral-8x7B", "--format", "json").stdout)["warnings"]
    monkeypatch.setattr(engine, "_caps", target_capabilities(None, None, target_source="default"))
    lib_warnings = engine.plan_model("Mixtral-8x7B").to_dict()["warnings"]
    default = [w for w in cli_warnings if "default target" in w]
    assert default and default[0] in lib_warnings
    details = json.loads(cli("explain", "--model", "Mixtral-8x7B", "--format", "json").stdout)["warning_details"]
    assert [d["issue"] for d in details if d["text"] == default[0]] == ["default-target"]


@pytest.mark.parametrize("args", [["--engine-version", "0.33.0"], ["--engine-env", "VLLM_ROCM_USE_AITER=1"]])
def test_flags_that_would_be_ignored_say_so(cli, args):
    """No silent no-ops: --engine-version needs --recipe, --engine-env needs --engine; still accepted (they were
    before), with one warning line on stderr."""
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X", *args)
    assert proc.returncode == 0 and "goes with" in proc.stderr and "ignored" in proc.stderr
