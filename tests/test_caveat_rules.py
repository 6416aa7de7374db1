"""The layer caveats of moedispatch/kit/caveats.py, pinned word for word on the cases that motivated them.

[scale tiles]: Qwen3-235B-FP8 at TP8 (192/rank splits 128×128 scale tiles; vLLM refines to 64, SGLang pads to 128:
sgl-project/sglang#18684). [scale groups]: gpt-oss at TP8 (360/rank cuts MX groups of 32; vLLM's gpt_oss.py).
[pad ratio]: GLM-5.1-MXFP4 at CPX TP64 (32/rank padded to 256 = 8×; expert parallelism keeps experts whole).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from moedispatch.kit.caveats import PAD_RATIO, PAD_RATIO_MIN, SCALE_GROUPS, SCALE_TILES, ep_alternative_layer, \
    pad_ratio_caveat, shard_caveats
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.core.reason import Reason

_FP8 = dict(weight=QuantSpec("fp8", "block128x128"), act="fp8")
_TILES_SRC = ("vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/fp8.py (refine_fp8_moe_block_shape, "
              "pad_tp_shard_to_weight_blocks); vllm-project/vllm@v0.33.0:vllm/model_executor/layers/quantization/utils/"
              "fp8_utils.py (validate_fp8_block_shape_moe); https://github.com/sgl-project/sglang/pull/18684; "
              "https://github.com/sgl-project/sglang/pull/21097")
_SGLANG = "SGLang accepts the shape on AITER with 128-padding (GSM8K 0.980 for Qwen3-235B-FP8 at TP8)"


def _only(layer):
    out = shard_caveats(layer)
    assert len(out) == 1, out
    return out[0]


def test_scale_tiles_refined_to_64_with_the_ep_alternative():
    r = _only(MoELayer.build(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=8, **_FP8))
    assert r == Reason(
        "caveat [scale tiles]: the TP shard 192 of intermediate 1536 splits the checkpoint's 128×128 scale tiles. "
        "vLLM 0.33 refines the scale blocks to 64 and then only its Triton MoE takes them: VLLM_ROCM_USE_AITER=1 with "
        "--moe-backend auto raises, and --moe-backend aiter pads the shard to 128 (only when the global dims are "
        f"128-aligned); {_SGLANG}. Safer: expert parallelism (--ep 8) keeps every expert whole (1536 = 12×128)",
        "caveat", _TILES_SRC, SCALE_TILES, "confirmed")


def test_scale_tiles_below_a_32_block_are_refused_by_vllm_and_no_ep_line_when_experts_are_not_whole_blocks():
    r = _only(MoELayer.build(hidden=4096, intermediate=1552, experts=128, top_k=8, tp=8, **_FP8))
    assert r.text == (
        "caveat [scale tiles]: the TP shard 194 of intermediate 1552 splits the checkpoint's 128×128 scale tiles. "
        "vLLM 0.33 refuses this shape at weight creation (no scale block of at least 32 divides the shard and hidden: "
        f"gcd = 2); {_SGLANG}")
    assert (r.kind, r.issue) == ("caveat", SCALE_TILES)


def test_scale_tiles_at_the_32_boundary_are_refined_not_refused():
    # shard 160 = 5×32: gcd(128, 160, 4096) = 32, the smallest block vLLM refines to
    r = _only(MoELayer.build(hidden=4096, intermediate=1280, experts=128, top_k=8, tp=8, **_FP8))
    assert "refines the scale blocks to 32" in r.text and "1280 = 10×128" in r.text


@pytest.mark.parametrize("fields", [
    dict(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=1, **_FP8),           # not sharded
    dict(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=8, ep=8, **_FP8),     # experts whole
    dict(hidden=4096, intermediate=2048, experts=128, top_k=8, tp=8, **_FP8),           # 256/rank: whole tiles
    dict(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=8),                   # bf16: no scale tiles
    dict(hidden=2880, intermediate=2560, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16"),  # 320 = 10 groups
])
def test_no_caveat_where_nothing_is_split(fields):
    assert shard_caveats(MoELayer.build(**fields)) == ()


def test_scale_groups_of_gpt_oss_at_tp8():
    r = _only(MoELayer.build(hidden=2880, intermediate=2880, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16"))
    assert r == Reason(
        "caveat [scale groups]: the TP shard 360 of intermediate 2880 is not a multiple of the 32-element MX scale "
        "group, so an even split cuts E8M0 groups of w2; the loader must shard in whole groups (vLLM's gpt_oss.py "
        "slices cdiv(I/32, tp)*32 per rank) or use expert parallelism", "caveat",
        "https://github.com/vllm-project/vllm/blob/017e9f4448/vllm/model_executor/models/gpt_oss.py", SCALE_GROUPS,
        "confirmed")


def test_ep_alternative_layer():
    layer = MoELayer.build(hidden=6144, intermediate=2048, experts=256, top_k=8, tp=64, weight="mxfp4", act="mxfp4")
    alt = ep_alternative_layer(layer)
    assert (alt.ep, alt.moe_tp, alt.intermediate_per_rank, alt.experts_per_rank) == (64, 1, 2048, 4)
    assert alt.hidden == 6144 and alt.tp == 64
    assert ep_alternative_layer(MoELayer.build(hidden=64, intermediate=64, experts=8, top_k=2, tp=1)) is None
    assert ep_alternative_layer(MoELayer.build(hidden=64, intermediate=640, experts=8, top_k=2, tp=5)) is None
    assert ep_alternative_layer(MoELayer.build(hidden=64, intermediate=640, experts=8, top_k=2, tp=8, ep=8)) is None
    assert ep_alternative_layer(MoELayer.build(hidden=64, intermediate=640, experts=8, top_k=2, tp=8)).ep == 8


# -- pad ratio ------------------------------------------------------------------------------------------------------

_GLM = MoELayer.build(hidden=6144, intermediate=2048, experts=256, top_k=8, tp=64, weight="mxfp4", act="mxfp4")
_RULE = Reason("aiter-ck pads to 256", "padding", "ROCm/aiter@v0.1.15.post3:csrc/x.cuh")


def _cost(tokens, us):
    return SimpleNamespace(tokens=tokens, us=us, low=us * 0.5, high=us * 2)


def _decision(layer, alloc, backend="aiter-ck", reasons=(_RULE,), cost=(), padded=True):
    return SimpleNamespace(layer=layer, backend=backend, reasons=reasons, cost=cost,
                           padding=SimpleNamespace(intermediate_per_rank=alloc, padded=padded))


def test_pad_ratio_text_bytes_source_and_boundary():
    r = pad_ratio_caveat(_decision(_GLM, 256), 535 * 2**20 + 2**19)
    assert r == Reason("caveat [pad ratio]: aiter-ck pads intermediate/rank 32→256 (8× the shard of 2048 at MoE TP 64): "
                       "87.5% of every expert's w13/w2 weights, weight reads and GEMM work is zero pad "
                       "(+535.5 MiB/rank per layer)", "caveat", "ROCm/aiter@v0.1.15.post3:csrc/x.cuh", PAD_RATIO,
                       "derived")
    assert PAD_RATIO_MIN == 4
    assert pad_ratio_caveat(_decision(_GLM, 128)).text.startswith(
        "caveat [pad ratio]: aiter-ck pads intermediate/rank 32→128 (4× the shard")       # exactly 4×: said
    assert "MiB" not in pad_ratio_caveat(_decision(_GLM, 128)).text                      # no bytes given: none said
    assert pad_ratio_caveat(_decision(_GLM, 127)) is None                                 # under 4×: quiet
    assert pad_ratio_caveat(_decision(_GLM, 256, backend=None)) is None                   # no backend: nothing padded
    assert pad_ratio_caveat(_decision(_GLM, 256, reasons=())).source is None
    dense = SimpleNamespace(kind="dense", intermediate_per_rank=32, intermediate=2048, moe_tp=64, tp=64)
    assert pad_ratio_caveat(_decision(dense, 256)) is None


def test_pad_ratio_names_expert_parallelism_with_predicted_costs():
    alt_layer = ep_alternative_layer(_GLM)
    d = _decision(_GLM, 256, cost=(_cost(1, 21.0), _cost(64, 30.0), _cost(4096, 724.0)))
    alt = _decision(alt_layer, 2048, cost=(_cost(1, 15.0), _cost(64, 20.0), _cost(4096, 160.0)), padded=False)
    r = pad_ratio_caveat(d, 0, alt)
    assert r.text.endswith(
        "is zero pad. Expert parallelism (--ep 64) keeps every expert whole: 4 experts × intermediate 2048 per rank on "
        "aiter-ck, unpadded (predicted per layer 15 µs (7.5–30) vs 21 µs (10–42) at 1 token; 160 µs (80–320) vs "
        "724 µs (362–1,448) at 4096 tokens)")
    one = pad_ratio_caveat(_decision(_GLM, 256, cost=(_cost(64, 30.0),)), 0,
                           _decision(alt_layer, 2048, cost=(_cost(64, 20.0),), padded=False))
    assert one.text.endswith("unpadded (predicted per layer 20 µs (10–40) vs 30 µs (15–60) at 64 tokens)")
    no_cost = pad_ratio_caveat(_decision(_GLM, 256), 0, _decision(alt_layer, 2048, padded=False))
    assert no_cost.text.endswith("on aiter-ck, unpadded")
    padded_alt = pad_ratio_caveat(_decision(_GLM, 256), 0, _decision(alt_layer, 2304, padded=True))
    assert padded_alt.text.endswith("on aiter-ck, intermediate 2048→2304")
    # an alternative no better (9× ≥ 8×) or without a backend is not offered
    assert "Expert parallelism" not in pad_ratio_caveat(_decision(_GLM, 256), 0,
                                                        _decision(alt_layer, 2048 * 9, padded=True)).text
    assert "Expert parallelism" not in pad_ratio_caveat(_decision(_GLM, 256), 0,
                                                        _decision(alt_layer, 2048, backend=None)).text


def test_glm51_mxfp4_cpx_tp64_plan_carries_the_pad_ratio_caveat_once_per_group():
    from moedispatch.sources.models import load_model
    from moedispatch.plan.plan import plan_model
    from moedispatch.core.workload import Runtime
    from moedispatch.testing import fake_capabilities

    plan = plan_model(load_model("GLM-5.1-MXFP4"), fake_capabilities("MI355X:CPX", "0.1.20.post1"), 64, 1,
                      runtime=Runtime.build((1, 4096), env={}))
    hits = [w for w in plan.warnings if w.issue == PAD_RATIO]
    assert len(hits) == 1
    assert re.search(r"^75 MoE layer\(s\) \(3–77\): caveat \[pad ratio\]: aiter-flydsl pads intermediate/rank 32→128 "
                     r"\(4× the shard of 2048 at MoE TP 64\).*\(\+229\.5 MiB/rank per layer\)\. Expert parallelism "
                     r"\(--ep 64\) keeps every expert whole: 4 experts × intermediate 2048 per rank on aiter-\w+, "
                     r"unpadded \(predicted per layer .* at 1 token; .* at 4096 tokens\)$", hits[0].text), hits[0].text
    assert hits[0].kind == "warning" and hits[0].confidence == "derived"  # a plan warning, as the other caveats
    whole = plan_model(load_model("GLM-5.1-MXFP4"), fake_capabilities("MI355X:CPX", "0.1.20.post1"), 64, 64)
    assert not any(w.issue == PAD_RATIO for w in whole.warnings)


# -- boundaries: non-square scale blocks, MoE TP 1 and 2, degenerate shards --------------------------------------------

def test_non_square_scale_blocks_use_each_dimension_where_it_applies():
    """block 64×128 (vLLM's weight_block_size [block_n, block_k]): the shard is checked against both dims, the
    refined block is the gcd with the first (and the hidden), the EP line counts first-dim blocks."""
    b64 = QuantSpec("fp8", "block64x128")
    r = _only(MoELayer.build(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=8, weight=b64, act="fp8"))
    assert r.text.startswith("caveat [scale tiles]: the TP shard 192 of intermediate 1536 splits the checkpoint's "
                             "64×128 scale tiles. vLLM 0.33 refines the scale blocks to 64 and then only its Triton "
                             "MoE takes them: VLLM_ROCM_USE_AITER=1 with --moe-backend auto raises, and --moe-backend "
                             "aiter pads the shard to 64 (only when the global dims are 64-aligned)")
    assert r.text.endswith("(--ep 8) keeps every expert whole (1536 = 24×64)")
    r = _only(MoELayer.build(hidden=4096, intermediate=1600, experts=128, top_k=8, tp=8, weight=b64, act="fp8"))
    assert "gcd = 8" in r.text and r.text.endswith("(1600 = 25×64)")
    b128x64 = QuantSpec("fp8", "block128x64")
    r = _only(MoELayer.build(hidden=4096, intermediate=1536, experts=128, top_k=8, tp=8, weight=b128x64, act="fp8"))
    assert "splits the checkpoint's 128×64 scale tiles" in r.text


def test_the_hidden_size_bounds_the_refined_block():
    r = _only(MoELayer.build(hidden=4000, intermediate=1536, experts=128, top_k=8, tp=8, **_FP8))
    assert "refines the scale blocks to 32 " in r.text  # gcd(128, 192, 4000) = 32, not 64


def test_moe_tp_1_never_splits_and_tp_2_does():
    assert shard_caveats(MoELayer.build(hidden=4096, intermediate=1552, experts=128, top_k=8, tp=1, **_FP8)) == ()
    r = _only(MoELayer.build(hidden=4096, intermediate=1600, experts=128, top_k=8, tp=2, **_FP8))
    assert r.text.startswith("caveat [scale tiles]: the TP shard 800 of intermediate 1600")
    mx = dict(weight="mxfp4", act="bf16", experts=8, top_k=2, hidden=2048)
    assert shard_caveats(MoELayer.build(intermediate=2000, tp=1, **mx)) == ()
    assert _only(MoELayer.build(intermediate=2000, tp=2, **mx)).issue == SCALE_GROUPS  # 1000 % 32 = 8
    alt = ep_alternative_layer(MoELayer.build(hidden=64, intermediate=640, experts=8, top_k=2, tp=2))
    assert alt is not None and (alt.ep, alt.experts_per_rank, alt.intermediate_per_rank) == (2, 4, 640)


def test_pad_ratio_degenerate_shards_and_rules_without_sources():
    tiny = SimpleNamespace(kind="moe", intermediate_per_rank=1, intermediate=64, moe_tp=64, tp=64)
    assert pad_ratio_caveat(_decision(tiny, 256)).text.startswith(
        "caveat [pad ratio]: aiter-ck pads intermediate/rank 1→256 (256× the shard")
    empty = SimpleNamespace(kind="moe", intermediate_per_rank=0, intermediate=0, moe_tp=64, tp=64)
    assert pad_ratio_caveat(_decision(empty, 256)) is None
    # the source is the first *padding* reason that has one, not any sourced reason
    reasons = (Reason("pads", "padding"), Reason("supported", "supports", "o/r#1"))
    assert pad_ratio_caveat(_decision(_GLM, 256, reasons=reasons)).source is None


def test_pad_ratio_alternative_boundaries():
    alt_layer = ep_alternative_layer(_GLM)
    same = pad_ratio_caveat(_decision(_GLM, 256), 0, _decision(alt_layer, 2048 * 8, padded=True))
    assert "Expert parallelism" not in same.text  # as padded (8×) as the plan: not offered
    one_sided = pad_ratio_caveat(_decision(_GLM, 256, cost=(_cost(1, 21.0),)), 0,
                                 _decision(alt_layer, 2048, padded=False))
    assert one_sided.text.endswith("on aiter-ck, unpadded")  # no cost for the alternative: no comparison
