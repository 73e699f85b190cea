"""The "What if?" tab: the roofline model over GPU and model presets (estimates, labelled so), beside the
latency curves recorded on real hardware (`assets/profiles/`, measured)."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from specviz import charts
from specviz.engine import EngineError
from specviz.hardware import find_knee
from specviz.models import ModelError
from specviz.profiles import Profile, load_profiles
from specviz.roofline import (GPUS, MODELS, crossover_from_rows, latency_curve, predicted_knee, whatif_rows)

THIS_MACHINE = "This machine (calibrated peaks)"
NGRAM = "n-gram lookup (no draft model)"
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DEPTHS = [0, 1, 2, 3, 4, 6, 8]
PLOT_DEPTHS = {0, 1, 2, 4, 8}
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
DEFAULTS = dict(gpu="H200", target="Qwen2.5-7B", draft="Qwen2.5-0.5B", alpha=0.7, context=1024, overhead=0.0)


def _hardware(app, gpu: str):
    """(bandwidth, FLOP/s, description, dtype bytes) for a preset or this machine's calibrated peaks."""
    if gpu == THIS_MACHINE:
        p = app.peaks
        if p is None:
            raise gr.Error("This machine's peaks are not calibrated yet (it takes a few seconds after start; "
                           "on ZeroGPU they come with the first Run). Pick a GPU preset meanwhile.")
        desc = (f"this machine ({p.device}, {p.dtype}): {p.bandwidth / 1e9:.1f} GB/s and "
                f"{p.flops / 1e12:.2f} TFLOP/s, **measured** by calibration")
        return p.bandwidth, p.flops, desc, 2.0 if "16" in p.dtype else 4.0
    if gpu not in GPUS:
        raise gr.Error(f"Unknown GPU {gpu!r}: pick one from the list.")
    g = GPUS[gpu]
    return g.bandwidth, g.flops, f"{g.name}: {g.bandwidth / 1e12:.2f} TB/s, {g.flops / 1e12:.0f} TFLOP/s ({g.source})", 2.0


def _model(name: str, bytes_per_param: float):
    if name not in MODELS:
        raise gr.Error(f"Unknown model {name!r}: pick one from the list.")
    return replace(MODELS[name], bytes_per_param=bytes_per_param)


def compute(app, gpu, target, draft, alpha, context, overhead_ms):
    """Summary markdown, latency figure and crossover figure for one choice of knobs (all estimates)."""
    try:
        alpha, context, overhead = float(alpha), int(context), float(overhead_ms) / 1000
    except (TypeError, ValueError):
        raise gr.Error("Acceptance, context and overhead must be numbers.")
    if not 0 <= alpha < 1 or not 1 <= context <= 131072 or not 0 <= overhead <= 1:
        raise gr.Error("Out of range: acceptance 0-0.99, context 1-131072 tokens, overhead 0-1000 ms.")
    bw, fl, hw_desc, bpp = _hardware(app, gpu)
    t_spec = _model(target, bpp)
    d_spec = None if draft == NGRAM else _model(draft, bpp)
    knee = predicted_knee(t_spec, bw, fl, context)
    lat = [1000 * s for s in latency_curve(t_spec, bw, fl, TOKENS, context, overhead)]
    rows = whatif_rows(t_spec, d_spec, bw, fl, alpha, context, BATCHES, DEPTHS, overhead)
    fig_lat = charts.latency_figure(TOKENS, lat, knee, title=f"{target} on {gpu} (estimate)")
    fig_x = charts.crossover_figure([r for r in rows if r["depth"] in PLOT_DEPTHS],
                                    f"Tokens/s by batch and depth, α = {alpha:.2f} (estimate)")
    return summary_md(rows, hw_desc, t_spec, d_spec, draft, knee, alpha, context), fig_lat, fig_x


