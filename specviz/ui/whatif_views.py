"""The "What if?" tab's views: its inputs checked, the estimates computed, and the markdown, figures and
CSV rows the page shows (all estimates), in the reader's language. `specviz.ui.whatif` lays the tab out
and wires these to its controls; the calibrated model itself is `specviz.hardware.costmodel`."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from specviz import charts, lessons
from specviz.hardware import costmodel, presets
from specviz.hardware import roofline as rf
from specviz.hardware.costmodel import crossover_from_rows, latency_curve, whatif_rows
from specviz.hardware.device import OVERHEAD_FACTOR
from specviz.hardware.gpu_records import RecordedCurve, curve_for, hold_against, recorded_curves
from specviz.hardware.presets import GPUS, MODELS
from specviz.hardware.profiles import (Profile, compare, fit_stack, gpu_calibration, load_profiles, load_published,
                                       preset_calibration, profile_calibration, profile_for_device, stack_calibration)
from specviz.hardware.roofline import predicted_knee

THIS_MACHINE = "This machine (calibrated peaks)"
CUSTOM_GPU = "Custom GPU (bandwidth and FLOP/s below)"
NGRAM = "n-gram lookup (no draft model)"
CALIBRATED, IDEAL = "calibrated", "ideal"
# the calibrated model plus the per-sequence bookkeeping fitted to SGLang's published speed-ups
SGLANG, SGLANG_STACK = "calibrated-sglang", "SGLang v0.4.4"
KINDS = (CALIBRATED, SGLANG, IDEAL)
PROFILE = "profile"     # what "This machine" runs on instead of vLLM's fit: the machine's recorded profile
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DEPTHS = [0, 1, 2, 3, 4, 6, 8]
PLOT_DEPTHS = {0, 1, 2, 4, 8}
SPEEDUP_DEPTHS = [1, 2, 4, 8]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
# the sliders' ends (the tab's and its deep links'): α, context (tokens), overhead (ms)
ALPHA_MAX, CONTEXT_MAX, OVERHEAD_MAX_MS = 0.99, 32768, 20
DEFAULTS = dict(gpu="H100 SXM", target="Llama-3.1-8B", draft="EAGLE:Llama-3.1-8B", alpha=0.7, context=800,
                overhead=0.0, model=CALIBRATED, bandwidth_tbs=3.35, flops_tflops=989.0)
PHONE_FRAME = 330     # px of a what-if figure besides its title and legend lines: the plot, axes and margins
TITLE_LINE, LEGEND_LINE = 20, 21    # px a line of the title (15 px text) and of the legend (14 px) takes

# The tab's words live in the [whatif] table of specviz/lessons/{en,fa}.toml. The constants above are the
# values the dropdowns and the API exchange (unchanged in every language); only their labels are translated.


def is_rtl(lang: str) -> bool:
    return lessons.direction(lang) == "rtl"


def tx(lang: str, key: str, /, **values) -> str:
    """The tab's text `whatif.<key>` in `lang`, with `values` filled in (bidi-safe in Persian)."""
    wrap = lessons.isolate_ltr if is_rtl(lang) else None
    return lessons.fill(lessons.template(lang, f"whatif.{key}"), lessons.said_in(lang, values), wrap)


def _cell(lang: str, value: str) -> str:
    """A table cell such as "1.42×": isolated in Persian, or the sign would jump to the number's other side."""
    return lessons.LRI + value + lessons.PDI if is_rtl(lang) else value


def lang_of(app, request) -> str:
    """The session's language (the page's switch); English for API calls and callers without a page."""
    tr = getattr(app, "tr", None)
    session = getattr(request, "session_hash", None) or "default"
    return tr.lang_of(session) if tr is not None else lessons.DEFAULT_LANG


def model_name(lang: str, kind: str) -> str:
    """"calibrated" / "ideal" as the reader's language says it (the API value stays `kind`)."""
    return tx(lang, f"model_{kind}") if kind in (*KINDS, PROFILE) else str(kind)


def chart_labels(lang: str) -> dict:
    """Raw templates for the what-if figures (charts.py fills the numbers in), plus the models' names."""
    labels = {k: lessons.isolate_rtl(lessons.template(lang, f"whatif.chart.{k}")) for k in charts.WHATIF_LABELS}
    return {**labels, **{f"model_{k}": model_name(lang, k) for k in (*KINDS, PROFILE)}}


