"""The example out-of-tree plugin, installed for real (pip --target) and driven through the installed CLI.

Covers what a user sees: ``moedispatch backends`` lists the plugin with its distribution, version and hooks;
``explain`` picks it where its preference wins and says why it is not used elsewhere; uninstalled it is gone; a
plugin that fails at import is reported without breaking ``explain``; the allow/deny env lists apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "plugins" / "examples" / "moedispatch-acme"
BROKEN_ERROR = "import failed: RuntimeError: moedispatch-broken: licence server unreachable"


def _pip_install(source: Path, target: Path) -> None:
    """Install one distribution into ``target`` with the venv's pip and setuptools: offline, no build isolation."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> dict[str, Path]:
    """Two scratch site dirs: the example package (built from a copy, so the repo gets no build/ or egg-info),
    and a second plugin whose module raises at import."""
    base = tmp_path_factory.mktemp("plugin-sites")
    src = base / "src" / "moedispatch-acme"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip_install(src, base / "acme")

    broken = base / "src" / "moedispatch-broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "moedispatch-broken"
        version = "0.0.1"

        [project.entry-points."moedispatch.backends"]
        broken-moe = "moedispatch_broken"

        [tool.setuptools]
        py-modules = ["moedispatch_broken"]
    """))
    (broken / "moedispatch_broken.py").write_text(
        'raise RuntimeError("moedispatch-broken: licence server unreachable")\n')
    _pip_install(broken, base / "broken")
    return {"acme": base / "acme", "broken": base / "broken"}


def _run(cli, *args: str, paths=(), env=None) -> subprocess.CompletedProcess:
    full_env = {"PYTHONPATH": os.pathsep.join(str(p) for p in paths)} if paths else {"PYTHONPATH": ""}
    full_env.update(env or {})
    return cli(*args, env=full_env)


def _json(done: subprocess.CompletedProcess, code: int = 0) -> dict:
    assert done.returncode == code, done.stderr
    return json.loads(done.stdout)


def _moe_layers(plan: dict) -> list[dict]:
    layers = [la for la in plan["layers"] if la["kind"] == "moe"]
    assert layers
    return layers


def _rejection(layer: dict, backend: str) -> list[str]:
    return next(r["reasons"] for r in layer["rejected"] if r["backend"] == backend)


# -- installed ---------------------------------------------------------------------------------------------------

def test_backends_json_lists_the_installed_plugin(cli, site):
    """The plugin's record has its entry-point name, distribution, version, hooks and backends, and no errors."""
    data = _json(_run(cli, "backends", "--format", "json", paths=[site["acme"]]))
    record = next(p for p in data["plugins"] if p["name"] == "acme-moe")
    assert record == {"name": "acme-moe", "package": "moedispatch-acme", "version": "0.1.0",
                      "hooks": ["register_backends"], "backends": ["acme-moe"], "errors": [], "builtin": False}
    row = next(b for b in data["backends"] if b["name"] == "acme-moe")
    assert (row["preference"], row["family"], row["plugin"]) == (90, "acme", "acme-moe")
    assert data["backends"][0]["name"] == "acme-moe"  # listed by preference, highest first


def test_backends_table_shows_the_distribution(cli, site):
    """The table names the plugin's distribution and version next to the built-ins."""
    done = _run(cli, "backends", paths=[site["acme"]])
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("acme-moe") and "moedispatch-acme" in ln)
    assert "0.1.0" in line and line.rstrip().endswith("ok")


def test_explain_selects_the_plugin_for_bf16_moe_layers(cli, site):
    """Mixtral (bf16) on gfx942: acme-moe's preference 90 beats aiter-ck's 80 on every MoE layer."""
    plan = _json(_run(cli, "explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json",
                      paths=[site["acme"]]))
    for la in _moe_layers(plan):
        assert la["backend"] == "acme-moe"
        assert la["reasons"][0].startswith("acme-moe: correct for this layer, highest preference (90)")
        assert _rejection(la, "aiter-ck")[0] == "supported, outranked by acme-moe (preference 90 > 80)"
    assert not any("plugin error" in w for w in plan["warnings"])


def test_explain_uses_the_plugins_padding_plan(cli, site):
    """Qwen3-30B-A3B at TP 8 has 96 intermediate per rank: acme-moe pads it to 128, zero-filled."""
    plan = _json(_run(cli, "explain", "--model", "Qwen3-30B-A3B", "--target", "gfx950", "--tp", "8",
                      "--format", "json", paths=[site["acme"]]))
    layer = _moe_layers(plan)[0]
    assert layer["backend"] == "acme-moe"
    assert layer["padding"] == {"hidden": 2048, "intermediate_per_rank": 128, "hidden_pad": 0,
                                "intermediate_pad": 32, "kernel_hidden_pad": 0, "kernel_intermediate_pad": 32,
                                "zero_fill": True, "pad_semantics": "compute"}
    assert any("multiple of 128" in r for r in layer["reasons"])


