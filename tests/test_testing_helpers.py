"""moedispatch.testing used the way a plugin author would: tables of layers × simulated targets, no GPU."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import moedispatch
from moedispatch.core.reason import texts
from moedispatch import Backend, Padding, Verdict, hookimpl
from moedispatch.core.errors import PluginError, UsageError
from moedispatch.selector import plugins
from moedispatch.selector.plugins import build_registry
from moedispatch.selector.pure import select
from moedispatch.testing import (
    ContractResult,
    assert_backend_contract,
    builtin_plugins,
    fake_capabilities,
    layer,
    registered,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "examples" / "moedispatch-acme"))
import moedispatch_acme  # noqa: E402  (the example plugin, imported from its source folder)

sys.path.pop(0)

# The built-in backends as moedispatch itself loads them (entry points of the moedispatch distribution).
BUILTINS = {b.name for _, module in builtin_plugins() for b in module.register_backends()}

# A plugin author's table: real model shapes, as an engine would pass them.
MIXTRAL = layer(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2, model="Mixtral-8x7B")
MIXTRAL_TP8 = layer(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2, tp_size=8)
QWEN3_TP8 = layer(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, tp_size=8)
DEEPSEEK_FP8 = layer(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8, weight_quant="fp8",
                     activation_quant="fp8", weight_granularity="block128x128", activation_granularity="group128")
GPT_OSS = layer(hidden_size=2880, intermediate_size=2880, num_experts=128, top_k=4, weight_quant="mxfp4",
                activation="swigluoai", has_bias=True)
QWEN35_MXFP4 = layer(hidden_size=4096, intermediate_size=1024, num_experts=512, top_k=10, weight_quant="mxfp4",
                     activation_quant="mxfp4")
TOP10_BF16 = layer(hidden_size=4096, intermediate_size=1024, num_experts=512, top_k=10)
LAYERS = [MIXTRAL, MIXTRAL_TP8, QWEN3_TP8, DEEPSEEK_FP8, GPT_OSS, QWEN35_MXFP4, TOP10_BF16]
TARGETS = ["gfx90a", "gfx942", "gfx950", "MI325X", "MI355X"]


# -- fake_capabilities ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, gfx, fp8, mx", [
    ("gfx942", "gfx942", "e4m3fnuz", False),
    ("MI300X", "gfx942", "e4m3fnuz", False),
    ("gfx950", "gfx950", "e4m3fn", True),
    ("mi355x", "gfx950", "e4m3fn", True),
    ("gfx90a", "gfx90a", None, False),
])
def test_fake_capabilities_are_the_explain_target(target, gfx, fp8, mx):
    """A simulated target has the arch facts capability_db holds, the same as explain --target builds."""
    caps = fake_capabilities(target)
    assert (caps.gfx, caps.fp8_format, caps.native_mx) == (gfx, fp8, mx)
    assert caps == moedispatch.data.capdb.target_capabilities(target)


def test_fake_capabilities_aiter_version_and_overrides():
    """aiter_version picks features (or none); overrides replace fields and stay hashable."""
    assert fake_capabilities().gfx == "gfx950"
    assert fake_capabilities("gfx942", aiter_version="none").aiter_version is None
    old = fake_capabilities("gfx942", aiter_version="0.1.10")
    assert old.aiter_version == "0.1.10" and old.aiter_features <= fake_capabilities("gfx942").aiter_features
    caps = fake_capabilities("gfx950", native_mx=False, aiter_features={"fused_moe_pads"},
                           packages={"flydsl": "0.2.0"})
    assert caps.native_mx is False and caps.aiter_features == frozenset({"fused_moe_pads"})
    assert caps.package("flydsl") == "0.2.0"
    hash(caps)
    with pytest.raises(TypeError, match="unknown Capabilities field"):
        fake_capabilities("gfx942", nativ_mx=False)


# -- layer ------------------------------------------------------------------------------------------------------

def test_layer_takes_the_engine_fields_and_shards():
    """layer() accepts select_moe_backend's fields (and engine aliases) and does the TP/EP sharding."""
    assert (MIXTRAL_TP8.intermediate, MIXTRAL_TP8.intermediate_per_rank, MIXTRAL_TP8.experts_per_rank) == \
        (14336, 1792, 8)
    assert DEEPSEEK_FP8.weight.describe() == "fp8/block128x128"
    assert GPT_OSS.act.dtype == "bf16" and GPT_OSS.weight.granularity == "group32"
    assert GPT_OSS.param("limit") == 7.0
    assert layer(hidden_dim=4096, moe_intermediate_size=1024, num_local_experts=64, topk=8, ep_size=8).experts_per_rank == 8
    with pytest.raises(UsageError, match="needs"):
        layer(hidden_size=4096)
    with pytest.raises(UsageError, match="not divisible"):
        layer(hidden_size=4096, intermediate_size=1000, num_experts=8, top_k=2, tp_size=16)


# -- assert_backend_contract: the example plugin against the whole table ------------------------------------------

