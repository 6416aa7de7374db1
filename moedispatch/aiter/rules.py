"""What differs between AITER releases: :class:`Rules` (one per release range, read in each tag's
``aiter/fused_moe.py``), :func:`lookup_rules` (a version → its rules; HEAD and the 0.1.7 wheel by name), the token
buckets each release pads M to (:func:`get_padded_M`) and the version comparison the model uses (:func:`_at_least`).
Pure data and pure functions: nothing here reads a tuned CSV."""

from __future__ import annotations

from dataclasses import dataclass

from moedispatch.aiter.vocab import BF16, FP8, GELU, Q_1X128, Q_TOKEN, SILU, SRC_FUSED_MOE
from moedispatch.core.aiter_release import release_of
from moedispatch.core.workload import PADDED_M_TIERS


_TAG = "https://github.com/ROCm/aiter/blob/{tag}/aiter/fused_moe.py"


@dataclass(frozen=True)
class Rules:
    """How one AITER release builds and matches its lookup key (read in ``aiter/fused_moe.py`` at each tag).

    ``padded_m``: ``v017`` (M ≤ 16 → 16, next power of two, 1024 cap), ``v08`` (≤16 → 16, pow2 < 1024, 1024 < 2048,
    2048 < 16384, else 16384), ``v09`` (as v08 but M ≤ 16 → next power of two), ``cap32768`` (pow2 below 32768, else
    32768), ``tiers`` (pow2 below 32768, tiers 32768/131072 with fallback to smaller tiers). ``act_exact``: the key
    holds ``str(activation)`` so the exact dict can match (False where it holds the pybind enum). ``act_policy``:
    ``v017`` (per_1x32 → fp4x2, else the weight dtype), ``swiglu512`` (Swiglu MXFP4 bf16 below 512, fp8 from 512 on
    gfx950), ``head`` (SEPARATED / INTERLEAVE / SiTUv2 rules). ``heuristics``: ``v017`` or ``head``.
    """

    name: str
    padded_m: str
    gfx_key: bool
    act_exact: bool
    act_wildcard: bool
    ep_strip: bool
    act_policy: str
    bound_env: str | None
    bound_default: int
    drop_fallback_rows: bool
    heuristics: str
    source: str
    #: _fused_moe_impl refuses a16w4 SiTUv2 under EP / bias / no FlyDSL / unshuffled weights (from v0.1.20; in
    #: v0.1.19.x SiTUv2 a16w4 routes to FlyDSL's mixed_moe with no such guard).
    situv2_guard: bool = False
    #: ``ActivationType.Situv2`` exists (v0.1.19+); before, a SiTUv2 layer cannot be handed to fused_moe at all.
    situv2: bool = False
    #: The untuned a16wi4 FlyDSL heuristic splits K with get_ksplit and names stage 1 ``…_kb{ksplit}`` (up to
    #: v0.1.19.post2: ROCm/aiter@v0.1.18:aiter/fused_moe.py lines 2118-2158); v0.1.20 dropped it (ksplit 0).
    wint4_ksplit: bool = True
    #: The untuned per_1x32 FlyDSL heuristic's scope (get_2stage_cfgs): ``none`` (before v0.1.14: no such branch);
    #: ``swiglu_a4w4`` — only Swiglu with fp4x2 activations and fp4x2 weights, and it keeps get_ksplit's value
    #: (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1320-1399: ``swiglu_mxfp4_flydsl``, ``int(ksplit)``);
    #: ``force_w4`` — AITER_FLYDSL_FORCE (default "1") opens it to every activation with fp4x2/fp8 activations, fp4x2
    #: weights only, ksplit -1 (ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1464-1553);
    #: ``force`` — fp8 (MXFP8) weights too (ROCm/aiter@v0.1.16.post1:aiter/fused_moe.py lines 1469-1479;
    #: v0.1.17 lines 1578-1590), and from v0.1.20 the a16w4 SiTUv2 route (``situv2_guard``).
    flydsl_heuristic: str = "force"
    #: The FlyDSL heuristic's stage-2 tile_k: 256 if inter_dim % 256 == 0 else 128 (ROCm/aiter@v0.1.16.post1:
    #: aiter/fused_moe.py line 1492; v0.1.17 line 1602; pick_flydsl_stage2_tile_k from v0.1.19); v0.1.16 always 256
    #: (ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1484-1512: ``flydsl_kernel_name(2, …, 128, 256, "atomic")``).
    flydsl_s2_tile_k_pick: bool = True
    #: MXFP8 (per_1x32 fp8 weights): fp8 activations in _fused_moe_impl (ROCm/aiter@v0.1.16.post1:aiter/fused_moe.py
    #: lines 408-410) and the gate_mode != SEPARATED CK-Tile branch excludes fp8 weights (line 1396), added by
    #: ROCm/aiter#3811 in v0.1.16.post1. Before, the weights take the generic per_1x32 activation branch (fp4x2;
    #: Swiglu/INTERLEAVE rules) and an interleaved Swiglu layer goes to CK-Tile (ROCm/aiter@v0.1.16:aiter/fused_moe.py
    #: lines 408-417, 1388-1393).
    mxfp8: bool = True
    #: Untuned SwiGLU MXFP4 that reached no other branch (unshuffled weights) routes to CK-Tile with split-K ≥ 2
    #: (ROCM-25478: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1698-1731); before, it goes on to CK 2-stage.
    swiglu_unshuffled_cktile: bool = True
    #: flydsl not importable and the tuned row names FlyDSL kernels: AITER swaps in the shape's ``flydsl_fallback``
    #: row (act wildcarded, the requested bucket), else drops the row for the heuristics
    #: (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 943-971, 1062-1080; v0.1.12 lines 765-790, 855-873, exact
    #: key; from v0.1.11 to v0.1.17 — v0.1.18 removed it and hands the names to the non-FlyDSL launchers).
    flydsl_fallback_rows: bool = False
    #: gfx1250 forces fp4x2 (or fp8 with AITER_FORCE_A8W4) activations (ROCm/aiter@v0.1.17:aiter/fused_moe.py lines
    #: 438-442); absent before.
    gfx1250_act: bool = True
    #: SiTUv2's activation dtype is decided before the Swiglu/INTERLEAVE branches, with AITER_SITUV2_A8W4 /
    #: AITER_SITUV2_A4W4 (ROCm/aiter@v0.1.19.post1:aiter/fused_moe.py lines 721-734). v0.1.19 tests it after them, so
    #: an INTERLEAVE SiTUv2 layer takes the Swiglu/INTERLEAVE bound (fp8 from AITER_BF16_FP8_MOE_BOUND on gfx950), and
    #: a SEPARATED one is bf16 unless AITER_SITUV2_A8W4=1 (no A4W4 switch) (ROCm/aiter@v0.1.19:aiter/fused_moe.py lines
    #: 611-630).
    situv2_act_first: bool = True
    #: fused_moe_1stage_dict keys this release does not have yet (HEAD's table minus these): gfx950 lacks Gelu
    #: per_1x128 before v0.1.12 (ROCm/aiter@v0.1.11:aiter/fused_moe.py fused_moe_1stage_dict) and the non-doweight
    #: per_Token fp8 Silu/Gelu entries before v0.1.11 (ROCm/aiter@v0.1.10.post2:aiter/fused_moe.py lines 546-552).
    one_stage_missing: frozenset = frozenset()
    #: The heuristic 1-stage conditions: ``head`` (v0.1.12+: per_1x128 needs inter_dim % 128 == 0, per_Token fp8 runs
    #: 1-stage when token > 16 or inter_dim % 128 != 0; ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 888-896);
    #: ``v08`` (v0.1.8–v0.1.10: per_1x128 needs inter_dim % 256 == 0, per_Token fp8 only token > 16;
    #: ROCm/aiter@v0.1.10.post2:aiter/fused_moe.py lines 718-723); ``v011`` (v0.1.11: as ``v08``, but a non-doweight
    #: per_Token fp8 layer on gfx950 runs 1-stage only when inter_dim == 192; ROCm/aiter@v0.1.11.post1:
    #: aiter/fused_moe.py lines 842-851).
    one_stage_conds: str = "head"
    #: ``use_cfg``: a Silu bf16 per_1x128 fp8 layer with token * topk <= 128 skips the tuned rows (v0.1.9–v0.1.12.x:
    #: ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 831-843; v0.1.10.post2 lines 678-690).
    blockscale_small_bypass: bool = False
    #: a16wi4 exists (per_1x32 int4 weights: bf16 activations and the FlyDSL a16wi4 heuristic) from v0.1.13.post1
    #: (ROCm/aiter@v0.1.13.post1:aiter/fused_moe.py lines 267-269); before, int4 per_1x32 weights take the generic
    #: per_1x32 activation (fp4x2; Swiglu bf16/fp8) and the ASM/CK heuristics.
    a16wi4: bool = True
    #: Before gate_mode (v0.1.14) every bf16 Swiglu per_1x32 layer goes to CK-Tile with get_block_m() and the plain
    #: ksplit (ROCm/aiter@v0.1.12:aiter/fused_moe.py lines 999-1022; v0.1.10.post2 lines 780-801).
    swiglu_cktile_any_gate: bool = False
    #: The a16wi4 FlyDSL heuristic is tested before that Swiglu CK-Tile branch (v0.1.13.post1: ROCm/aiter@v0.1.13.post1:
    #: aiter/fused_moe.py lines 1026-1063 before 1064); from v0.1.14 the gate_mode CK-Tile branch comes first.
    wint4_before_swiglu_cktile: bool = False
    #: The 1-stage xbf16 switch (the row's ``xbf16`` column / AITER_XBFLOAT16) exists from v0.1.13
    #: (ROCm/aiter@v0.1.13:aiter/fused_moe.py run_1stage_xbf16); before, no xbf16 variant runs.
    xbf16: bool = True
    #: AITER_KSPLIT=-1 drops a tuned row's ksplit (from v0.1.13; ROCm/aiter@v0.1.14:aiter/fused_moe.py lines
    #: 1066-1069); before, the row's ksplit always applies (ROCm/aiter@v0.1.12:aiter/fused_moe.py line 922).
    ksplit_env_off: bool = True
    #: A tuned Opus row is dropped for unshuffled weights or an activation other than Silu/Swiglu/SiTUv2 (from
    #: v0.1.20: ROCm/aiter@v0.1.20.post1:aiter/fused_moe.py lines 2285-2309); v0.1.17–v0.1.19.x keep it (only
    #: cfg_is_supported's EP/bias/arch checks: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1277-1295).
    opus_discard: bool = True
    #: AITER_BYPASS_TUNE_CONFIG with an Opus row: HEAD validates the kept row against the heuristic block_m and raises
    #: ValueError (ROCm/aiter@e4048607:aiter/fused_moe.py lines 2452-2458, parse_stage2_config); v0.1.17–v0.1.19.x
    #: only read its values (stage2_cfg_values, no check: ROCm/aiter@v0.1.17:aiter/fused_moe.py lines 1390-1396) and
    #: run the heuristics.
    opus_bypass_raises: bool = True


