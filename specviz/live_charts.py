"""The Playground's four live figures (throughput, hardware, acceptance, pass time), rebuilt twice a
second for every page that watches a Run. No gradio, no torch.

They are built as plain dicts and wrapped unchecked: plotly's property checks and its template copy cost
several times the build itself, with the GIL held beside the decoding thread (scripts/chart-tick-cost.py
measures both). A test runs every figure through plotly's checks, so a misspelt property still fails there."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

import plotly.graph_objects as go
import plotly.io as pio

from specviz.charts import ACCEPT, BONUS, LAYOUT, LEGEND_CHARS, PLAIN, POW2, REJECT, fill, lines_for, pack


@dataclass
class Series:
    """A rolling time series for the live charts: x in seconds since the run started."""

    x: list[float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)
    rolled: bool = False          # its oldest readings were let go: it no longer starts at the run's start

    def add(self, x: float, y: float | None, keep: int = 300) -> None:
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > keep:
            del self.x[0], self.y[0]
            self.rolled = True


@dataclass(frozen=True)
class PassPoint:
    """One step on the pass-time chart: the tokens its verify pass carried (rows + verified drafts), the
    width the forward path computed (StepEvent.padded_tokens), and the pass's measured seconds."""

    real: int
    padded: int
    seconds: float


# The live figures' words, in English; callers pass the same keys in another language (`labels=`), as
# specviz/lessons' [playground.chart] table has them.
LIVE_LABELS = dict(throughput_title="Tokens per second", seconds="seconds", tokens_per_s="tokens/s",
                   row="row {n}, each step", each_row="each row, each step",
                   your_rows="your rows, mean of the last {steps} steps",
                   all_rows="all rows, mean of the last {steps} steps", whole_batch="whole shared batch (all users)",
                   hardware_title="Hardware: busy ≠ used", mbu="MBU (est. bytes ÷ time ÷ peak)",
                   peak_line="100% = the calibrated peak; above it, calibration read the machine low",
                   mfu="MFU (est. FLOPs ÷ time ÷ peak)", accept_title="Accepted drafts per row-step",
                   accepted_tokens="accepted tokens", row_steps="row-steps",
                   no_drafts="no drafts yet: every step so far decoded plainly (depth 0 or nothing drafted)",
                   knee_title="Where each step sits on this machine's pass-time curve",
                   tokens_per_pass="tokens per pass", ms_per_pass="ms per pass",
                   curve_measured="pass time, measured here ({context} tokens of context)",
                   curve_recorded="pass time, recorded on {device} ({name})",
                   curve_pending="pass time: being measured…", knee_line="measured knee ≈ {knee} tokens",
                   recent_steps="recent steps", padded="padded width {n}",
                   this_step="this step: {n} tokens per pass", this_step_one="this step: {n} token per pass",
                   step_parts="{rows} + {drafts}",
                   comparison_title="{title}: plain decoding (k = 0) for comparison")

TOP_PERCENT = 1000    # the hardware chart's highest axis: ten times the calibrated peak
NOTE_CHARS = 40      # a note inside a chart, in lines a phone's plot holds
SPARSE = 60           # the hardware chart marks each step's estimate up to this many steps
# a live chart's title: its first line's baseline from the figure's top (below gradio's label, which sits
# over the plot's top left corner), each further line, and room under the last before the plot (15 px text)
TITLE_TOP, TITLE_LINE, TITLE_GAP = 56, 20, 14
STEP_CHARS, STEP_LINE = 48, 16     # the pass-time chart's step label: a line's characters (12 px), its height
SMOOTH_STEPS = 6      # the rows' total is the mean over this many latest steps (one step's rate jumps)
MARKERS_SHOWN = 12    # the latest changes drawn on the throughput chart
MARKER_CHARS = 16     # a change's short label, written up the plot, in lines that fit its height
MARKER_GAP = 0.06      # change markers closer than this share of the time axis keep one label (the last)


def _labels(labels: dict | None) -> dict:
    return {**LIVE_LABELS, **(labels or {})}


def _title(lab: dict, key: str, comparison: bool) -> str:
    """A chart's title; while a Run's plain baseline streams into the same charts, it says whose they are."""
    return fill(lab["comparison_title"], title=lab[key]) if comparison else lab[key]


def time_range(series: list[Series]) -> list[float] | None:
    """One time axis for the charts of a run, from its start (or the oldest reading a rolled window
    still holds) to its latest reading: each chart alone fits its own readings, and two charts side by
    side then disagree about when things happened."""
    held = [s for s in series if s.x]
    if not held:
        return None
    lo = max(0.0, min(s.x[0] for s in held)) if any(s.rolled for s in held) else 0.0
    hi = max(s.x[-1] for s in held)
    return [lo, hi] if hi > lo else None


