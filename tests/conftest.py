"""Shared fixtures: simulated targets from capability_db, the built-in backends, a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moedispatch.data.capdb import target_capabilities
from moedispatch.selector.plugins import build_registry, reset_registry

ROOT = Path(__file__).resolve().parents[1]
#: AITER's release data (``../shared/aiter/<tag>/…``, byte for byte, with manifest.toml), beside the repository as CI
#: lays it out; ``MOEDISPATCH_AITER_DATA`` points elsewhere. The project ships only what it derives from it.
SHARED_AITER = Path(os.environ.get("MOEDISPATCH_AITER_DATA") or ROOT.parent / "shared" / "aiter")


@pytest.fixture(scope="session")
def shared_aiter() -> Path:
    """The per-release AITER data folder; tests that read AITER's own files skip (saying why) without it."""
    if not (SHARED_AITER / "manifest.toml").is_file():
        pytest.skip(f"AITER release data not found at {SHARED_AITER} (set MOEDISPATCH_AITER_DATA)")
    return SHARED_AITER


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




def _package_dir(*candidates: Path) -> Path:
    return next((p for p in candidates if (p / "__init__.py").is_file()), candidates[0])


#: The packages of the tree under test (pyproject.toml [tool.setuptools.package-dir]); a copy laid out as the wheel
#: (benchmarks/mutation.py's scratch tree: moedispatch_plugins/, moedispatch/capability_db/) works too.
TREE_PACKAGES = {
    "moedispatch": ROOT / "moedispatch",
    "moedispatch_plugins": _package_dir(ROOT / "plugins", ROOT / "moedispatch_plugins"),
    "moedispatch.capability_db": _package_dir(ROOT / "capability_db", ROOT / "moedispatch" / "capability_db"),
}

# A fresh interpreter that imports the three packages from THIS checkout (a finder ahead of every other, so neither
# an editable install of another checkout nor a wheel in site-packages can answer), then does exactly what the
# `moedispatch` console script does: `sys.exit(moedispatch.cli.main())` with argv[0] "moedispatch".
_TREE_BOOT = """\
import importlib.util, sys
_MAP = {name: path for name, path in zip(sys.argv[1].split(","), sys.argv[2].split(","))}
del sys.argv[1:3]


class _TreeUnderTest:
    @staticmethod
    def find_spec(name, path=None, target=None):
        where = _MAP.get(name)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(name, where + "/__init__.py",
                                                      submodule_search_locations=[where])


sys.meta_path.insert(0, _TreeUnderTest)
"""
_CONSOLE_SCRIPT = """\
sys.argv[0] = "moedispatch"
from moedispatch.cli import main
sys.exit(main())
"""


def tree_python(code: str) -> list[str]:
    """argv running ``code`` in a fresh interpreter that imports moedispatch from the tree under test."""
    return [sys.executable, "-c", _TREE_BOOT + code, ",".join(TREE_PACKAGES),
            ",".join(str(p) for p in TREE_PACKAGES.values())]


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the console script's entry point (``moedispatch.cli:main``) as a user would, on the tree under test."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}
    # The test venv has the PyPI amd-aiter 0.1.7 installed (for the probe's tests); the CLI would plan for it by
    # default. Tests plan for capability_db's newest AITER unless they say otherwise (env={"MOEDISPATCH_AITER_VERSION":
    # ""} gives the installed-AITER default back).
    full_env["MOEDISPATCH_AITER_VERSION"] = "default"
    full_env.update(env or {})
    return subprocess.run(tree_python(_CONSOLE_SCRIPT) + list(args), capture_output=True, text=True, env=full_env,
                          timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def explain_schema():
    return json.loads((ROOT / "docs" / "explain.schema.json").read_text())
