"""Deep links: the URL's parameters restore a page's state (tab, chapter, pair, prompt, batch, depth,
policy, acceptance, lang; the Playground's temperature and max_new; the What if? tab's knobs, EXTRA), and
what a link asks for that this server cannot give is said in one sentence, not dropped in silence (a
hand-edited link, one from another server with other pairs or limits)."""
from __future__ import annotations

import math

import gradio as gr

from specviz import lessons
from specviz.chapters import KEYS
from specviz.engine.policies import POLICY_NAMES
from specviz.hardware.presets import MODELS
from specviz.ui import whatif_views as wv

TAB_IDS = ("lesson", "playground", "whatif")
# after the nine first parameters, in `restore`'s order: the Playground's two settings read at a Run, then
# the What if? tab's knobs (whatif.build's components, in its order)
EXTRA = ("temperature", "max_new", "gpu", "target", "draft", "alpha", "context", "overhead", "model",
         "bandwidth", "flops")
WHATIF_KNOBS = frozenset(EXTRA[2:])


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


def _rules(app) -> dict:
    """Each parameter that sets a control: name → (its value as the control takes it, or None where the
    page cannot use it; what it should be). `restore` and `ignored` read the one table."""
    limits = app.limits
    pairs = _pair_labels(app)

    def choice(names):
        return lambda v: v if v in names else None

    def one_of(names):
        return lessons.Said("app.link_want_one_of", names=", ".join(names))

    def whole(lo, hi):
        return (lambda v: _number(v, lo, hi)), lessons.Said("app.link_want_whole", lo=lo, hi=hi)

    def real(lo, hi):
        return (lambda v: _number(v, lo, hi, float)), lessons.Said("app.link_want_number", lo=lo, hi=hi)
    gpus = [value for _, value in wv.gpu_options(lessons.DEFAULT_LANG)]
    drafts = sorted({d for target in MODELS for d in wv.draft_choices(target)})
    return {"tab": (choice(TAB_IDS), one_of(TAB_IDS)),
            "chapter": (choice(KEYS), one_of(KEYS)),
            "pair": (choice(pairs), lessons.Said("app.link_want_pair")),
            "batch": whole(1, limits.max_rows_per_user),
            "depth": whole(0, limits.max_depth),
            "policy": (choice(POLICY_NAMES), one_of(POLICY_NAMES)),
            "acceptance": (lambda v: _number(v, 0.0, 1.0, float), lessons.Said("app.link_want_acceptance")),
            "lang": (choice(lessons.LANGS), one_of(lessons.LANGS)),
            "temperature": real(0, limits.max_temperature),
            "max_new": whole(limits.min_new_tokens, limits.max_new_tokens),
            "gpu": (choice(gpus), lessons.Said("app.link_want_listed")),
            "target": (choice(list(MODELS)), lessons.Said("app.link_want_listed")),
            "draft": (choice(drafts), lessons.Said("app.link_want_listed")),
            "alpha": real(0, wv.ALPHA_MAX),
            "context": whole(1, wv.CONTEXT_MAX),
            "overhead": real(0, wv.OVERHEAD_MAX_MS),
            "model": (choice(wv.KINDS), one_of(wv.KINDS)),
            "bandwidth": real(*wv.BW_TBS),
            "flops": real(*wv.FLOPS_TFLOPS)}


def _asked(q: dict, name: str):
    """The parameter's value, or None: absent, or empty (the copied link writes `chapter=` outside the
    lesson), asks for nothing."""
    raw = q.get(name)
    return None if raw in (None, "") else raw


def _taken(q: dict, rules: dict, name: str):
    """The parameter's value as the page takes it, or None: absent, or refused by its rule."""
    raw = _asked(q, name)
    return None if raw is None else rules[name][0](raw)


def restore(app, request, lang: str) -> list:
    """Component updates from the URL's deep-link parameters, in `build_blocks`' order: tabs, chapter, pair,
    prompt, batch, depth, policy, acceptance, lang, then EXTRA (anything absent or invalid is left alone: `notice` says
    so; `acceptance` also ticks the lesson's dials: ui.lesson.restore_dials)."""
    q, rules = query(request), _rules(app)

    def update(name, attr="value"):
        v = _taken(q, rules, name)
        return gr.skip() if v is None else gr.update(**{attr: v})
    prompt = _asked(q, "prompt")
    return [update("tab", "selected"), update("chapter"), update("pair"),
            gr.update(value=prompt[: app.limits.max_prompt_chars]) if prompt else gr.skip(),
            update("batch"), update("depth"), update("policy"), update("acceptance"), gr.update(value=lang),
            *(_draft(q, rules, lang) if name == "draft" else update(name) for name in EXTRA)]


def _draft(q: dict, rules: dict, lang: str) -> dict:
    """The What if? draft with the list of the link's target, in one update: the page's load then computes
    the tab once (whatif.build's on_link), and gradio checks the draft against that list. A target alone
    brings its own EAGLE head, as picking it does (whatif_views.remap_draft)."""
    target, draft = _taken(q, rules, "target"), _taken(q, rules, "draft")
    listed = wv.draft_options(target or wv.DEFAULTS["target"], lang)
    if target is None and draft is None:
        return gr.update(choices=listed)
    target = target or wv.DEFAULTS["target"]
    return gr.update(choices=listed, value=wv.remap_draft(draft or wv.DEFAULTS["draft"], target))


def ignored(app, q: dict) -> list[lessons.Said]:
    """What the link asked for and the page left out, each with what it should have been."""
    out = []
    for name, (take, why) in _rules(app).items():
        raw = _asked(q, name)
        if raw is not None and take(raw) is None:
            out.append(lessons.Said("app.link_item", name=name, value=lessons.quoted(str(raw)[:40]), want=why))
    prompt = q.get("prompt") or ""
    if len(prompt) > app.limits.max_prompt_chars:
        out.append(lessons.Said("app.link_prompt_cut", limit=app.limits.max_prompt_chars))
    return out


def notice(app, request, lang: str) -> str | None:
    """One sentence naming what the link asked for and did not get, in `lang`; None for a link that is fine."""
    items = ignored(app, query(request))
    if not items:
        return None
    joined = lessons.text(lang, "app.link_separator").join(lessons.say(lang, i) for i in items)
    return lessons.text(lang, "app.link_ignored", items=joined)


def link_notice(app):
    """The page-load hook that shows `notice` in `lang` as a warning; it runs inside the What if? tab's
    queued on_link (gradio shows a warning only from the queue)."""
    def on_loaded(request: gr.Request, lang: str):
        said = notice(app, request, lang)
        if said:
            gr.Warning(said, duration=20, title=lessons.text(lang, "app.warning_title"))
    return on_loaded
