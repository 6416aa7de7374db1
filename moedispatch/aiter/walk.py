"""The per-token dispatch walk: what AITER runs for exactly ``M`` tokens (:func:`dispatch_token`), replaying
``_fused_moe_impl`` / ``get_2stage_cfgs`` — the activation dtype, the tuned row and the filters that drop it (xbf16,
``use_cfg``, flydsl_fallback, Opus, ``AITER_BYPASS_TUNE_CONFIG``), then the kernel routing (FlyDSL, CK-Tile, CK 2-stage,
ASM 1-stage and ASM + CK/CK-Tile/Opus) — on HEAD (:func:`_dispatch_head`, every release ≥ 0.1.8 with its
:class:`~moedispatch.aiter.rules.Rules` differences) and on the 0.1.7 wheel (:func:`_dispatch_legacy`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from moedispatch.aiter.activation import activation_dtype
from moedispatch.aiter.env import _env_int
from moedispatch.aiter.flydsl import _MXMOE_BM, _flydsl_heuristic_names
from moedispatch.aiter.heuristics import (_ONE_STAGE_HEAD, _ONE_STAGE_LEGACY, _block_size_M, _ksplit, _one_stage_op,
                                          _situv2_a16w4_refusal, _stage2_name, _tier_block_m)
from moedispatch.aiter.key import Assumptions, DispatchKey
from moedispatch.aiter.lookup import _flydsl_fallback_row, _lookup
from moedispatch.aiter.rules import HEAD_RULES, LEGACY_RULES, Rules, get_padded_M, lookup_rules
from moedispatch.aiter.steps import DispatchStep, _family
from moedispatch.aiter.vocab import (BF16, FP4, FP8, FP8_FNUZ, FP16, I4, I8, Q_1X32, Q_1X128, Q_TOKEN, SILU, SITUV2,
                                     SWIGLU, U32, _fp8, _label)
from moedispatch.core.errors import UsageError
from moedispatch.data.aiter_configs import ConfigSet, TunedRow


@dataclass(frozen=True)
class _Call:
    """One ``fused_moe`` call as the HEAD walk sees it: the requested count ``M``, its bucket, the key, the
    environment, the release's rules, the engine assumptions and the activation dtype; ``notes`` is the list of
    reasons gathered so far, appended to as the walk goes (every step built for this call carries them)."""

    M: int
    token: int
    key: DispatchKey
    env: Mapping[str, str]
    rules: Rules
    a: Assumptions
    q_a: str
    notes: list[str]


@dataclass(frozen=True)
class _Choice:
    """What the tuned row (``row``), or without one the heuristics, fixed before the kernels are routed."""

    row: TunedRow | None
    kn1: str
    kn2: str
    block_m: int
    ksplit: int
    basis: str
    run_1stage: bool
    #: The 1-stage ASM op the heuristics chose (row None and run_1stage only).
    api: str | None = None


def _dispatch_head(M: int, key: DispatchKey, cs: ConfigSet | None, env: Mapping[str, str],
                   a: Assumptions, rules: Rules = HEAD_RULES) -> DispatchStep:
    """``_fused_moe_impl`` + ``get_2stage_cfgs`` for ``M`` tokens: the activation dtype, the tuned row and what
    drops it, the heuristic shape without one, then the kernel routing, first branch that applies."""
    token = get_padded_M(M, rules)
    q_a, why_a = activation_dtype(M, key, env, rules)
    call = _Call(M, token, key, env, rules, a, q_a, [why_a])
    refused = _situv2_a16w4_refusal(key, q_a, a) if rules.situv2_guard else None
    if refused:
        return _dispatch_raises(call, None, refused)
    row, opus_row = _dispatch_filter_row(call, cs, _dispatch_lookup_row(call, cs))
    if row is None:
        c = _dispatch_heuristic_choice(call)
        if opus_row is not None and c.block_m != opus_row.block_m and rules.opus_bypass_raises:
            # The bypass keeps cfg, and parse_stage2_config(cfg, block_m) checks the heuristic block_m against the
            # Opus kernel's sort block_m (fused_moe.py get_2stage_cfgs; aiter/ops/opus/moe_stage2_a8w4.py).
            return _dispatch_raises(call, c.block_m,
                                    f"ValueError: requires sort block_m={opus_row.block_m}, got tuned "
                                    f"block_m={c.block_m} (AITER_BYPASS_TUNE_CONFIG with the Opus row "
                                    f"{opus_row.where})")
    else:
        c = _dispatch_tuned_choice(call, row)
    step = _dispatch_stepper(call, c.row)
    return (_dispatch_named_kernels(call, c, step) or _dispatch_cktile_or_wint4(call, c, step)
            or _dispatch_flydsl_heuristic(call, c, step) or _dispatch_cktile_mxfp4(call, c, step)
            or _dispatch_ck_or_asm(call, c, step))


def _dispatch_raises(call: _Call, block_m: int | None, raises: str) -> DispatchStep:
    """The step of a call AITER refuses (``raises``) before it launches anything."""
    return DispatchStep(tokens=(call.M, call.M), bucket=call.token, stages=2, family="none", kernels=(),
                        block_m=block_m, activation_dtype=_label(call.q_a, call.key.q_type), basis="heuristic",
                        config=None, buckets=(call.token,), q_dtype_a=call.q_a, notes=tuple(call.notes),
                        raises=raises)


def _dispatch_lookup_row(call: _Call, cs: ConfigSet | None) -> TunedRow | None:
    """The tuned row the lookup returns, after the release's own substitutions: no xbf16 before v0.1.13, the
    ``use_cfg`` small-blockscale bypass, the flydsl_fallback swap when flydsl is missing."""
    key, token, q_a, rules, notes, a = call.key, call.token, call.q_a, call.rules, call.notes, call.a
    fp8 = _fp8(key.gfx)  # aiter.utility.dtypes.fp8 on this arch
    row: TunedRow | None = None
    if cs is not None and not cs.broken:
        row, more = _lookup(cs, key, token, q_a, rules)
        notes += more
        if row is not None and not rules.xbf16 and row.xbf16:
            row = row._replace(xbf16=0)  # no xbf16 column read before v0.1.13 (Rules.xbf16)
        if row is not None and rules.blockscale_small_bypass and token * key.topk <= 128 and (
                key.act_type, key.dtype, q_a, key.q_dtype_w, key.q_type) == (SILU, BF16, fp8, fp8, Q_1X128):
            notes.append(f"use_cfg: Silu per_1x128 fp8 with token*topk <= 128 skips the tuned row {row.where} "
                         f"({rules.name})")
            row = None
        if row is not None and rules.flydsl_fallback_rows and not a.flydsl_available and (
                row.kernel1.startswith("flydsl_") or row.kernel2.startswith("flydsl_")):
            row, more = _flydsl_fallback_row(cs, key, token, q_a, rules, row)
            notes += more
    return row


def _dispatch_filter_row(call: _Call, cs: ConfigSet | None, row: TunedRow | None
                         ) -> tuple[TunedRow | None, TunedRow | None]:
    """(row, opus_row): the row ``get_2stage_cfgs`` keeps — an Opus row it cannot run and any row under
    AITER_BYPASS_TUNE_CONFIG are dropped — and the supported Opus row (kept for the bypass's block_m check)."""
    key, env, rules, notes, a = call.key, call.env, call.rules, call.notes, call.a
    bypass = _env_int(env, "AITER_BYPASS_TUNE_CONFIG", 0) != 0
    opus_row: TunedRow | None = None
    if row is not None:
        kn1, kn2 = row.kernel1, row.kernel2
        has_opus = kn1.startswith("opus_") or kn2.startswith("opus_")
        if has_opus and not a.weights_shuffled and rules.opus_discard:
            notes.append(f"Opus row {row.where} discarded: weights not pre-shuffled")
            row = None
        elif kn1.startswith("opus_") and key.act_type not in (SILU, SWIGLU, SITUV2) and rules.opus_discard:
            notes.append(f"Opus row {row.where} discarded: activation {key.act_type} unsupported")
            row = None
        elif kn2.startswith("opus_"):
            why_not = ("requires gfx950, got " + key.gfx if key.gfx != "gfx950" else
                       "EP expert_mask/topk_ids are not supported" if key.is_ep else
                       "stage2 bias is not supported" if key.has_bias else None)
            if why_not:
                # aiter/ops/opus/moe_stage2_a8w4.py cfg_is_supported; fused_moe.py get_2stage_cfgs then drops cfg
                notes.append(f"Opus stage2 config unsupported ({why_not}): row {row.where} dropped, AITER uses "
                             "default heuristics")
                row = None
            else:
                opus_row = row
    if row is not None and bypass:
        notes.append(f"AITER_BYPASS_TUNE_CONFIG set: tuned row {row.where} ignored")
        row = None
    if row is None and cs is not None and not cs.broken and env.get("AITER_ONLINE_TUNE", "0") == "1":
        notes.append("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call (result unknown offline); "
                     "modelled as the heuristic it falls back to")
    if cs is not None and cs.broken:
        notes.append("the tuned set has malformed lines: modelled with heuristics only (" + "; ".join(cs.warnings[:2])
                     + ")")
    return row, opus_row


def _dispatch_heuristic_choice(call: _Call) -> _Choice:
    """No tuned row: 1-stage ASM where ``fused_moe_1stage_dict`` has the key and the release's conditions hold
    (block_m 32, the op from the quant type), else ``get_block_size_M`` and, for per_1x128/per_1x32, ``get_ksplit``."""
    key, token, q_a, rules, env = call.key, call.token, call.q_a, call.rules, call.env
    q_type, q_w = key.q_type, key.q_dtype_w
    run_1stage = False
    one_key = (key.act_type, q_type, key.dtype, q_a, q_w, key.use_g1u1, key.doweight_stage1)
    api = None if (key.gfx, one_key) in rules.one_stage_missing else _ONE_STAGE_HEAD.get(key.gfx, {}).get(one_key)
    if api is not None:
        conds = rules.one_stage_conds
        if q_type == Q_1X128:
            run_1stage = token > 32 and key.inter_dim % (128 if conds == "head" else 256) == 0
        elif q_type == Q_TOKEN and q_w == I8:
            run_1stage = token > 32
        elif q_type == Q_TOKEN and q_w in (FP8, FP8_FNUZ):
            if conds == "v011" and key.gfx == "gfx950" and not key.doweight_stage1:
                run_1stage = key.inter_dim == 192
            else:
                run_1stage = token > 16 or (conds == "head" and key.inter_dim % 128 != 0)
        elif q_type != Q_1X32:
            run_1stage = token < 256
    if run_1stage:
        block_m = 32
        ksplit = 0
        api = _one_stage_op(key)
    else:
        block_m = (64 if token > 32 else 16) if q_type == Q_1X128 else \
            _block_size_M(token, key.topk, key.expert, key.inter_dim, key.cu_num)
        ksplit = _ksplit(token, key.topk, key.expert, key.inter_dim, key.model_dim, key.cu_num, env) \
            if q_type in (Q_1X128, Q_1X32) else 0
    return _Choice(None, "", "", block_m, ksplit, "heuristic", run_1stage, api)


def _dispatch_tuned_choice(call: _Call, row: TunedRow) -> _Choice:
    """A tuned row decides: its kernels, block_m, run_1stage and ksplit (which AITER_KSPLIT=-1 drops from v0.1.13)."""
    ksplit = 0 if (call.rules.ksplit_env_off and _env_int(call.env, "AITER_KSPLIT", 0) == -1) else row.ksplit
    return _Choice(row, row.kernel1, row.kernel2, row.block_m, ksplit, "tuned", bool(row.run_1stage))


def _dispatch_stepper(call: _Call, row: TunedRow | None) -> Callable[..., DispatchStep]:
    """The step builder of one call: ``config``/``row`` only for a tuned basis, the call's notes then ``extra``."""
    M, token, q_a, q_type, notes = call.M, call.token, call.q_a, call.key.q_type, call.notes

    def step(stages: int, kernels: tuple[str, ...], block_m: int | None, basis: str, ksplit: int = 0,
             extra: Iterable[str] = (), family: str | None = None) -> DispatchStep:
        return DispatchStep(tokens=(M, M), bucket=token, stages=stages, family=family or _family(kernels),
                            kernels=kernels, block_m=block_m, activation_dtype=_label(q_a, q_type), basis=basis,
                            config=row.where if (basis == "tuned" and row is not None) else None, ksplit=ksplit,
                            buckets=(token,), q_dtype_a=q_a, notes=tuple(notes) + tuple(extra),
                            row=row if basis == "tuned" else None)
    return step


def _dispatch_named_kernels(call: _Call, c: _Choice, step: Callable[..., DispatchStep]) -> DispatchStep | None:
    """The routes that run what the row (or the 1-stage table) names: the FlyDSL MXFP4 a4w4 port, 1-stage ASM, an
    Opus or (with flydsl importable) FlyDSL row. None: the routing goes on (noting a FlyDSL row flydsl cannot run)."""
    key, env, rules, row, notes = call.key, call.env, call.rules, c.row, call.notes
    kn1, kn2, block_m, basis, ksplit = c.kn1, c.kn2, c.block_m, c.basis, c.ksplit
    fly = call.a.flydsl_available
    if row is not None and (kn1.startswith("flydsl_mxmoe_g") or kn2.startswith("flydsl_mxmoe_g")):
        m = _MXMOE_BM.search(kn1)
        bm = int(m.group(1)) if m else block_m
        if key.is_ep:
            return replace(step(2, (kn1, kn2), bm, basis, ksplit, ["FlyDSL MXFP4 a4w4 port (flydsl_mxmoe_*)"]),
                           raises="NotImplementedError: MXFP4 a4w4 FlyDSL port does not support expert-parallel "
                                  "yet (expert_mask is dropped by the output_aux sort path).")
        return step(2, (kn1, kn2), bm, basis, ksplit, ["FlyDSL MXFP4 a4w4 port (flydsl_mxmoe_*)"])
    if c.run_1stage:
        if row is None:
            xbf16 = key.q_type == Q_1X128 and key.gfx == "gfx950" and env.get("AITER_XBFLOAT16", "0") == "1" \
                and rules.xbf16
            name = f"{c.api} (default{', xbf16' if xbf16 else ''})"
            return step(1, (name,), block_m, basis, 0, ["1-stage ASM from fused_moe_1stage_dict: the asm "
                                                       "launcher picks the code object by inter_dim and block_m"])
        return step(1, (kn1,), block_m, basis, ksplit)
    is_fly1, is_fly2 = kn1.startswith("flydsl_"), kn2.startswith("flydsl_")
    is_opus1 = kn1.startswith("opus_moe1_")
    if is_opus1 or ((is_fly1 or is_fly2) and fly):
        k2, extra = _stage2_name(kn2)
        return step(2, (kn1, k2), block_m, basis, ksplit, extra)
    if row is not None and (is_fly1 or is_fly2) and not fly:
        notes.append(f"row {row.where} names FlyDSL kernels but flydsl is not importable: AITER falls through")
    return None


def _dispatch_wint4(call: _Call) -> bool:
    """The untuned a16wi4 FlyDSL heuristic applies (per_1x32 int4 weights, flydsl importable, v0.1.13.post1+)."""
    key = call.key
    return key.q_type == Q_1X32 and key.q_dtype_w == I4 and call.a.flydsl_available and call.rules.a16wi4


def _dispatch_cktile_or_wint4(call: _Call, c: _Choice, step: Callable[..., DispatchStep]) -> DispatchStep | None:
    """Swiglu MXFP4 with gate/up interleaved (any layout before v0.1.14) → CK-Tile; else int4 weights → the
    a16wi4 FlyDSL heuristic (the order flips in v0.1.13.post1: ``Rules.wint4_before_swiglu_cktile``)."""
    key, env, rules, row, token, q_a = call.key, call.env, call.rules, c.row, call.token, call.q_a
    q_type, q_w, ksplit = key.q_type, key.q_dtype_w, c.ksplit
    fp8 = _fp8(key.gfx)
    wint4 = _dispatch_wint4(call)
    if (key.gate_mode != "separated" or rules.swiglu_cktile_any_gate) and key.dtype in (BF16, FP16) \
            and q_type == Q_1X32 and key.act_type == SWIGLU and (q_w != fp8 or not rules.mxfp8) \
            and not (wint4 and rules.wint4_before_swiglu_cktile):
        bm = 32 if q_a == fp8 else _tier_block_m(token)
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), bm, "heuristic", ksplit,
                    extra + ["Swiglu MXFP4 with interleaved gate/up: CK-Tile 2-stage"])
    if wint4:
        tm = _tier_block_m(token)
        kb = _ksplit(token, key.topk, key.expert, key.inter_dim, key.model_dim, key.cu_num, env) \
            if rules.wint4_ksplit else 0
        return step(2, (f"flydsl_moe1_abf16_wint4_bf16_t{tm}x128x128" + (f"_kb{kb}" if kb > 1 else ""),
                        f"flydsl_moe2_abf16_wint4_bf16_t{tm}x128x128_atomic"),
                    tm, "heuristic", kb, ["no tuned FlyDSL a16wi4 config: AITER's untuned a16wi4 fallback"])
    return None


