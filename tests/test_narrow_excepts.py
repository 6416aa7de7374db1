"""The probe and the what-if catch only the error they mean (issue 21: broad excepts narrowed): a version the data
cannot compare is a note or no pin; a broken capability_db is never hidden behind it."""

from __future__ import annotations

import pytest

from moedispatch.core.errors import CapabilityDBError, TargetError
from moedispatch.data import capdb
from moedispatch.probe import aiter as probe_aiter


def _raise(exc):
    def fn(*_a, **_k):
        raise exc
    return fn


def test_flydsl_check_an_unparseable_version_has_no_pin():
    assert probe_aiter.flydsl_check("not-a-version", "0.0.1", []) is None


def test_flydsl_check_does_not_hide_a_broken_capability_db(monkeypatch):
    monkeypatch.setattr(capdb, "flydsl_pin", _raise(CapabilityDBError("capability_db/aiter.toml: flydsl_pins broken")))
    with pytest.raises(CapabilityDBError, match="flydsl_pins broken"):
        probe_aiter.flydsl_check("0.1.19", "0.0.1", [])


def test_reconcile_notes_an_unparseable_version_and_raises_on_broken_data(monkeypatch):
    notes: list[str] = []
    probe_aiter.reconcile("not-a-version", None, None, None, notes)
    assert any("not comparable with capability_db" in n for n in notes)
    monkeypatch.setattr(capdb, "features_for_version", _raise(CapabilityDBError("aiter.toml: features broken")))
    with pytest.raises(CapabilityDBError, match="features broken"):
        probe_aiter.reconcile("0.1.19", None, None, None, [])


def test_upgrade_what_if_skips_a_target_the_db_cannot_rebuild_but_not_broken_data(monkeypatch):
    from moedispatch.api import plan_model, target
    from moedispatch.plan.whatif import what_if
    from moedispatch.selector.plugins import get_registry

    plan = plan_model("Qwen3-30B-A3B", target("MI300X", "0.1.15.post3"))
    d = next(d for d in plan.decisions if d.layer.kind == "moe")
    backends = get_registry().backends
    monkeypatch.setattr(capdb, "target_capabilities", _raise(TargetError("cannot rebuild")))
    assert not any("upgrade AITER" in r.text for r in what_if(d, plan.caps, backends, plan.runtime))
    monkeypatch.setattr(capdb, "target_capabilities", _raise(CapabilityDBError("targets broken")))
    with pytest.raises(CapabilityDBError, match="targets broken"):
        what_if(d, plan.caps, backends, plan.runtime)
