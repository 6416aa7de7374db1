"""``moedispatch verify``: run one layer's plan on random data and check it numerically.

:func:`run_verify` builds a random layer at the layer's per-rank shape (``experts`` of its experts, default
:data:`DEFAULT_EXPERTS`), quantizes it with the checkpoint's scheme (``layer.weight`` for the weights, ``layer.act``
for the activations entering the expert GEMMs) and returns four checks, each ``{"name", "passed", "detail"}``:

``padding_exact``
    The plan's padded weights, read as its ``pad_semantics`` says the kernel reads them
    (:mod:`moedispatch.numerics.padded`), against the unpadded layer through the emulation, bitwise. Pad regions the
    plan does not zero-fill hold garbage (random values and NaN, as ``torch.empty`` may); ``compute`` reads the whole
    padded extent, ``skip`` skips the ``kernel_*_pad`` granules and reads the rest, ``trim`` reads ``shape - pad``.
    A failure names what is wrong (:func:`pad_read_problems`): pads not zero-filled under ``compute``, a kernel pad
    that skips real data, or one too small that leaves garbage pads read under ``skip``/``trim``.
``padding_alignment``
    The allocation against the alignment the plan declares (``hidden_multiple``, ``intermediate_multiple``): a padded
    size that is not a multiple of it, or more than one multiple beyond the minimal round-up (384 padded to 1024 where
    the multiple is 256), fails (:func:`alignment_problems`).
``backend_vs_reference``
    The backend against the reference. For ``emulation`` the unpadded run is compared with an independent float64
    implementation of the same quantized operands (:mod:`moedispatch.numerics.reference`), to float32 tolerance
    (``padding_exact`` ties the padded plan to that run bitwise). For another backend the padded plan runs on it when
    it can run here (a runner is registered and its hardware present) and is compared with the emulation; otherwise
    the check is **skipped**.
``quantization_error``
    Information only (always passes): the relative error of the quantized (QDQ) layer against a float64 layer
    without any quantization, on the same random data.

A skipped check has ``"passed": None`` and a ``detail`` starting with ``"skipped: "`` — the three-valued ``passed``
is the whole representation (no extra key), so JSON consumers see ``true``/``false``/``null``.

Data is fresh every run (an OS-random seed, reported in the details) unless ``seed`` is given. torch is imported
only when :func:`run_verify` runs; :func:`pad_extents`, :func:`pad_read_problems` and :func:`alignment_problems` are
pure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from moedispatch.core.errors import UsageError
from moedispatch.numerics import ACTIVATIONS
from moedispatch.selector import plugins

__all__ = ["run_verify", "pad_extents", "pad_read_problems", "alignment_problems", "DEFAULT_EXPERTS", "CHECK_NAMES",
           "BACKEND_TOLERANCE", "EMULATION_TOLERANCE"]

#: Experts built by default (the per-rank count when smaller): enough for top-k routing to spread, small enough for
#: the MiniMax-M3 TP8 shape to verify on a CPU in seconds.
DEFAULT_EXPERTS = 8
#: Weight elements the default (no ``--experts``) run builds at most.
DEFAULT_ELEMENT_BUDGET = 60_000_000
CHECK_NAMES = ("padding_exact", "padding_alignment", "backend_vs_reference", "quantization_error")
#: float32 vs float64 on the same quantized operands: relative (Frobenius) error bound.
EMULATION_TOLERANCE = 1e-5
#: A GPU kernel (bf16 outputs and intermediates, other summation order) vs the emulation.
BACKEND_TOLERANCE = 2e-2


def _check(name: str, passed: bool | None, detail: str) -> dict:
    return {"name": name, "passed": passed, "detail": detail}


def pad_extents(padding: Any) -> tuple[int, int]:
    """``(hidden, intermediate)`` extents of the padded weights the kernel reads under ``padding.pad_semantics``:
    the padded sizes for ``compute`` (pad arguments ignored), the padded sizes less the kernel pads for ``skip`` and
    ``trim`` (never below 0)."""
    semantics = getattr(padding, "pad_semantics", "compute")
    if semantics == "compute":
        return padding.hidden, padding.intermediate_per_rank
    return (max(padding.hidden - padding.kernel_hidden_pad, 0),
            max(padding.intermediate_per_rank - padding.kernel_intermediate_pad, 0))


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if hi - lo == 1 else f"{lo}..{hi - 1}"


def pad_read_problems(hidden: int, intermediate: int, padding: Any) -> list[str]:
    """What is wrong with the way the kernel reads ``padding`` for a layer of logical ``hidden`` x ``intermediate``
    (per rank), one sentence each; empty when the kernel reads exactly the logical data plus zero-filled pads."""
    semantics = getattr(padding, "pad_semantics", "compute")
    hk, ik = pad_extents(padding)
    hp, ip = padding.hidden, padding.intermediate_per_rank
    problems = []
    if semantics == "compute":
        read = [f"{what} {_span(real, padded)}" for what, real, padded in
                (("hidden", hidden, hp), ("intermediate", intermediate, ip)) if padded > real]
        if read and not padding.zero_fill:
            problems.append(f"pad regions not zero-filled under 'compute': the kernel computes over the whole padded "
                            f"extent, pads ({', '.join(read)}) included, and they hold whatever torch.empty left "
                            f"there (allocate with torch.zeros, or plan zero_fill)")
        return problems
    for field, what, real, padded, extent, pad in (
            ("kernel_hidden_pad", "hidden", hidden, hp, hk, padding.kernel_hidden_pad),
            ("kernel_intermediate_pad", "intermediate", intermediate, ip, ik, padding.kernel_intermediate_pad)):
        allocated = padded - real
        if extent < real:
            problems.append(f"{field} {pad} skips real {what} columns {_span(extent, real)} under '{semantics}' (the "
                            f"allocated {what} pad is {allocated}; a kernel pad must not exceed it)")
        elif extent > real and not padding.zero_fill:
            problems.append(f"{field} {pad} leaves {what} pad columns {_span(real, extent)} read under "
                            f"'{semantics}' (the allocated {what} pad is {allocated}) and the plan does not "
                            f"zero-fill them")
    return problems


def alignment_problems(hidden: int, intermediate: int, padding: Any) -> tuple[list[str], str]:
    """``(problems, summary)`` of the allocation against the plan's declared ``hidden_multiple`` /
    ``intermediate_multiple``: a padded size that is not a multiple of its alignment, or that lies more than one
    multiple beyond the minimal round-up, is a problem."""
    problems, parts = [], []
    for field, what, real, padded in (("hidden_multiple", "hidden", hidden, padding.hidden),
                                      ("intermediate_multiple", "intermediate/rank", intermediate,
                                       padding.intermediate_per_rank)):
        multiple = max(int(getattr(padding, field, 1) or 1), 1)
        minimal = -(-real // multiple) * multiple
        parts.append(f"{what} {real}->{padded} ({field} {multiple}, minimal round-up {minimal})")
        if padded == real:
            continue
        if padded % multiple:
            problems.append(f"{what} padded {real}->{padded}, not a multiple of the declared {field} {multiple}")
        elif padded - minimal > multiple:
            problems.append(f"{what} padded {real}->{padded}: {padded - minimal} beyond the minimal round-up {minimal} "
                            f"to the declared {field} {multiple}, more than one multiple (the extra pad costs "
                            f"memory and bandwidth; declare the alignment the kernel needs)")
    return problems, "; ".join(parts)


def run_verify(layer: Any, padding: Any, *, backend: str, experts: int | None = None, tokens: int = 8,
               seed: int | None = None, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Verify ``layer`` under ``padding`` for ``backend``; see the module docstring. Returns the checks in order."""
    say = progress or (lambda _msg: None)
    if getattr(layer, "kind", "moe") != "moe":
        return [_check(n, None, f"skipped: layer {layer.index} is a dense MLP; verify checks routed-expert layers")
                for n in CHECK_NAMES]
    if layer.activation not in ACTIVATIONS:
        raise UsageError(f"layer {layer.index} cannot be verified: its activation {layer.activation} is not one "
                         f"moedispatch.numerics implements ({', '.join(ACTIVATIONS)})")
    n_exp, top_k = _verify_sizes(layer, padding, experts, tokens)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")

    from moedispatch.numerics.moe import activation_layout
    from moedispatch.numerics.runner import EmulationRunner

    h, i = layer.hidden, layer.intermediate_per_rank
    layout = activation_layout(layer.activation)
    shape_txt = (f"{tokens} tokens, {n_exp} of {layer.experts_per_rank} experts (top-{top_k}), hidden {h}, "
                 f"intermediate/rank {i}")
    t0 = time.perf_counter()
    say(f"verify layer {layer.index}: random data, seed {seed}: {shape_txt}"
        + (f", padded to {padding.hidden}x{padding.intermediate_per_rank}" if padding.padded else ""))
    raw, x, routing = _random_data(layer, n_exp, top_k, tokens, seed)
    padded, xp = _padded_data(raw, x, layout, padding)

    say(f"verify layer {layer.index}: quantizing weights ({layer.weight.describe()}), unpadded and padded")
    q, qp = _quantized(raw, layer.weight, layout), _quantized(padded, layer.weight, layout)

    say(f"verify layer {layer.index}: emulation of the unpadded layer (activations {layer.act.describe()})")
    unpadded = EmulationRunner(layer).prepare(q.runner_weights(), None)
    inter: dict = {}
    out_u = unpadded.run(x, *routing, intermediates=inter)

    # (a) the padded plan as the kernel reads it vs the unpadded layer, bitwise; (b) the allocation's alignment
    out_k = _padded_kernel_output(layer, padding, qp, xp, routing, layout, seed, say)
    checks = [_padding_exact_check(layer, padding, out_k, out_u, shape_txt, seed), _alignment_check(layer, padding)]

    # (c) the backend vs the reference: the reference path is whichever backend declares the emulation family
    if getattr(plugins.get_registry().get(backend), "family", None) == "emulation":
        checks.append(_emulation_vs_reference_check(layer, q, routing, out_u, inter, layout, say))
    else:
        checks.append(_backend_vs_emulation_check(layer, backend, padding, qp, xp, routing, out_u, say))

    # (d) quantization error, information
    checks.append(_quantization_error_check(layer, raw, x, routing, out_u, layout, t0, say))
    return checks


