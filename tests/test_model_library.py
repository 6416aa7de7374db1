"""The built-in model library: config.json-shaped files in capability_db/models/.

Reads the files by path (stdlib only) and checks the raw config keys that MoE dispatch depends on, so a
wrong number here is caught before any parser sees it. Each row names where its numbers come from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

MODELS_DIR = Path(__file__).parents[1] / "capability_db" / "models"
REQUIRED_KEYS = ("name", "hf_id", "aliases", "sources", "notes", "config")
REF = "models_hw.md"

EXPECTED_FILES = {
    "MiniMax-M3", "MiniMax-M3-MXFP4", "MiniMax-M3-MXFP8", "MiniMax-M2.1",
    "Qwen3-235B-A22B-Instruct-2507", "Qwen3-235B-A22B-Instruct-2507-FP8", "Qwen3-235B-A22B-Instruct-2507-MXFP4",
    "Qwen3.5-397B-A17B-MXFP4", "Qwen3-30B-A3B", "GLM-4.7", "grok-1", "grok-2", "gpt-oss-120b", "gpt-oss-20b",
    "DeepSeek-V3", "Kimi-K2", "Mixtral-8x7B",
    "Llama-4-Scout-17B-16E", "Llama-4-Maverick-17B-128E-Instruct-FP8",
    # issue 15: dims from AITER's own model_configs tables and engine PRs (each file's sources / confidence)
    "DeepSeek-V4-Pro", "Kimi-K3-MXFP4", "Kimi-K2.5", "Kimi-K2.5-MXFP4", "GLM-5-FP8", "GLM-5.1-MXFP4",
    "MiniMax-M2.5", "MiniMax-M2.5-MXFP4", "Qwen3.5-397B-A17B-FP8", "Qwen3-Next-80B-A3B-FP8",
}


def _load(name: str) -> dict[str, Any]:
    return json.loads((MODELS_DIR / f"{name}.json").read_text(encoding="utf-8"))


def _text(config: dict[str, Any]) -> dict[str, Any]:
    """The text backbone: nested under text_config for VL wrappers (MiniMax-M3, Qwen3.5, Llama-4)."""
    return config.get("text_config", config)


def _dense_layers(t: dict[str, Any]) -> int:
    """Count dense (non-MoE) decoder layers from whichever family key the config uses."""
    layers = t["num_hidden_layers"]
    if isinstance(t.get("moe_layer_freq"), list):  # MiniMax-M3: per-layer 0/1 flags
        assert len(t["moe_layer_freq"]) == layers
        return t["moe_layer_freq"].count(0)
    if "first_k_dense_replace" in t:  # DeepSeek / Kimi / GLM
        return t["first_k_dense_replace"]
    if "interleave_moe_layer_step" in t:  # Llama-4: MoE where (i + 1) % step == 0
        step = t["interleave_moe_layer_step"]
        return sum(1 for i in range(layers) if (i + 1) % step != 0)
    if "decoder_sparse_step" in t:  # Qwen3-MoE
        step = t["decoder_sparse_step"]
        only = set(t.get("mlp_only_layers", []))
        return sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)
    return 0  # Mixtral / grok / gpt-oss / MiniMax-M2 / Qwen3.5: every layer MoE


def _shared(t: dict[str, Any]) -> int:
    """Shared-expert intermediate size in total (0 when the model has none)."""
    if "shared_intermediate_size" in t:  # MiniMax
        return t["shared_intermediate_size"] * t.get("n_shared_experts", 1) if t["shared_intermediate_size"] else 0
    if "shared_expert_intermediate_size" in t:  # Qwen3.5
        return t["shared_expert_intermediate_size"]
    if "n_shared_experts" in t:  # DeepSeek / Kimi / GLM: each shared expert is moe_intermediate_size wide
        return t["n_shared_experts"] * t["moe_intermediate_size"]
    if t.get("model_type") == "llama4_text":  # one always-on shared expert of intermediate_size
        return t["intermediate_size"]
    return 0


# (file, expert-count key, per-expert-intermediate key, H, I, E, top-k, layers, dense layers, shared total, source)
SHAPES = [
    ("MiniMax-M3", "num_local_experts", "intermediate_size", 6144, 3072, 128, 4, 60, 3, 3072,
     f"{REF} §A.1/§A.2; vllm.md §15.1 MiniMaxM3TextConfig [C]"),
    ("MiniMax-M3-MXFP4", "num_local_experts", "intermediate_size", 6144, 3072, 128, 4, 60, 3, 3072,
     f"{REF} §A.1, amd card [C]"),
    ("MiniMax-M3-MXFP8", "num_local_experts", "intermediate_size", 6144, 3072, 128, 4, 60, 3, 3072,
     f"{REF} §A.1 [T]"),
    ("MiniMax-M2.1", "num_local_experts", "intermediate_size", 3072, 1536, 256, 8, 62, 0, 0,
     f"{REF} §A.2 MiniMax-M2 config @fbd8a14b [C], M2.1 copy [T]"),
    ("Qwen3-235B-A22B-Instruct-2507", "num_experts", "moe_intermediate_size", 4096, 1536, 128, 8, 94, 0, 0,
     f"{REF} §A.2 copies [T]"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "num_experts", "moe_intermediate_size", 4096, 1536, 128, 8, 94, 0, 0,
     f"{REF} §A.2/§A.3 [T]"),
    ("Qwen3-235B-A22B-Instruct-2507-MXFP4", "num_experts", "moe_intermediate_size", 4096, 1536, 128, 8, 94, 0, 0,
     f"{REF} §A.2 [T] shape, [U] excludes"),
    ("Qwen3.5-397B-A17B-MXFP4", "num_experts", "moe_intermediate_size", 4096, 1024, 512, 10, 60, 0, 1024,
     f"{REF} §A.2 [T]; L=60 [D] + THUDM/slime qwen3.5-397B-A17B.sh [T]"),
    ("Qwen3-30B-A3B", "num_experts", "moe_intermediate_size", 2048, 768, 128, 8, 48, 0, 0,
     f"{REF} §A.2 [T]"),
    ("GLM-4.7", "n_routed_experts", "moe_intermediate_size", 5120, 1536, 160, 8, 92, 3, 1536,
     f"{REF} §A.2 zai-org/GLM-4.7 config refs/pr/49 [C]"),
    ("grok-1", "num_experts", "intermediate_size", 6144, 32768, 8, 2, 64, 0, 0,
     f"{REF} §A.2 hpcai-tech/grok-1 [C]; key name from hpcai Grok1Config [T]"),
    ("grok-2", "num_local_experts", "moe_intermediate_size", 8192, 16384, 8, 2, 64, 0, 0,
     f"{REF} §A.2 jhpristine/grok-2 copy [T] + param-count check [D]"),
    ("gpt-oss-120b", "num_local_experts", "intermediate_size", 2880, 2880, 128, 4, 36, 0, 0,
     f"{REF} §A.2 copies [T]"),
    ("gpt-oss-20b", "num_local_experts", "intermediate_size", 2880, 2880, 32, 4, 24, 0, 0,
     f"{REF} §A.2 copies [T]"),
    ("DeepSeek-V3", "n_routed_experts", "moe_intermediate_size", 7168, 2048, 256, 8, 61, 3, 2048,
     f"{REF} §A.2 copies [T]"),
    ("Kimi-K2", "n_routed_experts", "moe_intermediate_size", 7168, 2048, 384, 8, 61, 1, 2048,
     f"{REF} §A.2 Megatron-Bridge KimiK2Provider [C]"),
    ("Mixtral-8x7B", "num_local_experts", "intermediate_size", 4096, 14336, 8, 2, 32, 0, 0,
     f"{REF} §A.2 Mixtral-8x7B-Instruct-v0.1 config @eba92302 [C]"),
    ("Llama-4-Scout-17B-16E", "num_local_experts", "intermediate_size", 5120, 8192, 16, 1, 48, 0, 8192,
     f"{REF} §A.2 transformers Llama4TextConfig defaults [C]"),
    ("Llama-4-Maverick-17B-128E-Instruct-FP8", "num_local_experts", "intermediate_size", 5120, 8192, 128, 1, 48, 24,
     8192, f"{REF} §A.2 TensorRT-LLM fixture copy [T]"),
    ("DeepSeek-V4-Pro", "n_routed_experts", "moe_intermediate_size", 7168, 3072, 384, 6, 61, 3, 3072,
     "ROCm/aiter@e4048607a5 model_configs dsv4_fp8fp4; vllm-project/vllm#56359 (layers unconfirmed)"),
    ("Kimi-K3-MXFP4", "n_routed_experts", "moe_intermediate_size", 3584, 3072, 896, 16, 92, 0, 3072,
     "ROCm/aiter@e4048607a5 model_configs kimik3_fp4; ROCm/aiter#5439 (92 MoE layers)"),
    ("Kimi-K2.5", "n_routed_experts", "moe_intermediate_size", 7168, 2048, 384, 8, 61, 1, 2048, "ROCm/aiter@e4048607a5 model_configs kimik2_i4"),
    ("Kimi-K2.5-MXFP4", "n_routed_experts", "moe_intermediate_size", 7168, 2048, 384, 8, 61, 1, 2048, "ROCm/aiter@e4048607a5 model_configs kimik2_fp4"),
    ("GLM-5-FP8", "n_routed_experts", "moe_intermediate_size", 6144, 2048, 256, 8, 78, 3, 2048,
     "ROCm/aiter@e4048607a5 model_configs a8w8_blockscale glm5 (layers unconfirmed)"),
    ("GLM-5.1-MXFP4", "n_routed_experts", "moe_intermediate_size", 6144, 2048, 256, 8, 78, 3, 2048,
     "ROCm/aiter@e4048607a5 model_configs glm5_fp4 (layers unconfirmed)"),
    ("MiniMax-M2.5", "num_local_experts", "intermediate_size", 3072, 1536, 256, 8, 62, 0, 0, "vllm-project/vllm#48173"),
    ("MiniMax-M2.5-MXFP4", "num_local_experts", "intermediate_size", 3072, 1536, 256, 8, 62, 0, 0, "ROCm/aiter@e4048607a5 model_configs minimax_m25_fp4"),
    ("Qwen3.5-397B-A17B-FP8", "num_experts", "moe_intermediate_size", 4096, 1024, 512, 10, 60, 0, 1024,
     "ROCm/aiter@e4048607a5 model_configs a8w8_blockscale qwen3_5_397b"),
    ("Qwen3-Next-80B-A3B-FP8", "num_experts", "moe_intermediate_size", 2048, 512, 512, 10, 48, 0, 512,
     "ROCm/aiter@e4048607a5 model_configs qwen3next_80b_fp8 (layers unconfirmed)"),
]

# (file, quant_method or None for an unquantized checkpoint, source)
QUANT = [
    ("MiniMax-M3", None, f"{REF} §A.1 bf16 [C]"),
    ("MiniMax-M3-MXFP4", "quark", f"{REF} §A.3 amd card [C]"),
    ("MiniMax-M3-MXFP8", "mxfp8", f"{REF} §A.3 [T]"),
    ("MiniMax-M2.1", "fp8", f"{REF} §A.3 [C]"),
    ("Qwen3-235B-A22B-Instruct-2507", None, f"{REF} §A.1 bf16 [T]"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "fp8", f"{REF} §A.3 [T]"),
    ("Qwen3-235B-A22B-Instruct-2507-MXFP4", "quark", f"{REF} §A.2 [T]/[U]"),
    ("Qwen3.5-397B-A17B-MXFP4", "quark", f"{REF} §A.2 amd card [C]"),
    ("Qwen3-30B-A3B", None, f"{REF} §A.1 bf16 [T]"),
    ("GLM-4.7", None, f"{REF} §A.1 bf16 [C]"),
    ("grok-1", None, f"{REF} §A.1 bf16 port [C]"),
    ("grok-2", None, f"{REF} §A.1 bf16 [T]"),
    ("gpt-oss-120b", "mxfp4", f"{REF} §A.3 [C]"),
    ("gpt-oss-20b", "mxfp4", f"{REF} §A.3 [C]"),
    ("DeepSeek-V3", "fp8", f"{REF} §A.3 [T]"),
    ("Kimi-K2", "fp8", f"{REF} §A.3 [U]"),
    ("Mixtral-8x7B", None, f"{REF} §A.1 bf16 [C]"),
    ("Llama-4-Scout-17B-16E", None, f"{REF} §A.1 bf16 [C]"),
    ("Llama-4-Maverick-17B-128E-Instruct-FP8", "fbgemm_fp8", f"{REF} §A.2 [T/U]"),
    ("DeepSeek-V4-Pro", "quark", "W4A8: fp4 weights x fp8 activations per 1x32 (derived)"),
    ("Kimi-K3-MXFP4", "quark", "W4A16: fp4 weights, bf16 activations (derived)"),
    ("Kimi-K2.5", "compressed-tensors", "INT4 group 32 experts (derived)"),
    ("Kimi-K2.5-MXFP4", "quark", "W4A4 (derived)"),
    ("GLM-5-FP8", "fp8", "block 128x128 (derived)"),
    ("GLM-5.1-MXFP4", "quark", "W4A4 (derived)"),
    ("MiniMax-M2.5", "fp8", "block 128x128: vllm-project/vllm#48173"),
    ("MiniMax-M2.5-MXFP4", "quark", "W4A4 (derived)"),
    ("Qwen3.5-397B-A17B-FP8", "fp8", "block 128x128 (derived)"),
    ("Qwen3-Next-80B-A3B-FP8", "fp8", "block 128x128 (derived)"),
]


def test_library_holds_exactly_the_expected_models():
    assert {p.stem for p in MODELS_DIR.glob("*.json")} == EXPECTED_FILES


def test_tables_cover_every_model():
    assert {row[0] for row in SHAPES} == EXPECTED_FILES
    assert {row[0] for row in QUANT} == EXPECTED_FILES


@pytest.mark.parametrize("name", sorted(EXPECTED_FILES))
def test_file_layout(name):
    doc = _load(name)
    for key in REQUIRED_KEYS:
        assert key in doc, f"{name}: missing top-level key {key!r}"
    assert doc["name"] == name
    assert isinstance(doc["hf_id"], str) and "/" in doc["hf_id"]
    assert isinstance(doc["aliases"], list)
    assert isinstance(doc["sources"], dict) and doc["sources"], f"{name}: sources is empty"
    assert "config" in doc["sources"]
    assert all(isinstance(v, str) and v.strip() for v in doc["sources"].values())
    assert isinstance(doc["notes"], list) and all(isinstance(n, str) for n in doc["notes"])
    config = doc["config"]
    assert isinstance(config.get("architectures"), list) and config["architectures"]
    assert isinstance(config.get("model_type"), str)


@pytest.mark.parametrize(
    "name, experts_key, inter_key, hidden, inter, experts, top_k, layers, dense, shared, source", SHAPES
)
def test_dispatch_shape(name, experts_key, inter_key, hidden, inter, experts, top_k, layers, dense, shared, source):
    t = _text(_load(name)["config"])
    assert t["hidden_size"] == hidden, source
    assert t[inter_key] == inter, source
    assert t[experts_key] == experts, source
    assert t["num_experts_per_tok"] == top_k, source
    assert t["num_hidden_layers"] == layers, source
    assert _dense_layers(t) == dense, source
    assert _shared(t) == shared, source


@pytest.mark.parametrize("name, quant_method, source", QUANT)
def test_quantization_block(name, quant_method, source):
    config = _load(name)["config"]
    assert "quantization_config" not in _text(config) or _text(config) is config, "quant block belongs at top level"
    if quant_method is None:
        assert "quantization_config" not in config, source
        return
    q = config["quantization_config"]
    assert q["quant_method"] == quant_method, source
    if quant_method == "quark":
        gqc = q["global_quant_config"]
        for tensor, dynamic in (("weight", False), ("input_tensors", True)):
            spec = gqc[tensor]
            if tensor == "input_tensors" and ("W4A16" in source or "W4A8" in source):
                # weight-only MXFP4 (no input quant) or fp8 activations per 1x32
                assert spec is None if "W4A16" in source else spec["dtype"].startswith("fp8"), source
                continue
            assert (spec["dtype"], spec["qscheme"], spec["group_size"], spec["scale_format"]) == (
                "fp4", "per_group", 32, "e8m0"), source
            assert spec["is_dynamic"] is dynamic, source
        assert "lm_head" in " ".join(q["exclude"]), source
    elif quant_method == "fp8":
        assert q["weight_block_size"] == [128, 128] and q["activation_scheme"] == "dynamic", source
    elif quant_method == "mxfp8":
        assert q["weight_block_size"] == [1, 32] and q["activation_scheme"] == "dynamic", source
        assert "lm_head" in q["ignored_layers"], source
    elif quant_method == "mxfp4":
        assert "model.layers.*.mlp.router" in q["modules_to_not_convert"], source


def test_minimax_m3_family_is_a_vl_wrapper():
    for name in ("MiniMax-M3", "MiniMax-M3-MXFP4", "MiniMax-M3-MXFP8"):
        config = _load(name)["config"]
        assert config["architectures"] == ["MiniMaxM3SparseForConditionalGeneration"]
        assert config["model_type"] == "minimax_m3_vl"
        t = config["text_config"]
        assert t["moe_layer_freq"] == [0, 0, 0] + [1] * 57
        assert (t["hidden_act"], t["swiglu_alpha"], t["swiglu_limit"]) == ("swigluoai", 1.702, 7.0)
        assert (t["scoring_func"], t["use_routing_bias"], t["routed_scaling_factor"]) == ("sigmoid", True, 2.0)
        assert t["dense_intermediate_size"] == 12288 and t["n_shared_experts"] == 1


def test_minimax_m3_mxfp4_excludes_match_the_card():
    q = _load("MiniMax-M3-MXFP4")["config"]["quantization_config"]
    for pattern in ("*lm_head", "*vision_tower*", "*multi_modal_projector*", "*patch_merge_mlp*",
                    "*block_sparse_moe.gate", "*self_attn*", "*mlp.gate_proj", "*mlp.up_proj", "*mlp.down_proj"):
        assert pattern in q["exclude"]
    # the shared expert is not excluded, so it is MXFP4 too
    assert not any("shared_experts" in p for p in q["exclude"])


def test_gpt_oss_keeps_both_top_k_keys_and_the_real_hidden_act():
    for name in ("gpt-oss-120b", "gpt-oss-20b"):
        config = _load(name)["config"]
        assert config["experts_per_token"] == config["num_experts_per_tok"] == 4
        assert config["swiglu_limit"] == 7.0
        assert config["hidden_act"] == "silu"  # what config.json says; the kernel activation is SwiGLU-OAI


def test_grok2_has_a_residual_dense_mlp():
    config = _load("grok-2")["config"]
    assert config["residual_moe"] is True and config["intermediate_size"] == 32768
