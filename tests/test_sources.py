"""Every source a reader can follow, and how sure each capability_db fact is, as data.

(a) Nothing shipped (moedispatch/, plugins/, capability_db/, docs/) cites the team's research notes, which ship
    nowhere: ``vllm.md §…``, ``aiter_sglang.md §…``, ``models_hw.md``, ``seeds/…``, ``shared/reference``,
    "moedispatch reference …". Files in ``PENDING`` are skipped until their owner converts them (keep it empty).
(b) Every ``source`` / ``cite`` value in capability_db (and every entry of a model file's ``sources``) names at least
    one followable reference: an https URL, ``owner/repo#N`` (issue or PR) or ``owner/repo@ref:path`` (a file at a
    tag or commit). Several are separated by ``"; "``; a part may be short prose, but a part that only *looks* like a
    reference (``vllm/envs.py``, ``PR #46419``, ``ROCm/aiter v0.1.14 requirements``, ``models_hw.md``) is not one.
(c) Every ``confidence`` is confirmed, derived or unconfirmed; the loaders reject anything else naming file and key,
    expose it (``capdb.feature_info(name)["confidence"]``, ``KnownIssue.confidence``, ``ModelSpec.unconfirmed``), and
    the facts that motivated the key carry it: Kimi-K2's quantization block is unconfirmed (no primary source read),
    conservative AITER floors are derived, and flydsl_mxfp8_moe's floor is the first tag that ships the MXFP8 tuned
    CSV vLLM probes for (ROCm/aiter#3811, in v0.1.16.post1 and v0.1.17+), not a guessed next release.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from moedispatch.data import capdb
from moedispatch.kit import rules
from moedispatch.core.errors import CapabilityDBError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
SHIPPED = ("moedispatch", "plugins", "capability_db", "docs")
TEXT_SUFFIXES = {".py", ".toml", ".json", ".md", ".csv", ".txt", ".rst", ".cfg", ".ini", ".yaml", ".yml"}

#: Shipped files that still cite the notes, skipped by (a) until converted. Keep it empty; a clean file listed here
#: fails test_pending_is_not_stale so the list cannot rot.
PENDING: set[str] = set()

#: A citation of the research notes (the issue-11 grep, minus its false positives such as "the reference path").
NOTE_CITATION = re.compile(
    r"\b(?:vllm|aiter_sglang|models_hw|aiter_dispatch_cost|vllm_oracle_diff)\.md\b"
    r"|\bseeds/"
    r"|shared/reference"
    r"|\bmoedispatch reference (?:vllm|aiter|models|seeds)"
    r"|\breference (?:seeds|notes?)\b"
    r"|\[[CTUD] (?:vllm|aiter|models)\.?")

_URL = r"https://[^\s;,)]+"
_ISSUE = r"\b[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+#\d+\b"
_FILE = r"\b[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+@[A-Za-z0-9_.+-]+:[^\s;,)]+"
FOLLOWABLE = re.compile(f"{_URL}|{_ISSUE}|{_FILE}")
#: What a reference looks like without being followable: a repo-ish or path-ish slash token, a bare #N, a file name.
PSEUDO_REF = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+|#\d+"
                        r"|\b[\w-]+\.(?:py|md|toml|json|csv|rst|ya?ml|cu|cuh|txt)\b")
CONFIDENCES = ("confirmed", "derived", "unconfirmed")
SOURCE_KEYS = {"source", "cite", "measured_source"}
CONFIDENCE_KEYS = {"confidence", "measured_confidence", "partitions_confidence"}


def _shipped_files() -> list[Path]:
    return sorted(p for root in SHIPPED for p in (ROOT / root).rglob("*")
                  if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def citations(text: str) -> list[str]:
    return [m.group(0) for m in NOTE_CITATION.finditer(text)]


def _parts(source: str) -> list[str]:
    """``"; "``-separated parts, not splitting inside parentheses."""
    parts, depth, start = [], 0, 0
    for n, ch in enumerate(source):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and source.startswith("; ", n):
            parts.append(source[start:n])
            start = n + 2
    return parts + [source[start:]]


def unfollowable_parts(source: str) -> list[str]:
    """What keeps a source from being followable: [] when it names a followable reference and none of its parts
    is a pseudo-reference; else the offending parts (or the whole source when it names nothing followable)."""
    if not FOLLOWABLE.search(source):
        return [source]
    return [part for part in _parts(source) if not FOLLOWABLE.search(part) and PSEUDO_REF.search(part)]


def _walk(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """(where, key, value) for every key of every table, however nested (arrays of tables included)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield where, key, value
            yield from _walk(value, f"{where}.{key}")
    elif isinstance(node, list):
        for n, item in enumerate(node):
            yield from _walk(item, f"{where}[{n}]")