def _for_reader(fig, lang: str):
    """The title and the legend's entries in lines a phone shows whole, and the figure tall enough that a
    phone's legend, one entry a line, leaves the plot its room (it squashed the crossover chart to a
    strip). A Persian title starts where Persian text starts, at the right (as the playground's live
    charts do), each line isolated right-to-left by itself, since plotly lays every line out on its own.
    (Plotly measures text in a hidden SVG that style.css keeps left-to-right, so its anchors are where
    they say.)"""
    rtl, title = is_rtl(lang), fig.layout.title.text
    entries = [tr for tr in fig.data if tr.name and tr.showlegend is not False]
    for tr in entries:
        tr.name = charts.lines_for(tr.name, rtl, charts.LEGEND_CHARS)
    lines = sum(tr.name.count("<br>") + 1 for tr in entries)
    if title:
        fig.update_layout(title_text=charts.lines_for(title, rtl),
                          title_font_size=15)     # plotly's 20 px fit 30 characters across a phone
        if rtl:
            fig.update_layout(title_x=0.98, title_xanchor="right")
    heads = fig.layout.title.text.count("<br>") + 1 if title else 0
    fig.update_layout(height=max(fig.layout.height or 0, PHONE_FRAME + TITLE_LINE * heads + LEGEND_LINE * lines))
    return fig


def gpu_options(lang: str) -> list[tuple[str, str]]:
    """(label, value): preset names as they are, the two special choices in the reader's language."""
    return ([(g, g) for g in GPUS] + [(tx(lang, "choice_this_machine"), THIS_MACHINE),
                                       (tx(lang, "choice_custom_gpu"), CUSTOM_GPU)])


def gpu_shown(gpu: str, lang: str) -> str:
    """The GPU as its list shows it in `lang` (the custom GPU's and this machine's names are translated)."""
    return next((label for label, value in gpu_options(lang) if value == gpu), gpu)


def model_options(lang: str) -> list[tuple[str, str]]:
    return [(model_name(lang, k), k) for k in KINDS]


def draft_options(target: str, lang: str) -> list[tuple[str, str]]:
    return [(tx(lang, "choice_ngram") if d == NGRAM else d, d) for d in draft_choices(target)]


# a custom GPU's bounds in the boxes' units (TB/s, TFLOP/s)
BW_TBS = tuple(b / 1e12 for b in presets.CUSTOM_BANDWIDTH)
FLOPS_TFLOPS = tuple(f / 1e12 for f in presets.CUSTOM_FLOPS)


def _hardware(app, gpu: str, bw_tbs: float, flops_tflops: float, lang: str = lessons.DEFAULT_LANG):
    """(GpuSpec, description, dtype bytes, device kind) for a preset, a custom GPU or this machine."""
    if gpu == THIS_MACHINE:
        p = app.peaks
        if p is None:
            raise gr.Error(tx(lang, "no_peaks"))
        desc = tx(lang, "this_machine", device=p.device, dtype=p.dtype, bw=p.bandwidth / 1e9, fl=p.flops / 1e12)
        return (presets.GpuSpec(THIS_MACHINE, p.bandwidth, p.flops, "calibrated here"), desc,
                2.0 if "16" in p.dtype else 4.0, p.device)
    if gpu == CUSTOM_GPU:
        try:                # the bounds are the preset module's (presets.CUSTOM_*), and so is the sentence
            g = presets.resolve_gpu(None, _scaled(bw_tbs), _scaled(flops_tflops))
        except presets.PresetError as exc:
            raise gr.Error(lessons.say(lang, exc)) from None
        return g, tx(lang, "custom_desc", name=g.name), 2.0, "cuda"
    if gpu not in GPUS:
        raise gr.Error(tx(lang, "unknown_gpu", gpu=_short(gpu)))
    g = GPUS[gpu]
    desc = tx(lang, "preset_desc", name=g.name, bw=g.bandwidth / 1e12, fl=g.flops / 1e12, source=g.source)
    return g, desc, 2.0, "cuda"


def _scaled(tera: float | None) -> float | None:
    return None if tera is None else tera * 1e12


def _short(value) -> str:
    """A name quoted in a refusal, cut short (a script may send 10,000 characters)."""
    text = str(value)
    return lessons.quoted(text if len(text) <= 40 else text[:39] + "…")


