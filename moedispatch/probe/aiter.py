"""Read an installed AITER from its files, without importing it (``import aiter`` imports torch, runs rocminfo via
ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py and may JIT-build; never do it in-process).

Sources of every rule are cited next to it. Distribution name: ``amd-aiter`` (PACKAGE_NAME in
ROCm/aiter@v0.1.15.post3:setup.py); PyPI ``aiter`` is an unrelated asyncio package (https://pypi.org/project/aiter/).
"""

from __future__ import annotations

import ast
import csv
import importlib.metadata as md
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch.core.errors import TargetError
from moedispatch.data import capdb
from moedispatch.data import aiter_install
from moedispatch.data.aiter_install import DIST, dist_version
from moedispatch.probe.util import ProbeTimeout, describe, last_error_line, run_python
from moedispatch.data.aiter_configs import installed_config_warnings

FILES = "files:amd-aiter"

# Modules whose presence matters for MoE dispatch (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py,
# ROCm/aiter@v0.1.15.post3:aiter/ops/flydsl/moe_common.py, ROCm/aiter@v0.1.15.post3:aiter/ops/flydsl/moe_kernels.py).
MODULES = ("aiter/fused_moe.py", "aiter/ops/flydsl/moe_common.py", "aiter/ops/flydsl/moe_kernels.py")


@dataclass(frozen=True)
class AsmTable:
    """One asm MoE kernel table: ``hsa/<gfx>/fmoe*/**/<table>.csv`` with ``knl_name`` rows
    (``hsa/<gfx>/fmoe/**/*.csv`` read by ROCm/aiter@v0.1.15.post3:csrc/py_itfs_cu/asm_fmoe.cu,
    ``hsa/<gfx>/fmoe_2stages/*.csv`` by ROCm/aiter@v0.1.15.post3:csrc/py_itfs_cu/asm_moe_2stage.cu)."""

    gfx: str
    table: str  # CSV file stem, e.g. fmoe_bf16_pertokenMXfp4_g1u1_silu / fmoe_stage1_bf16_pertokenFp8_g1u1
    kind: str  # the fmoe* directory: fmoe (1-stage) or fmoe_2stages (asm stage 1)
    kernels: int
    path: str  # relative to the hsa root


@dataclass(frozen=True)
class TunedFile:
    path: str  # relative to the aiter package parent
    rows: int
    cu_nums: tuple[int, ...]


@dataclass(frozen=True)
class FeatureCheck:
    """One capability_db feature, reconciled: ``present`` is what the probe believes, ``source`` why."""

    name: str
    present: bool
    source: str  # "db" or "files:amd-aiter"
    db: bool  # what capability_db/aiter.toml says for this version
    evidence: str = ""


@dataclass(frozen=True)
class AiterInfo:
    """What the installed AITER files say. ``unknown`` maps a field to the reason it is not known."""

    distribution: str | None
    version: str | None
    version_source: str
    version_file: str | None
    location: str | None
    fused_moe_params: tuple[tuple[str, str | None], ...] | None  # (name, default source text) in order
    modules: tuple[tuple[str, bool], ...]
    gate_mode_enum: bool | None
    asm_root: str | None
    asm_tables: tuple[AsmTable, ...]
    tuned_files: tuple[TunedFile, ...]
    tuned_cu_nums: tuple[int, ...] | None
    features: tuple[FeatureCheck, ...]
    flydsl_requirement: tuple[str, str] | None  # (specifier, source) from capdb.flydsl_pin
    import_status: str | None  # None: not tried; "ok"; "error: <line>"; "timeout: ..."
    notes: tuple[str, ...] = ()
    unknown: tuple[tuple[str, str], ...] = field(default=())

    @property
    def feature_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.features if f.present)

    def asm_kernel_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.asm_tables:
            counts[t.gfx] = counts.get(t.gfx, 0) + t.kernels
        return counts


def _package_dir(dist: md.Distribution | None) -> tuple[Path | None, str]:
    """The ``aiter`` package directory: from the dist's RECORD when it lists aiter/ files, else
    ``importlib.util.find_spec('aiter')`` — on a top-level name find_spec does not execute the package
    (editable/develop installs have no aiter/ files in RECORD)."""
    if dist is not None:
        for f in dist.files or []:
            if str(f).replace("\\", "/") == "aiter/__init__.py":
                path = Path(str(dist.locate_file(f))).parent
                if path.is_dir():
                    return path, "dist RECORD"
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError) as exc:
        return None, f"find_spec('aiter') failed: {describe(exc)}"
    if spec is None or not spec.submodule_search_locations:
        return None, "no 'aiter' package on sys.path"
    return Path(next(iter(spec.submodule_search_locations))), "find_spec('aiter')"


