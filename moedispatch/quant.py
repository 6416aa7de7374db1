"""quantization_config parsers: every dialect in use for MoE checkpoints, to (weight, activation) QuantSpecs.

Each parser turns the checkpoint's block into a :class:`QuantScheme` that answers, for one module name, how its
weights and the activations entering it are quantized (after the checkpoint's exclude/ignore lists). Sources of
each dialect's shape: moedispatch reference models_hw.md §A.3 and vllm.md §4 (Quark OCP-MX wiring).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from moedispatch.errors import ModelError
from moedispatch.layers import QuantSpec

__all__ = ["QuantScheme", "parse_quantization_config", "SUPPORTED_METHODS"]

BF16 = QuantSpec("bf16")


@dataclass(frozen=True)
class Rule:
    """Modules matching ``patterns`` (globs, or ``re:`` regexes) get (weight, act); ``None`` means unquantized."""

    patterns: tuple[str, ...]
    weight: QuantSpec
    act: QuantSpec


@dataclass(frozen=True)
class QuantScheme:
    """A parsed quantization_config: ``method``, a default (weight, act), per-pattern overrides, exclusions."""

    method: str
    weight: QuantSpec
    act: QuantSpec
    overrides: tuple[Rule, ...] = ()
    exclude: tuple[str, ...] = ()
    description: str = ""

    def for_module(self, names: tuple[str, ...]) -> tuple[QuantSpec, QuantSpec, str]:
        """(weight, act, why) for a module known under any of ``names`` (engines differ in prefixes)."""
        for pattern in self.exclude:
            for name in names:
                if _match(pattern, name):
                    return BF16, BF16, f"excluded by {self.method} pattern {pattern!r}"
        for rule in self.overrides:
            for pattern in rule.patterns:
                for name in names:
                    if _match(pattern, name):
                        return rule.weight, rule.act, f"{self.method} per-layer config {pattern!r}"
        return self.weight, self.act, f"{self.method} {self.description}".strip()


def _match(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.fullmatch(pattern[3:], name) is not None or re.match(pattern[3:], name) is not None
        except re.error:
            raise ModelError(f"quantization_config: bad regex {pattern!r}") from None
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    # Plain names: HF / vLLM match exact names or dotted suffixes/prefixes ("lm_head", "gate").
    return name == pattern or name.endswith("." + pattern) or name.startswith(pattern + ".") \
        or ("." + pattern + ".") in ("." + name + ".")


def _fp8_fmt(text: Any, where: str) -> str:
    value = str(text or "e4m3").lower().replace("float8_", "")
    table = {"e4m3": "e4m3fn", "e4m3fn": "e4m3fn", "e4m3fnuz": "e4m3fnuz", "e5m2": "e5m2", "e5m2fnuz": "e5m2fnuz"}
    if value not in table:
        raise ModelError(f"{where}: unknown fp8 format {text!r} (expected e4m3, e4m3fn, e4m3fnuz, e5m2)")
    return table[value]


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelError(f"{where} must be a list of strings")
    return tuple(value)


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ModelError(f"{where} must be an object, got {type(value).__name__}")
    return value


# -- fp8 (HF FineGrainedFP8 / DeepSeek / MiniMax-M2 / Qwen FP8 / grok-1 FP8-KV) ----------------------------------

def _parse_fp8(q: dict[str, Any], where: str) -> QuantScheme:
    fmt = _fp8_fmt(q.get("fmt"), where + ".fmt")
    scheme = str(q.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise ModelError(f"{where}.activation_scheme must be 'dynamic' or 'static', got {scheme!r}")
    block = q.get("weight_block_size")
    if block is not None:
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ModelError(f"{where}.weight_block_size must be two positive integers, got {block!r}")
        weight = QuantSpec("fp8", f"block{block[0]}x{block[1]}", scale_dtype="fp32", fmt=fmt)
        # Block-quantized checkpoints quantize activations per token per group of block[1] (DeepSeek "1x128").
        act = QuantSpec("fp8", f"group{block[1]}", scale_dtype="fp32", dynamic=True, fmt=fmt)
        desc = f"fp8 {fmt} block {block[0]}x{block[1]}, dynamic per-token-group activations"
    else:
        weight = QuantSpec("fp8", "tensor", scale_dtype="fp32", fmt=fmt)
        act = QuantSpec("fp8", "tensor", scale_dtype="fp32", dynamic=scheme == "dynamic", fmt=fmt)
        desc = f"fp8 {fmt} per-tensor, {scheme} activations"
    exclude = _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert") + \
        _str_list(q.get("ignored_layers"), where + ".ignored_layers")
    return QuantScheme("fp8", weight, act, exclude=exclude, description=desc)


# -- mxfp4 (gpt-oss: experts only, W4A16) ---------------------------------------------------------------------

def _parse_mxfp4(q: dict[str, Any], where: str) -> QuantScheme:
    weight = QuantSpec("mxfp4", "group32", scale_dtype="e8m0")
    exclude = _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert")
    # gpt-oss quantizes only the MoE experts (gate_up_proj_blocks / down_proj_blocks); activations stay bf16.
    return QuantScheme("mxfp4", weight, BF16, exclude=exclude,
                       description="MXFP4 weights (E2M1, group 32, E8M0 scales), bf16 activations")


# -- mxfp8 (MiniMax-M3-MXFP8) ----------------------------------------------------------------------------------

def _parse_mxfp8(q: dict[str, Any], where: str) -> QuantScheme:
    block = q.get("weight_block_size", [1, 32])
    if block not in ([1, 32], [32]):
        raise ModelError(f"{where}.weight_block_size must be [1, 32] for OCP MXFP8, got {block!r}")
    scheme = str(q.get("activation_scheme", "dynamic")).lower()
    weight = QuantSpec("mxfp8", "group32", scale_dtype="e8m0", fmt="e4m3")
    act = QuantSpec("mxfp8", "group32", scale_dtype="e8m0", dynamic=scheme == "dynamic", fmt="e4m3")
    exclude = _str_list(q.get("ignored_layers"), where + ".ignored_layers") + \
        _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert")
    return QuantScheme("mxfp8", weight, act, exclude=exclude,
                       description="MXFP8 E4M3 weights and dynamic activations, group 32, E8M0 scales")


# -- quark (AMD Quark: amd/*-MXFP4 and friends) ----------------------------------------------------------------

def _quark_tensor(spec: Any, where: str) -> QuantSpec:
    if spec is None:
        return BF16
    spec = _obj(spec, where)
    dtype = str(spec.get("dtype", "")).lower()
    qscheme = str(spec.get("qscheme", "per_tensor")).lower()
    group = spec.get("group_size")
    scale_format = str(spec.get("scale_format") or spec.get("scale_type") or "").lower()
    dynamic = bool(spec.get("is_dynamic", False))
    if dtype in ("fp4", "mxfp4", "fp4_e2m1"):
        if qscheme == "per_group" and group == 32 and scale_format in ("e8m0", ""):
            return QuantSpec("mxfp4", "group32", scale_dtype="e8m0", dynamic=dynamic)
        raise ModelError(f"{where}: fp4 with qscheme={qscheme} group_size={group} scale_format={scale_format or None}"
                         " is not OCP MXFP4 (group 32, E8M0); not supported")
    if dtype in ("fp6_e2m3", "fp6_e3m2", "mxfp6_e2m3", "mxfp6_e3m2"):
        return QuantSpec("mxfp6", "group32", scale_dtype="e8m0", dynamic=dynamic, fmt=dtype[-4:])
    if dtype in ("fp8_e4m3", "fp8_e5m2", "fp8"):
        fmt = "e5m2" if "e5m2" in dtype else "e4m3fn"
        if qscheme == "per_group" and group == 32 and scale_format == "e8m0":
            return QuantSpec("mxfp8", "group32", scale_dtype="e8m0", dynamic=dynamic, fmt=fmt.replace("fn", ""))
        gran = {"per_tensor": "tensor", "per_channel": "channel", "per_token": "token"}.get(qscheme)
        if qscheme == "per_group":
            if not isinstance(group, int) or group <= 0:
                raise ModelError(f"{where}: per_group needs a positive group_size")
            gran = f"group{group}"
        if gran is None:
            raise ModelError(f"{where}: unknown qscheme {qscheme!r}")
        return QuantSpec("fp8", gran, scale_dtype="fp32", dynamic=dynamic, fmt=fmt)
    if dtype in ("int8", "uint8", "int4", "uint4"):
        label = "int8" if "8" in dtype else "int4"
        gran = {"per_tensor": "tensor", "per_channel": "channel", "per_token": "token"}.get(qscheme)
        if qscheme == "per_group":
            if not isinstance(group, int) or group <= 0:
                raise ModelError(f"{where}: per_group needs a positive group_size")
            gran = f"group{group}"
        if gran is None:
            raise ModelError(f"{where}: unknown qscheme {qscheme!r}")
        return QuantSpec(label, gran, scale_dtype="fp32", dynamic=dynamic, symmetric=not dtype.startswith("u"))
    if dtype in ("bf16", "bfloat16", "fp16", "float16", ""):
        return BF16
    raise ModelError(f"{where}: unknown Quark dtype {dtype!r}")


def _quark_layer(cfg: Any, where: str) -> tuple[QuantSpec, QuantSpec]:
    cfg = _obj(cfg, where)
    return (_quark_tensor(cfg.get("weight"), where + ".weight"),
            _quark_tensor(cfg.get("input_tensors"), where + ".input_tensors"))


def _parse_quark(q: dict[str, Any], where: str) -> QuantScheme:
    weight, act = _quark_layer(q.get("global_quant_config", {}), where + ".global_quant_config")
    overrides = []
    for pattern, cfg in _obj(q.get("layer_quant_config") or {}, where + ".layer_quant_config").items():
        w, a = _quark_layer(cfg, f"{where}.layer_quant_config[{pattern!r}]")
        overrides.append(Rule((pattern,), w, a))
    exclude = _str_list(q.get("exclude"), where + ".exclude")
    desc = f"W {weight.describe()} / A {act.describe()}"
    return QuantScheme("quark", weight, act, tuple(overrides), exclude, desc)


# -- compressed-tensors ------------------------------------------------------------------------------------------

def _ct_args(spec: Any, where: str) -> QuantSpec:
    if spec is None:
        return BF16
    spec = _obj(spec, where)
    bits = spec.get("num_bits")
    kind = str(spec.get("type", "int")).lower()
    strategy = str(spec.get("strategy", "tensor")).lower()
    group = spec.get("group_size")
    dynamic = bool(spec.get("dynamic", False))
    if strategy == "group":
        if not isinstance(group, int) or group <= 0:
            raise ModelError(f"{where}: strategy group needs a positive group_size")
        gran = f"group{group}"
    elif strategy == "block":
        block = spec.get("block_structure")
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ModelError(f"{where}: strategy block needs block_structure [n, k]")
        gran = f"block{block[0]}x{block[1]}"
    elif strategy in ("tensor", "channel", "token"):
        gran = strategy
    else:
        raise ModelError(f"{where}: unknown strategy {strategy!r}")
    if kind == "float" and bits == 8:
        return QuantSpec("fp8", gran, scale_dtype="fp32", dynamic=dynamic, fmt="e4m3fn")
    if kind == "float" and bits == 4:
        if gran == "group32":
            return QuantSpec("mxfp4", "group32", scale_dtype="e8m0", dynamic=dynamic)
        raise ModelError(f"{where}: 4-bit float with {gran} (NVFP4) is not supported on ROCm MoE kernels")
    if kind == "int" and bits in (4, 8):
        return QuantSpec(f"int{bits}", gran, scale_dtype="fp32", dynamic=dynamic,
                         symmetric=bool(spec.get("symmetric", True)))
    raise ModelError(f"{where}: unsupported {kind} {bits}-bit quantization")


def _parse_compressed_tensors(q: dict[str, Any], where: str) -> QuantScheme:
    groups = _obj(q.get("config_groups"), where + ".config_groups")
    if not groups:
        raise ModelError(f"{where}.config_groups is empty")
    rules = []
    for gname, group in groups.items():
        group = _obj(group, f"{where}.config_groups.{gname}")
        targets = _str_list(group.get("targets", ["Linear"]), f"{where}.config_groups.{gname}.targets")
        w = _ct_args(group.get("weights"), f"{where}.config_groups.{gname}.weights")
        a = _ct_args(group.get("input_activations"), f"{where}.config_groups.{gname}.input_activations")
        rules.append(Rule(targets, w, a))
    # "Linear" targets every linear layer: it becomes the default; named targets are overrides.
    default = next((r for r in rules if "Linear" in r.patterns), rules[0])
    overrides = tuple(r for r in rules if r is not default)
    exclude = _str_list(q.get("ignore"), where + ".ignore")
    return QuantScheme("compressed-tensors", default.weight, default.act, overrides, exclude,
                       f"W {default.weight.describe()} / A {default.act.describe()}")


# -- fbgemm_fp8 (Llama-4 Maverick FP8) ---------------------------------------------------------------------------

def _parse_fbgemm_fp8(q: dict[str, Any], where: str) -> QuantScheme:
    weight = QuantSpec("fp8", "channel", scale_dtype="fp32", fmt="e4m3fn")
    act = QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True, fmt="e4m3fn")
    exclude = _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert")
    return QuantScheme("fbgemm_fp8", weight, act, exclude=exclude,
                       description="fp8 per-channel weights, dynamic per-token activations")


_PARSERS: Mapping[str, Callable[[dict[str, Any], str], QuantScheme]] = {
    "fp8": _parse_fp8,
    "mxfp4": _parse_mxfp4,
    "mxfp8": _parse_mxfp8,
    "quark": _parse_quark,
    "compressed-tensors": _parse_compressed_tensors,
    "fbgemm_fp8": _parse_fbgemm_fp8,
}
SUPPORTED_METHODS = tuple(sorted(_PARSERS))


def parse_quantization_config(q: Any, where: str = "quantization_config") -> QuantScheme | None:
    """Parse a checkpoint's quantization_config; ``None`` (absent) means an unquantized checkpoint."""
    if q is None:
        return None
    q = _obj(q, where)
    method = q.get("quant_method")
    if not isinstance(method, str):
        raise ModelError(f"{where}.quant_method is missing or not a string")
    method = method.strip().lower().replace("_", "-") if method.lower() == "compressed_tensors" else \
        method.strip().lower()
    parser = _PARSERS.get(method)
    if parser is None:
        raise ModelError(f"{where}: quant_method {method!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_METHODS)})")
    return parser(q, where)
