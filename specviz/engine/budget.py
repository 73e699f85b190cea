"""Adaptive verification's planner: verify only the draft slots likely to survive (DSpark, vLLM's
`enable_adaptive_verification`), a budget chosen per step over the whole batch.

Every drafted slot (row r, position j) has a survival probability S(r, j) (`specviz.engine.acceptance`).
The step verifies a budget of B slots, the B with the highest survival over the whole batch. Because S
only falls along a row, those B slots are a prefix of each row's draft: position 5 of a confident row can
beat position 1 of an unsure one, and a row may verify nothing and decode one token. B is chosen as

    B* = argmax_B (rows + Σ_{top B} S) ÷ (draft_s + overhead_s + verify_s(rows + B)),

expected tokens over expected seconds, from cost tables measured on this machine (`specviz.engine.costs`).

Whose progress counts. That ratio is the batch's rate while every token any row gains brings nearer the
end of some request that others wait for. When nobody waits, a batch ends with its last row, and past the
knee a row that runs ahead of it only moves work from later passes into this one. So then the step is
planned for the last row (`_class_plan`): it moves l places further than plain decoding iff every row
fewer than l places ahead of it keeps that many of its drafts; the plan verifies, level by level, the
drafts that move it, and picks the level with the most progress per second. Below the knee (a token more
in every row costs at most `FREE_SHARE` more) a row running ahead costs the class nothing, so there the
per-slot rule decides too.

Exactness. Greedy rows are exact whatever is verified (the target's argmax decides). A sampled row with a
model draft is exact only if the decision to verify position j never looks at the token drawn at j or
after it; the top-B choice of this step does (S(r, j+1) depends on d_j). So a sampled model row verifies
the positions whose survival clears the cut-off *of the previous step* (`cutoff`). Keyed drafts (n-gram,
synthetic) are a fixed function of the context, so every row may use this step's B*.

How deep rows draft: a free draft drafts the full depth, except where no plan could verify any draft
whatever it is (`could_verify`); a draft that costs a pass per position, as `DraftDepth` decides.

Ownership: one thread at a time: the engine's that steps the batch, or a benchmark arm's budget handed from
one engine to the next (never two at once). What it shares with the pair's other engines it shares through
`specviz.engine.learnt`, under a lock.
"""
from __future__ import annotations

from dataclasses import dataclass

from specviz.engine.acceptance import Hindsight, Survival
from specviz.engine.costs import CostTable, RowCosts
from specviz.engine.draftdepth import DraftDepth

BASE_EVERY = 64          # steps before the pass with no drafts (tokens = rows) is measured again …
BASE_MARGIN = 1.15       # … when B* promised less than this × the rate of verifying nothing
# Below the knee (a token more in every row costs at most this share more: the knee chapter's flat part)
# every row's drafts count (the slot plan); past it, the last row's plan. The last row's plan looks one
# step ahead: a small class whose pass is still nearly flat verified a fifth of what a fixed depth did
# there and fell behind it, where rows that ran ahead would have left cheaper passes to the rest.
FREE_SHARE = 0.25
# A budget that verifies nothing at a batch size measures nothing above it, so a few slow readings there
# (a busy moment) kept drafting off for whole cells. After RETRY_FIRST such steps in a row it forgets what it
# measured above that size (the warm-up profile and optimism price it again); a retry that ends in another
# shut-off doubles the wait, up to RETRY_MAX, and as many steps that verify drafts bring it back.
RETRY_FIRST = 16
RETRY_MAX = 256


@dataclass(frozen=True)
class StepContext:
    """What the budget needs to know about a step's rows, in batch order."""

    rows: int                  # rows in the batch
    requested: list[int]       # per row: the depth its policy asked for
    room: list[int]            # per row: tokens it may still emit
    budgeted: list[bool]       # per row: under this budget (adaptive verification)
    sampled: list[bool]        # per row: temperature > 0
    waiting: bool              # requests wait for room in the batch
    seqs: list[list[int]]      # per row: its tokens so far


@dataclass(frozen=True)
class DraftPlan:
    """How the drafter drafts this step."""

    depths: list[int]                       # per row: drafts to propose
    floors: list[float | None] | None = None   # per row: stop once the draft's running confidence is below
    scores: bool = False                    # ask a model drafter for its confidences


