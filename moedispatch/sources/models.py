"""Model references → :class:`ModelSpec` → per-rank :class:`MoELayer` list.

A reference is, in this order:

1. a path that exists: a checkpoint folder with config.json (and optionally ``*.safetensors``,
   ``model.safetensors.index.json``, ``quantization_config.json``, ``hf_quant_config.json``) or a config.json
   path (its folder is the checkpoint) — ``source: path``;
2. a Hugging Face repo id (``org/name[@revision]``) present in the local HF cache (``$HF_HUB_CACHE``,
   ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``; offline only) — ``source: hf-cache``;
3. a built-in name (capability_db/models/*.json, case-insensitive, with or without the org prefix, aliases and
   hf ids) — ``source: builtin``.

Built-in entries are config.json-shaped data and go through exactly the same parser as real checkpoints. For a real
checkpoint the safetensors *headers* are read (never the data) to confirm the expert tensors: their names, dtypes
and shapes are cross-checked against the config, pre-padded experts and fused gate-up layouts are recognised.
Nothing is executed (``auto_map`` / ``trust_remote_code`` code is never imported), nothing is written, and the
network is never used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moedispatch._util.caches import memoize
from moedispatch.data import capdb
from moedispatch.sources.checkpoint import (
    CheckpointInfo, ExpertLayout, analyse_experts, expert_module_names, hf_cache_dir, is_repo_id, resolve_hf_cache,
    safe_stat, scan_checkpoint,
)
from moedispatch.core.errors import ModelError, UsageError
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.sources.quant import QuantScheme, parse_quantization_config
from moedispatch._util.suggest import did_you_mean
from moedispatch.core.errors import CapabilityDBError

__all__ = ["LayerTemplate", "ModelSpec", "load_model", "parse_config", "builtin_models", "expand_layers"]

_MAX_CONFIG_BYTES = 16 * 1024 * 1024
_MAX_LAYERS = 4096
_MAX_SIZE = 1 << 24


@dataclass(frozen=True)
class LayerTemplate:
    """One decoder layer before sharding: what the checkpoint says."""

    index: int
    kind: str  # "moe" | "dense"
    intermediate: int
    experts: int
    top_k: int
    weight: QuantSpec
    act: QuantSpec


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model. Fields after ``notes`` come from the checkpoint's safetensors headers (None when no weight
    file was read): ``stored_intermediate`` / ``stored_hidden`` are the expert sizes as stored (larger than the
    config's when the checkpoint is ``prepadded``), ``fused_gate_up`` tells whether gate and up are one tensor."""

    name: str
    source: str  # builtin | path | hf-cache
    architecture: str | None
    model_type: str
    hidden: int
    layers: tuple[LayerTemplate, ...]
    activation: str
    activation_params: tuple[tuple[str, float], ...]
    has_bias: bool
    shared_experts: int = 0
    shared_intermediate: int = 0
    quant_method: str | None = None
    path: str | None = None
    notes: tuple[str, ...] = ()
    stored_intermediate: int | None = None
    stored_hidden: int | None = None
    fused_gate_up: bool | None = None
    prepadded: bool = False
    stacked_experts: bool | None = None
    tensor_dtypes: tuple[str, ...] = ()
    shards: int = 0
    text_model_type: str | None = None
    #: Facts of a built-in model whose capability_db ``confidence`` is "unconfirmed" / "derived", named by their
    #: ``sources`` key (e.g. ``"quantization_config"``); empty for checkpoints read from disk (their files are the
    #: source). A plan can warn when a fact it relies on is listed here.
    unconfirmed: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()

    @property
    def moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.kind == "moe")

    @property
    def intermediate(self) -> int:
        """The expert intermediate size the config declares (first MoE layer)."""
        return next(t.intermediate for t in self.layers if t.kind == "moe")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "source": self.source, "architecture": self.architecture}
        if self.shards:
            out["checkpoint"] = {
                "path": self.path, "shards": self.shards, "stored_intermediate": self.stored_intermediate,
                "stored_hidden": self.stored_hidden, "fused_gate_up": self.fused_gate_up,
                "prepadded": self.prepadded, "weight_dtypes": list(self.tensor_dtypes),
            }
        return out


# -- config field helpers --------------------------------------------------------------------------------------

def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | tuple[None, None]:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return key, cfg[key]
    return None, None


