"""Probe the machine: GPUs, AITER (from its files), package versions — every fact with its provenance.

Public API::

    probe(refresh=False, *, allow_torch=False, try_import=False, timeout=5.0) -> ProbeReport
    capabilities_from_probe(report, aiter_version=None) -> Capabilities | None
    render_probe(report, fmt="table" | "json") -> str

The probe never raises and never hangs: each step is isolated (stdout/stderr silenced at the fd level, any exception
but KeyboardInterrupt caught, a time limit on each step) and its failure becomes a recorded reason. Nothing heavy is
imported at module import time; torch and ``import aiter`` only ever run in subprocesses.

GPU discovery order (ours): amdsmi → torch (``allow_torch``) → rocminfo → rocm_agent_enumerator; the
first source that finds GPUs is used, then HIP/ROCR_VISIBLE_DEVICES filter by index and MOEDISPATCH_TARGET (a gfx or
product name) overrides the target.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from moedispatch._util.caches import register
from moedispatch.data import capdb
from moedispatch.data.aiter_install import dist_version
from moedispatch.probe.aiter import AiterInfo, inspect_aiter
from moedispatch.probe.gpu import (
    RawGpu,
    SourceFailed,
    apply_visible,
    guess_product,
    normalize,
    probe_amdsmi,
    probe_enumerator,
    probe_rocminfo,
    probe_torch,
)
from moedispatch.probe.util import ProbeTimeout, describe
from moedispatch.core.capabilities import Capabilities, GpuInfo
from moedispatch.core.errors import TargetError

__all__ = [
    "SCHEMA",
    "TARGET_ENV",
    "AiterInfo",
    "GpuDetail",
    "ProbeReport",
    "SourceResult",
    "capabilities_from_probe",
    "probe",
    "render_probe",
    "report_to_dict",
]

SCHEMA = "moedispatch.probe/1"
TARGET_ENV = "MOEDISPATCH_TARGET"
# Env variables that change a probe's answer (part of the cache key). ROCm GPU isolation:
# https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html
_ENV_KEYS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", TARGET_ENV, "PATH", "ROCM_PATH",
             "CU_NUM", "AITER_CONFIG_FMOE")
# Versions read from installed metadata only (importlib.metadata), never by importing.
_PACKAGES = ("amd-aiter", "flydsl", "triton", "torch", "amdsmi")


@dataclass(frozen=True)
class SourceResult:
    """One probe step: ``ok`` when it gave an answer, ``detail`` what it found or why not."""

    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class GpuDetail:
    """What :class:`GpuInfo` has no field for: raw target id, PCI id, market name, derived partition mode, and the
    provenance (or reason unknown) of every field."""

    index: int
    gfx_raw: str
    market_name: str | None
    device_id: str | None
    partition: str | None
    provenance: tuple[tuple[str, str], ...]
    unknown: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ProbeReport:
    gpus: tuple[GpuInfo, ...]
    gpu_details: tuple[GpuDetail, ...]
    sources: tuple[SourceResult, ...]
    aiter: AiterInfo | None
    packages: tuple[tuple[str, str], ...]  # installed only; "torch.version.hip" when torch was allowed and ROCm
    missing_packages: tuple[tuple[str, str], ...]  # (name, reason)
    mixed_arch: bool
    target_override: str | None
    notes: tuple[str, ...]

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted({g.gfx for g in self.gpus}))

    def source(self, name: str) -> SourceResult | None:
        return next((s for s in self.sources if s.name == name), None)


# -- GPU discovery ----------------------------------------------------------------------------------------------

def _discover(allow_torch: bool, timeout: float) -> tuple[list[RawGpu], list[SourceResult], list[str], str | None]:
    """Find the GPUs (first source that answers), apply the env filters and return (gpus, sources, notes, hip)."""
    sources: list[SourceResult] = []
    chosen, hip = _gpu_sources(allow_torch, timeout, sources)
    env_notes: list[str] = []
    chosen, hip_var = _apply_visible_env(chosen, env_notes)
    _note_unapplied_env(chosen, hip_var, env_notes)
    env_ok = _note_target_env(env_notes)
    sources.append(SourceResult("env", env_ok, "; ".join(env_notes) or "no GPU-selection variables set"))
    return chosen, sources, _aiter_env_notes(), hip


def _step(name: str, fn: Any, sources: list[SourceResult], chosen: list[RawGpu]) -> list[RawGpu]:
    """Run one GPU source in isolation, record its result in ``sources``; its GPUs, or [] when it failed."""
    try:
        gpus, detail = fn()
    except SourceFailed as exc:
        sources.append(SourceResult(name, False, str(exc)))
    except ProbeTimeout as exc:
        sources.append(SourceResult(name, False, f"timed out: {exc}"))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a probe step must never take the caller down
        sources.append(SourceResult(name, False, f"failed: {describe(exc)}"))
    else:
        if chosen:
            detail += f" (not used: {chosen[0].source} answered first)"
        sources.append(SourceResult(name, True, detail))
        return list(gpus)
    return []


def _torch_source(timeout: float, sources: list[SourceResult], chosen: list[RawGpu]) -> tuple[list[RawGpu], str | None]:
    """Ask torch (a subprocess with a longer limit) for GPUs; its GPUs and ``torch.version.hip``."""
    hip: str | None = None

    def torch_step() -> tuple[list[RawGpu], str]:
        nonlocal hip
        gpus, detail, hip = probe_torch(max(timeout * 6, 30.0))
        if not gpus:
            raise SourceFailed(detail)
        return gpus, detail

    return _step("torch", torch_step, sources, chosen), hip


def _gpu_sources(allow_torch: bool, timeout: float, sources: list[SourceResult]) -> tuple[list[RawGpu], str | None]:
    """Ask each GPU source in order (amdsmi, torch, rocminfo, enumerator); the first that finds GPUs is chosen."""
    hip: str | None = None
    chosen = _step("amdsmi", lambda: probe_amdsmi(timeout), sources, [])
    if allow_torch:
        # Runs even when amdsmi answered: torch.version.hip is worth recording. A subprocess; importing torch takes
        # seconds, so it gets a longer limit.
        found, hip = _torch_source(timeout, sources, chosen)
        chosen = chosen or found
    else:
        sources.append(SourceResult("torch", False, "not run: allow_torch=False (it would initialize HIP)"))
    for name, fn in (("rocminfo", probe_rocminfo), ("rocm_agent_enumerator", probe_enumerator)):
        if chosen:
            sources.append(SourceResult(name, False, f"not run: {chosen[0].source} already found GPUs"))
        else:
            chosen = _step(name, lambda fn=fn: fn(timeout), sources, chosen)
    return chosen, hip


def _apply_visible_env(chosen: list[RawGpu], env_notes: list[str]) -> tuple[list[RawGpu], str]:
    """Filter the GPUs by ROCR/HIP_VISIBLE_DEVICES where the source has not; the GPUs and the HIP variable used."""
    # Env filters. amdsmi sees physical devices regardless of the variables; ROCr-level tools (rocminfo,
    # enumerator) are already ROCR-filtered; torch is filtered by both (unconfirmed; see the gpu-isolation page).
    # HIP indices are relative to what ROCr exposes.
    if chosen and chosen[0].source == "probe:amdsmi":
        chosen = apply_visible(chosen, "ROCR_VISIBLE_DEVICES", env_notes)
    hip_var = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in os.environ else "CUDA_VISIBLE_DEVICES"
    if chosen and chosen[0].source != "probe:torch":
        chosen = apply_visible(chosen, hip_var, env_notes)
    return chosen, hip_var


def _note_unapplied_env(chosen: list[RawGpu], hip_var: str, env_notes: list[str]) -> None:
    """Name each set GPU-selection variable that was not applied, and why."""
    # Every GPU-selection variable that is set is named, applied or not (a probe that finds no GPU still says what
    # would have filtered it).
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is None or any(note.startswith(f"{var}=") for note in env_notes):
            continue
        if not chosen:
            why = "no GPU found to filter"
        elif var == "CUDA_VISIBLE_DEVICES" and hip_var == "HIP_VISIBLE_DEVICES":
            why = "HIP_VISIBLE_DEVICES is set and takes precedence"
        else:
            why = f"{chosen[0].source.removeprefix('probe:')} already applies it"
        env_notes.append(f"{var}={value} is set (not applied here: {why})")


def _note_target_env(env_notes: list[str]) -> bool:
    """Note the MOEDISPATCH_TARGET override, if set; False when it names no known target."""
    target = os.environ.get(TARGET_ENV)
    if not target:
        return True
    try:
        gfx, product, _ = capdb.resolve_target(target)
        env_notes.append(f"{TARGET_ENV}={target} overrides the target ({gfx}, {product})")
    except Exception as exc:  # noqa: BLE001 - TargetError; capabilities_from_probe raises it for the caller
        env_notes.append(f"{TARGET_ENV}={target} is not a known target: {exc}")
        return False
    return True


def _aiter_env_notes() -> list[str]:
    """Notes for the env variables that change which tuned configs AITER reads (CU_NUM, AITER_CONFIG_FMOE)."""
    notes: list[str] = []
    if os.environ.get("CU_NUM", "").strip() not in ("", "0"):
        notes.append(f"CU_NUM={os.environ['CU_NUM']} is set: AITER uses it instead of the probed CU count for "
                     "tuned-config lookup (ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py get_cu_num)")
    if os.environ.get("AITER_CONFIG_FMOE"):
        notes.append("AITER_CONFIG_FMOE is set: AITER reads those tuned files instead of the packaged ones "
                     "(ROCm/aiter@v0.1.15.post3:aiter/jit/core.py get_config_file); tuned cu_num coverage shown "
                     "is of the packaged files")
    return notes


def _finish_gpu(raw: RawGpu) -> tuple[GpuInfo, GpuDetail]:
    gfx = normalize(raw.gfx_raw)
    guess = guess_product(gfx, raw.compute_units, raw.device_id, raw.market_name)
    provenance = [("gfx", raw.source)]
    unknown = list(raw.unknown)
    if guess.product is not None:
        provenance.append(("product", guess.product_source))
    else:
        unknown.append(("product", guess.product_source))
    if raw.compute_units is not None:
        provenance.append(("compute_units", raw.source))
    if raw.vram_mib is not None:
        provenance.append(("vram_mib", raw.source))
    if raw.device_id is not None:
        provenance.append(("device_id", raw.source))
    if raw.market_name is not None:
        provenance.append(("market_name", raw.source))
    if guess.partition is not None and guess.partition_source:
        provenance.append(("partition", guess.partition_source))
    elif guess.product is not None and raw.compute_units is not None:
        provenance.append(("partition", "none: CU count equals the product's full count"))
    else:
        unknown.append(("partition", "cannot tell without a product and a CU count"))
    info = GpuInfo(index=raw.index, gfx=gfx, product=guess.product, compute_units=raw.compute_units,
                   vram_mib=raw.vram_mib, source=raw.source)
    detail = GpuDetail(index=raw.index, gfx_raw=raw.gfx_raw, market_name=raw.market_name, device_id=raw.device_id,
                       partition=guess.partition, provenance=tuple(provenance), unknown=tuple(unknown))
    return info, detail


# -- packages ---------------------------------------------------------------------------------------------------

def _packages(hip: str | None, allow_torch: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    present: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    for name in _PACKAGES:
        version = dist_version(name)
        if version is None:
            missing.append((name, "not installed (no distribution metadata)"))
        else:
            present.append((name, version))
    if hip:
        present.append(("torch.version.hip", hip))
    elif not allow_torch:
        missing.append(("torch.version.hip", "not read: allow_torch=False"))
    else:
        missing.append(("torch.version.hip", "torch not importable or not a ROCm build (see source torch)"))
    return present, missing


# -- probe ------------------------------------------------------------------------------------------------------

_cache: dict[tuple[Any, ...], ProbeReport] = {}
register(_cache.clear, "probe report")
_lock = threading.Lock()


def probe(refresh: bool = False, *, allow_torch: bool = False, try_import: bool = False,
          timeout: float = 5.0) -> ProbeReport:
    """Probe once per process (per options and relevant env); ``refresh=True`` re-reads everything.

    ``allow_torch``: also ask torch (in a subprocess: it initializes HIP). ``try_import``: also try the real
    ``import aiter`` in a subprocess. ``timeout``: seconds per tool step (Python subprocesses get 6x, min 30 s).
    """
    key = (allow_torch, try_import, tuple(os.environ.get(k) for k in _ENV_KEYS))
    with _lock:
        if not refresh and key in _cache:
            return _cache[key]
        importlib.invalidate_caches()
        report = _probe(allow_torch, try_import, timeout)
        _cache[key] = report
        return report


def _probe(allow_torch: bool, try_import: bool, timeout: float) -> ProbeReport:
    try:
        raw, sources, notes, hip = _discover(allow_torch, timeout)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - defensive: _discover isolates each step already
        raw, sources, notes, hip = [], [SourceResult("gpus", False, f"failed: {describe(exc)}")], [], None
    gpus: list[GpuInfo] = []
    details: list[GpuDetail] = []
    for r in raw:
        try:
            info, detail = _finish_gpu(r)
        except Exception as exc:  # noqa: BLE001 - e.g. a broken capability_db
            notes.append(f"GPU {r.index} ({r.gfx_raw}) from {r.source}: product mapping failed: {describe(exc)}")
            info = GpuInfo(index=r.index, gfx=r.gfx_raw, compute_units=r.compute_units, vram_mib=r.vram_mib,
                           source=r.source)
            detail = GpuDetail(r.index, r.gfx_raw, r.market_name, r.device_id, None, (("gfx", r.source),),
                               (("product", f"mapping failed: {describe(exc)}"),))
        gpus.append(info)
        details.append(detail)
    archs = sorted({g.gfx for g in gpus})
    mixed = len(archs) > 1
    if mixed:
        notes.append(f"mixed GPU archs on this node: {', '.join(archs)} "
                     f"({', '.join(f'{g.index}:{g.gfx}' for g in gpus)}); pick one with {TARGET_ENV}/--target or "
                     "HIP_VISIBLE_DEVICES")
    cus = sorted({g.compute_units for g in gpus if g.compute_units is not None})
    if not mixed and len(cus) > 1:
        notes.append(f"GPUs report different CU counts {cus}; AITER asserts they are equal "
                     "(ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py get_cu_num)")
    if not gpus:
        notes.append("no GPU found by any source")

    packages, missing = _packages(hip, allow_torch)
    aiter: AiterInfo | None = None
    try:
        aiter, files_detail = inspect_aiter(dict(packages).get("flydsl"), do_import=try_import,
                                      timeout=max(timeout * 6, 30.0))
        sources.append(SourceResult("files:amd-aiter", aiter is not None, files_detail))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        sources.append(SourceResult("files:amd-aiter", False, f"failed: {describe(exc)}"))
    if try_import:
        status = aiter.import_status if aiter is not None else None
        if status is None:
            sources.append(SourceResult("import:aiter", False, "not tried: AMD AITER not installed"))
        else:
            sources.append(SourceResult("import:aiter", status == "ok",
                                        "import aiter (subprocess): " + status))
    else:
        sources.append(SourceResult("import:aiter", False, "not tried: try_import=False"))
    if aiter is not None:
        notes.extend(aiter.notes)
    target = os.environ.get(TARGET_ENV) or None
    return ProbeReport(gpus=tuple(gpus), gpu_details=tuple(details), sources=tuple(sources), aiter=aiter,
                       packages=tuple(packages), missing_packages=tuple(missing), mixed_arch=mixed,
                       target_override=target, notes=tuple(notes))


# -- Capabilities -----------------------------------------------------------------------------------------------

def _single(values: list[Any]) -> Any:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def capabilities_from_probe(report: ProbeReport, aiter_version: str | None = None) -> Capabilities | None:
    """Capabilities for this machine. ``None`` when no GPU was found and no MOEDISPATCH_TARGET is set.

    Raises :class:`~moedispatch.core.errors.TargetError` when GPU archs are mixed (never picks one silently) or when
    MOEDISPATCH_TARGET / ``aiter_version`` cannot be resolved. ``aiter_version`` overrides the probed AITER
    (``"none"`` = absent); the override's features then come from capability_db.
    """
    provenance: list[tuple[str, str]] = []
    unknown: list[tuple[str, str]] = []
    notes: list[str] = list(report.notes)
    if report.target_override:
        gfx, product, cus = _target_from_override(report.target_override, report, provenance, notes)
    elif not report.gpus:
        return None
    else:
        gfx, product, cus = _target_from_gpus(report, provenance, unknown)
    facts = _arch_facts(gfx, provenance, unknown)
    info = report.aiter
    version, features, use_files = _aiter_identity(report, aiter_version, provenance, unknown, notes)
    catalog, tuned = _aiter_coverage(info if use_files else None, version, provenance, unknown)
    provenance.append(("packages", "files:<distribution> (importlib.metadata)"))
    return Capabilities(
        gfx=gfx, product=product, compute_units=cus, family=facts.get("family"), cdna=int(facts.get("cdna", 0)),
        fp8_format=facts.get("fp8") or None, native_mx=bool(facts.get("native_mx", False)), aiter_version=version,
        aiter_features=features, aiter_catalog=catalog, tuned_cu_nums=tuned, packages=report.packages,
        gpus=report.gpus, provenance=tuple(provenance), unknown=tuple(unknown), source="probe", notes=tuple(notes),
    )


def _target_from_override(target: str, report: ProbeReport, provenance: list[tuple[str, str]],
                          notes: list[str]) -> tuple[str, str | None, int | None]:
    """(gfx, product, CUs) from MOEDISPATCH_TARGET (``target``), noting when it overrides the probed GPUs."""
    gfx, product, cus = capdb.resolve_target(target)
    is_gfx = target.strip().lower().startswith(("gfx", "amdgcn"))
    provenance += [("gfx", "probe:env"), ("product", "db" if is_gfx else "probe:env"), ("compute_units", "db")]
    if report.gpus and set(report.archs) != {gfx}:
        notes.append(f"{TARGET_ENV}={target} overrides the probed GPUs "
                     f"({', '.join(report.archs)})")
    return gfx, product, cus


def _target_from_gpus(report: ProbeReport, provenance: list[tuple[str, str]],
                      unknown: list[tuple[str, str]]) -> tuple[str, str | None, int | None]:
    """(gfx, product, CUs) from the probed GPUs; raises TargetError when their archs are mixed."""
    if report.mixed_arch:
        listing = ", ".join(f"GPU {g.index} {g.gfx}" for g in report.gpus)
        raise TargetError(f"mixed GPU archs on this node ({listing}); choose one with --target or "
                          f"{TARGET_ENV}, or restrict with HIP_VISIBLE_DEVICES")
    gfx = report.gpus[0].gfx
    src = report.gpus[0].source
    provenance.append(("gfx", src))
    product = _single([g.product for g in report.gpus])
    if product is not None:
        detail = dict(report.gpu_details[0].provenance) if report.gpu_details else {}
        provenance.append(("product", "db" if detail.get("product", "db").startswith("db") else "derived"))
    else:
        reasons = dict(report.gpu_details[0].unknown).get("product") if report.gpu_details else None
        unknown.append(("product", reasons or "GPUs map to different products: "
                        + ", ".join(sorted({str(g.product) for g in report.gpus}))))
    cus = _single([g.compute_units for g in report.gpus])
    if cus is not None:
        provenance.append(("compute_units", src))
    else:
        unknown.append(("compute_units", "not reported by " + src if all(g.compute_units is None for g in
                        report.gpus) else "GPUs report different CU counts"))
    return gfx, product, cus


def _arch_facts(gfx: str, provenance: list[tuple[str, str]], unknown: list[tuple[str, str]]) -> dict[str, Any]:
    """capability_db's facts for ``gfx`` ({} when it is not listed), with their provenance."""
    facts = capdb.arch_facts(gfx)
    if facts is None:
        unknown += [(f, f"{gfx} is not in capability_db/gpus.toml") for f in ("family", "fp8_format", "native_mx")]
    else:
        provenance += [("family", "db"), ("cdna", "db"), ("fp8_format", "db"), ("native_mx", "db")]
    return facts or {}


