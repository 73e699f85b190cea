"""The "What if?" tab: estimates over GPU and model presets, from the calibrated cost model (rates and
overheads measured) or the ideal roofline (the article's argument), with published measurements drawn
over them where a source measured the same setup, beside the latency curves recorded on real hardware
(`assets/profiles/`, measured) and a knee measured from the page. Its words are the [whatif] table of
specviz/lessons/{en,fa}.toml; handlers write in the session's language (English for API callers)."""
from __future__ import annotations

from typing import NamedTuple

import gradio as gr

from specviz import lessons
from specviz.hardware.gpu_records import as_profile, recorded_curves
from specviz.hardware.presets import GPUS, MODELS
from specviz.hardware.profiles import load_profiles
from specviz.limits import LimitError
from specviz.pairs.models import ModelError
from specviz.serve import runner
from specviz.serve.catalog import pair_options
from specviz.ui.deeplink import WHATIF_KNOBS, query
from specviz.ui.errors import as_sentences, whole_numbers
from specviz.ui.runs import TempFiles, write_csv
from specviz.ui.shown import SessionTable
from specviz.ui.whatif_measured import KNEE_CONTEXT, knee_view, profile_view
from specviz.ui.whatif_views import (ALPHA_MAX, BW_TBS, CONTEXT_MAX, CUSTOM_GPU, DEFAULTS, FLOPS_TFLOPS,
                                     OVERHEAD_MAX_MS, THIS_MACHINE, compute, csv_rows, draft_options, gpu_options,
                                     is_rtl, lang_of, model_options, model_spec, remap_draft, speedup_view, tx)


def _label(key: str) -> dict:
    return dict(label=f"whatif.label.{key}")


def _text_md(tr, key: str, **kwargs) -> gr.Markdown:
    """A Markdown of the tab's fixed text that follows the language switch. gr.Markdown renders with
    dir="ltr" unless told otherwise, whatever the page's direction, so the direction travels with the text."""
    return tr.add(gr.Markdown(tx(lessons.DEFAULT_LANG, key), **kwargs),
                  lambda lang: gr.update(value=tx(lang, key), rtl=is_rtl(lang)))


def _generated_md(tr, **kwargs) -> gr.Markdown:
    """A Markdown whose text handlers write: the switch sets only its direction (its text is re-rendered
    by the handler that knows the knobs)."""
    return tr.add(gr.Markdown(**kwargs), lambda lang: gr.update(rtl=is_rtl(lang)))


class Wiring(NamedTuple):
    """What the page wires to the tab: (fn, the knobs it reads, outputs). `on_link` runs after the page's load,
    once a link's values are in; `relabel` on the reader's language pick, with that language first."""
    on_link: tuple
    relabel: tuple


