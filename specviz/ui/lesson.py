"""The Lesson tab: the source's argument, one chapter per step, each backed by an experiment the class runs
on the machine in front of it. This module owns the tab's layout and handlers.

Each chapter: text for students (specviz/lessons/*.toml), one button that runs its experiment on the
selected pair (its module in specviz/chapters/) with the device to itself (queued with a visible position), a chart
that fills in as points arrive, a conclusion written from the measured numbers, and the chart's data as
CSV. Experiments are timed, so they never run beside another timed experiment or the shared batch.

A chapter with `Chapter.dial` also shows the acceptance dial: a "synthetic draft" checkbox (off: the
pair's own draft) that unlocks a slider A from 0 to 1; on, the experiment runs with
`Context(acceptance=A)` (specviz.chapters.dial), and its result must have run `synthetic:A` (the draft in
its settings) and say what the reference cost (`reference_s`).
"""
from __future__ import annotations

import contextlib
import math
import re
import string
import threading
import time
from typing import Callable

import gradio as gr

from specviz import lessons
from specviz.chapters import BY_KEY, CHAPTERS, KEYS, Chapter, Context, frontier, vllm_panels
from specviz.hardware.device import OthersMeter
from specviz.limits import brief
from specviz.pairs.pipeline import encode_prompt
from specviz.serve import runner
from specviz.serve.prompts import DEFAULT_DEPTH, DEFAULT_PROMPT, GROUNDED, ROW_POOL
from specviz.ui.errors import as_sentences, error, refuse_as_typed
from specviz.ui.i18n import pick_lang, t
from specviz.ui.runs import TempFiles, write_csv
from specviz.ui.shown import keep_newest
from specviz.ui.warmup import WARMUP_POLL_S, WARMUP_WAIT_S, warming


def chapter_title(lang: str, chapter: str) -> str:
    return lessons.text(lang, f"chapter.{chapter}.title")


def numbered_title(lang: str, i: int, chapter: str) -> str:
    """ "3. Why checking k + 1 tokens is almost free". In Persian the whole label is isolated right-to-left,
    so it reads the same wherever it sits (a radio label, a heading, a left-to-right container): the number
    first at the right with its dot after it, and a title that starts with an English term ("breadth در
    برابر depth") keeps its words in order."""
    label = f"{i + 1}. {chapter_title(lang, chapter)}"
    return lessons.isolate_rtl(label) if lessons.direction(lang) == "rtl" else label


def chapter_choices(lang: str) -> list[tuple[str, str]]:
    return [(numbered_title(lang, i, c), c) for i, c in enumerate(KEYS)]


def chart_labels(lang: str, chapter: str) -> dict:
    """Every short string of a chapter's table (chart labels), in this language. Plotly lays its text out
    left-to-right, so a Persian label is made right-to-left as a whole (its numbers are isolated
    left-to-right when a chapter's figure fills them in)."""
    table = lessons.load(lang).get("chapter", {}).get(chapter, {})
    out = {k: lessons.isolate_rtl(v) for k, v in table.items() if isinstance(v, str) and k not in ("title", "body")}
    out["_lang"] = lang           # for the Saids a result carries (published series' names, loads)
    return out


POLICY_FIELDS = ("policy", "small_policy", "large_policy")
ARM_FIELDS = ("best_arm", "cliff_arm")      # the frontier's arms, coded as "fixed:4" (chapters.frontier)


def _named(lang: str, values: dict) -> dict:
    """A conclusion's values with each policy (its English name in the result) named for the reader, and
    how a frontier line's ratio was taken (a result from before it said so: by the medians where it equals
    theirs)."""
    if "av_tokens_per_s" in values and "ratio_how" not in values:
        values = {**values, "ratio_how": "medians" if values.get("ratio") == values.get("by_medians") else "paired"}
    return {k: lessons.policy_label(lang, v) if k in POLICY_FIELDS and isinstance(v, str)
            else frontier.arm_name(lang, v) if k in ARM_FIELDS and isinstance(v, str)
            else _ratio_how(lang, v, values) if k == "ratio_how" else v
            for k, v in values.items()}


def _ratio_how(lang: str, how: str, values: dict) -> str:
    # a paired ratio can sit on the other side of 1 from the two medians printed beside it (44.5 against
    # 44.9 tokens/s "1.04×"): it names what the medians give too, where that reads differently
    medians = values.get("by_medians")
    if medians is None:         # a result from before the field: the two printed medians' own ratio
        best = values.get("best_tokens_per_s") or 0.0
        medians = values.get("av_tokens_per_s", 0.0) / best if best else values.get("ratio", 1.0)
    if how == "paired" and f"{medians:.2f}" == f"{values.get('ratio', math.nan):.2f}":
        how = "paired_same"
    return t(lang, f"chapter.frontier.ratio_{how}", by_medians=medians)


