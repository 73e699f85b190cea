"""Plotly figures from plain data (lists and small dataclasses). No gradio, no torch."""
from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go

from specviz import lessons
from specviz.hardware.costmodel import best_depths

ACCEPT, REJECT, BONUS, PLAIN = "#1a9850", "#d73027", "#2c7bb6", "#7f7f7f"
# Log axes: tokens per pass and batch sizes tick at powers of two (1, 2, 4, … 1024), times at 1-2-5; left
# alone, plotly labels every digit of a short log range and the labels collide ("8 9 1 2 3 4 …").
POW2 = dict(dtick=math.log10(2), tick0=0)
_125 = [m * 10.0 ** e for e in range(-3, 8) for m in (1, 2, 5)]
ONE_TWO_FIVE = dict(tickvals=_125, ticktext=[f"{v:g}" for v in _125])
# The legend sits at the figure's foot (container coordinates): placed in plot coordinates, a legend of
# three long lines grew upwards over the x axis's title once the page took 100 px of the top margin.
BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0)
# plotly's toolbar keeps save, zoom and reset: its full row of eight ran under the chart's name (its badge) on a
# desktop's half-width chart, and the badge hid the camera
MODEBAR = dict(remove=["zoomIn2d", "zoomOut2d", "autoScale2d", "pan2d", "select2d", "lasso2d"])
# dragmode off: on a phone a swipe over a chart zoomed it and the page did not scroll; the toolbar's zoom
# button still zooms on a desktop
LAYOUT = dict(margin=dict(l=48, r=16, t=40, b=90), height=330, template="plotly_white",
              paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", modebar=MODEBAR, dragmode=False,
              legend=BELOW, font=dict(size=14, color="#8a8a8a"))  # readable on light and dark pages


def fill(template: str, **values) -> str:
    """A label with its numbers filled in (isolated left-to-right inside a Persian label)."""
    return lessons.chart_fill(template, values)


TITLE_CHARS = 42    # a chart title's line: what a phone's chart (about 340 px) shows whole, at 15 px
LEGEND_CHARS = 36   # a legend entry's line: what a phone's chart shows beside the entry's symbol (14 px)
MIN_HEAD = 8        # a line that ends at a preferred break (a colon, a parenthesis) is at least this long


def wrap_title(text: str, width: int = TITLE_CHARS) -> list[str]:
    """A title's lines, broken between words: plotly never wraps one, and cut a long title at the
    chart's edge (on a phone, a whole title vanished). As few lines as `width` allows, as even as they
    can be (a 45-character title is two lines of 22, not 42 and one word). A line breaks after the first
    colon, else before the first parenthesis, where what comes before fits, for one line more at most
    ("recorded: / NVIDIA H200, eager path, 2026-12-04" keeps where and when whole; a Persian line that
    ended in "(" showed the bracket turned the wrong way)."""
    glued = _glued(text)
    words = glued.split(" ")
    lines = pack(words, width)
    for head, rest in _preferred_breaks(glued):
        if len(lines) > 1 and MIN_HEAD <= text_width(head) <= width:
            after = wrap_title(rest.replace(GLUE, " "), width)
            if len(after) <= len(lines):          # the head's line and the rest's: one line more at most
                return [head.replace(GLUE, " "), *after]
    while width > 1 and len(pack(words, width - 1)) == len(lines):
        width -= 1
        lines = pack(words, width)
    return [line.replace(GLUE, " ") for line in lines if line]


def _preferred_breaks(glued: str) -> list[tuple[str, str]]:
    """(head, rest) at the first ": " (the colon stays with the head) and at the first " (" (the
    bracket goes with the rest)."""
    out = []
    colon, paren = glued.find(": "), glued.find(" (")
    if colon > 0:
        out.append((glued[:colon + 1], glued[colon + 2:]))
    if paren > 0:
        out.append((glued[:paren], glued[paren + 1:]))
    return out


def text_width(text: str) -> int:
    """Characters that take room: not Persian's zero-width non-joiner, nor the directional marks."""
    return len(text) - sum(text.count(c) for c in INVISIBLE)


INVISIBLE = "\u200c\u200d\u2066\u2067\u2068\u2069"