def build(app, on_page_load=None) -> tuple[dict, Wiring]:
    """The tab inside the current Blocks. Returns its knobs by deep-link name (ui.deeplink.EXTRA), and its
    Wiring to the page's load and language switch. `on_page_load(request, lang)` runs first in `on_link`'s
    queued event (the link's notice: gradio shows a warning only from the queue, and a page load queues
    one event, not two)."""
    tr = app.tr
    models = list(MODELS)
    _text_md(tr, "intro", elem_id="whatif-intro")
    # Holds the page's language (the switch updates it); its change re-renders the measured knee and profile.
    # A mounted Textbox, not a gr.State: the switch's handler runs outside the queue, and only queued events
    # report a State's change to the page.
    lang_box = tr.add(gr.Textbox(lessons.DEFAULT_LANG, visible="hidden", elem_id="whatif-lang"),
                      lambda lang: gr.update(value=lang))
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            gpu = tr.add(gr.Dropdown(gpu_options("en"), value=DEFAULTS["gpu"], label=tx("en", "label.gpu"),
                                     elem_id="whatif-gpu"),
                         lambda lang: gr.update(label=tx(lang, "label.gpu"), choices=gpu_options(lang)))
            target = tr.add(gr.Dropdown(models, value=DEFAULTS["target"], label=tx("en", "label.target"),
                                        elem_id="whatif-target"), **_label("target"))
            # its choices depend on the target, so the language change re-labels them in `relabel` below
            draft = tr.add(gr.Dropdown(draft_options(DEFAULTS["target"], "en"), value=DEFAULTS["draft"],
                                       label=tx("en", "label.draft"), elem_id="whatif-draft"), **_label("draft"))
            alpha = tr.add(gr.Slider(0, ALPHA_MAX, value=DEFAULTS["alpha"], step=0.01, label=tx("en", "label.alpha"),
                                     elem_id="whatif-alpha"), **_label("alpha"))
            context = tr.add(gr.Slider(1, CONTEXT_MAX, value=DEFAULTS["context"], step=1, label=tx("en", "label.context"),
                                       elem_id="whatif-context"), **_label("context"))
            overhead = tr.add(gr.Slider(0, OVERHEAD_MAX_MS, value=DEFAULTS["overhead"], step=0.1,
                                        label=tx("en", "label.overhead"), elem_id="whatif-overhead"),
                              **_label("overhead"))
            model = tr.add(gr.Radio(model_options("en"), value=DEFAULTS["model"], label=tx("en", "label.model"),
                                    info=tx("en", "label.model_info"), elem_id="whatif-model"),
                           lambda lang: gr.update(label=tx(lang, "label.model"), info=tx(lang, "label.model_info"),
                                                  choices=model_options(lang)))
            with gr.Row():
                # both bounds on the box, so a value past either end is refused in the same words before any
                # handler (a custom GPU is held to them again in whatif_views._hardware, for the CLI)
                custom = DEFAULTS["gpu"] == CUSTOM_GPU     # editable only where they count (gpu.change below)
                # a step in thousandths: TB/s are fractions (3.35), so a typed decimal comma is their point;
                # TFLOP/s keep whole steps, where a comma is a thousands mark (1,979)
                bw = tr.add(gr.Number(DEFAULTS["bandwidth_tbs"], label=tx("en", "label.bandwidth"), minimum=BW_TBS[0],
                                      maximum=BW_TBS[1], step=0.001, elem_id="whatif-bandwidth", interactive=custom),
                            **_label("bandwidth"))
                fl = tr.add(gr.Number(DEFAULTS["flops_tflops"], label=tx("en", "label.flops"), minimum=FLOPS_TFLOPS[0],
                                      maximum=FLOPS_TFLOPS[1], elem_id="whatif-flops", interactive=custom),
                            **_label("flops"))
        with gr.Column(scale=3, min_width=420):
            vals = list(DEFAULTS.values())
            md0, lat0, x0 = compute(app, *vals)
            summary = _generated_md(tr, value=md0, label="Summary", elem_id="whatif-summary")
    fig_speedup = tr.add(gr.Plot(speedup_view(app, *vals), label=tx("en", "label.speedup"),
                                 elem_id="whatif-speedup"), **_label("speedup"))
    with gr.Row():
        fig_lat = tr.add(gr.Plot(lat0, label=tx("en", "label.latency"), elem_id="whatif-latency"),
                         **_label("latency"))
        fig_x = tr.add(gr.Plot(x0, label=tx("en", "label.crossover"), elem_id="whatif-crossover"),
                       **_label("crossover"))
    inputs = [gpu, target, draft, alpha, context, overhead, model, bw, fl]
    # the numbers count when the user commits them (Enter or leaving the box), not on .change: a Number
    # that gradio re-renders after an edit fires .change again, and a custom bandwidth then looped
    # through /whatif dozens of times a second
    # the knobs count when the reader sets them (a slider's or the radio's .input, a dropdown's pick below),
    # and a page's load computes once after its link's values are all in (on_link): its .change events read
    # the knobs half set, and met the draft's old list (4 refusals of a draft the link had right)
    triggers = [alpha.input, context.input, overhead.input, model.input, bw.blur, fl.blur]
    whole_numbers(context)             # tokens of context: 800.5 is refused, and the box moves to 801
    # Enter leaves the box, so its commit is the blur alone: Enter and then a click elsewhere sent the
    # value twice, and a refused one gave its sentence twice ("(2)")
    for box in (bw, fl):
        box.submit(None, None, None, js="() => { document.activeElement?.blur(); }", api_name=False)

    # explicit parameters (not *vals) so gradio can add the request; the API keeps its nine inputs
    def on_change(gpu, target, draft, alpha, context, overhead, model, bw, fl, request: gr.Request):
        lang = lang_of(app, request)
        try:
            return compute(app, gpu, target, draft, alpha, context, overhead, model, bw, fl, lang=lang)
        except gr.Error as exc:     # a reader who changed the target next read the old target's figures as new
            raise gr.Error(f"{exc.message} {tx(lang, 'not_recomputed')}", print_exception=False) from None
    # and where gradio's own input check refuses a value before the handler runs (ui.errors)
    on_change.refusal_note = lambda lang: tx(lang, "not_recomputed")

    def on_speedup(gpu, target, draft, alpha, context, overhead, model, bw, fl, request: gr.Request):
        return speedup_view(app, gpu, target, draft, alpha, context, overhead, model, bw, fl,
                            lang=lang_of(app, request))

    def on_pick(new_target, current, request: gr.Request):
        # a new target takes its own EAGLE head along, and the draft list is the target's
        model_spec(new_target, 2.0, lang_of(app, request))          # an unknown target is refused by name
        return gr.update(choices=draft_options(new_target, lang_of(app, request)),
                         value=remap_draft(current, new_target))

    def relabel(lang, *vals):
        # the reader's pick only: a page's load is on_link's (its language's events read the knobs half set)
        lang = lang if lang in lessons.LANGS else lessons.DEFAULT_LANG
        draft_update = gr.update(choices=draft_options(vals[1], lang))
        try:
            return (*compute(app, *vals, lang=lang), speedup_view(app, *vals, lang=lang), draft_update)
        except gr.Error:           # the knobs' error was shown when they were set; no second toast
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), draft_update

    def on_link(gpu, target, draft, alpha, context, overhead, model, bw, fl, request: gr.Request):
        # a link sets the knobs without the events a reader's picks fire: the tab computes once for them, and
        # in the page's language; an English page opened without What if? knobs is left as it was built
        lang = lang_of(app, request)
        if on_page_load is not None:
            on_page_load(request, lang)
        if not WHATIF_KNOBS & set(query(request)) and lang == lessons.DEFAULT_LANG:
            return (gr.skip(),) * 5
        vals = (gpu, target, draft, alpha, context, overhead, model, bw, fl)
        return (*on_change(*vals, request=request), on_speedup(*vals, request=request), (bw, fl))

    # the speed-up figure follows only a change the summary accepted: a refused value gets one sentence,
    # and its box goes back to the value the figures were computed from, so box and figures agree
    accepted = gr.State((DEFAULTS["bandwidth_tbs"], DEFAULTS["flops_tflops"]))
    quiet = dict(api_name=False, queue=False, show_progress="hidden")
    remember = dict(fn=lambda b, f: (b, f), inputs=[bw, fl], outputs=[accepted], **quiet)
    change = gr.on(triggers, on_change, inputs, [summary, fig_lat, fig_x], api_name="whatif", show_progress="hidden")
    change.success(on_speedup, inputs, [fig_speedup], api_name="whatif_speedup", show_progress="hidden")
    change.success(**remember)
    # a preset picked meanwhile shows its own rates (its pick may land before this refusal returns)
    change.failure(lambda last, g: last if g == CUSTOM_GPU else preset_rates(g, app.peaks), [accepted, gpu], [bw, fl],
                   **quiet)
    # a dropdown's pick is its .blur, once by mouse or keyboard: gradio sends .select for a click only, and
    # .input twice (the pick, then the blur after it: the second new target met the first's draft list)
    (gr.on([gpu.blur, target.blur, draft.blur], on_pick, [target, draft], [draft], api_name="on_target",
           show_progress="hidden")
     .success(on_change, inputs, [summary, fig_lat, fig_x], api_name=False, show_progress="hidden")
     .success(on_speedup, inputs, [fig_speedup], api_name=False, show_progress="hidden")
     .success(**remember))
    # a preset GPU ignores the two boxes: a reader typed 1 TB/s with the H100 picked and nothing changed;
    # they show the preset's own rates (L4's showed H100's), a start for a custom GPU picked next
    gpu.change(lambda g: preset_rates(g, app.peaks), [gpu], [bw, fl], api_name=False, queue=False,
               show_progress="hidden")
    with gr.Row():
        csv_btn = tr.add(gr.Button(size="sm", elem_id="whatif-csv"), value="app.download_csv")
        # shown once it holds a file (an empty upload-like box beside the button read as a place to drop one)
        csv_file = gr.File(label="CSV", elem_id="whatif-csv-file", show_label=False, height=60, visible=False)
    files = TempFiles()

    def on_csv(*vals):
        with as_sentences():
            path = files.path("specviz-whatif", "csv")
            write_csv(path, csv_rows(app, *vals))
            return path
    csv_btn.click(on_csv, inputs, [csv_file], api_name="whatif_csv").success(
        lambda: gr.update(visible=True), None, [csv_file], api_name=False, queue=False, show_progress="hidden")
    _build_measure(app, lang_box)
    _build_profiles(app, lang_box)
    knobs = dict(gpu=gpu, target=target, draft=draft, alpha=alpha, context=context, overhead=overhead, model=model,
                 bandwidth=bw, flops=fl)
    figures = [summary, fig_lat, fig_x, fig_speedup]
    return knobs, Wiring(on_link=(on_link, inputs, [*figures, accepted]), relabel=(relabel, inputs, [*figures, draft]))


