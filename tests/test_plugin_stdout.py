"""Stdout stays ours: what a third-party plugin prints while it is imported, registers its backends or checks a
layer is captured and reported as a plugin warning, never mixed into our report (``--format json`` stays JSON)."""

from __future__ import annotations

import json
import os
import sys
import threading
from types import SimpleNamespace

import pytest

from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch._util.deadline import call_with_deadline, collect_plugin_notices
from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.selector.plugins import build_registry
from moedispatch.core.reason import texts


class Chatty(Backend):
    """Prints on every call; supported only when asked to be."""

    preference = 1

    def __init__(self, name="chatty", ok=False):
        self.name, self._ok = name, ok

    def check(self, layer, caps):
        print(f"{self.name}: checking layer {layer.index}")
        return Verdict(self._ok, ("chatty reason",))

    def plan_padding(self, layer, caps):
        print("planning padding", file=sys.stdout, flush=True)
        return Padding.none(layer)


def _plugin(register):
    class P:
        @hookimpl
        def register_backends(self):
            return register()
    return P()


def _noisy_register():
    print("acme: registering backends")
    sys.stdout.write("second line\n")
    return [Chatty()]


def test_register_backends_output_is_a_plugin_warning_not_stdout(capsys):
    reg = build_registry([("acme", _plugin(_noisy_register))], load_entrypoints=False)
    assert reg.names() == ("chatty",)
    record = next(p for p in reg.plugins if p.name == "acme")
    assert record.warnings == ("printed to stdout during register_backends(): 'acme: registering backends second "
                               "line'",)
    assert record.errors == ()
    assert record.to_dict()["warnings"] == list(record.warnings)
    assert reg.warnings == ("plugin 'acme' printed to stdout during register_backends(): 'acme: registering "
                            "backends second line'",)
    assert capsys.readouterr().out == ""


def test_a_quiet_plugin_has_no_warnings(capsys):
    reg = build_registry([("quiet", _plugin(lambda: [Chatty("q")]))], load_entrypoints=False)
    record = reg.plugins[0]
    assert record.warnings == () and reg.warnings == ()
    assert "warnings" not in record.to_dict()  # the backends JSON key appears only when there is something to say


def test_import_output_is_captured_even_when_the_import_fails(monkeypatch, capsys):
    import moedispatch.selector.plugins as mp

    def load_ok():
        print("hello from import")
        return _plugin(lambda: [Chatty("ep-chatty")])

    def load_broken():
        print("about to fail")
        raise RuntimeError("no GPU driver")

    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [
        SimpleNamespace(name="acme", value="acme:plugin", dist=None, load=load_ok),
        SimpleNamespace(name="broken", value="broken:plugin", dist=None, load=load_broken)])
    reg = build_registry()
    records = {p.name: p for p in reg.plugins}
    assert records["acme"].warnings == ("printed to stdout during import: 'hello from import'",)
    assert records["broken"].warnings == ("printed to stdout during import: 'about to fail'",)
    assert records["broken"].errors == ("import failed: RuntimeError: no GPU driver",)
    assert "ep-chatty" in reg.names()
    assert capsys.readouterr().out == ""


def test_check_output_becomes_one_plan_warning_with_a_call_count(caps, builtins, capsys):
    model = load_model("Mixtral-8x7B")
    plan = plan_model(model, caps("gfx942"), backends=tuple(builtins) + (Chatty(),))
    assert capsys.readouterr().out == ""
    assert "plugin 'chatty' printed to stdout during check() (32 calls): 'chatty: checking layer 0'" in \
        texts(plan.warnings)
    # The decisions themselves are untouched: the output is about the plugin, not the layers (they still group).
    assert len(plan.groups()) == 1
    assert texts(plan.decisions[5].rejection("chatty").reasons) == ["chatty reason"]


def test_plan_padding_output_of_a_winning_plugin_is_reported(caps, capsys):
    model = load_model("Mixtral-8x7B")
    plan = plan_model(model, caps("gfx942"), backends=(Chatty("winner", ok=True),))
    assert {d.backend for d in plan.decisions} == {"winner"}
    warnings = texts(plan.warnings)
    assert "plugin 'winner' printed to stdout during check() (32 calls): 'winner: checking layer 0'" in warnings
    assert "plugin 'winner' printed to stdout during plan_padding() (32 calls): 'planning padding'" in warnings
    assert capsys.readouterr().out == ""


