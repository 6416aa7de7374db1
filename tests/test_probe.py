"""Tests for moedispatch.probe.system with fake sources: amdsmi module, rocminfo / rocm_agent_enumerator scripts, torch,
an installed amd-aiter distribution built in a tmp dir, env overrides. No GPU needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

import moedispatch.probe.system as probe_mod
from moedispatch.probe import gpu as _probe_gpu
from moedispatch.probe.aiter import dist_version
from moedispatch.core.errors import TargetError
from moedispatch.probe.system import capabilities_from_probe, probe, render_probe

_ENV = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MOEDISPATCH_TARGET", "CU_NUM",
        "AITER_CONFIG_FMOE")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No real GPU tool can answer: PATH holds only sh/cat/sleep links, ROCM_PATH is empty, amdsmi is absent."""
    for var in _ENV:
        monkeypatch.delenv(var, raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "cat", "sleep"):
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ImportError
    monkeypatch.setattr(_probe_gpu, "_amdsmi_timed_out", False)
    probe_mod._cache.clear()
    return bindir


# -- fakes ------------------------------------------------------------------------------------------------------

MI300X = {"gfx": "gfx942", "cus": 304, "device_id": "0x74a1", "market": "AMD Instinct MI300X"}
MI355X = {"gfx": "gfx950", "cus": 256, "device_id": "0x75a3", "market": "AMD Instinct MI355X"}


def fake_amdsmi(gpus: list[dict[str, Any]], *, init_error: BaseException | None = None,
                hang: float = 0.0) -> types.ModuleType:
    mod = types.ModuleType("amdsmi")
    calls: list[str] = []

    class AmdSmiInitFlags:
        INIT_AMD_GPUS = 2

    def amdsmi_init(flag: int = 0) -> None:
        calls.append(f"init:{flag}")
        if hang:
            time.sleep(hang)
        if init_error is not None:
            raise init_error

    def asic(handle: str) -> dict[str, Any]:
        g = gpus[int(handle[1:])]
        return {"market_name": g["market"], "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc.",
                "device_id": g["device_id"], "rev_id": "0x00", "asic_serial": "0xABC", "oam_id": int(handle[1:]),
                "num_compute_units": g["cus"], "target_graphics_version": g["gfx"]}

    mod.AmdSmiInitFlags = AmdSmiInitFlags  # type: ignore[attr-defined]
    mod.amdsmi_init = amdsmi_init  # type: ignore[attr-defined]
    mod.amdsmi_get_processor_handles = lambda: [f"h{i}" for i in range(len(gpus))]  # type: ignore[attr-defined]
    mod.amdsmi_get_gpu_asic_info = asic  # type: ignore[attr-defined]
    mod.amdsmi_get_gpu_vram_info = lambda h: {"vram_type": 14, "vram_size": 196592}  # type: ignore[attr-defined]
    mod.amdsmi_shut_down = lambda: calls.append("shut_down")  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    return mod


_CPU_AGENT = """*******
Agent 1
*******
  Name:                    AMD EPYC 9654 96-Core Processor
  Uuid:                    CPU-XX
  Marketing Name:          AMD EPYC 9654 96-Core Processor
  Vendor Name:             CPU
  Feature:                 None specified
  Profile:                 FULL_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        0(0x0)
  Queue Min Size:          0(0x0)
  Queue Max Size:          0(0x0)
  Queue Type:              MULTI
  Node:                    0
  Device Type:             CPU
  Cache Info:
    L1:                      32768(0x8000) KB
  Chip ID:                 0(0x0)
  ASIC Revision:           0(0x0)
  Cacheline Size:          64(0x40)
  Max Clock Freq. (MHz):   3707
  BDFID:                   0
  Internal Node ID:        0
  Compute Unit:            192
  SIMDs per CU:            0
  ISA Info:
"""

