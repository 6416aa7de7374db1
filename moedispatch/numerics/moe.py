"""The reference MoE forward: the checkpoint's quantize-dequantize (QDQ) on weights AND activations, then exact math.

``fused_moe`` is what the ``emulation`` backend runs and what every other backend is compared with. Definition, for
each token ``t`` and each of its routed slots ``j`` (expert ``e = topk_ids[t, j]``, weight ``w = topk_weights[t, j]``):

1. ``a1 = QDQ_act(x)`` — activation QDQ of the hidden states before the gate-up GEMM (MX: one E8M0 scale per 32
   along hidden; fp8/int8 ``token``: per row; ``tensor``: one scale over all tokens, or the static ``a13_scale``;
   ``group<N>``/``block<N>x<M>``: per token per run of N (M) along hidden; bf16/fp16: rounding to that dtype).
2. ``g = a1[t] @ Wg[e]^T (+ bg[e])``, ``u = a1[t] @ Wu[e]^T (+ bu[e])`` with ``Wg, Wu = QDQ_w(gate), QDQ_w(up)``.
3. ``h = act(g, u)`` (below); ``a2 = QDQ_act(h)`` over all routed slots (``tensor``: one scale over all of them).
4. ``y = a2 @ W2[e]^T (+ b2[e])``; ``out[t] = sum_j w * y``, accumulated in float32 from zero in ascending expert
   id order (deterministic, and no ``[T*k, H]`` buffer); plus the optional shared expert (same definition, weight
   1). Everything is float32 (``F.linear`` GEMMs); the result is float32.

Layouts: ``w13`` is ``[E, 2*I, H]``. ``gate_up_layout="halves"`` (default; vLLM/SGLang/AITER "separated"): rows
``[0, I)`` are the gate, ``[I, 2I)`` the up projection; padded to ``I_p`` each half is padded at its end (gate rows
``[0, I)``, pad ``[I, I_p)``, up ``[I_p, I_p + I)``, pad ``[I_p + I, 2 I_p)``). ``"interleaved"`` (gpt-oss
``swigluoai`` in vLLM: ``gate = x[..., ::2], up = x[..., 1::2]``): row ``2i`` gate, ``2i + 1`` up, padding rows at the
end. ``w2`` is ``[E, H, I]`` (padded ``[E, H_p, I_p]``, pad at the end of each axis); ``bias13`` ``[E, 2I]`` in the
w13 layout, ``bias2`` ``[E, H]``. The activation picks the default layout: ``swigluoai`` → interleaved,
everything else (``swigluoai_uninterleave`` included) → halves.

Activations (``activation_params`` as a mapping or ``((name, value), ...)``):

* ``silu``: ``silu(g) * u``; ``gelu``: exact erf GELU ``gelu(g) * u``; ``gelu_tanh``: tanh approximation.
* ``swigluoai`` / ``swigluoai_uninterleave`` (gpt-oss, MiniMax-M3; vLLM ``SwigluOAIAndMul``): ``g = min(g, limit)``,
  ``u = clamp(u, -limit, limit)``, ``h = g * sigmoid(alpha * g) * (u + beta)`` with ``alpha`` 1.702, ``limit`` 7.0,
  ``beta`` 1.0 by default.

Padding (:class:`moedispatch.core.backend.Padding`): weights may come at the padded sizes. The pad regions must hold
zeros (a kernel that computes over them — AITER with ``intermediate_pad=0`` — would otherwise add garbage);
``fused_moe`` checks every pad region of every expert it dequantizes and raises ``ValueError`` naming the region
otherwise. It then computes on the logical (unpadded) region, so a zero-filled padded layer gives *bitwise* the
result of the unpadded one: zero pads add exact zeros mathematically, and restricting the GEMMs to the logical
region keeps that exact whatever summation order the BLAS picks for a longer K. (Quantization at the padded size is
the same as at the unpadded size: MX blocks, groups and tiles start at 0 and zeros never raise an amax.) The output
has the width of ``hidden_states`` (pad columns zero).

Memory: only experts that tokens are routed to are dequantized, one at a time (w13 in the first pass, w2 in the
second), so extra memory stays near one expert's dequantized w13. Pass a :class:`DequantTracker` to count them.

Weights may be given as float tensors (QDQ'd here per expert and per gate/up half — the checkpoint stores gate and
up projections separately, which matters for ``tensor`` and ``block`` scales), as :class:`~.mx.MXTensor` /
:class:`~.fp8.ScaledTensor` containers (already quantized, dequantized per expert), as a :class:`GateUp` pair of
containers, or as raw codes / float8 data plus ``w13_scale`` / ``w2_scale`` (wrapped according to the scheme).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch

from moedispatch.numerics import ACTIVATIONS
from moedispatch.numerics.fp8 import ScaledTensor, dequantize_scaled, qdq_float, qdq_scaled, quantize_scaled
from moedispatch.numerics.mx import MXTensor, dequantize_mx, qdq_mx, quantize_mx
from moedispatch.core.layers import QuantSpec

__all__ = [
    "ACTIVATIONS", "DEFAULT_SWIGLU", "DequantTracker", "GateUp", "fused_moe", "resolve_scheme", "quantize_weight",
    "quantize_w13", "dequantize_weight", "qdq_weight", "qdq_activation", "apply_activation", "activation_layout",
    "mx_format_of", "scaled_format_of",
]

DEFAULT_SWIGLU = {"alpha": 1.702, "limit": 7.0, "beta": 1.0}
#: MX activation scale rounding used by default: AITER dynamic_mxfp4_quant and vLLM/Quark emulation use "even".
DEFAULT_MX_SCALE_ROUNDING = "even"


# -- bookkeeping -------------------------------------------------------------------------------------------------
@dataclass
class DequantTracker:
    """Counts dequantized (or QDQ'd) expert weights: which experts, how often, and the peak bytes alive at once.

    ``fused_moe`` calls :meth:`acquire` right after it materializes an expert's float weights and :meth:`release`
    when it drops them. ``counts[(name, expert)]`` is how many times that weight was materialized;
    ``peak_bytes`` the largest sum of bytes alive at the same time.
    """

    counts: Counter = field(default_factory=Counter)
    live_bytes: int = 0
    peak_bytes: int = 0
    events: list = field(default_factory=list)
    hook: Callable[[str, Any, int], None] | None = None

    def acquire(self, name: str, expert: Any, nbytes: int) -> None:
        self.counts[(name, expert)] += 1
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.events.append(("acquire", name, expert, nbytes))
        if self.hook is not None:
            self.hook(name, expert, nbytes)

    def release(self, name: str, expert: Any, nbytes: int) -> None:
        self.live_bytes -= nbytes
        self.events.append(("release", name, expert, nbytes))

    def experts(self, name: str | None = None) -> set:
        return {e for (n, e) in self.counts if name is None or n == name}

    def reset(self) -> None:
        self.counts.clear()
        self.events.clear()
        self.live_bytes = self.peak_bytes = 0


# -- schemes -----------------------------------------------------------------------------------------------------
def resolve_scheme(scheme: Any, *, activation: bool = False):
    """A :class:`moedispatch.core.layers.QuantSpec` from a spec or a label (``"mxfp4"``, ``"fp8"``, ``"bf16"``)."""
    if scheme is None:
        return QuantSpec("bf16")
    return QuantSpec.parse(scheme, dynamic=activation)


def mx_format_of(spec) -> str:
    """MX element format name of an MX QuantSpec (mxfp6 defaults to E2M3, mxfp8 to E4M3)."""
    fmt = (spec.fmt or "").lower().replace("fp6_", "").replace("fp8_", "")
    if spec.dtype == "mxfp4":
        return "mxfp4"
    if spec.dtype == "mxfp6":
        return "mxfp6_" + (fmt or "e2m3")
    if spec.dtype == "mxfp8":
        return "mxfp8_" + ("e5m2" if fmt == "e5m2" else "e4m3")
    raise ValueError(f"{spec.dtype} is not an MX label")


def scaled_format_of(spec) -> str:
    """Scaled-format name of an fp8/int8/int4 QuantSpec (fp8 defaults to OCP e4m3fn)."""
    if spec.dtype == "fp8":
        return (spec.fmt or "e4m3fn").lower()
    if spec.dtype in ("int8", "int4"):
        return spec.dtype
    raise ValueError(f"{spec.dtype} is not a scaled integer/fp8 label")


def _act_granularity(spec) -> str:
    g = spec.granularity
    if g == "channel":
        return "token"
    if g and g.startswith("block"):
        # Activations are quantized per token in runs of the weight block's K size (DeepSeek per-token-group 128).
        return "group" + g.split("x")[1]
    return g


def quantize_weight(w: torch.Tensor, scheme: Any, *, scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING):
    """Quantize a float weight ``[..., N, K]`` with the scheme: MXTensor, ScaledTensor, or float32 (bf16/fp16)."""
    spec = resolve_scheme(scheme)
    if spec.is_mx:
        return quantize_mx(w, mx_format_of(spec), block=32, scale_rounding=scale_rounding)
    if spec.dtype in ("bf16", "fp16"):
        return qdq_float(w, spec.dtype)
    gran = spec.granularity
    if gran == "token":
        raise ValueError("per-token granularity is for activations; weights use channel, group<N> or block<N>x<M>")
    return quantize_scaled(w, scaled_format_of(spec), gran)


def dequantize_weight(w: Any) -> torch.Tensor:
    """float32 values of any weight container (MXTensor, ScaledTensor, GateUp, object with ``dequantize()``, tensor)."""
    if isinstance(w, torch.Tensor):
        return w.to(torch.float32)
    if isinstance(w, MXTensor):
        return dequantize_mx(w)
    if isinstance(w, ScaledTensor):
        return dequantize_scaled(w)
    return w.dequantize()


def qdq_weight(w: torch.Tensor, scheme: Any, *, scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING) -> torch.Tensor:
    """``dequantize_weight(quantize_weight(w, scheme))``."""
    return dequantize_weight(quantize_weight(w, scheme, scale_rounding=scale_rounding))


def qdq_activation(x: torch.Tensor, scheme: Any, *, scale: torch.Tensor | float | None = None,
                   scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING) -> torch.Tensor:
    """Activation QDQ of ``x [rows, K]`` along K as the scheme says (see the module docstring). float32 result."""
    spec = resolve_scheme(scheme, activation=True)
    x = x.to(torch.float32)
    if spec.dtype in ("bf16", "fp16"):
        return qdq_float(x, spec.dtype)
    if spec.is_mx:
        return qdq_mx(x, mx_format_of(spec), block=32, scale_rounding=scale_rounding)
    gran = _act_granularity(spec)
    if scale is not None:
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        if gran != "tensor":
            raise ValueError("a static activation scale goes with per-tensor granularity")
        scale = scale.reshape(1, 1) if scale.numel() == 1 else scale.amax().reshape(1, 1)
    return qdq_scaled(x, scaled_format_of(spec), gran, scale)


def activation_layout(activation: str) -> str:
    """Default gate/up layout of an activation: ``interleaved`` for ``swigluoai``, else ``halves``."""
    return "interleaved" if activation == "swigluoai" else "halves"


def _params(activation_params: Any) -> dict[str, float]:
    if activation_params is None:
        return {}
    if isinstance(activation_params, Mapping):
        return {k: float(v) for k, v in activation_params.items()}
    return {k: float(v) for k, v in activation_params}


def apply_activation(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu",
                     activation_params: Any = None) -> torch.Tensor:
    """The gated activation ``act(gate, up)`` in the dtype of its inputs (float32 here, float64 in references)."""
    p = _params(activation_params)
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    if activation == "gelu":
        return torch.nn.functional.gelu(gate) * up
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
    if activation in ("swigluoai", "swigluoai_uninterleave"):
        alpha = p.get("alpha", DEFAULT_SWIGLU["alpha"])
        limit = p.get("limit", DEFAULT_SWIGLU["limit"])
        beta = p.get("beta", DEFAULT_SWIGLU["beta"])
        g = gate.clamp(max=limit)
        u = up.clamp(min=-limit, max=limit)
        return g * torch.sigmoid(alpha * g) * (u + beta)
    raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")


# -- gate/up containers ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateUp:
    """w13 quantized as the checkpoint stores it: separate gate and up containers ``[E, I_p, H_p]`` each."""

    gate: Any
    up: Any
    layout: str = "halves"

    def __getitem__(self, index: int) -> "GateUp":
        return replace(self, gate=self.gate[index], up=self.up[index])

    def __len__(self) -> int:
        return _shape(self.gate)[0]

    @property
    def shape(self) -> tuple[int, ...]:
        s = _shape(self.gate)
        return (*s[:-2], 2 * s[-2], s[-1])

    def dequantize(self) -> torch.Tensor:
        g, u = dequantize_weight(self.gate), dequantize_weight(self.up)
        if self.layout == "interleaved":
            return torch.stack([g, u], dim=-2).reshape(*g.shape[:-2], -1, g.shape[-1])
        return torch.cat([g, u], dim=-2)


def _split_halves(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and up rows of ``[..., 2I, K]`` (views)."""
    n = w.shape[-2] // 2
    if layout == "interleaved":
        return w[..., 0::2, :], w[..., 1::2, :]
    return w[..., :n, :], w[..., n:, :]


def quantize_w13(w13: torch.Tensor, scheme: Any, *, layout: str = "halves",
                 scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING) -> GateUp | torch.Tensor:
    """Quantize a float ``[E, 2I, H]`` gate-up weight per half (as checkpoints store gate and up separately)."""
    spec = resolve_scheme(scheme)
    if not spec.quantized:
        return qdq_float(w13, spec.dtype)
    gate, up = _split_halves(w13, layout)
    return GateUp(quantize_weight(gate.contiguous(), spec, scale_rounding=scale_rounding),
                  quantize_weight(up.contiguous(), spec, scale_rounding=scale_rounding), layout)


def _shape(w: Any) -> tuple[int, ...]:
    if isinstance(w, torch.Tensor):
        return tuple(w.shape)
    return tuple(w.shape)


def _wrap_raw(w: Any, scale: Any, spec, name: str) -> Any:
    """Raw codes / float8 data + scales → a container, per the scheme."""
    if scale is None or not isinstance(w, torch.Tensor):
        if scale is not None:
            raise ValueError(f"{name}_scale given with a {type(w).__name__}; pass it inside the container")
        return w
    if spec.is_mx:
        if w.dtype != torch.uint8:
            raise ValueError(f"{name}: MX codes must be uint8 (E2M1 packed two per byte)")
        from moedispatch.numerics.mx import mx_format  # noqa: PLC0415

        f = mx_format(mx_format_of(spec))
        k = w.shape[-1] * (2 if f.packed else 1)
        return MXTensor(f.name, (*w.shape[:-1], k), w, torch.as_tensor(scale).to(torch.uint8), 32, -1)
    if spec.quantized:
        return ScaledTensor(w, torch.as_tensor(scale, dtype=torch.float32), scaled_format_of(spec), spec.granularity)
    raise ValueError(f"{name}_scale given for unquantized weights ({spec.dtype})")


# -- per-expert weight sources -----------------------------------------------------------------------------------
class _Source:
    """Materializes one expert's float32 weight at the (padded) allocated size, tracked."""

    def __init__(self, w: Any, spec, scale_rounding: str, tracker: DequantTracker | None, name: str):
        self.w, self.spec, self.rounding, self.tracker, self.name = w, spec, scale_rounding, tracker, name

    def _one(self, w: Any) -> torch.Tensor:
        if isinstance(w, torch.Tensor):
            if w.dtype.is_floating_point and w.dtype.itemsize >= 2:
                return qdq_weight(w, self.spec, scale_rounding=self.rounding)
            raise ValueError(f"{self.name}: {w.dtype} weights need {self.name}_scale (or pass a quantized container)")
        return dequantize_weight(w)

    def get(self, e: Any, w: Any | None = None) -> torch.Tensor:
        out = self._one(self.w[e] if w is None else w)
        if self.tracker is not None:
            self.tracker.acquire(self.name, e, out.numel() * out.element_size())
        return out

    def drop(self, e: Any, t: torch.Tensor) -> None:
        if self.tracker is not None:
            self.tracker.release(self.name, e, t.numel() * t.element_size())


def _nonzero_region(t: torch.Tensor) -> bool:
    return t.numel() > 0 and bool(t.ne(0).any())


def _check_zero(region: torch.Tensor, what: str) -> None:
    if _nonzero_region(region):
        raise ValueError(f"padding: {what} is not zero-filled (allocate padded weights with torch.zeros)")


class _W13:
    """Gate and up (logical views) of one expert, with the pad regions checked."""

    def __init__(self, w13: Any, spec, layout: str, inter: int, inter_p: int, hidden: int, hidden_p: int,
                 rounding: str, tracker: DequantTracker | None, name: str = "w13"):
        self.src = _Source(w13, spec, rounding, tracker, name)
        self.layout, self.i, self.ip, self.h, self.hp, self.name = layout, inter, inter_p, hidden, hidden_p, name
        self.gateup = isinstance(w13, GateUp)
        self.float_input = isinstance(w13, torch.Tensor) and w13.dtype.is_floating_point and spec.quantized
        self.copies: set[int] = set()

    def get(self, e: Any) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Contiguous logical ``gate``, ``up`` ``[I, H]`` of expert ``e`` and the tracked tensors to release."""
        i, h = self.i, self.h
        if self.gateup or self.float_input:
            if self.gateup:
                w = self.src.w[e]
                parts = [self.src.get(e, w.gate), self.src.get(e, w.up)]
            else:
                g, u = _split_halves(self.src.w[e], self.layout)
                parts = [self.src.get(e, g), self.src.get(e, u)]  # QDQ per half: the checkpoint's tensors
            gate, up = parts
            for t, half in ((gate, "gate"), (up, "up")):
                _check_zero(t[i:], f"{self.name}[{e}] {half} rows {i}..{self.ip - 1}")
                _check_zero(t[:i, h:], f"{self.name}[{e}] {half} hidden columns {h}..{self.hp - 1}")
            return self._logical(e, gate[:i, :h], up[:i, :h], parts)
        full = self.src.get(e)
        _check_zero(full[:, h:], f"{self.name}[{e}] hidden columns {h}..{self.hp - 1}")
        if self.layout == "interleaved":
            _check_zero(full[2 * i:], f"{self.name}[{e}] rows {2 * i}..{2 * self.ip - 1}")
            return self._logical(e, full[0:2 * i:2, :h], full[1:2 * i:2, :h], [full])
        _check_zero(full[i:self.ip], f"{self.name}[{e}] gate rows {i}..{self.ip - 1}")
        _check_zero(full[self.ip + i:], f"{self.name}[{e}] up rows {self.ip + i}..{2 * self.ip - 1}")
        return self._logical(e, full[:i, :h], full[self.ip:self.ip + i, :h], [full])

    def _logical(self, e: Any, gate: torch.Tensor, up: torch.Tensor, parts: list[torch.Tensor]):
        """Make the logical views contiguous (tracked copies); release sources nothing views any more."""
        out = []
        for v in (gate, up):
            if not v.is_contiguous():
                v = v.contiguous()
                if self.src.tracker is not None:
                    self.src.tracker.acquire(self.name + ":logical-copy", e, v.numel() * v.element_size())
                    self.copies.add(id(v))
                parts.append(v)
            out.append(v)
        ptrs = {o.untyped_storage().data_ptr() for o in out}
        live = []
        for t in parts:
            if t.untyped_storage().data_ptr() in ptrs:
                live.append(t)
            else:
                self.src.drop(e, t)
        return out[0], out[1], live

    def drop(self, e: Any, parts: list[torch.Tensor]) -> None:
        for t in parts:
            if id(t) in self.copies:
                self.copies.discard(id(t))
                self.src.tracker.release(self.name + ":logical-copy", e, t.numel() * t.element_size())
            else:
                self.src.drop(e, t)


def _bias_halves(b: torch.Tensor, layout: str, inter: int, inter_p: int) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "interleaved":
        _check_zero(b[2 * inter:], f"bias13 pad entries {2 * inter}..")
        return b[0:2 * inter:2], b[1:2 * inter:2]
    _check_zero(b[inter:inter_p], "bias13 gate pad entries")
    _check_zero(b[inter_p + inter:], "bias13 up pad entries")
    return b[:inter], b[inter_p:inter_p + inter]


# -- the forward -------------------------------------------------------------------------------------------------
def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` in float32. ``F.linear`` is the fast CPU path for a ``[N, K]`` weight (``x @ w.T`` on a
    transposed view was ~25x slower for decode-sized ``x`` here); the weight is made contiguous so the padded and
    unpadded layers hand the BLAS identical operands."""
    return torch.nn.functional.linear(x, w if w.is_contiguous() else w.contiguous())


def _sizes(w13: Any, w2: Any, padding: Any) -> tuple[int, int, int, int, int]:
    s13, s2 = _shape(w13), _shape(w2)
    if len(s13) != 3 or len(s2) != 3:
        raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I]; got {s13} and {s2}")
    e, hp, ip = s2
    if padding is not None:
        if (padding.hidden, padding.intermediate_per_rank) != (hp, ip):
            raise ValueError(f"padding says hidden {padding.hidden}, intermediate {padding.intermediate_per_rank} but "
                             f"w2 is {s2}")
        h, i = hp - padding.hidden_pad, ip - padding.intermediate_pad
    else:
        h, i = hp, ip
    if s13 != (e, 2 * ip, hp):
        raise ValueError(f"w13 shape {s13} does not match w2 {s2}: expected {(e, 2 * ip, hp)}")
    return e, h, i, hp, ip