def test_other_threads_keep_their_stdout_while_a_plugin_prints(capsys):
    """The capture is per plugin worker thread: the caller's own writes during a plugin call still reach stdout,
    and sys.stdout is restored afterwards."""
    before = sys.stdout
    started, release = threading.Event(), threading.Event()

    def plugin_call():
        print("plugin noise")
        started.set()
        release.wait(5)
        print("more plugin noise")
        return 42

    out: list[str] = []
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(call_with_deadline(plugin_call, what="check()", output=out)))
    t.start()
    assert started.wait(5)
    print("ours, printed while the plugin runs")
    release.set()
    t.join(5)
    assert result == [42]
    assert out == ["plugin noise\nmore plugin noise\n"]
    assert sys.stdout is before
    assert capsys.readouterr().out == "ours, printed while the plugin runs\n"


def test_notices_without_a_collector_are_logged_once(caplog):
    import logging

    def noisy():
        print("x")

    with caplog.at_level(logging.WARNING, logger="moedispatch"):
        call_with_deadline(noisy, what="probe()", plugin="loner")
        call_with_deadline(noisy, what="probe()", plugin="loner")
    events = [r.structlog_event for r in caplog.records if getattr(r, "structlog_event", {}).get("event")
              == "plugin_printed"]
    assert [(e["plugin"], e["call"], e["output"]) for e in events] == [("loner", "probe()", "'x'")]
    with collect_plugin_notices() as notices:
        call_with_deadline(noisy, what="probe()", plugin="loner")
    assert notices.texts() == ["plugin 'loner' printed to stdout during probe(): 'x'"]


def test_long_output_is_cut_in_the_warning(capsys):
    def flood():
        print("word " * 5000)

    with collect_plugin_notices() as notices:
        call_with_deadline(flood, what="check()", plugin="flood")
    (text,) = notices.texts()
    assert text.startswith("plugin 'flood' printed to stdout during check(): 'word word")
    assert text.endswith("…'") and len(text) < 260
    assert capsys.readouterr().out == ""


# -- through the console script ---------------------------------------------------------------------------------

NOISY_PLUGIN = '''
import os, sys
print("acme: hello at import")
os.write(1, b"acme: raw write to fd 1 at import\\n")
from moedispatch import Backend, Verdict, hookimpl

class Noisy(Backend):
    name, preference = "acme-noisy", 1

    def check(self, layer, caps):
        print(f"acme: checking layer {layer.index}")
        return Verdict.unsupported("acme runs nothing")

@hookimpl
def register_backends():
    print("acme: registering")
    return [Noisy()]
'''


@pytest.fixture
def noisy_plugin(tmp_path):
    """A real plugin package with an entry point on PYTHONPATH that prints at import (print and os.write on fd 1),
    in register_backends() and in check()."""
    (tmp_path / "acme_noisy.py").write_text(NOISY_PLUGIN)
    dist = tmp_path / "acme_noisy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-noisy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[moedispatch.backends]\nacme = acme_noisy\n")
    return {"PYTHONPATH": str(tmp_path)}


def test_explain_json_parses_whatever_a_plugin_prints(cli, noisy_plugin):
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json", env=noisy_plugin)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "acme:" not in proc.stdout.split('"warnings"')[0]
    warnings = doc["warnings"]
    assert "plugin 'acme' printed to stdout during import: 'acme: hello at import acme: raw write to fd 1 at " \
           "import'" in warnings
    assert "plugin 'acme' printed to stdout during register_backends(): 'acme: registering'" in warnings
    assert "plugin 'acme' printed to stdout during check() (32 calls): 'acme: checking layer 0'" in warnings
    assert doc["layers"][0]["backend"] == "aiter-ck"
    assert "Traceback" not in proc.stderr


def test_backends_lists_the_plugin_warning(cli, noisy_plugin):
    proc = cli("backends", "--format", "json", env=noisy_plugin)
    assert proc.returncode == 0, proc.stderr
    acme = next(p for p in json.loads(proc.stdout)["plugins"] if p["name"] == "acme")
    assert acme["errors"] == []
    assert acme["warnings"] == [
        "printed to stdout during import: 'acme: hello at import acme: raw write to fd 1 at import'",
        "printed to stdout during register_backends(): 'acme: registering'"]
    proc = cli("backends", env=noisy_plugin)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("acme "))
    assert "ok; warning: printed to stdout during import: 'acme: hello at import" in line
    assert not proc.stdout.startswith("acme")


def test_library_hosts_keep_fd_1_untouched_during_discovery(noisy_plugin):
    """Only the CLI redirects file descriptor 1 (a host's own threads may write there): in a plain process the
    plugin's raw write reaches fd 1, its print() is still captured."""
    import subprocess

    code = ("from moedispatch.selector.plugins import get_registry; r = get_registry(); "
            "import sys; sys.stderr.write(repr(r.warnings))")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MOEDISPATCH_")}, **noisy_plugin}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "acme: raw write to fd 1 at import\n"
    assert "printed to stdout during import: 'acme: hello at import'" in proc.stderr
