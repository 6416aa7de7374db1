"""``moedispatch exec`` (issue 24 item 5): check a launch, then become it — with a fake engine on PATH.

Motivating case (vllm-project/vllm#56945): ``vllm serve … --moe-backend aiter`` without ``VLLM_ROCM_USE_AITER=1`` fails
at start-up in vLLM 0.31; lint calls it an error and its fix exports the switch. ``exec`` keeps the PID, the argv and
the environment; refuse exits 3 without launching; fix launches the corrected command.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from moedispatch.core.errors import UsageError
from moedispatch.guard import launch as guard

LINE = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "4", "--moe-backend", "aiter"]
CHECK = ["--target", "MI355X", "--engine-version", "0.31.0"]


@pytest.fixture
def fake_vllm(tmp_path):
    """A `vllm` on PATH that prints what it was started with (argv, pid, the AITER switch) as JSON and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "vllm"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        print(json.dumps({{"argv": sys.argv[1:], "pid": os.getpid(),
                          "aiter": os.environ.get("VLLM_ROCM_USE_AITER"), "keep": os.environ.get("KEEP_ME"),
                          "guard": os.environ.get("MOEDISPATCH_GUARD"),
                          "target": os.environ.get("MOEDISPATCH_TARGET")}}))
        """))
    exe.chmod(0o755)
    return bin_dir


def _exec(fake_vllm, *args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "AITER_", "MOEDISPATCH_GUARD"))}
    # capability_db's newest AITER, not the PyPI amd-aiter 0.1.7 of the test venv (exec plans for the installed one
    # by default, as explain and lint do)
    env.update(PATH=f"{fake_vllm}{os.pathsep}{env['PATH']}", KEEP_ME="yes", MOEDISPATCH_AITER_VERSION="default",
               **(env_extra or {}))
    proc = subprocess.Popen([sys.executable, "-m", "moedispatch.cli", "exec", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    return proc, out, err


def test_refuse_stops_a_known_wrong_launch_before_it_exists(fake_vllm):
    proc, out, err = _exec(fake_vllm, "--guard", "refuse", *CHECK, "--", *LINE)
    assert proc.returncode == 3 and out == ""                     # the engine never started
    assert "ERROR" in err and "without VLLM_ROCM_USE_AITER=1" in err and "not launched (refuse mode)" in err


def test_fix_launches_the_corrected_command_in_this_process(fake_vllm):
    proc, out, err = _exec(fake_vllm, *CHECK, "--", *LINE, env_extra={"MOEDISPATCH_GUARD": "fix"})
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["pid"] == proc.pid                                 # execvpe: the engine is this process
    assert got["aiter"] == "1" and got["keep"] == "yes"           # the fix's switch, the rest of the env kept
    assert got["argv"][:2] == ["serve", "amd/MiniMax-M3-MXFP4"] and "--moe-backend" in got["argv"]
    assert "launching the corrected command instead" in err and "VLLM_ROCM_USE_AITER=1" in err


def test_warn_launches_as_given_and_says_what_is_wrong(fake_vllm):
    proc, out, err = _exec(fake_vllm, *CHECK, "--", *LINE)
    got = json.loads(out)
    assert proc.returncode == 0 and got["pid"] == proc.pid and got["argv"] == LINE[1:] and got["aiter"] is None
    assert "ERROR" in err and "launching as given anyway (warn mode" in err


def test_a_verified_launch_goes_through_unchanged(fake_vllm):
    proc, out, err = _exec(fake_vllm, "--guard", "refuse", *CHECK, "--", *LINE,
                           env_extra={"VLLM_ROCM_USE_AITER": "1"})
    got = json.loads(out)
    assert proc.returncode == 0 and got["argv"] == LINE[1:] and got["aiter"] == "1"
    assert "0 error(s)" in err and "launching as given" in err


def test_off_launches_without_checking(fake_vllm):
    proc, out, err = _exec(fake_vllm, *CHECK, "--", *LINE, env_extra={"MOEDISPATCH_GUARD": "off"})
    assert proc.returncode == 0 and json.loads(out)["argv"] == LINE[1:] and "guard off" in err


def test_exec_hands_its_mode_and_target_to_the_guard_inside_the_engine(fake_vllm):
    """The guard installed in the engine's environment reads MOEDISPATCH_GUARD / MOEDISPATCH_TARGET: without them it
    checked `exec --guard off` launches anyway (in warn mode), and `--guard refuse --target` ones for another GPU."""
    proc, out, err = _exec(fake_vllm, "--guard", "off", *CHECK, "--", *LINE)
    assert proc.returncode == 0 and json.loads(out)["guard"] == "off"
    proc, out, err = _exec(fake_vllm, "--guard", "refuse", *CHECK, "--", *LINE, env_extra={"VLLM_ROCM_USE_AITER": "1"})
    got = json.loads(out)
    assert proc.returncode == 0 and (got["guard"], got["target"]) == ("refuse", "MI355X"), err
    proc, out, err = _exec(fake_vllm, "--", *LINE, env_extra={"MOEDISPATCH_GUARD": "off"})  # as given: unchanged
    assert json.loads(out)["guard"] == "off" and json.loads(out)["target"] is None


@pytest.mark.parametrize("args, env, message", [
    (["--guard", "maybe", "--", *LINE], {}, "--guard='maybe': expected one of warn, refuse, fix, off"),
    (["--", *LINE], {"MOEDISPATCH_GUARD": "loud"}, "MOEDISPATCH_GUARD='loud'"),
    ([], {}, "exec needs the launch after `--`"),
    (["--", "ls", "-l"], {}, "not a vLLM or SGLang launch"),
])
def test_bad_input_is_one_line_exit_2_and_launches_nothing(fake_vllm, args, env, message):
    proc, out, err = _exec(fake_vllm, *args, env_extra=env)
    assert proc.returncode == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_a_missing_engine_binary_is_one_line(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), MOEDISPATCH_GUARD="off")
    proc = subprocess.run([sys.executable, "-m", "moedispatch.cli", "exec", "--", *LINE], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot launch 'vllm'" in proc.stderr and "Traceback" not in proc.stderr


# -- the decision, without processes ------------------------------------------------------------------------------

def _doc(*findings):
    return {"engine": "vllm", "engine_version": "0.33.0", "model": "m",
            "findings": [{"severity": s, "message": m, "source": None, "fix": f} for s, m, f in findings]}


def _lint_once(fix):
    """A stand-in lint: the launch as given has an error whose fix is ``fix``; any other launch is clean."""
    def lint(argv, env, **_kw):
        given = tuple(argv) == ("vllm", "serve", "m") and dict(env) == {"A": "1"}
        return _doc(("error", "bad", fix)) if given else _doc()
    return lint


@pytest.mark.parametrize("fix, action", [
    ("VLLM_ROCM_USE_AITER=1 vllm serve m --moe-backend aiter", "launch-fixed"),
    ("export VLLM_ROCM_USE_AITER=1; the full recipe: vllm serve m --moe-backend aiter", "launch-fixed"),
    ("write VLLM_ROCM_USE_AITER=1 for VLLM_ROCM_USE_AITER=0 before the command; the full recipe: "
     "VLLM_ROCM_USE_AITER=1 vllm serve m --moe-backend aiter", "launch-fixed"),
    ("export VLLM_ROCM_USE_AITER=1", "launch-env"),
    ("--tp 8 --ep 8: vllm serve m --tensor-parallel-size 8", "refuse"),   # another layout: not this launch fixed
    ("pick a TP that divides the model (e.g. 1, 2, 4, 8)", "refuse"),     # advice in words: never a command
    ("see `moedispatch explain`", "refuse"),
    ("add -e VLLM_ROCM_USE_AITER=1 to `docker run`", "refuse"),
    (None, "refuse"),
])
def test_fix_mode_uses_only_a_corrected_command(fix, action):
    out = guard.decide(["vllm", "serve", "m"], {"A": "1"}, "fix", _lint_once(fix))
    assert out.action == ("launch-fixed" if action == "launch-env" else action)
    if action == "launch-fixed":
        assert out.argv == ("vllm", "serve", "m", "--moe-backend", "aiter")
    if action == "launch-env":
        assert out.argv == ("vllm", "serve", "m")
    if action != "refuse":
        assert out.env == {"A": "1", "VLLM_ROCM_USE_AITER": "1"}


def test_warnings_alone_never_stop_a_launch():
    for mode in ("warn", "refuse", "fix"):
        out = guard.decide(["vllm", "serve", "m"], {}, mode, lambda *a, **k: _doc(("warning", "slow", None)))
        assert out.action == "launch" and out.argv == ("vllm", "serve", "m")


def test_mode_precedence():
    assert guard.mode_from(None, {}) == "warn"
    assert guard.mode_from(None, {"MOEDISPATCH_GUARD": "Refuse "}) == "refuse"
    assert guard.mode_from("fix", {"MOEDISPATCH_GUARD": "refuse"}) == "fix"
    with pytest.raises(UsageError):
        guard.mode_from("never", {})


def test_fix_mode_corrects_sglang_28244_with_lints_own_fix_line():
    """sgl-project/sglang#28244 (the reported launch, lint exits 3 on it: tests/test_lint.py): the fix is the user's
    command with lint's minimal change — every other flag and the model id kept."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "8",
            "--mem-fraction-static", "0.8", "--port", "30000"]
    out = guard.decide(argv, {"SGLANG_USE_AITER": "1"}, "fix", guard._lint, target="MI355X",
                       engine_version="0.5.20")
    assert out.action == "launch-fixed", out.report
    assert out.argv[:5] == tuple(argv[:5]) and "--mem-fraction-static" in out.argv and "30000" in out.argv
    assert out.argv != tuple(argv)


