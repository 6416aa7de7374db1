"""Engine launch recipes (vLLM, SGLang): the best plan an engine *release* can carry out, every line with its reason
and source — never a launch the tool knows is wrong.

A recipe chooses among what the engine can realize: for each correct backend of the plan (the winner first, then
the correct ones it outranked) it asks how that engine release allocates the experts (its own padding, which may
miss the kernel's alignment), which path it really runs (load-time conversions, its own gates), and which
engine-level known issues match; the first realization with no refusal is printed. Where none exists, or the
layout itself cannot run (attention heads vs TP, EP without a spelling, weights beyond the GPU's memory), the
recipe has ``command = None``, the reasons, and the nearest safe alternative (another TP/EP, engine release or
engine). Engine facts live in capability_db/engines.toml; layout rules in :mod:`moedispatch.engines.layout`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch.data import capdb
from moedispatch.core.backend import round_up
from moedispatch.core.families import AITER_FAMILIES, family_of
from moedispatch.core.decision import Decision
from moedispatch.core.errors import MoedispatchError, UsageError
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.engines.layout import Layout, realize_layout
from moedispatch.engines.paths import LaunchPath, rank_paths
from moedispatch.cost.ranking import total
from moedispatch.plan.plan import Plan
from moedispatch.core.reason import Reason, texts
from moedispatch.core.backend import Padding
from moedispatch.core.families import FUSED_MOE_FAMILIES
from moedispatch.core.decision import NoBackendError
from moedispatch.engines import choice as ec
from moedispatch.engines.choice import recipe_engine_groups
from moedispatch.kit.rules import evaluate_issues
from moedispatch.plan.plan import _ranges, plan_model, plan_to_json
from moedispatch.plan.whatif import numerics_change, switch_variants
from moedispatch.selector import plugins
from moedispatch.selector.pure import select
from moedispatch.selector.runtime import (blocking_reasons, costs_for, dispatch_for, dispatch_reasons,
                                          dispatched_family_issues)
from moedispatch.core.workload import AITER_ENV, Runtime
from moedispatch.sources.models import builtin_models

__all__ = ["Recipe", "build_recipe", "render_recipe", "engine_padding", "engine_data", "matching_issues",
           "path_family", "ENGINES"]

ENGINES = ("vllm", "sglang")


@dataclass
class Recipe:
    engine: str
    version: str
    env: list[dict[str, str]] = field(default_factory=list)
    args: list[dict[str, str]] = field(default_factory=list)
    command: str | None = ""
    caveats: list[Reason] = field(default_factory=list)
    warnings: list[Reason] = field(default_factory=list)
    backend: str | None = None
    refusals: list[Reason] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    layout: Layout | None = None
    #: The plan this recipe realizes when it differs from the one asked for (re-made under an AITER env switch).
    plan: Plan | None = field(default=None, repr=False)
    #: What AITER's dispatcher runs per token count for each MoE layer group of an aiter.fused_moe launch, at the
    #: engine's allocation and with the recipe's environment: outcomes, not the choice (:func:`engine_runs`).
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: Every launch path the engine release has for the MoE layers, ranked: the one taken first (issue 23 item 1).
    paths: list[LaunchPath] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.command is not None

    def path_lines(self) -> list[str]:
        """The launch paths as the recipe text shows them: a heading, then one line each, marked ``[taken]`` (the
        command's), ``[ok]`` (realizable, ranked below) or ``[no]`` (refused)."""
        if not self.paths:
            return []
        taken = next((p for p in self.paths if p.ok), None) if self.ok else None
        return [f"launch paths {self.engine} {self.version} has for the MoE layers (best first):"] + [
            f"  [{'taken' if p is taken else 'ok' if p.ok else 'no'}] {p.summary()}" for p in self.paths]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "moedispatch.recipe/1", "engine": self.engine, "engine_version": self.version,
                "backend": self.backend, "env": self.env, "args": self.args, "command": self.command,
                "caveats": texts(self.caveats), "warnings": texts(self.warnings),
                "warning_details": [w.to_dict() for w in self.warnings],
                "reasons": texts(self.refusals), "reason_details": [r.to_dict() for r in self.refusals],
                "alternatives": self.alternatives, "aiter_runs": self.runs,
                "launch_paths": [p.to_dict() for p in self.paths],
                "layout": self.layout.to_dict() if self.layout is not None else None}


# -- engine data --------------------------------------------------------------------------------------------------

def engine_data(engine: str) -> dict[str, Any]:
    data = capdb.load_toml("engines.toml")
    if engine not in ENGINES or engine not in data:
        raise UsageError(f"no recipe for engine {engine!r}; known: {', '.join(ENGINES)}")
    return data


def _version(engine: str, version: str | None, eng: dict[str, Any]) -> str:
    version = version or eng["newest"]
    try:
        Version(version)
    except InvalidVersion:
        raise UsageError(f"engine version {version!r} is not a PEP 440 version (e.g. {eng['newest']})") from None
    return version


def prerelease_note(engine: str, version: str) -> str | None:
    """What judging a pre-release (``0.33.0rc1``, ``0.33.0.dev12``) means, or None: PEP 440 orders it before its
    release, so a rule whose range starts at that release is not applied to it — said, never silently assumed."""
    v = Version(version)
    if not v.is_prerelease:
        return None
    return (f"{engine} {version} is a pre-release of {v.base_version}: judged by the rules of the releases before "
            f"{v.base_version} (a rule that starts at {v.base_version} is not applied to it); if it already has "
            f"{v.base_version}'s changes, pass --engine-version {v.base_version}")


def _in(spec: str, version: str) -> bool:
    return Version(version) in SpecifierSet(spec)


def _match(row: dict[str, Any], version: str, layer: MoELayer, gfx: str | None = None) -> bool:
    if "versions" in row and not _in(row["versions"], version):
        return False
    if "weight" in row and layer.weight.dtype not in row["weight"]:
        return False
    if "act" in row and layer.act.dtype not in row["act"]:
        return False
    if "gfx" in row and gfx not in row["gfx"]:
        return False
    return True


def _fam(family: str | None) -> str | None:
    """``aiter`` for an AITER family or a built-in AITER backend's name (engine rows key on the engine path), else
    the family itself."""
    return "aiter" if family in AITER_FAMILIES or family_of(family) in FUSED_MOE_FAMILIES else family


def conversion(engine: str, version: str, layer: MoELayer, gfx: str) -> dict[str, Any] | None:
    """The engine's load-time conversion of this layer's experts on ``gfx`` (or None)."""
    for row in engine_data(engine)[engine].get("conversion", []):
        if _match(row, version, layer, gfx):
            return row
    return None