def conclusion_md(lang: str, result: dict) -> str:
    """The chapter's conclusion(s), written from the measured numbers, plus how they were measured."""
    chapter = result["chapter"]
    keys = result.get("conclusions") or ([result["conclusion"]] if result.get("conclusion") else [])
    values = result.get("conclusion_values") or [result.get("values", {})] * len(keys)
    parts = [t(lang, f"chapter.{chapter}.{k}", **_named(lang, v)) for k, v in zip(keys, values)]
    parts += dial_md(lang, result)
    workload = workload_md(lang, result)      # before the sweep's published panel: it is not that panel's work
    if workload:
        parts.append(workload)
    if chapter == "sweep":          # the same curve on real GPUs, from published measurements (right panel)
        parts.append(lessons.text(lang, "chapter.sweep.published_intro"))
    device = lessons.machine(lang, str(result.get("device", "?")))
    if lessons.direction(lang) == "rtl":
        device = lessons.isolate_ltr(device)
    others = result.get("others_share")
    alone = (t(lang, "app.measured_others", share=others) if others is not None and others >= OTHERS_NOTED
             else lessons.text(lang, "app.measured_alone"))
    parts.append(f"_{lessons.text(lang, 'app.measured_here')} ({device}) · {alone}._")
    return "\n\n".join(parts)


# other programs' share of the CPU time during an experiment from which its figures are said to be at risk
# (one busy core of a 2-core machine is a half)
OTHERS_NOTED = 0.25


def workload_md(lang: str, result: dict) -> str:
    """What the chapter ran (rows, prompts, tokens, depths) from its settings: the chapters measure
    different work, so one batch size's speed-up differs between them. Empty for a chapter without the
    sentence, or a result whose settings lack one of its values."""
    key = f"chapter.{result['chapter']}.workload"
    text = lessons.template(lang, key)
    settings = result.get("settings") or {}
    names = {f for _, f, _, _ in string.Formatter().parse(text) if f}
    if text == key or not names <= settings.keys():
        return ""
    # a list, or a value per class size (a dict in the sizes' order), is said as a list
    values = {k: lessons.Listed(str(x) for x in (v.values() if isinstance(v, dict) else v))
              if isinstance(v, (list, tuple, dict)) else v for k, v in settings.items() if k in names}
    return f"_{t(lang, key, **values)}_"


def redrawn(lang: str, result: dict) -> tuple:
    """A finished chapter's conclusion and chart in `lang`, from its result as measured."""
    chapter = result["chapter"]
    return conclusion_md(lang, result), BY_KEY[chapter].figure(result, chart_labels(lang, chapter), dark=False)


def _session_of(request) -> str:
    return getattr(request, "session_hash", None) or "default"


KEPT_RESULTS = 2000       # finished results kept for the language switch (a class's tabs, each chapter)
DIAL_DEFAULT = 0.7        # where the slider waits until the synthetic draft is ticked
DIAL_STEP = 0.05


def parse_acceptance(value) -> float | None:
    """The dial's A from a slider, the API or a deep link: a number from 0 to 1 (to the hundredth), else None."""
    if isinstance(value, bool):
        return None
    try:
        a = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return round(a, 2) if math.isfinite(a) and 0.0 <= a <= 1.0 else None


def dial_value(on, value, lang: str = lessons.DEFAULT_LANG) -> float | None:
    """The A an experiment runs with: None while the synthetic draft is unticked. A switch that is not
    true or false, or a bad A (ticked or not: the API's caller sent it), is refused in one sentence."""
    if not isinstance(on, bool):
        raise error(lang, "errors.bad_input", name="synthetic", kind=lessons.Key("errors.kind_bool"), value=brief(on))
    a = parse_acceptance(value)
    if a is None:
        raise error(lang, "errors.bad_acceptance", value=lessons.quoted(str(value)[:40]))
    return a if on else None


def ran_with(result: dict) -> float | None:
    """The A of the synthetic draft a result ran on (its settings' draft, `synthetic:A`), else None."""
    draft = str((result.get("settings") or {}).get("draft", ""))
    if not draft.startswith("synthetic:"):
        return None
    try:
        return float(draft.split(":", 1)[1])
    except ValueError:
        return None


