"""Shared helpers of the peer suite: where the engine environment is, the case grid, and running the real oracle.

The engine environment is ``.peers-venv`` at the repository root (``tests/peers/setup_env.sh`` builds it), or the
interpreter named by ``MOEDISPATCH_PEERS_PYTHON``. The suite skips when it is absent.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: Scheme → select_moe_backend() quant fields (and the harness' scheme name).
SCHEMES = {
    "bf16": dict(weight_quant="bf16"),
    "fp8_tensor": dict(weight_quant="fp8", activation_quant="fp8"),
    "fp8_block": dict(weight_quant="fp8", weight_granularity="block128x128", activation_quant="fp8",
                      activation_granularity="group128"),
    "mxfp4_w4a16": dict(weight_quant="mxfp4", activation_quant="bf16"),
    "mxfp4_w4a4": dict(weight_quant="mxfp4", activation_quant="mxfp4"),
    "mxfp8": dict(weight_quant="mxfp8", activation_quant="mxfp8"),
}
I_RANKS = (96, 128, 192, 256, 320, 360, 384, 512, 704, 1408, 1536)
HIDDENS = (2048, 2880, 4096, 6144, 7168)
TP = 8


def peers_python() -> str | None:
    """The engine environment's interpreter, or None when it is absent."""
    explicit = os.environ.get("MOEDISPATCH_PEERS_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in ("bin/python", "Scripts/python.exe"):
        path = ROOT / ".peers-venv" / name
        if path.exists():
            return str(path)
    return None


def has_vllm(python: str) -> bool:
    r = subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
                       capture_output=True)
    return r.returncode == 0


def grid() -> list[dict]:
    """The main grid: 6 schemes × gfx942/gfx950 × AITER on/off × silu/swigluoai × 11 per-rank × 5 hidden sizes
    (2,640 cases), plus MiniMax-M3's swigluoai_uninterleave, gpt-oss/DeepSeek-V4 style `mxfp4` checkpoints and GELU."""
    cases = []
    for scheme, gfx, aiter, act, i, h in itertools.product(SCHEMES, ("gfx942", "gfx950"), (True, False),
                                                          ("silu", "swigluoai"), I_RANKS, HIDDENS):
        cases.append(dict(scheme=scheme, gfx=gfx, aiter=aiter, activation=act, i=i, h=h, tp=TP, moe_backend="auto"))
    for scheme, gfx, aiter, i, h in itertools.product(("bf16", "mxfp4_w4a4", "mxfp8", "fp8_block"), ("gfx942", "gfx950"),
                                                      (True, False), I_RANKS, (2880, 6144)):
        cases.append(dict(scheme=scheme, gfx=gfx, aiter=aiter, activation="swigluoai_uninterleave", i=i, h=h, tp=TP,
                          moe_backend="auto"))
    for gfx, aiter, act, i, h in itertools.product(("gfx942", "gfx950"), (True, False), ("silu", "swigluoai"),
                                                   I_RANKS, (2880, 7168)):
        cases.append(dict(scheme="mxfp4_w4a16", quant_method="mxfp4", gfx=gfx, aiter=aiter, activation=act, i=i, h=h,
                          tp=TP, moe_backend="auto"))
    # Other TP degrees: the FP8 block refinement / shard padding and the per-rank round-ups depend on them.
    for scheme, gfx, aiter, mb, tp, i in itertools.product(("fp8_block", "mxfp4_w4a4", "bf16"), ("gfx950",),
                                                           (True, False), ("auto", "aiter", "triton"), (1, 2, 4),
                                                           (96, 192, 360, 1536)):
        cases.append(dict(scheme=scheme, gfx=gfx, aiter=aiter, activation="silu", i=i, h=7168, tp=tp, moe_backend=mb))
    return cases


def forced_grid(values=("aiter", "triton", "emulation", "triton_unfused")) -> list[dict]:
    """Every `--moe-backend` value recipes use, over the schemes, both archs and AITER on/off."""
    cases = []
    for mb, scheme, gfx, aiter, act, i, h in itertools.product(values, SCHEMES, ("gfx942", "gfx950"), (True, False),
                                                               ("silu", "swigluoai"), (96, 192, 360, 384, 1536),
                                                               (2880, 6144)):
        cases.append(dict(scheme=scheme, gfx=gfx, aiter=aiter, activation=act, i=i, h=h, tp=TP, moe_backend=mb))
    return cases


def _run_group(python: str, gfx: str, cases: list[dict]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PEERS_GFX=gfx, PYTHONPATH=str(HERE / "stubs"))
    r = subprocess.run([python, str(HERE / "vllm_side.py")], input=json.dumps(cases), capture_output=True, text=True,
                       env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"vllm_side.py failed ({gfx}): {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def case_env(case: dict) -> dict:
    """The engine environment of a case: its ``env``, else AITER on (``VLLM_ROCM_USE_AITER=1``) or vLLM's default."""
    if case.get("env") is not None:
        return dict(case["env"])
    return {"VLLM_ROCM_USE_AITER": "1"} if case.get("aiter") else {}


def run_vllm(python: str, cases: list[dict]) -> list[dict]:
    """The real vLLM's answer for every case, in case order (one process per gfx target, two at a time)."""
    groups: dict[str, list[int]] = {}
    for n, c in enumerate(cases):
        groups.setdefault(c["gfx"], []).append(n)
    answers: list[dict | None] = [None] * len(cases)

    def work(item):
        gfx, idx = item
        return idx, _run_group(python, gfx, [{**cases[n], "env": case_env(cases[n])} for n in idx])

    with ThreadPoolExecutor(max_workers=2) as pool:
        for idx, res in pool.map(work, groups.items()):
            for n, a in zip(idx, res):
                answers[n] = a
    return answers


def has_sglang(python: str) -> bool:
    r = subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('sglang') is None or "
                        "u.find_spec('compressed_tensors') is None)"], capture_output=True)
    return r.returncode == 0


