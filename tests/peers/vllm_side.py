"""Ask the real vLLM 0.33.0 which MoE backend it picks, and what it allocates, for a list of layers.

Runs ONLY inside .peers-venv (tests/peers/setup_env.sh) with ``tests/peers/stubs`` first on ``sys.path``:
``PEERS_GFX=gfx950 python tests/peers/vllm_side.py < cases.json > answers.json``. One process per gfx target (vLLM
resolves its platform once at import); each case carries its engine environment (``env``, e.g.
``{"VLLM_ROCM_USE_AITER": "1"}``), applied before the case with vLLM's ``rocm_aiter_ops.refresh_env_variables()``.

Each case is a dict: ``scheme`` (bf16 | fp8_tensor | fp8_block | mxfp4_w4a16 | mxfp4_w4a4 | mxfp8), ``quant_method``
(quark | mxfp4 | fp8 — routes MXFP4 to its quant method), ``activation`` (silu | swigluoai |
swigluoai_uninterleave), ``h`` (hidden), ``i`` (intermediate per rank), ``tp``, ``moe_backend`` (auto | triton |
aiter | emulation | triton_unfused …), ``model_type``. The answer: ``backend`` (vLLM's enum member name), ``hidden``
and ``intermediate_per_rank`` as allocated, ``error`` (the exception vLLM raises at selection or at weight
creation), ``stage`` (select | create_weights | None).

The harness makes, per scheme, the calls the quantization method's ``__init__`` / ``maybe_roundup_sizes`` /
``create_weights`` make (vllm-project/vllm@v0.33.0, files named at each branch). Only three availability probes are
patched, to describe vLLM's ROCm image rather than this CPU box: ``has_triton_kernels`` (the image ships
triton_kernels), ``has_quark`` (requirements/rocm.txt pins amd-quark) and the TP world size read by
``validate_fp8_block_shape_moe``.
"""

from __future__ import annotations

import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stubs"))


def _patch() -> None:
    import vllm.distributed as dist
    from vllm.model_executor.layers.fused_moe.experts import gpt_oss_triton_kernels_moe as oai
    from vllm.model_executor.layers.fused_moe.experts import ocp_mx_emulation_moe as emu

    oai.has_triton_kernels = lambda: True
    emu.has_quark = lambda: True
    dist.get_tensor_model_parallel_world_size = lambda: int(os.environ.get("PEERS_TP", "8"))


