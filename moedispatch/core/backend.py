"""The plugin-facing API: :class:`Backend`, :class:`Verdict`, :class:`Padding` (the plugin API contract: docs/plugins.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

from moedispatch.core.reason import Reason

__all__ = ["Backend", "Verdict", "Padding", "round_up", "PAD_SEMANTICS"]

#: How a kernel reads padded weights (``Padding.pad_semantics``):
#:   compute  computes over the whole padded extent, so every pad must hold zeros (AITER classic CK, ASM);
#:   skip     skips the ``kernel_*_pad`` granules it is given (AITER CK-Tile, FlyDSL);
#:   trim     takes ``K = shape - pad`` and never reads the pad (Triton).
PAD_SEMANTICS = ("compute", "skip", "trim")



def _coerce(obj: object, name: str, kind: str) -> None:
    """Wrap a frozen dataclass's str reasons as :class:`Reason` (left untouched when malformed, so the selector can
    report the plugin's mistake precisely)."""
    value = getattr(obj, name)
    if isinstance(value, (tuple, list)) and all(isinstance(v, (str, Reason)) for v in value):
        if all(isinstance(v, str) and v.strip() for v in value if not isinstance(v, Reason)):
            object.__setattr__(obj, name, tuple(Reason.coerce(v, kind) for v in value))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if multiple > 1 else value


def _check_multiples(hidden_multiple: Any, intermediate_multiple: Any) -> None:
    """A padding multiple is a positive int: 0 or a negative tile silently meant "no padding" (round_up's ``> 1``)."""
    for name, value in (("hidden_multiple", hidden_multiple), ("intermediate_multiple", intermediate_multiple)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"Padding {name} must be a positive int (the kernel's tile; 1 = no alignment), "
                             f"got {value!r}")


@dataclass(frozen=True)
class Verdict:
    """A backend's answer for one layer: ``supported`` plus every reason (all failed rules, not only the first).

    For a supported verdict the reasons say why it is correct (and any caveat); for an unsupported one each reason
    names the rule or known issue that failed, specifically: "needs gfx950 for MXFP4 matrix ops, target is gfx942".
    """

    supported: bool
    reasons: tuple[Reason, ...] = ()

    def __post_init__(self) -> None:
        _coerce(self, "reasons", "supports" if self.supported is True else "failed")

    @classmethod
    def unsupported(cls, *reasons: Reason | str) -> "Verdict":
        if not reasons:
            raise ValueError("an unsupported verdict needs at least one reason")
        return cls(False, tuple(reasons))

    @classmethod
    def from_checks(cls, failures: list[Reason | str] | tuple[Reason | str, ...],
                    notes: list[Reason | str] | tuple[Reason | str, ...] = ()) -> "Verdict":
        """Supported iff no rule failed; failures become the reasons, else the notes do."""
        if failures:
            return cls(False, tuple(failures))
        return cls(True, tuple(notes))


# ``Verdict.supported("why")`` is the contract spelling; a dataclass field of the same name would shadow a
# classmethod, so the factory is attached after the class is built and the field stays readable on instances.
def _supported_factory(*reasons: Reason | str) -> Verdict:
    return Verdict(True, tuple(reasons))


class _SupportedDescriptor:
    """``Verdict.supported(...)`` on the class builds a supported verdict; ``verdict.supported`` is the bool."""

    def __get__(self, instance: Verdict | None, owner: type) -> Any:
        if instance is None:
            return _supported_factory
        return instance.__dict__["supported"]


