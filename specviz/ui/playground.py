"""The live playground. This module owns the page's layout and its handlers (`Playground`).

Sliders act on the running generation at its next step (the request's live knobs). Every Run joins
the pair's shared batch, so a student sees classmates join and leave it. Rows beyond the first take
prompts from a pool of varied prompts (unless "all rows the same prompt" is ticked), so acceptance
differs per row as in real serving. After a Run, plain decoding of the same prompts and batch is
measured automatically, so the page can say "spent X× the FLOPs, finished Y× sooner".
"""
from __future__ import annotations

import threading
import time

import gradio as gr

from specviz import lessons
from specviz.charts import blank_figure
from specviz.engine.policies import FIXED, POLICIES, PolicyError
from specviz.engine.request import Knobs, RunTotals
from specviz.limits import MAX_DEPTH, LimitError, check_prompt_text
from specviz.pairs.pipeline import encode_prompt
from specviz.serve import runner
from specviz.serve.door import check_run
from specviz.serve.live import LiveRun
from specviz.serve.prompts import DEFAULT_DEPTH, DEFAULT_PROMPT, EXAMPLES, ROW_POOL
from specviz.ui import counters
from specviz.ui.errors import as_sentences, error, human
from specviz.ui.i18n import t
from specviz.ui.render import legend_html, tokens_html
from specviz.ui.runs import RunStore
from specviz.ui.stream import OUTPUTS, Streamer, pack