def main() -> int:
    cases = json.load(sys.stdin)
    import logging

    logging.disable(logging.WARNING)
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (FusedMoEConfig, FusedMoEParallelConfig,
                                                             RoutingMethodType)
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as ofp8
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as omx4
    from vllm.model_executor.layers.fused_moe.oracle import mxfp8 as omx8
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as ounq
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu
    from vllm.model_executor.layers.quantization.utils.fp8_utils import validate_fp8_block_shape_moe

    _patch()
    from vllm.platforms import current_platform

    assert current_platform.is_rocm(), "stub amdsmi did not make vLLM pick ROCm"
    acts = {"silu": MoEActivation.SILU, "swigluoai": MoEActivation.SWIGLUOAI,
            "swigluoai_uninterleave": MoEActivation.SWIGLUOAI_UNINTERLEAVE, "gelu": MoEActivation.GELU}
    from vllm._aiter_ops import rocm_aiter_ops

    out = []
    for case in cases:
        # The case's engine environment, as vLLM would see it at start-up: reset the VLLM_* variables and re-read
        # them (rocm_aiter_ops.refresh_env_variables is vLLM's own helper for exactly this).
        for key in [k for k in os.environ if k.startswith("VLLM_")]:
            del os.environ[key]
        os.environ.update(case.get("env") or {})
        rocm_aiter_ops.refresh_env_variables()
        tp = int(case.get("tp", 8))
        os.environ["PEERS_TP"] = str(tp)
        model_type = case.get("model_type") or "difftest"
        hf = types.SimpleNamespace(model_type=model_type)
        vcfg = VllmConfig()
        object.__setattr__(vcfg, "model_config", types.SimpleNamespace(
            quantization_config=None, hf_config=hf, hf_text_config=hf))
        act = acts[case["activation"]]
        swiglu = act in (MoEActivation.SWIGLUOAI, MoEActivation.SWIGLUOAI_UNINTERLEAVE)
        h, i = int(case["h"]), int(case["i"])
        ans = {"backend": None, "hidden": None, "intermediate_per_rank": None, "error": None, "stage": None}
        stage = "select"
        try:
            with set_current_vllm_config(vcfg):
                par = FusedMoEParallelConfig(
                    tp_size=tp, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0,
                    sp_size=1, use_ep=False, all2all_backend="allgather_reducescatter", enable_eplb=False)
                cfg = FusedMoEConfig(
                    num_experts=int(case.get("experts", 128)), experts_per_token=int(case.get("top_k", 8)),
                    hidden_dim=h, intermediate_size=i * tp, num_local_experts=int(case.get("experts", 128)),
                    num_logical_experts=int(case.get("experts", 128)), activation=act, device="cpu",
                    routing_method=RoutingMethodType.Renormalize, moe_parallel_config=par, in_dtype=torch.bfloat16,
                    hidden_dim_unpadded=h, intermediate_size_per_partition_unpadded=i,
                    moe_backend=case.get("moe_backend", "auto"),
                    swiglu_alpha=1.702 if swiglu else None, swiglu_beta=1.0 if swiglu else None,
                    swiglu_limit=7.0 if swiglu else None)
                scheme = case["scheme"]
                if scheme == "bf16":
                    # unquantized_fused_moe_method.py UnquantizedFusedMoEMethod.__init__ / maybe_roundup_sizes
                    b, _ = ounq.select_unquantized_moe_backend(cfg)
                    hh, ii = ounq.unquantized_round_up_hidden_size_and_intermediate_size(b, h, i)
                elif scheme in ("fp8_tensor", "fp8_block"):
                    # quantization/fp8.py Fp8MoEMethod.__init__ (no maybe_roundup_sizes override) / create_weights
                    if scheme == "fp8_block":
                        shape, refine = ofp8.resolve_fp8_moe_weight_block_shape(
                            cfg, [128, 128], qu.kFp8Dynamic128Sym, True)
                        wkey = qu.create_fp8_quant_key(static=True, group_shape=qu.GroupShape(*shape))
                        akey = qu.kFp8Dynamic128Sym
                    else:
                        refine, wkey, akey = None, qu.kFp8StaticTensorSym, qu.kFp8DynamicTensorSym
                    b, _ = ofp8.select_fp8_moe_backend(cfg, wkey, akey, allow_vllm_cutlass=False)
                    hh, ii = h, cfg.intermediate_size_per_partition
                    stage = "create_weights"
                    if scheme == "fp8_block" and refine is None:
                        validate_fp8_block_shape_moe(ii, [128, 128])
                elif scheme in ("mxfp4_w4a16", "mxfp4_w4a4"):
                    qm = case.get("quant_method") or "quark"
                    if scheme == "mxfp4_w4a4":
                        # quark/quark_moe.py QuarkOCP_MX_MoEMethod (w_mxfp4_a_mxfp4) / maybe_roundup_sizes
                        b, _ = omx4.select_mxfp4_moe_backend(cfg, activation_key=qu.kMxfp4Dynamic)
                        hh, ii = omx4.mxfp4_round_up_hidden_size_and_intermediate_size(b, h, i)
                    elif qm == "mxfp4" and model_type != "gpt_oss":
                        # quantization/mxfp4.py Mxfp4MoEMethod: DeepSeek-V4 oracle, round-up with the activation
                        b, _ = omx4.select_deepseek_v4_mxfp4_moe_backend(cfg)
                        hh, ii = omx4.mxfp4_round_up_hidden_size_and_intermediate_size(b, h, i, activation=act)
                    else:
                        # quark_moe.py QuarkOCP_MX_MoEMethod (w_mxfp4) and mxfp4.py GptOssMxfp4MoEMethod
                        b, _ = omx4.select_mxfp4_moe_backend(cfg)
                        hh, ii = omx4.mxfp4_round_up_hidden_size_and_intermediate_size(b, h, i)
                    if b is omx4.Mxfp4MoeBackend.NONE:
                        b = omx4.Mxfp4MoeBackend.EMULATION
                elif scheme == "mxfp8":
                    # quark/quark_moe.py QuarkW8A8Mxfp8MoEMethod.__init__ / create_weights
                    b, _ = omx8.select_mxfp8_moe_backend(config=cfg)
                    hh, ii = h, i
                    stage = "create_weights"
                    if h % 32 or i % 32:
                        raise ValueError("Quark MXFP8 MoE requires hidden_size and intermediate_size_per_partition "
                                         f"divisible by 32, got {h} and {i}.")
                else:
                    raise SystemExit(f"unknown scheme {scheme!r}")
                ans.update(backend=b.name, hidden=hh, intermediate_per_rank=ii)
        except (ValueError, NotImplementedError) as exc:
            ans.update(backend=ans["backend"], error=f"{type(exc).__name__}: {exc}", stage=stage)
            if stage == "create_weights":
                ans["backend"] = b.name
        out.append(ans)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
