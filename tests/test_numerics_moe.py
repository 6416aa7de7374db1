"""fused_moe vs an independent float64 MoE on the same QDQ'd operands; padding exactness; lazy dequantization."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moedispatch.core.backend import Padding  # noqa: E402
from moedispatch.core.layers import MoELayer, QuantSpec  # noqa: E402
from moedispatch.numerics.moe import (  # noqa: E402
    DequantTracker, GateUp, activation_layout, apply_activation, dequantize_weight, fused_moe, qdq_activation,
    quantize_w13, quantize_weight,
)
from moedispatch.numerics.reference import reference_moe, rel_err, staged_compare  # noqa: E402
from moedispatch.numerics.routing import (  # noqa: E402
    apply_routed_scaling, grouped_topk, renormalize, route, sigmoid_topk, softmax_topk,
)
from moedispatch.numerics.runner import EmulationRunner, RunnerUnavailable, get_runner, register_runner  # noqa: E402

E, H, I, T, K = 6, 96, 64, 7, 2
TOL = 1e-5

SCHEMES = {
    "bf16": (QuantSpec("bf16"), QuantSpec("bf16")),
    "fp16": (QuantSpec("fp16"), QuantSpec("fp16")),
    "fp8-tensor": (QuantSpec("fp8", "tensor", "fp32"), QuantSpec("fp8", "tensor", "fp32", dynamic=True)),
    "fp8fnuz-channel-token": (QuantSpec("fp8", "channel", "fp32", fmt="e4m3fnuz"),
                              QuantSpec("fp8", "token", "fp32", dynamic=True, fmt="e4m3fnuz")),
    "fp8-block": (QuantSpec("fp8", "block16x32", "fp32"), QuantSpec("fp8", "block16x32", "fp32", dynamic=True)),
    "fp8e5m2-w-only": (QuantSpec("fp8", "tensor", "fp32", fmt="e5m2"), QuantSpec("bf16")),
    "int8-w8a8": (QuantSpec("int8", "channel", "fp32"), QuantSpec("int8", "token", "fp32", dynamic=True)),
    "int4-w4a16": (QuantSpec("int4", "group32", "fp32"), QuantSpec("bf16")),
    "mxfp4-w4a4": (QuantSpec.parse("mxfp4"), QuantSpec.parse("mxfp4", dynamic=True)),
    "mxfp4-w4a16": (QuantSpec.parse("mxfp4"), QuantSpec("bf16")),
    "mxfp4-w4a8fp8": (QuantSpec.parse("mxfp4"), QuantSpec("fp8", "tensor", "fp32", dynamic=True)),
    "mxfp6-e2m3": (QuantSpec("mxfp6", "group32", "e8m0", fmt="e2m3"),
                   QuantSpec("mxfp6", "group32", "e8m0", dynamic=True, fmt="e2m3")),
    "mxfp6-e3m2": (QuantSpec("mxfp6", "group32", "e8m0", fmt="e3m2"),
                   QuantSpec("mxfp6", "group32", "e8m0", dynamic=True, fmt="e3m2")),
    "mxfp8": (QuantSpec.parse("mxfp8"), QuantSpec.parse("mxfp8", dynamic=True)),
    "mxfp8-e5m2-w-only": (QuantSpec("mxfp8", "group32", "e8m0", fmt="e5m2"), QuantSpec("bf16")),
}
ACTS = ["silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave"]
SWIGLU = (("alpha", 1.702), ("limit", 7.0))


def make(seed: int, *, bias: bool = False, e: int = E, h: int = H, i: int = I, t: int = T, k: int = K):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, generator=g) * (3.0 / h ** 0.5)  # gate reaches the swiglu limit sometimes
    w2 = torch.randn(e, h, i, generator=g) / i ** 0.5
    x = torch.randn(t, h, generator=g)
    wts, ids = softmax_topk(torch.randn(t, e, generator=g), k)
    b13 = torch.randn(e, 2 * i, generator=g) * 0.2 if bias else None
    b2 = torch.randn(e, h, generator=g) * 0.2 if bias else None
    return dict(w13=w13, w2=w2, x=x, wts=wts, ids=ids, b13=b13, b2=b2)


def params(act):
    return SWIGLU if act.startswith("swiglu") else None


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("act", ACTS)
def test_matches_float64_reference(scheme, act):
    wspec, aspec = SCHEMES[scheme]
    d = make(hash((scheme, act)) % 2**31, bias=act == "swigluoai")
    layout = activation_layout(act)
    inter: dict = {}
    out = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], weight_scheme=wspec, activation_scheme=aspec,
                    activation=act, activation_params=params(act), bias13=d["b13"], bias2=d["b2"],
                    intermediates=inter)
    q13 = quantize_w13(d["w13"], wspec, layout=layout)
    q2 = quantize_weight(d["w2"], wspec)
    res = staged_compare(out, inter, dequantize_weight(q13), dequantize_weight(q2), d["wts"], d["ids"],
                         activation=act, activation_params=params(act), layout=layout, bias13=d["b13"],
                         bias2=d["b2"], activation_scheme=aspec)
    assert res["a2_exact"]
    assert res["h_err"] <= TOL and res["out_err"] <= TOL, res
    # activation QDQ of the input is the scheme's, and a1 is it
    assert torch.equal(inter["a1"], qdq_activation(d["x"], aspec))
    # pre-quantized containers give bitwise the same result as float weights QDQ'd on the fly
    out_q = fused_moe(d["x"], q13, q2, d["wts"], d["ids"], weight_scheme=wspec, activation_scheme=aspec,
                      activation=act, activation_params=params(act), bias13=d["b13"], bias2=d["b2"])
    assert torch.equal(out, out_q)
    # and the quantization is doing something (not a silent pass-through) for quantized schemes
    if wspec.quantized:
        assert not torch.equal(dequantize_weight(q2), d["w2"])


def _pad_layer(d, layout, hp, ip):
    h, i = d["w2"].shape[1], d["w2"].shape[2]
    e = d["w13"].shape[0]
    w13p = torch.zeros(e, 2 * ip, hp)
    b13p = torch.zeros(e, 2 * ip) if d["b13"] is not None else None
    if layout == "interleaved":
        w13p[:, :2 * i, :h] = d["w13"]
        if b13p is not None:
            b13p[:, :2 * i] = d["b13"]
    else:
        w13p[:, :i, :h], w13p[:, ip:ip + i, :h] = d["w13"][:, :i], d["w13"][:, i:]
        if b13p is not None:
            b13p[:, :i], b13p[:, ip:ip + i] = d["b13"][:, :i], d["b13"][:, i:]
    w2p = torch.zeros(e, hp, ip)
    w2p[:, :h, :i] = d["w2"]
    b2p = None
    if d["b2"] is not None:
        b2p = torch.zeros(e, hp)
        b2p[:, :h] = d["b2"]
    xp = torch.zeros(d["x"].shape[0], hp)
    xp[:, :h] = d["x"]
    return w13p, w2p, b13p, b2p, xp


@pytest.mark.parametrize("scheme", ["mxfp4-w4a4", "fp8-block", "fp8-tensor", "int4-w4a16", "bf16", "mxfp6-e3m2"])
@pytest.mark.parametrize("act", ["swigluoai", "swigluoai_uninterleave", "silu"])
def test_padded_equals_unpadded_bitwise(scheme, act):
    wspec, aspec = SCHEMES[scheme]
    h, i = 80, 40  # hidden 80 → 128 and intermediate 40 → 64: partial MX blocks, partial fp8 tiles
    hp, ip = 128, 64
    d = make(5, bias=True, h=h, i=i)
    layout = activation_layout(act)
    w13p, w2p, b13p, b2p, xp = _pad_layer(d, layout, hp, ip)
    pad = Padding(hidden=hp, intermediate_per_rank=ip, hidden_pad=hp - h, intermediate_pad=ip - i, zero_fill=True)
    kw = dict(weight_scheme=wspec, activation_scheme=aspec, activation=act, activation_params=params(act))
    ref = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], bias13=d["b13"], bias2=d["b2"], **kw)
    got = fused_moe(xp, w13p, w2p, d["wts"], d["ids"], bias13=b13p, bias2=b2p, padding=pad, **kw)
    assert got.shape == (T, hp) and torch.equal(got[:, :h], ref) and (got[:, h:] == 0).all()
    # quantized at the padded size (as a loader into zero-filled padded buffers would)
    q13p, q2p = quantize_w13(w13p, wspec, layout=layout), quantize_weight(w2p, wspec)
    tracker = DequantTracker()
    got_q = fused_moe(xp, q13p, q2p, d["wts"], d["ids"], bias13=b13p, bias2=b2p, padding=pad, tracker=tracker,
                      **kw)
    assert torch.equal(got_q, got)
    # logical copies of padded weights are counted too, and everything is released
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes <= 2 * (2 * ip * hp + hp * ip) * 4
    fused13 = quantize_weight(w13p, wspec) if wspec.quantized else w13p  # one container for the whole w13
    got_f = fused_moe(xp, fused13, q2p, d["wts"], d["ids"], bias13=b13p, bias2=b2p, padding=pad, **kw)
    if wspec.is_mx or wspec.granularity in (None, "channel"):  # per-row scales: fused == per-half quantization
        assert torch.equal(got_f, got)
    # unpadded hidden_states are accepted with padded weights: output keeps the input width
    got_narrow = fused_moe(d["x"], w13p, w2p, d["wts"], d["ids"], bias13=b13p, bias2=b2p, padding=pad, **kw)
    assert torch.equal(got_narrow, ref)


def _kernel_operands(d, layout, hp, ip, wspec):
    """Padded float gate/up/w2 and bias halves as the kernel would hold them (zero pads, quantized at that size)."""
    from moedispatch.numerics.padded import split_gate_up

    w13p, w2p, b13p, b2p, xp = _pad_layer(d, layout, hp, ip)
    gate, up = split_gate_up(quantize_w13(w13p, wspec, layout=layout), layout)
    w2f = dequantize_weight(quantize_weight(w2p, wspec)).clone()
    bg = bu = None
    if b13p is not None:
        bg, bu = ((b13p[:, 0::2], b13p[:, 1::2]) if layout == "interleaved" else (b13p[:, :ip], b13p[:, ip:]))
        bg, bu = bg.contiguous().clone(), bu.contiguous().clone()
    return dict(gate=gate, up=up, w2=w2f, bias_gate=bg, bias_up=bu, bias2=b2p, xp=xp)


def _kernel(ops, d, extents, act, aspec, h, i):
    from moedispatch.numerics.padded import padded_kernel_moe

    return padded_kernel_moe(ops["xp"], ops["gate"], ops["up"], ops["w2"], d["wts"], d["ids"], hidden=h,
                             intermediate=i, hidden_extent=extents[0], intermediate_extent=extents[1],
                             activation_scheme=aspec, activation=act, activation_params=params(act),
                             bias_gate=ops["bias_gate"], bias_up=ops["bias_up"], bias2=ops["bias2"])


@pytest.mark.parametrize("scheme", ["mxfp4-w4a4", "fp8-block", "fp8-tensor", "fp8fnuz-channel-token", "int4-w4a16",
                                    "bf16", "mxfp6-e3m2"])
@pytest.mark.parametrize("act", ["swigluoai", "swigluoai_uninterleave", "silu", "gelu"])
def test_padded_kernel_equals_fused_moe_bitwise_over_zero_pads(scheme, act):
    """Over zero pads the kernel view gives fused_moe's unpadded result bitwise at every extent from the logical
    size to the whole padded size (what 'compute', 'skip' and 'trim' read)."""
    wspec, aspec = SCHEMES[scheme]
    h, i, hp, ip = 80, 40, 128, 64  # partial MX blocks and fp8 tiles in the pads
    d = make(13, bias=True, h=h, i=i)
    layout = activation_layout(act)
    ref = fused_moe(d["x"], quantize_w13(d["w13"], wspec, layout=layout), quantize_weight(d["w2"], wspec), d["wts"],
                    d["ids"], weight_scheme=wspec, activation_scheme=aspec, activation=act,
                    activation_params=params(act), bias13=d["b13"], bias2=d["b2"])
    ops = _kernel_operands(d, layout, hp, ip, wspec)
    for extents in ((hp, ip), (h, i), (h + 16, ip), (hp, i + 8)):
        got = _kernel(ops, d, extents, act, aspec, h, i)
        assert got.shape == (T, h) and torch.equal(got, ref), extents


@pytest.mark.parametrize("act", ["swigluoai", "silu"])
def test_padded_kernel_reads_garbage_only_where_its_extent_reaches(act):
    """Garbage pads leave the logical extent exact; reading any of them (either axis) or stopping short of the
    logical size changes the output."""
    from moedispatch.numerics.padded import fill_pad_garbage_

    wspec, aspec = SCHEMES["mxfp4-w4a16"]
    h, i, hp, ip = 96, 64, 128, 96
    d = make(17, bias=True, h=h, i=i)
    layout = activation_layout(act)
    ops = _kernel_operands(d, layout, hp, ip, wspec)
    ref = _kernel(ops, d, (h, i), act, aspec, h, i)
    filled = fill_pad_garbage_(ops["gate"], ops["up"], ops["w2"], hidden=h, intermediate=i,
                               gen=torch.Generator().manual_seed(1), bias_gate=ops["bias_gate"],
                               bias_up=ops["bias_up"], bias2=ops["bias2"])
    assert filled == ["gate/up rows and w2 columns 64..95 (intermediate pad)",
                      "gate/up columns and w2 rows 96..127 (hidden pad)"]
    assert torch.isnan(ops["gate"][:, i, 0]).all() and torch.isnan(ops["w2"][:, 0, i]).all()
    assert not torch.isnan(ops["gate"][:, :i, :h]).any() and not torch.isnan(ops["w2"][:, :h, :i]).any()
    assert torch.equal(_kernel(ops, d, (h, i), act, aspec, h, i), ref)
    for extents in ((hp, ip), (hp, i), (h, ip), (h + 1, i), (h, i + 1)):
        assert torch.isnan(_kernel(ops, d, extents, act, aspec, h, i)).any(), extents
    for extents in ((h - 32, i), (h, i - 16)):
        short = _kernel(ops, d, extents, act, aspec, h, i)
        assert not torch.isnan(short).any() and not torch.equal(short, ref), extents


def test_padded_kernel_garbage_with_finite_values_still_shows_through_intermediate_pads():
    """Without the NaN marker, random garbage in the intermediate pads (gate/up rows and w2 columns) still changes
    the output: the check does not rest on NaN alone."""
    from moedispatch.numerics.padded import fill_pad_garbage_

    wspec, aspec = SCHEMES["bf16"]
    h, i, hp, ip = 96, 64, 96, 96
    d = make(19, h=h, i=i)
    ops = _kernel_operands(d, "halves", hp, ip, wspec)
    ref = _kernel(ops, d, (h, i), "silu", aspec, h, i)
    fill_pad_garbage_(ops["gate"], ops["up"], ops["w2"], hidden=h, intermediate=i,
                      gen=torch.Generator().manual_seed(2))
    for t in (ops["gate"], ops["up"], ops["w2"]):
        t.nan_to_num_(nan=3.0)
    got = _kernel(ops, d, (hp, ip), "silu", aspec, h, i)
    assert torch.isfinite(got).all() and rel_err(got, ref) > 0.1


def test_nonzero_pad_is_rejected():
    d = make(1)
    hp, ip = 128, 96
    w13p, w2p, _, _, xp = _pad_layer(d, "halves", hp, ip)
    pad = Padding(hidden=hp, intermediate_per_rank=ip, hidden_pad=hp - H, intermediate_pad=ip - I, zero_fill=True)
    kw = dict(weight_scheme="bf16", activation_scheme="bf16", padding=pad)
    fused_moe(xp, w13p, w2p, d["wts"], d["ids"], **kw)
    bad = w13p.clone()
    bad[int(d["ids"][0, 0]), ip + I + 3, 0] = 1.0  # garbage in the up half's pad rows
    with pytest.raises(ValueError, match="up rows"):
        fused_moe(xp, bad, w2p, d["wts"], d["ids"], **kw)
    bad2 = w2p.clone()
    bad2[int(d["ids"][0, 0]), 0, I] = 1.0
    with pytest.raises(ValueError, match="intermediate columns"):
        fused_moe(xp, w13p, bad2, d["wts"], d["ids"], **kw)
    with pytest.raises(ValueError, match="padding says"):
        fused_moe(xp, w13p[:, :, :H], w2p[:, :H], d["wts"], d["ids"], **kw)


class Recording:
    """Wraps a weight container and records every expert it hands out."""

    def __init__(self, inner, log, name):
        self.inner, self.log, self.name = inner, log, name

    @property
    def shape(self):
        return self.inner.shape

    def __getitem__(self, e):
        self.log.append((self.name, e))
        return self.inner[e]


def test_unrouted_experts_are_never_dequantized():
    e_count = 16
    d = make(2, e=e_count, t=4)
    ids = torch.tensor([[3, 11], [11, 3], [3, 5], [5, 11]])
    wts = torch.full((4, 2), 0.5)
    q13 = quantize_w13(d["w13"], "mxfp4")
    q2 = quantize_weight(d["w2"], "mxfp4")
    log: list = []
    tracker = DequantTracker()
    out = fused_moe(d["x"][:4], Recording(q13, log, "w13"), Recording(q2, log, "w2"), wts, ids,
                    weight_scheme="mxfp4", activation_scheme="mxfp4", tracker=tracker)
    assert sorted(log) == [("w13", 3), ("w13", 5), ("w13", 11), ("w2", 3), ("w2", 5), ("w2", 11)]
    assert tracker.experts("w13") == tracker.experts("w2") == {3, 5, 11}
    assert all(c == 1 for c in tracker.counts.values())  # each routed expert once per pass
    expert_bytes = (2 * I * H + H * I) * 4
    assert tracker.peak_bytes <= 2 * I * H * 4 < expert_bytes  # at most one expert's w13 alive at a time
    assert tracker.live_bytes == 0
    # same numbers as without the wrappers
    assert torch.equal(out, fused_moe(d["x"][:4], q13, q2, wts, ids, weight_scheme="mxfp4",
                                      activation_scheme="mxfp4"))


def test_float_weights_are_qdqd_lazily_per_routed_expert():
    d = make(3, e=10, t=2)
    ids = torch.tensor([[7, 2], [2, 7]])
    tracker = DequantTracker(hook=lambda name, e, n: seen.append((name, e)))
    seen: list = []
    fused_moe(d["x"][:2], d["w13"], d["w2"], torch.ones(2, 2), ids, weight_scheme="fp8",
              activation_scheme="fp8", tracker=tracker)
    assert {e for _, e in seen} == {2, 7}


def test_expert_parallel_slots_are_skipped():
    d = make(4)
    ids = d["ids"].clone()
    ids[0, 1] = -1
    ids[3, 0] = -1
    kw = dict(weight_scheme="mxfp4", activation_scheme="bf16")
    got = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], ids, **kw)
    wts = d["wts"].clone()
    wts[0, 1] = 0
    wts[3, 0] = 0
    ids2 = ids.clamp(min=0)
    assert torch.allclose(got, fused_moe(d["x"], d["w13"], d["w2"], wts, ids2, **kw), rtol=0, atol=0)
    with pytest.raises(ValueError, match="only 6 experts"):
        fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"] + E, **kw)


def test_shared_expert_adds_a_dense_mlp():
    d = make(6)
    g = torch.Generator().manual_seed(9)
    sw13 = torch.randn(2 * 32, H, generator=g) / H ** 0.5
    sw2 = torch.randn(H, 32, generator=g) / 32 ** 0.5
    kw = dict(weight_scheme="fp8", activation_scheme="fp8", activation="swigluoai_uninterleave",
              activation_params=SWIGLU)
    base = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], **kw)
    both = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], shared_w13=sw13, shared_w2=sw2, **kw)
    a1 = qdq_activation(d["x"], "fp8").double()
    ws13 = dequantize_weight(quantize_w13(sw13.unsqueeze(0), "fp8"))[0].double()
    ws2 = dequantize_weight(quantize_weight(sw2.unsqueeze(0), "fp8"))[0].double()
    h = apply_activation(a1 @ ws13[:32].T, a1 @ ws13[32:].T, "swigluoai_uninterleave", SWIGLU)
    shared = qdq_activation(h.float(), "fp8").double() @ ws2.T
    assert rel_err(both - base, shared) < 1e-5


def test_raw_codes_and_scales():
    d = make(7)
    q13, q2 = quantize_weight(d["w13"], "mxfp4"), quantize_weight(d["w2"], "mxfp4")
    kw = dict(weight_scheme="mxfp4", activation_scheme="mxfp4")
    a = fused_moe(d["x"], q13, q2, d["wts"], d["ids"], **kw)
    b = fused_moe(d["x"], q13.codes, q2.codes, d["wts"], d["ids"], w13_scale=q13.scales, w2_scale=q2.scales, **kw)
    assert torch.equal(a, b)
    f13, f2 = quantize_weight(d["w13"], "fp8"), quantize_weight(d["w2"], "fp8")
    a = fused_moe(d["x"], f13, f2, d["wts"], d["ids"], weight_scheme="fp8", activation_scheme="fp8")
    b = fused_moe(d["x"], f13.data, f2.data, d["wts"], d["ids"], w13_scale=f13.scale, w2_scale=f2.scale,
                  weight_scheme="fp8", activation_scheme="fp8")
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="need w13_scale"):
        fused_moe(d["x"], f13.data, f2.data, d["wts"], d["ids"], weight_scheme="fp8", activation_scheme="fp8")


def test_static_activation_scale_and_bad_inputs():
    d = make(8)
    kw = dict(weight_scheme="fp8", activation_scheme="fp8")
    out = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], a13_scale=0.05, a2_scale=0.01, **kw)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="unknown activation"):
        fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], activation="relu", **kw)
    with pytest.raises(ValueError, match="hidden_states"):
        fused_moe(d["x"][:, :10], d["w13"], d["w2"], d["wts"], d["ids"], **kw)
    with pytest.raises(ValueError, match="w13 shape"):
        fused_moe(d["x"], d["w13"][:, :10], d["w2"], d["wts"], d["ids"], **kw)


def test_swigluoai_formula():
    g = torch.tensor([-10.0, 0.0, 1.0, 9.0])
    u = torch.tensor([-9.0, 2.0, 0.5, 9.0])
    got = apply_activation(g, u, "swigluoai", {"alpha": 1.702, "limit": 7.0})
    gc = torch.tensor([-10.0, 0.0, 1.0, 7.0])
    uc = torch.tensor([-7.0, 2.0, 0.5, 7.0])
    assert torch.equal(got, gc * torch.sigmoid(1.702 * gc) * (uc + 1))
    assert torch.equal(apply_activation(g, u, "swigluoai"), apply_activation(g, u, "swigluoai_uninterleave", SWIGLU))
    # the interleaved layout reads gate from even rows, up from odd rows
    assert activation_layout("swigluoai") == "interleaved" and activation_layout("swigluoai_uninterleave") == "halves"


def test_gateup_container_layouts():
    w = torch.randn(2, 8, 32)
    for layout in ("halves", "interleaved"):
        q = quantize_w13(w, "mxfp8", layout=layout)
        assert isinstance(q, GateUp) and q.shape == (2, 8, 32)
        assert torch.equal(dequantize_weight(q)[1], dequantize_weight(q[1]))
        assert rel_err(dequantize_weight(q), w) < 0.1


# -- routing -----------------------------------------------------------------------------------------------------
def test_softmax_topk():
    logits = torch.randn(5, 8)
    w, ids = softmax_topk(logits, 3)
    ref = torch.softmax(logits, -1).topk(3, -1)
    assert torch.equal(ids, ref.indices)
    assert torch.allclose(w.sum(-1), torch.ones(5))
    w2, _ = softmax_topk(logits, 3, renormalize_weights=False, routed_scaling_factor=2.0)
    assert torch.allclose(w2, ref.values * 2)


def test_sigmoid_topk_with_bias_and_groups():
    logits = torch.randn(4, 16)
    bias = torch.zeros(16)
    bias[5] = 100.0  # always chosen, weight still its unbiased score
    w, ids = sigmoid_topk(logits, 2, correction_bias=bias, routed_scaling_factor=2.5)
    assert (ids == 5).any(dim=1).all()
    s = torch.sigmoid(logits)
    assert torch.allclose(w, s.gather(1, ids) / s.gather(1, ids).sum(-1, keepdim=True) * 2.5)
    wg, idg = grouped_topk(logits, 2, num_expert_group=4, topk_group=1, scoring="sigmoid", correction_bias=bias)
    assert ((idg // 4) == 1).all()  # only the group holding expert 5 survives
    ws, ids_s = grouped_topk(logits, 2, num_expert_group=4, topk_group=2)
    assert ids_s.shape == (4, 2) and torch.allclose(ws.sum(-1), torch.ones(4))
    r = route(logits, 2, scoring="sigmoid", correction_bias=bias)
    assert torch.equal(r[1], sigmoid_topk(logits, 2, correction_bias=bias)[1])
    assert torch.allclose(renormalize(torch.tensor([[1.0, 3.0]])), torch.tensor([[0.25, 0.75]]))
    assert apply_routed_scaling(w, None) is w
    with pytest.raises(ValueError):
        route(logits, 2, scoring="softmax", correction_bias=bias)


# -- runner ------------------------------------------------------------------------------------------------------
def test_emulation_runner_matches_fused_moe():
    layer = MoELayer.build(hidden=H, intermediate=2 * I, experts=E, top_k=K, tp=2,
                           activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0},
                           weight="mxfp4", act="mxfp4")
    d = make(10)
    runner = EmulationRunner(layer).prepare({"w13": d["w13"], "w2": d["w2"]})
    assert isinstance(runner.weights["w13"], GateUp)  # quantized once in prepare
    got = runner.run(d["x"], d["wts"], d["ids"])
    ref = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], weight_scheme="mxfp4",
                    activation_scheme="mxfp4", activation="swigluoai_uninterleave", activation_params=SWIGLU)
    assert torch.equal(got, ref)
    with pytest.raises(ValueError, match="unknown weight keys"):
        EmulationRunner(layer).prepare({"w13": d["w13"], "w2": d["w2"], "w4": 1})
    with pytest.raises(RuntimeError):
        EmulationRunner(layer).run(d["x"], d["wts"], d["ids"])
    assert isinstance(get_runner("emulation", layer), EmulationRunner)
    with pytest.raises(RunnerUnavailable, match="aiter-ck"):
        get_runner("aiter-ck", layer)
    register_runner("test-fake", lambda lyr: EmulationRunner(lyr))
    assert isinstance(get_runner("test-fake", layer), EmulationRunner)


def test_reference_moe_unquantized_close_to_float32():
    d = make(11)
    out = fused_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], weight_scheme=QuantSpec("bf16"),
                    activation_scheme=QuantSpec("bf16"))
    ref, _ = reference_moe(d["x"], d["w13"], d["w2"], d["wts"], d["ids"], activation="silu")
    assert rel_err(out, ref) < 2e-2  # bf16 rounding of weights and activations only