SGLANG_SCHEMES = {"bf16": "bf16", "fp8": "fp8_tensor", "mxfp4_w4a4": "mxfp4_w4a4"}


def sglang_grid() -> list[dict]:
    """bf16 / FP8 / Quark MXFP4 W4A4 × gfx942/gfx950 × silu/swigluoai/swigluoai_uninterleave × per-rank sizes."""
    sizes = sorted(set(I_RANKS) | {64, 160, 224, 448, 640, 768, 1024, 2048})
    return [dict(scheme=s, gfx=g, activation=a, i=i, h=h) for s, g, a, i, h in itertools.product(
        SGLANG_SCHEMES, ("gfx942", "gfx950"), ("silu", "swigluoai", "swigluoai_uninterleave"), sizes, (2880, 6144))]


def run_sglang(python: str, cases: list[dict]) -> list[dict]:
    env = dict(os.environ)
    r = subprocess.run([python, str(HERE / "sglang_side.py")], input=json.dumps(cases), capture_output=True,
                       text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"sglang_side.py failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def fields(case: dict) -> dict:
    """select_moe_backend()/engine_choice() fields for a case."""
    f = dict(SCHEMES[case["scheme"]])
    f.update(hidden_size=case["h"], intermediate_size=case["i"] * case.get("tp", TP), tp_size=case.get("tp", TP),
             num_experts=128, top_k=8, activation=case["activation"])
    if case.get("quant_method"):
        f["quant_method"] = case["quant_method"]
    return f


_SCHEME = {"bf16": "bf16", "fp8_tensor": "fp8_tensor", "fp8_block": "fp8_block", "mxfp4_a16": "mxfp4_w4a16",
           "mxfp4_a4": "mxfp4_w4a4", "mxfp8": "mxfp8"}


def recipe_cases():
    """(cases, meta): every built-in model's vLLM 0.33.0 recipe × gfx942/gfx950 × TP 1/8, one case per MoE layer group
    with the recipe's --moe-backend and environment."""
    from moedispatch.data import capdb
    from moedispatch.engines.choice import _scheme
    from moedispatch.core.errors import MoedispatchError
    from moedispatch.sources.models import builtin_models, load_model
    from moedispatch.plan.plan import plan_model
    from moedispatch.engines.recipes import build_recipe

    cases, meta = [], []
    for entry in builtin_models():
        model = load_model(entry["name"])
        for gfx in ("gfx942", "gfx950"):
            caps = capdb.target_capabilities(gfx, None)
            for tp in (1, 8):
                try:
                    plan = plan_model(model, caps, tp=tp)
                    recipe = build_recipe(plan, "vllm", "0.33.0")
                except MoedispatchError:
                    continue
                if not recipe.command:
                    continue
                args = " ".join(a["arg"] for a in recipe.args)
                words = args.split()
                mb = words[words.index("--moe-backend") + 1] if "--moe-backend" in words else "auto"
                env = {e["name"]: str(e["value"]) for e in recipe.env}
                for group in plan.groups():
                    layer = group[0].layer
                    if layer.kind != "moe":
                        continue
                    try:
                        scheme = _SCHEME.get(_scheme(layer))
                    except MoedispatchError:  # a scheme vLLM's ROCm model does not cover here (int4 …)
                        continue
                    if scheme is None:
                        continue
                    qm = getattr(plan.model, "quant_method", None)
                    cases.append(dict(scheme=scheme, gfx=gfx, aiter=None, env=env, activation=layer.activation,
                                      i=layer.intermediate_per_rank, h=layer.hidden, tp=layer.moe_tp,
                                      experts=layer.experts, top_k=layer.top_k, moe_backend=mb,
                                      model_type=layer.model_type,
                                      **({"quant_method": qm} if qm in ("mxfp4", "quark", "fp8") else {})))
                    meta.append((entry["name"], gfx, tp, layer, caps, plan))
    return cases, meta


@functools.lru_cache(maxsize=None)
def vllm_oracle_data() -> dict | None:
    """{"grid": (cases, answers), "recipes": (cases, meta, answers)} from the real vLLM 0.33.0, computed once per
    process for the whole suite (two processes, one per gfx target); None when the environment is absent."""
    py = peers_python()
    if py is None or not has_vllm(py):
        return None
    cases = grid() + forced_grid()
    rcases, meta = recipe_cases()
    answers = run_vllm(py, cases + rcases)
    return {"grid": (cases, answers[:len(cases)]), "recipes": (rcases, meta, answers[len(cases):])}


@functools.lru_cache(maxsize=None)
def sglang_oracle_data() -> tuple | None:
    """(cases, answers) from the real SGLang 0.5.23 helpers, once per process; None when the environment is absent."""
    py = peers_python()
    if py is None or not has_sglang(py):
        return None
    cases = sglang_grid()
    return cases, run_sglang(py, cases)


if __name__ == "__main__":  # pragma: no cover - a manual run: python tests/peers/peers.py > answers.json
    py = peers_python()
    if not py:
        sys.exit("no .peers-venv: run tests/peers/setup_env.sh")
    cs = grid()
    json.dump({"cases": cs, "answers": run_vllm(py, cs)}, sys.stdout)