def test_quantized_model_does_not_use_the_plugin_and_says_why(cli, site):
    """DeepSeek-V3 (fp8) keeps a built-in; acme-moe is listed with its specific rejection."""
    plan = _json(_run(cli, "explain", "--model", "DeepSeek-V3", "--target", "gfx942", "--format", "json",
                      paths=[site["acme"]]))
    for la in _moe_layers(plan):
        assert la["backend"] != "acme-moe"
        reasons = _rejection(la, "acme-moe")
        assert any(r.startswith("acme-moe runs bf16 weights × bf16 activations only; layer has weights fp8")
                   for r in reasons)


def test_uninstalled_the_plugin_is_gone(cli, site):
    """Without the plugin on the path it is neither listed nor importable, and the built-ins decide."""
    data = _json(_run(cli, "backends", "--format", "json"))
    assert "acme-moe" not in {p["name"] for p in data["plugins"]} | {b["name"] for b in data["backends"]}
    plan = _json(_run(cli, "explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json"))
    assert {la["backend"] for la in _moe_layers(plan)} == {"aiter-ck"}
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('moedispatch_acme'))"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}, timeout=60)
    assert probe.stdout.strip() == "None"


# -- a plugin that fails at import -------------------------------------------------------------------------------

def test_plugin_failing_at_import_is_listed_with_its_error(cli, site):
    """The broken plugin is a row with its distribution and error; the healthy plugin still loads."""
    data = _json(_run(cli, "backends", "--format", "json", paths=[site["acme"], site["broken"]]))
    records = {p["name"]: p for p in data["plugins"]}
    assert records["broken-moe"] == {"name": "broken-moe", "package": "moedispatch-broken", "version": "0.0.1",
                                     "hooks": [], "backends": [], "errors": [BROKEN_ERROR], "builtin": False}
    assert records["acme-moe"]["errors"] == [] and "acme-moe" in {b["name"] for b in data["backends"]}
    table = _run(cli, "backends", paths=[site["acme"], site["broken"]])
    assert table.returncode == 0
    assert any("broken-moe" in ln and "ERROR: " + BROKEN_ERROR in ln for ln in table.stdout.splitlines())


def test_plugin_failing_at_import_does_not_break_explain(cli, site):
    """explain exits 0, warns with the plugin's name and error, and still selects; --strict-plugins exits 2."""
    args = ("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json")
    plan = _json(_run(cli, *args, paths=[site["acme"], site["broken"]]))
    assert f"plugin error: broken-moe: {BROKEN_ERROR}" in plan["warnings"]
    assert {la["backend"] for la in _moe_layers(plan)} == {"acme-moe"}
    strict = _run(cli, *args, "--strict-plugins", paths=[site["acme"], site["broken"]])
    assert strict.returncode == 2 and json.loads(strict.stdout)["schema"] == "moedispatch.error/1"
    assert "licence server unreachable" in strict.stderr and "Traceback" not in strict.stderr


# -- allow/deny lists --------------------------------------------------------------------------------------------

def test_disable_plugins_switches_it_off(cli, site):
    """MOEDISPATCH_DISABLE_PLUGINS=acme-moe: installed but not loaded; the built-ins decide again."""
    env = {"MOEDISPATCH_DISABLE_PLUGINS": "acme-moe"}
    data = _json(_run(cli, "backends", "--format", "json", paths=[site["acme"]], env=env))
    assert "acme-moe" not in {p["name"] for p in data["plugins"]} | {b["name"] for b in data["backends"]}
    plan = _json(_run(cli, "explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json",
                      paths=[site["acme"]], env=env))
    assert {la["backend"] for la in _moe_layers(plan)} == {"aiter-ck"}


def test_load_plugins_allow_list(cli, site):
    """MOEDISPATCH_LOAD_PLUGINS keeps only the named plugins; with acme-moe alone an fp8 model has no backend."""
    env = {"MOEDISPATCH_LOAD_PLUGINS": "acme-moe,emulation"}
    data = _json(_run(cli, "backends", "--format", "json", paths=[site["acme"], site["broken"]], env=env))
    assert {b["name"] for b in data["backends"]} == {"acme-moe", "emulation"}
    assert {p["name"] for p in data["plugins"]} == {"acme-moe", "emulation"}  # the broken one is not even imported

    only = {"MOEDISPATCH_LOAD_PLUGINS": "acme-moe"}
    done = _run(cli, "explain", "--model", "DeepSeek-V3", "--target", "gfx942", "--format", "json",
                paths=[site["acme"]], env=only)
    plan = _json(done, code=3)
    layer = _moe_layers(plan)[0]
    assert layer["backend"] is None and [r["backend"] for r in layer["rejected"]] == ["acme-moe"]
    assert "bf16 weights × bf16 activations only" in done.stderr


# -- packaging ---------------------------------------------------------------------------------------------------

def test_example_is_not_part_of_the_main_distribution():
    """The main pyproject lists its packages explicitly; nothing under plugins/examples is one of them, and the
    installed moedispatch distribution ships no example file (uninstalled, moedispatch_acme is not importable:
    test_uninstalled_the_plugin_is_gone)."""
    import importlib.metadata as md

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert isinstance(config["packages"], list)
    assert not any("example" in p or "acme" in p for p in config["packages"])
    assert all(not d.startswith("plugins/") for d in config.get("package-dir", {}).values() if d != "plugins")
    files = [str(f) for f in (md.files("moedispatch") or [])]
    assert not any("acme" in f or "examples" in f for f in files)
