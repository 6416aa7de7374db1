"""Cost model: predicted fused-MoE time per layer and token count, with error bars.

Public API (pure Python; nothing is read or computed at import time)::

    from moedispatch import cost
    costs = cost.predict(layer, caps, backend_family="aiter-flydsl", padding=decision.padding, tokens=(1, 64, 4096))
    costs[1].to_dict()        # {"tokens": 64, "us": 85.0, "low": 82.4, "high": 93.5, "basis": "tuned"}
    cost.total([costs] * 57)  # the model's MoE time per token count (decode step, prefill chunk)
    cost.compare(a, b)        # "faster" | "slower" | "tie" (bars separate or not)
    cost.rank([("aiter-flydsl", 70, a), ("triton", 40, b)])   # [("aiter-flydsl", None), ("triton", "aiter-… vs …")]
    cost.reason("aiter-flydsl", a, "triton", b)
    # -> "aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens"
    cost.padding_overhead(layer, caps, backend_family="aiter-flydsl", padding=p, tokens=(4096,))  # ((4096, 0.21),)
    cost.untuned_csv(cost.tuning_worklist([(dispatch_plan, costs, 57)]))   # what to tune first, AITER's format

How one prediction is made, in order (``Cost.basis`` says which step answered):

1. ``plugin`` — a plugin's ``moe_cost`` hook (:mod:`moedispatch.core.hookspecs`) returned costs for its backend.
2. ``tuned`` — AITER backends only: a lint-clean row of AITER's tuned fused-MoE CSVs matches the layer's lookup key
   and the token count exactly; the prediction is that row's ``us`` (AITER's tuner measured it,
   ``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py``). Rows come from ``dispatch`` (the AITER dispatch model's
   per-bucket entries), ``rows``, or a lookup in :func:`moedispatch.data.aiter_configs.config_set_for`.
3. ``interpolated`` — clean rows of the same tuned shape exist at a lower and a higher token count: log-log
   interpolation between the two neighbours, along the roofline work ``t_mem + t_cmp`` (:func:`interpolate`).
   Outside the tuned token range the nearest row is scaled by the priors' ratio (basis ``roofline``).
4. ``roofline`` — everything else: expected distinct experts touched ``E·(1−(1−k/E)^M)`` × expert weight bytes
   (scales included, padded sizes when a padding is given) + activations, over the product's datasheet HBM bandwidth
   (gpus.toml ``[peak.*]``): ``t_mem``; useful FLOPs over the peak for the activation dtype: ``t_cmp``.

   - Decode (up to ``max_tokens``, 64, of a ``[[decode]]`` fit): latency plus bytes, ``fixed_us + t_mem /
     efficiency`` per (arch, CU count) — a fixed per-call term and an effective share of the *target's* datasheet
     bandwidth (so MI325X's faster HBM is credited), fit on the lint-clean tuned rows with at most that many tokens.
     The bytes grow with the experts touched, so 1 < 2 < 4 tokens predict rising times wherever more experts are
     touched.
   - Above: the efficiency priors of capability_db/cost_priors.toml (log-linear in those terms, per (arch, CU
     count, token bucket)) turn the roofline into a time, never less than at fewer tokens.

   Both are fit on lint-clean tuned rows by ``benchmarks/bench_cost_model.py --fit``; bars are leave-one-model-out
   residual quantiles (p10–p90) of the level that answered (from ``LARGE_M`` tokens the bucket priors also see weight
   bytes, intermediate size and block scaling, with bars of their own, level ``bucket_large``).

The ``tuned`` and ``interpolated`` bars are release-aware (:mod:`moedispatch.cost.release`): the same-release bars
when the planned AITER is exactly the rows' release, else widened to AITER's re-tuning spread across releases; the
detail says whose µs it is. Triton, emulation and third-party backends get this
   AITER roofline times their own factor band (``[backend.*]`` in the priors, with sources).

Where the AITER dispatch model marks a token count ``heuristic`` (no tuned row: AITER runs its untuned default
kernels), an AITER prediction — which every basis makes at tuned-kernel speed — is multiplied by the ``[heuristic]``
factor band of the priors (heuristic kernels measured at 1.3–2.3× the tuned-speed prediction, ROCm/aiter#3911,
ROCm/aiter#1528), so :func:`rank` does not favour an untuned path over a tuned one.

Every prediction is at or above the datasheet roofline ``max(t_mem, t_cmp)`` for the bytes it must read and the
FLOPs it must do (nothing runs faster than the datasheet peaks).

Tuned-CSV rows are linted first (:func:`lint_rows`): a timing copied across token buckets of one shape, or a row
faster than the datasheet roofline, is not used (AITER still dispatches on it; its time is not believed).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from moedispatch._util.caches import memoize
from moedispatch.core.costs import BASES, Cost, format_cost
from moedispatch.core.errors import CapabilityDBError, UsageError
from moedispatch.core.families import kind_of
from moedispatch._util.log import get_logger
from moedispatch.core.workload import DEFAULT_TOKENS
from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.data import aiter_configs, capdb
from moedispatch.cost import release

__all__ = [
    "Cost",
    "Geometry",
    "BASES",
    "predict",
    "predict_one",
    "total",
    "compare",
    "reason",
    "rank",
    "format_cost",
    "padding_overhead",
    "backend_kind",
    "bucket_of",
    "interpolate",
    "fit_decode",
    "fit_decode_fixed",
    "DecodeFit",
    "roofline_us",
    "model_features",
    "lint_rows",
    "load_priors",
    "tuning_worklist",
    "untuned_csv",
    "UNTUNED_COLUMNS",
    "Priors",
]

_PRIORS_FILE = "cost_priors.toml"
_PRIORS_SCHEMA = "moedispatch.cost_priors/1"
_PAIR = re.compile(r"a[0-9]{1,2}w[0-9]{1,2}")


# -- values ----------------------------------------------------------------------------------------------------

# -- geometry and roofline -------------------------------------------------------------------------------------

_ACT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "mxfp8": 1.0, "mxfp6": 0.75, "mxfp4": 0.5,
              "int4": 0.5}
_COMPUTE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "fp8", "mxfp8": "fp8", "mxfp6": "fp4",
            "mxfp4": "fp4", "int4": "fp4"}
# AITER CSV spellings (aiter/utility/base_tuner.py dtype2bpe_dict counts fp4x2 as 1 byte per *logical* element,
# which overstates bytes; real storage is half a byte).
_CSV_BYTES = {"torch.bfloat16": 2.0, "torch.float16": 2.0, "torch.float8_e4m3fn": 1.0, "torch.float8_e4m3fnuz": 1.0,
              "torch.int8": 1.0, "torch.float4_e2m1fn_x2": 0.5, "torch.int4": 0.5,
              "torch.uint32": 0.5}  # uint32: eight packed int4 values
_CSV_SCALE = {"QuantType.per_1x32": 1 / 32, "QuantType.per_1x128": 4 / (128 * 128)}


@dataclass(frozen=True)
class Geometry:
    """What the roofline needs of one fused-MoE call on one rank (padded sizes where a padding applies).

    ``w_bytes``: bytes per weight element including its scales; ``a_bytes``: bytes per activation element entering
    the expert GEMMs; ``compute``: which peak applies (``bf16``, ``fp8``, ``fp4``).
    """

    hidden: int
    inter: int
    experts: int          # on this rank
    experts_total: int    # routed over (EP: experts on this rank are a share of these)
    top_k: int
    w_bytes: float
    a_bytes: float
    compute: str
    gated: bool = True
    shared: int = 0       # always-active (fused shared) experts among ``experts`` and ``top_k``
    block_scale: bool = False   # weights scaled per 128x128 block (AITER per_1x128: CK/ASM fp8 blockscale kernels)

    @classmethod
    def of_layer(cls, layer: Any, padding: Any = None) -> "Geometry":
        """From a :class:`~moedispatch.core.layers.MoELayer` and, optionally, its :class:`~moedispatch.core.backend.Padding`."""
        w = layer.weight
        scale = 0.0   # scale bytes per weight element: E8M0 per 32 (MX), bf16 per group, fp32 per block
        block = False
        if w.quantized:
            if w.is_mx:
                scale = 1 / 32
            elif w.group_size:
                scale = (1 if w.scale_dtype == "e8m0" else 2) / w.group_size
            elif w.block:
                scale = 4 / (w.block[0] * w.block[1])
                block = True
        return cls(
            hidden=padding.hidden if padding is not None else layer.hidden,
            inter=padding.intermediate_per_rank if padding is not None else layer.intermediate_per_rank,
            experts=layer.experts_per_rank, experts_total=layer.experts, top_k=layer.top_k,
            w_bytes=w.bits / 8 + scale, a_bytes=_ACT_BYTES[layer.act.dtype], compute=_COMPUTE[layer.act.dtype],
            block_scale=block,
        )

    @classmethod
    def of_row(cls, row: Any) -> "Geometry":
        """From an AITER tuned-CSV row (:class:`moedispatch.data.aiter_configs.TunedRow` or a mapping with its columns)."""
        get = (lambda k: row[k]) if isinstance(row, Mapping) else (lambda k: getattr(row, k))
        qa, qw = str(get("q_dtype_a")), str(get("q_dtype_w"))
        if qa not in _CSV_BYTES or qw not in _CSV_BYTES:
            raise UsageError(f"unknown AITER dtype {qa if qa not in _CSV_BYTES else qw!r} in a tuned row")
        a = _CSV_BYTES[qa]
        return cls(
            hidden=int(get("model_dim")), inter=int(get("inter_dim")), experts=int(get("expert")),
            experts_total=int(get("expert")), top_k=int(get("topk")),
            w_bytes=_CSV_BYTES[qw] + _CSV_SCALE.get(str(get("q_type")), 0.0), a_bytes=a,
            compute={2.0: "bf16", 1.0: "fp8", 0.5: "fp4"}[a], gated=int(get("use_g1u1")) == 1,
            shared=_fused_shared(int(get("expert")), int(get("topk"))),
            block_scale=str(get("q_type")) == "QuantType.per_1x128",
        )

    @property
    def pair(self) -> str:
        """The (activation, weight) storage widths as AITER names its kernels and tuned files (``a16w4``,
        ``a8w4``, ``a4w4``, ``a8w8``…): bits per activation and per weight element, scales not counted (int4 and
        MXFP4 weights are both ``w4``). Keys the per-pair decode fixed term (``[[decode]] pair``)."""
        return f"a{int(self.a_bytes * 8 + 1e-9)}w{int(self.w_bytes * 8 + 1e-9)}"

    def active_experts(self, tokens: int) -> float:
        """Expected distinct experts of this rank touched by ``tokens`` tokens under uniform top-k routing (fused
        shared experts are always touched)."""
        s = self.shared
        routed = self.experts - s
        return s + routed * (1 - (1 - (self.top_k - s) / (self.experts_total - s)) ** tokens)

    def bytes_moved(self, tokens: int) -> float:
        n1 = 2 * self.inter if self.gated else self.inter
        weights = self.active_experts(tokens) * self.hidden * (n1 + self.inter) * self.w_bytes
        share = self.experts / self.experts_total
        acts = (tokens * self.hidden * self.a_bytes + 2 * tokens * self.top_k * share * self.inter * self.a_bytes
                + 2 * tokens * self.hidden)
        return weights + acts

    def flops(self, tokens: int) -> float:
        n1 = 2 * self.inter if self.gated else self.inter
        return 2 * tokens * self.top_k * (self.experts / self.experts_total) * self.hidden * (n1 + self.inter)


def _fused_shared(experts: int, top_k: int) -> int:
    """1 when a tuned row's expert count is odd (DeepSeek-V3 257/top-9, Kimi-K2 385/top-9, MiniMax-M3 129/top-5):
    the shared expert fused into the routed set, selected by every token (derived: routed counts are even)."""
    return 1 if experts > 8 and top_k > 1 and experts % 2 == 1 else 0


def _peak_tflops(peaks: Mapping[str, Any], compute: str) -> float:
    if compute == "fp4" and "fp4_tflops" in peaks:
        return float(peaks["fp4_tflops"])
    if compute in ("fp4", "fp8") and "fp8_tflops" in peaks:
        return float(peaks["fp8_tflops"])
    return float(peaks["bf16_tflops"])


def roofline_us(geo: Geometry, tokens: int, peaks: Mapping[str, Any]) -> tuple[float, float]:
    """``(t_mem, t_cmp)`` in µs against datasheet ``peaks`` (gpus.toml ``[peak.*]``: hbm_tbps, *_tflops)."""
    t_mem = geo.bytes_moved(tokens) / (float(peaks["hbm_tbps"]) * 1e6)
    t_cmp = geo.flops(tokens) / (_peak_tflops(peaks, geo.compute) * 1e6)
    return t_mem, t_cmp


def bucket_of(tokens: int) -> int:
    """The token bucket a count falls in: the next power of two (AITER ``get_padded_M`` below 32768)."""
    b = 1
    while b < tokens:
        b *= 2
    return b


#: Feature sets of the efficiency priors: log(us) = coef · features. ``rl`` = max(t_mem, t_cmp).
_FEATURES: dict[str, Callable[[float, float, float, Geometry, int, int], list[float]]] = {}


def _feature(name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        _FEATURES[name] = fn
        return fn
    return deco


@_feature("bucket")
def _f_bucket(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    return [1.0, math.log(rl), math.log(m * geo.top_k / geo.experts_total), math.log(geo.a_bytes)]


#: From this token bucket on, bucket priors also see the weight bytes, the intermediate size and whether the weights
#: are block-scaled (``bucket_large``), and their bars are their own (band level ``bucket_large``): at 2048+ tokens
#: the kernel family — FlyDSL MXFP4 against CK fp8 blockscale — sets the efficiency, which the roofline, the token
#: count and the activation dtype alone cannot tell apart (leave-one-file-out p90 at gfx950 16k-32k tokens: 42-46%
#: without these terms, measured by benchmarks/bench_cost_model.py).
LARGE_M = 2048


@_feature("bucket_large")
def _f_bucket_large(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    return _f_bucket(tm, tc, rl, geo, m, cu) + [math.log(geo.w_bytes), math.log(geo.inter),
                                                 1.0 if geo.block_scale else 0.0]


@_feature("arch_cu")
def _f_arch_cu(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    lb = math.log(bucket_of(m))
    return [1.0, math.log(tm), math.log(tc), lb, lb * lb, lb * math.log(rl), math.log(geo.a_bytes),
            math.log(geo.w_bytes)]


@_feature("arch")
def _f_arch(tm: float, tc: float, rl: float, geo: Geometry, m: int, cu: int) -> list[float]:
    lb = math.log(bucket_of(m))
    return [1.0, math.log(rl), lb, lb * lb, math.log(cu)]


def model_features(name: str, geo: Geometry, tokens: int, cu: int, peaks: Mapping[str, Any]) -> list[float]:
    """The feature vector of prior family ``name`` (``bucket``, ``bucket_large``, ``arch_cu``, ``arch``)."""
    tm, tc = roofline_us(geo, tokens, peaks)
    return _FEATURES[name](tm, tc, max(tm, tc), geo, tokens, cu)


#: Coefficients per feature set (checked when the priors load).
FEATURE_SIZES = {"bucket": 4, "bucket_large": 7, "arch_cu": 8, "arch": 5}


# -- lint --------------------------------------------------------------------------------------------------------

def _row_get(row: Any, name: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def _shape_key(row: Any) -> tuple:
    return tuple(_row_get(row, k) for k in ("gfx", "cu_num", "model_dim", "inter_dim", "expert", "topk", "act_type",
                                            "dtype", "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1",
                                            "doweight_stage1", "file"))


def lint_rows(rows: Iterable[Any], peaks_for: Callable[[Any], Mapping[str, Any] | None]) -> tuple[list, list]:
    """Split tuned rows into ``(clean, rejected)``; each rejected entry is ``(row, why)``.

    Rejected: no positive ``us``; ``us`` identical (to 4 decimals) to another token bucket's of the same shape in the
    same file (timings copied across buckets); ``us`` below the datasheet roofline of ``peaks_for(row)`` (physically
    impossible). Rows tagged (``_tag``) are left to the caller.
    """
    rows = list(rows)
    seen: dict[tuple, dict[float, int]] = {}
    for r in rows:
        us = _row_get(r, "us")
        if us:
            counts = seen.setdefault(_shape_key(r), {})
            counts[round(float(us), 4)] = counts.get(round(float(us), 4), 0) + 1
    clean: list = []
    rejected: list = []
    for r in rows:
        us = _row_get(r, "us")
        if not us or float(us) <= 0:
            rejected.append((r, "no timing"))
            continue
        us = float(us)
        if seen[_shape_key(r)][round(us, 4)] > 1:
            rejected.append((r, f"us={us:g} is copied across token buckets of this shape"))
            continue
        peaks = peaks_for(r)
        if peaks is not None:
            try:
                geo = Geometry.of_row(r)
            except (UsageError, KeyError, ValueError, TypeError, AttributeError) as exc:
                rejected.append((r, f"cannot read the row's shape ({exc})"))
                continue
            tm, tc = roofline_us(geo, int(_row_get(r, "token")), peaks)
            if us < max(tm, tc):
                rejected.append((r, f"us={us:g} is faster than the datasheet roofline ({max(tm, tc):.1f} µs)"))
                continue
        clean.append(r)
    return clean, rejected


# -- priors ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Priors:
    """capability_db/cost_priors.toml, indexed. Build with :func:`load_priors`."""

    models: Mapping[tuple, tuple[str, tuple[float, ...]]]     # (level, gfx, cu, bucket) -> (features, coef)
    buckets: Mapping[tuple[str, int], tuple[int, ...]]       # (gfx, cu) -> fitted buckets, ascending
    bands: Mapping[tuple, tuple[float, float]]               # (level, gfx, cu) -> (low ratio, high ratio)
    reference: Mapping[tuple[str, int], str]                 # (gfx, cu) -> product the priors were fit against
    decode: Mapping[tuple[str, int], "DecodeFit"]            # (gfx, cu) (cu 0: any) -> latency-plus-bytes fit
    tuned: tuple[float, float]
    interpolated: tuple[float, float]
    generic: tuple[float, float, float]                      # efficiency, low ratio, high ratio
    backend: Mapping[str, Mapping[str, Any]]
    heuristic: Mapping[str, Any]                             # factor, low, high, source: AITER's untuned kernels
    provenance: Mapping[str, Any]
    #: (gfx, cu, pair) -> the decode fit with that (activation, weight) pair's own fixed term (:attr:`Geometry.pair`)
    decode_pair: Mapping[tuple[str, int, str], "DecodeFit"] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeFit:
    """``us = fixed_us + t_mem / efficiency`` up to ``max_tokens`` tokens (``t_mem`` at the target's datasheet HBM
    bandwidth), fit on ``n`` lint-clean tuned rows (:func:`fit_decode`)."""

    fixed_us: float
    efficiency: float
    max_tokens: int
    n: int = 0
    pair: str = ""          # "" for the (arch, CU count) fit; else the (activation, weight) pair of its fixed term


def _num(value: Any, where: str, key: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            (positive and value <= 0):
        raise CapabilityDBError(f"{where}: {key} must be a {'positive ' if positive else ''}finite number, "
                                f"got {value!r:.60}")
    return float(value)


def _band(entry: Any, where: str) -> tuple[float, float]:
    if not isinstance(entry, Mapping):
        raise CapabilityDBError(f"{where} must be a table with low and high")
    for key in ("low", "high"):
        if key not in entry:
            raise CapabilityDBError(f"{where} lacks key {key!r}")
    low, high = _num(entry["low"], where, "low"), _num(entry["high"], where, "high")
    if not low <= 1.0 <= high:
        raise CapabilityDBError(f"{where}: needs low <= 1 <= high (ratios to the prediction), got {low}, {high}")
    return low, high


def parse_priors(data: Mapping[str, Any], where: str = f"capability_db/{_PRIORS_FILE}") -> Priors:
    """Validate and index a parsed priors document; a broken entry raises CapabilityDBError naming key and problem."""
    if data.get("schema") != _PRIORS_SCHEMA:
        raise CapabilityDBError(f"{where}: schema must be {_PRIORS_SCHEMA!r}, got {data.get('schema')!r}")
    for table in ("provenance", "tuned", "interpolated", "generic", "backend", "heuristic"):
        if not isinstance(data.get(table), Mapping):
            raise CapabilityDBError(f"{where}: missing table [{table}]")
    for key in ("snapshot", "commit", "date", "script"):
        if not isinstance(data["provenance"].get(key), str) or not data["provenance"][key]:
            raise CapabilityDBError(f"{where}: [provenance] needs a non-empty string {key!r}")
    models, buckets = _parse_models(data, where)
    bands, reference = _parse_bands(data, where)
    decode, decode_pair = _parse_decode(data, where)
    gen = data["generic"]
    for key in ("efficiency", "low", "high"):
        if key not in gen:
            raise CapabilityDBError(f"{where}: [generic] lacks key {key!r}")
    generic = (_num(gen["efficiency"], f"{where}: [generic]", "efficiency"),) + _band(gen, f"{where}: [generic]")
    backend, heuristic = _parse_factors(data, where)
    return Priors(models=models, buckets={k: tuple(sorted(v)) for k, v in buckets.items()}, bands=bands,
                  reference=reference, decode=decode, tuned=_band(data["tuned"], f"{where}: [tuned]"),
                  interpolated=_band(data["interpolated"], f"{where}: [interpolated]"), generic=generic,
                  backend=backend, heuristic=heuristic, provenance=dict(data["provenance"]), decode_pair=decode_pair)


def _parse_models(data: Mapping[str, Any], where: str) -> tuple[dict[tuple, tuple[str, tuple[float, ...]]],
                                                                 dict[tuple[str, int], set[int]]]:
    """The [[model]] entries: {(level, gfx, cu, bucket): (features, coefficients)} and each arch's fitted buckets."""
    models: dict[tuple, tuple[str, tuple[float, ...]]] = {}
    buckets: dict[tuple[str, int], set[int]] = {}
    for n, m in enumerate(data.get("model", [])):
        at = f"{where}: model[{n}]"
        if not isinstance(m, Mapping):
            raise CapabilityDBError(f"{at} must be a table")
        for key in ("level", "gfx", "features", "coef"):
            if key not in m:
                raise CapabilityDBError(f"{at} lacks key {key!r}")
        feats = m["features"]
        if feats not in FEATURE_SIZES:
            raise CapabilityDBError(f"{at}: features {feats!r} unknown (known: {', '.join(FEATURE_SIZES)})")
        coef = m["coef"]
        if not isinstance(coef, list) or len(coef) != FEATURE_SIZES[feats]:
            raise CapabilityDBError(f"{at}: coef must be {FEATURE_SIZES[feats]} numbers for features {feats!r}")
        coef_t = tuple(_num(c, at, "coef", positive=False) for c in coef)
        level = m["level"]
        if level not in ("bucket", "arch_cu", "arch"):
            raise CapabilityDBError(f"{at}: level must be bucket, arch_cu or arch, got {level!r}")
        cu = int(_num(m.get("cu"), at, "cu")) if level != "arch" else 0
        b = int(_num(m.get("bucket"), at, "bucket")) if level == "bucket" else 0
        models[(level, str(m["gfx"]), cu, b)] = (feats, coef_t)
        if level == "bucket":
            buckets.setdefault((str(m["gfx"]), cu), set()).add(b)
    return models, buckets


