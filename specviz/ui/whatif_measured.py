"""The "What if?" tab's measured views: a recorded profile (assets/profiles/) or GPU curve (assets/gpu/)
against the roofline, and the knee measured from the page beside the GPU curves recorded by
scripts/gpu-check, each labelled with where, on which path and when it was measured."""
from __future__ import annotations

import gradio as gr

from specviz import charts, lessons
from specviz.hardware.costmodel import latency_curve
from specviz.hardware.device import OVERHEAD_FACTOR, find_knee
from specviz.hardware.gpu_records import newest_per_model, recorded_curves
from specviz.hardware.profiles import Profile, profile_calibration
from specviz.hardware.roofline import predicted_knee
from specviz.ui.whatif_views import _for_reader, _short, chart_labels, tx


def profile_view(profiles: list[Profile], name: str, lang: str = lessons.DEFAULT_LANG):
    prof = next((p for p in profiles if p.label == name), None)
    if prof is None:
        raise gr.Error(tx(lang, "unknown_profile", name=_short(name)))
    est = cal = None
    if prof.spec is not None:
        est = [1000 * s for s in latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass,
                                               prof.context)]
        fitted = profile_calibration(prof)
        cal = [1000 * s for s in latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass,
                                               prof.context, calibration=fitted)]
    fig = charts.latency_figure(prof.tokens_per_pass, est or [None] * len(prof.tokens_per_pass),
                                prof.predicted_knee, (prof.tokens_per_pass, prof.latency_s), prof.measured_knee,
                                title=tx(lang, "profile_title", target=prof.target, device=prof.where),
                                calibrated_ms=cal, labels=chart_labels(lang))
    pred = tx(lang, "profile_no_shape") if prof.predicted_knee is None else f"{prof.predicted_knee}"
    md = tx(lang, "profile_md", device=prof.where, bw=prof.bandwidth / 1e9, fl=prof.flops / 1e12,
            context=prof.context, knee=prof.measured_knee, pred=pred)
    # a shipped profile was measured on another machine of this kind: the page must not pass it off as this one
    md += tx(lang, "profile_shipped", recorded=prof.recorded) if prof.recorded else tx(lang, "profile_shipped_undated")
    if cal is not None:
        worst = max(abs(c / (1000 * t) - 1) for c, t in zip(cal, prof.latency_s))
        # a fit above 100 % says the calibration's matrix-multiply peak was measured below what these
        # passes reach, not that the chip beat its peak: said so, not shown as "190 % of" unexplained
        key = "profile_fit" if fitted.flops_eff <= 1.0 else "profile_fit_over"
        md += tx(lang, key, overhead=1000 * fitted.layer_overhead_s * prof.spec.n_layers,
                 eff=fitted.flops_eff, worst=worst)
    return md, _for_reader(fig, lang)


KNEE_CONTEXT = 256


def knee_view(upd, context: int = KNEE_CONTEXT, lang: str = lessons.DEFAULT_LANG):
    """Markdown and figure for a (partial) measured curve, with the roofline prediction beside it."""
    spec, peaks = upd.spec, upd.peaks
    est, predicted = [None] * len(upd.tokens_per_pass), None
    if peaks is not None:
        est = [1000 * s for s in latency_curve(spec, peaks.bandwidth, peaks.flops, upd.tokens_per_pass, context)]
        predicted = predicted_knee(spec, peaks.bandwidth, peaks.flops, context)
    knee = find_knee(upd.tokens_per_pass, upd.latency_s) if upd.done and len(upd.tokens_per_pass) >= 4 else None
    fig = charts.latency_figure(upd.tokens_per_pass, est, predicted, (upd.tokens_per_pass, upd.latency_s), knee,
                                title=tx(lang, "knee_title", model=spec.name, device=upd.device),
                                labels=chart_labels(lang))
    recorded = newest_per_model(recorded_curves())
    for c in recorded:            # beside this machine's curve: the GPU ones, dotted, labelled
        fig.add_scatter(x=list(c.tokens_per_pass), y=[1000 * t for t in c.latency_s], mode="lines+markers",
                        name=lessons.isolate_rtl(lessons.say(lang, c.label)), line=dict(dash="dot", width=2))
    _for_reader(fig, lang)
    points = lessons.Listed(f"{n} → {1000 * t:.1f} ms" for n, t in zip(upd.tokens_per_pass, upd.latency_s))
    if not upd.done:
        return tx(lang, "knee_progress", device=upd.device, points=points), fig
    flat = upd.latency_s[1] / upd.latency_s[0] if len(upd.latency_s) > 1 else float("nan")
    pred = (tx(lang, "knee_no_peaks") if predicted is None else
            tx(lang, "knee_pred", knee=predicted, bw=peaks.bandwidth / 1e9, fl=peaks.flops / 1e12))
    text = tx(lang, "knee_md", device=upd.device, model=spec.name, context=context, points=points, knee=knee,
              pred=pred, flat=flat)
    if recorded:
        text += "\n\n" + tx(lang, "knee_recorded", where=lessons.Listed(c.label for c in recorded))
    if peaks is not None and upd.latency_s[0] > OVERHEAD_FACTOR * est[0] / 1000:
        text += "\n\n" + tx(lang, "knee_overhead", ratio=upd.latency_s[0] / (est[0] / 1000))
    return text, fig