#: Heuristic fields of the releases before v0.1.16.post1 (FlyDSL heuristic without MXFP8, fixed stage-2 tile_k; no
#: ROCM-25478 branch; the flydsl_fallback rows replace FlyDSL rows when flydsl is missing).
_PRE_MXFP8 = dict(flydsl_s2_tile_k_pick=False, mxfp8=False, swiglu_unshuffled_cktile=False, gfx1250_act=False,
                  flydsl_fallback_rows=True)
#: Before gate_mode and a16wi4 (v0.1.13.x and older): every bf16 Swiglu MXFP4 layer → CK-Tile, no a16wi4.
_PRE_GATE = dict(_PRE_MXFP8, flydsl_heuristic="none", a16wi4=False, swiglu_cktile_any_gate=True)
#: Before v0.1.13: no xbf16, AITER_KSPLIT=-1 does not drop a row's ksplit.
_PRE_XBF16 = dict(_PRE_GATE, xbf16=False, ksplit_env_off=False)
#: v0.1.17–v0.1.19.x: Opus rows exist, without v0.1.20's discard checks or HEAD's bypass validation.
_PRE_OPUS_CHECKS = dict(opus_discard=False, opus_bypass_raises=False)
_ONE_STAGE_V011_MISSING = frozenset({("gfx950", (GELU, Q_1X128, BF16, FP8, FP8, 1, 0))})
_ONE_STAGE_V08_MISSING = _ONE_STAGE_V011_MISSING | {("gfx950", (SILU, Q_TOKEN, BF16, FP8, FP8, 1, 0)),
                                                    ("gfx950", (GELU, Q_TOKEN, BF16, FP8, FP8, 1, 0))}
