"""Engine launch recipes (vLLM, SGLang) that realize a plan, every line with its reason and source.

Rendered from the same :class:`~moedispatch.explain.Plan` as explain; engine facts live in
capability_db/engines.toml. Where the engine's own padding or kernel pads differ from what the plan needs, the
recipe says so (that is where engines have gone wrong: vLLM #44679, #55251, #55368).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch import capdb
from moedispatch.backend import AITER_FAMILIES, round_up
from moedispatch.capabilities import Capabilities
from moedispatch.errors import UsageError
from moedispatch.plan import Plan
from moedispatch.layers import MoELayer
from moedispatch.reason import Reason, texts
from moedispatch.decision import Decision

__all__ = ["Recipe", "build_recipe", "render_recipe", "engine_padding"]

_V = "vllm-project/vllm@017e9f4448"
_SGL = "sgl-project/sglang@v0.5.23"


@dataclass
class Recipe:
    engine: str
    version: str
    env: list[dict[str, str]] = field(default_factory=list)
    args: list[dict[str, str]] = field(default_factory=list)
    command: str = ""
    caveats: list[Reason] = field(default_factory=list)
    warnings: list[Reason] = field(default_factory=list)
    backend: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "moedispatch.recipe/1", "engine": self.engine, "engine_version": self.version,
                "backend": self.backend, "env": self.env, "args": self.args, "command": self.command,
                "caveats": texts(self.caveats), "warnings": texts(self.warnings),
                "warning_details": [w.to_dict() for w in self.warnings]}


def engine_padding(engine: str, layer: MoELayer, family: str | None) -> tuple[int, int, int | None, int | None]:
    """(allocated hidden, allocated intermediate/rank, kernel hidden pad, kernel intermediate pad) the engine uses
    for a backend of kernel ``family`` (``Backend.family``).

    vLLM: MXFP4 round-up 256/256 on ROCm for AITER and Triton, 32 for EMULATION, none otherwise
    (fused_moe/oracle/mxfp4.py); runtime pads hidden_pad//128*128 and intermediate_pad//64*64*(2 if TP == 1),
    with MiniMax-M3's override intermediate_pad=0 (fused_moe/experts/rocm_aiter_moe.py; vLLM PR #46419).
    SGLang: AITER pads the down-proj K to 128 storage elements (256 logical for packed fp4), MXFP4 W4A8 / gpt-oss
    round hidden and intermediate to 256 (srt/layers/moe/utils.py get_moe_weight_sizes; SGLang PR #21097).
    Kernel pads are ``None`` where the engine passes none.
    """
    h, i = layer.hidden, layer.intermediate_per_rank
    mx4 = layer.weight.dtype == "mxfp4"
    aiter = family in AITER_FAMILIES
    if engine == "vllm":
        if mx4 and (aiter or family == "triton"):
            h, i = round_up(h, 256), round_up(i, 256)
        elif mx4 and family == "emulation":
            h, i = round_up(h, 32), round_up(i, 32)
        if not aiter:
            return h, i, None, None
        raw_h, raw_i = h - layer.hidden, i - layer.intermediate_per_rank
        kh = raw_h // 128 * 128
        if layer.model_type in ("minimax_m3_vl", "minimax_m3"):
            ki = 0
        else:
            ki = raw_i // 64 * 64 * (2 if layer.moe_tp == 1 else 1)
        return h, i, kh, ki
    if engine == "sglang":
        if aiter:
            if mx4 and (layer.act.dtype in ("fp8", "bf16")):
                h, i = round_up(h, 256), round_up(i, 256)
            elif mx4:
                i = round_up(i, 256)
            else:
                i = round_up(i, 128)
            return h, i, h - layer.hidden, i - layer.intermediate_per_rank
        return h, i, None, None
    raise UsageError(f"unknown engine {engine!r}")


def _engine_cfg(engine: str) -> dict[str, Any]:
    data = capdb.load_toml("engines.toml")
    if engine not in data:
        raise UsageError(f"no recipe for engine {engine!r}; known: vllm, sglang")
    return data


def _in(spec: str, version: str) -> bool:
    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        raise UsageError(f"engine version {version!r} is not a PEP 440 version") from None


def _fmt_line(item: dict[str, str]) -> str:
    return f"{item['why']} ({item['source']})"


def build_recipe(plan: Plan, engine: str, version: str | None = None) -> Recipe:
    data = _engine_cfg(engine)
    eng = data[engine]
    version = version or eng["newest"]
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    counts = Counter(d.backend for d in moe)
    recipe = Recipe(engine, version)
    recipe.warnings += list(plan.warnings)
    if None in counts:
        recipe.warnings.append(Reason(f"{counts[None]} MoE layer(s) have no correct backend: no launch realizes "
                                      "this plan", "warning"))
    chosen = [b for b, _ in counts.most_common() if b is not None]
    if len(chosen) > 1:
        recipe.warnings.append(Reason(
            "MoE layers disagree (" + ", ".join(f"{b} ×{counts[b]}" for b in chosen) + "); engines take one MoE "
            f"backend per model — the recipe follows the majority, {chosen[0]}", "warning"))
    backend = chosen[0] if chosen else None
    recipe.backend = backend
    env: dict[str, dict[str, str]] = {}
    args: list[dict[str, str]] = []
    if backend is not None:
        rows = [r for r in data[engine].get("backend", []) if backend in r["backends"] and _in(r["versions"], version)]
        if not rows:
            recipe.warnings.append(Reason(f"{engine} {version}: no known way to select {backend} "
                                          "(capability_db/engines.toml has no row for it)", "warning"))
        for row in rows:
            if row.get("unsupported"):
                recipe.warnings.append(Reason(row["unsupported"], "warning", row.get("source"), None,
                                              row.get("confidence", "confirmed")))
            for e in row["env"]:
                env[e["name"]] = dict(e)
            by_weight = row.get("args_when_weight", {})
            weights = {d.layer.weight.dtype for d in moe if d.backend == backend}
            special = [w for w in sorted(weights) if w in by_weight]
            args += [dict(a) for a in (by_weight[special[0]] if special else row["args"])]
    if engine == "vllm" and plan.ep > 1 and plan.ep != plan.tp:
        recipe.warnings.append(Reason(
            f"vLLM's --enable-expert-parallel shards experts over all TP×DP ranks (EP = TP here), not ep={plan.ep} "
            f"with tp={plan.tp}: the engine would run a different layout than this plan — re-plan with --ep {plan.tp}",
            "warning"))
    # Model-level caveats the field has learned (they hold together with the backend lines).
    name = plan.model.name
    for cav in data.get("caveat", []):
        if cav["engine"] != engine:
            continue
        if "models" in cav and name not in cav["models"]:
            continue
        if "model_types" in cav and plan.model.model_type not in cav["model_types"]:
            continue
        if "gfx" in cav and plan.caps.gfx not in cav["gfx"]:
            continue
        if "when_backends" in cav and backend not in cav["when_backends"]:
            continue
        if "quant" in cav and not any(d.layer.weight.dtype in cav["quant"] for d in moe):
            continue
        if cav.get("min_ep", 1) > plan.ep or plan.ep > cav.get("max_ep", plan.ep):
            continue
        for e in cav.get("env", []):
            env[e["name"]] = dict(e)
        args += [dict(a) for a in cav.get("args", [])]
        if cav.get("note"):
            recipe.caveats.append(Reason(cav["note"], "caveat", cav.get("source"), None,
                                         cav.get("confidence", "confirmed")))
    # Where the engine's own padding differs from the plan, say so: that is the class of bug behind #44679/#55368.
    if backend is not None:
        d = next(x for x in moe if x.backend == backend)
        # A padding disagreement is a wrong-output or crash risk (vLLM #44679, #55368): put it at the top.
        recipe.warnings += _padding_caveats(engine, version, d, plan.caps)
    recipe.env = list(env.values())
    recipe.args = args
    model_ref = plan.model.path or _hf_id(plan.model.name) or name
    parts = [eng["command"].format(model=model_ref)]
    if plan.tp > 1:
        parts.append(eng["tp_arg"].format(tp=plan.tp))
    if plan.ep > 1:
        parts.append(eng["ep_arg"].format(ep=plan.ep))
    parts += [a["arg"] for a in args]
    recipe.command = " \\\n    ".join(parts)
    return recipe


def _hf_id(name: str) -> str | None:
    from moedispatch.models import builtin_models

    for entry in builtin_models():
        if entry["name"] == name:
            return entry.get("hf_id")
    return None


def _padding_caveats(engine: str, version: str, d: Decision, caps: Capabilities) -> list[Reason]:
    layer, p = d.layer, d.padding
    h, i, kh, ki = engine_padding(engine, layer, d.family)
    aiter = d.family in AITER_FAMILIES
    out = []
    if (h, i) != (p.hidden, p.intermediate_per_rank):
        source = (f"{_V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py" if engine == "vllm"
                  else f"{_SGL}:python/sglang/srt/layers/moe/utils.py")
        out.append(Reason(
            f"{engine} {version} allocates hidden {h} × intermediate/rank {i}; the plan needs {p.hidden} × "
            f"{p.intermediate_per_rank} for {d.backend} (zero-filled)"
            + (" — the engine's allocation does not meet the kernel's alignment" if
               (h % p.hidden_multiple or i % p.intermediate_multiple) else "")
            + (" (open: pad the AITER intermediate at allocation with zeros)" if engine == "vllm" and aiter else ""),
            "warning", source + ("; vllm-project/vllm#55368; vllm-project/vllm#55251" if engine == "vllm" and aiter
                                 else "")))
    # Pads only matter to kernels that skip them (pad_semantics "skip"); a kernel that computes over the zero-filled
    # extent ignores them (classic CK, ASM, FlyDSL with a bias from AITER 0.1.15.post3).
    if kh is not None and ki is not None and (kh, ki) != (p.kernel_hidden_pad, p.kernel_intermediate_pad) \
            and (h, i) == (p.hidden, p.intermediate_per_rank) and p.pad_semantics == "skip":
        out.append(Reason(
            f"{engine} {version} passes hidden_pad={kh}, intermediate_pad={ki} to aiter.fused_moe; the plan needs "
            f"{p.kernel_hidden_pad}, {p.kernel_intermediate_pad} for {d.backend}", "warning",
            f"{_V}:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py; vllm-project/vllm#44679"
            if engine == "vllm" else f"{_SGL}:python/sglang/srt/layers/moe/moe_runner/aiter.py"))
    return out


def render_recipe(plan: Plan, engine: str, *, fmt: str = "table", version: str | None = None) -> str:
    recipe = build_recipe(plan, engine, version)
    if fmt == "json":
        from moedispatch.plan import plan_to_json

        out = recipe.to_dict()
        out["plan_fingerprint"] = plan.fingerprint
        out["plan"] = plan_to_json(plan)
        return json.dumps(out, indent=2) + "\n"
    caps = plan.caps
    lines = [f"# {engine} {recipe.version} recipe for {plan.model.name} on {caps.arch_label}"
             + (f", AITER {caps.aiter_version}" if caps.aiter_version else ", no AITER")
             + f", tp={plan.tp} ep={plan.ep} (plan {plan.fingerprint})"]
    lines.append(f"# MoE plan: {recipe.backend or 'no backend'}")
    for w in recipe.warnings:
        lines.append(f"# WARNING: {w.marked()}")
    for e in recipe.env:
        lines.append(f"# {_fmt_line(e)}")
        lines.append(f"export {e['name']}={e['value']}")
    for a in recipe.args:
        lines.append(f"# {a['arg']}: {_fmt_line(a)}")
    lines.append(recipe.command)
    for c in recipe.caveats:
        lines.append(f"# caveat: {c.marked()}")
    return "\n".join(lines) + "\n"
