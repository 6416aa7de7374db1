"""docs/plugins.md stays complete and correct: every hook documented and tested, every example runs (datasette style)."""

from __future__ import annotations

import re
import sys
import tomllib
import types
from pathlib import Path

import pluggy
import pytest

from moedispatch.core import hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
EXAMPLE_PKG = ROOT / "plugins" / "examples" / "moedispatch-acme"

_EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\s*\n```(?P<lang>\w+)\n(?P<code>.*?)\n```", re.DOTALL)


def _hooks() -> dict[str, tuple[str, ...]]:
    """Every hook the spec module declares, with its argument names, as pluggy sees them."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return {name: tuple(caller.spec.argnames) for name, caller in vars(pm.hook).items()
            if isinstance(caller, pluggy.HookCaller) and caller.spec is not None}


def _examples(name: str) -> list[str]:
    blocks = [m.group("code") for m in _EXAMPLE.finditer(DOC.read_text()) if m.group("name") == name]
    assert blocks, f"docs/plugins.md has no example marked <!-- example: {name} -->"
    return blocks


HOOKS = _hooks()


def test_the_spec_module_declares_hooks():
    """The meta-tests below are not vacuous: pluggy finds the hooks in moedispatch.core.hookspecs."""
    assert "register_backends" in HOOKS


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_every_hook_is_documented_with_its_exact_signature(hook):
    """Each hook has a ``## name(arg1, arg2)`` heading built from the spec's argnames (datasette test_docs.py)."""
    headings = re.findall(r"^## (.+?)\s*$", DOC.read_text(), re.MULTILINE)
    assert f"{hook}({', '.join(HOOKS[hook])})" in headings


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_every_hook_has_a_test_hook_function(hook):
    """Each hook has a ``test_hook_<name>`` somewhere in tests/ (datasette test_plugins.py)."""
    pattern = re.compile(rf"^\s*def test_hook_{hook}\b", re.MULTILINE)
    assert any(pattern.search(p.read_text()) for p in (ROOT / "tests").glob("test_*.py")), \
        f"no test_hook_{hook} in tests/"


def test_documented_hooks_exist():
    """No heading documents a hook that no longer exists (a renamed hook cannot leave a stale section)."""
    text = DOC.read_text()
    section = text.split("# Plugin hooks", 1)[1].split("\n# ", 1)[0]
    documented = re.findall(r"^## (\w+)\(", section, re.MULTILINE)
    assert documented and set(documented) <= set(HOOKS)


def test_reason_example_runs():
    """The Reason section's example (kinds, sources, confidence, pad_semantics from a plugin) executes as written."""
    (code,) = _examples("reason")
    exec(compile(code, f"{DOC}:reason", "exec"), types.ModuleType("plugins_md_reason").__dict__)


def test_register_backends_example_runs():
    """The hook section's example (define a backend, register it, select with it) executes as written."""
    module = types.ModuleType("plugins_md_example")
    for code in _examples("register_backends"):
        exec(compile(code, f"{DOC}:register_backends", "exec"), module.__dict__)
    assert module.HalfPrecisionMoE.name == "halfprec-moe"


def test_testing_example_runs(monkeypatch):
    """The "Testing a plugin" example is a real test module: each test (and parametrization) passes."""
    monkeypatch.syspath_prepend(str(EXAMPLE_PKG))
    (code,) = _examples("testing")
    namespace: dict = {"__name__": "plugins_md_testing_example"}
    exec(compile(code, f"{DOC}:testing", "exec"), namespace)
    tests = [(name, fn) for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert len(tests) == 3
    for name, fn in tests:
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        if not marks:
            fn()
            continue
        argnames, table = marks[0].args
        names = [a.strip() for a in argnames.split(",")]
        for row in table:
            fn(**dict(zip(names, row)))
    sys.modules.pop("moedispatch_acme", None)


def test_packaging_snippet_matches_the_example_package():
    """The documented pyproject entry-point table is the example package's, under the real group name."""
    (code,) = _examples("pyproject")
    doc = tomllib.loads(code)
    real = tomllib.loads((EXAMPLE_PKG / "pyproject.toml").read_text())
    assert list(doc["project"]["entry-points"]) == [hookspecs.ENTRY_POINT_GROUP]
    assert doc["project"]["entry-points"] == real["project"]["entry-points"]
    assert (doc["project"]["name"], doc["project"]["version"]) == (real["project"]["name"], real["project"]["version"])


def _first_cells(heading: str, until: str) -> list[list[str]]:
    """The identifiers in the first column of every table row between two headings."""
    text = DOC.read_text()
    section = text.split(heading, 1)[1].split(until, 1)[0]
    cells = [re.split(r"(?<!\\)\|", line)[1] for line in section.splitlines() if line.startswith("| `")]
    return [re.findall(r"`(\w+)", cell) for cell in cells]


def test_documented_attributes_exist():
    """Every name in the first column of the API tables is a real attribute (renames cannot leave stale docs)."""
    import dataclasses

    from moedispatch import Backend, Capabilities, MoELayer, Padding

    backend = {names[0] for names in _first_cells("\n## Backend\n", "\n## Reason\n")}
    assert backend == {"name", "preference", "description", "family", "reference_only", "check", "plan_padding"}
    assert all(hasattr(Backend, name) for name in backend)

    padding = [n for names in _first_cells("\n## Padding\n", "Constructors:") for n in names]
    assert set(padding) == {f.name for f in dataclasses.fields(Padding)}

    layer_doc, caps_doc = DOC.read_text().split("**`caps: moedispatch.Capabilities`**")
    layer_names = {n for names in _first_cells("**`layer: moedispatch.MoELayer`**", "**`QuantSpec`**") for n in names}
    assert layer_names == {f.name for f in dataclasses.fields(MoELayer)} | {"moe_tp", "param"}
    caps_names = {n for names in _first_cells("**`caps: moedispatch.Capabilities`**", "Helpers:") for n in names}
    caps_fields = {f.name for f in dataclasses.fields(Capabilities)}
    assert caps_names <= caps_fields | {"package", "why_unknown"} and caps_fields - {"gpus"} <= caps_names


def test_documented_builtin_preferences_are_the_real_ones():
    """The Backend table's list of built-in preferences matches what the built-ins declare."""
    from moedispatch.testing import builtin_plugins

    line = next(ln for ln in DOC.read_text().splitlines() if "Built-ins: `" in ln)
    documented = {name: int(pref) for name, pref in re.findall(r"`([a-z-]+)` (\d+)", line.split("Built-ins:")[1])}
    real = {b.name: b.preference for _, module in builtin_plugins() for b in module.register_backends()}
    assert documented == real
