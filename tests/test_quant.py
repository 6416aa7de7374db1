"""quantization_config dialects → (weight, activation) QuantSpecs, exclusions, and clear refusals.

Blocks are the shapes quoted in models_hw.md §A.3 (MiniMax-M2 fp8 block, MiniMax-M3-MXFP8, amd/*-MXFP4 Quark,
gpt-oss mxfp4, grok-1 FP8-KV, DeepSeek fp8, Llama-4 fbgemm_fp8) plus the engines' dialect rules (vLLM Fp8Config
block+static refusal, QuarkConfig precedence, compressed-tensors targets/ignore, ModelOpt quant_algo values).
"""

from __future__ import annotations

import pytest

from moedispatch.core.errors import ModelError
from moedispatch.sources.quant import SUPPORTED_METHODS, parse_quantization_config

EXPERT = ("model.layers.3.block_sparse_moe.experts.0.w1", "model.layers.3.mlp.experts.0.gate_proj")
DENSE = ("model.layers.0.mlp.gate_proj",)

MX = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}


def q(block, names=EXPERT, kind="moe"):
    scheme = parse_quantization_config(block)
    return scheme.for_module(names, kind)


def test_absent_is_unquantized():
    assert parse_quantization_config(None) is None


# -- fp8 --------------------------------------------------------------------------------------------------------

def test_fp8_block_minimax_m2():
    w, a, why = q({"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                   "weight_block_size": [128, 128], "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                                               "lm_head"]})
    assert (w.dtype, w.granularity, w.fmt) == ("fp8", "block128x128", "e4m3fn")
    assert (a.dtype, a.granularity, a.dynamic) == ("fp8", "group128", True)
    w, _, why = q({"quant_method": "fp8", "weight_block_size": [128, 128],
                   "modules_to_not_convert": ["gate"]}, ("model.layers.3.block_sparse_moe.gate",))
    assert w.dtype == "bf16" and "excluded" in why


@pytest.mark.parametrize("fmt, expect", [("e4m3", "e4m3fn"), ("float8_e4m3fnuz", "e4m3fnuz"), (None, "e4m3fn"),
                                         ("E4M3FNUZ", "e4m3fnuz"), ("float8_e5m2", "e5m2")])
def test_fp8_fmt_fn_vs_fnuz(fmt, expect):
    block = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if fmt is not None:
        block["fmt"] = fmt
    w, a, _ = q(block)
    assert w.fmt == expect and a.fmt == expect


def test_fp8_per_tensor_static_grok1_fp8_kv():
    block = {"quant_method": "fp8", "activation_scheme": "static", "kv_cache_scheme": "static",
             "ignored_layers": ["lm_head", "*.gate"]}
    w, a, _ = q(block, ("model.layers.0.block_sparse_moe.experts.0.w1",))
    assert (w.granularity, a.granularity, a.dynamic) == ("tensor", "tensor", False)
    w, _, why = q(block, ("model.layers.0.block_sparse_moe.gate",))
    assert w.dtype == "bf16" and "'*.gate'" in why


@pytest.mark.parametrize("block, needle", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "needs activation_scheme"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [True, 128]}, "two positive integers"),
    ({"quant_method": "fp8", "fmt": "e3m4"}, "unknown fp8 format"),
    ({"quant_method": "fp8", "fmt": 8}, "must be a string"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "'dynamic' or 'static'"),
    ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "list of strings"),
])
def test_fp8_refusals(block, needle):
    with pytest.raises(ModelError, match=needle):
        parse_quantization_config(block)


# -- quark -------------------------------------------------------------------------------------------------------

def _quark(weight=MX, inputs=None, **kw):
    inputs = {**MX, "is_dynamic": True} if inputs is None else inputs
    return {"quant_method": "quark", "global_quant_config": {"weight": weight, "input_tensors": inputs,
                                                             "output_tensors": None, "bias": None}, **kw}


