"""Field corpus: real deployments, tests and bug reports nobody here wrote, replayed through the selector.

Every ``[[case]]`` of ``cases.toml`` is one sourced observation (a recipe that serves a model, an engine test, a bug
report): the model (a ``[models.*]`` entry: shape and quant with their own source), the product, the engine and its
release, the AITER version (when the source states it), TP/EP, what ran (``path``) and what happened (``outcome``).
Each row asserts that moedispatch's decision is consistent with the outcome:

- ``outcome = "works"``: the decision is on ``path``; where it is not, every backend of ``path`` is rejected with a
  *sourced* reason and the row says why in ``divergence`` (an undocumented divergence fails, so does a stale one);
- a failure (``wrong_output``, ``crash``, ``hang``, ``unsupported``): the decision is never on ``path`` — unless it
  avoids the failing configuration (``failing_inter_per_rank``), or the failure depends on the token count or EP degree
  and the decision carries it as a caveat naming ``caveat_issue``, or ``divergence`` says (with a source) why the
  failure is not the kernel's (an engine bug);
- ``field_inter_per_rank`` (or, for MX weights served by an engine, vLLM's ROCm MXFP4 round-up to 256): the planned
  per-rank intermediate is no larger than the field's working one, unless
  ``padding_reason`` says (with a source) why;
- ``expect_backend`` / ``expect_inter_per_rank`` / ``expect_reason``: exact pins where the row motivated a rule.

How to add a row: ``tests/field/README.md``.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from moedispatch import select_moe_backend
from moedispatch.core.decision import NoBackendError
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.testing import fake_capabilities, layer as make_layer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).parent
DATA = tomllib.loads((HERE / "cases.toml").read_text(encoding="utf-8"))
MODELS: dict[str, dict[str, Any]] = DATA["models"]
CASES: list[dict[str, Any]] = DATA["case"]

#: What a ``path`` value stands for: AITER's fused_moe families, any AITER path, any real kernel.
FUSED_MOE = ("aiter-ck", "aiter-cktile", "aiter-flydsl", "aiter-asm")
PATHS = {
    "aiter": FUSED_MOE,
    "aiter-any": FUSED_MOE + ("aiter-triton",),
    "any": FUSED_MOE + ("aiter-triton", "triton"),
    "triton-any": ("aiter-triton", "triton"),
}
PRODUCTS = {"MI300X": "gfx942", "MI308X": "gfx942", "MI325X": "gfx942", "MI300A": "gfx942", "MI350X": "gfx950",
            "MI355X": "gfx950"}
OUTCOMES = ("works", "wrong_output", "crash", "hang", "unsupported")
FOLLOWABLE = re.compile(r"https://[^\s;,)]+|\b[\w.-]+/[\w.-]+#\d+\b|\b[\w.-]+/[\w.-]+@[\w.+-]+:[^\s;,)]+")
REQUIRED = ("id", "model", "product", "engine", "release", "tp", "ep", "outcome", "path", "reported", "source")
MODEL_KEYS = {"builtin", "hidden", "intermediate", "experts", "top_k", "weight", "weight_granularity", "act",
              "act_granularity", "activation", "has_bias", "model_type", "swiglu_alpha", "swiglu_limit", "source",
              "confidence", "note"}


def path_backends(path: str) -> tuple[str, ...]:
    return PATHS.get(path, tuple(p.strip() for p in path.split("+")))


@lru_cache(maxsize=None)
def _builtin(name: str):
    return load_model(name)


def build_layer(case: dict[str, Any]):
    model = MODELS[case["model"]]
    tp, ep = case["tp"], case["ep"]
    if "builtin" in model:
        return next(la for la in expand_layers(_builtin(model["builtin"]), tp, ep) if la.kind == "moe")
    fields = dict(hidden_size=model["hidden"], intermediate_size=model["intermediate"],
                  num_experts=model["experts"], top_k=model["top_k"], tp_size=tp, ep_size=ep,
                  weight_quant=model["weight"], activation_quant=model["act"],
                  activation=model.get("activation", "silu"), has_bias=model.get("has_bias", False),
                  model_type=model.get("model_type", ""))
    for key, name in (("weight_granularity", "weight_granularity"), ("act_granularity", "activation_granularity"),
                      ("swiglu_alpha", "swiglu_alpha"), ("swiglu_limit", "swiglu_limit")):
        if key in model:
            fields[name] = model[key]
    return make_layer(**fields)


def decide(case: dict[str, Any]):
    caps = fake_capabilities(case["product"], case.get("aiter"))  # no "aiter": the newest capability_db knows
    try:
        return select_moe_backend(layer=build_layer(case), caps=caps)
    except NoBackendError as exc:
        return exc.decision


def _rejection(decision, backend: str):
    return next((r for r in decision.rejected if r.backend == backend), None)


def _sourced_failures(rejection) -> list:
    return [r for r in rejection.reasons if getattr(r, "kind", "failed") in ("failed", "warning") and r.source]


# -- the corpus is well-formed ---------------------------------------------------------------------------------

def test_corpus_size_and_shape():
    """≥ 150 sourced rows, unique ids, every required field, known outcomes/products/models."""
    assert len(CASES) >= 150
    ids = [c.get("id") for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)[:5]
    bad = {}
    for c in CASES:
        missing = [k for k in REQUIRED if k not in c]
        problems = missing + [p for p, ok in (
            ("outcome", c.get("outcome") in OUTCOMES), ("product", c.get("product") in PRODUCTS),
            ("model", c.get("model") in MODELS), ("source", bool(FOLLOWABLE.search(c.get("source", "")))),
            ("divergence needs a followable source", "divergence" not in c
             or bool(FOLLOWABLE.search(c["divergence"]))),
            ("padding_reason needs a followable source", "padding_reason" not in c
             or bool(FOLLOWABLE.search(c["padding_reason"])))) if not ok]
        if problems:
            bad[c.get("id")] = problems
    assert bad == {}


def test_every_model_is_sourced():
    bad = {k: sorted(set(m) - MODEL_KEYS) or "no followable source" for k, m in MODELS.items()
           if set(m) - MODEL_KEYS or not FOLLOWABLE.search(m.get("source", ""))}
    assert bad == {}


def test_versions_that_conflict_stay_keyed_by_version():
    """Rows about one deployment with different outcomes must differ in AITER or engine release."""
    groups: dict[tuple, set] = {}
    for c in CASES:
        key = (c["model"], c["product"], c["tp"], c["ep"], c["path"], c.get("aiter"), c["release"])
        groups.setdefault(key, set()).add(c["outcome"])
    assert {k: v for k, v in groups.items() if len(v) > 1} == {}


# -- each row agrees with moedispatch --------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_field_case(case):
    d = decide(case)
    path = path_backends(case["path"])
    where = f"{case['id']}: {case['reported']} ({case['source'].split(';')[0]})"
    rejected = {r.backend: r for r in d.rejected}
    if "expect_backend" in case:
        assert d.backend == (case["expect_backend"] or None), (where, d.backend, _why(d))
    if "expect_reason" in case:
        texts = [r.text for r in d.reasons] + [r.text for rej in d.rejected for r in rej.reasons]
        assert any(case["expect_reason"] in t for t in texts), (where, case["expect_reason"], texts)
    if case["outcome"] == "works":
        outranked = [b for b in path if b in rejected and rejected[b].supported]
        if d.backend in path or outranked:
            assert "divergence" not in case, f"{case['id']}: stale divergence, the decision is on {case['path']} now"
            field = case.get("field_inter_per_rank") or _engine_round_up(case, d)
            if field is not None and d.backend in path and "padding_reason" not in case:
                assert d.padding.intermediate_per_rank <= field, (where, d.backend, d.padding.intermediate_per_rank)
        else:
            assert "divergence" in case, (f"{where}: moedispatch picks {d.backend}, not {case['path']}; document the "
                                          "divergence with its source or fix the rule", _why(d))
            unsourced = [b for b in path if b in rejected and not _sourced_failures(rejected[b])]
            assert unsourced == [], (where, "rejected without a sourced reason", unsourced, _why(d))
    elif d.backend in path:
        failing = case.get("failing_inter_per_rank")
        avoided = failing is not None and d.padding.intermediate_per_rank != failing
        caveated = bool(case.get("caveat_issue")) and any(
            r.issue and case["caveat_issue"] in r.issue for r in d.reasons if r.kind in ("caveat", "warning", "note"))
        if not (avoided or caveated):
            assert "divergence" in case, (f"{where}: the source shows {case['path']} failing ({case['outcome']}) and "
                                          f"moedispatch picks {d.backend} without avoiding or flagging it", _why(d))
        else:
            assert "divergence" not in case, f"{case['id']}: stale divergence, moedispatch avoids or flags it now"
    if "expect_inter_per_rank" in case:
        assert d.padding is not None and d.padding.intermediate_per_rank == case["expect_inter_per_rank"], \
            (where, d.padding)


#: vLLM's ROCm MXFP4 round-up: the largest per-rank multiple an engine pads an MX layer to (256; 128 for the AITER
#: W4A16 SiLU/SiTU path) — vllm-project/vllm@017e9f4448:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py
#: (mxfp4_round_up_hidden_size_and_intermediate_size). A plan may not pad an MX layer beyond it without a reason.
MX_ROUND_UP = 256


def _engine_round_up(case: dict[str, Any], d) -> int | None:
    if d.padding is None or not d.layer.weight.is_mx or case["engine"] not in ("vllm", "sglang", "atom"):
        return None
    per_rank = d.layer.intermediate_per_rank
    return -(-per_rank // MX_ROUND_UP) * MX_ROUND_UP


def _why(d) -> list[str]:
    return [f"{r.backend}: {'; '.join(x.text[:120] for x in r.reasons[:3])}" for r in d.rejected]


#: The engine flag a field launch used ("MoE path: --moe-backend X" in the row's `reported`).
_FLAG = re.compile(r"MoE path: (--moe-backend [a-z_]+)")
_FLAG_CASES = [c for c in CASES if c["engine"] == "vllm" and c["outcome"] == "works" and _FLAG.search(c["reported"])]


@pytest.mark.parametrize("case", _FLAG_CASES, ids=[c["id"] for c in _FLAG_CASES])
def test_the_engine_flag_is_the_one_the_field_launched_with(case):
    """Issue 23: the engine flag comes from the release's per-quant-method map — for every vLLM launch in the corpus
    that names its --moe-backend and runs the path moedispatch decides, moedispatch's vLLM rows for that backend and
    weight dtype give the same flag (Kimi-K2.5 INT4: flydsl, not aiter)."""
    from moedispatch.engines.recipes import _row_args, backend_rows, engine_data

    d = decide(case)
    if d.backend not in path_backends(case["path"]) and case["path"] not in ("aiter", "aiter-any", "any"):
        pytest.skip(f"moedispatch decides {d.backend}, not the field's {case['path']} (test_field_case covers it)")
    eng = engine_data("vllm")["vllm"]
    rows = backend_rows(eng, d.backend, eng["newest"], {d.layer.weight.dtype})
    args = [a["arg"] for r in rows for a in _row_args(r, d.layer.weight.dtype)]
    assert _FLAG.search(case["reported"]).group(1) in args, (case["id"], d.backend, args)


def test_the_flag_check_is_not_vacuous():
    assert len(_FLAG_CASES) >= 20
    assert sum("--moe-backend flydsl" in c["reported"] for c in _FLAG_CASES) >= 2
