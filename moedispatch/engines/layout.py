"""How an engine release lays a plan out on GPUs: TP × EP × DP and the world size, whether the attention can be
sharded at that TP, and whether each rank's weights fit the target's memory (with the size the engine holds after
its load-time conversions). Pure Python; used by :mod:`moedispatch.engines.recipes` and :mod:`moedispatch.engines.lint`.

Rules (each with its source in ``capability_db/engines.toml``):

- vLLM shards experts over all TP × DP ranks with ``--enable-expert-parallel`` (MoE TP becomes 1): a plan with
  ``ep == tp`` is ``--tensor-parallel-size tp --enable-expert-parallel``; ``ep > tp`` adds ``--data-parallel-size
  ep // tp``; ``1 < ep < tp`` (experts split over some ranks, the intermediate over the others) has no vLLM spelling.
- SGLang's ``--tp-size`` is the world; ``--ep-size`` shards experts inside it (``moe_tp = tp // ep``); attention
  narrower than the world is data-parallel attention (``--attn-dp-size`` from 0.5.22; before, ``--dp-size`` with
  ``--enable-dp-attention``).
- Attention heads must divide by the attention TP; KV heads must divide by it, or it by them (replication).
- Weights per rank are estimated from the config (derived): routed experts as the engine allocates them, the rest
  (attention, dense MLPs, shared experts, embeddings) at the checkpoint's width.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from moedispatch.core.reason import Reason
from moedispatch.data import capdb
from moedispatch.sources.models import builtin_models

__all__ = ["Layout", "realize_layout", "attention_heads", "weight_bytes_per_rank", "product_memory_gib"]

GIB = 1 << 30


@dataclass
class Layout:
    """One engine's realization of a plan's parallelism: its arguments, world size, and what prevents it."""

    tp: int
    ep: int
    dp: int
    world: int
    args: list[dict[str, str]] = field(default_factory=list)
    errors: list[Reason] = field(default_factory=list)
    notes: list[Reason] = field(default_factory=list)
    weights_gib: float | None = None
    budget_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "ep": self.ep, "dp": self.dp, "world_size": self.world,
                "weights_per_rank_gib": None if self.weights_gib is None else round(self.weights_gib, 1),
                "memory_budget_gib": None if self.budget_gib is None else round(self.budget_gib, 1)}


def _raw_config(model: Any) -> dict[str, Any] | None:
    """The config.json dict behind a ModelSpec (built-in entry, or the folder's config.json), text part only."""
    cfg = None
    if model.source == "builtin":
        for entry in builtin_models():
            if entry["name"] == model.name:
                cfg = entry["config"]
                break
    elif model.path:
        path = os.path.join(model.path, "config.json")
        try:
            with open(path, encoding="utf-8") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            return None
    if not isinstance(cfg, dict):
        return None
    text = cfg.get("text_config") or cfg.get("language_config") or cfg.get("llm_config")
    if isinstance(text, dict) and text.get("num_attention_heads"):
        merged = dict(cfg)
        merged.update(text)
        return merged
    return cfg


def heads_warning(model: Any, tp: int) -> str | None:
    """The warning for a TP that does not divide the model's attention heads — a launch no engine starts (vLLM and
    SGLang shard the heads evenly); the MoE plan is still made as asked. None when it divides or is unknown."""
    heads = attention_heads(model)
    if heads is None or tp <= 1 or heads[0] % tp == 0:
        return None
    return (f"--tp {tp}: {model.name} has {heads[0]} attention heads, not divisible by {tp}: no engine launches this "
            "layout (vLLM and SGLang shard the heads evenly); the MoE plan is made as asked")


def attention_heads(model: Any) -> tuple[int, int] | None:
    """(attention heads, KV heads) of the model, or None when its config does not say."""
    cfg = _raw_config(model)
    if not cfg or not isinstance(cfg.get("num_attention_heads"), int):
        return None
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads")
    return heads, kv if isinstance(kv, int) and kv > 0 else heads


def product_memory_gib(caps: Any) -> tuple[str, float] | None:
    """(product, HBM GiB per GPU) of the target from capability_db/gpus.toml, or None when unknown."""
    target = caps.target_dict()
    product, gfx = target.get("product"), target.get("gfx")
    arch = capdb.load_toml("gpus.toml").get("arch", {}).get(gfx, {})
    for p in arch.get("products", []):
        if p.get("name") == product and p.get("memory_gib"):
            mode = capdb.partition_of(gfx, product, getattr(caps, "compute_units", None))
            n = capdb.partitions_for(gfx, product).get(mode, 1) if mode else 1
            if n > 1:
                # The compute partitions of one device share its HBM: with every partition a rank, each gets at most
                # a 1/n share (whatever the memory partition mode: NPS1 shares the pool, NPS2/4 split it).
                return f"{product} {mode} partition (1/{n} of the device's HBM)", float(p["memory_gib"]) / n
            return product, float(p["memory_gib"])
    return None


def _dense_params(cfg: dict[str, Any], model: Any) -> tuple[float, float]:
    """(parameters split by TP, parameters replicated) outside the routed experts, from config.json (derived)."""
    hidden = model.hidden
    heads = cfg.get("num_attention_heads") or 0
    kv = cfg.get("num_key_value_heads") or heads
    layers = len(model.layers)
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V3, Kimi-K2, GLM): low-rank q / kv projections
        q_lora = cfg.get("q_lora_rank") or 0
        nope, rope = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
        v = cfg.get("v_head_dim", 128)
        kvl = cfg["kv_lora_rank"]
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attn = q + hidden * (kvl + rope) + kvl * heads * (nope + v) + heads * v * hidden
    else:
        head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
        attn = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    split = attn * layers
    for t in model.layers:
        if t.kind != "moe":
            split += 3 * hidden * t.intermediate
    if model.shared_experts and model.shared_intermediate:
        # shared_intermediate is the shared experts' total width (n_shared_experts × moe_intermediate_size, one MLP).
        split += model.moe_layers * 3 * hidden * model.shared_intermediate
    vocab = cfg.get("vocab_size") or 0
    split += vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(split), 0.0