def pack(words: list[str], width: int, sep: str = " ") -> list[str]:
    """`words` joined by `sep` into lines of at most `width` (a word longer than that alone on its line)."""
    lines: list[str] = []
    for word in words:
        if lines and text_width(lines[-1]) + len(sep) + text_width(word) <= width:
            lines[-1] += sep + word
        else:
            lines.append(word)
    return lines



GLUE = "\x00"


def _glued(text: str) -> str:
    """`text` with the spaces no line may break at glued: those inside a directional isolate (a Persian
    title's "k = 3") and those around "=" in any language."""
    out, depth = [], 0
    for ch in text:
        depth += ch in "\u2066\u2067\u2068"
        depth -= ch == "\u2069" and depth > 0
        out.append(GLUE if ch == " " and depth else ch)
    return "".join(out).replace(" = ", GLUE + "=" + GLUE)


def lines_for(text: str, rtl: bool, width: int = TITLE_CHARS) -> str:
    """`text` in plotly's <br> lines of at most `width` characters; a right-to-left page's lines each
    isolated right-to-left (plotly lays every line out by itself, left-to-right), its text's own
    isolate around the whole taken off first (inside one, no line may break)."""
    lines = wrap_title(_unwrapped(text) if rtl else text, width)
    if not (rtl and lessons.ARABIC_SCRIPT.search(text)):
        return "<br>".join(lines)
    # every line of a Persian text, also one that holds no Persian word ("SpecDecode-Bench)")
    return "<br>".join(lessons.RLI + line + lessons.PDI for line in lines)


def _unwrapped(text: str) -> str:
    """`text` without a right-to-left isolate that spans the whole of it."""
    if not (text.startswith(lessons.RLI) and text.endswith(lessons.PDI)):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += ch in "\u2066\u2067\u2068"
        depth -= ch == "\u2069"
        if depth == 0:
            return text[1:-1] if i == len(text) - 1 else text
    return text


def blank_figure() -> go.Figure:
    """An empty chart of the live charts' size, with no words (so no language): the Playground's charts
    start with it, so the page loads its plotting library while it opens, not with the first Run's first
    chart, on the same CPU as that Run (on 2 cores that Run's verdict came out about half the next ones')."""
    fig = go.Figure(layout=LAYOUT)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _vline(fig, x: float, label: str, color: str, dash: str) -> None:
    """A vertical marker drawn as a trace, so it sits right on log axes and is named in the legend
    (plotly's add_vline annotations take log10 coordinates on log axes)."""
    fig.add_trace(go.Scatter(x=[x, x], y=[0, 1], yaxis="y2", mode="lines", name=label,
                             line=dict(color=color, dash=dash, width=2), hoverinfo="name"))
    fig.update_layout(yaxis2=dict(overlaying="y", range=[0, 1], visible=False))


def knee_figure(tokens: list[int], seconds: list[float], knee: float, predicted: float) -> go.Figure:
    fig = go.Figure(go.Scatter(x=tokens, y=[1000 * s for s in seconds], mode="lines+markers",
                               name="measured latency", line=dict(color=BONUS)))
    _vline(fig, knee, f"measured knee ≈ {knee:.0f}", BONUS, "dashdot")   # the measured curve's colour
    _vline(fig, predicted, f"predicted knee ≈ {predicted:.0f}", PLAIN, "dash")
    fig.update_layout(title="Forward latency vs tokens per pass", xaxis_type="log",
                      xaxis_title="tokens per pass", yaxis_title="ms", xaxis=POW2, **LAYOUT)
    return fig


def sweep_figure(rows: list[dict], batches: list[int], depths: list[int]) -> go.Figure:
    """Heatmap of throughput relative to plain decoding (depth 0) at each batch size."""
    base = {r["batch_size"]: r["tokens_per_s"] for r in rows if r["depth"] == 0}
    z = [[next((r["tokens_per_s"] / base[b] if base.get(b) else r["tokens_per_s"])
               for r in rows if r["batch_size"] == b and r["depth"] == k) for b in batches] for k in depths]
    fig = go.Figure(go.Heatmap(z=z, x=[str(b) for b in batches], y=[str(k) for k in depths],
                               colorscale="RdYlGn", zmid=1.0, colorbar=dict(title="× plain")))
    fig.update_layout(title="Speculation speed-up over plain decoding", xaxis_title="batch size",
                      yaxis_title="depth k", **LAYOUT)
    return fig