def _aiter_identity(report: ProbeReport, aiter_version: str | None, provenance: list[tuple[str, str]],
                    unknown: list[tuple[str, str]], notes: list[str]) -> tuple[str | None, frozenset[str], bool]:
    """(AITER version, features, whether the installed files describe it) from the flag or the probe."""
    info = report.aiter
    probed_version = info.version if info is not None else None
    if aiter_version is not None:
        return _aiter_from_flag(aiter_version, info, provenance, unknown, notes)
    if info is not None and probed_version is not None:
        provenance += [("aiter_version", "files:amd-aiter"), ("aiter_features", "files:amd-aiter")]
        return probed_version, info.feature_names, True
    why = next((s.detail for s in report.sources if s.name == "files:amd-aiter"), "amd-aiter not installed")
    unknown.append(("aiter_version", why if info is None else "amd-aiter installed but its version is unknown"))
    return None, frozenset(), False


def _aiter_from_flag(aiter_version: str, info: AiterInfo | None, provenance: list[tuple[str, str]],
                     unknown: list[tuple[str, str]], notes: list[str]) -> tuple[str | None, frozenset[str], bool]:
    """(AITER version, features, whether the installed files describe it) as ``--aiter-version`` sets them."""
    probed_version = info.version if info is not None else None
    if aiter_version.strip().lower() in ("none", "absent", "no"):
        provenance.append(("aiter_version", "flag"))
        unknown.append(("aiter_version", "AITER absent by --aiter-version none"))
        return None, frozenset(), False
    version = str(capdb.parse_aiter_version(aiter_version))
    provenance.append(("aiter_version", "flag"))
    if probed_version is not None and version == probed_version:
        provenance.append(("aiter_features", "files:amd-aiter"))
        return version, info.feature_names if info else frozenset(), True
    provenance.append(("aiter_features", "db"))
    if probed_version is not None:
        notes.append(f"--aiter-version {version} overrides the installed AITER {probed_version}; "
                     "kernel catalog and tuned coverage of the installed files not used")
    return version, capdb.features_for_version(version), False