def test_quark_mxfp4_w4a4_minimax_m3_card():
    block = _quark(exclude=["*lm_head", "*block_sparse_moe.gate", "*self_attn*", "*mlp.gate_proj", "*mlp.up_proj",
                            "*mlp.down_proj"], layer_quant_config={}, layer_type_quant_config={})
    w, a, _ = q(block)
    assert (w.dtype, w.granularity, w.scale_dtype, w.dynamic) == ("mxfp4", "group32", "e8m0", False)
    assert (a.dtype, a.dynamic) == ("mxfp4", True)
    w, _, why = q(block, DENSE, "dense")
    assert w.dtype == "bf16" and "*mlp.gate_proj" in why
    shared = ("model.layers.3.block_sparse_moe.shared_experts.gate_proj",)
    assert q(block, shared)[0].dtype == "mxfp4"  # shared experts stay MXFP4 (models_hw.md §A.3 [D])


def test_quark_scale_type_float_is_not_a_scale_format():
    """Quark exports carry scale_type 'float' next to scale_format 'e8m0' (or none): still OCP MXFP4."""
    w, _, _ = q(_quark(weight={**MX, "scale_type": "float", "scale_format": None}))
    assert w.dtype == "mxfp4"


def test_quark_w4a8_fp8_static_inputs():
    w, a, _ = q(_quark(inputs={"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}))
    assert (w.dtype, a.dtype, a.granularity, a.dynamic, a.fmt) == ("mxfp4", "fp8", "tensor", False, "e4m3fn")


@pytest.mark.parametrize("spec, label, fmt", [
    ({"dtype": "fp4_e2m1", "qscheme": "per_group", "group_size": 32}, "mxfp4", None),
    ({"dtype": "mx", "mx_element_dtype": "fp4", "qscheme": "per_group", "group_size": 32}, "mxfp4", None),
    ({"dtype": "mx", "mx_element_dtype": "fp8_e4m3", "qscheme": "per_group", "group_size": 32}, "mxfp8", "e4m3"),
    ({"dtype": "fp8_e4m3", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}, "mxfp8", "e4m3"),
    ({"dtype": "fp6_e2m3", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}, "mxfp6", "e2m3"),
    ({"dtype": "fp6_e3m2", "qscheme": "per_group", "group_size": 32}, "mxfp6", "e3m2"),
    ({"dtype": "fp8_e4m3", "qscheme": "per_channel"}, "fp8", "e4m3fn"),
    ({"dtype": "fp8_e4m3", "qscheme": "per_group", "group_size": 128}, "fp8", "e4m3fn"),
    ({"dtype": "int4", "qscheme": "per_channel"}, "int4", None),
    ({"dtype": "int8", "qscheme": "per_tensor"}, "int8", None),
    ({"dtype": "bfloat16"}, "bf16", None),
])
def test_quark_dtype_spellings(spec, label, fmt):
    w, _, _ = q(_quark(weight=spec, inputs={}))
    assert w.dtype == label and w.fmt == fmt


def test_quark_uint4_is_asymmetric_unless_told():
    w, _, _ = q(_quark(weight={"dtype": "uint4", "qscheme": "per_group", "group_size": 128}, inputs={}))
    assert (w.dtype, w.granularity, w.symmetric) == ("int4", "group128", False)
    w, _, _ = q(_quark(weight={"dtype": "uint4", "qscheme": "per_channel", "symmetric": True}, inputs={}))
    assert w.symmetric is True


def test_quark_grok_int4_weights_fp8_activations_per_layer():
    """Grok-1 Quark INT4-FP8: FP8 per-tensor everywhere, INT4 per-channel for the MoE linears, FP8 activations."""
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    block = _quark(weight=fp8, inputs=fp8, exclude=["lm_head", "*.gate"], layer_quant_config={
        "*experts*": {"weight": {"dtype": "int4", "qscheme": "per_channel"}, "input_tensors": fp8}})
    w, a, why = q(block, ("model.layers.0.block_sparse_moe.experts.0.w1",))
    assert (w.dtype, w.granularity, a.dtype, a.granularity) == ("int4", "channel", "fp8", "tensor")
    assert "per-layer" in why
    w, _, _ = q(block, ("model.layers.0.self_attn.q_proj",), "dense")
    assert w.dtype == "fp8"


def test_quark_layer_type_quant_config_and_precedence():
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}
    block = _quark(layer_type_quant_config={"nn.Linear": {"weight": fp8, "input_tensors": fp8}},
                   layer_quant_config={"*experts.0.w1": {"weight": MX, "input_tensors": None}},
                   exclude=["re:model\\.layers\\.9\\..*"])
    w, a, why = q(block, ("model.layers.3.block_sparse_moe.experts.0.w1",))
    assert (w.dtype, a.dtype) == ("mxfp4", "bf16") and "per-layer" in why  # layer config beats type config
    w, _, why = q(block, DENSE, "dense")
    assert w.dtype == "fp8" and "layer-type" in why  # type config beats global
    w, _, why = q(block, ("model.layers.9.mlp.experts.0.gate_proj",))
    assert w.dtype == "bf16" and "excluded" in why  # exclude beats everything
    moe_only = _quark(layer_type_quant_config={"FusedMoE": {"weight": fp8, "input_tensors": fp8}})
    assert q(moe_only)[0].dtype == "fp8" and q(moe_only, DENSE, "dense")[0].dtype == "mxfp4"


@pytest.mark.parametrize("spec, needle", [
    ({"dtype": "fp4", "qscheme": "per_group", "group_size": 16, "scale_format": "fp8_e4m3"}, "not OCP MXFP4"),
    ({"dtype": "fp4", "qscheme": "per_channel"}, "not OCP MXFP4"),
    ({"dtype": "fp8_e4m3", "qscheme": "per_block"}, "unknown qscheme"),
    ({"dtype": "int4", "qscheme": "per_group", "group_size": True}, "positive integer group_size"),
    ({"dtype": "int3"}, "unknown Quark dtype 'int3'"),
    ({"dtype": "mx", "mx_element_dtype": "int8"}, "unknown Quark dtype"),
    ({"dtype": 4}, "dtype must be a string"),
    ({"dtype": "fp4", "is_dynamic": "yes"}, "is_dynamic must be true or false"),
    ("fp4", "must be an object"),
])
def test_quark_refusals(spec, needle):
    with pytest.raises(ModelError, match=needle):
        parse_quantization_config(_quark(weight=spec))


# -- mxfp4 / mxfp8 ------------------------------------------------------------------------------------------------

def test_mxfp4_gpt_oss_modules_not_converted():
    block = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"]}
    w, a, _ = q(block, ("model.layers.3.mlp.experts.gate_up_proj",))
    assert (w.dtype, w.scale_dtype, a.dtype) == ("mxfp4", "e8m0", "bf16")
    w, _, _ = q(block, ("model.layers.3.mlp.router",))
    assert w.dtype == "bf16"


def test_mxfp8_minimax_m3():
    block = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
             "ignored_layers": ["lm_head", "model.embed_tokens", "vision_tower"]}
    w, a, _ = q(block)
    assert (w.dtype, w.granularity, w.fmt, a.dtype, a.dynamic) == ("mxfp8", "group32", "e4m3", "mxfp8", True)
    with pytest.raises(ModelError, match=r"\[1, 32\]"):
        parse_quantization_config({**block, "weight_block_size": [128, 128]})


# -- compressed-tensors ---------------------------------------------------------------------------------------------

def test_compressed_tensors_fp8_channel_token_with_ignore():
    block = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}},
        "ignore": ["lm_head", "re:.*mlp\\.gate$"]}
    w, a, _ = q(block)
    assert (w.dtype, w.granularity, a.granularity, a.dynamic) == ("fp8", "channel", "token", True)
    assert q(block, ("model.layers.3.mlp.gate",))[0].dtype == "bf16"


