"""Every command line in the README, the guide and BENCHMARKS uses flags its command has.

A command is `python -m specviz SUB …` (any python, e.g. `.venv/bin/python`), the shorthand `specviz SUB …`,
a code span that starts with a subcommand and a flag (`frontier --draft ngram …`), or the app
(`python app.py …`, `bash scripts/start …`, whose flags are app.py's). Each subcommand's `--help` runs once;
every `--flag` the docs give it must appear there. Links inside the docs must reach a heading, and the
guide's constants (FREE_SHARE, CELL_TOKENS, the upload delay, test_doors' bounds) and its list of the
commands that take --compile follow the code."""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/GUIDE.md", "docs/BENCHMARKS.md"]

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")                             # an inline code span (it may cross line breaks)
PY_SPECVIZ = r"(?:\S*python\S*\s+-m\s+specviz|(?<![\w/.-])specviz)\s+(?P<sub>[a-z][\w-]*)"
APP = r"(?P<app>\S*python\S*\s+app\.py|bash\s+scripts/start)(?![\w.-])"
COMMAND = re.compile(f"{PY_SPECVIZ}|{APP}")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
LINK = re.compile(r"\]\((?P<path>[^)#\s]*)#(?P<anchor>[^)\s]+)\)")


def segments(text: str) -> list[str]:
    """The code in a markdown text: each line of a fenced block (backslash continuations joined, a shell
    comment cut off) and each inline code span."""
    out = []
    for block in FENCE.findall(text):
        body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
        out += [re.split(r"\s#\s", line)[0] for line in body.splitlines()]
    out += [m.group(1).replace("\n", " ") for m in SPAN.finditer(FENCE.sub("", text)) if "\n\n" not in m.group(1)]
    return out


@cache
def subcommands() -> tuple[str, ...]:
    from specviz.__main__ import build_parser

    parser = build_parser()
    return tuple(next(a for a in parser._actions if a.dest == "command").choices)


def commands(text: str) -> list[tuple[str, list[str], str]]:
    """(command, its flags, the line) for every command in a markdown text; command is a subcommand name,
    "app", or "?SUB" for a subcommand that does not exist."""
    found = []
    starts = re.compile(rf"^(?P<bare>{'|'.join(map(re.escape, subcommands()))})\s+--")
    for seg in segments(text):
        hits = list(COMMAND.finditer(seg))
        bare = starts.match(seg.strip())
        if bare and not hits:
            found.append((bare.group("bare"), FLAG.findall(seg), seg.strip()))
        for i, m in enumerate(hits):
            rest = seg[m.end():hits[i + 1].start() if i + 1 < len(hits) else None]
            rest = re.split(r"[;|]|&&", rest)[0]
            sub = "app" if m.group("app") else m.group("sub")
            if sub != "app" and sub not in subcommands():
                sub = "?" + sub
            found.append((sub, FLAG.findall(rest), seg.strip()))
    return found


