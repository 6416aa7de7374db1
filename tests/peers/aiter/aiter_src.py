"""Bring AITER's real Python sources into an ignored scratch folder, with the few stand-ins they need on a CPU.

Nothing of AITER is kept in this project: its files are extracted at run time from a ROCm/aiter git directory
(``git archive <commit> aiter csrc/include csrc/opus_moe``), a checkout, or the PyPI ``amd-aiter`` wheel, into
``.aiter-peer-build/src/<label>/`` (gitignored). Then, in that scratch copy only:

* ``aiter/__init__.py`` is regenerated from the real file: its text up to the op-import section, then only the
  ``from .ops.X import *`` lines the fused-MoE dispatch needs (``WANTED``). The other op modules query a live GPU
  or the Triton driver at import.
* ``module_aiter_core`` (``module_aiter_enum`` in older releases; the name is read from ``aiter/ops/enum.py``) is a
  tiny pybind11 module of our own: the ``pybind11::enum_`` types that ``rocm_ops.hpp`` binds in the macro holding
  ``QuantType``/``ActivationType``, with the values of that commit's ``enum class`` definitions
  (``csrc/include/aiter_enum.h``, ``mx_quant_utils.h``). Its C++ is generated here from those headers and compiled
  with g++ into ``.aiter-peer-build/enums/<hash>/`` (real pybind11 enums keep AITER's hash/eq/str behaviour, which
  decides its exact-match tuned lookup).
* ``rocminfo`` / ``hipconfig`` executables (``.aiter-peer-build/bin/<gfx>-<cu>/``) report one GPU agent, so
  ``aiter/jit/utils/chip_info.py`` ``get_gfx`` / ``get_gfx_runtime`` / ``get_cu_num`` parse them unchanged.

Command line (run by tests/peers/aiter/setup_env.sh)::

    python tests/peers/aiter/aiter_src.py prepare [SOURCE]     # prints the prepared tree's JSON description

SOURCE: a ROCm/aiter git directory (optionally ``DIR@<commit>``), a checkout, an ``amd_aiter-*.whl`` file, or
``pypi:amd-aiter==<version>`` (downloaded with ``pip download --no-deps`` into ``.aiter-peer-build/wheels``).
Default: ``MOEDISPATCH_AITER_SRC``, else ``/work/.mirror/ROCm+aiter/repo`` when present.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BUILD = ROOT / ".aiter-peer-build"
DEFAULT_GIT = Path("/work/.mirror/ROCm+aiter/repo")
#: The commit moedispatch's "head" snapshot was taken from (moedispatch/aiter/vocab.py SRC_FUSED_MOE).
HEAD_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
#: ``aiter/__init__.py`` op imports the fused-MoE dispatch needs (``aiter/fused_moe.py`` imports from ``aiter``).
WANTED = ("jit", "jit.core", "utility", "utility.dtypes", "ops.enum", "ops.quant", "ops.moe_op", "ops.moe_sorting",
          "ops.moe_sorting_opus", "ops.moe_mxfp4_aux")


def default_source() -> str | None:
    env = os.environ.get("MOEDISPATCH_AITER_SRC")
    if env:
        return env
    return str(DEFAULT_GIT) if DEFAULT_GIT.exists() else None


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def _git(git_dir: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, **kw)


def _wheel_path(spec: str) -> Path:
    """A wheel file for ``pypi:amd-aiter==X`` (pip download, cached) or the path given."""
    if not spec.startswith("pypi:"):
        return Path(spec)
    req = spec[len("pypi:"):]
    name, _, version = req.partition("==")
    dest = BUILD / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    hits = sorted(dest.glob(f"{stem}-{version}-*.whl")) if version else []
    if not hits:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), req], check=True)
        hits = sorted(dest.glob(f"{stem}-{version}-*.whl") if version else dest.glob(f"{stem}-*.whl"))
    if not hits:
        raise FileNotFoundError(f"pip download {req} left no wheel in {dest}")
    return hits[-1]


def _csrc_parts(git_dir: Path, rev: str) -> list[str]:
    """The csrc/ folders the Python dispatch reads: the headers (enum values) and, where the commit has it,
    ``csrc/opus_moe`` (``aiter/ops/opus/moe_stage2_a8w4.py`` imports ``csrc.opus_moe.opus_moe_common``)."""
    names = _git(git_dir, "ls-tree", "--name-only", rev, "csrc/", text=True).stdout.split()
    return [p for p in ("csrc/include", "csrc/opus_moe") if p in names]


def _fill(dest: Path, fill) -> None:
    """Create ``dest`` once, atomically: ``fill(tmp)`` writes a private folder that is renamed into place (peer
    processes and pytest-xdist workers may prepare the same source at the same time)."""
    if (dest / ".complete").exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    fill(tmp)
    init = tmp / "aiter" / "__init__.py"
    real = tmp / "aiter" / "__init__.py.real"
    shutil.copy2(init, real)
    init.write_text(stub_init(real.read_text()))
    (tmp / ".complete").write_text("ok\n")
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race (or a stale partial copy): keep a complete one
        if not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(tmp, dest)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def extract(spec: str) -> dict:
    """Extract AITER's sources named by ``spec`` into the scratch folder (once); describe them."""
    commit = None
    path_text = spec
    if "@" in spec and not spec.startswith("pypi:"):
        path_text, commit = spec.rsplit("@", 1)
    path = Path(path_text)
    if spec.startswith("pypi:") or path_text.endswith(".whl"):
        whl = _wheel_path(spec)
        label = whl.name[:-len(".whl")]
        dest = BUILD / "src" / label
        def fill(tmp: Path) -> None:
            with zipfile.ZipFile(whl) as z:
                members = [m for m in z.namelist() if m.startswith("aiter/") or
                           m.startswith(("aiter_meta/csrc/include/", "aiter_meta/csrc/opus_moe/"))]
                z.extractall(tmp, members)

        _fill(dest, fill)
        version = label.split("-")[1]
        include = dest / "aiter_meta" / "csrc" / "include"
        return {"kind": "wheel", "label": label, "root": str(dest), "include": str(include), "version": version,
                "commit": None, "origin": str(whl), "file_url": f"amd-aiter=={version} (PyPI wheel)"}
    git_dir = None
    if _is_git_dir(path):
        git_dir = path
    elif (path / ".git").exists() and commit:
        git_dir = path / ".git"
    if git_dir is not None:
        rev = _git(git_dir, "rev-parse", f"{commit or HEAD_COMMIT}^{{commit}}", text=True).stdout.strip()
        label = f"git-{rev[:12]}"
        dest = BUILD / "src" / label
        def fill(tmp: Path) -> None:
            tar = subprocess.run(["git", f"--git-dir={git_dir}", "archive", rev, "aiter", *_csrc_parts(git_dir, rev)],
                                 check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)

        _fill(dest, fill)
        return {"kind": "git", "label": label, "root": str(dest), "include": str(dest / "csrc" / "include"),
                "version": None, "commit": rev, "origin": str(git_dir),
                "file_url": f"https://github.com/ROCm/aiter/blob/{rev}"}
    if (path / "aiter" / "fused_moe.py").is_file():
        digest = hashlib.sha256((path / "aiter" / "fused_moe.py").read_bytes()).hexdigest()[:12]
        label = f"tree-{digest}"
        dest = BUILD / "src" / label
        def fill(tmp: Path) -> None:
            shutil.copytree(path / "aiter", tmp / "aiter", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
            inc = path / "csrc" / "include"
            if not inc.is_dir():
                inc = path / "aiter_meta" / "csrc" / "include"
            shutil.copytree(inc, tmp / "csrc" / "include")
            if (inc.parent / "opus_moe").is_dir():
                shutil.copytree(inc.parent / "opus_moe", tmp / "csrc" / "opus_moe")

        _fill(dest, fill)
        return {"kind": "tree", "label": label, "root": str(dest), "include": str(dest / "csrc" / "include"),
                "version": None, "commit": None, "origin": str(path), "file_url": str(path)}
    raise FileNotFoundError(f"{spec}: not a ROCm/aiter git directory, checkout, wheel or pypi: spec")


# -- aiter/__init__.py stand-in ----------------------------------------------------------------------------------

_IMPORT = re.compile(r"^\s*from \.(?P<mod>[\w.]*) import (?P<what>.*)$")


def stub_init(text: str) -> str:
    """The real ``aiter/__init__.py`` up to its op-import section, keeping only the ``WANTED`` imports there."""
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if _IMPORT.match(ln))
    last = max(i for i, ln in enumerate(lines) if _IMPORT.match(ln))
    out = lines[:first]
    # Some releases (v0.1.11-v0.1.13) wrap the op imports in ``try:`` … ``except (ImportError, …):`` — keep that
    # except clause (re-raising: a missing stand-in must fail loudly), drop any other try's.
    prev = next((ln for ln in reversed(out) if ln.strip()), "")
    open_try = len(prev) - len(prev.lstrip()) if prev.strip() == "try:" else None
    skipping = False
    for ln in lines[first:last + 1]:
        if skipping:
            skipping = ")" not in ln
            continue
        m = _IMPORT.match(ln)
        if m is None and ln.strip().startswith(("except", "finally")):
            indent = len(ln) - len(ln.lstrip())
            if open_try is not None and indent == open_try:
                out += [ln, " " * (indent + 4) + "raise"]
                open_try = None
            continue
        if m is None:
            if ln.strip().startswith(("#", "else", "elif", "if ")) or not ln.strip():
                out.append(ln)
            continue
        mod, what = m.group("mod"), m.group("what")
        if mod == "" and "mla" in what:
            continue
        if mod in WANTED or (mod == "jit" and "core" in what):
            out.append(ln)
        elif "(" in what and ")" not in what:
            skipping = True
    out.append("")
    out.append("# moedispatch peer harness: op imports other than the fused-MoE dispatch's were left out here.")
    return "\n".join(out) + "\n"