def _aiter_coverage(info: AiterInfo | None, version: str | None, provenance: list[tuple[str, str]],
                    unknown: list[tuple[str, str]]) -> tuple[frozenset[str] | None, frozenset[int] | None]:
    """(asm kernel catalog, tuned cu_nums) from the installed files ``info`` (None: not used for this version)."""
    catalog: frozenset[str] | None = None
    tuned: frozenset[int] | None = None
    if info is not None:
        if info.asm_root is not None:
            catalog = frozenset(f"{t.gfx}:{t.table}" for t in info.asm_tables if t.kernels > 0)
            provenance.append(("aiter_catalog", "files:amd-aiter"))
        else:
            unknown.append(("aiter_catalog", dict(info.unknown).get("asm_tables", "asm kernel dir not found")))
        if info.tuned_cu_nums is not None:
            tuned = frozenset(info.tuned_cu_nums)
            provenance.append(("tuned_cu_nums", "files:amd-aiter"))
        else:
            unknown.append(("tuned_cu_nums", dict(info.unknown).get("tuned_cu_nums", "no tuned fmoe CSV found")))
    elif version is not None:
        unknown += [("aiter_catalog", "not probed for this AITER version"),
                    ("tuned_cu_nums", "not probed for this AITER version")]
    return catalog, tuned


