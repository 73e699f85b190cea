"""Chapter: the frontier. Throughput against per-user speed as the class grows, one line per arm (no
speculation, fixed depths, adaptive verification), and the accepted length per arm beside it.

The class workload: `users` requests of one prompt each (the input-grounded examples, like the first
Run's), every user a separate request in one shared batch, EOS ignored so every arm emits the same tokens.
Here the batch is stepped in the lesson's own thread through the engine's `step()` (the loop the app's
scheduler runs; the lesson holds the device exclusively, so the scheduler's thread cannot run beside it).
`python -m specviz frontier` measures the same cells through the shared scheduler, and reuses the
arms, the medians and the conclusion rules written here.

Honest comparison: every cell runs `repeats` times with the arms interleaved inside each round, in an
order that changes so that no arm always follows the same one (`williams_row`), and a cell's noise is its
spread (max − min) ÷ median. A winner is named only outside the band (the larger of the two cells' noise
and NOISE_FLOOR); inside it the arms are "level".

Measured: see CHAPTER_SIZE below for the lesson's size and docs/BENCHMARKS.md for its time.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz import lessons
from specviz.chapters.base import Chapter, Context, Result, VllmPanel
from specviz.chapters.common import finished, settings_of, snapshot
from specviz.chapters.plotting import PLAIN, POLICY_COLOURS, labels_for, styled
from specviz.engine.budget import Budget
from specviz.engine.policies import AdaptiveGoodput, AdaptiveVerification, FixedPolicy, make_policy
from specviz.engine.profiling import pair_profiles
from specviz.engine.request import Knobs, Request
from specviz.engine.torchmode import inference_steps
from specviz.hardware.profiles import ASSETS

FRONTIER_DIR = ASSETS / "frontier"      # `frontier --engine vllm` recordings (recorded.json, copied here)

WARM_TOKENS = 4          # an untimed class at each size first: its first passes allocate caches and pick kernels
NOISE_FLOOR = 0.05       # the race chapter's ±5 %: two runs of one cell on a quiet 2-core CPU differ this much
AV = AdaptiveVerification.name
# The lesson's size: it must finish within a minute in the app on a 2-core CPU (one model thread) with
# the offline SmolLM2-135M; 16 users already reach the cliff there. One fixed depth, the deepest (the one
# that bends back furthest, and adaptive verification's k): a second depth takes the chapter past a minute
# on a slower 2-core CPU. Measured: docs/BENCHMARKS.md.
# A small class gets more tokens per user (class_tokens in all, at least max_new each): a 10-token cell
# of one user is 3-4 steps, where one lucky step is 25 % of the throughput.
CHAPTER_SIZE = dict(users=(1, 4, 16), depths=(8,), max_new=10, repeats=2, class_tokens=40)


def tokens_per_user(users: int, max_new: int, class_tokens: int = 0) -> int:
    """Tokens each user asks for in a class of `users`: max_new, or more where the class is small."""
    return max(max_new, -(-class_tokens // max(users, 1)))

# (arm, depth, users) -> one measured cell (with "outputs"); arm "warm-up": an untimed short class
Cell = Callable[[str, int, int], dict]
# (arms in order, users, round) -> one cell per arm, in that order
Round = Callable[[list[tuple[str, int]], int, int], list[dict]]


def arms(depths, with_adaptive: bool = False) -> list[tuple[str, int]]:
    """No speculation, each fixed depth, adaptive verification with the largest depth as its k."""
    ks = sorted({int(d) for d in depths if d > 0})
    out = [("none", 0)] + [("fixed", d) for d in ks] + [(AV, max(ks))]
    return out + ([(AdaptiveGoodput.name, max(ks))] if with_adaptive else [])


def policy_for(arm: str, depth: int):
    """A fresh policy for one request (policies keep per-request state); the other arms run the fixed one."""
    if arm == AdaptiveGoodput.name:
        return make_policy(arm, max_depth=depth)
    return make_policy(AV if arm == AV else FixedPolicy.name)


def arm_code(row: dict) -> str:
    """"none", "fixed:4", "adaptive-verification:8": how a result names an arm (arm_name reads it)."""
    return "none" if row["arm"] == "none" else f"{row['arm']}:{row['depth']}"


def arm_name(lang: str, code: str) -> str:
    """An arm's name for readers, from its code."""
    arm, _, depth = str(code).partition(":")
    key = {"none": "arm_none", "fixed": "arm_fixed", AV: "arm_av", "schedule": "arm_schedule"}.get(arm, "arm_adaptive")
    return lessons.text(lang, f"chapter.frontier.{key}", depth=int(depth or 0))