_GPU_AGENT = """*******
Agent {n}
*******
  Name:                    {gfx}
  Uuid:                    GPU-{n:016x}
  Marketing Name:          {market}
  Vendor Name:             AMD
  Feature:                 KERNEL_DISPATCH
  Profile:                 BASE_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        128(0x80)
  Queue Min Size:          64(0x40)
  Queue Max Size:          131072(0x20000)
  Queue Type:              MULTI
  Node:                    {n}
  Device Type:             GPU
  Cache Info:
    L1:                      32(0x20) KB
    L2:                      4096(0x1000) KB
    L3:                      262144(0x40000) KB
  Chip ID:                 {chip}({device_id})
  ASIC Revision:           1(0x1)
  Cacheline Size:          64(0x40)
  Max Clock Freq. (MHz):   2100
  BDFID:                   34304
  Internal Node ID:        {n}
  Compute Unit:            {cus}
  SIMDs per CU:            4
  Shader Engines:          32
  Shader Arrs. per Eng.:   1
  Wavefront Size:          64(0x40)
  Workgroup Max Size:      1024(0x400)
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--{gfx}:sramecc+:xnack-
      Machine Models:          HSA_MACHINE_MODEL_LARGE
*** Done ***
"""


def rocminfo_text(gpus: list[dict[str, Any]]) -> str:
    text = "ROCk module version 6.8.5 is loaded\n=====================\nHSA Agents\n==========\n" + _CPU_AGENT
    for i, g in enumerate(gpus):
        text += _GPU_AGENT.format(n=i + 2, gfx=g["gfx"], market=g["market"], chip=int(g["device_id"], 16),
                                  device_id=g["device_id"], cus=g["cus"])
    return text


def write_tool(bindir: Path, name: str, body: str) -> Path:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def fake_rocminfo(bindir: Path, gpus: list[dict[str, Any]]) -> None:
    data = bindir.parent / "rocminfo.txt"
    data.write_text(rocminfo_text(gpus))
    write_tool(bindir, "rocminfo", f"cat '{data}'\n")


# -- amdsmi ----------------------------------------------------------------------------------------------------

def test_amdsmi_eight_gpus(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    fake = fake_amdsmi([MI300X] * 8)
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    report = probe(refresh=True)
    assert len(report.gpus) == 8
    assert {g.gfx for g in report.gpus} == {"gfx942"}
    g0 = report.gpus[0]
    assert (g0.product, g0.compute_units, g0.vram_mib, g0.source) == ("MI300X", 304, 196592, "probe:amdsmi")
    assert fake.calls == ["init:2", "shut_down"]
    assert not report.mixed_arch
    assert report.source("amdsmi").ok  # type: ignore[union-attr]
    assert report.source("rocminfo").detail.startswith("not run")  # type: ignore[union-attr]
    prov = dict(report.gpu_details[0].provenance)
    assert prov["gfx"] == "probe:amdsmi" and prov["product"].startswith("db") and "0x74a1" in prov["product"]
    caps = capabilities_from_probe(report)
    assert caps is not None
    assert (caps.gfx, caps.product, caps.compute_units, caps.fp8_format, caps.native_mx, caps.source) == (
        "gfx942", "MI300X", 304, "e4m3fnuz", False, "probe")
    assert caps.source_of("gfx") == "probe:amdsmi" and caps.source_of("fp8_format") == "db"
    assert len(caps.gpus) == 8
    assert capfd.readouterr().out == ""


def test_amdsmi_mixed_arch_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X] * 4 + [MI355X] * 4))
    report = probe(refresh=True)
    assert report.mixed_arch and report.archs == ("gfx942", "gfx950")
    assert [g.product for g in report.gpus] == ["MI300X"] * 4 + ["MI355X"] * 4
    assert any("mixed GPU archs" in n for n in report.notes)
    with pytest.raises(TargetError) as err:
        capabilities_from_probe(report)
    msg = str(err.value)
    assert "\n" not in msg and "gfx942" in msg and "gfx950" in msg
    assert json.loads(render_probe(report, "json"))["mixed_arch"] is True


