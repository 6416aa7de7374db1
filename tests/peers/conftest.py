"""One run of the real engine oracles for the whole peer suite (two processes, one per gfx target)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402


@pytest.fixture(scope="session")
def vllm_oracle():
    """{"grid": (cases, answers), "recipes": (cases, meta, answers)} from the real vLLM 0.33.0."""
    py = peers.peers_python()
    if py is None or not peers.has_vllm(py):
        pytest.skip("vLLM peer environment absent (.peers-venv): run tests/peers/setup_env.sh")
    grid = peers.grid() + peers.forced_grid()
    rcases, meta = peers.recipe_cases()
    answers = peers.run_vllm(py, grid + rcases)
    return {"grid": (grid, answers[:len(grid)]), "recipes": (rcases, meta, answers[len(grid):])}


@pytest.fixture(scope="session")
def sglang_oracle():
    """(cases, answers) from the real SGLang 0.5.23 helpers (tests/peers/sglang_side.py)."""
    py = peers.peers_python()
    if py is None or not peers.has_sglang(py):
        pytest.skip("SGLang peer environment absent (.peers-venv with sglang): run tests/peers/setup_env.sh")
    cases = peers.sglang_grid()
    return cases, peers.run_sglang(py, cases)
