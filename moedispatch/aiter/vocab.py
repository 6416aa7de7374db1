"""The vocabulary of AITER's fused-MoE tables: the dtype, quant-type and activation strings its tuned CSVs hold,
the pybind ``ActivationType`` values, the per-arch fp8 dtype, and the label explain prints for an activation dtype.
``SRC_FUSED_MOE`` is the HEAD ``aiter/fused_moe.py`` every rule of the model cites."""

from __future__ import annotations




_H = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879"
SRC_FUSED_MOE = f"{_H}/aiter/fused_moe.py"


BF16, FP16 = "torch.bfloat16", "torch.float16"
FP8, FP8_FNUZ = "torch.float8_e4m3fn", "torch.float8_e4m3fnuz"
FP4, I8, I4, U32 = "torch.float4_e2m1fn_x2", "torch.int8", "torch.int4", "torch.uint32"
Q_NO, Q_TENSOR, Q_TOKEN = "QuantType.No", "QuantType.per_Tensor", "QuantType.per_Token"
Q_1X32, Q_1X128 = "QuantType.per_1x32", "QuantType.per_1x128"
SILU, GELU, SWIGLU, SITUV2 = ("ActivationType.Silu", "ActivationType.Gelu", "ActivationType.Swiglu",
                              "ActivationType.Situv2")
#: ``ActivationType`` values (csrc/include/aiter_enum.h).
_ACT_VALUE = {"No": -1, "Silu": 0, "Gelu": 1, "Swiglu": 2, "Situv2": 3}
_ACT = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU, "swigluoai": SWIGLU, "swigluoai_uninterleave": SWIGLU,
        "swiglu": SWIGLU, "situ": SITUV2, "situv2": SITUV2}


def _fp8(gfx: str | None) -> str:
    """``aiter.utility.dtypes.fp8``: e4m3fnuz on gfx942, e4m3fn on gfx950 and later."""
    return FP8_FNUZ if gfx == "gfx942" else FP8


def _label(torch_dtype: str, q_type: str) -> str:
    """A torch dtype string as the contract's activation label."""
    if torch_dtype in (BF16, FP16):
        return "bf16" if torch_dtype == BF16 else "fp16"
    if torch_dtype == FP4:
        return "mxfp4"
    if torch_dtype in (FP8, FP8_FNUZ):
        return "mxfp8" if q_type == Q_1X32 else "fp8"
    if torch_dtype == I8:
        return "int8"
    return torch_dtype.replace("torch.", "")
