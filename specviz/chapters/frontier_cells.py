"""The frontier's measurement: the arms, one class stepped to the end, the medians over rounds, and the
order the arms take turns in. Shared by the lesson's chapter (`specviz.chapters.frontier`, stepped in
its own thread) and `python -m specviz frontier` (through the shared scheduler).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

from specviz import lessons
from specviz.engine.budget import Budget
from specviz.engine.divergence import Divergence, DivergenceReport, first_difference, target_margins
from specviz.engine.policies import AdaptiveGoodput, AdaptiveVerification, FixedPolicy, make_policy
from specviz.engine.request import Knobs, Request

WARM_TOKENS = 4          # an untimed class at each size first: its first passes allocate caches and pick kernels
AV = AdaptiveVerification.name

# (arm, depth, users) -> one measured cell (with "outputs"); arm "warm-up": an untimed short class
Cell = Callable[[str, int, int], dict]
# (arms in order, users, round) -> one cell per arm, in that order
Round = Callable[[list[tuple[str, int]], int, int], list[dict]]


def tokens_per_user(users: int, max_new: int, class_tokens: int = 0) -> int:
    """Tokens each user asks for in a class of `users`: max_new, or more where the class is small."""
    return max(max_new, -(-class_tokens // max(users, 1)))



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
    budget = Budget(verify, padded=pair.target_cache is None, draft_seed=draft, learnt=pair.learnt)
    refs = stepped_references(pair, prompts, 4, 16)[0] if pair.synthetic is not None else None
    stepped_cell(pair, prompts, AV, depth, 4, 16, budget, refs)
    return budget


def stepped_references(pair, prompts: list[list[int]], users: int, max_new: int,
                     classes: int = 1) -> tuple[dict, float]:
    """A synthetic draft's references for `classes` classes of `users` (class j starts `users × j` places
    along the prompts, as the cells do): each decoded at depth 0 in one batch (EOS ignored, as the cells
    do), prompt → the target's own continuation; and the seconds it took."""
    t0 = time.perf_counter()
    refs: dict[tuple[int, ...], tuple[int, ...]] = {}
    for j in range(classes):
        mine = [prompts[(users * j + i) % len(prompts)] for i in range(users)]
        if all(tuple(p) in refs for p in mine):
            continue
        for p, out in zip(mine, stepped_cell(pair, mine, "none", 0, users, max_new)["outputs"]):
            refs.setdefault(tuple(p), tuple(out))
    return refs, time.perf_counter() - t0


def cell_result(arm: str, depth: int, users: int, outs: list[list[int]], totals: list, ends: list[float],
                wall: float, steps: int, drafted: int, verified: int) -> dict:
    """One cell's figures from its users' outputs, totals and finish times (seconds from the start)."""
    tokens = sum(len(o) for o in outs)
    acc = sum(t.accepted for t in totals)
    ver = sum(t.drafted for t in totals)
    per_user = [len(o) / e for o, e in zip(outs, ends) if e > 0]
    return {"arm": arm, "depth": depth, "users": users, "tokens": tokens, "wall_s": wall,
            "accepted_n": acc, "checked_n": ver, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "per_user_tokens_per_s": statistics.median(per_user) if per_user else 0.0,
            "acceptance_rate": acc / ver if ver else None,
            "accepted_length": tokens / max(1, sum(t.row_steps for t in totals)),
            "drafted_per_step": drafted / steps if steps else 0.0,
            "verified_per_step": verified / steps if steps else 0.0, "steps": steps, "outputs": outs}


