"""The frontier's conclusion rules: adaptive verification against the best other arm at each class size,
within the noise band the cells themselves measured, and the cliff where a fixed depth falls below no
speculation.
"""
from __future__ import annotations

import math
import statistics

from specviz import lessons
from specviz.chapters.frontier_cells import AV, arm_code
from specviz.engine import divergence as rule

NOISE_FLOOR = 0.05       # the race chapter's ±5 %: two runs of one cell on a quiet 2-core CPU differ this much
# a band wider than this cannot tell "level" from a real gap of the size the lesson is about: such a class
# size is "too close to call here (±N %)", and no summary covers it
CLOSE_CALL = 0.10
# verified drafts per step within this share (or half a draft) of the best arm's: the same work
SAME_WORK = 0.10


def band(*rows: dict) -> float:
    """The noise band two cells are compared within: the larger spread of their own runs, at least
    NOISE_FLOOR."""
    return max([NOISE_FLOOR] + [r["noise"] for r in rows if r.get("noise") is not None])


def class_ratios(a: dict, b: dict) -> list[float]:
    """a's speed ÷ b's for every class the two rows ran in the same round (the same tokens, seconds apart),
    or [] without class timings."""
    wa, wb = a.get("class_walls"), b.get("class_walls")
    if not (wa and wb and [len(x) for x in wa] == [len(x) for x in wb]):
        return []
    return [y / x for ra, rb in zip(wa, wb) for x, y in zip(ra, rb) if x > 0]


def paired_band(ratios: list[float]) -> float:
    """paired_spread, at least NOISE_FLOOR: the band a comparison is judged within."""
    return max(NOISE_FLOOR, paired_spread(ratios))


