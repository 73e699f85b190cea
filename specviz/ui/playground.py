"""The live playground's handlers (`Playground`); `specviz.ui.playground_layout` lays the page out and
wires each control to them.

Sliders act on the running generation at its next step (the request's live knobs). Every Run joins
the pair's shared batch, so a student sees classmates join and leave it; a synthetic Run (the acceptance
dial) runs on an engine of its own instead, its reference decoded first (`specviz.serve.runner`). Rows
beyond the first take prompts from a pool of varied prompts (unless "all rows the same prompt" is
ticked), so acceptance differs per row as in real serving. After a Run, plain decoding of the same
prompts and batch is measured automatically, so the page can say "spent X× the FLOPs, finished Y×
sooner", and the theory priced on this machine's pass-time curve is set beside it (`ui.dialview`).
"""
from __future__ import annotations

import threading
import time

import gradio as gr

from specviz import lessons
from specviz.engine.policies import FIXED, POLICIES, PolicyError
from specviz.engine.request import Knobs, RunTotals
from specviz.limits import LimitError, check_prompt_text
from specviz.pairs.models import parse_draft_ref
from specviz.pairs.pipeline import encode_prompt
from specviz.serve import runner
from specviz.serve.catalog import DIAL, is_dial, with_acceptance
from specviz.serve.door import check_acceptance, check_run
from specviz.serve.live import LiveRun
from specviz.serve.prompts import ROW_POOL
from specviz.ui import counters, dialview
from specviz.ui.errors import as_sentences, error, human, refusal
from specviz.ui.i18n import pick_lang, t
from specviz.ui.render import tokens_html
from specviz.ui.runs import RunStore
from specviz.ui.shown import GONE, Shown, ShownRuns, Streaming
from specviz.ui.stream import OUTPUTS, Streamer, pack
from specviz.ui.warmup import WARMUP_POLL_S, WARMUP_WAIT_S, warming

MIN_UPDATE_S = 0.2        # ≤ 5 updates a second: faster only makes the browser steal the CPU
# charts refresh at 2 Hz (gr.Timer); tokens at up to 5 Hz. Each chart update is a full plotly redraw in
# the page, four of them a tick: faster kept a small machine's browser too busy to follow the sliders
CHART_PERIOD_S = 0.5
BASELINE_MAX_NEW = 128    # the automatic plain-decoding baseline decodes at most this many tokens
# A Run that arrives while the app warms up its fast path waits for it: beside the warm-up (which times
# layouts on the same cores) a Run's verdict reads far below the same Run's once warm.
# Past this wait it runs, and its verdict is withheld
DEFAULT_ACCEPTANCE = 0.7  # the dial's starting A: a draft right 70 % of the time pays at small batches


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "default"


