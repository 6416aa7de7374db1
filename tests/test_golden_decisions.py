"""Golden decisions: the full reasons (kind, text, source, issue, confidence), padding and rejections of real
deployments, compared with tests/golden/decisions.json.

Every reason a user reads is pinned here, so a changed rule, a reworded reason or a lost source shows up as a
reviewed diff of the golden file rather than passing silently. After an intended change, regenerate and review:

    python tests/test_golden_decisions.py && git diff tests/golden/

Targets are simulated from capability_db (no GPU); "probed" rows add what a probe of the installed AITER reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import QuantSpec
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.engines.recipes import build_recipe
from moedispatch.plan.plan import plan_model
from moedispatch.selector.pure import select
from moedispatch.testing import fake_capabilities

GOLDEN = Path(__file__).parent / "golden" / "decisions.json"
A3 = "0.1.15.post3"

#: (model, target, AITER, tp, ep, probed overrides): the built-in models on the targets and AITER releases where
#: their rules differ (MXFP4 W4A4/W4A16, block FP8, bf16 tiles, MXFP8, bias, swiglu, old AITER, no AITER, gfx90a).
CASES = [
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1, {}),
    ("MiniMax-M3-MXFP4", "gfx950", "0.1.14", 8, 1, {}),
    ("MiniMax-M3-MXFP4", "gfx950", "0.1.13.post1", 8, 1, {}),
    ("MiniMax-M3-MXFP4", "gfx942", A3, 8, 1, {}),
    ("gpt-oss-120b", "gfx950", A3, 1, 1, {}),
    ("gpt-oss-120b", "gfx950", A3, 2, 1, {}),
    ("gpt-oss-120b", "gfx950", "0.1.15", 2, 1, {}),
    ("gpt-oss-120b", "gfx950", "0.1.14", 8, 1, {}),
    ("gpt-oss-120b", "gfx942", A3, 8, 1, {}),
    ("gpt-oss-20b", "gfx950", "0.1.20.post1", 1, 1, {}),
    ("DeepSeek-V3", "gfx950", A3, 8, 1, {}),
    ("DeepSeek-V3", "gfx942", A3, 8, 1, {}),
    ("DeepSeek-V3", "gfx942", "none", 8, 1, {}),
    ("DeepSeek-V3", "gfx90a", "none", 8, 1, {}),
    ("DeepSeek-V3", "MI300X", A3, 8, 1, {"tuned_cu_nums": {80, 256}, "compute_units": 304}),
    ("DeepSeek-V3", "gfx950", A3, 8, 1, {"aiter_catalog": {"gfx950:fmoe_bf16_blockscaleFp8_g1u1_silu"}}),
    ("DeepSeek-V3", "gfx950", A3, 8, 1, {"aiter_catalog": {"gfx950:fmoe_bf16_pertokenFp8_g1u1_silu"}}),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx950", A3, 8, 1, {}),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx942", A3, 8, 8, {}),
    ("Qwen3-235B-A22B-Instruct-2507", "gfx942", A3, 8, 1, {}),
    ("Qwen3-235B-A22B-Instruct-2507-MXFP4", "gfx950", A3, 8, 1, {}),
    ("Qwen3-30B-A3B", "gfx950", A3, 8, 1, {}),
    ("Qwen3-30B-A3B", "gfx942", A3, 4, 1, {}),
    ("Qwen3.5-397B-A17B-MXFP4", "gfx950", A3, 8, 1, {}),
    ("MiniMax-M3-MXFP8", "gfx950", A3, 4, 1, {}),
    ("MiniMax-M3-MXFP8", "gfx950", "0.1.16.post1", 4, 1, {}),
    ("MiniMax-M3-MXFP8", "gfx942", A3, 8, 1, {}),
    ("MiniMax-M3", "gfx950", A3, 8, 1, {}),
    ("MiniMax-M2.1", "gfx950", A3, 8, 1, {}),
    ("Mixtral-8x7B", "gfx942", A3, 8, 1, {}),
    ("Mixtral-8x7B", "gfx1100", "none", 2, 1, {}),
    ("grok-1", "gfx942", A3, 8, 1, {}),
    ("grok-2", "gfx950", A3, 8, 1, {}),
    ("GLM-4.7", "gfx950", A3, 8, 1, {}),
    ("Kimi-K2", "gfx942", A3, 8, 1, {}),
    ("Kimi-K2", "gfx950", A3, 8, 1, {}),
    ("Llama-4-Scout-17B-16E", "gfx942", A3, 8, 1, {}),
    ("Llama-4-Maverick-17B-128E-Instruct-FP8", "gfx950", A3, 8, 1, {}),
]

#: Layers no built-in model has yet (select_moe_backend fields), on the AITER releases where their rules change:
#: Kimi-K3's SiTUv2 (a16w4 / a4w4, EP, bias; ROCm/aiter#4397, #4463, #4502), W4A4 with EP past the RadeonFlow port
#: (ROCm/aiter#3832), int4 and W4A8 with EP (vllm-project/vllm#44400; SemiAnalysisAI/InferenceX#1266).
_SITU = dict(hidden=7168, intermediate=2048, experts=384, top_k=8, tp=8, weight="mxfp4", activation="situv2",
             model_type="kimi_k3")
LAYERS = [
    ("situv2 a16w4", dict(_SITU, act="bf16"), "gfx950", "0.1.15.post3"),
    ("situv2 a16w4", dict(_SITU, act="bf16"), "gfx950", "0.1.19"),
    ("situv2 a16w4", dict(_SITU, act="bf16"), "gfx942", "0.1.19"),
    ("situv2 a16w4 ep8 bias", dict(_SITU, act="bf16", ep=8, has_bias=True), "gfx950", "0.1.20.post1"),
    ("situv2 a4w4", dict(_SITU, act="mxfp4"), "gfx950", "0.1.20.post1"),
    ("w4a4 ep8", dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, ep=8, weight="mxfp4",
                      act="mxfp4", activation="silu", model_type="deepseek_v3"), "gfx950", "0.1.20.post1"),
    ("int4 ep8", dict(hidden=7168, intermediate=2048, experts=384, top_k=8, tp=8, ep=8,
                      weight=QuantSpec("int4", "group32"), act="bf16", activation="silu", model_type="kimi_k2"),
     "gfx950", "0.1.20.post1"),
    ("w4a8 ep8", dict(hidden=7168, intermediate=3072, experts=384, top_k=6, tp=8, ep=8, weight="mxfp4", act="fp8",
                      activation="silu", model_type="deepseek_v4"), "gfx950", "0.1.20.post1"),
    # the same at EP 1 and 2: the EP caveats start at ep > 1; SiTUv2's NotImplementedErrors start at AITER 0.1.20
    ("situv2 a16w4 ep8 bias", dict(_SITU, act="bf16", ep=8, has_bias=True), "gfx950", "0.1.19"),
    ("situv2 a16w4 ep2", dict(_SITU, act="bf16", ep=2), "gfx950", "0.1.20.post1"),
    ("situv2 a16w4 fp16 ep1", dict(_SITU, act="fp16"), "gfx950", "0.1.20.post1"),
    ("situv2 a16w4 fp16 ep2", dict(_SITU, act="fp16", ep=2), "gfx950", "0.1.20.post1"),
    ("w4a4 ep2", dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, ep=2, weight="mxfp4",
                      act="mxfp4", activation="silu", model_type="deepseek_v3"), "gfx950", "0.1.20.post1"),
    ("w4a4 ep1", dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="mxfp4", act="mxfp4",
                      activation="silu", model_type="deepseek_v3"), "gfx950", "0.1.20.post1"),
    ("int4 ep2", dict(hidden=7168, intermediate=2048, experts=384, top_k=8, tp=8, ep=2,
                      weight=QuantSpec("int4", "group32"), act="bf16", activation="silu", model_type="kimi_k2"),
     "gfx950", "0.1.20.post1"),
    ("int4 ep1", dict(hidden=7168, intermediate=2048, experts=384, top_k=8, tp=8,
                      weight=QuantSpec("int4", "group32"), act="bf16", activation="silu", model_type="kimi_k2"),
     "gfx950", "0.1.20.post1"),
    ("w4a8 ep2", dict(hidden=7168, intermediate=3072, experts=384, top_k=6, tp=8, ep=2, weight="mxfp4", act="fp8",
                      activation="silu", model_type="deepseek_v4"), "gfx950", "0.1.20.post1"),
    ("w4a8 ep1", dict(hidden=7168, intermediate=3072, experts=384, top_k=6, tp=8, weight="mxfp4", act="fp8",
                      activation="silu", model_type="deepseek_v4"), "gfx950", "0.1.20.post1"),
    # known-issue workarounds next to the tile rules: bf16 CK 224/rank (ROCm/aiter#5444), and fp8 per-tensor 192/rank
    # on gfx942, whose workaround (pad to 256, ROCm/aiter#3202) is wider than the tile rule (64)
    ("bf16 224/rank", dict(hidden=2048, intermediate=1792, experts=64, top_k=8, tp=8), "gfx942", "0.1.15.post3"),
    ("fp8 per-tensor 192/rank", dict(hidden=4096, intermediate=1536, experts=64, top_k=8, tp=8, weight="fp8",
                                     act="fp8"), "gfx942", "0.1.15.post3"),
]

#: Decisions ordered by predicted cost (a Runtime: token counts, AITER env) instead of preference alone.
RUNTIME = [
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1, (1, 64, 8192)),
    ("DeepSeek-V3", "gfx950", A3, 8, 1, (1, 512)),
    ("Qwen3-30B-A3B", "gfx942", A3, 4, 1, (4, 8192)),
]

#: Every built-in backend forced (``--backend``) onto layers that need padding, so each one's own padding plan and
#: notes are pinned even where it would not win (gpt-oss TP2 bias 1440/rank, MiniMax-M3 384/rank, DeepSeek-V3 block
#: FP8, Qwen3-30B bf16 96/rank, Qwen3-235B FP8 192/rank, an MX layer whose hidden is not a multiple of 32).
FORCED_ON = [
    ("gpt-oss-120b", "gfx950", A3, 2, 1),
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1),
    ("DeepSeek-V3", "gfx942", A3, 8, 1),
    ("Qwen3-30B-A3B", "gfx950", A3, 8, 1),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx942", A3, 8, 1),
]
ODD_MX = dict(hidden=2000, intermediate=1000, experts=8, top_k=2, tp=1, weight="mxfp4", act="bf16",
              activation="silu")
ODD_MX_HIDDEN = dict(ODD_MX, intermediate=1024)  # only the hidden is padded

#: (model, target, AITER, tp, ep, engine, engine version): recipes whose lines differ by engine and release.
RECIPES = [
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1, "vllm", "0.31.0"),
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1, "vllm", None),
    ("MiniMax-M3-MXFP4", "gfx950", A3, 8, 1, "sglang", None),
    ("gpt-oss-120b", "gfx950", A3, 2, 1, "vllm", None),
    ("gpt-oss-120b", "gfx942", A3, 8, 1, "sglang", None),
    ("MiniMax-M3-MXFP8", "gfx942", A3, 8, 1, "vllm", None),
    ("Qwen3-30B-A3B", "gfx950", A3, 8, 1, "vllm", "0.30.0"),
    ("Qwen3-30B-A3B", "gfx950", A3, 8, 1, "sglang", "0.5.20"),
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "gfx950", A3, 8, 1, "vllm", None),
    ("DeepSeek-V3", "gfx942", A3, 8, 1, "sglang", None),
    # refused launches, with the nearest safe alternatives
    ("Qwen3-30B-A3B", "MI355X", None, 3, 1, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", None, 8, 2, "vllm", None),
    ("DeepSeek-V3", "MI300X", None, 1, 1, "vllm", None),
    ("MiniMax-M3-MXFP8", "MI300X", None, 4, 1, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", None, 1, 8, "sglang", None),
    # engine-level known issues (capability_db/engines.toml [[vllm.issue]], unconfirmed ones say so)
    ("MiniMax-M3-MXFP8", "MI300X", None, 8, 8, "vllm", None),
    ("MiniMax-M3-MXFP8", "MI355X", None, 8, 8, "vllm", "0.24.0"),
    ("DeepSeek-V3", "gfx942", "none", 8, 1, "vllm", None),
]
# ... and every one of these models at TP 8 on MI300X and MI355X, through each engine's newest and oldest release
# capability_db knows (allocation rows, load-time conversions, engine known issues and gates differ by release).
RECIPES += [(m, t, None, 8, 1, e, v) for m in ("MiniMax-M3-MXFP8", "MiniMax-M3-MXFP4", "gpt-oss-120b", "DeepSeek-V3",
                                               "Qwen3-235B-A22B-Instruct-2507-FP8", "Qwen3-30B-A3B")
            for t in ("MI300X", "MI355X") for e, v in (("vllm", None), ("vllm", "0.23.0"), ("sglang", None),
                                                          ("sglang", "0.5.18"))]


def _reasons(reasons) -> list[list]:
    return [[r.kind, r.text, r.source, r.issue, r.confidence] for r in reasons]


def _case_id(case) -> str:
    model, target, aiter, tp, ep, extra = case
    probed = ";".join(f"{k}={sorted(v) if isinstance(v, (set, frozenset)) else v}" for k, v in sorted(extra.items()))
    return f"{model} {target} aiter={aiter} tp={tp} ep={ep}" + (f" probed {probed}" if extra else "")


def decision_record(case, backends, layer=None, runtime=None, force=None) -> dict:
    model, target, aiter, tp, ep, extra = case
    caps = fake_capabilities(target, aiter, **extra)
    if layer is None:
        layer = next(la for la in expand_layers(load_model(model), tp, ep) if la.kind == "moe")
    try:
        d = select(layer, caps, backends, force, runtime=runtime)
    except NoBackendError as exc:
        d = exc.decision
    return {
        "backend": d.backend,
        "padding": d.padding.to_dict(),
        "reasons": _reasons(d.reasons),
        "warnings": _reasons(d.warnings),
        "rejected": [{"backend": r.backend, "supported": r.supported, "reasons": _reasons(r.reasons)}
                     for r in d.rejected],
    }


def recipe_record(case, backends) -> dict:
    model, target, aiter, tp, ep, engine, version = case
    plan = plan_model(load_model(model), fake_capabilities(target, aiter), tp, ep, backends=backends)
    r = build_recipe(plan, engine, version)
    out = r.to_dict()
    out["command"] = r.command
    out["warnings"] = _reasons(r.warnings)
    out["reasons"] = _reasons(r.refusals)
    out["caveats"] = _reasons(r.caveats)
    for key in ("warning_details", "reason_details"):
        out.pop(key, None)
    return out


#: Recipe tables (the text a user pastes from): a realizable launch, a fallback with warnings, a refusal.
TABLES = [RECIPES[0], RECIPES[6], RECIPES[10], RECIPES[-1]]


def recipe_table(case, backends) -> list[str]:
    from moedispatch.engines.recipes import render_recipe

    model, target, aiter, tp, ep, engine, version = case
    plan = plan_model(load_model(model), fake_capabilities(target, aiter), tp, ep, backends=backends)
    return render_recipe(plan, engine, version=version).splitlines()  # the default format is the table


def entries(backend_names: list[str]) -> list[tuple[str, str, object]]:
    """Every golden entry: (section, key, make(backends) -> record)."""
    from moedispatch.core.layers import MoELayer
    from moedispatch.core.workload import Runtime

    out: list[tuple[str, str, object]] = []
    for c in CASES:
        out.append(("decisions", _case_id(c), lambda b, c=c: decision_record(c, b)))
    for name, fields, target, aiter in LAYERS:
        out.append(("layers", f"{name} {target} aiter={aiter}", lambda b, f=fields, t=target, a=aiter:
                    decision_record(("-", t, a, 0, 0, {}), b, layer=MoELayer.build(**f))))
    for m, t, a, tp, ep, tokens in RUNTIME:
        out.append(("runtime", f"{m} {t} aiter={a} tp={tp} ep={ep} tokens={list(tokens)}",
                    lambda b, c=(m, t, a, tp, ep, {}), tk=tokens:
                    decision_record(c, b, runtime=Runtime.build(tokens=tk, env={}))))
    for name in backend_names:
        for m, t, a, tp, ep in FORCED_ON:
            out.append(("forced", f"{m} {t} aiter={a} tp={tp} ep={ep} --backend {name}",
                        lambda b, c=(m, t, a, tp, ep, {}), n=name: decision_record(c, b, force=n)))
        for label, fields in (("odd MX hidden 2000", ODD_MX), ("odd MX hidden 2000 inter 1024", ODD_MX_HIDDEN)):
            out.append(("forced", f"{label} gfx950 --backend {name}",
                        lambda b, n=name, f=fields: decision_record(("-", "gfx950", A3, 0, 0, {}), b,
                                                                    layer=MoELayer.build(**f), force=n)))
    for c in RECIPES:
        out.append(("recipes", " ".join(str(x) for x in c), lambda b, c=c: recipe_record(c, b)))
    for c in TABLES:
        out.append(("recipe_tables", " ".join(str(x) for x in c), lambda b, c=c: recipe_table(c, b)))
    return out


def _builtin_names() -> list[str]:
    from moedispatch.selector.plugins import build_registry

    return sorted(b.name for b in build_registry().backends)


ENTRIES = entries(_builtin_names())


def regenerate() -> None:
    """Write tests/golden/decisions.json from the current code (``python tests/test_golden_decisions.py``)."""
    from moedispatch.selector.plugins import build_registry

    backends = build_registry().backends
    out: dict[str, dict] = {}
    for section, key, make in ENTRIES:
        out.setdefault(section, {})[key] = make(backends)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(out, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def _first_difference(old, new, path="") -> str:
    if type(old) is not type(new):
        return f"{path}: {old!r:.300} -> {new!r:.300}"
    if isinstance(old, dict):
        for k in sorted(set(old) | set(new)):
            if old.get(k) != new.get(k):
                return _first_difference(old.get(k), new.get(k), f"{path}/{k}")
    if isinstance(old, list):
        if len(old) != len(new):
            return f"{path}: {len(old)} entries -> {len(new)}: {new!r:.600}"
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: {old!r:.300} -> {new!r:.300}"


_GOLDEN_DATA: dict = {}


def _golden() -> dict:
    if not _GOLDEN_DATA:
        _GOLDEN_DATA.update(json.loads(GOLDEN.read_text(encoding="utf-8")))
    return _GOLDEN_DATA


@pytest.mark.parametrize("section,key,make", ENTRIES, ids=[f"{s}:{k}" for s, k, _ in ENTRIES])
def test_matches_the_golden_file(builtins, section, key, make):
    """Every reason, padding, rejection and recipe line of the real deployments above is the reviewed one."""
    golden = _golden().get(section, {})
    assert key in golden, f"no golden entry {section}:{key}: {REGENERATE}"
    now = json.loads(json.dumps(make(builtins)))
    assert now == golden[key], f"{REGENERATE}; first difference {_first_difference(golden[key], now)}"


def test_golden_file_has_no_stale_entries():
    """Every golden entry is still checked (a removed case leaves no stale expectation behind)."""
    wanted = {(s, k) for s, k, _ in ENTRIES}
    have = {(s, k) for s, entries_ in _golden().items() for k in entries_}
    assert have == wanted, f"{sorted(have ^ wanted)[:5]}: {REGENERATE}"


REGENERATE = ("differs from tests/golden/decisions.json; after an intended change regenerate with `python "
              "tests/test_golden_decisions.py` and review `git diff tests/golden/`")

if __name__ == "__main__":
    regenerate()