def model_spec(name: str, bytes_per_param: float, lang: str = lessons.DEFAULT_LANG) -> rf.ModelSpec:
    if name not in MODELS:
        raise gr.Error(tx(lang, "unknown_model", name=_short(name)))
    return replace(MODELS[name], bytes_per_param=bytes_per_param)


def _draft(name: str, target: rf.ModelSpec, lang: str = lessons.DEFAULT_LANG) -> rf.ModelSpec | None:
    try:
        return presets.resolve_draft(presets.NGRAM if name == NGRAM else str(name), target)
    except presets.PresetError as exc:
        raise gr.Error(lessons.say(lang, exc)) from None


def draft_choices(target: str) -> list[str]:
    """Model presets, the EAGLE heads of this target (they read its features), and n-gram lookup."""
    return presets.draft_names([target]) + [NGRAM]


def remap_draft(draft: str, target: str) -> str:
    """Keep the kind of draft when the target changes: an EAGLE head follows its target."""
    for prefix in presets.EAGLE_HEADS:
        if str(draft).startswith(prefix):
            return prefix + target
    return draft


def calibration_for(app, gpu: str, g: presets.GpuSpec, device_kind: str, model: str, lang: str = lessons.DEFAULT_LANG):
    """(Calibration, note) for the chosen model: the ideal roofline, this machine's recorded profile, or
    the serving stack's published fit (with a recorded GPU profile's rates when there is one)."""
    if model == IDEAL:
        return costmodel.IDEAL, tx(lang, "ideal_note")
    if model not in KINDS:
        raise gr.Error(tx(lang, "unknown_model_kind", model=_short(model)))
    if gpu == THIS_MACHINE:
        prof = profile_for_device(load_profiles(), device_kind)
        if prof is None:
            return costmodel.IDEAL, tx(lang, "no_profile")
        note = lessons.say(lang, profile_calibration(prof).source)
        return profile_calibration(prof), note + ("; " + tx(lang, "stack_not_here") if model == SGLANG else "")
    cal = preset_calibration(g, SGLANG_STACK if model == SGLANG else None)
    note = cal.source if gpu != CUSTOM_GPU else tx(lang, "custom_rates", source=cal.source)
    return cal, note


def _whole(value) -> int:
    """A whole number, also as "800.0" or 800.0 (an API caller's); 800.5 is refused."""
    number = float(value)
    if number != int(number):
        raise ValueError(value)
    return int(number)


def _numbers(alpha, context, overhead_ms, bw_tbs, flops_tflops, lang: str = lessons.DEFAULT_LANG):
    vals = []
    for key, value, kind in (("alpha", alpha, float), ("context", context, _whole), ("overhead", overhead_ms, float),
                             ("bandwidth", bw_tbs, float), ("flops", flops_tflops, float)):
        try:
            vals.append(kind(value))
        except (TypeError, ValueError, OverflowError):      # the one box that is wrong, by its label
            said = tx(lang, "bad_number_empty" if value in (None, "") else "bad_number",
                      name=tx(lang, f"label.{key}"), value=_short(value))
            raise gr.Error(said) from None
    vals[2] /= 1000
    alpha, context, overhead = vals[:3]
    if not 0 <= alpha < 1 or not 1 <= context <= 131072 or not 0 <= overhead <= 1:
        raise gr.Error(tx(lang, "out_of_range"))
    return vals


def _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs, flops_tflops,
            lang: str = lessons.DEFAULT_LANG):
    """Everything one choice of knobs means, checked: (setup, α, description, calibration note)."""
    alpha, context, overhead, bw_tbs, flops_tflops = _numbers(alpha, context, overhead_ms, bw_tbs, flops_tflops,
                                                              lang)
    gpu, target, draft, model = (str(x) for x in (gpu, target, draft, model))    # raw API values too
    g, hw_desc, bpp, kind = _hardware(app, gpu, bw_tbs, flops_tflops, lang)
    t_spec = model_spec(target, bpp, lang)
    d_spec = _draft(draft, t_spec, lang)
    if d_spec is not None:
        d_spec = replace(d_spec, bytes_per_param=bpp)
    cal, note = calibration_for(app, gpu, g, kind, model, lang)
    return costmodel.Setup(t_spec, d_spec, g.bandwidth, g.flops, context, cal, overhead), alpha, hw_desc, note