def test_amdsmi_import_prints_and_raises_keyerror(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """The PyPI amdsmi 7.0.2 behaviour without libamd_smi.so (models_hw.md §C.1), as a real import."""
    pkg = tmp_path / "fakesmi" / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os, sys\n"
        "print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory')\n"
        "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
        "sys.stdout.flush()\n"
        "os.write(1, b'raw fd write\\n'); os.write(2, b'raw stderr\\n')\n"
        "raise KeyError('libamd_smi.so')\n")
    monkeypatch.delitem(sys.modules, "amdsmi")
    monkeypatch.syspath_prepend(str(pkg.parent))
    report = probe(refresh=True)
    src = report.source("amdsmi")
    assert src is not None and not src.ok
    assert "KeyError" in src.detail and "libamd_smi.so" in src.detail and "Unable to find" in src.detail
    assert report.gpus == ()
    assert "amdsmi" not in sys.modules
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_amdsmi_init_error_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_amdsmi([MI300X], init_error=RuntimeError("AMDSMI_STATUS_DRIVER_NOT_LOADED"))
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    report = probe(refresh=True)
    assert "shut_down" in fake.calls
    assert "DRIVER_NOT_LOADED" in report.source("amdsmi").detail  # type: ignore[union-attr]


def test_amdsmi_systemexit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X], init_error=SystemExit(3)))
    assert "SystemExit" in probe(refresh=True).source("amdsmi").detail  # type: ignore[union-attr]


def test_amdsmi_hang_times_out(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X], hang=3.0))
    fake_rocminfo(isolated, [MI300X] * 2)
    start = time.monotonic()
    report = probe(refresh=True, timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert "timed out" in report.source("amdsmi").detail  # type: ignore[union-attr]
    assert len(report.gpus) == 2 and report.gpus[0].source == "probe:rocminfo"
    again = probe(refresh=True, timeout=0.5)  # not retried in this process
    assert "timed out earlier" in again.source("amdsmi").detail  # type: ignore[union-attr]


# -- rocminfo / rocm_agent_enumerator -------------------------------------------------------------------------

def test_rocminfo_agents(isolated: Path) -> None:
    fake_rocminfo(isolated, [MI300X] * 8)
    report = probe(refresh=True)
    assert len(report.gpus) == 8
    g = report.gpus[3]
    assert (g.index, g.gfx, g.product, g.compute_units, g.vram_mib, g.source) == (
        3, "gfx942", "MI300X", 304, None, "probe:rocminfo")
    d = report.gpu_details[3]
    assert d.device_id == "0x74a1" and d.market_name == "AMD Instinct MI300X" and d.partition is None
    assert "vram_mib" in dict(d.unknown)
    assert report.source("rocm_agent_enumerator").detail.startswith("not run")  # type: ignore[union-attr]


def test_rocminfo_cpx_partition_is_derived(isolated: Path) -> None:
    fake_rocminfo(isolated, [dict(MI300X, cus=38)] * 4)
    report = probe(refresh=True)
    d = report.gpu_details[0]
    assert report.gpus[0].product == "MI300X" and d.partition == "CPX"
    assert dict(d.provenance)["partition"].startswith("derived") and "304/8" in dict(d.provenance)["partition"]
    caps = capabilities_from_probe(report)
    assert caps is not None and caps.compute_units == 38


def test_partition_without_device_id(isolated: Path) -> None:
    data = rocminfo_text([dict(MI355X, cus=128)]).replace("Chip ID:", "Chip Xx:")
    (isolated.parent / "r.txt").write_text(data)
    write_tool(isolated, "rocminfo", f"cat '{isolated.parent / 'r.txt'}'\n")
    report = probe(refresh=True)
    # 128 CUs without a PCI id: the MI350P (full 128) wins, no partition guessed.
    assert report.gpus[0].product == "MI350P" and report.gpu_details[0].partition is None
    fake_rocminfo(isolated, [dict(MI355X, cus=128)])
    report = probe(refresh=True)
    assert report.gpus[0].product == "MI355X" and report.gpu_details[0].partition == "DPX"


def test_rocminfo_hang_then_enumerator(isolated: Path) -> None:
    write_tool(isolated, "rocminfo", "sleep 30\n")
    write_tool(isolated, "rocm_agent_enumerator",
               "echo gfx000\necho gfx942:sramecc+:xnack-\necho gfx942:sramecc+:xnack-\n")
    start = time.monotonic()
    report = probe(refresh=True, timeout=1.0)
    assert time.monotonic() - start < 10
    assert "timed out" in report.source("rocminfo").detail  # type: ignore[union-attr]
    assert [g.gfx for g in report.gpus] == ["gfx942", "gfx942"]
    assert report.gpus[0].source == "probe:rocm_agent_enumerator" and report.gpus[0].compute_units is None
    assert report.gpus[0].product == "MI300X"  # arch's first product, tagged as such
    assert "first product" in dict(report.gpu_details[0].provenance)["product"]
    caps = capabilities_from_probe(report)
    assert caps is not None and caps.compute_units is None and caps.why_unknown("compute_units")


def test_nothing_found(isolated: Path) -> None:
    report = probe(refresh=True)
    assert report.gpus == () and not report.mixed_arch
    assert [s.name for s in report.sources][:5] == ["amdsmi", "torch", "rocminfo", "rocm_agent_enumerator", "env"]
    assert "allow_torch=False" in report.source("torch").detail  # type: ignore[union-attr]
    assert "not found" in report.source("rocminfo").detail  # type: ignore[union-attr]
    assert capabilities_from_probe(report) is None


def test_torch_source_via_subprocess(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pkg = tmp_path / "faketorch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import types\n__version__ = '2.9.0+rocm6.4'\n"
        "version = types.SimpleNamespace(hip='6.4.43482-0f2d60242')\n"
        "class _P:\n"
        "    gcnArchName = 'gfx950:sramecc+:xnack-'\n    multi_processor_count = 256\n"
        "    total_memory = 288 * 2**30\n    name = 'AMD Instinct MI355X'\n"
        "cuda = types.SimpleNamespace(device_count=lambda: 2, get_device_properties=lambda i: _P())\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    report = probe(refresh=True, allow_torch=True)
    assert "torch" not in sys.modules or sys.modules["torch"].__file__ != str(pkg / "__init__.py")
    assert report.source("torch").ok  # type: ignore[union-attr]
    assert [(g.gfx, g.compute_units, g.source) for g in report.gpus] == [("gfx950", 256, "probe:torch")] * 2
    assert report.gpus[0].vram_mib == 288 * 1024 and report.gpus[0].product == "MI355X"
    assert dict(report.packages)["torch.version.hip"] == "6.4.43482-0f2d60242"


# -- env --------------------------------------------------------------------------------------------------------

def test_visible_devices_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X] * 8))
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,2")
    report = probe(refresh=True)
    assert [g.index for g in report.gpus] == [0, 2]
    assert "HIP_VISIBLE_DEVICES=0,2 keeps 2 of 8" in report.source("env").detail  # type: ignore[union-attr]
    # ROCR first (physical for amdsmi), then HIP relative to what ROCr exposes.
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "5,6,7")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    assert [g.index for g in probe(refresh=True).gpus] == [6]
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "GPU-4b2c1a,GPU-77")
    monkeypatch.delenv("HIP_VISIBLE_DEVICES")
    report = probe(refresh=True)
    assert len(report.gpus) == 8 and "UUID" in report.source("env").detail  # type: ignore[union-attr]