def _parse_bands(data: Mapping[str, Any], where: str) -> tuple[dict[tuple, tuple[float, float]],
                                                                dict[tuple[str, int], str]]:
    """The [[band]] entries per (level, gfx, cu) and the [[reference]] product of each (gfx, CU count)."""
    bands: dict[tuple, tuple[float, float]] = {}
    for n, entry in enumerate(data.get("band", [])):
        at = f"{where}: band[{n}]"
        if not isinstance(entry, Mapping) or "level" not in entry or "gfx" not in entry:
            raise CapabilityDBError(f"{at} needs level, gfx, low and high")
        bands[(entry["level"], str(entry["gfx"]), int(entry.get("cu", 0)))] = _band(entry, at)
    reference: dict[tuple[str, int], str] = {}
    for n, entry in enumerate(data.get("reference", [])):
        at = f"{where}: reference[{n}]"
        if not isinstance(entry, Mapping) or not {"gfx", "cu", "product"} <= set(entry):
            raise CapabilityDBError(f"{at} needs gfx, cu and product")
        reference[(str(entry["gfx"]), int(entry["cu"]))] = str(entry["product"])
    return bands, reference


def _parse_decode(data: Mapping[str, Any], where: str) -> tuple[dict[tuple[str, int], DecodeFit],
                                                                 dict[tuple[str, int, str], DecodeFit]]:
    """The [[decode]] fits per (gfx, cu), and per activation × weight bits pair (whose parent must exist)."""
    decode: dict[tuple[str, int], DecodeFit] = {}
    decode_pair: dict[tuple[str, int, str], DecodeFit] = {}
    for n, entry in enumerate(data.get("decode", [])):
        at = f"{where}: decode[{n}]"
        if not isinstance(entry, Mapping) or not {"gfx", "cu", "fixed_us", "efficiency", "max_tokens"} <= set(entry):
            raise CapabilityDBError(f"{at} needs gfx, cu, fixed_us, efficiency and max_tokens")
        eff = _num(entry["efficiency"], at, "efficiency")
        if eff > 1:
            raise CapabilityDBError(f"{at}: efficiency must be <= 1 (a share of the datasheet bandwidth), got {eff}")
        pair = entry.get("pair", "")
        if not isinstance(pair, str) or (pair and not _PAIR.fullmatch(pair)):
            raise CapabilityDBError(f"{at}: pair must be like 'a8w4' (activation and weight bits), got {pair!r:.60}")
        fit = DecodeFit(fixed_us=_num(entry["fixed_us"], at, "fixed_us", positive=False), efficiency=eff,
                        max_tokens=int(_num(entry["max_tokens"], at, "max_tokens")), n=int(entry.get("n", 0)),
                        pair=pair)
        key = (str(entry["gfx"]), int(_num(entry["cu"], at, "cu", positive=False)))
        if pair:
            decode_pair[key + (pair,)] = fit
        else:
            decode[key] = fit
    for (g, c, pair), fit in decode_pair.items():
        parent = decode.get((g, c))
        if parent is None or (parent.efficiency, parent.max_tokens) != (fit.efficiency, fit.max_tokens):
            raise CapabilityDBError(f"{where}: decode {g}/{c} pair {pair} needs a decode entry for {g}/{c} without a "
                                    "pair with the same efficiency and max_tokens (a pair has its own fixed term "
                                    "only)")
    return decode, decode_pair


