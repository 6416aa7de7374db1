"""Rows AITER reverted (issue 26 item 5): flagged in capability_db/cost_reverted.toml with provenance, left out of the
fits and truths of the cost model (the release rows the drift bars and the release held-out read, the benchmark's
snapshot).

The file is derived by scripts/build_cost_reverted.py from ROCm/aiter's history (revert commits on main) and the
release folders of ../shared/aiter; these tests check every flagged row against the release folders themselves, and
rebuild the file when a clone of ROCm/aiter is given in ``AITER_REPO``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from moedispatch.core.errors import CapabilityDBError
from moedispatch.cost import drift, reverted
from moedispatch.data import aiter_configs, capdb

ROOT = Path(__file__).resolve().parents[1]
REVERTED = ROOT / "capability_db" / reverted.REVERTED_FILE
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.fixture(autouse=True)
def _fresh():
    reverted.load_reverted.cache_clear()
    yield
    reverted.load_reverted.cache_clear()


def _doc():
    return tomllib.loads(REVERTED.read_text(encoding="utf-8"))


def _release_idents(shared_aiter, tag):
    root = shared_aiter / tag
    cs = aiter_configs.load_config_set(str(root))
    return {reverted.identity(os.path.relpath(r.file, root).replace(os.sep, "/"), r) for r in cs.rows if r.us}


# -- the data ------------------------------------------------------------------------------------------------------

def test_every_flagged_row_is_in_the_releases_it_names(shared_aiter):
    """Provenance a reader can follow: each [[row]] is in the release folders it names (file, key, kernels, us), and
    each revert's count of such rows is the number of [[row]] entries naming it."""
    doc = _doc()
    assert doc["row"], "the releases v0.1.13 … v0.1.14.post1 ship rows ROCm/aiter#3209 reverted"
    manifest = tomllib.loads((shared_aiter / "manifest.toml").read_text())["release"]
    cache = {}
    for row in doc["row"]:
        ident = (row["file"], row["key"], row["kernel1"], row["kernel2"], round(row["us"], 4))
        for tag in row["releases"]:
            assert tag in manifest
            if tag not in cache:
                cache[tag] = _release_idents(shared_aiter, tag)
            assert ident in cache[tag], (tag, ident)
    for rev in doc["revert"]:
        assert rev["rows_in_releases"] == sum(1 for r in doc["row"] if r["revert"] == rev.get("pr"))
        assert rev["rows_in_releases"] <= rev["rows_removed"]
    assert doc["provenance"]["head_commit"] == manifest["head"]["commit"]


def test_the_reverts_the_issue_names_are_there_with_their_pull_requests():
    """ROCm/aiter#3534 reverted #3487 (deepseek_v32_ptpc_fp8_tuned_fmoe.csv, merged 2026-06-03, reverted the next day:
    no release carries it); #3209 undid #3004's kimik2_fp4 rows, which four releases ship."""
    by_pr = {r["pr"]: r for r in _doc()["revert"] if "pr" in r}
    assert by_pr[3534]["reverts"] == 3487 and by_pr[3534]["date"] == "2026-06-04"
    assert by_pr[3534]["rows_removed"] == 32 and by_pr[3534]["rows_in_releases"] == 0
    assert by_pr[3209]["reverts"] == 3004 and by_pr[3209]["rows_in_releases"] == 160
    releases = {t for r in _doc()["row"] if r["revert"] == 3209 for t in r["releases"]}
    assert releases == {"v0.1.13", "v0.1.13.post1", "v0.1.14", "v0.1.14.post1"}


@pytest.mark.skipif(not os.environ.get("AITER_REPO"), reason="rebuilding needs a ROCm/aiter clone in AITER_REPO")
def test_reverted_data_is_rebuilt_from_aiters_history(shared_aiter):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_cost_reverted.py"), "--check",
                          "--aiter-data", str(shared_aiter)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def test_prs_of_reads_the_revert_and_the_reverted_pull_request():
    import build_cost_reverted as build   # noqa: PLC0415 - a script, not a moedispatch module

    assert build.prs_of('Revert "tune deepseel v3.2 ptpc a8w8 moe (#3487)" (#3534)') == (3534, 3487)
    assert build.prs_of("Revert kimik2_fp4_tuned_fmoe.csv changes from PR #3004 (#3209)") == (3209, 3004)
    assert build.prs_of("Revert kimi2.5 fp4 tp4 moe tuned result on bs 32,64 (#2836)") == (2836, None)
    assert build.prs_of("Revert something") == (None, None)


