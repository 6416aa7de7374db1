"""moedispatch's own per-release index of AITER's fused-MoE data (issue 22 item 1).

The index (capability_db/aiter_index.json) is derived by scripts/build_aiter_index.py from ../shared/aiter — every
ROCm/aiter release v0.1.10 … v0.1.20.post1 and main at e4048607, byte for byte — and the project ships no byte copy of
an AITER file. These tests rebuild it and compare, check that each release's rows read back exactly as parsing that
release's own CSVs gives them, and pin how an AITER version picks its release.
"""

from __future__ import annotations

import hashlib
import json
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moedispatch.data import aiter_configs as ac
from moedispatch.data import aiter_index as ai

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_aiter_index", ROOT / "scripts" / "build_aiter_index.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_index_rebuilds_identically(shared_aiter):
    """Done when: 'the index rebuilds identically from ../shared/aiter/'."""
    text = _builder().build(shared_aiter)
    assert text == (ROOT / "capability_db" / "aiter_index.json").read_text(encoding="utf-8")


def test_builder_check_mode_says_so(shared_aiter, tmp_path):
    stale = tmp_path / "index.json"
    stale.write_text("{}\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_aiter_index.py"), "--aiter-data",
                           str(shared_aiter), "--out", str(stale), "--check"], capture_output=True, text=True)
    assert proc.returncode == 1 and "DIFFERS" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_aiter_index.py"), "--aiter-data",
                          str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "no manifest.toml" in bad.stderr and "Traceback" not in bad.stderr


def _project_files() -> list[Path]:
    """What the project holds: files git tracks or would add (ignored build/venv/scratch folders are not the
    project's); without git, every file outside the usual ignored folders."""
    proc = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, check=False)
    if proc.returncode == 0:
        return [ROOT / n for n in proc.stdout.decode().split("\0") if n and (ROOT / n).is_file()]
    skip = {".git", ".venv", ".ci-venv", ".peers-venv", "__pycache__", "node_modules"}
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info") and not d.startswith(".")]
        out += [Path(dirpath) / n for n in filenames]
    return out


def test_no_byte_copy_of_an_aiter_file_is_in_the_project(shared_aiter):
    """No file of the project has the bytes of any file of ../shared/aiter."""
    theirs = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in shared_aiter.rglob("*") if p.is_file()
              and p.stat().st_size > 64}
    hits = [str(p.relative_to(ROOT)) for p in _project_files()
            if hashlib.sha256(p.read_bytes()).hexdigest() in theirs]
    assert not hits, hits


@pytest.mark.parametrize("tag", ["v0.1.10", "v0.1.15.post3", "v0.1.18", "v0.1.19.post1", "v0.1.20.post1", "head"])
def test_each_release_reads_back_as_its_own_csvs(shared_aiter, tag):
    """rows_for(tag) is, row for row and in AITER's merge order, what parsing that release's default set gives."""
    configs = shared_aiter / tag / "aiter" / "configs"
    expected = []
    for path in ac.default_files(str(configs)):
        if os.path.isfile(path):
            rel = os.path.relpath(path, shared_aiter / tag).replace(os.sep, "/")
            rows, problems = ac.parse_csv(path, ai.display_prefix(tag) + rel, dispatch="legacy")
            assert not problems
            expected.extend(rows)
    assert ai.rows_for(tag) == tuple(expected)
    assert ai.files_for(tag) == tuple(os.path.relpath(p, shared_aiter / tag).replace(os.sep, "/")
                                      for p in ac.default_files(str(configs)) if os.path.isfile(p))


def test_releases_follow_the_manifest(shared_aiter):
    import tomllib

    manifest = tomllib.loads((shared_aiter / "manifest.toml").read_text())
    assert [(r.tag, r.commit, r.date) for r in ai.releases()] == [
        (t, v["commit"], v["date"]) for t, v in manifest["release"].items()]
    assert ai.releases()[-1].tag == "head" and ai.releases()[-1].commit.startswith("e4048607")


@pytest.mark.parametrize(("version", "tag", "note"), [
    ("0.1.18", "v0.1.18", None),
    ("0.1.20.post1+rocm7.1", "v0.1.20.post1", None),        # a local suffix is the same release
    ("0.1.17.post3", "v0.1.17", "nearest older release"),   # between two releases: the older one, said
    ("0.1.19.post2.dev7", "v0.1.19.post1", "nearest older release"),
    ("0.1.7.post2.dev18", "v0.1.10", "older than every release"),
    ("0.1.21", "head", "newer than every release"),
    (None, "head", None),
    ("nonsense!", "head", "not a PEP 440 version"),
])
def test_release_for(version, tag, note):
    got, notes = ai.release_for(version)
    assert got == tag
    assert (not notes) if note is None else (len(notes) == 1 and note in notes[0])


