"""Stand-in for AMD's ``aiter`` (our own code, no kernels): just enough surface for vLLM 0.33.0 to find an AITER
whose ``fused_moe`` has the >= 0.1.14 signature (``gate_mode``; ROCm/aiter#3123).

vLLM finds AITER with ``importlib.util.find_spec("aiter")`` (vllm/_aiter_ops.py ``IS_AITER_FOUND``) and probes
``inspect.signature(aiter.fused_moe.fused_moe)`` (``fused_moe_supports_gate_mode``). Selection never calls a kernel;
anything that would is absent on purpose.
"""

import enum


class ActivationType(enum.Enum):
    No = -1
    Silu = 0
    Gelu = 1
    Swiglu = 2
    Situ = 3
    Situv2 = 4


class QuantType(enum.Enum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5


class GateMode(enum.Enum):
    INTERLEAVE = 0
    SEPARATED = 1