def fused_moe_params(path: Path) -> tuple[tuple[str, str | None], ...]:
    """Parameters of the top-level ``def fused_moe(...)`` (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py), by ``ast``.
    Raises ``LookupError`` when the function is absent, ``SyntaxError``/``OSError`` on unreadable source."""
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "fused_moe":
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
            params: list[tuple[str, str | None]] = [
                (arg.arg, ast.unparse(d) if d is not None else None) for arg, d in zip(positional, defaults)]
            if a.vararg:
                params.append(("*" + a.vararg.arg, None))
            params += [(arg.arg, ast.unparse(d) if d is not None else None)
                       for arg, d in zip(a.kwonlyargs, a.kw_defaults)]
            if a.kwarg:
                params.append(("**" + a.kwarg.arg, None))
            return tuple(params)
    raise LookupError("no top-level def fused_moe")


def _has_class(path: Path, name: str) -> bool:
    """``class GateMode`` in aiter/ops/flydsl/moe_common.py (new after v0.1.13.post1, ROCm/aiter#3123; vLLM imports it:
    vllm-project/vllm#46419)."""
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    return any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(tree))


def asm_root(pkg: Path) -> Path | None:
    """Where the asm kernels live. Installed wheels: ``<site>/aiter_meta/hsa`` (aiter/jit/core.py:
    ``AITER_META_DIR = AITER_ROOT_DIR/aiter_meta`` when aiter/install_mode says "install"; checked in the PyPI
    wheel amd-aiter 0.1.7.post2.dev18). Develop/editable installs: ``<repo>/hsa``."""
    for candidate in (pkg.parent / "aiter_meta" / "hsa", pkg.parent / "hsa", pkg / "aiter_meta" / "hsa"):
        if candidate.is_dir():
            return candidate
    return None


def asm_tables(root: Path) -> list[AsmTable]:
    """Count kernel rows (non-empty ``knl_name``) in every ``<gfx>/fmoe*/**/*.csv``. Headers as in
    ROCm/aiter@v0.1.15.post3:hsa/gfx950/fmoe (``knl_name,co_name,...``; the 0.1.7 wheel spells the 2nd column
    ``knl_file``) and ``fmoe_2stages`` (``tile_m,tile_n,knl_name,co_name``)."""
    tables: list[AsmTable] = []
    for gfx_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("gfx")):
        for kind_dir in sorted(p for p in gfx_dir.iterdir() if p.is_dir() and p.name.startswith("fmoe")):
            for csv_path in sorted(kind_dir.rglob("*.csv")):
                try:
                    with csv_path.open(newline="", encoding="utf-8", errors="replace") as fh:
                        rows = sum(1 for row in csv.DictReader(fh) if (row.get("knl_name") or "").strip())
                except (OSError, csv.Error):
                    continue
                tables.append(AsmTable(gfx=capdb.normalize_gfx(gfx_dir.name), table=csv_path.stem,
                                       kind=kind_dir.name, kernels=rows,
                                       path=str(csv_path.relative_to(root)).replace("\\", "/")))
    return tables


def tuned_files(pkg: Path) -> list[TunedFile]:
    """``aiter/configs/tuned_fmoe.csv`` + ``aiter/configs/model_configs/*tuned_fmoe*.csv`` without "untuned" — the
    set ROCm/aiter@v0.1.15.post3:aiter/jit/core.py ``get_config_file`` merges; first column ``cu_num``
    (ROCm/aiter@v0.1.15.post3:aiter/configs/tuned_fmoe.csv)."""
    configs = pkg / "configs"
    paths = [configs / "tuned_fmoe.csv"] + sorted((configs / "model_configs").glob("*tuned_fmoe*.csv"))
    found: list[TunedFile] = []
    for path in paths:
        if not path.is_file() or "untuned" in path.name:
            continue
        cu_nums: set[int] = set()
        rows = 0
        try:
            with path.open(newline="", encoding="utf-8", errors="replace") as fh:
                for row in csv.DictReader(fh):
                    value = (row.get("cu_num") or "").strip()
                    if value.isdigit():
                        cu_nums.add(int(value))
                        rows += 1
        except (OSError, csv.Error):
            continue
        found.append(TunedFile(str(path.relative_to(pkg.parent)).replace("\\", "/"), rows, tuple(sorted(cu_nums))))
    return found