def fused_moe(hidden_states: torch.Tensor, w13: Any, w2: Any, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              weight_scheme: Any, activation_scheme: Any, activation: str = "silu", activation_params: Any = None,
              bias13: torch.Tensor | None = None, bias2: torch.Tensor | None = None, padding: Any = None,
              gate_up_layout: str | None = None, w13_scale: Any = None, w2_scale: Any = None,
              a13_scale: Any = None, a2_scale: Any = None, shared_w13: Any = None, shared_w2: Any = None,
              shared_bias13: torch.Tensor | None = None, shared_bias2: torch.Tensor | None = None,
              scale_rounding: str = DEFAULT_MX_SCALE_ROUNDING, tracker: DequantTracker | None = None,
              intermediates: dict | None = None) -> torch.Tensor:
    """The reference MoE forward (see the module docstring). Returns float32 ``[T, hidden_states.shape[1]]``.

    ``topk_ids`` entries ``< 0`` are slots not on this rank (expert parallelism) and contribute nothing.
    ``scale_rounding`` is the MX scale rounding for activation QDQ and for float weights QDQ'd here.
    ``intermediates``, when a dict, receives ``a1`` (QDQ'd input), ``h`` (activation output per slot, before its
    QDQ), ``a2`` (after) and ``experts`` (the routed experts, in the order they are processed).
    """
    wspec, aspec, layout = _forward_schemes(weight_scheme, activation_scheme, activation, gate_up_layout)
    w13 = _wrap_raw(w13, w13_scale, wspec, "w13")
    w2 = _wrap_raw(w2, w2_scale, wspec, "w2")
    n_exp, h, i, hp, ip = _sizes(w13, w2, padding)
    x, width = _logical_hidden_states(hidden_states, h, hp)
    ids, weights = _routing_tensors(topk_ids, topk_weights, x.shape[0], n_exp)
    t_count, k = x.shape[0], ids.shape[1]

    # first pass: gate-up GEMMs and the activation per routed slot, one expert's w13 at a time
    a1 = qdq_activation(x, aspec, scale=a13_scale, scale_rounding=scale_rounding)
    experts, slots_of = _routed_slots(ids)
    src13 = _W13(w13, wspec, layout, i, ip, h, hp, scale_rounding, tracker)
    hbuf = torch.zeros(t_count * k, i, dtype=torch.float32, device=x.device)
    for e in experts:
        slots = slots_of[e]
        g, u = _gate_up_proj(src13, e, a1.index_select(0, slots // k), bias13)
        hbuf.index_copy_(0, slots, apply_activation(g, u, activation, activation_params))

    # second pass: down GEMMs, weighted and accumulated per token, one expert's w2 at a time
    a2 = qdq_activation(hbuf, aspec, scale=a2_scale, scale_rounding=scale_rounding)
    src2 = _Source(w2, wspec, scale_rounding, tracker, "w2")
    out = torch.zeros(t_count, h, dtype=torch.float32, device=x.device)
    flat_w = weights.reshape(-1)
    for e in experts:
        slots = slots_of[e]
        y = _down_proj(src2, e, a2, slots, bias2, h=h, i=i, hp=hp, ip=ip)
        # a token meets each expert at most once, so one index_add_ per expert never adds twice to a row
        out.index_add_(0, slots // k, y * flat_w.index_select(0, slots).unsqueeze(-1))

    if shared_w13 is not None:
        out = out + _shared_expert(x, shared_w13, shared_w2, shared_bias13, shared_bias2, wspec, aspec, activation,
                                   activation_params, layout, scale_rounding, tracker)
    if intermediates is not None:
        intermediates.update(a1=a1, h=hbuf, a2=a2, experts=experts)
    if width > h:
        out = torch.nn.functional.pad(out, (0, width - h))
    return out


def _forward_schemes(weight_scheme: Any, activation_scheme: Any, activation: str,
                     gate_up_layout: str | None) -> tuple[QuantSpec, QuantSpec, str]:
    """Check ``activation`` and the gate/up layout; return the weight scheme, activation scheme and layout."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    wspec = resolve_scheme(weight_scheme)
    aspec = resolve_scheme(activation_scheme, activation=True)
    layout = gate_up_layout or activation_layout(activation)
    if layout not in ("halves", "interleaved"):
        raise ValueError(f"gate_up_layout must be 'halves' or 'interleaved', got {layout!r}")
    return wspec, aspec, layout


def _logical_hidden_states(hidden_states: torch.Tensor, h: int, hp: int) -> tuple[torch.Tensor, int]:
    """float32 logical ``[T, h]`` hidden states and the input width (``h`` or ``hp``; pad columns must be zero)."""
    x = hidden_states
    if x.ndim != 2 or x.shape[1] not in (h, hp):
        raise ValueError(f"hidden_states must be [T, {h}] or [T, {hp}], got {tuple(x.shape)}")
    width = x.shape[1]
    if width > h:
        _check_zero(x[:, h:], f"hidden_states columns {h}..{width - 1}")
    return x[:, :h].to(torch.float32), width


def _routing_tensors(topk_ids: torch.Tensor, topk_weights: torch.Tensor, t_count: int,
                     n_exp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``topk_ids`` and float32 ``topk_weights``, checked to be ``[T, k]`` and within the ``n_exp`` experts."""
    ids = topk_ids.to(torch.int64)
    weights = topk_weights.to(torch.float32)
    if ids.shape != weights.shape or ids.ndim != 2 or ids.shape[0] != t_count:
        raise ValueError(f"topk_ids {tuple(ids.shape)} / topk_weights {tuple(weights.shape)} must both be [T, k]")
    if ids.numel() and int(ids.max()) >= n_exp:
        raise ValueError(f"topk_ids has expert {int(ids.max())} but only {n_exp} experts are given")
    return ids, weights


def _routed_slots(ids: torch.Tensor) -> tuple[list[int], dict[int, torch.Tensor]]:
    """The routed experts in ascending id order (ids ``< 0`` are off this rank) and each one's flat slot indices."""
    flat = ids.reshape(-1)
    experts = [int(e) for e in torch.unique(flat[flat >= 0]).tolist()]
    return experts, {e: torch.nonzero(flat == e).reshape(-1) for e in experts}


def _gate_up_proj(src13: _W13, e: int, rows: torch.Tensor,
                  bias13: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` through expert ``e``'s gate and up projections (plus bias), its w13 released right after the GEMMs."""
    gate, up, parts = src13.get(e)
    g = _linear(rows, gate)
    u = _linear(rows, up)
    del gate, up
    src13.drop(e, parts)
    del parts
    if bias13 is not None:
        bg, bu = _bias_halves(bias13[e].to(torch.float32), src13.layout, src13.i, src13.ip)
        g = g + bg
        u = u + bu
    return g, u


def _down_proj(src2: _Source, e: int, a2: torch.Tensor, slots: torch.Tensor, bias2: torch.Tensor | None, *,
               h: int, i: int, hp: int, ip: int) -> torch.Tensor:
    """``a2[slots]`` through expert ``e``'s logical ``[h, i]`` w2 block (zero pads checked) plus bias, w2 released."""
    tracker = src2.tracker
    full = src2.get(e)
    _check_zero(full[h:], f"w2[{e}] hidden rows {h}..{hp - 1}")
    _check_zero(full[:, i:], f"w2[{e}] intermediate columns {i}..{ip - 1}")
    w2e = full[:h, :i]
    if not w2e.is_contiguous():  # padded: copy the logical block, release the padded tensor
        w2e = w2e.contiguous()
        if tracker is not None:
            tracker.acquire("w2:logical-copy", e, w2e.numel() * 4)
        src2.drop(e, full)
        full = None
    y = _linear(a2.index_select(0, slots), w2e)
    if full is not None:
        src2.drop(e, full)
    elif tracker is not None:
        tracker.release("w2:logical-copy", e, w2e.numel() * 4)
    del full, w2e
    if bias2 is not None:
        b2 = bias2[e].to(torch.float32)
        _check_zero(b2[h:], f"bias2[{e}] pad entries")
        y = y + b2[:h]
    return y


def _shared_expert(x, w13, w2, b13, b2, wspec, aspec, activation, activation_params, layout, rounding, tracker):
    """A dense gated MLP on every token (weight 1), with the same schemes; ``[2I_s, H]`` / ``[I_s, H]`` weights."""
    if w2 is None:
        raise ValueError("shared_w13 needs shared_w2")
    w13 = w13 if len(_shape(w13)) == 3 else _unsqueeze(w13)
    w2 = w2 if len(_shape(w2)) == 3 else _unsqueeze(w2)
    h = x.shape[1]
    i_s = _shape(w2)[-1]
    hp = _shape(w2)[-2]
    a1 = qdq_activation(x, aspec, scale_rounding=rounding)
    src13 = _W13(w13, wspec, layout, i_s, i_s, h, hp, rounding, tracker, name="shared_w13")
    gate, up, parts = src13.get(0)
    g, u = _linear(a1, gate), _linear(a1, up)
    src13.drop(0, parts)
    if b13 is not None:
        bg, bu = _bias_halves(b13.reshape(-1).to(torch.float32), layout, i_s, i_s)
        g, u = g + bg, u + bu
    a2 = qdq_activation(apply_activation(g, u, activation, activation_params), aspec, scale_rounding=rounding)
    src2 = _Source(w2, wspec, rounding, tracker, "shared_w2")
    full = src2.get(0)
    y = _linear(a2, full[:h])
    src2.drop(0, full)
    if b2 is not None:
        y = y + b2.reshape(-1)[:h].to(torch.float32)
    return y


def _unsqueeze(w: Any) -> Any:
    if isinstance(w, torch.Tensor):
        return w.unsqueeze(0)
    if isinstance(w, MXTensor):
        return replace(w, shape=(1, *w.shape), codes=w.codes.unsqueeze(0), scales=w.scales.unsqueeze(0),
                       axis=(w.axis % len(w.shape)) + 1)
    if isinstance(w, ScaledTensor):
        return replace(w, data=w.data.unsqueeze(0), scale=w.scale.unsqueeze(0))
    if isinstance(w, GateUp):
        return GateUp(_unsqueeze(w.gate), _unsqueeze(w.up), w.layout)
    raise ValueError(f"cannot use a {type(w).__name__} as a shared-expert weight")
