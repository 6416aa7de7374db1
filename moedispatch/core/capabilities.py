"""What the target machine can do: :class:`Capabilities` and :class:`GpuInfo` (frozen, hashable).

Every field carries provenance: ``probe:<source>`` (amdsmi, torch, rocminfo, rocm_agent_enumerator, env),
``files:amd-aiter``, ``flag``, ``db``, ``default`` — or, in ``unknown``, the reason it is not known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

__all__ = ["GpuInfo", "Capabilities", "parse_version"]


def parse_version(text: str) -> Version:
    """PEP 440 parse that keeps local labels (``0.1.21.post2+rocm7.1``)."""
    return Version(text)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as a probe source saw it."""

    index: int
    gfx: str
    product: str | None = None
    compute_units: int | None = None
    vram_mib: int | None = None
    source: str = "probe"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "gfx": self.gfx, "product": self.product, "compute_units": self.compute_units,
            "vram_mib": self.vram_mib, "source": self.source,
        }


@dataclass(frozen=True)
class Capabilities:
    """The facts selection depends on. Build with :func:`moedispatch.data.capdb.target_capabilities` or the probe.

    ``fp8_format`` is ``e4m3fnuz`` (gfx942), ``e4m3fn`` (gfx950) or ``None`` (no FP8 matrix ops).
    ``aiter_version`` is ``None`` when AITER is absent (or unknown: see ``unknown``). ``aiter_features`` are the
    names from capability_db/aiter.toml that this AITER has. ``aiter_catalog`` (optional, from a probe) lists the
    asm MoE kernel tables found per arch as ``"<gfx>:<table>"``; ``tuned_cu_nums`` the ``cu_num`` values with
    tuned fmoe rows. ``source`` is the target's provenance for explain: ``probe``, ``flag`` or ``default``.
    """

    gfx: str | None
    product: str | None = None
    compute_units: int | None = None
    family: str | None = None
    cdna: int = 0
    fp8_format: str | None = None
    native_mx: bool = False
    aiter_version: str | None = None
    aiter_features: frozenset[str] = frozenset()
    aiter_catalog: frozenset[str] | None = None
    tuned_cu_nums: frozenset[int] | None = None
    packages: tuple[tuple[str, str], ...] = ()
    gpus: tuple[GpuInfo, ...] = ()
    provenance: tuple[tuple[str, str], ...] = ()
    unknown: tuple[tuple[str, str], ...] = ()
    source: str = "default"
    notes: tuple[str, ...] = field(default=(), compare=False)

    # -- queries ----------------------------------------------------------------------------------------------
    def source_of(self, name: str) -> str | None:
        return dict(self.provenance).get(name)

    def why_unknown(self, name: str) -> str | None:
        return dict(self.unknown).get(name)

    def has_aiter(self) -> bool:
        return self.aiter_version is not None

    def has_feature(self, name: str) -> bool:
        return name in self.aiter_features

    def aiter_at_least(self, version: str) -> bool:
        if self.aiter_version is None:
            return False
        try:
            return parse_version(self.aiter_version) >= parse_version(version)
        except InvalidVersion:
            return False

    def package(self, name: str) -> str | None:
        return dict(self.packages).get(name)

    @property
    def arch_label(self) -> str:
        """``gfx942 (MI300X)`` for messages."""
        if self.gfx is None:
            return "an unknown GPU"
        return f"{self.gfx} ({self.product})" if self.product else self.gfx

    def target_dict(self) -> dict[str, Any]:
        """The contract's explain ``target`` object."""
        return {
            "gfx": self.gfx,
            "product": self.product,
            "compute_units": self.compute_units,
            "aiter_version": self.aiter_version,
            "source": self.source,
        }
