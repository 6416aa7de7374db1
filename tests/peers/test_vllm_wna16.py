"""The vLLM 0.33 WNA16 engine model (capability_db/engines/vllm.toml ``[oracle.wna16]``) against the REAL vLLM code,
run in its own environment (.peers-venv; skipped when absent — build it with tests/peers/setup_env.sh).

* ``map_wna16_backend`` itself answers every --moe-backend value: the mapped backend or its ValueError, which our
  refusal repeats word for word (Kimi-K2.5's ``--moe-backend aiter`` raises at start-up).
* compressed-tensors' own FlyDSL W4A16 gate (get_moe_method's ROCm branch) is read from the installed source: the
  conditions the model encodes (INT group 32, 4 bits, gfx950, moe_backend == "flydsl") are the ones there.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import peers
from moedispatch.data import capdb
from moedispatch.engines import choice as ec
from moedispatch.testing import fake_capabilities, layer

_PROBE = r"""
import inspect, json
from vllm.model_executor.layers.fused_moe.oracle import int_wna16 as w
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import compressed_tensors_moe as ct
out = {"map": {}, "gate": inspect.getsource(ct)}
for v in VALUES:
    try:
        out["map"][v] = w.map_wna16_backend(v).value
    except ValueError as e:
        out["map"][v] = "ValueError: " + str(e)
print("@@" + json.dumps(out))
"""

VALUES = ["triton", "marlin", "humming", "flashinfer_trtllm", "emulation", "rdna3", "aiter", "flydsl", "cutlass"]


@pytest.fixture(scope="module")
def real():
    python = peers.peers_python()
    if python is None or not peers.has_vllm(python):
        pytest.skip("vLLM peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    env = dict(os.environ, PEERS_GFX="gfx950", PYTHONPATH=str(peers.HERE / "stubs"))
    proc = subprocess.run([python, "-c", f"VALUES = {VALUES!r}\n" + _PROBE], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


def _int4():
    return layer(hidden_size=7168, intermediate_size=2048, num_experts=384, top_k=8, tp_size=8, weight_quant="int4",
                 weight_granularity="group32", activation_quant="bf16")


def test_every_moe_backend_value_maps_as_vllm_maps_it(real):
    model = capdb.load_toml("engines/vllm.toml")["oracle"]["wna16"]
    caps = fake_capabilities("MI355X", "0.1.20.post1")
    for value, theirs in real["map"].items():
        if value == "flydsl":
            continue  # compressed-tensors intercepts it before the oracle: the next test
        if theirs.startswith("ValueError"):
            assert value not in model["map"], value
            ours = ec.choice_for_layer(_int4(), caps, "vllm", "0.33.0", moe_backend=value, quant_method="gptq")
            assert not ours.ok and ours.error.startswith(theirs[len("ValueError: "):]), (value, ours.error)
        else:
            assert model["map"][value] == theirs, value


def test_the_flydsl_w4a16_gate_is_the_one_in_compressed_tensors(real):
    gate = real["gate"]
    fly = capdb.load_toml("engines/vllm.toml")["oracle"]["wna16"]["flydsl"]
    assert f'moe_backend == "{fly["value"]}"' in gate
    assert f"group_size == {fly['group']}" in gate and f"num_bits == {fly['bits']}" in gate
    assert "on_gfx950()" in gate and fly["gfx"] == ["gfx950"]
    assert fly["kernel_class"] in gate
    # and gptq (not compressed-tensors) never takes the FlyDSL method: the oracle's map has no flydsl
    caps = fake_capabilities("MI355X", "0.1.20.post1")
    assert not ec.choice_for_layer(_int4(), caps, "vllm", "0.33.0", moe_backend="flydsl", quant_method="gptq").ok
