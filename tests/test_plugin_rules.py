"""Rules inside the built-in plugins, each on its motivating case and its boundary (the plugin's own check, called
directly so a changed line turns a test red).

CK swiglu_oai: AITER's CK 2-stage codegen has swiglu instances only for plain fp8 (per-tensor / per-channel weights,
per-tensor / per-token activations), from AITER 0.1.19.post1 (ROCm/aiter#3886).
"""

from __future__ import annotations

import pytest

from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.testing import fake_capabilities


@pytest.fixture(scope="module")
def ck():
    from moedispatch.selector.plugins import build_registry

    return build_registry().get("aiter-ck")


def _layer(weight, act, activation="swigluoai"):
    return MoELayer.build(hidden=2880, intermediate=2880, experts=32, top_k=4, tp=1, weight=weight, act=act,
                          activation=activation)


def _swiglu(ck, layer, aiter):
    caps = fake_capabilities("gfx950", aiter)
    return [r.text for r in ck.extra_checks(layer, caps, None) if "swiglu" in r.text]


@pytest.mark.parametrize("w,a", [(("fp8", "tensor"), ("fp8", "tensor")), (("fp8", "channel"), ("fp8", "token")),
                                 (("fp8", "tensor"), ("fp8", "token")), (("fp8", "channel"), ("fp8", "tensor"))])
def test_plain_fp8_swiglu_runs_on_ck_from_0_1_19_post1(ck, w, a):
    layer = _layer(QuantSpec(*w), QuantSpec(*a))
    assert _swiglu(ck, layer, "0.1.19.post1") == []
    assert _swiglu(ck, layer, "0.1.20.post1") == []
    assert _swiglu(ck, layer, "0.1.19") == [
        "CK fp8 swiglu_oai needs AITER >= 0.1.19.post1 (ROCm/aiter#3886); target AITER is 0.1.19"]
    failed = [r for r in ck.extra_checks(layer, fake_capabilities("gfx950", "0.1.19"), None) if "swiglu" in r.text]
    assert failed[0].kind == "failed" and failed[0].source.startswith("ROCm/aiter#3886; ROCm/aiter@v0.1.20:")


@pytest.mark.parametrize("w,a", [(("fp8", "block128x128"), ("fp8", "group128")), (("fp8", "tensor"), ("bf16",)),
                                 (("bf16",), ("bf16",)), (("fp8", "block128x128"), ("fp8", "tensor")),
                                 (("fp8", "tensor"), ("fp8", "group128"))])
def test_other_quants_have_no_ck_swiglu_at_any_aiter(ck, w, a):
    layer = _layer(QuantSpec(*w), QuantSpec(*a))
    for aiter in ("0.1.19", "0.1.20.post1"):
        (text,) = _swiglu(ck, layer, aiter)
        assert text == (f"CK 2-stage kernels for {layer.weight.describe()} × {layer.act.describe()} implement silu "
                        "and gelu only; CK's swiglu_oai instances exist only for plain fp8 (per_tensor / per_token)")


def test_silu_is_not_touched_by_the_swiglu_rule(ck):
    assert _swiglu(ck, _layer(QuantSpec("fp8", "block128x128"), QuantSpec("fp8", "group128"), "silu"), "0.1.19") == []
