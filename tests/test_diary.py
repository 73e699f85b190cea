"""Comments say why; measurement history belongs in git. At most MAX_DIARY diary lines in specviz/.

A diary line is a comment line or a docstring line (in .py; a comment line in .c) that
- names a machine: EPYC, Zen (Zen 4, Zen 5), Xeon;
- names a date ("3 Dec", "4 December", "Dec 3", "2026-12-04") or a work session by its place ("fifth
  session", "the last session");
- or gives a figure that moved: "0.70 → 0.31", "77 -> 41 µs", "now 0.31", "was 512", "(was …)",
  "before 1.2".
A figure that explains a choice stays welcome ("a token more costs 1.3 ms, so …"); naming the machine, the
day and what it used to be is what the commit message is for."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specviz"
MAX_DIARY = 10
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
ORDINAL = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|last|previous|earlier"
FIGURE = r"[~≈]?\d[\d.,]*"
DIARY = {
    "machine": re.compile(r"\b(EPYC|Zen(?: ?\d)?|Xeon)\b"),
    "date": re.compile(rf"\b\d{{1,2}}(?:[–-]\d{{1,2}})? (?:{MONTHS})[a-z]*\b|\b(?:{MONTHS})[a-z]* \d{{1,2}}\b"
                       r"|\b20\d\d-\d\d-\d\d\b"),
    "session": re.compile(rf"\b(?:{ORDINAL}) (?:work )?sessions?\b", re.I),
    # "a → b" between two figures (not "135M → 360M" or a schedule "1-1:4"), "now 3", "was 3", "(was", "before 3"
    "moved": re.compile(rf"{FIGURE}(?:[–-]\d[\d.]*)?\s*(?:ms|µs|s|%|×|x|GB/s|tok/s)?\s*(?:→|->)\s*{FIGURE}"
                        r"(?![\d.]*(?:[A-Za-z]\b|-\d+:))"
                        rf"|\b(?:was|were|now)\s+{FIGURE}|\(was\b|\bbefore:?\s+{FIGURE}"),
}


def comment_lines(path: Path) -> dict[int, str]:
    """{line number: text} of every comment line and docstring line in one source file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".c":
        out, inside = {}, False
        for n, line in enumerate(text.splitlines(), 1):
            opens = "/*" in line
            if inside or opens or "//" in line:
                out[n] = line if inside or opens else line[line.index("//"):]
            if opens and "*/" not in line.split("/*", 1)[1]:
                inside = True
            elif inside and "*/" in line:
                inside = False
        return out
    out = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT}
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update({n: lines[n - 1] for n in range(first.lineno, first.end_lineno + 1)})
    return out


def diary_kinds(line: str) -> list[str]:
    return [kind for kind, rx in DIARY.items() if rx.search(line)]


def diary_lines(root: Path = PKG) -> list[tuple[str, int, list[str], str]]:
    """(path, line, kinds, text) for every diary line under root."""
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c")):
        for n, text in sorted(comment_lines(path).items()):
            kinds = diary_kinds(text)
            if kinds:
                hits.append((str(path.relative_to(ROOT)), n, kinds, text.strip()))
    return hits


@pytest.mark.parametrize("line", [
    "# took 0.70 ms for 64 rows, now 0.31",
    "# one prefill per prompt: 100 → 142 tok/s",
    "# 31-33 → 35 GB/s at one row",
    "(AMD EPYC Zen 4, 3 Dec, n-gram, grounded class)",
    "# measured on an Intel Xeon with AVX-512",
    "# the frontier's cells run 1024 tokens (was 512)",
    "# read 0.96 in the fifth session",
    "# measured 2026-12-04 on two cores",
])
def test_a_diary_line_is_caught(line):
    assert diary_kinds(line), line


@pytest.mark.parametrize("line", [
    "# a token more in every row costs 1.3 ms, so a step less must save more than that",
    '# English ("SmolLM2 135M → 360M (CPU-friendly)") is the value the API takes',
    '"""Users 1,4,16 with depths 2,4 → 1-1:4,2-16:2."""',
    "# rows now at depth 0 feed the draft model only when they draft again",
    "# per session: the last Run's chart data",
    "# Leviathan et al. 2023: accept with probability min(1, p/q)",
])
def test_a_why_line_is_not(line):
    assert not diary_kinds(line), (line, diary_kinds(line))


def test_comment_lines_reads_comments_and_docstrings_only(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Module doc.\nsecond line (EPYC)."""\nx = "EPYC"  # why: 3 Dec\n\n\ndef f():\n'
                   '    """Doc."""\n    return "Xeon"\n', encoding="utf-8")
    assert sorted(comment_lines(src)) == [1, 2, 3, 7]
    c = tmp_path / "k.c"
    c.write_text("int a; // EPYC\n/* one\n * two */\nint b = 0;\n/* three */ int c;\n", encoding="utf-8")
    assert sorted(comment_lines(c)) == [1, 2, 3, 5]


def test_at_most_ten_diary_lines_in_specviz():
    hits = diary_lines()
    per_file = Counter(h[0] for h in hits)
    report = "\n".join(f"{n:3d}  {f}" for f, n in per_file.most_common())
    listing = "\n".join(f"{f}:{n} [{', '.join(k)}] {t[:110]}" for f, n, k, t in hits)
    assert len(hits) <= MAX_DIARY, (
        f"{len(hits)} diary lines in specviz/ (at most {MAX_DIARY}); rewrite them to say why:\n{listing}\n{report}")
