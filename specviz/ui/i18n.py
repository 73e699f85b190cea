"""The language switch: which components show which lesson key, and each session's language.

Pages register their components with `Translations.add(component, label=KEY, value=KEY, info=KEY)`;
on page load and when the switch (`#lang`) moves, one handler returns an update for each of them in
the chosen language. Texts made at run time (counters, conclusions) ask `lang_of(session)`.
The text itself lives in `specviz/lessons/{en,fa}.toml`.

A component registered with `label=KEY` (or `info=`, `placeholder=`) and created without one gets the
English text as its own attribute at registration, before the Blocks' config is built: gradio names API
parameters and outputs after the server-side label (`view_api()`, "Use via API"), and per-session
updates never reach that page — so the API keeps English names while the page switches language.
"""
from __future__ import annotations

import json
import threading

import gradio as gr

from specviz import lessons

# URL parameter `name` set to `value` without a reload; held until the page has read its link (the link's
# notice reads the address as it is then, and named "tab = nope" no more once the page had rewritten it)
SET_ADDRESS_JS = """window.__svSetAddress = window.__svSetAddress || ((name, value) => {
    if (!window.__svLinkRead) { (window.__svPending = window.__svPending || {})[name] = value; return; }
    const here = new URL(window.location.href);
    if (value && here.searchParams.get(name) !== value) {
      here.searchParams.set(name, value);
      history.replaceState(history.state, '', here);
    }
  });"""
# Once the link is read: the held writes land, and the open tab and chapter follow into the address as
# they change (watched in the page itself: a gradio event of its own per tab and chapter kept the
# Playground's Stop from reaching its Run)
LINK_READ_JS = """() => {
  __SET_ADDRESS__
  window.__svLinkRead = true;
  for (const [k, v] of Object.entries(window.__svPending || {})) { window.__svSetAddress(k, v); }
  if (window.__svAddressWatch) { return; }
  window.__svAddressWatch = true;
  const shown = () => {
    const tab = document.querySelector('button[role=tab][aria-selected=true][data-tab-id]');
    if (tab) { window.__svSetAddress('tab', tab.dataset.tabId); }
    const chapter = document.querySelector('#chapter input:checked');
    if (chapter) { window.__svSetAddress('chapter', chapter.value); }
  };
  const watch = (el) => el && new MutationObserver(shown).observe(el, {subtree: true, attributes: true,
                                                                       attributeFilter: ['aria-selected', 'aria-checked']});
  watch(document.querySelector('button[role=tab]')?.parentElement);
  watch(document.querySelector('#chapter'));
  shown();          // what the reader picked before the link was read
}""".replace("__SET_ADDRESS__", SET_ADDRESS_JS)

SWITCH_JS = """(lang) => {
  const rtl = lang === 'fa';
  document.documentElement.setAttribute('dir', rtl ? 'rtl' : 'ltr');
  document.documentElement.setAttribute('lang', lang);
  document.body.classList.toggle('sv-rtl', rtl);
  // gradio also copies style.css's rules under '.gradio-container .contain' (a rule inside @media only
  // there), and those copies outrank the plain ones: the '.sv-rtl …' rules need the class in there too
  for (const el of document.querySelectorAll('.gradio-container .contain > *')) { el.classList.toggle('sv-rtl', rtl); }
  // the address says the page's language, so a reload or a bookmark opens it in the same one (the
  // browser's language chose it otherwise)
  __SET_ADDRESS__
  window.__svSetAddress('lang', lang);
  const titles = __TITLES__;
  if (titles[lang]) { document.title = titles[lang]; }
  // gradio (6.x) heads every toast with its type ("Error", "Warning") and never shows the title a
  // refusal carries: put the reader's word there, and again whenever gradio re-renders a toast
  window.__svToast = __TOASTS__[lang];
  // the recordings' upload box keeps the words of the locale it was first drawn in (gradio 6.x), which
  // is the browser's, not the page's: its three pieces of text are set here, and again on a re-render
  window.__svUpload = __UPLOAD__[lang];
  // a slider's boxes and its reset button are named in English by gradio, for screen readers
  window.__svAria = __ARIA__[lang];
  if (!window.__svToastObserver) {
    const setText = (node, want) => { if (node.data.trim() !== want) { node.data = ' ' + want + ' '; } };
    const fix = () => {
      for (const el of document.querySelectorAll('.toast-title')) {
        const node = el.firstChild, type = ['error', 'warning'].find((k) => el.classList.contains(k));
        const want = type && window.__svToast ? window.__svToast[type] + ' ' : null;
        if (want && node && node.nodeType === 3 && node.data !== want) { node.data = want; }
      }
      const aria = window.__svAria;
      for (const el of document.querySelectorAll('button[data-testid=reset-button]')) {
        if (aria && el.getAttribute('aria-label') !== aria.reset) { el.setAttribute('aria-label', aria.reset); el.title = aria.reset; }
      }
      for (const el of document.querySelectorAll('input[data-testid=number-input], input[data-testid=range-input]')) {
        const said = /^(number input|range slider) for (.*)$/s.exec(el.getAttribute('aria-label') || '');
        if (aria && said) { el.setAttribute('aria-label', aria[said[1] === 'number input' ? 'number' : 'range'].replace('{label}', said[2])); }
      }
      const words = window.__svUpload, box = document.querySelector('#replay-file [data-testid=upload-text]');
      if (!words || !box) { return; }
      let after = false;
      for (const node of box.childNodes) {
        if (node.nodeType === 1 && node.classList.contains('or')) {
          after = true;
          if (node.textContent !== words.or) { node.textContent = words.or; }
        } else if (node.nodeType === 3 && node.data.trim()) {
          setText(node, after ? words.click : words.drop);
        }
      }
    };
    window.__svToastObserver = new MutationObserver(fix);
    window.__svToastObserver.observe(document.body, {subtree: true, childList: true, characterData: true,
                                                     attributes: true, attributeFilter: ['aria-label']});
    window.__svFix = fix;
  }
  window.__svFix();
  // gradio's own words (upload boxes, the footer) follow its locale: switch it with ours
  const core = performance.getEntriesByType('resource').map((r) => r.name)
    .find((n) => /\/assets\/core-[\w-]+\.js$/.test(n));
  if (core) { import(core).then((m) => m.changeLocale && m.changeLocale(lang)).catch(() => {}); }
  return lang;
}"""


