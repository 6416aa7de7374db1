"""quantization_config parsers: every dialect in use for MoE checkpoints, to (weight, activation) QuantSpecs.

Each parser turns the checkpoint's block into a :class:`QuantScheme` that answers, for one module name, how its
weights and the activations entering it are quantized (after the checkpoint's exclude/ignore lists). Sources of
each dialect's shape: the checkpoints' own config.json blocks (cited per model in capability_db/models/*.json), the
Quark OCP-MX wiring in vllm-project/vllm@017e9f4448:vllm/model_executor/layers/quantization/quark/quark_moe.py, and the
engines' own parsers (vLLM ``fp8.py`` / ``quark.py`` / ``compressed_tensors.py`` / ``modelopt.py``, HF ``Mxfp4Config``).

Dialects: ``fp8`` (per-tensor or ``weight_block_size`` blocks; ``fmt`` e4m3fn / e4m3fnuz), ``quark`` (global,
per-layer and per-layer-type configs, exclude lists, fp4/fp6/fp8/int, OCP MX with E8M0 scales), ``mxfp4``
(gpt-oss), ``mxfp8`` (MiniMax-M3-MXFP8), ``compressed-tensors`` (config_groups, ignore), ``fbgemm_fp8``
(Llama-4 Maverick FP8), ``modelopt`` (``hf_quant_config.json`` / ``quant_method: modelopt``). Grok-style INT4
weights with FP8 activations ship an ``fp8`` block and int32-packed expert weights; models.py recognises those from
the safetensors dtypes (SGLang turns them on with ``SGLANG_INT4_WEIGHT``).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from moedispatch._util.caches import memoize
from moedispatch.core.errors import ModelError, UsageError
from moedispatch.core.layers import QuantSpec

__all__ = ["QuantScheme", "Rule", "TypeRule", "parse_quantization_config", "SUPPORTED_METHODS"]

BF16 = QuantSpec("bf16")


@dataclass(frozen=True)
class Rule:
    """Modules matching ``patterns`` (globs, or ``re:`` regexes) get (weight, act); ``None`` means unquantized."""

    patterns: tuple[str, ...]
    weight: QuantSpec
    act: QuantSpec


@dataclass(frozen=True)
class TypeRule:
    """A per-module-type config (Quark ``layer_type_quant_config``): applies to layers of ``kinds``."""

    key: str
    kinds: tuple[str, ...]
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
    type_rules: tuple[TypeRule, ...] = ()

    def for_module(self, names: tuple[str, ...], kind: str = "moe") -> tuple[QuantSpec, QuantSpec, str]:
        """(weight, act, why) for a module known under any of ``names`` (engines differ in prefixes).

        Precedence follows the engines: exclude/ignore lists, then per-name configs, then per-type configs, then
        the global config (vLLM ``QuarkConfig._find_matched_config``).
        """
        # Dotted sub-names are only needed by plain (non-glob) patterns; most schemes have none.
        needs_subs = any(m[0] for m in self._matchers)
        subs = {name: _dotted_subs(name) for name in names} if needs_subs else {}
        hit = _first_match(self._matchers[0], names, subs)
        if hit is not None:
            return BF16, BF16, f"excluded by {self.method} pattern {hit!r}"
        for rule, matcher in zip(self.overrides, self._matchers[1:]):
            hit = _first_match(matcher, names, subs)
            if hit is not None:
                return rule.weight, rule.act, f"{self.method} per-layer config {hit!r}"
        for trule in self.type_rules:
            if kind in trule.kinds:
                return trule.weight, trule.act, f"{self.method} layer-type config {trule.key!r}"
        return self.weight, self.act, f"{self.method} {self.description}".strip()

    @functools.cached_property
    def _matchers(self) -> tuple[_Matcher, ...]:
        return (_compile(self.exclude), *(_compile(r.patterns) for r in self.overrides))


# A compiled pattern list: plain names (pattern -> list position) and regexes (position, pattern, compiled).
_Matcher = tuple[dict[str, int], tuple[tuple[int, str, "re.Pattern[str]"], ...]]


def _compile(patterns: tuple[str, ...]) -> _Matcher:
    plain: dict[str, int] = {}
    rx = []
    for pos, pattern in enumerate(patterns):
        if pattern.startswith("re:"):
            rx.append((pos, pattern, _regex(pattern[3:])))
        elif any(ch in pattern for ch in "*?["):
            rx.append((pos, pattern, _regex(fnmatch.translate(pattern))))
        else:
            plain.setdefault(pattern, pos)
    return plain, tuple(rx)


def _dotted_subs(name: str) -> set[str]:
    """Every run of whole dotted components of ``name`` (a plain pattern matches when it is one of them)."""
    parts = name.split(".")[:64]
    return {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}


def _first_match(matcher: _Matcher, names: tuple[str, ...], subs: dict[str, set[str]]) -> str | None:
    plain, rx = matcher
    best: tuple[int, str] | None = None
    if plain:
        for name in names:
            for sub in subs[name]:
                pos = plain.get(sub)
                if pos is not None and (best is None or pos < best[0]):
                    best = (pos, sub)
    for pos, pattern, compiled in rx:
        if best is not None and best[0] < pos:
            break
        if any(compiled.match(name) for name in names):
            return pattern
    return best[1] if best else None


@memoize(maxsize=4096)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        raise ModelError(f"bad regex {_short(pattern)}") from None


def _match(pattern: str, name: str) -> bool:
    """One pattern against one name: ``re:`` regex (matched from the start), glob, or a plain dotted name that
    matches whole components (HF / vLLM: exact names, dotted suffixes/prefixes such as "lm_head", "gate")."""
    if pattern.startswith("re:"):
        return _regex(pattern[3:]).match(name) is not None
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return ("." + pattern + ".") in ("." + name + ".")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(value: Any) -> int | None:
    """A positive int (bools refused), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value > 1 << 20:
        return None
    return value


