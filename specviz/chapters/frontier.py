"""Chapter: the frontier. Throughput against per-user speed as the class grows, one line per arm (no
speculation, fixed depths, adaptive verification), and the accepted length per arm beside it.

The class workload: `users` requests of one prompt each (prompts.GROUNDED, whose answers copy their
input, like the first Run's), every user a separate request in one shared batch, EOS ignored so every arm emits the same tokens.
Here the batch is stepped in the lesson's own thread through the engine's `step()` (the loop the app's
scheduler runs; the lesson holds the device exclusively, so the scheduler's thread cannot run beside it).
`python -m specviz frontier` measures the same cells through the shared scheduler, and reuses the
arms, the medians and the conclusion rules (`frontier_cells`, `frontier_verdict`).

Adaptive verification starts from what the pair's earlier steps in this process taught about its drafts
(`specviz.engine.learnt`: the class's Runs, earlier presses, this press's other arms), as the app's
long-lived engine does; under the dial, what this press's synthetic pair taught.

Honest comparison: every cell runs `repeats` times with the arms interleaved inside each round, in an
order that changes so that no arm always follows the same one (`williams_row`), and a cell's noise is its
own runs' spread (max − min) ÷ median. A winner is named only outside the band of the two cells compared;
inside it they are "level" where the band is within ±10 %, else "too close to call here".

With the acceptance dial (`acceptance`), the same experiment runs on the local target with the synthetic
draft `synthetic:A`; each class's reference (the target's own continuation, decoded first at depth 0) is
timed apart and never counted in a cell.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterator

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import lessons
from specviz.chapters.base import Chapter, Context, VllmPanel
from specviz.chapters.common import finished, settings_of, snapshot
from specviz.chapters.dial import dial_title
from specviz.chapters.frontier_cells import (AV, WARM_TOKENS, Cell, arm_code, arm_name, arms, divergence_of,
                                             measure, stepped_cell, stepped_references, stepped_round,
                                             tokens_per_user, warm_budget)
from specviz.chapters.frontier_verdict import frontier_conclusions
from specviz.chapters.plotting import PLAIN, POLICY_COLOURS, labels_for, styled
from specviz.engine.profiling import pair_profiles
from specviz.engine.torchmode import inference_steps
from specviz.hardware.profiles import ASSETS

FRONTIER_DIR = ASSETS / "frontier"      # `frontier --engine vllm` recordings (recorded.json, copied here)

# The lesson's size: it must finish within a minute in the app on a 2-core CPU (one model thread) with
# the offline SmolLM2-135M; 16 users already reach the cliff there. One fixed depth, the deepest (the one
# that bends back furthest, and adaptive verification's k): a second depth takes the chapter past a minute
# on a slower 2-core CPU. A small class gets more tokens per user (class_tokens in all, at least max_new
# each), and a cell runs classes until its users emitted cell_tokens, the arms taking turns class by class,
# so that the two arms a verdict compares met the machine's drift alike and a one-user cell's own runs
# agree within the ±10 % the verdict needs.
CHAPTER_SIZE = dict(users=(1, 4, 16), depths=(8,), max_new=10, repeats=2, class_tokens=40, cell_tokens=120)


def classes_of(users: int, per_user: int, cell_tokens: int) -> int:
    """Classes one cell runs: enough for `cell_tokens` tokens, at least one."""
    return max(1, -(-cell_tokens // max(1, users * per_user)))


# --- the experiment ----------------------------------------------------------------------------------
@inference_steps
def run_frontier(pair, prompts: list[list[int]], users=CHAPTER_SIZE["users"], depths=CHAPTER_SIZE["depths"],
                 max_new: int = CHAPTER_SIZE["max_new"], repeats: int = CHAPTER_SIZE["repeats"],
                 class_tokens: int = CHAPTER_SIZE["class_tokens"], acceptance: float | None = None,
                 cell_tokens: int = CHAPTER_SIZE["cell_tokens"]) -> Iterator[dict]:
    """The frontier on the loaded pair (with `acceptance`, on its target with the synthetic draft): a
    warm-up, the cost profile adaptive verification starts from, then every cell (one yield each, never
    inside a timed cell)."""
    users, prompts = sorted({int(u) for u in users}), [list(p) for p in prompts]
    if acceptance is not None:
        pair = pair.with_synthetic(acceptance)
    per_user = {n: tokens_per_user(n, max_new, class_tokens) for n in users}
    classes = {n: classes_of(n, per_user[n], cell_tokens) for n in users}
    settings = settings_of(pair, users=users, depths=sorted(set(depths)), repeats=repeats, prompts=len(prompts),
                           tokens_per_user={str(n): t for n, t in per_user.items()},
                           classes={str(n): c for n, c in classes.items()}, acceptance=acceptance)
    extra = {"identical": True, "synthetic": pair.synthetic, "reference_s": 0.0, "realigned": 0}
    yield snapshot("frontier", pair, settings, 0.0, [], **extra)
    refs = {}
    if pair.synthetic is not None:            # each class's reference first: decoded at depth 0, untimed
        for n in users:
            refs[n], secs = stepped_references(pair, prompts, n, per_user[n], classes[n])
            extra["reference_s"] += secs
    warm_refs = None
    if pair.synthetic is not None:
        warm_refs, secs = stepped_references(pair, prompts, 2, 4)
        extra["reference_s"] += secs
    stepped_cell(pair, prompts, "fixed", max(depths), 2, 4, references=warm_refs)   # warm-up
    budget = warm_budget(pair, prompts, max(depths), pair_profiles(pair, quick=True))
    total, count = len(users) * len(arms(depths)) * repeats, [0]

    def cell(arm, d, n):            # only the untimed warm-up at each class size runs a cell whole
        return stepped_cell(pair, prompts, "fixed", d, n, WARM_TOKENS, references=refs.get(n))

    def round_of(order, n, r):
        return stepped_round(pair, prompts, order, n, per_user[n], classes[n], r, budget, refs.get(n))

    def heard(c, rows):
        count[0] += 1
        extra["realigned"] += c.get("realigned", 0)
    # each cell is measured alone; the snapshots are built between class sizes, outside any timing
    differing: list = []
    for same, rows in _cells(cell, round_of, users, depths, repeats, heard, differing):
        if same is None:
            report = None
            if not extra["identical"]:          # each difference judged in the target's own pass
                report, _ = divergence_of(pair.target.model, pair.target.device,
                                          lambda m: prompts[m % len(prompts)], differing)
                extra["divergence"] = report.as_dict()
            values, key, keys, vals = frontier_conclusions(rows, extra["identical"], report)
            yield finished(snapshot("frontier", pair, settings, 1.0, rows, **extra), values, key, keys, vals)
            return
        extra["identical"] &= same
        yield snapshot("frontier", pair, settings, count[0] / total, rows, **extra)


def _cells(cell: Cell, round_of, users, depths, repeats: int, heard,
           differing: list) -> Iterator[tuple[bool | None, list[dict]]]:
    """`measure`, one class size at a time so the page can draw between them: yields (identical so far,
    rows) after each class size, then (None, every row); cells whose tokens differ go to `differing`."""
    rows: list[dict] = []
    for n in users:
        part, same = measure(cell, [n], depths, repeats, on_cell=heard, round_of=round_of, differing=differing)
        rows += part
        yield same, list(rows)
    yield None, rows


# --- the figure --------------------------------------------------------------------------------------
def _lines(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["users"]):
        out.setdefault(arm_code(r), []).append(r)
    return out


def _colour(code: str, i: int) -> str:
    return PLAIN if code == "none" else "#1a9850" if code.startswith(AV) else POLICY_COLOURS[1 + i % 5]


D = math.sqrt(0.5)
TAG_PLACES = {"top center": (0.0, 1.0), "bottom center": (0.0, -1.0), "middle right": (1.0, 0.0),
              "middle left": (-1.0, 0.0), "top right": (D, D), "top left": (-D, D), "bottom right": (D, -D),
              "bottom left": (-D, -D)}
# a tag's box on axes scaled to the points' spread: its centre this far from the point, half as wide and
# half as high as these (a 10 px "16 u" beside a 6 px marker, on a plot about 450 × 250 px)
TAG_OFFSET, TAG_HALF_W, TAG_HALF_H = 0.07, 0.05, 0.035
SAME_POINT = 0.01      # another arm's point this close (scaled) is this one: its line leaves from here too


def tag_positions(xs: list[float], ys: list[float], others: list[tuple[list, list]] = ()) -> list[str]:
    """Where each point's class-size tag goes: of the sides that face into the plot, the one whose box the
    fewest other lines (`others`: the other arms' points) cross, and of those the side furthest in angle
    from the segments that leave the point ("4 u" above its point sat on a segment that rose through it;
    beside it, on the fixed depth's line)."""
    every_x = list(xs) + [x for ox, _ in others for x in ox]
    every_y = list(ys) + [y for _, oy in others for y in oy]
    x0, y0 = (min(every_x), min(every_y)) if every_x else (0.0, 0.0)
    sx = ((max(every_x) - x0) if every_x else 0.0) or 1.0
    sy = ((max(every_y) - y0) if every_y else 0.0) or 1.0
    mine = [((x - x0) / sx, (y - y0) / sy) for x, y in zip(xs, ys)]
    scaled = [[((x - x0) / sx, (y - y0) / sy) for x, y in zip(ox, oy)] for ox, oy in others]
    out = []
    for i, here in enumerate(mine):
        legs, crossing = _legs(mine, i, here), []
        for line in scaled:
            at = [j for j, q in enumerate(line) if math.dist(q, here) <= SAME_POINT]
            if at:            # a line through this point: its segments leave from here, like this line's own
                legs += _legs(line, at[0], here)
            else:
                crossing.append(line)

        def score(place: str) -> tuple[int, float]:
            u = TAG_PLACES[place]
            centre = (here[0] + TAG_OFFSET * u[0], here[1] + TAG_OFFSET * u[1])
            angle = min((math.atan2(u[0] * b - u[1] * a, u[0] * a + u[1] * b) ** 2 for a, b in legs), default=9.0)
            return -sum(_crosses(line, centre) for line in crossing), angle
        # never outwards from the plot's edge, where the tag would be cut off
        x, y = xs[i], ys[i]
        inward = [p for p, (u, v) in TAG_PLACES.items()
                  if not (len(xs) > 1 and ((u > 0 and x == max(xs)) or (u < 0 and x == min(xs))
                                           or (v > 0 and y == max(ys)) or (v < 0 and y == min(ys))))]
        out.append(max(inward or list(TAG_PLACES), key=score))       # ties keep the first: above the point
    return out


def _legs(line: list[tuple[float, float]], i: int, here: tuple[float, float]) -> list[tuple[float, float]]:
    """The directions from `here` to the points before and after point i of a line."""
    legs = [(line[j][0] - here[0], line[j][1] - here[1]) for j in (i - 1, i + 1) if 0 <= j < len(line)]
    return [(a, b) for a, b in legs if a or b]


def _crosses(line: list[tuple[float, float]], centre: tuple[float, float], samples: int = 24) -> bool:
    """Some point of the polyline (sampled along each segment) lies inside the tag's box around `centre`."""
    cx, cy = centre
    for (ax, ay), (bx, by) in zip(line, line[1:]):
        for k in range(samples + 1):
            f = k / samples
            if abs(ax + f * (bx - ax) - cx) <= TAG_HALF_W and abs(ay + f * (by - ay) - cy) <= TAG_HALF_H:
                return True
    return False


def figure_frontier(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Left: one line per arm through its class sizes, per-user tokens/s across and total tokens/s up (a
    fixed depth that bends back turns down and left). Right: accepted length per arm against users."""
    L = labels_for("frontier", labels)
    lang = L.get("_lang", lessons.DEFAULT_LANG)
    sep = lessons.template(lang, "app.list_separator")       # the reader's comma in the tooltip
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.16,
                        subplot_titles=(L["panel_frontier"], L["panel_accepted"]))
    fig.update_annotations(font_size=12)      # the panel titles: two short lines each, readable on a phone
    lines = _lines(result.get("table", []))
    arms_drawn = list(enumerate(lines.items()))
    # the adaptive arm's wide line first, underneath: on top it hid no speculation's where the two were one
    arms_drawn.sort(key=lambda arm: not arm[1][0].startswith(AV))
    for i, (code, pts) in arms_drawn:
        name = lessons.isolate_rtl(arm_name(lang, code))
        colour, bold = _colour(code, i), code.startswith(AV)
        line = dict(color=colour, width=4 if bold else 2, dash="dot" if code.startswith("fixed") else "solid")
        tags = [L["users_tag"].format(users=p["users"]) for p in pts]
        xs, ys = [p["per_user_tokens_per_s"] for p in pts], [p["tokens_per_s"] for p in pts]
        others = [([p["per_user_tokens_per_s"] for p in q], [p["tokens_per_s"] for p in q])
                  for c, q in lines.items() if c != code]
        # class sizes written on the adaptive arm only (every arm has the same sizes; hover names them all)
        fig.add_trace(go.Scatter(x=xs, y=ys, legendrank=1000 + i,
                                 mode="lines+markers+text" if bold else "lines+markers", name=name,
                                 legendgroup=code, line=line, text=tags,
                                 textposition=tag_positions(xs, ys, others) if bold else "top center",
                                 textfont=dict(size=10),
                                 hovertemplate=name + ": %{text}" + sep + "%{y:.1f} " + L["axis_total"] + sep
                                 + "%{x:.1f} " + L["axis_per_user"] + "<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[p["users"] for p in pts], y=[p["accepted_length"] for p in pts],
                                 mode="lines+markers", name=name, legendgroup=code, showlegend=False, line=line,
                                 hovertemplate=name + ": %{y:.2f}<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text=L["axis_per_user"], row=1, col=1)
    fig.update_yaxes(title_text=L["axis_total"], row=1, col=1)
    sizes = sorted({r["users"] for r in result.get("table", [])})
    fig.update_xaxes(title_text=L["axis_users"], type="log", tickvals=sizes, ticktext=[str(n) for n in sizes],
                     row=1, col=2)
    fig.update_yaxes(title_text=L["axis_accepted"], row=1, col=2)
    title = dial_title(L, result)
    if title is not None:                    # a synthetic curve says so wherever it is drawn
        fig.update_layout(title=dict(text=title, x=0.5, font=dict(size=13)))
    # room above the plots for the panel titles' two lines (make_subplots puts them over the top edge)
    return styled(fig, dark, height=460, margin=dict(l=56, r=20, t=64, b=80))


# --- vLLM's frontier, recorded --------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedFrontier:
    """A `frontier --engine vllm` run shipped in assets/frontier/ (read-only, shared by every page)."""
    engine_version: str
    device: str
    command: str
    rows: tuple
    recorded_at: str = ""      # the day it was measured (YYYY-MM-DD)


def recorded_frontier(folder=FRONTIER_DIR) -> RecordedFrontier | None:
    """The shipped vLLM frontier with the most class sizes (ties: the newest by name), or None. A file
    that does not read as one is skipped: the lesson shows what it can."""
    best = None
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            rec = RecordedFrontier(str(d["engine_version"]), str(d["device"]), str(d["command"]),
                                   tuple(dict(r) for r in d["rows"]), str(d.get("recorded_at", "")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or len({r["users"] for r in rec.rows}) >= len({r["users"] for r in best.rows}):
            best = rec
    return best


def vllm_frontier(rec: RecordedFrontier, lang: str) -> dict:
    return {"table": list(rec.rows)}


def vllm_notes(rec: RecordedFrontier) -> list[tuple[str, dict]]:
    """Per class size: vLLM's schedule against the best of its own no-speculation and fixed arms."""
    out = []
    for n in sorted({r["users"] for r in rec.rows}):
        mine = [r for r in rec.rows if r["users"] == n]
        sched = next((r for r in mine if r["arm"] == "schedule"), None)
        rest = [r for r in mine if r["arm"] in ("none", "fixed")]
        if sched is None or not rest:
            continue
        best = max(rest, key=lambda r: r["tokens_per_s"])
        out.append(("chapter.frontier.vllm_point_one" if n == 1 else "chapter.frontier.vllm_point",
                    {"users": n, "ratio": sched["tokens_per_s"] / best["tokens_per_s"], "best_arm": arm_code(best),
                     "tokens_per_s": sched["tokens_per_s"], "best_tokens_per_s": best["tokens_per_s"]}))
    return out


def _run(ctx: Context):
    return run_frontier(ctx.pair, list(ctx.grounded) or ctx.pool, acceptance=ctx.acceptance)


CHAPTER = Chapter("frontier", run=_run, figure=figure_frontier, button_id="run-frontier",
                  vllm=VllmPanel(result=vllm_frontier, figure=figure_frontier, notes=vllm_notes,
                                 recording=recorded_frontier), dial=True)