@cache
def _template() -> dict:
    """plotly_white spelled out once: an unchecked figure sends its template as given, and plotly.js knows
    no template by name. Read-only after this (every figure shares it)."""
    return pio.templates["plotly_white"].to_plotly_json()


def _r(values: list) -> list:
    """Two decimals: the same chart with half the bytes (a page receives every figure twice a second)."""
    return [None if v is None else round(v, 2) for v in values]


def _figure(data: list[dict], title: str, x_title: str, y_title: str, rtl: bool, below_title: int = 0,
            **layout) -> go.Figure:
    """The figure, unchecked. The title in lines a phone shows whole, from the figure's top, with
    `below_title` px of room under it before the plot; a right-to-left page's starts at the right."""
    text = lines_for(title, rtl)
    head = dict(text=text, font=dict(size=15), yref="container", y=1, yanchor="top", pad=dict(t=TITLE_TOP))
    if rtl:
        head.update(x=0.98, xanchor="right")
    margin = {**LAYOUT["margin"], "t": TITLE_TOP + TITLE_LINE * text.count("<br>") + TITLE_GAP + below_title}
    xaxis, yaxis = layout.pop("xaxis", {}), layout.pop("yaxis", {})
    full = {**LAYOUT, "template": _template(), "title": head, "margin": margin, **layout,
            "xaxis": {**xaxis, "title": dict(text=x_title)}, "yaxis": {**yaxis, "title": dict(text=y_title)}}
    return go.Figure(data=data, layout=full, _validate=False)


def _line(s: Series, name: str, **style) -> dict:
    return dict(type="scatter", x=_r(s.x), y=_r(s.y), mode="lines", name=name, **style)


def _markers(markers: list[tuple[float, list[tuple[str, str]]]], span: float,
             rtl: bool = False) -> tuple[list[dict], list[dict]]:
    """A dotted line at each change of depth or batch; where several crowd together (a slider dragged
    through its range) only the last of them keeps its label, so the labels never print over each other.
    Each change of a step, a (short label, sentence) pair, writes its short label on a line (the
    sentences ran past a desktop's plot, about 75 px high under its legend) and its sentence on hover."""
    shapes, notes, last_x = [], [], None
    for x, changes in reversed(markers[-MARKERS_SHOWN:]):
        shapes.append(dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="paper",
                           line=dict(dash="dot", color="#999")))
        if last_x is None or last_x - x >= MARKER_GAP * span:
            notes.append(dict(x=x, y=1, yref="paper", text=_marker_text([c[0] for c in changes], rtl),
                              hovertext=_marker_text([c[1] for c in changes], rtl, 60), showarrow=False,
                              textangle=-90, xanchor="right", yanchor="top", font=dict(size=11, color="#666")))
            last_x = x
    return shapes, notes


def _marker_text(changes: list[str], rtl: bool, width: int = MARKER_CHARS) -> str:
    return "<br>".join(lines_for(c, rtl, width) for c in changes)


def throughput_figure(total: Series, per_row: dict[int, Series] | None = None,
                      markers: list[tuple[float, list[tuple[str, str]]]] | None = None,
                      shared: Series | None = None,
                      labels: dict | None = None, rtl: bool = False, x_range: list[float] | None = None,
                      comparison: bool = False) -> go.Figure:
    """Your rows' tokens/s (and each row's); with `shared`, the whole shared batch's (every user).
    `x_range`: the time axis the hardware chart beside it shares; `comparison`: a Run's plain baseline."""
    lab = _labels(labels)
    rows = sorted((per_row or {}).items())[:8]
    grouped, data = len(rows) > 2, []
    for i, (row, s) in enumerate(rows):
        # one legend entry for the rows' faint lines (eight entries squeezed the plot to a strip); the
        # hover still names each row
        name = fill(lab["row"], n=row + 1)
        data.append(_line(s, lab["each_row"] if grouped else name, line=dict(width=1), opacity=0.5,
                          legendgroup="rows" if grouped else None, showlegend=not grouped or i == 0,
                          hovertemplate=f"{name}: %{{y:.1f}}<extra></extra>"))
    data.append(_line(total, fill(lab["your_rows"] if shared else lab["all_rows"], steps=SMOOTH_STEPS),
                      line=dict(width=3, color=BONUS)))
    if shared is not None:
        data.append(_line(shared, lab["whole_batch"], line=dict(width=2, color="#762a83", dash="dash")))
    span = max(total.x[-1] - total.x[0], 1e-9) if len(total.x) > 1 else 1.0
    shapes, notes = _markers(markers or [], span, rtl)
    return _figure(data, _title(lab, "throughput_title", comparison), lab["seconds"], lab["tokens_per_s"], rtl,
                   shapes=shapes, annotations=notes, xaxis=_x(x_range))


