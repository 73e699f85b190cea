"""The house rules of the layout (README, "How the code is laid out"), checked on the code's own imports."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specviz"

# which packages each package may import (module-level or in a function); top-level modules count as
# their own "package" (limits, lessons, machine, charts, live_charts). Anything not listed is an arrow the wrong way.
ALLOWED = {
    "lessons": set(),
    "machine": set(),
    "limits": {"lessons"},
    "hardware": {"lessons", "machine", "limits"},
    "engine": {"hardware", "lessons", "limits"},
    "fastpath": {"engine", "hardware", "machine", "lessons", "limits"},
    "pairs": {"engine", "fastpath", "hardware", "lessons", "limits", "machine"},
    "chapters": {"engine", "hardware", "lessons", "limits"},
    "charts": {"hardware", "lessons"},
    "live_charts": {"charts"},
    "vllm": {"engine", "pairs", "lessons", "limits"},
    "serve": {"engine", "pairs", "fastpath", "hardware", "vllm", "live_charts", "lessons", "limits", "machine"},
    "ui": {"serve", "chapters", "charts", "engine", "pairs", "hardware", "lessons", "limits", "vllm"},
    "cli": {"serve", "pairs", "engine", "fastpath", "hardware", "chapters", "charts", "vllm", "lessons", "limits",
            "machine"},
    "__main__": {"cli", "engine", "limits", "pairs"},
    "__init__": set(),
}


def _package(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel.with_suffix(".py")).exists() or (ROOT / rel / "__init__.py").exists()


def _imports(path: Path, module_level_only: bool = False) -> list[str]:
    """The specviz modules a file imports: `from pkg import sub` names the submodule, `from mod import x`
    the module."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specviz"):
            subs = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            out += subs + ([node.module] if len(subs) < len(node.names) else [])
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("specviz")]
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p
    return mods


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_one_way(path):
    me = _package(path)
    wrong = sorted({m.split(".")[1] for m in _imports(path) if len(m.split(".")) > 1}
                   - ALLOWED[me] - {me})
    assert not wrong, f"{path.relative_to(ROOT)} ({me}) imports {wrong}: that arrow points the wrong way"


# The one circle known today, closed by a function-level import; it goes with issue 47 (the fast path's
# cache, forward and passes are being re-cut there). Any other circle fails this test.
KNOWN_CIRCLES = {frozenset({"specviz.fastpath.cache", "specviz.fastpath.llama", "specviz.fastpath.passes"})}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: each strongly connected set of two or more modules, sorted (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(m: str) -> None:
        order[m] = low[m] = len(order)
        stack.append(m)
        for d in sorted(graph[m]):
            if d not in order:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], order[d])
        if low[m] == order[m]:
            group = stack[stack.index(m):]
            del stack[stack.index(m):]
            if len(group) > 1:
                out.append(sorted(group))
    for m in sorted(graph):
        if m not in order:
            visit(m)
    return sorted(out)


def import_graph() -> dict[str, set[str]]:
    """Module → the specviz modules it imports anywhere in its file (module level, in a function or a
    method): a function-level import that closes a circle is still a circle."""
    mods = _modules()
    return {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}


def test_no_import_circle_between_modules():
    circles = import_circles(import_graph())
    new = [c for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert not new, "import circles (function-level imports counted): " + "; ".join(" ↔ ".join(c) for c in new)


def test_the_circle_finder_sees_a_function_level_import(tmp_path):
    """The circle check reads imports inside functions too (two tiny modules that import each other, one
    of them only inside a function), and finds a longer circle."""
    (tmp_path / "a.py").write_text("from specviz.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from specviz.a import g\n    return g\n")
    assert _imports(tmp_path / "b.py") == ["specviz.a"]
    assert _imports(tmp_path / "b.py", module_level_only=True) == []
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_gradio_only_in_ui():
    for p in PKG.rglob("*.py"):
        if _package(p) == "ui":
            continue
        tree = ast.parse(p.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [n for n in names if n.split(".")[0] == "gradio"], f"{p} imports gradio outside ui/"


def test_every_registered_chapter_is_one_unit():
    """Each chapter with an experiment lives in its own module: experiment, figure and button together."""
    from specviz.chapters import CHAPTERS

    keys = [c.key for c in CHAPTERS]
    assert len(keys) == len(set(keys)) and keys[0] == "intro"
    for c in CHAPTERS:
        if c.run is None:
            continue
        assert c.figure is not None and c.button_id, c.key
        assert (PKG / "chapters" / f"{c.key}.py").exists(), c.key
        assert c.figure.__module__ == f"specviz.chapters.{c.key}", (c.key, c.figure.__module__)


def test_every_specviz_import_resolves():
    """Every `from specviz… import name`, at module level or in a function, names something that exists
    (a function-level import of a moved name fails only when that function runs)."""
    import importlib

    missing = []
    for path in sorted(PKG.rglob("*.py")) + [ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specviz")):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, missing