def test_visible_devices_set_with_no_gpu_found_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Newcomer minor 14: `HIP_VISIBLE_DEVICES=0,1 moedispatch probe` on a machine where no source found a GPU said
    "no GPU-selection variables set"; every set variable is named, with why it was not applied."""
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    report = probe(refresh=True)
    detail = report.source("env").detail  # type: ignore[union-attr]
    assert report.gpus == () and "no GPU-selection variables set" not in detail
    assert detail == "HIP_VISIBLE_DEVICES=0,1 is set (not applied here: no GPU found to filter)"
    assert "HIP_VISIBLE_DEVICES=0,1 is set" in render_probe(report, "table")


def test_visible_devices_not_applied_by_the_probe_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES beside HIP_VISIBLE_DEVICES is not applied (HIP wins); it is named, not dropped."""
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X] * 8))
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    detail = probe(refresh=True).source("env").detail  # type: ignore[union-attr]
    assert "HIP_VISIBLE_DEVICES=0,2 keeps 2 of 8" in detail
    assert "CUDA_VISIBLE_DEVICES=3 is set (not applied here: HIP_VISIBLE_DEVICES is set and takes precedence)" in detail


def test_visible_devices_selects_one_arch_of_mixed_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X] * 4 + [MI355X] * 4))
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "4,5")
    report = probe(refresh=True)
    assert not report.mixed_arch
    caps = capabilities_from_probe(report)
    assert caps is not None and caps.gfx == "gfx950" and caps.native_mx