def _parse_factors(data: Mapping[str, Any], where: str) -> tuple[dict[str, Mapping[str, Any]], dict[str, Any]]:
    """The [backend.*] factor bands (triton, emulation and other required) and the [heuristic] band."""
    backend: dict[str, Mapping[str, Any]] = {}
    for name, entry in data["backend"].items():
        at = f"{where}: [backend.{name}]"
        if not isinstance(entry, Mapping) or "factor" not in entry or "source" not in entry:
            raise CapabilityDBError(f"{at} needs factor, low, high and source")
        factor = _num(entry["factor"], at, "factor")
        low, high = _num(entry.get("low"), at, "low"), _num(entry.get("high"), at, "high")
        if not low <= factor <= high:
            raise CapabilityDBError(f"{at}: needs low <= factor <= high, got {low}, {factor}, {high}")
        backend[name] = dict(entry)
    for required in ("triton", "emulation", "other"):
        if required not in backend:
            raise CapabilityDBError(f"{where}: missing table [backend.{required}]")
    heuristic = dict(data["heuristic"])
    at = f"{where}: [heuristic]"
    if not isinstance(heuristic.get("source"), str) or not heuristic["source"]:
        raise CapabilityDBError(f"{at} needs factor, low, high and source")
    factor = _num(heuristic.get("factor"), at, "factor")
    low, high = _num(heuristic.get("low"), at, "low"), _num(heuristic.get("high"), at, "high")
    if not 1.0 <= low <= factor <= high:
        raise CapabilityDBError(f"{at}: needs 1 <= low <= factor <= high (untuned kernels are not faster than "
                                f"tuned ones), got {low}, {factor}, {high}")
    return backend, heuristic


