"""OCP Microscaling (MX v1.0) quantize / dequantize: MXFP4, MXFP6 (E2M3, E3M2), MXFP8 (E4M3, E5M2).

One E8M0 scale byte per block of ``block`` (32) consecutive elements along ``axis`` (the GEMM reduction axis, -1).

Semantics (OCP "Microscaling Formats (MX) Specification" v1.0, §5-§6.3):

* shared exponent ``e = floor(log2(amax)) - emax_elem`` with ``amax`` the largest magnitude in the block and
  ``emax_elem`` the exponent of the element format's largest normal (E2M1: 2, E2M3: 2, E3M2: 4, E4M3: 8,
  E5M2: 15); clamped to the E8M0 range ``[-127, 127]``; stored biased (``e + 127``).
* each element ``V / 2^e`` rounds to nearest, ties to even, and saturates to the element maximum (6, 7.5, 28, 448,
  57344). The sign of a value that rounds to zero is kept (``-0`` code), as the conversion of IEEE ``-0.1`` does.
* an all-zero block has ``amax = 0``: its exponent clamps to the smallest E8M0 value, scale byte ``0x00``
  (``2^-127``), the same byte microsoft/microxcaling, torchao ``to_mx`` and AITER produce; every code is zero.
* a block holding a NaN (or an Inf, which E8M0 cannot scale) gets the E8M0 NaN scale ``0xFF`` and dequantizes to
  NaN in every element; its element codes are set to zero (they carry no information).
* dequantization is ``element * 2^(byte - 127)``; byte ``0xFF`` is NaN. Every product is exact in float32.

Scale rounding modes (``scale_rounding``):

``floor``  the OCP rule above (torchao ``ScaleCalculationMode.FLOOR``; AITER ``MxScaleRoundMode.RoundDown``).
``even``   round ``amax`` to a power of two first, rounding up once its float32 mantissa reaches the element's
           rounding threshold: ``amax' = (bits(amax) + (1 << (22 - mbits_elem))) & 0xFF800000``, then the floor
           rule on ``amax'``. For E2M1 (bump ``0x200000``) ``amax >= 1.75 * 2^k`` becomes ``2^(k+1)``: the largest
           scaled magnitude stays below 7, so saturation never costs more than ordinary rounding to 6.
``ceil``   ``ceil(log2(amax)) - emax_elem`` (torchao ``CEIL``).
``rceil``  ``ceil(log2(amax / max_elem))`` (torchao ``RCEIL``, NVIDIA/DeepSeek "round up": nothing saturates).

**Finding — AITER's dynamic MXFP4 quantization uses ``even``.** ``dynamic_mxfp4_quant(x, scaling_mode="even")`` in
ROCm/aiter ``aiter/utility/fp4_utils.py`` (commit 0b3d71613304c12fdc3e1a324d0f1a67a3875684; same code in the Triton
helper ``_mxfp4_quant_op`` of ``aiter/ops/triton/_triton_kernels/quant/quant.py``, commit
69209622680d36164cbc55504578d000f65e0e6d) computes ``amax = (bits(amax) + 0x200000) & 0xFF800000``,
``e = floor(log2(amax)) - 2``, ``clamp(e, -127, 127)``, scale byte ``e + 127`` — independently of its
``scaling_mode`` argument, whose docstring says ``"even" (default): even_round in quark.torch.quantization.utils``.
The same file's ``f32_to_mx_e8m0_scale(mode=MxScaleRoundMode.Even)`` generalizes the bump to
``1 << (23 - mbits - 1)`` for other element types, which is what ``even`` implements here. vLLM's MX emulation
QDQs activations the same way: ``quant_dequant_mxfp4(x, scale_calculation_mode="even")`` (vllm-project/vllm
``vllm/model_executor/layers/quantization/utils/mxfp4_utils.py`` → amd-quark ``mx.qdq_mxfp4``). Two AITER
differences from this module, both outside finite data: (1) a NaN block gets byte 254 from AITER (the bumped NaN
becomes +Inf, ``log2`` gives +Inf, the clamp gives 127), 0xFF here (spec); (2) none for all-zero blocks (both 0x00).

Element codes: E2M1 codes are packed two per byte, element ``2i`` in the low nibble and ``2i+1`` in the high nibble
(AITER ``pack_uint4`` / torchao / OCP order); E2M3/E3M2 codes use the low 6 bits of one byte each; E4M3/E5M2 one byte
each (OCP ``e4m3fn``: 0x7F/0xFF NaN, no Inf; ``e5m2``: IEEE-like).

torch is imported at the top of this module only; ``moedispatch.numerics`` itself imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import torch

__all__ = [
    "MX_FORMATS", "MXFormat", "MXTensor", "SCALE_ROUNDINGS", "mx_format", "quantize_mx", "dequantize_mx", "qdq_mx",
    "element_values", "e8m0_to_float", "shared_exponent",
]

SCALE_ROUNDINGS = ("floor", "even", "ceil", "rceil")
_E8M0_NAN = 255


@dataclass(frozen=True)
class MXFormat:
    """One MX element format: exponent/mantissa bits, bias, largest finite value and its exponent."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_value: float
    emax: int
    #: largest magnitude code (codes above it, with the sign bit clear, are NaN/Inf: only fp8 has them)
    max_code: int
    nan_code: int | None

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal."""
        return 1 - self.bias

    @property
    def packed(self) -> bool:
        return self.bits == 4


#: OCP MX element formats, keyed by the names this package uses (with the usual aliases).
MX_FORMATS: dict[str, MXFormat] = {
    "mxfp4": MXFormat("mxfp4", 2, 1, 1, 6.0, 2, 0x7, None),
    "mxfp6_e2m3": MXFormat("mxfp6_e2m3", 2, 3, 1, 7.5, 2, 0x1F, None),
    "mxfp6_e3m2": MXFormat("mxfp6_e3m2", 3, 2, 3, 28.0, 4, 0x1F, None),
    "mxfp8_e4m3": MXFormat("mxfp8_e4m3", 4, 3, 7, 448.0, 8, 0x7E, 0x7F),
    "mxfp8_e5m2": MXFormat("mxfp8_e5m2", 5, 2, 15, 57344.0, 15, 0x7B, 0x7F),
}
_ALIASES = {
    "fp4": "mxfp4", "e2m1": "mxfp4", "mxfp4_e2m1": "mxfp4",
    "mxfp6": "mxfp6_e2m3", "e2m3": "mxfp6_e2m3", "fp6_e2m3": "mxfp6_e2m3",
    "e3m2": "mxfp6_e3m2", "fp6_e3m2": "mxfp6_e3m2",
    "mxfp8": "mxfp8_e4m3", "e4m3": "mxfp8_e4m3", "mxfp8_e4m3fn": "mxfp8_e4m3", "e4m3fn": "mxfp8_e4m3",
    "e5m2": "mxfp8_e5m2",
}


def mx_format(fmt: str | MXFormat) -> MXFormat:
    """Look up an element format by name (``mxfp4``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp8_e4m3``, ``mxfp8_e5m2``)."""
    if isinstance(fmt, MXFormat):
        return fmt
    key = str(fmt).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in MX_FORMATS:
        raise ValueError(f"unknown MX format {fmt!r}; expected one of {', '.join(MX_FORMATS)}")
    return MX_FORMATS[key]


# -- tables ------------------------------------------------------------------------------------------------------
_LUT_CACHE: dict[tuple, torch.Tensor] = {}


def element_values(fmt: str | MXFormat) -> torch.Tensor:
    """float32 value of every element code ``0 .. 2^bits - 1`` (NaN for fp8 NaN codes), computed from the bit layout."""
    f = mx_format(fmt)
    key = ("values", f.name)
    if key not in _LUT_CACHE:
        n = 1 << f.bits
        vals = []
        for code in range(n):
            sign = -1.0 if code >> (f.ebits + f.mbits) else 1.0
            mag = code & ((1 << (f.ebits + f.mbits)) - 1)
            e = mag >> f.mbits
            m = mag & ((1 << f.mbits) - 1)
            if f.nan_code is not None and mag > f.max_code:
                # e4m3fn: only 0x7F is NaN; e5m2: 0x7C is Inf, 0x7D-0x7F NaN.
                if f.name == "mxfp8_e5m2" and mag == 0x7C:
                    vals.append(sign * float("inf"))
                else:
                    vals.append(float("nan"))
                continue
            if e == 0:
                v = m * 2.0 ** (f.emin - f.mbits)
            else:
                v = (1.0 + m / (1 << f.mbits)) * 2.0 ** (e - f.bias)
            vals.append(sign * v)
        _LUT_CACHE[key] = torch.tensor(vals, dtype=torch.float32)
    return _LUT_CACHE[key]


def _pair_table(f: MXFormat) -> torch.Tensor:
    """[256, 2] float32: both E2M1 values of every packed byte (low nibble first)."""
    key = ("pairs", f.name)
    if key not in _LUT_CACHE:
        vals = element_values(f)
        byte = torch.arange(256)
        _LUT_CACHE[key] = torch.stack([vals[byte & 0xF], vals[byte >> 4]], dim=1).contiguous()
    return _LUT_CACHE[key]


def _e8m0_table() -> torch.Tensor:
    key = ("e8m0",)
    if key not in _LUT_CACHE:
        b = torch.arange(256, dtype=torch.int32)
        bits = torch.where(b == 0, torch.tensor(0x00400000, dtype=torch.int32), b << 23)
        bits = torch.where(b == _E8M0_NAN, torch.tensor(0x7FC00000, dtype=torch.int32), bits)
        _LUT_CACHE[key] = bits.view(torch.float32).clone()
    return _LUT_CACHE[key]


def _on(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A cached table on ``device`` (tables are built on the CPU; GPUs get one copy each)."""
    if table.device == device:
        return table
    key = ("dev", id(table), str(device))
    if key not in _LUT_CACHE:
        _LUT_CACHE[key] = table.to(device)
    return _LUT_CACHE[key]


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes → float32 ``2^(b - 127)``; byte 0 is ``2^-127`` (a float32 subnormal), 0xFF is NaN."""
    return _on(_e8m0_table(), scales.device)[scales.to(torch.int64)]


def _pow2(exp: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2^exp`` for integer ``exp`` in [-127, 127]."""
    return e8m0_to_float((exp + 127).clamp(0, 254))