def test_fix_mode_never_launches_a_corrected_command_that_is_still_known_wrong():
    """A fix that is only part of the cure (the first error's `export VLLM_ROCM_USE_AITER=1` while a second error,
    ROCm/aiter#5233's, needs the full recipe) is linted again and not launched; the next error's fix, clean, is."""
    partial, full = "export VLLM_ROCM_USE_AITER=1", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 VLLM_ROCM_USE_AITER=1 vllm serve m"

    def lint(argv, env, **_kw):
        if env.get("GPTOSS_SWIGLU_MXFP4_BF16_BOUND") == "0":
            return _doc()
        return _doc(("error", "switch off", partial), ("error", "aiter#5233 wrong output", full))
    out = guard.decide(["vllm", "serve", "m"], {}, "fix", lint)
    assert out.action == "launch-fixed" and out.env == {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0",
                                                        "VLLM_ROCM_USE_AITER": "1"}
    assert any("still known-wrong — switch off" in line for line in out.report)
    out = guard.decide(["vllm", "serve", "m"], {}, "fix", lambda *a, **k: _doc(("error", "bad", partial)))
    assert out.action == "refuse" and "no corrected command for this launch lints clean" in out.report[-1]


def test_fix_mode_with_the_real_lint_starts_only_a_launch_lint_passes():
    """MiniMax-M3-MXFP4 TP8 on MI355X, vLLM 0.33, `--moe-backend aiter` without the switch: the first error's fix
    (export the switch) still runs 384/rank into ROCm/aiter#5233, so fix mode launches the full recipe — which lints
    clean — and says why it skipped the first."""
    argv = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8", "--moe-backend", "aiter"]
    out = guard.decide(argv, {}, "fix", guard._lint, target="MI355X", aiter_version="0.1.20.post1")
    assert out.action == "launch-fixed", out.report
    assert out.env.get("GPTOSS_SWIGLU_MXFP4_BF16_BOUND") == "0" and out.env.get("VLLM_ROCM_USE_AITER") == "1"
    again = guard._lint(out.argv, out.env, target="MI355X", aiter_version="0.1.20.post1")
    assert not [f for f in again["findings"] if f["severity"] == "error"]


