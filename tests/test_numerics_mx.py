"""MX quantize/dequantize vs an independent reference built from ml_dtypes (and torchao's to_mx when installed)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from moedispatch.numerics.mx import (  # noqa: E402
    MX_FORMATS, MXTensor, dequantize_mx, e8m0_to_float, element_values, mx_format, qdq_mx, quantize_mx,
)

ML = {
    "mxfp4": ml_dtypes.float4_e2m1fn,
    "mxfp6_e2m3": ml_dtypes.float6_e2m3fn,
    "mxfp6_e3m2": ml_dtypes.float6_e3m2fn,
    "mxfp8_e4m3": ml_dtypes.float8_e4m3fn,
    "mxfp8_e5m2": ml_dtypes.float8_e5m2,
}
FORMATS = list(ML)
MODES = ["floor", "even", "ceil", "rceil"]


# -- independent reference (numpy + ml_dtypes, per block, scalar exponent arithmetic) ----------------------------
def _ref_exponent(amax: float, f, mode: str) -> int:
    """Unbiased shared exponent, from the definitions (math.frexp is exact for every float)."""
    if mode == "floor":
        if amax == 0:
            return -127
        e = math.frexp(amax)[1] - 1 - f.emax
    elif mode == "even":
        bits = int(np.array(amax, dtype=np.float32).view(np.uint32))
        bits = (bits + (1 << (22 - f.mbits))) & 0xFF800000
        field = bits >> 23
        if field == 0:
            return -127
        if field == 255:
            return 127
        e = field - 127 - f.emax
    elif mode == "ceil":
        if amax == 0:
            return -127
        e = _exact_ceil_log2(amax) - f.emax
    else:  # rceil: float32 division as the kernels do it
        q = float(np.float32(amax) / np.float32(f.max_value))
        if q == 0:
            return -127
        e = _exact_ceil_log2(q)
    return max(-127, min(127, e))


def _exact_ceil_log2(a: float) -> int:
    m, e = math.frexp(a)
    return e - 1 if m == 0.5 else e


def ref_quantize(x: np.ndarray, fmt: str, mode: str = "floor", block: int = 32):
    """(codes uint8 [R, K] unpacked, scales uint8 [R, nb]) for float32 x [R, K]."""
    f = mx_format(fmt)
    ml = ML[fmt]
    r, k = x.shape
    nb = -(-k // block)
    codes = np.zeros((r, k), dtype=np.uint8)
    scales = np.zeros((r, nb), dtype=np.uint8)
    for i in range(r):
        for j in range(nb):
            blk = x[i, j * block:(j + 1) * block].astype(np.float64)
            if not np.all(np.isfinite(blk)):
                scales[i, j] = 0xFF
                continue
            e = _ref_exponent(float(np.abs(blk).max()), f, mode)
            scales[i, j] = np.array(2.0 ** e, dtype=np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
            v = np.clip(blk / 2.0 ** e, -f.max_value, f.max_value)
            codes[i, j * block:j * block + len(blk)] = v.astype(ml).view(np.uint8)
    return codes, scales


def unpack(t: MXTensor) -> np.ndarray:
    c = t.codes.numpy()
    if t.format.packed:
        c = np.stack([c & 0xF, c >> 4], axis=-1).reshape(*c.shape[:-1], -1)[..., :t.shape[-1]]
    return c


def ref_dequant(codes: np.ndarray, scales: np.ndarray, fmt: str, block: int = 32) -> np.ndarray:
    vals = codes.view(ML[fmt]).astype(np.float64)
    s = scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    s = np.repeat(s, block, axis=-1)[:, :codes.shape[1]]
    return (vals * s).astype(np.float32)


def random_input(rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    # vary the block magnitudes over a wide range, include exact zeros and tiny values
    x *= np.exp2(rng.integers(-20, 20, size=(rows, 1))).astype(np.float32)
    x[0, :5] = 0.0
    x[1, 3] = -0.0
    return x


# -- element tables ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_element_tables_match_ml_dtypes(fmt):
    f = mx_format(fmt)
    ref = np.arange(1 << f.bits, dtype=np.uint8).view(ML[fmt]).astype(np.float32)
    assert np.array_equal(element_values(fmt).numpy(), ref, equal_nan=True)
    assert float(np.array(f.max_value, dtype=np.float32).astype(ML[fmt]).astype(np.float32)) == f.max_value
    assert f.max_value == float(ml_dtypes.finfo(ML[fmt]).max)


def test_e8m0_decode_matches_ml_dtypes():
    b = torch.arange(256, dtype=torch.uint8)
    ref = b.numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(e8m0_to_float(b).numpy(), ref, equal_nan=True)


def test_format_aliases():
    assert mx_format("mxfp6").name == "mxfp6_e2m3"
    assert mx_format("mxfp8").name == "mxfp8_e4m3"
    assert mx_format("e3m2").name == "mxfp6_e3m2"
    with pytest.raises(ValueError):
        mx_format("mxfp3")
    assert set(MX_FORMATS) == set(FORMATS)


# -- bit-exact quantization --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_quantize_bit_exact_random(fmt, mode):
    x = random_input(24, 160, seed=hash((fmt, mode)) % 2**32)
    t = quantize_mx(torch.from_numpy(x), fmt, scale_rounding=mode)
    codes, scales = ref_quantize(x, fmt, mode)
    assert np.array_equal(t.scales.numpy(), scales)
    assert np.array_equal(unpack(t), codes)
    deq = dequantize_mx(t).numpy()
    assert np.array_equal(deq.view(np.uint32), ref_dequant(codes, scales, fmt).view(np.uint32))
    # qdq without codes is bitwise the same
    assert torch.equal(qdq_mx(torch.from_numpy(x), fmt, scale_rounding=mode).view(torch.int32),
                       dequantize_mx(t).view(torch.int32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_edge_cases(fmt):
    f = mx_format(fmt)
    k = 32 * 9
    x = np.zeros((3, k), dtype=np.float32)
    # block 0: all zero; block 1: NaN; block 2: Inf; block 3: tiny (subnormal float32); block 4: huge;
    # block 5: exact element maxima and beyond; block 6: negative values rounding to -0; block 7: ties; 8: random
    x[:, 32:64] = 1.0
    x[:, 40] = np.nan
    x[:, 64:96] = 2.0
    x[:, 70] = -np.inf
    x[:, 96:128] = np.float32(1e-40) * np.arange(32, dtype=np.float32)
    x[:, 128:160] = np.float32(3e38) / np.arange(1, 33, dtype=np.float32)
    x[:, 160:192] = np.linspace(-f.max_value * 1.2, f.max_value * 1.2, 32, dtype=np.float32)
    x[:, 192:224] = -np.float32(1e-6)
    x[:, 192] = 1.0
    grid = element_values(fmt).numpy()[: f.max_code + 1]
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)  # exact ties when the scale is 1
    tie_block = np.resize(mids, 32)
    tie_block[0] = 2.0 ** f.emax  # amax sets scale 2^0 under the floor rule
    x[:, 224:256] = tie_block
    x[:, 256:288] = np.random.default_rng(7).standard_normal(32).astype(np.float32)
    x[1] *= -1
    x[2, :] = x[2, :] * np.float32(2.0 ** -3)
    t = quantize_mx(torch.from_numpy(x), fmt)
    codes, scales = ref_quantize(x, fmt)
    assert np.array_equal(t.scales.numpy(), scales)
    finite_cols = np.ones(k, dtype=bool)
    finite_cols[32:96] = False
    assert np.array_equal(unpack(t)[:, finite_cols], codes[:, finite_cols])
    d = dequantize_mx(t).numpy()
    assert (t.scales[:, 0] == 0).all() and (d[:, :32] == 0).all()  # zero block: smallest scale, zero codes
    assert (t.scales[:, 1] == 0xFF).all() and np.isnan(d[:, 32:64]).all()  # NaN block
    assert (t.scales[:, 2] == 0xFF).all() and np.isnan(d[:, 64:96]).all()  # Inf block → NaN scale
    assert np.isfinite(d[:, 96:]).all()
    assert np.array_equal(d[:, finite_cols].view(np.uint32), ref_dequant(codes, scales, fmt)[:, finite_cols].view(np.uint32))
    assert torch.equal(qdq_mx(torch.from_numpy(x), fmt).isnan(), torch.from_numpy(np.isnan(d)))


def test_known_values_fp4():
    x = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1] + [0.0] * 23])
    t = quantize_mx(x, "mxfp4")
    assert int(t.scales[0, 0]) == 127  # floor(log2 6) - 2 = 0
    assert dequantize_mx(t)[0, :9].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0]
    assert torch.signbit(dequantize_mx(t)[0, 8])
    assert int(t.codes[0, 0]) == (0x7 | (0x0 << 4))  # 6.0 in the low nibble, +0 (0.25 → tie to even) high
    # "even": amax 6 = 1.5 * 4 stays 4 (below the 1.75 threshold) → scale 2^0; floor: 7.9 saturates to 6
    assert int(quantize_mx(x, "mxfp4", scale_rounding="even").scales[0, 0]) == 127
    y = torch.zeros(1, 32)
    y[0, 0] = 7.9
    assert dequantize_mx(quantize_mx(y, "mxfp4"))[0, 0] == 6.0
    assert dequantize_mx(quantize_mx(y, "mxfp4", scale_rounding="even"))[0, 0] == 8.0
    assert dequantize_mx(quantize_mx(y, "mxfp4", scale_rounding="rceil"))[0, 0] == 8.0


def test_aiter_even_formula_examples():
    """AITER dynamic_mxfp4_quant: amax bits + 0x200000, masked, floor(log2) - 2."""
    for amax, expect in [(5.99, 127), (6.0, 127), (6.99, 127), (7.0, 128), (1.0, 125), (1.5, 125), (1.75, 126),
                         (0.0, 0)]:
        x = torch.zeros(1, 32)
        x[0, 0] = amax
        assert int(quantize_mx(x, "mxfp4", scale_rounding="even").scales[0, 0]) == expect, amax


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_partial_blocks_and_axis(fmt):
    x = torch.from_numpy(random_input(6, 47, seed=3))
    t = quantize_mx(x, fmt)
    assert t.shape == (6, 47) and t.scales.shape == (6, 2)
    codes, scales = ref_quantize(x.numpy(), fmt)
    assert np.array_equal(unpack(t), codes) and np.array_equal(t.scales.numpy(), scales)
    # axis 0: same as quantizing the transpose
    t0 = quantize_mx(x.T.contiguous(), fmt, axis=0)
    assert t0.shape == (47, 6)
    assert torch.equal(dequantize_mx(t0), dequantize_mx(t).T)
    assert torch.equal(qdq_mx(x.T.contiguous(), fmt, axis=0), dequantize_mx(t).T)


def test_expert_indexing_and_bf16_input():
    x = torch.randn(3, 8, 64).to(torch.bfloat16)
    t = quantize_mx(x, "mxfp4")
    assert t.codes.shape == (3, 8, 32) and t.scales.shape == (3, 8, 2)
    e1 = t[1]
    assert e1.shape == (8, 64) and torch.equal(dequantize_mx(e1), dequantize_mx(t)[1])
    assert torch.equal(dequantize_mx(t), qdq_mx(x.float(), "mxfp4"))
    assert len(t) == 3 and t.dequantized_nbytes == 3 * 8 * 64 * 4


def test_bad_arguments():
    with pytest.raises(ValueError):
        quantize_mx(torch.zeros(2, 32), "mxfp4", scale_rounding="up")
    with pytest.raises(ValueError):
        qdq_mx(torch.zeros(2, 32), "nope")


# -- torchao (optional second reference) -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_matches_torchao_to_mx_floor(fmt):
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx
    except Exception as exc:  # pragma: no cover - optional dependency
        pytest.skip(f"torchao not installed: {exc}")
    elem = {"mxfp4": torch.float4_e2m1fn_x2, "mxfp8_e4m3": torch.float8_e4m3fn,
            "mxfp8_e5m2": torch.float8_e5m2}[fmt]
    x = torch.from_numpy(random_input(16, 256, seed=11))
    x[0, :32] = 0  # a zero block
    scale, data = to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)
    t = quantize_mx(x, fmt)
    assert torch.equal(scale.view(torch.uint8), t.scales)
    assert torch.equal(data.view(torch.uint8).reshape(t.codes.shape), t.codes)
