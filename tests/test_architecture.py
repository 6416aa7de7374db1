"""The layers of docs/architecture.md, enforced: imports go one way, at module top, and nothing forms a cycle.

The import graph is read with ``ast`` from the source (nothing is imported). A module may import its own subpackage
and the layers below it; a function-local import is allowed only for a heavy optional dependency outside moedispatch
(torch, an engine), never to reach a moedispatch module. ``tests/test_architecture.py::test_planted_*`` plant a
wrong-way import and a cycle in a copy of the tree and check that the checks go red.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layers, lowest first (docs/architecture.md draws the same list). A module of layer i may import layers ≤ i
#: (within its own layer: only its own subpackage, or the shared layer-0 helpers). ``moedispatch`` itself (the package
#: ``__init__``), ``api``, ``cli``, ``__main__`` and ``testing`` form the top: nothing below imports them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_util",),
    ("core",),
    ("data",),
    ("sources", "probe"),
    ("aiter",),
    ("cost",),
    ("kit",),
    ("selector",),
    ("plan",),
    ("engines",),
    ("render", "numerics", "guard"),
    ("api",),
    ("cli", "testing"),
    ("__main__", "__init__"),
)
#: Built-in backends (package ``moedispatch_plugins``, folder ``plugins/``) sit beside the selector: they import the
#: kit and the layers below it, never the selector, a plan, an engine or a renderer.
PLUGINS_MAY_IMPORT = ("_util", "core", "data", "sources", "probe", "aiter", "cost", "kit", "numerics", "__init__")
#: Modules that may import lazily: the package facade (``import moedispatch`` stays cheap; its public names load on
#: first use) and the command line (a command's modules load when that command runs, so ``explain`` starts fast).
#: ``moedispatch.guard.entry``: the engines' plugin entry points, loaded by every engine process, import the guard only
#: when it is not off.
LAZY_ALLOWED_IN = ("moedispatch", "moedispatch.cli", "moedispatch.guard.entry")
#: Third-party modules heavy enough to import only where used; a moedispatch module that imports one at its top is
#: heavy too, and may be imported lazily.
HEAVY_THIRD_PARTY = ("torch", "vllm", "sglang", "ray")


def _rank() -> dict[str, int]:
    return {part: i for i, layer in enumerate(LAYERS) for part in layer}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name → file."""
    out = {}
    for path in sorted((root / "moedispatch").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(tree: ast.AST, known: dict[str, Path]):
    """(target module, line, kind) for every moedispatch import; kind is top, lazy or type."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "moedispatch" or node.module.startswith("moedispatch.")):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                targets.append(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name == "moedispatch" or a.name.startswith("moedispatch.")]
        if not targets:
            continue
        kind, up = "top", node
        while up in parents:
            up = parents[up]
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "lazy"
                break
            if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
                kind = "type"
                break
        for target in targets:
            yield target, node.lineno, kind


def graph(root: Path) -> list[tuple[str, str, int, str]]:
    """(importer, imported, line, kind) for every internal import edge."""
    known = modules(root)
    edges = []
    for name, path in known.items():
        for target, line, kind in _imports(ast.parse(path.read_text(encoding="utf-8")), known):
            if target != name:
                edges.append((name, target, line, kind))
    return edges


def part_of(module: str) -> str:
    """``moedispatch.aiter.dispatch`` → ``aiter``; ``moedispatch`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def heavy_modules(root: Path) -> set[str]:
    """moedispatch modules that import a :data:`HEAVY_THIRD_PARTY` package at their top level."""
    out = set()
    for name, path in modules(root).items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in HEAVY_THIRD_PARTY for n in names):
                out.add(name)
    return out


def violations(root: Path) -> list[str]:
    """Every import that goes the wrong way, is function-local, or leaves its layer sideways."""
    rank = _rank()
    heavy = heavy_modules(root)
    out = []
    for src, dst, line, kind in graph(root):
        a, b = part_of(src), part_of(dst)
        where = f"{src} line {line} imports {dst}"
        if a not in rank or b not in rank:
            out.append(f"{where}: {a if a not in rank else b!r} is in no layer (tests/test_architecture.py LAYERS)")
            continue
        if kind == "lazy" and src not in LAZY_ALLOWED_IN and dst not in heavy:
            out.append(f"{where} inside a function (only heavy third-party imports may be lazy)")
        if a == b or kind == "type":
            continue
        if b == "__init__" and dst == "moedispatch" and a != "__init__":
            out.append(f"{where}: import the defining module, not the package facade")
        elif rank[b] > rank[a]:
            out.append(f"{where}: layer {a!r} may not import the higher layer {b!r}")
        elif rank[b] == rank[a]:
            out.append(f"{where}: {a!r} and {b!r} are one layer; neither may import the other")
    return out


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over run-time and type-only edges."""
    adj: dict[str, set[str]] = {}
    for src, dst, _, _ in graph(root):
        adj.setdefault(src, set()).add(dst)
        adj.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return found


def plugin_violations(root: Path) -> list[str]:
    """Built-in backends import the kit and the layers below it only."""
    known = modules(root)
    out = []
    for path in sorted((root / "plugins").glob("*.py")):
        for target, line, _ in _imports(ast.parse(path.read_text(encoding="utf-8")), known):
            if part_of(target) not in PLUGINS_MAY_IMPORT:
                out.append(f"plugins/{path.name} line {line} imports {target}")
    return out


def test_every_subpackage_is_in_a_layer():
    parts = {part_of(m) for m in modules(ROOT)}
    assert parts <= set(_rank()), sorted(parts - set(_rank()))


def test_imports_go_one_way():
    assert violations(ROOT) == []


def test_no_import_cycle():
    assert cycles(ROOT) == []


def test_built_in_backends_import_the_kit_not_the_selector():
    assert plugin_violations(ROOT) == []


@pytest.fixture
def tree(tmp_path):
    shutil.copytree(ROOT / "moedispatch", tmp_path / "moedispatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "plugins", tmp_path / "plugins", ignore=shutil.ignore_patterns("__pycache__", "examples"))
    return tmp_path


def _plant(path: Path, line: str) -> None:
    text = path.read_text(encoding="utf-8")
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + line + "\n" + rest if sep else line + "\n" + text, encoding="utf-8")


def test_planted_wrong_way_import_goes_red(tree):
    _plant(tree / "moedispatch" / "core" / "reason.py", "from moedispatch.selector import pure")
    found = violations(tree)
    assert len(found) == 1 and "layer 'core' may not import the higher layer 'selector'" in found[0]


def test_planted_lazy_import_goes_red(tree):
    path = tree / "moedispatch" / "cost" / "model.py"
    path.write_text(path.read_text(encoding="utf-8") + "\n\ndef _late():\n    from moedispatch.data import capdb\n",
                    encoding="utf-8")
    assert any("inside a function" in v for v in violations(tree))


def test_planted_cycle_is_found(tree):
    _plant(tree / "moedispatch" / "core" / "reason.py", "from moedispatch.core import decision")
    assert any("moedispatch.core.reason" in comp and "moedispatch.core.decision" in comp for comp in cycles(tree))


def test_planted_plugin_import_of_the_selector_goes_red(tree):
    _plant(tree / "plugins" / "triton.py", "from moedispatch.selector import pure")
    assert plugin_violations(tree) == ["plugins/triton.py line 2 imports moedispatch.selector.pure"] or \
        any("moedispatch.selector.pure" in v for v in plugin_violations(tree))
