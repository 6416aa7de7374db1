"""Scaled fp8 / int8 / int4 quantize-dequantize (per-tensor, per-token, per-channel, per-group, N×M block).

Element formats (``fmt``):

==========  ====================  =======  ==================================================================
fmt         torch dtype           max      notes
==========  ====================  =======  ==================================================================
e4m3fn      float8_e4m3fn         448      OCP E4M3 (gfx950, gfx12, NVIDIA): bias 7, no Inf, NaN 0x7F/0xFF
e4m3fnuz    float8_e4m3fnuz       240      gfx942 FNUZ: bias 8, no Inf, no -0, single NaN 0x80
e5m2        float8_e5m2           57344    OCP E5M2: IEEE-like, Inf and NaN
e5m2fnuz    float8_e5m2fnuz       57344    gfx942 FNUZ E5M2: bias 16, no Inf, no -0, NaN 0x80
int8        int8                  127      symmetric, round half to even, clamp [-128, 127]
int4        int8 storage          7        symmetric, round half to even, clamp [-8, 7] (values stored unpacked)
==========  ====================  =======  ==================================================================

Quantization of one group ``G`` (the whole matrix, a row, a run of N elements along the last axis, or an N×M tile
of the last two axes): ``scale = amax(|G|) / max``; an all-zero group gets ``scale = 1``; ``q = cast(clamp(x /
scale, -max, max))`` with round-to-nearest-even (the torch float8 casts, or ``torch.round``). Dequantization is
``q * scale`` in float32. A group holding a NaN gets a NaN scale and dequantizes to NaN throughout (as the MX
NaN-scale block does, and as the kernels' amax reductions do); e4m3fnuz/e5m2fnuz encode NaN as 0x80.
The float8 casts are torch's; the tests compare every bit pattern against ml_dtypes.

Granularity spelling follows :class:`moedispatch.core.layers.QuantSpec`: ``tensor`` (one scale per matrix, i.e. per
expert for ``[E, N, K]`` weights), ``channel`` / ``token`` (one scale per row of the last axis), ``group<N>``
(per row, per run of N elements along the last axis), ``block<N>x<M>`` (N rows × M columns tiles of the last two
axes; DeepSeek/Qwen "block128x128" weights).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

__all__ = [
    "FP8_FORMATS", "INT_FORMATS", "ScaledTensor", "fp8_dtype", "format_max", "cast_fp8", "quantize_scaled",
    "dequantize_scaled", "qdq_scaled", "qdq_fp8", "qdq_int", "qdq_float", "parse_granularity",
]

FP8_FORMATS: dict[str, tuple[str, float]] = {
    "e4m3fn": ("float8_e4m3fn", 448.0),
    "e4m3fnuz": ("float8_e4m3fnuz", 240.0),
    "e5m2": ("float8_e5m2", 57344.0),
    "e5m2fnuz": ("float8_e5m2fnuz", 57344.0),
}
INT_FORMATS: dict[str, tuple[float, float]] = {"int8": (-128.0, 127.0), "int4": (-8.0, 7.0)}
_INT_QMAX = {"int8": 127.0, "int4": 7.0}
_GRAN = re.compile(r"^(tensor|channel|token|group(\d+)|block(\d+)x(\d+))$")


def _norm_fmt(fmt: str) -> str:
    key = str(fmt).strip().lower().replace("float8_", "").replace("fp8_", "")
    if key in ("fp8", "e4m3"):
        key = "e4m3fn"
    if key not in FP8_FORMATS and key not in INT_FORMATS:
        raise ValueError(f"unknown scaled format {fmt!r}; expected one of "
                         f"{', '.join([*FP8_FORMATS, *INT_FORMATS])}")
    return key


def fp8_dtype(fmt: str) -> torch.dtype:
    """The torch float8 dtype of an fp8 format name."""
    key = _norm_fmt(fmt)
    if key not in FP8_FORMATS:
        raise ValueError(f"{fmt!r} is not an fp8 format")
    return getattr(torch, FP8_FORMATS[key][0])


def format_max(fmt: str) -> float:
    """Largest finite magnitude the quantizer maps ``amax`` to (448, 240, 57344, 127, 7)."""
    key = _norm_fmt(fmt)
    return FP8_FORMATS[key][1] if key in FP8_FORMATS else _INT_QMAX[key]


def cast_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 → float8 with saturation to ±max (round to nearest even; NaN stays NaN)."""
    m = format_max(fmt)
    return x.to(torch.float32).clamp(-m, m).to(fp8_dtype(fmt))


def parse_granularity(granularity: str) -> tuple[str, int | None, tuple[int, int] | None]:
    """``("tensor"|"row"|"group"|"block", group_size, (block_n, block_k))``; channel and token are both ``row``."""
    m = _GRAN.match(granularity or "")
    if not m:
        raise ValueError(f"bad granularity {granularity!r}; expected tensor, channel, token, group<N> or block<N>x<M>")
    if m.group(1) == "tensor":
        return "tensor", None, None
    if m.group(1) in ("channel", "token"):
        return "row", None, None
    if m.group(2):
        return "group", int(m.group(2)), None
    return "block", None, (int(m.group(3)), int(m.group(4)))