@dataclass(frozen=True)
class Selection:
    """What the budget decided in one step."""

    lengths: list[int]         # per row: drafts offered to the verify pass
    drafted: int               # draft slots the drafter proposed, all rows
    verified: int              # of which verified
    budget: int                # B* (the slots chosen by this step's argmax; sampled model rows aside)


def class_gaps(remaining: list[int], survivals: dict[int, list[float]]) -> dict[int, int] | None:
    """Per budgeted row, how many tokens fewer it has left than the row with the most (0: on the batch's
    last place, ties included); None where no budgeted row is within reach of it."""
    if not remaining or not survivals:
        return None
    top = max(remaining)
    return {i: top - remaining[i] for i in survivals}


def _clip(depths: list[int], room: list[int]) -> list[int]:
    """A row never drafts past its token limit: a step emits at most k + 1 tokens."""
    return [max(0, min(d, n - 1)) for d, n in zip(depths, room)]


class Budget:
    """The batch-wide verification budget (see the module docstring)."""

    def __init__(self, verify_seed: dict[int, float] | None = None, padded: bool = False,
                 draft_seed: dict[int, float] | None = None, learnt=None):
        """`learnt`: the pair's shared acceptance tables (`specviz.engine.learnt.Learnt`) to start from
        and teach; None keeps every table this budget's own."""
        # seconds by tokens per verify pass: real tokens where the forward skips holes (the fast path),
        # rows × (longest row + 1) where it multiplies the padding too (the stock modules)
        self.verify = RowCosts(verify_seed)
        self.padded = padded
        self.overhead = CostTable()        # seconds outside the forwards, by rows, in steps that verified drafts
        self.overhead_plain = CostTable()  # … and in steps that verified none (no acceptance, no holes)
        self.survival = Survival(learnt)
        self.drafting = DraftDepth(self.verify, self.overhead, draft_seed)
        self.cutoff = 0.0                  # survival of the last slot chosen in the previous step
        self._base_age: dict[int, int] = {}   # rows → steps since a pass of exactly `rows` tokens was timed
        self._retries = Retries()

    # --- before drafting ---------------------------------------------------------------------------
    def plan_drafts(self, ctx: StepContext, drafter) -> DraftPlan:
        """Per row, how deep it drafts: its policy's depth, or for rows under this budget the budget's."""
        depths = list(ctx.requested)
        if not any(ctx.budgeted):
            return DraftPlan(_clip(depths, ctx.room))
        if drafter.free:
            if all(ctx.budgeted) and not self.could_verify(ctx.room, ctx.waiting, max(depths), drafter.keys):
                depths = [0] * ctx.rows       # no plan could verify a draft: draft none
            return DraftPlan(_clip(depths, ctx.room))
        backlog = drafter.backlogs(ctx.seqs)
        catchup = min((n for n, b in zip(backlog, ctx.budgeted) if b), default=0)
        chosen: dict[int, int] = {}           # the budget's depth, once per requested depth
        for i, b in enumerate(ctx.budgeted):
            if b:
                if depths[i] not in chosen:
                    chosen[depths[i]] = self.drafting.choose(depths[i], ctx.rows, catchup)
                depths[i] = chosen[depths[i]]
        depths = _clip(depths, ctx.room)
        if self.drafting.probing:             # a probe drafts past the survival stop, in one row
            return DraftPlan(_probe_one(depths, ctx.budgeted, backlog), None, True)
        floor = self.drafting.floor(self.cutoff)
        return DraftPlan(depths, [floor if b else None for b in ctx.budgeted], True)

    def could_verify(self, remaining: list[int], waiting: bool, depth: int, keys=(1, 2, 3)) -> bool:
        """Before drafting a free draft, every row under this budget: could the last row's plan verify any
        level, whatever the drafts turn out to be? Each row's survival at a position is at most the best any
        key has there, so level l succeeds with probability at most the product of those bounds over the
        rows it needs; if even that progress, priced at the cheapest overhead, never beats verifying nothing,
        the step drafts nothing and costs what plain decoding's does. The answer depends only on the costs,
        the tables and the rows' lengths, never on a draft (exactness: a depth chosen from the past)."""
        rows = len(remaining)
        if waiting or not rows or not self.verify or depth <= 0 or self._below_knee(rows, rows):
            return True
        verify = self.verify.table(rows)
        ovh = [t.at(rows) for t in (self.overhead, self.overhead_plain) if t]
        plain_s = self.overhead_plain.at(rows) if self.overhead_plain else (ovh[0] if ovh else 0.0)
        base = 1.0 / max(plain_s + verify.explore(rows), 1e-9)
        cheapest = min(ovh, default=0.0)
        best = self.survival.best_keyed(depth, keys)
        top = max(remaining)
        gaps = [top - r for r in remaining]
        progress = 1.0
        for level in range(1, depth + 1):
            need = [level - g for g in gaps if g < level]
            if any(n > depth for n in need):
                break
            p = 1.0
            for n in need:
                p *= best[n - 1]
            if p < 1e-6:
                break                 # as in `_class_plan`: deeper levels move the end no further
            progress += p
            if progress / max(cheapest + verify.explore(rows + sum(need)), 1e-9) > base:
                return True
        return False

    # --- after drafting ------------------------------------------------------------------------------
    def trim(self, prop, ctx: StepContext):
        """The drafts the verify pass takes: `prop` cut to this step's selection (unchanged, with no
        selection, where no row is under this budget). Returns (proposal, Selection | None)."""
        if not any(ctx.budgeted):
            return prop, None
        sel = self.select(prop, ctx.budgeted, ctx.sampled, prop.seconds, ctx.rows, ctx.room, ctx.waiting)
        return prop.cut(sel.lengths), sel

    def select(self, prop, chosen: list[bool], sampled: list[bool], fixed_s: float, rows: int,
               remaining: list[int] | None = None, waiting: bool = False) -> Selection:
        """Per row, how many of its drafts to verify. Rows not `chosen` (other policies) keep theirs.
        With requests waiting for room (or no `remaining`), B* is the argmax over every chosen row's slots
        (`_slot_plan`), and so below the knee; with nobody waiting past it, the plan that brings the batch's
        last row nearest per second (`_class_plan`). `sampled` rows with a model draft keep the slots above
        the previous step's cut-off (see Exactness). `fixed_s`: the draft seconds."""
        lengths = list(prop.length_list())
        plain = self.survival.of_step(prop, chosen)
        fixed_tokens = rows + sum(k for k, c in zip(lengths, chosen) if not c)
        for i in plain:
            lengths[i] = 0
        if prop.keys is None:      # the mean survival by position prices a model draft's depth only
            self.drafting.learn(plain)
        gaps = None if waiting or remaining is None else class_gaps(remaining, plain)
        if gaps is not None and self._below_knee(fixed_tokens, rows):
            gaps = None               # below the knee a row running ahead costs the class nothing
        # one row's slots at a time: where little was measured, lean towards verifying (a class plan
        # multiplies many rows' survivals, where optimism would compound, so it keeps the plain rates)
        survivals = self.survival.of_step(prop, chosen, optimistic=True) if gaps is None else plain
        plan, best = self._plan(prop, survivals, gaps, sampled, lengths, fixed_tokens, rows, fixed_s)
        cutoff = self.cutoff
        for i, n in plan.items():
            lengths[i] += n
        # sampled model rows: the plain survivals against the previous step's cut-off (one scale in both plans)
        for i, surv in plain.items():
            if sampled[i] and prop.keys is None:
                lengths[i] = sum(1 for s in surv if s >= cutoff)
        self._next_cutoff(plain, plan, best)
        self.survival.forget()
        return Selection(lengths, sum(prop.length_list()), sum(lengths), best)

    def _plan(self, prop, survivals, gaps, sampled, lengths, fixed_tokens: int, rows: int,
              fixed_s: float) -> tuple[dict[int, int], int]:
        """Drafts to verify per row, and B*, before the sampled rows' cut-off: the slot plan, or with
        `gaps` (nobody waiting, past the knee) the last row's."""
        # verifying nothing also skips the bookkeeping drafts bring (acceptance, holes, compaction): priced
        # apart, or a near-even choice tips towards verifying
        plain_s = fixed_s + self.overhead_plain.at(rows) if self.overhead_plain and fixed_tokens == rows else None
        costs = (fixed_s + self.overhead.at(rows), plain_s)
        if gaps is None:
            plan, margin = self._slot_plan(survivals, lengths, fixed_tokens, rows, costs)
        else:
            plan, margin = self._class_plan(survivals, gaps, lengths, fixed_tokens, rows, costs)
        best = sum(plan.values())
        cut_by_past = prop.keys is None and any(sampled[i] for i in survivals)
        if best and not cut_by_past and self._probe_base(rows, margin, fixed_tokens):
            plan = {}
        return plan, best

    def _next_cutoff(self, survivals, plan: dict[int, int], best: int) -> None:
        """The next step's cut-off: the least survival the plan took, a probe or not."""
        if not survivals:
            return
        taken = [survivals[i][n - 1] for i, n in plan.items() if n] if best else []
        top = max((s[0] for s in survivals.values() if s), default=None)
        if taken or top is not None:
            self.cutoff = min(taken) if taken else min(1.0, top + 1e-6)

    def _slot_plan(self, survivals, lengths, fixed_tokens: int, rows: int, costs) -> tuple[dict[int, int], float]:
        """Every chosen row's slots in one list, the top B* by survival (a prefix of each row)."""
        slots = sorted(((s, j, i) for i, surv in survivals.items() for j, s in enumerate(surv)),
                       key=lambda t: (-t[0], t[1]))
        best, margin = self._argmax(slots, lengths, fixed_tokens, float(rows), costs[0], rows, costs[1])
        plan: dict[int, int] = {}
        for _, _, i in slots[:best]:
            plan[i] = plan.get(i, 0) + 1
        return plan, margin

    def _class_plan(self, survivals, gaps: dict[int, int], lengths, fixed_tokens: int, rows: int,
                    costs) -> tuple[dict[int, int], float]:
        """The level L with the most expected progress of the batch's last row per second. The last row
        moves l places further than plain decoding iff every row i that is fewer than l places ahead of
        it (gap g_i) keeps its first l − g_i drafts: probability Π S(i, l − g_i). Level L verifies
        max(0, L − g_i) drafts of row i; a row that drafted fewer caps L. Returns (drafts per row, the
        best rate ÷ the rate of verifying nothing)."""
        verify = self.verify.table(rows)
        longest = max(lengths, default=0)

        def seconds(need: dict[int, int]) -> float:
            deepest = max([longest, *need.values()])
            tokens = rows * (deepest + 1) if self.padded else fixed_tokens + sum(need.values())
            return verify.explore(tokens)
        base_s = costs[0] if costs[1] is None else costs[1]
        base = 1.0 / max(base_s + seconds({}), 1e-9)
        best_level, best_rate, progress = 0, base, 1.0
        top = max((g + len(survivals[i]) for i, g in gaps.items()), default=0)
        for level in range(1, top + 1):
            need = {i: level - g for i, g in gaps.items() if g < level}
            if any(n > len(survivals[i]) for i, n in need.items()):
                break                   # a row that close drafted too few: the last row cannot move that far
            p = 1.0
            for i, n in need.items():
                p *= survivals[i][n - 1]
            if p < 1e-6:
                break                   # deeper levels need these rows and more: they move the end no more
            progress += p
            rate = progress / max(costs[0] + seconds(need), 1e-9)
            if rate > best_rate:
                best_level, best_rate = level, rate
        plan = {i: best_level - g for i, g in gaps.items() if g < best_level}
        return plan, best_rate / base if base > 0 else float("inf")

    def _below_knee(self, tokens: int, rows: int) -> bool:
        """One more token in every row costs at most FREE_SHARE more than this pass of `tokens`. (The test
        looks a whole row-width ahead: one token more in a 64-row pass also costs little, yet it is a
        64th of the work, not spare compute.)"""
        verify = self.verify.table(rows)
        return not self.padded and verify.at(tokens + rows) <= (1.0 + FREE_SHARE) * verify.at(tokens)

    def _probe_base(self, rows: int, margin: float, fixed_tokens: int) -> bool:
        """Verify nothing this step, to time the pass B* is weighed against (tokens = rows)? Only while
        that point is unmeasured or old and B* promised less than BASE_MARGIN × its rate. The choice
        depends only on the step count and the costs, never on this step's draft tokens (exactness)."""
        age = self._base_age.get(rows, BASE_EVERY)
        self._base_age[rows] = age + 1
        return fixed_tokens == rows and age >= BASE_EVERY and margin < BASE_MARGIN

    def _argmax(self, slots, lengths, fixed_tokens: int, gain: float, fixed_s: float,
                rows: int, plain_s: float | None = None) -> tuple[int, float]:
        """B* = argmax_B (gain + Σ_{top B} S) ÷ (fixed_s + verify_s(tokens of the pass with B slots)), and
        its expected rate ÷ the rate of verifying nothing (priced with `plain_s` where given)."""
        # padded passes cost by their longest row: start from the longest fixed row
        longest, taken = max(lengths, default=0), list(lengths)
        tokens = rows * (longest + 1) if self.padded else fixed_tokens
        verify = self.verify.table(rows)
        base_s = fixed_s if plain_s is None else plain_s
        best, best_rate, total = 0, gain / max(base_s + verify.explore(tokens), 1e-9), gain
        base_rate = best_rate
        for b, (s, _, i) in enumerate(slots, start=1):
            total += s
            taken[i] += 1
            longest = max(longest, taken[i])
            tokens = rows * (longest + 1) if self.padded else fixed_tokens + b
            rate = total / max(fixed_s + verify.explore(tokens), 1e-9)
            if rate > best_rate:
                best, best_rate = b, rate
        return best, best_rate / base_rate if base_rate > 0 else float("inf")

    # --- after verification ----------------------------------------------------------------------
    def learn(self, ctx: StepContext, full, prop, accepted: list[int], next_tokens: list[int],
              verify_s: float, overhead_s: float) -> None:
        """After the verify pass: `full` is what was drafted, `prop` what was verified. A step with rows under
        this budget teaches the costs and the acceptance; a step without, a keyed draft's acceptance only."""
        verified = prop.length_list()
        if not any(ctx.budgeted):
            # rows of other policies teach a keyed draft's acceptance too (its key is the proposal's)
            if prop.keys is not None and any(verified):
                self.survival.observe(prop, verified, accepted, [True] * ctx.rows, None)
            return
        tokens = ctx.rows * (prop.width + 1) if self.padded else ctx.rows + sum(verified)
        after = Hindsight(full.token_lists(), full.length_list(), next_tokens, [not s for s in ctx.sampled])
        # a keyed draft's rows of other policies teach too; a model draft's bins exist for budgeted rows only
        teach = [True] * ctx.rows if prop.keys is not None else ctx.budgeted
        self.observe(prop, verified, accepted, teach, ctx.rows, tokens, verify_s, overhead_s, after)

    def observe(self, prop, verified: list[int], accepted: list[int], chosen: list[bool], rows: int,
                tokens: int, verify_s: float, overhead_s: float, after: Hindsight | None = None) -> None:
        """Learn from the step: acceptance per position (`after` adds the first unverified slot of each row
        that kept everything it verified) and the costs."""
        self.survival.observe(prop, verified, accepted, chosen, after)
        if tokens:     # rows + verified drafts, or the padded shape (self.padded)
            self.verify.observe(rows, tokens, verify_s)
            if tokens == rows:
                self._base_age[rows] = 0
        (self.overhead_plain if tokens == rows else self.overhead).observe(rows, overhead_s)
        if tokens and self._retries.step(rows, tokens > rows):
            self.verify.forget_above(rows, rows)
        self.drafting.observe(prop, rows, prop.seconds + verify_s + overhead_s)