def converted_plan(plan: Plan, engine: str, version: str | None = None) -> tuple[Plan, dict[str, Any]] | None:
    """The plan of the layers the engine serves after its load-time conversion, when one applies to every MoE layer
    and says what the converted experts are (``to``): planned on the conversion's family (``runner``), with the
    conversion row. None when the engine serves the checkpoint's own experts."""
    version = _version(engine, version, engine_data(engine)[engine])
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    rows = [conversion(engine, version, d.layer, plan.caps.gfx) for d in moe]
    if not moe or any(r is None or "to" not in r for r in rows) or len({id(r) for r in rows}) != 1:
        return None
    conv = rows[0]
    to = conv["to"]
    weight = QuantSpec(to["weight"], to["weight_granularity"], scale_dtype="fp32")
    act = QuantSpec(to["act"], to["act_granularity"], scale_dtype="fp32", dynamic=True)
    layers = tuple(replace(t, weight=weight, act=act)
                   if t.kind == "moe" else t for t in plan.model.layers)
    spec = replace(plan.model, layers=layers)
    force = conv["family"] if conv["family"] in ("triton", "emulation") else None
    # The caller's warnings (a guessed target, the installed AITER) carry over; those the original layers' decisions
    # produced (e.g. "run on emulation") do not: the converted plan states its own.
    own = set(plan_model(plan.model, plan.caps, plan.tp, plan.ep, runtime=plan.runtime).warnings)
    carried = [w for w in plan.warnings if w not in own]
    again = plan_model(spec, plan.caps, plan.tp, plan.ep, runtime=plan.runtime, warnings=carried, force=force)
    return replace(again, attention_tp=plan.attention_tp), conv


def path_family(engine: str, version: str, layer: MoELayer, gfx: str, family: str | None) -> str | None:
    """The family the engine really runs for a plan that puts ``layer`` on ``family`` (after load-time
    conversions)."""
    conv = conversion(engine, version, layer, gfx)
    return conv["family"] if conv else _fam(family)


#: The vLLM release whose ``aiter_moe_pads`` (experts/rocm_aiter_moe.py:239-272) was read: SITU's pads unrounded, no
#: doubling at TP 1 for MXFP4 W4A4 with SiLU. Earlier releases keep the TP-aware doubling of vllm-project/vllm#44679.
_AITER_PADS_033 = Version("0.33.0")


def engine_padding(engine: str, layer: MoELayer, family: str | None,
                   version: str | None = None) -> tuple[int, int, int | None, int | None]:
    """(allocated hidden, allocated intermediate/rank, kernel hidden pad, kernel intermediate pad) the engine
    release uses for a backend of kernel ``family`` (``Backend.family``; a built-in backend name such as
    ``aiter-flydsl`` is accepted too), from capability_db/engines.toml.

    vLLM's runtime pads to AITER are ``hidden_pad // 128 * 128`` and ``intermediate_pad // 64 * 64 * (2 if TP == 1)``
    with MiniMax-M3's ``intermediate_pad=0`` (experts/rocm_aiter_moe.py; vLLM PR #46419); from vLLM 0.33 (the release
    read: experts/rocm_aiter_moe.py:239-272 ``aiter_moe_pads``) SITU's pads pass through unrounded and the MXFP4 W4A4
    SiLU path's intermediate pad is not doubled at TP 1 (AITER doubles it; doubling it here too masks live rows).
    SGLang passes the differences. Kernel pads are ``None`` where the engine passes none.
    """
    data = engine_data(engine)
    version = _version(engine, version, data[engine])
    h, i = layer.hidden, layer.intermediate_per_rank
    fam = _fam(family)
    for row in data[engine].get("allocation", []):
        if fam in row["families"] and _match(row, version, layer):
            h = round_up(h, row["hidden"])
            step = row["intermediate"] or (64 if i <= 192 else 128)
            i = round_up(i, step)
            break
    if fam != "aiter":
        return h, i, None, None
    raw_h, raw_i = h - layer.hidden, i - layer.intermediate_per_rank
    if engine == "sglang":
        return h, i, raw_h, raw_i
    if layer.model_type in ("minimax_m3_vl", "minimax_m3"):
        raw_i = 0   # the model passes intermediate_pad=0 (vllm-project/vllm#46419)
    return (h, i, *vllm_kernel_pads(raw_h, raw_i, layer.activation, layer.weight.dtype == "mxfp4" and
                                    layer.act.dtype == "mxfp4", layer.moe_tp, version))


def vllm_kernel_pads(hidden_pad: int, intermediate_pad: int, activation: str, mxfp4_w4a4: bool, moe_tp: int,
                     version: str) -> tuple[int, int]:
    """The (hidden, intermediate) pads vLLM hands AITER's fused MoE for the allocation's pads (``aiter_moe_pads``,
    vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py:239-272; before 0.33
    every TP-1 intermediate pad doubled, vllm-project/vllm#44679)."""
    double = moe_tp == 1
    if Version(version) >= _AITER_PADS_033:
        if activation == "situ":
            return hidden_pad, intermediate_pad
        double = double and not (mxfp4_w4a4 and activation == "silu")
    return hidden_pad // 128 * 128, intermediate_pad // 64 * 64 * (2 if double else 1)


def modelled_choice(engine: str, version: str, layer: MoELayer, caps: Any, env: dict[str, str],
                    moe_backend: str, quant_method: str | None = None) -> Any:
    """:func:`moedispatch.engines.choice.choice_for_layer` where that module models this exact release (checked
    against the engine's real code by tests/peers/), else None: the recipe then uses this file's rows."""
    if version not in ec.ENGINES.get(engine, {}):
        return None
    try:
        return ec.choice_for_layer(layer, caps, engine, version, env=env, moe_backend=moe_backend,
                                   quant_method=quant_method)
    except (MoedispatchError, OSError, KeyError):  # the engine model's data is absent for this engine: use the rows
        return None


def matching_issues(engine: str, version: str, layer: MoELayer, gfx: str, *, ep: int, family: str | None,
                    env: dict[str, str], runner: str | None = None) -> list[dict[str, Any]]:
    """Engine-level known issues (capability_db/engines.toml ``[[<engine>.issue]]``) that match this launch."""
    out = []
    for row in engine_data(engine)[engine].get("issue", []):
        if not _match(row, version, layer, gfx):
            continue
        if "model_types" in row and layer.model_type not in row["model_types"]:
            continue
        if ep < row.get("min_ep", 1):
            continue
        if "families" in row and _fam(family) not in row["families"]:
            continue
        if "runner" in row and (runner or "auto") not in row["runner"]:
            continue
        if "unaligned" in row and layer.intermediate_per_rank % row["unaligned"] == 0:
            continue
        if any((env.get(k) or "") != v for k, v in row.get("env", {}).items()):
            continue
        out.append(row)
    return out


def _issue_reason(row: dict[str, Any], kind: str = "failed") -> Reason:
    return Reason(f"{row['message']} — fix: {row['fix']}", kind, row["source"], row.get("id"),
                  row.get("confidence", "confirmed"))


# -- realization --------------------------------------------------------------------------------------------------

