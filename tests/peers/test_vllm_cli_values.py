"""capability_db/engines/vllm.toml against the real vLLM 0.33.0 (in the engine environment, tests/peers/peers.py):
``moe_backend_values`` is exactly what ``vllm serve --moe-backend`` accepts, and each expert class's ``activations``
are the activations its ``_supports_activation`` accepts (among the gated ones the table models); and the pads vLLM
hands AITER (moedispatch.engines.recipes.vllm_kernel_pads) are its own ``aiter_moe_pads``'."""

from __future__ import annotations

import json
import subprocess

import pytest

from moedispatch.data import capdb
from peers import has_vllm, peers_python

PY = peers_python()
pytestmark = pytest.mark.skipif(PY is None or not has_vllm(PY), reason="no engine environment with vLLM")

_SIDE = r"""
import importlib, json, sys
import vllm.platforms as P
from vllm.platforms.cpu import CpuPlatform
P._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
mods = json.loads(sys.argv[1])
choices = sorted(make_arg_parser(FlexibleArgumentParser())._option_string_actions["--moe-backend"].choices)
acts = {}
for name, mod in mods.items():
    cls = getattr(importlib.import_module("vllm.model_executor.layers.fused_moe.experts." + mod), name)
    acts[name] = [a.value for a in MoEActivation if cls._supports_activation(a)]
from vllm.model_executor.layers.fused_moe.experts.rocm_aiter_moe import aiter_moe_pads
pads = [[h, i, a, w, tp, list(aiter_moe_pads(h, i, MoEActivation(a), w, tp))]
        for h in (0, 64, 128, 192, 320) for i in (0, 32, 64, 96, 192, 320)
        for a in ("silu", "gelu", "situ", "swigluoai", "swigluoai_uninterleave") for w in (True, False)
        for tp in (1, 2, 8)]
print(json.dumps({"choices": choices, "acts": acts, "pads": pads}))
"""

#: Expert class → its module under vllm/model_executor/layers/fused_moe/experts/. AiterMxfp8Experts is left out: its
#: is_supported_config narrows the inherited _supports_activation (SiLU / SwiGLU-OAI uninterleaved only).
MODULES = {
    "AiterUnquantizedExperts": "rocm_aiter_moe", "AiterFp8BlockExperts": "rocm_aiter_moe",
    "AiterFp8TensorExperts": "rocm_aiter_moe", "AiterFp8ChannelExperts": "rocm_aiter_moe",
    "AiterMxfp4Experts": "rocm_aiter_moe", "TritonExperts": "triton_moe", "BatchedTritonExperts": "fused_batched_moe",
    "AiterW4A16ExpertsMonolithic": "aiter_mxfp4_w4a16_moe", "AiterW4A8ExpertsMonolithic": "aiter_mxfp4_w4a8_moe",
    "AiterW4A4ExpertsMonolithic": "aiter_mxfp4_w4a4_moe",
    "OAITritonMxfp4ExpertsMonolithic": "gpt_oss_triton_kernels_moe", "OAITritonExperts": "gpt_oss_triton_kernels_moe",
    "UnfusedOAITritonExperts": "gpt_oss_triton_kernels_moe",
    "OCP_MXQuantizationEmulationTritonExperts": "ocp_mx_emulation_moe",
    "Mxfp8NativeTritonExperts": "mxfp8_native_moe", "Mxfp8EmulationTritonExperts": "mxfp8_emulation_moe",
}


@pytest.fixture(scope="module")
def real():
    proc = subprocess.run([PY, "-c", _SIDE, json.dumps(MODULES)], capture_output=True, text=True, timeout=600,
                          cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_moe_backend_values_are_the_parsers_choices(real):
    doc = capdb.load_toml("engines/vllm.toml")
    assert sorted(doc["moe_backend_values"]) == real["choices"]


def test_class_activations_are_what_the_classes_accept(real):
    doc = capdb.load_toml("engines/vllm.toml")
    modelled = {a for oracle in doc["backend"].values() for b in oracle.values() for c in b["classes"]
                for a in c["activations"]}
    seen = set()
    for oracle, backends in doc["backend"].items():
        for name, b in backends.items():
            for c in b["classes"]:
                if c["name"] not in MODULES:
                    continue
                seen.add(c["name"])
                want = sorted(a for a in real["acts"][c["name"]] if a in modelled)
                assert sorted(c["activations"]) == want, (oracle, name, c["name"])
    assert seen == set(MODULES)


def test_kernel_pads_are_vllms_aiter_moe_pads(real):
    from moedispatch.engines.recipes import vllm_kernel_pads

    wrong = [(h, i, a, w, tp, want, got) for h, i, a, w, tp, want in real["pads"]
             if list(got := vllm_kernel_pads(h, i, a, w, tp, "0.33.0")) != want]
    assert not wrong and len(real["pads"]) == 900, wrong[:5]
