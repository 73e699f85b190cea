"""The live playground's layout: its controls, token view, counters and charts, and which handler of
`specviz.ui.playground.Playground` each of them calls. The handlers live there; this module only lays the
page out and wires it.

The pair list offers, after the real pairs, the acceptance dial on each local target (a synthetic
draft); picking one shows the dial's slider (`#acceptance`), which moves A live, as batch and depth do.
"""
from __future__ import annotations

import gradio as gr

from specviz import lessons
from specviz.charts import blank_figure
from specviz.engine.policies import FIXED, POLICIES
from specviz.limits import MAX_DEPTH
from specviz.serve.catalog import pair_options
from specviz.serve.prompts import DEFAULT_DEPTH, DEFAULT_PROMPT, EXAMPLES
from specviz.ui.errors import refuse_as_typed, whole_numbers
from specviz.ui.playground import CHART_PERIOD_S, DEFAULT_ACCEPTANCE, Playground
from specviz.ui.render import legend_html, tokens_html


def pair_choices(app, lang: str) -> list[tuple[str, str]]:
    """The Playground's pair list: the app's pairs, then the acceptance dial on its local targets."""
    return app.pair_options(lang) + pair_options(getattr(app, "dials", []), lang)


def _policy_info(lang: str) -> str:
    return " · ".join(f"**{lessons.text(lang, spec.label_key)}**: {lessons.text(lang, spec.help_key)}"
                      for spec in POLICIES.values())


def _policy_choices(lang: str) -> list[tuple[str, str]]:
    """(shown, value): the policy's label in the reader's language, its English name as the value."""
    return [(lessons.text(lang, spec.label_key), name) for name, spec in POLICIES.items()]


