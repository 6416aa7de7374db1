"""The engines' plugin entry points (pyproject ``vllm.general_plugins`` / ``sglang.srt.plugins``).

vLLM loads its general plugins in every process it starts (API server, engine core, each worker); with
``MOEDISPATCH_GUARD=off`` these return before importing the guard, which costs a process about 0.1 s of imports after
the engine's own (``python -X importtime``; benchmarks/bench_guard.py ``guard_off_cost_s``). Any other value, a typo
included, goes to the guard's own ``register``, which validates it. Nothing is imported or read at import.
"""

from __future__ import annotations

import os

__all__ = ["vllm", "sglang"]

#: The guard's mode switch (moedispatch.guard.launch.GUARD_ENV; not imported from there: that is what this avoids).
_GUARD_ENV = "MOEDISPATCH_GUARD"


def _off() -> bool:
    return os.environ.get(_GUARD_ENV, "").strip().lower() == "off"


def vllm() -> None:
    """vLLM's entry point: the guard's :func:`moedispatch.guard.vllm.register` unless it is off."""
    if _off():
        return
    from moedispatch.guard.vllm import register

    register()


def sglang() -> None:
    """SGLang's entry point: the guard's :func:`moedispatch.guard.sglang.register` unless it is off."""
    if _off():
        return
    from moedispatch.guard.sglang import register

    register()