class Retries:
    """Per batch size: the steps in a row that verified nothing (or drafts), and the wait before a retry."""

    def __init__(self) -> None:
        self.idle: dict[int, int] = {}
        self.busy: dict[int, int] = {}
        self.wait: dict[int, int] = {}

    def step(self, rows: int, verified: bool) -> bool:
        """Count one step at `rows`; True when the costs above `rows` should be forgotten now."""
        wait = self.wait.get(rows, RETRY_FIRST)
        mine, other = (self.busy, self.idle) if verified else (self.idle, self.busy)
        other[rows] = 0
        mine[rows] = mine.get(rows, 0) + 1
        if mine[rows] < wait:
            return False
        mine[rows] = 0
        self.wait[rows] = RETRY_FIRST if verified else min(2 * wait, RETRY_MAX)
        return not verified


def _probe_one(depths: list[int], budgeted: list[bool], backlog: list[int]) -> list[int]:
    """A probe drafts in one budgeted row: the one with the fewest tokens to feed the draft model first."""
    rows = [i for i, b in enumerate(budgeted) if b and depths[i] > 0]
    if not rows:
        return depths
    keep = min(rows, key=lambda i: backlog[i])
    return [d if not budgeted[i] or i == keep else 0 for i, d in enumerate(depths)]
