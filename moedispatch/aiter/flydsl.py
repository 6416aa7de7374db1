"""FlyDSL's kernel names and tile rules: the names ``get_2stage_cfgs``'s FlyDSL heuristic builds
(:func:`_flydsl_heuristic_names`), the tile a FlyDSL kernel name carries (:func:`flydsl_tile`, ``_MXMOE_BM``) and
whether that tile fits an allocation under an AITER release (:func:`tile_misfit`, cited by
:data:`FLYDSL_TILE_SOURCE`)."""

from __future__ import annotations

import re

from moedispatch.aiter.rules import _at_least
from moedispatch.aiter.vocab import FP4, FP8, FP8_FNUZ


def _flydsl_heuristic_names(token: int, q_a: str, q_w: str, inter_dim: int, *, pick_tile_k: bool = True
                            ) -> tuple[int, str, str]:
    """The FlyDSL fallback names ``get_2stage_cfgs`` builds (``flydsl_kernel_name`` + tier suffixes); stage-2 tile_k
    256 always where the release does not pick it (``Rules.flydsl_s2_tile_k_pick``)."""
    a = "fp4" if q_a == FP4 else "fp8"
    w = "fp8" if q_w in (FP8, FP8_FNUZ) else "fp4"
    tk2 = 256 if (inter_dim % 256 == 0 or not pick_tile_k) else 128  # pick_flydsl_stage2_tile_k
    if token < 2048:
        tm, s1, s2 = 32, "_w2", "_bnt2"
    elif token < 4096:
        tm, s1, s2 = 64, "_w3_bnt0", ""
    elif token < 16384:
        tm, s1, s2 = 128, "_w2_bnt0", ""
    else:
        tm, s1, s2 = 64, "_w4_bnt0", ""
    kn1 = f"flydsl_moe1_a{a}_w{w}_bf16_t{tm}x128x256{s1}"
    kn2 = f"flydsl_moe2_a{a}_w{w}_bf16_t{tm}x128x{tk2}_atomic{s2}"
    if a == "fp8":
        kn1 += "_gui"
    return tm, kn1, kn2


_MXMOE_BM = re.compile(r"_(\d+)x\d+x\d+")


#: FlyDSL kernel names carry their tile: ``flydsl_moe{stage}_a{act}_w{weight}_…_t{tile_m}x{tile_n}x{tile_k}``.
_FLYDSL_TILE = re.compile(r"^flydsl_moe([12])_a([a-z0-9]+)_w([a-z0-9]+)_.*?_t(\d+)x(\d+)x(\d+)")
#: FlyDSL's tile constraints, in AITER's own words: stage 1's gate/up (N) tile must divide inter_dim for bf16/fp8
#: activations × fp4 weights ("a4w4 is unaffected"), stage 2's K tile must divide inter_dim, else "OOB -> wrong output
#: or memfault"; from v0.1.19 both are downgraded to 128 at launch where 128 divides. The model_dim axes (stage-1 K,
#: stage-2 N) must be divided by their tiles as well (the same file's tile-alignment notes).
FLYDSL_TILE_SOURCE = ("ROCm/aiter@v0.1.19:aiter/ops/flydsl/moe_kernels.py (flydsl_moe_stage1: 'The gate/up (N) axis "
                      "tile must divide inter_dim … Applies to both a16w4 and a8w4; a4w4 is unaffected'; "
                      "resolve_flydsl_stage1_tile_n, resolve_flydsl_stage2_tile_k: 256 if inter_dim % 256 == 0 else "
                      "128; the gfx1250 MXScale shape-alignment notes); ROCm/aiter#4397")
FLYDSL_TILE_RESOLVE_SINCE = "0.1.19"


def flydsl_tile(name: str) -> tuple[int, int, int, int] | None:
    """(stage, tile_m, tile_n, tile_k) of a FlyDSL MoE kernel name, or None for any other kernel."""
    m = _FLYDSL_TILE.match(name)
    return (int(m.group(1)), int(m.group(4)), int(m.group(5)), int(m.group(6))) if m else None


def tile_misfit(name: str, inter_dim: int, model_dim: int, version: str | None) -> tuple[str | None, str | None]:
    """(problem, note) of running FlyDSL kernel ``name`` on an allocation of ``inter_dim`` × ``model_dim``.

    problem: a tile that does not divide its axis and that this AITER does not resolve — the kernel reads out of
    bounds. note: AITER >= 0.1.19 replaces an inter_dim tile that does not divide by 128 where 128 divides (it runs,
    with another tile than the row names). (None, None) for a kernel that tiles the shape or is not FlyDSL.
    """
    m = _FLYDSL_TILE.match(name)
    if m is None:
        return None, None
    stage, act, weight = int(m.group(1)), m.group(2), m.group(3)
    tn, tk = int(m.group(5)), int(m.group(6))
    inter_tile, dim_tile = (tn, tk) if stage == 1 else (tk, tn)
    axis, other = ("tile_n", "tile_k") if stage == 1 else ("tile_k", "tile_n")
    if model_dim % dim_tile:
        return f"stage-{stage} {other} {dim_tile} does not divide model_dim {model_dim}", None
    if stage == 1 and not (weight == "fp4" and act in ("bf16", "fp8")):
        return None, None  # AITER: the stage-1 N-tile constraint is a16w4/a8w4's; "a4w4 is unaffected"
    # A gate/up-interleaved (_gui) stage 1 tiles N over both halves, 2 × inter_dim (derived: AITER's tuner measured
    # 0.0% error for t…x256x… _gui_ kernels at inter_dim 384 in ROCm/aiter@v0.1.18:aiter/configs/model_configs/
    # dsv4_fp8fp4_tuned_fmoe.csv, before the 0.1.19 downgrade existed).
    extent = 2 * inter_dim if stage == 1 and "_gui" in name else inter_dim
    if extent % inter_tile == 0:
        return None, None
    if _at_least(version, FLYDSL_TILE_RESOLVE_SINCE) and inter_dim % 128 == 0:
        return None, (f"{name}: AITER {version} runs it with {axis} 128 (its {axis} {inter_tile} does not divide "
                      f"inter_dim {inter_dim})")
    return f"stage-{stage} {axis} {inter_tile} does not divide inter_dim {inter_dim}", None
