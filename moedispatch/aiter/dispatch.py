"""What AITER will actually run: an offline model of ``aiter.fused_moe``'s kernel dispatch, per token count.

AITER picks the kernel itself, at run time, in ``aiter/fused_moe.py`` ``get_2stage_cfgs``: an exact lookup in its
merged tuned CSVs keyed on (gfx, cu_num, padded token count, model_dim, inter_dim, expert, topk, activation, dtype,
q_dtype_a, q_dtype_w, q_type, use_g1u1, doweight_stage1), then the same lookup with the activation wildcarded, then
smaller token tiers, then hard-coded heuristics (the 1-stage ASM table, block_m, ksplit, FlyDSL/CK-Tile routing), all
under environment overrides. This module replays that logic in pure Python (no aiter, torch, numpy or pandas; the
CSVs are read lazily by :mod:`moedispatch.data.aiter_configs`).

The lookup is modelled per AITER release (:class:`Rules`, :func:`lookup_rules`), as ``aiter/fused_moe.py`` reads
at each tag: the token buckets (``get_padded_M`` changed at v0.1.8, v0.1.9, v0.1.12 and v0.1.14), whether the key
holds ``gfx`` (v0.1.16+), whether it holds ``str(activation)`` (exact act match: ≤ v0.1.13, v0.1.18 and v0.1.19) or
the pybind enum (no exact match: v0.1.14–v0.1.17, v0.1.19.post1+), the act wildcard (v0.1.14+), the EP top-k strip
(v0.1.16+) and the activation-dtype policy (bound 512 ≤ v0.1.13.post1 except v0.1.13's 256, 256 after;
SEPARATED/INTERLEAVE rules from v0.1.14; MXFP8 from v0.1.16.post1; SiTUv2 from v0.1.19). The heuristic fallbacks are
modelled twice: on HEAD —
https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/aiter/fused_moe.py (``get_2stage_cfgs``,
``get_block_size_M``, ``get_ksplit``, ``fused_moe_1stage_dict``; used for every release ≥ 0.1.8), with each
release's differences from HEAD as :class:`Rules` fields read in each tag's ``aiter/fused_moe.py`` (the FlyDSL
heuristic's scope, MXFP8, the 1-stage table, ``use_cfg``, a16wi4, the pre-gate_mode CK-Tile routing, the
flydsl_fallback rows; checked against each release's own code by tests/peers/aiter) — and on the PyPI wheel amd-aiter
0.1.7.post2.dev18 (``aiter/fused_moe.py`` in the wheel). Tuned rows come from the installed AITER or the bundled
snapshot (:mod:`moedispatch.data.aiter_configs`).

The model is split by what each part holds (all in :mod:`moedispatch.aiter`):

* :mod:`~moedispatch.aiter.vocab` — the dtype / quant / activation strings of AITER's tables;
* :mod:`~moedispatch.aiter.env` — reading AITER's integer variables as AITER does;
* :mod:`~moedispatch.aiter.rules` — :class:`Rules` per release, :func:`lookup_rules`, the token buckets;
* :mod:`~moedispatch.aiter.key` — :class:`Assumptions`, :class:`DispatchKey`, :func:`dispatch_key`;
* :mod:`~moedispatch.aiter.activation` — the activation-dtype policy, which of its variables act (``acting_env``);
* :mod:`~moedispatch.aiter.lookup` — the tuned-row index and lookup;
* :mod:`~moedispatch.aiter.heuristics` — the 1-stage tables, block_m, ksplit, the a16w4 SiTUv2 guard;
* :mod:`~moedispatch.aiter.flydsl` — FlyDSL kernel names and tile rules;
* :mod:`~moedispatch.aiter.walk` — the per-token dispatch walk (:func:`dispatch_token`);
* :mod:`~moedispatch.aiter.steps` — :class:`DispatchStep`, kernel families, grouping, AITER's INFO line;
* :mod:`~moedispatch.aiter.issues` — the known-issue table and its matching;
* :mod:`~moedispatch.aiter.hazards` — raising, pad and tile hazards derived from the steps;
* :mod:`~moedispatch.aiter.fhmoe` — the dedicated FHMoE table;
* this module — the plan of one layer (:class:`DispatchPlan`, :func:`plan_dispatch`, :func:`simulate`,
  :func:`native_inter_dims`).

Public API (all pure, frozen, cached where it matters)::

    from moedispatch.aiter.dispatch import simulate, plan_dispatch, native_inter_dims
    steps = simulate(layer, caps, tokens=(1, 4, 64, 512, 8192))      # tuple[DispatchStep, ...]
    [s.to_dict() for s in steps]     # the explain contract: {tokens, bucket, stages, family, kernels, block_m,
                                     #                        activation_dtype, basis, config}
    plan = plan_dispatch(layer, caps)  # DispatchPlan: steps + key + assumptions + env + warnings + known-issue hits
    native_inter_dims(layer, caps)     # inter_dim values with tuned rows for this layer's key (e.g. {384, 768})

Assumptions the lookup key depends on (engine choices) are explicit (:class:`Assumptions`) and printed with every
plan: a fused shared expert adds one expert and one top-k slot; expert parallelism makes AITER subtract one top-k
slot (it expects a fake slot the caller may not append, aiter#3999); the gate/up layout (``gate_mode``) changes the
activation dtype of Swiglu MXFP4 layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from moedispatch.aiter.flydsl import FLYDSL_TILE_SOURCE, flydsl_tile
from moedispatch.aiter.hazards import pad_hazards, raising_hits, tile_hazards
from moedispatch.aiter.issues import IssueHit, evaluate_issues
from moedispatch.aiter.key import Assumptions, DispatchKey, dispatch_key
from moedispatch.aiter.lookup import _index
from moedispatch.aiter.rules import HEAD_RULES, LEGACY_RULES, _at_least, get_padded_M, lookup_rules
from moedispatch.aiter.steps import DispatchStep, _group
from moedispatch.aiter.vocab import BF16, FP4, FP8, FP8_FNUZ, Q_1X32, SITUV2, SRC_FUSED_MOE
from moedispatch.aiter.walk import dispatch_token
from moedispatch.core.errors import UsageError
from moedispatch.core.families import BACKEND_OF_FAMILY
from moedispatch.core.workload import DEFAULT_TOKENS, aiter_env
from moedispatch.data import aiter_configs as _cfg
from moedispatch.data.aiter_configs import ConfigSet

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.backend import Padding
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer

#: This module's own names, and the model's values a plan is made of (its steps, key, assumptions and issue hits).
#: ``get_padded_M`` and the FlyDSL tile names are here too because cost/ and selector.runtime reach them through
#: this module; everything else is imported from its home module (listed above).
__all__ = [
    "DispatchPlan",
    "plan_dispatch",
    "simulate",
    "native_inter_dims",
    "Assumptions",
    "DispatchKey",
    "DispatchStep",
    "IssueHit",
    "get_padded_M",
    "flydsl_tile",
    "FLYDSL_TILE_SOURCE",
]


@dataclass(frozen=True)
class DispatchPlan:
    """The simulated dispatch of one layer: ``steps`` (grouped) and everything they assumed."""

    layer_index: int
    steps: tuple[DispatchStep, ...]
    key: DispatchKey
    tokens: tuple[int, ...]
    env: tuple[tuple[str, str], ...]
    assumptions: tuple[str, ...]
    configs: str
    dispatch_model: str
    aiter_version: str | None
    warnings: tuple[str, ...] = ()
    issues: tuple[IssueHit, ...] = ()
    #: The confidence of each of :attr:`warnings`, in order (``"derived"`` where the model infers rather than reads).
    warning_confidence: tuple[str, ...] = ()
    #: Where the tuned rows came from (ConfigSet.origin: installed | bundled | env | explicit) and, for the bundled
    #: index, which AITER release's rows; where the dispatch rules were read.
    config_origin: str = ""
    config_release: str | None = None
    rules_source: str = ""

    def data_used(self) -> dict[str, Any]:
        """What the plan read: the tuned rows (origin, release, label) and the dispatch rules (name, source)."""
        return {"rows": self.configs, "origin": self.config_origin, "release": self.config_release,
                "rules": self.dispatch_model, "rules_source": self.rules_source}

    @property
    def families(self) -> tuple[str, ...]:
        """Distinct families in token order (``("asm",)``; ``("cktile", "flydsl")`` when it changes with M)."""
        seen: list[str] = []
        for s in self.steps:
            if s.family not in seen:
                seen.append(s.family)
        return tuple(seen)

    @property
    def backends(self) -> tuple[str, ...]:
        """moedispatch backend names of the families AITER runs, in token order (``aiter-cktile``, ``aiter-flydsl``;
        a mixed step such as ``flydsl+ck`` contributes both; ``opus`` has no moedispatch backend: ``aiter-opus``)."""
        seen: list[str] = []
        for fam in self.families:
            for part in fam.split("+"):
                if part == "none":  # AITER raises: no family runs
                    continue
                name = BACKEND_OF_FAMILY.get(part, f"aiter-{part}")
                if name not in seen:
                    seen.append(name)
        return tuple(seen)

    def table_lines(self) -> list[str]:
        """Human lines for explain's table: one per step, then issues, assumptions and warnings."""
        lines = []
        for s in self.steps:
            toks = f"{s.tokens[0]}" if s.tokens[0] == s.tokens[1] else f"{s.tokens[0]}–{s.tokens[1]}"
            why = f"tuned {s.config}" if s.basis == "tuned" else "heuristic"
            if s.raises:
                lines.append(f"tokens {toks} (bucket {'/'.join(map(str, s.buckets or (s.bucket,)))}): AITER raises "
                             f"— {s.raises}")
                continue
            split = f", split-K {s.ksplit}" if s.ksplit > 1 else ""
            lines.append(f"tokens {toks} (bucket {'/'.join(map(str, s.buckets or (s.bucket,)))}): {s.family} "
                         f"{s.stages}-stage {' + '.join(s.kernels)}, block_m {s.block_m}{split}, activations "
                         f"{s.activation_dtype} — {why}")
        for h in self.issues:
            toks = f"{h.tokens[0]}" if h.tokens[0] == h.tokens[1] else f"{h.tokens[0]}–{h.tokens[1]}"
            fix = ", ".join(f"{k}={v}" for k, v in h.workaround_env)
            cap = f"; cap --max-num-batched-tokens at {h.token_cap}" if h.token_cap else ""
            lines.append(f"{h.severity} {h.issue} at tokens {toks} (bucket {h.bucket}, {h.kernel}): {h.effect}. "
                         f"Workaround: {h.workaround}{' [' + fix + ']' if fix else ''}{cap} ({h.source})")
        lines += [f"assumes {a}" for a in self.assumptions]
        lines += [f"warning {w}" for w in self.warnings]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer_index, "aiter_dispatch": [s.to_dict() for s in self.steps],
                "key": self.key.to_dict(), "tokens": list(self.tokens), "aiter_env": dict(self.env),
                "assumptions": list(self.assumptions), "configs": self.configs,
                "dispatch_model": self.dispatch_model, "aiter_version": self.aiter_version,
                "warnings": list(self.warnings), "issues": [h.to_dict() for h in self.issues]}