def build(app) -> "Playground":
    """Lay out the playground inside the current Blocks and wire its handlers."""
    page = Playground(app)
    tr = app.tr
    choices = pair_choices(app, "en")

    def pair_update(lang: str):
        info = lessons.text(lang, "playground.custom_pair_info") if app.allow_custom else None
        return gr.update(label=lessons.text(lang, "app.label_pair"), info=info, choices=pair_choices(app, lang))
    with gr.Row(equal_height=False, elem_id="pg-row"):
        with gr.Column(scale=2, min_width=300, elem_id="pg-controls"):
            pair = tr.add(gr.Dropdown(choices, value=choices[0][1], elem_id="pair", allow_custom_value=app.allow_custom,
                                      label=lessons.text("en", "app.label_pair"),
                                      info=lessons.text("en", "playground.custom_pair_info") if app.allow_custom else None),
                          pair_update)
            # the knobs one drags while a Run streams: on a phone they follow Run and stay in sight (style.css)
            with gr.Column(elem_id="pg-knobs"):
                # the dial's A: shown while a synthetic-draft pair is picked (Playground.on_pair)
                acceptance = tr.add(gr.Slider(0, 1, value=DEFAULT_ACCEPTANCE, step=0.05, elem_id="acceptance",
                                              visible=False),
                                    label="playground.label_acceptance", info="playground.acceptance_info")
                batch = tr.add(gr.Slider(1, app.limits.max_rows_per_user, value=1, step=1, elem_id="batch-size"),
                               label="app.label_batch_size")
                depth = tr.add(gr.Slider(0, MAX_DEPTH, value=DEFAULT_DEPTH, step=1, elem_id="depth"),
                               label="app.label_depth")
            same = tr.add(gr.Checkbox(False, elem_id="same-prompt"), label="app.label_same_prompt")
            policy = tr.add(gr.Radio(_policy_choices("en"), value=FIXED.name, label=lessons.text("en", "app.label_policy"),
                                     elem_id="policy"),
                            lambda lang: gr.update(label=lessons.text(lang, "app.label_policy"), info=_policy_info(lang),
                                                   choices=_policy_choices(lang)))
            # hidden while the policy picked (fixed, at first) reads no threshold: Playground.on_policy_pick
            threshold = tr.add(gr.Number(8, elem_id="threshold", visible=False), label="app.label_threshold")
            temperature = tr.add(gr.Slider(0, app.limits.max_temperature, value=0, step=0.05, elem_id="temperature"),
                                 label="app.label_temperature")
            max_new = tr.add(gr.Slider(app.limits.min_new_tokens, app.limits.max_new_tokens, value=128, step=1,
                                       elem_id="max-new-tokens"),
                             label="app.label_max_new_tokens")
            with gr.Group():
                replay_pick = tr.add(gr.Dropdown(page.runs.shipped_options("en"), value=None, elem_id="replay-pick",
                                                 label=lessons.text("en", "playground.replay_pick")),
                                     lambda lang: gr.update(label=lessons.text(lang, "playground.replay_pick"),
                                                            choices=page.runs.shipped_options(lang)))
                # any type: gradio's own type check refused a .txt in English, on a Persian page too; the
                # reader says in the page's language what is wrong with the file (serve.recordings)
                replay_file = tr.add(gr.File(elem_id="replay-file", height=90),
                                     label="playground.replay_file")
                replay = tr.add(gr.Button(elem_id="replay"), value="app.replay")
        with gr.Column(scale=3, min_width=320, elem_id="pg-main"):
            with gr.Column(elem_id="pg-top"):
                tr.add(gr.Markdown(elem_id="pg-intro"), value="playground.intro")
                # no max_length: the browser cut a long paste at it in silence; Run's check refuses it in a
                # sentence that gives both lengths, and the text stays for the reader to shorten
                prompt = tr.add(gr.Textbox(DEFAULT_PROMPT, lines=3, elem_id="prompt"), label="app.label_prompt")
                with gr.Row():
                    run = tr.add(gr.Button(variant="primary", elem_id="run"), value="app.label_run")
                    stop = tr.add(gr.Button(variant="stop", elem_id="stop"), value="app.label_stop")
                    press = gr.Number(0, label="Run press number (the page counts; API callers leave it out)",
                                      visible="hidden", elem_id="run-press", precision=0)   # see RUN_PRESS_JS
            # the status and the tokens follow the language switch in Playground.on_switch (they may show a Run)
            status = tr.direction(gr.Markdown(app.startup_note, label="Status", elem_id="status"))
            tr.add(gr.HTML(legend_html("en")), lambda lang: gr.update(value=legend_html(lang)))
            tokens = gr.HTML(tokens_html(None, lessons.text("en", "playground.press_run")), label="Tokens",
                             elem_id="tokens")
            batch_now = tr.direction(gr.Markdown("", label="Batch now", elem_id="batch-now"))
            counters_box = tr.direction(gr.Markdown("", label="Counters", elem_id="counters"))
            rows = gr.HTML("", label="Rows", elem_id="rows")
            with gr.Row():
                chart_t = tr.add(gr.Plot(blank_figure(), label="Throughput", elem_id="chart-throughput"),
                                 label="playground.chart.plot_throughput")
                chart_h = tr.add(gr.Plot(blank_figure(), label="Hardware", elem_id="chart-hardware"), label="playground.chart.plot_hardware")
            chart_a = tr.add(gr.Plot(blank_figure(), label="Acceptance", elem_id="chart-accept"),
                             label="playground.chart.plot_acceptance")
            # the article's central picture, drawn from the class's own steps: full width
            chart_k = tr.add(gr.Plot(blank_figure(), label="Pass time", elem_id="chart-knee-live"),
                             label="playground.chart.plot_knee")
            with gr.Row():
                # a DownloadButton's label is its text; its value is the file, set when a Run ends: shown then,
                # since one without a file does nothing when pressed
                csv = tr.add(gr.DownloadButton(value=None, elem_id="csv-playground", size="sm", visible=False),
                             label="playground.download_label")
                save = tr.add(gr.DownloadButton(value=None, elem_id="save-run", size="sm", visible=False),
                              label="app.save_run")
                check = tr.add(gr.Button(size="sm", elem_id="check-lossless"), value="app.check_lossless")
            lossless = tr.direction(gr.Markdown("", label="Lossless check", elem_id="lossless"))
            result = gr.JSON(label="Result", visible=False, elem_id="result")
            examples = gr.Examples(EXAMPLES, inputs=prompt, label=lessons.text("en", "playground.examples"))
            tr.add(examples.dataset, label="playground.examples")

    outputs = [tokens, rows, counters_box, chart_t, chart_h, chart_a, status, csv, save, result]   # as OUTPUTS
    # charts refresh on their own clock (2 Hz), independent of how long a decoding step takes
    timer = gr.Timer(CHART_PERIOD_S)
    timer.tick(page.on_tick, [pair], [chart_t, chart_h, chart_a, chart_k, batch_now], api_name=False, queue=False,
               show_progress="hidden")
    # preprocess=False: the API bypasses the sliders, so the raw values go straight to our one check
    # (`serve.door.check_run`), whose sentences a student understands — not to gradio's type errors
    # the press is noted at once (queue=False), so a Stop pressed before the queued Run starts stops it
    # the same press also clears the lossless verdict, which spoke of the run before (no second listener on Run)
    run.click(page.on_arm, [press], [lossless], js=RUN_PRESS_JS, api_name=False, queue=False, show_progress="hidden").then(
              page.generate, [prompt, pair, batch, depth, policy, threshold, temperature, max_new, same, acceptance],
              outputs,
              api_name="generate", concurrency_limit=app.limits.max_shared_rows + app.limits.max_queue,
              preprocess=False).success(   # the API's outputs stay the files' paths; the page shows the buttons
        lambda: (gr.update(visible=True),) * 2, None, [csv, save], api_name=False, queue=False, show_progress="hidden")
    # a replay mostly sleeps: it never waits for another user's replay or Run (RunStore.replay_slot)
    replay.click(page.on_replay_press, None, [lossless], api_name=False, queue=False, show_progress="hidden").then(
                 page.replay, [replay_pick, replay_file], outputs, api_name="replay", concurrency_limit=None)
    check.click(page.check_lossless, None, [lossless], api_name="check_lossless", concurrency_limit=2)
    # queued, with no limit: a refused value (999 typed into the batch box) is shown only from the queue,
    # and a knob never waits for another event
    knob = dict(outputs=None, api_name=False, concurrency_limit=None, show_progress="hidden")
    depth.change(page.on_depth, [depth], **knob)
    # a vLLM server has one k: picking such a pair shows it on the slider (specviz.serve.vllm_router.depth_mode)
    pair.change(page.on_pair, [pair], [depth], api_name=False, queue=False, show_progress="hidden")
    pair.change(page.on_pair_dial, [pair], [acceptance], api_name=False, queue=False, show_progress="hidden")
    acceptance.change(page.on_acceptance, [acceptance], **knob)
    batch.change(page.on_batch, [batch], **knob)
    policy.change(page.on_policy_pick, [policy, threshold], [threshold], api_name=False, queue=False,
                  show_progress="hidden")
    threshold.change(page.on_policy, [policy, threshold], **knob)
    refuse_as_typed(temperature, max_new)      # read at the next Run; a typo is refused now, as batch's is
    whole_numbers(batch, depth, max_new)       # 2.5 rows is refused as typed, and the box moves to 3
    stop.click(page.on_stop, [press], None, js=STOP_PRESS_JS, api_name="stop", queue=False)
    page.components = dict(pair=pair, prompt=prompt, batch=batch, depth=depth, policy=policy, acceptance=acceptance,
                           temperature=temperature, max_new=max_new)
    page.redrawn = [*outputs, chart_k, lossless]       # what Playground.on_switch draws again, in its order
    return page


# Run and Stop travel as two requests that may arrive in either order (both pressed at once, a busy
# server): the page numbers its presses of Run, and Stop names the newest, so the server knows which
# Run a Stop was meant for (specviz.serve.live.LiveRuns).
RUN_PRESS_JS = "() => { window.specvizPress = (window.specvizPress || 0) + 1; return [window.specvizPress]; }"
STOP_PRESS_JS = "() => [window.specvizPress || -1]"