# -- rendering --------------------------------------------------------------------------------------------------

def _aiter_dict(report: ProbeReport) -> dict[str, Any]:
    info = report.aiter
    if info is None:
        src = report.source("files:amd-aiter")
        return {"installed": False, "reason": src.detail if src else "not probed"}
    by_arch: dict[str, dict[str, Any]] = {}
    for t in info.asm_tables:
        entry = by_arch.setdefault(t.gfx, {"kernels": 0, "tables": {}})
        entry["kernels"] += t.kernels
        entry["tables"][t.table] = {"kind": t.kind, "kernels": t.kernels, "path": t.path}
    unknown = dict(info.unknown)
    status = info.import_status
    return {
        "installed": True,
        "distribution": info.distribution,
        "version": {"value": info.version, "source": "files:amd-aiter", "how": info.version_source,
                    "version_file": info.version_file,
                    **({"unknown": unknown["version"]} if "version" in unknown else {})},
        "location": info.location,
        "fused_moe": ({"params": [n for n, _ in info.fused_moe_params],
                       "defaults": {n: d for n, d in info.fused_moe_params if d is not None},
                       "source": "files:amd-aiter (aiter/fused_moe.py, ast)"}
                      if info.fused_moe_params is not None else {"params": None,
                                                                 "unknown": unknown.get("fused_moe_params")}),
        "modules": {**{m: ok for m, ok in info.modules}, "GateMode": info.gate_mode_enum},
        "asm_kernels": {"root": info.asm_root, "source": "files:amd-aiter", "by_arch": by_arch,
                        **({"unknown": unknown["asm_tables"]} if "asm_tables" in unknown else {})},
        "tuned": {"cu_nums": list(info.tuned_cu_nums) if info.tuned_cu_nums is not None else None,
                  "files": {t.path: {"rows": t.rows, "cu_nums": list(t.cu_nums)} for t in info.tuned_files},
                  "source": "files:amd-aiter",
                  **({"unknown": unknown["tuned_cu_nums"]} if "tuned_cu_nums" in unknown else {})},
        "features": {f.name: {"present": f.present, "source": f.source, "db": f.db,
                              **({"evidence": f.evidence} if f.evidence else {})} for f in info.features},
        "flydsl_pin": ({"requirement": info.flydsl_requirement[0], "source": "db",
                        "cites": info.flydsl_requirement[1]} if info.flydsl_requirement else None),
        "import": {"tried": status is not None, "ok": status == "ok" if status is not None else None,
                   "detail": status if status is not None else "not tried (try_import=False)"},
        "unknown": unknown,
    }


