"""Stand-in for AMD's ``amdsmi`` (our own code, not AMD's): one GPU whose gfx target is ``$PEERS_GFX``.

vLLM 0.33.0 decides "this is ROCm" and derives its arch flags (``on_gfx950()``, ``supports_mx()``, the fp8 flavour)
from exactly these calls (vllm/platforms/__init__.py ``rocm_platform_plugin``, vllm/platforms/rocm.py
``_query_gcn_arch_from_amdsmi``), so the real oracles run as they would on that GPU. No hardware is touched.
"""

import enum
import os


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    pass


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiInitFlags(enum.IntEnum):
    INIT_AMD_GPUS = 2


_PRODUCTS = {"gfx942": ("AMD Instinct MI300X", 192), "gfx950": ("AMD Instinct MI355X", 288)}


def _gfx() -> str:
    gfx = os.environ.get("PEERS_GFX")
    if not gfx:
        raise AmdSmiLibraryException("stub amdsmi: set PEERS_GFX to the simulated gfx target")
    return gfx


def amdsmi_init(*_args, **_kwargs):
    return None


def amdsmi_shut_down(*_args, **_kwargs):
    return None


def amdsmi_get_processor_handles():
    return ["stub-gpu-0"]


def amdsmi_get_gpu_asic_info(_handle):
    gfx = _gfx()
    name = _PRODUCTS.get(gfx, ("AMD Instinct (simulated)", 192))[0]
    return {"market_name": name, "target_graphics_version": gfx, "device_id": "0x0", "vendor_id": "0x1002",
            "num_compute_units": 256 if gfx == "gfx950" else 304}


def amdsmi_get_gpu_device_uuid(_handle):
    return "00000000-0000-0000-0000-000000000000"


def amdsmi_get_gpu_memory_total(_handle, _kind=None):
    gfx = _gfx()
    return _PRODUCTS.get(gfx, ("", 192))[1] * 1024 ** 3


def amdsmi_get_gpu_board_info(_handle):
    return {"product_name": amdsmi_get_gpu_asic_info(_handle)["market_name"]}


def amdsmi_topo_get_link_type(_a, _b):
    return {"hops": 1, "type": 2}


def amdsmi_topo_get_numa_node_number(_handle):
    return 0


def amdsmi_get_gpu_kfd_info(_handle):
    return {"kfd_id": 0, "node_id": 0}
