"""Deep links: the URL's parameters restore a page's state (tab, chapter, pair, prompt, batch, depth,
policy, acceptance, lang), and what a link asks for that this server cannot give is said in one sentence,
not dropped in silence (a hand-edited link, one from another server with other pairs or limits)."""
from __future__ import annotations

import math

import gradio as gr

from specviz import lessons
from specviz.chapters import KEYS
from specviz.engine.policies import POLICY_NAMES

TAB_IDS = ("lesson", "playground", "whatif")


def query(request) -> dict:
    return dict(getattr(request, "query_params", None) or {})


def _number(raw, lo, hi, kind=int):
    """The parameter as a number inside [lo, hi], else None."""
    try:
        v = float(str(raw).strip())
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v) or (kind is int and v != int(v)):
        return None
    v = kind(v)
    return v if lo <= v <= hi else None


def _pair_labels(app) -> list[str]:
    return [c.label for c in app.choices + getattr(app, "dials", [])]


def restore(app, request, lang: str) -> list:
    """Component updates from the URL's deep-link parameters, in `build_blocks`' order: tabs, chapter, pair,
    prompt, batch, depth, policy, acceptance, lang (anything absent or invalid is left alone: `notice` says
    so; `acceptance` also ticks the lesson's dials: ui.lesson.restore_dials)."""
    q = query(request)
    limits = app.limits

    def num(name, lo, hi, kind=int):
        v = _number(q.get(name), lo, hi, kind)
        return gr.skip() if v is None else gr.update(value=v)
    return [gr.update(selected=q["tab"]) if q.get("tab") in TAB_IDS else gr.skip(),
            gr.update(value=q["chapter"]) if q.get("chapter") in KEYS else gr.skip(),
            gr.update(value=q["pair"]) if q.get("pair") in _pair_labels(app) else gr.skip(),
            gr.update(value=q["prompt"][: limits.max_prompt_chars]) if q.get("prompt") else gr.skip(),
            num("batch", 1, limits.max_rows_per_user), num("depth", 0, limits.max_depth),
            gr.update(value=q["policy"]) if q.get("policy") in POLICY_NAMES else gr.skip(),
            num("acceptance", 0.0, 1.0, float), gr.update(value=lang)]


def ignored(app, q: dict) -> list[lessons.Said]:
    """What the link asked for and the page left out, each with what it should have been. An empty value
    (the copied link writes `chapter=` outside the lesson) asks for nothing."""
    limits, out = app.limits, []

    def want(name, ok, why):
        raw = q.get(name)
        if raw not in (None, "") and not ok(raw):
            out.append(lessons.Said("app.link_item", name=name, value=lessons.quoted(str(raw)[:40]), want=why))
    whole = lambda lo, hi: lessons.Said("app.link_want_whole", lo=lo, hi=hi)      # noqa: E731
    one_of = lambda names: lessons.Said("app.link_want_one_of", names=", ".join(names))   # noqa: E731
    want("tab", lambda v: v in TAB_IDS, one_of(TAB_IDS))
    want("chapter", lambda v: v in KEYS, one_of(KEYS))
    want("pair", lambda v: v in _pair_labels(app), lessons.Said("app.link_want_pair"))
    want("batch", lambda v: _number(v, 1, limits.max_rows_per_user) is not None, whole(1, limits.max_rows_per_user))
    want("depth", lambda v: _number(v, 0, limits.max_depth) is not None, whole(0, limits.max_depth))
    want("policy", lambda v: v in POLICY_NAMES, one_of(POLICY_NAMES))
    want("acceptance", lambda v: _number(v, 0.0, 1.0, float) is not None, lessons.Said("app.link_want_acceptance"))
    want("lang", lambda v: v in lessons.LANGS, one_of(lessons.LANGS))
    prompt = q.get("prompt") or ""
    if len(prompt) > limits.max_prompt_chars:
        out.append(lessons.Said("app.link_prompt_cut", limit=limits.max_prompt_chars))
    return out


def notice(app, request, lang: str) -> str | None:
    """One sentence naming what the link asked for and did not get, in `lang`; None for a link that is fine."""
    items = ignored(app, query(request))
    if not items:
        return None
    joined = lessons.text(lang, "app.link_separator").join(lessons.say(lang, i) for i in items)
    return lessons.text(lang, "app.link_ignored", items=joined)


def link_notice(app, lang_of):
    """The page-load handler that shows `notice` as a warning (a queued event: gradio shows a warning only
    from the queue)."""
    def on_loaded(request: gr.Request):
        lang = lang_of(getattr(request, "session_hash", None))
        said = notice(app, request, lang)
        if said:
            gr.Warning(said, duration=20, title=lessons.text(lang, "app.warning_title"))
    return on_loaded
