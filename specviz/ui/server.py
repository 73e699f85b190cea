"""SpecVizApp: the state every browser session shares, and the Blocks that hold the pages.

Shared, and who owns it:
- `pairs` (PairCache): loaded weights, immutable once loaded; loading is serialised by its lock.
- `runner`: on a machine the app owns, one scheduler per pair owns that pair's engine (the batch and
  both KV caches) in its own thread; on ZeroGPU each Run's engine lives in its GPU worker.
- `gate` (DeviceGate): who may time the device now (scheduler steps, or one exclusive experiment).
- `sampler`: a daemon thread that only appends readings; `peaks`: replaced whole, never mutated.
- `runs` (LiveRuns): session → that session's live run; each LiveRun is written by its own Run.
Each page module (`playground`, `whatif`) owns its layout and its handlers.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import gradio as gr

from specviz import lessons
from specviz.hardware.device import Peaks, Sampler, cached_peaks
from specviz.limits import Limits, limits_from_env
from specviz.pairs.models import ModelError
from specviz.serve import runner
from specviz.serve.catalog import (PairCache, PairChoice, TokenizerCache, available_choices, dial_choices,
                                   hub_is_offline, pair_options)
from specviz.serve.live import LiveRuns
from specviz.serve.gate import DeviceGate
from specviz.serve.vllm_router import VllmRouter, vllm_choices
from specviz.ui import lesson, playground_layout, whatif
from specviz.ui.deeplink import EXTRA, link_notice, query, restore
from specviz.ui.errors import COMMIT_TYPED_JS, as_human_errors, error, guard_blocks
from specviz.ui.i18n import LINK_READ_JS, Translations, pick_lang, switch_js
from specviz.ui.plotjs import PURGE_PLOTS_JS
from specviz.ui.render import KEEP_ROWS_JS
from specviz.ui.whatif_views import CUSTOM_GPU

log = logging.getLogger("specviz")
ASSETS = Path(__file__).resolve().parents[2] / "assets"
MAX_TYPED_PAIRS = 4        # pairs typed by visitors (SPECVIZ_ALLOW_CUSTOM) that one server loads
RECALIBRATE_S = 600.0      # peaks a pass beat are measured again at most this often (each holds every Run)


def fastest(old: Peaks | None, new: Peaks) -> Peaks:
    """A peak is the fastest the machine was seen to go: a measurement taken again beside other work may
    read lower than the one a pass already beat, and then does not replace it."""
    if old is None or (old.device, old.dtype) != (new.device, new.dtype):
        return new
    return dataclasses.replace(new, bandwidth=max(old.bandwidth, new.bandwidth), flops=max(old.flops, new.flops))


class SpecVizApp:
    def __init__(self, target: str | None = None, draft: str | None = None, device: str | None = None,
                 preload: bool = True, calibrate_peaks: bool = True, allow_custom: bool = False,
                 limits: Limits | None = None, vllm: list | None = None):
        self.choices = available_choices(target, draft)
        self.dials = dial_choices(self.choices)      # the acceptance dial on the local targets (Playground only)
        self.allow_custom = allow_custom
        self.limits = limits or limits_from_env()
        self.runs = LiveRuns()
        self.peaks: Peaks | None = None
        self._recal_lock, self._recalibrating = threading.Lock(), threading.Event()
        self._recalibrated_at = -RECALIBRATE_S
        self._recal_thread: threading.Thread | None = None
        self.gate = DeviceGate()
        spaces = zero_gpu_spaces()
        if spaces is not None:
            # ZeroGPU, as its documentation says: the offered pairs' weights go to `cuda` here, at start-up,
            # in the main process (the `spaces` package emulates the device), so every forked GPU worker
            # starts with them; a pair typed by a visitor loads in the worker. Sampling and calibration
            # happen in the worker. No fast path there: ZeroGPU does not support torch.compile.
            weights = PairCache(zero_gpu_device(spaces), compile="off")
            if preload:
                place_weights(weights, self.choices)
            self.pairs = TokenizerCache(weights)
            self.runner = runner.ZeroGpuRunner(spaces, lambda: weights, as_human_errors, self.limits)
            self.sampler = None
            calibrate_peaks = False
        else:
            self.pairs = PairCache(device, exclusive=self.gate.exclusive)
            self.runner = runner.LocalRunner(self.pairs, self.limits, self.gate)
            self.sampler = Sampler().start()
        if vllm:                        # vLLM servers (specviz.vllm.backend.Endpoint), after our own pairs

            self.choices = self.choices + vllm_choices(vllm)
            self.runner = VllmRouter(self.runner, vllm)
        self.offline = hub_is_offline()
        self.startup_note = self.startup_md("en")
        if preload:      # on a machine the app owns, the first pair's pass-time curve is measured then too
            self.pairs.preload(self.choices[0], curve=not self.runner.zero_gpu)
        if calibrate_peaks:
            threading.Thread(target=self._calibrate, name="specviz-calibrate", daemon=True).start()

    def close(self, timeout: float = 120.0) -> bool:
        """Stop sampling, stop the local schedulers' loops, and wait for the pairs' background work (curves
        measured again, fast paths warming, peaks measured again); True when that work has ended. A process that builds apps one
        after another (the tests) otherwise keeps their threads; the start-up calibration is not waited for."""
        if self.sampler is not None:
            self.sampler.stop()
        stop = getattr(self.runner, "close", None)      # a vLLM router or ZeroGPU runner has no local loops
        if stop is not None:
            stop(timeout)
        if self._recal_thread is not None:       # torch mid-measurement in a thread aborts an exiting process
            self._recal_thread.join(timeout)
            if self._recal_thread.is_alive():
                return False
        settle = getattr(self.pairs, "settle", None)
        return settle(timeout) if settle is not None else True

    def startup_md(self, lang: str) -> str:
        """The status line before the first Run: offline mode, the default pair, how batches are shared."""
        parts = [lessons.text(lang, "playground.offline_mode")] if self.offline else []
        parts.append(lessons.say(lang, self.choices[0].note))
        parts.append(lessons.text(lang, "playground.zerogpu_note" if self.runner.zero_gpu else "playground.shared_note"))
        return " ".join(parts)

    def _calibrate(self, refresh: bool = False) -> None:
        try:
            with self.gate.exclusive():          # timed: nothing else may run meanwhile
                peaks = cached_peaks(size_mb=128, repeats=3, refresh=refresh)
            self.peaks = fastest(self.peaks, peaks) if refresh else peaks
        except Exception:
            if not refresh:
                self.peaks = None  # MBU/MFU then show as unavailable, the rest still works
            log.exception("calibrating this machine's peaks failed")
        finally:
            self._recalibrating.clear()

    def recalibrate(self, beaten: str | None) -> bool:
        """A Run's pass ran past the calibrated peaks (`beaten`: how far), so they were measured low beside
        other work, and every MBU, MFU and roofline since reads wrong: measure them again now, in the
        background with the device held, at most once every RECALIBRATE_S. True when it started."""
        if not beaten or self.runner.zero_gpu or self.peaks is None:
            return False
        with self._recal_lock:
            now = time.monotonic()
            if self._recalibrating.is_set() or now - self._recalibrated_at < RECALIBRATE_S:
                return False
            self._recalibrating.set()
            self._recalibrated_at = now
        log.info("calibration: a Run's pass reached %s of the calibrated peak; measuring the peaks again", beaten)
        self._recal_thread = threading.Thread(target=self._calibrate, kwargs={"refresh": True},
                                              name="specviz-recalibrate", daemon=True)
        self._recal_thread.start()
        return True

    def pair_options(self, lang: str) -> list[tuple[str, str]]:
        """The offered pairs for a dropdown: (label in `lang`, English label as the value)."""
        return pair_options(self.choices, lang)

    def choice(self, label: str, lang: str = lessons.DEFAULT_LANG, dial: bool = False) -> PairChoice:
        """The offered pair with this label (`dial`: the Playground's synthetic-draft pairs too)."""
        for c in self.choices + (self.dials if dial else []):
            if c.label == label:
                return c
        if self.allow_custom:
            parts = re.split(r"\s*(?:→|->)\s*", str(label or "").strip())
            if len(parts) == 2 and all(parts):
                return self._typed(PairChoice(f"{parts[0]} → {parts[1]}", parts[1], parts[0], lessons.Said("pairs.custom_note")))
            raise error(lang, "errors.custom_pair")
        raise error(lang, "errors.unknown_pair", pair=lessons.quoted(str(label)[:60]))

    def _typed(self, choice: PairChoice) -> PairChoice:
        """A typed pair, unless this server already holds MAX_TYPED_PAIRS of them: each loaded pair keeps
        its engine (and maybe weights) in memory for good, so a class typing pairs must not grow it."""
        offered = {(c.target, c.draft) for c in self.choices}
        loaded = getattr(self.pairs, "loaded_keys", lambda: [])()
        typed = [k for k in loaded if k not in offered]
        if (choice.target, choice.draft) not in loaded and len(typed) >= MAX_TYPED_PAIRS:
            raise gr.Error(lessons.Said("errors.typed_pairs_full", count=len(typed)))
        return choice

    def load(self, choice: PairChoice, lang: str = lessons.DEFAULT_LANG):
        """The pair's models, loading them if needed; a failure leaves the pairs already loaded serving.
        A vLLM pair loads our copy of the served model (its tokenizer, the lossless check) once its
        server is known to serve it; otherwise the sentence says why (starting, stopped, unreachable)."""
        if choice.engine == "vllm":
            self.runner.ready(choice)
        try:
            return self.pairs.get(choice)
        except ModelError as exc:
            loaded = [c.label for c in self.choices if self.pairs.loaded(c)]
            detail = exc.args[0] if len(exc.args) == 1 else str(exc)
            still = lessons.say(lang, lessons.Said("errors.still_serving", pair=loaded[0])) if loaded else ""
            raise gr.Error(lessons.say(lang, lessons.Said("errors.model_load_failed", pair=choice.label,
                                                           detail=detail)) + still) from None


def zero_gpu_device(spaces) -> str:
    """Where a ZeroGPU main process places the weights: `cuda`, which `spaces` emulates there. The test
    double (tests/fakespaces) has no GPU to emulate and says so with `EMULATED_DEVICE = "cpu"`."""
    return getattr(spaces, "EMULATED_DEVICE", "cuda")


def place_weights(weights: PairCache, choices) -> None:
    """Load every offered pair now (before the first GPU worker forks); one that fails is logged and
    tried again, with its error shown, when someone picks it."""
    for choice in choices:
        try:
            weights.get(choice)
        except Exception:
            log.exception("could not place %s on the device at start-up", choice.label)


def zero_gpu_spaces():
    """The `spaces` module when this app runs on a ZeroGPU Space, else None (the app then runs as is).
    `spaces` sets SPACES_ZERO_GPU there; off ZeroGPU its decorator would be a no-op anyway."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true"):
        return None
    try:
        import spaces
    except ImportError:
        return None
    return spaces


LINK_JS = """(tab, chapter, pair, prompt, batch, depth, policy, lang, acceptance, ...extra) => {
  const q = new URLSearchParams({tab: tab || 'lesson', chapter: chapter || '', pair: pair || '',
    prompt: prompt || '', batch: String(batch), depth: String(depth), policy: policy || '', lang: lang || 'en'});
  // the shown chapter's acceptance dial, when its synthetic draft is ticked
  const dial = document.querySelector('#dial-on-' + chapter + ' input');
  const dialled = document.querySelector('#dial-' + chapter + ' input[type=number]');
  if ((tab || 'lesson') === 'lesson' && dial && dial.checked && dialled) { q.set('acceptance', dialled.value); }
  // the Playground's dial, while a synthetic-draft pair is picked (its slider shows then)
  const pg = document.querySelector('#acceptance');
  if (tab === 'playground' && pg && pg.offsetParent !== null) { q.set('acceptance', String(acceptance)); }
  // the open tab's own settings (deeplink.EXTRA): the Playground's two read at a Run, the What if?'s knobs,
  // and a custom GPU's two rates only where they count
  const names = __EXTRA__, set = (name) => {      // an emptied box writes nothing, not "null"
    const v = extra[names.indexOf(name)];
    if (v !== null && v !== undefined && v !== '') { q.set(name, String(v)); }
  };
  if (tab === 'playground') { ['temperature', 'max_new'].forEach(set); }
  if (tab === 'whatif') {
    ['gpu', 'target', 'draft', 'alpha', 'context', 'overhead', 'model'].forEach(set);
    if (extra[names.indexOf('gpu')] === __CUSTOM__) { ['bandwidth', 'flops'].forEach(set); }
  }
  const url = window.location.origin + window.location.pathname + '?' + q.toString();
  if (navigator.clipboard) { navigator.clipboard.writeText(url).catch(() => {}); }
  const copied = __COPIED__;
  const box = document.querySelector('#link input');
  if (box && copied[lang]) { box.title = copied[lang]; }      // its name stays what it is (the box's label)
  const button = document.querySelector('#copy-link');
  if (button && copied[lang]) {
    const before = button.innerText;
    button.innerText = copied[lang];
    setTimeout(() => { if (button.innerText === copied[lang]) { button.innerText = before; } }, 1500);
  }
  return url;
}"""


def link_js() -> str:
    """The copy-link button's browser side: the link to this state, copied, and "Link copied" for a moment."""

    copied = {lang: lessons.text(lang, "app.link_copied") for lang in lessons.LANGS}
    return (LINK_JS.replace("__COPIED__", json.dumps(copied, ensure_ascii=False))
            .replace("__EXTRA__", json.dumps(list(EXTRA))).replace("__CUSTOM__", json.dumps(CUSTOM_GPU)))


def build_blocks(app: SpecVizApp) -> gr.Blocks:
    """The page: header with the language switch and "copy link", then the Lesson (first), Playground and
    What-if tabs. URL parameters restore a state (deep links): tab, chapter, pair, prompt, batch, depth,
    policy, lang, acceptance (the dial's A: the lesson's dials ticked at A, the Playground's slider)."""
    app.tr = tr = Translations()
    # uploads and download copies in gradio's cache older than an hour go every half hour (a class's
    # server runs for days; a student downloads a file right after a Run)
    with gr.Blocks(title=lessons.text("en", "app.page_title"), delete_cache=(1800, 3600)) as blocks:
        with gr.Row(elem_id="sv-header"):
            tr.add(gr.Markdown("# SpecViz", elem_id="sv-title"),
                   lambda lang: gr.update(value=f"# {lessons.text(lang, 'app.title')}\n"
                                                f"{lessons.text(lang, 'app.tagline')}"))
            lang = tr.add(gr.Radio([("English", "en"), ("فارسی", "fa")], value="en", elem_id="lang",
                                   min_width=160, scale=0), label="app.language")
            with gr.Column(scale=0, min_width=200):
                copy = tr.add(gr.Button(size="sm", elem_id="copy-link"), value="app.copy_link")
                # says what it is for before the first click (an empty box beside the button puzzled a reader)
                link = tr.add(gr.Textbox(show_label=False, elem_id="link", interactive=False, max_lines=1,
                                         visible=True, placeholder=None),
                              placeholder="app.link_placeholder", label="app.link_placeholder")   # a reader's name
        tab_state = gr.Textbox("lesson", visible=False, elem_id="tab-state")
        # "wrap": every tab stays in sight on a phone (gradio's "menu" hid "What if?" behind "…")
        with gr.Tabs(selected="lesson", elem_id="tabs", overflow_behavior="wrap") as tabs:
            with gr.Tab(lessons.text("en", "app.tab_lesson"), id="lesson", elem_id="lesson") as t_lesson:
                tr.add(t_lesson, label="app.tab_lesson")
                taught, chapter, _ = lesson.build(app)
            with gr.Tab(lessons.text("en", "app.tab_playground"), id="playground", elem_id="playground") as t_play:
                tr.add(t_play, label="app.tab_playground")
                page = playground_layout.build(app)
            with gr.Tab("What if? (estimates + measured profiles)", id="whatif", elem_id="whatif") as t_what:
                tr.add(t_what, label="app.tab_whatif")
                knobs, whatif_wiring = whatif.build(app, on_page_load=link_notice(app))
        for tab, tid in ((t_lesson, "lesson"), (t_play, "playground"), (t_what, "whatif")):
            tab.select(lambda tid=tid: tid, None, [tab_state], api_name=False, queue=False, show_progress="hidden")
        c = page.components
        extra = [c[name] if name in c else knobs[name] for name in EXTRA]       # deeplink.EXTRA's order
        deep = [tabs, chapter, c["pair"], c["prompt"], c["batch"], c["depth"], c["policy"], c["acceptance"], lang,
                *extra]

        def on_load(request: gr.Request):
            chosen = pick_lang(request)
            tr.remember(_session(request), chosen)
            updates = tr.updates(chosen)
            # the lesson's dials are translated components too: `acceptance` merges into their updates
            lesson.restore_dials(taught, query(request), chosen, tr.components, updates)
            return [*restore(app, request, chosen), *updates]
        blocks.load(on_load, None, deep + tr.components, api_name=False, queue=False).then(
            None, [lang], None, js=switch_js()).then(None, None, None, js=KEEP_ROWS_JS).then(
            None, None, None, js=PURGE_PLOTS_JS).then(
            None, None, None, js=COMMIT_TYPED_JS).then(*whatif_wiring.on_link, api_name=False,
                                                        show_progress="hidden").then(
            None, None, None, js=LINK_READ_JS)

        def on_lang(chosen, request: gr.Request):
            chosen = pick_lang(None, chosen)
            tr.remember(_session(request), chosen)
            return tr.updates(chosen)
        lang.change(on_lang, [lang], tr.components, api_name=False, queue=False, show_progress="hidden",
                    js=switch_js())
        relabel, knobs_read, relabelled = whatif_wiring.relabel
        lang.input(relabel, [lang, *knobs_read], relabelled, api_name=False, show_progress="hidden")
        taught.follow_language(lang)
        lang.change(page.on_switch, [lang], page.redrawn, api_name=False, queue=False, show_progress="hidden")
        copy.click(None, [tab_state, chapter, c["pair"], c["prompt"], c["batch"], c["depth"], c["policy"], lang,
                          c["acceptance"], *extra],
                   [link], js=link_js(), api_name=False)
    # one error boundary for every handler and for gradio's own input check (specviz.ui.errors)
    return guard_blocks(blocks, lambda session: tr.lang_of(session or "default"), tr.label_of)


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "default"


FONTS = ASSETS / "fonts"


def font_css() -> str:
    """The bundled Vazirmatn @font-face rules, with their url()s pointing at files gradio serves
    (the CSS is inlined into the page, so relative URLs would not resolve)."""
    css = (FONTS / "vazirmatn.css").read_text(encoding="utf-8")
    return css.replace('url("vazirmatn/', f'url("/gradio_api/file={FONTS.as_posix()}/vazirmatn/')


def hint_css() -> str:
    """The phone's hint over a chapter's chart (style.css shows it), in each language: CSS reads its text and
    direction from variables, which the page's `lang` (set by the language switch) picks."""
    def rule(lang: str) -> str:
        text = json.dumps(lessons.text(lang, "app.swipe_chart"), ensure_ascii=False)
        way = lessons.direction(lang)
        return (f':root[lang="{lang}"] {{ --sv-swipe: {text}; --sv-swipe-dir: {way}; '
                f'--sv-swipe-align: {"right" if way == "rtl" else "left"}; }}\n')
    return "".join(rule(lang) for lang in lessons.LANGS)


# the system's own sans-serif: the Soft theme's bundled Montserrat draws E and N as "Ɛ" and "Ɲ" (a
# student copied "ƐAGLƐ" from a projector); the Persian page has Vazirmatn (assets/fonts)
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"])


def launch_kwargs() -> dict:
    # a classroom: every waiting Run holds a worker thread while it streams (gradio's default is 40)
    return {"css_paths": [str(ASSETS / "style.css")], "css": font_css() + hint_css(), "theme": THEME,
            "max_threads": 160, "allowed_paths": [str(FONTS)]}