def compute(app, gpu, target, draft, alpha, context, overhead_ms, model=CALIBRATED,
            bw_tbs=DEFAULTS["bandwidth_tbs"], flops_tflops=DEFAULTS["flops_tflops"], *,
            lang: str = lessons.DEFAULT_LANG):
    """Summary markdown, latency figure and crossover figure for one choice of knobs (all estimates)."""
    setup, alpha, hw_desc, note = _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs,
                                          flops_tflops, lang)
    t_spec, cal = setup.target, setup.calibration
    knee = predicted_knee(t_spec, setup.bandwidth, setup.flops, setup.context)
    ideal_ms = [1000 * s for s in latency_curve(t_spec, setup.bandwidth, setup.flops, TOKENS, setup.context,
                                                setup.overhead_s)]
    cal_ms = None if cal.is_ideal else [1000 * s for s in latency_curve(
        t_spec, setup.bandwidth, setup.flops, TOKENS, setup.context, setup.overhead_s, cal)]
    rows = whatif_rows(t_spec, setup.draft, setup.bandwidth, setup.flops, alpha, setup.context, BATCHES, DEPTHS,
                       setup.overhead_s, cal)
    kind = _kind(model, cal, str(gpu))
    labels = chart_labels(lang)
    curve = curve_for(gpu, target) if gpu in GPUS else None
    measured = None
    if curve is not None:         # the recorded GPU curve, labelled with where, on which path and when
        measured = (list(curve.tokens_per_pass), list(curve.latency_s))
        labels = {**labels, "measured": lessons.isolate_rtl(tx(lang, "chart.recorded", where=curve.where))}
    fig_lat = charts.latency_figure(TOKENS, ideal_ms, knee, measured,
                                    title=tx(lang, "latency_title", target=target, gpu=gpu_shown(gpu, lang)),
                                    calibrated_ms=cal_ms, labels=labels)
    fig_x = charts.crossover_figure([r for r in rows if r["depth"] in PLOT_DEPTHS],
                                    tx(lang, "crossover_title", alpha=alpha, kind=model_name(lang, kind)), labels)
    md = summary_md(rows, hw_desc, setup, draft, knee, alpha, kind, note, ideal_ms, cal_ms, lang)
    md += memory_md(setup, GPUS[gpu] if gpu in GPUS else None, lang)
    md += recorded_md(gpu, target, curve, setup, kind, lang)
    md += "\n\n" + published_md(setup, gpu, target, draft, alpha, kind, lang)
    return md, _for_reader(fig_lat, lang), _for_reader(fig_x, lang)


def recorded_md(gpu: str, target: str, curve: RecordedCurve | None, setup: costmodel.Setup, kind: str,
                lang: str = lessons.DEFAULT_LANG) -> str:
    """The estimate held against the GPU curve recorded for this preset and model (assets/gpu/): the
    difference at one token and at the largest block, at the recording's own context."""
    if curve is None:
        known = gpu in GPUS and any(c.on_gpu(gpu) for c in recorded_curves())
        return "\n\n" + tx(lang, "recorded_none", model=target, gpu=gpu) if known else ""
    cal = None if setup.calibration.is_ideal else setup.calibration
    held = hold_against(curve, setup.bandwidth, setup.flops, setup.target, cal, setup.overhead_s)
    m, e, r = curve.latency_s, held.estimate_s, held.ratios
    text = tx(lang, "recorded_vs_estimate", where=curve.where, model=curve.model, context=curve.context,
              m1=1000 * m[0], e1=1000 * e[0], r1=r[0], n=curve.tokens_per_pass[-1], mn=1000 * m[-1],
              en=1000 * e[-1], rn=r[-1], kind=model_name(lang, kind))
    mbu = curve.mbu_at_1_token
    if mbu is not None and mbu < 1 / OVERHEAD_FACTOR:       # the knee chapter's overhead-bound rule
        text += " " + tx(lang, "recorded_overhead", mbu=mbu)
    return "\n\n" + text


def _kind(model: str, cal: costmodel.Calibration, gpu: str) -> str:
    """The model that actually ran: "ideal" when the calibrated one had to fall back to it, this machine's
    recorded profile where "This machine" is picked (its verdict had named vLLM's fit)."""
    return IDEAL if cal.is_ideal else PROFILE if gpu == THIS_MACHINE else str(model)


