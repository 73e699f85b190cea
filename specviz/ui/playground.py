"""The live playground: prompt, sliders and policy on the left; coloured tokens and live charts on the
right. This module owns the page's layout and its handlers (`Playground`). Sliders act on the running
generation at its next step (the request's live knobs); every Run joins the pair's shared batch, so a
student sees classmates join and leave it ("batch now: N rows from M users")."""
from __future__ import annotations

import threading
import time

import gradio as gr

from specviz.limits import MAX_DEPTH, check_prompt_text, check_request
from specviz.pipeline import encode_prompt
from specviz.policies import POLICY_NAMES, PolicyError
from specviz.request import Knobs
from specviz.ui import runner
from specviz.ui.control import policy_from
from specviz.ui.live import LiveRun
from specviz.ui.render import LEGEND, RowView, rows_html, tokens_html
from specviz.ui.errors import as_sentences

EXAMPLES = ["Explain in two sentences why the sky is blue.",
            "Write a haiku about a lighthouse.",
            "List the planets of the solar system in order.",
            "def fibonacci(n):"]
MIN_UPDATE_S = 0.2        # ≤ 5 updates a second: faster only makes the browser steal the CPU
CHART_PERIOD_S = 0.25     # charts refresh at 4 Hz (gr.Timer); tokens at up to 5 Hz
POLICY_HELP = {"fixed": "always the depth slider", "disable-by-batch-size": "depth 0 above the threshold batch size",
               "batch-table": "a depth per batch size (1:6, 4:4, 8:2, 16:1, 32:0)",
               "adaptive": "picks the depth with the best measured tokens/s",
               "confidence": "a row stops drafting when the draft's confidence < threshold"}


def device_md(sample) -> str:
    """The sampler's latest memory and power reading, or what is unavailable (never a made-up 0)."""
    if sample is None or sample.source == "none":
        return "memory and power: unavailable on this device"
    where = "GPU memory" if sample.source == "nvml" else "process memory (RSS)"
    mem = "unavailable" if sample.memory is None else f"{sample.memory / 2**30:.2f} GiB"
    power = "unavailable" if sample.power is None else f"{sample.power:.0f} W"
    return f"{where} {mem} · power {power} ({sample.source})"


def sharing_md(totals, zero_gpu: bool) -> str:
    """Whether the figures above were measured while others shared the device (honest timing)."""
    if zero_gpu:
        return "Measured in this Run's own batch on a ZeroGPU worker (batches are not shared on this hardware)."
    if totals.users_max > 1:
        return (f"Measured while sharing the batch with other users (up to **{totals.users_max}** users, "
                f"**{totals.shared_batch_max}** rows in one step): your tokens/s is your share of the passes.")
    return "Measured with the batch to yourself (no other user shared your steps)."


def counters_md(totals, plain_tps: float | None, batch: int, regime: str, sample=None, pass_md: str = "") -> str:
    acc = "—" if totals.acceptance_rate is None else f"{totals.acceptance_rate:.0%}"
    parts = [f"**{totals.tokens_per_s:.1f}** tokens/s", f"acceptance **{acc}**",
             f"**{totals.mean_accepted_length:.2f}** tokens per row per target pass",
             f"FLOPs **{totals.flops_ratio:.2f}×** plain decoding (estimate from model shapes)"]
    if pass_md:
        parts.append(pass_md)
    if regime:
        parts.append(f"regime: **{regime}** (model-shape estimate vs calibrated peaks)")
    parts.append(device_md(sample))
    line = " · ".join(parts)
    if plain_tps:
        speed = totals.tokens_per_s / plain_tps
        line += (f"\n\nSpent **{totals.flops_ratio:.1f}×** the FLOPs, finished **{speed:.2f}×** "
                 f"{'sooner' if speed >= 1 else 'as fast'} than plain decoding at batch {batch} "
                 f"(plain {plain_tps:.1f} tokens/s, measured in your session).")
    else:
        line += f"\n\nNo plain baseline at batch {batch} yet: drag depth to 0 for a few steps to measure one."
    return line


POLICY_THRESHOLD = {"disable-by-batch-size": (8, "Disable speculation above this many rows (shared batch)"),
                    "confidence": (0.5, "Confidence threshold (a probability, 0-1)")}
