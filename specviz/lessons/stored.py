"""A `Said` as plain JSON and back, so a file saved on one page (a recording) is shown later in another
reader's language. Reading checks everything: the file may come from anyone."""
from __future__ import annotations

import math

from specviz.lessons import DEFAULT_LANG, Key, Listed, Said, template

# a forward path's label nests six deep: shown → in_c → weights → a list of layout_rows → its rows → a row key
MAX_NESTING = 8
MAX_ITEMS = 16        # values of one sentence, items of one list
MAX_TEXT = 200
MAX_NUMBER = 1e15


class NotSaid(ValueError):
    """Stored data that is not a sentence this version can say; the message names what is wrong."""


class TooMany(NotSaid):
    """The file's budget of stored values ran out: a size limit, not an unknown sentence."""


class Budget:
    """Values read so far across a file, against its limit: many small sentences cost as much as one big."""

    def __init__(self, limit: int):
        self.left = limit

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TooMany("too many stored sentence values")


def to_plain(value):
    """`value` as JSON data: a Said as {"said": key, "values": {…}}, a Key as {"key": …}, a Listed as
    {"listed": […]}, a number or text as itself."""
    if isinstance(value, Said):
        return {"said": value.key, "values": {k: to_plain(v) for k, v in value.values.items()}}
    if isinstance(value, Key):
        return {"key": str(value)}
    if isinstance(value, Listed):
        return {"listed": [to_plain(i) for i in value.items]}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def from_plain(data, prefixes: tuple[str, ...], budget: Budget):
    """The value `to_plain` wrote, its keys among `prefixes` (the sentences such a file stores); NotSaid
    where it is not of that shape, or `budget` runs out."""
    return _read(data, prefixes, budget, 0)


def _read(data, prefixes, budget: Budget, nesting: int):
    budget.take()
    if nesting > MAX_NESTING:
        raise NotSaid(f"nested deeper than {MAX_NESTING}")
    if data is None or isinstance(data, bool):
        return data
    if isinstance(data, (int, float)):
        return _number(data)
    if isinstance(data, str):
        return _text(data)
    if not isinstance(data, dict):
        raise NotSaid("a sentence must be text, a number or one of said, key, listed")
    if set(data) == {"said", "values"} and isinstance(data["values"], dict) and len(data["values"]) <= MAX_ITEMS:
        values = {_name(k): _read(v, prefixes, budget, nesting + 1) for k, v in data["values"].items()}
        try:        # a Said renders its English as it is made: a value its format cannot take fails here
            return Said(_known(data["said"], prefixes), **values)
        except (ValueError, TypeError, OverflowError) as exc:
            raise NotSaid(f"a sentence this version cannot say ({type(exc).__name__})") from None
    if set(data) == {"key"}:
        return Key(_known(data["key"], prefixes))
    if set(data) == {"listed"} and isinstance(data["listed"], list) and len(data["listed"]) <= MAX_ITEMS:
        return Listed(_read(i, prefixes, budget, nesting + 1) for i in data["listed"])
    raise NotSaid("a sentence must be text, a number or one of said, key, listed")


def _number(value):
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise NotSaid(f"a number must be finite and at most {MAX_NUMBER:g}")
    return value


def _text(text: str) -> str:
    if len(text) > MAX_TEXT:
        raise NotSaid(f"a text longer than {MAX_TEXT} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotSaid("a text with a lone surrogate") from None
    return text


def _known(key, prefixes) -> str:
    if not (isinstance(key, str) and len(key) <= 100 and key.startswith(prefixes)
            and template(DEFAULT_LANG, key) != key):
        raise NotSaid("a sentence key this version does not store")
    return key


def _name(name) -> str:
    if not (isinstance(name, str) and name.isidentifier() and len(name) <= 40):
        raise NotSaid("a value's name must be a short identifier")
    return name