def test_target_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEDISPATCH_TARGET", "mi355x")
    report = probe(refresh=True)
    assert report.gpus == () and report.target_override == "mi355x"
    caps = capabilities_from_probe(report)
    assert caps is not None and (caps.gfx, caps.product, caps.compute_units) == ("gfx950", "MI355X", 256)
    assert caps.source_of("gfx") == "probe:env" and caps.source == "probe"
    # The override also settles a mixed node.
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI300X, MI355X]))
    monkeypatch.setenv("MOEDISPATCH_TARGET", "gfx942")
    caps = capabilities_from_probe(probe(refresh=True))
    assert caps is not None and caps.gfx == "gfx942" and caps.source_of("product") == "db"


def test_bad_target_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEDISPATCH_TARGET", "gfx9999")
    report = probe(refresh=True)
    assert not report.source("env").ok  # type: ignore[union-attr]
    with pytest.raises(TargetError):
        capabilities_from_probe(report)


def test_cache_and_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    first = probe()
    assert probe() is first
    assert probe(refresh=True) is not first
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")  # env is part of the cache key
    assert probe() is not first


# -- AITER files ------------------------------------------------------------------------------------------------

FUSED_MOE_SRC = '''
import torch
from typing import Optional

def helper():
    pass

def fused_moe(
    hidden_states, w1, w2, topk_weight, topk_ids,
    expert_mask: Optional[torch.tensor] = None,
    activation=ActivationType.Silu,
    quant_type=QuantType.No,
    doweight_stage1=False,
    w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
    block_size_M=None, num_local_tokens=None, moe_sorting_dispatch_policy=0, dtype=None,
    hidden_pad=0,
    intermediate_pad=0,
    bias1=None,
    bias2=None,
    splitk=0,
    gate_mode="separated",
):
    return fused_moe_(hidden_states)
'''


def make_aiter(site: Path, version: str = "0.1.15.post3+rocm7.1", *, fused_moe: str = FUSED_MOE_SRC) -> Path:
    """A fake installed amd-aiter (wheel layout: site/aiter + site/aiter_meta/hsa + dist-info)."""
    files: dict[str, str] = {
        "aiter/__init__.py": "raise RuntimeError('aiter must not be imported in-process')\n",
        "aiter/_version.py": f"__version__ = version = '{version}'\n",
        "aiter/fused_moe.py": fused_moe,
        "aiter/ops/__init__.py": "",
        "aiter/ops/flydsl/__init__.py": "",
        "aiter/ops/flydsl/moe_common.py": "import enum\nclass GateMode(enum.Enum):\n    SEPARATED = 'separated'\n",
        "aiter/ops/flydsl/moe_kernels.py": "def flydsl_moe_stage1():\n    pass\n",
        "aiter/install_mode": "install\n",
        "aiter_meta/hsa/gfx950/fmoe/silu/fmoe_bf16_pertokenMXfp4_g1u1_silu.csv":
            "knl_name,co_name,atm,vskip,smf,tg_num_perCU,ps,subGU_m,subGU_n\n"
            "_ZN5aiter1aE,a.co,0,1,0,1,0,32,256\n_ZN5aiter1bE,b.co,0,1,0,1,1,32,512\n_ZN5aiter1cE,c.co,0,1,0,1,0,64,512\n",
        "aiter_meta/hsa/gfx950/fmoe_2stages/fmoe_stage1_bf16_pertokenFp8_g1u1.csv":
            "tile_m,tile_n,knl_name,co_name\n32,128,_ZN5aiter1dE,d.co\n,,,\n",
        "aiter_meta/hsa/gfx942/fmoe/silu/fmoe_bf16_pertokenFp8_g1u1_silu.csv":
            "knl_name,co_name,atm,vskip,smf,tg_num_perCU,ps,subGU_m,subGU_n\n_ZN5aiter1eE,e.co,0,1,0,1,0,32,128\n",
        "aiter_meta/hsa/gfx942/not_moe/x.csv": "knl_name\nfoo\n",
        "aiter/configs/tuned_fmoe.csv": "cu_num,token,model_dim,inter_dim,expert,topk\n80,4,2304,1536,8,2\n"
                                        "80,8,2304,1536,8,2\n256,4,7168,256,257,9\n",
        "aiter/configs/model_configs/dsv3_fp4_tuned_fmoe.csv": "cu_num,token,model_dim\n304,1,7168\n",
        "aiter/configs/model_configs/dsv3_fp4_untuned_fmoe.csv": "cu_num,token,model_dim\n999,1,7168\n",
        "aiter/configs/untuned_fmoe.csv": "token,model_dim\n1,7168\n",
    }
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    public = version.split("+")[0]
    info = site / f"amd_aiter-{public}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {version}\n"
                                   "Requires-Dist: pybind11>=3.0.1\nRequires-Dist: pandas\n")
    (info / "top_level.txt").write_text("aiter\naiter_meta\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/METADATA,,\n")
    return site


