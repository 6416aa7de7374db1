"""Colour on a terminal, NO_COLOR honoured (issue 27; newcomer nice-to-have 5, "NO_COLOR-aware colour for
errors/emulation/warnings on a TTY").

Before: the report on stdout had no colour at all, and the -v log lines on a terminal's stderr were coloured by
structlog whatever NO_COLOR said. Now: on a terminal device the label of a line that must not be missed is coloured
(red: no backend, emulation, an error finding, a crash warning; yellow: warnings), after the report is fitted to the
width; NO_COLOR (any non-empty value), TERM=dumb, a pipe, a file and --format json get none, logs included.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess

from conftest import run_cli, tree_python
from moedispatch._util.colour import RED, RESET, YELLOW, colour_enabled, colourize

ESC = "\x1b["
EMULATION = ("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X", "--tp", "8", "--aiter-version",
             "0.1.20.post1")


def on_terminal(*args: str, env: dict | None = None, stderr_tty: bool = False) -> tuple[str, str]:
    """``moedispatch ARGS`` with stdout (and, if asked, stderr) on a pseudo-terminal: (stdout, stderr)."""
    master, slave = pty.openpty()
    full = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_") and k not in ("NO_COLOR", "TERM")}
    full.update({"MOEDISPATCH_AITER_VERSION": "default", "COLUMNS": "100", **(env or {})})
    proc = subprocess.Popen(tree_python("sys.argv[0] = 'moedispatch'\nfrom moedispatch.cli import main\n"
                                        "sys.exit(main())") + list(args),
                            stdout=slave, stderr=slave if stderr_tty else subprocess.PIPE, env=full)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.wait(timeout=120)
    os.close(master)
    return out.decode().replace("\r\n", "\n"), err


def test_emulation_and_warnings_are_coloured_on_a_terminal():
    out, _ = on_terminal(*EMULATION, "--brief")
    assert f"→ {RED}emulation{RESET}" in out
    assert f"{YELLOW}warning{RESET} " in out
    assert f"{RED}warning{RESET} 57 MoE layer(s) (3–59) run on emulation" in out  # not for serving: styled as an error


def test_no_color_turns_it_off():
    for env in ({"NO_COLOR": "1"}, {"NO_COLOR": "yes"}, {"TERM": "dumb"}):
        out, _ = on_terminal(*EMULATION, "--brief", env=env)
        assert "emulation" in out and ESC not in out, env


def test_pipes_and_json_get_no_escape_codes():
    proc = run_cli(*EMULATION, "--brief")
    assert proc.returncode == 0 and "emulation" in proc.stdout and ESC not in proc.stdout
    out, _ = on_terminal(*EMULATION, "--format", "json")
    assert ESC not in out and json.loads(out)["schema"] == "moedispatch.explain/1"


def test_log_lines_on_a_terminal_honour_no_color():
    """-v logs render with structlog's console renderer on a terminal; it was coloured even under NO_COLOR."""
    coloured, _ = on_terminal(*EMULATION, "--brief", "-v", "--log-format", "console", stderr_tty=True)
    assert "backend_selected" in coloured and ESC + "0m" in coloured.split("layers 3–59")[0]
    plain, _ = on_terminal(*EMULATION, "--brief", "-v", "--log-format", "console", stderr_tty=True,
                           env={"NO_COLOR": "1"})
    assert "backend_selected" in plain and ESC not in plain


def test_colourize_labels_only():
    text = "\n".join(["layers 0–47 (48 MoE) → NO BACKEND", "  ERROR   weights do not fit", "  WARNING x",
                      "# WARNING: y", "# NO SAFE LAUNCH: vllm", "  FAIL  padded_vs_unpadded: z",
                      "    warning emulation is slow", "    warning padding costs 3%", "why     warning words later do not count"])
    lines = colourize(text).split("\n")
    assert lines[0].endswith(f"→ {RED}NO BACKEND{RESET}")
    assert lines[1].startswith(f"  {RED}ERROR{RESET}   ") and lines[2].startswith(f"  {YELLOW}WARNING{RESET}")
    assert lines[3].startswith(f"# {YELLOW}WARNING{RESET}:") and lines[4].startswith(f"# {RED}NO SAFE LAUNCH{RESET}")
    assert lines[5].startswith(f"  {RED}FAIL{RESET}") and lines[6].startswith(f"    {RED}warning{RESET} emulation")
    assert lines[7].startswith(f"    {YELLOW}warning{RESET} padding")
    assert lines[8] == "why     warning words later do not count"


def test_colour_enabled_needs_a_terminal_device():
    assert not colour_enabled(io.StringIO(), {})
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as tty:
        assert colour_enabled(tty, {}) and not colour_enabled(tty, {"NO_COLOR": "1"})
        assert colour_enabled(tty, {"NO_COLOR": ""})  # no-color.org: set and non-empty
    os.close(master)


def test_a_caveat_is_labelled_once():
    """Newcomer minor 6: `caveat  caveat [aiter#4783] …` (DeepSeek-V3 on MI300X at TP8)."""
    proc = run_cli("explain", "--model", "DeepSeek-V3", "--target", "MI300X", "--tp", "8", "--aiter-version",
                   "0.1.20.post1")
    assert proc.returncode == 0 and "    caveat  [aiter#4783] " in proc.stdout
    assert "caveat  caveat" not in proc.stdout