# The what-if figures' words, in English; callers pass the same keys in another language (`labels=`).
WHATIF_LABELS = dict(roofline="roofline estimate", calibrated="calibrated estimate", measured="measured",
                     predicted_knee="predicted knee ≈ {knee:.0f}", measured_knee="measured knee ≈ {knee:.0f}",
                     tokens_per_pass="tokens per pass", ms_per_pass="ms per forward pass", plain="plain (k=0)",
                     depth="k={k}", best_depth="best depth", batch_size="batch size",
                     tokens_per_s="tokens/s (all rows)", estimate_line="k={k}, {model} estimate",
                     break_even="break-even (1×)", speedup_axis="speed-up over plain decoding (×)")


def _whatif_labels(labels: dict | None) -> dict:
    """English defaults overlaid with the caller's translations (a missing key stays English)."""
    return {**WHATIF_LABELS, **(labels or {})}


def _hover(lab: dict, x_key: str, y_key: str, y_format: str) -> str:
    """A point's hover in the axes' own words and rounded ("batch size: 128", then "speed-up …: 1.21" on a
    second line; plotly wrote "(128, 1.209865)"), the trace's whole name beside it (plotly cuts at 15)."""
    return f"{lab[x_key]}: %{{x}}<br>{lab[y_key]}: %{{y:{y_format}}}<extra>%{{fullData.name}}</extra>"


DEPTH_COLOURS = ["#7f7f7f", "#fdae61", "#f46d43", "#d73027", "#a50026", "#762a83", "#1b7837", "#2c7bb6"]


def crossover_figure(rows: list[dict], title: str, labels: dict | None = None) -> go.Figure:
    """Tokens/s against batch size, one line per depth (depth 0 = plain decoding), with the best depth
    at each batch size marked. `rows`: dicts with batch_size, depth, tokens_per_s."""
    lab = _whatif_labels(labels)
    fig = go.Figure()
    depths = sorted({r["depth"] for r in rows})
    for i, k in enumerate(depths):
        pts = sorted((r["batch_size"], r["tokens_per_s"]) for r in rows if r["depth"] == k)
        fig.add_trace(go.Scatter(x=[b for b, _ in pts], y=[t for _, t in pts], mode="lines+markers",
                                 name=lab["plain"] if k == 0 else fill(lab["depth"], k=k),
                                 hovertemplate=_hover(lab, "batch_size", "tokens_per_s", ",.0f"),
                                 line=dict(color=DEPTH_COLOURS[i % len(DEPTH_COLOURS)], width=3 if k == 0 else 2)))
    by = {(r["batch_size"], r["depth"]): r["tokens_per_s"] for r in rows}
    pts = sorted(best_depths(rows).items())
    fig.add_trace(go.Scatter(x=[b for b, _ in pts], y=[by[(b, k)] for b, k in pts], mode="markers+text",
                             text=[f"k={k}" for _, k in pts], textposition="top center",
                             textfont=dict(size=11), name=lab["best_depth"], cliponaxis=False,   # the top one's
                             marker=dict(symbol="star", size=11, color="#111")))              # label stays whole
    fig.update_layout(title=title, xaxis_type="log", xaxis_title=lab["batch_size"], yaxis_type="log",
                      yaxis_title=lab["tokens_per_s"], xaxis=POW2, yaxis=ONE_TWO_FIVE, **LAYOUT)
    return fig


