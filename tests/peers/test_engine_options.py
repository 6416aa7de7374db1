"""capability_db/engines/options.json is what the real engines' argument parsers accept: rebuilt in .peers-venv
(vLLM 0.33.0, SGLang 0.5.23) by scripts/build_engine_options.py and compared byte for byte."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".peers-venv" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PEERS.exists(), reason="no .peers-venv (tests/peers/setup_env.sh builds it)")


def test_engine_options_rebuild_identically():
    proc = subprocess.run([str(PEERS), str(ROOT / "scripts" / "build_engine_options.py"), "--check"],
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
