"""Rules every AITER family shares (the ``aiter.fused_moe`` entry point), used by aiter_ck/cktile/flydsl."""

from __future__ import annotations

import functools

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch import capdb
from moedispatch.capabilities import Capabilities
from moedispatch.layers import MoELayer
from moedispatch.rules import Combo, RuleBackend, need_feature

#: CDNA >= 3: vLLM AiterExperts._supports_current_device (is_aiter_found_and_supported: gfx942/gfx950, gfx90a
#: excluded) — vllm.md §1.1, §9.
#: The clamp AITER's Swiglu kernels implement without a swiglu_limit argument (gpt-oss, models_hw.md §A.2).
GPTOSS_SWIGLU_LIMIT = 7.0

AITER_ARCH_SOURCE = "vLLM experts/rocm_aiter_moe.py AiterExperts: CDNA >= 3, gfx90a excluded"


def aiter_common_checks(layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[str]:
    """Activation-level API gates of aiter.fused_moe (independent of the family it dispatches to)."""
    failures: list[str] = []
    if caps.aiter_version is None:
        return failures
    flydsl = caps.package("flydsl")
    pin = capdb.flydsl_pin(caps.aiter_version) if flydsl else None
    if pin and not _satisfies(flydsl, pin[0]):
        # aiter/ops/flydsl/__init__.py raises ImportError on an older flydsl, which takes `import aiter.fused_moe`
        # (every AITER family) down with it (aiter_sglang.md §3.5, §8.3).
        failures.append(f"installed flydsl {flydsl} does not satisfy AITER {caps.aiter_version}'s pin flydsl{pin[0]} "
                        f"({pin[1]}): `import aiter.fused_moe` fails")
    if layer.activation == "swigluoai_uninterleave":
        # Gate and up kept as separate halves -> GateMode.SEPARATED (vLLM PR #46419; aiter#3123).
        reason = need_feature(caps, "gate_mode", "swigluoai_uninterleave (separate gate/up halves)")
        if reason:
            failures.append(reason)
    limit = layer.param("limit")
    if layer.activation.startswith("swigluoai") and limit and limit != GPTOSS_SWIGLU_LIMIT:
        # AITER's Swiglu kernels were built for gpt-oss (clamp 7.0) before fused_moe(swiglu_limit=) existed; vLLM ran
        # gpt-oss on AITER v0.1.13.post1 (PR #42098) [D]. Another limit needs the parameter.
        reason = need_feature(caps, "swiglu_limit", f"SwiGLU-OAI clamp limit {limit:g}")
        if reason:
            failures.append(reason)
    return failures


def swiglu_decode_note(layer: MoELayer, combo: Combo) -> list[str]:
    """aiter v0.1.15.post3 fused_moe_ runs bf16 activations for Swiglu + SEPARATED at M < 256."""
    if layer.act.dtype == "mxfp4" and layer.activation.startswith("swigluoai"):
        return ["note: AITER's own policy for Swiglu with separate gate/up runs decode batches (M < 256 tokens, "
                "GPTOSS_SWIGLU_MXFP4_BF16_BOUND) with bf16 activations and applies the checkpoint's MXFP4 activation "
                "QDQ from M >= 256 (aiter/fused_moe.py fused_moe_ at v0.1.15.post3; aiter_sglang.md §2.2). Unlike "
                "Triton / CK-Tile, which have no MXFP4-activation path at all, this is the path vLLM accepted as "
                "correct for amd/MiniMax-M3-MXFP4 (PR #46419: GSM8K 0.940)"]
    return []


def tuned_coverage_note(caps: Capabilities) -> list[str]:
    """Probed AITER only: whether its tuned fmoe CSVs have rows for this GPU's CU count (aiter_sglang.md §6-§7)."""
    if caps.tuned_cu_nums is None or caps.compute_units is None:
        return []
    if caps.compute_units in caps.tuned_cu_nums:
        return [f"AITER's tuned fmoe CSVs have rows for cu_num {caps.compute_units}"]
    tuned = ", ".join(str(c) for c in sorted(caps.tuned_cu_nums)) or "none"
    return [f"note: AITER's tuned fmoe CSVs have no rows for cu_num {caps.compute_units} (tuned: {tuned}), so "
            "get_2stage_cfgs falls back to default heuristics for every shape — correct, maybe slower; MI300X/MI325X "
            "(304 CUs) had none up to v0.1.15.post3 (aiter_sglang.md §6.1, §7.4)"]


class AiterFamily(RuleBackend):
    """What every AITER family shares: AITER installed, CDNA >= 3, the fused_moe API gates, tuned-CSV coverage."""

    requires_aiter = True
    min_cdna = 3
    arch_source = AITER_ARCH_SOURCE

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[str]:
        return aiter_common_checks(layer, caps, combo)

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[str]:
        return tuned_coverage_note(caps)


@functools.lru_cache(maxsize=256)
def _satisfies(version: str, spec: str) -> bool:
    try:
        return Version(version) in SpecifierSet(spec, prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return True  # cannot tell: do not reject on a parse problem
