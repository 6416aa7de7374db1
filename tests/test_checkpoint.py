"""Real checkpoint folders made in tmp: config.json + tiny safetensors written by hand (struct + json, no torch).

Covers: the safetensors header reader and its refusals, expert-tensor cross-checks (pre-padded, fused gate-up,
stacked, packed int4/fp4), every quant dialect on disk, sidecar quant files, sharded indexes, the CLI on a folder,
and that nothing in the folder is executed or written. Layouts: models_hw.md §A.2/§A.3 (weight names, gpt-oss blocks
[E, 2I, H/32, 16]), safetensors format (8-byte little-endian header length + JSON header + data).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moedispatch.core.reason import texts
from moedispatch.sources.checkpoint import read_safetensors_header, scan_checkpoint
from moedispatch.core.errors import ModelError
from moedispatch.sources.models import expand_layers, load_model

BITS = {"BF16": 16, "F16": 16, "F32": 32, "F8_E4M3": 8, "U8": 8, "I8": 8, "I32": 32, "I64": 64}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], metadata=None) -> Path:
    """A valid safetensors file: zero-filled data of the right size for each (dtype, shape)."""
    header: dict = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.ceil(math.prod(shape) * BITS[dtype] / 8)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path


def per_expert(layers, experts, hidden, inter, *, prefix="model.layers", block="mlp", names=("gate_proj",
               "up_proj", "down_proj"), dtype="BF16", pack=1, suffix=".weight", fused=False):
    """nn.Linear-layout expert weights: gate/up [I, H/pack], down [H, I/pack] (gate_up [2I, H/pack] if fused)."""
    out = {}
    for i in layers:
        for e in range(experts):
            base = f"{prefix}.{i}.{block}.experts.{e}"
            if fused:
                out[f"{base}.gate_up_proj{suffix}"] = (dtype, (2 * inter, hidden // pack))
            else:
                out[f"{base}.{names[0]}{suffix}"] = (dtype, (inter, hidden // pack))
                out[f"{base}.{names[1]}{suffix}"] = (dtype, (inter, hidden // pack))
            out[f"{base}.{names[2]}{suffix}"] = (dtype, (hidden, inter // pack))
    return out


def make_ckpt(folder: Path, config: dict, tensors: dict | None = None, *, shards: int = 1, extra: dict | None = None
              ) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if tensors:
        names = sorted(tensors)
        if shards == 1:
            write_safetensors(folder / "model.safetensors", tensors)
        else:
            wmap = {}
            for s in range(shards):
                fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
                part = {n: tensors[n] for n in names[s::shards]}
                write_safetensors(folder / fname, part)
                wmap.update({n: fname for n in part})
            (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    for fname, data in (extra or {}).items():
        (folder / fname).write_text(data if isinstance(data, str) else json.dumps(data))
    return folder


def mixtral_cfg(**kw) -> dict:
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 32, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "hidden_act": "silu", "torch_dtype": "bfloat16"}
    cfg.update(kw)
    return cfg


MIXTRAL_NAMES = dict(block="block_sparse_moe", names=("w1", "w3", "w2"))


# -- the header reader -----------------------------------------------------------------------------------------

def test_header_reader_returns_names_dtypes_shapes(tmp_path):
    p = write_safetensors(tmp_path / "a.safetensors", {"x": ("BF16", (4, 8)), "y": ("U8", (3,))},
                          metadata={"format": "pt"})
    info = read_safetensors_header(p)
    assert set(info) == {"x", "y"}
    assert info["x"].dtype == "BF16" and info["x"].shape == (4, 8) and info["x"].file == str(p)


def _raw(path: Path, header_len: int, body: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", header_len) + body)
    return path


@pytest.mark.parametrize("case, needle", [
    ("empty", "truncated"),
    ("short", "truncated"),
    ("beyond", "runs beyond the end of the file"),
    ("2gb", "over the 100000000 byte limit"),
    ("json", "not valid JSON"),
    ("list", "must be a JSON object"),
    ("dtype", "dtype must be a string"),
    ("shape", "shape must be a list of non-negative integers"),
    ("negshape", "shape must be a list of non-negative integers"),
    ("offsets", "data_offsets must be two integers"),
    ("reversed", "not an increasing"),
    ("pastdata", "beyond the file's"),
    ("size", "needs 16 bytes but data_offsets span 8"),
    ("utf8", "not UTF-8"),
])
def test_malformed_headers_are_one_line_model_errors(tmp_path, case, needle):
    p = tmp_path / "bad.safetensors"
    good = {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}

    def hdr(obj, data=16):
        raw = json.dumps(obj).encode()
        return _raw(p, len(raw), raw + b"\0" * data)

    if case == "empty":
        p.write_bytes(b"")
    elif case == "short":
        p.write_bytes(b"\x10\x00\x00")
    elif case == "beyond":
        _raw(p, 4096, b"{}")
    elif case == "2gb":
        _raw(p, 2 * 1024 ** 3, b"{}")
    elif case == "json":
        _raw(p, 10, b'{"a": [1, ')
    elif case == "list":
        hdr([1, 2])
    elif case == "dtype":
        hdr({"w": {**good, "dtype": 7}})
    elif case == "shape":
        hdr({"w": {**good, "shape": "2x4"}})
    elif case == "negshape":
        hdr({"w": {**good, "shape": [2, -4]}})
    elif case == "offsets":
        hdr({"w": {**good, "data_offsets": [0]}})
    elif case == "reversed":
        hdr({"w": {**good, "data_offsets": [16, 0]}})
    elif case == "pastdata":
        hdr({"w": {**good, "data_offsets": [0, 16]}}, data=8)
    elif case == "size":
        hdr({"w": {**good, "data_offsets": [0, 8]}})
    elif case == "utf8":
        _raw(p, 4, b"\xff\xfe{}")
    with pytest.raises(ModelError) as err:
        read_safetensors_header(p)
    msg = str(err.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_a_2gb_header_claim_is_refused_without_reading_it(tmp_path):
    """The claimed length is checked before any allocation: a 16-byte file claiming 2 GB is refused at once."""
    p = _raw(tmp_path / "huge.safetensors", 2 ** 31, b"{}      ")
    with pytest.raises(ModelError, match="over the 100000000 byte limit"):
        read_safetensors_header(p)


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_loop_shard_is_a_model_error(tmp_path):
    make_ckpt(tmp_path / "m", mixtral_cfg())
    os.symlink("b.safetensors", tmp_path / "m" / "a.safetensors")
    os.symlink("a.safetensors", tmp_path / "m" / "b.safetensors")
    with pytest.raises(ModelError, match="symlink loop") as err:
        load_model(str(tmp_path / "m"))
    assert "a.safetensors" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_loop_model_path_and_config_are_model_errors(tmp_path):
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    with pytest.raises(ModelError, match="symlink loop"):
        load_model(str(tmp_path / "loop1"))
    folder = tmp_path / "m"
    folder.mkdir()
    os.symlink("config.json", folder / "config.json")
    with pytest.raises(ModelError, match="symlink loop") as err:
        load_model(str(folder))
    assert "config.json" in str(err.value)


# -- expert layouts ---------------------------------------------------------------------------------------------

def test_mixtral_bf16_folder_confirms_experts(tmp_path):
    folder = make_ckpt(tmp_path / "tiny-mixtral", mixtral_cfg(),
                       per_expert(range(2), 4, 64, 32, prefix="model.layers", **MIXTRAL_NAMES))
    spec = load_model(str(folder))
    assert spec.source == "path" and spec.name == "tiny-mixtral" and spec.architecture == "MixtralForCausalLM"
    assert spec.stored_intermediate == 32 and spec.stored_hidden == 64
    assert spec.fused_gate_up is False and spec.prepadded is False and spec.shards == 1
    assert spec.tensor_dtypes == ("BF16",)
    assert spec.to_dict()["checkpoint"]["stored_intermediate"] == 32
    assert {k: spec.to_dict()[k] for k in ("name", "source", "architecture")} == {
        "name": "tiny-mixtral", "source": "path", "architecture": "MixtralForCausalLM"}


def test_config_json_path_reads_its_folder(tmp_path):
    folder = make_ckpt(tmp_path / "m", mixtral_cfg(),
                       per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES))
    spec = load_model(str(folder / "config.json"))
    assert spec.source == "path" and spec.stored_intermediate == 32 and spec.name == "m"


def test_fused_gate_up_per_expert_is_detected(tmp_path):
    cfg = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
           "intermediate_size": 256, "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_experts": 4,
           "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": []}
    spec = load_model(str(make_ckpt(tmp_path / "q", cfg, per_expert(range(2), 4, 64, 32, fused=True))))
    assert spec.fused_gate_up is True and spec.stored_intermediate == 32


def _gpt_oss_cfg(inter=64, hidden=64):
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
            "experts_per_token": 2, "swiglu_limit": 7.0, "hidden_act": "silu",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}


def _gpt_oss_blocks(E, H, I_stored, layers=range(2)):
    out = {}
    for i in layers:
        p = f"model.layers.{i}.mlp.experts"
        out[f"{p}.gate_up_proj_blocks"] = ("U8", (E, 2 * I_stored, H // 32, 16))
        out[f"{p}.gate_up_proj_scales"] = ("U8", (E, 2 * I_stored, H // 32))
        out[f"{p}.gate_up_proj_bias"] = ("BF16", (E, 2 * I_stored))
        out[f"{p}.down_proj_blocks"] = ("U8", (E, H, I_stored // 32, 16))
        out[f"{p}.down_proj_scales"] = ("U8", (E, H, I_stored // 32))
        out[f"{p}.down_proj_bias"] = ("BF16", (E, H))
        out[f"model.layers.{i}.mlp.router.weight"] = ("BF16", (E, H))
    return out


def test_gpt_oss_mxfp4_blocks_layout(tmp_path):
    spec = load_model(str(make_ckpt(tmp_path / "oss", _gpt_oss_cfg(), _gpt_oss_blocks(4, 64, 64))))
    assert spec.quant_method == "mxfp4" and spec.fused_gate_up is True and spec.stacked_experts is True
    assert spec.stored_intermediate == 64 and not spec.prepadded and spec.has_bias
    moe = expand_layers(spec)[0]
    assert moe.weight.dtype == "mxfp4" and moe.act.dtype == "bf16" and moe.activation == "swigluoai"


def test_prepadded_gpt_oss_style_checkpoint(tmp_path):
    """Config says 2880-style odd size (here 96); tensors store 128 (gpt-oss 2880 -> 3072 style): pre-padded."""
    spec = load_model(str(make_ckpt(tmp_path / "padded", _gpt_oss_cfg(inter=96), _gpt_oss_blocks(4, 64, 128))))
    assert spec.prepadded is True and spec.stored_intermediate == 128
    assert spec.layers[0].intermediate == 96  # the model's size stays the config's
    assert any("pre-padded" in n and "128" in n for n in spec.notes)
    assert spec.to_dict()["checkpoint"]["prepadded"] is True


def test_stacked_bf16_experts_llama4_layout(tmp_path):
    """Llama-4 stores experts stacked [E, H, 2I] / [E, I, H] in a VL wrapper with language_model prefix."""
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
           "text_config": {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32,
                           "intermediate_size_mlp": 128, "num_hidden_layers": 4, "num_local_experts": 4,
                           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "hidden_act": "silu"}}
    tensors = {}
    for i in (1, 3):
        p = f"language_model.model.layers.{i}.feed_forward.experts"
        tensors[f"{p}.gate_up_proj"] = ("BF16", (4, 64, 64))
        tensors[f"{p}.down_proj"] = ("BF16", (4, 32, 64))
    spec = load_model(str(make_ckpt(tmp_path / "l4", cfg, tensors)))
    assert [t.kind for t in spec.layers] == ["dense", "moe", "dense", "moe"]
    assert spec.stacked_experts and spec.fused_gate_up and spec.stored_intermediate == 32
    assert spec.shared_experts == 1 and spec.shared_intermediate == 32


def test_multimodal_wrapper_minimax_m3_quark_mxfp4(tmp_path):
    """MiniMax-M3 VL wrapper: text_config.model_type says minimax_m2, the family is the top-level minimax_m3_vl;
    Quark MXFP4 W4A4 with packed U8 experts, dense layers excluded by glob."""
    moe_flags = [0, 1, 1]
    cfg = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
           "text_config": {"model_type": "minimax_m2", "hidden_size": 64, "intermediate_size": 64,
                           "dense_intermediate_size": 128, "shared_intermediate_size": 64, "n_shared_experts": 1,
                           "num_hidden_layers": 3, "num_local_experts": 4, "num_experts_per_tok": 2,
                           "hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
                           "moe_layer_freq": moe_flags},
           "quantization_config": {
               "quant_method": "quark",
               "global_quant_config": {
                   "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0",
                              "scale_type": "float", "is_dynamic": False},
                   "input_tensors": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                                     "scale_format": "e8m0", "is_dynamic": True}},
               "layer_quant_config": {}, "layer_type_quant_config": {},
               "exclude": ["*lm_head", "*vision_tower*", "*block_sparse_moe.gate", "*self_attn*", "*mlp.gate_proj",
                           "*mlp.up_proj", "*mlp.down_proj"]}}
    tensors = per_expert((1, 2), 4, 64, 64, prefix="language_model.model.layers", dtype="U8", pack=2,
                         **MIXTRAL_NAMES)
    tensors["language_model.model.layers.0.mlp.gate_proj.weight"] = ("BF16", (128, 64))
    spec = load_model(str(make_ckpt(tmp_path / "m3", cfg, tensors)))
    assert spec.model_type == "minimax_m3_vl" and spec.text_model_type == "minimax_m2"
    assert spec.activation == "swigluoai_uninterleave"
    assert dict(spec.activation_params) == {"alpha": 1.702, "limit": 7.0}
    assert [t.kind for t in spec.layers] == ["dense", "moe", "moe"]
    assert spec.layers[0].weight.dtype == "bf16"
    assert (spec.layers[1].weight.dtype, spec.layers[1].act.dtype) == ("mxfp4", "mxfp4")
    assert spec.stored_intermediate == 64 and spec.tensor_dtypes == ("U8",)


def test_fp8_block_deepseek_sharded_index(tmp_path):
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
           "intermediate_size": 256, "moe_intermediate_size": 32, "num_hidden_layers": 3, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
           "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                   "weight_block_size": [128, 128]}}
    tensors = per_expert((1, 2), 4, 64, 32, dtype="F8_E4M3")
    for n in list(tensors):
        tensors[n.replace(".weight", ".weight_scale_inv")] = ("F32", (1, 1))
    tensors["model.layers.3.mlp.experts.0.gate_proj.weight"] = ("F8_E4M3", (32, 64))  # MTP layer: ignored
    spec = load_model(str(make_ckpt(tmp_path / "ds", cfg, tensors, shards=3)))
    assert spec.shards == 3 and spec.moe_layers == 2
    moe = spec.layers[1]
    assert moe.weight.granularity == "block128x128" and moe.act.granularity == "group128"
    assert spec.shared_experts == 1 and spec.shared_intermediate == 32


def test_index_without_shards_falls_back_to_config(tmp_path):
    folder = make_ckpt(tmp_path / "cfgonly", mixtral_cfg(),
                       extra={"model.safetensors.index.json": {"weight_map": {
                           "model.layers.0.block_sparse_moe.experts.0.w1.weight": "model-00001-of-00002.safetensors"}}})
    spec = load_model(str(folder))
    assert spec.stored_intermediate is None and spec.shards == 0
    assert any("not present" in n for n in spec.notes)


def test_partially_downloaded_shards_check_what_is_present(tmp_path):
    folder = make_ckpt(tmp_path / "partial", mixtral_cfg(), per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES),
                       shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    spec = load_model(str(folder))
    assert spec.stored_intermediate == 32 and spec.shards == 1
    assert any("1 of 2 safetensors shards" in n for n in spec.notes)


def test_index_with_path_traversal_is_refused(tmp_path):
    folder = make_ckpt(tmp_path / "evil", mixtral_cfg(),
                       extra={"model.safetensors.index.json": {"weight_map": {"w": "../../etc/passwd"}}})
    with pytest.raises(ModelError, match="not a file in this folder"):
        load_model(str(folder))


def test_grok_int4_weights_fp8_activations(tmp_path):
    """Grok INT4-FP8: an fp8 (static) config with int32-packed int4 experts -> W int4 per-channel, A fp8."""
    cfg = {"architectures": ["Grok1ModelForCausalLM"], "model_type": "grok-1", "hidden_size": 64,
           "intermediate_size": 32, "num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2,
           "quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
                                   "ignored_layers": ["lm_head", "*.gate"]}}
    tensors = per_expert(range(2), 4, 64, 32, block="moe_block", names=("linear", "linear_v", "linear_1"),
                         dtype="I32", pack=8)
    spec = load_model(str(make_ckpt(tmp_path / "grok", cfg, tensors)))
    moe = spec.layers[0]
    assert (moe.weight.dtype, moe.weight.granularity) == ("int4", "channel")
    assert (moe.act.dtype, moe.act.granularity, moe.act.dynamic) == ("fp8", "tensor", False)
    assert spec.activation == "gelu" and spec.stored_intermediate == 32
    assert any("Grok" in n for n in spec.notes)


def test_compressed_tensors_int4_pack_quantized(tmp_path):
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "moe_intermediate_size": 32, "intermediate_size": 128,
           "num_hidden_layers": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 0,
           "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                   "config_groups": {"group_0": {"targets": ["re:.*mlp\\.experts.*"],
                                                                 "weights": {"num_bits": 4, "type": "int",
                                                                             "strategy": "group", "group_size": 32,
                                                                             "symmetric": True}}},
                                   "ignore": ["lm_head", "re:.*self_attn.*"]}}
    tensors = per_expert(range(2), 4, 64, 32, dtype="I32", pack=8, suffix=".weight_packed")
    spec = load_model(str(make_ckpt(tmp_path / "kimi-int4", cfg, tensors)))
    moe = spec.layers[0]
    assert (moe.weight.dtype, moe.weight.granularity, moe.act.dtype) == ("int4", "group32", "bf16")
    assert spec.stored_intermediate == 32


def test_mxfp8_minimax_m3_folder(tmp_path):
    cfg = {"model_type": "minimax_m3_vl", "text_config": {
        "model_type": "minimax_m2", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "swigluoai"},
        "quantization_config": {"quant_method": "mxfp8", "activation_scheme": "dynamic",
                                "weight_block_size": [1, 32], "ignored_layers": ["lm_head"]}}
    tensors = per_expert(range(2), 4, 64, 32, prefix="language_model.model.layers", dtype="F8_E4M3",
                         **MIXTRAL_NAMES)
    spec = load_model(str(make_ckpt(tmp_path / "m3-mxfp8", cfg, tensors)))
    assert (spec.layers[0].weight.dtype, spec.layers[0].act.dtype) == ("mxfp8", "mxfp8")


def test_fbgemm_fp8_folder(tmp_path):
    cfg = {"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1},
        "quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                "modules_to_not_convert": ["language_model.model.layers.0.feed_forward.router"]}}
    tensors = per_expert(range(2), 4, 64, 32, prefix="language_model.model.layers", block="feed_forward",
                         dtype="F8_E4M3")
    spec = load_model(str(make_ckpt(tmp_path / "mav", cfg, tensors)))
    assert (spec.layers[0].weight.granularity, spec.layers[0].act.granularity) == ("channel", "token")


def test_hf_quant_config_json_modelopt_sidecar(tmp_path):
    hqc = {"producer": {"name": "modelopt", "version": "0.31.0"},
           "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    folder = make_ckpt(tmp_path / "mo", mixtral_cfg(), per_expert(range(2), 4, 64, 32, dtype="F8_E4M3",
                                                                   **MIXTRAL_NAMES),
                       extra={"hf_quant_config.json": hqc})
    spec = load_model(str(folder))
    assert spec.quant_method == "modelopt"
    assert (spec.layers[0].weight.dtype, spec.layers[0].act.dtype) == ("fp8", "fp8")


def test_quantization_config_json_sidecar_infers_quark(tmp_path):
    qc = {"global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                                             "scale_format": "e8m0"},
                                  "input_tensors": None}, "exclude": ["lm_head"]}
    folder = make_ckpt(tmp_path / "sc", mixtral_cfg(), per_expert(range(2), 4, 64, 32, dtype="U8", pack=2,
                                                                  **MIXTRAL_NAMES),
                       extra={"quantization_config.json": qc})
    spec = load_model(str(folder))
    assert spec.quant_method == "quark"
    assert (spec.layers[0].weight.dtype, spec.layers[0].act.dtype) == ("mxfp4", "bf16")


# -- config vs tensors mismatches -------------------------------------------------------------------------------

@pytest.mark.parametrize("case, needle", [
    ("smaller_inter", "intermediate size is 32 but"),
    ("experts", "tensors for 3 of the 4 experts"),
    ("expert_index", "expert 4 but"),
    ("hidden", "says hidden_size is 64 but"),
    ("inconsistent", "stores hidden 48 but"),
    ("dtype", "is F8_E4M3 but"),
    ("dense_has_experts", "makes layer 0 a dense layer"),
    ("moe_without_experts", "makes layer 1 a MoE layer but the checkpoint has no expert tensors"),
    ("no_down", "no down projection"),
    ("gate_only", "no up weights"),
])
def test_config_tensor_mismatch_names_both(tmp_path, case, needle):
    cfg = mixtral_cfg()
    if case == "smaller_inter":
        tensors = per_expert(range(2), 4, 64, 16, **MIXTRAL_NAMES)
    elif case == "experts":
        tensors = per_expert(range(2), 3, 64, 32, **MIXTRAL_NAMES)
    elif case == "expert_index":
        tensors = per_expert(range(2), 5, 64, 32, **MIXTRAL_NAMES)
    elif case == "hidden":
        tensors = per_expert(range(2), 4, 48, 32, **MIXTRAL_NAMES)
    elif case == "inconsistent":
        tensors = per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES)
        tensors["model.layers.1.block_sparse_moe.experts.2.w2.weight"] = ("BF16", (48, 32))
    elif case == "dtype":
        tensors = per_expert(range(2), 4, 64, 32, dtype="F8_E4M3", **MIXTRAL_NAMES)
    elif case == "dense_has_experts":
        cfg = mixtral_cfg(model_type="qwen3_moe", num_local_experts=None, num_experts=4, mlp_only_layers=[0])
        tensors = per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES)
    elif case == "moe_without_experts":
        tensors = per_expert(range(1), 4, 64, 32, **MIXTRAL_NAMES)
    elif case == "no_down":
        tensors = {k: v for k, v in per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES).items() if ".w2." not in k}
    elif case == "gate_only":
        tensors = {k: v for k, v in per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES).items() if ".w3." not in k}
    folder = make_ckpt(tmp_path / "mm", cfg, tensors)
    with pytest.raises(ModelError) as err:
        load_model(str(folder))
    msg = str(err.value)
    assert needle in msg and "\n" not in msg, msg
    if case in ("smaller_inter", "hidden", "dtype", "experts"):
        assert "config.json" in msg and "model.safetensors" in msg, msg


# -- nothing executed, nothing written --------------------------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.rglob("*"))}


def test_auto_map_code_is_never_imported_and_folder_is_not_written(tmp_path):
    marker = tmp_path / "EXECUTED"
    cfg = mixtral_cfg(auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    code = f"open({str(marker)!r}, 'w').write('pwned')\n"
    folder = make_ckpt(tmp_path / "remote", cfg, per_expert(range(2), 4, 64, 32, **MIXTRAL_NAMES),
                       extra={"configuration_evil.py": code, "modeling_evil.py": code, "__init__.py": code})
    before = _snapshot(folder)
    for p in [folder, *folder.iterdir()]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        spec = load_model(str(folder))
        load_model(str(folder / "config.json"))
    finally:
        for p in [folder, *folder.iterdir()]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert spec.stored_intermediate == 32
    assert not marker.exists()
    assert not any(m in sys.modules for m in ("configuration_evil", "modeling_evil"))
    assert _snapshot(folder) == before  # no new files (no __pycache__), nothing modified


# -- through the CLI ---------------------------------------------------------------------------------------------

def test_cli_explain_folder_exit_0(tmp_path, cli, explain_schema):
    folder = make_ckpt(tmp_path / "cli-ok", mixtral_cfg(hidden_size=256, intermediate_size=256),
                       per_expert(range(2), 4, 256, 256, **MIXTRAL_NAMES))
    proc = cli("explain", "--model", str(folder), "--target", "gfx950", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, explain_schema)
    assert data["model"]["source"] == "path" and data["model"]["name"] == "cli-ok"
    assert data["model"]["checkpoint"]["stored_intermediate"] == 256
    assert data["model"]["architecture"] == "MixtralForCausalLM"
    assert len(data["layers"]) == 2 and all(la["backend"] for la in data["layers"])


@pytest.mark.parametrize("kind", ["truncated_json", "bad_header", "topk"])
def test_cli_explain_malformed_folder_exit_2_one_line(tmp_path, cli, kind):
    folder = tmp_path / kind
    if kind == "truncated_json":
        folder.mkdir()
        (folder / "config.json").write_text('{"hidden_size": 64, "num_hidden')
    elif kind == "bad_header":
        make_ckpt(folder, mixtral_cfg())
        _raw(folder / "model.safetensors", 2 ** 31, b"{}")
    else:
        make_ckpt(folder, mixtral_cfg(num_experts_per_tok=9))
    proc = cli("explain", "--model", str(folder), "--target", "gfx950", "--format", "json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout) == {"schema": "moedispatch.error/1", "error": proc.stderr.strip(), "exit": 2}
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(folder) in lines[0]


def test_cli_explain_folder_exit_3_when_forced_backend_cannot(tmp_path, cli):
    """W4A4 MXFP4 forced onto triton (no activation QDQ): exit 3 with the whole plan (as the built-in spine)."""
    cfg = mixtral_cfg(hidden_size=256, intermediate_size=256, quantization_config={
        "quant_method": "quark",
        "global_quant_config": {
            "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
            "input_tensors": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0",
                              "is_dynamic": True}},
        "exclude": ["lm_head"]})
    folder = make_ckpt(tmp_path / "cli-3", cfg, per_expert(range(2), 4, 256, 256, dtype="U8", pack=2,
                                                          **MIXTRAL_NAMES))
    proc = cli("explain", "--model", str(folder), "--target", "gfx950", "--aiter-version", "0.1.15.post3",
               "--backend", "triton", "--format", "json")
    assert proc.returncode == 3, proc.stderr
    data = json.loads(proc.stdout)
    assert all(la["backend"] is None for la in data["layers"])


def test_scan_checkpoint_without_weights_is_empty(tmp_path):
    make_ckpt(tmp_path / "e", mixtral_cfg())
    info = scan_checkpoint(tmp_path / "e")
    assert not info.has_tensors and info.shards == ()


# -- property: any header bytes give ModelError or a parsed header -------------------------------------------------


_ENTRY = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["BF16", "U8", "I32", "F8_E4M3", "XX"]), st.integers(), st.none()),
    "shape": st.one_of(st.lists(st.integers(-2, 9), max_size=4), st.text(max_size=3), st.none()),
    "data_offsets": st.one_of(st.lists(st.integers(-4, 200), max_size=3), st.none()),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.one_of(st.dictionaries(st.text(max_size=8), _ENTRY, max_size=4), st.binary(max_size=40)),
       claimed=st.one_of(st.none(), st.integers(0, 2 ** 64 - 1)), data=st.integers(0, 64))
def test_any_header_bytes_give_model_error_or_tensors(tmp_path, header, claimed, data):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "fuzz.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw) if claimed is None else claimed) + raw + b"\0" * data)
    try:
        out = read_safetensors_header(p)
    except ModelError as exc:
        assert str(p) in str(exc) and "\n" not in str(exc)
        return
    assert all(isinstance(t.shape, tuple) for t in out.values())


def test_prepadded_checkpoint_tells_explain_how_to_load_it(tmp_path, caps):
    """explain turns the pre-padding into a loading instruction next to the plan's own allocation."""
    from moedispatch.render.explain import plan_model

    spec = load_model(str(make_ckpt(tmp_path / "padded", _gpt_oss_cfg(inter=96), _gpt_oss_blocks(4, 64, 128))))
    plan = plan_model(spec, caps("gfx950", "0.1.15.post3"), 1, 1)
    warning = next(w for w in texts(plan.warnings) if w.startswith("pre-padded checkpoint"))
    assert "stored 128 wide" in warning and "96/rank" in warning and "first 96 columns" in warning
