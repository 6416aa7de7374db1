"""moedispatch: which MoE kernel is correct on an AMD ROCm GPU, per layer, what padding it needs, and why.

Public API (contract, DESIGN.md)::

    from moedispatch import hookimpl, Backend, Verdict, Padding, Reason, select_moe_backend

Importing moedispatch does no work: no probing, no plugin loading, no logging configuration.
"""

from moedispatch.backend import Backend, Padding, Verdict
from moedispatch.reason import Reason
from moedispatch.capabilities import Capabilities, GpuInfo
from moedispatch.errors import (
    CapabilityDBError,
    ModelError,
    MoedispatchError,
    NoBackendError,
    PluginError,
    TargetError,
    UsageError,
)
from moedispatch.hookspecs import hookimpl
from moedispatch.layers import MoELayer, QuantSpec

__all__ = [
    "hookimpl",
    "Backend",
    "Verdict",
    "Padding",
    "Reason",
    "select_moe_backend",
    "plan_model",
    "Decision",
    "engine_choice",
    "EngineChoice",
    "MoELayer",
    "QuantSpec",
    "Capabilities",
    "GpuInfo",
    "MoedispatchError",
    "UsageError",
    "ModelError",
    "TargetError",
    "CapabilityDBError",
    "NoBackendError",
    "PluginError",
]


def __getattr__(name: str):  # lazy: keep `import moedispatch` cheap
    if name == "select_moe_backend":
        from moedispatch.engine import select_moe_backend

        return select_moe_backend
    if name == "plan_model":
        from moedispatch.engine import plan_model

        return plan_model
    if name == "Decision":
        from moedispatch.decision import Decision

        return Decision
    if name in ("engine_choice", "EngineChoice"):  # what vLLM / SGLang do on their own (capability_db/engines)
        import importlib

        # The module moedispatch.engine_choice is itself callable as engine_choice(...) (it shares the name).
        module = importlib.import_module("moedispatch.engine_choice")
        return module if name == "engine_choice" else module.EngineChoice
    if name == "__version__":
        from importlib.metadata import version

        return version("moedispatch")
    raise AttributeError(f"module 'moedispatch' has no attribute {name!r}")