@memoize(maxsize=1)
def load_priors() -> Priors:
    """capability_db/cost_priors.toml, validated and indexed (cached; CapabilityDBError if broken)."""
    return parse_priors(capdb.load_toml(_PRIORS_FILE))


# -- hardware ----------------------------------------------------------------------------------------------------

def _target_peaks(caps: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """(datasheet peaks, product) of the target: its product's ``[peak.*]``, else the arch's first listed product
    with the same CU count."""
    product = getattr(caps, "product", None)
    peaks = capdb.product_peaks(product)
    facts = capdb.arch_facts(caps.gfx) if getattr(caps, "gfx", None) else None
    if peaks is not None:
        full = next((p["compute_units"] for p in (facts or {}).get("products", []) if p["name"] == product), None)
        cus = getattr(caps, "compute_units", None)
        if full and cus and cus < full:
            # A compute partition (CPX/QPX/DPX) sees a share of the CUs: the matrix peaks scale with them; HBM is
            # left at the full figure (a lower floor, never a claim of more speed).
            peaks = {k: (v * cus / full if k.endswith("_tflops") else v) for k, v in peaks.items()}
        return peaks, product
    for product in (facts or {}).get("products", []):
        if caps.compute_units in (None, product["compute_units"]):
            p = capdb.product_peaks(product["name"])
            if p is not None:
                return p, product["name"]
    return None, None


# -- tuned rows --------------------------------------------------------------------------------------------------

def _plan(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    """The AITER dispatch model's plan for the layer (no AITER environment: a library reads no env vars), or None
    when AITER cannot take the layer at all (then no tuned row can apply). Cached per layer signature."""
    try:
        return _plan_cached(layer.signature(), caps, padding, tokens)
    except TypeError:  # unhashable stand-ins
        return _plan_uncached(layer, caps, padding, tokens)


@memoize(maxsize=256)
def _plan_cached(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    return _plan_uncached(layer, caps, padding, tokens)


def _plan_uncached(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...]) -> Any:
    try:
        return aiter_dispatch.plan_dispatch(layer, caps, tokens=tokens, env={}, padding=padding)
    except UsageError:
        return None


def _shape_rows(key: Any, caps: Any, q_dtype_a: str) -> tuple[Any, ...]:
    """Every tuned row of the dispatch key's shape (any token) with activations ``q_dtype_a``, exact act_type
    first as AITER looks it up (then the act-wildcarded dict, ``aiter/fused_moe.py`` ``get_2stage_cfgs``)."""
    try:
        return _shape_rows_cached(key, caps, q_dtype_a)
    except TypeError:  # unhashable stand-ins
        return _shape_rows_uncached(key, caps, q_dtype_a)


@memoize(maxsize=256)
def _shape_rows_cached(key: Any, caps: Any, q_dtype_a: str) -> tuple[Any, ...]:
    return _shape_rows_uncached(key, caps, q_dtype_a)


def _shape_rows_uncached(key: Any, caps: Any, q_dtype_a: str) -> tuple[Any, ...]:
    rows = aiter_configs.tuned_rows(
        config_set=aiter_configs.config_set_for(caps, model_dims=frozenset({key.model_dim})),
        model_dim=key.model_dim, inter_dim=key.inter_dim,
        expert=key.expert, topk=key.topk, gfx=key.gfx, cu_num=key.cu_num, dtype=key.dtype, q_dtype_a=q_dtype_a,
        q_dtype_w=key.q_dtype_w, q_type=key.q_type, use_g1u1=key.use_g1u1, doweight_stage1=key.doweight_stage1)
    exact = [r for r in rows if r.act_type == key.act_type]
    return tuple(exact or rows)


def _key_geometry(layer: Any, padding: Any, key: Any) -> Geometry:
    """The layer's geometry as AITER runs it: a fused shared expert (key.expert = experts + 1) is one more expert,
    always selected."""
    geo = Geometry.of_layer(layer, padding)
    fused = max(0, int(getattr(key, "expert", layer.experts_per_rank)) - layer.experts_per_rank)
    if not fused:
        return geo
    return Geometry(hidden=geo.hidden, inter=geo.inter, experts=geo.experts + fused,
                    experts_total=geo.experts_total + fused, top_k=geo.top_k + fused, w_bytes=geo.w_bytes,
                    a_bytes=geo.a_bytes, compute=geo.compute, gated=geo.gated, shared=fused,
                    block_scale=geo.block_scale)


def _rows_from_dispatch(dispatch: Iterable[Any], caps: Any) -> list[Any]:
    """Rows named by the AITER dispatch model's entries (``row`` attribute, or ``config`` = ``file:line``)."""
    out: list[Any] = []
    by_where: dict[str, Any] | None = None
    for entry in dispatch:
        if _row_get(entry, "basis") not in (None, "tuned"):
            continue
        row = _row_get(entry, "row")
        if row is None:
            config = _row_get(entry, "config")
            if isinstance(config, Mapping):
                row = config if "us" in config else None
            elif isinstance(config, str) and ":" in config:
                if by_where is None:
                    by_where = {r.where: r for r in aiter_configs.config_set_for(caps).rows}
                row = by_where.get(config)
        if row is not None:
            out.append(row)
    return out


# -- prediction --------------------------------------------------------------------------------------------------

backend_kind = kind_of  # the cost model's name for it (moedispatch.core.families.kind_of)


def _check_tokens(tokens: Iterable[int] | int) -> tuple[int, ...]:
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = (tokens,)
    try:
        out = tuple(tokens)
    except TypeError:
        raise UsageError(f"tokens must be positive integers, got {tokens!r}") from None
    if not out or any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in out):
        raise UsageError(f"tokens must be positive integers, got {list(out)!r}")
    return out


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _prior_us(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors,
              ref: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int]] | None:
    """The first prior of the chain bucket → arch_cu → arch that exists for (gfx, cu), evaluated at ``m``."""
    if ref is None:
        return None
    b = bucket_of(m)
    fitted = priors.buckets.get((gfx, cu), ()) if gfx else ()
    if fitted and not fitted[0] <= b <= fitted[-1]:
        b = fitted[0] if b < fitted[0] else fitted[-1]   # beyond the tuned range: the nearest end's prior
    for key in (("bucket", gfx, cu, b), ("arch_cu", gfx, cu, 0), ("arch", gfx, 0, 0)):
        model = priors.models.get(key)
        if model is not None:
            feats, coef = model
            return math.exp(_dot(coef, model_features(feats, geo, m, cu or 1, ref))), key
    return None


