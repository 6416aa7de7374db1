"""capability_db/engines.toml ``[vllm.ray_env]`` against vLLM 0.33.0's REAL ``get_env_vars_to_copy`` (.peers-venv;
skipped when absent): the default prefixes and names, the two extra-copy variables, and — for a recipe's environment
— exactly which AITER/GPTOSS variables reach the Ray data-parallel actors."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import peers
from moedispatch.data import capdb

_PROBE = r"""
import json, os
from vllm.ray import ray_env as r
os.environ.update(ENV)
print("@@" + json.dumps({"prefixes": sorted(r.DEFAULT_ENV_VAR_PREFIXES), "names": sorted(r.DEFAULT_EXTRA_ENV_VARS),
                         "copied": sorted(v for v in r.get_env_vars_to_copy() if v in ENV)}))
"""

CASES = [
    {"VLLM_ROCM_USE_AITER": "1", "AITER_BF16_FP8_MOE_BOUND": "0", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0"},
    {"VLLM_ROCM_USE_AITER": "1", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0", "AITER_LOG_MORE": "1",
     "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "GPTOSS_"},
    {"AITER_KSPLIT": "-1", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "AITER_KSPLIT"},
]


def _real(env: dict) -> dict:
    python = peers.peers_python()
    if python is None or not peers.has_vllm(python):
        pytest.skip("vLLM peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "AITER_", "GPTOSS_"))}
    clean.update(PEERS_GFX="gfx950", PYTHONPATH=str(peers.HERE / "stubs"))
    proc = subprocess.run([python, "-c", f"ENV = {env!r}\n" + _PROBE], capture_output=True, text=True, env=clean,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("@@"))[2:])


@pytest.mark.parametrize("env", CASES)
def test_what_reaches_the_ray_actors_is_what_moedispatch_says(env):
    ray = capdb.load_toml("engines.toml")["vllm"]["ray_env"]
    real = _real(env)
    assert real["prefixes"] == sorted(ray["prefixes"]) and real["names"] == sorted(ray["names"])
    extra_p = tuple(p for p in env.get(ray["extra_prefixes_env"], "").split(",") if p)
    extra_n = {n for n in env.get(ray["extra_names_env"], "").split(",") if n}
    ours = sorted(k for k in env if k.startswith(tuple(ray["prefixes"]) + extra_p) or k in set(ray["names"]) | extra_n)
    assert real["copied"] == ours