OUTPUTS = ("tokens", "rows", "counters", "chart_t", "chart_h", "chart_a", "status", "result")


def pack(**values) -> tuple:
    """The handler's outputs in the order of OUTPUTS; anything not given stays as it is on the page."""
    unknown = set(values) - set(OUTPUTS)
    if unknown:
        raise KeyError(f"not playground outputs: {sorted(unknown)}")
    return tuple(values.get(name, gr.skip()) for name in OUTPUTS)


def build(app) -> "Playground":
    """Lay out the playground inside the current Blocks and wire its handlers."""
    page = Playground(app)
    choices = [c.label for c in app.choices]
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            pair = gr.Dropdown(choices, value=choices[0], label="Draft → target pair", elem_id="pair",
                               allow_custom_value=app.allow_custom,
                               info='or type "DRAFT → TARGET" (model references)' if app.allow_custom else None)
            prompt = gr.Textbox(EXAMPLES[0], label="Prompt", lines=3, elem_id="prompt",
                                max_length=app.limits.max_prompt_chars)
            gr.Examples(EXAMPLES, inputs=prompt, label="Examples")
            batch = gr.Slider(1, app.limits.max_rows_per_user, value=1, step=1, label="Batch size (your rows)",
                              elem_id="batch-size")
            depth = gr.Slider(0, MAX_DEPTH, value=4, step=1, label="Speculation depth k (0 = off)",
                              elem_id="depth")
            policy = gr.Radio(list(POLICY_NAMES), value="fixed", label="Depth policy", elem_id="policy",
                              info="; ".join(f"{k}: {v}" for k, v in POLICY_HELP.items()))
            threshold = gr.Number(8, label="Policy threshold (used by disable-by-batch-size and confidence)",
                                  elem_id="threshold")
            with gr.Row():
                temperature = gr.Slider(0, app.limits.max_temperature, value=0, step=0.05,
                                        label="Temperature (0 = greedy, lossless)", elem_id="temperature")
                max_new = gr.Slider(8, 512, value=128, step=8, label="Max new tokens", elem_id="max-new-tokens")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            status = gr.Markdown(app.startup_note, elem_id="status")
        with gr.Column(scale=3, min_width=420):
            gr.HTML(LEGEND)
            tokens = gr.HTML(tokens_html(None, "Press Run to start."), elem_id="tokens")
            batch_now = gr.Markdown("", elem_id="batch-now")
            counters = gr.Markdown("", elem_id="counters")
            rows = gr.HTML("", elem_id="rows")
            with gr.Row():
                chart_t = gr.Plot(label="Throughput", elem_id="chart-throughput")
                chart_h = gr.Plot(label="Hardware", elem_id="chart-hardware")
            chart_a = gr.Plot(label="Acceptance", elem_id="chart-accept")
            result = gr.JSON(visible=False, elem_id="result")

    outputs = [tokens, rows, counters, chart_t, chart_h, chart_a, status, result]
    # charts refresh on their own clock (4 Hz), independent of how long a decoding step takes
    timer = gr.Timer(CHART_PERIOD_S)
    timer.tick(page.on_tick, [pair], [chart_t, chart_h, chart_a, batch_now], api_name=False, queue=False,
               show_progress="hidden")
    # preprocess=False: the API bypasses the sliders, so the raw values go straight to our one check
    # (`limits.check_request`), whose sentences a student understands — not to gradio's type errors
    run.click(page.generate, [prompt, pair, batch, depth, policy, threshold, temperature, max_new], outputs,
              api_name="generate", concurrency_limit=app.limits.max_shared_rows + app.limits.max_queue,
              preprocess=False)
    knob = dict(outputs=None, api_name=False, queue=False, show_progress="hidden")
    depth.change(page.on_depth, [depth], **knob)
    batch.change(page.on_batch, [batch], **knob)
    policy.change(page.on_policy_pick, [policy, threshold], [threshold], api_name=False, queue=False,
                  show_progress="hidden")
    threshold.change(page.on_policy, [policy, threshold], **knob)
    stop.click(page.on_stop, None, None, api_name="stop", queue=False)
    return page


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "default"