def dial_md(lang: str, result: dict) -> list[str]:
    """How the synthetic draft works and what its reference cost, under a dial chapter's conclusion."""
    a = ran_with(result)
    if a is None:
        return []
    parts = [t(lang, "app.dial_note", acceptance=a, reference_s=result.get("reference_s") or 0.0)]
    if result.get("realigned"):
        parts.append(t(lang, "app.dial_realigned", rows=result["realigned"]))
    return parts


def check_dial(result: dict, acceptance: float | None, lang: str) -> None:
    """A result shown under the dial must have run the synthetic draft at that A (its settings' draft), and
    priced its reference (`reference_s`)."""
    if acceptance is None:
        return
    ran = ran_with(result)
    if ran is None or not math.isclose(ran, acceptance) or result.get("reference_s") is None:
        raise error(lang, "errors.dial_not_run")


class Lesson:
    """The tab's handlers. Experiment results are per session (one dict of the latest per chapter)."""

    def __init__(self, app):
        self.app = app
        self._files = TempFiles()
        self.dials: dict[str, tuple] = {}      # chapter → (checkbox, slider, line), for deep links
        self.shown: list[tuple] = []           # (chapter, conclusion, chart) of each experiment's panel
        # each session's finished results as measured (their Said values intact, which the page's JSON copy
        # flattens to English), for the language switch; the oldest go first
        self._results: dict[tuple[str, str], dict] = {}
        # each session's chapters still running: each run's line now, in any language (for the switch), the
        # latest updated last; API calls all share one session, so a run that ends removes only its own
        self._live: dict[tuple[str, str], dict[object, Callable[[str], str]]] = {}
        self._lock = threading.Lock()           # `_results` and `_live`: handlers of several students
        self._took: dict[tuple, float] = {}     # (chapter, pair, dial) → seconds its last run here took
        self._took_lock = threading.Lock()              # handlers of several students write it

    def lang(self, session: str) -> str:
        return self.app.tr.lang_of(session)

    def run(self, chapter: str, pair_label, request: gr.Request = None, synthetic=False, acceptance=DIAL_DEFAULT):
        """Stream one chapter's experiment: queue position, then the chart as it fills, then the conclusion.
        `synthetic`, `acceptance`: the dial (chapters with `dial`)."""
        session = _session_of(request)
        lang = self.lang(session)
        with as_sentences(lang):
            yield from self._run(chapter, pair_label, lang, dial_value(synthetic, acceptance, lang), session)

    def follow_language(self, lang_radio) -> None:
        """The language switch redraws the conclusion and chart of each chapter this session finished, from
        its measurements, so a reader who switches sees no sentence left in the other language."""
        def on_switch(chosen, request: gr.Request):
            said = self.redraw(pick_lang(None, chosen), _session_of(request))
            return [n for n, _ in said] + [f for _, f in said]
        lang_radio.change(on_switch, [lang_radio], [n for _, n, _ in self.shown] + [p for _, _, p in self.shown],
                          api_name=False, queue=False, show_progress="hidden")

    def redraw(self, lang: str, session: str) -> list[tuple]:
        """(conclusion, chart) of each shown chapter in `lang`: a finished one from its result, a running
        one's line as it stands (its chart then waits for its next update), gr.skip() for the others."""
        with self._lock:
            results = [self._results.get((session, ch)) for ch, _, _ in self.shown]
            live = [list(self._live.get((session, ch), {}).values())[-1:] for ch, _, _ in self.shown]
        said = []
        for result, running in zip(results, live):
            if result is not None:
                said.append(redrawn(lang, result))
            elif running:
                said.append((running[0](lang), gr.skip()))
            else:
                said.append((gr.skip(), gr.skip()))
        return said

    def _keep(self, session: str, chapter: str, result: dict | None) -> None:
        """Remember (or, as a run starts, forget) the session's finished result of a chapter."""
        with self._lock:
            if result is None:
                self._results.pop((session, chapter), None)
            else:
                keep_newest(self._results, (session, chapter), result, KEPT_RESULTS)

    def _run(self, chapter: str, pair_label, lang: str, acceptance: float | None = None,
             session: str = "default"):
        run = object()
        try:
            yield from self._stream(chapter, pair_label, lang, acceptance, session, run)
        finally:
            with self._lock:
                runs = self._live.get((session, chapter), {})
                runs.pop(run, None)
                if not runs:
                    self._live.pop((session, chapter), None)

    def _live_line(self, session: str, chapter: str, run: object, line: Callable[[str], str]) -> str:
        """The running chapter's line now, kept for the language switch, in the session's language now."""
        with self._lock:
            runs = self._live.setdefault((session, chapter), {})
            runs.pop(run, None)
            runs[run] = line
        return line(self.lang(session))

    def _stream(self, chapter: str, pair_label, lang: str, acceptance: float | None, session: str, run: object):
        app = self.app
        choice = app.choice(pair_label, lang)
        if app.runner.zero_gpu:
            raise error(lang, "errors.lesson_zerogpu")
        app.load(choice, lang)                   # a first load starts the pair's warm-up
        yield from self._warmed(choice, session, chapter, run)
        pair = app.load(choice, lang)            # the fast pair once warm
        make = self._experiment(chapter, pair, lang, acceptance)
        figure = BY_KEY[chapter].figure
        kind = (chapter, choice.label, acceptance is not None)     # the dial's runs decode references too
        self._keep(session, chapter, None)       # a switch while it runs redraws its running line only
        line = self._live_line(session, chapter, run, lambda lg: self._running(kind, lg))
        yield line, gr.skip(), gr.skip(), gr.skip()
        result = None
        started: list[float] = []

        meter: list[OthersMeter] = []

        def timed():            # called once the gate is ours: the experiment's time, not the queue's
            started.append(time.perf_counter())
            meter.append(OthersMeter())
            return make()
        # closed on a refusal too: the gate goes back and the experiment's thread ends
        with contextlib.closing(runner.exclusively(app.gate, timed)) as updates:
            for upd in updates:
                if isinstance(upd, runner.Waiting):
                    line = self._live_line(session, chapter, run,
                                           lambda lg, pos=upd.position: t(lg, "app.queue_position", pos=pos))
                    yield line, gr.skip(), gr.skip(), gr.skip()
                    continue
                result = upd
                check_dial(result, acceptance, lang)
                if not result["done"]:
                    line = self._live_line(session, chapter, run,
                                           lambda lg, p=result["progress"]: f"{self._running(kind, lg)} ({p:.0%})")
                    yield line, figure(result, chart_labels(self.lang(session), chapter), dark=False), gr.skip(), gr.skip()
        if result is None:
            raise error(lang, "errors.experiment_no_result")
        result["others_share"] = meter[0].share() if meter else None
        with self._took_lock:
            self._took[kind] = time.perf_counter() - started[0]
        path = self._files.path(f"specviz-{chapter}", "csv")
        write_csv(path, result["table"] or [{"chart": chapter}])
        self._keep(session, chapter, result)
        note, fig = redrawn(self.lang(session), result)    # the reader may have switched language meanwhile
        yield note, fig, path, result

    def _warmed(self, choice, session: str, chapter: str, run: object):
        """Wait (up to WARMUP_WAIT_S, saying so) while the app warms the pair's fast path: a chapter pressed
        then would time the eager path beside the warm-up, and conclude from that."""
        t0 = time.monotonic()
        while warming(self.app, choice) and time.monotonic() - t0 < WARMUP_WAIT_S:
            waited = time.monotonic() - t0
            line = self._live_line(session, chapter, run, lambda lg, s=waited: t(lg, "playground.warmup_wait",
                                                                                 seconds=s, limit=WARMUP_WAIT_S))
            yield line, gr.skip(), gr.skip(), gr.skip()
            time.sleep(WARMUP_POLL_S)

    def _running(self, kind: tuple, lang: str) -> str:
        """The chapter's "running" line, with how long to expect where this server has run it before."""
        text = lessons.text(lang, f"chapter.{kind[0]}.running")
        with self._took_lock:
            took = self._took.get(kind)
        return text if took is None else f"{text} {t(lang, 'app.last_took', seconds=round(took))}"

    def _experiment(self, chapter: str, pair, lang: str = lessons.DEFAULT_LANG, acceptance: float | None = None):
        """The chapter's experiment, ready to start, on the pair with the lesson's default prompt and pool
        (and the dial's A, None for the pair's own draft)."""
        found = BY_KEY.get(chapter) if isinstance(chapter, str) else None
        if found is None or not found.has_experiment:
            raise error(lang, "errors.unknown_chapter", chapter=lessons.quoted(str(chapter)[:40]))
        prompt = encode_prompt(pair.tokenizer, DEFAULT_PROMPT)
        pool = [prompt] + [encode_prompt(pair.tokenizer, p) for p in ROW_POOL]
        # prompts.GROUNDED, whose answers copy their input: the frontier's class, as in the first Run
        grounded = tuple(encode_prompt(pair.tokenizer, p) for p in GROUNDED)
        ctx = Context(pair=pair, prompt=prompt, pool=pool, peaks=self.app.peaks, depth=DEFAULT_DEPTH,
                      grounded=grounded, acceptance=acceptance)
        return lambda: found.run(ctx)


