"""Faulty plugins: each failure mode is isolated and reported with its exact reason; strict turns it into an error.

Covers what tests/test_selector_plugins.py does not: import failures other than a missing module, hangs (the
deadline), BaseException, wrong Verdict/Padding shapes, register_backends returning non-iterables, duplicate names
across entry points, and the CLI surface (`backends`, `explain` warnings, `--strict-plugins` exit 2).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from moedispatch.core.reason import texts
from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.core.errors import PluginError
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import MoELayer
from moedispatch.selector.plugins import build_registry, call_with_deadline, PluginTimeout
from moedispatch.selector.pure import is_builtin, select_uncached

LAYER = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=8, model="Mixtral-8x7B")
TIMEOUT = "0.3"  # seconds; MOEDISPATCH_PLUGIN_TIMEOUT for the hang cases

_release = threading.Event()  # set at module teardown so hung worker threads finish


@pytest.fixture(scope="module", autouse=True)
def _release_hung_threads():
    yield
    _release.set()


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", TIMEOUT)


class Good(Backend):
    name, preference = "good", 1

    def check(self, layer, caps):
        return Verdict.supported("fine")


class Faulty(Backend):
    """check/plan_padding behaviour chosen per instance."""

    preference = 100

    def __init__(self, name, check=None, plan=None):
        self.name, self._check, self._plan = name, check, plan

    def check(self, layer, caps):
        return self._check() if self._check else Verdict.supported("ok")

    def plan_padding(self, layer, caps):
        return self._plan() if self._plan else Padding.none(layer)


def _hang():
    _release.wait(30)
    return Verdict.supported("too late")


def _raise(exc):
    def f():
        raise exc
    return f


CHECK_CASES = [
    ("raises", _raise(ValueError("bad layer")), "plugin error: check() raised ValueError: bad layer"),
    ("raises-empty", _raise(KeyError()), "plugin error: check() raised KeyError"),
    ("exits", _raise(SystemExit(3)), "plugin error: check() raised RuntimeError: SystemExit: 3"),
    ("none", lambda: None, "plugin error: check() returned NoneType, not a Verdict"),
    ("dict", lambda: {"supported": True}, "plugin error: check() returned dict, not a Verdict"),
    ("str-supported", lambda: Verdict("yes", ("x",)),
     "plugin error: check() returned a Verdict whose supported is str, not a bool"),
    ("str-reasons", lambda: Verdict(True, "because"),
     "plugin error: check() returned a Verdict whose reasons are not a tuple of str or Reason"),
    ("int-reasons", lambda: Verdict(True, (1, 2)),
     "plugin error: check() returned a Verdict whose reasons are not a tuple of str or Reason"),
    ("no-reason", lambda: Verdict(False, ()), "plugin error: check() returned an unsupported Verdict with no reason"),
]


@pytest.mark.parametrize("name, check, reason", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_check_faults_are_rejections_with_the_exact_reason(caps, name, check, reason):
    d = select_uncached(LAYER, caps("gfx942"), [Faulty(name, check=check), Good()])
    assert d.backend == "good"
    assert tuple(texts(d.rejection(name).reasons)) == (reason,)


@pytest.mark.parametrize("name, check, reason", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_check_faults_under_strict_raise_plugin_error_with_the_reason(caps, name, check, reason):
    with pytest.raises(PluginError) as err:
        select_uncached(LAYER, caps("gfx942"), [Faulty(name, check=check), Good()], strict=True)
    assert str(err.value) == f"backend {name!r}: {reason[len('plugin error: '):]}"


PLAN_CASES = [
    ("plan-raises", _raise(ZeroDivisionError("division by zero")),
     "plugin error: plan_padding() raised ZeroDivisionError: division by zero"),
    ("plan-none", lambda: None, "plugin error: plan_padding() returned NoneType, not a Padding"),
    ("plan-tuple", lambda: (4096, 1792), "plugin error: plan_padding() returned tuple, not a Padding"),
    ("plan-inconsistent", lambda: Padding(hidden=4096, intermediate_per_rank=2048),
     "plugin error: plan_padding() returned sizes inconsistent with the layer (hidden 4096 - pad 0 != 4096 or "
     "intermediate 2048 - pad 0 != 1792)"),
    ("plan-bad-notes", lambda: Padding(hidden=4096, intermediate_per_rank=1792, notes="a note"),
     "plugin error: plan_padding() returned a Padding whose notes are not strings or Reasons"),
]


@pytest.mark.parametrize("name, plan, reason", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_padding_faults_fall_through_to_the_next_backend(caps, name, plan, reason):
    d = select_uncached(LAYER, caps("gfx942"), [Faulty(name, plan=plan), Good()])
    assert d.backend == "good"
    assert tuple(texts(d.rejection(name).reasons)) == (reason,)
    with pytest.raises(PluginError) as err:
        select_uncached(LAYER, caps("gfx942"), [Faulty(name, plan=plan), Good()], strict=True)
    assert str(err.value) == f"backend {name!r}: {reason[len('plugin error: '):]}"


def test_only_faulty_backends_means_no_backend_with_every_reason(caps):
    with pytest.raises(NoBackendError) as err:
        select_uncached(LAYER, caps("gfx942"), [Faulty("x", check=lambda: None)])
    assert tuple(texts(err.value.decision.rejection("x").reasons)) == ("plugin error: check() returned NoneType, not a Verdict",)
    assert "x: plugin error: check() returned NoneType" in str(err.value)


def test_a_hanging_check_times_out_and_selection_goes_on(caps, short_deadline):
    start = time.perf_counter()
    d = select_uncached(LAYER, caps("gfx942"), [Faulty("hangs", check=_hang), Good()])
    assert time.perf_counter() - start < 5
    assert d.backend == "good"
    assert tuple(texts(d.rejection("hangs").reasons)) == (f"plugin error: check() timed out after {TIMEOUT}s",)
    with pytest.raises(PluginError) as err:
        select_uncached(LAYER, caps("gfx942"), [Faulty("hangs", check=_hang), Good()], strict=True)
    assert str(err.value) == f"backend 'hangs': check() timed out after {TIMEOUT}s"


def test_a_hanging_plan_padding_times_out(caps, short_deadline):
    d = select_uncached(LAYER, caps("gfx942"), [Faulty("slowpad", plan=_hang), Good()])
    assert d.backend == "good"
    assert tuple(texts(d.rejection("slowpad").reasons)) == (f"plugin error: plan_padding() timed out after {TIMEOUT}s",)


def test_builtins_are_called_directly_third_parties_through_the_deadline(builtins):
    assert all(is_builtin(b) for b in builtins)
    assert not is_builtin(Good())
    main = threading.get_ident()
    assert call_with_deadline(threading.get_ident, what="x") != main
    with pytest.raises(PluginTimeout, match=r"^x\(\) timed out after 0.05s$"):
        call_with_deadline(_release.wait, (30,), what="x()", timeout=0.05)


# -- register_backends and import ------------------------------------------------------------------------------

def _plugin(register):
    class P:
        @hookimpl
        def register_backends(self):
            return register()
    return P()


class _NameRaises(Backend):
    preference = 1

    @property
    def name(self):
        raise AttributeError("no name today")


REGISTER_CASES = [
    ("raises", _raise(RuntimeError("cannot init")), "register_backends raised RuntimeError: cannot init"),
    ("exits", _raise(SystemExit("bye")), "register_backends raised RuntimeError: SystemExit: bye"),
    ("int", lambda: 42, "register_backends returned int, not an iterable of moedispatch.Backend"),
    ("str", lambda: "good", "register_backends returned str, not an iterable of moedispatch.Backend"),
    ("class", lambda: [Good], "register_backends returned type (<class 'test_faults.Good'>), not a moedispatch.Backend"),
    ("noname", lambda: [type("Anon", (Backend,), {"name": ""})()], "backend Anon has no valid name (got '')"),
    ("badpref", lambda: [type("P", (Backend,), {"name": "p", "preference": "high"})()],
     "backend 'p' preference must be an int, got str"),
    ("nameraises", lambda: [_NameRaises()],
     "register_backends returned a backend whose attributes raise AttributeError: no name today"),
    ("generator-raises", lambda: (_raise(OSError("disk"))() for _ in range(1)),
     "register_backends raised OSError: disk"),
]


@pytest.mark.parametrize("name, register, reason", REGISTER_CASES, ids=[c[0] for c in REGISTER_CASES])
def test_register_backends_faults_are_recorded_and_isolated(name, register, reason):
    reg = build_registry([(name, _plugin(register)), ("ok", _plugin(lambda: [Good()]))], load_entrypoints=False)
    assert reg.names() == ("good",)
    record = next(p for p in reg.plugins if p.name == name)
    assert record.errors == (reason,)
    assert reg.errors == (f"{name}: {reason}",)
    with pytest.raises(PluginError) as err:
        build_registry([(name, _plugin(register))], load_entrypoints=False, strict=True)
    assert str(err.value) == f"plugin {name!r}: {reason}"


def test_a_hanging_register_backends_times_out(short_deadline):
    reg = build_registry([("hangs", _plugin(lambda: [_release.wait(30)])), ("ok", _plugin(lambda: [Good()]))],
                         load_entrypoints=False)
    assert reg.names() == ("good",)
    assert next(p for p in reg.plugins if p.name == "hangs").errors == \
        (f"register_backends timed out after {TIMEOUT}s",)


def test_duplicate_names_across_plugins_keep_the_first_and_report_the_second():
    reg = build_registry([("first", _plugin(lambda: [Good()])), ("second", _plugin(lambda: [Good(), Faulty("x")]))],
                         load_entrypoints=False)
    assert reg.names() == ("good", "x")
    assert reg.owner("good") == "first"
    assert next(p for p in reg.plugins if p.name == "second").errors == \
        ("duplicate backend name 'good' (already registered by plugin 'first'); ignored",)
    with pytest.raises(PluginError, match="duplicate backend name 'good'"):
        build_registry([("first", _plugin(lambda: [Good()])), ("second", _plugin(lambda: [Good()]))],
                       load_entrypoints=False, strict=True)


def _fake_ep(name, load):
    return SimpleNamespace(name=name, value=f"acme_{name}:plugin", dist=None, load=load)


@pytest.mark.parametrize("load, reason", [
    (_raise(SyntaxError("invalid syntax")), "import failed: SyntaxError: invalid syntax"),
    (_raise(ImportError("libfoo.so: cannot open shared object file")),
     "import failed: ImportError: libfoo.so: cannot open shared object file"),
    (_raise(ZeroDivisionError("division by zero")), "import failed: ZeroDivisionError: division by zero"),
], ids=["syntax", "import", "module-level-raise"])
def test_entry_point_import_faults_are_reported(monkeypatch, load, reason):
    import moedispatch.selector.plugins as mp

    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [_fake_ep("acme", load)])
    reg = build_registry()
    assert next(p for p in reg.plugins if p.name == "acme").errors == (reason,)
    assert {"aiter-ck", "triton", "emulation"} <= set(reg.names())
    with pytest.raises(PluginError) as err:
        build_registry(strict=True)
    assert str(err.value) == f"plugin 'acme': {reason}"


def test_entry_point_import_that_hangs_times_out(monkeypatch, short_deadline):
    import moedispatch.selector.plugins as mp

    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [_fake_ep("sleepy", lambda: _release.wait(30))])
    reg = build_registry()
    assert next(p for p in reg.plugins if p.name == "sleepy").errors == (f"import timed out after {TIMEOUT}s",)
    assert "emulation" in reg.names()


def test_entry_point_duplicate_of_a_builtin_name_is_reported(monkeypatch):
    import moedispatch.selector.plugins as mp

    class Impostor(Backend):
        name, preference = "triton", 1000

        def check(self, layer, caps):
            return Verdict.supported("me")

    module = _plugin(lambda: [Impostor()])
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [_fake_ep("zz-impostor", lambda: module)])
    reg = build_registry()
    assert type(reg.get("triton")).__name__ != "Impostor"
    assert next(p for p in reg.plugins if p.name == "zz-impostor").errors == \
        ("duplicate backend name 'triton' (already registered by plugin 'triton'); ignored",)


# -- through the public surfaces -------------------------------------------------------------------------------

def test_engine_api_isolates_a_faulty_registered_plugin(monkeypatch, caps):
    import moedispatch.selector.plugins as mp
    from moedispatch.api import select_moe_backend

    module = _plugin(lambda: [Faulty("acme-broken", check=_raise(RuntimeError("kaboom")))])
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [_fake_ep("acme", lambda: module)])
    mp.reset_registry()
    d = select_moe_backend(caps=caps("gfx942"), hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2,
                           tp_size=8)
    assert d.backend == "aiter-ck"
    assert tuple(texts(d.rejection("acme-broken").reasons)) == ("plugin error: check() raised RuntimeError: kaboom",)
    with pytest.raises(PluginError, match=r"^backend 'acme-broken': check\(\) raised RuntimeError: kaboom$"):
        select_moe_backend(caps=caps("gfx942"), strict=True, hidden_size=4096, intermediate_size=14336,
                           num_experts=8, top_k=2, tp_size=8)


def test_cli_reports_plugin_errors_and_strict_exits_2_without_traceback(tmp_path, cli):
    """A real broken plugin package on PYTHONPATH with an entry point: `backends` lists it, explain warns,
    --strict-plugins exits 2 with one line."""
    pkg = tmp_path / "acme_broken.py"
    pkg.write_text("raise RuntimeError('acme is broken')\n")
    dist = tmp_path / "acme_broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[moedispatch.backends]\nacme = acme_broken\n")
    env = {"PYTHONPATH": str(tmp_path)}
    proc = cli("backends", "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    import json

    plugins = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert plugins["acme"]["errors"] == ["import failed: RuntimeError: acme is broken"]
    assert plugins["acme"]["package"] == "acme-broken"
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "plugin error: acme: import failed: RuntimeError: acme is broken" in json.loads(proc.stdout)["warnings"]
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--strict-plugins", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "moedispatch: plugin 'acme': import failed: RuntimeError: acme is broken"
    assert "Traceback" not in proc.stderr


def test_a_slow_plugin_import_is_said(monkeypatch):
    """A plugin importing torch at module level costs every explain ~1.5 s, silently: at SLOW_IMPORT_S or more the
    plugin's record, the plan's warnings and the log say so (a fast one says nothing)."""
    import types

    import moedispatch.selector.plugins as mp

    real = list(mp._entry_points())
    clock = iter([100.0, 100.0 + mp.SLOW_IMPORT_S + 0.3, 200.0, 200.01])
    monkeypatch.setattr(mp, "_clock", lambda: next(clock))
    eps = [_fake_ep("heavy", lambda: types.ModuleType("acme_heavy")), _fake_ep("light", lambda: types.ModuleType("x"))]
    monkeypatch.setattr(mp, "_entry_points", lambda: real + eps)
    reg = build_registry()
    heavy = next(p for p in reg.plugins if p.name == "heavy")
    slow = [w for w in heavy.warnings if "to import" in w]
    assert len(slow) == 1 and slow[0].startswith("took 0.8 s to import (every process that plans pays it")
    assert "MOEDISPATCH_DISABLE_PLUGINS=heavy" in slow[0]
    assert any(w.startswith("plugin 'heavy' took 0.8 s to import") for w in reg.warnings)
    assert not [w for w in next(p for p in reg.plugins if p.name == "light").warnings if "to import" in w]