def csv_rows(app, gpu, target, draft, alpha, context, overhead_ms, model=CALIBRATED,
             bw_tbs=DEFAULTS["bandwidth_tbs"], flops_tflops=DEFAULTS["flops_tflops"]) -> list[dict]:
    """The data behind the tab's charts for these knobs (all estimates), long form, for the CSV."""
    setup, alpha, _, _ = _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs, flops_tflops,
                                 lessons.DEFAULT_LANG)
    cal = setup.calibration
    ideal = latency_curve(setup.target, setup.bandwidth, setup.flops, TOKENS, setup.context, setup.overhead_s)
    calib = None if cal.is_ideal else latency_curve(setup.target, setup.bandwidth, setup.flops, TOKENS,
                                                    setup.context, setup.overhead_s, cal)
    out = [{"chart": "latency per pass (estimate)", "tokens_per_pass": n, "ideal_ms": 1000 * a,
            "calibrated_ms": None if calib is None else 1000 * calib[i]} for i, (n, a) in enumerate(zip(TOKENS, ideal))]
    rows = whatif_rows(setup.target, setup.draft, setup.bandwidth, setup.flops, alpha, setup.context, BATCHES,
                       DEPTHS, setup.overhead_s, cal)
    out += [{"chart": "tokens/s vs batch (estimate)", **r} for r in rows]
    return out


def summary_md(rows, hw_desc, setup, draft, knee, alpha, kind, note, ideal_ms, cal_ms,
               lang: str = lessons.DEFAULT_LANG) -> str:
    t_spec = setup.target
    cross = crossover_from_rows(rows)
    lines = [tx(lang, "hardware", heading=tx(lang, f"heading_{kind}"), hw=hw_desc, cal=setup.calibration.name,
                note=note),
             tx(lang, "knee", name=t_spec.name, params=t_spec.params / 1e9,
                gb=t_spec.streamed_params * t_spec.bytes_per_param / 1e9, knee=knee, context=setup.context)]
    if cal_ms is not None:
        n = TOKENS.index(64)
        lines.append(tx(lang, "calibrated_pass", t1=cal_ms[0], n=TOKENS[n], tn=cal_ms[n],
                        grow=cal_ms[n] / cal_ms[0] - 1, ideal_grow=ideal_ms[n] / ideal_ms[0] - 1))
    lines = ["\n\n".join(lines), "", *best_depth_table(rows, lang), ""]
    drafter = tx(lang, "drafter_ngram") if setup.draft is None else draft
    model = model_name(lang, kind)            # an estimate's verdict names the model that made it
    if cross == BATCHES[0]:       # never pays: the batch is not why, the draft is
        lines.append(never_pays(setup, model, drafter, alpha, lang))
    else:
        lines.append(tx(lang, "crossover", model=model, drafter=drafter, alpha=alpha, cross=cross) if cross else
                     tx(lang, "no_crossover", model=model, drafter=drafter, alpha=alpha, last=BATCHES[-1])
                     + kv_reason(setup, knee, lang))
    return "\n".join(lines)


def never_pays(setup, model: str, drafter: str, alpha: float, lang: str) -> str:
    """Speculation loses from batch 1 on: a draft as large as its target costs a target pass per guess; a
    free one (n-gram) still widens every verify pass; otherwise the kept guesses do not repay the drafting."""
    d, t_spec = setup.draft, setup.target
    if d is None:               # n-gram lookup costs nothing: the wider verify pass is what the guesses must repay
        return tx(lang, "never_pays_free", model=model, drafter=drafter, alpha=alpha)
    if d.params >= t_spec.params:
        return tx(lang, "never_pays_big_draft", model=model, drafter=drafter, alpha=alpha,
                  draft_b=d.params / 1e9, target_b=t_spec.params / 1e9)
    return tx(lang, "never_pays", model=model, drafter=drafter, alpha=alpha)


def kv_reason(setup, knee: int, lang: str) -> str:
    """Why speculation still pays at the largest batch, where that is so because the rows' KV caches
    outweigh the weights (a small model, many rows): the lesson says big batches end it, so say why not."""
    t_spec = setup.target
    weights = t_spec.streamed_params * t_spec.bytes_per_param
    kv = t_spec.kv_bytes_per_token() * setup.context * BATCHES[-1]
    if kv <= weights:
        return ""
    return " " + tx(lang, "no_crossover_kv", last=BATCHES[-1], kv=kv / 1e9, weights=weights / 1e9, knee=knee,
                    context=setup.context)


