"""Which English text each Persian string was written against, so Persian never falls behind silently.

`fa.sources.json`, beside `fa.toml`, maps every key to a short hash of the English string (`en.toml`) the
Persian was last written or checked against. Teachers edit `fa.toml` and never touch this file; engineers
record the new hashes after updating the Persian of some keys:

    python -m specviz.lessons.sync KEY [KEY ...]      # keys or patterns: chapter.frontier.* or 'errors.vllm.*'
    python -m specviz.lessons.sync --new              # every key not recorded yet (keys you have just added)
    python -m specviz.lessons.sync --check            # what is behind; exit status 1 if anything is

tests/test_fa_drift.py fails, naming the keys, while an English string differs from the one its Persian
was recorded against, or a key has no Persian or no record.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

DIR = Path(__file__).resolve().parent
SIDECAR = DIR / "fa.sources.json"
COMMAND = "python -m specviz.lessons.sync"


def flat(table: dict, prefix: str = "") -> dict[str, str]:
    """Every string of a lesson table by its dotted key."""
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        elif isinstance(value, str):
            out[f"{prefix}{key}"] = value
    return out


def source_hash(english: str) -> str:
    """A short hash of an English string; rewrapping its lines or spacing does not change it."""
    return hashlib.sha256(" ".join(english.split()).encode("utf-8")).hexdigest()[:12]


def read_lang(lang: str, directory: Path = DIR) -> dict[str, str]:
    with open(directory / f"{lang}.toml", "rb") as f:
        return flat(tomllib.load(f))


def read_sidecar(path: Path = SIDECAR) -> dict[str, str]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def write_sidecar(record: dict[str, str], path: Path = SIDECAR) -> None:
    path.write_text(json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Drift:
    changed: list[str]        # English changed since its Persian was recorded
    no_persian: list[str]     # an English key with no Persian string
    unrecorded: list[str]     # a key with no record in the sidecar
    orphaned: list[str]       # a record for a key English no longer has

    def __bool__(self) -> bool:
        return bool(self.changed or self.no_persian or self.unrecorded or self.orphaned)

    def report(self) -> str:
        lines = []
        if self.changed:
            lines.append("English changed since its Persian was written (update the Persian in fa.toml, then run "
                         f"`{COMMAND} KEY...`): " + ", ".join(self.changed))
        if self.no_persian:
            lines.append("no Persian in fa.toml for: " + ", ".join(self.no_persian))
        if self.unrecorded:
            lines.append(f"no record in fa.sources.json (after writing their Persian, run `{COMMAND} --new`): "
                         + ", ".join(self.unrecorded))
        if self.orphaned:
            lines.append(f"records for keys English no longer has (any `{COMMAND}` run drops them): "
                         + ", ".join(self.orphaned))
        return "\n".join(lines)


def drift(en: dict[str, str], fa: dict[str, str], record: dict[str, str]) -> Drift:
    """What of the Persian is behind the English, by key (each list sorted)."""
    return Drift(changed=sorted(k for k in en if k in record and record[k] != source_hash(en[k])),
                 no_persian=sorted(k for k in en if k not in fa),
                 unrecorded=sorted(k for k in en if k not in record),
                 orphaned=sorted(k for k in record if k not in en))


def matching(patterns: list[str], keys: list[str]) -> tuple[list[str], list[str]]:
    """(keys matched by the patterns, patterns that matched nothing). A pattern is a key or a glob."""
    found, unmatched = [], []
    for pattern in patterns:
        hits = [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
        found += [k for k in hits if k not in found]
        if not hits:
            unmatched.append(pattern)
    return found, unmatched


def record_keys(keys: list[str], en: dict[str, str], fa: dict[str, str], record: dict[str, str]) -> dict[str, str]:
    """The sidecar with `keys` recorded against the current English (records of removed keys dropped)."""
    out = {k: v for k, v in record.items() if k in en}
    out.update({k: source_hash(en[k]) for k in keys if k in fa})
    return out


def main(argv: list[str] | None = None, directory: Path = DIR) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Record that the Persian of these keys matches "
                                     "the current English (after updating it in fa.toml).")
    parser.add_argument("keys", nargs="*", help="keys or glob patterns (chapter.frontier.*)")
    parser.add_argument("--new", action="store_true", help="every key that has no record yet")
    parser.add_argument("--all-current", action="store_true",
                        help="every key: only when the whole of fa.toml has been checked against en.toml")
    parser.add_argument("--check", action="store_true", help="list what is behind and exit 1 if anything is")
    args = parser.parse_args(argv)
    sidecar = directory / SIDECAR.name
    en, fa, record = read_lang("en", directory), read_lang("fa", directory), read_sidecar(sidecar)
    if args.check:
        found = drift(en, fa, record)
        print(found.report() if found else "Persian is current with English for every key.")
        return 1 if found else 0
    if not (args.keys or args.new or args.all_current):
        parser.error("name the keys whose Persian you updated, or use --new, --all-current or --check")
    keys, unmatched = matching(args.keys, list(en))
    if unmatched:
        print(f"no English key matches: {', '.join(unmatched)}; nothing recorded", file=sys.stderr)
        return 2
    if args.new:
        keys += [k for k in en if k not in record and k not in keys]
    if args.all_current:
        keys = list(en)
    lacking = [k for k in keys if k not in fa]
    if lacking:
        print(f"write the Persian first, fa.toml has no: {', '.join(lacking)}; nothing recorded", file=sys.stderr)
        return 2
    write_sidecar(record_keys(keys, en, fa, record), sidecar)
    print(f"recorded {len(keys)} key(s) in {sidecar.name}: " + (", ".join(keys) if len(keys) <= 12 else "…"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