def _dispatch_flydsl_heuristic(call: _Call, c: _Choice, step: Callable[..., DispatchStep]) -> DispatchStep | None:
    """The untuned per_1x32 FlyDSL heuristic, in the release's scope (``Rules.flydsl_heuristic``, opened by
    AITER_FLYDSL_FORCE), and the a16w4 SiTUv2 FlyDSL route."""
    key, env, rules, row, token, q_a = call.key, call.env, call.rules, c.row, call.token, call.q_a
    q_type, q_w, ksplit, kn1, kn2 = key.q_type, key.q_dtype_w, c.ksplit, c.kn1, c.kn2
    fp8 = _fp8(key.gfx)
    shuffled = call.a.weights_shuffled
    fly = call.a.flydsl_available
    force = env.get("AITER_FLYDSL_FORCE", "1") == "1"
    fly_scope = rules.flydsl_heuristic
    if fly_scope == "swiglu_a4w4":  # ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1320-1330
        fly_acts, fly_a, fly_w = key.act_type == SWIGLU, (FP4,), (FP4,)
    elif fly_scope == "force_w4":  # ROCm/aiter@v0.1.16:aiter/fused_moe.py lines 1464-1476
        fly_acts, fly_a, fly_w = key.act_type == SWIGLU or force, (FP4, fp8), (FP4,)
    else:
        fly_acts, fly_a, fly_w = key.act_type in (SWIGLU, SITUV2) or force, (FP4, fp8), (FP4, fp8)
    use_mx_fly = (fly_scope != "none" and key.dtype in (BF16, FP16) and q_type == Q_1X32 and fly_acts
                  and q_a in fly_a and q_w in fly_w and shuffled and key.use_g1u1
                  and not key.doweight_stage1 and fly)
    situ_a16 = (key.dtype in (BF16, FP16) and q_type == Q_1X32 and key.act_type == SITUV2 and q_a == BF16
                and q_w == FP4 and shuffled and key.use_g1u1 and not key.doweight_stage1 and fly)
    if not (use_mx_fly or situ_a16):
        return None
    if situ_a16:
        tm, k1, k2 = _flydsl_heuristic_names(token, FP4, q_w, key.inter_dim)
        k1, k2 = k1.replace("_afp4_", "_abf16_"), k2.replace("_afp4_", "_abf16_")
    else:
        tm, k1, k2 = _flydsl_heuristic_names(token, q_a, q_w, key.inter_dim,
                                             pick_tile_k=rules.flydsl_s2_tile_k_pick)
    extra = []
    if row is not None:
        extra.append(f"tuned row {row.where} names {_family((kn1, kn2))} kernels, but "
                     f"AITER_FLYDSL_FORCE={env.get('AITER_FLYDSL_FORCE', '1')} routes per_1x32 fp4/fp8 layers "
                     "without a FlyDSL row to the FlyDSL heuristic")
    # split_k -1 from v0.1.16; v0.1.14-v0.1.15 keep the ksplit computed above (int(ksplit)).
    return step(2, (k1, k2), tm, "heuristic", ksplit if fly_scope == "swiglu_a4w4" else -1,
                extra + ["no tuned FlyDSL config: heuristic FlyDSL fallback"])


