"""Warm selection speed (not a timed test): ratios against the issue's targets, measured in one run.

    python benchmarks/bench_select.py

* ``select_moe_backend`` per call, cached (target <= 10 us): engine fields → Decision, the same call again.
* ``selector.select_uncached`` per call with the five built-ins (target <= 300 us): no cache at all.
* whole-model plan for a 94-layer model, Qwen3-235B-A22B-Instruct-2507, warm (target <= 20 ms): ``plan_model``.
Each figure is the best of several repeats (the usual timeit practice: the minimum is the least disturbed run).
"""

from __future__ import annotations

import os
import sys
import timeit


def best(stmt, number: int, repeat: int = 7) -> float:
    """Seconds per call: the best of ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def main() -> int:
    from moedispatch.data.capdb import target_capabilities
    from moedispatch.api import plan_model, select_moe_backend
    from moedispatch.core.layers import MoELayer
    from moedispatch.sources.models import load_model
    from moedispatch.selector.plugins import get_registry
    from moedispatch.selector.pure import select_uncached

    caps = target_capabilities("gfx950", "0.1.15.post3")
    backends = get_registry().backends
    fields = dict(hidden_size=6144, intermediate_size=3072, num_experts=128, top_k=4, tp_size=8,
                  weight_quant="mxfp4", activation_quant="mxfp4", activation="swigluoai_uninterleave",
                  model_type="minimax_m3_vl")
    mixtral = dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2, tp_size=8)
    layers = [
        MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="mxfp4",
                       activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0},
                       model_type="minimax_m3_vl"),
        MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=8),
        MoELayer.build(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8"),
    ]
    model = load_model("Qwen3-235B-A22B-Instruct-2507")
    assert len(model.layers) == 94

    select_moe_backend(caps=caps, **fields)
    select_moe_backend(caps=caps, **mixtral)
    cached_fields = best(lambda: select_moe_backend(caps=caps, **fields), 20000)
    cached_layer = best(lambda: select_moe_backend(layers[1], caps), 20000)
    from moedispatch.kit.rules import _planned

    # Truly uncached: the per-backend padding memo is cleared before every call too.
    uncached = {la.weight.dtype: best(lambda la=la: (_planned.cache_clear(), select_uncached(la, caps, backends)),
                                      300) for la in layers}
    plan_model(model, caps)
    plan_warm = best(lambda: plan_model(model, caps), 50)
    plan_tp8 = best(lambda: plan_model(model, caps, 8), 50)

    print(f"selection, best of 7 repeats on {os.cpu_count()} CPUs (python {sys.version.split()[0]})")
    rows = [
        ("select_moe_backend(**fields), cached", cached_fields * 1e6, "us", 10),
        ("select_moe_backend(layer), cached", cached_layer * 1e6, "us", 10),
        *[(f"select_uncached, built-ins, {k} layer", v * 1e6, "us", 300) for k, v in uncached.items()],
        ("plan_model Qwen3-235B (94 layers), warm", plan_warm * 1e3, "ms", 20),
        ("plan_model Qwen3-235B (94 layers) tp8, warm", plan_tp8 * 1e3, "ms", 20),
    ]
    ok = True
    for name, value, unit, target in rows:
        ratio = value / target
        ok &= ratio <= 1
        print(f"  {name:<46} {value:8.2f} {unit}  = {ratio:4.2f}x of target <= {target} {unit}  "
              f"{'OK' if ratio <= 1 else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
