"""The support matrix, generated from the selector's own checks (``python -m moedispatch.render.support_matrix``).

For every arch × weight/activation quant × MoE activation × built-in backend, each backend's ``check()`` runs on a
canonical, already-aligned layer (hidden 4096, intermediate 2048, 8 experts, top-2, TP1, no bias) against a
simulated target at every AITER release capability_db knows. A cell is ✓ with the AITER range that passes, or ✗
with the reason the newest AITER fails (numbered; the reasons and their sources are listed under each table). The
output is deterministic: it depends only on the built-in plugins and capability_db, never on the installed AITER.
docs/support-matrix.md is this module's output; tests/test_support_matrix.py fails when it is stale.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

from packaging.version import Version

from moedispatch.data import capdb
from moedispatch.core.layers import MoELayer, QuantSpec
from moedispatch.data.capdb import target_capabilities
from moedispatch.selector.plugins import build_registry

__all__ = ["ARCHS", "SCHEMES", "ACTIVATIONS", "matrix", "render", "main"]

ARCHS = ("gfx942", "gfx950")
#: (label, weight, activation) — the quant schemes checkpoints ship (the quant labels and granularities of moedispatch.core.layers).
SCHEMES: tuple[tuple[str, QuantSpec, QuantSpec], ...] = (
    ("bf16 × bf16", QuantSpec("bf16"), QuantSpec("bf16")),
    ("fp8/tensor × fp8/tensor", QuantSpec("fp8", "tensor", "fp32"), QuantSpec("fp8", "tensor", "fp32")),
    ("fp8/channel × fp8/token", QuantSpec("fp8", "channel", "fp32"), QuantSpec("fp8", "token", "fp32", dynamic=True)),
    ("fp8/block128x128 × fp8/group128", QuantSpec("fp8", "block128x128", "fp32"),
     QuantSpec("fp8", "group128", "fp32", dynamic=True)),
    ("int8/channel × int8/token", QuantSpec("int8", "channel", "fp32"), QuantSpec("int8", "token", "fp32", dynamic=True)),
    ("int4/group32 × bf16", QuantSpec("int4", "group32", "fp32"), QuantSpec("bf16")),
    ("int4/channel × fp8/token", QuantSpec("int4", "channel", "fp32"), QuantSpec("fp8", "token", "fp32", dynamic=True)),
    ("mxfp4 × bf16", QuantSpec("mxfp4", "group32", "e8m0"), QuantSpec("bf16")),
    ("mxfp4 × fp8/group32", QuantSpec("mxfp4", "group32", "e8m0"), QuantSpec("fp8", "group32", "fp32", dynamic=True)),
    ("mxfp4 × mxfp4", QuantSpec("mxfp4", "group32", "e8m0"), QuantSpec("mxfp4", "group32", "e8m0", dynamic=True)),
    ("mxfp8 × mxfp8", QuantSpec("mxfp8", "group32", "e8m0"), QuantSpec("mxfp8", "group32", "e8m0", dynamic=True)),
)
#: MoE activations with the parameters their models use (gpt-oss / MiniMax-M3 SwiGLU-OAI: alpha 1.702, limit 7.0).
ACTIVATIONS: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = (
    ("silu", ()), ("gelu", ()), ("swigluoai", (("alpha", 1.702), ("limit", 7.0))),
    ("swigluoai_uninterleave", (("alpha", 1.702), ("limit", 7.0))), ("situv2", ()),
)


def _layer(weight: QuantSpec, act: QuantSpec, activation: str, params: tuple) -> MoELayer:
    return MoELayer(index=0, kind="moe", hidden=4096, intermediate=2048, intermediate_per_rank=2048, experts=8,
                    experts_per_rank=8, top_k=2, activation=activation, activation_params=params, weight=weight,
                    act=act)


def _backends() -> list[Any]:
    """The built-in backends only (the moedispatch distribution's own entry points), whatever else is installed."""
    registry = build_registry()
    builtin = {name for p in registry.plugins if p.builtin for name in p.backends}
    found = [b for b in registry.backends if b.name in builtin]
    return sorted(found, key=lambda b: (-b.preference, b.name))


def _versions() -> list[str]:
    return sorted(capdb.aiter_db()["known_versions"], key=Version)


def engine_ranges() -> dict[str, str]:
    """``{backend: "vLLM >=0.23, SGLang >=0.5.18"}`` — the engine releases whose rows in capability_db/engines.toml
    can select the backend (``unsupported`` rows excluded); a backend with no row gets no engine range."""
    data = capdb.load_toml("engines.toml")
    names = {"vllm": "vLLM", "sglang": "SGLang"}
    out: dict[str, list[str]] = {}
    for engine, label in names.items():
        for row in data.get(engine, {}).get("backend", []):
            if row.get("unsupported"):
                continue
            only = f" ({'/'.join(row['weights'])} weights)" if row.get("weights") else ""
            for backend in row.get("backends", []):
                out.setdefault(backend, []).append(f"{label} {row.get('versions', 'any')}{only}")
    return {b: ", ".join(v) for b, v in out.items()}


def _range(ok: list[str], versions: list[str]) -> str:
    if not ok:
        return ""
    if len(ok) == len(versions):
        return f"AITER {versions[0]}–{versions[-1]}"
    lo, hi = ok[0], ok[-1]
    # Contiguous runs are the rule; say where a later release drops it.
    return f"AITER ≥ {lo}" if hi == versions[-1] else f"AITER {lo}–{hi}"


def matrix() -> dict[str, Any]:
    """``{arch: [(scheme, activation, {backend: (ok, detail, reason, source)})]}`` plus the backend order."""
    versions = _versions()
    backends = _backends()
    caps_by_version = {arch: {v: target_capabilities(arch, v) for v in versions} for arch in ARCHS}
    no_aiter = {arch: target_capabilities(arch, "none") for arch in ARCHS}
    engines = engine_ranges()
    out: dict[str, Any] = {"backends": [b.name for b in backends], "newest": versions[-1], "archs": {},
                           "engines": {b.name: engines.get(b.name, "") for b in backends}}
    for arch in ARCHS:
        rows = []
        for label, weight, act in SCHEMES:
            for activation, params in ACTIVATIONS:
                layer = _layer(weight, act, activation, params)
                cells = {}
                for backend in backends:
                    needs_aiter = bool(getattr(backend, "requires_aiter", False))
                    if not needs_aiter:
                        verdict = backend.check(layer, no_aiter[arch])
                        if verdict.supported:
                            cells[backend.name] = (True, "no AITER needed", "", "")
                            continue
                    ok = [v for v in versions if backend.check(layer, caps_by_version[arch][v]).supported]
                    if ok:
                        cells[backend.name] = (True, _range(ok, versions), "", "")
                        continue
                    verdict = backend.check(layer, caps_by_version[arch][versions[-1]])
                    reason = next((r for r in verdict.reasons if getattr(r, "kind", "failed") == "failed"),
                                  verdict.reasons[0] if verdict.reasons else None)
                    text = getattr(reason, "text", str(reason)) if reason is not None else "not supported"
                    cells[backend.name] = (False, "", text, getattr(reason, "source", None) or "")
                rows.append((label, activation, cells))
        out["archs"][arch] = rows
    return out


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, Any] | None = None) -> str:
    data = data or matrix()
    backends = data["backends"]
    lines = [
        "# Support matrix",
        "",
        "<!-- Generated by `python -m moedispatch.render.support_matrix > docs/support-matrix.md`; do not edit by hand. "
        "tests/test_support_matrix.py fails when this file is stale. -->",
        "",
        "What each built-in backend's own `check()` says for a canonical aligned layer (hidden 4096, intermediate 2048, "
        "8 experts, top-2, TP1, no bias) on a simulated target, at every AITER release capability_db knows "
        f"(newest {data['newest']}). ✓ gives the range of those releases that pass (\"no AITER needed\" for paths outside "
        "AITER); ✗ [n] points to the first reason the newest AITER fails, listed under the table with its source. "
        "Shape limits (tile alignment, inter_dim gaps), TP/EP limits and known issues that depend on the shape are "
        "not in this table: `moedispatch explain` decides them per layer. Engine releases add their own gates "
        "(e.g. vLLM's `VLLM_ROCM_USE_AITER`): `moedispatch explain --recipe` shows them.",
        "",
        "Engine releases that can select each backend (capability_db/engines.toml; \"none\" = no engine row yet, so no "
        "recipe realizes it):",
        "",
        "| backend | engine releases |",
        "|---|---|",
        *[f"| {b} | {data['engines'].get(b) or 'none'} |" for b in backends],
        "",
    ]
    for arch, rows in data["archs"].items():
        reasons: dict[tuple[str, str], int] = {}
        lines += [f"## {arch}", "", "| weights × activations | activation | " + " | ".join(backends) + " |",
                  "|---|---|" + "---|" * len(backends)]
        for label, activation, cells in rows:
            row = []
            for name in backends:
                ok, detail, text, source = cells[name]
                if ok:
                    row.append(f"✓ {detail}")
                else:
                    n = reasons.setdefault((text, source), len(reasons) + 1)
                    row.append(f"✗ [{n}]")
            lines.append(f"| {label} | {activation} | " + " | ".join(row) + " |")
        lines += ["", f"Reasons ({arch}):", ""]
        for (text, source), n in reasons.items():
            lines.append(f"{n}. {_escape(text)}" + (f" — {_escape(source)}" if source else ""))
        lines.append("")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
