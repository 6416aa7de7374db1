"""A second plugin author's review (a vendor shipping its own fused-MoE kernel library as a third-party backend):
each defect found, as a test that went red on the code before it — two installed distributions declaring one
entry-point name, a padding multiple that is not positive, a plan whose sizes are not the multiples it declares, a
plugin's own claims rendered as confirmed facts, a broken cost hook logged once per layer group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.selector import plugins as mp
from moedispatch.selector.plugins import build_registry


class Fused(Backend):
    name = "fusedamd-moe"
    preference = 95
    family = "fusedamd"

    def check(self, layer, caps):
        return Verdict.supported(f"fusedamd runs {layer.weight.describe()} on {caps.gfx}")

    def plan_padding(self, layer, caps):
        return Padding.none(layer)


def _module():
    class M:
        @hookimpl
        def register_backends(self):
            return [Fused()]
    return M()


def _ep(name, package, version):
    module = _module()
    return SimpleNamespace(name=name, value=f"{package.replace('-', '_')}:plugin", load=lambda: module,
                           dist=SimpleNamespace(metadata={"Name": package, "Version": version},
                                                _path=f"{package}-{version}"))


def test_two_distributions_declaring_one_entry_point_name_get_one_clear_line(monkeypatch):
    """A renamed package installed next to the old one (both declare 'fusedamd-moe'): the second is reported naming
    both distributions and what to do — not pluggy's "Plugin name already registered: …" dump of every module."""
    real = list(mp._entry_points())
    monkeypatch.setattr(mp, "_entry_points", lambda: real + [_ep("fusedamd-moe", "moedispatch-fusedamd-ng", "0.4.0"),
                                                              _ep("fusedamd-moe", "moedispatch-fusedamd", "0.3.0")])
    reg = build_registry()
    assert reg.names().count("fusedamd-moe") == 1
    (error,) = [e for p in reg.plugins if p.package == "moedispatch-fusedamd" for e in p.errors]
    assert error == ("cannot register plugin: entry point name 'fusedamd-moe' of moedispatch-fusedamd 0.3.0 is "
                     "already taken by moedispatch-fusedamd-ng 0.4.0; uninstall one of them or rename this entry point")


def _qwen_tp8():
    from moedispatch.testing import layer
    return layer(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, tp_size=8)   # 96 per rank


@pytest.mark.parametrize("kwargs", [{"intermediate_multiple": 0}, {"intermediate_multiple": -128},
                                    {"hidden_multiple": 0}, {"intermediate_multiple": 128.0}])
def test_a_padding_multiple_that_is_not_a_positive_int_is_refused(kwargs):
    """Padding.aligned(layer, intermediate_multiple=0) (or a negative tile) returned an unpadded plan claiming that
    alignment: a kernel needing its 128 N tile ran on 96/rank with no error anywhere."""
    with pytest.raises(ValueError, match="multiple must be a positive int"):
        Padding.aligned(_qwen_tp8(), **kwargs)
    with pytest.raises(ValueError, match="multiple must be a positive int"):
        Padding(hidden=2048, intermediate_per_rank=96, **kwargs)


def test_a_plan_whose_sizes_miss_its_declared_multiple_is_warned():
    """A plan declaring intermediate_multiple 128 but allocating 136/rank (96 + 40) was chosen silently; it breaks
    its own declared alignment. The plugin API has always taken the multiples as informational (a contract users rely
    on), so it is still chosen, with a warning naming the sizes."""
    from moedispatch.selector.pure import select_uncached
    from moedispatch.testing import fake_capabilities

    class OffTile(Fused):
        def plan_padding(self, layer, caps):
            return Padding(hidden=layer.hidden, intermediate_per_rank=136, intermediate_pad=40,
                           kernel_intermediate_pad=40, zero_fill=True, intermediate_multiple=128)

    d = select_uncached(_qwen_tp8(), fake_capabilities("gfx942"), [OffTile(), *build_registry().backends])
    assert d.backend == "fusedamd-moe"
    assert [w.text for w in d.warnings] == [
        "fusedamd-moe: plan_padding() returned sizes that are not the multiples it declares (hidden 2048 / "
        "hidden_multiple 1, intermediate_per_rank 136 / intermediate_multiple 128): check the plugin's alignment"]