def paired_spread(ratios: list[float]) -> float:
    """How far the median of a comparison's own ratios could be off, as measured: half the width of the
    distribution-free ~90 % interval of that median (the order statistics 0.82 √n places either side of
    it: from six ratios the four middle ones, so one preempted class never sets it; from sixty-four, a
    band that shrinks as the classes add up), relative to the median (NOISE_FLOOR without a median)."""
    xs = sorted(ratios)
    n, h = len(xs), max(1, math.floor(0.82 * math.sqrt(len(xs))))
    lo, hi = xs[max(0, n // 2 - h)], xs[min(n - 1, (n - 1) // 2 + h)]
    mid = statistics.median(xs)
    return (hi - lo) / 2 / mid if mid else NOISE_FLOOR


def paired(a: dict, b: dict) -> float | None:
    """a's speed ÷ b's, paired: the median over a's and b's runs of the same class of the same round
    where both rows hold each class's seconds (`class_walls`; the classes are the same tokens on every
    arm, so b's seconds ÷ a's is a's speed ÷ b's), else over their runs of the same round (None without
    matching runs). The arms take turns, so a pair shares the machine's drift that the two medians do
    not (two arms doing the same work read 0.89–1.03× as medians of 3 on a 2-core CPU). A round spans a
    minute at 64 users; class j of every arm ran within seconds of the others."""
    pairs = class_ratios(a, b)
    if pairs:
        return statistics.median(pairs)
    ra, rb = a.get("runs") or [], b.get("runs") or []
    if len(ra) != len(rb) or not ra or not all(rb):
        return None
    return statistics.median(x / y for x, y in zip(ra, rb))


def verdict(ratio: float, width: float) -> str:
    """"ahead" / "behind" outside the band; inside it "level" where the band is narrow enough to say so,
    else "unclear" (too close to call at this band)."""
    if ratio > 1 + width:
        return "ahead"
    if ratio < 1 - width:
        return "behind"
    return "level" if width <= CLOSE_CALL else "unclear"


def class_lines(rows: list[dict]) -> list[dict]:
    """Per class size: adaptive verification against the best of no speculation and every fixed depth."""
    out = []
    for n in sorted({r["users"] for r in rows}):
        mine = [r for r in rows if r["users"] == n]
        best = max((r for r in mine if r["arm"] in ("none", "fixed")), key=lambda r: r["tokens_per_s"])
        av = next((r for r in mine if r["arm"] == AV), None)
        if av is None or not best["tokens_per_s"]:
            continue
        # where both ran the same classes in the same rounds, the verdict reads those class ratios (paired:
        # each pair met the machine's drift alike) within their own spread; else the medians and the cells'
        ratios = class_ratios(av, best)
        by_medians = av["tokens_per_s"] / best["tokens_per_s"]
        how = "paired" if len(ratios) >= 2 else "medians"
        ratio, width = (statistics.median(ratios), paired_band(ratios)) if how == "paired" else \
            (by_medians, band(av, best))
        drafted = av.get("drafted_most", av["drafted_per_step"])
        # drafting nothing, adaptive verification did no speculation's work to the token: where that was the
        # best arm, any gap is two timings of the same work, never "ahead" or "behind" (the chapter once
        # read 1.14× outside a ±5 % band at 4 users on identical work)
        same = not drafted and best["arm"] == "none"
        out.append({"users": n, "best_arm": arm_code(best), "best_tokens_per_s": best["tokens_per_s"],
                    "av_tokens_per_s": av["tokens_per_s"], "ratio": ratio, "band": width, "ratio_how": how,
                    "by_medians": by_medians,
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




def _same_key(line: dict) -> str:
    """The same work timed twice: level inside the band; outside it, the gap measures this run's own noise,
    which the other verdicts' bands did not catch."""
    return "row_same" if abs(line["ratio"] - 1) <= line["band"] else "row_same_noisy"


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


def frontier_conclusions(rows: list[dict], identical: bool, divergence=None) -> tuple[dict, str, list[str], list[dict]]:
    """(values, main key, every key in order, one values dict per key): a line per class size, the
    overall verdict, the cliff (or its absence), and whether every arm's tokens were the same: where they
    were not, `divergence` (frontier_cells.divergence_of's report) says whether each was a near-tie."""
    lines = class_lines(rows)
    behind = [x for x in lines if x["verdict"] == "behind"]
    if behind:
        worst = min(behind, key=lambda x: x["ratio"])
        key = _why_behind(worst)
        values = {**worst, "sizes": lessons.Listed(str(x["users"]) for x in behind)}
    else:
        key, values = _summary(lines)
    # where adaptive verification drafted nothing, "verified 0.0 of 0.0 drafted slots" says nothing: its line
    # says instead that it decoded as no speculation does, and why
    keys = [_same_key(x) if x["same_work"] else f"row_{x['verdict']}" + ("" if x["drafted"] else "_undrafted")
            for x in lines] + [key]
    vals = list(lines) + [values]
    fall = cliff(rows)
    keys.append("conclusion_cliff" if fall else "conclusion_no_cliff")
    vals.append(fall or {"users": max((r["users"] for r in rows), default=0)})
    key_tokens, tokens = _tokens(identical, divergence)
    keys.append(key_tokens)
    vals.append(tokens)
    return values, key, keys, vals


def _tokens(identical: bool, divergence) -> tuple[str, dict]:
    """The tokens' sentence: all the same; differing only at near-ties (bf16 on a GPU splits some another
    way on another path), with the widest margin; or a bug."""
    if identical:
        return "conclusion_identical", {}
    if divergence is None or not divergence.lossless or not divergence.divergences:
        return "conclusion_not_identical", {}
    margin = max(d.margins.top1_minus_top2 for d in divergence.divergences)
    return "conclusion_near_ties", {"rows": len(divergence.divergences), "margin": f"{margin:.3g}",
                                    "rule": rule.NEAR_TIE}


def _summary(lines: list[dict]) -> tuple[str, dict]:
    """Nothing behind: "on the frontier at every class size" only where every size's band is within
    CLOSE_CALL (the sentence states the widest); else which sizes were too close to call, and at what band."""
    ahead = [str(x["users"]) for x in lines if x["verdict"] == "ahead"]
    unclear = [x for x in lines if x["verdict"] == "unclear"]
    # a class where adaptive verification drafted nothing did no speculation's own work: level whatever its
    # band, which the sentences leave out ("where the arms did different work")
    widest = max((x["band"] for x in lines if not x["same_work"]), default=NOISE_FLOOR)
    values = {"sizes": lessons.Listed(str(x["users"]) for x in lines), "ahead": lessons.Listed(ahead),
              "band": widest}
    if unclear:
        clear = [str(x["users"]) for x in lines if x["verdict"] != "unclear"]
        return "conclusion_frontier_unclear", {**values, "unclear": lessons.Listed(str(x["users"]) for x in unclear),
                                               "clear": lessons.Listed(clear), "band": max(x["band"] for x in unclear)}
    return ("conclusion_frontier" if ahead else "conclusion_frontier_level"), values