def memory_md(setup: costmodel.Setup, g: presets.GpuSpec | None, lang: str = lessons.DEFAULT_LANG) -> str:
    """Whether the pair fits the GPU's memory, and how many rows' KV caches do beside it: an estimate of a
    pair that cannot run there is still drawn, so it says so. Empty where the memory is unknown."""
    fit = costmodel.memory_fit(setup, g.memory) if g is not None else None
    if fit is None:
        return ""
    values = dict(gpu=g.name, memory=fit.memory / 1e9, weights=fit.weights / 1e9, kv=fit.kv_per_row / 1e9,
                  context=setup.context, rows=fit.max_rows, last=BATCHES[-1],
                  kv_last=fit.kv_per_row * BATCHES[-1] / 1e9)
    key = "memory_over" if fit.max_rows == 0 else "memory_rows" if fit.max_rows < BATCHES[-1] else "memory_fits"
    return "\n\n" + tx(lang, key, **values)


def best_depth_table(rows, lang: str = lessons.DEFAULT_LANG) -> list[str]:
    """Markdown rows: for each batch size, the fastest depth and what it costs against plain decoding."""
    by = {(r["batch_size"], r["depth"]): r for r in rows}
    header = [tx(lang, k) for k in ("col_batch", "col_depth", "col_speedup", "col_flops", "col_tokens")]
    lines = ["| " + " | ".join(header) + " |", "|---:|---:|---:|---:|---:|"]
    for b in BATCHES:
        best = max((by[(b, k)] for k in DEPTHS), key=lambda r: r["tokens_per_s"])
        cells = [f"{b}", f"{best['depth']}", f"{best['speedup']:.2f}×", f"{best['flops_ratio']:.2f}×",
                 f"{b * (best['depth'] + 1)}"]
        lines.append("| " + " | ".join(_cell(lang, c) for c in cells) + " |")
    return lines


def _matching(gpu: str, target: str, draft: str):
    return [s for s in load_published() if s.matches(gpu, target, draft)]


def _legend(lang: str, s) -> str:
    """A published series' legend: its label, that it is a published measurement, and where from."""
    # a legend entry is plotly text (laid out left-to-right): a Persian one is isolated right-to-left
    return lessons.isolate_rtl(tx(lang, "published_legend", label=s.label, pub=tx(lang, "published_label"),
                                  cite=s.cite))


def published_md(setup: costmodel.Setup, gpu: str, target: str, draft: str, alpha: float, kind: str,
                 lang: str = lessons.DEFAULT_LANG) -> str:
    """The model's error against every published series measured on this setup (α fitted as the goal
    states it), or which setups have published points."""
    series = _matching(gpu, target, draft)
    if not series:
        setups = "; ".join(sorted({f"{s.gpu} + {s.target} + {s.draft}" for s in load_published()}))
        return tx(lang, "no_published", setups=setups or tx(lang, "no_setups"))
    other = IDEAL if kind != IDEAL else CALIBRATED
    base = gpu_calibration(presets.resolve_gpu(series[0].gpu), load_profiles())
    other_cal = costmodel.IDEAL if other == IDEAL else base
    pub = tx(lang, "published_label")
    lines = []
    for s in series:
        fit = fit_stack(s.stack, base, load_published()) if s.fit_batch is not None else None
        if fit is not None:
            lines.append(_stack_fit_md(lang, s, fit, base))
        elif s.fit_batch is not None:
            mine, theirs = compare(s, setup.calibration), compare(s, other_cal)
            lines.append(tx(
                lang, "published_fit", pub=pub, label=s.label, source=s.source, fit=s.fit_batch, alpha=mine.alpha,
                model=model_name(lang, kind), err=100 * mine.max_error, lo=min(s.batch_sizes),
                hi=max(s.batch_sizes), other=model_name(lang, other), oalpha=theirs.alpha,
                oerr=100 * theirs.max_error, context=s.context,
                pcross=_batch_or(lang, mine.published_crossover, "none_measured"),
                ecross=_batch_or(lang, mine.crossover, "none_estimated")))
        else:
            # the series' own stack (its bookkeeping), unless the reader chose the ideal roofline
            cal = setup.calibration if kind == IDEAL else stack_calibration(s.stack, base, load_published())
            c = compare(s, cal, alpha, context=setup.context)
            lines.append(tx(lang, "published_point", pub=pub, label=s.label, source=s.source, alpha=alpha,
                            batch=s.batch_sizes[-1], est=c.estimate[-1], val=s.speedup[-1],
                            err=round(100 * c.errors[-1])))
    return "\n\n".join(lines)


