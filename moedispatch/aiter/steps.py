"""One dispatch step and its renderings: :class:`DispatchStep` (what AITER runs for a range of token counts; its
``to_dict`` is explain's contract object and ``info_line`` the log line AITER prints), the kernel → family naming
(:func:`kernel_family`), the grouping of alike consecutive counts (:func:`_group`) and the parser of AITER's
``[fused_moe] using …`` INFO line (:func:`parse_info_line`), the inverse of ``info_line``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from moedispatch.aiter.key import DispatchKey
from moedispatch.aiter.vocab import _ACT_VALUE
from moedispatch.data.aiter_configs import TunedRow


def kernel_family(name: str) -> str:
    """The AITER family a kernel name belongs to, from AITER's own naming: ``flydsl_*`` (incl. ``flydsl_mxmoe_*``)
    → flydsl; ``opus_*`` → opus; ``cktile_*``/``moe_cktile2stages*`` → cktile; ``*ck2stages*`` → ck;
    ``_ZN5aiter…``/``fmoe*`` (hsa code objects) → asm."""
    n = (name or "").strip()
    if n.startswith("flydsl_"):
        return "flydsl"
    if n.startswith("opus_"):
        return "opus"
    if n.startswith(("cktile_", "moe_cktile")):
        return "cktile"
    if "ck2stages" in n:
        return "ck"
    if n.startswith(("_ZN5aiter", "fmoe")):
        return "asm"
    return "unknown"


def _family(kernels: tuple[str, ...]) -> str:
    fams = [kernel_family(k) for k in kernels]
    if not fams:
        return "unknown"
    if len(fams) == 1 or fams[0] == fams[1]:
        return fams[0]
    return f"{fams[0]}+{fams[1]}"


@dataclass(frozen=True)
class DispatchStep:
    """What AITER runs for a range of token counts. ``to_dict()`` is the explain contract object.

    ``tokens`` is the (lo, hi) range of the requested token counts this step covers; ``bucket`` the padded M
    (``get_padded_M``) of ``lo`` (``buckets`` lists all). ``basis`` is ``tuned`` (a row decided: ``config`` is its
    ``file:line``) or ``heuristic`` (``config`` None). ``notes`` say why, with AITER's rule.
    """

    tokens: tuple[int, int]
    bucket: int
    stages: int
    family: str
    kernels: tuple[str, ...]
    block_m: int | None
    activation_dtype: str
    basis: str
    config: str | None
    ksplit: int = field(default=0, compare=False)
    buckets: tuple[int, ...] = field(default=(), compare=False)
    q_dtype_a: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    row: TunedRow | None = field(default=None, compare=False, repr=False)
    #: What AITER raises for these token counts instead of running (``"NotImplementedError: …"``), else None.
    raises: str | None = field(default=None, compare=False)

    def decision(self) -> tuple:
        """What grouping compares: everything but the token range and bucket (ksplit included: a range never
        reports one count's split for the others)."""
        return (self.stages, self.family, self.kernels, self.block_m, self.activation_dtype, self.basis,
                self.config, self.ksplit, self.raises)

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": [self.tokens[0], self.tokens[1]], "bucket": self.bucket, "stages": self.stages,
                "family": self.family, "kernels": list(self.kernels), "block_m": self.block_m,
                "activation_dtype": self.activation_dtype, "basis": self.basis, "config": self.config,
                "ksplit": self.ksplit, "raises": self.raises}

    def info_line(self, key: DispatchKey) -> str:
        """AITER's INFO line for this step, as ``get_2stage_cfgs`` prints it (for comparing with logs)."""
        k = key.aiter_tuple(self.bucket, self.q_dtype_a)
        if self.basis == "tuned" and self.row is not None:
            k2 = repr(self.row.kernel2) if self.row.kernel2 else "nan"  # pandas reads an empty cell as nan
            tag = f"(kernelName1={self.row.kernel1!r}, kernelName2={k2})"
        else:
            tag = "default"
        name = key.act_type.split(".")[-1]
        act = f"<ActivationType.{name}: {_ACT_VALUE.get(name, '?')}>"  # the pybind enum's repr in the key
        body = ", ".join(act if i == 7 else repr(v) for i, v in enumerate(k))
        return f"[fused_moe] using {'1stage' if self.stages == 1 else '2stage'} {tag} for ({body})"


def _group(steps: list[DispatchStep]) -> tuple[DispatchStep, ...]:
    out: list[DispatchStep] = []
    for s in steps:
        if out and out[-1].decision() == s.decision():
            prev = out[-1]
            buckets = prev.buckets + tuple(b for b in s.buckets if b not in prev.buckets)
            notes = prev.notes + tuple(n for n in s.notes if n not in prev.notes)
            out[-1] = replace(prev, tokens=(prev.tokens[0], s.tokens[1]), buckets=buckets, notes=notes)
        else:
            out.append(s)
    return tuple(out)


# -- AITER's INFO line -------------------------------------------------------------------------------------------

_INFO = re.compile(r"\[fused_moe\] using (?P<stages>1stage|2stage)(?P<xbf16> xbf16)? (?P<what>default|\(.*?\)) "
                   r"for \((?P<key>.*)\)")


def parse_info_line(line: str) -> dict[str, Any] | None:
    """Parse AITER's ``[fused_moe] using … for (...)`` log line into stages, kernel names and the key values."""
    m = _INFO.search(line)
    if not m:
        return None
    what = m.group("what")
    kernels: tuple[str, ...] = ()
    if what != "default":
        names = re.findall(r"kernelName\d=(?:'([^']*)'|(nan|None))", what)
        kernels = tuple(a for a, _b in names if a)
    parts = [p.strip().strip("'\"") for p in m.group("key").split(",")]
    return {"stages": 1 if m.group("stages") == "1stage" else 2, "xbf16": bool(m.group("xbf16")),
            "default": what == "default", "kernels": kernels, "key": tuple(parts)}
