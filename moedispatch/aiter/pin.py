"""Pinning a kernel AITER's dispatcher would not pick: a tuned-config file for ``AITER_CONFIG_FMOE``.

When the fastest correct plan needs another kernel than the tuned row AITER would pick at some token bucket (a row a
known issue marks wrong), the fix some issues name is to point that bucket at the kernel its neighbouring buckets use
(capability_db/dispatch_issues.toml ``pin = "neighbour"``, e.g. ROCm/aiter#3933). ``AITER_CONFIG_FMOE`` *replaces*
AITER's whole tuned set (ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/jit/core.py; sgl-project/sglang#37072),
so the file holds the planned release's merged rows — de-duplicated on AITER's merge keys, as
:mod:`moedispatch.data.aiter_configs` merges them — with each pinned row in place of the bad one.

Who calls what::

    from moedispatch.aiter import pin
    pins = pin.find_pins(layer, caps, dispatch_plan, padding=alloc, env=env)   # Pin(issue, bucket, bad, good)
    text = pin.pinned_csv(config_set, pins)                                     # AITER's tuned-fmoe CSV

Pure functions of values; nothing is written unless :func:`write_pinned` is called with a path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from moedispatch.aiter import dispatch as ad
from moedispatch.aiter import issues as aiter_issues
from moedispatch.core.errors import UsageError
from moedispatch.data import aiter_configs as cfg
from moedispatch.data.tuned_row import TunedRow

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Padding
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

__all__ = ["Pin", "COLUMNS", "find_pins", "pinned_rows", "pinned_csv", "write_pinned"]

#: AITER's tuned fused-MoE CSV columns at HEAD (ROCm/aiter@e4048607:aiter/configs/model_configs/*_tuned_fmoe.csv
#: headers; the merge fills the ones an older file lacks).
COLUMNS = ("gfx", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
           "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1", "block_m", "ksplit", "us1", "kernelName1", "err1",
           "us2", "kernelName2", "err2", "us", "run_1stage", "xbf16", "flat", "tflops", "bw", "_tag")
_FIELDS = {"kernelName1": "kernel1", "kernelName2": "kernel2", "_tag": "tag"}


@dataclass(frozen=True)
class Pin:
    """Bucket ``bucket`` of the lookup key of ``bad`` (the row AITER would pick, which ``issue`` marks wrong) runs the
    kernels of ``good`` (the same key's row at a neighbouring bucket that no known issue marks)."""

    issue: str
    bucket: int
    bad: TunedRow
    good: TunedRow

    def row(self) -> TunedRow:
        """The pinned row: ``good``'s kernels and tile at ``bad``'s key and bucket."""
        return self.good._replace(token=self.bad.token, file="(pinned)", line=0)

    def describe(self) -> str:
        k2 = f" + {self.good.kernel2}" if self.good.kernel2 else ""
        return (f"bucket {self.bucket}: {self.good.kernel1}{k2} (the bucket-{self.good.token} row, "
                f"{self.good.file}:{self.good.line}) instead of {self.bad.kernel1}"
                f"{' + ' + self.bad.kernel2 if self.bad.kernel2 else ''} ({self.bad.file}:{self.bad.line}, "
                f"[{self.issue}])")

    def to_dict(self) -> dict[str, Any]:
        return {"issue": self.issue, "bucket": self.bucket, "replaces": f"{self.bad.file}:{self.bad.line}",
                "kernels": [self.good.kernel1, self.good.kernel2], "from": f"{self.good.file}:{self.good.line}",
                "from_bucket": self.good.token}


def _same_key(a: TunedRow, b: TunedRow) -> bool:
    return (a.gfx, a.cu_num, a.model_dim, a.inter_dim, a.expert, a.topk, a.act_type, a.dtype, a.q_dtype_a,
            a.q_dtype_w, a.q_type, a.use_g1u1, a.doweight_stage1, a.tag) == \
        (b.gfx, b.cu_num, b.model_dim, b.inter_dim, b.expert, b.topk, b.act_type, b.dtype, b.q_dtype_a,
         b.q_dtype_w, b.q_type, b.use_g1u1, b.doweight_stage1, b.tag)


def _neighbours(rows: Iterable[TunedRow], bad: TunedRow) -> list[TunedRow]:
    """The same key's rows at other buckets, nearest (in log2 of the bucket) first, the smaller bucket on a tie."""
    same = [r for r in rows if _same_key(r, bad) and r.token != bad.token]
    return sorted(same, key=lambda r: (abs(math.log2(r.token) - math.log2(bad.token)), r.token))


def find_pins(layer: "MoELayer", caps: "Capabilities", dispatch: Any, *, padding: "Padding | None" = None,
              env: Mapping[str, str] | None = None, assumptions: Any = None) -> tuple["Pin", ...]:
    """One :class:`Pin` per tuned row of ``dispatch`` (a DispatchPlan) that a known issue allowing a pin marks wrong:
    the nearest neighbouring bucket's row whose kernels, dispatched in its place, hit no known issue. An issue whose
    data names no pin strategy, or a bucket with no clean neighbour, gives none."""
    env_d = dict(env or {})
    pinnable = {i.id: i for i in aiter_issues.dispatch_issues() if i.pin == "neighbour"}
    hits = [h for h in dispatch.issues if h.issue in pinnable]
    if not hits:
        return ()
    cs = cfg.config_set_for(caps, env_d, model_dims=frozenset({dispatch.key.model_dim}))
    pins: list[Pin] = []
    for hit in hits:
        for step in dispatch.steps:
            bad = step.row
            if step.basis != "tuned" or bad is None or not (hit.tokens[0] <= step.tokens[0] <= hit.tokens[1]):
                continue
            if any(p.bad == bad for p in pins):
                continue
            for good in _neighbours(cs.rows, bad):
                trial = Pin(hit.issue, step.bucket, bad, good)
                again = ad.plan_dispatch(layer, caps, tokens=(step.tokens[0],), env=env_d, padding=padding,
                                         configs=_replaced(cs, (trial,)), assumptions=assumptions)
                if not any(h.severity == "error" for h in again.issues) and \
                        all(s.basis == "tuned" and s.kernels[0] == good.kernel1 for s in again.steps):
                    pins.append(trial)
                    break
    return tuple(pins)


def pinned_rows(rows: Iterable[TunedRow], pins: Iterable[Pin]) -> list[TunedRow]:
    """``rows`` (a merged tuned set, in merge order) with each pin's bad row replaced by its pinned row."""
    swap = {p.bad: p.row() for p in pins}
    return [swap.get(r, r) for r in rows]


def _replaced(cs: Any, pins: Iterable[Pin]) -> Any:
    from dataclasses import replace

    return replace(cs, rows=tuple(pinned_rows(cs.rows, pins)), label=cs.label + " (pinned)")


def _cell(row: TunedRow, column: str) -> str:
    value = getattr(row, _FIELDS.get(column, column), "")
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if any(c in text for c in ',"\n'):
        raise UsageError(f"tuned row {row.file}:{row.line}: {column} {text!r} cannot be written as a CSV cell")
    return text


def pinned_csv(rows: Iterable[TunedRow], pins: Iterable[Pin] = ()) -> str:
    """AITER's tuned fused-MoE CSV (:data:`COLUMNS`) of ``rows`` with the pins applied."""
    lines = [",".join(COLUMNS)]
    for row in pinned_rows(rows, pins):
        lines.append(",".join(_cell(row, c) for c in COLUMNS))
    return "\n".join(lines) + "\n"


def write_pinned(path: str, rows: Iterable[TunedRow], pins: Iterable[Pin]) -> None:
    """Write :func:`pinned_csv` to a NEW file ``path`` (an existing file is never overwritten: UsageError)."""
    if os.path.exists(path):
        raise UsageError(f"--pin-file {path}: the file exists; moedispatch never overwrites a file — name a new one")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--pin-file {path}: no such directory {parent}")
    with open(path, "x", encoding="utf-8", newline="\n") as fh:
        fh.write(pinned_csv(rows, pins))