def warm_budget(pair, prompts: list[list[int]], depth: int, profile) -> Budget:
    """The adaptive-verification arm's budget, seeded from the warm-up profile (verify cost by tokens,
    draft cost by rows) and warmed on one short class, then kept across every cell: the app's engine
    is as long-lived (it serves the class all lesson), so its acceptance tables and cost tables have
    seen earlier requests. A fresh budget per 12-token cell would measure its first steps of learning."""
    verify, draft = profile or (None, None)
    budget = Budget(verify, padded=pair.target_cache is None, draft_seed=draft)
    stepped_cell(pair, prompts, AV, depth, 4, 16, budget)
    return budget


def cell_result(arm: str, depth: int, users: int, outs: list[list[int]], totals: list, ends: list[float],
                wall: float, steps: int, drafted: int, verified: int) -> dict:
    """One cell's figures from its users' outputs, totals and finish times (seconds from the start)."""
    tokens = sum(len(o) for o in outs)
    acc = sum(t.accepted for t in totals)
    ver = sum(t.drafted for t in totals)
    per_user = [len(o) / e for o, e in zip(outs, ends) if e > 0]
    return {"arm": arm, "depth": depth, "users": users, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "per_user_tokens_per_s": statistics.median(per_user) if per_user else 0.0,
            "acceptance_rate": acc / ver if ver else None,
            "accepted_length": tokens / max(1, sum(t.row_steps for t in totals)),
            "drafted_per_step": drafted / steps if steps else 0.0,
            "verified_per_step": verified / steps if steps else 0.0, "steps": steps, "outputs": outs}


def stepped_cell(pair, prompts: list[list[int]], arm: str, depth: int, users: int, max_new: int,
                 budget: Budget | None = None) -> dict:
    """One class stepped in this thread: `users` one-row requests in one shared batch, to the end.
    `budget`: the adaptive-verification arm's (see warm_budget); other arms never read it."""
    eng = pair.engine(budget=budget, eos_ids=[])     # EOS ignored: every arm emits max_new tokens per user
    reqs = [Request([prompts[i % len(prompts)]], Knobs(depth, 1, policy_for(arm, depth)), max_new)
            for i in range(users)]
    for r in reqs:
        eng.add(r)
    ends: dict[int, float] = {}
    steps = drafted = verified = 0
    t0 = time.perf_counter()
    while len(ends) < len(reqs):
        out = eng.step()
        if out:
            ev = out[0][1]              # the shared figures are the same in every request's event
            steps, drafted, verified = steps + 1, drafted + ev.slots_drafted, verified + ev.slots_verified
        now = time.perf_counter() - t0
        ends.update({r.id: now for r in reqs if r.done and r.id not in ends})
        if not out and not eng.requests:
            break
    wall = time.perf_counter() - t0
    return cell_result(arm, depth, users, [r.outputs().get(0, []) for r in reqs], [r.totals for r in reqs],
                       [ends.get(r.id, wall) for r in reqs], wall, steps, drafted, verified)


def median_row(cells: list[dict]) -> dict:
    """The median of repeated cells, with their spread as the noise band (None from one run)."""
    tps = [c["tokens_per_s"] for c in cells]
    mid = statistics.median(tps)
    row = {k: v for k, v in min(cells, key=lambda c: abs(c["tokens_per_s"] - mid)).items() if k != "outputs"}
    row["tokens_per_s"] = mid
    row["per_user_tokens_per_s"] = statistics.median(c["per_user_tokens_per_s"] for c in cells)
    row["noise"] = (max(tps) - min(tps)) / mid if mid and len(cells) > 1 else None
    row["repeats"] = len(cells)
    row["drafted_most"] = max(c.get("drafted_per_step") or 0.0 for c in cells)   # 0: no repeat drafted
    row["runs"] = tps          # in round order: two arms' runs of one round ran minutes apart at most
    # per round, each class's seconds (the frontier command's rounds, which interleave the arms class by
    # class): class j of two arms ran seconds apart, so `paired` compares those
    walls = [c.get("class_walls") for c in cells]
    if all(walls):
        row["class_walls"] = walls
    else:
        row.pop("class_walls", None)
    return row