def _candidates(plan: Plan) -> list[str]:
    """The plan's MoE backends in order: the majority winner, then each correct backend it outranked."""
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    counts = Counter(d.backend for d in moe if d.backend)
    out = [b for b, _ in counts.most_common()]
    for d in moe:
        for r in d.rejected:
            if r.supported and r.backend not in out:
                out.append(r.backend)
    return out


def _forced(plan: Plan, backend: str) -> list[Decision] | None:
    """Every MoE layer's decision with ``backend`` forced (None when it cannot run some layer)."""
    out = []
    registry = plugins.get_registry()
    for d in plan.decisions:
        if d.layer.kind != "moe":
            continue
        if d.backend == backend:
            out.append(d)
            continue
        try:
            out.append(select(d.layer, plan.caps, registry.backends, backend))
        except (NoBackendError, UsageError):
            return None
    return out


def _family_of(backend: str | None) -> str | None:
    """``Backend.family`` of a registered backend name (``aiter-ck`` → ``ck``), or the name itself."""
    if backend is None:
        return None
    b = plugins.get_registry().get(backend)
    return getattr(b, "family", None) or backend


def _row_args(row: dict[str, Any], weight: str) -> list[dict[str, str]]:
    """A backend row's arguments for a checkpoint whose experts are ``weight`` (``args_when_weight`` wins)."""
    return row.get("args_when_weight", {}).get(weight, row["args"])


def backend_rows(eng: dict[str, Any], backend: str, version: str, weights: set[str]) -> list[dict[str, Any]]:
    """The engine release's rows that select ``backend`` for experts of these weight dtypes (a row's ``weights``
    limits it to those dtypes, ``not_weights`` excludes some: one engine path per quant method)."""
    return [r for r in eng.get("backend", []) if backend in r["backends"] and _in(r["versions"], version)
            and (not r.get("weights") or weights <= set(r["weights"]))
            and not (weights & set(r.get("not_weights", ())))]


def _engine_env(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for r in rows for e in r["env"]}


def _try_backend(plan: Plan, engine: str, version: str, backend: str,
                 decisions: list[Decision]) -> tuple[list[Reason], list[dict[str, Any]], list[Reason]]:
    """(refusals, backend rows, warnings) of realizing ``backend`` for every MoE layer on this engine release."""
    eng = engine_data(engine)[engine]
    refusals: list[Reason] = []
    warnings: list[Reason] = []
    rows = backend_rows(eng, backend, version, {d.layer.weight.dtype for d in decisions})
    if not rows:
        return [Reason(f"{engine} {version}: no known way to select {backend} (capability_db/engines.toml has no "
                       "row for this release)", "failed")], [], []
    for row in rows:
        if row.get("unsupported"):
            refusals.append(Reason(row["unsupported"], "failed", row.get("source"), None,
                                   row.get("confidence", "confirmed")))
    if refusals:
        return refusals, rows, warnings
    env = _engine_env(rows)
    runner = next((a["arg"].split()[-1] for r in rows for a in _row_args(r, decisions[0].layer.weight.dtype)
                   if a["arg"].startswith("--moe-runner")), None)
    seen: set[str] = set()
    # Every distinct MoE layer shape: a model whose layers differ (quant, experts) is checked layer group by group.
    for d in {x.layer.signature(): x for x in decisions}.values():
        bad, said = _layer_checks(plan, engine, version, backend, d, rows, env, runner, seen)
        refusals += bad
        warnings += said
    refusals = list(dict.fromkeys(refusals))
    warnings = list(dict.fromkeys(warnings))
    return refusals, rows, warnings


def _layer_checks(plan: Plan, engine: str, version: str, backend: str, d: Decision, rows: list[dict[str, Any]],
                  env: dict[str, str], runner: str | None, seen: set[str]) -> tuple[list[Reason], list[Reason]]:
    """(refusals, warnings) of realizing ``backend`` for one MoE layer group on this engine release: its load-time
    conversion, the engine's own pick under the recipe's flags and env, the engine's allocation against the kernel's
    alignment, the pads it passes, its gates and its known issues (``seen``: issues already said for another group)."""
    eng = engine_data(engine)[engine]
    gfx = plan.caps.gfx
    layer = d.layer
    refusals: list[Reason] = []
    warnings: list[Reason] = []
    fam = path_family(engine, version, layer, gfx, d.family)
    conv = conversion(engine, version, layer, gfx)
    if conv and fam != _fam(d.family) and not (fam == "triton" and engine == "sglang"):
        refusals.append(Reason(f"{engine} {version} does not run {backend} here: {conv['what']}", "failed",
                               conv["source"], None, conv.get("confidence", "confirmed")))
    h, i, kh, ki = engine_padding(engine, layer, d.family, version)
    forced = next((a["arg"].split()[-1] for r in rows for a in _row_args(r, layer.weight.dtype)
                   if a["arg"].startswith(eng["backend_arg"])), "auto")
    choice = modelled_choice(engine, version, layer, plan.caps, env, forced, plan.model.quant_method)
    if choice is not None:
        src = next((r.source for r in choice.reasons if r.source), None) or eng["source"]
        if not choice.ok:
            refusals.append(Reason(f"{engine} {version} refuses {eng['backend_arg']} {forced} for this layer: "
                                   f"{choice.error}", "failed", src))
            return refusals, warnings
        if _fam(_family_of(choice.family)) != fam:
            refusals.append(Reason(f"with {eng['backend_arg']} {forced} {engine} {version} runs {choice.backend} "
                                   f"({choice.family or 'no moedispatch backend'}), not {backend}", "failed", src))
            return refusals, warnings
        if choice.hidden and choice.intermediate_per_rank:
            h, i = choice.hidden, choice.intermediate_per_rank
    bad, said = _allocation_check(plan, engine, version, backend, d, h, i, kh, ki)
    refusals += bad
    warnings += said
    for gate in eng.get("gate", []):
        if _fam(d.family) in gate["families"] and _match(gate, version, layer, gfx) \
                and i % gate["intermediate_multiple"]:
            refusals.append(Reason(f"{engine} {version} would not run {backend} for intermediate/rank {i}: "
                                   f"{gate['what']}", "failed", gate["source"]))
    for row in matching_issues(engine, version, layer, gfx, ep=plan.ep, family=fam, env=env, runner=runner):
        if row["id"] in seen:
            continue
        seen.add(row["id"])
        (refusals if row["severity"] == "error" else warnings).append(
            _issue_reason(row, "failed" if row["severity"] == "error" else "warning"))
    return refusals, warnings


