"""The peer grid, and moedispatch's answers for it, through moedispatch's public API only.

Every case is a DispatchKey built by moedispatch (``dispatch_key`` from a layer of a built-in model or a synthetic
layer; for the tuned-shape part, a DispatchKey constructed from a tuned row's key), so the AITER side
(``aiter_side.py``) builds its ``fused_moe`` tensors from exactly the layer moedispatch saw. The model's answer per
token count is the ungrouped ``dispatch_token`` step (grouped plan steps would hide per-M ksplit), with
``plan_dispatch``'s warnings for the layer cases.

Runs in any Python that imports moedispatch (the project's venv or .aiter-peer-venv)::

    cases = build_cases("quick")          # list of JSON-able case dicts (key, tokens, env, assumptions, …)
    answers = model_answers(cases)        # {case id: [point, …]} normalised (see ``normalise_step``)
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from moedispatch.aiter.dispatch import plan_dispatch
from moedispatch.aiter.key import Assumptions, DispatchKey, dispatch_key
from moedispatch.aiter.rules import lookup_rules
from moedispatch.aiter.steps import kernel_family
from moedispatch.aiter.walk import dispatch_token
from moedispatch.core.errors import MoedispatchError
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.data import aiter_configs
from moedispatch.data.capdb import target_capabilities
from moedispatch.sources import models

#: The AITER version the targets are modelled with: selects the HEAD rules and the ``head`` tuned set
#: (ROCm/aiter main @ e4048607), the commit the AITER side runs.
AITER_VERSION = "0.1.20.post1"
#: target → (moedispatch product, gfx, CU count the fake rocminfo reports).
TARGETS = {"MI300X": ("gfx942", 304), "MI308X": ("gfx942", 80), "MI355X": ("gfx950", 256)}
#: The AITER being modelled (see :func:`configure`).
_CONFIG = {"version": AITER_VERSION, "configs": "head"}
TOKENS = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_TOKENS = (1, 4, 32, 64, 256, 1024, 4096)
TP = (1, 2, 4, 8)
EP = (1, 8)

#: Synthetic (weight, activation QuantSpec, MoE activation) pairs: AITER's fused_moe weight schemes.
_FP8A = QuantSpec("fp8", "token", scale_dtype="fp32", dynamic=True)
SCHEMES = {
    "bf16": (QuantSpec("bf16"), QuantSpec("bf16"), ("silu", "gelu")),
    "fp8_tensor": (QuantSpec("fp8", "tensor", scale_dtype="fp32"), QuantSpec("fp8", "tensor", scale_dtype="fp32",
                                                                             dynamic=True), ("silu", "gelu")),
    "fp8_token": (QuantSpec("fp8", "channel", scale_dtype="fp32"), _FP8A, ("silu", "gelu")),
    "fp8_block": (QuantSpec("fp8", "block128x128", scale_dtype="fp32"),
                  QuantSpec("fp8", "group128", scale_dtype="fp32", dynamic=True), ("silu", "gelu")),
    "mxfp4": (QuantSpec("mxfp4", "group32", scale_dtype="e8m0"), QuantSpec("mxfp4", "group32", scale_dtype="e8m0",
                                                                           dynamic=True),
              ("silu", "swigluoai", "swigluoai_uninterleave", "situ")),
    "mxfp8": (QuantSpec("mxfp8", "group32", scale_dtype="e8m0"), QuantSpec("mxfp8", "group32", scale_dtype="e8m0",
                                                                           dynamic=True),
              ("silu", "swigluoai", "swigluoai_uninterleave")),
    "int4_g32": (QuantSpec("int4", "group32", scale_dtype="bf16"), QuantSpec("bf16"), ("silu", "swigluoai")),
    "int4_channel": (QuantSpec("int4", "channel", scale_dtype="fp32"), _FP8A, ("silu", "gelu")),
    "int8_token": (QuantSpec("int8", "channel", scale_dtype="fp32"),
                   QuantSpec("int8", "token", scale_dtype="fp32", dynamic=True), ("silu", "gelu")),
}
SYN = {
    "full": dict(dims=(2048, 2880, 4096, 6144, 7168),
                 inters=(96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048, 3072),
                 experts=((8, 2), (128, 8), (257, 9))),
    "ci": dict(dims=(2048, 2880, 7168), inters=(96, 128, 256, 384, 512, 768, 1536, 3072),
               experts=((8, 2), (128, 8), (257, 9))),
    "quick": dict(dims=(2880, 7168), inters=(128, 384, 1536), experts=((8, 2), (257, 9))),
}


def caps_for(target: str):
    caps = target_capabilities(target, _CONFIG["version"])
    gfx, cu = TARGETS[target]
    if (caps.gfx, caps.compute_units) != (gfx, cu):
        raise RuntimeError(f"{target}: capability_db says {caps.gfx}/{caps.compute_units}, expected {gfx}/{cu}")
    return caps


def _key_dict(key: DispatchKey) -> dict:
    return dataclasses.asdict(key)


def _case(cid: int, part: str, target: str, label: str, key: DispatchKey, tokens, *, assumptions: Assumptions,
          env: dict | None = None, layer: MoELayer | None = None, ep: int = 1, has_bias: bool = False) -> dict:
    return {"id": cid, "part": part, "target": target, "label": label, "key": _key_dict(key), "tokens": list(tokens),
            "env": dict(env or {}), "flydsl": assumptions.flydsl_available, "shuffled": assumptions.weights_shuffled,
            "has_bias": bool(getattr(key, "has_bias", has_bias)), "ep": ep,
            "assumptions": {k: v for k, v in dataclasses.asdict(assumptions).items() if v is not None},
            "_layer": layer, "_assumptions": assumptions}


#: AITER environment settings the ``env`` part runs the built-in models under (``full``: all; ``ci``: the first 3).
#: Each (target, environment) is one AITER process: several are read once, at import (e.g.
#: GPTOSS_SWIGLU_MXFP4_BF16_BOUND, aiter/fused_moe.py line 76) or cached per process (CU_NUM).
ENVS = ({"AITER_BYPASS_TUNE_CONFIG": "1"}, {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"}, {"AITER_KSPLIT": "4"},
        {"AITER_FLYDSL_FORCE": "0"}, {"AITER_BF16_FP8_MOE_BOUND": "0"}, {"AITER_BF16_FP8_MOE_BOUND": "1024"},
        {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "1024"}, {"AITER_KSPLIT": "-1"}, {"AITER_XBFLOAT16": "1"},
        {"AITER_SITUV2_A8W4": "1"}, {"AITER_SITUV2_A4W4": "1"}, {"CU_NUM": "128"})


def _variants(lay: MoELayer, grid: str):
    """(part, Assumptions, env) runs of one built-in model layer: the defaults, then (``ci``/``full``) the
    assumption variants and environment settings."""
    yield "models", Assumptions(), {}
    if grid == "quick":
        return
    yield "variants", Assumptions(flydsl_available=False), {}
    yield "variants", Assumptions(weights_shuffled=False), {}
    if lay.shared_experts:
        yield "variants", Assumptions(fused_shared_expert=True), {}
    if lay.ep > 1:
        yield "variants", Assumptions(ep_fake_slot=True), {}
    if lay.activation.startswith("swigluoai"):
        flip = "separated" if lay.activation == "swigluoai" else "interleave"
        yield "variants", Assumptions(gate_mode=flip), {}
    for env in ENVS[:3] if grid == "ci" else ENVS:
        yield "env", Assumptions(), dict(env)


def _tuned_envs(act: str, grid: str):
    """Environments the tuned shapes run under: none; (``ci``/``full``) the tuned-config bypass; (``full``) fp8
    activations from M=1, and SiTUv2's a8w4 / a4w4 switches (their own tuned files)."""
    yield {}
    if grid == "quick":
        return
    yield {"AITER_BYPASS_TUNE_CONFIG": "1"}
    if grid == "full":
        yield {"AITER_BF16_FP8_MOE_BOUND": "0"}
        if act == "ActivationType.Situv2":
            yield {"AITER_SITUV2_A8W4": "1"}
            yield {"AITER_SITUV2_A4W4": "1"}


