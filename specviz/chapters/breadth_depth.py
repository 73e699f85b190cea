"""Chapter: breadth vs depth. n rows × 1 token against 1 row × n tokens in one target pass: the same
work for the hardware while memory-bound.

Measured: about 6 s on the 2-core CPU with the offline SmolLM2-135M.
"""
from __future__ import annotations

import copy
import statistics
from typing import Iterable, Iterator

import plotly.graph_objects as go
import torch

from specviz import lessons
from specviz.chapters.base import Chapter, Result
from specviz.chapters.common import finished, settings_of, snapshot
from specviz.chapters.plotting import DRAFT, OWN, REJECTED, labels_for, styled
from specviz.engine.torchmode import inference_steps
from specviz.hardware.device import timed_once

BD_MATCH = 0.25          # breadth and depth "cost about the same" when within 25 % of each other


def breadth_depth_breakpoint(ns: list[int], breadth_s: list[float], depth_s: list[float]) -> int | None:
    """The smallest n from which on breadth and depth differ by more than 25 % at every larger n too
    (one noisy mismatch below a matching point is not a breakpoint); None if they match at the largest n."""
    match = [abs(b / d - 1) <= BD_MATCH if d > 0 else False for b, d in zip(breadth_s, depth_s)]
    if not match or match[-1]:
        return None
    i = len(match) - 1
    while i > 0 and not match[i - 1]:
        i -= 1
    return ns[i]


def _pass_seconds(model, cache, device, rows: int, tokens: int, context: int, vocab: int, repeats: int) -> float:
    """Median time of one forward of rows × tokens new tokens on top of `cache` (context slots per row).
    The cache is cropped back after every pass, so each repeat sees the same context; the first pass is
    a warm-up and not counted."""

    ids = torch.randint(0, vocab, (rows, tokens), device=device)
    times = []
    for r in range(repeats + 1):
        seconds = timed_once(lambda: model(input_ids=ids, past_key_values=cache, use_cache=True), device)
        if r:
            times.append(seconds)
        # drop the pass's new slots; a negative count means "remove this many" in every transformers 5.x
        # (a positive one meant an absolute length in older releases and is refused by newer ones)
        cache.crop(-(cache.get_seq_length() - context))
    return statistics.median(times)


@inference_steps
def run_breadth_depth(pair, context: int = 256, ns: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                      repeats: int = 3) -> Iterator[Result]:
    """At each tokens per pass n: one target pass of n rows × 1 token (breadth: every row has its own
    `context`-slot cache) against 1 row × n tokens (depth: a verify of n − 1 drafts on one cache). One
    yield per n. Extra key: `breakpoint` (first n from which they stop matching, or None)."""
    # on first use: transformers is slow to import
    from transformers import DynamicCache

    model, device = pair.target.model, pair.target.device
    ns = sorted({int(n) for n in ns if int(n) >= 1})
    vocab = model.get_input_embeddings().weight.shape[0]
    settings = settings_of(pair, context=context, ns=ns, repeats=repeats)
    yield snapshot("breadth_depth", pair, settings, 0.0, [], breakpoint=None)
    rows: list[dict] = []
    one = DynamicCache()
    model(input_ids=torch.randint(0, vocab, (1, context), device=device), past_key_values=one,
          use_cache=True, logits_to_keep=1)
    for i, n in enumerate(ns):
        depth_s = _pass_seconds(model, one, device, 1, n, context, vocab, repeats)
        wide = copy.deepcopy(one)
        wide.batch_repeat_interleave(n)            # n rows with the same context, n caches to read
        breadth_s = _pass_seconds(model, wide, device, n, 1, context, vocab, repeats)
        del wide
        rows.append({"tokens_per_pass": n, "breadth_ms": 1000 * breadth_s, "depth_ms": 1000 * depth_s,
                     "breadth_over_depth": breadth_s / depth_s if depth_s > 0 else None})
        yield snapshot("breadth_depth", pair, settings, (i + 1) / len(ns), rows, breakpoint=None)
    values, key = breadth_depth_values(rows)
    yield finished(snapshot("breadth_depth", pair, settings, 1.0, rows,
                           breakpoint=values["n"] if key == "conclusion_stops" else None), values, key, [key])


def breadth_depth_values(rows: list[dict]) -> tuple[dict, str]:
    ns = [r["tokens_per_pass"] for r in rows]
    b = [r["breadth_ms"] for r in rows]
    d = [r["depth_ms"] for r in rows]
    bp = breadth_depth_breakpoint(ns, b, d)
    at = rows[ns.index(bp)] if bp is not None else rows[-1]
    values = {"n": at["tokens_per_pass"], "breadth_ms": at["breadth_ms"], "depth_ms": at["depth_ms"]}
    return values, ("conclusion_holds" if bp is None else "conclusion_stops")


def figure_breadth_depth(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Side-by-side bars at each n: one pass of n rows × 1 token vs 1 row × n tokens; the first n where
    they stop matching is marked."""
    L = labels_for("breadth_depth", labels)
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
    return styled(fig, dark, barmode="group", xaxis_title=L["axis_tokens"], yaxis_title=L["axis_time"],
                  xaxis_type="category", margin=dict(l=56, r=20, t=56, b=80))


CHAPTER = Chapter("breadth_depth", run=lambda ctx: run_breadth_depth(ctx.pair), figure=figure_breadth_depth,
                  button_id="run-breadth-depth")
