"""Drive the moedispatch guard inside the REAL vLLM 0.33.0 (issue 24): process 0 and per-layer checkpoints.

Runs ONLY inside .peers-venv (tests/peers/setup_env.sh) with ``tests/peers/stubs`` first on ``sys.path`` (an
``amdsmi`` reporting ``PEERS_GFX``, an ``aiter`` stand-in), one case per process (vLLM loads its general plugins
once per process):

    PEERS_GFX=gfx950 MOEDISPATCH_GUARD=refuse python tests/peers/vllm_guard_side.py config MODEL_DIR TP [MOE_BACKEND]
    PEERS_GFX=gfx950 python tests/peers/vllm_guard_side.py layer SCHEME ACTIVATION H I_RANK TP [MOE_BACKEND]

``config``: vLLM's own ``EngineArgs(model=MODEL_DIR, …, load_format="dummy").create_engine_config()`` — process 0
with the guard's entry point discovered by vLLM's loader; prints one JSON line: ``ok``, ``error`` (vLLM's exception
text), ``moe_backend`` (``kernel_config.moe_backend`` after the guard), ``env`` (AITER/VLLM variables after it),
``seconds``.
``layer``: vLLM's ``RoutedExperts(...)`` for one MoE layer built through its real ``PluggableLayer.__new__`` under a
``VllmConfig`` whose model is ``MODEL_DIR`` (env ``GUARD_MODEL_DIR``); prints ``cls`` (the class vLLM instantiated),
``backend`` (the oracle's pick on the quant method), ``hidden`` / ``intermediate`` (allocated), ``error``.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stubs"))


def _patch() -> None:  # the three availability probes tests/peers/vllm_side.py patches, for the same reasons
    import vllm.distributed as dist
    from vllm.model_executor.layers.fused_moe.experts import gpt_oss_triton_kernels_moe as oai
    from vllm.model_executor.layers.fused_moe.experts import ocp_mx_emulation_moe as emu

    oai.has_triton_kernels = lambda: True
    emu.has_quark = lambda: True
    dist.get_tensor_model_parallel_world_size = lambda: int(os.environ.get("PEERS_TP", "8"))


def config_case(model_dir: str, tp: int, moe_backend: str | None, keep: bool = False) -> dict:
    import logging

    logging.disable(logging.WARNING)
    from vllm.engine.arg_utils import EngineArgs

    _patch()
    kw = dict(model=model_dir, tensor_parallel_size=tp, load_format="dummy", skip_tokenizer_init=True,
              max_model_len=4096)
    if moe_backend:
        kw["moe_backend"] = moe_backend
    extra = os.environ.get("GUARD_ADDITIONAL_CONFIG")
    if extra:
        kw["additional_config"] = json.loads(extra)
    t0 = time.perf_counter()
    try:
        cfg = EngineArgs(**kw).create_engine_config()
    except Exception as exc:  # vLLM's own error (a pydantic ValidationError wrapping the guard's ValueError)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
    env = {k: v for k, v in os.environ.items() if k.startswith(("AITER_", "GPTOSS_", "VLLM_ROCM"))}
    out = {"ok": True, "error": None, "moe_backend": str(cfg.kernel_config.moe_backend), "env": env,
           "seconds": time.perf_counter() - t0}
    if keep:
        out["config"] = cfg
    return out


def layer_case(cfg, h: int, i: int, experts: int, top_k: int, activation: str, index: int = 0) -> dict:
    """Build one MoE layer's RoutedExperts the way vLLM's factory does (fused_moe/layer.py:361-420) under ``cfg``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (FusedMoEConfig, FusedMoEParallelConfig,
                                                             RoutingMethodType)
    from vllm.model_executor.layers.fused_moe.expert_map_manager import ExpertMapManager
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    tp = cfg.parallel_config.tensor_parallel_size
    act = {"silu": MoEActivation.SILU, "swigluoai": MoEActivation.SWIGLUOAI}[activation]
    swiglu = act is MoEActivation.SWIGLUOAI
    ans = {"cls": None, "backend": None, "hidden": None, "intermediate": None, "error": None}
    try:
        with set_current_vllm_config(cfg):
            par = FusedMoEParallelConfig(
                tp_size=tp, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0,
                sp_size=1, use_ep=False, all2all_backend="allgather_reducescatter", enable_eplb=False)
            mcfg = FusedMoEConfig(
                num_experts=experts, experts_per_token=top_k, hidden_dim=h, intermediate_size=i,
                num_local_experts=experts, num_logical_experts=experts, activation=act, device="cpu",
                routing_method=RoutingMethodType.Renormalize, moe_parallel_config=par, in_dtype=torch.bfloat16,
                hidden_dim_unpadded=h, intermediate_size_per_partition_unpadded=i // tp,
                moe_backend=cfg.kernel_config.moe_backend, swiglu_alpha=1.702 if swiglu else None,
                swiglu_beta=1.0 if swiglu else None, swiglu_limit=7.0 if swiglu else None)
            emm = ExpertMapManager(max_num_batched_tokens=256, top_k=top_k, global_num_experts=experts,
                                   num_redundant_experts=0, num_expert_group=None, moe_parallel_config=par,
                                   placement_strategy="linear", enable_eplb=False)
            layer = RoutedExperts(f"model.layers.{index}.mlp.experts", torch.bfloat16, mcfg, cfg.quant_config,
                                  expert_map_manager=emm)
            ans["cls"] = type(layer).__name__
            qm = layer.quant_method
            for attr in ("unquantized_backend", "fp8_backend", "mxfp4_backend", "mxfp8_backend"):
                if getattr(qm, attr, None) is not None:
                    ans["backend"] = getattr(qm, attr).name
            ans.update(hidden=layer.hidden_size, intermediate=layer.intermediate_size_per_partition,
                       w13=list(layer.w13_weight.shape))
    except Exception as exc:
        ans["error"] = f"{type(exc).__name__}: {exc}"
    return ans