@dataclass(frozen=True)
class ScaledTensor:
    """A tensor quantized with float32 scales: ``data`` (float8, or int8 holding int8/int4 values) and ``scale``.

    ``scale`` has the compact per-group shape: ``[..., 1, 1]`` (tensor), ``[..., R, 1]`` (row),
    ``[..., R, ceil(K/N)]`` (group N), ``[..., ceil(R/N), ceil(K/M)]`` (block N×M).
    """

    data: torch.Tensor
    scale: torch.Tensor
    fmt: str
    granularity: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def dequantize(self) -> torch.Tensor:
        return dequantize_scaled(self)

    def __getitem__(self, index: int) -> "ScaledTensor":
        """Select along the leading dimension (experts of ``[E, N, K]`` weights)."""
        if self.data.ndim < 3:
            raise IndexError("ScaledTensor indexing selects an expert of a 3-D [E, N, K] tensor")
        return replace(self, data=self.data[index], scale=self.scale[index])

    def __len__(self) -> int:
        return self.data.shape[0]

    @property
    def dequantized_nbytes(self) -> int:
        return 4 * self.data.numel()


def _expand(scale: torch.Tensor, shape: tuple[int, ...], granularity: str) -> torch.Tensor:
    """Broadcastable float32 scale for a tensor of ``shape``."""
    kind, group, block = parse_granularity(granularity)
    if kind in ("tensor", "row"):
        return scale
    r, k = shape[-2] if len(shape) >= 2 else 1, shape[-1]
    if kind == "group":
        s = scale.repeat_interleave(group, dim=-1)[..., :k]
        return s
    bn, bk = block
    s = scale.repeat_interleave(bn, dim=-2)[..., :r, :].repeat_interleave(bk, dim=-1)[..., :k]
    return s


def _group_amax(x: torch.Tensor, granularity: str) -> torch.Tensor:
    kind, group, block = parse_granularity(granularity)
    a = x.abs()
    if kind == "tensor":
        if x.ndim < 2:
            return a.amax().reshape(1)
        return a.amax(dim=(-2, -1), keepdim=True)
    if kind == "row":
        return a.amax(dim=-1, keepdim=True)
    k = x.shape[-1]
    if kind == "group":
        nb = -(-k // group)
        a = torch.nn.functional.pad(a, (0, nb * group - k))
        return a.reshape(*a.shape[:-1], nb, group).amax(dim=-1)
    if x.ndim < 2:
        raise ValueError(f"{granularity} needs a tensor with at least 2 dims")
    bn, bk = block
    r = x.shape[-2]
    nr, nk = -(-r // bn), -(-k // bk)
    a = torch.nn.functional.pad(a, (0, nk * bk - k, 0, nr * bn - r))
    a = a.reshape(*a.shape[:-2], nr, bn, nk, bk)
    return a.amax(dim=(-3, -1))


def quantize_scaled(x: torch.Tensor, fmt: str = "e4m3fn", granularity: str = "tensor",
                    scale: torch.Tensor | None = None) -> ScaledTensor:
    """Quantize ``x`` (scales from its amax per group, or the given static ``scale`` in compact shape)."""
    key = _norm_fmt(fmt)
    x = x.to(torch.float32)
    qmax = format_max(key)
    if scale is None:
        amax = _group_amax(x, granularity)
        scale = torch.where(amax == 0, torch.ones_like(amax), amax / qmax)  # NaN amax → NaN scale
    else:
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    y = x / _expand(scale, tuple(x.shape), granularity)
    if key in FP8_FORMATS:
        data = cast_fp8(y, key)
    else:
        lo, hi = INT_FORMATS[key]
        data = torch.round(y).clamp_(lo, hi).to(torch.int8)
    return ScaledTensor(data, scale, key, granularity)


def dequantize_scaled(t: ScaledTensor) -> torch.Tensor:
    """float32 ``q * scale``."""
    return t.data.to(torch.float32) * _expand(t.scale, t.shape, t.granularity)


def qdq_scaled(x: torch.Tensor, fmt: str = "e4m3fn", granularity: str = "tensor",
               scale: torch.Tensor | None = None) -> torch.Tensor:
    """``dequantize_scaled(quantize_scaled(x, ...))``."""
    return dequantize_scaled(quantize_scaled(x, fmt, granularity, scale))


def qdq_fp8(x: torch.Tensor, fmt: str = "e4m3fn", granularity: str = "tensor",
            scale: torch.Tensor | None = None) -> torch.Tensor:
    """fp8 quantize-dequantize (``fmt`` one of e4m3fn, e4m3fnuz, e5m2, e5m2fnuz)."""
    if _norm_fmt(fmt) not in FP8_FORMATS:
        raise ValueError(f"{fmt!r} is not an fp8 format")
    return qdq_scaled(x, fmt, granularity, scale)


def qdq_int(x: torch.Tensor, bits: int = 8, granularity: str = "channel",
            scale: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetric int8 / int4 quantize-dequantize (weights: ``channel`` or ``group<N>``; activations: ``token``)."""
    if bits not in (8, 4):
        raise ValueError("qdq_int supports 8 or 4 bits")
    return qdq_scaled(x, f"int{bits}", granularity, scale)


def qdq_float(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Round to bf16 / fp16 and back to float32 (the 'unquantized' checkpoint dtypes)."""
    td = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}[dtype]
    return x.to(td).to(torch.float32)