class Playground:
    """The playground's handlers. Per-session state lives in `app.runs` (one LiveRun per session)."""

    def __init__(self, app):
        self.app = app
        self._lock = threading.Lock()
        self._batch_text: dict[str, str] = {}     # session → last "batch now" line sent

    # --- Run ----------------------------------------------------------------------------------------
    def generate(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                 request: gr.Request):
        yield from self.stream(prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                               _session(request))

    def stream(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, session):
        app = self.app
        with as_sentences():
            args = check_request(batch_size, k, temp, max_tokens, app.limits)
            check_prompt_text(prompt_text, app.limits)
            knobs = Knobs(args.depth, args.batch, policy_from(policy_name, thr), max_batch=app.limits.max_rows_per_user)
            choice = app.choice(pair_label)
        if not app.pairs.loaded(choice):
            yield pack(status=f"Loading **{choice.label}** … (the offline model is converted once, about 30 s; "
                              "later starts take a second)")
        with as_sentences():
            pair = app.load(choice)
            prompt_ids = encode_prompt(pair.tokenizer, prompt_text, limits=app.limits)
        req = runner.RunRequest(choice.target, choice.draft, tuple(prompt_ids), args.depth, args.batch,
                                policy_name or "fixed", thr, args.temperature, args.max_new)
        control = app.runner.control(knobs, (policy_name or "fixed", thr))
        live = LiveRun(control, choice.label, app.peaks, app.sampler, shared=not app.runner.zero_gpu)
        app.runs.start(session, live)
        streamer = Streamer(app, live, pair.tokenizer, session)
        if app.runner.zero_gpu:
            yield pack(status="Waiting for a ZeroGPU worker; the first Run also loads the pair onto its GPU …")
        last_yield, first, packet = 0.0, True, None
        try:
            with as_sentences():
                for packet in app.runner.packets(req, choice, control):
                    if packet.position:
                        yield pack(status=f"Waiting for room in the shared batch: you are number "
                                          f"**{packet.position}** in the queue.")
                        continue
                    self._fold(packet, live, streamer)
                    now = time.perf_counter()
                    if not packet.final and packet.events and now - last_yield >= MIN_UPDATE_S:
                        last_yield = now
                        yield streamer.outputs(packet.totals, status=f"Running · {choice.label}{self._where()}"
                                               if first else None)
                        first = False
        finally:
            app.runs.finish(session, live)
            control.close()
        if packet is None or not packet.final:
            raise gr.Error("The generation ended without a result (the GPU worker stopped). Please run again.")
        outs = packet.outputs or {}
        result = {"done": True, "stopped": packet.stopped, "prompt_ids": [prompt_ids] * max(1, len(outs)),
                  "outputs": [outs[i] for i in sorted(outs)], "worker_pid": packet.worker_pid,
                  "error": packet.error, **packet.totals.as_dict()}
        note = ("Stopped." if packet.stopped else "Done.") + f" {packet.totals.tokens} tokens."
        if packet.error:
            note = f"⚠ {packet.error}"
        yield streamer.outputs(packet.totals, final=True, result=result, status=note)
        if packet.error:
            raise gr.Error(packet.error)

    def _fold(self, packet, live: LiveRun, streamer) -> None:
        """One packet from the runner into the charts, the transcripts and the plain baseline."""
        live.feed(packet.samples, packet.sampler_source, packet.peaks, packet.spec)
        if packet.peaks is not None:
            self.app.peaks = packet.peaks      # a ZeroGPU worker's calibration: the what-if tab can use it
        for ev in packet.events:
            live.record(ev)
            streamer.add(ev)
            if ev.depth == 0 and ev.drafted == 0 and ev.wall_s > 0 and ev.users == 1:
                self.app.runs.note_plain(streamer.session, live.pair_label, ev.batch_size, ev.emitted / ev.wall_s)

    def _where(self) -> str:
        return " · on a ZeroGPU worker" if self.app.runner.zero_gpu else ""

    # --- live knobs ------------------------------------------------------------------------------------
    def set_knobs(self, session: str, depth=None, batch=None, policy=None) -> None:
        live = self.app.runs.get(session)
        if live is None:
            return                  # no run streaming: the values apply at the next Run
        try:
            live.control.set(depth=depth, batch=batch, policy=policy)
        except (ValueError, TypeError, PolicyError) as exc:
            gr.Warning(str(exc))

    def on_depth(self, v, request: gr.Request):
        self.set_knobs(_session(request), depth=v)

    def on_batch(self, v, request: gr.Request):
        self.set_knobs(_session(request), batch=v)

    def on_policy(self, p, t, request: gr.Request):
        self.set_knobs(_session(request), policy=(p, t))

    def on_policy_pick(self, p, t, request: gr.Request):
        """A policy that reads the threshold box gets a value that means something to it."""
        default = POLICY_THRESHOLD.get(p)
        if default is None:
            self.set_knobs(_session(request), policy=(p, t))
            return gr.update(label="Policy threshold (not used by this policy)")
        value, label = default
        self.set_knobs(_session(request), policy=(p, value))
        return gr.update(value=value, label=label)

    def stop(self, session: str) -> None:
        live = self.app.runs.get(session)
        if live is not None:
            live.control.stop()

    def on_stop(self, request: gr.Request):
        self.stop(_session(request))

    # --- the 4 Hz timer --------------------------------------------------------------------------------
    def figures(self, session: str):
        live = self.app.runs.get(session)
        return live.figures() if live is not None else (gr.skip(),) * 3

    def on_tick(self, pair_label, request: gr.Request):
        session = _session(request)
        return (*self.figures(session), self._batch_now(session, pair_label))

    def _batch_now(self, session: str, pair_label) -> str:
        """ "Batch now: N rows from M users" for the selected pair, sent only when it changed."""
        if self.app.runner.zero_gpu:
            text = "On ZeroGPU each Run has its own batch: batches are not shared on this hardware."
        else:
            choice = next((c for c in self.app.choices if c.label == pair_label), None)
            sched = self.app.runner.schedulers.peek(choice) if choice else None
            info = sched.info() if sched else None
            if info is None or (info.rows == 0 and info.waiting == 0):
                text = "Batch now: empty — press Run; everyone on this server who runs this pair shares one batch."
            else:
                text = (f"Batch now: **{info.rows}** rows from **{info.users}** "
                        f"{'user' if info.users == 1 else 'users'}"
                        + (f", **{info.waiting}** waiting for room" if info.waiting else "") + ".")
        with self._lock:
            if self._batch_text.get(session) == text:
                return gr.skip()
            self._batch_text[session] = text
        return text