def _allocation_check(plan: Plan, engine: str, version: str, backend: str, d: Decision, h: int, i: int,
                      kh: int | None, ki: int | None) -> tuple[list[Reason], list[Reason]]:
    """(refusals, warnings) of the engine allocating ``h`` × ``i`` (and passing kernel pads ``kh``, ``ki``) where the
    plan pads to its own: the kernel's alignment, the known issues that allocation meets, the pads it hands AITER."""
    eng = engine_data(engine)[engine]
    layer, p = d.layer, d.padding
    refusals: list[Reason] = []
    warnings: list[Reason] = []
    if h % p.hidden_multiple or i % p.intermediate_multiple:
        src = next((r["source"] for r in eng.get("allocation", []) if _fam(d.family) in r["families"]
                    and _match(r, version, layer)), eng["source"])
        # where AITER's dispatch at exactly this allocation is why the plan pads, that is the reason, not the table
        why = next((n.text for n in p.notes if n.kind == "padding" and n.text.startswith("padded to")
                    and f"not {h} × {i}" in n.text), None)
        refusals.append(Reason(
            f"{engine} {version} allocates hidden {h} × intermediate/rank {i} for this layer; the plan is {why}"
            if why else
            f"{engine} {version} allocates hidden {h} × intermediate/rank {i} for this layer; {backend} needs "
            f"multiples of {p.hidden_multiple} × {p.intermediate_multiple} (the plan pads to {p.hidden} × "
            f"{p.intermediate_per_rank}) — the engine's allocation does not meet the kernel's alignment",
            "failed", src))
    elif (h, i) != (p.hidden, p.intermediate_per_rank) and _fam(d.family) == "aiter":
        warnings.append(Reason(
            f"{engine} {version} allocates hidden {h} × intermediate/rank {i} (zero-filled); the plan's "
            f"{p.hidden} × {p.intermediate_per_rank} is one valid choice of the kernel's alignment "
            f"({p.hidden_multiple} × {p.intermediate_multiple}): both hold", "warning", None, None, "derived"))
        # What the kernel meets is the engine's allocation, not the plan's: its known issues (and, with a
        # runtime, AITER's dispatch of that shape) are checked again on it.
        bad, said = _allocation_issues(plan, d, backend, h, i, kh, ki)
        refusals += bad
        warnings += said
    if kh is not None and ki is not None and (h, i) == (p.hidden, p.intermediate_per_rank) \
            and p.pad_semantics == "skip" and (kh, ki) != (p.kernel_hidden_pad, p.kernel_intermediate_pad):
        warnings.append(Reason(
            f"{engine} {version} passes hidden_pad={kh}, intermediate_pad={ki} to aiter.fused_moe; the plan needs "
            f"{p.kernel_hidden_pad}, {p.kernel_intermediate_pad} for {backend}", "warning",
            "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py; "
            "vllm-project/vllm#44679" if engine == "vllm" else
            "sgl-project/sglang@v0.5.23:python/sglang/srt/layers/moe/moe_runner/aiter.py"))
    return refusals, warnings


def _allocation_issues(plan: Plan, d: Decision, backend: str, h: int, i: int, kh: int | None,
                       ki: int | None) -> tuple[list[Reason], list[Reason]]:
    """(refusals, warnings) of the known issues — the layer's (capability_db/known_issues.toml) and, when the plan
    has a runtime, the kernel × bucket ones of AITER's dispatch — that the engine's allocation ``h`` × ``i`` meets
    and the plan's own padding does not (e.g. the plan runs 384/rank natively, the engine allocates 512, where the
    tuned bucket-4 kernel of ROCm/aiter#3933 is wrong)."""
    import dataclasses

    layer, p = d.layer, d.padding
    hp, ip = h - layer.hidden, i - layer.intermediate_per_rank
    alloc = Padding(hidden=h, intermediate_per_rank=i, hidden_pad=hp, intermediate_pad=ip,
                    kernel_hidden_pad=hp if kh is None else min(kh, hp),
                    kernel_intermediate_pad=ip if ki is None else min(ki, ip), zero_fill=bool(hp or ip),
                    hidden_multiple=p.hidden_multiple, intermediate_multiple=p.intermediate_multiple,
                    pad_semantics=p.pad_semantics)
    b = plugins.get_registry().get(backend)
    planned = {r.issue for r in (*d.reasons, *d.warnings) if r.issue}
    where = f"at the engine's allocation ({h} × {i}, not the plan's {p.hidden} × {p.intermediate_per_rank}): "
    refusals: list[Reason] = []
    warnings: list[Reason] = []
    outcome = evaluate_issues(b.name if b is not None else backend, layer, plan.caps, alloc)
    refusals += [dataclasses.replace(r, text=where + r.text, kind="failed") for r in outcome.blocking
                 if r.issue not in planned]
    warnings += [dataclasses.replace(r, text=where + r.text, kind="warning") for r in outcome.notes
                 if r.issue and r.issue not in planned and r.kind in ("caveat", "warning")]
    if plan.runtime is not None and d.dispatch is not None:
        dispatch = dispatch_for(layer, plan.caps, alloc, plan.runtime)
        others, other_notes = dispatched_family_issues(layer, plan.caps, alloc, dispatch, b.name if b else backend)
        refusals += [dataclasses.replace(r, text=where + r.text) for r in (*blocking_reasons(dispatch), *others)
                     if r.issue not in planned]
        warnings += [dataclasses.replace(r, text=where + r.text, kind="warning") for r in other_notes
                     if r.issue not in planned]
        warnings += [dataclasses.replace(r, text=where + r.text, kind="warning")
                     for r in dispatch_reasons(dispatch, backend, d.family)
                     if r.issue and r.issue not in planned and r.kind in ("warning", "caveat")]
    return refusals, warnings