def williams_row(n: int, r: int) -> list[int]:
    """Round r's order of n arms, a row of a Williams design: 0, 1, n-1, 2, n-2, … shifted by r (mod n).
    For even n, over n rounds every arm follows every other exactly once; for odd n the rows alternate
    with their mirror image (shifting every second round), which takes 2n rounds to cover every pair."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    out = [(x + r // (1 + n % 2)) % n for x in base]
    return out[::-1] if n % 2 and r % 2 else out


def measure(cell: Cell, users, depths, repeats: int = 1, with_adaptive: bool = False,
            on_cell: Callable[[dict, list[dict]], None] | None = None,
            round_of: Round | None = None) -> tuple[list[dict], bool]:
    """Every arm at every class size, `repeats` rounds with the arms interleaved. Returns the median rows
    and whether every arm's outputs equal the no-speculation arm's, row for row. `on_cell(cell, rows)`
    hears each cell with the median rows so far. `round_of(order, users, r)`: runs round r's cells itself
    (the CLI interleaves the arms class by class); by default each arm's cell runs whole, in round r's
    order."""
    rows, identical = [], True
    for n in users:
        cells: dict[tuple[str, int], list[dict]] = {}
        cell("warm-up", max(depths), n)           # untimed: the first pass at a new batch shape allocates
        order = arms(depths, with_adaptive)
        for r in range(repeats):
            for key, c in zip(order, (round_of or _whole_cells(cell))(order, n, r)):
                cells.setdefault(key, []).append(c)
                if on_cell:
                    on_cell(c, rows + [median_row(g) for g in cells.values()])
        ref = cells[("none", 0)][0]["outputs"]
        for group in cells.values():
            identical &= all(c["outputs"] == ref for c in group)
            rows.append(median_row(group))
    return rows, identical


def _whole_cells(cell: Cell) -> Round:
    """A round of whole cells. A cell runs slower after a heavy one (measured at 64 users: 0.82× after
    k = 8), so no arm may always follow the same one: round r's order is a row of a Williams design, where
    over len(order) rounds (twice that for an odd count) every arm follows every other. (Rotating one order
    kept each arm's predecessor: adaptive verification always came after k = 8.) Cells come back in
    `order`."""
    def run(order, n, r):
        out: dict[int, dict] = {}
        for i in williams_row(len(order), r):
            out[i] = cell(*order[i], n)
        return [out[i] for i in range(len(order))]
    return run


# --- the conclusion ----------------------------------------------------------------------------------
def band(*rows: dict) -> float:
    """The noise band two cells are compared within: the larger measured spread, at least NOISE_FLOOR."""
    return max([NOISE_FLOOR] + [r["noise"] for r in rows if r.get("noise") is not None])


def paired(a: dict, b: dict) -> float | None:
    """a's speed ÷ b's, paired: the median over a's and b's runs of the same class of the same round
    where both rows hold each class's seconds (`class_walls`; the classes are the same tokens on every
    arm, so b's seconds ÷ a's is a's speed ÷ b's), else over their runs of the same round (None without
    matching runs). The arms take turns, so a pair shares the machine's drift that the two medians do
    not (two arms doing the same work read 0.89–1.03× as medians of 3 on a 2-core CPU). A round spans a
    minute at 64 users; class j of every arm ran within seconds of the others. The verdict still uses
    the medians and the band."""
    wa, wb = a.get("class_walls"), b.get("class_walls")
    if wa and wb and [len(x) for x in wa] == [len(x) for x in wb]:
        pairs = [y / x for ra, rb in zip(wa, wb) for x, y in zip(ra, rb) if x > 0]
        return statistics.median(pairs) if pairs else None
    ra, rb = a.get("runs") or [], b.get("runs") or []
    if len(ra) != len(rb) or not ra or not all(rb):
        return None
    return statistics.median(x / y for x, y in zip(ra, rb))


def verdict(ratio: float, width: float) -> str:
    return "ahead" if ratio > 1 + width else "behind" if ratio < 1 - width else "level"


def class_lines(rows: list[dict]) -> list[dict]:
    """Per class size: adaptive verification against the best of no speculation and every fixed depth."""
    out = []
    for n in sorted({r["users"] for r in rows}):
        mine = [r for r in rows if r["users"] == n]
        best = max((r for r in mine if r["arm"] in ("none", "fixed")), key=lambda r: r["tokens_per_s"])
        av = next((r for r in mine if r["arm"] == AV), None)
        if av is None or not best["tokens_per_s"]:
            continue
        ratio, width = av["tokens_per_s"] / best["tokens_per_s"], band(av, best)
        drafted = av.get("drafted_most", av["drafted_per_step"])
        # drafting nothing, adaptive verification did no speculation's work to the token: where that was the
        # best arm, any gap is two timings of the same work, never "ahead" or "behind" (the chapter once
        # read 1.14× outside a ±5 % band at 4 users on identical work)
        same = not drafted and best["arm"] == "none"
        out.append({"users": n, "best_arm": arm_code(best), "best_tokens_per_s": best["tokens_per_s"],
                    "av_tokens_per_s": av["tokens_per_s"], "ratio": ratio, "band": width,
                    "paired": paired(av, best), "same_work": same,
                    "verdict": "level" if same else verdict(ratio, width), "verified": av["verified_per_step"],
                    "drafted": drafted, "best_verified": best["verified_per_step"]})
    return out


def cliff(rows: list[dict]) -> dict | None:
    """The deepest fall of a fixed depth below no speculation (outside the band), at any class size."""
    worst = None
    for r in rows:
        none = next((x for x in rows if x["users"] == r["users"] and x["arm"] == "none"), None)
        if r["arm"] != "fixed" or none is None or not none["tokens_per_s"]:
            continue
        ratio = r["tokens_per_s"] / none["tokens_per_s"]
        if ratio < 1 - band(r, none) and (worst is None or ratio < worst["ratio"]):
            worst = {"users": r["users"], "cliff_arm": arm_code(r), "ratio": ratio, "band": band(r, none)}
    return worst


# verified drafts per step within this share (or half a draft) of the best arm's: the same work
SAME_WORK = 0.10


def _why_behind(line: dict) -> str:
    """Why adaptive verification fell behind, from what it verified against the best arm: about as many
    drafts a step (the same work, so the gap is timing: the machine's drift, or the budget's bookkeeping;
    at 16 users it verified 0.0 like no speculation and still read 0.95×), fewer (a pessimistic survival
    estimate), or more (verify work the spare compute could not pay for; where no speculation was best,
    any at all)."""
    v, best = line["verified"], line["best_verified"]
    if abs(v - best) <= max(0.5, SAME_WORK * best):
        return "conclusion_behind_same"
    if line["best_arm"] == "none":
        return "conclusion_behind_none"
    return "conclusion_behind_few" if v < best else "conclusion_behind_many"


def frontier_conclusions(rows: list[dict], identical: bool) -> tuple[dict, str, list[str], list[dict]]:
    """(values, main key, every key in order, one values dict per key): a line per class size, the
    overall verdict, the cliff (or its absence), and whether every arm's tokens were the same."""
    lines = class_lines(rows)
    behind = [x for x in lines if x["verdict"] == "behind"]
    if behind:
        worst = min(behind, key=lambda x: x["ratio"])
        key = _why_behind(worst)
        values = {**worst, "sizes": lessons.Listed(str(x["users"]) for x in behind)}
    else:
        ahead = [str(x["users"]) for x in lines if x["verdict"] == "ahead"]
        key = "conclusion_frontier" if ahead else "conclusion_frontier_level"
        values = {"sizes": lessons.Listed(str(x["users"]) for x in lines), "ahead": lessons.Listed(ahead)}
    # where adaptive verification drafted nothing, "verified 0.0 of 0.0 drafted slots" says nothing: its line
    # says instead that it decoded as no speculation does, and why
    keys = ["row_same" if x["same_work"] else f"row_{x['verdict']}" + ("" if x["drafted"] else "_undrafted")
            for x in lines] + [key]
    vals = list(lines) + [values]
    fall = cliff(rows)
    keys.append("conclusion_cliff" if fall else "conclusion_no_cliff")
    vals.append(fall or {"users": max((r["users"] for r in rows), default=0)})
    keys.append("conclusion_identical" if identical else "conclusion_not_identical")
    vals.append({})
    return values, key, keys, vals


