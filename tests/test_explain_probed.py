"""Issue 3: explain uses probed capabilities when a GPU is present and no --target / --aiter-version is given.

The GPUs come from a fake `rocminfo` on PATH (the real tool's agent format, models_hw.md §C.3).
"""

from __future__ import annotations

import json

from test_probe import fake_rocminfo

MI300X = {"gfx": "gfx942", "market": "AMD Instinct MI300X", "device_id": "0x74a1", "cus": 304}
MI355X = {"gfx": "gfx950", "market": "AMD Instinct MI355X", "device_id": "0x75a3", "cus": 256}


def _env(tmp_path, gpus):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_rocminfo(bindir, gpus)
    # Only the fake tool dir plus the system dirs: no real ROCm, no amdsmi library.
    return {"PATH": f"{bindir}:/usr/bin:/bin", "ROCM_PATH": str(tmp_path / "no-rocm"), "HOME": str(tmp_path)}


def test_probed_mi300x_node_drives_explain(cli, tmp_path):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--tp", "8", "--aiter-version", "0.1.15.post3",
               "--format", "json", env=_env(tmp_path, [MI300X] * 8))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["target"] == {"gfx": "gfx942", "product": "MI300X", "compute_units": 304,
                              "aiter_version": "0.1.15.post3", "source": "probe"}
    assert {la["backend"] for la in data["layers"] if la["kind"] == "moe"} == {"emulation"}
    assert not any("default target" in w for w in data["warnings"])


def test_mixed_arch_node_is_refused_not_silently_picked(cli, tmp_path):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--format", "json",
               env=_env(tmp_path, [MI300X, MI355X]))
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["schema"] == "moedispatch.error/1"  # errors are JSON under --format json
    assert "gfx942" in proc.stderr and "gfx950" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_flags_override_the_probe(cli, tmp_path):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950", "--format", "json",
               env=_env(tmp_path, [MI300X] * 8))
    assert json.loads(proc.stdout)["target"]["source"] == "flag"
