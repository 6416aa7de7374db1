#!/usr/bin/env python3
"""Build ``capability_db/cost_reverted.toml`` — tuned fused-MoE rows AITER reverted, per release that still ships them.

Inputs (nothing of them is shipped; this script derives):

* ``--aiter-repo DIR`` (or env ``AITER_REPO``): a git clone of ROCm/aiter (bare is fine) holding the head commit of
  ``../shared/aiter/manifest.toml`` and every release commit in it;
* ``--aiter-data DIR`` (default ``../shared/aiter``): one folder per release tag with that tag's
  ``aiter/configs/**.csv`` and ``manifest.toml``.

Method: every commit on AITER's first-parent main up to head whose subject starts with "Revert" and that touches a
``*tuned_fmoe*.csv`` under ``aiter/configs``; its removed rows are the rows of the file before it that are not in the
file after it (same lookup key without gfx, kernel names and ``us`` to 4 decimals: ``moedispatch.cost.reverted
.identity``). A release carries a reverted row when the row is in its folder and the revert commit is not an
ancestor of the release's commit (a release that contains the revert and still has the row re-added it on purpose).
The revert PR is the subject's last ``(#N)``; the reverted PR the first other ``#M`` it names.

Usage::

    AITER_REPO=/path/to/aiter.git python scripts/build_cost_reverted.py           # writes the file
    AITER_REPO=/path/to/aiter.git python scripts/build_cost_reverted.py --check   # exit 1 when it differs

tests/test_cost_reverted.py checks every flagged row against the release folders (no clone needed) and, when
``AITER_REPO`` is set, that a rebuild is identical.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moedispatch.cost import drift, reverted  # noqa: E402
from moedispatch.data import aiter_configs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _generated as generated  # noqa: E402

OUT = ROOT / "capability_db" / reverted.REVERTED_FILE
DEFAULT_DATA = ROOT.parent / "shared" / "aiter"
SCRIPT = "scripts/build_cost_reverted.py"
_TUNED = re.compile(r"^aiter/configs/(.+/)?[^/]*tuned_fmoe[^/]*\.csv$")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def _is_ancestor(repo: str, a: str, b: str) -> bool:
    return subprocess.run(["git", "--git-dir", repo, "merge-base", "--is-ancestor", a, b],
                          capture_output=True).returncode == 0


def _identities(repo: str, commit: str, path: str) -> set[tuple]:
    """Row identities of ``path`` at ``commit`` (empty when the file does not exist there)."""
    try:
        text = _git(repo, "show", f"{commit}:{path}")
    except subprocess.CalledProcessError:
        return set()
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "t.csv")
        with open(f, "w", encoding="utf-8") as fh:
            fh.write(text)
        rows, _problems = aiter_configs.parse_csv(f, path)
    return {reverted.identity(path, r) for r in rows if r.us}


def prs_of(subject: str) -> tuple[int | None, int | None]:
    """(revert PR, reverted PR) named in a commit subject."""
    tail = re.findall(r"\(#(\d+)\)\s*$", subject)
    pr = int(tail[0]) if tail else None
    others = [int(n) for n in re.findall(r"#(\d+)", subject) if int(n) != pr]
    return pr, (others[0] if others else None)


def reverts_of(repo: str, head: str) -> list[dict]:
    """Every first-parent revert commit up to ``head`` that removed tuned rows, oldest first."""
    log = _git(repo, "log", "--first-parent", "--reverse", "--format=%H%x09%ad%x09%s", "--date=short", head, "--",
               "aiter/configs")
    out = []
    for line in log.splitlines():
        commit, date, subject = line.split("\t", 2)
        if not re.match(r"\s*revert\b", subject, re.I):
            continue
        files = [p for p in _git(repo, "diff-tree", "-r", "--no-commit-id", "--name-only", f"{commit}^",
                                 commit).splitlines() if _TUNED.match(p)]
        removed: set[tuple] = set()
        for path in files:
            removed |= _identities(repo, f"{commit}^", path) - _identities(repo, commit, path)
        if removed:
            pr, target = prs_of(subject)
            out.append({"commit": commit, "date": date, "subject": subject, "pr": pr, "reverts": target,
                        "removed": removed})
    return out


def derive(data: Path, repo: str) -> dict:
    releases = drift.manifest(str(data))
    head = releases[-1][1]
    found = reverts_of(repo, head)
    carried: dict[tuple, dict] = {}
    counts: dict[str, int] = defaultdict(int)
    for tag, commit, _date in releases:
        root = os.path.join(str(data), tag)
        cs = aiter_configs.load_config_set(root)
        idents = {reverted.identity(os.path.relpath(r.file, root).replace(os.sep, "/"), r) for r in cs.rows if r.us}
        for rev in found:
            if _is_ancestor(repo, rev["commit"], commit):
                continue
            for ident in sorted(idents & rev["removed"]):
                entry = carried.setdefault(ident, {"revert": rev["pr"], "releases": []})
                entry["releases"].append(tag)
                counts[rev["commit"]] += 1
    revert_entries = []
    for rev in found:
        rows_in = sum(1 for ident, e in carried.items() if e["revert"] == rev["pr"] and ident in rev["removed"])
        entry = {"pr": rev["pr"], "reverts": rev["reverts"], "commit": rev["commit"], "date": rev["date"],
                 "subject": rev["subject"], "rows_removed": len(rev["removed"]), "rows_in_releases": rows_in,
                 "source": (f"https://github.com/ROCm/aiter/pull/{rev['pr']}" if rev["pr"] else
                            f"https://github.com/ROCm/aiter/commit/{rev['commit']}")}
        if entry["reverts"] is None:
            del entry["reverts"]
        if entry["pr"] is None:
            del entry["pr"]
        revert_entries.append(entry)
    rows = []
    for (path, key, k1, k2, us), e in sorted(carried.items()):
        rows.append({"revert": e["revert"], "file": path, "key": key, "kernel1": k1, "kernel2": k2, "us": us,
                     "releases": e["releases"]})
    return {
        "schema": reverted.SCHEMA,
        "provenance": {
            "data": "../shared/aiter", "repo": "https://github.com/ROCm/aiter", "script": SCRIPT,
            "head_commit": head, "releases": len(releases),
            "method": "every first-parent commit of ROCm/aiter main up to head_commit whose subject starts with "
                      "'Revert' and that removes rows of a *tuned_fmoe*.csv under aiter/configs (rows of the file "
                      "before it and not after it: same file, lookup key without gfx, kernel names and us to 4 "
                      "decimals); a [[row]] is one such row found in the release folders whose commit does not "
                      "contain the revert (git merge-base --is-ancestor), with those releases",
        },
        "revert": revert_entries,
        "row": rows,
    }


def to_toml(doc: dict) -> str:
    header = ["Tuned fused-MoE rows AITER reverted, and the releases that still ship them: left out of the cost",
              "model's fits and truths (moedispatch/cost/reverted.py).",
              f"GENERATED by `python {SCRIPT}` from ROCm/aiter's history and its release folders",
              "(../shared/aiter/<tag>/, see [provenance]); do not edit by hand, rebuild instead."]
    sections = [(f"[[{array}]]", entry) for array in ("revert", "row") for entry in doc[array]]
    return generated.document(header, doc["schema"], doc["provenance"], sections)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiter-data", default=str(DEFAULT_DATA), help="per-release AITER data (default ../shared/aiter)")
    ap.add_argument("--aiter-repo", default=os.environ.get("AITER_REPO"),
                    help="a git clone of ROCm/aiter (bare is fine; default: env AITER_REPO)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--check", action="store_true", help="compare with the file at --out instead of writing it")
    args = ap.parse_args(argv)
    if not args.aiter_repo:
        ap.error("needs --aiter-repo or AITER_REPO (a git clone of ROCm/aiter)")
    repo = args.aiter_repo
    if os.path.isdir(os.path.join(repo, ".git")):
        repo = os.path.join(repo, ".git")
    return generated.write_or_check(to_toml(derive(Path(args.aiter_data), repo)), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