def _dispatch_cktile_mxfp4(call: _Call, c: _Choice, step: Callable[..., DispatchStep]) -> DispatchStep | None:
    """MXFP4 weights with bf16 activations or split-K → CK-Tile (CK 2-stage has no A16W4 kernel); untuned SwiGLU
    MXFP4 with unshuffled weights → CK-Tile with split-K ≥ 2 (ROCM-25478, v0.1.17+)."""
    key, rules, row, token, q_a = call.key, call.rules, c.row, call.token, call.q_a
    q_type, q_w, ksplit, kn1 = key.q_type, key.q_dtype_w, c.ksplit, c.kn1
    shuffled = call.a.weights_shuffled
    swiglu_bf16_cktile = (q_type == Q_1X32 and key.act_type == SWIGLU and q_a in (BF16, FP16) and q_w == FP4
                          and shuffled)
    if key.dtype in (BF16, FP16) and q_type == Q_1X32 and q_w == FP4 and shuffled \
            and not (key.act_type == SWIGLU and q_a == FP4) and (ksplit > 1 or swiglu_bf16_cktile):
        sk = max(int(ksplit), 2 if swiglu_bf16_cktile else 1)
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), _tier_block_m(token),
                    "heuristic", sk, extra + ["MXFP4 weights with bf16 activations (or split-K): CK-Tile 2-stage "
                                              "(CK 2-stage has no A16W4 heuristic kernel)"])
    if key.act_type == SWIGLU and q_w == FP4 and q_type == Q_1X32 and key.dtype in (BF16, FP16) and not kn1 \
            and rules.swiglu_unshuffled_cktile:
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), _tier_block_m(token),
                    "heuristic", max(int(ksplit), 2), ["SwiGLU MXFP4 with unshuffled weights: CK-Tile"])
    return None