def _tokens(tokens: Iterable[int]) -> tuple[int, ...]:
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise UsageError(f"token counts must be positive integers, got {t!r}")
        out.append(t)
    if not out:
        raise UsageError("no token counts given")
    return tuple(sorted(set(out)))


def plan_dispatch(layer: "MoELayer", caps: "Capabilities", *, tokens: Iterable[int] = DEFAULT_TOKENS,
                  env: Mapping[str, str] | None = None, padding: "Padding | None" = None,
                  configs: ConfigSet | None = None, assumptions: Assumptions | None = None) -> DispatchPlan:
    """Simulate AITER's dispatch of ``layer`` for every token count; group alike consecutive counts; evaluate the
    known dispatch issues.

    ``env`` is the AITER environment (None: :func:`aiter_env` of ``os.environ``); ``padding`` the allocation the
    kernel sees (None: the unpadded per-rank shape); ``configs`` the tuned set (None:
    :func:`moedispatch.data.aiter_configs.config_set_for` — the installed AITER's CSVs when it is the one planned for,
    else the bundled snapshot). Bad input raises :class:`~moedispatch.core.errors.UsageError` (one line).
    """
    env_d = aiter_env() if env is None else {str(k): str(v) for k, v in env.items()}
    # Only rows of this layer's model_dim (unpadded or padded) can match its key: parse just those lines.
    dims = frozenset({layer.hidden} | ({padding.hidden} if padding is not None else set()))
    cs = configs or _cfg.config_set_for(caps, env_d, model_dims=dims)
    a = (assumptions or Assumptions()).resolve(layer)
    # The installed AITER is what runs when its files are planned for; otherwise the target's version.
    version = cs.version if cs.origin == "installed" else (caps.aiter_version or cs.version)
    rules = lookup_rules(version)
    key = dispatch_key(layer, caps, padding=padding, assumptions=a, env=env_d, model=rules)
    counts = _tokens(tokens)
    raw = [dispatch_token(m, key, cs, env=env_d, assumptions=a, model=rules) for m in counts]
    steps = _group(raw)
    warnings = list(cs.notes) + list(cs.warnings)
    if cs.merge_error:
        warnings.append(cs.merge_error)
    idx = _index(cs)
    if idx.duplicates:
        warnings.append(f"{idx.duplicates} tuned rows repeat a lookup key; AITER keeps the first"
                        + (" — pandas to_dict('index') raises on them in 0.1.7" if rules is LEGACY_RULES else ""))
    derived: set[int] = set()
    if rules is not HEAD_RULES and rules.heuristics == "head":
        derived.add(len(warnings))
        warnings.append(f"AITER {version}: key, buckets and activation policy follow {rules.name} ({rules.source}); "
                        f"the heuristic fallbacks are modelled on HEAD e4048607 (derived)")
    situ_gfx942 = key.act_type == SITUV2 and all(s.q_dtype_a == BF16 for s in raw) and _at_least(version, "0.1.20")
    if key.q_type == Q_1X32 and key.q_dtype_w in (FP4, FP8) and key.gfx != "gfx950" and not situ_gfx942:
        # (The a16w4 SiTUv2 FlyDSL kernel runs on gfx942 from AITER 0.1.20: ROCm/aiter#4502.)
        # fp4x2/MX kernels (FlyDSL mixed_moe, CK-Tile a16w4, ASM MXfp4) use gfx950 scaled MFMA; the gfx942 ASM
        # table has no MXfp4 code object and the fp4 quant cannot emit fp4x2 there (sgl-project/sglang#35525).
        derived.add(len(warnings))
        warnings.append(f"AITER's MX (per_1x32) fused-MoE kernels need gfx950; on {key.gfx} this dispatch fails at "
                        "run time (derived: " + SRC_FUSED_MOE + ", https://github.com/sgl-project/sglang/pull/35525)")
    if env_d.get("AITER_MOE_A8W4_BYPASS_QUANT", "0") == "1" and key.q_type == Q_1X32 and any(
            s.q_dtype_a in (FP8, FP8_FNUZ) for s in raw):
        # fused_moe_2stages: "Debug bypass: skip real quant, feed unit scales" (a1 = hidden_states.to(fp8)).
        warnings.append("AITER_MOE_A8W4_BYPASS_QUANT=1 is a debug switch: the fp8-activation (a8w4/mxfp8) steps cast "
                        "activations to fp8 with unit scales instead of quantizing them — wrong output for real "
                        f"weights ({SRC_FUSED_MOE})")
    hits = (raising_hits(raw, key, env_d) + evaluate_issues(raw, key, version)
            + pad_hazards(raw, key, padding, has_bias=layer.has_bias) + tile_hazards(steps, key, version))
    return DispatchPlan(layer_index=layer.index, steps=steps, key=key, tokens=counts,
                        env=tuple(sorted(env_d.items())), assumptions=a.describe(layer), configs=cs.label,
                        dispatch_model=rules.name, aiter_version=version, warnings=tuple(warnings),
                        issues=hits, warning_confidence=tuple("derived" if i in derived else "confirmed"
                                                              for i in range(len(warnings))),
                        config_origin=cs.origin, config_release=cs.release, rules_source=rules.source)