def build_recipe(plan: Plan, engine: str, version: str | None = None, *, alternatives: bool = True,
                 switches: bool = True) -> Recipe:
    """The best launch of ``plan`` that ``engine`` at ``version`` (default: newest known) can carry out.

    When the engine cannot carry out the plan's first choice (e.g. it allocates 384 where the AITER plan pads to
    512), the plan is re-made with each AITER environment switch that changes what AITER runs (the what-if
    switches); a switch under which the engine realizes the first choice gives the recipe, with the switch exported.
    """
    converted = converted_plan(plan, engine, version)
    if converted is not None:  # what the engine serves after its load-time conversion is what the launch must run
        cplan, conv = converted
        recipe = build_recipe(cplan, engine, version, alternatives=alternatives, switches=switches)
        recipe.caveats.insert(0, Reason(f"{conv['what']}: the recipe plans the converted experts "
                                        f"({conv['to']['weight']} {conv['to']['weight_granularity']}) on "
                                        f"{conv['family']}", "caveat", f"{conv['source']}; {conv['to_source']}", None,
                                        conv.get("confidence", "confirmed")))
        return recipe
    if switches and plan.runtime is not None:
        first = build_recipe(plan, engine, version, alternatives=alternatives, switches=False)
        return _realized_with_switch(plan, engine, version, first) or first
    eng = engine_data(engine)[engine]
    version = _version(engine, version, eng)
    recipe = Recipe(engine, version)
    recipe.warnings += list(plan.warnings)
    known = eng.get("releases") or []
    too_old = bool(known) and Version(version) < Version(known[0])
    if too_old:   # one reason, not one "no known way to select …" per backend
        recipe.refusals.append(Reason(f"{engine} {version} is older than every release capability_db models "
                                      f"({known[0]} … {known[-1]}): no recipe for it", "failed",
                                      "capability_db/engines.toml", None, "derived"))
    if Version(version) > Version(eng["newest"]):
        recipe.warnings.append(Reason(f"{engine} {version} is newer than the newest release capability_db knows "
                                      f"({eng['newest']}): its rules are assumed", "warning", None, None, "derived"))
    pre = prerelease_note(engine, version)
    if pre:
        recipe.warnings.append(Reason(pre, "warning", None, None, "derived"))
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    missing = [d for d in moe if d.backend is None]
    if missing:
        recipe.refusals.append(Reason(f"{len(missing)} MoE layer(s) have no correct backend: no launch realizes "
                                      "this plan", "failed"))
    chosen, rows = None, []
    if moe and not missing and not too_old:
        chosen, rows = _pick_backend(plan, engine, version, recipe, alternatives)
    recipe.backend = chosen
    layout = _layout(plan, engine, version, recipe, moe)
    env, args = _env_and_args(plan, engine, recipe, moe, rows)
    recipe.env = list(env.values())
    recipe.args = layout.args + args
    if recipe.refusals:
        recipe.command = None
        if alternatives and not recipe.alternatives:
            recipe.alternatives = [a for a in _alternatives(plan, engine, version)
                                   if not _reference_only(a["backend"])]
        return recipe
    # A model found in the local HF cache is served by its repo id (the engine resolves the same cache; the snapshot
    # path would become the served model name clients must send); a folder the user named, by its path.
    model_ref = (plan.model.name if plan.model.source == "hf-cache" else plan.model.path) \
        or _hf_id(plan.model.name) or plan.model.name
    parts = [eng["command"].format(model=model_ref)] + [a["arg"] for a in recipe.args]
    recipe.command = " \\\n    ".join(parts)
    recipe.runs = engine_runs(plan, engine, version, recipe)
    _name_after_what_runs(plan, engine, version, recipe, moe)
    return recipe


def _pick_backend(plan: Plan, engine: str, version: str, recipe: Recipe,
                  alternatives: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """(backend, its engine rows) of the best launch path the engine realizes (:func:`launch_paths`), or (None, [])
    with the refusals added to ``recipe``; the slow reference path is refused while a native launch exists
    elsewhere."""
    paths = launch_paths(plan, engine, version)
    recipe.paths = paths
    best = next((p for p in paths if p.ok), None)
    chosen = best.backend if best is not None else None
    rows = list(best.rows) if best is not None else []
    # what the plan preferred and the engine cannot make run: the refused paths before the chosen one in the plan's
    # order, and the chosen path's own backends whose checks failed
    order = _candidates(plan)
    first = order.index(best.backends[0]) if best is not None else len(order)
    refused = sorted((p for p in paths if not p.ok), key=lambda p: order.index(p.backends[0]))
    tried = [r for p in refused if order.index(p.backends[0]) < first for r in p.refusals]
    tried += list(best.refusals) if best is not None else []
    if chosen is not None and tried and _reference_only(chosen) and alternatives:
        # Never print the slow reference path while a native launch of this model exists elsewhere (another
        # TP/EP, engine release or engine): refuse and name those (issue 23 item 5).
        native = [a for a in _alternatives(plan, engine, version) if not _reference_only(a["backend"])]
        if native:
            recipe.refusals += tried + [Reason(
                f"the only {engine} {version} launch left for this layout is {chosen}, the slow reference path "
                "(do not serve); the nearest native launches follow", "failed")]
            recipe.alternatives = native
            chosen = None
    if chosen is None:
        if not recipe.refusals:
            recipe.refusals += tried
    elif tried:
        recipe.warnings += [Reason(f"{engine} {version} cannot carry out the plan's first choice — recipe uses "
                                   f"{chosen} instead. Not realizable: {r.text}", "warning", r.source, r.issue,
                                   r.confidence) for r in tried]
    recipe.warnings += list(best.warnings) if best is not None else []
    return chosen, rows


def launch_paths(plan: Plan, engine: str, version: str) -> list[LaunchPath]:
    """Every launch path ``engine`` at ``version`` has for the plan's MoE layers, ranked (:mod:`.paths`): the plan's
    correct backends grouped by the engine arguments and environment that select them (one engine row: AITER's
    families behind ``--moe-backend aiter`` are one path), each realized by the first of its backends whose checks
    pass at the engine's allocation, and costed there."""
    eng = engine_data(engine)[engine]
    members: dict[tuple, list[tuple[str, list[Decision]]]] = {}
    for backend in _candidates(plan):
        decisions = _forced(plan, backend)
        if decisions is None:
            continue
        rows = backend_rows(eng, backend, version, {d.layer.weight.dtype for d in decisions})
        key = ((tuple(a["arg"] for r in rows for a in _row_args(r, decisions[0].layer.weight.dtype)),
                tuple(sorted(_engine_env(rows).items()))) if rows else (("no-row", backend), ()))
        members.setdefault(key, []).append((backend, decisions))
    paths = []
    for (args, env), group in members.items():
        refusals: list[Reason] = []
        for backend, decisions in group:
            bad, rows, warns = _try_backend(plan, engine, version, backend, decisions)
            if not bad:
                # Costed under what the recipe exports with this path: the model caveats' dispatch variables too
                # (MiniMax-M3's VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1 changes the key AITER looks up).
                costed = {**_caveat_dispatch_env(plan, engine, backend), **dict(env)}
                costs, families = _path_outcome(plan, engine, version, backend, decisions, args, costed)
                paths.append(LaunchPath(args, env, tuple(b for b, _ in group), backend, tuple(refusals), costs,
                                        families, rows=tuple(rows), warnings=tuple(warns)))
                break
            refusals += [Reason(f"{backend}: {r.text}", "failed", r.source, r.issue, r.confidence) for r in bad]
        else:
            paths.append(LaunchPath(args if args and args[0] != "no-row" else (), env, tuple(b for b, _ in group),
                                    None, tuple(refusals)))
    return rank_paths(paths)


def _path_outcome(plan: Plan, engine: str, version: str, backend: str, decisions: list[Decision],
                  args: tuple[str, ...], env: dict[str, str]) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """(the MoE layers' total predicted time per planned token count, the families AITER runs) of ``backend``'s
    launch path at the engine's allocation under the path's environment; ``()`` costs without a runtime or where a
    layer is not predictable."""
    if plan.runtime is None:
        return (), ()
    eng = engine_data(engine)[engine]
    forced = next((a.split()[-1] for a in args if a.startswith(eng["backend_arg"])), "auto")
    full_env = {**plan.runtime.env_dict, **env}
    runtime = Runtime(tokens=plan.runtime.tokens, env=tuple(sorted(full_env.items())))
    b = plugins.get_registry().get(backend)
    by_shape: dict[Any, tuple[Any, ...]] = {}
    families: list[str] = []
    for d in decisions:
        sig = d.layer.signature()
        if sig not in by_shape:
            alloc = engine_allocation(plan, engine, version, d, full_env, forced)
            dp = dispatch_for(d.layer, plan.caps, alloc, runtime) if family_of(backend) in FUSED_MOE_FAMILIES else None
            families += [f for f in (dp.families if dp is not None else ()) if f not in families]
            by_shape[sig] = costs_for(b, d.layer, plan.caps, alloc, runtime, dispatch=dp) if b is not None else ()
    per_layer = [by_shape[d.layer.signature()] for d in decisions]
    return (total(per_layer) if all(per_layer) else ()), tuple(families)


def _layout(plan: Plan, engine: str, version: str, recipe: Recipe, moe: list[Decision]) -> Any:
    """The engine's layout of the launch (TP/EP/DP flags) at the allocation of ``recipe.backend`` and after the
    engine's load-time conversion; its errors and notes go to ``recipe``."""
    eng = engine_data(engine)[engine]
    alloc, bits, conv_what = None, None, None
    if moe:
        d0 = moe[0]
        if recipe.backend is not None:
            dd = (_forced(plan, recipe.backend) or [d0])[0]
            h, i, _, _ = engine_padding(engine, dd.layer, dd.family, version)
            alloc = (h, i)
        conv = conversion(engine, version, d0.layer, plan.caps.gfx)
        if conv:
            bits, conv_what = conv["holds_bits"], conv["what"]
            recipe.caveats.append(Reason(conv["what"], "caveat", conv["source"], None,
                                         conv.get("confidence", "confirmed")))
    layout = realize_layout(plan, engine, eng, allocation=alloc, expert_bits=bits, conversion=conv_what,
                            version=version)
    recipe.layout = layout
    recipe.refusals += layout.errors
    recipe.warnings += layout.notes
    return layout


def _env_and_args(plan: Plan, engine: str, recipe: Recipe, moe: list[Decision],
                  rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, str]], list[dict[str, str]]]:
    """({name: env entry}, args) of the launch: the chosen backend's rows (per weight dtype), the caveats that apply
    (their notes go to ``recipe``) and, with a runtime, the AITER environment the plan was made under."""
    data = engine_data(engine)
    chosen = recipe.backend
    env: dict[str, dict[str, str]] = {}
    args: list[dict[str, str]] = []
    weights = {d.layer.weight.dtype for d in moe}
    for row in rows:
        for e in row["env"]:
            env[e["name"]] = dict(e)
        by_weight = row.get("args_when_weight", {})
        special = [w for w in sorted(weights) if w in by_weight]
        args += [dict(a) for a in _row_args(row, special[0] if special else "")]
    for cav in data.get("caveat", []):
        if not _caveat_applies(cav, engine, plan, chosen, moe):
            continue
        for e in cav.get("env", []):
            env[e["name"]] = dict(e)
        args += [dict(a) for a in cav.get("args", [])]
        if cav.get("note"):
            recipe.caveats.append(Reason(cav["note"], "caveat", cav.get("source"), None,
                                         cav.get("confidence", "confirmed")))
    if chosen is not None and plan.runtime is not None:
        _runtime_env(plan, chosen, env)
    return env, args