def build(app) -> tuple[Lesson, gr.Radio, gr.Dropdown]:
    """Lay out the lesson: a chapter picker, one panel per chapter (shown one at a time), next/previous."""
    lesson = Lesson(app)
    tr = app.tr
    labels = app.pair_options("en")
    with gr.Row():
        # the label is not shown, but screen readers say it (gradio would say "Radio")
        chapter = tr.add(gr.Radio(chapter_choices("en"), value=KEYS[0], elem_id="chapter",
                                  show_label=False, label=lessons.text("en", "app.chapters")),
                         lambda lang: gr.update(choices=chapter_choices(lang), label=lessons.text(lang, "app.chapters")))
    pair = tr.add(gr.Dropdown(labels, value=labels[0][1], elem_id="lesson-pair",
                              label=lessons.text("en", "app.label_pair")),
                  lambda lang: gr.update(label=lessons.text(lang, "app.label_pair"), choices=app.pair_options(lang)))
    panels, vllm_sweep = [], vllm_panels.recorded_vllm_sweep()
    for i, chap in enumerate(CHAPTERS):
        ch = chap.key
        with gr.Column(visible=i == 0, elem_id=f"chapter-{ch}", elem_classes=["sv-chapter"]) as panel:
            tr.add(gr.Markdown(f"## {numbered_title('en', i, ch)}", elem_classes=["sv-title"]),
                   lambda lang, i=i, ch=ch: gr.update(value=f"## {numbered_title(lang, i, ch)}"))
            tr.add(gr.Markdown(lessons.text("en", f"chapter.{ch}.body")), value=f"chapter.{ch}.body")
            if chap.has_experiment:
                _experiment_panel(lesson, tr, chap, pair)
            recorded = None if chap.vllm is None else (chap.vllm.recording() if chap.vllm.recording else vllm_sweep)
            if recorded is not None:
                _vllm_panel(tr, chap, recorded)
            with gr.Row():
                prev = tr.add(gr.Button(size="sm", interactive=i > 0, elem_id=f"prev-{ch}"),
                              value="app.previous_chapter")
                nxt = tr.add(gr.Button(size="sm", variant="primary", interactive=i < len(KEYS) - 1,
                                       elem_id=f"next-{ch}"), value="app.next_chapter")
            prev.click(lambda i=i: KEYS[max(i - 1, 0)], None, [chapter], api_name=False, queue=False)
            nxt.click(lambda i=i: KEYS[min(i + 1, len(KEYS) - 1)], None, [chapter],
                      api_name=False, queue=False)
        panels.append(panel)
    chapter.change(lambda c: [gr.update(visible=c == ch) for ch in KEYS], [chapter], panels,
                   api_name=False, queue=False, show_progress="hidden")
    return lesson, chapter, pair