def _plant() -> None:
    """GUARD_PLANT=unquantized-silu: a wrong engine fact in moedispatch's model of vLLM 0.33.0 — its AITER
    unquantized experts said not to take SiLU (capability_db/engines/vllm.toml [backend.unquantized.AITER]); the
    real vLLM picks AITER, so the per-layer check must raise the stale-model alarm."""
    import copy

    from moedispatch.data import capdb

    real = capdb.load_toml

    def load_toml(name, *a, **kw):
        doc = real(name, *a, **kw)
        if name == "engines/vllm.toml":
            doc = copy.deepcopy(doc)
            for cls in doc["backend"]["unquantized"]["AITER"]["classes"]:
                cls["activations"] = [a for a in cls["activations"] if a != "silu"]
        return doc

    capdb.load_toml = load_toml


def _other_oot() -> None:
    """GUARD_OTHER_OOT=before|after: another plugin replacing vLLM's RoutedExperts (as out-of-tree backends do with
    ``@RoutedExperts.register_oot``), registered before or after vLLM loads the general plugins."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    @RoutedExperts.register_oot
    class OtherPluginRoutedExperts(RoutedExperts):
        pass


def main() -> int:
    what = sys.argv[1]
    if os.environ.get("GUARD_FAKE_VERSION"):  # a vLLM release outside the modelled range
        import vllm

        vllm.__version__ = os.environ["GUARD_FAKE_VERSION"]
    if os.environ.get("GUARD_OTHER_OOT") == "before":
        _other_oot()
    if os.environ.get("GUARD_PLANT") == "unquantized-silu":
        _plant()
    if what == "config":
        out = config_case(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    elif what == "model":  # process 0, then the model's first MoE layer in this process (as a worker builds it)
        model_dir, tp = sys.argv[2], int(sys.argv[3])
        backend = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
        out = config_case(model_dir, tp, backend, keep=True)
        if os.environ.get("GUARD_OTHER_OOT") == "after":
            _other_oot()
        cfg = out.pop("config", None)
        if cfg is not None:
            hf = json.load(open(os.path.join(model_dir, "config.json")))
            act = "swigluoai" if hf.get("model_type") == "gpt_oss" else "silu"
            if os.environ.get("GUARD_NO_LAYER") != "1":  # GUARD_NO_LAYER=1: a model whose MoE never passes
                out["layer"] = layer_case(cfg, hf["hidden_size"], hf.get("moe_intermediate_size")  # RoutedExperts
                                          or hf["intermediate_size"], hf.get("num_experts")
                                          or hf.get("num_local_experts"), hf.get("num_experts_per_tok"), act)
            # What vLLM's loader does once the model is built: its create_model (wrapped by the guard) returns.
            from vllm.model_executor.model_loader.base_loader import BaseModelLoader

            out["create_model_wrapped"] = bool(getattr(BaseModelLoader.create_model, "__moedispatch__", False))
            if out["create_model_wrapped"]:
                from moedispatch.guard import vllm as guard

                guard.after_model(cfg)
    elif what == "bench":  # process 0, then N MoE layers as one worker builds them, timed (benchmarks/bench_guard.py)
        model_dir, tp, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        t0 = time.perf_counter()
        import vllm.engine.arg_utils  # noqa: F401  (vLLM's own import, before the plugin loader runs)
        t_import = time.perf_counter() - t0
        out = config_case(model_dir, tp, None, keep=True)
        cfg = out.pop("config")
        hf = json.load(open(os.path.join(model_dir, "config.json")))
        times = []
        for index in range(n):
            t = time.perf_counter()
            ans = layer_case(cfg, hf["hidden_size"], hf.get("moe_intermediate_size") or hf["intermediate_size"],
                             hf.get("num_experts") or hf.get("num_local_experts"), hf.get("num_experts_per_tok"),
                             "silu", index)
            times.append(time.perf_counter() - t)
            assert ans["error"] is None, ans
        out.update(import_seconds=t_import, layer_seconds=times, cls=ans["cls"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
