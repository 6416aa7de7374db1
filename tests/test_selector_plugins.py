"""Selector semantics, plugin loading and isolation, logging silence, determinism."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from moedispatch.core.reason import texts
from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.core.errors import PluginError, UsageError
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import MoELayer
from moedispatch.selector.plugins import build_registry
from moedispatch.selector.pure import select, select_uncached

LAYER = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=8, model="Mixtral-8x7B")


class Fixed(Backend):
    def __init__(self, name, preference, ok=True, reasons=("because",)):
        self.name, self.preference, self._ok, self._reasons = name, preference, ok, reasons

    def check(self, layer, caps):
        return Verdict(self._ok, tuple(self._reasons))


def plugin(*backends):
    class P:
        @hookimpl
        def register_backends(self):
            return list(backends)
    return P()


def test_verdict_supported_factory_and_bool_field():
    v = Verdict.supported("fine")
    assert v.supported is True and tuple(texts(v.reasons)) == ("fine",)
    assert Verdict.unsupported("no").supported is False
    with pytest.raises(ValueError):
        Verdict.unsupported()


def test_padding_none_means_unpadded_and_no_zero_fill():
    p = Padding.none(LAYER)
    assert p.to_dict() == {"hidden": 4096, "intermediate_per_rank": 1792, "hidden_pad": 0, "intermediate_pad": 0,
                           "kernel_hidden_pad": 0, "kernel_intermediate_pad": 0, "zero_fill": False,
                           "pad_semantics": "compute"}


def test_outranked_backends_are_listed_with_preferences(caps):
    a, b, c = Fixed("a", 80), Fixed("b", 60), Fixed("c", 10, ok=False, reasons=("needs gfx950",))
    d = select_uncached(LAYER, caps("gfx942"), [c, b, a])
    assert d.backend == "a"
    assert d.rejection("b").reasons[0].text == "supported, outranked by a (preference 80 > 60)"
    assert tuple(texts(d.rejection("c").reasons)) == ("needs gfx950",)
    assert [r.backend for r in d.rejected] == ["b", "c"]


def test_equal_preference_breaks_ties_by_name_and_says_so(caps):
    d = select_uncached(LAYER, caps("gfx942"), [Fixed("zeta", 5), Fixed("alpha", 5)])
    assert d.backend == "alpha"
    assert d.rejection("zeta").reasons[0].text == "supported, outranked by alpha (preference 5 = 5, name order)"


def test_no_backend_raises_with_every_rejection(caps):
    with pytest.raises(NoBackendError) as err:
        select_uncached(LAYER, caps("gfx942"), [Fixed("a", 1, ok=False, reasons=("r1",)),
                                               Fixed("b", 2, ok=False, reasons=("r2", "r3"))])
    d = err.value.decision
    assert d.backend is None
    assert {r.backend: tuple(texts(r.reasons)) for r in d.rejected} == {"a": ("r1",), "b": ("r2", "r3")}
    assert "a: r1" in str(err.value) and "b: r2" in str(err.value)


def test_forced_backend_that_fails_raises_with_its_reasons_never_falls_back(caps):
    good, bad = Fixed("good", 90), Fixed("bad", 1, ok=False, reasons=("skips activation QDQ",))
    with pytest.raises(NoBackendError) as err:
        select_uncached(LAYER, caps("gfx942"), [good, bad], force="bad")
    assert "skips activation QDQ" in str(err.value)
    assert err.value.decision.backend is None
    d = select_uncached(LAYER, caps("gfx942"), [good, Fixed("ok", 1)], force="ok")
    assert d.backend == "ok" and d.forced
    assert d.rejection("good").reasons[0].text.startswith("supported, not chosen: --backend ok was forced")
    with pytest.raises(UsageError):
        select_uncached(LAYER, caps("gfx942"), [good], force="nope")


def test_dense_layers_get_no_backend(caps):
    dense = MoELayer.build(kind="dense", hidden=6144, intermediate=12288, tp=8)
    d = select_uncached(dense, caps("gfx950"), [Fixed("a", 1)])
    assert d.backend is None and d.ok and d.padding == Padding.none(dense)


class Raises(Backend):
    name, preference = "raises", 100

    def check(self, layer, caps):
        raise RuntimeError("boom")


class BadPadding(Backend):
    name, preference = "badpad", 100

    def check(self, layer, caps):
        return Verdict.supported("ok")

    def plan_padding(self, layer, caps):
        return {"hidden": 1}


class WrongType(Backend):
    name, preference = "wrongtype", 100

    def check(self, layer, caps):
        return True


def test_plugin_errors_in_check_and_plan_padding_are_isolated(caps):
    d = select_uncached(LAYER, caps("gfx942"), [Raises(), BadPadding(), WrongType(), Fixed("fine", 1)])
    assert d.backend == "fine"
    assert tuple(texts(d.rejection("raises").reasons)) == ("plugin error: check() raised RuntimeError: boom",)
    assert tuple(texts(d.rejection("badpad").reasons)) == ("plugin error: plan_padding() returned dict, not a Padding",)
    assert tuple(texts(d.rejection("wrongtype").reasons)) == ("plugin error: check() returned bool, not a Verdict",)


@pytest.mark.parametrize("backend, needle", [(Raises(), "check() raised RuntimeError: boom"),
                                             (BadPadding(), "plan_padding() returned dict"),
                                             (WrongType(), "check() returned bool")])
def test_strict_turns_plugin_errors_into_errors(caps, backend, needle):
    with pytest.raises(PluginError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        select_uncached(LAYER, caps("gfx942"), [backend, Fixed("fine", 1)], strict=True)


def test_registry_isolates_bad_register_backends_results():
    class Boom:
        @hookimpl
        def register_backends(self):
            raise ValueError("kaput")

    class Garbage:
        @hookimpl
        def register_backends(self):
            return ["not a backend", Fixed("ok", 1)]

    reg = build_registry([("boom", Boom()), ("garbage", Garbage()), ("dup", plugin(Fixed("ok", 2)))],
                         load_entrypoints=False)
    assert reg.names() == ("ok",)
    errors = {p.name: p.errors for p in reg.plugins}
    assert errors["boom"] == ("register_backends raised ValueError: kaput",)
    assert errors["garbage"][0].startswith("register_backends returned str")
    assert errors["dup"] == ("duplicate backend name 'ok' (already registered by plugin 'garbage'); ignored",)
    with pytest.raises(PluginError, match="kaput"):
        build_registry([("boom", Boom())], load_entrypoints=False, strict=True)


def test_builtins_come_through_entry_points_and_env_lists_filter(monkeypatch):
    reg = build_registry()
    assert set(reg.names()) == {"aiter-asm", "aiter-ck", "aiter-cktile", "aiter-flydsl", "aiter-triton", "triton",
                                 "emulation"}
    assert all(p.builtin and p.package == "moedispatch" and p.hooks == ("register_backends",) for p in reg.plugins)
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "triton,aiter-ck")
    assert set(build_registry().names()) == {"aiter-asm", "aiter-cktile", "aiter-flydsl", "aiter-triton", "emulation"}
    monkeypatch.delenv("MOEDISPATCH_DISABLE_PLUGINS")
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "emulation")
    assert build_registry().names() == ("emulation",)
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "")
    assert build_registry().names() == ()


def test_entry_point_import_failure_is_reported_not_fatal(monkeypatch):
    import moedispatch.selector.plugins as mp

    broken = SimpleNamespace(name="broken", value="nonexistent_module_xyz", dist=None,
                             load=lambda: __import__("nonexistent_module_xyz"))
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [broken])
    reg = build_registry()
    rec = next(p for p in reg.plugins if p.name == "broken")
    assert rec.errors == ("import failed: ModuleNotFoundError: No module named 'nonexistent_module_xyz'",)
    assert "emulation" in reg.names()
    with pytest.raises(PluginError, match="import failed"):
        build_registry(strict=True)


def test_library_is_silent_unless_the_host_configures_logging(caps, builtins, capsys):
    """No stdout/stderr output from selection, even for warnings, when the host configured nothing."""
    root, ours = logging.getLogger(), logging.getLogger("moedispatch")
    saved = root.handlers[:], ours.handlers[:], ours.level, ours.propagate
    # An in-process CLI run earlier in the session may have configured our logger: start from a bare host.
    root.handlers = []
    ours.handlers = [h for h in ours.handlers if isinstance(h, logging.NullHandler)]
    ours.setLevel(logging.NOTSET)
    ours.propagate = True
    try:
        from moedispatch.api import select_moe_backend

        select_moe_backend(caps=caps("gfx942"), hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2,
                           tp_size=8)
        select_uncached(LAYER, caps("gfx942"), builtins)
    finally:
        root.handlers, ours.handlers, level, ours.propagate = saved
        ours.setLevel(level)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_events_reach_a_host_that_configures_logging(caps, builtins, caplog):
    with caplog.at_level(logging.DEBUG, logger="moedispatch"):
        select_uncached(LAYER, caps("gfx950"), builtins)
    events = [getattr(r, "structlog_event", {}).get("event") for r in caplog.records]
    assert "backend_selected" in events and "backend_rejected" in events
    selected = next(r.structlog_event for r in caplog.records if r.structlog_event["event"] == "backend_selected")
    assert selected["backend"] == "aiter-ck" and selected["layer"] == 0 and selected["reasons"]


def test_select_is_cached_and_deterministic(caps, builtins):
    c = caps("gfx950")
    assert select(LAYER, c, builtins) is select(LAYER, c, builtins)
    assert select_uncached(LAYER, c, builtins) == select_uncached(LAYER, c, list(reversed(builtins)))


def test_explain_json_is_byte_identical_across_hash_seeds():
    outs = set()
    for seed in ("0", "1", "12345"):
        proc = subprocess.run(
            [sys.executable, "-m", "moedispatch.cli", "explain", "--model", "MiniMax-M3-MXFP4", "--target", "gfx950",
             "--tp", "8", "--format", "json"], capture_output=True, text=True, env={"PYTHONHASHSEED": seed,
                                                                                   "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1
    json.loads(outs.pop())


def test_misspelt_hook_is_reported_not_silently_ignored():
    """pluggy accepts impls of unknown hooks; a plugin defining register_backend (no 's') contributes nothing."""
    class Typo:
        @hookimpl
        def register_backend(self):
            return [Fixed("typo", 1)]

    reg = build_registry([("typo", Typo())], load_entrypoints=False)
    rec = next(p for p in reg.plugins if p.name == "typo")
    assert rec.errors == ("unknown hook 'register_backend' (moedispatch hooks: moe_cost, register_backends) (did you mean "
               "'register_backends'?)",)
    assert reg.names() == ()
    with pytest.raises(PluginError, match="unknown hook 'register_backend'"):
        build_registry([("typo", Typo())], load_entrypoints=False, strict=True)


def test_allow_list_that_matches_nothing_is_reported(monkeypatch, cli):
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "bogus")
    reg = build_registry()
    assert reg.names() == ()
    assert any("matches no plugin or backend: bogus" in e for e in reg.errors)
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json",
               env={"MOEDISPATCH_LOAD_PLUGINS": "bogus"})
    assert proc.returncode == 3
    data = json.loads(proc.stdout)
    assert any("matches no plugin or backend: bogus" in w for w in data["warnings"])
    assert data["layers"][0]["reasons"][0].startswith("no backends are registered")


@pytest.mark.parametrize("value", ["moedispatch_plugins_acme:plugin", "moedispatch_plugins.acme:plugin"])
def test_a_third_party_entry_point_named_like_the_builtins_is_not_trusted(monkeypatch, value):
    """Trust (no deadline thread, ``PluginRecord.builtin``) comes from the distribution that declares the entry
    point, not from its module name: a third-party package named ``moedispatch_plugins_acme`` (or one pointing into
    ``moedispatch_plugins.``) is a third-party plugin — its import runs under the deadline, its output is captured."""
    import moedispatch.selector.plugins as mp

    here, threads = threading.get_ident(), []

    def load():
        threads.append(threading.get_ident() == here)
        print("hello from acme")
        return SimpleNamespace()

    acme = SimpleNamespace(name="acme", value=value, load=load,
                           dist=SimpleNamespace(metadata={"Name": "acme-moe", "Version": "1.0"}, _path=f"acme:{value}"))
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [acme])
    reg = build_registry()
    rec = next(p for p in reg.plugins if p.name == "acme")
    assert rec.builtin is False and rec.package == "acme-moe"
    assert threads == [False]  # imported on a deadline worker, not called directly
    assert any("hello from acme" in w for w in rec.warnings)
    assert all(p.builtin for p in reg.plugins if p.name != "acme")


def test_a_third_party_backend_class_claiming_the_builtin_module_is_not_trusted():
    """Trust of a backend comes from the registration record (the registry records every third-party backend with
    register_owner), not from its class's ``__module__``: a plugin class that says it lives in
    ``moedispatch_plugins`` still runs on the deadline thread once a registry registered it as a third party's."""
    from moedispatch._util import deadline
    from moedispatch.selector.pure import is_builtin

    class Impostor:
        name = "impostor"

    Impostor.__module__ = "moedispatch_plugins.impostor"
    unregistered, registered = Impostor(), Impostor()
    assert is_builtin(unregistered)  # used without a registry: judged by its module, as before
    deadline.register_owner(registered, "acme", object())
    assert deadline.registered_third_party(registered) and not is_builtin(registered)
    assert is_builtin(unregistered)  # the record is per backend object