def simulate(layer: "MoELayer", caps: "Capabilities", *, tokens: Iterable[int] = DEFAULT_TOKENS,
             env: Mapping[str, str] | None = None, padding: "Padding | None" = None,
             configs: ConfigSet | None = None, assumptions: Assumptions | None = None) -> tuple[DispatchStep, ...]:
    """The grouped dispatch steps of :func:`plan_dispatch` (``[s.to_dict() for s in steps]`` is explain's
    ``aiter_dispatch``)."""
    return plan_dispatch(layer, caps, tokens=tokens, env=env, padding=padding, configs=configs,
                         assumptions=assumptions).steps


def native_inter_dims(layer: "MoELayer", caps: "Capabilities", *, configs: ConfigSet | None = None,
                      assumptions: Assumptions | None = None, env: Mapping[str, str] | None = None) -> frozenset[int]:
    """inter_dim values AITER has tuned rows for at this layer's key (gfx, cu_num, model_dim, experts, topk,
    dtypes, q_type, activation — any token bucket, any activation dtype), in the tuned set for ``caps``.

    MiniMax-M3-MXFP4 at TP8 on MI355X with the HEAD snapshot: ``{384, 768}`` — AITER runs 384 natively, so
    padding it to 512 buys nothing there (it misses the tuned rows instead).
    """
    env_d = aiter_env() if env is None else dict(env)
    cs = configs or _cfg.config_set_for(caps, env_d, model_dims=frozenset({layer.hidden}))
    version = cs.version if cs.origin == "installed" else (caps.aiter_version or cs.version)
    rules = lookup_rules(version)
    key = dispatch_key(layer, caps, assumptions=assumptions, env=env_d, model=rules)
    dims = set()
    for row in cs.rows:
        if row.tag == "flydsl_fallback" and rules.drop_fallback_rows:
            continue
        if rules.gfx_key and row.gfx not in (key.gfx, None):
            continue
        if (row.cu_num, row.model_dim, row.expert, row.topk, row.dtype, row.q_dtype_w, row.q_type,
                row.use_g1u1, row.doweight_stage1) == (key.cu_num, key.model_dim, key.expert, key.topk, key.dtype,
                                                       key.q_dtype_w, key.q_type, key.use_g1u1,
                                                       key.doweight_stage1):
            if not rules.act_wildcard and row.act_type != key.act_type:
                continue
            dims.add(row.inter_dim)
    return frozenset(dims)
