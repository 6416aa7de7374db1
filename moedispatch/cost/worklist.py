"""What to tune first: the shapes AITER runs on heuristics ranked by the predicted time spent in them
(:func:`tuning_worklist`), in AITER's untuned-CSV format (:func:`untuned_csv`)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from moedispatch.core.costs import Cost
from moedispatch.aiter import dispatch as aiter_dispatch


#: AITER's untuned-CSV columns (``aiter/configs/untuned_fmoe.csv``), the input of its fused-MoE tuner
#: (``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py``).
UNTUNED_COLUMNS = ("token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
                   "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")


def tuning_worklist(entries: Iterable[tuple[Any, Sequence[Cost], int]]) -> tuple[dict[str, Any], ...]:
    """The shapes AITER runs on heuristics, ranked by the predicted time spent in them — what to tune first.

    :param entries: ``(plan, costs, layers)`` per layer group: its :class:`moedispatch.aiter.dispatch.DispatchPlan`,
        the AITER backend's predicted costs at the plan's token counts, and how many layers share it.
    :returns: one row per distinct lookup key and token bucket that no tuned row covers, with the
        :data:`UNTUNED_COLUMNS` (``token`` is AITER's bucket, so a tuned row lands where the lookup looks) plus
        ``gfx``, ``cu_num``, ``us`` (predicted per call), ``layers`` and ``weight`` = us × layers; highest weight
        first. Tuning cannot make a call faster than its roofline, so the time spent there is the most tuning
        could save, and the order is the order of expected saving when heuristic kernels lose a similar share.
    """
    merged: dict[tuple, dict[str, Any]] = {}
    for plan, costs, layers in entries:
        by_tokens = {c.tokens: c for c in costs}
        key = plan.key
        for step in plan.steps:
            if step.basis == "tuned":
                continue
            for m in plan.tokens:
                if not step.tokens[0] <= m <= step.tokens[1] or m not in by_tokens:
                    continue
                bucket = aiter_dispatch.get_padded_M(m, plan.dispatch_model)
                row = {"token": bucket, "model_dim": key.model_dim, "inter_dim": key.inter_dim, "expert": key.expert,
                       "topk": key.topk, "act_type": key.act_type, "dtype": key.dtype, "q_dtype_a": step.q_dtype_a,
                       "q_dtype_w": key.q_dtype_w, "q_type": key.q_type, "use_g1u1": key.use_g1u1,
                       "doweight_stage1": key.doweight_stage1}
                ident = (key.gfx, key.cu_num) + tuple(row[c] for c in UNTUNED_COLUMNS)
                us = by_tokens[m].us
                entry = merged.setdefault(ident, {**row, "gfx": key.gfx, "cu_num": key.cu_num, "us": 0.0,
                                                  "layers": 0, "weight": 0.0})
                entry["us"] = max(entry["us"], us)
                entry["layers"] += layers
                entry["weight"] += us * layers
    return tuple(sorted(merged.values(), key=lambda r: (-r["weight"], r["token"])))


def untuned_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows of :func:`tuning_worklist` in AITER's untuned-CSV format (header included), for its tuner."""
    lines = [",".join(UNTUNED_COLUMNS)]
    seen = set()
    for r in rows:
        line = ",".join(str(r[c]) for c in UNTUNED_COLUMNS)
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return "\n".join(lines) + "\n"
