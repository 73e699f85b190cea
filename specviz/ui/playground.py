"""The live playground: prompt, sliders and policy on the left; coloured tokens and live charts on the
right. Sliders act on the running generation at its next step (the engine's live knobs)."""
from __future__ import annotations

import gradio as gr

from specviz.engine import MAX_BATCH, EngineError, Knobs
from specviz.models import ModelError
from specviz.pipeline import encode_prompt
from specviz.policies import MAX_DEPTH, POLICY_NAMES, PolicyError
from specviz.ui.live import LiveRun
from specviz.ui.control import policy_from
from specviz.ui.render import LEGEND, RowView, rows_html, tokens_html

EXAMPLES = ["Explain in two sentences why the sky is blue.",
            "Write a haiku about a lighthouse.",
            "List the planets of the solar system in order.",
            "def fibonacci(n):"]
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
                 f"(plain {plain_tps:.1f} tokens/s, measured in this session).")
    else:
        line += f"\n\nNo plain baseline at batch {batch} yet: drag depth to 0 for a few steps to measure one."
    return line


def build(app) -> None:
    """Lay out the playground inside the current Blocks; `app` is the SpecVizApp holding shared state."""
    choices = [c.label for c in app.choices]
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            pair = gr.Dropdown(choices, value=choices[0], label="Draft → target pair", elem_id="pair",
                               allow_custom_value=app.allow_custom,
                               info='or type "DRAFT → TARGET" (model references)' if app.allow_custom else None)
            prompt = gr.Textbox(EXAMPLES[0], label="Prompt", lines=3, elem_id="prompt")
            gr.Examples(EXAMPLES, inputs=prompt, label="Examples")
            batch = gr.Slider(1, MAX_BATCH, value=1, step=1, label="Batch size (rows)", elem_id="batch-size")
            depth = gr.Slider(0, MAX_DEPTH, value=4, step=1, label="Speculation depth k (0 = off)",
                              elem_id="depth")
            policy = gr.Radio(list(POLICY_NAMES), value="fixed", label="Depth policy", elem_id="policy",
                              info="; ".join(f"{k}: {v}" for k, v in POLICY_HELP.items()))
            threshold = gr.Number(8, label="Policy threshold (batch size, or confidence 0-1)",
                                  elem_id="threshold")
            with gr.Row():
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy, lossless)",
                                        elem_id="temperature")
                max_new = gr.Slider(8, 512, value=128, step=8, label="Max new tokens", elem_id="max-new-tokens")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            status = gr.Markdown(app.startup_note, elem_id="status")
        with gr.Column(scale=3, min_width=420):
            gr.HTML(LEGEND)
            tokens = gr.HTML(tokens_html(None, "Press Run to start."), elem_id="tokens")
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

    def on_tick(request: gr.Request):
        return app.figures(_session(request))

    timer.tick(on_tick, None, [chart_t, chart_h, chart_a], api_name=False, queue=False,
               show_progress="hidden")

    def generate(prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                 request: gr.Request):
        yield from app.stream(prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens,
                              _session(request))

    run.click(generate, [prompt, pair, batch, depth, policy, threshold, temperature, max_new], outputs,
              api_name="generate", concurrency_limit=4)
    def on_depth(v, request: gr.Request):
        app.set_knobs(_session(request), depth=v)

    def on_batch(v, request: gr.Request):
        app.set_knobs(_session(request), batch=v)

    def on_policy(p, t, request: gr.Request):
        app.set_knobs(_session(request), policy=(p, t))

    def on_stop(request: gr.Request):
        app.stop(_session(request))

    knob = dict(outputs=None, api_name=False, queue=False, show_progress="hidden")
    depth.change(on_depth, [depth], **knob)
    batch.change(on_batch, [batch], **knob)
    policy.change(on_policy, [policy, threshold], **knob)
    threshold.change(on_policy, [policy, threshold], **knob)
    stop.click(on_stop, None, None, api_name="stop", queue=False)


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "default"


class Streamer:
    """Turns engine steps into the playground's outputs (one object per Run)."""

    def __init__(self, app, live: LiveRun, tokenizer):
        self.app, self.live = app, live
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.views: dict[int, RowView] = {}
        self.state: dict[int, str] = {}
        self.batch = 1

    def add(self, ev) -> None:
        """Fold one step into the per-row transcripts."""
        self.batch = ev.batch_size
        for rs in ev.rows:
            self.views.setdefault(rs.row, RowView()).add_step(ev.step, rs, self.decode)
            if rs.done:
                self.state[rs.row] = "· " + ("finished (EOS)" if rs.finish == "eos" else "finished (length)")
        for row in ev.retired:
            self.state[row] = "· retired (batch lowered)"

    def outputs(self, batch: int, totals, final: bool = False, result=None, status=None):
        first = self.views.get(min(self.views)) if self.views else None
        charts = self.live.figures() if final else (gr.skip(),) * 3   # the timer draws them meanwhile
        plain = self.app.runs.plain(self.live.pair_label, batch)
        return (tokens_html(first), rows_html(self.views, self.state),
                counters_md(totals, plain, batch, self.live.regime, self.live.latest_sample(),
                            self.live.pass_md()), *charts,
                gr.skip() if status is None else status, gr.skip() if result is None else result)


def validate(prompt_text, batch_size, k, temp, max_tokens) -> tuple[int, int, float, int]:
    if prompt_text is None or not str(prompt_text).strip():
        raise gr.Error("Please type a prompt first.")
    try:
        b, d, t, m = int(batch_size), int(k), float(temp), int(max_tokens)
    except (TypeError, ValueError):
        raise gr.Error("Batch size, depth, temperature and max tokens must be numbers.")
    if not 1 <= b <= MAX_BATCH or not 0 <= d <= MAX_DEPTH or not 0 <= t <= 10 or not 1 <= m <= 4096:
        raise gr.Error(f"Out of range: batch 1-{MAX_BATCH}, depth 0-{MAX_DEPTH}, temperature 0-10, "
                       "max tokens 1-4096.")
    return b, d, t, m


def make_knobs(b: int, d: int, policy_name, thr) -> Knobs:
    try:
        return Knobs(depth=d, batch_size=b, policy=policy_from(policy_name, thr))
    except (PolicyError, EngineError) as exc:
        raise gr.Error(str(exc))


def encode(pair, prompt_text: str) -> list[int]:
    try:
        return encode_prompt(pair.tokenizer, prompt_text)
    except ModelError as exc:
        raise gr.Error(str(exc))
