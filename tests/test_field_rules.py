"""Rules and data the field corpus motivated (issue 15), each pinned on its motivating case and at its boundary.

- ROCm/aiter#2059 (capability_db/known_issues.toml + dispatch_issues.toml): GLM-5 BF16 TP8 on MI355X crashes in the
  untuned CK 2-stage default at bucket 1024 once SGLang serves 17+ concurrent 1000-token prompts.
- sgl-project/sglang#23084: an engine bug (sgl-project/sglang#26845), kept as a documented divergence.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moedispatch import select_moe_backend
from moedispatch.aiter_dispatch import plan_dispatch
from moedispatch.testing import fake_capabilities, layer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CASES = {c["id"]: c for c in tomllib.loads(
    (Path(__file__).parent / "field" / "cases.toml").read_text(encoding="utf-8"))["case"]}

GLM5_BF16 = dict(hidden_size=6144, intermediate_size=2048, num_experts=256, top_k=8, weight_quant="bf16",
                 activation_quant="bf16", model_type="glm_moe_dsa")


def _decide(product: str, aiter: str | None, tp: int = 8, ep: int = 1, **fields):
    return select_moe_backend(caps=fake_capabilities(product, aiter), tp_size=tp, ep_size=ep, **fields)


# -- ROCm/aiter#2059: GLM-5 BF16 TP8 on MI355X -------------------------------------------------------------------

def _caveats(d, issue: str):
    return [r for r in d.reasons if r.issue and issue in r.issue and r.kind in ("caveat", "warning")]


def test_glm5_bf16_tp8_on_mi355x_carries_the_2059_caveat():
    d = _decide("MI355X", None, **GLM5_BF16)
    assert d.backend == "aiter-ck"  # a caveat, not a rejection: the issue shows 16 concurrent requests working
    [caveat] = _caveats(d, "aiter#2059")
    assert caveat.confidence == "derived" and "ROCm/aiter#2059" in caveat.source
    assert "M in [616]" in caveat.text


@pytest.mark.parametrize("product, tp", [("MI355X", 4), ("MI300X", 8)])
def test_the_2059_caveat_stops_at_other_shapes_and_arches(product, tp):
    """TP4 runs inter_dim 512, gfx942 another default: the report does not reach them."""
    assert _caveats(_decide(product, None, tp=tp, **GLM5_BF16), "aiter#2059") == []


def test_the_2059_dispatch_issue_is_keyed_on_bucket_1024():
    """The 616-token prefill remainder (17 x 1000 - 16384) pads to bucket 1024: hit; 512 and 2048 are not."""
    la = layer(tp_size=8, ep_size=1, **GLM5_BF16)
    caps = fake_capabilities("MI355X", None)
    hits = plan_dispatch(la, caps, tokens=(512, 616, 2048)).issues
    hit = next(h for h in hits if h.issue == "ROCm/aiter#2059")
    assert (hit.tokens, hit.bucket, hit.severity) == ((616, 616), 1024, "warning")
    assert not [h for h in plan_dispatch(la, caps, tokens=(512, 2048)).issues if h.issue == "ROCm/aiter#2059"]


# -- sgl-project/sglang#23084: a documented divergence -------------------------------------------------------

def test_qwen35_fp8_fse_row_is_an_engine_divergence_not_a_kernel_caveat():
    case = CASES["sglang23084-qwen3.5-fp8-mi355x-tp2-ep2-fse"]
    assert "https://github.com/sgl-project/sglang/pull/26845" in case["divergence"]
    d = _decide("MI355X", None, tp=2, ep=2, hidden_size=4096, intermediate_size=1024, num_experts=512, top_k=10,
                weight_quant="fp8", activation_quant="fp8", weight_granularity="block128x128",
                activation_granularity="group128", model_type="qwen3_5_moe_text")
    assert d.backend in ("aiter-ck", "aiter-asm")
    assert not any(r.issue and "23084" in r.issue for r in d.reasons)