def summary_md(rows, hw_desc, t_spec, d_spec, draft, knee, alpha, context) -> str:
    by = {(r["batch_size"], r["depth"]): r for r in rows}
    cross = crossover_from_rows(rows)
    lines = [f"**Estimates from the roofline model** (not measurements): {hw_desc}.",
             f"Target {t_spec.name}: {t_spec.params / 1e9:.2f} B parameters, "
             f"{t_spec.streamed_params * t_spec.bytes_per_param / 1e9:.2f} GB streamed per pass. "
             f"Predicted knee: **{knee} tokens per pass** at context {context} — below it a pass costs "
             "about the same however many tokens it checks.",
             "", "| batch | best depth k | speed-up vs plain | FLOPs spent vs plain | batch × (k+1) |",
             "|---:|---:|---:|---:|---:|"]
    for b in BATCHES:
        best = max((by[(b, k)] for k in DEPTHS), key=lambda r: r["tokens_per_s"])
        plain = by[(b, 0)]["tokens_per_s"]
        lines.append(f"| {b} | {best['depth']} | {best['tokens_per_s'] / plain:.2f}× | "
                     f"{best['flops_ratio']:.2f}× | {b * (best['depth'] + 1)} |")
    lines.append("")
    drafter = "an n-gram lookup (free)" if d_spec is None else draft
    if cross:
        lines.append(f"With {drafter} drafting at acceptance α = {alpha:.2f}, speculation stops paying from "
                     f"**batch {cross}**: past the knee, checking extra tokens costs real time and rejected "
                     "ones are pure waste (hence vLLM's `--speculative-disable-by-batch-size`).")
    else:
        lines.append(f"With {drafter} drafting at α = {alpha:.2f}, speculation still pays at batch {BATCHES[-1]}.")
    return "\n".join(lines)


def profile_view(profiles: list[Profile], name: str):
    prof = next((p for p in profiles if p.label == name), None)
    if prof is None:
        raise gr.Error(f"Unknown profile {name!r}.")
    est = None
    if prof.spec is not None:
        est = [1000 * s for s in latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass,
                                               prof.context)]
    fig = charts.latency_figure(prof.tokens_per_pass, est or [None] * len(prof.tokens_per_pass),
                                prof.predicted_knee, (prof.tokens_per_pass, prof.latency_s), prof.measured_knee,
                                title=f"{prof.target} on {prof.device}: measured vs roofline")
    pred = "no model shape recorded" if prof.predicted_knee is None else f"{prof.predicted_knee}"
    md = (f"**Measured** with `python -m specviz roofline` on {prof.device}: calibrated "
          f"{prof.bandwidth / 1e9:.1f} GB/s and {prof.flops / 1e12:.2f} TFLOP/s, context {prof.context}. "
          f"Measured knee **{prof.measured_knee:.0f}** tokens per pass; roofline prediction from the calibrated "
          f"peaks **{pred}** (dashed line: the estimate).")
    return md, fig


def build(app) -> None:
    gpus = list(GPUS) + [THIS_MACHINE]
    models = list(MODELS)
    gr.Markdown("Pick a GPU and a model pair and see what the roofline model predicts. **Everything in the "
                "first part is an estimate**; the curves under *Measured on real hardware* were recorded on "
                "real machines.", elem_id="whatif-intro")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            gpu = gr.Dropdown(gpus, value=DEFAULTS["gpu"], label="GPU", elem_id="whatif-gpu")
            target = gr.Dropdown(models, value=DEFAULTS["target"], label="Target model", elem_id="whatif-target")
            draft = gr.Dropdown(models + [NGRAM], value=DEFAULTS["draft"], label="Draft",
                                elem_id="whatif-draft")
            alpha = gr.Slider(0, 0.99, value=DEFAULTS["alpha"], step=0.01, label="Acceptance rate α per token",
                              elem_id="whatif-alpha")
            context = gr.Slider(1, 32768, value=DEFAULTS["context"], step=1, label="Context length (tokens)",
                                elem_id="whatif-context")
            overhead = gr.Slider(0, 20, value=DEFAULTS["overhead"], step=0.1,
                                 label="Fixed overhead per forward pass (ms; launches, Python)",
                                 elem_id="whatif-overhead")
        with gr.Column(scale=3, min_width=420):
            md0, lat0, x0 = compute(app, *DEFAULTS.values())
            summary = gr.Markdown(md0, elem_id="whatif-summary")
    with gr.Row():
        fig_lat = gr.Plot(lat0, label="Latency per pass (estimate)", elem_id="whatif-latency")
        fig_x = gr.Plot(x0, label="Batch × depth crossover (estimate)", elem_id="whatif-crossover")
    inputs = [gpu, target, draft, alpha, context, overhead]

    def on_change(*vals):
        return compute(app, *vals)

    gr.on([c.change for c in inputs], on_change, inputs, [summary, fig_lat, fig_x], api_name="whatif",
          show_progress="hidden")
    _build_measure(app)
    _build_profiles()


