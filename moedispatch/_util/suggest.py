"""``did you mean`` for mistyped names (models, targets, backends)."""

from __future__ import annotations

from typing import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice (case- and separator-insensitive), or ``""``."""
    import difflib

    def norm(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    by_norm = {norm(c): c for c in choices}
    close = difflib.get_close_matches(norm(word), list(by_norm), n=1, cutoff=0.6)
    return f" (did you mean {by_norm[close[0]]!r}?)" if close else ""
