"""The one table of kernel families: built-in backend name ↔ ``Backend.family`` ↔ how an engine reaches it.

Every module that asks "is this an AITER path", "does ``aiter.fused_moe`` dispatch it", "which backend runs this
AITER kernel family" reads it here. Sources: AITER's fused-MoE dispatcher picks among CK, CK-Tile, FlyDSL and ASM
kernels itself (ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py, ``get_2stage_cfgs``);
AITER's Triton MoE GEMMs are called by the engine directly (vllm-project/vllm@v0.33.0:
vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py), outside that dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Family", "FAMILIES", "AITER_FAMILIES", "FUSED_MOE_FAMILIES", "FUSED_MOE_BACKENDS", "BACKEND_OF_FAMILY",
           "family_of", "kind_of"]


@dataclass(frozen=True)
class Family:
    """One built-in kernel family.

    ``backend`` the built-in backend's name; ``family`` its ``Backend.family``; ``kind`` what the cost model and the
    engine models call the path (``aiter``: through ``aiter.fused_moe``; ``aiter-triton``; ``triton``;
    ``emulation``); ``fused_moe`` whether AITER's own dispatcher picks the kernel; ``aiter`` whether the engine's
    AITER switch is what reaches it.
    """

    backend: str
    family: str
    kind: str
    fused_moe: bool
    aiter: bool


FAMILIES: tuple[Family, ...] = (
    Family("aiter-ck", "ck", "aiter", fused_moe=True, aiter=True),
    Family("aiter-cktile", "cktile", "aiter", fused_moe=True, aiter=True),
    Family("aiter-flydsl", "flydsl", "aiter", fused_moe=True, aiter=True),
    Family("aiter-asm", "asm", "aiter", fused_moe=True, aiter=True),
    Family("aiter-triton", "aiter-triton", "aiter-triton", fused_moe=False, aiter=True),
    Family("triton", "triton", "triton", fused_moe=False, aiter=False),
    Family("emulation", "emulation", "emulation", fused_moe=False, aiter=False),
)

#: ``Backend.family`` values of AITER's kernels (the engine's AITER path and its master switch).
AITER_FAMILIES = frozenset(f.family for f in FAMILIES if f.aiter)
#: The AITER families reached through ``aiter.fused_moe`` (its own per-token dispatcher picks among them).
FUSED_MOE_FAMILIES = frozenset(f.family for f in FAMILIES if f.fused_moe)
#: The built-in backends of those families.
FUSED_MOE_BACKENDS = frozenset(f.backend for f in FAMILIES if f.fused_moe)
#: AITER kernel family (as the dispatch model names it) → the built-in backend that plans for it.
BACKEND_OF_FAMILY = {f.family: f.backend for f in FAMILIES if f.fused_moe}


def family_of(backend: str | None) -> str | None:
    """The ``Backend.family`` of a built-in backend name (``aiter-ck`` → ``ck``); None for any other name."""
    return next((f.family for f in FAMILIES if f.backend == backend), None)


def kind_of(name: str | None) -> str:
    """``aiter`` / ``aiter-triton`` / ``triton`` / ``emulation`` for a built-in backend name or family, else ``other``
    (a third-party ``aiter-foo`` is not AITER's tuned fused_moe)."""
    n = (name or "").strip().lower()
    return next((f.kind for f in FAMILIES if n in (f.backend, f.family)), "other")
