"""Model references → :class:`ModelSpec` → per-rank :class:`MoELayer` list.

A reference is a built-in name (capability_db/models/*.json, case-insensitive, with or without the org prefix),
a checkpoint folder with config.json, or a config.json path. Built-in entries are config.json-shaped data and
go through exactly the same parser as real checkpoints. Nothing is executed (``auto_map`` code is never
imported), nothing is written, and the network is never used.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moedispatch import capdb
from moedispatch.errors import ModelError
from moedispatch.layers import MoELayer, QuantSpec
from moedispatch.quant import QuantScheme, parse_quantization_config

__all__ = ["LayerTemplate", "ModelSpec", "load_model", "parse_config", "builtin_models", "expand_layers"]

_MAX_CONFIG_BYTES = 16 * 1024 * 1024


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
    quant_why: str = ""


@dataclass(frozen=True)
class ModelSpec:
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

    @property
    def moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.kind == "moe")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "architecture": self.architecture}


# -- config field helpers --------------------------------------------------------------------------------------

def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | tuple[None, None]:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return key, cfg[key]
    return None, None


def _pos_int(value: Any, where: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ModelError(f"{where} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    if value > 1 << 24:
        raise ModelError(f"{where} = {value} is implausibly large")
    return value


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelError(f"{where} must be a number, got {value!r}")
    return float(value)


_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "num_selected_experts")

# Families whose MoE activation is SwiGLU-OAI (gate*sigmoid(alpha*gate)*(up+1), clamped): gpt-oss (interleaved
# gate/up) and MiniMax-M3 (separate halves; vLLM passes "swigluoai_uninterleave" to FusedMoE). Sources: vllm.md
# §15.1 (MiniMax-M3 text config defaults), models_hw.md §A.2 (gpt-oss swiglu_limit 7.0, alpha 1.702).
_SWIGLUOAI_UNINTERLEAVE = ("minimax_m3", "minimax_m3_text", "minimax_m3_vl")
_SWIGLUOAI = ("gpt_oss",)


# grok-1 / grok-2 configs carry no hidden_act: their MoE MLP is GELU-gated, hard-coded in the modeling code
# (models_hw.md §A.1; hpcai-tech/grok-1 modeling_grok1.py; capability_db/models/grok-1.json notes).
_GELU_DEFAULT = ("grok-1", "grok1", "git")


def _activation(text: dict[str, Any], model_type: str, where: str) -> tuple[str, tuple[tuple[str, float], ...]]:
    default = "gelu" if model_type in _GELU_DEFAULT else "silu"
    act = text.get("hidden_act", text.get("hidden_activation", default))
    if not isinstance(act, str):
        raise ModelError(f"{where}.hidden_act must be a string, got {act!r}")
    act_l = act.lower()
    if model_type in _SWIGLUOAI_UNINTERLEAVE or model_type in _SWIGLUOAI or act_l in ("swigluoai", "swiglu_oai"):
        alpha = _num(text.get("swiglu_alpha", 1.702), f"{where}.swiglu_alpha")
        limit = _num(text.get("swiglu_limit", 7.0), f"{where}.swiglu_limit")
        name = "swigluoai_uninterleave" if model_type in _SWIGLUOAI_UNINTERLEAVE else "swigluoai"
        return name, (("alpha", alpha), ("limit", limit))
    if act_l in ("silu", "swish", "swiglu"):
        return "silu", ()
    if act_l.startswith("gelu"):
        return "gelu", ()
    raise ModelError(f"{where}.hidden_act {act!r} is not a MoE activation moedispatch knows (silu, gelu, swigluoai)")


def _moe_pattern(text: dict[str, Any], n_layers: int, experts: int, where: str) -> list[bool]:
    """Which layers are MoE, from the family's layout keys."""
    if experts == 0:
        return [False] * n_layers
    freq = text.get("moe_layer_freq")
    if isinstance(freq, list):
        if len(freq) != n_layers or not all(v in (0, 1, True, False) for v in freq):
            raise ModelError(f"{where}.moe_layer_freq must list 0/1 for each of the {n_layers} layers")
        return [bool(v) for v in freq]
    first_dense = text.get("first_k_dense_replace")
    if first_dense is not None:
        k = _pos_int(first_dense, f"{where}.first_k_dense_replace", allow_zero=True)
        step = _pos_int(freq if freq is not None else 1, f"{where}.moe_layer_freq")
        # DeepSeek-V3 / GLM-4.x / Kimi-K2: MoE iff layer_idx >= first_k_dense_replace and layer_idx % freq == 0
        # (HF modeling_deepseek_v3).
        return [i >= k and i % step == 0 for i in range(n_layers)]
    if "interleave_moe_layer_step" in text:
        step = _pos_int(text["interleave_moe_layer_step"], f"{where}.interleave_moe_layer_step")
        # Llama-4: moe_layers = range(step - 1, n_layers, step) (HF configuration_llama4).
        return [i % step == step - 1 for i in range(n_layers)]
    mlp_only = text.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise ModelError(f"{where}.mlp_only_layers must be a list of layer indices")
    step = _pos_int(text.get("decoder_sparse_step", 1), f"{where}.decoder_sparse_step")
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