_FP8_FMT = {"e4m3": "e4m3fn", "e4m3fn": "e4m3fn", "e4m3fnuz": "e4m3fnuz", "e5m2": "e5m2", "e5m2fnuz": "e5m2fnuz"}


def _fp8_fmt(text: Any, where: str) -> str:
    if text is not None and not isinstance(text, str):
        raise ModelError(f"{where}: fp8 format must be a string, got {_short(text)}")
    value = (text or "e4m3").strip().lower()
    for prefix in ("torch.", "float8_", "fp8_", "f8_"):
        value = value.removeprefix(prefix)
    if value not in _FP8_FMT:
        raise ModelError(f"{where}: unknown fp8 format {text!r} (expected e4m3, e4m3fn, e4m3fnuz, e5m2)")
    return _FP8_FMT[value]


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


def _scheme_word(value: Any, where: str, default: str = "dynamic") -> str:
    scheme = default if value is None else value
    if not isinstance(scheme, str) or scheme.strip().lower() not in ("dynamic", "static"):
        raise ModelError(f"{where} must be 'dynamic' or 'static', got {_short(scheme)}")
    return scheme.strip().lower()


# -- fp8 (HF FineGrainedFP8 / DeepSeek / MiniMax-M2 / Qwen FP8 / grok-1 FP8-KV) ----------------------------------

def _parse_fp8(q: dict[str, Any], where: str) -> QuantScheme:
    fmt = _fp8_fmt(q.get("fmt"), where + ".fmt")
    scheme = _scheme_word(q.get("activation_scheme"), where + ".activation_scheme")
    block = q.get("weight_block_size")
    if block is not None:
        if not isinstance(block, list) or len(block) != 2 or not all(_int(b) for b in block):
            raise ModelError(f"{where}.weight_block_size must be two positive integers, got {_short(block)}")
        if scheme != "dynamic":
            # vLLM Fp8Config: "The block-wise quantization only supports dynamic activation scheme for now".
            raise ModelError(f"{where}: weight_block_size {block} needs activation_scheme 'dynamic', got {scheme!r}")
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
    if block not in ([1, 32], [32]) or any(isinstance(b, bool) for b in block):
        raise ModelError(f"{where}.weight_block_size must be [1, 32] for OCP MXFP8, got {_short(block)}")
    scheme = _scheme_word(q.get("activation_scheme"), where + ".activation_scheme")
    weight = QuantSpec("mxfp8", "group32", scale_dtype="e8m0", fmt="e4m3")
    act = QuantSpec("mxfp8", "group32", scale_dtype="e8m0", dynamic=scheme == "dynamic", fmt="e4m3")
    exclude = _str_list(q.get("ignored_layers"), where + ".ignored_layers") + \
        _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert")
    return QuantScheme("mxfp8", weight, act, exclude=exclude,
                       description=f"MXFP8 E4M3 weights and {scheme} activations, group 32, E8M0 scales")