# --- the experiment ----------------------------------------------------------------------------------
@inference_steps
def run_frontier(pair, prompts: list[list[int]], users=CHAPTER_SIZE["users"], depths=CHAPTER_SIZE["depths"],
                 max_new: int = CHAPTER_SIZE["max_new"], repeats: int = CHAPTER_SIZE["repeats"],
                 class_tokens: int = CHAPTER_SIZE["class_tokens"]) -> Iterator[Result]:
    """The frontier on the loaded pair: a warm-up, the cost profile adaptive verification starts from,
    then every cell (one yield each, never inside a timed cell)."""
    users, prompts = sorted({int(u) for u in users}), [list(p) for p in prompts]
    settings = settings_of(pair, users=users, depths=sorted(set(depths)), repeats=repeats, prompts=len(prompts),
                           tokens_per_user={str(n): tokens_per_user(n, max_new, class_tokens) for n in users})
    extra = {"identical": True}
    yield snapshot("frontier", pair, settings, 0.0, [], **extra)
    stepped_cell(pair, prompts, "fixed", max(depths), 2, 4)          # warm-up: allocator, kernels
    budget = warm_budget(pair, prompts, max(depths), pair_profiles(pair, quick=True))
    total, count = len(users) * len(arms(depths)) * repeats, [0]

    def cell(arm, d, n):
        if arm == "warm-up":
            return stepped_cell(pair, prompts, "fixed", d, n, WARM_TOKENS)
        return stepped_cell(pair, prompts, arm, d, n, tokens_per_user(n, max_new, class_tokens),
                            budget if arm == AV else None)

    def heard(c, rows):
        count[0] += 1
    # each cell is measured alone; the snapshots are built between class sizes, outside any timing
    for same, rows in _cells(cell, users, depths, repeats, heard):
        if same is None:
            values, key, keys, vals = frontier_conclusions(rows, extra["identical"])
            yield finished(snapshot("frontier", pair, settings, 1.0, rows, **extra), values, key, keys, vals)
            return
        extra["identical"] &= same
        yield snapshot("frontier", pair, settings, count[0] / total, rows, **extra)