# -- the enum module -------------------------------------------------------------------------------------------

_ENUM_DEF = re.compile(r"enum\s+class\s+(\w+)\s*(?::\s*\w+)?\s*\{(.*?)\}", re.S)
_ENUM_BIND = re.compile(r'pybind11::enum_<([\w:]+)>\(m,\s*"(\w+)"\)(.*?)export_values\(\)', re.S)
_VALUE = re.compile(r'\.value\("(\w+)",\s*[\w:]+::(\w+)\)')


def _enum_values(include: Path) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for header in sorted(include.glob("*.h")):
        text = re.sub(r"//[^\n]*", "", header.read_text(errors="replace"))
        for name, body in _ENUM_DEF.findall(text):
            values, nxt = [], 0
            for item in body.split(","):
                item = item.strip()
                if not item:
                    continue
                key, _, val = item.partition("=")
                if val.strip():
                    nxt = int(val.strip(), 0)
                values.append((key.strip(), nxt))
                nxt += 1
            out[name] = values
    return out


def enum_module_cpp(src_root: Path, include: Path) -> tuple[str, str]:
    """(module name, C++ source) of the stand-in enum module for this AITER tree."""
    enum_py = (src_root / "aiter" / "ops" / "enum.py").read_text()
    binds = re.findall(r'compile_ops\(\s*"(\w+)",\s*"(\w+)"\)', enum_py)
    module = binds[0][0]
    wanted = {name for _m, name in binds}
    hpp = (include / "rocm_ops.hpp").read_text(errors="replace")
    values = _enum_values(include)
    # The pybind macro block that binds the enums enum.py loads (AITER_CORE_PYBIND / AITER_ENUM_PYBIND).
    blocks = re.split(r"#define\s+", hpp)
    block = next(b for b in blocks if all(f'"{w}"' in b and "enum_<" in b for w in wanted))
    decls, bindings = [], []
    for cxx, pyname, body in _ENUM_BIND.findall(block):
        base = cxx.split("::")[-1]
        if base not in values:
            raise KeyError(f"enum {cxx} bound in rocm_ops.hpp has no enum class definition under {include}")
        decls.append(f"enum class {base} : int {{ " + ", ".join(f"{k} = {v}" for k, v in values[base]) + " };")
        names = _VALUE.findall(body)
        chain = "".join(f'.value("{py}", {base}::{cx})' for py, cx in names)
        bindings.append(f'  pybind11::enum_<{base}>(m, "{pyname}"){chain}.export_values();')
        bindings.append(f"  pybind11::implicitly_convertible<int, {base}>();")
    m = re.search(r"kDefaultMxScaleRoundMode\s*=\s*MxScaleRoundMode::(\w+)", (include / "mx_quant_utils.h").read_text()
                  if (include / "mx_quant_utils.h").exists() else "")
    if m and "kDefaultMxScaleRoundMode" in block:
        bindings.append(f'  m.attr("kDefaultMxScaleRoundMode") = static_cast<int>(MxScaleRoundMode::{m.group(1)});')
    cpp = ("// Generated by moedispatch tests/peers/aiter/aiter_src.py from AITER's csrc/include headers:\n"
           "// the enum values of that commit, bound as rocm_ops.hpp binds them. No AITER code is compiled here.\n"
           "#include <pybind11/pybind11.h>\nnamespace moed_peer {\n" + "\n".join(decls) + "\n}\n"
           "using namespace moed_peer;\n"
           f"PYBIND11_MODULE({module}, m) {{\n" + "\n".join(bindings) + "\n}\n")
    return module, cpp