def hardware_figure(util: Series, mbu: Series, mfu: Series, util_label: str, labels: dict | None = None,
                    rtl: bool = False, x_range: list[float] | None = None, comparison: bool = False) -> go.Figure:
    lab = _labels(labels)
    title = _title(lab, "hardware_title", comparison)
    # a marker per step shows where the estimates were taken while steps are sparse; hundreds of them
    # were the page's dearest drawing, redrawn every tick
    mode = "lines+markers" if len(mbu.x) <= SPARSE else "lines"
    # legend entries in lines a phone shows whole (the Persian MBU entry ran off the chart's edge)
    util_label, mbu_label, mfu_label = (lines_for(t, rtl, LEGEND_CHARS) for t in (util_label, lab["mbu"], lab["mfu"]))
    data = [_line(util, util_label, line=dict(color=PLAIN)),
            {**_line(mbu, mbu_label, line=dict(color=BONUS)), "mode": mode},
            {**_line(mfu, mfu_label, line=dict(color=REJECT)), "mode": mode}]
    # an estimate over 100 % is drawn above a line at the calibrated peak, not cut off (that peak was below
    # what the pass reached); finite values only, up to TOP_PERCENT: a step timed at about zero seconds
    # would read a billion per cent and flatten every line
    top = min(TOP_PERCENT, max([v for s in (util, mbu, mfu) for v in s.y if v is not None and math.isfinite(v)]
                               or [0.0]))
    if top <= 100:
        return _figure(data, title, lab["seconds"], "%", rtl, yaxis=dict(range=[0, 105]), xaxis=_x(x_range))
    # the peak's line says what it is in the legend: a note inside the plot lay over the MBU line (and
    # over the Persian title)
    xs = [x for s in (util, mbu, mfu) for x in s.x]
    peak = dict(type="scatter", mode="lines", x=[min(xs), max(xs)], y=[100, 100], hoverinfo="skip",
                name=lines_for(lab["peak_line"], rtl, LEGEND_CHARS), line=dict(dash="dot", color="#999", width=1))
    return _figure(data + [peak], title, lab["seconds"], "%", rtl, yaxis=dict(range=[0, 1.08 * top]),
                   xaxis=_x(x_range))


def _x(x_range: list[float] | None) -> dict:
    return dict(range=list(x_range)) if x_range else {}


def acceptance_histogram(counts: list[int], labels: dict | None = None, rtl: bool = False) -> go.Figure:
    """counts[n] = row-steps that kept n draft tokens; one tick per whole token (a count of 0.5 tokens
    does not exist)."""
    lab = _labels(labels)
    data = [dict(type="bar", x=list(range(len(counts))), y=list(counts), marker=dict(color=ACCEPT))]
    if any(counts):
        return _figure(data, lab["accept_title"], lab["accepted_tokens"], lab["row_steps"], rtl,
                       xaxis=dict(dtick=1, tick0=0))
    # no row-step drafted (depth 0, or a policy that drafted nothing): said on the chart, not empty axes
    note = dict(xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                text=lines_for(lab["no_drafts"], rtl, NOTE_CHARS), font=dict(size=13, color="#666"))
    return _figure(data, lab["accept_title"], lab["accepted_tokens"], lab["row_steps"], rtl,
                   xaxis=dict(dtick=1, tick0=0), yaxis=dict(range=[0, 1], showticklabels=False), annotations=[note])


FLOOR_GAP = 1.8       # a log axis whose lowest tick lies this far above its lowest point ticks that point too


def log_ticks(lo: float, hi: float) -> dict:
    """Tick values for a log axis spanning lo..hi: 1-2-5 steps, else 1-2-3-4-5-6-8, else evenly spaced
    round numbers, whichever first puts two ticks inside the data (a flat curve between 3.1 and 4.4 ms
    showed no tick at all with 1-2-5 alone)."""
    if not (lo > 0 and hi >= lo):
        return {}
    decades = [10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)]
    for mantissas in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 8)):
        vals = [float(f"{m * d:.6g}") for d in decades for m in mantissas if lo / 1.5 <= m * d <= hi * 1.5]
        if len([v for v in vals if lo <= v <= hi]) >= 2:
            break
    else:
        step = _nice((hi - lo) / 3) if hi > lo else _nice(lo / 10)
        first = math.floor(lo / step) * step
        vals = [float(f"{first + i * step:.6g}") for i in range(8) if first + i * step <= hi + step]
    inside = [v for v in vals if v >= lo]
    if inside and min(inside) > FLOOR_GAP * lo:
        # the lowest tick far above the lowest point (a flat curve at 25 ms under ticks from 50): the
        # floor gets a tick of its own, its value to two figures, so the flat part can be read
        vals = [float(f"{lo:.2g}")] + inside          # (a tick just under it would crowd it)
    return dict(tickvals=vals, ticktext=[f"{v:g}" for v in vals])