def test_example_backend_honours_the_contract_on_every_layer_and_target():
    """Every (layer, target) cell of the table passes the contract; the results say where acme-moe applies."""
    results = assert_backend_contract(moedispatch_acme.AcmeMoE(), LAYERS, [fake_capabilities(t) for t in TARGETS])
    assert len(results) == len(LAYERS) * len(TARGETS)
    assert all(isinstance(r, ContractResult) for r in results)
    supported = {(r.caps.gfx, r.layer) for r in results if r.supported}
    bf16_ok = [MIXTRAL, MIXTRAL_TP8, QWEN3_TP8]
    assert supported == {(gfx, la) for gfx in ("gfx942", "gfx950") for la in bf16_ok}


@pytest.mark.parametrize("layer_, target, reason", [
    (MIXTRAL, "gfx90a", "acme-moe is built for gfx942 and gfx950 only; target is gfx90a (MI210)"),
    (DEEPSEEK_FP8, "gfx942", "acme-moe runs bf16 weights × bf16 activations only; layer has weights "
                             "fp8/block128x128 × activations fp8/group128 dynamic"),
    (GPT_OSS, "gfx950", "acme-moe implements activations silu, gelu, not swigluoai"),
    (GPT_OSS, "gfx950", "acme-moe has no expert-bias epilogue; the layer has expert bias"),
    (TOP10_BF16, "gfx950", "acme-moe routes at most 8 experts per token; top_k is 10"),
])
def test_example_backend_rejects_with_specific_reasons(layer_, target, reason):
    """Each failed rule is a reason of its own, worded for the user."""
    verdict = moedispatch_acme.AcmeMoE().check(layer_, fake_capabilities(target))
    assert not verdict.supported and reason in texts(verdict.reasons)


@pytest.mark.parametrize("layer_, padded, pad", [(MIXTRAL, 14336, 0), (MIXTRAL_TP8, 1792, 0), (QWEN3_TP8, 128, 32)])
def test_example_backend_pads_intermediate_to_128(layer_, padded, pad):
    """acme-moe rounds intermediate per rank up to 128, zero-filled, with the real pad passed to the kernel."""
    padding = moedispatch_acme.AcmeMoE().plan_padding(layer_, fake_capabilities("gfx942"))
    assert (padding.intermediate_per_rank, padding.intermediate_pad, padding.kernel_intermediate_pad) == \
        (padded, pad, pad)
    assert padding.zero_fill is bool(pad) and padding.hidden_pad == 0


class _Broken(Backend):
    name, preference = "broken", 1

    def __init__(self, *, verdict=None, padding=None, impure=False):
        self._verdict, self._padding, self._impure, self._calls = verdict, padding, impure, 0

    def check(self, layer_, caps):
        self._calls += 1
        if self._impure:
            return Verdict.supported(f"call {self._calls}")
        return self._verdict if self._verdict is not None else Verdict.supported("ok")

    def plan_padding(self, layer_, caps):
        return self._padding(layer_) if self._padding else Padding.none(layer_)


@pytest.mark.parametrize("backend, message", [
    (_Broken(verdict=True), "check() returned bool, not a moedispatch.Verdict"),
    (_Broken(verdict=Verdict(False, ())), "must say why"),
    (_Broken(verdict=Verdict(False, ("  ",))), "empty reason"),
    (_Broken(impure=True), "check() is not pure"),
    (_Broken(padding=lambda la: {"hidden": la.hidden}), "plan_padding() returned dict"),
    (_Broken(padding=lambda la: Padding(hidden=la.hidden + 64, intermediate_per_rank=la.intermediate_per_rank)),
     "hidden 4160 - hidden_pad 0 != layer hidden 4096"),
    (_Broken(padding=lambda la: dataclasses.replace(
        Padding.aligned(la, intermediate_multiple=1000, kernel_intermediate_pad=0), zero_fill=False)),
     "zero_fill is False"),
])
def test_contract_violations_are_reported_with_backend_target_and_layer(backend, message):
    """A broken backend fails the contract with a message naming what broke, where."""
    with pytest.raises(AssertionError) as info:
        assert_backend_contract(backend, [MIXTRAL], fake_capabilities("gfx942"))
    text = str(info.value)
    assert message in text and "backend 'broken' on gfx942 (MI300X)" in text and "hidden 4096" in text


def test_contract_checks_name_and_preference():
    """Backend identity is part of the contract: a lower-case hyphenated name and an int preference."""
    bad_name = _Broken()
    bad_name.name = "Acme MoE"
    with pytest.raises(AssertionError, match="lower-case"):
        assert_backend_contract(bad_name, [MIXTRAL], [fake_capabilities("gfx942")])
    bad_pref = _Broken()
    bad_pref.preference = 1.5
    with pytest.raises(AssertionError, match="preference must be an int"):
        assert_backend_contract(bad_pref, [MIXTRAL], [fake_capabilities("gfx942")])


# -- registered ------------------------------------------------------------------------------------------------

