"""A plugin that times out once is disabled for the rest of the run: a run costs at most one timeout per plugin,
and every later rejection of its backends says where it timed out."""

from __future__ import annotations

import json
import threading
import time

import pytest

from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch._util.deadline import disabled_reason
from moedispatch.core.errors import PluginError
from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.selector.plugins import build_registry, reset_registry
from moedispatch.core.reason import texts

TIMEOUT = 0.4
_release = threading.Event()


@pytest.fixture(scope="module", autouse=True)
def _release_hung_threads():
    _release.clear()  # a second pytest session in one process (mutmut's stats, then its clean run) hangs them again
    yield
    _release.set()


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", str(TIMEOUT))


class Hangs(Backend):
    """Hangs in ``method`` from layer ``from_layer`` on; counts its calls."""

    preference = 100

    def __init__(self, name="hangs", method="check", from_layer=0):
        self.name, self.method, self.from_layer = name, method, from_layer
        self.calls = 0

    def _maybe_hang(self, layer):
        self.calls += 1
        if layer.index >= self.from_layer:
            _release.wait(60)

    def check(self, layer, caps):
        if self.method == "check":
            self._maybe_hang(layer)
        return Verdict.supported("would run it")

    def plan_padding(self, layer, caps):
        if self.method == "plan_padding":
            self._maybe_hang(layer)
        return Padding.none(layer)


class Sibling(Backend):
    """Another backend of the same plugin; never hangs itself."""

    name, preference = "sibling", 90

    def __init__(self):
        self.calls = 0

    def check(self, layer, caps):
        self.calls += 1
        return Verdict.supported("fine")


def _plugin(*backends):
    class P:
        @hookimpl
        def register_backends(self):
            return list(backends)
    return P()


def test_a_hanging_plugin_costs_one_timeout_over_a_94_layer_model(caps, builtins):
    model = load_model("Qwen3-235B-A22B-Instruct-2507")
    hangs = Hangs()
    start = time.perf_counter()
    plan = plan_model(model, caps("gfx942"), backends=tuple(builtins) + (hangs,))
    elapsed = time.perf_counter() - start
    assert len(plan.decisions) == 94
    # One timeout (0.4 s) plus planning; without disabling this is 94 × 0.4 s ≈ 38 s.
    assert elapsed < TIMEOUT + 3, elapsed
    assert hangs.calls == 1
    assert texts(plan.decisions[0].rejection("hangs").reasons) == [
        f"plugin error: check() timed out after {TIMEOUT:g}s"]
    for d in plan.decisions[1:]:
        assert texts(d.rejection("hangs").reasons) == [
            "plugin error: disabled after timing out in check() on layer 0"]
        assert d.backend == "aiter-ck"
    assert (f"plugin 'hangs' disabled for the rest of the run after check() timed out after {TIMEOUT:g}s on layer 0"
            in texts(plan.warnings))


def test_a_timeout_in_plan_padding_disables_too_and_names_the_layer(caps):
    model = load_model("Mixtral-8x7B")
    from moedispatch.selector.plugins import get_registry

    hangs = Hangs("slowpad", method="plan_padding", from_layer=3)
    plan = plan_model(model, caps("gfx942"), backends=get_registry().backends + (hangs,))
    assert [d.backend for d in plan.decisions[:3]] == ["slowpad"] * 3
    assert texts(plan.decisions[3].rejection("slowpad").reasons) == [
        f"plugin error: plan_padding() timed out after {TIMEOUT:g}s"]
    assert texts(plan.decisions[4].rejection("slowpad").reasons) == [
        "plugin error: disabled after timing out in plan_padding() on layer 3"]
    assert hangs.calls == 4
    assert disabled_reason(hangs) == "disabled after timing out in plan_padding() on layer 3"


def test_every_backend_of_the_plugin_is_disabled_and_a_new_registry_starts_clean(caps):
    model = load_model("Mixtral-8x7B")
    hangs, sibling = Hangs(from_layer=2), Sibling()
    registry = build_registry([("acme", _plugin(hangs, sibling))], load_entrypoints=False)
    start = time.perf_counter()
    plan = plan_model(model, caps("gfx942"), backends=registry.backends)
    assert time.perf_counter() - start < TIMEOUT + 3
    assert hangs.calls == 3  # layers 0, 1 and the one that hung
    assert sibling.calls == 2  # asked after its sibling on layer 2: already disabled
    assert [d.backend for d in plan.decisions[:2]] == ["hangs", "hangs"]
    later = plan.decisions[10]
    assert later.backend is None
    assert {r.backend: texts(r.reasons) for r in later.rejected} == {
        "hangs": ["plugin error: disabled after timing out in check() on layer 2"],
        "sibling": ["plugin error: disabled after timing out in check() on layer 2"]}
    assert (f"plugin 'acme' disabled for the rest of the run after check() timed out after {TIMEOUT:g}s on layer 2"
            in texts(plan.warnings))
    reset_registry()
    assert disabled_reason(hangs) is None
    fresh = build_registry([("acme", _plugin(Sibling()))], load_entrypoints=False)
    assert plan_model(model, caps("gfx942"), backends=fresh.backends).decisions[10].backend == "sibling"


def test_strict_raises_on_the_first_timeout(caps):
    model = load_model("Mixtral-8x7B")
    start = time.perf_counter()
    with pytest.raises(PluginError, match=rf"^backend 'hangs': check\(\) timed out after {TIMEOUT:g}s$"):
        plan_model(model, caps("gfx942"), backends=(Hangs(),), strict=True)
    assert time.perf_counter() - start < TIMEOUT + 3


HANGING_PLUGIN = '''
import time
from moedispatch import Backend, Verdict, hookimpl

class Hangs(Backend):
    name, preference = "acme-hangs", 1

    def check(self, layer, caps):
        time.sleep(120)
        return Verdict.unsupported("too late")

@hookimpl
def register_backends():
    return [Hangs()]
'''


def test_explain_through_the_console_script_waits_one_timeout(tmp_path, cli):
    (tmp_path / "acme_hangs.py").write_text(HANGING_PLUGIN)
    dist = tmp_path / "acme_hangs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-hangs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[moedispatch.backends]\nacme = acme_hangs\n")
    env = {"PYTHONPATH": str(tmp_path), "MOEDISPATCH_PLUGIN_TIMEOUT": "1"}
    start = time.perf_counter()
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "gfx942", "--format", "json", env=env)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 30, elapsed  # 32 MoE layers × 1 s without disabling, plus start-up
    doc = json.loads(proc.stdout)
    rejected = [{r["backend"]: r["reasons"] for r in layer["rejected"]}["acme-hangs"] for layer in doc["layers"]]
    assert rejected[0] == ["plugin error: check() timed out after 1s"]
    assert set(map(tuple, rejected[1:])) == {("plugin error: disabled after timing out in check() on layer 0",)}
    assert "plugin 'acme' disabled for the rest of the run after check() timed out after 1s on layer 0" in \
        doc["warnings"]


def test_a_forked_child_calls_plugins_without_waiting_on_the_parents_workers(tmp_path):
    """An engine that forks workers after selecting: the child's first third-party plugin call must not wait on an
    idle worker thread that only existed in the parent (it would time out and disable the plugin)."""
    import os
    import sys

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    from moedispatch._util.deadline import call_with_deadline

    assert call_with_deadline(lambda: 1, (), what="warm-up()", timeout=5) == 1  # leaves one idle worker
    pid = os.fork()
    if pid == 0:  # child
        try:
            ok = call_with_deadline(lambda: 2, (), what="check()", timeout=2) == 2
        except BaseException:  # noqa: BLE001
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
