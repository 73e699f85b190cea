"""The "What if?" tab: estimates over GPU and model presets, from the calibrated cost model (rates and
overheads measured) or the ideal roofline (the article's argument), with published measurements drawn
over them where a source measured the same setup, beside the latency curves recorded on real hardware
(`assets/profiles/`, measured) and a knee measured from the page."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from specviz import charts
from specviz import roofline as rf
from specviz.engine import EngineError
from specviz.hardware import find_knee
from specviz.models import ModelError
from specviz.profiles import (PUBLISHED_LABEL, Profile, compare, gpu_calibration, load_profiles, load_published,
                              profile_calibration, profile_for_device)
from specviz.roofline import GPUS, MODELS, crossover_from_rows, latency_curve, predicted_knee, whatif_rows
from specviz.ui import runner

THIS_MACHINE = "This machine (calibrated peaks)"
CUSTOM_GPU = "Custom GPU (bandwidth and FLOP/s below)"
NGRAM = "n-gram lookup (no draft model)"
CALIBRATED, IDEAL = "calibrated", "ideal"
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DEPTHS = [0, 1, 2, 3, 4, 6, 8]
PLOT_DEPTHS = {0, 1, 2, 4, 8}
SPEEDUP_DEPTHS = [1, 2, 4, 8]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
DEFAULTS = dict(gpu="H100 SXM", target="Llama-3.1-8B", draft="EAGLE:Llama-3.1-8B", alpha=0.7, context=800,
                overhead=0.0, model=CALIBRATED, bandwidth_tbs=3.35, flops_tflops=989.0)

# user-facing text in one place (a lessons file will take it over, with Persian beside it)
TEXT = dict(
    intro="Pick a GPU and a model pair and see what the cost models predict. **Everything in the first part "
          "is an estimate**: the *calibrated* model uses rates and overheads measured on real stacks, the "
          "*ideal roofline* assumes peak rates and no overhead. Black markers are **published "
          "measurements** by others (source named) where one matches your choice; the curves under "
          "*Measured on real hardware* were recorded on real machines.",
    no_peaks="This machine's peaks are not calibrated yet (it takes a few seconds after start; on ZeroGPU "
             "they come with the first Run). Pick a GPU preset meanwhile.",
    bad_numbers="Acceptance, context, overhead, bandwidth and FLOP/s must be numbers.",
    out_of_range="Out of range: acceptance 0-0.99, context 1-131072 tokens, overhead 0-1000 ms.",
    bad_custom="A custom GPU needs a bandwidth of 0.001-100 TB/s and 0.001-100000 TFLOP/s.",
    unknown_gpu="Unknown GPU {gpu!r}: pick one from the list.",
    unknown_model="Unknown model {name!r}: pick one from the list.",
    unknown_model_kind="Unknown cost model {model!r}: calibrated or ideal.",
    heading={CALIBRATED: "**Estimates from the calibrated model** (not measurements)",
             IDEAL: "**Estimates from the ideal roofline model** (not measurements)"},
    no_profile="no recorded profile for this device, so the ideal roofline is used",
    knee="Target {name}: {params:.2f} B parameters, {gb:.2f} GB streamed per pass. Ideal-roofline knee: "
         "**{knee} tokens per pass** at context {context} — below it the ideal pass costs the same however "
         "many tokens it checks.",
    calibrated_pass="Calibrated: a pass of 1 token costs **{t1:.2f} ms**, of {n} tokens **{tn:.2f} ms** "
                    "(+{grow:.0%}; the ideal roofline says +{ideal_grow:.0%}): on real kernels every extra "
                    "token adds time from the first one on.",
    crossover="With {drafter} drafting at acceptance α = {alpha:.2f}, speculation stops paying from **batch "
              "{cross}**: past that, checking extra tokens costs real time and rejected ones are pure waste "
              "(hence vLLM's `--speculative-disable-by-batch-size`).",
    no_crossover="With {drafter} drafting at α = {alpha:.2f}, speculation still pays at batch {last}.",
    published_fit="**Estimate vs {pub}** ({label}; {source}): with α fitted at batch {fit} (α = {alpha:.2f}; "
                  "set the slider there to compare), the {model} estimate is within **{err:.0f} %** over "
                  "batch {lo}–{hi}; the {other} model, refitted (α = {oalpha:.2f}), within {oerr:.0f} %. "
                  "Published crossover: {pcross}; estimated: {ecross}. Compared at context {context}, which "
                  "the source does not state.",
    published_point="**Estimate vs {pub}** ({label}; {source}): at your α = {alpha:.2f}, batch {batch}: "
                    "estimate {est:.2f}× vs published {val:.2f}× ({err:+d} %).",
    no_published="No published measurement matches this GPU, target and draft; matching setups: {setups}.",
    speedup_title="Speed-up over plain decoding, k = {k} (estimate) vs {pub}",
    speedup_title_plain="Speed-up over plain decoding by batch and depth ({model} estimate)",
    latency_title="{target} on {gpu}: latency per pass (estimates)",
    this_machine="this machine ({device}, {dtype}): {bw:.1f} GB/s and {fl:.2f} TFLOP/s, **measured** by "
                 "calibration",
    custom_desc="{name} (given by you)",
    preset_desc="{name}: {bw:.2f} TB/s, {fl:.0f} TFLOP/s ({source})",
    hardware="{heading}: {hw}. Cost model: {cal} — {note}.",
    batch="batch {b}",
    none_measured="none measured",
    none_estimated="none up to batch 4096",
    crossover_title="Tokens/s by batch and depth, α = {alpha:.2f} ({kind} estimate)",
    unknown_profile="Unknown profile {name!r}.",
    profile_title="{target} on {device}: measured vs roofline",
    profile_md="**Measured** with `python -m specviz roofline` on {device}: calibrated {bw:.1f} GB/s and "
               "{fl:.2f} TFLOP/s, context {context}. Measured knee **{knee:.0f}** tokens per pass; roofline "
               "prediction from the calibrated peaks **{pred}** (dashed line: the estimate).",
    profile_no_shape="no model shape recorded",
    profile_fit=" The calibrated model fitted to this curve (dotted; overhead {overhead:.1f} ms per pass, "
                "arithmetic at {eff:.0%} of the calibrated FLOP/s) is within {worst:.0%} of every point.",
    knee_title="{model} on {device}: measured now",
    knee_progress="Measuring on {device} … {points}",
    knee_no_peaks="not available (this device's peaks are not calibrated yet)",
    knee_pred="**{knee}** from the calibrated peaks ({bw:.1f} GB/s, {fl:.2f} TFLOP/s)",
    knee_md="**Measured** on {device}, {model}, context {context}: {points}. Measured knee **{knee:.0f}** tokens "
            "per pass; roofline prediction {pred}. Two tokens per pass cost {flat:.2f}× one. Measured with the "
            "device to itself: the shared batch paused and other timed experiments waited (other programs on "
            "this machine can still distort the curve).",
    knee_waiting="Waiting for the device: number **{position}** in the queue. Timed experiments run one at a "
                 "time, with the device to themselves, so their figures are not distorted by each other.",
    knee_overhead="At one token per pass this pass took {ratio:.1f}× the roofline time, so neither streaming "
                  "the weights nor the arithmetic explains it: kernel launches and Python, kernels far below "
                  "peak, or other work on this device do. SpecViz calls that **overhead-bound**, the third "
                  "regime; where it rules, the flat part of the curve is overhead, and this knee is not the "
                  "memory/compute ridge.",
    measure_intro="## Measure the knee on this machine\n\nTimes the target's forward pass at 1, 2, 4 … tokens per "
                  "pass (up to 128 on a CPU, 512 on a GPU) on top of a 256-token context, where the app runs.",
    loading="Loading **{label}** …",
    profiles_heading="## Measured on real hardware",
    no_profiles="No recorded profiles found in `assets/profiles/`. Record one with "
                "`python -m specviz roofline --target REF --profile assets/profiles/NAME.json`.",
)

# control and plot labels (same future lessons file)
LABELS = dict(gpu="GPU", target="Target model", draft="Draft", alpha="Acceptance rate α per token",
              context="Context length (tokens)", overhead="Extra fixed overhead per forward pass (ms)",
              model="Cost model", model_info="calibrated: measured rates and overheads · ideal: the roofline",
              bandwidth="Custom GPU bandwidth (TB/s)", flops="Custom GPU dense TFLOP/s",
              speedup="Speed-up vs batch: estimates and published measurements",
              latency="Latency per pass (estimates)", crossover="Batch × depth crossover (estimate)",
              knee_pair="Pair (its target is measured)", knee_run="Measure the knee",
              measured_latency="Measured latency per pass", profile="Recorded profile")


def _hardware(app, gpu: str, bw_tbs: float, flops_tflops: float):
    """(GpuSpec, description, dtype bytes, device kind) for a preset, a custom GPU or this machine."""
    if gpu == THIS_MACHINE:
        p = app.peaks
        if p is None:
            raise gr.Error(TEXT["no_peaks"])
        desc = TEXT["this_machine"].format(device=p.device, dtype=p.dtype, bw=p.bandwidth / 1e9, fl=p.flops / 1e12)
        return (rf.GpuSpec(THIS_MACHINE, p.bandwidth, p.flops, "calibrated here"), desc,
                2.0 if "16" in p.dtype else 4.0, p.device)
    if gpu == CUSTOM_GPU:
        if not (1e-3 <= bw_tbs <= 100 and 1e-3 <= flops_tflops <= 1e5):
            raise gr.Error(TEXT["bad_custom"])
        g = rf.resolve_gpu(None, bw_tbs * 1e12, flops_tflops * 1e12)
        return g, TEXT["custom_desc"].format(name=g.name), 2.0, "cuda"
    if gpu not in GPUS:
        raise gr.Error(TEXT["unknown_gpu"].format(gpu=gpu))
    g = GPUS[gpu]
    return g, TEXT["preset_desc"].format(name=g.name, bw=g.bandwidth / 1e12, fl=g.flops / 1e12, source=g.source), \
        2.0, "cuda"


def _model(name: str, bytes_per_param: float) -> rf.ModelSpec:
    if name not in MODELS:
        raise gr.Error(TEXT["unknown_model"].format(name=name))
    return replace(MODELS[name], bytes_per_param=bytes_per_param)


def _draft(name: str, target: rf.ModelSpec) -> rf.ModelSpec | None:
    try:
        return rf.resolve_draft(rf.NGRAM if name == NGRAM else str(name), target)
    except rf.PresetError as exc:
        raise gr.Error(str(exc)) from None


def draft_choices(target: str) -> list[str]:
    """Model presets, the EAGLE heads of this target (they read its features), and n-gram lookup."""
    return rf.draft_names([target]) + [NGRAM]


def remap_draft(draft: str, target: str) -> str:
    """Keep the kind of draft when the target changes: an EAGLE head follows its target."""
    for prefix in rf.EAGLE_HEADS:
        if str(draft).startswith(prefix):
            return prefix + target
    return draft


def calibration_for(app, gpu: str, g: rf.GpuSpec, device_kind: str, model: str):
    """(Calibration, note) for the chosen model: the ideal roofline, this machine's recorded profile, or
    the serving stack's published fit (with a recorded GPU profile's rates when there is one)."""
    if model == IDEAL:
        return rf.IDEAL, rf.IDEAL.source
    if model != CALIBRATED:
        raise gr.Error(TEXT["unknown_model_kind"].format(model=model))
    profiles = load_profiles()
    if gpu == THIS_MACHINE:
        prof = profile_for_device(profiles, device_kind)
        if prof is None:
            return rf.IDEAL, TEXT["no_profile"]
        return profile_calibration(prof), profile_calibration(prof).source
    cal = gpu_calibration(g, profiles)
    note = cal.source if gpu != CUSTOM_GPU else cal.source + " (its rates as fractions of your GPU's peaks)"
    return cal, note


def _numbers(alpha, context, overhead_ms, bw_tbs, flops_tflops):
    try:
        vals = float(alpha), int(context), float(overhead_ms) / 1000, float(bw_tbs), float(flops_tflops)
    except (TypeError, ValueError, OverflowError):
        raise gr.Error(TEXT["bad_numbers"]) from None
    alpha, context, overhead = vals[:3]
    if not 0 <= alpha < 1 or not 1 <= context <= 131072 or not 0 <= overhead <= 1:
        raise gr.Error(TEXT["out_of_range"])
    return vals


def _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs, flops_tflops):
    """Everything one choice of knobs means, checked: (setup, α, description, calibration note)."""
    alpha, context, overhead, bw_tbs, flops_tflops = _numbers(alpha, context, overhead_ms, bw_tbs, flops_tflops)
    gpu, target, draft, model = (str(x) for x in (gpu, target, draft, model))    # raw API values too
    g, hw_desc, bpp, kind = _hardware(app, gpu, bw_tbs, flops_tflops)
    t_spec = _model(target, bpp)
    d_spec = _draft(draft, t_spec)
    if d_spec is not None:
        d_spec = replace(d_spec, bytes_per_param=bpp)
    cal, note = calibration_for(app, gpu, g, kind, model)
    return rf.Setup(t_spec, d_spec, g.bandwidth, g.flops, context, cal, overhead), alpha, hw_desc, note


def compute(app, gpu, target, draft, alpha, context, overhead_ms, model=CALIBRATED,
            bw_tbs=DEFAULTS["bandwidth_tbs"], flops_tflops=DEFAULTS["flops_tflops"]):
    """Summary markdown, latency figure and crossover figure for one choice of knobs (all estimates)."""
    setup, alpha, hw_desc, note = _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs,
                                          flops_tflops)
    t_spec, cal = setup.target, setup.calibration
    knee = predicted_knee(t_spec, setup.bandwidth, setup.flops, setup.context)
    ideal_ms = [1000 * s for s in latency_curve(t_spec, setup.bandwidth, setup.flops, TOKENS, setup.context,
                                                setup.overhead_s)]
    cal_ms = None if cal.is_ideal else [1000 * s for s in latency_curve(
        t_spec, setup.bandwidth, setup.flops, TOKENS, setup.context, setup.overhead_s, cal)]
    rows = whatif_rows(t_spec, setup.draft, setup.bandwidth, setup.flops, alpha, setup.context, BATCHES, DEPTHS,
                       setup.overhead_s, cal)
    kind = IDEAL if cal.is_ideal else CALIBRATED
    fig_lat = charts.latency_figure(TOKENS, ideal_ms, knee, title=TEXT["latency_title"].format(target=target, gpu=gpu),
                                    calibrated_ms=cal_ms)
    fig_x = charts.crossover_figure([r for r in rows if r["depth"] in PLOT_DEPTHS],
                                    TEXT["crossover_title"].format(alpha=alpha, kind=kind))
    md = summary_md(rows, hw_desc, setup, draft, knee, alpha, kind, note, ideal_ms, cal_ms)
    md += "\n\n" + published_md(setup, gpu, target, draft, alpha, kind)
    return md, fig_lat, fig_x


def summary_md(rows, hw_desc, setup, draft, knee, alpha, kind, note, ideal_ms, cal_ms) -> str:
    t_spec = setup.target
    by = {(r["batch_size"], r["depth"]): r for r in rows}
    cross = crossover_from_rows(rows)
    lines = [TEXT["hardware"].format(heading=TEXT["heading"][kind], hw=hw_desc, cal=setup.calibration.name,
                                     note=note),
             TEXT["knee"].format(name=t_spec.name, params=t_spec.params / 1e9,
                                 gb=t_spec.streamed_params * t_spec.bytes_per_param / 1e9, knee=knee,
                                 context=setup.context)]
    if cal_ms is not None:
        n = TOKENS.index(64)
        lines.append(TEXT["calibrated_pass"].format(t1=cal_ms[0], n=TOKENS[n], tn=cal_ms[n],
                                                    grow=cal_ms[n] / cal_ms[0] - 1,
                                                    ideal_grow=ideal_ms[n] / ideal_ms[0] - 1))
    lines = ["\n\n".join(lines)]
    lines += ["", "| batch | best depth k | speed-up vs plain | FLOPs spent vs plain | batch × (k+1) |",
              "|---:|---:|---:|---:|---:|"]
    for b in BATCHES:
        best = max((by[(b, k)] for k in DEPTHS), key=lambda r: r["tokens_per_s"])
        lines.append(f"| {b} | {best['depth']} | {best['speedup']:.2f}× | "
                     f"{best['flops_ratio']:.2f}× | {b * (best['depth'] + 1)} |")
    lines.append("")
    drafter = "an n-gram lookup (free)" if setup.draft is None else draft
    lines.append(TEXT["crossover"].format(drafter=drafter, alpha=alpha, cross=cross) if cross else
                 TEXT["no_crossover"].format(drafter=drafter, alpha=alpha, last=BATCHES[-1]))
    return "\n".join(lines)


def _matching(gpu: str, target: str, draft: str):
    return [s for s in load_published() if s.matches(gpu, target, draft)]


def published_md(setup: rf.Setup, gpu: str, target: str, draft: str, alpha: float, kind: str) -> str:
    """The model's error against every published series measured on this setup (α fitted as the goal
    states it), or which setups have published points."""
    series = _matching(gpu, target, draft)
    if not series:
        setups = "; ".join(sorted({f"{s.gpu} + {s.target} + {s.draft}" for s in load_published()})) or "none"
        return TEXT["no_published"].format(setups=setups)
    other = IDEAL if kind == CALIBRATED else CALIBRATED
    other_cal = rf.IDEAL if other == IDEAL else gpu_calibration(rf.resolve_gpu(series[0].gpu), load_profiles())
    lines = []
    for s in series:
        if s.fit_batch is not None:
            mine, theirs = compare(s, setup.calibration), compare(s, other_cal)
            lines.append(TEXT["published_fit"].format(
                pub=PUBLISHED_LABEL, label=s.label, source=s.source, fit=s.fit_batch, alpha=mine.alpha,
                model=kind, err=100 * mine.max_error, lo=min(s.batch_sizes), hi=max(s.batch_sizes), other=other,
                oalpha=theirs.alpha, oerr=100 * theirs.max_error,
                pcross=TEXT["batch"].format(b=mine.published_crossover) if mine.published_crossover
                else TEXT["none_measured"],
                ecross=TEXT["batch"].format(b=mine.crossover) if mine.crossover else TEXT["none_estimated"],
                context=s.context))
        else:
            c = compare(s, setup.calibration, alpha, context=setup.context)
            lines.append(TEXT["published_point"].format(
                pub=PUBLISHED_LABEL, label=s.label, source=s.source, alpha=alpha, batch=s.batch_sizes[-1],
                est=c.estimate[-1], val=s.speedup[-1], err=round(100 * c.errors[-1])))
    return "\n\n".join(lines)


def speedup_view(app, gpu, target, draft, alpha, context, overhead_ms, model=CALIBRATED,
                 bw_tbs=DEFAULTS["bandwidth_tbs"], flops_tflops=DEFAULTS["flops_tflops"]):
    """Speed-up against batch size: with published points when a source measured this setup (then both
    models at its depth), else the chosen model at a few depths. All lines are estimates at your α."""
    setup, alpha, _, _ = _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs, flops_tflops)
    series = _matching(gpu, target, draft)
    kind = IDEAL if setup.calibration.is_ideal else CALIBRATED

    def rows(cal, depths):
        return whatif_rows(setup.target, setup.draft, setup.bandwidth, setup.flops, alpha, setup.context,
                           BATCHES, [0] + depths, setup.overhead_s, cal)

    if not series:
        return charts.speedup_figure({kind: rows(setup.calibration, SPEEDUP_DEPTHS)}, SPEEDUP_DEPTHS, [],
                                     TEXT["speedup_title_plain"].format(model=kind))
    k = series[0].depth
    curves = {kind: rows(setup.calibration, [k])}
    if kind == CALIBRATED:
        curves[IDEAL] = rows(rf.IDEAL, [k])
    points = [charts.PointSet(s.legend, s.batch_sizes, s.speedup) for s in series]
    return charts.speedup_figure(curves, [k], points, TEXT["speedup_title"].format(k=k, pub=PUBLISHED_LABEL))


def profile_view(profiles: list[Profile], name: str):
    prof = next((p for p in profiles if p.label == name), None)
    if prof is None:
        raise gr.Error(TEXT["unknown_profile"].format(name=name))
    est = cal = None
    if prof.spec is not None:
        est = [1000 * s for s in latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass,
                                               prof.context)]
        fitted = profile_calibration(prof)
        cal = [1000 * s for s in latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass,
                                               prof.context, calibration=fitted)]
    fig = charts.latency_figure(prof.tokens_per_pass, est or [None] * len(prof.tokens_per_pass),
                                prof.predicted_knee, (prof.tokens_per_pass, prof.latency_s), prof.measured_knee,
                                title=TEXT["profile_title"].format(target=prof.target, device=prof.device),
                                calibrated_ms=cal)
    pred = TEXT["profile_no_shape"] if prof.predicted_knee is None else f"{prof.predicted_knee}"
    md = TEXT["profile_md"].format(device=prof.device, bw=prof.bandwidth / 1e9, fl=prof.flops / 1e12,
                                   context=prof.context, knee=prof.measured_knee, pred=pred)
    if cal is not None:
        worst = max(abs(c / (1000 * t) - 1) for c, t in zip(cal, prof.latency_s))
        md += TEXT["profile_fit"].format(overhead=1000 * fitted.layer_overhead_s * prof.spec.n_layers,
                                         eff=fitted.flops_eff, worst=worst)
    return md, fig


def build(app) -> None:
    gpus = list(GPUS) + [THIS_MACHINE, CUSTOM_GPU]
    models = list(MODELS)
    gr.Markdown(TEXT["intro"], elem_id="whatif-intro")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            gpu = gr.Dropdown(gpus, value=DEFAULTS["gpu"], label=LABELS["gpu"], elem_id="whatif-gpu")
            target = gr.Dropdown(models, value=DEFAULTS["target"], label=LABELS["target"],
                                 elem_id="whatif-target")
            draft = gr.Dropdown(draft_choices(DEFAULTS["target"]), value=DEFAULTS["draft"], label=LABELS["draft"],
                                elem_id="whatif-draft")
            alpha = gr.Slider(0, 0.99, value=DEFAULTS["alpha"], step=0.01, label=LABELS["alpha"],
                              elem_id="whatif-alpha")
            context = gr.Slider(1, 32768, value=DEFAULTS["context"], step=1, label=LABELS["context"],
                                elem_id="whatif-context")
            overhead = gr.Slider(0, 20, value=DEFAULTS["overhead"], step=0.1,
                                 label=LABELS["overhead"], elem_id="whatif-overhead")
            model = gr.Radio([CALIBRATED, IDEAL], value=DEFAULTS["model"], label=LABELS["model"],
                             info=LABELS["model_info"],
                             elem_id="whatif-model")
            with gr.Row():
                bw = gr.Number(DEFAULTS["bandwidth_tbs"], label=LABELS["bandwidth"], minimum=0.001,
                               elem_id="whatif-bandwidth")
                fl = gr.Number(DEFAULTS["flops_tflops"], label=LABELS["flops"], minimum=0.001,
                               elem_id="whatif-flops")
        with gr.Column(scale=3, min_width=420):
            vals = list(DEFAULTS.values())
            md0, lat0, x0 = compute(app, *vals)
            summary = gr.Markdown(md0, elem_id="whatif-summary")
    fig_speedup = gr.Plot(speedup_view(app, *vals), label=LABELS["speedup"],
                          elem_id="whatif-speedup")
    with gr.Row():
        fig_lat = gr.Plot(lat0, label=LABELS["latency"], elem_id="whatif-latency")
        fig_x = gr.Plot(x0, label=LABELS["crossover"], elem_id="whatif-crossover")
    inputs = [gpu, target, draft, alpha, context, overhead, model, bw, fl]
    triggers = [c.change for c in inputs if c is not target]

    def on_change(*vals):
        return compute(app, *vals)

    def on_speedup(*vals):
        return speedup_view(app, *vals)

    def on_target(new_target, current):
        return gr.update(choices=draft_choices(new_target), value=remap_draft(current, new_target))

    gr.on(triggers, on_change, inputs, [summary, fig_lat, fig_x], api_name="whatif", show_progress="hidden")
    gr.on(triggers, on_speedup, inputs, [fig_speedup], api_name="whatif_speedup", show_progress="hidden")
    (target.change(on_target, [target, draft], [draft], show_progress="hidden")
     .then(on_change, inputs, [summary, fig_lat, fig_x], show_progress="hidden")
     .then(on_speedup, inputs, [fig_speedup], show_progress="hidden"))
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
                                title=TEXT["knee_title"].format(model=spec.name, device=upd.device))
    points = ", ".join(f"{n} → {1000 * t:.1f} ms" for n, t in zip(upd.tokens_per_pass, upd.latency_s))
    if not upd.done:
        return TEXT["knee_progress"].format(device=upd.device, points=points), fig
    flat = upd.latency_s[1] / upd.latency_s[0] if len(upd.latency_s) > 1 else float("nan")
    pred = (TEXT["knee_no_peaks"] if predicted is None else
            TEXT["knee_pred"].format(knee=predicted, bw=peaks.bandwidth / 1e9, fl=peaks.flops / 1e12))
    text = TEXT["knee_md"].format(device=upd.device, model=spec.name, context=context, points=points, knee=knee,
                                  pred=pred, flat=flat)
    if peaks is not None and upd.latency_s[0] > OVERHEAD_FACTOR * est[0] / 1000:
        text += "\n\n" + TEXT["knee_overhead"].format(ratio=upd.latency_s[0] / (est[0] / 1000))
    return text, fig


def _build_measure(app) -> None:
    gr.Markdown(TEXT["measure_intro"])
    labels = [c.label for c in app.choices]
    with gr.Row():
        pick = gr.Dropdown(labels, value=labels[0], label=LABELS["knee_pair"], elem_id="knee-pair",
                           scale=3)
        go = gr.Button(LABELS["knee_run"], elem_id="knee-run", scale=1)
    md = gr.Markdown("", elem_id="knee-summary")
    fig = gr.Plot(label=LABELS["measured_latency"], elem_id="knee-plot")

    def measure(label):
        choice = app.choice(label)
        yield TEXT["loading"].format(label=choice.label), gr.skip()
        try:
            for upd in app.runner.knee(choice, KNEE_CONTEXT, app.peaks):
                if isinstance(upd, runner.Waiting):
                    yield TEXT["knee_waiting"].format(position=upd.position), gr.skip()
                    continue
                yield knee_view(upd)
        except (ModelError, EngineError) as exc:
            raise gr.Error(str(exc))

    go.click(measure, [pick], [md, fig], api_name="measure_knee", concurrency_limit=1)


def _build_profiles() -> None:
    gr.Markdown(TEXT["profiles_heading"])
    profiles = load_profiles()
    if not profiles:
        gr.Markdown(TEXT["no_profiles"])
        return
    labels = [p.label for p in profiles]
    pick = gr.Dropdown(labels, value=labels[0], label=LABELS["profile"], elem_id="profile")
    md0, fig0 = profile_view(profiles, labels[0])
    md = gr.Markdown(md0, elem_id="profile-summary")
    fig = gr.Plot(fig0, label=LABELS["measured_latency"], elem_id="profile-latency")
    pick.change(lambda name: profile_view(profiles, name), [pick], [md, fig], api_name="profile",
                show_progress="hidden")
