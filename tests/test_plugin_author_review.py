"""A plugin author's review (a newcomer writing a third-party backend by docs/plugins.md): each defect found, as a test
that went red on the code before it — a third party taking over a built-in's name, a padding plan that breaks the pad
contract, a supported verdict carrying a failure, a cost hook escaping the plugin deadline or printing into the
report, a cost below the device's roofline, allow/deny lists by backend name, and declarations of the wrong types."""

from __future__ import annotations


import threading
from types import SimpleNamespace

import pytest

from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.core.reason import Reason
from moedispatch.selector import plugins as mp
from moedispatch.selector.plugins import build_registry
from moedispatch.selector.pure import select
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.testing import fake_capabilities


def _layer(model="Qwen3-30B-A3B"):
    return next(x for x in expand_layers(load_model(model), 1, 1) if x.kind == "moe")


class Yes(Backend):
    family = None

    def __init__(self, name, preference=99, padding=None, verdict=None):
        self.name, self.preference, self._padding, self._verdict = name, preference, padding, verdict

    def check(self, layer, caps):
        return self._verdict or Verdict(True, (Reason("says yes", "supports"),))

    def plan_padding(self, layer, caps):
        return self._padding(layer) if self._padding else Padding.none(layer)


def _plugin(*backends, cost=None):
    class P:
        @hookimpl
        def register_backends(self):
            return list(backends)
    p = P()
    if cost is not None:
        p.moe_cost = hookimpl(cost)
    return p


def test_a_third_party_cannot_take_over_a_built_in_name(monkeypatch):
    """An entry point sorted before the built-ins ('aaa-hijack') registering 'aiter-ck': the built-in keeps its name
    and the third party gets the duplicate error (entry points were sorted by name alone)."""
    module = _plugin(Yes("aiter-ck", preference=80))
    ep = SimpleNamespace(name="aaa-hijack", value="hijack:plugin", load=lambda: module,
                         dist=SimpleNamespace(metadata={"Name": "hijack", "Version": "1"}, _path="hijack"))
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: [ep] + real)
    reg = build_registry()
    assert dict(reg.owners)["aiter-ck"] == "aiter-ck"
    rec = next(p for p in reg.plugins if p.name == "aaa-hijack")
    assert any("duplicate backend name 'aiter-ck'" in e for e in rec.errors)


def test_a_padding_plan_that_breaks_the_pad_contract_is_rejected():
    """A 256 intermediate pad the kernel computes over (pad_semantics 'compute') without zero_fill: wrong output.
    assert_backend_contract rejected it; the selector chose it (newcomer review)."""
    def pad(layer):
        return Padding(hidden=layer.hidden, intermediate_per_rank=layer.intermediate_per_rank + 256,
                       intermediate_pad=256, kernel_intermediate_pad=0, zero_fill=False, pad_semantics="compute")
    reg = build_registry([("nozero", _plugin(Yes("nozero-moe", padding=pad)))])
    d = select(_layer(), fake_capabilities("MI355X", "0.1.20.post1"), reg.backends)
    assert d.backend != "nozero-moe"
    rej = next(r for r in d.rejected if r.backend == "nozero-moe")
    assert "breaks the pad contract" in rej.reasons[0].text and "zero_fill is False" in rej.reasons[0].text


def test_a_supported_verdict_carrying_a_failure_is_a_plugin_error():
    reg = build_registry([("two-faced", _plugin(Yes("two-faced", verdict=Verdict(
        True, (Reason("cannot actually run this", "failed"),)))))])
    d = select(_layer(), fake_capabilities("MI355X", "0.1.20.post1"), reg.backends)
    assert d.backend != "two-faced"
    rej = next(r for r in d.rejected if r.backend == "two-faced")
    assert "supported Verdict carrying a 'failed' reason: cannot actually run this" in rej.reasons[0].text


@pytest.mark.parametrize("attrs, needle", [
    ({"name": "Bad Name,X"}, "has a comma or whitespace"),
    ({"family": 5}, "family must be a string or None"),
    ({"description": None}, "description must be a string"),
])
def test_declarations_of_the_wrong_type_are_plugin_errors(attrs, needle):
    b = Yes("typed")
    for k, v in attrs.items():
        setattr(b, k, v)
    reg = build_registry([("typed", _plugin(b))])
    assert "typed" not in reg.names() and "Bad Name,X" not in reg.names()
    assert any(needle in e for e in reg.errors), reg.errors


def _cost_case(monkeypatch, body):
    from moedispatch.core.workload import Runtime
    from moedispatch.selector.runtime import costs_for

    b = Yes("cost-moe")
    reg = build_registry([("coster", _plugin(b, cost=body))])
    caps = fake_capabilities("MI355X", "0.1.20.post1")
    return costs_for(b, _layer(), caps, Padding.none(_layer()), Runtime(tokens=(1, 64)), pm=reg.pm)