def vllm_md(lang: str, chap: Chapter, sw) -> str:
    """The recorded vLLM panel's heading and text: the version and machine it was measured on, the command,
    and the chapter's own notes (for "vLLM's answer": the schedule against the best fixed depth)."""
    ch = chap.key
    where = dict(engine=f"vLLM {sw.engine_version}", device=_machine(sw.device))
    heading = (t(lang, "app.vllm_recorded_heading", **where, date=sw.recorded_at) if sw.recorded_at
               else t(lang, "app.vllm_recorded_heading_undated", **where))
    parts = [f"### {heading}",
             t(lang, f"chapter.{ch}.vllm_body", command=sw.command)]
    parts += [t(lang, key, **_named(lang, values)) for key, values in chap.vllm.notes(sw)]
    return "\n\n".join(parts)


def _machine(device: str) -> str:
    """A recording's machine for a heading that puts it in brackets: "AMD EPYC, 2 cores", not nested
    brackets (which a right-to-left line mirrors apart)."""
    return re.sub(r"\s*\((\d+ cores?)\)$", r", \1", device.removeprefix("cpu: "))


def _vllm_panel(tr, chap: Chapter, sw) -> None:
    """A recorded vLLM sweep (assets/sweeps/, `sweep --engine vllm`), shown beside the class's measurement."""
    # a recording's chart is the same for every reader: drawn once per language here, not at each language
    # switch (drawing them was the switch's dearest work on the server); read only afterwards
    figures = {lang: chap.vllm.figure(chap.vllm.result(sw, lang), chart_labels(lang, chap.key))
               for lang in lessons.LANGS}
    tr.add(gr.Markdown(vllm_md("en", chap, sw), elem_id=f"vllm-{chap.key}"),
           lambda lang: gr.update(value=vllm_md(lang, chap, sw)))
    tr.add(gr.Plot(figures["en"], label="vLLM", show_label=False, elem_id=f"plot-vllm-{chap.key}"),
           lambda lang: gr.update(value=figures[lang]))


