"""moedispatch's own index of AITER's fused-MoE data, per release (``capability_db/aiter_index.json``).

The index is derived — never copied — from AITER's release files by ``scripts/build_aiter_index.py`` (which
``tests/test_aiter_index.py`` re-runs against ``../shared/aiter`` and compares byte for byte). Each tuned row is
stored once with its file and, per run of consecutive releases, the line it sits on; each ASM MoE kernel likewise.

Who calls what::

    from moedispatch.data import aiter_index
    aiter_index.releases()                 # (Release('v0.1.10', commit, date), …, Release('head', …))
    aiter_index.release_for("0.1.17.post3")   # ('v0.1.17', ("AITER 0.1.17.post3 is not a release in the index …",))
    aiter_index.rows_for("v0.1.18")        # TunedRows of that release's default tuned set, in AITER's merge order
    aiter_index.asm_kernels("v0.1.18", gfx="gfx942")

Rows come back with ``gfx`` as the file spells it (None where the column is missing or empty); backfilling it
from ``cu_num`` is the dispatch model's business (:mod:`moedispatch.data.aiter_configs`). Nothing is read at import.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from packaging.version import Version

from moedispatch._util.caches import memoize
from moedispatch.core.aiter_release import release_of
from moedispatch.core.errors import CapabilityDBError
from moedispatch.data import capdb
from moedispatch.data.tuned_row import TunedRow

__all__ = ["Release", "AsmKernel", "SCHEMA", "releases", "release", "release_for", "rows_for", "files_for",
           "problems_for", "asm_kernels", "display_prefix", "INDEX_FILE"]

SCHEMA = "moedispatch.aiter_index/1"
INDEX_FILE = "aiter_index.json"
_REPO = "ROCm/aiter"
#: Where AITER's default tuned set starts (``aiter/jit/core.py`` ``AITER_CONFIG_FMOE`` default file).
_DEFAULT_FILE = "aiter/configs/tuned_fmoe.csv"


class Release(NamedTuple):
    """One release of the index: a ROCm/aiter tag (``v0.1.18``) or ``head`` (main at ``commit``)."""

    tag: str
    commit: str
    date: str

    @property
    def version(self) -> Version | None:
        """The tag as a version (None for ``head``)."""
        return Version(self.tag[1:]) if self.tag.startswith("v") else None

    @property
    def ref(self) -> str:
        """How a citation names it: the tag, or the first 8 hex digits of head's commit."""
        return self.tag if self.version is not None else self.commit[:8]

    def describe(self) -> str:
        if self.version is None:
            return f"AITER main @ {self.commit[:10]} ({self.date})"
        return f"AITER {self.tag} ({self.date})"


class AsmKernel(NamedTuple):
    """One ASM MoE kernel of a release's catalog (``hsa/<gfx>/fmoe*/…csv``); ``attrs`` are its numeric columns."""

    file: str
    line: int
    name: str
    attrs: tuple[tuple[str, int | None], ...]

    @property
    def gfx(self) -> str:
        return self.file.split("/")[1]

    @property
    def kind(self) -> str:
        """``fmoe`` (1-stage) or ``fmoe_2stages`` (ASM stage 1)."""
        return self.file.split("/")[2]