def _describe(a: Assumptions, env: dict) -> str:
    bits = [f"{k}={v}" for k, v in dataclasses.asdict(a).items()
            if v is not None and v != getattr(Assumptions(), k)]
    bits += [f"{k}={v}" for k, v in env.items()]
    return "[" + ", ".join(bits) + "]"


def build_cases(grid: str = "ci") -> list[dict]:
    """The grid: ``quick`` (fast iteration), ``ci`` (the test's default) or ``full``.

    * models: every built-in model × TP {1,2,4,8} × EP {1,8}, each distinct MoE DispatchKey once per target;
    * variants / env (``ci``, ``full``): the same layers under other Assumptions (flydsl unavailable, unshuffled
      weights, fused shared expert, the EP fake slot, the other gate layout) and AITER environment settings;
    * synthetic: model_dim × inter_dim × (experts, top-k) × weight scheme × activation per target;
    * tuned: every distinct tuned shape of the ``head`` set on its target (per_1x32 in both gate layouts), and the
      same keys under EP8 with the caller's fake top-k slot (``tuned-ep``).
    """
    tokens = QUICK_TOKENS if grid == "quick" else TOKENS
    cases: list[dict] = []
    seen: set = set()

    def add(part, target, label, key, **kw):
        sig = (part, tuple(sorted(_key_dict(key).items())), kw.get("has_bias", False),
               tuple(sorted(dataclasses.asdict(kw["assumptions"]).items())), tuple(sorted((kw.get("env") or {}).items())))
        if sig in seen:
            return
        seen.add(sig)
        cases.append(_case(len(cases), part, target, label, key, tokens, **kw))

    # -- built-in models
    names = [m["name"] for m in models.builtin_models()]
    if grid == "quick":
        names = [n for n in names if n in ("DeepSeek-V3", "gpt-oss-120b", "Kimi-K3-MXFP4", "MiniMax-M3-MXFP4",
                                           "Qwen3-30B-A3B", "Kimi-K2.5", "Llama-4-Maverick-17B-128E-Instruct-FP8")]
    for target in TARGETS:
        caps = caps_for(target)
        for name in names:
            model = models.load_model(name)
            for tp, ep in itertools.product(TP, EP):
                try:
                    layers = [lay for lay in models.expand_layers(model, tp, ep) if lay.kind == "moe"]
                except MoedispatchError:
                    continue
                uniq = {}
                for lay in layers:
                    uniq.setdefault((lay.hidden, lay.intermediate_per_rank, lay.experts_per_rank, lay.top_k,
                                     lay.activation, lay.weight, lay.act, lay.has_bias), lay)
                for lay in uniq.values():
                    for part, a, env in _variants(lay, grid):
                        try:
                            key = dispatch_key(lay, caps, assumptions=a, env=env, model=_CONFIG["version"])
                        except MoedispatchError:
                            continue
                        tag = "" if part == "models" else " " + _describe(a, env)
                        add(part, target, f"{name} TP{tp} EP{ep}{tag}", key, assumptions=a, layer=lay, ep=ep,
                            has_bias=lay.has_bias, env=env)
    # -- synthetic layers
    syn = SYN[grid]
    for target in TARGETS:
        caps = caps_for(target)
        for scheme, (w, act, acts) in SCHEMES.items():
            for activation, dim, inter, (e, k) in itertools.product(acts, syn["dims"], syn["inters"],
                                                                     syn["experts"]):
                try:
                    lay = MoELayer.build(hidden=dim, intermediate=inter, experts=e, top_k=k, tp=1,
                                         activation=activation, weight=w, act=act, model=f"syn-{scheme}")
                    key = dispatch_key(lay, caps, assumptions=Assumptions(), env={}, model=_CONFIG["version"])
                except MoedispatchError:
                    continue
                add("synthetic", target, f"{scheme} {activation} D{dim} I{inter} E{e} k{k}", key,
                    assumptions=Assumptions(), layer=lay)
    # -- tuned shapes of the head set (and under EP8 with the fake slot)
    cs = config_set()
    shapes = []
    for row in cs.rows:
        if row.tag:
            continue
        tgt = next((t for t, (g, c) in TARGETS.items() if (row.gfx or g) == g and row.cu_num == c), None)
        if tgt is None:
            continue
        s = (tgt, row.model_dim, row.inter_dim, row.expert, row.topk, row.act_type, row.dtype, row.q_dtype_w,
             row.q_type, row.use_g1u1, row.doweight_stage1)
        if s not in shapes:
            shapes.append(s)
    if grid == "quick":
        shapes = shapes[::6]
    has_bias_field = "has_bias" in {f.name for f in dataclasses.fields(DispatchKey)}
    strip = lookup_rules(_CONFIG["version"]).ep_strip
    for (tgt, md, inter, e, k, act, dt, qw, qt, g1u1, dw) in shapes:
        gfx, cu = TARGETS[tgt]
        gates = ("separated", "interleave") if qt == "QuantType.per_1x32" else ("separated",)
        for gate, ep in itertools.product(gates, (False, True)):
            biases = (False, True) if (act == "ActivationType.Swiglu" and qt == "QuantType.per_1x32") else (False,)
            for bias in biases:
                extra = {"has_bias": bias} if has_bias_field else {}
                # Under EP the caller appends the fake slot (runtime top-k + 1); releases that strip it
                # (Rules.ep_strip) look the routed top-k up, older ones the runtime width.
                key = DispatchKey(gfx=gfx, cu_num=cu, model_dim=md, inter_dim=inter, expert=e,
                                  topk=k + (1 if ep and not strip else 0), runtime_topk=k + (1 if ep else 0), act_type=act, dtype=dt, q_dtype_w=qw, q_type=qt,
                                  use_g1u1=g1u1, doweight_stage1=dw, gate_mode=gate, is_ep=ep, **extra)
                label = (f"tuned {md}x{inter} E{e} k{k} {act.split('.')[-1]} {qt.split('.')[-1]} "
                         f"{qw.split('.')[-1]} {gate}{' bias' if bias else ''}")
                for env in _tuned_envs(act, grid):
                    add("tuned-ep" if ep else "tuned", tgt, label + (f" {_describe(Assumptions(), env)}" if env
                                                                     else ""), key,
                        assumptions=Assumptions(), ep=8 if ep else 1, has_bias=bias, env=env)
    return cases