def build_enum_module(src_root: Path, include: Path, python: str = sys.executable) -> Path:
    """Compile the stand-in enum module (cached by its generated source); the folder to put on AITER_JIT_DIR."""
    module, cpp = enum_module_cpp(src_root, include)
    digest = hashlib.sha256((cpp + python).encode()).hexdigest()[:16]
    dest = BUILD / "enums" / digest
    so = dest / f"{module}.so"
    if so.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{module}.cpp").write_text(cpp)
    flags = subprocess.run([python, "-m", "pybind11", "--includes"], check=True, capture_output=True,
                           text=True).stdout.split()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    tmp = dest / f".{module}{suffix}.{os.getpid()}"
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-std=c++17", *flags, str(dest / f"{module}.cpp"), "-o",
                    str(tmp)], check=True)
    os.replace(tmp, so)
    return dest


# -- fake ROCm tools ----------------------------------------------------------------------------------------------

def fake_rocm_bin(gfx: str, cu: int) -> Path:
    """A folder with ``rocminfo`` (one GPU agent: ``gfx``, ``cu`` compute units) and ``hipconfig``."""
    dest = BUILD / "bin" / f"{gfx}-{cu}"
    if (dest / "rocminfo").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    info = ("#!/bin/sh\ncat <<'EOF'\nROCk module is loaded (moedispatch peer stand-in)\n*******\nAgent 1\n*******\n"
            f"  Name:                    {gfx}\n  Marketing Name:          moedispatch peer stand-in\n"
            f"  Device Type:             GPU\n  Compute Unit:            {cu}\nEOF\n")
    for name, body in (("rocminfo", info), ("hipconfig", "#!/bin/sh\necho 6.4.43482-0\n")):
        tmp = dest / f".{name}.{os.getpid()}"
        tmp.write_text(body)
        tmp.chmod(0o755)
        os.replace(tmp, dest / name)
    return dest


def prepare(spec: str | None = None, python: str = sys.executable) -> dict:
    """Extract, stub ``aiter/__init__.py`` and build the enum module; the description the AITER side reads."""
    spec = spec or default_source()
    if not spec:
        raise FileNotFoundError("no AITER source: set MOEDISPATCH_AITER_SRC")
    info = extract(spec)
    root = Path(info["root"])
    info["jit_dir"] = str(build_enum_module(root, Path(info["include"]), python))
    return info


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "prepare":
        print(json.dumps(prepare(sys.argv[2] if len(sys.argv) > 2 else None), indent=1))
    else:
        sys.exit(__doc__)
