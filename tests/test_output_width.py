"""Text output fits the terminal (issue 27, newcomer major 10 / report M11).

The report, in an 80-column tmux: explain wrapped at a fixed 120 columns (then the terminal wrapped it again, in
mid-word; ``COLUMNS=80`` changed nothing), recipe lines reached 458 characters, lint 339, verify 327, aiter-configs
536. Now: on a TTY every report fits :func:`moedispatch._util.width.terminal_width` — ``shutil.get_terminal_size``
(``COLUMNS`` first), clamped to 80–200 — except a line holding one unbreakable token (a path, a URL); piped, nothing
is wrapped; JSON is never wrapped.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess

import pytest

from conftest import tree_python
from test_newcomer_input import run
from moedispatch._util.width import fit, terminal_width, wrap

AITER = ("--aiter-version", "0.1.20.post1")


class _Terminal(io.StringIO):
    """A stdout that says it is a terminal (the width then comes from COLUMNS, as shutil reads it)."""

    def isatty(self) -> bool:
        return True


def _run(argv, monkeypatch, *, columns: int | None, tty: bool = True, stdin: str | None = None) -> str:
    """``moedispatch ARGV`` in-process with stdout a terminal of ``columns`` (or a pipe); returns stdout."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run(argv, monkeypatch, stdin=stdin, stdout=_Terminal() if tty else None)
    assert code in (0, 3), err
    return out


def assert_fits(text: str, width: int) -> None:
    """Every line within ``width``, except a line that is a short prefix (an indent, ``#``, ``[3]``, ``source:``)
    plus one token too long to fit anywhere."""
    for line in text.splitlines():
        if len(line) <= width:
            continue
        words = line.split()
        longest = max(words, key=len)
        assert len(words) <= 3 and len(longest) > width // 2, f"{len(line)} > {width}: {line!r}"


# -- the width itself ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("columns, expected", [(100, 100), (80, 80), (40, 80), (1, 80), (200, 200), (500, 200)])
def test_terminal_width_is_the_terminals_clamped_to_80_200(monkeypatch, columns, expected):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert terminal_width(_Terminal()) == expected


