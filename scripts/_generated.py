"""What the build scripts share: writing a derived capability_db TOML document and ``--check`` against it.

A generated file starts with its header comment lines, then ``schema``, ``[provenance]``, then tables and arrays of
tables in the order given; values are written as TOML (strings JSON-quoted, which TOML accepts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence


def value(v: Any) -> str:
    """One TOML value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def document(header: Sequence[str], schema: str, provenance: dict,
             sections: Iterable[tuple[str, dict]]) -> str:
    """The file's text: ``header`` comment lines, ``schema``, ``[provenance]``, then each ``(header, entries)`` of
    ``sections`` (``"[band.tuned.later]"``, ``"[[row]]"``)."""
    out = [f"# {line}" for line in header] + ["", f"schema = {value(schema)}", "", "[provenance]"]
    out += [f"{k} = {value(v)}" for k, v in provenance.items()]
    out.append("")
    for head, entry in sections:
        out.append(head)
        out += [f"{k} = {value(v)}" for k, v in entry.items()]
        out.append("")
    return "\n".join(out)


def write_or_check(text: str, out: str, check: bool) -> int:
    """Write ``text`` to ``out``, or with ``check`` compare it with the file there (exit status 1 when it differs)."""
    path = Path(out)
    if check:
        same = path.is_file() and path.read_text(encoding="utf-8") == text
        print(f"{out}: {'up to date' if same else 'DIFFERS from a rebuild'}")
        return 0 if same else 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0