def _decode_us(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors,
               peaks: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int], DecodeFit] | None:
    """Latency plus bytes at ``m`` tokens when a ``[[decode]]`` fit for (gfx, cu), else for the arch (cu 0), covers
    ``m``: ``fixed_us + t_mem / efficiency`` with ``t_mem`` at ``peaks`` (the target's datasheet HBM). The fixed term
    is the layer's (activation, weight) pair's own (:attr:`Geometry.pair`) where the fit has one, else the fit's."""
    if peaks is None or not gfx:
        return None
    for c in (cu, 0):
        fit = priors.decode.get((gfx, c))
        if fit is not None:
            if m > fit.max_tokens:
                return None
            fit = priors.decode_pair.get((gfx, c, geo.pair), fit)
            t_mem = roofline_us(geo, m, peaks)[0]
            return fit.fixed_us + t_mem / fit.efficiency, ("decode", gfx, c, 0), fit
    return None


def _estimate(geo: Geometry, m: int, gfx: str | None, cu: int, priors: Priors, ref: Mapping[str, Any] | None,
              peaks: Mapping[str, Any] | None) -> tuple[float, tuple[str, str | None, int, int]] | None:
    """The decode fit where it covers ``m``, else the efficiency prior (bucket → arch_cu → arch).

    Where only the arch-wide prior answers for a CU count that has a decode fit of its own (MI300X/MI325X's 304,
    MI308X's 80 when its tuned file is missing), the arch prior's curve is scaled to meet that CU count's decode fit
    at the fit's last token count (level ``arch_anchored``): the arch-wide prior pools every CU count of the arch and
    misses one count's level by a constant factor, which the count's own decode rows measure (leave-one-file-out in
    benchmarks/bench_cost_model.py: the 223 MI308X rows above 64 tokens predicted without ``tuned_fmoe.csv``, median
    error 16.0% → 11.0%, truth/prediction 1.14 → 0.97; checked on the cu-304 rows it was not chosen on: 14.4% →
    13.6%, p90 42.6% → 39.5%).
    """
    found = _decode_us(geo, m, gfx, cu, priors, peaks)
    if found is not None:
        return found[0], found[1]
    prior = _prior_us(geo, m, gfx, cu, priors, ref)
    own = priors.decode.get((gfx, cu)) if cu else None
    if prior is None or prior[1][0] != "arch" or own is None:
        return prior
    # Both at the reference product's peaks the two were fit against: the factor is the CU count's level, not a
    # bandwidth credit (MI325X keeps MI300X's factor; its own HBM is credited by the decode fit only).
    edge = _decode_us(geo, own.max_tokens, gfx, cu, priors, ref)
    at_edge = _prior_us(geo, own.max_tokens, gfx, cu, priors, ref)
    if edge is None or at_edge is None:
        return prior  # pragma: no cover - both exist whenever ``own`` and ``prior`` do
    return prior[0] * edge[0] / at_edge[0], ("arch_anchored", gfx, cu, 0)


def _roofline_cost(geo: Geometry, m: int, caps: Any, priors: Priors, peaks: Mapping[str, Any] | None,
                   floor: float) -> tuple[float, float, float, str, str]:
    """(us, low, high, detail, level) from the decode fit or the efficiency priors, never below ``floor``.

    Priors are per token bucket, so the prediction at ``m`` is also kept at or above the prediction at every lower
    power of two (the decode fit's included): more tokens never take less time.
    """
    gfx, cu = getattr(caps, "gfx", None), getattr(caps, "compute_units", None) or 0
    ref_product = priors.reference.get((gfx, cu)) if gfx else None
    ref = (capdb.product_peaks(ref_product) if ref_product else None) or peaks
    found = _estimate(geo, m, gfx, cu, priors, ref, peaks)
    if found is not None:
        us, key = found
        lower = 1
        while lower < m:
            below = _estimate(geo, lower, gfx, cu, priors, ref, peaks)
            if below is not None and below[0] > us:
                us = below[0]
            lower *= 2
        level = "bucket_large" if key[0] == "bucket" and key[3] >= LARGE_M else key[0]
        band = priors.bands.get((level, gfx, cu)) or priors.bands.get((level, gfx, 0)) or priors.generic[1:]
        where = "/".join(str(k) for k in key[1:] if k)
        if level == "decode":
            fit = _decode_us(geo, m, gfx, cu, priors, peaks)[2]
            product = getattr(caps, "product", None) or "target"
            mine = priors.decode[(gfx, key[2])]
            fixed = (f"{fit.fixed_us:.1f} µs ({fit.pair}'s own, fit on its {fit.n} clean tuned rows)" if fit.pair else
                     f"{fit.fixed_us:.1f} µs")
            detail = (f"decode latency plus bytes {where}: {fixed} + bytes at {fit.efficiency:.0%} of "
                      f"{product}'s {float(peaks['hbm_tbps']):g} TB/s HBM (fit on {mine.n} clean tuned rows with "
                      f"<= {fit.max_tokens} tokens)")
        elif level == "arch_anchored":
            detail = (f"roofline with the arch prior {gfx} (fit against {ref_product or 'target'} peaks), scaled to "
                      f"meet the decode fit {where} at {priors.decode[(gfx, cu)].max_tokens} tokens")
        else:
            detail = f"roofline with {level} prior {where} (fit against {ref_product or 'target'} peaks)"
    else:
        if peaks is None:
            raise UsageError(f"no peak throughput known for {getattr(caps, 'arch_label', gfx)}: add a [peak.<product>] "
                             "table to capability_db/gpus.toml")   # predict() returns () before this
        eff, lo, hi = priors.generic
        tm, tc = roofline_us(geo, m, peaks)
        us, band = max(tm, tc) / eff, (lo, hi)
        detail = f"roofline with the generic efficiency {eff:.2f} (no prior for {gfx} with {cu} CUs)"
        level = "generic"
    us = max(us, floor)
    return us, max(us * band[0], floor), max(us * band[1], us), detail, level


def fit_decode(points: Iterable[tuple[float, float]], *, iterations: int = 60) -> tuple[float, float]:
    """``(fixed_us, efficiency)`` of ``us ≈ fixed_us + t_mem / efficiency`` over ``points`` = ``(t_mem, us)``.

    Least absolute *relative* deviations (the median of ``|pred/us − 1|`` is what the benchmark scores), by
    iteratively reweighted least squares in pure Python; constrained to ``fixed_us >= 0`` and ``efficiency <= 1``
    (nothing streams faster than the datasheet bandwidth ``t_mem`` is computed with). Deterministic.
    """
    pts = [(float(t), float(u)) for t, u in points if u > 0]
    if len(pts) < 2:
        raise ValueError(f"fit_decode needs at least 2 points, got {len(pts)}")

    def solve(fix_b: float | None, fix_a: float | None) -> tuple[float, float]:
        a, b = 0.0, 1.0
        last = (math.nan, math.nan)
        w = [1.0] * len(pts)
        for _ in range(iterations):
            # residual r = (a + b t) / u - 1; weighted least squares in (a, b), one of them possibly fixed
            saa = sab = sbb = sa1 = sb1 = 0.0
            for (t, u), wi in zip(pts, w):
                x, y = 1 / u, t / u
                saa += wi * x * x
                sab += wi * x * y
                sbb += wi * y * y
                sa1 += wi * x * (1 - (fix_b or 0.0) * y)
                sb1 += wi * y * (1 - (fix_a or 0.0) * x)
            if fix_b is not None:
                a, b = sa1 / saa, fix_b
            elif fix_a is not None:
                a, b = fix_a, sb1 / sbb
            else:
                det = saa * sbb - sab * sab
                a = (sa1 * sbb - sb1 * sab) / det
                b = (saa * sb1 - sab * sa1) / det
            if abs(a - last[0]) <= 1e-8 * max(1.0, abs(a)) and abs(b - last[1]) <= 1e-8 * max(1.0, abs(b)):
                break
            last = (a, b)
            w = [1 / max(abs((a + b * t) / u - 1), 1e-4) for t, u in pts]
        return a, b

    a, b = solve(None, None)
    if b < 1.0:                 # faster than the datasheet: pin the bandwidth at the datasheet figure
        a, b = solve(1.0, None)
    if a < 0.0:                 # no negative latency: all of it is bytes
        a, b = 0.0, max(solve(None, 0.0)[1], 1.0)
    return max(a, 0.0), 1 / b


