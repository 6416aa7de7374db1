"""Compare moedispatch's answers with AITER's, point by point; classify every disagreement; summarise.

A point (case × token count) agrees strictly when AITER did not raise and moedispatch predicted a run, and
stages, stage-1 and stage-2 (family, kernel name), the 1-stage ASM op (where moedispatch names one), xbf16, the
block_m handed to ``moe_sorting``, ksplit and the activation dtype (``q_dtype_a``) are all equal — or when both
say AITER raises (same exception type).

Every disagreement gets a class from ``CLASSES`` (the first whose test matches; each names the AITER source line
that causes it), else ``unclassified``. The summary keeps per-target/per-part counts, per-field agreement, and up to
three examples per class.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

FIELDS = ("outcome", "stages", "stage1.family", "stage1.kernel", "stage2.family", "stage2.kernel", "api", "xbf16",
          "block_m", "ksplit", "q_dtype_a")


def aiter_view(p: dict) -> dict:
    """AITER's point in the comparison's vocabulary."""
    v: dict[str, Any] = {"outcome": "raise" if "error" in p else "run", "error": p.get("error")}
    if "stages" in p:
        v["stages"] = p["stages"]
        v["stage1"] = {"family": p["stage1"]["family"], "kernel": p["stage1"]["kernel"]} if p.get("stage1") else None
        v["stage2"] = ({"family": p["stage2"]["family"], "kernel": p["stage2"]["kernel"]}
                       if p.get("stage2") and p["stages"] == 2 else None)
        v["xbf16"] = bool(p["stage1"]["xbf16"]) if p.get("stage1") and p["stages"] == 1 else False
        v["api"] = p.get("asm_op") if p["stages"] == 1 else None
        v["ksplit"] = p.get("ksplit")
        v["block_m"] = p.get("block_m", p.get("md_block_m"))
    v["q_dtype_a"] = p.get("q_dtype_a")
    v["info"] = p.get("info")
    v["token"] = p.get("token")
    return v


def _get(d: dict, path: str):
    cur: Any = d
    for part in path.split("."):
        if cur is None:
            return None
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def diff(model: dict, aiter: dict) -> list[str]:
    """The fields on which the two answers differ (empty: strict agreement)."""
    if model["outcome"] == "raise" or aiter["outcome"] == "raise":
        if model["outcome"] == aiter["outcome"]:
            same = (model.get("raises") or "").split(":")[0] == (aiter.get("error") or "").split(":")[0]
            return [] if same else ["outcome"]
        return ["outcome"]
    out = []
    for f in FIELDS[1:]:
        if f == "api" and model.get("api") is None:
            continue  # moedispatch names the ASM op only for heuristic 1-stage steps
        if f.startswith("stage2") and model.get("stages") != 2:
            continue
        if _get(model, f) != _get(aiter, f):
            out.append(f)
    return out


# -- disagreement classes -----------------------------------------------------------------------------------------

class Class:
    """A root cause: ``test(case, moedispatch point, AITER point, differing fields)``; ``kinds``: the AITER source
    kinds (``git``/``tree``: ROCm/aiter at a commit, ``wheel``: the PyPI wheel) whose line numbers ``cause`` cites."""

    def __init__(self, name: str, what: str, cause: str, test: Callable[[dict, dict, dict, list], bool],
                 kinds: tuple[str, ...] = ("git", "tree")):
        self.name, self.what, self.cause, self.test, self.kinds = name, what, cause, test, kinds


FP8 = "torch.float8_e4m3fn"
FNUZ = "torch.float8_e4m3fnuz"
_AT = "ROCm/aiter@e4048607 aiter/fused_moe.py"


def _err(a: dict, text: str) -> bool:
    return a["outcome"] == "raise" and text in (a.get("error") or "")


def _fams(v: dict) -> tuple:
    return ((v.get("stage1") or {}).get("family"), (v.get("stage2") or {}).get("family"))


#: Root causes, most specific first. Line numbers are ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879's.
CLASSES: list[Class] = [
    Class("a16w4-situv2-guard",
          "AITER raises NotImplementedError for a16w4 SiTUv2 (bf16 activations x MXFP4 weights) under EP, with a "
          "bias, unshuffled weights or without flydsl; moedispatch plans a run",
          f"{_AT}:861-880 (_fused_moe_impl: the _is_a16w4_situv2 guards, raised before any lookup)",
          lambda c, m, a, f: _err(a, "a16w4 (bf16 A x MXFP4 W) SiTUv2") and m["outcome"] == "run"),
    Class("a4w4-port-ep",
          "a tuned flydsl_mxmoe_* (MXFP4 a4w4 FlyDSL port) row under EP: AITER raises NotImplementedError; "
          "moedispatch plans the port",
          f"{_AT}:930-939 (_fused_moe_impl: metadata.output_aux with an expert_mask raises)",
          lambda c, m, a, f: _err(a, "a4w4 FlyDSL port does not support expert-parallel") and m["outcome"] == "run"),
    Class("bypass-opus-valueerror",
          "AITER_BYPASS_TUNE_CONFIG=1 on a shape with an Opus stage-2 row: AITER keeps cfg and validates the row "
          "against the heuristic block_m, raising ValueError; moedispatch plans the heuristic",
          f"{_AT}:2452-2458 (get_2stage_cfgs: opus_stage2_launch = _opus_a8w4.parse_stage2_config(cfg, block_m) "
          "runs even when bypass_tuned_config made block_m heuristic)",
          lambda c, m, a, f: _err(a, "requires sort block_m") and m["outcome"] == "run"),
    Class("other-aiter-raise", "AITER raises where moedispatch plans a run (another exception)",
          "see the example's error", lambda c, m, a, f: a["outcome"] == "raise" and m["outcome"] == "run"),
    Class("model-raise-aiter-runs", "moedispatch predicts an exception; AITER runs", "see the example",
          lambda c, m, a, f: m["outcome"] == "raise" and a["outcome"] == "run"),
    Class("opus-row-rejected",
          "moedispatch keeps a tuned row with an Opus stage 2; AITER's run-time check rejects it (EP expert_mask, "
          "a stage-2 bias, not gfx950 or a sort block_m mismatch) and falls back to the heuristics",
          f"{_AT}:2352-2366 (get_2stage_cfgs → aiter/ops/opus/moe_stage2_a8w4.py:467-492 cfg_is_supported: "
          "is_ep → 'EP expert_mask/topk_ids are not supported', has_stage2_bias → unsupported)",
          lambda c, m, a, f: "opus" in _fams(m) and "opus" not in _fams(a)),
    Class("gfx942-mxfp8-path",
          "gfx942 per_1x32 with e4m3fn (MXFP8) weights: AITER's mxfp8 test compares with the arch's fp8 "
          "(e4m3fnuz on gfx942), so the weights fall through to the generic per_1x32 (fp4x2/bf16 activations, "
          "ASM+CK or CK-Tile) path; moedispatch plans the FlyDSL a8w8 path. The model flags gfx942 MX as failing "
          "at run time",
          f"{_AT}:772 (elif quant_type == QuantType.per_1x32 and q_dtype_w == dtypes.fp8) with "
          "aiter/utility/dtypes.py:11-32 (fp8 = get_dtype_fp8(): e4m3fnuz on gfx942)",
          lambda c, m, a, f: c["key"]["gfx"] == "gfx942" and c["key"]["q_type"] == "QuantType.per_1x32"
          and c["key"]["q_dtype_w"] == FP8),
    Class("fp8-flavour",
          "only the fp8 flavour of the activation dtype differs: AITER's fp8 is per-arch (e4m3fnuz on gfx942) "
          "where moedispatch writes e4m3fn (uint32 w4a8 weights, SiTUv2 A8W4)",
          f"{_AT}:759 (q_dtype_a = w1.dtype if w1.dtype != torch.uint32 else dtypes.fp8) and :783-784 "
          "(AITER_SITUV2_A8W4 → dtypes.fp8); aiter/utility/dtypes.py:11-32 (fp8 per arch)",
          lambda c, m, a, f: set(f) <= {"q_dtype_a"} and {m.get("q_dtype_a"), a.get("q_dtype_a")} == {FP8, FNUZ}),
    Class("one-stage-op",
          "1-stage ASM op label: fused_moe_1stage picks the op from the quant type (per_1x128 → "
          "fmoe_fp8_blockscale_g1u1, per_Token+doweight → fmoe_g1u1_tkw1, …), not from fused_moe_1stage_dict's "
          "value, which moedispatch names",
          f"{_AT}:1094-1217 (fused_moe_1stage; per_1x128 → aiter.fmoe_fp8_blockscale_g1u1 at :1178-1184) vs "
          "fused_moe_1stage_dict at :1281-1307",
          lambda c, m, a, f: f == ["api"]),
    Class("cktile-stage2-name",
          "a tuned row names a CK-Tile stage-2 kernel (cktile_*): AITER builds cktile_moe_stage2 without a kernel "
          "name, so the name is dropped (label only: family, block_m and ksplit agree)",
          f"{_AT}:2584-2590 (is_cktile2: functools.partial(cktile_moe_stage2, n_pad_zeros=…, k_pad_zeros=…, "
          "activation=…) takes no kernelName)",
          lambda c, m, a, f: f == ["stage2.kernel"] and (a.get("stage2") or {}).get("family") == "cktile"
          and (a.get("stage2") or {}).get("kernel") == ""),
    Class("flydsl-row-without-flydsl",
          "flydsl unavailable and a tuned row names FlyDSL kernels: AITER hands those names to non-FlyDSL "
          "launchers (asm_stage1 / ck_moe_stage2_fwd), which have no such kernel; moedispatch labels the step "
          "flydsl",
          f"{_AT}:2523 (the FlyDSL branch needs is_flydsl_available()) → :2936-2976 (asm_stage1 + "
          "ck_moe_stage2_fwd with the row's names), and :2888 (a CK stage 1 row's flydsl_ stage 2 only with "
          "is_flydsl_available(), else ck_moe_stage2_fwd(kernelName=<flydsl name>) at :2909-2916)",
          lambda c, m, a, f: not c.get("flydsl", True) and any(
              str((a.get(st) or {}).get("kernel", "")).startswith("flydsl_")
              and (a.get(st) or {}).get("family") != "flydsl" for st in ("stage1", "stage2"))),
]


_WHL = "amd-aiter 0.1.7.post2.dev18 aiter/fused_moe.py"
CLASSES += [
    Class("wheel-activation-missing",
          "the layer's activation does not exist in this AITER (ActivationType has No/Silu/Gelu/Swiglu): "
          "fused_moe cannot be asked for it; moedispatch's legacy model plans a run",
          "amd-aiter 0.1.7.post2.dev18 aiter_meta/csrc/include/aiter_enum.h:5-11 (enum class ActivationType) and "
          "aiter/ops/enum.py (loads it from module_aiter_enum)",
          lambda c, m, a, f: _err(a, "not a member of this AITER's enums") and m["outcome"] == "run",
          kinds=("wheel",)),
    Class("wheel-fp8-flavour",
          "only the fp8 flavour of the activation dtype differs (uint32 w4a8 weights on gfx942): AITER's "
          "dtypes.fp8 is e4m3fnuz there, moedispatch writes e4m3fn",
          f"{_WHL}:220 (q_dtype_a = w1.dtype if w1.dtype != torch.uint32 else dtypes.fp8)",
          lambda c, m, a, f: set(f) <= {"q_dtype_a"} and {m.get("q_dtype_a"), a.get("q_dtype_a")} == {FP8, FNUZ},
          kinds=("wheel",)),
    Class("wheel-one-stage-op",
          "1-stage ASM op label: fused_moe_1stage picks the op from the quant type (per_1x128 → "
          "fmoe_fp8_blockscale_g1u1), not fused_moe_1stage_dict's value that moedispatch names",
          f"{_WHL}:313-430 (fused_moe_1stage; per_1x128 → aiter.fmoe_fp8_blockscale_g1u1 at :385-392) vs "
          "fused_moe_1stage_dict at :451ff",
          lambda c, m, a, f: f == ["api"], kinds=("wheel",)),
    Class("wheel-other-aiter-raise", "AITER raises where moedispatch plans a run", "see the example's error",
          lambda c, m, a, f: a["outcome"] == "raise" and m["outcome"] == "run", kinds=("wheel",)),
]

#: The AITER source kind being compared (set by :func:`summarise`).
_KIND = {"kind": "git"}


def classify(case: dict, model: dict, aiter: dict, fields: list[str]) -> str:
    for c in (c for c in CLASSES if _KIND["kind"] in c.kinds):
        try:
            if c.test(case, model, aiter, fields):
                return c.name
        except (KeyError, TypeError, AttributeError):
            continue
    return "unclassified"


def summarise(cases: list[dict], ours: dict, theirs: dict, src: dict) -> dict:
    """Counts per target/part, per-field agreement, classes with examples."""
    _KIND["kind"] = src.get("kind", "git")
    by_target = collections.defaultdict(lambda: [0, 0])
    by_part = collections.defaultdict(lambda: [0, 0])
    by_target_part = collections.defaultdict(lambda: [0, 0])
    field_eq = collections.Counter()
    classes: dict[str, dict] = {}
    info_diff = 0
    points = agree = 0
    model_errors = []
    for case in cases:
        mres = ours[case["id"]]
        if mres["error"]:
            model_errors.append({"id": case["id"], "label": case["label"], "error": mres["error"]})
        apts = theirs.get(case["id"], [])
        for mp, ap_raw in zip(mres["points"], apts):
            ap = aiter_view(ap_raw)
            fields = diff(mp, ap)
            points += 1
            ok = not fields
            agree += ok
            for bucket in (by_target[case["target"]], by_part[case["part"]],
                           by_target_part[(case["target"], case["part"])]):
                bucket[0] += 1
                bucket[1] += ok
            for f in FIELDS:
                if f not in fields:
                    field_eq[f] += 1
            if mp.get("info") and ap.get("info") and _norm_info(mp["info"]) != _norm_info(ap["info"]):
                info_diff += 1
            if ok:
                continue
            name = classify(case, mp, ap, fields)
            c = classes.setdefault(name, {"points": 0, "cases": set(), "fields": collections.Counter(),
                                          "targets": collections.Counter(), "examples": []})
            c["points"] += 1
            c["cases"].add(case["id"])
            c["fields"].update(fields)
            c["targets"][case["target"]] += 1
            if len(c["examples"]) < 3 and all(e["id"] != case["id"] for e in c["examples"]):
                c["examples"].append({"id": case["id"], "label": case["label"], "target": case["target"],
                                      "part": case["part"], "M": mp["M"], "fields": fields,
                                      "key": {k: v for k, v in case["key"].items()
                                              if k in ("model_dim", "inter_dim", "expert", "topk", "act_type",
                                                       "q_type", "q_dtype_w", "gate_mode", "is_ep", "has_bias")},
                                      "moedispatch": _brief(mp), "aiter": _brief(ap)})
    meta = {c.name: {"what": c.what, "cause": c.cause} for c in CLASSES}
    out_classes = {}
    for name, c in sorted(classes.items(), key=lambda kv: -kv[1]["points"]):
        out_classes[name] = {"points": c["points"], "cases": len(c["cases"]), "fields": dict(c["fields"]),
                             "targets": dict(c["targets"]), **meta.get(name, {}), "examples": c["examples"]}
    return {
        "source": {k: src.get(k) for k in ("kind", "label", "commit", "version", "origin", "file_url")},
        "points": points, "agree": agree, "agreement": round(agree / points, 6) if points else None,
        "cases": len(cases),
        "targets": {t: {"points": n, "agree": a, "agreement": round(a / n, 6)} for t, (n, a) in
                    sorted(by_target.items())},
        "parts": {p: {"points": n, "agree": a, "agreement": round(a / n, 6)} for p, (n, a) in sorted(by_part.items())},
        "target_parts": {f"{t}/{p}": {"points": n, "agree": a} for (t, p), (n, a) in sorted(by_target_part.items())},
        "field_agreement": {f: round(field_eq[f] / points, 6) if points else None for f in FIELDS},
        "info_line_differences": info_diff,
        "classes": out_classes,
        "model_errors": model_errors[:20],
    }


def _norm_info(line: str) -> str:
    return line.replace("True", "1").replace("False", "0").strip()


def _brief(v: dict) -> dict:
    keys = ("outcome", "raises", "error", "stages", "stage1", "stage2", "api", "xbf16", "block_m", "ksplit",
            "q_dtype_a", "basis", "config")
    return {k: v.get(k) for k in keys if v.get(k) is not None}


def table(summary: dict) -> str:
    lines = [f"AITER source: {summary['source'].get('label')} ({summary['source'].get('origin')}); "
             f"moedispatch rules: {summary.get('rules')}; grid {summary.get('grid')}",
             f"{'target':<10} {'points':>8} {'agree':>8} {'strict %':>9}"]
    for t, v in summary["targets"].items():
        lines.append(f"{t:<10} {v['points']:>8} {v['agree']:>8} {100 * v['agreement']:>8.2f}%")
    lines.append(f"{'all':<10} {summary['points']:>8} {summary['agree']:>8} {100 * (summary['agreement'] or 0):>8.2f}%")
    lines.append("")
    lines.append(f"{'part':<10} {'points':>8} {'agree':>8} {'strict %':>9}")
    for p, v in summary["parts"].items():
        lines.append(f"{p:<10} {v['points']:>8} {v['agree']:>8} {100 * v['agreement']:>8.2f}%")
    lines.append("")
    lines.append("disagreement classes (points / cases; fields):")
    for name, c in summary["classes"].items():
        lines.append(f"  {name}: {c['points']} / {c['cases']}; {c['fields']}; {c['targets']}")
        if c.get("cause"):
            lines.append(f"      cause: {c['cause']}")
    return "\n".join(lines)
