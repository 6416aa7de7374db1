"""moedispatch: which MoE kernel is correct on an AMD ROCm GPU, per layer, what padding it needs, and why.

Public API (a contract: extended, never broken; docs/architecture.md)::

    from moedispatch import hookimpl, Backend, Verdict, Padding, Reason, select_moe_backend

Importing moedispatch does no work: no probing, no plugin loading, no logging configuration.
"""

from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.reason import Reason
from moedispatch.core.capabilities import Capabilities, GpuInfo
from moedispatch._util.caches import clear_all as clear_caches
from moedispatch.core.costs import Cost
from moedispatch.core.decision import NoBackendError, Rejection
from moedispatch.core.errors import (
    CapabilityDBError,
    ModelError,
    MoedispatchError,
    PluginError,
    TargetError,
    UsageError,
)
from moedispatch.core.hookspecs import hookimpl
from moedispatch.core.layers import MoELayer, QuantSpec

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
    "clear_caches",
    "Cost",
    "Rejection",
    "Plan",
    "Runtime",
    "target",
]


def __getattr__(name: str):  # lazy: keep `import moedispatch` cheap
    if name == "select_moe_backend":
        from moedispatch.api import select_moe_backend

        return select_moe_backend
    if name == "target":  # Capabilities of a simulated target: moedispatch.target("MI300X")
        from moedispatch.api import target

        return target
    if name == "plan_model":
        from moedispatch.api import plan_model

        return plan_model
    if name == "Plan":
        from moedispatch.plan.plan import Plan

        return Plan
    if name == "Runtime":
        from moedispatch.core.workload import Runtime

        return Runtime
    if name == "Decision":
        from moedispatch.core.decision import Decision

        return Decision
    if name in ("engine_choice", "EngineChoice"):  # what vLLM / SGLang do on their own (capability_db/engines)
        from moedispatch.engines import choice

        return choice.engine_choice if name == "engine_choice" else choice.EngineChoice
    if name == "__version__":
        from importlib.metadata import version

        return version("moedispatch")
    raise AttributeError(f"module 'moedispatch' has no attribute {name!r}")
