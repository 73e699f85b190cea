"""A `Said` as plain JSON and back, so a file saved on one page (a recording) is shown later in another
reader's language. Reading checks everything: the file may come from anyone."""
from __future__ import annotations

from specviz.lessons import DEFAULT_LANG, Key, Listed, Said, template

MAX_NESTING = 6       # a forward path's label nests four deep (shown → weights → layouts → rows)
MAX_ITEMS = 16
MAX_TEXT = 200


class NotSaid(ValueError):
    """Stored data that is not a sentence this version can say; the message names what is wrong."""


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


def from_plain(data, nesting: int = 0):
    """The value `to_plain` wrote; NotSaid where a key is unknown here or the data is not of its shape."""
    if nesting > MAX_NESTING:
        raise NotSaid(f"nested deeper than {MAX_NESTING}")
    if data is None or isinstance(data, (bool, int, float)):
        return data
    if isinstance(data, str):
        return _short(data)
    if not isinstance(data, dict) or len(data) > 2:
        raise NotSaid("a sentence must be text, a number or one of said, key, listed")
    if set(data) == {"said", "values"}:
        values = data["values"]
        if not isinstance(values, dict) or len(values) > MAX_ITEMS:
            raise NotSaid("a sentence's values must be a short mapping")
        return Said(_known(data["said"]), **{_name(k): from_plain(v, nesting + 1) for k, v in values.items()})
    if set(data) == {"key"}:
        return Key(_known(data["key"]))
    if set(data) == {"listed"} and isinstance(data["listed"], list) and len(data["listed"]) <= MAX_ITEMS:
        return Listed(from_plain(i, nesting + 1) for i in data["listed"])
    raise NotSaid("a sentence must be text, a number or one of said, key, listed")


def _short(text: str) -> str:
    if len(text) > MAX_TEXT:
        raise NotSaid(f"a text longer than {MAX_TEXT} characters")
    return text


def _known(key) -> str:
    if not isinstance(key, str) or len(key) > 100 or template(DEFAULT_LANG, key) == key:
        raise NotSaid("a sentence key this version does not know")
    return key


def _name(name) -> str:
    if not (isinstance(name, str) and name.isidentifier() and len(name) <= 40):
        raise NotSaid("a value's name must be a short identifier")
    return name