def _experiment_panel(lesson: Lesson, tr, chap: Chapter, pair) -> None:
    ch = chap.key
    dial = _dial(lesson, tr, ch) if chap.dial else None
    button = tr.add(gr.Button(variant="primary", elem_id=chap.button_id), value=f"chapter.{ch}.button")
    note = tr.direction(gr.Markdown("", label="Conclusion", elem_id=f"conclusion-{ch}",
                                     elem_classes=["sv-conclusion"]))
    plot = gr.Plot(label="Chart", elem_id=f"plot-{ch}", show_label=False)
    # shown once it holds the chapter's data: without a file the button does nothing
    csv = tr.add(gr.DownloadButton(value=None, size="sm", elem_id=f"csv-{ch}", visible=False), label="app.download_csv")
    data = gr.JSON(label="Measurements", visible=False)
    lesson.shown.append((ch, note, plot))
    outputs = [note, plot, csv, data]
    # the API's outputs stay plain values (the file's path); the page shows the button once a run gave it one
    shown = dict(fn=lambda: gr.update(visible=True), inputs=None, outputs=[csv], api_name=False, queue=False,
                 show_progress="hidden")
    if dial is None:
        def run(pair_label, request: gr.Request):
            yield from lesson.run(ch, pair_label, request)
        button.click(run, [pair], outputs, api_name=f"lesson_{ch}", concurrency_limit=4).success(**shown)
        return

    def run_dial(pair_label, synthetic: bool, acceptance: float, request: gr.Request):
        yield from lesson.run(ch, pair_label, request, synthetic, acceptance)
    button.click(run_dial, [pair, dial[0], dial[1]], outputs, api_name=f"lesson_{ch}",
                 concurrency_limit=4).success(**shown)


def _dial(lesson: Lesson, tr, ch: str) -> tuple:
    """The acceptance dial of one chapter: the checkbox (off: the pair's own draft), the slider it unlocks,
    and a line for a deep link's refusal. Kept on `lesson.dials` for deep links (ui.server.restore)."""
    with gr.Row(elem_classes=["sv-dial"]):
        on = tr.add(gr.Checkbox(False, elem_id=f"dial-on-{ch}", scale=1), label="app.dial_checkbox",
                    info="app.dial_checkbox_info")
        a = tr.add(gr.Slider(0.0, 1.0, value=DIAL_DEFAULT, step=DIAL_STEP, interactive=False, scale=1,
                             elem_id=f"dial-{ch}"), label="app.dial_slider")
    said = tr.direction(gr.Markdown("", elem_id=f"dial-said-{ch}", elem_classes=["sv-dial-said"]))
    on.change(lambda v: gr.update(interactive=bool(v)), [on], [a], api_name=False, queue=False,
              show_progress="hidden")
    refuse_as_typed(a)          # read when the experiment starts; 5 typed is refused, not run at 1
    lesson.dials[ch] = (on, a, said)
    return on, a, said


def restore_dials(lesson: Lesson, query: dict, lang: str, components: list, updates: list) -> None:
    """Deep link `acceptance=A` (ui.server's on_load): every dial ticked at A, merged into the language
    switch's `updates` of the same `components` (the dials follow the language too). A bad value leaves
    them unticked and says why, in one sentence, under each dial."""
    raw = query.get("acceptance")
    if raw is None or raw == "":
        return
    a = parse_acceptance(raw)
    said = "" if a is not None else lessons.say(lang, lessons.Said("errors.bad_acceptance",
                                                                    value=lessons.quoted(str(raw)[:40])))
    for on, slider, line in lesson.dials.values():
        if a is not None:
            updates[components.index(on)].update(value=True)
            updates[components.index(slider)].update(value=a, interactive=True)
        updates[components.index(line)].update(value=said)