# -- scale -------------------------------------------------------------------------------------------------------
def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for finite a > 0 (subnormals included), as int32; a == 0 gives a very small number."""
    _, e = torch.frexp(a)
    e = e.to(torch.int32) - 1
    return torch.where(a > 0, e, torch.full_like(e, -1000))


def _ceil_log2(a: torch.Tensor) -> torch.Tensor:
    m, e = torch.frexp(a)
    e = e.to(torch.int32)
    # a = m * 2^e, m in [0.5, 1): exact power of two when m == 0.5 → log2(a) = e - 1, else ceil = e.
    e = torch.where(m == 0.5, e - 1, e)
    return torch.where(a > 0, e, torch.full_like(e, -1000))


def shared_exponent(amax: torch.Tensor, fmt: str | MXFormat, scale_rounding: str = "floor") -> torch.Tensor:
    """Unbiased shared exponent (int32) per block from its float32 ``amax``, clamped to [-127, 127].

    Non-finite ``amax`` gives 128 (the caller encodes NaN, byte 0xFF).
    """
    f = mx_format(fmt)
    amax = amax.to(torch.float32)
    finite = torch.isfinite(amax)
    a = torch.where(finite, amax, torch.zeros_like(amax))
    if scale_rounding == "floor":
        e = _floor_log2(a) - f.emax
    elif scale_rounding == "even":
        bits = a.view(torch.int32).to(torch.int64)
        bits = (bits + (1 << (22 - f.mbits))) & 0xFF800000
        exp_field = (bits >> 23).to(torch.int32)
        # exponent field 0xFF after the bump: amax rounded past the float32 range (AITER's +Inf → clamp 127).
        e = torch.where(exp_field == 255, torch.full_like(exp_field, 1000), exp_field - 127)
        e = torch.where(exp_field == 0, torch.full_like(e, -1000), e) - f.emax
    elif scale_rounding == "ceil":
        e = _ceil_log2(a) - f.emax
    elif scale_rounding == "rceil":
        e = _ceil_log2(a / f.max_value)
    else:
        raise ValueError(f"unknown scale_rounding {scale_rounding!r}; expected one of {', '.join(SCALE_ROUNDINGS)}")
    e = e.clamp(-127, 127)
    return torch.where(finite, e, torch.full_like(e, 128))


# -- element rounding --------------------------------------------------------------------------------------------
def _round_elements(y: torch.Tensor, f: MXFormat) -> torch.Tensor:
    """Round float32 ``y`` to the element grid (RNE), saturating at ±max. Keeps the sign of zero.

    Magnitudes at or above the smallest normal ``2^emin`` round their float32 mantissa to ``mbits`` bits with the
    integer round-half-even trick (a carry moves into the exponent as it should); smaller ones round to the fixed
    subnormal quantum ``2^(emin - mbits)`` by the float32 add/subtract of ``2^(emin - mbits + 23)``, which is an IEEE
    round-half-even to that quantum. Both are exact for every float32 input.
    """
    a = y.abs()
    shift = 23 - f.mbits
    bits = a.view(torch.int32)
    lsb = (bits >> shift) & 1
    normal = ((bits + ((1 << (shift - 1)) - 1) + lsb) & ~((1 << shift) - 1)).view(torch.float32)
    magic = 2.0 ** (f.emin - f.mbits + 23)
    sub = (a + magic) - magic
    q = torch.where(a < 2.0 ** f.emin, sub, normal).clamp_(max=f.max_value)
    return torch.copysign(q, y)


def _encode(q: torch.Tensor, f: MXFormat) -> torch.Tensor:
    """Element codes (uint8, unpacked) of already-rounded values ``q`` (finite, on the element grid)."""
    a = q.abs()
    bits = a.view(torch.int32)
    exp_field = (bits >> 23) - 127 + f.bias
    mant = (bits >> (23 - f.mbits)) & ((1 << f.mbits) - 1)
    normal = (exp_field << f.mbits) | mant
    sub = (a * 2.0 ** (f.mbits - f.emin)).to(torch.int32)
    mag = torch.where(a < 2.0 ** f.emin, sub, normal).to(torch.uint8)
    sign = torch.signbit(q).to(torch.uint8) << (f.ebits + f.mbits)
    return mag | sign


# -- container ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MXTensor:
    """An MX-quantized tensor.

    ``shape`` is the logical shape; ``codes`` hold the element codes with the blocked axis moved last (E2M1 packed two
    per byte, so the last dim is ``ceil(K/2)``; other formats one code per byte); ``scales`` the E8M0 bytes, one per
    block, shape ``codes.shape[:-1] + (ceil(K/block),)``. ``axis`` is the blocked axis of the logical shape.
    """

    fmt: str
    shape: tuple[int, ...]
    codes: torch.Tensor
    scales: torch.Tensor
    block: int = 32
    axis: int = -1
    scale_rounding: str = "floor"

    @property
    def format(self) -> MXFormat:
        return mx_format(self.fmt)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dequantize(self) -> torch.Tensor:
        return dequantize_mx(self)

    def __getitem__(self, index: int) -> "MXTensor":
        """Select along the leading dimension (the expert dimension of ``[E, N, K]`` weights)."""
        if self.ndim < 2 or self.axis % self.ndim == 0:
            raise IndexError("MXTensor indexing selects along a leading, unblocked dimension")
        return replace(self, shape=self.shape[1:], codes=self.codes[index], scales=self.scales[index],
                       axis=(self.axis % self.ndim) - 1)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dequantized_nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return 4 * n


def _blocked(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """Reshape ``[..., K]`` to ``[..., nb, block]`` (zero-padding a partial last block)."""
    k = x.shape[-1]
    nb = -(-k // block)
    if nb * block != k:
        x = torch.nn.functional.pad(x, (0, nb * block - k))
    return x.reshape(*x.shape[:-1], nb, block), k


#: Elements per step of the quantizer. It is a dozen elementwise passes, so it works on cache-sized row chunks rather
#: than whole weight tensors, and each chunk stays below torch's intra-op grain size (32768 elements) so every op runs
#: inline on the calling thread: no OpenMP barrier per op (thousands of them), which on a loaded 2-core machine cost
#: 5-10x. Large tensors spread their chunks over a small thread pool instead (torch releases the GIL inside ops).
_CHUNK_ELEMS = (1 << 15) - 1
_POOL_MIN_CHUNKS = 16
_POOL = None


def _chunk_rows(rows: int, k: int):
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _for_chunks(rows: int, k: int, job, device: torch.device = torch.device("cpu")) -> None:
    """Run ``job(a, b)`` over the row chunks, on a thread pool when there are many (CPU; one chunk elsewhere)."""
    global _POOL
    chunks = list(_chunk_rows(rows, k)) if device.type == "cpu" else [(0, rows)]
    workers = min(4, torch.get_num_threads())
    if len(chunks) < _POOL_MIN_CHUNKS or workers < 2:
        for a, b in chunks:
            job(a, b)
        return
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="moedispatch-mx")
    step = -(-len(chunks) // (4 * workers))
    groups = [chunks[i:i + step] for i in range(0, len(chunks), step)]

    def run_group(group):
        for a, b in group:
            job(a, b)

    for fut in [_POOL.submit(run_group, g) for g in groups]:
        fut.result()


def _quantize_chunk(x: torch.Tensor, f: MXFormat, block: int, scale_rounding: str, want_codes: bool):
    """One ``[rows, K]`` chunk: ``(codes [rows, K or ceil(K/2)], scale bytes [rows, nb])`` or the QDQ values."""
    xb, k = _blocked(x.to(torch.float32), block)
    amax = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)  # amax propagates NaN; an Inf makes it Inf
    exp = shared_exponent(amax, f, scale_rounding)
    y = xb * _pow2((-exp).clamp(-127, 127)).unsqueeze(-1)
    any_bad = bool(bad.any())
    if any_bad:
        y = y.masked_fill(bad.unsqueeze(-1), 0.0)
    q = _round_elements(y, f)
    scale_bytes = (exp + 127).to(torch.uint8)
    if any_bad:
        scale_bytes = scale_bytes.masked_fill(bad, _E8M0_NAN)
    if not want_codes:
        return (q * e8m0_to_float(scale_bytes).unsqueeze(-1)).reshape(x.shape[0], -1)[:, :k]
    codes = _encode(q, f).reshape(x.shape[0], -1)[:, :k]
    if f.packed:
        if k % 2:
            codes = torch.nn.functional.pad(codes, (0, 1))
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return codes, scale_bytes


def quantize_mx(x: torch.Tensor, fmt: str, block: int = 32, scale_rounding: str = "floor", axis: int = -1) -> MXTensor:
    """Quantize ``x`` to an :class:`MXTensor` with one E8M0 scale per ``block`` elements along ``axis``."""
    f = mx_format(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"unknown scale_rounding {scale_rounding!r}; expected one of {', '.join(SCALE_ROUNDINGS)}")
    shape = tuple(x.shape)
    if x.ndim == 0:
        raise ValueError("quantize_mx needs at least one dimension")
    ax = axis % x.ndim
    xm = x.movedim(ax, -1)
    lead, k = tuple(xm.shape[:-1]), xm.shape[-1]
    x2 = xm.reshape(-1, k)
    rows = x2.shape[0]
    nb = -(-k // block)
    codes = torch.empty(rows, -(-k // 2) if f.packed else k, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nb, dtype=torch.uint8, device=x.device)

    def job(a: int, b: int) -> None:
        codes[a:b], scales[a:b] = _quantize_chunk(x2[a:b], f, block, scale_rounding, True)

    _for_chunks(rows, k, job, x.device)
    return MXTensor(f.name, shape, codes.reshape(*lead, -1), scales.reshape(*lead, nb), block, ax, scale_rounding)


def _decode(codes: torch.Tensor, f: MXFormat, k: int) -> torch.Tensor:
    """Element values (float32) of a code tensor with ``k`` logical elements in its last dim."""
    if f.packed:
        pairs = torch.nn.functional.embedding(codes.to(torch.int32), _on(_pair_table(f), codes.device))
        vals = pairs.reshape(*codes.shape[:-1], -1)
        return vals[..., :k] if vals.shape[-1] != k else vals
    table = _on(element_values(f), codes.device).unsqueeze(1)
    return torch.nn.functional.embedding(codes.to(torch.int32), table).squeeze(-1)


def _dequant_rows(codes: torch.Tensor, scales: torch.Tensor, f: MXFormat, k: int, block: int) -> torch.Tensor:
    """``[rows, K]`` float32 from ``[rows, Kc]`` codes and ``[rows, nb]`` scale bytes."""
    vals = _decode(codes, f, k)
    nb = scales.shape[-1]
    scale = e8m0_to_float(scales).unsqueeze(-1)
    rows = vals.shape[0]
    if nb * block == k:
        return vals.reshape(rows, nb, block).mul_(scale).reshape(rows, k)
    vals = torch.nn.functional.pad(vals, (0, nb * block - k))
    return (vals.reshape(rows, nb, block) * scale).reshape(rows, -1)[:, :k]


def dequantize_mx(t: MXTensor) -> torch.Tensor:
    """float32 values ``element * 2^(scale - 127)`` in the logical shape (NaN where the scale byte is 0xFF).

    Works in row chunks into one preallocated output, so the only full-size allocation is the result.
    """
    f = t.format
    k = t.shape[t.axis]
    lead = tuple(t.codes.shape[:-1])
    codes = t.codes.reshape(-1, t.codes.shape[-1])
    scales = t.scales.reshape(-1, t.scales.shape[-1])
    out = torch.empty(codes.shape[0], k, dtype=torch.float32, device=codes.device)

    nb = scales.shape[-1]
    fast = nb * t.block == k and (not f.packed or k % 2 == 0)
    table = _on(_pair_table(f) if f.packed else element_values(f), codes.device) if fast else None

    def job(a: int, b: int) -> None:
        if not fast:
            out[a:b] = _dequant_rows(codes[a:b], scales[a:b], f, k, t.block)
            return
        o = out[a:b]
        # gather straight into the output rows, then scale them in place: no full-size temporaries
        torch.index_select(table, 0, codes[a:b].reshape(-1).to(torch.int32),
                           out=o.view(-1, 2) if f.packed else o.view(-1))
        o.view(b - a, nb, t.block).mul_(e8m0_to_float(scales[a:b]).unsqueeze(-1))

    _for_chunks(codes.shape[0], k, job, codes.device)
    out = out.reshape(*lead, k)
    return out.movedim(-1, t.axis) if t.axis != len(t.shape) - 1 else out


def qdq_mx(x: torch.Tensor, fmt: str, block: int = 32, scale_rounding: str = "floor", axis: int = -1) -> torch.Tensor:
    """``dequantize_mx(quantize_mx(x, ...))`` without building codes (bitwise identical; float32 result)."""
    f = mx_format(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"unknown scale_rounding {scale_rounding!r}; expected one of {', '.join(SCALE_ROUNDINGS)}")
    ax = axis % x.ndim
    xm = x.movedim(ax, -1)
    lead, k = tuple(xm.shape[:-1]), xm.shape[-1]
    x2 = xm.reshape(-1, k)
    out = torch.empty(x2.shape, dtype=torch.float32, device=x.device)

    def job(a: int, b: int) -> None:
        out[a:b] = _quantize_chunk(x2[a:b], f, block, scale_rounding, False)

    _for_chunks(x2.shape[0], k, job, x.device)
    out = out.reshape(*lead, k)
    return out.movedim(-1, ax) if ax != x.ndim - 1 else out
