"""Chapter: the knee. Latency of one target pass against tokens per pass, beside the roofline from this
machine's calibrated peaks: flat while memory-bound, rising once compute-bound. Beside it, the GPU curves
recorded by scripts/gpu-check (assets/gpu/), each labelled with its device, forward path and date, and
judged by the same rule.

Measured: about 18 s on the 2-core CPU with the offline SmolLM2-135M.
"""
from __future__ import annotations

import math
from typing import Iterator

import plotly.graph_objects as go
import torch

from specviz import lessons
from specviz.chapters.base import Chapter, Result
from specviz.chapters.common import finished, finite, settings_of, snapshot
from specviz.chapters.passes import Contexts
from specviz.chapters.plotting import PLAIN, REJECTED, VERIFY, labels_for, styled, vline
from specviz.engine.torchmode import inference_steps
from specviz.hardware.costmodel import latency_curve
from specviz.hardware.device import KNEE_TOKENS, OVERHEAD_FACTOR, Peaks, find_knee, flat_to, knee_steps
from specviz.hardware.gpu_records import RecordedCurve, newest_per_model, recorded_curves
from specviz.hardware.paired import FIRST_PAIRS, MOST_PAIRS, Ratio, paired_ratio
from specviz.hardware.roofline import predicted_knee

RECORDED = ("#1a9850", "#9e7cc1", "#f39c34")      # recorded GPU curves, dotted
KNEE_FLAT = 1.15         # 2 tokens within 15 % of 1 token: "almost free"; beyond it extra tokens cost

ONE_TWO_FIVE = [m * 10.0 ** e for e in range(-3, 8) for m in (1, 2, 5)]   # a log time axis's labels


def knee_conclusion(ratio2: float, t1_s: float, roofline_t1_s: float | None, gpu: bool = False,
                    measured: Ratio | None = None) -> str:
    """Not memory-bound when a 2-token pass costs ≥ 15 % more than a 1-token pass (extra tokens are not
    free); else overhead-bound when one token took over twice its roofline time — its MBU below
    1 / OVERHEAD_FACTOR: fixed costs, not the weight read, fill the pass (on a GPU: launches and Python,
    named as such, never memory-bound); else flat (memory-bound: the textbook case). Close to call when
    `measured` (ratio2 from alternating passes) has an interval that holds the 15 % line."""
    if measured is not None and measured.holds(KNEE_FLAT):
        return "conclusion_close"
    if ratio2 >= KNEE_FLAT:
        return "conclusion_not_memory_bound"
    if roofline_t1_s is not None and t1_s > OVERHEAD_FACTOR * roofline_t1_s:
        return "conclusion_overhead_bound_gpu" if gpu else "conclusion_overhead_bound"
    return "conclusion_flat"


RECORDED_KEYS = {"conclusion_not_memory_bound": "recorded_not_memory_bound",
                 "conclusion_overhead_bound_gpu": "recorded_overhead_bound", "conclusion_flat": "recorded_flat"}


def recorded_conclusion(c: RecordedCurve) -> tuple[str, dict]:
    """A recorded GPU curve judged by the same rule as this machine's: (lesson key, its values)."""
    t1 = c.latency_s[0]
    ratio2 = c.latency_s[1] / t1 if len(c.latency_s) > 1 else 1.0
    roof_t1 = c.mbu_at_1_token * t1 if c.mbu_at_1_token else None
    key = RECORDED_KEYS[knee_conclusion(ratio2, t1, roof_t1, gpu=True)]
    return key, {"where": c.where, "model": c.model, "t1_ms": 1000 * t1, "mbu": c.mbu_at_1_token or 0.0,
                 "flat_to": c.flat_to(), "ratio2": ratio2, "predicted": c.predicted_knee or "?",
                 "knee": round(min(c.measured_knee or c.tokens_per_pass[-1], c.tokens_per_pass[-1]))}