def weight_bytes_per_rank(plan: Any, allocation: tuple[int, int] | None = None,
                          expert_bits: float | None = None) -> float | None:
    """Bytes of weights one rank holds (derived estimate): routed experts at ``allocation`` (hidden,
    intermediate/rank as the engine allocates them; default: the plan's padding) and ``expert_bits`` per weight
    (default: the checkpoint's; 16 where the engine dequantizes to BF16 at load), plus the rest of the model."""
    cfg = _raw_config(plan.model)
    if cfg is None:
        return None
    total = 0.0
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    for d in moe:
        layer = d.layer
        h, i = allocation or (d.padding.hidden, d.padding.intermediate_per_rank)
        elems = layer.experts_per_rank * 3 * h * i
        bits = expert_bits if expert_bits is not None else layer.weight.bits
        total += elems * bits / 8
        if expert_bits is None and layer.weight.is_mx:
            total += elems / 32
    split, replicated = _dense_params(cfg, plan.model)
    dense_bytes = 1 if (moe and moe[0].layer.weight.dtype == "fp8") else 2
    total += (split / plan.dense_tp + replicated) * dense_bytes
    return total


def has_attn_dp_flag(eng: Mapping[str, Any], version: str | None) -> bool:
    """Whether this SGLang release spells data-parallel attention ``--attn-dp-size`` (``attn_dp_versions``: the
    release that added it, and the newest when no version is given); before it, ``--dp-size N
    --enable-dp-attention``."""
    spec = eng.get("attn_dp_versions")
    return bool(spec) and (version is None or Version(version) in SpecifierSet(spec))


def _sglang_dp_attention(eng: dict[str, Any], version: str | None, dp: int, why: str,
                         source: str) -> list[dict[str, str]]:
    """SGLang's flags for ``dp`` data-parallel attention groups: ``--attn-dp-size N`` from the release that added it
    (:func:`has_attn_dp_flag`), before it ``--dp-size N --enable-dp-attention`` (which the later releases deprecate)."""
    if has_attn_dp_flag(eng, version):
        return [{"arg": eng["attn_dp_arg"].format(dp=dp), "why": why, "source": eng["attn_dp_source"]}]
    return [{"arg": eng["dp_arg"].format(dp=dp), "why": why, "source": source},
            {"arg": "--enable-dp-attention", "why": "data-parallel attention (attention TP = tp-size / dp-size)",
             "source": source}]