MIN_UPDATE_S = 0.2        # ≤ 5 updates a second: faster only makes the browser steal the CPU
CHART_PERIOD_S = 0.25     # charts refresh at 4 Hz (gr.Timer); tokens at up to 5 Hz
BASELINE_MAX_NEW = 128    # the automatic plain-decoding baseline decodes at most this many tokens
# A Run that arrives while the app warms up its fast path waits for it: beside the warm-up (which times
# layouts on the same cores) a Run's verdict reads far below the same Run's once warm.
# Past this wait it runs, and its verdict is withheld
WARMUP_WAIT_S = 180.0
WARMUP_POLL_S = 1.0


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
    choices = app.pair_options("en")

    def pair_update(lang: str):
        info = lessons.text(lang, "playground.custom_pair_info") if app.allow_custom else None
        return gr.update(label=lessons.text(lang, "app.label_pair"), info=info, choices=app.pair_options(lang))
    with gr.Row(equal_height=False, elem_id="pg-row"):
        with gr.Column(scale=2, min_width=300, elem_id="pg-controls"):
            pair = tr.add(gr.Dropdown(choices, value=choices[0][1], elem_id="pair", allow_custom_value=app.allow_custom,
                                      label=lessons.text("en", "app.label_pair"),
                                      info=lessons.text("en", "playground.custom_pair_info") if app.allow_custom else None),
                          pair_update)
            batch = tr.add(gr.Slider(1, app.limits.max_rows_per_user, value=1, step=1, elem_id="batch-size"),
                           label="app.label_batch_size")
            depth = tr.add(gr.Slider(0, MAX_DEPTH, value=DEFAULT_DEPTH, step=1, elem_id="depth"),
                           label="app.label_depth")
            same = tr.add(gr.Checkbox(False, elem_id="same-prompt"), label="app.label_same_prompt")
            policy = tr.add(gr.Radio(_policy_choices("en"), value=FIXED.name, label=lessons.text("en", "app.label_policy"),
                                     elem_id="policy"),
                            lambda lang: gr.update(label=lessons.text(lang, "app.label_policy"), info=_policy_info(lang),
                                                   choices=_policy_choices(lang)))
            threshold = tr.add(gr.Number(8, elem_id="threshold"), label="app.label_threshold")
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
                replay_file = tr.add(gr.File(file_types=[".json"], elem_id="replay-file", height=90),
                                     label="playground.replay_file")
                replay = tr.add(gr.Button(elem_id="replay"), value="app.replay")
        with gr.Column(scale=3, min_width=320, elem_id="pg-main"):
            tr.add(gr.Markdown(elem_id="pg-intro"), value="playground.intro")
            prompt = tr.add(gr.Textbox(DEFAULT_PROMPT, lines=3, elem_id="prompt", max_length=app.limits.max_prompt_chars),
                            label="app.label_prompt")
            with gr.Row():
                run = tr.add(gr.Button(variant="primary", elem_id="run"), value="app.label_run")
                stop = tr.add(gr.Button(variant="stop", elem_id="stop"), value="app.label_stop")
                press = gr.Number(0, label="Run press number (the page counts; API callers leave it out)",
                                  visible="hidden", elem_id="run-press", precision=0)   # see RUN_PRESS_JS
            status = tr.add(gr.Markdown(app.startup_note, label="Status", elem_id="status"),
                            lambda lang: gr.update(value=app.startup_md(lang)))
            tr.add(gr.HTML(legend_html("en")), lambda lang: gr.update(value=legend_html(lang)))
            tokens = tr.add(gr.HTML(tokens_html(None, lessons.text("en", "playground.press_run")), label="Tokens",
                                    elem_id="tokens"),
                            lambda lang: gr.update(value=tokens_html(None, lessons.text(lang, "playground.press_run"))))
            batch_now = tr.direction(gr.Markdown("", label="Batch now", elem_id="batch-now"))
            counters_box = tr.direction(gr.Markdown("", label="Counters", elem_id="counters"))
            rows = gr.HTML("", label="Rows", elem_id="rows")
            with gr.Row():
                chart_t = tr.add(gr.Plot(blank_figure(), label="Throughput", elem_id="chart-throughput"),
                                 label="playground.chart.plot_throughput")
                chart_h = tr.add(gr.Plot(blank_figure(), label="Hardware", elem_id="chart-hardware"), label="playground.chart.plot_hardware")
            chart_a = tr.add(gr.Plot(blank_figure(), label="Acceptance", elem_id="chart-accept"), label="playground.chart.plot_acceptance")
            with gr.Row():
                # a DownloadButton's label is its text; its value is the file (set when a Run ends)
                csv = tr.add(gr.DownloadButton(value=None, elem_id="csv-playground", size="sm"),
                             label="playground.download_label")
                save = tr.add(gr.DownloadButton(value=None, elem_id="save-run", size="sm"), label="app.save_run")
                check = tr.add(gr.Button(size="sm", elem_id="check-lossless"), value="app.check_lossless")
            lossless = tr.direction(gr.Markdown("", label="Lossless check", elem_id="lossless"))
            result = gr.JSON(label="Result", visible=False, elem_id="result")
            examples = gr.Examples(EXAMPLES, inputs=prompt, label=lessons.text("en", "playground.examples"))
            tr.add(examples.dataset, label="playground.examples")

    outputs = [tokens, rows, counters_box, chart_t, chart_h, chart_a, status, csv, save, result]   # as OUTPUTS
    # charts refresh on their own clock (4 Hz), independent of how long a decoding step takes
    timer = gr.Timer(CHART_PERIOD_S)
    timer.tick(page.on_tick, [pair], [chart_t, chart_h, chart_a, batch_now], api_name=False, queue=False,
               show_progress="hidden")
    # preprocess=False: the API bypasses the sliders, so the raw values go straight to our one check
    # (`serve.door.check_run`), whose sentences a student understands — not to gradio's type errors
    # the press is noted at once (queue=False), so a Stop pressed before the queued Run starts stops it
    run.click(page.on_arm, [press], None, js=RUN_PRESS_JS, api_name=False, queue=False, show_progress="hidden").then(
              page.generate, [prompt, pair, batch, depth, policy, threshold, temperature, max_new, same], outputs,
              api_name="generate", concurrency_limit=app.limits.max_shared_rows + app.limits.max_queue,
              preprocess=False)
    # a replay mostly sleeps: it never waits for another user's replay or Run (RunStore.replay_slot)
    replay.click(page.replay, [replay_pick, replay_file], outputs, api_name="replay", concurrency_limit=None)
    check.click(page.check_lossless, None, [lossless], api_name="check_lossless", concurrency_limit=2)
    knob = dict(outputs=None, api_name=False, queue=False, show_progress="hidden")
    depth.change(page.on_depth, [depth], **knob)
    # a vLLM server has one k: picking such a pair shows it on the slider (specviz.serve.vllm_router.depth_mode)
    pair.change(page.on_pair, [pair], [depth], api_name=False, queue=False, show_progress="hidden")
    batch.change(page.on_batch, [batch], **knob)
    policy.change(page.on_policy_pick, [policy, threshold], [threshold], api_name=False, queue=False,
                  show_progress="hidden")
    threshold.change(page.on_policy, [policy, threshold], **knob)
    stop.click(page.on_stop, [press], None, js=STOP_PRESS_JS, api_name="stop", queue=False)
    page.components = dict(pair=pair, prompt=prompt, batch=batch, depth=depth, policy=policy)
    return page


