"""What makes AITER's merge of ``AITER_CONFIG_FMOE`` raise, through AITER's REAL code, against moedispatch's model.

``aiter/jit/core.py`` ``update_config_files`` at e4048607 and at v0.1.11.post1 (the last release before the merge
learnt to raise; run in the AITER peer venv with the stand-ins of test_aiter_peers.py; tests/peers/aiter/
merge_side.py) is given the paths each case lists — CSVs written here from rows of AITER's own head
``tuned_fmoe.csv`` (../shared/aiter/head) — and answers whether it raises. moedispatch's model of the same
environment for that release (``aiter_configs.config_set_for``: ``merge_error`` starting "AITER raises", which
``aiter-configs`` reports as an error and ``explain`` as a plan problem) must say the same. Skipped without
.aiter-peer-venv or the ROCm/aiter source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "aiter"
sys.path.insert(0, str(HERE))

import aiter_src  # noqa: E402
import harness  # noqa: E402

from moedispatch.data import aiter_configs as cfg  # noqa: E402
from moedispatch.testing import fake_capabilities  # noqa: E402

#: (case, files: name → row indices of head's tuned_fmoe.csv, a repeated index = that row again with us × 2;
#:  AITER_CONFIG_FMOE as names joined by os.pathsep, "missing*" naming no file)
CASES = [
    ("a key in two files", {"a": [0], "b": [0, 1]}, ["a", "b"]),
    ("distinct keys in two files", {"a": [0], "b": [1]}, ["a", "b"]),
    ("one of two files missing", {"a": [0, 1]}, ["a", "missing"]),
    ("the first of two files missing", {"a": [0, 1]}, ["missing", "a"]),
    ("every file missing", {}, ["missing", "missing2"]),
    ("the only file missing", {}, ["missing"]),
    ("a key twice in one file, alone", {"a": [0, 0]}, ["a"]),
    ("a key twice in one file, beside a missing one", {"a": [0, 0]}, ["a", "missing"]),
]


def _head_csv() -> Path:
    root = Path(os.environ.get("MOEDISPATCH_AITER_DATA") or aiter_src.ROOT.parent / "shared" / "aiter")
    path = root / "head" / "aiter" / "configs" / "tuned_fmoe.csv"
    if not path.exists():
        pytest.skip(f"AITER's head tuned_fmoe.csv not found at {path} (set MOEDISPATCH_AITER_DATA)")
    return path


def _write(folder: Path, files: dict[str, list[int]]) -> None:
    header, *rows = _head_csv().read_text().splitlines()
    us = header.split(",").index("us")
    for name, picks in files.items():
        lines, seen = [header], set()
        for i in picks:
            fields = rows[i].split(",")
            if i in seen:                                   # the same key again, slower: a real duplicate
                fields[us] = str(float(fields[us]) * 2)
            seen.add(i)
            lines.append(",".join(fields))
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")


#: AITER sources: (label, git ref, the version moedispatch plans for — None: the newest, HEAD's merge).
SOURCES = [("head", None, None), ("v0.1.11.post1", "v0.1.11.post1", "0.1.11.post1")]


@pytest.fixture(scope="module", params=SOURCES, ids=[s[0] for s in SOURCES])
def answers(request, tmp_path_factory):
    label, ref, version = request.param
    try:
        python, spec = harness.peer_source(ref)
    except LookupError as exc:
        pytest.skip(str(exc))
    src = harness.prepare_source(python, spec)
    ours, jobs = {}, []
    for cid, (name, files, listed) in enumerate(CASES):
        ours_dir, theirs_dir = (tmp_path_factory.mktemp(f"{label}-case{cid}{side}") for side in ("m", "a"))
        for folder in (ours_dir, theirs_dir):      # AITER rewrites its sources after a duplicate: one copy each
            _write(folder, files)
        env = {"AITER_CONFIG_FMOE": os.pathsep.join(str(ours_dir / f"{n}.csv") for n in listed)}
        cs = cfg.config_set_for(fake_capabilities("MI300X", version), env)
        ours[cid] = cs.merge_error
        jobs.append({"id": cid, "paths": os.pathsep.join(str(theirs_dir / f"{n}.csv") for n in listed)})
    job = {"src": src, "bin": str(aiter_src.fake_rocm_bin("gfx942", 304)), "cases": jobs}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITER_", "CU_NUM"))}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([python, str(HERE / "merge_side.py")], input=json.dumps(job), capture_output=True, text=True,
                       env=env, timeout=900, cwd=str(aiter_src.BUILD))
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = {a["id"]: a for a in json.loads(r.stdout)["answers"]}
    return ours, theirs


@pytest.mark.parametrize("cid", range(len(CASES)), ids=[c[0] for c in CASES])
def test_moedispatch_says_aiter_raises_exactly_when_it_does(answers, cid):
    ours, theirs = answers
    raised = theirs[cid]["raised"]
    said = ours[cid] or ""
    assert said.startswith("AITER raises") is (raised is not None), (CASES[cid][0], theirs[cid], said)
    if theirs[cid]["rows"] is not None and said:     # AITER merged, dropping repeated keys silently: said so
        assert "rows dropped" in said, (CASES[cid][0], theirs[cid], said)
    if raised:
        assert raised in said or "duplicate shape entries" in said, (theirs[cid], said)