_RULES: tuple[tuple[str, Rules], ...] = (
    ("<0.1.8", Rules("v0.1.7", "v017", False, True, False, False, "v017", None, 512, False, "v017",
                     _TAG.format(tag="v0.1.7"))),
    ("<0.1.9", Rules("v0.1.8", "v08", False, True, False, False, "v017", None, 512, False, "head",
                     _TAG.format(tag="v0.1.8"), one_stage_missing=_ONE_STAGE_V08_MISSING,
                     one_stage_conds="v08", **{**_PRE_XBF16, "flydsl_fallback_rows": False})),
    ("<0.1.11", Rules("v0.1.9–v0.1.10", "v09", False, True, False, False, "swiglu512", None, 512, False, "head",
                      _TAG.format(tag="v0.1.10.post2"), one_stage_missing=_ONE_STAGE_V08_MISSING,
                      one_stage_conds="v08", blockscale_small_bypass=True,
                      **{**_PRE_XBF16, "flydsl_fallback_rows": False})),
    ("<0.1.12", Rules("v0.1.11", "v09", False, True, False, False, "swiglu512", None, 512, False, "head",
                      _TAG.format(tag="v0.1.11.post1"), one_stage_missing=_ONE_STAGE_V011_MISSING,
                      one_stage_conds="v011", blockscale_small_bypass=True, **_PRE_XBF16)),
    ("<0.1.13", Rules("v0.1.12", "cap32768", False, True, False, False, "swiglu512", None, 512, True, "head",
                      _TAG.format(tag="v0.1.12"), blockscale_small_bypass=True, **_PRE_XBF16)),
    # v0.1.13 hard-codes the Swiglu MXFP4 bound at 256 (ROCm/aiter@v0.1.13:aiter/fused_moe.py line 266);
    # v0.1.13.post1 reads AITER_BF16_FP8_BOUND (default 512, line 266) and adds a16wi4.
    ("<0.1.13.post1", Rules("v0.1.13", "cap32768", False, True, False, False, "swiglu512", None, 256, True, "head",
                            _TAG.format(tag="v0.1.13"), **_PRE_GATE)),
    ("<0.1.14", Rules("v0.1.13.post1", "cap32768", False, True, False, False, "swiglu512", "AITER_BF16_FP8_BOUND",
                      512, True, "head", _TAG.format(tag="v0.1.13.post1"),
                      **{**_PRE_GATE, "a16wi4": True, "wint4_before_swiglu_cktile": True})),
    ("<0.1.16", Rules("v0.1.14–v0.1.15", "tiers", False, False, True, False, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                      True, "head", _TAG.format(tag="v0.1.15.post3"), flydsl_heuristic="swiglu_a4w4",
                      **_PRE_MXFP8)),
    ("<0.1.16.post1", Rules("v0.1.16", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                            True, "head", _TAG.format(tag="v0.1.16"), flydsl_heuristic="force_w4", **_PRE_MXFP8)),
    ("<0.1.17", Rules("v0.1.16.post1–v0.1.16.post6", "tiers", True, False, True, True, "head",
                      "AITER_BF16_FP8_MOE_BOUND", 256, True, "head", _TAG.format(tag="v0.1.16.post1"),
                      swiglu_unshuffled_cktile=False, gfx1250_act=False, flydsl_fallback_rows=True)),
    ("<0.1.18", Rules("v0.1.17", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                      True, "head", _TAG.format(tag="v0.1.17"), flydsl_fallback_rows=True, **_PRE_OPUS_CHECKS)),
    ("<0.1.19", Rules("v0.1.18", "tiers", True, True, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256, True,
                      "head", _TAG.format(tag="v0.1.18"), **_PRE_OPUS_CHECKS)),
    # v0.1.19 keys on str(activation) like v0.1.18 (ROCm/aiter@v0.1.19:aiter/fused_moe.py line 1814); v0.1.19.post1
    # went back to the pybind enum (ROCm/aiter@v0.1.19.post1:aiter/fused_moe.py line 2119).
    ("<0.1.19.post1", Rules("v0.1.19", "tiers", True, True, True, True, "head", "AITER_BF16_FP8_MOE_BOUND", 256,
                            True, "head", _TAG.format(tag="v0.1.19"), situv2=True, situv2_act_first=False,
                            **_PRE_OPUS_CHECKS)),
    ("<0.1.20", Rules("v0.1.19.post1–v0.1.19.post2", "tiers", True, False, True, True, "head",
                      "AITER_BF16_FP8_MOE_BOUND", 256, True, "head", _TAG.format(tag="v0.1.19.post2"), situv2=True,
                      **_PRE_OPUS_CHECKS)),
)
HEAD_RULES = Rules("HEAD e4048607 (v0.1.20+)", "tiers", True, False, True, True, "head", "AITER_BF16_FP8_MOE_BOUND",
                   256, True, "head", SRC_FUSED_MOE, situv2_guard=True, situv2=True, wint4_ksplit=False)