def test_a_third_party_plugins_unsourced_claims_are_shown_unconfirmed():
    """A plugin's plain-string reasons became Reasons of confidence 'confirmed' ("read in the cited primary source")
    with no source at all: its own word read like one of moedispatch's verified rules in the why/not lines. They are
    marked unconfirmed; a reason the plugin cites (or marks itself) is left as it says."""
    from moedispatch.core.reason import Reason
    from moedispatch.selector.pure import select_uncached
    from moedispatch.testing import fake_capabilities

    class Cited(Fused):
        name = "fusedamd-cited"
        preference = 10

        def check(self, layer, caps):
            return Verdict.supported(Reason("fusedamd bf16 kernel", "supports", "acme/fusedamd@v0.3:README.md"))

    class Padded(Fused):
        def plan_padding(self, layer, caps):
            return Padding.aligned(layer, intermediate_multiple=128, pad_semantics="skip", notes=("its N tile",))

    builtins = build_registry().backends
    d = select_uncached(_qwen_tp8(), fake_capabilities("gfx942"), [Padded(), Cited(), *builtins])
    assert d.backend == "fusedamd-moe"
    by_text = {r.text: r for r in d.reasons}
    assert by_text["fusedamd runs bf16 on gfx942"].confidence == "unconfirmed"
    assert by_text["its N tile"].confidence == "unconfirmed"
    assert by_text["its N tile"].marked() == "its N tile (unconfirmed)"
    cited = d.rejection("fusedamd-cited").reasons[1]
    assert (cited.text, cited.confidence) == ("fusedamd bf16 kernel", "confirmed")
    # the built-ins' own reasons are moedispatch's: untouched
    assert all(r.confidence == "confirmed" for r in d.rejection("aiter-ck").reasons[1:2])


@pytest.mark.parametrize("answer, event", [
    (lambda tokens: [{"tokens": t, "us": float("nan"), "low": float("nan"), "high": float("nan")} for t in tokens],
     "plugin_cost_invalid"),
    (lambda tokens: [{"tokens": t, "us": -5.0, "low": -6.0, "high": -4.0} for t in tokens], "plugin_cost_invalid"),
    (lambda tokens: 1 / 0, "plugin_cost_failed"),
])
def test_a_broken_cost_hook_is_logged_once_per_run(answer, event, caplog):
    """A moe_cost answering NaN (or a negative time, or raising) for a 48-layer model logged the same warning once per
    layer group and call — 12 identical lines on explain's stderr; once says it."""
    import logging

    from moedispatch.core.workload import Runtime
    from moedispatch.plan.plan import plan_model
    from moedispatch.sources.models import load_model
    from moedispatch.testing import fake_capabilities, registered

    class Cost:
        @hookimpl
        def register_backends(self):
            return [Fused()]

        @hookimpl
        def moe_cost(self, backend, layer, caps, tokens):
            return answer(tokens) if backend == "fusedamd-moe" else None

    with registered(Cost()) as reg, caplog.at_level(logging.WARNING, logger="moedispatch"):
        plan = plan_model(load_model("Qwen3-30B-A3B"), fake_capabilities("MI355X"), 8, backends=reg.backends,
                          runtime=Runtime(tokens=(1, 64, 8192)))
    assert {d.backend for d in plan.decisions if d.layer.kind == "moe"} == {"fusedamd-moe"}
    logged = [r.structlog_event for r in caplog.records if getattr(r, "structlog_event", {}).get("event") == event]
    assert [e["backend"] for e in logged] == ["fusedamd-moe"]


def test_the_dev_extra_carries_what_builds_the_example_plugin():
    """tests/test_example_plugin.py installs the example with --no-build-isolation --no-index, i.e. with the venv's
    setuptools; in a venv made as the README says (`pip install -e '.[dev]'`, Python 3.11: setuptools 65, no
    bdist_wheel) every test there errored. The dev extra must carry the example's build requirements."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dev = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    example = tomllib.loads((root / "plugins" / "examples" / "moedispatch-acme" / "pyproject.toml").read_text())
    assert set(example["build-system"]["requires"]) <= set(dev)
