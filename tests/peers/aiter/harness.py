"""The AITER peer run: grid → moedispatch's answers → AITER's real dispatch → comparison → summary.

Command line (from the repository root, in a Python that imports moedispatch — the project's .venv)::

    python tests/peers/aiter/harness.py [--grid quick|ci|full] [--src SOURCE] [--out DIR] [--workers N]

SOURCE as in ``aiter_src.py`` (default ``MOEDISPATCH_AITER_SRC``, else the ROCm/aiter mirror at e4048607);
``--src pypi:amd-aiter==0.1.7.post2.dev18`` (or the wheel file) runs the PyPI wheel's own ``aiter/fused_moe.py``
against moedispatch's rules for that version (the legacy 0.1.7 rules) and the wheel's own tuned CSVs. Writes ``DIR/summary.json`` (default
``.aiter-peer-build/out/<grid>-<source label>/``) and prints the per-target table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aiter_src  # noqa: E402
import compare  # noqa: E402
import model_side  # noqa: E402

ROOT = aiter_src.ROOT


def peer_python() -> str | None:
    """The .aiter-peer-venv interpreter (``MOEDISPATCH_AITER_PEER_PYTHON`` overrides), or None."""
    explicit = os.environ.get("MOEDISPATCH_AITER_PEER_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    path = ROOT / ".aiter-peer-venv" / "bin" / "python"
    return str(path) if path.exists() else None


def peer_source(ref: str | None = None) -> tuple[str, str]:
    """(the peer venv's python, the AITER source spec) for a peer test: HEAD e4048607 of the configured source, or
    release ``ref`` of its git directory. Raises LookupError saying what is missing (a test skips with it)."""
    python = peer_python()
    if python is None:
        raise LookupError("AITER peer environment absent (.aiter-peer-venv): run tests/peers/aiter/setup_env.sh")
    spec = aiter_src.default_source()
    if spec is None or not Path(spec.rsplit("@", 1)[0]).exists():
        raise LookupError("no ROCm/aiter source: set MOEDISPATCH_AITER_SRC to a ROCm/aiter checkout or git directory")
    git = Path(spec.rsplit("@", 1)[0])
    if ref is None:
        return python, (f"{spec}@{aiter_src.HEAD_COMMIT}" if "@" not in spec and aiter_src._is_git_dir(git)
                        else spec)
    if not aiter_src._is_git_dir(git):
        raise LookupError(f"{ref} needs a ROCm/aiter git directory (MOEDISPATCH_AITER_SRC)")
    r = subprocess.run(["git", f"--git-dir={git}", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise LookupError(f"{git} has no tag {ref}")
    return python, f"{git}@{ref}"


def prepare_source(python: str, spec: str | None) -> dict:
    """``aiter_src.prepare`` run in the peer venv (its pybind11 compiles the enum module)."""
    cmd = [python, str(HERE / "aiter_src.py"), "prepare"] + ([spec] if spec else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"aiter_src.py prepare failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout)


def run_aiter(python: str, src: dict, cases: list[dict], workers: int = 2, chunks_per_group: int = 2) -> dict:
    """AITER's answers {case id: [point, …]}: one process per (target, environment) chunk, ``workers`` at a time."""
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        groups.setdefault((c["target"], tuple(sorted(c["env"].items()))), []).append(c)
    jobs = []
    for (target, env), members in groups.items():
        gfx, cu = model_side.TARGETS[target]
        n = max(1, min(chunks_per_group, len(members) // 200 + 1))
        for i in range(n):
            part = members[i::n]
            jobs.append({"src": src, "gfx": gfx, "cu": cu, "env": dict(env),
                         "bin": str(aiter_src.fake_rocm_bin(gfx, cu)), "lock": str(aiter_src.BUILD / "configs.lock"),
                         "cases": [model_side.public(c) for c in part]})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITER_", "CU_NUM", "GPTOSS_"))}
    env.pop("PYTHONPATH", None)

    def work(job):
        r = subprocess.run([python, str(HERE / "aiter_side.py")], input=json.dumps(job), capture_output=True,
                           text=True, env=env, timeout=1800, cwd=str(aiter_src.BUILD))
        if r.returncode != 0:
            raise RuntimeError(f"aiter_side.py failed ({job['gfx']}/{job['cu']}): {r.stderr[-3000:]}")
        return json.loads(r.stdout)

    answers: dict[int, list] = {}
    timing = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for res in pool.map(work, jobs):
            timing.append((res["import_s"], res["run_s"]))
            for a in res["answers"]:
                answers[a["id"]] = a["points"]
    return {"answers": answers, "processes": len(jobs), "timing": timing}


def run(grid: str = "ci", spec: str | None = None, out: str | None = None, workers: int = 2,
        rules: str | None = None) -> dict:
    python = peer_python()
    if python is None:
        raise FileNotFoundError("no .aiter-peer-venv: run tests/peers/aiter/setup_env.sh")
    t0 = time.time()
    src = prepare_source(python, spec)
    t_prep = time.time()
    if src["kind"] == "wheel":
        # The wheel's own tuned CSVs, read by moedispatch as a directory; its version selects the legacy rules.
        model_side.configure(rules or src["version"], str(Path(src["root"]) / "aiter"))
    else:
        # A release of moedispatch's AITER index (matched by commit): model it with that release's rules and rows.
        from moedispatch.data import aiter_index

        rel = next((r for r in aiter_index.releases() if src.get("commit") and r.commit == src["commit"]), None)
        if rel is not None and rel.version is not None:
            model_side.configure(rules or rel.tag[1:], rel.tag)
            src["release"] = rel.tag
        else:
            model_side.configure(rules)
    cases = model_side.build_cases(grid)
    theirs = model_side.model_answers(cases)
    t_model = time.time()
    peer = run_aiter(python, src, cases, workers=workers)
    t_aiter = time.time()
    summary = compare.summarise(cases, theirs, peer["answers"], src)
    summary["runtime_s"] = {"prepare": round(t_prep - t0, 1), "model": round(t_model - t_prep, 1),
                            "aiter": round(t_aiter - t_model, 1), "compare": round(time.time() - t_aiter, 1),
                            "aiter_processes": peer["processes"], "aiter_import_s": [t[0] for t in peer["timing"]],
                            "aiter_run_s": [t[1] for t in peer["timing"]]}
    summary["grid"] = grid
    summary["rules"] = model_side.lookup_model_name()
    out_dir = Path(out) if out else aiter_src.BUILD / "out" / f"{grid}-{src['label']}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    summary["out"] = str(out_dir)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default=os.environ.get("MOEDISPATCH_AITER_PEER_GRID", "ci"),
                    choices=("quick", "ci", "full"))
    ap.add_argument("--src", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rules", default=None, help="moedispatch rules/version to model (default: HEAD; a wheel: 0.1.7)")
    args = ap.parse_args()
    s = run(args.grid, args.src, args.out, args.workers, args.rules)
    print(compare.table(s))
    print(f"\nsummary: {s['out']}/summary.json; runtime {s['runtime_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