@dataclass(frozen=True)
class _Weights:
    """One set of expert weights for verify: gate-up ``w13``, down ``w2`` (float or quantized) and the biases."""

    w13: Any
    w2: Any
    b13: Any = None
    b2: Any = None

    def runner_weights(self) -> dict:
        """The weights as :meth:`moedispatch.numerics.runner.EmulationRunner.prepare` and other runners take them."""
        return {"w13": self.w13, "w2": self.w2, "bias13": self.b13, "bias2": self.b2}


def _verify_sizes(layer: Any, padding: Any, experts: int | None, tokens: int) -> tuple[int, int]:
    """Check the arguments against the layer; return the ``(experts, top_k)`` to build (default: within budget)."""
    h, i = layer.hidden, layer.intermediate_per_rank
    if padding.hidden - padding.hidden_pad != h or padding.intermediate_per_rank - padding.intermediate_pad != i:
        raise UsageError(f"padding {padding.hidden}x{padding.intermediate_per_rank} (pads {padding.hidden_pad}, "
                         f"{padding.intermediate_pad}) does not belong to a layer of hidden {h}, intermediate "
                         f"per rank {i}")
    if tokens < 1:
        raise UsageError(f"tokens must be at least 1, got {tokens}")
    if experts is None:
        # Keep the default run well under a minute on a 2-core CPU: at most ~60 M weight elements (4 experts of
        # MiniMax-M3 at TP1, 6 at TP8 padded to 512), never fewer experts than top-k routes to.
        per_expert = 3 * max(padding.hidden, h) * max(padding.intermediate_per_rank, i)
        experts = max(layer.top_k, min(DEFAULT_EXPERTS, DEFAULT_ELEMENT_BUDGET // max(per_expert, 1)))
    n_exp = min(experts, layer.experts_per_rank)
    if n_exp < 1:
        raise UsageError(f"experts must be at least 1, got {experts}")
    if n_exp < min(layer.top_k, layer.experts_per_rank):  # fewer would route top-n_exp: not the layer's routing
        raise UsageError(f"experts {experts} is fewer than the top-{layer.top_k} routing of layer {layer.index}; "
                         f"build at least {min(layer.top_k, layer.experts_per_rank)}")
    return n_exp, min(layer.top_k, n_exp)


def _random_data(layer: Any, n_exp: int, top_k: int, tokens: int, seed: int) -> tuple[_Weights, Any, tuple]:
    """Random float weights (and biases), hidden states and softmax top-k ``(weights, ids)`` routing from ``seed``."""
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    from moedispatch.numerics.routing import softmax_topk

    h, i = layer.hidden, layer.intermediate_per_rank
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(n_exp, 2 * i, h, generator=gen) * (2.0 / h ** 0.5)
    w2 = torch.randn(n_exp, h, i, generator=gen) * (1.0 / i ** 0.5)
    b13 = torch.randn(n_exp, 2 * i, generator=gen) * 0.1 if layer.has_bias else None
    b2 = torch.randn(n_exp, h, generator=gen) * 0.1 if layer.has_bias else None
    x = torch.randn(tokens, h, generator=gen)
    logits = torch.randn(tokens, n_exp, generator=gen)
    topk_weights, topk_ids = softmax_topk(logits, top_k)
    return _Weights(w13, w2, b13, b2), x, (topk_weights, topk_ids)


def _padded_data(raw: _Weights, x: Any, layout: str, padding: Any) -> tuple[_Weights, Any]:
    """The layer and hidden states copied into the padded allocation with zero pads, as a loader fills one."""
    # each gate/up half padded at its end (or pad rows at the end, interleaved); the layer is quantized at that size
    # later, and pads the plan does not zero-fill get garbage in _padded_kernel_output
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    n_exp, tokens, h, i = raw.w13.shape[0], x.shape[0], x.shape[1], raw.w2.shape[2]
    hp, ip = padding.hidden, padding.intermediate_per_rank
    w13p = torch.zeros(n_exp, 2 * ip, hp)
    if layout == "interleaved":
        w13p[:, :2 * i, :h] = raw.w13
    else:
        w13p[:, :i, :h] = raw.w13[:, :i]
        w13p[:, ip:ip + i, :h] = raw.w13[:, i:]
    w2p = torch.zeros(n_exp, hp, ip)
    w2p[:, :h, :i] = raw.w2
    xp = torch.zeros(tokens, hp)  # hidden-state pads are zeros: engines pad activations with F.pad
    xp[:, :h] = x
    b13p = b2p = None
    if raw.b13 is not None:
        b13p = torch.zeros(n_exp, 2 * ip)
        if layout == "interleaved":
            b13p[:, :2 * i] = raw.b13
        else:
            b13p[:, :i], b13p[:, ip:ip + i] = raw.b13[:, :i], raw.b13[:, i:]
        b2p = torch.zeros(n_exp, hp)
        b2p[:, :h] = raw.b2
    return _Weights(w13p, w2p, b13p, b2p), xp


def _quantized(weights: _Weights, scheme: Any, layout: str) -> _Weights:
    """``weights`` quantized with the checkpoint's weight ``scheme`` (gate and up separately); biases unchanged."""
    from moedispatch.numerics.moe import quantize_w13, quantize_weight

    return _Weights(quantize_w13(weights.w13, scheme, layout=layout), quantize_weight(weights.w2, scheme),
                    weights.b13, weights.b2)


def _padded_biases(qp: _Weights, layout: str, ip: int) -> tuple[Any, Any, Any]:
    """Contiguous ``(bias_gate, bias_up, bias2)`` copies of the padded biases, or three ``None`` without biases."""
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    if qp.b13 is None:
        return None, None, None
    halves = (qp.b13[:, 0::2], qp.b13[:, 1::2]) if layout == "interleaved" else (qp.b13[:, :ip], qp.b13[:, ip:])
    bias_gate, bias_up = (t.clone(memory_format=torch.contiguous_format) for t in halves)
    return bias_gate, bias_up, qp.b2.clone()


def _padded_kernel_output(layer: Any, padding: Any, qp: _Weights, xp: Any, routing: tuple, layout: str, seed: int,
                          say: Callable[[str], None]) -> Any:
    """The padded plan's output read as its ``pad_semantics`` says, with garbage in the pads it does not zero-fill."""
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    from moedispatch.numerics.moe import dequantize_weight
    from moedispatch.numerics.padded import fill_pad_garbage_, padded_kernel_moe, split_gate_up

    h, i = layer.hidden, layer.intermediate_per_rank
    hp, ip = padding.hidden, padding.intermediate_per_rank
    semantics = getattr(padding, "pad_semantics", "compute")
    hk, ik = pad_extents(padding)
    say(f"verify layer {layer.index}: padded plan read as '{semantics}' (hidden 0..{hk - 1}, intermediate "
        f"0..{ik - 1} of {hp}x{ip})")
    gate_p, up_p = split_gate_up(qp.w13, layout)
    w2f = dequantize_weight(qp.w2).clone()
    bias_gate, bias_up, bias2 = _padded_biases(qp, layout, ip)
    if padding.padded and not padding.zero_fill:
        fill_pad_garbage_(gate_p, up_p, w2f, hidden=h, intermediate=i, gen=torch.Generator().manual_seed(seed + 1),
                          bias_gate=bias_gate, bias_up=bias_up, bias2=bias2)
    topk_weights, topk_ids = routing
    return padded_kernel_moe(xp, gate_p, up_p, w2f, topk_weights, topk_ids, hidden=h, intermediate=i,
                             hidden_extent=hk, intermediate_extent=ik, activation_scheme=layer.act,
                             activation=layer.activation, activation_params=layer.activation_params,
                             bias_gate=bias_gate, bias_up=bias_up, bias2=bias2)


def _pad_read_text(layer: Any, padding: Any) -> str:
    """How the padded plan is allocated and read, the opening of the ``padding_exact`` detail."""
    h, i = layer.hidden, layer.intermediate_per_rank
    hp, ip = padding.hidden, padding.intermediate_per_rank
    semantics = getattr(padding, "pad_semantics", "compute")
    hk, ik = pad_extents(padding)
    if semantics == "compute":
        reads = f"'compute': the kernel computes over the whole padded extent {hp}x{ip}"
    else:
        reads = (f"'{semantics}': kernel pads hidden {padding.kernel_hidden_pad}, intermediate "
                 f"{padding.kernel_intermediate_pad}, so the kernel reads hidden {hk}, intermediate {ik} of {hp}x{ip}")
    fill_txt = ("pads zero-filled" if padding.zero_fill or not padding.padded
                else "pads not zero-filled, so they hold garbage (random values and NaN) here")
    return (f"padded plan (hidden {h}->{hp}, intermediate/rank {i}->{ip}; {fill_txt}) read as {reads}"
            if padding.padded else f"plan has no padding (allocated and original sizes agree) read as {reads}")


def _padding_exact_check(layer: Any, padding: Any, out_k: Any, out_u: Any, shape_txt: str, seed: int) -> dict:
    """The ``padding_exact`` check: the padded plan's output ``out_k`` against the unpadded ``out_u``, bitwise."""
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    from moedispatch.numerics.reference import rel_err

    pad_txt = _pad_read_text(layer, padding)
    problems = pad_read_problems(layer.hidden, layer.intermediate_per_rank, padding)
    same = bool(torch.equal(out_k, out_u))
    if same and not problems:
        return _check("padding_exact", True, f"{pad_txt}: agrees bitwise with the unpadded layer through the "
                                             f"emulation on {shape_txt}; seed {seed}")
    diff = (out_k - out_u).abs()
    if same:
        numeric = "the random data happened to hide it this time (outputs agree bitwise)"
    elif bool(torch.isnan(out_k).any()):
        numeric = f"the output differs from the unpadded layer: NaN in {int(torch.isnan(out_k).sum())} values"
    else:
        numeric = (f"the output differs from the unpadded layer: max |diff| {float(diff.max()):.3e}, relative "
                   f"error {rel_err(out_k, out_u):.2e}")
    what = "; ".join(problems) if problems else "the padded plan does not reproduce the unpadded layer"
    return _check("padding_exact", False, f"{what}. {pad_txt}; {numeric}; seed {seed}")


def _alignment_check(layer: Any, padding: Any) -> dict:
    """The ``padding_alignment`` check: the allocation against the alignment the plan declares."""
    misaligned, summary = alignment_problems(layer.hidden, layer.intermediate_per_rank, padding)
    return _check("padding_alignment", not misaligned,
                  "; ".join(misaligned) if misaligned else f"{summary}: within one multiple of the minimal round-up")


def _emulation_vs_reference_check(layer: Any, q: _Weights, routing: tuple, out_u: Any, inter: dict, layout: str,
                                  say: Callable[[str], None]) -> dict:
    """``backend_vs_reference`` for the emulation: the unpadded run against a float64 MoE of the same operands."""
    from moedispatch.numerics.moe import dequantize_weight
    from moedispatch.numerics.reference import staged_compare

    say(f"verify layer {layer.index}: float64 reference of the same quantized operands")
    d13, d2 = dequantize_weight(q.w13), dequantize_weight(q.w2)
    topk_weights, topk_ids = routing
    res = staged_compare(out_u, inter, d13, d2, topk_weights, topk_ids, activation=layer.activation,
                         activation_params=layer.activation_params, layout=layout, bias13=q.b13, bias2=q.b2,
                         activation_scheme=layer.act)
    del d13, d2
    ok = res["a2_exact"] and res["h_err"] <= EMULATION_TOLERANCE and res["out_err"] <= EMULATION_TOLERANCE
    return _check(
        "backend_vs_reference", ok,
        f"emulation vs an independent float64 MoE on the same quantized operands: relative error "
        f"{res['out_err']:.2e} at the output, {res['h_err']:.2e} after the activation (tolerance "
        f"{EMULATION_TOLERANCE:.0e}); intermediate activation QDQ "
        + ("reproduced exactly" if res["a2_exact"] else "NOT reproduced"))


def _backend_vs_emulation_check(layer: Any, backend: str, padding: Any, qp: _Weights, xp: Any, routing: tuple,
                                out_u: Any, say: Callable[[str], None]) -> dict:
    """``backend_vs_reference`` for another backend: its padded plan against the emulation, or skipped here."""
    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    from moedispatch.numerics.reference import rel_err
    from moedispatch.numerics.runner import RunnerUnavailable, get_runner

    try:
        runner = get_runner(backend, layer)
    except RunnerUnavailable as exc:
        return _check("backend_vs_reference", None,
                      f"skipped: {backend} cannot run here: {exc}. The emulation results above are the "
                      f"reference it would be compared with (tolerance {BACKEND_TOLERANCE:.0e})")
    say(f"verify layer {layer.index}: running {backend}")
    runner.prepare(qp.runner_weights(), padding)
    topk_weights, topk_ids = routing
    got = runner.run(xp, topk_weights, topk_ids)
    err = rel_err(got.detach().to("cpu", torch.float32)[:, :layer.hidden], out_u)
    return _check("backend_vs_reference", err <= BACKEND_TOLERANCE,
                  f"{backend} vs emulation on the padded plan: relative error {err:.2e} "
                  f"(tolerance {BACKEND_TOLERANCE:.0e})")


def _quantization_error_check(layer: Any, raw: _Weights, x: Any, routing: tuple, out_u: Any, layout: str,
                              t0: float, say: Callable[[str], None]) -> dict:
    """The ``quantization_error`` check (information): the quantized layer against float64 without quantization."""
    from moedispatch.numerics.reference import reference_moe, rel_err

    say(f"verify layer {layer.index}: float64 unquantized reference")
    topk_weights, topk_ids = routing
    ref, _ = reference_moe(x, raw.w13, raw.w2, topk_weights, topk_ids, activation=layer.activation,
                           activation_params=layer.activation_params, layout=layout, bias13=raw.b13, bias2=raw.b2)
    qerr = rel_err(out_u, ref)
    return _check("quantization_error", True,
                  f"weights {layer.weight.describe()}, activations {layer.act.describe()}: relative error "
                  f"{qerr:.3e} of the quantized layer vs float64 without quantization (information; "
                  f"{time.perf_counter() - t0:.1f} s in all)")