def reconcile(version: str | None, params: dict[str, str | None] | None, gate_enum: bool | None,
              flydsl_kernels: bool | None, notes: list[str]) -> tuple[FeatureCheck, ...]:
    """capability_db/aiter.toml features for ``version``, overridden by what the files show (files win, note each
    disagreement). Files decide: fused_moe_pads (hidden_pad + intermediate_pad params), gate_mode (gate_mode param +
    moe_common.GateMode), swiglu_limit (param), flydsl_moe (aiter/ops/flydsl/moe_kernels.py)."""
    db_features: frozenset[str] = frozenset()
    if version is not None:
        try:
            db_features = capdb.features_for_version(version)
        except TargetError as exc:  # a non-PEP 440 version (a broken capability_db still raises)
            notes.append(f"AITER version {version!r} not comparable with capability_db ({describe(exc)}); "
                         "features from files only")
    from_files: dict[str, tuple[bool, str]] = {}
    if params is not None:
        from_files["fused_moe_pads"] = ("hidden_pad" in params and "intermediate_pad" in params,
                                        "fused_moe(hidden_pad=, intermediate_pad=) in aiter/fused_moe.py")
        from_files["swiglu_limit"] = ("swiglu_limit" in params, "fused_moe(swiglu_limit=) in aiter/fused_moe.py")
        if gate_enum is not None:
            from_files["gate_mode"] = ("gate_mode" in params and gate_enum,
                                       "fused_moe(gate_mode=) and moe_common.GateMode")
    if flydsl_kernels is not None:
        from_files["flydsl_moe"] = (flydsl_kernels, "aiter/ops/flydsl/moe_kernels.py")
    checks: list[FeatureCheck] = []
    for name in sorted(capdb.aiter_db()["features"]):
        in_db = name in db_features
        if name in from_files:
            present, evidence = from_files[name]
            if version is not None and present != in_db:
                notes.append(f"feature {name}: capability_db says {'present' if in_db else 'absent'} for AITER "
                             f"{version}, the installed files say {'present' if present else 'absent'} "
                             f"({evidence}); trusting the files")
            checks.append(FeatureCheck(name, present, FILES, in_db, evidence))
        elif in_db:
            checks.append(FeatureCheck(name, True, "db", True))
        else:
            checks.append(FeatureCheck(name, False, "db", False))
    return tuple(checks)


_IMPORT_SCRIPT = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
out = {}
try:
    import aiter
    out["ok"] = True
