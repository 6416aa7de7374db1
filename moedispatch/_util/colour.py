"""Colour for the text reports on a terminal (issue 27): red for what must not run as is (no backend, emulation, an
error finding, a failed check), yellow for warnings. Only the label of a line is coloured, after the report is
fitted to the width, so wrapping never counts escape codes. Off when ``NO_COLOR`` is set to anything non-empty
(https://no-color.org), when ``TERM=dumb``, and whenever the stream is not a terminal device (a pipe, a file, a
``StringIO``): what a program reads never holds escape codes. JSON is never coloured."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["colour_enabled", "colourize", "is_severe", "RED", "YELLOW", "RESET"]

RED, YELLOW, RESET = "\x1b[31m", "\x1b[33m", "\x1b[0m"

#: A warning about what must not serve as is: the emulation path (not for serving) or a GPU fault / crash. The text
#: report colours its label red and the HTML page styles it as an error (one rule for both).
_SEVERE = r"\bemulation\b|\b(?:memory (?:access )?fault|crash)"

# (pattern of the part to colour, colour); the first that matches a line wins.
_RULES = [
    (re.compile(r"→ (NO BACKEND|emulation)\b"), RED),                         # explain: a group's verdict
    (re.compile(rf"^(?: {{4}})?(warning)(?= .*(?:{_SEVERE}))"), RED),         # emulation / crash warnings
    (re.compile(r"^(?: {4})?(warning)\b"), YELLOW),                          # explain: plan and group warnings
    (re.compile(r"^  (ERROR)\b"), RED), (re.compile(r"^  (WARNING)\b"), YELLOW),           # lint
    (re.compile(r"^# (NO SAFE LAUNCH)\b"), RED), (re.compile(r"^# (WARNING):"), YELLOW),   # recipes
    (re.compile(r"^  (FAIL)\b"), RED),                                        # verify
]


def is_severe(text: str) -> bool:
    """Whether a warning is about what must not serve as is (emulation, a GPU fault or crash)."""
    return re.search(_SEVERE, text) is not None


def colour_enabled(stream: Any, environ: Any = None) -> bool:
    """Colour for ``stream``: a terminal device, ``NO_COLOR`` unset or empty, ``TERM`` not ``dumb``."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.StringIO and friends: UnsupportedOperation is an OSError
        return False


def colourize(text: str) -> str:
    """``text`` with the label of each line that needs it coloured (see the module docstring)."""
    out = []
    for line in text.split("\n"):
        for pattern, colour in _RULES:
            m = pattern.search(line)
            if m:
                start, end = m.span(1) if m.groups() else m.span()
                line = line[:start] + colour + line[start:end] + RESET + line[end:]
                break
        out.append(line)
    return "\n".join(out)