def test_registered_is_the_builtins_plus_the_plugin():
    """registered(module) loads the built-ins (with their provenance) and the plugin module, nothing else."""
    registry = registered(moedispatch_acme)
    assert set(registry.names()) == BUILTINS | {"acme-moe"}
    assert registry.owner("acme-moe") == "moedispatch_acme" and not registry.errors
    builtin = [p for p in registry.plugins if p.builtin]
    assert {p.name for p in builtin} == BUILTINS and all(p.package == "moedispatch" for p in builtin)
    assert registered(moedispatch_acme, builtins=False).names() == ("acme-moe",)
    assert {name for name, _ in builtin_plugins()} == {p.name for p in build_registry().plugins if p.builtin}


@pytest.mark.parametrize("layer_, target, expected", [
    (MIXTRAL, "gfx942", "acme-moe"),
    (MIXTRAL, "gfx950", "acme-moe"),
    (MIXTRAL, "gfx90a", "triton"),
    (QWEN3_TP8, "gfx942", "acme-moe"),
    (DEEPSEEK_FP8, "gfx942", "aiter-ck"),
    (TOP10_BF16, "gfx950", "aiter-ck"),
])
def test_selection_table_with_the_plugin_registered(layer_, target, expected):
    """With the example registered, its preference 90 wins exactly where its check passes."""
    decision = select(layer_, fake_capabilities(target), registered(moedispatch_acme).backends)
    assert decision.backend == expected
    if expected != "acme-moe":
        assert decision.rejection("acme-moe") is not None


def test_registered_as_context_manager_is_process_wide_and_restored():
    """Inside the block select_moe_backend sees the plugin; after it, the real registry is back."""
    before = plugins.get_registry()
    with registered(moedispatch_acme.AcmeMoE()) as registry:
        assert plugins.get_registry() is registry
        decision = moedispatch.select_moe_backend(MIXTRAL, fake_capabilities("gfx942"))
        assert decision.backend == "acme-moe"
        assert decision.rejection("aiter-ck").reasons[0].text == "supported, outranked by acme-moe (preference 90 > 80)"
    assert plugins.get_registry() is before and "acme-moe" not in plugins.get_registry().names()
    assert moedispatch.select_moe_backend(MIXTRAL, fake_capabilities("gfx942")).backend == "aiter-ck"


def test_registered_isolates_plugin_errors_or_raises_when_strict():
    """A plugin that raises is recorded with its error; strict=True raises PluginError instead."""
    class Exploding:
        @hookimpl
        def register_backends(self):
            raise RuntimeError("no licence server")

    registry = registered(("exploding", Exploding()))
    assert registry.errors == ("exploding: register_backends raised RuntimeError: no licence server",)
    assert set(registry.names()) == BUILTINS
    with pytest.raises(PluginError, match="no licence server"):
        registered(("exploding", Exploding()), strict=True)
    with pytest.raises(TypeError, match="pass an instance"):
        registered(moedispatch_acme.AcmeMoE)


def test_fixtures_from_pytest_plugins(tmp_path):
    """pytest_plugins = ["moedispatch.testing"] in a plugin's conftest.py provides the factories and a clean env."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["moedispatch.testing"]\n')
    (tmp_path / "test_uses_fixtures.py").write_text(textwrap.dedent("""
        import os
        import moedispatch

        def test_fixtures(moedispatch_caps, moedispatch_layer, moedispatch_clean_env):
            assert "MOEDISPATCH_DISABLE_PLUGINS" not in os.environ
            caps = moedispatch_caps("gfx942", aiter_version="none")
            layer = moedispatch_layer(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2)
            assert caps.aiter_version is None and layer.intermediate_per_rank == 14336
            assert moedispatch.select_moe_backend(layer, caps).backend == "triton"  # no AITER: no CK path
    """))
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTEST_ADDOPTS"}
    env["MOEDISPATCH_DISABLE_PLUGINS"] = "triton"  # the fixture must clear this
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


# -- the hook itself ---------------------------------------------------------------------------------------------

def test_hook_register_backends():
    """register_backends: every plugin's implementation is called; generators, lists and None all work; each
    backend is attributed to its plugin and the plugin lists the hook."""
    calls = []

    class Lister:
        @hookimpl
        def register_backends(self):
            calls.append("lister")
            return [moedispatch_acme.AcmeMoE()]

    class Generator:
        @hookimpl
        def register_backends(self):
            calls.append("generator")
            yield from ()

    class Nothing:
        @hookimpl
        def register_backends(self):
            calls.append("nothing")
            return None

    registry = registered(("lister", Lister()), ("generator", Generator()), ("nothing", Nothing()))
    assert sorted(calls) == ["generator", "lister", "nothing"]
    assert registry.owner("acme-moe") == "lister" and not registry.errors
    records = {p.name: p for p in registry.plugins}
    assert records["lister"].hooks == ("register_backends",) and records["lister"].backends == ("acme-moe",)
    assert records["generator"].backends == () and records["nothing"].backends == ()

    @hookimpl
    def register_backends():
        return [moedispatch_acme.AcmeMoE()]

    assert "acme-moe" in registered(register_backends).names()
