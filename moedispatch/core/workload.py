"""The run-time inputs of a plan, in one place: token counts per MoE call and the AITER environment.

explain, the engine API, compare, lint and the AITER dispatch model all read the token list and the environment
through this module, so a variable set in the shell and the same variable given as ``--aiter-env`` plan the same.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from moedispatch._util.suggest import did_you_mean
from moedispatch.core.errors import UsageError

__all__ = ["Runtime", "check_aiter_env", "INT_ENV", "FLAG_ENV", "DEFAULT_TOKENS", "MAX_TOKENS", "MAX_TOKEN_COUNTS", "PADDED_M_TIERS", "SERVING_BUCKETS", "AITER_ENV", "aiter_env",
           "parse_env_args", "parse_tokens"]

#: Token counts planned when none are given: decode (1, 4), a small batch (64), chunked prefill (512, 8192).
DEFAULT_TOKENS = (1, 4, 64, 512, 8192)
#: AITER's largest token buckets above the powers of two (``_PADDED_M_TIERS``,
#: ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py).
PADDED_M_TIERS = (32768, 131072)
#: The largest token count per MoE call planned for (AITER's largest bucket tier).
MAX_TOKENS = PADDED_M_TIERS[-1]
#: The most token counts one plan takes (each is a simulated dispatch and a cost per MoE layer group; a range
#: expands to AITER's buckets, so 64 covers 1 … 131072 with room to spare).
MAX_TOKEN_COUNTS = 64
#: Token buckets a serving engine sees (decode through a large prefill chunk).
SERVING_BUCKETS = tuple(2 ** i for i in range(14))  # 1 … 8192

#: The environment AITER's fused-MoE dispatch reads (HEAD), with what each does. Values are strings as in
#: ``os.environ``.
AITER_ENV: dict[str, str] = {
    "AITER_BYPASS_TUNE_CONFIG": "non-zero: ignore tuned rows, always use the heuristics (get_2stage_cfgs)",
    "AITER_CONFIG_FMOE": "os.pathsep-separated tuned CSVs that REPLACE the default set (aiter/jit/core.py)",
    "AITER_ONLINE_TUNE": "1: on a miss, append the shape to untuned_fmoe.csv and tune it under a file lock",
    "AITER_FLYDSL_FORCE": "default 1: per_1x32 fp4/fp8 layers without a FlyDSL row take the FlyDSL heuristic",
    "AITER_BF16_FP8_MOE_BOUND": "default 256: Swiglu/INTERLEAVE MXFP4 layers use bf16 activations below this M",
    "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "default 256: Swiglu SEPARATED MXFP4 layers use bf16 activations below this M",
    "AITER_SITUV2_A8W4": "1: SiTUv2 MXFP4 layers use fp8 activations (a8w4)",
    "AITER_SITUV2_A4W4": "1: SiTUv2 MXFP4 layers use fp4 activations (a4w4)",
    "AITER_KSPLIT": "non-zero: split-K for heuristic per_1x128/per_1x32 paths; -1: ignore the tuned ksplit",
    "AITER_XBFLOAT16": "1: gfx950 per_1x128 heuristic 1-stage runs the xbf16 (bf16-input) ASM variant",
    "AITER_USE_NT": "non-temporal loads override (-1 auto)",
    "AITER_FORCE_A8W4": "gfx1250 only: fp8 activations instead of fp4",
    "AITER_MOE_A8W4_BYPASS_QUANT": "1 (debug): a8w4/mxfp8 paths skip activation quantization and use unit scales",
    "CU_NUM": "overrides the CU count AITER keys its lookup on (aiter/jit/utils/chip_info.py get_cu_num)",
    "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "vLLM: 1 folds the shared expert into the routed AITER call (one more expert and top-k slot; vllm-project/vllm@v0.33.0:vllm/envs.py)",
}
_FM = "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/fused_moe.py"
#: Variables AITER parses with ``int()`` — a value int() rejects makes AITER raise ValueError (at import for
#: GPTOSS_SWIGLU_MXFP4_BF16_BOUND, at the first MoE call for the others): where each is read.
INT_ENV: dict[str, str] = {
    "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": f"{_FM} line 76",
    "AITER_BF16_FP8_MOE_BOUND": f"{_FM} line 768",
    "AITER_USE_NT": f"{_FM} line 1245",
    "AITER_KSPLIT": f"{_FM} lines 1253, 2431",
    "AITER_BYPASS_TUNE_CONFIG": f"{_FM} line 2369",
    "AITER_XBFLOAT16": f"{_FM} line 2405",
    "CU_NUM": "ROCm/aiter@e4048607a535ace3a2b51ded31b1c8c2d45c0879:aiter/jit/utils/chip_info.py line 140",
}
#: Switches AITER compares with ``== "1"``: any other value is silently off in AITER (``true``, ``yes`` included).
FLAG_ENV = ("AITER_ONLINE_TUNE", "AITER_FLYDSL_FORCE", "AITER_SITUV2_A8W4", "AITER_SITUV2_A4W4", "AITER_FORCE_A8W4",
            "AITER_MOE_A8W4_BYPASS_QUANT")


#: Prefixes of the variables an engine launch's MoE path depends on: the engines' own and AITER's (with AITER_ENV's
#: other names, e.g. GPTOSS_SWIGLU_MXFP4_BF16_BOUND and CU_NUM).
ENGINE_ENV_PREFIXES = ("VLLM_", "SGLANG_", "AITER_", "GPTOSS_")


def engine_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` that decides an engine launch's MoE path (what lint, exec and the in-engine guard read from
    a shell): ENGINE_ENV_PREFIXES and every AITER_ENV name, sorted by name."""
    return {k: str(v) for k, v in sorted(env.items()) if k.startswith(ENGINE_ENV_PREFIXES) or k in AITER_ENV}