def test_reverted_validates_against_its_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "schemas" / "cost_reverted.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = _doc()
    jsonschema.validate(doc, schema)
    for mutate in (lambda d: d["row"][0].update(key="1,2,3"),
                   lambda d: d["revert"][0].update(source="somewhere"),
                   lambda d: d["row"][0].update(releases=[])):
        broken = copy.deepcopy(doc)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="moedispatch.cost_reverted/0"), "schema"),
    (lambda d: d["provenance"].pop("repo"), "provenance"),
    (lambda d: d["revert"][0].pop("commit"), "revert[0] needs a non-empty string 'commit'"),
    (lambda d: d["revert"][0].update(rows_removed=-1), "rows_removed must be a count"),
    (lambda d: d["revert"][0].update(pr=0), "pr must be a positive integer"),
    (lambda d: d["row"][0].update(us=float("nan")), "us must be a positive finite number"),
    (lambda d: d["row"][0].update(key="256,1"), "key must have the 13 lookup columns"),
    (lambda d: d["row"][0].update(revert=99999), "is not a [[revert]] pr"),
    (lambda d: d["row"][0].update(releases=[]), "releases must be a non-empty list"),
    (lambda d: d["row"][0].pop("kernel2"), "needs a string 'kernel2'"),
    (lambda d: d.update(row=["x"]), "row[0] must be a table"),
    (lambda d: d.update(revert=["x"]), "revert[0] must be a table"),
])
def test_malformed_reverted_raises_capability_db_error(monkeypatch, mutate, message):
    real = capdb.load_toml.__wrapped__
    doc = real(reverted.REVERTED_FILE)
    mutate(doc)
    monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == reverted.REVERTED_FILE else real(name))
    with pytest.raises(CapabilityDBError, match=re.escape(message)) as err:
        reverted.load_reverted()
    assert reverted.REVERTED_FILE in str(err.value)


# -- left out of what the model is fit and measured on ---------------------------------------------------------------

_ROW = {"cu_num": 256, "token": 32, "model_dim": 7168, "inter_dim": 512, "expert": 385, "topk": 9,
        "act_type": "ActivationType.Silu", "dtype": "torch.bfloat16", "q_dtype_a": "torch.float4_e2m1fn_x2",
        "q_dtype_w": "torch.float4_e2m1fn_x2", "q_type": "QuantType.per_1x32", "use_g1u1": 1, "doweight_stage1": 0,
        "kernel1": "k1", "kernel2": "k2", "us": 260.94271, "file": "aiter/configs/a.csv"}


def _one(release="v0.1.13"):
    data = {"schema": reverted.SCHEMA,
            "provenance": {"data": "d", "repo": "r", "script": "s", "head_commit": "h", "method": "m"},
            "revert": [{"pr": 3209, "reverts": 3004, "commit": "c", "date": "2026-05-15", "subject": "Revert x",
                        "rows_removed": 1, "rows_in_releases": 1, "source": "u"},
                       {"pr": 2836, "commit": "c2", "date": "2026-04-21", "subject": "Revert y",
                        "rows_removed": 2, "rows_in_releases": 0, "source": "u2"}],
            "row": [{"revert": 3209, "file": "aiter/configs/a.csv", "key": reverted.key_text(_ROW), "kernel1": "k1",
                     "kernel2": "k2", "us": 260.9427, "releases": [release]}]}
    return reverted.parse_reverted(data)


def test_drop_matches_file_key_kernels_and_us_in_the_named_release_only():
    table = _one()
    kept, dropped = reverted.drop("v0.1.13", [_ROW], reverted=table)
    assert kept == [] and [(r, rev.pr, rev.reverts) for r, rev in dropped] == [(_ROW, 3209, 3004)]
    others = [dict(_ROW, us=260.9437), dict(_ROW, kernel1="k3"), dict(_ROW, kernel2="k3"), dict(_ROW, token=64),
              dict(_ROW, file="aiter/configs/b.csv")]
    for row in others:
        assert reverted.drop("v0.1.13", [row], reverted=table) == ([row], [])
    assert reverted.drop("v0.1.14", [_ROW], reverted=table) == ([_ROW], [])
    # the path of a row in its release, when the row's file is something else
    kept, dropped = reverted.drop("v0.1.13", [dict(_ROW, file="/abs/v0.1.13/aiter/configs/a.csv")],
                                  lambda r: "aiter/configs/a.csv", reverted=table)
    assert kept == [] and len(dropped) == 1
    assert table.revert_of("v0.1.13", "aiter/configs/a.csv", _ROW).date == "2026-05-15"
    assert table.reverts[1].reverts is None and table.reverts[1].rows_in_releases == 0


def test_identity_and_key_text_spell_the_lookup_key():
    assert reverted.key_text(_ROW) == ("256,32,7168,512,385,9,ActivationType.Silu,torch.bfloat16,"
                                       "torch.float4_e2m1fn_x2,torch.float4_e2m1fn_x2,QuantType.per_1x32,1,0")
    assert reverted.identity("p", _ROW) == ("p", reverted.key_text(_ROW), "k1", "k2", 260.9427)
    assert reverted.identity("p", dict(_ROW, kernel1=None, kernel2=None))[2:4] == ("", "")


def test_release_rows_leave_out_what_aiter_reverted(shared_aiter):
    """v0.1.13 ships #3004's kimik2_fp4 rows that #3209 reverted: its raw rows have them, the release rows the drift
    bars and the release held-out read do not."""
    flagged = {(r["file"], r["key"], r["kernel1"], r["kernel2"], round(r["us"], 4))
               for r in _doc()["row"] if "v0.1.13" in r["releases"]}
    assert flagged <= _release_idents(shared_aiter, "v0.1.13")
    rows = dict((tag, keyed) for tag, _c, keyed in drift.release_rows(str(shared_aiter)))["v0.1.13"]
    kept = {reverted.identity(r.file, r) for r in rows.values()}
    assert not kept & flagged
    assert len(rows) > 700   # everything else is still there (754 rows)


