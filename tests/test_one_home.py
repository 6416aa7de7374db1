"""One home for each fact: the AITER environment, the token list, the kernel families, the caches, the public names.

Motivating case (audit of ed95a72, S1): ``CU_NUM=80`` in the shell was dropped by ``explain`` (its run-time kept
only ``AITER_*``-prefixed variables) while ``--aiter-env CU_NUM=80`` was honoured, because two modules kept two
lists of AITER's variables. DeepSeek-V3 TP8 on MI300X keys AITER's tuned rows on cu_num, so the two plans differed.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import moedispatch
from moedispatch.core import families, workload
from moedispatch.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _plan(cli, *extra, env=None):
    proc = cli("explain", "--model", "DeepSeek-V3", "--target", "MI300X", "--tp", "8", "--format", "json", *extra,
               env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cu_num_in_the_shell_and_as_aiter_env_give_the_same_plan(cli):
    shell = _plan(cli, env={"CU_NUM": "80"})
    flag = _plan(cli, "--aiter-env", "CU_NUM=80")
    plain = _plan(cli)
    assert shell["aiter_env"] == flag["aiter_env"] == {"CU_NUM": "80"} and plain["aiter_env"] == {}
    assert shell["fingerprint"] == flag["fingerprint"] != plain["fingerprint"]
    basis = [s["basis"] for s in shell["layers"][3]["aiter_dispatch"]]
    assert basis == [s["basis"] for s in flag["layers"][3]["aiter_dispatch"]]
    assert basis != [s["basis"] for s in plain["layers"][3]["aiter_dispatch"]]  # cu_num 80 has tuned rows


def test_the_library_and_the_runtime_read_the_same_variables():
    env = {"CU_NUM": "80", "AITER_KSPLIT": "2", "AITER_LOG_LEVEL": "DEBUG", "HOME": "/root",
           "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0", "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}
    want = {"CU_NUM": "80", "AITER_KSPLIT": "2", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "0",
            "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}
    assert workload.aiter_env(env) == want
    assert workload.Runtime.build(env=env).env_dict == want
    assert workload.Runtime.build(env=env, overrides={"CU_NUM": "64"}).env_dict["CU_NUM"] == "64"


def test_one_definition_of_each_run_time_fact():
    """No module but core/workload.py assigns DEFAULT_TOKENS, AITER_ENV or defines parse_tokens / aiter_env."""
    owners: dict[str, list[str]] = {}
    for path in (ROOT / "moedispatch").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)] + \
                ([node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else [])
            for name in names:
                if name in ("DEFAULT_TOKENS", "AITER_ENV", "parse_tokens", "aiter_env", "parse_env_args", "Runtime",
                            "AITER_FAMILIES", "FUSED_MOE_FAMILIES", "BACKEND_OF_FAMILY", "Cost", "NoBackendError"):
                    owners.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in owners.items() if len(v) != 1} == {}
    assert owners["DEFAULT_TOKENS"] == ["moedispatch/core/workload.py"]
    assert owners["AITER_FAMILIES"] == ["moedispatch/core/families.py"]


@pytest.mark.parametrize(("text", "expected"), [
    ("1,64,4096", (1, 64, 4096)), ("8192,1,1", (1, 8192)), ("3-20", (3, 4, 8, 16, 20)),
    ("16384-131072", (16384, 32768, 65536, 131072)),
])
def test_one_token_parser_takes_lists_and_ranges(text, expected):
    assert workload.parse_tokens(text) == expected


@pytest.mark.parametrize("text", ["", "a", "0", "5-2", "1,,x", "-4", "131073", "1-200000"])
def test_one_token_parser_rejects(text):
    with pytest.raises(UsageError):
        workload.parse_tokens(text)


def test_explain_takes_a_token_range(cli):
    doc = _plan(cli, "--tokens", "1-8")
    assert doc["tokens"] == [1, 2, 4, 8]
    proc = cli("explain", "--model", "DeepSeek-V3", "--target", "MI300X", "--tp", "8", "--tokens", "1-200000")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "131,072" in proc.stderr


def test_the_families_table_matches_the_built_in_backends():
    from moedispatch.selector.plugins import build_registry

    registry = build_registry()
    builtin = {n for p in registry.plugins if p.builtin for n in p.backends}
    by_name = {b.name: b for b in registry.backends if b.name in builtin}
    assert {f.backend for f in families.FAMILIES} == set(by_name)
    for f in families.FAMILIES:
        assert by_name[f.backend].family == f.family
    assert families.FUSED_MOE_FAMILIES == {"ck", "cktile", "flydsl", "asm"}
    assert families.AITER_FAMILIES == families.FUSED_MOE_FAMILIES | {"aiter-triton"}
    assert families.family_of("aiter-flydsl") == "flydsl" and families.family_of("acme-moe") is None
    assert [families.kind_of(n) for n in ("aiter-ck", "ck", "aiter-triton", "triton", "emulation", "aiter-foo")] == \
        ["aiter", "aiter", "aiter-triton", "triton", "emulation", "other"]


def test_clear_caches_forgets_data_decisions_and_the_registry():
    from moedispatch._util import caches
    from moedispatch.data import capdb
    from moedispatch.selector import plugins, pure
    from moedispatch.testing import fake_capabilities, layer

    capdb.load_toml("gpus.toml")
    registry = plugins.get_registry()
    pure.select(layer(hidden_size=4096, intermediate_size=1536, num_experts=64, top_k=8),
                fake_capabilities("gfx950"), registry.backends)
    assert capdb.load_toml.cache_info().currsize > 0 and pure._exact and plugins._cache
    assert {"plugin registry", "selector decisions", "moedispatch.data.capdb.load_toml"} <= set(caches.registered())
    moedispatch.clear_caches()
    assert capdb.load_toml.cache_info().currsize == 0 and not pure._exact and not plugins._cache


def test_no_bare_lru_cache_outside_the_registry():
    """Every memoised function goes through caches.memoize, so clear_caches() reaches it."""
    bare = [f"{p.relative_to(ROOT)}:{n}" for p in list((ROOT / "moedispatch").rglob("*.py")) + list(
        (ROOT / "plugins").glob("*.py")) if p.name != "caches.py"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"functools\.(lru_cache|cache)\b|^\s*@(lru_)?cache\b", line)]
    assert bare == []


def _doc_names() -> set[str]:
    """Every ``from moedispatch… import a, b`` line and every dotted ``moedispatch.x.y`` name in the docs."""
    names: set[str] = set()
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        for mod, what in re.findall(r"^\s*from (moedispatch[\w.]*) import ([\w, ]+)", text, flags=re.M):
            names.update(f"{mod}:{n.strip().split(' ')[0]}" for n in what.split(",") if n.strip())
        for dotted in re.findall(r"`(moedispatch(?:\.\w+)+)(?:\(\))?`", text):
            if dotted != "moedispatch.backends":  # the entry-point group, not a module
                names.add(dotted)
    return names


def test_every_name_the_docs_show_imports():
    import importlib

    missing = []
    for name in sorted(_doc_names()):
        mod, _, attr = name.partition(":")
        if not attr:  # dotted: the longest importable module prefix, then attributes
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for part in parts[cut:]:
                        obj = getattr(obj, part)
                except AttributeError:
                    missing.append(name)
                break
            continue
        if mod == "moedispatch_acme" or not hasattr(importlib.import_module(mod), attr):
            if mod != "moedispatch_acme":
                missing.append(name)
    assert missing == []
    assert {"moedispatch.selector:select", "moedispatch.cost:Cost", "moedispatch:select_moe_backend"} <= _doc_names()


def test_the_values_users_need_are_public():
    from moedispatch.core.costs import Cost
    from moedispatch.core.decision import Rejection
    from moedispatch.core.workload import Runtime
    from moedispatch.plan.plan import Plan

    assert (moedispatch.Cost, moedispatch.Rejection, moedispatch.Plan, moedispatch.Runtime) == \
        (Cost, Rejection, Plan, Runtime)
    assert set(moedispatch.__all__) >= {"Cost", "Rejection", "Plan", "Runtime", "clear_caches"}


def test_env_args_parse_and_refuse_with_the_flag_named():
    """KEY=VALUE items (repeatable) → dict; a malformed one is a one-line UsageError naming the flag it came from."""
    from moedispatch.core.errors import UsageError
    from moedispatch.core.workload import parse_env_args

    assert parse_env_args([" AITER_X = 1", "B_2=a=b"]) == {"AITER_X": "1", "B_2": "a=b"}
    for bad in ("NOVALUE", "=1", "1A=x", "A-B=1"):
        with pytest.raises(UsageError, match=r"^--aiter-env '.*': expected KEY=VALUE"):
            parse_env_args([bad])
    with pytest.raises(UsageError, match=r"^--engine-env 'x': expected KEY=VALUE"):
        parse_env_args(["x"], "--engine-env")
