"""``emulation``: the reference path — dequantize the routed experts, QDQ the activations, run in bf16/fp32.

Correct for every scheme on every machine (it is moedispatch's own torch implementation, also on CPU), and the
slowest: vLLM's emulation cost ~20× decode throughput on gfx942 (vLLM #50817). Preferred least, with a warning.
MX padding to 32 follows vLLM's OCP_MX_BLOCK_SIZE round-up for EMULATION (vllm.md §12.2).
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.backend import Backend, Padding, Verdict
from moedispatch.capabilities import Capabilities
from moedispatch.layers import MoELayer

SLOW_WARNING = ("WARNING: emulation is the slow reference path (weights dequantized on the fly; ~20× slower decode "
                "in vLLM #50817): use it to check correctness, do not serve traffic with it")


class Emulation(Backend):
    name = "emulation"
    preference = 0
    family = "emulation"
    description = "moedispatch reference MoE (torch; QDQ of weights and activations; any device)"

    def check(self, layer: MoELayer, caps: Capabilities) -> Verdict:
        return Verdict.supported(
            f"emulation applies the checkpoint's weight ({layer.weight.describe()}) and activation "
            f"({layer.act.describe()}) quantize-dequantize exactly, on any device",
            SLOW_WARNING,
        )

    def plan_padding(self, layer: MoELayer, caps: Capabilities) -> Padding:
        if layer.weight.is_mx or layer.act.is_mx:
            return Padding.aligned(
                layer, hidden_multiple=32, intermediate_multiple=32,
                notes=("alignment: MX scales cover 32 elements, so hidden and intermediate per rank round up to 32 "
                       "(vLLM OCP_MX_BLOCK_SIZE, oracle/mxfp4.py)",) if layer.hidden % 32 or
                layer.intermediate_per_rank % 32 else ())
        return Padding.none(layer)

    # -- running it (torch, imported lazily) ----------------------------------------------------------------
    def runner(self, layer: MoELayer):
        """An :class:`moedispatch.numerics.runner.EmulationRunner` for this layer (imports torch)."""
        from moedispatch.numerics.runner import EmulationRunner  # noqa: PLC0415 - torch only when running

        return EmulationRunner(layer)


@hookimpl
def register_backends():
    return [Emulation()]
