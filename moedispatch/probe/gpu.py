"""GPU discovery for the probe: amdsmi, torch (subprocess), rocminfo, rocm_agent_enumerator, env filters.

Order (ours, derived): amdsmi (no HIP init, as vllm-project/vllm@017e9f4448:vllm/platforms/rocm.py
_get_gcn_arch), torch, rocminfo, rocm_agent_enumerator (https://github.com/ROCm/rocminfo); per-source rules cited
at each function.
Every function here returns data or raises; ``moedispatch.probe.system`` turns failures into recorded reasons.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

from moedispatch.data import capdb
from moedispatch.probe.util import ProbeTimeout, call_with_timeout, describe, run_python, run_tool, silenced


@dataclass(frozen=True)
class RawGpu:
    """One GPU as a single source reported it (before normalization and product mapping)."""

    index: int
    gfx_raw: str
    source: str
    compute_units: int | None = None
    vram_mib: int | None = None
    market_name: str | None = None
    device_id: str | None = None
    unknown: tuple[tuple[str, str], ...] = ()


class SourceFailed(Exception):
    """The source ran but gave no usable answer; the message is the recorded reason."""


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None  # "N/A" (amdsmi's 0xFFFFFFFF), None, anything odd


def _hex_id(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:04x}"
    if isinstance(value, str) and value.strip() and value.strip().upper() != "N/A":
        text = value.strip().lower()
        return text if text.startswith("0x") else f"0x{int(text):04x}" if text.isdigit() else text
    return None


# -- amdsmi (in-process: a fake module in sys.modules must work; silenced + thread timeout) --------------------

_amdsmi_timed_out = False


def probe_amdsmi(timeout: float) -> tuple[list[RawGpu], str]:
    """GPUs from amdsmi. Keys per https://pypi.org/project/amdsmi/7.0.2/ (``amdsmi/amdsmi_interface.py``):
    ``amdsmi_get_gpu_asic_info`` → target_graphics_version, market_name, num_compute_units ("N/A" when unknown),
    device_id (hex str); ``amdsmi_get_gpu_vram_info`` → vram_size in MB. ``amdsmi_shut_down`` always runs.
    """
    global _amdsmi_timed_out
    if _amdsmi_timed_out:
        raise SourceFailed("skipped: amdsmi timed out earlier in this process (its thread may still hold it)")

    def work() -> list[RawGpu]:
        try:
            amdsmi = importlib.import_module("amdsmi")
        except ModuleNotFoundError as exc:
            if exc.name == "amdsmi":
                raise SourceFailed("amdsmi not installed (pip install amdsmi; needs libamd_smi.so from ROCm)") from None
            raise
        gpus: list[RawGpu] = []
        try:
            flags = getattr(amdsmi, "AmdSmiInitFlags", None)
            if flags is not None and hasattr(flags, "INIT_AMD_GPUS"):
                amdsmi.amdsmi_init(flags.INIT_AMD_GPUS)
            else:
                amdsmi.amdsmi_init()
            for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles() or []):
                asic = dict(amdsmi.amdsmi_get_gpu_asic_info(handle) or {})
                unknown: list[tuple[str, str]] = []
                cus = _int_or_none(asic.get("num_compute_units"))
                if cus is None:
                    unknown.append(("compute_units", f"amdsmi num_compute_units={asic.get('num_compute_units')!r}"))
                vram: int | None = None
                try:  # a failing VRAM query only loses the VRAM field
                    vram = _int_or_none(dict(amdsmi.amdsmi_get_gpu_vram_info(handle) or {}).get("vram_size"))
                    if vram is None:
                        unknown.append(("vram_mib", "amdsmi vram_size not reported"))
                except Exception as exc:  # noqa: BLE001
                    unknown.append(("vram_mib", f"amdsmi_get_gpu_vram_info failed: {describe(exc)}"))
                gfx = str(asic.get("target_graphics_version") or "").strip()
                if not gfx.startswith("gfx"):
                    raise SourceFailed(f"amdsmi GPU {index}: target_graphics_version={gfx!r} is not a gfx name")
                market = asic.get("market_name")
                gpus.append(RawGpu(
                    index=index, gfx_raw=gfx, source="probe:amdsmi", compute_units=cus, vram_mib=vram,
                    market_name=str(market).strip() if market and str(market).strip() != "N/A" else None,
                    device_id=_hex_id(asic.get("device_id")), unknown=tuple(unknown),
                ))
        finally:
            shut_down = getattr(amdsmi, "amdsmi_shut_down", None)
            if shut_down is not None:
                try:
                    shut_down()
                except Exception:  # noqa: BLE001 - shut_down after a failed init may itself fail
                    pass
        return gpus

    failure: BaseException | None = None
    gpus: list[RawGpu] = []
    with silenced() as out:
        try:
            gpus = call_with_timeout(work, timeout, "amdsmi")
        except ProbeTimeout:
            _amdsmi_timed_out = True
            raise
        except (SourceFailed, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - import amdsmi raises KeyError without libamd_smi.so
            failure = exc
    if failure is not None:
        printed = f" (printed: {out.summary()})" if out.text.strip() else ""
        hint = " — libamd_smi.so not found (install amd-smi-lib / ROCm)" if isinstance(failure, KeyError) else ""
        raise SourceFailed(f"amdsmi failed: {describe(failure)}{hint}{printed}")
    if not gpus:
        raise SourceFailed("amdsmi found no GPU processor handles")
    return gpus, f"found {len(gpus)} GPU(s)"


# -- torch (subprocess: it initializes HIP, and importing torch cannot be interrupted in-process) --------------

_TORCH_SCRIPT = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
out = {}
try:
    import torch
    out["torch"] = str(getattr(torch, "__version__", ""))
    hip = getattr(getattr(torch, "version", None), "hip", None)
    out["hip"] = None if hip is None else str(hip)
    gpus = []
    if hip:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"arch": getattr(p, "gcnArchName", None), "cus": getattr(p, "multi_processor_count", None),
                         "mem": getattr(p, "total_memory", None), "name": getattr(p, "name", None)})
    out["gpus"] = gpus
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
print("\n@@MOEDISPATCH_PROBE@@" + json.dumps(out))
"""