def test_compressed_tensors_named_targets_and_block():
    block = {"quant_method": "compressed_tensors", "config_groups": {
        "experts": {"targets": ["re:.*experts.*"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                                "group_size": 32}},
        "attn": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                                               "block_structure": [128, 128]},
                 "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                                       "dynamic": True}}}}
    w, a, _ = q(block)
    assert (w.dtype, w.granularity, a.dtype) == ("int4", "group32", "bf16")
    assert q(block, DENSE, "dense")[0].dtype == "bf16"  # no target matches: unquantized
    w, _, _ = q(block, ("model.layers.0.self_attn.q_proj",), "dense")
    assert w.granularity == "block128x128"


@pytest.mark.parametrize("weights, needle", [
    ({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}, "NVFP4"),
    ({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}, "NVFP4"),
    ({"num_bits": 3, "type": "int", "strategy": "group", "group_size": 32}, "unsupported int 3-bit"),
    ({"num_bits": 8, "type": "float", "strategy": "diagonal"}, "unknown strategy"),
    ({"num_bits": 4, "type": "int", "strategy": "group"}, "positive integer group_size"),
])
def test_compressed_tensors_refusals(weights, needle):
    block = {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": weights}}}
    with pytest.raises(ModelError, match=needle):
        parse_quantization_config(block)


def test_compressed_tensors_empty_groups():
    with pytest.raises(ModelError, match="config_groups is empty"):
        parse_quantization_config({"quant_method": "compressed-tensors", "config_groups": {}})


# -- fbgemm_fp8 / modelopt ----------------------------------------------------------------------------------------

def test_fbgemm_fp8_llama4():
    block = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
             "modules_to_not_convert": ["language_model.model.layers.0.feed_forward"]}
    w, a, _ = q(block, ("language_model.model.layers.1.feed_forward.experts.0.gate_proj",))
    assert (w.granularity, a.granularity, a.dynamic) == ("channel", "token", True)
    w, _, _ = q(block, ("language_model.model.layers.0.feed_forward.gate_proj",), "dense")
    assert w.dtype == "bf16"


@pytest.mark.parametrize("algo, weight, act", [
    ("FP8", ("fp8", "tensor"), ("fp8", "tensor")),
    ("FP8_PER_CHANNEL_PER_TOKEN", ("fp8", "channel"), ("fp8", "token")),
    ("FP8_PB_WO", ("fp8", "block128x128"), ("bf16", None)),
    ("MXFP8", ("mxfp8", "group32"), ("mxfp8", "group32")),
])
def test_modelopt_algos(algo, weight, act):
    for block in ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo}},
                  {"quant_method": "modelopt", "quant_algo": algo}):
        w, a, _ = q(block)
        assert (w.dtype, w.granularity) == weight and (a.dtype, a.granularity) == act


