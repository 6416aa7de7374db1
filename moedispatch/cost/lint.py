"""Tuned-CSV rows the cost model does not believe (:func:`lint_rows`): a timing copied across token buckets of one
shape, or a row faster than the datasheet roofline. AITER still dispatches on them; their time is not used."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from moedispatch.core.errors import UsageError
from moedispatch.cost.geometry import Geometry, roofline_us


def _row_get(row: Any, name: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def _shape_key(row: Any) -> tuple:
    return tuple(_row_get(row, k) for k in ("gfx", "cu_num", "model_dim", "inter_dim", "expert", "topk", "act_type",
                                            "dtype", "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1",
                                            "doweight_stage1", "file"))


def lint_rows(rows: Iterable[Any], peaks_for: Callable[[Any], Mapping[str, Any] | None]) -> tuple[list, list]:
    """Split tuned rows into ``(clean, rejected)``; each rejected entry is ``(row, why)``.

    Rejected: no positive ``us``; ``us`` identical (to 4 decimals) to another token bucket's of the same shape in the
    same file (timings copied across buckets); ``us`` below the datasheet roofline of ``peaks_for(row)`` (physically
    impossible). Rows tagged (``_tag``) are left to the caller.
    """
    rows = list(rows)
    seen: dict[tuple, dict[float, int]] = {}
    for r in rows:
        us = _row_get(r, "us")
        if us:
            counts = seen.setdefault(_shape_key(r), {})
            counts[round(float(us), 4)] = counts.get(round(float(us), 4), 0) + 1
    clean: list = []
    rejected: list = []
    for r in rows:
        us = _row_get(r, "us")
        if not us or float(us) <= 0:
            rejected.append((r, "no timing"))
            continue
        us = float(us)
        if seen[_shape_key(r)][round(us, 4)] > 1:
            rejected.append((r, f"us={us:g} is copied across token buckets of this shape"))
            continue
        peaks = peaks_for(r)
        if peaks is not None:
            try:
                geo = Geometry.of_row(r)
            except (UsageError, KeyError, ValueError, TypeError, AttributeError) as exc:
                rejected.append((r, f"cannot read the row's shape ({exc})"))
                continue
            tm, tc = roofline_us(geo, int(_row_get(r, "token")), peaks)
            if us < max(tm, tc):
                rejected.append((r, f"us={us:g} is faster than the datasheet roofline ({max(tm, tc):.1f} µs)"))
                continue
        clean.append(r)
    return clean, rejected