# Run and Stop travel as two requests that may arrive in either order (both pressed at once, a busy
# server): the page numbers its presses of Run, and Stop names the newest, so the server knows which
# Run a Stop was meant for (specviz.serve.live.LiveRuns).
RUN_PRESS_JS = "() => { window.specvizPress = (window.specvizPress || 0) + 1; return [window.specvizPress]; }"
STOP_PRESS_JS = "() => [window.specvizPress || -1]"


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "default"


class Playground:
    """The playground's handlers. Per-session state: `app.runs` (the live run), `self.runs` (the last
    finished run, its recording and baseline)."""

    def __init__(self, app):
        self.app = app
        self.runs = RunStore()
        self._lock = threading.Lock()
        self._batch_text: dict[str, str] = {}     # session → last "batch now" line sent
        self._pools: dict[tuple[str, str], list[list[int]]] = {}
        self.bands = counters.NoiseBands()        # every session's baselines: the verdict's measured band

    def lang(self, session: str) -> str:
        tr = getattr(self.app, "tr", None)
        return tr.lang_of(session) if tr is not None else lessons.DEFAULT_LANG

    # --- Run ----------------------------------------------------------------------------------------
    def generate(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, same_prompt=False,
                 request: gr.Request = None):
        yield from self.stream(prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                               _session(request), same_prompt)

    def stream(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, session,
               same_prompt=True):
        app, lang = self.app, self.lang(session)
        with as_sentences(lang):
            args = check_run(batch_size, k, temp, max_tokens, policy_name, thr, app.limits)
            check_prompt_text(prompt_text, app.limits)
            knobs = Knobs(args.depth, args.batch, args.policy.build(), max_batch=app.limits.max_rows_per_user)
            choice = app.choice(pair_label, lang)
        if not app.pairs.loaded(choice):
            yield pack(status=t(lang, "playground.status_loading", pair=choice.label))
        with as_sentences(lang):
            pair = app.load(choice, lang)
            prompts = [encode_prompt(pair.tokenizer, prompt_text, limits=app.limits)]
            if not (same_prompt is True or str(same_prompt).lower() == "true"):
                prompts += self._pool(choice, pair)
        during_warmup = yield from self._wait_for_warmup(choice, lang)
        if app.runs.stopped_early(session):
            app.runs.end(session)
            yield pack(status=t(lang, "playground.status_stopped", tokens=0),
                       result={"done": True, "engine": choice.engine, "stopped": True, "stopped_before_start": True, "prompt_ids": [],
                               "outputs": [], **RunTotals().as_dict()})
            return
        req = runner.RunRequest(choice.target, choice.draft, tuple(map(tuple, prompts)), args.depth, args.batch,
                                args.policy, args.temperature, args.max_new)
        live = LiveRun(app.runner.control(knobs, args.policy), choice.label, app.peaks,
                       app.sampler, shared=not app.runner.zero_gpu, lang=lang)
        streamer = Streamer(app, live, pair.tokenizer, session, lang, choice)
        packet = yield from self._run(req, choice, live, streamer, session)
        during_warmup = during_warmup or self._warming(choice)
        outs = packet.outputs or {}
        prompt_rows = [prompts[i % len(prompts)] for i in sorted(outs)]
        plain = None
        engine = choice.engine
        if not packet.stopped and not packet.error and packet.totals.drafted and engine == "specviz":
            yield pack(status=t(lang, "playground.baseline_pending"))
            plain = yield from self._baseline(req, choice, knobs.max_batch, pair.tokenizer, session, lang)
        speed = packet.totals.tokens_per_s / plain if plain and packet.totals.tokens_per_s else None
        band = counters.Band()
        if plain and not during_warmup:         # the same request's baselines measure this machine's band
            band = self.bands.add((str(choice.label), req.prompts, req.batch, min(req.max_new, BASELINE_MAX_NEW)),
                                  plain)
        result = {"done": True, "engine": engine, "stopped": packet.stopped, "prompt_ids": prompt_rows,
                  "outputs": [outs[i] for i in sorted(outs)], "worker_pid": packet.worker_pid, "error": packet.error,
                  "plain_tokens_per_s": plain, "speedup_vs_plain": speed, "during_warmup": during_warmup,
                  "verdict": "none" if during_warmup else counters.verdict(speed, band.width),
                  "noise_band": band.width, "noise_band_samples": band.samples, **packet.totals.as_dict()}
        stored = self.runs.finish(session, choice, prompt_text, req, result, streamer.recording(packet), live)
        key = "playground.status_stopped" if packet.stopped else "playground.status_done"
        note = f"⚠ {human(lang, packet.error)}" if packet.error else t(lang, key, tokens=packet.totals.tokens)
        yield streamer.outputs(packet.totals, final=True, result=result, status=note, plain=plain,
                               csv=stored.csv_path, save=stored.recording_path, during_warmup=during_warmup,
                               band=band)
        if packet.error:
            raise gr.Error(human(lang, packet.error))

    def _run(self, req, choice, live, streamer, session):
        """Stream one request's packets into the page; returns the final packet."""
        app, lang = self.app, streamer.lang
        app.runs.start(session, live)
        if app.runner.zero_gpu:
            yield pack(status=t(lang, "playground.status_zerogpu"))
        last_yield, first, packet = 0.0, True, None
        try:
            with as_sentences(lang):
                for packet in app.runner.packets(req, choice, live.control):
                    if packet.position:
                        yield pack(status=t(lang, "playground.status_queue", pos=packet.position))
                        continue
                    self._fold(packet, live, streamer)
                    now = time.perf_counter()
                    if not packet.final and packet.events and now - last_yield >= MIN_UPDATE_S:
                        last_yield = now
                        status = t(lang, "playground.status_running", pair=choice.label) + self._where() if first else None
                        yield streamer.outputs(packet.totals, status=status)
                        first = False
        finally:
            app.runs.finish(session, live)
            live.control.close()
        if packet is None or not packet.final:
            raise error(lang, "errors.generation_no_result")
        return packet

    def _warming(self, choice) -> bool:
        fast = getattr(self.app.pairs, "fast_status", lambda c: None)(choice)
        return fast is not None and fast.state == "warming"

    def _wait_for_warmup(self, choice, lang: str):
        """While the app warms this pair's fast path, wait (up to WARMUP_WAIT_S) with a line saying so
        and for how long; returns True when it is still warming (the Run's figures then get no verdict)."""
        if not self._warming(choice):
            return False
        t0 = time.monotonic()
        while self._warming(choice) and time.monotonic() - t0 < WARMUP_WAIT_S:
            yield pack(status=t(lang, "playground.warmup_wait", seconds=time.monotonic() - t0, limit=WARMUP_WAIT_S))
            time.sleep(WARMUP_POLL_S)
        return self._warming(choice)

    def _baseline(self, req, choice, max_batch: int, tokenizer, session: str, lang: str):
        """Plain decoding of the same prompts and batch, right after the Run (its tokens/s), through the
        same runner and streamed to the page as the Run was (its tokens, rows and counters at the same
        rate, its charts at the timer's): on a 2-core machine the page's rendering takes CPU, so a
        baseline drained without rendering measured faster than the Run it was compared with."""
        plain_req = runner.RunRequest(req.target, req.draft, req.prompts, 0, req.batch, FIXED, 0.0,
                                      min(req.max_new, BASELINE_MAX_NEW))
        control = self.app.runner.control(Knobs(0, req.batch, max_batch=max_batch), FIXED)
        live = LiveRun(control, choice.label, self.app.peaks, self.app.sampler, shared=not self.app.runner.zero_gpu,
                       lang=lang)
        streamer = Streamer(self.app, live, tokenizer, session, lang, choice)
        status = t(lang, "playground.baseline_pending")
        packet, last_yield, last_chart = None, 0.0, 0.0
        try:
            with as_sentences():
                for packet in self.app.runner.packets(plain_req, choice, control):
                    if packet.position:
                        continue
                    self._fold(packet, live, streamer, keep_peaks=False)
                    now = time.perf_counter()
                    if not packet.final and packet.events and now - last_yield >= MIN_UPDATE_S:
                        last_yield = now
                        out = dict(zip(OUTPUTS, streamer.outputs(packet.totals, status=status)))
                        if now - last_chart >= CHART_PERIOD_S:     # what the timer draws during a Run
                            last_chart = now
                            out.update(zip(("chart_t", "chart_h", "chart_a"), live.figures()))
                        yield pack(**out)
        finally:
            control.close()
        if packet is None or packet.error or packet.stopped:
            return None
        return packet.totals.tokens_per_s or None

    def _pool(self, choice, pair) -> list[list[int]]:
        key = (choice.target, choice.draft)
        with self._lock:
            if key not in self._pools:
                self._pools[key] = [encode_prompt(pair.tokenizer, p) for p in ROW_POOL]
            return self._pools[key]

    def _fold(self, packet, live: LiveRun, streamer, keep_peaks: bool = True) -> None:
        """One packet from the runner into the charts and the transcripts."""
        live.feed(packet.samples, packet.sampler_source, packet.peaks, packet.spec)
        if keep_peaks and packet.peaks is not None:
            self.app.peaks = packet.peaks      # a ZeroGPU worker's calibration: the what-if tab can use it
        for ev in packet.events:
            live.record(ev)
            streamer.add(ev)

    def _where(self) -> str:
        return " · ZeroGPU" if self.app.runner.zero_gpu else ""

    # --- replay, lossless check --------------------------------------------------------------------------
    def replay(self, title, upload, request: gr.Request = None):
        session = _session(request)
        lang = self.lang(session)
        with as_sentences(lang):
            rec = self.runs.open_recording(title, upload, lang)
        with self.runs.replay_slot(lang):
            yield from self.runs.play(rec, self.app, lang, session, Streamer, pack)

    def check_lossless(self, request: gr.Request = None):
        session = _session(request)
        lang = self.lang(session)
        with as_sentences(lang):
            return self.runs.check_lossless(session, self.app, lang)

    # --- live knobs ------------------------------------------------------------------------------------
    def set_knobs(self, session: str, depth=None, batch=None, policy=None, threshold=None) -> None:
        """A live change, as the page sent it; the run's control checks it at the door."""
        live = self.app.runs.get(session)
        if live is None:
            return                  # no run streaming: the values apply at the next Run
        try:
            live.control.set(depth=depth, batch=batch, policy=policy, threshold=threshold)
        except (LimitError, ValueError, TypeError, PolicyError) as exc:
            lang = self.lang(session)
            gr.Warning(human(lang, exc), title=lessons.text(lang, "app.warning_title"))

    def on_depth(self, v, request: gr.Request):
        self.set_knobs(_session(request), depth=v)

    def on_batch(self, v, request: gr.Request):
        self.set_knobs(_session(request), batch=v)

    def on_policy(self, p, thr, request: gr.Request):
        self.set_knobs(_session(request), policy=p, threshold=thr)

    def on_policy_pick(self, p, thr, request: gr.Request):
        """A policy that reads the threshold box gets its own default there, and the box says what it means."""
        session = _session(request)
        lang = self.lang(session)
        spec = POLICIES.get(p)
        field = spec.threshold if spec else None
        if field is None:
            self.set_knobs(session, policy=p, threshold=thr)
            return gr.update(label=lessons.text(lang, "playground.threshold_unused"))
        value = spec.default(field)
        self.set_knobs(session, policy=p, threshold=value)
        return gr.update(value=value, label=lessons.text(lang, field.label_key))

    def stop(self, session: str) -> None:
        self.app.runs.stop(session)          # the streaming Run, or the one about to start

    def on_stop(self, press=None, request: gr.Request = None):
        """Stop (the page sends the number of the newest Run press; an API call sends none)."""
        self.app.runs.stop(_session(request), press)

    def on_pair(self, pair_label, request: gr.Request = None):
        """The depth slider for the pair just picked: a vLLM server's own k, locked (a server has one); free
        for our engine and for launched vLLM servers (moving it switches server)."""
        lang = self.lang(_session(request))
        mode = getattr(self.app.runner, "depth_mode", None)
        try:
            kind, k = mode(self.app.choice(pair_label, lang)) if mode else ("ours", None)
        except Exception:                    # a typed pair not loadable yet: the Run will say why
            kind, k = "ours", None
        if kind == "fixed" and k is not None:
            return gr.update(value=k, interactive=False, info=t(lang, "playground.depth_vllm_fixed", k=k))
        if kind == "follows":
            return gr.update(interactive=True, info=t(lang, "playground.depth_vllm_follows"))
        return gr.update(interactive=True, info=None)

    def on_arm(self, press=None, request: gr.Request = None):
        self.app.runs.arm(_session(request), press)

    # --- the 4 Hz timer --------------------------------------------------------------------------------
    def figures(self, session: str):
        live = self.app.runs.get(session)
        return live.figures() if live is not None else (gr.skip(),) * 3

    def on_tick(self, pair_label, request: gr.Request):
        session = _session(request)
        return (*self.figures(session), self._batch_now(session, pair_label))

    def _batch_now(self, session: str, pair_label) -> str:
        """ "Batch now: N rows from M users" for the selected pair, sent only when it changed."""
        lang = self.lang(session)
        if self.app.runner.zero_gpu:
            text = lessons.text(lang, "app.zerogpu_batches")
        else:
            choice = next((c for c in self.app.choices if c.label == pair_label), None)
            info = self.app.runner.batch_info(choice) if choice else None
            text = counters.batch_md(lang, info.rows if info else 0, info.users if info else 0,
                                     waiting=info.waiting if info else 0)
        with self._lock:
            if len(self._batch_text) > 5000:
                self._batch_text.clear()
            if self._batch_text.get(session) == text:
                return gr.skip()
            self._batch_text[session] = text
        return text
