"""Ask the real SGLang 0.5.23 what it does for a list of MoE layers, as far as its functions run on a CPU.

Runs ONLY inside .peers-venv: ``python tests/peers/sglang_side.py < cases.json > answers.json``. Each case:
``scheme`` (bf16 | fp8 | mxfp4_w4a4), ``gfx``, ``activation``, ``i`` (intermediate per rank). With
``SGLANG_USE_AITER=1`` semantics it returns what SGLang's own code computes: the unquantized AITER CK gate
(``UnquantizedFusedMoEMethod._aiter_ck_moe_unsupported_reason``: AITER runner or the Triton fallback) and the
intermediate/rank SGLang allocates (``sglang.srt.layers.moe.utils.get_moe_weight_sizes``, as fp8.py and
quark_w4a4_mxfp4_moe.py call it). The gfx95 probe (``is_gfx95_supported``) is the one function patched.
"""

from __future__ import annotations

import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    cases = json.load(sys.stdin)
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    # transformers must decide "no torchvision" before the stand-in is importable (its image utils would use it).
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available()
    sys.path.insert(0, os.path.join(HERE, "stubs_sglang"))
    import sglang.srt.layers.quantization.unquant as uq
    from sglang.srt.layers.moe import utils as mu

    out = []
    for case in cases:
        i, act, gfx = int(case["i"]), case["activation"], case["gfx"]
        swiglu = act.startswith("swigluoai")
        if case["scheme"] == "bf16":
            uq.is_gfx95_supported = lambda gfx=gfx: gfx == "gfx950"
            layer = types.SimpleNamespace(intermediate_size_per_partition=i, moe_runner_config=types.SimpleNamespace(
                activation="swiglu" if swiglu else act, gemm1_alpha=1.702 if swiglu else None,
                gemm1_clamp_limit=7.0 if swiglu else None))
            reason = uq.UnquantizedFusedMoEMethod._aiter_ck_moe_unsupported_reason(None, layer)
            out.append({"backend": "AITER" if reason is None else "TRITON", "intermediate_per_rank": i,
                        "reason": reason})
        elif case["scheme"] == "fp8":
            _, w2_down, _ = mu.get_moe_weight_sizes(i, is_concat=True, is_packed=False, is_aiter_moe=True)
            out.append({"backend": "AITER", "intermediate_per_rank": w2_down, "reason": None})
        elif case["scheme"] == "mxfp4_w4a4":
            w13_up, _, _ = mu.get_moe_weight_sizes(i, is_concat=True, is_packed=True, is_aiter_moe=True)
            out.append({"backend": "AITER", "intermediate_per_rank": w13_up // 2, "reason": None})
        else:
            raise SystemExit(f"unknown scheme {case['scheme']!r}")
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