def _data_files() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for path in sorted((ROOT / "capability_db").rglob("*.toml")):
        out.append((_rel(path), tomllib.loads(path.read_text(encoding="utf-8"))))
    for path in sorted((ROOT / "capability_db" / "models").glob("*.json")):
        out.append((_rel(path), json.loads(path.read_text(encoding="utf-8"))))
    return out


def source_values() -> list[tuple[str, str]]:
    """(file: key path, value) of every source in capability_db."""
    found = []
    for name, doc in _data_files():
        for where, key, value in _walk(doc, ""):
            if key in SOURCE_KEYS and isinstance(value, str):
                found.append((f"{name}:{where}.{key}", value))
            if key == "sources" and isinstance(value, dict) and where == "":
                found += [(f"{name}:sources.{k}", v) for k, v in value.items()]
    return found


def confidence_values() -> list[tuple[str, Any]]:
    found = []
    for name, doc in _data_files():
        for where, key, value in _walk(doc, ""):
            if key in CONFIDENCE_KEYS and not isinstance(value, dict):
                found.append((f"{name}:{where}.{key}", value))
            if key == "confidence" and isinstance(value, dict) and where == "":
                found += [(f"{name}:confidence.{k}", v) for k, v in value.items()]
    return found


# -- (a) no citation of the notes in anything shipped ------------------------------------------------------------

def test_the_citation_pattern_catches_every_spelling_the_code_used():
    cited = ["aiter_sglang.md §3.4, §12", "(vllm.md §12.3-§12.5)", "models_hw.md §C.7", "reference seeds/004",
             "seeds/000 serve command", "moedispatch reference models_hw.md §A.2", "[C vllm.md §15.1]",
             "../shared/reference/README.md", "aiter_dispatch_cost.md"]
    assert [c for c in cited if not citations(c)] == []
    clean = ["the slow reference path", "preference must be an int", "float64 reference of the same operands",
             "A model reference or checkpoint config", "moedispatch reference MoE (torch)",
             "https://docs.vultr.com/inference-cookbook/rocm/getting-started/hardware-requirements.md"]
    assert [c for c in clean if citations(c)] == []


def test_no_shipped_file_cites_the_notes():
    offenders = {}
    for path in _shipped_files():
        rel = _rel(path)
        if rel in PENDING:
            continue
        hits = citations(path.read_text(encoding="utf-8", errors="replace"))
        if hits:
            offenders[rel] = hits[:3]
    assert offenders == {}, "cite the primary source the note names instead: " + json.dumps(offenders, indent=1)


def test_pending_is_not_stale():
    clean = sorted(rel for rel in PENDING
                   if not (ROOT / rel).is_file() or not citations((ROOT / rel).read_text(encoding="utf-8")))
    assert clean == [], f"no longer cites the notes, remove from PENDING: {clean}"


# -- (b) every source is followable ------------------------------------------------------------------------------

def test_the_followable_pattern():
    good = ["ROCm/aiter#5233", "vllm-project/vllm#46419 ('to avoid pad-skipping')",
            "ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py", "vllm-project/vllm@017e9f4448:vllm/envs.py (default False)",
            "https://github.com/ROCm/aiter/pull/5232",
            "a16w4 in ROCm/aiter@v0.1.12:aiter/fused_moe.py; ROCm/aiter#1341",
            "ROCm/aiter#5233 (open; gfx950, aiter 0.1.19); the 0.1.10 floor is inferred from the vLLM pin"]
    assert [g for g in good if unfollowable_parts(g)] == []
    bad = ["aiter_sglang.md §3.4", "vllm/envs.py", "reference seeds/004", "ROCm/aiter v0.1.14 requirements",
           "vLLM PR #46419", "ROCm/aiter#5233; aiter_sglang.md §12", "ROCm/aiter#5233; vllm/envs.py (default False)",
           "the card's glob list"]
    assert [b for b in bad if not unfollowable_parts(b)] == []