def _nice(x: float) -> float:
    """The round step (1, 2 or 5 times a power of ten) at or just below x."""
    d = 10.0 ** math.floor(math.log10(x))
    return next(m * d for m in (5, 2, 1) if m * d <= x)


def _step_lines(label: str, rtl: bool) -> str:
    """The step label's " · " parts packed into lines of STEP_CHARS, a line breaking between two parts
    where it can (a part longer than a line breaks between its words)."""
    lines = pack(label.split(" · "), STEP_CHARS, " · ")
    return "<br>".join(lines_for(line, rtl, STEP_CHARS) for line in lines)


def knee_live_figure(curve: tuple[list[int], list[float]] | None, curve_name: str, knee: float | None,
                     steps: list[PassPoint], step_label: str, labels: dict | None = None,
                     rtl: bool = False, comparison: bool = False) -> go.Figure:
    """The knee chapter's curve (pass time against tokens per pass, log-log: the flat part and the slope
    both readable, a slow outlier squashes nothing) with the current step as a big dot at its real tokens
    per pass, its padded width beside it where that differs, a faint trail of the steps before it, and
    `step_label` written above the plot (from the right in a right-to-left page)."""
    lab, data, notes = _labels(labels), [], []
    if curve is not None:
        data.append(dict(type="scatter", x=list(curve[0]), y=[round(1000 * t, 4) for t in curve[1]],
                         mode="lines+markers", name=lines_for(curve_name, rtl, LEGEND_CHARS),
                         line=dict(color=PLAIN, width=2), marker=dict(size=5)))
    if knee is not None and 0 < knee < float("inf"):
        # drawn as a trace on a hidden 0..1 axis, so it sits right on the log axis and is named in the legend
        data.append(dict(type="scatter", x=[knee, knee], y=[0, 1], yaxis="y2", mode="lines",
                         name=fill(lab["knee_line"], knee=round(knee)),
                         line=dict(color=REJECT, dash="dot", width=2), hoverinfo="name"))
    if len(steps) > 1:
        data.append(dict(type="scatter", x=[p.real for p in steps[:-1]], y=[round(1000 * p.seconds, 4) for p in steps[:-1]],
                         mode="markers", name=lab["recent_steps"], opacity=0.35, marker=dict(size=7, color=BONUS)))
    if steps:
        now = steps[-1]
        if now.padded != now.real:
            data.append(dict(type="scatter", x=[now.padded], y=[1000 * now.seconds], mode="markers",
                             name=fill(lab["padded"], n=now.padded),
                             marker=dict(size=13, symbol="circle-open", color=BONUS, line=dict(width=2))))
        data.append(dict(type="scatter", x=[now.real], y=[1000 * now.seconds], mode="markers", meta="this-step",
                         name=fill(lab["this_step_one" if now.real == 1 else "this_step"], n=now.real),
                         marker=dict(size=16, color=ACCEPT, line=dict(color="white", width=1))))
    # the step's words go between the title and the plot, never over the curve (in a right-to-left
    # page the plot's top right corner is where the curve ends, high), in lines a phone shows whole
    label = _step_lines(step_label, rtl) if steps and step_label else ""
    if label:
        notes.append(dict(text=label, xref="paper", yref="paper", x=1 if rtl else 0, y=1, yshift=4,
                          xanchor="right" if rtl else "left", yanchor="bottom", align="right" if rtl else "left",
                          showarrow=False, font=dict(size=12, color=ACCEPT)))
    ms = [y for d in data if d.get("yaxis") != "y2" for y in d["y"] if y and y > 0]
    room = STEP_LINE * (label.count("<br>") + 1) + 8 if label else 0
    # from one token a pass, to 8 at least: steps all at 1 (a replay of plain decoding) left plotly to tick fractions
    widest = max([x for d in data for x in d["x"] if x and x > 0] or [1])
    span = [math.log10(0.8), math.log10(1.25 * max(8, widest))]
    return _figure(data, _title(lab, "knee_title", comparison), lab["tokens_per_pass"], lab["ms_per_pass"], rtl,
                   below_title=room,
                   height=400 + room, annotations=notes, xaxis=dict(type="log", range=span, **POW2),
                   yaxis=dict(type="log", **(log_ticks(min(ms), max(ms)) if ms else {})),
                   yaxis2=dict(overlaying="y", range=[0, 1], visible=False))