#: The environment a node's engine processes see that changes a plan (``moedispatch fleet --from`` reads it).
NODE_ENV_PREFIXES = ("AITER_", "VLLM_", "SGLANG_", "GPTOSS_", "MOEDISPATCH_")


#: Where the ROCm release and the amdgpu kernel driver say their versions (ROCm installs write
#: ``$ROCM_PATH/.info/version``; the amdgpu module exports ``/sys/module/amdgpu/version`` when loaded as a DKMS module).
ROCM_VERSION_FILE = os.path.join(".info", "version")
AMDGPU_VERSION_FILE = "/sys/module/amdgpu/version"


def _first_line(path: str) -> tuple[str | None, str | None]:
    """(the file's first line, None) or (None, why it could not be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return (fh.readline().strip() or None), None
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def system_versions(environ: Any = None) -> dict[str, Any]:
    """What ``vllm collect-env`` reports that decides what runs: Python, moedispatch, the OS and kernel, the ROCm
    release and the amdgpu driver (each ``None`` with an ``unknown`` reason when it cannot be read)."""
    import platform

    env = os.environ if environ is None else environ
    rocm_root = env.get("ROCM_PATH") or "/opt/rocm"
    rocm, rocm_why = _first_line(os.path.join(rocm_root, ROCM_VERSION_FILE))
    driver, driver_why = _first_line(AMDGPU_VERSION_FILE)
    unknown = {k: v for k, v in (("rocm", rocm_why), ("amdgpu_driver", driver_why)) if v}
    return {"python": platform.python_version(), "moedispatch": dist_version("moedispatch"),
            "os": platform.platform(), "kernel": platform.release(), "rocm": rocm, "amdgpu_driver": driver,
            **({"unknown": unknown} if unknown else {})}


def node_identity(environ: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """({"host": …, "system": …}, the AITER/engine environment of this process): what a fleet needs to tell nodes
    apart and plan each as its processes will run (CU_NUM and the prefixes in :data:`NODE_ENV_PREFIXES`), and the
    versions that decide what runs there (:func:`system_versions`)."""
    import socket

    env = os.environ if environ is None else environ
    keep = {k: v for k, v in sorted(env.items()) if k.startswith(NODE_ENV_PREFIXES) or k == "CU_NUM"}
    return {"host": socket.gethostname(), "system": system_versions(env)}, keep


def report_to_dict(report: ProbeReport, *, node: Any = None) -> dict[str, Any]:
    """The ``moedispatch.probe/1`` document; ``node`` = (identity, environment) from :func:`node_identity` adds
    ``node`` and ``env`` (the CLI does; a library probe stays a pure function of the report)."""
    gpus = []
    for info, det in zip(report.gpus, report.gpu_details):
        gpus.append({**info.to_dict(), "gfx_raw": det.gfx_raw, "device_id": det.device_id,
                     "market_name": det.market_name, "partition": det.partition,
                     "provenance": dict(det.provenance), "unknown": dict(det.unknown)})
    packages: dict[str, Any] = {}
    for name, version in report.packages:
        packages[name] = {"version": version,
                          "source": "probe:torch" if name == "torch.version.hip" else f"files:{name}"}
    for name, why in report.missing_packages:
        packages[name] = {"version": None, "unknown": why}
    return {
        "schema": SCHEMA,
        "gpus": gpus,
        "archs": list(report.archs),
        "mixed_arch": report.mixed_arch,
        "target_override": ({"value": report.target_override, "source": "probe:env"}
                            if report.target_override else None),
        "sources": [s.to_dict() for s in report.sources],
        "aiter": _aiter_dict(report),
        "packages": packages,
        "notes": list(report.notes),
        **({"node": node[0], "env": node[1]} if node is not None else {}),
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render_probe(report: ProbeReport, fmt: str = "table", *, node: Any = None) -> str:
    """The report as ``json`` (schema moedispatch.probe/1; with ``node``, this node's identity and environment) or a
    human ``table``."""
    if fmt == "json":
        return json.dumps(report_to_dict(report, node=node), indent=2, sort_keys=False)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; use 'table' or 'json'")
    out: list[str] = []
    if report.gpus:
        out.append(f"GPUs ({len(report.gpus)}{', MIXED ARCHS' if report.mixed_arch else ''})")
        rows = [["idx", "gfx", "product", "CUs", "VRAM MiB", "partition", "source"]]
        for g, d in zip(report.gpus, report.gpu_details):
            part = f"{d.partition} (derived)" if d.partition else "-"
            rows.append([str(g.index), g.gfx, g.product or "?", str(g.compute_units or "?"),
                         str(g.vram_mib or "?"), part, g.source])
        out += _table(rows)
    else:
        out.append("GPUs: none found")
    if report.target_override:
        out.append(f"Target override: {TARGET_ENV}={report.target_override} (probe:env)")
    out.append("Sources")
    out += _table([[s.name, "ok" if s.ok else "no", s.detail] for s in report.sources])
    info = report.aiter
    out.append("AITER")
    if info is None:
        src = report.source("files:amd-aiter")
        out.append(f"  not installed: {src.detail if src else 'not probed'}")
    else:
        counts = info.asm_kernel_counts()
        ntables: dict[str, int] = {}
        for t in info.asm_tables:
            ntables[t.gfx] = ntables.get(t.gfx, 0) + 1
        params = (", ".join(n for n, _ in info.fused_moe_params) if info.fused_moe_params is not None
                  else "unknown: " + dict(info.unknown).get("fused_moe_params", "?"))
        rows = [
            ["version", f"{info.version} ({info.version_source})"],
            ["location", str(info.location)],
            ["fused_moe params", params],
            ["features", ", ".join(f"{f.name} ({f.source})" for f in info.features if f.present) or "none"],
            ["asm MoE kernels", ("; ".join(f"{g}: {counts[g]} in {ntables[g]} tables" for g in sorted(counts))
                                 or "none") + f" ({info.asm_root or dict(info.unknown).get('asm_tables', '')})"],
            ["tuned cu_num", (", ".join(map(str, info.tuned_cu_nums)) if info.tuned_cu_nums else "none")
             + f" ({len(info.tuned_files)} tuned fmoe CSV(s))"],
            ["flydsl pin", f"flydsl{info.flydsl_requirement[0]} (db)" if info.flydsl_requirement else "-"],
            ["import aiter", info.import_status or "not tried"],
        ]
        out += _table(rows)
    out.append("Packages")
    rows = [[n, v, "probe:torch" if n == "torch.version.hip" else f"files:{n}"] for n, v in report.packages]
    rows += [[n, "-", why] for n, why in report.missing_packages]
    out += _table(rows)
    system = (node[0].get("system") if node is not None else None) or {}
    if system:
        unknown = system.get("unknown") or {}
        out.append("System")
        out += _table([[k, str(system.get(k) or f"unknown ({unknown.get(k, 'not found')})")]
                       for k in ("python", "moedispatch", "os", "kernel", "rocm", "amdgpu_driver")])
    if report.notes:
        out.append("Notes")
        out += [f"  - {n}" for n in report.notes]
    return "\n".join(out) + "\n"