def test_every_capability_db_source_is_followable():
    values = source_values()
    assert len(values) > 60  # every table was walked: gpus, aiter, engines, known issues, aiter_configs, models
    bad = {where: parts for where, value in values if (parts := unfollowable_parts(value))}
    assert bad == {}, json.dumps(bad, indent=1)


def test_known_issue_sources_are_followable_through_the_loader():
    issues = rules.known_issues()
    assert issues
    assert {i.id: unfollowable_parts(i.source) for i in issues if unfollowable_parts(i.source)} == {}


# -- (c) confidence is data: three values, validated at load, exposed by the loaders -------------------------------

def test_every_confidence_is_one_of_three():
    values = confidence_values()
    assert len(values) > 10
    assert {where: v for where, v in values if v not in CONFIDENCES} == {}
    assert set(capdb.CONFIDENCES) == set(CONFIDENCES)


def test_model_confidence_keys_name_a_source():
    for name, doc in _data_files():
        if name.startswith("capability_db/models/"):
            assert set(doc.get("confidence", {})) <= set(doc["sources"]), name


@pytest.fixture
def serve_toml(monkeypatch):
    real = capdb.load_toml.__wrapped__

    def clear():
        for fn in (capdb.gpus, capdb.aiter_db, rules.known_issues):
            fn.cache_clear()

    def use(name, mutate):
        doc = copy.deepcopy(real(name))
        mutate(doc)
        monkeypatch.setattr(capdb, "load_toml", lambda n: doc if n == name else real(n))
        clear()

    yield use
    monkeypatch.undo()
    clear()


@pytest.mark.parametrize("name, mutate, loader, message", [
    ("aiter.toml", lambda d: d["features"]["gate_mode"].update(confidence="likely"), capdb.aiter_db,
     r"^capability_db/aiter.toml: \[features.gate_mode\]: confidence 'likely' not one of confirmed, derived, "
     r"unconfirmed$"),
    ("aiter.toml", lambda d: d["flydsl_pins"][0].update(confidence="sure"), capdb.aiter_db,
     r"^capability_db/aiter.toml: flydsl_pins\[0\]: confidence 'sure'"),
    ("gpus.toml", lambda d: d["arch"]["gfx942"].update(confidence="Confirmed"), capdb.gpus,
     r"^capability_db/gpus.toml: \[arch.gfx942\]: confidence 'Confirmed'"),
    ("gpus.toml", lambda d: d["arch"]["gfx950"].update(partitions_confidence="guess"), capdb.gpus,
     r"^capability_db/gpus.toml: \[arch.gfx950\] partitions_confidence: confidence 'guess'"),
    ("known_issues.toml", lambda d: d["issue"][0].update(confidence="[U]"), rules.known_issues,
     r"^capability_db/known_issues.toml: issue\[0\] \(aiter#5233\): confidence '\[U\]'"),
])
def test_a_bad_confidence_is_rejected_naming_file_and_key(serve_toml, name, mutate, loader, message):
    serve_toml(name, mutate)
    with pytest.raises(CapabilityDBError, match=message):
        loader()


def test_a_bad_model_confidence_is_rejected_naming_file_and_key():
    from moedispatch.sources.models import _check_confidence

    doc = {"name": "x", "config": {}, "sources": {"quantization_config": "ROCm/aiter#1"}}
    _check_confidence({**doc, "confidence": {"quantization_config": "unconfirmed"}}, "capability_db/models/x.json")
    with pytest.raises(CapabilityDBError, match=r"^capability_db/models/x.json: confidence.quantization_config = "
                                                r"'\[U\]' not one of confirmed, derived, unconfirmed$"):
        _check_confidence({**doc, "confidence": {"quantization_config": "[U]"}}, "capability_db/models/x.json")
    with pytest.raises(CapabilityDBError, match=r"^capability_db/models/x.json: confidence.config names no sources"):
        _check_confidence({**doc, "confidence": {"config": "derived"}}, "capability_db/models/x.json")


