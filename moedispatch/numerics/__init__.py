"""Numerics (torch, imported lazily; never imported by explain or selection).

This package file imports nothing, so ``import moedispatch.numerics`` costs nothing; torch is imported by the
submodules, which only ``verify``, the emulation runner and tests load:

* :mod:`~moedispatch.numerics.mx` — OCP MX v1.0 quantize/dequantize (MXFP4, MXFP6 E2M3/E3M2, MXFP8 E4M3/E5M2;
  ``floor``/``even``/``ceil``/``rceil`` E8M0 scale rounding; AITER's dynamic MXFP4 quant uses ``even``).
* :mod:`~moedispatch.numerics.fp8` — scaled fp8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), int8 and int4 QDQ per tensor,
  token/channel, group and N×M block.
* :mod:`~moedispatch.numerics.moe` — ``fused_moe``, the reference MoE forward with the checkpoint's QDQ.
* :mod:`~moedispatch.numerics.routing` — softmax / sigmoid+bias / grouped top-k, renormalization, routed scaling.
* :mod:`~moedispatch.numerics.runner` — ``EmulationRunner`` (the ``emulation`` backend) and the runner registry.
* :mod:`~moedispatch.numerics.reference` — an independent float64 MoE used to check ``fused_moe``.
"""

#: The MoE activations ``fused_moe`` implements (here, free of torch: the ``emulation`` backend's check reads it).
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave")
