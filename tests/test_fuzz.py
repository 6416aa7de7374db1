"""Property tests over every input a user controls: config.json, quantization_config, CLI arguments, capability_db.

The only allowed outcomes are a valid plan or a :class:`moedispatch.core.errors.MoedispatchError` whose message is one
clear line; the CLI maps those to exit 2 with one stderr line and no traceback. 2,650 examples in all (explicit
``max_examples``; ``deadline=None`` because CI machines are slow and shared).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moedispatch.core.reason import texts
from moedispatch.data import capdb
from moedispatch.kit import rules
from moedispatch.data.capdb import target_capabilities
from moedispatch.core.errors import MoedispatchError
from moedispatch.core.decision import NoBackendError
from moedispatch.render.explain import plan_model, render_json, render_table
from moedispatch.sources.models import builtin_models, expand_layers, parse_config
from moedispatch.selector.plugins import build_registry
from moedispatch.sources.quant import parse_quantization_config

FUZZ = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

_BACKENDS = None


def backends():
    global _BACKENDS
    if _BACKENDS is None:
        _BACKENDS = build_registry().backends
    return _BACKENDS


def one_line(exc: BaseException) -> None:
    text = str(exc)
    assert isinstance(exc, MoedispatchError), f"{type(exc).__name__}: {text}"
    assert text.strip(), f"{type(exc).__name__} with an empty message"
    assert "\n" not in text, f"multi-line error: {text!r}"


# -- value strategies ----------------------------------------------------------------------------------------

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**63), 2**63), st.floats(allow_nan=True),
    st.text(max_size=12), st.lists(st.integers(-2, 300), max_size=4), st.dictionaries(st.text(max_size=4),
                                                                                        st.integers(), max_size=2),
)
sizes = st.one_of(st.sampled_from([1, 2, 8, 32, 128, 256, 384, 704, 768, 1536, 2048, 2880, 3072, 4096, 6144, 7168,
                                   14336]), st.integers(-4, 70000), junk)
small = st.one_of(st.integers(0, 300), junk)
acts = st.one_of(st.sampled_from(["silu", "gelu", "gelu_pytorch_tanh", "swigluoai", "swiglu", "relu", "SiLU", ""]),
                 junk)
model_types = st.one_of(st.sampled_from(["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "minimax_m3_vl",
                                         "llama4", "grok-1", "glm4_moe", "kimi_k2", ""]), junk)

# -- quantization_config -------------------------------------------------------------------------------------

quark_tensor = st.one_of(st.none(), junk, st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["fp4", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2", "int8", "int4",
                                        "uint4", "bfloat16", "mx"]), junk),
    "qscheme": st.one_of(st.sampled_from(["per_group", "per_tensor", "per_channel", "per_token"]), junk),
    "group_size": st.one_of(st.sampled_from([32, 64, 128]), small),
    "scale_format": st.one_of(st.sampled_from(["e8m0", "float32"]), junk),
    "is_dynamic": st.one_of(st.booleans(), junk),
}))
ct_args = st.one_of(st.none(), junk, st.fixed_dictionaries({}, optional={
    "num_bits": st.one_of(st.sampled_from([4, 8, 16]), small),
    "type": st.one_of(st.sampled_from(["float", "int"]), junk),
    "strategy": st.one_of(st.sampled_from(["tensor", "channel", "token", "group", "block", "tensor_group"]), junk),
    "group_size": st.one_of(st.sampled_from([16, 32, 128]), small),
    "block_structure": st.one_of(st.just([128, 128]), junk),
    "dynamic": st.one_of(st.booleans(), junk),
    "symmetric": st.one_of(st.booleans(), junk),
}))
patterns = st.lists(st.one_of(st.sampled_from(["lm_head", "*self_attn*", "re:.*mlp.gate$", "re:[", "*experts*",
                                               "model.layers.0.mlp.gate_proj", "*"]), st.text(max_size=6)),
                    max_size=4)
quant_configs = st.one_of(
    junk,
    st.fixed_dictionaries({"quant_method": st.one_of(st.sampled_from(["fp8", "mxfp4", "mxfp8", "quark",
                                                                      "compressed-tensors", "compressed_tensors",
                                                                      "fbgemm_fp8", "gptq", "FP8"]), junk)},
                          optional={
        "activation_scheme": st.one_of(st.sampled_from(["dynamic", "static"]), junk),
        "weight_block_size": st.one_of(st.sampled_from([[128, 128], [1, 32], [0, 128]]), junk),
        "fmt": st.one_of(st.sampled_from(["e4m3", "e4m3fn", "e5m2", "e4m3fnuz"]), junk),
        "global_quant_config": st.one_of(junk, st.fixed_dictionaries({}, optional={
            "weight": quark_tensor, "input_tensors": quark_tensor, "output_tensors": quark_tensor})),
        "layer_quant_config": st.one_of(junk, st.dictionaries(st.sampled_from(["*experts*", "re:x", "*"]),
                                                              st.fixed_dictionaries({"weight": quark_tensor,
                                                                                     "input_tensors": quark_tensor}),
                                                              max_size=2)),
        "exclude": st.one_of(patterns, junk),
        "ignore": st.one_of(patterns, junk),
        "modules_to_not_convert": st.one_of(patterns, junk),
        "ignored_layers": st.one_of(patterns, junk),
        "config_groups": st.one_of(junk, st.dictionaries(st.sampled_from(["group_0", "group_1"]),
                                                         st.fixed_dictionaries({}, optional={
                                                             "targets": st.one_of(patterns, junk),
                                                             "weights": ct_args,
                                                             "input_activations": ct_args}), max_size=2)),
        "format": st.one_of(st.sampled_from(["float-quantized", "mxfp4-pack-quantized"]), junk),
    }),
)

MODULES = ("model.layers.3.mlp.experts.0.gate_proj", "model.layers.3.block_sparse_moe.experts.0.w1",
           "model.layers.0.mlp.gate_proj", "lm_head")


@settings(max_examples=800, **FUZZ)
@given(quant_configs)
def test_fuzz_quantization_config(q):
    try:
        scheme = parse_quantization_config(q)
    except MoedispatchError as exc:
        one_line(exc)
        return
    if scheme is not None:
        for name in MODULES:
            weight, act, why = scheme.for_module((name,))
            assert isinstance(why, str)
            weight.describe(), act.describe()


# -- config.json ---------------------------------------------------------------------------------------------

text_configs = st.fixed_dictionaries({}, optional={
    "hidden_size": sizes, "d_model": sizes, "num_hidden_layers": st.one_of(st.integers(1, 96), junk),
    "num_local_experts": small, "n_routed_experts": small, "num_experts": small,
    "num_experts_per_tok": st.one_of(st.integers(0, 10), junk), "moe_top_k": small,
    "moe_intermediate_size": sizes, "intermediate_size": sizes, "dense_intermediate_size": sizes,
    "hidden_act": acts, "model_type": model_types,
    "moe_layer_freq": st.one_of(st.integers(-1, 3), st.lists(st.integers(0, 1), max_size=8), junk),
    "first_k_dense_replace": small, "decoder_sparse_step": small, "interleave_moe_layer_step": small,
    "mlp_only_layers": st.one_of(st.lists(st.integers(-2, 10), max_size=3), junk),
    "n_shared_experts": small, "shared_intermediate_size": sizes, "shared_expert_intermediate_size": sizes,
    "torch_dtype": st.one_of(st.sampled_from(["bfloat16", "float16", "float32"]), junk),
    "swiglu_limit": st.one_of(st.floats(-10, 10), junk), "swiglu_alpha": st.one_of(st.floats(-10, 10), junk),
    "quantization_config": quant_configs,
})
configs = st.one_of(
    junk,
    text_configs,
    st.builds(lambda top, text, arch: {**top, "text_config": text, "architectures": arch},
              st.fixed_dictionaries({}, optional={"model_type": model_types, "quantization_config": quant_configs}),
              st.one_of(text_configs, junk), st.one_of(st.lists(st.text(max_size=8), max_size=2), junk)),
)


def _plan_or_error(config, target="gfx950", tp=1):
    try:
        spec = parse_config(config, name="fuzz", source="path", where="config.json")
    except MoedispatchError as exc:
        one_line(exc)
        return None
    try:
        layers = expand_layers(spec, tp, 1)
    except MoedispatchError as exc:
        one_line(exc)
        return None
    assert layers and all(la.kind in ("moe", "dense") for la in layers)
    plan = plan_model(spec, target_capabilities(target), tp, 1, backends=backends())
    json.loads(render_json(plan))
    render_table(plan)
    return plan


@settings(max_examples=700, **FUZZ)
@given(configs, st.sampled_from(["gfx942", "gfx950"]), st.sampled_from([1, 2, 8]))
def test_fuzz_config_json(config, target, tp):
    _plan_or_error(config, target, tp)


BUILTINS = [(e["name"], e["config"]) for e in builtin_models()]


@pytest.mark.parametrize("name,config", BUILTINS, ids=[n for n, _ in BUILTINS])
def test_valid_configs_are_never_an_allowed_error(name, config):
    """The fuzz tests accept a one-line error for broken input; an unbroken built-in config must plan (every MoE layer
    with a backend on gfx950 at TP 1 and 8), so a parser that rejects everything cannot pass them."""
    for tp in (1, 8):
        plan = _plan_or_error(copy.deepcopy(config), "gfx950", tp)
        assert plan is not None, (name, tp)
        moe = [d for d in plan.decisions if d.layer.kind == "moe"]
        assert moe and all(d.backend for d in moe), (name, tp)
        q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
        if q is not None:
            assert parse_quantization_config(q) is not None, name


def _mutate(config, path_choices, value, delete):
    cfg = copy.deepcopy(config)
    node = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) and path_choices[0] else cfg
    keys = sorted(node)
    key = keys[path_choices[1] % len(keys)]
    if delete:
        del node[key]
    else:
        node[key] = value
    return cfg


@settings(max_examples=200, **FUZZ)
@given(st.sampled_from(BUILTINS), st.tuples(st.booleans(), st.integers(0, 200)), st.one_of(junk, sizes, acts),
       st.booleans(), st.sampled_from([1, 8]))
def test_fuzz_builtin_configs_with_one_field_broken(entry, path, value, delete, tp):
    _, config = entry
    _plan_or_error(_mutate(config, path, value, delete), "gfx950", tp)


# -- CLI arguments -------------------------------------------------------------------------------------------

MODEL_NAMES = [e["name"] for e in builtin_models()]
tokens = st.one_of(
    st.sampled_from(["explain", "backends", "models", "--model", "--target", "--aiter-version", "--tp", "--ep",
                     "--backend", "--format", "--recipe", "--strict-plugins", "-v", "--log-format", "json", "table",
                     "gfx942", "gfx950", "MI300X", "mi355x", "gfx1100", "gfx90a", "gfx942:sramecc+:xnack-", "none",
                     "0.1.15.post3", "0.1.13.post1", "9.9.9", "0.1.21.post2+rocm7.1", "not-a-version", "8", "4",
                     "0", "-1", "3", "x", "vllm", "sglang", "triton", "aiter-ck", "emulation", "nope", "",
                     "--nonsense", "/nonexistent/config.json", "."]),
    st.sampled_from(MODEL_NAMES),
    st.text(alphabet="abcgfx0123456789.-_+:", max_size=10),
)
argvs = st.one_of(
    st.lists(tokens, max_size=8),
    st.builds(lambda model, rest: ["explain", "--model", model, *rest],
              st.one_of(st.sampled_from(MODEL_NAMES), st.text(max_size=10)), st.lists(tokens, max_size=7)),
)


@pytest.fixture
def restore_logging():
    logger = logging.getLogger("moedispatch")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@settings(max_examples=300, **FUZZ)
@given(argvs)
def test_fuzz_cli_arguments(restore_logging, argv):
    from moedispatch.cli import main

    if any(a in ("-h", "--help") for a in argv):
        return
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("MOEDISPATCH_TARGET")
    os.environ["MOEDISPATCH_TARGET"] = "gfx950"  # never probe the machine
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        if old is None:
            os.environ.pop("MOEDISPATCH_TARGET", None)
        else:
            os.environ["MOEDISPATCH_TARGET"] = old
    assert code in (0, 2, 3), (argv, code, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if code == 2:
        last = err.getvalue().strip().splitlines()[-1]
        assert last.startswith("moedispatch"), (argv, err.getvalue())
        assert out.getvalue() == ""


# -- capability_db entries -----------------------------------------------------------------------------------

REAL = {name: capdb.load_toml(name) for name in ("gpus.toml", "aiter.toml", "known_issues.toml")}


def _paths(node, prefix=()):
    """Every (path) into a nested TOML document, leaves and containers alike."""
    yield prefix
    if isinstance(node, dict):
        for k in sorted(node):
            yield from _paths(node[k], prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


PATHS = {name: [p for p in _paths(doc) if p] for name, doc in REAL.items()}
toml_values = st.one_of(st.booleans(), st.integers(-5, 5000), st.text(max_size=10),
                        st.sampled_from(["gfx942", "gfx950", "0.1.15", ">=0.1.12", "==", "MI300X", "e4m3fn",
                                         "wrong_output", "aiter-ck", "0.1.x"]),
                        st.lists(st.one_of(st.integers(-1, 600), st.text(max_size=5)), max_size=3),
                        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def _set(doc, path, value, delete):
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        if isinstance(node, dict):
            del node[path[-1]]
        else:
            node.pop(path[-1])
    else:
        node[path[-1]] = value


LAYERS = [
    dict(hidden=4096, intermediate=14336, experts=8, top_k=2, tp=8),
    dict(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="mxfp4",
         activation="swigluoai_uninterleave", activation_params={"alpha": 1.702, "limit": 7.0},
         model_type="minimax_m3_vl"),
    dict(hidden=2880, intermediate=2880, experts=128, top_k=4, tp=2, weight="mxfp4", has_bias=True,
         activation="swigluoai", activation_params={"alpha": 1.702, "limit": 7.0}, model_type="gpt_oss"),
    dict(hidden=7168, intermediate=2048, experts=256, top_k=8, tp=8, weight="fp8", act="fp8"),
]


def _clear_caches():
    from moedispatch import api as engine
    from moedispatch.selector import pure as selector

    for fn in (capdb.load_toml, capdb.gpus, capdb.aiter_db, rules.known_issues, rules._version_in):
        fn.cache_clear()
    selector.clear_cache()
    engine._fast.clear()


@pytest.fixture
def broken_db(monkeypatch):
    """broken_db(name, doc): serve ``doc`` as capability_db/<name> for the rest of the example."""
    docs = {}
    real_load = capdb.load_toml.__wrapped__

    def load(name):
        return copy.deepcopy(docs[name]) if name in docs else real_load(name)

    def use(name, doc):
        docs.clear()
        docs[name] = doc
        _clear_caches()

    monkeypatch.setattr(capdb, "load_toml", load)
    load.cache_clear = lambda: None  # type: ignore[attr-defined]
    yield use
    monkeypatch.undo()
    _clear_caches()


def test_unbroken_capability_db_is_never_an_allowed_error(broken_db):
    """The capability_db fuzz test accepts a one-line error for a broken entry; the real files load and select every
    layer of :data:`LAYERS` on every target without one."""
    from moedispatch.core.layers import MoELayer
    from moedispatch.selector.pure import select

    for name in sorted(REAL):
        broken_db(name, copy.deepcopy(REAL[name]))
        capdb.gpus(), capdb.aiter_db(), rules.known_issues()
        for target in ("gfx942", "MI355X", None):
            for aiter in (None, "0.1.13.post1", "none"):
                for fields in LAYERS:
                    d = select(MoELayer.build(**fields), target_capabilities(target, aiter), backends())
                    assert d.backend, (name, target, aiter, fields)


@settings(max_examples=650, **FUZZ)
@given(st.sampled_from(sorted(REAL)), st.data(), toml_values, st.booleans())
def test_fuzz_capability_db_entries(broken_db, name, data, value, delete):
    from moedispatch.core.layers import MoELayer
    from moedispatch.selector.pure import select

    doc = copy.deepcopy(REAL[name])
    path = data.draw(st.sampled_from(PATHS[name]))
    _set(doc, path, value, delete)
    broken_db(name, doc)
    try:
        # Load-time validation first: a broken entry fails here, naming file, key and problem...
        capdb.gpus(), capdb.aiter_db(), rules.known_issues()
    except MoedispatchError as exc:
        one_line(exc)
        assert f"capability_db/{name}" in str(exc), str(exc)
        return
    # ...otherwise everything downstream must work or fail with one clear line.
    try:
        for target in ("gfx942", "MI355X", None):
            for aiter in (None, "0.1.13.post1", "none"):
                caps = target_capabilities(target, aiter)
                for fields in LAYERS:
                    try:
                        d = select(MoELayer.build(**fields), caps, backends())
                    except NoBackendError as exc:
                        d = exc.decision
                    crashed = [r for r in d.rejected if any(x.startswith("plugin error") for x in texts(r.reasons))]
                    assert not crashed, crashed
    except MoedispatchError as exc:
        # Only the database changed, so an error found later must still name the broken file.
        one_line(exc)
        assert f"capability_db/{name}" in str(exc), str(exc)
