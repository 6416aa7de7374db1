"""fp8 / int8 / int4 scaled QDQ: torch float8 casts bit-exact vs ml_dtypes; granularities vs a numpy reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from moedispatch.numerics.fp8 import (  # noqa: E402
    ScaledTensor, cast_fp8, dequantize_scaled, format_max, fp8_dtype, qdq_fp8, qdq_float, qdq_int, qdq_scaled,
    quantize_scaled,
)

ML = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2": ml_dtypes.float8_e5m2,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}


def _grid(fmt: str) -> np.ndarray:
    vals = np.arange(256, dtype=np.uint8).view(ML[fmt]).astype(np.float32)
    vals = vals[np.isfinite(vals)]
    return np.unique(vals)


def _probe_values(fmt: str) -> np.ndarray:
    """Every representable value, every midpoint (ties), points just beside them, and random magnitudes."""
    g = _grid(fmt)
    mids = ((g[1:].astype(np.float64) + g[:-1]) / 2).astype(np.float32)
    beside = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    rng = np.random.default_rng(5)
    rand = (rng.standard_normal(4000) * np.exp2(rng.uniform(-24, 17, 4000))).astype(np.float32)
    m = format_max(fmt)
    return np.clip(np.concatenate([g, mids, beside, rand, [0.0, -0.0, -1e-30, 1e-30]]).astype(np.float32), -m, m)


@pytest.mark.parametrize("fmt", list(ML))
def test_fp8_cast_bit_exact_vs_ml_dtypes(fmt):
    x = _probe_values(fmt)
    ours = cast_fp8(torch.from_numpy(x), fmt).view(torch.uint8).numpy()
    ref = x.astype(ML[fmt]).view(np.uint8)
    assert np.array_equal(ours, ref), np.nonzero(ours != ref)[0][:10]
    # decoding too
    codes = torch.arange(256, dtype=torch.uint8)
    dec = codes.view(fp8_dtype(fmt)).to(torch.float32).numpy()
    assert np.array_equal(dec, codes.numpy().view(ML[fmt]).astype(np.float32), equal_nan=True)


def test_fp8_format_facts():
    assert format_max("e4m3fn") == 448.0 and format_max("e4m3fnuz") == 240.0
    assert format_max("e5m2") == 57344.0 and format_max("e5m2fnuz") == 57344.0
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz).max) == 240.0
    # FNUZ: NaN is 0x80, no negative zero, bias 8 (code 0x08 is the smallest normal 2^-7)
    nan = cast_fp8(torch.tensor([float("nan")]), "e4m3fnuz").view(torch.uint8)
    assert int(nan) == 0x80
    assert int(cast_fp8(torch.tensor([-0.0]), "e4m3fnuz").view(torch.uint8)) == 0x00
    assert float(torch.tensor([0x08], dtype=torch.uint8).view(torch.float8_e4m3fnuz).float()) == 2.0 ** -7
    assert float(torch.tensor([0x08], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) == 2.0 ** -6
    # saturation instead of NaN/Inf
    assert float(cast_fp8(torch.tensor([1e6]), "e4m3fnuz").float()) == 240.0
    assert float(cast_fp8(torch.tensor([-1e6]), "e4m3fn").float()) == -448.0
    assert float(cast_fp8(torch.tensor([1e9]), "e5m2").float()) == 57344.0
    with pytest.raises(ValueError):
        fp8_dtype("int8")
    with pytest.raises(ValueError):
        cast_fp8(torch.zeros(1), "e3m4")


# -- granularities vs numpy --------------------------------------------------------------------------------------
def _ref_qdq(x: np.ndarray, fmt: str, gran: str) -> np.ndarray:
    """Reference per-group QDQ: loops over the groups, scale amax/max in float32, ml_dtypes / np.round casts."""
    qmax = np.float32(format_max(fmt))
    out = np.empty_like(x)
    r, k = x.shape[-2], x.shape[-1]

    def qdq_group(g: np.ndarray) -> np.ndarray:
        amax = np.float32(np.abs(g).max())
        s = np.float32(amax / qmax) if amax > 0 else np.float32(1.0)
        y = (g / s).astype(np.float32)
        if fmt in ML:
            q = np.clip(y, -qmax, qmax).astype(ML[fmt]).astype(np.float32)
        else:
            lo, hi = (-128, 127) if fmt == "int8" else (-8, 7)
            q = np.clip(np.round(y), lo, hi).astype(np.int8).astype(np.float32)  # integers have no -0
        return (q * s).astype(np.float32)

    for idx in np.ndindex(*x.shape[:-2]):
        m = x[idx]
        o = np.empty_like(m)
        if gran == "tensor":
            o = qdq_group(m)
        elif gran in ("channel", "token"):
            for i in range(r):
                o[i] = qdq_group(m[i])
        elif gran.startswith("group"):
            n = int(gran[5:])
            for i in range(r):
                for j in range(0, k, n):
                    o[i, j:j + n] = qdq_group(m[i, j:j + n])
        else:
            bn, bk = (int(v) for v in gran[5:].split("x"))
            for i in range(0, r, bn):
                for j in range(0, k, bk):
                    o[i:i + bn, j:j + bk] = qdq_group(m[i:i + bn, j:j + bk])
        out[idx] = o
    return out


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz", "e5m2", "int8", "int4"])
@pytest.mark.parametrize("gran", ["tensor", "channel", "token", "group16", "block8x16"])
def test_granularities_match_reference(fmt, gran):
    rng = np.random.default_rng(hash((fmt, gran)) % 2**32)
    x = (rng.standard_normal((3, 20, 40)) * np.exp2(rng.integers(-6, 6, size=(3, 20, 1)))).astype(np.float32)
    x[0, :8, :16] = 0.0  # an all-zero group / tile
    ours = qdq_scaled(torch.from_numpy(x), fmt, gran).numpy()
    ref = _ref_qdq(x, fmt, gran)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_scale_shapes_and_indexing():
    x = torch.randn(4, 256, 384)
    t = quantize_scaled(x, "e4m3fn", "block128x128")
    assert t.scale.shape == (4, 2, 3) and t.data.dtype == torch.float8_e4m3fn
    assert quantize_scaled(x, "e4m3fnuz", "tensor").scale.shape == (4, 1, 1)
    assert quantize_scaled(x, "int8", "channel").scale.shape == (4, 256, 1)
    assert quantize_scaled(x, "int4", "group128").scale.shape == (4, 256, 3)
    e2 = t[2]
    assert isinstance(e2, ScaledTensor) and torch.equal(dequantize_scaled(e2), dequantize_scaled(t)[2])
    assert len(t) == 4 and t.dequantized_nbytes == 4 * 256 * 384 * 4


def test_static_scale_and_helpers():
    x = torch.tensor([[1.0, -2.0, 500.0]])
    got = qdq_fp8(x, "e4m3fn", "tensor", scale=torch.tensor([[1.0]]))
    assert got.tolist() == [[1.0, -2.0, 448.0]]  # saturates at the format max with a static scale
    q = qdq_int(torch.tensor([[3.5, 7.0, -7.0, 0.5]]), 4, "token")
    assert q.tolist() == [[4.0, 7.0, -7.0, 0.0]]  # round half to even: 3.5 → 4, 0.5 → 0
    assert qdq_float(torch.tensor([1.0 + 2 ** -10]), "bf16").item() == 1.0
    with pytest.raises(ValueError):
        qdq_int(x, 3)
    with pytest.raises(ValueError):
        qdq_fp8(x, "int8")
    with pytest.raises(ValueError):
        quantize_scaled(x, "e4m3fn", "rows")


def test_nan_propagates():
    x = torch.tensor([[1.0, float("nan"), 2.0]])
    out = qdq_fp8(x, "e4m3fnuz", "token")
    assert torch.isnan(out).all()  # amax NaN → scale NaN: the whole group is NaN, as in the kernels