def fit_decode_fixed(points: Iterable[tuple[float, float]], efficiency: float) -> float:
    """``fixed_us`` of ``us ≈ fixed_us + t_mem / efficiency`` over ``points`` = ``(t_mem, us)`` with the
    ``efficiency`` given (a pair's own fixed term under its (arch, CU count) fit's bandwidth share): least absolute
    relative deviations, exactly — ``|(a + t/e)/u − 1| = |a − (u − t/e)| / u``, so ``a`` is the median of
    ``u − t/e`` weighted by ``1/u`` (the lower one on a tie). Never negative."""
    pts = sorted((float(u) - float(t) / efficiency, 1 / float(u)) for t, u in points if u > 0)
    if not pts:
        raise ValueError("fit_decode_fixed needs at least 1 point")
    half = sum(w for _v, w in pts) / 2
    acc = 0.0
    for value, w in pts:
        acc += w
        if acc >= half:
            return max(value, 0.0)
    return max(pts[-1][0], 0.0)  # pragma: no cover - float rounding only


def interpolate(m: int, lo: tuple[int, float], hi: tuple[int, float],
                abscissa: Callable[[int], float] | None = None) -> float:
    """Log-log interpolation of the time at ``m`` tokens between tuned rows ``lo = (m0, us0)``, ``hi = (m1, us1)``.

    The abscissa is ``log(abscissa(m))`` — :func:`predict` passes the roofline work ``t_mem + t_cmp``, which bends
    with the expected number of experts touched (leave-one-bucket-out median error 3.3% vs 4.7% for ``log m``); it
    increases with ``m``, so the result is monotone in ``m`` and lies between the two rows. Default: ``log m``.
    """
    (m0, u0), (m1, u1) = lo, hi
    x = abscissa or float
    x0, x1 = math.log(x(m0)), math.log(x(m1))
    f = (math.log(x(m)) - x0) / (x1 - x0) if x1 != x0 else 0.0
    f = min(max(f, 0.0), 1.0)
    return math.exp(math.log(u0) + f * (math.log(u1) - math.log(u0)))


def _plugin_costs(pm: Any, backend: str, layer: Any, caps: Any, tokens: tuple[int, ...]) -> tuple[Cost, ...] | None:
    log = get_logger(__name__)
    try:
        if callable(pm) and not hasattr(pm, "hook"):
            result = pm(backend=backend, layer=layer, caps=caps, tokens=tokens)
        else:
            result = pm.hook.moe_cost(backend=backend, layer=layer, caps=caps, tokens=tokens)
    except Exception as exc:  # noqa: BLE001 - a broken plugin never breaks explain; the roofline answers instead
        log.warning("plugin_cost_failed", backend=backend, error=f"{type(exc).__name__}: {exc}")
        return None
    if result is None:
        return None
    try:
        got: dict[int, Cost] = {}
        for item in result:
            if isinstance(item, Cost):
                c = item
            else:
                c = Cost(int(item["tokens"]), float(item["us"]), float(item["low"]), float(item["high"]), "plugin")
            got[c.tokens] = Cost(c.tokens, c.us, c.low, c.high, "plugin", c.detail or f"declared by {backend}'s plugin")
        missing = [t for t in tokens if t not in got]
        if missing:
            raise ValueError(f"no cost for tokens {missing}")
    except (TypeError, KeyError, ValueError) as exc:
        log.warning("plugin_cost_invalid", backend=backend, error=str(exc))
        return None
    return tuple(got[t] for t in tokens)


def _release_context(caps: Any) -> release.ReleaseContext | None:
    """Whose µs the tuned rows of a plan for ``caps`` are (the tuned set :func:`_shape_rows` reads), or None when
    that cannot be said (then the same-release bars apply)."""
    try:
        return release.context_of(aiter_configs.config_set_for(caps, model_dims=frozenset({0})))
    except (UsageError, KeyError, TypeError, AttributeError):
        return None


def _whose(ctx: release.ReleaseContext | None) -> str:
    return f"; {ctx.describe()}" if ctx is not None else ""


def _heuristic_entry(entry: Any, m: int) -> bool:
    """A dispatch entry (object or dict with ``basis`` and ``tokens`` = [lo, hi]) that says AITER runs untuned
    kernels at ``m`` tokens."""
    basis, span = _row_get(entry, "basis"), _row_get(entry, "tokens")
    if basis in (None, "tuned") or not span:
        return False
    try:
        lo, hi = int(span[0]), int(span[-1])
    except (TypeError, ValueError, IndexError):
        return False
    return lo <= m <= hi


def _heuristic_band(c: Cost, band: Mapping[str, Any], floor: float) -> Cost:
    """``c`` (a prediction at tuned-kernel speed) where AITER runs its untuned (heuristic) kernels: × the
    ``[heuristic]`` factor, bars × its low and high."""
    factor, flo, fhi = float(band["factor"]), float(band["low"]), float(band["high"])
    us = c.us * factor
    return Cost(c.tokens, us, min(max(c.low * flo, floor), us), max(c.high * fhi, us), c.basis,
                f"{c.detail}; × {factor:g} ({flo:g}–{fhi:g}): AITER runs untuned (heuristic) kernels here "
                f"({band['source']})")


def predict_one(geo: Geometry, m: int, table: Mapping[int, tuple[float, str]], caps: Any, priors: Priors,
                peaks: Mapping[str, Any], *, kind: str = "aiter", ctx: "release.ReleaseContext | None" = None,
                skipped: Sequence[str] = ()) -> Cost:
    """One token count of :func:`predict` (before the heuristic band): ``table`` = ``{tokens: (us, where)}`` of the
    lint-clean tuned rows of the shape AITER looks up, ``ctx`` whose µs they are (None: the same-release bars).
    The benchmark's release held-out test calls it with an older release's truths against head's rows."""
    floor = max(roofline_us(geo, m, peaks))   # nothing runs faster than the datasheet peaks
    known = sorted(table)
    if m in table:
        us, where = table[m]
        lo, hi = release.bars_for("tuned", ctx, priors.tuned)
        return Cost(m, us, min(us, max(us * lo, floor)), us * hi, "tuned", f"tuned row {where}{_whose(ctx)}")
    below = [t for t in known if t < m]
    above = [t for t in known if t > m]
    if kind == "aiter" and below and above:
        a, b = below[-1], above[0]
        work = lambda t: sum(roofline_us(geo, t, peaks))  # noqa: E731 - the abscissa: roofline work
        us = max(interpolate(m, (a, table[a][0]), (b, table[b][0]), work), floor)
        lo, hi = release.bars_for("interpolated", ctx, priors.interpolated)
        return Cost(m, us, max(us * lo, floor), us * hi, "interpolated",
                    f"log-log between tuned rows at {a} ({table[a][1]}) and {b} ({table[b][1]}) tokens"
                    f"{_whose(ctx)}")
    us, low, high, detail, _level = _roofline_cost(geo, m, caps, priors, peaks, floor)
    if below or above:
        # Beyond the tuned token range of this shape: anchor on the nearest tuned row and scale it by the
        # prior's ratio between the two token counts (one bucket out: median error 4.5% against 7.6% for the
        # prior alone, measured on the bundled rows); the bars stay the roofline's.
        t = below[-1] if below else above[0]
        anchor_us, anchor_where = table[t]
        fitted = priors.buckets.get((getattr(caps, "gfx", None), getattr(caps, "compute_units", None) or 0))
        if not fitted or bucket_of(m) > fitted[-1]:
            # Past the largest fitted bucket the priors would extrapolate; the work itself scales instead
            # (compute-bound at these sizes: time grows with the FLOPs).
            ratio = sum(roofline_us(geo, m, peaks)) / sum(roofline_us(geo, t, peaks))
        else:
            ratio = us / _roofline_cost(geo, t, caps, priors, peaks, 0.0)[0]
        anchored = max(anchor_us * ratio, floor)
        low, high, us = max(low * anchored / us, floor), high * anchored / us, anchored
        detail += f"; scaled from the tuned row at {t} tokens ({anchor_where}, {anchor_us:.1f} µs){_whose(ctx)}"
    if skipped:
        detail += f"; tuned rows not used: {'; '.join(skipped[:3])}"
    if kind != "aiter":
        entry = priors.backend.get(kind) or priors.backend["other"]
        factor, flo, fhi = float(entry["factor"]), float(entry["low"]), float(entry["high"])
        us, low, high = us * factor, max(low * flo, floor), high * fhi
        detail = f"{detail}; × {factor:g} ({flo:g}–{fhi:g}) for {kind} ({entry['source']})"
    return Cost(m, us, min(low, us), max(high, us), "roofline", detail)