def recorded_series() -> list[dict]:
    """The recorded GPU curves the chapter draws (newest run, one per model), JSON-able."""
    return [{"where": c.where, "model": c.model, "tokens_per_pass": list(c.tokens_per_pass),
             "measured_ms": [1000 * t for t in c.latency_s], "conclusion": recorded_conclusion(c)}
            for c in newest_per_model(recorded_curves())]


@inference_steps
def run_knee(pair, peaks: Peaks | None, context: int = 256, repeats: int = 3,
             cap: int | None = None) -> Iterator[Result]:
    """Latency of one target pass against tokens per pass (hardware.knee_steps: log-spaced up to 128 on
    CPU, 512 on GPU, median of `repeats`), one yield per point, with the ideal roofline from this
    machine's calibrated `peaks` (None: no roofline, and no overhead-bound verdict). The verdict's ratio
    (2 tokens ÷ 1) and the final 1- and 2-token points come from `verdict_passes`. Extra keys:
    `predicted_knee` (roofline), `measured_knee`."""
    t, spec = pair.target, pair.target_spec
    cap = cap or (512 if t.device.type == "cuda" else 128)
    total = len([n for n in KNEE_TOKENS if n <= cap])
    predicted = predicted_knee(spec, peaks.bandwidth, peaks.flops, context) if peaks else None
    settings = settings_of(pair, context=context, repeats=repeats, cap=cap, pairs=FIRST_PAIRS, most_pairs=MOST_PAIRS,
                         peaks=None if peaks is None else {"bandwidth": peaks.bandwidth, "flops": peaks.flops})
    extra = {"predicted_knee": predicted, "measured_knee": None, "recorded": recorded_series()}
    yield snapshot("knee", pair, settings, 0.0, [], **extra)
    ns, lat, rows = [], [], []
    # through the forward path the pair's engine runs (the fast path once the app has switched to it)
    for ns, lat in knee_steps(t.model, t.device, t.dtype, context, repeats, cap, pair.target_cache):
        rows = knee_rows(spec, peaks, context, ns, lat)
        yield snapshot("knee", pair, settings, len(ns) / total, rows, **extra)
    measured = verdict_passes(pair, context)
    # the curve's 1- and 2-token points become the verdict's medians (more passes, alternated), so the
    # conclusion's words and the chart read the passes it was judged on
    lat = [measured.a_s, measured.b_s][: len(lat)] + lat[2:]
    rows = knee_rows(spec, peaks, context, ns, lat)
    values = {**knee_values(ns, lat, rows), "predicted_knee": predicted, **measured.values("ratio2"),
              "line": KNEE_FLAT}
    extra["measured_knee"] = values["knee"]
    key = knee_conclusion(values["ratio2"], lat[0], rows[0]["roofline_ms"] / 1000 if peaks else None,
                          gpu=t.device.type == "cuda", measured=measured)
    recorded = [r["conclusion"] for r in extra["recorded"]]
    yield finished(snapshot("knee", pair, settings, 1.0, rows, **extra), values, key,
                   [key] + [k for k, _ in recorded], [values] + [v for _, v in recorded])


def verdict_passes(pair, context: int) -> Ratio:
    """A 2-token pass ÷ a 1-token pass, timed in alternation on one prefilled context: the curve's two
    points were timed a second apart, and a CPU that slowed in between moved the verdict between presses."""
    t = pair.target
    ctx = torch.randint(0, t.model.get_input_embeddings().weight.shape[0], (1, context), device=t.device)
    contexts = Contexts(pair, ctx)
    return paired_ratio(contexts.shaped(1, 1), contexts.shaped(1, 2), t.device, (KNEE_FLAT,))


def knee_rows(spec, peaks: Peaks | None, context: int, ns: list[int], lat: list[float]) -> list[dict]:
    roof = latency_curve(spec, peaks.bandwidth, peaks.flops, ns, context) if peaks else [None] * len(ns)
    return [{"tokens_per_pass": n, "measured_ms": 1000 * s, "roofline_ms": None if r is None else 1000 * r,
             "ms_per_token": 1000 * s / n} for n, s, r in zip(ns, lat, roof)]