def _pos_int(value: Any, where: str, *, allow_zero: bool = False, limit: int = _MAX_SIZE) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where} must be an integer, got {_short(value)}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ModelError(f"{where} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    if value > limit:
        raise ModelError(f"{where} = {value} is implausibly large (limit {limit})")
    return value


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelError(f"{where} must be a number, got {_short(value)}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ModelError(f"{where} must be a finite number, got {value}")
    return value


# Keys naming the routed-expert count / top-k across families: Mixtral / MiniMax / gpt-oss / Llama-4 / grok-2
# (num_local_experts), DeepSeek / GLM / Kimi (n_routed_experts), Qwen-MoE / grok-1 port (num_experts), ERNIE
# (moe_num_experts); top-k: num_experts_per_tok (most), experts_per_token (gpt-oss), moe_k / moe_top_k (ERNIE),
# num_selected_experts (grok ports).
_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "moe_k", "num_selected_experts")
_TEXT_KEYS = ("text_config", "llm_config", "language_config")

# Families whose MoE activation is SwiGLU-OAI (gate*sigmoid(alpha*gate)*(up+1), clamped): gpt-oss (interleaved
# gate/up) and MiniMax-M3 (separate halves; vLLM passes "swigluoai_uninterleave" to FusedMoE). Sources:
# vllm-project/vllm@017e9f4448:vllm/transformers_utils/configs/minimax_m3.py (MiniMax-M3 text config defaults),
# vllm-project/vllm@017e9f4448:vllm/models/minimax_m3/amd/model.py (swigluoai_uninterleave),
# vllm-project/vllm@017e9f4448:vllm/model_executor/models/gpt_oss.py (gpt-oss swiglu_limit 7.0, alpha 1.702).
_SWIGLUOAI_UNINTERLEAVE = ("minimax_m3", "minimax_m3_text", "minimax_m3_vl")
_SWIGLUOAI = ("gpt_oss",)
#: hidden_act spellings of SiTU (Kimi-K3): vLLM's MoEActivation.SITU, AITER's ActivationType.Situv2.
_SITU = ("situ", "situv2", "situ_v2")


# grok-1 / grok-2 configs carry no hidden_act: their MoE MLP is GELU-gated, hard-coded in the modeling code
# (https://huggingface.co/hpcai-tech/grok-1/blob/main/modeling_grok1.py; capability_db/models/grok-1.json notes).
_GELU_DEFAULT = ("grok-1", "grok1", "git")


def _activation(text: dict[str, Any], model_type: str, where: str) -> tuple[str, tuple[tuple[str, float], ...]]:
    default = "gelu" if model_type in _GELU_DEFAULT else "silu"
    act = text.get("hidden_act", text.get("hidden_activation", default))
    if act is None:
        act = default
    if not isinstance(act, str):
        raise ModelError(f"{where}.hidden_act must be a string, got {_short(act)}")
    act_l = act.strip().lower()
    if model_type in _SWIGLUOAI_UNINTERLEAVE or model_type in _SWIGLUOAI or act_l in ("swigluoai", "swiglu_oai"):
        alpha = _num(text.get("swiglu_alpha", 1.702), f"{where}.swiglu_alpha")
        limit = _num(text.get("swiglu_limit", 7.0), f"{where}.swiglu_limit")
        if alpha <= 0 or limit <= 0:
            raise ModelError(f"{where}: swiglu_alpha and swiglu_limit must be positive, got {alpha}, {limit}")
        name = "swigluoai_uninterleave" if model_type in _SWIGLUOAI_UNINTERLEAVE else "swigluoai"
        return name, (("alpha", alpha), ("limit", limit))
    if act_l in _SITU:
        # Kimi-K3's SiTU (vLLM MoEActivation.SITU) runs as AITER ActivationType.Situv2, whose beta / linear_beta the
        # kernel bakes in (None -> 1.0): ROCm/aiter@v0.1.19:aiter/fused_moe.py (situ_beta, situ_linear_beta;
        # ROCm/aiter#4397). The engines read them from the config as activation_situ_beta /
        # activation_situ_linear_beta (vllm-project/vllm@v0.33.0:vllm/transformers_utils/configs/kimi_linear.py;
        # sgl-project/sglang@v0.5.23:python/sglang/srt/models/kimi_k3.py); AITER's own names are read when a config
        # uses them instead. Only the values the config states are kept.
        params = []
        for name, keys in (("beta", ("activation_situ_beta", "situ_beta")),
                           ("linear_beta", ("activation_situ_linear_beta", "situ_linear_beta"))):
            key = next((k for k in keys if text.get(k) is not None), None)
            if key is not None:
                params.append((name, _num(text[key], f"{where}.{key}")))
        return "situv2", tuple(params)
    if act_l in ("silu", "swish", "swiglu"):
        return "silu", ()
    if act_l.startswith("gelu") or act_l == "geglu":
        return "gelu", ()
    raise ModelError(f"{where}.hidden_act {act!r} is not a MoE activation moedispatch knows (silu, gelu, swigluoai, "
                     "situ)")


def _index_list(value: Any, n_layers: int, where: str) -> set[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ModelError(f"{where} must be a list of layer indices, got {_short(value)}")
    bad = [i for i in value if not 0 <= i < n_layers]
    if bad:
        raise ModelError(f"{where} lists layer {bad[0]}, outside 0..{n_layers - 1}")
    return set(value)


def _moe_pattern(text: dict[str, Any], n_layers: int, experts: int, where: str) -> list[bool]:
    """Which layers are MoE, from the family's layout keys."""
    if experts == 0:
        return [False] * n_layers
    if text.get("moe_layers") is not None:
        # Llama-4 (newer configs): the explicit list of MoE layer indices.
        moe = _index_list(text["moe_layers"], n_layers, f"{where}.moe_layers")
        return [i in moe for i in range(n_layers)]
    freq = text.get("moe_layer_freq")
    if isinstance(freq, list):
        # MiniMax-M3: one 0/1 flag per layer.
        if len(freq) != n_layers or not all(type(v) in (int, bool) and v in (0, 1) for v in freq):
            raise ModelError(f"{where}.moe_layer_freq must list 0/1 for each of the {n_layers} layers")
        return [bool(v) for v in freq]
    first_dense = text.get("first_k_dense_replace")
    if first_dense is not None or freq is not None:
        k = _pos_int(first_dense if first_dense is not None else 0, f"{where}.first_k_dense_replace",
                     allow_zero=True)
        step = _pos_int(freq if freq is not None else 1, f"{where}.moe_layer_freq")
        # DeepSeek-V3 / GLM-4.x / Kimi-K2: MoE iff layer_idx >= first_k_dense_replace and layer_idx % freq == 0
        # (HF modeling_deepseek_v3).
        return [i >= k and i % step == 0 for i in range(n_layers)]
    if text.get("interleave_moe_layer_step") is not None:
        step = _pos_int(text["interleave_moe_layer_step"], f"{where}.interleave_moe_layer_step")
        # Llama-4: moe_layers = range(step - 1, n_layers, step) (HF configuration_llama4).
        return [i % step == step - 1 for i in range(n_layers)]
    mlp_only = text.get("mlp_only_layers")
    mlp_only = _index_list(mlp_only, n_layers, f"{where}.mlp_only_layers") if mlp_only is not None else set()
    step = _pos_int(text.get("decoder_sparse_step") or 1, f"{where}.decoder_sparse_step")
    # Qwen2/3-MoE: MoE iff layer not in mlp_only_layers and (idx + 1) % decoder_sparse_step == 0.
    return [i not in mlp_only and (i + 1) % step == 0 for i in range(n_layers)]


def _module_names(i: int, kind: str) -> tuple[str, ...]:
    """Names the expert (or dense MLP) gate projection of layer i has across families and wrappers."""
    if kind == "moe":
        leafs = ("block_sparse_moe.experts.0.w1", "mlp.experts.0.gate_proj", "mlp.experts.gate_up_proj",
                 "feed_forward.experts.0.gate_proj", "moe.experts.0.linear", "mlp.experts.0.w1")
    else:
        leafs = ("mlp.gate_proj", "mlp.down_proj", "feed_forward.gate_proj", "mlp.w1")
    prefixes = ("model.layers", "language_model.model.layers", "model.language_model.layers")
    return tuple(f"{p}.{i}.{leaf}" for p in prefixes for leaf in leafs)


def _checkpoint_names(ckpt: CheckpointInfo | None) -> dict[int, tuple[str, ...]]:
    """Layer -> module names of the experts as the checkpoint spells them."""
    return expert_module_names(ckpt.tensors) if ckpt is not None and ckpt.tensors else {}


def parse_config(config: Any, *, name: str, source: str, path: str | None = None,
                 where: str = "config.json", checkpoint: CheckpointInfo | None = None,
                 quant_config: tuple[Any, str] | None = None) -> ModelSpec:
    """A config.json dict (with its quantization_config) → ModelSpec. Every problem is one ModelError line.

    ``checkpoint`` (safetensors headers of the folder) cross-checks the experts; ``quant_config`` is a
    (block, where) from a sidecar file (quantization_config.json / hf_quant_config.json), used when the config
    carries none.
    """
    try:
        return _parse_config(config, name=name, source=source, path=path, where=where, checkpoint=checkpoint,
                             quant_config=quant_config)
    except ModelError:
        raise
    except UsageError as exc:  # a QuantSpec / MoELayer contract check tripped on config values
        raise ModelError(f"{where}: {exc}") from None
    except RecursionError:
        raise ModelError(f"{where}: nests too deeply") from None


@dataclass(frozen=True)
class _Sizes:
    """The sizes a config declares, with the keys they were read from (for messages)."""

    hidden: int
    n_layers: int
    experts: int
    top_k: int
    moe_inter: int
    dense_inter: int
    ekey: str
    kkey: str | None
    ikey: str


def _text_section(config: Any, where: str) -> tuple[dict[str, Any], str]:
    """The (text config, its where) of a config: the nested text_config of a multimodal wrapper, else the config."""
    if not isinstance(config, dict):
        raise ModelError(f"{where}: top level must be a JSON object, got {type(config).__name__}")
    for key in _TEXT_KEYS:
        if config.get(key) is not None:
            if not isinstance(config[key], dict):
                raise ModelError(f"{where}.{key} must be an object, got {type(config[key]).__name__}")
            return config[key], f"{where}: {key}"
    return config, where


def _family(config: dict[str, Any], text: dict[str, Any], where: str) -> tuple[str, Any, str | None]:
    """(model_type, the text config's model_type, architecture) of a config, type-checked."""
    # The family is the top-level model_type: multimodal wrappers name the real model there while the nested
    # text_config may reuse another family's type (MiniMax-M3's text_config says "minimax_m2": SGLang
    # configs/minimax_vl.py, NeMo Automodel minimax_m3_vl/config.py — capability_db/models/MiniMax-M3.json).
    top_type, text_type = config.get("model_type"), text.get("model_type")
    for label, value in (("model_type", top_type), ("text_config.model_type", text_type)):
        if value is not None and not isinstance(value, str):
            raise ModelError(f"{where}.{label} must be a string, got {_short(value)}")
    model_type = top_type or text_type or ""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ModelError(f"{where}.architectures must be a list of strings, got {_short(archs)}")
    return model_type, text_type, archs[0] if archs else None


def _hidden_and_layers(text: dict[str, Any], twhere: str) -> tuple[int, int]:
    """(hidden size, number of decoder layers) of the text config."""
    key, hidden = _first(text, ("hidden_size", "d_model", "n_embd"))
    if key is None:
        raise ModelError(f"{twhere}: no hidden_size")
    hidden = _pos_int(hidden, f"{twhere}.{key}")
    key, n_layers = _first(text, ("num_hidden_layers", "n_layer", "num_layers"))
    if key is None:
        raise ModelError(f"{twhere}: no num_hidden_layers")
    return hidden, _pos_int(n_layers, f"{twhere}.{key}", limit=_MAX_LAYERS)


def _routing(text: dict[str, Any], twhere: str) -> tuple[str, int, str | None, int]:
    """(experts key, routed experts, top-k key, top-k) of the text config."""
    ekey, experts = _first(text, _EXPERTS)
    if ekey is None:
        raise ModelError(f"{twhere}: not a MoE model (none of {', '.join(_EXPERTS)} is set)")
    experts = _pos_int(experts, f"{twhere}.{ekey}", allow_zero=True)
    kkey, top_k = _first(text, _TOPK)
    if experts and kkey is None:
        raise ModelError(f"{twhere}: no top-k ({', '.join(_TOPK)})")
    top_k = _pos_int(top_k, f"{twhere}.{kkey}") if experts else 0
    if top_k > experts:
        raise ModelError(f"{twhere}.{kkey} = {top_k} exceeds the {experts} experts ({ekey})")
    return ekey, experts, kkey, top_k


def _intermediates(text: dict[str, Any], twhere: str) -> tuple[str, int, int]:
    """(expert intermediate key, expert intermediate size, dense MLP intermediate size) of the text config."""
    if text.get("moe_intermediate_size") is not None:
        moe_inter = _pos_int(text["moe_intermediate_size"], f"{twhere}.moe_intermediate_size")
        dkey, dense_inter = _first(text, ("dense_intermediate_size", "intermediate_size", "intermediate_size_mlp"))
        ikey = "moe_intermediate_size"
    else:
        if text.get("intermediate_size") is None:
            raise ModelError(f"{twhere}: no moe_intermediate_size or intermediate_size")
        moe_inter = _pos_int(text["intermediate_size"], f"{twhere}.intermediate_size")
        dkey, dense_inter = _first(text, ("dense_intermediate_size", "intermediate_size_mlp"))
        ikey = "intermediate_size"
    return ikey, moe_inter, _pos_int(dense_inter, f"{twhere}.{dkey}") if dkey else moe_inter


def _sizes(text: dict[str, Any], twhere: str) -> _Sizes:
    """Hidden size, layer count, routing and intermediate sizes of the text config, validated."""
    hidden, n_layers = _hidden_and_layers(text, twhere)
    ekey, experts, kkey, top_k = _routing(text, twhere)
    ikey, moe_inter, dense_inter = _intermediates(text, twhere)
    return _Sizes(hidden, n_layers, experts, top_k, moe_inter, dense_inter, ekey, kkey, ikey)


def _shared_experts(text: dict[str, Any], model_type: str, text_type: Any, moe_inter: int,
                    twhere: str) -> tuple[int, int]:
    """(shared expert count, their total intermediate size) from the family's keys and defaults."""
    shared = text.get("n_shared_experts")
    if shared is None:
        shared = text.get("num_shared_experts")
    shared = _pos_int(shared if shared is not None else 0, f"{twhere}.n_shared_experts", allow_zero=True)
    skey, shared_inter = _first(text, ("shared_intermediate_size", "shared_expert_intermediate_size"))
    if skey:
        shared_inter = _pos_int(shared_inter, f"{twhere}.{skey}", allow_zero=True)
    elif model_type in ("llama4", "llama4_text") or text_type == "llama4_text":
        # Llama-4: every MoE layer has one always-on shared expert of intermediate_size (HF modeling_llama4
        # Llama4TextMoe.shared_expert: huggingface/transformers src/transformers/models/llama4/modeling_llama4.py).
        shared, shared_inter = 1, moe_inter
    else:
        shared_inter = shared * moe_inter
    if shared_inter and not shared:
        shared = 1
    if not shared_inter:
        shared = 0
    return shared, shared_inter


def _quant_scheme(config: dict[str, Any], text: dict[str, Any], where: str, quant_config: tuple[Any, str] | None,
                  notes: list[str]) -> QuantScheme | None:
    """The config's quantization scheme (its own block, else the sidecar file's); notes an ignored sidecar."""
    qwhere = f"{where}: quantization_config"
    qcfg = config.get("quantization_config")
    if qcfg is None:
        qcfg = text.get("quantization_config")
    if qcfg is None and quant_config is not None:
        qcfg, qwhere = quant_config
    elif qcfg is not None and quant_config is not None:
        notes.append(f"{quant_config[1]} ignored: {where} carries its own quantization_config")
    return parse_quantization_config(qcfg, qwhere)


def _base_dtype(config: dict[str, Any], text: dict[str, Any], where: str, notes: list[str]) -> QuantSpec:
    """The unquantized weight type (bf16 or fp16) from torch_dtype / dtype; notes a dtype moedispatch does not know."""
    dtype = text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or config.get("dtype") \
        or "bfloat16"
    if not isinstance(dtype, str):
        raise ModelError(f"{where}.torch_dtype must be a string, got {_short(dtype)}")
    if dtype.lower().removeprefix("torch.") not in _DTYPES:
        notes.append(f"{where}: torch_dtype {_short(dtype, 40)} is no dtype moedispatch knows "
                     f"({', '.join(sorted(_DTYPES))}); the unquantized weights are planned as bf16")
    return QuantSpec("fp16" if dtype.lower() in ("float16", "fp16", "half", "torch.float16") else "bf16")


def _unknown_family_note(model_type: str, where: str, sizes: _Sizes, activation: str, shared: int,
                         has_bias: bool) -> str:
    """The note for a model_type capability_db has no config of: which generic keys and defaults were read."""
    named = f"model_type {model_type!r}" if model_type else "no model_type"
    return (f"{where}: {named} is no family moedispatch has a config of; read from the generic keys "
            f"({sizes.ekey}, {sizes.kkey or 'top-k'}, {sizes.ikey}, hidden_act) with that family's defaults unknown "
            f"— check activation {activation}, {shared} shared expert(s), expert bias "
            f"{'yes' if has_bias else 'no'} against the model's code")


def _layer_templates(pattern: list[bool], sizes: _Sizes, scheme: QuantScheme | None, base: QuantSpec,
                     checkpoint: CheckpointInfo | None) -> list[LayerTemplate]:
    """One LayerTemplate per decoder layer, with the weight / activation types the quantization scheme gives it."""
    ck_names = _checkpoint_names(checkpoint)
    layers = []
    for i, is_moe in enumerate(pattern):
        kind = "moe" if is_moe else "dense"
        if scheme is None:
            weight, act = base, base
        else:
            names = ck_names.get(i, ()) + _module_names(i, kind) if is_moe else _module_names(i, kind)
            weight, act, _why = scheme.for_module(names, kind)
            if not weight.quantized:
                weight = act = base
            elif not act.quantized:
                act = base
        layers.append(LayerTemplate(i, kind, sizes.moe_inter if is_moe else sizes.dense_inter,
                                    sizes.experts if is_moe else 0, sizes.top_k if is_moe else 0, weight, act))
    return layers


def _checkpoint_layout(checkpoint: CheckpointInfo | None, layers: list[LayerTemplate], sizes: _Sizes, twhere: str,
                       notes: list[str]) -> ExpertLayout | None:
    """Cross-check the experts with the checkpoint's safetensors headers; notes what could not be checked."""
    if checkpoint is None or not checkpoint.tensors:
        if checkpoint is not None and checkpoint.index_names:
            notes.append(f"safetensors shards not present ({len(checkpoint.missing_shards)} listed by the index); "
                         "shapes from config only")
        return None
    layout = analyse_experts(
        checkpoint.tensors, hidden=sizes.hidden, intermediate=sizes.moe_inter, experts=sizes.experts,
        n_layers=sizes.n_layers, moe_layers=[t.index for t in layers if t.kind == "moe"],
        weight_label={t.index: t.weight.dtype for t in layers if t.kind == "moe"},
        where=f"{twhere} ({sizes.ekey}={sizes.experts}, {sizes.ikey}={sizes.moe_inter}, hidden_size={sizes.hidden})",
        complete=not checkpoint.missing_shards,
    )
    if checkpoint.missing_shards:
        total = len(checkpoint.shards) + len(checkpoint.missing_shards)
        notes.append(f"{len(checkpoint.missing_shards)} of {total} safetensors shards listed by the index are "
                     "not present; checked the ones that are")
    if layout is None:
        notes.append("no routed-expert tensors recognised in the safetensors headers; shapes from config only")
    else:
        notes.extend(layout.notes)
    return layout


def _grok_int4(layers: list[LayerTemplate], scheme: QuantScheme | None, layout: ExpertLayout,
               notes: list[str]) -> list[LayerTemplate]:
    """The layers with int4 expert weights when int32-packed experts sit under an fp8 config (Grok INT4-FP8)."""
    if scheme is not None and scheme.method == "fp8" and {"I32", "U32"} & set(layout.weight_dtypes):
        # Grok INT4-FP8: an fp8 quantization_config with int32-packed int4 expert weights, per-channel
        # scales, fp8 activations (sgl-project/sglang scripts/quark/README.md; SGLang enables it with
        # SGLANG_INT4_WEIGHT=1). Activations keep what the fp8 block prescribes.
        int4 = QuantSpec("int4", "channel", scale_dtype="fp32")
        layers = [replace(t, weight=int4) if t.kind == "moe" and t.weight.dtype == "fp8"
                  else t for t in layers]
        notes.append("experts are int4 (int32-packed) under an fp8 config: Grok-style INT4 weights with "
                     "FP8 activations (SGLang SGLANG_INT4_WEIGHT=1)")
    return layers


def _checkpoint_fields(layout: ExpertLayout | None, checkpoint: CheckpointInfo | None,
                       sizes: _Sizes) -> dict[str, Any]:
    """The ModelSpec fields the safetensors headers give (None / empty when no weight file was read)."""
    stored_i = layout.stored_intermediate if layout else None
    stored_h = layout.stored_hidden if layout else None
    return {
        "stored_intermediate": stored_i, "stored_hidden": stored_h,
        "fused_gate_up": layout.fused_gate_up if layout else None,
        "prepadded": bool(layout and ((stored_i or 0) > sizes.moe_inter or (stored_h or 0) > sizes.hidden)),
        "stacked_experts": layout.stacked if layout else None,
        "tensor_dtypes": layout.weight_dtypes if layout else (),
        "shards": len(checkpoint.shards) if checkpoint is not None else 0,
    }


def _parse_config(config: Any, *, name: str, source: str, path: str | None, where: str,
                  checkpoint: CheckpointInfo | None, quant_config: tuple[Any, str] | None) -> ModelSpec:
    """:func:`parse_config` without its error translation: read the config step by step into a ModelSpec."""
    text, twhere = _text_section(config, where)
    model_type, text_type, architecture = _family(config, text, where)
    sizes = _sizes(text, twhere)
    pattern = _moe_pattern(text, sizes.n_layers, sizes.experts, twhere)
    if not any(pattern):
        raise ModelError(f"{twhere}: no layer is a MoE layer")
    activation, params = _activation(text, model_type, twhere)
    # gpt-oss experts carry biases (vllm-project/vllm@017e9f4448:vllm/model_executor/models/gpt_oss.py)
    has_bias = model_type in _SWIGLUOAI
    shared, shared_inter = _shared_experts(text, model_type, text_type, sizes.moe_inter, twhere)

    notes: list[str] = []
    scheme = _quant_scheme(config, text, where, quant_config, notes)
    base = _base_dtype(config, text, where, notes)
    if model_type not in _known_model_types():
        notes.append(_unknown_family_note(model_type, where, sizes, activation, shared, has_bias))
    layers = _layer_templates(pattern, sizes, scheme, base, checkpoint)
    layout = _checkpoint_layout(checkpoint, layers, sizes, twhere, notes)
    if layout is not None:
        has_bias = has_bias or layout.has_bias
        layers = _grok_int4(layers, scheme, layout, notes)

    return ModelSpec(
        name=name, source=source, architecture=architecture, model_type=model_type, hidden=sizes.hidden,
        layers=tuple(layers), activation=activation, activation_params=params, has_bias=has_bias,
        shared_experts=shared, shared_intermediate=shared_inter,
        quant_method=scheme.method if scheme else None, path=path, notes=tuple(notes),
        text_model_type=text_type if text is not config else None, **_checkpoint_fields(layout, checkpoint, sizes),
    )


def expand_layers(spec: ModelSpec, tp: int = 1, ep: int = 1) -> list[MoELayer]:
    """Per-rank layers for a TP/EP deployment (validates divisibility with one clear error)."""
    out = []
    for t in spec.layers:
        out.append(MoELayer.build(
            index=t.index, kind=t.kind, hidden=spec.hidden, intermediate=t.intermediate, experts=t.experts,
            top_k=t.top_k, tp=tp, ep=ep, activation=spec.activation if t.kind == "moe" else "silu",
            activation_params=spec.activation_params if t.kind == "moe" else (),
            has_bias=spec.has_bias and t.kind == "moe", weight=t.weight, act=t.act, model=spec.name,
            model_type=spec.model_type, shared_experts=spec.shared_experts if t.kind == "moe" else 0,
            shared_intermediate=spec.shared_intermediate if t.kind == "moe" else 0,
        ))
    return out


# -- resolution -----------------------------------------------------------------------------------------------

#: torch_dtype spellings of a checkpoint's unquantized weights (HF configs write the torch dtype's name).
_DTYPES = frozenset({"bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float", "auto"})


@memoize(maxsize=None)
def _known_model_types() -> frozenset[str]:
    """model_type values (top level and text config) of the built-in models, plus the families this module names."""
    known = set(_SWIGLUOAI_UNINTERLEAVE) | set(_SWIGLUOAI) | set(_GELU_DEFAULT) | {"llama4", "llama4_text"}
    for entry in builtin_models():
        config = entry["config"] if isinstance(entry["config"], dict) else {}
        known.add(str(config.get("model_type") or ""))
        for key in _TEXT_KEYS:
            if isinstance(config.get(key), dict):
                known.add(str(config[key].get("model_type") or ""))
    known.discard("")
    return frozenset(known)


@memoize(maxsize=None)
def builtin_models() -> tuple[dict[str, Any], ...]:
    entries = []
    for fname in capdb.list_model_files():
        data = capdb.load_json("models/" + fname)
        for key in ("name", "config", "sources"):
            if key not in data:
                raise CapabilityDBError(f"capability_db/models/{fname}: missing key {key!r}")
        _check_confidence(data, f"capability_db/models/{fname}")
        entries.append(data)
    return tuple(entries)


def _check_confidence(data: dict[str, Any], where: str) -> None:
    """``confidence`` maps ``sources`` keys to confirmed|derived|unconfirmed; anything else is a CapabilityDBError."""
    conf = data.get("confidence", {})
    if not isinstance(conf, dict):
        raise CapabilityDBError(f"{where}: confidence must be a table of sources key -> level")
    sources = data["sources"] if isinstance(data["sources"], dict) else {}
    for key, level in conf.items():
        if key not in sources:
            raise CapabilityDBError(f"{where}: confidence.{key} names no sources entry")
        if level not in capdb.CONFIDENCES:
            raise CapabilityDBError(f"{where}: confidence.{key} = {level!r:.60} not one of "
                                    f"{', '.join(capdb.CONFIDENCES)}")


def _norm(name: str) -> str:
    return name.strip().lower()


def _other_names(entry: dict[str, Any]) -> list[str]:
    """A built-in model's HF id and aliases (what ``models`` lists and an alias note names)."""
    return [n for n in [entry.get("hf_id"), *(entry.get("aliases") or [])] if n]


def _suggest(ref: str) -> str:
    """`` (did you mean 'X'?)`` over built-in names, HF ids and aliases (and their last path part); a match that is
    not a built-in name says which built-in it stands for."""
    names: dict[str, str] = {}
    for entry in builtin_models():
        for n in [entry["name"], *_other_names(entry)]:
            names.setdefault(n, entry["name"])
            names.setdefault(n.split("/")[-1], entry["name"])
    hint = did_you_mean(ref.split("/")[-1], names)
    if not hint:
        return ""
    match = hint[len(" (did you mean '"):-len("'?)")]
    return hint if names[match] == match else f" (did you mean {match!r}, an alias of {names[match]}?)"


@memoize(maxsize=None)
def _builtin_index() -> dict[str, dict[str, Any]]:
    index: dict[str, dict[str, Any]] = {}
    for entry in builtin_models():
        names = [entry["name"], *(entry.get("aliases") or [])]
        if entry.get("hf_id"):
            names.append(entry["hf_id"])
        for n in names:
            index.setdefault(_norm(n), entry)
            index.setdefault(_norm(n.split("/")[-1]), entry)
    return index


def _read_json(path: Path, what: str = "config.json") -> Any:
    st = safe_stat(path, what)
    if st is None:
        raise ModelError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelError(f"{path}: not a regular file")
    if st.st_size > _MAX_CONFIG_BYTES:
        raise ModelError(f"{path}: {st.st_size} bytes is too large for a {what}")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{exc.__class__.__name__}: {exc}"
        raise ModelError(f"{path}: cannot read: {detail}") from None
    except RecursionError:
        raise ModelError(f"{path}: JSON nests too deeply") from None
    except ValueError as exc:
        raise ModelError(f"{path}: not valid JSON: {exc}") from None


def _sidecar_quant(folder: Path) -> tuple[Any, str] | None:
    """quantization_config.json or hf_quant_config.json (ModelOpt) next to config.json."""
    for fname in ("quantization_config.json", "hf_quant_config.json"):
        p = folder / fname
        if safe_stat(p, fname) is None:
            continue
        data = _read_json(p, fname)
        if not isinstance(data, dict):
            raise ModelError(f"{p}: top level must be a JSON object, got {type(data).__name__}")
        if fname == "hf_quant_config.json":
            return data, str(p)
        if isinstance(data.get("quantization_config"), dict):
            return data["quantization_config"], f"{p}: quantization_config"
        if "quant_method" not in data:  # infer the dialect from its shape
            if "global_quant_config" in data or "layer_quant_config" in data:
                data = {**data, "quant_method": "quark"}
            elif "config_groups" in data:
                data = {**data, "quant_method": "compressed-tensors"}
        return data, str(p)
    return None


def _display_name(folder: Path) -> str:
    """Folder name, or org/name for a snapshot folder of an HF cache (models--org--name/snapshots/<rev>)."""
    resolved = Path(os.path.abspath(folder))
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        parts = resolved.parent.parent.name[len("models--"):].split("--", 1)
        return "/".join(parts)
    return resolved.name or str(resolved)


def _load_folder(folder: Path, cfg_path: Path, *, name: str, source: str) -> ModelSpec:
    config = _read_json(cfg_path)
    checkpoint = scan_checkpoint(folder)
    return parse_config(config, name=name, source=source, path=str(folder), where=str(cfg_path),
                        checkpoint=checkpoint, quant_config=_sidecar_quant(folder))


@memoize(maxsize=64)
def _load_builtin(name: str) -> ModelSpec:
    entry = next(e for e in builtin_models() if e["name"] == name)
    spec = parse_config(entry["config"], name=entry["name"], source="builtin",
                        where=f"capability_db/models/{entry['name']}.json: config")
    conf = entry.get("confidence", {})
    return replace(spec, unconfirmed=tuple(k for k, v in conf.items() if v == "unconfirmed"),
                   derived=tuple(k for k, v in conf.items() if v == "derived"))


def load_model(ref: str) -> ModelSpec:
    """Resolve a model reference (see module docstring) into a ModelSpec."""
    if not isinstance(ref, str) or not ref.strip():
        raise ModelError("--model needs a model name, a checkpoint folder, a config.json path or an HF repo id")
    if "\x00" in ref:
        raise ModelError("--model contains a NUL character")
    path = Path(ref).expanduser()
    st = safe_stat(path, "--model path")
    if st is not None:
        if os.path.isdir(path):
            cfg_path = path / "config.json"
            if safe_stat(cfg_path, "config.json") is None:
                raise ModelError(f"{path}: no config.json in this folder")
            return _load_folder(path, cfg_path, name=_display_name(path), source="path")
        return _load_folder(path.parent, path, name=_display_name(path.parent), source="path")
    if is_repo_id(ref.strip()):
        hit = resolve_hf_cache(ref.strip())
        if hit is not None:
            repo_id, snap = hit
            cfg_path = snap / "config.json"
            if safe_stat(cfg_path, "config.json") is None:
                raise ModelError(f"{repo_id}: the local HF cache snapshot {snap} has no config.json")
            return _load_folder(snap, cfg_path, name=repo_id, source="hf-cache")
    entry = _builtin_index().get(_norm(ref)) or _builtin_index().get(_norm(ref.split("/")[-1]))
    if entry is not None:
        spec = _load_builtin(entry["name"])
        if _norm(ref) != _norm(entry["name"]):  # an alias or HF id: say which built-in the plan is of
            spec = replace(spec, notes=spec.notes + (
                f"model {ref.strip()} is planned as the built-in {entry['name']} (one of its declared names: "
                f"{', '.join(_other_names(entry))}; same architecture and expert shapes)",))
        return spec
    if is_repo_id(ref.strip()):
        raise ModelError(f"{ref.strip()!r} is not a built-in model and is not in the local Hugging Face cache "
                         f"({hf_cache_dir()}); moedispatch never downloads: fetch it first (e.g. hf "
                         f"download {ref.strip()} config.json) or pass a folder")
    if os.sep in ref or ref.startswith((".", "~")) or ref.endswith(".json"):
        raise ModelError(f"{ref}: no such file or folder")
    known = sorted(e["name"] for e in builtin_models())
    raise ModelError(f"unknown model {ref!r}{_suggest(ref)}: not a built-in name, folder, config.json or "
                     "cached HF repo id "
                     f"(built-in: {', '.join(known)})")