@cache
def help_text(command: str) -> str:
    """`--help` of one subcommand (in this process, through the CLI's own parser), or of app.py."""
    if command == "app":
        done = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout
    from specviz.__main__ import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            build_parser().parse_args([command, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, f"{command} --help exited {exc.code}"
    return out.getvalue()


def unknown_flags(text: str, where: str) -> list[str]:
    problems = []
    for command, flags, line in commands(text):
        if command.startswith("?"):
            problems.append(f"{where}: `specviz {command[1:]}` is no subcommand: {line[:120]}")
            continue
        helped = help_text(command)
        for flag in flags:
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helped):
                name = "app.py" if command == "app" else f"specviz {command}"
                problems.append(f"{where}: {name} has no {flag}: {line[:160]}")
    return problems


def slug(heading: str) -> str:
    """A heading's anchor as GitHub (and Hugging Face) make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_flag_the_docs_use_exists():
    problems = []
    for doc in DOCS:
        problems += unknown_flags((ROOT / doc).read_text(encoding="utf-8"), doc)
    assert not problems, "\n".join(problems)


def test_the_docs_hold_the_commands_this_test_reads():
    """The extractor finds the docs' commands, so an empty match cannot pass for a clean one."""
    counts = {doc: commands((ROOT / doc).read_text(encoding="utf-8")) for doc in DOCS}
    assert len(counts["README.md"]) >= 10 and len(counts["docs/GUIDE.md"]) >= 10, counts
    assert len(counts["docs/BENCHMARKS.md"]) >= 20
    used = {c for found in counts.values() for c, _, _ in found}
    assert {"generate", "bench-hf", "frontier", "whatif", "bench-vllm", "app"} <= used, used


def test_a_flag_that_does_not_exist_is_caught():
    text = ("Run `specviz bench-hf --draft ngram --no-such-flag 3`, `python app.py --port 1 --bogus`,\n"
            "`frontier --users 1 --nope`, `python -m specviz nosuch --json`.\n\n"
            "```bash\n.venv/bin/python -m specviz whatif --gpu H200 \\\n    --json --imaginary  # --comment-flag\n```\n")
    problems = unknown_flags(text, "sample")
    assert len(problems) == 5, problems
    for bad in ("bench-hf has no --no-such-flag", "app.py has no --bogus", "frontier has no --nope",
                "`specviz nosuch` is no subcommand", "whatif has no --imaginary"):
        assert any(bad in p for p in problems), (bad, problems)


def test_links_between_the_docs_reach_a_heading():
    problems = []
    for doc in DOCS:
        here = ROOT / doc
        for m in LINK.finditer(here.read_text(encoding="utf-8")):
            target = (here.parent / m.group("path")).resolve() if m.group("path") else here
            if target.suffix != ".md" or not target.exists():
                continue
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)}
            if m.group("anchor") not in headings:
                problems.append(f"{doc}: #{m.group('anchor')} is no heading of {target.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)


def code_constant(name: str) -> str:
    """The value a constant is given somewhere in specviz/ (`NAME = value` at the start of a line)."""
    for path in sorted((ROOT / "specviz").rglob("*.py")):
        m = re.search(rf"^{name}\s*=\s*([^\s#]+)", path.read_text(encoding="utf-8"), re.M)
        if m:
            return m.group(1)
    raise AssertionError(f"{name} is no longer set in specviz/: update this test and the guide")


def test_the_guides_numbers_are_the_codes():
    guide = (ROOT / "docs/GUIDE.md").read_text(encoding="utf-8")
    doors = (ROOT / "tests/test_doors.py").read_text(encoding="utf-8")
    free = round(float(code_constant("FREE_SHARE")) * 100)
    cell = int(code_constant("CELL_TOKENS"))
    keep = re.search(r'SPECVIZ_UPLOAD_KEEP_S", ""\) or ([\d.]+)', (ROOT / "specviz/ui/runs.py").read_text())
    calls = re.search(r'CALLS\["n"\] >= (\d+)', doors)
    mib = re.search(r"MEMORY_BOUND = (\d+) \* 2\*\*20", doors)
    assert keep and calls and mib, "the code these statements describe moved: update this test and the guide"
    wanted = {f"at most {free} % more,\n`FREE_SHARE`": "FREE_SHARE", f"{cell} tokens (`CELL_TOKENS`": "CELL_TOKENS",
              f"`SPECVIZ_UPLOAD_KEEP_S` seconds (default {float(keep.group(1)):g})": "SPECVIZ_UPLOAD_KEEP_S",
              f"at least {calls.group(1)} such calls": "test_doors' calls",
              f"{mib.group(1)} MiB or more": "test_doors' memory bound"}
    missing = [f"{what}: the guide should say {text!r}" for text, what in wanted.items()
               if text.replace("\n", " ") not in guide.replace("\n", " ")]
    assert not missing, "\n".join(missing)


def test_the_guide_says_which_commands_take_compile():
    """The guide's sentence "`a`, `b` … take `--compile` … `c` … take none" against each command's --help."""
    guide = (ROOT / "docs/GUIDE.md").read_text(encoding="utf-8").replace("\n", " ")
    m = re.search(r"((?:`[\w-]+`,? (?:and )?)+)take `--compile`(.*?)take none", guide)
    assert m, "the guide's sentence on which commands take --compile is gone"
    said_with = set(re.findall(r"`([\w-]+)`", m.group(1)))
    said_without = set(re.findall(r"`([\w-]+)`", m.group(2))) & set(subcommands())
    has = {c for c in subcommands() if re.search(r"(?<![\w-])--compile(?![\w-])", help_text(c))}
    assert said_with == has, (said_with, has)
    assert said_without == set(subcommands()) - has, (said_without, set(subcommands()) - has)


def test_the_guides_settings_table_names_every_variable_the_code_reads():
    """Each "SPECVIZ_…" string in specviz/ and app.py (what the code looks up) has a row in the guide's
    settings table, and each row names a variable the code still reads."""
    guide = (ROOT / "docs/GUIDE.md").read_text(encoding="utf-8")
    table = guide.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = {v for line in table.splitlines() if line.startswith("| `")
            for v in re.findall(r"`(SPECVIZ_[A-Z0-9_]+)`", line.split("|")[1])}
    sources = [*(ROOT / "specviz").rglob("*.py"), ROOT / "app.py"]
    read = {v for p in sources for v in re.findall(r"[\"'](SPECVIZ_[A-Z0-9_]+)[\"']", p.read_text(encoding="utf-8"))}
    assert read, "no SPECVIZ_ variables found: the pattern above no longer matches the code"
    assert not read - rows, f"missing from the guide's settings table: {sorted(read - rows)}"
    tests_only = {v for v in rows - read if v.startswith("SPECVIZ_TEST_")}
    assert not rows - read - tests_only, f"the guide lists variables the code no longer reads: {sorted(rows - read - tests_only)}"