def test_benchmark_leaves_reverted_rows_out_of_its_snapshot(shared_aiter):
    import bench_cost_model as bench   # noqa: PLC0415 - a benchmark script, not a moedispatch module

    _cs, rows, samples, rejected, _peaks = bench.load("v0.1.13", str(shared_aiter))
    why = [w for _r, w in rejected if w.startswith("reverted by")]
    # 160 rows flagged in v0.1.13, of which 80 carry a _tag (left out anyway): the other 80 are dropped here
    assert len(why) == 80 and all(w == "reverted by ROCm/aiter#3209 (2026-05-15)" for w in why)
    assert all(s.row not in [r for r, w in rejected if w.startswith("reverted")] for s in samples)
    _cs, _rows, _s, head_rejected, _p = bench.load("head", str(shared_aiter))
    assert not [w for _r, w in head_rejected if w.startswith("reverted by")]


def test_shipped_file_loads():
    table = reverted.load_reverted()
    assert {r.pr for r in table.reverts} >= {2836, 3209, 3344, 3534}
    assert len(table.flagged) == sum(len(r["releases"]) for r in _doc()["row"])


def _doc_one(**changes):
    data = {"schema": reverted.SCHEMA,
            "provenance": {"data": "d", "repo": "r", "script": "s", "head_commit": "h", "method": "m"},
            "revert": [{"pr": 1, "reverts": 2, "commit": "c", "date": "2026-05-15", "subject": "Revert x",
                        "rows_removed": 3, "rows_in_releases": 1, "source": "u"}],
            "row": [{"revert": 1, "file": "f", "key": reverted.key_text(_ROW), "kernel1": "k1", "kernel2": "k2",
                     "us": 1.5, "releases": ["v1"]}]}
    for where, value in changes.items():
        table, field = where.split("__")
        data[table][0][field] = value
    return data


@pytest.mark.parametrize("where, value, message", [
    ("revert__pr", True, "pr must be a positive integer, got True"),
    ("revert__reverts", 0, "revert[0]: reverts must be a positive integer"),
    ("revert__rows_removed", True, "rows_removed must be a count"),
    ("row__us", True, "us must be a positive finite number"),
    ("row__us", 0, "us must be a positive finite number"),
    ("row__revert", 0, "row[0]: revert must be a positive integer"),
])
def test_boundaries_of_the_validation(where, value, message):
    with pytest.raises(CapabilityDBError, match=re.escape(message)):
        reverted.parse_reverted(_doc_one(**{where: value}))


def test_smallest_valid_values_and_every_field_are_kept():
    """pr 1, us 1.5 (a timing below 1 µs is also a timing), no [[row]] or [[revert]] at all."""
    table = reverted.parse_reverted(_doc_one())
    rev = table.reverts[0]
    assert (rev.pr, rev.reverts, rev.commit, rev.date, rev.subject, rev.rows_removed, rev.rows_in_releases) == \
        (1, 2, "c", "2026-05-15", "Revert x", 3, 1)
    assert table.provenance["method"] == "m"
    assert table.flagged == {("v1", ("f", reverted.key_text(_ROW), "k1", "k2", 1.5)): 1}
    assert reverted.parse_reverted(_doc_one(row__us=0.25)).flagged
    # the same row to 4 decimals, as identity() rounds the release's row
    assert reverted.parse_reverted(_doc_one(row__us=1.23456)).revert_of("v1", "f", dict(_ROW, us=1.23464)) is not None
    empty = {k: v for k, v in _doc_one().items() if k not in ("row", "revert")}
    assert reverted.parse_reverted(empty).flagged == {} and reverted.parse_reverted(empty).reverts == ()
    with pytest.raises(CapabilityDBError, match=re.escape("got 'moedispatch.cost_reverted/0'")):
        reverted.parse_reverted(dict(_doc_one(), schema="moedispatch.cost_reverted/0"))
    with pytest.raises(CapabilityDBError, match="lookup columns cu_num, token, model_dim"):
        reverted.parse_reverted(_doc_one(row__key="1,2"))


def test_drop_reads_the_shipped_file_and_the_row_objects_path(shared_aiter):
    """Without a table, drop() reads capability_db/cost_reverted.toml; path_of gets the row itself."""
    doc = _doc()
    flagged = doc["row"][0]
    tag = flagged["releases"][0]
    root = shared_aiter / tag
    rows = [r for r in aiter_configs.load_config_set(str(root)).rows
            if reverted.identity(os.path.relpath(r.file, root).replace(os.sep, "/"), r) ==
            (flagged["file"], flagged["key"], flagged["kernel1"], flagged["kernel2"], round(flagged["us"], 4))]
    assert rows
    seen = []
    kept, dropped = reverted.drop(tag, rows, lambda r: seen.append(r) or os.path.relpath(r.file, root))
    assert kept == [] and len(dropped) == len(rows) and seen == rows