def knee_values(ns: list[int], lat: list[float], rows: list[dict]) -> dict:
    """knee: where the measured curve leaves its flat part (hardware.find_knee), within the range measured;
    ratio2: a 2-token pass ÷ a 1-token pass (run_knee quotes its alternating pairs' instead); overhead_ms: the cheapest pass (the floor); flat_to: the
    widest pass within 25 % of a one-token pass, flat_ratio: the slowest pass up to it ÷ the one-token pass."""
    knee = find_knee(ns, lat) if len(ns) >= 2 else float(ns[-1])
    knee = int(round(min(max(finite(knee, ns[-1]), 1.0), ns[-1])))
    ratio2 = lat[1] / lat[0] if len(lat) > 1 and lat[0] > 0 else 1.0
    roof = rows[0]["roofline_ms"]
    # what "almost the same time" means, in numbers: the widest pass within FLAT of one token, and the
    # slowest pass up to it (the conclusion quotes both, so it cannot claim more than the chart shows)
    flat = flat_to(ns, lat)
    flat_ratio = max(t for n, t in zip(ns, lat) if n <= flat) / lat[0] if lat[0] > 0 else 1.0
    return {"knee": knee, "ratio2": ratio2, "overhead_ms": 1000 * min(lat), "flat_to": flat, "flat_ratio": flat_ratio,
            "one_token_ms": 1000 * lat[0], "roofline_one_token_ms": roof,
            # the one-token pass's share of the memory limit (its roofline time is the weights' streaming)
            "mbu": roof / (1000 * lat[0]) if roof is not None and lat[0] > 0 else None}


def figure_knee(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Measured time of one target pass against tokens per pass (log axes), the roofline from calibrated
    peaks (dashed, when there are peaks), and the measured and roofline knees when known."""
    L = labels_for("knee", labels)
    rows = result.get("table", [])
    ns = [r["tokens_per_pass"] for r in rows]
    fig = go.Figure()
    if any(r.get("roofline_ms") is not None for r in rows):
        fig.add_trace(go.Scatter(x=ns, y=[r["roofline_ms"] for r in rows], mode="lines", name=L["roofline"],
                                 line=dict(color=PLAIN, dash="dash", width=2)))
    fig.add_trace(go.Scatter(x=ns, y=[r["measured_ms"] for r in rows], mode="lines+markers", name=L["measured"],
                             line=dict(color=VERIFY, width=3)))
    for i, rec in enumerate(result.get("recorded", [])):       # recorded on a GPU: where, path and when
        name = lessons.chart_fill(L["recorded"], {"where": lessons.say(L.get("_lang", "en"), rec["where"]),
                                                  "model": rec["model"]})
        fig.add_trace(go.Scatter(x=rec["tokens_per_pass"], y=rec["measured_ms"], mode="lines+markers",
                                 name=name,
                                 line=dict(color=RECORDED[i % len(RECORDED)], width=2, dash="dot")))
    if result.get("measured_knee"):
        vline(fig, result["measured_knee"], lessons.chart_fill(L["knee_measured"], {"knee": result["measured_knee"]}),
               REJECTED, "dot")
    if result.get("predicted_knee") and ns and result["predicted_knee"] <= 4 * max(ns):
        vline(fig, result["predicted_knee"], lessons.chart_fill(L["knee_predicted"], {"knee": result["predicted_knee"]}),
               PLAIN, "dash")
    # tokens at powers of two, times at 1-2-5: plotly labels every digit of a short log range otherwise
    fig.update_xaxes(dtick=math.log10(2), tick0=0)
    fig.update_yaxes(tickvals=ONE_TWO_FIVE, ticktext=[f"{v:g}" for v in ONE_TWO_FIVE])
    return styled(fig, dark, xaxis_type="log", yaxis_type="log", xaxis_title=L["axis_tokens"],
                  yaxis_title=L["axis_time"])


CHAPTER = Chapter("knee", run=lambda ctx: run_knee(ctx.pair, ctx.peaks), figure=figure_knee, button_id="run-knee")