# -- quark (AMD Quark: amd/*-MXFP4 and friends) ----------------------------------------------------------------

_QSCHEME = {"per_tensor": "tensor", "per_channel": "channel", "per_token": "token"}
# Quark dtype spellings (quark.torch.quantization.config.type.Dtype values and the aliases seen in exports).
_Q_FP4 = ("fp4", "fp4_e2m1", "mxfp4", "float4_e2m1fn", "float4_e2m1fn_x2", "e2m1")
_Q_FP6 = {"fp6_e2m3": "e2m3", "fp6_e3m2": "e3m2", "mxfp6_e2m3": "e2m3", "mxfp6_e3m2": "e3m2", "mxfp6": "e2m3"}
_Q_FP8 = {"fp8_e4m3": "e4m3fn", "fp8_e4m3fn": "e4m3fn", "fp8_e4m3fnuz": "e4m3fnuz", "fp8": "e4m3fn",
          "float8_e4m3fn": "e4m3fn", "float8_e4m3fnuz": "e4m3fnuz", "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2",
          "mxfp8": "e4m3fn", "mxfp8_e4m3": "e4m3fn", "mxfp8_e5m2": "e5m2"}
_Q_INT = ("int8", "uint8", "int4", "uint4")
_Q_NONE = ("bf16", "bfloat16", "fp16", "float16", "float32", "fp32", "")
_Q_E8M0 = ("e8m0", "float8_e8m0fnu", "fp8_e8m0", "")


def _quark_gran(qscheme: str, group: Any, where: str) -> str:
    if qscheme == "per_group":
        if _int(group) is None:
            raise ModelError(f"{where}: per_group needs a positive integer group_size, got {_short(group)}")
        return f"group{group}"
    gran = _QSCHEME.get(qscheme)
    if gran is None:
        raise ModelError(f"{where}: unknown qscheme {qscheme!r} (per_tensor, per_channel, per_token, per_group)")
    return gran