class Streamer:
    """Turns engine steps into the playground's outputs (one object per Run)."""

    def __init__(self, app, live: LiveRun, tokenizer, session: str):
        self.app, self.live, self.session = app, live, session
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.views: dict[int, RowView] = {}
        self.state: dict[int, str] = {}
        self.batch, self.own_rows, self.users = 1, 1, 1

    def add(self, ev) -> None:
        """Fold one step into the per-row transcripts."""
        self.batch, self.own_rows, self.users = ev.batch_size, len(ev.rows), ev.users
        for rs in ev.rows:
            self.views.setdefault(rs.row, RowView()).add_step(ev.step, rs, self.decode)
            if rs.done:
                self.state[rs.row] = "· " + ("finished (EOS)" if rs.finish == "eos" else "finished (length)")
        for row in ev.retired:
            self.state[row] = "· retired (batch lowered)"

    def outputs(self, totals, final: bool = False, result=None, status=None):
        first = self.views.get(min(self.views)) if self.views else None
        charts = self.live.figures() if final else (gr.skip(),) * 3   # the timer draws them meanwhile
        plain = self.app.runs.plain(self.session, self.live.pair_label, self.batch)
        counters = counters_md(totals, plain, self.batch, self.live.regime, self.live.latest_sample(),
                               self.live.pass_md())
        counters += "\n\n" + self._batch_line() + " " + sharing_md(totals, self.app.runner.zero_gpu)
        values = dict(tokens=tokens_html(first), rows=rows_html(self.views, self.state), counters=counters,
                      chart_t=charts[0], chart_h=charts[1], chart_a=charts[2])
        if status is not None:
            values["status"] = status
        if result is not None:
            values["result"] = result
        return pack(**values)

    def _batch_line(self) -> str:
        if self.app.runner.zero_gpu:
            return f"Batch: your **{self.own_rows}** rows (not shared on ZeroGPU)."
        return (f"Batch now: **{self.batch}** rows from **{self.users}** {'user' if self.users == 1 else 'users'} "
                f"(yours: {self.own_rows}).")
