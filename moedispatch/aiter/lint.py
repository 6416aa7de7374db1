"""``moedispatch aiter-configs``: lint AITER's tuned fused-MoE tables before anyone trusts them.

Checks (each finding names the rows as ``file:line``):

* ``copied-timing`` — one tuned shape reports the same ``us`` (to 4 decimals) for two or more token buckets: the
  timing was copied, not measured.
* ``faster-than-hbm`` — ``us`` below the time to read, at the GPU's peak HBM bandwidth, the weights of the experts
  the tuner's (uniform, ``torch.randn``) routing activates: ``E·(1-(1-k/E)^M)`` experts × expert bytes (fp4 at ½ byte
  plus 1/32 byte of E8M0 scale per element). Physically impossible; the row cannot be used as a measurement.
* ``faster-than-compute`` — ``us`` below the time for the row's useful FLOPs (``2·M·k·D·(n1+I)``) at the most
  generous datasheet peak for its operand dtypes. A row whose ``us`` was copied from a smaller bucket of its shape is
  reported once, as ``copied-timing``, not again here or as ``faster-than-hbm``.
* ``shared-cu-num`` — rows keyed on a ``cu_num`` that two products share (304: MI300X and MI325X; 256: MI350X and
  MI355X): AITER applies them to both, whichever one they were tuned on.
* ``shadowed`` — rows AITER can never pick: a repeated lookup key (AITER keeps the first), an act-type duplicate
  behind the act-wildcard match (HEAD), a token no ``get_padded_M`` bucket produces, ``flydsl_fallback`` rows (HEAD
  drops them), rows the merge de-duplication removes, and — with ``AITER_CONFIG_FMOE`` — every default row the
  override set replaces.
* ``malformed`` — lines AITER's pandas reader rejects or reads shifted (named by file and line).

Bandwidths come from capability_db/gpus.toml when a product carries one (``hbm_tb_s``); otherwise from the table
below, with the datasheet each figure comes from.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from moedispatch._util.suggest import did_you_mean
from moedispatch.data import aiter_configs as _cfg
from moedispatch.data.aiter_configs import ConfigSet, TunedRow
from moedispatch.aiter.rules import get_padded_M, lookup_rules
from moedispatch.core.workload import parse_env_args
from moedispatch.core.errors import UsageError
from moedispatch.data import capdb

__all__ = ["Finding", "LintReport", "lint", "render", "run_cli", "HBM_TB_S", "PEAK_TFLOPS", "physical_floor_us",
           "compute_floor_us"]

#: Peak HBM bandwidth (TB/s) per product, from AMD's datasheets, used when gpus.toml has none.
HBM_TB_S: dict[str, tuple[float, str, str]] = {
    "MI300X": (5.3, "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html", "confirmed"),
    "MI325X": (6.0, "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html", "unconfirmed"),
    "MI350X": (8.0, "https://github.com/ROCm/rocm-docs/blob/0276a76499b5ae1bd16ffc94030d0756a6a8409e/docs/reference/"
                    "gpu-arch/mi350.rst", "confirmed"),
    "MI355X": (8.0, "https://github.com/ROCm/rocm-docs/blob/0276a76499b5ae1bd16ffc94030d0756a6a8409e/docs/reference/"
                    "gpu-arch/mi350.rst", "confirmed"),
    "MI308X": (5.3, "no public datasheet; assumed equal to MI300X (same HBM3 stacks)", "unconfirmed"),
}
#: Dense peak matrix throughput (TFLOP/s: bf16, fp8, fp4) from the same datasheets; MI308X has none public.
PEAK_TFLOPS: dict[str, tuple[float, float, float | None]] = {
    "MI300X": (1307.4, 2614.9, None), "MI325X": (1307.4, 2614.9, None),
    "MI350X": (2300.0, 4600.0, 9200.0), "MI355X": (2516.6, 5033.2, 10066.3),
}
_BW_KEYS = ("hbm_tb_s", "hbm_bandwidth_tb_s", "memory_bandwidth_tb_s", "peak_hbm_tb_s", "bandwidth_tb_s")

#: Bytes per logical element (aiter/utility/base_tuner.py dtype2bpe_dict counts fp4x2 as 1 byte per element; the
#: physical size is ½ byte, which is what a lower bound must use).
_BPE = {"torch.bfloat16": 2.0, "torch.float16": 2.0, "torch.float8_e4m3fn": 1.0, "torch.float8_e4m3fnuz": 1.0,
        "torch.int8": 1.0, "torch.float4_e2m1fn_x2": 0.5, "torch.int4": 0.5, "torch.uint32": 0.5}


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # error | warning | info
    message: str
    rows: tuple[str, ...] = ()
    source: str | None = None
    confidence: str = "confirmed"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "message": self.message, "rows": list(self.rows),
                "source": self.source, "confidence": self.confidence}


@dataclass(frozen=True)
class LintReport:
    configs: ConfigSet
    findings: tuple[Finding, ...]
    counts: tuple[tuple[str, int], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "moedispatch.aiter_configs/1", "configs": self.configs.to_dict(),
                "summary": dict(self.counts), "findings": [f.to_dict() for f in self.findings]}


# -- bandwidth ----------------------------------------------------------------------------------------------------

def _peaks() -> dict[str, dict[str, Any]]:
    """capability_db/gpus.toml ``[peak.<product>]`` (hbm_tbps, *_tflops, source, confidence) when present."""
    peak = capdb.gpus().get("peak", {})
    return peak if isinstance(peak, dict) else {}


def _products_by_cu() -> dict[tuple[str, int], list[tuple[str, float | None, str, str]]]:
    """(gfx, cu_num) -> [(product, TB/s or None, source, confidence)]: gpus.toml ``[peak.*]`` first (the cost
    model's table), then a product-level bandwidth key, then :data:`HBM_TB_S`."""
    peaks = _peaks()
    out: dict[tuple[str, int], list[tuple[str, float | None, str, str]]] = defaultdict(list)
    for gfx, entry in capdb.gpus()["arch"].items():
        for p in entry["products"]:
            pk = peaks.get(p["name"], {})
            bw = pk.get("hbm_tbps") if isinstance(pk.get("hbm_tbps"), (int, float)) else None
            src = str(pk.get("source", "capability_db/gpus.toml [peak]"))
            conf = str(pk.get("confidence", "confirmed"))
            if bw is None:
                bw = next((float(p[k]) for k in _BW_KEYS if isinstance(p.get(k), (int, float))), None)
                src, conf = "capability_db/gpus.toml", "confirmed"
            if bw is None and p["name"] in HBM_TB_S:
                bw, src, conf = HBM_TB_S[p["name"]]
            out[(gfx, p["compute_units"])].append((p["name"], float(bw) if bw else None, src, conf))
    return out


def _tflops(product: str) -> tuple[tuple[float | None, float | None, float | None], str, str] | None:
    """(bf16, fp8, fp4) TFLOP/s with source/confidence: gpus.toml ``[peak.*]``, else :data:`PEAK_TFLOPS`."""
    pk = _peaks().get(product)
    if pk and isinstance(pk.get("bf16_tflops"), (int, float)):
        vals = tuple(float(pk[k]) if isinstance(pk.get(k), (int, float)) else None
                     for k in ("bf16_tflops", "fp8_tflops", "fp4_tflops"))
        return vals, str(pk.get("source", "capability_db/gpus.toml [peak]")), str(pk.get("confidence", "confirmed"))
    if product in PEAK_TFLOPS:
        src = HBM_TB_S[product]  # every datasheet product has its bandwidth entry
        return PEAK_TFLOPS[product], src[1], src[2]
    return None


def physical_floor_us(row: TunedRow, tb_s: float) -> float | None:
    """Microseconds to stream the activated experts' weights at ``tb_s``; None when the dtype is unknown."""
    bpe = _BPE.get(row.q_dtype_w)
    if bpe is None or tb_s <= 0:
        return None
    n1 = 2 * row.inter_dim if row.use_g1u1 else row.inter_dim
    elems = row.model_dim * (n1 + row.inter_dim)
    scale = 1.0 / 32 if row.q_type == "QuantType.per_1x32" else 0.0
    e, k, m = row.expert, min(row.topk, row.expert), max(row.token, 1)
    active = e * (1.0 - (1.0 - k / e) ** m) if e > 0 else 0.0
    return active * elems * (bpe + scale) / (tb_s * 1e12) * 1e6


# -- checks -------------------------------------------------------------------------------------------------------

def _copied(cs: ConfigSet) -> list[Finding]:
    groups: dict[tuple, list[TunedRow]] = defaultdict(list)
    for r in cs.rows:
        if r.us is not None and r.us > 0:
            groups[(r.file, r.shape(), round(r.us, 4))].append(r)
    out = []
    for (_file, _shape, us), rows in groups.items():
        tokens = sorted({r.token for r in rows})
        if len(tokens) >= 2:
            r0 = rows[0]
            out.append(Finding("copied-timing", "warning",
                               f"{r0.model_dim}x{r0.inter_dim} E{r0.expert} top-{r0.topk} {r0.q_type.split('.')[-1]} "
                               f"cu_num {r0.cu_num}: us={us:g} for token buckets {', '.join(map(str, tokens))} "
                               "(copied, not measured)", tuple(r.where for r in rows)))
    return out


def _copies(cs: ConfigSet) -> set[tuple[str, int]]:
    """The rows (``where``) whose ``us`` repeats a smaller token bucket of the same shape: the copied timing is said
    once, under ``copied-timing``, not again as faster than HBM or compute at the larger buckets it was pasted into."""
    groups: dict[tuple, list[TunedRow]] = defaultdict(list)
    for r in cs.rows:
        if r.us is not None and r.us > 0:
            groups[(r.file, r.shape(), round(r.us, 4))].append(r)
    out: set[Any] = set()
    for rows in groups.values():
        if len({r.token for r in rows}) >= 2:
            first = min(r.token for r in rows)
            out.update(r.where for r in rows if r.token != first)
    return out


def _impossible(cs: ConfigSet) -> list[Finding]:
    prods = _products_by_cu()
    copies = _copies(cs)
    out = []
    for r in cs.rows:
        if r.us is None or r.us <= 0 or r.gfx is None or r.where in copies:
            continue
        cands = [p for p in prods.get((r.gfx, r.cu_num), []) if p[1]]
        if not cands:
            continue
        name, bw, src, conf = max(cands, key=lambda p: p[1])  # the fastest product sharing the cu_num
        floor = physical_floor_us(r, bw)
        if floor is not None and r.us < floor:
            out.append(Finding("faster-than-hbm", "error",
                               f"us={r.us:g} at token {r.token} is below {floor:.1f} us, the time to read the "
                               f"activated experts' weights at {bw:g} TB/s ({name}, the fastest product with cu_num "
                               f"{r.cu_num})", (r.where,), src, conf))
    return out


def compute_floor_us(row: TunedRow, product: str) -> float | None:
    """Microseconds for the row's useful FLOPs (2·M·k·D·(n1+I)) at the product's most generous peak for its
    operand dtypes (a lower bound: real kernels also read weights and pad tiles). None without peak figures."""
    found = _tflops(product)
    if found is None:
        return None
    bf16, fp8, fp4 = found[0]
    dts = {row.q_dtype_a, row.q_dtype_w}
    if "torch.float4_e2m1fn_x2" in dts and fp4:
        tf = fp4
    elif dts & {"torch.float8_e4m3fn", "torch.float8_e4m3fnuz", "torch.int8", "torch.float4_e2m1fn_x2",
                "torch.int4", "torch.uint32"}:
        tf = fp8
    else:
        tf = bf16
    if not tf:
        return None
    n1 = 2 * row.inter_dim if row.use_g1u1 else row.inter_dim
    flops = 2.0 * row.token * row.topk * row.model_dim * (n1 + row.inter_dim)
    return flops / (tf * 1e12) * 1e6


def _compute(cs: ConfigSet) -> list[Finding]:
    prods = _products_by_cu()
    copies = _copies(cs)
    out = []
    for r in cs.rows:
        if r.us is None or r.us <= 0 or r.gfx is None or r.where in copies:
            continue
        floors = [(compute_floor_us(r, p[0]), p[0]) for p in prods.get((r.gfx, r.cu_num), [])]
        floors = [(f, n) for f, n in floors if f is not None]
        if not floors:
            continue
        floor, name = min(floors)  # the fastest product sharing the cu_num
        if r.us < floor:
            _vals, src, conf = _tflops(name) or ((None, None, None), "", "unconfirmed")
            out.append(Finding("faster-than-compute", "error",
                               f"us={r.us:g} at token {r.token} is below {floor:.1f} us, the time for its useful "
                               f"FLOPs at {name}'s peak for these dtypes", (r.where,), src, conf))
    return out


def _shared_cu(cs: ConfigSet) -> list[Finding]:
    prods = _products_by_cu()
    rows_by: dict[tuple, list[TunedRow]] = defaultdict(list)
    for r in cs.rows:
        if r.gfx is not None:
            rows_by[(r.gfx, r.cu_num)].append(r)
    out = []
    for (gfx, cu), rows in sorted(rows_by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        names = prods.get((gfx, cu), [])
        if len(names) >= 2:
            desc = " and ".join(f"{n} ({bw:g} TB/s)" if bw else n for n, bw, _s, _c in names)
            out.append(Finding("shared-cu-num", "info",
                               f"{len(rows)} rows keyed {gfx} cu_num={cu} apply to {desc}: AITER cannot tell them "
                               "apart, so timings tuned on one are used on the other",
                               (rows[0].where,), "https://github.com/ROCm/aiter/pull/5500", "confirmed"))
    return out


def _shadowed(cs: ConfigSet, env: Mapping[str, str], base: ConfigSet | None = None) -> list[Finding]:
    out: list[Finding] = []
    model = cs.dispatch
    valid = {get_padded_M(m, model) for m in (1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 4097, 8193,
                                               16385, 32768, 131072)}
    valid |= {1 << i for i in range(15)} if model == "head" else {16, 32, 64, 128, 256, 512, 1024}
    unreachable = [r for r in cs.rows if r.token not in valid]
    if unreachable:
        out.append(Finding("shadowed", "warning",
                           f"{len(unreachable)} rows have a token no get_padded_M bucket produces "
                           f"({', '.join(sorted({str(r.token) for r in unreachable}, key=int))}): never looked up",
                           tuple(r.where for r in unreachable[:20]), _cfg.SOURCE_LOOKUP))
    # The release's own lookup (its Rules, read at each tag): whether flydsl_fallback rows are dropped and whether the
    # exact dict can match a CSV act_type string (v0.1.19 and v0.1.13.x and older key on str(activation)).
    rules = lookup_rules("legacy" if model != "head" else cs.version if cs.version else "head")
    drops_tagged = model == "head" and not rules.flydsl_fallback_rows   # v0.1.11-v0.1.17 read them without flydsl
    if drops_tagged:
        tagged = [r for r in cs.rows if r.tag == "flydsl_fallback"]
        if tagged:
            out.append(Finding("shadowed", "info",
                               f"{len(tagged)} rows tagged flydsl_fallback are dropped before the lookup at "
                               f"{rules.name} (get_cfg_2stages): never used, even without flydsl",
                               tuple(r.where for r in tagged[:20]), _cfg.SOURCE_LOOKUP))
    seen: dict[tuple, TunedRow] = {}
    seen_act: dict[tuple, TunedRow] = {}
    dups, act_dups = [], []
    for r in cs.rows:
        if model == "head" and r.tag == "flydsl_fallback":
            continue   # never in the lookup dicts (dropped, or a separate table read only without flydsl)
        k = r.key(with_gfx=model == "head")
        if k in seen:
            dups.append((r, seen[k]))
        else:
            seen[k] = r
        ka = r.key(with_gfx=model == "head", act="*")
        if not rules.act_exact and rules.act_wildcard and ka in seen_act and seen_act[ka].act_type != r.act_type:
            act_dups.append((r, seen_act[ka]))
        seen_act.setdefault(ka, r)
    if dups:
        out.append(Finding("shadowed", "warning",
                           f"{len(dups)} rows repeat an earlier lookup key; AITER keeps the first (e.g. "
                           f"{dups[0][0].where} behind {dups[0][1].where})", tuple(r.where for r, _ in dups[:20]),
                           _cfg.SOURCE_LOOKUP))
    if act_dups:
        out.append(Finding("shadowed", "warning",
                           f"{len(act_dups)} rows differ from an earlier row only in act_type; AITER {rules.name}'s "
                           f"exact lookup keys on the ActivationType enum and cannot match the CSV's strings, so the "
                           f"act-wildcard match returns the earlier row (e.g. {act_dups[0][0].where} "
                           f"({act_dups[0][0].act_type.split('.')[-1]}) behind {act_dups[0][1].where} "
                           f"({act_dups[0][1].act_type.split('.')[-1]}))",
                           tuple(r.where for r, _ in act_dups[:20]), _cfg.SOURCE_LOOKUP, "derived"))
    if cs.merge_error:   # "AITER raises …": the first fused-MoE call fails (an error), else rows silently dropped
        out.append(Finding("shadowed", "error" if cs.merge_error.startswith("AITER raises") else "warning",
                           cs.merge_error, (), _cfg.SOURCE_MERGE))
    override = (env.get("AITER_CONFIG_FMOE") or "").strip()
    if override and cs.origin == "env":
        base = base if base is not None else _cfg.load_config_set(None, version=cs.version)
        mine = {r.key(with_gfx=False) for r in cs.rows}
        lost = [r for r in base.rows if r.key(with_gfx=False) not in mine]
        replaced = [r for r in base.rows if r.key(with_gfx=False) in mine]
        out.append(Finding("shadowed", "warning",
                           f"AITER_CONFIG_FMOE replaces the default set ({base.label}): {len(lost)} of its "
                           f"{len(base.rows)} rows are no longer looked up, {len(replaced)} are overridden by rows of "
                           "the override", tuple(r.where for r in (replaced or lost)[:20]),
                           "https://github.com/sgl-project/sglang/pull/37072"))
    return out


#: AITER's enums as its key spells them (ROCm/aiter@e4048607:csrc/include/aiter_enum.h, the single source of
#: truth aiter/ops/enum.py parses): a row naming another member is never matched by a real layer's key.
_ENUMS = {
    "act_type": tuple(f"ActivationType.{m}" for m in ("No", "Silu", "Gelu", "Swiglu", "Situv2")),
    "q_type": tuple(f"QuantType.{m}" for m in ("No", "per_Tensor", "per_Token", "per_1x32", "per_1x128",
                                                "per_128x128", "per_256x128", "per_1024x128")),
}
_ENUM_SOURCE = ("https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/csrc/include/"
                "aiter_enum.h")


def _unmatchable(cs: ConfigSet) -> list[Finding]:
    """Rows no layer's lookup key can name (an enum member AITER does not have, more experts per token than experts)
    and timings that are no time (``us`` missing, zero or negative: the tuner writes a positive µs)."""
    out: list[Finding] = []
    for column, members in _ENUMS.items():
        bad = [r for r in cs.rows if getattr(r, column) not in members]
        if bad:
            value = getattr(bad[0], column)
            out.append(Finding("unmatchable", "warning",
                               f"{len(bad)} rows name {column} {value!r}{did_you_mean(value, members)}, not a member "
                               "of AITER's enum: no layer's lookup key matches them", tuple(r.where for r in bad[:20]),
                               _ENUM_SOURCE))
    wide = [r for r in cs.rows if r.topk > r.expert]
    if wide:
        out.append(Finding("unmatchable", "warning",
                           f"{len(wide)} rows route each token to more experts than they have (e.g. topk {wide[0].topk}"
                           f" > expert {wide[0].expert}): no layer has this shape", tuple(r.where for r in wide[:20])))
    untimed = [r for r in cs.rows if not r.tag and (r.us is None or not r.us > 0)]
    if untimed:
        out.append(Finding("unmatchable", "info",
                           f"{len(untimed)} rows carry no timing (us empty, zero or negative; e.g. us={untimed[0].us!r}"
                           "): the lookup still returns their kernels (rows pinned by hand carry 0), but the cost "
                           "model does not use their µs", tuple(r.where for r in untimed[:20])))
    return out


def _malformed(cs: ConfigSet) -> list[Finding]:
    out = [Finding("malformed", "error", w) for w in cs.warnings]  # each one "file[:line]: what" (aiter_configs)
    shifted = [r for r in cs.rows if r.defects]
    if shifted:
        out.append(Finding("malformed", "warning",
                           f"{len(shifted)} rows have missing or shifted trailing columns (pandas reads them with "
                           f"NaN/shifted values), e.g. {shifted[0].where}: {'; '.join(shifted[0].defects)}",
                           tuple(r.where for r in shifted[:20])))
    return out


def lint(cs: ConfigSet, env: Mapping[str, str] | None = None, base: ConfigSet | None = None) -> LintReport:
    """Run every check on ``cs`` (``env``: the AITER env, for the override check; ``base``: the set an
    AITER_CONFIG_FMOE override replaces — default the installed AITER's, else the release's)."""
    env = dict(env or {})
    findings = (_malformed(cs) + _unmatchable(cs) + _copied(cs) + _impossible(cs) + _compute(cs) + _shared_cu(cs)
                + _shadowed(cs, env, base))
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order.get(f.severity, 3), f.check))
    rows_copied = sum(len(f.rows) for f in findings if f.check == "copied-timing")
    summary = [("rows", len(cs.rows)), ("files", len(cs.files)), ("rows_copied_timing", rows_copied),
               ("rows_faster_than_hbm", sum(1 for f in findings if f.check == "faster-than-hbm")),
               ("rows_faster_than_compute", sum(1 for f in findings if f.check == "faster-than-compute")),
               ("findings", len(findings))]
    return LintReport(cs, tuple(findings), tuple(summary))


