"""lint: vLLM's Ray data-parallel actors do not see AITER/GPTOSS variables exported on the head node (issue 25).

capability_db/engines.toml ``[vllm.ray_env]`` (vllm-project/vllm@v0.33.0:vllm/ray/ray_env.py get_env_vars_to_copy;
tests/peers/test_vllm_ray_env.py checks it against the real function). MiniMax-M3-MXFP4 TP8 keeps 384/rank only with
GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0: a remote DP rank without it decodes on CK-Tile at 384 (ROCm/aiter#5233).
"""

from __future__ import annotations

import json

import pytest

LAUNCH = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8", "--data-parallel-size", "2",
          "--moe-backend", "aiter"]
CHECK = ["--target", "MI355X", "--aiter-version", "0.1.20.post1", "--format", "json"]


def _lint(cli, *env, ray=True):
    args = ["lint", *CHECK, "--", "env", "VLLM_ROCM_USE_AITER=1", *env, *LAUNCH]
    if ray:
        args += ["--data-parallel-backend", "ray"]
    proc = cli(*args)
    return proc, json.loads(proc.stdout)


def _ray(doc):
    return [f for f in doc["findings"] if f["message"].startswith("--data-parallel-backend ray:")]


def test_a_switch_the_plan_needs_that_ray_will_not_copy_is_an_error(cli):
    proc, doc = _lint(cli, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0")
    (f,) = _ray(doc)
    assert proc.returncode == 3 and f["severity"] == "error"
    assert "GPTOSS_SWIGLU_MXFP4_BF16_BOUND (the plan assumed it)" in f["message"]
    assert f["fix"] == "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_"
    assert "vllm/ray/ray_env.py" in f["source"]


@pytest.mark.parametrize("env", [
    ["GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_"],
    ["GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY=GPTOSS_SWIGLU_MXFP4_BF16_BOUND"],
])
def test_the_extra_copy_variables_fix_it(cli, env):
    proc, doc = _lint(cli, *env)
    assert not _ray(doc)


def test_without_the_ray_backend_nothing_is_said(cli):
    proc, doc = _lint(cli, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", ray=False)
    assert not _ray(doc)


def test_every_lost_variable_is_named_and_its_prefix_added_to_the_fix(cli):
    """The plan assumes every AITER variable of the launch (the recipe exports them): each lost one is named and the
    fix keeps the prefixes the user already copies."""
    proc, doc = _lint(cli, "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0", "AITER_LOG_MORE=1")
    (f,) = _ray(doc)
    assert f["severity"] == "error" and "AITER_LOG_MORE (the plan assumed it)" in f["message"]
    assert f["fix"] == "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=AITER_,GPTOSS_"
    proc, doc = _lint(cli, "AITER_LOG_MORE=1", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0",
                      "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_")
    (f,) = _ray(doc)
    assert "GPTOSS_" not in f["message"].split("from this shell:")[1]
    assert f["fix"] == "export VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=GPTOSS_,AITER_"
