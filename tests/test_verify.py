"""run_verify: the three checks, MiniMax-M3-MXFP4 TP8 on CPU, skipped backends, fresh data, progress lines."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from moedispatch.backend import Padding  # noqa: E402
from moedispatch.errors import UsageError  # noqa: E402
from moedispatch.layers import MoELayer, QuantSpec  # noqa: E402
from moedispatch.verify import CHECK_NAMES, run_verify  # noqa: E402


def minimax_m3_tp8() -> MoELayer:
    return MoELayer.build(index=3, hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8,
                          activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0},
                          weight="mxfp4", act="mxfp4", model="amd/MiniMax-M3-MXFP4")


def test_minimax_m3_mxfp4_tp8_on_cpu():
    layer = minimax_m3_tp8()
    assert layer.intermediate_per_rank == 384
    padding = Padding.aligned(layer, hidden_multiple=256, intermediate_multiple=256, kernel_intermediate_pad=0)
    assert padding.intermediate_per_rank == 512
    lines: list[str] = []
    idle = os.getloadavg()[0] < 1.0  # other processes on the 2 cores make torch's thread pool crawl
    t0 = time.perf_counter()
    checks = run_verify(layer, padding, backend="emulation", progress=lines.append)
    elapsed = time.perf_counter() - t0
    assert [c["name"] for c in checks] == list(CHECK_NAMES)
    assert all(set(c) == {"name", "passed", "detail"} for c in checks)
    assert all(c["passed"] is True for c in checks), checks
    assert "384->512" in checks[0]["detail"] and "bitwise" in checks[0]["detail"]
    assert "relative error" in checks[2]["detail"]
    assert lines and all(isinstance(s, str) for s in lines)
    if idle:
        assert elapsed < 50, elapsed  # typically ~10 s on 2 idle cores


def test_other_backend_is_skipped_on_cpu():
    layer = MoELayer.build(hidden=256, intermediate=192, experts=8, top_k=2, tp=1, weight="fp8", act="fp8")
    checks = run_verify(layer, Padding.aligned(layer, intermediate_multiple=128), backend="aiter-ck", seed=1)
    b = checks[1]
    assert b["name"] == "backend_vs_reference" and b["passed"] is None and b["detail"].startswith("skipped: ")
    assert "aiter-ck" in b["detail"]
    assert checks[0]["passed"] is True and checks[2]["passed"] is True


@pytest.mark.parametrize("weight,act,activation,bias", [
    ("fp8", "fp8", "silu", False),
    ("bf16", "bf16", "gelu", False),
    ("mxfp4", "bf16", "swigluoai", True),          # gpt-oss style: interleaved gate/up, biases
    (QuantSpec("fp8", "block128x128", "fp32", fmt="e4m3fnuz"), QuantSpec("fp8", "block128x128", "fp32", True,
                                                                         "e4m3fnuz"), "silu", False),
    (QuantSpec("int4", "group128", "fp32"), "bf16", "silu", False),
])
def test_schemes_and_padding(weight, act, activation, bias):
    layer = MoELayer.build(hidden=360, intermediate=720, experts=16, top_k=3, tp=2, activation=activation,
                           has_bias=bias, weight=weight, act=act)
    padding = Padding.aligned(layer, hidden_multiple=128, intermediate_multiple=128)
    assert padding.padded
    checks = run_verify(layer, padding, backend="emulation", tokens=5)
    assert all(c["passed"] is True for c in checks), checks


def test_seed_reproducible_and_fresh_by_default():
    layer = MoELayer.build(hidden=128, intermediate=64, experts=4, top_k=2, weight="mxfp4", act="mxfp4")
    pad = Padding.none(layer)
    a = run_verify(layer, pad, backend="emulation", seed=42)
    b = run_verify(layer, pad, backend="emulation", seed=42)
    strip = lambda cs: [c["detail"].split("(information")[0] for c in cs]  # noqa: E731 - drop the timing
    assert strip(a) == strip(b)
    c = run_verify(layer, pad, backend="emulation")
    d = run_verify(layer, pad, backend="emulation")
    assert c[0]["detail"] != d[0]["detail"]  # different OS-random seeds
    assert "no padding" in a[0]["detail"]


def test_bad_arguments_and_dense_layers():
    layer = MoELayer.build(hidden=128, intermediate=64, experts=4, top_k=2)
    with pytest.raises(UsageError):
        run_verify(layer, Padding(hidden=256, intermediate_per_rank=64), backend="emulation")
    with pytest.raises(UsageError):
        run_verify(layer, Padding.none(layer), backend="emulation", tokens=0)
    dense = MoELayer.build(kind="dense", hidden=128, intermediate=64)
    checks = run_verify(dense, Padding.none(dense), backend="emulation")
    assert all(c["passed"] is None and c["detail"].startswith("skipped: ") for c in checks)
