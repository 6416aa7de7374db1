"""Cold start-up of ``moedispatch explain`` as ratios measured in one run (not a timed test).

    python benchmarks/bench_startup.py [--repeat N]

Targets (issue "Hardening and performance"): ``moedispatch explain --model MiniMax-M3-MXFP4 --target gfx950`` cold
wall time <= 0.15x ``python -c "import torch"`` and <= 2x ``python -c "import pluggy, structlog"``.
Each command runs N times, interleaved (so machine load hits all three alike); the ratio is of medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _explain_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("moedispatch")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "moedispatch.cli"]
    return head + ["explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950"]


COMMANDS = {
    "explain": _explain_cmd(),
    "import torch": [sys.executable, "-c", "import torch"],
    "import pluggy, structlog": [sys.executable, "-c", "import pluggy, structlog"],
}
TARGETS = {"import torch": 0.15, "import pluggy, structlog": 1.5}


def _run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for name, cmd in COMMANDS.items():  # warm the OS file cache once
        _run(cmd, env)
    for _ in range(args.repeat):
        for name, cmd in COMMANDS.items():
            times[name].append(_run(cmd, env))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"cold start-up, median of {args.repeat} interleaved runs on {os.cpu_count()} CPUs "
          f"(python {sys.version.split()[0]})")
    for name in COMMANDS:
        print(f"  {name:<28} median {med[name] * 1e3:7.1f} ms   min {min(times[name]) * 1e3:7.1f} ms")
    ok = True
    for base, target in TARGETS.items():
        ratio = med["explain"] / med[base]
        ok &= ratio <= target
        print(f"  explain / {base:<26} {ratio:5.2f}x   (target <= {target}x)  {'OK' if ratio <= target else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