def probe_torch(timeout: float) -> tuple[list[RawGpu], str, str | None]:
    """GPUs from ``torch.cuda.get_device_properties(i).gcnArchName`` / ``multi_processor_count`` and
    ``torch.version.hip`` (https://pytorch.org/docs/stable/notes/hip.html), run in a subprocess. Returns (gpus, detail,
    hip_version)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SourceFailed("torch not installed")
    data, result = run_python(_TORCH_SCRIPT, timeout)
    if data is None:
        raise SourceFailed(f"torch subprocess gave no answer (exit {result.returncode}): "
                           f"{(result.stderr.strip().splitlines() or [''])[-1]}")
    if "error" in data:
        raise SourceFailed(f"torch failed: {data['error']}")
    hip = data.get("hip")
    if not hip:
        raise SourceFailed(f"torch {data.get('torch')} is not a ROCm build (torch.version.hip is None)")
    gpus = []
    for index, g in enumerate(data.get("gpus") or []):
        arch = str(g.get("arch") or "")
        if not arch.startswith("gfx"):
            continue
        mem = _int_or_none(g.get("mem"))
        gpus.append(RawGpu(index=index, gfx_raw=arch, source="probe:torch", compute_units=_int_or_none(g.get("cus")),
                           vram_mib=mem // 2**20 if mem else None, market_name=g.get("name") or None,
                           unknown=(("device_id", "torch does not report the PCI device id"),)))
    if not gpus:
        return [], f"torch {data.get('torch')} (HIP {hip}) sees no GPU", hip
    return gpus, f"found {len(gpus)} GPU(s); torch.version.hip={hip}", hip


# -- rocminfo / rocm_agent_enumerator ---------------------------------------------------------------------------

def find_tool(name: str) -> str | None:
    """PATH first, then ``$ROCM_PATH/bin`` (default /opt/rocm/bin)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = os.path.join(os.environ.get("ROCM_PATH") or "/opt/rocm", "bin", name)
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