def _name_after_what_runs(plan: Plan, engine: str, version: str, recipe: "Recipe", moe: list[Decision]) -> None:
    """An aiter.fused_moe launch is named after a family AITER runs there: when AITER runs none of the realized
    backend's family at the engine's allocation, another AITER backend that the engine realizes with the same
    arguments and environment and whose family runs takes the name (a note says so); with none, a warning says the
    name is the plan's check, not what runs."""
    if not recipe.runs:
        return
    ran = {f for run in recipe.runs for fams in run["families"] for f in fams.split("+")}
    if family_of(recipe.backend) in ran:
        return
    counts = Counter(f for run in recipe.runs for st in run["steps"] for f in st["family"].split("+"))
    for fam, _ in counts.most_common():
        other = next((b for b in _candidates(plan) if family_of(b) == fam), None)
        decisions = _forced(plan, other) if other else None
        if not decisions:
            continue
        refusals, rows, _ = _try_backend(plan, engine, version, other, decisions)
        args = [a["arg"] for r in rows for a in _row_args(r, moe[0].layer.weight.dtype)]
        if not refusals and set(args) <= {a["arg"] for a in recipe.args}:
            recipe.warnings.append(Reason(
                f"the launch is aiter.fused_moe; AITER runs {fam} there, not {family_of(recipe.backend)}: named "
                f"{other} (moedispatch checked {recipe.backend} and {other} for it; both hold)", "note"))
            recipe.backend = other
            return
    recipe.warnings.append(Reason(
        f"the launch is aiter.fused_moe: at {engine}'s allocation AITER runs {', '.join(counts)}, not "
        f"{family_of(recipe.backend)}; '{recipe.backend}' names the family whose rules moedispatch checked the "
        "allocation against", "warning"))


def engine_allocation(plan: Plan, engine: str, version: str, d: Decision, env: dict[str, str],
                      forced: str) -> Padding:
    """The allocation and pad arguments the engine release hands the kernel for ``d``'s layer on the recipe's path:
    the engine model's own answer where it models this release (checked against its real code), else
    capability_db/engines.toml's rows."""
    layer = d.layer
    h, i, kh, ki = engine_padding(engine, layer, d.family, version)
    choice = modelled_choice(engine, version, layer, plan.caps, env, forced, plan.model.quant_method)
    if choice is not None and choice.ok and choice.hidden and choice.intermediate_per_rank:
        if (choice.hidden, choice.intermediate_per_rank) != (h, i):
            h, i = choice.hidden, choice.intermediate_per_rank
            kh = ki = None
    hp, ip = h - layer.hidden, i - layer.intermediate_per_rank
    return Padding(hidden=h, intermediate_per_rank=i, hidden_pad=hp, intermediate_pad=ip,
                   kernel_hidden_pad=hp if kh is None else min(kh, hp),
                   kernel_intermediate_pad=ip if ki is None else min(ki, ip), zero_fill=bool(hp or ip))


