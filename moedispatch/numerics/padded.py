"""The MoE forward on *padded* weights as a kernel reads them: what ``moedispatch verify`` checks a plan with.

:func:`moedispatch.numerics.moe.fused_moe` cuts every pad off before it computes, so it can only say that a padded
plan whose pads are zero equals the unpadded layer. A kernel does not cut anything: it reads the padded allocation
over the extent its pad arguments leave it (``Padding.pad_semantics``):

``compute``
    the whole padded extent (AITER classic CK and ASM ignore pad arguments; FlyDSL when no pad is forwarded);
``skip``
    the padded extent less the ``kernel_hidden_pad`` / ``kernel_intermediate_pad`` granules it is told to skip
    (AITER CK-Tile ``n_pad_zeros``/``k_pad_zeros``, FlyDSL ``model_dim_pad``/``inter_dim_pad``);
``trim``
    ``K = shape - pad`` (Triton): the trimmed pad is never read.

:func:`padded_kernel_moe` computes the layer over given extents ``hidden_extent`` (the hidden columns stage 1 reads
and the hidden rows stage 2 writes) and ``intermediate_extent`` (the gate/up rows stage 1 writes and the
intermediate columns stage 2 reads); the caller derives them from the plan. It follows ``fused_moe`` operation by
operation (same activation QDQ, same expert order, same accumulation), and splits every GEMM into the logical
block and the pad block: ``logical + pad``. A pad block that contributes exact zeros therefore leaves the result
bitwise equal to ``fused_moe`` on the unpadded layer, whatever the BLAS does with a longer K; a pad block holding
garbage, or an extent that stops short of the logical size (a kernel pad larger than the pad: it skips real data),
changes it. Extents shorter than the logical size leave the columns not computed at zero (as a pre-zeroed output
buffer would; ROCm/aiter#3538). ``skip`` is modelled at element granularity: AITER's CK-Tile rounds the pads it is
given down to whole granules (``n_pad_zeros``/``k_pad_zeros``) and computes over the remainder, which only matters
for pads that are not zero-filled.

:func:`fill_pad_garbage_` models allocation with ``torch.empty``: it fills the pad regions of padded weights with
random values and puts NaN in the first element of each expert's region — uninitialized memory can hold any bit
pattern (an E8M0 scale byte 0xFF is NaN), and NaN keeps a read visible where a zero activation pad would cancel a
finite value (NaN·0 is NaN). Hidden-state pads are zeros (engines pad activations with ``F.pad``).

Weights are float32 logical-plus-pad tensors: ``gate``/``up`` ``[E, I_p, H_p]`` (row ``j`` of each is gate/up unit
``j`` in either gate/up layout), ``w2`` ``[E, H_p, I_p]``; biases ``[E, I_p]`` / ``[E, H_p]``.
"""

from __future__ import annotations

from typing import Any

import torch

from moedispatch.numerics.moe import (
    DEFAULT_MX_SCALE_ROUNDING, _linear, _split_halves, apply_activation, dequantize_weight, qdq_activation,
    resolve_scheme,
)

__all__ = ["padded_kernel_moe", "fill_pad_garbage_", "split_gate_up", "GARBAGE_SCALE"]

#: Standard deviation of the random values put in pad regions that are not zero-filled.
GARBAGE_SCALE = 16.0