def _stack_fit_md(lang: str, s, fit, base: costmodel.Calibration) -> str:
    """One published series measured on a stack whose bookkeeping was fitted: the error of every model,
    the fit, and the held-out error (the bookkeeping fitted to the stack's other series only)."""
    with_stack = compare(s, stack_calibration(s.stack, base, load_published()))
    alone, ideal = compare(s, base), compare(s, costmodel.IDEAL)
    held = next((e for sid, _, e in fit.held_out if sid == s.id), None)
    return tx(lang, "published_fit_stack", pub=tx(lang, "published_label"), label=s.label, source=s.source,
              fit=s.fit_batch, alpha=with_stack.alpha, lo=min(s.batch_sizes), hi=max(s.batch_sizes),
              stack=s.stack, row_us=1e6 * fit.row_overhead_s, n_fit=len(fit.fitted_to),
              err_stack=100 * with_stack.max_error,
              held=tx(lang, "held_out", err=100 * held) if held is not None else tx(lang, "held_out_none"),
              err_base=100 * alone.max_error, err_ideal=100 * ideal.max_error,
              pcross=_batch_or(lang, with_stack.published_crossover, "none_measured"),
              ecross_stack=_batch_or(lang, with_stack.crossover, "none_estimated"),
              ecross_base=_batch_or(lang, alone.crossover, "none_estimated"),
              ecross_ideal=_batch_or(lang, ideal.crossover, "none_estimated"), context=s.context,
              model_stack=model_name(lang, SGLANG) if s.stack == SGLANG_STACK else s.stack,
              model_base=model_name(lang, CALIBRATED), model_ideal=model_name(lang, IDEAL))


def _batch_or(lang: str, batch: int | None, none_key: str) -> str:
    return tx(lang, "batch", b=batch) if batch else tx(lang, none_key)


def speedup_view(app, gpu, target, draft, alpha, context, overhead_ms, model=CALIBRATED,
                 bw_tbs=DEFAULTS["bandwidth_tbs"], flops_tflops=DEFAULTS["flops_tflops"], *,
                 lang: str = lessons.DEFAULT_LANG):
    """Speed-up against batch size: with published points when a source measured this setup (then both
    models at its depth), else the chosen model at a few depths. All lines are estimates at your α."""
    setup, alpha, _, _ = _inputs(app, gpu, target, draft, alpha, context, overhead_ms, model, bw_tbs, flops_tflops,
                                 lang)
    series = _matching(gpu, target, draft)
    kind = _kind(model, setup.calibration, str(gpu))
    labels = chart_labels(lang)

    def rows(cal, depths):
        return whatif_rows(setup.target, setup.draft, setup.bandwidth, setup.flops, alpha, setup.context,
                           BATCHES, [0] + depths, setup.overhead_s, cal)

    if not series:
        return _for_reader(charts.speedup_figure(
            {kind: rows(setup.calibration, SPEEDUP_DEPTHS)}, SPEEDUP_DEPTHS, [],
            tx(lang, "speedup_title_plain", model=model_name(lang, kind)), labels), lang)
    k = series[0].depth
    # with published points, every model's line, so the reader sees how far each one is from them
    base = gpu_calibration(presets.resolve_gpu(series[0].gpu), load_profiles())
    models = {CALIBRATED: base, SGLANG: stack_calibration(SGLANG_STACK, base, load_published()), IDEAL: costmodel.IDEAL}
    curves = {kind: rows(setup.calibration, [k])}
    if kind != IDEAL:
        curves.update({m: rows(c, [k]) for m, c in models.items() if m != kind})
    points = [charts.PointSet(_legend(lang, s), s.batch_sizes, s.speedup) for s in series]
    return _for_reader(charts.speedup_figure(curves, [k], points,
                                             tx(lang, "speedup_title", k=k, pub=tx(lang, "published_label")),
                                             labels), lang)