def _quark_tensor(spec: Any, where: str) -> QuantSpec:
    if spec is None:
        return BF16
    spec = _obj(spec, where)
    for key in ("dtype", "qscheme", "scale_format", "mx_element_dtype"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise ModelError(f"{where}.{key} must be a string, got {_short(spec[key])}")
    dtype = (spec.get("dtype") or "").strip().lower()
    if dtype == "mx":  # older Quark exports: dtype "mx" + mx_element_dtype
        elem = (spec.get("mx_element_dtype") or "").strip().lower()
        dtype = {"fp4": "fp4", "fp4_e2m1": "fp4", "fp6_e2m3": "fp6_e2m3", "fp6_e3m2": "fp6_e3m2",
                 "fp8_e4m3": "mxfp8_e4m3", "fp8_e5m2": "mxfp8_e5m2"}.get(elem, f"mx({elem or None})")
    qscheme = (spec.get("qscheme") or "per_tensor").strip().lower()
    group = spec.get("group_size")
    scale_format = (spec.get("scale_format") or "").strip().lower()
    dynamic = spec.get("is_dynamic", False)
    if not isinstance(dynamic, bool) and dynamic is not None:
        raise ModelError(f"{where}.is_dynamic must be true or false, got {_short(dynamic)}")
    dynamic = bool(dynamic)
    symmetric = spec.get("symmetric")
    if dtype in _Q_FP4 or dtype in _Q_FP6:
        label = "mxfp4" if dtype in _Q_FP4 else "mxfp6"
        if qscheme == "per_group" and group == 32 and not isinstance(group, bool) and scale_format in _Q_E8M0:
            return QuantSpec(label, "group32", scale_dtype="e8m0", dynamic=dynamic,
                             fmt=_Q_FP6.get(dtype) if label == "mxfp6" else None)
        raise ModelError(f"{where}: {dtype} with qscheme={qscheme} group_size={_short(group)} "
                         f"scale_format={scale_format or None} is not OCP {label.upper()} (per_group, group 32, "
                         "E8M0 scales); not supported")
    if dtype in _Q_FP8:
        fmt = _Q_FP8[dtype]
        if dtype.startswith("mx") or (qscheme == "per_group" and group == 32 and scale_format == "e8m0"):
            if not (qscheme == "per_group" and group == 32 and scale_format in _Q_E8M0):
                raise ModelError(f"{where}: {dtype} needs per_group group_size 32 with E8M0 scales")
            return QuantSpec("mxfp8", "group32", scale_dtype="e8m0", dynamic=dynamic, fmt=fmt.replace("fn", ""))
        return QuantSpec("fp8", _quark_gran(qscheme, group, where), scale_dtype="fp32", dynamic=dynamic, fmt=fmt)
    if dtype in _Q_INT:
        label = "int8" if "8" in dtype else "int4"
        sym = symmetric if isinstance(symmetric, bool) else not dtype.startswith("u")
        return QuantSpec(label, _quark_gran(qscheme, group, where), scale_dtype="fp32", dynamic=dynamic,
                         symmetric=sym)
    if dtype in _Q_NONE:
        return BF16
    raise ModelError(f"{where}: unknown Quark dtype {dtype!r} (supported: fp4, fp6_e2m3, fp6_e3m2, fp8_e4m3, "
                     "fp8_e5m2, int4, uint4, int8, uint8, bfloat16)")


def _quark_layer(cfg: Any, where: str) -> tuple[QuantSpec, QuantSpec]:
    cfg = _obj(cfg, where)
    return (_quark_tensor(cfg.get("weight"), where + ".weight"),
            _quark_tensor(cfg.get("input_tensors"), where + ".input_tensors"))


def _type_kinds(key: str) -> tuple[str, ...]:
    """Which layer kinds a Quark layer-type key covers (keys are module class names, e.g. ``nn.Linear`` or
    ``<class 'torch.nn.modules.linear.Linear'>``; expert GEMMs are Linear modules in Quark's export)."""
    low = key.lower()
    if "moe" in low or "expert" in low:
        return ("moe",)
    if "linear" in low:
        return ("moe", "dense")
    return ()


def _parse_quark(q: dict[str, Any], where: str) -> QuantScheme:
    gq = q.get("global_quant_config")
    weight, act = _quark_layer(gq if gq is not None else {}, where + ".global_quant_config")
    overrides = []
    for pattern, cfg in _obj(q.get("layer_quant_config") or {}, where + ".layer_quant_config").items():
        w, a = _quark_layer(cfg, f"{where}.layer_quant_config[{_short(pattern)}]")
        overrides.append(Rule((pattern,), w, a))
    type_rules = []
    for key, cfg in _obj(q.get("layer_type_quant_config") or {}, where + ".layer_type_quant_config").items():
        w, a = _quark_layer(cfg, f"{where}.layer_type_quant_config[{_short(key)}]")
        kinds = _type_kinds(key)
        if kinds:
            type_rules.append(TypeRule(key, kinds, w, a))
    exclude = _str_list(q.get("exclude"), where + ".exclude")
    desc = f"W {weight.describe()} / A {act.describe()}"
    return QuantScheme("quark", weight, act, tuple(overrides), exclude, desc, tuple(type_rules))


# -- compressed-tensors ------------------------------------------------------------------------------------------

def _ct_args(spec: Any, where: str) -> QuantSpec:
    if spec is None:
        return BF16
    spec = _obj(spec, where)
    bits = spec.get("num_bits")
    kind = spec.get("type", "int")
    strategy = spec.get("strategy", "tensor")
    if not isinstance(kind, str) or not isinstance(strategy, str):
        raise ModelError(f"{where}: type and strategy must be strings")
    kind, strategy = kind.lower(), strategy.lower()
    group = spec.get("group_size")
    dyn = spec.get("dynamic", False)
    if not isinstance(dyn, (bool, str)) and dyn is not None:
        raise ModelError(f"{where}.dynamic must be true, false or 'local', got {_short(dyn)}")
    dynamic = bool(dyn)
    if strategy == "group":
        if _int(group) is None:
            raise ModelError(f"{where}: strategy group needs a positive integer group_size, got {_short(group)}")
        gran = f"group{group}"
    elif strategy == "block":
        block = spec.get("block_structure")
        if isinstance(block, str) and re.fullmatch(r"\d+x\d+", block):
            block = [int(v) for v in block.split("x")]
        if not (isinstance(block, list) and len(block) == 2 and all(_int(b) for b in block)):
            raise ModelError(f"{where}: strategy block needs block_structure [n, k], got {_short(block)}")
        gran = f"block{block[0]}x{block[1]}"
    elif strategy in ("tensor", "channel", "token"):
        gran = strategy
    elif strategy == "tensor_group":
        raise ModelError(f"{where}: strategy tensor_group (NVFP4, FP8-scaled groups of 16) is not supported on ROCm "
                         "MoE kernels")
    else:
        raise ModelError(f"{where}: unknown strategy {strategy!r} (tensor, channel, token, group, block)")
    if kind == "float" and bits == 8 and not isinstance(bits, bool):
        return QuantSpec("fp8", gran, scale_dtype="fp32", dynamic=dynamic, fmt="e4m3fn")
    if kind == "float" and bits == 4 and not isinstance(bits, bool):
        if gran == "group32":
            return QuantSpec("mxfp4", "group32", scale_dtype="e8m0", dynamic=dynamic)
        raise ModelError(f"{where}: 4-bit float with {gran} (NVFP4) is not supported on ROCm MoE kernels")
    if kind == "int" and bits in (4, 8) and not isinstance(bits, bool):
        sym = spec.get("symmetric", True)
        return QuantSpec(f"int{bits}", gran, scale_dtype="fp32", dynamic=dynamic,
                         symmetric=sym if isinstance(sym, bool) else True)
    raise ModelError(f"{where}: unsupported {kind} {_short(bits)}-bit quantization (float 8, float 4 group 32, "
                     "int 4, int 8)")


def _parse_compressed_tensors(q: dict[str, Any], where: str) -> QuantScheme:
    groups = _obj(q.get("config_groups"), where + ".config_groups")
    if not groups:
        raise ModelError(f"{where}.config_groups is empty")
    fmt = q.get("format")
    if isinstance(fmt, str) and fmt.lower().startswith("nvfp4"):
        raise ModelError(f"{where}: format {fmt!r} (NVFP4) is not supported on ROCm MoE kernels")
    rules = []
    for gname, group in groups.items():
        gw = f"{where}.config_groups.{_short(gname)}"
        group = _obj(group, gw)
        targets = _str_list(group.get("targets", ["Linear"]), gw + ".targets")
        if not targets:
            raise ModelError(f"{gw}.targets is empty")
        w = _ct_args(group.get("weights"), gw + ".weights")
        a = _ct_args(group.get("input_activations"), gw + ".input_activations")
        rules.append(Rule(targets, w, a))
    # "Linear" targets every linear layer: it becomes the default; named targets are overrides.
    default = next((r for r in rules if "Linear" in r.patterns), None)
    overrides = tuple(r for r in rules if r is not default)
    exclude = _str_list(q.get("ignore"), where + ".ignore")
    if default is None:
        # Only named targets: modules matching none of them stay unquantized.
        return QuantScheme("compressed-tensors", BF16, BF16, overrides, exclude, "named targets only")
    return QuantScheme("compressed-tensors", default.weight, default.act, overrides, exclude,
                       f"W {default.weight.describe()} / A {default.act.describe()}")


# -- fbgemm_fp8 (Llama-4 Maverick FP8) ---------------------------------------------------------------------------

def _parse_fbgemm_fp8(q: dict[str, Any], where: str) -> QuantScheme:
    weight = QuantSpec("fp8", "channel", scale_dtype="fp32", fmt="e4m3fn")
    act = QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True, fmt="e4m3fn")
    exclude = _str_list(q.get("modules_to_not_convert"), where + ".modules_to_not_convert")
    return QuantScheme("fbgemm_fp8", weight, act, exclude=exclude,
                       description="fp8 per-channel weights, dynamic per-token activations")


