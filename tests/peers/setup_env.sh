#!/usr/bin/env bash
# Build .peers-venv: the real vLLM 0.33.0 and SGLang 0.5.23 Python packages (no GPU code) next to the CPU torch, for
# the tests that check moedispatch against the engines' own code (argument parsers; MoE oracles).
# Never the project's .venv, never a torch other than the pinned CPU wheel: the engines are installed --no-deps and
# only the pure-Python modules their CLI / oracle import chains need are added.
# Usage: tests/peers/setup_env.sh [VENV]   (default: .peers-venv at the repository root; idempotent)
set -euo pipefail
cd "$(dirname "$0")/../.."
V="${1:-.peers-venv}"
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import vllm, sglang, compressed_tensors, gguf" 2>/dev/null; then
  "$V/bin/python" -c "import ray, pytest" 2>/dev/null || "$V/bin/python" -m pip install -q "ray==2.60.*" "pytest>=7"
  echo "$V: ready"; exit 0
fi
python3 -m venv "$V"
P="$V/bin/python -m pip install -q"
$P --upgrade pip
$P torch==2.13.0                       # the CPU wheel; vLLM pins 2.14.0, so never let pip resolve the engines' deps
$P --no-deps vllm==0.33.0 sglang==0.5.23
# vLLM 0.33.0: the modules vllm.engine.arg_utils / the fused_moe oracles import (pins follow its Requires-Dist).
$P psutil numpy pyzmq urllib3 regex pydantic cbor2 "transformers==5.20.2" aiohttp requests openai_harmony openai \
   pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client "fastapi==0.136.3" \
   partial_json_parser "llguidance==1.7.6" einops
$P --no-deps "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11"   # xgrammar would otherwise pull triton
# SGLang 0.5.23: sglang.srt.server_args imports these.
$P orjson tqdm dill sentencepiece loguru ipython
$P --no-deps triton==3.8.0                # sglang.srt.utils.common imports triton unconditionally (it does not touch torch)
# SGLang 0.5.23's MoE quantization package (tests/peers/sglang_side.py): its import chain needs these two.
$P gguf
$P --no-deps compressed-tensors==0.18.0   # --no-deps: it would otherwise pull a CUDA torch
$P -e .
# moedispatch[ray] (same pin as pyproject.toml) and pytest: tests/peers/test_fleet_ray.py runs IN this venv (a real
# 3-raylet local cluster: `.peers-venv/bin/python -m pytest -q tests/peers/test_fleet_ray.py`).
$P "ray==2.60.*" "pytest>=7"
"$V/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$V: ready"