_AGENT_SPLIT = re.compile(r"^\s*Agent\s+\d+\s*$", re.MULTILINE)
_FIELD = re.compile(r"^\s*(Name|Marketing Name|Device Type|Compute Unit|Chip ID):\s*(.*?)\s*$")
_CHIP_ID = re.compile(r"\((0x[0-9a-fA-F]+)\)")


def parse_rocminfo(text: str) -> list[RawGpu]:
    """Agent blocks (https://github.com/ROCm/rocminfo; AITER reads the same ``Compute Unit:`` lines in
    ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py get_cu_num):
    the first ``Name:`` of a block is the agent name (ISA ``Name:`` lines come later), ``Device Type: GPU``
    selects GPUs, ``Chip ID: 29857(0x74a1)`` is the PCI device id."""
    gpus: list[RawGpu] = []
    for block in _AGENT_SPLIT.split(text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = _FIELD.match(line)
            if m and m.group(1) not in fields:
                fields[m.group(1)] = m.group(2)
        if fields.get("Device Type", "").upper() != "GPU" or not fields.get("Name", "").startswith("gfx"):
            continue
        chip = _CHIP_ID.search(fields.get("Chip ID", ""))
        unknown = [("vram_mib", "rocminfo does not report VRAM size per device")]
        cus = _int_or_none(fields.get("Compute Unit"))
        if cus is None:
            unknown.append(("compute_units", "rocminfo printed no Compute Unit line"))
        gpus.append(RawGpu(index=len(gpus), gfx_raw=fields["Name"], source="probe:rocminfo", compute_units=cus,
                           market_name=fields.get("Marketing Name") or None,
                           device_id=chip.group(1).lower() if chip else None, unknown=tuple(unknown)))
    return gpus


def probe_rocminfo(timeout: float) -> tuple[list[RawGpu], str]:
    tool = find_tool("rocminfo")
    if tool is None:
        raise SourceFailed("rocminfo not found on PATH or in $ROCM_PATH/bin")
    result = run_tool([tool], timeout)
    gpus = parse_rocminfo(result.stdout)
    if not gpus:
        tail = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or [""])[-1]
        raise SourceFailed(f"rocminfo (exit {result.returncode}) listed no GPU agent" + (f": {tail}" if tail else ""))
    return gpus, f"found {len(gpus)} GPU agent(s) via {tool}"


def probe_enumerator(timeout: float) -> tuple[list[RawGpu], str]:
    """One ISA per line; ``gfx000`` is the CPU agent and is dropped (https://github.com/ROCm/rocminfo
    rocm_agent_enumerator)."""
    tool = find_tool("rocm_agent_enumerator")
    if tool is None:
        raise SourceFailed("rocm_agent_enumerator not found on PATH or in $ROCM_PATH/bin")
    result = run_tool([tool], timeout)
    names = [ln.strip() for ln in result.stdout.splitlines() if re.match(r"^gfx[0-9a-z]+", ln.strip())]
    names = [n for n in names if n != "gfx000"]
    if not names:
        raise SourceFailed(f"rocm_agent_enumerator (exit {result.returncode}) listed no GPU")
    gpus = [RawGpu(index=i, gfx_raw=n, source="probe:rocm_agent_enumerator",
                   unknown=(("compute_units", "rocm_agent_enumerator reports only the ISA"),
                            ("vram_mib", "rocm_agent_enumerator reports only the ISA")))
            for i, n in enumerate(names)]
    return gpus, f"found {len(gpus)} GPU(s) via {tool}"


# -- env filters --------------------------------------------------------------------------------------------------

