"""Drive the moedispatch guard inside the REAL SGLang 0.5.23 (issue 24): its plugin loader, then process 0's
server-args resolution.

Runs ONLY inside .peers-venv, one case per process (SGLang loads plugins once per process):

    PEERS_GFX=gfx950 SGLANG_USE_AITER=1 MOEDISPATCH_GUARD=refuse python tests/peers/sglang_guard_side.py MODEL_DIR TP RUNNER

``sglang.srt.plugins.load_plugins()`` discovers the guard's entry point as SGLang does at start-up; then
``ServerArgs(model_path=MODEL_DIR, tp_size=TP, moe_runner_backend=RUNNER, device="cpu").resolve_once()`` runs
SGLang's real resolution pipeline (``device="cpu"``: this machine has no accelerator; the MoE steps do not depend on
it). Prints one JSON line: ``ok``, ``error`` (the exception ``resolve_once`` raised), ``moe_runner_backend`` (the
resolved value, ``resolved_view``), ``hooked`` (the guard's wrapper is in SGLang's hook table), ``seconds``.

With ``GUARD_LAYER=1`` the resolved args are then published for a scheduler (``set_global_server_args_for_scheduler``)
and the model's first MoE layer is built with SGLang's own ``FusedMoE(...)`` (where the guard's AFTER hook runs):
``layer`` has ``runner`` (``runner_backend`` SGLang resolved), ``patched`` (the hook applied) or ``error``. To stand
for a ROCm gfx950 box on this CPU, the two platform probes the unquantized method reads are set as on that box
(``unquant._use_aiter``: SGLANG_USE_AITER and is_hip(); ``is_gfx95_supported``), and this process's parallel ranks are
stated (rank 0; SGLang's own ``get_parallel().override_permanently``). ``GUARD_PLANT=sglang-bf16-alignment`` plants a
wrong fact in moedispatch's model of SGLang 0.5.23 (its AITER gate's intermediate alignment 128 → 64).
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _plant() -> None:
    import copy

    from moedispatch.data import capdb

    real = capdb.load_toml

    def load_toml(name, *a, **kw):
        doc = real(name, *a, **kw)
        if name == "engines/sglang.toml":
            doc = copy.deepcopy(doc)
            doc["runner"]["bf16"]["aiter_alignment"] = 64
        return doc

    capdb.load_toml = load_toml


def _layer(sa, model_dir: str) -> dict:
    import torch
    import sglang.srt.layers.quantization.unquant as uq
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(sa)
    initialize_moe_config()
    get_parallel().override_permanently(tp_rank=0, pp_rank=0, attn_cp_rank=0, moe_dp_rank=0, moe_ep_rank=0,
                                        moe_tp_rank=0)
    uq._use_aiter = os.environ.get("SGLANG_USE_AITER") == "1"
    uq.is_gfx95_supported = lambda: os.environ.get("PEERS_GFX") == "gfx950"
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    hf = json.load(open(os.path.join(model_dir, "config.json")))
    ans = {"patched": "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.__init__" in HookRegistry._patched}
    try:
        layer = FusedMoE(num_experts=hf["num_experts"], hidden_size=hf["hidden_size"],
                         intermediate_size=hf["moe_intermediate_size"], layer_id=0, top_k=hf["num_experts_per_tok"],
                         params_dtype=torch.bfloat16, prefix="model.layers.0.mlp.experts")
        ans.update(runner=layer.runner_backend.name, error=None)
    except Exception as exc:
        ans.update(runner=None, error=f"{type(exc).__name__}: {exc}")
    return ans


def main() -> int:
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    # transformers must decide "no torchvision" before the stand-in is importable (as tests/peers/sglang_side.py).
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available()
    sys.path.insert(0, os.path.join(HERE, "stubs_sglang"))
    if os.environ.get("GUARD_PLANT") == "sglang-bf16-alignment":
        _plant()
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
    if out["ok"] and os.environ.get("GUARD_LAYER"):
        out["layer"] = _layer(sa, sys.argv[1])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