def engine_runs(plan: Plan, engine: str, version: str, recipe: "Recipe") -> list[dict[str, Any]]:
    """Per MoE layer group of an aiter.fused_moe launch: what AITER's dispatcher runs per planned token count at the
    engine's allocation, with the recipe's environment and the call shape it implies (e.g. vLLM's fused shared
    expert). Empty for a launch outside aiter.fused_moe or a plan without a runtime."""
    if plan.runtime is None or family_of(recipe.backend) not in FUSED_MOE_FAMILIES:
        return []
    eng = engine_data(engine)[engine]
    env = {**plan.runtime.env_dict, **{e["name"]: e["value"] for e in recipe.env}}
    forced = next((a["arg"].split()[-1] for a in recipe.args if a["arg"].startswith(eng["backend_arg"])), "auto")
    out: list[dict[str, Any]] = []
    groups: dict[tuple, list[Decision]] = {}
    for d in _forced(plan, recipe.backend) or []:
        groups.setdefault(d.layer.signature(), []).append(d)
    for ds in groups.values():
        d = ds[0]
        alloc = engine_allocation(plan, engine, version, d, env, forced)
        dp = dispatch_for(d.layer, plan.caps, alloc, Runtime(tokens=plan.runtime.tokens,
                                                             env=tuple(sorted(env.items()))))
        out.append({"layers": [x.layer.index for x in ds], "allocation": [alloc.hidden, alloc.intermediate_per_rank],
                    "kernel_pads": [alloc.kernel_hidden_pad, alloc.kernel_intermediate_pad],
                    "families": list(dp.families), "steps": [s.to_dict() for s in dp.steps],
                    "issues": [h.issue for h in dp.issues]})
    return out


_ASSUMED = "the plan's simulation of AITER's dispatch assumed it (--aiter-env / this shell)"


def _runtime_env(plan: Plan, chosen: str, env: dict[str, dict[str, str]]) -> None:
    """Export what the plan's AITER dispatch assumed (``--aiter-env`` / the shell's AITER variables) and the
    environment workarounds of kernel × bucket bugs the chosen path would otherwise hit: the plan is correct only
    with them."""
    decisions = [d for d in plan.decisions if d.backend == chosen and d.dispatch is not None]
    if not decisions:
        return
    for name, value in plan.runtime.env if plan.runtime is not None else ():
        env.setdefault(name, {"name": name, "value": value,
                              "why": _ASSUMED,
                              "source": "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py"})
    for d in decisions[:1]:
        for hit in d.dispatch.issues:
            if hit.severity != "error":
                continue
            for name, value in hit.workaround_env:
                env.setdefault(name, {"name": name, "value": value,
                                      "why": f"workaround of {hit.issue}: without it AITER runs {hit.kernel} for "
                                             + (f"token {hit.tokens[0]}" if hit.tokens[0] == hit.tokens[1] else
                                                f"tokens {hit.tokens[0]}–{hit.tokens[1]}") + f" ({hit.effect})",
                                      "source": hit.source})
    current = {name: e["value"] for name, e in env.items()}
    for name, entry in env.items():
        if name in AITER_ENV and "numerics" not in entry:
            numerics = _numerics(plan, decisions[0], name, current)
            if numerics:
                entry["numerics"] = numerics


def _numerics(plan: Plan, d: Decision, name: str, env: dict[str, str]) -> str | None:
    """What exporting ``name`` changes numerically for ``d``'s layer under the simulated call shape
    (:func:`moedispatch.plan.whatif.numerics_change`, env with ``name`` against env without it; issue 23 item 4)."""
    tokens = plan.runtime.tokens if plan.runtime is not None else ()
    return numerics_change(d.layer, plan.caps, d.padding, tokens, env, {k: v for k, v in env.items() if k != name})


def _realized_with_switch(plan: Plan, engine: str, version: str | None, first: "Recipe") -> "Recipe | None":
    """When ``first`` (the recipe of the plan as it is) does not realize the plan's first choice: a recipe that does
    under one of the what-if AITER switches, or None."""
    wanted = next((d.backend for d in plan.decisions if d.layer.kind == "moe" and d.backend), None)
    if wanted is None or (first.ok and first.backend == wanted):
        return None
    if plan.runtime is None or not any(d.family in FUSED_MOE_FAMILIES for d in plan.decisions if d.backend == wanted):
        return None
    for switch, why, source, variant in switch_variants(plan.runtime):
        try:
            alt = plan_model(plan.model, plan.caps, plan.tp, plan.ep, warnings=[
                w for w in plan.warnings], runtime=variant)
        except MoedispatchError:
            continue
        r = build_recipe(alt, engine, version, alternatives=False, switches=False)
        if r.ok and r.backend == wanted:
            r.plan = alt
            for e in r.env:  # the switch's own reason where the recipe had no other than "the plan assumed it"
                if (e["name"], e["value"]) in switch and e["why"] == _ASSUMED:
                    e.update(why=f"{why}: {engine} {r.version} allocates what AITER runs natively only with it",
                             source=source)
            # the switch is part of the AITER launch paths it made realizable; the paths without it stay, refused
            r.paths = rank_paths([replace(q, env=tuple(sorted({**dict(q.env), **dict(switch)}.items())))
                                  if family_of(q.backend) in FUSED_MOE_FAMILIES else q for q in r.paths]
                                 + [q for q in first.paths if not q.ok])
            names = " ".join(f"{k}={v}" for k, v in switch)
            r.warnings.insert(0, Reason(
                f"{engine} {r.version} allocates what AITER runs natively only with {names} ({why}); the recipe "
                f"exports it — `moedispatch explain … --aiter-env` with it shows that plan", "note", source))
            return r
    return None


def _caveat_dispatch_env(plan: Plan, engine: str, backend: str) -> dict[str, str]:
    """The environment the model caveats that apply to ``backend`` export and AITER's dispatch reads (AITER_ENV)."""
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    return {e["name"]: e["value"] for cav in engine_data(engine).get("caveat", [])
            if _caveat_applies(cav, engine, plan, backend, moe) for e in cav.get("env", []) if e["name"] in AITER_ENV}


def _caveat_applies(cav: dict[str, Any], engine: str, plan: Plan, backend: str | None,
                    moe: list[Decision]) -> bool:
    if cav["engine"] != engine:
        return False
    if "models" in cav and plan.model.name not in cav["models"]:
        return False
    if "model_types" in cav and plan.model.model_type not in cav["model_types"]:
        return False
    if "gfx" in cav and plan.caps.gfx not in cav["gfx"]:
        return False
    if "when_backends" in cav and backend not in cav["when_backends"]:
        return False
    if "quant" in cav and not any(d.layer.weight.dtype in cav["quant"] for d in moe):
        return False
    return not (cav.get("min_ep", 1) > plan.ep or plan.ep > cav.get("max_ep", plan.ep))


def _replan(plan: Plan, tp: int, ep: int, runtime: Any = None) -> Plan | None:
    """The plan re-made at ``tp``/``ep`` (no forced backend; ``runtime``: the run-time assumptions to keep), or None
    when the layout cannot shard the model or no backend runs it."""
    try:
        return plan_model(plan.model, plan.caps, tp, ep, warnings=[], runtime=runtime)
    except MoedispatchError:
        return None


def _reference_only(backend: str | None) -> bool:
    """True for a registered backend that is the slow reference path (``Backend.reference_only``)."""
    b = plugins.get_registry().get(backend) if backend else None
    return bool(getattr(b, "reference_only", False))