def realize_layout(plan: Any, engine: str, eng: dict[str, Any], *, allocation: tuple[int, int] | None = None,
                   expert_bits: float | None = None, conversion: str | None = None,
                   version: str | None = None) -> Layout:
    """The engine's parallel arguments for ``plan`` and every reason it cannot run as planned."""
    tp, ep = plan.tp, plan.ep
    layout_src = eng.get("layout_source", eng.get("source"))
    dp = 1
    args: list[dict[str, str]] = []
    errors: list[Reason] = []
    notes: list[Reason] = []
    attn = plan.dense_tp
    if attn != tp and ep == 1:  # data-parallel attention, the MoE tensor-parallel over all ranks (Plan.attention_tp)
        world, dp = tp, tp // attn
        flag = eng["tp_arg"].format(tp=attn if engine == "vllm" else world)
        if engine == "vllm" and attn == 1:
            flag = None
        if flag:
            args.append({"arg": flag, "why": f"attention TP {attn}" if engine == "vllm" else
                         f"SGLang's --tp-size is the world size ({world} GPUs)", "source": layout_src})
        why = (f"{dp} data-parallel attention groups of TP {attn}; without expert parallelism the MoE is "
               f"tensor-parallel over all {world} ranks")
        args += ([{"arg": eng["dp_arg"].format(dp=dp), "why": why, "source": layout_src}] if engine == "vllm"
                 else _sglang_dp_attention(eng, version, dp, why, layout_src))
    elif engine == "vllm":
        if ep > 1 and ep < tp:
            errors.append(Reason(
                f"vLLM shards experts over all TP×DP ranks with --enable-expert-parallel (MoE TP 1): tp={tp} "
                f"ep={ep} (experts over {ep} ranks, intermediate over {tp // ep}) has no vLLM spelling — use --ep "
                f"{tp} (experts over every TP rank) or --ep 1", "failed", layout_src))
        if ep > tp:
            dp = ep // tp
        world = tp * dp
        if tp > 1:
            args.append({"arg": eng["tp_arg"].format(tp=tp), "why": "attention and the dense layers are "
                         f"tensor-parallel over {tp} GPUs", "source": layout_src})
        if dp > 1:
            args.append({"arg": eng["dp_arg"].format(dp=dp), "why": f"the experts span {ep} GPUs: {dp} data-parallel "
                         f"replicas of TP {tp} (world size {world})", "source": layout_src})
        if ep > 1:
            moe = next((d.layer for d in plan.decisions if d.layer.kind == "moe"), None)   # not a dense first layer
            args.append({"arg": eng["ep_arg"].format(ep=ep), "why": f"experts sharded over all {world} TP×DP ranks "
                         f"({moe.experts_per_rank if moe is not None else '?'} per rank)", "source": layout_src})
    else:
        # SGLang: --tp-size is the world, the MoE is tensor-parallel over world // ep; attention TP = world // dp
        # (Plan.attention_tp when the launch gives it: lint's data-parallel attention with 1 < EP < world).
        world = max(tp, ep)
        dp = world // attn if plan.attention_tp else world // tp
        if world > 1:
            args.append({"arg": eng["tp_arg"].format(tp=world), "why": f"SGLang's --tp-size is the world size ({world} "
                         "GPUs)", "source": layout_src})
        if dp > 1:
            args += _sglang_dp_attention(eng, version, dp, f"attention TP {world // dp}: {dp} data-parallel "
                                         "attention groups inside the world", layout_src)
        if ep > 1:
            args.append({"arg": eng["ep_arg"].format(ep=ep), "why": f"experts sharded over {ep} ranks (MoE TP "
                         f"{world // ep})", "source": layout_src})
    heads = attention_heads(plan.model)
    heads_src = eng.get("heads_source", layout_src)
    if heads is not None:   # split at the attention TP
        h, kv = heads
        if h % attn:
            errors.append(Reason(f"{plan.model.name} has {h} attention heads: not divisible by TP {attn} (the engine "
                                 f"refuses: 'Total number of attention heads ({h}) must be divisible by tensor "
                                 f"parallel size ({attn})')", "failed", heads_src))
        elif kv % attn and attn % kv:
            errors.append(Reason(f"{plan.model.name} has {kv} KV heads: TP {attn} neither divides them nor is a "
                                 "multiple of them (KV heads are split or replicated per rank)", "failed", heads_src))
    mem = product_memory_gib(plan.caps)
    weights = weight_bytes_per_rank(plan, allocation, expert_bits)
    out = Layout(tp, ep, dp, world, args, errors, notes)
    if mem is not None and weights is not None:
        product, gib = mem
        frac = float(eng.get("memory_fraction", 0.9))
        budget = gib * frac
        out.weights_gib, out.budget_gib = weights / GIB, budget
        what = f" (experts held as BF16: {conversion})" if conversion and expert_bits == 16 else ""
        if weights / GIB > budget:
            errors.append(Reason(
                f"weights do not fit: ~{weights / GIB:.0f} GiB per rank{what} vs {budget:.0f} GiB usable on one "
                f"{product} ({gib:.0f} GiB × {frac} {eng.get('memory_flag', 'memory fraction')}) at tp={tp}"
                + (f" (attention {attn})" if attn != tp else "") + f" ep={ep}",
                "failed", f"{eng.get('memory_source', layout_src)}; capability_db/gpus.toml ({product} memory)",
                None, "derived"))
        elif weights / GIB > 0.8 * budget:
            notes.append(Reason(
                f"~{weights / GIB:.0f} GiB of weights per rank{what} leave ~{budget - weights / GIB:.0f} GiB of the "
                f"{budget:.0f} GiB budget on {product} for the KV cache", "warning", eng.get("memory_source"), None,
                "derived"))
    return out
