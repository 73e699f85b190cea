"""The README's code map ("How the code is laid out") is the code's: every import of one part of specviz/ by
another, at module level or inside a function, needs an arrow in the map; every arrow in the map is used;
the arrows point one way; and gradio is imported in ui/ only, as the README says.

A part is a folder of specviz/ or a top-level module (limits, machine, charts, live_charts); specviz/__main__.py counts
as `cli`. The map is the README's bullet lines of the form "- `ui` → `serve`, `chapters`, …" ("→ nothing"
for a part that imports none)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specviz"
README = ROOT / "README.md"
SECTION = "## How the code is laid out"
ARROW = re.compile(r"`(\w+)` → ([^;]*)")
ALIASES = {"__main__": "cli"}


def parts() -> set[str]:
    """Every part of specviz/: its packages and its top-level modules."""
    names = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    names |= {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    return {ALIASES.get(n, n) for n in names}


def part_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    name = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    return ALIASES.get(name, name)


def readme_map(text: str) -> dict[str, set[str]]:
    """{part: the parts it may import} from the README's bullet lines in the code-map section."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    arrows: dict[str, set[str]] = {}
    for line in text[start:end if end > 0 else None].splitlines():
        if not line.startswith("- `"):
            continue
        for src, rhs in ARROW.findall(line):
            arrows.setdefault(src, set()).update(re.findall(r"`(\w+)`", rhs))
    return arrows


def imported_parts(path: Path) -> list[tuple[str, int]]:
    """(part, line) for every import of specviz in one file, module-level and function-level alike."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "specviz" else [f"specviz.{a.name}" for a in node.names]
        else:
            continue
        out += [(n.split(".")[1], node.lineno) for n in names if n.startswith("specviz.")]
    return out


def code_edges() -> dict[tuple[str, str], str]:
    """{(importer, imported): the first place it happens, as path:line}."""
    known = parts()
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(PKG.rglob("*.py")):
        src = part_of(path)
        for dst, line in imported_parts(path):
            dst = ALIASES.get(dst, dst)
            if dst != src and dst in known:
                edges.setdefault((src, dst), f"{path.relative_to(ROOT)}:{line}")
    return edges


def circle(arrows: dict[str, set[str]]) -> list[str]:
    """One circle in the map's arrows, as a list of parts (empty if there is none)."""
    state: dict[str, int] = {}            # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(arrows.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return []

    for start in sorted(arrows):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return []


def test_the_readme_map_is_read():
    arrows = readme_map(README.read_text(encoding="utf-8"))
    assert arrows.get("ui") and arrows.get("cli"), "the README's map lost its bullet lines"
    assert "lessons" in arrows and not arrows["lessons"], "`lessons` → nothing should read as no arrows"


def test_every_import_has_an_arrow_and_every_arrow_is_used():
    arrows = readme_map(README.read_text(encoding="utf-8"))
    edges = code_edges()
    known = parts()
    problems = [f"{src} imports {dst} ({where}) but the README's map has no {src} → {dst}"
                for (src, dst), where in sorted(edges.items()) if dst not in arrows.get(src, set())]
    problems += [f"the README's map has {src} → {dst}, but nothing in specviz/{src} imports specviz.{dst}"
                 for src, dsts in sorted(arrows.items()) for dst in sorted(dsts) if (src, dst) not in edges]
    problems += [f"the README's map names `{n}`, which is not a part of specviz/"
                 for n in sorted(set(arrows) | set().union(*arrows.values())) if n not in known]
    problems += [f"specviz's part `{n}` has no line in the README's map (write \"- `{n}` → nothing\" if it "
                 "imports none)" for n in sorted(known - set(arrows))]
    assert not problems, "\n".join(problems)


def test_the_map_points_one_way():
    arrows = readme_map(README.read_text(encoding="utf-8"))
    found = circle(arrows)
    assert not found, "the README's map has a circle: " + " → ".join(found)
    into = sorted(src for src, dsts in arrows.items() if dsts & {"ui", "cli"})
    assert not into, f"the README says nothing imports ui or cli, but the map has arrows into them from {into}"


def test_gradio_is_imported_in_ui_only():
    outside = []
    for path in sorted(PKG.rglob("*.py")):
        if part_of(path) == "ui":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            outside += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                        if n == "gradio" or n.startswith("gradio.")]
    assert not outside, f"gradio imported outside specviz/ui: {outside}"


def test_the_checks_catch_a_missing_arrow_and_a_circle():
    """The parser and the circle finder on a map made up here, so a broken parser cannot pass silently."""
    text = f"{SECTION}\n\n- `ui` → `serve`, `engine`\n- `serve` → `engine`\n- `engine` → nothing; `x` → `ui`\n\n## Next\n"
    arrows = readme_map(text)
    assert arrows == {"ui": {"serve", "engine"}, "serve": {"engine"}, "engine": set(), "x": {"ui"}}
    assert circle(arrows) == []
    arrows["engine"] = {"ui"}
    found = circle(arrows)
    assert len(found) >= 3 and found[0] == found[-1] and {"ui", "engine"} <= set(found), found
