"""Shared look of the lesson's figures (plotly only: no gradio, no torch).

`labels` maps the chart-label keys of a chapter's [chapter.*] table in specviz/lessons/<lang>.toml
(lane_plain, legend_draft, axis_*, part_*, …) to text in the current language; a missing key falls back
to English (the en.toml text, else the default written here in `EXTRA`).

Colours on dark and light pages: `dark` picks the template ("plotly_dark" or "plotly_white"), which sets
the font and axis-text colour; paper and plot backgrounds are transparent so the page shows through,
gridlines are mid-grey (readable on both), and data colours are mid-tone hues that keep their contrast
on either background.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from specviz import lessons

GRID = "rgba(136,136,136,0.35)"
# the target's verify passes teal, its own tokens blue (as the Playground's tokens): one blue in the ledger's
# legend meant both
DRAFT, VERIFY, PLAIN, PREFILL, OTHER = "#f39c34", "#35978f", "#8c8c8c", "#9e7cc1", "#5c5c5c"
KEPT, REJECTED, OWN, TICK = "#1a9850", "#d73027", "#2c7bb6", "#e6b800"
PREDICTION = "#c51b7d"     # a prediction priced on this machine's curve: no part of a bar shares its hue
POLICY_COLOURS = ["#8c8c8c", "#f39c34", "#9e7cc1", "#1a9850", "#2c7bb6", "#d73027"]


# Optional label keys with English defaults only (not in the lesson TOML files).
EXTRA = {
    "race": {"axis_seconds": "time (s)", "legend_prefill": "prefill (prompt)", "legend_tokens": "tokens appear",
             "headline": "spent {flops_ratio:.1f}× the FLOPs, finished {speedup:.2f}× sooner",
             "headline_slower": "spent {flops_ratio:.1f}× the FLOPs, finished {slowdown:.2f}× later"},
    "knee": {"knee_measured": "measured knee ≈ {knee}", "knee_predicted": "roofline knee ≈ {knee}"},
    "breadth_depth": {"axis_tokens": "tokens per forward pass", "axis_time": "time per pass (ms)",
                      "breakpoint": "stop matching at {n}"},
    "ledger": {"axis_share": "share of the run", "flops": "FLOPs", "time_prefill": "prefill",
               "time_draft": "draft passes", "time_verify": "verify passes",
               "time_overhead": "other (sampling, bookkeeping)"},
    "sweep": {"published": "published measurement", "best": "best k",
              "vllm_note": "vLLM blog, 4× H100, Llama-3-70B ({published}): {points}"},
    "policies": {"winner": "winner"},
}


def is_rtl(L: dict) -> bool:
    return lessons.direction(L.get("_lang", lessons.DEFAULT_LANG)) == "rtl"


def said_label(L: dict, value, *more: str) -> str:
    """A Said carried in a result (a published series' name) in the chart's language (`L["_lang"]`, which
    the page's labels carry: ui.lesson.chart_labels), then `more` labels after a comma; right-to-left as
    a whole when Persian (plotly lays a label out left-to-right: parts isolated one by one would read in
    reverse order)."""
    lang = L.get("_lang", lessons.DEFAULT_LANG)
    text = lessons.template(lang, "app.list_separator").join([lessons.say(lang, value), *more])
    return lessons.isolate_rtl(text)


def aligned(L: dict, x_ltr: float = 0) -> dict:
    """Where a note sits: at the left edge, left-aligned, in English; at the right edge, right-aligned,
    in Persian (its lines start on the right)."""
    if is_rtl(L):
        return dict(x=1 - x_ltr, xanchor="right", align="right")
    return dict(x=x_ltr, xanchor="left", align="left")


def labels_for(chapter: str, labels: dict | None) -> dict:
    """The caller's labels over English: en.toml's [chapter.<chapter>] keys, then EXTRA."""
    table = lessons.load("en").get("chapter", {}).get(chapter, {})
    out = {k: v for k, v in table.items() if isinstance(v, str)}
    out.update({k: v for k, v in EXTRA.get(chapter, {}).items() if k not in out})
    out.update({k: v for k, v in (labels or {}).items() if isinstance(v, str)})
    return out


def styled(fig: go.Figure, dark: bool, title: str | None = None, height: int = 380, **layout) -> go.Figure:
    base = dict(template="plotly_dark" if dark else "plotly_white", paper_bgcolor="rgba(0,0,0,0)",
                plot_bgcolor="rgba(0,0,0,0)", height=height,
                # mid grey reads on the page's light and dark themes alike (the page, not the chart, picks)
                font=dict(size=13, color="#8a8a8a"),
                margin=dict(l=56, r=20, t=48 if title else 24, b=80),
                legend=dict(orientation="h", y=-0.22, x=0), title=title,
                # a phone's swipe scrolls the chart's box (or the page) instead of zooming: the toolbar zooms
                dragmode=False)
    fig.update_layout(**{**base, **layout})
    fig.update_xaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    return fig


def vline(fig: go.Figure, x: float, name: str, color: str, dash: str, row=None, col=None) -> None:
    """A vertical marker as a trace (right on log axes, named in the legend), spanning the y data range."""
    ys = [y for tr in fig.data for y in (tr.y or []) if isinstance(y, (int, float)) and math.isfinite(y)]
    lo, hi = (min(ys), max(ys)) if ys else (0, 1)
    kw = {} if row is None else dict(row=row, col=col)
    fig.add_trace(go.Scatter(x=[x, x], y=[lo, hi], mode="lines", name=name, hoverinfo="name",
                             line=dict(color=color, dash=dash, width=2)), **kw)
