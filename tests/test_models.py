"""config.json dialects → ModelSpec, model reference resolution (built-in, path, local HF cache), and a property
test over mutated configs (only ModelError or a valid ModelSpec, never anything else).

Layouts per family: models_hw.md §A.1/§A.2 (keys) and the HF modeling code quoted in models.py. The HF cache layout
is huggingface_hub's (models--{org}--{name}/refs/main -> snapshots/{commit}/).
"""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moedispatch.core.errors import ModelError
from moedispatch.core.layers import MoELayer
from moedispatch.sources.models import ModelSpec, builtin_models, expand_layers, load_model, parse_config


def spec(cfg: dict, **kw) -> ModelSpec:
    return parse_config(cfg, name="t", source="path", **kw)


def kinds(s: ModelSpec) -> str:
    return "".join("M" if t.kind == "moe" else "d" for t in s.layers)


BASE = {"hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 32, "num_local_experts": 8,
        "num_experts_per_tok": 2}


# -- family keys --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, experts, top_k, inter, layout", [
    # Mixtral / MiniMax-M2: num_local_experts, intermediate_size is per expert, every layer MoE
    ({**BASE, "model_type": "mixtral"}, 8, 2, 32, "MMMM"),
    # DeepSeek / GLM / Kimi: n_routed_experts, moe_intermediate_size, first_k_dense_replace, moe_layer_freq
    ({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 5, "intermediate_size": 256,
      "moe_intermediate_size": 16, "n_routed_experts": 16, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
      "moe_layer_freq": 2}, 16, 4, 16, "ddMdM"),  # i >= k and i % freq == 0
    # Qwen3-MoE: num_experts, decoder_sparse_step, mlp_only_layers
    ({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 256,
      "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
      "mlp_only_layers": [3]}, 8, 2, 16, "dMdd"),
    # gpt-oss: experts_per_token only
    ({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 32,
      "num_local_experts": 4, "experts_per_token": 2}, 4, 2, 32, "MM"),
    # MiniMax-M3: moe_layer_freq as a per-layer list
    ({**BASE, "model_type": "minimax_m3_vl", "moe_layer_freq": [0, 1, 0, 1]}, 8, 2, 32, "dMdM"),
    # Llama-4: interleave_moe_layer_step, or the explicit moe_layers list
    ({**BASE, "model_type": "llama4_text", "interleave_moe_layer_step": 2, "intermediate_size_mlp": 128},
     8, 2, 32, "dMdM"),
    ({**BASE, "model_type": "llama4_text", "moe_layers": [0, 3]}, 8, 2, 32, "MddM"),
    # grok ports: num_experts + intermediate_size
    ({**BASE, "model_type": "grok-1", "num_local_experts": None, "num_experts": 8}, 8, 2, 32, "MMMM"),
])
def test_family_keys(cfg, experts, top_k, inter, layout):
    s = spec(cfg)
    assert kinds(s) == layout
    moe = next(t for t in s.layers if t.kind == "moe")
    assert (moe.experts, moe.top_k, moe.intermediate) == (experts, top_k, inter)