def split_gate_up(w13: Any, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``gate``, ``up`` ``[E, I_p, H_p]`` (contiguous) of a padded w13 ``[E, 2*I_p, H_p]`` in ``layout``
    (any container :func:`~moedispatch.numerics.moe.dequantize_weight` takes); fresh copies, safe to fill."""
    full = dequantize_weight(w13)
    gate, up = _split_halves(full, layout)
    return gate.clone(memory_format=torch.contiguous_format), up.clone(memory_format=torch.contiguous_format)


def _fill(region: torch.Tensor, gen: torch.Generator) -> None:
    """Random values in ``region`` (a view ``[E, ...]``), NaN in the first element of each expert's part."""
    if region.numel() == 0:
        return
    region.copy_(torch.randn(region.shape, generator=gen) * GARBAGE_SCALE)
    region[(slice(None),) + (0,) * (region.ndim - 1)] = float("nan")


def fill_pad_garbage_(gate: torch.Tensor, up: torch.Tensor, w2: torch.Tensor, *, hidden: int, intermediate: int,
                      gen: torch.Generator, bias_gate: torch.Tensor | None = None,
                      bias_up: torch.Tensor | None = None, bias2: torch.Tensor | None = None) -> list[str]:
    """Fill every pad region of the padded weights in place with garbage (see the module docstring).

    Returns the names of the regions filled, e.g. ``"gate/up rows 384..511"``.
    """
    h, i = hidden, intermediate
    ip, hp = gate.shape[-2], gate.shape[-1]
    filled = []
    if ip > i:
        for t in (gate, up):
            _fill(t[:, i:, :], gen)
        _fill(w2[:, :, i:], gen)
        filled.append(f"gate/up rows and w2 columns {i}..{ip - 1} (intermediate pad)")
        for b in (bias_gate, bias_up):
            if b is not None:
                _fill(b[:, i:], gen)
    if hp > h:
        for t in (gate, up):
            _fill(t[:, :i, h:], gen)
        _fill(w2[:, h:, :], gen)
        filled.append(f"gate/up columns and w2 rows {h}..{hp - 1} (hidden pad)")
        if bias2 is not None:
            _fill(bias2[:, h:], gen)
    return filled


def padded_kernel_moe(hidden_states: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, hidden: int, intermediate: int,
                      hidden_extent: int, intermediate_extent: int, activation_scheme: Any,
                      activation: str = "silu", activation_params: Any = None,
                      bias_gate: torch.Tensor | None = None, bias_up: torch.Tensor | None = None,
                      bias2: torch.Tensor | None = None,
                      scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING) -> torch.Tensor:
    """The layer output ``[T, hidden]`` (float32) computed over the given extents of the padded weights.

    ``hidden_states`` is ``[T, H_p]``; ``hidden``/``intermediate`` are the logical sizes; ``hidden_extent`` /
    ``intermediate_extent`` what the kernel reads (``H_p``/``I_p`` for ``compute``, ``H_p - kernel_hidden_pad`` /
    ``I_p - kernel_intermediate_pad`` for ``skip`` and ``trim``), clamped to ``[0, padded]``.
    """
    h, i = hidden, intermediate
    ip, hp = gate.shape[-2], gate.shape[-1]
    if tuple(up.shape) != tuple(gate.shape) or tuple(w2.shape) != (gate.shape[0], hp, ip):
        raise ValueError(f"gate {tuple(gate.shape)}, up {tuple(up.shape)}, w2 {tuple(w2.shape)}: expected gate = up "
                         f"= [E, I_p, H_p] and w2 = [E, H_p, I_p]")
    if hidden_states.ndim != 2 or hidden_states.shape[1] != hp:
        raise ValueError(f"hidden_states must be [T, {hp}], got {tuple(hidden_states.shape)}")
    if not (0 < h <= hp and 0 < i <= ip):
        raise ValueError(f"logical sizes hidden {h}, intermediate {i} do not fit the padded {hp}, {ip}")
    hk = min(max(hidden_extent, 0), hp)
    ik = min(max(intermediate_extent, 0), ip)
    hr, ir = min(h, hk), min(i, ik)  # logical part of each extent
    aspec = resolve_scheme(activation_scheme, activation=True)

    x = hidden_states.to(torch.float32)
    t_count = x.shape[0]
    ids = topk_ids.to(torch.int64)
    weights = topk_weights.to(torch.float32)
    k = ids.shape[1]

    def qdq(t: torch.Tensor) -> torch.Tensor:  # an extent of 0 (a kernel pad as large as the allocation) reads nothing
        return t.clone() if t.shape[-1] == 0 else qdq_activation(t, aspec, scale_rounding=scale_rounding)

    a1 = qdq(x[:, :hk])
    flat = ids.reshape(-1)
    experts = [int(e) for e in torch.unique(flat[flat >= 0]).tolist()]
    slots_of = {e: torch.nonzero(flat == e).reshape(-1) for e in experts}

    # stage 1: gate/up rows [0, ik) over hidden columns [0, hk)
    hbuf = torch.zeros(t_count * k, ik, dtype=torch.float32)
    for e in experts:
        slots = slots_of[e]
        rows = a1.index_select(0, slots // k)
        logical = rows[:, :hr].contiguous()
        halves = []
        for w in (gate[e], up[e]):
            y = _linear(logical, w[:ir, :hr])
            if hk > h:  # hidden pad columns read: exact zeros when they hold zeros
                y = y + _linear(rows[:, h:hk].contiguous(), w[:ir, h:hk])
            if ik > i:  # intermediate pad rows computed
                y = torch.cat([y, _linear(rows, w[i:ik, :hk])], dim=1)
            halves.append(y)
        g, u = halves
        if bias_gate is not None:
            g = g + bias_gate[e, :ik].to(torch.float32)
        if bias_up is not None:
            u = u + bias_up[e, :ik].to(torch.float32)
        hbuf.index_copy_(0, slots, apply_activation(g, u, activation, activation_params))

    # stage 2: hidden rows [0, hk) over intermediate columns [0, ik); the output is the logical hidden width
    a2 = qdq(hbuf)
    out = torch.zeros(t_count, h, dtype=torch.float32)
    flat_w = weights.reshape(-1)
    for e in experts:
        slots = slots_of[e]
        a = a2.index_select(0, slots)
        y = _linear(a[:, :ir].contiguous(), w2[e, :hr, :ir])
        if ik > i:  # intermediate pad columns read
            y = y + _linear(a[:, i:ik].contiguous(), w2[e, :hr, i:ik])
        if bias2 is not None:
            y = y + bias2[e, :hr].to(torch.float32)
        if hr < h:  # hidden rows the kernel skipped: never written
            y = torch.nn.functional.pad(y, (0, h - hr))
        out.index_add_(0, slots // k, y * flat_w.index_select(0, slots).unsqueeze(-1))
    return out