def test_bundled_set_names_its_release_and_rows_differ_between_releases():
    """compare --aiter-version X,Y has real rows to compare: releases hold different tuned sets."""
    old = ac.load_config_set("bundled", version="0.1.15.post3")
    new = ac.load_config_set("bundled", version="0.1.20.post1")
    assert (old.release, new.release) == ("v0.1.15.post3", "v0.1.20.post1")
    assert old.to_dict()["release"] == "v0.1.15.post3"
    assert old.rows[0].where.startswith("ROCm/aiter@v0.1.15.post3:aiter/configs/")
    assert len(old.rows) != len(new.rows)
    assert {r.key() for r in old.rows} != {r.key() for r in new.rows}
    assert ac.load_config_set("v0.1.18").release == "v0.1.18"
    with pytest.raises(ac.UsageError, match="a release of the index"):
        ac.load_config_set("v0.1.99")


def test_asm_catalogs_per_release():
    """ASM MoE kernels per release: gfx950's MXFP4 1-stage table exists at head, with its tile columns."""
    head = ai.asm_kernels("head", gfx="gfx950")
    mx = [k for k in head if "pertokenMXfp4" in k.file and k.kind == "fmoe"]
    assert mx and all(dict(k.attrs)["subGU_m"] for k in mx)
    assert all(k.gfx == "gfx950" for k in head)
    assert ai.asm_kernels("v0.1.10", gfx="gfx942") and ai.asm_kernels("v0.1.10") != ai.asm_kernels("head")


def test_fhmoe_table_matches_aiter_when_a_checkout_is_given():
    """capability_db/aiter_fhmoe.toml against the real file (MOEDISPATCH_AITER_SRC = a ROCm/aiter checkout or git dir)."""
    src = os.environ.get("MOEDISPATCH_AITER_SRC")
    if not src:
        pytest.skip("set MOEDISPATCH_AITER_SRC to a ROCm/aiter checkout to compare the FHMoE table with AITER's")
    b = _builder()
    doc = b.tomllib.loads((ROOT / "capability_db" / "aiter_fhmoe.toml").read_text())
    text = b.read_at(Path(src), doc["commit"], b.FHMOE_PATH)
    assert b.fhmoe_toml(text, doc["commit"]) == (ROOT / "capability_db" / "aiter_fhmoe.toml").read_text()


def test_aiter_configs_flag_and_env_read_a_checkout(cli, shared_aiter):
    """--aiter-configs DIR (or MOEDISPATCH_AITER_CONFIGS) plans with that folder's CSVs — here release v0.1.18's
    checkout layout (aiter/configs/) — and the plan says so; a missing folder is one line and exit 2."""
    folder = str(shared_aiter / "v0.1.18")
    out = cli("explain", "--model", "GLM-5-FP8", "--target", "MI300X", "--tp", "8", "--aiter-version", "0.1.18",
              "--aiter-configs", folder, "--format", "json")
    assert out.returncode == 0, out.stderr
    (used,) = json.loads(out.stdout)["aiter_data"]
    assert used["origin"] == "explicit" and folder in used["rows"] and used["rules"] == "v0.1.18"
    bundled = json.loads(cli("explain", "--model", "GLM-5-FP8", "--target", "MI300X", "--tp", "8", "--aiter-version",
                             "0.1.18", "--format", "json").stdout)
    assert bundled["aiter_data"][0]["release"] == "v0.1.18" and bundled["aiter_data"][0]["origin"] == "bundled"
    for args in (["--aiter-configs", str(shared_aiter / "nope")],):
        bad = cli("explain", "--model", "GLM-5-FP8", "--target", "MI300X", *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not a directory" in bad.stderr
    env_doc = json.loads(cli("explain", "--model", "GLM-5-FP8", "--target", "MI300X", "--tp", "8", "--aiter-version",
                             "0.1.18", "--format", "json", env={"MOEDISPATCH_AITER_CONFIGS": folder}).stdout)
    assert env_doc["aiter_data"][0]["origin"] == "explicit"


def test_explicit_rows_equal_the_index_rows_for_the_same_release(shared_aiter):
    """Reading release v0.1.18's own folder and reading the index's v0.1.18 give the same kernels per bucket."""
    from moedispatch.aiter.dispatch import plan_dispatch
    from moedispatch.data.capdb import target_capabilities
    from moedispatch.sources.models import expand_layers, load_model

    caps = target_capabilities("MI300X", "0.1.18")
    layer = next(l for l in expand_layers(load_model("GLM-5-FP8"), tp=8, ep=1) if l.kind == "moe")
    tokens = (1, 2, 4, 8, 16, 64, 256, 1024, 8192)
    a = plan_dispatch(layer, caps, tokens=tokens, env={}, configs=ac.load_config_set(str(shared_aiter / "v0.1.18"),
                                                                                     version="0.1.18"))
    b = plan_dispatch(layer, caps, tokens=tokens, env={}, configs=ac.load_config_set("v0.1.18", version="0.1.18"))
    def strip(plan):  # the deciding row as file name and line (the folder or release prefix differs)
        return [(s.tokens, s.kernels, s.block_m, s.ksplit, s.basis, os.path.basename(s.config or "")) for s in plan.steps]

    assert strip(a) == strip(b) and any(s.basis == "tuned" for s in a.steps)
    assert a.config_origin == "explicit" and b.config_origin == "bundled" and b.config_release == "v0.1.18"