LEGACY_RULES = _RULES[0][1]


def lookup_rules(version: "str | Rules | None") -> Rules:
    """The :class:`Rules` of an AITER version (``head``/``legacy`` and None accepted: HEAD / the 0.1.7 rules)."""
    if isinstance(version, Rules):
        return version
    if version in (None, "head"):
        return HEAD_RULES
    if version == "legacy":
        return LEGACY_RULES
    from packaging.version import Version

    release = release_of(str(version))
    if release is None:
        return HEAD_RULES
    for spec, rules in _RULES:
        if release < Version(spec[1:]):
            return rules
    return HEAD_RULES


# -- token buckets -------------------------------------------------------------------------------------------------

_TIERS = PADDED_M_TIERS  # _PADDED_M_TIERS (HEAD)


def _pow2(M: int) -> int:
    return 1 if M <= 1 else 1 << (M - 1).bit_length()


def get_padded_M(M: int, model: "str | Rules" = "head") -> int:
    """AITER's token bucket (``get_padded_M``) under a release's rules (``model``: ``head``, ``legacy``, a version
    or :class:`Rules`). HEAD: next power of two below 32768, then the tiers 32768 / 131072. 0.1.7: every M ≤ 16 →
    16, next power of two below 1024, 1024 above."""
    style = lookup_rules(model).padded_m
    if style in ("v017", "v08", "v09"):
        if 1 <= M <= 16:
            return 16 if style in ("v017", "v08") else _pow2(M)
        if M < 1024:
            return _pow2(M)
        if style == "v017":
            return 1024
        return 1024 if M < 2048 else 2048 if M < 16384 else 16384
    if style == "cap32768":
        return _pow2(M) if M < 32768 else 32768
    if M < _TIERS[0]:
        return 1 if M <= 1 else 1 << (M - 1).bit_length()
    for tier in reversed(_TIERS):
        if M >= tier:
            return tier
    return _TIERS[0]


def _at_least(version: str | None, floor: str) -> bool:
    """The release a version carries (:func:`release_of`: ``0.1.20rc1`` → 0.1.20; ``0.1.20.dev3``, a build after
    v0.1.19.x, stays below 0.1.20) is ``floor`` or later."""
    from packaging.version import Version

    release = release_of(version) if version is not None else None
    return release is not None and release >= Version(floor)