# -- moedispatch's answers --------------------------------------------------------------------------------------

_DEFAULT = re.compile(r"^(?P<base>\S+) \(default(?P<xbf16>, xbf16)?\)$")
_RAISE = re.compile(r"^[A-Z]\w*(Error|Exception)\b")


def _stage(name: str | None) -> dict | None:
    if name is None:
        return None
    m = _DEFAULT.match(name)
    base = m.group("base") if m else name
    return {"family": kernel_family(base), "kernel": "" if m else name}


def normalise_step(step, key: DispatchKey) -> dict:
    """A DispatchStep as the comparison reads it (the AITER side reports the same fields)."""
    raises = getattr(step, "raises", None)
    kernels = tuple(step.kernels)
    ans: dict[str, Any] = {"M": step.tokens[0], "stages": step.stages, "block_m": step.block_m,
                           "ksplit": int(step.ksplit), "q_dtype_a": step.q_dtype_a, "basis": step.basis,
                           "config": step.config, "family": step.family}
    if raises:
        ans["raises"] = raises
        ans["outcome"] = "raise" if _RAISE.match(raises) else "run"
    else:
        ans["outcome"] = "run"
    if ans["outcome"] == "raise":
        return ans
    ans["stage1"] = _stage(kernels[0]) if kernels else None
    ans["stage2"] = _stage(kernels[1]) if step.stages == 2 and len(kernels) > 1 else None
    # The step's own family claim wins over the family its kernel names imply (a FlyDSL-named row handed to the
    # ASM/CK launchers is "asm+ck").
    fams = step.family.split("+")
    for st, fam in zip(("stage1", "stage2"), fams if len(fams) == 2 else fams * 2):
        if ans.get(st) is not None and fam not in ("unknown", "none", ""):
            ans[st]["family"] = fam
    m = _DEFAULT.match(kernels[0]) if kernels else None
    ans["api"] = m.group("base") if (m and step.stages == 1) else None
    row = getattr(step, "row", None)
    ans["xbf16"] = bool(m and m.group("xbf16")) if step.basis != "tuned" else bool(
        row is not None and row.run_1stage and row.xbf16)
    try:
        ans["info"] = step.info_line(key)
    except Exception:  # noqa: BLE001 - a diagnostic only
        ans["info"] = None
    return ans