def test_the_report_says_each_fix_and_how_to_change_the_mode_as_it_was_chosen():
    doc = lambda *a, **k: _doc(("error", "bad", "VLLM_ROCM_USE_AITER=1 vllm serve m"))  # noqa: E731
    out = guard.decide(["vllm", "serve", "m"], {}, "refuse", doc, "--guard")
    assert "    fix: VLLM_ROCM_USE_AITER=1 vllm serve m" in out.report
    assert out.report[-1].endswith("or launch it anyway with --guard warn")
    out = guard.decide(["vllm", "serve", "m"], {}, "refuse", doc)
    assert out.report[-1].endswith("or launch it anyway with MOEDISPATCH_GUARD=warn")
    out = guard.decide(["vllm", "serve", "m"], {}, "warn", doc, "--guard")
    assert "--guard refuse stops it, --guard fix corrects it" in out.report[-1]


def test_a_long_report_line_wraps_to_the_terminal_and_a_fix_line_between_shell_words():
    """docs/guard.md: on a terminal the lines wrap to its width; a fix line wraps only between shell words (with
    ` \\` continuations, so it still pastes as one command)."""
    line = "  ERROR: " + "word " * 40
    wrapped = guard._wrap(line, 60).split("\n")
    assert len(wrapped) > 1 and all(len(w) <= 60 for w in wrapped) and wrapped[1].startswith("      word")
    fix = "    fix: VLLM_ROCM_USE_AITER=1 vllm serve m --name 'a b c' " + "--x y " * 30
    lines = guard._wrap(fix, 60).split("\n")
    assert len(lines) > 1 and all(len(w) <= 60 for w in lines) and lines[0].startswith("    fix: VLLM_ROCM_USE_AITER=1")
    assert all(w.endswith(" \\") for w in lines[:-1]) and all(w.startswith(" " * 9) for w in lines[1:])
    assert shlex.split(" ".join(w.removesuffix(" \\").strip() for w in lines)) == shlex.split(fix)
    assert guard._wrap(fix, None) == fix and guard._wrap(line, None) == line


