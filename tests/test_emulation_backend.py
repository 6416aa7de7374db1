"""The `emulation` backend plugin runs for real: select it, plan padding, prepare padded weights, run."""

from __future__ import annotations

import torch

from moedispatch.core.layers import MoELayer
from moedispatch.selector.pure import select


def test_emulation_plugin_prepares_padded_weights_and_matches_the_unpadded_run(caps, builtins):
    # A W4A4 MXFP4 layer on gfx942: no native kernel is correct, emulation is selected (vllm.md §4).
    layer = MoELayer.build(hidden=96, intermediate=80, experts=4, top_k=2, weight="mxfp4", act="mxfp4",
                           activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0})
    decision = select(layer, caps("gfx942"), builtins)
    assert decision.backend == "emulation"
    pad = decision.padding
    assert (pad.hidden, pad.intermediate_per_rank) == (96, 96)  # MX pads to 32 (vLLM OCP_MX_BLOCK_SIZE)
    backend = next(b for b in builtins if b.name == "emulation")

    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(4, 2 * 80, 96, generator=g) * 0.1
    w2 = torch.randn(4, 96, 80, generator=g) * 0.1
    x = torch.randn(5, 96, generator=g)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 3], [1, 0]])
    wts = torch.rand(5, 2, generator=g)

    # Padded layout: the pad sits at the end of EACH gate/up half, zero-filled (aiter_sglang.md §5).
    w13p = torch.zeros(4, 2 * 96, 96)
    w13p[:, :80] = w13[:, :80]
    w13p[:, 96:96 + 80] = w13[:, 80:]
    w2p = torch.zeros(4, 96, 96)
    w2p[:, :, :80] = w2

    unpadded = backend.runner(layer).prepare({"w13": w13, "w2": w2}).run(x, wts, ids)
    padded = backend.runner(layer).prepare({"w13": w13p, "w2": w2p}, pad).run(x, wts, ids)
    assert padded.shape == (5, 96)
    assert torch.equal(padded, unpadded)
    assert torch.isfinite(padded).all() and padded.abs().sum() > 0