def model_answers(cases: list[dict]) -> dict[int, dict]:
    """{case id: {"points": [...], "warnings": [...], "error": str | None}} from moedispatch."""
    cs = config_set()
    caps = {t: caps_for(t) for t in TARGETS}
    out: dict[int, dict] = {}
    for case in cases:
        key = DispatchKey(**case["key"])
        a = case["_assumptions"]
        env = case["env"]
        res: dict[str, Any] = {"points": [], "warnings": [], "error": None}
        try:
            for M in case["tokens"]:
                step = dispatch_token(M, key, cs, env=env, assumptions=a, model=_CONFIG["version"])
                res["points"].append(normalise_step(step, key))
            lay = case.get("_layer")
            if lay is not None:
                plan = plan_dispatch(lay, caps[case["target"]], tokens=case["tokens"], env=env, configs=cs,
                                     assumptions=a)
                res["warnings"] = list(plan.warnings)
                if plan.key != key:
                    res["error"] = f"plan_dispatch key {plan.key} differs from dispatch_key {key}"
        except MoedispatchError as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"
        out[case["id"]] = res
    return out


def lookup_model_name() -> str:
    return lookup_rules(_CONFIG["version"]).name


def config_set():
    """The tuned set moedispatch reads for the AITER being modelled."""
    src = _CONFIG["configs"]
    return aiter_configs.load_config_set(src, version=None if src == "head" else _CONFIG["version"])


def public(case: dict) -> dict:
    """The JSON-able part of a case (what the AITER side is sent)."""
    return {k: v for k, v in case.items() if not k.startswith("_")}


# -- which AITER the model is asked about ------------------------------------------------------------------------



def configure(rules: str | None = None, configs: str | None = None) -> None:
    """Model another AITER: ``rules`` a version (``0.1.7.post2.dev18`` selects moedispatch's legacy rules), ``configs``
    a tuned-set source for ``aiter_configs.load_config_set`` (a release of the index or the wheel's ``aiter``
    directory). None: HEAD (``0.1.20.post1``, ``head``)."""
    _CONFIG["version"] = rules or AITER_VERSION
    _CONFIG["configs"] = configs or "head"