def latency_figure(tokens: list[int], estimate_ms: list[float], predicted: float | None,
                   measured: tuple[list[int], list[float]] | None = None, measured_knee: float | None = None,
                   title: str = "Forward latency vs tokens per pass",
                   calibrated_ms: list[float] | None = None, labels: dict | None = None) -> go.Figure:
    """The roofline estimate (dashed), the calibrated estimate when given (dotted), and, when there is
    one, a measured curve (solid) on log axes."""
    lab = _whatif_labels(labels)
    fig = go.Figure()
    hover = _hover(lab, "tokens_per_pass", "ms_per_pass", ".2f")
    fig.add_trace(go.Scatter(x=tokens, y=estimate_ms, mode="lines", name=lab["roofline"], hovertemplate=hover,
                             line=dict(color=PLAIN, dash="dash", width=2)))
    if calibrated_ms is not None:
        fig.add_trace(go.Scatter(x=tokens, y=calibrated_ms, mode="lines", name=lab["calibrated"],
                                 hovertemplate=hover, line=dict(color=REJECT, dash="dot", width=3)))
    if measured is not None:
        fig.add_trace(go.Scatter(x=measured[0], y=[1000 * s for s in measured[1]], mode="lines+markers",
                                 name=lab["measured"], hovertemplate=hover, line=dict(color=BONUS, width=3)))
    if predicted is not None:
        _vline(fig, predicted, fill(lab["predicted_knee"], knee=predicted), PLAIN, "dash")
    if measured_knee is not None:
        # the measured curve's colour: in the calibrated estimate's red dots it read as that estimate's knee
        _vline(fig, measured_knee, fill(lab["measured_knee"], knee=measured_knee), BONUS, "dashdot")
    fig.update_layout(title=title, xaxis_type="log", yaxis_type="log", xaxis_title=lab["tokens_per_pass"],
                      yaxis_title=lab["ms_per_pass"], xaxis=POW2, yaxis=ONE_TWO_FIVE, **LAYOUT)
    return fig


@dataclass
class PointSet:
    """Measured points to draw over an estimate: speed-up at each batch size, with a legend label that
    names their source (published measurements are never ours)."""

    label: str
    batch_sizes: list[int]
    speedup: list[float]


# Dark2, one per model (by name: a model keeps its colour whichever is picked), told apart on a projector
MODEL_COLOURS = {"calibrated": "#d95f02", "calibrated-sglang": "#7570b3", "ideal": "#1b9e77", "profile": "#e7298a"}
ESTIMATE_DASH = {"calibrated": "solid", "calibrated-sglang": "longdash", "ideal": "dash", "profile": "solid"}


def speedup_figure(curves: dict[str, list[dict]], depths: list[int], points: list[PointSet],
                   title: str, labels: dict | None = None) -> go.Figure:
    """Speed-up over plain decoding against batch size: one line per (model, depth) from what-if rows
    (`curves`: model name → rows with batch_size, depth, speedup), measured points on top, and the
    break-even line at 1×. `labels` may name the models too (`model_calibrated`, `model_ideal`)."""
    lab = _whatif_labels(labels)
    fig = go.Figure()
    hover = _hover(lab, "batch_size", "speedup_axis", ".2f")      # the axis says (×)
    by_model = len(depths) == 1 and len(curves) > 1      # one depth, several models: one hue each, not one orange
    for model, rows in curves.items():
        for i, k in enumerate(depths):
            pts = sorted((r["batch_size"], r["speedup"]) for r in rows if r["depth"] == k)
            colour = MODEL_COLOURS.get(model, PLAIN) if by_model else DEPTH_COLOURS[(i + 1) % len(DEPTH_COLOURS)]
            fig.add_trace(go.Scatter(x=[b for b, _ in pts], y=[s for _, s in pts], mode="lines", hovertemplate=hover,
                                     name=fill(lab["estimate_line"], k=k, model=lab.get(f"model_{model}", model)),
                                     line=dict(color=colour,
                                               dash=ESTIMATE_DASH.get(model, "dot"),
                                               width=2 if model == "ideal" else 3)))
    symbols = ["circle", "diamond", "square", "triangle-up"]
    for i, p in enumerate(points):
        fig.add_trace(go.Scatter(x=p.batch_sizes, y=p.speedup, mode="markers", name=p.label, hovertemplate=hover,
                                 marker=dict(symbol=symbols[i % len(symbols)], size=10, color="#111",
                                             line=dict(color="white", width=1))))
    xs = [r["batch_size"] for rows in curves.values() for r in rows] + [b for p in points for b in p.batch_sizes]
    if xs:
        fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[1, 1], mode="lines", name=lab["break_even"],
                                 line=dict(color=PLAIN, width=1), hoverinfo="skip"))
    layout = {**LAYOUT, "height": 440}   # room for long sources
    fig.update_layout(title=title, xaxis_type="log", xaxis_title=lab["batch_size"],
                      yaxis_title=lab["speedup_axis"], xaxis=POW2, **layout)
    return fig