def _alternatives(plan: Plan, engine: str, version: str) -> list[dict[str, Any]]:
    """The nearest safe launches: same engine release at another TP/EP, another release, the other engine."""
    out: list[dict[str, Any]] = []
    if any(d.forced for d in plan.decisions if d.layer.kind == "moe"):
        # A forced --backend is the nearest change of all: the same layout with the selector's own choice.
        # the plan's own runtime: the recipe may need an AITER switch to realize the selector's choice
        alt = _replan(plan, plan.tp, plan.ep, plan.runtime)
        r = build_recipe(alt, engine, version, alternatives=False) if alt is not None and alt.ok else None
        if r is not None and r.ok:
            out.append({"change": "drop --backend", "engine": engine, "engine_version": version,
                        "backend": r.backend, "command": r.command, "env": _env_of(r)})
            return out
    layouts = []
    for tp in sorted({1, 2, 4, 8, plan.tp}):  # the plan's own TP too: at TP 64, EP 64 is the nearest change
        for ep in sorted({1, tp}):
            if (tp, ep) != (plan.tp, plan.ep):
                layouts.append((abs(tp - plan.tp) + (ep != plan.ep), tp, ep))
    for _, tp, ep in sorted(layouts):
        alt = _replan(plan, tp, ep)
        if alt is None or not alt.ok:
            continue
        r = build_recipe(alt, engine, version, alternatives=False)
        if r.ok:
            out.append({"change": f"--tp {tp}" + (f" --ep {ep}" if ep > 1 else ""), "engine": engine,
                        "engine_version": version, "backend": r.backend, "command": r.command, "env": _env_of(r)})
            break
    eng = engine_data(engine)[engine]
    for rel in reversed(eng.get("releases", [])):
        if rel == version:
            continue
        r = build_recipe(plan, engine, rel, alternatives=False)
        if r.ok:
            out.append({"change": f"--engine-version {rel}", "engine": engine, "engine_version": rel,
                        "backend": r.backend, "command": r.command, "env": _env_of(r)})
            break
    other = next(e for e in ENGINES if e != engine)
    r = build_recipe(plan, other, None, alternatives=False)
    if r.ok:
        out.append({"change": f"--recipe {other}", "engine": other, "engine_version": r.version,
                    "backend": r.backend, "command": r.command, "env": _env_of(r)})
    return out


def _env_of(recipe: Recipe) -> dict[str, str]:
    """The environment an alternative's command needs (its recipe's exports: the command alone may not start, e.g.
    vLLM's ``--moe-backend aiter`` without ``VLLM_ROCM_USE_AITER=1``)."""
    return {e["name"]: e["value"] for e in recipe.env}


def _hf_id(name: str) -> str | None:
    for entry in builtin_models():
        if entry["name"] == name:
            return entry.get("hf_id")
    return None


def _tok(tokens: list[int]) -> str:
    lo, hi = tokens
    return f"token {lo}" if lo == hi == 1 else f"tokens {lo}" if lo == hi else f"tokens {lo}–{hi}"


def _fmt_line(item: dict[str, str]) -> str:
    numerics = f"; {item['numerics']}" if item.get("numerics") else ""
    return f"{item['why']} ({item['source']}){numerics}"


def render_recipe(plan: Plan, engine: str, *, fmt: str = "table", version: str | None = None,
                  recipe: Recipe | None = None) -> str:
    recipe = recipe or build_recipe(plan, engine, version)
    plan = recipe.plan or plan  # the plan the recipe realizes (re-made under an AITER env switch when needed)
    if fmt == "json":
        out = recipe.to_dict()
        out["plan_fingerprint"] = plan.fingerprint
        out["plan"] = plan_to_json(plan)
        # --- issue 17 (engine_choice owner): per MoE layer group, what the engine does on its own (auto) and with the
        # recipe's forced value, both with the recipe's env, and whether that differs from the plan.
        out.update(recipe_engine_groups(plan, recipe))
        # --- end issue 17
        return json.dumps(out, indent=2) + "\n"
    caps = plan.caps
    mode = capdb.partition_of(caps.gfx, caps.product, caps.compute_units)
    lines = [f"# {engine} {recipe.version} recipe for {plan.model.name} on {caps.arch_label}"
             + (f", {mode} partition ({caps.compute_units} CUs)" if mode else "")
             + (f", AITER {caps.aiter_version}" if caps.aiter_version else ", no AITER")
             + f", tp={plan.tp}" + (f" (attention {plan.attention_tp})" if plan.attention_tp else "")
             + f" ep={plan.ep} (plan {plan.fingerprint})"]
    if recipe.layout is not None:
        lo = recipe.layout
        mem = (f"; ~{lo.weights_gib:.0f} GiB weights/rank of {lo.budget_gib:.0f} GiB usable"
               if lo.weights_gib is not None and lo.budget_gib is not None else "")
        lines.append(f"# layout: world size {lo.world} (tp {lo.tp} × dp {lo.dp}, ep {lo.ep}){mem}")
    planned = sorted({d.backend for d in plan.decisions if d.layer.kind == "moe" and d.backend})
    if recipe.backend or not planned:
        lines.append(f"# MoE plan: {recipe.backend or 'no backend'}")
    else:   # refused: the plan's own pick, which no launch of this engine release takes (it said "no backend")
        lines.append(f"# MoE plan: {', '.join(planned)}; no {engine} {recipe.version} launch runs it (below)")
    lines += [f"# {line}" for line in recipe.path_lines()]
    for run in recipe.runs:
        merged: list[list[Any]] = []
        for st in run["steps"]:
            if merged and merged[-1][0] == st["family"]:
                merged[-1][1][1] = st["tokens"][1]
            else:
                merged.append([st["family"], list(st["tokens"])])
        spans = ", ".join(f"{fam} {_tok(toks)}" for fam, toks in merged)
        lines.append(f"# AITER runs (layers {_ranges(run['layers'])}, {engine}'s allocation {run['allocation'][0]} × "
                     f"{run['allocation'][1]}/rank): {spans}")
    for w in recipe.warnings:
        lines.append(f"# WARNING: {w.marked().removeprefix('caveat ')}")  # the label once (newcomer minor 6)
    if not recipe.ok:
        lines.append(f"# NO SAFE LAUNCH: {engine} {recipe.version} cannot carry out this plan:")
        for r in recipe.refusals:
            lines.append(f"#   - {r.marked()}")
        if recipe.alternatives:
            lines.append("# nearest safe alternatives:")
            for a in recipe.alternatives:
                lines.append(f"#   {a['change']}: {a['engine']} {a['engine_version']}, MoE on {a['backend']}")
        else:
            lines.append("# no safe alternative found (other TP/EP, releases, engine)")
        return "\n".join(lines) + "\n"
    for e in recipe.env:
        lines.append(f"# {_fmt_line(e)}")
        lines.append(f"export {e['name']}={e['value']}")
    for a in recipe.args:
        lines.append(f"# {a['arg']}: {_fmt_line(a)}")
    lines.append(recipe.command or "")
    for c in recipe.caveats:
        lines.append(f"# caveat: {c.marked()}")
    return "\n".join(lines) + "\n"