def preset_rates(gpu: str, peaks=None) -> tuple:
    """The custom-GPU boxes for this choice: editable for the custom GPU, else locked, with the rates the
    estimate uses in them: a preset's datasheet bandwidth (TB/s) and dense FLOP/s (TFLOP/s), this
    machine's calibrated peaks (`peaks`, once measured)."""
    if gpu in GPUS:
        bandwidth, flops = GPUS[gpu].bandwidth, GPUS[gpu].flops
    elif gpu == THIS_MACHINE and peaks is not None:
        bandwidth, flops = peaks.bandwidth, peaks.flops
    else:
        return (gr.update(interactive=gpu == CUSTOM_GPU),) * 2
    return (gr.update(interactive=False, value=round(bandwidth / 1e12, 3)),
            gr.update(interactive=False, value=round(flops / 1e12, 3)))


def _build_measure(app, lang_box) -> None:
    tr = app.tr
    _text_md(tr, "measure_intro")
    labels = pair_options(app.choices, "en")
    with gr.Row():
        pick = tr.add(gr.Dropdown(labels, value=labels[0][1], label=tx("en", "label.knee_pair"), elem_id="knee-pair",
                                  scale=3),
                      lambda lang: gr.update(label=tx(lang, "label.knee_pair"), choices=pair_options(app.choices, lang)))
        go = tr.add(gr.Button(tx("en", "label.knee_run"), elem_id="knee-run", scale=1), value="whatif.label.knee_run")
    md = _generated_md(tr, value="", label="Knee summary", elem_id="knee-summary")
    # shown once it holds a curve (an empty plot's placeholder icon read as a broken chart)
    fig = tr.add(gr.Plot(label=tx("en", "label.measured_latency"), elem_id="knee-plot", visible=False),
                 **_label("measured_latency"))

    def shown(upd, lang):
        md_text, figure = knee_view(upd, lang=lang)
        return md_text, gr.update(value=figure, visible=True)

    measured = SessionTable()        # each page's latest curve, drawn again in the language picked

    def measure(label, request: gr.Request):
        lang = lang_of(app, request)
        choice = app.choice(label, lang)
        yield tx(lang, "loading", label=lessons.say(lang, choice.label)), gr.skip()
        try:
            for upd in app.runner.knee(choice, KNEE_CONTEXT, app.peaks):
                lang = lang_of(app, request)            # the reader may switch language meanwhile
                if isinstance(upd, runner.Waiting):
                    yield tx(lang, "knee_waiting", position=upd.position), gr.skip()
                    continue
                if request.session_hash:
                    measured.put(request.session_hash, upd)
                yield shown(upd, lang)
        except (ModelError, LimitError) as exc:
            raise gr.Error(lessons.say(lang, exc)) from None

    def relabel(lang, request: gr.Request):
        upd = measured.get(request.session_hash) if request.session_hash else None
        if upd is None:
            return gr.skip(), gr.skip()
        return shown(upd, lang if lang in lessons.LANGS else lessons.DEFAULT_LANG)

    go.click(measure, [pick], [md, fig], api_name="measure_knee", concurrency_limit=1)
    lang_box.change(relabel, [lang_box], [md, fig], api_name=False, show_progress="hidden")


