"""Every ``moedispatch.*/1`` document the CLI prints has a schema file, and real output validates against it (issue 27,
newcomer minor 10: recipe, lint, probe, backends, models, aiter-configs and verify declared schemas that were not
shipped; ``--tuning-list --format json`` too).

The schemas live in docs/schemas/ (explain's in docs/explain.schema.json); the ones that reuse explain's parts (a
reason, a dispatch step, the target, the padding, the whole plan of a recipe) ``$ref`` it by its ``$id``, so they are
validated with every schema file loaded in one registry. The documents are closed (``additionalProperties: false``)
where moedispatch owns every key, so renaming or dropping a field fails here; maps keyed by data (env variables,
probe provenance, AITER's tables) are open with typed values, each schema says which.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_newcomer_input import run

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
AITER = ("--aiter-version", "0.1.20.post1")
#: ``moedispatch.*/1`` names in the code that are data-file formats, not CLI output (each has its own check).
NOT_PRINTED = {"moedispatch.aiter_index/1": "capability_db/aiter_index.json, read by moedispatch.data.aiter_index",
               "moedispatch.cost_priors/1": "capability_db/cost_priors.toml (docs/schemas/cost_priors.schema.json)",
               "moedispatch.cost_release_drift/1": "the cost model's release-drift data file (moedispatch.cost.release)"}


def _schema_files() -> list[Path]:
    return [DOCS / "explain.schema.json", *sorted((DOCS / "schemas").glob("*.schema.json"))]


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict]:
    """``moedispatch.X/1`` -> its schema (by the name in the schema's title)."""
    out = {}
    for path in _schema_files():
        schema = json.loads(path.read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator.check_schema(schema)
        for name in re.findall(r"moedispatch\.[a-z_-]+/1", schema.get("title", "")):
            out[name] = schema
    return out


@pytest.fixture(scope="module")
def registry():
    from referencing import Registry, Resource

    resources = [Resource.from_contents(json.loads(p.read_text(encoding="utf-8"))) for p in _schema_files()]
    return Registry().with_resources((r.id(), r) for r in resources if r.id())


def errors(doc: dict, schema: dict, registry) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(doc)]


def check(doc: dict, schemas: dict, registry, name: str) -> dict:
    assert doc["schema"] == name
    problems = errors(doc, schemas[name], registry)
    assert not problems, problems[:5]
    return doc


def cli_json(monkeypatch, *argv: str, codes=(0,)) -> dict:
    code, out, err = run([*argv, "--format", "json"], monkeypatch)
    assert code in codes, (code, err[-500:])
    return json.loads(out)


# -- every printed document has a schema ---------------------------------------------------------------------------

def test_every_document_the_code_names_has_a_schema_file(schemas):
    names = set()
    for path in (ROOT / "moedispatch").rglob("*.py"):
        names |= set(re.findall(r"moedispatch\.[a-z_-]+/1", path.read_text(encoding="utf-8")))
    assert {"moedispatch.recipe/1", "moedispatch.lint/1", "moedispatch.probe/1"} <= names  # the scan sees them
    missing = sorted(n for n in names - set(schemas) if n not in NOT_PRINTED)
    assert not missing, f"no schema file in docs/ for {missing}"


# -- real output of several cases ------------------------------------------------------------------------------------

RECIPES = [
    # aiter.fused_moe with an AITER switch exported; aiter_runs per token range
    ("MiniMax-M3-MXFP4", "MI355X", "8", "vllm", None, 0),
    ("MiniMax-M3-MXFP4", "MI355X", "8", "sglang", None, 0),
    # no safe launch: command null, the reasons (and the nearest safe alternatives where there are some)
    ("MiniMax-M3-MXFP4", "MI300X", "8", "sglang", None, 3),
    ("DeepSeek-V3", "MI300X", "1", "vllm", None, 3),
    # an older release (engine model absent: engine_auto null)
    ("Qwen3-235B-A22B-Instruct-2507-FP8", "MI300X", "8", "vllm", "0.30.0", 0),
    ("gpt-oss-120b", "MI355X", "8", "vllm", None, 0),
]


@pytest.mark.parametrize("model, target, tp, engine, version, code", RECIPES)
def test_recipe_json_matches_its_schema(monkeypatch, schemas, registry, model, target, tp, engine, version, code):
    argv = ["explain", "--model", model, "--target", target, "--tp", tp, *AITER, "--recipe", engine]
    doc = check(cli_json(monkeypatch, *argv, *(("--engine-version", version) if version else ()), codes=(code,)),
                schemas, registry, "moedispatch.recipe/1")
    assert (doc["command"] is None) == (code == 3)
    assert doc["plan"]["schema"] == "moedispatch.explain/1" and doc["plan_fingerprint"] == doc["plan"]["fingerprint"]
    if code == 3:
        assert doc["reasons"] and len(doc["reasons"]) == len(doc["reason_details"])
    if model == "DeepSeek-V3":
        assert doc["alternatives"][0]["change"].startswith("--tp")


def test_recipe_schema_checks_the_embedded_plan(monkeypatch, schemas, registry):
    """The plan is validated by explain's own schema through the $ref (not an opaque object)."""
    doc = cli_json(monkeypatch, "explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", *AITER, "--recipe", "vllm")
    doc["plan"]["layers"][0].pop("reasons")
    assert any(p.startswith("plan/layers/0") for p in errors(doc, schemas["moedispatch.recipe/1"], registry))


LINTS = [
    ("--target", "MI355X", "--", "vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "8"),
    ("--target", "MI300X", "--env", "VLLM_ROCM_USE_AITER=1", "--", "vllm", "serve",
     "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "--tensor-parallel-size", "8", "--moe-backend", "aiter"),
    ("--target", "MI355X", "--", "python", "-m", "sglang.launch_server", "--model-path",
     "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "--tp", "8"),
    ("--target", "MI300X", "--", "vllm", "serve", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "1"),  # error
]


@pytest.mark.parametrize("argv", LINTS, ids=["minimax", "qwen-aiter-env", "sglang", "does-not-fit"])
def test_lint_json_matches_its_schema(monkeypatch, schemas, registry, argv):
    cut = argv.index("--")
    code, out, err = run(["lint", *argv[:cut], "--format", "json", *argv[cut:]], monkeypatch)
    assert code in (0, 3), err
    doc = check(json.loads(out), schemas, registry, "moedispatch.lint/1")
    assert (code == 3) == any(f["severity"] == "error" for f in doc["findings"])


def test_probe_json_of_this_machine_matches_its_schema(monkeypatch, schemas, registry):
    doc = check(cli_json(monkeypatch, "probe"), schemas, registry, "moedispatch.probe/1")
    assert "node" in doc and "env" in doc  # the CLI adds this node's identity (fleet --from reads it)


def test_probe_json_with_gpus_matches_its_schema(monkeypatch, tmp_path, schemas, registry):
    """Two MI300X found by rocminfo (test_probe's fake), a target override, AITER's env: the document the CLI prints
    (render_probe with node_identity, as ``moedispatch probe`` calls it)."""
    import shutil
    import sys

    import test_probe
    from moedispatch.probe import system

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "cat", "sleep"):
        (bindir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setenv("MOEDISPATCH_TARGET", "MI300X")
    monkeypatch.setenv("AITER_BYPASS_TUNE_CONFIG", "1")
    test_probe.fake_rocminfo(bindir, [test_probe.MI300X] * 2)
    report = system.probe(refresh=True)
    doc = check(json.loads(system.render_probe(report, "json", node=system.node_identity())), schemas, registry,
                "moedispatch.probe/1")
    assert len(doc["gpus"]) == 2 and doc["gpus"][0]["gfx"] == "gfx942" and doc["target_override"]["value"] == "MI300X"
    assert doc["env"]["AITER_BYPASS_TUNE_CONFIG"] == "1"
    system.probe(refresh=True)  # leave no cached fake for later tests


def test_backends_and_models_json_match_their_schemas(monkeypatch, schemas, registry):
    backends = check(cli_json(monkeypatch, "backends"), schemas, registry, "moedispatch.backends/1")
    assert {"aiter-ck", "triton", "emulation"} <= {b["name"] for b in backends["backends"]}
    models = check(cli_json(monkeypatch, "models"), schemas, registry, "moedispatch.models/1")
    assert any(m["name"] == "DeepSeek-V3" for m in models["models"])


@pytest.mark.parametrize("argv", [(), ("--aiter-version", "0.1.10.post2")], ids=["default", "0.1.10.post2"])
def test_aiter_configs_json_matches_its_schema(monkeypatch, schemas, registry, argv):
    doc = check(cli_json(monkeypatch, "aiter-configs", *argv), schemas, registry, "moedispatch.aiter_configs/1")
    assert doc["summary"]["findings"] == len(doc["findings"])


@pytest.mark.parametrize("model, target", [("MiniMax-M3-MXFP4", "MI355X"), ("Qwen3-235B-A22B-Instruct-2507-FP8", "MI300X")])
def test_tuning_list_json_matches_its_schema(monkeypatch, schemas, registry, model, target):
    doc = check(cli_json(monkeypatch, "explain", "--model", model, "--target", target, "--tp", "8", *AITER,
                         "--tuning-list"), schemas, registry, "moedispatch.tuning-list/1")
    assert doc["untuned_csv"].count("\n") >= len(doc["rows"])


def test_verify_json_matches_its_schema(monkeypatch, schemas, registry):
    pytest.importorskip("torch")
    doc = check(cli_json(monkeypatch, "verify", "--model", "Qwen3-30B-A3B", "--target", "MI300X", *AITER,
                         "--experts", "8", "--tokens", "4", "--seed", "1"), schemas, registry, "moedispatch.verify/1")
    assert {c["passed"] for c in doc["checks"]} <= {True, None}


def test_explain_engine_groups_match_the_recipe_schema_engine_group(monkeypatch, schemas, registry):
    """``explain --engine`` adds engine_auto to explain/1: the same entries as a recipe's (recipe schema $defs)."""
    doc = cli_json(monkeypatch, "explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", *AITER,
                   "--engine", "vllm", "--engine-env", "VLLM_ROCM_USE_AITER=1")
    assert not errors(doc, schemas["moedispatch.explain/1"], registry)
    group = {"$ref": "https://moedispatch.dev/schemas/recipe.schema.json#/$defs/engine_group"}
    assert doc["engine_auto"]
    for entry in doc["engine_auto"]:
        assert not errors(entry, group, registry)


# -- a renamed or dropped field fails ---------------------------------------------------------------------------------

def _sample(monkeypatch, name: str) -> dict:
    argv = {"moedispatch.recipe/1": ("explain", "--model", "Qwen3-30B-A3B", "--target", "MI300X", *AITER,
                                     "--recipe", "vllm"),
            "moedispatch.lint/1": ("lint", "--target", "MI300X", "--env", "VLLM_ROCM_USE_AITER=1"),
            "moedispatch.probe/1": ("probe",), "moedispatch.backends/1": ("backends",),
            "moedispatch.models/1": ("models",), "moedispatch.aiter_configs/1": ("aiter-configs",),
            "moedispatch.tuning-list/1": ("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8",
                                          *AITER, "--tuning-list")}[name]
    if name == "moedispatch.lint/1":
        code, out, err = run([*argv, "--format", "json", "--", "vllm", "serve", "amd/MiniMax-M3-MXFP4",
                              "--tensor-parallel-size", "8"], monkeypatch)
        return json.loads(out)
    return cli_json(monkeypatch, *argv)


def _nested(doc: dict) -> list[tuple[str, dict]]:
    """(path, object) of the first object in each top-level field, one level down (list items and dicts)."""
    out = []
    for key, value in doc.items():
        item = value[0] if isinstance(value, list) and value else value
        if isinstance(item, dict) and item and key not in ("plan", "packages", "env", "aiter"):
            out.append((key, item))
    return out


@pytest.mark.parametrize("name", ["moedispatch.recipe/1", "moedispatch.lint/1", "moedispatch.probe/1",
                                  "moedispatch.backends/1", "moedispatch.models/1", "moedispatch.aiter_configs/1",
                                  "moedispatch.tuning-list/1"])
def test_a_renamed_field_fails_the_schema(monkeypatch, schemas, registry, name):
    """Every top-level field, and every field of the first nested object of each, renamed in turn: invalid."""
    doc = _sample(monkeypatch, name)
    schema = schemas[name]
    assert not errors(doc, schema, registry)
    for key in list(doc):
        renamed = {(k + "_renamed" if k == key else k): v for k, v in doc.items()}
        assert errors(renamed, schema, registry), f"{name}: renaming {key!r} still validates"
    for path, obj in _nested(doc):
        if name == "moedispatch.tuning-list/1" and path == "rows":
            continue  # open by design: AITER's CSV columns (the required ones still fail, checked below)
        for key in list(obj):
            saved = dict(obj)
            obj.clear()
            obj.update({(k + "_renamed" if k == key else k): v for k, v in saved.items()})
            try:
                assert errors(doc, schema, registry), f"{name}: renaming {path}.{key} still validates"
            finally:
                obj.clear()
                obj.update(saved)
    if name == "moedispatch.tuning-list/1" and doc["rows"]:
        doc["rows"][0]["inter"] = doc["rows"][0].pop("inter_dim")
        assert errors(doc, schema, registry)


# -- explain --brief --format json: each reason once (newcomer minors 8 and 9) -------------------------------------

@pytest.mark.parametrize("model, target", [("Qwen3-235B-A22B-Instruct-2507-FP8", "MI300X"),
                                           ("MiniMax-M3-MXFP4", "MI355X"), ("Llama-4-Maverick-17B-128E-Instruct-FP8", "MI300X")])
def test_brief_json_carries_each_reason_once(monkeypatch, schemas, registry, model, target):
    """The report: Qwen3-235B TP8 was 2.0 MB of JSON, each of 94 layers repeating ~18 KB of reasons although groups
    exists, and ``--brief --format json`` was silently the full JSON. Now --brief JSON holds each distinct reason once
    (groups, rejected backends and warnings refer to it by index) and says the same as the full document."""
    argv = ("explain", "--model", model, "--target", target, "--tp", "8", *AITER)
    full = cli_json(monkeypatch, *argv)
    code, out, err = run([*argv, "--format", "json", "--brief"], monkeypatch)
    assert code == 0, err
    brief = check(json.loads(out), schemas, registry, "moedispatch.explain-brief/1")
    assert len(out) * 20 < len(json.dumps(full, indent=2))
    table = brief["reasons"]
    assert len({json.dumps(r, sort_keys=True) for r in table}) == len(table)  # each once
    by_index = {layer["index"]: layer for layer in full["layers"]}
    assert sorted(i for g in brief["groups"] for i in g["layers"]) == sorted(by_index)
    for g in brief["groups"]:
        for i in g["layers"]:  # every layer of the group: the full document's decision, reason for reason
            layer = by_index[i]
            assert (layer["backend"], layer["padding"], layer["shape"]) == (g["backend"], g["padding"], g["shape"])
            assert [table[k] for k in g["reasons"]] == layer["reason_details"]
            assert [(r["backend"], [table[k] for k in r["reasons"]]) for r in g["rejected"]] == \
                [(r["backend"], r["reason_details"]) for r in layer["rejected"]]
    assert [table[k] for k in brief["warnings"]] == full["warning_details"]
    assert {k: brief[k] for k in ("fingerprint", "decision_fingerprint", "cost_total", "target")} == \
        {k: full[k] for k in ("fingerprint", "decision_fingerprint", "cost_total", "target")}


def test_brief_json_with_engine_and_what_if(monkeypatch, schemas, registry):
    code, out, err = run(["explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", *AITER,
                          "--brief", "--what-if", "--engine", "vllm", "--format", "json"], monkeypatch)
    assert code == 0, err
    doc = check(json.loads(out), schemas, registry, "moedispatch.explain-brief/1")
    assert doc["engine_auto"] and any("what_if" in g for g in doc["groups"])
    doc["groups"][0]["reason_ids"] = doc["groups"][0].pop("reasons")
    assert errors(doc, schemas["moedispatch.explain-brief/1"], registry)


def test_the_schema_tells_the_allocation_pad_from_the_kernel_pad():
    """Newcomer minor 11: padding.intermediate_pad (allocation) invited passing it as AITER's fused_moe
    intermediate_pad= (the kernel's, kernel_intermediate_pad) — aiter#3538; the schema described neither."""
    padding = json.loads((DOCS / "explain.schema.json").read_text(encoding="utf-8"))["$defs"]["layer"]["properties"][
        "padding"]["properties"]
    assert "ALLOCATION" in padding["intermediate_pad"]["description"]
    assert "kernel_intermediate_pad" in padding["intermediate_pad"]["description"]
    assert "fused_moe(intermediate_pad=)" in padding["kernel_intermediate_pad"]["description"]
    assert "fused_moe(hidden_pad=)" in padding["kernel_hidden_pad"]["description"]
