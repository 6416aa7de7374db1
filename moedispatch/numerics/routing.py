"""Router reference: softmax top-k, sigmoid + correction bias, grouped top-k, renormalization, routed scaling.

All scores are computed in float32 (engines run the router GEMM and scoring in fp32 for these models). Returns
``(topk_weights float32 [T, k], topk_ids int64 [T, k])``. Ties in ``torch.topk`` resolve to the lower expert id
on CPU; kernels may break exact ties differently, which is why tests route with continuous random logits.

* :func:`softmax_topk` — Mixtral / Qwen3-MoE / gpt-oss style: ``softmax(logits)`` then top-k, optional
  renormalization (``norm_topk_prob``). gpt-oss applies softmax over the selected logits only, which equals top-k on
  the logits then renormalized softmax: the same result as ``renormalize=True``.
* :func:`sigmoid_topk` — DeepSeek-V3 ``noaux_tc`` / MiniMax-M2/M3 / GLM-4.5: ``s = sigmoid(logits)``; experts are
  *chosen* on ``s + e_score_correction_bias`` (grouped: keep the ``topk_group`` groups whose two best biased scores
  sum highest), the *weights* are the unbiased ``s`` of the chosen experts, renormalized, times
  ``routed_scaling_factor``.
* :func:`grouped_topk` — the DeepSeek-V2 softmax variant (group score = max).
"""

from __future__ import annotations

import torch

__all__ = ["softmax_topk", "sigmoid_topk", "grouped_topk", "renormalize", "apply_routed_scaling", "route"]


def renormalize(weights: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Divide each token's top-k weights by their sum (``eps`` guards an all-zero row)."""
    denom = weights.sum(dim=-1, keepdim=True)
    if eps:
        denom = denom.clamp(min=eps)
    return weights / denom


def apply_routed_scaling(weights: torch.Tensor, factor: float | None) -> torch.Tensor:
    """Multiply by ``routed_scaling_factor`` (DeepSeek 2.5, MiniMax-M3 2.0, GLM 2.5); ``None``/1.0 is identity."""
    if factor is None or factor == 1.0:
        return weights
    return weights * float(factor)


def softmax_topk(logits: torch.Tensor, top_k: int, *, renormalize_weights: bool = True,
                 routed_scaling_factor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax`` over all experts, top-k, optional renormalization and scaling."""
    probs = torch.softmax(logits.to(torch.float32), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize_weights:
        weights = renormalize(weights)
    return apply_routed_scaling(weights, routed_scaling_factor), ids.to(torch.int64)


def _mask_groups(choice: torch.Tensor, num_expert_group: int, topk_group: int, group_score: str) -> torch.Tensor:
    t, e = choice.shape
    if e % num_expert_group:
        raise ValueError(f"{e} experts do not split into {num_expert_group} groups")
    g = choice.view(t, num_expert_group, e // num_expert_group)
    if group_score == "top2":
        scores = g.topk(min(2, g.shape[-1]), dim=-1).values.sum(dim=-1)
    else:
        scores = g.amax(dim=-1)
    keep = torch.zeros(t, num_expert_group, dtype=torch.bool, device=choice.device)
    keep.scatter_(1, scores.topk(topk_group, dim=-1).indices, True)
    mask = keep.unsqueeze(-1).expand_as(g).reshape(t, e)
    return choice.masked_fill(~mask, float("-inf"))


def sigmoid_topk(logits: torch.Tensor, top_k: int, *, correction_bias: torch.Tensor | None = None,
                 num_expert_group: int | None = None, topk_group: int | None = None,
                 renormalize_weights: bool = True, routed_scaling_factor: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid scoring, selection on ``sigmoid + correction_bias`` (optionally grouped), weights unbiased."""
    scores = torch.sigmoid(logits.to(torch.float32))
    choice = scores if correction_bias is None else scores + correction_bias.to(torch.float32)
    if num_expert_group and num_expert_group > 1:
        choice = _mask_groups(choice, num_expert_group, topk_group or num_expert_group,
                              "top2" if correction_bias is not None else "max")
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize_weights:
        weights = renormalize(weights, eps=1e-20)
    return apply_routed_scaling(weights, routed_scaling_factor), ids.to(torch.int64)


def grouped_topk(logits: torch.Tensor, top_k: int, *, num_expert_group: int, topk_group: int,
                 scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
                 renormalize_weights: bool = True, routed_scaling_factor: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k: pick ``topk_group`` of ``num_expert_group`` groups, then top-k inside them."""
    if scoring == "sigmoid":
        return sigmoid_topk(logits, top_k, correction_bias=correction_bias, num_expert_group=num_expert_group,
                            topk_group=topk_group, renormalize_weights=renormalize_weights,
                            routed_scaling_factor=routed_scaling_factor)
    if scoring != "softmax":
        raise ValueError(f"unknown scoring {scoring!r}; expected softmax or sigmoid")
    probs = torch.softmax(logits.to(torch.float32), dim=-1)
    choice = probs if correction_bias is None else probs + correction_bias.to(torch.float32)
    choice = _mask_groups(choice, num_expert_group, topk_group, "top2" if correction_bias is not None else "max")
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = probs.gather(1, ids)
    if renormalize_weights:
        weights = renormalize(weights, eps=1e-20)
    return apply_routed_scaling(weights, routed_scaling_factor), ids.to(torch.int64)


def route(logits: torch.Tensor, top_k: int, *, scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
          num_expert_group: int | None = None, topk_group: int | None = None, renormalize_weights: bool = True,
          routed_scaling_factor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One entry point over the functions above."""
    if num_expert_group and num_expert_group > 1:
        return grouped_topk(logits, top_k, num_expert_group=num_expert_group, topk_group=topk_group or 1,
                            scoring=scoring, correction_bias=correction_bias,
                            renormalize_weights=renormalize_weights, routed_scaling_factor=routed_scaling_factor)
    if scoring == "sigmoid":
        return sigmoid_topk(logits, top_k, correction_bias=correction_bias, renormalize_weights=renormalize_weights,
                            routed_scaling_factor=routed_scaling_factor)
    if scoring == "softmax":
        if correction_bias is not None:
            raise ValueError("a correction bias goes with sigmoid scoring")
        return softmax_topk(logits, top_k, renormalize_weights=renormalize_weights,
                            routed_scaling_factor=routed_scaling_factor)
    raise ValueError(f"unknown scoring {scoring!r}; expected softmax or sigmoid")
