#!/usr/bin/env bash
# Build .aiter-peer-venv: CPU torch + the pure-Python packages AITER's fused-MoE dispatch imports (pandas, pybind11,
# packaging, …) + moedispatch itself, for tests/peers/test_aiter_peers.py, which runs AITER's REAL
# aiter/fused_moe.py dispatch against moedispatch's model. AITER itself is never installed: its source is extracted
# at run time from a ROCm/aiter git directory into an ignored scratch folder (tests/peers/aiter/aiter_src.py).
# Then the stand-in `module_aiter_core` (a pybind11 module declaring AITER's enums, generated from that commit's
# csrc/include headers) is compiled for the default AITER source into .aiter-peer-build/.
# Never the project's .venv, never a torch other than the pinned CPU wheel.
# Usage: tests/peers/aiter/setup_env.sh [VENV]   (default: .aiter-peer-venv at the repository root; idempotent)
#   MOEDISPATCH_AITER_SRC=<ROCm/aiter checkout or git dir>  (default: /work/.mirror/ROCm+aiter/repo when present)
set -euo pipefail
cd "$(dirname "$0")/../../.."
V="${1:-.aiter-peer-venv}"
ready() {
  "$V/bin/python" - <<'PY' 2>/dev/null
import torch, pandas, pybind11, packaging, moedispatch, structlog, pluggy, triton, psutil, einops
assert torch.__version__.startswith("2.13.0"), torch.__version__
PY
}
if [ -x "$V/bin/python" ] && ready; then
  echo "$V: packages ready"
else
  python3 -m venv "$V"
  P="$V/bin/python -m pip install -q"
  $P --upgrade pip
  $P torch==2.13.0                     # the CPU wheel on disk; nothing below may replace it
  # AITER's requirements.txt pins (pandas 3.0.3 / pybind11 3.0.4 at e4048607); psutil/einops are imported by a few
  # AITER modules on the fused_moe import chain.
  $P "pandas==3.0.3" "pybind11==3.0.4" packaging psutil einops
  $P --no-deps triton==3.8.0           # imported (never run) by aiter/utility/fp4_utils.py on the fused_moe import chain
  $P pluggy structlog                  # moedispatch's own dependencies (installed --no-deps below)
  $P --no-deps -e .
  "$V/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
fi
# The stand-in enum module for the default AITER source (other commits are built on demand, cached by header hash).
"$V/bin/python" tests/peers/aiter/aiter_src.py prepare || echo "note: no AITER source found; module_aiter_core is built on first use"
echo "$V: ready"
