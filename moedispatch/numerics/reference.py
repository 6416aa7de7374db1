"""An independent, deliberately plain float64 MoE used to check :func:`moedispatch.numerics.moe.fused_moe`.

It loops over tokens and slots (not experts), takes already-dequantized logical weights, and does every GEMM in
float64. Comparing it with fused_moe is done in two stages so that a rounding decision of the activation QDQ
(which can flip when float32 and float64 intermediates differ in their last bit) never makes a correct
implementation look wrong:

1. ``h`` (the activation output before its QDQ) from fused_moe's ``a1`` vs the float64 ``h``;
2. the output, computed in float64 from fused_moe's own ``a2`` — after checking that ``a2`` is exactly the
   activation QDQ of fused_moe's ``h`` — vs fused_moe's output.
"""

from __future__ import annotations

from typing import Any

import torch

from moedispatch.numerics.moe import apply_activation, qdq_activation

__all__ = ["reference_moe", "staged_compare", "rel_err"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64 (0 when both are zero)."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    den = float(b64.norm())
    num = float((a64 - b64).norm())
    return num / den if den else num


def reference_moe(a1: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, *, activation: str, activation_params: Any = None, layout: str = "halves",
                  bias13: torch.Tensor | None = None, bias2: torch.Tensor | None = None,
                  a2: torch.Tensor | None = None, act_qdq=None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(out [T, H], h [T*k, I])`` from logical float weights ``w13 [E, 2I, H]``, ``w2 [E, H, I]``.

    ``a2`` (``[T*k, I]``) replaces the QDQ'd intermediate when given; else ``act_qdq(h)`` (float32 in, any out) or
    ``h`` itself is used.
    """
    a1 = a1.to(torch.float64)
    t_count, k = topk_ids.shape
    inter = w2.shape[-1]
    ids = topk_ids.tolist()
    experts = sorted({e for row in ids for e in row if e >= 0})
    # expert by expert (each converted to float64 once), then one matrix-vector product per routed slot
    h = torch.zeros(t_count * k, inter, dtype=torch.float64)
    for e in experts:
        w = w13[e].to(torch.float64)
        wg, wu = (w[0::2], w[1::2]) if layout == "interleaved" else (w[:inter], w[inter:])
        if bias13 is not None:
            b = bias13[e].to(torch.float64)
            bg, bu = (b[0::2], b[1::2]) if layout == "interleaved" else (b[:inter], b[inter:])
        for t in range(t_count):
            for j in range(k):
                if ids[t][j] != e:
                    continue
                g = wg @ a1[t]
                u = wu @ a1[t]
                if bias13 is not None:
                    g, u = g + bg, u + bu
                h[t * k + j] = apply_activation(g, u, activation, activation_params)
        del w, wg, wu
    if a2 is None:
        a2 = act_qdq(h.to(torch.float32)) if act_qdq is not None else h
    a2 = a2.to(torch.float64)
    y = torch.zeros(t_count, k, w2.shape[1], dtype=torch.float64)
    for e in experts:
        w = w2[e].to(torch.float64)
        for t in range(t_count):
            for j in range(k):
                if ids[t][j] != e:
                    continue
                y[t, j] = w @ a2[t * k + j]
                if bias2 is not None:
                    y[t, j] += bias2[e].to(torch.float64)
        del w
    out = torch.zeros(t_count, w2.shape[1], dtype=torch.float64)
    for t in range(t_count):
        for j in range(k):
            if ids[t][j] >= 0:
                out[t] += float(topk_weights[t, j]) * y[t, j]
    return out, h


def staged_compare(out: torch.Tensor, inter: dict, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, *, activation: str, activation_params: Any = None, layout: str = "halves",
                   bias13: torch.Tensor | None = None, bias2: torch.Tensor | None = None, activation_scheme: Any,
                   scale_rounding: str = "even", a2_scale: Any = None) -> dict:
    """Compare fused_moe's output and intermediates with :func:`reference_moe` (see the module docstring).

    ``w13``/``w2`` are the logical dequantized weights. Returns ``{"h_err", "out_err", "a2_exact"}``.
    """
    _, h_ref = reference_moe(inter["a1"], w13, w2, topk_weights, topk_ids, activation=activation,
                             activation_params=activation_params, layout=layout, bias13=bias13, bias2=bias2)
    a2_again = qdq_activation(inter["h"], activation_scheme, scale=a2_scale, scale_rounding=scale_rounding)
    a2_exact = bool(torch.equal(a2_again, inter["a2"]))
    out_ref, _ = reference_moe(inter["a1"], w13, w2, topk_weights, topk_ids, activation=activation,
                               activation_params=activation_params, layout=layout, bias13=bias13, bias2=bias2,
                               a2=inter["a2"])
    h = out.shape[1]
    return {"h_err": rel_err(inter["h"], h_ref), "out_err": rel_err(out[:, :w2.shape[1]], out_ref),
            "a2_exact": a2_exact, "width": h}