def _build_profiles(app, lang_box) -> None:
    tr = app.tr
    _text_md(tr, "profiles_heading")
    # this project's recorded profiles, then the GPU curves scripts/gpu-check recorded (assets/gpu/)
    profiles = load_profiles() + [as_profile(c) for c in recorded_curves()]
    if not profiles:
        _text_md(tr, "no_profiles")
        return
    labels = [p.label for p in profiles]

    def options(lang: str) -> list[tuple[str, str]]:
        return [(lessons.say(lang, p.label), str(p.label)) for p in profiles]
    pick = tr.add(gr.Dropdown(options("en"), value=str(labels[0]), label=tx("en", "label.profile"), elem_id="profile"),
                  lambda lang: gr.update(label=tx(lang, "label.profile"), choices=options(lang)))
    md0, fig0 = profile_view(profiles, labels[0])
    md = _generated_md(tr, value=md0, label="Profile summary", elem_id="profile-summary")
    fig = tr.add(gr.Plot(fig0, label=tx("en", "label.measured_latency"), elem_id="profile-latency"),
                 **_label("measured_latency"))

    def on_profile(name, request: gr.Request):
        return profile_view(profiles, name, lang_of(app, request))

    def relabel(lang, name):
        return profile_view(profiles, name, lang if lang in lessons.LANGS else lessons.DEFAULT_LANG)

    pick.change(on_profile, [pick], [md, fig], api_name="profile", show_progress="hidden")
    lang_box.change(relabel, [lang_box, pick], [md, fig], api_name=False, show_progress="hidden")