def parse_config(config: Any, *, name: str, source: str, path: str | None = None,
                 where: str = "config.json") -> ModelSpec:
    """A config.json dict (with its quantization_config) → ModelSpec. Every problem is one ModelError line."""
    if not isinstance(config, dict):
        raise ModelError(f"{where}: top level must be a JSON object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    twhere = f"{where}: text_config" if text is not config else where
    # The family is the top-level model_type: multimodal wrappers name the real model there while the nested
    # text_config may reuse another family's type (MiniMax-M3's text_config says "minimax_m2": SGLang
    # configs/minimax_vl.py, NeMo Automodel minimax_m3_vl/config.py — capability_db/models/MiniMax-M3.json).
    model_type = str(config.get("model_type") or text.get("model_type") or "")
    archs = config.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

    key, hidden = _first(text, ("hidden_size", "d_model", "n_embd"))
    if key is None:
        raise ModelError(f"{twhere}: no hidden_size")
    hidden = _pos_int(hidden, f"{twhere}.{key}")
    key, n_layers = _first(text, ("num_hidden_layers", "n_layer", "num_layers"))
    if key is None:
        raise ModelError(f"{twhere}: no num_hidden_layers")
    n_layers = _pos_int(n_layers, f"{twhere}.{key}")

    ekey, experts = _first(text, _EXPERTS)
    if ekey is None:
        raise ModelError(f"{twhere}: not a MoE model (none of {', '.join(_EXPERTS)} is set)")
    experts = _pos_int(experts, f"{twhere}.{ekey}", allow_zero=True)
    kkey, top_k = _first(text, _TOPK)
    if experts and kkey is None:
        raise ModelError(f"{twhere}: no top-k ({', '.join(_TOPK)})")
    top_k = _pos_int(top_k, f"{twhere}.{kkey}") if experts else 0
    if top_k > experts:
        raise ModelError(f"{twhere}.{kkey} = {top_k} exceeds the {experts} experts")

    if "moe_intermediate_size" in text and text["moe_intermediate_size"] is not None:
        moe_inter = _pos_int(text["moe_intermediate_size"], f"{twhere}.moe_intermediate_size")
        dkey, dense_inter = _first(text, ("dense_intermediate_size", "intermediate_size", "intermediate_size_mlp"))
    else:
        if "intermediate_size" not in text:
            raise ModelError(f"{twhere}: no moe_intermediate_size or intermediate_size")
        moe_inter = _pos_int(text["intermediate_size"], f"{twhere}.intermediate_size")
        dkey, dense_inter = _first(text, ("dense_intermediate_size", "intermediate_size_mlp"))
    dense_inter = _pos_int(dense_inter, f"{twhere}.{dkey}") if dkey else moe_inter

    pattern = _moe_pattern(text, n_layers, experts, twhere)
    if not any(pattern):
        raise ModelError(f"{twhere}: no layer is a MoE layer")

    activation, params = _activation(text, model_type, twhere)
    has_bias = model_type in _SWIGLUOAI  # gpt-oss experts carry biases (models_hw.md §A.1)

    shared = text.get("n_shared_experts") or text.get("num_shared_experts") or 0
    shared = _pos_int(shared, f"{twhere}.n_shared_experts", allow_zero=True)
    skey, shared_inter = _first(text, ("shared_intermediate_size", "shared_expert_intermediate_size"))
    shared_inter = _pos_int(shared_inter, f"{twhere}.{skey}", allow_zero=True) if skey else shared * moe_inter
    if shared_inter and not shared:
        shared = 1

    qcfg = config.get("quantization_config", text.get("quantization_config"))
    scheme: QuantScheme | None = parse_quantization_config(qcfg, f"{where}: quantization_config")
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or config.get("dtype")
                or "bfloat16").lower()
    base = QuantSpec("fp16" if dtype in ("float16", "fp16", "half") else "bf16")

    layers = []
    for i, is_moe in enumerate(pattern):
        kind = "moe" if is_moe else "dense"
        if scheme is None:
            weight, act, why = base, base, "unquantized checkpoint"
        else:
            weight, act, why = scheme.for_module(_module_names(i, kind))
            if not weight.quantized:
                weight = act = base
            elif not act.quantized:
                act = base
        layers.append(LayerTemplate(i, kind, moe_inter if is_moe else dense_inter, experts if is_moe else 0,
                                    top_k if is_moe else 0, weight, act, why))
    return ModelSpec(
        name=name, source=source, architecture=architecture, model_type=model_type, hidden=hidden,
        layers=tuple(layers), activation=activation, activation_params=params, has_bias=has_bias,
        shared_experts=shared, shared_intermediate=shared_inter,
        quant_method=scheme.method if scheme else None, path=path,
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

@functools.lru_cache(maxsize=None)
def builtin_models() -> tuple[dict[str, Any], ...]:
    entries = []
    for fname in capdb.list_model_files():
        data = capdb.load_json("models/" + fname)
        for key in ("name", "config", "sources"):
            if key not in data:
                from moedispatch.errors import CapabilityDBError

                raise CapabilityDBError(f"capability_db/models/{fname}: missing key {key!r}")
        entries.append(data)
    return tuple(entries)


def _norm(name: str) -> str:
    return name.strip().lower()


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


def _read_config(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > _MAX_CONFIG_BYTES:
            raise ModelError(f"{path}: {size} bytes is too large for a config.json")
        with path.open("rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except ModelError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read: {exc.__class__.__name__}: {exc}") from None
    except ValueError as exc:
        raise ModelError(f"{path}: not valid JSON: {exc}") from None


@functools.lru_cache(maxsize=64)
def load_model(ref: str) -> ModelSpec:
    """Resolve a model reference (see module docstring) into a ModelSpec."""
    if not isinstance(ref, str) or not ref.strip():
        raise ModelError("--model needs a model name, a checkpoint folder or a config.json path")
    entry = _builtin_index().get(_norm(ref)) or _builtin_index().get(_norm(ref.split("/")[-1]))
    looks_like_path = os.sep in ref or ref.startswith((".", "~")) or ref.endswith(".json")
    if entry is not None and not (looks_like_path and Path(ref).expanduser().exists()):
        return parse_config(entry["config"], name=entry["name"], source="builtin",
                            where=f"capability_db/models/{entry['name']}.json: config")
    path = Path(ref).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ModelError(f"{path}: no config.json in this folder")
        return parse_config(_read_config(cfg_path), name=path.resolve().name, source="path", path=str(path),
                            where=str(cfg_path))
    if path.is_file():
        return parse_config(_read_config(path), name=path.resolve().parent.name, source="path", path=str(path),
                            where=str(path))
    known = sorted(e["name"] for e in builtin_models())
    raise ModelError(f"unknown model {ref!r}: not a built-in name, folder or config.json "
                     f"(built-in: {', '.join(known)})")