def stepped_cell(pair, prompts: list[list[int]], arm: str, depth: int, users: int, max_new: int,
                 budget: Budget | None = None, references: dict | None = None, seed: int = 0) -> dict:
    """One class stepped in this thread: `users` one-row requests in one shared batch, to the end.
    `budget`: the adaptive-verification arm's (see warm_budget); other arms never read it. `references`:
    a synthetic draft's (user i is request seed `seed` + i, so every arm draws the same coins)."""
    eng = pair.engine(budget=budget, eos_ids=[])     # EOS ignored: every arm emits max_new tokens per user
    reqs = [Request([prompts[i % len(prompts)]], Knobs(depth, 1, policy_for(arm, depth)), max_new, seed=seed + i,
                    references=references) for i in range(users)]
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
    return {**cell_result(arm, depth, users, [r.outputs().get(0, []) for r in reqs], [r.totals for r in reqs],
                          [ends.get(r.id, wall) for r in reqs], wall, steps, drafted, verified),
            "realigned": int(getattr(eng.drafter, "realigned", 0))}


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
            round_of: Round | None = None, differing: list | None = None) -> tuple[list[dict], bool]:
    """Every arm at every class size, `repeats` rounds with the arms interleaved. Returns the median rows
    and whether every arm's outputs equal the no-speculation arm's, row for row. `on_cell(cell, rows)`
    hears each cell with the median rows so far. `round_of(order, users, r)`: runs round r's cells itself
    (the CLI interleaves the arms class by class); by default each arm's cell runs whole, in round r's
    order. `differing`, where given, gets (cell, the no-speculation arm's outputs) for each cell whose
    outputs are not those (`divergence_of` says whether each is a near-tie)."""
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
            odd = [c for c in group if c["outputs"] != ref]
            identical &= not odd
            if differing is not None:
                differing += [(c, ref) for c in odd]
            rows.append(median_row(group))
    return rows, identical


def divergence_of(model, device, prompt_of: Callable[[int], list[int]], differing: list) -> tuple:
    """(the DivergenceReport of every differing cell's rows against no speculation's, judged by the one
    near-tie rule of engine.divergence, each divergence's `row` its user's place in the cell; and each
    one's cell as (arm, depth, users)). `prompt_of(m)`: the prompt of a cell's m-th output. A cell's row
    repeated over rounds is judged once, and the target runs once per distinct first difference."""
    seen, found, where, margins = set(), [], [], {}
    for c, ref in differing:
        cell = (c["arm"], c["depth"], c["users"])
        for m, (a, b) in enumerate(zip(c["outputs"], ref)):
            pos = first_difference(a, b)
            if pos is None or (cell, m, tuple(a)) in seen:
                continue
            seen.add((cell, m, tuple(a)))
            mine, theirs = (a[pos] if pos < len(a) else None), (b[pos] if pos < len(b) else None)
            prefix = list(prompt_of(m)) + list(a[:pos])
            at = (tuple(prefix), mine, theirs)
            if at not in margins:
                margins[at] = target_margins(model, device, prefix, mine, theirs)
            found.append(Divergence(m, pos, mine, theirs, margins[at]))
            where.append(cell)
    return DivergenceReport(len(found), 0, tuple(found)), where


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


def stepped_round(pair, prompts: list[list[int]], order: list[tuple[str, int]], users: int, max_new: int,
                  classes: int, r: int, budget: Budget | None = None, references: dict | None = None) -> list[dict]:
    """Round r stepped in this thread, the arms taking turns class by class (each class's order a row of
    a Williams design), as `python -m specviz frontier` does through the scheduler: the machine's drift
    over seconds then meets every arm alike. Class j starts `users × j` places along the prompt list.
    Returns one cell per arm, in `order`, its classes summed (`class_walls` holds each class's seconds)."""
    parts: list[list[dict]] = [[] for _ in order]
    for j in range(classes):
        mine = [prompts[(users * j + i) % len(prompts)] for i in range(users)]
        for idx in williams_row(len(order), r * classes + j):
            arm, depth = order[idx]
            parts[idx].append(stepped_cell(pair, mine, arm, depth, users, max_new, budget if arm == AV else None,
                                           references, seed=users * j))
    return [_summed(cells) for cells in parts]


def _summed(cells: list[dict]) -> dict:
    """One arm's classes of a round as one cell: tokens over the summed seconds."""
    first = cells[0]
    wall, tokens, steps, acc, ver = (sum(c[k] for c in cells)
                                     for k in ("wall_s", "tokens", "steps", "accepted_n", "checked_n"))
    per_user = [c["per_user_tokens_per_s"] for c in cells]
    return {**first, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "accepted_n": acc, "checked_n": ver, "acceptance_rate": acc / ver if ver else None,
            "per_user_tokens_per_s": statistics.median(per_user), "steps": steps,
            "drafted_per_step": sum(c["drafted_per_step"] * c["steps"] for c in cells) / max(steps, 1),
            "verified_per_step": sum(c["verified_per_step"] * c["steps"] for c in cells) / max(steps, 1),
            "accepted_length": sum(c["accepted_length"] * c["steps"] for c in cells) / max(steps, 1),
            "outputs": [o for c in cells for o in c["outputs"]], "class_walls": [c["wall_s"] for c in cells],
            "classes": len(cells), "realigned": sum(c.get("realigned", 0) for c in cells)}
