"""``aiter.fused_moe.fused_moe`` with the parameter list vLLM 0.33.0 probes (no kernel behind it)."""


def fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=None, quant_type=None,
              doweight_stage1=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, num_local_tokens=None,
              moe_sorting_dispatch_policy=0, dtype=None, hidden_pad=0, intermediate_pad=0, bias1=None, bias2=None,
              gate_mode=None, alpha=None, beta=None, limit=None, linear_beta=None):
    raise RuntimeError("stub aiter: no kernels on this machine (selection-only stand-in)")


def fused_topk(*_args, **_kwargs):
    raise RuntimeError("stub aiter: no kernels on this machine (selection-only stand-in)")