class Playground:
    """The playground's handlers. Per-session state: `app.runs` (the live run), `self.runs` (the last
    finished run, its recording and baseline), `self.shown` (what the page shows, for the language switch)."""

    def __init__(self, app):
        self.app = app
        self.runs = RunStore()
        self._lock = threading.Lock()
        self._batch_text: dict[str, str] = {}     # session → last "batch now" line sent
        self._pools: dict[str, list[list[int]]] = {}
        self.bands = counters.NoiseBands()        # every session's baselines: the verdict's measured band
        self.shown = ShownRuns()

    def lang(self, session: str) -> str:
        tr = getattr(self.app, "tr", None)
        return tr.lang_of(session) if tr is not None else lessons.DEFAULT_LANG

    # --- Run ----------------------------------------------------------------------------------------
    def generate(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, same_prompt=False,
                 acceptance=DEFAULT_ACCEPTANCE, request: gr.Request = None):
        session = _session(request)
        with self.shown.streaming(session) as mark:
            yield from _drawing(self.stream(prompt_text, pair_label, batch_size, k, policy_name, thr, temp,
                                            max_tokens, session, same_prompt, acceptance, mark), mark)

    def _checked(self, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, prompt_text, acceptance, lang):
        """The door: the Run's values, its pair (a dial pair with its A set) and its knobs."""
        app = self.app
        choice = app.choice(pair_label, lang, dial=True)
        dial = None
        if is_dial(choice):          # an offered dial pair takes the slider's A; a typed synthetic:A pair its own
            dial = check_acceptance(acceptance) if choice.draft == DIAL else parse_draft_ref(choice.draft).rate
        args = check_run(batch_size, k, temp, max_tokens, policy_name, thr, app.limits, synthetic=dial is not None)
        check_prompt_text(prompt_text, app.limits)
        knobs = Knobs(args.depth, args.batch, args.policy.build(), max_batch=app.limits.max_rows_per_user)
        return args, (choice if dial is None else with_acceptance(choice, dial)), knobs, dial

    def stream(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, session,
               same_prompt=True, acceptance=DEFAULT_ACCEPTANCE, mark: Streaming | None = None):
        """The Run's outputs as it goes (`mark`: its place in `self.shown`, for the language switch)."""
        app, lang = self.app, self.lang(session)
        with as_sentences(lang):
            args, choice, knobs, dial = self._checked(pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                                                      prompt_text, acceptance, lang)
        self.runs.pressed(session)         # (an API caller presses no button)
        app.runs.touch(session)
        # a Run was pressed: not "Press Run to start." nor the last Run's tokens or its "Done." (in the language
        # it ended in, after a switch) while it loads, queues or waits
        yield pack(tokens=tokens_html(None), status=t(lang, "playground.status_starting", pair=choice.label))
        if not app.pairs.loaded(choice):
            yield pack(status=t(lang, "playground.status_loading", pair=choice.label))
        with as_sentences(lang):
            pair = app.load(choice, lang)
            prompts, texts = [encode_prompt(pair.tokenizer, prompt_text, limits=app.limits)], [prompt_text]
            if not (same_prompt is True or str(same_prompt).lower() == "true"):
                prompts, texts = prompts + self._pool(choice, pair), texts + ROW_POOL
        app.runs.touch(session)            # a long load does not lose the press
        during_warmup = yield from self._wait_for_warmup(choice, lambda: self.lang(session),
                                                         lambda: app.runs.touch(session))
        if app.runs.stopped_early(session):
            app.runs.end(session)
            yield pack(status=t(lang, "playground.status_stopped", tokens=0),
                       result={"done": True, "engine": choice.engine, "stopped": True, "stopped_before_start": True, "prompt_ids": [],
                               "outputs": [], **RunTotals().as_dict()})
            return
        req = runner.RunRequest(choice.target, choice.draft, tuple(map(tuple, prompts)), args.depth, args.batch,
                                args.policy, args.temperature, args.max_new, acceptance=dial)
        curve_of = getattr(app.runner, "pass_curve", lambda c: None)
        live = LiveRun(app.runner.control(knobs, args.policy, dial), choice.label, app.peaks,
                       app.sampler, shared=not app.runner.zero_gpu and dial is None, lang=lang,
                       curve=curve_of(choice), curve_of=lambda: curve_of(choice), acceptance=dial,
                       spec=getattr(pair, "target_spec", None))    # the roofline's knee until one is measured
        streamer = Streamer(app, live, pair.tokenizer, session, lang, choice, texts)
        packet = yield from self._run(req, choice, live, streamer, session)
        live.end()
        # a curve timed while a browser opened here is slower than the Run just seen: measured again
        app.runner.recheck_curve(choice, [(p.padded, p.seconds) for p in list(live.passes)])
        during_warmup = during_warmup or self._warming(choice)
        outs = packet.outputs or {}
        prompt_rows = [prompts[i % len(prompts)] for i in sorted(outs)]
        plain = None
        engine = choice.engine
        if not packet.stopped and not packet.error and packet.totals.drafted and engine == "specviz":
            yield pack(status=t(self.lang(session), "playground.baseline_pending"))
            plain = yield from self._baseline(req, choice, knobs.max_batch, live, pair.tokenizer, session, texts)
            app.runs.draw_once(session, live)        # the pass-time chart back on the Run's last step
        # peaks a pass ran past are measured again: after the baseline, which would queue behind them
        app.recalibrate(live.beaten)
        plain_tps = (plain.tokens_per_s or None) if plain is not None else None
        plain_users = plain.users_max if plain is not None else 0
        speed = packet.totals.tokens_per_s / plain_tps if plain_tps and packet.totals.tokens_per_s else None
        unlike = plain_tps is not None and counters.unlike(packet.totals.users_max, plain_users)
        band, shape = counters.Band(), (str(choice.label), req.prompts, req.batch, min(req.max_new, BASELINE_MAX_NEW))
        # the same request's baselines measure this machine's band; one that shared the batch measured others
        # too, and is judged against the band measured so far, never added to it
        if plain_tps and not during_warmup:
            band = self.bands.add(shape, plain_tps) if plain_users <= 1 else self.bands.band(shape)
        theory = self._theory(streamer, live, packet, plain, dial)
        result = {"done": True, "engine": engine, "stopped": packet.stopped, "prompt_ids": prompt_rows,
                  "outputs": [outs[i] for i in sorted(outs)], "worker_pid": packet.worker_pid, "error": packet.error,
                  "plain_tokens_per_s": plain_tps, "speedup_vs_plain": speed, "during_warmup": during_warmup,
                  "verdict": "none" if during_warmup or unlike else counters.verdict(speed, band.width),
                  "plain_users_max": plain_users,
                  "noise_band": band.width, "noise_band_samples": band.samples, **packet.totals.as_dict(),
                  "theory": theory, **_dial_result(packet, live, dial)}
        stored = self.runs.finish(session, choice, prompt_text, req, result, streamer.recording(packet), live)

        def draw(lang: str, read: bool = False, **first) -> tuple:
            """The Run's last frame in `lang`: as it ends (with its files), and again at a language switch."""
            streamer.follow(lang)
            key = "playground.status_stopped" if packet.stopped else "playground.status_done"
            rows = len(result.get("outputs") or [])
            # the count is every row's, beside row 1's tokens alone: said so
            note = f"⚠ {human(lang, packet.error)}" if packet.error else \
                t(lang, key + ("_rows" if rows > 1 else ""), tokens=packet.totals.tokens, rows=lessons.Said("app.n_rows", n=rows))
            streamer.note = self._dial_note(lang, live, packet)
            return streamer.outputs(packet.totals, final=True, status=note, plain=plain_tps, during_warmup=during_warmup,
                                    band=band, plain_users=plain_users, read=read,
                                    extra=dialview.theory_md(lang, theory, live.curve, dial is not None), **first)
        shown = Shown(draw, live, lambda: self.lang(session), streamer.row_steps())
        if mark is not None:
            self.shown.keep(session, shown, mark)
        yield shown.draw(read=True, result=result, csv=stored.csv_path, save=stored.recording_path)
        if packet.error:
            raise gr.Error(human(self.lang(session), packet.error))

    def _theory(self, streamer, live: LiveRun, packet, plain, dial) -> dict | None:
        """The prediction on this machine's pass-time curve against the measurement (ui.dialview)."""
        events = [ev for _, ev, _ in streamer.steps]
        # the A the steps ran at (the dial may have moved between the press and the first step)
        rate = packet.totals.alpha if dial is None else live.rates[0] if live.rates else dial
        result = dialview.theory_result(events, live.rates, rate, live.current_curve(), packet.totals, plain,
                                        synthetic=dial is not None)
        if result is not None and len(set(live.rates)) > 1:     # the dial moved: the sentence names both ends
            result.update(moved=True, first=live.rates[0], last=live.rates[-1])
        return result

    def _dial_note(self, lang: str, live: LiveRun, packet) -> str:
        """A synthetic Run's line under the counters (its A, own engine, reference, re-alignments)."""
        if live.acceptance is None:
            return ""
        return dialview.synthetic_md(lang, live.acceptance, packet.reference_s, packet.referencing,
                                     packet.realigned, packet.unreferenced)

    def _run(self, req, choice, live, streamer, session):
        """Stream one request's packets into the page; returns the final packet."""
        app, lang = self.app, streamer.lang
        app.runs.start(session, live)
        if app.runner.zero_gpu:
            yield pack(status=t(lang, "playground.status_zerogpu"))
        else:       # until the first step: a long prompt's prefill, or another user's, takes seconds here
            key = "playground.status_prefill_shared" if live.shared else "playground.status_prefill"
            yield pack(status=t(lang, key, pair=choice.label, tokens=len(req.prompts[0])))
        last_yield, first, packet = 0.0, True, None
        try:
            with as_sentences(lang):
                for packet in app.runner.packets(req, choice, live.control):
                    was, lang = streamer.lang, streamer.follow(self.lang(session))
                    first = first or lang != was         # the reader switched language: the running line again
                    if packet.position:
                        key = "playground.status_queue" if live.acceptance is None else "playground.status_queue_own"
                        yield pack(status=t(lang, key, pos=packet.position, limit=runner.OWN_ENGINES))
                        continue
                    if packet.device_wait:
                        yield pack(status=self._paused_line(lang, packet))
                        first = True            # the running line comes back with the next tokens
                        continue
                    streamer.note = self._dial_note(lang, live, packet)
                    if packet.referencing:          # a synthetic Run's reference: decoded first, not timed
                        yield pack(status=streamer.note)
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

    def _paused_line(self, lang: str, packet) -> str:
        return device_wait_line(lang, packet.device_wait, self.app.gate.turn_s)

    def _warming(self, choice) -> bool:
        return warming(self.app, choice)

    def _wait_for_warmup(self, choice, lang_now, alive=lambda: None):
        """While the app warms this pair's fast path, wait (up to WARMUP_WAIT_S) with a line saying so
        and for how long, calling `alive` at every poll; returns True when it is still warming (the Run's
        figures then get no verdict)."""
        if not self._warming(choice):
            return False
        t0 = time.monotonic()
        while self._warming(choice) and time.monotonic() - t0 < WARMUP_WAIT_S:
            alive()
            yield pack(status=t(lang_now(), "playground.warmup_wait", seconds=time.monotonic() - t0,
                                limit=WARMUP_WAIT_S))
            time.sleep(WARMUP_POLL_S)
        return self._warming(choice)

    def _baseline(self, req, choice, max_batch: int, run: LiveRun, tokenizer, session: str, texts: list[str]):
        """Plain decoding of the same prompts and batch, right after the Run (its RunTotals), through the
        same runner and streamed to the page as the Run was (its tokens, rows and counters at the same
        rate, its charts at the timer's): on a 2-core machine the page's rendering takes CPU, so a
        baseline drained without rendering measured faster than the Run it was compared with."""
        # a synthetic Run's baseline runs where it ran, on an engine of its own (at depth 0 it needs no reference)
        plain_req = runner.RunRequest(req.target, req.draft, req.prompts, 0, req.batch, FIXED, 0.0,
                                      min(req.max_new, BASELINE_MAX_NEW), acceptance=req.acceptance, reference=False)
        control = self.app.runner.control(Knobs(0, req.batch, max_batch=max_batch), FIXED)
        lang = self.lang(session)
        live = LiveRun(control, choice.label, self.app.peaks, self.app.sampler,
                       shared=not self.app.runner.zero_gpu and req.acceptance is None, lang=lang,
                       curve=run.current_curve(), curve_of=run.curve_of, spec=run.spec, baseline=True)
        streamer = Streamer(self.app, live, tokenizer, session, lang, choice, texts)
        # the session's run meanwhile: Stop stops it, and the chart timer draws its passes, which its
        # counters name
        self.app.runs.follow(session, live)
        packet, last_yield = None, 0.0
        try:
            with as_sentences():
                for packet in self.app.runner.packets(plain_req, choice, control):
                    if packet.position:
                        continue
                    if packet.device_wait:
                        yield pack(status=self._paused_line(lang, packet))
                        continue
                    self._fold(packet, live, streamer, keep_peaks=False)
                    now = time.perf_counter()
                    # its last packet too: the counters show the baseline's passes, as the chart does
                    if packet.events and (packet.final or now - last_yield >= MIN_UPDATE_S):
                        last_yield = now
                        lang = streamer.follow(self.lang(session))
                        status = t(lang, "playground.baseline_pending")
                        yield streamer.outputs(packet.totals, status=status)
        finally:
            self.app.runs.finish(session, live)
            control.close()
        if packet is None or packet.error or packet.stopped:
            return None
        return packet.totals

    def _pool(self, choice, pair) -> list[list[int]]:
        key = choice.target          # the prompts depend on the target's tokenizer alone (not on a dial's A)
        with self._lock:
            if key not in self._pools:
                self._pools[key] = [encode_prompt(pair.tokenizer, p) for p in ROW_POOL]
            return self._pools[key]

    def _fold(self, packet, live: LiveRun, streamer, keep_peaks: bool = True) -> None:
        """One packet from the runner into the charts and the transcripts."""
        live.feed(packet.samples, packet.sampler_source, packet.peaks, packet.spec)
        if keep_peaks and packet.peaks is not None:
            self.app.peaks = packet.peaks      # a ZeroGPU worker's calibration: the what-if tab can use it
        for ev, rate in zip(packet.events, packet.rates or [None] * len(packet.events)):
            streamer.add(live.record(ev, rate))       # the step as the Run keeps it (a dial's move named)

    def _where(self) -> str:
        return " · ZeroGPU" if self.app.runner.zero_gpu else ""

    # --- language switch ---------------------------------------------------------------------------------
    def on_switch(self, chosen, request: gr.Request = None) -> tuple:
        """The tab in the language picked: a finished Run or replay drawn again from its steps (OUTPUTS, then
        the pass-time chart and the lossless verdict), the waiting page's words; a Run under way follows at
        its next update."""
        session, lang = _session(request), pick_lang(None, chosen)
        tr = getattr(self.app, "tr", None)
        if tr is not None:       # before drawing: a Run ending meanwhile then draws its frame in it too
            tr.remember(session, lang)
        shown = self.shown.get(session)
        if isinstance(shown, Streaming) or shown is GONE:
            return (gr.skip(),) * (len(OUTPUTS) + 2)
        if shown is None:
            return (*pack(tokens=tokens_html(None, t(lang, "playground.press_run")), status=self.app.startup_md(lang)),
                    gr.skip(), gr.skip())
        verdict = shown.verdict(lang) if shown.verdict is not None else gr.skip()
        drawn = (*shown.draw(lang), shown.live.knee_figure(), verdict)
        if self.shown.get(session) is not shown:
            # Run pressed while it drew: the new Run's first words may already be on the page, and this
            # answer, arriving after them, would put the old "Done." and tokens back over them
            return (gr.skip(),) * (len(OUTPUTS) + 2)
        return drawn

    # --- replay, lossless check --------------------------------------------------------------------------
    def replay(self, title, upload, request: gr.Request = None):
        session = _session(request)
        lang = self.lang(session)
        with as_sentences(lang):
            rec = self.runs.open_recording(title, upload, lang)
        self.runs.replayed(session)
        with self.runs.replay_slot(lang), self.shown.streaming(session) as mark:
            yield from _drawing(self.runs.play(rec, self.app, lambda: self.lang(session), session, Streamer, pack,
                                               keep=lambda shown: self.shown.keep(session, shown, mark)), mark)

    def check_lossless(self, request: gr.Request = None):
        session = _session(request)
        lang = self.lang(session)
        with as_sentences(lang):
            said = self.runs.check_lossless(session, self.app, lang)
        if said is None:
            return t(lang, "playground.lossless_moved_on")
        shown = self.shown.get(session)
        if isinstance(shown, Shown):        # the language switch says it again, of the Run it speaks of
            shown.verdict = said
        return said(lang)

    # --- live knobs ------------------------------------------------------------------------------------
    def set_knobs(self, session: str, depth=None, batch=None, policy=None, threshold=None, acceptance=None) -> None:
        """A live change, as the page sent it; the run's control checks it at the door."""
        live = self.app.runs.get(session)
        if live is None or live.baseline:
            return                  # no Run streaming (a baseline decodes plain): the values apply at the next Run
        try:
            if acceptance is None:
                live.control.set(depth=depth, batch=batch, policy=policy, threshold=threshold)
            else:
                live.control.set(acceptance=acceptance)
        except (LimitError, ValueError, TypeError, PolicyError) as exc:
            # raised, not gr.Warning: the knobs' events skip the queue, and gradio shows a warning only
            # from the queue; the run goes on with the knob as it was
            lang = self.lang(session)
            raise refusal(human(lang, exc), "knob", lang) from None

    def on_depth(self, v, request: gr.Request):
        self.set_knobs(_session(request), depth=v)

    def on_batch(self, v, request: gr.Request):
        self.set_knobs(_session(request), batch=v)

    def on_acceptance(self, v, request: gr.Request):
        """The dial moved: a synthetic Run drafts at the new A from its next step."""
        self.set_knobs(_session(request), acceptance=v)

    def on_policy(self, p, thr, request: gr.Request):
        self.set_knobs(_session(request), policy=p, threshold=thr)

    def on_policy_pick(self, p, thr, request: gr.Request):
        """A policy that reads the threshold box gets its own default there, and the box says what it means."""
        session = _session(request)
        lang = self.lang(session)
        spec = POLICIES.get(p)
        field = spec.threshold if spec else None
        if field is None:            # the box shows only where the policy reads it
            self.set_knobs(session, policy=p, threshold=thr)
            return gr.update(label=lessons.text(lang, "playground.threshold_unused"), visible=False)
        value = spec.default(field)
        self.set_knobs(session, policy=p, threshold=value)
        return gr.update(value=value, label=lessons.text(lang, field.label_key), visible=True)

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
        except Exception:                    # a typed pair not loadable yet, a dial pair: the Run will say
            kind, k = "ours", None
        if kind == "fixed" and k is not None:
            return gr.update(value=k, interactive=False, info=t(lang, "playground.depth_vllm_fixed", k=k))
        if kind == "follows":
            return gr.update(interactive=True, info=t(lang, "playground.depth_vllm_follows"))
        return gr.update(interactive=True, info=None)

    def on_pair_dial(self, pair_label):
        """The dial's slider shows while a synthetic-draft pair is picked."""
        return gr.update(visible=any(c.label == pair_label for c in getattr(self.app, "dials", [])))

    def on_arm(self, press=None, request: gr.Request = None):
        self.app.runs.arm(_session(request), press)
        self.runs.pressed(_session(request))
        return ""          # the lossless verdict spoke of the run before this one

    def on_replay_press(self, request: gr.Request = None):
        self.runs.pressed(_session(request))
        return ""          # as on_arm: the verdict spoke of what the page showed before

    # --- the chart timer --------------------------------------------------------------------------------
    def on_tick(self, pair_label, request: gr.Request):
        session = _session(request)
        live = self.app.runs.get(session)
        if live is not None:
            charts = live.figures()
        else:
            # a Run that ended since the last tick is drawn once more, as it ended: a tick that drew its
            # plain baseline could reach the page after the Run's last frame and leave the baseline there
            live = self.app.runs.take_ended(session)
            charts = live.figures(read=False) if live is not None else (gr.skip(),) * 3
        knee = live.knee_figure() if live is not None else gr.skip()
        return (*charts, knee, self._batch_now(session, pair_label))

    def _batch_now(self, session: str, pair_label) -> str:
        """ "Batch now: N rows from M users" for the selected pair, sent only when it changed."""
        lang = self.lang(session)
        if self.app.runner.zero_gpu:
            text = lessons.text(lang, "app.zerogpu_batches")
        elif any(c.label == pair_label for c in getattr(self.app, "dials", [])):
            text = lessons.text(lang, "playground.batch_own_engine")
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


def _drawing(frames, mark: Streaming):
    """The stream's outputs, marking that it drew on its page (ui.shown.ShownRuns.streaming)."""
    try:
        for out in frames:
            mark.drew = True
            yield out
    finally:
        frames.close()


def _dial_result(packet, live: LiveRun, dial: float | None) -> dict:
    """A synthetic Run's part of the final result: its A, that it had an engine of its own, what its
    reference cost (seconds, left out of every figure) and the drafter's counters."""
    if dial is None:
        return {"synthetic": None}
    return {"synthetic": live.acceptance if live.acceptance is not None else dial, "own_engine": True,
            "reference_s": packet.reference_s, "realigned": packet.realigned, "unreferenced": packet.unreferenced}


def device_wait_line(lang: str, measurements: int, turn_s: float) -> str:
    """Why a Run's tokens stopped coming: timed measurements have the device (serve/gate.py)."""
    return t(lang, "playground.status_device_wait", n=measurements, turn=turn_s)