# -- modelopt (NVIDIA ModelOpt: hf_quant_config.json or quant_method "modelopt") ----------------------------------

# quant_algo values vLLM accepts (vLLM docs features/quantization/modelopt.md); NVFP4 / AWQ variants need NVIDIA
# FP4 or int4-AWQ kernels that ROCm MoE backends do not have.
def _modelopt_algo(algo: str, where: str) -> tuple[QuantSpec, QuantSpec, str]:
    a = algo.strip().upper()
    if a == "FP8":
        return (QuantSpec("fp8", "tensor", scale_dtype="fp32", fmt="e4m3fn"),
                QuantSpec("fp8", "tensor", scale_dtype="fp32", fmt="e4m3fn"), "fp8 per-tensor, static activations")
    if a == "FP8_PER_CHANNEL_PER_TOKEN":
        return (QuantSpec("fp8", "channel", scale_dtype="fp32", fmt="e4m3fn"),
                QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True, fmt="e4m3fn"),
                "fp8 per-channel weights, dynamic per-token activations")
    if a in ("FP8_PB_WO", "FP8_BLOCK_WO"):
        return (QuantSpec("fp8", "block128x128", scale_dtype="fp32", fmt="e4m3fn"), BF16,
                "fp8 128x128 block weights, bf16 activations")
    if a == "MXFP8":
        return (QuantSpec("mxfp8", "group32", scale_dtype="e8m0", fmt="e4m3"),
                QuantSpec("mxfp8", "group32", scale_dtype="e8m0", dynamic=True, fmt="e4m3"), "MXFP8 W8A8")
    raise ModelError(f"{where}: ModelOpt quant_algo {algo!r} is not supported on ROCm MoE kernels (supported: FP8, "
                     "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8, MIXED_PRECISION of those)")


