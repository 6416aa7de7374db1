"""Rules every AITER family shares (the ``aiter.fused_moe`` entry point), used by aiter_ck/cktile/flydsl."""

from __future__ import annotations


from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch._util.caches import memoize
from moedispatch.data import capdb
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.kit.rules import Combo, RuleBackend, need_feature

#: AITER releases and files cited by the AITER families.
A3 = "ROCm/aiter@v0.1.15.post3"
#: The AITER HEAD our rules were last checked against (2026-08-22).
AH = "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879"
#: The vLLM tree our engine facts were read in (main, 2026-08-17).
V = "vllm-project/vllm@017e9f4448"

#: The clamp AITER's Swiglu kernels implement without a swiglu_limit argument (gpt-oss's swiglu_limit).
GPTOSS_SWIGLU_LIMIT = 7.0

#: CDNA >= 3: vLLM AiterExperts._supports_current_device (is_aiter_found_and_supported: gfx942/gfx950, gfx90a
#: excluded).
AITER_ARCH_SOURCE = (f"{V}:vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py (AiterExperts); "
                     f"{V}:vllm/_aiter_ops.py")


def aiter_common_checks(layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason]:
    """Activation-level API gates of aiter.fused_moe (independent of the family it dispatches to)."""
    failures: list[Reason] = []
    if caps.aiter_version is None:
        return failures
    flydsl = caps.package("flydsl")
    pin = capdb.flydsl_pin(caps.aiter_version) if flydsl else None
    if pin and not _satisfies(flydsl, pin[0]):
        # aiter/ops/flydsl/__init__.py raises ImportError on an older flydsl, which takes `import aiter.fused_moe`
        # (every AITER family) down with it.
        failures.append(Reason(f"installed flydsl {flydsl} does not satisfy AITER {caps.aiter_version}'s pin "
                               f"flydsl{pin[0]}: `import aiter.fused_moe` fails", "failed",
                               f"{pin[1]}; {A3}:aiter/ops/flydsl/__init__.py"))
    if layer.activation == "swigluoai_uninterleave":
        # Gate and up kept as separate halves -> GateMode.SEPARATED (vLLM PR #46419; aiter#3123).
        reason = need_feature(caps, "gate_mode", "swigluoai_uninterleave (separate gate/up halves)")
        if reason:
            failures.append(reason)
    limit = layer.param("limit")
    if layer.activation.startswith("swigluoai") and limit and limit != GPTOSS_SWIGLU_LIMIT:
        # AITER's Swiglu kernels were built for gpt-oss (clamp 7.0) before fused_moe(swiglu_limit=) existed; vLLM ran
        # gpt-oss on AITER v0.1.13.post1 (PR #42098): derived. Another limit needs the parameter.
        reason = need_feature(caps, "swiglu_limit", f"SwiGLU-OAI clamp limit {limit:g}")
        if reason:
            failures.append(Reason(reason.text + " (AITER's Swiglu kernels before swiglu_limit clamp at gpt-oss's "
                                   "7.0)", "failed", f"{reason.source}; vllm-project/vllm#42098", None, "derived"))
    return failures


def swiglu_decode_note(layer: MoELayer, combo: Combo) -> list[Reason]:
    """aiter v0.1.15.post3 fused_moe_ runs bf16 activations for Swiglu + SEPARATED at M < 256."""
    if layer.act.dtype == "mxfp4" and layer.activation.startswith("swigluoai"):
        return [Reason(
            "AITER's own policy for Swiglu with separate gate/up runs, by default (GPTOSS_SWIGLU_MXFP4_BF16_BOUND "
            "unset: 256), decode batches (M < 256 tokens) with bf16 activations and applies the checkpoint's MXFP4 "
            "activation QDQ from M >= 256 (another bound moves that line: the plan's `aiter` lines show what runs "
            "under the launch's environment). Unlike Triton / CK-Tile, which have no MXFP4-activation path at all, "
            "the default is the path vLLM accepted as correct for amd/MiniMax-M3-MXFP4 (GSM8K 0.940)", "note",
            f"{A3}:aiter/fused_moe.py (fused_moe_); https://github.com/vllm-project/vllm/pull/46419")]
    return []


def tuned_coverage_note(caps: Capabilities) -> list[Reason]:
    """Probed AITER only: whether its tuned fmoe CSVs have rows for this GPU's CU count."""
    if caps.tuned_cu_nums is None or caps.compute_units is None:
        return []
    source = f"{A3}:aiter/fused_moe.py (get_2stage_cfgs); {A3}:aiter/configs/tuned_fmoe.csv"
    if caps.compute_units in caps.tuned_cu_nums:
        return [Reason(f"AITER's tuned fmoe CSVs have rows for cu_num {caps.compute_units}", "note", source)]
    tuned = ", ".join(str(c) for c in sorted(caps.tuned_cu_nums)) or "none"
    return [Reason(f"AITER's tuned fmoe CSVs have no rows for cu_num {caps.compute_units} (tuned: {tuned}), so "
                   "get_2stage_cfgs falls back to default heuristics for every shape — correct, maybe slower; "
                   "MI300X/MI325X (304 CUs) had none up to v0.1.15.post3", "note", source)]


#: Model paths whose AITER floor the sources disagree on: model_types -> (floor A, its source, floor B, its source).
#: Both are kept and shown; the rules enforce only what the kernels need (e.g. gate_mode >= 0.1.14).
VERSION_FLOOR_CONFLICTS = {
    ("minimax_m3", "minimax_m3_text", "minimax_m3_vl"): (
        "0.1.15.post3", "vllm-project/vllm#46419 (the PR that enabled the AITER MoE path, GSM8K 0.940 at TP8)",
        "0.1.16.post2", "the vLLM recipes with vllm-project/vllm#46692 (not read here: unconfirmed)"),
}


def version_floor_notes(layer: MoELayer, caps: Capabilities) -> list[Reason]:
    """A caveat when the target AITER sits between two floors the sources give for this model's AITER path."""
    out = []
    for model_types, (low, low_src, high, high_src) in VERSION_FLOOR_CONFLICTS.items():
        if layer.model_type in model_types and caps.aiter_version is not None and not caps.aiter_at_least(high):
            out.append(Reason(
                f"sources disagree on the AITER floor for this model's AITER MoE path: {low} per {low_src}, "
                f"{high} per {high_src}; target AITER {caps.aiter_version} is below "
                f"{'the higher one' if caps.aiter_at_least(low) else 'both'} — moedispatch "
                "enforces only the kernel features it needs", "caveat", f"{low_src}; {high_src}", "aiter-floor",
                "unconfirmed"))
    return out


class AiterFamily(RuleBackend):
    """What every AITER family shares: AITER installed, CDNA >= 3, the fused_moe API gates, tuned-CSV coverage."""

    requires_aiter = True
    min_cdna = 3
    arch_source = AITER_ARCH_SOURCE

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        return list(aiter_common_checks(layer, caps, combo))

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason | str]:
        return [*tuned_coverage_note(caps), *version_floor_notes(layer, caps)]


@memoize(maxsize=256)
def _satisfies(version: str, spec: str) -> bool:
    try:
        return Version(version) in SpecifierSet(spec, prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return True  # cannot tell: do not reject on a parse problem