def test_no_width_when_piped(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert terminal_width(io.StringIO()) is None

    class Closed:
        def isatty(self):
            raise ValueError("I/O operation on closed file")

    assert terminal_width(Closed()) is None


def test_wrap_and_fit_break_at_spaces_only():
    url = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py"
    lines = wrap(f"rules HEAD e4048607 ({url}) and more words here", "aiter   ", 80)
    assert lines[0].startswith("aiter   rules") and any(line.strip() == f"({url})" for line in lines)
    assert all(len(line) <= 80 for line in lines if url not in line)
    assert wrap("--tensor-parallel-size " * 8, "", 80)[0].endswith("--tensor-parallel-size")  # never at a hyphen
    assert wrap("anything", "x ", None) == ["x anything"] and fit("a " * 200, None) == "a " * 200
    comment = fit("# " + "word " * 40 + "(source)", 80)
    assert all(line.startswith("#   ") for line in comment.splitlines()[1:]) and len(comment.splitlines()) > 1
    shell = fit("vllm serve X " + " ".join(f"--flag-{i} 'a b'" for i in range(12)), 80, shell=True).splitlines()
    assert all(line.endswith(" \\") for line in shell[:-1]) and all(len(line) <= 80 for line in shell)
    assert all(line.count("'") % 2 == 0 for line in shell)  # never inside quotes


# -- the report's commands on an 80-column terminal --------------------------------------------------------------

def test_explain_in_a_real_80_column_terminal():
    """The report's command in a pseudo-terminal with COLUMNS=80 (as tmux at 80x50 sets it): 68 of 101 lines were
    over 80 and the longest 130; now none is, but for a source URL or path on its own line."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    env.update(COLUMNS="80", MOEDISPATCH_AITER_VERSION="default")
    code = ("sys.argv[0] = 'moedispatch'\nfrom moedispatch.cli import main\nsys.exit(main())\n")
    proc = subprocess.Popen(tree_python(code) + ["explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp",
                                                 "8"], stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    # A terminal shows colour escape codes as no width (labels are coloured after fitting): measure what it shows.
    text = re.sub("\x1b\\[[0-9;]*m", "", text)
    assert text.startswith("model   Qwen3-30B-A3B") and "layers 0–47 (48 MoE) → " in text
    assert_fits(text, 80)
    assert max(len(line) for line in text.splitlines() if "/" not in line) <= 80
    assert any(line.startswith("              ") for line in text.splitlines())  # hanging indent under "why"


CASES = {
    "explain": ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp", "8", *AITER),
    "brief": ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp", "8", "--brief", *AITER),
    "recipe": ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp", "8", "--recipe", "vllm", *AITER),
    "engine": ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", "--tp", "8", "--engine", "vllm", *AITER),
    "what-if": ("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--what-if", *AITER),
    "lint": ("lint", "--target", "MI355X", "--model", "MiniMax-M3-MXFP4", *AITER, "--", "vllm", "serve",
             "amd/MiniMax-M3-MXFP4", "-tp", "8"),
    "aiter-configs": ("aiter-configs", "--aiter-version", "0.1.20.post1"),
    "compare": ("compare", "--model", "Qwen3-30B-A3B", "--target", "MI300X,MI355X", "--tp", "8"),
    "backends": ("backends",),
    "models": ("models",),
    "probe": ("probe",),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("columns", [80, 132])
def test_every_text_report_fits_the_terminal(monkeypatch, name, columns):
    text = _run(CASES[name], monkeypatch, columns=columns)
    assert text.strip()
    assert_fits(text, columns)


@pytest.mark.parametrize("name", ["explain", "recipe", "lint", "aiter-configs", "compare"])
def test_piped_output_is_never_wrapped(monkeypatch, name):
    """Off a terminal the reports are one logical line per line (for grep and scripts), whatever COLUMNS says."""
    piped = _run(CASES[name], monkeypatch, columns=80, tty=False)
    wide = _run(CASES[name], monkeypatch, columns=200)
    assert max(len(line) for line in piped.splitlines()) > 200  # the report has long lines, and they stay whole
    assert len(piped.splitlines()) < len(wide.splitlines())
    # the same words in the same order: wrapping only moves line breaks (and a wrapped lint fix line adds its
    # shell continuations)
    assert piped.split() == [w for w in wide.split() if not (name == "lint" and w == "\\")] or name == "recipe"


def test_recipe_comments_wrap_as_comments(monkeypatch):
    """Recipe comment lines ("# … (source)") were 400+ characters; they continue as "#   …" comment lines and the
    command stays a command (backslash continuations)."""
    text = _run(CASES["recipe"], monkeypatch, columns=80)
    lines = text.splitlines()
    assert any(line.startswith("#   ") for line in lines)
    for i, line in enumerate(lines):
        if line.startswith("#   "):
            assert lines[i - 1].startswith("#")  # a continuation follows a comment line
    assert "vllm serve Qwen/Qwen3-30B-A3B \\" in lines
    # what a shell runs is unchanged: the same exports and command as the unwrapped recipe
    piped = _run(CASES["recipe"], monkeypatch, columns=80, tty=False)
    runnable = [line for line in lines if not line.startswith("#")]
    assert runnable == [line for line in piped.splitlines() if not line.startswith("#")]


def test_json_is_never_wrapped(monkeypatch):
    for argv in (CASES["explain"], CASES["recipe"], CASES["lint"]):
        on_tty = _run((*argv[:argv.index("--")], "--format", "json", *argv[argv.index("--"):]) if "--" in argv
                      else (*argv, "--format", "json"), monkeypatch, columns=80)
        piped = _run((*argv[:argv.index("--")], "--format", "json", *argv[argv.index("--"):]) if "--" in argv
                     else (*argv, "--format", "json"), monkeypatch, columns=80, tty=False)
        assert on_tty == piped and json.loads(on_tty)["schema"].startswith("moedispatch.")


def test_verify_fits_the_terminal(monkeypatch, tmp_path):
    """verify's check lines (327 characters in the report) wrap under their PASS/SKIP column; a tiny Mixtral-shaped
    checkpoint keeps the emulation fast."""
    pytest.importorskip("torch")
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 1, "num_local_experts": 4, "num_experts_per_tok": 2,
           "hidden_act": "silu", "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text = _run(("verify", "--model", str(tmp_path), "--target", "MI300X", *AITER), monkeypatch, columns=80)
    assert text.startswith("verify ") and any(line.startswith(("  PASS ", "  SKIP ")) for line in text.splitlines())
    assert_fits(text, 80)
    assert any(line.startswith("         ") for line in text.splitlines())  # continuation under the check text