def _parse_modelopt(q: dict[str, Any], where: str) -> QuantScheme:
    if isinstance(q.get("quantization"), dict):  # hf_quant_config.json shape, or nested in config.json
        q = {**q["quantization"], "quant_method": "modelopt"}
        where = where + ".quantization"
    algo = q.get("quant_algo")
    if not isinstance(algo, str):
        raise ModelError(f"{where}.quant_algo is missing or not a string")
    exclude = _str_list(q.get("exclude_modules"), where + ".exclude_modules") + \
        _str_list(q.get("ignore"), where + ".ignore")
    if algo.strip().upper() == "MIXED_PRECISION":
        layers = _obj(q.get("quantized_layers"), where + ".quantized_layers")
        rules = []
        for name, cfg in layers.items():
            cfg = _obj(cfg, f"{where}.quantized_layers[{_short(name)}]")
            sub = cfg.get("quant_algo")
            if not isinstance(sub, str):
                raise ModelError(f"{where}.quantized_layers[{_short(name)}].quant_algo must be a string")
            w, a, _ = _modelopt_algo(sub, f"{where}.quantized_layers[{_short(name)}]")
            rules.append(Rule((name,), w, a))
        return QuantScheme("modelopt", BF16, BF16, tuple(rules), exclude, "mixed precision, per-layer algos")
    w, a, desc = _modelopt_algo(algo, where + ".quant_algo")
    return QuantScheme("modelopt", w, a, exclude=exclude, description=desc)


_PARSERS: Mapping[str, Callable[[dict[str, Any], str], QuantScheme]] = {
    "fp8": _parse_fp8,
    "mxfp4": _parse_mxfp4,
    "mxfp8": _parse_mxfp8,
    "quark": _parse_quark,
    "compressed-tensors": _parse_compressed_tensors,
    "fbgemm_fp8": _parse_fbgemm_fp8,
    "modelopt": _parse_modelopt,
}
_ALIASES = {"compressed_tensors": "compressed-tensors", "modelopt_fp8": "modelopt", "modelopt_mxfp8": "modelopt",
            "gpt_oss_mxfp4": "mxfp4"}
SUPPORTED_METHODS = tuple(sorted(_PARSERS))


def parse_quantization_config(q: Any, where: str = "quantization_config") -> QuantScheme | None:
    """Parse a checkpoint's quantization_config; ``None`` (absent) means an unquantized checkpoint."""
    if q is None:
        return None
    q = _obj(q, where)
    method = q.get("quant_method")
    if method is None and isinstance(q.get("quantization"), dict) and "producer" in q:
        method = "modelopt"  # a bare hf_quant_config.json
    if not isinstance(method, str):
        raise ModelError(f"{where}.quant_method is missing or not a string (supported: "
                         f"{', '.join(SUPPORTED_METHODS)})")
    method = method.strip().lower()
    method = _ALIASES.get(method, method)
    parser = _PARSERS.get(method)
    if parser is None:
        raise ModelError(f"{where}: quant_method {method!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_METHODS)})")
    try:
        scheme = parser(q, where)
    except ModelError:
        raise
    except UsageError as exc:  # a QuantSpec the dialect allowed but the contract does not
        raise ModelError(f"{where}: {exc}") from None
    try:
        scheme._matchers  # compile every pattern now: a bad regex is the config's error, reported here
    except ModelError as exc:
        raise ModelError(f"{where}: {exc}") from None
    return scheme
