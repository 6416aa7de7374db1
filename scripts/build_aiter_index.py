#!/usr/bin/env python3
"""Build ``capability_db/aiter_index.json`` — moedispatch's own compact index of AITER's fused-MoE data, per release.

Input: ``../shared/aiter/`` (or ``--aiter-data DIR``): one folder per ROCm/aiter release tag (and ``head``, main at a
commit), each holding that tag's ``aiter/configs/**.csv`` and ``hsa/gfx9*/fmoe*/**.csv`` byte for byte, and a
``manifest.toml`` (tag → commit, date). The project never ships those files; it ships what this script derives:

* every tuned fused-MoE row of AITER's *default* tuned set (``tuned_fmoe.csv`` + ``model_configs/*tuned_fmoe*.csv``
  without "untuned" — ``aiter/jit/core.py`` ``AITER_CONFIG.get_config_file``) as moedispatch's parser reads it
  (:func:`moedispatch.data.aiter_configs.parse_csv`), stored once however many releases carry it, with its
  provenance: the file, and per run of consecutive releases the line it sits on;
* the files of that set per release (an empty file still counts: it is part of AITER's merge) and any problem the
  parser reported, with the releases it applies to;
* the ASM MoE kernel catalogs (``hsa/<gfx>/fmoe/**.csv`` 1-stage, ``hsa/<gfx>/fmoe_2stages/*.csv`` stage 1): kernel
  name and the numeric columns AITER's launchers select on, with file, line and releases.

Usage::

    python scripts/build_aiter_index.py            # writes capability_db/aiter_index.json
    python scripts/build_aiter_index.py --check    # exit 1 when the committed index differs from a rebuild
    python scripts/build_aiter_index.py --fhmoe <aiter checkout or git dir>   # capability_db/aiter_fhmoe.toml

``aiter_fhmoe.toml`` (AITER's dedicated FHMoE table, main only, not in ../shared/aiter) is derived the same way
from ``aiter/configs/tuned_fhmoe.csv`` at the commit given with ``--fhmoe-commit`` (default: head's).

tests/test_aiter_index.py rebuilds it and asserts it is identical to the committed file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moedispatch.data.aiter_configs import TunedRow, default_files, parse_csv  # noqa: E402

SCHEMA = "moedispatch.aiter_index/1"
OUT = ROOT / "capability_db" / "aiter_index.json"
DEFAULT_DATA = ROOT.parent / "shared" / "aiter"
#: TunedRow fields stored per row (file and line are provenance, kept apart; gfx is stored raw: "" = not in the file).
COLUMNS = tuple(f for f in TunedRow._fields if f not in ("file", "line", "gfx_backfilled"))
#: Numeric columns of the ASM catalogs kept (AITER's asm_fmoe.cu / asm_moe_2stage.cu select on these).
ASM_COLUMNS = ("tile_m", "tile_n", "atm", "vskip", "smf", "tg_num_perCU", "ps", "subGU_m", "subGU_n", "flat")


def releases(data: Path) -> list[tuple[str, str, str]]:
    """(tag, commit, date) in the manifest's order (release date; ``head`` last)."""
    manifest = tomllib.loads((data / "manifest.toml").read_text(encoding="utf-8"))
    out = [(tag, str(r["commit"]), str(r["date"])) for tag, r in manifest["release"].items()]
    missing = [t for t, _, _ in out if not (data / t).is_dir()]
    if missing:
        raise SystemExit(f"{data}: manifest lists {', '.join(missing)} but the folder is missing")
    return out


def _runs(items: list[tuple[int, object]]) -> list[list]:
    """[(release index, value)] sorted → [[first, last, value], …] for runs of consecutive releases, same value."""
    out: list[list] = []
    for idx, value in items:
        if out and out[-1][1] == idx - 1 and out[-1][2] == value:
            out[-1][1] = idx
        else:
            out.append([idx, idx, value])
    return out


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = []
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self.ids:
            self.ids[text] = len(self.table)
            self.table.append(text)
        return self.ids[text]


def _encode(value: object, strings: _Strings) -> object:
    """Strings (and tuples of strings) go to the string table; numbers and None stay as JSON values."""
    if isinstance(value, str):
        return strings(value)
    if isinstance(value, tuple):
        return [strings(v) for v in value]
    return value


def _tuned(data: Path, tags: list[str], strings: _Strings) -> tuple[list, list, list]:
    files: dict[str, list[int]] = {}
    rows: dict[tuple, list[tuple[int, int]]] = {}
    problems: dict[tuple[str, str], list[int]] = {}
    for idx, tag in enumerate(tags):
        configs = data / tag / "aiter" / "configs"
        for path in default_files(str(configs)):
            if not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, data / tag).replace(os.sep, "/")
            files.setdefault(rel, []).append(idx)
            parsed, probs = parse_csv(path, rel, dispatch="legacy")  # gfx raw: the loader backfills per dispatch
            for row in parsed:
                values = tuple(getattr(row, c) if c != "gfx" else (row.gfx or "") for c in COLUMNS)
                rows.setdefault((rel,) + values, []).append((idx, row.line))
            for p in probs:
                problems.setdefault((rel, p.split(":", 1)[1] if ":" in p else p), []).append(idx)
    file_list = sorted(files)
    file_id = {f: i for i, f in enumerate(file_list)}
    out_files = [[f, [r[:2] for r in _runs([(i, None) for i in files[f]])]] for f in file_list]
    out_rows = []
    for key in sorted(rows, key=lambda k: (file_id[k[0]], min(rows[k]), k[1:].__repr__())):
        occ = _runs(sorted(rows[key]))
        out_rows.append([file_id[key[0]], occ] + [_encode(v, strings) for v in key[1:]])
    out_problems = [[file_id[f], [r[:2] for r in _runs([(i, None) for i in idxs])], what]
                    for (f, what), idxs in sorted(problems.items())]
    return out_files, out_rows, out_problems


