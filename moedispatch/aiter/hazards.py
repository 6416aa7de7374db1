"""Hazards the model derives from the simulated steps themselves, not from the issue table: where AITER raises
instead of running (:func:`raising_hits`), where a kernel reads pad regions the plan does not zero
(:func:`pad_hazards`), and where a FlyDSL tile does not fit the allocation (:func:`tile_hazards`). Each is reported
as an :class:`~moedispatch.aiter.issues.IssueHit`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Mapping

from moedispatch.aiter.flydsl import FLYDSL_TILE_SOURCE, tile_misfit
from moedispatch.aiter.issues import IssueHit
from moedispatch.aiter.key import DispatchKey
from moedispatch.aiter.steps import DispatchStep
from moedispatch.aiter.vocab import SRC_FUSED_MOE

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Padding


def raising_hits(steps: Iterable[DispatchStep], key: DispatchKey, env: Mapping[str, str]) -> tuple[IssueHit, ...]:
    """One blocking hit per run of token counts where AITER raises instead of running (DispatchStep.raises)."""
    hits: list[IssueHit] = []
    last = -2  # a range merges only consecutive steps
    for i, s in enumerate(steps):
        if not s.raises:
            continue
        if hits and last == i - 1 and hits[-1].effect.endswith(s.raises):
            prev = hits[-1]
            hits[-1] = replace(prev, tokens=(prev.tokens[0], s.tokens[1]))
            last = i
            continue
        last = i
        workaround, wenv = "none known for this configuration", ()
        if "SiTUv2" in s.raises:
            # Not an env workaround: it changes the activation numerics (fp8 instead of the checkpoint's bf16).
            workaround = ("AITER_SITUV2_A8W4=1 runs SiTUv2 with fp8 activations (AITER's a8w4 rows), which none of "
                          "these refusals apply to — a different numerics than the checkpoint's bf16 activations")
        elif "AITER_BYPASS_TUNE_CONFIG" in s.raises:
            workaround = "unset AITER_BYPASS_TUNE_CONFIG (the tuned Opus row runs)"
        elif "expert-parallel" in s.raises:
            workaround = "no expert parallelism for this layer (TP only), or a tuned set without flydsl_mxmoe rows"
        elif "flydsl is not importable" in s.raises:
            workaround = "install the flydsl AITER pins (the row's FlyDSL kernels then run)"
        hits.append(IssueHit(issue="aiter-raises", tokens=s.tokens, bucket=s.bucket,
                             kernel=" + ".join(s.kernels) or "no kernel", effect="AITER refuses this call: "
                             + s.raises, workaround=workaround, workaround_env=wenv, token_cap=None,
                             source=SRC_FUSED_MOE, confidence="confirmed", severity="error", raises=True))
    return tuple(hits)


def pad_hazards(steps: Iterable[DispatchStep], key: DispatchKey, padding: "Padding | None", *,
                has_bias: bool = False) -> tuple[IssueHit, ...]:
    """Steps whose kernels would read padded weights the plan does not make safe.

    * ASM and classic CK take no pad arguments and compute over the padded extent: pad regions must be zero
      (https://github.com/ROCm/aiter/issues/5413).
    * FlyDSL drops the pads when a bias is passed (FM ``_get_padding_for_flydsl`` returns (0, 0)): same.
    * CK-Tile skips whole granules only (``intermediate_pad // 64 * 64``, ``hidden_pad // 128 * 128`` in FM): a
      remainder is computed over, so it must be zero.
    """
    if padding is None or padding.zero_fill:
        return ()
    ipad, hpad = padding.kernel_intermediate_pad, padding.kernel_hidden_pad
    apad_i, apad_h = padding.intermediate_pad, padding.hidden_pad
    if not (apad_i or apad_h):
        return ()
    hits: list[IssueHit] = []
    last = -2  # a range merges only consecutive steps
    for i, step in enumerate(steps):
        fams = set(step.family.split("+"))
        why = None
        if fams & {"ck", "asm"}:
            why = ("ASM/CK kernels take no pad arguments and compute over the padded extent, so the pad regions must "
                   "be zero", "https://github.com/ROCm/aiter/issues/5413")
        elif "flydsl" in fams and has_bias and (ipad or hpad):
            why = ("FlyDSL drops the pad arguments when a bias is passed and computes over the padded extent",
                   f"{SRC_FUSED_MOE} (_get_padding_for_flydsl)")
        elif "cktile" in fams and (ipad % 64 or hpad % 128 or ipad < apad_i or hpad < apad_h):
            why = ("CK-Tile skips only whole 64-wide N / 128-wide K granules of the pads it is given; the rest is "
                   "computed over", f"{SRC_FUSED_MOE} (cktile_moe_stage1/2 n_pad_zeros, k_pad_zeros)")
        elif "flydsl" in fams and (ipad < apad_i or hpad < apad_h):
            why = ("FlyDSL skips only the pads it is passed (inter_dim_pad/model_dim_pad); the rest is computed over",
                   f"{SRC_FUSED_MOE} (_flydsl_stage1_wrapper)")
        if why is None:
            continue
        prev = hits[-1] if hits else None
        if prev and last == i - 1 and prev.issue == "pad-not-zeroed" and prev.effect.startswith(why[0]):
            hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
            last = i
            continue
        last = i
        hits.append(IssueHit(issue="pad-not-zeroed", tokens=step.tokens, bucket=step.bucket,
                             kernel=" + ".join(step.kernels), effect=why[0] + "; the plan does not zero-fill them",
                             workaround="allocate the padded weights (and scales) with zeros", workaround_env=(),
                             token_cap=None, source=why[1], confidence="derived", severity="error"))
    return tuple(hits)


def tile_hazards(steps: Iterable[DispatchStep], key: DispatchKey, version: str | None) -> tuple[IssueHit, ...]:
    """Steps whose FlyDSL kernels cannot tile the allocated shape (``key.inter_dim`` × ``key.model_dim``): AITER's
    own comment says such a tile reads out of bounds ("wrong output or memfault"). Blocking: the only fix is an
    allocation the tiles divide."""
    hits: list[IssueHit] = []
    for step in steps:
        problems = [p for k in step.kernels for p in [tile_misfit(k, key.inter_dim, key.model_dim, version)[0]] if p]
        if not problems:
            continue
        prev = hits[-1] if hits else None
        effect = ("FlyDSL kernel tile does not fit the allocation (" + "; ".join(problems)
                  + "): the kernel reads out of bounds — wrong output or a memory fault")
        if prev and prev.effect == effect and prev.tokens[1] < step.tokens[0]:
            hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
            continue
        hits.append(IssueHit(issue="flydsl-tile", tokens=step.tokens, bucket=step.bucket,
                             kernel=" + ".join(step.kernels), effect=effect,
                             workaround="", workaround_env=(), token_cap=None, source=FLYDSL_TILE_SOURCE,
                             confidence="confirmed", severity="error"))
    return tuple(hits)
