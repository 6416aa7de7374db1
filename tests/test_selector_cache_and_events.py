"""The selector's cache, its structlog events and its built-in detection, pinned on values.

Caching: an exact cache (layer, caps, backends, force, strict, runtime) and a shape cache (the layer's index-free
signature) used only when every backend is built-in, so the identical MoE layers of a model are selected once and
re-indexed. Events: ``backend_rejected`` (debug, per failed backend) and ``backend_selected`` (info) with the layer
index, the backend, the reasons' texts and the padding.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from moedispatch import Backend, Padding, Verdict
from moedispatch.selector import pure as selector
from moedispatch.core.decision import NoBackendError
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import texts
from moedispatch.testing import fake_capabilities

LAYER = MoELayer.build(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=1)


@pytest.fixture(autouse=True)
def _cold():
    selector.clear_cache()
    yield
    selector.clear_cache()


@pytest.fixture
def builtins():
    from moedispatch.selector.plugins import build_registry

    return tuple(build_registry().backends)


class ThirdParty(Backend):
    name, preference, family = "acme", 5, "acme"

    def check(self, layer, caps):
        return Verdict.supported("acme runs anything")

    def plan_padding(self, layer, caps):
        return Padding.none(layer)


def _events(caplog, name):
    return [r.structlog_event for r in caplog.records
            if getattr(r, "structlog_event", {}).get("event") == name]


def test_selected_and_rejected_events_carry_layer_backend_reasons_and_padding(builtins, caplog):
    caps = fake_capabilities("gfx950", "0.1.15.post3")
    layer = dataclasses.replace(LAYER, index=7)
    with caplog.at_level(logging.DEBUG, logger="moedispatch"):
        d = selector.select(layer, caps, builtins)
    (sel,) = _events(caplog, "backend_selected")
    assert {k: sel[k] for k in ("layer", "backend", "reasons", "padding")} == {
        "layer": 7, "backend": d.backend, "reasons": texts(d.reasons), "padding": d.padding.to_dict()}
    rejected = _events(caplog, "backend_rejected")
    failed = [r for r in d.rejected if not r.supported]
    assert failed and [(e["layer"], e["backend"], e["reasons"]) for e in rejected] == [
        (7, r.backend, texts(r.reasons)) for r in failed]


def test_no_backend_is_logged_with_its_reasons_and_no_padding(caplog):
    caps = fake_capabilities("gfx950", "0.1.15.post3")
    with caplog.at_level(logging.INFO, logger="moedispatch"), pytest.raises(NoBackendError) as err:
        selector.select(LAYER, caps, ())
    (sel,) = _events(caplog, "backend_selected")
    assert sel["layer"] == 0 and sel["backend"] is None and "padding" not in sel
    assert sel["reasons"] == texts(err.value.decision.reasons) and sel["reasons"]
    assert str(err.value) and err.value.decision.backend is None
    # cached: the same error again, with the same message and decision
    with pytest.raises(NoBackendError) as again:
        selector.select(LAYER, caps, ())
    assert str(again.value) == str(err.value) and again.value.decision == err.value.decision


def test_info_only_logs_no_rejections(builtins, caplog):
    with caplog.at_level(logging.INFO, logger="moedispatch"):
        selector.select(LAYER, fake_capabilities("gfx950", "0.1.15.post3"), builtins)
    assert _events(caplog, "backend_selected") and not _events(caplog, "backend_rejected")


@pytest.fixture
def calls(monkeypatch):
    """The layer indices select_uncached computes (a cache hit does not call it)."""
    seen: list[int] = []
    real = selector.select_uncached

    def counting(layer, *a, **k):
        seen.append(layer.index)
        return real(layer, *a, **k)

    monkeypatch.setattr(selector, "select_uncached", counting)
    return seen


def test_the_shape_cache_reindexes_identical_builtin_layers_and_logs_each(builtins, caplog, calls):
    caps = fake_capabilities("gfx950", "0.1.15.post3")
    with caplog.at_level(logging.INFO, logger="moedispatch"):
        d3 = selector.select(dataclasses.replace(LAYER, index=3), caps, builtins)
        d4 = selector.select(dataclasses.replace(LAYER, index=4), caps, list(builtins))  # a list is made a tuple
    assert calls == [3]  # layer 4 came from the shape cache
    assert d4.layer.index == 4 and d3.layer.index == 3 and d4.backend == d3.backend and d4.padding == d3.padding
    assert [e["layer"] for e in _events(caplog, "backend_selected")] == [3, 4]
    assert selector.select(dataclasses.replace(LAYER, index=4), caps, builtins) is d4  # exact cache
    assert calls == [3]


def test_a_third_party_backend_disables_the_shape_cache(builtins, calls):
    caps = fake_capabilities("gfx950", "0.1.15.post3")
    backends = builtins + (ThirdParty(),)
    selector.select(dataclasses.replace(LAYER, index=1), caps, backends)
    selector.select(dataclasses.replace(LAYER, index=2), caps, backends)
    assert calls == [1, 2]  # a plugin may read the layer index: no sharing
    dense = dataclasses.replace(LAYER, kind="dense", index=5)
    for layer in (dense, dataclasses.replace(dense, index=6)):
        try:
            selector.select(layer, caps, builtins)
        except NoBackendError:
            pass
    assert calls[-2:] == [5, 6]  # only MoE layers share by shape


def test_the_caches_are_bounded(monkeypatch):
    monkeypatch.setattr(selector, "_CACHE_MAX", 2)
    cache: dict = {}
    selector._store(cache, ("a",), 1)
    selector._store(cache, ("b",), 2)
    assert cache == {("a",): 1, ("b",): 2}
    selector._store(cache, ("c",), 3)  # full: cleared first
    assert cache == {("c",): 3}


def test_builtin_detection_is_by_package_and_memoized(builtins):
    assert all(selector.is_builtin(b) for b in builtins)
    assert not selector.is_builtin(ThirdParty())
    assert selector._trusted_types[ThirdParty] is False
    assert selector._trusted_types[type(builtins[0])] is True
    assert not selector.is_builtin(ThirdParty())  # memoized answer


def test_third_party_calls_go_through_the_deadline_with_owner_and_place(monkeypatch):
    from moedispatch._util import deadline

    seen = {}

    def fake(fn, args, *, what, owner, where, **kw):
        seen.update(what=what, owner=owner, where=where)
        return fn(*args)

    monkeypatch.setattr(deadline, "call_with_deadline", fake)
    plugin = ThirdParty()
    layer = dataclasses.replace(LAYER, index=9)
    v = selector._call(plugin, "check", layer, fake_capabilities("gfx950", "0.1.15.post3"))
    assert v.supported and seen == {"what": "check()", "owner": plugin, "where": "layer 9"}