def _dispatch_ck_or_asm(call: _Call, c: _Choice, step: Callable[..., DispatchStep]) -> DispatchStep:
    """The last two branches: CK 2-stage (a ck2stages row, or the codegen's default instance), else ASM stage 1 with
    the stage-2 launcher the row's stage-2 name picks (Opus, CK-Tile or CK). FlyDSL names handed to a non-FlyDSL
    launcher (flydsl not importable) raise."""
    key = call.key
    q_type, q_w, fp8 = key.q_type, key.q_dtype_w, _fp8(key.gfx)
    kn1, kn2, block_m, basis, ksplit = c.kn1, c.kn2, c.block_m, c.basis, c.ksplit
    fly = call.a.flydsl_available
    is_fly1, is_fly2 = kn1.startswith("flydsl_"), kn2.startswith("flydsl_")
    if (kn1 and "ck2stages" in kn1) or (not kn1 and ((q_type == Q_1X128 and key.doweight_stage1)
                                                     or q_w in (BF16, FP16, U32, FP4, fp8))):
        k1 = kn1 or "moe_ck2stages_gemm1 (default)"
        k2, extra = _stage2_name(kn2) if kn2 else ("moe_ck2stages_gemm2 (default)", [])
        if kn2.startswith("flydsl_") and not fly:
            # The FlyDSL stage 2 is taken only with is_flydsl_available(); otherwise ck_moe_stage2_fwd gets the
            # FlyDSL name (ROCm/aiter@e4048607:aiter/fused_moe.py lines 2888, 2909-2916).
            return replace(step(2, (k1, k2), block_m, basis, ksplit, extra, family="ck"),
                           raises=f"the CK stage-2 launcher is handed the FlyDSL kernel name {k2} because flydsl is "
                                  "not importable: no such kernel to launch")
        return step(2, (k1, k2), block_m, basis, ksplit,
                    extra + ([] if kn1 else ["CK 2-stage with the codegen's default instance for this shape"]))
    if block_m not in (16, 32, 64, 128):
        block_m = ([b for b in (16, 32, 64, 128) if block_m < b] + [128])[0]
    k1 = kn1 or "fmoe_stage1_g1u1 (default)"
    k2 = kn2 or "moe_ck2stages_gemm2 (default)"
    # The last branch's stage-2 launcher follows the row's stage-2 name: an Opus a8w4 instance → opus_a8w4_stage2,
    # cktile_* → cktile_moe_stage2, anything else → ck_moe_stage2_fwd (ROCm/aiter@e4048607:aiter/fused_moe.py
    # get_2stage_cfgs, last branch; the same at every tag from v0.1.17).
    s2 = "opus" if kn2.startswith("opus_moe2_") else "cktile" if kn2.startswith("cktile_") else "ck"
    launcher = {"opus": "Opus", "cktile": "CK-Tile", "ck": "CK"}[s2]
    if is_fly1 or is_fly2:
        # asm_stage1(kernelName=<flydsl name>) (+ ck_moe_stage2_fwd(kernelName=<flydsl name>)): the ASM launcher has
        # no such kernel.
        return replace(step(2, (k1, k2), block_m, basis, ksplit, [f"ASM stage 1 + {launcher} stage 2"],
                            family=f"asm+{s2}"),
                       raises=f"the ASM stage-1 and {launcher} stage-2 launchers are handed FlyDSL kernel names "
                              f"({k1}, {k2}) because flydsl is not importable: no such kernel to launch")
    return step(2, (k1, k2), block_m, basis, ksplit, [f"ASM stage 1 + {launcher} stage 2"],
                **({"family": f"asm+{s2}"} if s2 != "ck" else {}))


