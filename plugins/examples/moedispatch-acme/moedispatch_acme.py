"""``acme-moe``: an example third-party moedispatch backend (a fictional bf16 fused-MoE kernel).

Shipped as its own distribution, ``moedispatch-acme``, registered through the ``moedispatch.backends`` entry point
(see ``pyproject.toml``). It shows the whole plugin API: a :class:`moedispatch.Backend` with ``name``,
``preference``, ``description`` and ``family``; a pure ``check()`` that collects *every* failed rule as a specific
reason; ``plan_padding()`` with an alignment rule; and the ``register_backends`` hook.
"""

from __future__ import annotations

from moedispatch import Backend, Padding, Verdict, hookimpl

__version__ = "0.1.0"

#: Archs the (fictional) kernel is compiled for: CDNA3 (MI300X/MI325X) and CDNA4 (MI350X/MI355X).
ARCHS = ("gfx942", "gfx950")
#: Activation functions the kernel's epilogue implements (gate-and-up, interleaved).
ACTIVATIONS = ("silu", "gelu")
#: The kernel's N tile over the intermediate dimension: the intermediate size per rank is padded to it.
INTERMEDIATE_TILE = 128
#: Hidden sizes must be a multiple of the K tile; the kernel does not pad hidden.
HIDDEN_TILE = 64
#: Largest top_k the routing prologue handles.
MAX_TOP_K = 8


class AcmeMoE(Backend):
    """bf16 × bf16 fused MoE for gfx942/gfx950; wins over the built-ins (preference 90) where it is correct."""

    name = "acme-moe"
    preference = 90
    family = "acme"
    description = "ACME bf16 fused MoE (example plugin; gfx942/gfx950, bf16 weights × bf16 activations)"

    def check(self, layer, caps) -> Verdict:
        failures: list[str] = []
        if caps.gfx not in ARCHS:
            failures.append(f"acme-moe is built for {' and '.join(ARCHS)} only; target is {caps.arch_label}")
        if layer.weight.dtype != "bf16" or layer.act.dtype != "bf16":
            failures.append(
                f"acme-moe runs bf16 weights × bf16 activations only; layer has weights {layer.weight.describe()} "
                f"× activations {layer.act.describe()}"
            )
        if layer.activation not in ACTIVATIONS:
            failures.append(f"acme-moe implements activations {', '.join(ACTIVATIONS)}, not {layer.activation}")
        if layer.has_bias:
            failures.append("acme-moe has no expert-bias epilogue; the layer has expert bias")
        if layer.hidden % HIDDEN_TILE:
            failures.append(f"acme-moe needs hidden size to be a multiple of {HIDDEN_TILE} (its K tile); "
                            f"hidden is {layer.hidden}")
        if layer.top_k > MAX_TOP_K:
            failures.append(f"acme-moe routes at most {MAX_TOP_K} experts per token; top_k is {layer.top_k}")
        if failures:
            return Verdict.unsupported(*failures)
        return Verdict.supported(
            f"acme-moe runs bf16 × bf16 {layer.activation} MoE on {caps.gfx} "
            f"({layer.experts_per_rank} experts per rank, top_k {layer.top_k})"
        )

    def plan_padding(self, layer, caps) -> Padding:
        if layer.intermediate_per_rank % INTERMEDIATE_TILE == 0:
            return Padding.none(layer)
        # Padding.aligned: zero_fill=True and the kernel is told the real pads (it skips the pad granules).
        return Padding.aligned(
            layer,
            intermediate_multiple=INTERMEDIATE_TILE,
            notes=(f"acme-moe pads intermediate per rank to a multiple of {INTERMEDIATE_TILE} (its N tile)",),
        )


@hookimpl
def register_backends():
    return [AcmeMoE()]