def _cells(cell: Cell, users, depths, repeats: int, heard) -> Iterator[tuple[bool | None, list[dict]]]:
    """`measure`, one class size at a time so the page can draw between them: yields (identical so far,
    rows) after each class size, then (None, every row)."""
    rows: list[dict] = []
    for n in users:
        part, same = measure(cell, [n], depths, repeats, on_cell=heard)
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


def figure_frontier(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Left: one line per arm through its class sizes, per-user tokens/s across and total tokens/s up (a
    fixed depth that bends back turns down and left). Right: accepted length per arm against users."""
    L = labels_for("frontier", labels)
    lang = L.get("_lang", lessons.DEFAULT_LANG)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.16,
                        subplot_titles=(L["panel_frontier"], L["panel_accepted"]))
    fig.update_annotations(font_size=12)      # the panel titles: two short lines each, readable on a phone
    for i, (code, pts) in enumerate(_lines(result.get("table", [])).items()):
        name = lessons.isolate_rtl(arm_name(lang, code))
        colour, bold = _colour(code, i), code.startswith(AV)
        line = dict(color=colour, width=4 if bold else 2, dash="dot" if code.startswith("fixed") else "solid")
        tags = [L["users_tag"].format(users=p["users"]) for p in pts]
        # class sizes written on the adaptive arm only (every arm has the same sizes; hover names them all)
        fig.add_trace(go.Scatter(x=[p["per_user_tokens_per_s"] for p in pts], y=[p["tokens_per_s"] for p in pts],
                                 mode="lines+markers+text" if bold else "lines+markers", name=name,
                                 legendgroup=code, line=line, text=tags,
                                 textposition="top center", textfont=dict(size=10),
                                 hovertemplate=name + ": %{text}, %{y:.1f} " + L["axis_total"] + ", %{x:.1f} "
                                 + L["axis_per_user"] + "<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[p["users"] for p in pts], y=[p["accepted_length"] for p in pts],
                                 mode="lines+markers", name=name, legendgroup=code, showlegend=False, line=line,
                                 hovertemplate=name + ": %{y:.2f}<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text=L["axis_per_user"], row=1, col=1)
    fig.update_yaxes(title_text=L["axis_total"], row=1, col=1)
    sizes = sorted({r["users"] for r in result.get("table", [])})
    fig.update_xaxes(title_text=L["axis_users"], type="log", tickvals=sizes, ticktext=[str(n) for n in sizes],
                     row=1, col=2)
    fig.update_yaxes(title_text=L["axis_accepted"], row=1, col=2)
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


def recorded_frontier(folder=FRONTIER_DIR) -> RecordedFrontier | None:
    """The shipped vLLM frontier with the most class sizes (ties: the newest by name), or None. A file
    that does not read as one is skipped: the lesson shows what it can."""
    best = None
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            rec = RecordedFrontier(str(d["engine_version"]), str(d["device"]), str(d["command"]),
                                   tuple(dict(r) for r in d["rows"]))
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
        out.append(("chapter.frontier.vllm_point",
                    {"users": n, "ratio": sched["tokens_per_s"] / best["tokens_per_s"], "best_arm": arm_code(best),
                     "tokens_per_s": sched["tokens_per_s"], "best_tokens_per_s": best["tokens_per_s"]}))
    return out


def _run(ctx: Context):
    return run_frontier(ctx.pair, list(ctx.grounded) or ctx.pool)


CHAPTER = Chapter("frontier", run=_run, figure=figure_frontier, button_id="run-frontier", dial=True,
                  vllm=VllmPanel(result=vllm_frontier, figure=figure_frontier, notes=vllm_notes,
                                 recording=recorded_frontier))