@memoize(maxsize=None)
def _index() -> dict[str, Any]:
    path = os.path.join(capdb._package_dir("moedispatch.capability_db"), INDEX_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise CapabilityDBError(f"capability_db/{INDEX_FILE}: file missing from the installation") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CapabilityDBError(f"capability_db/{INDEX_FILE}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CapabilityDBError(f"capability_db/{INDEX_FILE}: schema is not {SCHEMA} (rebuild it with "
                                "scripts/build_aiter_index.py)")
    return doc


@memoize(maxsize=None)
def releases() -> tuple[Release, ...]:
    """Every release of the index, oldest first (``head`` last)."""
    return tuple(Release(str(t), str(c), str(d)) for t, c, d in _index()["releases"])


def release(tag: str) -> Release:
    """The release named ``tag`` (``v0.1.18``, ``0.1.18`` or ``head``); KeyError when the index has none."""
    want = tag if tag == "head" or tag.startswith("v") else f"v{tag}"
    for r in releases():
        if r.tag == want:
            return r
    raise KeyError(tag)


def display_prefix(tag: str) -> str:
    """``ROCm/aiter@v0.1.18:`` — how a row's file is shown (``…:aiter/configs/tuned_fmoe.csv:417``)."""
    return f"{_REPO}@{release(tag).ref}:"


@memoize(maxsize=256)
def release_for(version: str | None) -> tuple[str, tuple[str, ...]]:
    """The release whose data a plan for AITER ``version`` reads, and what was assumed (empty when exact).

    A release of the index → that release (a local ``+rocm`` suffix is ignored); a release candidate → its release,
    with a note. Between two releases (a dev build: :func:`moedispatch.core.aiter_release.release_of`) → the older
    one, with a note. Older than every release → the oldest, with a note. Newer than every
    release → ``head`` (main after the newest release), with a note. None → ``head``.
    """
    rels = releases()
    tagged = [r for r in rels if r.version is not None]
    head = next((r for r in rels if r.version is None), tagged[-1])
    if version is None:
        return head.tag, ()
    public = release_of(version)
    if public is None:
        return head.tag, (f"AITER {version!r} is not a PEP 440 version; planned with {head.describe()}",)
    for r in tagged:
        if r.version == public:
            if Version(Version(version).public) != public:
                return r.tag, (f"AITER {version} is a pre-release of {r.tag}; planned with {r.describe()}",)
            return r.tag, ()
    older = [r for r in tagged if r.version is not None and r.version < public]
    if not older:
        oldest = tagged[0]
        return oldest.tag, (f"AITER {version} is older than every release in moedispatch's AITER index; planned with "
                            f"the oldest, {oldest.describe()}",)
    if older[-1] is tagged[-1]:
        return head.tag, (f"AITER {version} is newer than every release in moedispatch's AITER index (newest "
                          f"{tagged[-1].tag}); planned with {head.describe()}",)
    what = "a development build, not a release" if public.dev is not None else "not a release"
    return older[-1].tag, (f"AITER {version} is {what} in moedispatch's AITER index; planned with the nearest older "
                           f"release, {older[-1].describe()}",)


def _index_of(tag: str) -> int:
    for i, r in enumerate(releases()):
        if r.tag == tag:
            return i
    raise KeyError(tag)


def _line_in(occurrences: list[list[int]], idx: int) -> int | None:
    for first, last, line in occurrences:
        if first <= idx <= last:
            return line
    return None


def _covers(runs: list[list[int]], idx: int) -> bool:
    return any(first <= idx <= last for first, last in runs)


def _merge_rank(path: str) -> tuple[bool, str]:
    """AITER's merge order: the default file first, then model_configs by name (aiter_configs.default_files)."""
    return (path != _DEFAULT_FILE, path)


@memoize(maxsize=None)
def files_for(tag: str) -> tuple[str, ...]:
    """The files of ``tag``'s default tuned set (paths in ROCm/aiter), in AITER's merge order."""
    idx = _index_of(tag)
    return tuple(sorted((f for f, runs in _index()["files"] if _covers(runs, idx)), key=_merge_rank))


@memoize(maxsize=64)
def rows_for(tag: str, model_dims: frozenset[int] | None = None) -> tuple:
    """``tag``'s tuned rows (:class:`~moedispatch.data.aiter_configs.TunedRow`, ``file`` = ``ROCm/aiter@<ref>:
    <path>``), in AITER's merge order; ``model_dims`` keeps only rows of those model_dim values."""
    doc = _index()
    idx = _index_of(tag)
    strings = doc["strings"]
    columns = doc["columns"]
    files = [f for f, _ in doc["files"]]
    prefix = display_prefix(tag)
    i_md = columns.index("model_dim")
    str_cols = {i for i, c in enumerate(columns)
                if c in ("gfx", "act_type", "dtype", "q_dtype_a", "q_dtype_w", "q_type", "kernel1", "kernel2",
                         "err1", "err2", "tag")}
    i_def = columns.index("defects")
    found = []
    for rec in doc["rows"]:
        line = _line_in(rec[1], idx)
        if line is None:
            continue
        values = rec[2:]
        if model_dims is not None and values[i_md] not in model_dims:
            continue
        decoded = [strings[v] if i in str_cols else v for i, v in enumerate(values)]
        decoded[i_def] = tuple(strings[v] for v in values[i_def])
        fields = dict(zip(columns, decoded))
        fields["gfx"] = fields["gfx"] or None
        path = files[rec[0]]
        found.append((_merge_rank(path), line, TunedRow(file=prefix + path, line=line, **fields)))
    found.sort(key=lambda t: (t[0], t[1]))
    return tuple(t[2] for t in found)


@memoize(maxsize=None)
def problems_for(tag: str) -> tuple[str, ...]:
    """``ROCm/aiter@<ref>:<path>:<line>: what`` for every line of ``tag``'s set the parser could not read."""
    doc = _index()
    idx = _index_of(tag)
    files = [f for f, _ in doc["files"]]
    prefix = display_prefix(tag)
    return tuple(f"{prefix}{files[f]}:{what}" for f, runs, what in doc["problems"] if _covers(runs, idx))


@memoize(maxsize=None)
def asm_kernels(tag: str, gfx: str | None = None) -> tuple[AsmKernel, ...]:
    """``tag``'s ASM MoE kernel catalogs (optionally one gfx), in file then line order."""
    doc = _index()
    idx = _index_of(tag)
    strings = doc["strings"]
    names = doc["asm_columns"][3:]
    out = []
    for rec in doc["asm"]:
        line = _line_in(rec[1], idx)
        if line is None:
            continue
        kernel = AsmKernel(strings[rec[0]], line, strings[rec[2]], tuple(zip(names, rec[3:])))
        if gfx is None or kernel.gfx == gfx:
            out.append(kernel)
    out.sort(key=lambda k: (k.file, k.line))
    return tuple(out)
