"""Built-in model facts against the primary sources their ``sources`` cite (issue 27).

1. Every non-confirmed ``confidence`` entry names field paths (``config.x / y``, ``quantization_config.exclude``),
   never the whole ``config`` or a free-form phrase, so the plan's "unconfirmed model facts" warning says precisely
   what is unknown.
2. Where a built-in cites a transformers configuration class for confirmed fields, the class's defaults (read from
   the configuration file's text with ``ast``, nothing imported) must equal the built-in's values. transformers is
   not in the main venv: the test looks in the project's ``.peers-venv`` (or an importable transformers) and skips
   when the file or the cited version (5.20.2) is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = ROOT / "capability_db" / "models"
TF_VERSION = "5.20.2"
TF_CITE = f"huggingface/transformers@v{TF_VERSION}:src/transformers/models/"

_FIELD = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``config.a.b``, ``config.a / b / c``, ``quantization_config``, ``quantization_config.exclude``
FIELD_PATH = re.compile(rf"^(quantization_config|config(?=\.))(\.{_FIELD})*( / {_FIELD})*$")


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(MODELS_DIR.glob("*.json"))]


@pytest.mark.parametrize("name, doc", _docs(), ids=lambda v: v if isinstance(v, str) else "")
def test_unconfirmed_entries_name_field_paths(name, doc):
    for key, level in doc.get("confidence", {}).items():
        if level != "unconfirmed":
            continue
        assert key != "config", f"{name}: 'config' as a whole is unconfirmed; name the unknown fields"
        assert FIELD_PATH.match(key), f"{name}: unconfirmed entry {key!r} is not a field path (config.a / b)"


def test_field_path_pattern():
    for good in ("config.topk_group", "config.text_config.max_position_embeddings", "quantization_config",
                 "quantization_config.exclude", "config.hidden_size / moe_intermediate_size"):
        assert FIELD_PATH.match(good), good
    for bad in ("config", "config nesting", "config keys", "config (other keys)", "parameter check",
                "config.quantization_config placement"):
        assert not FIELD_PATH.match(bad), bad


# -- transformers configuration classes -------------------------------------------------------------------------

def _transformers_root() -> Path | None:
    for candidate in sorted((ROOT / ".peers-venv").glob("lib/python3*/site-packages/transformers")):
        if (candidate / "__init__.py").is_file():
            return candidate
    spec = importlib.util.find_spec("transformers")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    return None


def _version(root: Path) -> str | None:
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', (root / "__init__.py").read_text(), re.M)
    return match.group(1) if match else None


def class_defaults(text: str, class_name: str) -> dict[str, Any]:
    """Literal defaults of a configuration class: ``name: type = value`` fields (transformers 5 dataclass style),
    ``default_theta = value`` class attributes, or ``__init__`` keyword defaults (older style)."""
    tree = ast.parse(text)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise LookupError(class_name)
    out: dict[str, Any] = {}

    def literal(node: ast.AST) -> Any:
        try:
            return ast.literal_eval(node)
        except ValueError:
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                return literal(node.left) * literal(node.right)  # e.g. 4096 * 32
            raise

    for stmt in cls.body:
        try:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                out[stmt.target.id] = literal(stmt.value)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                out[stmt.targets[0].id] = literal(stmt.value)
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                args = stmt.args.args[len(stmt.args.args) - len(stmt.args.defaults):]
                for arg, default in zip(args, stmt.args.defaults):
                    out.setdefault(arg.arg, literal(default))
        except (ValueError, TypeError, SyntaxError):
            continue
    return out


def test_class_defaults_parser():
    text = (
        "class A(Base):\n"
        "    model_type = 'a'\n"
        "    hidden_size: int = 7168\n"
        "    max_position_embeddings: int = 4096 * 32\n"
        "    rope: dict | None = None\n"
        "    odd: int = some_call()\n"
        "class B:\n"
        "    def __init__(self, x, num_experts=8, act='gelu'):\n"
        "        pass\n"
    )
    assert class_defaults(text, "A") == {"model_type": "a", "hidden_size": 7168, "max_position_embeddings": 131072,
                                         "rope": None}
    assert class_defaults(text, "B") == {"num_experts": 8, "act": "gelu"}


# (built-in, sources key that cites the class, file under transformers/models, class,
#  {config path in the built-in: class attribute}) — the fields each sources entry marks confirmed.
CHECKS = [
    ("DeepSeek-V3", "config", "deepseek_v3/configuration_deepseek_v3.py", "DeepseekV3Config", {
        "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
        "moe_intermediate_size": "moe_intermediate_size", "num_hidden_layers": "num_hidden_layers",
        "n_routed_experts": "n_routed_experts", "n_shared_experts": "n_shared_experts",
        "num_experts_per_tok": "num_experts_per_tok", "first_k_dense_replace": "first_k_dense_replace",
        "n_group": "n_group", "topk_group": "topk_group", "routed_scaling_factor": "routed_scaling_factor",
        "hidden_act": "hidden_act", "vocab_size": "vocab_size"}),
    ("DeepSeek-V3", "config.topk_group", "deepseek_v3/configuration_deepseek_v3.py", "DeepseekV3Config",
     {"topk_group": "topk_group"}),
    ("DeepSeek-V4-Pro", "config.model_type", "deepseek_v4/configuration_deepseek_v4.py", "DeepseekV4Config",
     {"model_type": "model_type"}),
    ("Qwen3-30B-A3B", "config", "qwen3_moe/configuration_qwen3_moe.py", "Qwen3MoeConfig", {
        "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
        "moe_intermediate_size": "moe_intermediate_size", "num_experts": "num_experts",
        "num_experts_per_tok": "num_experts_per_tok", "decoder_sparse_step": "decoder_sparse_step",
        "hidden_act": "hidden_act", "vocab_size": "vocab_size", "model_type": "model_type"}),
    ("gpt-oss-120b", "config", "gpt_oss/configuration_gpt_oss.py", "GptOssConfig", {
        "num_hidden_layers": "num_hidden_layers", "num_local_experts": "num_local_experts",
        "num_experts_per_tok": "num_experts_per_tok", "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size", "swiglu_limit": "swiglu_limit", "hidden_act": "hidden_act",
        "sliding_window": "sliding_window", "model_type": "model_type"}),
    ("gpt-oss-20b", "config", "gpt_oss/configuration_gpt_oss.py", "GptOssConfig", {
        "num_experts_per_tok": "num_experts_per_tok", "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size", "swiglu_limit": "swiglu_limit", "model_type": "model_type"}),
    ("Llama-4-Scout-17B-16E", "config.text_config.attention_chunk_size / rope_theta / vocab_size",
     "llama4/configuration_llama4.py", "Llama4TextConfig", {
         "text_config.attention_chunk_size": "attention_chunk_size", "text_config.rope_theta": "default_theta",
         "text_config.vocab_size": "vocab_size"}),
    ("Llama-4-Scout-17B-16E", "config", "llama4/configuration_llama4.py", "Llama4TextConfig", {
        "text_config.hidden_size": "hidden_size", "text_config.intermediate_size": "intermediate_size",
        "text_config.num_hidden_layers": "num_hidden_layers", "text_config.num_local_experts": "num_local_experts",
        "text_config.num_experts_per_tok": "num_experts_per_tok", "text_config.hidden_act": "hidden_act"}),
    ("MiniMax-M3", "config.text_config.hidden_act", "minimax_m3_vl/configuration_minimax_m3_vl.py",
     "MiniMaxM3VLTextConfig", {"text_config.swiglu_alpha": "swiglu_alpha",
                               "text_config.swiglu_limit": "swiglu_limit"}),
]


def _get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("name, key, rel, cls, fields", CHECKS, ids=[f"{c[0]}:{c[1]}" for c in CHECKS])
def test_confirmed_fields_match_the_cited_transformers_defaults(name, key, rel, cls, fields):
    doc = json.loads((MODELS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    source = doc["sources"][key]
    assert f"{rel.split('/')[-1]}" in source, f"{name}: sources[{key!r}] no longer cites {rel}"
    assert doc.get("confidence", {}).get(key, "confirmed") == "confirmed", f"{name}: {key} is not confirmed"
    root = _transformers_root()
    if root is None or not (root / "models" / rel).is_file():
        pytest.skip(f"transformers configuration file {rel} not installed")
    if _version(root) != TF_VERSION:
        pytest.skip(f"cited defaults are transformers {TF_VERSION}'s; installed {_version(root)}")
    defaults = class_defaults((root / "models" / rel).read_text(encoding="utf-8"), cls)
    for path, attr in fields.items():
        assert attr in defaults, f"{cls} has no literal default {attr!r}"
        ours = _get(doc["config"], path)
        assert ours == defaults[attr], f"{name}: config.{path} = {ours!r}, {cls}.{attr} = {defaults[attr]!r}"


def test_every_transformers_citation_names_the_pinned_version():
    """A built-in citing transformers defaults for a confirmed fact pins the version the check above reads."""
    for name, doc in _docs():
        for key, text in doc["sources"].items():
            if doc.get("confidence", {}).get(key, "confirmed") != "confirmed":
                continue
            if "huggingface/transformers@v" in text:
                assert TF_CITE in text, f"{name}: sources[{key!r}] cites another transformers version"