def make_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


def without_site_packages(monkeypatch: pytest.MonkeyPatch, *front: Path) -> None:
    """sys.path without the venv's site-packages (hides the real amd-aiter), fakes in front."""
    kept = [p for p in sys.path if "site-packages" not in p]
    monkeypatch.setattr(sys, "path", [str(p) for p in front] + kept)


def test_fake_aiter_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = make_aiter(tmp_path / "site")
    make_dist(site, "flydsl", "0.1.7")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI355X] * 8))
    report = probe(refresh=True, try_import=True)
    info = report.aiter
    assert info is not None and "aiter" not in sys.modules
    assert info.version == "0.1.15.post3+rocm7.1" and info.version_file == "0.1.15.post3+rocm7.1"
    params = dict(info.fused_moe_params or ())
    assert params["hidden_pad"] == "0" and params["gate_mode"] == "'separated'" and "swiglu_limit" not in params
    assert info.gate_mode_enum is True
    assert info.asm_kernel_counts() == {"gfx950": 4, "gfx942": 1}
    assert {t.table for t in info.asm_tables if t.gfx == "gfx950"} == {
        "fmoe_bf16_pertokenMXfp4_g1u1_silu", "fmoe_stage1_bf16_pertokenFp8_g1u1"}
    assert info.tuned_cu_nums == (80, 256, 304)
    assert {t.path for t in info.tuned_files} == {"aiter/configs/tuned_fmoe.csv",
                                                  "aiter/configs/model_configs/dsv3_fp4_tuned_fmoe.csv"}
    feats = {f.name: f for f in info.features}
    # DB says swiglu_limit since 0.1.15; the files have no such param: the files win, with a note.
    assert not feats["swiglu_limit"].present and feats["swiglu_limit"].db and feats["swiglu_limit"].source == \
        "files:amd-aiter"
    assert any("swiglu_limit" in n and "trusting the files" in n for n in report.notes)
    assert feats["gate_mode"].present and feats["fused_moe_pads"].present and feats["flydsl_moe"].present
    assert feats["flydsl_pads"].present and feats["flydsl_pads"].source == "db"
    assert any("flydsl 0.1.7 does not satisfy" in n for n in report.notes)
    assert info.flydsl_requirement is not None and info.flydsl_requirement[0] == "==0.1.9.dev599"
    # The real import ran in a subprocess and failed there, not here.
    assert info.import_status == "error: RuntimeError: aiter must not be imported in-process"
    assert report.source("import:aiter").ok is False  # type: ignore[union-attr]

    caps = capabilities_from_probe(report)
    assert caps is not None
    assert caps.aiter_version == "0.1.15.post3+rocm7.1" and caps.source_of("aiter_version") == "files:amd-aiter"
    assert "gate_mode" in caps.aiter_features and "swiglu_limit" not in caps.aiter_features
    assert caps.aiter_catalog == frozenset({"gfx950:fmoe_bf16_pertokenMXfp4_g1u1_silu",
                                           "gfx950:fmoe_stage1_bf16_pertokenFp8_g1u1",
                                           "gfx942:fmoe_bf16_pertokenFp8_g1u1_silu"})
    assert caps.tuned_cu_nums == frozenset({80, 256, 304})
    assert caps.package("flydsl") == "0.1.7" and caps.package("amd-aiter") == "0.1.15.post3+rocm7.1"
    # An --aiter-version override takes features from the DB and drops the file catalogs.
    other = capabilities_from_probe(report, aiter_version="0.1.13.post1")
    assert other is not None and other.aiter_version == "0.1.13.post1" and other.source_of("aiter_version") == "flag"
    assert "gate_mode" not in other.aiter_features and other.aiter_catalog is None
    none = capabilities_from_probe(report, aiter_version="none")
    assert none is not None and none.aiter_version is None and none.why_unknown("aiter_version")

    doc = json.loads(render_probe(report, "json"))
    assert doc["aiter"]["version"] == {"value": "0.1.15.post3+rocm7.1", "source": "files:amd-aiter",
                                       "how": "amd-aiter dist metadata", "version_file": "0.1.15.post3+rocm7.1"}
    assert doc["aiter"]["features"]["swiglu_limit"] == {"present": False, "source": "files:amd-aiter", "db": True,
                                                        "evidence": "fused_moe(swiglu_limit=) in aiter/fused_moe.py"}
    assert doc["aiter"]["asm_kernels"]["by_arch"]["gfx950"]["kernels"] == 4
    assert doc["aiter"]["import"]["ok"] is False