def test_modelopt_nvfp4_refused_and_mixed_precision():
    with pytest.raises(ModelError, match="ModelOpt quant_algo 'NVFP4' is not supported"):
        parse_quantization_config({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    block = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.3.mlp.experts.0.gate_proj": {"quant_algo": "FP8"}}}
    assert q(block)[0].dtype == "fp8" and q(block, DENSE, "dense")[0].dtype == "bf16"


# -- dispatch -------------------------------------------------------------------------------------------------------

def test_unknown_method_names_it_and_the_supported_ones():
    with pytest.raises(ModelError) as err:
        parse_quantization_config({"quant_method": "gptq", "bits": 4})
    msg = str(err.value)
    assert "'gptq'" in msg and all(m in msg for m in SUPPORTED_METHODS)
    assert {"fp8", "quark", "mxfp4", "mxfp8", "compressed-tensors", "fbgemm_fp8", "modelopt"} <= set(SUPPORTED_METHODS)


@pytest.mark.parametrize("block, needle", [
    ({"bits": 4}, "quant_method is missing"),
    ({"quant_method": 3}, "quant_method is missing or not a string"),
    ([1], "must be an object"),
    ({"quant_method": "quark", "exclude": ["re:(unclosed"]}, "bad regex"),
])
def test_malformed_blocks(block, needle):
    with pytest.raises(ModelError, match=needle):
        scheme = parse_quantization_config(block)
        scheme.for_module(EXPERT)
