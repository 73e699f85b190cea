"""Chapter: breadth vs depth. n rows × 1 token against 1 row × n tokens in one target pass: the same
work for the hardware while memory-bound. With the acceptance dial (a synthetic draft), also what each
depth pass bought: the tokens one row actually moved per pass, measured, against breadth's n.

Measured: about 8–9 s on the 2-core CPU with the offline SmolLM2-135M (the real pair; the dial adds its
generation runs and their reference).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from specviz import lessons
from specviz.chapters.base import Chapter, Result
from specviz.chapters.common import finished, settings_of, snapshot
from specviz.chapters.dial import References, acceptance_of, dial_keys, dial_title, dialled
from specviz.chapters.passes import Contexts
from specviz.chapters.plotting import DRAFT, OWN, REJECTED, labels_for, styled
from specviz.engine.request import Knobs
from specviz.engine.torchmode import inference_steps
from specviz.hardware.paired import FIRST_PAIRS, MOST_PAIRS, Ratio, paired_ratio

BD_MATCH = 0.25          # breadth and depth "cost about the same" when within 25 % of each other
BD_LINES = (1 - BD_MATCH, 1 + BD_MATCH)     # …so their ratio is judged at these two lines
# Under the dial, the depth arm's answer: long enough for a few passes of 16 tokens that its end does not
# cut, and short, since each n in DIAL_NS decodes it once more (after one reference).
DIAL_MAX_NEW = 32
DIAL_NS = (1, 2, 4, 8, 16)   # n − 1 drafts per pass: 16 is the deepest the engine drafts
# rows decoded together for the depth arm's tokens per pass: each row draws its own coins, so eight rows
# average eight times the coins of one (what a row gains per pass does not depend on who shares the pass)
DIAL_ROWS = 8


def breadth_depth_breakpoint(ns: list[int], differ: list[bool]) -> int | None:
    """The smallest n from which on breadth and depth differ (by more than 25 %, their interval clear of
    the band) at every larger n too (one noisy mismatch below a matching point is not a breakpoint);
    None if they do not differ at the largest n."""
    match = [not d for d in differ]
    if not match or match[-1]:
        return None
    i = len(match) - 1
    while i > 0 and not match[i - 1]:
        i -= 1
    return ns[i]


@inference_steps
def run_breadth_depth(pair, context: int = 256, ns: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                      repeats: int = FIRST_PAIRS, prompt_ids: list[int] | None = None,
                      max_new: int = DIAL_MAX_NEW) -> Iterator[Result]:
    """At each tokens per pass n: one target pass of n rows × 1 token (breadth: every row has its own
    `context`-slot cache) against 1 row × n tokens (depth: a verify of n − 1 drafts on one cache), timed
    in alternation, `repeats` pairs (more while the interval holds a line of the verdict's band).
    One yield per n. Extra key: `breakpoint` (first n from which they stop matching, or None), and the
    dial's (chapters.dial). With a synthetic draft, each n in DIAL_NS also decodes `prompt_ids` for real
    at depth n − 1 (DIAL_ROWS rows, `max_new` tokens, after their untimed reference): rows gain
    `depth_tokens_per_pass`."""
    model, device = pair.target.model, pair.target.device
    ns = sorted({int(n) for n in ns if int(n) >= 1})
    vocab = model.get_input_embeddings().weight.shape[0]
    settings = settings_of(pair, context=context, ns=ns, repeats=repeats, most_pairs=MOST_PAIRS,
                           forward="fast" if getattr(pair, "target_cache", None) is not None else "stock")
    refs, engine, ref = References(), None, None
    if acceptance_of(pair) is not None:
        settings.update(max_new=max_new, rows=DIAL_ROWS)
        # EOS ignored, on the reference and the runs alike: every answer runs its full length
        engine, ref = refs.engine(pair, [prompt_ids], DIAL_ROWS, max_new, eos_ids=[])
    yield snapshot("breadth_depth", pair, settings, 0.0, [], breakpoint=None, **dial_keys(pair, refs))
    rows: list[dict] = []
    contexts = Contexts(pair, torch.randint(0, vocab, (1, context), device=device))
    for i, n in enumerate(ns):
        # breadth and depth in alternation: a CPU that slows for a second slows both, not one
        r = paired_ratio(contexts.shaped(1, n), contexts.shaped(n, 1), device, BD_LINES, first=repeats)
        rows.append(bd_row(n, r))
        if engine is not None:
            rows[-1].update(draft=pair.draft_ref, breadth_tokens_per_pass=n,
                            **depth_yield(engine, ref, prompt_ids, n, max_new))
        yield snapshot("breadth_depth", pair, settings, (i + 1) / len(ns), rows, breakpoint=None,
                       **dial_keys(pair, refs))
    values, key = breadth_depth_values(rows)
    keys, vals = [key], [values]
    yielded = dial_yield_values(rows, acceptance_of(pair))
    if yielded is not None:
        keys, vals = ["dial_yield", key], [yielded, values]
    yield finished(snapshot("breadth_depth", pair, settings, 1.0, rows, **dial_keys(pair, refs),
                           breakpoint=values["n"] if key == "conclusion_stops" else None), values, key, keys, vals)


def bd_row(n: int, r: Ratio) -> dict:
    """A row of the table: each shape's median time, and breadth ÷ depth as the middle of the pairs with
    its 95 % interval (None where too few pairs ran for one)."""
    finite = r.finite()
    return {"tokens_per_pass": n, "breadth_ms": 1000 * r.b_s, "depth_ms": 1000 * r.a_s, "breadth_over_depth": r.ratio,
            "ratio_lo": r.lo if finite else None, "ratio_hi": r.hi if finite else None, "pairs": r.pairs}


def depth_yield(engine, references: dict, prompt_ids: list[int], n: int, max_new: int) -> dict:
    """DIAL_ROWS rows of `prompt_ids` decoded at depth n − 1 (a synthetic draft, its references made by
    `engine` on that batch): the tokens a pass moved a row, averaged over every row's passes whose n − 1
    drafts the answer's end did not cut. None beyond DIAL_NS (deeper than the engine drafts)."""
    k = n - 1
    if n not in DIAL_NS:
        return {"depth_tokens_per_pass": None, "depth_passes": 0}
    moved = [len(row.emitted) for ev in engine.generate([prompt_ids], Knobs(k, DIAL_ROWS), max_new,
                                                        references=references)
             for row in ev.rows if len(row.drafted) == k]
    return {"depth_tokens_per_pass": sum(moved) / len(moved) if moved else None, "depth_passes": len(moved)}


def dial_yield_values(rows: list[dict], acceptance: float | None) -> dict | None:
    """The dial's sentence: at the largest n measured both ways, breadth's n tokens per pass against the
    tokens depth's pass moved its one row (both passes' times beside them). None without the dial."""
    measured = [r for r in rows if r.get("depth_tokens_per_pass") is not None]
    if acceptance is None or not measured:
        return None
    at = measured[-1]
    return {"acceptance": acceptance, "n": at["tokens_per_pass"], "tokens": at["depth_tokens_per_pass"],
            "passes": at["depth_passes"], "rows": DIAL_ROWS, "breadth_ms": at["breadth_ms"], "depth_ms": at["depth_ms"]}


def breadth_depth_values(rows: list[dict]) -> tuple[dict, str]:
    """The verdict: close to call when the largest n's interval holds a line of BD_LINES, else holds when
    it lies inside the band, else stops from the smallest n whose interval and every larger n's lie
    outside it (a breakpoint no nearer interval can move)."""
    last = rows[-1]
    if _straddles(last):
        return _quoted(last), "conclusion_close"
    bp = breadth_depth_breakpoint([r["tokens_per_pass"] for r in rows], [_differs(r) for r in rows])
    if bp is None:
        return _quoted(last), "conclusion_holds"
    return _quoted(next(r for r in rows if r["tokens_per_pass"] == bp)), "conclusion_stops"


def _straddles(row: dict) -> bool:
    lo, hi = row["ratio_lo"], row["ratio_hi"]
    return lo is None or hi is None or any(lo <= x <= hi for x in BD_LINES)


def _differs(row: dict) -> bool:
    """Breadth ÷ depth known to lie outside the band (its whole interval on one side of it)."""
    lo, hi = row["ratio_lo"], row["ratio_hi"]
    return lo is not None and hi is not None and (hi < BD_LINES[0] or lo > BD_LINES[1])


def _quoted(at: dict) -> dict:
    return {"n": at["tokens_per_pass"], "breadth_ms": at["breadth_ms"], "depth_ms": at["depth_ms"],
            "ratio": at["breadth_over_depth"], "ratio_lo": at["ratio_lo"], "ratio_hi": at["ratio_hi"],
            "pairs": at["pairs"], "match_pct": round(100 * BD_MATCH)}


def figure_breadth_depth(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Side-by-side bars at each n: one pass of n rows × 1 token vs 1 row × n tokens; the first n where
    they stop matching is marked. With the dial, the tokens each pass moved (breadth n, depth measured)
    as lines on a second axis, and the synthetic draft named in the title and the legend."""
    L = labels_for("breadth_depth", labels)
    rows = result.get("table", [])
    x = [str(r["tokens_per_pass"]) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=[r["breadth_ms"] for r in rows], name=L["legend_breadth"], marker_color=OWN))
    fig.add_trace(go.Bar(x=x, y=[r["depth_ms"] for r in rows], name=L["legend_depth"], marker_color=DRAFT,
                         customdata=[r.get("breadth_over_depth") for r in rows],
                         hovertemplate="%{y:.1f} ms (" + L["hover_ratio"] + " %{customdata:.2f})<extra></extra>"))
    title = dial_title(L, result)
    if title is not None:
        _yield_lines(fig, rows, x, L, title)
    bp = result.get("breakpoint")
    if bp is not None and str(bp) in x:
        # by position: a numeric-looking category name would be read as an index on a category axis
        fig.add_annotation(x=x.index(str(bp)), y=1, yref="paper", text=lessons.chart_fill(L["breakpoint"], {"n": bp}),
                           showarrow=True, arrowhead=2, arrowcolor=REJECTED, ax=0, ay=-20, yanchor="bottom",
                           font=dict(color=REJECTED))
    fig.update_yaxes(title_text=L["axis_time"], secondary_y=False)
    return styled(fig, dark, title=title, barmode="group", xaxis_title=L["axis_tokens"],
                  xaxis_type="category", margin=dict(l=56, r=56, t=72 if title else 56, b=80))


def _yield_lines(fig: go.Figure, rows: list[dict], x: list[str], L: dict, title: str) -> None:
    """Tokens each pass moved: breadth's n rows one each, depth's one row as far as its drafts survived."""
    got = [(xi, r) for xi, r in zip(x, rows) if r.get("depth_tokens_per_pass") is not None]
    fig.add_trace(go.Scatter(x=[xi for xi, _ in got], y=[r["breadth_tokens_per_pass"] for _, r in got],
                             name=L["legend_breadth_tokens"], mode="lines+markers",
                             line=dict(color=OWN, dash="dot")), secondary_y=True)
    fig.add_trace(go.Scatter(x=[xi for xi, _ in got], y=[r["depth_tokens_per_pass"] for _, r in got],
                             name=lessons.chart_fill(L["legend_depth_tokens"], {"synthetic": title}),
                             mode="lines+markers", line=dict(color=DRAFT, width=3),
                             hovertemplate="%{y:.2f}<extra></extra>"), secondary_y=True)
    fig.update_yaxes(title_text=L["axis_moved"], secondary_y=True, rangemode="tozero", showgrid=False,
                     tickmode="auto", nticks=6)


CHAPTER = Chapter("breadth_depth", run=lambda ctx: run_breadth_depth(dialled(ctx), prompt_ids=ctx.prompt),
                  figure=figure_breadth_depth, button_id="run-breadth-depth", dial=True)
