"""AITER's fused-MoE tuned CSVs, read and merged the way AITER does it — without importing aiter, torch or pandas.

Who calls what
--------------
* :func:`load_config_set` — the merged tuned table AITER would use: the installed AITER's own files when present
  (they win), else the rows of the AITER release planned for from moedispatch's own index
  (:mod:`moedispatch.data.aiter_index`, built from AITER's release files by ``scripts/build_aiter_index.py``); ``AITER_CONFIG_FMOE`` (in ``env``) *replaces* the whole set, as in AITER.
* :func:`tuned_rows` — the rows for one shape, for the cost model::

      from moedispatch.data.aiter_configs import tuned_rows
      rows = tuned_rows(model_dim=7168, inter_dim=256, expert=256, topk=8, gfx="gfx950", cu_num=256,
                        q_type="QuantType.per_1x128")              # source=None: installed AITER, else bundled
      for r in rows:
          r.where, r.token, r.us, r.us1, r.us2, r.kernel1, r.kernel2   # "…/tuned_fmoe.csv:417", 16, 27.1, …

  Every filter is optional (``None`` = any value); strings are compared as AITER's CSVs spell them
  (``QuantType.per_1x128``, ``torch.float8_e4m3fn``, ``ActivationType.Silu``). Rows tagged ``flydsl_fallback`` are
  left out unless ``include_tagged=True``.
* :func:`native_inter_dims` lives in :mod:`moedispatch.aiter.dispatch` (it needs the dispatch model).

Loading is lazy (nothing happens at import) and cached per (files, mtimes, env). A malformed or partial CSV never
raises: the problem is recorded in :attr:`ConfigSet.warnings` as ``file:line: what`` and :attr:`ConfigSet.broken`
is set, so dispatch falls back to heuristics and says so.

AITER sources modelled here (cited where used): ``aiter/jit/core.py`` ``AITER_CONFIG.get_config_file`` /
``update_config_files`` and ``aiter/fused_moe.py`` ``get_2stage_cfgs`` at
https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879/ (HEAD snapshot); the same functions
in the PyPI wheel amd-aiter 0.1.7.post2.dev18 (``aiter/jit/core.py``, ``aiter/fused_moe.py``) for the legacy model.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from moedispatch._util.caches import memoize
from moedispatch.data.aiter_install import installed_aiter
from moedispatch.core.aiter_release import release_of
from moedispatch.core.errors import UsageError
from moedispatch.data import aiter_index
from moedispatch.data.tuned_row import TunedRow

__all__ = [
    "TunedRow",
    "ConfigSet",
    "KEY_COLUMNS",
    "load_config_set",
    "config_set_for",
    "tuned_rows",
    "releases",
    "default_files",
    "installed_config_warnings",
    "gfx_from_cu_num",
    "parse_csv",
    "AITER_CONFIGS_ENV",
]

#: The lookup key of ``get_2stage_cfgs`` at AITER HEAD, in order (``_INDEX_COLS``); legacy AITER (≤ 0.1.7) has no
#: ``gfx``.
KEY_COLUMNS = ("gfx", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype",
               "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")
_INT_KEYS = ("cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "use_g1u1", "doweight_stage1")
_REQUIRED = tuple(c for c in KEY_COLUMNS if c != "gfx") + ("block_m", "kernelName1")
#: Columns AITER's merge fills when a file lacks them (``update_config_files`` ``_FILL_DEFAULTS``; others get 0).
_FILL_DEFAULTS = {"xbf16": 0, "run_1stage": 0, "ksplit": 0}
#: ``aiter/jit/utils/chip_info.py`` ``_LEGACY_CU_NUM_TO_GFX`` (HEAD): legacy rows without ``gfx`` are backfilled.
_LEGACY_CU_NUM_TO_GFX = {256: "gfx950", 80: "gfx942", 304: "gfx942"}
#: ``update_config_files`` de-duplicates on untuned_fmoe.csv's columns (+ cu_num, gfx, _tag at HEAD).
_UNTUNED_COLUMNS = ("token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a",
                    "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")
#: The string key columns of a row, in :class:`TunedRow` order (each must be non-empty).
_STR_KEYS = ("act_type", "dtype", "q_dtype_a", "q_dtype_w", "q_type")
#: Informational columns read leniently (a shifted row still loads in AITER), with the type each should hold.
_INFO_COLUMNS = (("xbf16", int), ("flat", int), ("tflops", float), ("bw", float))

_HEAD_SRC = "https://github.com/ROCm/aiter/blob/e4048607a535ace3a2b51ded31b1c8c2d45c0879"
SOURCE_MERGE = f"{_HEAD_SRC}/aiter/jit/core.py"
SOURCE_LOOKUP = f"{_HEAD_SRC}/aiter/fused_moe.py"
SOURCE_BACKFILL = f"{_HEAD_SRC}/aiter/jit/utils/chip_info.py"
#: From v0.1.12 AITER's merge (``update_config_files``) skips every missing listed file (FileNotFoundError only when
#: none exists) and RAISES on a key repeated across the merged rows, after rewriting the sources; up to v0.1.11.post1
#: it read the first listed path unconditionally and kept the fastest of repeated keys silently
#: (ROCm/aiter@v0.1.11.post1 and @v0.1.12:aiter/jit/core.py update_config_files).
MERGE_RAISES_FROM = "0.1.12"
SOURCE_MERGE_OLD = "ROCm/aiter@v0.1.11.post1:aiter/jit/core.py"


def gfx_from_cu_num(cu_num: int) -> str | None:
    """AITER HEAD ``gfx_from_cu_num``: 256→gfx950, 80/304→gfx942; other values use the live GPU (None here)."""
    return _LEGACY_CU_NUM_TO_GFX.get(cu_num)


@dataclass(frozen=True)
class ConfigSet:
    """A merged tuned table as one AITER would use it.

    ``origin`` is ``installed`` (the AITER importable in this Python), ``bundled`` (moedispatch's per-release index;
    ``release`` names the release whose rows it holds),
    ``env`` (``AITER_CONFIG_FMOE`` replaced the set) or ``explicit`` (a directory or files passed in).
    ``dispatch`` names the dispatch model that reads it (``head`` or ``legacy``). ``rows`` holds every parsed row
    in AITER's merge order (file order, then line order), tagged fallback rows included. ``broken`` is True when a
    file could not be read cleanly; ``warnings`` says which file and line. ``merge_error`` is what AITER itself
    would raise while merging (duplicate rows), if anything.
    """

    label: str
    origin: str
    dispatch: str
    version: str | None
    files: tuple[str, ...]
    rows: tuple[TunedRow, ...]
    warnings: tuple[str, ...] = ()
    broken: bool = False
    merge_error: str | None = None
    commit: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)
    release: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "origin": self.origin, "dispatch": self.dispatch, "version": self.version,
                "commit": self.commit, "files": list(self.files), "rows": len(self.rows),
                "warnings": list(self.warnings), "broken": self.broken, "merge_error": self.merge_error,
                "notes": list(self.notes), "release": self.release}


# -- CSV parsing -------------------------------------------------------------------------------------------------

def _num(text: str, kind: type) -> Any:
    text = text.strip()
    if text == "" or text.lower() == "nan":
        return None
    value = float(text)
    if kind is int:
        if value != int(value):
            raise ValueError(f"{text!r} is not an integer")
        return int(value)
    return value


def _int(text: str, name: str | None) -> int | None:
    """A key integer as pandas reads it (``"32"``, ``"32.0"``); empty → ValueError naming the column (or None)."""
    try:
        return int(text)
    except ValueError:
        pass
    if text == "" or text.lower() == "nan":
        if name is None:
            return None
        raise ValueError(f"empty {name}")
    value = float(text)
    if value != int(value):
        raise ValueError(f"{text!r} is not an integer")
    return int(value)


def _flt(text: str) -> float | None:
    if text == "" or text.lower() == "nan":
        return None
    return float(text)


def parse_csv(path: str, display: str, *, dispatch: str = "head",
              model_dims: frozenset[int] | None = None) -> tuple[list[TunedRow], list[str]]:
    """Parse one tuned fmoe CSV. Returns (rows, problems); each problem is ``display:line: what``.

    A header without the key columns makes the whole file unusable (one problem at line 1). A row with the wrong
    field count or a non-numeric key is skipped with a problem naming its line. ``model_dims``: parse only data
    lines that mention one of these model_dim values as a field (a fast pre-filter for a planner that needs one
    shape; line numbers are kept; the full lint passes None).
    """
    try:
        # utf-8-sig: a byte-order mark is not part of the first column's name (pandas drops it too)
        fh = open(path, newline="", encoding="utf-8-sig", errors="replace")
    except OSError as exc:
        return [], [f"{display}: cannot read: {exc.strerror or exc}"]
    with fh:
        reader = csv.reader(_prefiltered(fh, model_dims) if model_dims else fh)
        header, problems = _read_header(reader, display)
        if header is None:
            return [], problems
        return _read_rows(reader, header, display, dispatch)


def _prefiltered(lines: Any, model_dims: frozenset[int]) -> Any:
    """The lines, with each data line that names none of ``model_dims`` as a field blanked (line numbers kept)."""
    needles = tuple(f",{d}," for d in sorted(model_dims))
    for n, text in enumerate(lines):
        # the header and lines naming a wanted model_dim pass; others become blank (line numbers kept)
        yield text if n == 0 or any(x in text for x in needles) else "\n"


def _read_header(reader: Any, display: str) -> tuple[list[str] | None, list[str]]:
    """The stripped header and no problem, or None and the one problem that makes the file unusable."""
    try:
        header = next(reader)
    except StopIteration:
        return None, [f"{display}:1: empty file (no header)"]
    except csv.Error as exc:
        return None, [f"{display}:1: not CSV: {exc}"]
    header = [h.strip() for h in header]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        return None, [f"{display}:1: header lacks column(s) {', '.join(missing)}"]
    return header, []


def _read_rows(reader: Any, header: list[str], display: str, dispatch: str) -> tuple[list[TunedRow], list[str]]:
    """Parse the data lines after the header: (rows, problems); a line that is not CSV ends the file."""
    col = {name: i for i, name in enumerate(header)}
    rows: list[TunedRow] = []
    problems: list[str] = []
    while True:
        try:
            values = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.append(f"{display}:{reader.line_num}: not CSV: {exc}")
            break
        parsed = _parse_line(values, len(header), col, display, reader.line_num, dispatch)
        if isinstance(parsed, str):
            problems.append(parsed)
        elif parsed is not None:
            rows.append(parsed)
    return rows, problems


def _parse_line(values: list[str], width: int, col: dict[str, int], display: str, line: int,
                dispatch: str) -> TunedRow | str | None:
    """One data line: its row, or the problem (``display:line: what``) that skips it; None for a blank line."""
    if not values or all(not v.strip() for v in values):
        return None
    if len(values) > width:
        # pandas.read_csv (what AITER uses) fails on a row with more fields than the header
        # ("Error tokenizing data ... Expected N fields in line L, saw M"); fewer fields are NaN-filled.
        return f"{display}:{line}: {len(values)} fields, the header has {width}"
    short = len(values) if len(values) < width else 0
    if short:
        values = values + [""] * (width - len(values))
    values = [v.strip() for v in values]
    try:
        num = _row_numbers(values, col)
    except ValueError as exc:
        return f"{display}:{line}: bad number ({exc})"
    lenient, defects = _informational(values, col)
    if short:
        defects.append(f"{short} field(s) for {width} columns (pandas fills the rest with NaN)")
    strs = [values[col[n]] for n in _STR_KEYS]
    if not all(strs):
        return f"{display}:{line}: empty {_STR_KEYS[[bool(x) for x in strs].index(False)]}"
    gfx, backfilled = _row_gfx(_field(values, col, "gfx"), num["cu_num"], dispatch)
    return TunedRow(
        display, line, gfx, num["cu_num"], num["token"], num["model_dim"], num["inter_dim"],
        num["expert"], num["topk"], strs[0], strs[1], strs[2], strs[3], strs[4], num["use_g1u1"],
        num["doweight_stage1"], num["block_m"], num["ksplit"], num["us1"], values[col["kernelName1"]],
        _field(values, col, "err1"), num["us2"], _field(values, col, "kernelName2"), _field(values, col, "err2"),
        num["us"], num["run_1stage"], lenient["xbf16"] or 0, lenient["flat"] or 0, lenient["tflops"], lenient["bw"],
        _field(values, col, "_tag"), backfilled, tuple(defects),
    )


def _field(values: list[str], col: dict[str, int], name: str) -> str:
    """The row's value in column ``name``; "" when the file has no such column."""
    i = col.get(name, -1)
    return values[i] if i >= 0 else ""


