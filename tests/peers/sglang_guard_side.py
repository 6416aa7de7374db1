"""Drive the moedispatch guard inside the REAL SGLang 0.5.23 (issue 24): its plugin loader, then process 0's
server-args resolution.

Runs ONLY inside .peers-venv, one case per process (SGLang loads plugins once per process):

    PEERS_GFX=gfx950 SGLANG_USE_AITER=1 MOEDISPATCH_GUARD=refuse python tests/peers/sglang_guard_side.py MODEL_DIR TP RUNNER

``sglang.srt.plugins.load_plugins()`` discovers the guard's entry point as SGLang does at start-up; then
``ServerArgs(model_path=MODEL_DIR, tp_size=TP, moe_runner_backend=RUNNER, device="cpu").resolve_once()`` runs
SGLang's real resolution pipeline (``device="cpu"``: this machine has no accelerator; the MoE steps do not depend on
it). Prints one JSON line: ``ok``, ``error`` (the exception ``resolve_once`` raised), ``moe_runner_backend`` (the
resolved value, ``resolved_view``), ``hooked`` (the guard's wrapper is in SGLang's hook table), ``seconds``.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    # transformers must decide "no torchvision" before the stand-in is importable (as tests/peers/sglang_side.py).
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available()
    sys.path.insert(0, os.path.join(HERE, "stubs_sglang"))
    t0 = time.perf_counter()
    from sglang.srt.arg_groups import resolution_hooks as rh
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    hooked = any(getattr(fn, "__module__", "") == "moedispatch.guard.sglang"
                 for fn in rh._HOOKS.get("handle_moe_kernel_config", ()))
    sa = ServerArgs(model_path=sys.argv[1], tp_size=int(sys.argv[2]), moe_runner_backend=sys.argv[3],
                    skip_tokenizer_init=True, device="cpu")
    out = {"hooked": hooked}
    try:
        sa.resolve_once()
        out.update(ok=True, error=None, moe_runner_backend=str(resolved_view(sa).moe_runner_backend))
    except Exception as exc:
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    out["seconds"] = time.perf_counter() - t0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