KNEE_CONTEXT = 256
OVERHEAD_FACTOR = 2.0     # the same rule as hardware.step_metrics: > 2× the roofline time = overhead-bound


def knee_view(upd, context: int = KNEE_CONTEXT):
    """Markdown and figure for a (partial) measured curve, with the roofline prediction beside it."""
    spec, peaks = upd.spec, upd.peaks
    est, predicted = [None] * len(upd.tokens_per_pass), None
    if peaks is not None:
        est = [1000 * s for s in latency_curve(spec, peaks.bandwidth, peaks.flops, upd.tokens_per_pass, context)]
        predicted = predicted_knee(spec, peaks.bandwidth, peaks.flops, context)
    knee = find_knee(upd.tokens_per_pass, upd.latency_s) if upd.done and len(upd.tokens_per_pass) >= 4 else None
    fig = charts.latency_figure(upd.tokens_per_pass, est, predicted, (upd.tokens_per_pass, upd.latency_s), knee,
                                title=f"{spec.name} on {upd.device}: measured now")
    points = ", ".join(f"{n} → {1000 * t:.1f} ms" for n, t in zip(upd.tokens_per_pass, upd.latency_s))
    if not upd.done:
        return f"Measuring on {upd.device} … {points}", fig
    flat = upd.latency_s[1] / upd.latency_s[0] if len(upd.latency_s) > 1 else float("nan")
    pred = ("not available (this device's peaks are not calibrated yet)" if predicted is None
            else f"**{predicted}** from the calibrated peaks ({peaks.bandwidth / 1e9:.1f} GB/s, "
                 f"{peaks.flops / 1e12:.2f} TFLOP/s)")
    text = (f"**Measured** on {upd.device}, {spec.name}, context {context}: {points}. Measured knee "
            f"**{knee:.0f}** tokens per pass; roofline prediction {pred}. Two tokens per pass cost "
            f"{flat:.2f}× one. (Other work on the same device while this runs distorts the curve.)")
    if peaks is not None and upd.latency_s[0] > OVERHEAD_FACTOR * est[0] / 1000:
        text += (f"\n\nAt one token per pass this pass took {upd.latency_s[0] / (est[0] / 1000):.1f}× the "
                 "roofline time, so neither streaming the weights nor the arithmetic explains it: kernel "
                 "launches and Python, kernels far below peak, or other work on this device do. SpecViz calls "
                 "that **overhead-bound**, the third regime; where it rules, the flat part of the curve is "
                 "overhead, and this knee is not the memory/compute ridge.")
    return text, fig


def _build_measure(app) -> None:
    gr.Markdown("## Measure the knee on this machine\n\nTimes the target's forward pass at 1, 2, 4 … tokens "
                "per pass (up to 128 on a CPU, 512 on a GPU) on top of a 256-token context, where the app runs.")
    labels = [c.label for c in app.choices]
    with gr.Row():
        pick = gr.Dropdown(labels, value=labels[0], label="Pair (its target is measured)", elem_id="knee-pair",
                           scale=3)
        go = gr.Button("Measure the knee", elem_id="knee-run", scale=1)
    md = gr.Markdown("", elem_id="knee-summary")
    fig = gr.Plot(label="Measured latency per pass", elem_id="knee-plot")

    def measure(label):
        choice = app.choice(label)
        yield f"Loading **{choice.label}** …", gr.skip()
        try:
            for upd in app.runner.knee(choice, KNEE_CONTEXT, app.peaks):
                yield knee_view(upd)
        except (ModelError, EngineError) as exc:
            raise gr.Error(str(exc))

    go.click(measure, [pick], [md, fig], api_name="measure_knee", concurrency_limit=1)


def _build_profiles() -> None:
    gr.Markdown("## Measured on real hardware")
    profiles = load_profiles()
    if not profiles:
        gr.Markdown("No recorded profiles found in `assets/profiles/`. Record one with "
                    "`python -m specviz roofline --target REF --profile assets/profiles/NAME.json`.")
        return
    labels = [p.label for p in profiles]
    pick = gr.Dropdown(labels, value=labels[0], label="Recorded profile", elem_id="profile")
    md0, fig0 = profile_view(profiles, labels[0])
    md = gr.Markdown(md0, elem_id="profile-summary")
    fig = gr.Plot(fig0, label="Measured latency per pass", elem_id="profile-latency")
    pick.change(lambda name: profile_view(profiles, name), [pick], [md, fig], api_name="profile",
                show_progress="hidden")