def test_fused_moe_unparseable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = make_aiter(tmp_path / "site", "0.1.13.post1", fused_moe="def fused_moe(:\n")
    monkeypatch.syspath_prepend(str(site))
    info = probe(refresh=True).aiter
    assert info is not None and info.fused_moe_params is None
    assert "SyntaxError" in dict(info.unknown)["fused_moe_params"]
    feats = {f.name: f for f in info.features}
    assert feats["fused_moe_pads"].source == "db" and feats["fused_moe_pads"].present  # DB: since 0.1.10
    assert feats["flydsl_moe"].source == "files:amd-aiter"  # moe_kernels.py still tells


def test_only_unrelated_pypi_aiter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "aiter").mkdir(parents=True)
    (site / "aiter" / "__init__.py").write_text("raise RuntimeError('asyncio aiter must not be imported')\n")
    make_dist(site, "aiter", "0.1.0")
    without_site_packages(monkeypatch, site)
    report = probe(refresh=True, try_import=True)
    assert report.aiter is None
    detail = report.source("files:amd-aiter").detail  # type: ignore[union-attr]
    assert "unrelated" in detail and "'aiter' 0.1.0" in detail
    assert report.source("import:aiter").detail.startswith("not tried")  # type: ignore[union-attr]
    caps = capabilities_from_probe(report)
    assert caps is None  # no GPU either
    monkeypatch.setenv("MOEDISPATCH_TARGET", "gfx942")
    caps = capabilities_from_probe(probe(refresh=True))
    assert caps is not None and caps.aiter_version is None and "unrelated" in (caps.why_unknown("aiter_version") or "")
    assert json.loads(render_probe(report, "json"))["aiter"]["installed"] is False


# -- output -----------------------------------------------------------------------------------------------------

