"""Runners: something that executes one MoE layer with real tensors, behind one small interface.

``runner.prepare(weights, padding)`` takes the layer's weights once (as a loader would), ``runner.run(hidden_states,
topk_weights, topk_ids)`` returns the layer output. :class:`EmulationRunner` wraps
:func:`moedispatch.numerics.moe.fused_moe` and is what the ``emulation`` backend plugin hands out.

Other backends (AITER CK/CKTile/FlyDSL, Triton) can only run on a ROCm GPU with their packages; a plugin that can
drive one registers a factory with :func:`register_runner`. :func:`get_runner` raises :class:`RunnerUnavailable`
with the reason when a backend cannot run here, which ``moedispatch verify`` reports as a skipped check.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from moedispatch.numerics.moe import (
    DEFAULT_MX_SCALE_ROUNDING, DequantTracker, activation_layout, fused_moe, quantize_w13, quantize_weight,
    resolve_scheme, _sizes,
)

__all__ = ["EmulationRunner", "RunnerUnavailable", "register_runner", "get_runner", "runner_names"]

_WEIGHT_KEYS = {
    "w13", "w2", "bias13", "bias2", "b13", "b2", "w13_scale", "w2_scale", "a13_scale", "a2_scale",
    "shared_w13", "shared_w2", "shared_bias13", "shared_bias2",
}


class RunnerUnavailable(RuntimeError):
    """The backend cannot run on this machine (no GPU, package missing, no runner registered); str is the reason."""


class EmulationRunner:
    """The ``emulation`` backend: the reference QDQ MoE (:func:`~moedispatch.numerics.moe.fused_moe`), any device.

    Built from a :class:`moedispatch.core.layers.MoELayer` (schemes and activation taken from it) and/or explicit
    overrides. ``prepare`` quantizes float weights once with the weight scheme (gate and up separately, as a
    checkpoint stores them) unless ``quantize_in_prepare=False``; already-quantized containers pass through.
    """

    name = "emulation"

    def __init__(self, layer: Any = None, *, weight_scheme: Any = None, activation_scheme: Any = None,
                 activation: str | None = None, activation_params: Any = None, gate_up_layout: str | None = None,
                 scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING, tracker: DequantTracker | None = None,
                 quantize_in_prepare: bool = True) -> None:
        self.layer = layer
        self.weight_scheme = resolve_scheme(weight_scheme if weight_scheme is not None
                                            else (layer.weight if layer is not None else None))
        self.activation_scheme = resolve_scheme(activation_scheme if activation_scheme is not None
                                                else (layer.act if layer is not None else None), activation=True)
        self.activation = activation or (layer.activation if layer is not None else "silu")
        if activation_params is None and layer is not None:
            activation_params = layer.activation_params
        self.activation_params = activation_params
        self.gate_up_layout = gate_up_layout or activation_layout(self.activation)
        self.scale_rounding = scale_rounding
        self.tracker = tracker
        self.quantize_in_prepare = quantize_in_prepare
        self.weights: dict[str, Any] | None = None
        self.padding = None

    def prepare(self, weights: Mapping[str, Any], padding: Any = None) -> "EmulationRunner":
        """Take the weights (keys ``w13``, ``w2``, optional ``bias13``/``b13``, ``bias2``/``b2``, ``w13_scale``,
        ``w2_scale``, ``a13_scale``, ``a2_scale``, ``shared_w13``, ``shared_w2``, ``shared_bias13``,
        ``shared_bias2``) at the sizes ``padding`` allocates (or unpadded when ``padding`` is None)."""
        unknown = set(weights) - _WEIGHT_KEYS
        if unknown:
            raise ValueError(f"unknown weight keys: {', '.join(sorted(unknown))}")
        if "w13" not in weights or "w2" not in weights:
            raise ValueError("prepare needs at least 'w13' and 'w2'")
        w = dict(weights)
        for short, long in (("b13", "bias13"), ("b2", "bias2")):
            if short in w:
                w[long] = w.pop(short)
        spec = self.weight_scheme
        if self.quantize_in_prepare and spec.quantized:
            for key in ("w13", "shared_w13"):
                t = w.get(key)
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype.itemsize >= 2 \
                        and w.get(key + "_scale") is None:
                    w[key] = quantize_w13(t, spec, layout=self.gate_up_layout, scale_rounding=self.scale_rounding)
            for key in ("w2", "shared_w2"):
                t = w.get(key)
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype.itemsize >= 2 \
                        and w.get(key + "_scale") is None:
                    w[key] = quantize_weight(t, spec, scale_rounding=self.scale_rounding)
        if w.get("w13_scale") is None and w.get("w2_scale") is None:  # raw codes + scales are checked in run
            _sizes(w["w13"], w["w2"], padding)
        self.weights = w
        self.padding = padding
        return self

    def run(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
            intermediates: dict | None = None) -> torch.Tensor:
        """The layer output, float32 ``[T, hidden_states.shape[1]]``."""
        if self.weights is None:
            raise RuntimeError("EmulationRunner.run before prepare")
        w = self.weights
        return fused_moe(
            hidden_states, w["w13"], w["w2"], topk_weights, topk_ids,
            weight_scheme=self.weight_scheme, activation_scheme=self.activation_scheme,
            activation=self.activation, activation_params=self.activation_params,
            bias13=w.get("bias13"), bias2=w.get("bias2"), padding=self.padding, gate_up_layout=self.gate_up_layout,
            w13_scale=w.get("w13_scale"), w2_scale=w.get("w2_scale"), a13_scale=w.get("a13_scale"),
            a2_scale=w.get("a2_scale"), shared_w13=w.get("shared_w13"), shared_w2=w.get("shared_w2"),
            shared_bias13=w.get("shared_bias13"), shared_bias2=w.get("shared_bias2"),
            scale_rounding=self.scale_rounding, tracker=self.tracker, intermediates=intermediates,
        )


_RUNNERS: dict[str, Callable[[Any], Any]] = {"emulation": lambda layer: EmulationRunner(layer)}


def register_runner(name: str, factory: Callable[[Any], Any]) -> None:
    """Register ``factory(layer) -> runner`` for a backend name; it may raise :class:`RunnerUnavailable`."""
    _RUNNERS[name] = factory


def runner_names() -> list[str]:
    return sorted(_RUNNERS)


def get_runner(backend: str, layer: Any) -> Any:
    """A runner for ``backend`` on this machine, or :class:`RunnerUnavailable` saying why not."""
    factory = _RUNNERS.get(backend)
    if factory is None:
        gpu = "no GPU visible to torch" if not torch.cuda.is_available() else (
            f"torch sees {torch.cuda.get_device_name(0)}" + (" (ROCm)" if torch.version.hip else " (not ROCm)"))
        raise RunnerUnavailable(f"no runner for backend {backend!r} in this build ({gpu}); only "
                                f"{', '.join(runner_names())} can execute here")
    return factory(layer)