def check_aiter_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """Values AITER would reject or misread: raises UsageError (one line) for an ``int()`` variable int() rejects
    (AITER raises ValueError on it); returns a warning for a ``== "1"`` switch set to anything but 0/1 (AITER reads it
    as off)."""
    for key, where in INT_ENV.items():
        if key in env:
            try:
                int(str(env[key]))
            except ValueError:
                raise UsageError(f"{key}={env[key]!r} is not an integer: AITER reads it with int() and raises "
                                 f"ValueError ({where})") from None
    return tuple(f"{key}={env[key]!r}: AITER compares it with \"1\", so this value means off (AITER treats only "
                 f"\"1\" as on)" for key in FLAG_ENV if key in env and str(env[key]) not in ("0", "1"))


#: Any other ``AITER_*`` variable is kept too (it cannot change the model but is shown; the decision fingerprint reads
#: only :func:`dispatch_env`); logging is not a plan input.
_ENV_PREFIXES = ("AITER_",)
_NOT_PLAN_INPUTS = ("AITER_LOG_LEVEL",)


def aiter_env(environ: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The AITER dispatch env: the variables of :data:`AITER_ENV` and any ``AITER_*`` in ``environ`` (default
    ``os.environ``), then ``overrides`` (``--aiter-env K=V``) on top; sorted by name."""
    source = os.environ if environ is None else environ
    env = {str(k): str(v) for k, v in source.items()
           if (k in AITER_ENV or k.startswith(_ENV_PREFIXES)) and k not in _NOT_PLAN_INPUTS}
    env.update({str(k): str(v) for k, v in (overrides or {}).items()})
    return dict(sorted(env.items()))


def unread_overrides(overrides: Mapping[str, str]) -> tuple[str, ...]:
    """A warning per ``--aiter-env`` key that moedispatch's model of AITER's fused-MoE dispatch does not read (not in
    :data:`AITER_ENV`): a typo (``AITER_BYPAS_TUNE_CONFIG``) would otherwise plan as if it were set. Such keys are
    shown with the environment but do not enter the decision fingerprint (:meth:`dispatch_env`)."""
    return tuple(f"--aiter-env {key}: not a variable moedispatch's model of AITER's fused-MoE dispatch reads"
                 f"{did_you_mean(key, AITER_ENV)}; shown, not planned for" for key in sorted(overrides)
                 if key not in AITER_ENV)


def dispatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` the dispatch model reads (:data:`AITER_ENV`): what must agree across ranks. Other
    ``AITER_*`` variables (``AITER_LOG_MORE``, a typo) are shown with a plan but cannot change it."""
    return {k: v for k, v in sorted(env.items()) if k in AITER_ENV}


def parse_env_args(items: Iterable[str], flag: str = "--aiter-env") -> dict[str, str]:
    """``--aiter-env KEY=VALUE`` (repeatable) → dict; a malformed item raises UsageError (one line)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE (e.g. AITER_BYPASS_TUNE_CONFIG=1)")
        out[key] = value.strip()
    return out


def parse_tokens(text: str) -> tuple[int, ...]:
    """``--tokens 1,4,64,512,8192`` → sorted unique positive ints; ``lo-hi`` expands to AITER's buckets in that
    range (powers of two, then the :data:`PADDED_M_TIERS`) plus both ends. Bad input raises UsageError (one line)."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:   # "1,,2" or a trailing comma: a typo, not "no count here"
            raise UsageError(f"--tokens {text!r}: an empty item between commas (expected e.g. 1,64,4096 or 1-512)")
        lo_s, dash, hi_s = part.partition("-")
        try:
            if not part.isascii():   # int() reads "１" (a full-width digit) as 1: a count is written in ASCII digits
                raise ValueError(part)
            lo = int(lo_s)
            hi = int(hi_s) if dash else lo
        except ValueError:
            raise UsageError(f"--tokens {text!r}: expected comma-separated positive integers or ranges lo-hi") from None
        if lo < 1 or hi < lo:
            raise UsageError(f"--tokens {text!r}: {part!r} is not a positive count or an increasing range")
        out.update({lo, hi})
        if dash:
            out.update(b for b in (2 ** i for i in range(hi.bit_length())) if lo <= b <= hi)
            out.update(t for t in PADDED_M_TIERS if lo <= t <= hi)
    if not out:
        raise UsageError("--tokens needs at least one token count")
    _check_counts(out, "--tokens")
    return tuple(sorted(out))


def _check_counts(counts: set[int] | tuple[int, ...], what: str) -> None:
    if max(counts) > MAX_TOKENS:
        raise UsageError(f"{what}: {max(counts)} tokens in one MoE call is beyond any engine's batch "
                         f"(at most {MAX_TOKENS:,})")
    if len(counts) > MAX_TOKEN_COUNTS:
        raise UsageError(f"{what}: {len(counts)} token counts; at most {MAX_TOKEN_COUNTS} per plan (a range lo-hi "
                         "plans AITER's buckets in it)")


@dataclass(frozen=True)
class Runtime:
    """The run-time assumptions of a plan: token counts per call and the AITER environment (sorted pairs)."""

    tokens: tuple[int, ...] = DEFAULT_TOKENS
    env: tuple[tuple[str, str], ...] = ()
    #: Warnings about the environment's values (:func:`check_aiter_env`); a plan shows them.
    notes: tuple[str, ...] = ()
    #: The token range (lo, hi) this deployment (a role: decode, prefill) serves; None: every serving bucket. The
    #: padding must hold at every bucket served, so a decode-only role can need another allocation than prefill.
    serving: tuple[int, int] | None = None

    def serving_buckets(self) -> tuple[int, ...]:
        """The token counts every kernel AITER dispatches must run correctly at: the planned counts and the serving
        buckets in :attr:`serving` (all of :data:`SERVING_BUCKETS` when None)."""
        lo, hi = self.serving or (1, MAX_TOKENS)
        return tuple(sorted({t for t in SERVING_BUCKETS if lo <= t <= hi} | set(self.tokens)))

    @classmethod
    def build(cls, tokens: Iterable[int] | None = None, env: Mapping[str, str] | None = None,
              overrides: Mapping[str, str] | None = None, serving: tuple[int, int] | None = None) -> "Runtime":
        """``tokens`` (default :data:`DEFAULT_TOKENS`); ``env`` the process environment (default ``os.environ``)
        read by :func:`aiter_env`, then ``overrides`` (``--aiter-env KEY=VALUE``)."""
        counts = DEFAULT_TOKENS if tokens is None else tuple(sorted(set(int(t) for t in tokens)))
        if not counts or any(t < 1 for t in counts):
            raise UsageError("token counts must be positive integers")
        _check_counts(counts, "tokens")
        merged = aiter_env(env, overrides)
        return cls(counts, tuple(merged.items()), check_aiter_env(merged) + unread_overrides(overrides or {}),
                   serving)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)