except BaseException as exc:
    out["ok"] = False
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
print("\n@@MOEDISPATCH_PROBE@@" + json.dumps(out))
"""


def try_import(timeout: float) -> str:
    """``import aiter`` in a subprocess (it imports torch, runs rocminfo, may JIT:
    ROCm/aiter@v0.1.15.post3:aiter/jit/utils/chip_info.py)."""
    try:
        data, result = run_python(_IMPORT_SCRIPT, timeout)
    except ProbeTimeout:
        return f"timeout: import aiter did not finish within {timeout:g}s (subprocess killed)"
    except OSError as exc:
        return f"error: could not start a Python subprocess: {describe(exc)}"
    if data is None:
        return f"error: subprocess exited {result.returncode} without an answer: {last_error_line(result.stderr)}"
    return "ok" if data.get("ok") else f"error: {data.get('error') or 'unknown'}"


def flydsl_check(aiter_version: str | None, flydsl_version: str | None, notes: list[str]) -> tuple[str, str] | None:
    """The flydsl pin for this AITER (FLYDSL_VERSION in AITER's setup.py, via capability_db/aiter.toml flydsl_pins)."""
    if aiter_version is None:
        return None
    try:
        pin = capdb.flydsl_pin(aiter_version)
    except TargetError:  # an unparseable version: no pin known (a broken capability_db still raises)
        return None
    if pin is None:
        return None
    spec, source = pin
    if flydsl_version is None:
        notes.append(f"AITER {aiter_version} pins flydsl {spec} ({source}) but flydsl is not installed")
        return pin
    try:
        ok = SpecifierSet(spec).contains(Version(flydsl_version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return pin
    if not ok:
        notes.append(f"flydsl {flydsl_version} does not satisfy AITER {aiter_version}'s pin flydsl{spec} "
                     f"({source}): importing aiter.fused_moe may fail")
    return pin


def inspect_aiter(flydsl_version: str | None, *, do_import: bool, timeout: float) -> tuple[AiterInfo | None, str]:
    """Returns (info or None, detail line for the ``files:amd-aiter`` source)."""
    try:
        dist: md.Distribution | None = md.distribution(DIST)
    except md.PackageNotFoundError:
        dist = None
    pkg, how = _package_dir(dist)
    if pkg is not None and not (pkg / "fused_moe.py").is_file() and dist is None:
        pkg = None  # an 'aiter' package that is not AMD AITER (e.g. PyPI aiter, asyncio tools)
    if dist is None and pkg is None:
        other = dist_version("aiter")
        if other is not None:
            return None, (f"amd-aiter not installed; the installed distribution 'aiter' {other} is an unrelated "
                          "PyPI package (asyncio tools), not AMD AITER")
        return None, "amd-aiter not installed"
    notes: list[str] = []
    unknown: list[tuple[str, str]] = []
    version = dist.version if dist is not None else None
    version_file = aiter_install.version_file(pkg) if pkg is not None else None
    version_source = "amd-aiter dist metadata" if version else "aiter/_version.py text"
    if version is None:
        version = version_file
        if dist is None:
            notes.append(f"no amd-aiter distribution metadata; aiter package found via {how} at {pkg}")
    if version and version_file and version_file != version:
        notes.append(f"amd-aiter metadata says {version}, aiter/_version.py says {version_file}")
    if version is None:
        unknown.append(("version", "no amd-aiter metadata and no aiter/_version.py"))

    params: dict[str, str | None] | None = None
    param_list: tuple[tuple[str, str | None], ...] | None = None
    modules: list[tuple[str, bool]] = []
    gate_enum: bool | None = None
    flydsl_kernels: bool | None = None
    root: Path | None = None
    tables: list[AsmTable] = []
    tuned: list[TunedFile] = []
    if pkg is None:
        unknown.append(("files", f"aiter package directory not found ({how})"))
    else:
        base = pkg.parent
        modules = [(m, (base / m).is_file()) for m in MODULES]
        try:
            param_list = fused_moe_params(pkg / "fused_moe.py")
            params = dict(param_list)
        except (OSError, SyntaxError, ValueError, LookupError) as exc:
            unknown.append(("fused_moe_params", f"aiter/fused_moe.py: {describe(exc)}"))
        common = pkg / "ops" / "flydsl" / "moe_common.py"
        try:
            gate_enum = _has_class(common, "GateMode") if common.is_file() else False
        except (OSError, SyntaxError, ValueError) as exc:
            unknown.append(("gate_mode_enum", f"aiter/ops/flydsl/moe_common.py: {describe(exc)}"))
        flydsl_kernels = (pkg / "ops" / "flydsl" / "moe_kernels.py").is_file()
        root = asm_root(pkg)
        if root is None:
            unknown.append(("asm_tables", "no aiter_meta/hsa or hsa directory next to the aiter package"))
        else:
            tables = asm_tables(root)
        tuned = tuned_files(pkg)
        if not tuned:
            unknown.append(("tuned_cu_nums", "no aiter/configs/tuned_fmoe.csv or model_configs/*tuned_fmoe*.csv"))
        else:
            # A malformed or partial tuned CSV: AITER's merge may fail or skip rows; say which file and line
            # (moedispatch's dispatch model then falls back to AITER's heuristics for the rows it cannot read).
            notes += [f"tuned CSV problem: {w}" for w in installed_config_warnings()]
    features = reconcile(version, params, gate_enum, flydsl_kernels, notes)
    pin = flydsl_check(version, flydsl_version, notes)
    status = try_import(timeout) if do_import else None
    cu_nums = tuple(sorted({c for t in tuned for c in t.cu_nums})) if tuned else None
    info = AiterInfo(
        distribution=DIST if dist is not None else None, version=version, version_source=version_source,
        version_file=version_file, location=str(pkg) if pkg else None, fused_moe_params=param_list,
        modules=tuple(modules), gate_mode_enum=gate_enum, asm_root=str(root) if root else None,
        asm_tables=tuple(tables), tuned_files=tuple(tuned), tuned_cu_nums=cu_nums, features=features,
        flydsl_requirement=pin, import_status=status, notes=tuple(notes), unknown=tuple(unknown),
    )
    kernels = ", ".join(f"{g}: {n}" for g, n in sorted(info.asm_kernel_counts().items())) or "none"
    detail = (f"{DIST} {version} at {pkg} ({how}); asm MoE kernels {kernels}; tuned cu_num "
              f"{list(cu_nums) if cu_nums else 'none'}")
    return info, detail
