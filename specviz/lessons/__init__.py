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
import re
import string
import tomllib
from functools import lru_cache
from pathlib import Path

LANGS = ("en", "fa")
DEFAULT_LANG = "en"
RTL_LANGS = frozenset({"fa"})

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
        out = _Formatter(wrap).vformat(template_text, (), values)
    except (ValueError, IndexError, KeyError, AttributeError):
        return template_text
    # "1.45×" reads as one number: a "×" right after an isolated number goes inside its isolate, or a
    # right-to-left sentence shows it on the number's other side ("×1.45")
    # (the same for a percent sign written after the field: "12%", not "%12")
    if wrap is None:
        return out
    return out.replace(PDI + "×", "×" + PDI).replace(PDI + "%", "%" + PDI)


def quoted(value) -> str:
    """A name the reader typed, ready to sit inside the template's quotes ('…' in English, «…» in Persian):
    control characters and backslashes escaped as `repr` shows them, without repr's own ASCII quotes."""
    text = repr(str(value))
    return text[1:-1]


ARABIC_SCRIPT = re.compile(r"[\u0600-\u06FF\uFB50-\uFDFF\uFE70-\uFEFF]")
RLI = "\u2067"


def isolate_ltr(value: str) -> str:
    """A filled-in number, name, token or code kept left-to-right inside a right-to-left sentence. A value
    that is itself Persian text (a nested sentence, a translated term) stays in the right-to-left flow:
    an LTR isolate would reverse its words."""
    return value if ARABIC_SCRIPT.search(value) else LRI + value + PDI


def isolate_rtl(value: str) -> str:
    """A whole Persian label made right-to-left where its container lays text out left-to-right
    (plotly's SVG text): otherwise "token در هر pass" reads with its words in reverse order. Each line of
    a label broken with plotly's <br> is isolated on its own (plotly lays every line out separately)."""
    if "<br>" in value:
        return "<br>".join(isolate_rtl(line) for line in value.split("<br>"))
    return RLI + value + PDI if ARABIC_SCRIPT.search(value) else value


def counted(lang: str, key: str, values: dict) -> str:
    """The template for `key`, or for `KEY_one` where the count `n` is 1 and the table has one: English
    writes "1 row", not "1 rows" (a language without plural nouns gives both keys the same text)."""
    n = values.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n == 1:
        one = template(lang, key + "_one")
        if one != key + "_one":
            return one
    return template(lang, key)


def text(lang: str, key: str, /, **values) -> str:
    """Lesson text for `key` in `lang`, with `{placeholders}` filled from `values` (a `Said` or `Key` value
    is shown in `lang` too)."""
    return fill(counted(lang, key, values), said_in(lang, values))


def text_bidi(lang: str, key: str, /, **values) -> str:
    """Like `text`, but every filled-in value is wrapped in LRI…PDI so numbers, code and tokens stay
    left-to-right inside right-to-left sentences (harmless in English). Persian values stay as they are."""
    return fill(counted(lang, key, values), said_in(lang, values), wrap=isolate_ltr)


def policy_label(lang: str, name: str) -> str:
    """A depth policy's name for readers ([policy_label]); the API, the CLI and the radio's values keep
    the English name. A policy without a label is shown by its name."""
    key = f"policy_label.{name}"
    return text(lang, key) if template(lang, key) != key else str(name)


def said_in(lang: str, values: dict) -> dict:
    """A sentence's values as `lang` shows them: Saids and Keys in `lang`, and a `device`'s cores (only
    that field: a prompt or a model typed as "… 4 cores" is echoed as typed)."""
    return {k: (say(lang, v) if isinstance(v, (Key, Said, Listed)) else
                machine(lang, v) if k == "device" and isinstance(v, str) else v)
            for k, v in values.items()}


MACHINE = re.compile(r"\s*(\(?)(\d{1,5}) cores?(\)?)\Z")     # "cpu: 2 cores", "AMD EPYC (2 cores)"


def machine(lang: str, device: str) -> str:
    """A machine's name as device_name() and the recordings write it, with its cores in `lang` (a Persian
    page read "cpu: 2 cores"); English, and any other value, as it is."""
    m = MACHINE.search(device) if lang in RTL_LANGS and len(device) <= 200 else None
    if m is None or bool(m.group(1)) != bool(m.group(3)):
        return device
    cores = template(lang, "app.cores").format(n=int(m.group(2)))
    # the Latin part isolated on its own: the whole is right-to-left now (isolate_ltr keeps it so)
    name = device[:m.start()]
    # "AMD EPYC, 2 cores" (a heading's): the comma is the sentence's, not the Latin name's
    comma = "، " if name.endswith(",") else " "
    name = name.rstrip(",")
    return f"{isolate_ltr(name) + comma if name else ''}{m.group(1)}{cores}{m.group(3)}"


def chart_fill(template_text: str, values: dict) -> str:
    """Fill a chart label: in a Persian label the numbers are isolated left-to-right (plotly lays the
    whole label out left-to-right; `isolate_rtl` makes the label itself right-to-left)."""
    return fill(template_text, values, wrap=isolate_ltr if ARABIC_SCRIPT.search(template_text) else None)


# --- sentences made deep in the package, shown later in the reader's language --------------------------
class Key(str):
    """A lesson key given as the value of another sentence (a word such as "speculation depth"): shown in
    the language the sentence is shown in."""

    __slots__ = ()


class Said(str):
    """A sentence made where no reader is known (limits, policies, models, the scheduler): it *is* the
    English text (what the CLI, the logs and `str()` show) and remembers its lesson key and values, so a
    page renders it in its reader's language with `say(lang, ...)`. Values may be `Key`s or `Said`s."""

    def __new__(cls, key: str, /, **values) -> "Said":
        self = super().__new__(cls, _render(DEFAULT_LANG, key, values))
        self.key, self.values = key, values
        return self

    def __reduce__(self):          # across processes (a ZeroGPU worker) it stays a Said
        return (_said, (self.key, self.values))


def _said(key: str, values: dict) -> Said:
    return Said(key, **values)


class Listed(str):
    """Several values shown as one list (a value of a `Said`): its English is the items joined by ", ";
    a page shows each item in its language, joined by that language's separator (`app.list_separator`),
    names isolated left-to-right inside a right-to-left list."""

    def __new__(cls, items) -> "Listed":
        items = tuple(items)
        self = super().__new__(cls, ", ".join(str(i) for i in items))
        self.items = items
        return self

    def __reduce__(self):
        return (Listed, (self.items,))

    def shown(self, lang: str) -> str:
        parts = [say(lang, i) for i in self.items]
        if lang in RTL_LANGS:
            parts = [isolate_ltr(p) for p in parts]
        return template(lang, "app.list_separator").join(parts)


def _render(lang: str, key: str, values: dict) -> str:
    plain = said_in(lang, values)
    if lang in RTL_LANGS:
        return fill(counted(lang, key, values), plain, wrap=isolate_ltr)
    return fill(counted(lang, key, values), plain)


def say(lang: str, message) -> str:
    """A message in `lang`: a `Said` or `Key` in that language, an exception by its `Said` argument,
    anything else as its English text."""
    if isinstance(message, BaseException):
        message = message.args[0] if len(message.args) == 1 else str(message)
    if isinstance(message, Said):
        return _render(lang, message.key, message.values)
    if isinstance(message, Key):
        return text(lang, message)
    if isinstance(message, Listed):
        return message.shown(lang)
    return str(message)