def predict(layer: Any, caps: Any, *, backend_family: str, padding: Any = None,
            tokens: Iterable[int] | int = DEFAULT_TOKENS, dispatch: Iterable[Any] | None = None,
            rows: Iterable[Any] | None = None, pm: Any = None) -> tuple[Cost, ...]:
    """Predicted time of one fused-MoE call of ``layer`` on ``caps`` per token count, in the order of ``tokens``.

    :param layer: a routed-expert :class:`~moedispatch.core.layers.MoELayer` (per-rank sizes).
    :param caps: the target :class:`~moedispatch.core.capabilities.Capabilities` (gfx, product, compute_units, AITER).
    :param backend_family: the backend's name (``aiter-flydsl``, ``triton``, ``emulation``, a plugin's name) or an
        AITER family (``ck``, ``flydsl``…); see :func:`backend_kind`. Only AITER backends use tuned rows.
    :param padding: the :class:`~moedispatch.core.backend.Padding` the backend runs with (padded sizes are what it reads
        and computes, and what AITER's tuned lookup keys on); None = unpadded.
    :param tokens: token counts (tokens entering the layer on this rank: decode batch size, prefill chunk).
    :param dispatch: what AITER runs for this layer: a :class:`moedispatch.aiter.dispatch.DispatchPlan` (its key —
        padded dims, fused shared expert, EP top-k — and per-token activation dtype pick the tuned shape; pass the
        plan explain already built, with its ``--aiter-env``), or an iterable of dispatch entries (objects or dicts
        with ``basis`` and ``row`` or ``config`` = ``file:line``) whose tuned rows are used as they are. None: the
        plan is simulated here with no AITER environment variables. Token counts its steps (or entries, by their
        ``tokens`` range) mark other than ``tuned`` run AITER's heuristic kernels: their prediction gets the
        ``[heuristic]`` factor band.
    :param rows: tuned rows of this layer's exact lookup key (any token), if the caller already has them (they win
        over ``dispatch``).
    :param pm: a pluggy PluginManager with the ``moe_cost`` hookspec (or a callable with the hook's arguments): a
        plugin's answer wins, with basis ``plugin``.
    :returns: one :class:`Cost` per token count — or ``()`` when nothing can be predicted: a target product without
        peak figures in gpus.toml (gfx90a, MI300A, RDNA) and no plugin answer. Explain shows no cost there.
    :raises UsageError: a dense layer or bad token counts.
    """
    tokens = _check_tokens(tokens)
    if getattr(layer, "kind", "moe") != "moe":
        raise UsageError(f"layer {getattr(layer, 'index', '?')} is dense: no MoE cost")
    if pm is not None:
        plugin = _plugin_costs(pm, backend_family, layer, caps, tokens)
        if plugin is not None:
            return plugin
    kind = backend_kind(backend_family)
    priors = load_priors()
    geo = Geometry.of_layer(layer, padding)
    peaks, _product = _target_peaks(caps)
    if peaks is None:
        return ()   # no datasheet figures: no physical floor to stand on, so no honest prediction

    # Tuned rows per token count: {m: rows of the shape AITER looks up for m} (see _tuned_shapes).
    shapes, geos, heuristic, ctx, geo = _tuned_shapes(layer, caps, padding, tokens, kind, geo, rows, dispatch)
    tables: dict[int, tuple[dict[int, tuple[float, str]], list[str]]] = {}

    def table_for(m: int) -> tuple[dict[int, tuple[float, str]], list[str]]:
        found = [r for r in shapes.get(m, ()) if not _row_get(r, "tag")]
        cache_key = id(shapes.get(m))
        if cache_key not in tables:
            clean, rejected = lint_rows(found, lambda r: peaks)
            t: dict[int, tuple[float, str]] = {}
            for r in clean:
                t.setdefault(int(_row_get(r, "token")),
                             (float(_row_get(r, "us")), str(_row_get(r, "where", "") or "tuned row")))
            tables[cache_key] = (t, [f"{_row_get(r, 'where', '?')}: {why}" for r, why in rejected])
        return tables[cache_key]

    out: list[Cost] = []
    layer_geo = geo

    def add(c: Cost, floor: float) -> None:
        out.append(_heuristic_band(c, priors.heuristic, floor) if c.tokens in heuristic else c)

    for m in tokens:
        geo = geos.get(m, layer_geo)
        table, skipped = table_for(m)
        add(predict_one(geo, m, table, caps, priors, peaks, kind=kind, ctx=ctx, skipped=skipped),
            max(roofline_us(geo, m, peaks)))
    return _no_faster_than_the_whole_device(tuple(out), layer, caps, backend_family, padding, tokens, rows)


def _tuned_shapes(layer: Any, caps: Any, padding: Any, tokens: tuple[int, ...], kind: str, geo: "Geometry",
                  rows: Iterable[Any] | None, dispatch: Any) -> tuple[dict[int, list[Any]], dict[int, "Geometry"],
                                                                   set[int], Any, "Geometry"]:
    """Tuned rows per token count: (``{m: rows of the shape AITER looks up for m}``, the geometry per m where the
    dispatch model's activation-dtype policy changes q_dtype_a with M, the token counts AITER runs untuned
    (heuristic) kernels at, whose µs the tuned rows are and how the user's AITER relates to that release, the
    layer's geometry as AITER's lookup key pads it). One shape for every m, except where the activation dtype
    changes."""
    shapes: dict[int, list[Any]] = {}
    geos: dict[int, Geometry] = {}
    heuristic: set[int] = set()   # token counts the dispatch model says AITER runs untuned (heuristic) kernels at
    ctx = None                    # whose µs the tuned rows are, and how the user's AITER relates to that release
    if kind == "aiter" and getattr(caps, "aiter_version", None) is not None:
        ctx = _release_context(caps)
        if rows is not None:
            given = list(rows)
            shapes = {m: given for m in tokens}
        elif dispatch is not None and not hasattr(dispatch, "steps"):
            entries = list(dispatch)
            given = _rows_from_dispatch(entries, caps)
            shapes = {m: given for m in tokens}
            heuristic = {m for m in tokens for e in entries if _heuristic_entry(e, m)}
        else:
            plan = dispatch if dispatch is not None else _plan(layer, caps, padding, tokens)
            if plan is not None:
                geo = _key_geometry(layer, padding, plan.key)
                for m in tokens:
                    step = next((st for st in plan.steps if st.tokens[0] <= m <= st.tokens[1]), None)
                    q_a = getattr(step, "q_dtype_a", "") if step is not None else ""
                    found = list(_shape_rows(plan.key, caps, q_a)) if q_a else []
                    if q_a in _CSV_BYTES:
                        a = _CSV_BYTES[q_a]
                        geos[m] = replace(geo, a_bytes=a, compute={2.0: "bf16", 1.0: "fp8", 0.5: "fp4"}[a])
                    if step is not None and step.basis == "tuned" and step.row is not None \
                            and step.row not in found:
                        found.append(step.row)   # the act-wildcard or a smaller tier's row
                    if step is not None and step.basis != "tuned":
                        heuristic.add(m)
                    shapes[m] = found
    return shapes, geos, heuristic, ctx, geo


def _no_faster_than_the_whole_device(costs: tuple[Cost, ...], layer: Any, caps: Any, backend_family: str,
                                     padding: Any, tokens: tuple[int, ...], rows: Any) -> tuple[Cost, ...]:
    """A compute partition (``--target MI355X:CPX``) runs the same work on a share of the CUs and of the fabric, so
    its prediction is never below the whole device's (tuned rows at the full CU count included). Needed because the
    priors are fitted per (arch, CU count): a partition's count has none and falls back to the arch-wide prior,
    which can undercut the whole device's."""
    import dataclasses

    gfx, cu, product = getattr(caps, "gfx", None), getattr(caps, "compute_units", None), getattr(caps, "product", None)
    if not costs or not dataclasses.is_dataclass(caps) or not capdb.partition_of(gfx, product, cu):
        return costs
    full = next(p["compute_units"] for p in (capdb.arch_facts(gfx) or {})["products"] if p["name"] == product)
    whole = predict(layer, dataclasses.replace(caps, compute_units=full), backend_family=backend_family,
                    padding=padding, tokens=tokens, rows=rows)
    out = []
    for c, w in zip(costs, whole):
        if w.us > c.us:
            c = Cost(c.tokens, w.us, max(c.low, w.low), max(c.high, w.high), c.basis,
                     f"{c.detail}; raised to the whole {product}'s prediction ({full} CUs, {w.basis}): a partition is "
                     "never faster")
        out.append(c)
    return tuple(out) + costs[len(out):]


