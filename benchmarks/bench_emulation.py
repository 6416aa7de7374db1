"""Emulation MoE vs the obvious implementation, at the amd/MiniMax-M3-MXFP4 per-rank TP8 shape.

    python benchmarks/bench_emulation.py [--quick] [--experts N] [--reps N]

Shape: 128 experts, top-4, hidden 6144, intermediate per rank 384 (3072 / TP8), W4A4 MXFP4 (weights and
activations, E8M0 scale per 32), ``swigluoai_uninterleave`` (alpha 1.702, limit 7). Weights are random MXFP4 codes
and scale bytes (a quantized checkpoint as loaded; quantizing 3.6 GB of float weights first would dominate the run).

Compared on the same inputs in the same process:

* ``fused_moe`` (moedispatch.numerics.moe): dequantizes only the experts tokens are routed to, one at a time;
* ``naive``: the obvious implementation — dequantize every expert's weights (``dequantize_mx`` on the whole
  ``[E, 2I, H]`` and ``[E, H, I]`` tensors) on every call, then loop over all experts.

Memory method: tracemalloc cannot see torch allocations and torch has no CPU allocator statistics, so two numbers
are reported. (1) **dequantized-weight bytes alive at once**, counted exactly: fused_moe reports every float weight
tensor it materializes to a DequantTracker (acquire/release around its lifetime); for naive it is the size of the
two dequantized tensors. (2) **process peak RSS growth** during each phase (Linux: the peak is reset through
``/proc/self/clear_refs`` before a phase and read from ``VmHWM`` after), which also includes activations, outputs,
temporaries of the dequantization and allocator slack. Both are expressed in "experts": one expert's dequantized
float32 weights, ``(2 I H + H I) * 4`` bytes (28.3 MB here). Targets: decode speed-up >= 3x; peak extra memory <= 2
experts.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

from moedispatch.numerics.moe import DequantTracker, apply_activation, fused_moe, qdq_activation
from moedispatch.numerics.mx import MXTensor, dequantize_mx
from moedispatch.numerics.routing import softmax_topk

HIDDEN, INTER, EXPERTS, TOP_K = 6144, 384, 128, 4
ACT, PARAMS = "swigluoai_uninterleave", {"alpha": 1.702, "limit": 7.0}


def random_mxfp4(e: int, n: int, k: int, gen: torch.Generator, scale_center: int) -> MXTensor:
    codes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=gen)
    scales = torch.randint(scale_center - 2, scale_center + 2, (e, n, k // 32), dtype=torch.uint8, generator=gen)
    return MXTensor("mxfp4", (e, n, k), codes, scales, 32, -1)


def naive_moe(x, w13: MXTensor, w2: MXTensor, topk_weights, topk_ids):
    """Dequantize everything, then loop over every expert (the obvious way)."""
    w13_f = dequantize_mx(w13)  # [E, 2I, H] float32
    w2_f = dequantize_mx(w2)  # [E, H, I]
    inter = w2_f.shape[-1]
    a1 = qdq_activation(x, "mxfp4")
    out = torch.zeros(x.shape[0], w2_f.shape[1])
    for e in range(w13_f.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        rows = a1[tok]
        h = apply_activation(rows @ w13_f[e, :inter].T, rows @ w13_f[e, inter:].T, ACT, PARAMS)
        y = qdq_activation(h, "mxfp4") @ w2_f[e].T
        out.index_add_(0, tok, y * topk_weights[tok, slot].unsqueeze(-1))
    nbytes = (w13_f.numel() + w2_f.numel()) * 4
    return out, nbytes


def fused(x, w13, w2, topk_weights, topk_ids, tracker):
    return fused_moe(x, w13, w2, topk_weights, topk_ids, weight_scheme="mxfp4", activation_scheme="mxfp4",
                     activation=ACT, activation_params=PARAMS, tracker=tracker)


# -- peak RSS per phase (Linux) ----------------------------------------------------------------------------------
def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure(fn, reps: int):
    """(best seconds, result, peak RSS growth in bytes or None) over ``reps`` calls after one warm-up."""
    fn()
    can_reset = _reset_peak_rss()
    base = _rss_kib("VmRSS")
    best, result = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    peak = _rss_kib("VmHWM")
    growth = (peak - base) * 1024 if can_reset and peak is not None and base is not None else None
    return best, result, growth


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}, load average {load:.2f} at start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one timed repetition, prefill of 128 tokens")
    ap.add_argument("--experts", type=int, default=EXPERTS)
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (best of); default 3, --quick 1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    batches = [("decode", 8), ("prefill", 128 if args.quick else 512)]

    gen = torch.Generator().manual_seed(args.seed)
    e = args.experts
    # scale bytes ~2^-5 for weights: values up to 6 * 2^-5 ≈ 0.19, a plausible weight magnitude
    w13 = random_mxfp4(e, 2 * INTER, HIDDEN, gen, 122)
    w2 = random_mxfp4(e, HIDDEN, INTER, gen, 122)
    expert_bytes = (2 * INTER * HIDDEN + HIDDEN * INTER) * 4
    print(f"machine: {machine()}")
    print(f"shape: {e} experts, top-{TOP_K}, hidden {HIDDEN}, intermediate/rank {INTER}, W4A4 MXFP4, {ACT}; "
          f"one expert dequantized = {expert_bytes / 2**20:.1f} MiB; best of {reps}")
    ok = True
    for name, tokens in batches:
        x = torch.randn(tokens, HIDDEN, generator=gen)
        topk_weights, topk_ids = softmax_topk(torch.randn(tokens, e, generator=gen), TOP_K)
        routed = int(torch.unique(topk_ids).numel())
        tracker = DequantTracker()

        def run_fused():
            tracker.reset()
            return fused(x, w13, w2, topk_weights, topk_ids, tracker)

        t_fused, out_fused, rss_fused = measure(run_fused, reps)
        t_naive, (out_naive, naive_bytes), rss_naive = measure(
            lambda: naive_moe(x, w13, w2, topk_weights, topk_ids), reps)
        diff = float((out_fused - out_naive).norm() / out_naive.norm())
        speedup = t_naive / t_fused
        peak_experts = tracker.peak_bytes / expert_bytes

        def rss(v):
            return "n/a" if v is None else f"{v / 2**20:.0f} MiB ({v / expert_bytes:.1f} experts)"

        print(f"\n{name}: {tokens} tokens, {routed} of {e} experts routed")
        print(f"  fused_moe  {t_fused * 1e3:9.1f} ms   dequantized weights alive at peak "
              f"{tracker.peak_bytes / 2**20:7.1f} MiB ({peak_experts:.2f} experts)   peak RSS growth {rss(rss_fused)}")
        print(f"  naive      {t_naive * 1e3:9.1f} ms   dequantized weights alive at peak "
              f"{naive_bytes / 2**20:7.1f} MiB ({naive_bytes / expert_bytes:.2f} experts)   "
              f"peak RSS growth {rss(rss_naive)}")
        print(f"  speed-up {speedup:.2f}x; outputs differ by {diff:.1e} (relative Frobenius)")
        if name == "decode" and speedup < 3:
            print("  BELOW TARGET: decode speed-up < 3x")
            ok = False
        if peak_experts > 2:
            print("  BELOW TARGET: peak dequantized weights > 2 experts")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
