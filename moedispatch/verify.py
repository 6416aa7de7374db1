"""``moedispatch verify``: run one layer's plan on random data and check it numerically.

:func:`run_verify` builds a random layer at the layer's per-rank shape (``experts`` of its experts, default
:data:`DEFAULT_EXPERTS`), quantizes it with the checkpoint's scheme (``layer.weight`` for the weights, ``layer.act``
for the activations entering the expert GEMMs) and returns three checks, each ``{"name", "passed", "detail"}``:

``padding_exact``
    The padded plan (weights allocated at ``padding``'s sizes, pad regions zero-filled, quantized at that size) and
    the unpadded layer, both through the emulation, must agree bitwise.
``backend_vs_reference``
    The selected backend against the reference. For ``emulation`` the padded-plan run is compared with an
    independent float64 implementation of the same quantized operands (:mod:`moedispatch.numerics.reference`),
    to float32 tolerance. For another backend the padded plan runs on it when it can run here (a runner is
    registered and its hardware present) and is compared with the emulation; otherwise the check is **skipped**.
``quantization_error``
    Information only (always passes): the relative error of the quantized (QDQ) layer against a float64 layer
    without any quantization, on the same random data.

A skipped check has ``"passed": None`` and a ``detail`` starting with ``"skipped: "`` — the three-valued ``passed``
is the whole representation (no extra key), so JSON consumers see ``true``/``false``/``null``.

Data is fresh every run (an OS-random seed, reported in the details) unless ``seed`` is given. torch is imported
only when :func:`run_verify` runs.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from moedispatch.errors import UsageError

__all__ = ["run_verify", "DEFAULT_EXPERTS", "CHECK_NAMES", "BACKEND_TOLERANCE", "EMULATION_TOLERANCE"]

#: Experts built by default (the per-rank count when smaller): enough for top-k routing to spread, small enough for
#: the MiniMax-M3 TP8 shape to verify on a CPU in seconds.
DEFAULT_EXPERTS = 8
#: Weight elements the default (no ``--experts``) run builds at most.
DEFAULT_ELEMENT_BUDGET = 60_000_000
CHECK_NAMES = ("padding_exact", "backend_vs_reference", "quantization_error")
#: float32 vs float64 on the same quantized operands: relative (Frobenius) error bound.
EMULATION_TOLERANCE = 1e-5
#: A GPU kernel (bf16 outputs and intermediates, other summation order) vs the emulation.
BACKEND_TOLERANCE = 2e-2


def _check(name: str, passed: bool | None, detail: str) -> dict:
    return {"name": name, "passed": passed, "detail": detail}


def run_verify(layer: Any, padding: Any, *, backend: str, experts: int | None = None, tokens: int = 8,
               seed: int | None = None, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Verify ``layer`` under ``padding`` for ``backend``; see the module docstring. Returns the checks in order."""
    say = progress or (lambda _msg: None)
    if getattr(layer, "kind", "moe") != "moe":
        return [_check(n, None, f"skipped: layer {layer.index} is a dense MLP; verify checks routed-expert layers")
                for n in CHECK_NAMES]
    h, i = layer.hidden, layer.intermediate_per_rank
    if padding.hidden - padding.hidden_pad != h or padding.intermediate_per_rank - padding.intermediate_pad != i:
        raise UsageError(f"padding {padding.hidden}x{padding.intermediate_per_rank} (pads {padding.hidden_pad}, "
                         f"{padding.intermediate_pad}) does not belong to a layer of hidden {h}, intermediate "
                         f"per rank {i}")
    if tokens < 1:
        raise UsageError(f"tokens must be at least 1, got {tokens}")
    if experts is None:
        # Keep the default run well under a minute on a 2-core CPU: at most ~60 M weight elements (4 experts of
        # MiniMax-M3 at TP1, 8 at TP8), never fewer experts than top-k routes to.
        per_expert = 3 * layer.hidden * max(padding.intermediate_per_rank, layer.intermediate_per_rank)
        experts = max(layer.top_k, min(DEFAULT_EXPERTS, DEFAULT_ELEMENT_BUDGET // max(per_expert, 1)))
    n_exp = min(experts, layer.experts_per_rank)
    if n_exp < 1:
        raise UsageError(f"experts must be at least 1, got {experts}")
    top_k = min(layer.top_k, n_exp)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")

    import torch  # noqa: PLC0415 - verify is the only command that needs torch

    from moedispatch.numerics.moe import activation_layout, dequantize_weight, quantize_w13, quantize_weight
    from moedispatch.numerics.reference import reference_moe, rel_err, staged_compare
    from moedispatch.numerics.routing import softmax_topk
    from moedispatch.numerics.runner import EmulationRunner, RunnerUnavailable, get_runner

    hp, ip = padding.hidden, padding.intermediate_per_rank
    layout = activation_layout(layer.activation)
    wdesc, adesc = layer.weight.describe(), layer.act.describe()
    shape_txt = (f"{tokens} tokens, {n_exp} of {layer.experts_per_rank} experts (top-{top_k}), hidden {h}, "
                 f"intermediate/rank {i}")
    t0 = time.perf_counter()
    say(f"verify layer {layer.index}: random data, seed {seed}: {shape_txt}"
        + (f", padded to {hp}x{ip}" if padding.padded else ""))

    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(n_exp, 2 * i, h, generator=gen) * (2.0 / h ** 0.5)
    w2 = torch.randn(n_exp, h, i, generator=gen) * (1.0 / i ** 0.5)
    b13 = torch.randn(n_exp, 2 * i, generator=gen) * 0.1 if layer.has_bias else None
    b2 = torch.randn(n_exp, h, generator=gen) * 0.1 if layer.has_bias else None
    x = torch.randn(tokens, h, generator=gen)
    logits = torch.randn(tokens, n_exp, generator=gen)
    topk_weights, topk_ids = softmax_topk(logits, top_k)

    # Padded allocation, zero-filled, each gate/up half padded at its end (or pad rows at the end, interleaved).
    w13p = torch.zeros(n_exp, 2 * ip, hp)
    if layout == "interleaved":
        w13p[:, :2 * i, :h] = w13
    else:
        w13p[:, :i, :h] = w13[:, :i]
        w13p[:, ip:ip + i, :h] = w13[:, i:]
    w2p = torch.zeros(n_exp, hp, ip)
    w2p[:, :h, :i] = w2
    xp = torch.zeros(tokens, hp)
    xp[:, :h] = x
    b13p = b2p = None
    if b13 is not None:
        b13p = torch.zeros(n_exp, 2 * ip)
        if layout == "interleaved":
            b13p[:, :2 * i] = b13
        else:
            b13p[:, :i], b13p[:, ip:ip + i] = b13[:, :i], b13[:, i:]
        b2p = torch.zeros(n_exp, hp)
        b2p[:, :h] = b2

    say(f"verify layer {layer.index}: quantizing weights ({wdesc}), unpadded and padded")
    q13, q2 = quantize_w13(w13, layer.weight, layout=layout), quantize_weight(w2, layer.weight)
    q13p, q2p = quantize_w13(w13p, layer.weight, layout=layout), quantize_weight(w2p, layer.weight)

    say(f"verify layer {layer.index}: emulation, unpadded and padded plan (activations {adesc})")
    unpadded = EmulationRunner(layer).prepare({"w13": q13, "w2": q2, "bias13": b13, "bias2": b2}, None)
    out_u = unpadded.run(x, topk_weights, topk_ids)
    padded = EmulationRunner(layer).prepare({"w13": q13p, "w2": q2p, "bias13": b13p, "bias2": b2p}, padding)
    inter: dict = {}
    out_p = padded.run(xp, topk_weights, topk_ids, intermediates=inter)
    checks = []

    # (a) padded vs unpadded, bitwise
    pad_txt = (f"padded plan (hidden {h}->{hp}, intermediate/rank {i}->{ip}, zero-filled)" if padding.padded
               else "plan has no padding; allocated and original sizes agree")
    same = bool(torch.equal(out_p[:, :h], out_u))
    pad_cols_zero = bool((out_p[:, h:] == 0).all()) if hp > h else True
    if same and pad_cols_zero:
        checks.append(_check("padding_exact", True, f"{pad_txt} and unpadded layer agree bitwise through the "
                                                    f"emulation on {shape_txt}; seed {seed}"))
    else:
        diff = float((out_p[:, :h] - out_u).abs().max())
        checks.append(_check("padding_exact", False,
                             f"{pad_txt} differs from the unpadded layer: max |diff| {diff:.3e}"
                             + ("" if pad_cols_zero else "; output pad columns are not zero") + f"; seed {seed}"))

    # (b) selected backend vs reference
    if backend == "emulation":
        say(f"verify layer {layer.index}: float64 reference of the same quantized operands")
        d13 = dequantize_weight(q13p)
        if layout == "interleaved":
            d13 = d13[:, :2 * i, :h]
        else:
            d13 = torch.cat([d13[:, :i, :h], d13[:, ip:ip + i, :h]], dim=1)
        d2 = dequantize_weight(q2p)[:, :h, :i]
        res = staged_compare(out_p, inter, d13, d2, topk_weights, topk_ids, activation=layer.activation,
                             activation_params=layer.activation_params, layout=layout, bias13=b13, bias2=b2,
                             activation_scheme=layer.act)
        del d13, d2
        ok = res["a2_exact"] and res["h_err"] <= EMULATION_TOLERANCE and res["out_err"] <= EMULATION_TOLERANCE
        checks.append(_check(
            "backend_vs_reference", ok,
            f"emulation (padded plan) vs an independent float64 MoE on the same quantized operands: relative error "
            f"{res['out_err']:.2e} at the output, {res['h_err']:.2e} after the activation (tolerance "
            f"{EMULATION_TOLERANCE:.0e}); intermediate activation QDQ "
            + ("reproduced exactly" if res["a2_exact"] else "NOT reproduced")))
    else:
        try:
            runner = get_runner(backend, layer)
        except RunnerUnavailable as exc:
            checks.append(_check("backend_vs_reference", None,
                                 f"skipped: {backend} cannot run here: {exc}. The emulation results above are the "
                                 f"reference it would be compared with (tolerance {BACKEND_TOLERANCE:.0e})"))
        else:
            say(f"verify layer {layer.index}: running {backend}")
            runner.prepare({"w13": q13p, "w2": q2p, "bias13": b13p, "bias2": b2p}, padding)
            got = runner.run(xp, topk_weights, topk_ids)
            err = rel_err(got.detach().to("cpu", torch.float32)[:, :h], out_p[:, :h])
            checks.append(_check("backend_vs_reference", err <= BACKEND_TOLERANCE,
                                 f"{backend} vs emulation on the padded plan: relative error {err:.2e} "
                                 f"(tolerance {BACKEND_TOLERANCE:.0e})"))

    # (c) quantization error, information
    say(f"verify layer {layer.index}: float64 unquantized reference")
    ref, _ = reference_moe(x, w13, w2, topk_weights, topk_ids, activation=layer.activation,
                           activation_params=layer.activation_params, layout=layout, bias13=b13, bias2=b2)
    qerr = rel_err(out_u, ref)
    checks.append(_check("quantization_error", True,
                         f"weights {wdesc}, activations {adesc}: relative error {qerr:.3e} of the quantized layer vs "
                         f"float64 without quantization (information; {time.perf_counter() - t0:.1f} s in all)"))
    return checks
