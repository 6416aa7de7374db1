"""Domain types for one layer: :class:`QuantSpec` and :class:`MoELayer` (frozen, hashable, pure data)."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from moedispatch.core.errors import UsageError

__all__ = ["QuantSpec", "MoELayer", "QUANT_LABELS", "UNQUANTIZED", "MX_LABELS", "integer", "moe_tp_size"]

#: Quant labels of the contract (every output, the engine API and the plugin API use these names).
QUANT_LABELS = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "mxfp6", "mxfp8")
UNQUANTIZED = ("bf16", "fp16")
MX_LABELS = ("mxfp4", "mxfp6", "mxfp8")

_GRANULARITY = re.compile(r"^(tensor|channel|token|group(\d+)|block(\d+)x(\d+))$")


@dataclass(frozen=True)
class QuantSpec:
    """How one operand (weights or the activations entering the expert GEMMs) is quantized.

    ``dtype`` is a contract label (``bf16``, ``fp16``, ``fp8``, ``int8``, ``int4``, ``mxfp4``, ``mxfp6``, ``mxfp8``).
    ``granularity`` is ``None`` for unquantized operands, else ``tensor``, ``channel``, ``token``, ``group<N>`` or
    ``block<N>x<M>``. ``fmt`` refines the element format where the label is ambiguous (``e4m3fn``, ``e4m3fnuz``,
    ``e5m2`` for fp8; ``e2m3``/``e3m2`` for mxfp6; ``e4m3``/``e5m2`` for mxfp8). ``scale_dtype`` is ``e8m0`` for MX,
    ``fp32``/``bf16`` otherwise. ``dynamic`` tells whether scales are computed at run time (activations) or stored.
    """

    dtype: str
    granularity: str | None = None
    scale_dtype: str | None = None
    dynamic: bool = False
    fmt: str | None = None
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in QUANT_LABELS:
            raise UsageError(f"unknown quant label {self.dtype!r}; expected one of {', '.join(QUANT_LABELS)}")
        if self.dtype in UNQUANTIZED:
            if self.granularity is not None:
                raise UsageError(f"{self.dtype} is not quantized and takes no granularity (got {self.granularity!r})")
        else:
            if self.granularity is None:
                raise UsageError(f"quant label {self.dtype} needs a granularity")
            if not _GRANULARITY.match(self.granularity):
                raise UsageError(
                    f"bad granularity {self.granularity!r}; expected tensor, channel, token, group<N> or block<N>x<M>"
                )
            if self.dtype in MX_LABELS and self.granularity != "group32":
                raise UsageError(f"{self.dtype} is an OCP MX format with one E8M0 scale per 32 elements: "
                                 f"granularity must be group32, got {self.granularity}")

    # -- constructors -----------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, value: "QuantSpec | str", *, granularity: str | None = None, dynamic: bool = False) -> "QuantSpec":
        """Build from a label (``"mxfp4"``) with the contract's default granularity, or pass a QuantSpec through.

        Defaults (the engine API, README "Engines"): ``group32`` for MX labels, ``tensor`` for other quantized labels.
        """
        if isinstance(value, QuantSpec):
            return value
        if not isinstance(value, str):
            raise UsageError(f"quant must be a label or QuantSpec, got {type(value).__name__}")
        label = value.strip().lower()
        if label in UNQUANTIZED:
            return cls(label)
        if label in MX_LABELS:
            return cls(label, granularity or "group32", scale_dtype="e8m0", dynamic=dynamic)
        return cls(label, granularity or "tensor", scale_dtype="fp32", dynamic=dynamic)

    # -- properties -------------------------------------------------------------------------------------------
    @property
    def quantized(self) -> bool:
        return self.dtype not in UNQUANTIZED

    @property
    def is_mx(self) -> bool:
        return self.dtype in MX_LABELS

    @property
    def group_size(self) -> int | None:
        m = _GRANULARITY.match(self.granularity or "")
        return int(m.group(2)) if m and m.group(2) else None

    @property
    def block(self) -> tuple[int, int] | None:
        m = _GRANULARITY.match(self.granularity or "")
        return (int(m.group(3)), int(m.group(4))) if m and m.group(3) else None

    @property
    def bits(self) -> float:
        return {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "mxfp4": 4, "mxfp6": 6, "mxfp8": 8}[self.dtype]

    def describe(self) -> str:
        """Short human form: ``mxfp4/group32``, ``fp8(e4m3fn)/block128x128``, ``bf16``."""
        base = self.dtype + (f"({self.fmt})" if self.fmt else "")
        if self.granularity:
            base += "/" + self.granularity + (" dynamic" if self.dynamic else "")
        return base


def integer(name: str, value: object) -> int:
    """``value`` as a plain int: ints and integral scalars (numpy, a 0-d integer tensor: anything with
    ``__index__``) are taken, ``bool`` and everything else (``256.0``, ``"256"``) is a UsageError naming ``name``."""
    if isinstance(value, bool):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise UsageError(f"{name} must be an integer, got {value!r}") from None


def moe_tp_size(tp: int, ep: int) -> int:
    """Tensor-parallel degree applied to the expert intermediate dimension.

    With expert parallelism the experts are sharded over ``ep`` ranks and the remaining ``tp // ep`` ranks split
    the intermediate dimension (SGLang ``server_args``: ``moe_tp_size = tp_size // ep_size``; vLLM's
    ``--enable-expert-parallel`` sets the MoE TP to 1 with EP = TP×DP, i.e. ``ep == tp``). With ``ep`` a multiple
    of ``tp`` (data-parallel attention, EP over DP ranks) the intermediate is not split.
    """
    if tp < 1 or ep < 1:
        raise UsageError(f"tp and ep must be positive integers (got tp={tp}, ep={ep})")
    if ep == 1:
        return tp
    if tp % ep == 0:
        return tp // ep
    if ep % tp == 0:
        return 1
    raise UsageError(f"ep {ep} must divide tp {tp} or be a multiple of it")


@dataclass(frozen=True)
class MoELayer:
    """One decoder layer's MLP as the kernel sees it on one rank.

    ``kind`` is ``"moe"`` for routed experts or ``"dense"`` for a plain MLP (dense layers get no backend).
    ``intermediate`` is the full per-expert size; ``intermediate_per_rank`` and ``experts_per_rank`` are after
    TP/EP sharding (:func:`moe_tp_size`). ``activation`` is the MoE activation as the kernel must apply it
    (``silu``, ``gelu``, ``swigluoai``, ``swigluoai_uninterleave`` when gate and up halves are kept separate), with
    ``activation_params`` such as ``(("alpha", 1.702), ("limit", 7.0))``.
    """

    index: int
    kind: str
    hidden: int
    intermediate: int
    intermediate_per_rank: int
    experts: int
    experts_per_rank: int
    top_k: int
    activation: str = "silu"
    activation_params: tuple[tuple[str, float], ...] = ()
    has_bias: bool = False
    weight: QuantSpec = field(default_factory=lambda: QuantSpec("bf16"))
    act: QuantSpec = field(default_factory=lambda: QuantSpec("bf16"))
    tp: int = 1
    ep: int = 1
    model: str = ""
    model_type: str = ""
    shared_experts: int = 0
    shared_intermediate: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("moe", "dense"):
            raise UsageError(f"layer kind must be 'moe' or 'dense', got {self.kind!r}")
        for name in ("hidden", "intermediate", "intermediate_per_rank", "tp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"layer {self.index}: {name} must be a positive integer, got {value!r}")
        if self.kind == "moe":
            for name in ("experts", "experts_per_rank", "top_k"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise UsageError(f"layer {self.index}: {name} must be a positive integer, got {value!r}")
            if self.top_k > self.experts:
                raise UsageError(f"layer {self.index}: top_k {self.top_k} exceeds the {self.experts} experts")

    # -- constructors -----------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        *,
        index: int = 0,
        kind: str = "moe",
        hidden: int,
        intermediate: int,
        experts: int = 0,
        top_k: int = 0,
        tp: int = 1,
        ep: int = 1,
        activation: str = "silu",
        activation_params: Mapping[str, float] | tuple[tuple[str, float], ...] = (),
        has_bias: bool = False,
        weight: QuantSpec | str = "bf16",
        act: QuantSpec | str = "bf16",
        model: str = "",
        model_type: str = "",
        shared_experts: int = 0,
        shared_intermediate: int = 0,
    ) -> "MoELayer":
        """Shard a layer for ``tp``/``ep`` and validate divisibility (one clear error if it does not divide)."""
        hidden, intermediate, tp, ep, experts, top_k, index = (
            integer(name, value) for name, value in (("hidden", hidden), ("intermediate", intermediate), ("tp", tp),
                                                     ("ep", ep), ("experts", experts), ("top_k", top_k),
                                                     ("index", index)))
        mtp = moe_tp_size(tp, ep)
        if kind == "moe":
            if intermediate % mtp:
                raise UsageError(f"intermediate size {intermediate} is not divisible by the MoE TP degree {mtp}")
            if experts % ep:
                raise UsageError(f"{experts} experts cannot be split evenly over ep {ep}")
            per_rank = intermediate // mtp
            experts_per_rank = experts // ep
        else:
            # Dense MLPs are sharded by the full TP degree.
            if intermediate % tp:
                raise UsageError(f"dense intermediate size {intermediate} is not divisible by tp {tp}")
            per_rank = intermediate // tp
            experts_per_rank = 0
        params = tuple(sorted(activation_params.items())) if isinstance(activation_params, Mapping) \
            else tuple(activation_params)
        return cls(
            index=index, kind=kind, hidden=hidden, intermediate=intermediate, intermediate_per_rank=per_rank,
            experts=experts, experts_per_rank=experts_per_rank, top_k=top_k, activation=activation,
            activation_params=params, has_bias=has_bias, weight=QuantSpec.parse(weight),
            act=QuantSpec.parse(act, dynamic=True), tp=tp, ep=ep, model=model, model_type=model_type,
            shared_experts=shared_experts, shared_intermediate=shared_intermediate,
        )

    # -- helpers ----------------------------------------------------------------------------------------------
    @property
    def moe_tp(self) -> int:
        return moe_tp_size(self.tp, self.ep)

    def param(self, name: str, default: float | None = None) -> float | None:
        for key, value in self.activation_params:
            if key == name:
                return value
        return default

    def signature(self) -> tuple:
        """What a decision depends on, without the layer index (consecutive identical layers group on it)."""
        return replace(self, index=0)
