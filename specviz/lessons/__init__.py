"""Lesson text per language, as data a teacher edits without touching code.

One TOML file per language (`en.toml`, `fa.toml`) beside this module, with the same keys in both
(tests/test_lessons.py checks it). Keys are dotted paths into the TOML tables: `app.title`,
`chapter.race.conclusion_faster`, `policies.adaptive`, `errors.prompt_too_long`.

Templates use str.format named fields (`{speedup:.2f}`); callers may pass more values than a template
uses, so a UI can hand every measured number of a chapter to whichever conclusion variant applies.
Nothing here raises at run time: a key missing in one language falls back to English, a key missing
everywhere comes back as the key itself, and a value that is missing or does not fit its format is
shown as best it can be.
"""
from __future__ import annotations

import copy
import string
import tomllib
from functools import lru_cache
from pathlib import Path

LANGS = ("en", "fa")
DEFAULT_LANG = "en"
RTL_LANGS = frozenset({"fa"})
# The order of the argument (SEED-NOTES): more FLOPs yet faster → the race → decode is memory-bound →
# breadth ≈ depth → the price → when it hurts → vLLM's answer and beyond. Keys of the [chapter.*] tables.
CHAPTERS = ("intro", "race", "knee", "breadth_depth", "ledger", "sweep", "policies")

_DIR = Path(__file__).resolve().parent
# Unicode left-to-right isolate … pop directional isolate: keeps a filled-in number, token or name
# left-to-right inside a right-to-left sentence, in plain text as well as in HTML/Markdown.
LRI, PDI = "\u2066", "\u2069"


@lru_cache(maxsize=None)
def _load(lang: str) -> dict:
    if lang not in LANGS:
        lang = DEFAULT_LANG
    with open(_DIR / f"{lang}.toml", "rb") as f:
        return tomllib.load(f)


def load(lang: str) -> dict:
    """The whole lesson of one language as nested dicts (a copy: change it freely)."""
    return copy.deepcopy(_load(lang))


def direction(lang: str) -> str:
    """"rtl" for right-to-left languages (Persian), else "ltr"."""
    return "rtl" if lang in RTL_LANGS else "ltr"


def _lookup(table: dict, key: str):
    node = table
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, str) else None


def template(lang: str, key: str) -> str:
    """The raw template for `key`: this language, else English, else the key itself."""
    for source in (lang, DEFAULT_LANG):
        try:
            found = _lookup(_load(source), key)
        except (OSError, tomllib.TOMLDecodeError):
            found = None
        if found is not None:
            return found
    return key


class _Missing:
    """Stands in for a value the caller did not pass: shows the placeholder instead of raising."""

    def __init__(self, name: str):
        self.name = name

    def __format__(self, spec: str) -> str:
        return "{" + self.name + "}"


class _Formatter(string.Formatter):
    def __init__(self, wrap=None):
        self.wrap = wrap

    def get_value(self, key, args, kwargs):
        if isinstance(key, int):
            return args[key] if key < len(args) else _Missing(str(key))
        return kwargs[key] if key in kwargs else _Missing(key)

    def convert_field(self, value, conversion):
        if isinstance(value, _Missing):
            return value
        return super().convert_field(value, conversion)

    def format_field(self, value, format_spec):
        try:
            out = super().format_field(value, format_spec)
        except (ValueError, TypeError):      # e.g. a string where the template expects {x:.2f}
            out = str(value)
        return self.wrap(out) if self.wrap else out


def fill(template_text: str, values: dict, wrap=None) -> str:
    """Format a template with named values; never raises (a broken template comes back unformatted).
    `wrap`, if given, is applied to each filled-in field."""
    try:
        return _Formatter(wrap).vformat(template_text, (), values)
    except (ValueError, IndexError, KeyError, AttributeError):
        return template_text


def text(lang: str, key: str, /, **values) -> str:
    """Lesson text for `key` in `lang`, with `{placeholders}` filled from `values`."""
    return fill(template(lang, key), values)


def text_bidi(lang: str, key: str, /, **values) -> str:
    """Like `text`, but every filled-in value is wrapped in LRI…PDI so numbers, code and tokens stay
    left-to-right inside right-to-left sentences (harmless in English)."""
    return fill(template(lang, key), values, wrap=lambda s: LRI + s + PDI)
