"""capability_db/ is data with a schema: every file validates against docs/schemas/*.json, cross-references hold, and
the cheap load-time checks turn a broken entry into one CapabilityDBError line naming file, key and problem."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from moedispatch.data import capdb
from moedispatch.kit import rules
from moedispatch.core.errors import CapabilityDBError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
DB = ROOT / "capability_db"


def _schema(name):
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.mark.parametrize("toml_name", ["gpus", "aiter", "known_issues"])
def test_toml_files_validate_against_their_schema(toml_name):
    data = tomllib.loads((DB / f"{toml_name}.toml").read_text())
    jsonschema.validate(data, _schema(f"{toml_name}.schema.json"))


@pytest.mark.parametrize("path", sorted((DB / "models").glob("*.json")), ids=lambda p: p.name)
def test_model_files_validate_against_the_model_schema(path):
    data = json.loads(path.read_text())
    jsonschema.validate(data, _schema("model.schema.json"))
    assert data["name"] == path.stem, "file name and model name must agree"


def test_cross_references_hold(builtins):
    gpus = capdb.gpus()
    aiter = capdb.aiter_db()
    names = {b.name for b in builtins}
    for issue in rules.known_issues():
        assert set(issue.families) <= names, (issue.id, issue.families)
    ids = [i.id for i in rules.known_issues()]
    assert len(ids) == len(set(ids))
    for b in builtins:
        for combo in getattr(b, "combos", ()):
            assert set(combo.archs) <= set(gpus["arch"]), (b.name, combo.archs)
            if combo.feature:
                assert combo.feature in aiter["features"], (b.name, combo.feature)


def test_schema_rejects_what_the_loader_rejects():
    """The schemas are not vacuous: a few broken documents fail them."""
    gpus = tomllib.loads((DB / "gpus.toml").read_text())
    broken = copy.deepcopy(gpus)
    broken["arch"]["gfx942"]["native_mx"] = "no"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _schema("gpus.schema.json"))
    issues = tomllib.loads((DB / "known_issues.toml").read_text())
    broken = copy.deepcopy(issues)
    broken["issue"][0]["predicate"]["inter_mod"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _schema("known_issues.schema.json"))


# -- load-time checks: file, key, problem in one line ----------------------------------------------------------

@pytest.fixture
def serve(monkeypatch):
    """serve(name, mutate): capability_db/<name> as parsed, then passed through mutate(doc)."""
    real = capdb.load_toml.__wrapped__

    def clear():
        for fn in (capdb.gpus, capdb.aiter_db, rules.known_issues, rules._version_in):
            fn.cache_clear()

    def use(name, mutate):
        doc = copy.deepcopy(real(name))
        mutate(doc)
        monkeypatch.setattr(capdb, "load_toml", lambda n: doc if n == name else real(n))
        clear()

    yield use
    monkeypatch.undo()
    clear()


def _set(path, value):
    def mutate(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


CASES = [
    ("gpus.toml", ("arch", "gfx942", "native_mx"), "no",
     "capability_db/gpus.toml: [arch.gfx942]: native_mx must be a boolean, got a string 'no'"),
    ("gpus.toml", ("arch", "gfx942", "products", 0, "compute_units"), 0,
     "capability_db/gpus.toml: [arch.gfx942] products[0]: compute_units must be a positive integer, got 0"),
    ("gpus.toml", ("arch", "gfx950", "products"), [],
     "capability_db/gpus.toml: [arch.gfx950]: products must be a non-empty array of tables"),
    ("gpus.toml", ("arch", "gfx950", "products", 0, "name"), KeyError,
     "capability_db/gpus.toml: [arch.gfx950] products[0] lacks key 'name'"),
    ("gpus.toml", ("arch", "gfx90a"), "CDNA2",
     "capability_db/gpus.toml: [arch.gfx90a] must be a table, got a string 'CDNA2'"),
    ("gpus.toml", ("default", "gfx"), "gfx999",
     "capability_db/gpus.toml: default.gfx = 'gfx999' is not an [arch.*] entry"),
    ("gpus.toml", ("default", "product"), "MI300X",
     "capability_db/gpus.toml: default.product = 'MI300X' is not a product of [arch.gfx950] "
     "(MI355X, MI350X, MI350P)"),
    ("gpus.toml", ("aliases", "gfx940"), "gfx9",
     "capability_db/gpus.toml: aliases.gfx940 = 'gfx9' is not an [arch.*] entry"),
    ("aiter.toml", ("known_versions", 3), "0.1.x",
     "capability_db/aiter.toml: known_versions[3] = '0.1.x' is not a PEP 440 version"),
    ("aiter.toml", ("known_versions",), [],
     "capability_db/aiter.toml: known_versions must be a non-empty array of versions"),
    ("aiter.toml", ("features", "gate_mode", "since"), 14,
     "capability_db/aiter.toml: [features.gate_mode]: since must be a PEP 440 version string, got an integer 14"),
    ("aiter.toml", ("features", "gate_mode", "absent_in"), ["0.1.x"],
     "capability_db/aiter.toml: [features.gate_mode]: absent_in[0] = '0.1.x' is not a PEP 440 version"),
    ("aiter.toml", ("flydsl_pins", 0, "aiter"), ">>0.1",
     "capability_db/aiter.toml: flydsl_pins[0]: aiter = '>>0.1' is not a PEP 440 specifier"),
    ("aiter.toml", ("flydsl_pins", 1, "source"), KeyError,
     "capability_db/aiter.toml: flydsl_pins[1] lacks key 'source'"),
    ("known_issues.toml", ("issue", 0, "predicate", "inter_mod"), 0,
     "capability_db/known_issues.toml: issue[0] (aiter#5233): predicate.inter_mod must be a positive integer, got 0"),
    ("known_issues.toml", ("issue", 0, "predicate", "gfx"), "gfx950",
     "capability_db/known_issues.toml: issue[0] (aiter#5233): predicate.gfx must be an array of strings, "
     "got 'gfx950'"),
    ("known_issues.toml", ("issue", 1, "families"), [],
     "capability_db/known_issues.toml: issue[1] (aiter-pr#3538): families must be a non-empty array of backend "
     "names, got []"),
    ("known_issues.toml", ("issue", 2, "workaround", "kernel_intermediate_pad"), "0",
     "capability_db/known_issues.toml: issue[2] (aiter#5413): workaround.kernel_intermediate_pad must be a "
     "non-negative integer, got '0'"),
    ("known_issues.toml", ("issue", 1, "id"), "aiter#5233",
     "capability_db/known_issues.toml: issue[1] (aiter#5233): duplicate id 'aiter#5233' (also issue[0])"),
    ("known_issues.toml", ("issue", 0, "effect"), "wrong",
     "capability_db/known_issues.toml: issue[0] (aiter#5233): effect 'wrong' not one of wrong_output, crash, hang, "
     "slow, unsupported"),
    ("known_issues.toml", ("issue", 0, "aiter"), ">=x",
     "capability_db/known_issues.toml: issue[0] (aiter#5233): aiter '>=x' is not a release range: 'x' is not a "
     "PEP 440 version"),
]


@pytest.mark.parametrize("name, path, value, message", CASES,
                         ids=[f"{c[0]}:{'.'.join(map(str, c[1]))}" for c in CASES])
def test_a_broken_entry_names_file_key_and_problem(serve, name, path, value, message):
    serve(name, _set(path, value))
    with pytest.raises(CapabilityDBError) as err:
        capdb.gpus(), capdb.aiter_db(), rules.known_issues()
    assert str(err.value) == message


def test_a_feature_a_backend_needs_missing_from_the_db_is_one_line_not_a_traceback(serve, caps, builtins):
    from moedispatch.core.layers import MoELayer
    from moedispatch.selector.pure import select_uncached

    serve("aiter.toml", lambda doc: doc["features"].pop("cktile_mxfp4"))
    layer = MoELayer.build(hidden=6144, intermediate=3072, experts=128, top_k=4, tp=8, weight="mxfp4", act="bf16")
    with pytest.raises(CapabilityDBError, match=r"^capability_db/aiter.toml: no \[features.cktile_mxfp4\] "):
        select_uncached(layer, caps("gfx950"), builtins)


def test_cli_exits_2_on_a_broken_db_entry(tmp_path):
    """End to end: a broken installed gpus.toml → exit 2, one line naming file, key and problem."""
    import subprocess

    code = (
        "import sys, moedispatch.data.capdb as c\n"
        "real = c.load_toml.__wrapped__\n"
        "def load(name):\n"
        "    d = real(name)\n"
        "    if name == 'gpus.toml': d['arch']['gfx950']['cdna'] = 'four'\n"
        "    return d\n"
        "c.load_toml = load\n"
        "from moedispatch.cli import main\n"
        "sys.exit(main(['explain', '--model', 'Mixtral-8x7B', '--target', 'gfx950']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "moedispatch: capability_db/gpus.toml: [arch.gfx950]: cdna must be an integer, got a string 'four'"
    assert "Traceback" not in proc.stderr


def test_a_known_issue_s_dispatch_link_must_name_a_dispatch_issue(serve):
    """known_issues.toml ``dispatch = ID`` hands the issue to a dispatch_issues.toml entry under a user's tuned set:
    an id that table lacks is a one-line CapabilityDBError naming it."""
    serve("known_issues.toml", _set(("issue", 0, "dispatch"), "ROCm/aiter#0"))
    with pytest.raises(CapabilityDBError, match=r"dispatch 'ROCm/aiter#0' is no capability_db/dispatch_issues.toml id"):
        rules.known_issues()