def render(report: LintReport, fmt: str = "table") -> str:
    import json

    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2, sort_keys=False)
    cs = report.configs
    lines = [f"tuned set  {cs.label}", f"dispatch   {cs.dispatch} model; {len(cs.rows)} rows in {len(cs.files)} files"]
    lines += [f"note       {n}" for n in cs.notes]
    lines.append("summary    " + ", ".join(f"{k} {v}" for k, v in report.counts))
    by_check: dict[str, list[Finding]] = defaultdict(list)
    for f in report.findings:
        by_check[f.check].append(f)
    for check, items in by_check.items():
        lines.append("")
        lines.append(f"{check} ({len(items)})")
        for f in items[:12]:
            where = f"  [{', '.join(f.rows[:3])}{', …' if len(f.rows) > 3 else ''}]" if f.rows else ""
            conf = "" if f.confidence == "confirmed" else f" ({f.confidence})"
            lines.append(f"  {f.severity:<7} {f.message}{conf}{where}")
        if len(items) > 12:
            lines.append(f"  … {len(items) - 12} more (use --format json)")
    return "\n".join(lines)


def _check_pep440(version: str) -> None:
    """``--aiter-version`` that is no release tag must be a PEP 440 version (UsageError otherwise)."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        tags = [r.tag for r in _cfg.releases()]
        raise UsageError(f"--aiter-version {version!r} is not a PEP 440 version, 'installed' or a release of "
                         f"moedispatch's AITER index ({tags[0]} … {tags[-1]})") from None


def run_cli(args: argparse.Namespace, emit: Callable[[str], None]) -> int:
    """``moedispatch aiter-configs``: bad input raises UsageError (the CLI prints one line, exit 2)."""
    env = parse_env_args(getattr(args, "aiter_env", None) or [])
    version = getattr(args, "aiter_version", None)
    directory = getattr(args, "configs", None)
    base = None
    if directory:
        import os

        if not os.path.isdir(directory):
            raise UsageError(f"--configs {directory!r} is not a directory")
        if version not in (None, "installed") and version not in {r.tag for r in _cfg.releases()}:
            _check_pep440(version)  # junk is bad input here too, never a silent head lookup model
        if version in (None, "installed"):  # the AITER that reads the folder decides the lookup model, as for
            version = _cfg.installed_aiter()[0]  # AITER_CONFIG_FMOE (default: the installed AITER, see --help)
            if version is None and getattr(args, "aiter_version", None) == "installed":
                raise UsageError("--aiter-version installed: no AITER (amd-aiter) is installed in this Python")
        cs = _cfg.load_config_set(directory, env=env, version=version)
        if getattr(args, "aiter_version", None) in (None, "installed"):   # said, never a silent default
            how = (f"the installed AITER {version}'s lookup" if version else
                   "the newest lookup (no AITER is installed in this Python)")
            cs = dataclasses.replace(cs, notes=cs.notes + (f"read with {how}: {cs.dispatch} model; --aiter-version "
                                                           "VERSION reads the folder as that release does",))
        if cs.origin == "env":   # AITER_CONFIG_FMOE replaces the set: the folder is what it replaces, not read
            base = _cfg.load_config_set(directory, version=version)
            cs = dataclasses.replace(cs, notes=cs.notes + (f"--configs {directory} is not read as the tuned set: "
                                                           "AITER_CONFIG_FMOE replaces it (compared below)",))
    elif version in (None, "installed"):
        cs = _cfg.load_config_set(version, env=env)
    elif version == "bundled" or version in {r.tag for r in _cfg.releases()}:
        cs = _cfg.load_config_set(version, env=env)
    else:
        _check_pep440(version)
        cs = _cfg.load_config_set(None, env=env, version=version)
    findings = lint(cs, env, base)
    emit(render(findings, getattr(args, "format", "table")))
    # --strict: exit 3 on an error finding (as lint), so a CI step over a tuned set can gate on it; without it the
    # report is the output (AITER's own shipped sets carry error-severity timing findings).
    strict = getattr(args, "strict", False)
    return 3 if strict and any(f.severity == "error" for f in findings.findings) else 0