def padding_overhead(layer: Any, caps: Any, *, backend_family: str, padding: Any,
                     tokens: Iterable[int] | int = DEFAULT_TOKENS) -> tuple[tuple[int, float], ...]:
    """What a padding costs: ``((tokens, extra), ...)`` with ``extra`` = padded / unpadded − 1 (``0.29`` = 29%
    slower), both predicted on the roofline path (tuned rows exist for one of the two shapes at most, so mixing bases
    would compare a measurement with a model). For a what-if line such as "pad 384→512 costs +21% at 4096 tokens".
    """
    plain = predict(layer, caps, backend_family=backend_family, tokens=tokens, rows=())
    padded = predict(layer, caps, backend_family=backend_family, tokens=tokens, rows=(), padding=padding)
    return tuple((a.tokens, b.us / a.us - 1) for a, b in zip(plain, padded))


# -- totals and ranking ------------------------------------------------------------------------------------------

_WEAKEST = {"tuned": 0, "interpolated": 1, "plugin": 2, "roofline": 3}


def total(costs_per_layer: Iterable[Sequence[Cost]]) -> tuple[Cost, ...]:
    """The model's total MoE time per token count: sums of ``us``, ``low`` and ``high`` over the layers.

    Pass one cost tuple per MoE layer (a model with 57 identical MoE layers passes 57 tuples). Bounds add up
    (errors of identical layers are fully correlated, so the sum of bounds is the honest bound). The total at the
    decode batch size is the decode step's MoE time; at the prefill chunk size, a prefill chunk's. Its basis is the
    weakest basis among the layers; use ``to_dict(with_basis=False)`` for the contract's ``cost_total``.
    """
    sums: dict[int, list[float]] = {}
    basis: dict[int, str] = {}
    order: list[int] = []
    for costs in costs_per_layer:
        for c in costs:
            if c.tokens not in sums:
                sums[c.tokens] = [0.0, 0.0, 0.0]
                basis[c.tokens] = c.basis
                order.append(c.tokens)
            s = sums[c.tokens]
            s[0] += c.us
            s[1] += c.low
            s[2] += c.high
            if _WEAKEST[c.basis] > _WEAKEST[basis[c.tokens]]:
                basis[c.tokens] = c.basis
    return tuple(Cost(t, sums[t][0], sums[t][1], sums[t][2], basis[t], "sum over MoE layers") for t in order)


def _pairs(a: Sequence[Cost], b: Sequence[Cost]) -> list[tuple[Cost, Cost]]:
    bt = {c.tokens: c for c in b}
    return [(c, bt[c.tokens]) for c in a if c.tokens in bt]


def compare(a_costs: Sequence[Cost], b_costs: Sequence[Cost]) -> str:
    """``"faster"`` if a's bars lie wholly below b's at some common token count and above at none; ``"slower"``
    the other way round; else ``"tie"`` (overlapping bars, mixed outcomes or no common token count)."""
    faster = slower = False
    for a, b in _pairs(a_costs, b_costs):
        if a.high < b.low:
            faster = True
        elif a.low > b.high:
            slower = True
    if faster and not slower:
        return "faster"
    if slower and not faster:
        return "slower"
    return "tie"


def reason(a_name: str, a_costs: Sequence[Cost], b_name: str, b_costs: Sequence[Cost],
           tokens: int | None = None) -> str:
    """``"aiter-flydsl 41 µs (35–48) vs triton 118 µs (80–160) at 64 tokens"``: at ``tokens``, else at the
    token count where the bars are furthest apart (the first common one when none separate)."""
    pairs = _pairs(a_costs, b_costs)
    if not pairs:
        return f"{a_name} vs {b_name}: no common token count"
    if tokens is not None:
        chosen = [p for p in pairs if p[0].tokens == tokens] or pairs[:1]
        a, b = chosen[0]
    else:
        def gap(p: tuple[Cost, Cost]) -> float:
            x, y = p
            return max(math.log(y.low / x.high), math.log(x.low / y.high))
        a, b = max(pairs, key=gap)
    unit = "token" if a.tokens == 1 else "tokens"
    return f"{a_name} {format_cost(a)} vs {b_name} {format_cost(b)} at {a.tokens} {unit}"


def rank(candidates: Sequence[tuple[str, int, Sequence[Cost]]]) -> list[tuple[str, str | None]]:
    """Order correct backends by predicted time where the bars separate them; preference breaks ties.

    :param candidates: ``(name, preference, costs)`` per correct backend (``costs`` may be ``()``: not predicted).
    :returns: ``[(name, why), ...]`` best first. ``why`` is ``None`` for the winner; for every other backend it is
        the :func:`reason` text against the backend ranked just above it when their bars separate (cost decided),
        else ``None`` (preference decided, as before).

    Start from preference order (higher first, ties by name); a backend moves above its neighbour only when
    :func:`compare` says ``"faster"``, so a backend without a prediction never moves and never gets overtaken.
    """
    order = sorted(candidates, key=lambda c: (-c[1], c[0]))
    for _ in range(len(order) ** 2):
        moved = False
        for i in range(1, len(order)):
            if order[i][2] and order[i - 1][2] and compare(order[i][2], order[i - 1][2]) == "faster":
                order[i - 1], order[i] = order[i], order[i - 1]
                moved = True
        if not moved:
            break
    out: list[tuple[str, str | None]] = []
    for i, (name, _pref, costs) in enumerate(order):
        why = None
        if i:
            above = order[i - 1]
            if costs and above[2] and compare(above[2], costs) == "faster":
                why = reason(above[0], above[2], name, costs)
        out.append((name, why))
    return out


# -- tuning work-list ----------------------------------------------------------------------------------------------

#: AITER's untuned-CSV columns (``aiter/configs/untuned_fmoe.csv``), the input of its fused-MoE tuner
#: (``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py``).
UNTUNED_COLUMNS = ("token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
                   "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")


def tuning_worklist(entries: Iterable[tuple[Any, Sequence[Cost], int]]) -> tuple[dict[str, Any], ...]:
    """The shapes AITER runs on heuristics, ranked by the predicted time spent in them — what to tune first.

    :param entries: ``(plan, costs, layers)`` per layer group: its :class:`moedispatch.aiter.dispatch.DispatchPlan`,
        the AITER backend's predicted costs at the plan's token counts, and how many layers share it.
    :returns: one row per distinct lookup key and token bucket that no tuned row covers, with the
        :data:`UNTUNED_COLUMNS` (``token`` is AITER's bucket, so a tuned row lands where the lookup looks) plus
        ``gfx``, ``cu_num``, ``us`` (predicted per call), ``layers`` and ``weight`` = us × layers; highest weight
        first. Tuning cannot make a call faster than its roofline, so the time spent there is the most tuning
        could save, and the order is the order of expected saving when heuristic kernels lose a similar share.
    """
    merged: dict[tuple, dict[str, Any]] = {}
    for plan, costs, layers in entries:
        by_tokens = {c.tokens: c for c in costs}
        key = plan.key
        for step in plan.steps:
            if step.basis == "tuned":
                continue
            for m in plan.tokens:
                if not step.tokens[0] <= m <= step.tokens[1] or m not in by_tokens:
                    continue
                bucket = aiter_dispatch.get_padded_M(m, plan.dispatch_model)
                row = {"token": bucket, "model_dim": key.model_dim, "inter_dim": key.inter_dim, "expert": key.expert,
                       "topk": key.topk, "act_type": key.act_type, "dtype": key.dtype, "q_dtype_a": step.q_dtype_a,
                       "q_dtype_w": key.q_dtype_w, "q_type": key.q_type, "use_g1u1": key.use_g1u1,
                       "doweight_stage1": key.doweight_stage1}
                ident = (key.gfx, key.cu_num) + tuple(row[c] for c in UNTUNED_COLUMNS)
                us = by_tokens[m].us
                entry = merged.setdefault(ident, {**row, "gfx": key.gfx, "cu_num": key.cu_num, "us": 0.0,
                                                  "layers": 0, "weight": 0.0})
                entry["us"] = max(entry["us"], us)
                entry["layers"] += layers
                entry["weight"] += us * layers
    return tuple(sorted(merged.values(), key=lambda r: (-r["weight"], r["token"])))


def untuned_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows of :func:`tuning_worklist` in AITER's untuned-CSV format (header included), for its tuner."""
    lines = [",".join(UNTUNED_COLUMNS)]
    seen = set()
    for r in rows:
        line = ",".join(str(r[c]) for c in UNTUNED_COLUMNS)
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return "\n".join(lines) + "\n"
