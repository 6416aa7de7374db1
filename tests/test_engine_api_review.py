"""An engine integrator's review of select_moe_backend() and verify: wrong argument types are refused (never
guessed or truncated, cold or warm cache alike), caps=None plans for explain's AITER, emulation is not claimed for
an activation it cannot compute, and verify checks the layer's own top-k routing."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import tree_python

import moedispatch
from moedispatch import UsageError, select_moe_backend
from moedispatch import api
from moedispatch.core.layers import MoELayer
from moedispatch.core.backend import Padding

MIXTRAL = dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2)


@pytest.mark.parametrize("field,value", [("has_bias", "false"), ("has_bias", 1), ("tp_size", 8.7), ("tp_size", True),
                                         ("ep_size", 2.0), ("index", 3.5)])
def test_wrong_field_types_are_refused_not_coerced(field, value):
    """has_bias="false" planned a biased layer (bool("false") is True) and tp_size=8.7 planned TP 8."""
    with pytest.raises(UsageError, match="must be"):
        select_moe_backend(caps="MI300X", **MIXTRAL, **{field: value})


def test_per_partition_size_with_a_bad_type_is_a_usage_error():
    with pytest.raises(UsageError, match="intermediate_size_per_partition must be an integer"):
        select_moe_backend(caps="MI300X", hidden_size=4096, intermediate_size_per_partition="1792", num_experts=8,
                           top_k=2, tp_size=8)


def test_a_warm_cache_does_not_accept_what_a_cold_one_rejects():
    """4096.0 == 4096 and True == 1 hash alike: after the int call was cached, the float call returned its Decision."""
    caps = moedispatch.target("MI300X")
    assert select_moe_backend(caps=caps, **MIXTRAL).backend == "aiter-ck"
    with pytest.raises(UsageError, match="hidden must be an integer, got 4096.0"):
        select_moe_backend(caps=caps, **dict(MIXTRAL, hidden_size=4096.0))
    select_moe_backend(caps=caps, **dict(MIXTRAL, top_k=1))
    with pytest.raises(UsageError, match="top_k must be an integer, got True"):
        select_moe_backend(caps=caps, **dict(MIXTRAL, top_k=True))


def test_caps_none_plans_for_the_aiter_explain_plans_for(monkeypatch):
    """explain honours MOEDISPATCH_AITER_VERSION (and the installed AITER); the engine API planned for the newest
    capability_db knows, so the engine and the CLI chose different backends on the same machine."""
    monkeypatch.setattr(api, "_caps", None)
    monkeypatch.delenv("MOEDISPATCH_TARGET", raising=False)
    monkeypatch.setenv("MOEDISPATCH_AITER_VERSION", "0.1.15.post3")
    assert api.default_capabilities().aiter_version == "0.1.15.post3"
    d = select_moe_backend(**MIXTRAL)
    assert d.target["aiter_version"] == "0.1.15.post3"


def test_emulation_for_situv2_is_the_engine_s_path_and_says_verify_cannot_check_it(cli):
    """Kimi-K3's SiTU (situv2) without AITER plans 'emulation': the engine's dequantize-to-BF16 path ran it correctly
    in the field (vllm-project/vllm#50817, tests/field/cases.toml vllm50817-kimik3-mi325x-emulation), though
    moedispatch.numerics does not implement it — the reason says so (verify crashed on it)."""
    proc = cli("explain", "--model", "Kimi-K3-MXFP4", "--target", "MI300X", "--aiter-version", "none", "--tp", "8",
               "--format", "json")
    assert proc.returncode == 0, proc.stderr
    layer = json.loads(proc.stdout)["layers"][0]
    assert layer["backend"] == "emulation"
    assert any("moedispatch.numerics does not implement it, so verify cannot check this layer" in r
               for r in layer["reasons"])


def test_verify_of_an_activation_the_emulation_lacks_is_one_line(cli):
    proc = cli("verify", "--model", "Kimi-K3-MXFP4", "--target", "MI355X", "--tp", "8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "moedispatch: layer 0 cannot be verified: its activation situv2 is not one moedispatch.numerics implements "
        "(silu, gelu, gelu_tanh, swigluoai, swigluoai_uninterleave)"]


def test_verify_experts_below_top_k_is_refused(cli):
    """--experts 3 on a top-4 layer silently verified top-3 routing."""
    proc = cli("verify", "--model", "gpt-oss-20b", "--target", "MI355X", "--tp", "4", "--experts", "3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("moedispatch: --experts 3 is fewer than the top-4 routing of layer 0; "
                                   "use --experts 4 or more")
    pytest.importorskip("torch")
    from moedispatch.numerics.verify import run_verify

    layer = MoELayer.build(hidden=128, intermediate=64, experts=8, top_k=4)
    with pytest.raises(UsageError, match="fewer than the top-4 routing"):
        run_verify(layer, Padding.none(layer), backend="emulation", experts=3, tokens=2, seed=1)


def test_verify_experts_is_bounded_by_the_experts_per_rank(cli):
    """With EP a rank holds experts/ep; --experts above that was silently clamped."""
    proc = cli("verify", "--model", "DeepSeek-V3", "--target", "MI355X", "--tp", "8", "--ep", "8", "--experts", "64")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "moedispatch: --experts 64 is more than the 32 experts per rank of layer 3"


def test_no_backend_for_an_unknown_activation():
    """activation="slu" (a typo) planned 'emulation' instead of saying nothing can run it. Run against this tree's
    plugins (an editable install of another checkout would answer in-process)."""
    code = ("from moedispatch import NoBackendError, select_moe_backend\n"
            "try:\n"
            f"    select_moe_backend(caps='MI300X', activation='slu', **{MIXTRAL!r})\n"
            "except NoBackendError as exc:\n"
            "    print(exc.decision.rejection('emulation').reasons[0].text)\n")
    proc = subprocess.run(tree_python(code), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("activation slu not supported ("), proc.stdout


def test_engine_choice_without_caps_plans_for_the_aiter_explain_plans_for(monkeypatch):
    """engine_choice(caps=None) resolves the target as select_moe_backend does (MOEDISPATCH_AITER_VERSION, else the
    installed AITER): it took the newest AITER capability_db knows, whatever this Python had."""
    import moedispatch.engines.choice as ch

    seen = []
    real = ch.resolve_capabilities
    monkeypatch.setenv("MOEDISPATCH_AITER_VERSION", "0.1.15.post3")
    monkeypatch.setattr(ch, "resolve_capabilities", lambda *a: seen.append(a) or real(*a))
    ch.engine_choice("vllm", hidden_size=4096, intermediate_size=1536, num_experts=8, top_k=2, tp_size=1,
                     weight_quant="bf16", activation_quant="bf16")
    assert seen and seen[0][1] == "0.1.15.post3"


def test_integral_scalars_from_numpy_or_torch_are_plain_integers():
    """An engine that computes sizes with numpy (np.int64 from a config array) or holds them in a 0-d tensor got
    "experts must be an integer, got np.int64(256)"; integral scalars (``__index__``) are ints, the Decision's layer
    holds plain ints, and the warm cache answers them alike."""
    np = pytest.importorskip("numpy")
    caps = moedispatch.target("MI300X")
    plain = select_moe_backend(caps=caps, **MIXTRAL)
    d = select_moe_backend(caps=caps, **dict(MIXTRAL, num_experts=np.int64(8), top_k=np.int32(2)))
    assert d.to_dict() == plain.to_dict()
    assert type(d.layer.experts) is int and type(d.layer.top_k) is int
    per_rank = select_moe_backend(caps=caps, hidden_size=4096, intermediate_size_per_partition=np.int64(1792),
                                  num_experts=8, top_k=2, tp_size=np.int64(8))
    assert per_rank.layer.intermediate == 14336
    with pytest.raises(UsageError, match="experts must be an integer, got np.float64"):
        select_moe_backend(caps=caps, **dict(MIXTRAL, num_experts=np.float64(8)))
    with pytest.raises(UsageError, match="top_k must be an integer, got np.True_"):
        select_moe_backend(caps=caps, **dict(MIXTRAL, top_k=np.bool_(True)))


def test_a_mistyped_field_or_backend_says_what_was_meant():
    with pytest.raises(UsageError, match=r"unknown layer field 'num_expert' \(did you mean 'num_experts'\?\)"):
        select_moe_backend(caps="MI300X", hidden_size=4096, intermediate_size=14336, num_expert=8, top_k=2)
    with pytest.raises(UsageError, match=r"unknown backend 'aiter_ck' \(did you mean 'aiter-ck'\?\); registered: "):
        select_moe_backend(caps="MI300X", **MIXTRAL, force="aiter_ck")
    with pytest.raises(UsageError, match=r"unknown backend 'nonesuch'; registered: "):
        select_moe_backend(caps="MI300X", **MIXTRAL, force="nonesuch")