def _row_numbers(values: list[str], col: dict[str, int]) -> dict[str, Any]:
    """The row's key integers, block_m, ksplit, run_1stage and timings; ValueError names a bad one."""
    num: dict[str, Any] = {n: _int(values[col[n]], n) for n in _INT_KEYS}
    num["block_m"] = _int(values[col["block_m"]], "block_m")
    num["ksplit"] = _int(values[col["ksplit"]], None) or 0 if "ksplit" in col else 0
    num["run_1stage"] = _int(values[col["run_1stage"]], None) or 0 if "run_1stage" in col else 0
    for name in ("us1", "us2", "us"):
        num[name] = _flt(values[col[name]]) if name in col else None
    return num


def _informational(values: list[str], col: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    """The row's xbf16, flat, tflops and bw, read leniently, and the defects found in them."""
    # Informational columns: AITER only int()s xbf16/flat on 1-stage rows, so a row whose trailing columns
    # are shifted (a column missing, e.g. flat) still loads there; keep it and record the defect for lint.
    defects: list[str] = []
    lenient: dict[str, Any] = {}
    for name, kind in _INFO_COLUMNS:
        raw = values[col[name]] if name in col else ("0" if kind is int else "")
        if kind is int and raw in ("0", "1", ""):
            lenient[name] = int(raw or 0)
            continue
        try:
            lenient[name] = _num(raw, kind)
        except ValueError:
            try:
                lenient[name] = int(float(raw)) if kind is int else None
            except ValueError:
                lenient[name] = None
            defects.append(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'} "
                           f"(columns shifted?)")
    return lenient, defects


def _row_gfx(gfx: str, cu_num: int, dispatch: str) -> tuple[str | None, bool]:
    """The row's gfx, backfilled from cu_num when empty (HEAD dispatch only), and whether it was backfilled."""
    backfilled = False
    if gfx in ("", "0", "nan", "None"):
        gfx = gfx_from_cu_num(cu_num) if dispatch == "head" else None
        backfilled = dispatch == "head"
    return gfx or None, backfilled


# -- where the files are -------------------------------------------------------------------------------------------

def releases() -> tuple[aiter_index.Release, ...]:
    """The AITER releases whose tuned sets moedispatch carries (its own index, ``capability_db/aiter_index.json``)."""
    return aiter_index.releases()


def _dispatch_model_for(version: str | None) -> str:
    """``legacy`` for AITER < 0.1.8 (the 0.1.7 wheel's lookup: no gfx, no act wildcard, buckets capped at 1024),
    ``head`` otherwise."""
    if version is None:
        return "head"
    from packaging.version import Version

    release = release_of(version)
    return "legacy" if release is not None and release < Version("0.1.8") else "head"


def default_files(configs_dir: str) -> list[str]:
    """AITER's default set: ``tuned_fmoe.csv`` then ``model_configs/*tuned_fmoe*.csv`` without "untuned".

    AITER lists model_configs with ``Path.glob`` (directory order, filesystem dependent); sorted here, which only
    matters for the act-type wildcard's "first row wins" (reported as a note where it does).
    """
    files = [os.path.join(configs_dir, "tuned_fmoe.csv")]
    mc = os.path.join(configs_dir, "model_configs")
    if os.path.isdir(mc):
        files += [os.path.join(mc, n) for n in sorted(os.listdir(mc))
                  if "tuned_fmoe" in n and "untuned" not in n and n.endswith(".csv")]
    return files


def split_env_paths(value: str) -> list[str]:
    """The files of an ``AITER_CONFIG_FMOE`` value (os.pathsep-separated, as AITER splits it)."""
    return [p for p in value.split(os.pathsep) if p.strip()]


def _display(path: str, root: str | None, prefix: str) -> str:
    if root and os.path.abspath(path).startswith(os.path.abspath(root) + os.sep):
        return prefix + os.path.relpath(path, root).replace(os.sep, "/")
    return path


# -- merge ---------------------------------------------------------------------------------------------------------

def merge_raises(version: str | None) -> bool:
    """Whether AITER ``version``'s merge raises on repeated keys (:data:`MERGE_RAISES_FROM`; an unknown version:
    HEAD's merge, which does)."""
    from packaging.version import Version

    release = release_of(version) if version is not None else None
    return release is None or release >= Version(MERGE_RAISES_FROM)


def _merge(files: list[tuple[str, str]], dispatch: str, model_dims: frozenset[int] | None = None,
           override: bool = False, version: str | None = None) -> tuple[list[TunedRow], list[str], bool, str | None]:
    """Parse and concatenate like ``update_config_files``; returns (rows, warnings, broken, merge_error)."""
    rows: list[TunedRow] = []
    warnings: list[str] = []
    broken = False
    present = [(p, d) for p, d in files if os.path.isfile(p)]
    raises = merge_raises(version)
    if override and len(files) > 1 and not raises and not os.path.isfile(files[0][0]):
        return [], [f"{files[0][1]}: not found"], True, (
            f"AITER raises FileNotFoundError at its first fused-MoE call: AITER {version} reads the first file "
            f"AITER_CONFIG_FMOE lists unconditionally and {files[0][1]} does not exist; modelled as if no tuned row "
            f"existed ({SOURCE_MERGE_OLD})")
    if override and not present:
        # update_config_files returns a single path as is (pd.read_csv then raises) and raises itself when none of
        # several exists: AITER's first fused_moe call fails (ROCm/aiter@e4048607:aiter/jit/core.py lines 266-287).
        missing = ", ".join(d for _p, d in files)
        return [], [f"{missing}: not found"], True, (
            f"AITER raises FileNotFoundError at its first fused-MoE call: AITER_CONFIG_FMOE names no existing file "
            f"({missing}); modelled as if no tuned row existed ({SOURCE_MERGE})")
    for path, display in files:
        if not os.path.isfile(path):
            # AITER: one of several listed files that does not exist is skipped with an INFO line.
            warnings.append(f"{display}: listed in the tuned set but not found (AITER skips it)")
    if not present:
        return [], warnings + ["no tuned fmoe CSV found: dispatch uses heuristics only"], True, None
    for path, display in present:
        parsed, problems = parse_csv(path, display, dispatch=dispatch, model_dims=model_dims)
        rows.extend(parsed)
        if problems:
            broken = True
            warnings.extend(problems[:5])
            if len(problems) > 5:
                warnings.append(f"{display}: {len(problems) - 5} more malformed line(s)")
    # update_config_files merges (and de-duplicates, within one file too) whenever more than one path is listed,
    # missing ones included; a single path is returned as is (ROCm/aiter@e4048607:aiter/jit/core.py 267-269).
    rows, merge_error = _dedup(rows, dispatch, raises) if len(files) > 1 else (rows, None)
    return rows, warnings, broken, merge_error


def _dedup(rows: list[TunedRow], dispatch: str, raises: bool = True) -> tuple[list[TunedRow], str | None]:
    """AITER's merge de-duplication over the concatenated files; returns (rows kept, what AITER says or None)."""
    merge_error = None
    # Duplicate keys across the merged files: from v0.1.12 AITER keys on untuned columns + cu_num (+ gfx) + _tag
    # and RAISES after rewriting the sources ("Please re-run"); v0.1.8–v0.1.11 key on the untuned columns + cu_num
    # and silently keep the fastest row; 0.1.7 (legacy) on the untuned columns only (no cu_num!). Either way the
    # fastest (lowest us, stable) survives.
    def dedup_key(r: TunedRow) -> tuple:
        base = (r.token, r.model_dim, r.inter_dim, r.expert, r.topk, r.act_type, r.dtype, r.q_dtype_a,
                r.q_dtype_w, r.q_type, r.use_g1u1, r.doweight_stage1)
        if dispatch != "head":
            return base
        return base + ((r.cu_num, r.gfx, r.tag) if raises else (r.cu_num,))

    order = sorted(range(len(rows)), key=lambda i: (rows[i].us is None, rows[i].us or 0.0))
    best: dict[tuple, int] = {}
    for i in order:
        best.setdefault(dedup_key(rows[i]), i)
    keep = set(best.values())
    if len(keep) < len(rows):
        dropped = [rows[i] for i in range(len(rows)) if i not in keep]
        sample = ", ".join(r.where for r in dropped[:3])
        if dispatch == "head" and raises:
            merge_error = (f"AITER raises 'Found {len(rows) - len(keep)} duplicate shape entries during merge "
                           f"of tuned_fmoe … Please re-run' and rewrites the source CSVs keeping the lowest us "
                           f"(first duplicates: {sample}); modelled after that rewrite ({SOURCE_MERGE})")
        elif dispatch == "head":
            merge_error = (f"{len(rows) - len(keep)} rows dropped by AITER's merge de-duplication, which keeps the "
                           f"lowest us of a key repeated across the merged files silently (before v0.1.12; "
                           f"{SOURCE_MERGE_OLD}; first dropped: {sample})")
        else:
            merge_error = (f"{len(rows) - len(keep)} rows dropped by AITER's merge de-duplication, which keys "
                           f"on the untuned columns without cu_num (rows of other GPUs can shadow each other; "
                           f"first dropped: {sample})")
        rows = [rows[i] for i in range(len(rows)) if i in keep]
    return rows, merge_error


@memoize(maxsize=32)
def _load_cached(files: tuple[tuple[str, str], ...], stamps: tuple, dispatch: str, label: str, origin: str,
                 version: str | None, commit: str | None, notes: tuple[str, ...],
                 model_dims: frozenset[int] | None = None) -> ConfigSet:
    del stamps  # part of the cache key only
    rows, warnings, broken, merge_error = _merge(list(files), dispatch, model_dims, override=origin == "env",
                                                 version=version)
    return ConfigSet(label=label, origin=origin, dispatch=dispatch, version=version,
                     files=tuple(d for _, d in files), rows=tuple(rows), warnings=tuple(warnings), broken=broken,
                     merge_error=merge_error, commit=commit, notes=notes)


def _stamps(files: list[tuple[str, str]]) -> tuple:
    out = []
    for path, _ in files:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _build(files: list[tuple[str, str]], dispatch: str, label: str, origin: str, version: str | None,
           commit: str | None = None, notes: tuple[str, ...] = (),
           model_dims: frozenset[int] | None = None) -> ConfigSet:
    return _load_cached(tuple(files), _stamps(files), dispatch, label, origin, version, commit, notes, model_dims)


def _backfilled(row: TunedRow) -> TunedRow:
    """HEAD's merge fills a missing ``gfx`` from ``cu_num`` (``gfx_from_cu_num``); the index stores it raw."""
    if row.gfx is not None:
        return row
    return row._replace(gfx=gfx_from_cu_num(row.cu_num), gfx_backfilled=True)


@memoize(maxsize=32)
def _bundled(tag: str, version: str | None, notes: tuple[str, ...] = (),
             model_dims: frozenset[int] | None = None) -> ConfigSet:
    """Release ``tag``'s default tuned set from moedispatch's index, merged as that AITER merges it."""
    rel = aiter_index.release(tag)
    dispatch = "head"  # every release of the index is >= 0.1.10 (the gfx-keyed lookup)
    rows = [_backfilled(r) for r in aiter_index.rows_for(rel.tag, model_dims)]
    rows, merge_error = _dedup(rows, dispatch, merge_raises(str(rel.version) if rel.version is not None else None))
    prefix = aiter_index.display_prefix(rel.tag)
    warnings = aiter_index.problems_for(rel.tag)
    return ConfigSet(label=f"bundled index: {rel.describe()}, ROCm/aiter@{rel.commit[:10]}", origin="bundled",
                     dispatch=dispatch, version=version,
                     files=tuple(prefix + f for f in aiter_index.files_for(rel.tag)), rows=tuple(rows),
                     warnings=warnings, broken=bool(warnings), merge_error=merge_error, commit=rel.commit,
                     notes=notes, release=rel.tag)


# -- public loaders -------------------------------------------------------------------------------------------------

def load_config_set(source: str | None = None, *, env: Mapping[str, str] | None = None,
                    version: str | None = None, model_dims: frozenset[int] | None = None) -> ConfigSet:
    """The merged tuned fmoe table.

    ``source``: ``None`` (the installed AITER's files when one is installed, else the index's release for
    ``version``), ``"installed"`` (must be installed), ``"bundled"`` (the index's release for ``version``), a release
    of the index (``"head"``, ``"v0.1.18"``), or a directory (an ``aiter`` package, its ``configs/`` folder, or a folder of
    CSVs laid out like it). ``env``: AITER environment (``AITER_CONFIG_FMOE`` replaces the set with its
    ``os.pathsep``-separated files; None = no override — the caller decides whether ``os.environ`` applies).
    ``version``: the AITER version planned for (picks the release and the dispatch model).

    Raises :class:`~moedispatch.core.errors.UsageError` only for a ``source`` that names nothing (bad input); file
    problems are warnings on the returned set.
    """
    env = dict(env or {})
    override = (env.get("AITER_CONFIG_FMOE") or "").strip()
    if override:
        paths = split_env_paths(override)
        files = [(p, p) for p in paths]
        if version is None and source in (None, "installed"):
            version = installed_aiter()[0]  # the AITER that reads the override decides the lookup model
        dispatch = _dispatch_model_for(version)
        note = ("AITER_CONFIG_FMOE replaces AITER's whole tuned set (the default tuned_fmoe.csv and every "
                "model_configs/*tuned_fmoe*.csv are NOT merged) — https://github.com/sgl-project/sglang/pull/37072",)
        return _build(files, dispatch, f"AITER_CONFIG_FMOE={override}", "env", version, None, note, model_dims)
    if source is None or source == "installed":
        inst_version, pkg = installed_aiter()
        if pkg is not None and (version is None or source == "installed" or _same_version(inst_version, version)):
            configs = os.path.join(pkg, "configs")
            root = os.path.dirname(pkg)
            files = [(p, _display(p, root, "")) for p in default_files(configs)]
            return _build(files, _dispatch_model_for(inst_version), f"installed amd-aiter {inst_version} ({pkg})",
                          "installed", inst_version, model_dims=model_dims)
        if source == "installed":
            raise UsageError("--aiter-version installed: no AITER (amd-aiter) is installed in this Python")
        tag, notes = aiter_index.release_for(version)
        return _bundled(tag, version, notes, model_dims)
    if source == "bundled":
        tag, notes = aiter_index.release_for(version)
        return _bundled(tag, version, notes, model_dims)
    if _is_release(source):
        return _bundled(aiter_index.release(source).tag, version, model_dims=model_dims)
    if os.path.isdir(source):
        configs = source
        for sub in (("configs",), ("aiter", "configs")):  # an aiter package, or a ROCm/aiter checkout
            if os.path.isfile(os.path.join(source, *sub, "tuned_fmoe.csv")):
                configs = os.path.join(source, *sub)
        if not os.path.isfile(os.path.join(configs, "tuned_fmoe.csv")):
            raise UsageError(f"{source}: no tuned_fmoe.csv here, under configs/ or under aiter/configs/")
        files = [(p, p) for p in default_files(configs)]
        return _build(files, _dispatch_model_for(version), f"tuned CSVs in {source}", "explicit", version,
                      model_dims=model_dims)
    tags = [r.tag for r in aiter_index.releases()]
    raise UsageError(f"unknown tuned-config source {source!r}: use installed, bundled, a release of the index "
                     f"({tags[0]} … {tags[-2]}, {tags[-1]}) or a directory")


def _is_release(name: str) -> bool:
    try:
        aiter_index.release(name)
    except KeyError:
        return False
    return True


def _same_version(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b) or Version(Version(a).public) == Version(Version(b).public)
    except InvalidVersion:
        return a == b


#: A folder of AITER tuned CSVs (a ROCm/aiter checkout, an aiter package or its configs/) every plan reads instead of
#: the installed or bundled rows (``--aiter-configs DIR`` sets it for one CLI run).
AITER_CONFIGS_ENV = "MOEDISPATCH_AITER_CONFIGS"


def config_set_for(caps: Any, env: Mapping[str, str] | None = None,
                   model_dims: frozenset[int] | None = None) -> ConfigSet:
    """The tuned set for a target: the folder named by ``MOEDISPATCH_AITER_CONFIGS`` when set; else the installed
    AITER when ``caps.aiter_version`` is the installed one (or the version came from the probe); else the index's
    release for that version. ``model_dims``: only rows of these model_dim values (a planner's fast path; see
    :func:`parse_csv`). ``AITER_CONFIG_FMOE`` in ``env`` still replaces the whole set, as in AITER."""
    version = getattr(caps, "aiter_version", None)
    explicit = (os.environ.get(AITER_CONFIGS_ENV) or "").strip()
    if explicit:
        if not os.path.isdir(explicit):
            raise UsageError(f"{AITER_CONFIGS_ENV}={explicit!r} is not a directory")
        return load_config_set(explicit, env=env, version=version, model_dims=model_dims)
    prov = ""
    source_of = getattr(caps, "source_of", None)
    if callable(source_of):
        prov = source_of("aiter_version") or ""
    if prov.startswith(("probe", "files")) or prov == "installed":
        inst_version, pkg = installed_aiter()
        if pkg is not None:
            return load_config_set("installed", env=env, version=inst_version, model_dims=model_dims)
    return load_config_set(None, env=env, version=version, model_dims=model_dims)


def installed_config_warnings() -> tuple[str, ...]:
    """For the probe: ``file:line: problem`` for every malformed line in the installed AITER's tuned fmoe CSVs
    (empty when AITER is not installed or its CSVs are clean). Never raises."""
    try:
        _version, pkg = installed_aiter()
        if pkg is None:
            return ()
        cs = load_config_set("installed")
    except Exception:  # noqa: BLE001 - the probe must not crash on a broken install
        return ()
    return cs.warnings + ((cs.merge_error,) if cs.merge_error else ())


def tuned_rows(*, model_dim: int | None = None, inter_dim: int | None = None, expert: int | None = None,
               topk: int | None = None, gfx: str | None = None, cu_num: int | None = None, token: int | None = None,
               act_type: str | None = None, dtype: str | None = None, q_dtype_a: str | None = None,
               q_dtype_w: str | None = None, q_type: str | None = None, use_g1u1: int | None = None,
               doweight_stage1: int | None = None, include_tagged: bool = False,
               config_set: ConfigSet | None = None, source: str | None = None,
               env: Mapping[str, str] | None = None, version: str | None = None) -> tuple[TunedRow, ...]:
    """Rows of the tuned set matching every filter given (None = any), in AITER's merge order.

    ``config_set`` wins over ``source``/``env``/``version`` (see :func:`load_config_set`). Rows whose ``gfx`` is
    unknown (legacy CSVs) match any ``gfx`` filter only through their ``cu_num``.
    """
    cs = config_set or load_config_set(source, env=env, version=version)
    want = {"model_dim": model_dim, "inter_dim": inter_dim, "expert": expert, "topk": topk, "cu_num": cu_num,
            "token": token, "act_type": act_type, "dtype": dtype, "q_dtype_a": q_dtype_a, "q_dtype_w": q_dtype_w,
            "q_type": q_type, "use_g1u1": use_g1u1, "doweight_stage1": doweight_stage1}
    want = {k: v for k, v in want.items() if v is not None}
    out = []
    for row in cs.rows:
        if row.tag and not include_tagged:
            continue
        if gfx is not None and row.gfx is not None and row.gfx != gfx:
            continue
        if all(getattr(row, k) == v for k, v in want.items()):
            out.append(row)
    return tuple(out)