def test_a_cost_below_the_roofline_is_raised_to_it(monkeypatch):
    """A point below the roofline whose range reaches above it is raised to the roofline (the range kept)."""
    def moe_cost(backend, layer, caps, tokens):
        return [{"tokens": t, "us": 0.001, "low": 0.0009, "high": 1e6} for t in tokens]
    costs = _cost_case(monkeypatch, moe_cost)
    assert all(c.us > 1 and "raised from 0.001 µs to the datasheet roofline" in c.detail for c in costs), costs
    assert all(c.low == c.us and c.high == 1e6 for c in costs), costs


def test_a_cost_range_wholly_below_the_roofline_is_ignored_for_the_model(monkeypatch):
    """0.001 µs (0.0009–0.0011) cannot be: raised, it was a zero-width bar at the roofline that out-ranked every
    honest range. It is invalid (logged once) and the cost model answers, as for any other invalid answer."""
    def moe_cost(backend, layer, caps, tokens):
        return [{"tokens": t, "us": 0.001, "low": 0.0009, "high": 0.0011} for t in tokens]
    costs = _cost_case(monkeypatch, moe_cost)
    assert costs and all(c.basis != "plugin" and c.high > c.low and "raised from" not in c.detail for c in costs), \
        costs


def test_a_hanging_cost_hook_is_cut_by_the_plugin_deadline(monkeypatch):
    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", "0.2")
    release = threading.Event()

    def moe_cost(backend, layer, caps, tokens):
        release.wait(10)
    import time

    start = time.perf_counter()
    try:
        costs = _cost_case(monkeypatch, moe_cost)   # the roofline answers instead, within the deadline
    finally:
        release.set()
    assert time.perf_counter() - start < 5   # it waited for the hook (an hour in the review's case)
    assert costs and all(c.basis != "plugin" for c in costs)


def test_what_a_cost_hook_prints_stays_out_of_the_report(monkeypatch, capsys):
    def moe_cost(backend, layer, caps, tokens):
        print("HELLO FROM COST")
        return [{"tokens": t, "us": 500.0, "low": 400.0, "high": 600.0} for t in tokens]
    costs = _cost_case(monkeypatch, moe_cost)
    assert [c.basis for c in costs] == ["plugin", "plugin"]
    assert "HELLO FROM COST" not in capsys.readouterr().out


def test_allow_and_deny_lists_take_backend_names(monkeypatch):
    """docs/plugins.md: the lists take entry-point or backend names. A backend name in the allow list loaded nothing
    ('matches no plugin'); in the deny list it worked but said 'nothing was disabled for it'."""
    module = _plugin(Yes("mine-moe"))
    ep = SimpleNamespace(name="mine", value="mine:plugin", load=lambda: module,
                         dist=SimpleNamespace(metadata={"Name": "moedispatch-mine", "Version": "1"}, _path="mine"))
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [ep])
    monkeypatch.setenv("MOEDISPATCH_LOAD_PLUGINS", "mine-moe")
    reg = build_registry()
    assert reg.names() == ("mine-moe",) or list(reg.names()) == ["mine-moe"]
    assert not [e for e in reg.errors if "matches no plugin" in e]
    monkeypatch.delenv("MOEDISPATCH_LOAD_PLUGINS")
    monkeypatch.setenv("MOEDISPATCH_DISABLE_PLUGINS", "mine-moe")
    reg = build_registry()
    assert "mine-moe" not in reg.names() and "aiter-ck" in reg.names()
    assert not [e for e in reg.errors if "nothing was disabled" in e], reg.errors



def test_hook_errors_name_the_hooks_and_keep_pluggys_reason():
    """A misspelt hook listed only register_* (moe_cost missing); a wrong argument name lost pluggy's second line,
    which names the argument."""
    class Misspelt:
        @hookimpl
        def moe_costs(self, backend, layer, caps, tokens):
            return None

        @hookimpl
        def register_backends(self):
            return [Yes("spelt")]

    reg = build_registry([("misspelt", Misspelt())])
    assert any("unknown hook 'moe_costs' (moedispatch hooks: moe_cost, register_backends) (did you mean "
               "'moe_cost'?)" in e for e in reg.errors), reg.errors

    class BadArg:
        @hookimpl
        def register_backends(self, cfg):
            return []

    reg = build_registry([("bad-argname", BadArg())])
    assert any("PluginValidationError" in e and "cfg" in e for e in reg.errors), reg.errors


def test_a_plugin_with_no_hook_says_so():
    """register_backends without @hookimpl: pluggy registers the module silently and it showed as "ok"."""
    class Undecorated:
        def register_backends(self):
            return [Yes("never")]

    reg = build_registry([("undecorated", Undecorated())])
    rec = next(p for p in reg.plugins if p.name == "undecorated")
    assert any("implements no register_backends hook (is it decorated with @moedispatch.hookimpl?)" in w
               for w in rec.warnings), rec


def test_a_listable_name_outside_the_convention_is_still_accepted():
    """The plugin API fixes no naming rule beyond what the allow/deny lists can carry (an extension, not a break)."""
    reg = build_registry([("caps", _plugin(Yes("Acme-MoE_2.0")))])
    assert "Acme-MoE_2.0" in reg.names() and not reg.errors