def switch_js() -> str:
    """The language switch's browser side: direction, `lang`, and the page title (the tab's name)."""

    titles = {lang: lessons.text(lang, "app.page_title") for lang in lessons.LANGS}
    toasts = {lang: {"error": lessons.text(lang, "app.error_title"), "warning": lessons.text(lang, "app.warning_title")}
              for lang in lessons.LANGS}
    upload = {lang: {k: lessons.text(lang, f"app.upload_{k}") for k in ("drop", "or", "click")} for lang in lessons.LANGS}
    aria = {lang: {k: lessons.template(lang, f"app.aria_{k}") for k in ("reset", "number", "range")}
            for lang in lessons.LANGS}
    return (SWITCH_JS.replace("__SET_ADDRESS__", SET_ADDRESS_JS).replace("__TITLES__", json.dumps(titles, ensure_ascii=False))
            .replace("__TOASTS__", json.dumps(toasts, ensure_ascii=False))
            .replace("__UPLOAD__", json.dumps(upload, ensure_ascii=False))
            .replace("__ARIA__", json.dumps(aria, ensure_ascii=False)))


def pick_lang(request: gr.Request | None, asked: str | None = None) -> str:
    """The `lang` URL parameter, else the browser's Accept-Language, else English."""
    if asked in lessons.LANGS:
        return asked
    if request is not None:
        q = getattr(request, "query_params", None) or {}
        if q.get("lang") in lessons.LANGS:
            return q.get("lang")
        header = (getattr(request, "headers", None) or {}).get("accept-language", "") or ""
        for part in header.split(","):
            code = part.split(";")[0].strip().lower()[:2]
            if code in lessons.LANGS:
                return code
    return lessons.DEFAULT_LANG


class Translations:
    def __init__(self):
        self._items: list[tuple[object, dict[str, str]]] = []
        self._langs: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, component, fn=None, **keys: str):
        """Register `component`; keys name its attributes (label=, value=, info=, placeholder=) by lesson
        key, or `fn(lang)` builds its whole update (text assembled from several keys)."""
        for attr in ("label", "info", "placeholder"):
            if attr in keys and getattr(component, attr, "") is None:
                setattr(component, attr, lessons.text("en", keys[attr]))   # see the module docstring
        self._items.append((component, fn if fn is not None else keys))
        return component

    @property
    def components(self) -> list:
        return [c for c, _ in self._items]

    def direction(self, component):
        """Register a component whose text is made at run time: only its direction follows the language."""
        self._items.append((component, {}))
        return component

    def updates(self, lang: str) -> list:
        rtl = lessons.direction(lang) == "rtl"
        out = []
        for comp, spec in self._items:
            upd = spec(lang) if callable(spec) else gr.update(**{a: lessons.text(lang, k) for a, k in spec.items()})
            if isinstance(comp, gr.Markdown):
                upd["rtl"] = rtl          # gradio lays Markdown out left-to-right unless told otherwise
            elif rtl and not isinstance(comp, gr.HTML):
                upd = _right_to_left(upd)
            out.append(upd)
        return out

    def label_of(self, component, lang: str):
        """The component's label as the page shows it in `lang` (a lesson `Key` where it has one), or None:
        what a refusal of its value calls it."""
        for comp, spec in self._items:
            if comp is not component:
                continue
            if isinstance(spec, dict) and "label" in spec:
                return lessons.Key(spec["label"])
            if callable(spec):
                label = spec(lang).get("label")
                if isinstance(label, str) and label:
                    return label
        return getattr(component, "label", None) or None

    def remember(self, session: str, lang: str) -> None:
        with self._lock:
            if len(self._langs) > 5000:          # a long-running Space: forget old tabs
                self._langs.clear()
            self._langs[session] = lang

    def lang_of(self, session: str) -> str:
        with self._lock:
            return self._langs.get(session, lessons.DEFAULT_LANG)


# plain-text attributes a component lays out in its own box (a label chip, a button, an option), which need
# not follow the page's direction: a Persian one is isolated right-to-left there
PLAIN_TEXT = ("label", "info", "placeholder")


def _right_to_left(upd: dict) -> dict:
    upd = dict(upd)
    for attr in PLAIN_TEXT:
        if isinstance(upd.get(attr), str):
            upd[attr] = lessons.isolate_rtl(upd[attr])
    if isinstance(upd.get("value"), str) and "\n" not in upd["value"]:     # a button's or a tab's text
        upd["value"] = lessons.isolate_rtl(upd["value"])
    if isinstance(upd.get("choices"), list):
        upd["choices"] = [(lessons.isolate_rtl(c[0]), c[1]) if isinstance(c, (tuple, list)) and isinstance(c[0], str)
                          else c for c in upd["choices"]]
    return upd


def t(lang: str, key: str, **values) -> str:
    """Lesson text with numbers and names kept left-to-right inside Persian sentences."""
    return lessons.text_bidi(lang, key, **values) if lessons.direction(lang) == "rtl" else lessons.text(lang, key, **values)
