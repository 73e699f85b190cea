"""The Lesson tab's figures: one `figure_<chapter>(result, labels, dark=False)` per experiment chapter.

`result` is any dict a `specviz.chapters.experiments` generator yielded (partial ones too: a chart fills in as the
measurement goes). `labels` maps the chart-label keys of that chapter's [chapter.*] table in
specviz/lessons/<lang>.toml (lane_plain, legend_draft, axis_*, part_*, …) to text in the current language;
a missing key falls back to English (the en.toml text, else the default written here). A few optional keys
are not in the TOML yet and have English defaults only: see `EXTRA` below.

Colours on dark and light pages: `dark` picks the template ("plotly_dark" or "plotly_white"), which sets
the font and axis-text colour for that page; paper and plot backgrounds are transparent so the page shows
through, gridlines are mid-grey (readable on both), and data colours are mid-tone hues that keep their
contrast on either background. Plotly only: no gradio, no torch.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import lessons

GRID = "rgba(136,136,136,0.35)"
DRAFT, VERIFY, PLAIN, PREFILL, OTHER = "#f39c34", "#2c7bb6", "#8c8c8c", "#9e7cc1", "#5c5c5c"
KEPT, REJECTED, OWN, TICK = "#1a9850", "#d73027", "#2c7bb6", "#e6b800"
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


def _rtl(L: dict) -> bool:
    return lessons.direction(L.get("_lang", lessons.DEFAULT_LANG)) == "rtl"


def _said(L: dict, value, *more: str) -> str:
    """A Said carried in a result (a published series' name) in the chart's language (`L["_lang"]`, which
    the page's labels carry: ui.lesson.chart_labels), then `more` labels after a comma; right-to-left as
    a whole when Persian (plotly lays a label out left-to-right: parts isolated one by one would read in
    reverse order)."""
    lang = L.get("_lang", lessons.DEFAULT_LANG)
    text = lessons.template(lang, "app.list_separator").join([lessons.say(lang, value), *more])
    return lessons.isolate_rtl(text)


def _aligned(L: dict, x_ltr: float = 0) -> dict:
    """Where a note sits: at the left edge, left-aligned, in English; at the right edge, right-aligned,
    in Persian (its lines start on the right)."""
    if _rtl(L):
        return dict(x=1 - x_ltr, xanchor="right", align="right")
    return dict(x=x_ltr, xanchor="left", align="left")


def _labels(chapter: str, labels: dict | None) -> dict:
    """The caller's labels over English: en.toml's [chapter.<chapter>] keys, then EXTRA."""
    table = lessons.load("en").get("chapter", {}).get(chapter, {})
    out = {k: v for k, v in table.items() if isinstance(v, str)}
    out.update({k: v for k, v in EXTRA.get(chapter, {}).items() if k not in out})
    out.update({k: v for k, v in (labels or {}).items() if isinstance(v, str)})
    return out


def _style(fig: go.Figure, dark: bool, title: str | None = None, height: int = 380, **layout) -> go.Figure:
    base = dict(template="plotly_dark" if dark else "plotly_white", paper_bgcolor="rgba(0,0,0,0)",
                plot_bgcolor="rgba(0,0,0,0)", height=height,
                # mid grey reads on the page's light and dark themes alike (the page, not the chart, picks)
                font=dict(size=13, color="#8a8a8a"),
                margin=dict(l=56, r=20, t=48 if title else 24, b=80),
                legend=dict(orientation="h", y=-0.22, x=0), title=title)
    fig.update_layout(**{**base, **layout})
    fig.update_xaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    return fig


def _vline(fig: go.Figure, x: float, name: str, color: str, dash: str, row=None, col=None) -> None:
    """A vertical marker as a trace (right on log axes, named in the legend), spanning the y data range."""
    ys = [y for tr in fig.data for y in (tr.y or []) if isinstance(y, (int, float)) and math.isfinite(y)]
    lo, hi = (min(ys), max(ys)) if ys else (0, 1)
    kw = {} if row is None else dict(row=row, col=col)
    fig.add_trace(go.Scatter(x=[x, x], y=[lo, hi], mode="lines", name=name, hoverinfo="name",
                             line=dict(color=color, dash=dash, width=2)), **kw)


# --- the race ----------------------------------------------------------------------------------------

def figure_race(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Two horizontal lanes (plain, speculative) on one time axis: coloured passes (prefill, draft,
    verify, plain) and a tick where tokens appear. The lanes were measured one after the other and are
    replayed together: the note says so."""
    L = _labels("race", labels)
    names = {"plain": L["lane_plain"], "spec": L["lane_spec"]}
    kinds = [("prefill", L["legend_prefill"], PREFILL), ("plain", L["legend_plain"], PLAIN),
             ("draft", L["legend_draft"], DRAFT), ("verify", L["legend_verify"], VERIFY)]
    fig = go.Figure()
    segs = result.get("segments", [])
    for kind, name, colour in kinds:
        mine = [s for s in segs if s["kind"] == kind]
        if not mine:
            continue
        fig.add_trace(go.Bar(orientation="h", y=[names.get(s["lane"], s["lane"]) for s in mine],
                             x=[max(s["end_s"] - s["start_s"], 1e-5) for s in mine],
                             base=[s["start_s"] for s in mine], name=name, marker=dict(color=colour),
                             width=0.5, customdata=[[s["start_s"], s["end_s"]] for s in mine],
                             hovertemplate="%{customdata[0]:.3f}–%{customdata[1]:.3f} s<extra>" + name + "</extra>"))
    steps: dict[tuple, list[int]] = {}
    for t in result.get("tokens", []):
        steps.setdefault((t["lane"], t["t_s"]), []).append(t["index"])
    if steps:
        keys = sorted(steps)
        fig.add_trace(go.Scatter(x=[t for _, t in keys], y=[names.get(ln, ln) for ln, _ in keys], mode="markers",
                                 name=L["legend_tokens"], marker=dict(symbol="line-ns-open", size=26, color=TICK,
                                                                      line=dict(width=2, color=TICK)),
                                 text=[_span(steps[k], L) for k in keys], hovertemplate="%{x:.3f} s: %{text}"))
    note = L["replay_note"]
    if result.get("done") and result.get("values"):
        v = result["values"]
        note += "<br>" + lessons.chart_fill(L["headline"] if v.get("speedup", 0) >= 1 else L["headline_slower"], v)
    # above the plot, growing upwards: the note is 2-3 lines (the replay note breaks for phones)
    fig.add_annotation(text=note, y=1.02, yanchor="bottom", xref="paper", yref="paper", showarrow=False,
                       font=dict(size=12), **_aligned(L))
    fig.update_yaxes(categoryorder="array", categoryarray=[names["plain"], names["spec"]])
    return _style(fig, dark, height=320, barmode="overlay", xaxis_title=L["axis_seconds"],
                  margin=dict(l=150, r=20, t=84, b=100), legend=dict(orientation="h", y=-0.45, x=0))


def _span(idx: list[int], L: dict) -> str:
    if len(idx) == 1:
        return lessons.chart_fill(L["hover_token"], {"n": idx[0]})
    return lessons.chart_fill(L["hover_tokens"], {"a": min(idx), "b": max(idx)})


# --- the knee ----------------------------------------------------------------------------------------

def figure_knee(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Measured time of one target pass against tokens per pass (log axes), the roofline from calibrated
    peaks (dashed, when there are peaks), and the measured and roofline knees when known."""
    L = _labels("knee", labels)
    rows = result.get("table", [])
    ns = [r["tokens_per_pass"] for r in rows]
    fig = go.Figure()
    if any(r.get("roofline_ms") is not None for r in rows):
        fig.add_trace(go.Scatter(x=ns, y=[r["roofline_ms"] for r in rows], mode="lines", name=L["roofline"],
                                 line=dict(color=PLAIN, dash="dash", width=2)))
    fig.add_trace(go.Scatter(x=ns, y=[r["measured_ms"] for r in rows], mode="lines+markers", name=L["measured"],
                             line=dict(color=VERIFY, width=3)))
    if result.get("measured_knee"):
        _vline(fig, result["measured_knee"], lessons.chart_fill(L["knee_measured"], {"knee": result["measured_knee"]}),
               REJECTED, "dot")
    if result.get("predicted_knee") and ns and result["predicted_knee"] <= 4 * max(ns):
        _vline(fig, result["predicted_knee"], lessons.chart_fill(L["knee_predicted"], {"knee": result["predicted_knee"]}),
               PLAIN, "dash")
    return _style(fig, dark, xaxis_type="log", yaxis_type="log", xaxis_title=L["axis_tokens"],
                  yaxis_title=L["axis_time"])


# --- breadth vs depth ----------------------------------------------------------------------------------

def figure_breadth_depth(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Side-by-side bars at each n: one pass of n rows × 1 token vs 1 row × n tokens; the first n where
    they stop matching is marked."""
    L = _labels("breadth_depth", labels)
    rows = result.get("table", [])
    x = [str(r["tokens_per_pass"]) for r in rows]
    fig = go.Figure([
        go.Bar(x=x, y=[r["breadth_ms"] for r in rows], name=L["legend_breadth"], marker_color=OWN),
        go.Bar(x=x, y=[r["depth_ms"] for r in rows], name=L["legend_depth"], marker_color=DRAFT,
               customdata=[r.get("breadth_over_depth") for r in rows],
               hovertemplate="%{y:.1f} ms (" + L["hover_ratio"] + " %{customdata:.2f})<extra></extra>")])
    bp = result.get("breakpoint")
    if bp is not None and str(bp) in x:
        # by position: a numeric-looking category name would be read as an index on a category axis
        fig.add_annotation(x=x.index(str(bp)), y=1, yref="paper", text=lessons.chart_fill(L["breakpoint"], {"n": bp}),
                           showarrow=True, arrowhead=2, arrowcolor=REJECTED, ax=0, ay=-20, yanchor="bottom",
                           font=dict(color=REJECTED))
    return _style(fig, dark, barmode="group", xaxis_title=L["axis_tokens"], yaxis_title=L["axis_time"],
                  xaxis_type="category", margin=dict(l=56, r=20, t=56, b=80))


# --- the ledger ----------------------------------------------------------------------------------------

def figure_ledger(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Top left: the FLOPs ledger and the wall time as two stacked 100 % bars. Top right: share of drafts
    accepted by position. Bottom: theory (Leviathan et al.) vs measured tokens per pass and speed-up."""
    L = _labels("ledger", labels)
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], vertical_spacing=0.22,
                        horizontal_spacing=0.12, row_heights=[0.58, 0.42])
    flops = [("draft", L["part_draft"], DRAFT), ("kept", L["part_kept"], KEPT),
             ("rejected", L["part_rejected"], REJECTED), ("target", L["part_target"], OWN)]
    times = [("prefill", L["time_prefill"], PREFILL), ("draft", L["time_draft"], DRAFT),
             ("verify", L["time_verify"], VERIFY), ("overhead", L["time_overhead"], OTHER)]
    _stack(fig, result.get("parts", []), flops, L["flops"])
    _stack(fig, result.get("times", []), times, L["wall_time"])
    pos = result.get("positions", [])
    fig.add_trace(go.Bar(x=[p["position"] for p in pos], y=[p["survival"] for p in pos], name=L["axis_survival"],
                         marker_color=KEPT, showlegend=False, customdata=[[p["accepted"], p["drafted"]] for p in pos],
                         hovertemplate="%{y:.0%} (%{customdata[0]} / %{customdata[1]})<extra></extra>"), row=1, col=2)
    theory = {r["quantity"]: r for r in result.get("theory", [])}
    names = [("tokens_per_pass", L["row_tokens_per_pass"]), ("speedup", L["row_speedup"])]
    if theory:
        for col, name, colour in (("theory", L["theory"], PLAIN), ("measured", L["measured"], VERIFY)):
            ys = [theory[q][col] if q in theory else None for q, _ in names]
            fig.add_trace(go.Bar(x=[n for _, n in names], y=ys, name=name, marker_color=colour, offsetgroup=col,
                                 text=[f"{y:.2f}" if y is not None else "" for y in ys], textposition="outside"),
                          row=2, col=1)
    fig.update_xaxes(title_text=L["axis_share"], tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text=L["axis_position"], dtick=1, row=1, col=2)
    fig.update_yaxes(title_text=L["axis_survival"], tickformat=".0%", range=[0, 1.05], row=1, col=2)
    return _style(fig, dark, height=560, barmode="group", legend=dict(orientation="h", y=-0.12, x=0))


def _stack(fig: go.Figure, parts: list[dict], order: list[tuple], row_name: str) -> None:
    """One horizontal 100 % bar made of `parts` in `order`, stacked by hand (the figure's bar mode is
    "group" for the theory bars, so stacked parts share one offsetgroup and carry their own base)."""
    by = {p["part"]: p["share"] for p in parts}
    base = 0.0
    for key, name, colour in order:
        share = by.get(key, 0.0)
        if key not in by:
            continue
        fig.add_trace(go.Bar(orientation="h", y=[row_name], x=[share], base=[base], name=name, marker_color=colour,
                             offsetgroup="stack", legendgroup=key + row_name, text=[f"{share:.0%}"],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=name + ": %{x:.1%}<extra></extra>"), row=1, col=1)
        base += share


# --- the sweep -----------------------------------------------------------------------------------------

def figure_sweep(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Left: heatmap of measured speed-up over k = 0 by (batch B, depth k), cells appearing as they are
    measured, the best k per B starred. Right: published speed-up against batch size on GPUs, each series
    named with its source and labelled "published measurement"; the vLLM blog's load points as a note."""
    L = _labels("sweep", labels)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12)
    _heatmap(fig, result, L, colorbar_x=0.5)
    _published(fig, result.get("published", []), L)
    fig.update_xaxes(title_text=L["axis_batch"], type="log", row=1, col=2)
    # the published panel's axis on the right, so the heatmap's colour bar sits between the panels
    fig.update_yaxes(title_text=L["cell"], side="right", row=1, col=2)
    return _style(fig, dark, height=560, margin=dict(l=56, r=64, t=32, b=230),
                  legend=dict(orientation="h", y=-0.24, x=0))


def figure_recorded_sweep(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """The heatmap alone, for a sweep recorded elsewhere (vLLM's, `specviz.chapters.vllm_panels.sweep_result`)."""
    L = _labels("sweep", labels)
    fig = make_subplots(rows=1, cols=1)
    _heatmap(fig, result, L, colorbar_x=1.02)
    return _style(fig, dark, height=360, margin=dict(l=56, r=64, t=32, b=48))


def _heatmap(fig: go.Figure, result: dict, L: dict, colorbar_x: float) -> None:
    batches, depths = result.get("batches", []), result.get("depths", [])
    cell = {(r["batch_size"], r["depth"]): r.get("speedup") for r in result.get("table", [])}
    best = {(b["batch_size"], b["depth"]) for b in result.get("best_depth", [])}
    z = [[cell.get((b, k)) for b in batches] for k in depths]
    # the best k per batch size is starred inside its cell (a marker on top would hide the number)
    text = [["" if cell.get((b, k)) is None else ("★ " if (b, k) in best else "") + f"{cell[(b, k)]:.2f}×"
             for b in batches] for k in depths]
    fig.add_trace(go.Heatmap(z=z, x=[str(b) for b in batches], y=[str(k) for k in depths], text=text,
                             texttemplate="%{text}", colorscale="RdYlGn", zmid=1.0, showscale=True,
                             colorbar=dict(title=dict(text="×", side="top"), x=colorbar_x, len=0.9, thickness=12),
                             hovertemplate="B=%{x}, k=%{y}: %{text}<extra></extra>"), row=1, col=1)
    if best:
        fig.add_annotation(text="★ " + L["best"], x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom",
                           xanchor="left", showarrow=False, font=dict(size=12))
    fig.update_xaxes(title_text=L["axis_batch"], type="category", row=1, col=1)
    fig.update_yaxes(title_text=L["axis_depth"], type="category", row=1, col=1)


def _published(fig: go.Figure, points: list[dict], L: dict) -> None:
    series: dict[str, list[dict]] = {}
    for p in points:
        if p.get("batch") is not None:
            series.setdefault(p["series"], []).append(p)
    symbols = ["circle", "diamond", "square", "triangle-up"]
    for i, (name, pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda p: p["batch"])
        src = lessons.chart_fill(L["source"], {"source": pts[0]["source"]})
        fig.add_trace(go.Scatter(x=[p["batch"] for p in pts], y=[p["speedup"] for p in pts], mode="lines+markers",
                                 name=_said(L, name, L["published"]), marker=dict(symbol=symbols[i % 4], size=9),
                                 line=dict(width=2, color=POLICY_COLOURS[(i + 1) % len(POLICY_COLOURS)]),
                                 hovertemplate="B=%{x}: %{y:.2f}×<br>" + src + "<extra></extra>"), row=1, col=2)
    xs = [p["batch"] for p in points if p.get("batch") is not None]
    if xs:
        fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[1, 1], mode="lines", showlegend=False,
                                 line=dict(color=PLAIN, width=1, dash="dot"), hoverinfo="skip"), row=1, col=2)
    by_load: dict[str, list[str]] = {}
    lang = L.get("_lang", lessons.DEFAULT_LANG)
    for p in points:
        if p.get("batch") is None:      # measured against load (vLLM blog), not batch: a note, not a curve
            name = lessons.say(lang, p.get("name") or p["series"])
            x = f"{p['speedup']:.2f}×"
            by_load.setdefault(name, []).append(f"{lessons.isolate_ltr(x) if _rtl(L) else x} "
                                                f"({lessons.say(lang, p['load'])})")
    if by_load:
        # one plotly line per series: each Persian line is right-to-left on its own (an isolate does not
        # span plotly's <br>), and its arrow points the way it reads
        arrow = " ← " if _rtl(L) else " → "
        lines = [f"{name}: {arrow.join(v)}" for name, v in by_load.items()]
        head = lessons.chart_fill(L["vllm_note"], {"published": L["published"], "points": ""})
        note = "<br>".join(lessons.isolate_rtl(line) for line in [head.rstrip(), *lines])
        fig.add_annotation(text=note, y=-0.45, xref="paper", yref="paper", showarrow=False, yanchor="top",
                           font=dict(size=11), **_aligned(L))


# --- policies ------------------------------------------------------------------------------------------

def figure_policies(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Grouped bars: each policy's tokens/s relative to plain decoding at each batch size (1× = plain),
    the winner at each batch size outlined."""
    L = _labels("policies", labels)
    rows = result.get("table", [])
    batches = sorted({r["batch_size"] for r in rows})
    winners = {(w["batch_size"], w["policy"]) for w in result.get("winners", [])}
    fig = go.Figure()
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        mine = {r["batch_size"]: r for r in rows if r["policy"] == policy}
        name = lessons.isolate_rtl(lessons.policy_label(L.get("_lang", lessons.DEFAULT_LANG), policy))
        ys = [mine[b]["vs_plain"] if b in mine else None for b in batches]
        fig.add_trace(go.Bar(x=[str(b) for b in batches], y=ys, name=name, marker=dict(color=POLICY_COLOURS[i % len(POLICY_COLOURS)],
                                                    line=dict(width=[3 if (b, policy) in winners else 0 for b in batches],
                                                              color=TICK)),
                             customdata=[mine[b]["tokens_per_s"] if b in mine else None for b in batches],
                             hovertemplate=name + ": %{y:.2f}× (%{customdata:.1f} " + L["column_tokens_per_s"]
                             + ")<extra></extra>"))
    if batches:
        fig.add_hline(y=1.0, line=dict(color=PLAIN, dash="dot", width=1))
    return _style(fig, dark, barmode="group", xaxis_title=L["column_batch"], yaxis_title=L["column_vs_plain"],
                  legend_title_text=L["column_policy"], xaxis_type="category")


FIGURES = {"race": figure_race, "knee": figure_knee, "breadth_depth": figure_breadth_depth,
           "ledger": figure_ledger, "sweep": figure_sweep, "policies": figure_policies}