def _dispatch_legacy(M: int, key: DispatchKey, cs: ConfigSet | None, env: Mapping[str, str],
                     a: Assumptions, rules: Rules = LEGACY_RULES) -> DispatchStep:
    token = get_padded_M(M, rules)
    q_a, why_a = activation_dtype(M, key, env, rules)
    notes = [why_a]
    row = None
    if cs is not None and not cs.broken:
        row, more = _lookup(cs, key, token, q_a, rules)
        notes += more
    if cs is not None and cs.broken:
        notes.append("the tuned set has malformed lines: modelled with heuristics only")
    if row is None and cs is not None and env.get("AITER_ONLINE_TUNE", "0") == "1":
        notes.append("AITER_ONLINE_TUNE=1: AITER tunes this shape at first call; modelled as the heuristic")
    q_type, q_w = key.q_type, key.q_dtype_w

    def step(stages: int, kernels: tuple[str, ...], block_m: int, basis: str, ksplit: int = 0,
             extra: Iterable[str] = ()) -> DispatchStep:
        return DispatchStep(tokens=(M, M), bucket=token, stages=stages, family=_family(kernels), kernels=kernels,
                            block_m=block_m, activation_dtype=_label(q_a, q_type), basis=basis,
                            config=row.where if (basis == "tuned" and row is not None) else None, ksplit=ksplit,
                            buckets=(token,), q_dtype_a=q_a, notes=tuple(notes) + tuple(extra),
                            row=row if basis == "tuned" else None)

    if row is None:
        run_1stage = False
        api = None
        if not key.doweight_stage1:
            api = _ONE_STAGE_LEGACY.get(key.gfx, {}).get((key.act_type, q_type, key.dtype, q_a, q_w, key.use_g1u1))
        if api is not None:
            if q_type == Q_1X128:
                run_1stage = key.inter_dim % 256 == 0
            elif q_type == Q_TOKEN and q_w in (I8, FP8, FP8_FNUZ):
                run_1stage = token > 32
            elif q_type != Q_1X32:
                run_1stage = token < 256
        block_m = 32 if run_1stage else (64 if q_type == Q_1X128 else
                                         _block_size_M(token, key.topk, key.expert, key.inter_dim, key.cu_num))
        kn1 = kn2 = ""
        basis = "heuristic"
        ksplit = 0
        if run_1stage:
            return step(1, (f"{_one_stage_op(key, tkw1=False)} (default)",), block_m, basis, 0,
                        ["1-stage ASM: fused_moe_1stage_dict decides 1-stage, the quant type picks the op"])
    else:
        kn1, kn2, block_m, ksplit, basis = row.kernel1, row.kernel2, row.block_m, row.ksplit, "tuned"
        if row.run_1stage:
            return step(1, (kn1,), block_m, basis, ksplit)
    if key.dtype in (BF16, FP16) and q_type == Q_1X32 and key.act_type == SWIGLU:
        extra = [f"tuned row {row.where} matched but this path ignores its kernel names"] if row else []
        return step(2, ("cktile_moe_stage1 (default)", "cktile_moe_stage2 (default)"), 16 if token < 2048 else 32,
                    "heuristic", ksplit, extra)
    if "ck2stages" in kn1 or (q_type == Q_1X128 and key.doweight_stage1) or q_w in (BF16, FP16, U32, FP4):
        return step(2, (kn1 or "moe_ck2stages_gemm1 (default)", kn2 or "moe_ck2stages_gemm2 (default)"), block_m,
                    basis, ksplit)
    if block_m not in (32, 64, 128):
        block_m = ([b for b in (32, 64, 128) if block_m < b] + [128])[0]
    return step(2, (kn1 or "fmoe_stage1_g1u1 (default)", kn2 or "moe_ck2stages_gemm2 (default)"), block_m, basis,
                ksplit, ["ASM stage 1 + CK stage 2"])


