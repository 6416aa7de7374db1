"""The engine guard's overhead inside the real vLLM 0.33.0 (issue 24), as ratios measured in one run.

    python benchmarks/bench_guard.py [--repeat N] [--layers L]

Needs .peers-venv (tests/peers/setup_env.sh). Each run is a fresh process of tests/peers/vllm_guard_side.py ``bench``:
vLLM's own imports, ``EngineArgs(...).create_engine_config()`` (process 0, where the guard's check runs) and L MoE
layers of Qwen3-30B-A3B built as a worker builds them (``RoutedExperts(...)`` with weight allocation, where the
guard's per-layer check runs). Runs alternate the guard not installed (``VLLM_PLUGINS`` naming another plugin: vLLM
loads none of moedispatch), off (``MOEDISPATCH_GUARD=off``: vLLM imports and registers the plugin, which stops
there) and on (``warn``); medians. ``guard_off_cost_s`` is what an installed guard costs a process when it is off
(the plugin's import and register inside ``create_engine_config``, against not installed); ``guard_once_per_process_s`` what checking adds to that.
Targets: ≤ 0.5 s once per process and ≤ 0.5 ms per layer — printed next to the engine's own start-up in this run,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "peers"))

import peers  # noqa: E402


def _run(python: str, folder: str, layers: int, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "AITER_", "MOEDISPATCH_"))}
    env.update(PEERS_GFX="gfx950", PEERS_TP="8", VLLM_ROCM_USE_AITER="1", MOEDISPATCH_TARGET="MI355X",
               MOEDISPATCH_GUARD="off" if mode == "absent" else mode)
    if mode == "absent":   # an allow-list without moedispatch-guard (vllm/plugins/__init__.py load_plugins_by_group)
        env["VLLM_PLUGINS"] = "not-moedispatch"
    r = subprocess.run([python, str(ROOT / "tests/peers/vllm_guard_side.py"), "bench", folder, "8", str(layers)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode or not line:
        raise SystemExit(f"bench run failed:\n{r.stderr[-2000:]}")
    return json.loads(line[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=48)
    args = ap.parse_args()
    python = peers.peers_python()
    if python is None or not peers.has_vllm(python):
        print("bench_guard: .peers-venv absent (tests/peers/setup_env.sh)", file=sys.stderr)
        return 2
    config = json.loads((ROOT / "capability_db/models/Qwen3-30B-A3B.json").read_text())["config"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        runs: dict[str, list[dict]] = {"absent": [], "off": [], "warn": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(_run(python, tmp, args.layers, mode))
    med = {m: {"import": statistics.median(r["import_seconds"] for r in rs),
               "config": statistics.median(r["seconds"] for r in rs),
               "first_layer": statistics.median(r["layer_seconds"][0] for r in rs),
               "later_layer": statistics.median(statistics.median(r["layer_seconds"][1:]) for r in rs)}
           for m, rs in runs.items()}
    assert all(r["cls"] == "MoedispatchGuardedRoutedExperts" for r in runs["warn"])
    assert not any(r["cls"] == "MoedispatchGuardedRoutedExperts" for r in runs["absent"])
    # vLLM loads its general plugins in create_engine_config (the "config" span), after its own imports, whose run-to-run
    # spread (seconds) would swamp a 0.1 s difference
    off_cost = med["off"]["config"] - med["absent"]["config"]
    engine = med["off"]["import"] + med["off"]["config"] + med["off"]["first_layer"] + \
        (args.layers - 1) * med["off"]["later_layer"]
    once = (med["warn"]["config"] - med["off"]["config"]) + (med["warn"]["first_layer"] - med["off"]["first_layer"])
    per_layer = med["warn"]["later_layer"] - med["off"]["later_layer"]
    result = {
        "engine_startup_measured_s": round(engine, 3),
        "guard_off_cost_s": round(off_cost, 3),
        "guard_once_per_process_s": round(once, 3), "goal_once_s": 0.5,
        "guard_per_layer_ms": round(per_layer * 1e3, 3), "goal_per_layer_ms": 0.5,
        "guard_total_ratio_to_engine": round((once + (args.layers - 1) * per_layer) / engine, 4),
        "medians": {m: {k: round(v, 4) for k, v in d.items()} for m, d in med.items()},
        "repeat": args.repeat, "layers": args.layers,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