@dataclass(frozen=True)
class Padding:
    """Padded allocation sizes and kernel pad arguments for one layer on one backend.

    ``hidden``/``intermediate_per_rank`` are the sizes the weights are allocated with; ``hidden_pad``/
    ``intermediate_pad`` their difference from the original; ``kernel_*_pad`` the values passed to the kernel (may
    differ: CK ignores pads; MiniMax-M3 passes ``intermediate_pad=0``); ``zero_fill`` whether every pad region must
    hold zeros (allocate with ``torch.zeros``). ``hidden_multiple``/``intermediate_multiple`` record the alignment the
    plan satisfies. ``pad_semantics`` declares how the kernel reads the padded weights (:data:`PAD_SEMANTICS`);
    recipes, ``verify`` and known issues read it instead of inferring it from a family name.
    """

    hidden: int
    intermediate_per_rank: int
    hidden_pad: int = 0
    intermediate_pad: int = 0
    kernel_hidden_pad: int = 0
    kernel_intermediate_pad: int = 0
    zero_fill: bool = False
    hidden_multiple: int = 1
    intermediate_multiple: int = 1
    #: Why the plan looks like this (alignment rule, kernel pad rule, override), each with its source.
    notes: tuple[Reason, ...] = ()
    pad_semantics: str = "compute"

    def __post_init__(self) -> None:
        _coerce(self, "notes", "padding")
        if self.pad_semantics not in PAD_SEMANTICS:
            raise ValueError(f"Padding.pad_semantics must be one of {', '.join(PAD_SEMANTICS)}, "
                             f"got {self.pad_semantics!r}")
        _check_multiples(self.hidden_multiple, self.intermediate_multiple)
        for name in ("hidden", "intermediate_per_rank"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"Padding.{name} must be a positive int")
        for name in ("hidden_pad", "intermediate_pad", "kernel_hidden_pad", "kernel_intermediate_pad"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"Padding.{name} must be a non-negative int, got {value!r}")
        if self.kernel_hidden_pad > self.hidden_pad or self.kernel_intermediate_pad > self.intermediate_pad:
            raise ValueError("a kernel pad cannot exceed the allocated pad")

    def zero_fill_problem(self) -> str | None:
        """Why this plan needs ``zero_fill`` and lacks it, or None — the Backend contract's pad rule, one home for the
        selector (a plugin's plan that breaks it is rejected) and :func:`moedispatch.testing.assert_backend_contract`:
        a kernel that computes over the padded extent (``pad_semantics`` 'compute'), or one told a smaller pad than
        was allocated, reads the pad region — only zeros there keep the output right."""
        if self.zero_fill:
            return None
        if self.pad_semantics == "compute":
            if self.padded:
                return ("pad_semantics 'compute' (the kernel computes over the whole padded extent) but zero_fill is "
                        "False: the pad must then be zero-filled")
        elif self.kernel_hidden_pad < self.hidden_pad or self.kernel_intermediate_pad < self.intermediate_pad:
            return ("a kernel pad is smaller than the allocated pad (the kernel computes over the pad region) but "
                    "zero_fill is False: the pad must then be zero-filled")
        return None

    @classmethod
    def none(cls, layer: "MoELayer") -> "Padding":
        """Allocated sizes equal the original ones, every pad 0, no zero-fill."""
        return cls(hidden=layer.hidden, intermediate_per_rank=layer.intermediate_per_rank)

    @classmethod
    def aligned(
        cls,
        layer: "MoELayer",
        *,
        hidden_multiple: int = 1,
        intermediate_multiple: int = 1,
        kernel_hidden_pad: int | None = None,
        kernel_intermediate_pad: int | None = None,
        notes: tuple[Reason | str, ...] = (),
        pad_semantics: str = "compute",
    ) -> "Padding":
        """Round hidden and intermediate-per-rank up to the given multiples; pads must be zero-filled.

        Kernel pads default to the real pads; pass explicit values where the kernel must see something else.
        """
        _check_multiples(hidden_multiple, intermediate_multiple)
        hidden = round_up(layer.hidden, hidden_multiple)
        inter = round_up(layer.intermediate_per_rank, intermediate_multiple)
        hidden_pad = hidden - layer.hidden
        inter_pad = inter - layer.intermediate_per_rank
        return cls(
            hidden=hidden,
            intermediate_per_rank=inter,
            hidden_pad=hidden_pad,
            intermediate_pad=inter_pad,
            kernel_hidden_pad=hidden_pad if kernel_hidden_pad is None else min(kernel_hidden_pad, hidden_pad),
            kernel_intermediate_pad=inter_pad if kernel_intermediate_pad is None
            else min(kernel_intermediate_pad, inter_pad),
            zero_fill=bool(hidden_pad or inter_pad),
            hidden_multiple=hidden_multiple,
            intermediate_multiple=intermediate_multiple,
            notes=tuple(notes),
            pad_semantics=pad_semantics,
        )

    @property
    def padded(self) -> bool:
        return bool(self.hidden_pad or self.intermediate_pad)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the contract's ``padding`` object of an explain layer entry."""
        return {
            "hidden": self.hidden,
            "intermediate_per_rank": self.intermediate_per_rank,
            "hidden_pad": self.hidden_pad,
            "intermediate_pad": self.intermediate_pad,
            "kernel_hidden_pad": self.kernel_hidden_pad,
            "kernel_intermediate_pad": self.kernel_intermediate_pad,
            "zero_fill": self.zero_fill,
            "pad_semantics": self.pad_semantics,
        }


class Backend:
    """Base class for MoE backends contributed through the ``register_backends`` hook.

    Subclasses set ``name`` (unique, lower-case with hyphens) and ``preference`` (larger wins among the backends
    whose :meth:`check` passes; ties break by name), and override :meth:`check` and, when the kernel needs
    alignment, :meth:`plan_padding`. ``check`` must be pure: same layer and capabilities, same verdict.
    """

    name: str = ""
    preference: int = 0
    #: One line for ``moedispatch backends``.
    description: str = ""
    #: Kernel family in the AITER sense (``ck``, ``cktile``, ``flydsl``, ``asm``, ``triton``, ``emulation``).
    #: Recipes use it to know which engine path realizes the backend (:data:`moedispatch.core.families.AITER_FAMILIES`).
    family: str | None = None
    #: True for a slow reference path (dequantize on the fly): a plan that uses it carries a warning.
    reference_only: bool = False

    def check(self, layer: "MoELayer", caps: "Capabilities") -> Verdict:  # pragma: no cover - abstract
        raise NotImplementedError(f"backend {self.name!r} does not implement check()")

    def plan_padding(self, layer: "MoELayer", caps: "Capabilities") -> Padding:
        return Padding.none(layer)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} preference={self.preference}>"


Verdict.supported = _SupportedDescriptor()  # type: ignore[assignment]