def dispatch_token(M: int, key: DispatchKey, config_set: ConfigSet | None, *, env: Mapping[str, str] | None = None,
                   assumptions: Assumptions | None = None, model: "str | Rules | None" = None) -> DispatchStep:
    """What AITER runs for exactly ``M`` tokens (one ungrouped step)."""
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise UsageError(f"token counts must be positive integers, got {M!r}")
    rules = lookup_rules(model if model is not None else
                         (config_set.version if config_set is not None and config_set.version else None))
    a = assumptions or Assumptions()
    if key.act_type == SITUV2 and not rules.situv2:
        q_a = BF16
        return DispatchStep(tokens=(M, M), bucket=get_padded_M(M, rules), stages=2, family="none", kernels=(),
                            block_m=None, activation_dtype=_label(q_a, key.q_type), basis="heuristic", config=None,
                            buckets=(get_padded_M(M, rules),), q_dtype_a=q_a,
                            raises=f"AttributeError: type object 'ActivationType' has no attribute 'Situv2' (AITER "
                                   f"{rules.name} has no SiTUv2 activation: csrc/include/aiter_enum.h)")
    fn = _dispatch_legacy if rules.heuristics == "v017" else _dispatch_head
    return fn(M, key, config_set, dict(env or {}), a, rules)
