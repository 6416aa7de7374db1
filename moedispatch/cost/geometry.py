"""What one fused-MoE call reads and computes on one rank (:class:`Geometry`), its datasheet roofline, and the
feature vectors the fitted priors are linear in (``bucket``, ``bucket_large``, ``arch_cu``, ``arch``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from moedispatch.core.errors import UsageError


_ACT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "mxfp8": 1.0, "mxfp6": 0.75, "mxfp4": 0.5,
              "int4": 0.5}
_COMPUTE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "fp8", "mxfp8": "fp8", "mxfp6": "fp4",
            "mxfp4": "fp4", "int4": "fp4"}
# AITER CSV spellings (aiter/utility/base_tuner.py dtype2bpe_dict counts fp4x2 as 1 byte per *logical* element,
# which overstates bytes; real storage is half a byte).
_CSV_BYTES = {"torch.bfloat16": 2.0, "torch.float16": 2.0, "torch.float8_e4m3fn": 1.0, "torch.float8_e4m3fnuz": 1.0,
              "torch.int8": 1.0, "torch.float4_e2m1fn_x2": 0.5, "torch.int4": 0.5,
              "torch.uint32": 0.5}  # uint32: eight packed int4 values
_CSV_SCALE = {"QuantType.per_1x32": 1 / 32, "QuantType.per_1x128": 4 / (128 * 128)}


@dataclass(frozen=True)
class Geometry:
    """What the roofline needs of one fused-MoE call on one rank (padded sizes where a padding applies).

    ``w_bytes``: bytes per weight element including its scales; ``a_bytes``: bytes per activation element entering
    the expert GEMMs; ``compute``: which peak applies (``bf16``, ``fp8``, ``fp4``).
    """

    hidden: int
    inter: int
    experts: int          # on this rank
    experts_total: int    # routed over (EP: experts on this rank are a share of these)
    top_k: int
    w_bytes: float
    a_bytes: float
    compute: str
    gated: bool = True
    shared: int = 0       # always-active (fused shared) experts among ``experts`` and ``top_k``
    block_scale: bool = False   # weights scaled per 128x128 block (AITER per_1x128: CK/ASM fp8 blockscale kernels)

    @classmethod
    def of_layer(cls, layer: Any, padding: Any = None) -> "Geometry":
        """From a :class:`~moedispatch.core.layers.MoELayer` and, optionally, its :class:`~moedispatch.core.backend.Padding`."""
        w = layer.weight
        scale = 0.0   # scale bytes per weight element: E8M0 per 32 (MX), bf16 per group, fp32 per block
        block = False
        if w.quantized:
            if w.is_mx:
                scale = 1 / 32
            elif w.group_size:
                scale = (1 if w.scale_dtype == "e8m0" else 2) / w.group_size
            elif w.block:
                scale = 4 / (w.block[0] * w.block[1])
                block = True
        return cls(
            hidden=padding.hidden if padding is not None else layer.hidden,
            inter=padding.intermediate_per_rank if padding is not None else layer.intermediate_per_rank,
            experts=layer.experts_per_rank, experts_total=layer.experts, top_k=layer.top_k,
            w_bytes=w.bits / 8 + scale, a_bytes=_ACT_BYTES[layer.act.dtype], compute=_COMPUTE[layer.act.dtype],
            block_scale=block,
        )

    @classmethod
    def of_row(cls, row: Any) -> "Geometry":
        """From an AITER tuned-CSV row (:class:`moedispatch.data.aiter_configs.TunedRow` or a mapping with its columns)."""
        get = (lambda k: row[k]) if isinstance(row, Mapping) else (lambda k: getattr(row, k))
        qa, qw = str(get("q_dtype_a")), str(get("q_dtype_w"))
        if qa not in _CSV_BYTES or qw not in _CSV_BYTES:
            raise UsageError(f"unknown AITER dtype {qa if qa not in _CSV_BYTES else qw!r} in a tuned row")
        a = _CSV_BYTES[qa]
        return cls(
            hidden=int(get("model_dim")), inter=int(get("inter_dim")), experts=int(get("expert")),
            experts_total=int(get("expert")), top_k=int(get("topk")),
            w_bytes=_CSV_BYTES[qw] + _CSV_SCALE.get(str(get("q_type")), 0.0), a_bytes=a,
            compute={2.0: "bf16", 1.0: "fp8", 0.5: "fp4"}[a], gated=int(get("use_g1u1")) == 1,
            shared=_fused_shared(int(get("expert")), int(get("topk"))),
            block_scale=str(get("q_type")) == "QuantType.per_1x128",
        )

    @property
    def pair(self) -> str:
        """The (activation, weight) storage widths as AITER names its kernels and tuned files (``a16w4``,
        ``a8w4``, ``a4w4``, ``a8w8``…): bits per activation and per weight element, scales not counted (int4 and
        MXFP4 weights are both ``w4``). Keys the per-pair decode fixed term (``[[decode]] pair``)."""
        return f"a{int(self.a_bytes * 8 + 1e-9)}w{int(self.w_bytes * 8 + 1e-9)}"

    def active_experts(self, tokens: int) -> float:
        """Expected distinct experts of this rank touched by ``tokens`` tokens under uniform top-k routing (fused
        shared experts are always touched)."""
        s = self.shared
        routed = self.experts - s
        return s + routed * (1 - (1 - (self.top_k - s) / (self.experts_total - s)) ** tokens)

    def bytes_moved(self, tokens: int) -> float:
        n1 = 2 * self.inter if self.gated else self.inter
        weights = self.active_experts(tokens) * self.hidden * (n1 + self.inter) * self.w_bytes
        share = self.experts / self.experts_total
        acts = (tokens * self.hidden * self.a_bytes + 2 * tokens * self.top_k * share * self.inter * self.a_bytes
                + 2 * tokens * self.hidden)
        return weights + acts

    def flops(self, tokens: int) -> float:
        n1 = 2 * self.inter if self.gated else self.inter
        return 2 * tokens * self.top_k * (self.experts / self.experts_total) * self.hidden * (n1 + self.inter)


def _fused_shared(experts: int, top_k: int) -> int:
    """1 when a tuned row's expert count is odd (DeepSeek-V3 257/top-9, Kimi-K2 385/top-9, MiniMax-M3 129/top-5):
    the shared expert fused into the routed set, selected by every token (derived: routed counts are even)."""
    return 1 if experts > 8 and top_k > 1 and experts % 2 == 1 else 0


def _peak_tflops(peaks: Mapping[str, Any], compute: str) -> float:
    if compute == "fp4" and "fp4_tflops" in peaks:
        return float(peaks["fp4_tflops"])
    if compute in ("fp4", "fp8") and "fp8_tflops" in peaks:
        return float(peaks["fp8_tflops"])
    return float(peaks["bf16_tflops"])


def roofline_us(geo: Geometry, tokens: int, peaks: Mapping[str, Any]) -> tuple[float, float]:
    """``(t_mem, t_cmp)`` in µs against datasheet ``peaks`` (gpus.toml ``[peak.*]``: hbm_tbps, *_tflops)."""
    t_mem = geo.bytes_moved(tokens) / (float(peaks["hbm_tbps"]) * 1e6)
    t_cmp = geo.flops(tokens) / (_peak_tflops(peaks, geo.compute) * 1e6)
    return t_mem, t_cmp


def bucket_of(tokens: int) -> int:
    """The token bucket a count falls in: the next power of two (AITER ``get_padded_M`` below 32768)."""
    b = 1
    while b < tokens:
        b *= 2
    return b


#: Feature sets of the efficiency priors: log(us) = coef · features. ``rl`` = max(t_mem, t_cmp).
_FEATURES: dict[str, Callable[[float, float, float, Geometry, int, int], list[float]]] = {}


def _feature(name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        _FEATURES[name] = fn
        return fn
    return deco


@_feature("bucket")
def _f_bucket(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    return [1.0, math.log(rl), math.log(m * geo.top_k / geo.experts_total), math.log(geo.a_bytes)]


#: From this token bucket on, bucket priors also see the weight bytes, the intermediate size and whether the weights
#: are block-scaled (``bucket_large``), and their bars are their own (band level ``bucket_large``): at 2048+ tokens
#: the kernel family — FlyDSL MXFP4 against CK fp8 blockscale — sets the efficiency, which the roofline, the token
#: count and the activation dtype alone cannot tell apart (leave-one-file-out p90 at gfx950 16k-32k tokens: 42-46%
#: without these terms, measured by benchmarks/bench_cost_model.py).
LARGE_M = 2048


@_feature("bucket_large")
def _f_bucket_large(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    return _f_bucket(tm, tc, rl, geo, m, cu) + [math.log(geo.w_bytes), math.log(geo.inter),
                                                 1.0 if geo.block_scale else 0.0]


@_feature("arch_cu")
def _f_arch_cu(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    lb = math.log(bucket_of(m))
    return [1.0, math.log(tm), math.log(tc), lb, lb * lb, lb * math.log(rl), math.log(geo.a_bytes),
            math.log(geo.w_bytes)]


@_feature("arch")
def _f_arch(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    lb = math.log(bucket_of(m))
    return [1.0, math.log(rl), lb, lb * lb, math.log(cu)]


def model_features(name: str, geo: Geometry, tokens: int, cu: int, peaks: Mapping[str, Any]) -> list[float]:
    """The feature vector of prior family ``name`` (``bucket``, ``bucket_large``, ``arch_cu``, ``arch``)."""
    tm, tc = roofline_us(geo, tokens, peaks)
    return _FEATURES[name](tm, tc, max(tm, tc), geo, tokens, cu)


#: Coefficients per feature set (checked when the priors load).
FEATURE_SIZES = {"bucket": 4, "bucket_large": 7, "arch_cu": 8, "arch": 5}