def test_render_json_and_table(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    fake_rocminfo(isolated, [MI300X] * 2)
    report = probe(refresh=True)
    doc = json.loads(render_probe(report, "json"))
    assert doc["schema"] == "moedispatch.probe/1"
    assert set(doc) >= {"gpus", "sources", "aiter", "packages", "notes"}
    gpu = doc["gpus"][0]
    assert gpu["gfx"] == "gfx942" and gpu["gfx_raw"] == "gfx942" and gpu["provenance"]["gfx"] == "probe:rocminfo"
    assert "vram_mib" in gpu["unknown"]
    assert all(set(s) == {"name", "ok", "detail"} for s in doc["sources"])
    for name, entry in doc["packages"].items():
        assert ("source" in entry) != ("unknown" in entry), name
    table = render_probe(report, "table")
    assert "GPUs (2)" in table and "MI300X" in table and "Sources" in table and "Packages" in table
    with pytest.raises(ValueError):
        render_probe(report, "yaml")


def test_import_is_light() -> None:
    code = ("import sys, moedispatch.probe.system\n"
            "print(sorted(m for m in ('torch', 'amdsmi', 'aiter') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- integration with the real PyPI packages -------------------------------------------------------------------

REAL_AITER = "0.1.7.post2.dev18"


@pytest.mark.skipif(dist_version("amdsmi") is None or dist_version("amd-aiter") != REAL_AITER,
                    reason=f"needs PyPI amdsmi and amd-aiter=={REAL_AITER} installed")
@pytest.mark.skipif(any(os.path.exists(os.path.join(root, "lib", "libamd_smi.so"))
                        for root in {os.environ.get("ROCM_PATH") or "/opt/rocm", "/opt/rocm"}),
                    reason="ROCm's libamd_smi.so is present: amdsmi would work here")
def test_real_pypi_amdsmi_and_aiter(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(sys.modules, "amdsmi")  # let the real one import (and fail)
    report = probe(refresh=True, try_import=True)
    smi = report.source("amdsmi")
    assert smi is not None and not smi.ok
    assert "KeyError" in smi.detail and "libamd_smi.so" in smi.detail
    info = report.aiter
    assert info is not None and info.version == REAL_AITER and info.distribution == "amd-aiter"
    names = [n for n, _ in info.fused_moe_params or ()]
    assert {"hidden_pad", "intermediate_pad", "bias1", "bias2"} <= set(names) and "gate_mode" not in names
    counts = info.asm_kernel_counts()
    assert counts.get("gfx942", 0) > 0 and counts.get("gfx950", 0) > 0
    assert info.asm_root is not None and info.asm_root.endswith("aiter_meta/hsa")
    assert info.tuned_cu_nums == (80, 256)
    assert info.import_status is not None and info.import_status.startswith("error: ")
    assert len(info.import_status) > len("error: ")
    # Files say fused_moe has pads although the DB floor is 0.1.10: trusted, noted.
    assert any("fused_moe_pads" in n and "trusting the files" in n for n in report.notes)
    doc = json.loads(render_probe(report, "json"))
    assert doc["packages"]["amdsmi"]["version"] == dist_version("amdsmi")
    assert capfd.readouterr().out == ""


def test_visible_devices_odd_values_do_not_discard_the_probe() -> None:
    """Unicode digits stop parsing like any invalid entry; repeated indices count once (HIP semantics, [U])."""
    from moedispatch.probe.gpu import parse_visible

    assert parse_visible("²") == ([], None)
    assert parse_visible("0,0,1") == ([0, 1], None)
    assert parse_visible("1,x,2") == ([1], None)


def test_malformed_installed_tuned_csv_is_a_probe_warning_with_file_and_line(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    """Issue 12: a malformed row in the installed AITER's tuned CSV is reported by the probe naming file and line
    (AITER's merge would choke on it; moedispatch's dispatch model falls back to heuristics for it)."""
    site = make_aiter(tmp_path / "site")
    import moedispatch.data.aiter_configs as ac
    from moedispatch.data import aiter_install

    header = ("cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
              "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw\n")
    good = ("80,4,2304,1536,8,2,ActivationType.Silu,torch.bfloat16,torch.bfloat16,torch.bfloat16,QuantType.No,1,0,"
            "32,0,10.0,k1,0%,10.0,k2,0%,20.0,0,1.0,1.0\n")
    (site / "aiter/configs/tuned_fmoe.csv").write_text(header + good + "80,not-a-number,2304\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(aiter_install, "_installed_memo", {})
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([MI355X]))
    report = probe(refresh=True, try_import=False)
    problems = [n for n in report.aiter.notes if n.startswith("tuned CSV problem:")]
    assert any("aiter/configs/tuned_fmoe.csv:3:" in n for n in problems), report.aiter.notes


def test_probe_reports_the_versions_that_decide_what_runs(tmp_path, monkeypatch):
    """Newcomer minor 15: probe lacked ROCm, driver, kernel, OS, Python and moedispatch versions (vllm collect-env
    reports them). ROCm's own version file is read under ROCM_PATH; what cannot be read is null with the reason."""
    import platform

    from moedispatch.probe.system import system_versions

    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("7.1.0-42\n")
    got = system_versions({"ROCM_PATH": str(tmp_path)})
    assert got["rocm"] == "7.1.0-42" and got["python"] == platform.python_version()
    assert got["kernel"] == platform.release() and got["os"] == platform.platform()
    assert "rocm" not in got.get("unknown", {})
    missing = system_versions({"ROCM_PATH": str(tmp_path / "nope")})
    assert missing["rocm"] is None and "nope" in missing["unknown"]["rocm"]
