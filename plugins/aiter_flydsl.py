"""``aiter-flydsl``: AITER FlyDSL 2-stage MoE (``flydsl_moe1/2_*``) via ``aiter.fused_moe``.

Facts: ROCm/aiter aiter/ops/flydsl/moe_kernels.py, kernels/mixed_moe_gemm_2stage.py, fused_moe.py
_get_padding_for_flydsl at v0.1.15.post3.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from moedispatch import hookimpl
from moedispatch.core.backend import Padding
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason
from moedispatch.data import capdb
from moedispatch.kit.rules import Combo, RuleBackend, find_combo, need_feature

from moedispatch_plugins._aiter import (A3, V, AiterFamily, swiglu_decode_note, tuned_coverage_note,
                                        version_floor_notes)

_KERNELS = f"{A3}:aiter/ops/flydsl/kernels/mixed_moe_gemm_2stage.py; {A3}:aiter/ops/flydsl/moe_kernels.py"
_SRC = (f"{_KERNELS} (fp4 kernels use gfx950 scaled MFMA; stage-1/2 tile_k 256 for fp4); hidden/inter rounded to "
        f"256 as vLLM/SGLang do for AITER MXFP4 ({V}:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py)")
_GFX950 = ("gfx950",)
#: FlyDSL SiTUv2 MoE (Kimi-K3): ROCm/aiter#4397 (first tag v0.1.19), rewritten as moe_2stage_a16wmix for gfx942 and
#: gfx950 by ROCm/aiter#4502 (first tag v0.1.20).
_SITU_A16 = ("ROCm/aiter@v0.1.19:aiter/fused_moe.py ('SiTUv2 + separated == a16w4 ... maps to the mixed_moe a16w4 "
             "kernel'); ROCm/aiter#4397; ROCm/aiter@v0.1.20:aiter/fused_moe.py (_is_a16w4_situv2: 'requires the FlyDSL "
             "kernel on CDNA gfx942/gfx950'); ROCm/aiter#4502; 128 = vLLM's AITER_MXFP4_BF16 round-up for SiLU/SiTU "
             "(vllm-project/vllm#50000)")
_SITU_A8 = ("ROCm/aiter@v0.1.19:aiter/fused_moe.py ('AITER_SITUV2_A8W4=1 overrides to fp8 activation (a8w4) via the "
            "tuned flydsl afp8_wfp4 config'); ROCm/aiter#4397; vllm-project/vllm#52442 (the weight layout must match: "
            "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4)")
#: AITER releases that change what FlyDSL SiTUv2 accepts.
SITU_SINCE, SITU_GFX942_SINCE = "0.1.19", "0.1.20"
#: The RadeonFlow MXFP4 a4w4 port (ROCm/aiter#3832, first release tag v0.1.18) drops expert_mask.
A4W4_PORT_SINCE = "0.1.18"


@dataclass(frozen=True)
class ActCombo(Combo):
    """A :class:`Combo` that only a layer with one of ``activations`` matches (listed before the generic rows)."""

    activations: tuple[str, ...] = ()

    def matches(self, layer: MoELayer) -> bool:
        return layer.activation in self.activations and super().matches(layer)


@dataclass(frozen=True)
class NarrowingCombo(Combo):
    """A :class:`Combo` whose intermediate alignment drops to ``narrow_multiple`` on an AITER that has
    ``narrow_feature`` (capability_db/aiter.toml: the version floor and its source live in the data)."""

    narrow_feature: str = ""
    narrow_multiple: int = 0

    def for_caps(self, caps: Capabilities) -> Combo:
        """This combo as the target AITER runs it: the narrower alignment where the feature is present."""
        if self.narrow_feature and caps.has_feature(self.narrow_feature):
            info = capdb.feature_info(self.narrow_feature)
            return replace(self, inter_multiple=self.narrow_multiple, source=info["source"],
                           confidence=info["confidence"], narrow_feature="")
        return self


COMBOS = (
    ActCombo("mxfp4", "bf16", ("gfx942", "gfx950"), "FlyDSL a16w4 SiTUv2 (mixed_moe / moe_2stage_a16wmix)", _SITU_A16,
             feature="flydsl_moe", hidden_multiple=128, inter_multiple=128, activations=("situv2",)),
    ActCombo("mxfp4", "fp8", _GFX950, "FlyDSL a8w4 SiTUv2 (AITER_SITUV2_A8W4=1, flydsl afp8_wfp4)", _SITU_A8,
             feature="flydsl_moe", hidden_multiple=256, inter_multiple=256, activations=("situv2",)),
    Combo("mxfp4", "mxfp4", _GFX950, "FlyDSL a4w4 (flydsl_moe*_afp4_wfp4_*)", _SRC, feature="flydsl_moe",
          hidden_multiple=256, inter_multiple=256),
    Combo("mxfp4", "bf16", _GFX950, "FlyDSL a16w4", _SRC, feature="flydsl_moe", hidden_multiple=256,
          inter_multiple=256),
    NarrowingCombo("mxfp4", "fp8", _GFX950, "FlyDSL a8w4 (flydsl_moe*_afp8_wfp4_*)", _SRC, feature="flydsl_moe",
                   hidden_multiple=256, inter_multiple=256, narrow_feature="flydsl_a8w4_inter128",
                   narrow_multiple=128),
    Combo("mxfp4", "mxfp8", _GFX950, "FlyDSL a8w4 (MXFP8 activations)", _SRC, feature="mxfp8_act_quant_sort",
          hidden_multiple=256, inter_multiple=256),
    Combo("int4", "bf16", _GFX950, "FlyDSL a16wi4 (flydsl_moe*_abf16_wint4_*, the only a16wi4 path)",
          f"{_KERNELS} (tuned for gfx950; receives no pads)", weight_granularity=("group32",),
          feature="flydsl_moe", hidden_multiple=128, inter_multiple=128),
    Combo("mxfp8", "mxfp8", _GFX950, "FlyDSL MXFP8 MoE (vLLM AiterMxfp8Experts)",
          f"{V}:vllm/model_executor/layers/fused_moe/experts/aiter_mxfp8_moe.py", feature="flydsl_mxfp8_moe",
          hidden_multiple=256,
          inter_multiple=256),
)


class AiterFlyDSL(AiterFamily):
    name = "aiter-flydsl"
    preference = 70
    family = "flydsl"
    description = "AITER FlyDSL 2-stage fused MoE (MXFP4/MXFP8 weights, gfx950)"
    combos = COMBOS
    activations = {
        "silu": "FlyDSL MoE Silu",
        "swigluoai": "FlyDSL Swiglu fp4 heuristics (aiter/fused_moe.py get_2stage_cfgs)",
        "swigluoai_uninterleave": "Swiglu with GateMode.SEPARATED (aiter#3123)",
        "situv2": "SiTUv2 (Kimi-K3) a16w4 / a8w4 (ROCm/aiter#4397)",
    }
    bias_supported = True
    pad_semantics = "skip"

    def pad_semantics_for(self, layer: MoELayer, caps: Capabilities, kernel_hidden_pad: int,
                          kernel_intermediate_pad: int) -> str:
        # FlyDSL skips the padded sub-tiles it is told about; with no pad forwarded (AITER < 0.1.15, a bias under the
        # 0.1.15.post3 guard, or the PR #3538 workaround) it computes over the whole zero-filled extent.
        return "skip" if kernel_hidden_pad or kernel_intermediate_pad else "compute"

    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        failures = super().extra_checks(layer, caps, combo)
        flydsl = caps.package("flydsl")
        if caps.aiter_version is not None and caps.source_of("packages") and flydsl is None:
            failures.append(Reason("the flydsl package is not installed: AITER uses flydsl_fallback rows or "
                                   "heuristics instead", "failed",
                                   f"{A3}:aiter/fused_moe.py (get_2stage_cfgs); {A3}:aiter/ops/flydsl/__init__.py"))
        if layer.activation == "situv2":
            failures += _situ_checks(layer, caps)
        return failures

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason | str]:
        notes: list[Reason | str] = [*swiglu_decode_note(layer, combo), *tuned_coverage_note(caps),
                                     *version_floor_notes(layer, caps)]
        if (layer.ep > 1 and layer.weight.dtype == "mxfp4" and layer.act.dtype == "mxfp4"
                and caps.aiter_at_least(A4W4_PORT_SINCE)):
            notes.append(Reason(
                f"at AITER >= {A4W4_PORT_SINCE} a tuned a4w4 row that routes to the RadeonFlow MXFP4 port raises "
                "NotImplementedError with expert parallelism ('expert_mask is dropped by the output_aux sort path'); "
                "the FlyDSL heuristic path keeps expert_mask. Check the tuned CSV for this shape, or run without EP",
                "caveat", "ROCm/aiter@v0.1.19:aiter/fused_moe.py (fused_moe_2stages, metadata.output_aux); "
                "ROCm/aiter#3832"))
        if layer.activation == "situv2":
            notes.append(Reason(
                "AITER_SITUV2_A8W4=1 (AITER's a8w4 SiTUv2 kernels) needs the engine to lay the weights out for "
                "it too (vLLM VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4=1); one without the other silently produces garbage",
                "caveat", "vllm-project/vllm#52442; vllm-project/vllm#50582", "vllm#52442"))
        if layer.ep > 1 and layer.weight.dtype == "int4":
            notes.append(Reason(
                f"FlyDSL W4A16 (int4) with expert parallelism (ep={layer.ep}) gave gibberish for Kimi-K2.5 in "
                "vLLM's review of the path; verify accuracy at this EP degree before serving", "caveat",
                "https://github.com/vllm-project/vllm/pull/44400", "vllm#44400", "derived"))
        if layer.ep > 1 and layer.weight.dtype == "mxfp4" and layer.act.dtype == "fp8":
            notes.append(Reason(
                f"W4A8 (fp8 x MXFP4) with expert parallelism (ep={layer.ep}): DeepSeek-V4-Pro on MI355X scored "
                "GSM8K 0.0000 at EP8 through SGLang's AITER MoE while EP1 was unaffected (cause not isolated); "
                "verify accuracy at this EP degree before serving", "caveat",
                "https://github.com/SemiAnalysisAI/InferenceX/pull/1266", "InferenceX#1266", "derived"))
        return notes

    def _plan_padding(self, layer: MoELayer, caps: Capabilities) -> Padding:
        # A version-keyed alignment (NarrowingCombo): plan with the combo as the target AITER runs it.
        # Why a narrower alignment does (or does not yet) apply travels with the padding it explains, so a plan that
        # AITER's dispatch re-pads (selector.runtime.dispatched_padding) does not keep a stale note.
        combo = next(iter(find_combo([c for c in self.combos if caps.gfx in c.archs], layer)), None)
        if not isinstance(combo, NarrowingCombo) or combo.for_caps(caps) is combo:
            plan = super()._plan_padding(layer, caps)
        else:
            view = copy.copy(self)
            view.combos = (combo.for_caps(caps),)
            plan = RuleBackend._plan_padding(view, layer, caps)
        extra = tuple(_narrowing_notes(layer, caps, combo)) if combo is not None else ()
        return replace(plan, notes=extra + plan.notes) if extra else plan

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        if not padding.padded:
            return 0, 0, []
        if need_feature(caps, "flydsl_pads", "FlyDSL pads") is not None:
            return 0, 0, [Reason(f"kernel pads 0: AITER {caps.aiter_version} never forwards pads to FlyDSL (pads "
                                 "reach it from 0.1.15); it computes over the zero-filled extent", "padding",
                                 "ROCm/aiter#3184")]
        if layer.has_bias and caps.has_feature("flydsl_pad_bias_guard"):
            return 0, 0, [Reason("kernel pads 0: with a bias AITER >= 0.1.15.post3 turns FlyDSL pad-skipping off "
                                 "(_get_padding_for_flydsl returns (0, 0))", "padding",
                                 f"{A3}:aiter/fused_moe.py (_get_padding_for_flydsl); ROCm/aiter#3401")]
        return padding.hidden_pad, padding.intermediate_pad, [Reason(
            "FlyDSL receives inter_dim_pad/model_dim_pad and skips whole padded sub-tiles", "padding",
            f"{A3}:aiter/fused_moe.py (_get_padding_for_flydsl); {_KERNELS}")]


@hookimpl
def register_backends():
    return [AiterFlyDSL()]


def _narrowing_notes(layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason]:
    """Why an intermediate per rank that the narrower alignment fits is (or is not yet) run unpadded."""
    if not isinstance(combo, NarrowingCombo) or not combo.narrow_feature:
        return []
    inter, wide, narrow = layer.intermediate_per_rank, combo.inter_multiple_for(layer, caps.gfx), combo.narrow_multiple
    if inter % narrow or not inter % wide:
        return []
    info = capdb.feature_info(combo.narrow_feature)
    if caps.has_feature(combo.narrow_feature):
        return [Reason(f"intermediate per rank {inter} runs unpadded (a multiple of {narrow}, not of {wide}): AITER >= "
                       f"{info['since']} has {info['short']}", "note", info["cite"], None, info["confidence"])]
    return [Reason(f"intermediate per rank {inter} padded to a multiple of {wide}: AITER {caps.aiter_version} < "
                   f"{info['since']} lacks {info['short']} (its gate/up-interleaved scale shuffle needs K/32 to be a "
                   "multiple of 8); from that release it runs unpadded", "padding", info["cite"], None,
                   info["confidence"])]


def _situ_checks(layer: MoELayer, caps: Capabilities) -> list[Reason]:
    """What AITER's FlyDSL SiTUv2 path refuses (each check a NotImplementedError or a missing enum upstream)."""
    if caps.aiter_version is None:
        return []
    if not caps.aiter_at_least(SITU_SINCE):
        return [Reason(f"SiTUv2 needs AITER >= {SITU_SINCE} (ActivationType.Situv2 and the FlyDSL SiTUv2 kernels, "
                       f"ROCm/aiter#4397); target AITER is {caps.aiter_version}", "failed",
                       "ROCm/aiter@v0.1.19:csrc/include/aiter_enum.h (Situv2); ROCm/aiter#4397")]
    failures = []
    if caps.gfx == "gfx942" and not caps.aiter_at_least(SITU_GFX942_SINCE):
        failures.append(Reason(f"FlyDSL a16w4 SiTUv2 on gfx942 needs AITER >= {SITU_GFX942_SINCE} (ROCm/aiter#4502: "
                               f"moe_2stage_a16wmix for gfx942/gfx950); target AITER is {caps.aiter_version}",
                               "failed", "ROCm/aiter#4502"))
    if layer.act.dtype == "mxfp4":
        failures.append(Reason("a4w4 SiTUv2 has no full 2-stage path ('no CK situv2 stage2'): AITER maps SiTUv2 to "
                               "a16w4 (bf16 activations), which would skip the checkpoint's MXFP4 activation QDQ",
                               "failed", "ROCm/aiter@v0.1.19:aiter/fused_moe.py (Situv2 branch); ROCm/aiter#4463"))
    if caps.aiter_at_least(SITU_GFX942_SINCE) and layer.act.dtype in ("bf16", "fp16"):
        src = "ROCm/aiter@v0.1.20:aiter/fused_moe.py (_is_a16w4_situv2 NotImplementedError); ROCm/aiter#4502"
        if layer.ep > 1:
            failures.append(Reason(f"a16w4 SiTUv2 rejects expert-parallel masking (ep={layer.ep}): AITER raises "
                                   "NotImplementedError", "failed", src))
        if layer.has_bias:
            failures.append(Reason("a16w4 SiTUv2 rejects a per-expert bias: AITER raises NotImplementedError",
                                   "failed", src))
    return failures
