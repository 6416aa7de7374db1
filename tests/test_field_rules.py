"""Rules and data the field corpus motivated (issue 15), each pinned on its motivating case and at its boundary.

- FlyDSL a8w4 native I384 (capability_db/aiter.toml ``flydsl_a8w4_inter128``, plugins/aiter_flydsl.py
  ``NarrowingCombo``): sgl-project/sglang#31450 runs DeepSeek-V4-Pro W4A8 at TP8 unpadded (384/rank) with
  ROCm/aiter#4130, first tagged in v0.1.18; older AITER keeps padding to 512.
- ROCm/aiter#2059 (capability_db/known_issues.toml + dispatch_issues.toml): GLM-5 BF16 TP8 on MI355X crashes in the
  untuned CK 2-stage default at bucket 1024 once SGLang serves 17+ concurrent 1000-token prompts.
- sgl-project/sglang#23084: an engine bug (sgl-project/sglang#26845), kept as a documented divergence.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moedispatch import select_moe_backend
from moedispatch.data import capdb
from moedispatch.aiter.dispatch import plan_dispatch
from moedispatch.testing import fake_capabilities, layer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CASES = {c["id"]: c for c in tomllib.loads(
    (Path(__file__).parent / "field" / "cases.toml").read_text(encoding="utf-8"))["case"]}

DSV4_W4A8 = dict(hidden_size=7168, intermediate_size=3072, num_experts=384, top_k=6, weight_quant="mxfp4",
                 activation_quant="fp8", activation_granularity="group32", model_type="deepseek_v4")
GLM5_BF16 = dict(hidden_size=6144, intermediate_size=2048, num_experts=256, top_k=8, weight_quant="bf16",
                 activation_quant="bf16", model_type="glm_moe_dsa")


def _decide(product: str, aiter: str | None, tp: int = 8, ep: int = 1, **fields):
    return select_moe_backend(caps=fake_capabilities(product, aiter), tp_size=tp, ep_size=ep, **fields)


def _texts(d) -> list[str]:
    return [r.text for r in d.reasons]


# -- FlyDSL a8w4 native I384 -----------------------------------------------------------------------------------

def test_the_native_i384_floor_is_data_read_from_aiter_toml():
    info = capdb.feature_info("flydsl_a8w4_inter128")
    assert info["since"] == "0.1.18"
    assert "ROCm/aiter#4130" in info["cite"] and "sgl-project/sglang#31450" in info["cite"]


@pytest.mark.parametrize("aiter", ["0.1.18", "0.1.19", "0.1.20.post1", None])
def test_dsv4_w4a8_tp8_runs_384_unpadded_on_flydsl_from_aiter_0_1_18(aiter):
    """sgl-project/sglang#31450: '384 stays 384 instead of 512' on FlyDSL with ROCm/aiter#4130 (v0.1.18+)."""
    d = _decide("MI355X", aiter, **DSV4_W4A8)
    assert d.backend == "aiter-flydsl"
    assert d.padding.intermediate_per_rank == 384 and d.padding.intermediate_pad == 0
    assert not d.padding.padded
    note = next(r for r in d.reasons if "runs unpadded" in r.text)
    assert "ROCm/aiter#4130" in note.source and note.kind == "note"


@pytest.mark.parametrize("aiter", ["0.1.15.post3", "0.1.16.post5", "0.1.17"])
def test_older_aiter_keeps_padding_dsv4_w4a8_to_512(aiter):
    """Before ROCm/aiter#4130 the gate/up-interleaved scale shuffle needs K/32 % 8 == 0: 384 pads to 512."""
    d = _decide("MI355X", aiter, **DSV4_W4A8)
    assert d.backend == "aiter-flydsl"
    assert d.padding.intermediate_per_rank == 512
    assert any(f"AITER {aiter} < 0.1.18" in t for t in _texts(d))


def test_the_narrower_alignment_is_a8w4_only():
    """The source is FlyDSL afp8_wfp4 (DeepSeek-V4 W4A8): the feature's note is a8w4-only. MXFP4 activations (a4w4)
    keep the family table's 256 alignment; 384 is then kept only because AITER's dispatch at 384 runs FlyDSL kernels
    whose tiles divide it (issue 23), which the padding note says instead."""
    d = _decide("MI355X", None, force="aiter-flydsl", **{**DSV4_W4A8, "activation_quant": "mxfp4"})
    assert d.backend == "aiter-flydsl"
    assert not any("runs unpadded" in t for t in _texts(d))
    assert d.padding.intermediate_per_rank == 384
    assert any("not the family table's 7168 × 512" in t and "tile_k 128" in t for t in _texts(d))


def test_multiples_of_256_are_unaffected_and_odd_multiples_of_64_pad_to_128():
    """TP4 (768 = 3 x 256) needs no note either way; 320 pads to the next multiple of 128 (384), not 512."""
    tp4 = _decide("MI355X", None, tp=4, **DSV4_W4A8)
    assert tp4.padding.intermediate_per_rank == 768 and not any("runs unpadded" in t for t in _texts(tp4))
    odd = _decide("MI355X", None, **{**DSV4_W4A8, "intermediate_size": 2560})
    assert odd.padding.intermediate_per_rank == 384
    assert _decide("MI355X", "0.1.17", **{**DSV4_W4A8, "intermediate_size": 2560}).padding.intermediate_per_rank == 512


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