def _asm(data: Path, tags: list[str], strings: _Strings) -> list:
    found: dict[tuple, list[tuple[int, int]]] = {}
    for idx, tag in enumerate(tags):
        hsa = data / tag / "hsa"
        for path in sorted(hsa.glob("gfx9*/fmoe*/**/*.csv")):
            rel = path.relative_to(data / tag).as_posix()
            with path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                for rec in reader:
                    name = (rec.get("knl_name") or "").strip()
                    if not name:
                        continue
                    nums = []
                    for c in ASM_COLUMNS:
                        raw = (rec.get(c) or "").strip()
                        nums.append(int(raw) if raw.lstrip("-").isdigit() else None)
                    found.setdefault((rel, name) + tuple(nums), []).append((idx, reader.line_num))
    out = []
    for key in sorted(found, key=repr):
        out.append([strings(key[0]), _runs(sorted(found[key])), strings(key[1])] + list(key[2:]))
    return out


def build(data: Path = DEFAULT_DATA) -> str:
    """The index as text (deterministic: the same input always gives the same bytes)."""
    rels = releases(data)
    tags = [t for t, _, _ in rels]
    strings = _Strings()
    files, rows, problems = _tuned(data, tags, strings)
    asm = _asm(data, tags, strings)
    head = {
        "schema": SCHEMA,
        "generated_by": "scripts/build_aiter_index.py from ../shared/aiter (ROCm/aiter release data, MIT); "
                        "do not edit by hand — rebuild",
        "source": "https://github.com/ROCm/aiter",
        "releases": [list(r) for r in rels],
        "columns": list(COLUMNS),
        "asm_columns": ["file", "releases", "knl_name", *ASM_COLUMNS],
        "files": files,
        "problems": problems,
    }
    # One row per line keeps the file diffable when a release is added.
    parts = ["{"]
    for key, value in head.items():
        parts.append(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))},")
    parts.append('"strings": [')
    parts.append(",\n".join(json.dumps(s) for s in strings.table))
    parts.append("],")
    parts.append('"rows": [')
    parts.append(",\n".join(json.dumps(r, separators=(",", ":")) for r in rows))
    parts.append("],")
    parts.append('"asm": [')
    parts.append(",\n".join(json.dumps(r, separators=(",", ":")) for r in asm))
    parts.append("]")
    parts.append("}")
    return "\n".join(parts) + "\n"


FHMOE_OUT = ROOT / "capability_db" / "aiter_fhmoe.toml"
FHMOE_PATH = "aiter/configs/tuned_fhmoe.csv"


def read_at(src: Path, commit: str, path: str) -> str:
    """``path`` at ``commit`` from a ROCm/aiter git directory or checkout (``git show``)."""
    import subprocess

    git = ["git", "--git-dir", str(src)] if (src / "HEAD").is_file() and not (src / ".git").exists() else \
        ["git", "-C", str(src)]
    proc = subprocess.run(git + ["show", f"{commit}:{path}"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{src}: cannot read {commit}:{path}: {proc.stderr.strip()}")
    return proc.stdout


def fhmoe_toml(text: str, commit: str) -> str:
    """The FHMoE table as moedispatch's TOML: the columns every row shares once, then per row what varies + line."""
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise SystemExit(f"{FHMOE_PATH} at {commit}: no rows")
    shared = {k: rows[0][k] for k in rows[0] if all(r[k] == rows[0][k] for r in rows)}
    out = [
        "# AITER's dedicated FHMoE table (aiter/fhmoe.py reads it through get_2stage_cfgs(config_file=...)): not part of",
        "# the fused-MoE merge and not in ../shared/aiter, so not in aiter_index.json. Derived by",
        "# scripts/build_aiter_index.py --fhmoe <ROCm/aiter checkout> from",
        f"# https://github.com/ROCm/aiter/blob/{commit}/{FHMOE_PATH}",
        "# (main only: no release tag up to v0.1.20.post1 has the file). Do not edit by hand. [key]: the columns every",
        "# row shares; [[row]]: what varies, with the line it is on.",
        "",
        f'commit = "{commit}"',
        f'path = "{FHMOE_PATH}"',
        'releases = ["head"]',
        "",
        "[key]",
    ]
    out += [f"{k} = {json.dumps(v)}" for k, v in shared.items()]
    for line, r in enumerate(rows, start=2):
        out += ["", "[[row]]", f"line = {line}"]
        out += [f"{k} = {v if v.isdigit() else json.dumps(v)}" for k, v in r.items() if k not in shared]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiter-data", type=Path, default=DEFAULT_DATA, help="folder of per-release AITER data "
                    "(default: ../shared/aiter beside the repository)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--fhmoe", type=Path, metavar="AITER_SRC",
                    help="write capability_db/aiter_fhmoe.toml from this ROCm/aiter checkout or git directory")
    ap.add_argument("--fhmoe-commit", help="the commit to read it at (default: head's in the manifest)")
    args = ap.parse_args(argv)
    if args.fhmoe:
        commit = args.fhmoe_commit or dict((t, c) for t, c, _ in releases(args.aiter_data))["head"]
        FHMOE_OUT.write_text(fhmoe_toml(read_at(args.fhmoe, commit, FHMOE_PATH), commit), encoding="utf-8")
        print(f"wrote {FHMOE_OUT}")
        return 0
    if not (args.aiter_data / "manifest.toml").is_file():
        print(f"error: {args.aiter_data}: no manifest.toml (pass --aiter-data)", file=sys.stderr)
        return 2
    text = build(args.aiter_data)
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'identical to a rebuild' if same else 'DIFFERS from a rebuild'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
