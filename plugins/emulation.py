"""``emulation``: the reference path — dequantize the routed experts, QDQ the activations, run in bf16/fp32.

Correct for every scheme on every machine (it is moedispatch's own torch implementation, also on CPU), and the
slowest: vLLM's emulation cost ~20× decode throughput on gfx942 (vLLM #50817). Preferred least, with a warning.
MX padding to 32 follows vLLM's OCP_MX_BLOCK_SIZE round-up for EMULATION (fused_moe/oracle/mxfp4.py).
"""

from __future__ import annotations

from moedispatch import hookimpl
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.numerics import ACTIVATIONS

_MXFP4_ORACLE = "vllm-project/vllm@017e9f4448:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
#: Activations an engine's emulation path computes that moedispatch.numerics does not, with the evidence.
_ENGINE_ONLY = {"situv2": "https://github.com/vllm-project/vllm/pull/50817"}

SLOW_WARNING = Reason("emulation is the slow reference path (weights dequantized on the fly; ~20× slower decode): "
                      "use it to check correctness, do not serve traffic with it", "warning",
                      "https://github.com/vllm-project/vllm/issues/50817")


class Emulation(Backend):
    name = "emulation"
    preference = 0
    family = "emulation"
    reference_only = True
    description = "moedispatch reference MoE (torch; QDQ of weights and activations; any device)"

    def check(self, layer: MoELayer, caps: Capabilities) -> Verdict:
        if layer.activation in _ENGINE_ONLY:
            # the engine's dequantize-to-BF16 emulation computes it (a field report: correct output), though
            # moedispatch.numerics does not (verify cannot check it)
            return Verdict.supported(Reason(
                f"emulation: the engine's dequantize-to-BF16 MoE path runs activation {layer.activation} correctly "
                f"(Kimi-K3 on MI325X, 4.27 tok/s decode); moedispatch.numerics does not implement it, so verify "
                f"cannot check this layer", "supports", _ENGINE_ONLY[layer.activation]), SLOW_WARNING)
        if layer.activation not in ACTIVATIONS:  # a name no engine or moedispatch computes (a typo: "slu")
            return Verdict.unsupported(Reason(
                f"activation {layer.activation} not supported (supports "
                f"{', '.join(sorted((*ACTIVATIONS, *_ENGINE_ONLY)))}): no emulation computes it", "failed"))
        return Verdict.supported(
            f"emulation applies the checkpoint's weight ({layer.weight.describe()}) and activation "
            f"({layer.act.describe()}) quantize-dequantize exactly, on any device (moedispatch.numerics)",
            SLOW_WARNING,
        )

    def plan_padding(self, layer: MoELayer, caps: Capabilities) -> Padding:
        if layer.weight.is_mx or layer.act.is_mx:
            return Padding.aligned(
                layer, hidden_multiple=32, intermediate_multiple=32,
                notes=(Reason("alignment: MX scales cover 32 elements, so hidden and intermediate per rank round up "
                              "to 32 (vLLM's OCP_MX_BLOCK_SIZE round-up for EMULATION)", "padding", _MXFP4_ORACLE),)
                if layer.hidden % 32 or
                layer.intermediate_per_rank % 32 else (), pad_semantics="trim")
        return Padding.none(layer)

    # -- running it (torch, imported lazily) ----------------------------------------------------------------
    def runner(self, layer: MoELayer):
        """An :class:`moedispatch.numerics.runner.EmulationRunner` for this layer (imports torch)."""
        from moedispatch.data import capdb
        from moedispatch.numerics.runner import EmulationRunner  # noqa: PLC0415 - torch only when running

        # MX activation scales are rounded as AITER's dynamic_mxfp4_quant rounds them (aiter.toml, with its source).
        rounding = capdb.load_toml("aiter.toml")["numerics"]["mxfp4_dynamic_scale"]["rounding"]
        return EmulationRunner(layer, scale_rounding=rounding)


@hookimpl
def register_backends():
    return [Emulation()]
