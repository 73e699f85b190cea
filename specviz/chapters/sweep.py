"""Chapter: the batch × depth sweep. Speed-up of each depth over plain decoding at each batch size, the
crossover batch, and published GPU measurements beside it (always labelled as published). With the
acceptance dial, the same grid on the synthetic draft: its references decoded first, batch by batch.

Every cell runs SWEEP_ROUNDS times, the depths of a batch size taking turns, so a cell's speed-up is the
median of its rounds' ratios to plain decoding in the same round and its band is their measured spread: a
single run per cell is noisier than the gains near the crossover.

Measured: about 50 s on the 2-core CPU with the offline SmolLM2-135M and the n-gram draft (B up to 32).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Iterator

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import lessons
from specviz.chapters import vllm_panels
from specviz.chapters.base import Chapter, Result, VllmPanel
from specviz.chapters.common import TimedRun, finished, settings_of, snapshot, timed_run
from specviz.chapters.dial import References, acceptance_of, dial_keys, dial_title, dialled, warm_up
from specviz.chapters.frontier_verdict import NOISE_FLOOR, paired_spread
from specviz.chapters.plotting import PLAIN, POLICY_COLOURS, aligned, is_rtl, labels_for, said_label, styled
from specviz.engine.torchmode import inference_steps
from specviz.hardware.costmodel import crossover_from_rows
from specviz.hardware.profiles import PUBLISHED_LABEL, load_published
from specviz.lessons import Listed, Said

SWEEP_ROUNDS = 3         # runs of every cell, the depths taking turns (the median of 3 survives one outlier)


def sweep_best_depths(rows: list[dict]) -> dict[int, int]:
    """Batch size → best depth: of the depths that beat plain decoding by more than their own band (their
    rounds' measured spread, `band`, or 5 % where that is less), the one with the highest speed-up; k = 0
    where none did: a 3 % "win" inside a cell's noise is not a reason to speculate."""
    best: dict[int, int] = {}
    for b in sorted({r["batch_size"] for r in rows}):
        paying = [r for r in rows if r["batch_size"] == b and r["depth"] > 0 and r.get("speedup")
                  and r["speedup"] > 1 + pays_band(r)]
        best[b] = max(paying, key=lambda r: r["speedup"])["depth"] if paying else 0
    return best


def pays_band(row: dict) -> float:
    """How far past 1× a cell must be to pay: its own measured band, at least NOISE_FLOOR (the race's ±5 %)."""
    return max(NOISE_FLOOR, row.get("band") or 0.0)


def sweep_crossover(rows: list[dict]) -> int | None:
    """The smallest batch size from which on, at every larger one too, the best depth is 0 (no depth paid,
    by sweep_best_depths' band rule): roofline.crossover_from_rows over those best depths."""
    best = sweep_best_depths(rows)
    return crossover_from_rows([{"batch_size": b, "depth": k, "tokens_per_s": 1.0} for b, k in best.items()])


def sweep_unsettled(best: dict[int, int]) -> tuple[list[int], list[int]]:
    """(plain-best batch sizes that a depth beat again at a larger one, those larger ones): a grid that does
    not settle into one crossover, where a cell's noise is larger than speculation's gain or loss."""
    plain = [b for b, k in best.items() if k == 0]
    spec = [b for b, k in best.items() if k > 0]
    return [b for b in plain if any(s > b for s in spec)], [s for s in spec if any(p < s for p in plain)]


def sweep_conclusion(crossover: int | None, unsettled: bool = False) -> str:
    """A crossover exists when, from some batch size on, plain decoding (k = 0) was the best depth. Without
    one, a grid where plain won at a smaller batch than a depth did is unsettled, not "crossover further out"."""
    if crossover is not None:
        return "conclusion_crossover"
    return "conclusion_unsettled" if unsettled else "conclusion_no_crossover"


# The vLLM blog measured against load (queries per second), not batch size, so its points have no batch;
# they are not in assets/published/speedups.json (a batch-indexed file). Numbers: PUBLISHED-RESULTS.md.
VLLM_BLOG_SOURCE = ("vLLM blog, 'How Speculative Decoding Boosts vLLM Performance by up to 2.8x' (2024-10-17): "
                    "4× H100, Llama-3-70B")


# Names and loads are Saids: their English is what the CSV and the tests read, a chart shows them in its
# reader's language.
_DRAFT_MODEL, _NGRAM = (Said("chapter.sweep.blog_draft_model", model="Qwama-0.5B"),
                        Said("chapter.sweep.blog_ngram", data="CNN/DailyMail"))
_LIGHT, _HIGH = Said("chapter.sweep.load_light", qps=1), Said("chapter.sweep.load_high")
VLLM_BLOG = [(_DRAFT_MODEL, _LIGHT, 1.5), (_DRAFT_MODEL, _HIGH, 1 / 1.4), (_NGRAM, _LIGHT, 2.8), (_NGRAM, _HIGH, 1 / 1.8)]


def published_points() -> list[dict]:
    """Published speed-ups against batch size (profiles.load_published, as the what-if uses them), then
    the vLLM blog's light- vs high-load points (batch None, `load` named). Never ours: each carries its
    source and the label "published measurement"."""
    out = [{"source": s.source, "label": PUBLISHED_LABEL, "batch": b, "speedup": x,
            "series": Said("chapter.sweep.series", label=s.label, cite=s.cite), "load": None}
           for s in load_published() for b, x in zip(s.batch_sizes, s.speedup)]
    out += [{"source": VLLM_BLOG_SOURCE, "label": PUBLISHED_LABEL, "batch": None, "speedup": x,
             "series": Said("chapter.sweep.blog_series", name=name), "name": name, "load": load}
            for name, load, x in VLLM_BLOG]
    return out


@inference_steps
def run_sweep(pair, prompt_ids: list[int], batches: Iterable[int] = (1, 2, 4, 8, 16, 32),
              depths: Iterable[int] = (0, 1, 2, 4), max_new: int = 24,
              rounds: int = SWEEP_ROUNDS) -> Iterator[Result]:
    """Every (batch B, depth k) cell, `rounds` times (see `turn`): B rows of the prompt, greedy, end-to-end
    tokens/s, speed-up over k = 0 at the same B (k = 0 is measured first, so every cell's speed-up is known
    as soon as it finishes; see `sweep_cells`). One yield per run. Extra keys: `batches`, `depths`,
    `best_depth` ([{batch_size, depth}], sweep_best_depths), `crossover_batch` (sweep_crossover), `published`
    (see published_points), and the dial's (chapters.dial): with a synthetic draft, each batch size's cells
    run on one engine that first decoded that batch at depth 0, untimed, for their references."""
    batches = sorted({int(b) for b in batches})
    depths = sorted({0, *(int(k) for k in depths)})
    rounds = max(1, int(rounds))
    settings = settings_of(pair, batches=batches, depths=depths, max_new=max_new, rounds=rounds,
                           prompt_tokens=len(prompt_ids))
    pub = published_points()
    refs = References()
    extra = {"batches": batches, "depths": depths, "best_depth": [], "crossover_batch": None, "published": pub,
             **dial_keys(pair, refs)}
    yield snapshot("sweep", pair, settings, 0.0, [], **extra)
    warm_up(pair, refs, [prompt_ids], max(depths))
    rows: list[dict] = []
    total, done = len(batches) * len(depths) * rounds, 0
    synthetic = acceptance_of(pair) is not None
    for b in batches:
        engine, ref = refs.engine(pair, [prompt_ids], b, max_new) if synthetic else (None, None)
        runs: dict[int, list[TimedRun]] = {k: [] for k in depths}
        for r in range(rounds):
            for k in turn(depths, r):
                runs[k].append(timed_run(pair, [prompt_ids], k, b, max_new, engine=engine, references=ref))
                rows = [x for x in rows if x["batch_size"] != b] + sweep_cells(runs, b, pair.draft_ref)
                done += 1
                extra.update(best_depth=_best(rows), **dial_keys(pair, refs))
                yield snapshot("sweep", pair, settings, done / total, rows, **extra)
    cross = sweep_crossover(rows)
    extra.update(best_depth=_best(rows), crossover_batch=cross)
    best = sweep_best_depths(rows)
    values = {"best_depths": Listed(f"B={b}: k={k}" for b, k in best.items()),
              "crossover": cross if cross is not None else "—", "max_batch": max(batches), "pays": NOISE_FLOOR,
              "rounds": rounds, **edge_values(rows, cross)}
    plain_b, spec_b = sweep_unsettled(best)
    values.update(plain_batches=Listed(map(str, plain_b)), spec_batches=Listed(map(str, spec_b)))
    key = sweep_conclusion(cross, bool(plain_b))
    keys = ["conclusion_best", key] + (["conclusion_unsettled"] if plain_b and cross is not None else [])
    vals = [values] * len(keys)
    if synthetic:
        keys, vals = ["dial_measured", *keys], [sweep_dial_values(rows, acceptance_of(pair)), *vals]
    yield finished(snapshot("sweep", pair, settings, 1.0, rows, **extra), values, key, keys, vals)


def turn(depths: list[int], r: int) -> list[int]:
    """Round r's order: ascending, then descending, so no depth always runs right after plain decoding
    (round 0 starts with k = 0, so a cell's speed-up is known from its first run)."""
    return list(depths) if r % 2 == 0 else list(reversed(depths))


def sweep_cells(runs: dict[int, list[TimedRun]], batch: int, draft: str = "") -> list[dict]:
    """One row per depth measured so far at `batch`: the median tokens/s of its runs, its speed-up the
    median of its rounds' ratios to k = 0 of the same round (not median tokens/s ÷ plain's median tokens/s:
    pairing within a round cancels a slow round), and `band` (frontier_verdict.paired_spread of those
    ratios, None from one round). Counts come from the first run: greedy runs repeat the same tokens."""
    plain = [x.tokens_per_s for x in runs.get(0, [])]
    out = []
    for k, mine in runs.items():
        if not mine:
            continue
        tps = [x.tokens_per_s for x in mine]
        ratios = [a / p for a, p in zip(tps, plain) if p > 0]
        first = mine[0]
        out.append({"batch_size": batch, "depth": k, "draft": draft, "tokens_per_s": statistics.median(tps),
                    "speedup": 1.0 if k == 0 else (statistics.median(ratios) if ratios else None),
                    "band": paired_spread(ratios) if k and len(ratios) > 1 else None, "runs": len(mine),
                    "acceptance_rate": first.totals.acceptance_rate, "flops_ratio": first.totals.flops_ratio,
                    "tokens": first.totals.tokens, "drafted": first.totals.drafted,
                    "accepted": first.totals.accepted, **first_drafts(first),
                    "wall_s": statistics.median(x.wall_s for x in mine)})
    return out


def edge_values(rows: list[dict], cross: int | None) -> dict:
    """The cell the conclusion turns on, for its sentence: the fastest depth at the crossover batch size
    (which did not pay), or the best depth at the largest one without a crossover (which did), with its
    speed-up and measured band (the 5 % floor where it ran once), so a reader sees how close a call it was."""
    if cross is not None:
        spec = [r for r in rows if r["batch_size"] == cross and r["depth"] > 0 and r.get("speedup")]
        top = max(spec, key=lambda r: r["speedup"], default=None)
    else:
        b = max((r["batch_size"] for r in rows), default=0)
        k = sweep_best_depths(rows).get(b, 0)
        top = next((r for r in rows if r["batch_size"] == b and r["depth"] == k and k > 0), None)
    if top is None:
        return {"edge_depth": "—", "edge_speedup": 1.0, "edge_band": NOISE_FLOOR}
    band = top.get("band")
    return {"edge_depth": top["depth"], "edge_speedup": top["speedup"],
            "edge_band": band if band is not None else NOISE_FLOOR}


def first_drafts(run: TimedRun) -> dict:
    """Each row's first draft of a step, and how many the target kept: the share a synthetic draft's dial
    sets (a later draft counts only after every draft before it was kept)."""
    firsts = [row.accepted > 0 for ev in run.events for row in ev.rows if row.drafted]
    return {"first_drafted": len(firsts), "first_accepted": sum(firsts)}


def sweep_dial_values(rows: list[dict], acceptance: float) -> dict:
    """The dial's sentence: over every speculating cell, the share of first drafts the target accepted (the
    dial's A, measured) and of all drafts, and the best cell of the grid."""
    spec = [r for r in rows if r["depth"] > 0 and r.get("speedup") is not None]
    drafted, firsts = sum(r["drafted"] for r in spec), sum(r["first_drafted"] for r in spec)
    best = max(spec, key=lambda r: r["speedup"], default={"speedup": 1.0, "batch_size": "—", "depth": "—"})
    return {"acceptance": acceptance, "measured": sum(r["accepted"] for r in spec) / drafted if drafted else 0.0,
            "first": sum(r["first_accepted"] for r in spec) / firsts if firsts else 0.0,
            "best_speedup": best["speedup"], "best_batch": best["batch_size"], "best_depth": best["depth"]}


def _best(rows: list[dict]) -> list[dict]:
    return [{"batch_size": b, "depth": k} for b, k in sweep_best_depths(rows).items()]


def figure_sweep(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Left: heatmap of measured speed-up over k = 0 by (batch B, depth k), cells appearing as they are
    measured, the best k per B starred. Right: published speed-up against batch size on GPUs, each series
    named with its source and labelled "published measurement"; the vLLM blog's load points as a note.
    With the dial, the heatmap is named "synthetic draft (A = …)" in the title and the legend."""
    L = labels_for("sweep", labels)
    title = dial_title(L, result)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12)
    _heatmap(fig, result, L, colorbar_x=0.5, name=title)
    _published(fig, result.get("published", []), L)
    # powers of two, as the batch sizes are: plotly's own log ticks read "… 9 10 2 3 …" (the second 2 is 20)
    fig.update_xaxes(title_text=L["axis_batch"], type="log", tickvals=BATCH_TICKS,
                     ticktext=[str(b) for b in BATCH_TICKS], row=1, col=2)
    # the published panel's axis on the right, so the heatmap's colour bar sits between the panels
    fig.update_yaxes(title_text=L["cell"], side="right", row=1, col=2)
    return styled(fig, dark, title=title, height=560, margin=dict(l=56, r=64, t=72 if title else 32, b=230),
                  legend=dict(orientation="h", y=-0.24, x=0))


def figure_recorded_sweep(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """The heatmap alone, for a sweep recorded elsewhere (vLLM's, `specviz.chapters.vllm_panels.sweep_result`)."""
    L = labels_for("sweep", labels)
    fig = make_subplots(rows=1, cols=1)
    _heatmap(fig, result, L, colorbar_x=1.02)
    return styled(fig, dark, height=360, margin=dict(l=56, r=64, t=32, b=48))


def _heatmap(fig: go.Figure, result: dict, L: dict, colorbar_x: float, name: str | None = None) -> None:
    batches, depths = result.get("batches", []), result.get("depths", [])
    cell = {(r["batch_size"], r["depth"]): r.get("speedup") for r in result.get("table", [])}
    # a cell's band (its rounds' spread) in its hover: the number alone hides how far to trust it
    bands = {(r["batch_size"], r["depth"]): r.get("band") for r in result.get("table", [])}
    best = {(b["batch_size"], b["depth"]) for b in result.get("best_depth", [])}
    z = [[cell.get((b, k)) for b in batches] for k in depths]
    # the best k per batch size is starred inside its cell (a marker on top would hide the number); no "×"
    # (the colour bar's title says it): plotly shrinks a cell's text to fit, on a phone to about 6 px
    text = [["" if cell.get((b, k)) is None else ("★" if (b, k) in best else "") + f"{cell[(b, k)]:.2f}"
             for b in batches] for k in depths]
    spread = [["" if bands.get((b, k)) is None else f" (±{bands[(b, k)]:.0%})" for b in batches] for k in depths]
    fig.add_trace(go.Heatmap(z=z, x=[str(b) for b in batches], y=[str(k) for k in depths], text=text,
                             customdata=spread, texttemplate="%{text}", textfont=dict(size=11),
                             **speedup_colours([v for row in z for v in row]),
                             showscale=True,
                             colorbar=dict(title=dict(text="×", side="top"), x=colorbar_x, len=0.9, thickness=12,
                                           tickvals=COLOUR_TICKS, ticktext=[f"{v:g}×" for v in COLOUR_TICKS]),
                             hovertemplate="B=%{x}, k=%{y}: %{z:.2f}×%{customdata}<extra></extra>", hoverongaps=False,
                             name=name, showlegend=name is not None), row=1, col=1)
    if best:
        fig.add_annotation(text="★ " + L["best"], x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom",
                           xanchor="left", showarrow=False, font=dict(size=12))
    fig.update_xaxes(title_text=L["axis_batch"], type="category", row=1, col=1)
    fig.update_yaxes(title_text=L["axis_depth"], type="category", row=1, col=1)


BATCH_TICKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COLOUR_RANGE = (0.5, 2.0)          # the colour bar's ends on every run whose cells lie within them (others widen it)
COLOUR_TICKS = (0.5, 0.75, 1, 1.5, 2)


def speedup_colours(values: list) -> dict:
    """A heatmap's colours for speed-ups: red to salmon below 1×, pale at 1×, light to deep green above,
    with a step at 1× so a small loss reads as a loss, over COLOUR_RANGE so presses compare."""
    shown = [v for v in values if v is not None]
    lo, hi = min([COLOUR_RANGE[0], *shown]), max([COLOUR_RANGE[1], *shown])
    one = (1 - lo) / (hi - lo)
    scale = [[0.0, "#b2182b"], [one - 1e-6, "#f4a582"], [one, "#ffffbf"], [min(1.0, one + 1e-6), "#d9f0d3"],
             [1.0, "#1a9850"]]
    return {"zmin": lo, "zmax": hi, "colorscale": scale}


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
                                 name=said_label(L, name, L["published"]), marker=dict(symbol=symbols[i % 4], size=9),
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
            by_load.setdefault(name, []).append(f"{lessons.isolate_ltr(x) if is_rtl(L) else x} "
                                                f"({lessons.say(lang, p['load'])})")
    if by_load:
        # one plotly line per series: each Persian line is right-to-left on its own (an isolate does not
        # span plotly's <br>), and its arrow points the way it reads
        arrow = " ← " if is_rtl(L) else " → "
        lines = [f"{name}: {arrow.join(v)}" for name, v in by_load.items()]
        head = lessons.chart_fill(L["vllm_note"], {"published": L["published"], "points": ""})
        note = "<br>".join(lessons.isolate_rtl(line) for line in [head.rstrip(), *lines])
        fig.add_annotation(text=note, y=-0.45, xref="paper", yref="paper", showarrow=False, yanchor="top",
                           font=dict(size=12), **aligned(L))


# beside the class's sweep: vLLM's own recorded grid as a speed-up heatmap
VLLM = VllmPanel(result=lambda sweep, lang: vllm_panels.sweep_result(sweep), figure=figure_recorded_sweep)
CHAPTER = Chapter("sweep", run=lambda ctx: run_sweep(dialled(ctx), ctx.prompt), figure=figure_sweep,
                  button_id="run-sweep", vllm=VLLM, dial=True)