def test_an_engine_not_on_path_is_said_before_any_check(tmp_path, capsys):
    with pytest.raises(UsageError, match="cannot launch 'vllm': not found on PATH — activate the engine's environment"):
        guard.run(["--", *LINE], env={"PATH": str(tmp_path)})
    assert capsys.readouterr().err == ""


def test_exec_has_no_json_report(capsys):
    from moedispatch.cli import main

    assert main(["exec", "--format", "json", "--", *LINE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no JSON report" in err


def test_fix_mode_on_a_container_launch_starts_the_corrected_docker_run_not_the_advice():
    """Lint's fix for a docker launch starts with advice in words (``add -e VLLM_ROCM_USE_AITER=1 to `docker run```)
    — fix mode once ran `add` as the command; it now takes the corrected `docker run -e … vllm serve …` that follows
    (and lints it again first)."""
    argv = ["docker", "run", "--rm", "rocm/vllm:latest", "vllm", "serve", "amd/MiniMax-M3-MXFP4",
            "--tensor-parallel-size", "8", "--moe-backend", "aiter"]
    out = guard.decide(argv, {}, "fix", guard._lint, target="MI355X", aiter_version="0.1.20.post1")
    assert "    fix: add -e VLLM_ROCM_USE_AITER=1 to `docker run`" in out.report   # the first error's advice
    assert out.action == "launch-fixed", out.report
    assert out.argv[:4] == ("docker", "run", "-e", "VLLM_ROCM_USE_AITER=1") and "--rm" in out.argv
    assert out.argv[out.argv.index("vllm"):][:3] == ("vllm", "serve", "amd/MiniMax-M3-MXFP4")


def test_a_corrected_command_lint_cannot_read_is_not_launched():
    def lint(argv, env, **_kw):
        if tuple(argv) != ("vllm", "serve", "m"):
            raise UsageError("the launch's tensor-parallel size must be an integer, got 'x'")
        return _doc(("error", "bad", "vllm serve m --tensor-parallel-size x"))
    out = guard.decide(["vllm", "serve", "m"], {}, "fix", lint)
    assert out.action == "refuse" and any("still known-wrong — the launch's tensor-parallel size" in line
                                          for line in out.report)


def test_guard_off_names_how_it_was_chosen():
    """`exec --guard off` says `--guard off`, not MOEDISPATCH_GUARD=off (which the user did not set)."""
    never = lambda *a, **k: pytest.fail("off mode checks nothing")  # noqa: E731
    out = guard.decide(["vllm", "serve", "m"], {}, "off", never, "--guard")
    assert out.action == "launch" and out.report == ("moedispatch exec: guard off (--guard off): launching unchecked",)
    out = guard.decide(["vllm", "serve", "m"], {}, "off", never)
    assert out.report == ("moedispatch exec: guard off (MOEDISPATCH_GUARD=off): launching unchecked",)


def test_fix_mode_runs_the_launch_capped_below_a_token_bucket_bug():
    """ROCm/aiter#3471 (gfx950 1-stage blockscale ASM writes out of bounds at 8192 tokens; workaround: cap the
    batch): lint's fix was the recipe's line, which hits it too, so --guard fix refused the launch; the fix is now the
    launch itself with --max-num-batched-tokens at the issue's cap, which lints clean and runs."""
    argv = ["vllm", "serve", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "--tensor-parallel-size", "1"]
    out = guard.decide(argv, {"VLLM_ROCM_USE_AITER": "1"}, "fix", guard._lint, guard.GUARD_ENV, target=None,
                       aiter_version="0.1.17", model=None, engine_version=None)
    assert out.action == "launch-fixed", out.report
    assert list(out.argv) == argv + ["--max-num-batched-tokens", "4096"]
