"""How wide the text reports may be, decided in one place, and the wrapping that keeps them inside it.

On a terminal the width is the terminal's: :func:`shutil.get_terminal_size` (the ``COLUMNS`` environment variable
first, then the size of the terminal), clamped to 80–200 columns so a tiny or huge window still gets a readable
layout. Off a terminal (piped, redirected, captured) there is no width: nothing is wrapped, so ``grep``, ``less -S``
and scripts see one logical line per line. JSON is never wrapped.

A line longer than the width is broken at spaces only, never inside a word: a token longer than the room left (a
path, a URL, a kernel name) stays whole on a line of its own, the only way a line can exceed the width.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from typing import Any

__all__ = ["MIN_COLUMNS", "MAX_COLUMNS", "terminal_width", "wrap", "fit"]

#: The narrowest and widest layout on a terminal (a terminal outside this range gets the nearest bound).
MIN_COLUMNS, MAX_COLUMNS = 80, 200

_WHITESPACE = str.maketrans({c: " " for c in "\t\n\x0b\x0c\r"})


def terminal_width(stream: Any = None) -> int | None:
    """Columns the text reports fit in: the terminal's, clamped to 80–200, when ``stream`` (default ``sys.stdout``)
    is a TTY; ``None`` — no limit, no wrapping — when it is not."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or stand-in stream is no terminal
        tty = False
    if not tty:
        return None
    columns = shutil.get_terminal_size((MIN_COLUMNS, 24)).columns
    return max(MIN_COLUMNS, min(MAX_COLUMNS, columns))


def _hang(indent: str, width: int, hang: int) -> str:
    """The continuation indent: the first line's indent plus ``hang``, at most half the width."""
    return " " * min(len(indent) + hang, width // 2)


def wrap(text: str, indent: str, width: int | None, *, hang: int = 2, subsequent: str | None = None) -> list[str]:
    """``indent + text`` as lines of at most ``width`` columns (``None``: one line, unwrapped); continuation lines
    start with ``subsequent`` (default: spaces to the text's column plus ``hang``). Breaks at spaces only."""
    text = text.translate(_WHITESPACE)
    if width is None:
        return [indent + text]
    rest = subsequent if subsequent is not None else _hang(indent, width, hang)
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False) or [indent]


_COMMENT = re.compile(r"^(\s*#+) ?")
# A column label: up to two short words followed by two or more spaces ("target  gfx950 …", "tuned set  …").
_LABEL = re.compile(r"^(\s*)(\S{1,14}(?: \S{1,14})?)( {2,})(?=\S)")
# Shell words: runs of unquoted characters and quoted strings (a break never lands inside quotes).
_SHELL_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"(?:\\.|[^"\\])*"?)+""")


def _fit_shell(line: str, width: int) -> list[str]:
    """A long shell command as backslash-continued lines (still one command when pasted)."""
    lead = line[: len(line) - len(line.lstrip())]
    ends_continued = line.rstrip().endswith(" \\")
    words = _SHELL_WORD.findall(line.rstrip().removesuffix(" \\") if ends_continued else line)
    out: list[str] = []
    cur = lead
    cont = _hang(lead, width, 4)
    for word in words:
        start = cur.strip() == ""
        candidate = cur + word if start else f"{cur} {word}"
        if start or len(candidate) + 2 <= width:
            cur = candidate
            continue
        out.append(cur + " \\")
        cur = cont + word
    out.append(cur + (" \\" if ends_continued else ""))
    return out


def wrap_shell(text: str, indent: str, width: int | None) -> list[str]:
    """``indent + text`` (one shell command) fitted to ``width``: broken only between shell words outside quotes,
    each broken line ending in `` \\`` and the next aligned under the text (``None``: one line)."""
    if width is None or len(indent) + len(text) <= width:
        return [indent + text]
    pad = " " * len(indent)
    out: list[str] = []
    cur = indent
    for word in _SHELL_WORD.findall(text):
        start = cur == indent
        if start or len(cur) + 1 + len(word) + 2 <= width:
            cur = cur + word if start else f"{cur} {word}"
            continue
        out.append(cur + " \\")
        cur = pad + word
    return out + [cur]


def fit(text: str, width: int | None, *, shell: bool = False) -> str:
    """Every line of ``text`` within ``width`` columns (``None``: ``text`` unchanged), for reports rendered line by
    line: a ``# comment`` continues as ``#   …``; with ``shell``, a command continues with `` \\`` and an indent;
    other lines continue under their text column (after a ``label  `` column, else four spaces in)."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        comment = _COMMENT.match(line)
        if comment:
            out += wrap(line[comment.end():], comment.group(0), width, subsequent=comment.group(1) + "   ")
        elif shell:
            out += _fit_shell(line, width)
        else:
            label = _LABEL.match(line)
            if label and len(label.group(0)) <= width // 2:
                out += wrap(line[label.end():], label.group(0), width)
            else:
                lead = line[: len(line) - len(line.lstrip())]
                out += wrap(line.lstrip(), lead, width, hang=4)
    return "\n".join(out)
