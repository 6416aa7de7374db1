"""Shared fixtures: simulated targets from capability_db, the built-in backends, a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moedispatch.capdb import target_capabilities
from moedispatch.plugins import build_registry, reset_registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    """No test sees the developer's plugin env vars or a target override; each starts with a fresh registry."""
    for var in ("MOEDISPATCH_LOAD_PLUGINS", "MOEDISPATCH_DISABLE_PLUGINS", "MOEDISPATCH_TARGET"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def caps():
    """caps(target, aiter) -> Capabilities of a simulated target."""
    return target_capabilities


@pytest.fixture(scope="session")
def builtins():
    """The five built-in backends, loaded through their entry points."""
    registry = build_registry()
    assert not registry.errors, registry.errors
    return registry.backends


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the installed console script as a user would."""
    exe = Path(sys.executable).with_name("moedispatch")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moedispatch.cli"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    full_env.update(env or {})
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=full_env, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def explain_schema():
    return json.loads((ROOT / "docs" / "explain.schema.json").read_text())