def test_dense_layers_take_the_dense_intermediate():
    s = spec({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3, "intermediate_size": 256,
              "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "first_k_dense_replace": 1})
    assert [t.intermediate for t in s.layers] == [256, 16, 16]
    s = spec({**BASE, "model_type": "minimax_m3_vl", "dense_intermediate_size": 96, "moe_layer_freq": [0, 1, 1, 1]})
    assert [t.intermediate for t in s.layers] == [96, 32, 32, 32]


@pytest.mark.parametrize("extra, shared, shared_inter", [
    ({"n_shared_experts": 2, "moe_intermediate_size": 16}, 2, 32),                 # DeepSeek: n x moe_inter
    ({"shared_expert_intermediate_size": 48, "moe_intermediate_size": 16}, 1, 48),  # Qwen3.5 / Qwen2-MoE
    ({"shared_intermediate_size": 32, "n_shared_experts": 1}, 1, 32),               # MiniMax-M3
    ({"shared_intermediate_size": 0}, 0, 0),                                        # MiniMax-M2: none
    ({"model_type": "llama4_text"}, 1, 32),                                         # Llama-4: implicit
    ({}, 0, 0),
])
def test_shared_experts(extra, shared, shared_inter):
    s = spec({**BASE, **extra})
    assert (s.shared_experts, s.shared_intermediate) == (shared, shared_inter)


def test_multimodal_wrapper_family_is_the_top_level_model_type():
    """MiniMax-M3's VL wrapper: text_config.model_type is 'minimax_m2' (SGLang configs/minimax_vl.py)."""
    cfg = {"model_type": "minimax_m3_vl", "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
           "text_config": {**BASE, "model_type": "minimax_m2", "hidden_act": "silu"}}
    s = spec(cfg)
    assert s.model_type == "minimax_m3_vl" and s.text_model_type == "minimax_m2"
    assert s.activation == "swigluoai_uninterleave"  # regardless of the hidden_act string (models_hw.md §A.2)
    assert s.architecture == "MiniMaxM3SparseForConditionalGeneration"


@pytest.mark.parametrize("key", ["text_config", "llm_config", "language_config"])
def test_nested_text_configs(key):
    s = spec({"model_type": "wrapper", key: {**BASE, "model_type": "mixtral"},
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert s.moe_layers == 4 and s.layers[0].weight.dtype == "fp8"


@pytest.mark.parametrize("cfg, act, params", [
    ({"model_type": "gpt_oss", "swiglu_limit": 9.0}, "swigluoai", {"alpha": 1.702, "limit": 9.0}),
    ({"model_type": "minimax_m3", "swiglu_alpha": 1.5}, "swigluoai_uninterleave", {"alpha": 1.5, "limit": 7.0}),
    ({"hidden_act": "swigluoai"}, "swigluoai", {"alpha": 1.702, "limit": 7.0}),
    ({"hidden_act": "gelu_pytorch_tanh"}, "gelu", {}),
    ({"model_type": "grok-1"}, "gelu", {}),
    ({"model_type": "git"}, "gelu", {}),
    ({"hidden_act": "silu"}, "silu", {}),
    ({}, "silu", {}),
])
def test_activation_and_parameters(cfg, act, params):
    s = spec({**BASE, **cfg})
    assert s.activation == act and dict(s.activation_params) == params
    layer = expand_layers(s)[0]
    assert layer.activation == act and layer.param("limit") == params.get("limit")


def test_gpt_oss_has_expert_bias():
    assert spec({**BASE, "model_type": "gpt_oss"}).has_bias is True
    assert spec({**BASE, "model_type": "mixtral"}).has_bias is False


def test_fp16_checkpoint_dtype():
    s = spec({**BASE, "torch_dtype": "float16"})
    assert s.layers[0].weight.dtype == "fp16"


# -- malformed configs: one ModelError line naming the file and the problem --------------------------------------------

@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c.update(hidden_size="64"), "hidden_size must be an integer"),
    (lambda c: c.update(hidden_size=0), "hidden_size must be positive"),
    (lambda c: c.update(hidden_size=-64), "hidden_size must be positive"),
    (lambda c: c.update(hidden_size=True), "hidden_size must be an integer"),
    (lambda c: c.update(intermediate_size=-1), "intermediate_size must be positive"),
    (lambda c: c.update(num_local_experts=-8), "num_local_experts must be non-negative"),
    (lambda c: c.update(num_experts_per_tok=0), "num_experts_per_tok must be positive"),
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok = 9 exceeds the 8 experts"),
    (lambda c: c.update(num_hidden_layers=10 ** 9), "implausibly large"),
    (lambda c: c.pop("hidden_size"), "no hidden_size"),
    (lambda c: c.pop("num_local_experts"), "not a MoE model"),
    (lambda c: c.pop("num_experts_per_tok"), "no top-k"),
    (lambda c: c.update(num_local_experts=0), "no layer is a MoE layer"),
    (lambda c: c.update(hidden_act=["silu"]), "hidden_act must be a string"),
    (lambda c: c.update(hidden_act="relu"), "not a MoE activation"),
    (lambda c: c.update(moe_layer_freq=[1, 0]), "moe_layer_freq must list 0/1"),
    (lambda c: c.update(mlp_only_layers=[7]), "outside 0..3"),
    (lambda c: c.update(mlp_only_layers="0"), "mlp_only_layers must be a list"),
    (lambda c: c.update(decoder_sparse_step=-1), "decoder_sparse_step must be positive"),
    (lambda c: c.update(first_k_dense_replace=-1), "first_k_dense_replace must be non-negative"),
    (lambda c: c.update(text_config=[1]), "text_config must be an object"),
    (lambda c: c.update(model_type=3), "model_type must be a string"),
    (lambda c: c.update(architectures="Mixtral"), "architectures must be a list"),
    (lambda c: c.update(swiglu_limit="7", hidden_act="swigluoai"), "swiglu_limit must be a number"),
    (lambda c: c.update(quantization_config={"quant_method": "awq"}), "quant_method 'awq' is not supported"),
    (lambda c: c.update(torch_dtype=16), "torch_dtype must be a string"),
])
def test_malformed_configs(mutate, needle):
    cfg = copy.deepcopy(BASE)
    mutate(cfg)
    with pytest.raises(ModelError) as err:
        parse_config(cfg, name="t", source="path", where="/ckpt/config.json")
    msg = str(err.value)
    assert needle in msg and "/ckpt/config.json" in msg and "\n" not in msg, msg


def test_non_object_top_level():
    with pytest.raises(ModelError, match="top level must be a JSON object"):
        parse_config([BASE], name="t", source="path")


@pytest.mark.parametrize("content, needle", [
    ('{"hidden_size": 64, "num_hid', "not valid JSON"),
    ("", "not valid JSON"),
    ("[" * 100000, "nests too deeply"),
    (b"\xff\xfe", "cannot read"),
])
def test_unreadable_config_json(tmp_path, content, needle):
    folder = tmp_path / "m"
    folder.mkdir()
    p = folder / "config.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ModelError) as err:
        load_model(str(folder))
    assert needle in str(err.value) and str(p) in str(err.value)


# -- resolution -----------------------------------------------------------------------------------------------------

def test_builtins_all_parse_through_the_same_path():
    for entry in builtin_models():
        s = load_model(entry["name"])
        assert s.source == "builtin" and s.moe_layers > 0 and s.shards == 0
        assert s.to_dict() == {"name": entry["name"], "source": "builtin",
                               "architecture": entry["config"]["architectures"][0]}
        assert all(isinstance(la, MoELayer) for la in expand_layers(s))
        if entry.get("hf_id"):
            assert load_model(entry["hf_id"]).name == entry["name"]


def test_builtin_lookup_is_case_insensitive_and_org_optional():
    assert load_model("minimax-m3-mxfp4").name == "MiniMax-M3-MXFP4"
    assert load_model("amd/MiniMax-M3-MXFP4").source == "builtin"


@pytest.mark.parametrize("ref, needle", [
    ("", "needs a model name"),
    ("no-such-model-xyz", "unknown model 'no-such-model-xyz'"),
    ("./missing/folder", "no such file or folder"),
    ("someorg/not-cached-model", "not in the local Hugging Face cache"),
])
def test_unresolvable_refs(ref, needle, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError, match=needle):
        load_model(ref)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json in this folder"):
        load_model(str(tmp_path))


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hf_cache(root: Path, repo: str, cfg: dict, *, ref: str | None = "main", blobs: bool = True) -> Path:
    org, name = repo.split("/")
    repo_dir = root / f"models--{org}--{name}"
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    data = json.dumps(cfg)
    if blobs:  # huggingface_hub stores files as blobs and symlinks them from the snapshot
        (repo_dir / "blobs").mkdir()
        (repo_dir / "blobs" / "abc123").write_text(data)
        (snap / "config.json").symlink_to(Path("..", "..", "blobs", "abc123"))
    else:
        (snap / "config.json").write_text(data)
    if ref:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / ref).write_text(COMMIT)
    return snap


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("env", ["HF_HUB_CACHE", "HF_HOME"])
def test_hf_cache_repo_id_resolves_offline(tmp_path, monkeypatch, no_network, env):
    hub = tmp_path / "hub"
    _hf_cache(hub, "acme/Tiny-MoE", {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"})
    for var in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(env, str(hub if env == "HF_HUB_CACHE" else tmp_path))
    s = load_model("acme/Tiny-MoE")
    assert (s.name, s.source, s.architecture) == ("acme/Tiny-MoE", "hf-cache", "MixtralForCausalLM")
    assert s.path.endswith(COMMIT)
    assert load_model(f"acme/Tiny-MoE@{COMMIT}").source == "hf-cache"


def test_hf_cache_beats_the_builtin_stand_in_and_revisions(tmp_path, monkeypatch, no_network):
    """A real cached checkpoint describes the model better than the built-in copy of its config."""
    _hf_cache(tmp_path, "openai/gpt-oss-20b", {**BASE, "model_type": "gpt_oss", "num_local_experts": 4},
              ref="v2", blobs=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="no refs/main"):
        pass_through = load_model("openai/gpt-oss-20b@main")  # noqa: F841
    s = load_model("openai/gpt-oss-20b@v2")
    assert s.source == "hf-cache" and s.layers[0].experts == 4
    # no refs/main but exactly one snapshot: that snapshot
    assert load_model("openai/gpt-oss-20b").source == "hf-cache"


def test_hf_cache_dangling_ref_is_a_model_error(tmp_path, monkeypatch, no_network):
    snap = _hf_cache(tmp_path, "acme/Broken", BASE)
    (snap.parent.parent / "refs" / "main").write_text("f" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="not in the local HF cache"):
        load_model("acme/Broken")


def test_hf_cache_snapshot_reads_safetensors_through_blob_symlinks(tmp_path, monkeypatch, no_network):
    from test_checkpoint import MIXTRAL_NAMES, per_expert, write_safetensors

    snap = _hf_cache(tmp_path, "acme/WithWeights", {**BASE, "model_type": "mixtral", "num_hidden_layers": 2})
    blobs = snap.parent.parent / "blobs"
    write_safetensors(blobs / "w1", per_expert(range(2), 8, 64, 32, **MIXTRAL_NAMES))
    (snap / "model.safetensors").symlink_to(Path("..", "..", "blobs", "w1"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    s = load_model("acme/WithWeights")
    assert s.stored_intermediate == 32 and s.shards == 1
    assert load_model(str(snap)).name == "acme/WithWeights"  # a snapshot path names its repo


def test_cli_explain_hf_cache_repo(tmp_path, cli):
    _hf_cache(tmp_path, "acme/Cli-MoE", {**BASE, "hidden_size": 256, "intermediate_size": 256,
                                         "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"})
    proc = cli("explain", "--model", "acme/Cli-MoE", "--target", "gfx950", "--format", "json",
               env={"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == {"name": "acme/Cli-MoE", "source": "hf-cache",
                                                "architecture": "MixtralForCausalLM"}


def test_cli_explain_uncached_repo_exit_2(tmp_path, cli):
    proc = cli("explain", "--model", "acme/Not-There", "--target", "gfx950", "--format", "json",
               env={"HF_HUB_CACHE": str(tmp_path)})
    assert proc.returncode == 2 and json.loads(proc.stdout)["exit"] == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "never downloads" in proc.stderr


# -- property test --------------------------------------------------------------------------------------------------

_SEEDS = [copy.deepcopy(e["config"]) for e in builtin_models()] + [
    {**BASE, "model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}},
    {**BASE, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}},
    {**BASE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}},
    {**BASE, "quantization_config": {"quant_method": "fbgemm_fp8"}},
]

_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 40), 2 ** 40), st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["silu", "gelu", "swigluoai", "fp4", "fp8_e4m3", "per_group", "e8m0", "fp8", "quark", "mxfp4",
                     "compressed-tensors", "modelopt", "FP8", "NVFP4", "*", "re:(", "re:.*", "Linear", "dynamic"]),
    st.lists(st.integers(-2, 3), max_size=6), st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-2, 64), max_size=3),
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list) and len(obj) <= 8:
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_configs(draw):
    cfg = copy.deepcopy(draw(st.sampled_from(_SEEDS)))
    paths = [p for p in _paths(cfg) if p]
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths))
        parent = cfg
        try:
            for k in path[:-1]:
                parent = parent[k]
            action = draw(st.sampled_from(["replace", "delete", "replace"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(_JUNK)
        except (KeyError, IndexError, TypeError):
            continue
    return cfg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_mutated_configs_give_a_model_error_or_a_valid_spec(cfg):
    try:
        s = parse_config(cfg, name="fuzz", source="path", where="/fuzz/config.json")
    except ModelError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "/fuzz/config.json" in msg, msg
        return
    assert isinstance(s, ModelSpec) and s.moe_layers > 0 and s.hidden > 0
    for t in s.layers:
        if t.kind == "moe":
            assert 0 < t.top_k <= t.experts and t.intermediate > 0
    try:
        layers = expand_layers(s)
    except ModelError:
        return
    assert len(layers) == len(s.layers)


def test_situ_constants_are_read_under_the_engines_config_keys():
    """Kimi-K3's SiTU constants: vLLM (transformers_utils/configs/kimi_linear.py) and SGLang (models/kimi_k3.py) read
    activation_situ_beta / activation_situ_linear_beta from config.json; AITER's own names are accepted too."""
    cfg = copy.deepcopy(next(e for e in builtin_models() if e["name"] == "Kimi-K3-MXFP4")["config"])
    cfg.update(activation_situ_beta=4.0, activation_situ_linear_beta=25.0)
    spec = parse_config(cfg, name="k3", source="path")
    assert spec.activation == "situv2" and dict(spec.activation_params) == {"beta": 4.0, "linear_beta": 25.0}
    cfg = {k: v for k, v in cfg.items() if not k.startswith("activation_situ")}
    cfg["situ_beta"] = 2.0
    assert dict(parse_config(cfg, name="k3", source="path").activation_params) == {"beta": 2.0}
    cfg.pop("situ_beta")
    assert parse_config(cfg, name="k3", source="path").activation_params == ()


def test_a_recipe_serves_a_cached_checkpoint_by_its_repo_id(tmp_path, monkeypatch, no_network):
    """A model found in the local HF cache: the engine command names the repo id (the engine resolves the same
    cache); it named the snapshot path, which becomes the served model name clients must send (newcomer review).
    A folder the user names is still served by its path."""
    from moedispatch.data.capdb import target_capabilities
    from moedispatch.engines.recipes import build_recipe
    from moedispatch.render.explain import plan_model

    cfg = {**BASE, "hidden_size": 2048, "intermediate_size": 768, "num_attention_heads": 32,
           "num_key_value_heads": 4, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}
    snap = _hf_cache(tmp_path / "hub", "acme/Mix", cfg)
    for var in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    caps = target_capabilities("MI300X", "0.1.20.post1")
    cached = build_recipe(plan_model(load_model("acme/Mix"), caps, 1, 1), "vllm", None)
    assert cached.command.startswith("vllm serve acme/Mix "), cached.command
    folder = build_recipe(plan_model(load_model(str(snap)), caps, 1, 1), "vllm", None)
    assert folder.command.startswith(f"vllm serve {snap} "), folder.command
