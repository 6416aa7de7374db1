"""The :class:`Reason` value: one statement about a decision, with its kind, source and confidence.

Every consumer (selector, plan, table, JSON, recipes, known issues) filters reasons by ``kind``, ``issue`` or
``confidence`` — never by reading their text. A plugin may still return plain strings; they are wrapped with the kind
their position implies (``failed`` in an unsupported verdict, ``supports`` in a supported one, ``padding`` in a
padding plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Reason", "KINDS", "CONFIDENCES", "as_reasons", "texts", "with_marker"]

#: The closed set of kinds.
#:   decision   why the chosen backend won (the first line of a layer's reasons)
#:   supports   a rule the backend passes for this layer (kernel, quant, arch)
#:   failed     a rule or known issue that makes the backend wrong or unable to run the layer
#:   outranked  a correct backend that lost to another (preference, forced backend)
#:   note       context that changes nothing (policy, coverage, an avoided known issue)
#:   padding    why the padding plan looks like it does (alignment, kernel pads, scale layout)
#:   caveat     a run-time risk the plan cannot rule out (token-count dependent bugs, scale-tile splits)
#:   warning    something the user must act on (slow reference path, default target, unconfirmed facts)
KINDS = ("decision", "supports", "failed", "outranked", "note", "padding", "caveat", "warning")

#: confirmed: read in the cited primary source; derived: our inference from cited sources, not verified upstream;
#: unconfirmed: no primary source could be found.
CONFIDENCES = ("confirmed", "derived", "unconfirmed")


@dataclass(frozen=True)
class Reason:
    """One short, specific statement; ``str()`` renders ``text (source)`` for the plain ``reasons: [str]`` lists."""

    text: str
    kind: str = "note"
    source: str | None = None
    issue: str | None = None
    confidence: str = "confirmed"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("Reason.text must be a non-empty string")
        if self.kind not in KINDS:
            raise ValueError(f"Reason.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"Reason.confidence must be one of {', '.join(CONFIDENCES)}, got {self.confidence!r}")
        for name in ("source", "issue"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"Reason.{name} must be a string or None, got {type(value).__name__}")

    def __str__(self) -> str:
        return f"{self.text} ({self.source})" if self.source else self.text

    def marked(self) -> str:
        """``str()`` plus a "(derived)" / "(unconfirmed)" marker for the table (with a legend there), once."""
        return with_marker(self.text, self.confidence, f" ({self.source})" if self.source else "")

    def to_dict(self) -> dict[str, Any]:
        """The contract's ``reason_details`` entry: ``{text, kind, source, issue, confidence}``."""
        return {"text": self.text, "kind": self.kind, "source": self.source, "issue": self.issue,
                "confidence": self.confidence}

    def with_kind(self, kind: str) -> "Reason":
        if kind == self.kind:
            return self
        return Reason(self.text, kind, self.source, self.issue, self.confidence)

    @classmethod
    def coerce(cls, value: "Reason | str", kind: str) -> "Reason":
        """A Reason as is, or a plugin's plain string wrapped with ``kind``."""
        if isinstance(value, Reason):
            return value
        if isinstance(value, str):
            return cls(value, kind)
        raise TypeError(f"a reason must be a str or Reason, not {type(value).__name__}")


def as_reasons(values: Iterable["Reason | str"], kind: str) -> tuple[Reason, ...]:
    """Coerce every value (see :meth:`Reason.coerce`)."""
    return tuple(Reason.coerce(v, kind) for v in values)


def texts(reasons: Iterable[Reason]) -> list[str]:
    """The rendered strings of ``reasons`` (the contract's plain ``reasons: [str]``)."""
    return [str(r) for r in reasons]


def with_marker(text: str, confidence: str, citation: str = "") -> str:
    """``text`` + ``citation`` (`` [3]``, `` (source)``) + the confidence marker (`` (derived)``), the marker once
    even where the text already ends with it (newcomer minor 6: "… HEAD e4048607 (derived) (derived)")."""
    marker = "" if confidence == "confirmed" else f" ({confidence})"
    if marker and text.endswith(marker):
        text = text[: -len(marker)]
    return text + citation + marker