def parse_visible(value: str) -> tuple[list[int] | None, str | None]:
    """Indices from a *_VISIBLE_DEVICES value. (None, why) when it cannot be applied (UUIDs).
    Parsing stops at the first invalid entry, as the HIP runtime is said to do with e.g. ``-1`` (unconfirmed; variables:
    https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html)."""
    indices: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if part.upper().startswith("GPU-"):
            return None, f"contains a UUID ({part}); UUIDs are not matched by the probe, filter not applied"
        # ASCII digits only: str.isdigit() accepts '²' and other Unicode digits that int() rejects.
        if not (part.isascii() and part.isdigit()):
            break
        if int(part) not in indices:  # a repeated index names the same GPU once
            indices.append(int(part))
    return indices, None


def apply_visible(gpus: list[RawGpu], var: str, notes: list[str]) -> list[RawGpu]:
    value = os.environ.get(var)
    if value is None:
        return gpus
    indices, why = parse_visible(value)
    if indices is None:
        notes.append(f"{var}={value}: {why}")
        return gpus
    kept = [gpus[i] for i in indices if 0 <= i < len(gpus)]
    notes.append(f"{var}={value} keeps {len(kept)} of {len(gpus)} GPU(s)")
    return kept


# -- product / partition mapping ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProductGuess:
    product: str | None
    product_source: str
    partition: str | None = None
    partition_source: str | None = None


def guess_product(gfx: str, cus: int | None, device_id: str | None, market: str | None) -> ProductGuess:
    """Product by PCI id, else by full CU count (capdb.product_for); a CU count equal to full/N for a partition N in
    gpus.toml ``partitions`` gives a *derived* partition mode (CPX etc. divide visible CUs: gpus.toml
    partitions_confidence = "derived"; AITER's get_cu_num reads the partitioned count:
    ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py)."""
    facts = capdb.arch_facts(gfx)
    if facts is None:
        return ProductGuess(None, f"{gfx} is not in capability_db/gpus.toml" + (f" (market name {market!r})"
                                                                                  if market else ""))
    products = facts["products"]
    name = capdb.product_for(gfx, cus, device_id)
    if name is not None:
        full = next(p["compute_units"] for p in products if p["name"] == name)
        how = f"db: device id {device_id}" if device_id and any(
            device_id.lower() in [d.lower() for d in p.get("device_ids", [])] for p in products) else (
            f"db: {cus} CUs" if cus is not None else "db: arch's first product (no device id, no CU count)")
        if cus is None or cus == full:
            return ProductGuess(name, how)
        for mode, n in capdb.partitions_for(gfx, name).items():
            if n > 1 and full % n == 0 and full // n == cus:
                return ProductGuess(name, how, mode, f"derived: {cus} CUs = {full}/{n} of {name}")
        return ProductGuess(name, how + f" (CU count {cus} differs from the full {full} and every partition)")
    # No id match and no full-CU match: try partitions of each product.
    matches = [(p["name"], mode, n, p["compute_units"]) for p in products
               for mode, n in capdb.partitions_for(gfx, p["name"]).items()
               if cus is not None and n > 1 and p["compute_units"] % n == 0 and p["compute_units"] // n == cus]
    if matches:
        pname, mode, n, full = matches[0]
        others = sorted({m[0] for m in matches[1:] if m[0] != pname})
        alt = f" (or {', '.join(others)})" if others else ""
        return ProductGuess(pname, f"derived: {cus} CUs = {full}/{n} ({mode}) of {pname}{alt}", mode,
                            f"derived: {cus} CUs = {full}/{n}")
    return ProductGuess(None, f"no {gfx} product in capability_db/gpus.toml has {cus} CUs (full or partitioned)"
                        + (f"; market name {market!r}" if market else ""))


def normalize(raw: str) -> str:
    return capdb.normalize_gfx(raw)


__all__ = [
    "RawGpu",
    "SourceFailed",
    "apply_visible",
    "find_tool",
    "guess_product",
    "normalize",
    "parse_rocminfo",
    "parse_visible",
    "probe_amdsmi",
    "probe_enumerator",
    "probe_rocminfo",
    "probe_torch",
]