def test_kimi_k2_quantization_block_is_unconfirmed_and_exposed_on_the_model_spec():
    """The motivating case: explain printed a confident plan for Kimi-K2 though its quantization block was only
    believed to be DeepSeek-style FP8 (no primary source read)."""
    from moedispatch.sources.models import load_model

    kimi = load_model("Kimi-K2")
    assert "quantization_config" in kimi.unconfirmed
    # DeepSeek-V3's fields are confirmed from transformers' DeepseekV3Config (tests/test_model_sources.py).
    assert load_model("DeepSeek-V3").unconfirmed == ()
    assert "quantization_config" not in load_model("MiniMax-M3-MXFP4").unconfirmed
    assert "quantization_config.export" in load_model("MiniMax-M3-MXFP4").derived
    assert load_model("Mixtral-8x7B").unconfirmed == () and load_model("Mixtral-8x7B").derived == ()


def test_feature_info_exposes_confidence_defaulting_to_confirmed():
    assert capdb.feature_info("gate_mode")["confidence"] == "confirmed"  # key absent in aiter.toml
    assert "confidence" not in capdb.aiter_db()["features"]["gate_mode"]
    for conservative in ("swiglu_limit", "cktile_mxfp4", "mxfp4_moe"):
        assert capdb.feature_info(conservative)["confidence"] == "derived", conservative


def test_flydsl_mxfp8_floor_is_the_first_tag_shipping_the_csv_vllm_probes_for():
    """vLLM's is_aiter_mxfp8_moe_available() needs aiter/configs/model_configs/minimax_m3_mxfp8_tuned_fmoe.csv;
    ROCm/aiter#3811 added it and it ships in v0.1.16.post1 ... v0.1.16.post6 and every tag from v0.1.17 (absent at
    v0.1.16). The earlier '0.1.21 = next release' floor was a guess."""
    info = capdb.feature_info("flydsl_mxfp8_moe")
    assert (info["since"], info["confidence"]) == ("0.1.16.post1", "confirmed")
    assert "ROCm/aiter#3811" in info["source"]
    assert "flydsl_mxfp8_moe" in capdb.features_for_version("0.1.20.post1")
    assert "flydsl_mxfp8_moe" in capdb.features_for_version("0.1.16.post2")
    assert "flydsl_mxfp8_moe" not in capdb.features_for_version("0.1.16")


def test_known_issues_carry_confidence():
    by_id = {i.id: i.confidence for i in rules.known_issues()}
    assert by_id["aiter#5233"] == "confirmed"
    # vllm-project/vllm#46419 names no AITER issue, family or version range: applying it to every family is ours.
    assert by_id["vllm-pr#46419"] == "derived"


def test_engines_toml_validates_against_its_schema_including_confidence():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "engines.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = tomllib.loads((ROOT / "capability_db" / "engines.toml").read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema)
    broken = copy.deepcopy(doc)
    broken["vllm"]["backend"][0]["env"][0]["confidence"] = "probably"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
    broken = copy.deepcopy(doc)
    noted = next(i for i, c in enumerate(broken["caveat"]) if "note" in c)
    del broken["caveat"][noted]["source"]  # a caveat note must say where it comes from
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_every_toml_confidence_is_checked_when_the_file_loads():
    """capdb.load_toml checks every ``confidence`` / ``*_confidence`` key at any depth (engine flags, caveats, pins,
    peaks), so a typo fails at load naming file and key instead of silently counting as confirmed."""
    for name in ("gpus.toml", "aiter.toml", "engines.toml", "known_issues.toml", "aiter_fhmoe.toml", "dispatch_issues.toml"):
        capdb.load_toml(name)
    doc = {"vllm": {"backend": [{"env": [{"name": "X", "confidence": "maybe"}]}]}}
    with pytest.raises(CapabilityDBError, match=r"^capability_db/engines.toml: vllm.backend\[0\].env\[0\].confidence "
                                                r"= 'maybe' not one of confirmed, derived, unconfirmed$"):
        capdb._check_confidences(doc, "capability_db/engines.toml", "")
    with pytest.raises(CapabilityDBError, match=r"peak.MI300X.measured_confidence = 'C'"):
        capdb._check_confidences({"peak": {"MI300X": {"measured_confidence": "C"}}}, "capability_db/gpus.toml", "")
    capdb._check_confidences({"caveat": [{"confidence": "derived"}], "x": {"partitions_confidence": "derived"}},
                             "capability_db/engines.toml", "")
